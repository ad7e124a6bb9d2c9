//! One record's run: its attempts under the retry policy and the deadline, the handler's
//! panics caught, a requeued message finished, and the outcome settled as a disposition:
//! done, skipped, returned for retry (and logged), or dead-lettered through the sink.

use super::*;
use tracing::Instrument;

impl<P: Processor, S: DeadLetterSink> BatchProcessor<P, S> {
    /// Hands candidates to the sink, bounded by the deadline's hard stop: writes still
    /// running there are abandoned and their records returned for retry (every write is
    /// idempotent, so the next delivery completes what was cut).
    pub(super) async fn dead_letter(
        &self,
        candidates: &[DeadLetterCandidate],
        invocation: &InvocationInfo,
        deadline: &Deadline,
    ) -> Vec<Result<(), ProcessError>> {
        // Boxed, as the processor's calls are (see `boxed`).
        let writes: futures::future::BoxFuture<'_, Vec<Result<(), ProcessError>>> =
            Box::pin(self.sink.dead_letter(candidates, invocation));
        let results = match tokio::time::timeout_at(
            crate::mutants::deadline_guard(deadline.hard_stop()),
            writes,
        )
        .await
        {
            Ok(results) => results,
            Err(_) => candidates
                .iter()
                .map(|_| {
                    Err(ProcessError::new(
                        ErrorClass::Timeout,
                        "dead-letter writes cut at the deadline's hard stop",
                    )
                    .with_step("dead-letter"))
                })
                .collect(),
        };
        results
    }

