//! The conditions of the dead-letter store's conditional writes (and of the breaker's and
//! the idempotency table's), defined once, as data.
//!
//! Every write that must not overwrite another actor's work (a lease taken, an item
//! finished, an attempt appended, a claim taken) is conditional. Each condition is built
//! here by one function ([`conditions`]); the DynamoDB adapter renders it to the condition
//! expression it sends ([`Condition::render`]), and the in-memory world the tests and the
//! simulation run over evaluates the very same value on its own rows ([`Condition::holds`],
//! `testing::Row::satisfies`). A wrong
//! condition is then wrong in both, and the simulation's worlds find it; before, the
//! in-memory stores re-implemented each condition in Rust and could not see a mistake in
//! the expression sent (docs/ARCHITECTURE.md §3).
//!
//! Written by hand rather than taken from a crate: the crates that build DynamoDB
//! expressions (`aws-sdk-dynamodb` takes strings; expression builders on crates.io render
//! but do not evaluate) offer no evaluator, and the subset used here is a few operators.
//! [`Condition::holds`] follows DynamoDB's semantics for that subset: a comparison with a
//! missing attribute, or one of another type, is false; `contains` on a missing attribute
//! is false (so `NOT contains` is true); `attribute_exists` is true for any value. The
//! emulator test `conditions.rs` checks both readings agree on DynamoDB Local.

use std::collections::BTreeMap;

use crate::dead_letter::DeadLetteredItem;

/// The attribute names the conditions read, as the record schema writes them.
pub mod names {
    /// The table's partition key.
    pub const ITEM_ID: &str = "item_id";
    /// `dead`, `redriving`, `requeued` or `resolved`.
    pub const STATUS: &str = "status";
    /// The last attempt's time (RFC 3339, milliseconds, `Z`).
    pub const LAST_ATTEMPT: &str = "last_attempt";
    /// How many attempts the record counts (compacted ones included).
    pub const FAILURE_COUNT: &str = "failure_count";
    /// Attempts counted in `failure_count` whose entries compaction dropped.
    pub const HISTORY_OMITTED: &str = "history_omitted";
    /// String set of the ids of the attempts in the history.
    pub const ATTEMPT_IDS: &str = "attempt_ids";
    /// String set of the DLQ message claims, one per claiming receive
    /// ([`crate::dead_letter::DlqClaim::element`]).
    pub const DLQ_CLAIMS: &str = "dlq_claims";
    /// String set of the source message ids whose DLQ message was sent.
    pub const DLQ_SENT: &str = "dlq_sent";
    /// List of the processed keys (messages and payloads a run or the worker finished).
    pub const PROCESSED: &str = "processed";
    /// The message a requeue sent, while the record waits for it.
    pub const REQUEUED_MESSAGE_ID: &str = "requeued_message_id";
    /// The run holding the item's lease.
    pub const LEASE_OWNER: &str = "lease_owner";
    /// When that lease expires (epoch seconds).
    pub const LEASE_EXPIRES_AT: &str = "lease_expires_at";
    /// The payload's map.
    pub const PAYLOAD: &str = "payload";
    /// The payload's SHA-256, in the payload's map.
    pub const SHA256: &str = "sha256";
    /// The source context's map.
    pub const SOURCE: &str = "source";
    /// The source message's id, in the source context's map.
    pub const MESSAGE_ID: &str = "message_id";
}

/// An attribute, by its path from the item's top level (a name, or a map and a name in
/// it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr(pub &'static [&'static str]);

