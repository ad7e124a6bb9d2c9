//! [`crate::idempotency::IdempotencyStore`] in memory, with the DynamoDB adapter's
//! conditions, for unit tests of handlers that use idempotency.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

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

    /// Whether `key` is recorded as completed.
    pub fn is_completed(&self, key: &str) -> bool {
        self.entries()
            .map(|e| e.get(key).is_some_and(|entry| entry.completed))
            .unwrap_or(false)
    }
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
        if let Some(entry) = entries.get(key) {
            if entry.until > now {
                return Ok(if entry.completed {
                    Claim::Completed {
                        result: entry.result.clone(),
                    }
                } else {
                    Claim::InProgress { until: entry.until }
                });
            }
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
        match entries.get_mut(key) {
            Some(entry) if entry.token == token && !entry.completed => {
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
        match entries.get(key) {
            Some(entry) if entry.token == token && !entry.completed => {
                entries.remove(key);
                Ok(())
            }
            _ => Err(conflict("release")),
        }
    }
}
