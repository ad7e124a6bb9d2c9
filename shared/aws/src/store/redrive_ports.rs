//! The redrive engine's ports (the core's `ports`) over AWS: records in the DynamoDB table,
//! the DLQ and the source queues in SQS, payloads in S3. Each method delegates to the
//! store's own operations (the DLQ's to the core's sweep, the core's `sweep`, over the store's
//! [`sqs_keeper_core::DlqMessages`]), or is the one SDK call it needs.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

use super::payload;
use super::DeadLetterStore;
use sqs_keeper_core::HeldMessage;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::S3Pointer;
use sqs_keeper_core::{
    DeadLetterQueue, OutgoingMessage, PayloadStore, RecordStore, SendResult, SourceQueue, Sweep,
    SweepOptions,
};
use sqs_keeper_core::{DeadLetteredItem, FailureDetail};
use sqs_keeper_core::{Page, PageToken, RecordFilter};

impl RecordStore for DeadLetterStore {
    async fn get(&self, item_id: &str) -> Result<Option<DeadLetteredItem>, ProcessError> {
        DeadLetterStore::get(self, item_id).await
    }

    async fn query_page(
        &self,
        filter: &RecordFilter,
        limit: i32,
        start: Option<&PageToken>,
    ) -> Result<Page, ProcessError> {
        DeadLetterStore::query_page(self, filter, limit, start).await
    }

    fn token_after(&self, record: &DeadLetteredItem, filter: &RecordFilter) -> PageToken {
        super::query::token_after(record, filter)
    }

    async fn acquire_lease(
        &self,
        item_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, ProcessError> {
        DeadLetterStore::acquire_lease(self, item_id, owner, ttl).await
    }

    async fn acquire_leases(
        &self,
        item_ids: &[String],
        owner: &str,
        ttl: Duration,
    ) -> Vec<Result<bool, ProcessError>> {
        DeadLetterStore::acquire_leases(self, item_ids, owner, ttl).await
    }

    async fn release_lease(&self, item_id: &str, owner: &str) -> Result<(), ProcessError> {
        DeadLetterStore::release_lease(self, item_id, owner).await
    }

    async fn resolve(&self, record: &DeadLetteredItem, owner: &str) -> Result<(), ProcessError> {
        DeadLetterStore::resolve(self, record, owner).await
    }

    async fn mark_requeued(
        &self,
        record: &DeadLetteredItem,
        owner: &str,
        message_id: &str,
    ) -> Result<(), ProcessError> {
        DeadLetterStore::mark_requeued(self, record, owner, message_id).await
    }

    async fn record_redrive_failure(
        &self,
        item_id: &str,
        owner: &str,
        failures: &[FailureDetail],
    ) -> Result<(), ProcessError> {
        DeadLetterStore::record_redrive_failure(self, item_id, owner, failures).await
    }

    async fn reopen_requeued(
        &self,
        record: &DeadLetteredItem,
        failure: &FailureDetail,
    ) -> Result<bool, ProcessError> {
        DeadLetterStore::reopen_requeued(self, record, failure).await
    }
}

impl DeadLetterQueue for DeadLetterStore {
    async fn sweep(&self, options: &SweepOptions) -> Result<Sweep, ProcessError> {
        sqs_keeper_core::sweep_dlq(self, options).await
    }

    async fn settle_held(
        &self,
        held: BTreeMap<String, Vec<HeldMessage>>,
        wait: Duration,
        then: Duration,
    ) -> Result<sqs_keeper_core::Settled, ProcessError> {
        sqs_keeper_core::settle_held(self, held, wait, then, self.clock).await
    }
}

impl PayloadStore for DeadLetterStore {
    async fn fetch(&self, pointer: &S3Pointer) -> Result<String, ProcessError> {
        payload::get_payload(&self.clients().s3, pointer)
            .await
            .map(|(body, _)| body)
    }

    async fn delete(&self, pointer: &S3Pointer) -> Result<(), ProcessError> {
        self.clients()
            .s3
            .delete_object()
            .bucket(&pointer.bucket)
            .key(&pointer.key)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| ProcessError::from_sdk(&e).with_step("delete-payload"))
    }
}

impl SourceQueue for DeadLetterStore {
    async fn queue_url(&self, name: &str, account: &str) -> Result<String, ProcessError> {
        let output = self
            .clients()
            .sqs
            .get_queue_url()
            .queue_name(name)
            .queue_owner_aws_account_id(account)
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("requeue"))?;
        Ok(output.queue_url().unwrap_or_default().to_string())
    }

    async fn maximum_message_size(&self, queue_url: &str) -> Result<u64, ProcessError> {
        super::maximum_message_size(&self.clients().sqs, queue_url, "requeue").await
    }

    async fn send_batch(
        &self,
        queue_url: &str,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<SendResult>, ProcessError> {
        let entries = messages
            .iter()
            .map(batch_entry)
            .collect::<Result<Vec<_>, _>>()?;
        let output = self
            .clients()
            .sqs
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("requeue"))?;
        let mut results: HashMap<&str, SendResult> = HashMap::new();
        for failed in output.failed() {
            results.insert(
                failed.id(),
                Err(format!(
                    "{} {}",
                    failed.code(),
                    failed.message().unwrap_or("")
                )),
            );
        }
        for ok in output.successful() {
            results
                .entry(ok.id())
                .or_insert_with(|| Ok(ok.message_id().to_string()));
        }
        Ok(messages
            .iter()
            .map(|m| {
                results
                    .remove(m.id.as_str())
                    .unwrap_or_else(|| Err("no result for it".to_string()))
            })
            .collect())
    }
}

/// One message as a `SendMessageBatch` entry.
fn batch_entry(message: &OutgoingMessage) -> Result<SendMessageBatchRequestEntry, ProcessError> {
    let mut entry = SendMessageBatchRequestEntry::builder()
        .id(&message.id)
        .message_body(&message.body)
        .set_message_group_id(message.group_id.clone())
        .set_message_deduplication_id(message.deduplication_id.clone());
    for (name, value) in &message.attributes {
        let mut attribute = MessageAttributeValue::builder()
            .data_type(value.data_type())
            .set_string_value(value.string_value().map(str::to_string));
        if let Some(binary) = value.binary_base64() {
            let bytes = aws_smithy_types::base64::decode(binary).map_err(|e| {
                ProcessError::validation(format!("attribute {name:?} is not base64: {e}"))
                    .with_step("requeue")
            })?;
            attribute = attribute.binary_value(aws_sdk_sqs::primitives::Blob::new(bytes));
        }
        let attribute = attribute
            .build()
            .map_err(|e| ProcessError::validation(e.to_string()).with_step("requeue"))?;
        entry = entry.message_attributes(name, attribute);
    }
    entry
        .build()
        .map_err(|e| ProcessError::validation(e.to_string()).with_step("requeue"))
}
