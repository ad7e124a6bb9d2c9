//! The DLQ message rule (docs/ARCHITECTURE.md §4): what a DLQ message is known by
//! ([`MessageView`]), what its record says ([`Standing`]), and the fate [`decide`] gives it;
//! adopting a message no record holds, and which messages a purge takes.

use super::*;

/// What identifies a DLQ message's content: the delivery it came from and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageView {
    /// The DLQ message's own id.
    pub message_id: String,
    /// The source message it holds: our `source_message_id` attribute, or (a message the
    /// queue's redrive policy moved, which keeps its id) its own id.
    pub source_message_id: String,
    /// sha256 of its payload, when known without fetching it: our `payload_sha256`
    /// attribute, or the body's own digest when the body is not a pointer.
    pub payload_sha256: Option<String>,
    /// For an Extended-Client pointer into the store's own bucket: the digest of the
    /// pointer's own text, which a record holds when it kept the pointer as its payload
    /// (its object could not be read). Content too: our objects are never rewritten.
    pub pointer_sha256: Option<String>,
    /// Set on messages a requeue sent back to the source queue (the run's id).
    pub requeued_by: Option<String>,
}

impl MessageView {
    /// The view of DLQ message `message_id` with `body`, whose string message attributes
    /// `attribute` gives (docs/ARCHITECTURE.md §4):
    ///
    /// - the source message is our `source_message_id` attribute where the message carries
    ///   our `item_id` too (our DLQ messages, requeues and rotation copies carry both),
    ///   else its own id (a message the queue's redrive policy moved keeps its id);
    /// - the payload digest is the body's own; for an Extended-Client pointer into
    ///   `own_bucket` (the dead-letter store's payloads, content-addressed by
    ///   [`crate::recording::payload_key`]) the digest its key ends with, when our
    ///   `payload_sha256` attribute states the same, and the digest of the pointer's own
    ///   text; any other pointer's payload is unknown.
    pub fn of<'a>(
        message_id: &str,
        body: &str,
        attribute: impl Fn(&str) -> Option<&'a str>,
        own_bucket: &str,
    ) -> MessageView {
        let pointer = S3Pointer::parse(body);
        let ours = attribute(crate::message::ITEM_ID_ATTRIBUTE).is_some();
        MessageView {
            message_id: message_id.to_string(),
            // A producer's message keeps its attributes into the DLQ: one naming a processed
            // delivery, holding a pointer whose payload is unknown, would be deleted as that
            // delivery.
            source_message_id: attribute(SOURCE_MESSAGE_ID_ATTRIBUTE)
                .filter(|_| ours)
                .unwrap_or(message_id)
                .to_string(),
            // A digest is believed only where it cannot lie: a body that is its payload is
            // its own digest, whatever an attribute states, and a pointer's payload is known
            // only when it points into our own bucket at the key that digest names, where
            // we wrote that payload and nothing else.
            payload_sha256: match &pointer {
                None => Some(crate::hex::sha256_hex(body.as_bytes())),
                Some(pointer) => attribute(PAYLOAD_SHA256_ATTRIBUTE)
                    .filter(|sha| {
                        pointer.bucket == own_bucket
                            && pointer
                                .key
                                .strip_suffix(sha)
                                .is_some_and(|k| k.ends_with('/'))
                    })
                    .map(str::to_string),
            },
            pointer_sha256: pointer
                .filter(|p| p.bucket == own_bucket && crate::recording::is_payload_key(&p.key))
                .map(|_| crate::hex::sha256_hex(body.as_bytes())),
            requeued_by: attribute(REQUEUED_BY_ATTRIBUTE).map(str::to_string),
        }
    }

    /// The keys under which a record lists this message as processed: its content's
    /// digests when known, else its source message. Never both: a message whose content
    /// is known is judged by its content alone, and one holding a payload no record
    /// processed is never deleted because an attribute names a delivery that was.
    pub fn keys(&self) -> Vec<String> {
        let digests: Vec<String> = self.digests().map(processed_key_for_payload).collect();
        if digests.is_empty() {
            vec![processed_key_for_message(&self.source_message_id)]
        } else {
            digests
        }
    }

    /// The digests its content is known by (none: unknown).
    pub fn digests(&self) -> impl Iterator<Item = &str> {
        self.payload_sha256
            .iter()
            .chain(self.pointer_sha256.iter())
            .map(String::as_str)
    }
}

