//! The simulated world's state: the source queue and the DLQ, the dead-letter table, the
//! payload bucket, the fault switches, the ledger of what was sent and delivered, and the
//! trace. Everything sits behind one lock that no one holds across an `await`, so every
//! change is one atomic step, and the invariants that must hold at every step are checked
//! right after it ([`State::after_step`]).

use sqs_keeper_core::{Condition, StoredRecord};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use sqs_keeper_core::{Clock, Random};
use sqs_keeper_core::{DeadLetteredItem, ItemStatus};

use crate::queue::SimQueue;
use crate::trace::Trace;

/// DynamoDB's item size limit.
pub const ITEM_SIZE_LIMIT: usize = 400 * 1024;

/// One item of the dead-letter table: the record and the attributes the record type does
/// not carry (attempt ids, DLQ claims, the lease owner).
#[derive(Debug, Clone)]
pub struct Row {
    /// The record.
    pub record: DeadLetteredItem,
    /// Ids of the attempts in its history (and of compacted ones, while not trimmed).
    pub attempt_ids: BTreeSet<String>,
    /// Source message ids whose one DLQ message was claimed.
    pub claims: BTreeSet<String>,
    /// Source message ids whose DLQ message was sent.
    pub sent: BTreeSet<String>,
    /// Who holds the lease.
    pub lease_owner: Option<String>,
    /// Damaged outside the pipeline (a hand edit, an older schema): it reads without a
    /// status and refuses every write, a poison the tools must survive.
    pub corrupt: bool,
}

impl Row {
    /// Whether `condition` (the one the DynamoDB adapter sends, from
    /// [`sqs_keeper_core::conditions`]) holds for this row as stored.
    pub fn satisfies(&self, condition: &Condition) -> bool {
        let ids = |id: &str| self.attempt_ids.contains(id);
        let claims = |id: &str| self.claims.contains(id);
        let stored = StoredRecord {
            record: &self.record,
            lease_owner: self.lease_owner.as_deref(),
            // DynamoDB keeps no empty set: the attribute is missing.
            attempt_ids: (!self.attempt_ids.is_empty()).then_some(&ids as &dyn Fn(&str) -> bool),
            claims: (!self.claims.is_empty()).then_some(&claims as &dyn Fn(&str) -> bool),
        };
        condition.holds(Some(&stored))
    }
}

/// Whether `condition` holds for the row `row` (`None`: no item), as DynamoDB evaluates it.
pub fn satisfied(row: Option<&Row>, condition: &Condition) -> bool {
    row.map_or_else(|| condition.holds(None), |row| row.satisfies(condition))
}

impl Row {
    /// Its size as DynamoDB would count it, near enough (the record as JSON plus the sets).
    pub fn size(&self) -> usize {
        serde_json::to_vec(&self.record).map_or(0, |v| v.len())
            + self.attempt_ids.iter().map(|s| s.len() + 3).sum::<usize>()
            + self.claims.iter().map(|s| s.len() + 3).sum::<usize>()
    }
}

/// Faults currently switched on.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Probability that a DynamoDB call fails (throttled or unavailable).
    pub table: f64,
    /// Probability that an S3 call fails.
    pub bucket: f64,
    /// Probability that an SQS send fails.
    pub send: f64,
    /// The downstream answers 503 to everything.
    pub outage: bool,
    /// Faults are over for good; flaky payloads behave (poison ones do not).
    pub healed: bool,
}

