//! The in-memory world the store ports run over in tests ([`super::MemoryStore`]): the
//! dead-letter table, the payload bucket, the DLQ and the source queues, behind one lock
//! that no call holds across an `await`, so that every call is one atomic step.
//!
//! What is modelled is AWS's side, at the level of single calls: a table whose conditional
//! writes are decided by the very [`crate::condition::conditions`] the DynamoDB adapter
//! sends ([`Row::satisfies`]), which refuses an item over 400 KB; a bucket of objects; SQS
//! queues with bodies, attributes, receipts, visibility and FIFO groups ([`Queue`]). The
//! library's logic (recording, the sweep, the redrive engine, purging) runs unchanged above
//! it, as it does above DynamoDB, S3 and SQS (docs/ARCHITECTURE.md §5).
//!
//! Everything a test may turn is a knob, off by default:
//!
//! - faults: an operation fails from its n-th call on ([`WorldState::fail_after`]), or
//!   every call of a service fails with a probability ([`Faults`]) drawn from the world's
//!   seeded generator ([`WorldState::rng`]), so a seed replays exactly;
//! - refusals: a queue refuses the messages naming an item ([`WorldState::refuse_sends_of`]);
//! - latency: a hook gives each call a delay, or a yield ([`WorldState::latency`]), so that
//!   concurrent callers interleave between one call and the next;
//! - an observer called at every change and fault with the whole state
//!   ([`WorldState::observer`]), and room for a caller's own state beside the world's
//!   ([`WorldState::ext`]): the simulation keeps its ledger, trace and invariant checks
//!   there (docs/SIMULATION.md).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::Clock;
use crate::condition::{Condition, StoredRecord};
use crate::dead_letter::DeadLetteredItem;
use crate::error::{ErrorClass, ProcessError};
use crate::ports::OutgoingMessage;
use crate::random::Random;

use super::queue::{Queue, QueueMessage};

/// DynamoDB's item size limit.
pub const ITEM_SIZE_LIMIT: usize = 400 * 1024;

/// One item of the dead-letter table: the record and the attributes the record type does
/// not carry (attempt ids, DLQ claims and sends, the lease owner).
#[derive(Debug, Clone)]
pub struct Row {
    /// The record.
    pub record: DeadLetteredItem,
    /// Ids of the attempts in its history (and of compacted ones, while not trimmed).
    pub attempt_ids: BTreeSet<String>,
    /// Claims on DLQ messages, as elements ([`crate::dead_letter::DlqClaim::element`]).
    pub claims: BTreeSet<String>,
    /// Source message ids whose DLQ message was sent.
    pub sent: BTreeSet<String>,
    /// The ids in `sent` whose every history entry compaction dropped, oldest first.
    pub forgotten_sent: Vec<String>,
    /// Who holds the lease.
    pub lease_owner: Option<String>,
    /// Damaged outside the pipeline (a hand edit, an older schema): it reads without a
    /// status and refuses every write, a poison the tools must survive.
    pub corrupt: bool,
}

impl Row {
    /// Returns a row holding `record`, its attempts' ids and nothing else.
    pub fn of(record: DeadLetteredItem) -> Row {
        Row {
            attempt_ids: record
                .failure_history
                .iter()
                .map(|f| f.attempt_id.clone())
                .collect(),
            record,
            claims: BTreeSet::new(),
            sent: BTreeSet::new(),
            forgotten_sent: Vec::new(),
            lease_owner: None,
            corrupt: false,
        }
    }

    /// Tells whether `condition` (the one the DynamoDB adapter sends, from
    /// [`crate::condition::conditions`]) holds for this row as stored.
    pub fn satisfies(&self, condition: &Condition) -> bool {
        let ids = |id: &str| self.attempt_ids.contains(id);
        let claims = |id: &str| self.claims.contains(id);
        let sent = |id: &str| self.sent.contains(id);
        let stored = StoredRecord {
            record: &self.record,
            lease_owner: self.lease_owner.as_deref(),
            // DynamoDB keeps no empty set: the attribute is missing.
            attempt_ids: (!self.attempt_ids.is_empty()).then_some(&ids as &dyn Fn(&str) -> bool),
            claims: (!self.claims.is_empty()).then_some(&claims as &dyn Fn(&str) -> bool),
            sent: (!self.sent.is_empty()).then_some(&sent as &dyn Fn(&str) -> bool),
        };
        condition.holds(Some(&stored))
    }

