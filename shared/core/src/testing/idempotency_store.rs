//! [`crate::idempotency::IdempotencyStore`] in memory, for unit tests of handlers that use
//! idempotency and for the simulation: each write is taken or refused by the very
//! condition the DynamoDB adapter sends ([`crate::condition::idempotency`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::condition::idempotency::{self as conditions, StoredClaim};
use crate::condition::{epoch_millis, Condition};
use crate::error::{ErrorClass, ProcessError};
use crate::idempotency::{Claim, IdempotencyStore};

#[derive(Debug, Clone)]
struct Entry {
    token: String,
    completed: bool,
    result: Option<String>,
    /// In progress: the claim's end; completed: the record's expiry.
    until: SystemTime,
}

/// Idempotency records in memory; clones share them.
#[derive(Debug, Clone, Default)]
pub struct MemoryIdempotencyStore {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

impl MemoryIdempotencyStore {
    fn entries(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, Entry>>, ProcessError> {
        self.entries
            .lock()
            .map_err(|_| ProcessError::new(ErrorClass::Unknown, "store poisoned"))
    }

    /// Tells whether `key` is recorded as completed.
    pub fn is_completed(&self, key: &str) -> bool {
        self.entries()
            .map(|e| e.get(key).is_some_and(|entry| entry.completed))
            .unwrap_or(false)
    }
}

/// Tells whether `condition` holds on the item of `key` (`None`: no item).
fn holds(condition: &Condition, key: &str, entry: Option<&Entry>) -> bool {
    let stored = entry.map(|e| StoredClaim {
        key,
        token: &e.token,
        completed: e.completed,
        until_ms: epoch_millis(e.until),
    });
    condition.holds(stored.as_ref().map(|s| s as &dyn crate::condition::Item))
}

fn conflict(what: &str) -> ProcessError {
    ProcessError::new(
        ErrorClass::Validation,
        format!("{what}: the claim is not this attempt's"),
    )
    .with_code("ConditionalCheckFailedException")
}

impl IdempotencyStore for MemoryIdempotencyStore {
    async fn claim(
        &self,
        key: &str,
        token: &str,
        in_progress_until: SystemTime,
        now: SystemTime,
    ) -> Result<Claim, ProcessError> {
        let mut entries = self.entries()?;
        if let Some(entry) = entries
            .get(key)
            .filter(|e| !holds(&conditions::claimable(epoch_millis(now)), key, Some(e)))
        {
            return Ok(if entry.completed {
                Claim::Completed {
                    result: entry.result.clone(),
                }
            } else {
                Claim::InProgress { until: entry.until }
            });
        }
        entries.insert(
            key.to_string(),
            Entry {
                token: token.to_string(),
                completed: false,
                result: None,
                until: in_progress_until,
            },
        );
        Ok(Claim::Claimed)
    }

    async fn complete(
        &self,
        key: &str,
        token: &str,
        result: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), ProcessError> {
        let mut entries = self.entries()?;
        let held = holds(&conditions::held_by(token), key, entries.get(key));
        match entries.get_mut(key) {
            Some(entry) if held => {
                entry.completed = true;
                entry.result = result.map(str::to_string);
                entry.until = expires_at;
                Ok(())
            }
            _ => Err(conflict("complete")),
        }
    }

    async fn release(&self, key: &str, token: &str) -> Result<(), ProcessError> {
        let mut entries = self.entries()?;
        if holds(&conditions::held_by(token), key, entries.get(key)) {
            entries.remove(key);
            return Ok(());
        }
        Err(conflict("release"))
    }
}
