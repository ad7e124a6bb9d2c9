//! Dead-lettering: the [`DeadLetteredItem`] record (docs/ARCHITECTURE.md §3), its pure construction from a
//! failed record, and the [`DeadLetterSink`] that persists it.
//!
//! A record handed to a sink is acknowledged only if the sink reports success for it
//! (docs/ARCHITECTURE.md §1.1): until then it stays in the batch response as a failure.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{ErrorClass, ProcessError};
use crate::item::WorkItem;
use crate::retry::AttemptFailure;
use crate::signature::error_signature;

/// Longest error message kept in a record (the latest error and each history entry).
/// DynamoDB items hold at most 400 KB: a processor's multi-kilobyte message or cause chain
/// repeated in every attempt would make the record unwritable, and a record that cannot be
/// written keeps its message cycling until the queue moves it unrecorded.
pub const ERROR_MESSAGE_LIMIT: usize = 1024;
/// Most causes kept per attempt.
pub const CAUSES_LIMIT: usize = 6;
/// Longest cause kept.
pub const CAUSE_LIMIT: usize = 256;
/// Longest excerpt of a callee's response kept per attempt ([`FailureDetail::response_excerpt`]).
pub const RESPONSE_EXCERPT_LIMIT: usize = 512;
/// Most entries a record's `failure_history` holds (an entry is at most about 3 KB with
/// the limits above, so a full history stays far below 400 KB beside a 64 KiB inline
/// payload). Beyond it [`compact_history`] keeps the first and the latest attempts.
pub const HISTORY_LIMIT: usize = 50;
/// How many of the first attempts a compacted history keeps (how the trouble started);
/// the rest of [`HISTORY_LIMIT`] goes to the latest ones.
pub const HISTORY_HEAD: usize = 10;

/// Cuts a history to at most `limit` entries: the first `min(HISTORY_HEAD, limit / 2)` and
/// the latest rest. Returns the entries kept and how many were dropped.
pub fn compact_history(
    mut history: Vec<FailureDetail>,
    limit: usize,
) -> (Vec<FailureDetail>, usize) {
    if history.len() <= limit {
        return (history, 0);
    }
    let head = HISTORY_HEAD.min(limit / 2);
    let dropped = history.len() - limit;
    history.drain(head..head + dropped);
    (history, dropped)
}

/// `text` cut to at most `max_bytes` on a character boundary, marked when cut. The error
/// signature is computed from the whole message, so cutting never regroups an error.
pub fn clip(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let omitted_note = |kept: usize| format!(" [… {} bytes omitted]", text.len() - kept);
    // The note is at most 30 bytes; keep room for it.
    let mut end = max_bytes.saturating_sub(omitted_note(0).len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{}", &text[..end], omitted_note(end))
}

/// Why a record is being dead-lettered rather than returned for retry.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::Display, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum DeadLetterReason {
    /// The error class is permanent: retrying cannot help.
    Permanent,
    /// A retryable failure on the last delivery SQS would make (receive budget spent).
    ReceiveBudgetExhausted,
    /// The message reached the DLQ through the queue's redrive policy, with no recorded failure.
    ExceededMaxReceiveCount,
    /// A retryable failure too close to the end of the message's retention for another
    /// delivery to run before SQS deletes it.
    RetentionEnding,
}

impl DeadLetterReason {
    /// The reason as stored (its serde name).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Where this invocation runs and logs, so a failure can be traced to its logs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvocationInfo {
    /// `AWS_LAMBDA_FUNCTION_NAME`.
    pub function_name: Option<String>,
    /// The Lambda request id of the invocation.
    pub request_id: Option<String>,
    /// `AWS_LAMBDA_LOG_GROUP_NAME`.
    pub log_group: Option<String>,
    /// `AWS_LAMBDA_LOG_STREAM_NAME`.
    pub log_stream: Option<String>,
}

/// A record the batch engine decided to dead-letter, with everything known about it.
#[derive(Debug, Clone)]
pub struct DeadLetterCandidate {
    /// The record.
    pub item: WorkItem,
    /// The final error.
    pub error: ProcessError,
    /// Every failed attempt in this invocation, in order.
    pub failures: Vec<AttemptFailure>,
    /// Why it is dead-lettered now.
    pub reason: DeadLetterReason,
}

/// Message attribute set on a message a redrive sent back to its source queue (the run's
/// id): the worker, having finished it, marks the record resolved.
pub const REQUEUED_BY_ATTRIBUTE: &str = "requeued_by";

/// Lifecycle of a dead-lettered item.
///
/// Stored, queried and typed on the command line in one spelling (snake_case): serde, strum
/// and clap agree (a test checks it).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumCount,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[cfg_attr(
    feature = "clap",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
pub enum ItemStatus {
    /// Waiting for an operator or redrive.
    Dead,
    /// Leased by a redrive run.
    Redriving,
    /// Sent back to its source queue by a redrive; resolved once the worker finishes that
    /// message, set back to dead if the message returns to the DLQ.
    Requeued,
    /// Reprocessed successfully; kept for audit until it expires.
    Resolved,
}

