use super::pass::{Pass, MAX_HOLD, MIN_HOLD};
use super::*;
use crate::clock::Clock;
use crate::message::{PAYLOAD_SHA256_ATTRIBUTE, SOURCE_MESSAGE_ID_ATTRIBUTE};
use crate::pointer::S3Pointer;

fn view(message_id: &str, source: &str, sha: &str) -> MessageView {
    MessageView {
        message_id: message_id.into(),
        source_message_id: source.into(),
        payload_sha256: Some(sha.into()),
        pointer_sha256: None,
        requeued_by: None,
    }
}

fn record(status: ItemStatus, source: &str, sha: &str, processed: &[&str]) -> Standing {
    Standing {
        status: Some(status),
        source_message_id: Some(source.into()),
        payload_sha256: Some(sha.into()),
        processed: processed.iter().map(|s| s.to_string()).collect(),
        ..Standing::default()
    }
}

#[test]
fn a_message_is_deleted_only_when_its_record_processed_that_very_message() {
    let m = view("d1", "s1", "x1");
    assert_eq!(decide(&m, None), MessageFate::Adopt);
    // Listed by its source message only: its content is known and not listed.
    let resolved_by_id = record(ItemStatus::Resolved, "s1", "x1", &["msg:s1"]);
    assert!(matches!(
        decide(&m, Some(&resolved_by_id)),
        MessageFate::Reopen(_)
    ));
    // A message whose content is unknown (a pointer into another bucket) is judged by
    // its source message.
    let unknown = MessageView {
        payload_sha256: None,
        ..m.clone()
    };
    assert_eq!(decide(&unknown, Some(&resolved_by_id)), MessageFate::Delete);
    let resolved_by_sha = record(ItemStatus::Resolved, "s9", "x1", &["sha:x1"]);
    assert_eq!(decide(&m, Some(&resolved_by_sha)), MessageFate::Delete);
    // Resolved by its item id alone is not enough: another body was processed.
    let other_body = record(ItemStatus::Resolved, "s2", "x2", &["msg:s2", "sha:x2"]);
    assert!(matches!(
        decide(&m, Some(&other_body)),
        MessageFate::Reopen(_)
    ));
    for status in [ItemStatus::Dead, ItemStatus::Redriving] {
        let r = record(status, "s1", "x1", &["msg:s1"]);
        assert_eq!(decide(&m, Some(&r)), MessageFate::Keep, "{status:?}");
    }
}

/// Found by the simulation (seed 89): a message adopted once, whose record was then
/// resolved with another payload, must reopen it. Under the adoption's attempt id the
/// write was skipped as already recorded, and the record stayed resolved for ever.
#[test]
fn a_reopening_is_a_new_entry_while_an_adoption_is_the_same_one_every_sweep() {
    let item = crate::testing::dead_record("a", crate::ErrorClass::Unknown, 1);
    let work_item = |body: &str| WorkItem {
        message_id: "d1".into(),
        item_id: "a".into(),
        body: body.into(),
        receive_count: 1,
        sent_timestamp: None,
        message_group_id: None,
        event_source_arn: None,
        attributes: Default::default(),
        message_attributes: HashMap::new(),
        envelope: None,
    };
    let record = |reopen: bool| {
        adopted_record(
            work_item("{}"),
            ProcessError::new(crate::ErrorClass::Unknown, "moved"),
            "d1",
            "s1".into(),
            &Adoption {
                reason: "moved",
                reopen,
                known_queue_arn: item.source.queue_arn.clone(),
                expected_status: None,
                message_keys: Vec::new(),
            },
            Duration::from_secs(60),
            chrono::Utc::now(),
        )
    };
    let id = |r: DeadLetteredItem| r.failure_history[0].attempt_id.clone();
    assert_eq!(id(record(false)), "dlq:d1");
    assert_eq!(id(record(false)), id(record(false)));
    let first = id(record(true));
    assert!(first.starts_with("dlq:d1:reopened:"), "{first}");
    assert_ne!(first, "dlq:d1");
    let adopted = record(false);
    assert_eq!(adopted.source.message_id, "s1");
    assert_eq!(adopted.status, ItemStatus::Dead);
}

/// Found by the simulation (seed 1153): a payload that could not be fetched for the
/// moment must not become the record's payload (its pointer text would be redriven and
/// the message deleted); only one that is gone or denied is recorded, unredrivable.
#[test]
fn a_message_tracked_by_its_id_while_its_payload_names_an_item_is_not_adopted_yet() {
    // Tracked by its message id because its payload could not be read on receipt: a
    // second record beside the worker's would follow, so not now.
    assert!(tracked_as_its_payload_names(false, "m-1", Some("order-1")).is_err());
    let refused = tracked_as_its_payload_names(false, "m-1", Some("order-1")).unwrap_err();
    assert!(refused.class.is_reprocess_eligible(), "{refused}");
    // Tracked by the item its payload names, by our attribute, or a payload naming none.
    assert!(tracked_as_its_payload_names(false, "order-1", Some("order-1")).is_ok());
    assert!(tracked_as_its_payload_names(true, "record-9", Some("order-1")).is_ok());
    assert!(tracked_as_its_payload_names(false, "m-1", None).is_ok());
}

