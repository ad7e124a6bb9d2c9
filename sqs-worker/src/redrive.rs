//! The redrive engine: selects dead-lettered items and puts them back through the
//! pipeline, safely.
//!
//! - **Selection**: by item ids, or by status (default `dead`), error signature, error
//!   class and last-attempt time range; only `reprocess_eligible` items without
//!   `manual_review_required` unless `force`.
//! - **Modes**: `reprocess` runs each item through the worker's processor in place;
//!   `requeue` sends the original payload back to its source queue (S3 payloads inlined
//!   when they fit, re-pointed otherwise), batched.
//! - **Safety**: each item is leased (`dead → redriving`, conditional, with expiry) before
//!   anything happens, so concurrent redrives never process an item twice; success marks
//!   it `resolved` (kept for audit until TTL) and deletes its DLQ message (whichever of
//!   two concurrent runs holds it); failure appends to its history and returns it to
//!   `dead`.
//! - **Long runs**: a time budget and `max_items` stop a run between chunks with a
//!   continuation token; the next run resumes after the last item handled.
//! - **Nothing invisible**: each run first sweeps the DLQ and creates records for messages
//!   the queue's redrive policy moved without one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::dead_letter::{
    DeadLetteredItem, FailureDetail, InvocationInfo, ItemStatus, PayloadLocation,
};
use crate::error::{ErrorClass, ProcessError};
use crate::item::{ItemParser, WorkItem};
use crate::processor::Processor;
use crate::retry::{run_with_retry, Deadline, RetryPolicy};
use crate::store::payload::{self, S3Pointer};
use crate::store::query::{PageToken, RecordFilter};
use crate::store::sweep::{HeldMessage, SweepOptions};
use crate::store::DeadLetterStore;

/// How items are put back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum RedriveMode {
    /// Run the processor on the item here and now.
    #[default]
    Reprocess,
    /// Send the original payload back to the source queue.
    Requeue,
}

/// A redrive request: what the redrive function receives and `dlq redrive` builds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedriveRequest {
    /// Exactly these items (other selectors then only filter).
    pub item_ids: Vec<String>,
    /// Only items with this error signature.
    pub error_signature: Option<String>,
    /// Only items of this error class.
    pub error_class: Option<ErrorClass>,
    /// Last attempt at or after: RFC 3339 or a duration ago (`24h`).
    pub since: Option<String>,
    /// Last attempt at or before: RFC 3339 or a duration ago.
    pub until: Option<String>,
    /// Status to select (default `dead`).
    pub status: Option<ItemStatus>,
    /// Include items that are not reprocess-eligible or need manual review.
    pub force: bool,
    /// How items are put back.
    pub mode: RedriveMode,
    /// Report what would happen; change nothing.
    pub dry_run: bool,
    /// Stop after this many items (a continuation token resumes).
    pub max_items: Option<usize>,
    /// Items in flight at once (default 4, at most 64).
    pub parallelism: Option<usize>,
    /// Items started per second at most.
    pub rate: Option<f64>,
    /// Stop starting items after this many seconds (default 600), with a continuation token.
    pub time_budget_secs: Option<u64>,
    /// Resume a previous run.
    pub continuation_token: Option<String>,
}

/// What happened to one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemOutcomeKind {
    /// Reprocessed; record resolved.
    Resolved,
    /// Sent back to the source queue; the record is `requeued` until the worker finishes
    /// the message.
    Requeued,
    /// Reprocessing failed again; history extended, still dead.
    FailedAgain,
    /// Not eligible (and no `force`).
    SkippedIneligible,
    /// Another run holds its lease.
    LeasedElsewhere,
    /// No record with that id.
    NotFound,
    /// Dry run: would be redriven.
    WouldRedrive,
    /// The store or queue failed; the item is unchanged (lease released).
    Error,
}

/// One item's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemOutcome {
    /// The item.
    pub item_id: String,
    /// What happened.
    pub outcome: ItemOutcomeKind,
    /// Why, for failures and errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The result of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveReport {
    /// This run's id (the lease owner).
    pub run_id: String,
    /// Mode used.
    pub mode: RedriveMode,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Items selected (every outcome below counts one).
    pub selected: usize,
    /// Resolved.
    pub succeeded: usize,
    /// Sent back to the source queue (record `requeued`).
    #[serde(default)]
    pub requeued: usize,
    /// Failed again.
    pub failed_again: usize,
    /// Skipped as not eligible.
    pub skipped_ineligible: usize,
    /// Held by another run.
    pub leased_elsewhere: usize,
    /// Unknown item ids.
    pub not_found: usize,
    /// Store or queue errors.
    pub errors: usize,
    /// Records created for DLQ messages that had none.
    pub adopted_from_dlq: usize,
    /// DLQ messages deleted (of resolved items).
    pub dlq_messages_deleted: usize,
    /// Per item: every item's outcome up to the engine's `report_items` (1,000 by default,
    /// so the report fits Lambda's 6 MB response however many items a run touched); the
    /// counts above are always complete.
    pub items: Vec<ItemOutcome>,
    /// Outcomes counted above but left out of `items`.
    #[serde(default)]
    pub items_omitted: usize,
    /// Set when the run stopped early: pass it back to resume.
    pub continuation_token: Option<String>,
}