impl ItemStatus {
    /// Every status, in lifecycle order (the declaration order).
    pub const ALL: [ItemStatus; <ItemStatus as strum::EnumCount>::COUNT] =
        crate::error::variant_array(<ItemStatus as strum::VariantArray>::VARIANTS);

    /// The status as stored.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a stored status name.
    pub fn parse(name: &str) -> Option<ItemStatus> {
        name.parse().ok()
    }
}

/// Where the item's payload lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "storage", rename_all = "snake_case")]
pub enum PayloadLocation {
    /// In the record itself.
    Inline {
        /// The original message body.
        body: String,
    },
    /// In S3, because it would make the record too large.
    S3 {
        /// Bucket name.
        bucket: String,
        /// Object key.
        key: String,
    },
}

/// The item's payload: where it is, how big, and its sha256 for verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemPayload {
    /// Where the payload is stored.
    #[serde(flatten)]
    pub location: PayloadLocation,
    /// Body size in bytes.
    pub size_bytes: u64,
    /// sha256 of the body, 64 hex digits.
    pub sha256: String,
}

/// One failed attempt in an item's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureDetail {
    /// Identity of the attempt (`message id:receive count:attempt`): recording the same attempt
    /// twice is detected by this key and does not add a second entry.
    pub attempt_id: String,
    /// Attempt number within its delivery (1-based).
    pub attempt_number: u32,
    /// `ApproximateReceiveCount` of the delivery.
    pub receive_count: u32,
    /// SQS message id of the delivery.
    pub message_id: String,
    /// When the attempt started.
    #[serde(with = "crate::time_format")]
    pub timestamp: DateTime<Utc>,
    /// Error class.
    pub error_type: ErrorClass,
    /// Error message.
    pub error_message: String,
    /// Source chain below the message.
    #[serde(default)]
    pub causes: Vec<String>,
    /// Service error code, if any.
    #[serde(default)]
    pub error_code: Option<String>,
    /// HTTP status, if any.
    #[serde(default)]
    pub http_status: Option<u16>,
    /// The step that failed.
    #[serde(default)]
    pub step: Option<String>,
    /// How long the attempt ran.
    pub duration_ms: u64,
    /// Function that made the attempt.
    #[serde(default)]
    pub function_name: Option<String>,
    /// Lambda request id of the invocation.
    #[serde(default)]
    pub request_id: Option<String>,
    /// CloudWatch log group the attempt logged to.
    #[serde(default)]
    pub log_group: Option<String>,
    /// CloudWatch log stream the attempt logged to.
    #[serde(default)]
    pub log_stream: Option<String>,
    /// The start of the callee's answer (e.g. a downstream's error body): for operators
    /// reading the record; never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_excerpt: Option<String>,
}

/// What a redrive needs to know about where the item came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceContext {
    /// ARN of the source queue.
    pub queue_arn: Option<String>,
    /// SQS message id of the latest delivery.
    pub message_id: String,
    /// FIFO message group.
    pub message_group_id: Option<String>,
    /// When the message was first sent.
    #[serde(default, with = "crate::time_format::option")]
    pub sent_timestamp: Option<DateTime<Utc>>,
    /// `ApproximateReceiveCount` of the latest delivery.
    pub receive_count: u32,
    /// The sender's message attributes, with their data types (binary values in base64),
    /// so that a requeue sends them back as they came. Capped at [`ATTRIBUTES_LIMIT`] bytes
    /// in the record (a message may carry up to 1 MiB of them, and a record holds 400 KB):
    /// beyond it the first ones that fit are kept and `attributes_omitted` counts the rest.
    pub message_attributes: BTreeMap<String, MessageAttribute>,
    /// Message attributes left out of `message_attributes` to keep the record small.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attributes_omitted: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Most bytes of message attributes (names and values) a record keeps.
pub const ATTRIBUTES_LIMIT: usize = 16 * 1024;

/// One message attribute as SQS carries it, typed by its value: a string, a number (kept
/// as the text sent), or binary data (base64). Each keeps its full data type (`String`,
/// `Number`, `Binary`, or one of those with a custom suffix such as `Number.int`), so a
/// requeue sends it back as it came. Stored as `{data_type, string_value | binary_value}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredAttribute", into = "TypedAttribute")]
pub enum MessageAttribute {
    /// A `String` attribute.
    String {
        /// Its data type.
        data_type: String,
        /// Its value.
        value: String,
    },
    /// A `Number` attribute: SQS numbers have up to 38 digits, so the text is kept as is.
    Number {
        /// Its data type.
        data_type: String,
        /// Its value, as sent.
        value: String,
    },
    /// A `Binary` attribute.
    Binary {
        /// Its data type.
        data_type: String,
        /// Its value, base64.
        base64: String,
    },
    /// An attribute whose value was not kept (records written before attribute values were
    /// typed kept only a binary value's type): it cannot be sent again.
    Unkept {
        /// Its data type.
        data_type: String,
    },
}

