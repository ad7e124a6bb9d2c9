//! The dead-letter record (docs/ARCHITECTURE.md §3): its status, payload, failure history and
//! bounds (compaction, clipping), the source message it came from, what it lists processed,
//! and the condition a run that holds its lease finishes it under.

use super::*;

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

/// Cuts `text` to at most `max_bytes` on a character boundary, marking it when cut. The
/// error signature is computed from the whole message, so cutting never regroups an error.
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

/// `text` [`clip`]ped to `max_bytes`, when there is one.
fn clipped(text: &Option<String>, max_bytes: usize) -> Option<String> {
    text.as_deref().map(|t| clip(t, max_bytes))
}

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
// Exhaustive on purpose: a status is part of the stored schema, and every crate that
// reads records must decide what a new one means before it compiles.
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

    /// Returns the status as stored.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a stored status name.
    pub fn parse(name: &str) -> Option<ItemStatus> {
        name.parse().ok()
    }

    /// Tells whether an item of this status is in flight: a run holds it (`redriving`), or its
    /// message waits in the source queue (`requeued`). A removal never takes such an item.
    /// Its payload may be what a live message points to.
    pub fn is_in_flight(self) -> bool {
        matches!(self, ItemStatus::Redriving | ItemStatus::Requeued)
    }
}

/// Where the item's payload lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "storage", rename_all = "snake_case")]
// Exhaustive on purpose: every reader of a payload must know where a new location is
// read from before it compiles.
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
    /// The producer's trace, as an X-Ray trace header: from the latest delivery's
    /// `traceparent` message attribute or its `AWSTraceHeader`
    /// ([`crate::trace::TraceContext::of`]). A redrive continues it when it reprocesses or
    /// requeues the item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_header: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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

/// Returns the `processed` list of `record` once resolved: its current source message and payload
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

/// Returns the `processed` entry of a source message id.
pub fn processed_key_for_message(message_id: &str) -> String {
    format!("msg:{}", recorded_message_id(message_id))
}

/// Returns a source message id as records, claims and DLQ attributes keep it: the id SQS gave
/// (at most 100 characters of its own set), or for a hand-built event's id SQS could not
/// carry or too long for the record's bounds, `sha256:` and its digest
/// ([`crate::item::kept_id`] within 128 bytes).
pub fn recorded_message_id(message_id: &str) -> String {
    crate::item::kept_id(message_id.to_string(), 128)
}

/// Returns the `processed` entry of a payload digest.
pub fn processed_key_for_payload(sha256: &str) -> String {
    format!("sha:{sha256}")
}

impl FailureDetail {
    /// Creates the history entry for one failed attempt of `item` in `invocation`.
    pub fn from_attempt(
        item: &WorkItem,
        attempt: &AttemptFailure,
        invocation: &InvocationInfo,
    ) -> Self {
        let message_id = recorded_message_id(&item.message_id);
        FailureDetail {
            attempt_id: format!("{}:{}:{}", message_id, item.receive_count, attempt.attempt),
            attempt_number: attempt.attempt,
            receive_count: item.receive_count,
            message_id,
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
    /// Returns the entry within the size limits (every text field: [`ERROR_MESSAGE_LIMIT`],
    /// [`CAUSES_LIMIT`] × [`CAUSE_LIMIT`], [`RESPONSE_EXCERPT_LIMIT`], the code, step and
    /// invocation fields): every write of a history entry goes through this, whoever built
    /// the entry, so no entry passes [`crate::recording::HISTORY_ENTRY_MAX`].
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
            error_code: clipped(&self.error_code, super::ERROR_CODE_LIMIT),
            step: clipped(&self.step, super::STEP_LIMIT),
            function_name: clipped(&self.function_name, super::INVOCATION_FIELD_LIMIT),
            request_id: clipped(&self.request_id, super::INVOCATION_FIELD_LIMIT),
            log_group: clipped(&self.log_group, super::LOG_GROUP_LIMIT),
            log_stream: clipped(&self.log_stream, super::LOG_STREAM_LIMIT),
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

/// Tells whether `manual_review_required` holds: any permission failure, or validation failing
/// more than once (a second validation failure after a redrive means the fix did not work).
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

/// Where a dead item stands, and so what happens to it next: every dead item is in exactly
/// one of these (`dlq stats` counts them, `dlq inspect` names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Triage {
    /// A redrive run retries it (`dlq redrive`, the scheduled redrive): its failure was
    /// transient (or of a class the configuration retries) and no human needs to look first.
    Eligible,
    /// A human must look before anything retries it: a permission failure, or a validation
    /// failure that came back after a redrive (the fix did not work).
    ManualReview,
    /// Not retried by a run, because retrying unchanged fails the same way (a validation or
    /// not-found failure seen once): fix the data, the downstream or the handler, then
    /// redrive it by name with `--force`, or purge it.
    NeedsFix,
}

impl Triage {
    /// Returns the name `dlq stats` and `dlq inspect` print.
    pub fn as_str(self) -> &'static str {
        match self {
            Triage::Eligible => "eligible",
            Triage::ManualReview => "manual review",
            Triage::NeedsFix => "needs a fix",
        }
    }

    /// Returns what an operator does next, in one line.
    pub fn next_step(self) -> &'static str {
        match self {
            Triage::Eligible => "a redrive run retries it",
            Triage::ManualReview => {
                "a human must look first; after the fix, redrive it with --item-id and --force"
            }
            Triage::NeedsFix => {
                "a run does not retry it: fix the data or the handler, then redrive it with --item-id and --force, or purge it"
            }
        }
    }
}

impl DeadLetteredItem {
    /// Tells where this item stands (meaningful for a dead item; see [`Triage`]). Manual review
    /// comes first: an item that needs a human is never taken by a run, eligible or not.
    pub fn triage(&self) -> Triage {
        if self.manual_review_required {
            Triage::ManualReview
        } else if self.reprocess_eligible {
            Triage::Eligible
        } else {
            Triage::NeedsFix
        }
    }

    /// Creates the record for a candidate, with the payload inline (a sink may move it to S3).
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
                message_id: recorded_message_id(&item.message_id),
                message_group_id: item.message_group_id.clone(),
                sent_timestamp: item.sent_timestamp,
                receive_count: item.receive_count,
                message_attributes,
                attributes_omitted,
                trace_header: item.trace().map(|t| t.xray_header()),
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
