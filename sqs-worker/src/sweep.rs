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
use crate::error::ProcessError;
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
    /// own id; the payload digest is our `payload_sha256` attribute, or the body's own digest
    /// unless the body is an Extended-Client pointer.
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
            payload_sha256: attribute(PAYLOAD_SHA256_ATTRIBUTE)
                .map(str::to_string)
                .or_else(|| {
                    S3Pointer::parse(body)
                        .is_none()
                        .then(|| crate::hex::sha256_hex(body.as_bytes()))
                }),
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

/// A DLQ message held invisible by a sweep, with what identifies it.
#[derive(Debug, Clone)]
pub struct HeldMessage<M> {
    /// Its receipt handle.
    pub receipt: String,
    /// Its identity.
    pub view: MessageView,
    /// The message itself (a record may have to be reopened with its payload).
    pub message: M,
}

/// What the sweep needs of the DLQ and the records: receive, look up, adopt, delete and
/// release. Each is one operation (or a few SDK calls) and decides nothing.
pub trait DlqMessages: Send + Sync {
    /// The raw message a record may have to be adopted from.
    type Message: Clone + Send + Sync;

    /// Up to 10 visible DLQ messages, each held invisible for `hold`, with the item id each
    /// is tracked by (via `parser`); empty when none is visible.
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
    /// the record [`adopted_record`] makes, written as any dead-letter record is.
    fn adopt(
        &self,
        message: &Self::Message,
        item_id: &str,
        parser: &ItemParser,
        adoption: &Adoption,
    ) -> impl Future<Output = Result<DeadLetteredItem, ProcessError>> + Send;

    /// Deletes messages by receipt; how many were deleted.
    fn delete(
        &self,
        receipts: &[String],
    ) -> impl Future<Output = Result<usize, ProcessError>> + Send;

    /// Makes held messages visible again.
    fn release(&self, receipts: &[String])
        -> impl Future<Output = Result<(), ProcessError>> + Send;
}

/// Receives every visible DLQ message (until `options.until`), holding each invisible for
/// `hold`, and settles what [`decide`] can settle at once.
pub async fn sweep_dlq<D: DlqMessages>(
    dlq: &D,
    hold: Duration,
    options: &SweepOptions,
) -> Result<Sweep<HeldMessage<D::Message>>, ProcessError> {
    let mut sweep = Sweep::default();
    loop {
        if options.until.is_some_and(|until| Instant::now() >= until) {
            return Ok(sweep);
        }
        let messages = dlq.receive(hold, &options.parser).await?;
        if messages.is_empty() {
            return Ok(sweep);
        }
        let mut to_delete = Vec::new();
        let ids: Vec<String> = messages.iter().map(|m| m.item_id.clone()).collect();
        let standings = dlq.standings(&ids).await;
        for received in messages {
            sweep.seen += 1;
            let ReceivedMessage {
                receipt,
                item_id,
                view,
                message,
            } = received;
            if options.delete_items.contains(&item_id) {
                to_delete.push(receipt);
                continue;
            }
            let held = HeldMessage {
                receipt: receipt.clone(),
                view: view.clone(),
                message,
            };
            let standing = match &standings {
                Ok(found) => found.get(&item_id),
                Err(error) => {
                    sweep.errors.push((item_id.clone(), error.to_string()));
                    sweep.held.entry(item_id).or_default().push(held);
                    continue;
                }
            };
            match decide(&view, standing) {
                MessageFate::Delete => to_delete.push(receipt),
                MessageFate::Keep => sweep.held.entry(item_id).or_default().push(held),
                MessageFate::Adopt | MessageFate::Reopen(_) if !options.adopt => {
                    sweep.held.entry(item_id).or_default().push(held)
                }
                fate @ (MessageFate::Adopt | MessageFate::Reopen(_)) => {
                    let adoption = Adoption {
                        reason: match fate {
                            MessageFate::Reopen(reason) => reason,
                            _ => "exceeded maxReceiveCount without a recorded failure (moved by the queue's redrive policy)",
                        },
                        reopen: matches!(fate, MessageFate::Reopen(_)),
                        known_queue_arn: standing.and_then(|s| s.source_queue_arn.clone()),
                    };
                    match dlq
                        .adopt(&held.message, &item_id, &options.parser, &adoption)
                        .await
                    {
                        Ok(_) => sweep.adopted += 1,
                        Err(error)
                            if crate::mutants::is_on(
                                crate::mutants::Mutant::PoisonMessageAbortsSweep,
                            ) =>
                        {
                            return Err(error);
                        }
                        Err(error) => {
                            tracing::warn!(item_id = %item_id, error = %error, "DLQ message could not be recorded; left in the DLQ");
                            sweep.errors.push((item_id.clone(), error.to_string()));
                        }
                    }
                    sweep.held.entry(item_id).or_default().push(held);
                }
            }
        }
        sweep.deleted += dlq.delete(&to_delete).await?;
    }
}

