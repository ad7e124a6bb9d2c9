//! The Lambda glue of the redrive function: builds the engine once from the environment
//! and answers each invocation (a [`RedriveRequest`] as JSON) with a [`RedriveReport`].
//! The run's time budget is capped by the invocation's deadline, so a large redrive stops
//! cleanly with a continuation token instead of being killed at the Lambda timeout. Each
//! run that changed something prints its counts as an EMF line ([`crate::metrics`]).

use std::time::Duration;

use lambda_runtime::{Diagnostic, LambdaEvent};

use crate::config::vars::{DOWNSTREAM_URL, TABLE};
use crate::config::{read_store_config, ConfigError, ConfigProblem, EnvReader, RedriveConfig};
use sqs_keeper_aws::AwsClients;
use sqs_keeper_aws::DeadLetterStore;
use sqs_keeper_aws::DynamoBreakerStore;
use sqs_keeper_aws::DynamoIdempotencyStore;
use sqs_keeper_core::breaker::GroupBreakers;
/// The gate a run goes through, in the core so that the simulation draws it.
pub use sqs_keeper_core::redrive::run_gated;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::WorkItem;
use sqs_keeper_core::{idempotency::Idempotency, idempotency::Idempotent};
use sqs_keeper_core::{
    redrive::no_progress, redrive::RedriveEngine, redrive::RedriveError, redrive::RedriveReport,
    redrive::RedriveRequest,
};
use sqs_keeper_core::{Outcome, Processor};
use sqs_keeper_http::HttpDelivery;

/// The worker's processor as a redrive runs it: behind the worker's idempotency table when
/// it has one (`WORKER_IDEMPOTENCY_TABLE`, the same key prefix), so that an item the worker
/// completed is found completed and skipped, not delivered again (docs/ARCHITECTURE.md §6).
// Exhaustive on purpose: the three ways the configuration composes the redrive's delivery.
#[derive(Debug)]
pub enum RedriveProcessor {
    /// Every redrive delivers.
    Plain(HttpDelivery),
    /// Once per item id, shared with the worker.
    Idempotent(Idempotent<HttpDelivery, DynamoIdempotencyStore>),
    /// Each item of a message group behind its group's breaker
    /// (`WORKER_BREAKER_SCOPE=message-group`): a tenant whose own breaker is open is not
    /// reprocessed. An item without a group goes straight through: the run's gate holds the
    /// function's breaker ([`run_gated`]).
    Grouped(Box<GroupBreakers<RedriveDelivery, DynamoBreakerStore, crate::runner::GroupStores>>),
}

/// What a grouped [`RedriveProcessor`] delivers through: one of the two others.
// Exhaustive on purpose, as `RedriveProcessor`.
#[derive(Debug)]
pub enum RedriveDelivery {
    /// Every redrive delivers.
    Plain(HttpDelivery),
    /// Once per item id, shared with the worker.
    Idempotent(Idempotent<HttpDelivery, DynamoIdempotencyStore>),
}

impl Processor for RedriveDelivery {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        match self {
            RedriveDelivery::Plain(p) => p.process(item).await,
            RedriveDelivery::Idempotent(p) => p.process(item).await,
        }
    }

    fn attempt_timeout(&self) -> Option<Duration> {
        match self {
            RedriveDelivery::Plain(p) => p.attempt_timeout(),
            RedriveDelivery::Idempotent(p) => p.inner().attempt_timeout(),
        }
    }
}

impl Processor for RedriveProcessor {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        match self {
            RedriveProcessor::Plain(p) => p.process(item).await,
            RedriveProcessor::Idempotent(p) => p.process(item).await,
            // Boxed: the breaker's future is large, and would grow every redrive's future
            // (a test thread's stack overflowed in a debug build).
            RedriveProcessor::Grouped(g) if item.message_group_id.is_some() => {
                Box::pin(g.process(item)).await
            }
            RedriveProcessor::Grouped(g) => Box::pin(g.inner().process(item)).await,
        }
    }

    fn attempt_timeout(&self) -> Option<Duration> {
        match self {
            RedriveProcessor::Plain(p) => p.attempt_timeout(),
            RedriveProcessor::Idempotent(p) => p.inner().attempt_timeout(),
            RedriveProcessor::Grouped(g) => g.inner().attempt_timeout(),
        }
    }
}

