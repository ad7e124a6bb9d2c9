//! Stopping the worker's polling during a long outage, and restoring it (docs/ARCHITECTURE.md
//! §1.12).
//!
//! While the circuit breaker is open the worker still receives every waiting message and
//! hides it again: each message spends a receive per open period, and hours-long hides count
//! against SQS's in-flight limit. Once the breaker has opened a second time in a row (its
//! first probe failed: not a blip), a scheduled control run disables the worker's event
//! source mapping, so no message is received at all; once the open period is over, it
//! probes by taking one message from the source queue and invoking the worker with it (the
//! worker's breaker runs that record as its probe), and enables the mapping again when the
//! breaker has closed (or when the queue has nothing to probe with).
//!
//! Order makes a crash harmless: the pause is recorded (a marker item in the breaker's
//! table) before the mapping is disabled, and cleared only after it is enabled again, so a
//! mapping this control disabled is always one it will enable; a mapping an operator
//! disabled (no marker) is never touched. Without the marker's table, the mapping's id or
//! the permissions, receive-and-hide stays the behaviour (the control reports why).
//!
//! The control is pure logic over three ports ([`MappingSwitch`], [`PauseMarker`],
//! [`SourceProbe`]) and the breaker's store; the AWS adapters are in
//! `crate::adapters::polling`.

use std::time::SystemTime;

use futures::future::BoxFuture;
use serde::Serialize;

use crate::breaker::BreakerStore;
use crate::error::ProcessError;

/// The worker's event source mapping: read and set whether it polls.
pub trait MappingSwitch: Send + Sync {
    /// Whether the mapping is enabled (or enabling).
    fn enabled(&self) -> BoxFuture<'_, Result<bool, ProcessError>>;
    /// Enables or disables it.
    fn set_enabled(&self, enabled: bool) -> BoxFuture<'_, Result<(), ProcessError>>;
}

/// The record that this control paused the mapping (and must restore it).
pub trait PauseMarker: Send + Sync {
    /// Whether the mapping is paused by this control.
    fn paused(&self) -> BoxFuture<'_, Result<bool, ProcessError>>;
    /// Records (or clears) the pause.
    fn set_paused(&self, paused: bool) -> BoxFuture<'_, Result<(), ProcessError>>;
}

/// How a probe with one message of the source queue went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeOutcome {
    /// The source queue had no visible message.
    Empty,
    /// The worker processed (or dead-lettered) it; the message was deleted.
    Processed,
    /// The worker returned it for retry (its breaker refused it, or the downstream
    /// failed); it stays in the queue, hidden as the worker decided.
    Returned,
}

/// Takes one message of the source queue and has the worker process it, as the event source
/// mapping would: deleted when the worker does not report it failed.
pub trait SourceProbe: Send + Sync {
    /// Runs the probe.
    fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>>;
}

/// What a control run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "polling", rename_all = "snake_case")]
pub enum ControlAction {
    /// Nothing to do: the breaker is closed (or open for the first time) and polling runs.
    Polling,
    /// The breaker is open again: polling was stopped.
    Paused,
    /// Polling stays stopped: the breaker is still open, or a probe did not close it.
    StaysPaused {
        /// The probe run this time, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        probe: Option<ProbeOutcome>,
    },
    /// Polling was restored.
    Resumed {
        /// The probe run this time, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        probe: Option<ProbeOutcome>,
    },
    /// A call failed; nothing changed that a later run cannot finish.
    Failed {
        /// What failed.
        error: String,
    },
}

/// Opens in a row after which polling is stopped: the breaker opened again because its
/// first probe failed, so the outage is not a blip.
pub const PAUSE_AFTER_OPENS: u32 = 2;

/// The control's ports.
pub struct PollingControl<B, S, M, P> {
    /// The worker's circuit breaker.
    pub breaker: B,
    /// The worker's event source mapping.
    pub mapping: S,
    /// Where the pause is recorded.
    pub marker: M,
    /// The probe with a source message.
    pub probe: P,
}

impl<B: BreakerStore, S: MappingSwitch, M: PauseMarker, P: SourceProbe> PollingControl<B, S, M, P> {
    /// One control run at `now`.
    pub async fn run(&self, now: SystemTime) -> ControlAction {
        match self.step(now).await {
            Ok(action) => action,
            Err(error) => ControlAction::Failed {
                error: error.to_string(),
            },
        }
    }

