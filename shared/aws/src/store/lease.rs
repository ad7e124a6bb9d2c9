//! Redrive state transitions on a record, each conditional so that concurrent redrives
//! never process one item twice: `dead → redriving` (a lease with an owner and expiry),
//! then `redriving → resolved` or `redriving → dead` with the new failure appended.
//! An expired lease (a crashed redrive) can be taken over.

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use chrono::{DateTime, Utc};

use super::schema::{LEASE_EXPIRES_AT, LEASE_OWNER};
use super::{schema, DeadLetterStore};
use crate::condition_expression::WithCondition;
use sqs_keeper_core::condition::conditions;
use sqs_keeper_core::signature::error_signature;
use sqs_keeper_core::{
    dead_letter::DeadLetteredItem, dead_letter::FailureDetail, dead_letter::ItemStatus,
};
use sqs_keeper_core::{ErrorClass, ProcessError};

/// Items per `TransactWriteItems` call (DynamoDB's limit is 100 actions).
const TRANSACTION_ITEMS: usize = 100;

/// [`sqs_keeper_core::dead_letter::processed_after`] as the attribute to write.
fn processed_after(record: &DeadLetteredItem) -> AttributeValue {
    AttributeValue::L(
        sqs_keeper_core::dead_letter::processed_after(record)
            .into_iter()
            .map(AttributeValue::S)
            .collect(),
    )
}

fn is_conditional_failure<E: aws_sdk_dynamodb::error::ProvideErrorMetadata>(e: &E) -> bool {
    matches!(
        e.code(),
        Some("ConditionalCheckFailedException") | Some("TransactionCanceledException")
    )
}

impl DeadLetterStore {
    /// Sends one transaction `Update` on its own, as an `UpdateItem` call: the single-item
    /// path shares the expressions the batched path puts in transactions.
    async fn send_update(
        &self,
        u: &Update,
    ) -> Result<
        aws_sdk_dynamodb::operation::update_item::UpdateItemOutput,
        aws_sdk_dynamodb::error::SdkError<
            aws_sdk_dynamodb::operation::update_item::UpdateItemError,
        >,
    > {
        self.clients
            .dynamodb
            .update_item()
            .table_name(u.table_name())
            .set_key(Some(u.key().clone()))
            .update_expression(u.update_expression())
            .set_condition_expression(u.condition_expression().map(str::to_string))
            .set_expression_attribute_names(u.expression_attribute_names().cloned())
            .set_expression_attribute_values(u.expression_attribute_values().cloned())
            .send()
            .await
    }

