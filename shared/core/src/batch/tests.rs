use super::record_run::log_failure;
use super::*;

#[test]
fn an_engine_prints_its_parts_for_a_log_or_a_failing_test() {
    let engine = BatchProcessor::new(
        crate::testing::ScriptedProcessor::new(),
        crate::testing::MemorySink::new(),
        BatchConfig::default(),
    );
    let printed = format!("{engine:?}");
    for part in [
        "BatchProcessor",
        "processor",
        "sink",
        "config",
        "resolver: false",
    ] {
        assert!(printed.contains(part), "{part} in {printed}");
    }
}

#[test]
fn the_reported_records_are_those_going_back_to_the_queue() {
    let counts = BatchCounts {
        records: 15,
        done: 3,
        skipped: 2,
        retry_later: 1,
        dead_lettered: 2,
        dead_letter_failed: 3,
        not_started: 4,
        by_class: BTreeMap::new(),
    };
    assert_eq!(counts.reported(), 8);
}

/// A sink's answer that another delivery of the message is dead-lettering it returns
/// the record for retry: read as a failure of the sink, the record was reported (and
/// counted, and logged as an error) as a failed dead-lettering while its other
/// delivery was sending the one DLQ message.
#[test]
fn a_record_another_delivery_is_dead_lettering_is_returned_for_retry_not_failed() {
    let candidate = DeadLetterCandidate {
        item: WorkItem::new("m-1", "{\"id\":\"a\"}"),
        error: ProcessError::new(ErrorClass::Throttled, "slow down"),
        failures: Vec::new(),
        reason: DeadLetterReason::ReceiveBudgetExhausted,
    };
    let elsewhere = Err(crate::dead_letter::dead_lettering_elsewhere());
    let report = dead_letter_report(&candidate, (3, None), Some(&elsewhere), None);
    assert_eq!(
        report.disposition,
        Disposition::RetryLater {
            class: ErrorClass::Throttled
        }
    );
    let failed = Err(ProcessError::new(ErrorClass::ServerError, "503"));
    let report = dead_letter_report(&candidate, (3, None), Some(&failed), None);
    assert!(
        matches!(
            report.disposition,
            Disposition::DeadLetterFailed {
                class: ErrorClass::Throttled,
                ..
            }
        ),
        "{report:?}"
    );
}

/// Answers a queue's timing; hides every record asked.
struct Timing(crate::redelivery::QueueTiming);

impl crate::redelivery::VisibilityPort for Timing {
    fn hide<'a>(
        &'a self,
        records: &'a [crate::redelivery::Hide],
    ) -> futures::future::BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(async move { records.iter().map(|_| Ok(())).collect() })
    }

    fn queue_timing<'a>(
        &'a self,
        _queue_arn: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<crate::redelivery::QueueTiming>> {
        let timing = self.0;
        Box::pin(async move { Some(timing) })
    }
}

/// Answers a queue's timing late and not at all on its first read, at once on the others.
struct FirstReadFailsLate {
    timing: crate::redelivery::QueueTiming,
    reads: std::sync::atomic::AtomicU32,
}

impl crate::redelivery::VisibilityPort for FirstReadFailsLate {
    fn hide<'a>(
        &'a self,
        records: &'a [crate::redelivery::Hide],
    ) -> futures::future::BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(async move { records.iter().map(|_| Ok(())).collect() })
    }

    fn queue_timing<'a>(
        &'a self,
        _queue_arn: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<crate::redelivery::QueueTiming>> {
        let first = self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        let timing = self.timing;
        Box::pin(async move {
            if first {
                tokio::time::sleep(Duration::from_millis(200)).await;
                return None;
            }
            Some(timing)
        })
    }
}

/// On Managed Instances a sandbox runs several invocations at once, and each may read the
/// queue's timing. A read that fails after another succeeded keeps what was learnt:
/// before, it overwrote it, and the sandbox's hides went uncapped by the retention
/// until the next read (found by the simulation, seed 85996).
#[tokio::test(start_paused = true)]
async fn a_failed_timing_read_keeps_what_a_concurrent_one_learnt() {
    let arn = "arn:aws:sqs:us-east-1:123456789012:orders";
    let timing = crate::redelivery::QueueTiming {
        retention: Duration::from_secs(7_200),
        visibility_timeout: Duration::from_secs(180),
    };
    let port = FirstReadFailsLate {
        timing,
        reads: std::sync::atomic::AtomicU32::new(0),
    };
    let policy = crate::redelivery::RedeliveryPolicy {
        base: Duration::from_secs(60),
        multiplier: 2,
        max: Duration::from_secs(3600),
    };
    let engine = BatchProcessor::new(
        crate::testing::ScriptedProcessor::new(),
        crate::testing::MemorySink::new(),
        BatchConfig::default(),
    )
    .with_redelivery(policy, Arc::new(port));
    let deadline = Deadline::after(Duration::from_secs(30), Duration::from_secs(1));
    let slow = engine.learn_queue_timing(arn, &deadline);
    let fast = async {
        tokio::task::yield_now().await;
        engine.learn_queue_timing(arn, &deadline).await;
    };
    tokio::join!(slow, fast);
    assert_eq!(engine.queue_timing(Some(arn)), Some(timing));
}

