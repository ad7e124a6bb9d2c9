//! DLQ messages: one per dead-lettered item, sent in batches of up to 10 entries and
//! 1 MiB, each carrying the item id (the record's key) so tools can join message and record.

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

use super::payload::{S3Pointer, EXTENDED_PAYLOAD_SIZE_ATTRIBUTE};
use super::StoreConfig;
use crate::dead_letter::{DeadLetteredItem, PayloadLocation};
use crate::error::{ErrorClass, ProcessError};

/// Message attribute: the item id, which is also the record's key in the table.
pub const ITEM_ID_ATTRIBUTE: &str = "item_id";
/// Message attribute: the table holding the record.
pub const RECORD_TABLE_ATTRIBUTE: &str = "record_table";
/// Message attribute: the error class.
pub const ERROR_CLASS_ATTRIBUTE: &str = "error_class";
/// Message attribute: the error signature.
pub const ERROR_SIGNATURE_ATTRIBUTE: &str = "error_signature";
/// Message attribute: the source message id.
pub const SOURCE_MESSAGE_ID_ATTRIBUTE: &str = "source_message_id";
/// Message attribute: sha256 of the payload the message holds (for an Extended Client
/// pointer, of the payload it points to).
pub const PAYLOAD_SHA256_ATTRIBUTE: &str = "payload_sha256";
/// The attributes this project sets on messages it sends; never copied from a record's
/// source attributes onto a message (a requeue would carry stale ones).
pub const RESERVED_ATTRIBUTES: &[&str] = &[
    ITEM_ID_ATTRIBUTE,
    RECORD_TABLE_ATTRIBUTE,
    ERROR_CLASS_ATTRIBUTE,
    ERROR_SIGNATURE_ATTRIBUTE,
    SOURCE_MESSAGE_ID_ATTRIBUTE,
    PAYLOAD_SHA256_ATTRIBUTE,
    crate::dead_letter::REQUEUED_BY_ATTRIBUTE,
];

/// SendMessageBatch limits.
const MAX_ENTRIES: usize = 10;
const MAX_BATCH_BYTES: usize = 1_048_576;

/// The DLQ body for a record: the original body, or a pointer to the S3 payload.
pub fn message_body(record: &DeadLetteredItem) -> String {
    match &record.payload.location {
        PayloadLocation::Inline { body } => body.clone(),
        PayloadLocation::S3 { bucket, key } => S3Pointer {
            bucket: bucket.clone(),
            key: key.clone(),
        }
        .to_body(),
    }
}

/// Whether SQS accepts `id` as a `MessageGroupId`: 1 to 128 characters, each an ASCII
/// letter, digit or punctuation mark.
pub fn is_valid_message_group_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// The message group for a message sent to a FIFO queue on behalf of an item: the source
/// message's group when SQS accepts it, else the item id when SQS accepts that, else
/// `item-` and the first 32 hex digits of the item id's sha256. A record whose group is
/// missing or unusable (a hand-built event, a group id the item id was made from) must
/// still reach the DLQ: SQS rejects a FIFO message without a valid group, and a record
/// whose DLQ message is rejected goes round the source queue until SQS moves it
/// unrecorded. The fallback is stable, so one item's messages stay in one group.
pub fn fifo_group_id(source_group: Option<&str>, item_id: &str) -> String {
    match source_group {
        Some(group) if is_valid_message_group_id(group) => group.to_string(),
        _ if is_valid_message_group_id(item_id) => item_id.to_string(),
        _ => format!("item-{}", &crate::hex::sha256_hex(item_id.as_bytes())[..32]),
    }
}

fn string_attr(value: &str) -> Option<MessageAttributeValue> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .ok()
}

fn entry(
    id: usize,
    record: &DeadLetteredItem,
    config: &StoreConfig,
) -> Result<(SendMessageBatchRequestEntry, usize), ProcessError> {
    let body = message_body(record);
    let mut attributes = vec![
        (ITEM_ID_ATTRIBUTE, record.item_id.clone()),
        (RECORD_TABLE_ATTRIBUTE, config.table.clone()),
        (
            ERROR_CLASS_ATTRIBUTE,
            record.error_class.as_str().to_string(),
        ),
        (ERROR_SIGNATURE_ATTRIBUTE, record.error_signature.clone()),
        (
            SOURCE_MESSAGE_ID_ATTRIBUTE,
            record.source.message_id.clone(),
        ),
        (PAYLOAD_SHA256_ATTRIBUTE, record.payload.sha256.clone()),
    ];
    let mut builder = SendMessageBatchRequestEntry::builder().id(id.to_string());
    if matches!(record.payload.location, PayloadLocation::S3 { .. }) {
        attributes.push((
            EXTENDED_PAYLOAD_SIZE_ATTRIBUTE,
            record.payload.size_bytes.to_string(),
        ));
    }
    let mut size = body.len();
    for (name, value) in &attributes {
        size += name.len() + value.len() + 16;
        let attr = if *name == EXTENDED_PAYLOAD_SIZE_ATTRIBUTE {
            MessageAttributeValue::builder()
                .data_type("Number")
                .string_value(value)
                .build()
                .ok()
        } else {
            string_attr(value)
        };
        if let Some(attr) = attr {
            builder = builder.message_attributes(*name, attr);
        }
    }
    if config.queue_url.ends_with(".fifo") {
        let group = fifo_group_id(record.source.message_group_id.as_deref(), &record.item_id);
        // Deduplicate re-sends of the same delivery, not later failures of the same item.
        let dedup = crate::hex::sha256_hex(
            format!(
                "{}:{}:{}",
                record.item_id, record.source.message_id, record.source.receive_count
            )
            .as_bytes(),
        );
        builder = builder
            .message_group_id(group)
            .message_deduplication_id(dedup);
    }
    let entry = builder
        .message_body(body)
        .build()
        .map_err(|e| ProcessError::validation(format!("DLQ entry: {e}")).with_step("dlq"))?;
    Ok((entry, size))
}

