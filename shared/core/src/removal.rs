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
//! An item in flight ([`crate::ItemStatus::is_in_flight`]) is never removed, whatever was
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
}

impl Removable {
    /// `record` as a removal selects it now.
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
    remove(store, records, &parser, random, Some(snapshot_ms), progress).await
}

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
    let (in_flight, removable): (Vec<&Removable>, Vec<&Removable>) = records
        .iter()
        .partition(|r| r.selected.status.is_in_flight());
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
    for removal in removable
        .iter()
        .filter(|r| removed.contains(&r.selected.item_id))
    {
        if let Some(pointer) = &removal.payload {
            PayloadStore::delete(store, pointer).await?;
            report.payloads_deleted += 1;
        }
    }
    Ok(report)
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
        let selected = with_object(&store, dead_record("order-1", ErrorClass::Throttled, 48));
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

    #[test]
    fn a_selection_in_flight_matches_no_record() {
        let mut record = dead_record("order-1", ErrorClass::Throttled, 1);
        record.status = ItemStatus::Requeued;
        let condition = Selected::of(&record).condition();
        let row = crate::testing::Row::of(record);
        assert!(!row.satisfies(&condition));
    }
}
