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

use crate::dead_letter::{DeadLetterCandidate, DeadLetterReason, DeadLetterSink, InvocationInfo};
use crate::error::{ErrorClass, ProcessError};
use crate::event::{SqsRecord, Text};
use crate::item::{is_fifo_arn, ItemParser, WorkItem};
use crate::processor::{Outcome, Processor};
use crate::retry::{run_with_retry, AttemptFailure, Deadline, RetryPolicy, StopReason};
use crate::signature::error_signature;

/// How the engine treats a batch.
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

/// The error code of a record dead-lettered on its last receive without having run.
pub const NOT_STARTED: &str = "NotStarted";

/// Why a record was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
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
    /// Whether the record must be listed in `batchItemFailures`.
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
pub struct BatchReport {
    /// One entry per record, in the event's order.
    pub records: Vec<RecordReport>,
}

impl BatchReport {
    /// The response Lambda expects: the reported records' message ids; empty on full success.
    pub fn response(&self) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        for record in self.records.iter().filter(|r| r.disposition.is_reported()) {
            response.add_failure(record.message_id.clone());
        }
        response
    }

    /// The processing time of every record that was started, in event order.
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
}

impl RecordShared {
    fn of(deadline: &Deadline) -> Self {
        let now = std::time::SystemTime::from(crate::clock::now());
        let at = tokio::time::Instant::now();
        RecordShared {
            cutoff_at: now + deadline.cutoff().saturating_duration_since(at),
            hard_stop_at: now + deadline.hard_stop().saturating_duration_since(at),
            metrics: crate::context::invocation_metrics(),
        }
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
    /// An engine for `processor`, dead-lettering into `sink`.
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

    /// The engine's configuration.
    pub fn config(&self) -> &BatchConfig {
        &self.config
    }

    /// The processor, e.g. for a redrive that reprocesses items in place.
    pub fn processor(&self) -> &P {
        &self.processor
    }

    /// The dead-letter sink.
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

    /// [`BatchProcessor::process_batch`] over records decoded by
    /// [`crate::event::decode_event`], which borrow from the invocation body: each becomes
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
        let handles: HashMap<String, Handle> = match &self.redelivery {
            Some(_) => message_ids
                .iter()
                .zip(&records)
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
                .collect(),
            None => HashMap::new(),
        };
        let fifo = records
            .first()
            .and_then(|m| m.event_source_arn())
            .is_some_and(is_fifo_arn);
        // Every queue of the batch (one, from an event source mapping).
        let mut queues: Vec<&str> = records
            .iter()
            .filter_map(|m| m.event_source_arn())
            .collect();
        queues.sort_unstable();
        queues.dedup();
        for arn in queues {
            self.learn_queue_timing(arn, &deadline).await;
        }
        let ids = &message_ids;
        let work = async {
            if fifo {
                self.process_fifo(ids, records, &deadline, invocation).await
            } else {
                self.process_standard(ids, records, &deadline, invocation)
                    .await
            }
        };
        match tokio::time::timeout_at(crate::mutants::deadline_guard(deadline.hard_stop()), work)
            .await
        {
            Ok(reports) => {
                self.space_redeliveries(&reports, &handles, &deadline, received)
                    .await;
                Ok(BatchReport { records: reports })
            }
            Err(_) => {
                tracing::error!(
                    records = message_ids.len(),
                    "the batch was still running at the deadline's hard stop; every record is returned for retry"
                );
                Ok(BatchReport {
                    records: message_ids
                        .into_iter()
                        .map(|message_id| {
                            not_started_report(message_id.into_owned(), NotStartedReason::Deadline)
                        })
                        .collect(),
                })
            }
        }
    }

