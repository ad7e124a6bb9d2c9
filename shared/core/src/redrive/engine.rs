//! The redrive engine: runs a validated [`RedriveRequest`] over the [`RedrivePorts`]:
//! holds the DLQ's messages, selects records page by page (or by id), leases them, puts
//! them back (reprocess here, or requeue to the source queue), writes each outcome, and
//! settles the DLQ messages at the end (the sweep's [`crate::sweep::sweep_dlq`] and
//! [`crate::sweep::settle_held`], over the same ports). It does no I/O of its own: every
//! call goes through the ports, so its unit tests (`redrive/tests.rs`) run it over the
//! in-memory world ([`crate::testing::MemoryStore`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use super::report::{ItemOutcome, ItemOutcomeKind, RedriveReport};
use super::request::{Continuation, Plan, RedriveError, RedriveMode, RedriveRequest};
use crate::clock::Clock;
use crate::dead_letter::{
    DeadLetteredItem, FailureDetail, InvocationInfo, ItemStatus, PayloadLocation,
};
use crate::error::ProcessError;
use crate::item::{ItemParser, WorkItem};
use crate::pointer::S3Pointer;
use crate::ports::RedrivePorts;
use crate::processor::Processor;
use crate::random::Random;
use crate::retry::{run_with_retry, Deadline, RetryPolicy};
use crate::selection::PageToken;
use crate::sweep::{HeldMessage, SweepOptions};

/// Settings of the engine itself (not of one run).
#[derive(Debug, Clone)]
pub struct RedriveSettings {
    /// Retries when reprocessing.
    pub retry: RetryPolicy,
    /// How item ids are read from DLQ messages without our attribute.
    pub parser: ItemParser,
    /// Requeue target overriding the queue named in each record.
    pub source_queue_url: Option<String>,
    /// Keep S3 payload objects of resolved items. By default one is deleted once no
    /// message can point to it any more (SQS's longest retention after the last attempt).
    pub keep_payloads: bool,
    /// How long a lease lasts if its run dies.
    pub lease_ttl: Duration,
    /// Most item outcomes a report lists (the counts are always complete): the redrive
    /// function's answer must fit Lambda's 6 MB response; the CLI lists them all.
    pub report_items: usize,
    /// Where failures recorded by this engine say they happened (the function's name and
    /// log group and stream; empty for the CLI). Each failure adds the run id.
    pub invocation: InvocationInfo,
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
            invocation: InvocationInfo::default(),
        }
    }
}

/// The engine reads the randomness its retry policy holds, one generator for the whole run
/// (run ids, the markers of the runs' sweeps, the retries' jitter; the thread's generator
/// by default), and the clock of its store ([`crate::ports::RecordStore::clock`], which
/// [`RedriveEngine::new`] puts in the retry policy): the time a request's `since` and
/// `until` are relative to, the age of requeues and of the oldest dead record, leases left
/// by dead runs, the start of a failure found before any attempt. One clock, the one that
/// stamps the records and the leases, judges them.
impl RedriveSettings {
    /// Draws from `random`.
    pub fn with_random(mut self, random: Random) -> Self {
        self.retry.random = random;
        self
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

/// Kept free at the end of a lease: the outcome write and the clocks' drift.
pub const LEASE_MARGIN: Duration = Duration::from_secs(30);

/// Returns the run's item deadline, brought forward so that an item leased at `leased_at` for
/// `ttl` is done (attempts cut, outcome written) [`LEASE_MARGIN`] before its lease ends.
pub(super) fn within_lease(run: Deadline, leased_at: Instant, ttl: Duration) -> Deadline {
    let lease_end = leased_at + ttl.saturating_sub(LEASE_MARGIN);
    if lease_end < run.hard_stop()
        && !crate::mutants::is_on(crate::mutants::Mutant::AttemptsPastLease)
    {
        Deadline::new(lease_end, OUTCOME_WRITE_SLICE)
    } else {
        run
    }
}

/// What a run has taken so far against its `max_items`, and where each outcome is told:
/// the caller's callback, the run's resolved set and the report.
struct Tally<'a> {
    /// Items taken (leased, or would be in a dry run): what `max_items` counts.
    taken: usize,
    limit: usize,
    run: &'a RunContext,
    on_item: &'a (dyn Fn(&ItemOutcome) + Send + Sync),
    sample: usize,
    report: &'a mut RedriveReport,
}

impl Tally<'_> {
    /// Tells one item's outcome.
    fn record(&mut self, outcome: ItemOutcome) {
        (self.on_item)(&outcome);
        if outcome.outcome == ItemOutcomeKind::Resolved {
            self.run.note_resolved(&outcome.item_id);
        }
        self.report.add(outcome, self.sample);
    }

    /// Tells a chunk's outcomes, counting every item taken (all but the ineligible).
    fn count(&mut self, outcomes: Vec<ItemOutcome>) {
        for outcome in outcomes {
            if outcome.outcome != ItemOutcomeKind::SkippedIneligible {
                self.taken += 1;
            }
            self.record(outcome);
        }
    }

