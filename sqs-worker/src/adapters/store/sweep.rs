//! Reconciles the DLQ with the table. Every DLQ message is received (and held invisible
//! while a redrive runs) and judged against its item's record by [`decide`]:
//!
//! - **no record** (SQS's own redrive policy moved it after a crash or timeout): it gets
//!   one ("exceeded maxReceiveCount without a recorded failure"), so nothing in the DLQ is
//!   invisible to the tools;
//! - the record is **resolved** and lists this very message (its source message id or its
//!   payload's sha256) as processed: the message is deleted;
//! - the record is **requeued** and the message holds the payload that was sent back to the
//!   source queue: deleted (moved, as SQS's own message move task does);
//! - the record is resolved or requeued but this message holds **something it did not
//!   process** (another body under the same item id; a requeued message the queue's
//!   redrive policy moved back): the record is **reopened** with this message's payload;
//! - otherwise (dead, or being redriven) the message is kept.
//!
//! A message is never deleted because of its item id alone. One message that cannot be read,
//! looked up or recorded is an error of that message only: it stays in the DLQ and the
//! sweep goes on. The rest are returned to view when the caller is done, by each item's
//! final state ([`DeadLetterStore::settle_held`]): the run that resolves an item is not
//! always the run whose sweep holds its DLQ messages.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
    MessageSystemAttributeName,
};
use chrono::Utc;
use tokio::time::Instant;

use super::schema::{processed_key_for_message, processed_key_for_payload, LEASE_EXPIRES_AT};
use super::{schema, DeadLetterStore};
use crate::dead_letter::{
    DeadLetterCandidate, DeadLetterReason, DeadLetteredItem, InvocationInfo, ItemStatus,
    REQUEUED_BY_ATTRIBUTE,
};
use crate::error::{ErrorClass, ProcessError};
use crate::item::ItemParser;
use crate::message::{ITEM_ID_ATTRIBUTE, PAYLOAD_SHA256_ATTRIBUTE, SOURCE_MESSAGE_ID_ATTRIBUTE};
use crate::pointer::S3Pointer;
use crate::ports::{Sweep, SweepOptions};
use crate::retry::AttemptFailure;

/// The attribute real SQS adds to messages its redrive policy moved.
const SOURCE_ARN_ATTRIBUTE: &str = "DeadLetterQueueSourceArn";

/// How often [`DeadLetterStore::settle_held`] looks again at items another run is redriving.
const SETTLE_POLL: Duration = Duration::from_millis(250);

/// What identifies a DLQ message's content: the delivery it came from and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageView {
    /// The DLQ message's own id.
    pub message_id: String,
    /// The source message it holds: our `source_message_id` attribute, or (a message the
    /// queue's redrive policy moved, which keeps its id) its own id.
    pub source_message_id: String,
    /// sha256 of its payload, when known without fetching it: our `payload_sha256`
    /// attribute, or the body's own digest when the body is not a pointer.
    pub payload_sha256: Option<String>,
    /// Set on messages a requeue sent back to the source queue (the run's id).
    pub requeued_by: Option<String>,
}

impl MessageView {
    /// The keys under which a record lists this message as processed.
    pub fn keys(&self) -> Vec<String> {
        let mut keys = vec![processed_key_for_message(&self.source_message_id)];
        if let Some(sha) = &self.payload_sha256 {
            keys.push(processed_key_for_payload(sha));
        }
        keys
    }
}

/// What the sweep needs to know of a record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standing {
    /// Lifecycle status.
    pub status: Option<ItemStatus>,
    /// While redriving: when the run's lease expires (epoch seconds).
    pub lease_expires_at: Option<i64>,
    /// The source message id of the record's current payload.
    pub source_message_id: Option<String>,
    /// sha256 of the record's current payload.
    pub payload_sha256: Option<String>,
    /// Messages and payloads known processed ([`processed_key_for_message`], ...).
    pub processed: Vec<String>,
    /// While requeued: the id of the message sent back to the source queue.
    pub requeued_message_id: Option<String>,
    /// The source queue the record names (kept when a reopening message does not say).
    pub source_queue_arn: Option<String>,
}

impl Standing {
    /// Whether a live run is redriving the item (not one that died holding its lease).
    fn leased_at(&self, now: i64) -> bool {
        self.status == Some(ItemStatus::Redriving) && self.lease_expires_at.is_some_and(|e| e > now)
    }

