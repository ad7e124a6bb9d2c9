//! A circuit breaker shared by every sandbox of a function: when the downstream's
//! transient failures within a window reach a threshold, the breaker opens and the worker
//! stops calling the downstream; records are returned for retry (hidden for the rest of
//! the open period when spaced redelivery is on, docs/ARCHITECTURE.md §1.11) until one
//! probe, one record at a time, succeeds and closes it (docs/ARCHITECTURE.md §7).
//!
//! The state lives in one small item of a store every sandbox reads ([`BreakerStore`]:
//! DynamoDB in production, `adapters::breaker`), so fifty sandboxes do not each
//! rediscover an outage. A sandbox reads it at most once per [`BreakerPolicy::refresh`]
//! and writes only on failures and transitions.
//!
//! [`Breaker`] wraps a processor. An item refused because the breaker is open fails with
//! class `server_error`, code [`CIRCUIT_OPEN`] and a `Retry-After` to the end of the open
//! period, without the downstream being called: within the receive budget it goes back to
//! the queue; on its last receive it is dead-lettered with that code, which marks it as
//! outage-caused, and a redrive of eligible items (transient classes) brings it back once
//! the breaker has closed.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;

use crate::error::{ErrorClass, ProcessError};
use crate::item::WorkItem;
use crate::processor::{Outcome, Processor};

/// The error code of an item the open breaker refused.
pub const CIRCUIT_OPEN: &str = "CircuitOpen";

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
    /// Whether the breaker is open at `now` (before the end of its open period).
    pub fn is_open(&self, now: SystemTime) -> bool {
        self.open_until.is_some_and(|until| now < until)
    }

    /// Whether it opened and its open period is over: a probe may run.
    pub fn is_half_open(&self, now: SystemTime) -> bool {
        self.open_until.is_some_and(|until| now >= until)
    }
}

/// Where the shared state lives. Every write is one atomic conditional step.
pub trait BreakerStore: Send + Sync {
    /// The current state (closed when none is stored).
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
}

/// Whether a failure of the downstream counts towards opening the breaker: those that
/// say it is unwell, not that the item is bad.
pub fn counts(error: &ProcessError) -> bool {
    matches!(
        error.class,
        ErrorClass::ServerError
            | ErrorClass::Timeout
            | ErrorClass::Connection
            | ErrorClass::Throttled
    ) && error.code.as_deref() != Some(CIRCUIT_OPEN)
}

/// The open period after `opens` openings in a row.
pub fn open_period(policy: &BreakerPolicy, opens: u32) -> Duration {
    let factor = 1u32
        .checked_shl(opens.saturating_sub(1).min(16))
        .unwrap_or(u32::MAX);
    policy.open_for.saturating_mul(factor).min(policy.max_open)
}

/// A processor behind a shared circuit breaker.
#[derive(Debug)]
pub struct Breaker<P, S> {
    inner: P,
    store: S,
    policy: BreakerPolicy,
    /// The state this sandbox last read, and when (tokio's clock).
    cached: Mutex<Option<(tokio::time::Instant, BreakerState)>>,
}

impl<P, S> Breaker<P, S> {
    /// `inner` behind the breaker kept in `store`.
    pub fn new(inner: P, store: S, policy: BreakerPolicy) -> Self {
        Breaker {
            inner,
            store,
            policy,
            cached: Mutex::new(None),
        }
    }

    /// The processor inside.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

fn refused(until: SystemTime, now: SystemTime, why: &str) -> ProcessError {
    let wait = until.duration_since(now).unwrap_or(Duration::ZERO);
    ProcessError::new(
        ErrorClass::ServerError,
        format!(
            "the circuit breaker is open ({why}): the downstream was not called; retried in {} s",
            wait.as_secs()
        ),
    )
    .with_code(CIRCUIT_OPEN)
    .with_step("breaker")
    .with_retry_after(wait)
}

impl<P: Processor, S: BreakerStore> Breaker<P, S> {
    async fn state(&self, now: SystemTime) -> BreakerState {
        let fresh = self.cached.lock().ok().and_then(|c| {
            c.as_ref()
                .filter(|(at, _)| at.elapsed() < self.policy.refresh)
                .map(|(_, s)| s.clone())
        });
        if let Some(state) = fresh {
            return state;
        }
        match self.store.read().await {
            Ok(state) => {
                self.remember(&state);
                state
            }
            Err(error) => {
                // A breaker that cannot be read is closed: the work goes on as without one.
                tracing::warn!(%error, "circuit breaker state unreadable; treated as closed");
                let _ = now;
                BreakerState::default()
            }
        }
    }