#[test]
fn only_a_payload_gone_for_good_is_recorded_as_its_pointer() {
    use crate::ErrorClass::*;
    for class in [Throttled, ServerError, Timeout, Unknown] {
        let fetch = ProcessError::new(class, "s3 said no");
        assert!(Adoption::unfetched_payload(fetch).is_err(), "{class}");
    }
    for class in [NotFound, Permission] {
        let fetch = ProcessError::new(class, "s3 said no");
        let recorded = Adoption::unfetched_payload(fetch).unwrap();
        assert_eq!(recorded.class, class);
        assert!(!recorded.class.is_reprocess_eligible());
        assert_eq!(recorded.step.as_deref(), Some("dlq-adopt"));
    }
}

#[test]
fn a_requeued_record_lets_its_moved_copy_go_and_reopens_on_its_message_coming_back() {
    let mut requeued = record(ItemStatus::Requeued, "s1", "x1", &[]);
    requeued.requeued_message_id = Some("r1".into());
    // The original DLQ copy of what went back to the source queue.
    assert_eq!(
        decide(&view("d1", "s1", "x1"), Some(&requeued)),
        MessageFate::Delete
    );
    // The requeued message itself, moved back by the redrive policy (same id).
    assert!(matches!(
        decide(&view("r1", "r1", "x1"), Some(&requeued)),
        MessageFate::Reopen(_)
    ));
    // Or any message carrying the requeue stamp.
    let stamped = MessageView {
        requeued_by: Some("redrive-1".into()),
        ..view("r2", "r2", "x1")
    };
    assert!(matches!(
        decide(&stamped, Some(&requeued)),
        MessageFate::Reopen(_)
    ));
    // A different body under the same id was never requeued.
    assert!(matches!(
        decide(&view("d2", "s2", "x2"), Some(&requeued)),
        MessageFate::Reopen(_)
    ));
}

/// The worker's own DLQ message for a failed delivery of the requeued message names
/// that message as its source and carries no requeue stamp: the requeue did not
/// finish, and the record is reopened. Known only by the requeued payload it holds, it
/// was deleted as the copy the requeue moved, and the record stayed requeued until the
/// requeue outlived every queue.
#[test]
fn a_dlq_message_whose_source_is_the_requeued_message_reopens_its_record() {
    let mut requeued = record(ItemStatus::Requeued, "s1", "x1", &[]);
    requeued.requeued_message_id = Some("r1".into());
    assert!(matches!(
        decide(&view("d2", "r1", "x1"), Some(&requeued)),
        MessageFate::Reopen(_)
    ));
}

use crate::testing::{dead_record, MemoryStore, Queue};

/// The world's DLQ and records for one item each: `dead` records with their DLQ message,
/// `orphans` (DLQ messages no record holds) and what a run does to a record.
fn dead(store: &MemoryStore, item: &str) -> DeadLetteredItem {
    let record = dead_record(item, crate::ErrorClass::Throttled, 1);
    store.insert_dead_lettered(record.clone());
    record
}

/// A DLQ message of ours for `item`, whose record is gone (or never written): its id.
fn orphan(store: &MemoryStore, item: &str) -> String {
    store.send_dead_letter(&dead_record(item, crate::ErrorClass::Throttled, 1))
}

/// `item`'s record resolved by a run that processed its current payload.
fn resolve(store: &MemoryStore, item: &str) {
    let mut record = store.record(item).unwrap();
    record.processed = crate::dead_letter::processed_after(&record);
    record.status = ItemStatus::Resolved;
    store.insert(record);
}

/// `item`'s record resolved with another payload than its DLQ message holds.
fn resolve_another_body(store: &MemoryStore, item: &str) {
    let mut record = store.record(item).unwrap();
    record.source.message_id = "s-other".into();
    record.payload.sha256 = "y".into();
    record.processed = vec!["msg:s-other".into(), "sha:y".into()];
    record.status = ItemStatus::Resolved;
    store.insert(record);
}

/// The items of the DLQ messages visible now, sorted.
fn visible(store: &MemoryStore) -> Vec<String> {
    let mut items: Vec<String> = store
        .dlq_messages()
        .into_iter()
        .filter(|m| !m.held)
        .map(|m| m.item_id)
        .collect();
    items.sort();
    items
}

/// DLQ messages left, visible or not.
fn left(store: &MemoryStore) -> usize {
    store.dlq_messages().len()
}

/// Each adoption takes ten seconds, in its record write (a slow call).
fn adoptions_take_ten_seconds(store: &MemoryStore) {
    store.world().lock().latency =
        Some(|_, operation| (operation == "try_record").then_some(Duration::from_secs(10)));
}

fn adopting() -> SweepOptions {
    SweepOptions {
        adopt: true,
        ..SweepOptions::default()
    }
}

#[tokio::test]
async fn a_sweep_adopts_deletes_and_holds_by_the_rules_then_settles_by_the_final_state() {
    let store = MemoryStore::new();
    orphan(&store, "a");
    dead(&store, "b");
    resolve(&store, "b");
    dead(&store, "c");
    let sweep = sweep_dlq(&store, &adopting()).await.unwrap();
    assert_eq!(
        (sweep.seen, sweep.adopted, sweep.deleted, sweep.complete),
        (3, 1, 1, true),
        "a adopted; b (resolved by it) deleted"
    );
    assert!(sweep.errors.is_empty(), "{:?}", sweep.errors);
    let mut held: Vec<&String> = sweep.held.keys().collect();
    held.sort();
    assert_eq!(held, ["a", "c"]);
    assert_eq!(
        store.record("a").unwrap().status,
        ItemStatus::Dead,
        "adopted"
    );
    assert!(visible(&store).is_empty(), "the rest held");

    // Meanwhile c was resolved by its message: it goes; a (dead) comes back to view.
    resolve(&store, "c");
    let settled = settle_held(&store, sweep.held, Duration::ZERO, Duration::ZERO, None)
        .await
        .unwrap();
    assert_eq!(settled.deleted, 1);
    assert_eq!(visible(&store), ["a"]);
    assert_eq!(left(&store), 1);
}

