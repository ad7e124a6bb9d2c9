//! Removing records for good: `purge` (old records, their payloads and DLQ messages) and
//! `clear` (everything), with the order and its reasons in [`crate::removal`]; here the
//! DynamoDB deletes. Callers confirm with the operator first.

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};

use super::{schema, DeadLetterStore};
use crate::dead_letter::DeadLetteredItem;
use crate::error::ProcessError;
use crate::item::ItemParser;
use crate::removal::RecordRemoval;

pub use crate::removal::RemovalReport;

impl RecordRemoval for DeadLetterStore {
    async fn delete_records(&self, item_ids: &[String]) -> Result<(), ProcessError> {
        let mut requests: Vec<WriteRequest> = item_ids
            .iter()
            .filter_map(|id| {
                DeleteRequest::builder()
                    .key(schema::ITEM_ID, AttributeValue::S(id.clone()))
                    .build()
                    .ok()
                    .map(|d| WriteRequest::builder().delete_request(d).build())
            })
            .collect();
        // BatchWriteItem may hand back unprocessed requests under load: send them again.
        for round in 0..8 {
            if requests.is_empty() {
                break;
            }
            let output = self
                .clients
                .dynamodb
                .batch_write_item()
                .request_items(&self.config.table, requests.clone())
                .send()
                .await
                .map_err(|e| ProcessError::from_sdk(&e).with_step("delete-records"))?;
            requests = output
                .unprocessed_items()
                .and_then(|m| m.get(&self.config.table))
                .cloned()
                .unwrap_or_default();
            if !requests.is_empty() {
                tokio::time::sleep(Duration::from_millis(50 << round)).await;
            }
        }
        if requests.is_empty() {
            Ok(())
        } else {
            Err(ProcessError::new(
                crate::error::ErrorClass::Throttled,
                format!("{} deletes stayed unprocessed", requests.len()),
            )
            .with_step("delete-records"))
        }
    }
}

impl DeadLetterStore {
    /// Deletes the DLQ messages of `records`, then their payload objects, then the records
    /// ([`crate::removal::remove_records`] over this store).
    pub async fn remove_records(
        &self,
        records: &[DeadLetteredItem],
        parser: &ItemParser,
        progress: impl FnMut(usize),
    ) -> Result<RemovalReport, ProcessError> {
        crate::removal::remove_records(self, records, parser, progress).await
    }

    /// Deletes every record, every payload object and every DLQ message.
    pub async fn clear(&self, progress: impl FnMut(usize)) -> Result<RemovalReport, ProcessError> {
        let records = self
            .query_all(&crate::selection::RecordFilter::default(), None, |_| {})
            .await?;
        let (depth, in_flight) = self.dlq_depth().await?;
        let mut report = self
            .remove_records(&records, &ItemParser::default(), progress)
            .await?;
        // Messages without a record (or in flight elsewhere) go too.
        self.clients
            .sqs
            .purge_queue()
            .queue_url(&self.config.queue_url)
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("purge-dlq"))?;
        report.dlq_messages_deleted = usize::try_from(depth + in_flight).unwrap_or(usize::MAX);
        Ok(report)
    }
}
