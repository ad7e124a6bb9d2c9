//! Dead-letter recording: how a failed record becomes durable (docs/ARCHITECTURE.md §1.1).
//! Dead-lettering a record is three writes, in this order:
//!
//! | step | write | when it fails |
//! | --- | --- | --- |
//! | 1 | the payload to the payload store, when the record would not stay small ([`stays_inline`]) | the record is returned for retry |
//! | 2 | the [`DeadLetteredItem`] upserted into its record, claiming the source message's one DLQ message | returned for retry; a delivery finding the claim taken gets `dead_lettering_elsewhere` |
//! | 3 | one DLQ message per record (batched) carrying the item id and the body or a pointer to it | the claim is released, so the next delivery sends it; returned for retry |
//!
//! Only when all three succeed is the record reported as dead-lettered (and acked).
//!
//! Step 2 merges into any existing record of the same item, by one conditional write
//! ([`RecordStore::try_record`]) and what follows it:
//!
//! | the write finds | result |
//! | --- | --- |
//! | none of the pending attempt ids recorded, the claim free or held only by earlier receives, the DLQ message not sent | appended; `failure_count` counts them; the claim taken (over an earlier receive's: [`crate::dead_letter::DlqClaim`]) |
//! | some attempt ids recorded, or the claim held at this receive (a twin) | refused: the known attempts (and those of a delivery with a sibling attempt known: its twin wrote them, `is_recorded`) are dropped, and the claim when a twin or a later receive holds it; the write is tried again (at most 5 rounds) |
//! | the DLQ message marked sent | nothing appended: the delivery is acknowledged ([`Delivery::AlreadySent`]) |
//! | every attempt already recorded (the same delivery, invoked twice) | nothing to write: the claim is not held |
//! | after an append: the review flag disagrees with the whole history | the flag set ([`review_flag_change`]) |
//! | after an append: the history past its limit | compacted ([`compaction_of`]); a failure only logged (the record is durable) |
//!
//! The logic runs over the store's ports ([`crate::ports::RecordStore`] and the other port
//! traits): the record table's reads and
//! conditional writes ([`RecordStore`]), the payload bucket ([`PayloadStore::put`]) and the
//! DLQ ([`DeadLetterQueue::send_to_dlq`]); DynamoDB, S3 and SQS in production
//! (`sqs_keeper_aws::DeadLetterStore`), the in-memory world in tests and the
//! simulation ([`crate::testing::MemoryStore`]). No I/O of its own.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;

use crate::dead_letter::{
    compact_history, dead_lettering_elsewhere, needs_manual_review, DeadLetterCandidate,
    DeadLetteredItem, FailureDetail, InvocationInfo, PayloadLocation,
};
use crate::error::{ErrorClass, ProcessError};
use crate::pointer::S3Pointer;
use crate::ports::{DeadLetterQueue, PayloadStore, RecordStore};

use crate::pointer::payload_key;
use crate::ports::{Compaction, Expect};

/// Most bytes a record is planned to take: 19,600 B under DynamoDB's 400 KB item limit
/// (409,600 B), for what the plan does not count exactly (attribute names, numbers).
pub const RECORD_BUDGET: usize = 390_000;

/// Most bytes one history entry takes once bounded ([`FailureDetail::bounded`]: 1 KiB
/// message, 6 causes of 256 B, a 512 B response excerpt, the clipped code, step and
/// invocation fields, the ids and the numbers; a test measures the largest).
pub const HISTORY_ENTRY_MAX: usize = 4096;

/// Most history entries a record holds at any moment: the limit, and the attempts of the
/// delivery a write appends before the follow-up write compacts them.
pub const HISTORY_ENTRIES_MAX: usize =
    crate::dead_letter::HISTORY_LIMIT + crate::retry::MAX_ATTEMPTS_PER_INVOCATION as usize;

/// Tells whether a body of `len` bytes stays inline in its record: within `inline_max`, and small
/// enough that the record stays within [`RECORD_BUDGET`] with the fullest history it can
/// hold ([`HISTORY_ENTRIES_MAX`] entries of [`HISTORY_ENTRY_MAX`]), the capped attributes
/// and the rest of the record. A larger body goes to S3, whatever `DLQ_INLINE_MAX_BYTES`
/// allows.
///
/// The rest is 16 KiB: the record's other fields and its sets of attempt ids, claims and
/// "sent" marks. With SQS's longest message ids (100 characters), those sets reach about
/// 22 KB; entries stored below their bound and the budget's 19,600 B margin absorb the
/// difference. A test writes that worst case to DynamoDB Local
/// (`a_record_of_many_long_message_ids_is_written`).
pub fn stays_inline(len: usize, inline_max: usize) -> bool {
    let rest =
        HISTORY_ENTRIES_MAX * HISTORY_ENTRY_MAX + crate::dead_letter::ATTRIBUTES_LIMIT + 16 * 1024;
    len <= inline_max && len + rest <= RECORD_BUDGET
}

/// Most "DLQ message sent" marks a record keeps for messages whose every history entry
/// compaction dropped. A twin of such a message's delivery, or its next receive, still
/// finds its mark and sends nothing more. The oldest go first: a message is delivered again
/// within its visibility timeout, long before 32 others of the same item are dead-lettered.
pub const SENT_MARKS_FORGOTTEN_MAX: usize = 32;

/// Returns the compaction a record just written needs: `None` while its history is within
/// `history_limit`.
///
/// `written.sent` holds the source messages whose DLQ message is marked sent. The claim of
/// a message whose every entry goes, at its latest receive, is kept unless that message is
/// among them: its DLQ send may be under way (another message of the same item written in
/// the same batch grew the history). Dropping it would let a twin of that delivery claim
/// and send again, and append its attempts a second time. The "sent" mark of such a
/// message stays, listed in [`Compaction::forgotten_sent`], for the same reason.
pub fn compaction_of(written: &crate::ports::Written, history_limit: usize) -> Option<Compaction> {
    let stored = &written.record;
    let history_limit = limit_keeping_latest(&stored.failure_history, history_limit);
    if stored.failure_history.len() <= history_limit {
        return None;
    }
    let (history, dropped) = compact_history(stored.failure_history.clone(), history_limit);
    let kept = if crate::mutants::is_on(crate::mutants::Mutant::UnboundedAttemptIds) {
        &stored.failure_history
    } else {
        &history
    };
    let mut attempt_ids: Vec<String> = kept.iter().map(|f| f.attempt_id.clone()).collect();
    let kept_messages: HashSet<&str> = history.iter().map(|f| f.message_id.as_str()).collect();
    if !crate::mutants::is_on(crate::mutants::Mutant::UnboundedAttemptIds) {
        attempt_ids.extend(last_attempts_dropped(&stored.failure_history, &history));
        let room = attempt_ids_room(history.len()).saturating_sub(attempt_ids.len());
        let carried = unsent_deliveries_dropped(written, &attempt_ids, room);
        attempt_ids.extend(carried);
    }
    let dropped_claims = dropped_claims(written, &kept_messages);
    let (forgotten_sent, unmarked) = sent_marks_forgotten(written, &kept_messages);
    let skip = stored
        .processed
        .len()
        .saturating_sub(crate::dead_letter::PROCESSED_LIMIT);
    Some(Compaction {
        attempt_ids,
        dropped_claims,
        forgotten_sent,
        unmarked,
        processed: stored.processed[skip..].to_vec(),
        dropped: u32::try_from(dropped).unwrap_or(u32::MAX),
        history,
    })
}

/// Attempt ids a compacted record keeps beyond twice its entries, for deliveries whose DLQ
/// send failed ([`attempt_ids_room`]).
///
/// Sixteen ids cover eight such deliveries of one item at once. They add at most 1.8 KB
/// with SQS's longest message ids, which the margin of [`RECORD_BUDGET`] absorbs
/// ([`stays_inline`]).
pub const ATTEMPT_IDS_SPARE: usize = 16;

/// Returns how many attempt ids a compacted record keeps at most: twice the entries it keeps,
/// and [`ATTEMPT_IDS_SPARE`] more.
///
/// The spare matters under a short history. A record of two entries otherwise keeps four
/// ids, and the ids of a delivery whose DLQ send failed do not fit. Its twin then appends
/// its attempts a second time (found by the simulation's `compaction` worlds 178 and 684).
pub fn attempt_ids_room(entries_kept: usize) -> usize {
    if crate::mutants::is_on(crate::mutants::Mutant::CompactionRoomByHistoryKept) {
        return 2 * entries_kept;
    }
    2 * entries_kept + ATTEMPT_IDS_SPARE
}

/// Returns the list of "sent" marks whose message keeps no entry, oldest first, and the marks that
/// go because the list is full ([`SENT_MARKS_FORGOTTEN_MAX`]).
///
/// The list keeps its order and takes the newly forgotten messages at its end, in history
/// order. A mark outside the history and the list (its delivery marked it after an earlier
/// compaction dropped its entries) joins at the end too, so no mark stays for ever. Such a
/// mark is recent though its entries were old: it was set since the last compaction, and a
/// twin or a redelivery of its message comes within a visibility timeout of the send. Several
/// join in name order, a tie-break among marks set since the same compaction. Marks not read
/// (`written.forgotten_sent` is `None`) are left alone.
fn sent_marks_forgotten(
    written: &crate::ports::Written,
    kept_messages: &HashSet<&str>,
) -> (Option<Vec<String>>, Vec<String>) {
    let Some(listed) = &written.forgotten_sent else {
        return (None, Vec::new());
    };
    if crate::mutants::is_on(crate::mutants::Mutant::CompactionForgetsSentMarks) {
        let unmarked = forgotten_messages(&written.record.failure_history, kept_messages);
        return (Some(listed.clone()), unmarked);
    }
    let outside = |m: &str| written.sent.contains(m) && !kept_messages.contains(m);
    let mut list: Vec<String> = Vec::new();
    let history = written.record.failure_history.iter().map(|f| &f.message_id);
    let mut rest: Vec<&String> = written.sent.iter().collect();
    rest.sort();
    for message in listed.iter().chain(history).chain(rest) {
        if outside(message) && !list.contains(message) {
            list.push(message.clone());
        }
    }
    let excess = list.len().saturating_sub(SENT_MARKS_FORGOTTEN_MAX);
    let unmarked = list.drain(..excess).collect();
    (Some(list), unmarked)
}

/// Returns the messages of `history` with no entry among `kept_messages`, in order, once each.
fn forgotten_messages(history: &[FailureDetail], kept_messages: &HashSet<&str>) -> Vec<String> {
    let mut forgotten: Vec<String> = Vec::new();
    for f in history {
        if !kept_messages.contains(f.message_id.as_str()) && !forgotten.contains(&f.message_id) {
            forgotten.push(f.message_id.clone());
        }
    }
    forgotten
}

