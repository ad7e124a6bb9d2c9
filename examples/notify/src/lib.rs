//! A side effect that must not happen twice: a notification sent through a service that
//! has no idempotency key of its own (an email or SMS gateway).
//!
//! The handler itself is plain: POST the payload, classify the answer. What makes it run
//! once per item is configuration: with `WORKER_IDEMPOTENCY_TABLE` set, the runner claims
//! each item id in that table before calling the handler, skips an item whose notification
//! was already sent (a duplicate delivery, a redrive of a completed item), and returns an
//! item that another invocation is sending right now for a later retry instead of sending
//! it a second time ([`sqs_keeper::idempotency`]).

use std::time::Duration;

use sqs_keeper::{context, Outcome, ProcessError, Processor, WorkItem};

/// Sends each item's payload to a notification service.
#[derive(Debug, Clone)]
pub struct Notifier {
    client: reqwest::Client,
    url: reqwest::Url,
}

impl Notifier {
    /// A notifier posting to `url`.
    pub fn new(url: &str) -> Result<Self, ProcessError> {
        let url = url
            .parse()
            .map_err(|e| ProcessError::validation(format!("NOTIFY_URL {url:?}: {e}")))?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        Ok(Notifier { client, url })
    }
}

impl Processor for Notifier {
    fn attempt_timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(5))
    }

    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let response = self
            .client
            .post(self.url.clone())
            .header("content-type", "application/json")
            .body(item.payload().to_string())
            .send()
            .await?;
        let status = response.status();
        if !status.is_success() {
            // 429 and 5xx are retried, 4xx are not.
            return Err(ProcessError::from_http_status(
                status.as_u16(),
                format!("the notification service answered {status}"),
            ));
        }
        context::add_metric("NotificationsSent", context::Unit::Count, 1.0);
        Ok(Outcome::Done)
    }
}
