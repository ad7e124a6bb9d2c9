//! Removing records for good (`dlq purge`, `dlq clear`), over ports: the DLQ messages
//! first, then the payload objects, then the records, so that a removal that fails midway
//! leaves records (a second run finds them again), never DLQ messages or payload objects
//! whose records are gone. Callers confirm with the operator first.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use serde::Serialize;

use crate::dead_letter::{DeadLetteredItem, PayloadLocation};
use crate::error::ProcessError;
use crate::item::ItemParser;
use crate::pointer::S3Pointer;
use crate::ports::{PayloadStore, SweepOptions};
use crate::sweep::DlqMessages;

/// Deleting records.
pub trait RecordRemoval: Send + Sync {
    /// Deletes the records of `item_ids` (at most 25): all of them, or an error.
    fn delete_records(
        &self,
        item_ids: &[String],
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;
}

/// What a purge or clear removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RemovalReport {
    /// Records deleted.
    pub records_deleted: usize,
    /// Payload objects deleted.
    pub payloads_deleted: usize,
    /// DLQ messages deleted.
    pub dlq_messages_deleted: usize,
}

/// How long the removal's sweep holds the DLQ messages it keeps.
const REMOVAL_HOLD: Duration = Duration::from_secs(120);

/// Deletes the DLQ messages of `records`, then their payload objects, then the records
/// (25 at a time, `progress` told the running count).
pub async fn remove_records<S>(
    store: &S,
    records: &[DeadLetteredItem],
    parser: &ItemParser,
    mut progress: impl FnMut(usize),
) -> Result<RemovalReport, ProcessError>
where
    S: DlqMessages + PayloadStore + RecordRemoval,
{
    let mut report = RemovalReport::default();
    let ids: HashSet<String> = records.iter().map(|r| r.item_id.clone()).collect();
    let sweep = crate::sweep::sweep_dlq(
        store,
        REMOVAL_HOLD,
        &SweepOptions {
            adopt: false,
            delete_items: ids,
            parser: parser.clone(),
            until: None,
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
    store.release(&held).await?;
    for record in records {
        if let PayloadLocation::S3 { bucket, key } = &record.payload.location {
            let pointer = S3Pointer {
                bucket: bucket.clone(),
                key: key.clone(),
            };
            PayloadStore::delete(store, &pointer).await?;
            report.payloads_deleted += 1;
        }
    }
    for chunk in records.chunks(25) {
        let ids: Vec<String> = chunk.iter().map(|r| r.item_id.clone()).collect();
        store.delete_records(&ids).await?;
        report.records_deleted += chunk.len();
        progress(report.records_deleted);
    }
    Ok(report)
}