/// The attributes the conditions read.
pub mod attr {
    use super::{names, Attr};
    /// The partition key.
    pub const ITEM_ID: Attr = Attr(&[names::ITEM_ID]);
    /// The status.
    pub const STATUS: Attr = Attr(&[names::STATUS]);
    /// The last attempt's time.
    pub const LAST_ATTEMPT: Attr = Attr(&[names::LAST_ATTEMPT]);
    /// The attempt count.
    pub const FAILURE_COUNT: Attr = Attr(&[names::FAILURE_COUNT]);
    /// `history_omitted`
    pub const HISTORY_OMITTED: Attr = Attr(&[names::HISTORY_OMITTED]);
    /// The attempt ids.
    pub const ATTEMPT_IDS: Attr = Attr(&[names::ATTEMPT_IDS]);
    /// The claimed DLQ messages.
    pub const DLQ_CLAIMS: Attr = Attr(&[names::DLQ_CLAIMS]);
    /// The sent DLQ messages.
    pub const DLQ_SENT: Attr = Attr(&[names::DLQ_SENT]);
    /// The processed keys.
    pub const PROCESSED: Attr = Attr(&[names::PROCESSED]);
    /// The requeued message.
    pub const REQUEUED_MESSAGE_ID: Attr = Attr(&[names::REQUEUED_MESSAGE_ID]);
    /// The lease's owner.
    pub const LEASE_OWNER: Attr = Attr(&[names::LEASE_OWNER]);
    /// The lease's expiry.
    pub const LEASE_EXPIRES_AT: Attr = Attr(&[names::LEASE_EXPIRES_AT]);
    /// The payload's SHA-256.
    pub const PAYLOAD_SHA256: Attr = Attr(&[names::PAYLOAD, names::SHA256]);
    /// The source message's id.
    pub const SOURCE_MESSAGE_ID: Attr = Attr(&[names::SOURCE, names::MESSAGE_ID]);
}

/// A scalar a condition compares with.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
// Exhaustive on purpose: the renderer and the evaluator must handle a new variant
// before it compiles.
pub enum Value {
    /// A string.
    S(String),
    /// A number (every number the conditions compare is an integer).
    N(i64),
}

impl Value {
    /// Returns a string value.
    pub fn s(text: impl Into<String>) -> Self {
        Self::S(text.into())
    }
}

/// How a comparison compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Exhaustive on purpose: the renderer and the evaluator must handle a new variant
// before it compiles.
pub enum Compare {
    /// `=`
    Eq,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>=`
    Ge,
}

/// A condition on one item.
#[derive(Clone, Debug, PartialEq)]
// Exhaustive on purpose: the renderer and the evaluator must handle a new variant
// before it compiles.
pub enum Condition {
    /// `attribute_exists(a)`
    Exists(Attr),
    /// `attribute_not_exists(a)`
    NotExists(Attr),
    /// `a <op> v`
    Compare(Attr, Compare, Value),
    /// `contains(a, v)`: a string set or list holding the string `v`.
    Contains(Attr, String),
    /// `NOT (c)`
    Not(Box<Condition>),
    /// Every one holds (none: true).
    All(Vec<Condition>),
    /// Any one holds (none: false).
    Any(Vec<Condition>),
}

/// What an item holds at an attribute, as far as conditions read it.
// Exhaustive on purpose: the renderer and the evaluator must handle a new variant
// before it compiles.
pub enum Found<'a> {
    /// A string.
    S(std::borrow::Cow<'a, str>),
    /// A number.
    N(i64),
    /// A string set or a list of strings: whether it holds a string.
    Strings(Box<dyn Fn(&str) -> bool + 'a>),
    /// Something the conditions never compare (a map, a boolean): it exists.
    Other,
}

/// An item a condition can be evaluated on.
pub trait Item {
    /// Returns what the item holds at `attr`; `None` when the attribute is missing.
    fn at(&self, attr: Attr) -> Option<Found<'_>>;
}

impl Condition {
    /// Returns the condition `a = v`.
    pub fn eq(attr: Attr, value: Value) -> Self {
        Self::Compare(attr, Compare::Eq, value)
    }

    /// Returns the condition `NOT contains(a, v)`.
    pub fn lacks(attr: Attr, member: impl Into<String>) -> Self {
        Self::Not(Box::new(Self::Contains(attr, member.into())))
    }

    /// Tells whether the condition holds for `item` (`None`: the item does not exist), as
    /// DynamoDB evaluates it.
    pub fn holds(&self, item: Option<&dyn Item>) -> bool {
        let at = |attr: Attr| item.and_then(|i| i.at(attr));
        match self {
            Self::Exists(a) => at(*a).is_some(),
            Self::NotExists(a) => at(*a).is_none(),
            Self::Compare(a, op, v) => {
                let ordering = match (at(*a), v) {
                    (Some(Found::S(s)), Value::S(w)) => s.as_ref().cmp(w.as_str()),
                    (Some(Found::N(n)), Value::N(w)) => n.cmp(w),
                    _ => return false,
                };
                match op {
                    Compare::Eq => ordering.is_eq(),
                    Compare::Lt => ordering.is_lt(),
                    Compare::Le => ordering.is_le(),
                    Compare::Ge => ordering.is_ge(),
                }
            }
            Self::Contains(a, member) => match at(*a) {
                Some(Found::Strings(has)) => has(member),
                Some(Found::S(s)) => s.contains(member.as_str()),
                _ => false,
            },
            Self::Not(c) => !c.holds(item),
            Self::All(cs) => cs.iter().all(|c| c.holds(item)),
            Self::Any(cs) => cs.iter().any(|c| c.holds(item)),
        }
    }

    /// Returns the condition expression DynamoDB takes, with its placeholders (`#cN` for names,
    /// `:cN` for values, so they never meet an update expression's); `None` for a
    /// condition that always holds (an empty [`Condition::All`]).
    pub fn render(&self) -> Option<Expression> {
        if matches!(self, Self::All(cs) if cs.is_empty()) {
            return None;
        }
        let mut out = Expression::default();
        let text = out.write(self);
        out.text = text;
        Some(out)
    }
}

