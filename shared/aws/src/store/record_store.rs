//! The dead-letter table as the core's [`RecordStore`] port (docs/ARCHITECTURE.md §5):
//! every read and write of a record in DynamoDB. The recording writes (the conditional
//! append and claim, the marks, the review flag, compaction) are here; the leases and status
//! changes are the store's own ([`super::lease`]), as are queries ([`super::query`]) and
//! conditional deletes ([`super::maintenance`]); each condition is the core's
//! ([`sqs_keeper_core::condition::conditions`]), rendered to the expression sent.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use futures::StreamExt;

use super::schema::LEASE_EXPIRES_AT;
use super::{schema, DeadLetterStore};
use crate::condition_expression::WithCondition;
use sqs_keeper_core::clock::Clock;
use sqs_keeper_core::condition::conditions;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::{
    dead_letter::DeadLetteredItem, dead_letter::DlqClaim, dead_letter::FailureDetail,
    dead_letter::ItemStatus,
};
use sqs_keeper_core::{
    ports::Compaction, ports::Deliveries, ports::Expect, ports::RecordStore, ports::Selected,
    ports::Standing,
};
use sqs_keeper_core::{
    ports::Written, selection::Page, selection::PageToken, selection::RecordFilter,
};

impl RecordStore for DeadLetterStore {
    fn clock(&self) -> Clock {
        self.clock
    }

    async fn get(&self, item_id: &str) -> Result<Option<DeadLetteredItem>, ProcessError> {
        DeadLetterStore::get(self, item_id).await
    }

    async fn query_page(
        &self,
        filter: &RecordFilter,
        limit: i32,
        start: Option<&PageToken>,
    ) -> Result<Page, ProcessError> {
        DeadLetterStore::query_page(self, filter, limit, start).await
    }

    fn token_after(&self, record: &DeadLetteredItem, filter: &RecordFilter) -> PageToken {
        super::query::token_after(record, filter)
    }

    /// Reads with one `BatchGetItem` per 100 ids (strongly consistent), unprocessed keys asked again
    /// with backoff. Keys still unread after that are an error, never "no record": a record
    /// taken for missing would be adopted over.
    async fn standings(&self, ids: &[String]) -> Result<HashMap<String, Standing>, ProcessError> {
        let items = self
            .batch_get(ids, "sweep-lookup", |request| {
                request
                    .projection_expression(
                        "#id, #status, #expires, #src.#mid, #src.#arn, #payload.#sha, #processed, #requeued",
                    )
                    .expression_attribute_names("#id", schema::ITEM_ID)
                    .expression_attribute_names("#status", schema::STATUS)
                    .expression_attribute_names("#expires", LEASE_EXPIRES_AT)
                    .expression_attribute_names("#src", "source")
                    .expression_attribute_names("#mid", "message_id")
                    .expression_attribute_names("#arn", "queue_arn")
                    .expression_attribute_names("#payload", "payload")
                    .expression_attribute_names("#sha", "sha256")
                    .expression_attribute_names("#processed", schema::PROCESSED)
                    .expression_attribute_names("#requeued", schema::REQUEUED_MESSAGE_ID)
            })
            .await?;
        Ok(items
            .into_iter()
            .map(|(id, item)| {
                let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
                let nested = |map: &str, name: &str| {
                    item.get(map)
                        .and_then(|v| v.as_m().ok())
                        .and_then(|m| m.get(name))
                        .and_then(|v| v.as_s().ok())
                        .cloned()
                };
                let standing = Standing {
                    status: text(schema::STATUS).and_then(|s| ItemStatus::parse(&s)),
                    lease_expires_at: item
                        .get(LEASE_EXPIRES_AT)
                        .and_then(|v| v.as_n().ok())
                        .and_then(|n| n.parse().ok()),
                    source_message_id: nested("source", "message_id"),
                    payload_sha256: nested("payload", "sha256"),
                    processed: item
                        .get(schema::PROCESSED)
                        .and_then(|v| v.as_l().ok())
                        .map(|l| l.iter().filter_map(|v| v.as_s().ok().cloned()).collect())
                        .unwrap_or_default(),
                    requeued_message_id: text(schema::REQUEUED_MESSAGE_ID),
                    source_queue_arn: nested("source", "queue_arn"),
                };
                (id, standing)
            })
            .collect())
    }

