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
//! Its names are at this module's root. They come from five files:
//!
//! | file | what it holds |
//! | --- | --- |
//! | `request.rs` | the request ([`RedriveRequest`]), its validation into a plan, continuation tokens (pure) |
//! | `report.rs` | per-item outcomes and the run's counts ([`RedriveReport`], pure) |
//! | `engine.rs` | the run itself ([`RedriveEngine`]), over [`crate::ports::RecordStore`] and the other port traits |
//! | `requeue.rs` | requeue mode: the message an item goes back as, batching |
//! | `gate.rs` | a run behind the worker's circuit breaker ([`run_gated`]): held back, or the probe |

mod engine;
mod gate;
mod report;
mod request;
mod requeue;

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
