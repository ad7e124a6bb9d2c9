//! The batch engine: turns an `SqsEvent` and a deadline into a valid `SqsBatchResponse`.
//!
//! Every record ends as exactly one [`Disposition`] (docs/ARCHITECTURE.md §1.1): done, skipped, returned
//! for retry, dead-lettered, or not started. Only done, skipped and *successfully*
//! dead-lettered records are acknowledged; everything else is listed in
//! `batchItemFailures` by its message id.
//!
//! Standard queues run records concurrently up to a limit. FIFO queues run them in order
//! and, after a failure, report the later records unprocessed, either all of them or (with
//! `skip_group_on_error`) only those of the failed message group (docs/ARCHITECTURE.md §1.6).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use futures::StreamExt;
use serde::Serialize;

use crate::clock::Clock;
use crate::dead_letter::{DeadLetterCandidate, DeadLetterReason, DeadLetterSink, InvocationInfo};
use crate::error::{ErrorClass, ProcessError};
use crate::event::{SqsRecord, Text};
use crate::item::{is_fifo_arn, ItemParser, WorkItem};
use crate::processor::{Outcome, Processor};
use crate::random::Random;
use crate::retry::{run_with_retry, AttemptFailure, Deadline, RetryPolicy, StopReason};
use crate::signature::error_signature;

mod record_run;
mod spacing;

use record_run::{dead_letter_report, not_started_report};
pub use record_run::{guard_panics, panic_message};
use spacing::sent_time;

/// How the engine treats a batch.
///
/// Exhaustive on purpose: it is built with struct update syntax
/// (`..Default::default()`), which `#[non_exhaustive]` forbids outside this crate. A field
/// added later comes with its default, so such code keeps compiling.
#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// How records become work items.
    pub parser: ItemParser,
    /// In-invocation retries.
    pub retry: RetryPolicy,
    /// Records processed at once on standard queues (FIFO is always sequential).
    pub concurrency: usize,
    /// The source queue's `maxReceiveCount`; `None` leaves exhausted retries to SQS.
    pub max_receive_count: Option<u32>,
    /// Dead-letter this many deliveries before the last one SQS would make.
    pub receive_budget_margin: u32,
    /// FIFO: after a failure, hold back only that message group instead of the whole rest.
    pub skip_group_on_error: bool,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            parser: ItemParser::default(),
            retry: RetryPolicy::default(),
            concurrency: 10,
            max_receive_count: None,
            receive_budget_margin: 0,
            skip_group_on_error: false,
        }
    }
}

/// The engine reads the clock and the randomness its retry policy holds, one of each for
/// the whole batch: a record's deadlines as its handler sees them ([`crate::context`]), how
/// long a record going back may be hidden and the jitter of that delay, the start of a
/// failure found before any attempt, and the retries themselves. The system clock and the
/// thread's generator by default.
impl BatchConfig {
    /// Reads wall time from `clock`.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.retry.clock = clock;
        self
    }

    /// Draws from `random`.
    pub fn with_random(mut self, random: Random) -> Self {
        self.retry.random = random;
        self
    }
}

/// The error code of a record dead-lettered on its last receive without having run.
pub const NOT_STARTED: &str = "NotStarted";

/// The target of the line a record done or skipped leaves (`record done`, `record
/// skipped`). A subscriber that turns this target off keeps every failure's line and the
/// batch's own. Those lines are most of a worker's log volume: one per record, where a
/// failure is the exception (the Lambda functions turn it off unless `WORKER_LOG_RECORDS`
/// is `all`). Only those two lines may use it: a filter turns the target off at every
/// level, and by prefix (`sqs_keeper::records…`).
pub const RECORD_LINES_TARGET: &str = "sqs_keeper::records";

/// Why a record was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NotStartedReason {
    /// Too little time was left before the invocation's deadline.
    Deadline,
    /// FIFO: an earlier record in the batch failed.
    FifoShortCircuit,
    /// FIFO with `skip_group_on_error`: an earlier record of the same group failed.
    FifoGroupFailed,
}

