//! Configuration from environment variables, validated all at once: every missing or
//! malformed variable is named in one error, with the form it expects. The variables
//! themselves (name, meaning, form, default) are listed once, in [`vars`]; this module
//! reads them into a handler's ([`HandlerConfig`]), the shipped worker's (`WorkerConfig`:
//! the handler's and its downstream), the store's ([`read_store_config`]) and the redrive
//! engine's (`RedriveConfig`) configuration, which the redrive function and
//! `dlq redrive` share.
//!
//! [`EnvReader`] is written by hand because it reports every problem at once rather than
//! the first, which is what an operator fixing a function's environment wants; the
//! parsers it uses are the types' own `FromStr`.

#[cfg(feature = "http")]
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::adapters::store::StoreConfig;
use crate::batch::BatchConfig;
use crate::envelope::Envelopes;
#[cfg(feature = "http")]
use crate::http_delivery::{redact_url, redact_url_text, HttpDeliveryConfig};
use crate::item::{BodyFormat, ItemIdSource, ItemParser};
use crate::pointer::PayloadPolicy;
#[cfg(feature = "http")]
use crate::redrive::RedriveSettings;
use crate::retry::{Jitter, RetryPolicy};

/// The id of the circuit breaker's item in `WORKER_BREAKER_TABLE`: one per table, shared
/// by the worker's sandboxes and read by the redrive function.
pub const BREAKER_ID: &str = "breaker#downstream";

pub mod vars;

use vars::*;
pub use vars::{Var, REDRIVE_VARS, STORE_VARS, WORKER_VARS};

/// One bad variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The variable's name.
    pub variable: String,
    /// What is wrong and what form is expected.
    pub problem: String,
}

/// All problems found in the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Every bad or missing variable.
    pub problems: Vec<ConfigProblem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration ({} problem(s))",
            self.problems.len()
        )?;
        for p in &self.problems {
            write!(f, "; {}: {}", p.variable, p.problem)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Reads variables and collects every problem instead of stopping at the first.
pub struct EnvReader<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    problems: Vec<ConfigProblem>,
}

impl<'a> EnvReader<'a> {
    /// A reader over any lookup (tests pass a map; production passes `std::env::var`).
    pub fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Self {
        EnvReader {
            lookup,
            problems: Vec::new(),
        }
    }

    /// Reads with `read` over `lookup`: what it read, or every problem it noted.
    pub fn read_all<T>(
        lookup: &'a dyn Fn(&str) -> Option<String>,
        read: impl FnOnce(&mut EnvReader<'a>) -> T,
    ) -> Result<T, ConfigError> {
        let mut env = EnvReader::new(lookup);
        let value = read(&mut env);
        env.finish()?;
        Ok(value)
    }

    /// Notes a problem with `variable`.
    pub fn problem(&mut self, variable: &str, problem: impl Into<String>) {
        self.problems.push(ConfigProblem {
            variable: variable.to_string(),
            problem: problem.into(),
        });
    }

    /// The variable's trimmed value; `None` when unset or blank.
    pub fn raw(&self, var: &Var) -> Option<String> {
        (self.lookup)(var.name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// A required variable parsed with `FromStr`.
    pub fn required<T: FromStr>(&mut self, var: &Var) -> Option<T>
    where
        T::Err: fmt::Display,
    {
        match self.raw(var) {
            Some(_) => self.optional(var),
            None => {
                self.problem(var.name, format!("is not set; expected {}", var.expected()));
                None
            }
        }
    }

    /// An optional variable parsed with `FromStr`; `None` when unset or bad (bad is noted).
    pub fn optional<T: FromStr>(&mut self, var: &Var) -> Option<T>
    where
        T::Err: fmt::Display,
    {
        let raw = self.raw(var)?;
        match raw.parse::<T>() {
            Ok(value) => Some(value),
            Err(e) => {
                self.problem(
                    var.name,
                    format!("{raw:?} is not valid ({e}); expected {}", var.expected()),
                );
                None
            }
        }
    }

    /// An optional text variable parsed with `FromStr`, or its default when unset (or bad:
    /// bad is noted).
    pub fn text_or_default<T: FromStr>(&mut self, var: &Var) -> Option<T>
    where
        T::Err: fmt::Display,
    {
        match self.optional(var) {
            Some(value) => Some(value),
            None => match var.form {
                vars::Form::Text {
                    default: Some(d), ..
                } => d.parse().ok(),
                _ => None,
            },
        }
    }

    /// An integer variable within its range; `None` when unset (or bad: bad is noted).
    pub fn integer_if_set(&mut self, var: &Var) -> Option<u64> {
        let vars::Form::Integer { min, max, .. } = var.form else {
            return self.optional(var);
        };
        let value = self.optional::<u64>(var)?;
        if (min..=max).contains(&value) {
            Some(value)
        } else {
            self.problem(
                var.name,
                format!("{value} is out of range; expected {}", var.expected()),
            );
            None
        }
    }

    /// An integer variable within its range, or its default.
    pub fn integer(&mut self, var: &Var) -> u64 {
        self.integer_if_set(var)
            .unwrap_or_else(|| var.integer_default())
    }

    /// A `true`/`false` variable, or its default.
    pub fn flag(&mut self, var: &Var) -> bool {
        let default = matches!(var.form, vars::Form::Flag { default: true });
        match self.raw(var).as_deref() {
            None => default,
            Some("true") => true,
            Some("false") => false,
            Some(other) => {
                self.problem(
                    var.name,
                    format!("{other:?} is not valid; expected true or false"),
                );
                default
            }
        }
    }

    /// A variable Lambda sets for the function (its name, log group and stream): not
    /// ours to validate, only to pass on.
    pub fn lambda_variable(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|v| !v.is_empty())
    }

    /// Ends reading: the problems, if any.
    pub fn finish(self) -> Result<(), ConfigError> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError {
                problems: self.problems,
            })
        }
    }
}

