//! Races and edge cases of the sweep, the purge and the redrive's selection over in-memory
//! ports: each test states a guarantee of docs/ARCHITECTURE.md §3–§4 and fails when the code
//! breaks it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use sqs_keeper_core::RecordRemoval;
use sqs_keeper_core::S3Pointer;
use sqs_keeper_core::{
    redrive_made_no_progress as no_progress, RedriveEngine, RedriveRequest, RedriveSettings,
};
use sqs_keeper_core::{
    sweep_dlq, Adoption, DlqMessages, HeldMessage, MessageView, ReceivedMessage, Settled, Standing,
};
use sqs_keeper_core::{
    testing::dead_record, testing::MemoryStore, testing::ScriptedProcessor, testing::Step,
};
use sqs_keeper_core::{
    DeadLetterQueue, OutgoingMessage, PayloadStore, RecordStore, SendResult, SourceQueue, Sweep,
    SweepOptions,
};
use sqs_keeper_core::{DeadLetteredItem, FailureDetail, ItemStatus, PayloadLocation};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_core::{ItemParser, WorkItem};
use sqs_keeper_core::{Outcome, Processor};
use sqs_keeper_core::{Page, PageToken, RecordFilter};

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

/// `MemoryStore` whose payload fetch takes `fetch_delay` (a slow S3 GET).
struct SlowFetch {
    inner: MemoryStore,
    fetch_delay: Duration,
    leased_at: Mutex<Option<Instant>>,
}

impl RecordStore for SlowFetch {
    async fn get(&self, item_id: &str) -> Result<Option<DeadLetteredItem>, ProcessError> {
        self.inner.get(item_id).await
    }
    async fn query_page(
        &self,
        filter: &RecordFilter,
        limit: i32,
        start: Option<&PageToken>,
    ) -> Result<Page, ProcessError> {
        self.inner.query_page(filter, limit, start).await
    }
    fn token_after(&self, record: &DeadLetteredItem, filter: &RecordFilter) -> PageToken {
        self.inner.token_after(record, filter)
    }
    async fn acquire_lease(
        &self,
        item_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, ProcessError> {
        let taken = self.inner.acquire_lease(item_id, owner, ttl).await;
        *self.leased_at.lock().unwrap() = Some(Instant::now());
        taken
    }
    async fn release_lease(&self, item_id: &str, owner: &str) -> Result<(), ProcessError> {
        self.inner.release_lease(item_id, owner).await
    }
    async fn resolve(&self, record: &DeadLetteredItem, owner: &str) -> Result<(), ProcessError> {
        self.inner.resolve(record, owner).await
    }
    async fn mark_requeued(
        &self,
        record: &DeadLetteredItem,
        owner: &str,
        message_id: &str,
    ) -> Result<(), ProcessError> {
        self.inner.mark_requeued(record, owner, message_id).await
    }
    async fn record_redrive_failure(
        &self,
        item_id: &str,
        owner: &str,
        failures: &[FailureDetail],
    ) -> Result<(), ProcessError> {
        self.inner
            .record_redrive_failure(item_id, owner, failures)
            .await
    }
    async fn reopen_requeued(
        &self,
        record: &DeadLetteredItem,
        failure: &FailureDetail,
    ) -> Result<bool, ProcessError> {
        self.inner.reopen_requeued(record, failure).await
    }
}

impl DeadLetterQueue for SlowFetch {
    async fn sweep(&self, options: &SweepOptions) -> Result<Sweep, ProcessError> {
        self.inner.sweep(options).await
    }
    async fn settle_held(
        &self,
        held: BTreeMap<String, Vec<HeldMessage>>,
        wait: Duration,
        then: Duration,
    ) -> Result<Settled, ProcessError> {
        DeadLetterQueue::settle_held(&self.inner, held, wait, then).await
    }
}

impl PayloadStore for SlowFetch {
    async fn fetch(&self, pointer: &S3Pointer) -> Result<String, ProcessError> {
        tokio::time::sleep(self.fetch_delay).await;
        self.inner.fetch(pointer).await
    }
    async fn delete(&self, pointer: &S3Pointer) -> Result<(), ProcessError> {
        PayloadStore::delete(&self.inner, pointer).await
    }
}

impl SourceQueue for SlowFetch {
    async fn queue_url(&self, name: &str, account: &str) -> Result<String, ProcessError> {
        self.inner.queue_url(name, account).await
    }
    async fn send_batch(
        &self,
        queue_url: &str,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<SendResult>, ProcessError> {
        self.inner.send_batch(queue_url, messages).await
    }
}

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
    let inner = MemoryStore::new();
    inner.put_payload(&pointer, &body);
    inner.insert_dead_lettered(record);
    let store = SlowFetch {
        inner,
        fetch_delay: Duration::from_secs(70),
        leased_at: Mutex::new(None),
    };
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    settings.lease_ttl = Duration::from_secs(60);
    let engine = RedriveEngine::new(store, Some(Clocked), settings);
    let report = engine
        .run(&RedriveRequest::default(), &*no_progress())
        .await
        .unwrap();
    let leased_at = engine.store().leased_at.lock().unwrap().unwrap();
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

// ---------------------------------------------------------------------------------------
// A small in-memory DLQ for the sweep and the purge (standard or FIFO).
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Msg {
    id: String,
    item: String,
    source: String,
    sha: String,
    group: Option<String>,
    visible: bool,
    receipt: String,
    marker: Option<String>,
    /// Its copy would need more than SQS's ten attributes (the adapter's `rotate` answers
    /// `Ok(false)` then).
    unrotatable: bool,
}

#[derive(Default)]
struct Dlq {
    fifo: bool,
    messages: Mutex<Vec<Msg>>,
    records: Mutex<HashMap<String, DeadLetteredItem>>,
    next: Mutex<usize>,
    fail_delete: bool,
    adopted: Mutex<Vec<String>>,
}

impl Dlq {
    fn add(&self, id: &str, item: &str, source: &str, sha: &str, group: Option<&str>) {
        self.messages.lock().unwrap().push(Msg {
            id: id.into(),
            item: item.into(),
            source: source.into(),
            sha: sha.into(),
            group: group.map(str::to_string),
            visible: true,
            receipt: String::new(),
            marker: None,
            unrotatable: false,
        });
    }