    async fn step(&self, now: SystemTime) -> Result<ControlAction, ProcessError> {
        let state = self.breaker.read().await?;
        let paused = self.marker.paused().await?;
        if state.is_open(now) {
            if paused {
                // Finish a pause a crash may have cut between the marker and the mapping.
                if self.mapping.enabled().await? {
                    self.mapping.set_enabled(false).await?;
                }
                return Ok(ControlAction::StaysPaused { probe: None });
            }
            if state.opens < PAUSE_AFTER_OPENS || !self.mapping.enabled().await? {
                // A first open is left to receive-and-hide; a mapping disabled by somebody
                // else is theirs.
                return Ok(ControlAction::Polling);
            }
            self.marker.set_paused(true).await?;
            self.mapping.set_enabled(false).await?;
            return Ok(ControlAction::Paused);
        }
        if !paused {
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
        self.mapping.set_enabled(true).await?;
        self.marker.set_paused(false).await?;
        Ok(ControlAction::Resumed { probe })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemoryBreakerStore;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[derive(Clone, Default)]
    struct Flags {
        enabled: Arc<AtomicBool>,
        paused: Arc<AtomicBool>,
        fail_disable: Arc<AtomicBool>,
        calls: Arc<Mutex<Vec<&'static str>>>,
    }

    impl MappingSwitch for Flags {
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

    impl PauseMarker for Flags {
        fn paused(&self) -> BoxFuture<'_, Result<bool, ProcessError>> {
            Box::pin(async { Ok(self.paused.load(Ordering::SeqCst)) })
        }
        fn set_paused(&self, paused: bool) -> BoxFuture<'_, Result<(), ProcessError>> {
            Box::pin(async move {
                self.calls
                    .lock()
                    .unwrap()
                    .push(if paused { "mark" } else { "unmark" });
                self.paused.store(paused, Ordering::SeqCst);
                Ok(())
            })
        }
    }

    /// A probe that closes the breaker (`Processed`), reopens it (`Returned`), or finds
    /// nothing.
    struct Probe {
        breaker: MemoryBreakerStore,
        outcome: ProbeOutcome,
    }

    impl SourceProbe for Probe {
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
        flags: &Flags,
        outcome: ProbeOutcome,
    ) -> PollingControl<MemoryBreakerStore, Flags, Flags, Probe> {
        PollingControl {
            breaker: breaker.clone(),
            mapping: flags.clone(),
            marker: flags.clone(),
            probe: Probe {
                breaker: breaker.clone(),
                outcome,
            },
        }
    }

    fn enabled_flags() -> Flags {
        let flags = Flags::default();
        flags.enabled.store(true, Ordering::SeqCst);
        flags
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

    #[tokio::test]
    async fn a_first_open_keeps_polling_a_second_pauses_it_marker_first() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let flags = enabled_flags();
        let c = control(&breaker, &flags, ProbeOutcome::Processed);
        assert_eq!(c.run(now).await, ControlAction::Polling);
        opened(&breaker, 1, 60, now).await;
        assert_eq!(c.run(now).await, ControlAction::Polling);
        breaker.close().await.unwrap();
        opened(&breaker, 2, 120, now).await;
        assert_eq!(c.run(now).await, ControlAction::Paused);
        assert!(!flags.enabled.load(Ordering::SeqCst));
        assert_eq!(*flags.calls.lock().unwrap(), ["mark", "disable"]);
        assert_eq!(c.run(now).await, ControlAction::StaysPaused { probe: None });
    }

    #[tokio::test]
    async fn a_probe_that_closes_the_breaker_restores_polling_then_clears_the_marker() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let flags = Flags::default();
        flags.paused.store(true, Ordering::SeqCst);
        opened(&breaker, 2, -1, now).await;
        let c = control(&breaker, &flags, ProbeOutcome::Processed);
        assert_eq!(
            c.run(now).await,
            ControlAction::Resumed {
                probe: Some(ProbeOutcome::Processed)
            }
        );
        assert!(flags.enabled.load(Ordering::SeqCst));
        assert!(!flags.paused.load(Ordering::SeqCst));
        assert_eq!(*flags.calls.lock().unwrap(), ["enable", "unmark"]);
    }

    #[tokio::test]
    async fn a_failed_probe_keeps_polling_stopped_and_an_empty_queue_restores_it() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let flags = Flags::default();
        flags.paused.store(true, Ordering::SeqCst);
        opened(&breaker, 2, -1, now).await;
        let failing = control(&breaker, &flags, ProbeOutcome::Returned);
        assert_eq!(
            failing.run(now).await,
            ControlAction::StaysPaused {
                probe: Some(ProbeOutcome::Returned)
            }
        );
        assert!(!flags.enabled.load(Ordering::SeqCst));
        // The reopened breaker's period ends; the queue is empty: nothing to wait for.
        let later = now + Duration::from_secs(121);
        let empty = control(&breaker, &flags, ProbeOutcome::Empty);
        assert!(matches!(
            empty.run(later).await,
            ControlAction::Resumed {
                probe: Some(ProbeOutcome::Empty)
            }
        ));
        assert!(flags.enabled.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_mapping_disabled_by_an_operator_is_never_enabled() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let flags = Flags::default();
        let c = control(&breaker, &flags, ProbeOutcome::Processed);
        opened(&breaker, 3, 60, now).await;
        assert_eq!(c.run(now).await, ControlAction::Polling);
        breaker.close().await.unwrap();
        assert_eq!(c.run(now).await, ControlAction::Polling);
        assert!(!flags.enabled.load(Ordering::SeqCst));
        assert!(flags.calls.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_pause_cut_between_marker_and_mapping_is_finished_and_undone_later() {
        let now = SystemTime::now();
        let breaker = MemoryBreakerStore::default();
        let flags = enabled_flags();
        flags.fail_disable.store(true, Ordering::SeqCst);
        opened(&breaker, 2, 60, now).await;
        let c = control(&breaker, &flags, ProbeOutcome::Processed);
        assert!(matches!(c.run(now).await, ControlAction::Failed { .. }));
        // Marked but still polling: the next run finishes the pause.
        assert!(flags.paused.load(Ordering::SeqCst));
        flags.fail_disable.store(false, Ordering::SeqCst);
        assert_eq!(c.run(now).await, ControlAction::StaysPaused { probe: None });
        assert!(!flags.enabled.load(Ordering::SeqCst));
        // Closed by somebody else (the redrive's probe): polling comes back without a probe.
        breaker.close().await.unwrap();
        assert_eq!(c.run(now).await, ControlAction::Resumed { probe: None });
        assert!(flags.enabled.load(Ordering::SeqCst));
    }
}