/// Where the downstream credential comes from: a header name and the Secrets Manager
/// secret holding its value (read at start-up by the `http` feature's secrets adapter).
#[cfg(feature = "http")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownstreamAuth {
    /// The header, e.g. `authorization` or `x-api-key`.
    pub header: reqwest::header::HeaderName,
    /// The secret's id or ARN.
    pub secret_id: String,
}

/// Headers `HttpDelivery` sets itself; a credential may not replace them.
#[cfg(feature = "http")]
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "idempotency-key",
    "x-item-id",
    "x-sqs-message-id",
];

/// `WORKER_DOWNSTREAM_AUTH_HEADER` and `WORKER_DOWNSTREAM_AUTH_SECRET`: both or neither.
#[cfg(feature = "http")]
fn read_downstream_auth(env: &mut EnvReader<'_>) -> Option<DownstreamAuth> {
    let header: Option<String> = env.optional(&DOWNSTREAM_AUTH_HEADER);
    let secret_id: Option<String> = env.optional(&DOWNSTREAM_AUTH_SECRET);
    let header = header.and_then(|name| {
        match reqwest::header::HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) if RESERVED_HEADERS.contains(&h.as_str()) => {
                env.problem(
DOWNSTREAM_AUTH_HEADER.name,
                    format!("{name:?} is a header the worker sets itself; expected another name, e.g. Authorization or x-api-key"),
                );
                None
            }
            Ok(h) => Some(h),
            Err(_) => {
                env.problem(
DOWNSTREAM_AUTH_HEADER.name,
                    format!("{name:?} is not an HTTP header name; expected e.g. Authorization or x-api-key"),
                );
                None
            }
        }
    });
    let together = format!("{DOWNSTREAM_AUTH_HEADER} and {DOWNSTREAM_AUTH_SECRET} go together");
    match (
        header,
        secret_id,
        env.raw(&DOWNSTREAM_AUTH_HEADER).is_some(),
    ) {
        (Some(header), Some(secret_id), _) => Some(DownstreamAuth { header, secret_id }),
        (None, Some(_), false) => {
            env.problem(
                DOWNSTREAM_AUTH_HEADER.name,
                format!("is not set; {together}"),
            );
            None
        }
        (Some(_), None, _) => {
            env.problem(
                DOWNSTREAM_AUTH_SECRET.name,
                format!("is not set; {together}"),
            );
            None
        }
        _ => None,
    }
}

/// Whether `name` is a valid S3 bucket name: 3 to 63 lowercase letters, digits, dots and
/// hyphens, starting and ending with a letter or digit.
fn is_bucket_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last())
}

/// `WORKER_PAYLOAD_MAX_BYTES` and `WORKER_PAYLOAD_BUCKETS`. The store's own bucket is
/// added by the worker, which knows it.
fn read_payload_policy(env: &mut EnvReader<'_>) -> PayloadPolicy {
    let max_bytes = env.integer(&PAYLOAD_MAX_BYTES);
    let mut allowed_buckets = std::collections::BTreeSet::new();
    for name in env
        .raw(&PAYLOAD_BUCKETS)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        if is_bucket_name(name) {
            allowed_buckets.insert(name.to_string());
        } else {
            env.problem(
                PAYLOAD_BUCKETS.name,
                format!("{name:?} is not a bucket name; expected comma-separated S3 bucket names"),
            );
        }
    }
    PayloadPolicy {
        max_bytes,
        allowed_buckets,
    }
}

