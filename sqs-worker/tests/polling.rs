//! The polling control (docs/ARCHITECTURE.md §1.12) against what can break it: two
//! overlapping runs (EventBridge delivers at least once; a run that waits on a throttled
//! call overlaps the next minute's), and a model of SQS in which messages expire at the end
//! of their retention, paused or not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use sqs_worker::breaker::BreakerStore;
use sqs_worker::error::ProcessError;
use sqs_worker::polling::{
    ControlAction, MappingSwitch, PauseMarker, PauseState, PollingControl, ProbeOutcome,
    SourceProbe, SourceQueue,
};
use sqs_worker::testing::MemoryBreakerStore;

type Hook = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// The worker's mapping (shared flag). `before_read`, when set, runs once inside the first
/// `enabled()` call: what another control run did while this one waited on the Lambda API.
#[derive(Clone)]
struct Mapping {
    enabled: Arc<AtomicBool>,
    before_read: Arc<Mutex<Option<Hook>>>,
}

impl MappingSwitch for Mapping {
    fn enabled(&self) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            let hook = self.before_read.lock().unwrap().take();
            if let Some(hook) = hook {
                hook().await;
            }
            Ok(self.enabled.load(Ordering::SeqCst))
        })
    }
    fn set_enabled(&self, enabled: bool) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            self.enabled.store(enabled, Ordering::SeqCst);
            Ok(())
        })
    }
}

/// The marker item: the pause and the control's lease.
#[derive(Clone, Default)]
struct Marker {
    pause: Arc<Mutex<PauseState>>,
    lease: Arc<Mutex<Option<SystemTime>>>,
}

impl Marker {
    fn paused(&self) -> bool {
        self.pause.lock().unwrap().paused
    }
}

impl PauseMarker for Marker {
    fn lease(
        &self,
        now: SystemTime,
        until: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            let mut lease = self.lease.lock().unwrap();
            if lease.is_some_and(|held| held > now) {
                return Ok(false);
            }
            *lease = Some(until);
            Ok(true)
        })
    }
    fn release(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            *self.lease.lock().unwrap() = None;
            Ok(())
        })
    }
    fn read(&self) -> BoxFuture<'_, Result<PauseState, ProcessError>> {
        Box::pin(async move { Ok(*self.pause.lock().unwrap()) })
    }
    fn write(&self, state: PauseState) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            *self.pause.lock().unwrap() = state;
            Ok(())
        })
    }
}

/// A probe whose message the worker processes, closing its breaker.
#[derive(Clone)]
struct ClosingProbe(MemoryBreakerStore);

impl SourceProbe for ClosingProbe {
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueue, ProcessError>> {
        Box::pin(async move {
            Ok(SourceQueue {
                visible: 0,
                retention: RETENTION,
            })
        })
    }
    fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>> {
        Box::pin(async move {
            self.0.close().await?;
            Ok(ProbeOutcome::Processed)
        })
    }
}

/// A mapping paused by the control is always restored by it. Run A reads the breaker just
/// before its open period ends (open, paused), then waits on `GetEventSourceMapping`;
/// meanwhile run B (the next schedule, or EventBridge's duplicate) finds it half-open and
/// would probe, close and enable. Were both to act, A, believing the pause was cut between
/// record and mapping, would disable the mapping B had just enabled and left unmarked. The
/// lease makes B wait its turn; later runs restore polling.
#[tokio::test]
async fn overlapping_control_runs_never_leave_the_mapping_disabled_without_a_marker() {
    let now = SystemTime::now();
    let open_until = now + Duration::from_secs(10);
    let breaker = MemoryBreakerStore::default();
    assert!(breaker
        .open(open_until, 2, now - Duration::from_secs(60))
        .await
        .unwrap());
    let enabled = Arc::new(AtomicBool::new(false));
    let marker = Marker::default();
    *marker.pause.lock().unwrap() = PauseState {
        paused: true,
        sweeping: false,
        since: Some(now),
    };

    let b = PollingControl {
        breaker: breaker.clone(),
        mapping: Mapping {
            enabled: enabled.clone(),
            before_read: Arc::new(Mutex::new(None)),
        },
        marker: marker.clone(),
        probe: ClosingProbe(breaker.clone()),
    };
    let b_action = Arc::new(Mutex::new(None));
    let b_seen = b_action.clone();
    let hook: Hook = Box::new(move || {
        Box::pin(async move {
            let action = b.run(open_until + Duration::from_secs(1)).await;
            *b_seen.lock().unwrap() = Some(action);
        })
    });
    let a = PollingControl {
        breaker: breaker.clone(),
        mapping: Mapping {
            enabled: enabled.clone(),
            before_read: Arc::new(Mutex::new(Some(hook))),
        },
        marker: marker.clone(),
        probe: ClosingProbe(breaker.clone()),
    };
    let a_action = a.run(open_until - Duration::from_secs(1)).await;
    let b_action = b_action.lock().unwrap().clone();
    assert_eq!(b_action, Some(ControlAction::Busy), "A holds the lease");

    // Every later run, for as long as you like.
    for minute in 1..=60 {
        a.run(open_until + Duration::from_secs(60 * minute)).await;
    }
    assert!(
        enabled.load(Ordering::SeqCst) && !marker.paused(),
        "run A answered {a_action:?}: polling was not restored (breaker {:?})",
        breaker.state()
    );
}

