//! End-to-end tests of the pipeline against the local AWS emulator.
//!
//! One test binary for the package (`autotests = false`): every module links the
//! dependencies once. Run one module with `cargo test -p e2e --test integration -- <module>::`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod emulator_script;
mod esm;
mod examples;
mod faults;
mod handler_loop;
mod handler_outside;
mod iam;
mod idempotency;
mod infra;
mod load;
mod pipeline;
mod redrive;
mod redrive_races;
mod toolchain;
