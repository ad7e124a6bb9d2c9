//! The idempotency table on DynamoDB Local, through the real SDK client: claims are atomic
//! under concurrency, completions keep their result, stale attempts cannot overwrite their
//! successors, and expired claims are taken over. Beside it, the breaker's polling marker
//! (a lease and a pause in one item of the same schema).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqs_keeper_aws::DynamoPauseMarker;
use sqs_keeper_core::{polling::PauseMarker, polling::PauseState, polling::PAUSE_LEASE};

use sqs_keeper_aws::DynamoIdempotencyStore;
use sqs_keeper_core::{
    idempotency::Claim, idempotency::Idempotency, idempotency::IdempotencyStore, idempotency::Once,
};
use sqs_keeper_lambda::ProcessError;

async fn store() -> DynamoIdempotencyStore {
    let clients = e2e::clients().await;
    let table = e2e::idempotency_table(&clients.dynamodb, "idem").await;
    DynamoIdempotencyStore::new(clients.dynamodb, table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_many_concurrent_claims_wins() {
    let store = store().await;
    let now = SystemTime::now();
    let until = now + Duration::from_secs(60);
    let claims = futures_claims(&store, "k-1", until, now, 8).await;
    let won = claims.iter().filter(|c| **c == Claim::Claimed).count();
    assert_eq!(won, 1, "{claims:?}");
    for claim in claims.iter().filter(|c| **c != Claim::Claimed) {
        let Claim::InProgress { until: held } = claim else {
            panic!("{claim:?}");
        };
        // The holder's deadline, to the millisecond.
        let gap = held.duration_since(until).unwrap_or_else(|e| e.duration());
        assert!(gap < Duration::from_millis(2), "{gap:?}");
    }
}

async fn futures_claims(
    store: &DynamoIdempotencyStore,
    key: &str,
    until: SystemTime,
    now: SystemTime,
    n: usize,
) -> Vec<Claim> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let store = store.clone();
        let key = key.to_string();
        tasks.push(tokio::spawn(async move {
            store
                .claim(&key, &format!("token-{i}"), until, now)
                .await
                .unwrap()
        }));
    }
    let mut claims = Vec::new();
    for task in tasks {
        claims.push(task.await.unwrap());
    }
    claims
}

#[tokio::test]
async fn a_completion_keeps_its_result_and_a_stale_attempt_changes_nothing() {
    let store = store().await;
    let now = SystemTime::now();
    // An attempt whose claim expired...
    assert_eq!(
        store.claim("k", "old", now, now).await.unwrap(),
        Claim::Claimed
    );
    // ...is taken over by the next one.
    let later = now + Duration::from_secs(1);
    assert_eq!(
        store
            .claim("k", "new", later + Duration::from_secs(60), later)
            .await
            .unwrap(),
        Claim::Claimed
    );
    let stale_complete = store
        .complete(
            "k",
            "old",
            Some("\"old\""),
            later + Duration::from_secs(3600),
        )
        .await
        .unwrap_err();
    assert_eq!(
        stale_complete.code.as_deref(),
        Some("ConditionalCheckFailedException")
    );
    assert!(store.release("k", "old").await.is_err());
    store
        .complete(
            "k",
            "new",
            Some("\"receipt-7\""),
            later + Duration::from_secs(3600),
        )
        .await
        .unwrap();
    assert_eq!(
        store.claim("k", "third", later, later).await.unwrap(),
        Claim::Completed {
            result: Some("\"receipt-7\"".to_string())
        }
    );
    // Once the completion has expired (TTL deletion may lag), the key is free again.
    let next_day = later + Duration::from_secs(3601);
    assert_eq!(
        store
            .claim("k", "fourth", next_day + Duration::from_secs(60), next_day)
            .await
            .unwrap(),
        Claim::Claimed
    );
}

#[tokio::test]
async fn once_returns_the_stored_result_to_a_duplicate() {
    let idempotency = Idempotency::new(store().await, Duration::from_secs(3600));
    let first = idempotency
        .once("payment-1", || async { Ok::<_, ProcessError>(41_u32 + 1) })
        .await
        .unwrap();
    assert_eq!(first, Once::Ran(42));
    let second = idempotency
        .once("payment-1", || async {
            panic!("the work must not run twice");
            #[allow(unreachable_code)]
            Ok::<u32, ProcessError>(0)
        })
        .await
        .unwrap();
    assert_eq!(second, Once::AlreadyDone(Some(42)));
    // A failed attempt releases its claim: the retry runs.
    let failed = idempotency
        .once("payment-2", || async {
            Err::<u32, _>(ProcessError::new(
                sqs_keeper_lambda::ErrorClass::ServerError,
                "gateway down",
            ))
        })
        .await;
    assert!(failed.is_err());
    let retried = idempotency
        .once("payment-2", || async { Ok::<_, ProcessError>(7_u32) })
        .await
        .unwrap();
    assert_eq!(retried, Once::Ran(7));
}

