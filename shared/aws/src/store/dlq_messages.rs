//! The DLQ as the core's [`DeadLetterQueue`] port (docs/ARCHITECTURE.md §5): the batched
//! dead-letter send ([`super::dlq`]), and receiving, deleting, holding and rotating DLQ
//! messages in SQS for the sweep, and adopting a message into the DynamoDB table. The rules
//! and the loops are the core's ([`sqs_keeper_core::sweep`]); what is here is the SDK calls,
//! and how an SQS message is read (its item id, its [`MessageView`], the work item it would
//! have been).

use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
    MessageSystemAttributeName,
};

use super::DeadLetterStore;
use sqs_keeper_core::dead_letter::DeadLetteredItem;
use sqs_keeper_core::item::ItemParser;
use sqs_keeper_core::message::ITEM_ID_ATTRIBUTE;
use sqs_keeper_core::pointer::S3Pointer;
use sqs_keeper_core::{
    ports::Adoption, ports::DeadLetterQueue, ports::MessageView, ports::ReceivedMessage,
};
use sqs_keeper_core::{sweep::adopted_record, sweep::Sweep, sweep::SweepOptions};
use sqs_keeper_core::{ErrorClass, ProcessError};

/// The attribute real SQS adds to messages its redrive policy moved.
const SOURCE_ARN_ATTRIBUTE: &str = "DeadLetterQueueSourceArn";

impl DeadLetterStore {
    /// Makes one sweep pass over the DLQ ([`sqs_keeper_core::sweep::sweep_dlq`] over this store).
    pub async fn sweep_dlq(&self, options: &SweepOptions) -> Result<Sweep, ProcessError> {
        sqs_keeper_core::sweep::sweep_dlq(self, options).await
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
        self.hold_dlq_messages(receipts, Duration::ZERO).await
    }

