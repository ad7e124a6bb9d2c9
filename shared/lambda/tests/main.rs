//! Integration tests of the library: the batch engine, redelivery, retention, the cut-off, the death hooks, the breaker, the redrive's probe, the redrive races, bad input (in memory and on the emulator) and properties.
//!
//! One test binary for the package (`autotests = false`): every module links the
//! dependencies once. Run one module with `cargo test -p sqs-keeper-lambda --features http --test integration -- <module>::`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod bad_input;
mod bad_input_store;
mod batch;
mod breaker_open_retry;
mod common;
mod cutoff;
mod death_hooks;
mod polling;
mod properties;
mod redelivery;
mod redrive_probe;
mod redrive_races;
mod retention;
