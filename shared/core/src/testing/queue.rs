//! An SQS queue in memory: standard or FIFO, with visibility timeouts, receive counts,
//! receipt handles that go stale on a new receive, the redrive policy that moves a message
//! to the DLQ once it has been received `maxReceiveCount` times, retention, and (standard
//! queues) the occasional duplicate delivery of a message already in flight. The world's
//! DLQ and source queues are each one ([`super::World`]).
//!
//! By hand rather than an emulator: it must run on tokio's paused clock, be driven by a
//! seed, and let a test or the simulation see every message at every step.

use std::collections::HashSet;
use std::time::Duration;

use crate::dead_letter::MessageAttribute;
use tokio::time::Instant;

/// One message in a queue.
#[derive(Debug, Clone)]
pub struct QueueMessage {
    /// The message id (kept when the redrive policy moves it).
    pub id: String,
    /// The body.
    pub body: String,
    /// sha256 of the body (computed once: the invariants look it up at every deletion).
    pub body_sha256: String,
    /// Message attributes.
    pub attributes: Vec<(String, MessageAttribute)>,
    /// FIFO: the message group.
    pub group: Option<String>,
    /// When it was sent (epoch ms).
    pub sent_at_ms: i64,
    /// Receives so far.
    pub receive_count: u32,
    /// When it was first received (epoch ms).
    pub first_receive_ms: Option<i64>,
    /// Invisible until then.
    pub visible_at: Instant,
    /// When its latest receive was (SQS refuses to hide it past 12 hours from there).
    pub received_at: Instant,
    /// The receipt handle of its latest receive; older ones no longer delete it.
    pub receipt: Option<String>,
    /// Set on messages the redrive policy moved: the queue they came from.
    pub moved_from: Option<String>,
    /// FIFO DLQ: the sweep pass whose rotation sent this copy (its deduplication id).
    pub marker: Option<String>,
    seq: u64,
}

impl QueueMessage {
    /// Returns the item id it carries: the body's `id`, else its item id attribute, else its
    /// message id (for the trace and the invariants' reports).
    pub fn item_id(&self) -> String {
        payload_id(&self.body)
            .or_else(|| {
                self.attribute(crate::message::ITEM_ID_ATTRIBUTE)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| self.id.clone())
    }

    /// Returns a string attribute's value.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.string_value())
    }

    /// Returns the message as Lambda hands it to a function reading `queue_arn` (a message the
    /// redrive policy moved names the queue it came from).
    pub fn to_sqs_message(&self, queue_arn: Option<&str>) -> aws_lambda_events::sqs::SqsMessage {
        let mut attributes = serde_json::Map::new();
        attributes.insert(
            "ApproximateReceiveCount".into(),
            self.receive_count.to_string().into(),
        );
        attributes.insert("SentTimestamp".into(), self.sent_at_ms.to_string().into());
        if let Some(first) = self.first_receive_ms {
            attributes.insert(
                "ApproximateFirstReceiveTimestamp".into(),
                first.to_string().into(),
            );
        }
        if let Some(group) = &self.group {
            attributes.insert("MessageGroupId".into(), group.clone().into());
        }
        if let Some(from) = &self.moved_from {
            attributes.insert("DeadLetterQueueSourceArn".into(), from.clone().into());
        }
        let message_attributes: serde_json::Map<String, serde_json::Value> = self
            .attributes
            .iter()
            .map(|(name, value)| {
                let mut v = serde_json::json!({ "dataType": value.data_type() });
                if let Some(s) = value.string_value() {
                    v["stringValue"] = s.into();
                }
                if let Some(b) = value.binary_base64() {
                    v["binaryValue"] = b.into();
                }
                (name.clone(), v)
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "messageId": self.id,
            "receiptHandle": self.receipt,
            "body": self.body,
            "attributes": attributes,
            "messageAttributes": message_attributes,
            "eventSource": "aws:sqs",
            "eventSourceARN": self.moved_from.as_deref().or(queue_arn),
            "awsRegion": "us-east-1",
        }))
        .unwrap_or_default()
    }
}

