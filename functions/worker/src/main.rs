//! The worker Lambda function: processes SQS batches with partial batch responses,
//! delivering each item to `WORKER_DOWNSTREAM_URL`.
//!
//! Configuration comes from `WORKER_*` environment variables (see `sqs_keeper_lambda::config`).
//! Everything expensive (HTTP client, connection pool) is built once, before the first
//! invocation, and reused. The same call runs any other handler
//! (`sqs_keeper_lambda::runner`; docs/HANDLERS.md, "Write your own handler").

// The simulation's test hooks (its mutants) must never be in a function
// binary: Cargo unifies features across one build, so a build with the simulation in it
// fails here instead (docs/SIMULATION.md).
const _: () = assert!(
    !sqs_keeper_lambda::SIMULATION_HOOKS,
    "built with the simulation's test hooks: build the simulation apart (make sim)"
);

// mimalloc: a batch allocates a few small strings per record and frees them together;
// glibc's allocator spends a third of the decode time on that (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: the work is I/O-bound (records overlap on the downstream and AWS calls), the
// CPU-bound decode is one pass, and fewer threads mean a faster start and less memory.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sqs_keeper_lambda::Error> {
    let (setup, delivery) = sqs_keeper_lambda::http_worker::http_delivery_from_env().await?;
    setup.run(delivery).await
}