    /// Holds DLQ messages invisible for `hold` from now (zero: visible again). A receipt
    /// that no longer holds its message (deleted meanwhile, or received again by another
    /// sweep) is skipped: that message is no longer this caller's to give back.
    pub async fn hold_dlq_messages(
        &self,
        receipts: &[String],
        hold: Duration,
    ) -> Result<(), ProcessError> {
        let seconds = i32::try_from(hold.as_secs().min(43_200)).unwrap_or(43_200);
        for chunk in receipts.chunks(10) {
            let entries: Vec<ChangeMessageVisibilityBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(r)
                        .visibility_timeout(seconds)
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

    /// Returns the DLQ depth: visible and in-flight messages.
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

/// How long a sweep's receive waits for a message (a long poll asks every server).
const SWEEP_WAIT_SECONDS: i32 = 1;

/// The longest a sweep waits for one Extended-Client payload (to name its item, or to
/// adopt it): S3's client sets no timeout of its own, and a read that never answers would
/// hold the sweep, and the redrive run behind it, past its end. A read cut there fails the
/// adoption for the moment, as any transient failure does.
const SWEEP_PAYLOAD_READ: Duration = Duration::from_secs(10);

/// [`super::payload::get_payload_limited`] within [`SWEEP_PAYLOAD_READ`].
async fn read_payload(
    store: &DeadLetterStore,
    pointer: &S3Pointer,
) -> Result<String, ProcessError> {
    let read = super::payload::get_payload_limited(
        &store.clients.s3,
        pointer,
        store.payload_policy.max_bytes,
    );
    match tokio::time::timeout(SWEEP_PAYLOAD_READ, read).await {
        Ok(read) => read.map(|(text, _)| text),
        Err(_) => Err(ProcessError::new(
            ErrorClass::Timeout,
            format!(
                "reading s3://{}/{} took more than {} s",
                pointer.bucket,
                pointer.key,
                SWEEP_PAYLOAD_READ.as_secs()
            ),
        )
        .with_step("fetch-payload")),
    }
}

impl DeadLetterQueue for DeadLetterStore {
    type Message = Message;

    /// Sends with one `SendMessageBatch` per ten messages (and 1 MiB) (the store's `dlq::send`).
    async fn send_to_dlq(&self, records: &[&DeadLetteredItem]) -> Vec<Result<(), ProcessError>> {
        super::dlq::send(&self.clients.sqs, &self.config, records).await
    }

    /// Receives with one `ReceiveMessage` of up to 10 messages, with all their attributes, long-polling
    /// for a second: an empty answer then means no server of the queue had a visible
    /// message (a short poll samples a few, and answered empty while messages waited, which
    /// ended sweeps early). A message without a receipt handle (SQS always gives one) could
    /// be neither deleted nor given back: it is left out.
    async fn receive(
        &self,
        hold: Duration,
        parser: &ItemParser,
    ) -> Result<Vec<ReceivedMessage<Message>>, ProcessError> {
        let hold_secs = i32::try_from(hold.as_secs().clamp(1, 43_200)).unwrap_or(900);
        let output = self
            .clients
            .sqs
            .receive_message()
            .queue_url(&self.config.queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(hold_secs)
            .wait_time_seconds(SWEEP_WAIT_SECONDS)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("sweep-receive"))?;
        let with_receipts: Vec<(&Message, &str)> = output
            .messages()
            .iter()
            .filter_map(|m| Some((m, m.receipt_handle()?)))
            .collect();
        // The page's payload reads (to name items) run together: ten pointers whose
        // bucket never answers cost one read's time limit, not ten.
        let item_ids = futures::future::join_all(
            with_receipts
                .iter()
                .map(|(message, _)| self.tracked_item_id(message, parser)),
        )
        .await;
        Ok(with_receipts
            .into_iter()
            .zip(item_ids)
            .map(|((message, receipt), item_id)| ReceivedMessage {
                receipt: receipt.to_string(),
                item_id,
                view: message_view(message, &self.config.bucket),
                marker: rotation_marker(message),
                sent_at_ms: message
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
                    .and_then(|t| t.parse().ok()),
                message: message.clone(),
            })
            .collect())
    }

    /// Creates (or reopens) the record of a DLQ message no record holds, under `item_id`
    /// (the id the message is tracked by), with the message's payload: an SQS Extended
    /// Client pointer is resolved, so a redrive reprocesses the payload, not the pointer.
    async fn adopt(
        &self,
        message: &Message,
        item_id: &str,
        parser: &ItemParser,
        adoption: &Adoption,
    ) -> Result<Option<DeadLetteredItem>, ProcessError> {
        let mut item = match to_work_item(message, parser) {
            Ok(item) => item,
            Err(invalid) => invalid.item,
        };
        item.item_id = item_id.to_string();
        if item.event_source_arn.is_none() {
            item.event_source_arn = adoption.known_queue_arn.clone();
        }
        let mut error =
            ProcessError::new(ErrorClass::Unknown, adoption.reason).with_step("dlq-adopt");
        // Followed as the worker would: only to a bucket it reads payloads from, and no
        // larger than its cap. A pointer is data from whoever could send to the queue.
        if let Some(pointer) = self.payload_policy.pointer_in(&item.body) {
            let fetched = match pointer {
                Ok(pointer) => read_payload(self, &pointer).await,
                Err(refused) => Err(refused),
            };
            match fetched {
                Ok(payload) => {
                    item.body = payload;
                    let ours = message
                        .message_attributes()
                        .is_some_and(|a| a.contains_key(ITEM_ID_ATTRIBUTE));
                    sqs_keeper_core::sweep::tracked_as_its_payload_names(
                        ours,
                        item_id,
                        parser.id_named_by(&item).as_deref(),
                    )?;
                }
                // See `Adoption::unfetched_payload`.
                Err(fetch) => error = Adoption::unfetched_payload(fetch)?,
            }
        }
        let mut record = adopted_record(
            item,
            error,
            message.message_id().unwrap_or_default(),
            message_view(message, &self.config.bucket).source_message_id,
            adoption,
            self.config.retention,
            self.clock.now(),
        );
        self.offload_payload(&mut record).await?;
        let written = sqs_keeper_core::recording::adopt(
            self,
            &self.recording(),
            &record,
            sqs_keeper_core::ports::Expect::judged(
                adoption.expected_status,
                &adoption.message_keys,
            ),
        )
        .await?;
        Ok(written.then_some(record))
    }

    async fn delete_messages(&self, receipts: &[String]) -> Result<usize, ProcessError> {
        self.delete_dlq_messages(receipts).await
    }

    async fn hold(&self, receipts: &[String], hold: Duration) -> Result<(), ProcessError> {
        self.hold_dlq_messages(receipts, hold).await
    }

    fn is_fifo(&self) -> bool {
        self.config.queue_url.ends_with(".fifo")
    }

    /// `SendMessage` of the copy (its deduplication id names the pass and the original),
    /// then `DeleteMessage` of the original.
    async fn rotate(
        &self,
        message: &Message,
        receipt: &str,
        pass: &str,
    ) -> Result<bool, ProcessError> {
        let Some(group) = system_attribute(message, "MessageGroupId") else {
            return Ok(false);
        };
        let original_id = message.message_id().unwrap_or_default();
        let attributes = copy_attributes(message);
        let dedup = format!(
            "{ROTATION_PREFIX}{pass}:{}",
            sqs_keeper_core::hex::sha256_hex(original_id.as_bytes())
        );
        self.clients
            .sqs
            .send_message()
            .queue_url(&self.config.queue_url)
            .message_body(message.body().unwrap_or_default())
            .set_message_attributes(Some(attributes))
            .message_group_id(group)
            .message_deduplication_id(&dedup[..dedup.len().min(128)])
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("dlq-rotate"))?;
        self.clients
            .sqs
            .delete_message()
            .queue_url(&self.config.queue_url)
            .receipt_handle(receipt)
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("dlq-rotate"))?;
        Ok(true)
    }
}

/// Returns a system attribute of `message`, if it has it.
fn system_attribute(message: &Message, name: &str) -> Option<String> {
    message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::from(name)))
        .cloned()
}

