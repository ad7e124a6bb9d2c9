//! Spaced redelivery in the batch engine, without I/O: which records are hidden, for how
//! long, and that a visibility change that fails loses nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use futures::future::BoxFuture;
use serde_json::json;
use sqs_worker::batch::{BatchConfig, BatchProcessor};
use sqs_worker::dead_letter::InvocationInfo;
use sqs_worker::error::{ErrorClass, ProcessError};
use sqs_worker::redelivery::{Hide, RedeliveryPolicy, VisibilityPort};
use sqs_worker::testing::{MemorySink, ScriptedProcessor, Step};
use sqs_worker::Deadline;

/// Records what it was asked to hide; fails every entry when `fail` is set.
#[derive(Default)]
struct Port {
    seen: Mutex<Vec<Hide>>,
    fail: bool,
}

impl VisibilityPort for Port {
    fn hide<'a>(&'a self, records: &'a [Hide]) -> BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(async move {
            self.seen.lock().unwrap().extend_from_slice(records);
            records
                .iter()
                .map(|_| {
                    if self.fail {
                        Err(ProcessError::new(ErrorClass::Permission, "AccessDenied"))
                    } else {
                        Ok(())
                    }
                })
                .collect()
        })
    }
}

fn event(records: &[(&str, u32)]) -> SqsEvent {
    serde_json::from_value(
        json!({"Records": records.iter().map(|(id, receives)| json!({
        "messageId": format!("m-{id}"),
        "receiptHandle": format!("rh-{id}"),
        "body": json!({"id": id}).to_string(),
        "attributes": {"ApproximateReceiveCount": receives.to_string()},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
    })).collect::<Vec<_>>()}),
    )
    .unwrap()
}

fn engine(port: Arc<Port>) -> BatchProcessor<ScriptedProcessor, MemorySink> {
    let processor = ScriptedProcessor::new()
        .script("a", vec![Step::Fail(ErrorClass::Throttled)])
        .script("b", vec![Step::Fail(ErrorClass::ServerError)])
        .script("bad", vec![Step::Fail(ErrorClass::Validation)]);
    let mut config = BatchConfig::default();
    config.parser.id_source = "pointer:/id".parse().unwrap();
    config.retry.max_attempts = 1;
    config.max_receive_count = Some(5);
    BatchProcessor::new(processor, MemorySink::new(), config).with_redelivery(
        RedeliveryPolicy {
            base: Duration::from_secs(60),
            multiplier: 3,
            max: Duration::from_secs(3600),
        },
        port,
    )
}

#[tokio::test]
async fn records_returned_for_retry_are_hidden_by_their_receive_count() {
    let port = Arc::new(Port::default());
    let report = engine(port.clone())
        .process_batch(
            event(&[("a", 1), ("b", 3), ("ok", 1), ("bad", 1)]),
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let failures: Vec<String> = report
        .response()
        .batch_item_failures
        .into_iter()
        .map(|f| f.item_identifier)
        .collect();
    assert_eq!(failures, ["m-a", "m-b"]);
    let seen = port.seen.lock().unwrap().clone();
    // Only what goes back to the queue: not the done one, not the dead-lettered one.
    assert_eq!(
        seen.iter()
            .map(|h| h.receipt_handle.as_str())
            .collect::<Vec<_>>(),
        ["rh-a", "rh-b"]
    );
    assert!(seen.iter().all(|h| h.queue_arn.ends_with(":orders")));
    // First receive: 30-60 s; third: 270-540 s (60 × 3²).
    assert!(
        (30..=60).contains(&seen[0].delay.as_secs()),
        "{:?}",
        seen[0].delay
    );
    assert!(
        (270..=540).contains(&seen[1].delay.as_secs()),
        "{:?}",
        seen[1].delay
    );
}

#[tokio::test]
async fn a_visibility_change_that_fails_still_reports_the_record() {
    let port = Arc::new(Port {
        fail: true,
        ..Port::default()
    });
    let report = engine(port.clone())
        .process_batch(
            event(&[("a", 1)]),
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(report.response().batch_item_failures.len(), 1);
    assert_eq!(port.seen.lock().unwrap().len(), 1);
}
