//! The polling control (docs/ARCHITECTURE.md §1.12) and the worker's sweep reserve against
//! what can break them: two overlapping runs (EventBridge delivers at least once; a run
//! that waits on a throttled call overlaps the next minute's), a model of SQS in which
//! messages expire at the end of their retention, paused or not, a sweep cut between its
//! record and its enable, probes that never reach the breaker, an operator disabling the
//! mapping mid-sweep, the schedule's minute against the reserve, and no reserve without a
//! breaker.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lambda_events::sqs::SqsEvent;
use futures::future::BoxFuture;
use serde_json::json;
use sqs_keeper_core::breaker::BreakerStore;
use sqs_keeper_core::dead_letter::InvocationInfo;
use sqs_keeper_core::retry::Deadline;
use sqs_keeper_core::{batch::Disposition, BatchConfig, BatchProcessor};
use sqs_keeper_core::{
    polling::sweep_interval, polling::sweep_reserve, polling::ControlAction,
    polling::MappingSwitch, polling::PauseState, polling::PollingControl, polling::ProbeOutcome,
    polling::SourceProbe, polling::SourceQueueState,
};
use sqs_keeper_core::{redelivery::Hide, redelivery::QueueTiming, redelivery::VisibilityPort};
use sqs_keeper_core::{
    testing::MemoryBreakerStore, testing::MemoryPauseMarker, testing::MemorySink,
    testing::ScriptedProcessor, testing::Step,
};
use sqs_keeper_core::{ErrorClass, ProcessError};

const MINUTE: Duration = Duration::from_secs(60);

type Hook = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// The worker's mapping (shared flag). `before_read`, when set, runs once inside the first
/// `enabled()` call: what another control run did while this one waited on the Lambda API.
/// `fail_enables` enabling calls fail (a throttled `UpdateEventSourceMapping`, or the run
/// killed right after its marker write).
#[derive(Clone, Default)]
struct Mapping {
    enabled: Arc<AtomicBool>,
    before_read: Arc<Mutex<Option<Hook>>>,
    fail_enables: Arc<AtomicU32>,
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
            if enabled
                && self
                    .fail_enables
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                return Err(ProcessError::new(
                    ErrorClass::Throttled,
                    "TooManyRequestsException",
                ));
            }
            self.enabled.store(enabled, Ordering::SeqCst);
            Ok(())
        })
    }
}

/// The marker item: the pause and the control's lease.
type Marker = MemoryPauseMarker;

/// A probe whose message the worker processes, closing its breaker.
#[derive(Clone)]
struct ClosingProbe(MemoryBreakerStore);