type Attributes = std::collections::HashMap<String, aws_sdk_sqs::types::MessageAttributeValue>;

/// Returns the message attributes of a rotated copy: the original's, and what identifies its
/// content. What identifies it stays with the copy: the source message (a message moved
/// by the redrive policy is its own source), by which the copy is tracked as its original
/// (`DeadLetterQueue::rotate`), then its source queue. Most needed first, each only while
/// the copy stays within SQS's size: a copy refused for its size would hide its group's
/// later messages for ever.
fn copy_attributes(message: &Message) -> Attributes {
    let original_id = message.message_id().unwrap_or_default();
    let source = original_message_id(message);
    let mut attributes = message.message_attributes().cloned().unwrap_or_default();
    // A producer's own `source_message_id` gives way: the copy names the delivery it holds.
    if string_attribute(
        message,
        sqs_keeper_core::message::SOURCE_MESSAGE_ID_ATTRIBUTE,
    ) != Some(source.as_str())
    {
        attributes.remove(sqs_keeper_core::message::SOURCE_MESSAGE_ID_ATTRIBUTE);
    }
    let mut added = Vec::new();
    let mut add = |name: &str, value: &str| {
        if !attributes.contains_key(name) {
            added.push((
                name.to_string(),
                sqs_keeper_core::dead_letter::MessageAttribute::string(value),
            ));
        }
    };
    add(
        sqs_keeper_core::message::SOURCE_MESSAGE_ID_ATTRIBUTE,
        &source,
    );
    if let Some(arn) = system_attribute(message, SOURCE_ARN_ATTRIBUTE) {
        add(sqs_keeper_core::message::SOURCE_QUEUE_ARN_ATTRIBUTE, &arn);
    }
    let size = message.body().unwrap_or_default().len() + attributes_size(&attributes);
    for (name, value) in sqs_keeper_core::message::fitting_additions(
        size,
        added,
        sqs_keeper_core::message::MAX_MESSAGE_BYTES,
    ) {
        let copied = value.string_value().and_then(|value| {
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .ok()
        });
        if let Some(value) = copied {
            attributes.insert(name, value);
        }
    }
    if attributes.len() > MAX_MESSAGE_ATTRIBUTES {
        keep_ours_first(&mut attributes);
        tracing::warn!(message_id = %original_id, "a FIFO DLQ message moved behind its group lost the producer attributes past SQS's ten; its record keeps them");
    }
    attributes
}

/// Returns the bytes SQS counts for `attributes`: names, types and values.
fn attributes_size(attributes: &Attributes) -> usize {
    attributes
        .iter()
        .map(|(name, value)| {
            name.len()
                + value.data_type().len()
                + value.string_value().map_or(0, str::len)
                + value.binary_value().map_or(0, |b| b.as_ref().len())
        })
        .sum()
}

