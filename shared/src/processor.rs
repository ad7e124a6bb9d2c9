//! The [`Processor`] trait (the user's code) and [`HttpDelivery`], the processor shipped
//! with the worker: POST each item to a downstream URL.

use std::future::Future;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};

use crate::error::ProcessError;
use crate::item::WorkItem;

/// A successful end for one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The item was processed.
    Done,
    /// There was nothing to do (a logical outcome, not a failure): acked and counted.
    Skipped {
        /// Why nothing was done, for logs and metrics.
        reason: String,
    },
}

/// Processes one item. Implementations return a classified [`ProcessError`]; the batch
/// engine decides from its class whether to retry, report or dead-letter.
pub trait Processor: Send + Sync {
    /// Processes one item. Called again for the same item when a retryable error is retried.
    fn process(
        &self,
        item: &WorkItem,
    ) -> impl Future<Output = Result<Outcome, ProcessError>> + Send;
}

/// How [`HttpDelivery`] reaches the downstream.
#[derive(Debug, Clone)]
pub struct HttpDeliveryConfig {
    /// The URL each item body is POSTed to.
    pub url: reqwest::Url,
    /// Per-request timeout (connect + response).
    pub timeout: Duration,
    /// The `Content-Type` sent with the body.
    pub content_type: String,
}

/// Most of a downstream error body kept as the error's detail: enough to explain, not a dump.
const ERROR_BODY_LIMIT: usize = 256;

/// POSTs each item's body to a URL. 2xx is done, except 208 Already Reported, which is
/// skipped (the downstream had already processed this item: acked and counted apart);
/// other statuses and transport failures are classified per DESIGN §4. Sends `Idempotency-Key` (the item id) so the downstream can
/// drop the duplicates that at-least-once delivery produces.
#[derive(Debug, Clone)]
pub struct HttpDelivery {
    client: reqwest::Client,
    config: HttpDeliveryConfig,
}

impl HttpDelivery {
    /// Builds the client once (connection pool and TLS set-up are reused across invocations).
    pub fn new(config: HttpDeliveryConfig) -> Result<Self, ProcessError> {
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            // A redirected POST is re-sent as a GET without the body: a 2xx after that
            // would mark an undelivered item done. A 3xx is reported as it is instead.
            .redirect(reqwest::redirect::Policy::none());
        if config.url.scheme() == "http" {
            // No TLS can happen (no redirects), so skip loading the system trust store:
            // it is most of the function's start-up time (docs/BENCHMARKS.md).
            builder = builder.tls_certs_only(Vec::new());
        }
        let client = builder
            .build()
            .map_err(|e| ProcessError::from_error(&e).with_step("http-client"))?;
        Ok(HttpDelivery { client, config })
    }

    fn headers(&self, item: &WorkItem) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let mut set = |name: HeaderName, value: &str| {
            // Ids with characters a header cannot carry are simply not sent.
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(name, value);
            }
        };
        set(CONTENT_TYPE, &self.config.content_type);
        set(HeaderName::from_static("idempotency-key"), &item.item_id);
        set(HeaderName::from_static("x-item-id"), &item.item_id);
        set(
            HeaderName::from_static("x-sqs-message-id"),
            &item.message_id,
        );
        headers
    }
}

impl Processor for HttpDelivery {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let response = self
            .client
            .post(self.config.url.clone())
            .headers(self.headers(item))
            .body(item.body.clone())
            .send()
            .await
            .map_err(|e| ProcessError::from_error(&e).with_step("deliver"))?;
        let status = response.status();
        if status == reqwest::StatusCode::ALREADY_REPORTED {
            return Ok(Outcome::Skipped {
                reason: "downstream had already processed the item (208)".to_string(),
            });
        }
        if status.is_success() {
            return Ok(Outcome::Done);
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response.text().await.unwrap_or_default();
        let excerpt: String = text.trim().chars().take(ERROR_BODY_LIMIT).collect();
        // The response goes to the record's history, not into the message: messages are
        // logged, and a downstream's error body may echo the item's data.
        let mut error = ProcessError::from_http_status(
            status.as_u16(),
            format!("downstream answered {status}"),
        )
        .with_step("deliver");
        if !excerpt.is_empty() {
            error = error.with_detail(excerpt);
        }
        if let Some(delay) = retry_after {
            error = error.with_retry_after(delay);
        }
        Err(error)
    }
}