    /// Runs the processor's death hooks ([`Processor::on_dead_letter`]) for the candidates the
    /// sink made durable, once the batch's dead letters are written, so that no hook can
    /// take their time; beside the batch's hides (other records), so that no hide takes
    /// theirs. Concurrently, each in a record context of its own (its metrics go to the
    /// invocation's), bounded by the hard stop, its error or panic logged and nothing else
    /// (the records stay dead-lettered).
    pub(super) async fn after_dead_letter(
        &self,
        durable: &[DeadLetterCandidate],
        deadline: &Deadline,
    ) {
        if durable.is_empty() {
            return;
        }
        let shared = RecordShared::of(deadline, self.config.retry.clock);
        let hooks = durable.iter().map(|candidate| {
            shared.context().scope(async move {
                let dead = crate::processor::DeadLettered {
                    item: &candidate.item,
                    error: &candidate.error,
                    reason: candidate.reason,
                    attempts: candidate.failures.len(),
                };
                let hook: futures::future::BoxFuture<'_, Result<(), ProcessError>> =
                    Box::pin(self.processor.on_dead_letter(&dead));
                let hook = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(hook));
                let item = &candidate.item;
                match tokio::time::timeout_at(deadline.hard_stop(), hook).await {
                    Ok(Ok(Ok(()))) => {}
                    Ok(Ok(Err(error))) => tracing::warn!(
                        message_id = %item.message_id,
                        item_id = %item.item_id,
                        error_class = %error.class,
                        error_signature = %error_signature(error.class, &error.message),
                        error = %error.loggable(),
                        "the dead-letter hook failed; the record stays dead-lettered"
                    ),
                    // The panic's message may quote the record's data: not logged (§1.9).
                    Ok(Err(_panic)) => tracing::error!(
                        message_id = %item.message_id,
                        item_id = %item.item_id,
                        "the dead-letter hook panicked; the record stays dead-lettered"
                    ),
                    Err(_) => tracing::warn!(
                        message_id = %item.message_id,
                        item_id = %item.item_id,
                        "the dead-letter hook was cut at the invocation's hard stop; the record stays dead-lettered"
                    ),
                }
            })
        });
        futures::future::join_all(hooks).await;
    }

    /// [`BatchProcessor::run_record`] with the record's place in the batch.
    pub(super) async fn run_indexed(
        &self,
        index: usize,
        message_id: Text<'_>,
        msg: SqsRecord<'_>,
        deadline: &Deadline,
        shared: &RecordShared,
    ) -> (usize, Step) {
        (
            index,
            self.run_record(message_id, msg, deadline, shared).await,
        )
    }

    /// Runs one record, inside the span of the trace it carries when it carries one
    /// ([`crate::trace::TraceContext`]): every line it logs then names the trace.
    pub(super) async fn run_record(
        &self,
        message_id: Text<'_>,
        msg: SqsRecord<'_>,
        deadline: &Deadline,
        shared: &RecordShared,
    ) -> Step {
        let span = crate::trace::TraceContext::record_span(&msg);
        self.run_timed(message_id, msg, deadline, shared)
            .instrument(span)
            .await
    }

    /// Runs one record unless the cut-off has passed, and times it: one clock read at each
    /// end, nothing per attempt.
    async fn run_timed(
        &self,
        message_id: Text<'_>,
        msg: SqsRecord<'_>,
        deadline: &Deadline,
        shared: &RecordShared,
    ) -> Step {
        let started = tokio::time::Instant::now();
        if started >= deadline.cutoff() {
            return self.not_run(message_id, msg, NotStartedReason::Deadline, deadline);
        }
        // The record's context (deadline, custom metrics and log fields) for the handler.
        let (step, fields) = shared
            .context()
            .scope(self.process_record(message_id, msg, deadline))
            .await;
        let took = Some(started.elapsed());
        // Every record is logged: a failure where it is decided (with its class and
        // signature, `log_failure`); a record done or skipped here,
        // with the handler's fields when it added any, under its own target
        // (`RECORD_LINES_TARGET`), which a subscriber may turn off.
        if let Step::Final(report) = &step {
            if log_success(report, started.elapsed(), &fields) {
                return finish(step, took);
            }
        }
        if fields.is_empty() {
            return finish(step, took);
        }
        let step = match step {
            // The line that says it was dead-lettered, written once the sink has answered,
            // carries the fields.
            Step::DeadLetter {
                candidate,
                attempts,
                time,
                fields: _,
            } => Step::DeadLetter {
                candidate,
                attempts,
                time,
                fields: Some(serde_json::Value::Object(fields).to_string()),
            },
            Step::Final(report) => {
                tracing::info!(
                    message_id = %report.message_id,
                    item_id = %report.item_id,
                    outcome = outcome_name(&report.disposition),
                    handler_fields = %serde_json::Value::Object(fields),
                    "record processed"
                );
                Step::Final(report)
            }
        };
        finish(step, took)
    }

    /// Parses and processes one record, retrying within the invocation.
    async fn process_record(
        &self,
        message_id: Text<'_>,
        mut msg: SqsRecord<'_>,
        deadline: &Deadline,
    ) -> Step {
        // The digest of the body as received, when a pointer was followed: the record of a
        // requeued pointer holds that, not the payload fetched.
        let (pointer_sha, resolve_error) = match self.follow_pointer(&mut msg, deadline).await {
            Ok(sha) => (sha, None),
            Err(error) => (None, Some(error)),
        };
        let parsed = self
            .config
            .parser
            .parse_record(message_id.into_owned(), msg);
        if let Some(error) = resolve_error {
            // The payload could not be fetched: decided as for a failed attempt, without
            // running the processor on a pointer (nor judging the pointer as the payload).
            let item = parsed.unwrap_or_else(|invalid| invalid.item);
            return self.settle_unfetched(item, error, deadline);
        }
        let item = match parsed {
            Ok(item) => item,
            Err(invalid) => {
                let invalid = *invalid;
                let failure = immediate_failure(invalid.error.clone(), &self.config.retry.clock);
                return self.settle_failure(
                    invalid.item,
                    invalid.error,
                    StopReason::Permanent,
                    vec![failure],
                    0,
                    deadline,
                );
            }
        };
        if let Some(notice) = item.envelope.as_ref().and_then(|e| e.notice.clone()) {
            // A service notice, not an event: nothing to process, nothing to keep.
            tracing::warn!(message_id = %item.message_id, notice = %notice, "skipped a service notice");
            return Step::Final(RecordReport {
                message_id: item.message_id,
                item_id: item.item_id,
                attempts: 0,
                disposition: Disposition::Skipped { reason: notice },
                processing_time: None,
                retry_after: None,
            });
        }
        let run = run_with_retry(&self.config.retry, deadline, |_| {
            guard_panics(boxed(self.processor.process(&item)))
        })
        .await;
        let attempts =
            u32::try_from(run.failures.len()).unwrap_or(u32::MAX) + u32::from(run.result.is_ok());
        match run.result {
            Ok(outcome) => {
                self.settle_success(item, outcome, attempts, pointer_sha.as_deref(), deadline)
                    .await
            }
            Err((error, stop)) => {
                self.settle_failure(item, error, stop, run.failures, attempts, deadline)
            }
        }
    }

    /// Settles a record whose payload could not be fetched, as a failed attempt of
    /// `error`'s class: returned for retry when it is retryable, dead-lettered when not.
    fn settle_unfetched(&self, item: WorkItem, error: ProcessError, deadline: &Deadline) -> Step {
        let stop = if error.class.is_retryable(self.config.retry.retry_unknown) {
            StopReason::AttemptsExhausted
        } else {
            StopReason::Permanent
        };
        let failure = immediate_failure(error.clone(), &self.config.retry.clock);
        self.settle_failure(item, error, stop, vec![failure], 0, deadline)
    }

    /// Follows an Extended Client pointer in `msg`'s body, putting the payload in its
    /// place: the digest of the pointer as received, when one was followed. Fetching the
    /// payload is bounded by the cut-off.
    async fn follow_pointer(
        &self,
        msg: &mut SqsRecord<'_>,
        deadline: &Deadline,
    ) -> Result<Option<String>, ProcessError> {
        let (Some(resolver), Some(body)) = (&self.resolver, msg.body.as_ref()) else {
            return Ok(None);
        };
        match tokio::time::timeout_at(deadline.cutoff(), resolver.resolve(body.as_str())).await {
            Ok(Some(Ok(payload))) => {
                let sha = crate::hex::sha256_hex(body.as_str().as_bytes());
                msg.body = Some(Text::from(payload));
                Ok(Some(sha))
            }
            Ok(Some(Err(error))) => Err(error),
            Ok(None) => Ok(None),
            Err(_) => Err(ProcessError::new(
                ErrorClass::Timeout,
                "fetching the payload was cut at the invocation's cut-off",
            )
            .with_step("fetch-payload")),
        }
    }

    /// Returns the report of a record its processor finished, once a requeued item's record is
    /// resolved.
    async fn settle_success(
        &self,
        item: WorkItem,
        outcome: Outcome,
        attempts: u32,
        pointer_sha: Option<&str>,
        deadline: &Deadline,
    ) -> Step {
        let mut disposition = match outcome {
            Outcome::Done => Disposition::Done,
            Outcome::Skipped { reason } | Outcome::AlreadyDone { reason } => {
                Disposition::Skipped { reason }
            }
        };
        if let Err(error) = self.finish_requeued(&item, pointer_sha, deadline).await {
            // Processed, but its record still says requeued: returned for retry so the
            // record ends true (the downstream's idempotency key covers the repeat).
            tracing::warn!(message_id = %item.message_id, item_id = %item.item_id, error = %error,
                "requeued item processed but its record could not be resolved; returned for retry");
            disposition = Disposition::RetryLater { class: error.class };
        }
        Step::Final(RecordReport {
            message_id: item.message_id,
            item_id: item.item_id,
            attempts,
            disposition,
            processing_time: None,
            retry_after: None,
        })
    }

    /// After a message a redrive requeued is processed, its record is resolved; so is the
    /// record of a DLQ message moved back to the source queue from outside (the console's
    /// "Start DLQ redrive", `StartMessageMoveTask`): it carries the DLQ message's attributes
    /// (item id, source message id) and no requeue stamp.
    async fn finish_requeued(
        &self,
        item: &WorkItem,
        pointer_sha: Option<&str>,
        deadline: &Deadline,
    ) -> Result<(), ProcessError> {
        if item.message_attributes.is_empty() {
            return Ok(());
        }
        let attribute = |name: &str| {
            item.message_attributes
                .get(name)
                .and_then(|a| a.string_value.as_deref())
        };
        let Some(record_id) = attribute(crate::message::ITEM_ID_ATTRIBUTE) else {
            return Ok(());
        };
        // The key the record is stored under (an id past DynamoDB's key limit is stored
        // by its digest).
        let record_id = crate::item::bounded_item_id(record_id.to_string());
        // The digests of what this message carried, never a digest it merely states (a
        // producer's attribute could name another item's): the payload processed and, for
        // a pointer followed, the pointer itself, which the record of a requeued pointer
        // holds (found by the simulation, seed 788). Each write is conditional on the
        // record holding the digest; at most one applies.
        let mut digests = vec![crate::hex::sha256_hex(item.body.as_bytes())];
        digests.extend(pointer_sha.map(str::to_string));
        let (requeued_by, dead_lettered) = match (
            attribute(crate::dead_letter::REQUEUED_BY_ATTRIBUTE),
            attribute(crate::message::SOURCE_MESSAGE_ID_ATTRIBUTE),
        ) {
            (None, None) => return Ok(()),
            found => found,
        };
        let finish = Box::pin(self.finish_by_digests(
            record_id.as_str(),
            &item.message_id,
            &digests,
            requeued_by,
            dead_lettered,
        ));
        tokio::time::timeout_at(deadline.hard_stop(), finish)
            .await
            .unwrap_or_else(|_| {
                Err(ProcessError::new(
                    ErrorClass::Timeout,
                    "resolving the requeued record was cut at the deadline",
                )
                .with_step("finish-requeued"))
            })
    }

    /// Resolves the record `record_id` of a message that came back to the source queue,
    /// once per digest of what it carried (each write is conditional on the record holding
    /// the digest; at most one applies). A requeued message's record waits for it, or (the
    /// message came back to the DLQ, reopening the record, and was moved back by the
    /// console) is dead holding its payload. A message moved back from outside names the
    /// source message it dead-lettered (`dead_lettered`).
    async fn finish_by_digests(
        &self,
        record_id: &str,
        message_id: &str,
        digests: &[String],
        requeued_by: Option<&str>,
        dead_lettered: Option<&str>,
    ) -> Result<(), ProcessError> {
        for sha in digests {
            if let Some(requeued_by) = requeued_by {
                self.sink
                    .finish_requeued(record_id, message_id, sha, requeued_by)
                    .await?;
                self.sink
                    .finish_moved_back(record_id, message_id, message_id, sha)
                    .await?;
            } else if let Some(dead_lettered) = dead_lettered {
                self.sink
                    .finish_moved_back(record_id, dead_lettered, message_id, sha)
                    .await?;
            }
        }
        Ok(())
    }

    /// Returns a record the batch will not run (past the cut-off, or held back behind a FIFO
    /// failure): reported as not started (and hidden like any record returned), except on
    /// its last receive, where the queue's redrive policy would move it without a record:
    /// then it is dead-lettered, class `timeout` (transient, so a redrive brings it back),
    /// code [`NOT_STARTED`], with why (docs/ARCHITECTURE.md §1.6).
    pub(super) fn not_run(
        &self,
        message_id: Text<'_>,
        msg: SqsRecord<'_>,
        reason: NotStartedReason,
        deadline: &Deadline,
    ) -> Step {
        let receive_count = msg
            .attribute("ApproximateReceiveCount")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let retention_ending = self.retention_ending(
            msg.event_source_arn(),
            sent_time(msg.attribute("SentTimestamp")),
            deadline,
        );
        let budget_spent = self.receive_budget_spent(receive_count)
            && !crate::mutants::is_on(crate::mutants::Mutant::UnstartedLeftToRedrivePolicy);
        if !budget_spent && !retention_ending {
            return Step::Final(not_started(message_id, &msg, reason, &self.config.parser));
        }
        let item = self
            .config
            .parser
            .parse_record(message_id.into_owned(), msg)
            .unwrap_or_else(|invalid| invalid.item);
        let held = not_started_text(reason);
        let (when, dead_letter_reason) = if budget_spent {
            (
                "on its last receive",
                DeadLetterReason::ReceiveBudgetExhausted,
            )
        } else {
            (
                "too close to the end of its retention for another delivery",
                DeadLetterReason::RetentionEnding,
            )
        };
        let why = format!("{held} {when}");
        let error = ProcessError::new(ErrorClass::Timeout, why)
            .with_code(NOT_STARTED)
            .with_step("not-started");
        Step::DeadLetter {
            candidate: Box::new(DeadLetterCandidate {
                item,
                // The history says what became of this delivery, as for any other.
                failures: vec![immediate_failure(error.clone(), &self.config.retry.clock)],
                error,
                reason: dead_letter_reason,
            }),
            attempts: 0,
            time: None,
            fields: None,
        }
    }

    /// Decides between dead-lettering a failed record and returning it for retry.
    fn settle_failure(
        &self,
        item: WorkItem,
        error: ProcessError,
        stop: StopReason,
        failures: Vec<AttemptFailure>,
        attempts: u32,
        deadline: &Deadline,
    ) -> Step {
        let reason = if stop == StopReason::Permanent {
            Some(DeadLetterReason::Permanent)
        } else if self.receive_budget_spent(item.receive_count) {
            Some(DeadLetterReason::ReceiveBudgetExhausted)
        } else if self.retention_ending(
            item.event_source_arn.as_deref(),
            item.sent_timestamp.map(std::time::SystemTime::from),
            deadline,
        ) {
            Some(DeadLetterReason::RetentionEnding)
        } else {
            None
        };
        match reason {
            Some(reason) => Step::DeadLetter {
                candidate: Box::new(DeadLetterCandidate {
                    item,
                    error,
                    failures,
                    reason,
                }),
                attempts,
                time: None,
                fields: None,
            },
            None => {
                log_failure(&item, &error, "returned for retry");
                Step::Final(RecordReport {
                    message_id: item.message_id,
                    item_id: item.item_id,
                    attempts,
                    disposition: Disposition::RetryLater { class: error.class },
                    processing_time: None,
                    // What the callee asked for (a `Retry-After`, the rest of the breaker's
                    // open period) spaces the next delivery at least as far.
                    retry_after: error.retry_after,
                })
            }
        }
    }
}

