//! Spaced redelivery in the batch engine, without I/O: which records are hidden, for how
//! long, and that a visibility change that fails loses nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use futures::future::BoxFuture;
use serde_json::json;
use sqs_keeper_core::dead_letter::InvocationInfo;
use sqs_keeper_core::retry::Deadline;
use sqs_keeper_core::{
    redelivery::Hide, redelivery::QueueTiming, redelivery::RedeliveryPolicy,
    redelivery::VisibilityPort,
};
use sqs_keeper_core::{testing::MemorySink, testing::ScriptedProcessor, testing::Step};
use sqs_keeper_core::{BatchConfig, BatchProcessor};
use sqs_keeper_core::{ErrorClass, ProcessError};

/// Records what it was asked to hide; fails every entry when `fail` is set; answers the
/// queue's retention and visibility timeout with `timing`.
#[derive(Default)]
struct Port {
    seen: Mutex<Vec<Hide>>,
    fail: bool,
    /// Receipt handles whose hide fails (one entry of the batch call).
    fail_receipts: Vec<&'static str>,
    timing: Option<QueueTiming>,
    timing_reads: std::sync::atomic::AtomicU32,
}

impl VisibilityPort for Port {
    fn hide<'a>(&'a self, records: &'a [Hide]) -> BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(async move {
            self.seen.lock().unwrap().extend_from_slice(records);
            records
                .iter()
                .map(|h| {
                    if self.fail || self.fail_receipts.contains(&h.receipt_handle.as_str()) {
                        Err(ProcessError::new(ErrorClass::Permission, "AccessDenied"))
                    } else {
                        Ok(())
                    }
                })
                .collect()
        })
    }

    fn queue_timing<'a>(&'a self, _queue_arn: &'a str) -> BoxFuture<'a, Option<QueueTiming>> {
        self.timing_reads
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move { self.timing })
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