/// A rendered condition: its text and the placeholders it uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Expression {
    /// The condition expression.
    pub text: String,
    /// `#cN` → attribute name.
    pub names: BTreeMap<String, String>,
    /// `:cN` → value.
    pub values: BTreeMap<String, Value>,
}

impl Expression {
    fn name(&mut self, name: &str) -> String {
        if let Some((k, _)) = self.names.iter().find(|(_, v)| v.as_str() == name) {
            return k.clone();
        }
        let key = format!("#c{}", self.names.len());
        self.names.insert(key.clone(), name.to_string());
        key
    }

    fn value(&mut self, value: &Value) -> String {
        if let Some((k, _)) = self.values.iter().find(|(_, v)| *v == value) {
            return k.clone();
        }
        let key = format!(":c{}", self.values.len());
        self.values.insert(key.clone(), value.clone());
        key
    }

    fn path(&mut self, attr: Attr) -> String {
        attr.0
            .iter()
            .map(|n| self.name(n))
            .collect::<Vec<_>>()
            .join(".")
    }

    fn write(&mut self, c: &Condition) -> String {
        match c {
            Condition::Exists(a) => format!("attribute_exists({})", self.path(*a)),
            Condition::NotExists(a) => format!("attribute_not_exists({})", self.path(*a)),
            Condition::Compare(a, op, v) => {
                let op = match op {
                    Compare::Eq => "=",
                    Compare::Lt => "<",
                    Compare::Le => "<=",
                    Compare::Ge => ">=",
                };
                format!("{} {op} {}", self.path(*a), self.value(v))
            }
            Condition::Contains(a, m) => {
                let path = self.path(*a);
                format!("contains({path}, {})", self.value(&Value::S(m.clone())))
            }
            Condition::Not(c) => format!("NOT ({})", self.write(c)),
            // Never built by `conditions`; written as DynamoDB would read them anyway.
            Condition::All(cs) if cs.is_empty() => {
                let key = self.path(attr::ITEM_ID);
                format!("attribute_exists({key}) OR attribute_not_exists({key})")
            }
            Condition::Any(cs) if cs.is_empty() => {
                let key = self.path(attr::ITEM_ID);
                format!("attribute_exists({key}) AND attribute_not_exists({key})")
            }
            Condition::All(cs) => self.join(cs, " AND "),
            Condition::Any(cs) => self.join(cs, " OR "),
        }
    }

