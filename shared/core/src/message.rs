//! What the messages this library sends carry, decided without I/O: the names of our
//! message attributes (on DLQ messages and requeued ones), the FIFO group of a message sent
//! for an item, and the split of a batch within `SendMessageBatch`'s limits. The sending
//! is in the AWS adapters (`sqs-keeper-aws`): its DLQ and source-queue ports.

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
/// Message attribute: on a FIFO DLQ message the sweep moved behind its group, the source
/// queue SQS's redrive policy named (`DeadLetterQueueSourceArn`, which a copy loses).
pub const SOURCE_QUEUE_ARN_ATTRIBUTE: &str = "source_queue_arn";
/// The attributes this project sets on messages it sends; never copied from a record's
/// source attributes onto a message (a requeue would carry stale ones).
pub const RESERVED_ATTRIBUTES: &[&str] = &[
    ITEM_ID_ATTRIBUTE,
    RECORD_TABLE_ATTRIBUTE,
    ERROR_CLASS_ATTRIBUTE,
    ERROR_SIGNATURE_ATTRIBUTE,
    SOURCE_MESSAGE_ID_ATTRIBUTE,
    PAYLOAD_SHA256_ATTRIBUTE,
    SOURCE_QUEUE_ARN_ATTRIBUTE,
    crate::dead_letter::REQUEUED_BY_ATTRIBUTE,
];

/// Returns the item id a DLQ message is tracked by: its `item_id` attribute (our DLQ messages and
/// requeues carry it); else the id its body gives (`from_body`: what the parser named the
/// item, which is the message id when the body names none); else `message_id`, the id of
/// the source message it holds ([`original_message_id`]).
pub fn dlq_item_id<'a>(
    attribute: impl Fn(&str) -> Option<&'a str>,
    from_body: Option<String>,
    message_id: &str,
) -> String {
    let id = match attribute(ITEM_ID_ATTRIBUTE) {
        Some(id) => id.to_string(),
        None => from_body.unwrap_or_else(|| message_id.to_string()),
    };
    crate::item::bounded_item_id(id)
}

/// Returns the id of the source message a DLQ message holds, which also stands for its item when
/// its body names none. Our DLQ messages and requeues (they carry our `item_id`) and the
/// copies a sweep's FIFO rotation sent (`rotated`) carry it in our `source_message_id`
/// attribute. Any other message is its own source: SQS's redrive policy keeps a message's
/// id. A producer's `source_message_id` attribute on such a message is never taken: it
/// could name another item's message.
pub fn original_message_id<'a>(
    attribute: impl Fn(&str) -> Option<&'a str>,
    own_id: &str,
    rotated: bool,
) -> String {
    let ours = rotated || attribute(ITEM_ID_ATTRIBUTE).is_some();
    match attribute(SOURCE_MESSAGE_ID_ATTRIBUTE) {
        Some(original) if ours => original.to_string(),
        _ => own_id.to_string(),
    }
}

/// Most entries a `SendMessageBatch` call takes.
pub const MAX_ENTRIES: usize = 10;
/// Most bytes a `SendMessageBatch` call takes.
pub const MAX_BATCH_BYTES: usize = 1_048_576;

/// Tells whether SQS accepts `id` as a `MessageGroupId`: 1 to 128 characters, each an ASCII
/// letter, digit or punctuation mark.
pub fn is_valid_message_group_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Returns the message group for a message sent to a FIFO queue on behalf of an item: the source
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

