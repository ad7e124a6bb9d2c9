//! The circuit breaker and the polling control when what they keep their state in cannot
//! be reached: the source queue's attributes, the breaker's table (its item, the pause
//! marker and the control's lease). A pause must still never outlast a message
//! (docs/ARCHITECTURE.md §1.12), and a sandbox must not refuse every record for as long as
//! the table is down once the downstream has recovered (docs/OPERATIONS.md, the breaker's §7).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;

use crate::breaker::{Breaker, BreakerPolicy, BreakerState, BreakerStore};
use crate::error::{ErrorClass, ProcessError};
use crate::item::WorkItem;
use crate::polling::{
    MappingSwitch, PauseMarker, PauseState, PollingControl, ProbeOutcome, SourceProbe,
    SourceQueueState,
};
use crate::processor::{Outcome, Processor};
use crate::testing::{MemoryBreakerStore, MemoryPauseMarker};

fn unavailable() -> ProcessError {
    ProcessError::new(ErrorClass::ServerError, "table unavailable")
}

// ---------------------------------------------------------------------------------------
// Polling control (guarantee 11: "a pause never outlasts a message").
// ---------------------------------------------------------------------------------------

const RETENTION: Duration = Duration::from_secs(4 * 86_400);

/// The worker's mapping in memory, with when it was last disabled (Lambda's
/// `LastModified`).
#[derive(Clone, Default)]
struct Mapping {
    enabled: Arc<AtomicBool>,
    disabled_at: Arc<Mutex<Option<SystemTime>>>,
}

impl MappingSwitch for Mapping {
    fn enabled(&self) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async { Ok(self.enabled.load(Ordering::SeqCst)) })
    }
    fn set_enabled(&self, enabled: bool) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            if self.enabled.swap(enabled, Ordering::SeqCst) != enabled && !enabled {
                *self.disabled_at.lock().unwrap() = Some(SystemTime::now());
            }
            Ok(())
        })
    }
    fn disabled_since(&self) -> BoxFuture<'_, Result<Option<SystemTime>, ProcessError>> {
        Box::pin(async move {
            Ok((!self.enabled.load(Ordering::SeqCst))
                .then(|| *self.disabled_at.lock().unwrap())
                .flatten())
        })
    }
}

/// The source queue; `GetQueueAttributes` fails while `queue_fails` is set.
#[derive(Clone, Default)]
struct Queue {
    queue_fails: Arc<AtomicBool>,
}

impl SourceProbe for Queue {
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueueState, ProcessError>> {
        Box::pin(async move {
            if self.queue_fails.load(Ordering::SeqCst) {
                return Err(ProcessError::new(
                    ErrorClass::Throttled,
                    "GetQueueAttributes throttled",
                ));
            }
            Ok(SourceQueueState {
                visible: 0,
                retention: RETENTION,
            })
        })
    }
    fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>> {
        Box::pin(async { Ok(ProbeOutcome::Returned) })
    }
}

/// The breaker table's marker item; every call fails while `down` is set (the breaker
/// table, which holds the marker beside the breaker, is unavailable).
#[derive(Clone, Default)]
struct Marker {
    inner: MemoryPauseMarker,
    down: Arc<AtomicBool>,
}

impl PauseMarker for Marker {
    fn lease(
        &self,
        now: SystemTime,
        until: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(async { Err(unavailable()) });
        }
        self.inner.lease(now, until)
    }
    fn release(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(async { Err(unavailable()) });
        }
        self.inner.release(until)
    }
    fn read(&self) -> BoxFuture<'_, Result<PauseState, ProcessError>> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(async { Err(unavailable()) });
        }
        self.inner.read()
    }
    fn write(&self, state: PauseState) -> BoxFuture<'_, Result<(), ProcessError>> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(async { Err(unavailable()) });
        }
        self.inner.write(state)
    }
}