impl MessageAttribute {
    /// A `String` attribute.
    pub fn string(value: impl Into<String>) -> Self {
        MessageAttribute::String {
            data_type: "String".to_string(),
            value: value.into(),
        }
    }

    /// The attribute from SQS's three fields: binary when it has a binary value, a number
    /// when its type is `Number…`, a string otherwise; unkept when it has no value.
    pub fn from_parts(
        data_type: String,
        string_value: Option<String>,
        binary_base64: Option<String>,
    ) -> Self {
        match (binary_base64, string_value) {
            (Some(base64), _) => MessageAttribute::Binary { data_type, base64 },
            (None, Some(value)) if data_type.starts_with("Number") => {
                MessageAttribute::Number { data_type, value }
            }
            (None, Some(value)) => MessageAttribute::String { data_type, value },
            (None, None) => MessageAttribute::Unkept { data_type },
        }
    }

    /// Its SQS data type.
    pub fn data_type(&self) -> &str {
        match self {
            MessageAttribute::String { data_type, .. }
            | MessageAttribute::Number { data_type, .. }
            | MessageAttribute::Binary { data_type, .. }
            | MessageAttribute::Unkept { data_type } => data_type,
        }
    }

    /// The value of a string or number attribute.
    pub fn string_value(&self) -> Option<&str> {
        match self {
            MessageAttribute::String { value, .. } | MessageAttribute::Number { value, .. } => {
                Some(value)
            }
            _ => None,
        }
    }

    /// The value of a binary attribute, base64.
    pub fn binary_base64(&self) -> Option<&str> {
        match self {
            MessageAttribute::Binary { base64, .. } => Some(base64),
            _ => None,
        }
    }

    /// Whether the attribute has a value that can be sent again.
    pub fn is_restorable(&self) -> bool {
        !matches!(self, MessageAttribute::Unkept { .. })
    }

    fn size(&self) -> usize {
        self.data_type().len()
            + self.string_value().map_or(0, str::len)
            + self.binary_base64().map_or(0, str::len)
    }
}

/// The stored shape of an attribute (and of SQS's API): a data type and one value field.
#[derive(Serialize)]
struct TypedAttribute {
    data_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    string_value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    binary_value: Option<String>,
}

impl From<MessageAttribute> for TypedAttribute {
    fn from(attribute: MessageAttribute) -> Self {
        let (data_type, string_value, binary_value) = match attribute {
            MessageAttribute::String { data_type, value }
            | MessageAttribute::Number { data_type, value } => (data_type, Some(value), None),
            MessageAttribute::Binary { data_type, base64 } => (data_type, None, Some(base64)),
            MessageAttribute::Unkept { data_type } => (data_type, None, None),
        };
        TypedAttribute {
            data_type,
            string_value,
            binary_value,
        }
    }
}

/// How attributes were stored: typed, or (records written before types were kept) a plain
/// string, where `<Binary>` stood for a binary value that was not kept.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredAttribute {
    Typed {
        data_type: String,
        #[serde(default)]
        string_value: Option<String>,
        #[serde(default)]
        binary_value: Option<String>,
    },
    Legacy(String),
}

impl From<StoredAttribute> for MessageAttribute {
    fn from(stored: StoredAttribute) -> Self {
        match stored {
            StoredAttribute::Typed {
                data_type,
                string_value,
                binary_value,
            } => MessageAttribute::from_parts(data_type, string_value, binary_value),
            StoredAttribute::Legacy(marker) if marker.starts_with('<') && marker.ends_with('>') => {
                MessageAttribute::Unkept {
                    data_type: marker.trim_matches(['<', '>']).to_string(),
                }
            }
            StoredAttribute::Legacy(value) => MessageAttribute::string(value),
        }
    }
}

/// The record's copy of a delivery's attributes: typed, and capped at [`ATTRIBUTES_LIMIT`]
/// (in name order, the first that fit); returns them and how many were left out.
pub fn capped_attributes(
    attributes: &HashMap<String, aws_lambda_events::sqs::SqsMessageAttribute>,
) -> (BTreeMap<String, MessageAttribute>, u32) {
    let typed: BTreeMap<String, MessageAttribute> = attributes
        .iter()
        .map(|(name, a)| {
            (
                name.clone(),
                MessageAttribute::from_parts(
                    a.data_type.clone().unwrap_or_else(|| "String".to_string()),
                    a.string_value.clone(),
                    a.binary_value
                        .as_ref()
                        .map(|b| aws_smithy_types::base64::encode(&b.0)),
                ),
            )
        })
        .collect();
    let mut kept = BTreeMap::new();
    let mut used = 0;
    let mut omitted = 0u32;
    for (name, attribute) in typed {
        let size = name.len() + attribute.size();
        if used + size <= ATTRIBUTES_LIMIT {
            used += size;
            kept.insert(name, attribute);
        } else {
            omitted += 1;
        }
    }
    (kept, omitted)
}

