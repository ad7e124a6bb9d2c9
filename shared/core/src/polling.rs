//! Stopping the worker's polling during a long outage, and restoring it (docs/ARCHITECTURE.md
//! §1.12).
//!
//! While the circuit breaker is open the worker still receives every waiting message and
//! hides it again: each message spends a receive per open period, and hours-long hides count
//! against SQS's in-flight limit. Once the breaker has opened a second time in a row (its
//! first probe failed: not a blip) and every waiting message has been received since (the
//! queue shows none visible), a scheduled control run disables the worker's event source
//! mapping, so no message is received at all. Once the open period is over, it probes by
//! taking one message from the source queue and invoking the worker with it (the worker's
//! breaker runs that record as its probe), and enables the mapping again when the breaker
//! has closed (or when the queue has nothing to probe with).
//!
//! A pause never outlasts a message. Every [`sweep_interval`] (an eighth of the queue's
//! retention, whatever the breaker's state) the mapping is enabled until the queue shows no
//! visible message: each waiting message is received once, and the worker, which keeps
//! [`sweep_reserve`] (a quarter) of a record's retention in reserve under a breaker
//! (`crate::batch`), dead-letters those that could expire before the next sweep. The other
//! eighth covers the schedule's period, the mapping's start and a visibility timeout: a
//! queue whose retention is too short for that, or for a sweep a lapsing lease delays
//! ([`MIN_SWEEP_INTERVAL`]), is never paused.
//!
//! Runs are serialised by a lease on the marker item (EventBridge may deliver a schedule
//! twice, and a run waiting on a slow call overlaps the next); the pause is recorded before
//! the mapping is disabled and cleared only after it is enabled again, so a mapping this
//! control disabled is always one it will enable; a mapping an operator disabled (no
//! record) is never touched. A breaker that cannot be read ends a pause (fail safe: the
//! worker then polls as it would without the control).
//!
//! The control is pure logic over three ports ([`MappingSwitch`], [`PauseMarker`],
//! [`SourceProbe`]) and the breaker's store; the AWS adapters are in
//! `sqs_keeper_aws::event_source`.

use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use serde::Serialize;

use crate::breaker::BreakerStore;
use crate::error::ProcessError;

/// The worker's event source mapping: read and set whether it polls.
pub trait MappingSwitch: Send + Sync {
    /// Tells whether the mapping is enabled (or enabling).
    fn enabled(&self) -> BoxFuture<'_, Result<bool, ProcessError>>;
    /// Enables or disables it.
    fn set_enabled(&self, enabled: bool) -> BoxFuture<'_, Result<(), ProcessError>>;
    /// Since when the mapping is disabled (its last change), `None` when it is not, or
    /// when the adapter cannot tell: what the control goes by when it cannot read its own
    /// record ([`blind_restore_after`]).
    fn disabled_since(&self) -> BoxFuture<'_, Result<Option<SystemTime>, ProcessError>> {
        Box::pin(async { Ok(None) })
    }
}

/// What the control recorded of its pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PauseState {
    /// The mapping is paused by this control (and must be restored by it).
    pub paused: bool,
    /// A sweep runs: the mapping is enabled until the queue shows no visible message.
    pub sweeping: bool,
    /// The sweep's enable succeeded (a sweeping mapping found disabled after that was
    /// disabled by somebody else).
    pub sweep_enabled: bool,
    /// When the pause, or the sweep, began.
    pub since: Option<SystemTime>,
}

/// The record of the pause, and the lease that serialises control runs.
pub trait PauseMarker: Send + Sync {
    /// Takes the control's lease until `until`, unless another run holds it at `now`.
    fn lease(
        &self,
        now: SystemTime,
        until: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>>;
    /// Gives back the lease taken until `until` (not one another run took since).
    fn release(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>>;
    /// Returns the recorded pause.
    fn read(&self) -> BoxFuture<'_, Result<PauseState, ProcessError>>;
    /// Records the pause.
    fn write(&self, state: PauseState) -> BoxFuture<'_, Result<(), ProcessError>>;
}

/// How a probe with one message of the source queue went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProbeOutcome {
    /// The source queue had no visible message.
    Empty,
    /// The worker processed (or dead-lettered) it; the message was deleted.
    Processed,
    /// The worker returned it for retry (its breaker refused it, or the downstream
    /// failed), or its answer could not be read; it stays in the queue.
    Returned,
}

/// What the control reads of the source queue (`GetQueueAttributes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceQueueState {
    /// `ApproximateNumberOfMessages`: visible messages.
    pub visible: u64,
    /// `MessageRetentionPeriod`.
    pub retention: Duration,
}

