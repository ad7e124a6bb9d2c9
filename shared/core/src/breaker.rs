//! A circuit breaker shared by every sandbox of a function: when the downstream's
//! transient failures within a window reach a threshold, the breaker opens and the worker
//! stops calling the downstream; records are returned for retry (hidden for the rest of
//! the open period when spaced redelivery is on, docs/ARCHITECTURE.md §1.11) until one
//! probe, one record at a time, succeeds and closes it (docs/ARCHITECTURE.md §7).
//!
//! The state lives in one small item of a store every sandbox reads ([`BreakerStore`]:
//! DynamoDB in production, `sqs_keeper_aws::DynamoBreakerStore`), so fifty sandboxes do not each
//! rediscover an outage. A sandbox reads it at most once per [`BreakerPolicy::refresh`]
//! and writes only on failures and transitions.
//!
//! [`Breaker`] wraps a processor. An item refused because the breaker is open fails with
//! class `server_error`, code [`CIRCUIT_OPEN`] and a `Retry-After` to the end of the open
//! period, without the downstream being called: within the receive budget it goes back to
//! the queue; on its last receive it is dead-lettered with that code, which marks it as
//! outage-caused, and a redrive of eligible items (transient classes) brings it back once
//! the breaker has closed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;

use crate::clock::Clock;
use crate::error::{ErrorClass, ProcessError};
use crate::item::WorkItem;
use crate::processor::{Outcome, Processor};

use crate::error::CIRCUIT_OPEN;

/// When the breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Transient failures within `window` that open the breaker.
    pub threshold: u32,
    /// The window failures are counted in.
    pub window: Duration,
    /// How long the breaker stays open the first time; doubled each time a probe fails,
    /// up to `max_open`.
    pub open_for: Duration,
    /// The longest open period.
    pub max_open: Duration,
    /// How long a probe may take before another sandbox may probe.
    pub probe_for: Duration,
    /// How long a sandbox trusts the state it read.
    pub refresh: Duration,
}

/// The shared state, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BreakerState {
    /// Open until this time; `None` when closed.
    pub open_until: Option<SystemTime>,
    /// Times it opened in a row without closing (the open period doubles with each).
    pub opens: u32,
    /// Transient failures counted in the current window.
    pub failures: u32,
    /// Start of the current window.
    pub window_start: Option<SystemTime>,
    /// A probe runs until this time.
    pub probe_until: Option<SystemTime>,
}

impl BreakerState {
    /// Tells whether the breaker is open at `now` (before the end of its open period).
    pub fn is_open(&self, now: SystemTime) -> bool {
        self.open_until.is_some_and(|until| now < until)
    }

    /// Tells whether it opened and its open period is over: a probe may run.
    pub fn is_half_open(&self, now: SystemTime) -> bool {
        self.open_until.is_some_and(|until| now >= until)
    }
}

/// Where the shared state lives. Every write is one atomic conditional step.
pub trait BreakerStore: Send + Sync {
    /// Returns the current state (closed when none is stored).
    fn read(&self) -> BoxFuture<'_, Result<BreakerState, ProcessError>>;
    /// Counts `n` transient failures in the window that started at `window_start` (a new
    /// window when the stored one is older than `window`); returns the state after.
    fn add_failures(
        &self,
        n: u32,
        now: SystemTime,
        window: Duration,
    ) -> BoxFuture<'_, Result<BreakerState, ProcessError>>;
    /// Opens until `until` (the `opens`-th time), unless it is already open; `true` when
    /// this call opened it.
    fn open(
        &self,
        until: SystemTime,
        opens: u32,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>>;
    /// Takes the probe until `until`, if the open period is over and no probe runs.
    fn take_probe(
        &self,
        until: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>>;
    /// Closes: the downstream answered again.
    fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>>;
    /// Gives back the probe taken until `until`, if it is still that one: the run that
    /// took it called nothing, so another may probe at once.
    fn release_probe(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>>;
}

/// Tells whether a failure of the downstream counts towards opening the breaker: those that
/// say it is unwell, not that the item is bad.
pub fn counts(error: &ProcessError) -> bool {
    matches!(
        error.class,
        ErrorClass::ServerError
            | ErrorClass::Timeout
            | ErrorClass::Connection
            | ErrorClass::Throttled
    ) && !error.is_breaker_refusal()
}

/// Returns the open period after `opens` openings in a row.
pub fn open_period(policy: &BreakerPolicy, opens: u32) -> Duration {
    let factor = 1u32
        .checked_shl(opens.saturating_sub(1).min(16))
        .unwrap_or(u32::MAX);
    policy.open_for.saturating_mul(factor).min(policy.max_open)
}

/// A processor behind a shared circuit breaker.
///
/// What one sandbox costs the shared item (docs/ARCHITECTURE.md §7): at most one read per
/// [`BreakerPolicy::refresh`] whatever the number of records running at once (one read in
/// flight, the others wait for it; a read that fails keeps the last state known for the
/// period, so a throttled table neither fails the breaker open nor is read harder);
/// failures are counted locally and written at most once per period (at once when this
/// sandbox alone reaches the threshold); a probe is tried at most once per half-open
/// period. The writes on the item are thus bounded by the breaker's transitions, not by
/// the failures or records of a fleet.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use sqs_keeper_core::breaker::{Breaker, BreakerPolicy, BreakerStore};
/// use sqs_keeper_core::testing::{MemoryBreakerStore, ScriptedProcessor};
/// use sqs_keeper_core::{Processor, WorkItem};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// // Another sandbox opened the shared breaker a moment ago, for a minute.
/// let store = MemoryBreakerStore::default();
/// let now = SystemTime::now();
/// store.open(now + Duration::from_secs(60), 1, now).await.unwrap();
///
/// let policy = BreakerPolicy {
///     threshold: 5,
///     window: Duration::from_secs(60),
///     open_for: Duration::from_secs(60),
///     max_open: Duration::from_secs(960),
///     probe_for: Duration::from_secs(60),
///     refresh: Duration::from_secs(5),
/// };
/// let guarded = Breaker::new(ScriptedProcessor::new(), store, policy);
/// let refused = guarded.process(&WorkItem::new("m-1", "{}")).await.unwrap_err();
/// // Refused without calling the processor: the record goes back to the queue.
/// assert!(refused.is_breaker_refusal());
/// # });
/// ```
#[derive(Debug)]
pub struct Breaker<P, S> {
    inner: P,
    store: S,
    policy: BreakerPolicy,
    /// The state this sandbox last read (or learnt from its own writes), and when
    /// (tokio's clock).
    cached: Mutex<Option<(tokio::time::Instant, BreakerState)>>,
    /// One read of the store at a time: the records waiting for it use its answer.
    reading: tokio::sync::Mutex<()>,
    /// Failures counted here and not yet written, and when they were last written.
    unwritten: Mutex<(u32, Option<tokio::time::Instant>)>,
    /// This sandbox's attempt to open failed (a throttled write): the next count it writes
    /// at or over the threshold tries again, since no later write crosses it.
    open_failed: std::sync::atomic::AtomicBool,
    /// When a call to the store last succeeded (tokio's clock): a sandbox out of touch
    /// with it for a whole open period probes on its own ([`Breaker::out_of_touch`]).
    last_contact: Mutex<Option<tokio::time::Instant>>,
    /// The wall clock the breaker's periods are read by ([`Breaker::with_clock`]).
    clock: Clock,
    /// This sandbox's one probe slot: of the records that find the breaker half-open at
    /// once, one probes and the others are refused, whatever the table answers. Without
    /// it, a table out of reach let every one of them probe on its own.
    probe_slot: tokio::sync::Mutex<()>,
}

impl<P, S> Breaker<P, S> {
    /// Puts `inner` behind the breaker kept in `store`.
    pub fn new(inner: P, store: S, policy: BreakerPolicy) -> Self {
        Breaker {
            inner,
            store,
            policy,
            cached: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
            unwritten: Mutex::new((0, None)),
            open_failed: std::sync::atomic::AtomicBool::new(false),
            last_contact: Mutex::new(None),
            clock: Clock::default(),
            probe_slot: tokio::sync::Mutex::new(()),
        }
    }

    /// Reads wall time (open periods, probe locks, failure windows) from `clock` (the
    /// system clock unless set). The sandboxes sharing a breaker read the same time.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Returns the processor inside.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Tells whether this sandbox knows nothing of it worth keeping: closed as last known, no
    /// probe, no failure counted and unwritten (a breaker of a group that went quiet,
    /// which [`GroupBreakers`] may drop).
    fn is_idle(&self) -> bool {
        let quiet = self
            .unwritten
            .lock()
            .map(|unwritten| unwritten.0 == 0)
            .unwrap_or(false);
        let closed = self.cached.lock().is_ok_and(|cached| {
            cached
                .as_ref()
                .is_none_or(|(_, state)| state.open_until.is_none() && state.probe_until.is_none())
        });
        quiet && closed
    }
}

/// The user's processor shared by the breakers of every message group.
#[derive(Debug)]
pub struct SharedProcessor<P>(std::sync::Arc<P>);

impl<P: Processor> Processor for SharedProcessor<P> {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        self.0.process(item).await
    }

    fn attempt_timeout(&self) -> Option<Duration> {
        self.0.attempt_timeout()
    }

    async fn on_dead_letter(
        &self,
        dead: &crate::processor::DeadLettered<'_>,
    ) -> Result<(), ProcessError> {
        self.0.on_dead_letter(dead).await
    }
}

/// The metric a record the breaker refused adds to its invocation's EMF document.
pub const REFUSED_METRIC: &str = "BreakerRefused";
/// The metric an opening of the breaker adds.
pub const OPENED_METRIC: &str = "BreakerOpened";
/// The metric a probe that closed the breaker adds.
pub const CLOSED_METRIC: &str = "BreakerClosed";
/// Every metric the breaker adds: the dashboard plots them.
pub const METRICS: [&str; 3] = [REFUSED_METRIC, OPENED_METRIC, CLOSED_METRIC];

/// Most group breakers a sandbox keeps; past it, those of quiet groups are dropped, and a
/// group that finds no room runs behind a breaker of its own for that record only.
pub const MAX_GROUP_BREAKERS: usize = 4096;

/// One group's breaker, shared by the records of the group running at once.
type GroupBreaker<P, S> = std::sync::Arc<Breaker<SharedProcessor<P>, S>>;

/// A circuit breaker per message group (`WORKER_BREAKER_SCOPE=message-group`): on a fair
/// queue each tenant (a standard queue's `MessageGroupId`) or on a FIFO queue each group
/// has its own breaker, its own item in the table (`<breaker key>#group#<group>`), so that
/// a tenant whose own downstream fails opens the breaker for its records only. Records
/// without a group share the function's breaker. Each group's breaker is the [`Breaker`]
/// (its reads, writes and probe as for the function's); a sandbox keeps at most
/// [`MAX_GROUP_BREAKERS`] of them. The polling control watches the function's breaker only:
/// one tenant's outage never stops the worker's polling.
pub struct GroupBreakers<P, S, F> {
    inner: std::sync::Arc<P>,
    stores: F,
    policy: BreakerPolicy,
    breakers: Mutex<HashMap<Option<String>, GroupBreaker<P, S>>>,
    /// The wall clock every group's breaker reads ([`Breaker::with_clock`]).
    clock: Clock,
}

impl<P, S, F> std::fmt::Debug for GroupBreakers<P, S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let groups = self.breakers.lock().map_or(0, |b| b.len());
        f.debug_struct("GroupBreakers")
            .field("policy", &self.policy)
            .field("groups", &groups)
            .finish()
    }
}

