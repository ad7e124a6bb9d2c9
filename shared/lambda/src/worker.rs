//! The Lambda glue of the worker function: a [`Worker`] holds the batch engine built once
//! at start-up, and [`Worker::handle`] answers one invocation.
//!
//! At start-up the worker reads its configuration, builds the HTTP client and (when a
//! dead-letter store is configured) the AWS clients. Credentials are resolved and
//! connections opened lazily by the first call, then reused by every later invocation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::LambdaEvent;
use serde_json::value::RawValue;

use crate::config::ConfigError;
use sqs_keeper_aws::DeadLetterStore;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::Processor;
use sqs_keeper_core::{batch::BatchError, BatchProcessor, BatchReport};
use sqs_keeper_core::{
    dead_letter::DeadLetterCandidate, dead_letter::DeadLetterSink, dead_letter::InvocationInfo,
    dead_letter::NoDeadLetterStore,
};
use sqs_keeper_core::{event::decode_event, event::EventError, event::SqsBatch, event::SqsRecord};
use sqs_keeper_core::{retry::worst_case_record_time, retry::Deadline, retry::InvocationBudget};

/// Why the worker could not start. Its `Debug` is its message: `main` returning it prints
/// `Error: <message>`, once and readable.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    /// The environment is incomplete or wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The HTTP client could not be built.
    #[error("cannot build the downstream HTTP client: {0}")]
    HttpClient(ProcessError),
    /// The downstream credential could not be read.
    #[cfg(feature = "http")]
    #[error(transparent)]
    Secret(#[from] sqs_keeper_aws::SecretError),
    /// The handler's own set-up failed ([`crate::init_failed`]).
    #[error("{0}")]
    Handler(String),
    /// The binary was started outside Lambda: no Runtime API to take invocations from.
    #[error("not under Lambda (AWS_LAMBDA_RUNTIME_API is not set): this binary serves a Lambda function's invocations. Run it locally with `keeper run` (docs/HANDLERS.md) or `cargo lambda watch`")]
    NotUnderLambda,
    /// `DLQ_CHECK_AT_START` found the dead-letter store's table, DLQ or bucket missing or
    /// out of reach.
    #[error("{0}")]
    StoreUnreachable(String),
}

impl std::fmt::Debug for StartupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl StartupError {
    /// Returns the error type Lambda shows for it.
    pub fn error_type(&self) -> &'static str {
        match self {
            StartupError::Config(_) => "Runtime.ConfigError",
            StartupError::HttpClient(_) => "Runtime.HttpClientError",
            #[cfg(feature = "http")]
            StartupError::Secret(_) => "Runtime.SecretError",
            StartupError::Handler(_) => "Runtime.HandlerInitError",
            StartupError::NotUnderLambda => "Runtime.NotUnderLambda",
            StartupError::StoreUnreachable(_) => "Runtime.StoreUnreachable",
        }
    }

    /// Tells Lambda (`/runtime/init/error`, [`crate::init_error::report`]).
    pub async fn report(&self) {
        crate::init_error::report(self.error_type(), &self.to_string()).await;
    }
}

/// The dead-letter sink chosen by configuration.
// Exhaustive on purpose: each variant is a sink the configuration can name, and the
// worker must handle one it adds.
#[derive(Debug)]
pub enum ConfiguredSink {
    /// DynamoDB + S3 + DLQ.
    Store(Box<DeadLetterStore>),
    /// No store configured: candidates are returned to the queue.
    Disabled(NoDeadLetterStore),
}

impl DeadLetterSink for ConfiguredSink {
    async fn dead_letter(
        &self,
        candidates: &[DeadLetterCandidate],
        invocation: &InvocationInfo,
    ) -> Vec<Result<(), ProcessError>> {
        match self {
            ConfiguredSink::Store(store) => store.dead_letter(candidates, invocation).await,
            ConfiguredSink::Disabled(none) => none.dead_letter(candidates, invocation).await,
        }
    }

    async fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
        requeued_by: &str,
    ) -> Result<(), ProcessError> {
        match self {
            ConfiguredSink::Store(store) => {
                DeadLetterSink::finish_requeued(
                    &**store,
                    item_id,
                    message_id,
                    payload_sha256,
                    requeued_by,
                )
                .await
            }
            ConfiguredSink::Disabled(_) => Ok(()),
        }
    }

    async fn finish_moved_back(
        &self,
        item_id: &str,
        dead_lettered: &str,
        message_id: &str,
        payload_sha256: &str,
    ) -> Result<(), ProcessError> {
        match self {
            ConfiguredSink::Store(store) => {
                DeadLetterSink::finish_moved_back(
                    &**store,
                    item_id,
                    dead_lettered,
                    message_id,
                    payload_sha256,
                )
                .await
            }
            ConfiguredSink::Disabled(_) => Ok(()),
        }
    }
}