    async fn process_standard(
        &self,
        ids: &[Text<'_>],
        records: Vec<SqsRecord<'_>>,
        deadline: &Deadline,
        invocation: &InvocationInfo,
    ) -> Vec<RecordReport> {
        let count = records.len();
        // Each report goes straight to its record's place as the record ends.
        let mut reports: Vec<Option<RecordReport>> = Vec::with_capacity(count);
        reports.resize_with(count, || None);
        let mut candidates: Vec<(usize, DeadLetterCandidate, u32, Option<Duration>)> = Vec::new();
        // Up to `concurrency` records at once. A plain loop over `FuturesUnordered` rather
        // than a stream combinator: a closure making futures of records that borrow from
        // the event trips rustc's check that the batch's future is `Send`.
        let limit = self.config.concurrency.max(1);
        let shared = RecordShared::of(deadline);
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
                    },
                )) => candidates.push((index, *candidate, attempts, time)),
                None => break,
            }
        }
        if !candidates.is_empty() {
            // The sink gets them in the batch's order, whatever order they ended in.
            candidates.sort_by_key(|(index, ..)| *index);
            let (slots, candidates): (Vec<_>, Vec<_>) = candidates
                .into_iter()
                .map(|(index, candidate, attempts, time)| ((index, attempts, time), candidate))
                .unzip();
            let results = self.dead_letter(&candidates, invocation, deadline).await;
            for (n, (candidate, (index, attempts, time))) in
                candidates.iter().zip(slots).enumerate()
            {
                if let Some(slot) = reports.get_mut(index) {
                    *slot = Some(dead_letter_report(
                        candidate,
                        attempts,
                        time,
                        results.get(n),
                    ));
                }
            }
        }
        // Every place is filled by now; were one not, its record would be returned for
        // retry rather than left out of the response. (Collected in place: an
        // `Option<RecordReport>` is the size of a report.)
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

    async fn process_fifo(
        &self,
        ids: &[Text<'_>],
        records: Vec<SqsRecord<'_>>,
        deadline: &Deadline,
        invocation: &InvocationInfo,
    ) -> Vec<RecordReport> {
        let mut reports = Vec::with_capacity(records.len());
        let mut batch_failed = false;
        let mut failed_groups: HashSet<Option<String>> = HashSet::new();
        let shared = RecordShared::of(deadline);
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
                } => {
                    // Dead-letter at once: a dead-lettered record has left its group's
                    // stream (as SQS's own redrive would move it), so the group goes on.
                    let results = self
                        .dead_letter(std::slice::from_ref(&*candidate), invocation, deadline)
                        .await;
                    dead_letter_report(&candidate, attempts, time, results.first())
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

    /// Hides the records going back to the queue for their redelivery delay
    /// (`crate::redelivery`), bounded by the deadline's hard stop. A record that cannot be
    /// hidden is still reported, and comes back after the queue's visibility timeout.
    async fn space_redeliveries(
        &self,
        reports: &[RecordReport],
        handles: &HashMap<String, Handle>,
        deadline: &Deadline,
        received: tokio::time::Instant,
    ) {
        let Some((policy, port)) = &self.redelivery else {
            return;
        };
        // SQS refuses a visibility timeout reaching past 12 hours from the message's
        // receive, not from the change: what the receive and the batching window before
        // the invocation may have used, and this invocation so far, come off the cap.
        let longest = crate::redelivery::longest_hide(received.elapsed());
        let now = std::time::SystemTime::from(crate::clock::now());
        // FIFO: no record of a message group going back is hidden longer than the group's
        // first. A group with a message in flight yields nothing, so one hidden longer (or
        // left in flight for the rest of its visibility timeout) would hold the whole group,
        // its first record included, past that record's delay and even its retention
        // (docs/ARCHITECTURE.md §1.6).
        //
        // A later record of a group is hidden only once the group's first is: were the
        // first's hide to fail (or the first to have no receipt handle), the first comes
        // back after its visibility timeout, and a later record hidden for the first's
        // intended delay would hold it past that (and past its retention), so it is left
        // to come back with the first. A group is a queue's: the same group id on two
        // queues is two groups.
        let mut firsts: Vec<crate::redelivery::Hide> = Vec::new();
        let mut first_of_group: HashMap<(&str, &str), Option<(usize, Duration)>> = HashMap::new();
        let mut followers: Vec<(usize, crate::redelivery::Hide)> = Vec::new();
        for r in reports.iter().filter(|r| {
            matches!(
                r.disposition,
                Disposition::RetryLater { .. }
                    | Disposition::DeadLetterFailed { .. }
                    | Disposition::NotStarted { .. }
            )
        }) {
            let Some(handle) = handles.get(&r.message_id) else {
                continue;
            };
            let group = handle
                .fifo_group
                .as_deref()
                .filter(|_| !crate::mutants::is_on(crate::mutants::Mutant::FifoHidesWholeGroup))
                .map(|g| (handle.queue_arn.as_str(), g));
            let Some(receipt_handle) = handle.receipt_handle.clone() else {
                if let Some(group) = group {
                    first_of_group.entry(group).or_insert(None);
                }
                continue;
            };
            // Never past what is left of the message's retention (less a visibility
            // timeout for its next delivery): a message that expires while hidden is
            // gone without a trace.
            // Whole seconds down: SQS rounds a hide up to whole seconds.
            let within_retention = self
                .retry_room(Some(&handle.queue_arn), handle.sent, now)
                .map_or(Duration::MAX, |room| Duration::from_secs(room.as_secs()));
            let delay = policy
                .delay(
                    handle.receive_count,
                    r.retry_after.filter(|_| {
                        !crate::mutants::is_on(crate::mutants::Mutant::RetryAfterIgnored)
                    }),
                    fastrand::f64(),
                )
                .min(longest)
                .min(within_retention);
            let hide = |delay| crate::redelivery::Hide {
                queue_arn: handle.queue_arn.clone(),
                receipt_handle,
                delay,
            };
            match group {
                Some(group) => match first_of_group.get(&group) {
                    Some(Some((first, cap))) => followers.push((*first, hide(delay.min(*cap)))),
                    // Its group's first cannot be hidden: left to come back with it.
                    Some(None) => {}
                    None => {
                        first_of_group.insert(group, Some((firsts.len(), delay)));
                        firsts.push(hide(delay));
                    }
                },
                None => firsts.push(hide(delay)),
            }
        }
        if firsts.is_empty() {
            return;
        }
        let first_call = tokio::time::Instant::now();
        let mut results = self.hide_until(port.as_ref(), &firsts, deadline).await;
        let mut tried = firsts.len();
        // The later records' hides count from the second call: what the first took comes
        // off them, so none ends after its group's first does, nor past the caps (12 h
        // from the receive, the retention) computed before the first call.
        let took = first_call.elapsed();
        let followers: Vec<crate::redelivery::Hide> = followers
            .into_iter()
            .filter(|(first, _)| matches!(results.get(*first), Some(Ok(()))))
            .map(|(_, mut hide)| {
                hide.delay = hide.delay.saturating_sub(took);
                hide
            })
            .collect();
        if !followers.is_empty() {
            tried += followers.len();
            results.extend(self.hide_until(port.as_ref(), &followers, deadline).await);
        }
        let hidden = results.iter().filter(|r| r.is_ok()).count();
        if hidden < tried {
            let error = results.iter().find_map(|r| r.as_ref().err());
            tracing::warn!(
                hidden,
                returned = tried,
                error = %error.map_or_else(|| "cut at the deadline's hard stop".to_string(), ToString::to_string),
                "some records going back to the queue could not be hidden for their redelivery delay; they come back after the queue's visibility timeout"
            );
        } else {
            tracing::info!(
                hidden,
                "records going back to the queue hidden for their redelivery delay"
            );
        }
    }

    /// One `ChangeMessageVisibilityBatch` (per queue, by the port), bounded by the
    /// deadline's hard stop: a call cut there counts as no record hidden.
    async fn hide_until(
        &self,
        port: &dyn crate::redelivery::VisibilityPort,
        hides: &[crate::redelivery::Hide],
        deadline: &Deadline,
    ) -> Vec<Result<(), ProcessError>> {
        tokio::time::timeout_at(deadline.hard_stop(), port.hide(hides))
            .await
            .unwrap_or_default()
    }

    /// Hands candidates to the sink, bounded by the deadline's hard stop: writes still
    /// running there are abandoned and their records returned for retry (every write is
    /// idempotent, so the next delivery completes what was cut).
    async fn dead_letter(
        &self,
        candidates: &[DeadLetterCandidate],
        invocation: &InvocationInfo,
        deadline: &Deadline,
    ) -> Vec<Result<(), ProcessError>> {
        // Boxed, as the processor's calls are (see `boxed`).
        let writes: futures::future::BoxFuture<'_, Vec<Result<(), ProcessError>>> =
            Box::pin(self.sink.dead_letter(candidates, invocation));
        match tokio::time::timeout_at(crate::mutants::deadline_guard(deadline.hard_stop()), writes)
            .await
        {
            Ok(results) => results,
            Err(_) => candidates
                .iter()
                .map(|_| {
                    Err(ProcessError::new(
                        ErrorClass::Timeout,
                        "dead-letter writes cut at the deadline's hard stop",
                    )
                    .with_step("dead-letter"))
                })
                .collect(),
        }
    }

    /// [`BatchProcessor::run_record`] with the record's place in the batch.
    async fn run_indexed(
        &self,
        index: usize,
        message_id: Text<'_>,
        msg: SqsRecord<'_>,
        deadline: &Deadline,
        shared: &RecordShared,
    ) -> (usize, Step) {
        (
            index,
            self.run_record(message_id, msg, deadline, shared).await,
        )
    }

    /// Runs one record unless the cut-off has passed, and times it: one clock read at each
    /// end, nothing per attempt.
    async fn run_record(
        &self,
        message_id: Text<'_>,
        msg: SqsRecord<'_>,
        deadline: &Deadline,
        shared: &RecordShared,
    ) -> Step {
        let started = tokio::time::Instant::now();
        if started >= deadline.cutoff() {
            return self.not_run(message_id, msg, NotStartedReason::Deadline, deadline);
        }
        // The record's context (deadline, custom metrics and log fields) for the handler.
        let context = crate::context::RecordContext::new(
            shared.cutoff_at,
            shared.hard_stop_at,
            shared.metrics.clone(),
        );
        let (step, fields) = context
            .scope(self.process_record(message_id, msg, deadline))
            .await;
        let took = Some(started.elapsed());
        if !fields.is_empty() {
            let (message_id, item_id, outcome) = match &step {
                Step::Final(report) => (
                    &report.message_id,
                    &report.item_id,
                    outcome_name(&report.disposition),
                ),
                Step::DeadLetter { candidate, .. } => (
                    &candidate.item.message_id,
                    &candidate.item.item_id,
                    "dead_letter",
                ),
            };
            tracing::info!(
                message_id = %message_id,
                item_id = %item_id,
                outcome,
                handler_fields = %serde_json::Value::Object(fields),
                "record processed"
            );
        }
        match step {
            Step::Final(report) => Step::Final(RecordReport {
                processing_time: took,
                ..report
            }),
            Step::DeadLetter {
                candidate,
                attempts,
                time: _,
            } => Step::DeadLetter {
                candidate,
                attempts,
                time: took,
            },
        }
    }

    /// Parses and processes one record, retrying within the invocation.
    async fn process_record(
        &self,
        message_id: Text<'_>,
        mut msg: SqsRecord<'_>,
        deadline: &Deadline,
    ) -> Step {
        let mut resolve_error = None;
        // The digest of the body as received, when a pointer was followed: the record of a
        // requeued pointer holds that, not the payload fetched.
        let mut pointer_sha = None;
        if let (Some(resolver), Some(body)) = (&self.resolver, msg.body.as_ref()) {
            match tokio::time::timeout_at(deadline.cutoff(), resolver.resolve(body.as_str())).await
            {
                Ok(Some(Ok(payload))) => {
                    pointer_sha = Some(crate::hex::sha256_hex(body.as_str().as_bytes()));
                    msg.body = Some(Text::from(payload));
                }
                Ok(Some(Err(error))) => resolve_error = Some(error),
                Ok(None) => {}
                Err(_) => {
                    resolve_error = Some(
                        ProcessError::new(
                            ErrorClass::Timeout,
                            "fetching the payload was cut at the invocation's cut-off",
                        )
                        .with_step("fetch-payload"),
                    )
                }
            }
        }
        let parsed = self
            .config
            .parser
            .parse_record(message_id.into_owned(), msg);
        if let Some(error) = resolve_error {
            // The payload could not be fetched: decide as for a failed attempt, without
            // running the processor on a pointer (nor judging the pointer as the payload).
            let item = parsed.unwrap_or_else(|invalid| invalid.item);
            let stop = if error.class.is_retryable(self.config.retry.retry_unknown) {
                StopReason::AttemptsExhausted
            } else {
                StopReason::Permanent
            };
            let failure = immediate_failure(error.clone());
            return self.settle_failure(item, error, stop, vec![failure], 0, deadline);
        }
        let item = match parsed {
            Ok(item) => item,
            Err(invalid) => {
                let invalid = *invalid;
                let failure = immediate_failure(invalid.error.clone());
                return self.settle_failure(
                    invalid.item,
                    invalid.error,
                    StopReason::Permanent,
                    vec![failure],
                    0,
                    deadline,
                );
            }
        };
        if let Some(notice) = item.envelope.as_ref().and_then(|e| e.notice.clone()) {
            // A service notice, not an event: nothing to process, nothing to keep.
            tracing::warn!(message_id = %item.message_id, notice = %notice, "skipped a service notice");
            return Step::Final(RecordReport {
                message_id: item.message_id,
                item_id: item.item_id,
                attempts: 0,
                disposition: Disposition::Skipped { reason: notice },
                processing_time: None,
                retry_after: None,
            });
        }
        let run = run_with_retry(&self.config.retry, deadline, |_| {
            guard_panics(boxed(self.processor.process(&item)))
        })
        .await;
        let attempts =
            u32::try_from(run.failures.len()).unwrap_or(u32::MAX) + u32::from(run.result.is_ok());
        match run.result {
            Ok(outcome) => {
                let mut disposition = match outcome {
                    Outcome::Done => Disposition::Done,
                    Outcome::Skipped { reason } => Disposition::Skipped { reason },
                };
                if let Err(error) = self
                    .finish_requeued(&item, pointer_sha.as_deref(), deadline)
                    .await
                {
                    // Processed, but its record still says requeued: returned for retry so
                    // the record ends true (the downstream's idempotency key covers the
                    // repeat).
                    tracing::warn!(message_id = %item.message_id, item_id = %item.item_id, error = %error,
                        "requeued item processed but its record could not be resolved; returned for retry");
                    disposition = Disposition::RetryLater { class: error.class };
                }
                Step::Final(RecordReport {
                    message_id: item.message_id,
                    item_id: item.item_id,
                    attempts,
                    disposition,
                    processing_time: None,
                    retry_after: None,
                })
            }
            Err((error, stop)) => {
                self.settle_failure(item, error, stop, run.failures, attempts, deadline)
            }
        }
    }

    /// After a message a redrive requeued is processed, its record is resolved; so is the
    /// record of a DLQ message moved back to the source queue from outside (the console's
    /// "Start DLQ redrive", `StartMessageMoveTask`): it carries the DLQ message's attributes
    /// (item id, source message id) and no requeue stamp.
    async fn finish_requeued(
        &self,
        item: &WorkItem,
        pointer_sha: Option<&str>,
        deadline: &Deadline,
    ) -> Result<(), ProcessError> {
        if item.message_attributes.is_empty() {
            return Ok(());
        }
        let attribute = |name: &str| {
            item.message_attributes
                .get(name)
                .and_then(|a| a.string_value.as_deref())
        };
        let Some(record_id) = attribute(crate::message::ITEM_ID_ATTRIBUTE) else {
            return Ok(());
        };
        // The key the record is stored under (an id past DynamoDB's key limit is stored
        // by its digest).
        let record_id = crate::item::bounded_item_id(record_id.to_string());
        // The digests of what this message carried, never a digest it merely states (a
        // producer's attribute could name another item's): the payload processed and, for
        // a pointer followed, the pointer itself, which the record of a requeued pointer
        // holds (found by the simulation, seed 788). Each write is conditional on the
        // record holding the digest; at most one applies.
        let mut digests = vec![crate::hex::sha256_hex(item.body.as_bytes())];
        digests.extend(pointer_sha.map(str::to_string));
        let (requeued_by, dead_lettered) = match (
            attribute(crate::dead_letter::REQUEUED_BY_ATTRIBUTE),
            attribute(crate::message::SOURCE_MESSAGE_ID_ATTRIBUTE),
        ) {
            (None, None) => return Ok(()),
            found => found,
        };
        let record_id = record_id.as_str();
        let finish: futures::future::BoxFuture<'_, Result<(), ProcessError>> =
            Box::pin(async move {
                for sha in &digests {
                    match requeued_by {
                        // A requeued message: its record waits for it, or (the message
                        // came back to the DLQ, reopening the record, and was moved back
                        // by the console) is dead holding its payload.
                        Some(requeued_by) => {
                            self.sink
                                .finish_requeued(record_id, &item.message_id, sha, requeued_by)
                                .await?;
                            self.sink
                                .finish_moved_back(
                                    record_id,
                                    &item.message_id,
                                    &item.message_id,
                                    sha,
                                )
                                .await?;
                        }
                        None => {
                            if let Some(dead_lettered) = dead_lettered {
                                self.sink
                                    .finish_moved_back(
                                        record_id,
                                        dead_lettered,
                                        &item.message_id,
                                        sha,
                                    )
                                    .await?;
                            }
                        }
                    }
                }
                Ok(())
            });
        tokio::time::timeout_at(deadline.hard_stop(), finish)
            .await
            .unwrap_or_else(|_| {
                Err(ProcessError::new(
                    ErrorClass::Timeout,
                    "resolving the requeued record was cut at the deadline",
                )
                .with_step("finish-requeued"))
            })
    }

    /// A record the batch will not run (past the cut-off, or held back behind a FIFO
    /// failure): reported as not started (and hidden like any record returned), except on
    /// its last receive, where the queue's redrive policy would move it without a record:
    /// then it is dead-lettered, class `timeout` (transient, so a redrive brings it back),
    /// code [`NOT_STARTED`], with why (docs/ARCHITECTURE.md §1.3).
    fn not_run(
        &self,
        message_id: Text<'_>,
        msg: SqsRecord<'_>,
        reason: NotStartedReason,
        deadline: &Deadline,
    ) -> Step {
        let receive_count = msg
            .attribute("ApproximateReceiveCount")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let retention_ending = self.retention_ending(
            msg.event_source_arn(),
            sent_time(msg.attribute("SentTimestamp")),
            deadline,
        );
        let budget_spent = self.receive_budget_spent(receive_count)
            && !crate::mutants::is_on(crate::mutants::Mutant::UnstartedLeftToRedrivePolicy);
        if !budget_spent && !retention_ending {
            return Step::Final(not_started(message_id, &msg, reason, &self.config.parser));
        }
        let item = self
            .config
            .parser
            .parse_record(message_id.into_owned(), msg)
            .unwrap_or_else(|invalid| invalid.item);
        let held = match reason {
            NotStartedReason::Deadline => "not started before the invocation's cut-off",
            NotStartedReason::FifoShortCircuit => {
                "held back behind an earlier failure of its FIFO batch"
            }
            NotStartedReason::FifoGroupFailed => {
                "held back behind an earlier failure of its message group"
            }
        };
        let (when, dead_letter_reason) = if budget_spent {
            (
                "on its last receive",
                DeadLetterReason::ReceiveBudgetExhausted,
            )
        } else {
            (
                "too close to the end of its retention for another delivery",
                DeadLetterReason::RetentionEnding,
            )
        };
        let why = format!("{held} {when}");
        let error = ProcessError::new(ErrorClass::Timeout, why)
            .with_code(NOT_STARTED)
            .with_step("not-started");
        Step::DeadLetter {
            candidate: Box::new(DeadLetterCandidate {
                item,
                // The history says what became of this delivery, as for any other.
                failures: vec![immediate_failure(error.clone())],
                error,
                reason: dead_letter_reason,
            }),
            attempts: 0,
            time: None,
        }
    }

    /// Decides between dead-lettering a failed record and returning it for retry.
    fn settle_failure(
        &self,
        item: WorkItem,
        error: ProcessError,
        stop: StopReason,
        failures: Vec<AttemptFailure>,
        attempts: u32,
        deadline: &Deadline,
    ) -> Step {
        let reason = if stop == StopReason::Permanent {
            Some(DeadLetterReason::Permanent)
        } else if self.receive_budget_spent(item.receive_count) {
            Some(DeadLetterReason::ReceiveBudgetExhausted)
        } else if self.retention_ending(
            item.event_source_arn.as_deref(),
            item.sent_timestamp.map(std::time::SystemTime::from),
            deadline,
        ) {
            Some(DeadLetterReason::RetentionEnding)
        } else {
            None
        };
        match reason {
            Some(reason) => Step::DeadLetter {
                candidate: Box::new(DeadLetterCandidate {
                    item,
                    error,
                    failures,
                    reason,
                }),
                attempts,
                time: None,
            },
            None => {
                log_failure(&item, &error, "returned for retry");
                Step::Final(RecordReport {
                    message_id: item.message_id,
                    item_id: item.item_id,
                    attempts,
                    disposition: Disposition::RetryLater { class: error.class },
                    processing_time: None,
                    // What the callee asked for (a `Retry-After`, the rest of the breaker's
                    // open period) spaces the next delivery at least as far.
                    retry_after: error.retry_after,
                })
            }
        }
    }

    /// Reads the source queue's retention and visibility timeout once (when redeliveries
    /// are spaced), bounded by the cut-off; a queue that cannot be read is tried again by
    /// the next batch, and its hides meanwhile are capped by SQS's limits only.
    async fn learn_queue_timing(&self, queue_arn: &str, deadline: &Deadline) {
        let (policy, port) = match (&self.redelivery, &self.timing_port) {
            (Some((policy, port)), _) => (Some(policy), port),
            (None, Some(port)) => (None, port),
            (None, None) => return,
        };
        let now = tokio::time::Instant::now();
        let known = self
            .queue_timings
            .lock()
            .is_ok_and(|t| match t.get(queue_arn) {
                Some(QueueTimingRead::Known(_)) => true,
                Some(QueueTimingRead::Unknown { retry_at }) => now < *retry_at,
                None => false,
            });
        if known {
            return;
        }
        let bound = (now + QUEUE_TIMING_READ).min(deadline.cutoff());
        let read = tokio::time::timeout_at(bound, port.queue_timing(queue_arn)).await;
        match read {
            Ok(Some(timing)) => {
                // CloudFormation cannot compare numbers, so a template cannot refuse a
                // spacing longer than the queue's retention: said here, once per sandbox.
                // Nothing is lost either way (hides are capped, and a message with no room
                // left is dead-lettered), but the receive budget cannot be spent.
                // Under a breaker whose control may pause polling, a record needs room for a
                // sweep besides its next delivery: kept as part of the visibility timeout.
                let timing = if self.sweep_reserve {
                    crate::redelivery::QueueTiming {
                        visibility_timeout: timing.visibility_timeout
                            + crate::polling::sweep_reserve(timing.retention),
                        ..timing
                    }
                } else {
                    timing
                };
                if let Some((receives, policy)) = self.config.max_receive_count.zip(policy) {
                    let span = policy.least_span(receives);
                    if span + timing.visibility_timeout > timing.retention {
                        tracing::warn!(
                            receives,
                            spacing_hours = span.as_secs() / 3600,
                            retention_hours = timing.retention.as_secs() / 3600,
                            "the redelivery spacing of the queue's receives outlasts its retention: messages still failing near the end of their retention are dead-lettered (reason retention_ending) before their receives are spent"
                        );
                    }
                }
                if let Ok(mut timings) = self.queue_timings.lock() {
                    timings.insert(queue_arn.to_string(), QueueTimingRead::Known(timing));
                }
            }
            _ => {
                tracing::warn!(
                    retry_secs = QUEUE_TIMING_RETRY.as_secs(),
                    "the source queue's retention could not be read; redelivery delays are not capped by it until it is"
                );
                if let Ok(mut timings) = self.queue_timings.lock() {
                    timings.insert(
                        queue_arn.to_string(),
                        QueueTimingRead::Unknown {
                            retry_at: tokio::time::Instant::now() + QUEUE_TIMING_RETRY,
                        },
                    );
                }
            }
        }
    }

    fn queue_timing(&self, queue_arn: Option<&str>) -> Option<crate::redelivery::QueueTiming> {
        let timings = self.queue_timings.lock().ok()?;
        match timings.get(queue_arn?)? {
            QueueTimingRead::Known(timing) => Some(*timing),
            QueueTimingRead::Unknown { .. } => None,
        }
    }

    /// How long a record of `queue_arn` sent at `sent` may be hidden `now` and still be
    /// delivered once more before it expires (`crate::redelivery::retry_room`): `None`
    /// when unknown (redeliveries not spaced, the queue's retention unread, no
    /// `SentTimestamp`), `Some(ZERO)` when there is no room.
    fn retry_room(
        &self,
        queue_arn: Option<&str>,
        sent: Option<std::time::SystemTime>,
        now: std::time::SystemTime,
    ) -> Option<Duration> {
        if crate::mutants::is_on(crate::mutants::Mutant::RetentionIgnored) {
            return None;
        }
        let timing = self.queue_timing(queue_arn)?;
        Some(crate::redelivery::retry_room(sent?, &timing, now).unwrap_or(Duration::ZERO))
    }

    /// Whether a record returned by this invocation could not be delivered again before its
    /// retention ends: it is then dead-lettered, never left to expire while hidden
    /// (docs/ARCHITECTURE.md §1.11). Judged at the hard stop, the latest the batch answers
    /// (the rest of the batch may run on after this record ended).
    fn retention_ending(
        &self,
        queue_arn: Option<&str>,
        sent: Option<std::time::SystemTime>,
        deadline: &Deadline,
    ) -> bool {
        let until_answer = deadline
            .hard_stop()
            .saturating_duration_since(tokio::time::Instant::now());
        let now = std::time::SystemTime::from(crate::clock::now()) + until_answer;
        if crate::mutants::is_on(crate::mutants::Mutant::RetentionIgnored) {
            return false;
        }
        match (self.queue_timing(queue_arn), sent) {
            (Some(timing), Some(sent)) => {
                crate::redelivery::retry_room(sent, &timing, now).is_none()
            }
            _ => false,
        }
    }

    /// Whether this delivery is the last one SQS will make before its redrive policy moves
    /// the message (less the configured margin).
    fn receive_budget_spent(&self, receive_count: u32) -> bool {
        self.config.max_receive_count.is_some_and(|max| {
            receive_count >= max.saturating_sub(self.config.receive_budget_margin).max(1)
        })
    }
}

/// A record's `SentTimestamp` attribute (epoch milliseconds) as a time; `None` when absent
/// or out of range.
fn sent_time(attribute: Option<&str>) -> Option<std::time::SystemTime> {
    let millis = attribute?.parse::<u64>().ok()?;
    std::time::UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

/// A processor's future behind a pointer: one allocation per attempt, so that the engine's
/// own future does not nest the handler's (an AWS SDK call nests deeply) and a handler
/// crate compiles without raising its `recursion_limit`.
fn boxed<'a, T>(
    call: impl Future<Output = Result<T, ProcessError>> + Send + 'a,
) -> futures::future::BoxFuture<'a, Result<T, ProcessError>> {
    Box::pin(call)
}