/// How one record ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "disposition", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Disposition {
    /// Processed; acknowledged.
    Done,
    /// Nothing to do; acknowledged.
    Skipped {
        /// Why.
        reason: String,
    },
    /// A retryable failure within the receive budget; reported, SQS redelivers.
    RetryLater {
        /// Class of the last error.
        class: ErrorClass,
    },
    /// Persisted to the dead-letter store; acknowledged.
    DeadLettered {
        /// Class of the final error.
        class: ErrorClass,
        /// Why it was dead-lettered.
        reason: DeadLetterReason,
    },
    /// Should have been dead-lettered but the store failed; reported, SQS redelivers.
    DeadLetterFailed {
        /// Class of the record's own error.
        class: ErrorClass,
        /// The store's error.
        sink_error: String,
    },
    /// Never started; reported, SQS redelivers.
    NotStarted {
        /// Why.
        reason: NotStartedReason,
    },
}

impl Disposition {
    /// Tells whether the record must be listed in `batchItemFailures`.
    pub fn is_reported(&self) -> bool {
        matches!(
            self,
            Disposition::RetryLater { .. }
                | Disposition::DeadLetterFailed { .. }
                | Disposition::NotStarted { .. }
        )
    }
}

/// How one record ended, with its ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RecordReport {
    /// SQS message id.
    pub message_id: String,
    /// Item id (the message id when none was found).
    pub item_id: String,
    /// Attempts made in this invocation.
    pub attempts: u32,
    /// The end state.
    #[serde(flatten)]
    pub disposition: Disposition,
    /// How long the record took, from its start to its disposition (its dead-letter write,
    /// shared by the batch, excepted); `None` when it was never started. For the
    /// `RecordProcessingTime` metric; left out of the serialized report, which stays the
    /// same for the same batch.
    #[serde(skip)]
    pub processing_time: Option<Duration>,
    /// For a record returned for retry: the delay its callee asked for (`Retry-After`),
    /// which spaced redelivery honours (`crate::redelivery`).
    #[serde(skip)]
    pub retry_after: Option<Duration>,
}

/// Totals for one batch; they add up to `records`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BatchCounts {
    /// Records in the event.
    pub records: usize,
    /// Processed.
    pub done: usize,
    /// Nothing to do.
    pub skipped: usize,
    /// Returned for retry.
    pub retry_later: usize,
    /// Persisted to the dead-letter store.
    pub dead_lettered: usize,
    /// Dead-lettering failed; returned for retry.
    pub dead_letter_failed: usize,
    /// Not started (deadline or FIFO).
    pub not_started: usize,
    /// Failures by error class (retry-later, dead-lettered and dead-letter-failed records).
    pub by_class: BTreeMap<ErrorClass, usize>,
}

impl BatchCounts {
    /// Records listed in `batchItemFailures`.
    pub fn reported(&self) -> usize {
        self.retry_later + self.dead_letter_failed + self.not_started
    }
}

/// The outcome of a batch: one report per record, in event order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BatchReport {
    /// One entry per record, in the event's order.
    pub records: Vec<RecordReport>,
}

impl BatchReport {
    /// Returns the response Lambda expects: the reported records' message ids; empty on full success.
    pub fn response(&self) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        for record in self.records.iter().filter(|r| r.disposition.is_reported()) {
            response.add_failure(record.message_id.clone());
        }
        response
    }

    /// Returns the processing time of every record that was started, in event order.
    pub fn record_times(&self) -> Vec<Duration> {
        self.records
            .iter()
            .filter_map(|r| r.processing_time)
            .collect()
    }

    /// Totals by disposition and class.
    pub fn counts(&self) -> BatchCounts {
        let mut counts = BatchCounts {
            records: self.records.len(),
            ..BatchCounts::default()
        };
        for record in &self.records {
            let class = match &record.disposition {
                Disposition::Done => {
                    counts.done += 1;
                    None
                }
                Disposition::Skipped { .. } => {
                    counts.skipped += 1;
                    None
                }
                Disposition::RetryLater { class } => {
                    counts.retry_later += 1;
                    Some(*class)
                }
                Disposition::DeadLettered { class, .. } => {
                    counts.dead_lettered += 1;
                    Some(*class)
                }
                Disposition::DeadLetterFailed { class, .. } => {
                    counts.dead_letter_failed += 1;
                    Some(*class)
                }
                Disposition::NotStarted { .. } => {
                    counts.not_started += 1;
                    None
                }
            };
            if let Some(class) = class {
                *counts.by_class.entry(class).or_default() += 1;
            }
        }
        counts
    }
}

