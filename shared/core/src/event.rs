//! Decoding the SQS event the worker receives, fast and without copying it.
//!
//! The Lambda runtime hands the worker the invocation body as the bytes the Runtime API
//! sent. [`decode_event`] reads them in one pass with `sonic-rs`' SIMD parser into an
//! [`SqsBatch`] whose records borrow from those bytes: ids, receipt handles, ARNs and any
//! body without JSON escapes are slices of the body buffer ([`Text`]); only a string whose
//! JSON spelling has escapes (a JSON body inside the event always has some: `\"`) is
//! unescaped into its own allocation. A record's system attributes are one compact
//! [`Attributes`] value (every name and value in one string) instead of a map of owned
//! strings, and the sender's message attributes, rare and typed, are decoded as
//! `aws_lambda_events` decodes them. The engine makes each record a
//! [`WorkItem`](crate::item::WorkItem) only when it runs it.
//!
//! [`decode_sqs_event`] is the same decode made owned (`aws_lambda_events`' `SqsEvent`).
//! The tests hold both to `serde_json` field for field, on valid and broken events, and the
//! property tests on generated ones.
//!
//! [`Text`] and [`Attributes`] are deserialized by hand because serde borrows a
//! `Cow<str>` only as a direct field: inside an `Option` or a map it always copies.
//!
//! What is an error here fails the whole invocation, as a `serde_json` decode would have:
//! not JSON, no `Records` array, a field of the wrong JSON type. Per-record problems that
//! the engine can report individually (a missing message id, a body that is not what the
//! processor expects) are not decided here.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage, SqsMessageAttribute};
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Serialize;

/// Why an invocation body is not an SQS event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// Not a JSON document.
    #[error("the event is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not shaped like an SQS event.
    #[error("the event is not an SQS event: {0}")]
    Shape(String),
}

/// A JSON string of the event: borrowed from the event's bytes when its JSON spelling has
/// no escapes, unescaped into its own allocation when it has.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Text<'a>(pub Cow<'a, str>);

impl<'a> Text<'a> {
    /// Returns the text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Returns the text, owned (no copy when it was unescaped already).
    pub fn into_owned(self) -> String {
        self.0.into_owned()
    }

    /// Tells whether the text is a slice of the event's bytes.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.0, Cow::Borrowed(_))
    }
}

impl From<String> for Text<'_> {
    fn from(s: String) -> Self {
        Text(Cow::Owned(s))
    }
}

impl<'a> From<&'a str> for Text<'a> {
    fn from(s: &'a str) -> Self {
        Text(Cow::Borrowed(s))
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(v)))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(TextVisitor)
    }
}

/// A record's SQS system attributes (`ApproximateReceiveCount`, `SentTimestamp`,
/// `MessageGroupId`, ...): every name and value in one string, so a record's attributes
/// cost two allocations instead of a map of owned strings. Names are unique: setting a
/// name again replaces its value, as in a map (and as a JSON object decoded into one).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    text: String,
    /// Per attribute, where its name ends and where its value ends in `text`; each name
    /// starts where the previous value ended.
    ends: Vec<(usize, usize)>,
}

impl Attributes {
    /// Creates an empty set of attributes.
    pub fn new() -> Self {
        Attributes::default()
    }

    /// Returns the value of attribute `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        // Compared as bytes, and only the value found made a `str`: every name and value
        // was pushed whole, so each range is on character boundaries.
        let bytes = self.text.as_bytes();
        let mut start = 0;
        for &(name_end, value_end) in &self.ends {
            if bytes.get(start..name_end) == Some(name.as_bytes()) {
                return self.text.get(name_end..value_end);
            }
            start = value_end;
        }
        None
    }

    /// Sets `name` to `value`, replacing any value it had.
    pub fn insert(&mut self, name: &str, value: &str) {
        if self.get(name).is_some() {
            let kept: Vec<(String, String)> = self
                .iter()
                .map(|(n, v)| (n.to_string(), if n == name { value } else { v }.to_string()))
                .collect();
            *self = Attributes::default();
            for (n, v) in &kept {
                self.push(n, v);
            }
            return;
        }
        self.push(name, value);
    }

    fn push(&mut self, name: &str, value: &str) {
        self.text.push_str(name);
        let name_end = self.text.len();
        self.text.push_str(value);
        self.ends.push((name_end, self.text.len()));
    }

    /// Returns every attribute, in the order they were set.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&(name_end, value_end)| {
            let name = self.text.get(start..name_end).unwrap_or_default();
            let value = self.text.get(name_end..value_end).unwrap_or_default();
            start = value_end;
            (name, value)
        })
    }

    /// Returns how many attributes there are.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Tells whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Returns the attributes as `aws_lambda_events` holds them.
    pub fn to_map(&self) -> HashMap<String, String> {
        self.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }
}