impl RedriveReport {
    fn add(&mut self, outcome: ItemOutcome, sample: usize) {
        self.selected += 1;
        match outcome.outcome {
            ItemOutcomeKind::Resolved => self.succeeded += 1,
            ItemOutcomeKind::Requeued => self.requeued += 1,
            ItemOutcomeKind::FailedAgain => self.failed_again += 1,
            ItemOutcomeKind::SkippedIneligible => self.skipped_ineligible += 1,
            ItemOutcomeKind::LeasedElsewhere => self.leased_elsewhere += 1,
            ItemOutcomeKind::NotFound => self.not_found += 1,
            ItemOutcomeKind::Error => self.errors += 1,
            ItemOutcomeKind::WouldRedrive => {}
        }
        self.list(outcome, sample);
    }

    /// Lists an outcome in the bounded sample (or counts it as omitted).
    fn list(&mut self, outcome: ItemOutcome, sample: usize) {
        if self.items.len() < sample {
            self.items.push(outcome);
        } else {
            self.items_omitted += 1;
        }
    }

    /// Whether anything failed (failed again, errors, unknown ids).
    pub fn is_partial_failure(&self) -> bool {
        self.failed_again + self.errors + self.not_found > 0
    }
}

/// Why a run could not start or continue.
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    /// The request is invalid; nothing was changed.
    #[error("invalid redrive request: {0}")]
    InvalidRequest(String),
    /// The store failed outside any one item.
    #[error("redrive failed: {0}")]
    Store(ProcessError),
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Continuation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next_index: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    after: Option<String>,
    /// Which of the selection's queries the run was in (see [`Plan::filters`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    phase: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Continuation {
    fn encode(&self) -> String {
        aws_smithy_types::base64::encode(serde_json::to_string(self).unwrap_or_default().as_bytes())
    }

    fn decode(token: &str) -> Result<Continuation, RedriveError> {
        let bad =
            || RedriveError::InvalidRequest(format!("continuation token {token:?} is not valid"));
        let bytes = aws_smithy_types::base64::decode(token).map_err(|_| bad())?;
        serde_json::from_slice(&bytes).map_err(|_| bad())
    }
}

/// Most seconds a run may be given (a day): a larger budget is a mistake, and would overflow
/// the clock somewhere.
pub const MAX_TIME_BUDGET_SECS: u64 = 86_400;
/// Slowest and fastest pacing accepted, in items per second.
pub const RATE_RANGE: std::ops::RangeInclusive<f64> = 0.001..=10_000.0;

/// A validated request.
struct Plan {
    /// The queries that select records, in order. By default (status `dead`) a second one
    /// takes back items whose redrive died holding its lease (`redriving`, lease expired).
    filters: Vec<RecordFilter>,
    ids: Vec<String>,
    parallelism: usize,
    interval: Option<Duration>,
    budget: Duration,
    continuation: Continuation,
}

impl Plan {
    /// Whether a record fetched by id is one this selection takes (eligibility aside:
    /// [`RedriveEngine`] reports an ineligible item as skipped, with the reason).
    fn selects(&self, record: &DeadLetteredItem) -> bool {
        self.filters.iter().any(|f| {
            RecordFilter {
                eligible_only: false,
                ..f.clone()
            }
            .matches(record)
        })
    }
}

impl RedriveRequest {
    /// Parses a request from JSON, with a clear error for unknown fields or bad values.
    pub fn from_json(text: &str) -> Result<RedriveRequest, RedriveError> {
        let invalid = |e: serde_json::Error| RedriveError::InvalidRequest(e.to_string());
        let value: serde_json::Value = serde_json::from_str(text).map_err(invalid)?;
        // serde would also fill the fields from an array, by position.
        if !value.is_object() {
            return Err(RedriveError::InvalidRequest(
                "expected a JSON object, e.g. {\"mode\":\"reprocess\",\"dry_run\":true}"
                    .to_string(),
            ));
        }
        serde_json::from_value(value).map_err(invalid)
    }

    fn plan(&self) -> Result<Plan, RedriveError> {
        let invalid = |m: String| RedriveError::InvalidRequest(m);
        let now = chrono::Utc::now();
        let since = self
            .since
            .as_deref()
            .map(|t| crate::duration::parse_time(t, now))
            .transpose()
            .map_err(|e| invalid(format!("since: {e}")))?;
        let until = self
            .until
            .as_deref()
            .map(|t| crate::duration::parse_time(t, now))
            .transpose()
            .map_err(|e| invalid(format!("until: {e}")))?;
        if let (Some(s), Some(u)) = (since, until) {
            if s > u {
                return Err(invalid("since is after until".to_string()));
            }
        }
        let parallelism = self.parallelism.unwrap_or(4);
        if !(1..=64).contains(&parallelism) {
            return Err(invalid(format!(
                "parallelism {parallelism} is out of range 1-64"
            )));
        }
        let interval = match self.rate {
            Some(rate) if RATE_RANGE.contains(&rate) => Some(Duration::from_secs_f64(1.0 / rate)),
            Some(rate) => {
                return Err(invalid(format!(
                    "rate {rate} is out of range: expected {} to {} items per second",
                    RATE_RANGE.start(),
                    RATE_RANGE.end()
                )))
            }
            None => None,
        };
        if self.max_items == Some(0) {
            return Err(invalid("max_items must be at least 1".to_string()));
        }
        let budget_secs = self.time_budget_secs.unwrap_or(600);
        if !(1..=MAX_TIME_BUDGET_SECS).contains(&budget_secs) {
            return Err(invalid(format!(
                "time_budget_secs {budget_secs} is out of range: expected 1 to {MAX_TIME_BUDGET_SECS} (a day)"
            )));
        }
        let budget = Duration::from_secs(budget_secs);
        if self.item_ids.iter().any(|id| id.is_empty()) {
            return Err(invalid("item_ids must not contain empty ids".to_string()));
        }
        let continuation = self
            .continuation_token
            .as_deref()
            .map(Continuation::decode)
            .transpose()?
            .unwrap_or_default();
        let base = RecordFilter {
            status: Some(self.status.unwrap_or(ItemStatus::Dead)),
            signature: self.error_signature.clone(),
            class: self.error_class,
            since,
            until,
            // Ineligible records are not even read unless forced: counted against
            // `max_items`, newer validation failures would starve older eligible items.
            eligible_only: !self.force,
            lease_expired_before: None,
        };
        let mut filters = vec![base.clone()];
        if self.status.is_none() {
            filters.push(RecordFilter {
                status: Some(ItemStatus::Redriving),
                lease_expired_before: Some(now.timestamp()),
                ..base
            });
        }
        Ok(Plan {
            filters,
            // Each id once: a repeat would be leased twice in one transaction, which
            // DynamoDB refuses for the whole chunk.
            ids: {
                let mut seen = std::collections::HashSet::new();
                self.item_ids
                    .iter()
                    .filter(|id| seen.insert(id.as_str()))
                    .cloned()
                    .collect()
            },
            parallelism,
            interval,
            budget,
            continuation,
        })
    }
}