#[test]
fn a_body_is_its_own_digest_whatever_an_attribute_states() {
    let stated = |name: &str| (name == PAYLOAD_SHA256_ATTRIBUTE).then_some("a-victims-digest");
    let inline = MessageView::of("m-1", "{\"id\":\"attacker\"}", stated, "ours");
    assert_eq!(
        inline.payload_sha256.as_deref(),
        Some(crate::hex::sha256_hex(b"{\"id\":\"attacker\"}").as_str())
    );
    let pointer = |bucket: &str, key: &str| {
        S3Pointer {
            bucket: bucket.into(),
            key: key.into(),
        }
        .to_body()
    };
    // A pointer's payload is known by the digest stated beside it only where that
    // digest is the key we wrote it under, in our own bucket.
    let ours = MessageView::of(
        "m-2",
        &pointer("ours", "payloads/i/a-victims-digest"),
        stated,
        "ours",
    );
    assert_eq!(ours.payload_sha256.as_deref(), Some("a-victims-digest"));
    // Into another bucket: the payload is unknown; judged by its source message.
    let theirs = MessageView::of(
        "m-3",
        &pointer("producers", "payloads/i/a-victims-digest"),
        stated,
        "ours",
    );
    assert_eq!(
        (&theirs.payload_sha256, &theirs.pointer_sha256),
        (&None, &None)
    );
    assert_eq!(theirs.keys(), ["msg:m-3"]);
    // Into ours at a key the store writes, naming another digest than the one stated:
    // known by its own text only.
    let addressed = format!("payloads/i/{}", "0".repeat(64));
    let text = pointer("ours", &addressed);
    let view = MessageView::of("m-3", &text, stated, "ours");
    assert_eq!(view.payload_sha256, None);
    assert_eq!(
        view.keys(),
        [format!("sha:{}", crate::hex::sha256_hex(text.as_bytes()))]
    );
    // Into ours at a key the store never writes (a producer sharing the bucket):
    // unknown.
    for key in ["k", "payloads/i/x-a-victims-digest", "producer/ec-1"] {
        let view = MessageView::of("m-3", &pointer("ours", key), stated, "ours");
        assert_eq!(
            (&view.payload_sha256, &view.pointer_sha256),
            (&None, &None),
            "{key}"
        );
        assert_eq!(view.keys(), ["msg:m-3"], "{key}");
    }
}

#[test]
fn a_message_naming_a_processed_delivery_is_judged_by_its_own_content() {
    // A producer's message keeps its attributes into the DLQ: one whose
    // `source_message_id` names a delivery the record processed, but whose body is
    // another payload, is that other payload, never deleted as processed.
    let forged = |name: &str| (name == SOURCE_MESSAGE_ID_ATTRIBUTE).then_some("src-1");
    let message = MessageView::of("m-9", "{\"id\":\"a\",\"v\":2}", forged, "ours");
    let processed = crate::hex::sha256_hex(b"{\"id\":\"a\",\"v\":1}");
    let resolved = record(
        ItemStatus::Resolved,
        "src-1",
        &processed,
        &["msg:src-1", &format!("sha:{processed}")],
    );
    assert!(matches!(
        decide(&message, Some(&resolved)),
        MessageFate::Reopen(_)
    ));
    let requeued = Standing {
        status: Some(ItemStatus::Requeued),
        ..resolved.clone()
    };
    assert!(matches!(
        decide(&message, Some(&requeued)),
        MessageFate::Reopen(_)
    ));
    let dead = Standing {
        status: Some(ItemStatus::Dead),
        ..resolved
    };
    assert!(!purge_takes(&message, &dead));
    // The same body is the payload processed, whatever message holds it.
    let same = MessageView::of("m-10", "{\"id\":\"a\",\"v\":1}", |_| None, "ours");
    assert_eq!(
        decide(
            &same,
            Some(&Standing {
                status: Some(ItemStatus::Resolved),
                ..dead.clone()
            })
        ),
        MessageFate::Delete
    );
    assert!(purge_takes(&same, &dead));
}

#[tokio::test(start_paused = true)]
async fn a_pass_ends_at_its_deadline_between_two_slow_adoptions() {
    let store = MemoryStore::new();
    for n in 0..10 {
        orphan(&store, &format!("i{n}"));
    }
    adoptions_take_ten_seconds(&store);
    let started = Instant::now();
    let options = SweepOptions {
        until: Some(started + Duration::from_secs(15)),
        ..adopting()
    };
    let sweep = sweep_dlq(&store, &options).await.unwrap();
    assert!(
        started.elapsed() <= Duration::from_secs(20),
        "ended {:?} after it started, its deadline was 15 s",
        started.elapsed()
    );
    assert_eq!((sweep.seen, sweep.adopted, sweep.complete), (2, 2, false));
    let held: usize = sweep.held.values().map(Vec::len).sum();
    assert_eq!(
        held, 10,
        "the eight not judged are held with the two adopted"
    );
    settle_held(&store, sweep.held, Duration::ZERO, Duration::ZERO, None)
        .await
        .unwrap();
    assert_eq!(visible(&store).len(), 10, "nothing lost, all back in view");
}

