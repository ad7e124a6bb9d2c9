//! The dead-letter store: DynamoDB records, S3 for large payloads, and the DLQ.
//!
//! Dead-lettering a record is three writes, in this order (docs/ARCHITECTURE.md §1.1):
//!
//! 1. the payload to S3, when the record would be larger than `inline_max_bytes`;
//! 2. the [`DeadLetteredItem`] to DynamoDB, merged into any existing record of the same
//!    item: each attempt is appended once, even if the same attempt is recorded twice
//!    (a crash between steps re-delivers it), and `failure_count` stays exact;
//! 3. a message on the DLQ (batched, up to 10 per call) carrying the item id and the
//!    original body, or an Extended Client pointer to the S3 payload.
//!
//! Only when all three succeed is the record reported as dead-lettered (and acked); a
//! failure at any step leaves it in `batchItemFailures`, so SQS delivers it again.

pub mod dlq;
pub mod lease;
pub mod maintenance;
pub mod payload;
pub mod ports;
pub mod query;
pub mod schema;
pub mod sweep;

use std::collections::HashSet;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use chrono::Utc;
use futures::StreamExt;

use crate::adapters::aws::AwsClients;
use crate::dead_letter::{
    compact_history, dead_lettering_elsewhere, needs_manual_review, DeadLetterCandidate,
    DeadLetterSink, DeadLetteredItem, FailureDetail, InvocationInfo, PayloadLocation,
};
use crate::error::{ErrorClass, ProcessError};
use crate::pointer::{PayloadPolicy, S3Pointer};

/// Where dead-lettered items go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// DynamoDB table.
    pub table: String,
    /// DLQ URL.
    pub queue_url: String,
    /// Payload bucket.
    pub bucket: String,
    /// Bodies larger than this go to S3 (default 64 KiB: the record stays far below
    /// DynamoDB's 400 KB item limit even with a long history).
    pub inline_max_bytes: usize,
    /// How long records are kept.
    pub retention: Duration,
    /// Records written at once.
    pub write_concurrency: usize,
    /// Most entries a record's history keeps ([`crate::dead_letter::HISTORY_LIMIT`]).
    pub history_limit: usize,
}

impl StoreConfig {
    /// A configuration with default limits.
    pub fn new(table: &str, queue_url: &str, bucket: &str) -> Self {
        StoreConfig {
            table: table.to_string(),
            queue_url: queue_url.to_string(),
            bucket: bucket.to_string(),
            inline_max_bytes: 65_536,
            retention: Duration::from_secs(14 * 86_400),
            write_concurrency: 10,
            history_limit: crate::dead_letter::HISTORY_LIMIT,
        }
    }
}

/// Most bytes a record is planned to take, well under DynamoDB's 400 KB item limit.
pub const RECORD_BUDGET: usize = 350_000;

/// Most bytes one history entry takes once bounded ([`FailureDetail::bounded`]: 1 KiB
/// message, 6 causes of 256 B, a 512 B response excerpt, and the fixed fields).
pub const HISTORY_ENTRY_MAX: usize = 4096;

/// Whether a body of `len` bytes stays inline in its record: within `inline_max`, and small
/// enough that the record stays within [`RECORD_BUDGET`] even with a full history (the
/// limit and one entry more before compaction), the capped attributes and the rest of the
/// record. A larger body goes to S3, whatever `DLQ_INLINE_MAX_BYTES` allows.
pub fn stays_inline(len: usize, inline_max: usize) -> bool {
    let rest = (crate::dead_letter::HISTORY_LIMIT + 1) * HISTORY_ENTRY_MAX
        + crate::dead_letter::ATTRIBUTES_LIMIT
        + 16 * 1024;
    len <= inline_max && len + rest <= RECORD_BUDGET
}

/// The DynamoDB + S3 + SQS dead-letter store.
#[derive(Debug, Clone)]
pub struct DeadLetterStore {
    clients: AwsClients,
    config: StoreConfig,
}

impl DeadLetterStore {
    /// A store over existing clients.
    pub fn new(clients: AwsClients, config: StoreConfig) -> Self {
        DeadLetterStore { clients, config }
    }

    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The clients.
    pub fn clients(&self) -> &AwsClients {
        &self.clients
    }