    /// Whether `message` holds the record's current payload.
    fn holds_current_payload(&self, message: &MessageView) -> bool {
        self.source_message_id.as_deref() == Some(message.source_message_id.as_str())
            || (message.payload_sha256.is_some() && message.payload_sha256 == self.payload_sha256)
    }
}

/// What to do with one DLQ message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageFate {
    /// Its content is known processed (or moved back to the source queue): delete it.
    Delete,
    /// Keep it (the item is dead, or being redriven).
    Keep,
    /// No record holds it: create one.
    Adopt,
    /// The record is resolved or requeued but did not process this message: set it back to
    /// dead with this message's payload.
    Reopen(&'static str),
}

/// The rule of the module's table, for one message and its record (`None`: no record).
pub fn decide(message: &MessageView, record: Option<&Standing>) -> MessageFate {
    let Some(record) = record.filter(|r| r.status.is_some()) else {
        return MessageFate::Adopt;
    };
    let processed = message.keys().iter().any(|k| record.processed.contains(k));
    match record.status {
        Some(ItemStatus::Resolved) if processed => MessageFate::Delete,
        Some(ItemStatus::Resolved) => MessageFate::Reopen(
            "a DLQ message holds a payload this item's resolution did not process",
        ),
        Some(ItemStatus::Requeued) => {
            // A message a requeue sent that reached the DLQ was moved there by the source
            // queue's redrive policy: had the worker finished it, the record would be
            // resolved; had the worker failed it, it would have sent its own DLQ message.
            let is_requeued_message = message.requeued_by.is_some()
                || record.requeued_message_id.as_deref() == Some(message.message_id.as_str())
                || record.requeued_message_id.as_deref()
                    == Some(message.source_message_id.as_str());
            if is_requeued_message {
                MessageFate::Reopen(
                    "the requeued message came back to the DLQ (the source queue's redrive policy moved it unprocessed)",
                )
            } else if processed || record.holds_current_payload(message) {
                MessageFate::Delete
            } else {
                MessageFate::Reopen("a DLQ message holds a payload that was not requeued")
            }
        }
        _ => MessageFate::Keep,
    }
}

/// A DLQ message held invisible by a sweep, with what identifies it.
#[derive(Debug, Clone)]
pub struct HeldMessage {
    /// Its receipt handle.
    pub receipt: String,
    /// Its identity.
    pub view: MessageView,
    /// The message itself (a record may have to be reopened with its payload).
    pub message: Message,
}

