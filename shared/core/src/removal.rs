//! Removing records for good (`dlq purge`, `dlq clear`), over ports. Each selected record
//! is deleted on the condition that it is still as selected ([`Selected::condition`]), and
//! only then its DLQ messages, so that one condition decides both: a redrive that fails the
//! item again meanwhile keeps the record and its messages (docs/ARCHITECTURE.md §4). The
//! sweep holds a message invisible while its record is deleted, so no other sweep adopts it
//! in between. A removal cut between the two leaves a message without its record, which
//! the next sweep adopts with its payload: nothing is lost. Payload objects go last. An
//! object whose record is gone is only storage (the bucket's lifecycle expires it). A
//! record whose object is gone has lost its payload.
//!
//! An item in flight ([`crate::dead_letter::ItemStatus::is_in_flight`]) is never removed, whatever was
//! selected. A `requeued` record's message waits in the source queue, pointing to the
//! record's payload object. A `redriving` one is held by a run.
//!
//! Over the store's ports: the DLQ ([`DeadLetterQueue`], through the sweep), the records
//! ([`RecordStore::delete_records`]) and the payloads ([`PayloadStore::delete`]). Callers
//! confirm with the operator first.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde::Serialize;

use crate::dead_letter::{DeadLetteredItem, PayloadLocation};
use crate::error::ProcessError;
use crate::item::ItemParser;
use crate::pointer::S3Pointer;
use crate::ports::{DeadLetterQueue, PayloadStore, RecordStore, Selected};
use crate::random::Random;
use crate::sweep::SweepOptions;

/// The most records one [`RecordStore::delete_records`] call takes.
pub const DELETE_CHUNK: usize = 25;

/// What a purge or clear removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RemovalReport {
    /// Records deleted.
    pub records_deleted: usize,
    /// Records selected but kept, because they changed after they were selected (a new
    /// failure of the same item arrived meanwhile, or a redrive took it).
    pub records_changed: usize,
    /// Records selected but kept because they are in flight (`requeued`, `redriving`).
    pub records_in_flight: usize,
    /// Payload objects deleted.
    pub payloads_deleted: usize,
    /// Payload objects of deleted records kept, because a live message may still point to
    /// them: the record failed within SQS's longest retention (a DLQ message another run
    /// holds), or its item has a record again that names the object. The bucket's
    /// lifecycle expires them.
    #[serde(default)]
    pub payloads_kept: usize,
    /// DLQ messages deleted.
    pub dlq_messages_deleted: usize,
}

/// What a removal keeps of a selected record: its selection and its payload object, a few
/// hundred bytes where the record (its history, an inline payload) may hold 400 KB. A
/// purge of a large table holds these, never the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removable {
    /// The record as selected.
    pub selected: Selected,
    /// Its payload object, when it is in S3.
    pub payload: Option<S3Pointer>,
    /// Its last attempt when selected.
    pub last_attempt: chrono::DateTime<chrono::Utc>,
}

impl Removable {
    /// Returns `record` as a removal selects it now.
    pub fn of(record: &DeadLetteredItem) -> Removable {
        Removable {
            selected: Selected::of(record),
            payload: match &record.payload.location {
                PayloadLocation::S3 { bucket, key } => Some(S3Pointer {
                    bucket: bucket.clone(),
                    key: key.clone(),
                }),
                PayloadLocation::Inline { .. } => None,
            },
            last_attempt: record.last_attempt,
        }
    }
}

/// Removes `records`: each one still as selected with the DLQ messages it holds (only
/// those: a message of the same item id that arrived after the selection is kept,
/// [`crate::sweep::purge_takes`]), then the payload objects of the records deleted.
/// Records in flight are kept. `progress` is told the running count of records decided.
/// The DLQ's sweep draws its marker from `random`.
pub async fn remove_records<S>(
    store: &S,
    records: &[DeadLetteredItem],
    parser: &ItemParser,
    random: &Random,
    progress: impl FnMut(usize),
) -> Result<RemovalReport, ProcessError>
where
    S: RecordStore + DeadLetterQueue + PayloadStore,
{
    let selected: Vec<Removable> = records.iter().map(Removable::of).collect();
    remove(store, &selected, parser, random, None, progress).await
}

