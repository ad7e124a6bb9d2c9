//! Redrive: selects dead-lettered items and puts them back through the pipeline, safely.
//!
//! - **Selection**: by item ids, or by status (default `dead`), error signature, error
//!   class and last-attempt time range; only `reprocess_eligible` items without
//!   `manual_review_required` unless `force`.
//! - **Modes**: `reprocess` runs each item through the worker's processor in place;
//!   `requeue` sends the original payload back to its source queue (S3 payloads inlined
//!   when they fit, re-pointed otherwise), batched.
//! - **Safety**: each item is leased (`dead → redriving`, conditional, with expiry) before
//!   anything happens, so concurrent redrives never process an item twice; success marks
//!   it `resolved` (kept for audit until TTL) and deletes its DLQ message (whichever of
//!   two concurrent runs holds it); failure appends to its history and returns it to
//!   `dead`.
//! - **Long runs**: a time budget and `max_items` stop a run between chunks with a
//!   continuation token; the next run resumes after the last item handled.
//! - **Nothing invisible**: each run first sweeps the DLQ and creates records for messages
//!   the queue's redrive policy moved without one.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`request`] | the request, its validation into a plan, continuation tokens (pure) |
//! | [`report`] | per-item outcomes and the run's counts (pure) |
//! | [`engine`] | the run itself, over [`crate::ports::RecordStore`] and the other port traits |
//! | [`requeue`] | requeue mode: the message an item goes back as, batching |
//! | [`gate`] | a run behind the worker's circuit breaker: held back, or the probe |

pub mod engine;
pub mod gate;
pub mod report;
pub mod request;
pub mod requeue;

pub use engine::{
    expiry_when_reopened, expiry_when_requeued, no_progress, RedriveEngine, RedriveSettings,
    ITEM_GRACE, LEASE_MARGIN, OUTCOME_WRITE_SLICE, REQUEUED_RECORD_LIFE, REQUEUE_MARGIN,
    REQUEUE_OUTLIVED, SETTLE_RESERVE,
};
pub use gate::run_gated;
pub use report::{ItemOutcome, ItemOutcomeKind, RedriveReport};
pub use request::{RedriveError, RedriveMode, RedriveRequest};

#[cfg(test)]
mod tests;