/// An engine over `processor` (ids from `/id`, `max_attempts` per invocation, five
/// receives) spacing redeliveries 60 s × 3ⁿ up to an hour through `port`.
fn spaced<P: sqs_keeper_core::Processor>(
    processor: P,
    max_attempts: u32,
    port: Arc<Port>,
) -> BatchProcessor<P, MemorySink> {
    let mut config = BatchConfig::default();
    config.parser.id_source = "pointer:/id".parse().unwrap();
    config.retry.max_attempts = max_attempts;
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

fn engine(port: Arc<Port>) -> BatchProcessor<ScriptedProcessor, MemorySink> {
    let processor = ScriptedProcessor::new()
        .script("a", vec![Step::Fail(ErrorClass::Throttled)])
        .script("b", vec![Step::Fail(ErrorClass::ServerError)])
        .script("bad", vec![Step::Fail(ErrorClass::Validation)]);
    spaced(processor, 1, port)
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

/// One record that fails with `error`, hidden through a fresh port; returns the hide.
async fn hide_of(processor: impl sqs_keeper_core::Processor, receives: u32) -> (Hide, Duration) {
    let port = Arc::new(Port::default());
    let engine = spaced(processor, 3, port.clone());
    let started = tokio::time::Instant::now();
    let report = engine
        .process_batch(
            event(&[("a", receives)]),
            Deadline::after(Duration::from_secs(60), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(report.response().batch_item_failures.len(), 1);
    let seen = port.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    (seen[0].clone(), took)
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_spaces_the_next_delivery_at_least_that_far() {
    let asks =
        ProcessError::new(ErrorClass::Throttled, "429").with_retry_after(Duration::from_secs(3000));
    let processor = ScriptedProcessor::new().script("a", vec![Step::Error(asks)]);
    let (hide, _) = hide_of(processor, 1).await;
    // The policy alone gives 30-60 s on a first receive; the callee asked for 3,000.
    assert!(hide.delay >= Duration::from_secs(3000), "{:?}", hide.delay);
}

#[tokio::test(start_paused = true)]
async fn records_the_open_breaker_refuses_are_returned_at_once_and_hidden_until_it_ends() {
    use sqs_keeper_core::{breaker::Breaker, breaker::BreakerPolicy, breaker::BreakerStore};
    let store = sqs_keeper_core::testing::MemoryBreakerStore::default();
    let now = std::time::SystemTime::now();
    // Open for 20 s more: shorter than the invocation, so sleeping it out would fit.
    assert!(store
        .open(now + Duration::from_secs(20), 1, now)
        .await
        .unwrap());
    let breaker = Breaker::new(
        ScriptedProcessor::new(),
        store,
        BreakerPolicy {
            threshold: 1,
            window: Duration::from_secs(60),
            open_for: Duration::from_secs(20),
            max_open: Duration::from_secs(900),
            probe_for: Duration::from_secs(60),
            refresh: Duration::from_secs(1),
        },
    );
    let (hide, took) = hide_of(breaker, 1).await;
    // Returned without waiting inside the invocation...
    assert_eq!(
        took,
        Duration::ZERO,
        "the refused record waited {took:?} in the invocation"
    );
    // ...and hidden until the open period is over (the policy alone gives 30-60 s).
    assert!(hide.delay >= Duration::from_secs(19), "{:?}", hide.delay);
}

/// A FIFO batch: (id, group, receive count).
fn fifo_event(records: &[(&str, &str, u32)]) -> SqsEvent {
    serde_json::from_value(
        json!({"Records": records.iter().map(|(id, group, receives)| json!({
        "messageId": format!("m-{id}"),
        "receiptHandle": format!("rh-{id}"),
        "body": json!({"id": id}).to_string(),
        "attributes": {"ApproximateReceiveCount": receives.to_string(), "MessageGroupId": group},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders.fifo"
    })).collect::<Vec<_>>()}),
    )
    .unwrap()
}

#[tokio::test]
async fn records_held_back_are_hidden_and_dead_lettered_with_why_on_their_last_receive() {
    let port = Arc::new(Port::default());
    let processor =
        ScriptedProcessor::new().script("r1", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = spaced(processor, 1, port.clone());
    // r1 fails on its first receive; r2 (its last receive) and r3 are held back behind it.
    let report = engine
        .process_batch(
            fifo_event(&[("r1", "g1", 1), ("r2", "g2", 5), ("r3", "g3", 2)]),
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
    // r2 is not left to the queue's redrive policy (a DLQ message without a record).
    assert_eq!(failures, ["m-r1", "m-r3"]);
    let sink = engine.sink();
    let accepted = sink.accepted.lock().unwrap();
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].item.item_id, "r2");
    assert_eq!(
        accepted[0].error.code.as_deref(),
        Some(sqs_keeper_core::batch::NOT_STARTED)
    );
    assert!(accepted[0].error.class.is_reprocess_eligible());
    // r3, given back unstarted, is hidden as r1 is (60 × 3 = 180 s ceiling on receive 2).
    let seen = port.seen.lock().unwrap().clone();
    let hidden: Vec<(&str, u64)> = seen
        .iter()
        .map(|h| (h.receipt_handle.as_str(), h.delay.as_secs()))
        .collect();
    assert_eq!(hidden.len(), 2, "{hidden:?}");
    assert_eq!(hidden[0].0, "rh-r1");
    assert_eq!(hidden[1].0, "rh-r3");
    assert!((90..=180).contains(&hidden[1].1), "{hidden:?}");
}

#[tokio::test(start_paused = true)]
async fn a_record_not_started_before_the_cutoff_on_its_last_receive_is_dead_lettered() {
    let processor =
        ScriptedProcessor::new().script("slow", vec![Step::Sleep(Duration::from_secs(5))]);
    let mut config = BatchConfig::default();
    config.parser.id_source = "pointer:/id".parse().unwrap();
    config.concurrency = 1;
    config.max_receive_count = Some(3);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config);
    // The cut-off comes while "slow" runs: "late" (receive 3 of 3) never starts.
    let report = engine
        .process_batch(
            event(&[("slow", 1), ("late", 3), ("later", 1)]),
            Deadline::after(Duration::from_secs(3), Duration::from_secs(1)),
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
    assert_eq!(failures, ["m-slow", "m-later"]);
    assert_eq!(engine.sink().accepted_ids(), ["late"]);
}

#[tokio::test(start_paused = true)]
async fn a_hide_at_the_cap_stays_within_twelve_hours_of_the_receive() {
    let port = Arc::new(Port::default());
    // Fails after ten minutes, asking for twelve hours.
    async fn slow_failure(
        _item: &sqs_keeper_lambda::WorkItem,
    ) -> Result<sqs_keeper_lambda::Outcome, ProcessError> {
        tokio::time::sleep(Duration::from_secs(600)).await;
        Err(ProcessError::new(ErrorClass::ServerError, "503")
            .with_retry_after(Duration::from_secs(43_200)))
    }
    let processor = sqs_keeper_core::handler_fn(slow_failure);
    let mut config = BatchConfig::default();
    config.parser.id_source = "pointer:/id".parse().unwrap();
    config.retry.max_attempts = 1;
    let engine = BatchProcessor::new(processor, MemorySink::new(), config).with_redelivery(
        RedeliveryPolicy {
            base: Duration::from_secs(43_200),
            multiplier: 1,
            max: Duration::from_secs(43_200),
        },
        port.clone(),
    );
    // Ten minutes into a fifteen-minute invocation, a hide at SQS's 12-hour maximum.
    engine
        .process_batch(
            event(&[("a", 1)]),
            Deadline::after(Duration::from_secs(900), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let seen = port.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    // 12 h from the receive, which came up to six minutes before the invocation, less the
    // ten minutes spent in it.
    let most = Duration::from_secs(43_200 - 360 - 600);
    assert!(seen[0].delay <= most, "{:?} > {most:?}", seen[0].delay);
    assert!(
        seen[0].delay >= most - Duration::from_secs(1),
        "{:?}",
        seen[0].delay
    );
}

/// Records `(id, receive count, sent this long ago)` of the orders queue.
fn aged_event(records: &[(&str, u32, Duration)]) -> SqsEvent {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    serde_json::from_value(
        json!({"Records": records.iter().map(|(id, receives, age)| json!({
        "messageId": format!("m-{id}"),
        "receiptHandle": format!("rh-{id}"),
        "body": json!({"id": id}).to_string(),
        "attributes": {
            "ApproximateReceiveCount": receives.to_string(),
            "SentTimestamp": (now - *age).as_millis().to_string(),
        },
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
    })).collect::<Vec<_>>()}),
    )
    .unwrap()
}

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn no_hide_outlasts_the_message_and_a_message_with_no_room_left_is_dead_lettered() {
    // Retention 4 days, visibility timeout 180 s; spacing up to 12 hours.
    let port = Arc::new(Port {
        timing: Some(QueueTiming {
            retention: 96 * HOUR,
            visibility_timeout: Duration::from_secs(180),
        }),
        ..Port::default()
    });
    let processor = ScriptedProcessor::new()
        .script("young", vec![Step::Fail(ErrorClass::ServerError)])
        .script("old", vec![Step::Fail(ErrorClass::ServerError)])
        .script("dying", vec![Step::Fail(ErrorClass::ServerError)]);
    let mut config = BatchConfig::default();
    config.parser.id_source = "pointer:/id".parse().unwrap();
    config.retry.max_attempts = 1;
    config.max_receive_count = Some(30);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config).with_redelivery(
        RedeliveryPolicy {
            base: Duration::from_secs(300),
            multiplier: 3,
            max: 12 * HOUR,
        },
        port.clone(),
    );
    // "old" has 2 hours of retention left, "dying" 100 s (less than a visibility timeout).
    let report = engine
        .process_batch(
            aged_event(&[
                ("young", 20, HOUR),
                ("old", 20, 94 * HOUR),
                ("dying", 3, 96 * HOUR - Duration::from_secs(100)),
            ]),
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
    assert_eq!(failures, ["m-young", "m-old"]);
    let accepted = engine.sink().accepted.lock().unwrap().clone();
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].item.item_id, "dying");
    assert_eq!(
        accepted[0].reason,
        sqs_keeper_core::DeadLetterReason::RetentionEnding
    );
    assert_eq!(accepted[0].error.class, ErrorClass::ServerError);
    let seen = port.seen.lock().unwrap().clone();
    let delay = |handle: &str| {
        seen.iter()
            .find(|h| h.receipt_handle == handle)
            .unwrap()
            .delay
    };
    // Receive 20 asks for the 12-hour cap (6 to 12 hours with jitter): "young" gets it,
    // "old" only its 2 hours less a visibility timeout.
    assert!(delay("rh-young") >= 6 * HOUR, "{:?}", delay("rh-young"));
    let old = delay("rh-old");
    assert!(
        old <= 2 * HOUR - Duration::from_secs(180) && old > 2 * HOUR - Duration::from_secs(200),
        "{old:?}"
    );
    // The queue is read once, not per batch.
    engine
        .process_batch(
            aged_event(&[("young", 21, HOUR)]),
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        port.timing_reads.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[tokio::test]
async fn a_held_back_record_with_no_room_left_is_dead_lettered_with_why() {
    let port = Arc::new(Port {
        timing: Some(QueueTiming {
            retention: 96 * HOUR,
            visibility_timeout: Duration::from_secs(180),
        }),
        ..Port::default()
    });
    let processor =
        ScriptedProcessor::new().script("r1", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = spaced(processor, 1, port);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let mut event = fifo_event(&[("r1", "g1", 1), ("r2", "g2", 1)]);
    event.records[1].attributes.insert(
        "SentTimestamp".into(),
        (now - 96 * HOUR + Duration::from_secs(60))
            .as_millis()
            .to_string(),
    );
    let report = engine
        .process_batch(
            event,
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(report.response().batch_item_failures.len(), 1);
    let accepted = engine.sink().accepted.lock().unwrap().clone();
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].item.item_id, "r2");
    assert_eq!(
        accepted[0].reason,
        sqs_keeper_core::DeadLetterReason::RetentionEnding
    );
    assert!(
        accepted[0].error.message.contains("retention"),
        "{}",
        accepted[0].error.message
    );
}

#[tokio::test]
async fn no_record_of_a_fifo_group_is_hidden_longer_than_the_groups_first() {
    // r1 fails on its first receive; r2 and r3 of its group, received more often (longer
    // delays), are held back behind it. Were they hidden for their own delays, or left in
    // flight for the rest of their visibility timeout, the group would stay blocked while
    // they are invisible, and r1 with it, past its own delay and possibly past its
    // retention.
    let port = Arc::new(Port::default());
    let processor =
        ScriptedProcessor::new().script("r1", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = spaced(processor, 1, port.clone());
    let report = engine
        .process_batch(
            fifo_event(&[
                ("r1", "g1", 1),
                ("r2", "g1", 3),
                ("r3", "g1", 4),
                ("s1", "g2", 3),
            ]),
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
    assert_eq!(failures, ["m-r1", "m-r2", "m-r3", "m-s1"]);
    let seen = port.seen.lock().unwrap().clone();
    let hidden: HashMap<&str, u64> = seen
        .iter()
        .map(|h| (h.receipt_handle.as_str(), h.delay.as_secs()))
        .collect();
    assert_eq!(hidden.len(), 4, "{hidden:?}");
    // r1 on its first receive: 30-60 s; r2 and r3 no longer than r1 (their own delays
    // would be 270-540 s and 810-1620 s).
    let r1 = hidden["rh-r1"];
    assert!((30..=60).contains(&r1), "{hidden:?}");
    assert!(hidden["rh-r2"] <= r1 && hidden["rh-r3"] <= r1, "{hidden:?}");
    // s1 heads its own group: its own delay (270-540 s on its third receive).
    assert!((270..=540).contains(&hidden["rh-s1"]), "{hidden:?}");
    // The groups' firsts are hidden before the records behind them.
    assert_eq!(seen[0].receipt_handle, "rh-r1");
    assert_eq!(seen[1].receipt_handle, "rh-s1");
}

#[tokio::test]
async fn a_fifo_groups_later_records_are_not_hidden_when_its_firsts_hide_fails() {
    // r1's hide fails: r1 comes back after the visibility timeout. Were r2 and r3 hidden
    // for r1's intended delay anyway, the group would be held behind them past r1's
    // return, up to r1's retention, and SQS would delete r1 unrecorded. They are left
    // to come back with r1; s1, first of its own group, is hidden as usual.
    let port = Arc::new(Port {
        fail_receipts: vec!["rh-r1"],
        ..Port::default()
    });
    let processor =
        ScriptedProcessor::new().script("r1", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = spaced(processor, 1, port.clone());
    let report = engine
        .process_batch(
            fifo_event(&[
                ("r1", "g1", 1),
                ("r2", "g1", 3),
                ("r3", "g1", 4),
                ("s1", "g2", 3),
            ]),
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(report.response().batch_item_failures.len(), 4);
    let tried: Vec<String> = port
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|h| h.receipt_handle.clone())
        .collect();
    assert_eq!(tried, ["rh-r1", "rh-s1"]);
}

/// Spaced redelivery in two calls: each test states one promise about a batch whose
/// groups span queues, lack a receipt handle, or whose first call is slow.
mod two_calls {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use aws_lambda_events::sqs::SqsEvent;
    use futures::future::BoxFuture;
    use serde_json::json;
    use sqs_keeper_core::dead_letter::InvocationInfo;
    use sqs_keeper_core::random::Random;
    use sqs_keeper_core::retry::Deadline;
    use sqs_keeper_core::{
        redelivery::Hide, redelivery::QueueTiming, redelivery::RedeliveryPolicy,
        redelivery::VisibilityPort,
    };
    use sqs_keeper_core::{testing::MemorySink, testing::ScriptedProcessor, testing::Step};
    use sqs_keeper_core::{BatchConfig, BatchProcessor};
    use sqs_keeper_core::{ErrorClass, ProcessError};

    /// One hide as the port saw it: when its call came (tokio time) and what it asked.
    #[derive(Clone, Debug)]
    struct Seen {
        call: usize,
        at: tokio::time::Instant,
        hide: Hide,
    }

    /// Records every call with its time; the first call takes `first_call_takes` (SDK
    /// retries, a slow endpoint); entries whose receipt handle is in `fail_receipts` fail.
    #[derive(Default)]
    struct Port {
        seen: Mutex<Vec<Seen>>,
        calls: Mutex<usize>,
        fail_receipts: Vec<&'static str>,
        first_call_takes: Duration,
        timing: Option<QueueTiming>,
    }

    impl VisibilityPort for Port {
        fn hide<'a>(&'a self, records: &'a [Hide]) -> BoxFuture<'a, Vec<Result<(), ProcessError>>> {
            Box::pin(async move {
                let call = {
                    let mut calls = self.calls.lock().unwrap();
                    *calls += 1;
                    *calls
                };
                // The call reaches SQS now; its answer comes back after `first_call_takes`.
                let at = tokio::time::Instant::now();
                self.seen
                    .lock()
                    .unwrap()
                    .extend(records.iter().map(|hide| Seen {
                        call,
                        at,
                        hide: hide.clone(),
                    }));
                if call == 1 {
                    tokio::time::sleep(self.first_call_takes).await;
                }
                records
                    .iter()
                    .map(|h| {
                        if self.fail_receipts.contains(&h.receipt_handle.as_str()) {
                            Err(ProcessError::new(ErrorClass::Permission, "AccessDenied"))
                        } else {
                            Ok(())
                        }
                    })
                    .collect()
            })
        }

        fn queue_timing<'a>(&'a self, _queue_arn: &'a str) -> BoxFuture<'a, Option<QueueTiming>> {
            Box::pin(async move { self.timing })
        }
    }

    const ORDERS: &str = "arn:aws:sqs:us-east-1:123456789012:orders.fifo";

    /// A FIFO record (id, queue ARN, group, receive count).
    fn record(id: &str, arn: &str, group: &str, receives: u32) -> serde_json::Value {
        json!({
            "messageId": format!("m-{id}"),
            "receiptHandle": format!("rh-{id}"),
            "body": json!({"id": id}).to_string(),
            "attributes": {"ApproximateReceiveCount": receives.to_string(), "MessageGroupId": group},
            "eventSource": "aws:sqs",
            "eventSourceARN": arn
        })
    }

    fn batch(records: Vec<serde_json::Value>) -> SqsEvent {
        serde_json::from_value(json!({ "Records": records })).unwrap()
    }

    /// The engine of tests/redelivery.rs: 60 s × 3ⁿ up to an hour, one attempt, five receives.
    fn spaced(
        processor: ScriptedProcessor,
        port: Arc<Port>,
    ) -> BatchProcessor<ScriptedProcessor, MemorySink> {
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

    fn seen_of<'a>(seen: &'a [Seen], receipt: &str) -> Option<&'a Seen> {
        seen.iter().find(|s| s.hide.receipt_handle == receipt)
    }

    /// (a) A group's later record must not become visible after the group's first does: the
    /// follower's hide is sent in the second call, after the first call returned, but with
    /// the first's full delay, so it ends as much later as the first call took.
    #[tokio::test(start_paused = true)]
    async fn a_follower_becomes_visible_no_later_than_its_groups_first() {
        let port = Arc::new(Port {
            first_call_takes: Duration::from_secs(5),
            ..Port::default()
        });
        let processor =
            ScriptedProcessor::new().script("r1", vec![Step::Fail(ErrorClass::ServerError)]);
        let engine = spaced(processor, port.clone());
        let report = engine
            .process_batch(
                batch(vec![
                    record("r1", ORDERS, "g1", 1),
                    record("r2", ORDERS, "g1", 3),
                ]),
                Deadline::after(Duration::from_secs(60), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        assert_eq!(report.response().batch_item_failures.len(), 2);
        let seen = port.seen.lock().unwrap().clone();
        let first = seen_of(&seen, "rh-r1").unwrap();
        let follower = seen_of(&seen, "rh-r2").expect("r1's hide succeeded: r2 is hidden");
        let first_visible = first.at + first.hide.delay;
        let follower_visible = follower.at + follower.hide.delay;
        assert!(
            follower_visible <= first_visible,
            "r2 (call {}) is visible {:?} after r1 (call {}): the group is held past r1's delay",
            follower.call,
            follower_visible - first_visible,
            first.call
        );
    }

    /// (d) The 12-hour cap counts from the receive: a hide sent later may ask for less. The
    /// follower's delay was capped before the first call, and sent after it.
    #[tokio::test(start_paused = true)]
    async fn a_followers_hide_stays_within_twelve_hours_of_the_receive() {
        let port = Arc::new(Port {
            first_call_takes: Duration::from_secs(60),
            ..Port::default()
        });
        // r1 asks for 12 h (Retry-After): its hide is the cap. r2's jitter is drawn near its
        // top (the engine's generator seeded so both draws are ≥ 0.999), so its own delay
        // reaches the cap too and the cap is what limits it.
        let asks = ProcessError::new(ErrorClass::ServerError, "503")
            .with_retry_after(Duration::from_secs(43_200));
        let processor = ScriptedProcessor::new().script("r1", vec![Step::Error(asks)]);
        let seed = (0..u64::MAX)
            .find(|s| {
                let random = Random::seeded(*s);
                random.f64() >= 0.999 && random.f64() >= 0.999
            })
            .unwrap();
        let mut config = BatchConfig::default().with_random(Random::seeded(seed));
        config.parser.id_source = "pointer:/id".parse().unwrap();
        config.retry.max_attempts = 1;
        let engine = BatchProcessor::new(processor, MemorySink::new(), config).with_redelivery(
            RedeliveryPolicy {
                base: Duration::from_secs(43_200),
                multiplier: 1,
                max: Duration::from_secs(43_200),
            },
            port.clone(),
        );
        let started = tokio::time::Instant::now();
        engine
            .process_batch(
                batch(vec![
                    record("r1", ORDERS, "g1", 1),
                    record("r2", ORDERS, "g1", 1),
                ]),
                Deadline::after(Duration::from_secs(900), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        let seen = port.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        // SQS: at most 12 h from the receive, which came up to 6 min before the invocation.
        let limit = Duration::from_secs(43_200 - 360);
        for s in &seen {
            let reaches = (s.at - started) + s.hide.delay;
            assert!(
                reaches <= limit,
                "{} (call {}) asks for {:?} at {:?} into the invocation: {:?} past the 12 h cap",
                s.hide.receipt_handle,
                s.call,
                s.hide.delay,
                s.at - started,
                reaches - limit
            );
        }
    }

    /// (d) No hide outlasts the message's retention (less a visibility timeout): the
    /// follower's room was judged before the first call and used after it.
    #[tokio::test(start_paused = true)]
    async fn a_followers_hide_does_not_outlast_its_retention() {
        const HOUR: Duration = Duration::from_secs(3600);
        let timing = QueueTiming {
            retention: 96 * HOUR,
            visibility_timeout: Duration::from_secs(30),
        };
        let port = Arc::new(Port {
            first_call_takes: Duration::from_secs(60),
            timing: Some(timing),
            ..Port::default()
        });
        let processor =
            ScriptedProcessor::new().script("r1", vec![Step::Fail(ErrorClass::ServerError)]);
        let mut config = BatchConfig::default();
        config.parser.id_source = "pointer:/id".parse().unwrap();
        config.retry.max_attempts = 1;
        config.max_receive_count = Some(30);
        let engine = BatchProcessor::new(processor, MemorySink::new(), config).with_redelivery(
            RedeliveryPolicy {
                base: Duration::from_secs(300),
                multiplier: 3,
                max: 12 * HOUR,
            },
            port.clone(),
        );
        // Both sent 94 h ago: 2 h of retention left, the policy asks for 6-12 h.
        let wall = std::time::SystemTime::now();
        let sent = wall - 94 * HOUR;
        let sent_ms = sent
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            .to_string();
        let mut r1 = record("r1", ORDERS, "g1", 20);
        let mut r2 = record("r2", ORDERS, "g1", 20);
        r1["attributes"]["SentTimestamp"] = json!(sent_ms);
        r2["attributes"]["SentTimestamp"] = json!(sent_ms);
        let started = tokio::time::Instant::now();
        engine
            .process_batch(
                batch(vec![r1, r2]),
                Deadline::after(Duration::from_secs(900), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        let seen = port.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        // The latest a hide may end: one visibility timeout before the message expires
        // (a second of slack for the real clock read during the test).
        let latest = sent + timing.retention - timing.visibility_timeout + Duration::from_secs(1);
        for s in &seen {
            let ends = wall + (s.at - started) + s.hide.delay;
            assert!(
                ends <= latest,
                "{} (call {}) hidden {:?} from {:?} into the invocation ends {:?} past the room \
                 (retention ends {:?} before it)",
                s.hide.receipt_handle,
                s.call,
                s.hide.delay,
                s.at - started,
                ends.duration_since(latest).unwrap(),
                ends.duration_since(sent + timing.retention).ok(),
            );
        }
    }

    /// (a)+(b) Two FIFO queues in one batch that happen to use the same group id: each queue's
    /// group is its own stream, but the engine keys groups by id alone. Queue B's group has
    /// its first record (b1, a short delay) and a later one (b2, a long own delay).
    #[tokio::test]
    async fn a_group_is_per_queue_so_another_queues_group_of_the_same_id_leads_nothing() {
        const B: &str = "arn:aws:sqs:us-east-1:123456789012:payments.fifo";
        let port = Arc::new(Port::default());
        let processor =
            ScriptedProcessor::new().script("a1", vec![Step::Fail(ErrorClass::ServerError)]);
        let engine = spaced(processor, port.clone());
        let report = engine
            .process_batch(
                batch(vec![
                    record("a1", ORDERS, "g", 4),
                    record("b1", B, "g", 1),
                    record("b2", B, "g", 4),
                ]),
                Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        assert_eq!(report.response().batch_item_failures.len(), 3);
        let seen = port.seen.lock().unwrap().clone();
        let b1 = seen_of(&seen, "rh-b1").unwrap().hide.delay;
        let b2 = seen_of(&seen, "rh-b2").unwrap().hide.delay;
        assert!(
            b2 <= b1,
            "b2 hidden {b2:?}, longer than b1, first of its group on queue B ({b1:?}): {seen:#?}"
        );
    }

    /// (b) The same batch: b1's hide fails, so b2 must not be hidden (it would hold b1).
    #[tokio::test]
    async fn a_later_record_is_not_hidden_when_its_own_groups_first_fails_on_another_queue() {
        const B: &str = "arn:aws:sqs:us-east-1:123456789012:payments.fifo";
        let port = Arc::new(Port {
            fail_receipts: vec!["rh-b1"],
            ..Port::default()
        });
        let processor =
            ScriptedProcessor::new().script("a1", vec![Step::Fail(ErrorClass::ServerError)]);
        let engine = spaced(processor, port.clone());
        engine
            .process_batch(
                batch(vec![
                    record("a1", ORDERS, "g", 4),
                    record("b1", B, "g", 1),
                    record("b2", B, "g", 4),
                ]),
                Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        let seen = port.seen.lock().unwrap().clone();
        assert!(
            seen_of(&seen, "rh-b2").is_none(),
            "b2 was hidden though the hide of b1, first of its group, failed: {seen:#?}"
        );
    }

    /// (a) A group's first record going back has no receipt handle (it cannot be hidden: it
    /// comes back after the visibility timeout); the record behind it must not be hidden
    /// longer than that.
    #[tokio::test]
    async fn a_follower_is_not_hidden_when_its_groups_first_cannot_be() {
        let port = Arc::new(Port::default());
        let processor =
            ScriptedProcessor::new().script("r1", vec![Step::Fail(ErrorClass::ServerError)]);
        let engine = spaced(processor, port.clone());
        let mut r1 = record("r1", ORDERS, "g1", 1);
        r1.as_object_mut().unwrap().remove("receiptHandle");
        let report = engine
            .process_batch(
                batch(vec![r1, record("r2", ORDERS, "g1", 3)]),
                Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        assert_eq!(report.response().batch_item_failures.len(), 2);
        let seen = port.seen.lock().unwrap().clone();
        assert!(
            seen_of(&seen, "rh-r2").is_none(),
            "r2 hidden {:?} while r1, first of its group, is not hidden at all",
            seen_of(&seen, "rh-r2").map(|s| s.hide.delay)
        );
    }

    /// (b) control: the deadline's hard stop falls during the first call: nothing behind it
    /// is hidden.
    #[tokio::test(start_paused = true)]
    async fn first_call_cut_at_the_hard_stop_hides_no_follower() {
        let port = Arc::new(Port {
            first_call_takes: Duration::from_secs(120),
            ..Port::default()
        });
        let processor =
            ScriptedProcessor::new().script("r1", vec![Step::Fail(ErrorClass::ServerError)]);
        let engine = spaced(processor, port.clone());
        let report = engine
            .process_batch(
                batch(vec![
                    record("r1", ORDERS, "g1", 1),
                    record("r2", ORDERS, "g1", 3),
                    record("s1", ORDERS, "g2", 3),
                ]),
                Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        assert_eq!(report.response().batch_item_failures.len(), 3);
        let seen = port.seen.lock().unwrap().clone();
        assert!(seen.iter().all(|s| s.call == 1), "{seen:#?}");
        assert!(seen_of(&seen, "rh-r2").is_none());
    }

    /// (a)/(b) control: a group whose first is not the batch's first, mixed groups, a
    /// partial failure: followers only behind a first that succeeded, never longer.
    #[tokio::test]
    async fn mixed_groups_with_a_partial_failure() {
        let port = Arc::new(Port {
            fail_receipts: vec!["rh-x1"],
            ..Port::default()
        });
        let processor = ScriptedProcessor::new()
            .script("ok", vec![Step::Done])
            .script("s1", vec![Step::Fail(ErrorClass::ServerError)]);
        let engine = spaced(processor, port.clone());
        let report = engine
            .process_batch(
                batch(vec![
                    record("ok", ORDERS, "g1", 1),
                    record("s1", ORDERS, "g2", 2),
                    record("r1", ORDERS, "g1", 1),
                    record("x1", ORDERS, "g3", 1),
                    record("r2", ORDERS, "g1", 4),
                    record("x2", ORDERS, "g3", 4),
                    record("s2", ORDERS, "g2", 4),
                ]),
                Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        assert_eq!(report.response().batch_item_failures.len(), 6);
        let seen = port.seen.lock().unwrap().clone();
        let d = |r: &str| seen_of(&seen, r).map(|s| s.hide.delay);
        assert!(d("rh-x2").is_none(), "{seen:#?}");
        assert!(d("rh-r2").unwrap() <= d("rh-r1").unwrap(), "{seen:#?}");
        assert!(d("rh-s2").unwrap() <= d("rh-s1").unwrap(), "{seen:#?}");
        assert!(seen_of(&seen, "rh-ok").is_none());
    }

    /// (d) Two source queues in one batch (the engine carries each record's queue ARN and the
    /// port hides per queue): each record's hide is capped by its own queue's retention.
    /// Only the first record's queue is read, so a record of the second is hidden past its
    /// retention.
    #[tokio::test]
    async fn a_record_of_a_second_queue_is_hidden_within_its_retention() {
        const HOUR: Duration = Duration::from_secs(3600);
        const A: &str = "arn:aws:sqs:us-east-1:123456789012:orders";
        const B: &str = "arn:aws:sqs:us-east-1:123456789012:payments";
        let timing = QueueTiming {
            retention: 96 * HOUR,
            visibility_timeout: Duration::from_secs(180),
        };
        let port = Arc::new(Port {
            timing: Some(timing),
            ..Port::default()
        });
        let processor = ScriptedProcessor::new()
            .script("a1", vec![Step::Fail(ErrorClass::ServerError)])
            .script("b1", vec![Step::Fail(ErrorClass::ServerError)]);
        let mut config = BatchConfig::default();
        config.parser.id_source = "pointer:/id".parse().unwrap();
        config.retry.max_attempts = 1;
        config.max_receive_count = Some(30);
        let engine = BatchProcessor::new(processor, MemorySink::new(), config).with_redelivery(
            RedeliveryPolicy {
                base: Duration::from_secs(300),
                multiplier: 3,
                max: 12 * HOUR,
            },
            port.clone(),
        );
        let wall = std::time::SystemTime::now();
        let ms = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis()
                .to_string()
        };
        let standard = |id: &str, arn: &str, sent: std::time::SystemTime| {
            json!({
                "messageId": format!("m-{id}"),
                "receiptHandle": format!("rh-{id}"),
                "body": json!({"id": id}).to_string(),
                "attributes": {"ApproximateReceiveCount": "20", "SentTimestamp": ms(sent)},
                "eventSource": "aws:sqs",
                "eventSourceARN": arn
            })
        };
        // b1 has 2 h of retention left; the policy asks for 6-12 h.
        engine
            .process_batch(
                batch(vec![
                    standard("a1", A, wall - HOUR),
                    standard("b1", B, wall - 94 * HOUR),
                ]),
                Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        let seen = port.seen.lock().unwrap().clone();
        let b1 = seen_of(&seen, "rh-b1")
            .expect("b1 returned and hidden")
            .hide
            .delay;
        assert!(
            b1 <= 2 * HOUR - timing.visibility_timeout,
            "b1 hidden {b1:?} with 2 h of retention left: it expires while hidden"
        );
    }
}
