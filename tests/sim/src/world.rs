//! The simulated world: the library's in-memory world (`sqs_keeper_core::testing::World`:
//! the dead-letter table, the payload bucket, the DLQ and the source queue, one atomic step
//! per call) with the simulation's own state beside it ([`Sim`]: the ledger of what was
//! sent and delivered, the trace, the invariants broken, the counters, the downstream's
//! outage). Everything sits behind the world's one lock, so every change is one atomic
//! step, and the invariants that must hold at every step are checked right after it: the
//! world tells the simulation of each change ([`observe`]), which checks them
//! ([`Checks::after_step`]).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use sqs_keeper_core::recording::ATTEMPT_IDS_SPARE;
use sqs_keeper_core::{dead_letter::ItemStatus, dead_letter::PayloadLocation};
use sqs_keeper_core::{testing::Event, testing::ITEM_SIZE_LIMIT};
use sqs_keeper_core::{testing::Queue, testing::QueueMessage};

use crate::trace::Trace;

/// The step the memory store notes when it sets a record whose requeued message outlived
/// its queue back to dead (`testing::memory_store`'s `reopen_requeued`).
const REOPENED_AFTER_REQUEUE: &str = "reopened: the requeued message outlived its queue";

/// The world: the library's, with the simulation's state ([`Sim`]) beside its own.
pub type World = sqs_keeper_core::testing::World<Sim>;

/// The whole state: the world's, and the simulation's in its `ext`.
pub type State = sqs_keeper_core::testing::WorldState<Sim>;

/// Fault rates of the AWS calls (the world's own).
pub type Faults = sqs_keeper_core::testing::Faults;