/// Runs one processor call so that a panic in it fails this record, not the process: the
/// panic becomes an error of class `unknown` (not retried unless configured, so the record
/// is dead-lettered with the panic's message) instead of unwinding through the batch.
pub async fn guard_panics<T>(
    call: impl Future<Output = Result<T, ProcessError>>,
) -> Result<T, ProcessError> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(ProcessError::new(
            ErrorClass::Unknown,
            format!("the processor panicked: {}", panic_message(&*panic)),
        )
        .with_step("panic")),
    }
}

/// The text of a panic's payload (`panic!` with a message gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// The name of a disposition on log lines.
fn outcome_name(disposition: &Disposition) -> &'static str {
    match disposition {
        Disposition::Done => "done",
        Disposition::Skipped { .. } => "skipped",
        Disposition::RetryLater { .. } => "retry_later",
        Disposition::DeadLettered { .. } => "dead_lettered",
        Disposition::DeadLetterFailed { .. } => "dead_letter_failed",
        Disposition::NotStarted { .. } => "not_started",
    }
}

/// A failure found before the processor ran (bad body, unfetchable payload).
fn immediate_failure(error: ProcessError) -> AttemptFailure {
    AttemptFailure {
        attempt: 1,
        started_at: crate::clock::now(),
        duration: std::time::Duration::ZERO,
        error,
    }
}

