//! The bad-input suite, the cases that need no AWS: every kind of malformed input the
//! worker, the configuration and the redrive request can receive ends in a clear error or a
//! dead-letter with a validation-style class, and nothing is lost: every record of a batch
//! appears in the report exactly once, the reported ones (and only they) are in the batch
//! response, and every dead-lettered record reached the sink with its full body.
//!
//! Everything here runs in memory, with no emulator. The cases that need S3, SQS or
//! DynamoDB (an Extended Client pointer to a missing object, redrives of unknown ids, dead-
//! letter records at their limits) are in `bad_input_store.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use lambda_runtime::{Context, LambdaEvent};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use sqs_keeper_core::{batch::BatchError, batch::Disposition, BatchProcessor};
use sqs_keeper_core::{dead_letter::InvocationInfo, DeadLetterReason};
use sqs_keeper_core::{event::decode_sqs_event, event::EventError};
use sqs_keeper_core::{item::BodyFormat, item::ItemIdSource, item::ItemParser, WorkItem};
use sqs_keeper_core::{redrive::RedriveError, redrive::RedriveRequest};
use sqs_keeper_core::{testing::MemorySink, testing::ScriptedProcessor, testing::Step};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_core::{Outcome, Processor};
use sqs_keeper_lambda::config::WorkerConfig;
use sqs_keeper_lambda::worker::InvocationError;
use sqs_keeper_lambda::worker::Worker;

use crate::common::{
    assert_accounted, config, disposition, far_deadline, json_parser, record, run,
    validation_dead_letter, Recording,
};

const FIFO_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders.fifo";

/// The decoder under test, on text (it takes the invocation's bytes).
fn decode(text: &str) -> Result<SqsEvent, sqs_keeper_core::event::EventError> {
    decode_sqs_event(text.as_bytes())
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// The body a processor expects.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // read only by serde
struct Order {
    id: String,
    qty: u32,
}

/// A processor that decodes its body as an [`Order`] and classifies a decode failure the
/// generic way, with [`ProcessError::from_error`].
#[derive(Debug, Default)]
struct OrderProcessor {
    calls: AtomicU32,
}

impl Processor for OrderProcessor {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let _order: Order = serde_json::from_str(&item.body)
            .map_err(|e| ProcessError::from_error(&e).with_step("decode"))?;
        Ok(Outcome::Done)
    }
}

