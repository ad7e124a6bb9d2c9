//! [`crate::breaker::BreakerStore`] in memory, with the DynamoDB adapter's conditions, for
//! unit tests of the breaker and of handlers behind one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;

use crate::breaker::{BreakerState, BreakerStore};
use crate::error::ProcessError;

/// The breaker's state in memory; clones share it (as sandboxes share the table).
#[derive(Debug, Clone, Default)]
pub struct MemoryBreakerStore {
    state: Arc<Mutex<BreakerState>>,
}

impl MemoryBreakerStore {
    /// The state now.
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
            self.with(|s| {
                let current = s
                    .window_start
                    .is_some_and(|start| now.duration_since(start).unwrap_or_default() < window);
                if !current {
                    s.window_start = Some(now);
                    s.failures = 0;
                }
                s.failures += n;
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
                if s.is_open(now) {
                    return false;
                }
                s.open_until = Some(until);
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
                let free = s.is_half_open(now) && s.probe_until.is_none_or(|p| p <= now);
                if free {
                    s.probe_until = Some(until);
                }
                free
            })
        })
    }

    fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move { self.with(|s| *s = BreakerState::default()) })
    }
}