fn ms(t: SystemTime) -> SystemTime {
    // The marker keeps milliseconds.
    UNIX_EPOCH + Duration::from_millis(t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64)
}

/// The polling control's marker item (`DynamoPauseMarker`) through the real adapter: a lease
/// on a missing item, refusal while held, lapse at its end, release, the pause written and
/// read back (with and without `since`, on a fresh item too), the lease and the pause kept
/// apart by each other's writes, and two concurrent leases with one winner.
#[tokio::test]
async fn the_polling_markers_lease_and_pause() {
    let clients = e2e::clients().await;
    let table = e2e::create_table(&clients.dynamodb, "polling-marker", "id").await;
    let marker = DynamoPauseMarker::new(clients.dynamodb.clone(), &table, "breaker#w");
    let now = ms(SystemTime::now());

    assert_eq!(
        marker.read().await.unwrap(),
        PauseState::default(),
        "missing item"
    );
    assert!(
        marker.lease(now, now + PAUSE_LEASE).await.unwrap(),
        "lease on a missing item"
    );
    assert!(!marker
        .lease(now + Duration::from_secs(1), now + PAUSE_LEASE)
        .await
        .unwrap());
    // A pause written under the lease keeps the lease.
    let paused = PauseState {
        paused: true,
        sweeping: true,
        sweep_enabled: true,
        since: Some(now),
    };
    marker.write(paused).await.unwrap();
    assert_eq!(marker.read().await.unwrap(), paused);
    assert!(!marker
        .lease(now + Duration::from_secs(2), now + PAUSE_LEASE)
        .await
        .unwrap());
    // Lapses at its end.
    assert!(marker
        .lease(now + PAUSE_LEASE, now + PAUSE_LEASE * 2)
        .await
        .unwrap());
    marker.release(now + PAUSE_LEASE * 2).await.unwrap();
    assert_eq!(
        marker.read().await.unwrap(),
        paused,
        "release keeps the pause"
    );
    assert!(
        marker.lease(now, now + PAUSE_LEASE).await.unwrap(),
        "released"
    );
    marker.write(PauseState::default()).await.unwrap();
    assert_eq!(marker.read().await.unwrap(), PauseState::default());
    marker.release(now + PAUSE_LEASE).await.unwrap();

    // REMOVE of a missing attribute on a fresh item; release of a fresh item.
    let fresh = DynamoPauseMarker::new(clients.dynamodb.clone(), &table, "breaker#fresh");
    fresh.write(PauseState::default()).await.unwrap();
    assert_eq!(fresh.read().await.unwrap(), PauseState::default());
    let other = DynamoPauseMarker::new(clients.dynamodb.clone(), &table, "breaker#other");
    other.release(now).await.unwrap();
    assert!(other.lease(now, now + PAUSE_LEASE).await.unwrap());

    // Two runs at once: one lease.
    let racing = DynamoPauseMarker::new(clients.dynamodb.clone(), &table, "breaker#race");
    let (a, b) = tokio::join!(
        racing.lease(now, now + PAUSE_LEASE),
        racing.lease(now, now + PAUSE_LEASE)
    );
    assert!(
        a.unwrap() ^ b.unwrap(),
        "exactly one of two concurrent leases"
    );
}

/// A run whose lease lapsed (it ran past `PAUSE_LEASE`, or its clock was behind the next run's)
/// does not give back the lease of the run that took it over: a third run cannot start
/// beside the second.
#[tokio::test]
async fn a_lapsed_run_does_not_release_the_lease_of_the_run_that_took_it_over() {
    let clients = e2e::clients().await;
    let table = e2e::create_table(&clients.dynamodb, "polling-lease", "id").await;
    let marker = DynamoPauseMarker::new(clients.dynamodb.clone(), &table, "breaker#w");
    let t = ms(SystemTime::now());
    // Run A.
    assert!(marker.lease(t, t + PAUSE_LEASE).await.unwrap());
    // Run B, after A's lease lapsed.
    let b_at = t + PAUSE_LEASE + Duration::from_secs(1);
    assert!(marker.lease(b_at, b_at + PAUSE_LEASE).await.unwrap());
    // A finishes and gives its lease back.
    marker.release(t + PAUSE_LEASE).await.unwrap();
    // Run C, while B holds its lease.
    let c_at = b_at + Duration::from_secs(60);
    let c = marker.lease(c_at, c_at + PAUSE_LEASE).await.unwrap();
    assert!(
        !c,
        "run C took the lease while run B held it: A's release removed B's lease"
    );
}