impl SourceProbe for ClosingProbe {
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueueState, ProcessError>> {
        Box::pin(async move {
            Ok(SourceQueueState {
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
    marker.set_state(PauseState {
        paused: true,
        since: Some(now),
        ..PauseState::default()
    });

    let b = PollingControl {
        breaker: breaker.clone(),
        mapping: Mapping {
            enabled: enabled.clone(),
            ..Mapping::default()
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
            ..Mapping::default()
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
        enabled.load(Ordering::SeqCst) && !marker.state().paused,
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
            .checked_sub(VT + sweep_reserve(RETENTION))
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
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueueState, ProcessError>> {
        Box::pin(async move {
            let q = (self.0).0.lock().unwrap();
            let now = q.now.unwrap();
            Ok(SourceQueueState {
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
            ..Mapping::default()
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
            ..Mapping::default()
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

/// How the worker answers a probe.
#[derive(Clone, Copy)]
enum ProbeAnswer {
    /// The worker failed as a whole, or returned the record before its breaker ran it
    /// (its idempotency store or payload bucket down, a bad deploy): the breaker is
    /// untouched and the message stays.
    ReturnedUntouched,
    /// `Invoke` itself failed (throttled, the function being updated).
    InvokeFails,
}

/// The source queue: a visible count and the retention.
#[derive(Clone)]
struct Probe {
    visible: Arc<AtomicU64>,
    answer: ProbeAnswer,
    probes: Arc<AtomicU32>,
}

impl SourceProbe for Probe {
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueueState, ProcessError>> {
        Box::pin(async move {
            Ok(SourceQueueState {
                visible: self.visible.load(Ordering::SeqCst),
                retention: RETENTION,
            })
        })
    }
    fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>> {
        Box::pin(async move {
            self.probes.fetch_add(1, Ordering::SeqCst);
            match self.answer {
                ProbeAnswer::ReturnedUntouched => Ok(ProbeOutcome::Returned),
                ProbeAnswer::InvokeFails => Err(ProcessError::new(
                    ErrorClass::Throttled,
                    "TooManyRequestsException",
                )),
            }
        })
    }
}

fn control(
    breaker: &MemoryBreakerStore,
    mapping: &Mapping,
    marker: &Marker,
    probe: &Probe,
) -> PollingControl<MemoryBreakerStore, Mapping, Marker, Probe> {
    PollingControl {
        breaker: breaker.clone(),
        mapping: mapping.clone(),
        marker: marker.clone(),
        probe: probe.clone(),
    }
}

/// Promise: a crash (or a failed call) between any two steps is finished by the next run.
///
/// A sweep is due: the run records the sweep, then `UpdateEventSourceMapping(enabled)`
/// fails (throttled, or the run dies there). Every later run sees `sweeping` and a visible
/// count above zero and answers `Sweeping` without ever enabling the mapping: nothing polls,
/// so the visible count never drops, and the sweep that was to receive every waiting message
/// before its retention ends never happens for as long as the breaker stays open.
#[tokio::test]
async fn a_sweep_cut_between_its_record_and_the_enable_is_finished_by_the_next_run() {
    let t0 = SystemTime::now();
    let breaker = MemoryBreakerStore::default();
    // A long open period (the 16x cap of a longer configured period).
    assert!(breaker
        .open(t0 + Duration::from_secs(6 * 3600), 5, t0 - MINUTE)
        .await
        .unwrap());
    let mapping = Mapping::default(); // disabled by the control's pause
    mapping.fail_enables.store(1, Ordering::SeqCst);
    let marker = Marker::default();
    marker.set_state(PauseState {
        paused: true,
        sweeping: false,
        sweep_enabled: false,
        since: Some(t0 - sweep_interval(RETENTION)),
    });
    let probe = Probe {
        visible: Arc::new(AtomicU64::new(25)),
        answer: ProbeAnswer::ReturnedUntouched,
        probes: Arc::default(),
    };
    let c = control(&breaker, &mapping, &marker, &probe);
    let first = c.run(t0).await;
    assert!(
        matches!(first, ControlAction::Failed { .. }),
        "the enable failed: {first:?}"
    );
    assert!(marker.state().sweeping, "the sweep is recorded");
    let mut answers = Vec::new();
    for minute in 1..=30 {
        answers.push(c.run(t0 + MINUTE * minute).await);
        if mapping.enabled.load(Ordering::SeqCst) {
            return;
        }
    }
    panic!(
        "30 runs after a sweep was cut between its record and the enable, the mapping is \
         still disabled (marker {:?}); the runs answered {:?}",
        marker.state(),
        &answers[..3]
    );
}

/// Promise: a pause never outlasts a message (no message expires unrecorded).
///
/// Paused, the breaker's open period over (half-open). Each run probes; the worker returns
/// the probe's record without its breaker having run it (its idempotency store is down, or
/// it fails as a whole), so the breaker stays half-open and every run answers
/// `StaysPaused`. The sweep check lives only in the "breaker open" branch: the queue is
/// never swept, and the messages waiting in it (sent at the pause) expire at the end of
/// their retention without ever being received.
#[tokio::test]
async fn a_pause_whose_probes_never_reach_the_breaker_is_still_swept() {
    for answer in [ProbeAnswer::ReturnedUntouched, ProbeAnswer::InvokeFails] {
        let t0 = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        assert!(breaker
            .open(
                t0 - Duration::from_secs(1),
                2,
                t0 - Duration::from_secs(600)
            )
            .await
            .unwrap());
        let mapping = Mapping::default();
        let marker = Marker::default();
        marker.set_state(PauseState {
            paused: true,
            sweeping: false,
            sweep_enabled: false,
            since: Some(t0),
        });
        let probe = Probe {
            visible: Arc::new(AtomicU64::new(40)),
            answer,
            probes: Arc::default(),
        };
        let c = control(&breaker, &mapping, &marker, &probe);
        // The messages waiting since t0 expire at t0 + RETENTION. The control runs every
        // minute until then.
        let mut polled_at = None;
        let mut last = None;
        let mut minute = 0;
        while t0 + MINUTE * minute < t0 + RETENTION {
            last = Some(c.run(t0 + MINUTE * minute).await);
            if mapping.enabled.load(Ordering::SeqCst) {
                polled_at = Some(minute);
                break;
            }
            minute += 1;
        }
        assert!(
            polled_at.is_some(),
            "{} control runs over the whole {}-day retention never enabled the mapping: \
             the 40 waiting messages expire unreceived ({} probes; last answer {:?}; \
             breaker {:?})",
            minute,
            RETENTION.as_secs() / 86_400,
            probe.probes.load(Ordering::SeqCst),
            last,
            breaker.state()
        );
    }
}

/// Promise: a mapping disabled by an operator is never enabled.
///
/// During a sweep (the control enabled the mapping) an operator disables it (an incident
/// elsewhere, a deploy). The control does not look at the mapping while sweeping; when the
/// breaker closes it enables the mapping the operator disabled.
#[tokio::test]
async fn a_mapping_an_operator_disabled_during_a_sweep_is_not_enabled_by_the_control() {
    let t0 = SystemTime::now();
    let breaker = MemoryBreakerStore::default();
    assert!(breaker
        .open(t0 + Duration::from_secs(900), 4, t0 - MINUTE)
        .await
        .unwrap());
    let mapping = Mapping::default();
    mapping.enabled.store(true, Ordering::SeqCst);
    let marker = Marker::default();
    marker.set_state(PauseState {
        paused: true,
        sweeping: true,
        sweep_enabled: true,
        since: Some(t0),
    });
    let probe = Probe {
        visible: Arc::new(AtomicU64::new(3)),
        answer: ProbeAnswer::ReturnedUntouched,
        probes: Arc::default(),
    };
    let c = control(&breaker, &mapping, &marker, &probe);
    assert_eq!(c.run(t0).await, ControlAction::Sweeping);
    // The operator disables the mapping: from then on it is theirs.
    mapping.enabled.store(false, Ordering::SeqCst);
    assert_eq!(c.run(t0 + MINUTE).await, ControlAction::Polling);
    // The downstream recovers (the redrive's probe closes the breaker).
    breaker.close().await.unwrap();
    let action = c.run(t0 + MINUTE * 2).await;
    assert!(
        !mapping.enabled.load(Ordering::SeqCst),
        "the control enabled a mapping an operator disabled ({action:?})"
    );
}

/// Reads nothing but the queue's timing; records hides.
struct TimingPort {
    timing: QueueTiming,
    hides: Mutex<Vec<Hide>>,
}

impl VisibilityPort for TimingPort {
    fn hide<'a>(&'a self, records: &'a [Hide]) -> BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(async move {
            self.hides.lock().unwrap().extend(records.iter().cloned());
            records.iter().map(|_| Ok(())).collect()
        })
    }
    fn queue_timing<'a>(&'a self, _queue_arn: &'a str) -> BoxFuture<'a, Option<QueueTiming>> {
        Box::pin(async move { Some(self.timing) })
    }
}

/// A source queue with one message whose visibility the test sets (for the control).
#[derive(Clone)]
struct OneMessage {
    visible_at: SystemTime,
    expires: SystemTime,
    now: Arc<Mutex<SystemTime>>,
}

impl SourceProbe for OneMessage {
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueueState, ProcessError>> {
        Box::pin(async move {
            let now = *self.now.lock().unwrap();
            Ok(SourceQueueState {
                visible: u64::from(now >= self.visible_at && now < self.expires),
                retention: RETENTION,
            })
        })
    }
    fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>> {
        Box::pin(async { Ok(ProbeOutcome::Returned) })
    }
}

/// Promise: no message expires unrecorded in a paused queue (§1.12: "a record returned for
/// retry needs room for a sweep and a delivery, else it is dead-lettered").
///
/// The template's worker with a 10 s timeout (visibility timeout 60 s), the breaker on and
/// `RedeliveryBaseSeconds=0` (or a `ChangeMessageVisibility` that failed: the same path).
/// The real engine keeps a refused record whose retention at the hard stop exceeds the
/// visibility timeout plus a quarter of the retention. The record is not hidden, so it
/// becomes visible again one visibility timeout after its receive: from then on it has only
/// a quarter of the retention plus the invocation's length (~10 s) left. The control paused
/// the mapping one second before it reappeared, in a run that started 2 s into its minute
/// (a cold start). The control runs every minute (the template's `rate(1 minute)`); the run
/// a quarter of the retention later started on the minute, 2 s short of the sweep interval,
/// so the sweep waits for the next minute: the message expired ~45 s before it.
#[tokio::test]
async fn the_sweep_reserve_covers_the_control_schedule() {
    let vt = Duration::from_secs(60);
    let port = Arc::new(TimingPort {
        timing: QueueTiming {
            retention: RETENTION,
            visibility_timeout: vt,
        },
        hides: Mutex::new(Vec::new()),
    });
    let mut config = BatchConfig::default();
    config.parser.id_source = "pointer:/id".parse().unwrap();
    config.retry.max_attempts = 1;
    config.max_receive_count = Some(5);
    let engine = BatchProcessor::new(
        ScriptedProcessor::new().script(
            "a",
            vec![Step::Error(
                ProcessError::new(ErrorClass::ServerError, "circuit open").with_code("CircuitOpen"),
            )],
        ),
        MemorySink::new(),
        config,
    )
    .with_sweep_reserve(port.clone());
    let timeout = Duration::from_secs(10);
    let received = SystemTime::now();
    // Expires 2 s later than the worker's least room for keeping it, judged at the hard
    // stop (at most `timeout` after the receive).
    let expires = received + timeout + vt + sweep_reserve(RETENTION) + Duration::from_secs(2);
    let sent = expires - RETENTION;
    let event: SqsEvent = serde_json::from_value(json!({"Records": [{
        "messageId": "m-a",
        "receiptHandle": "rh-a",
        "body": json!({"id": "a"}).to_string(),
        "attributes": {
            "ApproximateReceiveCount": "2",
            "SentTimestamp": sent.duration_since(UNIX_EPOCH).unwrap().as_millis().to_string(),
        },
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
    }]}))
    .unwrap();
    let report = engine
        .process_batch(
            event,
            Deadline::after(timeout, Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let disposition = report.records[0].disposition.clone();
    assert!(
        matches!(disposition, Disposition::RetryLater { .. }),
        "the worker kept the record for another delivery: {disposition:?}"
    );
    assert!(port.hides.lock().unwrap().is_empty(), "not hidden");
    // Back in the queue one visibility timeout after the receive.
    let visible_at = received + vt;

    // The control: breaker open (second opening), mapping enabled, nothing visible yet.
    let breaker = MemoryBreakerStore::default();
    assert!(breaker
        .open(received + Duration::from_secs(3 * 86_400), 2, received)
        .await
        .unwrap());
    let mapping = Mapping::default();
    mapping.enabled.store(true, Ordering::SeqCst);
    let marker = Marker::default();
    let now = Arc::new(Mutex::new(received));
    let queue = OneMessage {
        visible_at,
        expires,
        now: now.clone(),
    };
    let c = PollingControl {
        breaker: breaker.clone(),
        mapping: mapping.clone(),
        marker: marker.clone(),
        probe: queue,
    };
    // The pause run: a second before the message reappears, 2 s into its minute.
    let paused_at = visible_at - Duration::from_secs(1);
    let minute0 = paused_at - Duration::from_secs(2);
    *now.lock().unwrap() = paused_at;
    assert_eq!(c.run(paused_at).await, ControlAction::Paused);
    // Every later run on the minute.
    for k in 1u32.. {
        let at = minute0 + MINUTE * k;
        if at >= expires {
            let late = at.duration_since(expires).unwrap();
            panic!(
                "the message expired unreceived in the paused queue: the worker kept it with \
                 {:?} beyond a quarter of the retention after its reappearance, the sweep \
                 was not due until {:?} after the reappearance (marker {:?}; {late:?} late at \
                 the run of minute {k})",
                expires.duration_since(visible_at).unwrap() - sweep_reserve(RETENTION),
                at.duration_since(visible_at).unwrap() - sweep_reserve(RETENTION),
                marker.state()
            );
        }
        *now.lock().unwrap() = at;
        c.run(at).await;
        if mapping.enabled.load(Ordering::SeqCst) {
            // Swept: received (optimistically, at once) before its expiry.
            return;
        }
    }
}

/// What held: without a breaker (no sweep reserve) a record with an hour of room beyond a
/// visibility timeout is returned, not dead-lettered; with the reserve it is dead-lettered
/// (`retention_ending`), as documented.
#[tokio::test]
async fn without_a_breaker_no_reserve_is_kept() {
    let vt = Duration::from_secs(60);
    for reserve in [false, true] {
        let port = Arc::new(TimingPort {
            timing: QueueTiming {
                retention: RETENTION,
                visibility_timeout: vt,
            },
            hides: Mutex::new(Vec::new()),
        });
        let mut config = BatchConfig::default();
        config.parser.id_source = "pointer:/id".parse().unwrap();
        config.retry.max_attempts = 1;
        let mut engine = BatchProcessor::new(
            ScriptedProcessor::new().script("a", vec![Step::Fail(ErrorClass::ServerError)]),
            MemorySink::new(),
            config,
        )
        .with_redelivery(
            sqs_keeper_core::redelivery::RedeliveryPolicy {
                base: Duration::from_secs(300),
                multiplier: 3,
                max: Duration::from_secs(4 * 3600),
            },
            port.clone(),
        );
        if reserve {
            engine = engine.with_sweep_reserve(port.clone());
        }
        let sent = SystemTime::now() + vt + Duration::from_secs(3600) - RETENTION;
        let event: SqsEvent = serde_json::from_value(json!({"Records": [{
            "messageId": "m-a", "receiptHandle": "rh-a",
            "body": json!({"id": "a"}).to_string(),
            "attributes": {"ApproximateReceiveCount": "1",
                "SentTimestamp": sent.duration_since(UNIX_EPOCH).unwrap().as_millis().to_string()},
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
        }]}))
        .unwrap();
        let report = engine
            .process_batch(
                event,
                Deadline::after(Duration::from_secs(10), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        let d = &report.records[0].disposition;
        if reserve {
            assert!(matches!(d, Disposition::DeadLettered { .. }), "{d:?}");
        } else {
            assert!(matches!(d, Disposition::RetryLater { .. }), "{d:?}");
            let hides = port.hides.lock().unwrap();
            assert!(hides[0].delay <= Duration::from_secs(3600), "{hides:?}");
        }
    }
}
