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

    /// A classified error from an AWS SDK call, keeping its code, status and full context
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

    /// A failure for a non-success HTTP response; unnamed statuses are [`ErrorClass::Unknown`].
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

/// `err` and its sources' `Display`, joined by `: `, without repeats.
pub fn display_chain(err: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    for cause in cause_chain(err) {
        if !parts.iter().any(|p| p.contains(&cause)) {
            parts.push(cause);
        }
    }
    parts.join(": ")
}

/// The `source()` chain below `err` as strings, outermost first.
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

/// Last-resort classification of an error that is only text. Order matters: a
/// "connection timed out" is a timeout, "throttled: internal" is throttling.
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
mod tests {
    use super::*;
    use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
    use aws_smithy_runtime_api::http::{Response, StatusCode};
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::error::ErrorMetadata;

    fn raw(status: u16) -> HttpResponse {
        Response::new(StatusCode::try_from(status).unwrap(), SdkBody::from("{}"))
    }

    fn service_error(code: Option<&str>, status: u16) -> SdkError<UpdateItemError, HttpResponse> {
        let mut meta = ErrorMetadata::builder().message("boom");
        if let Some(code) = code {
            meta = meta.code(code);
        }
        SdkError::service_error(UpdateItemError::generic(meta.build()), raw(status))
    }

    #[test]
    fn aws_codes_follow_design_table() {
        let rows = [
            ("Throttling", ErrorClass::Throttled),
            ("ThrottlingException", ErrorClass::Throttled),
            (
                "ProvisionedThroughputExceededException",
                ErrorClass::Throttled,
            ),
            ("RequestLimitExceeded", ErrorClass::Throttled),
            ("TooManyRequestsException", ErrorClass::Throttled),
            ("SlowDown", ErrorClass::Throttled),
            ("InternalServerError", ErrorClass::ServerError),
            ("ServiceUnavailable", ErrorClass::ServerError),
            ("RequestTimeout", ErrorClass::Timeout),
            ("ValidationException", ErrorClass::Validation),
            ("AccessDenied", ErrorClass::Permission),
            ("AccessDeniedException", ErrorClass::Permission),
            ("UnrecognizedClientException", ErrorClass::Permission),
            ("ResourceNotFoundException", ErrorClass::NotFound),
            ("NoSuchKey", ErrorClass::NotFound),
        ];
        for (code, class) in rows {
            assert_eq!(
                classify_sdk_error(&service_error(Some(code), 400)),
                class,
                "{code}"
            );
        }
        assert_eq!(
            classify_sdk_error(&service_error(Some("SomethingNew"), 409)),
            ErrorClass::Unknown
        );
    }

    #[test]
    fn an_unmodelled_service_error_reads_as_code_and_message_not_a_debug_dump() {
        let error = ProcessError::from_sdk(&service_error(Some("ValidationException"), 400));
        assert_eq!(error.message, "service error: ValidationException: boom");
        assert_eq!(error.class, ErrorClass::Validation);
    }

    #[test]
    fn code_wins_over_status() {
        // DynamoDB throttles with HTTP 400, which alone would read as validation.
        let err = service_error(Some("ProvisionedThroughputExceededException"), 400);
        assert_eq!(classify_sdk_error(&err), ErrorClass::Throttled);
        let process = ProcessError::from_sdk(&err);
        assert_eq!(process.class, ErrorClass::Throttled);
        assert_eq!(process.status, Some(400));
        assert_eq!(
            process.code.as_deref(),
            Some("ProvisionedThroughputExceededException")
        );
        assert!(process.message.contains("boom"), "{}", process.message);
        assert!(
            !process.message.contains("raw:"),
            "no Debug dump: {}",
            process.message
        );
    }

    #[test]
    fn status_decides_without_code() {
        let rows = [
            (429, ErrorClass::Throttled),
            (500, ErrorClass::ServerError),
            (502, ErrorClass::ServerError),
            (503, ErrorClass::ServerError),
            (504, ErrorClass::ServerError),
            (408, ErrorClass::Timeout),
            (400, ErrorClass::Validation),
            (422, ErrorClass::Validation),
            (401, ErrorClass::Permission),
            (403, ErrorClass::Permission),
            (404, ErrorClass::NotFound),
            (410, ErrorClass::NotFound),
            (409, ErrorClass::Unknown),
            (501, ErrorClass::Unknown),
            (505, ErrorClass::Unknown),
            (507, ErrorClass::ServerError),
            (508, ErrorClass::ServerError),
            (520, ErrorClass::ServerError),
            (521, ErrorClass::ServerError),
            (522, ErrorClass::ServerError),
            (523, ErrorClass::ServerError),
            (524, ErrorClass::ServerError),
            (599, ErrorClass::ServerError),
            (600, ErrorClass::Unknown),
        ];
        for (status, class) in rows {
            assert_eq!(
                classify_sdk_error(&service_error(None, status)),
                class,
                "{status}"
            );
            let response: SdkError<UpdateItemError, HttpResponse> =
                SdkError::response_error("unparseable", raw(status));
            assert_eq!(
                classify_sdk_error(&response),
                class,
                "response error {status}"
            );
        }
    }

