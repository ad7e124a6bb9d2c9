//! Error classification (docs/ARCHITECTURE.md §2): turns typed errors into an [`ErrorClass`].
//!
//! Sources, most precise first: AWS SDK errors (service code, then HTTP status, then the
//! kind of transport failure), HTTP status codes, `std::io::Error` kinds, tokio timeouts,
//! `reqwest` errors. A message heuristic is only the last fallback, for errors that arrive
//! already stringified.

use std::error::Error as StdError;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::{ConnectorError, SdkError};
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use aws_smithy_types::retry::ErrorKind;

use crate::error::{ErrorClass, ProcessError};

/// AWS error codes that mean "retry later", beyond the SDK's own throttling list.
const EXTRA_THROTTLING_CODES: &[&str] = &["TooManyRequests", "KMSThrottlingException"];
/// AWS error codes for failures on the service side.
const SERVER_ERROR_CODES: &[&str] = &[
    "InternalServerError",
    "InternalServerException",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "ServerException",
];
/// AWS error codes for bad input.
const VALIDATION_CODES: &[&str] = &[
    "ValidationException",
    "ValidationError",
    "InvalidParameterValue",
    "InvalidParameterValueException",
    "InvalidParameterException",
    "InvalidParameterCombination",
    "InvalidArgument",
    "InvalidRequest",
    "InvalidRequestException",
    "MissingParameter",
    "SerializationException",
    "MalformedInput",
    "InvalidMessageContents",
    "InvalidAttributeValue",
    "EntityTooLarge",
    "ConditionalCheckFailedException",
];
/// AWS error codes for missing rights or bad credentials (all `AccessDenied*` codes too).
const PERMISSION_CODES: &[&str] = &[
    "UnrecognizedClient",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "ExpiredToken",
    "ExpiredTokenException",
    "AuthFailure",
    "AuthorizationError",
    "UnauthorizedOperation",
    "KMSAccessDeniedException",
    "KMSDisabledException",
];
/// AWS error codes for resources that do not exist.
const NOT_FOUND_CODES: &[&str] = &[
    "ResourceNotFoundException",
    "ResourceNotFound",
    "NotFound",
    "NoSuchKey",
    "NoSuchBucket",
    "NoSuchEntity",
    "QueueDoesNotExist",
    "AWS.SimpleQueueService.NonExistentQueue",
];

/// Classifies an AWS error code, or `None` when the code says nothing we know.
pub fn classify_aws_code(code: &str) -> Option<ErrorClass> {
    use aws_runtime::retries::classifiers::{THROTTLING_ERRORS, TRANSIENT_ERRORS};
    let class = if THROTTLING_ERRORS.contains(&code) || EXTRA_THROTTLING_CODES.contains(&code) {
        ErrorClass::Throttled
    } else if SERVER_ERROR_CODES.contains(&code) {
        ErrorClass::ServerError
    } else if TRANSIENT_ERRORS.contains(&code) {
        ErrorClass::Timeout
    } else if code.starts_with("AccessDenied") || PERMISSION_CODES.contains(&code) {
        ErrorClass::Permission
    } else if NOT_FOUND_CODES.contains(&code) {
        ErrorClass::NotFound
    } else if VALIDATION_CODES.contains(&code) {
        ErrorClass::Validation
    } else {
        return None;
    };
    Some(class)
}

/// Classifies an HTTP status code, or `None` for a status with no class (2xx, 3xx, 4xx
/// codes such as 409, and 501 / 505).
///
/// Every 5xx is a failure on the callee's side that may pass (507 Insufficient Storage,
/// 508, a CDN's 520-524 when the origin is down or slow, 599), except 501 Not Implemented
/// and 505 HTTP Version Not Supported: those describe what the callee can do at all, and
/// retrying the same request cannot change them.
pub fn classify_http_status(status: u16) -> Option<ErrorClass> {
    match status {
        429 => Some(ErrorClass::Throttled),
        501 | 505 => None,
        500..=599 => Some(ErrorClass::ServerError),
        408 => Some(ErrorClass::Timeout),
        400 | 422 => Some(ErrorClass::Validation),
        401 | 403 => Some(ErrorClass::Permission),
        404 | 410 => Some(ErrorClass::NotFound),
        _ => None,
    }
}

/// Classifies an I/O error by its kind, or `None` when the kind says nothing.
pub fn classify_io_kind(kind: std::io::ErrorKind) -> Option<ErrorClass> {
    use std::io::ErrorKind as K;
    match kind {
        K::TimedOut | K::WouldBlock => Some(ErrorClass::Timeout),
        K::ConnectionRefused
        | K::ConnectionReset
        | K::ConnectionAborted
        | K::NotConnected
        | K::BrokenPipe
        | K::AddrNotAvailable
        | K::AddrInUse
        | K::UnexpectedEof
        | K::Interrupted
        | K::HostUnreachable
        | K::NetworkUnreachable
        | K::NetworkDown => Some(ErrorClass::Connection),
        K::NotFound => Some(ErrorClass::NotFound),
        K::PermissionDenied => Some(ErrorClass::Permission),
        K::InvalidInput | K::InvalidData => Some(ErrorClass::Validation),
        _ => None,
    }
}

