//! A start-up failure told to Lambda: posted to the Runtime API's `/runtime/init/error`, so
//! the console and the invoke's answer show its cause instead of `Runtime.ExitError`.
//!
//! The process prints the failure once, as `main` returns it (`Error: <message>`: a
//! [`crate::StartupError`]'s `Debug` is its message).

use std::time::Duration;

/// Most the report may take: a Runtime API that does not answer must not hold the exit.
const REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Posts `message` as the function's init error of type `error_type`, when the process
/// runs under a Runtime API (`AWS_LAMBDA_RUNTIME_API`); does nothing otherwise. A report
/// that fails is printed, never raised: the start-up error is what matters.
pub async fn report(error_type: &str, message: &str) {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_none() {
        return;
    }
    let body = serde_json::json!({ "errorType": error_type, "errorMessage": message });
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri("/2018-06-01/runtime/init/error")
        .header("lambda-runtime-function-error-type", error_type)
        .body(lambda_runtime_api_client::body::Body::from(
            body.to_string(),
        ));
    let client = lambda_runtime_api_client::Client::builder().build();
    let (request, client) = match (request, client) {
        (Ok(request), Ok(client)) => (request, client),
        (Err(e), _) => return eprintln!("cannot build the init error report: {e}"),
        (_, Err(e)) => return eprintln!("cannot reach the Runtime API: {e}"),
    };
    match tokio::time::timeout(REPORT_TIMEOUT, client.call(request)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => eprintln!("cannot report the init error to the Runtime API: {e}"),
        Err(_) => eprintln!("the Runtime API did not take the init error report in time"),
    }
}

/// Reports `message` to Lambda as a start-up error of the handler's own ([`report`]) and
/// returns it: what `main` returns when the handler's set-up fails.
///
/// ```no_run
/// # async fn example() -> Result<(), sqs_keeper_lambda::Error> {
/// let Ok(table) = std::env::var("LEDGER_TABLE") else {
///     return Err(sqs_keeper_lambda::init_failed("LEDGER_TABLE is not set").await);
/// };
/// # let _ = table;
/// # Ok(())
/// # }
/// ```
pub async fn init_failed(message: impl std::fmt::Display) -> crate::Error {
    let error = crate::StartupError::Handler(message.to_string());
    error.report().await;
    Box::new(error)
}