/// A source queue as SQS keeps it: each message visible from `visible_at`, deleted by SQS
/// without a trace at `expires` (SentTimestamp + MessageRetentionPeriod).
#[derive(Clone, Default)]
struct Queue(Arc<Mutex<QueueState>>);

#[derive(Default)]
struct QueueState {
    now: Option<SystemTime>,
    /// (id, visible_at, expires)
    messages: Vec<(String, SystemTime, SystemTime)>,
    expired_unrecorded: Vec<String>,
    dead_lettered: Vec<String>,
}

const VT: Duration = Duration::from_secs(60);
const RETENTION: Duration = Duration::from_secs(4 * 86_400);

impl Queue {
    fn tick(&self, now: SystemTime) {
        let mut q = self.0.lock().unwrap();
        q.now = Some(now);
        let (gone, kept): (Vec<_>, Vec<_>) = q.messages.drain(..).partition(|m| m.2 <= now);
        q.messages = kept;
        q.expired_unrecorded.extend(gone.into_iter().map(|m| m.0));
    }

    /// The worker with its breaker open (the downstream still down): the message is refused;
    /// with less than a visibility timeout and a sweep interval of room left it is
    /// dead-lettered (retention_ending), otherwise hidden for its spacing, capped by its room
    /// less that reserve (§1.11, §1.12).
    fn worker_refuses(&self, index: usize) {
        let mut q = self.0.lock().unwrap();
        let now = q.now.unwrap();
        let (id, _, expires) = q.messages[index].clone();
        // (Polled continuously in truth; here once a minute: room for less than a tick is
        // none.)
        let room = expires
            .duration_since(now)
            .unwrap_or_default()
            .checked_sub(VT + sqs_worker::polling::sweep_interval(RETENTION))
            .filter(|r| *r >= Duration::from_secs(60));
        match room {
            None => {
                q.messages.remove(index);
                q.dead_lettered.push(id);
            }
            Some(room) => q.messages[index].1 = now + room.min(Duration::from_secs(300)),
        }
    }

    /// The event source mapping's receives: every visible message.
    fn deliver_all(&self) {
        let visible: Vec<usize> = {
            let q = self.0.lock().unwrap();
            let now = q.now.unwrap();
            (0..q.messages.len())
                .filter(|&i| q.messages[i].1 <= now)
                .collect()
        };
        for i in visible.into_iter().rev() {
            self.worker_refuses(i);
        }
    }
}

/// The control's probe on that queue: one visible message, refused by the worker's breaker
/// (the probe fails, reopening it for twice as long).
struct QueueProbe(Queue, MemoryBreakerStore);

impl SourceProbe for QueueProbe {
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueue, ProcessError>> {
        Box::pin(async move {
            let q = (self.0).0.lock().unwrap();
            let now = q.now.unwrap();
            Ok(SourceQueue {
                visible: q.messages.iter().filter(|m| m.1 <= now).count() as u64,
                retention: RETENTION,
            })
        })
    }
    fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>> {
        Box::pin(async move {
            let index = {
                let q = (self.0).0.lock().unwrap();
                let now = q.now.unwrap();
                q.messages.iter().position(|m| m.1 <= now)
            };
            let Some(index) = index else {
                return Ok(ProbeOutcome::Empty);
            };
            let now = (self.0).0.lock().unwrap().now.unwrap();
            let state = self.1.read().await?;
            let opens = state.opens + 1;
            let period = Duration::from_secs(60) * 2u32.pow(opens.min(5) - 1);
            self.1.open(now + period, opens, now).await?;
            self.0.worker_refuses(index);
            Ok(ProbeOutcome::Returned)
        })
    }
}

