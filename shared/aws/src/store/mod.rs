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
//!
//! The order and the merge rules are the core's (its `recording`), and so is the DLQ sweep
//! (its `sweep`); the store gives them the core's four store
//! ports, one per AWS resource (docs/ARCHITECTURE.md §5):
//!
//! | port | here | what it is |
//! | --- | --- | --- |
//! | [`sqs_keeper_core::ports::RecordStore`] | `record_store` (with `lease`, `query`, `maintenance`) | the DynamoDB table: reads, the conditional `UpdateItem`s, leases, deletes |
//! | [`sqs_keeper_core::ports::DeadLetterQueue`] | `dlq_messages` (with `dlq`) | the DLQ: the batched dead-letter send, receive, adopt, delete, hold, rotate |
//! | [`sqs_keeper_core::ports::PayloadStore`] | `payload` | the S3 bucket: `GetObject`, `PutObject`, `DeleteObject` |
//! | [`sqs_keeper_core::ports::SourceQueue`] | `source_queue` | the source queues a requeue sends to |
//!
//! and the worker's [`DeadLetterSink`]: [`sqs_keeper_core::recording::dead_letter`] over
//! them, with the DLQ's `MaximumMessageSize` read once.

mod dlq;
mod dlq_messages;
mod lease;
mod maintenance;
mod payload;
mod query;
mod record_store;
pub mod schema;
mod source_queue;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::aws::AwsClients;
use sqs_keeper_core::pointer::PayloadPolicy;
use sqs_keeper_core::ports::RecordStore;
use sqs_keeper_core::recording::RecordingSettings;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::{clock::Clock, random::Random};
use sqs_keeper_core::{
    dead_letter::DeadLetterCandidate, dead_letter::DeadLetterSink, dead_letter::DeadLetteredItem,
    dead_letter::InvocationInfo,
};

/// Where dead-lettered items go. Built by [`StoreConfig::new`], then its fields set.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Most entries a record's history keeps ([`sqs_keeper_core::dead_letter::HISTORY_LIMIT`]).
    pub history_limit: usize,
}

impl StoreConfig {
    /// Creates a configuration with default limits.
    pub fn new(table: &str, queue_url: &str, bucket: &str) -> Self {
        StoreConfig {
            table: table.to_string(),
            queue_url: queue_url.to_string(),
            bucket: bucket.to_string(),
            inline_max_bytes: 65_536,
            retention: Duration::from_secs(14 * 86_400),
            // A whole batch of ten in one wave, a batch of 100 in two: the writes are to
            // different items, so DynamoDB applies them side by side, and a batch's dead
            // letters cost a few round trips instead of one per record. Each write in
            // flight may open its own connection on a sandbox's first dead letters.
            write_concurrency: 50,
            history_limit: sqs_keeper_core::dead_letter::HISTORY_LIMIT,
        }
    }

    /// Returns what the core's `recording` needs of it, by the system clock (a store that
    /// reads another sets its own: [`DeadLetterStore::with_clock`]).
    pub fn recording_settings(&self) -> RecordingSettings {
        RecordingSettings {
            bucket: self.bucket.clone(),
            inline_max_bytes: self.inline_max_bytes,
            history_limit: self.history_limit,
            retention: self.retention,
            write_concurrency: self.write_concurrency,
            clock: Clock::system(),
        }
    }
}

/// The DynamoDB + S3 + SQS dead-letter store.
///
/// The worker's sink, and what the redrive and `dlq` read and write through:
///
/// ```no_run
/// use sqs_keeper_aws::{AwsClients, DeadLetterStore, StoreConfig};
/// use sqs_keeper_core::{selection::RecordFilter, dead_letter::ItemStatus};
///
/// # async fn example() -> Result<(), sqs_keeper_core::ProcessError> {
/// let clients = AwsClients::from_env().await;
/// let config = StoreConfig::new(
///     "orders-dead-letters",
///     "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq",
///     "orders-payloads",
/// );
/// let store = DeadLetterStore::new(clients, config);
/// let dead = RecordFilter { status: Some(ItemStatus::Dead), ..RecordFilter::default() };
/// let page = store.query_page(&dead, 100, None).await?;
/// for record in &page.records {
///     println!("{} {} {}", record.item_id, record.error_class, record.failure_count);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DeadLetterStore {
    clients: AwsClients,
    config: StoreConfig,
    /// What an adoption may follow an Extended-Client pointer to (the store's own bucket,
    /// with the default size cap, unless set).
    payload_policy: PayloadPolicy,
    /// The DLQ's `MaximumMessageSize`, read once (on the first dead letter): a body is kept
    /// inline, and sent inline to the DLQ, only when the DLQ takes it.
    dlq_max: std::sync::Arc<tokio::sync::OnceCell<u64>>,
    /// The wall clock records, leases and adoptions are stamped by.
    clock: Clock,
    /// Where a purge's sweep draws its marker from.
    random: Random,
}