    fn ids(&self) -> Vec<String> {
        self.messages
            .lock()
            .unwrap()
            .iter()
            .map(|m| m.id.clone())
            .collect()
    }

    fn visible(&self) -> Vec<String> {
        self.messages
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.visible)
            .map(|m| m.id.clone())
            .collect()
    }

    fn view(m: &Msg) -> MessageView {
        MessageView {
            message_id: m.id.clone(),
            source_message_id: m.source.clone(),
            payload_sha256: Some(m.sha.clone()),
            pointer_sha256: None,
            requeued_by: None,
        }
    }
}

impl DlqMessages for Dlq {
    type Message = String;

    async fn receive(
        &self,
        _hold: Duration,
        _parser: &ItemParser,
    ) -> Result<Vec<ReceivedMessage<String>>, ProcessError> {
        let mut messages = self.messages.lock().unwrap();
        let mut next = self.next.lock().unwrap();
        let blocked: std::collections::HashSet<Option<String>> = if self.fifo {
            messages
                .iter()
                .filter(|m| !m.visible)
                .map(|m| m.group.clone())
                .collect()
        } else {
            Default::default()
        };
        let mut out = Vec::new();
        for m in messages.iter_mut() {
            if out.len() == 10 || !m.visible || blocked.contains(&m.group) {
                continue;
            }
            *next += 1;
            m.visible = false;
            m.receipt = format!("rc{next}");
            out.push(ReceivedMessage {
                receipt: m.receipt.clone(),
                item_id: m.item.clone(),
                view: Dlq::view(m),
                message: m.id.clone(),
                marker: m.marker.clone(),
            });
        }
        Ok(out)
    }

    async fn standings(&self, ids: &[String]) -> Result<HashMap<String, Standing>, ProcessError> {
        let records = self.records.lock().unwrap();
        Ok(ids
            .iter()
            .filter_map(|id| Some((id.clone(), Standing::of(records.get(id)?))))
            .collect())
    }

    async fn adopt(
        &self,
        message: &String,
        item_id: &str,
        _parser: &ItemParser,
        adoption: &Adoption,
    ) -> Result<Option<DeadLetteredItem>, ProcessError> {
        let mut records = self.records.lock().unwrap();
        let current = records.get(item_id).map(|r| r.status);
        let processed = records
            .get(item_id)
            .map(|r| r.processed.clone())
            .unwrap_or_default();
        if !sqs_keeper_core::Expect::judged(adoption.expected_status, &adoption.message_keys)
            .admits(current, &processed)
        {
            return Ok(None);
        }
        let m = self
            .messages
            .lock()
            .unwrap()
            .iter()
            .find(|m| &m.id == message)
            .cloned()
            .unwrap();
        let mut record = dead_record(item_id, ErrorClass::Unknown, 0);
        record.source.message_id = m.source.clone();
        record.payload.sha256 = m.sha.clone();
        records.insert(item_id.to_string(), record.clone());
        self.adopted.lock().unwrap().push(message.clone());
        Ok(Some(record))
    }

    async fn delete(&self, receipts: &[String]) -> Result<usize, ProcessError> {
        if self.fail_delete && !receipts.is_empty() {
            return Err(ProcessError::new(ErrorClass::ServerError, "503 (injected)"));
        }
        let mut messages = self.messages.lock().unwrap();
        let before = messages.len();
        messages.retain(|m| m.visible || !receipts.contains(&m.receipt));
        Ok(before - messages.len())
    }

