//! The two ways the local event source mapping reaches the worker: the compiled binary over
//! the Runtime API, or the library's handler in this process.

use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use bytes::Bytes;
use sqs_keeper_core::dead_letter::DeadLetterSink;
use sqs_keeper_core::retry::Deadline;
use sqs_keeper_lambda::{worker::Worker, Processor};

use crate::esm::Invoker;
use crate::runtime_api::{InvocationResult, RuntimeApi};

/// Invokes a function process through a [`RuntimeApi`].
pub struct RuntimeApiInvoker {
    /// The endpoint the function polls.
    pub api: RuntimeApi,
    /// The invocation timeout (sent as the deadline).
    pub timeout: Duration,
}

impl Invoker for RuntimeApiInvoker {
    async fn invoke(&self, event: Bytes) -> Result<Vec<String>, String> {
        invoke_through(&self.api, event, self.timeout).await
    }
}

/// A [`RuntimeApiInvoker`] over a runtime API shared with other callers (the local Lambda
/// API's Invoke, for one).
pub struct SharedRuntimeApiInvoker {
    /// The endpoint the function polls.
    pub api: std::sync::Arc<RuntimeApi>,
    /// The invocation timeout (sent as the deadline).
    pub timeout: Duration,
}

impl Invoker for SharedRuntimeApiInvoker {
    async fn invoke(&self, event: Bytes) -> Result<Vec<String>, String> {
        invoke_through(&self.api, event, self.timeout).await
    }
}

async fn invoke_through(
    api: &RuntimeApi,
    event: Bytes,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    {
        match api
            .invoke(event, timeout)
            .await
            .map_err(|e| e.to_string())?
        {
            InvocationResult::Response(body) => serde_json::from_slice::<SqsBatchResponse>(&body)
                .map(|r| {
                    r.batch_item_failures
                        .into_iter()
                        .map(|f| f.item_identifier)
                        .collect()
                })
                .map_err(|e| {
                    format!("the function answered something that is not a batch response: {e}")
                }),
            InvocationResult::Error(body) => Err(String::from_utf8_lossy(&body).to_string()),
        }
    }
}

/// Invokes a [`Worker`] in this process, decoding the event as the Lambda runtime does.
pub struct InProcessInvoker<P, S> {
    /// The worker.
    pub worker: Worker<P, S>,
    /// The invocation timeout.
    pub timeout: Duration,
    /// Kept free before the deadline.
    pub margin: Duration,
}

impl<P: Processor, S: DeadLetterSink> Invoker for InProcessInvoker<P, S> {
    async fn invoke(&self, event: Bytes) -> Result<Vec<String>, String> {
        let event: SqsEvent =
            serde_json::from_slice(&event).map_err(|e| format!("event does not decode: {e}"))?;
        let deadline = Deadline::after(self.timeout, self.margin);
        let report = self
            .worker
            .run(event, deadline, None)
            .await
            .map_err(|e| e.to_string())?;
        Ok(report
            .response()
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect())
    }
}