/// [`remove_records`] over compact selections ([`Removable`]).
pub async fn remove_selected<S>(
    store: &S,
    selected: &[Removable],
    parser: &ItemParser,
    random: &Random,
    progress: impl FnMut(usize),
) -> Result<RemovalReport, ProcessError>
where
    S: RecordStore + DeadLetterQueue + PayloadStore,
{
    remove(store, selected, parser, random, None, progress).await
}

/// Empties the store as it was at `snapshot_ms` (epoch ms): [`remove_records`] over
/// `records` (every record read then), and every DLQ message no record holds that was sent
/// before then. A failure that arrived since (its record, or its message moved by the
/// queue's redrive policy) is kept, and so are items in flight.
pub async fn clear_records<S>(
    store: &S,
    records: &[Removable],
    snapshot_ms: i64,
    random: &Random,
    progress: impl FnMut(usize),
) -> Result<RemovalReport, ProcessError>
where
    S: RecordStore + DeadLetterQueue + PayloadStore,
{
    let parser = ItemParser::default();
    // A record read after the snapshot that failed since is a new failure: kept.
    let snapshot_ms = if crate::mutants::is_on(crate::mutants::Mutant::ClearIgnoresItsSnapshot) {
        i64::MAX
    } else {
        snapshot_ms
    };
    let before: Vec<Removable> = records
        .iter()
        .filter(|r| r.last_attempt.timestamp_millis() < snapshot_ms)
        .cloned()
        .collect();
    remove(store, &before, &parser, random, Some(snapshot_ms), progress).await
}

/// Removes `records`, in order: their DLQ messages (the sweep takes a message only once
/// its record is deleted on the condition that it is still as selected), then the records
/// the DLQ held no message of, then their payload objects. A record in flight is never
/// removed.
async fn remove<S>(
    store: &S,
    records: &[Removable],
    parser: &ItemParser,
    random: &Random,
    orphans_sent_before_ms: Option<i64>,
    mut progress: impl FnMut(usize),
) -> Result<RemovalReport, ProcessError>
where
    S: RecordStore + DeadLetterQueue + PayloadStore,
{
    let mut report = RemovalReport::default();
    let (in_flight, removable): (Vec<&Removable>, Vec<&Removable>) =
        records.iter().partition(|r| {
            r.selected.status.is_in_flight()
                && !crate::mutants::is_on(crate::mutants::Mutant::PurgeRemovesInFlight)
        });
    report.records_in_flight = in_flight.len();
    let purge: HashMap<String, Selected> = removable
        .iter()
        .map(|r| (r.selected.item_id.clone(), r.selected.clone()))
        .collect();
    let sweep = crate::sweep::sweep_dlq(
        store,
        &SweepOptions {
            adopt: false,
            purge,
            parser: parser.clone(),
            until: None,
            hold_until: None,
            random: random.clone(),
            orphans_sent_before_ms,
        },
    )
    .await?;
    report.dlq_messages_deleted = sweep.deleted;
    let held: Vec<String> = sweep
        .held
        .into_values()
        .flatten()
        .map(|m| m.receipt)
        .collect();
    store.hold(&held, Duration::ZERO).await?;
    let mut removed: BTreeSet<String> = sweep.removed;
    let mut changed = sweep.changed.len();
    progress(removed.len() + changed);
    // The records the DLQ held no message of.
    let rest: Vec<Selected> = removable
        .iter()
        .map(|r| &r.selected)
        .filter(|s| !removed.contains(&s.item_id) && !sweep.changed.contains(&s.item_id))
        .cloned()
        .collect();
    for chunk in rest.chunks(DELETE_CHUNK) {
        let deleted = store.delete_records(chunk).await?;
        changed += chunk.len() - deleted.len().min(chunk.len());
        removed.extend(deleted);
        progress(removed.len() + changed);
    }
    report.records_deleted = removed.len();
    report.records_changed = changed;
    remove_payloads(store, &removable, &removed, &mut report).await?;
    Ok(report)
}

