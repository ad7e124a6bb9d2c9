//! Reconciles the DLQ with the table. Every DLQ message is received (and held invisible
//! while a redrive runs); a message whose item has **no record**, because SQS's own redrive
//! policy moved it after a crash or timeout, gets one ("exceeded maxReceiveCount without a
//! recorded failure"), so nothing in the DLQ is invisible to the tools; a message whose
//! record is resolved is deleted. The rest are returned to view when the caller is done,
//! by each item's final status ([`DeadLetterStore::settle_held`]): the run that resolves an
//! item is not always the run whose sweep holds its DLQ messages.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
    MessageSystemAttributeName,
};
use chrono::Utc;

use super::dlq::ITEM_ID_ATTRIBUTE;
use super::lease::LEASE_EXPIRES_AT;
use super::{schema, DeadLetterStore};
use crate::dead_letter::{
    DeadLetterCandidate, DeadLetterReason, DeadLetteredItem, InvocationInfo, ItemStatus,
};
use crate::error::{ErrorClass, ProcessError};
use crate::item::ItemParser;
use crate::retry::AttemptFailure;

/// The attribute real SQS adds to messages its redrive policy moved.
const SOURCE_ARN_ATTRIBUTE: &str = "DeadLetterQueueSourceArn";

/// How often [`DeadLetterStore::settle_held`] looks again at items another run is redriving.
const SETTLE_POLL: Duration = Duration::from_millis(250);

/// What a sweep found and did.
#[derive(Debug, Default)]
pub struct Sweep {
    /// DLQ messages seen.
    pub seen: usize,
    /// Records created for unrecorded messages.
    pub adopted: usize,
    /// Messages of resolved or purged items deleted.
    pub deleted: usize,
    /// Receipt handles of the messages still held, by item id.
    pub held: HashMap<String, Vec<String>>,
}

/// A record's status and, while it is being redriven, when that run's lease expires.
#[derive(Debug, Clone, Copy)]
struct Standing {
    status: ItemStatus,
    lease_expires_at: Option<i64>,
}

impl Standing {
    /// Whether a live run is redriving the item (not one that died holding its lease).
    fn leased_at(&self, now: i64) -> bool {
        self.status == ItemStatus::Redriving && self.lease_expires_at.is_some_and(|e| e > now)
    }
}

/// What to do with messages during a sweep.
#[derive(Debug, Clone, Default)]
pub struct SweepOptions {
    /// Create records for unrecorded messages.
    pub adopt: bool,
    /// Also delete the messages of these items (e.g. purged ones).
    pub delete_items: HashSet<String>,
    /// How the item id is read from a message without our `item_id` attribute.
    pub parser: ItemParser,
}

impl DeadLetterStore {
    /// Receives every visible DLQ message, holding each invisible for `hold`.
    pub async fn sweep_dlq(
        &self,
        hold: Duration,
        options: &SweepOptions,
    ) -> Result<Sweep, ProcessError> {
        let mut sweep = Sweep::default();
        let hold_secs = i32::try_from(hold.as_secs().clamp(1, 43_200)).unwrap_or(900);
        loop {
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
                .map(|m| self.message_item_id(m, &options.parser))
                .collect();
            let statuses = self.statuses(&ids).await?;
            for (message, item_id) in messages.iter().zip(ids) {
                sweep.seen += 1;
                let Some(receipt) = message.receipt_handle().map(str::to_string) else {
                    continue;
                };
                if options.delete_items.contains(&item_id) {
                    to_delete.push(receipt);
                    continue;
                }
                match statuses.get(&item_id).map(|s| s.status) {
                    Some(ItemStatus::Resolved) => to_delete.push(receipt),
                    Some(_) => sweep.held.entry(item_id).or_default().push(receipt),
                    None if options.adopt => {
                        self.adopt(message, &options.parser).await?;
                        sweep.adopted += 1;
                        sweep.held.entry(item_id).or_default().push(receipt);
                    }
                    None => sweep.held.entry(item_id).or_default().push(receipt),
                }
            }
            sweep.deleted += self.delete_dlq_messages(&to_delete).await?;
        }
    }