    fn join(&mut self, cs: &[Condition], with: &str) -> String {
        let parts: Vec<String> = cs.iter().map(|c| format!("({})", self.write(c))).collect();
        parts.join(with)
    }
}

/// A stored record as the conditions read it: the record and what the store keeps beside
/// it (the lease's owner, the attempt ids and claimed DLQ messages).
pub struct StoredRecord<'a> {
    /// The record.
    pub record: &'a DeadLetteredItem,
    /// The run holding its lease.
    pub lease_owner: Option<&'a str>,
    /// Whether an attempt id is in `attempt_ids`; `None` when the set is empty (DynamoDB
    /// keeps no empty set: the attribute is missing).
    pub attempt_ids: Option<&'a dyn Fn(&str) -> bool>,
    /// Whether a claim's element is in `dlq_claims`; `None` when the set is empty.
    pub claims: Option<&'a dyn Fn(&str) -> bool>,
    /// Whether a message id is in `dlq_sent`; `None` when the set is empty.
    pub sent: Option<&'a dyn Fn(&str) -> bool>,
}

impl Item for StoredRecord<'_> {
    fn at(&self, attr: Attr) -> Option<Found<'_>> {
        let r = self.record;
        let s = |text: &str| Some(Found::S(std::borrow::Cow::Owned(text.to_string())));
        match attr {
            attr::ITEM_ID => Some(Found::S(r.item_id.as_str().into())),
            attr::STATUS => Some(Found::S(r.status.as_str().into())),
            attr::LAST_ATTEMPT => s(&crate::time_format::format(&r.last_attempt)),
            attr::FAILURE_COUNT => Some(Found::N(i64::from(r.failure_count))),
            attr::HISTORY_OMITTED => Some(Found::N(i64::from(r.history_omitted))),
            attr::ATTEMPT_IDS => self.attempt_ids.map(|has| Found::Strings(Box::new(has))),
            attr::DLQ_CLAIMS => self.claims.map(|has| Found::Strings(Box::new(has))),
            attr::DLQ_SENT => self.sent.map(|has| Found::Strings(Box::new(has))),
            // A list, left out of the item when empty (as `schema::record_to_item` writes it).
            attr::PROCESSED => (!r.processed.is_empty())
                .then(|| Found::Strings(Box::new(|k| r.processed.iter().any(|p| p == k)))),
            attr::REQUEUED_MESSAGE_ID => {
                r.requeued_message_id.as_deref().map(|m| Found::S(m.into()))
            }
            attr::LEASE_OWNER => self.lease_owner.map(|o| Found::S(o.into())),
            attr::LEASE_EXPIRES_AT => r.lease_expires_at.map(Found::N),
            attr::PAYLOAD_SHA256 => Some(Found::S(r.payload.sha256.as_str().into())),
            attr::SOURCE_MESSAGE_ID => Some(Found::S(r.source.message_id.as_str().into())),
            _ => None,
        }
    }
}

/// The store's conditions, one function each; the DynamoDB adapter and the in-memory
/// stores take them from here.
pub mod conditions {
    use super::{attr, Compare, Condition, Value};
    use crate::dead_letter::ItemStatus;

    fn status(s: ItemStatus) -> Condition {
        Condition::eq(attr::STATUS, Value::s(s.as_str()))
    }

