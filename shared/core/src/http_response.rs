//! A handler's own HTTP answers as classified failures (`reqwest` feature). A handler that
//! calls a service with its own `reqwest` client turns a non-success answer into the
//! [`ProcessError`] the batch engine decides on: the status's class, the `Retry-After` the
//! service asked for, and a bounded excerpt of the answer's body as the failure's detail.
//! `HttpDelivery` does the same for the shipped worker.
//!
//! ```no_run
//! # async fn call(client: &reqwest::Client) -> Result<sqs_keeper_core::Outcome, sqs_keeper_core::ProcessError> {
//! let response = client.post("https://orders.example/api").body("{}").send().await?;
//! let _ok = sqs_keeper_core::error_for_status(response).await?;
//! Ok(sqs_keeper_core::Outcome::Done)
//! # }
//! ```

use std::time::Duration;

use crate::error::ProcessError;

/// Most characters of an error answer's body kept as the failure's detail. The record
/// keeps the detail; a larger body is cut, and only this much of it is read.
pub const EXCERPT_CHARS: usize = 512;

/// Returns `response` itself when its status is a success; otherwise the classified failure
/// it means ([`ProcessError::from_http_status`]), with the `Retry-After` it asked for (in
/// seconds) and the start of its body as the detail. At most four times [`EXCERPT_CHARS`]
/// bytes of the body are read: an error page can be any size.
pub async fn error_for_status(
    response: reqwest::Response,
) -> Result<reqwest::Response, ProcessError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let delay = retry_after(response.headers());
    let excerpt = excerpt(response).await;
    let mut error = ProcessError::from_http_status(status.as_u16(), format!("answered {status}"));
    if !excerpt.is_empty() {
        error = error.with_detail(excerpt);
    }
    if let Some(delay) = delay {
        error = error.with_retry_after(delay);
    }
    Err(error)
}

/// Returns the delay a `Retry-After` header asks for, in whole seconds (its date form is not read).
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// Returns the start of `response`'s body as text, trimmed, at most [`EXCERPT_CHARS`] characters.
async fn excerpt(mut response: reqwest::Response) -> String {
    let mut head: Vec<u8> = Vec::new();
    while head.len() < EXCERPT_CHARS * 4 {
        match response.chunk().await {
            Ok(Some(chunk)) => head.extend_from_slice(&chunk),
            _ => break,
        }
    }
    head.truncate(EXCERPT_CHARS * 4);
    String::from_utf8_lossy(&head)
        .trim()
        .chars()
        .take(EXCERPT_CHARS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> reqwest::Response {
        let mut builder = http::Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        reqwest::Response::from(builder.body(body.to_string()).unwrap())
    }

    #[tokio::test]
    async fn a_success_is_the_response_itself() {
        let ok = error_for_status(answer(200, &[], "fine")).await.unwrap();
        assert_eq!(ok.text().await.unwrap(), "fine");
    }

    #[tokio::test]
    async fn a_429_is_throttled_with_its_retry_after_and_an_excerpt() {
        let error = error_for_status(answer(
            429,
            &[("retry-after", " 7 ")],
            &"slow down ".repeat(200),
        ))
        .await
        .unwrap_err();
        assert_eq!(error.class, ErrorClass::Throttled);
        assert_eq!(error.status, Some(429));
        assert_eq!(error.retry_after, Some(Duration::from_secs(7)));
        let detail = error.detail.unwrap();
        assert_eq!(detail.chars().count(), EXCERPT_CHARS);
        assert!(detail.starts_with("slow down"));
    }

    #[tokio::test]
    async fn a_400_is_a_validation_failure_not_retried() {
        let error = error_for_status(answer(400, &[], "")).await.unwrap_err();
        assert_eq!(error.class, ErrorClass::Validation);
        assert!(error.detail.is_none());
        assert!(error.retry_after.is_none());
    }
}
