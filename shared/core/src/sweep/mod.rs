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
//! (`sqs_keeper_aws::DeadLetterStore`), memory in a simulation. No I/O of their own.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::Clock;
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

mod pass;
mod rule;
mod settle;

#[cfg(test)]
use pass::hold_for;
pub use pass::sweep_dlq;
pub use rule::{
    adopted_record, decide, purge_takes, tracked_as_its_payload_names, Adoption, MessageFate,
    MessageView, Standing,
};
pub use settle::{settle_held, Settled};

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
    /// Where the pass's marker is drawn from (the thread's generator by default; a
    /// redrive passes its engine's).
    pub random: crate::random::Random,
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

#[cfg(test)]
mod tests;
