//! The retention cap on spaced redeliveries (docs/ARCHITECTURE.md §1.11), without I/O:
//! the room for a retry is judged for when the batch answers, not when the record ended,
//! and reading the queue's retention never holds the batch back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lambda_events::sqs::SqsEvent;
use futures::future::BoxFuture;
use serde_json::json;
use sqs_keeper_core::dead_letter::InvocationInfo;
use sqs_keeper_core::retry::Deadline;
use sqs_keeper_core::{batch::Disposition, BatchConfig, BatchProcessor};
use sqs_keeper_core::{
    redelivery::Hide, redelivery::QueueTiming, redelivery::RedeliveryPolicy,
    redelivery::VisibilityPort,
};
use sqs_keeper_core::{testing::MemorySink, testing::ScriptedProcessor, testing::Step};
use sqs_keeper_core::{ErrorClass, ProcessError};

struct Port {
    seen: Mutex<Vec<(SystemTime, Hide)>>,
    timing: Option<QueueTiming>,
    /// How long reading the queue's attributes takes.
    timing_takes: Duration,
    /// Reads of the queue's attributes.
    reads: std::sync::atomic::AtomicU32,
}

impl VisibilityPort for Port {
    fn hide<'a>(&'a self, records: &'a [Hide]) -> BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(async move {
            let at = SystemTime::now();
            self.seen
                .lock()
                .unwrap()
                .extend(records.iter().map(|h| (at, h.clone())));
            records.iter().map(|_| Ok(())).collect()
        })
    }
    fn queue_timing<'a>(&'a self, _queue_arn: &'a str) -> BoxFuture<'a, Option<QueueTiming>> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(self.timing_takes).await;
            self.timing
        })
    }
}

/// Records `(id, SentTimestamp)`.
fn event(records: &[(&str, SystemTime)]) -> SqsEvent {
    serde_json::from_value(json!({"Records": records.iter().map(|(id, sent)| json!({
        "messageId": format!("m-{id}"),
        "receiptHandle": format!("rh-{id}"),
        "body": json!({"id": id}).to_string(),
        "attributes": {
            "ApproximateReceiveCount": "2",
            "SentTimestamp": sent.duration_since(UNIX_EPOCH).unwrap().as_millis().to_string(),
        },
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
    })).collect::<Vec<_>>()}))
    .unwrap()
}

fn engine(
    processor: ScriptedProcessor,
    port: Arc<Port>,
) -> BatchProcessor<ScriptedProcessor, MemorySink> {
    let mut config = BatchConfig::default();
    config.parser.id_source = "pointer:/id".parse().unwrap();
    config.retry.max_attempts = 1;
    config.max_receive_count = Some(10);
    BatchProcessor::new(processor, MemorySink::new(), config).with_redelivery(
        RedeliveryPolicy {
            base: Duration::from_secs(300),
            multiplier: 3,
            max: Duration::from_secs(4 * 3600),
        },
        port,
    )
}

/// Record "a" fails at once with 1.5 s of room (retention left − visibility timeout); the
/// batch goes on 2.5 s more for record "b". Returned with the answer, "a" would come back
/// with less than a visibility timeout of retention left: it is dead-lettered instead (or,
/// if returned, its next delivery still has a whole visibility timeout).
#[tokio::test]
async fn a_record_returned_with_less_than_a_visibility_timeout_left_is_dead_lettered() {
    let vt = Duration::from_secs(2);
    let retention = Duration::from_secs(3600);
    let port = Arc::new(Port {
        seen: Mutex::new(Vec::new()),
        timing: Some(QueueTiming {
            retention,
            visibility_timeout: vt,
        }),
        timing_takes: Duration::ZERO,
        reads: Default::default(),
    });
    let processor = ScriptedProcessor::new()
        .script("a", vec![Step::Fail(ErrorClass::ServerError)])
        .script("b", vec![Step::Sleep(Duration::from_millis(2500))]);
    let engine = engine(processor, port.clone());
    let now = SystemTime::now();
    // "a" expires 3.5 s from now.
    let sent_a = now + Duration::from_millis(3500) - retention;
    let report = engine
        .process_batch(
            event(&[("a", sent_a), ("b", now)]),
            Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let answered = SystemTime::now();
    let a = &report.records[0];
    let expires = sent_a + retention;
    if a.disposition.is_reported() {
        let hide = port
            .seen
            .lock()
            .unwrap()
            .iter()
            .find(|(_, h)| h.receipt_handle == "rh-a")
            .map(|(at, h)| (*at, h.delay));
        let visible_at = hide.map_or(answered, |(at, d)| at + d);
        let left = expires.duration_since(visible_at).unwrap_or(Duration::ZERO);
        assert!(
            left >= vt,
            "\"a\" was returned ({:?}, hide {:?}) with {:?} of retention left at its next \
             delivery, less than the visibility timeout {:?}",
            a.disposition,
            hide.map(|h| h.1),
            left,
            vt
        );
    }
}

/// Hiding is an addition, never a condition: a slow `GetQueueAttributes` (throttled and
/// retried by the SDK, a degraded endpoint) holds the batch back a second at most, and a
/// failed read is not tried again by every batch.
#[tokio::test(start_paused = true)]
async fn a_slow_queue_attributes_read_does_not_stop_the_batch() {
    let port = Arc::new(Port {
        seen: Mutex::new(Vec::new()),
        timing: None,
        timing_takes: Duration::from_secs(120),
        reads: Default::default(),
    });
    let processor = ScriptedProcessor::new();
    let engine = engine(processor, port.clone());
    let now = SystemTime::now();
    for _ in 0..3 {
        let report = engine
            .process_batch(
                event(&[("a", now), ("b", now)]),
                Deadline::after(Duration::from_secs(30), Duration::from_secs(1)),
                &InvocationInfo::default(),
            )
            .await
            .unwrap();
        let dispositions: Vec<_> = report
            .records
            .iter()
            .map(|r| r.disposition.clone())
            .collect();
        assert!(
            dispositions.iter().all(|d| *d == Disposition::Done),
            "{dispositions:?}"
        );
    }
    assert_eq!(
        port.reads.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "a failed read waits a minute before it is tried again"
    );
}
