//! The source queues as the core's [`SourceQueue`] port (docs/ARCHITECTURE.md §5): where a
//! redrive's requeue finds a queue by name, reads its largest message, and sends items
//! back, one SQS call each.

use std::collections::HashMap;

use aws_sdk_sqs::types::{
    MessageAttributeValue, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
    SendMessageBatchRequestEntry,
};

use super::DeadLetterStore;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::{ports::OutgoingMessage, ports::SendResult, ports::SourceQueue};

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

    async fn message_retention(
        &self,
        queue_url: &str,
    ) -> Result<std::time::Duration, ProcessError> {
        super::message_retention(&self.clients().sqs, queue_url, "requeue").await
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

/// Returns one message as a `SendMessageBatch` entry.
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
    if let Some(header) = &message.trace_header {
        let trace = MessageSystemAttributeValue::builder()
            .data_type("String")
            .string_value(header)
            .build()
            .map_err(|e| ProcessError::validation(e.to_string()).with_step("requeue"))?;
        entry = entry
            .message_system_attributes(MessageSystemAttributeNameForSends::AwsTraceHeader, trace);
    }
    entry
        .build()
        .map_err(|e| ProcessError::validation(e.to_string()).with_step("requeue"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A requeued message continues its record's trace: the header is sent as the
    /// `AWSTraceHeader` system attribute, and a message without one sends none.
    #[test]
    fn a_traced_message_is_sent_with_its_aws_trace_header() {
        let header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let message = OutgoingMessage {
            id: "0".into(),
            body: "{}".into(),
            attributes: Vec::new(),
            group_id: None,
            deduplication_id: None,
            trace_header: Some(header.into()),
        };
        let entry = batch_entry(&message).unwrap();
        let system = entry.message_system_attributes().unwrap();
        let trace = &system[&MessageSystemAttributeNameForSends::AwsTraceHeader];
        assert_eq!(trace.string_value(), Some(header));
        assert_eq!(trace.data_type(), "String");
        let untraced = batch_entry(&OutgoingMessage {
            trace_header: None,
            ..message
        })
        .unwrap();
        assert!(untraced.message_system_attributes().is_none());
    }
}
