//! Decoding the SQS event the worker receives, fast.
//!
//! The Lambda runtime hands the worker the invocation body as raw JSON
//! ([`serde_json::value::RawValue`]: the runtime only checks that it is JSON). This module
//! turns it into the same [`SqsEvent`] that `serde_json` would produce, through the same
//! serde derive, but driven by `sonic-rs`' SIMD parser: about half the CPU per record of
//! `serde_json` on a 5 MB event (see `docs/BENCHMARKS.md`). The tests check the result
//! against `serde_json` field for field, on valid and broken events (and the property
//! tests on generated ones).
//!
//! The worker decodes into a [`BorrowedEvent`]: its records' strings borrow from the
//! invocation body wherever the JSON text is the string itself (no escape to undo), so a
//! 5 MB event is not copied string by string into a second 5 MB, and each record becomes
//! an owned `SqsMessage` only when the engine starts it. [`decode_sqs_event`] is the same
//! decode made owned, so the tests that hold it to `serde_json` hold the borrowed decoder
//! too.
//!
//! [`Text`] and the attribute pairs are deserialized by hand because serde borrows a
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
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

/// Why an invocation body is not an SQS event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// Not a JSON document.
    #[error("the event is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not shaped like an SQS event.
    #[error("the event is not an SQS event: {0}")]
    Shape(String),
}

/// A JSON string, borrowed from the input when it has no escapes, copied when it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text<'a>(pub Cow<'a, str>);

impl Text<'_> {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, owned.
    pub fn into_owned(self) -> String {
        self.0.into_owned()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for TextVisitor<'a> {
            type Value = Text<'a>;
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
        deserializer.deserialize_str(TextVisitor(std::marker::PhantomData))
    }
}

/// A JSON object of strings as pairs (null: none), borrowed like [`Text`].
fn string_pairs<'de: 'a, 'a, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<(Text<'a>, Text<'a>)>, D::Error> {
    struct Pairs<'a>(std::marker::PhantomData<&'a ()>);
    impl<'de: 'a, 'a> Visitor<'de> for Pairs<'a> {
        type Value = Vec<(Text<'a>, Text<'a>)>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of strings")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(8));
            while let Some(pair) = map.next_entry::<Text<'a>, Text<'a>>()? {
                pairs.push(pair);
            }
            Ok(pairs)
        }
    }
    deserializer.deserialize_option(Pairs(std::marker::PhantomData))
}

/// `messageAttributes` as `aws_lambda_events` reads it: null is none.
fn nullish_attributes<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<HashMap<String, SqsMessageAttribute>, D::Error> {
    Ok(
        Option::<HashMap<String, SqsMessageAttribute>>::deserialize(deserializer)?
            .unwrap_or_default(),
    )
}

/// One SQS record whose strings borrow from the invocation body.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BorrowedRecord<'a> {
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
    /// `attributes` (system attributes), in the order sent.
    #[serde(default, borrow, deserialize_with = "string_pairs")]
    pub attributes: Vec<(Text<'a>, Text<'a>)>,
    /// `messageAttributes`: owned (rarely present, and typed).
    #[serde(default, deserialize_with = "nullish_attributes")]
    pub message_attributes: HashMap<String, SqsMessageAttribute>,
    /// `eventSourceARN`.
    #[serde(default, borrow, rename = "eventSourceARN")]
    pub event_source_arn: Option<Text<'a>>,
    /// `eventSource`.
    #[serde(default, borrow)]
    pub event_source: Option<Text<'a>>,
    /// `awsRegion`.
    #[serde(default, borrow)]
    pub aws_region: Option<Text<'a>>,
}

impl BorrowedRecord<'_> {
    /// A system attribute's value.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        // The last of duplicates, as in the map `into_message` makes.
        self.attributes
            .iter()
            .rev()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, v)| v.as_str())
    }

    /// The record as `aws_lambda_events` has it (a later duplicate attribute wins, as in
    /// a map).
    pub fn into_message(self) -> SqsMessage {
        let mut message = SqsMessage::default();
        message.message_id = self.message_id.map(Text::into_owned);
        message.receipt_handle = self.receipt_handle.map(Text::into_owned);
        message.body = self.body.map(Text::into_owned);
        message.md5_of_body = self.md5_of_body.map(Text::into_owned);
        message.md5_of_message_attributes = self.md5_of_message_attributes.map(Text::into_owned);
        message.attributes = self
            .attributes
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        message.message_attributes = self.message_attributes;
        message.event_source_arn = self.event_source_arn.map(Text::into_owned);
        message.event_source = self.event_source.map(Text::into_owned);
        message.aws_region = self.aws_region.map(Text::into_owned);
        message
    }
}

/// An SQS event whose records borrow from the invocation body.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct BorrowedEvent<'a> {
    /// `Records`.
    #[serde(rename = "Records", borrow)]
    pub records: Vec<BorrowedRecord<'a>>,
}

/// Decodes an SQS event from its JSON bytes (UTF-8, as JSON is), borrowing its strings.
pub fn decode_borrowed(json: &[u8]) -> Result<BorrowedEvent<'_>, EventError> {
    sonic_rs::from_slice(json).map_err(event_error)
}

/// Decodes an SQS event from its JSON bytes (which must be UTF-8, as JSON is), owned.
pub fn decode_sqs_event(json: &[u8]) -> Result<SqsEvent, EventError> {
    let borrowed = decode_borrowed(json)?;
    let mut event = SqsEvent::default();
    event.records = borrowed
        .records
        .into_iter()
        .map(BorrowedRecord::into_message)
        .collect();
    Ok(event)
}

fn event_error(e: sonic_rs::Error) -> EventError {
    {
        // The parser's message goes on with an excerpt of the event around the error; the
        // event holds message bodies, which are never logged (docs/ARCHITECTURE.md §1.9). Keep the first
        // line: what is wrong, and where.
        let full = e.to_string();
        let message = full.lines().next().unwrap_or_default().trim().to_string();
        if e.is_syntax() || e.is_eof() {
            EventError::NotJson(message)
        } else {
            EventError::Shape(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            same_as_serde(json);
        }
    }

    #[test]
    fn strings_without_escapes_are_borrowed_from_the_body() {
        let json = br#"{"Records":[{"messageId":"m-1","body":"{\"id\":1}","attributes":{"ApproximateReceiveCount":"2","MessageGroupId":"g\u00e9"},"eventSourceARN":"arn:aws:sqs:us-east-1:1:q"}]}"#;
        let event = decode_borrowed(json).unwrap();
        let record = &event.records[0];
        let borrowed = |t: &Option<Text<'_>>| matches!(t, Some(Text(Cow::Borrowed(_))));
        assert!(borrowed(&record.message_id));
        assert!(borrowed(&record.event_source_arn));
        // Escapes are undone into a copy.
        assert!(!borrowed(&record.body));
        assert_eq!(record.body.as_ref().unwrap().as_str(), r#"{"id":1}"#);
        assert_eq!(record.attribute("ApproximateReceiveCount"), Some("2"));
        assert_eq!(record.attribute("MessageGroupId"), Some("gé"));
        assert!(matches!(record.attributes[0].1, Text(Cow::Borrowed("2"))));
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