fn context(request_id: &str) -> Context {
    let mut context = Context::default();
    context.request_id = request_id.to_string();
    context.deadline = u64::try_from(
        (std::time::SystemTime::now() + Duration::from_secs(300))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    context
}

/// Hands `text` to `Worker::handle` as the runtime would: as raw JSON. `None` when the
/// runtime itself would reject it (not JSON at all).
async fn handle(
    worker: &Worker<ScriptedProcessor, MemorySink>,
    text: &str,
) -> Option<Result<aws_lambda_events::sqs::SqsBatchResponse, InvocationError>> {
    let raw: Box<RawValue> = serde_json::from_str(text).ok()?;
    Some(worker.handle(LambdaEvent::new(raw, context("req-1"))).await)
}

fn worker() -> Worker<ScriptedProcessor, MemorySink> {
    let engine = BatchProcessor::new(
        ScriptedProcessor::new(),
        MemorySink::new(),
        config(json_parser()),
    );
    Worker::new(engine, Duration::from_millis(100)).without_metrics()
}

fn total_calls(worker: &Worker<ScriptedProcessor, MemorySink>, ids: &[&str]) -> usize {
    ids.iter()
        .map(|id| worker.engine().processor().calls(id))
        .sum()
}

// ---------------------------------------------------------------------------------------
// The event itself
// ---------------------------------------------------------------------------------------

#[test]
fn event_that_is_not_json_is_a_clear_event_error() {
    for text in [
        "",
        "   ",
        "not json",
        "{",
        r#"{"Records":[]"#,
        r#"{"Records":[]} trailing"#,
        "\u{0}",
        r#"{'Records':[]}"#,
        r#"{"Records":[{"body":"a	tab"}]}"#, // a raw control character in a string
    ] {
        let err = decode(text).unwrap_err();
        assert!(matches!(err, EventError::NotJson(_)), "{text:?}: {err:?}");
        let message = err.to_string();
        assert!(
            message.starts_with("the event is not JSON: "),
            "{text:?}: {message}"
        );
        assert!(message.len() > "the event is not JSON: ".len(), "{message}");
        assert!(serde_json::from_str::<SqsEvent>(text).is_err(), "{text:?}");
    }
}

#[tokio::test]
async fn json_that_is_not_an_sqs_event_fails_the_invocation_with_a_readable_message() {
    let worker = worker();
    // The decoder's messages come from the JSON library; they must say what is wrong, not
    // only that something is.
    let cases = [
        "[]",
        r#""Records""#,
        "42",
        "null",
        "{}",
        r#"{"records":[]}"#,
        r#"{"Records":{}}"#,
        r#"{"Records":null}"#,
        r#"{"Records":[1]}"#,
        r#"{"Records":[{"messageId":"m1","body":"{}"},{"messageId":"m2","body":7}]}"#,
        r#"{"Records":[{"messageId":["m1"]}]}"#,
        r#"{"Records":[{"messageId":"m1","attributes":{"ApproximateReceiveCount":2}}]}"#,
        r#"{"Records":[{"messageId":"m1","attributes":[]}]}"#,
        r#"{"Records":[{"messageId":"m1","messageAttributes":{"a":1}}]}"#,
        r#"{"Records":[{"messageId":"m1","messageAttributes":{"a":{"dataType":"Binary","binaryValue":"not base64!"}}}]}"#,
    ];
    for text in cases {
        let result = handle(&worker, text).await.expect("valid JSON");
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                InvocationError::NotAnSqsEvent(EventError::Shape { .. })
            ),
            "{text}: {err:?}"
        );
        let message = err.to_string();
        assert!(
            message.starts_with("the event is not an SQS event: "),
            "{message}"
        );
        let detail = &message["the event is not an SQS event: ".len()..];
        assert!(
            detail.contains("expected") || detail.contains("missing") || detail.contains("Invalid"),
            "{text}: {message}"
        );
        let diagnostic = lambda_runtime::Diagnostic::from(err);
        assert_eq!(diagnostic.error_type, "NotAnSqsEvent");
        assert_eq!(diagnostic.error_message, message);
        // serde_json would have refused it too.
        assert!(serde_json::from_str::<SqsEvent>(text).is_err(), "{text}");
    }
    assert_eq!(total_calls(&worker, &["m1", "m2"]), 0, "nothing processed");
    assert!(worker.engine().sink().accepted_ids().is_empty());
}

#[tokio::test]
async fn record_without_message_id_fails_the_invocation_naming_its_index() {
    let worker = worker();
    for (index, nameless) in [
        (1, json!({"body": "{}"})),
        (1, json!({"messageId": null, "body": "{}"})),
        (1, json!({"messageId": "", "body": "{}"})),
    ] {
        let text = json!({"Records": [record("m0", "{}"), nameless, record("m2", "{}")]});
        let result = handle(&worker, &text.to_string()).await.unwrap();
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                InvocationError::Batch(BatchError::MissingMessageId { index: i }) if i == index
            ),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(&format!("record {index} ")), "{message}");
        assert!(message.contains("no messageId"), "{message}");
        assert_eq!(
            lambda_runtime::Diagnostic::from(err).error_type,
            "MissingMessageId"
        );
    }
    // The first nameless record is the one named, and nothing ran before the check.
    let text =
        json!({"Records": [record("m0", "{}"), record("m1", "{}"), {"body": "a"}, {"body": "b"}]});
    let err = handle(&worker, &text.to_string())
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            err,
            InvocationError::Batch(BatchError::MissingMessageId { index: 2 })
        ),
        "{err:?}"
    );
    assert_eq!(total_calls(&worker, &["m0", "m1", "m2"]), 0);
    assert!(worker.engine().sink().accepted_ids().is_empty());
}