/// Returns a processor's future behind a pointer: one allocation per attempt, so that the engine's
/// own future does not nest the handler's (an AWS SDK call nests deeply) and a handler
/// crate compiles without raising its `recursion_limit`.
fn boxed<'a, T>(
    call: impl Future<Output = Result<T, ProcessError>> + Send + 'a,
) -> futures::future::BoxFuture<'a, Result<T, ProcessError>> {
    Box::pin(call)
}

/// Runs one processor call so that a panic in it fails this record, not the process: the
/// panic becomes an error of class `unknown` (not retried unless configured, so the record
/// is dead-lettered with the panic's message) instead of unwinding through the batch.
pub async fn guard_panics<T>(
    call: impl Future<Output = Result<T, ProcessError>>,
) -> Result<T, ProcessError> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(ProcessError::new(
            ErrorClass::Unknown,
            format!("the processor panicked: {}", panic_message(&*panic)),
        )
        .with_step("panic")),
    }
}

/// Returns the text of a panic's payload (`panic!` with a message gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Returns the step with the record's processing time.
fn finish(step: Step, took: Option<Duration>) -> Step {
    match step {
        Step::Final(report) => Step::Final(RecordReport {
            processing_time: took,
            ..report
        }),
        Step::DeadLetter {
            candidate,
            attempts,
            time: _,
            fields,
        } => Step::DeadLetter {
            candidate,
            attempts,
            time: took,
            fields,
        },
    }
}