/// The source queue: its state, and a probe with one of its messages run by the worker as
/// the event source mapping would (deleted when the worker does not report it failed).
pub trait SourceProbe: Send + Sync {
    /// Returns the queue's visible messages and retention.
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueueState, ProcessError>>;
    /// Runs the probe.
    fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>>;
}

/// What a control run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "polling", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ControlAction {
    /// Nothing to do: polling runs (the breaker is closed, open for the first time, or
    /// waiting messages have not all been received since it opened).
    Polling,
    /// The breaker is open again: polling was stopped.
    Paused,
    /// Polling stays stopped: the breaker is still open, or a probe did not close it.
    StaysPaused {
        /// The probe run this time, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        probe: Option<ProbeOutcome>,
    },
    /// A sweep runs: polling is on until every waiting message has been received once.
    Sweeping,
    /// Polling was restored.
    Resumed {
        /// The probe run this time, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        probe: Option<ProbeOutcome>,
    },
    /// Another run holds the lease; this one did nothing.
    Busy,
    /// A call failed; nothing changed that a later run cannot finish.
    Failed {
        /// What failed.
        error: String,
    },
}

/// Opens in a row after which polling is stopped: the breaker opened again because its
/// first probe failed, so the outage is not a blip.
pub const PAUSE_AFTER_OPENS: u32 = 2;

/// How long a run holds the lease at most (the redrive function's longest run).
pub const PAUSE_LEASE: Duration = Duration::from_secs(900);

/// Returns how often a pause is interrupted by a sweep: an eighth of the queue's retention, so a
/// message is received at most eight times in its life by sweeps, whatever the outage's
/// length.
pub fn sweep_interval(retention: Duration) -> Duration {
    retention / 8
}

/// Returns what the worker keeps of a record's retention in reserve under a breaker: twice the
/// sweep interval, so a record it returns is still there at the next sweep with room for
/// one more delivery, the schedule's period and the mapping's start.
pub fn sweep_reserve(retention: Duration) -> Duration {
    retention / 4
}

/// Returns how long a mapping must have been disabled before a run that cannot read its own record
/// (the breaker table is unavailable: no lease, no marker) enables it anyway: a sweep
/// interval of the queue's retention, or an hour when that cannot be read either. The
/// record it cannot read may be its own pause, and a pause must never outlast a message:
/// this is the one case where a mapping an operator disabled may be enabled, after that
/// long (docs/ARCHITECTURE.md §1.12).
pub fn blind_restore_after(retention: Option<Duration>) -> Duration {
    retention.map_or(Duration::from_secs(3600), sweep_interval)
}

/// The shortest sweep interval the control pauses with (a queue with a retention under
/// 2 h 40 min is never paused). A run cut before it gave its lease back holds every later
/// run off for up to [`PAUSE_LEASE`], so a sweep may come that much late. The worker's
/// reserve (two intervals) must cover an interval, that delay, the schedule's minute and
/// the mapping's start.
pub const MIN_SWEEP_INTERVAL: Duration = Duration::from_secs(PAUSE_LEASE.as_secs() + 300);

/// Tells whether the control may pause a queue of this retention: its sweep interval is at least
/// [`MIN_SWEEP_INTERVAL`]. The worker keeps [`sweep_reserve`] only for such a queue; a
/// queue never paused needs no sweeps, and its records keep their whole retention.
pub fn pausable(retention: Duration) -> bool {
    sweep_interval(retention) >= min_sweep_interval()
}

/// [`MIN_SWEEP_INTERVAL`], or (with a mutant) the five minutes it was, which a lapsing
/// lease could outlast.
fn min_sweep_interval() -> Duration {
    if crate::mutants::is_on(crate::mutants::Mutant::SweepsOutlastedByLease) {
        Duration::from_secs(300)
    } else {
        MIN_SWEEP_INTERVAL
    }
}

/// Why a run's step failed: its own record could not be read ([`PollingControl::blind`]
/// then decides), or any other call failed (the next run finishes what this one began).
enum StepError {
    Blind(ProcessError),
    Seen(ProcessError),
}
use StepError::{Blind, Seen};