/// Splits `(key, entry, size)` triples into `SendMessageBatch` calls: at most 10 entries
/// and 1 MiB each (an entry bigger than that goes alone, and SQS says why it refuses it).
pub fn batches_by_size<K, E>(entries: Vec<(K, E, usize)>) -> Vec<Vec<(K, E)>> {
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = 0;
    for (key, entry, size) in entries {
        if !batch.is_empty() && (batch.len() == MAX_ENTRIES || bytes + size > MAX_BATCH_BYTES) {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += size;
        batch.push((key, entry));
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// Sends one DLQ message per record; one result per record, in order.
pub async fn send(
    sqs: &aws_sdk_sqs::Client,
    config: &StoreConfig,
    records: &[&DeadLetteredItem],
) -> Vec<Result<(), ProcessError>> {
    let mut results: Vec<Result<(), ProcessError>> = Vec::with_capacity(records.len());
    let mut entries = Vec::new();
    for (index, record) in records.iter().enumerate() {
        results.push(Ok(()));
        match entry(index, record, config) {
            Ok((entry, size)) => entries.push((index, entry, size)),
            Err(e) => results[index] = Err(e),
        }
    }
    for chunk in batches_by_size(entries) {
        send_chunk(sqs, config, chunk, &mut results).await;
    }
    results
}

async fn send_chunk(
    sqs: &aws_sdk_sqs::Client,
    config: &StoreConfig,
    chunk: Vec<(usize, SendMessageBatchRequestEntry)>,
    results: &mut [Result<(), ProcessError>],
) {
    let indexes: Vec<usize> = chunk.iter().map(|(i, _)| *i).collect();
    let response = sqs
        .send_message_batch()
        .queue_url(&config.queue_url)
        .set_entries(Some(chunk.into_iter().map(|(_, e)| e).collect()))
        .send()
        .await;
    match response {
        Ok(output) => {
            for failed in output.failed() {
                let class = if failed.sender_fault() {
                    ErrorClass::Validation
                } else {
                    ErrorClass::ServerError
                };
                if let Some(slot) = failed
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| results.get_mut(i))
                {
                    *slot = Err(ProcessError::new(
                        class,
                        format!(
                            "DLQ rejected the message: {} {}",
                            failed.code(),
                            failed.message().unwrap_or("")
                        ),
                    )
                    .with_code(failed.code())
                    .with_step("dlq"));
                }
            }
        }
        Err(e) => {
            let error = ProcessError::from_sdk(&e).with_step("dlq");
            for i in indexes {
                if let Some(slot) = results.get_mut(i) {
                    *slot = Err(error.clone());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_fall_back_to_a_valid_one() {
        // The source group wins when SQS accepts it.
        assert_eq!(fifo_group_id(Some("tenant-7"), "order-1"), "tenant-7");
        assert_eq!(fifo_group_id(Some("a!~{}[]"), "order-1"), "a!~{}[]");
        let max = "g".repeat(128);
        assert_eq!(fifo_group_id(Some(&max), "order-1"), max);
        // Missing, empty, too long, or with characters SQS refuses: the item id.
        for bad in [
            None,
            Some(""),
            Some(&*"g".repeat(129)),
            Some("a b"),
            Some("ü"),
            Some("a\tb"),
        ] {
            assert_eq!(fifo_group_id(bad, "order-1"), "order-1", "{bad:?}");
        }
        // The item id is no valid group either: a digest of it, stable and valid.
        let hashed = fifo_group_id(None, "odd id/ü");
        assert_eq!(
            hashed,
            format!(
                "item-{}",
                &crate::hex::sha256_hex("odd id/ü".as_bytes())[..32]
            )
        );
        assert_eq!(hashed.len(), 37);
        assert!(is_valid_message_group_id(&hashed));
        assert_eq!(fifo_group_id(Some(""), "odd id/ü"), hashed);
        assert_eq!(
            fifo_group_id(None, ""),
            format!("item-{}", &crate::hex::sha256_hex(b"")[..32])
        );
        assert!(!is_valid_message_group_id(&"x".repeat(129)));
    }
}