    /// Requires that a run may take the lease: the item is dead, or its redrive died holding a lease
    /// that has expired by `now` (epoch seconds) (docs/ARCHITECTURE.md §3).
    ///
    /// A dead item may still hold a live lease. A worker that records a new failure while a
    /// run holds the item sets it dead and leaves the lease in place. That run is still
    /// processing, so no other run takes the item until the run gives the lease back or
    /// the lease expires.
    pub fn lease_is_free(now: i64) -> Condition {
        let dead = status(ItemStatus::Dead);
        if crate::mutants::is_on(crate::mutants::Mutant::LeasesNeverTakenBack) {
            return dead;
        }
        let expired = Condition::Compare(attr::LEASE_EXPIRES_AT, Compare::Lt, Value::N(now));
        let no_live_lease = Condition::Any(vec![
            Condition::NotExists(attr::LEASE_EXPIRES_AT),
            expired.clone(),
        ]);
        let dead_and_free =
            if crate::mutants::is_on(crate::mutants::Mutant::LeaseTakenUnderNewFailure) {
                dead
            } else {
                Condition::All(vec![dead, no_live_lease])
            };
        Condition::Any(vec![
            dead_and_free,
            Condition::All(vec![status(ItemStatus::Redriving), expired]),
        ])
    }

    /// Requires that `owner` holds the lease and the item is still redriving: what a run's failure
    /// write needs. A worker's new failure meanwhile set the item dead with another payload,
    /// and the run's failure of the old payload must not overwrite that record's error.
    pub fn still_redriving(owner: &str) -> Condition {
        if crate::mutants::is_on(crate::mutants::Mutant::LeaseTakenUnderNewFailure) {
            return leased_by(owner);
        }
        Condition::All(vec![leased_by(owner), status(ItemStatus::Redriving)])
    }

    /// Requires that `owner` holds the lease.
    pub fn leased_by(owner: &str) -> Condition {
        Condition::eq(attr::LEASE_OWNER, Value::s(owner))
    }

    /// Requires [`crate::dead_letter::LEASED_WITH_PAYLOAD`]: `owner` holds the lease, the
    /// item is redriving, and it still holds the payload `sha256` the run processed.
    pub fn leased_with_payload(owner: &str, sha256: &str) -> Condition {
        Condition::All(vec![
            leased_by(owner),
            status(ItemStatus::Redriving),
            Condition::eq(attr::PAYLOAD_SHA256, Value::s(sha256)),
        ])
    }

    /// Requires that the record waits for the requeued message `message_id`.
    pub fn requeued_as(message_id: &str) -> Condition {
        Condition::All(vec![
            status(ItemStatus::Requeued),
            Condition::eq(attr::REQUEUED_MESSAGE_ID, Value::s(message_id)),
        ])
    }

    /// Requires that the worker finished `message_id`, which the run `run` requeued with the payload
    /// `sha256`: the record waits for that message, or the run still holds it with that
    /// payload (the worker finished before the run marked it requeued).
    pub fn finishes_requeued(message_id: &str, run: &str, sha256: &str) -> Condition {
        if crate::mutants::is_on(crate::mutants::Mutant::RequeueFinishNeedsMark) {
            return requeued_as(message_id);
        }
        Condition::Any(vec![
            requeued_as(message_id),
            leased_with_payload(run, sha256),
        ])
    }

    /// Requires that the worker finished a DLQ message moved back from outside, carrying the payload
    /// `sha256` (the digest of what it carried, never one it states): the record is dead
    /// holding that payload. Its source message id alone is not enough: a producer's
    /// message can carry any attributes, and would resolve a record whose payload it
    /// never delivered.
    pub fn finishes_moved_back(sha256: &str) -> Condition {
        Condition::All(vec![
            status(ItemStatus::Dead),
            Condition::eq(attr::PAYLOAD_SHA256, Value::s(sha256)),
        ])
    }