/// The durable record of a dead-lettered item (docs/ARCHITECTURE.md §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetteredItem {
    /// The item's own id (partition key).
    pub item_id: String,
    /// The payload or a pointer to it.
    pub payload: ItemPayload,
    /// When the item was first tried: the first delivery's receive time, or the first
    /// recorded attempt if earlier.
    #[serde(with = "crate::time_format")]
    pub first_attempt: DateTime<Utc>,
    /// Latest failed attempt.
    #[serde(with = "crate::time_format")]
    pub last_attempt: DateTime<Utc>,
    /// Number of failed attempts in the history.
    pub failure_count: u32,
    /// Every failed attempt, oldest first.
    pub failure_history: Vec<FailureDetail>,
    /// Attempts counted in `failure_count` whose entries were dropped from
    /// `failure_history` to keep the record within DynamoDB's item size: the history keeps
    /// the first attempts and the latest ones ([`compact_history`]).
    #[serde(default)]
    pub history_omitted: u32,
    /// Signature of the latest error (groups similar failures).
    pub error_signature: String,
    /// Class of the latest error.
    pub error_class: ErrorClass,
    /// Message of the latest error.
    pub last_error: String,
    /// Why the item was dead-lettered.
    pub reason: DeadLetterReason,
    /// Whether a redrive may pick it without `force`.
    pub reprocess_eligible: bool,
    /// Whether a human must look before any redrive.
    pub manual_review_required: bool,
    /// Where the item came from.
    pub source: SourceContext,
    /// Lifecycle status.
    pub status: ItemStatus,
    /// Expiry for DynamoDB TTL, epoch seconds.
    pub expires_at: i64,
    /// When a redrive resolved it.
    #[serde(default, with = "crate::time_format::option")]
    pub resolved_at: Option<DateTime<Utc>>,
    /// While a redrive holds it: when that run's lease expires (epoch seconds); a run that
    /// dies leaves it, and the item is taken back once it has passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<i64>,
    /// While requeued: the id of the message sent back to the source queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeued_message_id: Option<String>,
    /// When a redrive last sent it back to its source queue: a record still `requeued`
    /// longer than any queue keeps a message is set back to dead by the next redrive run.
    #[serde(
        default,
        with = "crate::time_format::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub requeued_at: Option<DateTime<Utc>>,
    /// Source messages and payloads known processed (`msg:<id>`, `sha:<sha256>`, the latest
    /// [`PROCESSED_LIMIT`]): a DLQ message is deleted only when it is one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processed: Vec<String>,
}

/// Most entries a record's `processed` list keeps.
pub const PROCESSED_LIMIT: usize = 20;

/// The `processed` list of `record` once resolved: its current source message and payload
/// added (moved to the end if already there), the latest [`PROCESSED_LIMIT`] kept. A DLQ
/// message is deleted only when its record lists it so (docs/ARCHITECTURE.md §4).
pub fn processed_after(record: &DeadLetteredItem) -> Vec<String> {
    let mut processed = record.processed.clone();
    for key in [
        processed_key_for_message(&record.source.message_id),
        processed_key_for_payload(&record.payload.sha256),
    ] {
        processed.retain(|k| *k != key);
        processed.push(key);
    }
    let excess = processed.len().saturating_sub(PROCESSED_LIMIT);
    processed.split_off(excess)
}

/// The `processed` entry of a source message id.
pub fn processed_key_for_message(message_id: &str) -> String {
    format!("msg:{message_id}")
}

/// The `processed` entry of a payload digest.
pub fn processed_key_for_payload(sha256: &str) -> String {
    format!("sha:{sha256}")
}

impl FailureDetail {
    /// History entry for one failed attempt of `item` in `invocation`.
    pub fn from_attempt(
        item: &WorkItem,
        attempt: &AttemptFailure,
        invocation: &InvocationInfo,
    ) -> Self {
        FailureDetail {
            attempt_id: format!(
                "{}:{}:{}",
                item.message_id, item.receive_count, attempt.attempt
            ),
            attempt_number: attempt.attempt,
            receive_count: item.receive_count,
            message_id: item.message_id.clone(),
            timestamp: attempt.started_at,
            error_type: attempt.error.class,
            error_message: clip(&attempt.error.message, ERROR_MESSAGE_LIMIT),
            causes: attempt
                .error
                .causes
                .iter()
                .take(CAUSES_LIMIT)
                .map(|c| clip(c, CAUSE_LIMIT))
                .collect(),
            error_code: attempt.error.code.as_deref().map(str::to_string),
            http_status: attempt.error.status,
            step: attempt.error.step.clone(),
            duration_ms: u64::try_from(attempt.duration.as_millis()).unwrap_or(u64::MAX),
            function_name: invocation.function_name.clone(),
            request_id: invocation.request_id.clone(),
            log_group: invocation.log_group.clone(),
            log_stream: invocation.log_stream.clone(),
            response_excerpt: attempt
                .error
                .detail()
                .map(|d| clip(d, RESPONSE_EXCERPT_LIMIT)),
        }
    }
}