    async fn hold(&self, receipts: &[String], hold: Duration) -> Result<(), ProcessError> {
        for m in self.messages.lock().unwrap().iter_mut() {
            if receipts.contains(&m.receipt) {
                m.visible = hold.is_zero();
            }
        }
        Ok(())
    }

    fn is_fifo(&self) -> bool {
        self.fifo
    }

    async fn rotate(
        &self,
        _message: &String,
        receipt: &str,
        pass: &str,
        _item_id: &str,
    ) -> Result<bool, ProcessError> {
        let mut messages = self.messages.lock().unwrap();
        let Some(at) = messages.iter().position(|m| m.receipt == receipt) else {
            return Ok(false);
        };
        if messages[at].unrotatable {
            return Ok(false);
        }
        let mut copy = messages.remove(at);
        copy.id = format!("{}+", copy.id);
        copy.visible = true;
        copy.receipt = String::new();
        copy.marker = Some(pass.to_string());
        messages.push(copy);
        Ok(true)
    }
}

impl PayloadStore for Dlq {
    async fn fetch(&self, _pointer: &S3Pointer) -> Result<String, ProcessError> {
        Err(ProcessError::new(ErrorClass::NotFound, "none"))
    }
    async fn delete(&self, _pointer: &S3Pointer) -> Result<(), ProcessError> {
        Ok(())
    }
}

impl RecordRemoval for Dlq {
    async fn delete_records(
        &self,
        selected: &[DeadLetteredItem],
    ) -> Result<Vec<String>, ProcessError> {
        let mut records = self.records.lock().unwrap();
        let mut deleted = Vec::new();
        for s in selected {
            let unchanged = records
                .get(&s.item_id)
                .is_some_and(|r| r.status == s.status && r.last_attempt == s.last_attempt);
            if unchanged {
                records.remove(&s.item_id);
                deleted.push(s.item_id.clone());
            }
        }
        Ok(deleted)
    }
}

fn with(
    item: &str,
    status: ItemStatus,
    source: &str,
    sha: &str,
    processed: &[&str],
    hours_ago: i64,
) -> DeadLetteredItem {
    let mut r = dead_record(item, ErrorClass::Throttled, hours_ago);
    r.status = status;
    r.source.message_id = source.into();
    r.payload.sha256 = sha.into();
    r.processed = processed.iter().map(|s| s.to_string()).collect();
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
    let dlq = Dlq::default();
    let selected = with(
        "order-1",
        ItemStatus::Resolved,
        "s1",
        "P",
        &["msg:s1", "sha:P"],
        48,
    );
    // After the selection: a new failure of the same item, same bytes, new delivery.
    let now = with(
        "order-1",
        ItemStatus::Dead,
        "s2",
        "P",
        &["msg:s1", "sha:P"],
        0,
    );
    dlq.records.lock().unwrap().insert("order-1".into(), now);
    dlq.add("d2", "order-1", "s2", "P", None);
    let report = sqs_keeper_core::remove_records(
        &dlq,
        &[selected],
        &ItemParser::default(),
        &sqs_keeper_core::Random::default(),
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(
        report.records_changed, 1,
        "the record that failed again is kept: {report:?}"
    );
    assert_eq!(
        dlq.ids(),
        ["d2"],
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
    let dlq = Dlq {
        fail_delete: true,
        ..Dlq::default()
    };
    dlq.add("done", "a", "s-a", "A", None);
    dlq.records.lock().unwrap().insert(
        "a".into(),
        with(
            "a",
            ItemStatus::Resolved,
            "s-a",
            "A",
            &["msg:s-a", "sha:A"],
            5,
        ),
    );
    dlq.add("dead", "b", "s-b", "B", None);
    dlq.records
        .lock()
        .unwrap()
        .insert("b".into(), with("b", ItemStatus::Dead, "s-b", "B", &[], 5));
    let error = sweep_dlq(&dlq, &SweepOptions::default()).await.unwrap_err();
    let mut visible = dlq.visible();
    visible.sort();
    assert_eq!(
        visible,
        ["dead", "done"],
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
    let dlq = Dlq::default();
    let mut record = with(
        "a",
        ItemStatus::Requeued,
        "s2",
        "P",
        &["msg:s1", "sha:P"],
        5,
    );
    record.requeued_message_id = Some("q1".into());
    dlq.records.lock().unwrap().insert("a".into(), record);
    dlq.add("q1", "a", "q1", "P", None);
    let sweep = sweep_dlq(
        &dlq,
        &SweepOptions {
            adopt: true,
            ..SweepOptions::default()
        },
    )
    .await
    .unwrap();
    assert!(sweep.errors.is_empty(), "{:?}", sweep.errors);
    assert_eq!(*dlq.adopted.lock().unwrap(), ["q1"]);
    assert_eq!(dlq.records.lock().unwrap()["a"].status, ItemStatus::Dead);
}
