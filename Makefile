# The two commands that matter: `make demo` runs the pipeline locally, `make test` runs
# every check. Everything else is a building block of those.

CARGO ?= cargo

.PHONY: build demo test fmt-check clippy unit help

help:
	@echo "make demo   - run the worker pipeline locally and print what happened"
	@echo "make test   - formatting, clippy (-D warnings) and every test"

build:
	$(CARGO) build --workspace --bins

demo: build
	./target/debug/local invoke --event samples/demo-event.json

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit: build
	$(CARGO) test --workspace

test: fmt-check clippy unit
