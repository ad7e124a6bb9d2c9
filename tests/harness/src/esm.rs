//! A local event source mapping that behaves like Lambda's SQS poller: receive a batch
//! with all attributes, build the event exactly as Lambda does (attributes as strings,
//! `eventSourceARN`, `awsRegion`, ...), invoke the function, delete the records that are
//! not in `batchItemFailures`, and leave the others to reappear after the visibility
//! timeout. A failed invocation deletes nothing, as in Lambda.

use std::future::Future;
use std::time::Duration;

use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
};
use bytes::Bytes;
use serde_json::Value;
use tokio::time::Instant;

/// Calls the function with raw event bytes; the batch item failures, or why the whole
/// invocation failed.
pub trait Invoker: Send + Sync {
    /// Invokes the function with one event.
    fn invoke(&self, event: Bytes) -> impl Future<Output = Result<Vec<String>, String>> + Send;
}

/// Totals of an ESM run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EsmStats {
    /// Invocations made.
    pub invocations: u64,
    /// Messages received (a redelivered message counts each time).
    pub received: u64,
    /// Messages deleted after the function succeeded with them.
    pub deleted: u64,
    /// Messages the function reported as failed (left for redelivery).
    pub reported: u64,
    /// Invocations that failed as a whole.
    pub failed_invocations: u64,
    /// The highest `ApproximateReceiveCount` a received message carried.
    pub max_receive_count: u64,
}

/// The poller for one queue.
#[derive(Debug, Clone)]
pub struct EventSourceMapping {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    queue_arn: String,
    region: String,
    batch_size: i32,
    release_failed: bool,
    switch: MappingState,
}

/// Whether a mapping polls, shared with the local Lambda API that enables and disables it
/// (`crate::lambda_api`), and how often it was switched.
#[derive(Debug, Clone)]
pub struct MappingState {
    inner: std::sync::Arc<MappingFlags>,
}

#[derive(Debug)]
struct MappingFlags {
    enabled: std::sync::atomic::AtomicBool,
    disables: std::sync::atomic::AtomicU64,
    enables: std::sync::atomic::AtomicU64,
    /// When it was created or last switched, in milliseconds since the epoch.
    last_modified_ms: std::sync::atomic::AtomicU64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Default for MappingState {
    fn default() -> Self {
        MappingState {
            inner: std::sync::Arc::new(MappingFlags {
                enabled: std::sync::atomic::AtomicBool::new(true),
                disables: std::sync::atomic::AtomicU64::new(0),
                enables: std::sync::atomic::AtomicU64::new(0),
                last_modified_ms: std::sync::atomic::AtomicU64::new(now_ms()),
            }),
        }
    }
}

impl MappingState {
    /// Whether it polls.
    pub fn enabled(&self) -> bool {
        self.inner.enabled.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Enables or disables it (counting each change).
    pub fn set_enabled(&self, enabled: bool) {
        use std::sync::atomic::Ordering;
        if self.inner.enabled.swap(enabled, Ordering::SeqCst) != enabled {
            let counter = if enabled {
                &self.inner.enables
            } else {
                &self.inner.disables
            };
            counter.fetch_add(1, Ordering::SeqCst);
            self.inner
                .last_modified_ms
                .store(now_ms(), Ordering::SeqCst);
        }
    }

    /// When it was created or last switched, in seconds since the epoch (Lambda's
    /// `LastModified`).
    pub fn last_modified_secs(&self) -> f64 {
        use std::sync::atomic::Ordering;
        self.inner.last_modified_ms.load(Ordering::SeqCst) as f64 / 1000.0
    }

    /// Times it was disabled and enabled again.
    pub fn switches(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        (
            self.inner.disables.load(Ordering::SeqCst),
            self.inner.enables.load(Ordering::SeqCst),
        )
    }
}

impl EventSourceMapping {
    /// A poller for `queue_url`, invoking with batches of up to `batch_size` (1 to 10,000,
    /// Lambda's bounds for a standard queue). Above 10, SQS's most per receive, a batch is
    /// gathered from several receives, as Lambda's poller does within its batching window,
    /// until it is full or a receive comes back short.
    pub fn new(
        sqs: aws_sdk_sqs::Client,
        queue_url: &str,
        queue_arn: &str,
        region: &str,
        batch_size: i32,
    ) -> Self {
        EventSourceMapping {
            sqs,
            queue_url: queue_url.to_string(),
            queue_arn: queue_arn.to_string(),
            region: region.to_string(),
            batch_size: batch_size.clamp(1, 10_000),
            release_failed: false,
            switch: MappingState::default(),
        }
    }

    /// Whether this mapping polls: disabled, [`EventSourceMapping::poll_once`] receives
    /// nothing (it waits a second, as an idle poller would).
    pub fn state(&self) -> MappingState {
        self.switch.clone()
    }