/// A worker: the batch engine and the invocation-independent context.
#[derive(Debug)]
pub struct Worker<P, S> {
    engine: BatchProcessor<P, S>,
    deadline_margin: Duration,
    base_invocation: InvocationInfo,
    emit_metrics: bool,
    /// The longest one attempt may take (the processor's own timeout), when known: checked
    /// once against the first invocation's time.
    attempt_timeout: Option<Duration>,
    /// Warnings given once per process.
    warned_deadline: AtomicBool,
    warned_fit: AtomicBool,
}

impl<P: Processor, S: DeadLetterSink> Worker<P, S> {
    /// Creates a worker around an engine; function name and log location come from the Lambda
    /// environment variables when present.
    pub fn new(engine: BatchProcessor<P, S>, deadline_margin: Duration) -> Self {
        Worker {
            engine,
            deadline_margin,
            emit_metrics: true,
            attempt_timeout: None,
            warned_deadline: AtomicBool::new(false),
            warned_fit: AtomicBool::new(false),
            base_invocation: InvocationInfo {
                function_name: std::env::var("AWS_LAMBDA_FUNCTION_NAME").ok(),
                request_id: None,
                log_group: std::env::var("AWS_LAMBDA_LOG_GROUP_NAME").ok(),
                log_stream: std::env::var("AWS_LAMBDA_LOG_STREAM_NAME").ok(),
            },
        }
    }

    /// Stops writing the per-invocation EMF lines to stdout: for embedding the worker where
    /// stdout is not a CloudWatch Logs stream (benchmarks, other hosts).
    pub fn without_metrics(mut self) -> Self {
        self.emit_metrics = false;
        self
    }

    /// Declares the longest one attempt can take (the processor's request timeout), so the
    /// first invocation can warn when a record's attempts and backoffs cannot fit the
    /// function's timeout (they are then cut at the cut-off).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// Returns the deadline of one invocation, with one warning per process when the Runtime API's
    /// deadline is not credible or when a record's worst case does not fit the time.
    fn invocation_deadline(&self, at: std::time::SystemTime) -> Deadline {
        let budget = InvocationBudget::of(at, std::time::SystemTime::now());
        let once = |flag: &AtomicBool| !flag.swap(true, Ordering::Relaxed);
        match budget {
            InvocationBudget::AlreadyPast if once(&self.warned_deadline) => {
                let ms = at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                tracing::warn!(
                    deadline_ms = %ms,
                    fallback_secs = budget.time().as_secs(),
                    "the invocation's deadline had already passed when it arrived (Lambda-Runtime-Deadline-Ms {ms}; \
                     `cargo lambda watch` sends a constant 600000): not a real Lambda deadline, so this and later \
                     such invocations get a fallback budget of {} s",
                    budget.time().as_secs()
                );
            }
            InvocationBudget::TooFar if once(&self.warned_deadline) => {
                tracing::warn!(
                    "the invocation's deadline is further away than Lambda's longest timeout (15 minutes); capped there"
                );
            }
            _ => {}
        }
        if let Some(timeout) = self.attempt_timeout {
            let worst = worst_case_record_time(&self.engine.config().retry, timeout);
            let usable = budget.time().saturating_sub(self.deadline_margin);
            if worst > usable && once(&self.warned_fit) {
                tracing::warn!(
                    worst_case_ms = u64::try_from(worst.as_millis()).unwrap_or(u64::MAX),
                    usable_ms = u64::try_from(usable.as_millis()).unwrap_or(u64::MAX),
                    "a record's attempts can take {:.1} s ({} attempts of up to {:.1} s plus backoff) but an invocation \
                     has {:.1} s before its cut-off: attempts still running there are cut and the record retried later. \
                     Lower WORKER_RETRY_MAX_ATTEMPTS or WORKER_DOWNSTREAM_TIMEOUT_MS, or raise the function timeout",
                    worst.as_secs_f64(),
                    self.engine.config().retry.max_attempts,
                    timeout.as_secs_f64(),
                    usable.as_secs_f64(),
                );
            }
        }
        Deadline::after(budget.time(), self.deadline_margin)
    }

    /// Returns the engine, for callers that drive batches themselves.
    pub fn engine(&self) -> &BatchProcessor<P, S> {
        &self.engine
    }