/// Returns the processor a redrive reprocesses with: the worker's, with its downstream credential
/// read from Secrets Manager, behind its idempotency table when it has one; `None` when no
/// downstream is configured (requeue only). The redrive function and `dlq redrive` both
/// build it here.
pub async fn redrive_processor(
    config: &RedriveConfig,
    clients: &AwsClients,
) -> Result<Option<RedriveProcessor>, ConfigError> {
    let Some(mut worker) = config.processor.clone() else {
        return Ok(None);
    };
    let problem = |variable: &str, problem: String| ConfigError {
        problems: vec![ConfigProblem {
            variable: variable.to_string(),
            problem,
        }],
    };
    worker
        .resolve_downstream_auth(clients)
        .await
        .map_err(|e| problem(e.variable, e.to_string()))?;
    let delivery = HttpDelivery::new(worker.delivery.clone()).map_err(|e| {
        problem(
            DOWNSTREAM_URL.name,
            format!("cannot build the HTTP client: {e}"),
        )
    })?;
    let delivery = worker.renewing_credential(delivery, clients);
    let processor = match &worker.handler.idempotency {
        Some(table) => RedriveDelivery::Idempotent(Idempotent::new(
            delivery,
            Idempotency::new(
                DynamoIdempotencyStore::new(clients.dynamodb.clone(), table.table.clone()),
                table.ttl,
            )
            .with_key_prefix(&table.key_prefix),
        )),
        None => RedriveDelivery::Plain(delivery),
    };
    Ok(Some(match &worker.handler.breaker {
        Some(breaker) if breaker.per_group => {
            let (client, table, key) = (
                clients.dynamodb.clone(),
                breaker.table.clone(),
                breaker.key.clone(),
            );
            let stores: crate::runner::GroupStores = Box::new(move |group| {
                let key = match group {
                    Some(group) => sqs_keeper_core::breaker::group_key(&key, group),
                    None => key.clone(),
                };
                DynamoBreakerStore::new(client.clone(), table.clone(), &key)
            });
            RedriveProcessor::Grouped(Box::new(GroupBreakers::new(
                processor,
                stores,
                breaker.policy,
            )))
        }
        _ => match processor {
            RedriveDelivery::Plain(p) => RedriveProcessor::Plain(p),
            RedriveDelivery::Idempotent(p) => RedriveProcessor::Idempotent(p),
        },
    }))
}

/// Returns the redrive engine over `store_config`'s store, as the redrive function and `dlq
/// redrive` both run it. A record that kept an Extended-Client pointer (the worker could
/// not fetch its payload then) is reprocessed with the payload, fetched as the worker
/// would: the buckets it allows (`WORKER_PAYLOAD_BUCKETS`, its store's included) and its
/// size cap. The sweep adopts pointed payloads under the same policy.
pub fn redrive_engine<P: Processor>(
    config: &RedriveConfig,
    clients: AwsClients,
    store_config: sqs_keeper_aws::StoreConfig,
    processor: Option<P>,
) -> RedriveEngine<P, DeadLetterStore> {
    let resolver = config.processor.as_ref().map(|worker| {
        let mut policy = worker.handler.payload.clone();
        policy.allowed_buckets.insert(store_config.bucket.clone());
        sqs_keeper_aws::ExtendedClientResolver::new(clients.s3.clone(), policy)
    });
    let mut store = DeadLetterStore::new(clients, store_config);
    if let Some(worker) = &config.processor {
        store = store.with_payload_policy(worker.handler.payload.clone());
    }
    let mut engine = RedriveEngine::new(store, processor, config.settings.clone());
    if let Some(resolver) = resolver {
        engine = engine.with_body_resolver(std::sync::Arc::new(resolver));
    }
    engine
}

/// Time kept free before the Lambda deadline for answering: the engine keeps its own
/// reserves before this (settling the DLQ messages, writing the items' outcomes).
const ANSWER_RESERVE: Duration = Duration::from_secs(2);

/// The engine behind the redrive function.
pub struct RedriveFunction {
    engine: RedriveEngine<RedriveProcessor, DeadLetterStore>,
    /// The worker's circuit breaker (`WORKER_BREAKER_TABLE`): no reprocessing while it is
    /// open, so outage-caused dead letters come back once the downstream has recovered.
    breaker: Option<RedriveBreaker>,
    /// Pauses the worker's polling while its breaker stays open (`sqs_keeper_core::polling`).
    polling: Option<WorkerPolling>,
    /// The `FunctionName` dimension of the metrics.
    function_name: String,
}

/// The input of the scheduled polling control (`{"control": "polling"}`), told apart from
/// a redrive request by its `control` key.
const POLLING_CONTROL: &str = "polling";

/// The input of the scheduled age report (`{"control": "age"}`): the DLQ age alarm's figure
/// written on a schedule of its own. A redrive schedule, a run the breaker held back, or a
/// FIFO DLQ whose rotated copies reset SQS's own age would otherwise leave the alarm quiet.
const AGE_CONTROL: &str = "age";