impl fmt::Debug for Attributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Attributes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Attributes {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut attributes = Attributes::default();
        for (name, value) in iter {
            attributes.insert(name.as_ref(), value.as_ref());
        }
        attributes
    }
}

impl From<HashMap<String, String>> for Attributes {
    fn from(map: HashMap<String, String>) -> Self {
        map.iter().collect()
    }
}

struct AttributesVisitor;

impl<'de> Visitor<'de> for AttributesVisitor {
    type Value = Attributes;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of strings")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Attributes::default())
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Attributes::default())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut attributes = Attributes::default();
        // SQS sends four system attributes of some 120 bytes in all to a standard queue's
        // function, seven to a FIFO queue's: room for the first without growing.
        attributes.text.reserve(128);
        attributes.ends.reserve(4);
        while let Some((name, value)) = map.next_entry::<Text<'de>, Text<'de>>()? {
            attributes.insert(name.as_str(), value.as_str());
        }
        Ok(attributes)
    }
}

impl<'de> Deserialize<'de> for Attributes {
    /// Reads an object of strings; `null` is none, as `aws_lambda_events` reads it.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_option(AttributesVisitor)
    }
}

/// `messageAttributes` as `aws_lambda_events` reads it (null is none): owned, because they
/// are rare, typed, and their binary values are decoded from base64.
fn nullish_message_attributes<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<HashMap<String, SqsMessageAttribute>, D::Error> {
    Ok(
        Option::<HashMap<String, SqsMessageAttribute>>::deserialize(deserializer)?
            .unwrap_or_default(),
    )
}

/// One SQS record, its strings borrowed from the event's bytes ([`Text`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SqsRecord<'a> {
    /// `messageId`.
    #[serde(default, borrow)]
    pub message_id: Option<Text<'a>>,
    /// `receiptHandle`.
    #[serde(default, borrow)]
    pub receipt_handle: Option<Text<'a>>,
    /// `body`.
    #[serde(default, borrow)]
    pub body: Option<Text<'a>>,
    /// `md5OfBody`.
    #[serde(default, borrow)]
    pub md5_of_body: Option<Text<'a>>,
    /// `md5OfMessageAttributes`.
    #[serde(default, borrow)]
    pub md5_of_message_attributes: Option<Text<'a>>,
    /// `attributes`: the system attributes.
    #[serde(default)]
    pub attributes: Attributes,
    /// `messageAttributes`: the sender's attributes.
    #[serde(default, deserialize_with = "nullish_message_attributes")]
    pub message_attributes: HashMap<String, SqsMessageAttribute>,
    /// `eventSourceARN`: the queue's ARN.
    #[serde(default, borrow, rename = "eventSourceARN")]
    pub event_source_arn: Option<Text<'a>>,
    /// `eventSource`.
    #[serde(default, borrow)]
    pub event_source: Option<Text<'a>>,
    /// `awsRegion`.
    #[serde(default, borrow)]
    pub aws_region: Option<Text<'a>>,
}