    /// Reads with one `GetItem` of the three sets (strongly consistent).
    async fn deliveries(&self, item_id: &str) -> Result<Deliveries, ProcessError> {
        let output = self
            .clients
            .dynamodb
            .get_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .projection_expression("#ids, #claims, #sent")
            .expression_attribute_names("#ids", schema::ATTEMPT_IDS)
            .expression_attribute_names("#claims", schema::DLQ_CLAIMS)
            .expression_attribute_names("#sent", schema::DLQ_SENT)
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("record"))?;
        let set = |name: &str| -> HashSet<String> {
            output
                .item()
                .and_then(|i| i.get(name))
                .and_then(|v| v.as_ss().ok())
                .map(|ids| ids.iter().cloned().collect())
                .unwrap_or_default()
        };
        Ok(Deliveries {
            attempt_ids: set(schema::ATTEMPT_IDS),
            claims: set(schema::DLQ_CLAIMS),
            sent: set(schema::DLQ_SENT),
        })
    }

    /// Writes with one conditional `UpdateItem` (`ALL_NEW`); `None` when a pending attempt was already
    /// recorded (or the claim was already taken).
    async fn try_record(
        &self,
        record: &DeadLetteredItem,
        pending: &[FailureDetail],
        claim: Option<&DlqClaim>,
        expect: Expect,
    ) -> Result<Option<Written>, ProcessError> {
        let Some(update) = AppendUpdate::of(record, pending, claim)? else {
            return Ok(None);
        };
        let mut request = self
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(record.item_id.clone()))
            .return_values(ReturnValue::AllNew)
            .update_expression(update.expression());
        for (placeholder, name) in update.names {
            request = request.expression_attribute_names(placeholder, name);
        }
        for (placeholder, value) in update.values {
            request = request.expression_attribute_values(placeholder, value);
        }
        let attempt_ids: Vec<&str> = pending.iter().map(|f| f.attempt_id.as_str()).collect();
        let condition = conditions::records_attempts(&attempt_ids, claim, &expect);
        match request.with_condition(&condition).send().await {
            Ok(output) => Ok(Some(written_of(output.attributes(), record)?)),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(None)
            }
            Err(e) => Err(ProcessError::from_sdk(&e).with_step("record")),
        }
    }

    /// Writes with one `TransactWriteItems` per 100 records (`DeadLetterStore::mark_sent_all`).
    async fn mark_sent(&self, sent: &[(&str, &str)]) -> Result<(), ProcessError> {
        self.mark_sent_all(sent).await
    }

    /// `manual_review_required` depends on the whole history, which an update expression
    /// cannot see: set afterwards ([`sqs_keeper_core::recording::review_flag_change`]).
    /// On the condition that the record exists: DynamoDB's `UpdateItem` creates an item it
    /// does not find, and a record a purge deleted in between would come back as an item of
    /// one attribute, without a status (the in-memory world writes nothing there either).
    async fn set_review_flag(&self, item_id: &str, wanted: bool) -> Result<(), ProcessError> {
        let result = self
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .update_expression("SET manual_review_required = :v")
            .expression_attribute_values(":v", AttributeValue::Bool(wanted))
            .with_condition(&conditions::exists())
            .send()
            .await;
        done_unless_refused(result, "record")
    }

    /// Keeps a record's history within [`crate::StoreConfig::history_limit`]: the first attempts
    /// and the latest ones stay, `history_omitted` counts the others. The write holds only
    /// if no attempt was appended and no other compaction landed since `stored` was read
    /// ([`conditions::compacts`]); when one did, that writer has compacted or will.
    async fn compact(
        &self,
        stored: &DeadLetteredItem,
        compaction: &Compaction,
    ) -> Result<(), ProcessError> {
        let request = self
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(stored.item_id.clone()))
            // The ids of dropped attempts go with them; claims only matter while a message
            // may still be delivered again ([`Compaction`]).
            .update_expression(compaction_expression(compaction))
            .expression_attribute_names("#processed", schema::PROCESSED)
            .expression_attribute_values(
                ":kept_processed",
                AttributeValue::L(
                    compaction
                        .processed
                        .iter()
                        .cloned()
                        .map(AttributeValue::S)
                        .collect(),
                ),
            )
            .expression_attribute_names("#ids", schema::ATTEMPT_IDS)
            .expression_attribute_values(
                ":kept_ids",
                AttributeValue::Ss(compaction.attempt_ids.clone()),
            )
            .with_condition(&conditions::compacts(stored))
            .expression_attribute_names("#hist", schema::FAILURE_HISTORY)
            .expression_attribute_names("#omitted", schema::HISTORY_OMITTED)
            .expression_attribute_values(":kept", schema::history_to_attr(&compaction.history)?)
            .expression_attribute_values(
                ":dropped",
                AttributeValue::N(compaction.dropped.to_string()),
            );
        let request = with_mark_changes(request, compaction);
        // Refused: an attempt was appended since `stored` was read; that writer compacts.
        done_unless_refused(request.send().await, "compact-history")
    }

    /// Gives up a claim on a message's DLQ message (its send failed), so that the next
    /// delivery of the message sends it. On the condition that the record exists, as
    /// `set_review_flag`.
    async fn release_claim(&self, item_id: &str, claim: &DlqClaim) -> Result<(), ProcessError> {
        let result = self
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .update_expression("DELETE #claims :claims")
            .expression_attribute_names("#claims", schema::DLQ_CLAIMS)
            .expression_attribute_values(":claims", AttributeValue::Ss(vec![claim.element()]))
            .with_condition(&conditions::exists())
            .send()
            .await;
        done_unless_refused(result, "release-claim")
    }

    async fn acquire_lease(
        &self,
        item_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, ProcessError> {
        DeadLetterStore::acquire_lease(self, item_id, owner, ttl).await
    }

    async fn acquire_leases(
        &self,
        item_ids: &[String],
        owner: &str,
        ttl: Duration,
    ) -> Vec<Result<bool, ProcessError>> {
        DeadLetterStore::acquire_leases(self, item_ids, owner, ttl).await
    }

    async fn release_lease(&self, item_id: &str, owner: &str) -> Result<(), ProcessError> {
        DeadLetterStore::release_lease(self, item_id, owner).await
    }

    async fn resolve(&self, record: &DeadLetteredItem, owner: &str) -> Result<(), ProcessError> {
        DeadLetterStore::resolve(self, record, owner).await
    }

    async fn mark_requeued(
        &self,
        record: &DeadLetteredItem,
        owner: &str,
        message_id: &str,
    ) -> Result<(), ProcessError> {
        DeadLetterStore::mark_requeued(self, record, owner, message_id).await
    }

    async fn record_redrive_failure(
        &self,
        item_id: &str,
        owner: &str,
        failures: &[FailureDetail],
    ) -> Result<(), ProcessError> {
        DeadLetterStore::record_redrive_failure(self, item_id, owner, failures).await
    }

    async fn reopen_requeued(
        &self,
        record: &DeadLetteredItem,
        failure: &FailureDetail,
    ) -> Result<bool, ProcessError> {
        DeadLetterStore::reopen_requeued(self, record, failure).await
    }

    async fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
        requeued_by: &str,
    ) -> Result<(), ProcessError> {
        DeadLetterStore::finish_requeued(self, item_id, message_id, payload_sha256, requeued_by)
            .await
    }

    async fn finish_moved_back(
        &self,
        item_id: &str,
        dead_lettered: &str,
        message_id: &str,
        payload_sha256: &str,
    ) -> Result<(), ProcessError> {
        DeadLetterStore::finish_moved_back(self, item_id, dead_lettered, message_id, payload_sha256)
            .await
    }

    /// Deletes with one conditional `DeleteItem` per record (`BatchWriteItem` takes no condition), a few
    /// at once: status and last attempt as selected.
    async fn delete_records(&self, selected: &[Selected]) -> Result<Vec<String>, ProcessError> {
        let deletes: Vec<_> = selected
            .iter()
            .map(|record| self.delete_if_unchanged(record))
            .collect();
        let results: Vec<Result<Option<String>, ProcessError>> = futures::stream::iter(deletes)
            .buffer_unordered(super::maintenance::DELETE_CONCURRENCY)
            .collect()
            .await;
        let mut deleted = Vec::new();
        for result in results {
            deleted.extend(result?);
        }
        Ok(deleted)
    }
}