    /// Runs one batch with an explicit deadline and request id, returning the full report.
    pub async fn run(
        &self,
        event: SqsEvent,
        deadline: Deadline,
        request_id: Option<String>,
    ) -> Result<BatchReport, BatchError> {
        self.run_since(
            SqsBatch::from(event).records,
            deadline,
            request_id,
            tokio::time::Instant::now(),
        )
        .await
    }

    /// [`Worker::run`] for an invocation that arrived at `arrived` (its batch duration is
    /// counted from there, decoding included).
    async fn run_since(
        &self,
        records: Vec<SqsRecord<'_>>,
        deadline: Deadline,
        request_id: Option<String>,
        arrived: tokio::time::Instant,
    ) -> Result<BatchReport, BatchError> {
        let invocation = InvocationInfo {
            request_id,
            ..self.base_invocation.clone()
        };
        let custom_metrics = Arc::new(sqs_keeper_core::context::MetricSink::default());
        let report = sqs_keeper_core::context::with_invocation_metrics(
            custom_metrics.clone(),
            self.engine.process_records(records, deadline, &invocation),
        )
        .await?;
        let batch_duration = arrived.elapsed();
        let counts = report.counts();
        // The request id and cold start come from the invocation's span
        // (`telemetry::InvocationLayer`).
        tracing::info!(
            duration_ms = u64::try_from(batch_duration.as_millis()).unwrap_or(u64::MAX),
            records = counts.records,
            done = counts.done,
            skipped = counts.skipped,
            retry_later = counts.retry_later,
            dead_lettered = counts.dead_lettered,
            dead_letter_failed = counts.dead_letter_failed,
            not_started = counts.not_started,
            reported = counts.reported(),
            "batch finished"
        );
        if self.emit_metrics {
            let timings = crate::metrics::InvocationTimings {
                cold_start: crate::telemetry::cold_start(),
                batch_duration,
                record_times: report.record_times(),
                custom: custom_metrics.take(),
                request_id: invocation.request_id.clone(),
            };
            crate::metrics::emit(
                &counts,
                &timings,
                invocation.function_name.as_deref().unwrap_or("worker"),
            );
        }
        Ok(report)
    }

    /// Answers one invocation from its raw body: the batch response, or an error for the
    /// whole invocation when the body is not an SQS event or a record cannot be reported
    /// individually.
    ///
    /// The body is decoded with [`decode_event`] (a SIMD parser) straight from the bytes
    /// the runtime received, into records that borrow from them; see [`crate::runtime::WorkerLayer`]
    /// for how the function binary gets them before the runtime's own `serde_json` decode
    /// would.
    pub async fn handle_invocation<B: AsRef<[u8]>>(
        &self,
        body: B,
        context: &lambda_runtime::Context,
    ) -> Result<SqsBatchResponse, InvocationError> {
        let arrived = tokio::time::Instant::now();
        let deadline = self.invocation_deadline(context.deadline());
        let result = match decode_event(body.as_ref()) {
            // Boxed (once per invocation): the batch's future nests deeply, and a handler
            // crate's `main` should not need a raised `recursion_limit` to lay it out.
            Ok(batch) => {
                let run: futures::future::BoxFuture<'_, _> = Box::pin(self.run_since(
                    batch.records,
                    deadline,
                    Some(context.request_id.clone()),
                    arrived,
                ));
                run.await
            }
            .map(|report| report.response())
            .map_err(InvocationError::from),
            Err(error) => Err(InvocationError::from(error)),
        };
        result.inspect_err(|e| tracing::error!(error = %e, "failing the whole invocation"))
    }

    /// Runs [`Worker::handle_invocation`] on an event the runtime has already checked as JSON.
    pub async fn handle(
        &self,
        event: LambdaEvent<Box<RawValue>>,
    ) -> Result<SqsBatchResponse, InvocationError> {
        self.handle_invocation(event.payload.get().as_bytes(), &event.context)
            .await
    }
}

/// Why a whole invocation fails (SQS then redelivers every record of the batch).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InvocationError {
    /// The body is not an SQS event.
    #[error(transparent)]
    NotAnSqsEvent(#[from] EventError),
    /// A record cannot be reported on its own.
    #[error(transparent)]
    Batch(#[from] BatchError),
}

impl From<InvocationError> for lambda_runtime::Diagnostic {
    fn from(error: InvocationError) -> Self {
        let error_type = match &error {
            InvocationError::NotAnSqsEvent(_) => "NotAnSqsEvent",
            InvocationError::Batch(BatchError::MissingMessageId { .. }) => "MissingMessageId",
            InvocationError::Batch(_) => "BatchError",
        };
        lambda_runtime::Diagnostic {
            error_type: error_type.to_string(),
            error_message: error.to_string(),
        }
    }
}
