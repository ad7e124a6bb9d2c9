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
//! | `dlq_claims` | SS | claims on DLQ messages, `<source message id>:<receive count>` (`sqs_keeper_core::dead_letter::DlqClaim`) |
//! | `dlq_sent` | SS | source message ids whose DLQ message was sent (a redelivery of one is acknowledged) |
//! | `dlq_sent_forgotten` | L of S | the ids in `dlq_sent` whose every history entry compaction dropped, oldest first; past 32 the oldest leave both |
//! | `processed` | L of S | `msg:<source message id>` / `sha:<payload sha256>` known processed |
//! | everything else | | the fields of [`DeadLetteredItem`], as native types |
//!
//! Both indexes project all attributes, so `list` and `analyze` need no extra reads.
//!
//! The conversion between a record and an item is serde_dynamo's, from the record's serde
//! shape: strings are S, integers N, booleans BOOL, structs and maps M, sequences L, and an
//! absent optional field is NULL unless the field is skipped when absent (then it is not
//! stored). The two string sets are not fields of the record: the writes set them as SS
//! themselves, and reading leaves them out.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement,
    KeyType, Projection, ProjectionType, ScalarAttributeType,
};

use serde_dynamo::aws_sdk_dynamodb_1 as dynamo;

use sqs_keeper_core::{dead_letter::DeadLetteredItem, dead_letter::FailureDetail};
use sqs_keeper_core::{ErrorClass, ProcessError};

/// Partition key.
pub const ITEM_ID: &str = sqs_keeper_core::condition::names::ITEM_ID;
/// Status attribute and `by-status` partition key.
pub const STATUS: &str = sqs_keeper_core::condition::names::STATUS;
/// Sort key of both indexes.
pub const LAST_ATTEMPT: &str = sqs_keeper_core::condition::names::LAST_ATTEMPT;
/// `by-signature` partition key.
pub const ERROR_SIGNATURE: &str = "error_signature";
/// TTL attribute.
pub const EXPIRES_AT: &str = "expires_at";
/// The attempt history.
pub const FAILURE_HISTORY: &str = "failure_history";
/// Count of recorded attempts.
pub const FAILURE_COUNT: &str = sqs_keeper_core::condition::names::FAILURE_COUNT;
/// Attempts dropped from `failure_history` by compaction (N).
pub const HISTORY_OMITTED: &str = "history_omitted";
/// Whether an operator must look before a redrive (BOOL).
pub const MANUAL_REVIEW_REQUIRED: &str = "manual_review_required";
/// Ids of recorded attempts.
pub const ATTEMPT_IDS: &str = sqs_keeper_core::condition::names::ATTEMPT_IDS;
/// Source message ids whose DLQ message a delivery has undertaken to send (SS): a second
/// delivery of the same message sends none.
pub const DLQ_CLAIMS: &str = sqs_keeper_core::condition::names::DLQ_CLAIMS;
/// Source message ids whose DLQ message was sent (SS): a later delivery of one (its
/// acknowledgement was lost) is acknowledged, not sent back.
pub const DLQ_SENT: &str = "dlq_sent";
/// The ids in [`DLQ_SENT`] whose every history entry compaction dropped, oldest first
/// (`sqs_keeper_core::recording::SENT_MARKS_FORGOTTEN_MAX` at most).
pub const DLQ_SENT_FORGOTTEN: &str = "dlq_sent_forgotten";
/// Source messages and payloads known processed (L of S).
pub const PROCESSED: &str = sqs_keeper_core::condition::names::PROCESSED;
/// While requeued: the message sent back to the source queue.
pub const REQUEUED_MESSAGE_ID: &str = sqs_keeper_core::condition::names::REQUEUED_MESSAGE_ID;
/// When the record was last requeued (S, RFC 3339).
pub const REQUEUED_AT: &str = "requeued_at";
/// Owner of a redrive lease (S).
pub const LEASE_OWNER: &str = sqs_keeper_core::condition::names::LEASE_OWNER;
/// Lease expiry, epoch seconds (N).
pub const LEASE_EXPIRES_AT: &str = sqs_keeper_core::condition::names::LEASE_EXPIRES_AT;

