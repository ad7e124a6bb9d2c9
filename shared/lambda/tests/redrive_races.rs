//! Races and edge cases of the sweep, the purge and the redrive's selection over in-memory
//! ports: each test states a guarantee of docs/ARCHITECTURE.md §3–§4 and fails when the code
//! breaks it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use sqs_keeper_core::pointer::S3Pointer;
use sqs_keeper_core::sweep::sweep_dlq;
use sqs_keeper_core::sweep::SweepOptions;
use sqs_keeper_core::{
    dead_letter::DeadLetteredItem, dead_letter::ItemStatus, dead_letter::PayloadLocation,
};
use sqs_keeper_core::{item::ItemParser, WorkItem};
use sqs_keeper_core::{
    redrive::no_progress, redrive::RedriveEngine, redrive::RedriveRequest, redrive::RedriveSettings,
};
use sqs_keeper_core::{
    testing::dead_record, testing::MemoryStore, testing::ScriptedProcessor, testing::Step,
};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_core::{Outcome, Processor};

// ---------------------------------------------------------------------------------------
// continuation tokens resume without repeating or skipping.
// ---------------------------------------------------------------------------------------

fn engine_over(
    records: Vec<DeadLetteredItem>,
    processor: ScriptedProcessor,
) -> RedriveEngine<ScriptedProcessor, MemoryStore> {
    let store = MemoryStore::new();
    for record in records {
        store.insert_dead_lettered(record);
    }
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    RedriveEngine::new(store, Some(processor), settings)
}

/// A chain of runs, each resuming from the previous one's token, until no token (at most
/// `max_runs`). Returns the processor's calls per item.
async fn chain(
    engine: &RedriveEngine<ScriptedProcessor, MemoryStore>,
    mut request: RedriveRequest,
    ids: &[String],
    max_runs: usize,
    calls: impl Fn(&str) -> usize,
) -> (usize, HashMap<String, usize>) {
    let mut runs = 0;
    loop {
        runs += 1;
        let report = engine.run(&request, &*no_progress()).await.unwrap();
        match report.continuation_token {
            Some(token) if runs < max_runs => request.continuation_token = Some(token),
            _ => break,
        }
    }
    (runs, ids.iter().map(|id| (id.clone(), calls(id))).collect())
}

/// 102 dead items (more than one page of 100), 4 at a time, at most 98 per run: the
/// 25th chunk of the first page is cut to 2 items by `max_items`; the next run resumes
/// right after the last item handled, not at the next page, so no item is skipped.
#[tokio::test]
async fn a_continuation_after_max_items_cut_a_chunk_skips_nothing() {
    let ids: Vec<String> = (0..102).map(|n| format!("i{n:03}")).collect();
    let records: Vec<DeadLetteredItem> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| dead_record(id, ErrorClass::Throttled, 200 - n as i64))
        .collect();
    let processor = ScriptedProcessor::new();
    let engine = engine_over(records, processor);
    let request = RedriveRequest {
        max_items: Some(98),
        parallelism: Some(4),
        ..Default::default()
    };
    let calls = |id: &str| {
        engine
            .store()
            .record(id)
            .map_or(0, |r| usize::from(r.status == ItemStatus::Resolved))
    };
    let (runs, handled) = chain(&engine, request, &ids, 10, calls).await;
    let never: Vec<&String> = ids.iter().filter(|id| handled[*id] == 0).collect();
    assert!(
        never.is_empty(),
        "after {runs} runs of the continuation chain these dead items were never redriven: {never:?}"
    );
}

/// Oldest last attempt first: an item that fails again gets a new last attempt, i.e. moves
/// past the token; the chain selects only what was there when it began, so it does not
/// take that item again, and it ends.
#[tokio::test]
async fn a_continuation_chain_does_not_repeat_an_item_that_failed_again() {
    let processor = ScriptedProcessor::new().script("old", vec![Step::Fail(ErrorClass::Throttled)]);
    let records = vec![
        dead_record("old", ErrorClass::Throttled, 48),
        dead_record("mid", ErrorClass::Throttled, 24),
        dead_record("new", ErrorClass::Throttled, 12),
    ];
    let engine = engine_over(records, processor);
    let request = RedriveRequest {
        max_items: Some(1),
        parallelism: Some(1),
        ..Default::default()
    };
    let ids: Vec<String> = ["old", "mid", "new"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (runs, _) = chain(&engine, request, &ids, 8, |_| 0).await;
    // Each redrive of "old" adds one failure to its record (it had one).
    let old_calls = engine.store().record("old").unwrap().failure_count as usize - 1;
    assert!(
        old_calls == 1 && runs <= 4,
        "one pass of the selection through continuation tokens took 'old' {old_calls} times in {runs} runs"
    );
}

// ---------------------------------------------------------------------------------------
// no attempt runs past its item's lease (cut 30 s before it ends).
// ---------------------------------------------------------------------------------------

/// When each attempt of [`Clocked`] started.
static CLOCK: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

/// A processor that notes when each attempt started.
#[derive(Default)]
struct Clocked;

impl Processor for Clocked {
    async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
        CLOCK.lock().unwrap().push(Instant::now());
        Ok(Outcome::Done)
    }
}

