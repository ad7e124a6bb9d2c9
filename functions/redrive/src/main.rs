//! The redrive Lambda function: takes a redrive request (JSON), returns a redrive report.
//!
//! Configuration: the store's `DLQ_*` variables (required), `REDRIVE_*` variables, and the
//! worker's `WORKER_*` processor variables for `reprocess` mode.

// The handler's future nests the SDK's deeply; the compiler's default depth is too low.
#![recursion_limit = "256"]

use lambda_runtime::{service_fn, Error, LambdaEvent, Runtime};
use sqs_keeper_lambda::redrive_function::RedriveFunction;
use sqs_keeper_lambda::telemetry::InvocationLayer;

// The simulation's test hooks (its mutants) must never be in a function
// binary: Cargo unifies features across one build, so a build with the simulation in it
// fails here instead (docs/SIMULATION.md).
const _: () = assert!(
    !sqs_keeper_lambda::SIMULATION_HOOKS,
    "built with the simulation's test hooks: build the simulation apart (make sim)"
);

#[tokio::main]
async fn main() -> Result<(), Error> {
    sqs_keeper_lambda::telemetry::init();
    let function = RedriveFunction::from_env()
        .await
        .inspect_err(|e| tracing::error!(error = %e, "redrive function cannot start"))?;
    // The function serves every invocation until the process ends; on Lambda Managed
    // Instances several at once (`run_concurrent`), each a run of its own (runs are
    // serialised per item by their leases, and the polling control by its marker's).
    let function: &'static RedriveFunction = Box::leak(Box::new(function));
    Runtime::new(service_fn(move |event: LambdaEvent<_>| async move {
        function.handle_event(event).await
    }))
    .layer(InvocationLayer)
    .run_concurrent()
    .await
}