/// Deletes the held messages whose records now say so ([`decide`]) and makes the rest
/// visible again; returns how many were deleted. Items another run is redriving at this
/// moment (a live lease; not one left by a run that died) are looked at again every
/// 250 ms, for at most `wait`, so that their messages are deleted if that run resolves
/// them: it cannot delete messages it does not hold.
pub async fn settle_held<D: DlqMessages>(
    dlq: &D,
    held: BTreeMap<String, Vec<HeldMessage<D::Message>>>,
    wait: Duration,
) -> Result<usize, ProcessError> {
    let ids: Vec<String> = held.keys().cloned().collect();
    let give_up = Instant::now() + wait;
    // A lookup that fails leaves those messages kept (made visible again), never deleted.
    let mut standings = dlq.standings(&ids).await.unwrap_or_default();
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
    let mut release = Vec::new();
    for (item_id, messages) in held {
        // A message received twice (held by a sweep, given back, received again) is
        // settled once, by its latest receipt: the earlier one no longer deletes it.
        let mut latest: BTreeMap<String, HeldMessage<D::Message>> = BTreeMap::new();
        for held in messages {
            latest.insert(held.view.message_id.clone(), held);
        }
        for held in latest.into_values() {
            let Some(standing) = standings.get(&item_id) else {
                release.push(held.receipt);
                continue;
            };
            match decide(&held.view, Some(standing)) {
                MessageFate::Delete => delete.push(held.receipt),
                MessageFate::Reopen(reason) => {
                    // E.g. a second body under the same item id, whose record this run
                    // just resolved with the first: the record takes this payload, so
                    // the next redrive delivers it.
                    if let Err(error) = dlq
                        .adopt(
                            &held.message,
                            &item_id,
                            &ItemParser::default(),
                            &Adoption {
                                reason,
                                reopen: true,
                                known_queue_arn: standing.source_queue_arn.clone(),
                            },
                        )
                        .await
                    {
                        tracing::warn!(item_id = %item_id, error = %error, "could not reopen the record of a DLQ message; the next sweep tries again");
                    }
                    release.push(held.receipt);
                }
                MessageFate::Keep | MessageFate::Adopt => release.push(held.receipt),
            }
        }
    }
    let deleted = dlq.delete(&delete).await?;
    dlq.release(&release).await?;
    Ok(deleted)
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

    /// A DLQ of messages (message id, item id, visible, receipt) and a table of standings,
    /// in memory.
    #[derive(Default)]
    struct MemoryDlq {
        messages: Mutex<Vec<(String, String, bool, String)>>,
        standings: Mutex<HashMap<String, Standing>>,
        adopted: Mutex<Vec<(String, String)>>,
        receipts: Mutex<usize>,
    }

    impl MemoryDlq {
        fn add(&self, message_id: &str, item_id: &str) {
            let message = (message_id.into(), item_id.into(), true, String::new());
            self.messages.lock().unwrap().push(message);
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
                .filter(|m| m.2)
                .map(|m| m.0.clone())
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
            let mut messages = self.messages.lock().unwrap();
            let mut receipts = self.receipts.lock().unwrap();
            let mut received = Vec::new();
            for message in messages.iter_mut().filter(|m| m.2).take(10) {
                *receipts += 1;
                message.2 = false;
                message.3 = format!("r{receipts}");
                received.push(ReceivedMessage {
                    receipt: message.3.clone(),
                    item_id: message.1.clone(),
                    view: view(&message.0, &format!("s-{}", message.0), "x"),
                    message: message.0.clone(),
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
        ) -> Result<DeadLetteredItem, ProcessError> {
            let reason = adoption.reason;
            let mut adopted = self.adopted.lock().unwrap();
            adopted.push((message.clone(), reason.to_string()));
            let dead = record(ItemStatus::Dead, &format!("s-{message}"), "x", &[]);
            self.set(item_id, dead);
            Ok(crate::testing::dead_record(
                item_id,
                crate::error::ErrorClass::Unknown,
                0,
            ))
        }

        async fn delete(&self, receipts: &[String]) -> Result<usize, ProcessError> {
            let mut messages = self.messages.lock().unwrap();
            let before = messages.len();
            messages.retain(|m| m.2 || !receipts.contains(&m.3));
            Ok(before - messages.len())
        }

        async fn release(&self, receipts: &[String]) -> Result<(), ProcessError> {
            let mut messages = self.messages.lock().unwrap();
            for message in messages.iter_mut().filter(|m| receipts.contains(&m.3)) {
                message.2 = true;
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_sweep_adopts_deletes_and_holds_by_the_rules_then_settles_by_the_final_state() {
        let dlq = MemoryDlq::default();
        for (message, item) in [("a", "a"), ("b", "b"), ("c", "c"), ("d", "d")] {
            dlq.add(message, item);
        }
        dlq.set("b", record(ItemStatus::Resolved, "s-b", "x", &["msg:s-b"]));
        dlq.set("c", record(ItemStatus::Dead, "s-c", "x", &[]));
        let options = SweepOptions {
            adopt: true,
            delete_items: ["d".to_string()].into(),
            ..SweepOptions::default()
        };
        let sweep = sweep_dlq(&dlq, Duration::from_secs(60), &options)
            .await
            .unwrap();
        assert_eq!(
            (sweep.seen, sweep.adopted, sweep.deleted),
            (4, 1, 2),
            "a adopted; b (resolved by it) and d (purged) deleted"
        );
        assert!(sweep.errors.is_empty(), "{:?}", sweep.errors);
        let mut held: Vec<&String> = sweep.held.keys().collect();
        held.sort();
        assert_eq!(held, ["a", "c"]);
        assert_eq!(dlq.adopted.lock().unwrap()[0].0, "a");
        assert!(dlq.visible().is_empty(), "the rest held");

        // Meanwhile c was resolved by its message: it goes; a (dead) comes back to view.
        dlq.set("c", record(ItemStatus::Resolved, "s-c", "x", &["msg:s-c"]));
        let deleted = settle_held(&dlq, sweep.held, Duration::ZERO).await.unwrap();
        assert_eq!(deleted, 1);
        assert_eq!(dlq.visible(), ["a"]);
        assert_eq!(dlq.left(), 1);
    }

    #[tokio::test]
    async fn without_adopt_a_sweep_holds_what_no_record_holds() {
        let dlq = MemoryDlq::default();
        dlq.add("a", "a");
        let sweep = sweep_dlq(&dlq, Duration::from_secs(60), &SweepOptions::default())
            .await
            .unwrap();
        assert_eq!((sweep.seen, sweep.adopted, sweep.deleted), (1, 0, 0));
        assert!(dlq.adopted.lock().unwrap().is_empty());
        assert_eq!(
            settle_held(&dlq, sweep.held, Duration::ZERO).await.unwrap(),
            0
        );
        assert_eq!(dlq.visible(), ["a"], "given back");
    }
}