fn classify_connector_error(err: &ConnectorError) -> ErrorClass {
    if err.is_timeout() {
        ErrorClass::Timeout
    } else if err.is_io() {
        ErrorClass::Connection
    } else if err.is_user() {
        ErrorClass::Validation
    } else {
        match err.as_other() {
            Some(ErrorKind::ThrottlingError) => ErrorClass::Throttled,
            Some(ErrorKind::ServerError) => ErrorClass::ServerError,
            Some(ErrorKind::TransientError) => ErrorClass::Connection,
            Some(ErrorKind::ClientError) => ErrorClass::Validation,
            _ => ErrorClass::Unknown,
        }
    }
}

/// Classifies an AWS SDK error: the service's error code first (DynamoDB throttling comes
/// with HTTP 400, so the code must win), then the HTTP status, then the transport failure.
pub fn classify_sdk_error<E>(err: &SdkError<E, HttpResponse>) -> ErrorClass
where
    E: ProvideErrorMetadata,
{
    match err {
        SdkError::ConstructionFailure(_) => ErrorClass::Validation,
        SdkError::TimeoutError(_) => ErrorClass::Timeout,
        SdkError::DispatchFailure(failure) => match failure.as_connector_error() {
            Some(connector) => classify_connector_error(connector),
            None => ErrorClass::Connection,
        },
        SdkError::ResponseError(response) => {
            classify_http_status(response.raw().status().as_u16()).unwrap_or(ErrorClass::Unknown)
        }
        SdkError::ServiceError(service) => service
            .err()
            .code()
            .and_then(classify_aws_code)
            .or_else(|| classify_http_status(service.raw().status().as_u16()))
            .unwrap_or(ErrorClass::Unknown),
        _ => err
            .code()
            .and_then(classify_aws_code)
            .or_else(|| {
                err.raw_response()
                    .and_then(|raw| classify_http_status(raw.status().as_u16()))
            })
            .unwrap_or(ErrorClass::Unknown),
    }
}

