//! The work item: one SQS record, checked and described for a [`crate::Processor`].
//!
//! Parsing is per record so that one malformed body fails only its own record (docs/ARCHITECTURE.md §1.3):
//! a body that is not valid for the configured [`BodyFormat`] or [`Envelopes`] becomes a
//! permanent validation error for that record, never an error for the whole event. The
//! same holds for a body that does not fit the type a handler reads it as
//! ([`WorkItem::json`]).

use std::collections::HashMap;
use std::str::FromStr;

use aws_lambda_events::sqs::{SqsMessage, SqsMessageAttribute};
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::envelope::{Envelopes, Unwrapped};
use crate::error::ProcessError;
use crate::event::{Attributes, SqsRecord, Text};

/// Where a record's *item id* comes from. Redriven messages get new message ids, so records
/// are keyed by an id that belongs to the item itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ItemIdSource {
    /// Use the SQS message id.
    MessageId,
    /// The id of the event inside the configured envelope (SNS `MessageId`, EventBridge
    /// `id`, an S3 object and its sequencer); the SQS message id without one.
    Envelope,
    /// A JSON pointer (RFC 6901) into the body, e.g. `/order/id`; strings and numbers count.
    JsonPointer(String),
    /// A string message attribute with this name.
    MessageAttribute(String),
}

impl FromStr for ItemIdSource {
    type Err = String;

    /// Parses `message-id`, `envelope`, `pointer:/json/pointer` or `attribute:Name`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "message-id" {
            return Ok(ItemIdSource::MessageId);
        }
        if s == "envelope" {
            return Ok(ItemIdSource::Envelope);
        }
        if let Some(pointer) = s.strip_prefix("pointer:") {
            if pointer.starts_with('/') {
                return Ok(ItemIdSource::JsonPointer(pointer.to_string()));
            }
            return Err(format!("JSON pointer must start with '/', got {pointer:?}"));
        }
        if let Some(name) = s.strip_prefix("attribute:") {
            if !name.is_empty() {
                return Ok(ItemIdSource::MessageAttribute(name.to_string()));
            }
        }
        Err(format!(
            "expected message-id, envelope, pointer:/path or attribute:Name, got {s:?}"
        ))
    }
}

/// Longest item id kept as it is. DynamoDB refuses keys over 2,048 bytes (on reads too), so
/// one overlong id would fail every lookup that includes it; longer ids are replaced by
/// [`bounded_item_id`].
pub const MAX_ITEM_ID_BYTES: usize = 1024;

/// Returns `id`, or `sha256:<hex digest of id>` ([`kept_id`] with [`MAX_ITEM_ID_BYTES`]):
/// stable (the same id always maps to the same key), short, and one every DLQ message can
/// carry. An id with a control character (`{"id":"a\u0001b"}`, an S3 key with `%01`) would
/// otherwise fail every DLQ send of its item.
pub fn bounded_item_id(id: String) -> String {
    if crate::mutants::is_on(crate::mutants::Mutant::IdsUnsafeForSqs)
        && id.len() <= MAX_ITEM_ID_BYTES
    {
        return id;
    }
    kept_id(id, MAX_ITEM_ID_BYTES)
}

/// Digests of ids begin with this.
const DIGEST_PREFIX: &str = "sha256:";

/// Returns an id as records and DLQ messages keep it: `id` itself while it is at most `bound`
/// bytes and of SQS's character set ([`crate::message::sqs_safe`]); otherwise `sha256:`
/// and the hex digest of `id`.
///
/// A kept id is kept as it is: our own DLQ messages and requeues carry the kept id as
/// `item_id`, and reading it again must find the same record. So an id a producer
/// spells exactly as the digest of another id shares that id's record; SHA-256 makes
/// that a deliberate act, never a coincidence.
///
/// ```
/// use sqs_keeper_core::item::kept_id;
///
/// assert_eq!(kept_id("order-7".to_string(), 64), "order-7");
/// let digest = kept_id("a\u{1}b".to_string(), 64);
/// assert!(digest.starts_with("sha256:"));
/// assert_eq!(kept_id(digest.clone(), 1024), digest, "kept as it is");
/// ```
pub fn kept_id(id: String, bound: usize) -> String {
    if id.len() <= bound && crate::message::sqs_safe(&id) {
        id
    } else {
        format!("{DIGEST_PREFIX}{}", crate::hex::sha256_hex(id.as_bytes()))
    }
}