    /// Makes reported messages visible again at once (visibility 0) instead of after the
    /// visibility timeout. Lambda does not do this; it exists for FIFO queues on moto
    /// 5.2.5, which, when several messages of one group reappear by timeout together,
    /// delivers the later one first and holds the earlier back (breaking FIFO order in a
    /// way real SQS does not). Released explicitly, they come back in order.
    pub fn release_failed_immediately(mut self, release: bool) -> Self {
        self.release_failed = release;
        self
    }

    /// Receives one batch and, if any, invokes and settles it. Returns messages received.
    pub async fn poll_once<I: Invoker>(
        &self,
        invoker: &I,
        stats: &mut EsmStats,
    ) -> Result<usize, String> {
        if !self.switch.enabled() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return Ok(0);
        }
        let batch_size = usize::try_from(self.batch_size).unwrap_or(10);
        let mut gathered: Vec<Message> = Vec::new();
        while gathered.len() < batch_size {
            let want = (batch_size - gathered.len()).min(10);
            let output = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(i32::try_from(want).unwrap_or(10))
                // Wait for the first messages; gather more only while they are there.
                .wait_time_seconds(if gathered.is_empty() { 1 } else { 0 })
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| {
                    format!("receive: {}", sqs_keeper_lambda::ProcessError::from_sdk(&e))
                })?;
            let received = output.messages().len();
            gathered.extend(output.messages.unwrap_or_default());
            if received < want {
                break;
            }
        }
        let messages = gathered.as_slice();
        if messages.is_empty() {
            return Ok(0);
        }
        for message in messages {
            let count = message
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                .and_then(|c| c.parse::<u64>().ok())
                .unwrap_or(1);
            stats.max_receive_count = stats.max_receive_count.max(count);
        }
        stats.invocations += 1;
        stats.received += messages.len() as u64;
        let event = self.event(messages);
        let to_delete: Vec<&Message> = match invoker.invoke(Bytes::from(event.to_string())).await {
            Ok(failures) => {
                stats.reported += failures.len() as u64;
                if self.release_failed {
                    self.release(messages, &failures).await?;
                }
                messages
                    .iter()
                    .filter(|m| !failures.iter().any(|f| Some(f.as_str()) == m.message_id()))
                    .collect()
            }
            Err(error) => {
                tracing::warn!(error = %error, "invocation failed; the whole batch returns to the queue");
                stats.failed_invocations += 1;
                Vec::new()
            }
        };
        for chunk in to_delete.chunks(10) {
            let entries: Vec<DeleteMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(m.receipt_handle().unwrap_or_default())
                        .build()
                        .ok()
                })
                .collect();
            let deleted = self
                .sqs
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| {
                    format!("delete: {}", sqs_keeper_lambda::ProcessError::from_sdk(&e))
                })?;
            stats.deleted += deleted.successful().len() as u64;
        }
        Ok(messages.len())
    }

    async fn release(&self, messages: &[Message], failures: &[String]) -> Result<(), String> {
        for m in messages
            .iter()
            .filter(|m| failures.iter().any(|f| Some(f.as_str()) == m.message_id()))
        {
            self.sqs
                .change_message_visibility()
                .queue_url(&self.queue_url)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .visibility_timeout(0)
                .send()
                .await
                .map_err(|e| {
                    format!("release: {}", sqs_keeper_lambda::ProcessError::from_sdk(&e))
                })?;
        }
        Ok(())
    }

    /// Polls until the queue holds no message (visible or in flight), or `max` elapses.
    /// Returns the stats and whether the queue drained.
    pub async fn run_until_drained<I: Invoker>(
        &self,
        invoker: &I,
        max: Duration,
    ) -> Result<(EsmStats, bool), String> {
        let start = Instant::now();
        let mut stats = EsmStats::default();
        loop {
            let received = self.poll_once(invoker, &mut stats).await?;
            if received == 0 && self.depth().await? == 0 {
                return Ok((stats, true));
            }
            if start.elapsed() >= max {
                return Ok((stats, false));
            }
        }
    }

    /// Messages in the queue, visible and in flight.
    pub async fn depth(&self) -> Result<u64, String> {
        queue_depth(&self.sqs, &self.queue_url).await
    }

    /// The Lambda event for a batch of received messages.
    pub fn event(&self, messages: &[Message]) -> Value {
        sqs_keeper_aws::lambda_event(messages, &self.queue_arn, &self.region)
    }
}

/// Messages in a queue, visible and in flight (`ApproximateNumberOfMessages` +
/// `ApproximateNumberOfMessagesNotVisible`).
pub async fn queue_depth(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Result<u64, String> {
    let output = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .map_err(|e| {
            format!(
                "queue attributes: {}",
                sqs_keeper_lambda::ProcessError::from_sdk(&e)
            )
        })?;
    let attrs = output.attributes();
    let get = |name: QueueAttributeName| {
        attrs
            .and_then(|a| a.get(&name))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(get(QueueAttributeName::ApproximateNumberOfMessages)
        + get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible))
}