#[tokio::test]
async fn lone_surrogate_in_the_event_is_an_event_error_not_a_panic() {
    let worker = worker();
    // Each is valid JSON text for the runtime (serde_json's RawValue does not check escapes)
    // but cannot be decoded into Rust strings.
    for text in [
        r#"{"Records":[{"messageId":"m1","body":"{}","attributes":{"ApproximateReceiveCount":"1","X":"\ud800"}}]}"#,
        r#"{"Records":[{"messageId":"m1","body":"{}","attributes":{"\udfff":"1"}}]}"#,
        r#"{"Records":[{"messageId":"m1","body":"{}","messageAttributes":{"t":{"dataType":"String","stringValue":"a\ud800b"}}}]}"#,
        r#"{"Records":[{"messageId":"\ud800","body":"{}"}]}"#,
        r#"{"Records":[{"messageId":"m1","body":"\ud83d"}]}"#,
    ] {
        assert!(
            serde_json::from_str::<SqsEvent>(text).is_err(),
            "serde_json refuses {text}"
        );
        let result = handle(&worker, text).await.expect("the runtime accepts it");
        let err = result.unwrap_err();
        assert!(
            matches!(err, InvocationError::NotAnSqsEvent(_)),
            "{text}: {err:?}"
        );
        assert!(!err.to_string().is_empty());
    }
    // A surrogate *pair* is fine and decodes to the character.
    let text = r#"{"Records":[{"messageId":"m1","body":"{}","attributes":{"X":"\ud83d\ude00"}}]}"#;
    let ev = decode(text).unwrap();
    assert_eq!(ev.records[0].attributes["X"], "😀");
    let response = handle(&worker, text).await.unwrap().unwrap();
    assert!(response.batch_item_failures.is_empty());
}