fn not_started(
    message_id: Text<'_>,
    msg: &SqsRecord<'_>,
    reason: NotStartedReason,
    parser: &ItemParser,
) -> RecordReport {
    // The item id is only for reports here; a cheap attribute lookup, no body parsing.
    let item_id = match &parser.id_source {
        crate::item::ItemIdSource::MessageAttribute(name) => msg
            .message_attributes
            .get(name)
            .and_then(|a| a.string_value.clone()),
        _ => None,
    }
    .unwrap_or_else(|| message_id.as_str().to_string());
    RecordReport {
        message_id: message_id.into_owned(),
        item_id,
        attempts: 0,
        disposition: Disposition::NotStarted { reason },
        processing_time: None,
        retry_after: None,
    }
}

/// A record that was not started, keyed by its message id.
fn not_started_report(message_id: String, reason: NotStartedReason) -> RecordReport {
    RecordReport {
        item_id: message_id.clone(),
        message_id,
        attempts: 0,
        disposition: Disposition::NotStarted { reason },
        processing_time: None,
        retry_after: None,
    }
}

fn dead_letter_report(
    candidate: &DeadLetterCandidate,
    attempts: u32,
    processing_time: Option<Duration>,
    result: Option<&Result<(), ProcessError>>,
) -> RecordReport {
    let item = &candidate.item;
    let class = candidate.error.class;
    let disposition = match result {
        Some(Ok(())) => {
            log_failure(item, &candidate.error, "dead-lettered");
            Disposition::DeadLettered {
                class,
                reason: candidate.reason,
            }
        }
        Some(Err(sink_error)) if crate::dead_letter::is_dead_lettering_elsewhere(sink_error) => {
            tracing::info!(
                message_id = %item.message_id,
                item_id = %item.item_id,
                "another delivery of this message is dead-lettering it; returned for retry"
            );
            Disposition::RetryLater { class }
        }
        Some(Err(sink_error)) => {
            tracing::error!(
                message_id = %item.message_id,
                item_id = %item.item_id,
                error_class = %class,
                sink_error = %sink_error,
                "dead-lettering failed; record returned to the queue"
            );
            Disposition::DeadLetterFailed {
                class,
                sink_error: sink_error.to_string(),
            }
        }
        None => {
            tracing::error!(
                message_id = %item.message_id,
                "dead-letter store returned no result for the record; returned to the queue"
            );
            Disposition::DeadLetterFailed {
                class,
                sink_error: "dead-letter store returned no result".to_string(),
            }
        }
    };
    RecordReport {
        message_id: item.message_id.clone(),
        item_id: item.item_id.clone(),
        attempts,
        disposition,
        processing_time,
        retry_after: candidate.error.retry_after,
    }
}

