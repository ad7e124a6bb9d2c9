//! The store's ports, one per AWS resource it stands for: what the library's logic
//! (dead-letter recording, the DLQ sweep and its rule, the redrive engine, purging) needs
//! of the outside world, each an operation that decides nothing, so that the logic runs the
//! same over DynamoDB, SQS and S3 (`sqs_keeper_aws::DeadLetterStore` implements all
//! four) and over the in-memory world the tests and the simulation use
//! ([`crate::testing::MemoryStore`]). See docs/ARCHITECTURE.md §5.
//!
//! | port | what it is | production adapter |
//! | --- | --- | --- |
//! | [`RecordStore`] | the dead-letter records: reads, the recording writes (append and claim, marks, review flag, compaction), leases and status changes, the worker's finishes, deletes | DynamoDB table |
//! | [`DeadLetterQueue`] | the DLQ's messages: receive, adopt, delete, hold, rotate (FIFO), and the dead-letter messages sent to it | SQS queue |
//! | [`PayloadStore`] | payloads too large to keep inline: fetch, put, delete | S3 bucket |
//! | [`SourceQueue`] | the queues items are requeued to | SQS |
//!
//! What the ports pass beside records lives here too ([`Expect`], [`Deliveries`],
//! [`Compaction`], [`Standing`], [`MessageView`], [`ReceivedMessage`], [`Adoption`]), so
//! that the modules over the ports ([`crate::recording`], [`crate::sweep`],
//! [`crate::removal`], [`crate::redrive`]) import this one and it imports none of them; they
//! re-export what they speak of.
//!
//! The batch engine's ports are [`crate::Processor`], [`crate::dead_letter::DeadLetterSink`] (which the
//! adapters implement with [`crate::recording::dead_letter`] over these ports) and
//! [`crate::batch::BodyResolver`].

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use crate::clock::Clock;
use crate::dead_letter::{
    processed_key_for_message, processed_key_for_payload, DeadLetteredItem, FailureDetail,
    ItemStatus, MessageAttribute, REQUEUED_BY_ATTRIBUTE,
};
use crate::error::ProcessError;
use crate::item::ItemParser;
use crate::message::PAYLOAD_SHA256_ATTRIBUTE;
use crate::pointer::S3Pointer;
use crate::selection::{Page, PageToken, RecordFilter};

/// The dead-letter records (a DynamoDB table). Every write that changes an item's status is
/// conditional (docs/ARCHITECTURE.md §3): two runs never both act on one item, and no write
/// overwrites another writer's work.
pub trait RecordStore: Send + Sync {
    /// Returns the wall clock this store stamps records and leases by. Whoever judges them reads
    /// it too (the settling of held DLQ messages, a redrive's engine), so that a lease is
    /// live or expired by the clock that set it.
    fn clock(&self) -> Clock;

    /// Reads one record by item id (strongly consistent); `None` when there is none.
    fn get(
        &self,
        item_id: &str,
    ) -> impl Future<Output = Result<Option<DeadLetteredItem>, ProcessError>> + Send;

    /// Reads one page of the records `filter` selects, newest last attempt first. `limit` bounds
    /// the items read, so a page may be short and still have a next one.
    fn query_page(
        &self,
        filter: &RecordFilter,
        limit: i32,
        start: Option<&PageToken>,
    ) -> impl Future<Output = Result<Page, ProcessError>> + Send;

    /// Returns the token that resumes a query with `filter` right after `record`.
    fn token_after(&self, record: &DeadLetteredItem, filter: &RecordFilter) -> PageToken;

    /// Returns what the sweep needs of each existing record among `ids` (strongly consistent). An
    /// id that could not be read is an error, never a missing record (a record taken for
    /// missing would be adopted over).
    fn standings(
        &self,
        ids: &[String],
    ) -> impl Future<Output = Result<HashMap<String, Standing>, ProcessError>> + Send;

