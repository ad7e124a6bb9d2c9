//! The idempotency table as the simulation keeps it: the library's own
//! [`MemoryIdempotencyStore`] (the DynamoDB adapter's conditions, in memory), shared by the
//! worker's sandboxes and the redrive runs, with each call taking simulated latency (so a
//! claim and the work that follows it are steps others can come between) and failing as
//! the table's fault rate says.

use std::sync::Arc;
use std::time::SystemTime;

use sqs_keeper_core::testing::MemoryIdempotencyStore;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::{idempotency::Claim, idempotency::IdempotencyStore};

use crate::world::{Checks, World};

/// One actor's handle on the shared idempotency table.
#[derive(Debug, Clone)]
pub struct SimIdempotencyStore {
    world: Arc<World>,
    inner: MemoryIdempotencyStore,
    actor: String,
}

impl SimIdempotencyStore {
    /// `actor`'s handle on `inner` (clones of one memory store share its table).
    pub fn new(world: Arc<World>, inner: MemoryIdempotencyStore, actor: &str) -> Self {
        SimIdempotencyStore {
            world,
            inner,
            actor: actor.to_string(),
        }
    }

    async fn call(&self, step: &str, key: &str) -> Result<(), ProcessError> {
        crate::store::call_latency(&self.world).await;
        let mut state = self.world.lock();
        if state.call_fails(
            |f| f.table,
            &self.actor,
            key,
            &format!("idempotency {step} failed"),
        ) {
            return Err(ProcessError::new(
                sqs_keeper_core::ErrorClass::Throttled,
                "idempotency table throttled (injected)",
            ));
        }
        Ok(())
    }
}

impl IdempotencyStore for SimIdempotencyStore {
    async fn claim(
        &self,
        key: &str,
        token: &str,
        in_progress_until: SystemTime,
        now: SystemTime,
    ) -> Result<Claim, ProcessError> {
        self.call("claim", key).await?;
        let claim = self.inner.claim(key, token, in_progress_until, now).await?;
        self.world.lock().ext.trace.note(
            &self.actor,
            key,
            &format!("idempotency claim: {claim:?}"),
        );
        Ok(claim)
    }

    async fn complete(
        &self,
        key: &str,
        token: &str,
        result: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), ProcessError> {
        self.call("complete", key).await?;
        self.inner.complete(key, token, result, expires_at).await?;
        self.world
            .lock()
            .ext
            .trace
            .note(&self.actor, key, "idempotency key completed");
        Ok(())
    }

    async fn release(&self, key: &str, token: &str) -> Result<(), ProcessError> {
        self.call("release", key).await?;
        self.inner.release(key, token).await?;
        self.world
            .lock()
            .ext
            .trace
            .note(&self.actor, key, "idempotency claim released");
        Ok(())
    }
}