impl RedriveFunction {
    /// Builds the engine from the environment: the store is required; the processor is
    /// configured when `WORKER_DOWNSTREAM_URL` is set (otherwise only `requeue` works).
    pub async fn from_env() -> Result<RedriveFunction, ConfigError> {
        crate::config::vars::warn_of_unknown();
        let lookup = |name: &str| std::env::var(name).ok();
        let mut env = EnvReader::new(&lookup);
        let config = RedriveConfig::read(&mut env);
        let store = match &config.processor {
            Some(worker) => worker.handler.store.clone(),
            None => read_store_config(&mut env),
        };
        if store.is_none() {
            env.problem(
                TABLE.name,
                "is not set; the redrive function needs the dead-letter store",
            );
        }
        env.finish()?;
        let clients = AwsClients::from_env().await;
        let processor = redrive_processor(&config, &clients).await?;
        let breaker = redrive_breaker(&config, &clients);
        let polling = worker_polling(&config, &clients);
        let store_config = store.ok_or_else(|| ConfigError {
            problems: Vec::new(),
        })?;
        let engine = redrive_engine(&config, clients, store_config, processor);
        Ok(RedriveFunction {
            breaker,
            polling,
            engine,
            function_name: std::env::var("AWS_LAMBDA_FUNCTION_NAME")
                .ok()
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| "redrive".to_string()),
        })
    }

    /// Writes the age of the oldest dead record as the DLQ age alarm's metric, and answers
    /// it (`{"oldest_dead_age_secs": …}`, null when there is none or it could not be read).
    async fn report_dead_record_age(&self) -> serde_json::Value {
        let age = self.engine.oldest_dead_age().await;
        if let Some(age) = age {
            crate::metrics::emit_dead_record_age(age, &self.function_name);
        }
        serde_json::json!({ "oldest_dead_age_secs": age })
    }

    /// Handles one invocation of the function: the scheduled polling control
    /// (`{"control": "polling"}`) or a redrive request.
    pub async fn handle_event(
        &self,
        event: LambdaEvent<serde_json::Value>,
    ) -> Result<serde_json::Value, Diagnostic> {
        if let Some(control) = event.payload.get("control") {
            if control.as_str() == Some(AGE_CONTROL) {
                return Ok(self.report_dead_record_age().await);
            }
            if control.as_str() != Some(POLLING_CONTROL) {
                return Err(Diagnostic {
                    error_type: "InvalidRequest".to_string(),
                    error_message: format!(
                        "unknown control {control}; the controls are {POLLING_CONTROL:?} and {AGE_CONTROL:?}"
                    ),
                });
            }
            let action = match &self.polling {
                Some(control) => {
                    // The function reads one clock: its engine's.
                    let action = control
                        .run(self.engine.settings().retry.clock.system_time())
                        .await;
                    match &action {
                        sqs_keeper_core::polling::ControlAction::Failed { error } => {
                            tracing::warn!(%error, "the polling control could not finish; the next run goes on from here");
                        }
                        action => tracing::info!(?action, "polling control"),
                    }
                    crate::metrics::emit_polling(&action, &self.function_name);
                    action
                }
                None => {
                    use crate::config::vars::{
                        BREAKER_TABLE, SOURCE_QUEUE_URL, WORKER_FUNCTION, WORKER_MAPPING,
                    };
                    sqs_keeper_core::polling::ControlAction::Failed {
                        error: format!(
                            "not configured: {}, {}, {} and {}",
                            WORKER_FUNCTION.name,
                            WORKER_MAPPING.name,
                            SOURCE_QUEUE_URL.name,
                            BREAKER_TABLE.name
                        ),
                    }
                }
            };
            return serde_json::to_value(&action).map_err(|e| Diagnostic {
                error_type: "Internal".to_string(),
                error_message: e.to_string(),
            });
        }
        let report = self.handle(event).await?;
        serde_json::to_value(&report).map_err(|e| Diagnostic {
            error_type: "Internal".to_string(),
            error_message: e.to_string(),
        })
    }

    /// Handles one redrive request.
    pub async fn handle(
        &self,
        event: LambdaEvent<serde_json::Value>,
    ) -> Result<RedriveReport, Diagnostic> {
        let text = event.payload.to_string();
        let mut request = RedriveRequest::from_json(&text).map_err(diagnostic)?;
        // A deadline already past on arrival (as `cargo lambda watch` sends) gets the
        // worker's fallback budget rather than none.
        let budget = sqs_keeper_core::retry::InvocationBudget::of(
            event.context.deadline(),
            std::time::SystemTime::now(),
        )
        .time();
        let now = tokio::time::Instant::now();
        let deadline = now + budget.saturating_sub(ANSWER_RESERVE);
        let until_settling = budget
            .saturating_sub(
                ANSWER_RESERVE
                    + sqs_keeper_core::redrive::SETTLE_RESERVE
                    + sqs_keeper_core::redrive::OUTCOME_WRITE_SLICE,
            )
            .as_secs()
            .max(1);
        request.time_budget_secs = Some(
            request
                .time_budget_secs
                .unwrap_or(until_settling)
                .min(until_settling),
        );
        let report = run_gated(
            &self.engine,
            self.breaker.as_ref().map(|(store, policy)| (store, policy)),
            &request,
            Some(deadline),
            &*no_progress(),
        )
        .await
        .map_err(diagnostic)?;
        tracing::info!(
            run_id = %report.run_id,
            selected = report.selected,
            succeeded = report.succeeded,
            requeued = report.requeued,
            failed_again = report.failed_again,
            skipped_ineligible = report.skipped_ineligible,
            leased_elsewhere = report.leased_elsewhere,
            not_found = report.not_found,
            errors = report.errors,
            adopted = report.adopted_from_dlq,
            dry_run = report.dry_run,
            more = report.continuation_token.is_some(),
            "redrive finished"
        );
        crate::metrics::emit_redrive(&report, &self.function_name);
        Ok(report)
    }
}

