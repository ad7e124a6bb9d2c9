//! The redrive engine's configuration (`RedriveConfig`, `http` feature), shared by the redrive
//! function and `dlq redrive`, and the worker whose polling it pauses ([`PollingTarget`]).

use super::*;

/// The redrive engine's configuration from the environment, the same for the redrive
/// function and `dlq redrive`: the retry policy and processor of the worker (when
/// `WORKER_DOWNSTREAM_URL` is set; otherwise only requeue works), how item ids are read,
/// the requeue target and whether resolved items' payloads are kept. The store is not
/// part of it: the function reads it from the environment, `dlq` from its options.
#[cfg(feature = "http")]
#[derive(Debug, Clone)]
pub struct RedriveConfig {
    /// The engine's settings.
    pub settings: RedriveSettings,
    /// The worker's configuration, when its downstream is configured (reprocess mode).
    /// It holds the store's configuration too, when that is set.
    pub processor: Option<WorkerConfig>,
    /// The worker whose polling is paused during a long outage, when configured.
    pub polling: Option<PollingTarget>,
}

/// The worker the redrive function pauses and probes (`sqs_keeper_core::polling`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollingTarget {
    /// `REDRIVE_WORKER_FUNCTION`.
    pub function: String,
    /// `REDRIVE_WORKER_MAPPING`.
    pub mapping: String,
    /// `REDRIVE_SOURCE_QUEUE_URL`: where the probe takes its message.
    pub queue_url: String,
}

#[cfg(feature = "http")]
impl RedriveConfig {
    /// Reads the redrive engine's variables into `env`, noting problems there.
    pub fn read(env: &mut EnvReader<'_>) -> RedriveConfig {
        let source_queue_url: Option<String> = env.optional(&SOURCE_QUEUE_URL);
        let keep_payloads = env.flag(&KEEP_PAYLOADS);
        let processor = if env.raw(&DOWNSTREAM_URL).is_some() {
            WorkerConfig::read(env)
        } else {
            None
        };
        let (id_source, envelope) = read_ids_and_envelope(env);
        let settings = RedriveSettings {
            retry: processor
                .as_ref()
                .map(|c| c.handler.batch.retry.clone())
                .unwrap_or_default(),
            parser: ItemParser {
                id_source,
                envelope,
                ..ItemParser::default()
            },
            source_queue_url,
            keep_payloads,
            invocation: sqs_keeper_core::dead_letter::InvocationInfo {
                function_name: env.lambda_variable("AWS_LAMBDA_FUNCTION_NAME"),
                request_id: None,
                log_group: env.lambda_variable("AWS_LAMBDA_LOG_GROUP_NAME"),
                log_stream: env.lambda_variable("AWS_LAMBDA_LOG_STREAM_NAME"),
            },
            ..RedriveSettings::default()
        };
        let function: Option<String> = env.optional(&WORKER_FUNCTION);
        let mapping: Option<String> = env.optional(&WORKER_MAPPING);
        let polling = match (function, mapping, &settings.source_queue_url) {
            (Some(function), Some(mapping), Some(queue_url)) => Some(PollingTarget {
                function,
                mapping,
                queue_url: queue_url.clone(),
            }),
            (None, None, _) => None,
            _ => {
                env.problem(
                    WORKER_MAPPING.name,
                    format!(
                        "{}, {} and {} go together (all set to pause the worker's polling, or the first two unset)",
                        WORKER_FUNCTION.name, WORKER_MAPPING.name, SOURCE_QUEUE_URL.name
                    ),
                );
                None
            }
        };
        RedriveConfig {
            settings,
            processor,
            polling,
        }
    }
}
