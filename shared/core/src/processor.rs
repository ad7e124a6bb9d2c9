//! The [`Processor`] trait (the user's code), and [`handler_fn`] for a processor that is
//! one async function. The processor shipped with the worker, HTTP delivery, is in
//! `http_delivery` (`http` feature).

use std::future::Future;
use std::time::Duration;

use crate::dead_letter::DeadLetterReason;
use crate::error::ProcessError;
use crate::item::WorkItem;

/// A successful end for one item.
///
/// ```
/// use sqs_keeper_core::{handler_fn, Outcome, ProcessError, WorkItem};
///
/// // Every outcome acknowledges the record; they differ in how it is counted.
/// async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError> {
///     if item.payload().is_empty() {
///         return Ok(Outcome::Skipped { reason: "empty body".into() });
///     }
///     Ok(Outcome::Done)
/// }
/// let processor = handler_fn(handle);
/// # let _ = processor;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The item was processed.
    Done,
    /// There was nothing to do (a logical outcome, not a failure): acked and counted.
    ///
    /// A skip says nothing of the downstream, which was not called. A breaker's probe that
    /// ends skipped neither closes nor opens the breaker: the next record probes.
    Skipped {
        /// Why nothing was done, for logs and metrics.
        reason: String,
    },
    /// The downstream answered that it had processed the item before (HTTP 208 Already
    /// Reported, or a service's equivalent): acked and counted as skipped.
    ///
    /// Unlike [`Outcome::Skipped`], the downstream answered. A breaker's probe, or a
    /// redrive's, closes the breaker on it.
    AlreadyDone {
        /// What the downstream said, for logs and metrics.
        reason: String,
    },
}

/// Processes one item. Implementations return a classified [`ProcessError`]; the batch
/// engine decides from its class whether to retry, report or dead-letter. `?` works on
/// AWS SDK, `reqwest`, `std::io`, `serde_json` and timeout errors, each classified
/// ([`crate::classify::classify_error`]).
///
/// ```
/// use sqs_keeper_core::{Outcome, ProcessError, Processor, WorkItem};
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: String, qty: u32 }
///
/// struct Orders;
///
/// impl Processor for Orders {
///     async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
///         let order: Order = item.json()?; // does not fit: a validation failure
///         if order.qty == 0 {
///             return Err(ProcessError::validation(format!("order {} has no quantity", order.id)));
///         }
///         Ok(Outcome::Done)
///     }
/// }
/// ```
pub trait Processor: Send + Sync {
    /// Processes one item. Called again for the same item when a retryable error is retried.
    fn process(
        &self,
        item: &WorkItem,
    ) -> impl Future<Output = Result<Outcome, ProcessError>> + Send;

    /// Returns the longest one call can take, when the processor bounds it (an HTTP client's
    /// timeout): the worker warns once when attempts and backoff cannot fit an invocation.
    fn attempt_timeout(&self) -> Option<Duration> {
        None
    }

    /// Called after a record was dead-lettered: its failure is durable (the payload, the
    /// DynamoDB record and the DLQ message are written) before this runs, so nothing the
    /// hook does can lose it. For a metric, a notification, a compensation. An error it
    /// returns, a panic, or running past the invocation's hard stop is logged (class and
    /// signature, never the message's values) and changes nothing: the record stays
    /// dead-lettered and acknowledged. At least once per dead-lettering: a delivery of a
    /// message already dead-lettered (its acknowledgement was lost) calls it again. Hooks of
    /// one batch run concurrently, before the batch answers. Not called for the records a
    /// worker without a dead-letter store returns to the queue.
    ///
    /// ```
    /// use sqs_keeper_core::{DeadLettered, Outcome, ProcessError, Processor, WorkItem};
    ///
    /// struct Orders;
    ///
    /// impl Processor for Orders {
    ///     async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
    ///         Err(ProcessError::validation("no such product"))
    ///     }
    ///
    ///     async fn on_dead_letter(&self, dead: &DeadLettered<'_>) -> Result<(), ProcessError> {
    ///         // e.g. release the stock the order held
    ///         println!("order {} dead-lettered: {}", dead.item.item_id, dead.reason.as_str());
    ///         Ok(())
    ///     }
    /// }
    /// ```
    fn on_dead_letter(
        &self,
        dead: &DeadLettered<'_>,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send {
        let _ = dead;
        std::future::ready(Ok(()))
    }
}

/// A record the worker has just dead-lettered, as [`Processor::on_dead_letter`] sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct DeadLettered<'a> {
    /// The record, as the processor saw it.
    pub item: &'a WorkItem,
    /// Its final error (the whole message; log it with [`ProcessError::loggable`]).
    pub error: &'a ProcessError,
    /// Why it was dead-lettered now.
    pub reason: DeadLetterReason,
    /// The attempts this delivery made (0 when it never ran: a bad body, a record held
    /// back on its last receive).
    pub attempts: usize,
}

/// An async function of a `&WorkItem`, for [`handler_fn`]. Implemented for every
/// `async fn(&WorkItem) -> Result<Outcome, ProcessError>` whose future is `Send`.
pub trait ItemFn<'a>: Send + Sync {
    /// The function's future.
    type Future: Future<Output = Result<Outcome, ProcessError>> + Send + 'a;
    /// Calls the function.
    fn call(&self, item: &'a WorkItem) -> Self::Future;
}

impl<'a, F, Fut> ItemFn<'a> for F
where
    F: Fn(&'a WorkItem) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Outcome, ProcessError>> + Send + 'a,
{
    type Future = Fut;

    fn call(&self, item: &'a WorkItem) -> Fut {
        self(item)
    }
}

/// A [`Processor`] made of an async function, as `lambda_runtime::service_fn` makes a
/// handler of one.
#[derive(Debug, Clone)]
pub struct HandlerFn<F>(F);

/// Makes a processor of `async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError>`.
pub fn handler_fn<F>(f: F) -> HandlerFn<F>
where
    F: for<'a> ItemFn<'a>,
{
    HandlerFn(f)
}

impl<F> Processor for HandlerFn<F>
where
    F: for<'a> ItemFn<'a>,
{
    fn process(
        &self,
        item: &WorkItem,
    ) -> impl Future<Output = Result<Outcome, ProcessError>> + Send {
        self.0.call(item)
    }
}
