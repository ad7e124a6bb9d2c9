//! The worker Lambda function: processes SQS batches with partial batch responses.
//!
//! Configuration comes from `WORKER_*` environment variables (see `sqs_worker::config`).
//! Everything expensive (HTTP client, connection pool) is built once, before the first
//! invocation, and reused.

// The handler's future nests the SDK's deeply; the compiler's default depth is too low.
#![recursion_limit = "256"]

use lambda_runtime::{service_fn, Error, Runtime};
use sqs_worker::runtime::{respond, WorkerLayer};
use sqs_worker::telemetry::InvocationLayer;

// mimalloc: a batch allocates a few small strings per record and frees them together;
// glibc's allocator spends a third of the decode time on that (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: the work is I/O-bound (records overlap on the downstream and AWS calls), the
// CPU-bound decode is one pass, and fewer threads mean a faster start and less memory.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    sqs_worker::telemetry::init();
    let worker = sqs_worker::worker::default_worker_from_env().await?;
    // The worker serves every invocation until the process ends.
    let worker = Box::leak(Box::new(worker));
    // Added last, so it runs first: the batch runs inside each invocation's span.
    Runtime::new(service_fn(respond))
        .layer(WorkerLayer::new(worker))
        .layer(InvocationLayer)
        .run()
        .await
}
