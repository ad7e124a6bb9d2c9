//! Removing records for good: `purge` (old records, their payloads and DLQ messages) and
//! `clear` (everything). Callers confirm with the operator first.

use std::collections::HashSet;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};
use serde::Serialize;

use super::{schema, DeadLetterStore};
use crate::dead_letter::{DeadLetteredItem, PayloadLocation};
use crate::error::ProcessError;
use crate::item::ItemParser;
use crate::ports::SweepOptions;

/// What a purge or clear removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RemovalReport {
    /// Records deleted.
    pub records_deleted: usize,
    /// Payload objects deleted.
    pub payloads_deleted: usize,
    /// DLQ messages deleted.
    pub dlq_messages_deleted: usize,
}

impl DeadLetterStore {
    /// Deletes the DLQ messages of `records`, then their payload objects, then the records
    /// (25 per call).
    pub async fn remove_records(
        &self,
        records: &[DeadLetteredItem],
        parser: &ItemParser,
        mut progress: impl FnMut(usize),
    ) -> Result<RemovalReport, ProcessError> {
        let mut report = RemovalReport::default();
        // DLQ messages first, then payloads, records last: a purge that fails midway leaves
        // records (a second purge finds them again), never DLQ messages or payload objects
        // whose records are gone.
        let ids: HashSet<String> = records.iter().map(|r| r.item_id.clone()).collect();
        let sweep = self
            .sweep_dlq(
                Duration::from_secs(120),
                &SweepOptions {
                    adopt: false,
                    delete_items: ids,
                    parser: parser.clone(),
                    until: None,
                },
            )
            .await?;
        report.dlq_messages_deleted = sweep.deleted;
        let held: Vec<String> = sweep
            .held
            .into_values()
            .flatten()
            .map(|m| m.receipt)
            .collect();
        self.release_dlq_messages(&held).await?;
        for r in records {
            if let PayloadLocation::S3 { bucket, key } = &r.payload.location {
                self.clients
                    .s3
                    .delete_object()
                    .bucket(bucket)
                    .key(key)
                    .send()
                    .await
                    .map_err(|e| ProcessError::from_sdk(&e).with_step("delete-payload"))?;
                report.payloads_deleted += 1;
            }
        }
        for chunk in records.chunks(25) {
            let mut requests: Vec<WriteRequest> = chunk
                .iter()
                .filter_map(|r| {
                    DeleteRequest::builder()
                        .key(schema::ITEM_ID, AttributeValue::S(r.item_id.clone()))
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
            if !requests.is_empty() {
                return Err(ProcessError::new(
                    crate::error::ErrorClass::Throttled,
                    format!("{} deletes stayed unprocessed", requests.len()),
                )
                .with_step("delete-records"));
            }
            report.records_deleted += chunk.len();
            progress(report.records_deleted);
        }
        Ok(report)
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
