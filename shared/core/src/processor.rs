//! The [`Processor`] trait (the user's code), and [`handler_fn`] for a processor that is
//! one async function. The processor shipped with the worker, HTTP delivery, is in
//! `http_delivery` (`http` feature).

use std::future::Future;
use std::time::Duration;

use crate::error::ProcessError;
use crate::item::WorkItem;

/// A successful end for one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The item was processed.
    Done,
    /// There was nothing to do (a logical outcome, not a failure): acked and counted.
    Skipped {
        /// Why nothing was done, for logs and metrics.
        reason: String,
    },
}

/// Processes one item. Implementations return a classified [`ProcessError`]; the batch
/// engine decides from its class whether to retry, report or dead-letter. `?` works on
/// AWS SDK, `reqwest`, `std::io`, `serde_json` and timeout errors, each classified
/// ([`crate::classify`]).
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

    /// The longest one call can take, when the processor bounds it (an HTTP client's
    /// timeout): the worker warns once when attempts and backoff cannot fit an invocation.
    fn attempt_timeout(&self) -> Option<Duration> {
        None
    }
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
