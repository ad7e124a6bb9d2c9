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
//! The loops ([`sweep_dlq`], [`settle_held`]) run over the store's ports: the DLQ's
//! messages ([`DeadLetterQueue`]: receive, adopt, delete, hold, rotate) and the records'
//! standings ([`RecordStore::standings`]); SQS and DynamoDB in production
//! (`sqs_keeper_aws::DeadLetterStore`), the in-memory world in tests and the
//! simulation ([`crate::testing::MemoryStore`]). No I/O of their own. What a message is
//! known by ([`MessageView`]) and what the sweep reads of a record ([`Standing`]) are what
//! those ports pass ([`crate::ports::RecordStore`] and the other port traits); the rule over them is here ([`decide`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use crate::dead_letter::{
    DeadLetterCandidate, DeadLetterReason, DeadLetteredItem, InvocationInfo, ItemStatus,
};
use crate::error::{ErrorClass, ProcessError};
use crate::item::{ItemParser, WorkItem};
use crate::ports::{DeadLetterQueue, RecordStore};
use crate::retry::AttemptFailure;

mod pass;
mod rule;
mod settle;

use crate::ports::{Adoption, MessageView, ReceivedMessage, Selected, Standing};
#[cfg(test)]
use pass::hold_for;
pub use pass::sweep_dlq;
pub use rule::{adopted_record, decide, purge_takes, tracked_as_its_payload_names, MessageFate};
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
    /// Messages of a FIFO DLQ moved behind their group ([`DeadLetterQueue::rotate`]).
    pub rotated: usize,
    /// Whether the pass saw the DLQ empty of visible messages (else it stopped at its
    /// `until`).
    pub complete: bool,
    /// The messages still held, by item id (ordered: a run settles them in the same
    /// order every time, which keeps the simulation's runs reproducible).
    pub held: BTreeMap<String, Vec<HeldMessage>>,
    /// Messages that could not be handled, by item id, with why: left in the DLQ.
    pub errors: Vec<(String, String)>,
    /// Purging: the selected records this pass deleted (their messages went with them).
    pub removed: BTreeSet<String>,
    /// Purging: the selected records that had changed, kept with their messages.
    pub changed: BTreeSet<String>,
}

/// What to do with messages during a sweep.
#[derive(Debug, Clone, Default)]
pub struct SweepOptions {
    /// Create (or reopen) records for messages no record holds.
    pub adopt: bool,
    /// Purging: the records selected, by item id, as they were selected. A message of one
    /// of these items is deleted only when that record holds it ([`purge_takes`]) and was
    /// deleted itself, still as selected ([`Selected::condition`]); the others are kept.
    pub purge: HashMap<String, Selected>,
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
    /// Clearing: a message no record holds that was sent to the DLQ before this instant
    /// (epoch ms) is deleted. One sent since is a new failure, and is kept, and so is one
    /// the queue's redrive policy moved, whose `SentTimestamp` is its source queue's.
    pub orphans_sent_before_ms: Option<i64>,
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

#[cfg(test)]
mod tests;