    /// Moves the payload to S3 when it is larger than the inline limit.
    pub async fn offload_payload(&self, record: &mut DeadLetteredItem) -> Result<(), ProcessError> {
        let PayloadLocation::Inline { body } = &record.payload.location else {
            return Ok(());
        };
        if stays_inline(body.len(), self.config.inline_max_bytes) {
            return Ok(());
        }
        let pointer = S3Pointer {
            bucket: self.config.bucket.clone(),
            key: payload::payload_key(&record.item_id, &record.payload.sha256),
        };
        payload::put_payload(&self.clients.s3, &pointer, body, &record.payload.sha256).await?;
        record.payload.location = PayloadLocation::S3 {
            bucket: pointer.bucket,
            key: pointer.key,
        };
        Ok(())
    }

    /// Upserts a record: new attempts are appended once, known ones are ignored.
    pub async fn record(&self, record: &DeadLetteredItem) -> Result<(), ProcessError> {
        self.record_delivery(record, None).await.map(|_| ())
    }

    /// Upserts a record as [`DeadLetterStore::record`] does and, with `claim` (a source
    /// message id), undertakes in the same conditional write to send that message's one DLQ
    /// message. Returns whether this write holds the claim: `false` when another delivery of
    /// the same message claimed it first (SQS delivers at least once), or when every attempt
    /// was already recorded (the same delivery, invoked twice).
    async fn record_delivery(
        &self,
        record: &DeadLetteredItem,
        claim: Option<&str>,
    ) -> Result<bool, ProcessError> {
        let mut pending: Vec<FailureDetail> = record.failure_history.clone();
        let mut claim = claim;
        // A conflict means another writer recorded some of these attempts (or claimed the
        // message); at most a few rounds are needed to converge.
        for _ in 0..5 {
            if pending.is_empty() {
                return Ok(false);
            }
            match self.try_record(record, &pending, claim).await? {
                Some(stored) => {
                    self.after_append(stored).await?;
                    return Ok(claim.is_some());
                }
                None => {
                    let (known, claims) = self.attempt_ids_and_claims(&record.item_id).await?;
                    pending.retain(|f| !known.contains(&f.attempt_id));
                    if claim.is_some_and(|c| claims.contains(c)) {
                        claim = None;
                    }
                }
            }
        }
        Err(ProcessError::new(
            ErrorClass::ServerError,
            format!(
                "record {:?} kept changing while being written",
                record.item_id
            ),
        )
        .with_step("record"))
    }