/// What was sent, and what the downstream did with it.
#[derive(Debug, Default)]
pub struct Ledger {
    /// The digests of the payloads whose handler panics on every call: no redrive can finish
    /// their items, so those may stay dead and eligible.
    pub doomed: BTreeSet<String>,
    /// Every payload the producer sent: (item id, sha256), in order.
    pub sent: Vec<(String, String)>,
    /// Successful deliveries to the downstream, by payload sha256.
    pub delivered: HashMap<String, u32>,
    /// DLQ claims taken, by source message id (as records keep it).
    pub claims_taken: HashMap<String, u32>,
    /// The worker's DLQ sends, by source message id (as records keep it).
    pub dead_letters_sending: HashMap<String, u32>,
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
    /// Items whose requeued message outlived its queue, set back to dead without a DLQ
    /// message, until they are resolved or requeued again. Noted at the step that reopens
    /// them, since compaction may later drop the failure that says so.
    pub reopened_after_requeue: BTreeSet<String>,
    /// What each sandbox last read or wrote of the circuit breaker's state.
    pub breaker_known: HashMap<String, sqs_keeper_core::breaker::BreakerState>,
    /// The probe each sandbox (or redrive run) took last, until when.
    pub probes: HashMap<String, std::time::SystemTime>,
    /// Redrive runs that took the probe and answered it: closed the breaker, opened it
    /// again or gave the probe back (each tried, whether or not the table took it).
    pub probes_answered: BTreeSet<String>,
    /// Whether the downstream answered each sandbox since it last tried to take the
    /// breaker's probe (§1.12: only the downstream's answer decides a probe).
    pub answered_since_probe: HashMap<String, bool>,
    /// When each sandbox's last call to the breaker's table succeeded.
    pub breaker_contact: HashMap<String, std::time::SystemTime>,
    /// The breaker's open period (its first): a sandbox out of touch with the table for
    /// that long probes on its own.
    pub breaker_open_for: Option<std::time::Duration>,
    /// Payloads of messages that expired in a documented window (excused at the end too).
    pub expired_in_window: BTreeSet<String>,
    /// Messages a crashed (or killed) invocation held invisible past the end of their
    /// retention: SQS deletes them before anyone can receive them again.
    pub held_past_retention: BTreeSet<String>,
    /// Source messages SQS deleted at the end of their retention (as records keep their
    /// ids).
    pub expired_messages: BTreeSet<String>,
    /// Messages whose latest delivery failed to dead-letter them and could not hide them.
    pub unhidden_failed_dead_letters: BTreeSet<String>,
    /// Deliveries (claim elements, `message id:receive count`) that found their message
    /// claimed by a twin or a later receive, not yet sent, when they wrote.
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
    pub fn delivered_since(&self, messages: &[QueueMessage], before: &[u32]) -> Vec<bool> {
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
    /// Invocations cut right after a DLQ claim or send for one of their messages.
    pub cuts_after_claim: u64,
    /// Pauses of polling the control recorded.
    pub pauses: u64,
}

/// The simulation's state beside the world's.
#[derive(Debug)]
pub struct Sim {
    /// The redrive's lease in this world.
    pub lease_ttl: Duration,
    /// The idempotency table, in the worlds with idempotency.
    pub idempotency: Option<sqs_keeper_core::testing::MemoryIdempotencyStore>,
    /// The circuit breaker's table and policy, in the worlds with a breaker: the worker's
    /// sandboxes and every reprocessing redrive run share it.
    pub breaker: Option<(
        sqs_keeper_core::testing::MemoryBreakerStore,
        sqs_keeper_core::breaker::BreakerPolicy,
    )>,
    /// Downstream calls running now, by item id (worlds with idempotency: at most one).
    pub running_now: HashMap<String, u32>,
    /// The envelope the producer wraps its payloads in (none in most worlds).
    pub envelopes: sqs_keeper_core::envelope::Envelopes,
    /// The worker's `receive_budget_margin`: its last receive comes this many early.
    pub receive_budget_margin: u32,
    /// Downstream calls running now by a sandbox probing on its own (§1.12: at most one).
    pub own_probes_now: HashMap<String, u32>,
    /// Redrive runs processing each item at this moment (§3: at most one).
    pub redriving_now: HashMap<String, u32>,
    /// The downstream answers 503 to everything.
    pub outage: bool,
    /// Wakes an invocation waiting to be cut right after a claim on one of its messages
    /// ([`Ledger::claims_taken`]).
    pub claim_taken: std::sync::Arc<tokio::sync::Notify>,
    /// Wakes an invocation waiting to be cut right after a DLQ send for one of its messages
    /// ([`Ledger::dead_letters_sending`]), before the send is marked on the record.
    pub dead_letter_sending: std::sync::Arc<tokio::sync::Notify>,
    /// The event source mapping and the polling control's record of its pause.
    pub polling: crate::polling::Polling,
    /// What was sent and delivered.
    pub ledger: Ledger,
    /// What happened.
    pub trace: Trace,
    /// Broken invariants, each with the item it concerns.
    pub violations: Vec<(String, String)>,
    /// Counters.
    pub stats: Stats,
}

/// A delivery as the ledger keys it: `message id:receive count`.
pub fn delivery_key(message_id: &str, receive_count: u32) -> String {
    format!("{message_id}:{receive_count}")
}

/// The receive a claim element (`message id:receive count`) holds `message_id` at, if it
/// is one of that message's; an element of the message id alone holds it at receive 0.
pub fn claim_receive(element: &str, message_id: &str) -> Option<u32> {
    if element == message_id {
        return Some(0);
    }
    let (id, count) = element.rsplit_once(':')?;
    (id == message_id).then(|| count.parse().ok()).flatten()
}

/// A fresh world: the source queue `source` and the DLQ `dlq`, empty, an empty table and
/// bucket, random draws from `seed`; the simulation's latency and checks hooked in
/// ([`latency`], [`observe`]).
pub fn new_state(seed: u64, source: Queue, dlq: Queue) -> State {
    let mut state = State::new(
        seed,
        dlq,
        Sim {
            lease_ttl: Duration::from_secs(900),
            idempotency: None,
            breaker: None,
            running_now: HashMap::new(),
            envelopes: Default::default(),
            receive_budget_margin: 0,
            own_probes_now: HashMap::new(),
            redriving_now: HashMap::new(),
            outage: false,
            claim_taken: std::sync::Arc::new(tokio::sync::Notify::new()),
            dead_letter_sending: std::sync::Arc::new(tokio::sync::Notify::new()),
            polling: crate::polling::Polling::default(),
            ledger: Ledger::default(),
            trace: Trace::default(),
            violations: Vec::new(),
            stats: Stats::default(),
        },
    );
    state.sources = vec![source];
    state.observer = Some(observe);
    state.latency = Some(latency);
    state
}

/// A call's latency, drawn from the seed: half yield at once, most of the rest take a few
/// simulated milliseconds, one in twenty a few seconds (the SDK retrying a throttled
/// request, a cold connection), so that concurrent runs, sandboxes and operators interleave
/// between one call and the next, as they do against DynamoDB, SQS and S3 (a read and the
/// write that follows it are two steps another task can come between).
pub fn draw_latency(state: &mut State) -> Duration {
    match state.rng.u32(0..100) {
        0..50 => Duration::ZERO,
        50..95 => Duration::from_millis(state.rng.u64(1..=40)),
        _ => Duration::from_millis(state.rng.u64(200..=3_000)),
    }
}

/// The latency of a store call ([`draw_latency`]); the writes that end a lease (release,
/// resolve, mark requeued, a redrive's failure) take none, as the simulation has always
/// drawn them: the worlds a seed makes stay those the seeds in `tests/seeds.rs` found.
pub fn latency(state: &mut State, operation: &str) -> Option<Duration> {
    match operation {
        "release_lease" | "resolve" | "mark_requeued" | "record_redrive_failure" => None,
        _ => Some(draw_latency(state)),
    }
}

/// What the simulation does at each change the world tells it of: keeps its ledger and
/// trace, and checks the invariants of the step (every step: [`Checks::after_step`]; a
/// write: its size; an append: §1.5; a deletion: that what it deletes is held elsewhere).
pub fn observe(state: &mut State, actor: &str, event: &Event<'_>) {
    match event {
        Event::Fault { item, what } => {
            state
                .ext
                .trace
                .note("fault", item, &format!("{actor} {what}"));
        }
        Event::Step { item, what } => state.after_step(actor, item, what),
        Event::Note { item, what } => state.ext.trace.note(actor, item, what),
        Event::WriteMalformed { item, what } => state.violate(
            Section::Record,
            item,
            format!("{what}: DynamoDB refuses the write (ValidationException)"),
        ),
        Event::ContentsRefused { item, call } => state.violate(
            Section::DlqRule,
            item,
            format!("{call}: SQS refused the message for a character outside its set (InvalidMessageContents)"),
        ),
        Event::RowWrite { item, size } => {
            state.ext.stats.largest_record = state.ext.stats.largest_record.max(*size);
            if *size > ITEM_SIZE_LIMIT {
                state.violate(
                    Section::Record,
                    item,
                    format!("a write of a {size}-byte record was refused: over DynamoDB's 400 KB"),
                );
            }
        }
        Event::Appending { item, attempt_ids } => {
            // §1.5: an attempt is appended once however often it is recorded, also after
            // compaction dropped it from the history (and its id with it).
            let ever = state
                .ext
                .ledger
                .appended
                .entry(item.to_string())
                .or_default();
            let again: Vec<&str> = attempt_ids
                .iter()
                .filter(|id| !ever.insert(id.to_string()))
                .copied()
                .collect();
            if !again.is_empty() {
                state.violate(
                    Section::RecordingIdempotent,
                    item,
                    format!(
                        "attempt {} appended a second time by {actor}: failure_count counts it twice",
                        again.join(", ")
                    ),
                );
            }
        }
        Event::Recorded {
            item,
            message_id,
            claimed,
        } => {
            state
                .ext
                .ledger
                .recorded_under
                .entry(message_id.to_string())
                .or_default()
                .insert(item.to_string());
            if *claimed {
                *state
                    .ext
                    .ledger
                    .claims_taken
                    .entry(message_id.to_string())
                    .or_default() += 1;
                state.ext.claim_taken.notify_waiters();
            }
        }
        Event::RecordRefused { item, claim } => {
            // Judged here, not by the library's `DlqClaim::is_held_elsewhere`: a claim at
            // the receive just before (it may still run), this one (a twin's) or later.
            let held_elsewhere = match (state.table.get(*item), claim) {
                (Some(row), Some(c)) => {
                    row.claims.iter().any(|element| {
                        claim_receive(element, &c.message_id)
                            .is_some_and(|n| n > 0 && n + 1 >= c.receive_count)
                    }) && !row.sent.contains(&c.message_id)
                }
                _ => false,
            };
            if let (true, Some(c)) = (held_elsewhere, claim) {
                // A twin (the same delivery, invoked twice) or a later receive holds the
                // claim and has not sent yet: this delivery will be returned for retry
                // (`dead_letter::dead_lettering_elsewhere`). Kept per receive: a later
                // receive takes over a claim an earlier one left.
                state
                    .ext
                    .ledger
                    .claims_held_elsewhere
                    .insert(delivery_key(&c.message_id, c.receive_count));
            }
        }
        Event::DeadLetterSending { record } => {
            *state
                .ext
                .ledger
                .dead_letters_sending
                .entry(record.source.message_id.clone())
                .or_default() += 1;
            state.ext.dead_letter_sending.notify_waiters();
            // §1.1, persisted first: a DLQ message is sent only for a delivery whose
            // attempts its record holds (appended, whether or not compaction kept them).
            let appended = state.ext.ledger.appended.get(&record.item_id);
            let missing: Vec<&str> = record
                .failure_history
                .iter()
                .map(|f| f.attempt_id.as_str())
                .filter(|id| !appended.is_some_and(|a| a.contains(*id)))
                .collect();
            if !missing.is_empty() && !state.ext.ledger.purged.contains(&record.item_id) {
                state.violate(
                    Section::NothingLost,
                    &record.item_id,
                    format!(
                        "{actor} sent a DLQ message for message {} before its record held attempt(s) {} (persisted first)",
                        record.source.message_id,
                        missing.join(", ")
                    ),
                );
            }
        }
        Event::ClaimSuperseded { claim, .. } => {
            // A later receive holds the claim: this delivery (which overlapped it) will be
            // returned for retry while the later one sends.
            state
                .ext
                .ledger
                .claims_held_elsewhere
                .insert(delivery_key(&claim.message_id, claim.receive_count));
        }
        Event::DlqMessageDeleted { message } => {
            let view = sqs_keeper_core::ports::MessageView::of_dlq_message(
                &message.id,
                &message.body,
                |name| message.attribute(name),
                crate::store::BUCKET,
                message.marker.is_some(),
            );
            let item = message
                .attribute(sqs_keeper_core::message::ITEM_ID_ATTRIBUTE)
                .unwrap_or(&message.id)
                .to_string();
            let sha = view
                .payload_sha256
                .clone()
                .unwrap_or_else(|| message.body_sha256.clone());
            if !state.payload_is_safe(&sha, Some(&message.id)) {
                state.violate(
                    Section::DlqRule,
                    &item,
                    format!(
                        "DLQ message {} deleted, but its payload {} was never delivered and nothing else holds it: lost",
                        message.id,
                        &sha[..12]
                    ),
                );
            }
        }
        Event::PayloadDeleted { key, body } => {
            // Every reference, at the step: no record that still needs its payload (dead,
            // being redriven, or requeued as a pointer) names the object deleted.
            let holders: Vec<String> = state
                .table
                .iter()
                .filter(|(_, row)| row.record.status != ItemStatus::Resolved)
                .filter(|(_, row)| {
                    matches!(&row.record.payload.location, PayloadLocation::S3 { key: k, .. } if k == *key)
                })
                .map(|(id, _)| id.clone())
                .collect();
            for holder in holders {
                state.violate(
                    Section::NothingLost,
                    &holder,
                    format!("{actor} deleted payload object {key}, which the record of {holder} still names"),
                );
            }
            // Nor does a message still waiting in the source queue (a requeue's pointer)
            // point to it, its payload undelivered. (A DLQ message may: the redrive that
            // delivered its payload deletes the object, then the message.)
            let sha = sqs_keeper_core::hex::sha256_hex(body.as_bytes());
            let undelivered = state.deliveries_of(&sha) == 0;
            let pointing: Vec<String> = state
                .source()
                .messages()
                .iter()
                .filter(|_| undelivered)
                .filter(|m| {
                    sqs_keeper_core::pointer::S3Pointer::parse(&m.body)
                        .is_some_and(|p| p.bucket == crate::store::BUCKET && p.key == *key)
                })
                .map(|m| m.id.clone())
                .collect();
            for id in pointing {
                state.violate(
                    Section::NothingLost,
                    key,
                    format!("{actor} deleted payload object {key}, which message {id} still points to"),
                );
            }
            if undelivered && !state.ext.ledger.discarded.contains(&sha) {
                state.violate(
                    Section::NothingLost,
                    key,
                    format!("payload object {key} deleted before its payload was delivered"),
                );
            }
        }
        Event::RecordDeleted { item, row } => {
            state.ext.ledger.appended.remove(*item);
            // §4: an item in flight is never removed, whatever a purge selected: a
            // `requeued` record's message waits in the source queue, a `redriving` one is
            // held by a run whose failure would have nowhere to go.
            if row.record.status.is_in_flight() && !row.corrupt {
                state.violate(
                    Section::DlqRule,
                    item,
                    format!(
                        "{actor} deleted the record of {item} while it was {:?} (in flight)",
                        row.record.status
                    ),
                );
            }
            let sha = row.record.payload.sha256.clone();
            if !state.payload_is_safe(&sha, None) {
                state.violate(
                    Section::NothingLost,
                    item,
                    format!(
                        "a purge deleted the record of {item} holding payload {}, which it had not selected: lost",
                        &sha[..12]
                    ),
                );
            }
        }
    }
}

/// The simulation's reading of the state: its faults as it notes them, where a payload is
/// still held, and the invariants of every step.
pub trait Checks {
    /// The source queue.
    fn source(&self) -> &Queue;
    /// The source queue, to change.
    fn source_mut(&mut self) -> &mut Queue;
    /// Records a broken invariant about `item` (an item id, or `-`), named after the
    /// promise it breaks.
    fn violate(&mut self, section: Section, item: &str, what: String);
    /// Whether a call of `actor` fails now, at the rate `pick` reads from the world's
    /// faults, noted in the trace against `item` as `"{actor} {what}"` when it does, so
    /// failing seeds show it.
    fn call_fails(&mut self, pick: fn(&Faults) -> f64, actor: &str, item: &str, what: &str)
        -> bool;
    /// [`Checks::call_fails`] for an SQS call (the world's send failure rate).
    fn sqs_call_fails(&mut self, actor: &str, item: &str, what: &str) -> bool;
    /// Whether a payload is still somewhere it can be recovered from, other than the
    /// message being deleted: delivered, in the source queue, in another DLQ message, or
    /// held by a record that is not finished.
    fn payload_is_safe(&self, sha: &str, deleting: Option<&str>) -> bool;
    /// What holds the payload `sha` as well as itself: the producer's pointers to it, and
    /// for a pointer, its payload.
    fn copies_of(&self, sha: &str) -> Vec<String>;
    /// How often the downstream received the payload `sha` (or, for a producer's pointer,
    /// the payload it names).
    fn deliveries_of(&self, sha: &str) -> u32;
    /// The invariants that hold after every step; called at every change. (A record's size
    /// is checked where it is written: the world refuses a write over 400 KB, as DynamoDB
    /// refuses it, and [`observe`] reports it.)
    fn after_step(&mut self, actor: &str, item: &str, what: &str);
}

impl Checks for State {
    fn source(&self) -> &Queue {
        &self.sources[0]
    }