    /// Returns its size as DynamoDB would count it, near enough (the record as JSON plus
    /// the sets).
    pub fn size(&self) -> usize {
        serde_json::to_vec(&self.record).map_or(0, |v| v.len())
            + self.attempt_ids.iter().map(|s| s.len() + 3).sum::<usize>()
            + self.claims.iter().map(|s| s.len() + 3).sum::<usize>()
            + self.sent.iter().map(|s| s.len() + 3).sum::<usize>()
            + self
                .forgotten_sent
                .iter()
                .map(|s| s.len() + 3)
                .sum::<usize>()
    }
}

/// Tells whether `condition` holds for the row `row` (`None`: no item), as DynamoDB evaluates it.
pub fn satisfied(row: Option<&Row>, condition: &Condition) -> bool {
    row.map_or_else(|| condition.holds(None), |row| row.satisfies(condition))
}

/// Failure rates by service, each call failing with that probability (drawn from the
/// world's generator). All zero by default.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// A DynamoDB call fails (throttled or unavailable, half and half).
    pub table: f64,
    /// An S3 call fails.
    pub bucket: f64,
    /// An SQS send (a DLQ message, a requeue, a rotation's copy) fails.
    pub send: f64,
    /// Faults are over for good: no rate applies any more.
    pub healed: bool,
}

/// What an observer is told ([`WorldState::observer`]), besides who called.
#[derive(Debug)]
pub enum Event<'a> {
    /// A call failed by a fault knob: `what` names the call and the error.
    Fault {
        /// The item the call concerned, or `-`.
        item: &'a str,
        /// The call and its error.
        what: &'a str,
    },
    /// A change of the world's state, described.
    Step {
        /// The item it concerns, or `-`.
        item: &'a str,
        /// What changed.
        what: &'a str,
    },
    /// What a call saw, changing nothing worth a step (a message a sweep received).
    Note {
        /// The item it concerns, or `-`.
        item: &'a str,
        /// What was seen.
        what: &'a str,
    },
    /// A write leaving the record `item` as a row of `size` bytes; refused past
    /// [`ITEM_SIZE_LIMIT`], as DynamoDB refuses it.
    RowWrite {
        /// The item.
        item: &'a str,
        /// The row's size.
        size: usize,
    },
    /// Attempts about to be appended to the record `item` (the write may still be refused
    /// for its size).
    Appending {
        /// The item.
        item: &'a str,
        /// The attempts' ids.
        attempt_ids: &'a [&'a str],
    },
    /// A delivery of source message `message_id` recorded under `item`.
    Recorded {
        /// The item.
        item: &'a str,
        /// The source message.
        message_id: &'a str,
        /// Whether the write took the message's DLQ claim.
        claimed: bool,
    },
    /// A recording write refused by its condition; `claim`: the DLQ message it asked to
    /// claim.
    RecordRefused {
        /// The item.
        item: &'a str,
        /// The claim asked for.
        claim: Option<&'a crate::dead_letter::DlqClaim>,
    },
    /// A worker's DLQ message about to be sent for `record` (the send accepted).
    DeadLetterSending {
        /// The record as the worker made it: its history is this delivery's attempts.
        record: &'a crate::dead_letter::DeadLetteredItem,
    },
    /// A recording write that took its claim while a later receive held the message's
    /// claim (the two deliveries overlapped): the write's delivery will not send.
    ClaimSuperseded {
        /// The item.
        item: &'a str,
        /// The claim the write took.
        claim: &'a crate::dead_letter::DlqClaim,
    },
    /// A DLQ message deleted.
    DlqMessageDeleted {
        /// The message, as it was.
        message: &'a QueueMessage,
    },
    /// A payload object deleted, with what it held.
    PayloadDeleted {
        /// Its key.
        key: &'a str,
        /// Its body.
        body: &'a str,
    },
    /// A message SQS refused for a character outside its set (`InvalidMessageContents`):
    /// a message built wrong, which no retry will fix.
    ContentsRefused {
        /// The item the message names, or `-`.
        item: &'a str,
        /// The call that sent it.
        call: &'a str,
    },
    /// A record write DynamoDB refuses as malformed (`ValidationException`: a string set
    /// with a duplicate or no element): a write built wrong, which no retry will fix.
    WriteMalformed {
        /// The item.
        item: &'a str,
        /// The call that wrote, and why it is refused.
        what: &'a str,
    },
    /// A record deleted, as it was.
    RecordDeleted {
        /// The item.
        item: &'a str,
        /// The row deleted.
        row: &'a Row,
    },
}