/// The item's lease lasts 60 s; its payload (in S3) takes 70 s to fetch. Attempts are cut
/// 30 s before the lease ends, so none may start after 30 s: the item fails again
/// without an attempt.
#[tokio::test(start_paused = true)]
async fn no_attempt_starts_after_the_lease_cut_when_the_payload_fetch_was_slow() {
    let mut record = dead_record("big", ErrorClass::Throttled, 1);
    let body = match &record.payload.location {
        PayloadLocation::Inline { body } => body.clone(),
        PayloadLocation::S3 { .. } => unreachable!(),
    };
    let pointer = S3Pointer {
        bucket: "payloads".into(),
        key: "payloads/big/x".into(),
    };
    record.payload.location = PayloadLocation::S3 {
        bucket: pointer.bucket.clone(),
        key: pointer.key.clone(),
    };
    let store = MemoryStore::new();
    store.put_payload(&pointer, &body);
    store.insert_dead_lettered(record);
    // A slow S3 GET; no other call takes time, so the run leases the item as it starts.
    store.world().lock().latency =
        Some(|_, operation| (operation == "fetch").then_some(Duration::from_secs(70)));
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    settings.lease_ttl = Duration::from_secs(60);
    let engine = RedriveEngine::new(store, Some(Clocked), settings);
    let leased_at = Instant::now();
    let report = engine
        .run(&RedriveRequest::default(), &*no_progress())
        .await
        .unwrap();
    let started = CLOCK.lock().unwrap().clone();
    let cut = leased_at + Duration::from_secs(60 - 30);
    let late: Vec<Duration> = started
        .iter()
        .filter(|s| **s >= cut)
        .map(|s| *s - leased_at)
        .collect();
    assert!(
        late.is_empty(),
        "attempts started {late:?} into a 60 s lease (cut at 30 s); report: {:?}",
        report.items
    );
}

/// A record of `item` in `status`, from source message `source`, listing `processed`
/// (`sha:P` standing for its own payload's digest).
fn with(
    item: &str,
    status: ItemStatus,
    source: &str,
    processed: &[&str],
    hours_ago: i64,
) -> DeadLetteredItem {
    let mut r = dead_record(item, ErrorClass::Throttled, hours_ago);
    r.status = status;
    r.source.message_id = source.into();
    let own = format!("sha:{}", r.payload.sha256);
    r.processed = processed
        .iter()
        .map(|s| {
            if *s == "sha:P" {
                own.clone()
            } else {
                s.to_string()
            }
        })
        .collect();
    r
}

// ---------------------------------------------------------------------------------------
// a purge deletes only what the selected records hold; a failure of the same
// item id arriving after the selection survives with its DLQ message.
// ---------------------------------------------------------------------------------------