/// Reads the result of a conditional `UpdateItem` whose condition, refused, means there is
/// nothing left to do (the record is gone, or another writer got there first): `Ok`.
fn done_unless_refused(
    result: Result<
        aws_sdk_dynamodb::operation::update_item::UpdateItemOutput,
        aws_sdk_dynamodb::error::SdkError<
            aws_sdk_dynamodb::operation::update_item::UpdateItemError,
            aws_smithy_runtime_api::client::orchestrator::HttpResponse,
        >,
    >,
    step: &'static str,
) -> Result<(), ProcessError> {
    match result {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
        {
            Ok(())
        }
        Err(e) => Err(ProcessError::from_sdk(&e).with_step(step)),
    }
}

/// Returns the update of a compaction: the kept history, ids and `processed` set, the dropped
/// entries counted, the list of forgotten messages' "sent" marks when read, and the marks
/// and claims that go deleted when there are some.
/// `request` with the values of a compaction's optional parts: the list of "sent" marks
/// kept for messages with no entry left, the marks that go, and the claims that go.
/// DynamoDB refuses an empty set, and a name or value the expression does not use, so
/// each part is there only when [`compaction_expression`] names it.
fn with_mark_changes(
    request: aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
    compaction: &Compaction,
) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
    let request = match &compaction.forgotten_sent {
        Some(list) => request
            .expression_attribute_names("#forgotten_sent", schema::DLQ_SENT_FORGOTTEN)
            .expression_attribute_values(
                ":forgotten_sent",
                AttributeValue::L(list.iter().cloned().map(AttributeValue::S).collect()),
            ),
        None => request,
    };
    let request = removing(
        request,
        ("#sent", schema::DLQ_SENT),
        ":unmarked",
        &compaction.unmarked,
    );
    removing(
        request,
        ("#claims", schema::DLQ_CLAIMS),
        ":dropped_claims",
        &compaction.dropped_claims,
    )
}

