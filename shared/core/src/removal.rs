//! Removing records for good (`dlq purge`, `dlq clear`), over ports: the DLQ messages the
//! selected records hold first, then the records (each on the condition that it is still
//! as selected), then their payload objects, so that a removal that fails midway leaves
//! records (a second run finds them again), never a record without its payload; and a
//! failure that arrived after the selection (the same item id dead-lettered again) is
//! neither deleted nor stripped of its DLQ message (docs/ARCHITECTURE.md §4). Over the
//! store's ports: the DLQ ([`DeadLetterQueue`], through the sweep), the records
//! ([`RecordStore::delete_records`]) and the payloads ([`PayloadStore::delete`]). Callers
//! confirm with the operator first.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use crate::dead_letter::{DeadLetteredItem, PayloadLocation};
use crate::error::ProcessError;
use crate::item::ItemParser;
use crate::pointer::S3Pointer;
use crate::ports::{DeadLetterQueue, PayloadStore, RecordStore, Standing};
use crate::random::Random;
use crate::sweep::SweepOptions;

/// What a purge or clear removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RemovalReport {
    /// Records deleted.
    pub records_deleted: usize,
    /// Records selected but kept, because they changed after they were selected (a new
    /// failure of the same item arrived meanwhile).
    pub records_changed: usize,
    /// Payload objects deleted.
    pub payloads_deleted: usize,
    /// DLQ messages deleted.
    pub dlq_messages_deleted: usize,
}

/// Deletes the DLQ messages `records` hold (only those: a message of the same item id that
/// arrived after the selection is kept, [`crate::sweep::purge_takes`]), then the records
/// still as selected (25 at a time, `progress` told the running count), then the payload
/// objects of the records deleted. The DLQ's sweep draws its marker from `random`.
pub async fn remove_records<S>(
    store: &S,
    records: &[DeadLetteredItem],
    parser: &ItemParser,
    random: &Random,
    mut progress: impl FnMut(usize),
) -> Result<RemovalReport, ProcessError>
where
    S: RecordStore + DeadLetterQueue + PayloadStore,
{
    let mut report = RemovalReport::default();
    let purge: HashMap<String, Standing> = records
        .iter()
        .map(|r| (r.item_id.clone(), Standing::of(r)))
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
    let mut deleted = Vec::new();
    for chunk in records.chunks(25) {
        let ids: HashSet<String> = store.delete_records(chunk).await?.into_iter().collect();
        report.records_deleted += ids.len();
        report.records_changed += chunk.len() - ids.len().min(chunk.len());
        deleted.extend(chunk.iter().filter(|r| ids.contains(&r.item_id)));
        progress(report.records_deleted + report.records_changed);
    }
    // Last: an object whose record is gone is only storage (the bucket's lifecycle expires
    // it), while a record whose object is gone has lost its payload.
    for record in deleted {
        if let PayloadLocation::S3 { bucket, key } = &record.payload.location {
            let pointer = S3Pointer {
                bucket: bucket.clone(),
                key: key.clone(),
            };
            PayloadStore::delete(store, &pointer).await?;
            report.payloads_deleted += 1;
        }
    }
    Ok(report)
}