/// Nothing is lost to a pause: a message with less retention left than the outage is
/// received (the queue pauses only once nothing waits unreceived) and dead-lettered with
/// its failure (reason retention_ending), not left to expire in the paused queue.
#[tokio::test]
async fn a_message_whose_retention_ends_during_a_pause_is_not_lost_without_a_record() {
    let t0 = SystemTime::now();
    let breaker = MemoryBreakerStore::default();
    // The second opening in a row: 120 s.
    assert!(breaker
        .open(
            t0 + Duration::from_secs(120),
            2,
            t0 - Duration::from_secs(600)
        )
        .await
        .unwrap());
    let queue = Queue::default();
    {
        let mut q = queue.0.lock().unwrap();
        // A fresh message first (the probe takes it), then one with 10 minutes left.
        q.messages
            .push(("young".into(), t0, t0 + Duration::from_secs(4 * 86_400)));
        q.messages
            .push(("old".into(), t0, t0 + Duration::from_secs(600)));
    }
    let enabled = Arc::new(AtomicBool::new(true));
    let control = PollingControl {
        breaker: breaker.clone(),
        mapping: Mapping {
            enabled: enabled.clone(),
            before_read: Arc::new(Mutex::new(None)),
        },
        marker: Marker::default(),
        probe: QueueProbe(queue.clone(), breaker.clone()),
    };
    // A 40-minute outage, the control once a minute as the template schedules it.
    for minute in 0..40 {
        let now = t0 + Duration::from_secs(60 * minute);
        queue.tick(now);
        control.run(now).await;
        if enabled.load(Ordering::SeqCst) {
            queue.deliver_all();
        }
    }
    let q = queue.0.lock().unwrap();
    assert!(
        q.expired_unrecorded.is_empty(),
        "expired in the paused queue without a record: {:?} (dead-lettered: {:?})",
        q.expired_unrecorded,
        q.dead_lettered
    );
}

/// The model without the control: the same message is dead-lettered (retention_ending) on
/// its capped last delivery.
#[tokio::test]
async fn without_the_control_the_model_dead_letters_the_message_too() {
    let t0 = SystemTime::now();
    let queue = Queue::default();
    queue
        .0
        .lock()
        .unwrap()
        .messages
        .push(("old".into(), t0, t0 + Duration::from_secs(600)));
    for minute in 0..40 {
        queue.tick(t0 + Duration::from_secs(60 * minute));
        queue.deliver_all();
    }
    let q = queue.0.lock().unwrap();
    assert!(q.expired_unrecorded.is_empty());
    assert_eq!(q.dead_lettered, ["old"]);
}

/// A six-day outage of a queue with four days of retention, a message arriving every hour
/// and the control running every minute: no message expires unrecorded (each is received
/// at least every quarter of its retention by a sweep, and dead-lettered when it could not
/// last to the next one).
#[tokio::test]
async fn an_outage_longer_than_the_retention_loses_no_message() {
    let t0 = SystemTime::now();
    let breaker = MemoryBreakerStore::default();
    assert!(breaker
        .open(
            t0 + Duration::from_secs(120),
            2,
            t0 - Duration::from_secs(600)
        )
        .await
        .unwrap());
    let queue = Queue::default();
    let enabled = Arc::new(AtomicBool::new(true));
    let control = PollingControl {
        breaker: breaker.clone(),
        mapping: Mapping {
            enabled: enabled.clone(),
            before_read: Arc::new(Mutex::new(None)),
        },
        marker: Marker::default(),
        probe: QueueProbe(queue.clone(), breaker.clone()),
    };
    let mut sent = 0;
    let (mut pauses, mut sweeping_runs) = (0, 0);
    for minute in 0..(6 * 24 * 60) {
        let now = t0 + Duration::from_secs(60 * minute);
        if minute % 60 == 0 {
            queue
                .0
                .lock()
                .unwrap()
                .messages
                .push((format!("m{minute}"), now, now + RETENTION));
            sent += 1;
        }
        queue.tick(now);
        match control.run(now).await {
            ControlAction::Paused => pauses += 1,
            ControlAction::Sweeping => sweeping_runs += 1,
            _ => {}
        }
        if enabled.load(Ordering::SeqCst) {
            // Polling while the open period is over: the worker's own probe fails and
            // reopens the breaker (the downstream is still down).
            let state = breaker.read().await.unwrap();
            if state.is_half_open(now) {
                let opens = state.opens + 1;
                let period = Duration::from_secs(60) * 2u32.pow(opens.min(5) - 1);
                breaker.open(now + period, opens, now).await.unwrap();
            }
            queue.deliver_all();
        }
    }
    // Paused after the second opening, then once after each sweep (every day).
    assert!(pauses >= 6, "{pauses} pauses");
    assert!(sweeping_runs >= 5, "{sweeping_runs} sweeping runs");
    let q = queue.0.lock().unwrap();
    assert!(
        q.expired_unrecorded.is_empty(),
        "{} of {sent} expired unrecorded",
        q.expired_unrecorded.len()
    );
    assert!(
        !q.dead_lettered.is_empty(),
        "the oldest reached their reserve"
    );
}
