//! The redrive function as the circuit breaker's probe: its lock lasts as long as its probe
//! run can, so no worker sandbox probes beside it, and a probe cut at the run's deadline
//! opens the breaker again. Real time where the breaker compares wall-clock times.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sqs_keeper_core::WorkItem;
use sqs_keeper_core::{breaker::Breaker, breaker::BreakerPolicy, breaker::BreakerStore};
use sqs_keeper_core::{
    redrive, redrive::RedriveEngine, redrive::RedriveRequest, redrive::RedriveSettings,
};
use sqs_keeper_core::{testing::dead_record, testing::MemoryBreakerStore, testing::MemoryStore};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_core::{Outcome, Processor};

/// The downstream, shared by the redrive function and a worker sandbox: each call takes
/// `latency` and succeeds; the most calls in flight at once is kept.
#[derive(Clone, Default)]
struct Downstream {
    latency: Duration,
    in_flight: Arc<AtomicU32>,
    most_in_flight: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
}

impl Processor for Downstream {
    async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(Outcome::Done)
    }

    fn attempt_timeout(&self) -> Option<Duration> {
        Some(self.latency + Duration::from_millis(100))
    }
}

/// Guarantee 10 / docs §7: "Past the open period one sandbox takes the probe (conditional on
/// no probe running; locked for the configured time and at least as long as the probe's
/// call can run, so two probes never overlap)", and a scheduled redrive "is itself the
/// probe".
///
/// The redrive function's probe (`redrive_function::gate`) once took the probe lock for
/// `policy.probe_for` only, not for as long as its probe item can run (attempts × the
/// downstream timeout + backoff, up to the run's deadline): with probe_for a fixed 60 s and
/// one item's attempts taking e.g. 3 × 30 s, a worker sandbox found the lock lapsed and
/// probed beside it. Scaled down here: `probe_for` 200 ms, the probe's call 600 ms, a run
/// without a deadline (bounded by its item's lease); a worker sandbox coming at 300 ms must be
/// refused.
#[tokio::test]
async fn a_redrive_probe_longer_than_probe_for_holds_the_lock_until_it_ends() {
    let policy = BreakerPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_millis(100),
        max_open: Duration::from_secs(10),
        probe_for: Duration::from_millis(200),
        refresh: Duration::ZERO,
    };
    let breaker = MemoryBreakerStore::default();
    let now = SystemTime::now();
    // Opened a while ago; its open period is over: half-open, no probe running.
    assert!(breaker
        .open(
            now - Duration::from_millis(10),
            1,
            now - Duration::from_secs(1)
        )
        .await
        .unwrap());
    let downstream = Downstream {
        latency: Duration::from_millis(600),
        ..Downstream::default()
    };
    // The redrive function: one dead item of a transient class (eligible).
    let store = MemoryStore::new();
    store.insert_dead_lettered(dead_record("a", ErrorClass::Throttled, 1));
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(store, Some(downstream.clone()), settings);
    let request = RedriveRequest::default();
    // A worker sandbox behind the same breaker.
    let sandbox = Breaker::new(downstream.clone(), breaker.clone(), policy);
    let item = WorkItem::new("m-worker", "{}");
    let progress = redrive::no_progress();
    let (report, worker) = tokio::join!(
        sqs_keeper_lambda::redrive_function::run_gated(
            &engine,
            Some((&breaker, &policy)),
            &request,
            None,
            &*progress,
        ),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            sandbox.process(&item).await
        }
    );
    let report = report.unwrap();
    assert_eq!(report.succeeded, 1, "the redrive's probe ran: {report:?}");
    assert_eq!(
        downstream.most_in_flight.load(Ordering::SeqCst),
        1,
        "two probes ran at once (the redrive's, still in its call, and a worker's that took \
         the lapsed lock); the worker's answer: {worker:?}; downstream calls: {}",
        downstream.calls.load(Ordering::SeqCst)
    );
}