impl FailureDetail {
    /// The entry within the size limits ([`ERROR_MESSAGE_LIMIT`], [`CAUSES_LIMIT`] ×
    /// [`CAUSE_LIMIT`], [`RESPONSE_EXCERPT_LIMIT`]): every write of a history entry goes
    /// through this, whoever built the entry, so no entry can push a record past 400 KB.
    pub fn bounded(&self) -> FailureDetail {
        FailureDetail {
            error_message: clip(&self.error_message, ERROR_MESSAGE_LIMIT),
            causes: self
                .causes
                .iter()
                .take(CAUSES_LIMIT)
                .map(|c| clip(c, CAUSE_LIMIT))
                .collect(),
            response_excerpt: self
                .response_excerpt
                .as_deref()
                .map(|r| clip(r, RESPONSE_EXCERPT_LIMIT)),
            ..self.clone()
        }
    }
}

/// The condition under which a run that holds an item's lease may finish it (resolve it,
/// or mark it requeued): it still holds the lease, the item is still `redriving`, and the
/// record still holds the payload the run processed or sent. A worker that dead-letters a
/// new delivery of the item meanwhile sets it back to dead with that delivery's payload;
/// finishing it then would call a payload done that nobody delivered (found by the
/// simulation, seed 7291). The run gives the lease back instead, and the next run takes the
/// new payload.
pub const LEASED_WITH_PAYLOAD: &str =
    "lease owner is the run, status is redriving, payload sha256 is the one processed";

/// Whether [`LEASED_WITH_PAYLOAD`] holds for `record` (as stored, with its lease owner)
/// and a run `owner` that processed the payload `processed_sha256`: the condition the
/// DynamoDB adapter sends ([`crate::condition::conditions::leased_with_payload`]).
pub use crate::condition::leased_with_payload;

/// Whether a run may take the lease on an item of `status` whose lease (if any) expires at
/// `lease_expires_at` (epoch seconds): a dead item, or one whose redrive died holding an
/// expired lease (docs/ARCHITECTURE.md §3); the condition the DynamoDB adapter sends
/// ([`crate::condition::conditions::lease_is_free`]).
pub use crate::condition::lease_is_free;

/// `manual_review_required`: any permission failure, or validation failing more than once
/// (a second validation failure after a redrive means the fix did not work).
pub fn needs_manual_review(history: &[FailureDetail]) -> bool {
    let validations = history
        .iter()
        .filter(|f| f.error_type == ErrorClass::Validation)
        .count();
    history
        .iter()
        .any(|f| f.error_type == ErrorClass::Permission)
        || validations >= 2
}

impl DeadLetteredItem {
    /// The record for a candidate, with the payload inline (a sink may move it to S3).
    pub fn from_candidate(
        candidate: &DeadLetterCandidate,
        invocation: &InvocationInfo,
        now: DateTime<Utc>,
        retention: Duration,
    ) -> Self {
        let item = &candidate.item;
        let history: Vec<FailureDetail> = candidate
            .failures
            .iter()
            .map(|a| FailureDetail::from_attempt(item, a, invocation))
            .collect();
        // The first delivery's receive time comes with every later delivery, so the record
        // knows when the item was first tried even though earlier deliveries' attempts are
        // not written (they were returned for retry, not dead-lettered).
        let first_receive = item
            .attributes
            .get("ApproximateFirstReceiveTimestamp")
            .and_then(|v| v.parse::<i64>().ok())
            .and_then(DateTime::<Utc>::from_timestamp_millis);
        let first_attempt = history
            .first()
            .map_or(now, |f| f.timestamp)
            .min(first_receive.unwrap_or(DateTime::<Utc>::MAX_UTC));
        let last_attempt = history.last().map_or(now, |f| f.timestamp);
        let error = &candidate.error;
        let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        let (message_attributes, attributes_omitted) = capped_attributes(&item.message_attributes);
        DeadLetteredItem {
            item_id: item.item_id.clone(),
            payload: ItemPayload {
                location: PayloadLocation::Inline {
                    body: item.body.clone(),
                },
                size_bytes: item.body.len() as u64,
                sha256: crate::hex::sha256_hex(item.body.as_bytes()),
            },
            first_attempt,
            last_attempt,
            failure_count: u32::try_from(history.len()).unwrap_or(u32::MAX),
            manual_review_required: needs_manual_review(&history),
            failure_history: history,
            history_omitted: 0,
            error_signature: error_signature(error.class, &error.message),
            error_class: error.class,
            last_error: clip(&error.message, ERROR_MESSAGE_LIMIT),
            reason: candidate.reason,
            reprocess_eligible: error.class.is_reprocess_eligible(),
            source: SourceContext {
                queue_arn: item.event_source_arn.clone(),
                message_id: item.message_id.clone(),
                message_group_id: item.message_group_id.clone(),
                sent_timestamp: item.sent_timestamp,
                receive_count: item.receive_count,
                message_attributes,
                attributes_omitted,
            },
            status: ItemStatus::Dead,
            expires_at: now.checked_add_signed(retention).unwrap_or(now).timestamp(),
            resolved_at: None,
            lease_expires_at: None,
            requeued_message_id: None,
            requeued_at: None,
            processed: Vec::new(),
        }
    }
}

