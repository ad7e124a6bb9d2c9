//! The invariants checked once the world is quiet: the faults healed, the source queue
//! drained, the leases of dead runs expired and the schedule run. (Those that must hold at
//! every step are in [`crate::world::State::after_step`] and at each deletion.)
//!
//! 1. Nothing is silently gone: every payload sent was delivered, purged by an operator,
//!    or is held by a dead record (as its payload, or by a DLQ message of its item).
//! 2. No record is left `redriving` or `requeued`: leases are taken back, requeues finish.
//! 3. The DLQ and the table agree: a DLQ message exists for each dead record, and every DLQ
//!    message belongs to a dead record.
//! 4. The schedule did its work: no dead record is left that it would redrive (eligible,
//!    not for manual review), since the downstream is healthy again.
//! 5. Duplicates are explained: the worker delivered a message more than once only as
//!    often as at-least-once events (a duplicate receive, an invocation that delivered it
//!    but did not acknowledge it) allow.

use std::collections::{BTreeMap, BTreeSet};

use sqs_keeper_core::dead_letter::ItemStatus;
use sqs_keeper_core::message::PAYLOAD_SHA256_ATTRIBUTE;

use crate::world::{Checks, Section, State};

/// Checks the end-state invariants, recording each broken one.
pub fn at_quiescence(state: &mut State, now: chrono::DateTime<chrono::Utc>) {
    let mut broken: Vec<(Section, String, String)> = Vec::new();
    // Payload digests of the DLQ's messages, by item.
    let mut dlq: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in state.dlq.messages() {
        let item = tracked_item(state, m);
        dlq.entry(item).or_default().insert(held_payload(m));
    }
    let corrupted = state.ext.ledger.corrupted.clone();

    for (item, sha) in &state.ext.ledger.sent {
        state.ext.stats.checks += 1;
        let copies = state.copies_of(sha);
        if state.deliveries_of(sha) > 0
            || copies.iter().any(|c| {
                state.ext.ledger.discarded.contains(c)
                    || state.ext.ledger.expired_in_window.contains(c)
            })
        {
            continue;
        }
        let in_dlq = dlq
            .get(item)
            .is_some_and(|s| copies.iter().any(|c| s.contains(c)));
        let held = match state.table.get(item) {
            Some(row) if row.corrupt => in_dlq,
            Some(row) => {
                row.record.status == ItemStatus::Dead
                    && (copies.contains(&row.record.payload.sha256) || in_dlq)
            }
            None => false,
        } || (copies.len() > 1
            // A pointer the worker could not follow is recorded under the message's id
            // (its text has no item id): held if a dead record keeps it.
            && state.table.values().any(|row| {
                row.record.status == ItemStatus::Dead && copies.contains(&row.record.payload.sha256)
            }));
        if !held {
            broken.push((
                Section::NothingLost,
                item.clone(),
                format!(
                    "payload {} was neither delivered nor held by a dead record: lost",
                    &sha[..12]
                ),
            ));
        }
    }

    for (id, row) in &state.table {
        state.ext.stats.checks += 3;
        if row.corrupt {
            continue;
        }
        let r = &row.record;
        match r.status {
            // A documented window (docs/SIMULATION.md, "Windows excused"): a requeued
            // message whose body names no item is an item of its own to the worker (its
            // new message id); failing again, it is recorded there, and the record it was
            // requeued from waits, `requeued`, until the redrive sets it back to dead the
            // queue's retention and an hour after the requeue (§3). Its payload is held
            // meanwhile.
            ItemStatus::Requeued
                if r.requeued_message_id
                    .as_ref()
                    .is_some_and(|m| held_under_another_item(state, &dlq, m, id)) => {}
            // A documented window: the requeued message expired before a delivery could
            // finish the record (the delivery's mark failed, then its hide). The redrive
            // sets the record back to dead once the queue's retention and an hour have
            // passed since the requeue, which is after the world's end. Its payload is
            // held by the record meanwhile.
            ItemStatus::Requeued if requeue_awaits_reset(state, r, now) => {}
            ItemStatus::Redriving | ItemStatus::Requeued => broken.push((
                Section::Record,
                id.clone(),
                format!(
                    "left {:?} at the end (a lease never taken back, or a requeue never finished)",
                    r.status
                ),
            )),
            ItemStatus::Dead => {
                // The same window the other way round: the record a failure of a
                // pointer was filed under while its payload could not be read, whose
                // message SQS's redrive policy then moved, tracked by another record.
                // A documented window: the delivery that dead-lettered the message was
                // cut before its DLQ send, or the send and the hide both failed, and SQS
                // deleted the message at the end of its retention before another receive
                // could send it. Nothing ever sent its DLQ message.
                let expired_unsent = state
                    .ext
                    .ledger
                    .expired_messages
                    .contains(&r.source.message_id)
                    && !row.sent.contains(&r.source.message_id);
                // The same window after a requeue: the requeue deleted the DLQ message, and
                // a requeue that outlived its queue is set back to dead without one. Noted
                // at the step that did it: compaction may drop the failure that says so.
                let reset_after_requeue = state.ext.ledger.reopened_after_requeue.contains(id);
                if !dlq.contains_key(id)
                    && !state.ext.ledger.purged.contains(id)
                    && !expired_unsent
                    && !reset_after_requeue
                    && !held_under_another_item(state, &dlq, &r.source.message_id, id)
                {
                    broken.push((
                        Section::DlqRule,
                        id.clone(),
                        "dead, but no DLQ message holds it".to_string(),
                    ));
                }
                let doomed = doomed_record(state, id, &r.payload.sha256);
                if r.reprocess_eligible && !r.manual_review_required && !doomed {
                    broken.push((
                        Section::Record,
                        id.clone(),
                        format!(
                            "dead and eligible ({}) after the schedule ran with a healthy downstream",
                            r.error_class
                        ),
                    ));
                }
            }
            ItemStatus::Resolved => {}
        }
    }
    for item in dlq.keys() {
        state.ext.stats.checks += 1;
        let dead = state
            .table
            .get(item)
            .is_some_and(|row| row.corrupt || row.record.status == ItemStatus::Dead);
        if !dead && !corrupted.contains(item) && !state.ext.ledger.purged.contains(item) {
            broken.push((
                Section::DlqRule,
                item.clone(),
                "a DLQ message is left for an item with no dead record".to_string(),
            ));
        }
    }

    for (message, deliveries) in &state.ext.ledger.worker_deliveries {
        state.ext.stats.checks += 1;
        let causes = state.ext.ledger.causes.get(message).copied().unwrap_or(0);
        if *deliveries > 1 + causes {
            broken.push((
                Section::RecordingIdempotent,
                message.clone(),
                format!(
                    "delivered {deliveries} times by the worker with {causes} at-least-once event(s) to explain it"
                ),
            ));
        }
    }
    for (section, item, what) in broken {
        state.violate(section, &item, what);
    }
}