    /// Deletes the held messages of items that are resolved and makes the rest visible
    /// again; returns how many were deleted. Items another run is redriving at this moment
    /// (a live lease; not one left by a run that died) are looked at again every 250 ms,
    /// for at most `wait`, so that their messages are deleted if that run resolves them:
    /// it cannot delete messages it does not hold.
    pub async fn settle_held(
        &self,
        held: HashMap<String, Vec<String>>,
        wait: Duration,
    ) -> Result<usize, ProcessError> {
        let ids: Vec<String> = held.keys().cloned().collect();
        let give_up = tokio::time::Instant::now() + wait;
        let mut statuses = self.statuses(&ids).await?;
        loop {
            let now = Utc::now().timestamp();
            let busy: Vec<String> = ids
                .iter()
                .filter(|id| statuses.get(*id).is_some_and(|s| s.leased_at(now)))
                .cloned()
                .collect();
            if busy.is_empty() || tokio::time::Instant::now() + SETTLE_POLL > give_up {
                break;
            }
            tokio::time::sleep(SETTLE_POLL).await;
            for id in &busy {
                statuses.remove(id);
            }
            statuses.extend(self.statuses(&busy).await?);
        }
        let mut delete = Vec::new();
        let mut release = Vec::new();
        for (item_id, receipts) in held {
            if statuses.get(&item_id).map(|s| s.status) == Some(ItemStatus::Resolved) {
                delete.extend(receipts);
            } else {
                release.extend(receipts);
            }
        }
        let deleted = self.delete_dlq_messages(&delete).await?;
        self.release_dlq_messages(&release).await?;
        Ok(deleted)
    }

    /// The status of each existing record among `ids`, in one `BatchGetItem` per 100 ids.
    async fn statuses(&self, ids: &[String]) -> Result<HashMap<String, Standing>, ProcessError> {
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
                    .projection_expression("#id, #status, #expires")
                    .expression_attribute_names("#id", schema::ITEM_ID)
                    .expression_attribute_names("#status", schema::STATUS)
                    .expression_attribute_names("#expires", LEASE_EXPIRES_AT)
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
                    let id = item.get(schema::ITEM_ID).and_then(|v| v.as_s().ok());
                    let status = item
                        .get(schema::STATUS)
                        .and_then(|v| v.as_s().ok())
                        .and_then(|s| ItemStatus::parse(s));
                    let lease_expires_at = item
                        .get(LEASE_EXPIRES_AT)
                        .and_then(|v| v.as_n().ok())
                        .and_then(|n| n.parse().ok());
                    if let (Some(id), Some(status)) = (id, status) {
                        found.insert(
                            id.clone(),
                            Standing {
                                status,
                                lease_expires_at,
                            },
                        );
                    }
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

    fn message_item_id(&self, message: &Message, parser: &ItemParser) -> String {
        if let Some(id) = message
            .message_attributes()
            .and_then(|a| a.get(ITEM_ID_ATTRIBUTE))
            .and_then(|v| v.string_value())
        {
            return id.to_string();
        }
        match to_work_item(message, parser) {
            Ok(item) => item.item_id,
            Err(_) => message.message_id().unwrap_or_default().to_string(),
        }
    }

    /// Creates the record for a message that reached the DLQ without one.
    async fn adopt(
        &self,
        message: &Message,
        parser: &ItemParser,
    ) -> Result<DeadLetteredItem, ProcessError> {
        let item = match to_work_item(message, parser) {
            Ok(item) => item,
            Err(invalid) => invalid.item,
        };
        let error = ProcessError::new(
            ErrorClass::Unknown,
            "exceeded maxReceiveCount without a recorded failure (moved by the queue's redrive policy)",
        )
        .with_step("dlq-adopt");
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
            Utc::now(),
            self.config.retention,
        );
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
                    (
                        name.clone(),
                        serde_json::json!({"stringValue": v.string_value(), "dataType": v.data_type()}),
                    )
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