impl SqsRecord<'_> {
    /// Returns a system attribute's value.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name)
    }

    /// Returns `messageId`.
    pub fn message_id(&self) -> Option<&str> {
        self.message_id.as_ref().map(Text::as_str)
    }

    /// Returns `eventSourceARN`.
    pub fn event_source_arn(&self) -> Option<&str> {
        self.event_source_arn.as_ref().map(Text::as_str)
    }

    /// Returns `receiptHandle`.
    pub fn receipt_handle(&self) -> Option<&str> {
        self.receipt_handle.as_ref().map(Text::as_str)
    }

    /// Returns the record as `aws_lambda_events` has it.
    pub fn into_message(self) -> SqsMessage {
        let mut message = SqsMessage::default();
        message.message_id = self.message_id.map(Text::into_owned);
        message.receipt_handle = self.receipt_handle.map(Text::into_owned);
        message.body = self.body.map(Text::into_owned);
        message.md5_of_body = self.md5_of_body.map(Text::into_owned);
        message.md5_of_message_attributes = self.md5_of_message_attributes.map(Text::into_owned);
        message.attributes = self.attributes.to_map();
        message.message_attributes = self.message_attributes;
        message.event_source_arn = self.event_source_arn.map(Text::into_owned);
        message.event_source = self.event_source.map(Text::into_owned);
        message.aws_region = self.aws_region.map(Text::into_owned);
        message
    }
}

impl From<SqsMessage> for SqsRecord<'static> {
    /// Returns an owned record as the engine reads it (the strings move, nothing is copied but
    /// the system attributes).
    fn from(message: SqsMessage) -> Self {
        SqsRecord {
            message_id: message.message_id.map(Text::from),
            receipt_handle: message.receipt_handle.map(Text::from),
            body: message.body.map(Text::from),
            md5_of_body: message.md5_of_body.map(Text::from),
            md5_of_message_attributes: message.md5_of_message_attributes.map(Text::from),
            attributes: Attributes::from(message.attributes),
            message_attributes: message.message_attributes,
            event_source_arn: message.event_source_arn.map(Text::from),
            event_source: message.event_source.map(Text::from),
            aws_region: message.aws_region.map(Text::from),
        }
    }
}

/// An SQS event whose records borrow from the invocation body ([`decode_event`] reads it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SqsBatch<'a> {
    /// `Records`.
    pub records: Vec<SqsRecord<'a>>,
}

impl From<SqsEvent> for SqsBatch<'static> {
    fn from(event: SqsEvent) -> Self {
        SqsBatch {
            records: event.records.into_iter().map(SqsRecord::from).collect(),
        }
    }
}

/// Decodes an SQS event from its JSON bytes (UTF-8, as JSON is), borrowing its strings.
pub fn decode_event(json: &[u8]) -> Result<SqsBatch<'_>, EventError> {
    // sonic-rs checks UTF-8 only in what it reads, and skips unknown fields unchecked: an
    // invalid byte there would pass where the runtime's serde_json refuses the event.
    // simdutf8 (already sonic-rs's dependency) checks the whole event at SIMD speed.
    if let Err(error) = simdutf8::compat::from_utf8(json) {
        return Err(EventError::NotJson(format!(
            "invalid UTF-8 at byte {}",
            error.valid_up_to()
        )));
    }
    let mut deserializer = sonic_rs::Deserializer::from_slice(json);
    let batch = BatchSeed {
        capacity: records_capacity(json.len()),
    }
    .deserialize(&mut deserializer)
    .map_err(event_error)?;
    deserializer.end().map_err(event_error)?;
    Ok(batch)
}

/// Room for the records of an event of `len` bytes, so the array is never grown (and
/// copied) while it is read: a record as SQS sends it is over 500 bytes (ids, receipt
/// handle, digests, attributes, ARN), and a batch holds at most 10,000. Room that is not
/// used is never touched, so it costs no memory.
fn records_capacity(len: usize) -> usize {
    (len / 512).clamp(1, 10_000)
}

/// Reads the event with the `Records` array sized up front ([`records_capacity`]); the
/// same shapes and errors as the derived `Deserialize` of `SqsEvent`.
struct BatchSeed {
    capacity: usize,
}

impl<'de> DeserializeSeed<'de> for BatchSeed {
    type Value = SqsBatch<'de>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_struct("SqsEvent", &["Records"], self)
    }
}