/// A batch that cannot be answered record by record.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchError {
    /// A record without a message id cannot be listed in `batchItemFailures`, so the only
    /// safe answer is to fail the whole invocation (SQS redelivers every record).
    #[error("record {index} of the batch has no messageId; failing the invocation so that no record is lost")]
    MissingMessageId {
        /// Position of the record in the event.
        index: usize,
    },
}

/// Replaces a body that only points at the payload (e.g. an SQS Extended Client S3
/// pointer) with the payload itself, before the record is parsed.
pub trait BodyResolver: Send + Sync {
    /// `None` when `body` is not a pointer this resolver knows; otherwise the payload or
    /// the classified reason it could not be fetched.
    fn resolve<'a>(
        &'a self,
        body: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<Result<String, ProcessError>>>;
}

/// Where a record stands after processing, before any dead-lettering.
enum Step {
    Final(RecordReport),
    DeadLetter {
        candidate: Box<DeadLetterCandidate>,
        attempts: u32,
        /// Its processing time, set by [`BatchProcessor::run_record`].
        time: Option<Duration>,
        /// The fields its handler added (`context::add_field`), as JSON, for the line that
        /// says it was dead-lettered; set by [`BatchProcessor::run_record`].
        fields: Option<String>,
    },
}

/// What every record of a batch gives its handler's context: read once per batch (two
/// clock reads and a task-local lookup fewer per record).
struct RecordShared {
    /// The cut-off as wall time.
    cutoff_at: std::time::SystemTime,
    /// The hard stop as wall time.
    hard_stop_at: std::time::SystemTime,
    /// The invocation's custom metrics.
    metrics: Arc<crate::context::MetricSink>,
    /// The wall clock the deadlines above were read by, for the time a handler has left.
    clock: Clock,
}

impl RecordShared {
    fn of(deadline: &Deadline, clock: Clock) -> Self {
        let now = clock.system_time();
        let at = tokio::time::Instant::now();
        RecordShared {
            cutoff_at: now + deadline.cutoff().saturating_duration_since(at),
            hard_stop_at: now + deadline.hard_stop().saturating_duration_since(at),
            metrics: crate::context::invocation_metrics(),
            clock,
        }
    }

    /// Returns the context of one record (or one death hook) of the batch.
    fn context(&self) -> crate::context::RecordContext {
        crate::context::RecordContext::new(self.cutoff_at, self.hard_stop_at, self.metrics.clone())
            .with_clock(self.clock)
    }
}

/// What a record needs to be hidden after the batch: from its SQS record.
struct Handle {
    /// `None` for a record without one: it cannot be hidden (nor, when it leads its FIFO
    /// group, may the records behind it).
    receipt_handle: Option<String>,
    queue_arn: String,
    receive_count: u32,
    sent: Option<std::time::SystemTime>,
    /// A FIFO queue's message group (none on a standard queue, fair queues included).
    fifo_group: Option<String>,
}