/// Returns the claim elements a compaction drops, in order, once each: of the claims the history's
/// entries name and of those in `written.claims`.
///
/// A claim whose message's DLQ message is marked sent holds nothing back, unless it is
/// at the latest receive of a message whose entries are kept. The "sent" mark guards that
/// message from then on ([`SENT_MARKS_FORGOTTEN_MAX`]). A claim two or more receives
/// before the message's latest is dropped too. A later delivery takes such a claim over
/// ([`crate::dead_letter::DlqClaim`]), so it no longer holds anything back.
///
/// An unsent claim at the message's latest receive or the receive just before it stays.
/// Its delivery may still be running: a twin invoked with the same receive, or a delivery
/// whose visibility lapsed while it ran. Dropping it would let that delivery's twin, or
/// the next receive, claim and send a second DLQ message, and the twin would append its
/// attempts a second time (found by the simulation, seeds 138109 and 391046). An element
/// kept before receive counts were (the message id alone) is left: it may spell another
/// message's claim (`x:3` is message `x`'s at receive 3), and it holds nothing back either.
fn dropped_claims(written: &crate::ports::Written, kept_messages: &HashSet<&str>) -> Vec<String> {
    let mut named: Vec<crate::dead_letter::DlqClaim> = written
        .record
        .failure_history
        .iter()
        .map(|f| crate::dead_letter::DlqClaim::new(&f.message_id, f.receive_count))
        .collect();
    let mut stored: Vec<&String> = written.claims.iter().collect();
    stored.sort();
    named.extend(
        stored
            .into_iter()
            .map(|element| crate::dead_letter::DlqClaim::parse(element))
            .filter(|claim| claim.receive_count > 0),
    );
    let latest = latest_receives(
        named
            .iter()
            .map(|c| (c.message_id.as_str(), c.receive_count)),
    );
    let mut dropped: Vec<String> = Vec::new();
    for claim in &named {
        let message = claim.message_id.as_str();
        let latest_receive = latest.get(message).copied().unwrap_or(0);
        let sent = written.sent.contains(message);
        let element = claim.element();
        if claim_goes(
            claim.receive_count,
            latest_receive,
            kept_messages.contains(message),
            sent,
        ) && !dropped.contains(&element)
        {
            dropped.push(element);
        }
    }
    dropped
}

/// Returns the latest receive of each message among `receives` (message, receive count).
fn latest_receives<'a>(
    receives: impl IntoIterator<Item = (&'a str, u32)>,
) -> std::collections::HashMap<&'a str, u32> {
    let mut latest = std::collections::HashMap::new();
    for (message, receive) in receives {
        let count = latest.entry(message).or_insert(0);
        *count = receive.max(*count);
    }
    latest
}

/// Tells whether compaction drops a claim at `receive` of a message whose latest receive is
/// `latest` ([`dropped_claims`]).
fn claim_goes(receive: u32, latest: u32, kept: bool, sent: bool) -> bool {
    use crate::mutants::{is_on, Mutant};
    if receive == latest {
        !kept && (sent || is_on(Mutant::CompactionDropsUnsentClaims))
    } else if receive.saturating_add(1) == latest {
        sent || is_on(Mutant::CompactionDropsRunningClaim)
    } else {
        true
    }
}

/// `limit`, raised as far as needed for the kept tail to hold the latest worker delivery
/// whole (its attempts, ids `<message id>:<receive>:<attempt>`, at most
/// [`crate::retry::MAX_ATTEMPTS_PER_INVOCATION`]). That delivery may record its attempts
/// again (its DLQ send failed and its claim was released): an attempt dropped with its id
/// would be appended twice (found by the simulation, seed 1554, whose history limit is 4).
fn limit_keeping_latest(history: &[crate::dead_letter::FailureDetail], limit: usize) -> usize {
    let Some(last) = history.last() else {
        return limit;
    };
    if crate::mutants::is_on(crate::mutants::Mutant::DroppedAttemptRecordedAgain) {
        return limit;
    }
    let prefix = format!("{}:{}:", last.message_id, last.receive_count);
    let cap = crate::retry::MAX_ATTEMPTS_PER_INVOCATION as usize;
    let latest = history
        .iter()
        .rev()
        .take_while(|f| f.attempt_id.starts_with(prefix.as_str()))
        .take(cap)
        .count();
    let mut raised = limit;
    while raised - crate::dead_letter::HISTORY_HEAD.min(raised / 2) < latest {
        raised += 1;
    }
    raised
}

/// Returns the ids of the last attempt of each delivery the compacted `history` keeps entries of,
/// where compaction dropped that last attempt's entry: one id per such delivery, so these
/// and the kept entries' ids stay within twice the entries kept. A twin of that delivery
/// (invoked twice) that records its attempts afterwards finds them covered by the later
/// sibling ([`is_recorded`])
/// instead of appending the dropped one again (found by the simulation, seed 30456: the
/// head kept a delivery's first two attempts and dropped its third).
fn last_attempts_dropped(
    stored: &[crate::dead_letter::FailureDetail],
    history: &[crate::dead_letter::FailureDetail],
) -> Vec<String> {
    let kept: HashSet<&str> = history.iter().map(|f| f.attempt_id.as_str()).collect();
    let mut ids: Vec<String> = Vec::new();
    for f in history {
        let last = stored
            .iter()
            .filter(|s| s.message_id == f.message_id && s.receive_count == f.receive_count)
            .max_by_key(|s| s.attempt_number);
        if let Some(last) = last.filter(|l| !kept.contains(l.attempt_id.as_str())) {
            if !ids.contains(&last.attempt_id) {
                ids.push(last.attempt_id.clone());
            }
        }
    }
    ids
}

/// Returns the ids of the first and the last attempt of each worker delivery (from the history and
/// the ids an earlier compaction kept) that `already` lacks, while that delivery may still
/// record again: its message is not marked sent. Within `room` ids: the history's
/// deliveries newest first, then those an earlier compaction kept, in name order (a string
/// set keeps no age).
///
/// An older receive counts too. SQS may deliver a message twice more while a twin of its
/// first receive still runs, and that twin records last (found by the simulation's
/// `compaction` world 684). The room, not the receive count, bounds what is kept. It is a
/// bound, not a guarantee: past some 30 to 60 unsent deliveries of one item beyond those the
/// default history holds (8 to 16 under a history of two), the oldest lose their ids, and a
/// twin of one of them still running would count its attempts again. Nothing is lost: the
/// count is too high.
///
/// Such a delivery's twin makes the same attempts, from the first. The first's id refuses
/// its write, and the last's covers every attempt it repeats ([`is_recorded`]), so it
/// appends none a second time. Its claim does not protect it: a failed DLQ send released
/// the claim, so that the twin or the next receive sends (found by the simulation, seed
/// 511320: a redrive's failures pushed the delivery's entries out of the history). `room`
/// keeps `attempt_ids` within [`attempt_ids_room`].
fn unsent_deliveries_dropped(
    written: &crate::ports::Written,
    already: &[String],
    room: usize,
) -> Vec<String> {
    // The older mutants switch this off too: it came later, and covers the same twins
    // (docs/SIMULATION.md).
    use crate::mutants::{is_on, Mutant};
    if is_on(Mutant::CompactionForgetsUnsentAttempts)
        || is_on(Mutant::CompactionDropsRunningClaim)
        || is_on(Mutant::DroppedAttemptRecordedAgain)
        || is_on(Mutant::TwinAppendsAgain)
        || is_on(Mutant::CompactionDropsUnsentClaims)
    {
        return Vec::new();
    }
    let deliveries = worker_deliveries(written);
    let superseded = if is_on(Mutant::CompactionKeepsOnlyRecentReceives) {
        superseded_deliveries(written, &deliveries)
    } else {
        HashSet::new()
    };
    let mut ids: Vec<String> = Vec::new();
    for (n, delivery) in deliveries.iter().enumerate().rev() {
        if written.sent.contains(&delivery.message) || superseded.contains(&n) {
            continue;
        }
        let mut missing: Vec<&String> = [&delivery.first, &delivery.last]
            .into_iter()
            .filter(|id| !already.contains(id) && !ids.contains(id))
            .collect();
        // A delivery of one attempt has one id, first and last. Listed twice, it spent two
        // places of the room, and DynamoDB refuses a string set holding a duplicate.
        if !is_on(Mutant::CompactionListsAnIdTwice) {
            missing.dedup();
        }
        // A delivery that does not fit leaves the room to smaller ones after it.
        if ids.len() + missing.len() > room {
            continue;
        }
        ids.extend(missing.into_iter().cloned());
    }
    ids
}

/// Returns the positions in `deliveries` of those two or more receives before their message's
/// latest (known from the deliveries and `written`'s claims): what compaction kept ids of
/// before any receive counted ([`Mutant::CompactionKeepsOnlyRecentReceives`]).
///
/// [`Mutant::CompactionKeepsOnlyRecentReceives`]: crate::mutants::Mutant::CompactionKeepsOnlyRecentReceives
fn superseded_deliveries(
    written: &crate::ports::Written,
    deliveries: &[KnownDelivery],
) -> HashSet<usize> {
    let claims: Vec<crate::dead_letter::DlqClaim> = written
        .claims
        .iter()
        .map(|c| crate::dead_letter::DlqClaim::parse(c))
        .collect();
    let latest = latest_receives(
        deliveries
            .iter()
            .map(|d| (d.message.as_str(), d.receive))
            .chain(
                claims
                    .iter()
                    .map(|c| (c.message_id.as_str(), c.receive_count)),
            ),
    );
    let behind = |d: &KnownDelivery| {
        d.receive.saturating_add(1) < latest.get(d.message.as_str()).copied().unwrap_or(0)
    };
    (0..deliveries.len())
        .filter(|&n| behind(&deliveries[n]))
        .collect()
}

/// A worker delivery's first and last attempt ids known to a record.
struct KnownDelivery {
    message: String,
    receive: u32,
    first: String,
    last: String,
}

/// Returns the worker deliveries whose attempt ids `written` holds (its history's and those an
/// earlier compaction kept), oldest first as far as known: the kept ids' order is not, so
/// they come first, sorted. Ids of another form (a redrive's `<run>:<attempt>`) are left.
fn worker_deliveries(written: &crate::ports::Written) -> Vec<KnownDelivery> {
    let history = &written.record.failure_history;
    let mut carried: Vec<&String> = written
        .attempt_ids
        .iter()
        .filter(|id| !history.iter().any(|f| &f.attempt_id == *id))
        .collect();
    carried.sort();
    let ids = carried
        .into_iter()
        .chain(history.iter().map(|f| &f.attempt_id));
    let mut deliveries: Vec<(KnownDelivery, u32, u32)> = Vec::new();
    for id in ids {
        let Some((message, receive, number)) = parse_attempt_id(id) else {
            continue;
        };
        match deliveries
            .iter_mut()
            .find(|(d, _, _)| d.message == message && d.receive == receive)
        {
            Some((d, low, high)) => {
                if number < *low {
                    (d.first, *low) = (id.clone(), number);
                }
                if number > *high {
                    (d.last, *high) = (id.clone(), number);
                }
            }
            None => deliveries.push((
                KnownDelivery {
                    message: message.to_string(),
                    receive,
                    first: id.clone(),
                    last: id.clone(),
                },
                number,
                number,
            )),
        }
    }
    deliveries.into_iter().map(|(d, _, _)| d).collect()
}

/// Splits a worker attempt id, `<message id>:<receive>:<attempt>`, from the right (a message
/// id may hold ':'). An adoption's (`dlq:<message id>`) or a redrive run's
/// (`<run>:<attempt>`) is `None`.
pub fn parse_attempt_id(id: &str) -> Option<(&str, u32, u32)> {
    let (delivery, number) = id.rsplit_once(':')?;
    let (message, receive) = delivery.rsplit_once(':')?;
    Some((message, receive.parse().ok()?, number.parse().ok()?))
}

/// Returns the `manual_review_required` a record just written should have, when it differs from
/// the stored one. It depends on the whole history, which an update expression cannot
/// see: fixed afterwards in the rare case the merged history changes it. Once attempts have
/// been dropped from the history the flag is only ever raised: a dropped permission or
/// validation failure still counts.
pub fn review_flag_change(stored: &DeadLetteredItem) -> Option<bool> {
    let wanted = needs_manual_review(&stored.failure_history)
        || (stored.history_omitted > 0 && stored.manual_review_required);
    (wanted != stored.manual_review_required).then_some(wanted)
}