/// The breaker's store; every call fails while `down` is set, after `latency` (a
/// connection that times out takes a while to fail). The breaker's and the redrive gate's
/// tests use it too.
#[derive(Clone, Default)]
pub(crate) struct FlakyBreakerStore {
    pub(crate) inner: MemoryBreakerStore,
    pub(crate) down: Arc<AtomicBool>,
    pub(crate) reads: Arc<AtomicU32>,
    pub(crate) latency: Duration,
}

impl FlakyBreakerStore {
    /// Returns a store whose every call fails.
    pub(crate) fn unreachable() -> Self {
        let store = FlakyBreakerStore::default();
        store.down.store(true, Ordering::SeqCst);
        store
    }

    /// Returns the failure of a call made while the store is down.
    fn refused<T: Send + 'static>(&self) -> BoxFuture<'static, Result<T, ProcessError>> {
        let latency = self.latency;
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            Err(unavailable())
        })
    }
}

impl BreakerStore for FlakyBreakerStore {
    fn read(&self) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return self.refused();
        }
        self.inner.read()
    }
    fn add_failures(
        &self,
        n: u32,
        now: SystemTime,
        window: Duration,
    ) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        if self.down.load(Ordering::SeqCst) {
            return self.refused();
        }
        self.inner.add_failures(n, now, window)
    }
    fn open(
        &self,
        until: SystemTime,
        opens: u32,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        if self.down.load(Ordering::SeqCst) {
            return self.refused();
        }
        self.inner.open(until, opens, now)
    }
    fn take_probe(
        &self,
        until: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        if self.down.load(Ordering::SeqCst) {
            return self.refused();
        }
        self.inner.take_probe(until, now)
    }
    fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
        if self.down.load(Ordering::SeqCst) {
            return self.refused();
        }
        self.inner.close()
    }
    fn release_probe(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
        if self.down.load(Ordering::SeqCst) {
            return self.refused();
        }
        self.inner.release_probe(until)
    }
}

/// Returns a control whose mapping was paused at `t0` with the breaker open (a second time).
async fn paused_at(
    t0: SystemTime,
) -> (
    PollingControl<FlakyBreakerStore, Mapping, Marker, Queue>,
    Mapping,
    Marker,
    Queue,
    FlakyBreakerStore,
) {
    let breaker = FlakyBreakerStore::default();
    // Open for a long time (a long outage: the open period doubles up to its cap, and the
    // outage outlasts the retention).
    assert!(breaker
        .inner
        .open(t0 + Duration::from_secs(30 * 86_400), 2, t0)
        .await
        .unwrap());
    let mapping = Mapping::default();
    mapping.enabled.store(true, Ordering::SeqCst);
    let marker = Marker::default();
    let queue = Queue::default();
    let control = PollingControl {
        breaker: breaker.clone(),
        mapping: mapping.clone(),
        marker: marker.clone(),
        probe: queue.clone(),
    };
    let action = control.run(t0).await;
    assert_eq!(action, crate::polling::ControlAction::Paused, "set-up");
    assert!(!mapping.enabled.load(Ordering::SeqCst), "set-up: paused");
    (control, mapping, marker, queue, breaker)
}

/// Runs the control every `step` from `from` to `to`; whether the mapping was ever found
/// enabled after a run (a sweep, or a resume).
async fn ever_enabled(
    control: &PollingControl<FlakyBreakerStore, Mapping, Marker, Queue>,
    mapping: &Mapping,
    from: SystemTime,
    to: SystemTime,
    step: Duration,
) -> (bool, Vec<crate::polling::ControlAction>) {
    let mut at = from;
    let mut actions = Vec::new();
    let mut enabled = false;
    while at <= to {
        let action = control.run(at).await;
        if actions.last() != Some(&action) {
            actions.push(action);
        }
        enabled |= mapping.enabled.load(Ordering::SeqCst);
        at += step;
    }
    (enabled, actions)
}