    /// Returns how many more items the run may take.
    fn room(&self) -> usize {
        self.limit.saturating_sub(self.taken)
    }

    /// Tells whether the run must stop before its next chunk: `max_items` taken, or its time up.
    fn must_stop(&self) -> bool {
        self.taken >= self.limit || Instant::now() >= self.run.stop_at
    }
}

/// The clock of one run: when it stops starting items, when running items are cut, when
/// settling must be over; and the items it resolved (its DLQ messages are settled by them).
pub(super) struct RunContext {
    pub(super) run_id: String,
    /// No item starts after this.
    stop_at: Instant,
    /// Attempts are cut at its cut-off; outcome writes end at its hard stop.
    items: Deadline,
    /// Settling the DLQ messages ends here.
    settle_by: Instant,
    resolved: Mutex<HashSet<String>>,
}

impl RunContext {
    fn new(
        started: Instant,
        budget: Duration,
        deadline: Option<Instant>,
        random: &Random,
    ) -> RunContext {
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
            run_id: format!("redrive-{:016x}", random.u64(..)),
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

/// Longer than any SQS queue keeps a message (14 days), plus a margin: a record still
/// `requeued` after this has no message left that could finish it. A run sets such a
/// record back to dead sooner, once its queue's own retention and the margin are past
/// ([`REQUEUE_MARGIN`]).
pub const REQUEUE_OUTLIVED: Duration = Duration::from_secs(14 * 86_400 + 3_600);

/// How long past its queue's retention a requeue waits before it counts as outlived: an
/// hour, for a message the worker is still running when its retention ends.
pub const REQUEUE_MARGIN: Duration = Duration::from_secs(3_600);

/// How long a requeued record is kept at least after its requeue: past
/// [`REQUEUE_OUTLIVED`] by a day, for the runs that set it back to dead. A record that
/// expired first would vanish with its message lost.
pub const REQUEUED_RECORD_LIFE: Duration = Duration::from_secs(REQUEUE_OUTLIVED.as_secs() + 86_400);

/// Returns the expiry (epoch seconds) of a record requeued at `now` that expired at `expires_at`:
/// never sooner, and at least [`REQUEUED_RECORD_LIFE`] away.
pub fn expiry_when_requeued(expires_at: i64, now: chrono::DateTime<chrono::Utc>) -> i64 {
    let life = i64::try_from(REQUEUED_RECORD_LIFE.as_secs()).unwrap_or(i64::MAX);
    expires_at.max(now.timestamp().saturating_add(life))
}

/// Returns the expiry (epoch seconds) of a record set back to dead at `now`: never sooner, and at
/// least the store's `retention` away, so that an operator has the whole retention to act.
pub fn expiry_when_reopened(
    expires_at: i64,
    now: chrono::DateTime<chrono::Utc>,
    retention: Duration,
) -> i64 {
    let retention = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    expires_at.max(now.timestamp().saturating_add(retention))
}

/// How long the messages a run judged and kept stay hidden after a sweep that could not
/// see the whole DLQ: the next runs' sweeps reach the others first. An hour covers a DLQ
/// many times larger than one run sweeps at the default schedule; a message's record is
/// what the tools show, and the DLQ's depth alarm counts hidden messages too.
pub const CARRY_HOLD: Duration = Duration::from_secs(3_600);

/// Runs redrives: selects dead records, leases each, reprocesses or requeues it, and
/// settles its DLQ messages.
///
/// ```
/// use sqs_keeper_core::redrive::{RedriveEngine, RedriveRequest, RedriveSettings};
/// use sqs_keeper_core::testing::{dead_record, MemoryStore, ScriptedProcessor};
/// use sqs_keeper_core::ErrorClass;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// // A record the worker dead-lettered after the downstream throttled it.
/// let store = MemoryStore::new();
/// store.insert_dead_lettered(dead_record("order-7", ErrorClass::Throttled, 3));
///
/// // The downstream is back: the processor succeeds, and the redrive resolves the item.
/// let engine = RedriveEngine::new(store, Some(ScriptedProcessor::new()), RedriveSettings::default());
/// let report = engine.run(&RedriveRequest::default(), &|_| {}).await.unwrap();
/// assert_eq!((report.selected, report.succeeded), (1, 1));
/// # });
/// ```
pub struct RedriveEngine<P, S> {
    pub(super) store: S,
    pub(super) processor: Option<P>,
    pub(super) settings: RedriveSettings,
    /// Source queue URLs by queue ARN, looked up once per run of the engine.
    pub(super) queue_urls: Mutex<HashMap<String, String>>,
    /// Each source queue's largest message, by URL, read once per run of the engine.
    pub(super) queue_sizes: Mutex<HashMap<String, u64>>,
    /// Each source queue's retention, by URL, read once per run of the engine.
    pub(super) queue_retentions: Mutex<HashMap<String, Duration>>,
    /// Follows an Extended-Client pointer a record kept (the worker could not fetch its
    /// payload) before reprocessing, under the worker's payload policy.
    pub(super) resolver: Option<std::sync::Arc<dyn crate::batch::BodyResolver>>,
}

impl<P: Processor, S: RedrivePorts> RedriveEngine<P, S> {
    /// Creates an engine; `processor` is needed for `reprocess` mode only. It reads `store`'s clock
    /// (a clock in `settings` is replaced by it: see [`RedriveSettings`]).
    pub fn new(store: S, processor: Option<P>, mut settings: RedriveSettings) -> Self {
        settings.retry.clock = store.clock();
        RedriveEngine {
            store,
            processor,
            settings,
            queue_urls: Mutex::new(HashMap::new()),
            queue_sizes: Mutex::new(HashMap::new()),
            queue_retentions: Mutex::new(HashMap::new()),
            resolver: None,
        }
    }

    /// Resolves Extended-Client pointers a record kept before reprocessing it, as the
    /// worker does (the buckets it allows, its size cap). Without one, such a record is
    /// refused rather than the pointer delivered as the payload.
    pub fn with_body_resolver(
        mut self,
        resolver: std::sync::Arc<dyn crate::batch::BodyResolver>,
    ) -> Self {
        self.resolver = Some(resolver);
        self
    }

    /// Returns the store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Returns the engine's settings.
    pub fn settings(&self) -> &RedriveSettings {
        &self.settings
    }

    /// Returns the settings, to change them.
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
        let request = &request.resumed()?;
        let plan = request.plan(self.settings.retry.clock.now())?;
        if request.mode == RedriveMode::Reprocess && self.processor.is_none() && !request.dry_run {
            return Err(RedriveError::InvalidRequest(
                "mode reprocess needs the processor's configuration (WORKER_DOWNSTREAM_URL); use mode requeue, \
                 --via-function <the redrive function>, or configure it"
                    .into(),
            ));
        }
        let started = Instant::now();
        let run = RunContext::new(started, plan.budget, deadline, &self.settings.retry.random);
        let mut report = RedriveReport {
            run_id: run.run_id.clone(),
            mode: request.mode,
            dry_run: request.dry_run,
            ..RedriveReport::default()
        };
        let (held, swept_whole_dlq) = if request.dry_run {
            (BTreeMap::new(), true)
        } else {
            // Boxed: the sweep's future is large, and a debug build's stack is not.
            Box::pin(self.sweep_for_run(&run, started, &mut report)).await?
        };
        if !request.dry_run {
            report.requeues_outlived = self.reopen_outlived_requeues(&run).await;
        }
        // A run that begins a chain selects what is there once its sweep has adopted: an
        // adopted record is dated by its adoption, after the plan above was made.
        // A re-plan that fails still settles what the sweep holds, below.
        let plan = match plan.continuation.started_ms {
            Some(_) if request.continuation_token.is_some() => Ok(plan),
            _ => request.plan(self.settings.retry.clock.now()),
        };
        let result = match plan {
            Ok(plan) => {
                self.select_and_redrive(request, &plan, &run, &mut report, on_item)
                    .await
            }
            Err(error) => Err(error),
        };
        // Settle the DLQ messages, even on error: delete those of what was resolved, give the
        // rest back.
        report.dlq_messages_deleted += self
            .settle_dlq_messages(held, &run, swept_whole_dlq)
            .await
            .map_err(RedriveError::Store)?;
        result?;
        if !request.dry_run {
            report.oldest_dead_age_secs = self.oldest_dead_age().await;
        }
        Ok(report)
    }

    /// Returns the options of a run's sweeps: adopting, until `until`, holding what they keep until
    /// `hold_until`.
    fn adopting_sweep(&self, until: Option<Instant>, hold_until: Option<Instant>) -> SweepOptions {
        SweepOptions {
            adopt: true,
            purge: HashMap::new(),
            parser: self.settings.parser.clone(),
            until,
            hold_until,
            random: self.settings.retry.random.clone(),
            orphans_sent_before_ms: None,
        }
    }

    /// Sweeps the DLQ for a run: adopts unrecorded messages and holds what it keeps for the
    /// run. Returns the held messages by item and whether the sweep went through the whole
    /// DLQ.
    ///
    /// The sweep takes at most half of the time items may start in. A DLQ too large for
    /// one run then still leaves the run time to redrive, and the next runs reach what it
    /// did not (see `CARRY_HOLD`).
    async fn sweep_for_run(
        &self,
        run: &RunContext,
        started: Instant,
        report: &mut RedriveReport,
    ) -> Result<(BTreeMap<String, Vec<crate::sweep::HeldMessage>>, bool), RedriveError> {
        let sweep_until = started + run.stop_at.saturating_duration_since(started) / 2;
        let sweep = crate::sweep::sweep_dlq(
            &self.store,
            &self.adopting_sweep(Some(sweep_until), Some(run.settle_by)),
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
                    error_class: None,
                    item_id,
                    outcome: ItemOutcomeKind::Error,
                    detail: Some(error),
                },
                self.settings.report_items,
            );
        }
        Ok((sweep.held, sweep.complete))
    }

    /// Sets back to dead every record still `requeued` longer than its queue keeps a
    /// message, and [`REQUEUE_MARGIN`] (its requeued message was neither finished nor
    /// dead-lettered: it expired, or was purged from the queue), so that nothing waits
    /// `requeued` for ever. Bounded by the run's item window; a failure is logged (the
    /// next run tries again). How many it reopened.
    async fn reopen_outlived_requeues(&self, run: &RunContext) -> usize {
        let filter = crate::selection::RecordFilter {
            status: Some(crate::dead_letter::ItemStatus::Requeued),
            oldest_first: true,
            ..crate::selection::RecordFilter::default()
        };
        let now = self.settings.retry.clock.now();
        let mut reopened = 0;
        let mut token = None;
        loop {
            if Instant::now() >= run.stop_at {
                return reopened;
            }
            let page = match self.store.query_page(&filter, 100, token.as_ref()).await {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(%error, "could not list requeued records; the next run looks again");
                    return reopened;
                }
            };
            for record in &page.records {
                let Some(requeued_at) = record.requeued_at else {
                    continue;
                };
                let outlived = self.requeue_outlived_after(record).await;
                let outlived_chrono =
                    chrono::Duration::from_std(outlived).unwrap_or(chrono::Duration::MAX);
                if requeued_at + outlived_chrono >= now {
                    continue;
                }
                let item = work_item(record, String::new());
                let failure = immediate(
                    ProcessError::new(
                        crate::error::ErrorClass::Timeout,
                        format!(
                            "requeued as message {} more than {} ago, longer than its queue keeps a message, and never finished nor dead-lettered: the message is gone",
                            record.requeued_message_id.as_deref().unwrap_or("?"),
                            humantime::format_duration(outlived)
                        ),
                    )
                    .with_step("requeue"),
                    &self.settings.retry.clock,
                );
                let mut detail =
                    FailureDetail::from_attempt(&item, &failure, &self.settings.invocation);
                detail.attempt_id = format!(
                    "requeue-outlived:{}",
                    record.requeued_message_id.as_deref().unwrap_or_default()
                );
                match self.store.reopen_requeued(record, &detail).await {
                    Ok(true) => reopened += 1,
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(item_id = %record.item_id, %error, "could not set an outlived requeue back to dead");
                    }
                }
            }
            match page.next {
                Some(next) => token = Some(next),
                None => return reopened,
            }
        }
    }

    /// Returns how long after its requeue a record still `requeued` has no message left that
    /// could finish it: its queue's retention (read once per queue per run of the engine;
    /// SQS's longest, 14 days, when it cannot be read) and [`REQUEUE_MARGIN`].
    async fn requeue_outlived_after(&self, record: &DeadLetteredItem) -> Duration {
        let Ok(url) = self.queue_url(record).await else {
            return REQUEUE_OUTLIVED;
        };
        let cached = self
            .queue_retentions
            .lock()
            .ok()
            .and_then(|m| m.get(&url).copied());
        let retention = match cached {
            Some(retention) => retention,
            None => {
                let retention = match self.store.message_retention(&url).await {
                    Ok(retention) => retention.min(crate::ports::SQS_MAX_RETENTION),
                    Err(error) => {
                        tracing::warn!(queue_url = %url, error = %error.loggable(), "cannot read the queue's MessageRetentionPeriod (sqs:GetQueueAttributes); a requeue counts as outlived after 14 days");
                        crate::ports::SQS_MAX_RETENTION
                    }
                };
                if let Ok(mut m) = self.queue_retentions.lock() {
                    m.insert(url, retention);
                }
                retention
            }
        };
        retention + REQUEUE_MARGIN
    }

    /// Returns how long the oldest dead record has waited since its last attempt: one query of one
    /// record (`None` when there is none, or the query failed: the age is a metric, never a
    /// reason to fail the run).
    pub async fn oldest_dead_age(&self) -> Option<u64> {
        let filter = crate::selection::RecordFilter {
            status: Some(crate::dead_letter::ItemStatus::Dead),
            oldest_first: true,
            ..crate::selection::RecordFilter::default()
        };
        let page = self.store.query_page(&filter, 1, None).await.ok()?;
        let oldest = page.records.first()?;
        let age = self
            .settings
            .retry
            .clock
            .now()
            .signed_duration_since(oldest.last_attempt);
        Some(u64::try_from(age.num_seconds()).unwrap_or(0))
    }

    /// Deletes the DLQ messages of resolved items and releases the rest. With two runs at
    /// once, the run that resolves an item may not hold its messages (the other run's sweep
    /// received them), so: messages this run holds for items it did not resolve are settled
    /// by the item's status once any redrive in progress on it ends; and if this run
    /// resolved items whose messages it does not hold, it sweeps the DLQ once more, while
    /// its own messages are still held, to delete those the other run has given back. A
    /// held message whose record must be reopened (another body under the item id this run
    /// resolved) is given back and a last sweep, which receives its body, reopens it.
    async fn settle_dlq_messages(
        &self,
        mut held: BTreeMap<String, Vec<HeldMessage>>,
        run: &RunContext,
        swept_whole_dlq: bool,
    ) -> Result<usize, ProcessError> {
        let resolved = run.resolved_ids();
        let resolved_unheld = resolved.iter().any(|id| !held.contains_key(id));
        let mut deleted = 0;
        if resolved_unheld && Instant::now() < run.settle_by {
            let sweep = crate::sweep::sweep_dlq(
                &self.store,
                &self.adopting_sweep(Some(run.settle_by), Some(run.settle_by)),
            )
            .await?;
            deleted += sweep.deleted;
            for (item_id, messages) in sweep.held {
                held.entry(item_id).or_default().extend(messages);
            }
        }
        let wait = SETTLE_WAIT.min(run.settle_by.saturating_duration_since(Instant::now()));
        // After a sweep that saw the whole DLQ, what is kept is visible again at once; after
        // one that did not, it stays hidden for `CARRY_HOLD`, so that the next runs reach
        // the messages this one did not.
        let then = if swept_whole_dlq {
            Duration::ZERO
        } else {
            CARRY_HOLD
        };
        let settled =
            crate::sweep::settle_held(&self.store, held, wait, then, Some(run.settle_by)).await?;
        deleted += settled.deleted;
        if settled.to_reopen > 0 && Instant::now() < run.settle_by {
            let sweep = crate::sweep::sweep_dlq(
                &self.store,
                &self.adopting_sweep(Some(run.settle_by), None),
            )
            .await?;
            deleted += sweep.deleted;
            deleted += crate::sweep::settle_held(
                &self.store,
                sweep.held,
                Duration::ZERO,
                then,
                Some(run.settle_by),
            )
            .await?
            .deleted;
        }
        Ok(deleted)
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
        let mut tally = Tally {
            taken: 0,
            limit: request.max_items.unwrap_or(usize::MAX),
            run,
            on_item,
            sample: self.settings.report_items,
            report,
        };
        if plan.ids.is_empty() {
            return self
                .redrive_selected(request, plan, chunk_size, &mut tally)
                .await;
        }
        self.redrive_named(request, plan, chunk_size, &mut tally)
            .await;
        Ok(())
    }

    /// Redrives the items the request names, a chunk at a time, from where its
    /// continuation left off.
    async fn redrive_named(
        &self,
        request: &RedriveRequest,
        plan: &Plan,
        chunk_size: usize,
        tally: &mut Tally<'_>,
    ) {
        let start = plan.continuation.next_index.unwrap_or(0);
        let mut index = start;
        for chunk in plan.ids[start.min(plan.ids.len())..].chunks(chunk_size) {
            if tally.must_stop() {
                tally.report.continuation_token = Some(
                    Continuation {
                        next_index: Some(index),
                        started_ms: plan.continuation.started_ms,
                        request: plan.continuation.request.clone(),
                        ..Continuation::default()
                    }
                    .encode(),
                );
                return;
            }
            let chunk = &chunk[..chunk.len().min(tally.room())];
            let records = self.read_named(chunk, plan, tally).await;
            let outcomes = self.redrive_chunk(&records, request, plan, tally.run).await;
            tally.count(outcomes);
            index += chunk.len();
        }
    }

    /// Returns the records of `ids` that the plan selects. An id without a record, with one the
    /// plan does not select, or whose record cannot be read is that item's outcome, told
    /// at once; not the run's error.
    async fn read_named(
        &self,
        ids: &[String],
        plan: &Plan,
        tally: &mut Tally<'_>,
    ) -> Vec<DeadLetteredItem> {
        let mut records = Vec::new();
        for id in ids {
            let (outcome, detail) = match self.store.get(id).await {
                Ok(Some(r)) if plan.selects(&r) => {
                    records.push(r);
                    continue;
                }
                Ok(Some(r)) => (
                    ItemOutcomeKind::SkippedIneligible,
                    format!("status is {}", r.status.as_str()),
                ),
                Ok(None) => (
                    ItemOutcomeKind::NotFound,
                    "no record with this item id".to_string(),
                ),
                Err(e) => (ItemOutcomeKind::Error, e.to_string()),
            };
            tally.record(ItemOutcome {
                error_class: None,
                item_id: id.clone(),
                outcome,
                detail: Some(detail),
            });
        }
        records
    }

    /// Redrives the records the plan's filters select, phase by phase and page by page,
    /// from where its continuation left off.
    async fn redrive_selected(
        &self,
        request: &RedriveRequest,
        plan: &Plan,
        chunk_size: usize,
        tally: &mut Tally<'_>,
    ) -> Result<(), RedriveError> {
        // The token that resumes the chain right after `token`, in query `phase`.
        let resume_after = |token: &Option<PageToken>, phase: usize| {
            Continuation {
                next_index: None,
                after: token.as_ref().map(|t| t.0.clone()),
                phase,
                started_ms: plan.continuation.started_ms,
                request: plan.continuation.request.clone(),
            }
            .encode()
        };
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
                    tally.record(ItemOutcome {
                        error_class: None,
                        item_id: bad.item_id.clone(),
                        outcome: ItemOutcomeKind::Error,
                        detail: Some(bad.error.clone()),
                    });
                }
                let fresh: Vec<DeadLetteredItem> = page
                    .records
                    .into_iter()
                    .filter(|r| seen.insert(r.item_id.clone()))
                    .collect();
                for chunk in fresh.chunks(chunk_size) {
                    if tally.must_stop() {
                        tally.report.continuation_token = Some(resume_after(&token, phase));
                        return Ok(());
                    }
                    let cut = chunk.len() > tally.room();
                    let chunk = &chunk[..chunk.len().min(tally.room())];
                    let outcomes = self.redrive_chunk(chunk, request, plan, tally.run).await;
                    tally.count(outcomes);
                    if let Some(last) = chunk.last() {
                        token = Some(self.store.token_after(last, filter));
                    }
                    if cut {
                        // The page goes on after the last record handled: resume there,
                        // not at the next page.
                        tally.report.continuation_token = Some(resume_after(&token, phase));
                        return Ok(());
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
    /// Takes back the expired lease of an item this run will not reprocess: leased, then
    /// released (dead again).
    async fn take_back(&self, record: &DeadLetteredItem, run_id: &str) -> ItemOutcome {
        let outcome = |outcome, detail: String| ItemOutcome {
            error_class: None,
            item_id: record.item_id.clone(),
            outcome,
            detail: Some(detail),
        };
        match self
            .store
            .acquire_lease(&record.item_id, run_id, self.settings.lease_ttl)
            .await
        {
            Ok(true) => match self.store.release_lease(&record.item_id, run_id).await {
                Ok(()) => outcome(
                    ItemOutcomeKind::SkippedIneligible,
                    format!(
                        "an expired lease taken back; {} errors are not reprocess-eligible (use force to override)",
                        record.error_class
                    ),
                ),
                Err(e) => outcome(ItemOutcomeKind::Error, e.to_string()),
            },
            Ok(false) => outcome(ItemOutcomeKind::LeasedElsewhere, "leased elsewhere".into()),
            Err(e) => outcome(ItemOutcomeKind::Error, e.to_string()),
        }
    }

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
            if !ok && record.status == ItemStatus::Redriving && !request.dry_run {
                // An ineligible item a forced run left leased (it died, or its outcome
                // write failed): taken back and set dead again, not reprocessed. Left so,
                // only another forced run would ever take it back.
                outcomes.push(self.take_back(record, &run.run_id).await);
            } else if !ok {
                outcomes.push(ItemOutcome {
                    error_class: None,
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
                    error_class: None,
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
            // Never past the time no item may start after: nothing starts then anyway, and
            // the run must still settle and answer before its deadline.
            tokio::time::sleep_until(next.min(run.stop_at)).await;
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
                error_class: None,
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
        let Some(processor) = &self.processor else {
            return outcome_of(
                record,
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
            Ok(false) => return outcome_of(record, ItemOutcomeKind::LeasedElsewhere, None),
            Err(e) => return outcome_of(record, ItemOutcomeKind::Error, Some(e.to_string())),
        }
        // No attempt runs past the lease: once it expires another run may take the item, and
        // both would process it. The attempts are cut a margin before it, leaving the outcome
        // write its slice within the lease.
        let deadline = within_lease(deadline, Instant::now(), self.settings.lease_ttl);
        let item = match self.item_to_reprocess(record, &deadline).await {
            Ok(item) => item,
            Err((item, error)) => {
                let failure = immediate(error, &self.settings.retry.clock);
                return self.fail(record, run_id, &item, vec![failure]).await;
            }
        };
        // Inside a record's context, as the worker runs its attempts: a layer reads the
        // item's cut-off and hard stop from it, so an idempotency claim lasts until the
        // hard stop and an attempt cut at the cut-off releases it.
        // Boxed: the attempts' future (the processor's, its layers', the retries') is large,
        // and each item of a run would otherwise carry it inline.
        let (run, _fields) = Box::pin(self.record_context(&deadline).scope(run_with_retry(
            &self.settings.retry,
            &deadline,
            |_| crate::batch::guard_panics(processor.process(&item)),
        )))
        .await;
        self.settle(record, run_id, &item, run).await
    }

    /// Returns the item a record's payload makes, as the worker's processor would get it: the
    /// payload read (from S3, or through the producer's pointer), the envelope unwrapped.
    /// A payload that cannot be read or unwrapped, or a lease used up reading it, is the
    /// item's immediate failure, with the item as far as it was made.
    async fn item_to_reprocess(
        &self,
        record: &DeadLetteredItem,
        deadline: &Deadline,
    ) -> Result<WorkItem, (WorkItem, ProcessError)> {
        let loaded = match self.load_body(record).await {
            Ok(body) => self.resolve_pointer(body).await,
            Err(error) => Err(error),
        };
        let mut item = match loaded {
            Ok(body) => work_item(record, body),
            Err(error) => return Err((work_item(record, String::new()), error)),
        };
        // The record keeps the body as it arrived; the processor gets what the worker's
        // would have, the envelope unwrapped.
        if let Err(error) = self.settings.parser.unwrap_envelope(&mut item) {
            return Err((item, error));
        }
        if deadline.remaining().is_zero() {
            // Reading the payload took what the lease had left: no attempt starts now.
            let error = ProcessError::new(
                crate::error::ErrorClass::Timeout,
                "not attempted: reading the payload used up the item's lease",
            )
            .with_step("reprocess");
            return Err((item, error));
        }
        Ok(item)
    }

    /// Writes what the attempts at `item` came to: resolved, held back by its group's
    /// breaker (given back as it was), or failed again.
    async fn settle(
        &self,
        record: &DeadLetteredItem,
        run_id: &str,
        item: &WorkItem,
        run: crate::retry::RetryRun<crate::Outcome>,
    ) -> ItemOutcome {
        match run.result {
            Ok(outcome) => match self.store.resolve(record, run_id).await {
                Ok(()) => {
                    self.drop_payload(record).await;
                    let detail = match outcome {
                        crate::Outcome::Skipped { reason } => Some(format!("{SKIPPED}: {reason}")),
                        crate::Outcome::AlreadyDone { reason } => Some(reason),
                        _ => None,
                    };
                    outcome_of(record, ItemOutcomeKind::Resolved, detail)
                }
                Err(e) => {
                    // Processed, but not marked resolved: give the item back (dead, no
                    // lease) so the next run can take it at once rather than after the
                    // lease expires. The downstream saw it; its idempotency key covers a
                    // second delivery.
                    let _ = self.store.release_lease(&record.item_id, run_id).await;
                    outcome_of(record, ItemOutcomeKind::Error, Some(e.to_string()))
                }
            },
            // Only refusals: the item's group breaker is open, and the downstream was not
            // called. The record stays as it was, for a run after that breaker closes.
            Err(_)
                if !run.failures.is_empty()
                    && run.failures.iter().all(|f| f.error.is_breaker_refusal()) =>
            {
                let _ = self.store.release_lease(&record.item_id, run_id).await;
                outcome_of(
                    record,
                    ItemOutcomeKind::HeldByBreaker,
                    Some("its message group's circuit breaker is open: not reprocessed".into()),
                )
            }
            Err(_) => self.fail(record, run_id, item, run.failures).await,
        }
    }

    /// Returns the record context of an item's attempts bounded by `deadline`, its instants read
    /// as wall times by the engine's clock.
    fn record_context(&self, deadline: &Deadline) -> crate::context::RecordContext {
        let clock = self.settings.retry.clock;
        let now = Instant::now();
        let wall = |at: Instant| clock.system_time() + at.saturating_duration_since(now);
        crate::context::RecordContext::new(
            wall(deadline.cutoff()),
            wall(deadline.hard_stop()),
            std::sync::Arc::default(),
        )
        .with_clock(clock)
    }

    async fn fail(
        &self,
        record: &DeadLetteredItem,
        run_id: &str,
        item: &WorkItem,
        failures: Vec<crate::retry::AttemptFailure>,
    ) -> ItemOutcome {
        let invocation = InvocationInfo {
            request_id: Some(run_id.to_string()),
            ..self.settings.invocation.clone()
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
        let error_class = failures.last().map(|f| f.error.class);
        match self
            .store
            .record_redrive_failure(&record.item_id, run_id, &details)
            .await
        {
            Ok(()) => ItemOutcome {
                error_class,
                item_id: record.item_id.clone(),
                outcome: ItemOutcomeKind::FailedAgain,
                detail: message,
            },
            Err(e) => {
                let _ = self.store.release_lease(&record.item_id, run_id).await;
                ItemOutcome {
                    error_class: None,
                    item_id: record.item_id.clone(),
                    outcome: ItemOutcomeKind::Error,
                    detail: Some(e.to_string()),
                }
            }
        }
    }

    /// Returns the item's body: inline, or fetched from S3 and checked against its sha256.
    pub(super) async fn load_body(
        &self,
        record: &DeadLetteredItem,
    ) -> Result<String, ProcessError> {
        match &record.payload.location {
            PayloadLocation::Inline { body } => Ok(body.clone()),
            PayloadLocation::S3 { bucket, key } => {
                let pointer = S3Pointer {
                    bucket: bucket.clone(),
                    key: key.clone(),
                };
                let body = self.store.fetch(&pointer).await?;
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

    /// Returns the payload behind a record that kept an Extended-Client pointer (the worker could
    /// not fetch it then): fetched under the payload policy, or refused. The downstream is
    /// never handed the pointer as if it were the payload.
    async fn resolve_pointer(&self, body: String) -> Result<String, ProcessError> {
        let Some(pointer) = S3Pointer::parse(&body) else {
            // The bare form is a pointer only where the worker's policy says so (an allowed
            // bucket): the resolver, which applies it, decides; elsewhere it is data.
            if S3Pointer::parse_bare(&body).is_some() {
                if let Some(resolver) = &self.resolver {
                    if let Some(resolved) = resolver.resolve(&body).await {
                        return resolved;
                    }
                }
            }
            return Ok(body);
        };
        match &self.resolver {
            Some(resolver) => match resolver.resolve(&body).await {
                Some(resolved) => resolved,
                None => Ok(body),
            },
            None => Err(ProcessError::new(
                crate::error::ErrorClass::Permission,
                format!(
                    "the record holds an Extended-Client pointer to s3://{}/{}, not its payload, and this engine follows no pointers",
                    pointer.bucket, pointer.key
                ),
            )
            .with_step("fetch-payload")),
        }
    }

    /// Deletes a resolved item's payload object, unless the settings keep it or a message
    /// may still point to it. A source message with the same payload may be in flight
    /// until SQS's longest retention has passed since the last attempt. A worker failing it
    /// again records it under the same object, which a delete would take from under it
    /// (docs/ARCHITECTURE.md §4). The bucket's lifecycle expires what is kept.
    async fn drop_payload(&self, record: &DeadLetteredItem) {
        let now = self.settings.retry.clock.now();
        let live = crate::removal::may_still_be_delivered(record.last_attempt, now)
            && !crate::mutants::is_on(crate::mutants::Mutant::ResolveDeletesLivePayload);
        if self.settings.keep_payloads || live {
            return;
        }
        if let PayloadLocation::S3 { bucket, key } = &record.payload.location {
            let pointer = S3Pointer {
                bucket: bucket.clone(),
                key: key.clone(),
            };
            if let Err(error) = self.store.delete(&pointer).await {
                tracing::warn!(item_id = %record.item_id, %error, "could not delete the resolved item's payload");
            }
        }
    }
}

/// Returns a dead-lettered item as a work item for reprocessing. It carries the record's trace as
/// its `AWSTraceHeader`, so the handler, its log lines and the downstream continue the
/// producer's trace ([`crate::trace::TraceContext::of_dead`]).
pub(super) fn work_item(record: &DeadLetteredItem, body: String) -> WorkItem {
    let mut attributes = crate::event::Attributes::new();
    if let Some(trace) = crate::trace::TraceContext::of_dead(record) {
        attributes.insert(crate::trace::AWS_TRACE_HEADER, &trace.xray_header());
    }
    WorkItem {
        message_id: record.source.message_id.clone(),
        item_id: record.item_id.clone(),
        body,
        receive_count: record.source.receive_count,
        sent_timestamp: record.source.sent_timestamp,
        message_group_id: record.source.message_group_id.clone(),
        event_source_arn: record.source.queue_arn.clone(),
        attributes,
        message_attributes: HashMap::new(),
        envelope: None,
    }
}

/// Returns a failure found before any attempt (the payload unreadable, the lease used up), at
/// `clock`'s now.
fn immediate(error: ProcessError, clock: &Clock) -> crate::retry::AttemptFailure {
    crate::retry::AttemptFailure {
        attempt: 1,
        started_at: clock.now(),
        duration: Duration::ZERO,
        error,
    }
}

/// Returns a shared no-op progress callback.
pub fn no_progress() -> Arc<dyn Fn(&ItemOutcome) + Send + Sync> {
    Arc::new(|_| {})
}

/// The outcome of `record`'s item, of `kind`.
/// How the detail of an item resolved with nothing done begins (the handler skipped it,
/// or its idempotency key was completed before). Such an item says nothing of the
/// downstream, and the breaker's gate does not close on it.
pub(super) const SKIPPED: &str = "resolved with nothing to do";

fn outcome_of(
    record: &DeadLetteredItem,
    kind: ItemOutcomeKind,
    detail: Option<String>,
) -> ItemOutcome {
    ItemOutcome {
        error_class: None,
        item_id: record.item_id.clone(),
        outcome: kind,
        detail,
    }
}