/// Writes the record of a DLQ message the sweep adopted (or reopened), once, on the
/// condition that the record is still what the sweep judged (`expect`): an adoption never
/// overwrites a record that appeared or changed since (a redrive under a live lease, a
/// resolution). `Ok(false)`: it had, and nothing was written (the next sweep judges the
/// message again).
pub async fn adopt<T: RecordStore>(
    table: &T,
    settings: &RecordingSettings,
    record: &DeadLetteredItem,
    expect: Expect,
) -> Result<bool, ProcessError> {
    match table
        .try_record(record, &record.failure_history, None, expect)
        .await?
    {
        Some(written) => {
            after_append(table, settings, &written).await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// What became of a delivery's record write ([`record_delivery`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delivery {
    /// This write holds the claim: it sends the DLQ message.
    Claimed,
    /// Recorded, without a claim asked for.
    Recorded,
    /// The message's DLQ message was sent by an earlier delivery: acknowledge it.
    AlreadySent,
    /// Another delivery holds the claim and has not sent yet (it may be sending now):
    /// return it for retry.
    ClaimedElsewhere,
}

/// What recording needs to know of the store (from its configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordingSettings {
    /// Payload bucket.
    pub bucket: String,
    /// Bodies larger than this go to the bucket ([`stays_inline`]).
    pub inline_max_bytes: usize,
    /// Most entries a record's history keeps.
    pub history_limit: usize,
    /// How long records are kept.
    pub retention: Duration,
    /// Records written at once.
    pub write_concurrency: usize,
    /// The wall clock a dead letter's record is stamped by (the system clock in production).
    pub clock: crate::clock::Clock,
}

/// Moves the payload to the payload store when it would not stay inline
/// ([`stays_inline`]), or when SQS would refuse it as a DLQ message's body (a payload
/// fetched from S3 may hold characters outside SQS's set: [`crate::message::sqs_safe`]).
pub async fn offload_payload<T: PayloadStore>(
    table: &T,
    settings: &RecordingSettings,
    record: &mut DeadLetteredItem,
) -> Result<(), ProcessError> {
    let PayloadLocation::Inline { body } = &record.payload.location else {
        return Ok(());
    };
    if stays_inline(body.len(), settings.inline_max_bytes) && crate::message::sqs_safe(body) {
        return Ok(());
    }
    let pointer = S3Pointer {
        bucket: settings.bucket.clone(),
        key: payload_key(&record.item_id, &record.payload.sha256),
    };
    table.put(&pointer, body, &record.payload.sha256).await?;
    record.payload.location = PayloadLocation::S3 {
        bucket: pointer.bucket,
        key: pointer.key,
    };
    Ok(())
}

/// Upserts a record: new attempts are appended once, known ones are ignored.
pub async fn record<T: RecordStore>(
    table: &T,
    settings: &RecordingSettings,
    record: &DeadLetteredItem,
) -> Result<(), ProcessError> {
    record_delivery(table, settings, record, None)
        .await
        .map(|_| ())
}

/// Upserts a record as [`record`] does and, with `claim` (the delivery's [`crate::dead_letter::DlqClaim`]),
/// undertakes in the same conditional write to send that message's one DLQ message. Says whether this
/// write holds the claim, or, when another delivery of the same message (SQS delivers at
/// least once, and a delivery whose acknowledgement was lost comes back) or the same
/// delivery invoked twice got there first, whether that message's DLQ message was sent.
pub async fn record_delivery<T: RecordStore>(
    table: &T,
    settings: &RecordingSettings,
    record: &DeadLetteredItem,
    claim: Option<&crate::dead_letter::DlqClaim>,
) -> Result<Delivery, ProcessError> {
    let requested = claim;
    let mut pending: Vec<FailureDetail> = record.failure_history.clone();
    let mut claim = claim;
    // Whether the requested claim's DLQ message is known sent (read after a conflict).
    let mut sent = false;
    let settled =
        |claim: Option<&crate::dead_letter::DlqClaim>, sent: bool| match (requested, claim) {
            (None, _) => Delivery::Recorded,
            (Some(_), Some(_)) => Delivery::Claimed,
            (Some(_), None) if sent => Delivery::AlreadySent,
            (Some(_), None) => Delivery::ClaimedElsewhere,
        };
    // A conflict means another writer recorded some of these attempts (or claimed the
    // message); at most a few rounds are needed to converge.
    for _ in 0..5 {
        // Nothing left to append: done, unless the requested claim is free and unsent (the
        // twin that took it released it after a failed send): then a claim-only write takes
        // it, and this delivery sends the DLQ message.
        if pending.is_empty() && (claim.is_none() || sent) {
            return Ok(settled(None, sent));
        }
        match write_compacting_if_full(table, settings, record, &pending, claim).await? {
            Some(written) => {
                after_append(table, settings, &written).await?;
                // A later receive took the claim before this write: this delivery (one
                // that overlapped the next, its visibility lapsed) must not send beside
                // it. Its own element stays behind, superseded ([`crate::dead_letter::DlqClaim`]).
                if claim.is_some_and(|c| c.is_held_later(&written.claims)) {
                    return Ok(settled(None, sent));
                }
                return Ok(settled(claim, sent));
            }
            None => {
                let known = table.deliveries(&record.item_id).await?;
                sent = requested.is_some_and(|c| known.sent.contains(&c.message_id));
                if sent
                    && !crate::mutants::is_on(crate::mutants::Mutant::DroppedAttemptRecordedAgain)
                {
                    // The message's DLQ message is out: its failures were recorded by the
                    // delivery that sent it. This one (a duplicate, or the same delivery
                    // invoked twice) appends nothing; compaction may have dropped the ids
                    // of the attempts it would repeat (docs/ARCHITECTURE.md §1.5).
                    return Ok(Delivery::AlreadySent);
                }
                claim = drop_what_is_recorded(&known, &mut pending, claim);
            }
        }
    }
    Err(ProcessError::new(
        ErrorClass::ServerError,
        format!(
            "record {:?} kept changing while being written",
            record.item_id
        ),
    )
    .with_step("record"))
}

/// Drops from `pending` the attempts a refused write found recorded, and returns the claim
/// still to ask for. A twin's claim, or a later receive's, stays theirs. One an earlier
/// receive left behind (cut before its send, or its release failed) is taken over by the
/// next write ([`crate::dead_letter::DlqClaim`]).
fn drop_what_is_recorded<'c>(
    known: &crate::ports::Deliveries,
    pending: &mut Vec<FailureDetail>,
    claim: Option<&'c crate::dead_letter::DlqClaim>,
) -> Option<&'c crate::dead_letter::DlqClaim> {
    pending.retain(|f| !is_recorded(f, &known.attempt_ids));
    let Some(held) = claim.filter(|c| c.is_held_elsewhere(&known.claims)) else {
        return claim;
    };
    if known.claims.contains(&held.element())
        && !crate::mutants::is_on(crate::mutants::Mutant::TwinAppendsAgain)
    {
        // The claim at this very receive was taken by the write that appended this
        // delivery's attempts (its twin's): they are recorded, though compaction may have
        // dropped their ids.
        pending.retain(|f| {
            !(f.message_id == held.message_id && f.receive_count == held.receive_count)
        });
    }
    None
}

/// [`RecordStore::try_record`] with `pending` and `claim`. A write DynamoDB refuses for
/// the item's size compacts the record first and is made once more. A compaction that
/// failed after an earlier append leaves up to [`HISTORY_ENTRIES_MAX`] entries, and a
/// delivery's attempts on top may pass 400 KB. Without this, every later write of the
/// item would be refused, and so would the compaction that follows a write.
async fn write_compacting_if_full<T: RecordStore>(
    table: &T,
    settings: &RecordingSettings,
    record: &DeadLetteredItem,
    pending: &[FailureDetail],
    claim: Option<&crate::dead_letter::DlqClaim>,
) -> Result<Option<crate::ports::Written>, ProcessError> {
    match table.try_record(record, pending, claim, Expect::Any).await {
        Err(error) if is_item_too_large(&error) => {
            tracing::warn!(item_id = %record.item_id, "record too large to append to; compacting it first");
            if let Some(written) = read_written(table, &record.item_id).await? {
                if let Some(compaction) = compaction_of(&written, settings.history_limit) {
                    table.compact(&written.record, &compaction).await?;
                }
            }
            table.try_record(record, pending, claim, Expect::Any).await
        }
        other => other,
    }
}

/// Returns the record of `item_id` with its attempt ids, claims and "sent" marks, as a write would
/// have returned them: what a compaction is built from when no write returned it. The list
/// of forgotten "sent" marks is not read (`forgotten_sent: None`): it stays as it is.
pub async fn read_written<T: RecordStore>(
    table: &T,
    item_id: &str,
) -> Result<Option<crate::ports::Written>, ProcessError> {
    let Some(record) = table.get(item_id).await? else {
        return Ok(None);
    };
    let known = table.deliveries(item_id).await?;
    Ok(Some(crate::ports::Written {
        record,
        attempt_ids: known.attempt_ids,
        claims: known.claims,
        sent: known.sent,
        forgotten_sent: None,
    }))
}

/// Tells whether `error` is DynamoDB refusing a write that would make its item larger than
/// 400 KB: a `ValidationException` saying "Item size has exceeded the maximum allowed
/// size" (`PutItem`) or "Item size to update has exceeded the maximum allowed size"
/// (`UpdateItem`, as DynamoDB Local says it).
fn is_item_too_large(error: &ProcessError) -> bool {
    error.class == ErrorClass::Validation
        && error.message.contains("exceeded the maximum allowed size")
}

/// Tells whether `attempt` is recorded: its id is, or a later attempt of its delivery (the same
/// message at the same receive) is. A delivery's attempts are appended together in one
/// conditional write, so a known later sibling means the same delivery, invoked twice, was
/// recorded by its twin up to there; compaction may since have dropped some of the twin's
/// entries and their ids, and appending them again would count them twice
/// (docs/ARCHITECTURE.md §1.5).
fn is_recorded(attempt: &FailureDetail, known_ids: &HashSet<String>) -> bool {
    if known_ids.contains(&attempt.attempt_id) {
        return true;
    }
    if crate::mutants::is_on(crate::mutants::Mutant::DroppedAttemptRecordedAgain) {
        return false;
    }
    // Ids are `message id:receive count:attempt`; split from the right, so a message id
    // holding ':' matches only itself. A twin that made fewer attempts did not record the
    // later ones: only a known attempt at least as far along covers this one.
    known_ids.iter().any(|id| {
        parse_attempt_id(id).is_some_and(|(message, receive, number)| {
            message == attempt.message_id
                && receive == attempt.receive_count
                && number >= attempt.attempt_number
        })
    })
}

/// Returns what follows a write that appended to a record's history (`stored` is the record as
/// written): the review flag is settled on the whole history ([`review_flag_change`]), then
/// the history is compacted if it grew past the limit ([`compaction_of`]). Compaction is
/// housekeeping: the record is already durable, so a failed compaction is logged, not
/// reported as a failed record (that would send the message round again), and the next
/// append compacts.
pub async fn after_append<T: RecordStore>(
    table: &T,
    settings: &RecordingSettings,
    written: &crate::ports::Written,
) -> Result<(), ProcessError> {
    let stored = &written.record;
    if let Some(wanted) = review_flag_change(stored) {
        table.set_review_flag(&stored.item_id, wanted).await?;
    }
    if let Some(compaction) = compaction_of(written, settings.history_limit) {
        if let Err(error) = table.compact(stored, &compaction).await {
            tracing::warn!(item_id = %stored.item_id, error = %error, "history not compacted; the next failure retries");
        }
    }
    Ok(())
}

