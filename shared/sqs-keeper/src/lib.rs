//! # sqs-keeper
//!
//! SQS-triggered AWS Lambda queue workers that never lose a message: classified retries,
//! valid partial batch responses, FIFO ordering, deadline awareness, and dead-lettering
//! with a full failure history (DynamoDB records, large payloads in S3, a DLQ).
//!
//! A handler author adds this crate, writes a [`Processor`] (or an `async fn` wrapped in
//! [`handler_fn`]) and serves it with [`run`]; everything else (the batch engine, the
//! dead-letter store, idempotency, the circuit breaker, spaced redelivery) is configured
//! from the environment (docs/HANDLERS.md, "Write your own handler"):
//!
//! ```no_run
//! use sqs_keeper::{handler_fn, Outcome, ProcessError, WorkItem};
//!
//! async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError> {
//!     let _payload = item.payload();
//!     Ok(Outcome::Done)
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), sqs_keeper::Error> {
//!     sqs_keeper::run(handler_fn(handle)).await
//! }
//! ```
//!
//! This crate is the handler author's few names, re-exported from the crates that hold
//! them: `sqs-keeper-core` (the batch engine and its rules, no I/O), `sqs-keeper-aws` (every
//! AWS call), `sqs-keeper-http` (the HTTP delivery) and `sqs-keeper-lambda` (the Lambda
//! glue). Depend on those for more than a handler needs.
//!
//! ## Guarantees
//!
//! Every record ends as exactly one of done, skipped, returned for retry (listed in
//! `batchItemFailures`), or dead-lettered, and a dead-lettered record is acknowledged only
//! after it is persisted. Bodies are never logged. The whole list, with the limits of
//! each, is docs/GUARANTEES.md; how each is kept, docs/ARCHITECTURE.md §1.

// Every type a public signature mentions can be named from the root (re-exported there,
// or from the crate that defines it).
#![deny(unnameable_types)]

pub use sqs_keeper_core::idempotency::Idempotency;
pub use sqs_keeper_core::DeadLetterReason;
pub use sqs_keeper_core::{context, envelope, idempotency, testing, trace};
/// A handler's own HTTP calls (`reqwest` feature): the client, and its non-success answers
/// as classified failures with their `Retry-After`.
#[cfg(feature = "reqwest")]
pub use sqs_keeper_core::{error_for_status, reqwest};
pub use sqs_keeper_core::{
    handler_fn, DeadLettered, ErrorClass, Outcome, ProcessError, Processor, WorkItem,
};
#[cfg(feature = "http")]
pub use sqs_keeper_http::{HttpDelivery, HttpDeliveryConfig};

/// What a team plugs its own telemetry in with: the library's log layer, for a tracing
/// subscriber of its own, and what a tower layer of its own wraps
/// ([`Setup::run_with_layer`]). `examples/telemetry` shows both.
pub mod telemetry {
    pub use sqs_keeper_core::batch::RECORD_LINES_TARGET;
    /// Traced records' spans as children of their producers' spans, for the team's
    /// OpenTelemetry tracer (`opentelemetry` feature).
    #[cfg(feature = "opentelemetry")]
    pub use sqs_keeper_lambda::otel;
    pub use sqs_keeper_lambda::runner::{tower, InvocationBox, LambdaInvocation};
    pub use sqs_keeper_lambda::telemetry::log_layer;
}
pub use sqs_keeper_lambda::{init_failed, run, Error, Setup, StartupError};

/// The README's Rust blocks, compiled as doctests by `cargo test` (`make test`), so that
/// what a new user copies from it builds.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// The Rust blocks of docs/HANDLERS.md (the handler in full), compiled as the README's are.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/HANDLERS.md")]
pub struct HandlerDocDoctests;
