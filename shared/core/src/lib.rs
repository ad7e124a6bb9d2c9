//! # sqs-keeper-core
//!
//! The pure core of `sqs-keeper`: what happens to each record of an SQS batch, decided
//! without I/O of its own. The batch engine, retries, error classes, the dead-letter record
//! and the DLQ message rule, the redrive plan and engine: all over small ports (the store's
//! four, one per AWS resource: [`RecordStore`], [`DeadLetterQueue`], [`PayloadStore`],
//! [`SourceQueue`]; the breaker's [`BreakerStore`], the idempotency table's
//! [`IdempotencyStore`](idempotency::IdempotencyStore) and the [`VisibilityPort`]) that the AWS
//! adapters (`sqs-keeper-aws`) implement for production and [`testing`] implements over one
//! in-memory world.
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
//! Its modules are private and everything it offers is re-exported at its root, but for four
//! namespaces a handler's code spells: [`context`], [`envelope`], [`idempotency`] and
//! [`testing`].
//!
//! | module | what it holds | I/O |
//! | --- | --- | --- |
//! | `error` | [`ErrorClass`] and [`ProcessError`], the one error a processor returns | none |
//! | `classify` | AWS SDK / HTTP / io / timeout errors → [`ErrorClass`] | none |
//! | `clock` | [`Clock`]: where wall time comes from (the system's, or tokio's from a start), held by what reads it | clock |
//! | `random` | [`Random`]: where random draws come from (the thread's generator, or a seeded one), held by what draws | none |
//! | `event` | the invocation body → `SqsEvent`, with a SIMD JSON parser | none |
//! | `item` | [`WorkItem`]: one record, parsed per record; typed bodies ([`WorkItem::json`]) | none |
//! | [`envelope`] | SNS, EventBridge and S3 envelopes around a body, unwrapped per record | none |
//! | [`context`] | the record being processed: its deadline, custom metrics and log fields | task-local |
//! | [`idempotency`] | once per item id: the claim rules over an [`idempotency::IdempotencyStore`] | via trait |
//! | `redelivery` | retries spaced across deliveries: the delay by receive count, the visibility port | via trait |
//! | `retry` | backoff with full jitter, bounded by the [`Deadline`] | timer |
//! | `breaker` | the circuit breaker every sandbox shares, around a processor; over a [`BreakerStore`] | via trait |
//! | `polling` | a long outage stops the worker's polling: pause, probe with a source message, restore; over three ports | via traits |
//! | `batch` | [`BatchProcessor`]: event + deadline → batch response | via traits |
//! | `dead_letter` | [`DeadLetteredItem`] record and the [`DeadLetterSink`] trait | via trait |
//! | `signature` | normalised error signatures for grouping | none |
//! | `analysis` | grouping, statistics and export of records for operators (`operator` feature) | none |
//! | `pointer` | SQS Extended Client pointers and the policy for following them | none |
//! | `message` | what our messages carry: attribute names, FIFO group, batching | none |
//! | `selection` | record filters, pages and continuation tokens | none |
//! | `condition` | each conditional write's condition, once: the DynamoDB expression and its meaning in memory | none |
//! | `ports` | the store's ports, one per AWS resource: [`RecordStore`] (the table), [`DeadLetterQueue`], [`PayloadStore`], [`SourceQueue`]; and what they pass | traits |
//! | `recording` | dead-lettering: payload, record (merge, claim, compaction), DLQ message; over the ports | via ports |
//! | `sweep` | the DLQ message rule ([`sweep::decide`]) and the sweep and settling of the DLQ; over the ports | via ports |
//! | `removal` | purge and clear: DLQ messages, then records, then payloads; over the ports | via ports |
//! | `redrive` | the redrive request, plan, engine (over the ports) and report | via ports |
//! | `processor` | the [`Processor`] trait, `handler_fn` | none |
//! | `mutants` | fixed defects the simulation switches back on (test-only `sim` feature) | none |
//! | `duration`, `time_format`, `hex` | durations and times as operators write them; record timestamps; sha256 in hex | none |
//! | [`testing`] | scripted processor, in-memory sink; one in-memory world of the store's AWS side ([`testing::World`]) and its ports ([`testing::MemoryStore`]), with fault and latency knobs and an observer: what the unit tests, the engine tests and the simulation run over | none |
//!
//! ## Guarantees
//!
//! Every record ends as exactly one of done, skipped, returned for retry (listed in
//! `batchItemFailures`), or dead-lettered, and a dead-lettered record is acknowledged only
//! after the sink has persisted it. Bodies are never logged. The whole list, with the
//! windows each leaves, is docs/ARCHITECTURE.md §1.