impl<P, S, F> GroupBreakers<P, S, F>
where
    F: Fn(Option<&str>) -> S,
{
    /// Puts `inner` behind a breaker per message group. `stores` gives the store of a
    /// group's breaker (`None`: the function's, for records without a group).
    pub fn new(inner: P, stores: F, policy: BreakerPolicy) -> Self {
        GroupBreakers {
            inner: std::sync::Arc::new(inner),
            stores,
            policy,
            breakers: Mutex::new(HashMap::new()),
            clock: Clock::default(),
        }
    }

    /// Makes every group's breaker read wall time from `clock` (the system clock unless set).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Returns the processor inside.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Returns the breaker of `group`, kept for the next records of the group when there is room.
    fn breaker(&self, group: Option<&str>) -> GroupBreaker<P, S> {
        let key = group.map(str::to_string);
        let make = || {
            std::sync::Arc::new(
                Breaker::new(
                    SharedProcessor(self.inner.clone()),
                    (self.stores)(group),
                    self.policy,
                )
                .with_clock(self.clock),
            )
        };
        let Ok(mut breakers) = self.breakers.lock() else {
            return make();
        };
        if let Some(breaker) = breakers.get(&key) {
            return breaker.clone();
        }
        if breakers.len() >= MAX_GROUP_BREAKERS {
            breakers.retain(|_, b| std::sync::Arc::strong_count(b) > 1 || !b.is_idle());
        }
        let breaker = make();
        if breakers.len() < MAX_GROUP_BREAKERS {
            breakers.insert(key, breaker.clone());
        }
        breaker
    }
}

impl<P, S, F> Processor for GroupBreakers<P, S, F>
where
    P: Processor,
    S: BreakerStore,
    F: Fn(Option<&str>) -> S + Send + Sync,
{
    fn attempt_timeout(&self) -> Option<Duration> {
        self.inner.attempt_timeout()
    }

    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        self.breaker(item.message_group_id.as_deref())
            .process(item)
            .await
    }

    async fn on_dead_letter(
        &self,
        dead: &crate::processor::DeadLettered<'_>,
    ) -> Result<(), ProcessError> {
        self.inner.on_dead_letter(dead).await
    }
}

/// Returns the item of `group`'s breaker beside the function's breaker item `key`.
pub fn group_key(key: &str, group: &str) -> String {
    format!("{key}#group#{group}")
}

/// Returns the error of a record the open breaker refused, with a `Retry-After` to the end of the
/// open period (its next delivery is hidden until then).
fn refused(until: SystemTime, now: SystemTime, why: &str) -> ProcessError {
    let wait = until.duration_since(now).unwrap_or(Duration::ZERO);
    refusal(format!(
        "the circuit breaker is open ({why}): the downstream was not called; retried in {} s",
        wait.as_secs()
    ))
    .with_retry_after(wait)
}

/// Returns the error of a record refused while another sandbox probes: no `Retry-After`, since the
/// probe's answer may come at any moment (its lock only bounds it); the record is spaced
/// as any record returned for retry.
fn refused_while_probing() -> ProcessError {
    refusal(
        "the circuit breaker is half-open and another sandbox is probing: the downstream was not called"
            .to_string(),
    )
}

fn refusal(message: String) -> ProcessError {
    crate::context::add_own_metric(REFUSED_METRIC, crate::context::Unit::Count, 1.0);
    ProcessError::new(ErrorClass::ServerError, message)
        .with_code(CIRCUIT_OPEN)
        .with_step("breaker")
}

/// What a probe may take beyond its call before the lock lapses.
pub const PROBE_SLACK: Duration = Duration::from_secs(5);

impl<P: Processor, S: BreakerStore> Breaker<P, S> {
    fn fresh(&self) -> Option<BreakerState> {
        self.cached.lock().ok().and_then(|c| {
            c.as_ref()
                .filter(|(at, _)| at.elapsed() < self.policy.refresh)
                .map(|(_, s)| s.clone())
        })
    }

    async fn state(&self) -> BreakerState {
        if let Some(state) = self.fresh() {
            return state;
        }
        let _reading = self.reading.lock().await;
        // Another record may have read it while this one waited.
        if let Some(state) = self.fresh() {
            return state;
        }
        match self.store.read().await {
            Ok(state) => {
                self.touch();
                if state.open_until.is_some() {
                    // Failures counted here before it opened belong to the window that
                    // opened it.
                    self.forget_failures();
                }
                self.remember(&state);
                state
            }
            Err(error) => {
                // The last state known holds for the period (closed when none is known):
                // an open breaker stays open, and the table is not read harder.
                let known = self
                    .cached
                    .lock()
                    .ok()
                    .and_then(|c| c.as_ref().map(|(_, s)| s.clone()))
                    .unwrap_or_default();
                tracing::warn!(%error, open = known.open_until.is_some(), "circuit breaker state unreadable; the last state known holds for now");
                self.remember(&known);
                known
            }
        }
    }