/// What a valid body looks like; `WORKER_BODY_FORMAT` names it `json` or `text`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, strum::EnumString)]
#[strum(serialize_all = "lowercase")]
#[non_exhaustive]
pub enum BodyFormat {
    /// The body must be a JSON document; anything else is a validation error.
    #[default]
    Json,
    /// Any text is accepted.
    Text,
}

/// How records become work items.
///
/// Exhaustive on purpose: it is built with struct update syntax
/// (`..Default::default()`), which `#[non_exhaustive]` forbids outside this crate. A field
/// added later comes with its default, so such code keeps compiling.
#[derive(Debug, Clone)]
pub struct ItemParser {
    /// Where the item id comes from.
    pub id_source: ItemIdSource,
    /// What a valid payload looks like.
    pub body_format: BodyFormat,
    /// The envelope around each body, unwrapped before the payload is checked.
    pub envelope: Envelopes,
}

impl Default for ItemParser {
    fn default() -> Self {
        ItemParser {
            id_source: ItemIdSource::MessageId,
            body_format: BodyFormat::Json,
            envelope: Envelopes::default(),
        }
    }
}

/// One record, ready for processing.
///
/// ```
/// use sqs_keeper_core::WorkItem;
///
/// #[derive(serde::Deserialize)]
/// struct Order {
///     order_id: String,
/// }
///
/// let item = WorkItem {
///     message_id: "m-1".into(),
///     item_id: "o-1".into(),
///     body: r#"{"order_id":"o-1"}"#.into(),
///     ..WorkItem::default()
/// };
/// // The payload, typed; a body that does not parse is a validation error.
/// let order: Order = item.json()?;
/// assert_eq!(order.order_id, "o-1");
/// # Ok::<(), sqs_keeper_core::ProcessError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WorkItem {
    /// The SQS message id (what the batch response reports).
    pub message_id: String,
    /// The item's own id (see [`ItemIdSource`]); the message id when none is found.
    pub item_id: String,
    /// The message body, as received (the envelope included: this is what a dead-letter
    /// record keeps and a requeue sends again). Handlers read [`WorkItem::payload`].
    pub body: String,
    /// `ApproximateReceiveCount`: 1 on first delivery.
    pub receive_count: u32,
    /// `SentTimestamp`, when present and valid.
    pub sent_timestamp: Option<DateTime<Utc>>,
    /// `MessageGroupId` for FIFO queues.
    pub message_group_id: Option<String>,
    /// The ARN of the queue the record came from.
    pub event_source_arn: Option<String>,
    /// SQS system attributes, as strings.
    pub attributes: Attributes,
    /// The sender's message attributes.
    #[serde(skip)]
    pub message_attributes: HashMap<String, SqsMessageAttribute>,
    /// What the configured envelope held: the payload, each layer's metadata, and whether
    /// the body was a service notice. `None` when no envelope is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envelope: Option<Box<Unwrapped>>,
}

impl WorkItem {
    /// Returns the trace context the record carries: a W3C `traceparent` message attribute, else
    /// the `AWSTraceHeader` SQS keeps from an X-Ray-traced producer
    /// ([`crate::trace::TraceContext::of`]).
    pub fn trace(&self) -> Option<crate::trace::TraceContext> {
        crate::trace::TraceContext::of(self)
    }

    /// Creates an item with this message id (also its item id) and body, everything else empty:
    /// for tests of a processor.
    pub fn new(message_id: impl Into<String>, body: impl Into<String>) -> WorkItem {
        let message_id = message_id.into();
        WorkItem {
            item_id: message_id.clone(),
            message_id,
            body: body.into(),
            receive_count: 1,
            ..WorkItem::default()
        }
    }

    /// Returns what the handler processes: the body, or what the configured envelope wrapped
    /// (`WORKER_ENVELOPE`).
    pub fn payload(&self) -> &str {
        self.envelope
            .as_deref()
            .map_or(self.body.as_str(), |e| e.payload.as_str())
    }

