//! Decoding the SQS event the worker receives, fast.
//!
//! The Lambda runtime hands the worker the invocation body as raw JSON
//! ([`serde_json::value::RawValue`]: the runtime only checks that it is JSON). This module
//! turns it into the same [`SqsEvent`] that `serde_json` would produce, by parsing it with
//! `sonic-rs`' SIMD document parser and reading the fields off the document: about 4× less
//! CPU per record than deriving `SqsEvent` through serde on a 5 MB event (see
//! `docs/BENCHMARKS.md`). The result is checked against `serde_json` by the tests, field
//! for field, on valid and broken events.
//!
//! What is an error here fails the whole invocation, as a `serde_json` decode would have:
//! not JSON, no `Records` array, a field of the wrong JSON type. Per-record problems that
//! the engine can report individually (a missing message id, a body that is not what the
//! processor expects) are not decided here.

use std::collections::HashMap;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage, SqsMessageAttribute};
use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

/// Why an invocation body is not an SQS event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// Not a JSON document.
    #[error("the event is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not shaped like an SQS event.
    #[error("the event is not an SQS event: {path}: {problem}")]
    Shape {
        /// Where, e.g. `Records[3].body`.
        path: String,
        /// What is wrong there.
        problem: String,
    },
}

fn shape(path: impl Into<String>, problem: impl Into<String>) -> EventError {
    EventError::Shape {
        path: path.into(),
        problem: problem.into(),
    }
}

/// Decodes an SQS event from its JSON text.
pub fn decode_sqs_event(json: &str) -> Result<SqsEvent, EventError> {
    let document: Value =
        sonic_rs::from_str(json).map_err(|e| EventError::NotJson(e.to_string()))?;
    let Some(root) = document.as_object() else {
        return Err(shape("$", "expected an object"));
    };
    let records = match root.get(&"Records") {
        Some(records) => records,
        None => return Err(shape("$", "missing field `Records`")),
    };
    let Some(records) = records.as_array() else {
        return Err(shape("Records", "expected an array"));
    };
    let mut event = SqsEvent::default();
    event.records.reserve_exact(records.len());
    for (index, record) in records.iter().enumerate() {
        event.records.push(decode_record(index, record)?);
    }
    Ok(event)
}

fn decode_record(index: usize, record: &Value) -> Result<SqsMessage, EventError> {
    let Some(fields) = record.as_object() else {
        return Err(shape(format!("Records[{index}]"), "expected an object"));
    };
    let mut message = SqsMessage::default();
    for (key, value) in fields.iter() {
        let slot = match key {
            "messageId" => &mut message.message_id,
            "receiptHandle" => &mut message.receipt_handle,
            "body" => &mut message.body,
            "md5OfBody" => &mut message.md5_of_body,
            "md5OfMessageAttributes" => &mut message.md5_of_message_attributes,
            "eventSourceARN" => &mut message.event_source_arn,
            "eventSource" => &mut message.event_source,
            "awsRegion" => &mut message.aws_region,
            "attributes" => {
                message.attributes = string_map(index, key, value)?;
                continue;
            }
            "messageAttributes" => {
                message.message_attributes = message_attributes(index, value)?;
                continue;
            }
            // Unknown fields are ignored, as serde does for `SqsMessage`.
            _ => continue,
        };
        *slot = optional_string(index, key, value)?;
    }
    Ok(message)
}

fn optional_string(index: usize, key: &str, value: &Value) -> Result<Option<String>, EventError> {
    if value.is_null() {
        return Ok(None);
    }
    match value.as_str() {
        Some(s) => Ok(Some(s.to_owned())),
        None => Err(shape(
            format!("Records[{index}].{key}"),
            "expected a string",
        )),
    }
}

/// `attributes`: an object of strings; `null` is empty, as `aws_lambda_events` reads it.
fn string_map(
    index: usize,
    key: &str,
    value: &Value,
) -> Result<HashMap<String, String>, EventError> {
    if value.is_null() {
        return Ok(HashMap::new());
    }
    let Some(object) = value.as_object() else {
        return Err(shape(
            format!("Records[{index}].{key}"),
            "expected an object",
        ));
    };
    let mut map = HashMap::with_capacity(object.len());
    for (name, v) in object.iter() {
        let Some(s) = v.as_str() else {
            return Err(shape(
                format!("Records[{index}].{key}.{name}"),
                "expected a string",
            ));
        };
        map.insert(name.to_owned(), s.to_owned());
    }
    Ok(map)
}

/// `messageAttributes`: rare and small, so read through serde (binary values are base64).
fn message_attributes(
    index: usize,
    value: &Value,
) -> Result<HashMap<String, SqsMessageAttribute>, EventError> {
    if value.is_null() || value.as_object().is_some_and(|o| o.is_empty()) {
        return Ok(HashMap::new());
    }
    sonic_rs::from_value(value)
        .map_err(|e| shape(format!("Records[{index}].messageAttributes"), e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same_as_serde(json: &str) {
        let ours = decode_sqs_event(json);
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
    fn errors_name_the_place() {
        let err = decode_sqs_event(r#"{"Records":[{},{"body":7}]}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the event is not an SQS event: Records[1].body: expected a string"
        );
        assert!(matches!(decode_sqs_event("{"), Err(EventError::NotJson(_))));
    }
}
