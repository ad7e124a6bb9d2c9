//! # sqs-keeper-lambda
//!
//! The Lambda glue of `sqs-keeper`: [`run`] and [`Setup`] serve any [`Processor`] as a
//! Lambda function, [`worker`] and [`runtime`] answer its invocations, `redrive_function`
//! runs the scheduled and operator redrive, [`config`] reads every variable once, and
//! [`telemetry`] and [`metrics`] write logs and EMF lines as Lambda expects. The shipped
//! functions, the `dlq` CLI and the tests build on it; a handler author depends on
//! `sqs-keeper`, which re-exports the few names a handler needs.
//!
//! ```no_run
//! use sqs_keeper_lambda::{handler_fn, Outcome, ProcessError, Setup, WorkItem};
//!
//! async fn handle(_item: &WorkItem) -> Result<Outcome, ProcessError> {
//!     Ok(Outcome::Done)
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), sqs_keeper_lambda::Error> {
//!     // The configuration every variable names, read once; clients built once.
//!     let setup = Setup::from_env().await?;
//!     setup.run(handler_fn(handle)).await
//! }
//! ```
//!
//! ## Layout
//!
//! The core (`sqs-keeper-core`, re-exported here module by module) decides and does no I/O
//! of its own; [`adapters`] holds every AWS SDK call, behind the core's ports; the Lambda
//! glue and [`config`] wire them together. The whole map, with the data's path, is in
//! `docs/ARCHITECTURE.md` §5.
//!
//! | module | what it holds | I/O |
//! | --- | --- | --- |
//! | core modules ([`batch`], [`retry`], [`error`], [`item`], [`sweep`], [`redrive`], …) | the batch engine, retries, classification, records, the DLQ message rule, the redrive engine (`sqs-keeper-core`) | via ports |
//! | [`adapters`] | AWS clients, Secrets Manager, the dead-letter store (DynamoDB, S3, SQS; implements the core's ports; `sqs-keeper-aws`) | AWS |
//! | `http_delivery` | `HttpDelivery`, the processor the worker binary ships (`sqs-keeper-http`, `http` feature) | HTTP |
//! | `http_worker` | the shipped worker's start-up: `HttpDelivery` into the configured store (`http` feature) | env, AWS |
//! | [`config`] | every environment variable once ([`config::vars`]) and the configurations read from them | env |
//! | [`runner`] | one call that runs any [`Processor`] as a Lambda function ([`run`], [`Setup`]) | env, AWS |
//! | [`worker`] | the Lambda handler a runner serves | via traits |
//! | [`runtime`] | plugs the worker into `lambda_runtime` ahead of its serde decode | via traits |
//! | `redrive_function` | the Lambda handler the `redrive` binary runs (`http` feature) | via ports |
//! | [`metrics`] | CloudWatch Embedded Metric Format lines per invocation (worker and redrive) | stdout |
//! | [`telemetry`] | logs as Lambda's advanced logging controls set them (level, JSON or text), the invocation span | stdout |
//!
//! ## Guarantees
//!
//! Every record ends as exactly one of done, skipped, returned for retry (listed in
//! `batchItemFailures`), or dead-lettered, and a dead-lettered record is acknowledged only
//! after the sink has persisted it. Bodies are never logged.

pub mod config;
#[cfg(feature = "http")]
pub mod http_worker;
pub mod metrics;
#[cfg(feature = "http")]
pub mod redrive_function;
pub mod runner;
pub mod runtime;
pub mod telemetry;
pub mod worker;

pub use sqs_keeper_aws as adapters;
#[cfg(feature = "operator")]
pub use sqs_keeper_core::analysis;
pub use sqs_keeper_core::{
    batch, breaker, classify, clock, condition, context, dead_letter, duration, envelope, error,
    event, hex, idempotency, item, message, mutants, pointer, polling, ports, processor, random,
    recording, redelivery, redrive, removal, retry, selection, signature, sweep, testing,
    time_format,
};
#[cfg(feature = "http")]
pub use sqs_keeper_http as http_delivery;

pub use batch::{BatchConfig, BatchError, BatchProcessor, BatchReport, Disposition};
pub use dead_letter::{DeadLetterCandidate, DeadLetterSink, DeadLetteredItem, InvocationInfo};
pub use error::{ErrorClass, ProcessError};
#[cfg(feature = "http")]
pub use http_delivery::HttpDelivery;
pub use item::WorkItem;
pub use processor::{handler_fn, DeadLettered, Outcome, Processor};
pub use retry::{Deadline, RetryPolicy};
pub use runner::{run, Error, Setup};
pub use worker::Worker;