// The `processed` entries of a source message id and of a payload digest (the record's
// own format, so the core's DLQ sweep reads them too).

/// Index listing records by status and time.
pub const BY_STATUS_INDEX: &str = "by-status";
/// Index listing records by error signature and time.
pub const BY_SIGNATURE_INDEX: &str = "by-signature";

/// What the indexes hold of a record beside their keys: the attributes a query filters on,
/// nothing more. A listing reads the records themselves after the index (one
/// `BatchGetItem` per page), so that a lease or a resolution, which moves a record between
/// status keys, writes a small index entry rather than a copy of a record of up to
/// 350 KB (an index projecting ALL made every such write cost about three times the record).
pub const INDEX_ATTRIBUTES: [&str; 6] = [
    STATUS,
    ERROR_SIGNATURE,
    "error_class",
    "reprocess_eligible",
    MANUAL_REVIEW_REQUIRED,
    LEASE_EXPIRES_AT,
];

/// Returns [`INDEX_ATTRIBUTES`] less the index's own key (`pk`), which every index holds anyway.
pub fn index_attributes(pk: &str) -> Vec<String> {
    INDEX_ATTRIBUTES
        .iter()
        .filter(|name| **name != pk)
        .map(|name| name.to_string())
        .collect()
}

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
                    .projection_type(ProjectionType::Include)
                    .set_non_key_attributes(Some(index_attributes(pk)))
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

/// Returns the record as a DynamoDB item: every field of [`DeadLetteredItem`], without the sets
/// `attempt_ids`, `dlq_claims` and `dlq_sent` and the list `dlq_sent_forgotten`, which the
/// writes maintain themselves.
pub fn record_to_item(
    record: &DeadLetteredItem,
) -> Result<HashMap<String, AttributeValue>, ProcessError> {
    dynamo::to_item(record).map_err(|e| {
        ProcessError::new(
            ErrorClass::Unknown,
            format!("record did not serialise: {e}"),
        )
    })
}

/// Renders history entries as the list attribute `failure_history` stores them, each within
/// its size limits ([`FailureDetail::bounded`]).
pub fn history_to_attr(entries: &[FailureDetail]) -> Result<AttributeValue, ProcessError> {
    let bounded: Vec<FailureDetail> = entries.iter().map(FailureDetail::bounded).collect();
    dynamo::to_attribute_value(bounded).map_err(|e| {
        ProcessError::new(
            ErrorClass::Unknown,
            format!("failure history did not serialise: {e}"),
        )
    })
}