    /// Guards an attempt write: none of `attempt_ids` is recorded, and the record is as `expect`
    /// requires. With a `claim`: neither a twin nor the receive just before holds it, and
    /// its message's DLQ message is not sent. A claim held by an earlier receive does not
    /// refuse the write, which takes it over ([`crate::dead_letter::DlqClaim`]).
    pub fn records_attempts(
        attempt_ids: &[&str],
        claim: Option<&crate::dead_letter::DlqClaim>,
        expect: &crate::ports::Expect,
    ) -> Condition {
        let mut all: Vec<Condition> = attempt_ids
            .iter()
            .map(|id| Condition::lacks(attr::ATTEMPT_IDS, *id))
            .collect();
        if let Some(claim) = claim {
            all.push(Condition::lacks(attr::DLQ_CLAIMS, claim.element()));
            // The receive just before may still be running (its visibility lapsed while it
            // ran): its claim is not taken over ([`crate::dead_letter::DlqClaim::is_held_elsewhere`]).
            if let Some(previous) = claim.previous() {
                all.push(Condition::lacks(attr::DLQ_CLAIMS, previous.element()));
            }
            all.push(Condition::lacks(attr::DLQ_SENT, claim.message_id.as_str()));
        }
        match expect {
            crate::ports::Expect::Any => {}
            crate::ports::Expect::Absent => all.push(Condition::NotExists(attr::ITEM_ID)),
            crate::ports::Expect::Status {
                status: s,
                not_processed,
            } => {
                all.push(status(*s));
                all.extend(
                    not_processed
                        .iter()
                        .map(|k| Condition::lacks(attr::PROCESSED, k.as_str())),
                );
            }
        }
        Condition::All(all)
    }

    /// Guards a compaction: the record still counts `failure_count` attempts (no append
    /// since it was read).
    pub fn counts(failure_count: u32) -> Condition {
        Condition::eq(attr::FAILURE_COUNT, Value::N(i64::from(failure_count)))
    }

    /// Guards a compaction of `stored`: no append since it was read ([`counts`]), and no other
    /// compaction of the same read either. Compaction leaves `failure_count` as it is, so
    /// two built from one read both held [`counts`], and `history_omitted` counted the
    /// dropped attempts twice. An item written before the attribute existed lacks it.
    pub fn compacts(stored: &crate::dead_letter::DeadLetteredItem) -> Condition {
        let omitted = Condition::eq(
            attr::HISTORY_OMITTED,
            Value::N(i64::from(stored.history_omitted)),
        );
        let omitted = if stored.history_omitted == 0 {
            Condition::Any(vec![Condition::NotExists(attr::HISTORY_OMITTED), omitted])
        } else {
            omitted
        };
        Condition::All(vec![counts(stored.failure_count), omitted])
    }

    /// Guards a removal: the record is still `status` with its last attempt at `last_attempt`.
    pub fn unchanged_since(status_now: ItemStatus, last_attempt: &str) -> Condition {
        Condition::All(vec![
            status(status_now),
            Condition::eq(attr::LAST_ATTEMPT, Value::s(last_attempt)),
        ])
    }

    /// Requires that the record exists.
    pub fn exists() -> Condition {
        Condition::Exists(attr::ITEM_ID)
    }
}

/// Returns the epoch milliseconds of `at` (0 before the epoch), as the breaker and
/// idempotency items store their times and their conditions compare them.
pub fn epoch_millis(at: std::time::SystemTime) -> i64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The circuit breaker's item (one per breaker, key `id`) and the conditions of its
/// writes, defined once: the DynamoDB adapter sends them, the in-memory store (the unit
/// tests' and the simulation's) evaluates them (docs/ARCHITECTURE.md §7).
pub mod breaker {
    use super::{epoch_millis, Attr, Compare, Condition, Found, Item, Value};
    use crate::breaker::BreakerState;

