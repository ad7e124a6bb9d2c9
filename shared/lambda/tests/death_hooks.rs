//! The death hooks (`Processor::on_dead_letter`) in their context: a hook's metric reaches
//! the invocation's EMF line, a hook that hangs takes no time from the batch's dead-letter
//! writes (hooks run once they are written), and a hide that hangs takes none from the
//! hooks (they run beside the hides).

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use serde_json::json;
use sqs_keeper_core::dead_letter::InvocationInfo;
use sqs_keeper_core::testing::MemorySink;
use sqs_keeper_core::{batch::Disposition, BatchConfig, BatchProcessor};
use sqs_keeper_core::{context, context::MetricSink, context::Unit};
use sqs_keeper_core::{item::ItemIdSource, item::ItemParser};
use sqs_keeper_core::{retry::Deadline, retry::Jitter, retry::RetryPolicy};
use sqs_keeper_lambda::{DeadLettered, Outcome, ProcessError, Processor, WorkItem};

const FIFO_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders.fifo";
const STANDARD_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders";

fn record(arn: &str, id: &str, group: &str, receive_count: u32) -> serde_json::Value {
    json!({
        "messageId": format!("m-{id}"),
        "receiptHandle": "rh",
        "body": json!({"id": id}).to_string(),
        "attributes": {
            "ApproximateReceiveCount": receive_count.to_string(),
            "SentTimestamp": "1700000000000",
            "MessageGroupId": group,
        },
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": "us-east-1"
    })
}

fn event(records: Vec<serde_json::Value>) -> SqsEvent {
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

fn config() -> BatchConfig {
    BatchConfig {
        parser: ItemParser {
            id_source: ItemIdSource::JsonPointer("/id".into()),
            ..ItemParser::default()
        },
        retry: RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            retry_unknown: false,
            jitter: Jitter::None,
            class_attempts: Default::default(),
            ..RetryPolicy::default()
        },
        concurrency: 4,
        max_receive_count: Some(5),
        receive_budget_margin: 0,
        skip_group_on_error: false,
    }
}

/// Items whose id starts with `bad` fail validation; the others are done. The hook hangs
/// for `hang*` items, and adds a custom metric and a log field otherwise.
struct Hooked;

impl Processor for Hooked {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        if item.item_id.starts_with("bad") {
            Err(ProcessError::validation("not valid"))
        } else {
            Ok(Outcome::Done)
        }
    }

    async fn on_dead_letter(&self, dead: &DeadLettered<'_>) -> Result<(), ProcessError> {
        if dead.item.item_id.contains("hang") {
            std::future::pending::<()>().await;
        }
        context::add_metric("OrdersDeadLettered", Unit::Count, 1.0);
        Ok(())
    }
}

/// docs/HANDLERS.md, "Death hooks": the hook is "for a metric", and `context::add_metric` adds to the
/// worker's EMF line: a hook's metric reaches the invocation's metric sink.
#[tokio::test(start_paused = true)]
async fn a_death_hooks_metric_reaches_the_invocations_metrics() {
    let engine = BatchProcessor::new(Hooked, MemorySink::new(), config());
    let sink = Arc::new(MetricSink::default());
    let report = context::with_invocation_metrics(
        sink.clone(),
        engine.process_batch(
            event(vec![record(STANDARD_ARN, "bad-1", "g", 1)]),
            Deadline::after(Duration::from_secs(30), Duration::from_secs(2)),
            &InvocationInfo::default(),
        ),
    )
    .await
    .unwrap();
    assert!(matches!(
        report.records[0].disposition,
        Disposition::DeadLettered { .. }
    ));
    let metrics = sink.take();
    assert!(
        metrics.iter().any(|m| m.name == "OrdersDeadLettered"),
        "the hook's metric was dropped: {metrics:?}"
    );
}