/// What a DLQ message's attributes may take beside its body (item id, table, class,
/// signature, source message id, digest and size, names and types included): an inline
/// body is kept under the DLQ's `MaximumMessageSize` less this.
pub const DLQ_ATTRIBUTES_ALLOWANCE: u64 = 8 * 1024;

/// Rounds of `BatchGetItem` for the keys DynamoDB leaves unprocessed (backing off 0.1 s to
/// 1.6 s between them, about 6 s in all).
pub(crate) const BATCH_GET_ROUNDS: u32 = 8;

impl DeadLetterStore {
    /// Creates a store over existing clients.
    pub fn new(clients: AwsClients, config: StoreConfig) -> Self {
        let payload_policy = PayloadPolicy::allowing([config.bucket.clone()]);
        DeadLetterStore {
            clients,
            config,
            payload_policy,
            dlq_max: std::sync::Arc::new(tokio::sync::OnceCell::new()),
            clock: Clock::default(),
            random: Random::default(),
        }
    }

    /// Reads wall time (record timestamps, lease expiries, adoptions) from `clock` (the
    /// system clock unless set).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Draws a purge's sweep marker from `random` (the thread's generator unless set).
    pub fn with_random(mut self, random: Random) -> Self {
        self.random = random;
        self
    }

    /// Lets the sweep's adoption follow Extended-Client pointers as the worker does: to
    /// the buckets `policy` allows (the store's own always) and no larger than its cap.
    pub fn with_payload_policy(mut self, mut policy: PayloadPolicy) -> Self {
        policy.allowed_buckets.insert(self.config.bucket.clone());
        self.payload_policy = policy;
        self
    }

    /// Checks that the table, the DLQ and the bucket it is configured with exist, with one
    /// read each: a command that changes the store calls it before it changes anything, so
    /// that a misnamed resource is an error naming it, never half a purge. A missing one is
    /// an error whose code says which (`ResourceNotFoundException`, `QueueDoesNotExist`,
    /// `NoSuchBucket`).
    pub async fn check_resources(&self) -> Result<(), ProcessError> {
        self.check_table().await?;
        self.check_dlq().await?;
        self.check_bucket().await
    }