    /// Returns the payload read as `T`. A payload that does not fit is a validation failure
    /// (dead-lettered on first sight) whose message names where it does not fit, e.g.
    /// `lines[2].qty: invalid type: string "2", expected u32`.
    pub fn json<'a, T: serde::Deserialize<'a>>(&'a self) -> Result<T, ProcessError> {
        let mut deserializer = serde_json::Deserializer::from_str(self.payload());
        let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let at = if path == "." {
                String::new()
            } else {
                format!("{path}: ")
            };
            ProcessError::validation(format!(
                "the payload does not fit {}: {at}{inner}",
                short_type_name::<T>()
            ))
            .with_step("decode")
        })?;
        deserializer.end().map_err(|e| {
            ProcessError::validation(format!("the payload has trailing data: {e}"))
                .with_step("decode")
        })?;
        Ok(value)
    }
}

/// `T`'s name without its module path (`Order`, not `orders::model::Order`).
fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

/// A record whose body is not valid: the item (keyed by its message id) and why.
#[derive(Debug, Clone)]
pub struct InvalidRecord {
    /// The record, with `item_id` falling back to the message id.
    pub item: WorkItem,
    /// The validation error that makes this record permanently unprocessable.
    pub error: ProcessError,
}

impl ItemParser {
    /// Builds a work item from a record whose message id is known. Never fails the batch:
    /// an invalid body gives an [`InvalidRecord`] for this record only.
    pub fn parse(
        &self,
        message_id: String,
        msg: SqsMessage,
    ) -> Result<WorkItem, Box<InvalidRecord>> {
        self.parse_record(message_id, SqsRecord::from(msg))
    }

    /// Runs [`ItemParser::parse`] on a record decoded by [`crate::event::decode_event`].
    /// Its strings are copied out of the event here, as the record runs (an unescaped body
    /// moves without a copy).
    pub fn parse_record(
        &self,
        message_id: String,
        msg: SqsRecord<'_>,
    ) -> Result<WorkItem, Box<InvalidRecord>> {
        let SqsRecord {
            body,
            attributes,
            message_attributes,
            event_source_arn,
            ..
        } = msg;
        let receive_count = attributes
            .get("ApproximateReceiveCount")
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(1);
        let sent_timestamp = attributes
            .get("SentTimestamp")
            .and_then(|v| v.parse::<i64>().ok())
            .and_then(DateTime::<Utc>::from_timestamp_millis);
        let message_group_id = attributes.get("MessageGroupId").map(str::to_string);
        let mut item = WorkItem {
            // SQS's own ids are always safe; one from a hand-built event is made so.
            item_id: bounded_item_id(message_id.clone()),
            message_id,
            body: body.map(Text::into_owned).unwrap_or_default(),
            receive_count,
            sent_timestamp,
            message_group_id,
            event_source_arn: event_source_arn.map(Text::into_owned),
            attributes,
            message_attributes,
            envelope: None,
        };
        let checked = self
            .unwrap_envelope(&mut item)
            .and_then(|()| self.item_id_and_check(&item));
        match checked {
            Ok(Some(id)) => {
                item.item_id = bounded_item_id(id);
                Ok(item)
            }
            Ok(None) => Ok(item),
            Err(error) => Err(Box::new(InvalidRecord {
                item,
                error: error.with_step("parse"),
            })),
        }
    }

    /// Unwraps the configured envelope into `item.envelope` (nothing to do without one).
    /// Used as records are parsed, and by a redrive that reprocesses a record's body.
    pub fn unwrap_envelope(&self, item: &mut WorkItem) -> Result<(), ProcessError> {
        if self.envelope.is_none() {
            return Ok(());
        }
        item.envelope = Some(Box::new(self.envelope.unwrap(&item.body)?));
        Ok(())
    }

    /// Checks the payload against the format and extracts the item id, if configured. A
    /// service notice (no payload) is not checked: it is skipped.
    /// The item id `item`'s body names (its envelope unwrapped as configured), bounded as
    /// an item id; `None` when it names none or cannot be read.
    pub fn id_named_by(&self, item: &WorkItem) -> Option<String> {
        let mut copy = item.clone();
        self.unwrap_envelope(&mut copy).ok()?;
        self.item_id_and_check(&copy)
            .ok()
            .flatten()
            .map(bounded_item_id)
    }