/// What any handler's worker reads from the environment: the batch engine, deadline,
/// payload policy, dead-letter store, envelope and idempotency. The shipped HTTP worker
/// reads `WorkerConfig` (`http` feature), which is this and its downstream.
#[derive(Debug, Clone)]
pub struct HandlerConfig {
    /// What SQS Extended Client pointers may make the worker read (the store's bucket is
    /// added at start-up).
    pub payload: PayloadPolicy,
    /// The batch engine (with the envelope, in its parser).
    pub batch: BatchConfig,
    /// Safety margin before the invocation deadline.
    pub deadline_margin: Duration,
    /// Where dead-lettered items go; `None` when no store is configured.
    pub store: Option<crate::adapters::store::StoreConfig>,
    /// The idempotency table, when one is configured.
    pub idempotency: Option<IdempotencyConfig>,
    /// Spaced redelivery of records returned for retry; `None` when off.
    pub redelivery: Option<crate::redelivery::RedeliveryPolicy>,
    /// The shared circuit breaker; `None` when off.
    pub breaker: Option<BreakerConfig>,
}

/// `WORKER_BREAKER_TABLE`, its key and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfig {
    /// The table.
    pub table: String,
    /// The breaker's item: one breaker per key (`WORKER_BREAKER_KEY`).
    pub key: String,
    /// When it opens and for how long.
    pub policy: crate::breaker::BreakerPolicy,
}

/// `WORKER_IDEMPOTENCY_TABLE`, its TTL and key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyConfig {
    /// The table.
    pub table: String,
    /// How long a completed item is remembered.
    pub ttl: Duration,
    /// What every key starts with (`WORKER_IDEMPOTENCY_KEY_PREFIX`).
    pub key_prefix: String,
}

/// The breaker key of a function that names none: its own, so that two functions sharing
/// a table do not share a breaker (outside Lambda: [`BREAKER_ID`]).
fn default_breaker_key(function: Option<&str>) -> String {
    function.map_or_else(|| BREAKER_ID.to_string(), |name| format!("breaker#{name}"))
}

/// The idempotency key prefix of a function that names none: its name and `#`, as
/// Powertools prefixes its keys with the function's (outside Lambda: none).
fn default_idempotency_prefix(function: Option<&str>) -> String {
    function.map_or_else(String::new, |name| format!("{name}#"))
}

/// Everything the worker function needs: the handler's configuration and the downstream
/// it delivers to.
#[cfg(feature = "http")]
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The HTTP delivery processor. Its credential header, if any, is filled in by
    /// [`WorkerConfig::resolve_downstream_auth`] at start-up.
    pub delivery: HttpDeliveryConfig,
    /// Where the downstream credential comes from, when one is configured.
    pub downstream_auth: Option<DownstreamAuth>,
    /// Everything else.
    pub handler: HandlerConfig,
}

/// `WORKER_DOWNSTREAM_URL`: an http(s) URL without credentials in it. The value is only
/// ever quoted redacted (a query string may hold an API key), and a `user:password@` is
/// refused: credentials belong in a header, from Secrets Manager.
#[cfg(feature = "http")]
fn read_downstream_url(env: &mut EnvReader<'_>) -> Option<reqwest::Url> {
    let raw: String = env.required(&DOWNSTREAM_URL)?;
    let url = match raw.parse::<reqwest::Url>() {
        Ok(url) => url,
        Err(e) => {
            env.problem(
                DOWNSTREAM_URL.name,
                format!(
                    "{:?} is not valid ({e}); expected an http:// or https:// URL",
                    redact_url_text(&raw)
                ),
            );
            return None;
        }
    };
    if !matches!(url.scheme(), "http" | "https") {
        env.problem(
            DOWNSTREAM_URL.name,
            format!(
                "scheme {:?} is not supported; expected http or https",
                url.scheme()
            ),
        );
        return None;
    }
    if !url.username().is_empty() || url.password().is_some() {
        env.problem(
            DOWNSTREAM_URL.name,
            format!(
                "{:?} carries credentials (user:password@), which end up in logs and \
                 records; send them in a header instead: {DOWNSTREAM_AUTH_HEADER} and \
                 {DOWNSTREAM_AUTH_SECRET}",
                redact_url(&url)
            ),
        );
        return None;
    }
    Some(url)
}