/// Keeps SQS's ten attributes at most. What identifies the message (ours) stays; producer
/// attributes past the tenth are left off the copy (the record, which an adopting sweep
/// has written by now, keeps every one): a message that cannot move would hide its
/// group's later messages for ever.
fn keep_ours_first(attributes: &mut Attributes) {
    let mut names: Vec<String> = attributes.keys().cloned().collect();
    names.sort_by_key(|name| {
        (
            !sqs_keeper_core::message::RESERVED_ATTRIBUTES.contains(&name.as_str()),
            name.clone(),
        )
    });
    for dropped in names.split_off(MAX_MESSAGE_ATTRIBUTES) {
        attributes.remove(&dropped);
    }
}

/// Most message attributes SQS takes on one message.
const MAX_MESSAGE_ATTRIBUTES: usize = 10;

/// How the deduplication id of a copy a sweep's rotation sent begins.
const ROTATION_PREFIX: &str = "sweep:";

/// Returns the pass whose rotation sent `message`, read from its deduplication id.
fn rotation_marker(message: &Message) -> Option<String> {
    let dedup = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageDeduplicationId))?;
    let rest = dedup.strip_prefix(ROTATION_PREFIX)?;
    rest.split(':').next().map(str::to_string)
}

/// The item id a DLQ message is tracked by: our `item_id` attribute, else the id the
/// parser finds in it, else its message id; kept within DynamoDB's key size
/// ([`sqs_keeper_core::item::bounded_item_id`]).
impl DeadLetterStore {
    /// Returns the item id a DLQ message is tracked by ([`message_item_id`]). A message without
    /// our `item_id` attribute whose body is an Extended-Client pointer (one SQS's redrive
    /// policy moved from a producer using the Extended Client) names its item in the
    /// payload, as the worker read it: the payload is read (under the worker's payload
    /// policy) for the id, so the message is tracked by the item the worker recorded it
    /// under, not by a second record under its message id (found by the simulation, seeds
    /// 3947, 6922, 16919). A payload that cannot be read leaves the message id: its
    /// adoption fails for the moment too, and a later sweep reads it again.
    async fn tracked_item_id(&self, message: &Message, parser: &ItemParser) -> String {
        let ours = message
            .message_attributes()
            .is_some_and(|a| a.contains_key(ITEM_ID_ATTRIBUTE));
        let pointer = message
            .body()
            .filter(|_| !ours)
            .and_then(|body| self.payload_policy.pointer_in(body))
            .and_then(Result::ok);
        if let Some(pointer) = pointer {
            if let Ok(payload) = read_payload(self, &pointer).await {
                let mut resolved = message.clone();
                resolved.body = Some(payload);
                return message_item_id(&resolved, parser);
            }
        }
        message_item_id(message, parser)
    }
}

fn message_item_id(message: &Message, parser: &ItemParser) -> String {
    sqs_keeper_core::message::dlq_item_id(
        |name| string_attribute(message, name),
        to_work_item(message, parser).ok().map(|item| item.item_id),
        &original_message_id(message),
    )
}

/// Returns the id of the source message `message` holds: a rotated copy's original's
/// ([`sqs_keeper_core::message::original_message_id`]), else its own.
fn original_message_id(message: &Message) -> String {
    sqs_keeper_core::message::original_message_id(
        |name| string_attribute(message, name),
        message.message_id().unwrap_or_default(),
        rotation_marker(message).is_some(),
    )
}

/// Returns what identifies a DLQ message's content ([`MessageView::of_dlq_message`]).
fn message_view(message: &Message, own_bucket: &str) -> MessageView {
    MessageView::of_dlq_message(
        message.message_id().unwrap_or_default(),
        message.body().unwrap_or_default(),
        |name| string_attribute(message, name),
        own_bucket,
        rotation_marker(message).is_some(),
    )
}

/// Returns the string value of `message`'s message attribute `name`.
fn string_attribute<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    message
        .message_attributes()
        .and_then(|a| a.get(name))
        .and_then(|v| v.string_value())
}

