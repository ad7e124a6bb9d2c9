//! The invocation's cut-off against the layers around a handler: an attempt cut there is
//! still seen by the circuit breaker (counted, a cut probe reopens it), and an idempotency
//! completion that starts just before it is written rather than cut (docs/ARCHITECTURE.md
//! §1.7, §7). Without I/O, on tokio's paused clock.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, SystemTime};

use serde_json::json;
use sqs_worker::batch::{BatchConfig, BatchProcessor, Disposition};
use sqs_worker::breaker::{Breaker, BreakerPolicy, BreakerStore};
use sqs_worker::dead_letter::InvocationInfo;
use sqs_worker::error::{ErrorClass, ProcessError};
use sqs_worker::idempotency::{Claim, Idempotency, IdempotencyStore, Idempotent};
use sqs_worker::processor::Processor;
use sqs_worker::testing::{
    MemoryBreakerStore, MemoryIdempotencyStore, MemorySink, ScriptedProcessor, Step,
};
use sqs_worker::Deadline;

fn event(ids: &[&str]) -> aws_lambda_events::sqs::SqsEvent {
    serde_json::from_value(json!({"Records": ids.iter().map(|id| json!({
        "messageId": format!("m-{id}"),
        "receiptHandle": format!("rh-{id}"),
        "body": json!({"id": id}).to_string(),
        "attributes": {"ApproximateReceiveCount": "1"},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
    })).collect::<Vec<_>>()}))
    .unwrap()
}

async fn run<P: Processor>(processor: P, ids: &[&str]) -> Vec<Disposition> {
    let mut config = BatchConfig::default();
    config.parser.id_source = "pointer:/id".parse().unwrap();
    config.retry.max_attempts = 3;
    let engine = BatchProcessor::new(processor, MemorySink::new(), config);
    // Cut-off 1 s from now, hard stop 0.75 s after it.
    let report = engine
        .process_batch(
            event(ids),
            Deadline::after(Duration::from_secs(2), Duration::from_secs(1)),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    report.records.into_iter().map(|r| r.disposition).collect()
}

fn policy() -> BreakerPolicy {
    BreakerPolicy {
        threshold: 1,
        window: Duration::from_secs(60),
        open_for: Duration::from_secs(30),
        max_open: Duration::from_secs(900),
        probe_for: Duration::from_secs(60),
        refresh: Duration::from_secs(1),
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_cut_at_the_cutoff_count_towards_opening_the_breaker() {
    let store = MemoryBreakerStore::default();
    let hangs = ScriptedProcessor::new().script("a", vec![Step::Sleep(Duration::from_secs(3600))]);
    let outcome = run(Breaker::new(hangs, store.clone(), policy()), &["a"]).await;
    assert!(
        matches!(
            outcome[0],
            Disposition::RetryLater {
                class: ErrorClass::Timeout
            }
        ),
        "{outcome:?}"
    );
    let state = store.state();
    assert_eq!(state.failures, 1, "{state:?}");
    assert!(
        state.is_open(SystemTime::now()),
        "a hanging downstream at threshold 1 must open it: {state:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_probe_cut_at_the_cutoff_reopens_the_breaker() {
    let store = MemoryBreakerStore::default();
    let now = SystemTime::now();
    // Opened once, its open period over: the next record is the probe.
    assert!(store
        .open(
            now - Duration::from_secs(1),
            1,
            now - Duration::from_secs(31)
        )
        .await
        .unwrap());
    let hangs = ScriptedProcessor::new().script("a", vec![Step::Sleep(Duration::from_secs(3600))]);
    run(Breaker::new(hangs, store.clone(), policy()), &["a"]).await;
    let state = store.state();
    assert!(state.is_open(SystemTime::now()), "{state:?}");
    assert_eq!(state.opens, 2, "{state:?}");
}

/// An idempotency store whose completion takes 60 ms.
#[derive(Clone, Default)]
struct SlowCompletion(MemoryIdempotencyStore);

impl IdempotencyStore for SlowCompletion {
    async fn claim(
        &self,
        key: &str,
        token: &str,
        until: SystemTime,
        now: SystemTime,
    ) -> Result<Claim, ProcessError> {
        self.0.claim(key, token, until, now).await
    }
    async fn complete(
        &self,
        key: &str,
        token: &str,
        result: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), ProcessError> {
        tokio::time::sleep(Duration::from_millis(60)).await;
        self.0.complete(key, token, result, expires_at).await
    }
    async fn release(&self, key: &str, token: &str) -> Result<(), ProcessError> {
        self.0.release(key, token).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_completion_started_before_the_cutoff_is_written() {
    let store = SlowCompletion::default();
    // Done 1 ms before the cut-off; its completion takes 60 ms.
    let handler =
        ScriptedProcessor::new().script("a", vec![Step::Sleep(Duration::from_millis(999))]);
    let idempotent = Idempotent::new(
        handler,
        Idempotency::new(store.clone(), Duration::from_secs(3600)),
    );
    let outcome = run(idempotent, &["a"]).await;
    assert_eq!(outcome, [Disposition::Done]);
    assert!(
        store.0.is_completed("a"),
        "the side effect happened; its completion must be recorded"
    );
}

#[tokio::test(start_paused = true)]
async fn work_cut_at_the_cutoff_releases_its_claim() {
    let store = SlowCompletion::default();
    let handler =
        ScriptedProcessor::new().script("a", vec![Step::Sleep(Duration::from_secs(3600))]);
    let idempotent = Idempotent::new(
        handler,
        Idempotency::new(store.clone(), Duration::from_secs(3600)),
    );
    let outcome = run(idempotent, &["a"]).await;
    assert!(
        matches!(
            outcome[0],
            Disposition::RetryLater {
                class: ErrorClass::Timeout
            }
        ),
        "{outcome:?}"
    );
    assert!(!store.0.is_completed("a"));
    // Released: the next delivery claims it at once.
    let now = SystemTime::now();
    let claim = store
        .0
        .claim("a", "next", now + Duration::from_secs(60), now)
        .await
        .unwrap();
    assert_eq!(claim, Claim::Claimed);
}