/// Steps 1 and 2 for one candidate: payload to the payload store if large, then the
/// record, claiming the source message's DLQ message: `Some(record)` to send. A delivery
/// that finds the claim taken (the same message delivered twice) sends nothing: `None` when
/// that message's DLQ message was sent already (it is acknowledged),
/// `dead_lettering_elsewhere` while it is not (returned for retry).
pub async fn persist<T: RecordStore + PayloadStore>(
    table: &T,
    settings: &RecordingSettings,
    candidate: &DeadLetterCandidate,
    invocation: &InvocationInfo,
    now: DateTime<Utc>,
) -> Result<Option<DeadLetteredItem>, ProcessError> {
    let mut record =
        DeadLetteredItem::from_candidate(candidate, invocation, now, settings.retention);
    offload_payload(table, settings, &mut record).await?;
    let claim = crate::dead_letter::DlqClaim::of(&record.source);
    let delivery = record_delivery(table, settings, &record, Some(&claim)).await;
    if delivery.is_err() && crate::mutants::is_on(crate::mutants::Mutant::SentBeforePersisted) {
        return Ok(Some(record));
    }
    match delivery? {
        Delivery::Claimed | Delivery::Recorded => Ok(Some(record)),
        Delivery::AlreadySent => Ok(None),
        Delivery::ClaimedElsewhere => Err(dead_lettering_elsewhere()),
    }
}

