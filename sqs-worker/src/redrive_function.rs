//! The Lambda glue of the redrive function: builds the engine once from the environment
//! and answers each invocation (a [`RedriveRequest`] as JSON) with a [`RedriveReport`].
//! The run's time budget is capped by the invocation's deadline, so a large redrive stops
//! cleanly with a continuation token instead of being killed at the Lambda timeout.

use std::time::Duration;

use lambda_runtime::{Diagnostic, LambdaEvent};

use crate::aws::AwsClients;
use crate::config::{ConfigError, EnvReader, WorkerConfig};
use crate::item::{ItemIdSource, ItemParser};
use crate::processor::HttpDelivery;
use crate::redrive::{
    no_progress, RedriveEngine, RedriveError, RedriveReport, RedriveRequest, RedriveSettings,
};
use crate::store::{DeadLetterStore, StoreConfig};

/// `REDRIVE_SOURCE_QUEUE_URL`
pub const SOURCE_QUEUE_URL: &str = "REDRIVE_SOURCE_QUEUE_URL";
/// `REDRIVE_KEEP_PAYLOADS`
pub const KEEP_PAYLOADS: &str = "REDRIVE_KEEP_PAYLOADS";

/// The redrive function's own variables (besides the store's and, for reprocessing, the
/// worker's processor variables).
pub const REDRIVE_ENV_VARS: &[(&str, &str)] = &[
    (
        SOURCE_QUEUE_URL,
        "requeue target overriding the queue each record names (optional)",
    ),
    (
        KEEP_PAYLOADS,
        "true | false: keep S3 payloads of resolved items (default false)",
    ),
];

/// Time kept free before the Lambda deadline for answering: the engine keeps its own
/// reserves before this (settling the DLQ messages, writing the items' outcomes).
const ANSWER_RESERVE: Duration = Duration::from_secs(2);

/// The engine behind the redrive function.
pub struct RedriveFunction {
    engine: RedriveEngine<HttpDelivery, DeadLetterStore>,
}

impl RedriveFunction {
    /// Builds the engine from the environment: the store is required; the processor is
    /// configured when `WORKER_DOWNSTREAM_URL` is set (otherwise only `requeue` works).
    pub async fn from_env() -> Result<RedriveFunction, ConfigError> {
        let lookup = |name: &str| std::env::var(name).ok();
        let mut env = EnvReader::new(&lookup);
        let store = StoreConfig::read(&mut env);
        if store.is_none() {
            env.problem(
                crate::store::TABLE,
                "is not set; the redrive function needs the dead-letter store",
            );
        }
        let source_queue_url: Option<String> = env.optional(SOURCE_QUEUE_URL, "a queue URL");
        let keep_payloads = env.flag(KEEP_PAYLOADS, false);
        let processor_config = if lookup(crate::config::DOWNSTREAM_URL).is_some() {
            WorkerConfig::read(&mut env)
        } else {
            None
        };
        let id_source = env
            .optional::<ItemIdSource>(
                crate::config::ITEM_ID_SOURCE,
                "message-id, pointer:/path or attribute:Name",
            )
            .unwrap_or(ItemIdSource::MessageId);
        env.finish()?;
        let clients = AwsClients::from_env().await;
        let mut processor_config = processor_config;
        if let Some(config) = &mut processor_config {
            config
                .resolve_downstream_auth(&clients)
                .await
                .map_err(|e| ConfigError {
                    problems: vec![crate::config::ConfigProblem {
                        variable: e.variable.to_string(),
                        problem: e.to_string(),
                    }],
                })?;
        }
        let processor = match &processor_config {
            Some(c) => Some(
                HttpDelivery::new(c.delivery.clone()).map_err(|e| ConfigError {
                    problems: vec![crate::config::ConfigProblem {
                        variable: crate::config::DOWNSTREAM_URL.to_string(),
                        problem: format!("cannot build the HTTP client: {e}"),
                    }],
                })?,
            ),
            None => None,
        };
        let settings = RedriveSettings {
            retry: processor_config
                .as_ref()
                .map(|c| c.batch.retry.clone())
                .unwrap_or_default(),
            parser: ItemParser {
                id_source,
                ..ItemParser::default()
            },
            source_queue_url,
            keep_payloads,
            ..RedriveSettings::default()
        };
        let store = DeadLetterStore::new(
            clients,
            store.ok_or_else(|| ConfigError {
                problems: Vec::new(),
            })?,
        );
        Ok(RedriveFunction {
            engine: RedriveEngine::new(store, processor, settings),
        })
    }

    /// Handles one invocation.
    pub async fn handle(
        &self,
        event: LambdaEvent<serde_json::Value>,
    ) -> Result<RedriveReport, Diagnostic> {
        let text = event.payload.to_string();
        let mut request = RedriveRequest::from_json(&text).map_err(diagnostic)?;
        // A deadline already past on arrival (as `cargo lambda watch` sends) gets the
        // worker's fallback budget rather than none.
        let budget = crate::retry::InvocationBudget::of(
            event.context.deadline(),
            std::time::SystemTime::now(),
        )
        .time();
        let now = tokio::time::Instant::now();
        let deadline = now + budget.saturating_sub(ANSWER_RESERVE);
        let until_settling = budget
            .saturating_sub(
                ANSWER_RESERVE
                    + crate::redrive::SETTLE_RESERVE
                    + crate::redrive::OUTCOME_WRITE_SLICE,
            )
            .as_secs()
            .max(1);
        request.time_budget_secs = Some(
            request
                .time_budget_secs
                .unwrap_or(until_settling)
                .min(until_settling),
        );
        let report = self
            .engine
            .run_until(&request, Some(deadline), &*no_progress())
            .await
            .map_err(diagnostic)?;
        tracing::info!(
            run_id = %report.run_id,
            selected = report.selected,
            succeeded = report.succeeded,
            failed_again = report.failed_again,
            skipped_ineligible = report.skipped_ineligible,
            leased_elsewhere = report.leased_elsewhere,
            errors = report.errors,
            more = report.continuation_token.is_some(),
            "redrive finished"
        );
        Ok(report)
    }
}

fn diagnostic(error: RedriveError) -> Diagnostic {
    let error_type = match error {
        RedriveError::InvalidRequest(_) => "InvalidRequest",
        RedriveError::Store(_) => "StoreError",
    };
    Diagnostic {
        error_type: error_type.to_string(),
        error_message: error.to_string(),
    }
}