    fn item_id_and_check(&self, item: &WorkItem) -> Result<Option<String>, ProcessError> {
        let invalid_json = |e: serde_json::Error| {
            ProcessError::validation(format!("{} is not valid JSON: {e}", self.what()))
        };
        if item.envelope.as_ref().is_some_and(|e| e.notice.is_some()) {
            return Ok(envelope_id(item));
        }
        match (&self.id_source, self.body_format) {
            (ItemIdSource::JsonPointer(pointer), _) => {
                let doc: serde_json::Value =
                    serde_json::from_str(item.payload()).map_err(invalid_json)?;
                Ok(doc.pointer(pointer).and_then(id_from_json))
            }
            (source, BodyFormat::Json) => {
                // Validate without building a tree: IgnoredAny allocates nothing.
                serde_json::from_str::<serde::de::IgnoredAny>(item.payload())
                    .map_err(invalid_json)?;
                Ok(other_id(source, item))
            }
            (source, BodyFormat::Text) => Ok(other_id(source, item)),
        }
    }

    /// Returns how errors name what was checked.
    fn what(&self) -> &'static str {
        if self.envelope.is_none() {
            "body"
        } else {
            "the envelope's payload"
        }
    }
}

fn other_id(source: &ItemIdSource, item: &WorkItem) -> Option<String> {
    match source {
        ItemIdSource::Envelope => envelope_id(item),
        _ => attribute_id(source, item),
    }
}

fn envelope_id(item: &WorkItem) -> Option<String> {
    item.envelope.as_ref().and_then(|e| e.event_id())
}

fn attribute_id(source: &ItemIdSource, item: &WorkItem) -> Option<String> {
    match source {
        ItemIdSource::MessageAttribute(name) => item
            .message_attributes
            .get(name)
            .and_then(|a| a.string_value.clone())
            .filter(|v| !v.is_empty()),
        _ => None,
    }
}