    /// Makes one read of the table (`GetItem` of a key no record has).
    async fn check_table(&self) -> Result<(), ProcessError> {
        self.clients
            .dynamodb
            .get_item()
            .table_name(&self.config.table)
            .key(schema::ITEM_ID, AttributeValue::S("resource-check".into()))
            .projection_expression("#id")
            .expression_attribute_names("#id", schema::ITEM_ID)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| ProcessError::from_sdk(&e).with_step("check-table"))
    }

    /// Makes one read of the DLQ (`GetQueueAttributes`).
    async fn check_dlq(&self) -> Result<(), ProcessError> {
        self.dlq_depth().await.map(|_| ())
    }

    /// Makes one read of the bucket (`HeadBucket`, which `s3:ListBucket` allows).
    async fn check_bucket(&self) -> Result<(), ProcessError> {
        let bucket = self
            .clients
            .s3
            .head_bucket()
            .bucket(&self.config.bucket)
            .send()
            .await;
        match bucket {
            Ok(_) => Ok(()),
            // A HEAD answers 404 without a body: the SDK names it `NotFound`.
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => {
                let mut error = ProcessError::from_sdk(&e).with_step("check-bucket");
                error.code = Some("NoSuchBucket".into());
                Err(error)
            }
            Err(e) => Err(ProcessError::from_sdk(&e).with_step("check-bucket")),
        }
    }

    /// Returns the configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Returns the clients.
    pub fn clients(&self) -> &AwsClients {
        &self.clients
    }

    /// Returns the settings the core's `recording` runs with.
    fn recording(&self) -> RecordingSettings {
        RecordingSettings {
            clock: self.clock,
            ..self.config.recording_settings()
        }
    }

    /// [`DeadLetterStore::recording`] for dead-lettering: a body stays inline (and goes to
    /// the DLQ inline) only when the DLQ takes it with its attributes, whatever
    /// `DLQ_INLINE_MAX_BYTES` allows; larger goes to S3 and the DLQ message is a pointer.
    /// The DLQ's size is read once (`sqs:GetQueueAttributes`); a failed read is tried again
    /// on the next dead letter, the configured limit holding meanwhile.
    async fn recording_for_dlq(&self) -> RecordingSettings {
        let mut settings = self.recording();
        let dlq_max = self
            .dlq_max
            .get_or_try_init(|| self.dlq_maximum_message_size())
            .await;
        match dlq_max {
            Ok(max) => {
                let room = usize::try_from(max.saturating_sub(DLQ_ATTRIBUTES_ALLOWANCE))
                    .unwrap_or(usize::MAX);
                settings.inline_max_bytes = settings.inline_max_bytes.min(room);
            }
            Err(error) => tracing::warn!(
                error = %error.loggable(),
                "cannot read the DLQ's MaximumMessageSize; bodies up to DLQ_INLINE_MAX_BYTES stay inline"
            ),
        }
        settings
    }

    async fn dlq_maximum_message_size(&self) -> Result<u64, ProcessError> {
        maximum_message_size(&self.clients.sqs, &self.config.queue_url, "dlq").await
    }

    /// Moves the payload to S3 when it would not stay inline
    /// ([`sqs_keeper_core::recording::offload_payload`]).
    pub async fn offload_payload(&self, record: &mut DeadLetteredItem) -> Result<(), ProcessError> {
        sqs_keeper_core::recording::offload_payload(self, &self.recording(), record).await
    }

    /// Upserts a record: new attempts are appended once, known ones are ignored
    /// ([`sqs_keeper_core::recording::record`]).
    pub async fn record(&self, record: &DeadLetteredItem) -> Result<(), ProcessError> {
        sqs_keeper_core::recording::record(self, &self.recording(), record).await
    }

    /// Returns what follows a write that appended to a record's history, from the item it left
    /// (`ALL_NEW`): the review flag settled, the history compacted
    /// ([`sqs_keeper_core::recording::after_append`]).
    pub(crate) async fn after_append(
        &self,
        item: &HashMap<String, AttributeValue>,
    ) -> Result<(), ProcessError> {
        let written = record_store::written_from_item(item)?;
        sqs_keeper_core::recording::after_append(self, &self.recording(), &written).await
    }

    /// Returns the items of `ids` (each once) by item id, read with strongly consistent
    /// `BatchGetItem`s of 100 shaped by `shape` (a projection, say). Keys DynamoDB leaves
    /// unprocessed (it throttles) are asked again with backoff; still unread after
    /// [`BATCH_GET_ROUNDS`], they are an error named `step`, never a missing item (a record
    /// taken for missing would be adopted over, or left out of a listing).
    pub(crate) async fn batch_get(
        &self,
        ids: &[String],
        step: &'static str,
        shape: impl Fn(
            aws_sdk_dynamodb::types::builders::KeysAndAttributesBuilder,
        ) -> aws_sdk_dynamodb::types::builders::KeysAndAttributesBuilder,
    ) -> Result<HashMap<String, HashMap<String, AttributeValue>>, ProcessError> {
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        let mut found = HashMap::new();
        let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
        let unique: Vec<&String> = unique.into_iter().collect();
        for chunk in unique.chunks(100) {
            let mut keys = item_keys(chunk);
            for round in 0..BATCH_GET_ROUNDS {
                if keys.is_empty() {
                    break;
                }
                if round > 0 {
                    // DynamoDB leaves keys unprocessed when it throttles: back off.
                    tokio::time::sleep(std::time::Duration::from_millis(50 << round.min(5))).await;
                }
                let request =
                    shape(KeysAndAttributes::builder().set_keys(Some(std::mem::take(&mut keys))))
                        .consistent_read(true)
                        .build()
                        .map_err(|e| ProcessError::validation(e.to_string()).with_step(step))?;
                let output = self
                    .clients
                    .dynamodb
                    .batch_get_item()
                    .request_items(&self.config.table, request)
                    .send()
                    .await
                    .map_err(|e| ProcessError::from_sdk(&e).with_step(step))?;
                let items = output.responses().and_then(|r| r.get(&self.config.table));
                for item in items.into_iter().flatten() {
                    if let Some(id) = item.get(schema::ITEM_ID).and_then(|v| v.as_s().ok()) {
                        found.insert(id.clone(), item.clone());
                    }
                }
                keys = output
                    .unprocessed_keys()
                    .and_then(|u| u.get(&self.config.table))
                    .map(|k| k.keys().to_vec())
                    .unwrap_or_default();
            }
            if !keys.is_empty() {
                return Err(ProcessError::new(
                    sqs_keeper_core::ErrorClass::Throttled,
                    format!(
                        "{} records could not be read (DynamoDB left them unprocessed {BATCH_GET_ROUNDS} times)",
                        keys.len()
                    ),
                )
                .with_step(step));
            }
        }
        Ok(found)
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

/// Returns a queue's name: the last segment of its URL.
fn queue_name(url: &str) -> &str {
    url.trim_end_matches('/').rsplit('/').next().unwrap_or(url)
}

/// How long the start-up check waits for each read.
pub const START_UP_CHECK_TIMEOUT: Duration = Duration::from_secs(4);

/// `read`'s outcome, or a timeout of `step` when it does not answer in
/// [`START_UP_CHECK_TIMEOUT`].
async fn answered(
    read: impl std::future::Future<Output = Result<(), ProcessError>>,
    step: &str,
) -> Result<(), ProcessError> {
    tokio::time::timeout(START_UP_CHECK_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| {
            let message = format!("no answer in {} s", START_UP_CHECK_TIMEOUT.as_secs());
            Err(ProcessError::new(sqs_keeper_core::ErrorClass::Timeout, message).with_step(step))
        })
}

impl DeadLetterStore {
    /// Checks that the table, the DLQ and the bucket exist and answer, with the reads of
    /// [`DeadLetterStore::check_resources`] (`GetItem`, `GetQueueAttributes`, `HeadBucket`,
    /// which a worker's role allows), at once and each bounded. The error names each
    /// resource that failed, with its region and why.
    pub async fn check_reachable(&self) -> Result<(), String> {
        // At once: a cold start waits for one round trip, not three. Each within a bound,
        // so that an endpoint that never answers is named before Lambda's 10 s init limit.
        let (table, queue, bucket) = futures::join!(
            answered(self.check_table(), "check-table"),
            answered(self.check_dlq(), "dlq-depth"),
            answered(self.check_bucket(), "check-bucket")
        );
        let failures: Vec<String> = [table, queue, bucket]
            .into_iter()
            .filter_map(Result::err)
            .map(|e| self.naming_its_resource(e).message)
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the dead-letter store cannot be reached: {}",
                failures.join("; ")
            ))
        }
    }

    /// `error` with the resource its step used, and the region, said in its message: a
    /// table, queue or bucket misnamed in the configuration is named where it fails. A
    /// dead letter handed on to another delivery is left as it is.
    fn naming_its_resource(&self, mut error: ProcessError) -> ProcessError {
        if sqs_keeper_core::dead_letter::is_dead_lettering_elsewhere(&error) {
            return error;
        }
        let step = error.step.as_deref().unwrap_or_default();
        // The queue by its name: its URL carries the account id, which logs need not hold.
        let queue = queue_name(&self.config.queue_url);
        let resource = match step {
            s if s.starts_with("dlq") => format!("queue {queue}"),
            s if s.contains("payload") || s.contains("bucket") => {
                format!("bucket {}", self.config.bucket)
            }
            _ if step.is_empty() => format!(
                "table {}, queue {queue}, bucket {}",
                self.config.table, self.config.bucket
            ),
            _ => format!("table {}", self.config.table),
        };
        let region = self
            .clients
            .config
            .region()
            .map_or_else(|| "no region".to_string(), |r| r.to_string());
        error.message = format!("{} ({resource}, {region})", error.message);
        error
    }
}