    /// Notes that a call to the store succeeded.
    fn touch(&self) {
        if let Ok(mut last) = self.last_contact.lock() {
            *last = Some(tokio::time::Instant::now());
        }
    }

    /// Tells whether no call to the store has succeeded for a whole open period (the table is
    /// unavailable, not just throttling a hot item): the sandbox then keeps a breaker of
    /// its own rather than refuse every record until the table is back while the
    /// downstream may have recovered long ago.
    fn out_of_touch(&self) -> bool {
        self.last_contact
            .lock()
            .ok()
            .and_then(|last| *last)
            .is_none_or(|at| at.elapsed() >= self.policy.open_for)
    }

    fn remember(&self, state: &BreakerState) {
        if let Ok(mut cached) = self.cached.lock() {
            *cached = Some((tokio::time::Instant::now(), state.clone()));
        }
    }

    /// Notes who holds the probe (`probe_until`) on the state this sandbox knows now, or on
    /// `read` when it knows none. Not on `read` itself: it is what this record read before
    /// its probe, and another record of the sandbox may have opened the breaker since. A
    /// probe's bookkeeping written over that would take the sandbox back to the half-open
    /// it had read, and it would call the downstream while it knows the breaker open.
    fn remember_probe(&self, read: &BreakerState, probe_until: Option<SystemTime>) {
        if let Ok(mut cached) = self.cached.lock() {
            let stale = crate::mutants::is_on(crate::mutants::Mutant::ProbeRemembersStaleState);
            let mut state = match cached.as_ref() {
                Some((_, known)) if !stale => known.clone(),
                _ => read.clone(),
            };
            state.probe_until = probe_until;
            *cached = Some((tokio::time::Instant::now(), state));
        }
    }

    /// Counts one failure of the downstream; written now when this sandbox's count reaches
    /// the threshold or its last write is a period old. The write that takes the window's
    /// count across the threshold opens the breaker: one opening per outage, not one per
    /// sandbox that sees the count.
    async fn after_failure(&self, error: &ProcessError, state: &BreakerState) {
        if !counts(error) {
            return;
        }
        if let Ok(mut unwritten) = self.unwritten.lock() {
            unwritten.0 = unwritten.0.saturating_add(1);
        }
        let Some((written, counted)) = self.write_failures().await else {
            return;
        };
        let now = self.clock.system_time();
        let crossed = counted.failures >= self.policy.threshold
            && (counted.failures.saturating_sub(written) < self.policy.threshold
                || self.open_failed.load(std::sync::atomic::Ordering::Relaxed));
        // A probe running decides alone: failures of calls that began before the breaker
        // opened do not reopen it under the probe (a reopening drops the probe's lock, and
        // a second probe then ran beside the first).
        let probing = counted.is_half_open(now) && counted.probe_until.is_some_and(|p| p > now);
        if crossed && !counted.is_open(now) && !probing {
            let opens = state.opens.max(counted.opens) + 1;
            self.open(opens, now, "failures in the window reached the threshold")
                .await;
        }
    }

    /// Writes the failures counted here when due: how many, and the state after.
    async fn write_failures(&self) -> Option<(u32, BreakerState)> {
        let n = {
            let mut unwritten = self.unwritten.lock().ok()?;
            let (n, last) = *unwritten;
            let due = n >= self.policy.threshold
                || last.is_none_or(|at| at.elapsed() >= self.policy.refresh);
            if n == 0 || !due {
                return None;
            }
            *unwritten = (0, Some(tokio::time::Instant::now()));
            n
        };
        let now = self.clock.system_time();
        match self.store.add_failures(n, now, self.policy.window).await {
            Ok(counted) => {
                self.touch();
                self.remember(&counted);
                Some((n, counted))
            }
            Err(e) => {
                tracing::warn!(error = %e, failures = n, "could not count failures in the circuit breaker");
                None
            }
        }
    }

    /// Drops the failures counted here and not written: they belong to a window the
    /// transition just ended.
    fn forget_failures(&self) {
        if let Ok(mut unwritten) = self.unwritten.lock() {
            unwritten.0 = 0;
        }
    }

    /// Opens the breaker (the `opens`-th time); whether the store took the write.
    async fn open(&self, opens: u32, now: SystemTime, why: &str) -> bool {
        let period = open_period(&self.policy, opens);
        let until = now + period;
        match self.store.open(until, opens, now).await {
            Ok(true) => {
                self.touch();
                self.open_failed
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    open_secs = period.as_secs(),
                    opens,
                    "circuit breaker opened: {why}; the downstream is not called for {} s",
                    period.as_secs()
                );
                crate::context::add_own_metric(OPENED_METRIC, crate::context::Unit::Count, 1.0);
                self.forget_failures();
                self.remember(&BreakerState {
                    open_until: Some(until),
                    opens,
                    ..BreakerState::default()
                });
                true
            }
            Ok(false) => {
                self.touch();
                if let Ok(state) = self.store.read().await {
                    self.remember(&state);
                }
                true
            }
            Err(e) => {
                self.open_failed
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(error = %e, "could not open the circuit breaker; the next failure counted tries again");
                false
            }
        }
    }

    /// Gives the probe back after a probe that decided nothing: the breaker stays half-open
    /// and the next record probes at once, rather than every record being refused until
    /// the lock lapses.
    async fn give_back_probe(&self, lock: SystemTime, state: &BreakerState, on_its_own: bool) {
        if !on_its_own {
            match self.store.release_probe(lock).await {
                Ok(()) => self.touch(),
                Err(e) => {
                    tracing::warn!(error = %e, "could not give back the circuit breaker's probe; it lapses by itself");
                }
            }
        }
        tracing::info!(
            "the probe never reached the downstream: the circuit breaker stays half-open"
        );
        self.remember_probe(state, None);
    }

    /// Returns how long the probe's lock lasts: the configured time, and at least as long as the
    /// probe's call can run (its timeout, bounded by the invocation's cut-off), so that
    /// no second probe starts while the first still runs.
    fn probe_lock(&self) -> Duration {
        let call = match (self.inner.attempt_timeout(), crate::context::remaining()) {
            (Some(timeout), Some(left)) => timeout.min(left),
            (Some(timeout), None) => timeout,
            (None, Some(left)) => left,
            (None, None) => Duration::ZERO,
        };
        self.policy.probe_for.max(call.saturating_add(PROBE_SLACK))
    }

    /// Returns the user's call, cut at the invocation's cut-off into a `timeout` failure that the
    /// breaker counts (`crate::context::until_cut`).
    async fn call(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let started = tokio::time::Instant::now();
        crate::context::until_cut(self.inner.process(item))
            .await
            .unwrap_or_else(|| Err(ProcessError::deadline_cut(started.elapsed())))
    }

    async fn probe(
        &self,
        item: &WorkItem,
        state: &BreakerState,
        now: SystemTime,
    ) -> Result<Outcome, ProcessError> {
        let _slot = match self.probe_slot.try_lock() {
            Ok(slot) => Some(slot),
            Err(_) if crate::mutants::is_on(crate::mutants::Mutant::ProbeSlotShared) => None,
            Err(_) => return Err(refused_while_probing()),
        };
        let lock = now + self.probe_lock();
        let taken = self.store.take_probe(lock, now).await;
        // The table out of reach for a whole open period: this sandbox probes on its own
        // (its other records wait for it), and keeps what the probe says to itself if the
        // table still takes no write: one probe per sandbox and open period, not a
        // refusal of every record for as long as the table is down.
        let on_its_own = taken.is_err() && self.out_of_touch();
        if taken.is_ok() {
            self.touch();
        }
        if !matches!(taken, Ok(true)) && !on_its_own {
            // Somebody else probes (or the lock cannot be taken): not tried again here
            // until the lock lapses or the state is read again.
            if let Err(e) = &taken {
                tracing::warn!(error = %e, "could not take the circuit breaker's probe");
            }
            self.remember_probe(state, Some(lock));
            return Err(refused_while_probing());
        }
        if on_its_own {
            tracing::warn!(
                "the circuit breaker's table has been out of reach for an open period: this sandbox probes on its own"
            );
            self.remember_probe(state, Some(lock));
        }
        // A panicking handler decides nothing either: the probe goes back before the panic
        // goes on to the batch, which fails the record (not every sandbox's records until
        // the lock lapses).
        let call = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(self.call(item)));
        let result = match call.await {
            Ok(result) => result,
            Err(panic) => {
                crate::context::finishing(self.give_back_probe(lock, state, on_its_own)).await;
                std::panic::resume_unwind(panic);
            }
        };
        // Boxed: the decision's writes are futures of their own, and the probe's future sits
        // inside every record's.
        crate::context::finishing(Box::pin(
            self.decide_probe(&result, lock, state, on_its_own),
        ))
        .await;
        result
    }

    /// Decides from the probe's `result`, and writes the breaker's state: a counted failure opens the breaker again for
    /// longer; a failure or a skip that never reached the downstream gives the probe back;
    /// any other answer closes the breaker. A sandbox probing on its own (`on_its_own`)
    /// keeps the answer to itself when the table takes no write.
    async fn decide_probe(
        &self,
        result: &Result<Outcome, ProcessError>,
        lock: SystemTime,
        state: &BreakerState,
        on_its_own: bool,
    ) {
        let after = self.clock.system_time();
        match result {
            Err(error) if counts(error) => {
                let opens = state.opens + 1;
                if !self.open(opens, after, "the probe failed").await {
                    // Open here, for as long as the store would have been told.
                    self.remember(&BreakerState {
                        open_until: Some(after + open_period(&self.policy, opens)),
                        opens,
                        ..BreakerState::default()
                    });
                }
            }
            Err(error)
                if !downstream_answered(error)
                    && !crate::mutants::is_on(
                        crate::mutants::Mutant::ProbeDecidedWithoutDownstream,
                    ) =>
            {
                self.give_back_probe(lock, state, on_its_own).await;
            }
            // A skip never called the downstream (a completed idempotency key, a
            // handler's own filter): it decides nothing either.
            Ok(Outcome::Skipped { .. })
                if !crate::mutants::is_on(crate::mutants::Mutant::ProbeClosedBySkippedItem) =>
            {
                self.give_back_probe(lock, state, on_its_own).await;
            }
            _ => match self.store.close().await {
                Ok(()) => {
                    self.touch();
                    tracing::info!(
                        opens = state.opens,
                        "circuit breaker closed: the probe succeeded"
                    );
                    crate::context::add_own_metric(CLOSED_METRIC, crate::context::Unit::Count, 1.0);
                    self.forget_failures();
                    self.remember(&BreakerState::default());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not close the circuit breaker");
                    if on_its_own {
                        // Closed here: the downstream answered this sandbox's probe.
                        self.forget_failures();
                        self.remember(&BreakerState::default());
                    }
                }
            },
        }
    }
}