/// `request` with the name and value of a `DELETE` of `elements` from a string set, when
/// there are any.
fn removing(
    request: aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
    (name, attribute): (&str, &str),
    value: &str,
    elements: &[String],
) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
    if elements.is_empty() {
        return request;
    }
    request
        .expression_attribute_names(name, attribute)
        .expression_attribute_values(value, AttributeValue::Ss(elements.to_vec()))
}

fn compaction_expression(compaction: &Compaction) -> String {
    let mut expression =
        "SET #hist = :kept, #ids = :kept_ids, #processed = :kept_processed".to_string();
    if compaction.forgotten_sent.is_some() {
        expression.push_str(", #forgotten_sent = :forgotten_sent");
    }
    expression.push_str(" ADD #omitted :dropped");
    let mut deletes = Vec::new();
    if !compaction.unmarked.is_empty() {
        deletes.push("#sent :unmarked");
    }
    if !compaction.dropped_claims.is_empty() {
        deletes.push("#claims :dropped_claims");
    }
    if !deletes.is_empty() {
        expression.push_str(" DELETE ");
        expression.push_str(&deletes.join(", "));
    }
    expression
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqs_keeper_core::ErrorClass;

    /// A lookup DynamoDB keeps throttling (every key left unprocessed) fails, rather than
    /// answering that the record does not exist (which would have it adopted over).
    #[tokio::test(start_paused = true)]
    async fn keys_left_unprocessed_are_an_error_not_a_missing_record() {
        use aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemOutput;
        use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
        use aws_smithy_mocks::{mock, mock_client};
        let throttled = mock!(aws_sdk_dynamodb::Client::batch_get_item).then_output(|| {
            let key = HashMap::from([(
                schema::ITEM_ID.to_string(),
                AttributeValue::S("order-1".to_string()),
            )]);
            BatchGetItemOutput::builder()
                .unprocessed_keys("t", KeysAndAttributes::builder().keys(key).build().unwrap())
                .build()
        });
        let store = crate::store::mocked_store(|clients| {
            clients.dynamodb = mock_client!(
                aws_sdk_dynamodb,
                aws_smithy_mocks::RuleMode::MatchAny,
                &[&throttled]
            );
        });
        let error = store.standings(&["order-1".to_string()]).await.unwrap_err();
        assert_eq!(error.class, ErrorClass::Throttled, "{error}");
        assert_eq!(error.step.as_deref(), Some("sweep-lookup"));
        assert_eq!(
            throttled.num_calls(),
            super::super::BATCH_GET_ROUNDS as usize
        );
    }
}

/// Returns the record and its sets as a write left them (`ALL_NEW`); the record written, its sets
/// not read, when DynamoDB returned nothing.
fn written_of(
    stored: Option<&HashMap<String, AttributeValue>>,
    record: &DeadLetteredItem,
) -> Result<Written, ProcessError> {
    match stored {
        Some(item) => written_from_item(item),
        None => Ok(Written::record_only(record.clone())),
    }
}

/// Returns the record and its sets as the item `item` holds them.
pub(super) fn written_from_item(
    item: &HashMap<String, AttributeValue>,
) -> Result<Written, ProcessError> {
    let strings = |name: &str| -> HashSet<String> {
        item.get(name)
            .and_then(|v| v.as_ss().ok())
            .map(|elements| elements.iter().cloned().collect())
            .unwrap_or_default()
    };
    let forgotten_sent = item
        .get(schema::DLQ_SENT_FORGOTTEN)
        .and_then(|v| v.as_l().ok())
        .map(|list| list.iter().filter_map(|v| v.as_s().ok().cloned()).collect())
        .unwrap_or_default();
    Ok(Written {
        record: schema::record_from_item(item)?,
        attempt_ids: strings(schema::ATTEMPT_IDS),
        claims: strings(schema::DLQ_CLAIMS),
        sent: strings(schema::DLQ_SENT),
        forgotten_sent: Some(forgotten_sent),
    })
}

