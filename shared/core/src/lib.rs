//! # sqs-keeper-core
//!
//! The pure core of `sqs-keeper`: what happens to each record of an SQS batch, decided
//! without I/O of its own. It holds the batch engine, retries, error classes, the
//! dead-letter record and the DLQ message rule, and the redrive plan and engine. They run
//! over small ports: the store's four, one per AWS resource
//! ([`ports::RecordStore`], [`ports::DeadLetterQueue`], [`ports::PayloadStore`],
//! [`ports::SourceQueue`]), the breaker's [`breaker::BreakerStore`], the idempotency
//! table's [`idempotency::IdempotencyStore`] and [`redelivery::VisibilityPort`]. The AWS
//! adapters (`sqs-keeper-aws`) implement them for production, and [`testing`] implements
//! them over one in-memory world.
//! No AWS SDK client, no environment variable and no `lambda_runtime` here: a handler
//! author uses this crate through `sqs-keeper`, which re-exports it.
//!
//! Every failure is classified, and the class decides what happens to the record:
//!
//! ```
//! use sqs_keeper_core::{ErrorClass, ProcessError};
//!
//! let unavailable = ProcessError::from_http_status(503, "the downstream is unavailable");
//! assert_eq!(unavailable.class, ErrorClass::ServerError);
//! assert!(unavailable.class.is_retryable(false)); // retried, then returned to the queue
//!
//! let rejected = ProcessError::from_http_status(422, "the order has no lines");
//! assert_eq!(rejected.class, ErrorClass::Validation);
//! assert!(!rejected.class.is_retryable(false)); // dead-lettered on first sight
//! ```
//!
//! The root holds what a processor's code spells: [`Processor`], [`handler_fn`],
//! [`Outcome`], [`ProcessError`], [`ErrorClass`], [`WorkItem`], [`DeadLettered`], and the
//! [`BatchProcessor`] that runs them. Everything else lives in the module of its concept:
//!
//! | module | what it holds | I/O |
//! | --- | --- | --- |
//! | [`error`] | [`ErrorClass`] and [`ProcessError`], the one error a processor returns | none |
//! | [`classify`] | AWS SDK / HTTP / io / timeout errors → [`ErrorClass`] | none |
//! | [`clock`] | [`clock::Clock`]: where wall time comes from (the system's, or tokio's from a start), held by what reads it | clock |
//! | [`random`] | [`random::Random`]: where random draws come from (the thread's generator, or a seeded one), held by what draws | none |
//! | [`event`] | the invocation body → [`event::SqsBatch`], with a SIMD JSON parser | none |
//! | [`item`] | [`WorkItem`]: one record, parsed per record; typed bodies ([`WorkItem::json`]) | none |
//! | [`envelope`] | SNS, EventBridge and S3 envelopes around a body, unwrapped per record | none |
//! | [`context`] | the record being processed: its deadline, custom metrics and log fields | task-local |
//! | [`idempotency`] | once per item id: the claim rules over an [`idempotency::IdempotencyStore`] | via trait |
//! | [`redelivery`] | retries spaced across deliveries: the delay by receive count, the visibility port | via trait |
//! | [`retry`] | backoff with full jitter, bounded by the [`retry::Deadline`] | timer |
//! | [`breaker`] | the circuit breaker every sandbox shares, around a processor; over a [`breaker::BreakerStore`] | via trait |
//! | [`polling`] | a long outage stops the worker's polling: pause, probe with a source message, restore; over three ports | via traits |
//! | [`batch`] | [`BatchProcessor`]: event + deadline → batch response | via traits |
//! | [`dead_letter`] | the [`dead_letter::DeadLetteredItem`] record, its claim, and the [`dead_letter::DeadLetterSink`] trait | via trait |
//! | [`signature`] | normalised error signatures for grouping | none |
//! | `analysis` | grouping, statistics and export of records for operators (`operator` feature) | none |
//! | [`pointer`](mod@pointer) | SQS Extended Client pointers and the policy for following them | none |
//! | [`message`] | what our messages carry: attribute names, FIFO group, batching | none |
//! | [`selection`] | record filters, pages and continuation tokens | none |
//! | [`condition`] | each conditional write's condition, once: the DynamoDB expression and its meaning in memory | none |
//! | [`ports`] | the store's ports, one per AWS resource: [`ports::RecordStore`] (the table), [`ports::DeadLetterQueue`], [`ports::PayloadStore`], [`ports::SourceQueue`]; and what they pass | traits |
//! | [`recording`] | dead-lettering: payload, record (merge, claim, compaction), DLQ message; over the ports | via ports |
//! | [`sweep`] | the DLQ message rule ([`sweep::decide`]) and the sweep and settling of the DLQ; over the ports | via ports |
//! | [`removal`] | purge and clear: each record, then its DLQ messages, then the payloads; over the ports | via ports |
//! | [`redrive`] | the redrive request, plan, engine (over the ports) and report | via ports |
//! | [`processor`] | the [`Processor`] trait, [`handler_fn`] | none |
//! | [`mutants`] | fixed defects the simulation switches back on (test-only `sim` feature) | none |
//! | [`trace`] | a record's trace context (`AWSTraceHeader`, a W3C `traceparent`), in both forms | none |
//! | [`duration`], [`time_format`], [`hex`] | durations and times as operators write them; record timestamps; sha256 in hex | none |
//! | [`testing`] | scripted processor, in-memory sink; one in-memory world of the store's AWS side ([`testing::World`]) and its ports ([`testing::MemoryStore`]), with fault and latency knobs and an observer: what the unit tests, the engine tests and the simulation run over | none |
//!
//! ## Guarantees
//!
//! Every record ends as exactly one of done, skipped, returned for retry (listed in
//! `batchItemFailures`), or dead-lettered, and a dead-lettered record is acknowledged only
//! after the sink has persisted it. Bodies are never logged. The whole list, with the
//! limits of each, is docs/GUARANTEES.md; how each is kept is docs/ARCHITECTURE.md §1.

#![deny(missing_docs)]
// Every type a public signature mentions is public in its module: a user can name what it holds.
#![deny(unnameable_types)]

#[cfg(feature = "operator")]
pub mod analysis;
pub mod batch;
pub mod breaker;
pub mod classify;
pub mod clock;
pub mod condition;
pub mod context;
pub mod dead_letter;
pub mod duration;
pub mod envelope;
pub mod error;
pub mod event;
pub mod hex;
#[cfg(feature = "reqwest")]
pub mod http_response;
pub mod idempotency;
pub mod item;
pub mod message;
pub mod mutants;
pub mod pointer;
pub mod polling;
pub mod ports;
pub mod processor;
pub mod random;
pub mod recording;
pub mod redelivery;
pub mod redrive;
pub mod removal;
pub mod retry;
pub mod selection;
pub mod signature;
pub mod sweep;
pub mod testing;
pub mod time_format;
pub mod trace;

// The short root: what a processor's code spells. Everything else is reached through the
// module of its concept (`dead_letter::DlqClaim`, `redrive::RedriveEngine`).
pub use batch::{BatchConfig, BatchProcessor, BatchReport};
pub use dead_letter::DeadLetterReason;
pub use error::{ErrorClass, ProcessError};
#[cfg(feature = "reqwest")]
pub use http_response::error_for_status;
pub use item::WorkItem;
pub use processor::{handler_fn, DeadLettered, HandlerFn, ItemFn, Outcome, Processor};
#[cfg(feature = "reqwest")]
pub use reqwest;

#[cfg(test)]
mod test_log;
#[cfg(test)]
mod unreachable_store_tests;