impl ProcessError {
    /// Builds a classified error from any `std::error::Error`, walking its source chain
    /// for a typed cause (see [`classify_error`]).
    pub fn from_error(err: &(dyn std::error::Error + 'static)) -> Self {
        let mut error = ProcessError::new(classify_error(err), err.to_string());
        error.causes = cause_chain(err);
        error
    }

    /// Creates a classified error from an AWS SDK call, keeping its code, status and full context
    /// (`SdkError`'s own `Display` only says "service error").
    pub fn from_sdk<E>(err: &SdkError<E, HttpResponse>) -> Self
    where
        E: ProvideErrorMetadata + StdError + 'static,
    {
        // A service's answer is said as its code and message, as modelled errors display
        // themselves; an error the SDK does not model would otherwise display its metadata
        // as a Debug dump (`unhandled error (X): Error { code: .., aws_request_id: .. }`).
        // Anything else: the Display chain, not `DisplayErrorContext`, which ends with a
        // Debug dump of the raw response, far too much for a record or a signature.
        let message = match (err, err.code(), err.message()) {
            (SdkError::ServiceError(_), Some(code), Some(text)) => {
                format!("service error: {code}: {text}")
            }
            _ => display_chain(err),
        };
        let mut error = ProcessError::new(classify_sdk_error(err), message);
        if let Some(code) = err.code() {
            error.code = Some(code.into());
        }
        if let Some(raw) = err.raw_response() {
            error.status = Some(raw.status().as_u16());
        }
        error
    }

    /// Creates a failure for a non-success HTTP response; unnamed statuses are [`ErrorClass::Unknown`].
    pub fn from_http_status(status: u16, message: impl Into<String>) -> Self {
        ProcessError::new(
            classify_http_status(status).unwrap_or(ErrorClass::Unknown),
            message,
        )
        .with_status(status)
    }
}

/// `?` in a processor: an AWS SDK error becomes a classified [`ProcessError`] (throttling
/// retried, `ConditionalCheckFailedException`, `AccessDenied*` and missing resources not),
/// keeping its code and status.
impl<E> From<SdkError<E, HttpResponse>> for ProcessError
where
    E: ProvideErrorMetadata + StdError + 'static,
{
    fn from(err: SdkError<E, HttpResponse>) -> Self {
        ProcessError::from_sdk(&err)
    }
}

/// `?` in a processor: a transport or status error of the handler's own HTTP calls
/// (`reqwest` feature).
#[cfg(feature = "reqwest")]
impl From<reqwest::Error> for ProcessError {
    fn from(err: reqwest::Error) -> Self {
        ProcessError::from_error(&err)
    }
}

/// `?` in a processor: an I/O error, classified by its kind.
impl From<std::io::Error> for ProcessError {
    fn from(err: std::io::Error) -> Self {
        ProcessError::from_error(&err)
    }
}

/// `?` in a processor: a `tokio::time::timeout` that elapsed.
impl From<tokio::time::error::Elapsed> for ProcessError {
    fn from(err: tokio::time::error::Elapsed) -> Self {
        ProcessError::new(ErrorClass::Timeout, err.to_string())
    }
}

/// `?` in a processor: JSON that does not parse or fit is bad input (a validation
/// failure); an I/O error underneath is classified by its kind.
impl From<serde_json::Error> for ProcessError {
    fn from(err: serde_json::Error) -> Self {
        match err.io_error_kind() {
            Some(kind) => ProcessError::new(
                classify_io_kind(kind).unwrap_or(ErrorClass::Unknown),
                err.to_string(),
            ),
            None => ProcessError::validation(err.to_string()),
        }
    }
}

#[cfg(feature = "reqwest")]
fn classify_reqwest(err: &reqwest::Error) -> Option<ErrorClass> {
    if err.is_timeout() {
        Some(ErrorClass::Timeout)
    } else if let Some(status) = err.status() {
        classify_http_status(status.as_u16())
    } else if err.is_builder() {
        Some(ErrorClass::Validation)
    } else if err.is_connect() {
        Some(ErrorClass::Connection)
    } else {
        None
    }
}

/// Classifies any error by walking its `source()` chain for a typed cause: our own
/// [`ProcessError`], `reqwest::Error`, tokio's `Elapsed`, the SDK's `ConnectorError`,
/// `std::io::Error`. Falls back to [`classify_message`] on the whole chain's text.
pub fn classify_error(err: &(dyn StdError + 'static)) -> ErrorClass {
    #[cfg_attr(not(feature = "reqwest"), allow(unused_mut))]
    let mut transport_error = false;
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(p) = e.downcast_ref::<ProcessError>() {
            return p.class;
        }
        if e.is::<tokio::time::error::Elapsed>() {
            return ErrorClass::Timeout;
        }
        if let Some(c) = e.downcast_ref::<ConnectorError>() {
            return classify_connector_error(c);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(class) = classify_io_kind(io.kind()) {
                return class;
            }
        }
        if let Some(j) = e.downcast_ref::<serde_json::Error>() {
            // A document that does not parse or does not fit the expected type is bad
            // data (docs/ARCHITECTURE.md §2: schema mismatch); only an I/O failure underneath is not.
            if !j.is_io() {
                return ErrorClass::Validation;
            }
        }
        #[cfg(feature = "reqwest")]
        if let Some(r) = e.downcast_ref::<reqwest::Error>() {
            if let Some(class) = classify_reqwest(r) {
                return class;
            }
            // A request or body error without a better cause is a transport failure.
            transport_error |= r.is_request() || r.is_body();
        }
        current = e.source();
    }
    let text = std::iter::once(err.to_string())
        .chain(cause_chain(err))
        .collect::<Vec<_>>()
        .join(": ");
    match classify_message(&text) {
        ErrorClass::Unknown if transport_error => ErrorClass::Connection,
        class => class,
    }
}

/// Joins the `Display` of `err` and of its sources with `: `, without repeats.
pub fn display_chain(err: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    for cause in cause_chain(err) {
        if !parts.iter().any(|p| p.contains(&cause)) {
            parts.push(cause);
        }
    }
    parts.join(": ")
}

/// Returns the `source()` chain below `err` as strings, outermost first.
pub fn cause_chain(err: &(dyn StdError + 'static)) -> Vec<String> {
    let mut causes = Vec::new();
    let mut current = err.source();
    while let Some(e) = current {
        let text = e.to_string();
        // Many error types repeat their source in their own message; keep the chain short.
        if causes.last() != Some(&text) {
            causes.push(text);
        }
        current = e.source();
    }
    causes
}

/// Classifies an error that is only text, as a last resort. Order matters: a "connection
/// timed out" is a timeout, "throttled: internal" is throttling.
pub fn classify_message(message: &str) -> ErrorClass {
    let m = message.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| m.contains(n));
    if has(&[
        "throttl",
        "rate exceeded",
        "too many requests",
        "slow down",
        "slowdown",
    ]) {
        ErrorClass::Throttled
    } else if has(&["timed out", "timeout", "deadline exceeded"]) {
        ErrorClass::Timeout
    } else if has(&[
        "connection refused",
        "connection reset",
        "connection closed",
        "broken pipe",
        "failed to lookup address",
        "dns error",
        "network unreachable",
        "no route to host",
    ]) {
        ErrorClass::Connection
    } else if has(&[
        "service unavailable",
        "internal server error",
        "bad gateway",
        "gateway timeout",
    ]) {
        ErrorClass::ServerError
    } else if has(&[
        "access denied",
        "accessdenied",
        "forbidden",
        "unauthorized",
        "not authorized",
    ]) {
        ErrorClass::Permission
    } else if has(&["not found", "no such", "does not exist"]) {
        ErrorClass::NotFound
    } else if has(&[
        "invalid",
        "validation",
        "malformed",
        "missing field",
        "unknown variant",
    ]) {
        ErrorClass::Validation
    } else {
        ErrorClass::Unknown
    }
}

#[cfg(test)]
mod tests;
