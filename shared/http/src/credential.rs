//! The downstream's credential, read again when the downstream refuses it (401 or 403): a
//! secret rotated while the sandboxes run would otherwise dead-letter every record as
//! `permission` until they recycle.
//!
//! One re-read at a time, at most one per [`REREAD_INTERVAL`]: a credential that is simply
//! wrong costs one read of the secret a minute, not one per record.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use sqs_keeper_core::ProcessError;

/// Least time between two re-reads of the credential.
pub const REREAD_INTERVAL: Duration = Duration::from_secs(60);

/// Where the credential is read again (the worker: Secrets Manager).
pub trait CredentialSource: Send + Sync {
    /// Returns the header's value as the source holds it now.
    fn read(&self) -> Pin<Box<dyn Future<Output = Result<HeaderValue, ProcessError>> + Send + '_>>;
}

/// The credential header as requests send it, and how it is renewed.
pub(crate) struct Credential {
    name: HeaderName,
    current: Mutex<HeaderValue>,
    source: Arc<dyn CredentialSource>,
    /// When it was last read again; held while a re-read runs.
    reread: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: <redacted>, read again on 401/403", self.name)
    }
}

impl Credential {
    /// `name: value`, read again from `source`.
    pub(crate) fn new(
        name: HeaderName,
        value: HeaderValue,
        source: Arc<dyn CredentialSource>,
    ) -> Self {
        Credential {
            name,
            current: Mutex::new(value),
            source,
            reread: tokio::sync::Mutex::new(None),
        }
    }

    /// Returns the header's name.
    pub(crate) fn name(&self) -> &HeaderName {
        &self.name
    }

    /// Returns the header to send now.
    pub(crate) fn header(&self) -> Option<(HeaderName, HeaderValue)> {
        let value = self.current.lock().ok()?.clone();
        Some((self.name.clone(), value))
    }

    /// After a 401 or 403 to a request that sent `sent`: whether the credential is now
    /// another (re-read here, or by another record meanwhile), so the request is worth
    /// sending once more.
    pub(crate) async fn renewed(&self, sent: Option<&HeaderValue>) -> bool {
        let mut last = self.reread.lock().await;
        let now = self.header().map(|(_, value)| value);
        if now.as_ref() != sent {
            return true;
        }
        if last.is_some_and(|at| at.elapsed() < REREAD_INTERVAL) {
            return false;
        }
        *last = Some(tokio::time::Instant::now());
        match self.source.read().await {
            Ok(mut value) if Some(&value) != now.as_ref() => {
                value.set_sensitive(true);
                if let Ok(mut current) = self.current.lock() {
                    *current = value;
                }
                tracing::info!(header = %self.name, "the downstream refused the credential; read it again and it had changed");
                true
            }
            Ok(_) => false,
            Err(error) => {
                tracing::warn!(header = %self.name, error = %error, "the downstream refused the credential, and it could not be read again");
                false
            }
        }
    }
}
