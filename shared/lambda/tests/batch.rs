//! Batch engine behaviour: dispositions, batch response, FIFO, deadline, receive budget.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use serde_json::json;
use sqs_keeper_core::ErrorClass;
use sqs_keeper_core::{
    batch::BatchError, batch::Disposition, batch::NotStartedReason, BatchConfig, BatchProcessor,
};
use sqs_keeper_core::{
    dead_letter::InvocationInfo, dead_letter::NoDeadLetterStore, DeadLetterReason,
};
use sqs_keeper_core::{item::ItemIdSource, item::ItemParser};
use sqs_keeper_core::{retry::Deadline, retry::Jitter, retry::RetryPolicy};
use sqs_keeper_core::{testing::MemorySink, testing::ScriptedProcessor, testing::Step};

const STANDARD_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders";
const FIFO_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders.fifo";

/// A record as Lambda delivers it; the item id is the body's `id`.
fn record(id: &str, receive_count: u32) -> serde_json::Value {
    json!({
        "messageId": format!("m-{id}"),
        "receiptHandle": "rh",
        "body": json!({"id": id}).to_string(),
        "attributes": {
            "ApproximateReceiveCount": receive_count.to_string(),
            "SentTimestamp": "1700000000000"
        },
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": STANDARD_ARN,
        "awsRegion": "us-east-1"
    })
}