    /// One conditional update; `None` when a pending attempt was already recorded (or the
    /// claim was already taken).
    async fn try_record(
        &self,
        record: &DeadLetteredItem,
        pending: &[FailureDetail],
        claim: Option<&str>,
    ) -> Result<Option<DeadLetteredItem>, ProcessError> {
        let mut fields = schema::record_to_item(record)?;
        fields.remove(schema::ITEM_ID);
        fields.remove(schema::FAILURE_COUNT);
        fields.remove(schema::FAILURE_HISTORY);
        // Counted by compaction alone.
        fields.remove(schema::HISTORY_OMITTED);
        // Accumulated by resolutions; a new failure does not forget them.
        fields.remove(schema::PROCESSED);
        let first_attempt = fields.remove("first_attempt");
        // Set on creation; afterwards `settle_review_flag` decides on the whole history
        // (which may hold dropped attempts this write cannot see).
        let review = fields.remove(schema::MANUAL_REVIEW_REQUIRED);
        // In name order, so that the same record always makes the same expression.
        let mut fields: Vec<(String, AttributeValue)> = fields.into_iter().collect();
        fields.sort_unstable_by(|a, b| a.0.cmp(&b.0));

        let mut request = self
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(record.item_id.clone()))
            .return_values(ReturnValue::AllNew);
        let mut sets = Vec::new();
        for (n, (name, value)) in fields.into_iter().enumerate() {
            sets.push(format!("#f{n} = :f{n}"));
            request = request
                .expression_attribute_names(format!("#f{n}"), name)
                .expression_attribute_values(format!(":f{n}"), value);
        }
        if let Some(review) = review {
            sets.push("#review = if_not_exists(#review, :review)".to_string());
            request = request
                .expression_attribute_names("#review", schema::MANUAL_REVIEW_REQUIRED)
                .expression_attribute_values(":review", review);
        }
        if let Some(first) = first_attempt {
            sets.push("#first = if_not_exists(#first, :first)".to_string());
            request = request
                .expression_attribute_names("#first", "first_attempt")
                .expression_attribute_values(":first", first);
        }
        // A new failure ends a requeue: the item is dead again.
        let removes = " REMOVE #requeued";
        request = request.expression_attribute_names("#requeued", schema::REQUEUED_MESSAGE_ID);
        sets.push("#hist = list_append(if_not_exists(#hist, :empty), :hist)".to_string());
        let mut conditions = Vec::new();
        for (n, attempt) in pending.iter().enumerate() {
            conditions.push(format!("NOT contains(#ids, :a{n})"));
            request = request.expression_attribute_values(
                format!(":a{n}"),
                AttributeValue::S(attempt.attempt_id.clone()),
            );
        }
        let mut adds = "#count :count, #ids :ids".to_string();
        if let Some(claim) = claim {
            conditions.push("NOT contains(#claims, :claim)".to_string());
            adds.push_str(", #claims :claims");
            request = request
                .expression_attribute_names("#claims", schema::DLQ_CLAIMS)
                .expression_attribute_values(":claim", AttributeValue::S(claim.to_string()))
                .expression_attribute_values(
                    ":claims",
                    AttributeValue::Ss(vec![claim.to_string()]),
                );
        }
        let update = format!("SET {}{removes} ADD {adds}", sets.join(", "));
        let result = request
            .update_expression(update)
            .condition_expression(conditions.join(" AND "))
            .expression_attribute_names("#hist", schema::FAILURE_HISTORY)
            .expression_attribute_names("#count", schema::FAILURE_COUNT)
            .expression_attribute_names("#ids", schema::ATTEMPT_IDS)
            .expression_attribute_values(":empty", AttributeValue::L(Vec::new()))
            .expression_attribute_values(":hist", schema::history_to_attr(pending)?)
            .expression_attribute_values(":count", AttributeValue::N(pending.len().to_string()))
            .expression_attribute_values(
                ":ids",
                AttributeValue::Ss(pending.iter().map(|f| f.attempt_id.clone()).collect()),
            )
            .send()
            .await;
        match result {
            Ok(output) => {
                let stored = output
                    .attributes()
                    .map(schema::record_from_item)
                    .transpose()?;
                Ok(stored.or_else(|| Some(record.clone())))
            }
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(None)
            }
            Err(e) => Err(ProcessError::from_sdk(&e).with_step("record")),
        }
    }

    /// Gives up the claim on a message's DLQ message (its send failed), so that the next
    /// delivery of the message sends it.
    async fn release_claim(&self, item_id: &str, message_id: &str) -> Result<(), ProcessError> {
        self.clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .update_expression("DELETE #claims :claims")
            .expression_attribute_names("#claims", schema::DLQ_CLAIMS)
            .expression_attribute_values(
                ":claims",
                AttributeValue::Ss(vec![message_id.to_string()]),
            )
            .send()
            .await
            .map(|_| ())
            .map_err(|e| ProcessError::from_sdk(&e).with_step("release-claim"))
    }

    /// What follows a write that appended to a record's history (`stored` is the record as
    /// written): the review flag is settled on the whole history, then the history is
    /// compacted if it grew past the limit. Compaction is housekeeping: the record is
    /// already durable, so a failed compaction is logged, not reported as a failed record
    /// (that would send the message round again), and the next append compacts.
    pub(crate) async fn after_append(&self, stored: DeadLetteredItem) -> Result<(), ProcessError> {
        self.settle_review_flag(&stored).await?;
        let item_id = stored.item_id.clone();
        if let Err(error) = self.compact_history_of(stored).await {
            tracing::warn!(item_id = %item_id, error = %error, "history not compacted; the next failure retries");
        }
        Ok(())
    }

    /// Keeps a record's history within [`StoreConfig::history_limit`]: the first attempts
    /// and the latest ones stay, `history_omitted` counts the others. The write holds only
    /// if no attempt was appended since `stored` was read (`failure_count` unchanged); when
    /// one was, that writer compacts instead.
    async fn compact_history_of(&self, stored: DeadLetteredItem) -> Result<(), ProcessError> {
        if stored.failure_history.len() <= self.config.history_limit {
            return Ok(());
        }
        let (kept, dropped) = compact_history(stored.failure_history, self.config.history_limit);
        let result = self
            .clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(stored.item_id.clone()))
            // The ids of dropped attempts go with them: `attempt_ids` would otherwise grow
            // by one id per attempt for ever.
            // Claims only matter while a message may still be delivered again: those of the
            // messages in the kept entries stay.
            .update_expression(
                "SET #hist = :kept, #ids = :kept_ids, #claims = :kept_claims, #processed = :kept_processed \
                 ADD #omitted :dropped",
            )
            // A finished requeue appends to `processed` without trimming it: trimmed here.
            .expression_attribute_names("#processed", schema::PROCESSED)
            .expression_attribute_values(":kept_processed", {
                let skip = stored
                    .processed
                    .len()
                    .saturating_sub(crate::dead_letter::PROCESSED_LIMIT);
                AttributeValue::L(
                    stored
                        .processed
                        .iter()
                        .skip(skip)
                        .cloned()
                        .map(AttributeValue::S)
                        .collect(),
                )
            })
            .expression_attribute_names("#ids", schema::ATTEMPT_IDS)
            .expression_attribute_names("#claims", schema::DLQ_CLAIMS)
            .expression_attribute_values(
                ":kept_claims",
                AttributeValue::Ss(
                    kept.iter()
                        .map(|f| f.message_id.clone())
                        .collect::<HashSet<_>>()
                        .into_iter()
                        .collect(),
                ),
            )
            .expression_attribute_values(
                ":kept_ids",
                AttributeValue::Ss(kept.iter().map(|f| f.attempt_id.clone()).collect()),
            )
            .condition_expression("#count = :count")
            .expression_attribute_names("#hist", schema::FAILURE_HISTORY)
            .expression_attribute_names("#omitted", schema::HISTORY_OMITTED)
            .expression_attribute_names("#count", schema::FAILURE_COUNT)
            .expression_attribute_values(":kept", schema::history_to_attr(&kept)?)
            .expression_attribute_values(":dropped", AttributeValue::N(dropped.to_string()))
            .expression_attribute_values(
                ":count",
                AttributeValue::N(stored.failure_count.to_string()),
            )
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(ProcessError::from_sdk(&e).with_step("compact-history")),
        }
    }

    /// `manual_review_required` depends on the whole history, which an update expression
    /// cannot see: fix it afterwards in the rare case the merged history changes it. Once
    /// attempts have been dropped from the history the flag is only ever raised: a dropped
    /// permission or validation failure still counts.
    pub(crate) async fn settle_review_flag(
        &self,
        stored: &DeadLetteredItem,
    ) -> Result<(), ProcessError> {
        let wanted = needs_manual_review(&stored.failure_history)
            || (stored.history_omitted > 0 && stored.manual_review_required);
        if wanted == stored.manual_review_required {
            return Ok(());
        }
        self.clients
            .dynamodb
            .update_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(stored.item_id.clone()))
            .update_expression("SET manual_review_required = :v")
            .expression_attribute_values(":v", AttributeValue::Bool(wanted))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| ProcessError::from_sdk(&e).with_step("record"))
    }

    /// The recorded attempt ids and the claimed source message ids of a record.
    async fn attempt_ids_and_claims(
        &self,
        item_id: &str,
    ) -> Result<(HashSet<String>, HashSet<String>), ProcessError> {
        let output = self
            .clients
            .dynamodb
            .get_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .projection_expression("#ids, #claims")
            .expression_attribute_names("#ids", schema::ATTEMPT_IDS)
            .expression_attribute_names("#claims", schema::DLQ_CLAIMS)
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
        Ok((set(schema::ATTEMPT_IDS), set(schema::DLQ_CLAIMS)))
    }

    /// Steps 1 and 2 for one candidate: payload to S3 if large, then the record, claiming
    /// the source message's DLQ message. A delivery that finds the claim taken (the same
    /// message delivered twice) gets [`dead_lettering_elsewhere`]: it sends nothing.
    async fn persist(
        &self,
        candidate: &DeadLetterCandidate,
        invocation: &InvocationInfo,
        now: chrono::DateTime<Utc>,
    ) -> Result<DeadLetteredItem, ProcessError> {
        let mut record =
            DeadLetteredItem::from_candidate(candidate, invocation, now, self.config.retention);
        self.offload_payload(&mut record).await?;
        let claimed = self
            .record_delivery(&record, Some(&record.source.message_id))
            .await?;
        if claimed {
            Ok(record)
        } else {
            Err(dead_lettering_elsewhere())
        }
    }

    /// Reads one record (strongly consistent).
    pub async fn get(&self, item_id: &str) -> Result<Option<DeadLetteredItem>, ProcessError> {
        let output = self
            .clients
            .dynamodb
            .get_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("read-record"))?;
        output.item().map(schema::record_from_item).transpose()
    }
}