/// What was sent, and what the downstream did with it.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Every payload the producer sent: (item id, sha256), in order.
    pub sent: Vec<(String, String)>,
    /// Successful deliveries to the downstream, by payload sha256.
    pub delivered: HashMap<String, u32>,
    /// Successful deliveries by the worker, by source message id.
    pub worker_deliveries: HashMap<String, u32>,
    /// At-least-once events by source message id: duplicate receives, and receives whose
    /// invocation delivered the message without acknowledging it (crashed, killed, run
    /// twice, or reporting it for retry).
    pub causes: HashMap<String, u32>,
    /// Payloads an operator purged: those of the records a purge selected. Anything else a
    /// purge deletes (another body of a selected item id) is lost.
    pub discarded: BTreeSet<String>,
    /// Extended-Client pointers the producer sent in place of a payload (kept in the
    /// producer's bucket for ever): the pointer text's sha256 → the payload's.
    pub pointers: HashMap<String, String>,
    /// Every item a source message's failure was ever recorded under, by message id.
    pub recorded_under: HashMap<String, BTreeSet<String>>,
    /// Items an operator purged (a purge failing midway may leave a record without its DLQ
    /// message, as designed: the next purge finds the record again).
    pub purged: BTreeSet<String>,
    /// What each sandbox last read or wrote of the circuit breaker's state.
    pub breaker_known: HashMap<String, sqs_keeper_core::BreakerState>,
    /// The probe each sandbox took last, until when.
    pub probes: HashMap<String, std::time::SystemTime>,
    /// When each sandbox's last call to the breaker's table succeeded.
    pub breaker_contact: HashMap<String, std::time::SystemTime>,
    /// The breaker's open period (its first): a sandbox out of touch with the table for
    /// that long probes on its own.
    pub breaker_open_for: Option<std::time::Duration>,
    /// Payloads of messages that expired in a documented window (excused at the end too).
    pub expired_in_window: BTreeSet<String>,
    /// Messages whose latest delivery failed to dead-letter them and could not hide them.
    pub unhidden_failed_dead_letters: BTreeSet<String>,
    /// Source messages a delivery found claimed by another, not yet sent, when it wrote.
    pub claims_held_elsewhere: BTreeSet<String>,
    /// Deliveries (`message id#receive count`) whose work ended well in the worker.
    pub handled: BTreeSet<String>,
    /// Every attempt id ever appended to an item's record, compacted or not (cleared when
    /// a purge deletes the record).
    pub appended: HashMap<String, BTreeSet<String>>,
    /// Hides the worker made for redelivery spacing, by receipt handle, with their delay.
    pub hidden: HashMap<String, std::time::Duration>,
    /// The downstream's `Retry-After` in its latest answer to the worker, by receipt
    /// (`message id#receive count`); removed by an answer without one.
    pub retry_after: HashMap<String, std::time::Duration>,
    /// Receipts of batches Lambda invoked twice at once: the two copies race to hide
    /// them, and the last hide wins whatever the other asked.
    pub doubled: BTreeSet<String>,
    /// The sandboxes that have read the source queue's retention (until then a sandbox's
    /// hides are capped by nothing: docs/ARCHITECTURE.md §1.11, "unknown retention caps
    /// nothing").
    pub timing_known: BTreeSet<String>,
    /// Messages whose latest hide was made while its sandbox did not know the retention: an
    /// expiry of theirs is that documented window, not a defect.
    pub hidden_blind: BTreeSet<String>,
    /// Payloads whose record an operator damaged (exempt from the end checks but one: a
    /// DLQ message must still hold them).
    pub corrupted: BTreeSet<String>,
}

impl Ledger {
    /// How many times the worker delivered source message `message_id` successfully.
    pub fn worker_deliveries_of(&self, message_id: &str) -> u32 {
        self.worker_deliveries.get(message_id).copied().unwrap_or(0)
    }

    /// Whether the worker delivered each of `messages` since `before` was read (by
    /// [`Ledger::worker_deliveries_of`], in the same order); an empty `before` counts
    /// every message as delivered.
    pub fn delivered_since(
        &self,
        messages: &[crate::queue::SimMessage],
        before: &[u32],
    ) -> Vec<bool> {
        messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                before.is_empty()
                    || self.worker_deliveries_of(&m.id) > before.get(i).copied().unwrap_or(0)
            })
            .collect()
    }
}

/// Counters for the report.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Invariant checks made.
    pub checks: u64,
    /// Steps taken (state changes).
    pub steps: u64,
    /// Invocations of the worker.
    pub invocations: u64,
    /// Redrive runs started.
    pub redrives: u64,
    /// Purges that removed something.
    pub purges: u64,
    /// The largest record written, in bytes.
    pub largest_record: usize,
    /// Deliveries beyond the first of a payload.
    pub duplicate_deliveries: u64,
}

/// The whole state.
#[derive(Debug)]
pub struct State {
    /// The redrive's lease in this world.
    pub lease_ttl: std::time::Duration,
    /// The idempotency table, in the worlds with idempotency.
    pub idempotency: Option<sqs_keeper_core::testing::MemoryIdempotencyStore>,
    /// Downstream calls running now, by item id (worlds with idempotency: at most one).
    pub running_now: HashMap<String, u32>,
    /// Records per query page in this world.
    pub page_size: i32,
    /// The envelope the producer wraps its payloads in (none in most worlds).
    pub envelopes: sqs_keeper_core::envelope::Envelopes,
    /// The worker's `receive_budget_margin`: its last receive comes this many early.
    pub receive_budget_margin: u32,
    /// Redrive runs processing each item at this moment (§3: at most one).
    pub redriving_now: HashMap<String, u32>,
    /// The source queue.
    pub source: SimQueue,
    /// The dead-letter queue.
    pub dlq: SimQueue,
    /// The dead-letter table.
    pub table: BTreeMap<String, Row>,
    /// The payload bucket, by key.
    pub bucket: BTreeMap<String, String>,
    /// Faults now.
    pub faults: Faults,
    /// What was sent and delivered.
    pub ledger: Ledger,
    /// What happened.
    pub trace: Trace,
    /// Broken invariants, each with the item it concerns.
    pub violations: Vec<(String, String)>,
    /// Counters.
    pub stats: Stats,
    /// The seeded randomness of the world (not of the code under test).
    pub rng: fastrand::Rng,
}