fn fifo_record(id: &str, group: &str) -> serde_json::Value {
    let mut r = record(id, 1);
    r["eventSourceARN"] = json!(FIFO_ARN);
    r["attributes"]["MessageGroupId"] = json!(group);
    r
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

fn far_deadline() -> Deadline {
    Deadline::after(Duration::from_secs(600), Duration::from_secs(1))
}

fn failed_ids(report: &sqs_keeper_core::BatchReport) -> Vec<String> {
    report
        .response()
        .batch_item_failures
        .into_iter()
        .map(|f| f.item_identifier)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn mixed_batch_ends_each_record_exactly_once() {
    let processor = ScriptedProcessor::new()
        .script("skip", vec![Step::Skip])
        .script("flaky", vec![Step::Fail(ErrorClass::ServerError)])
        .script("bad", vec![Step::Fail(ErrorClass::Validation)]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let mut malformed = record("ignored", 1);
    malformed["messageId"] = json!("m-malformed");
    malformed["body"] = json!("{not json");
    let ev = event(vec![
        record("ok", 1),
        record("skip", 1),
        record("flaky", 1),
        record("bad", 1),
        malformed,
    ]);
    let report = engine
        .process_batch(ev, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();

    let dispositions: Vec<_> = report
        .records
        .iter()
        .map(|r| r.disposition.clone())
        .collect();
    assert_eq!(dispositions[0], Disposition::Done);
    assert!(matches!(dispositions[1], Disposition::Skipped { .. }));
    assert_eq!(
        dispositions[2],
        Disposition::RetryLater {
            class: ErrorClass::ServerError
        }
    );
    assert_eq!(
        dispositions[3],
        Disposition::DeadLettered {
            class: ErrorClass::Validation,
            reason: DeadLetterReason::Permanent
        }
    );
    assert_eq!(
        dispositions[4],
        Disposition::DeadLettered {
            class: ErrorClass::Validation,
            reason: DeadLetterReason::Permanent
        }
    );
    assert_eq!(failed_ids(&report), ["m-flaky"]);
    // Transient: all three attempts made. Permanent: exactly one.
    assert_eq!(engine.processor().calls("flaky"), 3);
    assert_eq!(engine.processor().calls("bad"), 1);
    // The malformed record never reached the processor and is keyed by its message id.
    let counts = report.counts();
    assert_eq!(
        (
            counts.done,
            counts.skipped,
            counts.retry_later,
            counts.dead_lettered
        ),
        (1, 1, 1, 2)
    );
    assert_eq!(counts.records, 5);
    assert_eq!(counts.by_class.get(&ErrorClass::Validation), Some(&2));
    // What the response lists is what the counts call reported.
    assert_eq!(counts.reported(), failed_ids(&report).len());
}

#[tokio::test(start_paused = true)]
async fn dead_letter_candidates_reach_the_sink_with_history() {
    let processor = ScriptedProcessor::new().script("bad", vec![Step::Fail(ErrorClass::NotFound)]);
    let sink = MemorySink::new();
    let engine = BatchProcessor::new(processor, sink, config());
    let mut malformed = record("x", 1);
    malformed["messageId"] = json!("m-malformed");
    malformed["body"] = json!("not json at all");
    engine
        .process_batch(
            event(vec![record("bad", 1), malformed]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let engine_sink = engine_sink(&engine);
    let accepted = engine_sink.accepted.lock().unwrap();
    assert_eq!(accepted.len(), 2);
    let bad = accepted.iter().find(|c| c.item.item_id == "bad").unwrap();
    assert_eq!(bad.failures.len(), 1);
    assert_eq!(bad.error.class, ErrorClass::NotFound);
    let malformed = accepted
        .iter()
        .find(|c| c.item.message_id == "m-malformed")
        .unwrap();
    assert_eq!(malformed.item.item_id, "m-malformed");
    assert_eq!(malformed.error.step.as_deref(), Some("parse"));
    assert!(malformed.error.message.contains("not valid JSON"));
}

fn engine_sink<P: sqs_keeper_lambda::Processor>(
    engine: &BatchProcessor<P, MemorySink>,
) -> &MemorySink {
    engine.sink()
}

#[tokio::test(start_paused = true)]
async fn retryable_then_success_is_done() {
    let processor = ScriptedProcessor::new().script(
        "flaky",
        vec![
            Step::Fail(ErrorClass::Throttled),
            Step::Fail(ErrorClass::Timeout),
            Step::Done,
        ],
    );
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let start = tokio::time::Instant::now();
    let report = engine
        .process_batch(
            event(vec![record("flaky", 1)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(report.records[0].disposition, Disposition::Done);
    assert_eq!(report.records[0].attempts, 3);
    assert!(failed_ids(&report).is_empty());
    // Backoff without jitter: 100 ms then 200 ms.
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn retryable_on_last_delivery_is_dead_lettered_with_every_attempt() {
    let processor =
        ScriptedProcessor::new().script("flaky", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let report = engine
        .process_batch(
            event(vec![record("flaky", 5), record("early", 4)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        report.records[0].disposition,
        Disposition::DeadLettered {
            class: ErrorClass::ServerError,
            reason: DeadLetterReason::ReceiveBudgetExhausted
        }
    );
    assert!(failed_ids(&report).is_empty());
    let accepted = engine.sink().accepted.lock().unwrap();
    assert_eq!(accepted[0].failures.len(), 3);
    assert_eq!(
        accepted[0]
            .failures
            .iter()
            .map(|f| f.attempt)
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
}

#[tokio::test(start_paused = true)]
async fn receive_budget_margin_dead_letters_early() {
    let processor = ScriptedProcessor::new()
        .script("a", vec![Step::Fail(ErrorClass::ServerError)])
        .script("b", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(
        processor,
        MemorySink::new(),
        BatchConfig {
            receive_budget_margin: 1,
            ..config()
        },
    );
    let report = engine
        .process_batch(
            event(vec![record("a", 4), record("b", 3)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert!(matches!(
        report.records[0].disposition,
        Disposition::DeadLettered { .. }
    ));
    assert!(matches!(
        report.records[1].disposition,
        Disposition::RetryLater { .. }
    ));
    assert_eq!(failed_ids(&report), ["m-b"]);
}

#[tokio::test(start_paused = true)]
async fn without_max_receive_count_retryable_failures_are_left_to_sqs() {
    let processor = ScriptedProcessor::new().script("a", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(
        processor,
        MemorySink::new(),
        BatchConfig {
            max_receive_count: None,
            ..config()
        },
    );
    let report = engine
        .process_batch(
            event(vec![record("a", 999)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(failed_ids(&report), ["m-a"]);
}

#[tokio::test(start_paused = true)]
async fn failing_sink_never_acks() {
    let processor =
        ScriptedProcessor::new().script("bad", vec![Step::Fail(ErrorClass::Validation)]);
    let engine = BatchProcessor::new(processor, MemorySink::failing(), config());
    let report = engine
        .process_batch(
            event(vec![record("bad", 1), record("ok", 1)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert!(matches!(
        report.records[0].disposition,
        Disposition::DeadLetterFailed {
            class: ErrorClass::Validation,
            ..
        }
    ));
    assert_eq!(failed_ids(&report), ["m-bad"]);

    // With no store configured at all, candidates are returned to the queue too.
    let processor =
        ScriptedProcessor::new().script("bad", vec![Step::Fail(ErrorClass::Validation)]);
    let engine = BatchProcessor::new(processor, NoDeadLetterStore, config());
    let report = engine
        .process_batch(
            event(vec![record("bad", 1)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(failed_ids(&report), ["m-bad"]);
}

#[tokio::test(start_paused = true)]
async fn fifo_short_circuits_after_first_failure() {
    let processor = ScriptedProcessor::new().script("b", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let ev = event(vec![
        fifo_record("a", "g1"),
        fifo_record("b", "g1"),
        fifo_record("c", "g2"),
        fifo_record("d", "g1"),
    ]);
    let report = engine
        .process_batch(ev, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    assert_eq!(failed_ids(&report), ["m-b", "m-c", "m-d"]);
    assert_eq!(
        report.records[2].disposition,
        Disposition::NotStarted {
            reason: NotStartedReason::FifoShortCircuit
        }
    );
    assert_eq!(engine.processor().calls("a"), 1);
    assert_eq!(engine.processor().calls("c"), 0);
    assert_eq!(engine.processor().calls("d"), 0);
}

#[tokio::test(start_paused = true)]
async fn fifo_skip_group_on_error_holds_back_only_that_group() {
    let processor = ScriptedProcessor::new().script("b", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(
        processor,
        MemorySink::new(),
        BatchConfig {
            skip_group_on_error: true,
            ..config()
        },
    );
    let ev = event(vec![
        fifo_record("a", "g1"),
        fifo_record("b", "g1"),
        fifo_record("c", "g2"),
        fifo_record("d", "g1"),
        fifo_record("e", "g2"),
    ]);
    let report = engine
        .process_batch(ev, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    assert_eq!(failed_ids(&report), ["m-b", "m-d"]);
    assert_eq!(
        report.records[3].disposition,
        Disposition::NotStarted {
            reason: NotStartedReason::FifoGroupFailed
        }
    );
    assert_eq!(engine.processor().calls("c"), 1);
    assert_eq!(engine.processor().calls("e"), 1);
    assert_eq!(engine.processor().calls("d"), 0);
}

#[tokio::test(start_paused = true)]
async fn fifo_dead_lettered_record_does_not_block_its_group() {
    let processor = ScriptedProcessor::new().script("b", vec![Step::Fail(ErrorClass::Validation)]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let ev = event(vec![
        fifo_record("a", "g1"),
        fifo_record("b", "g1"),
        fifo_record("c", "g1"),
    ]);
    let report = engine
        .process_batch(ev, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    assert!(failed_ids(&report).is_empty());
    assert_eq!(engine.processor().calls("c"), 1);

    // But if dead-lettering fails, the rest of the batch is held back.
    let processor = ScriptedProcessor::new().script("b", vec![Step::Fail(ErrorClass::Validation)]);
    let engine = BatchProcessor::new(processor, MemorySink::failing(), config());
    let ev = event(vec![
        fifo_record("a", "g1"),
        fifo_record("b", "g1"),
        fifo_record("c", "g1"),
    ]);
    let report = engine
        .process_batch(ev, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    assert_eq!(failed_ids(&report), ["m-b", "m-c"]);
    assert_eq!(engine.processor().calls("c"), 0);
}

#[tokio::test(start_paused = true)]
async fn deadline_stops_new_records_and_reports_them() {
    let mut processor = ScriptedProcessor::new();
    let ids: Vec<String> = (0..8).map(|i| format!("r{i}")).collect();
    for id in &ids {
        processor = processor.script(id, vec![Step::Sleep(Duration::from_secs(1))]);
    }
    let engine = BatchProcessor::new(
        processor,
        MemorySink::new(),
        BatchConfig {
            concurrency: 1,
            ..config()
        },
    );
    // 4.5 s to the deadline, 1 s margin: records may start until t = 3.5 s.
    let deadline = Deadline::after(Duration::from_millis(4500), Duration::from_secs(1));
    let report = engine
        .process_batch(
            event(ids.iter().map(|id| record(id, 1)).collect()),
            deadline,
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let done = report
        .records
        .iter()
        .filter(|r| r.disposition == Disposition::Done)
        .count();
    assert_eq!(done, 3, "started at t = 0, 1, 2 and done by the cut-off");
    // r3 started at t = 3 s and was still running at the 3.5 s cut-off: cut, as a timeout.
    assert_eq!(
        report.records[3].disposition,
        Disposition::RetryLater {
            class: ErrorClass::Timeout
        }
    );
    assert_eq!(
        failed_ids(&report),
        ["m-r3", "m-r4", "m-r5", "m-r6", "m-r7"]
    );
    for id in &ids[4..] {
        assert_eq!(engine.processor().calls(id), 0, "{id} must not run");
    }
    assert_eq!(report.counts().not_started, 4);
}

/// The case that overran Lambda's deadline: 20 records, a downstream that takes 3.5 s,
/// 6 s to the deadline, the default margin (2 s), attempts (3) and concurrency (10).
#[tokio::test(start_paused = true)]
async fn a_hanging_downstream_never_runs_the_batch_past_its_deadline() {
    let mut processor = ScriptedProcessor::new();
    let ids: Vec<String> = (0..20).map(|i| format!("h{i}")).collect();
    for id in &ids {
        processor = processor.script(id, vec![Step::Sleep(Duration::from_millis(3500))]);
    }
    let engine = BatchProcessor::new(
        processor,
        MemorySink::new(),
        BatchConfig {
            concurrency: 10,
            ..config()
        },
    );
    let start = tokio::time::Instant::now();
    let deadline = Deadline::after(Duration::from_secs(6), Duration::from_secs(2));
    let report = engine
        .process_batch(
            event(ids.iter().map(|id| record(id, 1)).collect()),
            deadline,
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert!(
        start.elapsed() <= Duration::from_millis(4000),
        "answered {:?} after the start, past the 4 s cut-off",
        start.elapsed()
    );
    let counts = report.counts();
    assert_eq!(counts.done, 10, "the first ten finished at 3.5 s");
    assert_eq!(counts.retry_later, 10, "the next ten were cut at 4 s");
    assert_eq!(counts.by_class.get(&ErrorClass::Timeout), Some(&10));
    assert_eq!(failed_ids(&report).len(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_cut_attempt_on_the_last_delivery_is_dead_lettered_within_the_margin() {
    let processor =
        ScriptedProcessor::new().script("last", vec![Step::Sleep(Duration::from_secs(60))]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let start = tokio::time::Instant::now();
    let deadline = Deadline::after(Duration::from_secs(6), Duration::from_secs(2));
    let report = engine
        .process_batch(
            event(vec![record("last", 5)]),
            deadline,
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(4));
    assert_eq!(
        report.records[0].disposition,
        Disposition::DeadLettered {
            class: ErrorClass::Timeout,
            reason: DeadLetterReason::ReceiveBudgetExhausted
        }
    );
    assert_eq!(engine_sink(&engine).accepted_ids(), ["last"]);
}

#[tokio::test(start_paused = true)]
async fn dead_letter_writes_that_hang_are_cut_at_the_hard_stop_and_reported() {
    let processor =
        ScriptedProcessor::new().script("bad", vec![Step::Fail(ErrorClass::Validation)]);
    let engine = BatchProcessor::new(
        processor,
        MemorySink::slow(Duration::from_secs(600)),
        config(),
    );
    let start = tokio::time::Instant::now();
    let deadline = Deadline::after(Duration::from_secs(6), Duration::from_secs(2));
    let report = engine
        .process_batch(
            event(vec![record("bad", 1), record("good", 1)]),
            deadline,
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(5750),
        "the hard stop: deadline less 250 ms"
    );
    assert!(matches!(
        report.records[0].disposition,
        Disposition::DeadLetterFailed { .. }
    ));
    assert_eq!(report.records[1].disposition, Disposition::Done);
    assert_eq!(failed_ids(&report), ["m-bad"]);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_processor_fails_only_its_record() {
    let processor = ScriptedProcessor::new().script("boom", vec![Step::Panic]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let report = engine
        .process_batch(
            event(vec![record("boom", 1), record("fine", 1)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        report.records[0].disposition,
        Disposition::DeadLettered {
            class: ErrorClass::Unknown,
            reason: DeadLetterReason::Permanent
        }
    );
    assert_eq!(report.records[1].disposition, Disposition::Done);
    let accepted = engine_sink(&engine).accepted.lock().unwrap().clone();
    assert!(
        accepted[0]
            .error
            .message
            .contains("scripted panic on item boom"),
        "{}",
        accepted[0].error.message
    );
}

#[tokio::test(start_paused = true)]
async fn deadline_bounds_retry_sleeps() {
    let processor =
        ScriptedProcessor::new().script("slow", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(
        processor,
        MemorySink::new(),
        BatchConfig {
            retry: RetryPolicy {
                max_attempts: 10,
                base_delay: Duration::from_millis(400),
                max_delay: Duration::from_secs(10),
                retry_unknown: false,
                jitter: Jitter::None,
                class_attempts: Default::default(),
                ..RetryPolicy::default()
            },
            ..config()
        },
    );
    let start = tokio::time::Instant::now();
    let deadline = Deadline::after(Duration::from_millis(2000), Duration::from_millis(500));
    let report = engine
        .process_batch(
            event(vec![record("slow", 1)]),
            deadline,
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    // Attempts at 0, 400 ms, 1200 ms; the next (after 1600 ms more) would pass the 1500 ms cut-off.
    assert_eq!(engine.processor().calls("slow"), 3);
    assert_eq!(start.elapsed(), Duration::from_millis(1200));
    assert_eq!(failed_ids(&report), ["m-slow"]);
}

#[tokio::test(start_paused = true)]
async fn concurrency_limit_is_respected() {
    let mut processor = ScriptedProcessor::new();
    let ids: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    for id in &ids {
        processor = processor.script(id, vec![Step::Sleep(Duration::from_millis(100))]);
    }
    let engine = BatchProcessor::new(
        processor,
        MemorySink::new(),
        BatchConfig {
            concurrency: 5,
            ..config()
        },
    );
    let start = tokio::time::Instant::now();
    let report = engine
        .process_batch(
            event(ids.iter().map(|id| record(id, 1)).collect()),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(report.counts().done, 10);
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    // Reports keep the event's order even though records finish out of order.
    let order: Vec<_> = report.records.iter().map(|r| r.item_id.clone()).collect();
    assert_eq!(order, ids);
}

#[tokio::test]
async fn record_without_message_id_fails_the_invocation() {
    let engine = BatchProcessor::new(ScriptedProcessor::new(), MemorySink::new(), config());
    let mut no_id = record("x", 1);
    no_id.as_object_mut().unwrap().remove("messageId");
    let err = engine
        .process_batch(
            event(vec![record("a", 1), no_id]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err, BatchError::MissingMessageId { index: 1 });
    assert_eq!(
        engine.processor().calls("a"),
        0,
        "nothing runs before the check"
    );

    let mut empty_id = record("y", 1);
    empty_id["messageId"] = json!("");
    let err = engine
        .process_batch(
            event(vec![empty_id]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err, BatchError::MissingMessageId { index: 0 });
}

#[tokio::test]
async fn full_success_is_an_empty_list_and_json_is_exact() {
    let engine = BatchProcessor::new(ScriptedProcessor::new(), MemorySink::new(), config());
    let report = engine
        .process_batch(
            event(vec![record("a", 1), record("b", 1)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_string(&report.response()).unwrap(),
        r#"{"batchItemFailures":[]}"#
    );

    let processor = ScriptedProcessor::new().script("b", vec![Step::Fail(ErrorClass::Timeout)]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let report = engine
        .process_batch(
            event(vec![record("a", 1), record("b", 1)]),
            Deadline::after(Duration::from_secs(600), Duration::ZERO),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_string(&report.response()).unwrap(),
        r#"{"batchItemFailures":[{"itemIdentifier":"m-b"}]}"#
    );
}

#[tokio::test]
async fn empty_event_is_full_success() {
    let engine = BatchProcessor::new(ScriptedProcessor::new(), MemorySink::new(), config());
    let report = engine
        .process_batch(event(vec![]), far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    assert!(report.response().batch_item_failures.is_empty());
}

#[test]
fn real_event_fixture_round_trips() {
    let text = include_str!("../../core/tests/fixtures/sqs_event.json");
    let ev: SqsEvent = serde_json::from_str(text).unwrap();
    let again: SqsEvent = serde_json::from_str(&serde_json::to_string(&ev).unwrap()).unwrap();
    assert_eq!(ev, again);
    let original: serde_json::Value = serde_json::from_str(text).unwrap();
    let reserialized = serde_json::to_value(&ev).unwrap();
    for (a, b) in original["Records"]
        .as_array()
        .unwrap()
        .iter()
        .zip(reserialized["Records"].as_array().unwrap())
    {
        for key in [
            "messageId",
            "body",
            "attributes",
            "eventSourceARN",
            "awsRegion",
            "md5OfBody",
        ] {
            assert_eq!(a[key], b[key], "{key}");
        }
        assert_eq!(
            a["messageAttributes"]["tenant"]["stringValue"],
            b["messageAttributes"]["tenant"]["stringValue"]
        );
    }

    let parser = ItemParser {
        id_source: ItemIdSource::JsonPointer("/id".into()),
        ..ItemParser::default()
    };
    let items: Vec<_> = ev
        .records
        .into_iter()
        .map(|m: SqsMessage| {
            let id = m.message_id.clone().unwrap();
            parser.parse(id, m).unwrap()
        })
        .collect();
    assert_eq!(items[0].item_id, "order-1001");
    assert_eq!(items[0].receive_count, 1);
    assert_eq!(items[1].receive_count, 3);
    assert_eq!(
        items[0].sent_timestamp.unwrap().timestamp_millis(),
        1_545_082_649_183
    );
    assert_eq!(
        items[0].attributes.get("SenderId"),
        Some("AIDAIENQZJOLO23YVJ4VO")
    );
    assert_eq!(
        items[0].message_attributes["tenant"]
            .string_value
            .as_deref(),
        Some("acme")
    );
}

#[tokio::test]
async fn fifo_fixture_is_detected_as_fifo() {
    let ev: SqsEvent =
        serde_json::from_str(include_str!("../../core/tests/fixtures/fifo_event.json")).unwrap();
    let processor =
        ScriptedProcessor::new().script("a-1", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(
        processor,
        MemorySink::new(),
        BatchConfig {
            retry: RetryPolicy {
                max_attempts: 1,
                ..config().retry
            },
            ..config()
        },
    );
    let report = engine
        .process_batch(ev, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    assert_eq!(
        failed_ids(&report),
        ["11d6ee51-4cc7-4302-9e22-7cd8afdaadf5"]
    );
}

/// Each started record is timed from its start to its disposition, on tokio's clock: its
/// attempts and backoffs count, its share of the batch's dead-letter write does not, and a
/// record never started has no time.
#[tokio::test(start_paused = true)]
async fn records_are_timed_from_start_to_disposition() {
    let processor = ScriptedProcessor::new()
        .script("slow", vec![Step::Sleep(Duration::from_millis(250))])
        .script("flaky", vec![Step::Fail(ErrorClass::ServerError)])
        .script("bad", vec![Step::Fail(ErrorClass::Validation)]);
    let engine = BatchProcessor::new(
        processor,
        MemorySink::slow(Duration::from_secs(1)),
        config(),
    );
    let ev = event(vec![
        record("slow", 1),
        record("flaky", 1),
        record("bad", 1),
        record("ok", 1),
    ]);
    let report = engine
        .process_batch(ev, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    let times: Vec<_> = report.records.iter().map(|r| r.processing_time).collect();
    assert_eq!(
        times,
        [
            Some(Duration::from_millis(250)),
            // Three attempts with backoffs of 100 and 200 ms between them (no jitter).
            Some(Duration::from_millis(300)),
            // Dead-lettered: the sink's 1 s write is the batch's, not the record's.
            Some(Duration::ZERO),
            Some(Duration::ZERO),
        ]
    );
    assert_eq!(report.record_times().len(), 4);
    // The report's JSON does not carry the times (it stays the same for the same batch).
    assert!(serde_json::to_value(&report.records[0])
        .unwrap()
        .get("processing_time")
        .is_none());

    // Past the cut-off nothing starts, and nothing is timed.
    let engine = BatchProcessor::new(ScriptedProcessor::new(), MemorySink::new(), config());
    let late = Deadline::after(Duration::from_millis(500), Duration::from_secs(1));
    let report = engine
        .process_batch(
            event(vec![record("a", 1), record("b", 1)]),
            late,
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(report.counts().not_started, 2);
    assert!(report.records.iter().all(|r| r.processing_time.is_none()));
    assert!(report.record_times().is_empty());
}

/// One `finish_requeued` call: item id, message id, payload digest, run.
type Finished = (String, String, String, String);

/// Records the worker's calls finishing requeued messages.
#[derive(Default)]
struct FinishSink {
    finished: std::sync::Arc<std::sync::Mutex<Vec<Finished>>>,
}

impl sqs_keeper_core::dead_letter::DeadLetterSink for FinishSink {
    async fn dead_letter(
        &self,
        candidates: &[sqs_keeper_core::dead_letter::DeadLetterCandidate],
        _invocation: &InvocationInfo,
    ) -> Vec<Result<(), sqs_keeper_lambda::ProcessError>> {
        candidates.iter().map(|_| Ok(())).collect()
    }

    async fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
        requeued_by: &str,
    ) -> Result<(), sqs_keeper_lambda::ProcessError> {
        self.finished.lock().unwrap().push((
            item_id.into(),
            message_id.into(),
            payload_sha256.into(),
            requeued_by.into(),
        ));
        Ok(())
    }
}

/// Resolves one pointer text to one payload.
struct OnePointer {
    pointer: String,
    payload: String,
}

impl sqs_keeper_core::batch::BodyResolver for OnePointer {
    fn resolve<'a>(
        &'a self,
        body: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<Result<String, sqs_keeper_lambda::ProcessError>>>
    {
        Box::pin(async move { (body == self.pointer).then(|| Ok(self.payload.clone())) })
    }
}

#[tokio::test]
async fn a_requeued_pointer_is_finished_with_the_digest_its_record_holds_not_the_fetched_payloads()
{
    // The record holds an Extended-Client pointer (the worker could not follow it when it
    // failed); a run requeued it, and the worker now follows it. The record's conditions
    // compare the digest the record holds, which the requeue stamped on the message: the
    // digest of what the worker fetched would never match, and a record the worker
    // finished before the run marked it requeued would stay requeued.
    let pointer = sqs_keeper_core::pointer::S3Pointer {
        bucket: "b".into(),
        key: "k".into(),
    }
    .to_body();
    let payload = json!({"id": "order-1"}).to_string();
    let record_sha = sqs_keeper_core::hex::sha256_hex(pointer.as_bytes());
    let mut r = record("x", 1);
    r["body"] = json!(pointer);
    let string = |v: &str| json!({"dataType": "String", "stringValue": v});
    r["messageAttributes"] = json!({
        "item_id": string("m-lost-id"),
        "requeued_by": string("run-1"),
        "payload_sha256": string(&record_sha),
    });
    let sink = FinishSink::default();
    let finished = sink.finished.clone();
    let engine = BatchProcessor::new(ScriptedProcessor::new(), sink, config())
        .with_body_resolver(std::sync::Arc::new(OnePointer { pointer, payload }));
    let report = engine
        .process_batch(
            event(vec![r]),
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    let finished = finished.lock().unwrap().clone();
    // The digest of the payload fetched, then of the pointer received: both what the
    // message carried, the record's among them.
    let digests: Vec<&str> = finished.iter().map(|f| f.2.as_str()).collect();
    assert!(digests.contains(&record_sha.as_str()), "{finished:?}");
    for (item_id, message_id, _, run) in &finished {
        assert_eq!(
            (item_id.as_str(), message_id.as_str(), run.as_str()),
            ("m-lost-id", "m-x", "run-1")
        );
    }
}

#[tokio::test]
async fn a_stated_digest_never_finishes_a_record_the_message_does_not_carry() {
    // A producer's message with a requeue's attributes and another item's digest: the
    // finish compares only the digest of what it carries.
    let mut r = record("x", 1);
    let string = |v: &str| json!({"dataType": "String", "stringValue": v});
    r["messageAttributes"] = json!({
        "item_id": string("victim"),
        "requeued_by": string("run-1"),
        "source_message_id": string("m-victim"),
        "payload_sha256": string("the-victims-digest"),
    });
    let sink = FinishSink::default();
    let finished = sink.finished.clone();
    let engine = BatchProcessor::new(ScriptedProcessor::new(), sink, config());
    engine
        .process_batch(
            event(vec![r]),
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let body_sha = sqs_keeper_core::hex::sha256_hex(json!({"id": "x"}).to_string().as_bytes());
    let finished = finished.lock().unwrap().clone();
    assert!(!finished.is_empty());
    assert!(finished.iter().all(|f| f.2 == body_sha), "{finished:?}");
}

/// Log lines written while a test runs, for assertions on them.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The engine writes a line for every record, whatever it became: done, skipped with its
/// reason, failed (returned or dead-lettered), or not started with why; an operator
/// searching the logs by message id finds each one. (The functions keep the lines of records
/// done or skipped only with `WORKER_LOG_RECORDS=all`: `telemetry`'s tests.)
#[tokio::test(start_paused = true)]
async fn every_record_leaves_one_log_line_with_what_became_of_it() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let processor = ScriptedProcessor::new()
        .script("skip", vec![Step::Skip])
        .script("bad", vec![Step::Fail(ErrorClass::Validation)])
        .script("busy", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let ev = event(vec![
        record("ok", 1),
        record("skip", 1),
        record("bad", 1),
        record("busy", 1),
    ]);
    engine
        .process_batch(ev, far_deadline(), &InvocationInfo::default())
        .await
        .unwrap();
    // FIFO: the record held back behind a failure.
    let processor =
        ScriptedProcessor::new().script("f1", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    engine
        .process_batch(
            event(vec![fifo_record("f1", "g"), fifo_record("f2", "g")]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line = |message_id: &str| -> Vec<&str> {
        text.lines()
            .filter(|l| l.contains(&format!("message_id={message_id} ")))
            .collect()
    };
    let expect = [
        ("m-ok", "record done"),
        ("m-skip", "record skipped"),
        ("m-bad", "record failed: dead-lettered"),
        ("m-busy", "record failed: returned for retry"),
        ("m-f1", "record failed: returned for retry"),
        ("m-f2", "record not started: returned for retry"),
    ];
    for (message_id, what) in expect {
        let lines = line(message_id);
        assert_eq!(
            lines.iter().filter(|l| l.contains(what)).count(),
            1,
            "{message_id}: one line saying {what:?} in\n{text}"
        );
    }
    assert!(line("m-skip")[0].contains("reason=scripted skip"), "{text}");
    assert!(
        line("m-f2")[0].contains("held back behind an earlier failure of its FIFO batch"),
        "{text}"
    );
}

/// The fields a handler added are on the line that says its record was dead-lettered (the
/// docs/HANDLERS.md: on every record line), written after the record's context ended.
#[tokio::test(start_paused = true)]
async fn a_dead_lettered_record_is_logged_with_its_handlers_fields() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    async fn reject(
        _item: &sqs_keeper_core::WorkItem,
    ) -> Result<sqs_keeper_core::Outcome, sqs_keeper_core::ProcessError> {
        sqs_keeper_core::context::add_field("customer", "c-42");
        Err(sqs_keeper_core::ProcessError::validation("no such order"))
    }
    let engine = BatchProcessor::new(
        sqs_keeper_core::handler_fn(reject),
        MemorySink::new(),
        config(),
    );
    engine
        .process_batch(
            event(vec![record("bad", 1)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("message_id=m-bad "))
        .collect();
    let dead: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("record failed: dead-lettered"))
        .collect();
    assert_eq!(dead.len(), 1, "{text}");
    assert!(dead[0].contains("c-42"), "{text}");
    assert_eq!(lines.len(), 1, "one line for the record: {text}");
}

/// A processor that rejects every item, with a death hook that records what it saw, and
/// fails, panics or hangs for the items named so.
#[derive(Default)]
struct Mourner {
    seen: std::sync::Mutex<Vec<(String, String, usize)>>,
}

impl sqs_keeper_lambda::Processor for Mourner {
    async fn process(
        &self,
        item: &sqs_keeper_lambda::WorkItem,
    ) -> Result<sqs_keeper_lambda::Outcome, sqs_keeper_lambda::ProcessError> {
        Err(sqs_keeper_lambda::ProcessError::validation(format!(
            "order {} is not valid",
            item.item_id
        )))
    }

    async fn on_dead_letter(
        &self,
        dead: &sqs_keeper_lambda::DeadLettered<'_>,
    ) -> Result<(), sqs_keeper_lambda::ProcessError> {
        self.seen.lock().unwrap().push((
            dead.item.item_id.clone(),
            dead.reason.as_str().to_string(),
            dead.attempts,
        ));
        match dead.item.item_id.as_str() {
            "hook-fails" => Err(sqs_keeper_lambda::ProcessError::new(
                ErrorClass::ServerError,
                "the notification service is down",
            )),
            "hook-panics" => panic!("hook panicked over card 4111 1111 1111 1111"),
            "hook-hangs" => std::future::pending().await,
            _ => Ok(()),
        }
    }
}

/// The death hook runs once per record the sink made durable, after it did; whatever it
/// does (fail, panic, hang past the hard stop) the record stays dead-lettered and
/// acknowledged, and the batch answers before its deadline.
#[tokio::test(start_paused = true)]
async fn the_death_hook_sees_each_durable_dead_letter_and_cannot_undo_it() {
    let engine = BatchProcessor::new(Mourner::default(), MemorySink::new(), config());
    let ev = event(vec![
        record("fine", 1),
        record("hook-fails", 1),
        record("hook-panics", 1),
        record("hook-hangs", 1),
    ]);
    let deadline = Deadline::after(Duration::from_secs(30), Duration::from_secs(2));
    let hard_stop = deadline.hard_stop();
    let report = engine
        .process_batch(ev, deadline, &InvocationInfo::default())
        .await
        .unwrap();
    assert!(
        tokio::time::Instant::now() <= hard_stop,
        "answered after the hard stop"
    );
    // Nothing goes back to the queue: all four are dead-lettered, and stay so.
    assert!(failed_ids(&report).is_empty(), "{:?}", failed_ids(&report));
    for r in &report.records {
        assert!(
            matches!(r.disposition, Disposition::DeadLettered { .. }),
            "{r:?}"
        );
    }
    assert_eq!(engine.sink().accepted_ids().len(), 4);
    let mut seen = engine.processor().seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        ["fine", "hook-fails", "hook-hangs", "hook-panics"].map(|id| (
            id.to_string(),
            "permanent".to_string(),
            1
        ))
    );
}

/// A record whose dead-lettering failed (a store outage) is returned for retry, and its
/// death hook is not called: nothing was made durable.
#[tokio::test(start_paused = true)]
async fn the_death_hook_is_not_called_when_the_dead_letter_write_failed() {
    let engine = BatchProcessor::new(Mourner::default(), MemorySink::failing(), config());
    let report = engine
        .process_batch(
            event(vec![record("a", 1)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(failed_ids(&report), ["m-a"]);
    assert!(engine.processor().seen.lock().unwrap().is_empty());
}

/// A fair queue: a standard queue whose messages carry a `MessageGroupId` (a tenant). It
/// keeps standard batch semantics: a failure holds nothing back, in its group or any other,
/// and records run concurrently.
#[tokio::test(start_paused = true)]
async fn a_fair_queue_keeps_standard_semantics_whatever_its_groups() {
    let tenant = |id: &str, group: &str| {
        let mut r = record(id, 1);
        r["attributes"]["MessageGroupId"] = json!(group);
        r
    };
    let processor = ScriptedProcessor::new().script("a", vec![Step::Fail(ErrorClass::ServerError)]);
    let engine = BatchProcessor::new(processor, MemorySink::new(), config());
    let report = engine
        .process_batch(
            event(vec![
                tenant("a", "t1"),
                tenant("b", "t1"),
                tenant("c", "t2"),
            ]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(failed_ids(&report), ["m-a"]);
    assert_eq!(engine.processor().calls("b"), 1, "not held back behind a");
    assert_eq!(engine.processor().calls("c"), 1);
}