    #[test]
    fn transport_failures() {
        type E = SdkError<UpdateItemError, HttpResponse>;
        let timeout: E = SdkError::timeout_error("operation timed out");
        assert_eq!(classify_sdk_error(&timeout), ErrorClass::Timeout);
        let dispatch_timeout: E =
            SdkError::dispatch_failure(ConnectorError::timeout("read timed out".into()));
        assert_eq!(classify_sdk_error(&dispatch_timeout), ErrorClass::Timeout);
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let dispatch_io: E = SdkError::dispatch_failure(ConnectorError::io(Box::new(io)));
        assert_eq!(classify_sdk_error(&dispatch_io), ErrorClass::Connection);
        let dispatch_user: E = SdkError::dispatch_failure(ConnectorError::user("bad uri".into()));
        assert_eq!(classify_sdk_error(&dispatch_user), ErrorClass::Validation);
        let dispatch_other: E = SdkError::dispatch_failure(ConnectorError::other(
            "transient".into(),
            Some(ErrorKind::TransientError),
        ));
        assert_eq!(classify_sdk_error(&dispatch_other), ErrorClass::Connection);
        let construction: E = SdkError::construction_failure("missing table name");
        assert_eq!(classify_sdk_error(&construction), ErrorClass::Validation);
    }

    #[tokio::test]
    async fn real_client_errors_through_smithy_mocks() {
        use aws_sdk_dynamodb::Client;
        use aws_smithy_mocks::{mock, mock_client};
        let body = |code: &str| {
            SdkBody::from(format!(
                r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"nope"}}"#
            ))
        };
        let throttled = mock!(Client::update_item).then_http_response(move || {
            Response::new(
                StatusCode::try_from(400).unwrap(),
                body("ProvisionedThroughputExceededException"),
            )
        });
        let denied = mock!(Client::update_item).then_http_response(move || {
            Response::new(
                StatusCode::try_from(400).unwrap(),
                body("AccessDeniedException"),
            )
        });
        let unavailable = mock!(Client::update_item).then_http_response(|| {
            Response::new(StatusCode::try_from(503).unwrap(), SdkBody::from(""))
        });
        let client = mock_client!(
            aws_sdk_dynamodb,
            aws_smithy_mocks::RuleMode::Sequential,
            &[&throttled, &denied, &unavailable]
        );
        let mut classes = Vec::new();
        for _ in 0..3 {
            let err = client
                .update_item()
                .table_name("t")
                .send()
                .await
                .unwrap_err();
            classes.push(ProcessError::from_sdk(&err).class);
        }
        assert_eq!(
            classes,
            [
                ErrorClass::Throttled,
                ErrorClass::Permission,
                ErrorClass::ServerError
            ]
        );
    }

    /// A handler's own AWS calls, with `?`: DynamoDB throttling is retried, a failed
    /// condition or a denied call is not.
    #[tokio::test]
    async fn question_mark_classifies_a_handlers_own_errors() {
        use aws_sdk_dynamodb::Client;
        use aws_smithy_mocks::{mock, mock_client};
        let answer = |code: &'static str| {
            mock!(Client::put_item).then_http_response(move || {
                Response::new(
                    StatusCode::try_from(400).unwrap(),
                    SdkBody::from(format!(
                        r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"nope"}}"#
                    )),
                )
            })
        };
        let rules = [
            answer("ThrottlingException"),
            answer("ConditionalCheckFailedException"),
            answer("AccessDeniedException"),
        ];
        let client = mock_client!(
            aws_sdk_dynamodb,
            aws_smithy_mocks::RuleMode::Sequential,
            &[&rules[0], &rules[1], &rules[2]]
        );
        async fn put(client: &Client) -> Result<(), ProcessError> {
            client.put_item().table_name("orders").send().await?;
            Ok(())
        }
        let mut seen = Vec::new();
        for _ in 0..3 {
            let error = put(&client).await.unwrap_err();
            seen.push((error.class, error.code.as_deref().map(str::to_string)));
        }
        assert_eq!(
            seen,
            [
                (ErrorClass::Throttled, Some("ThrottlingException".into())),
                (
                    ErrorClass::Validation,
                    Some("ConditionalCheckFailedException".into())
                ),
                (ErrorClass::Permission, Some("AccessDeniedException".into())),
            ]
        );
        assert!(seen[0].0.is_retryable(false));
        assert!(!seen[1].0.is_retryable(false) && !seen[2].0.is_retryable(false));

        fn parse(text: &str) -> Result<u32, ProcessError> {
            Ok(serde_json::from_str::<u32>(text)?)
        }
        assert_eq!(parse("x").unwrap_err().class, ErrorClass::Validation);
        fn read() -> Result<(), ProcessError> {
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset))?
        }
        assert_eq!(read().unwrap_err().class, ErrorClass::Connection);
        let elapsed = tokio::time::timeout(std::time::Duration::ZERO, std::future::pending::<()>())
            .await
            .unwrap_err();
        assert_eq!(ProcessError::from(elapsed).class, ErrorClass::Timeout);
    }

    #[tokio::test]
    async fn missing_s3_object_is_not_found_and_a_denied_one_is_permission() {
        use aws_sdk_s3::Client;
        use aws_smithy_mocks::{mock, mock_client};
        let xml = |code: &str| {
            SdkBody::from(format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>m</Message><RequestId>r</RequestId></Error>"
            ))
        };
        let missing = mock!(Client::get_object).then_http_response(move || {
            Response::new(StatusCode::try_from(404).unwrap(), xml("NoSuchKey"))
        });
        // What S3 answers for a missing key when the caller lacks s3:ListBucket.
        let denied = mock!(Client::get_object).then_http_response(move || {
            Response::new(StatusCode::try_from(403).unwrap(), xml("AccessDenied"))
        });
        let client = mock_client!(
            aws_sdk_s3,
            aws_smithy_mocks::RuleMode::Sequential,
            &[&missing, &denied]
        );
        let mut seen = Vec::new();
        for _ in 0..2 {
            let err = client
                .get_object()
                .bucket("b")
                .key("k")
                .send()
                .await
                .unwrap_err();
            let error = ProcessError::from_sdk(&err);
            seen.push((error.class, error.code, error.status));
        }
        assert_eq!(
            seen,
            [
                (ErrorClass::NotFound, Some("NoSuchKey".into()), Some(404)),
                (
                    ErrorClass::Permission,
                    Some("AccessDenied".into()),
                    Some(403)
                ),
            ]
        );
    }

    #[test]
    fn io_kinds() {
        use std::io::ErrorKind as K;
        let rows = [
            (K::TimedOut, ErrorClass::Timeout),
            (K::ConnectionRefused, ErrorClass::Connection),
            (K::ConnectionReset, ErrorClass::Connection),
            (K::BrokenPipe, ErrorClass::Connection),
            (K::PermissionDenied, ErrorClass::Permission),
            (K::NotFound, ErrorClass::NotFound),
            (K::InvalidData, ErrorClass::Validation),
        ];
        for (kind, class) in rows {
            let err = std::io::Error::from(kind);
            assert_eq!(classify_error(&err), class, "{kind:?}");
        }
        // An io::Error of kind Other falls through to its text.
        let other = std::io::Error::other("dns error: failed to lookup address");
        assert_eq!(classify_error(&other), ErrorClass::Connection);
    }

    #[tokio::test]
    async fn tokio_elapsed_is_a_timeout() {
        let elapsed = tokio::time::timeout(
            std::time::Duration::from_millis(1),
            std::future::pending::<()>(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            ProcessError::from_error(&elapsed).class,
            ErrorClass::Timeout
        );
    }

    #[cfg(feature = "reqwest")]
    #[tokio::test]
    async fn reqwest_connection_refused_and_timeout() {
        // A port that was just free: nothing listens there.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let client = reqwest::Client::new();
        let refused = client
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            ProcessError::from_error(&refused).class,
            ErrorClass::Connection
        );

        // A listener that accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let slow = client
            .get(format!("http://{addr}/"))
            .timeout(std::time::Duration::from_millis(100))
            .send()
            .await
            .unwrap_err();
        assert_eq!(ProcessError::from_error(&slow).class, ErrorClass::Timeout);
        hold.abort();
    }

    #[test]
    fn message_fallback() {
        let rows = [
            ("Rate exceeded", ErrorClass::Throttled),
            ("connection timed out", ErrorClass::Timeout),
            ("Connection refused (os error 111)", ErrorClass::Connection),
            ("503 Service Unavailable", ErrorClass::ServerError),
            ("Access Denied", ErrorClass::Permission),
            ("queue does not exist", ErrorClass::NotFound),
            ("missing field `id`", ErrorClass::Validation),
            ("the moon is in the wrong phase", ErrorClass::Unknown),
        ];
        for (text, class) in rows {
            assert_eq!(classify_message(text), class, "{text}");
        }
    }

    #[test]
    fn retryability_per_class() {
        assert!(ErrorClass::Throttled.is_retryable(false));
        assert!(ErrorClass::ServerError.is_retryable(false));
        assert!(ErrorClass::Timeout.is_retryable(false));
        assert!(ErrorClass::Connection.is_retryable(false));
        assert!(!ErrorClass::Validation.is_retryable(true));
        assert!(!ErrorClass::Permission.is_retryable(true));
        assert!(!ErrorClass::NotFound.is_retryable(true));
        assert!(!ErrorClass::Unknown.is_retryable(false));
        assert!(ErrorClass::Unknown.is_retryable(true));
        for class in ErrorClass::ALL {
            assert_eq!(ErrorClass::parse(class.as_str()), Some(class));
        }
    }
}