/// How long SQS drops a FIFO message whose deduplication id it saw sent before.
pub const FIFO_DEDUPLICATION_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// Returns a FIFO DLQ message's deduplication id: one per source message and item, whichever
/// delivery sends it. A source message has one DLQ message (the record's claim). The repeat
/// this catches is a later delivery re-sending after a send whose answer was lost, and
/// that delivery has another receive count.
pub fn dlq_deduplication_id(record: &crate::dead_letter::DeadLetteredItem) -> String {
    let mut key = format!("{}:{}", record.item_id, record.source.message_id);
    if crate::mutants::is_on(crate::mutants::Mutant::DeduplicationByReceive) {
        key.push_str(&format!(":{}", record.source.receive_count));
    }
    crate::hex::sha256_hex(key.as_bytes())
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

/// Returns what names a queue in an SQS queue ARN: its account and name (for `GetQueueUrl`).
pub fn queue_of_arn(arn: &str) -> Option<(&str, &str)> {
    let parts: Vec<&str> = arn.split(':').collect();
    match (parts.first(), parts.get(2), parts.get(4), parts.get(5)) {
        (Some(&"arn"), Some(&"sqs"), Some(account), Some(name))
            if !account.is_empty() && !name.is_empty() =>
        {
            Some((account, name))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_arns_name_their_account_and_queue() {
        assert_eq!(
            queue_of_arn("arn:aws:sqs:eu-west-1:123456789012:orders.fifo"),
            Some(("123456789012", "orders.fifo"))
        );
        assert_eq!(
            queue_of_arn("arn:aws:sns:eu-west-1:123456789012:topic"),
            None
        );
        assert_eq!(queue_of_arn("orders"), None);
        assert_eq!(queue_of_arn("arn:aws:sqs:eu-west-1::orders"), None);
    }
}

#[cfg(test)]
mod dlq_item_id_tests {
    use super::*;

    #[test]
    fn a_dlq_message_is_tracked_by_our_attribute_then_its_body_then_its_own_id() {
        let none = |_: &str| None;
        assert_eq!(dlq_item_id(none, None, "m-1"), "m-1");
        // A producer's `source_message_id` names no item.
        let theirs = |name: &str| (name == SOURCE_MESSAGE_ID_ATTRIBUTE).then_some("victim");
        assert_eq!(dlq_item_id(theirs, None, "m-2"), "m-2");
        assert_eq!(
            dlq_item_id(theirs, Some("order-7".into()), "m-2"),
            "order-7"
        );
        let ours = |name: &str| (name == ITEM_ID_ATTRIBUTE).then_some("order-8");
        assert_eq!(dlq_item_id(ours, Some("order-7".into()), "m-2"), "order-8");
        // Bounded as every item id.
        let long = "x".repeat(3000);
        assert!(dlq_item_id(none, Some(long), "m-3").len() < 100);
    }

    #[test]
    fn a_rotated_copy_stands_for_its_original_and_no_other_message_does() {
        let carried = |name: &str| (name == SOURCE_MESSAGE_ID_ATTRIBUTE).then_some("m-1");
        assert_eq!(original_message_id(carried, "copy-9", true), "m-1");
        // A producer's attribute on a message SQS moved names no message of ours.
        assert_eq!(original_message_id(carried, "m-2", false), "m-2");
        // A copy too large to carry the attribute is known by its own id.
        assert_eq!(original_message_id(|_| None, "copy-9", true), "copy-9");
        // Our dead-letter messages carry it beside our `item_id`.
        let ours = |name: &str| match name {
            SOURCE_MESSAGE_ID_ATTRIBUTE => Some("m-1"),
            ITEM_ID_ATTRIBUTE => Some("order-1"),
            _ => None,
        };
        assert_eq!(original_message_id(ours, "dlq-4", false), "m-1");
    }
}

/// The largest message SQS takes, body and attributes together.
pub const MAX_MESSAGE_BYTES: usize = 1_048_576;

/// Tells whether SQS takes `c` in a message body or a string attribute value. Its documented
/// character set is `#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF`.
/// Any other character fails the whole send with `InvalidMessageContents`.
pub fn sqs_allows(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// Tells whether SQS takes `text` as a message body or a string attribute value
/// ([`sqs_allows`] for each character).
pub fn sqs_safe(text: &str) -> bool {
    text.chars().all(sqs_allows)
}

/// Returns one attribute's share of a message's size, as SQS counts it: its name, data type and
/// value (a binary value by its bytes).
pub fn attribute_size(name: &str, value: &crate::dead_letter::MessageAttribute) -> usize {
    name.len()
        + value.data_type().len()
        + value.string_value().map_or(0, str::len)
        + value.binary_base64().map_or(0, |b| b.len() * 3 / 4)
}

/// Returns a message's size as SQS counts it against a queue's `MaximumMessageSize`.
pub fn message_size(
    body: &str,
    attributes: &[(String, crate::dead_letter::MessageAttribute)],
) -> usize {
    body.len()
        + attributes
            .iter()
            .map(|(name, value)| attribute_size(name, value))
            .sum::<usize>()
}

/// Returns those of the attributes a copy of a message of `size` bytes would add (`added`,
/// most needed first) that keep it within `limit`. A FIFO DLQ message near the limit can
/// then still be moved behind its group: a copy refused for its size would hide its group's
/// later messages for ever. What a dropped attribute said, the copy's body still says (its
/// item, its content's digest).
pub fn fitting_additions(
    size: usize,
    added: Vec<(String, crate::dead_letter::MessageAttribute)>,
    limit: usize,
) -> Vec<(String, crate::dead_letter::MessageAttribute)> {
    let mut total = size;
    added
        .into_iter()
        .filter(|(name, value)| {
            let more = attribute_size(name, value);
            let fits = total + more <= limit;
            if fits {
                total += more;
            }
            fits
        })
        .collect()
}
