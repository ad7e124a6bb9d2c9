//! Test doubles for users' own tests and ours: a processor that follows a script per item,
//! an in-memory dead-letter sink, one in-memory world of the store's AWS side with its
//! ports ([`World`], [`MemoryStore`]), [`MemoryIdempotencyStore`], [`MemoryBreakerStore`]
//! and [`MemoryPauseMarker`]. No I/O.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `world` | the world's state ([`WorldState`]: table, bucket, DLQ, source queues), its fault and latency knobs ([`Faults`], [`Latency`]) and its observer ([`Observer`], [`Event`]) |
//! | `queue` | an SQS queue ([`Queue`]): bodies, attributes, receipts, visibility, FIFO groups, the redrive policy |
//! | `memory_store` | [`MemoryStore`]: the store ports over a world, one AWS call each |
//!
//! The unit tests, the engine tests and the simulation (`tests/sim`) all run over the same
//! world (docs/ARCHITECTURE.md §5).

mod breaker_store;
mod idempotency_store;
mod memory_store;
mod pause_marker;
mod queue;
mod world;

pub use breaker_store::MemoryBreakerStore;
pub use idempotency_store::MemoryIdempotencyStore;
pub use memory_store::{dead_record, MemoryMessage, MemoryStore, BUCKET};
pub use pause_marker::MemoryPauseMarker;
pub use queue::{payload_id, Queue, QueueMessage, Received, ACCOUNT};
pub use world::{
    satisfied, Event, Faults, Latency, Observer, Row, World, WorldState, ITEM_SIZE_LIMIT,
};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::dead_letter::{DeadLetterCandidate, DeadLetterSink, InvocationInfo};
use crate::error::{ErrorClass, ProcessError};
use crate::item::WorkItem;
use crate::processor::{Outcome, Processor};

/// What a [`ScriptedProcessor`] does on one call.
#[derive(Debug, Clone)]
pub enum Step {
    /// Succeed.
    Done,
    /// Succeed with nothing to do.
    Skip,
    /// Succeed: the downstream answered that it had done the item before.
    AlreadyDone,
    /// Fail with this class.
    Fail(ErrorClass),
    /// Fail with this error (a `Retry-After`, a code).
    Error(ProcessError),
    /// Sleep (on tokio's clock), then succeed.
    Sleep(Duration),
    /// Panic, as a buggy processor would.
    Panic,
}

/// A processor whose behaviour per item id is a script: call n does step n; calls past the
/// end repeat the last step; items without a script succeed.
#[derive(Debug, Default)]
pub struct ScriptedProcessor {
    scripts: HashMap<String, Vec<Step>>,
    calls: Mutex<HashMap<String, usize>>,
}

impl ScriptedProcessor {
    /// Creates a processor where every item succeeds.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the script for an item id.
    pub fn script(mut self, item_id: &str, steps: Vec<Step>) -> Self {
        self.scripts.insert(item_id.to_string(), steps);
        self
    }

    /// Returns how often the processor was called for an item id.
    pub fn calls(&self, item_id: &str) -> usize {
        self.calls
            .lock()
            .map(|c| c.get(item_id).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

impl Processor for ScriptedProcessor {
    // `Step::Panic` panics on purpose: it stands for a buggy processor.
    #[allow(clippy::panic)]
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let n = match self.calls.lock() {
            Ok(mut calls) => {
                let n = calls.entry(item.item_id.clone()).or_default();
                *n += 1;
                *n
            }
            Err(_) => 1,
        };
        let step = self
            .scripts
            .get(&item.item_id)
            .and_then(|s| s.get(n - 1).or_else(|| s.last()))
            .cloned()
            .unwrap_or(Step::Done);
        match step {
            Step::Done => Ok(Outcome::Done),
            Step::Skip => Ok(Outcome::Skipped {
                reason: "scripted skip".to_string(),
            }),
            Step::AlreadyDone => Ok(Outcome::AlreadyDone {
                reason: "scripted: already done downstream".to_string(),
            }),
            Step::Fail(class) => Err(ProcessError::new(
                class,
                format!("scripted {class} failure"),
            )),
            Step::Error(error) => Err(error),
            Step::Sleep(d) => {
                tokio::time::sleep(d).await;
                Ok(Outcome::Done)
            }
            Step::Panic => {
                std::panic::panic_any(format!("scripted panic on item {}", item.item_id))
            }
        }
    }
}

/// A sink that keeps candidates in memory; it can be told to fail or to hang.
#[derive(Debug, Default)]
pub struct MemorySink {
    /// Every candidate it accepted.
    pub accepted: Mutex<Vec<DeadLetterCandidate>>,
    fail: bool,
    delay: Option<Duration>,
}

impl MemorySink {
    /// Creates a sink that accepts everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns a sink that fails everything (a store outage).
    pub fn failing() -> Self {
        MemorySink {
            fail: true,
            ..Self::default()
        }
    }

    /// Returns a sink whose every write takes `delay` (on tokio's clock) before it succeeds: a
    /// store that hangs.
    pub fn slow(delay: Duration) -> Self {
        MemorySink {
            delay: Some(delay),
            ..Self::default()
        }
    }

    /// Returns the item ids accepted so far.
    pub fn accepted_ids(&self) -> Vec<String> {
        self.accepted
            .lock()
            .map(|a| a.iter().map(|c| c.item.item_id.clone()).collect())
            .unwrap_or_default()
    }
}

impl DeadLetterSink for MemorySink {
    async fn dead_letter(
        &self,
        candidates: &[DeadLetterCandidate],
        _invocation: &InvocationInfo,
    ) -> Vec<Result<(), ProcessError>> {
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
        if self.fail {
            return candidates
                .iter()
                .map(|_| {
                    Err(ProcessError::new(
                        ErrorClass::ServerError,
                        "store unavailable",
                    ))
                })
                .collect();
        }
        if let Ok(mut accepted) = self.accepted.lock() {
            accepted.extend(candidates.iter().cloned());
        }
        candidates.iter().map(|_| Ok(())).collect()
    }
}