/// Tells whether a failure carries the downstream's answer: a response status or a service's
/// error code. A failure without either (a handler's own decode error) never reached the
/// downstream, and a probe it ends decides nothing.
fn downstream_answered(error: &ProcessError) -> bool {
    !error.is_breaker_refusal() && (error.status.is_some() || error.code.is_some())
}

impl<P: Processor, S: BreakerStore> Processor for Breaker<P, S> {
    fn attempt_timeout(&self) -> Option<Duration> {
        self.inner.attempt_timeout()
    }

    async fn on_dead_letter(
        &self,
        dead: &crate::processor::DeadLettered<'_>,
    ) -> Result<(), ProcessError> {
        // The hook is the handler's, not a call of the downstream: the breaker does not
        // hold it back.
        self.inner.on_dead_letter(dead).await
    }

    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let state = self.state().await;
        let now = self.clock.system_time();
        if let Some(until) = state.open_until.filter(|_| state.is_open(now)) {
            return Err(refused(until, now, "the downstream is failing"));
        }
        if state
            .probe_until
            .is_some_and(|until| state.is_half_open(now) && now < until)
        {
            return Err(refused_while_probing());
        }
        if state.is_half_open(now)
            && !crate::mutants::is_on(crate::mutants::Mutant::HalfOpenWithoutProbe)
        {
            return self.probe(item, &state, now).await;
        }
        let result = self.call(item).await;
        if let Err(error) = &result {
            crate::context::finishing(self.after_failure(error, &state)).await;
        }
        result
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemoryBreakerStore;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    struct Downstream {
        up: Arc<AtomicBool>,
        calls: Arc<AtomicU32>,
    }

