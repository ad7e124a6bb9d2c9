//! # sqs-keeper
//!
//! Correct SQS batch semantics for AWS Lambda queue workers that never lose a message:
//! classified retries, valid partial batch responses, FIFO ordering, deadline awareness,
//! and dead-lettering with a full failure history.
//!
//! ## Layout
//!
//! The core decides and does no I/O of its own; [`adapters`] holds every AWS SDK call,
//! behind the core's ports; the Lambda glue and [`config`] wire them together. The whole
//! map, with the data's path, is in `docs/ARCHITECTURE.md` §5.
//!
//! | module | what it holds | I/O |
//! | --- | --- | --- |
//! | [`error`] | [`ErrorClass`] and [`ProcessError`], the one error a processor returns | none |
//! | [`classify`] | AWS SDK / HTTP / io / timeout errors → [`ErrorClass`] | none |
//! | [`clock`] | the wall clock (virtual in the simulation) | clock |
//! | [`event`] | the invocation body → `SqsEvent`, with a SIMD JSON parser | none |
//! | [`item`] | [`WorkItem`]: one record, parsed per record; typed bodies ([`WorkItem::json`]) | none |
//! | [`envelope`] | SNS, EventBridge and S3 envelopes around a body, unwrapped per record | none |
//! | [`context`] | the record being processed: its deadline, custom metrics and log fields | task-local |
//! | [`idempotency`] | once per item id: the claim rules over an [`idempotency::IdempotencyStore`] | via trait |
//! | [`redelivery`] | retries spaced across deliveries: the delay by receive count, the visibility port | via trait |
//! | [`retry`] | backoff with full jitter, bounded by the [`Deadline`] | timer |
//! | [`breaker`] | the circuit breaker every sandbox shares, around a processor; over a [`breaker::BreakerStore`] | via trait |
//! | [`polling`] | a long outage stops the worker's polling: pause, probe with a source message, restore; over three ports | via traits |
//! | [`batch`] | [`BatchProcessor`]: event + deadline → batch response | via traits |
//! | [`dead_letter`] | [`DeadLetteredItem`] record and the [`DeadLetterSink`] trait | via trait |
//! | [`signature`] | normalised error signatures for grouping | none |
//! | `analysis` | grouping, statistics and export of records for operators (`operator` feature) | none |
//! | [`pointer`](mod@pointer) | SQS Extended Client pointers and the policy for following them | none |
//! | [`message`] | what our messages carry: attribute names, FIFO group, batching | none |
//! | [`selection`] | record filters, pages and continuation tokens | none |
//! | [`ports`] | the redrive wing's ports: record store, DLQ, payload store, source queue | traits |
//! | [`recording`] | dead-lettering: payload, record (merge, claim, compaction), DLQ message; over [`recording::RecordTable`] | via trait |
//! | [`sweep`] | the DLQ message rule ([`sweep::decide`]) and the sweep and settling of the DLQ; over [`sweep::DlqMessages`] | via trait |
//! | [`removal`] | purge and clear: DLQ messages, then payloads, then records; over ports | via ports |
//! | [`redrive`] | the redrive request, plan, engine (over the ports) and report | via ports |
//! | [`processor`] | the [`Processor`] trait, [`handler_fn`] | none |
//! | `http_delivery` | `HttpDelivery`, the processor the worker binary ships (`http` feature) | HTTP |
//! | `http_worker` | the shipped worker's start-up: `HttpDelivery` into the configured store (`http` feature) | env, AWS |
//! | [`adapters`] | AWS clients, Secrets Manager, the dead-letter store (DynamoDB, S3, SQS; implements the ports and the two traits above) | AWS |
//! | [`config`] | every environment variable once ([`config::vars`]) and the configurations read from them | env |
//! | [`runner`] | one call that runs any [`Processor`] as a Lambda function ([`run`], [`Setup`]) | env, AWS |
//! | [`worker`] | the Lambda handler a runner serves | via traits |
//! | [`runtime`] | plugs the worker into `lambda_runtime` ahead of its serde decode | via traits |
//! | `redrive_function` | the Lambda handler the `redrive` binary runs (`http` feature) | via ports |
//! | [`mutants`] | fixed defects the simulation switches back on (test-only `sim` feature) | none |
//! | [`metrics`] | CloudWatch Embedded Metric Format lines per invocation (worker and redrive) | stdout |
//! | [`telemetry`] | logs as Lambda's advanced logging controls set them (level, JSON or text), the invocation span | stdout |
//! | [`duration`], [`time_format`], [`hex`] | durations and times as operators write them; record timestamps; sha256 in hex | none |
//! | [`testing`] | scripted processor, in-memory sink, [`testing::MemoryStore`] | none |
//!
//! ## Guarantees
//!
//! Every record ends as exactly one of done, skipped, returned for retry (listed in
//! `batchItemFailures`), or dead-lettered, and a dead-lettered record is acknowledged only
//! after the sink has persisted it. Bodies are never logged.

pub mod adapters;
#[cfg(feature = "operator")]
pub mod analysis;
pub mod batch;
pub mod breaker;
pub mod classify;
pub mod clock;
pub mod condition;
pub mod config;
pub mod context;
pub mod dead_letter;
pub mod duration;
pub mod envelope;
pub mod error;
pub mod event;
pub mod hex;
#[cfg(feature = "http")]
pub mod http_delivery;
#[cfg(feature = "http")]
pub mod http_worker;
pub mod idempotency;
pub mod item;
pub mod message;
pub mod metrics;
pub mod mutants;
pub mod pointer;
pub mod polling;
pub mod ports;
pub mod processor;
pub mod recording;
pub mod redelivery;
pub mod redrive;
#[cfg(feature = "http")]
pub mod redrive_function;
pub mod removal;
pub mod retry;
pub mod runner;
pub mod runtime;
pub mod selection;
pub mod signature;
pub mod sweep;
pub mod telemetry;
pub mod testing;
pub mod time_format;
pub mod worker;

pub use batch::{BatchConfig, BatchError, BatchProcessor, BatchReport, Disposition};
pub use dead_letter::{DeadLetterCandidate, DeadLetterSink, DeadLetteredItem, InvocationInfo};
pub use error::{ErrorClass, ProcessError};
#[cfg(feature = "http")]
pub use http_delivery::HttpDelivery;
pub use item::WorkItem;
pub use processor::{handler_fn, Outcome, Processor};
pub use retry::{Deadline, RetryPolicy};
pub use runner::{run, Setup};
pub use worker::Worker;
