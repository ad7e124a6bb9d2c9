//! The dead-letter table: key, indexes, TTL, and the conversion between
//! [`DeadLetteredItem`] and a DynamoDB item.
//!
//! | attribute | type | role |
//! | --- | --- | --- |
//! | `item_id` | S | partition key: one record per item, across redeliveries and redrives |
//! | `status` | S | `dead` / `redriving` / `requeued` / `resolved`; partition key of `by-status` |
//! | `last_attempt` | S | RFC 3339, millisecond, UTC (sorts in time order); sort key of both indexes |
//! | `error_signature` | S | partition key of `by-signature` |
//! | `expires_at` | N | epoch seconds; the table's TTL attribute |
//! | `failure_history` | L of M | one map per failed attempt, oldest first; at most `history_limit` (the first and the latest) |
//! | `history_omitted` | N | attempts counted in `failure_count` but dropped from the history |
//! | `attempt_ids` | SS | ids of recorded attempts: makes recording idempotent |
//! | `dlq_claims` | SS | source message ids whose DLQ message was undertaken (one per message) |
//! | `processed` | L of S | `msg:<source message id>` / `sha:<payload sha256>` known processed |
//! | everything else | | the fields of [`DeadLetteredItem`], as native types |
//!
//! Both indexes project all attributes, so `list` and `analyze` need no extra reads.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement,
    KeyType, Projection, ProjectionType, ScalarAttributeType,
};

use crate::dead_letter::DeadLetteredItem;
use crate::error::{ErrorClass, ProcessError};

/// Partition key.
pub const ITEM_ID: &str = "item_id";
/// Status attribute and `by-status` partition key.
pub const STATUS: &str = "status";
/// Sort key of both indexes.
pub const LAST_ATTEMPT: &str = "last_attempt";
/// `by-signature` partition key.
pub const ERROR_SIGNATURE: &str = "error_signature";
/// TTL attribute.
pub const EXPIRES_AT: &str = "expires_at";
/// The attempt history.
pub const FAILURE_HISTORY: &str = "failure_history";
/// Count of recorded attempts.
pub const FAILURE_COUNT: &str = "failure_count";
/// Attempts dropped from `failure_history` by compaction (N).
pub const HISTORY_OMITTED: &str = "history_omitted";
/// Whether an operator must look before a redrive (BOOL).
pub const MANUAL_REVIEW_REQUIRED: &str = "manual_review_required";
/// Ids of recorded attempts.
pub const ATTEMPT_IDS: &str = "attempt_ids";
/// Source message ids whose DLQ message a delivery has undertaken to send (SS): a second
/// delivery of the same message sends none.
pub const DLQ_CLAIMS: &str = "dlq_claims";
/// Source messages and payloads known processed (L of S).
pub const PROCESSED: &str = "processed";
/// While requeued: the message sent back to the source queue.
pub const REQUEUED_MESSAGE_ID: &str = "requeued_message_id";
/// Index listing records by status and time.
pub const BY_STATUS_INDEX: &str = "by-status";
/// Index listing records by error signature and time.
pub const BY_SIGNATURE_INDEX: &str = "by-signature";

/// Creates the table as the infrastructure template declares it (on-demand, two indexes),
/// then enables TTL. Used by the local pipeline and the tests.
pub async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), ProcessError> {
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(|e| ProcessError::validation(e.to_string()))
    };
    let attr = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(|e| ProcessError::validation(e.to_string()))
    };
    let index = |name: &str, pk: &str| -> Result<GlobalSecondaryIndex, ProcessError> {
        GlobalSecondaryIndex::builder()
            .index_name(name)
            .key_schema(key(pk, KeyType::Hash)?)
            .key_schema(key(LAST_ATTEMPT, KeyType::Range)?)
            .projection(
                Projection::builder()
                    .projection_type(ProjectionType::All)
                    .build(),
            )
            .build()
            .map_err(|e| ProcessError::validation(e.to_string()))
    };
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(key(ITEM_ID, KeyType::Hash)?)
        .attribute_definitions(attr(ITEM_ID)?)
        .attribute_definitions(attr(STATUS)?)
        .attribute_definitions(attr(LAST_ATTEMPT)?)
        .attribute_definitions(attr(ERROR_SIGNATURE)?)
        .global_secondary_indexes(index(BY_STATUS_INDEX, STATUS)?)
        .global_secondary_indexes(index(BY_SIGNATURE_INDEX, ERROR_SIGNATURE)?)
        .send()
        .await
        .map_err(|e| ProcessError::from_sdk(&e).with_step("create-table"))?;
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(
            aws_sdk_dynamodb::types::TimeToLiveSpecification::builder()
                .attribute_name(EXPIRES_AT)
                .enabled(true)
                .build()
                .map_err(|e| ProcessError::validation(e.to_string()))?,
        )
        .send()
        .await
        .map_err(|e| ProcessError::from_sdk(&e).with_step("enable-ttl"))?;
    Ok(())
}

/// The record as a JSON object (the shape stored, minus `attempt_ids`).
pub fn record_to_json(
    record: &DeadLetteredItem,
) -> Result<serde_json::Map<String, serde_json::Value>, ProcessError> {
    match serde_json::to_value(record) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(ProcessError::new(
            ErrorClass::Unknown,
            "record did not serialise to an object",
        )),
        Err(e) => Err(ProcessError::new(
            ErrorClass::Unknown,
            format!("record did not serialise: {e}"),
        )),
    }
}

/// History entries as the list attribute `failure_history` stores them.
pub fn history_to_attr(entries: &[crate::dead_letter::FailureDetail]) -> AttributeValue {
    AttributeValue::L(
        entries
            .iter()
            .map(|f| super::attr::to_attr(&serde_json::to_value(f.bounded()).unwrap_or_default()))
            .collect(),
    )
}

/// Reads a record from a DynamoDB item.
pub fn record_from_item(
    item: &HashMap<String, AttributeValue>,
) -> Result<DeadLetteredItem, ProcessError> {
    let mut map = super::attr::from_attr_map(item);
    map.remove(ATTEMPT_IDS);
    map.remove(DLQ_CLAIMS);
    let id = map
        .get(ITEM_ID)
        .and_then(|v| v.as_str())
        .unwrap_or("?")
        .to_string();
    serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| {
        ProcessError::validation(format!(
            "stored record {id:?} does not match the schema: {e}"
        ))
        .with_step("read-record")
    })
}