/// A redrive reprocesses through the worker's idempotency table: an item the worker
/// completed (another message of the same item id succeeded after this one was
/// dead-lettered) is found completed and skipped, its record resolved, and the downstream
/// is not called again. Before, the redrive delivered it a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_skips_an_item_the_worker_completed() {
    use e2e::{body, Pipeline, Setup};
    use sqs_keeper_core::{
        redrive, redrive::ItemOutcomeKind, redrive::RedriveEngine, redrive::RedriveRequest,
    };
    let clients = e2e::clients().await;
    let table = e2e::idempotency_table(&clients.dynamodb, "redrive-idem").await;
    let p = Pipeline::new(
        "redrive-idem",
        Setup {
            max_receive_count: 1,
            worker_env: vec![("WORKER_IDEMPOTENCY_TABLE", table.clone())],
            ..Setup::default()
        },
    )
    .await;
    p.send(&[&body("x", "invalid")]).await;
    p.drain().await;
    assert_eq!(p.records().await.len(), 1);
    p.send(&[&body("x", "ok")]).await;
    p.drain().await;
    let calls = p.downstream.calls("x");
    // The redrive function's processor, from the same variables as the worker's.
    let env: std::collections::HashMap<String, String> = p.worker_env.iter().cloned().collect();
    let lookup = |name: &str| env.get(name).cloned();
    let mut reader = sqs_keeper_lambda::config::EnvReader::new(&lookup);
    let config = sqs_keeper_lambda::config::RedriveConfig::read(&mut reader);
    reader.finish().unwrap();
    let processor = sqs_keeper_lambda::redrive_function::redrive_processor(&config, &p.clients)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        processor,
        sqs_keeper_lambda::redrive_function::RedriveProcessor::Idempotent(_)
    ));
    // With a breaker per message group, each item goes behind its group's.
    let mut grouped_env = env.clone();
    grouped_env.insert("WORKER_BREAKER_TABLE".into(), table.clone());
    grouped_env.insert("WORKER_BREAKER_SCOPE".into(), "message-group".into());
    grouped_env.insert("WORKER_IDEMPOTENCY_KEY_PREFIX".into(), "orders#".into());
    let grouped_lookup = |name: &str| grouped_env.get(name).cloned();
    let mut grouped_reader = sqs_keeper_lambda::config::EnvReader::new(&grouped_lookup);
    let grouped = sqs_keeper_lambda::config::RedriveConfig::read(&mut grouped_reader);
    grouped_reader.finish().unwrap();
    assert!(matches!(
        sqs_keeper_lambda::redrive_function::redrive_processor(&grouped, &p.clients)
            .await
            .unwrap(),
        Some(sqs_keeper_lambda::redrive_function::RedriveProcessor::Grouped(_))
    ));
    let mut settings = config.settings;
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(p.store(), Some(processor), settings);
    let report = engine
        .run(
            &RedriveRequest {
                force: true,
                ..RedriveRequest::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(
        e2e::outcome_ids(&report, ItemOutcomeKind::Resolved),
        ["x"],
        "{report:?}"
    );
    assert_eq!(p.downstream.calls("x"), calls, "not delivered again");
}

/// The breaker's and the idempotency table's conditions are defined once
/// (`sqs_keeper_core::condition::{breaker, idempotency}`): the adapters send them, the memory
/// stores (the unit tests' and the simulation's) evaluate them. The same calls, at the
/// same instants (each boundary to the millisecond), give the same answers and leave the
/// same state on DynamoDB Local and in memory.
#[tokio::test]
async fn the_breaker_and_idempotency_conditions_mean_on_dynamodb_what_they_mean_in_memory() {
    use sqs_keeper_aws::DynamoBreakerStore;
    use sqs_keeper_core::breaker::BreakerStore;
    use sqs_keeper_core::{testing::MemoryBreakerStore, testing::MemoryIdempotencyStore};

    let clients = e2e::clients().await;
    let table = e2e::idempotency_table(&clients.dynamodb, "conditions").await;
    let t0 = UNIX_EPOCH + Duration::from_millis(1_800_000_000_000);
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let window = Duration::from_secs(10);

    let dynamo = DynamoBreakerStore::new(clients.dynamodb.clone(), table.clone(), "b-1");
    let memory = MemoryBreakerStore::default();
    // (what, the answer of each) for every call, then the state read back.
    enum Call {
        Fail(u32, u64),
        Open(u64, u32, u64),
        Probe(u64, u64),
        Release(u64),
        Close,
    }
    let calls = [
        Call::Fail(1, 0),
        Call::Fail(2, 10_000), // the window's start is its floor: still current
        Call::Fail(1, 10_001), // one millisecond later: a new window
        Call::Probe(25_000, 10_500), // never opened: no probe
        Call::Open(20_000, 1, 11_000),
        Call::Open(30_000, 2, 12_000), // open: refused
        Call::Probe(25_000, 19_999),   // still open
        Call::Probe(25_000, 20_000),   // its end is half-open
        Call::Probe(26_000, 21_000),   // the probe is held
        Call::Probe(30_000, 25_000),   // the probe's end frees it
        Call::Release(29_999),         // another probe's: kept
        Call::Release(30_000),         // its own: given back
        Call::Probe(31_000, 25_001),   // free again at once
        Call::Open(40_000, 2, 26_000), // half-open: opens again
        Call::Close,
        Call::Probe(50_000, 45_000), // closed: no probe
    ];
    for (n, call) in calls.iter().enumerate() {
        let (d, m) = match call {
            Call::Fail(k, now) => (
                format!(
                    "{:?}",
                    dynamo.add_failures(*k, at(*now), window).await.map(|_| ())
                ),
                format!(
                    "{:?}",
                    memory.add_failures(*k, at(*now), window).await.map(|_| ())
                ),
            ),
            Call::Open(until, opens, now) => (
                format!("{:?}", dynamo.open(at(*until), *opens, at(*now)).await),
                format!("{:?}", memory.open(at(*until), *opens, at(*now)).await),
            ),
            Call::Probe(until, now) => (
                format!("{:?}", dynamo.take_probe(at(*until), at(*now)).await),
                format!("{:?}", memory.take_probe(at(*until), at(*now)).await),
            ),
            Call::Release(until) => (
                format!("{:?}", dynamo.release_probe(at(*until)).await),
                format!("{:?}", memory.release_probe(at(*until)).await),
            ),
            Call::Close => (
                format!("{:?}", dynamo.close().await),
                format!("{:?}", memory.close().await),
            ),
        };
        assert_eq!(d, m, "breaker call {n}: DynamoDB answered {d}, memory {m}");
        let (d, m) = (dynamo.read().await.unwrap(), memory.read().await.unwrap());
        assert_eq!(d, m, "breaker state after call {n}");
    }

    let dynamo = DynamoIdempotencyStore::new(clients.dynamodb, table);
    let memory = MemoryIdempotencyStore::default();
    enum Op {
        Claim(&'static str, u64, u64),
        Complete(&'static str, Option<&'static str>, u64),
        Release(&'static str),
    }
    let ops = [
        Op::Claim("a", 5_000, 0),
        Op::Claim("b", 9_000, 5_000), // the claim's end is still its own
        Op::Claim("b", 10_000, 5_001), // one millisecond later it is free
        Op::Complete("a", Some("late"), 60_000), // a's claim was taken over
        Op::Release("a"),
        Op::Complete("b", Some("r"), 60_000),
        Op::Release("b"),               // completed: not released
        Op::Claim("c", 70_000, 60_000), // completed until its expiry
        Op::Claim("c", 70_000, 60_001),
        Op::Release("c"),
        Op::Claim("d", 80_000, 61_000), // released: no item
    ];
    for (n, op) in ops.iter().enumerate() {
        // The error texts differ (the SDK's, the memory store's): compare what a caller
        // acts on, the claim or whether the write was taken.
        let (d, m) = match op {
            Op::Claim(token, until, now) => (
                format!(
                    "{:?}",
                    dynamo
                        .claim("k", token, at(*until), at(*now))
                        .await
                        .unwrap()
                ),
                format!(
                    "{:?}",
                    memory
                        .claim("k", token, at(*until), at(*now))
                        .await
                        .unwrap()
                ),
            ),
            Op::Complete(token, result, expires) => (
                format!(
                    "{}",
                    dynamo
                        .complete("k", token, *result, at(*expires))
                        .await
                        .is_ok()
                ),
                format!(
                    "{}",
                    memory
                        .complete("k", token, *result, at(*expires))
                        .await
                        .is_ok()
                ),
            ),
            Op::Release(token) => (
                format!("{}", dynamo.release("k", token).await.is_ok()),
                format!("{}", memory.release("k", token).await.is_ok()),
            ),
        };
        assert_eq!(
            d, m,
            "idempotency call {n}: DynamoDB answered {d}, memory {m}"
        );
    }
}