/// Guarantee 6 / docs §7: "a transient failure or a probe cut at the cut-off opens it again"
/// — for the redrive function's probe: "a transient failure opens it again".
///
/// The redrive's probe item is cut at the run's deadline (the downstream hangs): the
/// breaker opens again for twice as long (`opens` 2, which the polling control counts),
/// rather than being left half-open for the next record to probe at once.
#[tokio::test(start_paused = true)]
async fn a_redrive_probe_cut_at_its_deadline_opens_the_breaker_again() {
    let (breaker, policy) = half_open_breaker().await;
    // A downstream that hangs (far longer than the run's deadline).
    let downstream = Downstream {
        latency: Duration::from_secs(3600),
        ..Downstream::default()
    };
    let store = MemoryStore::new();
    store.insert_dead_lettered(dead_record("a", ErrorClass::Throttled, 1));
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(store, Some(downstream.clone()), settings);
    let request = RedriveRequest::default();
    // The redrive function's deadline (items are cut 25 s before it); tokio's clock is
    // paused, so the hang and the cut take no real time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let report = sqs_keeper_lambda::redrive_function::run_gated(
        &engine,
        Some((&breaker, &policy)),
        &request,
        Some(deadline),
        &*redrive::no_progress(),
    )
    .await
    .unwrap();
    assert_eq!(downstream.calls.load(Ordering::SeqCst), 1, "{report:?}");
    let after = breaker.state();
    assert!(
        after.is_open(SystemTime::now()) && after.opens == 2,
        "the redrive's probe hung and was cut, yet the breaker was not opened again: {after:?}; \
         report items: {:?}",
        report.items
    );
}

/// Issue: a redrive probe run that reprocessed nothing (nothing eligible, or an item
/// skipped) held the probe lock for as long as a probe run can last (about 15 minutes), so
/// every worker sandbox refused every record though the downstream was healthy. The run
/// gives the probe back: the next caller probes at once.
#[tokio::test]
async fn a_redrive_probe_run_that_reprocessed_nothing_gives_the_probe_back() {
    let policy = BreakerPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_millis(100),
        max_open: Duration::from_secs(10),
        probe_for: Duration::from_secs(60),
        refresh: Duration::ZERO,
    };
    let downstream = Downstream::default();
    // Nothing eligible: the only dead item is a validation failure (skipped unless forced).
    for records in [vec![], vec![dead_record("v", ErrorClass::Validation, 1)]] {
        let breaker = MemoryBreakerStore::default();
        let now = SystemTime::now();
        assert!(breaker
            .open(
                now - Duration::from_millis(10),
                1,
                now - Duration::from_secs(1)
            )
            .await
            .unwrap());
        let store = MemoryStore::new();
        for record in records {
            store.insert_dead_lettered(record);
        }
        let engine =
            RedriveEngine::new(store, Some(downstream.clone()), RedriveSettings::default());
        let report = sqs_keeper_lambda::redrive_function::run_gated(
            &engine,
            Some((&breaker, &policy)),
            &RedriveRequest::default(),
            None,
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
        assert_eq!(report.succeeded, 0, "{report:?}");
        // A worker sandbox comes next: it may probe, and its success closes the breaker.
        let sandbox = Breaker::new(downstream.clone(), breaker.clone(), policy);
        let answer = sandbox.process(&WorkItem::new("m-worker", "{}")).await;
        assert!(answer.is_ok(), "the worker was refused: {answer:?}");
        assert!(!breaker.state().is_open(SystemTime::now()));
        assert_eq!(breaker.state().opens, 0, "closed by the worker's probe");
    }
}

