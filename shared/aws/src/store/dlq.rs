//! DLQ messages: one per dead-lettered item, sent in batches of up to 10 entries and
//! 1 MiB, each carrying the item id (the record's key) so tools can join message and record.

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

use super::StoreConfig;
use sqs_keeper_core::{dead_letter::DeadLetteredItem, dead_letter::PayloadLocation};
use sqs_keeper_core::{ErrorClass, ProcessError};

use sqs_keeper_core::{
    message::batches_by_size, message::fifo_group_id, message::ERROR_CLASS_ATTRIBUTE,
    message::ERROR_SIGNATURE_ATTRIBUTE, message::ITEM_ID_ATTRIBUTE,
    message::PAYLOAD_SHA256_ATTRIBUTE, message::RECORD_TABLE_ATTRIBUTE,
    message::SOURCE_MESSAGE_ID_ATTRIBUTE, pointer::S3Pointer,
    pointer::EXTENDED_PAYLOAD_SIZE_ATTRIBUTE,
};

/// Returns the DLQ body for a record: the original body, or a pointer to the S3 payload.
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

/// Returns a FIFO DLQ message's deduplication id ([`sqs_keeper_core::message::dlq_deduplication_id`]).
pub fn deduplication_id(record: &DeadLetteredItem) -> String {
    sqs_keeper_core::message::dlq_deduplication_id(record)
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
        builder = builder
            .message_group_id(group)
            .message_deduplication_id(deduplication_id(record));
    } else if let Some(group) = record
        .source
        .message_group_id
        .as_deref()
        .filter(|g| sqs_keeper_core::message::is_valid_message_group_id(g))
    {
        // A fair queue's tenant: the standard DLQ keeps it (SQS shares a standard queue's
        // consumers fairly between the groups its messages name). A group SQS would refuse
        // (a hand-built event's) is left off rather than fail every send.
        builder = builder.message_group_id(group);
    }
    let entry = builder
        .message_body(body)
        .build()
        .map_err(|e| ProcessError::validation(format!("DLQ entry: {e}")).with_step("dlq"))?;
    Ok((entry, size))
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
    let chunks = batches_by_size(entries);
    // A standard DLQ takes the batches at once (a batch of 100 dead letters is ten calls in
    // the time of one); a FIFO DLQ gets them in order, so each group's dead letters stay
    // in the order they were written.
    let failures: Vec<Vec<(usize, ProcessError)>> = if config.queue_url.ends_with(".fifo") {
        let mut failures = Vec::new();
        for chunk in chunks {
            failures.push(send_chunk(sqs, config, chunk).await);
        }
        failures
    } else {
        futures::future::join_all(chunks.into_iter().map(|c| send_chunk(sqs, config, c))).await
    };
    for (index, error) in failures.into_iter().flatten() {
        if let Some(slot) = results.get_mut(index) {
            *slot = Err(error);
        }
    }
    results
}

