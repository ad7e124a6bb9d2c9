//! What a redrive run reports: one outcome per item and the counts, bounded so the
//! redrive function's answer fits Lambda's response limit.

use serde::{Deserialize, Serialize};

use super::request::RedriveMode;

/// What happened to one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ItemOutcomeKind {
    /// Reprocessed; record resolved.
    Resolved,
    /// Sent back to the source queue; the record is `requeued` until the worker finishes
    /// the message.
    Requeued,
    /// Reprocessing failed again; history extended, still dead.
    FailedAgain,
    /// Not eligible (and no `force`).
    SkippedIneligible,
    /// Another run holds its lease.
    LeasedElsewhere,
    /// No record with that id.
    NotFound,
    /// Dry run: would be redriven.
    WouldRedrive,
    /// The store or queue failed; the item is unchanged (lease released).
    Error,
    /// Its message group's circuit breaker is open: not reprocessed, unchanged (lease
    /// released). A later run takes it once that breaker has closed.
    HeldByBreaker,
}

/// One item's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemOutcome {
    /// The item.
    pub item_id: String,
    /// What happened.
    pub outcome: ItemOutcomeKind,
    /// Why, for failures and errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The class of the last failure, for items that failed again (a transient class says
    /// the downstream is unwell; the breaker's gate reopens only on those).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_class: Option<crate::error::ErrorClass>,
}

/// The result of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RedriveReport {
    /// This run's id (the lease owner).
    pub run_id: String,
    /// Mode used.
    pub mode: RedriveMode,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Items selected (every outcome below counts one).
    pub selected: usize,
    /// Resolved.
    pub succeeded: usize,
    /// Of those resolved, the ones resolved with nothing done (skipped by the handler, or
    /// their idempotency key completed before): the downstream was not called.
    #[serde(default)]
    pub resolved_with_nothing_done: usize,
    /// Sent back to the source queue (record `requeued`).
    #[serde(default)]
    pub requeued: usize,
    /// Failed again.
    pub failed_again: usize,
    /// Skipped as not eligible.
    pub skipped_ineligible: usize,
    /// Held by another run.
    pub leased_elsewhere: usize,
    /// Unknown item ids.
    pub not_found: usize,
    /// Store or queue errors.
    pub errors: usize,
    /// Held back by their message group's open circuit breaker, unchanged.
    #[serde(default)]
    pub held_by_group_breaker: usize,
    /// Records created for DLQ messages that had none.
    pub adopted_from_dlq: usize,
    /// DLQ messages deleted (of resolved items).
    pub dlq_messages_deleted: usize,
    /// Per item: every item's outcome up to the engine's `report_items` (1,000 by default,
    /// so the report fits Lambda's 6 MB response however many items a run touched); the
    /// counts above are always complete.
    pub items: Vec<ItemOutcome>,
    /// Outcomes counted above but left out of `items`.
    #[serde(default)]
    pub items_omitted: usize,
    /// Set when the run stopped early: pass it back to resume.
    pub continuation_token: Option<String>,
    /// How long the oldest dead record has waited since its last attempt (seconds), read
    /// at the end of the run: what the DLQ age alarm watches when a schedule sweeps the DLQ
    /// (SQS leaves a message received three times out of its own age metric).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_dead_age_secs: Option<u64>,
    /// Records set back to dead because they stayed `requeued` longer than any queue keeps
    /// a message ([`crate::redrive::REQUEUE_OUTLIVED`]).
    #[serde(default)]
    pub requeues_outlived: usize,
    /// Set when the worker's circuit breaker held the run back (nothing was reprocessed):
    /// why (its open period running, a worker probing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by_breaker: Option<String>,
}

impl RedriveReport {
    pub(super) fn add(&mut self, outcome: ItemOutcome, sample: usize) {
        self.selected += 1;
        match outcome.outcome {
            ItemOutcomeKind::Resolved => {
                self.succeeded += 1;
                if outcome
                    .detail
                    .as_deref()
                    .is_some_and(|d| d.starts_with(super::engine::SKIPPED))
                {
                    self.resolved_with_nothing_done += 1;
                }
            }
            ItemOutcomeKind::Requeued => self.requeued += 1,
            ItemOutcomeKind::FailedAgain => self.failed_again += 1,
            ItemOutcomeKind::SkippedIneligible => self.skipped_ineligible += 1,
            ItemOutcomeKind::LeasedElsewhere => self.leased_elsewhere += 1,
            ItemOutcomeKind::NotFound => self.not_found += 1,
            ItemOutcomeKind::Error => self.errors += 1,
            ItemOutcomeKind::HeldByBreaker => self.held_by_group_breaker += 1,
            ItemOutcomeKind::WouldRedrive => {}
        }
        self.list(outcome, sample);
    }

    /// Lists an outcome in the bounded sample (or counts it as omitted).
    pub(super) fn list(&mut self, outcome: ItemOutcome, sample: usize) {
        if self.items.len() < sample {
            self.items.push(outcome);
        } else {
            self.items_omitted += 1;
        }
    }

    /// Adds the counts and outcomes of an earlier run of the same invocation (a probe run
    /// before the main one); the run id, mode and continuation stay this run's.
    pub fn absorb(&mut self, earlier: RedriveReport) {
        self.selected += earlier.selected;
        self.succeeded += earlier.succeeded;
        self.resolved_with_nothing_done += earlier.resolved_with_nothing_done;
        self.requeued += earlier.requeued;
        self.failed_again += earlier.failed_again;
        self.skipped_ineligible += earlier.skipped_ineligible;
        self.leased_elsewhere += earlier.leased_elsewhere;
        self.not_found += earlier.not_found;
        self.errors += earlier.errors;
        self.held_by_group_breaker += earlier.held_by_group_breaker;
        self.adopted_from_dlq += earlier.adopted_from_dlq;
        self.dlq_messages_deleted += earlier.dlq_messages_deleted;
        self.items_omitted += earlier.items_omitted;
        let mut items = earlier.items;
        items.append(&mut self.items);
        self.items = items;
    }

    /// Tells whether anything failed (failed again, errors, unknown ids).
    pub fn is_partial_failure(&self) -> bool {
        self.failed_again + self.errors + self.not_found > 0
    }
}
