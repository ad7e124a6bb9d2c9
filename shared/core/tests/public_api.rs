//! The crate's public API as a user outside it sees it: every type a public signature
//! mentions can be named from the crate root (or from the namespace that holds it), so that
//! code of one's own can spell it in a signature, a field or a trait bound. Inside the
//! crate its private modules hide nothing, so only a test from outside can tell.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test fails loudly

use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use sqs_keeper_core::testing::{MemoryMessage, MemorySink, MemoryStore};
use sqs_keeper_core::{
    batch::RecordReport, condition, condition::attr, condition::Condition,
    dead_letter::InvocationInfo, event, handler_fn, retry::Deadline, BatchConfig, BatchProcessor,
    BatchReport, HandlerFn, ItemFn, Outcome, ProcessError, WorkItem,
};

/// A batch's per-record reports, as a caller of the engine reads them.
fn records_of(report: &BatchReport) -> &[RecordReport] {
    &report.records
}

/// A record's SQS system attributes, as a handler (or its test) reads them.
fn attributes_of(item: &WorkItem) -> &event::Attributes {
    &item.attributes
}

/// A processor made of a function, kept in a field of one's own.
struct Kept<F> {
    processor: HandlerFn<F>,
}

fn keep<F>(f: F) -> Kept<F>
where
    F: for<'a> ItemFn<'a>,
{
    Kept {
        processor: handler_fn(f),
    }
}

async fn done(_item: &WorkItem) -> Result<Outcome, ProcessError> {
    Ok(Outcome::Done)
}

/// A condition built by hand (an in-memory store of one's own evaluates them), and the
/// expression a DynamoDB-like store of one's own sends.
fn lease_lapsed_before(now: i64) -> (Condition, Option<condition::Expression>) {
    let condition = Condition::Compare(
        attr::LEASE_EXPIRES_AT,
        condition::Compare::Lt,
        condition::Value::N(now),
    );
    let expression = condition.render();
    (condition, expression)
}

/// The in-memory DLQ's messages, as a test of one's own inspects them.
fn dlq_of(store: &MemoryStore) -> Vec<MemoryMessage> {
    store.dlq_messages()
}

#[cfg(feature = "operator")]
mod operator {
    use sqs_keeper_core::analysis::SignatureGroup;
    use sqs_keeper_core::{analysis, dead_letter::DeadLetteredItem};

    fn groups_of(analysis: &analysis::Analysis) -> &[SignatureGroup] {
        &analysis.groups
    }

    fn summary(records: &[DeadLetteredItem]) -> (analysis::Analysis, analysis::Stats) {
        (
            analysis::analyze(records, 3),
            analysis::stats(records, (0, 0), chrono::Utc::now()),
        )
    }

    #[test]
    fn the_operators_analysis_and_stats_can_be_named() {
        let (analysis, stats) = summary(&[]);
        assert!(groups_of(&analysis).is_empty());
        assert_eq!(stats.records, 0);
    }
}

#[tokio::test]
async fn every_type_of_a_public_signature_can_be_named_from_the_root() {
    let kept = keep(done);
    let engine = BatchProcessor::new(kept.processor, MemorySink::new(), BatchConfig::default());
    let event: SqsEvent = serde_json::from_value(serde_json::json!({"Records": [{
        "messageId": "m-1",
        "body": "{\"id\":\"a\"}",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
        "attributes": {"ApproximateReceiveCount": "1"}
    }]}))
    .unwrap();
    let report = engine
        .process_batch(
            event,
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(records_of(&report).len(), 1);
    assert_eq!(records_of(&report)[0].message_id, "m-1");

    let mut item = WorkItem::new("m-1", "{}");
    item.attributes = event::Attributes::from_iter([("ApproximateReceiveCount", "2")]);
    assert_eq!(
        attributes_of(&item).get("ApproximateReceiveCount"),
        Some("2")
    );

    let (condition, expression) = lease_lapsed_before(100);
    assert!(matches!(
        condition,
        Condition::Compare(_, condition::Compare::Lt, condition::Value::N(100))
    ));
    assert!(expression.unwrap().text.contains('<'));

    let store = MemoryStore::new();
    store.send_dlq_message("{}", &[("item_id", "a")], None);
    assert_eq!(dlq_of(&store).len(), 1);
}