/// The error a sink returns for a record whose source message another delivery is
/// dead-lettering at this moment (SQS delivered it twice): that delivery sends the one DLQ
/// message; this one is returned for retry, neither acknowledged nor sent again.
pub fn dead_lettering_elsewhere() -> ProcessError {
    ProcessError::new(
        ErrorClass::Unknown,
        "another delivery of this message is dead-lettering it; returned for retry",
    )
    .with_step(DEAD_LETTERING_ELSEWHERE)
}

const DEAD_LETTERING_ELSEWHERE: &str = "dead-letter-elsewhere";

/// Whether a sink's error is [`dead_lettering_elsewhere`].
pub fn is_dead_lettering_elsewhere(error: &ProcessError) -> bool {
    error.step.as_deref() == Some(DEAD_LETTERING_ELSEWHERE)
}

/// Persists dead-lettered records. Returns one result per candidate, in input order; a
/// candidate is acknowledged only when its result is `Ok`.
pub trait DeadLetterSink: Send + Sync {
    /// Persists the candidates (payload, record, DLQ message, in that order).
    fn dead_letter(
        &self,
        candidates: &[DeadLetterCandidate],
        invocation: &InvocationInfo,
    ) -> impl Future<Output = Vec<Result<(), ProcessError>>> + Send;

    /// Marks the record `item_id` resolved after the worker finished `message_id`, a message
    /// the redrive run `requeued_by` sent back to the source queue (its
    /// [`REQUEUED_BY_ATTRIBUTE`]) with a payload of digest `payload_sha256`: the record
    /// waits for that message, or that run still holds it (the worker can finish the message
    /// before the run has marked the record requeued). An error returns the message for
    /// retry.
    fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
        requeued_by: &str,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send {
        let _ = (item_id, message_id, payload_sha256, requeued_by);
        async { Ok(()) }
    }

