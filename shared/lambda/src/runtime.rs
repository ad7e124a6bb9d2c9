//! How the worker binary plugs into `lambda_runtime` so that it decodes the event itself.
//!
//! `lambda_runtime` deserializes every invocation body with `serde_json` into the
//! handler's payload type before the handler runs. For a 5 MB SQS event that decode is
//! most of the invocation's CPU, and even taking the payload as raw JSON costs a full
//! scan and a copy of the body. [`WorkerLayer`] instead sits in front of the runtime's
//! response path, where the body is still the bytes the Runtime API sent: it runs the
//! batch on those bytes ([`Worker::handle_invocation`]), then hands the runtime a body
//! holding only the small [`HandlerOutcome`], which [`respond`] returns as the function's
//! result. The runtime still posts the response or error and catches panics exactly as
//! for any handler. [`InvocationLayer`](crate::telemetry::InvocationLayer), added last so
//! that it runs first, puts the whole invocation, the batch included, inside the span
//! whose request id and cold start every log line carries.
//!
//! ```no_run
//! # use sqs_keeper_core::{dead_letter::DeadLetterSink, Processor};
//! # use sqs_keeper_lambda::worker::Worker;
//! # async fn example<P: Processor + 'static, S: DeadLetterSink + 'static>(worker: &'static Worker<P, S>) -> Result<(), lambda_runtime::Error> {
//! use lambda_runtime::{service_fn, Runtime};
//! use sqs_keeper_lambda::{runtime::respond, runtime::WorkerLayer};
//! use sqs_keeper_lambda::telemetry::InvocationLayer;
//!
//! Runtime::new(service_fn(respond))
//!     .layer(WorkerLayer::new(worker))
//!     .layer(InvocationLayer)
//!     .run()
//!     .await
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use aws_lambda_events::sqs::SqsBatchResponse;
use futures::FutureExt;
use lambda_runtime::tower::{Layer, Service};
use lambda_runtime::{Diagnostic, LambdaEvent, LambdaInvocation};
use serde::{Deserialize, Serialize};

use crate::worker::Worker;
use sqs_keeper_core::dead_letter::DeadLetterSink;
use sqs_keeper_core::Processor;

/// What the worker decided for one invocation, as the runtime's handler receives it.
// Exhaustive on purpose: Lambda's answer to an invocation is a response or an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandlerOutcome {
    /// The batch response to return.
    Response(SqsBatchResponse),
    /// The invocation fails as a whole (SQS redelivers every record).
    Failed(Diagnostic),
}

/// Answers with what the layer decided: the handler behind [`WorkerLayer`].
pub async fn respond(event: LambdaEvent<HandlerOutcome>) -> Result<SqsBatchResponse, Diagnostic> {
    match event.payload {
        HandlerOutcome::Response(response) => Ok(response),
        HandlerOutcome::Failed(diagnostic) => Err(diagnostic),
    }
}

/// Runs the worker on each invocation's raw body, in front of the runtime's handler.
#[derive(Debug)]
pub struct WorkerLayer<P: 'static, S: 'static> {
    worker: &'static Worker<P, S>,
}

impl<P: 'static, S: 'static> Clone for WorkerLayer<P, S> {
    fn clone(&self) -> Self {
        WorkerLayer {
            worker: self.worker,
        }
    }
}

impl<P: 'static, S: 'static> WorkerLayer<P, S> {
    /// Creates a layer around a worker that lives as long as the process.
    pub fn new(worker: &'static Worker<P, S>) -> Self {
        WorkerLayer { worker }
    }
}

impl<P: 'static, S: 'static, Inner> Layer<Inner> for WorkerLayer<P, S> {
    type Service = WorkerService<P, S, Inner>;

    fn layer(&self, inner: Inner) -> Self::Service {
        WorkerService {
            worker: self.worker,
            inner,
        }
    }
}

/// The service [`WorkerLayer`] builds. Cloned once per concurrent invocation slot by
/// `lambda_runtime`'s `run_concurrent` (Lambda Managed Instances): every clone shares the
/// one worker, and everything of one invocation (its deadline, records, metrics, span)
/// lives in that invocation's future.
#[derive(Debug)]
pub struct WorkerService<P: 'static, S: 'static, Inner> {
    worker: &'static Worker<P, S>,
    inner: Inner,
}

impl<P: 'static, S: 'static, Inner: Clone> Clone for WorkerService<P, S, Inner> {
    fn clone(&self) -> Self {
        WorkerService {
            worker: self.worker,
            inner: self.inner.clone(),
        }
    }
}

impl<P, S, Inner> Service<LambdaInvocation> for WorkerService<P, S, Inner>
where
    P: Processor + 'static,
    S: DeadLetterSink + 'static,
    Inner: Service<LambdaInvocation, Response = (), Error = lambda_runtime::Error>
        + Clone
        + Send
        + 'static,
    Inner::Future: Send,
{
    type Response = ();
    type Error = lambda_runtime::Error;
    type Future = Pin<Box<dyn Future<Output = Result<(), lambda_runtime::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut invocation: LambdaInvocation) -> Self::Future {
        // The instance polled ready is the one to call; leave a fresh clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let worker = self.worker;
        Box::pin(async move {
            // The body moves into the worker, which frees it once decoded.
            let body = std::mem::take(&mut invocation.body);
            // The batch runs here, ahead of the runtime's own panic guard: catch a panic so
            // that it fails this invocation (SQS delivers the batch again) instead of
            // ending the process and losing the sandbox. A processor's panic never gets
            // this far: it fails only its record (`batch::guard_panics`).
            let handled =
                std::panic::AssertUnwindSafe(worker.handle_invocation(body, &invocation.context))
                    .catch_unwind()
                    .await;
            let outcome = match handled {
                Ok(Ok(response)) => HandlerOutcome::Response(response),
                Ok(Err(error)) => HandlerOutcome::Failed(error.into()),
                Err(panic) => {
                    let message = sqs_keeper_core::batch::panic_message(&*panic);
                    tracing::error!(panic = %sqs_keeper_core::signature::loggable_message(&message), "the worker panicked; failing the whole invocation");
                    HandlerOutcome::Failed(Diagnostic {
                        error_type: "Panic".to_string(),
                        error_message: format!("the worker panicked: {message}"),
                    })
                }
            };
            invocation.body = serde_json::to_vec(&outcome)?.into();
            inner.call(invocation).await
        })
    }
}
