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
