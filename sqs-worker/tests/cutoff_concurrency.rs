//! The cut-off (docs/ARCHITECTURE.md §1.7) against concurrent work in one record: no new
//! work starts past it (a stream's next item is neither claimed nor run), work running
//! beside a layer's bookkeeping ends with that bookkeeping, and bookkeeping that hangs ends
//! at the hard stop. Paused tokio clock, no I/O.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use serde_json::json;
use sqs_worker::batch::{BatchConfig, BatchProcessor, Disposition};
use sqs_worker::breaker::{Breaker, BreakerPolicy};
use sqs_worker::dead_letter::InvocationInfo;
use sqs_worker::error::{ErrorClass, ProcessError};
use sqs_worker::idempotency::{Claim, Idempotency, IdempotencyStore};
use sqs_worker::item::WorkItem;
use sqs_worker::processor::{Outcome, Processor};
use sqs_worker::testing::{MemoryBreakerStore, MemoryIdempotencyStore, MemorySink};
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

/// Cut-off 1 s from now, hard stop 0.75 s after it.
async fn run<P: Processor>(processor: P, ids: &[&str]) -> Vec<Disposition> {
    let mut config = BatchConfig::default();
    config.parser.id_source = "pointer:/id".parse().unwrap();
    config.retry.max_attempts = 1;
    let engine = BatchProcessor::new(processor, MemorySink::new(), config);
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
        threshold: 1000,
        window: Duration::from_secs(60),
        open_for: Duration::from_secs(30),
        max_open: Duration::from_secs(900),
        probe_for: Duration::from_secs(60),
        refresh: Duration::from_secs(1),
    }
}

/// Completion takes `complete_ms`, release `release_ms`.
#[derive(Clone, Default)]
struct Slow {
    inner: MemoryIdempotencyStore,
    complete_ms: u64,
    release_ms: u64,
}

impl IdempotencyStore for Slow {
    async fn claim(
        &self,
        key: &str,
        token: &str,
        until: SystemTime,
        now: SystemTime,
    ) -> Result<Claim, ProcessError> {
        self.inner.claim(key, token, until, now).await
    }
    async fn complete(
        &self,
        key: &str,
        token: &str,
        result: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), ProcessError> {
        tokio::time::sleep(Duration::from_millis(self.complete_ms)).await;
        self.inner.complete(key, token, result, expires_at).await
    }
    async fn release(&self, key: &str, token: &str) -> Result<(), ProcessError> {
        tokio::time::sleep(Duration::from_millis(self.release_ms)).await;
        self.inner.release(key, token).await
    }
}

/// One side effect per recipient, two at a time (`buffer_unordered(2)`), ten recipients,
/// each behind idempotency; every work hangs. Records when each work *started*.
struct FanOutTen {
    idempotency: Idempotency<Slow>,
    started: Arc<Mutex<Vec<tokio::time::Instant>>>,
}

impl Processor for FanOutTen {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let results: Vec<Result<_, ProcessError>> = futures::stream::iter(0..10)
            .map(|n| {
                let key = format!("{}-{n}", item.item_id);
                let started = self.started.clone();
                async move {
                    self.idempotency
                        .once(&key, || async move {
                            // The side effect begins at the first poll (a request sent).
                            started.lock().unwrap().push(tokio::time::Instant::now());
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            Ok::<_, ProcessError>(())
                        })
                        .await
                }
            })
            .buffer_unordered(2)
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(Outcome::Done)
    }
}

