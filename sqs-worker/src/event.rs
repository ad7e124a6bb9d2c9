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
//! What is an error here fails the whole invocation, as a `serde_json` decode would have:
//! not JSON, no `Records` array, a field of the wrong JSON type. Per-record problems that
//! the engine can report individually (a missing message id, a body that is not what the
//! processor expects) are not decided here.

use aws_lambda_events::sqs::SqsEvent;

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

/// Decodes an SQS event from its JSON bytes (which must be UTF-8, as JSON is).
pub fn decode_sqs_event(json: &[u8]) -> Result<SqsEvent, EventError> {
    sonic_rs::from_slice(json).map_err(|e: sonic_rs::Error| {
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
    })
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