impl<'de> Visitor<'de> for BatchSeed {
    type Value = SqsBatch<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct SqsEvent")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut records = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            if key.as_str() == "Records" {
                if records.is_some() {
                    return Err(de::Error::duplicate_field("Records"));
                }
                records = Some(map.next_value_seed(RecordsSeed {
                    capacity: self.capacity,
                })?);
            } else {
                map.next_value::<de::IgnoredAny>()?;
            }
        }
        records
            .map(|records| SqsBatch { records })
            .ok_or_else(|| de::Error::missing_field("Records"))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // A struct may come as an array of its fields, as serde's derive reads it.
        let records = seq
            .next_element_seed(RecordsSeed {
                capacity: self.capacity,
            })?
            .ok_or_else(|| de::Error::invalid_length(0, &"struct SqsEvent with 1 element"))?;
        if seq.next_element::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_length(
                2,
                &"struct SqsEvent with 1 element",
            ));
        }
        Ok(SqsBatch { records })
    }
}

struct RecordsSeed {
    capacity: usize,
}

impl<'de> DeserializeSeed<'de> for RecordsSeed {
    type Value = Vec<SqsRecord<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RecordsSeed {
    type Value = Vec<SqsRecord<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut records = Vec::with_capacity(self.capacity);
        while let Some(record) = seq.next_element::<SqsRecord<'de>>()? {
            records.push(record);
        }
        Ok(records)
    }
}

/// Decodes an SQS event from its JSON bytes into `aws_lambda_events`' owned `SqsEvent`.
pub fn decode_sqs_event(json: &[u8]) -> Result<SqsEvent, EventError> {
    let batch = decode_event(json)?;
    let mut event = SqsEvent::default();
    event.records = batch
        .records
        .into_iter()
        .map(SqsRecord::into_message)
        .collect();
    Ok(event)
}