/// Returns the payload inside an SNS notification (its `Message`) or an EventBridge event (its
/// `detail`), or the body itself: the producer's envelopes, opened by their shape.
fn unwrapped(body: serde_json::Value) -> serde_json::Value {
    if body.get("Type").and_then(|t| t.as_str()) == Some("Notification") {
        if let Some(inner) = body
            .get("Message")
            .and_then(|m| m.as_str())
            .and_then(|m| serde_json::from_str(m).ok())
        {
            return inner;
        }
    }
    if body.get("detail-type").is_some() {
        if let Some(detail) = body.get("detail") {
            return detail.clone();
        }
    }
    body
}

/// Returns the `id` of the payload in `body` (inside its envelope, if any).
pub fn payload_id(body: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .map(unwrapped)
        .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_string))
}

/// What one receive returned, and what it moved to the DLQ on the way.
#[derive(Debug, Default)]
pub struct Received {
    /// The messages, each with its new receipt handle.
    pub messages: Vec<QueueMessage>,
    /// Messages past `maxReceiveCount`, moved by the redrive policy (to send to the DLQ).
    pub moved: Vec<QueueMessage>,
    /// Ids of messages returned although already in flight (at-least-once delivery).
    pub duplicated: Vec<String>,
    /// Messages whose retention ended: SQS deleted them (`MessageRetentionPeriod`).
    pub expired: Vec<QueueMessage>,
}

/// SQS's longest visibility timeout, counted from the receive.
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// A queue.
#[derive(Debug)]
pub struct Queue {
    /// Its ARN.
    pub arn: String,
    /// Its URL.
    pub url: String,
    /// FIFO ordering per message group.
    pub fifo: bool,
    /// The redrive policy's `maxReceiveCount` (none: messages are never moved).
    pub max_receive_count: Option<u32>,
    /// `MessageRetentionPeriod`: a message older than this is deleted by SQS.
    pub retention: Duration,
    /// `MaximumMessageSize`: SQS refuses a larger message, attributes included
    /// ([`crate::message::message_size`]).
    pub max_message_bytes: usize,
    messages: Vec<QueueMessage>,
    next: u64,
    /// What its message ids begin with.
    prefix: &'static str,
    /// FIFO: each deduplication id sent, with the message it made and when.
    deduplication: std::collections::HashMap<String, (String, i64)>,
}

/// SQS's `InvalidMessageContents` when `body` or a string attribute holds a character
/// outside its set ([`crate::message::sqs_safe`]). The emulators do not enforce the set;
/// the in-memory queues do, as SQS does.
pub fn refused_contents(
    body: &str,
    attributes: &[(String, MessageAttribute)],
) -> Option<crate::error::ProcessError> {
    let safe = crate::message::sqs_safe(body)
        && attributes
            .iter()
            .filter_map(|(_, value)| value.string_value())
            .all(crate::message::sqs_safe);
    (!safe).then(|| {
        crate::error::ProcessError::new(
            crate::error::ErrorClass::Validation,
            "InvalidMessageContents: the message holds a character outside SQS's set",
        )
    })
}

/// The account of the queues [`Queue::new`] makes.
pub const ACCOUNT: &str = "123456789012";

impl Queue {
    /// Creates an empty queue named `name` in [`ACCOUNT`]: a source queue when it has a redrive
    /// policy (its message ids begin `src-`), else a DLQ (`dlq-`).
    pub fn new(name: &str, max_receive_count: Option<u32>) -> Self {
        let prefix = if max_receive_count.is_some() {
            "src"
        } else {
            "dlq"
        };
        Queue {
            prefix,
            max_receive_count,
            ..Queue::source(name, ACCOUNT)
        }
    }

