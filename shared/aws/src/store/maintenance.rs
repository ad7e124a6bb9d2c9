//! Removing records for good: `purge` (old records, their payloads and DLQ messages) and
//! `clear` (everything), with the order and its reasons in the core's `removal`; here the
//! DynamoDB deletes. Callers confirm with the operator first.

use aws_sdk_dynamodb::types::AttributeValue;

use super::{schema, DeadLetterStore};
use crate::condition_expression::WithCondition;
use sqs_keeper_core::dead_letter::DeadLetteredItem;
use sqs_keeper_core::item::ItemParser;
use sqs_keeper_core::ports::Selected;
use sqs_keeper_core::ProcessError;

use sqs_keeper_core::removal::Removable;
use sqs_keeper_core::removal::RemovalReport;

impl DeadLetterStore {
    /// Deletes `record` if it is still as selected ([`Selected::condition`]): its id, or
    /// `None` when it changed ([`sqs_keeper_core::ports::RecordStore::delete_records`]).
    pub(super) async fn delete_if_unchanged(
        &self,
        record: &Selected,
    ) -> Result<Option<String>, ProcessError> {
        {
            let result = self
                .clients
                .dynamodb
                .delete_item()
                .table_name(&self.config.table)
                .key(schema::ITEM_ID, AttributeValue::S(record.item_id.clone()))
                .with_condition(&record.condition())
                .send()
                .await;
            match result {
                Ok(_) => Ok(Some(record.item_id.clone())),
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
                {
                    tracing::info!(item_id = %record.item_id, "record changed since it was selected; kept");
                    Ok(None)
                }
                Err(e) => Err(ProcessError::from_sdk(&e).with_step("delete-records")),
            }
        }
    }
}

/// Conditional deletes in flight at once.
pub(super) const DELETE_CONCURRENCY: usize = 8;

impl DeadLetterStore {
    /// Reads what a removal keeps of every record `filter` selects ([`Removable`]), read a page
    /// at a time: never the records themselves.
    pub async fn removable(
        &self,
        filter: &sqs_keeper_core::selection::RecordFilter,
    ) -> Result<Vec<Removable>, ProcessError> {
        let mut selected = Vec::new();
        self.for_each_page::<ProcessError>(filter, &mut Vec::new(), |page| {
            selected.extend(page.iter().map(Removable::of));
            Ok(())
        })
        .await?;
        Ok(selected)
    }

    /// [`DeadLetterStore::remove_records`] over compact selections.
    pub async fn remove_selected(
        &self,
        selected: &[Removable],
        parser: &ItemParser,
        progress: impl FnMut(usize),
    ) -> Result<RemovalReport, ProcessError> {
        sqs_keeper_core::removal::remove_selected(self, selected, parser, &self.random, progress)
            .await
    }

    /// Deletes the DLQ messages of `records`, then their payload objects, then the records
    /// ([`sqs_keeper_core::removal::remove_records`] over this store).
    pub async fn remove_records(
        &self,
        records: &[DeadLetteredItem],
        parser: &ItemParser,
        progress: impl FnMut(usize),
    ) -> Result<RemovalReport, ProcessError> {
        sqs_keeper_core::removal::remove_records(self, records, parser, &self.random, progress)
            .await
    }

    /// Deletes every record (but those in flight) with its payload object and DLQ messages,
    /// and every DLQ message no record holds, as they were when it started
    /// ([`sqs_keeper_core::removal::clear_records`]): a failure that arrives meanwhile is kept.
    pub async fn clear(&self, progress: impl FnMut(usize)) -> Result<RemovalReport, ProcessError> {
        let snapshot_ms = self.clock.now().timestamp_millis();
        let records = self
            .removable(&sqs_keeper_core::selection::RecordFilter::default())
            .await?;
        sqs_keeper_core::removal::clear_records(self, &records, snapshot_ms, &self.random, progress)
            .await
    }
}