    impl Processor for Downstream {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.up.load(Ordering::SeqCst) {
                Ok(Outcome::Done)
            } else {
                Err(ProcessError::new(ErrorClass::ServerError, "503"))
            }
        }
    }

    fn policy() -> BreakerPolicy {
        BreakerPolicy {
            threshold: 3,
            window: Duration::from_secs(60),
            open_for: Duration::from_millis(300),
            max_open: Duration::from_secs(3),
            probe_for: Duration::from_secs(10),
            refresh: Duration::ZERO,
        }
    }

    fn sandbox(
        store: &MemoryBreakerStore,
        up: &Arc<AtomicBool>,
        calls: &Arc<AtomicU32>,
    ) -> Breaker<Downstream, MemoryBreakerStore> {
        Breaker::new(
            Downstream {
                up: up.clone(),
                calls: calls.clone(),
            },
            store.clone(),
            policy(),
        )
    }

    /// The memory store, counting the probes asked of it.
    #[derive(Clone, Default)]
    struct CountingProbes {
        inner: MemoryBreakerStore,
        asked: Arc<AtomicU32>,
    }

    impl BreakerStore for CountingProbes {
        fn read(&self) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
            self.inner.read()
        }
        fn add_failures(
            &self,
            n: u32,
            now: SystemTime,
            window: Duration,
        ) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
            self.inner.add_failures(n, now, window)
        }
        fn open(
            &self,
            until: SystemTime,
            opens: u32,
            now: SystemTime,
        ) -> BoxFuture<'_, Result<bool, ProcessError>> {
            self.inner.open(until, opens, now)
        }
        fn take_probe(
            &self,
            until: SystemTime,
            now: SystemTime,
        ) -> BoxFuture<'_, Result<bool, ProcessError>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            self.inner.take_probe(until, now)
        }
        fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
            self.inner.close()
        }
        fn release_probe(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
            self.inner.release_probe(until)
        }
    }

    #[tokio::test]
    async fn a_sandbox_that_found_the_probe_taken_refuses_without_asking_again_until_its_lock_lapses(
    ) {
        // Open, then past the open period another sandbox holds the probe. This one asks
        // once, finds it taken, and remembers the lock: the calls that follow within its
        // refresh period are refused without a write to the table each.
        let store = CountingProbes::default();
        let now = SystemTime::now();
        assert!(store
            .inner
            .open(now + Duration::from_millis(200), 1, now)
            .await
            .unwrap());
        let up = Arc::new(AtomicBool::new(true));
        let calls = Arc::new(AtomicU32::new(0));
        let sandbox = Breaker::new(
            Downstream {
                up: up.clone(),
                calls: calls.clone(),
            },
            store.clone(),
            BreakerPolicy {
                refresh: Duration::from_secs(60),
                ..policy()
            },
        );
        let item = WorkItem::new("m", "{}");
        // Read while open: refused, and the state is kept for the refresh period.
        assert!(sandbox.process(&item).await.is_err());
        tokio::time::sleep(Duration::from_millis(250)).await;
        let later = SystemTime::now();
        assert!(store
            .inner
            .take_probe(later + Duration::from_secs(10), later)
            .await
            .unwrap());
        for _ in 0..3 {
            assert!(sandbox.process(&item).await.is_err());
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "the downstream is never called"
        );
        assert_eq!(
            store.asked.load(Ordering::SeqCst),
            1,
            "the probe is asked for once"
        );
    }

    #[tokio::test]
    async fn an_outage_opens_the_breaker_for_every_sandbox_and_one_probe_closes_it() {
        let store = MemoryBreakerStore::default();
        let up = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU32::new(0));
        let a = sandbox(&store, &up, &calls);
        let b = sandbox(&store, &up, &calls);
        let item = WorkItem::new("m", "{}");
        for _ in 0..3 {
            assert_eq!(
                a.process(&item).await.unwrap_err().class,
                ErrorClass::ServerError
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Open: neither sandbox calls the downstream; the refusal says until when.
        for sandbox in [&a, &b] {
            let refused = sandbox.process(&item).await.unwrap_err();
            assert_eq!(refused.code.as_deref(), Some(CIRCUIT_OPEN));
            assert!(refused.class.is_retryable(false));
            assert!(refused.retry_after.unwrap() > Duration::from_millis(200));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // After the open period a probe runs; it fails: open again, for twice as long.
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(b.process(&item).await.unwrap_err().code, None);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        let refused = a.process(&item).await.unwrap_err();
        assert!(
            refused.retry_after.unwrap() > Duration::from_millis(450),
            "{refused:?}"
        );
        // The downstream recovers: the next probe closes it for everyone.
        up.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(650)).await;
        assert_eq!(a.process(&item).await.unwrap(), Outcome::Done);
        assert_eq!(b.process(&item).await.unwrap(), Outcome::Done);
        assert_eq!(calls.load(Ordering::SeqCst), 6);
        assert!(!store.state().is_open(SystemTime::now()));
    }

    /// A downstream up, refusing every item as bad.
    struct RefusesBadItems {
        calls: Arc<AtomicU32>,
    }

    impl Processor for RefusesBadItems {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Err(ProcessError::from_http_status(400, "no such order"))
        }
    }

    /// A handler failing before it calls the downstream (its own decode error).
    struct FailsBeforeCalling {
        calls: Arc<AtomicU32>,
    }

    impl Processor for FailsBeforeCalling {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Err(ProcessError::validation("the body is not an order"))
        }
    }

    /// A breaker opened a while ago whose open period is over: half-open, no probe.
    async fn half_open_store() -> MemoryBreakerStore {
        let store = MemoryBreakerStore::default();
        open_a_while_ago(&store).await;
        store
    }

    /// Opens `store`'s breaker two seconds ago, for one: it is half-open now.
    async fn open_a_while_ago(store: &MemoryBreakerStore) {
        let now = SystemTime::now();
        assert!(store
            .open(
                now - Duration::from_secs(1),
                1,
                now - Duration::from_secs(2)
            )
            .await
            .unwrap());
    }

    /// Only the downstream's answer decides a probe: a failure that never reached it
    /// leaves the breaker half-open with the probe given back (it closed the breaker, so
    /// every record went to a downstream nobody had heard from).
    #[tokio::test]
    async fn a_probe_that_never_reached_the_downstream_decides_nothing() {
        let store = half_open_store().await;
        let calls = Arc::new(AtomicU32::new(0));
        let sandbox = Breaker::new(
            FailsBeforeCalling {
                calls: calls.clone(),
            },
            store.clone(),
            policy(),
        );
        let item = WorkItem::new("m", "{}");
        let probe = sandbox.process(&item).await.unwrap_err();
        assert_eq!(probe.class, ErrorClass::Validation);
        let state = store.state();
        let now = SystemTime::now();
        assert!(state.is_half_open(now), "{state:?}");
        assert_eq!((state.opens, state.probe_until), (1, None), "{state:?}");
        // The next record is the next probe, at once.
        sandbox.process(&item).await.unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// A handler that ends every item with `outcome`, counting its calls.
    struct EndsWith {
        outcome: Outcome,
        calls: Arc<AtomicU32>,
    }

    impl Processor for EndsWith {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(self.outcome.clone())
        }
    }

    /// A probe of a half-open breaker whose processor ends every item with `outcome`:
    /// what it returned, and the breaker's state after it.
    async fn probe_ending_with(outcome: Outcome) -> (Result<Outcome, ProcessError>, BreakerState) {
        let store = half_open_store().await;
        let calls = Arc::new(AtomicU32::new(0));
        let sandbox = Breaker::new(EndsWith { outcome, calls }, store.clone(), policy());
        let result = sandbox.process(&WorkItem::new("m", "{}")).await;
        (result, store.state())
    }

    /// A skipped probe never called the downstream: a message group's breaker in front of
    /// a completed idempotency key closed on it, and sent the group's records to a
    /// downstream nobody had heard from. It leaves the breaker half-open.
    #[tokio::test]
    async fn a_skipped_probe_decides_nothing() {
        let (result, state) = probe_ending_with(Outcome::Skipped {
            reason: "already processed (idempotency record)".to_string(),
        })
        .await;
        assert!(matches!(result, Ok(Outcome::Skipped { .. })));
        assert!(state.is_half_open(SystemTime::now()), "{state:?}");
        assert_eq!((state.opens, state.probe_until), (1, None), "{state:?}");
    }

    /// A downstream answering that it had done the item before (208) answered: the probe
    /// closes the breaker.
    #[tokio::test]
    async fn a_probe_the_downstream_answers_already_done_closes_the_breaker() {
        let (result, state) = probe_ending_with(Outcome::AlreadyDone {
            reason: "downstream had already processed the item (208)".to_string(),
        })
        .await;
        assert!(result.is_ok());
        assert!(!state.is_open(SystemTime::now()), "{state:?}");
        assert_eq!(state.opens, 0, "{state:?}");
    }

    /// Simulation seed 33300: two records of one sandbox found its breaker half-open while
    /// the table was unavailable. One probed and its 503s opened the breaker for ten
    /// minutes; the other's probe bookkeeping then wrote the half-open it had read over
    /// that, and the sandbox called the downstream a minute later, the breaker it knew
    /// open. The bookkeeping now keeps the newer state the sandbox learnt.
    #[test]
    fn a_probes_bookkeeping_keeps_an_opening_learnt_meanwhile() {
        let sandbox = Breaker::new(
            SlowlyFailing {
                calls: Arc::new(AtomicU32::new(0)),
            },
            MemoryBreakerStore::default(),
            policy(),
        );
        let now = SystemTime::now();
        let read_half_open = BreakerState {
            open_until: Some(now - Duration::from_secs(1)),
            opens: 5,
            ..BreakerState::default()
        };
        let opened_since = BreakerState {
            open_until: Some(now + Duration::from_secs(600)),
            opens: 6,
            ..BreakerState::default()
        };
        sandbox.remember(&read_half_open);
        sandbox.remember(&opened_since);
        sandbox.remember_probe(&read_half_open, Some(now + Duration::from_secs(35)));
        sandbox.remember_probe(&read_half_open, None);
        let known = sandbox.cached.lock().unwrap().clone().unwrap().1;
        assert_eq!(known.open_until, opened_since.open_until, "{known:?}");
        assert!(known.is_open(now));
    }

    /// A downstream that answers 503 after a while.
    struct SlowlyFailing {
        calls: Arc<AtomicU32>,
    }

    impl Processor for SlowlyFailing {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err(ProcessError::from_http_status(503, "unavailable"))
        }
    }

    /// A sandbox out of touch with the table for an open period probes on its own, with
    /// one record: the others that find it half-open at the same moment are refused.
    /// Each took the (failing) lock and called the failing downstream.
    #[tokio::test]
    async fn a_sandbox_out_of_touch_with_the_table_probes_with_one_record() {
        let table = crate::unreachable_store_tests::FlakyBreakerStore {
            // A connection that times out takes a while to fail.
            latency: Duration::from_millis(10),
            ..Default::default()
        };
        let now = SystemTime::now();
        assert!(table
            .inner
            .open(now + Duration::from_millis(300), 1, now)
            .await
            .unwrap());
        let calls = Arc::new(AtomicU32::new(0));
        // A sandbox trusts what it read for the refresh period, as in production (5 s):
        // the records that find it half-open come at the probe together.
        let sandbox = Breaker::new(
            SlowlyFailing {
                calls: calls.clone(),
            },
            table.clone(),
            BreakerPolicy {
                refresh: Duration::from_secs(5),
                ..policy()
            },
        );
        let item = WorkItem::new("m", "{}");
        // Read open; then the table goes away for longer than the open period.
        let refused = sandbox.process(&item).await.unwrap_err();
        assert!(refused.is_breaker_refusal(), "{refused:?}");
        table.down.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let sandbox = Arc::new(sandbox);
        let records: Vec<_> = (0..10)
            .map(|n| {
                let sandbox = sandbox.clone();
                tokio::spawn(
                    async move { sandbox.process(&WorkItem::new(format!("m{n}"), "{}")).await },
                )
            })
            .collect();
        let mut results = Vec::new();
        for record in records {
            results.push(record.await.unwrap());
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "one probe, not one per record"
        );
        let refusals = results
            .iter()
            .filter(|r| r.as_ref().is_err_and(ProcessError::is_breaker_refusal))
            .count();
        assert_eq!(refusals, 9);
    }

    /// A probe whose item is bad found the downstream answering: it closes the breaker.
    /// Counted as a failed probe, it opened the breaker again for twice as long, and a
    /// downstream that was up stayed cut off for as long as bad items came first.
    #[tokio::test]
    async fn a_probe_refused_as_a_bad_item_closes_the_breaker() {
        let store = MemoryBreakerStore::default();
        let now = SystemTime::now();
        assert!(store
            .open(
                now - Duration::from_secs(1),
                1,
                now - Duration::from_secs(2)
            )
            .await
            .unwrap());
        let calls = Arc::new(AtomicU32::new(0));
        let sandbox = Breaker::new(
            RefusesBadItems {
                calls: calls.clone(),
            },
            store.clone(),
            policy(),
        );
        let item = WorkItem::new("m", "{}");
        let probe = sandbox.process(&item).await.unwrap_err();
        assert_eq!(probe.class, ErrorClass::Validation);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the probe ran");
        let state = store.state();
        assert!(!state.is_open(SystemTime::now()), "{state:?}");
        assert_eq!(state.opens, 0, "{state:?}");
        // Closed: the next item reaches the downstream, not a refusal.
        let next = sandbox.process(&item).await.unwrap_err();
        assert_eq!(next.class, ErrorClass::Validation);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn bad_items_do_not_open_it_and_open_periods_are_capped() {
        assert!(!counts(&ProcessError::validation("bad")));
        assert!(!counts(&ProcessError::new(ErrorClass::NotFound, "gone")));
        assert!(counts(&ProcessError::new(ErrorClass::Timeout, "slow")));
        let p = policy();
        assert_eq!(open_period(&p, 1), Duration::from_millis(300));
        assert_eq!(open_period(&p, 2), Duration::from_millis(600));
        assert_eq!(open_period(&p, 40), Duration::from_secs(3));
    }

    /// The shared item, watched: its calls by kind, the last probe lock asked for, and a
    /// latency per call (DynamoDB's is about 10 ms).
    #[derive(Clone, Default)]
    struct Watched {
        inner: MemoryBreakerStore,
        latency: Duration,
        reads: Arc<AtomicU32>,
        writes: Arc<AtomicU32>,
        probe_lock: Arc<Mutex<Option<SystemTime>>>,
    }

    impl Watched {
        /// `call` after the store's latency, counted as a read or a write.
        fn call<'a, T: Send + 'a>(
            &'a self,
            write: bool,
            call: BoxFuture<'a, Result<T, ProcessError>>,
        ) -> BoxFuture<'a, Result<T, ProcessError>> {
            let counter = if write { &self.writes } else { &self.reads };
            counter.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(self.latency).await;
                call.await
            })
        }
    }

    impl BreakerStore for Watched {
        fn read(&self) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
            self.call(false, self.inner.read())
        }
        fn add_failures(
            &self,
            n: u32,
            now: SystemTime,
            window: Duration,
        ) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
            self.call(true, self.inner.add_failures(n, now, window))
        }
        fn open(
            &self,
            until: SystemTime,
            opens: u32,
            now: SystemTime,
        ) -> BoxFuture<'_, Result<bool, ProcessError>> {
            self.call(true, self.inner.open(until, opens, now))
        }
        fn take_probe(
            &self,
            until: SystemTime,
            now: SystemTime,
        ) -> BoxFuture<'_, Result<bool, ProcessError>> {
            *self.probe_lock.lock().unwrap() = Some(until);
            self.call(true, self.inner.take_probe(until, now))
        }
        fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
            self.call(true, self.inner.close())
        }
        fn release_probe(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
            self.call(true, self.inner.release_probe(until))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fleet_reads_once_per_sandbox_per_period_and_writes_by_transitions() {
        const SANDBOXES: usize = 1000;
        const RECORDS: usize = 10;
        let store = Watched {
            latency: Duration::from_millis(10),
            ..Watched::default()
        };
        let up = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU32::new(0));
        let policy = BreakerPolicy {
            threshold: 50,
            window: Duration::from_secs(60),
            open_for: Duration::from_secs(600),
            max_open: Duration::from_secs(600),
            probe_for: Duration::from_secs(60),
            refresh: Duration::from_secs(1),
        };
        let fleet: Vec<_> = (0..SANDBOXES)
            .map(|_| {
                Breaker::new(
                    Downstream {
                        up: up.clone(),
                        calls: calls.clone(),
                    },
                    store.clone(),
                    policy,
                )
            })
            .collect();
        let item = WorkItem::new("m", "{}");
        let mut per_second = Vec::new();
        for _ in 0..5 {
            let (reads, writes, called) = (
                store.reads.load(Ordering::SeqCst),
                store.writes.load(Ordering::SeqCst),
                calls.load(Ordering::SeqCst),
            );
            // Every sandbox runs a batch of records at once, four batches a second.
            for _ in 0..4 {
                futures::future::join_all(fleet.iter().map(|sandbox| {
                    futures::future::join_all((0..RECORDS).map(|_| sandbox.process(&item)))
                }))
                .await;
                tokio::time::advance(Duration::from_millis(250)).await;
            }
            per_second.push((
                store.reads.load(Ordering::SeqCst) - reads,
                store.writes.load(Ordering::SeqCst) - writes,
                calls.load(Ordering::SeqCst) - called,
            ));
        }
        for (second, (reads, writes, _)) in per_second.iter().enumerate() {
            // A read per sandbox per period at most, whatever the 40 records a second
            // each runs at ten at a time.
            assert!(
                *reads as usize <= SANDBOXES,
                "second {second}: {reads} reads for {SANDBOXES} sandboxes: {per_second:?}"
            );
            // Writes: each sandbox's failures once a period, and one opening.
            assert!(
                *writes as usize <= SANDBOXES + 1,
                "second {second}: {writes} writes: {per_second:?}"
            );
        }
        // Open within a period of the threshold: from the second period on, nothing calls
        // the downstream and nothing is written.
        assert!(store.inner.state().is_open(SystemTime::now()));
        assert_eq!(store.inner.state().opens, 1);
        for (second, (_, writes, called)) in per_second.iter().enumerate().skip(1) {
            assert_eq!(
                (*writes, *called),
                (0, 0),
                "second {second}: {per_second:?}"
            );
        }
    }

    /// A downstream whose calls may take 15 minutes.
    struct Patient;

    impl Processor for Patient {
        fn attempt_timeout(&self) -> Option<Duration> {
            Some(Duration::from_secs(900))
        }
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            Ok(Outcome::Done)
        }
    }

    #[tokio::test]
    async fn half_open_refusals_are_counted_and_the_probe_lock_outlasts_the_probe() {
        let store = MemoryBreakerStore::default();
        let now = SystemTime::now();
        assert!(store
            .open(
                now - Duration::from_secs(1),
                1,
                now - Duration::from_secs(2)
            )
            .await
            .unwrap());
        // Another sandbox probes.
        assert!(store
            .take_probe(now + Duration::from_secs(60), now)
            .await
            .unwrap());
        let sandbox = Breaker::new(Patient, store.clone(), policy());
        let metrics = Arc::new(crate::context::MetricSink::default());
        let context = crate::context::RecordContext::new(
            now + Duration::from_secs(600),
            now + Duration::from_secs(601),
            metrics.clone(),
        );
        let (refused, _) = context
            .scope(sandbox.process(&WorkItem::new("m", "{}")))
            .await;
        assert_eq!(refused.unwrap_err().code.as_deref(), Some(CIRCUIT_OPEN));
        let names: Vec<String> = metrics.take().into_iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            ["BreakerRefused"],
            "the alarm on refusals must see this one"
        );

        // The probe's lock covers a call of up to 15 minutes (bounded by the 10 minutes
        // left in the invocation), not the configured 10 s.
        let store = MemoryBreakerStore::default();
        assert!(store
            .open(
                now - Duration::from_secs(1),
                1,
                now - Duration::from_secs(2)
            )
            .await
            .unwrap());
        let locking = Watched {
            inner: store.clone(),
            ..Watched::default()
        };
        let sandbox = Breaker::new(Patient, locking.clone(), policy());
        let context = crate::context::RecordContext::new(
            SystemTime::now() + Duration::from_secs(600),
            SystemTime::now() + Duration::from_secs(601),
            Arc::default(),
        );
        let (done, _) = context
            .scope(sandbox.process(&WorkItem::new("m", "{}")))
            .await;
        assert_eq!(done.unwrap(), Outcome::Done);
        let lock = locking.probe_lock.lock().unwrap().unwrap();
        let lasts = lock.duration_since(now).unwrap();
        assert!(lasts >= Duration::from_secs(600), "{lasts:?}");
    }

    /// A downstream whose calls take `delay`, failing (503) or not, counting how many run at once.
    struct Timed {
        delay: Duration,
        fail: bool,
        running: Arc<AtomicU32>,
        most: Arc<AtomicU32>,
    }

    impl Processor for Timed {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            if self.fail {
                Err(ProcessError::new(ErrorClass::ServerError, "503"))
            } else {
                Ok(Outcome::Done)
            }
        }
    }

    /// One probe at a time: sandbox A probes (a slow call). Calls started before the
    /// breaker opened fail meanwhile and cross the threshold in a new window. They reopened
    /// the breaker (a reopening removes the probe's lock), and once that short open period
    /// ended sandbox C took a second probe while A's still ran; a running probe now decides
    /// alone.
    #[tokio::test]
    async fn a_reopening_during_a_probe_does_not_let_a_second_probe_run() {
        let store = MemoryBreakerStore::default();
        let probes_running = Arc::new(AtomicU32::new(0));
        let probes_most = Arc::new(AtomicU32::new(0));
        let in_flight = Arc::new(AtomicU32::new(0));
        let in_flight_most = Arc::new(AtomicU32::new(0));
        let old_call = || {
            Breaker::new(
                Timed {
                    delay: Duration::from_millis(1_000),
                    fail: true,
                    running: in_flight.clone(),
                    most: in_flight_most.clone(),
                },
                store.clone(),
                policy(),
            )
        };
        let prober = || {
            Breaker::new(
                Timed {
                    delay: Duration::from_millis(4_000),
                    fail: false,
                    running: probes_running.clone(),
                    most: probes_most.clone(),
                },
                store.clone(),
                policy(),
            )
        };
        let (b1, b2, b3) = (old_call(), old_call(), old_call());
        let (a, c) = (prober(), prober());
        let item = WorkItem::new("m", "{}");
        let opened_elsewhere = async {
            tokio::time::sleep(Duration::from_millis(40)).await;
            let now = SystemTime::now();
            assert!(store
                .open(now + Duration::from_millis(600), 1, now)
                .await
                .unwrap());
        };
        let probe_a = async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            a.process(&item).await
        };
        let probe_c = async {
            tokio::time::sleep(Duration::from_millis(2_600)).await;
            c.process(&item).await
        };
        let (r1, r2, r3, (), ra, rc) = tokio::join!(
            b1.process(&item),
            b2.process(&item),
            b3.process(&item),
            opened_elsewhere,
            probe_a,
            probe_c
        );
        assert!(r1.is_err() && r2.is_err() && r3.is_err());
        assert!(ra.is_ok(), "A probed: {ra:?}");
        assert_eq!(
            probes_most.load(Ordering::SeqCst),
            1,
            "a second probe ran beside the first (C: {rc:?})"
        );
    }

    /// The memory store keeps times to the nanosecond, DynamoDB to the
    /// millisecond: read back, the memory breaker is still open where DynamoDB's is half
    /// open, and its own probe condition (evaluated in milliseconds) already lets a probe
    /// in while the state it returns says open.
    #[tokio::test]
    async fn the_memory_breaker_reads_back_what_dynamodb_would() {
        let store = MemoryBreakerStore::default();
        let epoch = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let until = epoch + Duration::from_micros(1_000_500);
        assert!(store.open(until, 1, epoch).await.unwrap());
        let now = epoch + Duration::from_micros(1_000_200);
        let state = store.read().await.unwrap();
        let taken = store
            .take_probe(now + Duration::from_secs(10), now)
            .await
            .unwrap();
        assert!(
            !(taken && state.is_open(now)),
            "a probe taken while the state read says open"
        );
        assert_eq!(
            state.open_until,
            Some(epoch + Duration::from_millis(1_000)),
            "DynamoDB stores open_until_ms"
        );
    }

    /// A downstream per tenant: tenant `t-bad`'s fails, the others answer.
    struct Tenants {
        calls: Arc<Mutex<HashMap<String, u32>>>,
    }

    impl Processor for Tenants {
        async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
            let tenant = item.message_group_id.clone().unwrap_or_default();
            *self
                .calls
                .lock()
                .unwrap()
                .entry(tenant.clone())
                .or_default() += 1;
            if tenant == "t-bad" {
                Err(ProcessError::new(ErrorClass::ServerError, "503"))
            } else {
                Ok(Outcome::Done)
            }
        }
    }

    /// `WORKER_BREAKER_SCOPE=message-group`: a tenant whose own downstream fails opens its
    /// own breaker (its own item), and the other tenants, and records without a group,
    /// are still served.
    #[tokio::test]
    async fn a_noisy_tenant_opens_its_own_breaker_only() {
        let calls = Arc::new(Mutex::new(HashMap::new()));
        let stores: Arc<Mutex<HashMap<Option<String>, MemoryBreakerStore>>> = Arc::default();
        let kept = stores.clone();
        let breakers = GroupBreakers::new(
            Tenants {
                calls: calls.clone(),
            },
            move |group: Option<&str>| {
                kept.lock()
                    .unwrap()
                    .entry(group.map(str::to_string))
                    .or_default()
                    .clone()
            },
            policy(),
        );
        let item = |tenant: Option<&str>| WorkItem {
            message_group_id: tenant.map(str::to_string),
            ..WorkItem::new("m", "{}")
        };
        for _ in 0..10 {
            let _ = breakers.process(&item(Some("t-bad"))).await;
            assert!(breakers.process(&item(Some("t-good"))).await.is_ok());
            assert!(breakers.process(&item(None)).await.is_ok());
        }
        let refused = breakers.process(&item(Some("t-bad"))).await.unwrap_err();
        assert_eq!(refused.code.as_deref(), Some(CIRCUIT_OPEN));
        let calls = calls.lock().unwrap().clone();
        assert_eq!(
            calls["t-bad"], 3,
            "held back after the threshold: {calls:?}"
        );
        assert_eq!(calls["t-good"], 10);
        assert_eq!(calls[""], 10);
        let stores = stores.lock().unwrap();
        let now = SystemTime::now();
        assert!(stores[&Some("t-bad".to_string())].state().is_open(now));
        assert!(!stores[&Some("t-good".to_string())].state().is_open(now));
        assert!(
            !stores[&None].state().is_open(now),
            "the function's breaker stays closed"
        );
        assert_eq!(
            group_key("breaker#orders", "t-bad"),
            "breaker#orders#group#t-bad"
        );
    }

    /// The breaker reads wall time from its clock: under one that follows tokio's paused
    /// clock (from the year 2000), the open period is stamped and counted in that time.
    #[tokio::test(start_paused = true)]
    async fn the_breaker_reads_wall_time_from_its_clock() {
        let clock =
            Clock::following_tokio(chrono::DateTime::from_timestamp(946_684_800, 0).unwrap());
        let store = MemoryBreakerStore::default();
        let up = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU32::new(0));
        let breaker = sandbox(&store, &up, &calls).with_clock(clock);
        let item = WorkItem::new("m", "{}");
        for _ in 0..3 {
            breaker.process(&item).await.unwrap_err();
        }
        assert_eq!(
            store.state().open_until,
            Some(clock.system_time() + Duration::from_millis(300))
        );
        // Past the open period by tokio's clock (the system's has hardly moved): the probe
        // runs, and closes it.
        up.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(breaker.process(&item).await.unwrap(), Outcome::Done);
        assert_eq!(store.state().open_until, None);
    }

    /// A handler that panics (a bug), never reaching the downstream.
    struct Panics;

    impl Processor for Panics {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            panic!("handler bug")
        }
    }

    /// A panicking probe decides nothing: the probe goes back and the next record of any
    /// sandbox probes. It kept the lock, and every sandbox refused every record until the
    /// lock lapsed.
    #[tokio::test]
    async fn a_panicking_probe_gives_the_probe_back() {
        let store = half_open_store().await;
        let panicking = Breaker::new(Panics, store.clone(), policy());
        let item = WorkItem::new("m", "{}");
        let probe = crate::batch::guard_panics(panicking.process(&item))
            .await
            .unwrap_err();
        assert_eq!((probe.status, probe.code.as_deref()), (None, None));
        let up = Arc::new(AtomicBool::new(true));
        let calls = Arc::new(AtomicU32::new(0));
        let other = sandbox(&store, &up, &calls);
        let next = other.process(&item).await;
        assert_eq!(
            next,
            Ok(Outcome::Done),
            "after the panic: {:?}",
            store.state()
        );
    }

    /// The open period ends at its instant: the breaker is open just before, and half-open
    /// (a probe may run) at it, never both nor neither.
    #[test]
    fn the_open_period_ends_at_its_instant() {
        let until = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let state = BreakerState {
            open_until: Some(until),
            ..BreakerState::default()
        };
        let before = until - Duration::from_millis(1);
        assert!(state.is_open(before) && !state.is_half_open(before));
        assert!(!state.is_open(until) && state.is_half_open(until));
    }

    /// A processor whose calls are bounded by `timeout`.
    struct Bounded {
        timeout: Option<Duration>,
    }

    impl Processor for Bounded {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            Ok(Outcome::Done)
        }

        fn attempt_timeout(&self) -> Option<Duration> {
            self.timeout
        }
    }

    /// The breakers pass the handler's attempt timeout through, and its absence: the worker
    /// warns when attempts cannot fit an invocation by what the handler says.
    #[test]
    fn the_breakers_tell_the_handlers_attempt_timeout() {
        for timeout in [None, Some(Duration::from_secs(7))] {
            let store = MemoryBreakerStore::default();
            let one = Breaker::new(Bounded { timeout }, store.clone(), policy());
            assert_eq!(one.attempt_timeout(), timeout);
            let groups = GroupBreakers::new(
                Bounded { timeout },
                move |_: Option<&str>| store.clone(),
                policy(),
            );
            assert_eq!(groups.attempt_timeout(), timeout);
            assert_eq!(groups.breaker(Some("g")).attempt_timeout(), timeout);
        }
    }

    /// A downstream that fails each call once the test lets it answer.
    struct FailsWhenReleased {
        started: Arc<AtomicU32>,
        release: Arc<tokio::sync::Semaphore>,
    }

    impl Processor for FailsWhenReleased {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            self.started.fetch_add(1, Ordering::SeqCst);
            let _permit = self.release.acquire().await;
            Err(ProcessError::from_http_status(503, "down"))
        }
    }

    /// Failures of calls that began before the breaker opened, reaching the threshold once
    /// its open period is over and while no probe runs, open it again, for longer: the
    /// downstream failed all along. (Under a running probe they would not: the probe decides.)
    #[tokio::test]
    async fn late_failures_reaching_the_threshold_reopen_a_half_open_breaker_no_probe_holds() {
        let store = MemoryBreakerStore::default();
        let started = Arc::new(AtomicU32::new(0));
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let sandbox = Arc::new(Breaker::new(
            FailsWhenReleased {
                started: started.clone(),
                release: release.clone(),
            },
            store.clone(),
            policy(),
        ));
        let calls: Vec<_> = (0..3)
            .map(|n| {
                let sandbox = sandbox.clone();
                tokio::spawn(async move {
                    sandbox
                        .process(&WorkItem::new(format!("m-{n}"), "{}"))
                        .await
                })
            })
            .collect();
        while started.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Another sandbox opened the breaker meanwhile, and its open period is over.
        open_a_while_ago(&store).await;
        release.add_permits(3);
        for call in calls {
            assert_eq!(
                call.await.unwrap().unwrap_err().class,
                ErrorClass::ServerError
            );
        }
        let state = store.state();
        assert!(state.is_open(SystemTime::now()), "{state:?}");
        assert_eq!(state.opens, 2, "{state:?}");
    }

    /// A handler whose dead-letter hook fails, and says which item it was told of.
    struct Hooked;

    impl Processor for Hooked {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            Ok(Outcome::Done)
        }

        async fn on_dead_letter(
            &self,
            dead: &crate::processor::DeadLettered<'_>,
        ) -> Result<(), ProcessError> {
            Err(ProcessError::new(
                ErrorClass::ServerError,
                format!("hook saw {}", dead.item.item_id),
            ))
        }
    }

    /// The breakers pass the handler's dead-letter hook through, open or not, with its
    /// answer: a hook that failed is logged by the engine, not taken as run.
    #[tokio::test]
    async fn the_breakers_run_the_handlers_dead_letter_hook() {
        let item = WorkItem::new("m-1", "{}");
        let error = ProcessError::new(ErrorClass::Validation, "bad");
        let dead = crate::processor::DeadLettered {
            item: &item,
            error: &error,
            reason: crate::dead_letter::DeadLetterReason::Permanent,
            attempts: 1,
        };
        let store = MemoryBreakerStore::default();
        let one = Breaker::new(Hooked, store.clone(), policy());
        let groups = GroupBreakers::new(Hooked, move |_: Option<&str>| store.clone(), policy());
        let answers = [
            one.on_dead_letter(&dead).await,
            groups.on_dead_letter(&dead).await,
            groups.breaker(Some("g")).on_dead_letter(&dead).await,
        ];
        for answer in answers {
            assert_eq!(answer.unwrap_err().message, "hook saw m-1");
        }
    }

    /// A sandbox keeps at most [`MAX_GROUP_BREAKERS`] group breakers: past it, a busy
    /// group's record runs behind a breaker of its own, and the map does not grow.
    #[test]
    fn a_sandbox_keeps_at_most_its_bound_of_group_breakers() {
        let store = MemoryBreakerStore::default();
        let groups = GroupBreakers::new(
            Bounded { timeout: None },
            move |_: Option<&str>| store.clone(),
            policy(),
        );
        let busy: Vec<_> = (0..MAX_GROUP_BREAKERS)
            .map(|n| groups.breaker(Some(&format!("g{n}"))))
            .collect();
        let extra = groups.breaker(Some("one-more"));
        let kept = groups.breakers.lock().unwrap().len();
        assert_eq!(kept, MAX_GROUP_BREAKERS);
        assert_eq!(std::sync::Arc::strong_count(&extra), 1, "not kept");
        drop(busy);
    }
}