// ---------------------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn body_that_is_not_json_is_a_validation_dead_letter() {
    let bodies = [
        "not json",
        "",
        "{",
        "{\"id\": ",
        "{\"a\":1} trailing",
        "[1,]",
        "NaN",
        "{'id': 1}",
        "\u{0}",
        "\"unterminated",
        "😀",
    ];
    let engine = BatchProcessor::new(
        ScriptedProcessor::new(),
        MemorySink::new(),
        config(json_parser()),
    );
    let mut records: Vec<serde_json::Value> = bodies
        .iter()
        .enumerate()
        .map(|(n, b)| record(&format!("m{n}"), b))
        .collect();
    // A record with no body at all is an empty body.
    let mut no_body = record("m-nobody", "");
    no_body.as_object_mut().unwrap().remove("body");
    records.push(no_body);
    records.push(record("m-good", r#"{"id":"x"}"#));
    let ids: Vec<String> = records
        .iter()
        .map(|r| r["messageId"].as_str().unwrap().to_string())
        .collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let report = run(&engine, records).await;
    assert_accounted(&id_refs, &report, engine.sink());
    for (n, body) in bodies.iter().enumerate() {
        let id = format!("m{n}");
        assert_eq!(
            disposition(&report, &id),
            &validation_dead_letter(),
            "{body:?}"
        );
        assert_eq!(
            engine.processor().calls(&id),
            0,
            "never processed: {body:?}"
        );
    }
    assert_eq!(disposition(&report, "m-nobody"), &validation_dead_letter());
    assert_eq!(disposition(&report, "m-good"), &Disposition::Done);
    // Each candidate carries its body as received, a validation error from the parse step,
    // and is keyed by its message id.
    let accepted = engine.sink().accepted.lock().unwrap().clone();
    for candidate in &accepted {
        let n: Option<usize> = candidate
            .item
            .message_id
            .strip_prefix('m')
            .and_then(|s| s.parse().ok());
        if let Some(n) = n {
            assert_eq!(candidate.item.body, bodies[n]);
        }
        assert_eq!(candidate.error.class, ErrorClass::Validation);
        assert_eq!(candidate.error.step.as_deref(), Some("parse"));
        assert!(
            candidate
                .error
                .message
                .starts_with("body is not valid JSON"),
            "{}",
            candidate.error.message
        );
        assert_eq!(candidate.item.item_id, candidate.item.message_id);
        assert_eq!(candidate.failures.len(), 1);
    }
    // With the text format the same bodies are all processed.
    let engine = BatchProcessor::new(
        ScriptedProcessor::new(),
        MemorySink::new(),
        config(ItemParser {
            id_source: ItemIdSource::MessageId,
            body_format: BodyFormat::Text,
            envelope: Default::default(),
        }),
    );
    let records: Vec<serde_json::Value> = bodies
        .iter()
        .enumerate()
        .map(|(n, b)| record(&format!("m{n}"), b))
        .collect();
    let report = run(&engine, records).await;
    assert!(report
        .records
        .iter()
        .all(|r| r.disposition == Disposition::Done));
}

/// A body whose JSON holds a lone surrogate escape (`"\ud800"`) is syntactically JSON;
/// whether it is accepted depends on the id source: the `message-id` check only validates
/// syntax and lets it through to the processor, a `pointer:` id source builds a tree and
/// refuses it as validation. Either way the record ends once and is accounted for.
#[tokio::test(start_paused = true)]
async fn body_with_a_lone_surrogate_escape_is_accounted_for_with_every_id_source() {
    let body = r#"{"id":"a\ud800"}"#;
    for (source, expected) in [
        (ItemIdSource::MessageId, Disposition::Done),
        (
            ItemIdSource::JsonPointer("/id".into()),
            validation_dead_letter(),
        ),
        (
            ItemIdSource::MessageAttribute("x".into()),
            Disposition::Done,
        ),
    ] {
        let engine = BatchProcessor::new(
            ScriptedProcessor::new(),
            MemorySink::new(),
            config(ItemParser {
                id_source: source.clone(),
                body_format: BodyFormat::Json,
                envelope: Default::default(),
            }),
        );
        let report = run(&engine, vec![record("m1", body)]).await;
        assert_accounted(&["m1"], &report, engine.sink());
        assert_eq!(report.records[0].disposition, expected, "{source:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn body_of_the_wrong_shape_is_a_validation_dead_letter() {
    let engine = BatchProcessor::new(
        OrderProcessor::default(),
        MemorySink::new(),
        config(json_parser()),
    );
    let cases = [
        ("m-ok", r#"{"id":"a","qty":1}"#, None),
        (
            "m-type",
            r#"{"id":1,"qty":1}"#,
            Some(ErrorClass::Validation),
        ),
        ("m-missing", r#"{"qty":1}"#, Some(ErrorClass::Validation)),
        (
            "m-negative",
            r#"{"id":"a","qty":-1}"#,
            Some(ErrorClass::Validation),
        ),
        (
            "m-overflow",
            r#"{"id":"a","qty":99999999999}"#,
            Some(ErrorClass::Validation),
        ),
        (
            "m-array",
            r#"[{"id":"a","qty":1}]"#,
            Some(ErrorClass::Validation),
        ),
        ("m-string", r#""an order""#, Some(ErrorClass::Validation)),
        ("m-null", "null", Some(ErrorClass::Validation)),
    ];
    let ids: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let report = run(
        &engine,
        cases.iter().map(|(id, body, _)| record(id, body)).collect(),
    )
    .await;
    assert_accounted(&ids, &report, engine.sink());
    for (id, body, class) in cases {
        let expected = match class {
            None => Disposition::Done,
            Some(class) => Disposition::DeadLettered {
                class,
                reason: DeadLetterReason::Permanent,
            },
        };
        assert_eq!(disposition(&report, id), &expected, "{body}");
    }
    // Permanent on first sight: one call per record, no retries.
    assert_eq!(
        engine.processor().calls.load(Ordering::SeqCst) as usize,
        cases.len()
    );
    for candidate in engine.sink().accepted.lock().unwrap().iter() {
        assert_eq!(candidate.error.step.as_deref(), Some("decode"));
        assert_eq!(candidate.failures.len(), 1);
    }
}

/// A body that is JSON but has an extra field (a processor decoding with
/// `deny_unknown_fields`) or a repeated field is a schema mismatch: docs/ARCHITECTURE.md §2 says
/// validation. `ProcessError::from_error` does not recognise `serde_json::Error` by type and
/// its message fallback knows neither "unknown field" nor "duplicate field", so the record
/// is dead-lettered as `unknown` (and marked reprocess-eligible) instead.
#[tokio::test(start_paused = true)]
async fn schema_mismatch_through_from_error_is_validation() {
    let engine = BatchProcessor::new(
        OrderProcessor::default(),
        MemorySink::new(),
        config(json_parser()),
    );
    let cases = [
        ("m-extra", r#"{"id":"a","qty":1,"colour":"red"}"#),
        ("m-dup", r#"{"id":"a","qty":1,"id":"b"}"#),
    ];
    let ids: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let report = run(
        &engine,
        cases.iter().map(|(id, body)| record(id, body)).collect(),
    )
    .await;
    assert_accounted(&ids, &report, engine.sink());
    let wrong: Vec<(&str, &Disposition)> = cases
        .iter()
        .map(|(id, body)| (*body, disposition(&report, id)))
        .filter(|(_, d)| **d != validation_dead_letter())
        .collect();
    assert!(wrong.is_empty(), "not validation: {wrong:?}");
}

#[tokio::test(start_paused = true)]
async fn body_over_one_mib_is_processed_or_dead_lettered_whole() {
    let pad = "x".repeat(1024 * 1024 + 17);
    let big_json = json!({"id": "big", "pad": pad}).to_string();
    let big_text = format!("{{not json {pad}");
    // Non-ASCII too: 2 MiB of 4-byte characters.
    let big_emoji = json!({"id": "emoji", "pad": "😀".repeat(512 * 1024)}).to_string();
    assert!(big_json.len() > 1024 * 1024);
    assert!(big_emoji.len() > 2 * 1024 * 1024);

    // Through the event decoder first: the body survives byte for byte.
    let records = vec![
        record("m-big", &big_json),
        record("m-bad", &big_text),
        record("m-fail", &big_emoji),
    ];
    let text = json!({ "Records": records.clone() }).to_string();
    let decoded = decode(&text).unwrap();
    assert_eq!(decoded, serde_json::from_str::<SqsEvent>(&text).unwrap());
    assert_eq!(decoded.records[0].body.as_deref(), Some(big_json.as_str()));

    let processor =
        ScriptedProcessor::new().script("m-fail", vec![Step::Fail(ErrorClass::Validation)]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config(json_parser()));
    let report = engine
        .process_batch(decoded, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    assert_accounted(&["m-big", "m-bad", "m-fail"], &report, engine.sink());
    assert_eq!(disposition(&report, "m-big"), &Disposition::Done);
    assert_eq!(disposition(&report, "m-bad"), &validation_dead_letter());
    assert_eq!(disposition(&report, "m-fail"), &validation_dead_letter());
    let accepted = engine.sink().accepted.lock().unwrap().clone();
    let body_of = |id: &str| {
        accepted
            .iter()
            .find(|c| c.item.message_id == id)
            .unwrap()
            .item
            .body
            .clone()
    };
    assert_eq!(body_of("m-bad"), big_text, "the full body, not a prefix");
    assert_eq!(body_of("m-fail"), big_emoji);
}

// ---------------------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn odd_system_attribute_values_do_not_fail_the_record() {
    let odd = [
        ("not a number", "garbage", 1, None),
        ("", "", 1, None),
        ("-1", "-1", 1, Some(-1)),
        ("1.5", "1.5e12", 1, None),
        ("4294967296", "99999999999999999999", 1, None), // beyond u32 / i64
        ("0", "0", 0, Some(0)),
        (" 2", " 1700000000000", 1, None),
        ("３", "１７", 1, None), // full-width digits
        ("7", "1700000000123", 7, Some(1_700_000_000_123)),
    ];
    let engine = BatchProcessor::new(
        Recording::default(),
        MemorySink::new(),
        config(json_parser()),
    );
    let records: Vec<serde_json::Value> = odd
        .iter()
        .enumerate()
        .map(|(n, (count, sent, _, _))| {
            let mut r = record(&format!("m{n}"), "{}");
            r["attributes"] = json!({
                "ApproximateReceiveCount": count,
                "SentTimestamp": sent,
                "ApproximateFirstReceiveTimestamp": "🙂",
                "SomethingNew": "x"
            });
            r
        })
        .collect();
    let ids: Vec<String> = (0..odd.len()).map(|n| format!("m{n}")).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let report = run(&engine, records).await;
    assert_accounted(&id_refs, &report, engine.sink());
    assert!(report
        .records
        .iter()
        .all(|r| r.disposition == Disposition::Done));
    let items = engine.processor().items();
    for (n, (count, sent, receive_count, millis)) in odd.iter().enumerate() {
        let item = items
            .iter()
            .find(|i| i.message_id == format!("m{n}"))
            .unwrap();
        assert_eq!(item.receive_count, *receive_count, "{count:?}");
        assert_eq!(
            item.sent_timestamp.map(|t| t.timestamp_millis()),
            *millis,
            "{sent:?}"
        );
        // The raw attributes are kept as received.
        assert_eq!(item.attributes.get("ApproximateReceiveCount"), Some(*count));
        assert_eq!(item.attributes.get("SomethingNew"), Some("x"));
    }
}

#[tokio::test(start_paused = true)]
async fn non_ascii_attribute_values_round_trip() {
    let values = [
        "😀",
        "日本語のテナント",
        "مرحبا",
        "e\u{301}",       // combining accent
        "tab\tnew\nline", // control characters (escaped in the JSON)
        "nul\u{0}byte",   // NUL
        "quote\" back\\slash",
        "\u{feff}bom",
        "\u{10ffff}",
    ];
    let records: Vec<serde_json::Value> = values
        .iter()
        .enumerate()
        .map(|(n, v)| {
            let mut r = record(&format!("m{n}"), "plain text body ✓");
            r["eventSourceARN"] = json!(FIFO_ARN);
            r["attributes"]["MessageGroupId"] = json!(v);
            r["attributes"]["Custom"] = json!(v);
            r["messageAttributes"] = json!({
                "tenant": {"dataType": "String", "stringValue": v},
                "n": {"dataType": "Number.emoji😀", "stringValue": "1"}
            });
            r
        })
        .collect();
    let text = json!({ "Records": records }).to_string();
    let ours = decode(&text).unwrap();
    assert_eq!(ours, serde_json::from_str::<SqsEvent>(&text).unwrap());
    // Round trip: what we decode serializes back to an event that decodes the same.
    let again = decode(&serde_json::to_string(&ours).unwrap()).unwrap();
    assert_eq!(again, ours);

    let engine = BatchProcessor::new(
        Recording::default(),
        MemorySink::new(),
        config(ItemParser {
            id_source: ItemIdSource::MessageAttribute("tenant".into()),
            body_format: BodyFormat::Text,
            envelope: Default::default(),
        }),
    );
    let ids: Vec<String> = (0..values.len()).map(|n| format!("m{n}")).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let report = engine
        .process_batch(ours, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    assert_accounted(&id_refs, &report, engine.sink());
    let items = engine.processor().items();
    assert_eq!(items.len(), values.len());
    for (n, v) in values.iter().enumerate() {
        let item = &items[n];
        assert_eq!(item.message_id, format!("m{n}"), "FIFO keeps order");
        // From the attribute: unchanged, or its digest when SQS could not carry it in the
        // DLQ message's attribute (a NUL).
        let expected = sqs_keeper_core::item::bounded_item_id(v.to_string());
        assert_eq!(item.item_id, expected, "item id from the attribute");
        assert_eq!(item.message_group_id.as_deref(), Some(*v));
        assert_eq!(item.attributes.get("Custom"), Some(*v));
        assert_eq!(item.body, "plain text body ✓");
        assert_eq!(report.records[n].item_id, expected);
    }
}

#[tokio::test(start_paused = true)]
async fn binary_message_attributes_are_accepted() {
    let mut r = record("m-bin", r#"{"id":"b"}"#);
    r["messageAttributes"] = json!({
        "blob": {"dataType": "Binary", "binaryValue": "AAEC/w=="},
        "list": {"dataType": "Binary", "binaryListValues": ["aGVsbG8=", ""], "stringListValues": []},
        "empty": {"dataType": "Binary", "binaryValue": ""},
        "typed": {"dataType": "Binary.png", "binaryValue": "iVBORw0KGgo="}
    });
    let text = json!({ "Records": [r] }).to_string();
    let ours = decode(&text).unwrap();
    assert_eq!(ours, serde_json::from_str::<SqsEvent>(&text).unwrap());
    let blob = &ours.records[0].message_attributes["blob"];
    assert_eq!(blob.binary_value.as_ref().unwrap().0, vec![0, 1, 2, 255]);
    assert_eq!(blob.string_value, None);

    // An item id taken from a binary attribute has no string: the message id is used.
    let engine = BatchProcessor::new(
        Recording::default(),
        MemorySink::new(),
        config(ItemParser {
            id_source: ItemIdSource::MessageAttribute("blob".into()),
            body_format: BodyFormat::Json,
            envelope: Default::default(),
        }),
    );
    let report = engine
        .process_batch(ours, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    assert_accounted(&["m-bin"], &report, engine.sink());
    assert_eq!(report.records[0].disposition, Disposition::Done);
    assert_eq!(report.records[0].item_id, "m-bin");
    assert_eq!(
        engine.processor().items()[0].message_attributes["blob"]
            .binary_value
            .as_ref()
            .unwrap()
            .0,
        vec![0, 1, 2, 255]
    );

    // A binary value that is not base64 cannot come from SQS; it is an event error for both
    // decoders.
    let mut r = record("m-bad", "{}");
    r["messageAttributes"] = json!({"blob": {"dataType": "Binary", "binaryValue": "not base64!"}});
    let text = json!({ "Records": [r] }).to_string();
    let err = decode(&text).unwrap_err();
    assert!(matches!(err, EventError::Shape { .. }), "{err:?}");
    assert!(err.to_string().contains("Invalid symbol"), "{err}");
    assert!(serde_json::from_str::<SqsEvent>(&text).is_err());
}

// ---------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------

fn read_config(
    vars: &[(&str, &str)],
) -> Result<WorkerConfig, sqs_keeper_lambda::config::ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    WorkerConfig::from_lookup(&move |k| map.get(k).cloned())
}

#[test]
fn every_bad_configuration_variable_is_named_in_one_error() {
    let bad = [
        ("WORKER_DOWNSTREAM_TIMEOUT_MS", "soon"),
        ("WORKER_ITEM_ID_SOURCE", "attribute:"),
        ("WORKER_BODY_FORMAT", "xml"),
        ("WORKER_MAX_CONCURRENCY", "-1"),
        ("WORKER_MAX_RECEIVE_COUNT", "0"),
        ("WORKER_RECEIVE_BUDGET_MARGIN", "1000"),
        ("WORKER_RETRY_MAX_ATTEMPTS", "21"),
        ("WORKER_RETRY_BASE_DELAY_MS", "1.5"),
        ("WORKER_RETRY_MAX_DELAY_MS", "300001"),
        ("WORKER_RETRY_UNKNOWN_ERRORS", "TRUE"),
        ("WORKER_DEADLINE_MARGIN_MS", "１０"), // full-width digits
        ("WORKER_SKIP_GROUP_ON_ERROR", "1"),
        ("DLQ_TABLE", "t"),
        ("DLQ_INLINE_MAX_BYTES", "10"),
        ("DLQ_RETENTION_DAYS", "forever"),
    ];
    // The URL is missing; DLQ_TABLE without its two companions names both.
    let err = read_config(&bad).unwrap_err();
    let named: HashSet<&str> = err.problems.iter().map(|p| p.variable.as_str()).collect();
    let mut expected: HashSet<&str> = bad.iter().map(|(k, _)| *k).collect();
    expected.remove("DLQ_TABLE");
    expected.extend(["WORKER_DOWNSTREAM_URL", "DLQ_QUEUE_URL", "DLQ_BUCKET"]);
    assert_eq!(named, expected, "{err}");
    assert_eq!(err.problems.len(), expected.len(), "each named once: {err}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "invalid configuration ({} problem(s))",
            expected.len()
        )),
        "{text}"
    );
    for problem in &err.problems {
        assert!(text.contains(&problem.variable), "{text}");
        assert!(
            problem.problem.contains("expected") || problem.problem.contains("go together"),
            "says what is expected: {problem:?}"
        );
    }
    // Bad URLs.
    for url in [
        "ftp://example.com",
        "not a url",
        "http://",
        "http://exa mple.com",
        "//x",
    ] {
        let err = read_config(&[("WORKER_DOWNSTREAM_URL", url)]).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{url}: {err}");
        assert_eq!(err.problems[0].variable, "WORKER_DOWNSTREAM_URL");
    }
    // Blank counts as unset: defaults, no problem.
    let ok = read_config(&[
        ("WORKER_DOWNSTREAM_URL", " http://127.0.0.1:1/x "),
        ("WORKER_MAX_CONCURRENCY", "   "),
    ])
    .unwrap();
    assert_eq!(ok.handler.batch.concurrency, 10);
}

// ---------------------------------------------------------------------------------------
// Redrive requests
// ---------------------------------------------------------------------------------------

#[test]
fn redrive_request_with_unknown_fields_or_wrong_types_is_refused_clearly() {
    let cases = [
        (r#"{"item_id":["a"]}"#, "unknown field `item_id`"),
        (r#"{"dryrun":true}"#, "unknown field `dryrun`"),
        (r#"{"mode":"replay"}"#, "unknown variant `replay`"),
        (r#"{"error_class":"flaky"}"#, "unknown variant `flaky`"),
        (r#"{"status":"DEAD"}"#, "unknown variant `DEAD`"),
        (r#"{"max_items":-1}"#, "invalid value"),
        (r#"{"since":5}"#, "invalid type"),
        (r#"{"item_ids":"a"}"#, "invalid type"),
        (r#"{"force":"yes"}"#, "invalid type"),
        ("null", "expected a JSON object"),
        ("\"all\"", "expected a JSON object"),
        ("not json", "expected"),
        ("", "EOF"),
    ];
    for (text, needle) in cases {
        let err = RedriveRequest::from_json(text).unwrap_err();
        assert!(matches!(err, RedriveError::InvalidRequest(_)), "{text}");
        let message = err.to_string();
        assert!(
            message.starts_with("invalid redrive request: "),
            "{message}"
        );
        assert!(message.contains(needle), "{text}: {message}");
    }
    // Defaults for everything, and `null` means unset.
    assert_eq!(
        RedriveRequest::from_json("{}").unwrap(),
        RedriveRequest::default()
    );
    assert_eq!(
        RedriveRequest::from_json(r#"{"since":null,"max_items":null}"#).unwrap(),
        RedriveRequest::default()
    );
}

/// `RedriveRequest` derives `Deserialize` with `#[serde(default)]`, so serde also accepts a
/// JSON *array* as the struct's fields in order: `[]` is the default request (redrive every
/// eligible dead item) and `[["x"]]` selects item `x`. A redrive function invoked with a
/// payload that is not an object should refuse it, as it refuses unknown fields.
#[test]
fn redrive_request_that_is_not_an_object_is_refused() {
    for text in [
        "[]",
        r#"[["x"]]"#,
        r#"[[], null, null, null, null, null, true]"#,
    ] {
        let parsed = RedriveRequest::from_json(text);
        assert!(parsed.is_err(), "{text} was accepted as {parsed:?}");
    }
}

#[test]
fn messages_without_ids_are_the_only_event_level_record_failure() {
    // A record of an SQS event with every field null or absent decodes; only the engine
    // refuses it, because it cannot report it.
    for text in [
        r#"{"Records":[{}]}"#,
        r#"{"Records":[{"messageId":null,"body":null,"attributes":null,"messageAttributes":null,"eventSourceARN":null}]}"#,
    ] {
        let ours = decode(text).unwrap();
        assert_eq!(ours, serde_json::from_str::<SqsEvent>(text).unwrap());
        assert_eq!(ours.records[0], SqsMessage::default());
    }
}

/// docs/ARCHITECTURE.md §1.9: bodies are never logged. An event-level error is logged and posted to the
/// Runtime API (so it reaches CloudWatch); the decoder's message quotes the event text
/// around the error position (8 bytes either side), which can be a piece of a body.
#[tokio::test]
async fn event_error_messages_do_not_quote_bodies() {
    let worker = worker();
    for text in [
        // A raw control character inside the body: not JSON.
        "{\"Records\":[{\"messageId\":\"m1\",\"body\":\"card 4111111111111111\u{1} exp 12/29\"}]}",
        // A body that is not a string: not an SQS event.
        r#"{"Records":[{"messageId":"m1","body":[4111111111111111]}]}"#,
    ] {
        let err = match serde_json::from_str::<Box<RawValue>>(text) {
            Ok(_) => handle(&worker, text)
                .await
                .unwrap()
                .unwrap_err()
                .to_string(),
            Err(_) => decode(text).unwrap_err().to_string(),
        };
        assert!(
            !err.contains("1111") && !err.contains("12/29"),
            "the error quotes the body: {err:?}"
        );
    }
}
