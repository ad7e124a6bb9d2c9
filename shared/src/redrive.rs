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
use crate::store::sweep::SweepOptions;
use crate::store::DeadLetterStore;

/// How items are put back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    /// Reprocessed or requeued; record resolved.
    Resolved,
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
    /// Per item.
    pub items: Vec<ItemOutcome>,
    /// Set when the run stopped early: pass it back to resume.
    pub continuation_token: Option<String>,
}

impl RedriveReport {
    fn add(&mut self, outcome: ItemOutcome) {
        self.selected += 1;
        match outcome.outcome {
            ItemOutcomeKind::Resolved => self.succeeded += 1,
            ItemOutcomeKind::FailedAgain => self.failed_again += 1,
            ItemOutcomeKind::SkippedIneligible => self.skipped_ineligible += 1,
            ItemOutcomeKind::LeasedElsewhere => self.leased_elsewhere += 1,
            ItemOutcomeKind::NotFound => self.not_found += 1,
            ItemOutcomeKind::Error => self.errors += 1,
            ItemOutcomeKind::WouldRedrive => {}
        }
        self.items.push(outcome);
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

/// A validated request.
struct Plan {
    filter: RecordFilter,
    ids: Vec<String>,
    parallelism: usize,
    interval: Option<Duration>,
    budget: Duration,
    continuation: Continuation,
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
            Some(rate) if rate.is_finite() && rate > 0.0 => {
                Some(Duration::from_secs_f64(1.0 / rate))
            }
            Some(rate) => {
                return Err(invalid(format!(
                    "rate {rate} must be a positive number of items per second"
                )))
            }
            None => None,
        };
        if self.max_items == Some(0) {
            return Err(invalid("max_items must be at least 1".to_string()));
        }
        let budget = Duration::from_secs(self.time_budget_secs.unwrap_or(600));
        if budget.is_zero() {
            return Err(invalid("time_budget_secs must be at least 1".to_string()));
        }
        if self.item_ids.iter().any(|id| id.is_empty()) {
            return Err(invalid("item_ids must not contain empty ids".to_string()));
        }
        let continuation = self
            .continuation_token
            .as_deref()
            .map(Continuation::decode)
            .transpose()?
            .unwrap_or_default();
        Ok(Plan {
            filter: RecordFilter {
                status: Some(self.status.unwrap_or(ItemStatus::Dead)),
                signature: self.error_signature.clone(),
                class: self.error_class,
                since,
                until,
                eligible_only: false,
            },
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
}

impl Default for RedriveSettings {
    fn default() -> Self {
        RedriveSettings {
            retry: RetryPolicy::default(),
            parser: ItemParser::default(),
            source_queue_url: None,
            keep_payloads: false,
            lease_ttl: Duration::from_secs(900),
        }
    }
}

/// How long a run waits at its end for another run to finish redriving items whose DLQ
/// messages this run holds (well inside the redrive function's 30 s deadline reserve).
const SETTLE_WAIT: Duration = Duration::from_secs(15);

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

    /// Runs one redrive. `on_item` is called after each item (for progress display).
    pub async fn run(
        &self,
        request: &RedriveRequest,
        on_item: &(dyn Fn(&ItemOutcome) + Send + Sync),
    ) -> Result<RedriveReport, RedriveError> {
        let plan = request.plan()?;
        if request.mode == RedriveMode::Reprocess && self.processor.is_none() && !request.dry_run {
            return Err(RedriveError::InvalidRequest(
                "mode reprocess needs the processor's configuration (WORKER_DOWNSTREAM_URL); use mode requeue or configure it".into(),
            ));
        }
        let started = Instant::now();
        let stop_at = started + plan.budget;
        let run_id = format!("redrive-{:016x}", fastrand::u64(..));
        let mut report = RedriveReport {
            run_id: run_id.clone(),
            mode: request.mode,
            dry_run: request.dry_run,
            ..RedriveReport::default()
        };
        // Hold the DLQ messages for the run (plus a margin), adopting unrecorded ones.
        let mut held = HashMap::new();
        if !request.dry_run {
            let sweep = self
                .store
                .sweep_dlq(
                    plan.budget + Duration::from_secs(120),
                    &SweepOptions {
                        adopt: true,
                        delete_items: HashSet::new(),
                        parser: self.settings.parser.clone(),
                    },
                )
                .await
                .map_err(RedriveError::Store)?;
            report.adopted_from_dlq = sweep.adopted;
            report.dlq_messages_deleted = sweep.deleted;
            held = sweep.held;
        }
        let result = self
            .select_and_redrive(request, &plan, &run_id, stop_at, &mut report, on_item)
            .await;
        // Settle the DLQ messages, even on error: delete those of what was resolved, give the
        // rest back.
        report.dlq_messages_deleted += self
            .settle_dlq_messages(held, &report)
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
        mut held: HashMap<String, Vec<String>>,
        report: &RedriveReport,
    ) -> Result<usize, ProcessError> {
        let resolved: HashSet<&str> = report
            .items
            .iter()
            .filter(|o| o.outcome == ItemOutcomeKind::Resolved)
            .map(|o| o.item_id.as_str())
            .collect();
        let resolved_unheld = resolved.iter().any(|id| !held.contains_key(*id));
        let mut delete = Vec::new();
        held.retain(|item_id, receipts| {
            let mine = resolved.contains(item_id.as_str());
            if mine {
                delete.append(receipts);
            }
            !mine
        });
        let mut deleted = self.store.delete_dlq_messages(&delete).await?;
        if resolved_unheld {
            let sweep = self
                .store
                .sweep_dlq(
                    FINAL_SWEEP_HOLD,
                    &SweepOptions {
                        adopt: false,
                        delete_items: HashSet::new(),
                        parser: self.settings.parser.clone(),
                    },
                )
                .await?;
            deleted += sweep.deleted;
            for (item_id, receipts) in sweep.held {
                held.entry(item_id).or_default().extend(receipts);
            }
        }
        Ok(deleted + self.store.settle_held(held, SETTLE_WAIT).await?)
    }

    async fn select_and_redrive(
        &self,
        request: &RedriveRequest,
        plan: &Plan,
        run_id: &str,
        stop_at: Instant,
        report: &mut RedriveReport,
        on_item: &(dyn Fn(&ItemOutcome) + Send + Sync),
    ) -> Result<(), RedriveError> {
        let chunk_size = match request.mode {
            RedriveMode::Reprocess => plan.parallelism,
            RedriveMode::Requeue => 10 * plan.parallelism,
        };
        let limit = request.max_items.unwrap_or(usize::MAX);
        let mut handled = 0usize;
        let out_of_time = || Instant::now() >= stop_at;
        if !plan.ids.is_empty() {
            let start = plan.continuation.next_index.unwrap_or(0);
            let mut index = start;
            for chunk in plan.ids[start.min(plan.ids.len())..].chunks(chunk_size) {
                if handled >= limit || out_of_time() {
                    report.continuation_token = Some(
                        Continuation {
                            next_index: Some(index),
                            after: None,
                        }
                        .encode(),
                    );
                    return Ok(());
                }
                let chunk = &chunk[..chunk.len().min(limit - handled)];
                let mut records = Vec::new();
                for id in chunk {
                    match self.store.get(id).await.map_err(RedriveError::Store)? {
                        Some(r) if plan.filter.matches(&r) => records.push(r),
                        Some(r) => {
                            let outcome = ItemOutcome {
                                item_id: id.clone(),
                                outcome: ItemOutcomeKind::SkippedIneligible,
                                detail: Some(format!("status is {}", r.status.as_str())),
                            };
                            on_item(&outcome);
                            report.add(outcome);
                        }
                        None => {
                            let outcome = ItemOutcome {
                                item_id: id.clone(),
                                outcome: ItemOutcomeKind::NotFound,
                                detail: Some("no record with this item id".into()),
                            };
                            on_item(&outcome);
                            report.add(outcome);
                        }
                    }
                }
                for outcome in self
                    .redrive_chunk(&records, request, plan, run_id, stop_at)
                    .await
                {
                    on_item(&outcome);
                    report.add(outcome);
                }
                handled += chunk.len();
                index += chunk.len();
            }
            return Ok(());
        }
        let mut token = plan.continuation.after.clone().map(PageToken);
        let mut seen = HashSet::new();
        loop {
            let page = self
                .store
                .query_page(&plan.filter, 100, token.as_ref())
                .await
                .map_err(RedriveError::Store)?;
            let fresh: Vec<DeadLetteredItem> = page
                .records
                .into_iter()
                .filter(|r| seen.insert(r.item_id.clone()))
                .collect();
            for chunk in fresh.chunks(chunk_size) {
                if handled >= limit || out_of_time() {
                    report.continuation_token = token.as_ref().map(|t| {
                        Continuation {
                            next_index: None,
                            after: Some(t.0.clone()),
                        }
                        .encode()
                    });
                    if report.continuation_token.is_none() {
                        // Nothing handled yet in this run: resume from the start.
                        report.continuation_token = Some(Continuation::default().encode());
                    }
                    return Ok(());
                }
                let chunk = &chunk[..chunk.len().min(limit - handled)];
                for outcome in self
                    .redrive_chunk(chunk, request, plan, run_id, stop_at)
                    .await
                {
                    on_item(&outcome);
                    report.add(outcome);
                }
                handled += chunk.len();
                if let Some(last) = chunk.last() {
                    token = Some(PageToken::after(last, &plan.filter));
                }
            }
            match page.next {
                Some(next) => token = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// Redrives a chunk of selected records, honouring eligibility, rate and parallelism.
    async fn redrive_chunk(
        &self,
        records: &[DeadLetteredItem],
        request: &RedriveRequest,
        plan: &Plan,
        run_id: &str,
        stop_at: Instant,
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
            outcomes.extend(
                self.redrive_eligible(&eligible, request, plan, run_id, stop_at)
                    .await,
            );
            tokio::time::sleep_until(next).await;
        } else {
            outcomes.extend(
                self.redrive_eligible(&eligible, request, plan, run_id, stop_at)
                    .await,
            );
        }
        outcomes
    }

    async fn redrive_eligible(
        &self,
        records: &[&DeadLetteredItem],
        request: &RedriveRequest,
        plan: &Plan,
        run_id: &str,
        stop_at: Instant,
    ) -> Vec<ItemOutcome> {
        match request.mode {
            RedriveMode::Requeue => self.requeue(records, run_id).await,
            RedriveMode::Reprocess => {
                let deadline = Deadline::new(stop_at + Duration::from_secs(60), Duration::ZERO);
                let work: Vec<_> = records
                    .iter()
                    .map(|r| self.reprocess_one(r, run_id, deadline))
                    .collect();
                futures::stream::iter(work)
                    .buffered(plan.parallelism)
                    .collect()
                    .await
            }
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
            processor.process(&item)
        })
        .await;
        match run.result {
            Ok(_) => match self.store.resolve(&record.item_id, run_id).await {
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
        // (index, queue url, entry)
        let mut entries: Vec<(usize, String, SendMessageBatchRequestEntry)> = Vec::new();
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
                Ok((url, entry)) => entries.push((i, url, entry)),
                Err(e) => {
                    let _ = self.store.release_lease(&record.item_id, run_id).await;
                    outcomes[i] = fail(ItemOutcomeKind::Error, Some(e.to_string()));
                }
            }
        }
        let mut by_queue: HashMap<String, Vec<(usize, SendMessageBatchRequestEntry)>> =
            HashMap::new();
        for (i, url, entry) in entries {
            by_queue.entry(url).or_default().push((i, entry));
        }
        let mut sent = Vec::new();
        for (url, batch) in by_queue {
            for chunk in batch.chunks(10) {
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
                        for (i, _) in chunk {
                            match failed.get(&i.to_string()) {
                                Some(reason) => {
                                    let _ = self
                                        .store
                                        .release_lease(&records[*i].item_id, run_id)
                                        .await;
                                    outcomes[*i] = Some(ItemOutcome {
                                        item_id: records[*i].item_id.clone(),
                                        outcome: ItemOutcomeKind::Error,
                                        detail: Some(format!(
                                            "source queue rejected the message: {reason}"
                                        )),
                                    });
                                }
                                None => sent.push(*i),
                            }
                        }
                    }
                    Err(e) => {
                        let error = ProcessError::from_sdk(&e).with_step("requeue");
                        for (i, _) in chunk {
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
        let sent_ids: Vec<String> = sent.iter().map(|i| records[*i].item_id.clone()).collect();
        let resolved = self.store.resolve_many(&sent_ids, run_id).await;
        for (i, result) in sent.iter().zip(resolved) {
            outcomes[*i] = Some(match result {
                Ok(()) => ItemOutcome {
                    item_id: records[*i].item_id.clone(),
                    outcome: ItemOutcomeKind::Resolved,
                    detail: None,
                },
                Err(e) => ItemOutcome {
                    item_id: records[*i].item_id.clone(),
                    outcome: ItemOutcomeKind::Error,
                    detail: Some(format!(
                        "requeued, but the record could not be resolved: {e}"
                    )),
                },
            });
        }
        outcomes.into_iter().flatten().collect()
    }

    async fn requeue_entry(
        &self,
        index: usize,
        record: &DeadLetteredItem,
        run_id: &str,
    ) -> Result<(String, SendMessageBatchRequestEntry), ProcessError> {
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
        let mut builder = SendMessageBatchRequestEntry::builder()
            .id(index.to_string())
            .message_body(body);
        let mut attributes = 0;
        for (name, value) in &record.source.message_attributes {
            // Binary attributes were kept by type name only; they cannot be restored.
            if attributes == 9 || (value.starts_with('<') && value.ends_with('>')) {
                continue;
            }
            if let Ok(attr) = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
            {
                builder = builder.message_attributes(name, attr);
                attributes += 1;
            }
        }
        if let Ok(attr) = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(&record.item_id)
            .build()
        {
            builder = builder.message_attributes(crate::store::dlq::ITEM_ID_ATTRIBUTE, attr);
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
        Ok((url, entry))
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
