//! The DLQ sweep: reconciles the DLQ with the records. Every DLQ message is received (and
//! held invisible while a redrive runs) and judged against its item's record by [`decide`]
//! (docs/ARCHITECTURE.md §4):
//!
//! - **no record** (SQS's own redrive policy moved it after a crash or timeout): it gets
//!   one ("exceeded maxReceiveCount without a recorded failure"), so nothing in the DLQ is
//!   invisible to the tools;
//! - the record is **resolved** and lists this very message (its source message id or its
//!   payload's sha256) as processed: the message is deleted;
//! - the record is **requeued** and the message holds the payload that was sent back to the
//!   source queue: deleted (moved, as SQS's own message move task does);
//! - the record is resolved or requeued but this message holds **something it did not
//!   process** (another body under the same item id; a requeued message the queue's
//!   redrive policy moved back): the record is **reopened** with this message's payload;
//! - otherwise (dead, or being redriven) the message is kept.
//!
//! A message is never deleted because of its item id alone. One message that cannot be read,
//! looked up or recorded is an error of that message only: it stays in the DLQ and the
//! sweep goes on. The rest are returned to view when the caller is done, by each item's
//! final state ([`settle_held`]): the run that resolves an item is not always the run whose
//! sweep holds its DLQ messages.
//!
//! The loops ([`sweep_dlq`], [`settle_held`]) run over [`DlqMessages`], the few primitive
//! operations they need of the DLQ and the records: SQS and DynamoDB in production
//! (`sqs_keeper_aws::store::DeadLetterStore`), memory in a simulation. No I/O of their own.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::dead_letter::REQUEUED_BY_ATTRIBUTE;
use crate::dead_letter::{
    processed_key_for_message, processed_key_for_payload, DeadLetterCandidate, DeadLetterReason,
    DeadLetteredItem, InvocationInfo, ItemStatus,
};
use crate::error::{ErrorClass, ProcessError};
use crate::item::{ItemParser, WorkItem};
use crate::message::{PAYLOAD_SHA256_ATTRIBUTE, SOURCE_MESSAGE_ID_ATTRIBUTE};
use crate::pointer::S3Pointer;
use crate::retry::AttemptFailure;

/// What a sweep pass found and did.
#[derive(Debug, Default)]
pub struct Sweep {
    /// DLQ messages judged.
    pub seen: usize,
    /// Records created (or reopened) for messages no record held.
    pub adopted: usize,
    /// Messages of resolved, requeued or purged items deleted.
    pub deleted: usize,
    /// Messages of a FIFO DLQ moved behind their group ([`DlqMessages::rotate`]).
    pub rotated: usize,
    /// Whether the pass saw the DLQ empty of visible messages (else it stopped at its
    /// `until`).
    pub complete: bool,
    /// The messages still held, by item id (ordered: a run settles them in the same
    /// order every time, which keeps the simulation's runs reproducible).
    pub held: BTreeMap<String, Vec<HeldMessage>>,
    /// Messages that could not be handled, by item id, with why: left in the DLQ.
    pub errors: Vec<(String, String)>,
}

/// What to do with messages during a sweep.
#[derive(Debug, Clone, Default)]
pub struct SweepOptions {
    /// Create (or reopen) records for messages no record holds.
    pub adopt: bool,
    /// Purging: the records selected, by item id, as they were selected. A message of one
    /// of these items is deleted only when that record holds it
    /// ([`purge_takes`]); the others of the item are kept.
    pub purge: HashMap<String, Standing>,
    /// How the item id is read from a message without our `item_id` attribute.
    pub parser: ItemParser,
    /// Stop receiving at this instant (messages not received stay visible).
    pub until: Option<Instant>,
    /// Keep the messages the pass holds invisible until at least this instant (when the
    /// caller settles them).
    pub hold_until: Option<Instant>,
}

/// How often [`settle_held`] looks again at items another run is redriving.
const SETTLE_POLL: Duration = Duration::from_millis(250);

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
fn unprocessed_keys(message: &MessageView, standing: Option<&Standing>) -> Vec<String> {
    message
        .keys()
        .into_iter()
        .filter(|k| standing.is_none_or(|s| !s.processed.contains(k)))
        .collect()
}

/// A DLQ message just received (and held invisible), with what identifies it.
#[derive(Debug, Clone)]
pub struct ReceivedMessage<M> {
    /// Its receipt handle.
    pub receipt: String,
    /// The item id it is tracked by.
    pub item_id: String,
    /// Its identity.
    pub view: MessageView,
    /// The message itself (a record may have to be adopted from it).
    pub message: M,
    /// The sweep pass whose FIFO rotation sent it, if one did ([`DlqMessages::rotate`]).
    pub marker: Option<String>,
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

/// The record of a DLQ message adopted (or reopening its record): `item` carries the
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
) -> DeadLetteredItem {
    let now = crate::clock::now();
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

/// A DLQ message held invisible by a sweep until its run settles it: its receipt and what
/// identifies it, not its body (a sweep of a large DLQ keeps thousands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldMessage {
    /// Its latest receipt handle.
    pub receipt: String,
    /// Its identity.
    pub view: MessageView,
}

/// What the sweep needs of the DLQ and the records: receive, look up, adopt, delete and
/// hold. Each is one operation (or a few SDK calls) and decides nothing.
pub trait DlqMessages: Send + Sync {
    /// The raw message a record may have to be adopted from.
    type Message: Clone + Send + Sync;

    /// Up to 10 visible DLQ messages, each held invisible for `hold`, with the item id each
    /// is tracked by (via `parser`); empty only when none is visible in the whole queue
    /// (a long poll, not a sample of its servers).
    fn receive(
        &self,
        hold: Duration,
        parser: &ItemParser,
    ) -> impl Future<Output = Result<Vec<ReceivedMessage<Self::Message>>, ProcessError>> + Send;

    /// What the sweep needs of each existing record among `ids` (strongly consistent).
    fn standings(
        &self,
        ids: &[String],
    ) -> impl Future<Output = Result<HashMap<String, Standing>, ProcessError>> + Send;

    /// Creates (or reopens) the record of `message` under `item_id` (the id the message is
    /// tracked by), with the message's payload (an SQS Extended Client pointer resolved):
    /// the record [`adopted_record`] makes, written as any dead-letter record is, on the
    /// condition that the record is still as judged (none; or, reopening, the status the
    /// sweep saw). `Ok(None)`: it changed meanwhile, and nothing was written.
    fn adopt(
        &self,
        message: &Self::Message,
        item_id: &str,
        parser: &ItemParser,
        adoption: &Adoption,
    ) -> impl Future<Output = Result<Option<DeadLetteredItem>, ProcessError>> + Send;

    /// Deletes messages by receipt; how many were deleted.
    fn delete(
        &self,
        receipts: &[String],
    ) -> impl Future<Output = Result<usize, ProcessError>> + Send;