/// The selected record is resolved and lists its payload's digest as processed. After the
/// selection the same item fails again (a new delivery `s2` whose body happens to be the
/// same bytes, e.g. the producer sent the order again): the record is dead again, with a
/// new last attempt, and `d2` is its DLQ message. The purge keeps the record (changed) and
/// `d2` with it, although its digest is in the selected record's `processed` list.
#[tokio::test]
async fn a_purge_keeps_the_dlq_message_of_a_later_failure_with_the_same_payload() {
    let store = MemoryStore::new();
    let now = with("order-1", ItemStatus::Dead, "s2", &["msg:s1", "sha:P"], 0);
    let selected = DeadLetteredItem {
        status: ItemStatus::Resolved,
        last_attempt: now.last_attempt - chrono::Duration::hours(48),
        source: sqs_keeper_core::dead_letter::SourceContext {
            message_id: "s1".into(),
            ..now.source.clone()
        },
        ..now.clone()
    };
    // After the selection: a new failure of the same item, same bytes, new delivery (`s2`),
    // and its DLQ message.
    store.insert_dead_lettered(now);
    let report = sqs_keeper_core::removal::remove_records(
        &store,
        &[selected],
        &ItemParser::default(),
        &sqs_keeper_core::random::Random::default(),
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(
        report.records_changed, 1,
        "the record that failed again is kept: {report:?}"
    );
    let left: Vec<String> = store
        .dlq_messages()
        .into_iter()
        .map(|m| m.item_id)
        .collect();
    assert_eq!(
        left,
        ["order-1"],
        "the later failure's DLQ message must survive with its record: {report:?}"
    );
}

// ---------------------------------------------------------------------------------------
// A sweep gives back what it held on every error path.
// ---------------------------------------------------------------------------------------

/// The pass decides to delete a processed message and the batch delete fails: the pass
/// returns the error and gives that message back with the rest (it does not stay hidden
/// for the pass's hold).
#[tokio::test]
async fn a_sweep_whose_delete_fails_gives_back_what_it_held() {
    let store = MemoryStore::new();
    let done = with("a", ItemStatus::Dead, "s-a", &[], 5);
    store.insert_dead_lettered(done.clone());
    store.insert(DeadLetteredItem {
        status: ItemStatus::Resolved,
        processed: sqs_keeper_core::dead_letter::processed_after(&done),
        ..done
    });
    store.insert_dead_lettered(with("b", ItemStatus::Dead, "s-b", &[], 5));
    store.fail("delete_messages");
    let error = sweep_dlq(&store, &SweepOptions::default())
        .await
        .unwrap_err();
    let mut visible: Vec<String> = store
        .dlq_messages()
        .into_iter()
        .filter(|m| !m.held)
        .map(|m| m.item_id)
        .collect();
    visible.sort();
    assert_eq!(
        visible,
        ["a", "b"],
        "after the error {error}, still held: the rest"
    );
}

/// Items a crashed run left `redriving` (lease expired) are selected before dead items:
/// scheduled runs (`max_items`, no continuation) whose dead items keep failing still take
/// back the oldest item of all, left by a crashed run.
#[tokio::test]
async fn items_that_keep_failing_do_not_starve_an_item_a_crashed_run_left_redriving() {
    let processor = ScriptedProcessor::new()
        .script("f1", vec![Step::Fail(ErrorClass::Throttled)])
        .script("f2", vec![Step::Fail(ErrorClass::Throttled)]);
    let mut crashed = dead_record("crashed", ErrorClass::Throttled, 100);
    crashed.status = ItemStatus::Redriving;
    crashed.lease_expires_at = Some(chrono::Utc::now().timestamp() - 3_600);
    let records = vec![
        crashed,
        dead_record("f1", ErrorClass::Throttled, 2),
        dead_record("f2", ErrorClass::Throttled, 1),
    ];
    let engine = engine_over(records, processor);
    for _ in 0..5 {
        // The schedule's request: a cap, never a continuation.
        engine
            .run(
                &RedriveRequest {
                    max_items: Some(2),
                    parallelism: Some(1),
                    ..Default::default()
                },
                &*no_progress(),
            )
            .await
            .unwrap();
    }
    let crashed = engine.store().record("crashed").unwrap();
    let f1 = engine.store().record("f1").unwrap();
    assert_eq!(
        crashed.status,
        ItemStatus::Resolved,
        "after 5 scheduled runs the oldest item (left redriving by a crashed run 100 h ago) was never taken back, while f1 was tried {} times",
        f1.failure_count - 1
    );
}

// ---------------------------------------------------------------------------------------
// A requeued message that came back reopens its record, also when its payload was
// processed once before (found by the simulation).
// ---------------------------------------------------------------------------------------

/// The item's payload `P` was delivered once (the record lists `sha:P` processed), then a
/// twin delivery failed it again and a redrive requeued it as `q1`. `q1` fails at every
/// receive and the source queue's redrive policy moves it to the DLQ. The sweep must set
/// the record back to dead with it: were the reopening guarded by `sha:P` (listed before
/// the sweep judged it), it would be refused at every pass, and the record left `requeued`
/// with its message in the DLQ.
#[tokio::test]
async fn a_requeued_message_back_in_the_dlq_reopens_its_record_though_its_payload_was_processed_before(
) {
    let store = MemoryStore::new();
    let mut record = with("a", ItemStatus::Requeued, "s2", &["msg:s1", "sha:P"], 5);
    // The requeued message `q1`, moved to the DLQ by the source queue's redrive policy: the
    // record's payload, our `item_id`, its own id.
    let PayloadLocation::Inline { body } = &record.payload.location else {
        unreachable!()
    };
    let q1 = store.send_dlq_message(body, &[("item_id", "a")], None);
    record.requeued_message_id = Some(q1);
    store.insert(record);
    let sweep = sweep_dlq(
        &store,
        &SweepOptions {
            adopt: true,
            ..SweepOptions::default()
        },
    )
    .await
    .unwrap();
    assert!(sweep.errors.is_empty(), "{:?}", sweep.errors);
    assert_eq!(sweep.adopted, 1, "q1 reopened its record");
    assert_eq!(store.record("a").unwrap().status, ItemStatus::Dead);
}
