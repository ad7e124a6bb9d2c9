//! The DLQ message rule (docs/ARCHITECTURE.md §4): the fate [`decide`] gives a DLQ message,
//! known by its [`MessageView`], by what its record says ([`Standing`]; both are what the
//! ports pass, [`crate::ports`]); adopting a message no record holds, and which messages a
//! purge takes.

use super::*;

/// What to do with one DLQ message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MessageFate {
    /// Its content is known processed (or moved back to the source queue): delete it.
    Delete,
    /// Keep it (the item is dead, or being redriven).
    Keep,
    /// No record holds it: create one.
    Adopt,
    /// The record is resolved or requeued but did not process this message: set it back to
    /// dead with this message's payload.
    Reopen(&'static str),
}

/// Returns the rule of the module's table, for one message and its record (`None`: no record).
pub fn decide(message: &MessageView, record: Option<&Standing>) -> MessageFate {
    let Some(record) = record.filter(|r| r.status.is_some()) else {
        return MessageFate::Adopt;
    };
    let processed = message.keys().iter().any(|k| record.processed.contains(k));
    match record.status {
        Some(ItemStatus::Resolved)
            if processed || crate::mutants::is_on(crate::mutants::Mutant::SweepDeletesByItemId) =>
        {
            MessageFate::Delete
        }
        Some(ItemStatus::Resolved) => MessageFate::Reopen(
            "a DLQ message holds a payload this item's resolution did not process",
        ),
        Some(ItemStatus::Requeued) => {
            // A message a requeue sent that reached the DLQ was moved there by the source
            // queue's redrive policy: had the worker finished it, the record would be
            // resolved; had the worker failed it, it would have sent its own DLQ message.
            let is_requeued_message = message.requeued_by.is_some()
                || record.requeued_message_id.as_deref() == Some(message.message_id.as_str())
                || record.requeued_message_id.as_deref()
                    == Some(message.source_message_id.as_str());
            if is_requeued_message {
                MessageFate::Reopen(
                    "the requeued message came back to the DLQ (the source queue's redrive policy moved it unprocessed)",
                )
            } else if processed || record.holds_current_payload(message) {
                MessageFate::Delete
            } else {
                MessageFate::Reopen("a DLQ message holds a payload that was not requeued")
            }
        }
        _ => MessageFate::Keep,
    }
}

/// Returns the keys of `message` its record did not list processed when the sweep judged it: an
/// adoption is written only while the record lists none of them, so that it never
/// overwrites a record that processed this message *since*. A key listed before (the same
/// payload, delivered once, then failed again and requeued) does not guard: it would refuse
/// the reopening at every pass, leaving the record `requeued` and its message in the DLQ
/// (found by the simulation).
pub(super) fn unprocessed_keys(message: &MessageView, standing: Option<&Standing>) -> Vec<String> {
    message
        .keys()
        .into_iter()
        .filter(|k| standing.is_none_or(|s| !s.processed.contains(k)))
        .collect()
}

/// Tells whether a DLQ message tracked by `tracked` may be adopted now that its payload, read
/// through an Extended-Client pointer, names `named`. A message without our `item_id`
/// attribute (`ours`) is tracked by the item its payload names; when that payload could
/// not be read as the message was received, it was tracked by its message id instead, and
/// adopted so it would make a second record beside the one the worker keeps under the
/// payload's id. The adoption then fails for the moment, and the next sweep tracks the
/// message by the payload's id (found by the simulation, seed 3293).
pub fn tracked_as_its_payload_names(
    ours: bool,
    tracked: &str,
    named: Option<&str>,
) -> Result<(), ProcessError> {
    match named {
        Some(named) if !ours && named != tracked => Err(ProcessError::new(
            ErrorClass::ServerError,
            format!(
                "the DLQ message was tracked by {tracked:?} while its payload names item {named:?} (the payload could not be read as it was received); the next sweep tracks it by its payload's item"
            ),
        )
        .with_step("dlq-adopt")),
        _ => Ok(()),
    }
}

/// Returns the record of a DLQ message adopted (or reopening its record) `now`: `item` carries the
/// message's payload, `error` says why (the adoption's reason, or why a pointer could not
/// be followed), `message_id` is the DLQ message's own id and `source_message_id` the one
/// its record is keyed to.
pub fn adopted_record(
    item: WorkItem,
    error: ProcessError,
    message_id: &str,
    source_message_id: String,
    adoption: &Adoption,
    retention: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> DeadLetteredItem {
    let candidate = DeadLetterCandidate {
        failures: vec![AttemptFailure {
            attempt: 1,
            // When the sweep found it: the attempt happened in the source queue at a time
            // nothing records, and a record dated before it was written would let a clear
            // whose snapshot it postdates take it as older (docs/ARCHITECTURE.md §4).
            started_at: if crate::mutants::is_on(crate::mutants::Mutant::AdoptionDatedBySentTime) {
                item.sent_timestamp.unwrap_or(now)
            } else {
                now
            },
            duration: Duration::ZERO,
            error: error.clone(),
        }],
        item,
        error,
        reason: DeadLetterReason::ExceededMaxReceiveCount,
    };
    let mut record =
        DeadLetteredItem::from_candidate(&candidate, &InvocationInfo::default(), now, retention);
    if let Some(entry) = record.failure_history.first_mut() {
        // One entry per DLQ message however often it is swept. A reopening is an event of
        // its own (the record was resolved or requeued since): under the adoption's id the
        // write would be skipped as already recorded, and the record stay resolved while
        // this message waits in the DLQ for ever.
        entry.attempt_id = if adoption.reopen {
            format!("dlq:{message_id}:reopened:{}", now.timestamp_micros())
        } else {
            format!("dlq:{message_id}")
        };
    }
    record.source.message_id = source_message_id;
    record
}

/// Tells whether a purge deletes `message` of an item it selected: only when the record, as
/// selected, holds this very delivery (its source message, with the record's payload when
/// the message's is known) or lists it processed. Not by
/// the payload's digest alone: the same payload dead-lettered again after the selection is
/// a new failure, never selected.
pub fn purge_takes(message: &MessageView, selected: &Standing) -> bool {
    (selected.source_message_id.as_deref() == Some(message.source_message_id.as_str())
        && (message.digests().next().is_none()
            || message
                .digests()
                .any(|sha| selected.payload_sha256.as_deref() == Some(sha))))
        || message
            .keys()
            .iter()
            .any(|k| selected.processed.contains(k))
}