/// Returns a DLQ message as a work item (as the worker would have seen it).
fn to_work_item(
    message: &Message,
    parser: &ItemParser,
) -> Result<sqs_keeper_core::WorkItem, Box<sqs_keeper_core::item::InvalidRecord>> {
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
        .cloned()
        .or_else(|| {
            message
                .message_attributes()
                .and_then(|a| a.get(sqs_keeper_core::message::SOURCE_QUEUE_ARN_ATTRIBUTE))
                .and_then(|v| v.string_value())
                .map(str::to_string)
        });
    // A rotated copy is read as its original: under the original's id.
    let message_id = original_message_id(message);
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

    /// A sweep's receive long-polls: a short poll samples a few of the queue's servers and
    /// may answer empty while messages wait, which ended sweeps (and purges) early, leaving
    /// messages to be adopted later as unknown and delivered again.
    #[tokio::test]
    async fn a_sweep_receive_long_polls_so_an_empty_answer_means_an_empty_queue() {
        use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
        use aws_smithy_mocks::{mock, mock_client};
        let receive = mock!(aws_sdk_sqs::Client::receive_message)
            .match_requests(|r| r.wait_time_seconds().is_some_and(|w| w >= 1))
            .then_output(|| ReceiveMessageOutput::builder().build());
        let store = crate::store::mocked_store(|clients| {
            clients.sqs = mock_client!(
                aws_sdk_sqs,
                aws_smithy_mocks::RuleMode::MatchAny,
                &[&receive]
            );
        });
        let received = store
            .receive(Duration::from_secs(60), &ItemParser::default())
            .await
            .unwrap();
        assert!(received.is_empty());
        assert_eq!(receive.num_calls(), 1, "the request long-polled");
    }

    fn string_value(value: &str) -> aws_sdk_sqs::types::MessageAttributeValue {
        aws_sdk_sqs::types::MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .unwrap()
    }

    /// A FIFO DLQ message with `attributes`, sent by a rotation when `rotated`.
    fn fifo_message(id: &str, body: &str, attributes: &[(&str, &str)], rotated: bool) -> Message {
        let mut message = Message::builder()
            .message_id(id)
            .body(body)
            .attributes(MessageSystemAttributeName::MessageGroupId, "g1");
        if rotated {
            message = message.attributes(
                MessageSystemAttributeName::MessageDeduplicationId,
                format!("{ROTATION_PREFIX}pass-1:abc"),
            );
        }
        for (name, value) in attributes {
            message = message.message_attributes(*name, string_value(value));
        }
        message.build()
    }

    /// Found by the simulation (seed 713214): a copy carried the item a purge's sweep
    /// guessed for it. A copy now carries the delivery it holds and no item id, and is
    /// tracked and judged as its original, whatever parser the sweep reads it with.
    #[test]
    fn a_rotated_copy_carries_its_original_delivery_and_is_tracked_as_it() {
        use sqs_keeper_core::message::SOURCE_MESSAGE_ID_ATTRIBUTE;
        // SQS's redrive policy moved it; its producer set our attribute's name.
        let moved = fifo_message(
            "m-1",
            r#"{"note":"no id"}"#,
            &[(SOURCE_MESSAGE_ID_ATTRIBUTE, "victim")],
            false,
        );
        let attributes = copy_attributes(&moved);
        let carried = attributes
            .get(SOURCE_MESSAGE_ID_ATTRIBUTE)
            .and_then(|v| v.string_value());
        assert_eq!(
            carried,
            Some("m-1"),
            "the delivery it holds, not the producer's"
        );
        assert!(
            !attributes.contains_key(ITEM_ID_ATTRIBUTE),
            "no guessed item"
        );
        assert_eq!(message_view(&moved, "ours").source_message_id, "m-1");
        let copy = fifo_message(
            "copy-9",
            r#"{"note":"no id"}"#,
            &[(SOURCE_MESSAGE_ID_ATTRIBUTE, "m-1")],
            true,
        );
        let by_message_id = ItemParser::default();
        let by_payload = ItemParser {
            id_source: sqs_keeper_core::item::ItemIdSource::JsonPointer("/id".into()),
            ..ItemParser::default()
        };
        assert_eq!(message_item_id(&copy, &by_message_id), "m-1");
        assert_eq!(message_item_id(&copy, &by_payload), "m-1");
        assert_eq!(message_view(&copy, "ours").source_message_id, "m-1");
        let named = fifo_message(
            "copy-9",
            r#"{"id":"order-7"}"#,
            &[(SOURCE_MESSAGE_ID_ATTRIBUTE, "m-1")],
            true,
        );
        assert_eq!(message_item_id(&named, &by_payload), "order-7");
        // A copy of a copy carries the same delivery.
        let again = copy_attributes(&copy);
        assert_eq!(
            again
                .get(SOURCE_MESSAGE_ID_ATTRIBUTE)
                .and_then(|v| v.string_value()),
            Some("m-1")
        );
    }
}