#![deny(missing_docs)]
// Every type a public signature mentions is re-exported below: a user can name what it holds.
#![deny(unnameable_types)]

#[cfg(feature = "operator")]
pub mod analysis;
mod batch;
pub mod breaker;
mod classify;
mod clock;
pub mod condition;
pub mod context;
mod dead_letter;
mod duration;
pub mod envelope;
mod error;
pub mod event;
mod hex;
#[cfg(feature = "reqwest")]
mod http_response;
pub mod idempotency;
mod item;
pub mod message;
mod mutants;
mod pointer;
mod polling;
mod ports;
mod processor;
mod random;
pub mod recording;
mod redelivery;
pub mod redrive;
mod removal;
mod retry;
mod selection;
mod signature;
pub mod sweep;
pub mod testing;
pub mod time_format;

// The crate's whole public API: every module is private but the four namespaces above
// (what a handler's code spells: `context::deadline()`, `envelope::Envelopes`,
// `idempotency::Idempotency`, `testing::ScriptedProcessor`).
#[cfg(feature = "operator")]
pub use analysis::{ellipsize, terminal_safe, ExportFormat, SignatureGroup, StatsCounter};
pub use batch::{
    panic_message, BatchConfig, BatchCounts, BatchError, BatchProcessor, BatchReport, BodyResolver,
    Disposition, NotStartedReason, RecordReport, NOT_STARTED,
};
pub use breaker::{
    group_key, open_period, Breaker, BreakerPolicy, BreakerState, BreakerStore, GroupBreakers,
    MAX_GROUP_BREAKERS, PROBE_SLACK,
};
pub use classify::{
    classify_aws_code, classify_error, classify_http_status, classify_message, classify_sdk_error,
};
pub use clock::Clock;
pub use condition::{attr, conditions, epoch_millis, names, Attr, Condition, Found, StoredRecord};
pub use dead_letter::{
    compact_history, is_dead_lettering_elsewhere, processed_after, processed_key_for_message,
    processed_key_for_payload, recorded_message_id, DeadLetterCandidate, DeadLetterReason,
    DeadLetterSink, DeadLetteredItem, DlqClaim, FailureDetail, InvocationInfo, ItemPayload,
    ItemStatus, MessageAttribute, NoDeadLetterStore, PayloadLocation, SourceContext, Triage,
    ATTRIBUTES_LIMIT, CAUSES_LIMIT, CAUSE_LIMIT, ERROR_MESSAGE_LIMIT, HISTORY_HEAD, HISTORY_LIMIT,
    LEASED_WITH_PAYLOAD, PROCESSED_LIMIT, REQUEUED_BY_ATTRIBUTE, RESPONSE_EXCERPT_LIMIT,
};
pub use duration::{parse_duration, parse_time};
pub use error::{ErrorClass, ProcessError, CIRCUIT_OPEN};
pub use event::{decode_event, decode_sqs_event, EventError, SqsBatch, SqsRecord, Text};
pub use hex::sha256_hex;
#[cfg(feature = "reqwest")]
pub use http_response::{error_for_status, retry_after, EXCERPT_CHARS};
pub use item::{
    bounded_item_id, kept_id, BodyFormat, InvalidRecord, ItemIdSource, ItemParser, WorkItem,
    MAX_ITEM_ID_BYTES,
};
pub use message::{
    attribute_size, batches_by_size, dlq_item_id, fifo_group_id, fitting_additions,
    is_valid_message_group_id, message_size, queue_of_arn, sqs_allows, sqs_safe,
    ERROR_CLASS_ATTRIBUTE, ERROR_SIGNATURE_ATTRIBUTE, ITEM_ID_ATTRIBUTE, MAX_BATCH_BYTES,
    MAX_ENTRIES, MAX_MESSAGE_BYTES, PAYLOAD_SHA256_ATTRIBUTE, RECORD_TABLE_ATTRIBUTE,
    RESERVED_ATTRIBUTES, SOURCE_MESSAGE_ID_ATTRIBUTE, SOURCE_QUEUE_ARN_ATTRIBUTE,
};
#[cfg(feature = "sim")]
pub use mutants::switch_on;
pub use mutants::{Mutant, SIMULATION_HOOKS};
pub use pointer::{
    payload_key, PayloadPolicy, S3Pointer, DEFAULT_PAYLOAD_MAX_BYTES,
    EXTENDED_PAYLOAD_SIZE_ATTRIBUTE, SHA256_METADATA,
};
pub use polling::{
    blind_restore_after, pausable, sweep_interval, sweep_reserve, ControlAction, MappingSwitch,
    PauseMarker, PauseState, PollingControl, ProbeOutcome, SourceProbe, SourceQueueState,
    MIN_SWEEP_INTERVAL, PAUSE_LEASE,
};
pub use ports::{
    Adoption, Compaction, DeadLetterQueue, Deliveries, Expect, MessageView, OutgoingMessage,
    PayloadStore, ReceivedMessage, RecordStore, RedrivePorts, Selected, SendResult, SourceQueue,
    Standing, Written, CLASSIC_MESSAGE_MAX, SQS_MAX_RETENTION,
};
pub use processor::{handler_fn, DeadLettered, HandlerFn, ItemFn, Outcome, Processor};
pub use random::Random;
pub use recording::{
    after_append, compaction_of, offload_payload, review_flag_change, stays_inline,
    RecordingSettings, HISTORY_ENTRIES_MAX, HISTORY_ENTRY_MAX, RECORD_BUDGET,
};
pub use redelivery::{Hide, QueueTiming, RedeliveryPolicy, VisibilityPort, MAX_VISIBILITY};
pub use redrive::run_gated;
pub use redrive::{
    expiry_when_reopened, expiry_when_requeued, ItemOutcome, ItemOutcomeKind, RedriveEngine,
    RedriveError, RedriveMode, RedriveReport, RedriveRequest, RedriveSettings, ITEM_GRACE,
    LEASE_MARGIN, OUTCOME_WRITE_SLICE, REQUEUED_RECORD_LIFE, REQUEUE_MARGIN, REQUEUE_OUTLIVED,
    SETTLE_RESERVE,
};
pub use removal::{clear_records, remove_records, remove_selected, Removable, RemovalReport};
/// The `reqwest` this crate classifies errors of (`reqwest` feature): a handler's own client
/// needs no dependency of its own, and its version always matches.
#[cfg(feature = "reqwest")]
pub use reqwest;
pub use retry::{
    worst_case_record_time, AttemptFailure, ClassAttempts, Deadline, InvocationBudget, Jitter,
    RetryPolicy, FALLBACK_INVOCATION_TIME, MAX_ATTEMPTS_PER_INVOCATION, MIN_RESPONSE_RESERVE,
};
pub use selection::{
    page_in_memory, sort_newest_first, token_after_record, Page, PageToken, RecordFilter,
    Unreadable,
};
pub use signature::{error_signature, loggable_message, normalize_message};
pub use sweep::{
    adopted_record, purge_takes, settle_held, sweep_dlq, tracked_as_its_payload_names, HeldMessage,
    MessageFate, Settled, Sweep, SweepOptions,
};

#[cfg(test)]
mod unreachable_store_tests;