/// The worker's circuit breaker as a redrive sees it: its store and policy.
pub type RedriveBreaker = (
    sqs_keeper_aws::DynamoBreakerStore,
    sqs_keeper_core::breaker::BreakerPolicy,
);

/// Returns the worker's circuit breaker of `config`, when it has one (`WORKER_BREAKER_TABLE`).
pub fn redrive_breaker(config: &RedriveConfig, clients: &AwsClients) -> Option<RedriveBreaker> {
    config
        .processor
        .as_ref()
        .and_then(|worker| worker.handler.breaker.as_ref())
        .map(|breaker| {
            (
                sqs_keeper_aws::DynamoBreakerStore::new(
                    clients.dynamodb.clone(),
                    breaker.table.clone(),
                    &breaker.key,
                ),
                breaker.policy,
            )
        })
}

fn diagnostic(error: RedriveError) -> Diagnostic {
    Diagnostic {
        error_type: error.error_type().to_string(),
        error_message: error.to_string(),
    }
}

/// The polling control of the worker, as the redrive function runs it.
type WorkerPolling = sqs_keeper_core::polling::PollingControl<
    sqs_keeper_aws::DynamoBreakerStore,
    sqs_keeper_aws::LambdaMapping,
    sqs_keeper_aws::DynamoPauseMarker,
    sqs_keeper_aws::InvokeWorkerProbe,
>;

/// Returns the control that pauses the worker's polling while its breaker stays open: only when
/// both the worker's mapping (`WORKER_MAPPING`) and its breaker are configured.
fn worker_polling(config: &RedriveConfig, clients: &AwsClients) -> Option<WorkerPolling> {
    match (
        &config.polling,
        config
            .processor
            .as_ref()
            .and_then(|worker| worker.handler.breaker.as_ref()),
    ) {
        (Some(target), Some(breaker)) => {
            let lambda = aws_sdk_lambda::Client::new(&clients.config);
            let region = clients
                .config
                .region()
                .map_or_else(|| "us-east-1".to_string(), ToString::to_string);
            Some(sqs_keeper_core::polling::PollingControl {
                breaker: sqs_keeper_aws::DynamoBreakerStore::new(
                    clients.dynamodb.clone(),
                    breaker.table.clone(),
                    &breaker.key,
                ),
                mapping: sqs_keeper_aws::LambdaMapping::new(lambda.clone(), &target.mapping),
                marker: sqs_keeper_aws::DynamoPauseMarker::new(
                    clients.dynamodb.clone(),
                    breaker.table.clone(),
                    &breaker.key,
                ),
                probe: sqs_keeper_aws::InvokeWorkerProbe {
                    sqs: clients.sqs.clone(),
                    lambda,
                    queue_url: target.queue_url.clone(),
                    function: target.function.clone(),
                    region,
                },
            })
        }
        (Some(_), None) => {
            tracing::warn!(
                "{} is set but the worker's breaker is not ({}): its polling is never paused",
                crate::config::vars::WORKER_MAPPING.name,
                crate::config::vars::BREAKER_TABLE.name
            );
            None
        }
        _ => None,
    }
}
