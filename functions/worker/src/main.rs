//! The worker Lambda function: processes SQS batches with partial batch responses.
//!
//! Configuration comes from `WORKER_*` environment variables (see `sqs_worker::config`).
//! Everything expensive (HTTP client, connection pool) is built once, before the first
//! invocation, and reused.

// The handler's future nests the SDK's deeply; the compiler's default depth is too low.
#![recursion_limit = "256"]

use lambda_runtime::{run, service_fn, Error, LambdaEvent};

// mimalloc: a batch allocates a few small strings per record and frees them together;
// glibc's allocator spends a third of the decode time on that (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    sqs_worker::telemetry::init();
    let worker = sqs_worker::worker::default_worker_from_env().await?;
    let worker = &worker;
    run(service_fn(move |event: LambdaEvent<_>| async move {
        worker.handle(event).await
    }))
    .await
}