/// Runs a processor over batches with the semantics above.
///
/// One record done, one dead-lettered at first sight (a validation failure), and a
/// response that lists neither for retry:
///
/// ```
/// use std::time::Duration;
/// use sqs_keeper_core::testing::MemorySink;
/// use sqs_keeper_core::{
///     handler_fn, BatchConfig, BatchProcessor, retry::Deadline, dead_letter::InvocationInfo, Outcome, ProcessError,
///     WorkItem,
/// };
///
/// async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError> {
///     match item.payload() {
///         "{\"qty\":0}" => Err(ProcessError::validation("no quantity")),
///         _ => Ok(Outcome::Done),
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let engine = BatchProcessor::new(handler_fn(handle), MemorySink::new(), BatchConfig::default());
/// let record = |id: &str, body: &str| serde_json::json!({
///     "messageId": id, "body": body, "eventSource": "aws:sqs",
///     "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
///     "attributes": {"ApproximateReceiveCount": "1"},
/// });
/// let event = serde_json::from_value(serde_json::json!({
///     "Records": [record("m-1", "{\"qty\":2}"), record("m-2", "{\"qty\":0}")],
/// }))?;
/// let deadline = Deadline::after(Duration::from_secs(30), Duration::from_secs(1));
/// let report = engine.process_batch(event, deadline, &InvocationInfo::default()).await?;
///
/// let counts = report.counts();
/// assert_eq!((counts.done, counts.dead_lettered), (1, 1));
/// assert_eq!(engine.sink().accepted_ids(), ["m-2"]);
/// assert!(report.response().batch_item_failures.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct BatchProcessor<P, S> {
    processor: P,
    sink: S,
    config: BatchConfig,
    resolver: Option<Arc<dyn BodyResolver>>,
    redelivery: Option<(
        crate::redelivery::RedeliveryPolicy,
        Arc<dyn crate::redelivery::VisibilityPort>,
    )>,
    /// The source queues' retention and visibility timeout, read once per queue when
    /// redeliveries are spaced (`crate::redelivery::retry_room`).
    queue_timings: std::sync::Mutex<HashMap<String, QueueTimingRead>>,
    /// Reads the queue's retention when redeliveries are not spaced but a sweep reserve is
    /// kept ([`BatchProcessor::with_sweep_reserve`]).
    timing_port: Option<Arc<dyn crate::redelivery::VisibilityPort>>,
    /// Keep `crate::polling::sweep_interval` of each record's retention in reserve.
    sweep_reserve: bool,
}

/// What is known of a source queue's retention.
#[derive(Debug, Clone, Copy)]
enum QueueTimingRead {
    /// Read.
    Known(crate::redelivery::QueueTiming),
    /// The read failed or took too long; not tried again before this.
    Unknown { retry_at: tokio::time::Instant },
}

/// The longest a batch waits for the source queue's attributes before it starts without
/// them (hiding is an addition, never a condition).
const QUEUE_TIMING_READ: Duration = Duration::from_secs(1);

/// How long a failed read of the queue's attributes is not tried again.
const QUEUE_TIMING_RETRY: Duration = Duration::from_secs(60);

impl<P: std::fmt::Debug, S: std::fmt::Debug> std::fmt::Debug for BatchProcessor<P, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchProcessor")
            .field("processor", &self.processor)
            .field("sink", &self.sink)
            .field("config", &self.config)
            .field("resolver", &self.resolver.is_some())
            .finish()
    }
}

impl<P: Processor, S: DeadLetterSink> BatchProcessor<P, S> {
    /// Creates an engine for `processor`, dead-lettering into `sink`.
    pub fn new(processor: P, sink: S, config: BatchConfig) -> Self {
        BatchProcessor {
            processor,
            sink,
            config,
            resolver: None,
            redelivery: None,
            queue_timings: std::sync::Mutex::new(HashMap::new()),
            timing_port: None,
            sweep_reserve: false,
        }
    }

    /// Spaces the deliveries of records returned for retry: each is hidden for
    /// `policy`'s delay through `port` (`crate::redelivery`).
    pub fn with_redelivery(
        mut self,
        policy: crate::redelivery::RedeliveryPolicy,
        port: Arc<dyn crate::redelivery::VisibilityPort>,
    ) -> Self {
        self.redelivery = Some((policy, port));
        self
    }

    /// Keeps a quarter of each record's retention in reserve (`crate::polling::sweep_reserve`):
    /// under a circuit breaker the worker's polling may be paused, and a paused queue is
    /// swept (each waiting message received once) only that often, so a record returned for
    /// retry must have room for a sweep besides its next delivery, or it is dead-lettered
    /// now (reason `retention_ending`). Reads the queue's retention through `port` when
    /// redeliveries are not spaced (docs/ARCHITECTURE.md §1.12).
    pub fn with_sweep_reserve(mut self, port: Arc<dyn crate::redelivery::VisibilityPort>) -> Self {
        self.timing_port = Some(port);
        self.sweep_reserve = true;
        self
    }