/// Logs a failed record with ids, class and signature; never the body (docs/ARCHITECTURE.md §1.9).
fn log_failure(item: &WorkItem, error: &ProcessError, outcome: &str) {
    if crate::mutants::is_on(crate::mutants::Mutant::ErrorsLoggedWhole) {
        tracing::warn!(item_id = %item.item_id, error = %error, "record failed: {outcome}");
        return;
    }
    match crate::context::fields_json() {
        None => tracing::warn!(
            message_id = %item.message_id,
            item_id = %item.item_id,
            receive_count = item.receive_count,
            body_bytes = item.body.len(),
            error_class = %error.class,
            error_signature = %error_signature(error.class, &error.message),
            error = %error.loggable(),
            "record failed: {outcome}"
        ),
        Some(fields) => tracing::warn!(
            message_id = %item.message_id,
            item_id = %item.item_id,
            receive_count = item.receive_count,
            body_bytes = item.body.len(),
            error_class = %error.class,
            error_signature = %error_signature(error.class, &error.message),
            error = %error.loggable(),
            handler_fields = %fields,
            "record failed: {outcome}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_prints_its_parts_for_a_log_or_a_failing_test() {
        let engine = BatchProcessor::new(
            crate::testing::ScriptedProcessor::new(),
            crate::testing::MemorySink::new(),
            BatchConfig::default(),
        );
        let printed = format!("{engine:?}");
        for part in [
            "BatchProcessor",
            "processor",
            "sink",
            "config",
            "resolver: false",
        ] {
            assert!(printed.contains(part), "{part} in {printed}");
        }
    }

    #[test]
    fn the_reported_records_are_those_going_back_to_the_queue() {
        let counts = BatchCounts {
            records: 15,
            done: 3,
            skipped: 2,
            retry_later: 1,
            dead_lettered: 2,
            dead_letter_failed: 3,
            not_started: 4,
            by_class: BTreeMap::new(),
        };
        assert_eq!(counts.reported(), 8);
    }

    /// A sink's answer that another delivery of the message is dead-lettering it returns
    /// the record for retry: read as a failure of the sink, the record was reported (and
    /// counted, and logged as an error) as a failed dead-lettering while its other
    /// delivery was sending the one DLQ message.
    #[test]
    fn a_record_another_delivery_is_dead_lettering_is_returned_for_retry_not_failed() {
        let candidate = DeadLetterCandidate {
            item: WorkItem::new("m-1", "{\"id\":\"a\"}"),
            error: ProcessError::new(ErrorClass::Throttled, "slow down"),
            failures: Vec::new(),
            reason: DeadLetterReason::ReceiveBudgetExhausted,
        };
        let elsewhere = Err(crate::dead_letter::dead_lettering_elsewhere());
        let report = dead_letter_report(&candidate, 3, None, Some(&elsewhere));
        assert_eq!(
            report.disposition,
            Disposition::RetryLater {
                class: ErrorClass::Throttled
            }
        );
        let failed = Err(ProcessError::new(ErrorClass::ServerError, "503"));
        let report = dead_letter_report(&candidate, 3, None, Some(&failed));
        assert!(
            matches!(
                report.disposition,
                Disposition::DeadLetterFailed {
                    class: ErrorClass::Throttled,
                    ..
                }
            ),
            "{report:?}"
        );
    }

    /// Answers a queue's timing; hides every record asked.
    struct Timing(crate::redelivery::QueueTiming);

    impl crate::redelivery::VisibilityPort for Timing {
        fn hide<'a>(
            &'a self,
            records: &'a [crate::redelivery::Hide],
        ) -> futures::future::BoxFuture<'a, Vec<Result<(), ProcessError>>> {
            Box::pin(async move { records.iter().map(|_| Ok(())).collect() })
        }

        fn queue_timing<'a>(
            &'a self,
            _queue_arn: &'a str,
        ) -> futures::future::BoxFuture<'a, Option<crate::redelivery::QueueTiming>> {
            let timing = self.0;
            Box::pin(async move { Some(timing) })
        }
    }

    /// What is logged, as text.
    #[derive(Clone, Default)]
    struct Logged(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Logged {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Logged {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// A failed record is logged with what finds it (message and item ids, receive count,
    /// class, signature) and what happened to it, never its body: the line is all an
    /// operator has of a record returned for retry.
    #[test]
    fn a_failed_record_is_logged_with_its_ids_class_and_signature_never_its_body() {
        let logged = Logged::default();
        let writer = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let item = WorkItem {
            item_id: "order-7".to_string(),
            receive_count: 3,
            ..WorkItem::new("m-1", "{\"card\":\"4111-secret\"}")
        };
        let error = ProcessError::new(ErrorClass::Throttled, "slow down");
        log_failure(&item, &error, "returned for retry");
        let text = logged.text();
        let signature = error_signature(ErrorClass::Throttled, "slow down");
        for part in [
            "WARN".to_string(),
            "record failed: returned for retry".to_string(),
            "message_id=m-1".to_string(),
            "item_id=order-7".to_string(),
            "receive_count=3".to_string(),
            format!("body_bytes={}", item.body.len()),
            format!("error_class={}", ErrorClass::Throttled),
            format!("error_signature={signature}"),
        ] {
            assert!(text.contains(&part), "{part} in {text}");
        }
        assert!(!text.contains("4111-secret"), "{text}");
    }

    /// The spacing of a queue's receives is warned of when it leaves the last delivery no
    /// visibility timeout inside the retention: the spacing and that timeout together
    /// outlast it, not the spacing less the timeout (which hid the warning from a queue
    /// whose failing messages are dead-lettered before their receives are spent).
    #[tokio::test]
    async fn a_spacing_that_leaves_the_last_delivery_no_room_in_the_retention_is_warned_of() {
        let policy = crate::redelivery::RedeliveryPolicy {
            base: Duration::from_secs(60),
            multiplier: 3,
            max: Duration::from_secs(3600),
        };
        // Five receives: 30 + 90 + 270 + 810 s of spacing at least; each delivery 600 s.
        assert_eq!(policy.least_span(5), Duration::from_secs(1_200));
        for (retention, warned) in [(1_500, true), (1_800, false)] {
            let logged = Logged::default();
            let writer = logged.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            let _guard = tracing::subscriber::set_default(subscriber);
            let timing = crate::redelivery::QueueTiming {
                retention: Duration::from_secs(retention),
                visibility_timeout: Duration::from_secs(600),
            };
            let config = BatchConfig {
                max_receive_count: Some(5),
                ..BatchConfig::default()
            };
            let engine = BatchProcessor::new(
                crate::testing::ScriptedProcessor::new(),
                crate::testing::MemorySink::new(),
                config,
            )
            .with_redelivery(policy, Arc::new(Timing(timing)));
            let event: SqsEvent = serde_json::from_value(serde_json::json!({"Records": [{
                "messageId": "m-1",
                "receiptHandle": "rh-1",
                "body": "{\"id\":\"a\"}",
                "attributes": {"ApproximateReceiveCount": "1"},
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
            }]}))
            .unwrap();
            engine
                .process_batch(
                    event,
                    Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
                    &InvocationInfo::default(),
                )
                .await
                .unwrap();
            let text = logged.text();
            assert_eq!(
                text.contains("outlasts its retention"),
                warned,
                "retention {retention} s: {text}"
            );
        }
    }
}