#[cfg(feature = "http")]
impl WorkerConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads any variable lookup (for tests).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        EnvReader::read_all(lookup, Self::read)?.ok_or_else(|| ConfigError {
            problems: Vec::new(),
        })
    }

    /// Reads the worker's variables into `env`, noting problems there.
    pub fn read(env: &mut EnvReader<'_>) -> Option<Self> {
        let delivery = Self::read_delivery(env);
        let handler = HandlerConfig::read(env);
        let (delivery, downstream_auth) = delivery?;
        Some(WorkerConfig {
            delivery,
            downstream_auth,
            handler,
        })
    }

    /// Reads the downstream's variables only (URL, timeout, content type, credential).
    pub fn read_delivery(
        env: &mut EnvReader<'_>,
    ) -> Option<(HttpDeliveryConfig, Option<DownstreamAuth>)> {
        let url = read_downstream_url(env);
        let timeout = env.integer(&DOWNSTREAM_TIMEOUT_MS);
        let content_type = env
            .text_or_default::<String>(&DOWNSTREAM_CONTENT_TYPE)
            .unwrap_or_default();
        let downstream_auth = read_downstream_auth(env);
        Some((
            HttpDeliveryConfig {
                url: url?,
                timeout: Duration::from_millis(timeout),
                content_type,
                auth_header: None,
            },
            downstream_auth,
        ))
    }

    /// The variables and their descriptions (worker and store), for documentation and
    /// drift checks against the infrastructure template.
    pub fn documented_variables() -> BTreeMap<&'static str, String> {
        WORKER_VARS
            .iter()
            .chain(STORE_VARS)
            .map(|v| (v.name, v.describe()))
            .collect()
    }
}

impl HandlerConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads any variable lookup (for tests).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        EnvReader::read_all(lookup, Self::read)
    }

    /// Reads the handler's variables into `env`, noting problems there.
    pub fn read(env: &mut EnvReader<'_>) -> Self {
        let (id_source, envelope) = read_ids_and_envelope(env);
        let body_format = env
            .text_or_default::<BodyFormat>(&BODY_FORMAT)
            .unwrap_or_default();
        let concurrency = env.integer(&MAX_CONCURRENCY);
        let max_receive_count = env
            .integer_if_set(&MAX_RECEIVE_COUNT)
            .map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        let margin = env.integer(&RECEIVE_BUDGET_MARGIN);
        let max_attempts = env.integer(&RETRY_MAX_ATTEMPTS);
        let base_delay = env.integer(&RETRY_BASE_DELAY_MS);
        let max_delay = env.integer(&RETRY_MAX_DELAY_MS);
        if base_delay > max_delay {
            env.problem(
                RETRY_BASE_DELAY_MS.name,
                format!("{base_delay} is larger than {RETRY_MAX_DELAY_MS} ({max_delay}); expected base <= max"),
            );
        }
        let retry_unknown = env.flag(&RETRY_UNKNOWN_ERRORS);
        let deadline_margin = env.integer(&DEADLINE_MARGIN_MS);
        let skip_group_on_error = env.flag(&SKIP_GROUP_ON_ERROR);
        let payload = read_payload_policy(env);
        let store = read_store_config(env);
        let idempotency_table: Option<String> = env.optional(&IDEMPOTENCY_TABLE);
        let idempotency_ttl = env.integer(&IDEMPOTENCY_TTL_SECS);
        let redelivery_base = env.integer(&REDELIVERY_BASE_SECS);
        let redelivery_multiplier = env.integer(&REDELIVERY_MULTIPLIER);
        let redelivery_max = env.integer(&REDELIVERY_MAX_SECS);
        let breaker_table: Option<String> = env.optional(&BREAKER_TABLE);
        let function = env.lambda_variable("AWS_LAMBDA_FUNCTION_NAME");
        let breaker_key: String = env
            .optional(&BREAKER_KEY)
            .unwrap_or_else(|| default_breaker_key(function.as_deref()));
        let idempotency_prefix: String = env
            .optional(&IDEMPOTENCY_KEY_PREFIX)
            .unwrap_or_else(|| default_idempotency_prefix(function.as_deref()));
        let breaker_threshold = env.integer(&BREAKER_THRESHOLD);
        let breaker_window = env.integer(&BREAKER_WINDOW_SECS);
        let breaker_open = env.integer(&BREAKER_OPEN_SECS);
        HandlerConfig {
            breaker: breaker_table.map(|table| {
                let open_for = Duration::from_secs(breaker_open);
                BreakerConfig {
                    table,
                    key: breaker_key,
                    policy: crate::breaker::BreakerPolicy {
                        threshold: u32::try_from(breaker_threshold).unwrap_or(u32::MAX),
                        window: Duration::from_secs(breaker_window),
                        open_for,
                        max_open: open_for
                            .saturating_mul(16)
                            .min(crate::redelivery::MAX_VISIBILITY),
                        probe_for: Duration::from_secs(60),
                        refresh: Duration::from_secs(1),
                    },
                }
            }),
            redelivery: (redelivery_base > 0).then(|| crate::redelivery::RedeliveryPolicy {
                base: Duration::from_secs(redelivery_base),
                multiplier: u32::try_from(redelivery_multiplier).unwrap_or(u32::MAX),
                max: Duration::from_secs(redelivery_max.max(redelivery_base)),
            }),
            store,
            payload,
            batch: BatchConfig {
                parser: ItemParser {
                    id_source,
                    body_format,
                    envelope,
                },
                retry: RetryPolicy {
                    max_attempts: u32::try_from(max_attempts).unwrap_or(u32::MAX),
                    base_delay: Duration::from_millis(base_delay),
                    max_delay: Duration::from_millis(max_delay),
                    retry_unknown,
                    jitter: Jitter::Full,
                },
                concurrency: usize::try_from(concurrency).unwrap_or(usize::MAX),
                max_receive_count,
                receive_budget_margin: u32::try_from(margin).unwrap_or(u32::MAX),
                skip_group_on_error,
            },
            deadline_margin: Duration::from_millis(deadline_margin),
            idempotency: idempotency_table.map(|table| IdempotencyConfig {
                table,
                ttl: Duration::from_secs(idempotency_ttl),
                key_prefix: idempotency_prefix,
            }),
        }
    }
}