/// Hiding records for their redelivery delay is a warning only when some could not be
/// hidden: they come back sooner than spaced, and the line says why.
#[test]
fn records_that_could_not_be_hidden_are_warned_of_and_the_others_are_not() {
    let (logged, _guard) = crate::test_log::capture();
    super::spacing::log_hides(&[Ok(()), Ok(())], 2);
    let all = logged.text();
    assert!(all.contains("INFO") && !all.contains("WARN"), "{all}");
    let refused = ProcessError::new(ErrorClass::Throttled, "slow down");
    super::spacing::log_hides(&[Ok(()), Err(refused)], 2);
    let some = logged.text()[all.len()..].to_string();
    assert!(
        some.contains("WARN") && some.contains("slow down"),
        "{some}"
    );
    assert!(
        some.contains("hidden=1") && some.contains("returned=2"),
        "{some}"
    );
}

/// A failed record is logged with what finds it (message and item ids, receive count,
/// class, signature) and what happened to it, never its body: the line is all an
/// operator has of a record returned for retry.
#[test]
fn a_failed_record_is_logged_with_its_ids_class_and_signature_never_its_body() {
    let (logged, _guard) = crate::test_log::capture();
    let item = WorkItem {
        item_id: "order-7".to_string(),
        receive_count: 3,
        ..WorkItem::new("m-1", "{\"card\":\"4111-secret\"}")
    };
    let error = ProcessError::new(ErrorClass::Throttled, "slow down");
    log_failure(&item, &error, "returned for retry");
    let text = logged.text();
    let signature = error_signature(ErrorClass::Throttled, "slow down");
    for part in [
        "WARN".to_string(),
        "record failed: returned for retry".to_string(),
        "message_id=m-1".to_string(),
        "item_id=order-7".to_string(),
        "receive_count=3".to_string(),
        format!("body_bytes={}", item.body.len()),
        format!("error_class={}", ErrorClass::Throttled),
        format!("error_signature={signature}"),
    ] {
        assert!(text.contains(&part), "{part} in {text}");
    }
    assert!(!text.contains("4111-secret"), "{text}");
}

/// The spacing of a queue's receives is warned of when it leaves the last delivery no
/// visibility timeout inside the retention: the spacing and that timeout together
/// outlast it, not the spacing less the timeout (which hid the warning from a queue
/// whose failing messages are dead-lettered before their receives are spent).
#[tokio::test]
async fn a_spacing_that_leaves_the_last_delivery_no_room_in_the_retention_is_warned_of() {
    let policy = crate::redelivery::RedeliveryPolicy {
        base: Duration::from_secs(60),
        multiplier: 3,
        max: Duration::from_secs(3600),
    };
    // Five receives: 30 + 90 + 270 + 810 s of spacing at least; each delivery 600 s.
    assert_eq!(policy.least_span(5), Duration::from_secs(1_200));
    for (retention, warned) in [(1_500, true), (1_800, false)] {
        let (logged, _guard) = crate::test_log::capture();
        let timing = crate::redelivery::QueueTiming {
            retention: Duration::from_secs(retention),
            visibility_timeout: Duration::from_secs(600),
        };
        let config = BatchConfig {
            max_receive_count: Some(5),
            ..BatchConfig::default()
        };
        let engine = BatchProcessor::new(
            crate::testing::ScriptedProcessor::new(),
            crate::testing::MemorySink::new(),
            config,
        )
        .with_redelivery(policy, Arc::new(Timing(timing)));
        let event: SqsEvent = serde_json::from_value(serde_json::json!({"Records": [{
            "messageId": "m-1",
            "receiptHandle": "rh-1",
            "body": "{\"id\":\"a\"}",
            "attributes": {"ApproximateReceiveCount": "1"},
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
        }]}))
        .unwrap();
        engine
            .process_batch(
                event,
                Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        let text = logged.text();
        assert_eq!(
            text.contains("outlasts its retention"),
            warned,
            "retention {retention} s: {text}"
        );
    }
}

/// What a handler saw of its record's context.
#[derive(Debug, Default)]
struct SeesItsContext(std::sync::Mutex<Vec<(Option<std::time::SystemTime>, Option<Duration>)>>);

impl Processor for SeesItsContext {
    async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let seen = (crate::context::deadline(), crate::context::remaining());
        self.0.lock().unwrap().push(seen);
        Ok(Outcome::Done)
    }
}

/// A handler's deadline and the time it has left are read by the engine's clock: under a
/// clock that follows tokio's paused clock from the year 2000, the deadline is in 2000 and
/// the time left is what tokio's clock has left of it (by the system clock that deadline
/// would have passed long ago).
#[tokio::test(start_paused = true)]
async fn a_records_context_reads_the_engines_clock() {
    let start = chrono::DateTime::from_timestamp(946_684_800, 0).unwrap();
    let engine = BatchProcessor::new(
        SeesItsContext::default(),
        crate::testing::MemorySink::new(),
        BatchConfig::default().with_clock(Clock::following_tokio(start)),
    );
    let event: SqsEvent = serde_json::from_value(serde_json::json!({"Records": [{
        "messageId": "m-1",
        "body": "{\"id\":\"a\"}",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
    }]}))
    .unwrap();
    engine
        .process_batch(
            event,
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let seen = engine.processor().0.lock().unwrap().clone();
    let cutoff = std::time::SystemTime::from(start + chrono::Duration::seconds(29));
    assert_eq!(seen, [(Some(cutoff), Some(Duration::from_secs(19)))]);
}