/// Whether source message `message` is held under another item than `id`: a record of
/// another item lists one of its attempts (or it as its source), or a DLQ message of it is
/// tracked by another item. The documented window of an Extended-Client message whose
/// payload could not be read when it was recorded (docs/SIMULATION.md, "Windows
/// excused"): recorded under its message id then, under the item its payload names once
/// read, one payload under two records, each holding it.
/// The item a DLQ message tracks, as an adoption would name it: its item attribute, else
/// the item its payload names (a producer's pointer followed into the bucket), else its id.
fn tracked_item(state: &State, m: &sqs_keeper_core::testing::QueueMessage) -> String {
    let body = sqs_keeper_core::pointer::S3Pointer::parse(&m.body)
        .and_then(|p| state.bucket.get(&(p.bucket, p.key)))
        .unwrap_or(&m.body);
    sqs_keeper_core::message::dlq_item_id(
        |name| m.attribute(name),
        sqs_keeper_core::testing::payload_id(body),
        &sqs_keeper_core::message::original_message_id(
            |name| m.attribute(name),
            &m.id,
            m.marker.is_some(),
        ),
    )
}

fn held_under_another_item(
    state: &State,
    dlq: &BTreeMap<String, BTreeSet<String>>,
    message: &str,
    id: &str,
) -> bool {
    let recorded = state
        .ext
        .ledger
        .recorded_under
        .get(message)
        .is_some_and(|items| items.iter().any(|item| item != id));
    // The DLQ message's item as the DLQ map above has it: a message SQS's redrive policy
    // moved carries no item attribute, and its pointer names the item in the payload.
    let in_dlq = state.dlq.messages().iter().any(|m| {
        let tracked = tracked_item(state, m);
        (m.id == message
            || m.attribute(sqs_keeper_core::message::SOURCE_MESSAGE_ID_ATTRIBUTE) == Some(message))
            && tracked != id
            && dlq.contains_key(&tracked)
    });
    recorded || in_dlq
}