/// Guarantee 11: "A pause never outlasts a message: every eighth of the queue's retention,
/// whatever the breaker's state, a sweep polls until nothing is visible."
///
/// Attack: the source queue's attributes cannot be read (`GetQueueAttributes` throttled or
/// denied) while paused. `step` reads the queue before it decides on the sweep and
/// returns the error (`?`), so no sweep ever runs and the mapping stays disabled past the
/// whole retention: every waiting message expires without a record. (The breaker's own
/// unreadability is handled fail-safe; the queue's is not.)
#[tokio::test]
async fn a_pause_ends_when_the_queue_cannot_be_read() {
    let t0 = SystemTime::now();
    let (control, mapping, _marker, queue, _breaker) = paused_at(t0).await;
    queue.queue_fails.store(true, Ordering::SeqCst);
    // The schedule runs every minute; run it hourly here, over the whole retention and a day.
    let (enabled, actions) = ever_enabled(
        &control,
        &mapping,
        t0 + Duration::from_secs(60),
        t0 + RETENTION + Duration::from_secs(86_400),
        Duration::from_secs(3600),
    )
    .await;
    assert!(
        enabled,
        "the mapping stayed disabled for longer than the queue's retention (every message \
         waiting expired unreceived); control actions seen: {actions:?}"
    );
}

/// Guarantee 11 (and docs §1.12: "a breaker that cannot be read ends the pause"):
///
/// The breaker table is unavailable. The pause marker and its lease live in the same table
/// as the breaker (`<breaker key>#polling`), so a run fails at the lease (or the marker
/// read) before it ever reads the breaker: the mapping, disabled for longer than a sweep
/// interval (an eighth of the retention), is enabled blind, well before the retention
/// ends. A mapping disabled for less is left alone (it may be an operator's).
#[tokio::test]
async fn a_pause_ends_when_the_breaker_table_cannot_be_read_for_a_sweep_interval() {
    let t0 = SystemTime::now();
    let (control, mapping, marker, _queue, breaker) = paused_at(t0).await;
    marker.down.store(true, Ordering::SeqCst);
    breaker.down.store(true, Ordering::SeqCst);
    // Within the first sweep interval: left disabled.
    let (enabled, _) = ever_enabled(
        &control,
        &mapping,
        t0 + Duration::from_secs(60),
        t0 + RETENTION / 8 - Duration::from_secs(3600),
        Duration::from_secs(3600),
    )
    .await;
    assert!(!enabled, "enabled before a sweep interval had passed");
    let (enabled, actions) = ever_enabled(
        &control,
        &mapping,
        t0 + RETENTION / 8 - Duration::from_secs(60),
        t0 + RETENTION / 8 + Duration::from_secs(3600),
        Duration::from_secs(3600),
    )
    .await;
    assert!(
        enabled,
        "with the breaker table unreadable the pause outlasted a sweep interval; actions: {actions:?}"
    );
}

/// The same, with only the breaker's item unreadable and the marker fine: the fail-safe
/// works (control for the two tests above: this one is expected to PASS).
#[tokio::test]
async fn an_unreadable_breaker_item_alone_ends_the_pause() {
    let t0 = SystemTime::now();
    let (control, mapping, _marker, _queue, breaker) = paused_at(t0).await;
    breaker.down.store(true, Ordering::SeqCst);
    let (enabled, _) = ever_enabled(
        &control,
        &mapping,
        t0 + Duration::from_secs(60),
        t0 + Duration::from_secs(120),
        Duration::from_secs(60),
    )
    .await;
    assert!(enabled);
}

// ---------------------------------------------------------------------------------------
// Breaker (guarantee 7: "a failed read keeps the last known state (does it fail open
// forever?)").
// ---------------------------------------------------------------------------------------

struct Up {
    calls: Arc<AtomicU32>,
}

impl Processor for Up {
    async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::Done)
    }
}

