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

mod attributes;
mod claim;
mod record;

pub use attributes::{capped_attributes, MessageAttribute, ATTRIBUTES_LIMIT};
pub use claim::DlqClaim;
pub use record::{
    compact_history, needs_manual_review, processed_after, processed_key_for_message,
    processed_key_for_payload, recorded_message_id, DeadLetteredItem, FailureDetail, ItemPayload,
    ItemStatus, PayloadLocation, SourceContext, Triage, LEASED_WITH_PAYLOAD, PROCESSED_LIMIT,
};

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
/// Longest service error code kept per attempt (AWS's are under 48 bytes).
pub const ERROR_CODE_LIMIT: usize = 48;
/// Longest failed step kept per attempt (the worker's are one word).
pub const STEP_LIMIT: usize = 32;
/// Longest function name and request id kept per attempt (Lambda's are at most 64 and 36
/// bytes).
pub const INVOCATION_FIELD_LIMIT: usize = 64;
/// Longest log stream kept per attempt (Lambda's are about 55 bytes).
pub const LOG_STREAM_LIMIT: usize = 96;
/// Longest log group kept per attempt (`/aws/lambda/` and a 64-byte name are 76 bytes).
pub const LOG_GROUP_LIMIT: usize = 128;
/// Most entries a record's `failure_history` keeps once compacted (an entry is at most
/// [`crate::recording::HISTORY_ENTRY_MAX`] bytes with the limits above). Beyond it [`compact_history`]
/// keeps the first and the latest attempts; the write that appends a delivery's attempts
/// holds up to [`crate::retry::MAX_ATTEMPTS_PER_INVOCATION`] more until it is compacted.
pub const HISTORY_LIMIT: usize = 50;
/// How many of the first attempts a compacted history keeps (how the trouble started);
/// the rest of [`HISTORY_LIMIT`] goes to the latest ones.
pub const HISTORY_HEAD: usize = 10;

/// Why a record is being dead-lettered rather than returned for retry.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::Display, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
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
    /// Returns the reason as stored (its serde name).
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

/// Returns the error a sink returns for a record whose source message another delivery is
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

/// Tells whether a sink's error says another delivery is dead-lettering the record (SQS delivered
/// its message twice): the record goes back for retry, neither acknowledged nor sent again.
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
mod tests;