    /// Resolves pointer bodies (e.g. SQS Extended Client) before records are parsed.
    pub fn with_body_resolver(mut self, resolver: Arc<dyn BodyResolver>) -> Self {
        self.resolver = Some(resolver);
        self
    }

    /// Returns the engine's configuration.
    pub fn config(&self) -> &BatchConfig {
        &self.config
    }

    /// Returns the processor, e.g. for a redrive that reprocesses items in place.
    pub fn processor(&self) -> &P {
        &self.processor
    }

    /// Returns the dead-letter sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// Processes a batch. Fails as a whole only when a record has no message id.
    ///
    /// The answer comes by the deadline's hard stop in every case: attempts are cut at the
    /// cut-off and the dead-letter writes at the hard stop; should anything else still be
    /// running there, every record of the batch is reported for retry (SQS delivers them
    /// again; none is lost, and the downstream's idempotency key covers the repeats).
    pub async fn process_batch(
        &self,
        event: SqsEvent,
        deadline: Deadline,
        invocation: &InvocationInfo,
    ) -> Result<BatchReport, BatchError> {
        let batch = crate::event::SqsBatch::from(event);
        self.process_records(batch.records, deadline, invocation)
            .await
    }

    /// Runs [`BatchProcessor::process_batch`] over records decoded by
    /// [`crate::event::decode_event`], which borrow from the invocation body. Each becomes
    /// a [`WorkItem`] only when it runs.
    pub async fn process_records(
        &self,
        source: Vec<SqsRecord<'_>>,
        deadline: Deadline,
        invocation: &InvocationInfo,
    ) -> Result<BatchReport, BatchError> {
        let received = tokio::time::Instant::now();
        // The ids come out of the records in place (the records are not collected again):
        // a copy only of ids that had escapes.
        let mut records = source;
        let mut message_ids: Vec<Text<'_>> = Vec::with_capacity(records.len());
        for (index, msg) in records.iter_mut().enumerate() {
            match msg.message_id.take().filter(|id| !id.as_str().is_empty()) {
                Some(id) => message_ids.push(id),
                None => return Err(BatchError::MissingMessageId { index }),
            }
        }
        // What spaced redelivery needs to hide a record afterwards (only when configured).
        let handles = match &self.redelivery {
            Some(_) => redelivery_handles(&message_ids, &records),
            None => HashMap::new(),
        };
        let fifo = records
            .first()
            .and_then(|m| m.event_source_arn())
            .is_some_and(is_fifo_arn);
        // Every queue of the batch (one, from an event source mapping).
        for arn in batch_queues(&records) {
            self.learn_queue_timing(arn, &deadline).await;
        }
        let ids = &message_ids;
        // The dead letters the sink made durable, for the death hooks after every write.
        let mut durable = Vec::new();
        let work = async {
            if fifo {
                self.process_fifo(ids, records, &deadline, invocation, &mut durable)
                    .await
            } else {
                self.process_standard(ids, records, &deadline, invocation, &mut durable)
                    .await
            }
        };
        match tokio::time::timeout_at(crate::mutants::deadline_guard(deadline.hard_stop()), work)
            .await
        {
            Ok(reports) => {
                record_run::log_not_started(&reports);
                // The hides (records going back) and the death hooks (records that left)
                // concern different records: each gets the time to the hard stop, so a
                // slow hide never leaves the hooks none.
                tokio::join!(
                    self.space_redeliveries(&reports, &handles, &deadline, received),
                    self.after_dead_letter(&durable, &deadline)
                );
                Ok(BatchReport { records: reports })
            }
            Err(_) => Ok(all_returned_at_hard_stop(message_ids)),
        }
    }