/// Sends one batch; the entries that failed, by their index in the records.
async fn send_chunk(
    sqs: &aws_sdk_sqs::Client,
    config: &StoreConfig,
    chunk: Vec<(usize, SendMessageBatchRequestEntry)>,
) -> Vec<(usize, ProcessError)> {
    let mut failures = Vec::new();
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
                if let Ok(index) = failed.id().parse::<usize>() {
                    failures.push((
                        index,
                        ProcessError::new(
                            class,
                            format!(
                                "DLQ rejected the message: {} {}",
                                failed.code(),
                                failed.message().unwrap_or("")
                            ),
                        )
                        .with_code(failed.code())
                        .with_step("dlq"),
                    ));
                }
            }
        }
        Err(e) => {
            let error = ProcessError::from_sdk(&e).with_step("dlq");
            failures.extend(indexes.into_iter().map(|i| (i, error.clone())));
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqs_keeper_core::message::is_valid_message_group_id;

    /// 25 dead letters go out as three batches; the second fails as a whole (503) and the
    /// third has one entry refused. Exactly those records fail, whether the batches go at
    /// once (standard DLQ) or in order (FIFO).
    #[tokio::test]
    async fn each_record_gets_the_result_of_its_own_entry_across_batches() {
        use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchOutput;
        use aws_sdk_sqs::types::BatchResultErrorEntry;
        use aws_smithy_mocks::{mock, mock_client};
        let first_id =
            |input: &aws_sdk_sqs::operation::send_message_batch::SendMessageBatchInput,
             id: &str| { input.entries().first().map(|e| e.id()) == Some(id) };
        let accepted = mock!(aws_sdk_sqs::Client::send_message_batch)
            .match_requests(move |input| first_id(input, "0"))
            .then_output(|| {
                SendMessageBatchOutput::builder()
                    .set_successful(Some(Vec::new()))
                    .set_failed(Some(Vec::new()))
                    .build()
                    .unwrap()
            });
        let unavailable = mock!(aws_sdk_sqs::Client::send_message_batch)
            .match_requests(move |input| first_id(input, "10"))
            .then_http_response(|| {
                aws_smithy_runtime_api::http::Response::new(
                    aws_smithy_runtime_api::http::StatusCode::try_from(503).unwrap(),
                    aws_smithy_types::body::SdkBody::from(""),
                )
            });
        let one_refused = mock!(aws_sdk_sqs::Client::send_message_batch)
            .match_requests(move |input| first_id(input, "20"))
            .then_output(|| {
                SendMessageBatchOutput::builder()
                    .set_successful(Some(Vec::new()))
                    .failed(
                        BatchResultErrorEntry::builder()
                            .id("22")
                            .sender_fault(true)
                            .code("InvalidMessageContents")
                            .build()
                            .unwrap(),
                    )
                    .build()
                    .unwrap()
            });
        let records: Vec<DeadLetteredItem> = (0..25)
            .map(|n| {
                sqs_keeper_core::testing::dead_record(&format!("i{n}"), ErrorClass::Validation, 1)
            })
            .collect();
        let refs: Vec<&DeadLetteredItem> = records.iter().collect();
        for queue in ["https://sqs/q/dlq", "https://sqs/q/dlq.fifo"] {
            let client = mock_client!(
                aws_sdk_sqs,
                aws_smithy_mocks::RuleMode::MatchAny,
                &[&accepted, &unavailable, &one_refused]
            );
            let config = StoreConfig::new("t", queue, "b");
            let results = send(&client, &config, &refs).await;
            assert_eq!(results.len(), 25, "{queue}");
            for (n, result) in results.iter().enumerate() {
                let should_fail = (10..20).contains(&n) || n == 22;
                assert_eq!(
                    result.is_err(),
                    should_fail,
                    "{queue}: record {n}: {result:?}"
                );
            }
            assert_eq!(
                results[22].as_ref().unwrap_err().class,
                ErrorClass::Validation,
                "a sender fault"
            );
            assert_eq!(
                results[10].as_ref().unwrap_err().class,
                ErrorClass::ServerError,
                "the batch's 503"
            );
        }
    }

    /// A later delivery re-sending the DLQ message of the same source message (the first
    /// send's answer was lost) is deduplicated: the receive count is not part of the id.
    #[test]
    fn a_resend_by_a_later_delivery_has_the_same_deduplication_id() {
        let mut first = sqs_keeper_core::testing::dead_record("order-1", ErrorClass::Timeout, 1);
        first.source.message_id = "m-1".into();
        first.source.receive_count = 3;
        let mut later = first.clone();
        later.source.receive_count = 4;
        assert_eq!(deduplication_id(&first), deduplication_id(&later));
        let mut other = first.clone();
        other.source.message_id = "m-2".into();
        assert_ne!(deduplication_id(&first), deduplication_id(&other));
    }

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
                &sqs_keeper_core::hex::sha256_hex("odd id/ü".as_bytes())[..32]
            )
        );
        assert_eq!(hashed.len(), 37);
        assert!(is_valid_message_group_id(&hashed));
        assert_eq!(fifo_group_id(Some(""), "odd id/ü"), hashed);
        assert_eq!(
            fifo_group_id(None, ""),
            format!("item-{}", &sqs_keeper_core::hex::sha256_hex(b"")[..32])
        );
        assert!(!is_valid_message_group_id(&"x".repeat(129)));
    }
}