impl From<ProcessError> for StepError {
    fn from(error: ProcessError) -> Self {
        Seen(error)
    }
}

/// The control's ports.
pub struct PollingControl<B, S, M, P> {
    /// The worker's circuit breaker.
    pub breaker: B,
    /// The worker's event source mapping.
    pub mapping: S,
    /// Where the pause is recorded.
    pub marker: M,
    /// The source queue and the probe with one of its messages.
    pub probe: P,
}

impl<B: BreakerStore, S: MappingSwitch, M: PauseMarker, P: SourceProbe> PollingControl<B, S, M, P> {
    /// Makes one control run at `now`.
    pub async fn run(&self, now: SystemTime) -> ControlAction {
        match self.marker.lease(now, now + PAUSE_LEASE).await {
            Ok(true) => {}
            Ok(false) => return ControlAction::Busy,
            Err(error) => return self.blind(now, error).await,
        }
        let action = match self.step(now).await {
            Ok(action) => action,
            Err(Blind(error)) => self.blind(now, error).await,
            Err(Seen(error)) => ControlAction::Failed {
                error: error.to_string(),
            },
        };
        if let Err(error) = self.marker.release(now + PAUSE_LEASE).await {
            tracing::warn!(%error, "could not give the polling control's lease back; it lapses by itself");
        }
        action
    }

    /// Runs a control that cannot read its own record (no lease, no marker: the breaker table is
    /// unavailable): a mapping disabled for longer than [`blind_restore_after`] is enabled,
    /// since the record it cannot read may be its pause; anything else waits for the next
    /// run. The record is left as it is (a later run that reads it again finds the mapping
    /// enabled, and a pause's record then ends or sweeps as usual).
    async fn blind(&self, now: SystemTime, error: ProcessError) -> ControlAction {
        let failed = |error: ProcessError| ControlAction::Failed {
            error: error.to_string(),
        };
        let disabled_since = match self.mapping.disabled_since().await {
            Ok(Some(since)) => since,
            Ok(None) => return failed(error),
            Err(mapping_error) => {
                tracing::warn!(%mapping_error, "nor can the mapping be read");
                return failed(error);
            }
        };
        let retention = self.probe.queue().await.ok().map(|q| q.retention);
        if now.duration_since(disabled_since).unwrap_or(Duration::ZERO)
            < blind_restore_after(retention)
        {
            return failed(error);
        }
        tracing::warn!(%error, "the polling control cannot read its record, and the mapping has been disabled for longer than a sweep interval: polling is restored");
        match self.mapping.set_enabled(true).await {
            Ok(()) => ControlAction::Resumed { probe: None },
            Err(enable_error) => failed(enable_error),
        }
    }

    async fn step(&self, now: SystemTime) -> Result<ControlAction, StepError> {
        let pause = self.marker.read().await.map_err(Blind)?;
        let state = match self.breaker.read().await {
            Ok(state) => state,
            Err(error) if pause.paused => {
                // Fail safe: without the breaker's state nothing says the pause may go on.
                tracing::warn!(%error, "the breaker cannot be read: polling is restored");
                return Ok(self.resume(None).await?);
            }
            Err(error) => return Err(Seen(error)),
        };
        if pause.sweeping {
            return Ok(self.sweep_on(pause, state.is_open(now), now).await?);
        }
        if pause.paused {
            // A sweep is due whatever the breaker's state: probes that never reach the
            // breaker (a worker failing as a whole) must not keep the queue unswept.
            let queue = match self.probe.queue().await {
                Ok(queue) => queue,
                Err(error) => {
                    // Fail safe: without the queue's retention nothing says when the next
                    // sweep is due, and a pause must not outlast a message.
                    tracing::warn!(%error, "the source queue cannot be read: polling is restored");
                    return Ok(self.resume(None).await?);
                }
            };
            let since = pause.since.unwrap_or(now);
            if now.duration_since(since).unwrap_or(Duration::ZERO)
                >= sweep_interval(queue.retention)
            {
                return Ok(self.start_sweep(now).await?);
            }
        }
        Ok(self.decide(pause, state, now).await?)
    }