impl DeadLetterSink for DeadLetterStore {
    async fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
        requeued_by: &str,
    ) -> Result<(), ProcessError> {
        RecordStore::finish_requeued(self, item_id, message_id, payload_sha256, requeued_by).await
    }

    async fn finish_moved_back(
        &self,
        item_id: &str,
        dead_lettered: &str,
        message_id: &str,
        payload_sha256: &str,
    ) -> Result<(), ProcessError> {
        RecordStore::finish_moved_back(self, item_id, dead_lettered, message_id, payload_sha256)
            .await
    }

    async fn dead_letter(
        &self,
        candidates: &[DeadLetterCandidate],
        invocation: &InvocationInfo,
    ) -> Vec<Result<(), ProcessError>> {
        let settings = self.recording_for_dlq().await;
        sqs_keeper_core::recording::dead_letter(self, &settings, candidates, invocation)
            .await
            .into_iter()
            .map(|result| result.map_err(|error| self.naming_its_resource(error)))
            .collect()
    }
}

/// Returns the largest message the queue at `queue_url` takes (its `MaximumMessageSize`, one
/// `GetQueueAttributes`); `step` names the caller's step in an error.
pub(crate) async fn maximum_message_size(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    step: &str,
) -> Result<u64, ProcessError> {
    use aws_sdk_sqs::types::QueueAttributeName;
    queue_number(sqs, queue_url, QueueAttributeName::MaximumMessageSize, step).await
}