/// Logs a record that was done or skipped (its reason with what it quotes dropped and its
/// numbers masked, as an error's message is: docs/ARCHITECTURE.md §1.9), with the
/// handler's fields; whether it was one of those.
fn log_success(
    report: &RecordReport,
    took: Duration,
    fields: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    let took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
    let handler_fields = (!fields.is_empty()).then(|| serde_json::Value::Object(fields.clone()));
    let handler_fields = handler_fields.as_ref().map(tracing::field::display);
    match &report.disposition {
        Disposition::Done => tracing::info!(
            target: super::RECORD_LINES_TARGET,
            message_id = %report.message_id,
            item_id = %report.item_id,
            attempts = report.attempts,
            took_ms,
            handler_fields,
            "record done"
        ),
        Disposition::Skipped { reason } => tracing::info!(
            target: super::RECORD_LINES_TARGET,
            message_id = %report.message_id,
            item_id = %report.item_id,
            attempts = report.attempts,
            took_ms,
            reason = %crate::signature::loggable_message(reason),
            handler_fields,
            "record skipped"
        ),
        _ => return false,
    }
    true
}

/// Logs the records a batch did not start (and did not dead-letter): returned for retry,
/// with why (a record run or dead-lettered is logged where that was decided).
pub(super) fn log_not_started(reports: &[RecordReport]) {
    for report in reports {
        if let Disposition::NotStarted { reason } = &report.disposition {
            tracing::warn!(
                message_id = %report.message_id,
                item_id = %report.item_id,
                reason = %not_started_text(*reason),
                "record not started: returned for retry"
            );
        }
    }
}