/// Settings of the engine itself (not of one run).
#[derive(Debug, Clone)]
pub struct RedriveSettings {
    /// Retries when reprocessing.
    pub retry: RetryPolicy,
    /// How item ids are read from DLQ messages without our attribute.
    pub parser: ItemParser,
    /// Requeue target overriding the queue named in each record.
    pub source_queue_url: Option<String>,
    /// Keep S3 payload objects of resolved items (default: delete them).
    pub keep_payloads: bool,
    /// How long a lease lasts if its run dies.
    pub lease_ttl: Duration,
    /// Most item outcomes a report lists (the counts are always complete): the redrive
    /// function's answer must fit Lambda's 6 MB response; the CLI lists them all.
    pub report_items: usize,
}

impl Default for RedriveSettings {
    fn default() -> Self {
        RedriveSettings {
            retry: RetryPolicy::default(),
            parser: ItemParser::default(),
            source_queue_url: None,
            keep_payloads: false,
            lease_ttl: Duration::from_secs(900),
            report_items: 1000,
        }
    }
}

/// How long a run waits at its end for another run to finish redriving items whose DLQ
/// messages this run holds (within [`SETTLE_RESERVE`]).
const SETTLE_WAIT: Duration = Duration::from_secs(15);

/// Time kept at the end of a run with a deadline for settling the DLQ messages.
pub const SETTLE_RESERVE: Duration = Duration::from_secs(20);

/// Time kept after the items' cut-off for writing their outcomes (resolved, failed again).
pub const OUTCOME_WRITE_SLICE: Duration = Duration::from_secs(5);

/// Without a deadline (the CLI), how long items started within the budget may run on.
pub const ITEM_GRACE: Duration = Duration::from_secs(60);

/// The clock of one run: when it stops starting items, when running items are cut, when
/// settling must be over; and the items it resolved (its DLQ messages are settled by them).
struct RunContext {
    run_id: String,
    /// No item starts after this.
    stop_at: Instant,
    /// Attempts are cut at its cut-off; outcome writes end at its hard stop.
    items: Deadline,
    /// Settling the DLQ messages ends here.
    settle_by: Instant,
    resolved: Mutex<HashSet<String>>,
}

impl RunContext {
    fn new(started: Instant, budget: Duration, deadline: Option<Instant>) -> RunContext {
        let far = |d: Duration| started.checked_add(d).unwrap_or(started);
        let (items_end, settle_by) = match deadline {
            Some(deadline) => {
                let settle_from = deadline.checked_sub(SETTLE_RESERVE).unwrap_or(started);
                (settle_from, deadline)
            }
            None => {
                let items_end = far(budget + ITEM_GRACE);
                (items_end, items_end + SETTLE_RESERVE)
            }
        };
        let items = Deadline::new(items_end, OUTCOME_WRITE_SLICE);
        RunContext {
            run_id: format!("redrive-{:016x}", fastrand::u64(..)),
            stop_at: far(budget).min(items.cutoff()),
            items,
            settle_by,
            resolved: Mutex::new(HashSet::new()),
        }
    }

    fn note_resolved(&self, item_id: &str) {
        if let Ok(mut resolved) = self.resolved.lock() {
            resolved.insert(item_id.to_string());
        }
    }