    /// Returns what a record holds of its deliveries (strongly consistent): its attempt ids, the
    /// source message ids whose DLQ message was claimed, and those whose DLQ message was
    /// sent.
    fn deliveries(
        &self,
        item_id: &str,
    ) -> impl Future<Output = Result<Deliveries, ProcessError>> + Send;

    /// Makes one conditional write appending `pending` to the record (creating it if absent) and,
    /// with `claim`, adding it to the DLQ claims. It is refused when a pending attempt id
    /// is already recorded, or when the claim's element is already there or its message's
    /// DLQ message is sent ([`crate::condition::conditions::records_attempts`]).
    /// `Ok(Some(written))` is the record as written with its claims, `Ok(None)` a refused
    /// condition (including `expect`, what the record must be for the write to happen).
    fn try_record(
        &self,
        record: &DeadLetteredItem,
        pending: &[FailureDetail],
        claim: Option<&crate::dead_letter::DlqClaim>,
        expect: Expect,
    ) -> impl Future<Output = Result<Option<Written>, ProcessError>> + Send;

    /// Marks DLQ messages sent, each `(item id, source message id)`, on existing records
    /// only: a later delivery of such a message (its acknowledgement was lost) is then
    /// acknowledged instead of sent back. Batched by the store (a dead letter should cost
    /// one write, not two).
    fn mark_sent(
        &self,
        sent: &[(&str, &str)],
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Sets `manual_review_required`.
    fn set_review_flag(
        &self,
        item_id: &str,
        wanted: bool,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Writes `compaction` if the record's `failure_count` and `history_omitted` are still
    /// `stored`'s ([`crate::condition::conditions::compacts`]). `Ok(())` also when that
    /// condition fails: another writer appended (and compacts) or compacted already.
    fn compact(
        &self,
        stored: &DeadLetteredItem,
        compaction: &Compaction,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Gives up `claim` (its send failed), so that the next delivery of the message, or
    /// the same delivery invoked again, sends it.
    fn release_claim(
        &self,
        item_id: &str,
        claim: &crate::dead_letter::DlqClaim,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

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

    /// Marks an item `owner` leases resolved, its payload listed processed
    /// ([`crate::dead_letter::processed_after`]); an error when the lease was lost or a new
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

    /// Appends a failed redrive's attempts to the item's history; it returns to dead (the
    /// review flag and compaction follow, [`crate::recording::after_append`]).
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

    /// Resolves the record `item_id` after the worker finished `message_id`, the message
    /// the redrive run `requeued_by` sent back with a payload of digest `payload_sha256`,
    /// when the record waits for that message or that run still holds it with that
    /// payload (the worker can finish the message before the run marked it requeued);
    /// anything else is left as it is ([`crate::dead_letter::DeadLetterSink::finish_requeued`]).
    fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
        requeued_by: &str,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Resolves the record `item_id` after the worker finished `message_id`, a DLQ message
    /// moved back to the source queue from outside holding the delivery `dead_lettered`,
    /// when it is dead holding that payload; anything else is left as it is
    /// ([`crate::dead_letter::DeadLetterSink::finish_moved_back`]).
    fn finish_moved_back(
        &self,
        item_id: &str,
        dead_lettered: &str,
        message_id: &str,
        payload_sha256: &str,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Deletes each of `selected` (at most 25) on the condition that it is still as it was
    /// selected ([`Selected::condition`]). Returns the ids deleted; a record that changed
    /// since (a new failure arrived, a redrive took it) is kept.
    fn delete_records(
        &self,
        selected: &[Selected],
    ) -> impl Future<Output = Result<Vec<String>, ProcessError>> + Send;
}

/// The dead-letter queue (an SQS queue): the dead-letter messages recording sends to it,
/// and what the sweep does with its messages (receive, adopt, delete, hold, rotate). Each
/// operation is one SQS call or a few and decides nothing; the sweep and its rule are
/// [`crate::sweep::sweep_dlq`] and [`crate::sweep::decide`].
pub trait DeadLetterQueue: Send + Sync {
    /// The raw message a record may have to be adopted from.
    type Message: Clone + Send + Sync;

    /// Sends one DLQ message per record (batched): its payload, or a pointer to it, with
    /// the attributes that join it to its record. One result per record, in order.
    fn send_to_dlq(
        &self,
        records: &[&DeadLetteredItem],
    ) -> impl Future<Output = Vec<Result<(), ProcessError>>> + Send;

    /// Up to 10 visible DLQ messages, each held invisible for `hold`, with the item id each
    /// is tracked by (via `parser`); empty only when none is visible in the whole queue
    /// (a long poll, not a sample of its servers).
    fn receive(
        &self,
        hold: Duration,
        parser: &ItemParser,
    ) -> impl Future<Output = Result<Vec<ReceivedMessage<Self::Message>>, ProcessError>> + Send;

    /// Creates (or reopens) the record of `message` under `item_id` (the id the message is
    /// tracked by), with the message's payload (an SQS Extended Client pointer resolved):
    /// the record [`crate::sweep::adopted_record`] makes, written as any dead-letter record
    /// is ([`crate::recording::adopt`], over the adapter's [`RecordStore`]), on the condition
    /// that the record is still as judged (none; or, reopening, the status the sweep saw).
    /// `Ok(None)`: it changed meanwhile, and nothing was written. The one DLQ operation
    /// that writes a record: reading the message as the worker would is the adapter's.
    fn adopt(
        &self,
        message: &Self::Message,
        item_id: &str,
        parser: &ItemParser,
        adoption: &Adoption,
    ) -> impl Future<Output = Result<Option<DeadLetteredItem>, ProcessError>> + Send;

    /// Deletes messages by receipt; how many were deleted.
    fn delete_messages(
        &self,
        receipts: &[String],
    ) -> impl Future<Output = Result<usize, ProcessError>> + Send;

    /// Holds messages invisible for `hold` from now (`Duration::ZERO`: visible at once).
    fn hold(
        &self,
        receipts: &[String],
        hold: Duration,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Tells whether the DLQ is a FIFO queue, where a message held blocks every later message of
    /// its group.
    fn is_fifo(&self) -> bool {
        false
    }

    /// Moves a message of a FIFO DLQ behind the rest of its group: sends a copy marked with
    /// `pass` (same body, attributes and group; its source message id kept), then deletes
    /// the original by `receipt`. `Ok(false)`: no copy could be made (the original stays
    /// where it is). A crash between the two leaves both, with the same content: each is
    /// judged as the other.
    ///
    /// The copy is tracked as its original is, by every sweep after: where its body names
    /// no item, by the original's message id it carries
    /// ([`crate::message::original_message_id`]), not by its own new id (found by the
    /// simulation, seed 169). No item id is written onto it. A purge's sweep names items
    /// without the worker's parser, and a copy stamped with its guess was adopted under the
    /// source message's id instead of the item its payload names (seed 713214).
    fn rotate(
        &self,
        message: &Self::Message,
        receipt: &str,
        pass: &str,
    ) -> impl Future<Output = Result<bool, ProcessError>> + Send {
        let _ = (message, receipt, pass);
        async { Ok(false) }
    }
}

/// Payloads stored apart from their records (an S3 bucket).
pub trait PayloadStore: Send + Sync {
    /// Returns the payload's body.
    fn fetch(
        &self,
        pointer: &S3Pointer,
    ) -> impl Future<Output = Result<String, ProcessError>> + Send;

    /// Stores a payload too large to keep inline, under `pointer`; `sha256` is its digest.
    fn put(
        &self,
        pointer: &S3Pointer,
        body: &str,
        sha256: &str,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

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
    /// The X-Ray trace header sent as the `AWSTraceHeader` system attribute: the trace the
    /// message continues.
    pub trace_header: Option<String>,
}

impl OutgoingMessage {
    /// Returns its size as SQS counts it against the 1 MiB batch limit (body, attribute
    /// names, types and values), with a small allowance per attribute for the encoding.
    pub fn size(&self) -> usize {
        self.body.len()
            + self.trace_header.as_ref().map_or(0, |h| h.len() + 32)
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

/// SQS's longest message retention (14 days).
pub const SQS_MAX_RETENTION: std::time::Duration = std::time::Duration::from_secs(14 * 86_400);

/// The queues items are requeued to.
pub trait SourceQueue: Send + Sync {
    /// Returns the URL of the queue `name` owned by `account`.
    fn queue_url(
        &self,
        name: &str,
        account: &str,
    ) -> impl Future<Output = Result<String, ProcessError>> + Send;

    /// Returns the largest message `queue_url` takes, in bytes (its `MaximumMessageSize`: up to
    /// 1 MiB), so that a requeue sends a payload inline whenever the queue takes it. An
    /// adapter that cannot ask keeps this default, [`CLASSIC_MESSAGE_MAX`].
    fn maximum_message_size(
        &self,
        queue_url: &str,
    ) -> impl Future<Output = Result<u64, ProcessError>> + Send {
        let _ = queue_url;
        std::future::ready(Ok(CLASSIC_MESSAGE_MAX))
    }

    /// Returns how long `queue_url` keeps a message (its `MessageRetentionPeriod`), so that a
    /// record requeued there is set back to dead once its message must be gone. An
    /// adapter that cannot ask keeps this default, SQS's longest: 14 days.
    fn message_retention(
        &self,
        queue_url: &str,
    ) -> impl Future<Output = Result<std::time::Duration, ProcessError>> + Send {
        let _ = queue_url;
        std::future::ready(Ok(SQS_MAX_RETENTION))
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

// ---------------------------------------------------------------------------------------
// What the ports pass.
// ---------------------------------------------------------------------------------------

/// What a write expects of the record it would change.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Expect {
    /// Anything, or nothing (the worker's upsert).
    Any,
    /// No record: the sweep adopting a DLQ message no record held.
    Absent,
    /// A record of this status that still lists none of `not_processed` as processed: the
    /// sweep reopening a record it judged so, for a message (with those keys) the record
    /// had not processed. A record that processed it since is not reopened.
    Status {
        /// The status judged.
        status: ItemStatus,
        /// The message's `processed` keys.
        not_processed: Vec<String>,
    },
}

impl Expect {
    /// Returns what an adoption judged: no record (`None`), or one of that status that had not
    /// processed the message of `keys`.
    pub fn judged(status: Option<ItemStatus>, keys: &[String]) -> Expect {
        match status {
            None => Expect::Absent,
            Some(status) => Expect::Status {
                status,
                not_processed: keys.to_vec(),
            },
        }
    }

    /// Tells whether a record of `status` listing `processed` (`None`: no record) meets it.
    pub fn admits(&self, status: Option<ItemStatus>, processed: &[String]) -> bool {
        match self {
            Expect::Any => true,
            Expect::Absent => status.is_none(),
            Expect::Status {
                status: expected,
                not_processed,
            } => status == Some(*expected) && !not_processed.iter().any(|k| processed.contains(k)),
        }
    }
}

/// What a record holds of its deliveries ([`RecordStore::deliveries`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deliveries {
    /// The ids of the attempts recorded.
    pub attempt_ids: HashSet<String>,
    /// The claims on DLQ messages, as elements ([`crate::dead_letter::DlqClaim::element`]).
    pub claims: HashSet<String>,
    /// The source message ids whose DLQ message was sent.
    pub sent: HashSet<String>,
}

impl Written {
    /// Returns `record` as a write left it, its attempt ids, claims and sent marks not
    /// read. Compaction then keeps every claim at a latest receive, and every "sent" mark.
    pub fn record_only(record: DeadLetteredItem) -> Written {
        Written {
            record,
            attempt_ids: HashSet::new(),
            claims: HashSet::new(),
            sent: HashSet::new(),
            forgotten_sent: None,
        }
    }
}

/// A record as a recording write left it ([`RecordStore::try_record`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The record.
    pub record: DeadLetteredItem,
    /// The ids of the attempts recorded, as the write left them. Compaction keeps some of
    /// those whose entries an earlier compaction dropped
    /// ([`crate::recording::compaction_of`]).
    pub attempt_ids: HashSet<String>,
    /// The claims on DLQ messages beside it, as elements ([`crate::dead_letter::DlqClaim::element`]).
    /// A claim a later receive took shows here, so that an earlier delivery still running
    /// does not send beside it.
    pub claims: HashSet<String>,
    /// The source message ids whose DLQ message is marked sent, as the write left them. A
    /// claim on a message not among them is a DLQ send in progress (or cut), and
    /// compaction keeps it ([`crate::recording::compaction_of`]).
    pub sent: HashSet<String>,
    /// The ids in `sent` whose every history entry compaction dropped, oldest first
    /// ([`crate::recording::SENT_MARKS_FORGOTTEN_MAX`] at most). `None`: the marks were not
    /// read, and compaction leaves them as they are.
    pub forgotten_sent: Option<Vec<String>>,
}

/// What compacting a record's history writes: the history kept, and with it the attempt
/// ids still needed, the DLQ claims that go, the `processed` list trimmed, and how many entries go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    /// The entries kept: the first attempts and the latest ones
    /// ([`crate::dead_letter::compact_history`]).
    pub history: Vec<FailureDetail>,
    /// The ids of the kept entries. The ids of dropped attempts go with them: `attempt_ids`
    /// would otherwise grow by one id per attempt for ever.
    pub attempt_ids: Vec<String>,
    /// The claim elements that go: the claims of messages marked sent whose every entry
    /// goes, and the claims two or more receives before a message's latest (a later
    /// receive took them over). The set would otherwise grow with every cut delivery.
    pub dropped_claims: Vec<String>,
    /// The new list of "sent" marks whose message has no entry left, oldest first
    /// ([`Written::forgotten_sent`]). `None`: left as it is (the marks were not read).
    pub forgotten_sent: Option<Vec<String>>,
    /// The "sent" marks that go: the oldest of that list, past
    /// [`crate::recording::SENT_MARKS_FORGOTTEN_MAX`]. `dlq_sent` would otherwise grow for
    /// ever.
    pub unmarked: Vec<String>,
    /// The latest [`crate::dead_letter::PROCESSED_LIMIT`] entries of `processed` (a finished
    /// requeue appends to it without trimming it: trimmed here).
    pub processed: Vec<String>,
    /// Entries dropped, added to `history_omitted`.
    pub dropped: u32,
}

/// A record as a removal selected it. One condition decides its removal: the record is
/// deleted only while it still has the status and last attempt it was selected with
/// ([`Selected::condition`]). Its DLQ messages are deleted only once that delete succeeded.
/// A redrive that fails the item again between the two thus keeps both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The item's id.
    pub item_id: String,
    /// Its status when selected; never an in-flight one ([`ItemStatus::is_in_flight`]).
    pub status: ItemStatus,
    /// Its last attempt when selected, as stored.
    pub last_attempt: String,
    /// What a purge's sweep judges its DLQ messages by ([`crate::sweep::purge_takes`]).
    pub standing: Standing,
}

impl Selected {
    /// Returns `record` as selected now.
    pub fn of(record: &DeadLetteredItem) -> Selected {
        Selected {
            item_id: record.item_id.clone(),
            status: record.status,
            last_attempt: crate::time_format::format(&record.last_attempt),
            standing: Standing::of(record),
        }
    }

    /// Returns the condition of its delete: still the status and last attempt selected, and never
    /// in flight (a status selected in flight matches no record).
    pub fn condition(&self) -> crate::condition::Condition {
        if self.status.is_in_flight()
            && !crate::mutants::is_on(crate::mutants::Mutant::PurgeRemovesInFlight)
        {
            return crate::condition::Condition::NotExists(crate::condition::attr::ITEM_ID);
        }
        crate::condition::conditions::unchanged_since(self.status, &self.last_attempt)
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
    /// Returns what the sweep judges of `record`.
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

    /// Tells whether a live run is redriving the item (not one that died holding its lease): its
    /// lease expires at or after `now`, as the store judges it
    /// ([`crate::condition::conditions::lease_is_free`], a lease expired strictly before `now`), so a
    /// lease is live through its last second. A dead item whose run still holds a live lease
    /// (a worker's new failure meanwhile) is not redriving: its messages wait as a dead
    /// item's, though the store lets no other run take it.
    pub fn leased_at(&self, now: i64) -> bool {
        self.status == Some(ItemStatus::Redriving)
            && self.lease_expires_at.is_some_and(|e| e >= now)
    }

    /// Tells whether `message` holds the record's current payload.
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
    /// Returns the view of DLQ message `message_id` with `body`, whose string message attributes
    /// `attribute` gives (docs/ARCHITECTURE.md §4):
    ///
    /// - the source message is our `source_message_id` attribute where the message carries
    ///   our `item_id` too (our DLQ messages and requeues carry both), else its own id (a
    ///   message the queue's redrive policy moved keeps its id);
    /// - the payload digest is the body's own; for an Extended-Client pointer into
    ///   `own_bucket` (the dead-letter store's payloads, content-addressed by
    ///   [`crate::pointer::payload_key`]) the digest its key ends with, when our
    ///   `payload_sha256` attribute states the same, and the digest of the pointer's own
    ///   text; any other pointer's payload is unknown.
    pub fn of<'a>(
        message_id: &str,
        body: &str,
        attribute: impl Fn(&str) -> Option<&'a str>,
        own_bucket: &str,
    ) -> MessageView {
        Self::of_dlq_message(message_id, body, attribute, own_bucket, false)
    }

    /// Runs [`MessageView::of`] on a DLQ message that may be a copy a sweep's FIFO rotation
    /// sent (`rotated`). Such a copy holds its original's delivery, whose id it carries in
    /// our `source_message_id` attribute ([`crate::message::original_message_id`]).
    pub fn of_dlq_message<'a>(
        message_id: &str,
        body: &str,
        attribute: impl Fn(&str) -> Option<&'a str>,
        own_bucket: &str,
        rotated: bool,
    ) -> MessageView {
        let pointer = S3Pointer::parse(body);
        MessageView {
            message_id: message_id.to_string(),
            // A producer's message keeps its attributes into the DLQ: one naming a processed
            // delivery, holding a pointer whose payload is unknown, would be deleted as that
            // delivery.
            source_message_id: crate::message::original_message_id(&attribute, message_id, rotated),
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
                .filter(|p| p.bucket == own_bucket && crate::pointer::is_payload_key(&p.key))
                .map(|_| crate::hex::sha256_hex(body.as_bytes())),
            requeued_by: attribute(REQUEUED_BY_ATTRIBUTE).map(str::to_string),
        }
    }

    /// Returns the keys under which a record lists this message as processed: its content's
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

    /// Returns the digests its content is known by (none: unknown).
    pub fn digests(&self) -> impl Iterator<Item = &str> {
        self.payload_sha256
            .iter()
            .chain(self.pointer_sha256.iter())
            .map(String::as_str)
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
    /// The sweep pass whose FIFO rotation sent it, if one did ([`DeadLetterQueue::rotate`]).
    pub marker: Option<String>,
    /// When it was sent (epoch ms; SQS's `SentTimestamp`), when known.
    pub sent_at_ms: Option<i64>,
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
    /// Returns what an adoption does when the message's payload is an Extended-Client pointer whose
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
