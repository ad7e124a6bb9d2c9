//! The ports of the redrive wing: what the redrive engine needs from the outside world, as
//! four small traits, so that its logic (selection, leasing, reprocessing, requeueing,
//! settling the DLQ) runs the same over DynamoDB, SQS and S3
//! (`sqs_keeper_aws::DeadLetterStore` implements all four) and over the in-memory store its
//! unit tests use ([`crate::testing::MemoryStore`]).
//!
//! | port | what it is | production adapter |
//! | --- | --- | --- |
//! | [`RecordStore`] | dead-letter records: read, list, lease, resolve, fail again | DynamoDB table |
//! | [`DeadLetterQueue`] | the DLQ's messages: sweep (hold, adopt) and settle | SQS queue + the table |
//! | [`PayloadStore`] | payloads too large to keep inline | S3 bucket |
//! | [`SourceQueue`] | the queues items are requeued to | SQS |
//!
//! The worker wing's ports are [`crate::Processor`], [`crate::DeadLetterSink`] and
//! [`crate::batch::BodyResolver`]. See `docs/ARCHITECTURE.md` §5 for the layout.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use crate::dead_letter::{DeadLetteredItem, FailureDetail, MessageAttribute};
use crate::error::ProcessError;
use crate::pointer::S3Pointer;
use crate::selection::{Page, PageToken, RecordFilter};

pub use crate::sweep::{Sweep, SweepOptions};

/// Dead-letter records. Every write that changes an item's status is conditional on the
/// lease (see `docs/ARCHITECTURE.md` §3): two runs never both act on one item.
pub trait RecordStore: Send + Sync {
    /// One record by item id; `None` when there is none.
    fn get(
        &self,
        item_id: &str,
    ) -> impl Future<Output = Result<Option<DeadLetteredItem>, ProcessError>> + Send;

    /// One page of the records `filter` selects, newest last attempt first. `limit` bounds
    /// the items read, so a page may be short and still have a next one.
    fn query_page(
        &self,
        filter: &RecordFilter,
        limit: i32,
        start: Option<&PageToken>,
    ) -> impl Future<Output = Result<Page, ProcessError>> + Send;

    /// The token that resumes a query with `filter` right after `record`.
    fn token_after(&self, record: &DeadLetteredItem, filter: &RecordFilter) -> PageToken;