/// Deletes the payload objects of the `removed` records, last: an object a message of the
/// same payload may still need is kept ([`object_may_be_live`]). Counted in `report`.
async fn remove_payloads<S>(
    store: &S,
    removable: &[&Removable],
    removed: &BTreeSet<String>,
    report: &mut RemovalReport,
) -> Result<(), ProcessError>
where
    S: RecordStore + DeadLetterQueue + PayloadStore,
{
    let now = store.clock().now();
    let kept_objects_too = crate::mutants::is_on(crate::mutants::Mutant::PurgeDeletesKeptObjects);
    for removal in removable
        .iter()
        .filter(|r| removed.contains(&r.selected.item_id) || kept_objects_too)
    {
        let Some(pointer) = &removal.payload else {
            continue;
        };
        let kept = !removed.contains(&removal.selected.item_id);
        if !kept && object_may_be_live(store, removal, pointer, now).await? {
            report.payloads_kept += 1;
        } else {
            PayloadStore::delete(store, pointer).await?;
            report.payloads_deleted += 1;
        }
    }
    Ok(())
}

/// SQS's longest message retention. A DLQ message holds a delivery no later than its
/// record's last attempt, so past this no message of the record can be left.
const MAX_SQS_RETENTION: chrono::Duration = chrono::Duration::days(14);

/// Tells whether a message of a record last attempted at `last_attempt` may still be delivered
/// at `now`: a DLQ message, or a source message of the same payload in flight. Past SQS's
/// longest retention none can be.
pub(crate) fn may_still_be_delivered(
    last_attempt: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    now.signed_duration_since(last_attempt) <= MAX_SQS_RETENTION
}