    fn source_mut(&mut self) -> &mut Queue {
        &mut self.sources[0]
    }

    fn violate(&mut self, section: Section, item: &str, what: String) {
        let what = format!("{}: {what}", section.label());
        self.ext.trace.note("INVARIANT", item, &what);
        self.ext.violations.push((item.to_string(), what));
    }

    fn call_fails(
        &mut self,
        pick: fn(&Faults) -> f64,
        actor: &str,
        item: &str,
        what: &str,
    ) -> bool {
        let fails = self.chance_of(pick);
        if fails {
            self.ext
                .trace
                .note("fault", item, &format!("{actor} {what}"));
        }
        fails
    }

    fn sqs_call_fails(&mut self, actor: &str, item: &str, what: &str) -> bool {
        self.call_fails(|f| f.send, actor, item, what)
    }

    fn payload_is_safe(&self, sha: &str, deleting: Option<&str>) -> bool {
        self.copies_of(sha)
            .iter()
            .any(|copy| copy_is_safe(self, copy, deleting))
    }

    fn copies_of(&self, sha: &str) -> Vec<String> {
        let mut copies = vec![sha.to_string()];
        copies.extend(self.ext.ledger.pointers.get(sha).cloned());
        copies.extend(
            self.ext
                .ledger
                .pointers
                .iter()
                .filter(|(_, payload)| payload.as_str() == sha)
                .map(|(pointer, _)| pointer.clone()),
        );
        copies
    }