/// Why a record was not started, in words.
fn not_started_text(reason: NotStartedReason) -> &'static str {
    match reason {
        NotStartedReason::Deadline => "not started before the invocation's cut-off",
        NotStartedReason::FifoShortCircuit => {
            "held back behind an earlier failure of its FIFO batch"
        }
        NotStartedReason::FifoGroupFailed => {
            "held back behind an earlier failure of its message group"
        }
    }
}

/// Returns the name of a disposition on log lines.
fn outcome_name(disposition: &Disposition) -> &'static str {
    match disposition {
        Disposition::Done => "done",
        Disposition::Skipped { .. } => "skipped",
        Disposition::RetryLater { .. } => "retry_later",
        Disposition::DeadLettered { .. } => "dead_lettered",
        Disposition::DeadLetterFailed { .. } => "dead_letter_failed",
        Disposition::NotStarted { .. } => "not_started",
    }
}

/// Returns a failure found before the processor ran (bad body, unfetchable payload), at `clock`'s now.
fn immediate_failure(error: ProcessError, clock: &Clock) -> AttemptFailure {
    AttemptFailure {
        attempt: 1,
        started_at: clock.now(),
        duration: std::time::Duration::ZERO,
        error,
    }
}

pub(super) fn not_started(
    message_id: Text<'_>,
    msg: &SqsRecord<'_>,
    reason: NotStartedReason,
    parser: &ItemParser,
) -> RecordReport {
    // The item id is only for reports here; a cheap attribute lookup, no body parsing.
    let item_id = match &parser.id_source {
        crate::item::ItemIdSource::MessageAttribute(name) => msg
            .message_attributes
            .get(name)
            .and_then(|a| a.string_value.clone()),
        _ => None,
    }
    .unwrap_or_else(|| message_id.as_str().to_string());
    RecordReport {
        message_id: message_id.into_owned(),
        item_id,
        attempts: 0,
        disposition: Disposition::NotStarted { reason },
        processing_time: None,
        retry_after: None,
    }
}

