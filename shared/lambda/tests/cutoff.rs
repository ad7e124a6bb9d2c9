//! The invocation's cut-off against the layers around a handler: an attempt cut there is
//! still seen by the circuit breaker (counted, a cut probe reopens it), an idempotency
//! completion that starts just before it is written rather than cut, the user's code after
//! it and concurrent works in one record are cut, no work starts past the cut-off, and
//! bookkeeping that hangs ends at the hard stop (docs/ARCHITECTURE.md §1.7, §7). Without
//! I/O, on tokio's paused clock.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;

use serde_json::json;
use sqs_keeper_core::dead_letter::InvocationInfo;
use sqs_keeper_core::retry::Deadline;
use sqs_keeper_core::WorkItem;
use sqs_keeper_core::{batch::Disposition, BatchConfig, BatchProcessor};
use sqs_keeper_core::{breaker::Breaker, breaker::BreakerPolicy, breaker::BreakerStore};
use sqs_keeper_core::{
    idempotency::Claim, idempotency::Idempotency, idempotency::IdempotencyStore,
    idempotency::Idempotent,
};
use sqs_keeper_core::{
    testing::MemoryBreakerStore, testing::MemoryIdempotencyStore, testing::MemorySink,
    testing::ScriptedProcessor, testing::Step,
};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_core::{Outcome, Processor};

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

/// An idempotency store whose completion takes `complete_ms` and whose release takes
/// `release_ms` (and is counted).
#[derive(Clone)]
struct Slow {
    inner: MemoryIdempotencyStore,
    complete_ms: u64,
    release_ms: u64,
    releases: Arc<AtomicU32>,
}

impl Slow {
    fn new(complete_ms: u64, release_ms: u64) -> Self {
        Slow {
            inner: MemoryIdempotencyStore::default(),
            complete_ms,
            release_ms,
            releases: Arc::default(),
        }
    }
}

/// A completion of 60 ms and a release of 10 ms.
fn slow_completion() -> Slow {
    Slow::new(60, 10)
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
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(key, token).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_completion_started_before_the_cutoff_is_written() {
    let store = slow_completion();
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
        store.inner.is_completed("a"),
        "the side effect happened; its completion must be recorded"
    );
}

#[tokio::test(start_paused = true)]
async fn work_cut_at_the_cutoff_releases_its_claim() {
    let store = slow_completion();
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
    assert!(!store.inner.is_completed("a"));
    // Released: the next delivery claims it at once.
    let now = SystemTime::now();
    let claim = store
        .inner
        .claim("a", "next", now + Duration::from_secs(60), now)
        .await
        .unwrap();
    assert_eq!(claim, Claim::Claimed);
}

/// A handler in two steps: a side effect once per key, done 1 ms before the cut-off (its
/// completion then takes 60 ms), and a second step of the user's own after it.
struct TwoSteps {
    idempotency: Idempotency<Slow>,
    second_step_at: Arc<Mutex<Option<tokio::time::Instant>>>,
}

impl Processor for TwoSteps {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        self.idempotency
            .once(&item.item_id, || async {
                tokio::time::sleep(Duration::from_millis(999)).await;
                Ok::<_, ProcessError>(())
            })
            .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        *self.second_step_at.lock().unwrap() = Some(tokio::time::Instant::now());
        Ok(Outcome::Done)
    }
}

fn two_steps(store: &Slow) -> (TwoSteps, Arc<Mutex<Option<tokio::time::Instant>>>) {
    let at = Arc::new(Mutex::new(None));
    let handler = TwoSteps {
        idempotency: Idempotency::new(store.clone(), Duration::from_secs(3600)),
        second_step_at: at.clone(),
    };
    (handler, at)
}

#[tokio::test(start_paused = true)]
async fn the_users_code_after_a_completion_past_the_cutoff_is_cut() {
    let cutoff = tokio::time::Instant::now() + Duration::from_secs(1);
    let store = slow_completion();
    let (handler, second_step_at) = two_steps(&store);
    let outcome = run(handler, &["a"]).await;
    assert!(
        store.inner.is_completed("a"),
        "the completion must be written"
    );
    let at = *second_step_at.lock().unwrap();
    assert_eq!(
        at,
        None,
        "the second step ran {:?} past the cut-off",
        at.map(|t| t - cutoff)
    );
    assert!(
        matches!(
            outcome[0],
            Disposition::RetryLater {
                class: ErrorClass::Timeout
            }
        ),
        "{outcome:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn under_a_breaker_the_users_code_after_a_completion_is_cut_and_counted() {
    let breaker_store = MemoryBreakerStore::default();
    let store = slow_completion();
    let (handler, second_step_at) = two_steps(&store);
    let outcome = run(
        Breaker::new(handler, breaker_store.clone(), policy()),
        &["a"],
    )
    .await;
    assert!(store.inner.is_completed("a"));
    assert_eq!(*second_step_at.lock().unwrap(), None);
    assert!(
        matches!(
            outcome[0],
            Disposition::RetryLater {
                class: ErrorClass::Timeout
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(
        breaker_store.state().failures,
        1,
        "the cut attempt is counted"
    );
}

/// A handler that does one side effect per recipient, two at a time (`buffer_unordered`),
/// each of which hangs.
struct FanOut {
    idempotency: Idempotency<Slow>,
}

impl Processor for FanOut {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let results: Vec<Result<_, ProcessError>> = futures::stream::iter(0..2)
            .map(|n| {
                let key = format!("{}-{n}", item.item_id);
                async move {
                    self.idempotency
                        .once(&key, || async {
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

#[tokio::test(start_paused = true)]
async fn concurrent_works_in_one_record_are_each_cut_and_release_their_claims() {
    let store = slow_completion();
    let handler = FanOut {
        idempotency: Idempotency::new(store.clone(), Duration::from_secs(3600)),
    };
    let breaker_store = MemoryBreakerStore::default();
    let started = tokio::time::Instant::now();
    let outcome = run(
        Breaker::new(handler, breaker_store.clone(), policy()),
        &["a"],
    )
    .await;
    assert_eq!(
        store.releases.load(Ordering::SeqCst),
        2,
        "both claims released"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1100),
        "cut at the cut-off (1 s), not at the hard stop: {:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            outcome[0],
            Disposition::RetryLater {
                class: ErrorClass::Timeout
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(
        breaker_store.state().failures,
        1,
        "{:?}",
        breaker_store.state()
    );
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
    let store = Slow::new(10, 10);
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
    let store = Slow::new(700, 0);
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
    let store = Slow::new(3_600_000, 0);
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