impl DeadLetterSink for DeadLetterStore {
    async fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
    ) -> Result<(), ProcessError> {
        DeadLetterStore::finish_requeued(self, item_id, message_id, payload_sha256).await
    }

    async fn dead_letter(
        &self,
        candidates: &[DeadLetterCandidate],
        invocation: &InvocationInfo,
    ) -> Vec<Result<(), ProcessError>> {
        let now = crate::clock::now();
        // Steps 1 and 2, per record, a bounded number at once.
        let writes: Vec<_> = candidates
            .iter()
            .map(|candidate| self.persist(candidate, invocation, now))
            .collect();
        let persisted: Vec<Result<DeadLetteredItem, ProcessError>> = futures::stream::iter(writes)
            .buffered(self.config.write_concurrency.max(1))
            .collect()
            .await;
        // Step 3, batched, for the records that were persisted.
        let to_send: Vec<&DeadLetteredItem> =
            persisted.iter().filter_map(|r| r.as_ref().ok()).collect();
        let sent_results = dlq::send(&self.clients.sqs, &self.config, &to_send).await;
        for (record, result) in to_send.iter().zip(&sent_results) {
            if result.is_err() {
                // The next delivery of this message must be free to send it.
                if let Err(e) = self
                    .release_claim(&record.item_id, &record.source.message_id)
                    .await
                {
                    tracing::warn!(item_id = %record.item_id, error = %e, "could not release the DLQ claim; the message reaches the DLQ through the queue's redrive policy");
                }
            }
        }
        let mut sent = sent_results.into_iter();
        persisted
            .into_iter()
            .map(|result| match result {
                Ok(_) => sent.next().unwrap_or_else(|| {
                    Err(
                        ProcessError::new(ErrorClass::Unknown, "DLQ send returned no result")
                            .with_step("dlq"),
                    )
                }),
                Err(e) => Err(e),
            })
            .collect()
    }
}