/// §1.7: "No record, attempt or retry sleep starts after the cut-off; an attempt still
/// running there is cut". At the cut-off the two running works are cut and their claims
/// released (10 ms each). While a release runs, `buffer_unordered` pulls the next recipient:
/// a new claim is written and a new user work is *started* past the cut-off, cut, released,
/// and so on down the whole list.
#[tokio::test(start_paused = true)]
async fn no_new_user_work_starts_after_the_cutoff_under_buffer_unordered() {
    let t0 = tokio::time::Instant::now();
    let cutoff = t0 + Duration::from_secs(1);
    let started = Arc::new(Mutex::new(Vec::new()));
    let store = Slow {
        release_ms: 10,
        complete_ms: 10,
        ..Slow::default()
    };
    let handler = FanOutTen {
        idempotency: Idempotency::new(store.clone(), Duration::from_secs(3600)),
        started: started.clone(),
    };
    let outcome = run(
        Breaker::new(handler, MemoryBreakerStore::default(), policy()),
        &["a"],
    )
    .await;
    assert!(
        matches!(
            outcome[0],
            Disposition::RetryLater {
                class: ErrorClass::Timeout
            }
        ),
        "{outcome:?}"
    );
    let started = started.lock().unwrap().clone();
    let late: Vec<_> = started
        .iter()
        .filter(|t| **t >= cutoff)
        .map(|t| *t - cutoff)
        .collect();
    assert!(
        late.is_empty(),
        "{} of {} user works started after the cut-off (at cut-off + {:?})",
        late.len(),
        started.len(),
        late
    );
}

/// A record whose handler runs two things at once: an idempotent side effect that ends
/// just before the cut-off (its completion then takes `complete_ms`), and the user's own
/// loop of plain downstream calls, every 10 ms.
struct SideBySide {
    idempotency: Idempotency<Slow>,
    calls_after_cutoff: Arc<AtomicU32>,
    cutoff: tokio::time::Instant,
}

impl Processor for SideBySide {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let once = self.idempotency.once(&item.item_id, || async {
            tokio::time::sleep(Duration::from_millis(995)).await;
            Ok::<_, ProcessError>(())
        });
        let plain = async {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                // A downstream call of the user's own.
                if tokio::time::Instant::now() > self.cutoff {
                    self.calls_after_cutoff.fetch_add(1, Ordering::SeqCst);
                }
            }
        };
        tokio::select! {
            r = once => { r?; }
            () = plain => {}
        }
        Ok(Outcome::Done)
    }
}

/// Work beside a layer's bookkeeping (here the user's own loop of calls, racing an
/// idempotent side effect whose completion takes 700 ms past the cut-off) runs while that
/// bookkeeping does, and no longer: the record's future holds both, so it ends when the
/// completion is written, well before the hard stop.
#[tokio::test(start_paused = true)]
async fn work_beside_a_layers_bookkeeping_ends_with_it() {
    let t0 = tokio::time::Instant::now();
    let cutoff = t0 + Duration::from_secs(1);
    let after = Arc::new(AtomicU32::new(0));
    let store = Slow {
        complete_ms: 700,
        ..Slow::default()
    };
    let handler = SideBySide {
        idempotency: Idempotency::new(store.clone(), Duration::from_secs(3600)),
        calls_after_cutoff: after.clone(),
        cutoff,
    };
    let outcome = run(handler, &["a"]).await;
    // The side effect happened and its completion was written: done.
    assert_eq!(outcome, [Disposition::Done]);
    let calls = after.load(Ordering::SeqCst);
    assert!(calls <= 70, "{calls} calls past the cut-off");
    assert!(
        t0.elapsed() < Duration::from_millis(1710),
        "{:?}",
        t0.elapsed()
    );
}

/// A completion write that hangs ends at the hard stop, and the batch answers before the
/// deadline.
#[tokio::test(start_paused = true)]
async fn a_hanging_completion_ends_at_the_hard_stop() {
    let t0 = tokio::time::Instant::now();
    let store = Slow {
        complete_ms: 3_600_000,
        ..Slow::default()
    };
    let handler = SideBySide {
        idempotency: Idempotency::new(store, Duration::from_secs(3600)),
        calls_after_cutoff: Arc::new(AtomicU32::new(0)),
        cutoff: t0 + Duration::from_secs(1),
    };
    let outcome = run(handler, &["a"]).await;
    assert!(
        t0.elapsed() <= Duration::from_millis(1750),
        "{:?}",
        t0.elapsed()
    );
    assert!(outcome[0].is_reported(), "{outcome:?}");
}