/// Returns a record that was not started, keyed by its message id.
pub(super) fn not_started_report(message_id: String, reason: NotStartedReason) -> RecordReport {
    RecordReport {
        item_id: message_id.clone(),
        message_id,
        attempts: 0,
        disposition: Disposition::NotStarted { reason },
        processing_time: None,
        retry_after: None,
    }
}

/// Returns the report of a record the sink was asked to dead-letter, after `(attempts, processing
/// time)`, logged with its handler's `fields` (JSON) when it added any.
pub(super) fn dead_letter_report(
    candidate: &DeadLetterCandidate,
    (attempts, processing_time): (u32, Option<Duration>),
    result: Option<&Result<(), ProcessError>>,
    fields: Option<&str>,
) -> RecordReport {
    let item = &candidate.item;
    let class = candidate.error.class;
    let disposition = match result {
        Some(Ok(())) => {
            log_failure_with(item, &candidate.error, "dead-lettered", fields);
            Disposition::DeadLettered {
                class,
                reason: candidate.reason,
            }
        }
        Some(Err(sink_error)) if crate::dead_letter::is_dead_lettering_elsewhere(sink_error) => {
            tracing::info!(
                message_id = %item.message_id,
                item_id = %item.item_id,
                "another delivery of this message is dead-lettering it; returned for retry"
            );
            Disposition::RetryLater { class }
        }
        Some(Err(sink_error)) => {
            tracing::error!(
                message_id = %item.message_id,
                item_id = %item.item_id,
                error_class = %class,
                sink_error = %sink_error,
                "dead-lettering failed; record returned to the queue"
            );
            Disposition::DeadLetterFailed {
                class,
                sink_error: sink_error.to_string(),
            }
        }
        None => {
            tracing::error!(
                message_id = %item.message_id,
                "dead-letter store returned no result for the record; returned to the queue"
            );
            Disposition::DeadLetterFailed {
                class,
                sink_error: "dead-letter store returned no result".to_string(),
            }
        }
    };
    RecordReport {
        message_id: item.message_id.clone(),
        item_id: item.item_id.clone(),
        attempts,
        disposition,
        processing_time,
        retry_after: candidate.error.retry_after,
    }
}