fn id_from_json(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Tells whether an event source ARN names a FIFO queue.
pub fn is_fifo_arn(arn: &str) -> bool {
    arn.ends_with(".fifo")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(body: &str, attrs: serde_json::Value) -> SqsMessage {
        serde_json::from_value(json!({
            "messageId": "m-1",
            "body": body,
            "attributes": attrs,
            "messageAttributes": {
                "itemId": {"stringValue": "attr-7", "dataType": "String"}
            },
            "eventSourceARN": "arn:aws:sqs:eu-west-1:1:q"
        }))
        .unwrap()
    }

    fn parser(source: &str, format: BodyFormat) -> ItemParser {
        ItemParser {
            id_source: source.parse().unwrap(),
            body_format: format,
            envelope: Default::default(),
        }
    }

    #[test]
    fn item_id_sources() {
        let attrs = json!({"ApproximateReceiveCount": "2"});
        let body = r#"{"order":{"id":"o-9"},"n":17}"#;
        let by_pointer = parser("pointer:/order/id", BodyFormat::Json)
            .parse("m-1".into(), message(body, attrs.clone()))
            .unwrap();
        assert_eq!(by_pointer.item_id, "o-9");
        assert_eq!(by_pointer.receive_count, 2);
        let numeric = parser("pointer:/n", BodyFormat::Json)
            .parse("m-1".into(), message(body, attrs.clone()))
            .unwrap();
        assert_eq!(numeric.item_id, "17");
        let missing = parser("pointer:/nope", BodyFormat::Json)
            .parse("m-1".into(), message(body, attrs.clone()))
            .unwrap();
        assert_eq!(missing.item_id, "m-1", "falls back to the message id");
        let by_attribute = parser("attribute:itemId", BodyFormat::Text)
            .parse("m-1".into(), message("plain text", attrs.clone()))
            .unwrap();
        assert_eq!(by_attribute.item_id, "attr-7");
        let by_message = parser("message-id", BodyFormat::Json)
            .parse("m-1".into(), message(body, attrs))
            .unwrap();
        assert_eq!(by_message.item_id, "m-1");
    }

    /// An id SQS could not carry in the DLQ message's `item_id` attribute becomes its
    /// digest, as an over-long one does; every other id is kept as it is.
    #[test]
    fn an_id_with_a_character_sqs_refuses_becomes_its_digest() {
        let body = r#"{"id":"a\u0001b","tab":"a\tb","bom":"x\uFFFEy"}"#;
        let id_of = |pointer: &str| {
            parser(pointer, BodyFormat::Json)
                .parse("m-1".into(), message(body, json!({})))
                .unwrap()
                .item_id
        };
        for (pointer, raw) in [("pointer:/id", "a\u{1}b"), ("pointer:/bom", "x\u{FFFE}y")] {
            let id = id_of(pointer);
            assert_eq!(
                id,
                format!("sha256:{}", crate::hex::sha256_hex(raw.as_bytes())),
                "{pointer}"
            );
            assert!(crate::message::sqs_safe(&id));
        }
        assert_eq!(id_of("pointer:/tab"), "a\tb", "a tab is in SQS's set");
    }

    /// A kept id is kept as it is, item ids and message ids alike: a requeued message
    /// carries its record's kept id as `item_id`, and reading it again must find that
    /// record (digested again, the record stayed `requeued`: found by the simulation,
    /// seed 18, when a change digested ids spelled as digests).
    #[test]
    fn a_kept_id_is_kept_as_it_is() {
        let digest = bounded_item_id("a\u{1}b".to_string());
        assert!(digest.starts_with("sha256:"));
        assert_eq!(bounded_item_id(digest.clone()), digest);
        assert_eq!(crate::dead_letter::recorded_message_id(&digest), digest);
        assert_eq!(crate::dead_letter::recorded_message_id("m-1"), "m-1");
        // Our DLQ message naming the kept id is tracked by that same key.
        let ours =
            |name: &str| (name == crate::message::ITEM_ID_ATTRIBUTE).then_some(digest.as_str());
        assert_eq!(crate::message::dlq_item_id(ours, None, "m-1"), digest);
    }

    #[test]
    fn sqs_character_set_is_the_documented_one() {
        use crate::message::sqs_allows;
        for c in [
            '\t',
            '\n',
            '\r',
            ' ',
            '~',
            '\u{D7FF}',
            '\u{E000}',
            '\u{FFFD}',
            '\u{10000}',
            '\u{10FFFF}',
        ] {
            assert!(sqs_allows(c), "{c:?}");
        }
        for c in [
            '\u{0}', '\u{1}', '\u{8}', '\u{B}', '\u{1F}', '\u{FFFE}', '\u{FFFF}',
        ] {
            assert!(!sqs_allows(c), "{c:?}");
        }
    }

    #[test]
    fn malformed_body_is_a_validation_error_for_that_record() {
        for source in ["message-id", "pointer:/id"] {
            let err = parser(source, BodyFormat::Json)
                .parse("m-1".into(), message("{\"id\": ", json!({})))
                .unwrap_err();
            assert_eq!(err.error.class, crate::error::ErrorClass::Validation);
            assert_eq!(err.item.item_id, "m-1");
            assert_eq!(err.item.body, "{\"id\": ");
        }
        // Text bodies are never malformed.
        assert!(parser("message-id", BodyFormat::Text)
            .parse("m-1".into(), message("{\"id\": ", json!({})))
            .is_ok());
    }

    #[test]
    fn attributes_are_read_from_strings() {
        let item = ItemParser::default()
            .parse(
                "m-1".into(),
                message(
                    "{}",
                    json!({
                        "ApproximateReceiveCount": "not a number",
                        "SentTimestamp": "1700000000123",
                        "MessageGroupId": "g"
                    }),
                ),
            )
            .unwrap();
        assert_eq!(item.receive_count, 1);
        assert_eq!(
            item.sent_timestamp.unwrap().timestamp_millis(),
            1_700_000_000_123
        );
        assert_eq!(item.message_group_id.as_deref(), Some("g"));
    }

    #[test]
    fn id_source_syntax() {
        assert!("pointer:id".parse::<ItemIdSource>().is_err());
        assert!("attribute:".parse::<ItemIdSource>().is_err());
        assert!("body".parse::<ItemIdSource>().is_err());
        assert!("yaml".parse::<BodyFormat>().is_err());
        assert_eq!("json".parse::<BodyFormat>(), Ok(BodyFormat::Json));
        assert_eq!("text".parse::<BodyFormat>(), Ok(BodyFormat::Text));
        assert!("JSON".parse::<BodyFormat>().is_err());
        assert!(is_fifo_arn("arn:aws:sqs:us-east-1:1:q.fifo"));
        assert!(!is_fifo_arn("arn:aws:sqs:us-east-1:1:fifo"));
    }
}