/// Reads how long the queue at `queue_url` keeps a message (its `MessageRetentionPeriod`, one
/// `GetQueueAttributes`); `step` names the caller's step in an error.
pub(crate) async fn message_retention(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    step: &str,
) -> Result<std::time::Duration, ProcessError> {
    use aws_sdk_sqs::types::QueueAttributeName;
    queue_number(
        sqs,
        queue_url,
        QueueAttributeName::MessageRetentionPeriod,
        step,
    )
    .await
    .map(std::time::Duration::from_secs)
}

/// Reads one numeric attribute of the queue at `queue_url` (one `GetQueueAttributes`).
async fn queue_number(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    name: aws_sdk_sqs::types::QueueAttributeName,
    step: &str,
) -> Result<u64, ProcessError> {
    let output = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(name.clone())
        .send()
        .await
        .map_err(|e| ProcessError::from_sdk(&e).with_step(step))?;
    output
        .attributes()
        .and_then(|a| a.get(&name))
        .and_then(|value| value.parse().ok())
        .ok_or_else(|| {
            ProcessError::new(
                sqs_keeper_core::ErrorClass::Unknown,
                format!("the queue's attributes name no {}", name.as_str()),
            )
            .with_step(step)
        })
}

/// Resolves SQS Extended Client pointer bodies from S3 before processing, within a
/// [`PayloadPolicy`]: only from the buckets it allows, and at most its size cap.
#[derive(Debug, Clone)]
pub struct ExtendedClientResolver {
    s3: aws_sdk_s3::Client,
    policy: PayloadPolicy,
}

impl ExtendedClientResolver {
    /// Creates a resolver using this S3 client and policy.
    pub fn new(s3: aws_sdk_s3::Client, policy: PayloadPolicy) -> Self {
        ExtendedClientResolver { s3, policy }
    }
}

impl sqs_keeper_core::batch::BodyResolver for ExtendedClientResolver {
    fn resolve<'a>(
        &'a self,
        body: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<Result<String, ProcessError>>> {
        Box::pin(async move {
            let pointer = match self.policy.pointer_in(body)? {
                Ok(pointer) => pointer,
                Err(refused) => return Some(Err(refused)),
            };
            Some(
                payload::get_payload_limited(&self.s3, &pointer, self.policy.max_bytes)
                    .await
                    .map(|(text, _)| text),
            )
        })
    }
}

/// Returns a store over table `t`, queue `q` and bucket `b` whose clients `mock` replaces (with
/// `aws_smithy_mocks` clients); the others are never called.
#[cfg(test)]
pub(crate) fn mocked_store(mock: impl FnOnce(&mut AwsClients)) -> DeadLetterStore {
    let shared = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .build();
    let mut clients = AwsClients::from_config(&shared, true);
    mock(&mut clients);
    DeadLetterStore::new(clients, StoreConfig::new("t", "q", "b"))
}

/// Returns the table keys of `ids`.
fn item_keys(ids: &[&String]) -> Vec<HashMap<String, AttributeValue>> {
    ids.iter()
        .map(|id| {
            HashMap::from([(
                schema::ITEM_ID.to_string(),
                AttributeValue::S((*id).clone()),
            )])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose DynamoDB client is `dynamodb` (the other clients are never called).
    fn store_over(dynamodb: aws_sdk_dynamodb::Client) -> DeadLetterStore {
        mocked_store(|clients| clients.dynamodb = dynamodb)
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
                // The condition's own placeholders (`#cN`, `:cN`) name no value written.
                let condition = alias
                    .strip_prefix("#c")
                    .is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()));
                if condition {
                    continue;
                }
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
            .try_record(
                &record,
                &record.failure_history,
                Some(&sqs_keeper_core::dead_letter::DlqClaim::new("m-1", 3)),
                sqs_keeper_core::ports::Expect::Any,
            )
            .await
            .unwrap();
        assert_eq!(
            stored.map(|w| w.record),
            Some(record.clone()),
            "reads back as written"
        );

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
            &["m-1:3".to_string()]
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
