//! Helpers shared by the bad-input suites (`bad_input.rs`, `bad_input_store.rs`): Lambda
//! records and events, a batch configuration with fast retries, the invariants every case
//! checks ([`assert_accounted`]), and a processor that records what it was given.

use std::sync::Mutex;
use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use serde_json::json;
use sqs_keeper_core::testing::MemorySink;
use sqs_keeper_core::BatchReport;
use sqs_keeper_core::{batch::Disposition, BatchConfig, BatchProcessor};
use sqs_keeper_core::{dead_letter::InvocationInfo, DeadLetterReason};
use sqs_keeper_core::{item::ItemParser, WorkItem};
use sqs_keeper_core::{retry::Deadline, retry::Jitter, retry::RetryPolicy};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_core::{Outcome, Processor};

/// The source queue of every record.
pub const ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders";

/// A record as Lambda delivers it, with message id `id` and the given body.
pub fn record(id: &str, body: &str) -> serde_json::Value {
    json!({
        "messageId": id,
        "receiptHandle": "rh",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000"},
        "messageAttributes": {},
        "md5OfBody": "x",
        "eventSource": "aws:sqs",
        "eventSourceARN": ARN,
        "awsRegion": "us-east-1"
    })
}

pub fn event(records: Vec<serde_json::Value>) -> SqsEvent {
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

pub fn config(parser: ItemParser) -> BatchConfig {
    BatchConfig {
        parser,
        retry: RetryPolicy {
            max_attempts: 2,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            retry_unknown: false,
            jitter: Jitter::None,
            class_attempts: Default::default(),
            ..RetryPolicy::default()
        },
        concurrency: 4,
        max_receive_count: None,
        receive_budget_margin: 0,
        skip_group_on_error: false,
    }
}

pub fn json_parser() -> ItemParser {
    ItemParser::default()
}

pub fn far_deadline() -> Deadline {
    Deadline::after(Duration::from_secs(600), Duration::from_secs(1))
}

/// The invariants every test checks: the report holds each record of `ids` once, in order;
/// the batch response lists exactly the reported ones; the dead-lettered ones (and only
/// they) were accepted by the sink.
pub fn assert_accounted(ids: &[&str], report: &BatchReport, sink: &MemorySink) {
    let in_report: Vec<&str> = report
        .records
        .iter()
        .map(|r| r.message_id.as_str())
        .collect();
    assert_eq!(in_report, ids, "every record exactly once, in event order");
    let failures: Vec<String> = report
        .response()
        .batch_item_failures
        .into_iter()
        .map(|f| f.item_identifier)
        .collect();
    let reported: Vec<String> = report
        .records
        .iter()
        .filter(|r| r.disposition.is_reported())
        .map(|r| r.message_id.clone())
        .collect();
    assert_eq!(
        failures, reported,
        "the response lists the reported records"
    );
    for id in &failures {
        assert!(!id.is_empty() && ids.contains(&id.as_str()), "{id:?}");
    }
    let mut accepted: Vec<String> = sink
        .accepted
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.item.message_id.clone())
        .collect();
    let mut dead: Vec<String> = report
        .records
        .iter()
        .filter(|r| matches!(r.disposition, Disposition::DeadLettered { .. }))
        .map(|r| r.message_id.clone())
        .collect();
    accepted.sort();
    dead.sort();
    assert_eq!(accepted, dead, "dead-lettered records reached the sink");
    let counts = report.counts();
    assert_eq!(
        counts.done
            + counts.skipped
            + counts.retry_later
            + counts.dead_lettered
            + counts.dead_letter_failed
            + counts.not_started,
        ids.len(),
        "the counts add up"
    );
}

pub async fn run<P: Processor>(
    engine: &BatchProcessor<P, MemorySink>,
    records: Vec<serde_json::Value>,
) -> BatchReport {
    engine
        .process_batch(event(records), far_deadline(), &InvocationInfo::default())
        .await
        .unwrap()
}

pub fn disposition<'a>(report: &'a BatchReport, message_id: &str) -> &'a Disposition {
    &report
        .records
        .iter()
        .find(|r| r.message_id == message_id)
        .unwrap()
        .disposition
}

pub fn validation_dead_letter() -> Disposition {
    Disposition::DeadLettered {
        class: ErrorClass::Validation,
        reason: DeadLetterReason::Permanent,
    }
}

/// A processor that keeps a copy of every item it is given and succeeds.
#[derive(Debug, Default)]
pub struct Recording {
    items: Mutex<Vec<WorkItem>>,
}

impl Recording {
    pub fn items(&self) -> Vec<WorkItem> {
        self.items.lock().unwrap().clone()
    }
}

impl Processor for Recording {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        self.items.lock().unwrap().push(item.clone());
        Ok(Outcome::Done)
    }
}