/// Issue: with `WORKER_BREAKER_SCOPE=message-group` the redrive was gated by the function's
/// breaker only, and reprocessed a tenant whose own breaker was open. Behind its group's
/// breaker (the redrive processor's `Grouped`), that tenant's item is held back unchanged,
/// and the other tenant's is reprocessed.
#[tokio::test]
async fn a_redrive_holds_back_a_tenant_whose_own_breaker_is_open() {
    let policy = BreakerPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_secs(60),
        max_open: Duration::from_secs(600),
        probe_for: Duration::from_secs(60),
        refresh: Duration::ZERO,
    };
    let open_tenant = MemoryBreakerStore::default();
    let now = SystemTime::now();
    assert!(open_tenant
        .open(now + Duration::from_secs(60), 1, now)
        .await
        .unwrap());
    let healthy = MemoryBreakerStore::default();
    let downstream = Downstream::default();
    let grouped = sqs_keeper_core::breaker::GroupBreakers::new(
        downstream.clone(),
        move |group: Option<&str>| match group {
            Some("tenant-a") => open_tenant.clone(),
            _ => healthy.clone(),
        },
        policy,
    );
    let store = MemoryStore::new();
    for (id, group) in [("a", "tenant-a"), ("b", "tenant-b")] {
        let mut record = dead_record(id, ErrorClass::Throttled, 1);
        record.source.message_group_id = Some(group.to_string());
        store.insert_dead_lettered(record);
    }
    let before = store.record("a").unwrap();
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(store, Some(grouped), settings);
    let report = engine
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(report.succeeded, 1, "{report:?}");
    assert_eq!(report.held_by_group_breaker, 1, "{report:?}");
    assert_eq!(
        downstream.calls.load(Ordering::SeqCst),
        1,
        "tenant-b's only"
    );
    let after = engine.store().record("a").unwrap();
    assert_eq!(after.status, sqs_keeper_core::dead_letter::ItemStatus::Dead);
    assert_eq!(
        after.failure_count, before.failure_count,
        "no failure appended"
    );
    assert!(
        engine.store().lease_owner("a").is_none(),
        "its lease given back"
    );
}

/// Issue: a run the breaker held back wrote no `OldestDeadRecordAgeSeconds`, so the DLQ age
/// alarm (which watches it under a redrive schedule) went quiet through an outage. A held
/// run reports the age too.
#[tokio::test]
async fn a_run_the_breaker_holds_back_still_reports_the_oldest_dead_age() {
    let policy = BreakerPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_secs(60),
        max_open: Duration::from_secs(600),
        probe_for: Duration::from_secs(60),
        refresh: Duration::ZERO,
    };
    let breaker = MemoryBreakerStore::default();
    let now = SystemTime::now();
    assert!(breaker
        .open(now + Duration::from_secs(60), 1, now)
        .await
        .unwrap());
    let store = MemoryStore::new();
    store.insert_dead_lettered(dead_record("old", ErrorClass::Throttled, 5));
    let engine = RedriveEngine::new(
        store,
        Some(Downstream::default()),
        RedriveSettings::default(),
    );
    let report = sqs_keeper_lambda::redrive_function::run_gated(
        &engine,
        Some((&breaker, &policy)),
        &RedriveRequest::default(),
        None,
        &*redrive::no_progress(),
    )
    .await
    .unwrap();
    assert!(report.held_by_breaker.is_some(), "{report:?}");
    let age = report
        .oldest_dead_age_secs
        .expect("the age of the oldest dead record");
    assert!((5 * 3_600 - 60..=5 * 3_600 + 60).contains(&age), "{age}");
}

/// Guarantee 4: a probe run that reprocessed nothing gives the probe lock back. A run that
/// ends in an error after the gate took the probe (here an invalid `since`, found only by
/// the run's plan; a table scan that fails does the same) reprocessed nothing, yet keeps
/// the lock for as long as a probe run can last: the next worker sandbox is refused.
#[tokio::test]
async fn a_probe_run_that_errors_gives_the_probe_back() {
    let policy = BreakerPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_millis(100),
        max_open: Duration::from_secs(10),
        probe_for: Duration::from_secs(60),
        refresh: Duration::ZERO,
    };
    let downstream = Downstream::default();
    let breaker = MemoryBreakerStore::default();
    let now = SystemTime::now();
    assert!(breaker
        .open(
            now - Duration::from_millis(10),
            1,
            now - Duration::from_secs(1)
        )
        .await
        .unwrap());
    let store = MemoryStore::new();
    store.insert_dead_lettered(dead_record("a", ErrorClass::Throttled, 1));
    let engine = RedriveEngine::new(store, Some(downstream.clone()), RedriveSettings::default());
    let request = RedriveRequest {
        since: Some("not a time".into()),
        ..RedriveRequest::default()
    };
    let run = sqs_keeper_lambda::redrive_function::run_gated(
        &engine,
        Some((&breaker, &policy)),
        &request,
        None,
        &*redrive::no_progress(),
    )
    .await;
    assert!(run.is_err(), "{run:?}");
    assert_eq!(downstream.calls.load(Ordering::SeqCst), 0);
    let sandbox = Breaker::new(downstream.clone(), breaker.clone(), policy);
    let answer = sandbox.process(&WorkItem::new("m-worker", "{}")).await;
    assert!(
        answer.is_ok(),
        "the worker was refused: the errored probe run kept the lock: {answer:?}; breaker: {:?}",
        breaker.state()
    );
}