/// `WORKER_ITEM_ID_SOURCE` and `WORKER_ENVELOPE`, read the same by the worker and the
/// redrive engine: with an envelope and no id source set, the item id is the event's own.
pub fn read_ids_and_envelope(env: &mut EnvReader<'_>) -> (ItemIdSource, Envelopes) {
    let envelope = env
        .text_or_default::<Envelopes>(&ENVELOPE)
        .unwrap_or_default();
    let id_source = if env.raw(&ITEM_ID_SOURCE).is_none() && !envelope.is_none() {
        ItemIdSource::Envelope
    } else {
        read_item_id_source(env)
    };
    (id_source, envelope)
}

/// `WORKER_ITEM_ID_SOURCE`, read the same by the worker and the redrive engine.
pub fn read_item_id_source(env: &mut EnvReader<'_>) -> ItemIdSource {
    env.text_or_default::<ItemIdSource>(&ITEM_ID_SOURCE)
        .unwrap_or(ItemIdSource::MessageId)
}

/// Reads the store variables: `None` when none of the three names is set, a problem for
/// each missing one when only some are.
pub fn read_store_config(env: &mut EnvReader<'_>) -> Option<StoreConfig> {
    let table: Option<String> = env.optional(&TABLE);
    let queue_url: Option<String> = env.optional(&QUEUE_URL);
    let bucket: Option<String> = env.optional(&BUCKET);
    let inline = env.integer(&INLINE_MAX_BYTES);
    let days = env.integer(&RETENTION_DAYS);
    match (table, queue_url, bucket) {
        (None, None, None) => None,
        (Some(table), Some(queue_url), Some(bucket)) => Some(StoreConfig {
            inline_max_bytes: usize::try_from(inline).unwrap_or(usize::MAX),
            retention: Duration::from_secs(days.saturating_mul(86_400)),
            ..StoreConfig::new(&table, &queue_url, &bucket)
        }),
        (table, queue_url, bucket) => {
            for (var, value) in [(TABLE, table), (QUEUE_URL, queue_url), (BUCKET, bucket)] {
                if value.is_none() {
                    env.problem(
                        var.name,
                        format!("is not set; {TABLE}, {QUEUE_URL} and {BUCKET} go together"),
                    );
                }
            }
            None
        }
    }
}

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

