//! The error vocabulary of the worker: [`ErrorClass`] (docs/ARCHITECTURE.md §2) and [`ProcessError`], the
//! one error type a [`crate::Processor`] returns.
//!
//! A `ProcessError` is classified when it is created, from the typed source error, because
//! the information that decides retry-or-not (an AWS error code, an HTTP status, an
//! `io::ErrorKind`) is lost once an error is boxed or turned into a string.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What kind of failure an error is; decides whether it is retried and how it is recorded.
///
/// One spelling everywhere (records, logs, metrics, the command line): snake_case, from
/// serde, strum and clap alike (a test checks they agree).
///
/// ```
/// use sqs_keeper_core::ErrorClass;
///
/// // Transient classes are retried; the others are dead-lettered at once.
/// assert!(ErrorClass::Throttled.is_retryable(false));
/// assert!(!ErrorClass::Validation.is_retryable(false));
/// assert_eq!(ErrorClass::parse("not_found"), Some(ErrorClass::NotFound));
/// assert_eq!(ErrorClass::ServerError.as_str(), "server_error");
/// ```
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumCount,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(
    feature = "clap",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The callee asked us to slow down (HTTP 429, AWS throttling codes).
    Throttled,
    /// The callee failed on its side (HTTP 5xx but 501 and 505).
    ServerError,
    /// No answer in time (client timeouts, HTTP 408).
    Timeout,
    /// The request never got through (refused, reset, DNS).
    Connection,
    /// The input is wrong and will stay wrong (HTTP 400/422, malformed body).
    Validation,
    /// We are not allowed (HTTP 401/403, `AccessDenied*`); needs a human.
    Permission,
    /// The target does not exist (HTTP 404/410, `ResourceNotFoundException`).
    NotFound,
    /// Anything else; retried only if configured.
    Unknown,
}

impl ErrorClass {
    /// Every class, in declaration order (metrics and reports iterate over this).
    pub const ALL: [ErrorClass; <ErrorClass as strum::EnumCount>::COUNT] =
        variant_array(<ErrorClass as strum::VariantArray>::VARIANTS);

    /// Returns the class name as it appears in records, logs and metrics.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a class name as written by [`ErrorClass::as_str`].
    pub fn parse(name: &str) -> Option<ErrorClass> {
        name.parse().ok()
    }

    /// Tells whether a failure of this class is worth retrying. `retry_unknown` decides for
    /// [`ErrorClass::Unknown`] (docs/ARCHITECTURE.md §2: configurable, default no).
    pub fn is_retryable(self, retry_unknown: bool) -> bool {
        match self {
            ErrorClass::Throttled
            | ErrorClass::ServerError
            | ErrorClass::Timeout
            | ErrorClass::Connection => true,
            ErrorClass::Validation | ErrorClass::Permission | ErrorClass::NotFound => false,
            ErrorClass::Unknown => retry_unknown,
        }
    }

    /// Tells whether a dead-lettered item of this class can be redriven without changing it:
    /// transient classes and unknown are; validation, permission and not-found are not.
    pub fn is_reprocess_eligible(self) -> bool {
        !matches!(
            self,
            ErrorClass::Validation | ErrorClass::Permission | ErrorClass::NotFound
        )
    }
}

/// `variants` as an array, for an enum's `ALL` constant: strum derives the list as a
/// slice, and callers iterate an array by value. Evaluated in a constant, so a length
/// other than `N` fails the build.
pub(crate) const fn variant_array<T: Copy, const N: usize>(variants: &[T]) -> [T; N] {
    assert!(
        variants.len() == N,
        "the variant list and the count disagree"
    );
    let mut out = [variants[0]; N];
    let mut i = 1;
    while i < N {
        out[i] = variants[i];
        i += 1;
    }
    out
}