/// Logs a failed record with ids, class and signature; never the body (docs/ARCHITECTURE.md §1.9).
pub(super) fn log_failure(item: &WorkItem, error: &ProcessError, outcome: &str) {
    log_failure_with(
        item,
        error,
        outcome,
        crate::context::fields_json().as_deref(),
    );
}

/// [`log_failure`] with the handler's fields given (JSON), for a line written after the
/// record's context has ended.
fn log_failure_with(item: &WorkItem, error: &ProcessError, outcome: &str, fields: Option<&str>) {
    if crate::mutants::is_on(crate::mutants::Mutant::ErrorsLoggedWhole) {
        tracing::warn!(item_id = %item.item_id, error = %error, "record failed: {outcome}");
        return;
    }
    match fields {
        None => tracing::warn!(
            message_id = %item.message_id,
            item_id = %item.item_id,
            receive_count = item.receive_count,
            body_bytes = item.body.len(),
            error_class = %error.class,
            error_signature = %error_signature(error.class, &error.message),
            error = %error.loggable(),
            "record failed: {outcome}"
        ),
        Some(fields) => tracing::warn!(
            message_id = %item.message_id,
            item_id = %item.item_id,
            receive_count = item.receive_count,
            body_bytes = item.body.len(),
            error_class = %error.class,
            error_signature = %error_signature(error.class, &error.message),
            error = %error.loggable(),
            handler_fields = %fields,
            "record failed: {outcome}"
        ),
    }
}