/// The update expression of a delivery's append: the record's fields set, its attempts
/// appended and counted, its claim added; with the placeholders' names and values.
#[derive(Debug, Default)]
struct AppendUpdate {
    sets: Vec<String>,
    adds: Vec<&'static str>,
    names: Vec<(String, String)>,
    values: Vec<(String, AttributeValue)>,
}

impl AppendUpdate {
    /// Returns the update appending `pending` to `record`'s item and taking `claim`; `None` when
    /// there is neither an attempt to append nor a claim to take.
    fn of(
        record: &DeadLetteredItem,
        pending: &[FailureDetail],
        claim: Option<&DlqClaim>,
    ) -> Result<Option<AppendUpdate>, ProcessError> {
        // A claim-only write (no attempt left to append: the twin that recorded them freed
        // the claim) leaves the history and its count alone; DynamoDB refuses empty sets.
        if pending.is_empty() && claim.is_none() {
            return Ok(None);
        }
        let mut update = AppendUpdate::default();
        update.set_fields(record)?;
        // A new failure ends a requeue: the item is dead again.
        update.name("#requeued", schema::REQUEUED_MESSAGE_ID);
        if !pending.is_empty() {
            update.append(pending)?;
        }
        if let Some(claim) = claim {
            update.adds.push("#claims :claims");
            update.name("#claims", schema::DLQ_CLAIMS);
            update.value(":claims", AttributeValue::Ss(vec![claim.element()]));
        }
        Ok(Some(update))
    }

    /// Sets the record's own fields, in name order so that the same record always makes
    /// the same expression. What the record accumulates is left to the write's other parts.
    fn set_fields(&mut self, record: &DeadLetteredItem) -> Result<(), ProcessError> {
        let mut fields = schema::record_to_item(record)?;
        fields.remove(schema::ITEM_ID);
        fields.remove(schema::FAILURE_COUNT);
        fields.remove(schema::FAILURE_HISTORY);
        // Counted by compaction alone.
        fields.remove(schema::HISTORY_OMITTED);
        // Accumulated by resolutions; a new failure does not forget them.
        fields.remove(schema::PROCESSED);
        let first_attempt = fields.remove("first_attempt");
        // Set on creation; afterwards `review_flag_change` decides on the whole history
        // (which may hold dropped attempts this write cannot see).
        let review = fields.remove(schema::MANUAL_REVIEW_REQUIRED);
        let mut fields: Vec<(String, AttributeValue)> = fields.into_iter().collect();
        fields.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (n, (name, value)) in fields.into_iter().enumerate() {
            self.sets.push(format!("#f{n} = :f{n}"));
            self.name(&format!("#f{n}"), &name);
            self.value(&format!(":f{n}"), value);
        }
        if let Some(review) = review {
            self.sets
                .push("#review = if_not_exists(#review, :review)".to_string());
            self.name("#review", schema::MANUAL_REVIEW_REQUIRED);
            self.value(":review", review);
        }
        if let Some(first) = first_attempt {
            self.sets
                .push("#first = if_not_exists(#first, :first)".to_string());
            self.name("#first", "first_attempt");
            self.value(":first", first);
        }
        Ok(())
    }

    /// Appends `pending` to the history, and adds their count and ids.
    fn append(&mut self, pending: &[FailureDetail]) -> Result<(), ProcessError> {
        self.sets
            .push("#hist = list_append(if_not_exists(#hist, :empty), :hist)".to_string());
        self.adds.extend(["#count :count", "#ids :ids"]);
        self.name("#hist", schema::FAILURE_HISTORY);
        self.name("#count", schema::FAILURE_COUNT);
        self.name("#ids", schema::ATTEMPT_IDS);
        self.value(":empty", AttributeValue::L(Vec::new()));
        self.value(":hist", schema::history_to_attr(pending)?);
        self.value(":count", AttributeValue::N(pending.len().to_string()));
        let ids = pending.iter().map(|f| f.attempt_id.clone()).collect();
        self.value(":ids", AttributeValue::Ss(ids));
        Ok(())
    }

    fn name(&mut self, placeholder: &str, name: &str) {
        self.names.push((placeholder.to_string(), name.to_string()));
    }

    fn value(&mut self, placeholder: &str, value: AttributeValue) {
        self.values.push((placeholder.to_string(), value));
    }

    /// Returns the update expression.
    fn expression(&self) -> String {
        format!(
            "SET {} REMOVE #requeued ADD {}",
            self.sets.join(", "),
            self.adds.join(", ")
        )
    }
}