    /// Returns an empty source queue named `name` in `account`, without a redrive policy (its
    /// message ids begin `src-`).
    pub fn source(name: &str, account: &str) -> Self {
        Queue {
            arn: format!("arn:aws:sqs:us-east-1:{account}:{name}"),
            url: format!("https://sqs.us-east-1.amazonaws.com/{account}/{name}"),
            fifo: name.ends_with(".fifo"),
            max_receive_count: None,
            retention: Duration::from_secs(4 * 86_400),
            max_message_bytes: crate::message::MAX_MESSAGE_BYTES,
            messages: Vec::new(),
            next: 0,
            prefix: "src",
            deduplication: std::collections::HashMap::new(),
        }
    }

    /// Tells whether it is the queue `name` owned by `account`.
    pub fn is_named(&self, name: &str, account: &str) -> bool {
        self.arn.ends_with(&format!(":{account}:{name}"))
    }

    /// Sends a message; returns its id.
    pub fn send(
        &mut self,
        body: String,
        attributes: Vec<(String, MessageAttribute)>,
        group: Option<String>,
        now_ms: i64,
    ) -> String {
        self.next += 1;
        let id = format!("{}-{:05}", self.prefix, self.next);
        self.messages.push(QueueMessage {
            id: id.clone(),
            body_sha256: crate::hex::sha256_hex(body.as_bytes()),
            body,
            attributes,
            group,
            sent_at_ms: now_ms,
            receive_count: 0,
            first_receive_ms: None,
            visible_at: Instant::now(),
            received_at: Instant::now(),
            receipt: None,
            moved_from: None,
            marker: None,
            seq: self.next,
        });
        id
    }

    /// Sends a message to a FIFO queue with a deduplication id, as SQS does: within
    /// [`crate::message::FIFO_DEDUPLICATION_WINDOW`] of a message sent with the same id
    /// (deleted since or not), the send succeeds and adds nothing. The message's id, and
    /// whether it was added.
    pub fn send_deduplicated(
        &mut self,
        body: String,
        attributes: Vec<(String, MessageAttribute)>,
        group: Option<String>,
        deduplication_id: &str,
        now_ms: i64,
    ) -> (String, bool) {
        let window_ms =
            i64::try_from(crate::message::FIFO_DEDUPLICATION_WINDOW.as_millis()).unwrap_or(0);
        if let Some((id, sent_ms)) = self.deduplication.get(deduplication_id) {
            if now_ms < sent_ms.saturating_add(window_ms) {
                return (id.clone(), false);
            }
        }
        let id = self.send(body, attributes, group, now_ms);
        self.deduplication
            .insert(deduplication_id.to_string(), (id.clone(), now_ms));
        (id, true)
    }

    /// Sets the sweep pass marker of the message `id` (a copy a rotation sent).
    pub fn mark(&mut self, id: &str, marker: &str) {
        if let Some(m) = self.messages.iter_mut().find(|m| m.id == id) {
            m.marker = Some(marker.to_string());
        }
    }

    /// Takes a message the redrive policy moved here (it keeps its id and attributes).
    pub fn accept_moved(&mut self, mut message: QueueMessage, from_arn: &str) {
        self.next += 1;
        message.seq = self.next;
        message.receive_count = 0;
        message.receipt = None;
        message.visible_at = Instant::now();
        message.moved_from = Some(from_arn.to_string());
        self.messages.push(message);
    }

    /// FIFO: the groups with a message in flight, which yield nothing more until it is
    /// done.
    fn groups_in_flight(&self, now: Instant) -> HashSet<String> {
        if !self.fifo {
            return HashSet::new();
        }
        self.messages
            .iter()
            .filter(|m| m.visible_at > now)
            .filter_map(|m| m.group.clone())
            .collect()
    }