/// What the sweep needs to know of a record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standing {
    /// Lifecycle status.
    pub status: Option<ItemStatus>,
    /// While redriving: when the run's lease expires (epoch seconds).
    pub lease_expires_at: Option<i64>,
    /// The source message id of the record's current payload.
    pub source_message_id: Option<String>,
    /// sha256 of the record's current payload.
    pub payload_sha256: Option<String>,
    /// Messages and payloads known processed ([`processed_key_for_message`], ...).
    pub processed: Vec<String>,
    /// While requeued: the id of the message sent back to the source queue.
    pub requeued_message_id: Option<String>,
    /// The source queue the record names (kept when a reopening message does not say).
    pub source_queue_arn: Option<String>,
}

impl Standing {
    /// What the sweep judges of `record`.
    pub fn of(record: &DeadLetteredItem) -> Standing {
        Standing {
            status: Some(record.status),
            lease_expires_at: record.lease_expires_at,
            source_message_id: Some(record.source.message_id.clone()),
            payload_sha256: Some(record.payload.sha256.clone()),
            processed: record.processed.clone(),
            requeued_message_id: record.requeued_message_id.clone(),
            source_queue_arn: record.source.queue_arn.clone(),
        }
    }

    /// Whether a live run is redriving the item (not one that died holding its lease).
    pub fn leased_at(&self, now: i64) -> bool {
        self.status == Some(ItemStatus::Redriving) && self.lease_expires_at.is_some_and(|e| e > now)
    }

    /// Whether `message` holds the record's current payload.
    /// By its content when the message's is known ([`MessageView::keys`]), else by its
    /// source message.
    pub fn holds_current_payload(&self, message: &MessageView) -> bool {
        if message.digests().next().is_none() {
            return self.source_message_id.as_deref() == Some(message.source_message_id.as_str());
        }
        message
            .digests()
            .any(|sha| self.payload_sha256.as_deref() == Some(sha))
    }
}

/// What to do with one DLQ message.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// The rule of the module's table, for one message and its record (`None`: no record).
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

/// The keys of `message` its record did not list processed when the sweep judged it: an
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

/// Whether a DLQ message tracked by `tracked` may be adopted now that its payload, read
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

/// Why a DLQ message gets a record, or sets its record back to dead.
#[derive(Debug, Clone)]
pub struct Adoption {
    /// The failure the record states.
    pub reason: &'static str,
    /// The record exists (resolved or requeued) and is set back to dead with this
    /// message's payload.
    pub reopen: bool,
    /// The source queue, for a message that does not name its own.
    pub known_queue_arn: Option<String>,
    /// The status the sweep judged the record by (`None`: there was no record): the write
    /// is conditional on it, so an adoption never overwrites a record that changed since.
    pub expected_status: Option<ItemStatus>,
    /// The message's `processed` keys ([`MessageView::keys`]): a reopening is written only
    /// while the record lists none of them (it did not process this message since).
    pub message_keys: Vec<String>,
}

impl Adoption {
    /// What an adoption does when the message's payload is an Extended-Client pointer whose
    /// object could not be fetched. A transient failure fails the adoption (`Err`): the
    /// message stays in the DLQ and the next sweep tries again. Were the record to take the
    /// pointer as its payload, a redrive would deliver the pointer's text, resolve the
    /// record, and the sweep delete the message whose payload was never delivered (found by
    /// the simulation, seed 1153). A permanent failure (the object gone, access denied) is
    /// the record's failure (`Ok`): the pointer stays its payload, and its class (not found,
    /// permission) keeps every redrive but a forced one away from it.
    pub fn unfetched_payload(fetch: ProcessError) -> Result<ProcessError, ProcessError> {
        let fetch = fetch.with_step("dlq-adopt");
        if fetch.class.is_reprocess_eligible() {
            Err(fetch)
        } else {
            Ok(fetch)
        }
    }
}

/// The record of a DLQ message adopted (or reopening its record) `now`: `item` carries the
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
            started_at: item.sent_timestamp.unwrap_or(now),
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

/// Whether a purge deletes `message` of an item it selected: only when the record, as
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