    /// When the open period ends (epoch ms); missing while closed.
    pub const OPEN_UNTIL: Attr = Attr(&["open_until_ms"]);
    /// Times it opened in a row.
    pub const OPENS: Attr = Attr(&["opens"]);
    /// Failures counted in the current window.
    pub const FAILURES: Attr = Attr(&["failures"]);
    /// When the current window started (epoch ms).
    pub const WINDOW_START: Attr = Attr(&["window_start_ms"]);
    /// Until when the probe is taken (epoch ms).
    pub const PROBE_UNTIL: Attr = Attr(&["probe_until_ms"]);

    fn at(attr: Attr, op: Compare, ms: i64) -> Condition {
        Condition::Compare(attr, op, Value::N(ms))
    }

    /// Requires that a window started at or after `floor_ms` is current: failures are added to it.
    pub fn window_current(floor_ms: i64) -> Condition {
        at(WINDOW_START, Compare::Ge, floor_ms)
    }

    /// Requires that there is no window, or one started before `floor_ms`: a new one starts.
    pub fn window_lapsed(floor_ms: i64) -> Condition {
        Condition::Any(vec![
            Condition::NotExists(WINDOW_START),
            at(WINDOW_START, Compare::Lt, floor_ms),
        ])
    }

    /// Requires that it is not open at `now_ms`: it may open (one sandbox opens it; the
    /// others find it open).
    pub fn may_open(now_ms: i64) -> Condition {
        Condition::Any(vec![
            Condition::NotExists(OPEN_UNTIL),
            at(OPEN_UNTIL, Compare::Le, now_ms),
        ])
    }

    /// Requires that it is half-open at `now_ms` with no probe running: one sandbox takes
    /// the probe.
    pub fn probe_free(now_ms: i64) -> Condition {
        Condition::All(vec![
            at(OPEN_UNTIL, Compare::Le, now_ms),
            Condition::Any(vec![
                Condition::NotExists(PROBE_UNTIL),
                at(PROBE_UNTIL, Compare::Le, now_ms),
            ]),
        ])
    }

    /// Requires that the probe is still the one taken until `until_ms`: its taker may give it back.
    pub fn probe_held_until(until_ms: i64) -> Condition {
        at(PROBE_UNTIL, Compare::Eq, until_ms)
    }

    /// A breaker's state as its item holds it.
    pub struct StoredBreaker<'a>(pub &'a BreakerState);

    impl Item for StoredBreaker<'_> {
        fn at(&self, attr: Attr) -> Option<Found<'_>> {
            let s = self.0;
            let time = |t: Option<std::time::SystemTime>| t.map(|t| Found::N(epoch_millis(t)));
            match attr {
                OPEN_UNTIL => time(s.open_until),
                WINDOW_START => time(s.window_start),
                PROBE_UNTIL => time(s.probe_until),
                OPENS => Some(Found::N(i64::from(s.opens))),
                FAILURES => Some(Found::N(i64::from(s.failures))),
                _ => None,
            }
        }
    }
}

/// The idempotency table's item (one per key) and the conditions of its writes, defined
/// once: the DynamoDB adapter sends them, the in-memory store evaluates them
/// (docs/ARCHITECTURE.md §6).
pub mod idempotency {
    use super::{Attr, Compare, Condition, Found, Item, Value};

    /// The partition key.
    pub const ID: Attr = Attr(&["id"]);
    /// `in_progress` or `completed`.
    pub const STATUS: Attr = Attr(&["status"]);
    /// The attempt holding the claim.
    pub const TOKEN: Attr = Attr(&["token"]);
    /// When a claim ends or a completion expires (epoch ms).
    pub const UNTIL: Attr = Attr(&["until_ms"]);
    /// [`STATUS`] of a claim being worked on.
    pub const IN_PROGRESS: &str = "in_progress";
    /// [`STATUS`] of a key done.
    pub const COMPLETED: &str = "completed";

    /// Requires that the key may be claimed at `now_ms`: no item, or one whose claim or completion has
    /// ended (DynamoDB's TTL deletes expired items late, so expiry is read, not awaited).
    pub fn claimable(now_ms: i64) -> Condition {
        Condition::Any(vec![
            Condition::NotExists(ID),
            Condition::Compare(UNTIL, Compare::Lt, Value::N(now_ms)),
        ])
    }