/// Guarantee 7 / docs §7: "A state that cannot be read leaves the last state known in force
/// for the period (closed when none is known): the breaker can only withhold calls, never
/// records."
///
/// Attack: the breaker opens for 200 ms, then its table becomes unavailable for good (the
/// downstream is healthy). A sandbox that knew the breaker open keeps refusing every record
/// for ever: past the open period it is half-open, `take_probe` fails, the sandbox
/// remembers a probe lock of at least 5 s, refuses, tries again, fails again... The
/// downstream is never called again while the table is down (records burn their receives
/// and are dead-lettered `CircuitOpen` on their last), whereas a sandbox that knew nothing
/// calls the downstream at once. Here: 6.5 s = 32 open periods and more than one probe
/// lock after the open period ended, no call.
#[tokio::test]
async fn a_sandbox_out_of_touch_with_the_table_for_an_open_period_probes_on_its_own() {
    let store = FlakyBreakerStore::default();
    let now = SystemTime::now();
    assert!(store
        .inner
        .open(now + Duration::from_millis(200), 1, now)
        .await
        .unwrap());
    let calls = Arc::new(AtomicU32::new(0));
    let policy = BreakerPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_millis(200),
        max_open: Duration::from_secs(3),
        probe_for: Duration::from_millis(100),
        refresh: Duration::from_millis(100),
    };
    let knows_open = Breaker::new(
        Up {
            calls: calls.clone(),
        },
        store.clone(),
        policy,
    );
    let item = WorkItem::new("m", "{}");
    let refused = knows_open.process(&item).await.unwrap_err();
    assert_eq!(refused.code.as_deref(), Some(crate::error::CIRCUIT_OPEN));
    // The breaker table goes down; the downstream is up.
    store.down.store(true, Ordering::SeqCst);
    // A sandbox that never read the state calls the downstream at once (closed when none
    // is known).
    let fresh_calls = Arc::new(AtomicU32::new(0));
    let knows_nothing = Breaker::new(
        Up {
            calls: fresh_calls.clone(),
        },
        store.clone(),
        policy,
    );
    assert_eq!(knows_nothing.process(&item).await.unwrap(), Outcome::Done);
    assert_eq!(fresh_calls.load(Ordering::SeqCst), 1);
    // The one that knew it open: 6.5 s of records (one every 100 ms).
    let mut refusals = 0;
    for _ in 0..65 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if knows_open.process(&item).await.is_err() {
            refusals += 1;
        }
    }
    assert!(
        calls.load(Ordering::SeqCst) > 0,
        "with the breaker table unreadable, a sandbox that last saw the breaker open refused \
         all {refusals} records over 6.5 s (32 open periods) and never called the healthy \
         downstream: it fails open for as long as the table is down"
    );
}

/// Guarantee 7: "reads ≤ one per sandbox per refresh period".
///
/// Attack: while the table is unreadable, a half-open sandbox reads the store once per
/// refresh period (kept), but is a take_probe failure remembered as a read? Counted here:
/// reads over 1 s with a refresh of 100 ms must be ≤ 11 (control: expected to PASS).
#[tokio::test]
async fn reads_stay_bounded_while_the_table_is_down() {
    let store = FlakyBreakerStore::default();
    let now = SystemTime::now();
    assert!(store
        .inner
        .open(now + Duration::from_millis(50), 1, now)
        .await
        .unwrap());
    let policy = BreakerPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_millis(50),
        max_open: Duration::from_secs(3),
        probe_for: Duration::from_millis(100),
        refresh: Duration::from_millis(100),
    };
    let sandbox = Breaker::new(
        Up {
            calls: Arc::new(AtomicU32::new(0)),
        },
        store.clone(),
        policy,
    );
    let item = WorkItem::new("m", "{}");
    let _ = sandbox.process(&item).await;
    store.down.store(true, Ordering::SeqCst);
    store.reads.store(0, Ordering::SeqCst);
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        for _ in 0..10 {
            let _ = sandbox.process(&item).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        store.reads.load(Ordering::SeqCst) <= 11,
        "{}",
        store.reads.load(Ordering::SeqCst)
    );
}
