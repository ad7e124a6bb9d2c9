//! # sqs-worker
//!
//! Correct SQS batch semantics for AWS Lambda queue workers that never lose a message:
//! classified retries, valid partial batch responses, FIFO ordering, deadline awareness,
//! and dead-lettering with a full failure history.
//!
//! ## Layout
//!
//! | module | what it holds | I/O |
//! | --- | --- | --- |
//! | [`error`] | [`ErrorClass`] and [`ProcessError`], the one error a processor returns | none |
//! | [`classify`] | AWS SDK / HTTP / io / timeout errors → [`ErrorClass`] | none |
//! | [`event`] | the invocation body → `SqsEvent`, with a SIMD JSON parser | none |
//! | [`item`] | [`WorkItem`]: one record, parsed per record | none |
//! | [`processor`] | the [`Processor`] trait and [`HttpDelivery`] | HTTP |
//! | [`retry`] | backoff with full jitter, bounded by the [`Deadline`] | timer |
//! | [`batch`] | [`BatchProcessor`]: event + deadline → batch response | via traits |
//! | [`dead_letter`] | [`DeadLetteredItem`] record and the [`DeadLetterSink`] trait | via trait |
//! | [`signature`] | normalised error signatures for grouping | none |
//! | [`store`] | the dead-letter store: DynamoDB records, S3 payloads, DLQ messages | AWS |
//! | [`aws`] | AWS clients built once from the standard configuration chain | AWS |
//! | [`secrets`] | the downstream credential, from Secrets Manager at start-up | AWS |
//! | [`metrics`] | CloudWatch Embedded Metric Format lines per invocation | stdout |
//! | [`config`] | validated configuration from the environment | env |
//! | [`runtime`] | plugs the worker into `lambda_runtime` ahead of its serde decode | via traits |
//! | [`worker`] | the Lambda handler the `worker` binary runs | via traits |
//! | [`telemetry`] | JSON logging set-up | stdout |
//! | [`testing`] | scripted processor and in-memory sink for tests | none |
//!
//! ## Guarantees
//!
//! Every record ends as exactly one of done, skipped, returned for retry (listed in
//! `batchItemFailures`), or dead-lettered, and a dead-lettered record is acknowledged only
//! after the sink has persisted it. Bodies are never logged.

pub mod adapters;
pub mod analysis;
pub mod batch;
pub mod classify;
pub mod config;
pub mod dead_letter;
pub mod duration;
pub mod error;
pub mod event;
pub mod hex;
pub mod item;
pub mod message;
pub mod metrics;
pub mod pointer;
pub mod ports;
pub mod processor;
pub mod redrive;
pub mod redrive_function;
pub mod retry;
pub mod runtime;
pub mod selection;
pub mod signature;
pub mod telemetry;
pub mod testing;
pub mod time_format;
pub mod worker;

pub use batch::{BatchConfig, BatchError, BatchProcessor, BatchReport, Disposition};
pub use dead_letter::{DeadLetterCandidate, DeadLetterSink, DeadLetteredItem, InvocationInfo};
pub use error::{ErrorClass, ProcessError};
pub use item::WorkItem;
pub use processor::{HttpDelivery, Outcome, Processor};
pub use retry::{Deadline, RetryPolicy};
pub use worker::Worker;