    /// Marks the record `item_id` resolved after the worker finished `message_id`, a DLQ
    /// message moved back to the source queue from outside this project (the console's
    /// "Start DLQ redrive"): it holds the delivery `dead_lettered` (its
    /// `source_message_id` attribute) and the payload `payload_sha256` (the digest of what
    /// it carried). Only a dead record that holds that payload is resolved; anything else
    /// is left as it is. An error returns the message for retry.
    fn finish_moved_back(
        &self,
        item_id: &str,
        dead_lettered: &str,
        message_id: &str,
        payload_sha256: &str,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send {
        let _ = (item_id, dead_lettered, message_id, payload_sha256);
        async { Ok(()) }
    }
}

/// A sink that refuses everything: dead-letter candidates are returned to the queue (and
/// reach the DLQ through its redrive policy). The safe choice when no store is configured.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoDeadLetterStore;

impl DeadLetterSink for NoDeadLetterStore {
    async fn dead_letter(
        &self,
        candidates: &[DeadLetterCandidate],
        _invocation: &InvocationInfo,
    ) -> Vec<Result<(), ProcessError>> {
        candidates
            .iter()
            .map(|_| {
                Err(ProcessError::new(
                    ErrorClass::Unknown,
                    "no dead-letter store is configured; the record is returned to the queue",
                )
                .with_step("dead-letter"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored names: a change of spelling would orphan every existing record.
    #[test]
    fn message_attributes_are_typed_by_their_value_and_stored_as_sqs_shapes_them() {
        let cases = [
            (
                serde_json::json!({"data_type": "Number.int", "string_value": "42"}),
                MessageAttribute::Number {
                    data_type: "Number.int".into(),
                    value: "42".into(),
                },
            ),
            (
                serde_json::json!({"data_type": "String", "string_value": "acme"}),
                MessageAttribute::string("acme"),
            ),
            (
                serde_json::json!({"data_type": "Binary.gz", "binary_value": "AAEC"}),
                MessageAttribute::Binary {
                    data_type: "Binary.gz".into(),
                    base64: "AAEC".into(),
                },
            ),
        ];
        for (stored, typed) in cases {
            let read: MessageAttribute = serde_json::from_value(stored.clone()).unwrap();
            assert_eq!(read, typed);
            assert!(read.is_restorable());
            assert_eq!(
                serde_json::to_value(&read).unwrap(),
                stored,
                "stored shape unchanged"
            );
        }
        // Records written before types were kept: a plain string, or a binary's marker.
        let legacy: MessageAttribute =
            serde_json::from_value(serde_json::json!("<Binary>")).unwrap();
        assert_eq!(
            legacy,
            MessageAttribute::Unkept {
                data_type: "Binary".into()
            }
        );
        assert!(!legacy.is_restorable());
        assert_eq!(
            serde_json::to_value(&legacy).unwrap(),
            serde_json::json!({"data_type": "Binary"})
        );
        let legacy: MessageAttribute = serde_json::from_value(serde_json::json!("acme")).unwrap();
        assert_eq!(legacy, MessageAttribute::string("acme"));
    }

    #[test]
    fn status_and_reason_names_agree_across_serde_strum_and_clap() {
        let names: Vec<&str> = ItemStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["dead", "redriving", "requeued", "resolved"]);
        for status in ItemStatus::ALL {
            let name = status.as_str();
            assert_eq!(serde_json::to_value(status).unwrap(), name);
            assert_eq!(status.to_string(), name);
            assert_eq!(ItemStatus::parse(name), Some(status));
            #[cfg(feature = "clap")]
            assert_eq!(
                clap::ValueEnum::to_possible_value(&status)
                    .unwrap()
                    .get_name(),
                name
            );
        }
        assert_eq!(ItemStatus::parse("Dead"), None);
        assert_eq!(ItemStatus::parse("any"), None);
        for reason in [
            DeadLetterReason::Permanent,
            DeadLetterReason::ReceiveBudgetExhausted,
            DeadLetterReason::ExceededMaxReceiveCount,
        ] {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
            assert_eq!(reason.to_string(), reason.as_str());
        }
        assert_eq!(
            DeadLetterReason::ReceiveBudgetExhausted.as_str(),
            "receive_budget_exhausted"
        );
    }

    #[test]
    fn compact_history_keeps_the_first_and_the_latest_attempts() {
        let c = candidate(ErrorClass::Throttled, 60, DeadLetterReason::Permanent);
        let history = DeadLetteredItem::from_candidate(
            &c,
            &InvocationInfo::default(),
            Utc::now(),
            Duration::from_secs(60),
        )
        .failure_history;
        let numbers = |h: &[FailureDetail]| h.iter().map(|f| f.attempt_number).collect::<Vec<_>>();

        let (kept, dropped) = compact_history(history.clone(), 60);
        assert_eq!(
            (kept.len(), dropped),
            (60, 0),
            "within the limit: unchanged"
        );

        let (kept, dropped) = compact_history(history.clone(), HISTORY_LIMIT);
        assert_eq!(dropped, 60 - HISTORY_LIMIT);
        let expected: Vec<u32> = (1..=10).chain(21..=60).collect();
        assert_eq!(numbers(&kept), expected);

        let (kept, dropped) = compact_history(history, 4);
        assert_eq!((numbers(&kept), dropped), (vec![1, 2, 59, 60], 56));
    }

    #[test]
    fn clip_keeps_short_text_and_cuts_long_text_on_a_character_boundary() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("exactly10!", 10), "exactly10!");
        for max in [40, 41, 42, 43, 100] {
            let long = "é".repeat(200); // two bytes each
            let cut = clip(&long, max);
            assert!(cut.len() <= max, "{max}: {} bytes", cut.len());
            assert!(cut.starts_with('é'));
            let omitted = long.len() - cut.split(" [").next().unwrap().len();
            assert!(
                cut.ends_with(&format!(" [… {omitted} bytes omitted]")),
                "{cut}"
            );
        }
    }
    use crate::item::ItemParser;

    fn candidate(
        class: ErrorClass,
        attempts: u32,
        reason: DeadLetterReason,
    ) -> DeadLetterCandidate {
        let msg = serde_json::from_value(serde_json::json!({
            "messageId": "m-1",
            "body": "{\"id\":\"i-1\"}",
            "attributes": {"ApproximateReceiveCount": "3", "SentTimestamp": "1700000000000", "MessageGroupId": "g"},
            "messageAttributes": {"tenant": {"stringValue": "acme", "dataType": "String"}},
            "eventSourceARN": "arn:aws:sqs:us-east-1:1:q"
        }))
        .unwrap();
        let item = ItemParser::default().parse("m-1".into(), msg).unwrap();
        let start = DateTime::<Utc>::from_timestamp(1_700_000_100, 0).unwrap();
        let failures = (1..=attempts)
            .map(|n| AttemptFailure {
                attempt: n,
                started_at: start + chrono::Duration::seconds(i64::from(n)),
                duration: Duration::from_millis(25),
                error: ProcessError::new(class, format!("timeout after {n}s")).with_step("deliver"),
            })
            .collect();
        DeadLetterCandidate {
            item,
            error: ProcessError::new(class, format!("timeout after {attempts}s")),
            failures,
            reason,
        }
    }

    #[test]
    fn record_from_candidate() {
        let invocation = InvocationInfo {
            function_name: Some("worker".into()),
            request_id: Some("req-1".into()),
            log_group: Some("/aws/lambda/worker".into()),
            log_stream: Some("2026/11/21/[$LATEST]abc".into()),
        };
        let now = DateTime::<Utc>::from_timestamp(1_700_000_200, 0).unwrap();
        let c = candidate(
            ErrorClass::Timeout,
            3,
            DeadLetterReason::ReceiveBudgetExhausted,
        );
        let record =
            DeadLetteredItem::from_candidate(&c, &invocation, now, Duration::from_secs(86_400));
        assert_eq!(record.item_id, "m-1");
        assert_eq!(record.failure_count, 3);
        assert_eq!(record.failure_history.len(), 3);
        assert_eq!(record.first_attempt.timestamp(), 1_700_000_101);
        assert_eq!(record.last_attempt.timestamp(), 1_700_000_103);
        assert_eq!(record.failure_history[1].attempt_id, "m-1:3:2");
        assert_eq!(
            record.failure_history[0].request_id.as_deref(),
            Some("req-1")
        );
        assert_eq!(
            record.failure_history[0].log_group.as_deref(),
            Some("/aws/lambda/worker")
        );
        assert_eq!(record.failure_history[0].duration_ms, 25);
        assert_eq!(record.failure_history[0].step.as_deref(), Some("deliver"));
        assert_eq!(record.expires_at, 1_700_000_200 + 86_400);
        assert_eq!(record.status, ItemStatus::Dead);
        assert!(record.reprocess_eligible);
        assert!(!record.manual_review_required);
        assert_eq!(record.source.message_group_id.as_deref(), Some("g"));
        assert_eq!(record.source.receive_count, 3);
        assert_eq!(
            record.source.message_attributes["tenant"].string_value(),
            Some("acme")
        );
        assert_eq!(record.payload.size_bytes, 12);
        assert_eq!(
            record.payload.sha256,
            crate::hex::sha256_hex(b"{\"id\":\"i-1\"}")
        );
        // Signatures group "timeout after 3s" with "timeout after 29s".
        assert_eq!(
            record.error_signature,
            crate::signature::error_signature(ErrorClass::Timeout, "timeout after 29s")
        );
        // The record serialises with the payload flattened and the class by name.
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["payload"]["storage"], "inline");
        assert_eq!(json["error_class"], "timeout");
        let back: DeadLetteredItem = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn a_response_excerpt_is_kept_clipped_and_apart_from_the_message() {
        let mut plain = candidate(ErrorClass::Validation, 1, DeadLetterReason::Permanent);
        let mut with_excerpt = plain.clone();
        let excerpt = format!("amount must be positive: {}", "x".repeat(2_000));
        with_excerpt.failures[0].error = with_excerpt.failures[0]
            .error
            .clone()
            .with_detail(excerpt.clone());
        with_excerpt.error = with_excerpt.error.clone().with_detail(excerpt.clone());
        plain.failures[0].error.detail = None;
        let at = Utc::now();
        let info = InvocationInfo::default();
        let day = Duration::from_secs(86_400);
        let a = DeadLetteredItem::from_candidate(&plain, &info, at, day);
        let b = DeadLetteredItem::from_candidate(&with_excerpt, &info, at, day);
        let kept = b.failure_history[0].response_excerpt.as_deref().unwrap();
        assert!(kept.starts_with("amount must be positive: xxx"), "{kept}");
        assert!(kept.len() <= RESPONSE_EXCERPT_LIMIT, "{}", kept.len());
        assert!(kept.ends_with("bytes omitted]"), "{kept}");
        assert_eq!(a.failure_history[0].response_excerpt, None);
        // Neither the message, the latest error nor the signature depend on it.
        assert_eq!(a.error_signature, b.error_signature);
        assert_eq!(a.last_error, b.last_error);
        assert_eq!(
            a.failure_history[0].error_message,
            b.failure_history[0].error_message
        );
        assert!(!b.last_error.contains("amount"));
        assert!(!with_excerpt.error.to_string().contains("amount"));
        // Serialised only when present; older records without it still read.
        let json = serde_json::to_value(&a.failure_history[0]).unwrap();
        assert!(json.get("response_excerpt").is_none(), "{json}");
        let json = serde_json::to_value(&b.failure_history[0]).unwrap();
        assert_eq!(json["response_excerpt"], kept);
        let back: FailureDetail = serde_json::from_value(json).unwrap();
        assert_eq!(back, b.failure_history[0]);
    }

    #[test]
    fn eligibility_and_review_rules() {
        let now = Utc::now();
        let day = Duration::from_secs(86_400);
        let info = InvocationInfo::default();
        let permission = DeadLetteredItem::from_candidate(
            &candidate(ErrorClass::Permission, 1, DeadLetterReason::Permanent),
            &info,
            now,
            day,
        );
        assert!(!permission.reprocess_eligible);
        assert!(permission.manual_review_required);
        let validation_once = DeadLetteredItem::from_candidate(
            &candidate(ErrorClass::Validation, 1, DeadLetterReason::Permanent),
            &info,
            now,
            day,
        );
        assert!(!validation_once.reprocess_eligible);
        assert!(!validation_once.manual_review_required);
        assert!(needs_manual_review(
            &[
                validation_once.failure_history.clone(),
                validation_once.failure_history.clone()
            ]
            .concat()
        ));
        for class in [
            ErrorClass::Unknown,
            ErrorClass::Throttled,
            ErrorClass::ServerError,
            ErrorClass::Connection,
        ] {
            let r = DeadLetteredItem::from_candidate(
                &candidate(class, 1, DeadLetterReason::ReceiveBudgetExhausted),
                &info,
                now,
                day,
            );
            assert!(r.reprocess_eligible, "{class}");
        }
        let not_found = DeadLetteredItem::from_candidate(
            &candidate(ErrorClass::NotFound, 1, DeadLetterReason::Permanent),
            &info,
            now,
            day,
        );
        assert!(!not_found.reprocess_eligible);
    }
}
