//! [`crate::breaker::BreakerStore`] in memory, for unit tests of the breaker and of
//! handlers behind one, and for the simulation: each write is taken or refused by the very
//! condition the DynamoDB adapter sends ([`crate::condition::breaker`]), evaluated on the
//! state as the item holds it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;

use crate::breaker::{BreakerState, BreakerStore};
use crate::condition::breaker::{self as conditions, StoredBreaker};
use crate::condition::{epoch_millis, Condition};
use crate::error::ProcessError;

/// `at` as the table stores it: to the millisecond.
fn stored(at: SystemTime) -> SystemTime {
    std::time::UNIX_EPOCH
        + Duration::from_millis(u64::try_from(epoch_millis(at)).unwrap_or_default())
}

/// Tells whether `condition` holds on the stored `state`.
fn holds(condition: &Condition, state: &BreakerState) -> bool {
    condition.holds(Some(&StoredBreaker(state)))
}

/// The breaker's state in memory; clones share it (as sandboxes share the table).
#[derive(Debug, Clone, Default)]
pub struct MemoryBreakerStore {
    state: Arc<Mutex<BreakerState>>,
}

impl MemoryBreakerStore {
    /// Returns the state now.
    pub fn state(&self) -> BreakerState {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut BreakerState) -> T) -> Result<T, ProcessError> {
        self.state
            .lock()
            .map(|mut s| f(&mut s))
            .map_err(|_| ProcessError::new(crate::ErrorClass::Unknown, "store poisoned"))
    }
}

impl BreakerStore for MemoryBreakerStore {
    fn read(&self) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        Box::pin(async move { self.with(|s| s.clone()) })
    }

    fn add_failures(
        &self,
        n: u32,
        now: SystemTime,
        window: Duration,
    ) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        Box::pin(async move {
            let floor = epoch_millis(now.checked_sub(window).unwrap_or(std::time::UNIX_EPOCH));
            self.with(|s| {
                // As the adapter writes: add within the current window, else start one.
                if holds(&conditions::window_current(floor), s) {
                    s.failures += n;
                } else if holds(&conditions::window_lapsed(floor), s) {
                    s.window_start = Some(stored(now));
                    s.failures = n;
                }
                s.clone()
            })
        })
    }

    fn open(
        &self,
        until: SystemTime,
        opens: u32,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            self.with(|s| {
                if !holds(&conditions::may_open(epoch_millis(now)), s) {
                    return false;
                }
                s.open_until = Some(stored(until));
                s.opens = opens;
                s.probe_until = None;
                true
            })
        })
    }

    fn take_probe(
        &self,
        until: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            self.with(|s| {
                let free = holds(&conditions::probe_free(epoch_millis(now)), s);
                if free {
                    s.probe_until = Some(stored(until));
                }
                free
            })
        })
    }

    fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move { self.with(|s| *s = BreakerState::default()) })
    }

    fn release_probe(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            self.with(|s| {
                if holds(&conditions::probe_held_until(epoch_millis(until)), s) {
                    s.probe_until = None;
                }
            })
        })
    }
}