/// Resolves SQS Extended Client pointer bodies from S3 before processing, within a
/// [`PayloadPolicy`]: only from the buckets it allows, and at most its size cap.
#[derive(Debug, Clone)]
pub struct ExtendedClientResolver {
    s3: aws_sdk_s3::Client,
    policy: PayloadPolicy,
}

impl ExtendedClientResolver {
    /// A resolver using this S3 client and policy.
    pub fn new(s3: aws_sdk_s3::Client, policy: PayloadPolicy) -> Self {
        ExtendedClientResolver { s3, policy }
    }
}

impl crate::batch::BodyResolver for ExtendedClientResolver {
    fn resolve<'a>(
        &'a self,
        body: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<Result<String, ProcessError>>> {
        Box::pin(async move {
            let pointer = S3Pointer::parse(body)?;
            if !self.policy.allows(&pointer.bucket) {
                // Not followed at all: the sender chose the bucket, and the worker's role
                // may read more than the sender should. A permission failure, so a human
                // looks at it before any redrive.
                return Some(Err(ProcessError::new(
                    ErrorClass::Permission,
                    format!(
                        "the payload pointer names bucket {:?}, which is not one the worker reads payloads from ({} or {})",
                        pointer.bucket,
                        crate::config::vars::PAYLOAD_BUCKETS,
                        crate::config::vars::BUCKET
                    ),
                )
                .with_step("fetch-payload")));
            }
            Some(
                payload::get_payload_limited(&self.s3, &pointer, self.policy.max_bytes)
                    .await
                    .map(|(text, _)| text),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_stays_inline_only_while_a_full_record_fits_its_budget() {
        assert!(stays_inline(65_536, 65_536), "the default limit fits");
        assert!(!stays_inline(65_537, 65_536));
        // DLQ_INLINE_MAX_BYTES may allow 256 KiB, but with 51 history entries of up to 4 KiB
        // such a record could pass 400 KB: the body goes to S3.
        assert!(!stays_inline(200_000, 262_144));
        let largest = (0..=262_144)
            .rev()
            .find(|n| stays_inline(*n, 262_144))
            .unwrap_or(0);
        assert!(largest > 65_536 && largest < 120_000, "{largest}");
    }

    /// A store whose DynamoDB client is `dynamodb` (the other clients are never called).
    fn store_over(dynamodb: aws_sdk_dynamodb::Client) -> DeadLetterStore {
        let shared = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        let mut clients = AwsClients::from_config(&shared, true);
        clients.dynamodb = dynamodb;
        DeadLetterStore::new(clients, StoreConfig::new("t", "q", "b"))
    }

    #[tokio::test]
    async fn the_first_write_stores_every_attribute_with_its_type() {
        use std::collections::{BTreeMap, HashMap};
        use std::sync::{Arc, Mutex};

        use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
        use aws_sdk_dynamodb::Client;
        use aws_smithy_mocks::{mock, mock_client};
        use schema::tests::{assert_nested_types, full_record, kinds, FULL_RECORD_TYPES};

        // What the update leaves on a table without the item: each name set (or added to
        // nothing) to its value; `if_not_exists` and `list_append` onto nothing give the
        // value itself.
        let written = Arc::new(Mutex::new(None));
        let seen = written.clone();
        let update = mock!(Client::update_item).then_compute_output(move |input| {
            let values = input.expression_attribute_values().unwrap();
            let mut item: HashMap<String, AttributeValue> = input.key().unwrap().clone();
            for (alias, name) in input.expression_attribute_names().unwrap() {
                if let Some(value) = values.get(&format!(":{}", &alias[1..])) {
                    item.insert(name.clone(), value.clone());
                }
            }
            *seen.lock().unwrap() = Some(item.clone());
            UpdateItemOutput::builder()
                .set_attributes(Some(item))
                .build()
        });
        let store = store_over(mock_client!(aws_sdk_dynamodb, &[&update]));

        // A first write counts its own attempts; compaction and resolutions write the rest.
        let record = DeadLetteredItem {
            failure_count: 2,
            history_omitted: 0,
            processed: Vec::new(),
            ..full_record()
        };
        let stored = store
            .try_record(&record, &record.failure_history, Some("m-1"))
            .await
            .unwrap();
        assert_eq!(stored, Some(record.clone()), "reads back as written");

        let item = written.lock().unwrap().take().unwrap();
        let mut expected = BTreeMap::from(FULL_RECORD_TYPES);
        expected.remove(schema::HISTORY_OMITTED);
        expected.remove(schema::PROCESSED);
        expected.insert(schema::ATTEMPT_IDS, "SS");
        expected.insert(schema::DLQ_CLAIMS, "SS");
        assert_eq!(kinds(&item), expected);
        assert_nested_types(&item);
        assert_eq!(
            item[schema::ATTEMPT_IDS].as_ss().unwrap(),
            &["m-1:3:1".to_string(), "m-1:3:2".to_string()]
        );
        assert_eq!(
            item[schema::DLQ_CLAIMS].as_ss().unwrap(),
            &["m-1".to_string()]
        );
        assert_eq!(item[schema::FAILURE_COUNT].as_n().unwrap(), "2");
    }

    #[tokio::test]
    async fn an_attribute_of_a_type_unknown_to_the_sdk_makes_the_record_unreadable() {
        use aws_sdk_dynamodb::Client;
        use aws_smithy_mocks::{mock, mock_client};
        use aws_smithy_runtime_api::http::{Response, StatusCode};
        use aws_smithy_types::body::SdkBody;

        let get = mock!(Client::get_item).then_http_response(|| {
            Response::new(
                StatusCode::try_from(200).unwrap(),
                SdkBody::from(
                    r#"{"Item":{"item_id":{"S":"order-7"},"payload":{"M":{"new":{"ZZ":"x"}}}}}"#,
                ),
            )
        });
        let store = store_over(mock_client!(aws_sdk_dynamodb, &[&get]));
        let error = store.get("order-7").await.unwrap_err();
        assert_eq!(error.step.as_deref(), Some("read-record"));
        assert!(
            error
                .message
                .starts_with("stored record \"order-7\" does not match the schema: "),
            "{error}"
        );
        assert!(
            error.message.contains("a type this version cannot read"),
            "{error}"
        );
    }
}