/// Tells whether a live message may point to the object of a record just deleted. A DLQ message
/// of the record may still be held by another run (a scheduled sweep, a redrive), which
/// this removal's sweep never saw, until SQS's retention has passed since the last
/// attempt. And the item may have been dead-lettered again since, its new record (and
/// its new DLQ message) naming the same object.
async fn object_may_be_live<S: RecordStore>(
    store: &S,
    removal: &Removable,
    pointer: &S3Pointer,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<bool, ProcessError> {
    if may_still_be_delivered(removal.last_attempt, now) {
        return Ok(true);
    }
    let current = store.get(&removal.selected.item_id).await?;
    Ok(current.is_some_and(|record| {
        matches!(&record.payload.location, PayloadLocation::S3 { bucket, key }
            if *bucket == pointer.bucket && *key == pointer.key)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dead_letter::ItemStatus;
    use crate::testing::{dead_record, MemoryStore};
    use crate::ErrorClass;

    async fn purge(store: &MemoryStore, selected: &[DeadLetteredItem]) -> RemovalReport {
        remove_records(
            store,
            selected,
            &ItemParser::default(),
            &Random::seeded(7),
            |_| {},
        )
        .await
        .unwrap()
    }

    fn with_object(store: &MemoryStore, mut record: DeadLetteredItem) -> DeadLetteredItem {
        let pointer = S3Pointer {
            bucket: "store".into(),
            key: format!("payloads/{}", record.item_id),
        };
        store.put_payload(&pointer, "{}");
        record.payload.location = PayloadLocation::S3 {
            bucket: pointer.bucket,
            key: pointer.key,
        };
        record
    }

    /// Issue: the sweep judged a purge's DLQ message unchanged by status and source
    /// message, the record delete by status and last attempt. A redrive that failed the
    /// item again in between left a dead record without its DLQ message.
    #[tokio::test]
    async fn a_record_failed_again_since_its_selection_keeps_its_dlq_message() {
        let store = MemoryStore::new();
        let selected = dead_record("order-1", ErrorClass::Throttled, 48);
        store.insert_dead_lettered(selected.clone());
        // A redrive fails it again: same status, same delivery, a later last attempt.
        let mut failed_again = selected.clone();
        failed_again.last_attempt = chrono::Utc::now();
        failed_again.failure_count += 1;
        store.insert(failed_again);

        let report = purge(&store, std::slice::from_ref(&selected)).await;

        assert_eq!(report.records_deleted, 0);
        assert_eq!(report.records_changed, 1);
        assert_eq!(report.dlq_messages_deleted, 0);
        assert!(store.record("order-1").is_some());
        assert_eq!(
            store.dlq_messages().len(),
            1,
            "the record keeps its message"
        );
    }

    #[tokio::test]
    async fn a_record_still_as_selected_goes_with_its_message_and_object() {
        let store = MemoryStore::new();
        // Older than SQS's retention: no other message of it can be left.
        let selected = with_object(
            &store,
            dead_record("order-1", ErrorClass::Throttled, 24 * 15),
        );
        store.insert_dead_lettered(selected.clone());

        let report = purge(&store, std::slice::from_ref(&selected)).await;

        assert_eq!(report.records_deleted, 1);
        assert_eq!(report.dlq_messages_deleted, 1);
        assert_eq!(report.payloads_deleted, 1);
        assert!(store.record("order-1").is_none());
        assert!(store.dlq_messages().is_empty());
    }

    /// Issue: `dlq purge --older-than N` (status `any`) deleted a requeued record and the
    /// object its message in the source queue points to, and a record under a live lease.
    #[tokio::test]
    async fn an_item_in_flight_is_never_removed_nor_its_payload() {
        let store = MemoryStore::new();
        let mut requeued = with_object(&store, dead_record("order-1", ErrorClass::Throttled, 48));
        requeued.status = ItemStatus::Requeued;
        requeued.requeued_message_id = Some("sent-1".into());
        store.insert(requeued.clone());
        let mut redriving = with_object(&store, dead_record("order-2", ErrorClass::Throttled, 48));
        redriving.status = ItemStatus::Redriving;
        redriving.lease_expires_at = Some(chrono::Utc::now().timestamp() + 600);
        store.insert(redriving.clone());

        let report = purge(&store, &[requeued.clone(), redriving.clone()]).await;

        assert_eq!(report.records_deleted, 0);
        assert_eq!(report.records_in_flight, 2);
        assert_eq!(report.payloads_deleted, 0);
        for record in [&requeued, &redriving] {
            assert!(store.record(&record.item_id).is_some());
            let PayloadLocation::S3 { bucket, key } = &record.payload.location else {
                unreachable!("stored in S3 above");
            };
            let pointer = S3Pointer {
                bucket: bucket.clone(),
                key: key.clone(),
            };
            assert!(
                store.has_payload(&pointer),
                "{} keeps its object",
                record.item_id
            );
        }
    }

    /// A selection made while dead, requeued since: the delete's condition refuses it.
    #[tokio::test]
    async fn a_record_requeued_since_its_selection_is_kept() {
        let store = MemoryStore::new();
        let selected = with_object(&store, dead_record("order-1", ErrorClass::Throttled, 48));
        store.insert(selected.clone());
        let mut requeued = selected.clone();
        requeued.status = ItemStatus::Requeued;
        store.insert(requeued);

        let report = purge(&store, std::slice::from_ref(&selected)).await;

        assert_eq!(report.records_deleted, 0);
        assert_eq!(report.payloads_deleted, 0);
        assert_eq!(
            store.record("order-1").map(|r| r.status),
            Some(ItemStatus::Requeued)
        );
    }

    /// Issue: `dlq clear` purged the whole DLQ after removing the records it had read, so
    /// the DLQ messages of failures recorded after its snapshot went without their records
    /// knowing. A clear deletes the messages of the records it read, and the messages no
    /// record holds that were sent before its snapshot; a record written since keeps its
    /// message, and so does an orphan sent since.
    #[tokio::test]
    async fn a_clear_keeps_the_failures_that_arrived_after_its_snapshot() {
        let store = MemoryStore::new();
        let read = dead_record("old", ErrorClass::Throttled, 48);
        store.insert_dead_lettered(read.clone());
        let orphan_before = dead_record("orphan-before", ErrorClass::Throttled, 48);
        store.send_dead_letter(&orphan_before);
        let snapshot_ms = store.world().now_ms() + 1;
        // After the snapshot: a new failure recorded, and a message no record holds yet.
        let new_failure = dead_record("new", ErrorClass::Throttled, 0);
        let orphan_after = dead_record("orphan-after", ErrorClass::Throttled, 0);
        let sent_after = vec![
            store.send_dead_letter_at(&new_failure, snapshot_ms + 5_000),
            store.send_dead_letter_at(&orphan_after, snapshot_ms + 5_000),
        ];
        store.insert(new_failure);

        let report = clear_records(
            &store,
            &[Removable::of(&read)],
            snapshot_ms,
            &Random::seeded(3),
            |_| {},
        )
        .await
        .unwrap();

        assert_eq!(report.records_deleted, 1);
        assert_eq!(
            report.dlq_messages_deleted, 2,
            "old's and the orphan sent before"
        );
        let mut left: Vec<String> = store
            .dlq_messages()
            .into_iter()
            .map(|m| m.message_id)
            .collect();
        left.sort();
        let mut expected = sent_after;
        expected.sort();
        assert_eq!(left, expected);
        assert!(store.record("new").is_some());
    }

    /// A failure whose attempt began before a clear's snapshot and whose record and DLQ
    /// message were written after it arrived after the snapshot: the clear keeps both,
    /// though the record's last attempt predates the snapshot.
    #[tokio::test]
    async fn a_clear_keeps_a_failure_whose_message_came_after_its_snapshot() {
        let store = MemoryStore::new();
        let spanning = dead_record("spanning", ErrorClass::Throttled, 1);
        let snapshot_ms = store.world().now_ms() + 1;
        let message = store.send_dead_letter_at(&spanning, snapshot_ms + 5_000);
        store.insert(spanning.clone());

        let report = clear_records(
            &store,
            &[Removable::of(&spanning)],
            snapshot_ms,
            &Random::seeded(3),
            |_| {},
        )
        .await
        .unwrap();

        assert_eq!(report.records_deleted, 0);
        assert_eq!(report.records_changed, 1);
        assert_eq!(report.dlq_messages_deleted, 0);
        assert!(store.record("spanning").is_some());
        let left: Vec<String> = store
            .dlq_messages()
            .into_iter()
            .map(|m| m.message_id)
            .collect();
        assert_eq!(left, vec![message]);
    }

    #[test]
    fn a_selection_in_flight_matches_no_record() {
        let mut record = dead_record("order-1", ErrorClass::Throttled, 1);
        record.status = ItemStatus::Requeued;
        let condition = Selected::of(&record).condition();
        let row = crate::testing::Row::of(record);
        assert!(!row.satisfies(&condition));
    }
}

#[cfg(test)]
mod race_tests {
    use super::*;
    use crate::pointer::payload_key;
    use crate::testing::{dead_record, Event, MemoryStore, Row, WorldState, BUCKET};
    use crate::ErrorClass;

    /// `record` with its payload in the store's bucket under the key dead-lettering gives it.
    fn in_s3(store: &MemoryStore, mut record: DeadLetteredItem) -> (DeadLetteredItem, S3Pointer) {
        let body = match &record.payload.location {
            PayloadLocation::Inline { body } => body.clone(),
            PayloadLocation::S3 { .. } => unreachable!(),
        };
        let pointer = S3Pointer {
            bucket: BUCKET.into(),
            key: payload_key(&record.item_id, &record.payload.sha256),
        };
        store.put_payload(&pointer, &body);
        record.payload.location = PayloadLocation::S3 {
            bucket: pointer.bucket.clone(),
            key: pointer.key.clone(),
        };
        (record, pointer)
    }

    /// Guarantee 1/2: a scheduled sweep (or a redrive run) holds the item's DLQ message while
    /// a purge runs. The purge does not see the message, deletes the record through its
    /// "rest" path, then the payload object the still-live DLQ message points to.
    #[tokio::test]
    async fn purge_keeps_the_object_a_held_dlq_message_points_to() {
        let store = MemoryStore::new();
        let (record, pointer) = in_s3(&store, dead_record("order-1", ErrorClass::Throttled, 48));
        store.insert_dead_lettered(record.clone());
        // Another run's sweep holds the DLQ message (invisible) at this moment.
        let held = DeadLetterQueue::receive(
            &store.as_actor("scheduled-sweep"),
            Duration::from_secs(600),
            &ItemParser::default(),
        )
        .await
        .unwrap();
        assert_eq!(held.len(), 1);

        let report = remove_records(
            &store,
            std::slice::from_ref(&record),
            &ItemParser::default(),
            &Random::seeded(7),
            |_| {},
        )
        .await
        .unwrap();

        assert_eq!(
            store.dlq_messages().len(),
            1,
            "the held DLQ message is live"
        );
        assert!(
            store.has_payload(&pointer),
            "the purge deleted the object its live DLQ message points to: {report:?}"
        );
    }

    static REFAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// A worker dead-letters item order-1 again (same body, so the same object key) right
    /// after the purge deleted its record: a new record, its object put again, its DLQ
    /// message sent.
    fn worker_refails(state: &mut WorldState, _actor: &str, event: &Event<'_>) {
        let Event::RecordDeleted {
            item: "order-1",
            row,
        } = event
        else {
            return;
        };
        if REFAILED.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut again = row.record.clone();
        again.last_attempt = chrono::Utc::now();
        again.source.message_id = "m-order-1-again".into();
        let PayloadLocation::S3 { bucket, key } = again.payload.location.clone() else {
            unreachable!()
        };
        state
            .bucket
            .insert((bucket.clone(), key.clone()), "{\"id\":\"order-1\"}".into());
        state.table.insert("order-1".into(), Row::of(again));
        let body = S3Pointer { bucket, key }.to_body();
        let attributes = vec![
            (
                crate::message::ITEM_ID_ATTRIBUTE.to_string(),
                crate::dead_letter::MessageAttribute::string("order-1"),
            ),
            (
                crate::message::SOURCE_MESSAGE_ID_ATTRIBUTE.to_string(),
                crate::dead_letter::MessageAttribute::string("m-order-1-again"),
            ),
        ];
        state.dlq.send(body, attributes, None, 0);
    }

    /// Guarantee 2: the same item dead-lettered again (same payload) while a purge runs. The
    /// purge deletes payload objects only after every record, by key: it deletes the object
    /// the new record and its live DLQ message point to.
    #[tokio::test]
    async fn purge_keeps_the_object_of_the_same_item_dead_lettered_again_meanwhile() {
        let store = MemoryStore::new();
        let (record, pointer) = in_s3(
            &store,
            dead_record("order-1", ErrorClass::Throttled, 24 * 20),
        );
        store.insert_dead_lettered(record.clone());
        store.world().lock().observer = Some(worker_refails);

        let report = remove_records(
            &store,
            std::slice::from_ref(&record),
            &ItemParser::default(),
            &Random::seeded(7),
            |_| {},
        )
        .await
        .unwrap();

        assert!(REFAILED.load(std::sync::atomic::Ordering::SeqCst));
        let live = store.record("order-1").expect("the new failure's record");
        assert!(matches!(live.payload.location, PayloadLocation::S3 { .. }));
        assert!(
            store.has_payload(&pointer),
            "the new record's (and its live DLQ message's) payload object was deleted: {report:?}"
        );
    }

    /// Guarantee 2: two items whose ids differ only in characters the key makes safe
    /// ("order/1", "order:1") and whose payloads are the same share one object. Purging
    /// one deletes the object of the other, which is not selected and still dead.
    #[tokio::test]
    async fn purge_keeps_the_object_of_another_item_sharing_its_key() {
        let store = MemoryStore::new();
        // Older than SQS's retention: only the key can keep the other's object.
        let mut old = dead_record("order/1", ErrorClass::Throttled, 24 * 20);
        let mut other = dead_record("order:1", ErrorClass::Throttled, 24 * 20);
        // The same payload (e.g. a producer that resends a body under another key).
        other.payload = old.payload.clone();
        old.payload = other.payload.clone();
        let (old, old_pointer) = in_s3(&store, old);
        let (other, other_pointer) = in_s3(&store, other);
        assert_ne!(old_pointer, other_pointer, "an object of each item's own");
        store.insert_dead_lettered(old.clone());
        store.insert_dead_lettered(other.clone());

        let report = remove_records(
            &store,
            std::slice::from_ref(&old),
            &ItemParser::default(),
            &Random::seeded(7),
            |_| {},
        )
        .await
        .unwrap();

        assert_eq!(report.records_deleted, 1);
        assert!(store.record("order:1").is_some());
        assert!(
            store.has_payload(&other_pointer),
            "the unselected record order:1 lost its payload object: {report:?}"
        );
    }

    /// Guarantee 11: a failure whose message the source queue's redrive policy moves to the
    /// DLQ after the clear's snapshot is a failure that arrived after it (the module says so:
    /// "its message moved by the queue's redrive policy"). SQS keeps a moved message's
    /// SentTimestamp (its original enqueue time, before the snapshot), and the clear judges
    /// orphans by it: the new failure's only copy is deleted.
    #[tokio::test]
    async fn clear_keeps_a_message_moved_by_the_redrive_policy_after_its_snapshot() {
        let store = MemoryStore::new();
        let now_ms = store.world().now_ms();
        // Sent to the source queue a minute before the clear; its receives are running out.
        let mut source = crate::testing::Queue::new("orders", Some(3));
        source.send(
            "{\"id\":\"late\"}".into(),
            Vec::new(),
            None,
            now_ms - 60_000,
        );
        let message = source.messages()[0].clone();
        let snapshot_ms = now_ms;
        // After the snapshot: the worker crashed on it a third time; SQS moves it.
        store.world().lock().dlq.accept_moved(message, &source.arn);

        let report = clear_records(&store, &[], snapshot_ms, &Random::seeded(3), |_| {})
            .await
            .unwrap();

        assert_eq!(
            store.dlq_messages().len(),
            1,
            "the clear deleted a failure that arrived after its snapshot: {report:?}"
        );
    }

    /// Issue: a message SQS's redrive policy moved to the DLQ after a clear's snapshot, and
    /// that a sweep adopted before the clear read its page, was cleared. The adopted
    /// record's last attempt was the message's `SentTimestamp`, its source queue's, before
    /// the snapshot. An adopted record is dated by its adoption now, so the clear keeps it.
    #[tokio::test]
    async fn a_clear_keeps_a_moved_message_adopted_after_its_snapshot() {
        let store = MemoryStore::new();
        let now_ms = store.world().now_ms();
        let mut source = crate::testing::Queue::new("orders", Some(3));
        source.send(
            "{\"id\":\"late\"}".into(),
            Vec::new(),
            None,
            now_ms - 60_000,
        );
        let message = source.messages()[0].clone();
        let snapshot_ms = now_ms;
        // After the snapshot: SQS moves it, and a scheduled sweep adopts it.
        store.world().lock().dlq.accept_moved(message, &source.arn);
        let sweep = crate::sweep::sweep_dlq(
            &store,
            &SweepOptions {
                adopt: true,
                ..SweepOptions::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(sweep.adopted, 1, "{sweep:?}");
        let receipts: Vec<String> = sweep
            .held
            .into_values()
            .flatten()
            .map(|m| m.receipt)
            .collect();
        store.hold(&receipts, Duration::ZERO).await.unwrap();
        // The clear reads the table after the adoption (a page every few seconds).
        let ids: Vec<String> = store.world().lock().table.keys().cloned().collect();
        assert_eq!(ids.len(), 1, "{ids:?}");
        let id = ids[0].clone();
        let read = store.record(&id).expect("adopted");
        assert!(
            read.last_attempt.timestamp_millis() >= snapshot_ms,
            "the adopted record is dated by its adoption"
        );

        let report = clear_records(
            &store,
            &[Removable::of(&read)],
            snapshot_ms,
            &Random::seeded(3),
            |_| {},
        )
        .await
        .unwrap();

        assert_eq!(
            store.dlq_messages().len(),
            1,
            "the clear deleted a failure whose message SQS moved after its snapshot: {report:?}"
        );
        assert!(store.record(&id).is_some(), "{report:?}");
    }
}