/// A classified failure of one attempt at one item.
///
/// `message` is the top-level description, `causes` the `source()` chain below it (outermost
/// first), so a record keeps the whole story even after the typed error is gone.
///
/// ```
/// use sqs_keeper_core::{ErrorClass, ProcessError};
///
/// // A business rule the payload breaks: permanent, dead-lettered on first sight.
/// let refused = ProcessError::validation("the order has no lines");
/// assert_eq!(refused.class, ErrorClass::Validation);
///
/// // A downstream that asked to slow down: retried, then spaced across deliveries.
/// let busy = ProcessError::new(ErrorClass::Throttled, "429 from the ledger").with_step("post");
/// assert!(busy.class.is_retryable(false));
/// assert_eq!(busy.step.as_deref(), Some("post"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessError {
    /// The failure class; decides retry and dead-letter behaviour.
    pub class: ErrorClass,
    /// Human-readable description of this failure.
    pub message: String,
    /// The source chain below `message`, outermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<String>,
    /// A service error code (e.g. `ThrottlingException`) when one was returned. A boxed
    /// `str` (no spare capacity), which keeps `Result<_, ProcessError>` small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<Box<str>>,
    /// The HTTP status of the failed call, when there was a response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The processing step that failed (e.g. `parse`, `deliver`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// A delay the callee asked for (`Retry-After`); the retry policy waits at least this.
    #[serde(skip)]
    pub retry_after: Option<Duration>,
    /// What the callee said, e.g. the start of a downstream's error response. Kept in the
    /// dead-letter record for operators, but never in `Display` (and so never in logs):
    /// a response may echo the item's data. Not part of the error signature. Boxed (one
    /// pointer): it is rare, and it keeps `Result<_, ProcessError>` small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Box<String>>,
}

/// The error code of an item the open circuit breaker refused (the downstream was not
/// called). Here rather than in the breaker so that the retry loop can tell a refusal
/// without depending on the breaker, which depends on it.
pub const CIRCUIT_OPEN: &str = "CircuitOpen";

impl ProcessError {
    /// Tells whether this is the circuit breaker's refusal ([`CIRCUIT_OPEN`]): the downstream
    /// was not called.
    pub fn is_breaker_refusal(&self) -> bool {
        self.code.as_deref() == Some(CIRCUIT_OPEN)
    }

    /// Creates a failure of the given class with a message and nothing else.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        ProcessError {
            class,
            message: message.into(),
            causes: Vec::new(),
            code: None,
            status: None,
            step: None,
            retry_after: None,
            detail: None,
        }
    }

    /// Returns a permanent input error: the item will never succeed as it is.
    pub fn validation(message: impl Into<String>) -> Self {
        ProcessError::new(ErrorClass::Validation, message)
    }

    /// Names the processing step that failed.
    pub fn with_step(mut self, step: impl Into<String>) -> Self {
        self.step = Some(step.into());
        self
    }

    /// Records the service error code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into().into_boxed_str());
        self
    }

    /// Records the HTTP status.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Appends a cause below the existing ones.
    pub fn with_cause(mut self, cause: impl Into<String>) -> Self {
        self.causes.push(cause.into());
        self
    }

    /// Records what the callee said (kept in the record, never displayed or logged).
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(Box::new(detail.into()));
        self
    }

    /// Returns what the callee said, if anything ([`ProcessError::detail`]).
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref().map(String::as_str)
    }

    /// Records a delay the callee asked for before the next attempt.
    pub fn with_retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// Returns the failure of an attempt cut at the invocation's cut-off.
    pub(crate) fn deadline_cut(ran: Duration) -> ProcessError {
        ProcessError::new(
            ErrorClass::Timeout,
            format!(
                "attempt cut after {} ms: the invocation reached its cut-off (deadline less WORKER_DEADLINE_MARGIN_MS)",
                ran.as_millis()
            ),
        )
        .with_step("deadline")
    }
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class, self.message)?;
        for cause in &self.causes {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ProcessError {}

#[cfg(test)]
mod tests {
    use super::ErrorClass;

    /// Records, metrics and the command line spell a class the same way: the names are
    /// stored, so a change of spelling would orphan every existing record.
    #[test]
    fn class_names_agree_across_serde_strum_and_clap() {
        let names: Vec<&str> = ErrorClass::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            names,
            [
                "throttled",
                "server_error",
                "timeout",
                "connection",
                "validation",
                "permission",
                "not_found",
                "unknown"
            ]
        );
        for class in ErrorClass::ALL {
            let name = class.as_str();
            assert_eq!(serde_json::to_value(class).unwrap(), name);
            assert_eq!(class.to_string(), name);
            assert_eq!(ErrorClass::parse(name), Some(class));
            #[cfg(feature = "clap")]
            assert_eq!(
                clap::ValueEnum::to_possible_value(&class)
                    .unwrap()
                    .get_name(),
                name
            );
        }
        assert_eq!(ErrorClass::parse("ServerError"), None);
        assert_eq!(ErrorClass::parse("server-error"), None);
    }
}