    /// Takes the lease on one item for `owner`; `false` when the item is not dead and no
    /// expired lease holds it.
    fn acquire_lease(
        &self,
        item_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, ProcessError>> + Send;

    /// [`RecordStore::acquire_lease`] for many items, one result per id in order; one at a
    /// time unless the store can do better (DynamoDB: transactions of 100).
    fn acquire_leases(
        &self,
        item_ids: &[String],
        owner: &str,
        ttl: Duration,
    ) -> impl Future<Output = Vec<Result<bool, ProcessError>>> + Send {
        async move {
            let mut results = Vec::with_capacity(item_ids.len());
            for id in item_ids {
                results.push(self.acquire_lease(id, owner, ttl).await);
            }
            results
        }
    }

    /// Gives `owner`'s lease back; the item returns to dead, unchanged.
    fn release_lease(
        &self,
        item_id: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Marks an item `owner` leases resolved; an error when the lease was lost or a new
    /// failure replaced the payload the run processed
    /// ([`crate::dead_letter::LEASED_WITH_PAYLOAD`]).
    fn resolve(
        &self,
        record: &DeadLetteredItem,
        owner: &str,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Marks an item `owner` leases requeued, as message `message_id` of its source queue;
    /// an error when the lease was lost or a new failure replaced the payload that was sent
    /// ([`crate::dead_letter::LEASED_WITH_PAYLOAD`]).
    fn mark_requeued(
        &self,
        record: &DeadLetteredItem,
        owner: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Appends a failed redrive's attempts to the item's history; it returns to dead.
    fn record_redrive_failure(
        &self,
        item_id: &str,
        owner: &str,
        failures: &[FailureDetail],
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Sets a record still `requeued` with the same requeued message as `record` back to
    /// dead, `failure` appended (the message outlived its queue unfinished). `Ok(false)`:
    /// it changed meanwhile, and nothing was written.
    fn reopen_requeued(
        &self,
        record: &DeadLetteredItem,
        failure: &FailureDetail,
    ) -> impl Future<Output = Result<bool, ProcessError>> + Send;
}

/// The dead-letter queue. A run sweeps it (judging every message, adopting unrecorded ones,
/// deleting those of finished items), holds what it kept while it works, and settles that
/// at its end: those of resolved items are deleted, the rest given back.
pub trait DeadLetterQueue: Send + Sync {
    /// One sweep pass ([`crate::sweep::sweep_dlq`]).
    fn sweep(
        &self,
        options: &SweepOptions,
    ) -> impl Future<Output = Result<Sweep, ProcessError>> + Send;

    /// Settles held messages by their items' status, waiting up to `wait` for redrives in
    /// progress on them to end: deletes those of finished items, holds the rest for
    /// `then` more (zero: gives them back). What it did.
    fn settle_held(
        &self,
        held: BTreeMap<String, Vec<crate::sweep::HeldMessage>>,
        wait: Duration,
        then: Duration,
    ) -> impl Future<Output = Result<crate::sweep::Settled, ProcessError>> + Send;
}

/// Payloads stored apart from their records.
pub trait PayloadStore: Send + Sync {
    /// The payload's body.
    fn fetch(
        &self,
        pointer: &S3Pointer,
    ) -> impl Future<Output = Result<String, ProcessError>> + Send;

    /// Deletes the payload.
    fn delete(&self, pointer: &S3Pointer) -> impl Future<Output = Result<(), ProcessError>> + Send;
}

/// One message to send to a source queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    /// Its id within the batch.
    pub id: String,
    /// The body.
    pub body: String,
    /// Message attributes, at most 10.
    pub attributes: Vec<(String, MessageAttribute)>,
    /// FIFO queues: the message group.
    pub group_id: Option<String>,
    /// FIFO queues: the deduplication id.
    pub deduplication_id: Option<String>,
}

impl OutgoingMessage {
    /// Its size as SQS counts it against the 1 MiB batch limit (body, attribute names,
    /// types and values), with a small allowance per attribute for the encoding.
    pub fn size(&self) -> usize {
        self.body.len()
            + self
                .attributes
                .iter()
                .map(|(name, value)| {
                    name.len()
                        + value.data_type().len()
                        + value.string_value().map_or(0, str::len)
                        + value.binary_base64().map_or(0, |b| b.len() * 3 / 4)
                        + 16
                })
                .sum::<usize>()
    }
}

/// What became of one message of a batch send: the id the queue gave it, or why it was
/// refused.
pub type SendResult = Result<String, String>;

/// SQS's largest message before 2025 (256 KiB), and what a queue takes whose
/// `MaximumMessageSize` cannot be read.
pub const CLASSIC_MESSAGE_MAX: u64 = 262_144;

/// The queues items are requeued to.
pub trait SourceQueue: Send + Sync {
    /// The URL of the queue `name` owned by `account`.
    fn queue_url(
        &self,
        name: &str,
        account: &str,
    ) -> impl Future<Output = Result<String, ProcessError>> + Send;

    /// The largest message `queue_url` takes, in bytes (its `MaximumMessageSize`: up to
    /// 1 MiB), so that a requeue sends a payload inline whenever the queue takes it. An
    /// adapter that cannot ask keeps this default, [`CLASSIC_MESSAGE_MAX`].
    fn maximum_message_size(
        &self,
        queue_url: &str,
    ) -> impl Future<Output = Result<u64, ProcessError>> + Send {
        let _ = queue_url;
        std::future::ready(Ok(CLASSIC_MESSAGE_MAX))
    }

    /// Sends up to 10 messages (1 MiB in all) in one call; one result per message, in
    /// order. An error means the call failed as a whole and no message is known sent.
    fn send_batch(
        &self,
        queue_url: &str,
        messages: &[OutgoingMessage],
    ) -> impl Future<Output = Result<Vec<SendResult>, ProcessError>> + Send;
}

/// Everything the redrive engine runs over.
pub trait RedrivePorts: RecordStore + DeadLetterQueue + PayloadStore + SourceQueue {}

impl<T: RecordStore + DeadLetterQueue + PayloadStore + SourceQueue> RedrivePorts for T {}