/// The world: the state behind its lock, and the clock and randomness it gives everything
/// it runs.
#[derive(Debug)]
pub struct World {
    state: Mutex<State>,
    /// Wakes the idle pollers when a message is sent to the source queue (long polling
    /// returns as soon as one arrives).
    pub arrivals: tokio::sync::Notify,
    /// The world's wall clock: tokio's paused clock from the world's start. The library's
    /// values (the worker, the breaker, the stores, the redrive runs) and the world's own
    /// models (the queues, the downstream) all read it.
    pub clock: Clock,
    /// The library's randomness (backoff and redelivery jitter, run ids, sweep markers,
    /// claim tokens), seeded from the world's seed: one generator that every value given a
    /// clone of it draws from, in the order they draw. (The world's own choices come from
    /// generators of their own: [`State::rng`] and those the run seeds.)
    pub random: Random,
}

impl World {
    /// A world over `state`, reading `clock` and drawing from `random`.
    pub fn new(state: State, clock: Clock, random: Random) -> Self {
        World {
            state: Mutex::new(state),
            arrivals: tokio::sync::Notify::new(),
            clock,
            random,
        }
    }

    /// The state, for one step.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere is reported by the run; carry on with the data to report it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl State {
    /// A fresh world: empty queues, table and bucket.
    pub fn new(seed: u64, source: SimQueue, dlq: SimQueue) -> Self {
        State {
            lease_ttl: std::time::Duration::from_secs(900),
            idempotency: None,
            running_now: HashMap::new(),
            page_size: 100,
            envelopes: Default::default(),
            receive_budget_margin: 0,
            source,
            dlq,
            table: BTreeMap::new(),
            bucket: BTreeMap::new(),
            faults: Faults::default(),
            ledger: Ledger::default(),
            trace: Trace::default(),
            violations: Vec::new(),
            redriving_now: HashMap::new(),
            stats: Stats::default(),
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// Records a broken invariant about `item` (an item id, or `-`), named after the
    /// promise it breaks.
    pub fn violate(&mut self, section: Section, item: &str, what: String) {
        let what = format!("{}: {what}", section.label());
        self.trace.note("INVARIANT", item, &what);
        self.violations.push((item.to_string(), what));
    }

    /// Whether the fault `pick` names strikes this call.
    pub fn chance_of(&mut self, pick: fn(&Faults) -> f64) -> bool {
        let p = pick(&self.faults);
        self.chance(p)
    }

    /// Whether a call of `actor` fails now, at the rate `pick` reads from the world's
    /// faults, noted in the trace against `item` as `"{actor} {what}"` when it does, so
    /// failing seeds show it.
    pub fn call_fails(
        &mut self,
        pick: fn(&Faults) -> f64,
        actor: &str,
        item: &str,
        what: &str,
    ) -> bool {
        let fails = self.chance_of(pick);
        if fails {
            self.trace.note("fault", item, &format!("{actor} {what}"));
        }
        fails
    }

    /// [`State::call_fails`] for an SQS call (the world's send failure rate).
    pub fn sqs_call_fails(&mut self, actor: &str, item: &str, what: &str) -> bool {
        self.call_fails(|f| f.send, actor, item, what)
    }

    /// Whether a failure is injected now, with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && !self.faults.healed && self.rng.f64() < p
    }

    /// Whether a payload is still somewhere it can be recovered from, other than the
    /// message being deleted: delivered, in the source queue, in another DLQ message, or
    /// held by a record that is not finished.
    pub fn payload_is_safe(&self, sha: &str, deleting: Option<&str>) -> bool {
        self.copies_of(sha)
            .iter()
            .any(|copy| self.copy_is_safe(copy, deleting))
    }

    /// What holds the payload `sha` as well as itself: the producer's pointers to it, and
    /// for a pointer, its payload.
    pub fn copies_of(&self, sha: &str) -> Vec<String> {
        let mut copies = vec![sha.to_string()];
        copies.extend(self.ledger.pointers.get(sha).cloned());
        copies.extend(
            self.ledger
                .pointers
                .iter()
                .filter(|(_, payload)| payload.as_str() == sha)
                .map(|(pointer, _)| pointer.clone()),
        );
        copies
    }

    /// How often the downstream received the payload `sha` (or, for a producer's pointer,
    /// the payload it names).
    pub fn deliveries_of(&self, sha: &str) -> u32 {
        self.copies_of(sha)
            .iter()
            .map(|copy| self.ledger.delivered.get(copy).copied().unwrap_or(0))
            .sum()
    }

    fn copy_is_safe(&self, sha: &str, deleting: Option<&str>) -> bool {
        if self.ledger.delivered.get(sha).copied().unwrap_or(0) > 0
            || self.ledger.discarded.contains(sha)
        {
            return true;
        }
        let in_queue = |q: &SimQueue| {
            q.messages().iter().any(|m| {
                Some(m.id.as_str()) != deleting
                    && (m.body_sha256 == sha
                        || m.attribute(sqs_keeper_core::PAYLOAD_SHA256_ATTRIBUTE) == Some(sha))
            })
        };
        in_queue(&self.source)
            || in_queue(&self.dlq)
            || self.table.values().any(|row| {
                row.record.payload.sha256 == sha
                    && !matches!(row.record.status, ItemStatus::Resolved)
            })
    }

    /// The invariants that hold after every step; called by every change. (A record's
    /// size is checked where it is written: [`crate::store`] refuses and reports a write
    /// over 400 KB, as DynamoDB refuses it.)
    pub fn after_step(&mut self, actor: &str, item: &str, what: &str) {
        self.stats.steps += 1;
        self.trace.note(actor, item, what);
        let mut broken = Vec::new();
        for (id, row) in &self.table {
            if row.corrupt {
                continue;
            }
            let r = &row.record;
            self.stats.checks += 3;
            let count = r.failure_history.len() as u64 + u64::from(r.history_omitted);
            if u64::from(r.failure_count) != count {
                broken.push((
                    Section::Record,
                    id.clone(),
                    format!(
                        "failure_count {} is not the {} attempts kept plus the {} omitted",
                        r.failure_count,
                        r.failure_history.len(),
                        r.history_omitted
                    ),
                ));
            }
            if row.attempt_ids.len() > r.failure_history.len() {
                broken.push((
                    Section::Record,
                    id.clone(),
                    format!(
                        "attempt_ids holds {} ids for {} attempts kept: it grows without bound",
                        row.attempt_ids.len(),
                        r.failure_history.len()
                    ),
                ));
            }
            if r.status == ItemStatus::Resolved && self.deliveries_of(&r.payload.sha256) == 0 {
                broken.push((
                    Section::NothingLost,
                    id.clone(),
                    "resolved, but its payload was never delivered".to_string(),
                ));
            }
        }
        for (section, item, what) in broken {
            // Report each broken invariant once per item.
            let key = format!(
                "{}: {}",
                section.label(),
                what.split(' ').next().unwrap_or("")
            );
            if !self
                .violations
                .iter()
                .any(|(i, w)| *i == item && w.starts_with(&key))
            {
                self.violate(section, &item, what);
            }
        }
    }
}

/// The promise of docs/ARCHITECTURE.md that a broken invariant breaks: every report names
/// it, so that a break reads as the guarantee it is, at the step that broke it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// §1.1: every received record ends done, skipped, retried or dead-lettered.
    NothingLost,
    /// §1.5: an attempt is recorded once; a repeated delivery is explained.
    RecordingIdempotent,
    /// §1.6: FIFO order is kept.
    FifoOrder,
    /// §1.7: nothing runs past the deadline; no attempt starts after the cut-off.
    Deadline,
    /// §1.8: no panic takes the process down.
    NoPanic,
    /// §1.9: payloads are data, not logs.
    Logs,
    /// §1.11: retries are spaced across deliveries, never past the message's retention.
    Spacing,
    /// §1.12 and §7: the circuit breaker withholds the downstream while open.
    Breaker,
    /// §6: idempotency runs an item's work once, never twice at once.
    Idempotency,
    /// §4: the downstream never receives an Extended-Client pointer's text as a payload.
    NoPointer,
    /// §6: the downstream receives the payload, never the envelope around it.
    Envelope,
    /// §1.10 and §4: a DLQ message goes only when that very message is known processed;
    /// the DLQ and the records agree.
    DlqRule,
    /// §3: the record's bounds, statuses and leases.
    Record,
}

impl Section {
    /// How a report names it.
    pub fn label(self) -> &'static str {
        match self {
            Section::NothingLost => "§1.1 nothing is lost",
            Section::RecordingIdempotent => "§1.5 recording is idempotent",
            Section::FifoOrder => "§1.6 FIFO order is kept",
            Section::Deadline => "§1.7 the deadline is respected",
            Section::NoPanic => "§1.8 no panic takes the process down",
            Section::Logs => "§1.9 payloads are data, not logs",
            Section::Spacing => "§1.11 retries are spaced",
            Section::Breaker => "§1.12 the circuit breaker",
            Section::Idempotency => "§6 idempotency",
            Section::DlqRule => "§4 the DLQ message rule",
            Section::NoPointer => "§4 no pointer is handed over as the payload",
            Section::Envelope => "§6 envelopes are unwrapped",
            Section::Record => "§3 the dead-letter record",
        }
    }
}