    fn deliveries_of(&self, sha: &str) -> u32 {
        self.copies_of(sha)
            .iter()
            .map(|copy| self.ext.ledger.delivered.get(copy).copied().unwrap_or(0))
            .sum()
    }

    fn after_step(&mut self, actor: &str, item: &str, what: &str) {
        self.ext.stats.steps += 1;
        self.ext.trace.note(actor, item, what);
        let mut broken = Vec::new();
        if what == REOPENED_AFTER_REQUEUE {
            self.ext
                .ledger
                .reopened_after_requeue
                .insert(item.to_string());
        }
        let mut settled = Vec::new();
        let reopened = &self.ext.ledger.reopened_after_requeue;
        for (id, row) in &self.table {
            if row.corrupt {
                continue;
            }
            let r = &row.record;
            if matches!(r.status, ItemStatus::Resolved | ItemStatus::Requeued)
                && reopened.contains(id)
            {
                settled.push(id.clone());
            }
            self.ext.stats.checks += 3;
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
            // The ids of the entries kept, at most one more per entry kept (the last
            // attempt of a delivery whose last entry compaction dropped), and the spare
            // for deliveries whose DLQ send failed.
            if row.attempt_ids.len() > 2 * r.failure_history.len() + ATTEMPT_IDS_SPARE {
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
            if let Some(delivery) = delivery_keeping_middle_ids(r, &row.attempt_ids) {
                broken.push((
                    Section::Record,
                    id.clone(),
                    format!(
                        "attempt_ids keeps more than the first and last dropped attempt of \
                         delivery {delivery}: it grows without bound"
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
        if self.dlq.fifo {
            self.ext.stats.checks += 1;
            if let Some((item, what)) = repeated_dead_letter(&self.dlq) {
                broken.push((Section::RecordingIdempotent, item, what));
            }
        }
        for id in settled {
            self.ext.ledger.reopened_after_requeue.remove(&id);
        }
        // §1.12: a mapping the control disabled is recorded as paused, so a later run
        // enables it again (nothing else disables it in these worlds).
        self.ext.stats.checks += 1;
        if self.ext.polling.disabled && !self.ext.polling.marker.state().paused {
            broken.push((
                Section::Breaker,
                "-".to_string(),
                "the mapping is disabled with no pause recorded: no control run will enable it again".to_string(),
            ));
        }
        for (section, item, what) in broken {
            // Report each broken invariant once per item.
            let key = format!(
                "{}: {}",
                section.label(),
                what.split(' ').next().unwrap_or("")
            );
            if !self
                .ext
                .violations
                .iter()
                .any(|(i, w)| *i == item && w.starts_with(&key))
            {
                self.violate(section, &item, what);
            }
        }
    }
}

/// §1.5 on a FIFO DLQ: two dead-letter messages of one source message and item, sent within
/// SQS's deduplication window of each other, which the deduplication id should have made
/// one (a later delivery re-sending after a send whose answer was lost). A rotation's copy
/// and a message the redrive policy moved are not dead-letter sends.
fn repeated_dead_letter(dlq: &Queue) -> Option<(String, String)> {
    let window_ms =
        i64::try_from(sqs_keeper_core::message::FIFO_DEDUPLICATION_WINDOW.as_millis()).ok()?;
    let mut seen: HashMap<(String, String), (&str, i64)> = HashMap::new();
    for m in dlq.messages() {
        if m.marker.is_some() || m.moved_from.is_some() {
            continue;
        }
        let key = (
            m.item_id(),
            m.attribute(sqs_keeper_core::message::SOURCE_MESSAGE_ID_ATTRIBUTE)
                .unwrap_or_default()
                .to_string(),
        );
        if let Some((other, sent_ms)) = seen.get(&key) {
            if (m.sent_at_ms - sent_ms).abs() < window_ms {
                return Some((
                    key.0.clone(),
                    format!(
                        "DLQ messages {other} and {} both dead-letter source message {} within the FIFO deduplication window",
                        m.id, key.1
                    ),
                ));
            }
        }
        seen.insert(key, (m.id.as_str(), m.sent_at_ms));
    }
    None
}

/// Whether the copy `sha` of a payload is delivered, purged, or held by a message (other
/// than `deleting`) or an unfinished record.
fn copy_is_safe(state: &State, sha: &str, deleting: Option<&str>) -> bool {
    if state.ext.ledger.delivered.get(sha).copied().unwrap_or(0) > 0
        || state.ext.ledger.discarded.contains(sha)
    {
        return true;
    }
    let in_queue = |q: &Queue| {
        q.messages().iter().any(|m| {
            Some(m.id.as_str()) != deleting
                && (m.body_sha256 == sha
                    || m.attribute(sqs_keeper_core::message::PAYLOAD_SHA256_ATTRIBUTE) == Some(sha))
        })
    };
    in_queue(state.source())
        || in_queue(&state.dlq)
        || state.table.values().any(|row| {
            row.record.payload.sha256 == sha && !matches!(row.record.status, ItemStatus::Resolved)
        })
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

/// Returns a worker delivery ([`delivery_key`]) holding more than two ids that match no entry of
/// `record`'s history. Compaction keeps at most a dropped delivery's first and
/// last attempt ids: the last covers every attempt before it, and the first refuses a twin's
/// write. A record that keeps more keeps every id it ever had.
fn delivery_keeping_middle_ids(
    record: &sqs_keeper_core::dead_letter::DeadLetteredItem,
    attempt_ids: &BTreeSet<String>,
) -> Option<String> {
    let mut dropped: HashMap<String, usize> = HashMap::new();
    for id in attempt_ids {
        if record.failure_history.iter().any(|f| &f.attempt_id == id) {
            continue;
        }
        // A worker delivery's ids only: an adoption's or a redrive run's share no delivery.
        if let Some((message, receive, _)) = sqs_keeper_core::recording::parse_attempt_id(id) {
            *dropped.entry(delivery_key(message, receive)).or_default() += 1;
        }
    }
    dropped
        .into_iter()
        .filter(|(_, n)| *n > 2)
        .map(|(d, _)| d)
        .min()
}
