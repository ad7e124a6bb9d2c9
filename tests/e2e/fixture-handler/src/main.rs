//! A handler of one's own, as small as the README's, for the compiled-binary tests: it is
//! packaged by `scripts/lambda.sh` with cargo-lambda and the release profile, exactly as
//! the functions ship, so that what those tests see of a panic is what a deployed handler
//! does. A record whose body is `panic` panics in the handler, `panic:<value>` panics
//! quoting the value; `fail` is a validation failure; anything else is done.

#![allow(clippy::panic)] // panicking on request is this binary's purpose

use sqs_keeper::{handler_fn, Outcome, ProcessError, WorkItem};

// The simulation's test hooks (its mutants) must never be in a function
// binary: Cargo unifies features across one build, so a build with the simulation in it
// fails here instead (docs/SIMULATION.md).
const _: () = assert!(
    !sqs_keeper_core::mutants::SIMULATION_HOOKS,
    "built with the simulation's test hooks: build the simulation apart (make sim)"
);

async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError> {
    if let Some(value) = item.body.strip_prefix("panic:") {
        // As a handler's own `panic!` may name the payload's values, quoted or not.
        panic!("the fixture handler cannot take {value}");
    }
    match item.body.as_str() {
        "panic" => panic!("the fixture handler panics on request"),
        "fail" => Err(ProcessError::validation(
            "the fixture handler refuses this record",
        )),
        _ => Ok(Outcome::Done),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sqs_keeper::Error> {
    sqs_keeper::run(handler_fn(handle)).await
}
