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
//! ([`crate::adapters::store::DeadLetterStore`]), memory in a simulation. No I/O of their own.

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
use crate::ports::{Sweep, SweepOptions};
use crate::retry::AttemptFailure;

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
    /// Set on messages a requeue sent back to the source queue (the run's id).
    pub requeued_by: Option<String>,
}

impl MessageView {
    /// The view of DLQ message `message_id` with `body`, whose string message attributes
    /// `attribute` gives: the source message is our `source_message_id` attribute, or (a
    /// message the queue's redrive policy moved, or a requeued one, which keep their ids) its
    /// own id; the payload digest is the body's own, or for an Extended-Client pointer our
    /// `payload_sha256` attribute.
    pub fn of<'a>(
        message_id: &str,
        body: &str,
        attribute: impl Fn(&str) -> Option<&'a str>,
    ) -> MessageView {
        MessageView {
            message_id: message_id.to_string(),
            source_message_id: attribute(SOURCE_MESSAGE_ID_ATTRIBUTE)
                .unwrap_or(message_id)
                .to_string(),
            // A body that is its payload is its own digest, whatever an attribute states
            // (a producer's message keeps its attributes into the DLQ, and one stating
            // another payload's digest would be deleted as that payload, processed); only
            // a pointer's payload is known by the digest stated beside it.
            payload_sha256: match S3Pointer::parse(body) {
                None => Some(crate::hex::sha256_hex(body.as_bytes())),
                Some(_) => attribute(PAYLOAD_SHA256_ATTRIBUTE).map(str::to_string),
            },
            requeued_by: attribute(REQUEUED_BY_ATTRIBUTE).map(str::to_string),
        }
    }

    /// The keys under which a record lists this message as processed.
    pub fn keys(&self) -> Vec<String> {
        let mut keys = vec![processed_key_for_message(&self.source_message_id)];
        if let Some(sha) = &self.payload_sha256 {
            keys.push(processed_key_for_payload(sha));
        }
        keys
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
    pub fn holds_current_payload(&self, message: &MessageView) -> bool {
        self.source_message_id.as_deref() == Some(message.source_message_id.as_str())
            || (message.payload_sha256.is_some() && message.payload_sha256 == self.payload_sha256)
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
/// (plus [`MIN_HOLD`]). The second bound is what ends a pass over a queue larger than one
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
/// selected, holds this very delivery (its source message) or lists it processed. Not by
/// the payload's digest alone: the same payload dead-lettered again after the selection is
/// a new failure, never selected.
pub fn purge_takes(message: &MessageView, selected: &Standing) -> bool {
    selected.source_message_id.as_deref() == Some(message.source_message_id.as_str())
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
        let resolved_by_id = record(ItemStatus::Resolved, "s1", "x1", &["msg:s1"]);
        assert_eq!(decide(&m, Some(&resolved_by_id)), MessageFate::Delete);
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
                    view: view(&message.id, &message.source, "x"),
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
        dlq.set("b", record(ItemStatus::Resolved, "s-b", "x", &["msg:s-b"]));
        dlq.set("c", record(ItemStatus::Dead, "s-c", "x", &[]));
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
        dlq.set("c", record(ItemStatus::Resolved, "s-c", "x", &["msg:s-c"]));
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
        let inline = MessageView::of("m-1", "{\"id\":\"attacker\"}", stated);
        assert_eq!(
            inline.payload_sha256.as_deref(),
            Some(crate::hex::sha256_hex(b"{\"id\":\"attacker\"}").as_str())
        );
        // A pointer's payload is known only by the digest stated beside it.
        let pointer = S3Pointer {
            bucket: "b".into(),
            key: "k".into(),
        }
        .to_body();
        let offloaded = MessageView::of("m-2", &pointer, stated);
        assert_eq!(
            offloaded.payload_sha256.as_deref(),
            Some("a-victims-digest")
        );
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
            record(ItemStatus::Resolved, "s-other", "y", &["msg:s-other"]),
        );
        let settled = settle_held(&dlq, sweep.held, Duration::ZERO, Duration::from_secs(600))
            .await
            .unwrap();
        assert_eq!((settled.deleted, settled.to_reopen), (0, 1));
        assert_eq!(dlq.visible(), ["a"], "given back at once");
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
        let selected = record(ItemStatus::Dead, "s-old", "x-old", &[]);
        let options = SweepOptions {
            purge: [("order-1".to_string(), selected)].into(),
            ..SweepOptions::default()
        };
        // The memory DLQ gives every message the digest "x": match by source message.
        let sweep = sweep_dlq(&dlq, &options).await.unwrap();
        assert_eq!(sweep.deleted, 1);
        settle_held(&dlq, sweep.held, Duration::ZERO, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(dlq.visible(), ["new"], "the later failure stays");
        assert!(purge_takes(
            &view("d9", "s-old", "other"),
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
}