    async fn process_standard(
        &self,
        ids: &[Text<'_>],
        records: Vec<SqsRecord<'_>>,
        deadline: &Deadline,
        invocation: &InvocationInfo,
        durable: &mut Vec<DeadLetterCandidate>,
    ) -> Vec<RecordReport> {
        let count = records.len();
        // Each report goes straight to its record's place as the record ends.
        let mut reports: Vec<Option<RecordReport>> = Vec::with_capacity(count);
        reports.resize_with(count, || None);
        let mut candidates: Vec<Waiting> = Vec::new();
        // Up to `concurrency` records at once. A plain loop over `FuturesUnordered` rather
        // than a stream combinator: a closure making futures of records that borrow from
        // the event trips rustc's check that the batch's future is `Send`.
        let limit = self.config.concurrency.max(1);
        let shared = RecordShared::of(deadline, self.config.retry.clock);
        let shared = &shared;
        let mut waiting = ids.iter().zip(records).enumerate();
        let mut running = futures::stream::FuturesUnordered::new();
        loop {
            // One at a time, the record runs in place: no task to allocate and move it into.
            let next = if limit == 1 {
                match waiting.next() {
                    Some((index, (id, msg))) => Some(
                        self.run_indexed(index, id.clone(), msg, deadline, shared)
                            .await,
                    ),
                    None => None,
                }
            } else {
                while running.len() < limit {
                    let Some((index, (id, msg))) = waiting.next() else {
                        break;
                    };
                    running.push(self.run_indexed(index, id.clone(), msg, deadline, shared));
                }
                running.next().await
            };
            match next {
                Some((index, Step::Final(report))) => {
                    if let Some(slot) = reports.get_mut(index) {
                        *slot = Some(report);
                    }
                }
                Some((
                    index,
                    Step::DeadLetter {
                        candidate,
                        attempts,
                        time,
                        fields,
                    },
                )) => candidates.push((index, *candidate, attempts, time, fields)),
                None => break,
            }
        }
        if !candidates.is_empty() {
            self.dead_letter_waiting(candidates, &mut reports, invocation, deadline, durable)
                .await;
        }
        every_place_filled(reports, ids)
    }

    /// Dead-letters the records of a standard batch that ended failing for good, in the
    /// batch's order, and fills their places in `reports`. Each one the sink made durable
    /// joins `durable`, for the death hooks.
    async fn dead_letter_waiting(
        &self,
        mut candidates: Vec<Waiting>,
        reports: &mut [Option<RecordReport>],
        invocation: &InvocationInfo,
        deadline: &Deadline,
        durable: &mut Vec<DeadLetterCandidate>,
    ) {
        // The sink gets them in the batch's order, whatever order they ended in.
        candidates.sort_by_key(|(index, ..)| *index);
        let (slots, candidates): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .map(|(index, candidate, attempts, time, fields)| {
                ((index, attempts, time, fields), candidate)
            })
            .unzip();
        let results = self.dead_letter(&candidates, invocation, deadline).await;
        for (n, (candidate, (index, attempts, time, fields))) in
            candidates.into_iter().zip(slots).enumerate()
        {
            if let Some(slot) = reports.get_mut(index) {
                *slot = Some(dead_letter_report(
                    &candidate,
                    (attempts, time),
                    results.get(n),
                    fields.as_deref(),
                ));
            }
            if matches!(results.get(n), Some(Ok(()))) {
                durable.push(candidate);
            }
        }
    }

    async fn process_fifo(
        &self,
        ids: &[Text<'_>],
        records: Vec<SqsRecord<'_>>,
        deadline: &Deadline,
        invocation: &InvocationInfo,
        durable: &mut Vec<DeadLetterCandidate>,
    ) -> Vec<RecordReport> {
        let mut reports = Vec::with_capacity(records.len());
        let mut batch_failed = false;
        let mut failed_groups: HashSet<Option<String>> = HashSet::new();
        let shared = RecordShared::of(deadline, self.config.retry.clock);
        for (id, msg) in ids.iter().cloned().zip(records) {
            let group = msg.attribute("MessageGroupId").map(str::to_string);
            let held_back = if crate::mutants::is_on(crate::mutants::Mutant::FifoGoesOnAfterFailure)
            {
                None
            } else if self.config.skip_group_on_error {
                failed_groups
                    .contains(&group)
                    .then_some(NotStartedReason::FifoGroupFailed)
            } else {
                batch_failed.then_some(NotStartedReason::FifoShortCircuit)
            };
            let step = match held_back {
                Some(reason) => self.not_run(id, msg, reason, deadline),
                None => self.run_record(id, msg, deadline, &shared).await,
            };
            let report = match step {
                Step::Final(report) => report,
                Step::DeadLetter {
                    candidate,
                    attempts,
                    time,
                    fields,
                } => {
                    // Dead-letter at once: a dead-lettered record has left its group's
                    // stream (as SQS's own redrive would move it), so the group goes on.
                    let results = self
                        .dead_letter(std::slice::from_ref(&*candidate), invocation, deadline)
                        .await;
                    let report = dead_letter_report(
                        &candidate,
                        (attempts, time),
                        results.first(),
                        fields.as_deref(),
                    );
                    if matches!(results.first(), Some(Ok(()))) {
                        durable.push(*candidate);
                    }
                    report
                }
            };
            if report.disposition.is_reported() {
                batch_failed = true;
                failed_groups.insert(group);
            }
            reports.push(report);
        }
        reports
    }
}

#[cfg(test)]
mod tests;

/// A record waiting to be dead-lettered: its place in the batch, attempts, processing time
/// and handler fields.
type Waiting = (
    usize,
    DeadLetterCandidate,
    u32,
    Option<Duration>,
    Option<String>,
);

/// Returns what spaced redelivery needs to hide each record of the batch afterwards, by message id.
fn redelivery_handles(
    message_ids: &[Text<'_>],
    records: &[SqsRecord<'_>],
) -> HashMap<String, Handle> {
    message_ids
        .iter()
        .zip(records)
        .filter_map(|(id, m)| {
            Some((
                id.as_str().to_string(),
                Handle {
                    receipt_handle: m.receipt_handle().map(str::to_string),
                    queue_arn: m.event_source_arn()?.to_string(),
                    receive_count: m
                        .attribute("ApproximateReceiveCount")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1),
                    sent: sent_time(m.attribute("SentTimestamp")),
                    fifo_group: m
                        .event_source_arn()
                        .filter(|arn| is_fifo_arn(arn))
                        .and(m.attribute("MessageGroupId"))
                        .map(str::to_string),
                },
            ))
        })
        .collect()
}

/// Every queue of the batch, once each (one, from an event source mapping).
fn batch_queues<'a>(records: &'a [SqsRecord<'_>]) -> Vec<&'a str> {
    let mut queues: Vec<&str> = records
        .iter()
        .filter_map(|m| m.event_source_arn())
        .collect();
    queues.sort_unstable();
    queues.dedup();
    queues
}

/// Returns the report of a batch still running at the deadline's hard stop: every record is
/// returned for retry.
fn all_returned_at_hard_stop(message_ids: Vec<Text<'_>>) -> BatchReport {
    tracing::error!(
        records = message_ids.len(),
        "the batch was still running at the deadline's hard stop; every record is returned for retry"
    );
    let reports: Vec<RecordReport> = message_ids
        .into_iter()
        .map(|message_id| not_started_report(message_id.into_owned(), NotStartedReason::Deadline))
        .collect();
    record_run::log_not_started(&reports);
    BatchReport { records: reports }
}

/// Returns the reports in the batch's order. Every place is filled by now; were one not, its
/// record would be returned for retry rather than left out of the response. (Collected in
/// place: an `Option<RecordReport>` is the size of a report.)
fn every_place_filled(reports: Vec<Option<RecordReport>>, ids: &[Text<'_>]) -> Vec<RecordReport> {
    reports
        .into_iter()
        .zip(ids)
        .map(|(report, id)| {
            report.unwrap_or_else(|| {
                not_started_report(id.as_str().to_string(), NotStartedReason::Deadline)
            })
        })
        .collect()
}
