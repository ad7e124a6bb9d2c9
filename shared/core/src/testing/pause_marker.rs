//! [`MemoryPauseMarker`]: the polling control's marker ([`crate::polling::PauseMarker`]) in
//! memory, with the conditional lease the DynamoDB item has.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use futures::future::BoxFuture;

use crate::error::ProcessError;
use crate::polling::{PauseMarker, PauseState};

/// The pause and the control's lease, shared by clones.
#[derive(Debug, Clone, Default)]
pub struct MemoryPauseMarker {
    pause: Arc<Mutex<PauseState>>,
    lease: Arc<Mutex<Option<SystemTime>>>,
}

impl MemoryPauseMarker {
    /// Returns the recorded pause.
    pub fn state(&self) -> PauseState {
        *self.pause.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `state`, as a control run would.
    pub fn set_state(&self, state: PauseState) {
        *self.pause.lock().unwrap_or_else(PoisonError::into_inner) = state;
    }

    /// Returns until when a run holds the lease, if one does.
    pub fn lease_until(&self) -> Option<SystemTime> {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds the lease until `until`, as by another run.
    pub fn hold_lease(&self, until: SystemTime) {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = Some(until);
    }
}

impl PauseMarker for MemoryPauseMarker {
    fn lease(
        &self,
        now: SystemTime,
        until: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            let mut lease = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
            if lease.is_some_and(|held| held > now) {
                return Ok(false);
            }
            *lease = Some(until);
            Ok(true)
        })
    }

    fn release(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            let mut lease = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
            if *lease == Some(until) {
                *lease = None;
            }
            Ok(())
        })
    }

    fn read(&self) -> BoxFuture<'_, Result<PauseState, ProcessError>> {
        Box::pin(async move { Ok(self.state()) })
    }

    fn write(&self, state: PauseState) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            self.set_state(state);
            Ok(())
        })
    }
}
