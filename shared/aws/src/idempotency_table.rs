//! The idempotency table in DynamoDB ([`sqs_keeper_core::idempotency::IdempotencyStore`]).
//!
//! One item per key: `id` (the partition key, a string), `status` (`in_progress` or
//! `completed`), `token` (the attempt holding it), `until_ms` (when a claim ends or a
//! completion expires, epoch milliseconds: the conditions compare it), `expires_at` (the
//! same in epoch seconds: the table's TTL attribute, so DynamoDB deletes what expired), and
//! `result` (a completed item's stored result). Each operation is one conditional write;
//! a claim that finds the key taken reads the holder from the failed condition
//! (`ReturnValuesOnConditionCheckFailure`), so a duplicate costs one write request.

use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use super::condition_expression::WithCondition;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::{
    condition::idempotency as conditions, condition::idempotency::COMPLETED,
    condition::idempotency::IN_PROGRESS,
};
use sqs_keeper_core::{idempotency::Claim, idempotency::IdempotencyStore};

const ID: &str = conditions::ID.0[0];
const STATUS: &str = conditions::STATUS.0[0];
const TOKEN: &str = conditions::TOKEN.0[0];
const UNTIL: &str = conditions::UNTIL.0[0];
/// The TTL attribute the table must be configured with.
pub const TTL_ATTRIBUTE: &str = "expires_at";
const RESULT: &str = "result";

/// Idempotency records in a DynamoDB table (partition key `id`, string; TTL on
/// [`TTL_ATTRIBUTE`]).
#[derive(Debug, Clone)]
pub struct DynamoIdempotencyStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl DynamoIdempotencyStore {
    /// Creates the store over `table`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        DynamoIdempotencyStore {
            client,
            table: table.into(),
        }
    }

    /// Returns the table's name.
    pub fn table(&self) -> &str {
        &self.table
    }
}

use sqs_keeper_core::condition::epoch_millis as millis;

fn number(n: i64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

fn text(s: &str) -> AttributeValue {
    AttributeValue::S(s.to_string())
}

fn error<E>(
    err: &SdkError<E, aws_smithy_runtime_api::client::orchestrator::HttpResponse>,
) -> ProcessError
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    ProcessError::from_sdk(err).with_step("idempotency")
}

/// Reads what an item read back says about a key.
fn claim_of(item: &std::collections::HashMap<String, AttributeValue>) -> Claim {
    let until = item
        .get(UNTIL)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(UNIX_EPOCH, |ms| {
            UNIX_EPOCH + std::time::Duration::from_millis(ms)
        });
    match item
        .get(STATUS)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
    {
        Some(COMPLETED) => Claim::Completed {
            result: item.get(RESULT).and_then(|v| v.as_s().ok()).cloned(),
        },
        _ => Claim::InProgress { until },
    }
}

impl IdempotencyStore for DynamoIdempotencyStore {
    async fn claim(
        &self,
        key: &str,
        token: &str,
        in_progress_until: SystemTime,
        now: SystemTime,
    ) -> Result<Claim, ProcessError> {
        let until = millis(in_progress_until);
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item(ID, text(key))
            .item(STATUS, text(IN_PROGRESS))
            .item(TOKEN, text(token))
            .item(UNTIL, number(until))
            .item(TTL_ATTRIBUTE, number(until / 1000 + 1))
            .with_condition(&conditions::claimable(millis(now)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(Claim::Claimed),
            Err(SdkError::ServiceError(service))
                if matches!(
                    service.err(),
                    PutItemError::ConditionalCheckFailedException(_)
                ) =>
            {
                let held = match service.err() {
                    PutItemError::ConditionalCheckFailedException(e) => e.item().cloned(),
                    _ => None,
                };
                match held {
                    Some(item) => Ok(claim_of(&item)),
                    // An endpoint that does not return the item: read it.
                    None => {
                        let read = self
                            .client
                            .get_item()
                            .table_name(&self.table)
                            .key(ID, text(key))
                            .consistent_read(true)
                            .send()
                            .await
                            .map_err(|e| error(&e))?;
                        Ok(read
                            .item()
                            .map_or(Claim::InProgress { until: now }, claim_of))
                    }
                }
            }
            Err(e) => Err(error(&e)),
        }
    }

    async fn complete(
        &self,
        key: &str,
        token: &str,
        result: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), ProcessError> {
        let until = millis(expires_at);
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(ID, text(key))
            .with_condition(&conditions::held_by(token))
            .expression_attribute_names("#status", STATUS)
            .expression_attribute_names("#until", UNTIL)
            .expression_attribute_names("#ttl", TTL_ATTRIBUTE)
            .expression_attribute_names("#result", RESULT)
            .expression_attribute_values(":completed", text(COMPLETED))
            .expression_attribute_values(":until", number(until))
            .expression_attribute_values(":ttl", number(until / 1000 + 1));
        update = match result {
            Some(result) => update
                .update_expression(
                    "SET #status = :completed, #until = :until, #ttl = :ttl, #result = :result",
                )
                .expression_attribute_values(":result", text(result)),
            None => update.update_expression(
                "SET #status = :completed, #until = :until, #ttl = :ttl REMOVE #result",
            ),
        };
        update.send().await.map_err(|e| error(&e))?;
        Ok(())
    }

    async fn release(&self, key: &str, token: &str) -> Result<(), ProcessError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key(ID, text(key))
            .with_condition(&conditions::held_by(token))
            .send()
            .await
            .map_err(|e| error(&e))?;
        Ok(())
    }
}