    /// Runs the rest of a control run, with the record and the breaker read and no sweep due.
    async fn decide(
        &self,
        pause: PauseState,
        state: crate::breaker::BreakerState,
        now: SystemTime,
    ) -> Result<ControlAction, ProcessError> {
        if state.is_open(now) {
            if pause.paused {
                // Finish a pause a crash may have cut between the record and the mapping.
                if self.mapping.enabled().await? {
                    self.mapping.set_enabled(false).await?;
                }
                return Ok(ControlAction::StaysPaused { probe: None });
            }
            if state.opens < PAUSE_AFTER_OPENS {
                return Ok(ControlAction::Polling);
            }
            let queue = self.probe.queue().await?;
            if queue.visible > 0 || !pausable(queue.retention) || !self.mapping.enabled().await? {
                // A first open is left to receive-and-hide, and so is a queue whose waiting
                // messages have not all been received (and judged against their retention)
                // since, or whose retention is too short to sweep in time; a mapping
                // disabled by somebody else is theirs.
                return Ok(ControlAction::Polling);
            }
            if crate::mutants::is_on(crate::mutants::Mutant::MappingDisabledBeforeMarker) {
                self.mapping.set_enabled(false).await?;
            }
            self.marker
                .write(PauseState {
                    paused: true,
                    since: Some(now),
                    ..PauseState::default()
                })
                .await?;
            self.mapping.set_enabled(false).await?;
            return Ok(ControlAction::Paused);
        }
        if !pause.paused {
            return Ok(ControlAction::Polling);
        }
        let mut probe = None;
        if state.is_half_open(now) {
            let outcome = self.probe.probe().await?;
            probe = Some(outcome);
            if outcome != ProbeOutcome::Empty {
                let after = self.breaker.read().await?;
                if after.open_until.is_some() {
                    // Reopened (the probe failed), or still half-open (refused: somebody
                    // else probes): wait for the next run.
                    return Ok(ControlAction::StaysPaused { probe });
                }
            }
        }
        self.resume(probe).await
    }

    /// Records a sweep, enables the mapping, then records that the enable succeeded.
    async fn start_sweep(&self, now: SystemTime) -> Result<ControlAction, ProcessError> {
        let mut sweep = PauseState {
            paused: true,
            sweeping: true,
            sweep_enabled: false,
            since: Some(now),
        };
        self.marker.write(sweep).await?;
        self.mapping.set_enabled(true).await?;
        sweep.sweep_enabled = true;
        self.marker.write(sweep).await?;
        Ok(ControlAction::Sweeping)
    }

    /// Runs the control during a sweep.
    async fn sweep_on(
        &self,
        pause: PauseState,
        open: bool,
        now: SystemTime,
    ) -> Result<ControlAction, ProcessError> {
        let enabled = self.mapping.enabled().await?;
        if !pause.sweep_enabled {
            // Finish a sweep a crash cut between its record and its enable.
            if !enabled {
                self.mapping.set_enabled(true).await?;
            }
            self.marker
                .write(PauseState {
                    sweep_enabled: true,
                    ..pause
                })
                .await?;
            return Ok(ControlAction::Sweeping);
        }
        if !enabled {
            // Disabled by somebody else since the sweep enabled it: theirs from now on.
            self.marker.write(PauseState::default()).await?;
            return Ok(ControlAction::Polling);
        }
        if !open {
            // Closed (or the open period over: the polling worker probes by itself).
            return self.resume(None).await;
        }
        if self.probe.queue().await?.visible > 0 {
            return Ok(ControlAction::Sweeping);
        }
        self.marker
            .write(PauseState {
                paused: true,
                since: Some(now),
                ..PauseState::default()
            })
            .await?;
        self.mapping.set_enabled(false).await?;
        Ok(ControlAction::Paused)
    }