impl DeadLetterStore {
    /// Receives every visible DLQ message (until `options.until`), holding each invisible
    /// for `hold`, and settles what [`decide`] can settle at once.
    pub async fn sweep_dlq(
        &self,
        hold: Duration,
        options: &SweepOptions,
    ) -> Result<Sweep<HeldMessage>, ProcessError> {
        let mut sweep = Sweep::default();
        let hold_secs = i32::try_from(hold.as_secs().clamp(1, 43_200)).unwrap_or(900);
        loop {
            if options.until.is_some_and(|until| Instant::now() >= until) {
                return Ok(sweep);
            }
            let output = self
                .clients
                .sqs
                .receive_message()
                .queue_url(&self.config.queue_url)
                .max_number_of_messages(10)
                .visibility_timeout(hold_secs)
                .wait_time_seconds(0)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| ProcessError::from_sdk(&e).with_step("sweep-receive"))?;
            let messages = output.messages();
            if messages.is_empty() {
                return Ok(sweep);
            }
            let mut to_delete = Vec::new();
            let ids: Vec<String> = messages
                .iter()
                .map(|m| message_item_id(m, &options.parser))
                .collect();
            let standings = self.standings(&ids).await;
            for (message, item_id) in messages.iter().zip(ids) {
                sweep.seen += 1;
                let Some(receipt) = message.receipt_handle().map(str::to_string) else {
                    continue;
                };
                let view = message_view(message);
                let held = HeldMessage {
                    receipt: receipt.clone(),
                    view: view.clone(),
                    message: message.clone(),
                };
                if options.delete_items.contains(&item_id) {
                    to_delete.push(receipt);
                    continue;
                }
                let standing = match &standings {
                    Ok(found) => found.get(&item_id),
                    Err(error) => {
                        sweep.errors.push((item_id.clone(), error.to_string()));
                        sweep.held.entry(item_id).or_default().push(held);
                        continue;
                    }
                };
                match decide(&view, standing) {
                    MessageFate::Delete => to_delete.push(receipt),
                    MessageFate::Keep => sweep.held.entry(item_id).or_default().push(held),
                    MessageFate::Adopt | MessageFate::Reopen(_) if !options.adopt => {
                        sweep.held.entry(item_id).or_default().push(held)
                    }
                    fate @ (MessageFate::Adopt | MessageFate::Reopen(_)) => {
                        let reason = match fate {
                            MessageFate::Reopen(reason) => reason,
                            _ => "exceeded maxReceiveCount without a recorded failure (moved by the queue's redrive policy)",
                        };
                        let known_arn = standing.and_then(|s| s.source_queue_arn.clone());
                        match self
                            .adopt(message, &item_id, &options.parser, reason, known_arn)
                            .await
                        {
                            Ok(_) => sweep.adopted += 1,
                            Err(error) => {
                                tracing::warn!(item_id = %item_id, error = %error, "DLQ message could not be recorded; left in the DLQ");
                                sweep.errors.push((item_id.clone(), error.to_string()));
                            }
                        }
                        sweep.held.entry(item_id).or_default().push(held);
                    }
                }
            }
            sweep.deleted += self.delete_dlq_messages(&to_delete).await?;
        }
    }

    /// Deletes the held messages whose records now say so ([`decide`]) and makes the rest
    /// visible again; returns how many were deleted. Items another run is redriving at this
    /// moment (a live lease; not one left by a run that died) are looked at again every
    /// 250 ms, for at most `wait`, so that their messages are deleted if that run resolves
    /// them: it cannot delete messages it does not hold.
    pub async fn settle_held(
        &self,
        held: HashMap<String, Vec<HeldMessage>>,
        wait: Duration,
    ) -> Result<usize, ProcessError> {
        let ids: Vec<String> = held.keys().cloned().collect();
        let give_up = Instant::now() + wait;
        // A lookup that fails leaves those messages kept (made visible again), never deleted.
        let mut standings = self.standings(&ids).await.unwrap_or_default();
        loop {
            let now = crate::clock::now().timestamp();
            let busy: Vec<String> = ids
                .iter()
                .filter(|id| standings.get(*id).is_some_and(|s| s.leased_at(now)))
                .cloned()
                .collect();
            if busy.is_empty() || Instant::now() + SETTLE_POLL > give_up {
                break;
            }
            tokio::time::sleep(SETTLE_POLL).await;
            if let Ok(fresh) = self.standings(&busy).await {
                for id in &busy {
                    standings.remove(id);
                }
                standings.extend(fresh);
            }
        }
        let mut delete = Vec::new();
        let mut release = Vec::new();
        for (item_id, messages) in held {
            // A message received twice (held by a sweep, given back, received again) is
            // settled once, by its latest receipt: the earlier one no longer deletes it.
            let mut latest: HashMap<String, HeldMessage> = HashMap::new();
            for held in messages {
                latest.insert(held.view.message_id.clone(), held);
            }
            for held in latest.into_values() {
                let Some(standing) = standings.get(&item_id) else {
                    release.push(held.receipt);
                    continue;
                };
                match decide(&held.view, Some(standing)) {
                    MessageFate::Delete => delete.push(held.receipt),
                    MessageFate::Reopen(reason) => {
                        // E.g. a second body under the same item id, whose record this run
                        // just resolved with the first: the record takes this payload, so
                        // the next redrive delivers it.
                        if let Err(error) = self
                            .adopt(
                                &held.message,
                                &item_id,
                                &ItemParser::default(),
                                reason,
                                standing.source_queue_arn.clone(),
                            )
                            .await
                        {
                            tracing::warn!(item_id = %item_id, error = %error, "could not reopen the record of a DLQ message; the next sweep tries again");
                        }
                        release.push(held.receipt);
                    }
                    MessageFate::Keep | MessageFate::Adopt => release.push(held.receipt),
                }
            }
        }
        let deleted = self.delete_dlq_messages(&delete).await?;
        self.release_dlq_messages(&release).await?;
        Ok(deleted)
    }

    /// What the sweep needs of each existing record among `ids`, in one `BatchGetItem` per
    /// 100 ids (strongly consistent).
    async fn standings(&self, ids: &[String]) -> Result<HashMap<String, Standing>, ProcessError> {
        use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
        let mut found = HashMap::new();
        let unique: HashSet<&String> = ids.iter().collect();
        let unique: Vec<&String> = unique.into_iter().collect();
        for chunk in unique.chunks(100) {
            let mut keys: Vec<HashMap<String, AttributeValue>> = chunk
                .iter()
                .map(|id| {
                    HashMap::from([(
                        schema::ITEM_ID.to_string(),
                        AttributeValue::S((*id).clone()),
                    )])
                })
                .collect();
            for _ in 0..8 {
                if keys.is_empty() {
                    break;
                }
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut keys)))
                    .projection_expression(
                        "#id, #status, #expires, #src.#mid, #src.#arn, #payload.#sha, #processed, #requeued",
                    )
                    .expression_attribute_names("#id", schema::ITEM_ID)
                    .expression_attribute_names("#status", schema::STATUS)
                    .expression_attribute_names("#expires", LEASE_EXPIRES_AT)
                    .expression_attribute_names("#src", "source")
                    .expression_attribute_names("#mid", "message_id")
                    .expression_attribute_names("#arn", "queue_arn")
                    .expression_attribute_names("#payload", "payload")
                    .expression_attribute_names("#sha", "sha256")
                    .expression_attribute_names("#processed", schema::PROCESSED)
                    .expression_attribute_names("#requeued", schema::REQUEUED_MESSAGE_ID)
                    .consistent_read(true)
                    .build()
                    .map_err(|e| {
                        ProcessError::validation(e.to_string()).with_step("sweep-lookup")
                    })?;
                let output = self
                    .clients
                    .dynamodb
                    .batch_get_item()
                    .request_items(&self.config.table, request)
                    .send()
                    .await
                    .map_err(|e| ProcessError::from_sdk(&e).with_step("sweep-lookup"))?;
                for item in output
                    .responses()
                    .and_then(|r| r.get(&self.config.table))
                    .into_iter()
                    .flatten()
                {
                    let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
                    let nested = |map: &str, name: &str| {
                        item.get(map)
                            .and_then(|v| v.as_m().ok())
                            .and_then(|m| m.get(name))
                            .and_then(|v| v.as_s().ok())
                            .cloned()
                    };
                    let Some(id) = text(schema::ITEM_ID) else {
                        continue;
                    };
                    found.insert(
                        id,
                        Standing {
                            status: text(schema::STATUS).and_then(|s| ItemStatus::parse(&s)),
                            lease_expires_at: item
                                .get(LEASE_EXPIRES_AT)
                                .and_then(|v| v.as_n().ok())
                                .and_then(|n| n.parse().ok()),
                            source_message_id: nested("source", "message_id"),
                            payload_sha256: nested("payload", "sha256"),
                            processed: item
                                .get(schema::PROCESSED)
                                .and_then(|v| v.as_l().ok())
                                .map(|l| l.iter().filter_map(|v| v.as_s().ok().cloned()).collect())
                                .unwrap_or_default(),
                            requeued_message_id: text(schema::REQUEUED_MESSAGE_ID),
                            source_queue_arn: nested("source", "queue_arn"),
                        },
                    );
                }
                keys = output
                    .unprocessed_keys()
                    .and_then(|u| u.get(&self.config.table))
                    .map(|k| k.keys().to_vec())
                    .unwrap_or_default();
            }
        }
        Ok(found)
    }

    /// Creates (or reopens) the record of a DLQ message no record holds, under `item_id`
    /// (the id the message is tracked by), with the message's payload: an SQS Extended
    /// Client pointer is resolved, so a redrive reprocesses the payload, not the pointer.
    async fn adopt(
        &self,
        message: &Message,
        item_id: &str,
        parser: &ItemParser,
        reason: &str,
        known_queue_arn: Option<String>,
    ) -> Result<DeadLetteredItem, ProcessError> {
        let mut item = match to_work_item(message, parser) {
            Ok(item) => item,
            Err(invalid) => invalid.item,
        };
        item.item_id = item_id.to_string();
        if item.event_source_arn.is_none() {
            item.event_source_arn = known_queue_arn;
        }
        let mut error = ProcessError::new(ErrorClass::Unknown, reason).with_step("dlq-adopt");
        if let Some(pointer) = S3Pointer::parse(&item.body) {
            match super::payload::get_payload(&self.clients.s3, &pointer).await {
                Ok((payload, _)) => item.body = payload,
                // The pointer stays the payload: the record says why.
                Err(fetch) => error = fetch.with_step("dlq-adopt"),
            }
        }
        let candidate = DeadLetterCandidate {
            failures: vec![AttemptFailure {
                attempt: 1,
                started_at: item.sent_timestamp.unwrap_or_else(Utc::now),
                duration: Duration::ZERO,
                error: error.clone(),
            }],
            item,
            error,
            reason: DeadLetterReason::ExceededMaxReceiveCount,
        };
        let mut record = DeadLetteredItem::from_candidate(
            &candidate,
            &InvocationInfo::default(),
            crate::clock::now(),
            self.config.retention,
        );
        // One entry per DLQ message however often it is swept.
        if let Some(entry) = record.failure_history.first_mut() {
            entry.attempt_id = format!("dlq:{}", message.message_id().unwrap_or_default());
        }
        let view = message_view(message);
        record.source.message_id = view.source_message_id;
        self.offload_payload(&mut record).await?;
        self.record(&record).await?;
        Ok(record)
    }

    /// Deletes DLQ messages by receipt handle; returns how many were deleted.
    pub async fn delete_dlq_messages(&self, receipts: &[String]) -> Result<usize, ProcessError> {
        let mut deleted = 0;
        for chunk in receipts.chunks(10) {
            let entries: Vec<DeleteMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(r)
                        .build()
                        .ok()
                })
                .collect();
            let output = self
                .clients
                .sqs
                .delete_message_batch()
                .queue_url(&self.config.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| ProcessError::from_sdk(&e).with_step("dlq-delete"))?;
            deleted += output.successful().len();
        }
        Ok(deleted)
    }

    /// Makes held DLQ messages visible again.
    pub async fn release_dlq_messages(&self, receipts: &[String]) -> Result<(), ProcessError> {
        for chunk in receipts.chunks(10) {
            let entries: Vec<ChangeMessageVisibilityBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(r)
                        .visibility_timeout(0)
                        .build()
                        .ok()
                })
                .collect();
            self.clients
                .sqs
                .change_message_visibility_batch()
                .queue_url(&self.config.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| ProcessError::from_sdk(&e).with_step("dlq-release"))?;
        }
        Ok(())
    }

    /// DLQ depth: visible and in-flight messages.
    pub async fn dlq_depth(&self) -> Result<(u64, u64), ProcessError> {
        use aws_sdk_sqs::types::QueueAttributeName as Q;
        let output = self
            .clients
            .sqs
            .get_queue_attributes()
            .queue_url(&self.config.queue_url)
            .attribute_names(Q::ApproximateNumberOfMessages)
            .attribute_names(Q::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("dlq-depth"))?;
        let get = |name: Q| {
            output
                .attributes()
                .and_then(|a| a.get(&name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok((
            get(Q::ApproximateNumberOfMessages),
            get(Q::ApproximateNumberOfMessagesNotVisible),
        ))
    }
}

/// The item id a DLQ message is tracked by: our `item_id` attribute, else the id the
/// parser finds in it, else its message id; kept within DynamoDB's key size
/// ([`crate::item::bounded_item_id`]).
fn message_item_id(message: &Message, parser: &ItemParser) -> String {
    let id = match message
        .message_attributes()
        .and_then(|a| a.get(ITEM_ID_ATTRIBUTE))
        .and_then(|v| v.string_value())
    {
        Some(id) => id.to_string(),
        None => match to_work_item(message, parser) {
            Ok(item) => item.item_id,
            Err(_) => message.message_id().unwrap_or_default().to_string(),
        },
    };
    crate::item::bounded_item_id(id)
}

/// What identifies a DLQ message's content.
fn message_view(message: &Message) -> MessageView {
    let attribute = |name: &str| {
        message
            .message_attributes()
            .and_then(|a| a.get(name))
            .and_then(|v| v.string_value())
            .map(str::to_string)
    };
    let message_id = message.message_id().unwrap_or_default().to_string();
    let body = message.body().unwrap_or_default();
    MessageView {
        source_message_id: attribute(SOURCE_MESSAGE_ID_ATTRIBUTE)
            .or_else(|| attribute(REQUEUED_BY_ATTRIBUTE).map(|_| message_id.clone()))
            .unwrap_or_else(|| message_id.clone()),
        payload_sha256: attribute(PAYLOAD_SHA256_ATTRIBUTE).or_else(|| {
            S3Pointer::parse(body)
                .is_none()
                .then(|| crate::hex::sha256_hex(body.as_bytes()))
        }),
        requeued_by: attribute(REQUEUED_BY_ATTRIBUTE),
        message_id,
    }
}

/// A DLQ message as a work item (as the worker would have seen it).
fn to_work_item(
    message: &Message,
    parser: &ItemParser,
) -> Result<crate::item::WorkItem, Box<crate::item::InvalidRecord>> {
    let attributes: serde_json::Map<String, serde_json::Value> = message
        .attributes()
        .map(|a| {
            a.iter()
                .map(|(k, v)| (k.as_str().to_string(), serde_json::Value::String(v.clone())))
                .collect()
        })
        .unwrap_or_default();
    let message_attributes: serde_json::Map<String, serde_json::Value> = message
        .message_attributes()
        .map(|a| {
            a.iter()
                .filter(|(name, _)| name.as_str() != ITEM_ID_ATTRIBUTE)
                .map(|(name, v)| {
                    let mut attribute = serde_json::json!({"dataType": v.data_type()});
                    if let Some(text) = v.string_value() {
                        attribute["stringValue"] = serde_json::json!(text);
                    }
                    if let Some(bytes) = v.binary_value() {
                        attribute["binaryValue"] =
                            serde_json::json!(aws_smithy_types::base64::encode(bytes.as_ref()));
                    }
                    (name.clone(), attribute)
                })
                .collect()
        })
        .unwrap_or_default();
    let source_arn = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::from(SOURCE_ARN_ATTRIBUTE)))
        .cloned();
    let message_id = message.message_id().unwrap_or_default().to_string();
    let msg = serde_json::from_value(serde_json::json!({
        "messageId": message_id,
        "body": message.body().unwrap_or_default(),
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "eventSourceARN": source_arn,
    }))
    .unwrap_or_default();
    parser.parse(message_id, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(message_id: &str, source: &str, sha: &str) -> MessageView {
        MessageView {
            message_id: message_id.into(),
            source_message_id: source.into(),
            payload_sha256: Some(sha.into()),
            requeued_by: None,
        }
    }

    fn record(status: ItemStatus, source: &str, sha: &str, processed: &[&str]) -> Standing {
        Standing {
            status: Some(status),
            source_message_id: Some(source.into()),
            payload_sha256: Some(sha.into()),
            processed: processed.iter().map(|s| s.to_string()).collect(),
            ..Standing::default()
        }
    }

    #[test]
    fn a_message_is_deleted_only_when_its_record_processed_that_very_message() {
        let m = view("d1", "s1", "x1");
        assert_eq!(decide(&m, None), MessageFate::Adopt);
        let resolved_by_id = record(ItemStatus::Resolved, "s1", "x1", &["msg:s1"]);
        assert_eq!(decide(&m, Some(&resolved_by_id)), MessageFate::Delete);
        let resolved_by_sha = record(ItemStatus::Resolved, "s9", "x1", &["sha:x1"]);
        assert_eq!(decide(&m, Some(&resolved_by_sha)), MessageFate::Delete);
        // Resolved by its item id alone is not enough: another body was processed.
        let other_body = record(ItemStatus::Resolved, "s2", "x2", &["msg:s2", "sha:x2"]);
        assert!(matches!(
            decide(&m, Some(&other_body)),
            MessageFate::Reopen(_)
        ));
        for status in [ItemStatus::Dead, ItemStatus::Redriving] {
            let r = record(status, "s1", "x1", &["msg:s1"]);
            assert_eq!(decide(&m, Some(&r)), MessageFate::Keep, "{status:?}");
        }
    }

    #[test]
    fn a_requeued_record_lets_its_moved_copy_go_and_reopens_on_its_message_coming_back() {
        let mut requeued = record(ItemStatus::Requeued, "s1", "x1", &[]);
        requeued.requeued_message_id = Some("r1".into());
        // The original DLQ copy of what went back to the source queue.
        assert_eq!(
            decide(&view("d1", "s1", "x1"), Some(&requeued)),
            MessageFate::Delete
        );
        // The requeued message itself, moved back by the redrive policy (same id).
        assert!(matches!(
            decide(&view("r1", "r1", "x1"), Some(&requeued)),
            MessageFate::Reopen(_)
        ));
        // Or any message carrying the requeue stamp.
        let stamped = MessageView {
            requeued_by: Some("redrive-1".into()),
            ..view("r2", "r2", "x1")
        };
        assert!(matches!(
            decide(&stamped, Some(&requeued)),
            MessageFate::Reopen(_)
        ));
        // A different body under the same id was never requeued.
        assert!(matches!(
            decide(&view("d2", "s2", "x2"), Some(&requeued)),
            MessageFate::Reopen(_)
        ));
    }
}