    fn remember(&self, state: &BreakerState) {
        if let Ok(mut cached) = self.cached.lock() {
            *cached = Some((tokio::time::Instant::now(), state.clone()));
        }
    }

    async fn after_failure(&self, error: &ProcessError, state: &BreakerState, now: SystemTime) {
        if !counts(error) {
            return;
        }
        let counted = match self.store.add_failures(1, now, self.policy.window).await {
            Ok(counted) => counted,
            Err(e) => {
                tracing::warn!(error = %e, "could not count a failure in the circuit breaker");
                return;
            }
        };
        if counted.failures >= self.policy.threshold && !counted.is_open(now) {
            let opens = state.opens.max(counted.opens) + 1;
            self.open(opens, now, "failures in the window reached the threshold")
                .await;
        } else {
            self.remember(&counted);
        }
    }

    async fn open(&self, opens: u32, now: SystemTime, why: &str) {
        let period = open_period(&self.policy, opens);
        let until = now + period;
        match self.store.open(until, opens, now).await {
            Ok(true) => {
                tracing::warn!(
                    open_secs = period.as_secs(),
                    opens,
                    "circuit breaker opened: {why}; the downstream is not called for {} s",
                    period.as_secs()
                );
                crate::context::add_metric("BreakerOpened", crate::context::Unit::Count, 1.0);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not open the circuit breaker"),
        }
        if let Ok(state) = self.store.read().await {
            self.remember(&state);
        }
    }

    async fn probe(
        &self,
        item: &WorkItem,
        state: &BreakerState,
        now: SystemTime,
    ) -> Result<Outcome, ProcessError> {
        match self
            .store
            .take_probe(now + self.policy.probe_for, now)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                return Err(refused(
                    now + self.policy.probe_for,
                    now,
                    "another sandbox is probing",
                ))
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not take the circuit breaker's probe");
                return Err(refused(
                    now + self.policy.probe_for,
                    now,
                    "probe unavailable",
                ));
            }
        }
        let result = self.inner.process(item).await;
        let after = SystemTime::from(crate::clock::now());
        match &result {
            Err(error) if counts(error) => {
                self.open(state.opens + 1, after, "the probe failed").await;
            }
            _ => match self.store.close().await {
                Ok(()) => {
                    tracing::info!(
                        opens = state.opens,
                        "circuit breaker closed: the probe succeeded"
                    );
                    crate::context::add_metric("BreakerClosed", crate::context::Unit::Count, 1.0);
                    self.remember(&BreakerState::default());
                }
                Err(e) => tracing::warn!(error = %e, "could not close the circuit breaker"),
            },
        }
        result
    }
}

impl<P: Processor, S: BreakerStore> Processor for Breaker<P, S> {
    fn attempt_timeout(&self) -> Option<Duration> {
        self.inner.attempt_timeout()
    }

    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let now = SystemTime::from(crate::clock::now());
        let state = self.state(now).await;
        if let Some(until) = state.open_until.filter(|_| state.is_open(now)) {
            crate::context::add_metric("BreakerRefused", crate::context::Unit::Count, 1.0);
            return Err(refused(until, now, "the downstream is failing"));
        }
        if state.is_half_open(now) {
            return self.probe(item, &state, now).await;
        }
        let result = self.inner.process(item).await;
        if let Err(error) = &result {
            self.after_failure(error, &state, SystemTime::from(crate::clock::now()))
                .await;
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
}