    fn resolved_ids(&self) -> HashSet<String> {
        self.resolved.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// How long the end-of-run sweep holds the messages it receives before they are settled.
const FINAL_SWEEP_HOLD: Duration = Duration::from_secs(60);

/// Largest body requeued inline; larger S3 payloads are sent as Extended Client pointers.
const INLINE_REQUEUE_MAX: u64 = 262_144;

/// Runs redrives.
pub struct RedriveEngine<P> {
    store: DeadLetterStore,
    processor: Option<P>,
    settings: RedriveSettings,
    queue_urls: Mutex<HashMap<String, String>>,
}

impl<P: Processor> RedriveEngine<P> {
    /// An engine; `processor` is needed for `reprocess` mode only.
    pub fn new(store: DeadLetterStore, processor: Option<P>, settings: RedriveSettings) -> Self {
        RedriveEngine {
            store,
            processor,
            settings,
            queue_urls: Mutex::new(HashMap::new()),
        }
    }

    /// The store.
    pub fn store(&self) -> &DeadLetterStore {
        &self.store
    }

    /// The engine's settings, to adjust after building it.
    pub fn settings_mut(&mut self) -> &mut RedriveSettings {
        &mut self.settings
    }

    /// Runs one redrive. `on_item` is called after each item (for progress display).
    pub async fn run(
        &self,
        request: &RedriveRequest,
        on_item: &(dyn Fn(&ItemOutcome) + Send + Sync),
    ) -> Result<RedriveReport, RedriveError> {
        self.run_until(request, None, on_item).await
    }

    /// Runs one redrive that must be over by `deadline` (the redrive function passes its
    /// invocation's deadline, less the time to answer). The run stops starting items at
    /// the earlier of its time budget and the deadline less [`SETTLE_RESERVE`] and
    /// [`OUTCOME_WRITE_SLICE`]; attempts still running there are cut (the item fails again,
    /// as a timeout); the outcome writes get the next slice, and settling the DLQ messages
    /// the last one. Without a deadline (the CLI) items in flight may finish for up to
    /// [`ITEM_GRACE`] after the budget.
    pub async fn run_until(
        &self,
        request: &RedriveRequest,
        deadline: Option<Instant>,
        on_item: &(dyn Fn(&ItemOutcome) + Send + Sync),
    ) -> Result<RedriveReport, RedriveError> {
        let plan = request.plan()?;
        if request.mode == RedriveMode::Reprocess && self.processor.is_none() && !request.dry_run {
            return Err(RedriveError::InvalidRequest(
                "mode reprocess needs the processor's configuration (WORKER_DOWNSTREAM_URL); use mode requeue, \
                 --via-function <the redrive function>, or configure it"
                    .into(),
            ));
        }
        let started = Instant::now();
        let run = RunContext::new(started, plan.budget, deadline);
        let mut report = RedriveReport {
            run_id: run.run_id.clone(),
            mode: request.mode,
            dry_run: request.dry_run,
            ..RedriveReport::default()
        };
        // Hold the DLQ messages for the run (plus a margin), adopting unrecorded ones.
        let mut held = HashMap::new();
        if !request.dry_run {
            let hold = run.settle_by.saturating_duration_since(started) + Duration::from_secs(60);
            let sweep = self
                .store
                .sweep_dlq(
                    hold,
                    &SweepOptions {
                        adopt: true,
                        delete_items: HashSet::new(),
                        parser: self.settings.parser.clone(),
                        until: Some(run.stop_at),
                    },
                )
                .await
                .map_err(RedriveError::Store)?;
            report.adopted_from_dlq = sweep.adopted;
            report.dlq_messages_deleted = sweep.deleted;
            for (item_id, error) in sweep.errors {
                // A DLQ message the sweep could not handle: an error of the run, not a
                // selected item.
                report.errors += 1;
                report.list(
                    ItemOutcome {
                        item_id,
                        outcome: ItemOutcomeKind::Error,
                        detail: Some(error),
                    },
                    self.settings.report_items,
                );
            }
            held = sweep.held;
        }
        let result = self
            .select_and_redrive(request, &plan, &run, &mut report, on_item)
            .await;
        // Settle the DLQ messages, even on error: delete those of what was resolved, give the
        // rest back.
        report.dlq_messages_deleted += self
            .settle_dlq_messages(held, &run)
            .await
            .map_err(RedriveError::Store)?;
        result?;
        Ok(report)
    }

    /// Deletes the DLQ messages of resolved items and releases the rest. With two runs at
    /// once, the run that resolves an item may not hold its messages (the other run's sweep
    /// received them), so: messages this run holds for items it did not resolve are settled
    /// by the item's status once any redrive in progress on it ends; and if this run
    /// resolved items whose messages it does not hold, it sweeps the DLQ once more, while
    /// its own messages are still held, to delete those the other run has given back.
    async fn settle_dlq_messages(
        &self,
        mut held: HashMap<String, Vec<HeldMessage>>,
        run: &RunContext,
    ) -> Result<usize, ProcessError> {
        let resolved = run.resolved_ids();
        let resolved_unheld = resolved.iter().any(|id| !held.contains_key(id));
        let mut deleted = 0;
        if resolved_unheld && Instant::now() < run.settle_by {
            let sweep = self
                .store
                .sweep_dlq(
                    FINAL_SWEEP_HOLD,
                    &SweepOptions {
                        adopt: false,
                        delete_items: HashSet::new(),
                        parser: self.settings.parser.clone(),
                        until: Some(run.settle_by),
                    },
                )
                .await?;
            deleted += sweep.deleted;
            for (item_id, messages) in sweep.held {
                held.entry(item_id).or_default().extend(messages);
            }
        }
        let wait = SETTLE_WAIT.min(run.settle_by.saturating_duration_since(Instant::now()));
        Ok(deleted + self.store.settle_held(held, wait).await?)
    }

    async fn select_and_redrive(
        &self,
        request: &RedriveRequest,
        plan: &Plan,
        run: &RunContext,
        report: &mut RedriveReport,
        on_item: &(dyn Fn(&ItemOutcome) + Send + Sync),
    ) -> Result<(), RedriveError> {
        let chunk_size = match request.mode {
            RedriveMode::Reprocess => plan.parallelism,
            RedriveMode::Requeue => 10 * plan.parallelism,
        };
        let limit = request.max_items.unwrap_or(usize::MAX);
        // Items taken (leased, or would be in a dry run): what `max_items` counts.
        let mut taken = 0usize;
        let out_of_time = || Instant::now() >= run.stop_at;
        let record = |outcome: ItemOutcome, report: &mut RedriveReport| {
            on_item(&outcome);
            if outcome.outcome == ItemOutcomeKind::Resolved {
                run.note_resolved(&outcome.item_id);
            }
            report.add(outcome, self.settings.report_items);
        };
        if !plan.ids.is_empty() {
            let start = plan.continuation.next_index.unwrap_or(0);
            let mut index = start;
            for chunk in plan.ids[start.min(plan.ids.len())..].chunks(chunk_size) {
                if taken >= limit || out_of_time() {
                    report.continuation_token = Some(
                        Continuation {
                            next_index: Some(index),
                            ..Continuation::default()
                        }
                        .encode(),
                    );
                    return Ok(());
                }
                let chunk = &chunk[..chunk.len().min(limit - taken)];
                let mut records = Vec::new();
                for id in chunk {
                    let found = match self.store.get(id).await {
                        Ok(found) => found,
                        Err(e) => {
                            // One unreadable record (or an id DynamoDB refuses) is this
                            // item's error, not the run's.
                            record(
                                ItemOutcome {
                                    item_id: id.clone(),
                                    outcome: ItemOutcomeKind::Error,
                                    detail: Some(e.to_string()),
                                },
                                report,
                            );
                            continue;
                        }
                    };
                    match found {
                        Some(r) if plan.selects(&r) => records.push(r),
                        Some(r) => record(
                            ItemOutcome {
                                item_id: id.clone(),
                                outcome: ItemOutcomeKind::SkippedIneligible,
                                detail: Some(format!("status is {}", r.status.as_str())),
                            },
                            report,
                        ),
                        None => record(
                            ItemOutcome {
                                item_id: id.clone(),
                                outcome: ItemOutcomeKind::NotFound,
                                detail: Some("no record with this item id".into()),
                            },
                            report,
                        ),
                    }
                }
                for outcome in self.redrive_chunk(&records, request, plan, run).await {
                    if outcome.outcome != ItemOutcomeKind::SkippedIneligible {
                        taken += 1;
                    }
                    record(outcome, report);
                }
                index += chunk.len();
            }
            return Ok(());
        }
        let first_phase = plan.continuation.phase.min(plan.filters.len());
        let mut token = plan.continuation.after.clone().map(PageToken);
        let mut seen = HashSet::new();
        for (phase, filter) in plan.filters.iter().enumerate().skip(first_phase) {
            loop {
                let page = self
                    .store
                    .query_page(filter, 100, token.as_ref())
                    .await
                    .map_err(RedriveError::Store)?;
                for bad in &page.unreadable {
                    record(
                        ItemOutcome {
                            item_id: bad.item_id.clone(),
                            outcome: ItemOutcomeKind::Error,
                            detail: Some(bad.error.clone()),
                        },
                        report,
                    );
                }
                let fresh: Vec<DeadLetteredItem> = page
                    .records
                    .into_iter()
                    .filter(|r| seen.insert(r.item_id.clone()))
                    .collect();
                for chunk in fresh.chunks(chunk_size) {
                    if taken >= limit || out_of_time() {
                        report.continuation_token = Some(
                            Continuation {
                                next_index: None,
                                after: token.as_ref().map(|t| t.0.clone()),
                                phase,
                            }
                            .encode(),
                        );
                        return Ok(());
                    }
                    let chunk = &chunk[..chunk.len().min(limit - taken)];
                    for outcome in self.redrive_chunk(chunk, request, plan, run).await {
                        if outcome.outcome != ItemOutcomeKind::SkippedIneligible {
                            taken += 1;
                        }
                        record(outcome, report);
                    }
                    if let Some(last) = chunk.last() {
                        token = Some(PageToken::after(last, filter));
                    }
                }
                match page.next {
                    Some(next) => token = Some(next),
                    None => break,
                }
            }
            token = None;
        }
        Ok(())
    }

    /// Redrives a chunk of selected records, honouring eligibility, rate and parallelism.
    async fn redrive_chunk(
        &self,
        records: &[DeadLetteredItem],
        request: &RedriveRequest,
        plan: &Plan,
        run: &RunContext,
    ) -> Vec<ItemOutcome> {
        let mut outcomes = Vec::new();
        let mut eligible = Vec::new();
        for record in records {
            let ok = request.force || (record.reprocess_eligible && !record.manual_review_required);
            if !ok {
                outcomes.push(ItemOutcome {
                    item_id: record.item_id.clone(),
                    outcome: ItemOutcomeKind::SkippedIneligible,
                    detail: Some(if record.manual_review_required {
                        "manual review required (use force to override)".into()
                    } else {
                        format!(
                            "{} errors are not reprocess-eligible (use force to override)",
                            record.error_class
                        )
                    }),
                });
            } else if request.dry_run {
                outcomes.push(ItemOutcome {
                    item_id: record.item_id.clone(),
                    outcome: ItemOutcomeKind::WouldRedrive,
                    detail: None,
                });
            } else {
                eligible.push(record);
            }
        }
        if eligible.is_empty() {
            return outcomes;
        }
        if let Some(interval) = plan.interval {
            // Pace starts: a chunk of n items takes at least n intervals.
            let pace = interval.saturating_mul(u32::try_from(eligible.len()).unwrap_or(u32::MAX));
            let next = Instant::now() + pace;
            outcomes.extend(self.redrive_eligible(&eligible, request, plan, run).await);
            tokio::time::sleep_until(next).await;
        } else {
            outcomes.extend(self.redrive_eligible(&eligible, request, plan, run).await);
        }
        outcomes
    }

    async fn redrive_eligible(
        &self,
        records: &[&DeadLetteredItem],
        request: &RedriveRequest,
        plan: &Plan,
        run: &RunContext,
    ) -> Vec<ItemOutcome> {
        let run_id = run.run_id.as_str();
        match request.mode {
            RedriveMode::Requeue => self.requeue(records, run_id).await,
            RedriveMode::Reprocess => {
                let work: Vec<_> = records
                    .iter()
                    .map(|r| self.reprocess_bounded(r, run))
                    .collect();
                futures::stream::iter(work)
                    .buffered(plan.parallelism)
                    .collect()
                    .await
            }
        }
    }

    /// Reprocesses one item within the run's deadline: its attempts are cut at the
    /// deadline's cut-off and its outcome writes at the hard stop. A cut write leaves the
    /// item leased; the lease expires and a later run takes the item back.
    async fn reprocess_bounded(&self, record: &DeadLetteredItem, run: &RunContext) -> ItemOutcome {
        let work = self.reprocess_one(record, &run.run_id, run.items);
        match tokio::time::timeout_at(run.items.hard_stop(), work).await {
            Ok(outcome) => outcome,
            Err(_) => ItemOutcome {
                item_id: record.item_id.clone(),
                outcome: ItemOutcomeKind::Error,
                detail: Some(format!(
                    "cut at the run's deadline; a later run takes the item back when its lease expires (in {} s)",
                    self.settings.lease_ttl.as_secs()
                )),
            },
        }
    }

    async fn reprocess_one(
        &self,
        record: &DeadLetteredItem,
        run_id: &str,
        deadline: Deadline,
    ) -> ItemOutcome {
        let outcome = |kind, detail: Option<String>| ItemOutcome {
            item_id: record.item_id.clone(),
            outcome: kind,
            detail,
        };
        let Some(processor) = &self.processor else {
            return outcome(
                ItemOutcomeKind::Error,
                Some("no processor configured".into()),
            );
        };
        match self
            .store
            .acquire_lease(&record.item_id, run_id, self.settings.lease_ttl)
            .await
        {
            Ok(true) => {}
            Ok(false) => return outcome(ItemOutcomeKind::LeasedElsewhere, None),
            Err(e) => return outcome(ItemOutcomeKind::Error, Some(e.to_string())),
        }
        let item = match self.load_body(record).await {
            Ok(body) => work_item(record, body),
            Err(error) => {
                let item = work_item(record, String::new());
                return self
                    .fail(record, run_id, &item, vec![immediate(error)])
                    .await;
            }
        };
        let run = run_with_retry(&self.settings.retry, &deadline, |_| {
            crate::batch::guard_panics(processor.process(&item))
        })
        .await;
        match run.result {
            Ok(_) => match self.store.resolve(record, run_id).await {
                Ok(()) => {
                    self.drop_payload(record).await;
                    outcome(ItemOutcomeKind::Resolved, None)
                }
                Err(e) => {
                    // Processed, but not marked resolved: give the item back (dead, no
                    // lease) so the next run can take it at once rather than after the
                    // lease expires. The downstream saw it; its idempotency key covers a
                    // second delivery.
                    let _ = self.store.release_lease(&record.item_id, run_id).await;
                    outcome(ItemOutcomeKind::Error, Some(e.to_string()))
                }
            },
            Err(_) => self.fail(record, run_id, &item, run.failures).await,
        }
    }

    async fn fail(
        &self,
        record: &DeadLetteredItem,
        run_id: &str,
        item: &WorkItem,
        failures: Vec<crate::retry::AttemptFailure>,
    ) -> ItemOutcome {
        let invocation = InvocationInfo {
            function_name: std::env::var("AWS_LAMBDA_FUNCTION_NAME").ok(),
            request_id: Some(run_id.to_string()),
            log_group: std::env::var("AWS_LAMBDA_LOG_GROUP_NAME").ok(),
            log_stream: std::env::var("AWS_LAMBDA_LOG_STREAM_NAME").ok(),
        };
        let details: Vec<FailureDetail> = failures
            .iter()
            .map(|f| {
                let mut d = FailureDetail::from_attempt(item, f, &invocation);
                d.attempt_id = format!("{run_id}:{}", f.attempt);
                d
            })
            .collect();
        let message = details.last().map(|d| d.error_message.clone());
        match self
            .store
            .record_redrive_failure(&record.item_id, run_id, &details)
            .await
        {
            Ok(()) => ItemOutcome {
                item_id: record.item_id.clone(),
                outcome: ItemOutcomeKind::FailedAgain,
                detail: message,
            },
            Err(e) => {
                let _ = self.store.release_lease(&record.item_id, run_id).await;
                ItemOutcome {
                    item_id: record.item_id.clone(),
                    outcome: ItemOutcomeKind::Error,
                    detail: Some(e.to_string()),
                }
            }
        }
    }

    /// The item's body: inline, or fetched from S3 and checked against its sha256.
    async fn load_body(&self, record: &DeadLetteredItem) -> Result<String, ProcessError> {
        match &record.payload.location {
            PayloadLocation::Inline { body } => Ok(body.clone()),
            PayloadLocation::S3 { bucket, key } => {
                let pointer = S3Pointer {
                    bucket: bucket.clone(),
                    key: key.clone(),
                };
                let (body, _) = payload::get_payload(&self.store.clients().s3, &pointer).await?;
                let sha = crate::hex::sha256_hex(body.as_bytes());
                if sha != record.payload.sha256 {
                    return Err(ProcessError::validation(format!(
                        "payload s3://{bucket}/{key} has sha256 {sha}, the record says {}",
                        record.payload.sha256
                    ))
                    .with_step("fetch-payload"));
                }
                Ok(body)
            }
        }
    }

    async fn drop_payload(&self, record: &DeadLetteredItem) {
        if self.settings.keep_payloads {
            return;
        }
        if let PayloadLocation::S3 { bucket, key } = &record.payload.location {
            if let Err(e) = self
                .store
                .clients()
                .s3
                .delete_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
            {
                tracing::warn!(item_id = %record.item_id, error = %ProcessError::from_sdk(&e), "could not delete the resolved item's payload");
            }
        }
    }

    async fn queue_url(&self, record: &DeadLetteredItem) -> Result<String, ProcessError> {
        if let Some(url) = &self.settings.source_queue_url {
            return Ok(url.clone());
        }
        let arn = record.source.queue_arn.clone().ok_or_else(|| {
            ProcessError::validation("the record names no source queue; set the source queue URL")
                .with_step("requeue")
        })?;
        if let Some(url) = self
            .queue_urls
            .lock()
            .ok()
            .and_then(|m| m.get(&arn).cloned())
        {
            return Ok(url);
        }
        let parts: Vec<&str> = arn.split(':').collect();
        let (Some(account), Some(name)) = (parts.get(4), parts.get(5)) else {
            return Err(
                ProcessError::validation(format!("{arn:?} is not an SQS queue ARN"))
                    .with_step("requeue"),
            );
        };
        let output = self
            .store
            .clients()
            .sqs
            .get_queue_url()
            .queue_name(*name)
            .queue_owner_aws_account_id(*account)
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("requeue"))?;
        let url = output.queue_url().unwrap_or_default().to_string();
        if let Ok(mut m) = self.queue_urls.lock() {
            m.insert(arn, url.clone());
        }
        Ok(url)
    }

    /// Requeues records: leases in transactions, sends in batches of 10, resolves in
    /// transactions.
    async fn requeue(&self, records: &[&DeadLetteredItem], run_id: &str) -> Vec<ItemOutcome> {
        let ids: Vec<String> = records.iter().map(|r| r.item_id.clone()).collect();
        let leases = self
            .store
            .acquire_leases(&ids, run_id, self.settings.lease_ttl)
            .await;
        let mut outcomes: Vec<Option<ItemOutcome>> = vec![None; records.len()];
        // (index, queue url, entry, size in bytes)
        let mut entries: Vec<(usize, String, SendMessageBatchRequestEntry, usize)> = Vec::new();
        for (i, (record, lease)) in records.iter().zip(leases).enumerate() {
            let fail = |kind, detail| {
                Some(ItemOutcome {
                    item_id: record.item_id.clone(),
                    outcome: kind,
                    detail,
                })
            };
            match lease {
                Ok(true) => {}
                Ok(false) => {
                    outcomes[i] = fail(ItemOutcomeKind::LeasedElsewhere, None);
                    continue;
                }
                Err(e) => {
                    outcomes[i] = fail(ItemOutcomeKind::Error, Some(e.to_string()));
                    continue;
                }
            }
            match self.requeue_entry(i, record, run_id).await {
                Ok((url, entry, size)) => entries.push((i, url, entry, size)),
                Err(e) => {
                    let _ = self.store.release_lease(&record.item_id, run_id).await;
                    outcomes[i] = fail(ItemOutcomeKind::Error, Some(e.to_string()));
                }
            }
        }
        let mut by_queue: HashMap<String, Vec<(usize, SendMessageBatchRequestEntry, usize)>> =
            HashMap::new();
        for (i, url, entry, size) in entries {
            by_queue.entry(url).or_default().push((i, entry, size));
        }
        // (index, id of the message now in the source queue)
        let mut sent: Vec<(usize, String)> = Vec::new();
        for (url, batch) in by_queue {
            // SendMessageBatch takes 10 entries and 1 MiB at most.
            for chunk in crate::store::dlq::batches_by_size(batch) {
                let result = self
                    .store
                    .clients()
                    .sqs
                    .send_message_batch()
                    .queue_url(&url)
                    .set_entries(Some(chunk.iter().map(|(_, e)| e.clone()).collect()))
                    .send()
                    .await;
                match result {
                    Ok(output) => {
                        let failed: HashMap<String, String> = output
                            .failed()
                            .iter()
                            .map(|f| {
                                (
                                    f.id().to_string(),
                                    format!("{} {}", f.code(), f.message().unwrap_or("")),
                                )
                            })
                            .collect();
                        let accepted: HashMap<&str, &str> = output
                            .successful()
                            .iter()
                            .map(|s| (s.id(), s.message_id()))
                            .collect();
                        for (i, _) in &chunk {
                            match (
                                failed.get(&i.to_string()),
                                accepted.get(i.to_string().as_str()),
                            ) {
                                (None, Some(message_id)) => {
                                    sent.push((*i, (*message_id).to_string()))
                                }
                                (reason, _) => {
                                    let _ = self
                                        .store
                                        .release_lease(&records[*i].item_id, run_id)
                                        .await;
                                    outcomes[*i] = Some(ItemOutcome {
                                        item_id: records[*i].item_id.clone(),
                                        outcome: ItemOutcomeKind::Error,
                                        detail: Some(format!(
                                            "source queue rejected the message: {}",
                                            reason.map_or("no result for it", String::as_str)
                                        )),
                                    });
                                }
                            }
                        }
                    }
                    Err(e) => {
                        let error = ProcessError::from_sdk(&e).with_step("requeue");
                        for (i, _) in &chunk {
                            let _ = self.store.release_lease(&records[*i].item_id, run_id).await;
                            outcomes[*i] = Some(ItemOutcome {
                                item_id: records[*i].item_id.clone(),
                                outcome: ItemOutcomeKind::Error,
                                detail: Some(error.to_string()),
                            });
                        }
                    }
                }
            }
        }
        // Requeued is not resolved: the record waits for the worker to finish the message.
        for (i, message_id) in sent {
            let record = records[i];
            outcomes[i] = Some(
                match self.store.mark_requeued(&record.item_id, run_id, &message_id).await {
                    Ok(()) => ItemOutcome {
                        item_id: record.item_id.clone(),
                        outcome: ItemOutcomeKind::Requeued,
                        detail: Some(format!("sent to the source queue as message {message_id}")),
                    },
                    Err(e) => ItemOutcome {
                        item_id: record.item_id.clone(),
                        outcome: ItemOutcomeKind::Error,
                        detail: Some(format!(
                            "requeued as message {message_id}, but the record could not be marked requeued \
                             (its lease expires and a later run may send it again): {e}"
                        )),
                    },
                },
            );
        }
        outcomes.into_iter().flatten().collect()
    }

    async fn requeue_entry(
        &self,
        index: usize,
        record: &DeadLetteredItem,
        run_id: &str,
    ) -> Result<(String, SendMessageBatchRequestEntry, usize), ProcessError> {
        let url = self.queue_url(record).await?;
        let body = match &record.payload.location {
            PayloadLocation::S3 { bucket, key }
                if record.payload.size_bytes > INLINE_REQUEUE_MAX =>
            {
                S3Pointer {
                    bucket: bucket.clone(),
                    key: key.clone(),
                }
                .to_body()
            }
            _ => self.load_body(record).await?,
        };
        let mut size = body.len();
        let mut builder = SendMessageBatchRequestEntry::builder()
            .id(index.to_string())
            .message_body(body);
        // SQS takes 10 attributes; ours below take three.
        let mut attributes = 0;
        for (name, value) in &record.source.message_attributes {
            // Our own attributes are set afresh below, never copied; a binary value that an
            // older record did not keep cannot be restored.
            if attributes == 7
                || crate::store::dlq::RESERVED_ATTRIBUTES.contains(&name.as_str())
                || !value.is_restorable()
            {
                continue;
            }
            let mut attr = MessageAttributeValue::builder()
                .data_type(&value.data_type)
                .set_string_value(value.string_value.clone());
            if let Some(binary) = &value.binary_value {
                match aws_smithy_types::base64::decode(binary) {
                    Ok(bytes) => {
                        attr = attr.binary_value(aws_sdk_sqs::primitives::Blob::new(bytes))
                    }
                    Err(_) => continue,
                }
            }
            if let Ok(attr) = attr.build() {
                size += name.len()
                    + value.data_type.len()
                    + value.string_value.as_ref().map_or(0, String::len)
                    + value.binary_value.as_ref().map_or(0, |b| b.len() * 3 / 4)
                    + 16;
                builder = builder.message_attributes(name, attr);
                attributes += 1;
            }
        }
        for (name, value) in [
            (
                crate::store::dlq::ITEM_ID_ATTRIBUTE,
                record.item_id.as_str(),
            ),
            (crate::dead_letter::REQUEUED_BY_ATTRIBUTE, run_id),
            (
                crate::store::dlq::PAYLOAD_SHA256_ATTRIBUTE,
                record.payload.sha256.as_str(),
            ),
        ] {
            size += name.len() + value.len() + 16;
            if let Ok(attr) = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
            {
                builder = builder.message_attributes(name, attr);
            }
        }
        if url.ends_with(".fifo") {
            builder = builder
                .message_group_id(crate::store::dlq::fifo_group_id(
                    record.source.message_group_id.as_deref(),
                    &record.item_id,
                ))
                .message_deduplication_id(crate::hex::sha256_hex(
                    format!("{}:{run_id}", record.item_id).as_bytes(),
                ));
        }
        let entry = builder
            .build()
            .map_err(|e| ProcessError::validation(e.to_string()).with_step("requeue"))?;
        Ok((url, entry, size))
    }
}

/// A dead-lettered item as a work item for reprocessing.
fn work_item(record: &DeadLetteredItem, body: String) -> WorkItem {
    WorkItem {
        message_id: record.source.message_id.clone(),
        item_id: record.item_id.clone(),
        body,
        receive_count: record.source.receive_count,
        sent_timestamp: record.source.sent_timestamp,
        message_group_id: record.source.message_group_id.clone(),
        event_source_arn: record.source.queue_arn.clone(),
        attributes: HashMap::new(),
        message_attributes: HashMap::new(),
    }
}

fn immediate(error: ProcessError) -> crate::retry::AttemptFailure {
    crate::retry::AttemptFailure {
        attempt: 1,
        started_at: chrono::Utc::now(),
        duration: Duration::ZERO,
        error,
    }
}

/// A shared no-op progress callback.
pub fn no_progress() -> Arc<dyn Fn(&ItemOutcome) + Send + Sync> {
    Arc::new(|_| {})
}