    /// Delivers again one message already in flight and not in `received` (a standard
    /// queue's at-least-once delivery).
    fn duplicate_one_in_flight(
        &mut self,
        received: &mut Received,
        visibility: Duration,
        now: Instant,
    ) {
        let taken: HashSet<&str> = received.messages.iter().map(|m| m.id.as_str()).collect();
        // A message past its last receive is not delivered again: SQS's redrive policy
        // moves it at its next receive instead.
        let in_flight = self.messages.iter().position(|m| {
            m.visible_at > now
                && m.receipt.is_some()
                && !taken.contains(m.id.as_str())
                && self
                    .max_receive_count
                    .is_none_or(|max| m.receive_count < max)
        });
        if let Some(i) = in_flight {
            let m = &mut self.messages[i];
            m.receive_count += 1;
            let receipt = format!("{}#{}", m.id, m.receive_count);
            m.receipt = Some(receipt);
            m.visible_at = now + visibility;
            m.received_at = now;
            received.duplicated.push(m.id.clone());
            received.messages.push(m.clone());
        }
    }

    /// Receives up to `max` visible messages, holding each invisible for `visibility`.
    /// `duplicate` (standard queues) also returns one message already in flight. `now_ms`
    /// is wall time (messages past the retention expire).
    pub fn receive(
        &mut self,
        max: usize,
        visibility: Duration,
        duplicate: bool,
        now_ms: i64,
    ) -> Received {
        let now = Instant::now();
        let mut received = Received::default();
        let retention_ms = i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX);
        let (expired, kept): (Vec<QueueMessage>, Vec<QueueMessage>) =
            std::mem::take(&mut self.messages)
                .into_iter()
                .partition(|m| m.sent_at_ms.saturating_add(retention_ms) <= now_ms);
        self.messages = kept;
        received.expired = expired;
        let blocked = self.groups_in_flight(now);
        let mut index = 0;
        while index < self.messages.len() && received.messages.len() < max {
            let m = &self.messages[index];
            let group_blocked = m.group.as_ref().is_some_and(|g| blocked.contains(g));
            if m.visible_at > now || group_blocked {
                index += 1;
                continue;
            }
            if self
                .max_receive_count
                .is_some_and(|max| m.receive_count >= max)
            {
                received.moved.push(self.messages.remove(index));
                continue;
            }
            let m = &mut self.messages[index];
            m.receive_count += 1;
            m.first_receive_ms.get_or_insert(now_ms);
            m.visible_at = now + visibility;
            m.received_at = now;
            let receipt = format!("{}#{}", m.id, m.receive_count);
            m.receipt = Some(receipt);
            received.messages.push(m.clone());
            index += 1;
        }
        if duplicate && !self.fifo && received.messages.len() < max {
            self.duplicate_one_in_flight(&mut received, visibility, now);
        }
        received
    }

    /// Deletes the message `receipt` was given for, if it is still the latest receipt (as
    /// SQS, an older receipt may not delete it). Returns the deleted message.
    pub fn delete(&mut self, receipt: &str) -> Option<QueueMessage> {
        let index = self
            .messages
            .iter()
            .position(|m| m.receipt.as_deref() == Some(receipt))?;
        Some(self.messages.remove(index))
    }

    /// Makes the message `receipt` was given for visible after `after`, as
    /// `ChangeMessageVisibility` does: refused for a receipt that is no longer the latest
    /// (or whose message is gone), and for a timeout reaching past 12 hours from the receive.
    pub fn change_visibility(&mut self, receipt: &str, after: Duration) -> Result<(), String> {
        let now = Instant::now();
        let m = self
            .messages
            .iter_mut()
            .find(|m| m.receipt.as_deref() == Some(receipt))
            .ok_or_else(|| format!("ReceiptHandleIsInvalid: {receipt}"))?;
        if now + after > m.received_at + MAX_VISIBILITY {
            return Err(format!(
                "InvalidParameterValue: a visibility timeout of {} s reaches past 12 hours from the receive",
                after.as_secs()
            ));
        }
        m.visible_at = now + after;
        Ok(())
    }

    /// Returns the message `receipt` was given for, while that receipt is its latest.
    pub fn by_receipt(&self, receipt: &str) -> Option<&QueueMessage> {
        self.messages
            .iter()
            .find(|m| m.receipt.as_deref() == Some(receipt))
    }

    /// Returns every message, visible or not.
    pub fn messages(&self) -> &[QueueMessage] {
        &self.messages
    }

    /// Tells whether it holds no message at all.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> i64 {
        chrono::Utc::now().timestamp_millis()
    }

    fn send(q: &mut Queue, body: &str, group: Option<&str>) -> String {
        q.send(body.into(), Vec::new(), group.map(str::to_string), now())
    }

    #[tokio::test(start_paused = true)]
    async fn the_redrive_policy_moves_a_message_received_max_receive_count_times() {
        let mut q = Queue::new("orders", Some(2));
        send(&mut q, "a", None);
        for n in 1..=2 {
            let r = q.receive(10, Duration::from_secs(30), false, now());
            assert_eq!(r.messages.len(), 1);
            assert_eq!(r.messages[0].receive_count, n);
            tokio::time::advance(Duration::from_secs(31)).await;
        }
        let r = q.receive(10, Duration::from_secs(30), false, now());
        assert!(r.messages.is_empty());
        assert_eq!(r.moved.len(), 1);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_past_its_retention_is_gone_and_hides_stop_at_12_hours_from_the_receive() {
        let mut q = Queue::new("orders", None);
        q.retention = Duration::from_secs(3600);
        send(&mut q, "a", None);
        let first = q
            .receive(10, Duration::from_secs(30), false, now())
            .messages;
        let receipt = first[0].receipt.clone().unwrap_or_default();
        assert!(q
            .change_visibility(&receipt, MAX_VISIBILITY + Duration::from_secs(1))
            .is_err());
        assert!(q
            .change_visibility(&receipt, Duration::from_secs(600))
            .is_ok());
        assert!(q
            .change_visibility("stale#1", Duration::from_secs(60))
            .is_err());
        tokio::time::advance(Duration::from_secs(601)).await;
        // The wall clock is not tokio's in this test: end the retention by hand.
        q.retention = Duration::ZERO;
        let r = q.receive(10, Duration::from_secs(30), false, now());
        assert!(r.messages.is_empty());
        assert_eq!(r.expired.len(), 1);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_receipt_does_not_delete_and_invisible_messages_stay_hidden() {
        let mut q = Queue::new("orders", None);
        send(&mut q, "a", None);
        let first = q
            .receive(10, Duration::from_secs(30), false, now())
            .messages;
        assert!(q
            .receive(10, Duration::from_secs(30), false, now())
            .messages
            .is_empty());
        tokio::time::advance(Duration::from_secs(31)).await;
        let second = q
            .receive(10, Duration::from_secs(30), false, now())
            .messages;
        assert_eq!(second.len(), 1);
        assert!(q
            .delete(first[0].receipt.as_deref().unwrap_or_default())
            .is_none());
        assert!(q
            .delete(second[0].receipt.as_deref().unwrap_or_default())
            .is_some());
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn fifo_holds_a_group_back_while_one_of_its_messages_is_in_flight() {
        let mut q = Queue::new("orders.fifo", None);
        send(&mut q, "a1", Some("a"));
        send(&mut q, "a2", Some("a"));
        send(&mut q, "b1", Some("b"));
        let first = q.receive(1, Duration::from_secs(30), false, now()).messages;
        assert_eq!(first[0].body, "a1");
        // a2 waits for a1; b1 is free.
        let next = q
            .receive(10, Duration::from_secs(30), false, now())
            .messages;
        let bodies: Vec<&str> = next.iter().map(|m| m.body.as_str()).collect();
        assert_eq!(bodies, ["b1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_duplicate_delivery_returns_a_message_already_in_flight() {
        let mut q = Queue::new("orders", None);
        send(&mut q, "a", None);
        let first = q.receive(1, Duration::from_secs(30), false, now()).messages;
        let again = q.receive(10, Duration::from_secs(30), true, now());
        assert_eq!(again.duplicated, vec![first[0].id.clone()]);
        assert_eq!(again.messages[0].receive_count, 2);
    }
}