#[tokio::test]
async fn a_held_message_whose_record_must_reopen_is_given_back_at_once() {
    let store = MemoryStore::new();
    dead(&store, "a");
    let sweep = sweep_dlq(&store, &SweepOptions::default()).await.unwrap();
    assert!(visible(&store).is_empty(), "held while its record is dead");
    // Meanwhile a run resolves the item with another payload: this message holds one
    // the record did not process, so the next sweep must see it to reopen the record,
    // not wait out the hold the others get.
    resolve_another_body(&store, "a");
    let settled = settle_held(
        &store,
        sweep.held,
        Duration::ZERO,
        Duration::from_secs(600),
        None,
    )
    .await
    .unwrap();
    assert_eq!((settled.deleted, settled.to_reopen), (0, 1));
    assert_eq!(visible(&store), ["a"], "given back at once");
}

/// A store whose item `a` a live run is redriving, with a lease of ten minutes. Leases are
/// judged by the settling's clock: one following tokio's paused clock from the year 2000,
/// by which the lease is live (by the system clock it expired long ago).
fn store_with_a_live_redrive() -> MemoryStore {
    let clock = Clock::following_tokio(chrono::DateTime::from_timestamp(946_684_800, 0).unwrap());
    let store = MemoryStore::reading(clock);
    let mut record = dead(&store, "a");
    record.status = ItemStatus::Redriving;
    record.lease_expires_at = Some(clock.now().timestamp() + 600);
    store.insert(record);
    store
}

/// Settling waits for a run that holds a live lease on a held message's item, and
/// deletes the message once that run resolves the item. Taken for a lease no run
/// holds, the wait ended at once and the message was given back, to stay in the DLQ
/// beside its resolved record until a later sweep.
#[tokio::test(start_paused = true)]
async fn settling_waits_for_a_live_redrive_and_deletes_the_message_it_resolved() {
    let store = store_with_a_live_redrive();
    let sweep = sweep_dlq(&store, &SweepOptions::default()).await.unwrap();
    assert!(
        visible(&store).is_empty(),
        "held while its item is redriven"
    );
    let the_run_resolves_it = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        resolve(&store, "a");
    };
    let (settled, ()) = tokio::join!(
        settle_held(
            &store,
            sweep.held,
            Duration::from_secs(15),
            Duration::ZERO,
            None
        ),
        the_run_resolves_it
    );
    assert_eq!(settled.unwrap().deleted, 1);
    assert_eq!(left(&store), 0);
}

/// Settling gives up on a live redrive by its wait, never a poll past it: a run's deadline
/// counts on it. The message stays held, its record still leased.
#[tokio::test(start_paused = true)]
async fn settling_gives_up_on_a_live_redrive_within_its_wait() {
    let store = store_with_a_live_redrive();
    let sweep = sweep_dlq(&store, &SweepOptions::default()).await.unwrap();
    let wait = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let settled = settle_held(&store, sweep.held, wait, Duration::ZERO, None)
        .await
        .unwrap();
    assert!(started.elapsed() <= wait, "{:?}", started.elapsed());
    assert_eq!(settled.deleted, 0);
    assert_eq!(left(&store), 1, "nothing lost");
}

#[tokio::test]
async fn without_adopt_a_sweep_holds_what_no_record_holds() {
    let store = MemoryStore::new();
    orphan(&store, "a");
    let sweep = sweep_dlq(&store, &SweepOptions::default()).await.unwrap();
    assert_eq!((sweep.seen, sweep.adopted, sweep.deleted), (1, 0, 0));
    assert_eq!(store.record("a"), None, "not adopted");
    assert_eq!(
        settle_held(&store, sweep.held, Duration::ZERO, Duration::ZERO, None)
            .await
            .unwrap()
            .deleted,
        0
    );
    assert_eq!(visible(&store), ["a"], "given back");
}

/// A pass gives the messages it holds to the settling in the same order whenever it
/// receives the same messages: the settling deletes and gives them back in that order, and
/// a seed of the simulation replays exactly only if the library does the same things in
/// the same order. (Held in a `HashMap`, an item's messages came out in the order of its
/// hasher's random keys, another for every map: `make sim SEED=293` twice deleted
/// `src-00026` and `dlq-00027` of item-8 in either order.)
#[tokio::test]
async fn a_pass_holds_an_items_messages_in_the_same_order_every_time() {
    let mut orders = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let store = MemoryStore::new();
        let mut ids: Vec<String> = (0..6)
            .map(|n| {
                let mut record = dead_record("a", crate::ErrorClass::Throttled, 1);
                record.source.message_id = format!("s-{n}");
                store.send_dead_letter(&record)
            })
            .collect();
        ids.sort();
        let sweep = sweep_dlq(&store, &SweepOptions::default()).await.unwrap();
        let held: Vec<String> = sweep.held["a"]
            .iter()
            .map(|m| m.view.message_id.clone())
            .collect();
        let mut sorted = held.clone();
        sorted.sort();
        assert_eq!(sorted, ids, "every message held, once");
        orders.insert(held);
    }
    assert_eq!(orders.len(), 1, "{orders:?}");
}