/// The worker the redrive function pauses and probes (`crate::polling`).
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
            invocation: crate::dead_letter::InvocationInfo {
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

#[cfg(feature = "http")]
impl WorkerConfig {
    /// Completes the delivery configuration with the downstream credential, when one is
    /// configured: reads the secret once through `clients`.
    pub async fn resolve_downstream_auth(
        &mut self,
        clients: &crate::adapters::aws::AwsClients,
    ) -> Result<(), crate::adapters::secrets::SecretError> {
        if let Some(auth) = &self.downstream_auth {
            self.delivery.auth_header = Some(
                crate::adapters::secrets::auth_header(
                    &auth.header,
                    &auth.secret_id,
                    DOWNSTREAM_AUTH_SECRET.name,
                    &clients.secretsmanager,
                )
                .await?,
            );
        }
        Ok(())
    }
}

#[cfg(all(test, feature = "http"))]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<WorkerConfig, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        WorkerConfig::from_lookup(&move |k| map.get(k).cloned())
    }

    #[test]
    fn defaults_with_only_the_url() {
        let c = read(&[(DOWNSTREAM_URL.name, "http://127.0.0.1:9000/ingest")]).unwrap();
        assert_eq!(c.delivery.url.as_str(), "http://127.0.0.1:9000/ingest");
        assert_eq!(c.delivery.timeout, Duration::from_secs(10));
        assert_eq!(c.handler.batch.concurrency, 10);
        assert_eq!(c.handler.batch.max_receive_count, None);
        assert_eq!(c.handler.batch.retry.max_attempts, 3);
        assert_eq!(c.handler.deadline_margin, Duration::from_secs(2));
        assert!(!c.handler.batch.skip_group_on_error);
    }

    #[test]
    fn breaker_and_idempotency_keys_are_the_functions_own_unless_named() {
        let url = (DOWNSTREAM_URL.name, "http://127.0.0.1:9000/ingest");
        let tables = [
            (BREAKER_TABLE.name, "shared"),
            (IDEMPOTENCY_TABLE.name, "shared"),
        ];
        let keys = |vars: &[(&str, &str)]| {
            let mut all = vec![url];
            all.extend_from_slice(&tables);
            all.extend_from_slice(vars);
            let handler = read(&all).unwrap().handler;
            (
                handler.breaker.unwrap().key,
                handler.idempotency.unwrap().key_prefix,
            )
        };
        // Two functions sharing the tables keep apart by default.
        assert_eq!(
            keys(&[("AWS_LAMBDA_FUNCTION_NAME", "orders")]),
            ("breaker#orders".to_string(), "orders#".to_string())
        );
        assert_eq!(
            keys(&[("AWS_LAMBDA_FUNCTION_NAME", "audit")]),
            ("breaker#audit".to_string(), "audit#".to_string())
        );
        // Named: shared on purpose (the template gives the redrive function the worker's).
        assert_eq!(
            keys(&[
                ("AWS_LAMBDA_FUNCTION_NAME", "stack-redrive"),
                (BREAKER_KEY.name, "breaker#stack-worker"),
                (IDEMPOTENCY_KEY_PREFIX.name, "stack-worker#"),
            ]),
            (
                "breaker#stack-worker".to_string(),
                "stack-worker#".to_string()
            )
        );
        // Outside Lambda.
        assert_eq!(keys(&[]), (BREAKER_ID.to_string(), String::new()));
    }

    #[test]
    fn every_setting_is_read() {
        let c = read(&[
            (DOWNSTREAM_URL.name, "https://example.com/x"),
            (DOWNSTREAM_TIMEOUT_MS.name, "1500"),
            (ITEM_ID_SOURCE.name, "pointer:/id"),
            (BODY_FORMAT.name, "text"),
            (MAX_CONCURRENCY.name, "50"),
            (MAX_RECEIVE_COUNT.name, "5"),
            (RECEIVE_BUDGET_MARGIN.name, "1"),
            (RETRY_MAX_ATTEMPTS.name, "4"),
            (RETRY_BASE_DELAY_MS.name, "50"),
            (RETRY_MAX_DELAY_MS.name, "800"),
            (RETRY_UNKNOWN_ERRORS.name, "true"),
            (DEADLINE_MARGIN_MS.name, "3000"),
            (SKIP_GROUP_ON_ERROR.name, "true"),
        ])
        .unwrap();
        assert_eq!(c.delivery.timeout, Duration::from_millis(1500));
        assert_eq!(
            c.handler.batch.parser.id_source,
            ItemIdSource::JsonPointer("/id".into())
        );
        assert_eq!(c.handler.batch.parser.body_format, BodyFormat::Text);
        assert_eq!(c.handler.batch.concurrency, 50);
        assert_eq!(c.handler.batch.max_receive_count, Some(5));
        assert_eq!(c.handler.batch.receive_budget_margin, 1);
        assert_eq!(c.handler.batch.retry.max_attempts, 4);
        assert!(c.handler.batch.retry.retry_unknown);
        assert!(c.handler.batch.skip_group_on_error);
        assert_eq!(c.handler.deadline_margin, Duration::from_secs(3));
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let err = read(&[
            (DOWNSTREAM_TIMEOUT_MS.name, "soon"),
            (MAX_CONCURRENCY.name, "0"),
            (MAX_RECEIVE_COUNT.name, "1001"),
            (RETRY_UNKNOWN_ERRORS.name, "yes"),
            (ITEM_ID_SOURCE.name, "pointer:id"),
        ])
        .unwrap_err();
        let vars: Vec<&str> = err.problems.iter().map(|p| p.variable.as_str()).collect();
        assert_eq!(
            vars,
            [
                DOWNSTREAM_URL.name,
                DOWNSTREAM_TIMEOUT_MS.name,
                ITEM_ID_SOURCE.name,
                MAX_CONCURRENCY.name,
                MAX_RECEIVE_COUNT.name,
                RETRY_UNKNOWN_ERRORS.name
            ]
        );
        let text = err.to_string();
        assert!(
            text.contains("WORKER_DOWNSTREAM_URL: is not set; expected an http:// or https:// URL"),
            "{text}"
        );
        assert!(
            text.contains(
                "WORKER_MAX_CONCURRENCY: 0 is out of range; expected an integer from 1 to 1000"
            ),
            "{text}"
        );
        assert!(text.contains("expected true or false"), "{text}");
    }

    #[test]
    fn store_variables_go_together() {
        let none = read(&[(DOWNSTREAM_URL.name, "http://x")]).unwrap();
        assert_eq!(none.handler.store, None);
        let full = read(&[
            (DOWNSTREAM_URL.name, "http://x"),
            ("DLQ_TABLE", "t"),
            ("DLQ_QUEUE_URL", "http://q"),
            ("DLQ_BUCKET", "b"),
            ("DLQ_RETENTION_DAYS", "30"),
        ])
        .unwrap();
        let store = full.handler.store.unwrap();
        assert_eq!(store.table, "t");
        assert_eq!(store.retention, Duration::from_secs(30 * 86_400));
        assert_eq!(store.inline_max_bytes, 65_536);
        let err = read(&[(DOWNSTREAM_URL.name, "http://x"), ("DLQ_TABLE", "t")]).unwrap_err();
        let vars: Vec<_> = err.problems.iter().map(|p| p.variable.as_str()).collect();
        assert_eq!(vars, ["DLQ_QUEUE_URL", "DLQ_BUCKET"]);
    }

    #[test]
    fn bad_url_and_inverted_delays() {
        let err = read(&[
            (DOWNSTREAM_URL.name, "ftp://example.com"),
            (RETRY_BASE_DELAY_MS.name, "5000"),
            (RETRY_MAX_DELAY_MS.name, "100"),
        ])
        .unwrap_err();
        assert_eq!(err.problems.len(), 2, "{err}");
        assert!(err.to_string().contains("scheme \"ftp\""));
        let err = read(&[(DOWNSTREAM_URL.name, "not a url")]).unwrap_err();
        assert_eq!(err.problems[0].variable, DOWNSTREAM_URL.name);
    }

    #[test]
    fn the_url_is_never_quoted_with_its_query_or_credentials() {
        let err = read(&[(DOWNSTREAM_URL.name, "https://h:99999/in?api_key=s3cret")]).unwrap_err();
        let text = err.to_string();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(
            text.contains("\"https://h:99999/in?<redacted>\" is not valid"),
            "{text}"
        );

        let err = read(&[(DOWNSTREAM_URL.name, "https://svc:s3cret@h/in")]).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert_eq!(err.problems[0].variable, DOWNSTREAM_URL.name);
        let text = err.to_string();
        assert!(!text.contains("s3cret") && !text.contains("svc"), "{text}");
        assert!(text.contains("carries credentials"), "{text}");
        assert!(text.contains(DOWNSTREAM_AUTH_HEADER.name), "{text}");
        assert!(text.contains(DOWNSTREAM_AUTH_SECRET.name), "{text}");
        let err = read(&[(DOWNSTREAM_URL.name, "https://token@h/in")]).unwrap_err();
        assert!(err.to_string().contains("carries credentials"), "{err}");

        // A query alone is allowed (some APIs want one), and kept for the request.
        let c = read(&[(DOWNSTREAM_URL.name, "https://h/in?api_key=s3cret")]).unwrap();
        assert_eq!(c.delivery.url.query(), Some("api_key=s3cret"));
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn auth_header_and_secret_go_together() {
        let url = (DOWNSTREAM_URL.name, "https://h/in");
        let none = read(&[url]).unwrap();
        assert_eq!(none.downstream_auth, None);
        assert_eq!(none.delivery.auth_header, None);
        let both = read(&[
            url,
            (DOWNSTREAM_AUTH_HEADER.name, "X-Api-Key"),
            (
                DOWNSTREAM_AUTH_SECRET.name,
                "arn:aws:secretsmanager:us-east-1:1:secret:k",
            ),
        ])
        .unwrap();
        let auth = both.downstream_auth.unwrap();
        assert_eq!(auth.header.as_str(), "x-api-key");
        assert_eq!(
            auth.secret_id,
            "arn:aws:secretsmanager:us-east-1:1:secret:k"
        );
        // Read at start-up, not here.
        assert_eq!(both.delivery.auth_header, None);

        for (vars, missing) in [
            (
                vec![(DOWNSTREAM_AUTH_HEADER.name, "Authorization")],
                DOWNSTREAM_AUTH_SECRET.name,
            ),
            (
                vec![(DOWNSTREAM_AUTH_SECRET.name, "k")],
                DOWNSTREAM_AUTH_HEADER.name,
            ),
        ] {
            let mut all = vec![url, (MAX_CONCURRENCY.name, "0")];
            all.extend(vars);
            let err = read(&all).unwrap_err();
            let named: Vec<_> = err.problems.iter().map(|p| p.variable.as_str()).collect();
            // Reported with every other problem.
            assert!(named.contains(&MAX_CONCURRENCY.name), "{err}");
            assert!(named.contains(&missing), "{err}");
            assert!(err.to_string().contains("go together"), "{err}");
        }
        for bad in ["bad header", "Content-Type", "x-item-id"] {
            let err = read(&[
                url,
                (DOWNSTREAM_AUTH_HEADER.name, bad),
                (DOWNSTREAM_AUTH_SECRET.name, "k"),
            ])
            .unwrap_err();
            assert_eq!(err.problems.len(), 1, "{bad}: {err}");
            assert_eq!(
                err.problems[0].variable, DOWNSTREAM_AUTH_HEADER.name,
                "{bad}"
            );
        }
    }

    #[test]
    fn payload_cap_and_buckets() {
        let url = (DOWNSTREAM_URL.name, "https://h/in");
        let c = read(&[url]).unwrap();
        assert_eq!(c.handler.payload.max_bytes, 33_554_432);
        assert!(c.handler.payload.allowed_buckets.is_empty());
        let c = read(&[
            url,
            (PAYLOAD_MAX_BYTES.name, "1024"),
            (PAYLOAD_BUCKETS.name, " producer-a , producer.b,,"),
        ])
        .unwrap();
        assert_eq!(c.handler.payload.max_bytes, 1024);
        assert_eq!(
            c.handler.payload.allowed_buckets.iter().collect::<Vec<_>>(),
            ["producer-a", "producer.b"]
        );
        assert_eq!(
            read(&[url, (PAYLOAD_MAX_BYTES.name, "2147483648")])
                .unwrap()
                .handler
                .payload
                .max_bytes,
            2_147_483_648
        );
        for (variable, value) in [
            (PAYLOAD_MAX_BYTES.name, "1023"),
            (PAYLOAD_MAX_BYTES.name, "2147483649"),
            (PAYLOAD_BUCKETS.name, "ok-bucket,Upper"),
            (PAYLOAD_BUCKETS.name, "s3://bucket"),
            (PAYLOAD_BUCKETS.name, "ab"),
        ] {
            let err = read(&[url, (variable, value)]).unwrap_err();
            assert_eq!(err.problems.len(), 1, "{value}: {err}");
            assert_eq!(err.problems[0].variable, variable, "{value}");
        }
    }

    #[test]
    fn the_redrive_configuration_takes_the_workers_retries_and_its_own_variables() {
        let map: HashMap<&str, &str> = HashMap::from([
            (DOWNSTREAM_URL.name, "http://127.0.0.1:9000/ingest"),
            (RETRY_MAX_ATTEMPTS.name, "7"),
            (ITEM_ID_SOURCE.name, "pointer:/id"),
            (KEEP_PAYLOADS.name, "true"),
            (SOURCE_QUEUE_URL.name, "https://sqs.example/q"),
            ("AWS_LAMBDA_FUNCTION_NAME", "redrive"),
        ]);
        let lookup = |name: &str| map.get(name).map(|v| v.to_string());
        let mut env = EnvReader::new(&lookup);
        let config = RedriveConfig::read(&mut env);
        env.finish().unwrap();
        assert_eq!(config.settings.retry.max_attempts, 7);
        assert!(config.settings.keep_payloads);
        assert_eq!(
            config.settings.source_queue_url.as_deref(),
            Some("https://sqs.example/q")
        );
        assert_eq!(
            config.settings.parser.id_source,
            ItemIdSource::JsonPointer("/id".into())
        );
        assert_eq!(
            config.settings.invocation.function_name.as_deref(),
            Some("redrive")
        );
        assert!(config.processor.is_some());
        // Without a downstream: requeue only, default retries, and bad values still named.
        let map: HashMap<&str, &str> = HashMap::from([(KEEP_PAYLOADS.name, "yes")]);
        let lookup = |name: &str| map.get(name).map(|v| v.to_string());
        let mut env = EnvReader::new(&lookup);
        let config = RedriveConfig::read(&mut env);
        assert!(config.processor.is_none());
        let err = env.finish().unwrap_err();
        assert_eq!(err.problems[0].variable, KEEP_PAYLOADS.name);
    }

    #[test]
    fn no_variable_is_named_outside_the_registry() {
        // The readers name variables through `vars` only: a literal name in a reader would
        // be a variable without a meaning, default or template check.
        let sources = [
            include_str!("mod.rs"),
            include_str!("../../../aws/src/store/mod.rs"),
            include_str!("../redrive_function.rs"),
            include_str!("../worker.rs"),
        ];
        let mut literals = Vec::new();
        for source in sources {
            // The code, not its tests (which quote names in expected messages).
            let source = source
                .split("#[cfg(test)]")
                .next()
                .and_then(|code| code.split("#[cfg(all(test,").next())
                .unwrap_or_default();
            for prefix in ["\"WORKER_", "\"DLQ_", "\"REDRIVE_"] {
                for (at, _) in source.match_indices(prefix) {
                    let name: String = source[at + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                        .collect();
                    literals.push(name);
                }
            }
        }
        assert!(
            literals.is_empty(),
            "named outside config::vars: {literals:?}"
        );
        assert_eq!(
            WorkerConfig::documented_variables().len(),
            WORKER_VARS.len() + STORE_VARS.len(),
            "no duplicates"
        );
    }
}
