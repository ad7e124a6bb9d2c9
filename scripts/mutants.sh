#!/usr/bin/env bash
# `make mutants`: cargo-mutants over the modules that carry the guarantees
# (.cargo/mutants.toml lists them and the test command), in shards that survive an
# interruption: a finished shard is not run again, so the command resumes where it stopped.
# Shards are dealt round-robin (mutant i on shard i % SHARDS), so each is a sample of every
# module and the finished shards' score is that of a sample no one chose.
# Prints the score per module at the end (scripts/mutants_report.py), as committed in
# docs/SIMULATION.md. Hours on two cores; not part of `make test`.
#
#   SHARDS=16            how many shards the mutants are split into
#   ONLY="0 1"           run only these shards (default: every unfinished one)
#   MUTANTS_OUT=dir      where shards write (default target/mutants)
#   SIM_SEEDS=300        seeded worlds per mutant (the simulation's test)
#   SIM_FAMILY_SEEDS=100 and of each focused family
set -euo pipefail
cd "$(dirname "$0")/.."
shards=${SHARDS:-16}
out=${MUTANTS_OUT:-target/mutants}
export SIM_SEEDS=${SIM_SEEDS:-300}
export SIM_FAMILY_SEEDS=${SIM_FAMILY_SEEDS:-100}
if ! command -v cargo-mutants >/dev/null 2>&1; then
    cargo install --locked cargo-mutants
fi
command -v cargo-nextest >/dev/null 2>&1 || cargo install --locked cargo-nextest
mkdir -p "$out"
# Builds go to a target directory of their own (the `sim` feature would otherwise
# invalidate the workspace's), shared by every mutant so that each rebuilds incrementally.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/mutants-build}
# Most of a mutant's time is linking the test binaries (each links the AWS SDK): mold,
# where installed, links them several times faster. Not required.
if command -v mold >/dev/null 2>&1; then
    export RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=-fuse-ld=mold"
fi
# The test command (.cargo/mutants.toml) spans three packages, which cargo-mutants' own
# baseline (the mutated package alone) cannot run: the unmutated tree is checked here.
# The library's integration tests but those that need the emulator or take long (bad input
# on the store, polling, properties): the logic-only modules (.cargo/mutants.toml).
LOGIC_ONLY='not (package(sqs-keeper-lambda) & test(/^(bad_input|bad_input_store|polling|properties)::/))'
if [ ! -f "$out/baseline-ok" ]; then
    cargo nextest run -p sqs-keeper-core -p sqs-keeper-lambda -p sqs-keeper-sim \
        --features sqs-keeper-lambda/sim,sqs-keeper-lambda/http,sqs-keeper-lambda/operator,sqs-keeper-lambda/clap \
        --lib --test seeds --test integration -E "$LOGIC_ONLY"
    touch "$out/baseline-ok"
fi
for k in ${ONLY:-$(seq 0 $((shards - 1)))}; do
    dir="$out/shard-$k-of-$shards"
    if [ -f "$dir/seconds" ]; then
        echo "shard $k/$shards: done before ($(cat "$dir/seconds") s)"
        continue
    fi
    started=$(date +%s)
    status=0
    cargo mutants --package sqs-keeper-core --shard "$k/$shards" --sharding round-robin --output "$dir" --no-shuffle \
        --baseline skip --timeout 300 --build-timeout 900 || status=$?
    # 0: every mutant caught; 2: some missed; 3: some timed out. Anything else (a usage
    # error, an interruption) leaves the shard unfinished.
    case $status in
        0 | 2 | 3) echo $(($(date +%s) - started)) >"$dir/seconds" ;;
        *) echo "shard $k/$shards failed (cargo-mutants exit $status)" >&2; exit "$status" ;;
    esac
done
python3 scripts/mutants_report.py "$out" "$shards"