/// Whether a requeued record's message expired and the redrive's reset of it is not due
/// yet (§3: the queue's retention and [`sqs_keeper_core::redrive::REQUEUE_MARGIN`] after the
/// requeue).
fn requeue_awaits_reset(
    state: &State,
    record: &sqs_keeper_core::dead_letter::DeadLetteredItem,
    now: chrono::DateTime<chrono::Utc>,
) -> bool {
    let expired = record
        .requeued_message_id
        .as_ref()
        .is_some_and(|m| state.ext.ledger.expired_messages.contains(m));
    let outlived = state.source().retention + sqs_keeper_core::redrive::REQUEUE_MARGIN;
    let due = record
        .requeued_at
        .zip(chrono::Duration::from_std(outlived).ok())
        .map(|(at, wait)| at + wait);
    expired && due.is_some_and(|due| due > now)
}

/// §3 in the worlds with a late outage: once the downstream is back, the schedule's probe
/// runs reach every eligible item within a few runs, however many items at the head of
/// the line tell nothing of the downstream (a handler that always panics), since a probe
/// run takes up to five of them. An item with several DLQ messages takes a run more for
/// each (a run resolves one and its sweep adopts the next): `budget` gives each item its
/// runs. Items whose budget is `runs` are checked now.
pub fn after_recovery(state: &mut State, runs: usize, budget: &BTreeMap<String, usize>) {
    if budget.is_empty() {
        return;
    }
    let waiting: Vec<String> = state
        .table
        .iter()
        .filter(|(id, row)| !row.corrupt && budget.get(*id).copied() == Some(runs))
        .filter(|(id, row)| {
            let r = &row.record;
            r.status == ItemStatus::Dead
                && r.reprocess_eligible
                && !r.manual_review_required
                && !doomed_record(state, id, &r.payload.sha256)
        })
        .map(|(id, _)| id.clone())
        .collect();
    state.ext.stats.checks += 1;
    for id in waiting {
        state.violate(
            Section::Record,
            &id,
            format!(
                "dead and eligible {runs} schedule runs after the downstream recovered (the probe did not look past the items that tell nothing)"
            ),
        );
    }
}

/// The schedule runs each dead item may take to be reached after a late outage: `runs`,
/// and one more for each DLQ message of its beyond the first.
pub fn recovery_budget(state: &State, runs: usize) -> BTreeMap<String, usize> {
    let mut messages: BTreeMap<String, usize> = BTreeMap::new();
    for m in state.dlq.messages() {
        *messages.entry(tracked_item(state, m)).or_default() += 1;
    }
    state
        .table
        .keys()
        .map(|id| {
            let extra = messages.get(id).copied().unwrap_or(1).saturating_sub(1);
            (id.clone(), runs + extra)
        })
        .collect()
}

/// Whether the record of `item`, holding the payload of digest `sha`, may stay dead and
/// eligible: its payload's handler panics on every call, and no DLQ message of the item
/// holds another payload, which would wait behind it for ever.
fn doomed_record(state: &State, item: &str, sha: &str) -> bool {
    doomed_payload(state, sha)
        && state
            .dlq
            .messages()
            .iter()
            .all(|m| tracked_item(state, m) != item || doomed_payload(state, &held_payload(m)))
}

/// The digest of the payload a DLQ message holds: its payload attribute, else its body's.
fn held_payload(m: &sqs_keeper_core::testing::QueueMessage) -> String {
    m.attribute(PAYLOAD_SHA256_ATTRIBUTE)
        .map_or_else(|| m.body_sha256.clone(), str::to_string)
}

/// Whether the payload of digest `sha` (as a record holds it: the body, or a pointer's text)
/// has a handler that panics on every call.
fn doomed_payload(state: &State, sha: &str) -> bool {
    let ledger = &state.ext.ledger;
    ledger.doomed.contains(sha)
        || ledger
            .pointers
            .get(sha)
            .is_some_and(|body| ledger.doomed.contains(body))
}