/// Dead-letters `candidates` (the module's three steps): each is persisted (a bounded
/// number at once), the persisted ones are sent to the DLQ in batches, each sent one is
/// marked sent and the claim of each failed send released. One result per candidate, in
/// order: `Ok` only when all three steps succeeded (or an earlier delivery of the message
/// did them).
pub async fn dead_letter<T: RecordStore + DeadLetterQueue + PayloadStore>(
    table: &T,
    settings: &RecordingSettings,
    candidates: &[DeadLetterCandidate],
    invocation: &InvocationInfo,
) -> Vec<Result<(), ProcessError>> {
    let now = settings.clock.now();
    // Steps 1 and 2, per record, a bounded number at once.
    let writes: Vec<_> = candidates
        .iter()
        .map(|candidate| persist(table, settings, candidate, invocation, now))
        .collect();
    let persisted: Vec<Result<Option<DeadLetteredItem>, ProcessError>> =
        futures::stream::iter(writes)
            .buffered(settings.write_concurrency.max(1))
            .collect()
            .await;
    // Step 3, batched, for the records that were persisted and are this delivery's to send.
    let to_send: Vec<&DeadLetteredItem> = persisted
        .iter()
        .filter_map(|r| r.as_ref().ok().and_then(Option::as_ref))
        .collect();
    let sent_results = table.send_to_dlq(&to_send).await;
    // A later delivery of a sent message (its acknowledgement lost) is then acknowledged
    // rather than bounced to the redrive policy's second copy.
    let marks: Vec<(&str, &str)> = to_send
        .iter()
        .zip(&sent_results)
        .filter(|(_, result)| result.is_ok())
        .map(|(record, _)| (record.item_id.as_str(), record.source.message_id.as_str()))
        .collect();
    if !marks.is_empty() {
        if let Err(e) = table.mark_sent(&marks).await {
            tracing::warn!(records = marks.len(), error = %e, "DLQ messages sent but not all marked sent; a redelivery of one takes its claim over and sends a second DLQ message (a FIFO DLQ drops it within 5 minutes)");
        }
    }
    let releases: Vec<_> = to_send
        .iter()
        .zip(&sent_results)
        .filter(|(_, result)| result.is_err())
        .map(|(record, _)| async move {
            // The next delivery of this message must be free to send it.
            if let Err(e) = table
                .release_claim(&record.item_id, &crate::dead_letter::DlqClaim::of(&record.source))
                .await
            {
                tracing::warn!(item_id = %record.item_id, error = %e, "could not release the DLQ claim; the message reaches the DLQ through the queue's redrive policy");
            }
        })
        .collect();
    futures::stream::iter(releases)
        .buffer_unordered(settings.write_concurrency.max(1))
        .collect::<Vec<()>>()
        .await;
    let mut sent = sent_results.into_iter();
    persisted
        .into_iter()
        .map(|result| match result {
            Ok(Some(_)) => sent.next().unwrap_or_else(|| {
                Err(
                    ProcessError::new(ErrorClass::Unknown, "DLQ send returned no result")
                        .with_step("dlq"),
                )
            }),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dead_letter::ItemStatus;
    use crate::pointer::is_payload_key;

    #[test]
    fn every_payload_key_is_known_as_one_and_nothing_else_is() {
        let sha = crate::hex::sha256_hex(b"payload");
        for item in ["order-1", "a/b c", &"x".repeat(300)] {
            assert!(is_payload_key(&payload_key(item, &sha)), "{item}");
        }
        for key in [
            "k",
            "payloads/i/short",
            "producer/ec-1",
            &format!("other/i/{sha}"),
        ] {
            assert!(!is_payload_key(key), "{key}");
        }
    }

    /// A payload fetched from S3 may hold a character SQS refuses: the DLQ message then
    /// carries its pointer, however small the payload is.
    #[tokio::test]
    async fn a_body_sqs_cannot_carry_goes_to_the_payload_store_however_small() {
        let store = crate::testing::MemoryStore::new();
        let settings = store.settings().clone();
        for (body, offloaded) in [("bell \u{7}", true), ("tab \t ok", false)] {
            let mut record = crate::testing::dead_record("a", crate::ErrorClass::Validation, 1);
            record.payload.location = PayloadLocation::Inline { body: body.into() };
            record.payload.sha256 = crate::hex::sha256_hex(body.as_bytes());
            offload_payload(&store, &settings, &mut record)
                .await
                .unwrap();
            assert_eq!(
                matches!(record.payload.location, PayloadLocation::S3 { .. }),
                offloaded,
                "{body:?}"
            );
        }
    }

    #[test]
    fn a_body_stays_inline_only_while_a_full_record_fits_its_budget() {
        assert!(stays_inline(65_536, 65_536), "the default limit fits");
        assert!(!stays_inline(65_537, 65_536));
        // DLQ_INLINE_MAX_BYTES may allow 256 KiB, but with 51 history entries of up to 4 KiB
        // such a record could pass 400 KB: the body goes to S3.
        assert!(!stays_inline(200_000, 262_144));
        let largest = (0..=262_144)
            .rev()
            .find(|n| stays_inline(*n, 262_144))
            .unwrap_or(0);
        assert!(largest > 65_536 && largest < 120_000, "{largest}");
    }

    /// The largest body kept inline leaves room for the fullest history: 390,000 B less 70
    /// entries of 4 KiB (the limit, and a delivery's 20 attempts before compaction), 16 KiB
    /// of attributes and 16 KiB for the rest is 70,512 B. Counting 51 entries let bodies
    /// 76 KiB larger stay inline, and such a record could pass 400 KB.
    #[test]
    fn a_body_stays_inline_only_with_room_for_the_fullest_history() {
        assert!(stays_inline(70_512, 262_144));
        assert!(!stays_inline(70_513, 262_144));
    }

    /// Every field of an entry at its largest, the ids as long as SQS makes them: the
    /// entry stays within [`HISTORY_ENTRY_MAX`] as stored (JSON here; DynamoDB's map costs
    /// about as much per field). `error_code` and `step` were not clipped.
    #[test]
    fn the_largest_bounded_entry_fits_its_planned_size() {
        let long = |n: usize| "é".repeat(n);
        let entry = crate::dead_letter::FailureDetail {
            attempt_id: format!("{}:4294967295:4294967295", "m".repeat(100)),
            attempt_number: u32::MAX,
            receive_count: u32::MAX,
            message_id: "m".repeat(100),
            timestamp: chrono::Utc::now(),
            error_type: ErrorClass::Unknown,
            error_message: long(10_000),
            causes: (0..50).map(|_| long(10_000)).collect(),
            error_code: Some(long(10_000)),
            http_status: Some(u16::MAX),
            step: Some(long(10_000)),
            duration_ms: u64::MAX,
            function_name: Some(long(10_000)),
            request_id: Some(long(10_000)),
            log_group: Some(long(10_000)),
            log_stream: Some(long(10_000)),
            response_excerpt: Some(long(10_000)),
        }
        .bounded();
        let size = serde_json::to_string(&entry)
            .map(|s| s.len())
            .unwrap_or(usize::MAX);
        assert!(size <= HISTORY_ENTRY_MAX, "{size} bytes");
    }

    /// A reopening writes only over a record still of the status judged that has not
    /// processed the message since: either change alone refuses it. Admitted on one of the
    /// two, a reopening overwrote a record that processed the message meanwhile (resolved
    /// again with it), or one whose status changed under it (a run's lease).
    #[test]
    fn a_reopening_expects_the_status_judged_and_the_message_still_unprocessed() {
        let keys = vec!["msg:s1".to_string(), "sha:x1".to_string()];
        let expect = Expect::judged(Some(ItemStatus::Resolved), &keys);
        let other = ["msg:s0".to_string(), "sha:x0".to_string()];
        assert!(expect.admits(Some(ItemStatus::Resolved), &other));
        assert!(
            !expect.admits(Some(ItemStatus::Resolved), &["sha:x1".to_string()]),
            "processed since"
        );
        assert!(
            !expect.admits(Some(ItemStatus::Redriving), &other),
            "changed since"
        );
        assert!(!expect.admits(None, &[]), "deleted since");
        assert!(Expect::judged(None, &keys).admits(None, &[]));
        assert!(!Expect::judged(None, &keys).admits(Some(ItemStatus::Dead), &[]));
    }

    #[test]
    fn keys_are_safe_and_deterministic() {
        assert_eq!(payload_key("order-7", "abc"), "payloads/order-7/abc");
        assert!(payload_key("order/7 ü", "abc").starts_with("payloads/order_7__~"));
        assert_eq!(payload_key("a", "x"), payload_key("a", "x"));
        // Ids made alike by the key-safe form keep objects of their own.
        assert_ne!(payload_key("order/1", "x"), payload_key("order:1", "x"));
        assert_ne!(payload_key("order/1", "x"), payload_key("order_1", "x"));
        let long = "y".repeat(300);
        assert_ne!(payload_key(&long, "x"), payload_key(&long[..200], "x"));
    }

    /// A record of `attempts` attempts, made over deliveries of 3 attempts each (message
    /// ids `m-0`, `m-1`, ...), with `processed` entries `msg:p0`, `msg:p1`, ...
    fn stored(attempts: usize, processed: usize) -> DeadLetteredItem {
        let mut record = crate::testing::dead_record("a", ErrorClass::Throttled, 1);
        let template = record.failure_history[0].clone();
        record.failure_history = (0..attempts)
            .map(|n| FailureDetail {
                attempt_id: format!("m-{}:1:{}", n / 3, n % 3 + 1),
                message_id: format!("m-{}", n / 3),
                attempt_number: u32::try_from(n % 3 + 1).unwrap(),
                ..template.clone()
            })
            .collect();
        record.failure_count = u32::try_from(attempts).unwrap();
        record.processed = (0..processed).map(|n| format!("msg:p{n}")).collect();
        record
    }

    /// `record` as a write left it, with the messages `sent` marked sent and no claim.
    fn written(record: &DeadLetteredItem, sent: &HashSet<String>) -> crate::ports::Written {
        crate::ports::Written {
            record: record.clone(),
            attempt_ids: record
                .failure_history
                .iter()
                .map(|f| f.attempt_id.clone())
                .collect(),
            claims: HashSet::new(),
            sent: sent.clone(),
            forgotten_sent: Some(Vec::new()),
        }
    }

    /// Every message of [`stored`]'s histories of up to 60 attempts marked sent.
    fn all_sent() -> HashSet<String> {
        (0..20).map(|n| format!("m-{n}")).collect()
    }

    /// Simulation seed 138109: one batch dead-lettered three messages of one item, and
    /// the batch was invoked twice. The third write's compaction dropped every entry of the
    /// first message and its claim, though its DLQ send was under way. The twin then
    /// claimed it again, appended its attempt a second time and sent a second DLQ
    /// message. A claim at a forgotten message's latest receive stays until it is sent.
    #[test]
    fn compaction_keeps_the_claim_of_a_dlq_send_under_way() {
        let record = stored(60, 0);
        let mut sent = all_sent();
        sent.remove("m-4");
        let compaction = compaction_of(&written(&record, &sent), 50).unwrap();
        assert_eq!(
            compaction.forgotten_sent.as_deref(),
            Some(&["m-5".to_string()][..])
        );
        assert_eq!(
            compaction.dropped_claims,
            ["m-5:1"],
            "m-4's DLQ message is not marked sent: its claim stays"
        );
    }

    #[test]
    fn a_history_within_its_limit_is_not_compacted() {
        assert_eq!(
            compaction_of(&written(&stored(50, 30), &all_sent()), 50),
            None
        );
        assert_eq!(
            compaction_of(&written(&stored(3, 0), &all_sent()), 50),
            None
        );
    }

    #[test]
    fn compaction_keeps_the_first_and_latest_attempts_with_their_ids_and_claims() {
        let record = stored(60, 30);
        let compaction = compaction_of(&written(&record, &all_sent()), 50).unwrap();
        let (history, dropped) = compact_history(record.failure_history.clone(), 50);
        assert_eq!(compaction.history, history);
        assert_eq!(compaction.dropped, 10);
        assert_eq!(usize::try_from(compaction.dropped).unwrap(), dropped);
        // The first 10 entries (m-0 .. m-3) and the latest 40 (entries 20..60: m-6 .. m-19),
        // and the id of m-3's last attempt, whose entry went: its twin would append it again.
        assert_eq!(compaction.attempt_ids.len(), 51);
        assert_eq!(compaction.attempt_ids[0], "m-0:1:1");
        assert_eq!(compaction.attempt_ids[9], "m-3:1:1");
        assert_eq!(compaction.attempt_ids[10], "m-6:1:3");
        assert_eq!(compaction.attempt_ids[49], "m-19:1:3");
        assert_eq!(compaction.attempt_ids[50], "m-3:1:3");
        let twin = record
            .failure_history
            .iter()
            .find(|f| f.attempt_id == "m-3:1:2");
        let known: HashSet<String> = compaction.attempt_ids.iter().cloned().collect();
        assert!(
            twin.is_some_and(|f| is_recorded(f, &known)),
            "a dropped sibling is covered"
        );
        // The claims of deliveries whose every entry was dropped (m-4, m-5) go; the
        // others stay.
        assert_eq!(
            compaction.dropped_claims,
            ["m-4:1", "m-5:1"],
            "once each, in order"
        );
        let expected_processed: Vec<String> = (10..30).map(|n| format!("msg:p{n}")).collect();
        assert_eq!(compaction.processed, expected_processed, "the latest 20");
    }

    #[test]
    fn compaction_keeps_a_short_processed_list_whole() {
        let compaction = compaction_of(&written(&stored(4, 2), &all_sent()), 3).unwrap();
        assert_eq!(compaction.processed, ["msg:p0", "msg:p1"]);
        assert_eq!(compaction.dropped, 1);
        // The first entry (half the limit, rounded down) and the latest two.
        assert_eq!(compaction.attempt_ids, ["m-0:1:1", "m-0:1:3", "m-1:1:1"]);
        assert!(compaction.dropped_claims.is_empty(), "every message stays");
    }

    /// A claim an earlier receive left behind no longer holds anything back (a later
    /// receive takes it over), so compaction drops it. The set would otherwise grow with
    /// every cut delivery.
    /// Simulation seed 391046: a message was delivered twice in flight, and its first
    /// receive was invoked twice. The first twin recorded and claimed; the second receive
    /// retried, and its write's compaction dropped every entry of the first receive and
    /// its claim, as an earlier receive's. The other twin then appended its attempts a
    /// second time, claimed, and sent a second DLQ message. The claim of the receive just
    /// before the latest stays until its message is sent.
    #[test]
    fn compaction_keeps_the_unsent_claim_of_the_receive_before_the_latest() {
        let mut record = stored(6, 0);
        for (n, entry) in record.failure_history.iter_mut().enumerate() {
            entry.message_id = "m".to_string();
            entry.receive_count = u32::try_from(n / 2 + 1).unwrap();
            entry.attempt_id = format!("m:{}:{}", entry.receive_count, n % 2 + 1);
        }
        let compaction = compaction_of(&written(&record, &HashSet::new()), 2).unwrap();
        assert_eq!(
            compaction.dropped_claims,
            ["m:1"],
            "receive 2 may still be running beside receive 3"
        );
    }

    #[test]
    fn compaction_drops_the_claims_of_earlier_receives_of_a_kept_message() {
        let mut record = stored(6, 0);
        for (n, entry) in record.failure_history.iter_mut().enumerate() {
            entry.message_id = "m".to_string();
            entry.receive_count = u32::try_from(n / 2 + 1).unwrap();
            entry.attempt_id = format!("m:{}:{}", entry.receive_count, n % 2 + 1);
        }
        let sent = HashSet::from(["m".to_string()]);
        let compaction = compaction_of(&written(&record, &sent), 4).unwrap();
        assert_eq!(compaction.dropped_claims, ["m:1", "m:2"]);
        assert_eq!(compaction.forgotten_sent, Some(Vec::new()));
        assert!(compaction.unmarked.is_empty());
    }

    /// Compaction lists exactly the messages marked sent whose every entry it drops, once
    /// each, and keeps their "sent" marks. Listing a message still in the kept history would
    /// drop its mark too early, and a message listed twice would make the list grow.
    #[test]
    fn compaction_lists_only_the_messages_whose_every_entry_goes_each_once() {
        // Entries 10..20 go: m-3 and m-6 keep some, every entry of m-4 and m-5 goes.
        let compaction = compaction_of(&written(&stored(60, 0), &all_sent()), 50).unwrap();
        assert_eq!(
            compaction.forgotten_sent,
            Some(vec!["m-4".to_string(), "m-5".to_string()])
        );
        assert!(compaction.unmarked.is_empty(), "the marks stay");
    }

    /// Simulation seed 460865: a message dead-lettered at receive 4 was invoked twice. The
    /// first twin sent its DLQ message, and compaction after another message's write
    /// dropped every entry of it, its claim and its "sent" mark. The second twin then
    /// appended its attempts again and sent a second DLQ message. The mark now stays,
    /// among the latest [`SENT_MARKS_FORGOTTEN_MAX`] forgotten ones.
    #[test]
    fn the_sent_marks_of_forgotten_messages_stay_up_to_a_bound_oldest_out_first() {
        let listed: Vec<String> = (0..SENT_MARKS_FORGOTTEN_MAX)
            .map(|n| format!("old-{n:02}"))
            .collect();
        let mut sent = all_sent();
        sent.extend(listed.iter().cloned());
        sent.insert("late".to_string());
        let mut written = written(&stored(60, 0), &sent);
        written.forgotten_sent = Some(listed.clone());
        let compaction = compaction_of(&written, 50).unwrap();
        let list = compaction.forgotten_sent.unwrap();
        assert_eq!(list.len(), SENT_MARKS_FORGOTTEN_MAX);
        assert_eq!(
            list[SENT_MARKS_FORGOTTEN_MAX - 3..],
            ["m-4", "m-5", "late"],
            "new ones at the end, in history order, then marks outside both"
        );
        assert_eq!(compaction.unmarked, ["old-00", "old-01", "old-02"]);
    }

    /// Marks not read (a compaction before a write too large to land) are left alone.
    #[test]
    fn sent_marks_not_read_are_left_alone() {
        let unread = crate::ports::Written::record_only(stored(60, 0));
        let compaction = compaction_of(&unread, 50).unwrap();
        assert_eq!(compaction.forgotten_sent, None);
        assert!(compaction.unmarked.is_empty());
        assert!(
            compaction.dropped_claims.is_empty(),
            "nothing known sent: every claim at a latest receive stays"
        );
    }

    /// A claim whose message keeps no entry is found in the claim set: dropped once its
    /// message is marked sent, or two receives on. Found only through the history, such a
    /// claim stayed for ever once an earlier compaction had dropped its entries.
    #[test]
    fn compaction_drops_claims_the_history_no_longer_names() {
        let mut written = written(&stored(60, 0), &all_sent());
        written.sent.insert("gone-sent".to_string());
        written.claims = [
            "gone-sent:2",
            "gone-cut:1",
            "gone-cut:3",
            "gone-running:4",
            "legacy",
        ]
        .map(String::from)
        .into_iter()
        .collect();
        let compaction = compaction_of(&written, 50).unwrap();
        let from_set: Vec<&String> = compaction
            .dropped_claims
            .iter()
            .filter(|c| c.starts_with("gone") || *c == "legacy")
            .collect();
        assert_eq!(from_set, ["gone-cut:1", "gone-sent:2"]);
    }

    #[test]
    fn the_review_flag_follows_the_history_and_is_only_raised_once_attempts_were_dropped() {
        let mut record = stored(2, 0);
        assert_eq!(
            review_flag_change(&record),
            None,
            "agrees: nothing to write"
        );
        // A permission failure merged in: raised.
        record.failure_history[1].error_type = ErrorClass::Permission;
        assert_eq!(review_flag_change(&record), Some(true));
        record.manual_review_required = true;
        assert_eq!(review_flag_change(&record), None);
        // Two validation failures: raised too.
        record.failure_history[1].error_type = ErrorClass::Validation;
        record.failure_history[0].error_type = ErrorClass::Validation;
        assert_eq!(review_flag_change(&record), None);
        // Nothing in the whole history calls for it: lowered.
        record.failure_history[0].error_type = ErrorClass::Throttled;
        assert_eq!(review_flag_change(&record), Some(false));
        // ... unless attempts were dropped: the reason may be among them.
        record.history_omitted = 5;
        assert_eq!(review_flag_change(&record), None);
        record.manual_review_required = false;
        assert_eq!(
            review_flag_change(&record),
            None,
            "never raised without cause"
        );
    }

    use crate::testing::MemoryStore;

    /// The items of the DLQ messages sent, in order.
    fn sent(store: &MemoryStore) -> Vec<String> {
        store
            .dlq_messages()
            .into_iter()
            .map(|m| m.item_id)
            .collect()
    }

    fn settings() -> RecordingSettings {
        RecordingSettings {
            bucket: "b".into(),
            inline_max_bytes: 65_536,
            history_limit: 4,
            retention: Duration::from_secs(86_400),
            write_concurrency: 2,
            clock: crate::clock::Clock::system(),
        }
    }

    /// A failed delivery of item `id` (message `m-<id>`, its `receive`th receive), two
    /// attempts.
    fn candidate(id: &str, receive: u32) -> DeadLetterCandidate {
        let message = serde_json::from_value(serde_json::json!({
            "messageId": format!("m-{id}"),
            "body": format!("{{\"id\":\"{id}\"}}"),
            "attributes": {"ApproximateReceiveCount": receive.to_string()},
        }))
        .unwrap();
        let mut item = crate::item::ItemParser::default()
            .parse(format!("m-{id}"), message)
            .unwrap();
        item.item_id = id.to_string();
        let error = ProcessError::new(ErrorClass::Throttled, "slow down");
        let failures = (1..=2)
            .map(|attempt| crate::retry::AttemptFailure {
                attempt,
                started_at: Utc::now(),
                duration: Duration::ZERO,
                error: error.clone(),
            })
            .collect();
        DeadLetterCandidate {
            item,
            error,
            failures,
            reason: crate::dead_letter::DeadLetterReason::ReceiveBudgetExhausted,
        }
    }

    #[tokio::test]
    async fn dead_lettering_persists_sends_and_frees_the_claim_of_a_failed_send() {
        let table = MemoryStore::new();
        table.refuse_sends_of("b");
        let info = InvocationInfo::default();
        let results = dead_letter(
            &table,
            &settings(),
            &[candidate("a", 3), candidate("b", 3)],
            &info,
        )
        .await;
        assert!(results[0].is_ok(), "{results:?}");
        assert!(results[1].is_err(), "{results:?}");
        assert_eq!(sent(&table), ["a"]);
        let a = table.row("a").unwrap();
        assert_eq!(a.record.failure_count, 2);
        assert!(a.claims.contains("m-a:3"));
        let b = table.row("b").unwrap();
        assert_eq!(b.record.failure_count, 2, "recorded all the same");
        assert!(b.claims.is_empty(), "the next delivery may send it");

        // The same delivery again (a retried invocation, its answer lost): nothing new,
        // nothing sent, and acknowledged, since the message's DLQ message was sent.
        let again = dead_letter(&table, &settings(), &[candidate("a", 3)], &info).await;
        assert!(again[0].is_ok(), "{again:?}");
        // Another delivery of the same message: it sends nothing, appends nothing (the
        // failures that dead-lettered the message are recorded) and is acknowledged rather
        // than bounced to a second DLQ copy.
        let other = dead_letter(&table, &settings(), &[candidate("a", 4)], &info).await;
        assert!(other[0].is_ok(), "{other:?}");
        assert_eq!(table.record("a").unwrap().failure_count, 2);
        assert_eq!(sent(&table), ["a"]);
        // A twin (the same delivery, invoked twice) that finds the claim held at its own
        // receive and the message not sent yet (the twin may be sending it now) is
        // returned for retry.
        let c = candidate("c", 3);
        let in_flight =
            DeadLetteredItem::from_candidate(&c, &info, Utc::now(), settings().retention);
        assert!(RecordStore::try_record(
            &table,
            &in_flight,
            &in_flight.failure_history,
            Some(&crate::dead_letter::DlqClaim::of(&in_flight.source)),
            Expect::Any
        )
        .await
        .unwrap()
        .is_some());
        let racing = dead_letter(&table, &settings(), &[candidate("c", 3)], &info).await;
        assert!(crate::dead_letter::is_dead_lettering_elsewhere(
            racing[0].as_ref().unwrap_err()
        ));
        // The freed claim of b is taken by its next delivery, which sends it.
        table.world().lock().allow_sends_of("b");
        let retried = dead_letter(&table, &settings(), &[candidate("b", 4)], &info).await;
        assert!(retried[0].is_ok(), "{retried:?}");
        assert_eq!(sent(&table), ["a", "b"]);
    }

    /// A compaction that failed leaves the history at its planned most (70 entries); the
    /// next delivery's 20 attempts on top pass 400 KB with the largest entries and body.
    /// The write is refused for size, so the record is compacted first and written again.
    /// Before, every later write of the item was refused.
    #[tokio::test]
    async fn a_write_too_large_after_a_failed_compaction_compacts_first() {
        let table = MemoryStore::new();
        // Every field at its largest ('é' is two bytes: clipped by bytes, escaped in JSON).
        let big = |n: usize| "é".repeat(n);
        let info = InvocationInfo {
            function_name: Some(big(100)),
            request_id: Some(big(100)),
            log_group: Some(big(100)),
            log_stream: Some(big(100)),
        };
        let error = ProcessError::new(ErrorClass::Throttled, big(2_000))
            .with_code(big(100))
            .with_step(big(100))
            .with_detail(big(1_000));
        let error = (0..6).fold(error, |e, _| e.with_cause(big(300)));
        let mut left = crate::testing::dead_record("a", ErrorClass::Throttled, 1);
        let template = FailureDetail::from_attempt(
            &candidate("a", 1).item,
            &crate::retry::AttemptFailure {
                attempt: 1,
                started_at: Utc::now(),
                duration: Duration::ZERO,
                error: error.clone(),
            },
            &info,
        )
        .bounded();
        left.failure_history = (0..HISTORY_ENTRIES_MAX)
            .map(|n| FailureDetail {
                attempt_id: format!("m-{}:1:{}", n / 20, n % 20 + 1),
                message_id: format!("m-{}", n / 20),
                ..template.clone()
            })
            .collect();
        left.failure_count = u32::try_from(HISTORY_ENTRIES_MAX).unwrap();
        table.insert(left);
        let mut next = candidate("a", 4);
        next.item.body = "b".repeat(65_000);
        next.failures = (1..=crate::retry::MAX_ATTEMPTS_PER_INVOCATION)
            .map(|attempt| crate::retry::AttemptFailure {
                attempt,
                started_at: Utc::now(),
                duration: Duration::ZERO,
                error: error.clone(),
            })
            .collect();
        // Without compaction the write would pass DynamoDB's limit.
        let entry = serde_json::to_string(&template).unwrap().len();
        let full = (HISTORY_ENTRIES_MAX + 20) * entry + next.item.body.len();
        assert!(full > crate::testing::ITEM_SIZE_LIMIT, "{full} bytes");
        let results = dead_letter(&table, &settings(), &[next], &info).await;
        assert!(results[0].is_ok(), "{results:?}");
        let a = table.row("a").unwrap();
        assert!(
            a.record.failure_history.len() <= HISTORY_ENTRIES_MAX,
            "{} entries",
            a.record.failure_history.len()
        );
        assert_eq!(
            a.record.failure_count,
            u32::try_from(HISTORY_ENTRIES_MAX).unwrap() + crate::retry::MAX_ATTEMPTS_PER_INVOCATION,
            "every attempt counted"
        );
        assert_eq!(sent(&table), ["a"]);
    }

    /// A delivery cut at the hard stop between its record write and its DLQ send leaves
    /// its claim taken and unsent. The receive after next takes it over and sends the one
    /// DLQ message (the next may overlap the cut one, so it is returned). Before, every later delivery, the last one included, was returned for
    /// retry, and SQS's redrive policy moved the message without the worker's DLQ message.
    #[tokio::test]
    async fn a_claim_left_by_a_cut_delivery_is_taken_over_by_the_next_receive() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        // Receive 3 claims, then is cut: no send, no release.
        let cut = DeadLetteredItem::from_candidate(
            &candidate("a", 3),
            &info,
            Utc::now(),
            settings().retention,
        );
        let claim = crate::dead_letter::DlqClaim::of(&cut.source);
        let written = RecordStore::try_record(
            &table,
            &cut,
            &cut.failure_history,
            Some(&claim),
            Expect::Any,
        )
        .await
        .unwrap();
        assert!(written.is_some());
        // Receive 4 may overlap receive 3 (its visibility lapsed while it ran): returned
        // for retry, its attempts recorded, nothing sent.
        let next = dead_letter(&table, &settings(), &[candidate("a", 4)], &info).await;
        assert!(
            crate::dead_letter::is_dead_lettering_elsewhere(next[0].as_ref().unwrap_err()),
            "{next:?}"
        );
        assert!(sent(&table).is_empty());
        // Receive 5 (the last) dead-letters it: one DLQ message, marked sent.
        let last = dead_letter(&table, &settings(), &[candidate("a", 5)], &info).await;
        assert!(last[0].is_ok(), "{last:?}");
        assert_eq!(sent(&table), ["a"]);
        let a = table.row("a").unwrap();
        assert!(a.sent.contains("m-a"), "{:?}", a.sent);
        assert!(a.claims.contains("m-a:5"), "{:?}", a.claims);
        assert_eq!(
            a.record.failure_count, 6,
            "three deliveries' attempts, once"
        );
        // A later delivery of the sent message is acknowledged with nothing sent.
        let again = dead_letter(&table, &settings(), &[candidate("a", 6)], &info).await;
        assert!(again[0].is_ok(), "{again:?}");
        assert_eq!(sent(&table), ["a"]);
        assert_eq!(table.record("a").unwrap().failure_count, 6);
    }

    /// A failed DLQ send whose claim release fails too leaves the claim held by a
    /// delivery that is over. The receive after next takes it over (found by the
    /// simulation, seed 56913).
    #[tokio::test]
    async fn a_claim_whose_release_failed_is_taken_over_by_the_next_receive() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        table.refuse_sends_of("a");
        table.fail("release_claim");
        let first = dead_letter(&table, &settings(), &[candidate("a", 3)], &info).await;
        assert!(first[0].is_err(), "{first:?}");
        assert!(
            table.row("a").unwrap().claims.contains("m-a:3"),
            "not released"
        );
        table.world().lock().allow_sends_of("a");
        let next = dead_letter(&table, &settings(), &[candidate("a", 5)], &info).await;
        assert!(next[0].is_ok(), "{next:?}");
        assert_eq!(sent(&table), ["a"]);
    }

    /// A delivery still finds a claim held by a later receive: it must not send beside
    /// it. It is returned for retry, as a twin is.
    #[tokio::test]
    async fn a_claim_held_by_a_later_receive_is_not_taken_back() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        let later = DeadLetteredItem::from_candidate(
            &candidate("a", 5),
            &info,
            Utc::now(),
            settings().retention,
        );
        let claim = crate::dead_letter::DlqClaim::of(&later.source);
        RecordStore::try_record(
            &table,
            &later,
            &later.failure_history,
            Some(&claim),
            Expect::Any,
        )
        .await
        .unwrap();
        // Receive 4 comes with attempts of its own: recorded, but it sends nothing.
        let earlier = dead_letter(&table, &settings(), &[candidate("a", 4)], &info).await;
        assert!(
            crate::dead_letter::is_dead_lettering_elsewhere(earlier[0].as_ref().unwrap_err()),
            "{earlier:?}"
        );
        assert!(sent(&table).is_empty());
    }

    /// An outside review's reading of seed 138109's fix: the twin refused by the claim
    /// still appended the attempts whose ids compaction had dropped. A claim at the same
    /// receive means the delivery's attempts are recorded: nothing is appended again.
    #[tokio::test]
    async fn a_twin_refused_by_the_claim_appends_nothing_though_compaction_dropped_its_ids() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        let first = dead_letter(&table, &settings(), &[candidate("a", 3)], &info).await;
        assert!(first[0].is_ok(), "{first:?}");
        let counted = table.record("a").unwrap().failure_count;
        {
            // Compaction after another message's write forgot this delivery's ids, and its
            // DLQ message is not marked sent yet (the twin's send is under way).
            let mut state = table.world().lock();
            let row = state.table.get_mut("a").unwrap();
            row.attempt_ids.clear();
            row.sent.clear();
        }
        let twin = dead_letter(&table, &settings(), &[candidate("a", 3)], &info).await;
        assert!(
            crate::dead_letter::is_dead_lettering_elsewhere(twin[0].as_ref().unwrap_err()),
            "{twin:?}"
        );
        assert_eq!(table.record("a").unwrap().failure_count, counted);
    }

    /// `candidate` of item `item` carried by message `message`.
    fn carried_by(item: &str, message: &str, receive: u32) -> DeadLetterCandidate {
        let mut c = candidate(item, receive);
        c.item.message_id = message.to_string();
        c
    }

    /// A forgotten message whose id holds ':' once had its element without a receive
    /// dropped too; "x:3" is also message "x"'s claim at receive 3, so the compaction after
    /// x's own write deleted x's live claim, and x's twin sent a second DLQ message.
    #[tokio::test]
    async fn compaction_never_drops_another_messages_claim() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        let settings = RecordingSettings {
            history_limit: 8,
            ..settings()
        };
        for message in ["y", "z", "x:3", "w"] {
            let r = dead_letter(&table, &settings, &[carried_by("a", message, 1)], &info).await;
            assert!(r[0].is_ok(), "{r:?}");
        }
        // Message x at receive 3 records and claims (compaction drops "x:3"'s entries),
        // and is about to send; its twin must be returned for retry.
        let x = persist(
            &table,
            &settings,
            &carried_by("a", "x", 3),
            &info,
            Utc::now(),
        )
        .await
        .unwrap()
        .expect("x holds the claim");
        let twin = dead_letter(&table, &settings, &[carried_by("a", "x", 3)], &info).await;
        assert!(twin[0].is_err(), "{twin:?}");
        table.send_to_dlq(&[&x]).await;
        assert_eq!(sent(&table).len(), 5, "one DLQ message per source message");
    }

    /// Whether `row`'s history holds an entry of message `message`.
    fn has_entries_of(row: &crate::testing::Row, message: &str) -> bool {
        row.record
            .failure_history
            .iter()
            .any(|f| f.message_id == message)
    }

    /// A message whose DLQ message is out, and whose every entry compaction then dropped,
    /// sends nothing more: not its twin (the same receive invoked again), not its next
    /// receive, and its attempts are not counted again. Compaction once deleted its "sent"
    /// mark with its entries (simulation seed 460865).
    #[tokio::test]
    async fn a_message_compaction_forgot_after_its_send_sends_nothing_more() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        for message in ["h", "x", "y"] {
            let r = dead_letter(&table, &settings(), &[carried_by("a", message, 1)], &info).await;
            assert!(r[0].is_ok(), "{message}: {r:?}");
        }
        let before = table.row("a").unwrap();
        assert!(
            !has_entries_of(&before, "x"),
            "x's entries were compacted away"
        );
        assert_eq!(before.forgotten_sent, ["x"]);
        for receive in [1, 2] {
            let r = dead_letter(&table, &settings(), &[carried_by("a", "x", receive)], &info).await;
            assert!(r[0].is_ok(), "receive {receive}: {r:?}");
        }
        assert_eq!(sent(&table).len(), 3, "one DLQ message per source message");
        let after = table.row("a").unwrap();
        assert_eq!(after.record.failure_count, before.record.failure_count);
    }

    /// Simulation seed 511320: a delivery invoked twice recorded its attempts, its DLQ send
    /// failed and it released its claim. Later writes pushed every entry of it out of the
    /// history, and compaction dropped their ids. The other twin then appended its attempt
    /// a second time. The last attempt's id of such a delivery now stays while its message
    /// is not marked sent.
    #[tokio::test]
    async fn a_twin_after_a_failed_send_appends_nothing_though_every_entry_was_dropped() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        let ok = |r: Vec<Result<(), ProcessError>>| assert!(r[0].is_ok(), "{r:?}");
        ok(dead_letter(&table, &settings(), &[delivery_of("w", 1, 2)], &info).await);
        table.refuse_sends_of("a");
        let first = dead_letter(&table, &settings(), &[delivery_of("x", 5, 3)], &info).await;
        assert!(first[0].is_err(), "the DLQ send failed: {first:?}");
        table.allow_sends_of("a");
        ok(dead_letter(&table, &settings(), &[delivery_of("y", 1, 2)], &info).await);
        let before = table.row("a").unwrap();
        assert!(!has_entries_of(&before, "x"), "every entry of x went");
        assert!(
            before.attempt_ids.contains("x:5:3"),
            "{:?}",
            before.attempt_ids
        );
        ok(dead_letter(&table, &settings(), &[delivery_of("x", 5, 1)], &info).await);
        let after = table.row("a").unwrap();
        assert_eq!(after.record.failure_count, before.record.failure_count);
        assert_eq!(
            sent(&table).len(),
            3,
            "x's DLQ message sent once, by its twin"
        );
    }

    /// The `cut-claim-kept` mutant puts back claims without their receive: a first
    /// delivery still sends, only a claim left by an earlier receive holds the next back.
    #[cfg(feature = "sim")]
    #[tokio::test]
    async fn under_the_cut_claim_kept_mutant_a_first_delivery_still_sends() {
        crate::mutants::switch_on(&[crate::mutants::Mutant::CutClaimKept]);
        let table = MemoryStore::new();
        let r = dead_letter(
            &table,
            &settings(),
            &[candidate("a", 3)],
            &InvocationInfo::default(),
        )
        .await;
        crate::mutants::switch_on(&[]);
        assert!(r[0].is_ok(), "{r:?}");
        assert_eq!(sent(&table), ["a"]);
    }

    #[tokio::test]
    async fn a_delivery_invoked_twice_is_recorded_once_when_compaction_dropped_part_of_it() {
        let table = MemoryStore::new();
        let settings = settings();
        let info = InvocationInfo::default();
        for receive in 1..=2 {
            let record = DeadLetteredItem::from_candidate(
                &candidate("a", receive),
                &info,
                Utc::now(),
                settings.retention,
            );
            super::record(&table, &settings, &record).await.unwrap();
        }
        // The last receive, three attempts: the history of 7 is compacted to the first two
        // and the latest delivery whole (the limit of 4 raised to 5), so its first attempt
        // keeps its id. The second delivery's entries go, but not their ids: it is the
        // receive before the latest, its message is not sent, and it may still record.
        let mut last = candidate("a", 3);
        let third = crate::retry::AttemptFailure {
            attempt: 3,
            ..last.failures[0].clone()
        };
        last.failures.push(third);
        assert!(dead_letter(&table, &settings, &[last.clone()], &info).await[0].is_ok());
        let a = table.row("a").unwrap();
        let ids = a.attempt_ids;
        assert_eq!(a.record.failure_count, 7);
        assert!(
            ids.contains("m-a:3:1") && ids.contains("m-a:3:2") && ids.contains("m-a:2:1"),
            "{ids:?}"
        );
        // Its twin (the same batch, invoked twice) got one attempt in: that attempt was
        // recorded by the first copy and is not counted again.
        let mut twin = last;
        twin.failures.truncate(1);
        let again = dead_letter(&table, &settings, &[twin], &info).await;
        assert!(again[0].is_ok(), "{again:?}");
        assert_eq!(table.record("a").unwrap().failure_count, 7);
    }

    /// `candidate` with `attempts` attempts.
    fn with_attempts(id: &str, receive: u32, attempts: u32) -> DeadLetterCandidate {
        let mut c = candidate(id, receive);
        let first = c.failures[0].clone();
        c.failures = (1..=attempts)
            .map(|attempt| crate::retry::AttemptFailure {
                attempt,
                ..first.clone()
            })
            .collect();
        c
    }

    #[tokio::test]
    async fn a_twin_takes_the_claim_its_twin_freed_and_records_its_extra_attempt() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        // Copy 1 of the batch (last receive): two attempts, its DLQ send fails, the claim is
        // released.
        table.refuse_sends_of("a");
        let first = dead_letter(&table, &settings(), &[with_attempts("a", 5, 2)], &info).await;
        assert!(first[0].is_err());
        assert!(table.row("a").unwrap().claims.is_empty(), "claim released");
        table.world().lock().allow_sends_of("a");
        // Copy 2: three attempts. Its third, a call copy 1 never made, is recorded, and it
        // takes the free claim and sends the DLQ message rather than bounce the message to
        // the queue's redrive policy.
        let twin = dead_letter(&table, &settings(), &[with_attempts("a", 5, 3)], &info).await;
        assert!(twin[0].is_ok(), "{twin:?}");
        assert_eq!(sent(&table), ["a"]);
        let a = table.row("a").unwrap();
        assert!(a.attempt_ids.contains("m-a:5:3"), "{:?}", a.attempt_ids);
        assert_eq!(a.record.failure_count, 3);
    }

    #[tokio::test]
    async fn an_identical_twin_takes_the_claim_its_twin_freed() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        table.refuse_sends_of("a");
        let first = dead_letter(&table, &settings(), &[with_attempts("a", 5, 2)], &info).await;
        assert!(first[0].is_err());
        table.world().lock().allow_sends_of("a");
        let twin = dead_letter(&table, &settings(), &[with_attempts("a", 5, 2)], &info).await;
        assert!(twin[0].is_ok(), "{twin:?}");
        assert_eq!(sent(&table), ["a"]);
        assert_eq!(
            table.record("a").unwrap().failure_count,
            2,
            "nothing appended twice"
        );
    }

    #[test]
    fn a_sibling_covers_an_attempt_only_of_the_same_delivery_and_no_further_along() {
        let attempt = |message: &str, receive: u32, n: u32| FailureDetail {
            attempt_id: format!("{message}:{receive}:{n}"),
            message_id: message.to_string(),
            receive_count: receive,
            attempt_number: n,
            ..crate::testing::dead_record("a", ErrorClass::Throttled, 1).failure_history[0].clone()
        };
        let known: HashSet<String> = ["m:5:2".to_string(), "a:b:5:1".to_string()].into();
        assert!(is_recorded(&attempt("m", 5, 1), &known));
        assert!(is_recorded(&attempt("m", 5, 2), &known));
        assert!(!is_recorded(&attempt("m", 5, 3), &known), "further along");
        assert!(!is_recorded(&attempt("m", 4, 1), &known), "another receive");
        // A message id holding ':' matches itself only.
        assert!(is_recorded(&attempt("a:b", 5, 1), &known));
        assert!(!is_recorded(&attempt("b", 5, 1), &known));
    }

    #[tokio::test]
    async fn an_append_past_the_limit_compacts_the_history() {
        let table = MemoryStore::new();
        let settings = settings();
        for receive in 1..=3 {
            let record = DeadLetteredItem::from_candidate(
                &candidate("a", receive),
                &InvocationInfo::default(),
                Utc::now(),
                settings.retention,
            );
            super::record(&table, &settings, &record).await.unwrap();
        }
        let a = table.row("a").unwrap();
        assert_eq!(a.record.failure_count, 6);
        assert_eq!(a.record.failure_history.len(), 4);
        assert_eq!(a.record.history_omitted, 2);
        // The ids of dropped attempts go with them, but for receive 2's first and last: its
        // DLQ message is not sent, so a twin of it may still record.
        let mut ids: Vec<String> = a.attempt_ids.into_iter().collect();
        ids.sort();
        assert_eq!(
            ids,
            ["m-a:1:1", "m-a:1:2", "m-a:2:1", "m-a:2:2", "m-a:3:1", "m-a:3:2"]
        );
        // A fourth receive: receive 2 is two behind, and its ids stay. A twin of it may
        // still run (the simulation's `compaction` world 684).
        let record = DeadLetteredItem::from_candidate(
            &candidate("a", 4),
            &InvocationInfo::default(),
            Utc::now(),
            settings.retention,
        );
        super::record(&table, &settings, &record).await.unwrap();
        let ids = table.row("a").unwrap().attempt_ids;
        assert!(
            ids.contains("m-a:2:1") && ids.contains("m-a:2:2"),
            "{ids:?}"
        );
    }

    /// A failed delivery of item `a` with message id `message`, `attempts` attempts.
    fn delivery_of(message: &str, receive: u32, attempts: u32) -> DeadLetterCandidate {
        let mut c = with_attempts("a", receive, attempts);
        c.item.message_id = message.to_string();
        c
    }

    /// A hand-built event's message id SQS cannot carry is recorded by its digest, so the
    /// DLQ message's `source_message_id` attribute is one SQS takes (it carried the id raw,
    /// and every send failed).
    #[tokio::test]
    async fn a_message_id_sqs_cannot_carry_does_not_fail_the_dlq_send() {
        let table = MemoryStore::new();
        let id = "m-\u{1}";
        let message = serde_json::from_value(serde_json::json!({
            "messageId": id,
            "body": "{}",
            "attributes": {"ApproximateReceiveCount": "1"},
        }))
        .unwrap();
        let item = crate::item::ItemParser::default()
            .parse(id.to_string(), message)
            .unwrap();
        assert!(
            crate::message::sqs_safe(&item.item_id),
            "{:?}",
            item.item_id
        );
        let error = ProcessError::validation("not an order");
        let c = DeadLetterCandidate {
            item,
            failures: vec![crate::retry::AttemptFailure {
                attempt: 1,
                started_at: Utc::now(),
                duration: Duration::ZERO,
                error: error.clone(),
            }],
            error,
            reason: crate::dead_letter::DeadLetterReason::Permanent,
        };
        let results = dead_letter(&table, &settings(), &[c], &InvocationInfo::default()).await;
        assert!(results[0].is_ok(), "{results:?}");
    }

    /// A hand-built event's long message id is recorded by its digest: the entry stays
    /// within [`HISTORY_ENTRY_MAX`] (it took 6,325 B with a 3,000-byte id).
    #[test]
    fn a_long_message_id_keeps_an_entry_within_its_planned_size() {
        let c = delivery_of(&"m".repeat(3000), 1, 1);
        let entry = crate::dead_letter::FailureDetail::from_attempt(
            &c.item,
            &c.failures[0],
            &InvocationInfo::default(),
        );
        let size = serde_json::to_string(&entry.bounded()).unwrap().len();
        assert!(size <= HISTORY_ENTRY_MAX, "{size} bytes");
        assert!(
            entry.message_id.starts_with("sha256:"),
            "{}",
            entry.message_id
        );
    }

    /// One delivery (20 attempts) of a hand-built event with a 10 kB message id makes a
    /// record the table takes (it refused it: the record was never written).
    #[tokio::test]
    async fn a_long_message_id_leaves_the_record_writable() {
        let table = MemoryStore::new();
        let long = "m".repeat(10_000);
        let c = delivery_of(&long, 5, 20);
        let results = dead_letter(&table, &settings(), &[c], &InvocationInfo::default()).await;
        assert!(results[0].is_ok(), "{results:?}");
    }

    /// Found by an outside review: a delivery whose first and last attempt are one id (a
    /// single attempt) was carried twice by `unsent_deliveries_dropped`. DynamoDB refuses
    /// a string set with duplicates (`SET #ids = :kept_ids`), so such a compaction never
    /// landed there, and the history grew past its limit.
    #[test]
    fn compaction_never_lists_an_attempt_id_twice() {
        // Six single-attempt deliveries of six messages, none sent; limit 4 drops two.
        let mut record = stored(6, 0);
        for (n, entry) in record.failure_history.iter_mut().enumerate() {
            entry.message_id = format!("m-{n}");
            entry.attempt_number = 1;
            entry.attempt_id = format!("m-{n}:1:1");
        }
        let compaction = compaction_of(&written(&record, &HashSet::new()), 4).unwrap();
        let unique: HashSet<&String> = compaction.attempt_ids.iter().collect();
        assert_eq!(
            unique.len(),
            compaction.attempt_ids.len(),
            "{:?}",
            compaction.attempt_ids
        );
    }

    /// Found by the same review: the duplicate also spent two places of the room on one
    /// id, so the ids of an older unsent delivery that fit were dropped, and its twin
    /// appended its attempts a second time.
    #[tokio::test]
    async fn single_attempt_deliveries_leave_room_for_an_unsent_twins_ids() {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        let ok = |r: Vec<Result<(), ProcessError>>| assert!(r[0].is_ok(), "{r:?}");
        ok(dead_letter(&table, &settings(), &[delivery_of("h", 1, 2)], &info).await);
        table.refuse_sends_of("a");
        for (message, attempts) in [("x", 2), ("y", 1), ("z", 1)] {
            let candidate = delivery_of(message, 1, attempts);
            let r = dead_letter(&table, &settings(), &[candidate], &info).await;
            assert!(r[0].is_err(), "{message}'s DLQ send failed: {r:?}");
        }
        table.allow_sends_of("a");
        ok(dead_letter(&table, &settings(), &[delivery_of("w", 1, 2)], &info).await);
        // The room is 4 (twice the 4 entries kept, less those 4 ids): z, y and x need one,
        // one and two ids.
        let before = table.row("a").unwrap();
        // x's twin (the same batch invoked again) takes the free claim and sends, but must
        // not count its attempts again.
        ok(dead_letter(&table, &settings(), &[delivery_of("x", 1, 2)], &info).await);
        let after = table.row("a").unwrap();
        assert_eq!(
            after.record.failure_count, before.record.failure_count,
            "ids before x's twin: {:?}",
            before.attempt_ids
        );
    }

    /// A worker records a new failure of an item a run holds: the item goes back to dead, its
    /// lease in place. No other run takes it while the lease lives, and the run's failure
    /// of the old payload does not overwrite the new failure's error: the run gives the
    /// lease back (found by an outside review: two runs at once, and a stale error).
    #[tokio::test]
    async fn a_new_failure_under_a_live_lease_keeps_other_runs_out_and_its_error() {
        use crate::ports::RecordStore;
        let table = MemoryStore::new();
        let s = settings();
        let ttl = Duration::from_secs(900);
        let written = |receive| {
            DeadLetteredItem::from_candidate(
                &candidate("a", receive),
                &InvocationInfo::default(),
                Utc::now(),
                s.retention,
            )
        };
        super::record(&table, &s, &written(1)).await.unwrap();
        assert!(table.acquire_lease("a", "run-a", ttl).await.unwrap());
        super::record(&table, &s, &written(2)).await.unwrap();
        assert_eq!(table.row("a").unwrap().record.status, ItemStatus::Dead);
        assert!(
            !table.acquire_lease("a", "run-b", ttl).await.unwrap(),
            "run-a still processes it"
        );
        let mut stale = table.row("a").unwrap().record.failure_history[0].clone();
        stale.attempt_id = "run-a:1".into();
        stale.error_type = ErrorClass::Validation;
        let refused = table.record_redrive_failure("a", "run-a", &[stale]).await;
        assert!(refused.is_err(), "{refused:?}");
        table.release_lease("a", "run-a").await.unwrap();
        let row = table.row("a").unwrap();
        assert_eq!(
            row.record.error_class,
            ErrorClass::Throttled,
            "the new failure's"
        );
        assert!(row.record.reprocess_eligible);
        assert!(table.acquire_lease("a", "run-b", ttl).await.unwrap());
    }

    /// Records `deliveries` of item `a` (message, receive, attempts) with every DLQ send
    /// refused, then the twin of the second: returns the failure count before and after it.
    /// The first stays in the history's head, which compaction keeps.
    async fn twin_after_compaction(
        settings: &RecordingSettings,
        deliveries: &[(&str, u32, u32)],
    ) -> (u32, u32) {
        let table = MemoryStore::new();
        let info = InvocationInfo::default();
        table.refuse_sends_of("a");
        for &(message, receive, attempts) in deliveries {
            let candidate = delivery_of(message, receive, attempts);
            let r = dead_letter(&table, settings, &[candidate], &info).await;
            assert!(r[0].is_err(), "{message}'s DLQ send failed: {r:?}");
        }
        table.allow_sends_of("a");
        let before = table.row("a").unwrap().record.failure_count;
        let (message, receive, attempts) = deliveries[1];
        let twin = delivery_of(message, receive, attempts);
        let r = dead_letter(&table, settings, &[twin], &info).await;
        assert!(r[0].is_ok(), "the twin sends: {r:?}");
        (before, table.row("a").unwrap().record.failure_count)
    }

    /// Receives 2 and 3 of x while a twin of receive 1 still runs. Compaction kept the ids
    /// of an unsent delivery only at the latest receive or the one before, so the twin
    /// appended its attempts again (found by the simulation's `compaction` world 684).
    const OLDER_RECEIVE: [(&str, u32, u32); 6] = [
        ("h", 1, 2),
        ("x", 1, 2),
        ("x", 2, 1),
        ("x", 3, 1),
        ("y", 1, 2),
        ("z", 1, 2),
    ];

    /// Records of two entries kept four ids, and an unsent delivery's did not fit: its twin
    /// appended its attempts again (found by the simulation's `compaction` world 178).
    const SHORT_HISTORY: [(&str, u32, u32); 4] =
        [("h", 1, 2), ("x", 1, 3), ("y", 1, 2), ("z", 1, 2)];

    fn short_history() -> RecordingSettings {
        RecordingSettings {
            history_limit: 2,
            ..settings()
        }
    }

    #[tokio::test]
    async fn a_twin_of_an_older_receive_appends_nothing_after_compaction() {
        let (before, after) = twin_after_compaction(&settings(), &OLDER_RECEIVE).await;
        assert_eq!(after, before);
    }

    #[tokio::test]
    async fn a_short_history_keeps_the_ids_of_an_unsent_delivery() {
        let (before, after) = twin_after_compaction(&short_history(), &SHORT_HISTORY).await;
        assert_eq!(after, before);
    }

    /// The two tests above bite: each fails with the mutant of its fix on.
    #[cfg(feature = "sim")]
    #[tokio::test]
    async fn without_their_fixes_the_twins_append_again() {
        use crate::mutants::{switch_on, Mutant};
        switch_on(&[Mutant::CompactionKeepsOnlyRecentReceives]);
        let (older_before, older_after) = twin_after_compaction(&settings(), &OLDER_RECEIVE).await;
        switch_on(&[Mutant::CompactionRoomByHistoryKept]);
        let (short_before, short_after) =
            twin_after_compaction(&short_history(), &SHORT_HISTORY).await;
        switch_on(&[]);
        assert!(older_after > older_before, "{older_before} {older_after}");
        assert!(short_after > short_before, "{short_before} {short_after}");
    }

    /// Two compactions built from one read state: the first lands, the second finds the
    /// record compacted and is refused. Both landed before, and `history_omitted` counted
    /// the dropped attempts twice (8 where 4 were dropped).
    #[tokio::test]
    async fn a_second_compaction_of_the_same_read_is_refused() {
        let table = MemoryStore::new();
        let record = stored(8, 0);
        table.insert_dead_lettered(record.clone());
        let compaction = compaction_of(&written(&record, &HashSet::new()), 4).unwrap();
        table.compact(&record, &compaction).await.unwrap();
        table.compact(&record, &compaction).await.unwrap();
        let row = table.row("a").unwrap();
        assert_eq!(row.record.failure_history.len(), 4);
        assert_eq!(
            row.record.history_omitted,
            row.record.failure_count - 4,
            "each dropped attempt counted once"
        );
    }
}