/// Issue: a purge deleted every DLQ message of a selected item id, including a failure
/// of the same id that arrived after the selection. Only what the selected record
/// holds goes.
#[tokio::test]
async fn a_purge_deletes_only_the_messages_the_selected_record_holds() {
    let store = MemoryStore::new();
    let mut old = dead_record("order-1", crate::ErrorClass::Throttled, 2);
    old.source.message_id = "s-old".into();
    store.insert(old.clone());
    store.send_dead_letter(&old);
    // A later failure of the same item id, another body, after the selection.
    let mut new = dead_record("order-1", crate::ErrorClass::Throttled, 1);
    new.source.message_id = "s-new".into();
    new.payload.location = crate::dead_letter::PayloadLocation::Inline {
        body: "{\"id\":\"order-1\",\"v\":2}".into(),
    };
    new.payload.sha256 = crate::hex::sha256_hex(b"{\"id\":\"order-1\",\"v\":2}");
    let new_message = store.send_dead_letter(&new);
    let options = SweepOptions {
        purge: [("order-1".to_string(), Selected::of(&old))].into(),
        ..SweepOptions::default()
    };
    let sweep = sweep_dlq(&store, &options).await.unwrap();
    assert_eq!(sweep.deleted, 1);
    settle_held(&store, sweep.held, Duration::ZERO, Duration::ZERO, None)
        .await
        .unwrap();
    let messages: Vec<String> = store
        .dlq_messages()
        .into_iter()
        .filter(|m| !m.held)
        .map(|m| m.message_id)
        .collect();
    assert_eq!(messages, [new_message], "the later failure stays");
    // The selected delivery's id on another payload is not that delivery (a producer
    // may set the attribute); with its content unknown, its source message decides.
    assert!(!purge_takes(
        &view("d9", "s-old", "other"),
        &record(ItemStatus::Dead, "s-old", "x", &[])
    ));
    let unknown = MessageView {
        payload_sha256: None,
        ..view("d9", "s-old", "")
    };
    assert!(purge_takes(
        &unknown,
        &record(ItemStatus::Dead, "s-old", "x", &[])
    ));
    assert!(!purge_takes(
        &view("d9", "s-new", "y"),
        &record(ItemStatus::Dead, "s-old", "x", &[])
    ));
    assert!(purge_takes(
        &view("d9", "s-new", "y"),
        &record(ItemStatus::Resolved, "s-old", "x", &["sha:y"])
    ));
    // The same payload delivered again is not the delivery selected.
    assert!(!purge_takes(
        &view("d9", "s-new", "x"),
        &record(ItemStatus::Dead, "s-old", "x", &[])
    ));
}

/// Issue: on a FIFO DLQ, once a sweep held a group's first messages SQS gave nothing
/// more of that group, and a message behind them (an orphan the redrive policy moved)
/// was never adopted. Kept messages are moved behind their group, so the pass reaches
/// every message, and judges each once.
#[tokio::test]
async fn a_fifo_sweep_reaches_the_messages_behind_a_held_group_head() {
    let store = MemoryStore::new();
    store.world().lock().dlq = Queue::new("orders-dlq.fifo", None);
    let in_g1 = |id: &str| {
        let mut record = dead_record(id, crate::ErrorClass::Throttled, 1);
        record.source.message_group_id = Some("g1".into());
        record
    };
    for n in 0..12 {
        store.insert_dead_lettered(in_g1(&format!("dead-{n}")));
    }
    store.send_dead_letter(&in_g1("orphan"));
    let sweep = sweep_dlq(&store, &adopting()).await.unwrap();
    assert!(sweep.complete);
    assert_eq!(sweep.seen, 13, "each judged once");
    assert_eq!(sweep.adopted, 1, "the orphan behind them");
    assert_eq!(sweep.rotated, 13);
    assert_eq!(
        left(&store),
        13,
        "nothing lost: copies in place of the originals"
    );
    // The copies received again are held for the run to settle (which blocks their
    // group again: the others wait, visible, for the next sweep, already judged).
    let held: usize = sweep.held.values().map(Vec::len).sum();
    assert!(held > 0);
    assert_eq!(held + visible(&store).len(), 13);
    settle_held(&store, sweep.held, Duration::ZERO, Duration::ZERO, None)
        .await
        .unwrap();
    assert_eq!(visible(&store).len(), 13);
}