/// Guarantee 3: the redrive function takes `{"continuation_token": ...}` alone (README).
/// The token carries a dry run of the throttled items only. Behind a half-open breaker, the gate judges
/// the raw request (dry_run false, no selection), and its probe drops the token: it
/// reprocesses, for real, an item the token's request never selected.
#[tokio::test]
async fn a_function_continuation_of_a_dry_run_never_reprocesses() {
    let policy = BreakerPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_millis(100),
        max_open: Duration::from_secs(10),
        probe_for: Duration::from_secs(60),
        refresh: Duration::ZERO,
    };
    let downstream = Downstream::default();
    let store = MemoryStore::new();
    for id in ["a", "b"] {
        store.insert_dead_lettered(dead_record(id, ErrorClass::Throttled, 1));
    }
    store.insert_dead_lettered(dead_record("z", ErrorClass::ServerError, 2));
    let engine = RedriveEngine::new(store, Some(downstream.clone()), RedriveSettings::default());
    // The first run: a dry run of the throttled items, one at a time (the breaker closed).
    let first = engine
        .run(
            &RedriveRequest {
                error_class: Some(ErrorClass::Throttled),
                dry_run: true,
                max_items: Some(1),
                ..RedriveRequest::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    let token = first.continuation_token.expect("a token");
    // The breaker is half-open when the continuation arrives, as the function's JSON.
    let breaker = MemoryBreakerStore::default();
    let now = SystemTime::now();
    assert!(breaker
        .open(
            now - Duration::from_millis(10),
            1,
            now - Duration::from_secs(1)
        )
        .await
        .unwrap());
    let request =
        RedriveRequest::from_json(&format!("{{\"continuation_token\":\"{token}\"}}")).unwrap();
    let report = sqs_keeper_lambda::redrive_function::run_gated(
        &engine,
        Some((&breaker, &policy)),
        &request,
        None,
        &*redrive::no_progress(),
    )
    .await
    .unwrap();
    let z = engine.store().record("z").unwrap();
    assert_eq!(
        downstream.calls.load(Ordering::SeqCst),
        0,
        "a dry run's continuation reprocessed items; z now {:?}; report {report:?}",
        z.status
    );
}

/// A breaker whose open period just ended (half-open, no probe), with a short policy.
async fn half_open_breaker() -> (MemoryBreakerStore, BreakerPolicy) {
    let policy = BreakerPolicy {
        threshold: 3,
        window: Duration::from_secs(60),
        open_for: Duration::from_millis(100),
        max_open: Duration::from_secs(10),
        probe_for: Duration::from_millis(200),
        refresh: Duration::ZERO,
    };
    let breaker = MemoryBreakerStore::default();
    let now = SystemTime::now();
    assert!(breaker
        .open(
            now - Duration::from_millis(10),
            1,
            now - Duration::from_secs(1)
        )
        .await
        .unwrap());
    (breaker, policy)
}

/// A scheduled redrive run, one attempt per item, over `store` through `processor`,
/// gated by a breaker whose open period just ended: its report and the breaker's state
/// after it.
async fn probe_run(
    store: MemoryStore,
    processor: sqs_keeper_core::testing::ScriptedProcessor,
) -> (
    sqs_keeper_core::redrive::RedriveReport,
    sqs_keeper_core::breaker::BreakerState,
) {
    let (breaker, policy) = half_open_breaker().await;
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(store, Some(processor), settings);
    let progress = redrive::no_progress();
    let report = sqs_keeper_lambda::redrive_function::run_gated(
        &engine,
        Some((&breaker, &policy)),
        &RedriveRequest::default(),
        None,
        &*progress,
    )
    .await
    .unwrap();
    (report, breaker.read().await.unwrap())
}

/// Guarantee 10 / docs §7, the redrive as the probe: an eligible item that tells nothing
/// of the downstream (its handler panics) is the oldest, so every run took it as the
/// probe, gave the probe back, and stopped: the breaker stayed half-open and no other item
/// was ever redriven (found by the simulation, seed 88386). The probe run now goes on to
/// the next item, and its success closes the breaker.
#[tokio::test]
async fn a_probe_item_that_tells_nothing_of_the_downstream_gives_way_to_the_next() {
    use sqs_keeper_core::testing::{ScriptedProcessor, Step};
    let store = MemoryStore::new();
    store.insert_dead_lettered(dead_record("panics", ErrorClass::Unknown, 3));
    store.insert_dead_lettered(dead_record("heals", ErrorClass::Throttled, 2));
    store.insert_dead_lettered(dead_record("later", ErrorClass::Throttled, 1));
    let processor = ScriptedProcessor::new().script("panics", vec![Step::Panic]);
    let (report, state) = probe_run(store, processor).await;
    assert_eq!(report.succeeded, 2, "both others redriven: {report:?}");
    assert!(report.failed_again >= 1, "{report:?}");
    assert!(
        !state.is_open(SystemTime::now()) && !state.is_half_open(SystemTime::now()),
        "closed by the second probe item: {state:?}"
    );
}

/// Simulation seed 2776: the probe item was resolved from its completed idempotency key
/// during an outage (nothing reached the downstream), and the gate closed the breaker on
/// it. An item resolved with nothing done says nothing of the downstream: the probe run
/// takes the next item, whose failure opens the breaker again.
#[tokio::test]
async fn a_probe_item_resolved_with_nothing_done_decides_nothing() {
    use sqs_keeper_core::testing::{ScriptedProcessor, Step};
    let store = MemoryStore::new();
    store.insert_dead_lettered(dead_record("done-before", ErrorClass::Throttled, 3));
    store.insert_dead_lettered(dead_record("still-down", ErrorClass::Throttled, 2));
    let processor = ScriptedProcessor::new()
        .script("done-before", vec![Step::Skip])
        .script(
            "still-down",
            vec![Step::Error(ProcessError::from_http_status(503, "down"))],
        );
    let (report, state) = probe_run(store, processor).await;
    assert_eq!(report.succeeded, 1, "{report:?}");
    assert!(
        state.is_open(SystemTime::now()),
        "the downstream's 503 decided the probe, not the skipped item: {state:?}"
    );
}

/// A downstream answering 208 (it had done the item before) answered: the probe item
/// closes the breaker. Counted as resolved with nothing done, it left the breaker
/// half-open, and every run redrove five items until another probe closed it.
#[tokio::test]
async fn a_probe_item_the_downstream_answers_already_done_closes_the_breaker() {
    use sqs_keeper_core::testing::{ScriptedProcessor, Step};
    let store = MemoryStore::new();
    store.insert_dead_lettered(dead_record("done-downstream", ErrorClass::Throttled, 2));
    let processor = ScriptedProcessor::new().script("done-downstream", vec![Step::AlreadyDone]);
    let (report, state) = probe_run(store, processor).await;
    assert_eq!(report.succeeded, 1, "{report:?}");
    assert_eq!(report.resolved_with_nothing_done, 0, "{report:?}");
    let now = SystemTime::now();
    assert!(
        !state.is_open(now) && !state.is_half_open(now),
        "the downstream answered the probe: {state:?}"
    );
}
