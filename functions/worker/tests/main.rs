//! Tests of the shipped worker binary: as it ships, and with bad input.
//!
//! One test binary for the package (`autotests = false`): every module links the
//! dependencies once. Run one module with `cargo test -p worker --test integration -- <module>::`.

mod bad_input;
mod binary;