    /// Holds messages invisible for `hold` from now (`Duration::ZERO`: visible at once).
    fn hold(
        &self,
        receipts: &[String],
        hold: Duration,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Whether the DLQ is a FIFO queue, where a message held blocks every later message of
    /// its group.
    fn is_fifo(&self) -> bool {
        false
    }

    /// Moves a message of a FIFO DLQ behind the rest of its group: sends a copy marked with
    /// `pass` (same body, attributes and group; its source message id kept, so its record
    /// still knows it; stamped with `item_id`, the item it is tracked by, when it carries
    /// no `item_id` attribute, so that the copy is tracked as the original was: a body that
    /// names no item would otherwise be tracked by the copy's new message id, found by the
    /// simulation, seed 169), then deletes the original by `receipt`. `Ok(false)`: no copy could
    /// be made (the original stays where it is). A crash between the two leaves both, with
    /// the same content: each is judged as the other.
    fn rotate(
        &self,
        message: &Self::Message,
        receipt: &str,
        pass: &str,
        item_id: &str,
    ) -> impl Future<Output = Result<bool, ProcessError>> + Send {
        let _ = (message, receipt, pass, item_id);
        async { Ok(false) }
    }
}

/// The shortest hold of a sweep without an end: a message received at the start comes
/// back after two minutes, and the hold grows with the pass ([`hold_for`]).
const MIN_HOLD: Duration = Duration::from_secs(120);

/// Added to a hold that must last until an instant: the settling that follows it.
const HOLD_MARGIN: Duration = Duration::from_secs(30);

/// SQS's longest visibility timeout.
const MAX_HOLD: Duration = Duration::from_secs(43_200);

/// How long a message received `elapsed` into a pass is held: until the instants the
/// caller names (plus a margin), and at least twice as long as the pass has run so far
/// (plus `MIN_HOLD`). The second bound is what ends a pass over a queue larger than one
/// hold: a message given back while the pass goes on is received again, held twice as
/// long, and so comes back at most a logarithmic number of times before the queue is seen
/// empty (a fixed hold of 120 s took over a million receives for 50,000 messages).
pub fn hold_for(elapsed: Duration, until: &[Option<Instant>], now: Instant) -> Duration {
    let growing = elapsed.saturating_mul(2).saturating_add(MIN_HOLD);
    let named = until
        .iter()
        .flatten()
        .map(|t| t.saturating_duration_since(now) + HOLD_MARGIN)
        .max()
        .unwrap_or_default();
    growing.max(named).min(MAX_HOLD)
}

/// The marker of one sweep pass, carried by the copies its FIFO rotations send.
fn pass_marker() -> String {
    format!("{:016x}", fastrand::u64(..))
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

/// One pass over the DLQ: receives every visible message (until `options.until`), judges
/// each once by [`decide`] (or, purging, [`purge_takes`]), deletes, adopts and reopens at
/// once, and returns the rest held (receipts and identities only) for the caller to settle
/// with [`settle_held`]. On an error it gives back what it holds before returning it. On a
/// FIFO DLQ every message it keeps is moved behind its group ([`DlqMessages::rotate`]), so
/// that no held group head hides the messages after it.
pub async fn sweep_dlq<D: DlqMessages>(
    dlq: &D,
    options: &SweepOptions,
) -> Result<Sweep, ProcessError> {
    let mut pass = Pass {
        sweep: Sweep::default(),
        receipts: HashMap::new(),
        views: HashMap::new(),
        judged: std::collections::HashSet::new(),
        marker: pass_marker(),
    };
    match pass.run(dlq, options).await {
        Ok(()) => Ok(pass.into_sweep()),
        Err(error) => {
            let receipts: Vec<String> = pass.receipts.into_values().collect();
            if let Err(release) = dlq.hold(&receipts, Duration::ZERO).await {
                tracing::warn!(error = %release, "could not give back the DLQ messages a failed sweep held; they come back when their hold ends");
            }
            Err(error)
        }
    }
}

/// The state of one sweep pass.
struct Pass {
    sweep: Sweep,
    /// Message id → latest receipt of every message held.
    receipts: HashMap<String, String>,
    /// Message id → (item id, identity) of every message held.
    views: HashMap<String, (String, MessageView)>,
    /// Messages already judged this pass (received again after their hold ended).
    judged: std::collections::HashSet<String>,
    /// This pass's marker ([`DlqMessages::rotate`]).
    marker: String,
}

impl Pass {
    async fn run<D: DlqMessages>(
        &mut self,
        dlq: &D,
        options: &SweepOptions,
    ) -> Result<(), ProcessError> {
        let started = Instant::now();
        loop {
            let now = Instant::now();
            if options.until.is_some_and(|until| now >= until) {
                return Ok(());
            }
            let hold = hold_for(now - started, &[options.until, options.hold_until], now);
            let messages = dlq.receive(hold, &options.parser).await?;
            if messages.is_empty() {
                // (A FIFO group behind a message that could not be moved was not seen; what
                // blocks it is given back at the end, for the next pass to move.)
                self.sweep.complete = true;
                return Ok(());
            }
            let fresh: Vec<String> = messages
                .iter()
                .filter(|m| !self.already_judged(m))
                .map(|m| m.item_id.clone())
                .collect();
            let standings = if fresh.is_empty() {
                Ok(HashMap::new())
            } else {
                dlq.standings(&fresh).await
            };
            let mut to_delete = Vec::new();
            let mut to_rotate = Vec::new();
            let mut out_of_time = false;
            for received in messages {
                let id = received.view.message_id.clone();
                self.receipts.insert(id.clone(), received.receipt.clone());
                self.views.insert(
                    id.clone(),
                    (received.item_id.clone(), received.view.clone()),
                );
                if self.already_judged(&received) {
                    self.judged.insert(id);
                    continue;
                }
                // One judgement may take long (an adoption reads a payload from S3): the
                // pass ends at `until` between two, and what it did not judge stays held
                // with the rest, for the next pass (a page of ten unreadable pointers ran
                // a sweep 100 s past its end).
                out_of_time = out_of_time || options.until.is_some_and(|u| Instant::now() >= u);
                if out_of_time {
                    continue;
                }
                self.judged.insert(id.clone());
                self.sweep.seen += 1;
                match self.judge(dlq, options, &standings, &received).await? {
                    Verdict::Delete => to_delete.push((id, received.receipt)),
                    Verdict::Keep => to_rotate.push(received),
                }
            }
            let receipts: Vec<String> = to_delete.iter().map(|(_, r)| r.clone()).collect();
            // Forgotten only once deleted: a failed delete leaves them held, and the error
            // path gives them back.
            self.sweep.deleted += dlq.delete(&receipts).await?;
            for (id, _) in &to_delete {
                self.forget(id);
            }
            if dlq.is_fifo() {
                for received in to_rotate {
                    self.rotate(dlq, &received).await;
                }
            }
            if out_of_time {
                return Ok(());
            }
        }
    }

    /// Whether `received` was judged earlier in this pass: received again after its hold
    /// ended, or a copy this pass's rotation sent.
    fn already_judged<M>(&self, received: &ReceivedMessage<M>) -> bool {
        self.judged.contains(&received.view.message_id)
            || received.marker.as_deref() == Some(self.marker.as_str())
    }

    fn forget(&mut self, message_id: &str) {
        self.receipts.remove(message_id);
        self.views.remove(message_id);
    }

    async fn judge<D: DlqMessages>(
        &mut self,
        dlq: &D,
        options: &SweepOptions,
        standings: &Result<HashMap<String, Standing>, ProcessError>,
        received: &ReceivedMessage<D::Message>,
    ) -> Result<Verdict, ProcessError> {
        let item_id = &received.item_id;
        if let Some(selected) = options.purge.get(item_id) {
            // Only while the record is still as selected (read just now): a record that
            // failed again since keeps every message, and is not deleted either.
            let unchanged = match standings {
                Ok(found) => found.get(item_id).is_none_or(|now| {
                    now.status == selected.status
                        && now.source_message_id == selected.source_message_id
                }),
                Err(_) => false,
            };
            if crate::mutants::is_on(crate::mutants::Mutant::PurgeByItemId) {
                return Ok(Verdict::Delete);
            }
            return Ok(if unchanged && purge_takes(&received.view, selected) {
                Verdict::Delete
            } else {
                Verdict::Keep
            });
        }
        let standing = match standings {
            Ok(found) => found.get(item_id),
            Err(error) => {
                self.sweep.errors.push((item_id.clone(), error.to_string()));
                return Ok(Verdict::Keep);
            }
        };
        Ok(match decide(&received.view, standing) {
            MessageFate::Delete => Verdict::Delete,
            MessageFate::Keep => Verdict::Keep,
            MessageFate::Adopt | MessageFate::Reopen(_) if !options.adopt => Verdict::Keep,
            fate @ (MessageFate::Adopt | MessageFate::Reopen(_)) => {
                let adoption = Adoption {
                    reason: match fate {
                        MessageFate::Reopen(reason) => reason,
                        _ => "exceeded maxReceiveCount without a recorded failure (moved by the queue's redrive policy)",
                    },
                    reopen: matches!(fate, MessageFate::Reopen(_)),
                    known_queue_arn: standing.and_then(|s| s.source_queue_arn.clone()),
                    expected_status: standing.and_then(|s| s.status),
                    message_keys: unprocessed_keys(&received.view, standing),
                };
                match dlq
                    .adopt(&received.message, item_id, &options.parser, &adoption)
                    .await
                {
                    Ok(Some(_)) => self.sweep.adopted += 1,
                    Ok(None) => {
                        tracing::info!(item_id = %item_id, "the record changed while its DLQ message was judged; the next sweep judges it again");
                    }
                    Err(error)
                        if crate::mutants::is_on(
                            crate::mutants::Mutant::PoisonMessageAbortsSweep,
                        ) =>
                    {
                        return Err(error);
                    }
                    Err(error) => {
                        tracing::warn!(item_id = %item_id, error = %error, "DLQ message could not be recorded; left in the DLQ");
                        self.sweep.errors.push((item_id.clone(), error.to_string()));
                    }
                }
                Verdict::Keep
            }
        })
    }

    /// Moves a kept message of a FIFO DLQ behind its group; a failure leaves it held where
    /// it is (the pass goes on; that group's later messages wait for the next pass).
    async fn rotate<D: DlqMessages>(&mut self, dlq: &D, received: &ReceivedMessage<D::Message>) {
        match dlq
            .rotate(
                &received.message,
                &received.receipt,
                &self.marker,
                &received.item_id,
            )
            .await
        {
            Ok(true) => {
                self.forget(&received.view.message_id);
                self.sweep.rotated += 1;
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(item_id = %received.item_id, error = %error, "could not move a FIFO DLQ message behind its group; its group's later messages wait for the next sweep");
            }
        }
    }

    fn into_sweep(self) -> Sweep {
        let mut sweep = self.sweep;
        for (message_id, receipt) in self.receipts {
            if let Some((item_id, view)) = self.views.get(&message_id) {
                sweep
                    .held
                    .entry(item_id.clone())
                    .or_default()
                    .push(HeldMessage {
                        receipt,
                        view: view.clone(),
                    });
            }
        }
        sweep
    }
}

/// What a pass does with one message it judged.
enum Verdict {
    Delete,
    Keep,
}

/// What [`settle_held`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Messages deleted.
    pub deleted: usize,
    /// Messages given back at once because their record is to be reopened with their
    /// payload: a sweep that receives them (with their bodies) reopens it.
    pub to_reopen: usize,
}

/// Deletes the held messages whose records now say so ([`decide`]) and holds the rest for
/// `then` more (`Duration::ZERO`: visible again at once; after a pass that could not see
/// the whole DLQ, longer, so that the next runs reach the messages it did not see). Items
/// another run is redriving at this moment (a live lease; not one left by a run that died)
/// are looked at again every 250 ms, for at most `wait`, so that their messages are
/// deleted if that run resolves them. A message whose record should be reopened is given
/// back at once, for a sweep (which receives its body) to reopen.
pub async fn settle_held<D: DlqMessages>(
    dlq: &D,
    held: BTreeMap<String, Vec<HeldMessage>>,
    wait: Duration,
    then: Duration,
) -> Result<Settled, ProcessError> {
    let ids: Vec<String> = held.keys().cloned().collect();
    let give_up = Instant::now() + wait;
    // A lookup that fails leaves those messages kept, never deleted.
    let mut standings = if ids.is_empty() {
        HashMap::new()
    } else {
        dlq.standings(&ids).await.unwrap_or_default()
    };
    loop {
        let now = crate::clock::now().timestamp();
        let busy: Vec<String> = ids
            .iter()
            .filter(|id| standings.get(*id).is_some_and(|s| s.leased_at(now)))
            .cloned()
            .collect();
        if busy.is_empty() || Instant::now() + SETTLE_POLL > give_up {
            break;
        }
        tokio::time::sleep(SETTLE_POLL).await;
        if let Ok(fresh) = dlq.standings(&busy).await {
            for id in &busy {
                standings.remove(id);
            }
            standings.extend(fresh);
        }
    }
    let mut delete = Vec::new();
    let mut reopen = Vec::new();
    let mut keep = Vec::new();
    for (item_id, messages) in held {
        for held in messages {
            match standings.get(&item_id).map(|s| decide(&held.view, Some(s))) {
                Some(MessageFate::Delete) => delete.push(held.receipt),
                Some(MessageFate::Reopen(_)) => reopen.push(held.receipt),
                _ => keep.push(held.receipt),
            }
        }
    }
    let deleted = dlq.delete(&delete).await;
    // Given back (or held on) even when the deletes failed.
    let given_back = dlq.hold(&reopen, Duration::ZERO).await;
    let kept = dlq.hold(&keep, then).await;
    let deleted = deleted?;
    given_back?;
    kept?;
    Ok(Settled {
        deleted,
        to_reopen: reopen.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(message_id: &str, source: &str, sha: &str) -> MessageView {
        MessageView {
            message_id: message_id.into(),
            source_message_id: source.into(),
            payload_sha256: Some(sha.into()),
            pointer_sha256: None,
            requeued_by: None,
        }
    }

    fn record(status: ItemStatus, source: &str, sha: &str, processed: &[&str]) -> Standing {
        Standing {
            status: Some(status),
            source_message_id: Some(source.into()),
            payload_sha256: Some(sha.into()),
            processed: processed.iter().map(|s| s.to_string()).collect(),
            ..Standing::default()
        }
    }

    #[test]
    fn a_message_is_deleted_only_when_its_record_processed_that_very_message() {
        let m = view("d1", "s1", "x1");
        assert_eq!(decide(&m, None), MessageFate::Adopt);
        // Listed by its source message only: its content is known and not listed.
        let resolved_by_id = record(ItemStatus::Resolved, "s1", "x1", &["msg:s1"]);
        assert!(matches!(
            decide(&m, Some(&resolved_by_id)),
            MessageFate::Reopen(_)
        ));
        // A message whose content is unknown (a pointer into another bucket) is judged by
        // its source message.
        let unknown = MessageView {
            payload_sha256: None,
            ..m.clone()
        };
        assert_eq!(decide(&unknown, Some(&resolved_by_id)), MessageFate::Delete);
        let resolved_by_sha = record(ItemStatus::Resolved, "s9", "x1", &["sha:x1"]);
        assert_eq!(decide(&m, Some(&resolved_by_sha)), MessageFate::Delete);
        // Resolved by its item id alone is not enough: another body was processed.
        let other_body = record(ItemStatus::Resolved, "s2", "x2", &["msg:s2", "sha:x2"]);
        assert!(matches!(
            decide(&m, Some(&other_body)),
            MessageFate::Reopen(_)
        ));
        for status in [ItemStatus::Dead, ItemStatus::Redriving] {
            let r = record(status, "s1", "x1", &["msg:s1"]);
            assert_eq!(decide(&m, Some(&r)), MessageFate::Keep, "{status:?}");
        }
    }

    /// Found by the simulation (seed 89): a message adopted once, whose record was then
    /// resolved with another payload, must reopen it. Under the adoption's attempt id the
    /// write was skipped as already recorded, and the record stayed resolved for ever.
    #[test]
    fn a_reopening_is_a_new_entry_while_an_adoption_is_the_same_one_every_sweep() {
        let item = crate::testing::dead_record("a", crate::ErrorClass::Unknown, 1);
        let work_item = |body: &str| WorkItem {
            message_id: "d1".into(),
            item_id: "a".into(),
            body: body.into(),
            receive_count: 1,
            sent_timestamp: None,
            message_group_id: None,
            event_source_arn: None,
            attributes: Default::default(),
            message_attributes: HashMap::new(),
            envelope: None,
        };
        let record = |reopen: bool| {
            adopted_record(
                work_item("{}"),
                ProcessError::new(crate::ErrorClass::Unknown, "moved"),
                "d1",
                "s1".into(),
                &Adoption {
                    reason: "moved",
                    reopen,
                    known_queue_arn: item.source.queue_arn.clone(),
                    expected_status: None,
                    message_keys: Vec::new(),
                },
                Duration::from_secs(60),
            )
        };
        let id = |r: DeadLetteredItem| r.failure_history[0].attempt_id.clone();
        assert_eq!(id(record(false)), "dlq:d1");
        assert_eq!(id(record(false)), id(record(false)));
        let first = id(record(true));
        assert!(first.starts_with("dlq:d1:reopened:"), "{first}");
        assert_ne!(first, "dlq:d1");
        let adopted = record(false);
        assert_eq!(adopted.source.message_id, "s1");
        assert_eq!(adopted.status, ItemStatus::Dead);
    }

    /// Found by the simulation (seed 1153): a payload that could not be fetched for the
    /// moment must not become the record's payload (its pointer text would be redriven and
    /// the message deleted); only one that is gone or denied is recorded, unredrivable.
    #[test]
    fn a_message_tracked_by_its_id_while_its_payload_names_an_item_is_not_adopted_yet() {
        // Tracked by its message id because its payload could not be read on receipt: a
        // second record beside the worker's would follow, so not now.
        assert!(tracked_as_its_payload_names(false, "m-1", Some("order-1")).is_err());
        let refused = tracked_as_its_payload_names(false, "m-1", Some("order-1")).unwrap_err();
        assert!(refused.class.is_reprocess_eligible(), "{refused}");
        // Tracked by the item its payload names, by our attribute, or a payload naming none.
        assert!(tracked_as_its_payload_names(false, "order-1", Some("order-1")).is_ok());
        assert!(tracked_as_its_payload_names(true, "record-9", Some("order-1")).is_ok());
        assert!(tracked_as_its_payload_names(false, "m-1", None).is_ok());
    }

    #[test]
    fn only_a_payload_gone_for_good_is_recorded_as_its_pointer() {
        use crate::ErrorClass::*;
        for class in [Throttled, ServerError, Timeout, Unknown] {
            let fetch = ProcessError::new(class, "s3 said no");
            assert!(Adoption::unfetched_payload(fetch).is_err(), "{class}");
        }
        for class in [NotFound, Permission] {
            let fetch = ProcessError::new(class, "s3 said no");
            let recorded = Adoption::unfetched_payload(fetch).unwrap();
            assert_eq!(recorded.class, class);
            assert!(!recorded.class.is_reprocess_eligible());
            assert_eq!(recorded.step.as_deref(), Some("dlq-adopt"));
        }
    }

    #[test]
    fn a_requeued_record_lets_its_moved_copy_go_and_reopens_on_its_message_coming_back() {
        let mut requeued = record(ItemStatus::Requeued, "s1", "x1", &[]);
        requeued.requeued_message_id = Some("r1".into());
        // The original DLQ copy of what went back to the source queue.
        assert_eq!(
            decide(&view("d1", "s1", "x1"), Some(&requeued)),
            MessageFate::Delete
        );
        // The requeued message itself, moved back by the redrive policy (same id).
        assert!(matches!(
            decide(&view("r1", "r1", "x1"), Some(&requeued)),
            MessageFate::Reopen(_)
        ));
        // Or any message carrying the requeue stamp.
        let stamped = MessageView {
            requeued_by: Some("redrive-1".into()),
            ..view("r2", "r2", "x1")
        };
        assert!(matches!(
            decide(&stamped, Some(&requeued)),
            MessageFate::Reopen(_)
        ));
        // A different body under the same id was never requeued.
        assert!(matches!(
            decide(&view("d2", "s2", "x2"), Some(&requeued)),
            MessageFate::Reopen(_)
        ));
    }

    /// The worker's own DLQ message for a failed delivery of the requeued message names
    /// that message as its source and carries no requeue stamp: the requeue did not
    /// finish, and the record is reopened. Known only by the requeued payload it holds, it
    /// was deleted as the copy the requeue moved, and the record stayed requeued until the
    /// requeue outlived every queue.
    #[test]
    fn a_dlq_message_whose_source_is_the_requeued_message_reopens_its_record() {
        let mut requeued = record(ItemStatus::Requeued, "s1", "x1", &[]);
        requeued.requeued_message_id = Some("r1".into());
        assert!(matches!(
            decide(&view("d2", "r1", "x1"), Some(&requeued)),
            MessageFate::Reopen(_)
        ));
    }

    use std::sync::Mutex;

    /// One message of [`MemoryDlq`].
    #[derive(Debug, Clone)]
    struct Held {
        id: String,
        item: String,
        group: Option<String>,
        visible: bool,
        receipt: String,
        marker: Option<String>,
        source: String,
    }

    /// A DLQ in memory: standard, or FIFO (a group with a message in flight gives nothing
    /// more, and messages come in order), with a table of standings.
    #[derive(Default)]
    struct MemoryDlq {
        fifo: bool,
        messages: Mutex<Vec<Held>>,
        standings: Mutex<HashMap<String, Standing>>,
        adopted: Mutex<Vec<(String, String)>>,
        receipts: Mutex<usize>,
        receives: Mutex<usize>,
        fail_receive_after: Mutex<Option<usize>>,
        /// How long each adoption takes (a payload read from S3).
        adoption_takes: Duration,
    }

    impl MemoryDlq {
        fn fifo() -> Self {
            MemoryDlq {
                fifo: true,
                ..MemoryDlq::default()
            }
        }

        fn add(&self, message_id: &str, item_id: &str) {
            self.add_in(message_id, item_id, None);
        }

        fn add_in(&self, message_id: &str, item_id: &str, group: Option<&str>) {
            self.messages.lock().unwrap().push(Held {
                id: message_id.into(),
                item: item_id.into(),
                group: group.map(str::to_string),
                visible: true,
                receipt: String::new(),
                marker: None,
                source: format!("s-{message_id}"),
            });
        }

        fn set(&self, item_id: &str, standing: Standing) {
            self.standings
                .lock()
                .unwrap()
                .insert(item_id.into(), standing);
        }

        fn visible(&self) -> Vec<String> {
            let messages = self.messages.lock().unwrap();
            messages
                .iter()
                .filter(|m| m.visible)
                .map(|m| m.id.clone())
                .collect()
        }

        fn left(&self) -> usize {
            self.messages.lock().unwrap().len()
        }
    }

    impl DlqMessages for MemoryDlq {
        type Message = String;

        async fn receive(
            &self,
            _hold: Duration,
            _parser: &ItemParser,
        ) -> Result<Vec<ReceivedMessage<String>>, ProcessError> {
            let mut receives = self.receives.lock().unwrap();
            *receives += 1;
            if self
                .fail_receive_after
                .lock()
                .unwrap()
                .is_some_and(|n| *receives > n)
            {
                return Err(ProcessError::new(crate::ErrorClass::ServerError, "503"));
            }
            let mut messages = self.messages.lock().unwrap();
            let mut receipts = self.receipts.lock().unwrap();
            let blocked: std::collections::HashSet<Option<String>> = if self.fifo {
                messages
                    .iter()
                    .filter(|m| !m.visible)
                    .map(|m| m.group.clone())
                    .collect()
            } else {
                Default::default()
            };
            let mut received = Vec::new();
            for message in messages
                .iter_mut()
                .filter(|m| m.visible && !blocked.contains(&m.group))
                .take(10)
            {
                *receipts += 1;
                message.visible = false;
                message.receipt = format!("r{receipts}");
                received.push(ReceivedMessage {
                    receipt: message.receipt.clone(),
                    item_id: message.item.clone(),
                    view: view(&message.id, &message.source, &format!("p-{}", message.id)),
                    marker: message.marker.clone(),
                    message: message.id.clone(),
                });
            }
            Ok(received)
        }

        async fn standings(
            &self,
            ids: &[String],
        ) -> Result<HashMap<String, Standing>, ProcessError> {
            let standings = self.standings.lock().unwrap();
            Ok(ids
                .iter()
                .filter_map(|id| Some((id.clone(), standings.get(id)?.clone())))
                .collect())
        }

        async fn adopt(
            &self,
            message: &String,
            item_id: &str,
            _parser: &ItemParser,
            adoption: &Adoption,
        ) -> Result<Option<DeadLetteredItem>, ProcessError> {
            let current = self
                .standings
                .lock()
                .unwrap()
                .get(item_id)
                .and_then(|s| s.status);
            if !crate::recording::Expect::judged(adoption.expected_status, &adoption.message_keys)
                .admits(current, &[])
            {
                return Ok(None);
            }
            tokio::time::sleep(self.adoption_takes).await;
            let reason = adoption.reason;
            self.adopted
                .lock()
                .unwrap()
                .push((message.clone(), reason.to_string()));
            let dead = record(ItemStatus::Dead, &format!("s-{message}"), "x", &[]);
            self.set(item_id, dead);
            Ok(Some(crate::testing::dead_record(
                item_id,
                crate::error::ErrorClass::Unknown,
                0,
            )))
        }

        async fn delete(&self, receipts: &[String]) -> Result<usize, ProcessError> {
            let mut messages = self.messages.lock().unwrap();
            let before = messages.len();
            messages.retain(|m| m.visible || !receipts.contains(&m.receipt));
            Ok(before - messages.len())
        }

        async fn hold(&self, receipts: &[String], hold: Duration) -> Result<(), ProcessError> {
            let mut messages = self.messages.lock().unwrap();
            for message in messages
                .iter_mut()
                .filter(|m| receipts.contains(&m.receipt))
            {
                message.visible = hold.is_zero();
            }
            Ok(())
        }

        fn is_fifo(&self) -> bool {
            self.fifo
        }

        async fn rotate(
            &self,
            _message: &String,
            receipt: &str,
            pass: &str,
            _item_id: &str,
        ) -> Result<bool, ProcessError> {
            let mut messages = self.messages.lock().unwrap();
            let Some(at) = messages.iter().position(|m| m.receipt == receipt) else {
                return Ok(false);
            };
            let mut copy = messages.remove(at);
            copy.id = format!("{}+", copy.id);
            copy.visible = true;
            copy.receipt = String::new();
            copy.marker = Some(pass.to_string());
            messages.push(copy);
            Ok(true)
        }
    }

    fn adopting() -> SweepOptions {
        SweepOptions {
            adopt: true,
            ..SweepOptions::default()
        }
    }

    #[tokio::test]
    async fn a_sweep_adopts_deletes_and_holds_by_the_rules_then_settles_by_the_final_state() {
        let dlq = MemoryDlq::default();
        for (message, item) in [("a", "a"), ("b", "b"), ("c", "c")] {
            dlq.add(message, item);
        }
        dlq.set(
            "b",
            record(ItemStatus::Resolved, "s-b", "p-b", &["msg:s-b", "sha:p-b"]),
        );
        dlq.set("c", record(ItemStatus::Dead, "s-c", "p-c", &[]));
        let sweep = sweep_dlq(&dlq, &adopting()).await.unwrap();
        assert_eq!(
            (sweep.seen, sweep.adopted, sweep.deleted, sweep.complete),
            (3, 1, 1, true),
            "a adopted; b (resolved by it) deleted"
        );
        assert!(sweep.errors.is_empty(), "{:?}", sweep.errors);
        let mut held: Vec<&String> = sweep.held.keys().collect();
        held.sort();
        assert_eq!(held, ["a", "c"]);
        assert_eq!(dlq.adopted.lock().unwrap()[0].0, "a");
        assert!(dlq.visible().is_empty(), "the rest held");

        // Meanwhile c was resolved by its message: it goes; a (dead) comes back to view.
        dlq.set(
            "c",
            record(ItemStatus::Resolved, "s-c", "p-c", &["msg:s-c", "sha:p-c"]),
        );
        let settled = settle_held(&dlq, sweep.held, Duration::ZERO, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(settled.deleted, 1);
        assert_eq!(dlq.visible(), ["a"]);
        assert_eq!(dlq.left(), 1);
    }

    #[test]
    fn a_body_is_its_own_digest_whatever_an_attribute_states() {
        let stated = |name: &str| (name == PAYLOAD_SHA256_ATTRIBUTE).then_some("a-victims-digest");
        let inline = MessageView::of("m-1", "{\"id\":\"attacker\"}", stated, "ours");
        assert_eq!(
            inline.payload_sha256.as_deref(),
            Some(crate::hex::sha256_hex(b"{\"id\":\"attacker\"}").as_str())
        );
        let pointer = |bucket: &str, key: &str| {
            S3Pointer {
                bucket: bucket.into(),
                key: key.into(),
            }
            .to_body()
        };
        // A pointer's payload is known by the digest stated beside it only where that
        // digest is the key we wrote it under, in our own bucket.
        let ours = MessageView::of(
            "m-2",
            &pointer("ours", "payloads/i/a-victims-digest"),
            stated,
            "ours",
        );
        assert_eq!(ours.payload_sha256.as_deref(), Some("a-victims-digest"));
        // Into another bucket: the payload is unknown; judged by its source message.
        let theirs = MessageView::of(
            "m-3",
            &pointer("producers", "payloads/i/a-victims-digest"),
            stated,
            "ours",
        );
        assert_eq!(
            (&theirs.payload_sha256, &theirs.pointer_sha256),
            (&None, &None)
        );
        assert_eq!(theirs.keys(), ["msg:m-3"]);
        // Into ours at a key the store writes, naming another digest than the one stated:
        // known by its own text only.
        let addressed = format!("payloads/i/{}", "0".repeat(64));
        let text = pointer("ours", &addressed);
        let view = MessageView::of("m-3", &text, stated, "ours");
        assert_eq!(view.payload_sha256, None);
        assert_eq!(
            view.keys(),
            [format!("sha:{}", crate::hex::sha256_hex(text.as_bytes()))]
        );
        // Into ours at a key the store never writes (a producer sharing the bucket):
        // unknown.
        for key in ["k", "payloads/i/x-a-victims-digest", "producer/ec-1"] {
            let view = MessageView::of("m-3", &pointer("ours", key), stated, "ours");
            assert_eq!(
                (&view.payload_sha256, &view.pointer_sha256),
                (&None, &None),
                "{key}"
            );
            assert_eq!(view.keys(), ["msg:m-3"], "{key}");
        }
    }

    #[test]
    fn a_message_naming_a_processed_delivery_is_judged_by_its_own_content() {
        // A producer's message keeps its attributes into the DLQ: one whose
        // `source_message_id` names a delivery the record processed, but whose body is
        // another payload, is that other payload, never deleted as processed.
        let forged = |name: &str| (name == SOURCE_MESSAGE_ID_ATTRIBUTE).then_some("src-1");
        let message = MessageView::of("m-9", "{\"id\":\"a\",\"v\":2}", forged, "ours");
        let processed = crate::hex::sha256_hex(b"{\"id\":\"a\",\"v\":1}");
        let resolved = record(
            ItemStatus::Resolved,
            "src-1",
            &processed,
            &["msg:src-1", &format!("sha:{processed}")],
        );
        assert!(matches!(
            decide(&message, Some(&resolved)),
            MessageFate::Reopen(_)
        ));
        let requeued = Standing {
            status: Some(ItemStatus::Requeued),
            ..resolved.clone()
        };
        assert!(matches!(
            decide(&message, Some(&requeued)),
            MessageFate::Reopen(_)
        ));
        let dead = Standing {
            status: Some(ItemStatus::Dead),
            ..resolved
        };
        assert!(!purge_takes(&message, &dead));
        // The same body is the payload processed, whatever message holds it.
        let same = MessageView::of("m-10", "{\"id\":\"a\",\"v\":1}", |_| None, "ours");
        assert_eq!(
            decide(
                &same,
                Some(&Standing {
                    status: Some(ItemStatus::Resolved),
                    ..dead.clone()
                })
            ),
            MessageFate::Delete
        );
        assert!(purge_takes(&same, &dead));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_ends_at_its_deadline_between_two_slow_adoptions() {
        let dlq = MemoryDlq {
            adoption_takes: Duration::from_secs(10),
            ..MemoryDlq::default()
        };
        for n in 0..10 {
            dlq.add(&format!("m{n}"), &format!("i{n}"));
        }
        let started = Instant::now();
        let options = SweepOptions {
            until: Some(started + Duration::from_secs(15)),
            ..adopting()
        };
        let sweep = sweep_dlq(&dlq, &options).await.unwrap();
        assert!(
            started.elapsed() <= Duration::from_secs(20),
            "ended {:?} after it started, its deadline was 15 s",
            started.elapsed()
        );
        assert_eq!((sweep.seen, sweep.adopted, sweep.complete), (2, 2, false));
        let held: usize = sweep.held.values().map(Vec::len).sum();
        assert_eq!(
            held, 10,
            "the eight not judged are held with the two adopted"
        );
        settle_held(&dlq, sweep.held, Duration::ZERO, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(dlq.visible().len(), 10, "nothing lost, all back in view");
    }

    #[tokio::test]
    async fn a_held_message_whose_record_must_reopen_is_given_back_at_once() {
        let dlq = MemoryDlq::default();
        dlq.add("a", "a");
        dlq.set("a", record(ItemStatus::Dead, "s-a", "x", &[]));
        let sweep = sweep_dlq(&dlq, &SweepOptions::default()).await.unwrap();
        assert!(dlq.visible().is_empty(), "held while its record is dead");
        // Meanwhile a run resolves the item with another payload: this message holds one
        // the record did not process, so the next sweep must see it to reopen the record,
        // not wait out the hold the others get.
        dlq.set(
            "a",
            record(
                ItemStatus::Resolved,
                "s-other",
                "y",
                &["msg:s-other", "sha:y"],
            ),
        );
        let settled = settle_held(&dlq, sweep.held, Duration::ZERO, Duration::from_secs(600))
            .await
            .unwrap();
        assert_eq!((settled.deleted, settled.to_reopen), (0, 1));
        assert_eq!(dlq.visible(), ["a"], "given back at once");
    }

    /// Settling waits for a run that holds a live lease on a held message's item, and
    /// deletes the message once that run resolves the item. Taken for a lease no run
    /// holds, the wait ended at once and the message was given back, to stay in the DLQ
    /// beside its resolved record until a later sweep.
    #[tokio::test(start_paused = true)]
    async fn settling_waits_for_a_live_redrive_and_deletes_the_message_it_resolved() {
        let dlq = MemoryDlq::default();
        dlq.add("a", "a");
        dlq.set(
            "a",
            Standing {
                lease_expires_at: Some(crate::clock::now().timestamp() + 600),
                ..record(ItemStatus::Redriving, "s-a", "p-a", &[])
            },
        );
        let sweep = sweep_dlq(&dlq, &SweepOptions::default()).await.unwrap();
        assert!(dlq.visible().is_empty(), "held while its item is redriven");
        let the_run_resolves_it = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            dlq.set(
                "a",
                record(ItemStatus::Resolved, "s-a", "p-a", &["msg:s-a", "sha:p-a"]),
            );
        };
        let (settled, ()) = tokio::join!(
            settle_held(&dlq, sweep.held, Duration::from_secs(15), Duration::ZERO),
            the_run_resolves_it
        );
        assert_eq!(settled.unwrap().deleted, 1);
        assert_eq!(dlq.left(), 0);
    }

    #[tokio::test]
    async fn without_adopt_a_sweep_holds_what_no_record_holds() {
        let dlq = MemoryDlq::default();
        dlq.add("a", "a");
        let sweep = sweep_dlq(&dlq, &SweepOptions::default()).await.unwrap();
        assert_eq!((sweep.seen, sweep.adopted, sweep.deleted), (1, 0, 0));
        assert!(dlq.adopted.lock().unwrap().is_empty());
        assert_eq!(
            settle_held(&dlq, sweep.held, Duration::ZERO, Duration::ZERO)
                .await
                .unwrap()
                .deleted,
            0
        );
        assert_eq!(dlq.visible(), ["a"], "given back");
    }

    /// Issue: a purge deleted every DLQ message of a selected item id, including a failure
    /// of the same id that arrived after the selection. Only what the selected record
    /// holds goes.
    #[tokio::test]
    async fn a_purge_deletes_only_the_messages_the_selected_record_holds() {
        let dlq = MemoryDlq::default();
        dlq.add("old", "order-1");
        dlq.add("new", "order-1");
        let selected = record(ItemStatus::Dead, "s-old", "p-old", &[]);
        let options = SweepOptions {
            purge: [("order-1".to_string(), selected)].into(),
            ..SweepOptions::default()
        };
        let sweep = sweep_dlq(&dlq, &options).await.unwrap();
        assert_eq!(sweep.deleted, 1);
        settle_held(&dlq, sweep.held, Duration::ZERO, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(dlq.visible(), ["new"], "the later failure stays");
        // The selected delivery's id on another payload is not that delivery (a producer
        // may set the attribute); with its content unknown, its source message decides.
        assert!(!purge_takes(
            &view("d9", "s-old", "other"),
            &record(ItemStatus::Dead, "s-old", "x", &[])
        ));
        let unknown = MessageView {
            payload_sha256: None,
            ..view("d9", "s-old", "")
        };
        assert!(purge_takes(
            &unknown,
            &record(ItemStatus::Dead, "s-old", "x", &[])
        ));
        assert!(!purge_takes(
            &view("d9", "s-new", "y"),
            &record(ItemStatus::Dead, "s-old", "x", &[])
        ));
        assert!(purge_takes(
            &view("d9", "s-new", "y"),
            &record(ItemStatus::Resolved, "s-old", "x", &["sha:y"])
        ));
        // The same payload delivered again is not the delivery selected.
        assert!(!purge_takes(
            &view("d9", "s-new", "x"),
            &record(ItemStatus::Dead, "s-old", "x", &[])
        ));
    }

    /// Issue: on a FIFO DLQ, once a sweep held a group's first messages SQS gave nothing
    /// more of that group, and a message behind them (an orphan the redrive policy moved)
    /// was never adopted. Kept messages are moved behind their group, so the pass reaches
    /// every message, and judges each once.
    #[tokio::test]
    async fn a_fifo_sweep_reaches_the_messages_behind_a_held_group_head() {
        let dlq = MemoryDlq::fifo();
        for n in 0..12 {
            let id = format!("dead-{n}");
            dlq.add_in(&id, &id, Some("g1"));
            dlq.set(&id, record(ItemStatus::Dead, &format!("s-{id}"), "x", &[]));
        }
        dlq.add_in("orphan", "orphan", Some("g1"));
        let sweep = sweep_dlq(&dlq, &adopting()).await.unwrap();
        assert!(sweep.complete);
        assert_eq!(sweep.seen, 13, "each judged once");
        assert_eq!(sweep.adopted, 1, "the orphan behind them");
        assert_eq!(sweep.rotated, 13);
        assert_eq!(
            dlq.left(),
            13,
            "nothing lost: copies in place of the originals"
        );
        // The copies received again are held for the run to settle (which blocks their
        // group again: the others wait, visible, for the next sweep, already judged).
        let held: usize = sweep.held.values().map(Vec::len).sum();
        assert!(held > 0);
        assert_eq!(held + dlq.visible().len(), 13);
        settle_held(&dlq, sweep.held, Duration::ZERO, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(dlq.visible().len(), 13);
    }

    /// A pass judges each message once: one received again by its id (its hold ended) and a
    /// copy the pass's own rotation sent (a new id, the pass's marker) are already judged;
    /// a copy another pass sent is not. Taken as judged only when both held, a message was
    /// judged (counted, adopted) again, and a FIFO pass rotated its copies for ever.
    #[test]
    fn a_pass_judges_a_message_received_again_or_its_own_rotated_copy_only_once() {
        let pass = Pass {
            sweep: Sweep::default(),
            receipts: HashMap::new(),
            views: HashMap::new(),
            judged: std::iter::once("m-1".to_string()).collect(),
            marker: "pass-1".to_string(),
        };
        let received = |message_id: &str, marker: Option<&str>| ReceivedMessage {
            receipt: "r".to_string(),
            item_id: "a".to_string(),
            view: view(message_id, "s-1", "p-1"),
            message: (),
            marker: marker.map(str::to_string),
        };
        assert!(
            pass.already_judged(&received("m-1", None)),
            "received again"
        );
        assert!(
            pass.already_judged(&received("m-2", Some("pass-1"))),
            "its own copy"
        );
        assert!(!pass.already_judged(&received("m-2", None)));
        assert!(
            !pass.already_judged(&received("m-2", Some("pass-0"))),
            "another pass's copy"
        );
    }

    /// A receive that fails midway gives back what the pass held, instead of stranding it
    /// for the pass's whole hold.
    #[tokio::test]
    async fn a_sweep_that_fails_midway_gives_back_what_it_held() {
        let dlq = MemoryDlq::default();
        for n in 0..25 {
            dlq.add(&format!("m{n}"), &format!("i{n}"));
            dlq.set(&format!("i{n}"), record(ItemStatus::Dead, "s", "x", &[]));
        }
        *dlq.fail_receive_after.lock().unwrap() = Some(2);
        let error = sweep_dlq(&dlq, &SweepOptions::default()).await.unwrap_err();
        assert_eq!(error.class, crate::ErrorClass::ServerError);
        assert_eq!(dlq.visible().len(), 25, "all given back");
    }

    /// A pass without an end holds each message at least twice as long as it has run: a
    /// message given back while the pass goes on is received again a logarithmic number of
    /// times, and the pass ends (a fixed two-minute hold never let a large purge end).
    #[test]
    fn holds_grow_with_the_pass_and_cover_the_instants_named() {
        let now = Instant::now();
        assert_eq!(hold_for(Duration::ZERO, &[None], now), MIN_HOLD);
        assert_eq!(
            hold_for(Duration::from_secs(600), &[None], now),
            Duration::from_secs(1_320)
        );
        let later = now + Duration::from_secs(900);
        assert_eq!(
            hold_for(Duration::from_secs(10), &[None, Some(later)], now),
            Duration::from_secs(930)
        );
        assert_eq!(
            hold_for(Duration::from_secs(100_000), &[None], now),
            MAX_HOLD
        );
        // A message held at 0 s comes back at 120 s, then at 120 + 360 s, ...: a pass of
        // ten hours receives it fewer than ten times.
        let (mut at, mut times) = (Duration::ZERO, 0);
        while at < Duration::from_secs(36_000) {
            at += hold_for(at, &[None], now);
            times += 1;
        }
        assert!(times <= 8, "{times}");
    }

    /// A requeued pointer (a payload over 256 KiB, requeued as an Extended-Client
    /// pointer into our own bucket) whose read failed in the worker is recorded with the
    /// pointer's text as its payload (record sha = sha256(pointer text), `batch.rs`
    /// `pointer_sha`); its DLQ message states that digest, which is not the key's, so its
    /// content is "unknown" and it is judged by its source message (r1). Requeued again, the
    /// worker reads the pointer and `finish_requeued` lists `msg:r2` and the record's digest.
    /// The DLQ message holds exactly the body the record processed, and must go.
    #[test]
    fn a_dlq_message_holding_a_requeued_pointers_text_goes_once_its_record_resolved() {
        let own = "ours";
        let payload = crate::hex::sha256_hex(b"a payload over 256 KiB");
        let pointer = S3Pointer {
            bucket: own.into(),
            key: crate::recording::payload_key("order-1", &payload),
        }
        .to_body();
        let recorded = crate::hex::sha256_hex(pointer.as_bytes());
        let attributes = |name: &str| match name {
            SOURCE_MESSAGE_ID_ATTRIBUTE => Some("r1"),
            PAYLOAD_SHA256_ATTRIBUTE => Some(recorded.as_str()),
            crate::message::ITEM_ID_ATTRIBUTE => Some("order-1"),
            _ => None,
        };
        let dlq_message = MessageView::of("d2", &pointer, attributes, own);
        let resolved = record(
            ItemStatus::Resolved,
            "r1",
            &recorded,
            &["msg:r2", &format!("sha:{recorded}")],
        );
        assert_eq!(
            decide(&dlq_message, Some(&resolved)),
            MessageFate::Delete,
            "the record processed this very body; reopening it redelivers the payload"
        );
    }

    /// Our own offloaded DLQ message whose object is gone (a purge deleted it
    /// while the message was in flight; a lifecycle rule) is adopted with its pointer as
    /// its payload (`Adoption::unfetched_payload`: not found). `dlq purge` of that record
    /// must take the message: nothing else ever can (the record can never resolve), and
    /// the record's removal leaves the message to be adopted again at every sweep.
    #[test]
    fn a_purge_takes_our_own_pointer_message_adopted_with_its_object_gone() {
        let own = "ours";
        let payload = crate::hex::sha256_hex(b"a payload that was offloaded");
        let pointer = S3Pointer {
            bucket: own.into(),
            key: crate::recording::payload_key("order-1", &payload),
        }
        .to_body();
        let attributes = |name: &str| match name {
            SOURCE_MESSAGE_ID_ATTRIBUTE => Some("s1"),
            PAYLOAD_SHA256_ATTRIBUTE => Some(payload.as_str()),
            crate::message::ITEM_ID_ATTRIBUTE => Some("order-1"),
            _ => None,
        };
        let dlq_message = MessageView::of("d1", &pointer, attributes, own);
        assert_eq!(
            dlq_message.payload_sha256.as_deref(),
            Some(payload.as_str())
        );
        let mut item = WorkItem::new("d1", pointer.clone());
        item.item_id = "order-1".into();
        let adopted = adopted_record(
            item,
            ProcessError::new(crate::ErrorClass::NotFound, "NoSuchKey").with_step("dlq-adopt"),
            "d1",
            dlq_message.source_message_id.clone(),
            &Adoption {
                reason: "moved",
                reopen: false,
                known_queue_arn: None,
                expected_status: None,
                message_keys: dlq_message.keys(),
            },
            Duration::from_secs(60),
        );
        let selected = Standing::of(&adopted);
        assert!(
            purge_takes(&dlq_message, &selected),
            "the purge keeps the very message its record was adopted from"
        );
    }

    /// A producer's Extended-Client pointer (into its own bucket) keeps its attributes into
    /// the DLQ: a `source_message_id` naming a delivery the record processed got it deleted
    /// as that delivery, its payload never read by anyone. Without our `item_id` beside it,
    /// the attribute is not believed.
    #[test]
    fn a_producers_pointer_naming_a_processed_delivery_is_not_deleted() {
        let pointer = S3Pointer {
            bucket: "producers".into(),
            key: "large/other-payload".into(),
        }
        .to_body();
        let forged = |name: &str| (name == SOURCE_MESSAGE_ID_ATTRIBUTE).then_some("src-1");
        let message = MessageView::of("m-9", &pointer, forged, "ours");
        let processed = crate::hex::sha256_hex(b"{\"id\":\"a\",\"v\":1}");
        let resolved = record(
            ItemStatus::Resolved,
            "src-1",
            &processed,
            &["msg:src-1", &format!("sha:{processed}")],
        );
        assert_ne!(decide(&message, Some(&resolved)), MessageFate::Delete);
    }

    /// A pass out of time mid-page: the messages it did not judge are neither
    /// deleted nor adopted by the pass, and are settled by their records afterwards (the
    /// processed one deleted, the one to reopen given back, the unrecorded one visible).
    #[tokio::test(start_paused = true)]
    async fn unjudged_messages_are_settled_by_their_records_and_none_is_lost() {
        let dlq = MemoryDlq {
            adoption_takes: Duration::from_secs(10),
            ..MemoryDlq::default()
        };
        for (message, item) in [("m0", "i0"), ("m1", "i1"), ("m2", "i2"), ("m3", "i3")] {
            dlq.add(message, item);
        }
        dlq.set(
            "i1",
            record(ItemStatus::Resolved, "s-m1", "p-m1", &["sha:p-m1"]),
        );
        dlq.set(
            "i3",
            record(ItemStatus::Resolved, "s-x", "p-x", &["msg:s-x", "sha:p-x"]),
        );
        let options = SweepOptions {
            until: Some(Instant::now() + Duration::from_secs(5)),
            ..adopting()
        };
        let sweep = sweep_dlq(&dlq, &options).await.unwrap();
        assert_eq!((sweep.seen, sweep.adopted, sweep.deleted), (1, 1, 0));
        assert_eq!(dlq.left(), 4, "nothing deleted unjudged");
        let settled = settle_held(&dlq, sweep.held, Duration::ZERO, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!((settled.deleted, settled.to_reopen), (1, 1));
        let mut visible = dlq.visible();
        visible.sort();
        assert_eq!(visible, ["m0", "m2", "m3"]);
    }
}