    /// Enables the mapping, then clears the record.
    async fn resume(&self, probe: Option<ProbeOutcome>) -> Result<ControlAction, ProcessError> {
        self.mapping.set_enabled(true).await?;
        self.marker.write(PauseState::default()).await?;
        Ok(ControlAction::Resumed { probe })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemoryBreakerStore;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    const RETENTION: Duration = Duration::from_secs(4 * 86_400);

    /// The mapping, the marker (with its lease) and the queue's visible count, in memory.
    #[derive(Clone, Default)]
    struct Fakes {
        enabled: Arc<AtomicBool>,
        marker: crate::testing::MemoryPauseMarker,
        visible: Arc<AtomicU64>,
        fail_disable: Arc<AtomicBool>,
        calls: Arc<Mutex<Vec<&'static str>>>,
    }

    impl MappingSwitch for Fakes {
        fn enabled(&self) -> BoxFuture<'_, Result<bool, ProcessError>> {
            Box::pin(async { Ok(self.enabled.load(Ordering::SeqCst)) })
        }
        fn set_enabled(&self, enabled: bool) -> BoxFuture<'_, Result<(), ProcessError>> {
            Box::pin(async move {
                if !enabled && self.fail_disable.load(Ordering::SeqCst) {
                    return Err(ProcessError::new(
                        crate::error::ErrorClass::Permission,
                        "AccessDeniedException",
                    ));
                }
                self.calls
                    .lock()
                    .unwrap()
                    .push(if enabled { "enable" } else { "disable" });
                self.enabled.store(enabled, Ordering::SeqCst);
                Ok(())
            })
        }
    }

    /// The in-memory marker, its writes logged beside the mapping's calls.
    impl PauseMarker for Fakes {
        fn lease(
            &self,
            now: SystemTime,
            until: SystemTime,
        ) -> BoxFuture<'_, Result<bool, ProcessError>> {
            self.marker.lease(now, until)
        }
        fn release(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
            self.marker.release(until)
        }
        fn read(&self) -> BoxFuture<'_, Result<PauseState, ProcessError>> {
            self.marker.read()
        }
        fn write(&self, state: PauseState) -> BoxFuture<'_, Result<(), ProcessError>> {
            self.calls.lock().unwrap().push(match state {
                PauseState { paused: false, .. } => "unmark",
                PauseState { sweeping: true, .. } => "mark sweep",
                _ => "mark",
            });
            self.marker.write(state)
        }
    }

    /// A probe that closes the breaker (`Processed`), reopens it (`Returned`), or finds
    /// nothing; the queue's visible count comes from the fakes.
    struct Probe {
        breaker: MemoryBreakerStore,
        outcome: ProbeOutcome,
        fakes: Fakes,
    }

    impl SourceProbe for Probe {
        fn queue(&self) -> BoxFuture<'_, Result<SourceQueueState, ProcessError>> {
            Box::pin(async move {
                Ok(SourceQueueState {
                    visible: self.fakes.visible.load(Ordering::SeqCst),
                    retention: RETENTION,
                })
            })
        }
        fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>> {
            Box::pin(async move {
                let now = SystemTime::now();
                match self.outcome {
                    ProbeOutcome::Processed => self.breaker.close().await?,
                    ProbeOutcome::Returned => {
                        let state = self.breaker.read().await?;
                        self.breaker
                            .open(now + Duration::from_secs(120), state.opens + 1, now)
                            .await?;
                    }
                    ProbeOutcome::Empty => {}
                }
                Ok(self.outcome)
            })
        }
    }

    fn control(
        breaker: &MemoryBreakerStore,
        fakes: &Fakes,
        outcome: ProbeOutcome,
    ) -> PollingControl<MemoryBreakerStore, Fakes, Fakes, Probe> {
        PollingControl {
            breaker: breaker.clone(),
            mapping: fakes.clone(),
            marker: fakes.clone(),
            probe: Probe {
                breaker: breaker.clone(),
                outcome,
                fakes: fakes.clone(),
            },
        }
    }

    fn enabled_fakes() -> Fakes {
        let fakes = Fakes::default();
        fakes.enabled.store(true, Ordering::SeqCst);
        fakes
    }

    fn paused_fakes(since: SystemTime) -> Fakes {
        let fakes = Fakes::default();
        fakes.marker.set_state(PauseState {
            paused: true,
            since: Some(since),
            ..PauseState::default()
        });
        fakes
    }

    async fn opened(breaker: &MemoryBreakerStore, opens: u32, for_secs: i64, now: SystemTime) {
        let until = if for_secs >= 0 {
            now + Duration::from_secs(for_secs.unsigned_abs())
        } else {
            now - Duration::from_secs(for_secs.unsigned_abs())
        };
        assert!(breaker
            .open(until, opens, now - Duration::from_secs(600))
            .await
            .unwrap());
    }

    /// Simulation seed 210256: a run whose marker write and lease release both failed held
    /// every later run off for 15 minutes, no sweep came, and a message of a one-hour
    /// queue expired while the mapping was disabled. A queue is paused only when a sweep
    /// delayed by a whole lease still comes within the worker's reserve.
    #[test]
    fn a_lease_left_by_a_cut_run_cannot_delay_a_sweep_past_the_reserve() {
        let slack = Duration::from_secs(120);
        for retention_secs in [MIN_SWEEP_INTERVAL.as_secs() * 8, 4 * 86_400, 14 * 86_400] {
            let retention = Duration::from_secs(retention_secs);
            assert!(
                sweep_reserve(retention) >= sweep_interval(retention) + PAUSE_LEASE + slack,
                "retention {retention_secs} s"
            );
        }
        assert!(sweep_interval(Duration::from_secs(3_727)) < MIN_SWEEP_INTERVAL);
        // Never paused, so the worker keeps no reserve for its sweeps.
        assert!(!pausable(Duration::from_secs(3_727)));
        assert!(pausable(Duration::from_secs(4 * 86_400)));
    }

    #[tokio::test]
    async fn a_first_open_keeps_polling_a_second_pauses_it_marker_first() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let fakes = enabled_fakes();
        let c = control(&breaker, &fakes, ProbeOutcome::Processed);
        assert_eq!(c.run(now).await, ControlAction::Polling);
        opened(&breaker, 1, 60, now).await;
        assert_eq!(c.run(now).await, ControlAction::Polling);
        breaker.close().await.unwrap();
        opened(&breaker, 2, 120, now).await;
        assert_eq!(c.run(now).await, ControlAction::Paused);
        assert!(!fakes.enabled.load(Ordering::SeqCst));
        assert_eq!(*fakes.calls.lock().unwrap(), ["mark", "disable"]);
        assert_eq!(c.run(now).await, ControlAction::StaysPaused { probe: None });
    }

    #[tokio::test]
    async fn no_pause_while_messages_wait_unreceived_since_the_opening() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let fakes = enabled_fakes();
        fakes.visible.store(3, Ordering::SeqCst);
        opened(&breaker, 2, 120, now).await;
        let c = control(&breaker, &fakes, ProbeOutcome::Processed);
        assert_eq!(c.run(now).await, ControlAction::Polling);
        assert!(fakes.enabled.load(Ordering::SeqCst));
        fakes.visible.store(0, Ordering::SeqCst);
        assert_eq!(c.run(now).await, ControlAction::Paused);
    }

    #[tokio::test]
    async fn a_probe_that_closes_the_breaker_restores_polling_then_clears_the_marker() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let fakes = paused_fakes(now);
        opened(&breaker, 2, -1, now).await;
        let c = control(&breaker, &fakes, ProbeOutcome::Processed);
        assert_eq!(
            c.run(now).await,
            ControlAction::Resumed {
                probe: Some(ProbeOutcome::Processed)
            }
        );
        assert!(fakes.enabled.load(Ordering::SeqCst));
        assert!(!fakes.marker.state().paused);
        assert_eq!(*fakes.calls.lock().unwrap(), ["enable", "unmark"]);
    }

    #[tokio::test]
    async fn a_failed_probe_keeps_polling_stopped_and_an_empty_queue_restores_it() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let fakes = paused_fakes(now);
        opened(&breaker, 2, -1, now).await;
        let failing = control(&breaker, &fakes, ProbeOutcome::Returned);
        assert_eq!(
            failing.run(now).await,
            ControlAction::StaysPaused {
                probe: Some(ProbeOutcome::Returned)
            }
        );
        assert!(!fakes.enabled.load(Ordering::SeqCst));
        // The reopened breaker's period ends; the queue is empty: nothing to wait for.
        let later = now + Duration::from_secs(121);
        let empty = control(&breaker, &fakes, ProbeOutcome::Empty);
        assert!(matches!(
            empty.run(later).await,
            ControlAction::Resumed {
                probe: Some(ProbeOutcome::Empty)
            }
        ));
        assert!(fakes.enabled.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_mapping_disabled_by_an_operator_is_never_enabled() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let fakes = Fakes::default();
        let c = control(&breaker, &fakes, ProbeOutcome::Processed);
        opened(&breaker, 3, 60, now).await;
        assert_eq!(c.run(now).await, ControlAction::Polling);
        breaker.close().await.unwrap();
        assert_eq!(c.run(now).await, ControlAction::Polling);
        assert!(!fakes.enabled.load(Ordering::SeqCst));
        assert!(fakes.calls.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_pause_cut_between_marker_and_mapping_is_finished_and_undone_later() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let fakes = enabled_fakes();
        fakes.fail_disable.store(true, Ordering::SeqCst);
        opened(&breaker, 2, 60, now).await;
        let c = control(&breaker, &fakes, ProbeOutcome::Processed);
        assert!(matches!(c.run(now).await, ControlAction::Failed { .. }));
        // Marked but still polling: the next run finishes the pause.
        assert!(fakes.marker.state().paused);
        fakes.fail_disable.store(false, Ordering::SeqCst);
        assert_eq!(c.run(now).await, ControlAction::StaysPaused { probe: None });
        assert!(!fakes.enabled.load(Ordering::SeqCst));
        // Closed by somebody else (the redrive's probe): polling comes back without a probe.
        breaker.close().await.unwrap();
        assert_eq!(c.run(now).await, ControlAction::Resumed { probe: None });
        assert!(fakes.enabled.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_run_while_another_holds_the_lease_does_nothing() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let fakes = enabled_fakes();
        opened(&breaker, 2, 60, now).await;
        fakes.marker.hold_lease(now + Duration::from_secs(30));
        let c = control(&breaker, &fakes, ProbeOutcome::Processed);
        assert_eq!(c.run(now).await, ControlAction::Busy);
        assert!(fakes.enabled.load(Ordering::SeqCst));
        // A lease whose run died lapses.
        assert_eq!(
            c.run(now + Duration::from_secs(31)).await,
            ControlAction::Paused
        );
        assert_eq!(fakes.marker.lease_until(), None, "given back");
    }

    #[tokio::test]
    async fn a_long_pause_is_swept_every_eighth_of_the_retention_until_nothing_is_visible() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let fakes = paused_fakes(now);
        opened(&breaker, 6, 30 * 86_400, now).await;
        let c = control(&breaker, &fakes, ProbeOutcome::Processed);
        let interval = Duration::from_secs(12 * 3600);
        assert_eq!(
            c.run(now + interval - Duration::from_secs(1)).await,
            ControlAction::StaysPaused { probe: None }
        );
        fakes.visible.store(40, Ordering::SeqCst);
        assert_eq!(c.run(now + interval).await, ControlAction::Sweeping);
        assert!(fakes.enabled.load(Ordering::SeqCst));
        assert_eq!(
            c.run(now + interval + Duration::from_secs(60)).await,
            ControlAction::Sweeping
        );
        fakes.visible.store(0, Ordering::SeqCst);
        let swept = now + interval + Duration::from_secs(120);
        assert_eq!(c.run(swept).await, ControlAction::Paused);
        assert!(!fakes.enabled.load(Ordering::SeqCst));
        assert_eq!(fakes.marker.state().since, Some(swept));
    }

    #[tokio::test]
    async fn a_breaker_that_cannot_be_read_ends_a_pause() {
        struct Unreadable;
        impl BreakerStore for Unreadable {
            fn read(&self) -> BoxFuture<'_, Result<crate::breaker::BreakerState, ProcessError>> {
                Box::pin(async {
                    Err(ProcessError::new(
                        crate::error::ErrorClass::Permission,
                        "AccessDeniedException",
                    ))
                })
            }
            fn add_failures(
                &self,
                _: u32,
                _: SystemTime,
                _: Duration,
            ) -> BoxFuture<'_, Result<crate::breaker::BreakerState, ProcessError>> {
                self.read()
            }
            fn open(
                &self,
                _: SystemTime,
                _: u32,
                _: SystemTime,
            ) -> BoxFuture<'_, Result<bool, ProcessError>> {
                Box::pin(async { Ok(false) })
            }
            fn take_probe(
                &self,
                _: SystemTime,
                _: SystemTime,
            ) -> BoxFuture<'_, Result<bool, ProcessError>> {
                Box::pin(async { Ok(false) })
            }
            fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
                Box::pin(async { Ok(()) })
            }
            fn release_probe(&self, _: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
                Box::pin(async { Ok(()) })
            }
        }
        let now = SystemTime::now();
        let fakes = paused_fakes(now);
        let c = PollingControl {
            breaker: Unreadable,
            mapping: fakes.clone(),
            marker: fakes.clone(),
            probe: Probe {
                breaker: MemoryBreakerStore::default(),
                outcome: ProbeOutcome::Empty,
                fakes: fakes.clone(),
            },
        };
        assert_eq!(c.run(now).await, ControlAction::Resumed { probe: None });
        assert!(fakes.enabled.load(Ordering::SeqCst));
        assert!(!fakes.marker.state().paused);
    }
}