fn event_error(e: sonic_rs::Error) -> EventError {
    // The parser's message goes on with an excerpt of the event around the error; the
    // event holds message bodies, which are never logged (docs/ARCHITECTURE.md §1.9).
    // Keep the first line: what is wrong, and where.
    let full = e.to_string();
    let message = full.lines().next().unwrap_or_default().trim().to_string();
    if e.is_syntax() || e.is_eof() {
        EventError::NotJson(message)
    } else {
        EventError::Shape(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A property test found it: an invalid byte inside a field the decoder skips passed,
    /// where the runtime's serde_json refuses the event.
    #[test]
    fn invalid_utf8_in_a_skipped_field_is_refused() {
        let mut bytes = br#"{"Records":[{"messageId":"m","extra":{"k":"x"}}]}"#.to_vec();
        let at = bytes.iter().position(|b| *b == b'x').unwrap();
        bytes[at] = 0xff;
        assert!(matches!(
            decode_sqs_event(&bytes),
            Err(EventError::NotJson(message)) if message.contains("UTF-8")
        ));
    }

    fn same_as_serde(json: &str) {
        let ours = decode_sqs_event(json.as_bytes());
        let reference = serde_json::from_str::<SqsEvent>(json);
        match (&ours, &reference) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "decoded differently: {json}"),
            (Err(_), Err(_)) => {}
            _ => panic!("disagree on {json}: ours {ours:?}, serde_json {reference:?}"),
        }
    }

    #[test]
    fn a_full_record_decodes_as_serde_json_does() {
        same_as_serde(include_str!("../tests/fixtures/sqs_event.json"));
        same_as_serde(
            r#"{"Records":[{"messageId":"m1","receiptHandle":"r","body":"{\"id\":\"a\\u00e9\\n\"}",
            "attributes":{"ApproximateReceiveCount":"2","SentTimestamp":"1","MessageGroupId":"g"},
            "messageAttributes":{"tenant":{"stringValue":"t1","dataType":"String",
            "stringListValues":[],"binaryListValues":[]},
            "blob":{"binaryValue":"aGVsbG8=","dataType":"Binary"}},
            "md5OfBody":"x","md5OfMessageAttributes":"y","eventSource":"aws:sqs",
            "eventSourceARN":"arn:aws:sqs:us-east-1:1:q.fifo","awsRegion":"us-east-1","extra":[1,{"a":null}]}]}"#,
        );
    }

    #[test]
    fn nulls_and_missing_fields_decode_as_serde_json_does() {
        same_as_serde(r#"{"Records":[]}"#);
        same_as_serde(r#"{"Records":[{}]}"#);
        same_as_serde(r#"[[{"messageId":"m"}]]"#);
        same_as_serde(r#"{"other":{"a":[1,{"b":null}]},"Records":[{"messageId":"m"}],"more":"x"}"#);
        same_as_serde(
            r#"{"Records":[{"messageId":null,"body":null,"attributes":null,"messageAttributes":null}]}"#,
        );
        same_as_serde(r#"{"Records":[{"body":"😀 \ud83d\ude00 \" \\ \/ \b\f\n\r\t"}]}"#);
    }

    #[test]
    fn broken_events_are_errors_for_both() {
        for json in [
            "",
            "not json",
            "[]",
            "{}",
            r#"{"Records":{}}"#,
            r#"{"Records":[1]}"#,
            r#"{"Records":[{"body":1}]}"#,
            r#"{"Records":[{"messageId":["a"]}]}"#,
            r#"{"Records":[{"attributes":{"a":1}}]}"#,
            r#"{"Records":[{"attributes":[]}]}"#,
            r#"{"Records":[{"messageAttributes":{"a":1}}]}"#,
            r#"{"Records":[{"body":"\ud800"}]}"#,
            r#"{"Records":[] "#,
            r#"{"Records":[],"Records":[]}"#,
            r#"[[],1]"#,
            r#"[]"#,
            r#"{"Records":[]} x"#,
        ] {
            same_as_serde(json);
        }
    }

    #[test]
    fn strings_without_escapes_are_borrowed_from_the_body() {
        let json = br#"{"Records":[{"messageId":"m-1","body":"{\"id\":1}","attributes":{"ApproximateReceiveCount":"2","MessageGroupId":"g\u00e9"},"eventSourceARN":"arn:aws:sqs:us-east-1:1:q"}]}"#;
        let batch = decode_event(json).unwrap();
        let record = &batch.records[0];
        assert!(record.message_id.as_ref().unwrap().is_borrowed());
        assert!(record.event_source_arn.as_ref().unwrap().is_borrowed());
        // Escapes are undone into a copy.
        let body = record.body.as_ref().unwrap();
        assert!(!body.is_borrowed());
        assert_eq!(body.as_str(), r#"{"id":1}"#);
        assert_eq!(record.attribute("ApproximateReceiveCount"), Some("2"));
        assert_eq!(record.attribute("MessageGroupId"), Some("gé"));
        assert_eq!(record.attribute("SentTimestamp"), None);
    }

    #[test]
    fn attributes_keep_one_value_per_name() {
        let mut attributes: Attributes = [("a", "1"), ("b", "2")].into_iter().collect();
        attributes.insert("a", "3");
        attributes.insert("", "");
        assert_eq!(attributes.get("a"), Some("3"));
        assert_eq!(attributes.get("b"), Some("2"));
        assert_eq!(attributes.get(""), Some(""));
        assert_eq!(attributes.len(), 3);
        assert_eq!(
            attributes.iter().collect::<Vec<_>>(),
            [("a", "3"), ("b", "2"), ("", "")]
        );
        assert_eq!(
            serde_json::to_value(&attributes).unwrap(),
            serde_json::json!({"a": "3", "b": "2", "": ""})
        );
        let duplicated =
            decode_event(br#"{"Records":[{"attributes":{"x":"1","x":"2"}}]}"#).unwrap();
        assert_eq!(
            duplicated.records[0].attributes.get("x"),
            Some("2"),
            "the last wins, as in a map"
        );
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let err = decode_sqs_event(br#"{"Records":[{},{"body":7}]}"#).unwrap_err();
        assert!(matches!(err, EventError::Shape(_)), "{err:?}");
        assert!(err.to_string().contains("invalid type"), "{err}");
        let err = decode_sqs_event(br#"{"records":[]}"#).unwrap_err();
        assert!(err.to_string().contains("missing field `Records`"), "{err}");
        assert!(matches!(
            decode_sqs_event(b"{"),
            Err(EventError::NotJson(_))
        ));
        assert!(matches!(
            decode_sqs_event(b"not json"),
            Err(EventError::NotJson(_))
        ));
        let invalid_utf8 = b"{\"Records\":[{\"body\":\"\xff\xfe\"}]}";
        assert!(serde_json::from_slice::<SqsEvent>(invalid_utf8).is_err());
        assert!(
            decode_sqs_event(invalid_utf8).is_err(),
            "invalid UTF-8 is refused"
        );
    }
}