/// Found by the simulation (seed 713214): a purge's sweep names items without the
/// worker's parser. On a FIFO DLQ it rotated a message SQS's redrive policy moved and
/// wrote its guess, the message id, onto the copy as `item_id`; the schedule then adopted
/// the copy under that id, not under the item its payload names. A copy now carries no
/// item id and is tracked as its original: by the item its payload names, else by the
/// original's message id (never by its own new one, seed 169).
#[tokio::test]
async fn a_rotated_copy_is_tracked_as_its_original_by_every_later_sweep() {
    let store = MemoryStore::new();
    store.world().lock().dlq = Queue::new("orders-dlq.fifo", None);
    // Two messages the redrive policy moved: none of our attributes.
    let named = store.send_dlq_message(r#"{"id":"order-7"}"#, &[], Some("g1"));
    let unnamed = store.send_dlq_message(r#"{"note":"no id"}"#, &[], Some("g1"));
    // A purge's sweep (the default parser, no adoption) keeps both and rotates them.
    let purge = sweep_dlq(&store, &SweepOptions::default()).await.unwrap();
    assert_eq!(purge.rotated, 2, "{purge:?}");
    settle_held(&store, purge.held, Duration::ZERO, Duration::ZERO, None)
        .await
        .unwrap();
    let copies: Vec<String> = store
        .dlq_messages()
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    assert!(
        !copies.contains(&named) && !copies.contains(&unnamed),
        "{copies:?}"
    );
    let schedule = SweepOptions {
        adopt: true,
        parser: ItemParser {
            id_source: crate::item::ItemIdSource::JsonPointer("/id".into()),
            ..ItemParser::default()
        },
        ..SweepOptions::default()
    };
    let sweep = sweep_dlq(&store, &schedule).await.unwrap();
    assert_eq!(sweep.adopted, 2);
    let by_payload = store
        .record("order-7")
        .expect("under the item its payload names");
    assert_eq!(by_payload.source.message_id, named);
    let by_original = store.record(&unnamed).expect("under the original's id");
    assert_eq!(by_original.source.message_id, unnamed);
    assert!(copies.iter().all(|copy| store.record(copy).is_none()));
}

/// A pass judges each message once: one received again by its id (its hold ended) and a
/// copy the pass's own rotation sent (a new id, the pass's marker) are already judged;
/// a copy another pass sent is not. Taken as judged only when both held, a message was
/// judged (counted, adopted) again, and a FIFO pass rotated its copies for ever.
#[test]
fn a_pass_judges_a_message_received_again_or_its_own_rotated_copy_only_once() {
    let pass = Pass {
        sweep: Sweep::default(),
        receipts: BTreeMap::new(),
        views: HashMap::new(),
        judged: std::iter::once("m-1".to_string()).collect(),
        marker: "pass-1".to_string(),
    };
    let received = |message_id: &str, marker: Option<&str>| ReceivedMessage {
        sent_at_ms: None,
        receipt: "r".to_string(),
        item_id: "a".to_string(),
        view: view(message_id, "s-1", "p-1"),
        message: (),
        marker: marker.map(str::to_string),
    };
    assert!(
        pass.already_judged(&received("m-1", None)),
        "received again"
    );
    assert!(
        pass.already_judged(&received("m-2", Some("pass-1"))),
        "its own copy"
    );
    assert!(!pass.already_judged(&received("m-2", None)));
    assert!(
        !pass.already_judged(&received("m-2", Some("pass-0"))),
        "another pass's copy"
    );
}

/// A receive that fails midway gives back what the pass held, instead of stranding it
/// for the pass's whole hold.
#[tokio::test]
async fn a_sweep_that_fails_midway_gives_back_what_it_held() {
    let store = MemoryStore::new();
    for n in 0..25 {
        dead(&store, &format!("i{n}"));
    }
    store.world().lock().fail_after("receive", 2);
    let error = sweep_dlq(&store, &SweepOptions::default())
        .await
        .unwrap_err();
    assert_eq!(error.step.as_deref(), Some("receive"), "{error}");
    assert_eq!(visible(&store).len(), 25, "all given back");
}

/// A pass without an end holds each message at least twice as long as it has run: a
/// message given back while the pass goes on is received again a logarithmic number of
/// times, and the pass ends (a fixed two-minute hold never let a large purge end).
#[test]
fn holds_grow_with_the_pass_and_cover_the_instants_named() {
    let now = Instant::now();
    assert_eq!(hold_for(Duration::ZERO, &[None], now), MIN_HOLD);
    assert_eq!(
        hold_for(Duration::from_secs(600), &[None], now),
        Duration::from_secs(1_320)
    );
    let later = now + Duration::from_secs(900);
    assert_eq!(
        hold_for(Duration::from_secs(10), &[None, Some(later)], now),
        Duration::from_secs(930)
    );
    assert_eq!(
        hold_for(Duration::from_secs(100_000), &[None], now),
        MAX_HOLD
    );
    // A message held at 0 s comes back at 120 s, then at 120 + 360 s, ...: a pass of
    // ten hours receives it fewer than ten times.
    let (mut at, mut times) = (Duration::ZERO, 0);
    while at < Duration::from_secs(36_000) {
        at += hold_for(at, &[None], now);
        times += 1;
    }
    assert!(times <= 8, "{times}");
}

/// A requeued pointer (a payload over 256 KiB, requeued as an Extended-Client
/// pointer into our own bucket) whose read failed in the worker is recorded with the
/// pointer's text as its payload (record sha = sha256(pointer text), `batch.rs`
/// `pointer_sha`); its DLQ message states that digest, which is not the key's, so its
/// content is "unknown" and it is judged by its source message (r1). Requeued again, the
/// worker reads the pointer and `finish_requeued` lists `msg:r2` and the record's digest.
/// The DLQ message holds exactly the body the record processed, and must go.
#[test]
fn a_dlq_message_holding_a_requeued_pointers_text_goes_once_its_record_resolved() {
    let own = "ours";
    let payload = crate::hex::sha256_hex(b"a payload over 256 KiB");
    let pointer = S3Pointer {
        bucket: own.into(),
        key: crate::pointer::payload_key("order-1", &payload),
    }
    .to_body();
    let recorded = crate::hex::sha256_hex(pointer.as_bytes());
    let attributes = |name: &str| match name {
        SOURCE_MESSAGE_ID_ATTRIBUTE => Some("r1"),
        PAYLOAD_SHA256_ATTRIBUTE => Some(recorded.as_str()),
        crate::message::ITEM_ID_ATTRIBUTE => Some("order-1"),
        _ => None,
    };
    let dlq_message = MessageView::of("d2", &pointer, attributes, own);
    let resolved = record(
        ItemStatus::Resolved,
        "r1",
        &recorded,
        &["msg:r2", &format!("sha:{recorded}")],
    );
    assert_eq!(
        decide(&dlq_message, Some(&resolved)),
        MessageFate::Delete,
        "the record processed this very body; reopening it redelivers the payload"
    );
}

/// Our own offloaded DLQ message whose object is gone (a purge deleted it
/// while the message was in flight; a lifecycle rule) is adopted with its pointer as
/// its payload (`Adoption::unfetched_payload`: not found). `dlq purge` of that record
/// must take the message: nothing else ever can (the record can never resolve), and
/// the record's removal leaves the message to be adopted again at every sweep.
#[test]
fn a_purge_takes_our_own_pointer_message_adopted_with_its_object_gone() {
    let own = "ours";
    let payload = crate::hex::sha256_hex(b"a payload that was offloaded");
    let pointer = S3Pointer {
        bucket: own.into(),
        key: crate::pointer::payload_key("order-1", &payload),
    }
    .to_body();
    let attributes = |name: &str| match name {
        SOURCE_MESSAGE_ID_ATTRIBUTE => Some("s1"),
        PAYLOAD_SHA256_ATTRIBUTE => Some(payload.as_str()),
        crate::message::ITEM_ID_ATTRIBUTE => Some("order-1"),
        _ => None,
    };
    let dlq_message = MessageView::of("d1", &pointer, attributes, own);
    assert_eq!(
        dlq_message.payload_sha256.as_deref(),
        Some(payload.as_str())
    );
    let mut item = WorkItem::new("d1", pointer.clone());
    item.item_id = "order-1".into();
    let adopted = adopted_record(
        item,
        ProcessError::new(crate::ErrorClass::NotFound, "NoSuchKey").with_step("dlq-adopt"),
        "d1",
        dlq_message.source_message_id.clone(),
        &Adoption {
            reason: "moved",
            reopen: false,
            known_queue_arn: None,
            expected_status: None,
            message_keys: dlq_message.keys(),
        },
        Duration::from_secs(60),
        chrono::Utc::now(),
    );
    let selected = Standing::of(&adopted);
    assert!(
        purge_takes(&dlq_message, &selected),
        "the purge keeps the very message its record was adopted from"
    );
}

/// A producer's Extended-Client pointer (into its own bucket) keeps its attributes into
/// the DLQ: a `source_message_id` naming a delivery the record processed got it deleted
/// as that delivery, its payload never read by anyone. Without our `item_id` beside it,
/// the attribute is not believed.
#[test]
fn a_producers_pointer_naming_a_processed_delivery_is_not_deleted() {
    let pointer = S3Pointer {
        bucket: "producers".into(),
        key: "large/other-payload".into(),
    }
    .to_body();
    let forged = |name: &str| (name == SOURCE_MESSAGE_ID_ATTRIBUTE).then_some("src-1");
    let message = MessageView::of("m-9", &pointer, forged, "ours");
    let processed = crate::hex::sha256_hex(b"{\"id\":\"a\",\"v\":1}");
    let resolved = record(
        ItemStatus::Resolved,
        "src-1",
        &processed,
        &["msg:src-1", &format!("sha:{processed}")],
    );
    assert_ne!(decide(&message, Some(&resolved)), MessageFate::Delete);
}

/// A pass out of time mid-page: the messages it did not judge are neither
/// deleted nor adopted by the pass, and are settled by their records afterwards (the
/// processed one deleted, the one to reopen given back, the unrecorded one visible).
#[tokio::test(start_paused = true)]
async fn unjudged_messages_are_settled_by_their_records_and_none_is_lost() {
    let store = MemoryStore::new();
    orphan(&store, "i0");
    dead(&store, "i1");
    resolve(&store, "i1");
    orphan(&store, "i2");
    dead(&store, "i3");
    resolve_another_body(&store, "i3");
    adoptions_take_ten_seconds(&store);
    let options = SweepOptions {
        until: Some(Instant::now() + Duration::from_secs(5)),
        ..adopting()
    };
    let sweep = sweep_dlq(&store, &options).await.unwrap();
    assert_eq!((sweep.seen, sweep.adopted, sweep.deleted), (1, 1, 0));
    assert_eq!(left(&store), 4, "nothing deleted unjudged");
    let settled = settle_held(&store, sweep.held, Duration::ZERO, Duration::ZERO, None)
        .await
        .unwrap();
    assert_eq!((settled.deleted, settled.to_reopen), (1, 1));
    assert_eq!(visible(&store), ["i0", "i2", "i3"]);
}

/// The record is resolved by another body; the sweep judges the DLQ message of its first
/// delivery (not listed processed): reopen, expecting `resolved`. Before the write lands,
/// the record changes (that delivery listed processed, by its message id and its payload
/// digest, as the worker lists it), its status still `resolved`. The reopening does not
/// overwrite it: its condition is the status and that the record still lists none of the
/// message's keys as processed (what the condition means on DynamoDB:
/// `pipeline.rs::the_store_conditions_mean_on_dynamodb_what_they_mean_in_memory`).
#[tokio::test]
async fn a_reopening_never_overwrites_a_record_that_processed_the_message_since() {
    let store = MemoryStore::new();
    let mut record = dead(&store, "x");
    record.status = ItemStatus::Resolved;
    record.processed = vec!["msg:other".into(), "sha:other".into()];
    store.insert(record);
    // Another writer's change lands while the adoption's write is on its way.
    store.world().lock().latency = Some(|state, operation| {
        if operation == "try_record" {
            if let Some(row) = state.table.get_mut("x") {
                let r = &mut row.record;
                let keys = [
                    crate::dead_letter::processed_key_for_message(&r.source.message_id),
                    crate::dead_letter::processed_key_for_payload(&r.payload.sha256),
                ];
                for key in keys {
                    if !r.processed.contains(&key) {
                        r.processed.push(key);
                    }
                }
            }
        }
        None
    });
    let sweep = sweep_dlq(&store, &adopting()).await.unwrap();
    settle_held(&store, sweep.held, Duration::ZERO, Duration::ZERO, None)
        .await
        .unwrap();
    let after = store.record("x").unwrap();
    assert!(
        after.processed.iter().any(|k| k.starts_with("msg:m-x")),
        "the sweep judged the message for reopening: {:?}",
        after.processed
    );
    assert_eq!(
        after.status,
        ItemStatus::Resolved,
        "a record that changed after the judgement was overwritten (adopted {}): processed {:?}",
        sweep.adopted,
        after.processed
    );
}

/// The settling's "live lease" and the store's "lease free to take back" are two readings
/// of one lease, and are complements: a lease no run may take back yet is one the settling
/// waits for, through its last second (`conditions::lease_is_free`, what DynamoDB and the
/// world evaluate, is `expires < now`; the settling's reading was `expires > now`, and at
/// `now == expires` gave up on a lease the store still held).
#[test]
fn the_settlings_live_lease_is_the_complement_of_the_stores_free_lease() {
    let mut record = dead_record("a", crate::ErrorClass::Throttled, 1);
    record.status = ItemStatus::Redriving;
    record.lease_expires_at = Some(1_000);
    let mut row = crate::testing::Row::of(record.clone());
    row.lease_owner = Some("run-1".into());
    let standing = Standing::of(&record);
    for now in [998, 999, 1_000, 1_001, 1_002] {
        let free = row.satisfies(&crate::condition::conditions::lease_is_free(now));
        assert_eq!(
            standing.leased_at(now),
            !free,
            "at {now}: the store {} the lease taken back, the settling judges it {}",
            if free { "lets" } else { "refuses" },
            if standing.leased_at(now) {
                "live"
            } else {
                "expired"
            }
        );
    }
}

/// Issue: a FIFO DLQ message near SQS's size limit that the queue's redrive policy moved
/// (none of our attributes) could never be rotated: the copy's added attributes pushed it
/// over the limit, SQS refused it, and its group stayed out of the sweep's reach. The copy
/// takes only the additions that fit.
#[tokio::test]
async fn a_fifo_dlq_message_at_the_size_limit_is_still_moved_behind_its_group() {
    let store = MemoryStore::new();
    store.world().lock().dlq = Queue::new("orders-dlq.fifo", None);
    let limit = store.world().lock().dlq.max_message_bytes;
    // 18 bytes short of the limit: any one attribute added pushes it over.
    let body = format!("{{\"id\":\"big\",\"blob\":\"{}\"}}", "y".repeat(limit - 40));
    assert_eq!(body.len(), limit - 18);
    store.send_dlq_message(&body, &[], Some("g1"));
    store.send_dlq_message("{\"id\":\"after\"}", &[], Some("g1"));
    let sweep = sweep_dlq(&store, &SweepOptions::default()).await.unwrap();
    assert_eq!(sweep.rotated, 2, "{:?}", sweep.errors);
    assert_eq!(left(&store), 2, "the copies in place of the originals");
    let state = store.world().lock();
    for message in state.dlq.messages() {
        assert!(
            crate::message::message_size(&message.body, &message.attributes) <= limit,
            "every copy within the limit"
        );
    }
}

/// Issue: the settle phase was unbounded: on a large DLQ it could run a redrive past its
/// Lambda deadline. It settles a hundred items at a time and starts none at or after its
/// end; what it did not reach stays held until its hold lapses, and nothing is lost.
#[tokio::test(start_paused = true)]
async fn settling_ends_by_its_deadline_and_leaves_the_rest_held() {
    let store = MemoryStore::new();
    for n in 0..1_000 {
        dead(&store, &format!("item-{n:04}"));
    }
    let sweep = sweep_dlq(&store, &SweepOptions::default()).await.unwrap();
    assert_eq!(sweep.held.values().map(Vec::len).sum::<usize>(), 1_000);
    // Each standings read takes five seconds.
    store.world().lock().latency =
        Some(|_, operation| (operation == "standings").then_some(Duration::from_secs(5)));
    let started = tokio::time::Instant::now();
    let until = started + Duration::from_secs(12);
    let settled = settle_held(
        &store,
        sweep.held,
        Duration::ZERO,
        Duration::ZERO,
        Some(until),
    )
    .await
    .unwrap();
    assert!(tokio::time::Instant::now() <= until + Duration::from_secs(5));
    assert_eq!(
        settled.left_held, 700,
        "three rounds of a hundred, then the end"
    );
    assert_eq!(left(&store), 1_000, "nothing deleted or lost");
}