    /// Requires that the attempt `token` holds the claim, still in progress: it may complete or release
    /// it (a claim taken over after it ended is no longer its own).
    pub fn held_by(token: &str) -> Condition {
        Condition::All(vec![
            Condition::eq(TOKEN, Value::s(token)),
            Condition::eq(STATUS, Value::s(IN_PROGRESS)),
        ])
    }

    /// An idempotency item as its conditions read it.
    pub struct StoredClaim<'a> {
        /// The key.
        pub key: &'a str,
        /// The attempt holding it.
        pub token: &'a str,
        /// Whether it is completed.
        pub completed: bool,
        /// When its claim ends or its completion expires (epoch ms).
        pub until_ms: i64,
    }

    impl Item for StoredClaim<'_> {
        fn at(&self, attr: Attr) -> Option<Found<'_>> {
            match attr {
                ID => Some(Found::S(self.key.into())),
                TOKEN => Some(Found::S(self.token.into())),
                STATUS => Some(Found::S(
                    if self.completed {
                        COMPLETED
                    } else {
                        IN_PROGRESS
                    }
                    .into(),
                )),
                UNTIL => Some(Found::N(self.until_ms)),
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_renders_with_placeholders_of_its_own_each_name_and_value_once() {
        let rendered = conditions::leased_with_payload("run-1", "abc")
            .render()
            .unwrap();
        assert_eq!(
            rendered.text,
            "(#c0 = :c0) AND (#c1 = :c1) AND (#c2.#c3 = :c2)"
        );
        assert_eq!(
            rendered
                .names
                .values()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["lease_owner", "status", "payload", "sha256"]
        );
        assert_eq!(
            rendered.values.values().cloned().collect::<Vec<_>>(),
            [Value::s("run-1"), Value::s("redriving"), Value::s("abc")]
        );
        // A status named twice is one placeholder, and so is the expiry compared twice.
        let lease = conditions::lease_is_free(5).render().unwrap();
        assert_eq!(
            lease.text,
            "((#c0 = :c0) AND ((attribute_not_exists(#c1)) OR (#c1 < :c1))) \
             OR ((#c0 = :c2) AND (#c1 < :c1))"
        );
        assert_eq!(lease.values[":c1"], Value::N(5));
    }

    #[test]
    fn a_condition_that_always_holds_sends_no_expression() {
        let any = conditions::records_attempts(&[], None, &crate::ports::Expect::Any);
        assert!(any.render().is_none());
        assert!(any.holds(None));
    }

    #[test]
    fn comparisons_with_missing_or_mistyped_attributes_fail_and_contains_on_nothing_is_false() {
        struct Only(Attr, i64);
        impl Item for Only {
            fn at(&self, attr: Attr) -> Option<Found<'_>> {
                (attr == self.0).then_some(Found::N(self.1))
            }
        }
        let item = Only(attr::LEASE_EXPIRES_AT, 10);
        let lt = |n| Condition::Compare(attr::LEASE_EXPIRES_AT, Compare::Lt, Value::N(n));
        assert!(lt(11).holds(Some(&item)));
        assert!(!lt(10).holds(Some(&item)));
        // A number compared with a string, and an attribute the item lacks.
        assert!(!Condition::eq(attr::LEASE_EXPIRES_AT, Value::s("10")).holds(Some(&item)));
        assert!(!Condition::eq(attr::STATUS, Value::s("dead")).holds(Some(&item)));
        assert!(Condition::lacks(attr::ATTEMPT_IDS, "a1").holds(Some(&item)));
        assert!(Condition::lacks(attr::ATTEMPT_IDS, "a1").holds(None));
        assert!(Condition::NotExists(attr::ITEM_ID).holds(None));
        assert!(!conditions::exists().holds(None));
    }
}