    /// Writes with one `TransactWriteItems` of `updates`: `Ok(true)` written, `Ok(false)` refused by a
    /// condition (the caller then writes item by item), the error otherwise.
    async fn transact(&self, updates: Vec<Update>) -> Result<bool, ProcessError> {
        let items = updates
            .into_iter()
            .map(|update| TransactWriteItem::builder().update(update).build())
            .collect();
        match self
            .clients
            .dynamodb
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.as_service_error().is_some_and(is_conditional_failure) => Ok(false),
            Err(e) => {
                let error = ProcessError::from_sdk(&e);
                if error.class == ErrorClass::Validation {
                    // Refused as a whole (the items together pass the transaction's 4 MB,
                    // or an item is named twice): the caller writes them one by one.
                    tracing::info!(%error, "transaction refused; writing its items one by one");
                    Ok(false)
                } else {
                    Err(error)
                }
            }
        }
    }

    /// Returns the update marking `message_id`'s DLQ message sent on its record (existing records
    /// only: a record purged meanwhile is not recreated as a stub).
    fn sent_update(&self, item_id: &str, message_id: &str) -> Result<Update, ProcessError> {
        Update::builder()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .update_expression("ADD #sent :sent")
            .with_condition(&conditions::exists())
            .expression_attribute_names("#sent", schema::DLQ_SENT)
            .expression_attribute_values(":sent", AttributeValue::Ss(vec![message_id.to_string()]))
            .build()
            .map_err(|e| {
                ProcessError::new(ErrorClass::Unknown, e.to_string()).with_step("mark-sent")
            })
    }

    /// Marks DLQ messages sent with few calls: one transaction per 100 records (a dead
    /// letter then costs its record write and a share of one call, not two writes); a chunk
    /// naming a record twice, or refused because one was deleted meanwhile, is written
    /// record by record. The first error, if any.
    pub(super) async fn mark_sent_all(&self, sent: &[(&str, &str)]) -> Result<(), ProcessError> {
        let mut first_error = None;
        for chunk in sent.chunks(TRANSACTION_ITEMS) {
            let distinct = chunk
                .iter()
                .map(|(item_id, _)| *item_id)
                .collect::<std::collections::HashSet<_>>()
                .len()
                == chunk.len();
            let batched = if distinct && chunk.len() > 1 {
                let updates: Result<Vec<Update>, ProcessError> = chunk
                    .iter()
                    .map(|(item_id, message_id)| self.sent_update(item_id, message_id))
                    .collect();
                match updates {
                    Ok(updates) => self
                        .transact(updates)
                        .await
                        .map_err(|e| e.with_step("mark-sent")),
                    Err(e) => Err(e),
                }
            } else {
                Ok(false)
            };
            let one_by_one = match batched {
                Ok(true) => false,
                Ok(false) => true,
                Err(e) => {
                    first_error.get_or_insert(e);
                    false
                }
            };
            if one_by_one {
                for (item_id, message_id) in chunk {
                    let update = self.sent_update(item_id, message_id)?;
                    match self.send_update(&update).await {
                        Ok(_) => {}
                        // Deleted meanwhile (a purge): nothing to mark.
                        Err(e) if e.as_service_error().is_some_and(is_conditional_failure) => {}
                        Err(e) => {
                            first_error
                                .get_or_insert(ProcessError::from_sdk(&e).with_step("mark-sent"));
                        }
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn lease_update(
        &self,
        item_id: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<Update, ProcessError> {
        let expires = now.timestamp() + i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2);
        Update::builder()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .update_expression("SET #status = :redriving, #owner = :owner, #expires = :expires")
            .with_condition(&conditions::lease_is_free(now.timestamp()))
            .expression_attribute_names("#status", schema::STATUS)
            .expression_attribute_names("#owner", LEASE_OWNER)
            .expression_attribute_names("#expires", LEASE_EXPIRES_AT)
            .expression_attribute_values(
                ":redriving",
                AttributeValue::S(ItemStatus::Redriving.as_str().into()),
            )
            .expression_attribute_values(":owner", AttributeValue::S(owner.to_string()))
            .expression_attribute_values(":expires", AttributeValue::N(expires.to_string()))
            .build()
            .map_err(|e| ProcessError::validation(e.to_string()).with_step("lease"))
    }

    /// Takes the lease on one item; `false` when it is not dead or another live lease holds it.
    pub async fn acquire_lease(
        &self,
        item_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, ProcessError> {
        let update = self.lease_update(item_id, owner, ttl, self.clock.now())?;
        match self.send_update(&update).await {
            Ok(_) => Ok(true),
            Err(e) if e.as_service_error().is_some_and(is_conditional_failure) => Ok(false),
            Err(e) => Err(ProcessError::from_sdk(&e).with_step("lease")),
        }
    }

    /// Takes leases on many items with few calls: one transaction per 100 items; a chunk
    /// whose transaction is refused (some item is taken, or the records together pass the
    /// transaction's 4 MB) is retried item by item.
    pub async fn acquire_leases(
        &self,
        item_ids: &[String],
        owner: &str,
        ttl: Duration,
    ) -> Vec<Result<bool, ProcessError>> {
        let mut results = Vec::with_capacity(item_ids.len());
        for chunk in item_ids.chunks(TRANSACTION_ITEMS) {
            let now = self.clock.now();
            let updates: Result<Vec<Update>, ProcessError> = chunk
                .iter()
                .map(|id| self.lease_update(id, owner, ttl, now))
                .collect();
            let outcome = match updates {
                Ok(updates) => self.transact(updates).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(true) => results.extend(chunk.iter().map(|_| Ok(true))),
                Ok(false) => {
                    for id in chunk {
                        results.push(self.acquire_lease(id, owner, ttl).await);
                    }
                }
                Err(e) => results.extend(chunk.iter().map(|_| Err(e.clone().with_step("lease")))),
            }
        }
        results
    }

    /// `record` resolved by `owner`: its current payload (and source message) joins the
    /// `processed` list, so that exactly the DLQ messages holding it are deleted. Only while
    /// the item is still redriving with the payload the run processed
    /// ([`sqs_keeper_core::dead_letter::LEASED_WITH_PAYLOAD`]).
    fn resolve_update(
        &self,
        record: &DeadLetteredItem,
        owner: &str,
        now: DateTime<Utc>,
    ) -> Result<Update, ProcessError> {
        Update::builder()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(record.item_id.clone()))
            .update_expression(
                "SET #status = :resolved, resolved_at = :now, #processed = :processed REMOVE #owner, #expires",
            )
            .with_condition(&conditions::leased_with_payload(owner, &record.payload.sha256))
            .expression_attribute_names("#status", schema::STATUS)
            .expression_attribute_names("#owner", LEASE_OWNER)
            .expression_attribute_names("#expires", LEASE_EXPIRES_AT)
            .expression_attribute_names("#processed", schema::PROCESSED)
            .expression_attribute_values(
                ":resolved",
                AttributeValue::S(ItemStatus::Resolved.as_str().into()),
            )
            .expression_attribute_values(
                ":now",
                AttributeValue::S(sqs_keeper_core::time_format::format(&now)),
            )
            .expression_attribute_values(":processed", processed_after(record))
            .build()
            .map_err(|e| ProcessError::validation(e.to_string()).with_step("resolve"))
    }

    /// Marks one leased item resolved.
    pub async fn resolve(
        &self,
        record: &DeadLetteredItem,
        owner: &str,
    ) -> Result<(), ProcessError> {
        let update = self.resolve_update(record, owner, self.clock.now())?;
        self.send_update(&update).await.map(|_| ()).map_err(|e| {
            if e.as_service_error().is_some_and(is_conditional_failure) {
                ProcessError::new(
                    ErrorClass::Unknown,
                    format!(
                        "lease on {:?} was lost before resolving, or a new failure replaced its payload",
                        record.item_id
                    ),
                )
            } else {
                ProcessError::from_sdk(&e)
            }
            .with_step("resolve")
        })
    }

    /// Marks a leased item `requeued`: its payload went back to the source queue as message
    /// `message_id`. It stays so until the worker finishes that message
    /// ([`DeadLetterStore::finish_requeued`]) or the message returns to the DLQ.
    /// Only while the item is still redriving with the payload that was sent: a record a
    /// new failure changed meanwhile would otherwise wait for a message that does not hold
    /// its payload, and the sweep delete its DLQ message as moved.
    pub async fn mark_requeued(
        &self,
        record: &DeadLetteredItem,
        owner: &str,
        message_id: &str,
    ) -> Result<(), ProcessError> {
        let now = self.clock.now();
        let expires_at = sqs_keeper_core::redrive::expiry_when_requeued(record.expires_at, now);
        self.end_lease(
            &record.item_id,
            owner,
            ItemStatus::Requeued,
            &[
                (
                    schema::REQUEUED_MESSAGE_ID,
                    AttributeValue::S(message_id.to_string()),
                ),
                (
                    schema::REQUEUED_AT,
                    AttributeValue::S(sqs_keeper_core::time_format::format(&now)),
                ),
                (
                    schema::EXPIRES_AT,
                    AttributeValue::N(expires_at.to_string()),
                ),
            ],
            Some(&record.payload.sha256),
            "mark-requeued",
        )
        .await
    }

    /// Ends `owner`'s lease on an item, setting its status (and a few more attributes):
    /// the one conditional write behind giving a lease back and marking an item requeued.
    async fn end_lease(
        &self,
        item_id: &str,
        owner: &str,
        status: ItemStatus,
        also: &[(&str, AttributeValue)],
        payload_sha256: Option<&str>,
        step: &str,
    ) -> Result<(), ProcessError> {
        let mut request = self
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .with_condition(&match payload_sha256 {
                Some(sha) => conditions::leased_with_payload(owner, sha),
                None => conditions::leased_by(owner),
            })
            .expression_attribute_names("#status", schema::STATUS)
            .expression_attribute_names("#owner", LEASE_OWNER)
            .expression_attribute_names("#expires", LEASE_EXPIRES_AT)
            .expression_attribute_values(":status", AttributeValue::S(status.as_str().into()));
        let mut set = "SET #status = :status".to_string();
        for (n, (name, value)) in also.iter().enumerate() {
            set.push_str(&format!(", #also{n} = :also{n}"));
            request = request
                .expression_attribute_names(format!("#also{n}"), *name)
                .expression_attribute_values(format!(":also{n}"), value.clone());
        }
        request
            .update_expression(format!("{set} REMOVE #owner, #expires"))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| ProcessError::from_sdk(&e).with_step(step))
    }

    /// Resolves a record: the worker finished `message_id`, the message the run `requeued_by` sent for
    /// `item_id`: the record is resolved, with that message and its payload listed as
    /// processed, when it waits for that message (`requeued`) or that run still holds it
    /// with that payload (the worker finished the message before the run marked the record
    /// requeued; the run's mark then finds it resolved). A record that is no longer waiting
    /// for this message (failed again meanwhile, or already resolved) is left as it is.
    pub async fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
        requeued_by: &str,
    ) -> Result<(), ProcessError> {
        let request = self
            .resolving(
                item_id,
                &[
                    sqs_keeper_core::dead_letter::processed_key_for_message(message_id),
                    sqs_keeper_core::dead_letter::processed_key_for_payload(payload_sha256),
                ],
                " REMOVE #requeued, #owner, #expires",
            )
            .with_condition(&conditions::finishes_requeued(
                message_id,
                requeued_by,
                payload_sha256,
            ))
            .expression_attribute_names("#owner", LEASE_OWNER)
            .expression_attribute_names("#expires", LEASE_EXPIRES_AT)
            .expression_attribute_names("#requeued", schema::REQUEUED_MESSAGE_ID);
        unless_changed(request, "finish-requeued").await
    }

    /// Resolves a record: the worker finished `message_id`, a DLQ message moved back to the source queue from
    /// outside (the console's "Start DLQ redrive") holding the delivery `dead_lettered`:
    /// a dead record that holds that very payload (just delivered successfully) is
    /// resolved, with both messages and the payload listed as processed. Anything else
    /// (another payload since, a run holding it, already resolved) is left as it is.
    pub async fn finish_moved_back(
        &self,
        item_id: &str,
        dead_lettered: &str,
        message_id: &str,
        payload_sha256: &str,
    ) -> Result<(), ProcessError> {
        let request = self
            .resolving(
                item_id,
                &[
                    sqs_keeper_core::dead_letter::processed_key_for_message(dead_lettered),
                    sqs_keeper_core::dead_letter::processed_key_for_message(message_id),
                    sqs_keeper_core::dead_letter::processed_key_for_payload(payload_sha256),
                ],
                "",
            )
            .with_condition(&conditions::finishes_moved_back(payload_sha256));
        unless_changed(request, "finish-moved-back").await
    }

    /// Returns the update that resolves `item_id` (now), appending `keys` to `processed` and
    /// ending with `removes` (` REMOVE ...`, or empty); the caller adds its condition.
    fn resolving(
        &self,
        item_id: &str,
        keys: &[String],
        removes: &str,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .update_expression(format!(
                "SET #status = :resolved, resolved_at = :now, \
                 #processed = list_append(if_not_exists(#processed, :empty), :keys){removes}"
            ))
            .expression_attribute_names("#status", schema::STATUS)
            .expression_attribute_names("#processed", schema::PROCESSED)
            .expression_attribute_values(
                ":resolved",
                AttributeValue::S(ItemStatus::Resolved.as_str().into()),
            )
            .expression_attribute_values(
                ":now",
                AttributeValue::S(sqs_keeper_core::time_format::format(&self.clock.now())),
            )
            .expression_attribute_values(":empty", AttributeValue::L(Vec::new()))
            .expression_attribute_values(
                ":keys",
                AttributeValue::L(keys.iter().cloned().map(AttributeValue::S).collect()),
            )
    }

    /// Gives a lease back without changing anything else (status returns to dead).
    pub async fn release_lease(&self, item_id: &str, owner: &str) -> Result<(), ProcessError> {
        self.end_lease(item_id, owner, ItemStatus::Dead, &[], None, "release-lease")
            .await
    }

    /// Records a failed redrive attempt: the item goes back to dead with the failure
    /// appended, the count incremented and the latest error updated; the lease is released.
    pub async fn record_redrive_failure(
        &self,
        item_id: &str,
        owner: &str,
        failures: &[FailureDetail],
    ) -> Result<(), ProcessError> {
        if failures.is_empty() {
            return self.release_lease(item_id, owner).await;
        }
        self.back_to_dead(item_id, &BackFrom::Lease(owner), failures)
            .await
            .map(|_| ())
            .map_err(|e| e.with_step("record-redrive-failure"))
    }

    /// Sends a record still `requeued` with the message `requeued_message_id` back to dead
    /// with `failure` appended (the message outlived its queue unfinished); `Ok(false)`
    /// when it changed meanwhile (finished, failed again, requeued anew).
    pub async fn reopen_requeued(
        &self,
        record: &DeadLetteredItem,
        failure: &FailureDetail,
    ) -> Result<bool, ProcessError> {
        let Some(message_id) = record.requeued_message_id.as_deref() else {
            return Ok(false);
        };
        self.back_to_dead(
            &record.item_id,
            &BackFrom::Requeued(
                message_id,
                sqs_keeper_core::redrive::expiry_when_reopened(
                    record.expires_at,
                    self.clock.now(),
                    self.config.retention,
                ),
            ),
            std::slice::from_ref(failure),
        )
        .await
        .map_err(|e| e.with_step("reopen-requeued"))
    }

    /// Sets an item back to dead with `failures` appended (count, signature, latest error,
    /// eligibility), on the condition `from`; `Ok(false)` when the condition failed.
    async fn back_to_dead(
        &self,
        item_id: &str,
        from: &BackFrom<'_>,
        failures: &[FailureDetail],
    ) -> Result<bool, ProcessError> {
        let Some(failure) = failures.last() else {
            return Ok(false);
        };
        let request = self.back_to_dead_request(item_id, from, failures, failure)?;
        let result = match request.send().await {
            Ok(result) => result,
            Err(e) if e.as_service_error().is_some_and(is_conditional_failure) => {
                return match from {
                    // The lease was lost: an error of the run, as before.
                    BackFrom::Lease(_) => Err(ProcessError::from_sdk(&e)),
                    BackFrom::Requeued(..) => Ok(false),
                };
            }
            Err(e) => return Err(ProcessError::from_sdk(&e)),
        };
        if let Some(item) = result.attributes() {
            self.after_append(item).await?;
        }
        Ok(true)
    }

    /// Returns the `UpdateItem` of [`Self::back_to_dead`]: `failure` (the last of `failures`) sets
    /// the record's latest error, and every one of `failures` is appended.
    ///
    /// One piece, though long: the update expression and the names and values it spells
    /// are read together.
    fn back_to_dead_request(
        &self,
        item_id: &str,
        from: &BackFrom<'_>,
        failures: &[FailureDetail],
        failure: &FailureDetail,
    ) -> Result<
        aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
        ProcessError,
    > {
        let (condition, removes, name, key) = match from {
            BackFrom::Lease(owner) => (
                conditions::still_redriving(owner),
                "REMOVE #owner, #expires",
                "#owner",
                LEASE_OWNER,
            ),
            BackFrom::Requeued(message_id, _) => (
                conditions::requeued_as(message_id),
                "REMOVE #requeued",
                "#requeued",
                schema::REQUEUED_MESSAGE_ID,
            ),
        };
        // A record set back to dead from requeued is kept a whole retention from now.
        let expiry = match from {
            BackFrom::Requeued(_, _) => ", #ttl = :ttl",
            BackFrom::Lease(_) => "",
        };
        let mut request = self
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .update_expression(format!(
                "SET #status = :dead, #last = :last, error_class = :class, #sig = :sig, last_error = :err, \
                 reprocess_eligible = :elig, #hist = list_append(if_not_exists(#hist, :empty), :entry){expiry} \
                 {removes} ADD #count :one, #ids :ids"
            ))
            .with_condition(&condition)
            .expression_attribute_names("#status", schema::STATUS)
            .expression_attribute_names("#last", schema::LAST_ATTEMPT)
            .expression_attribute_names("#sig", schema::ERROR_SIGNATURE)
            .expression_attribute_names("#hist", schema::FAILURE_HISTORY)
            .expression_attribute_names("#count", schema::FAILURE_COUNT)
            .expression_attribute_names("#ids", schema::ATTEMPT_IDS)
            .expression_attribute_names(name, key)
            .expression_attribute_values(":dead", AttributeValue::S(ItemStatus::Dead.as_str().into()))
            .expression_attribute_values(":last", AttributeValue::S(sqs_keeper_core::time_format::format(&failure.timestamp)))
            .expression_attribute_values(":class", AttributeValue::S(failure.error_type.as_str().into()))
            .expression_attribute_values(
                ":sig",
                AttributeValue::S(error_signature(failure.error_type, &failure.error_message)),
            )
            .expression_attribute_values(":err", AttributeValue::S(failure.error_message.clone()))
            .expression_attribute_values(":elig", AttributeValue::Bool(failure.error_type.is_reprocess_eligible()))
            .expression_attribute_values(":empty", AttributeValue::L(Vec::new()))
            .expression_attribute_values(":entry", schema::history_to_attr(failures)?)
            .expression_attribute_values(":one", AttributeValue::N(failures.len().to_string()))
            .expression_attribute_values(
                ":ids",
                AttributeValue::Ss(failures.iter().map(|f| f.attempt_id.clone()).collect()),
            )
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew);
        match from {
            BackFrom::Lease(_) => {
                request = request.expression_attribute_names("#expires", LEASE_EXPIRES_AT);
            }
            BackFrom::Requeued(_, expires_at) => {
                request = request
                    .expression_attribute_names("#ttl", schema::EXPIRES_AT)
                    .expression_attribute_values(":ttl", AttributeValue::N(expires_at.to_string()));
            }
        }
        Ok(request)
    }
}

/// Sends a conditional update: a refused condition (the record is no longer what the
/// write expects) is no error, the write is left undone.
async fn unless_changed(
    request: aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
    step: &'static str,
) -> Result<(), ProcessError> {
    match request.send().await {
        Ok(_) => Ok(()),
        Err(e) if e.as_service_error().is_some_and(is_conditional_failure) => Ok(()),
        Err(e) => Err(ProcessError::from_sdk(&e).with_step(step)),
    }
}

/// What [`DeadLetterStore::back_to_dead`] requires of the record.
enum BackFrom<'a> {
    /// This run's lease (owner).
    Lease(&'a str),
    /// Still requeued with this message; the record's expiry then (epoch seconds).
    Requeued(&'a str, i64),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease transaction DynamoDB refuses as a whole (its records together pass the
    /// transaction's 4 MB: up to 100 records of up to 350 KB) is not an error of every item
    /// in it: they are leased one by one. DynamoDB Local does not enforce the limit, so the
    /// refusal is DynamoDB's answer, mocked.
    #[tokio::test]
    async fn a_transaction_refused_for_its_size_leases_its_items_one_by_one() {
        use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
        use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
        use aws_smithy_mocks::{mock, mock_client};
        let refused = mock!(aws_sdk_dynamodb::Client::transact_write_items).then_error(|| {
            TransactWriteItemsError::generic(
                aws_smithy_types::error::ErrorMetadata::builder()
                    .code("ValidationException")
                    .message("Transaction request cannot be larger than 4 MB")
                    .build(),
            )
        });
        let single = mock!(aws_sdk_dynamodb::Client::update_item)
            .then_output(|| UpdateItemOutput::builder().build());
        let store = crate::store::mocked_store(|clients| {
            clients.dynamodb = mock_client!(
                aws_sdk_dynamodb,
                aws_smithy_mocks::RuleMode::MatchAny,
                &[&refused, &single]
            );
        });
        let ids: Vec<String> = (0..3).map(|n| format!("big-{n}")).collect();
        let leases = store
            .acquire_leases(&ids, "run-1", Duration::from_secs(900))
            .await;
        assert!(leases.iter().all(|l| matches!(l, Ok(true))), "{leases:?}");
        assert_eq!(refused.num_calls(), 1);
        assert_eq!(single.num_calls(), 3);
    }
}