/// §1.6: a FIFO record on its last receive is dead-lettered or run, never left to the
/// queue's redrive policy without a record. A FIFO batch once ran a record's death hook
/// inline, bounded by the hard stop: a hook that hung ate the margin, and the next record's
/// dead-letter write was cut at once. Hooks now run after the batch's writes.
#[tokio::test(start_paused = true)]
async fn a_hanging_fifo_hook_does_not_cost_the_next_records_dead_letter_write() {
    let engine = BatchProcessor::new(
        Hooked,
        MemorySink::slow(Duration::from_millis(10)),
        config(),
    );
    let deadline = Deadline::after(Duration::from_secs(30), Duration::from_secs(2));
    let hard_stop = deadline.hard_stop();
    let report = engine
        .process_batch(
            event(vec![
                record(FIFO_ARN, "bad-hang", "g1", 1),
                // on its last receive (max_receive_count 5), another group
                record(FIFO_ARN, "next", "g2", 5),
            ]),
            deadline,
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert!(tokio::time::Instant::now() <= hard_stop);
    assert!(matches!(
        report.records[0].disposition,
        Disposition::DeadLettered { .. }
    ));
    assert!(
        matches!(
            report.records[1].disposition,
            Disposition::DeadLettered { .. } | Disposition::Done
        ),
        "the record on its last receive is left to the redrive policy because the previous record's hook hung: {:?}",
        report.records[1]
    );
}

/// Items named `slow*` fail with a transient error (returned, and hidden for spacing);
/// the others fail validation (dead-lettered). The hook notes each item it finished.
#[derive(Default)]
struct Noting {
    finished: std::sync::Mutex<Vec<String>>,
}

impl Processor for Noting {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        if item.item_id.starts_with("slow") {
            Err(ProcessError::new(
                sqs_keeper_core::ErrorClass::ServerError,
                "503",
            ))
        } else {
            Err(ProcessError::validation("not valid"))
        }
    }

    async fn on_dead_letter(&self, dead: &DeadLettered<'_>) -> Result<(), ProcessError> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.finished
            .lock()
            .unwrap()
            .push(dead.item.item_id.clone());
        Ok(())
    }
}

/// `ChangeMessageVisibilityBatch` that never answers (a hide cut at the hard stop).
struct HangingHide;

impl sqs_keeper_core::redelivery::VisibilityPort for HangingHide {
    fn hide<'a>(
        &'a self,
        _records: &'a [sqs_keeper_core::redelivery::Hide],
    ) -> futures::future::BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(std::future::pending())
    }

    fn queue_timing<'a>(
        &'a self,
        _queue_arn: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<sqs_keeper_core::redelivery::QueueTiming>> {
        Box::pin(async { None })
    }
}

/// docs/HANDLERS.md, "Death hooks": at least once per dead-lettering. A hide that ran to the hard stop
/// cut every hook at its first await, and nothing called them again; they now run beside
/// the hides, each with the time to the hard stop.
#[tokio::test(start_paused = true)]
async fn a_hide_that_hangs_leaves_the_death_hooks_their_time() {
    let hooked = Arc::new(Noting::default());
    struct Shared(Arc<Noting>);
    impl Processor for Shared {
        async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
            self.0.process(item).await
        }
        async fn on_dead_letter(&self, dead: &DeadLettered<'_>) -> Result<(), ProcessError> {
            self.0.on_dead_letter(dead).await
        }
    }
    let engine = BatchProcessor::new(Shared(hooked.clone()), MemorySink::new(), config())
        .with_redelivery(
            sqs_keeper_core::redelivery::RedeliveryPolicy {
                base: Duration::from_secs(60),
                multiplier: 2,
                max: Duration::from_secs(600),
            },
            Arc::new(HangingHide),
        );
    let report = engine
        .process_batch(
            event(vec![
                record(STANDARD_ARN, "slow-1", "g", 1),
                record(STANDARD_ARN, "bad-1", "g", 1),
            ]),
            Deadline::after(Duration::from_secs(30), Duration::from_secs(2)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert!(matches!(
        report.records[1].disposition,
        Disposition::DeadLettered { .. }
    ));
    assert_eq!(*hooked.finished.lock().unwrap(), ["bad-1"]);
}
