//! The downstream credential, read once at start-up from AWS Secrets Manager
//! (`WORKER_DOWNSTREAM_AUTH_SECRET`) and sent in a header (`WORKER_DOWNSTREAM_AUTH_HEADER`)
//! on every POST.
//!
//! The value never appears in a URL, an error, a log line or a `Debug` dump: errors name
//! the variable and the secret's id, and the header is marked sensitive.

use http::header::{HeaderName, HeaderValue};

use sqs_keeper_core::ProcessError;

/// The downstream credential could not be read; the function must not start without it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read the downstream credential from {variable} (secret {secret_id:?}): {reason}")]
pub struct SecretError {
    /// The variable naming the secret.
    pub variable: &'static str,
    /// The secret's id or ARN (not its value).
    pub secret_id: String,
    /// What went wrong, without the value.
    pub reason: String,
}

/// Reads secret `secret_id` (named by the variable `variable`, for errors) and makes the
/// `header` it is sent in. The value is trimmed (a secret written from a file often ends
/// with a newline) and marked sensitive.
pub async fn auth_header(
    header: &HeaderName,
    secret_id: &str,
    variable: &'static str,
    client: &aws_sdk_secretsmanager::Client,
) -> Result<(HeaderName, HeaderValue), SecretError> {
    let error = |reason: String| SecretError {
        variable,
        secret_id: secret_id.to_owned(),
        reason,
    };
    let output = client
        .get_secret_value()
        .secret_id(secret_id)
        .send()
        .await
        .map_err(|e| error(ProcessError::from_sdk(&e).to_string()))?;
    let text = output.secret_string().ok_or_else(|| {
        error("the secret has no SecretString (a binary secret cannot be a header)".into())
    })?;
    let text = text.trim();
    if text.is_empty() {
        return Err(error("the secret's value is empty".into()));
    }
    let mut value = HeaderValue::from_str(text).map_err(|_| {
        error(format!(
            "the secret's value cannot be sent in the {} header (a control character or a \
             line break in it?)",
            header
        ))
    })?;
    value.set_sensitive(true);
    Ok((header.clone(), value))
}