/// Reads a record from a DynamoDB item. An item that does not read as a record is a
/// validation error, `stored record "<id>" does not match the schema: …` at step
/// `read-record`, by which callers report it.
pub fn record_from_item(
    item: &HashMap<String, AttributeValue>,
) -> Result<DeadLetteredItem, ProcessError> {
    let unreadable = |reason: &dyn std::fmt::Display| {
        let id = item
            .get(ITEM_ID)
            .and_then(|v| v.as_s().ok())
            .map_or("?", String::as_str);
        ProcessError::validation(format!(
            "stored record {id:?} does not match the schema: {reason}"
        ))
        .with_step("read-record")
    };
    // serde_dynamo panics on a type this SDK does not know (one DynamoDB might add): such
    // an item is refused like any other unreadable one.
    if !item.values().all(is_known) {
        return Err(unreadable(
            &"an attribute has a type this version cannot read",
        ));
    }
    // The sets are the writes' bookkeeping, not fields of the record: not copied.
    let fields: HashMap<String, AttributeValue> = item
        .iter()
        .filter(|(name, _)| {
            !matches!(
                name.as_str(),
                ATTEMPT_IDS | DLQ_CLAIMS | DLQ_SENT | DLQ_SENT_FORGOTTEN
            )
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    dynamo::from_item(fields).map_err(|e| unreadable(&e))
}

/// Tells whether a value, and everything in it, is of a type DynamoDB documents.
fn is_known(value: &AttributeValue) -> bool {
    match value {
        AttributeValue::M(map) => map.values().all(is_known),
        AttributeValue::L(list) => list.iter().all(is_known),
        AttributeValue::S(_)
        | AttributeValue::N(_)
        | AttributeValue::B(_)
        | AttributeValue::Bool(_)
        | AttributeValue::Null(_)
        | AttributeValue::Ss(_)
        | AttributeValue::Ns(_)
        | AttributeValue::Bs(_) => true,
        _ => false,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use chrono::{DateTime, Utc};

    use super::*;
    use sqs_keeper_core::{
        dead_letter::ItemPayload, dead_letter::ItemStatus, dead_letter::MessageAttribute,
        dead_letter::PayloadLocation, dead_letter::SourceContext, DeadLetterReason,
    };

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(secs, 123_000_000).unwrap()
    }

    fn entry(n: u32) -> FailureDetail {
        FailureDetail {
            attempt_id: format!("m-1:3:{n}"),
            attempt_number: n,
            receive_count: 3,
            message_id: "m-1".into(),
            timestamp: at(1_700_000_100 + i64::from(n)),
            error_type: ErrorClass::Validation,
            error_message: format!("amount {n} must be positive"),
            causes: vec!["parse error".into(), "bad digit".into()],
            error_code: Some("InvalidAmount".into()),
            http_status: Some(422),
            step: Some("deliver".into()),
            duration_ms: 25,
            function_name: Some("worker".into()),
            request_id: Some("req-1".into()),
            log_group: Some("/aws/lambda/worker".into()),
            log_stream: Some("2026/11/21/[$LATEST]abc".into()),
            response_excerpt: Some("{\"error\":\"amount\"}".into()),
        }
    }

    /// Returns a record with every optional field set, a two-entry history and message attributes
    /// of the three SQS data types.
    pub(crate) fn full_record() -> DeadLetteredItem {
        let attribute = |data_type: &str, string: Option<&str>, binary: Option<&str>| {
            MessageAttribute::from_parts(
                data_type.into(),
                string.map(str::to_string),
                binary.map(str::to_string),
            )
        };
        DeadLetteredItem {
            item_id: "order-7".into(),
            payload: ItemPayload {
                location: PayloadLocation::Inline {
                    body: "{\"id\":\"order-7\"}".into(),
                },
                size_bytes: 16,
                sha256: "ab".repeat(32),
            },
            first_attempt: at(1_700_000_000),
            last_attempt: at(1_700_000_102),
            failure_count: 7,
            failure_history: vec![entry(1), entry(2)],
            history_omitted: 5,
            error_signature: "validation:amount # must be positive".into(),
            error_class: ErrorClass::Validation,
            last_error: "amount 2 must be positive".into(),
            reason: DeadLetterReason::Permanent,
            reprocess_eligible: false,
            manual_review_required: true,
            source: SourceContext {
                queue_arn: Some("arn:aws:sqs:us-east-1:1:q".into()),
                message_id: "m-1".into(),
                message_group_id: Some("g".into()),
                sent_timestamp: Some(at(1_699_999_999)),
                receive_count: 3,
                message_attributes: BTreeMap::from([
                    ("tenant".into(), attribute("String", Some("acme"), None)),
                    ("priority".into(), attribute("Number.int", Some("5"), None)),
                    ("blob".into(), attribute("Binary", None, Some("AAEC"))),
                ]),
                attributes_omitted: 2,
                trace_header: Some(
                    "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
                        .into(),
                ),
            },
            status: ItemStatus::Redriving,
            expires_at: 1_701_209_600,
            resolved_at: Some(at(1_700_000_200)),
            lease_expires_at: Some(1_700_000_500),
            requeued_message_id: Some("m-2".into()),
            requeued_at: Some(at(1_700_000_200)),
            processed: vec!["msg:m-0".into(), format!("sha:{}", "cd".repeat(32))],
        }
    }

    /// Returns the DynamoDB type of a value, as the console names it.
    pub(crate) fn kind(value: &AttributeValue) -> &'static str {
        match value {
            AttributeValue::S(_) => "S",
            AttributeValue::N(_) => "N",
            AttributeValue::B(_) => "B",
            AttributeValue::Bool(_) => "BOOL",
            AttributeValue::Null(_) => "NULL",
            AttributeValue::M(_) => "M",
            AttributeValue::L(_) => "L",
            AttributeValue::Ss(_) => "SS",
            AttributeValue::Ns(_) => "NS",
            AttributeValue::Bs(_) => "BS",
            _ => "?",
        }
    }

    /// Returns the names and types of a map's attributes, in name order.
    pub(crate) fn kinds(map: &HashMap<String, AttributeValue>) -> BTreeMap<&str, &'static str> {
        map.iter().map(|(k, v)| (k.as_str(), kind(v))).collect()
    }

    fn m(value: &AttributeValue) -> &HashMap<String, AttributeValue> {
        value.as_m().unwrap()
    }

    /// The types of the record's attributes (the top level), as [`full_record`] stores them.
    pub(crate) const FULL_RECORD_TYPES: [(&str, &str); 21] = [
        ("error_class", "S"),
        ("error_signature", "S"),
        ("expires_at", "N"),
        ("failure_count", "N"),
        ("failure_history", "L"),
        ("first_attempt", "S"),
        ("history_omitted", "N"),
        ("item_id", "S"),
        ("last_attempt", "S"),
        ("last_error", "S"),
        ("lease_expires_at", "N"),
        ("manual_review_required", "BOOL"),
        ("payload", "M"),
        ("processed", "L"),
        ("reason", "S"),
        ("reprocess_eligible", "BOOL"),
        ("requeued_at", "S"),
        ("requeued_message_id", "S"),
        ("resolved_at", "S"),
        ("source", "M"),
        ("status", "S"),
    ];

    /// Asserts the types inside the nested attributes of [`full_record`]'s item.
    pub(crate) fn assert_nested_types(item: &HashMap<String, AttributeValue>) {
        assert_eq!(
            kinds(m(&item["payload"])),
            BTreeMap::from([
                ("body", "S"),
                ("sha256", "S"),
                ("size_bytes", "N"),
                ("storage", "S")
            ])
        );
        let source = m(&item["source"]);
        assert_eq!(
            kinds(source),
            BTreeMap::from([
                ("attributes_omitted", "N"),
                ("message_attributes", "M"),
                ("message_group_id", "S"),
                ("message_id", "S"),
                ("queue_arn", "S"),
                ("receive_count", "N"),
                ("sent_timestamp", "S"),
                ("trace_header", "S"),
            ])
        );
        let attributes = m(&source["message_attributes"]);
        for name in ["tenant", "priority"] {
            assert_eq!(
                kinds(m(&attributes[name])),
                BTreeMap::from([("data_type", "S"), ("string_value", "S")]),
                "{name}"
            );
        }
        assert_eq!(
            kinds(m(&attributes["blob"])),
            BTreeMap::from([("binary_value", "S"), ("data_type", "S")])
        );
        let history = item["failure_history"].as_l().unwrap();
        assert_eq!(history.len(), 2);
        for entry in history {
            let entry = m(entry);
            assert_eq!(
                kinds(entry),
                BTreeMap::from([
                    ("attempt_id", "S"),
                    ("attempt_number", "N"),
                    ("causes", "L"),
                    ("duration_ms", "N"),
                    ("error_code", "S"),
                    ("error_message", "S"),
                    ("error_type", "S"),
                    ("function_name", "S"),
                    ("http_status", "N"),
                    ("log_group", "S"),
                    ("log_stream", "S"),
                    ("message_id", "S"),
                    ("receive_count", "N"),
                    ("request_id", "S"),
                    ("response_excerpt", "S"),
                    ("step", "S"),
                    ("timestamp", "S"),
                ])
            );
            let causes = entry["causes"].as_l().unwrap();
            assert!(causes.iter().all(|c| kind(c) == "S"), "{causes:?}");
        }
        if let Some(processed) = item.get("processed") {
            let processed = processed.as_l().unwrap();
            assert!(processed.iter().all(|p| kind(p) == "S"), "{processed:?}");
        }
    }

    #[test]
    fn a_full_record_is_stored_with_native_types() {
        let record = full_record();
        let item = record_to_item(&record).unwrap();
        assert_eq!(kinds(&item), BTreeMap::from(FULL_RECORD_TYPES));
        assert_nested_types(&item);
        // Values as the console shows them.
        assert_eq!(item["status"].as_s().unwrap(), "redriving");
        assert_eq!(item["error_class"].as_s().unwrap(), "validation");
        assert_eq!(item["expires_at"].as_n().unwrap(), "1701209600");
        assert_eq!(
            item["first_attempt"].as_s().unwrap(),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(m(&item["payload"])["storage"].as_s().unwrap(), "inline");
        assert_eq!(m(&item["payload"])["size_bytes"].as_n().unwrap(), "16");
    }

    #[test]
    fn absent_optional_fields_are_null_or_not_stored_as_before() {
        let mut record = full_record();
        record.resolved_at = None;
        record.lease_expires_at = None;
        record.requeued_message_id = None;
        record.requeued_at = None;
        record.processed.clear();
        record.source.queue_arn = None;
        record.source.attributes_omitted = 0;
        record.source.trace_header = None;
        record.failure_history[0].error_code = None;
        record.failure_history[0].response_excerpt = None;
        let item = record_to_item(&record).unwrap();
        // Fields skipped when absent are not stored; the others are NULL.
        for gone in [
            "lease_expires_at",
            "requeued_message_id",
            "requeued_at",
            "processed",
        ] {
            assert!(!item.contains_key(gone), "{gone}");
        }
        assert_eq!(item["resolved_at"], AttributeValue::Null(true));
        let source = m(&item["source"]);
        assert_eq!(source["queue_arn"], AttributeValue::Null(true));
        assert!(!source.contains_key("attributes_omitted"));
        assert!(!source.contains_key("trace_header"));
        let first = m(&item["failure_history"].as_l().unwrap()[0]);
        assert_eq!(first["error_code"], AttributeValue::Null(true));
        assert!(!first.contains_key("response_excerpt"));
        assert_eq!(record_from_item(&item).unwrap(), record);
    }

    #[test]
    fn a_record_round_trips() {
        let record = full_record();
        let mut item = record_to_item(&record).unwrap();
        // The sets the writes add are no part of the record.
        item.insert(
            ATTEMPT_IDS.into(),
            AttributeValue::Ss(vec!["m-1:3:1".into(), "m-1:3:2".into()]),
        );
        item.insert(DLQ_CLAIMS.into(), AttributeValue::Ss(vec!["m-1".into()]));
        assert_eq!(record_from_item(&item).unwrap(), record);

        let mut in_s3 = record;
        in_s3.payload.location = PayloadLocation::S3 {
            bucket: "b".into(),
            key: "payloads/order-7/ab".into(),
        };
        let item = record_to_item(&in_s3).unwrap();
        assert_eq!(
            kinds(m(&item["payload"])),
            BTreeMap::from([
                ("bucket", "S"),
                ("key", "S"),
                ("sha256", "S"),
                ("size_bytes", "N"),
                ("storage", "S")
            ])
        );
        assert_eq!(record_from_item(&item).unwrap(), in_s3);
    }

    #[test]
    fn history_entries_are_maps_within_their_limits() {
        let mut long = entry(1);
        long.error_message = "x".repeat(5_000);
        let AttributeValue::L(list) = history_to_attr(&[long, entry(2)]).unwrap() else {
            panic!("not a list")
        };
        assert_eq!(list.len(), 2);
        let first = m(&list[0]);
        assert!(
            first["error_message"].as_s().unwrap().len()
                <= sqs_keeper_core::dead_letter::ERROR_MESSAGE_LIMIT
        );
        assert_eq!(m(&list[1])["http_status"].as_n().unwrap(), "422");
    }

    /// JSON to attribute values as the records were written before serde_dynamo.
    fn json_to_attr(value: &serde_json::Value) -> AttributeValue {
        use serde_json::Value;
        match value {
            Value::Null => AttributeValue::Null(true),
            Value::Bool(b) => AttributeValue::Bool(*b),
            Value::Number(n) => AttributeValue::N(n.to_string()),
            Value::String(s) => AttributeValue::S(s.clone()),
            Value::Array(items) => AttributeValue::L(items.iter().map(json_to_attr).collect()),
            Value::Object(map) => AttributeValue::M(
                map.iter()
                    .map(|(k, v)| (k.clone(), json_to_attr(v)))
                    .collect(),
            ),
        }
    }

    #[test]
    fn items_are_the_same_as_through_json() {
        let mut sparse = full_record();
        sparse.resolved_at = None;
        sparse.source.queue_arn = None;
        sparse.failure_history[1].http_status = None;
        sparse.processed.clear();
        for record in [full_record(), sparse] {
            let AttributeValue::M(through_json) =
                json_to_attr(&serde_json::to_value(&record).unwrap())
            else {
                panic!("not a map")
            };
            assert_eq!(record_to_item(&record).unwrap(), through_json);
            assert_eq!(record_from_item(&through_json).unwrap(), record);
        }
    }

    #[test]
    fn an_item_written_by_earlier_versions_still_reads() {
        let s = |v: &str| AttributeValue::S(v.into());
        let n = |v: &str| AttributeValue::N(v.into());
        let null = AttributeValue::Null(true);
        let map = |entries: Vec<(&str, AttributeValue)>| {
            AttributeValue::M(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            )
        };
        // No `history_omitted`, `processed` or `response_excerpt` yet; message attributes as
        // plain strings, `<Binary>` standing for a value not kept; unset options NULL.
        let history_entry = map(vec![
            ("attempt_id", s("m-1:2:1")),
            ("attempt_number", n("1")),
            ("receive_count", n("2")),
            ("message_id", s("m-1")),
            ("timestamp", s("2023-11-14T22:15:01.000Z")),
            ("error_type", s("throttled")),
            ("error_message", s("slow down")),
            ("causes", AttributeValue::L(vec![])),
            ("error_code", null.clone()),
            ("http_status", n("429")),
            ("step", s("deliver")),
            ("duration_ms", n("40")),
            ("function_name", null.clone()),
            ("request_id", null.clone()),
            ("log_group", null.clone()),
            ("log_stream", null.clone()),
        ]);
        let item: HashMap<String, AttributeValue> = [
            ("item_id", s("old-1")),
            (
                "payload",
                map(vec![
                    ("storage", s("s3")),
                    ("bucket", s("b")),
                    ("key", s("payloads/old-1/ff")),
                    ("size_bytes", n("300000")),
                    ("sha256", s("ff")),
                ]),
            ),
            ("first_attempt", s("2023-11-14T22:15:01.000Z")),
            ("last_attempt", s("2023-11-14T22:15:01.000Z")),
            ("failure_count", n("1")),
            ("failure_history", AttributeValue::L(vec![history_entry])),
            ("error_signature", s("throttled:slow down")),
            ("error_class", s("throttled")),
            ("last_error", s("slow down")),
            ("reason", s("receive_budget_exhausted")),
            ("reprocess_eligible", AttributeValue::Bool(true)),
            ("manual_review_required", AttributeValue::Bool(false)),
            (
                "source",
                map(vec![
                    ("queue_arn", s("arn:aws:sqs:us-east-1:1:q")),
                    ("message_id", s("m-1")),
                    ("message_group_id", null.clone()),
                    ("sent_timestamp", null.clone()),
                    ("receive_count", n("2")),
                    (
                        "message_attributes",
                        map(vec![("tenant", s("acme")), ("blob", s("<Binary>"))]),
                    ),
                ]),
            ),
            ("status", s("dead")),
            ("expires_at", n("1701209600")),
            ("resolved_at", null.clone()),
            ("attempt_ids", AttributeValue::Ss(vec!["m-1:2:1".into()])),
            ("dlq_claims", AttributeValue::Ss(vec!["m-1".into()])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();

        let expected = DeadLetteredItem {
            item_id: "old-1".into(),
            payload: ItemPayload {
                location: PayloadLocation::S3 {
                    bucket: "b".into(),
                    key: "payloads/old-1/ff".into(),
                },
                size_bytes: 300_000,
                sha256: "ff".into(),
            },
            first_attempt: DateTime::<Utc>::from_timestamp(1_700_000_101, 0).unwrap(),
            last_attempt: DateTime::<Utc>::from_timestamp(1_700_000_101, 0).unwrap(),
            failure_count: 1,
            failure_history: vec![FailureDetail {
                attempt_id: "m-1:2:1".into(),
                attempt_number: 1,
                receive_count: 2,
                message_id: "m-1".into(),
                timestamp: DateTime::<Utc>::from_timestamp(1_700_000_101, 0).unwrap(),
                error_type: ErrorClass::Throttled,
                error_message: "slow down".into(),
                causes: vec![],
                error_code: None,
                http_status: Some(429),
                step: Some("deliver".into()),
                duration_ms: 40,
                function_name: None,
                request_id: None,
                log_group: None,
                log_stream: None,
                response_excerpt: None,
            }],
            history_omitted: 0,
            error_signature: "throttled:slow down".into(),
            error_class: ErrorClass::Throttled,
            last_error: "slow down".into(),
            reason: DeadLetterReason::ReceiveBudgetExhausted,
            reprocess_eligible: true,
            manual_review_required: false,
            source: SourceContext {
                queue_arn: Some("arn:aws:sqs:us-east-1:1:q".into()),
                message_id: "m-1".into(),
                message_group_id: None,
                sent_timestamp: None,
                receive_count: 2,
                message_attributes: BTreeMap::from([
                    ("tenant".into(), MessageAttribute::string("acme")),
                    (
                        "blob".into(),
                        MessageAttribute::Unkept {
                            data_type: "Binary".into(),
                        },
                    ),
                ]),
                attributes_omitted: 0,
                trace_header: None,
            },
            status: ItemStatus::Dead,
            expires_at: 1_701_209_600,
            resolved_at: None,
            lease_expires_at: None,
            requeued_message_id: None,
            requeued_at: None,
            processed: vec![],
        };
        assert_eq!(record_from_item(&item).unwrap(), expected);
    }

    #[test]
    fn an_unreadable_item_is_reported_by_its_id() {
        let mut item = record_to_item(&full_record()).unwrap();
        item.insert(STATUS.into(), AttributeValue::S("lost".into()));
        let error = record_from_item(&item).unwrap_err();
        assert_eq!(error.class, ErrorClass::Validation);
        assert_eq!(error.step.as_deref(), Some("read-record"));
        assert!(
            error
                .message
                .starts_with("stored record \"order-7\" does not match the schema: "),
            "{error}"
        );

        item.remove(ITEM_ID);
        let error = record_from_item(&item).unwrap_err();
        assert!(
            error
                .message
                .starts_with("stored record \"?\" does not match the schema: "),
            "{error}"
        );
    }
}