/// Called at every [`Event`], with the state and the caller's name.
pub type Observer<X> = fn(&mut WorldState<X>, &str, &Event<'_>);

/// The latency of one call of the operation named (a port method's name): `None`, none at
/// all; zero, a yield to the other tasks; else a sleep (on tokio's clock).
pub type Latency<X> = fn(&mut WorldState<X>, &str) -> Option<Duration>;

/// The whole state of a world; `X` is room for a caller's own.
#[derive(Debug)]
pub struct WorldState<X = ()> {
    /// The dead-letter table, by item id.
    pub table: BTreeMap<String, Row>,
    /// The payload bucket(s): objects by bucket and key.
    pub bucket: BTreeMap<(String, String), String>,
    /// The dead-letter queue.
    pub dlq: Queue,
    /// The source queues.
    pub sources: Vec<Queue>,
    /// Whether looking up a queue that does not exist creates it (a test's convenience);
    /// otherwise it is not found, as SQS answers.
    pub opens_queues: bool,
    /// Records per query page (DynamoDB's 1 MB page, in records).
    pub page_size: i32,
    /// Failure rates.
    pub faults: Faults,
    /// Every message sent to a source queue, with the queue's URL, in order.
    pub sent: Vec<(String, OutgoingMessage)>,
    /// The seeded generator every random fault and latency is drawn from.
    pub rng: fastrand::Rng,
    /// Called at every event.
    pub observer: Option<Observer<X>>,
    /// Each call's latency.
    pub latency: Option<Latency<X>>,
    /// The caller's own state.
    pub ext: X,
    /// Operations that fail, by name, with the calls they still let through.
    failing: BTreeMap<String, u32>,
    /// Items whose messages every queue refuses.
    refused: BTreeSet<String>,
}

impl<X: Default> Default for WorldState<X> {
    fn default() -> Self {
        WorldState::new(0, Queue::new("dlq", None), X::default())
    }
}

impl<X> WorldState<X> {
    /// Creates an empty world: no record, object or source queue, the DLQ `dlq`, random draws
    /// from `seed`, every knob off.
    pub fn new(seed: u64, dlq: Queue, ext: X) -> Self {
        WorldState {
            table: BTreeMap::new(),
            bucket: BTreeMap::new(),
            dlq,
            sources: Vec::new(),
            opens_queues: false,
            page_size: 100,
            faults: Faults::default(),
            sent: Vec::new(),
            rng: fastrand::Rng::with_seed(seed),
            observer: None,
            latency: None,
            ext,
            failing: BTreeMap::new(),
            refused: BTreeSet::new(),
        }
    }

    /// Tells the observer, if any, of `event` by `actor`.
    pub fn observe(&mut self, actor: &str, event: &Event<'_>) {
        if let Some(observer) = self.observer {
            observer(self, actor, event);
        }
    }

    /// Tells the observer of a [`Event::Step`].
    pub fn step(&mut self, actor: &str, item: &str, what: &str) {
        self.observe(actor, &Event::Step { item, what });
    }

    /// Tells whether a failure is injected now, with probability `p` (never once healed).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && !self.faults.healed && self.rng.f64() < p
    }

    /// Tells whether the fault rate `pick` names strikes this call.
    pub fn chance_of(&mut self, pick: fn(&Faults) -> f64) -> bool {
        let p = pick(&self.faults);
        self.chance(p)
    }

    /// Makes the operation `name` (a port method's name: `resolve`, `send_batch`,
    /// `receive`, ...) fail from now on.
    pub fn fail(&mut self, name: &str) {
        self.fail_after(name, 0);
    }

    /// Makes the operation `name` fail after `calls` more calls.
    pub fn fail_after(&mut self, name: &str, calls: u32) {
        self.failing.insert(name.to_string(), calls);
    }

    /// Makes every queue refuse the messages whose `item_id` attribute names `item_id`
    /// (an entry of a batch send refused, the rest sent).
    pub fn refuse_sends_of(&mut self, item_id: &str) {
        self.refused.insert(item_id.to_string());
    }

    /// Takes back [`WorldState::refuse_sends_of`].
    pub fn allow_sends_of(&mut self, item_id: &str) {
        self.refused.remove(item_id);
    }

    /// Tells whether the queues refuse messages naming `item_id`.
    pub fn refuses(&self, item_id: &str) -> bool {
        self.refused.contains(item_id)
    }

    /// Returns the failure [`WorldState::fail_after`] injects into this call of `name`, if any.
    pub fn injected(&mut self, name: &str) -> Result<(), ProcessError> {
        match self.failing.get_mut(name) {
            Some(0) => Err(ProcessError::new(
                ErrorClass::Throttled,
                format!("{name} failed (injected)"),
            )
            .with_step(name)),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Returns the source queue at `url`.
    pub fn source_at(&mut self, url: &str) -> Option<&mut Queue> {
        self.sources.iter_mut().find(|q| q.url == url)
    }
}

/// A world: its state behind one lock, and the clock and randomness it is read by.
///
/// A [`MemoryStore`](crate::testing::MemoryStore) makes one, and a test reaches into it to
/// look at what the ports left, or to make an operation fail:
///
/// ```
/// use sqs_keeper_core::ports::RecordStore;
/// use sqs_keeper_core::testing::{dead_record, MemoryStore};
/// use sqs_keeper_core::ErrorClass;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// store.insert_dead_lettered(dead_record("order-7", ErrorClass::Throttled, 2));
/// assert_eq!(store.world().lock().table.len(), 1);
///
/// // The table's reads fail from now on, as a throttled DynamoDB's would.
/// store.world().lock().fail("get");
/// let read = store.get("order-7").await;
/// assert_eq!(read.unwrap_err().class, ErrorClass::Throttled);
/// # });
/// ```
#[derive(Debug)]
pub struct World<X = ()> {
    state: Mutex<WorldState<X>>,
    /// Wakes whoever waits for a message to be sent to a source queue (a long poll
    /// returns as soon as one arrives).
    pub arrivals: tokio::sync::Notify,
    /// The wall clock records are stamped, leases judged and messages sent, received and
    /// expired by (the system clock unless set; a simulation's follows tokio's).
    pub clock: Clock,
    /// The randomness the library's parts in this world draw from (jitter, sweep markers):
    /// the thread's generator unless set; a simulation's is seeded, so a seed replays. The
    /// world's own faults and latencies are drawn from [`WorldState::rng`].
    pub random: Random,
}

impl<X> World<X> {
    /// Creates a world over `state`, read by the system clock and the thread's generator.
    pub fn new(state: WorldState<X>) -> Self {
        World {
            state: Mutex::new(state),
            arrivals: tokio::sync::Notify::new(),
            clock: Clock::system(),
            random: Random::default(),
        }
    }

    /// Returns the world read by `clock`.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Returns the world's library parts drawing from `random`.
    pub fn with_random(mut self, random: Random) -> Self {
        self.random = random;
        self
    }

    /// Returns the time now, in milliseconds since the epoch, by the world's clock.
    pub fn now_ms(&self) -> i64 {
        self.clock.now().timestamp_millis()
    }

    /// Returns the state, for one step.
    pub fn lock(&self) -> MutexGuard<'_, WorldState<X>> {
        // A panic elsewhere is reported by the test that panicked; carry on with the data.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
