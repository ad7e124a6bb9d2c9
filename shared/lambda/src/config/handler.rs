//! A handler's configuration ([`HandlerConfig`]): the batch engine, retries, spacing, the breaker,
//! idempotency, item ids and envelopes, the payload policy and the dead-letter store, read from
//! the variables of [`super::vars`].

use super::*;

/// Tells whether `name` is a valid S3 bucket name: 3 to 63 lowercase letters, digits, dots and
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
///
/// Every variable is read at once, and every bad one is reported together, by name:
///
/// ```
/// use std::collections::HashMap;
/// use sqs_keeper_lambda::config::HandlerConfig;
///
/// let vars = HashMap::from([
///     ("WORKER_RETRY_MAX_ATTEMPTS", "three"),
///     ("WORKER_ITEM_ID_SOURCE", "pointer:/order_id"),
/// ]);
/// let read = HandlerConfig::from_lookup(&|name| vars.get(name).map(|v| v.to_string()));
/// let error = read.unwrap_err().to_string();
/// assert!(error.contains("WORKER_RETRY_MAX_ATTEMPTS"), "{error}");
///
/// let vars = HashMap::from([("WORKER_ITEM_ID_SOURCE", "pointer:/order_id")]);
/// let config = HandlerConfig::from_lookup(&|name| vars.get(name).map(|v| v.to_string()));
/// assert!(config.is_ok());
/// ```
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
    pub store: Option<sqs_keeper_aws::StoreConfig>,
    /// The metrics' namespace and dimensions.
    pub metrics: crate::metric_names::MetricNames,
    /// Read the store's table, DLQ and bucket once at start-up, and refuse to start when one
    /// fails (`DLQ_CHECK_AT_START`).
    pub check_store_at_start: bool,
    /// The idempotency table, when one is configured.
    pub idempotency: Option<IdempotencyConfig>,
    /// Spaced redelivery of records returned for retry; `None` when off.
    pub redelivery: Option<sqs_keeper_core::redelivery::RedeliveryPolicy>,
    /// The shared circuit breaker; `None` when off.
    pub breaker: Option<BreakerConfig>,
}

/// `WORKER_BREAKER_TABLE`, its key and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// The table.
    pub table: String,
    /// The breaker's item: one breaker per key (`WORKER_BREAKER_KEY`).
    pub key: String,
    /// When it opens and for how long.
    pub policy: sqs_keeper_core::breaker::BreakerPolicy,
    /// One breaker per message group (`WORKER_BREAKER_SCOPE=message-group`), each under
    /// [`sqs_keeper_core::breaker::group_key`] of `key`; else one for the function.
    pub per_group: bool,
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

/// Returns the breaker key of a function that names none: its own, so that two functions sharing
/// a table do not share a breaker (outside Lambda: [`BREAKER_ID`]).
fn default_breaker_key(function: Option<&str>) -> String {
    function.map_or_else(|| BREAKER_ID.to_string(), |name| format!("breaker#{name}"))
}

/// Returns the idempotency key prefix of a function that names none: its name and `#`, as
/// Powertools prefixes its keys with the function's (outside Lambda: none).
fn default_idempotency_prefix(function: Option<&str>) -> String {
    function.map_or_else(String::new, |name| format!("{name}#"))
}

/// Why an idempotency key could name a circuit breaker's item, when the two share a table
/// (both key their items by `id`): a key is the prefix and an item id, which is data, so
/// no breaker key (this function's, its pause marker's, any function's `breaker#...`) may
/// start with the prefix, nor the prefix with `breaker#`.
fn shared_table_clash(prefix: &str, breaker_key: &str) -> Option<String> {
    // Every item of the breaker's family starts with its key (the key itself, its pause
    // marker `<key>#polling`, a group's `<key>#group#<group>`): a clash is either of the
    // two a prefix of the other.
    let breakers = "breaker#";
    (breaker_key.starts_with(prefix)
        || prefix.starts_with(breaker_key)
        || breakers.starts_with(prefix)
        || prefix.starts_with(breakers))
    .then(|| {
        format!(
            "idempotency keys start with {prefix:?} and share their table with the circuit breaker's item {breaker_key:?} (and every breaker#... item): an item id could name a breaker item; set {IDEMPOTENCY_KEY_PREFIX} to a prefix of its own (a function named `breaker` needs one), or give the breaker a table of its own"
        )
    })
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
        // Read by the logging set-up (`telemetry::LogSettings`); checked here so that a bad
        // value fails the start-up with every other problem.
        let _ = env.text_or_default::<crate::telemetry::RecordLines>(&LOG_RECORDS);
        let concurrency = env.integer(&MAX_CONCURRENCY);
        let max_receive_count = env
            .integer_if_set(&MAX_RECEIVE_COUNT)
            .map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        let margin = env.integer(&RECEIVE_BUDGET_MARGIN);
        let retry = read_retry(env);
        let deadline_margin = env.integer(&DEADLINE_MARGIN_MS);
        let skip_group_on_error = env.flag(&SKIP_GROUP_ON_ERROR);
        let payload = read_payload_policy(env);
        let store = read_store_config(env);
        let check_store_at_start = env.flag(&CHECK_AT_START);
        let metrics = crate::metric_names::MetricNames::read(env);
        let idempotency_table: Option<String> = env.optional(&IDEMPOTENCY_TABLE);
        let idempotency_ttl = env.integer(&IDEMPOTENCY_TTL_SECS);
        let redelivery = read_redelivery(env);
        let breaker_table: Option<String> = env.optional(&BREAKER_TABLE);
        let (breaker_key, idempotency_prefix) =
            read_keys(env, breaker_table.as_deref(), idempotency_table.as_deref());
        let breaker = read_breaker(env);
        HandlerConfig {
            breaker: breaker_table.map(|table| breaker(table, breaker_key)),
            redelivery,
            store,
            check_store_at_start,
            metrics,
            payload,
            batch: BatchConfig {
                parser: ItemParser {
                    id_source,
                    body_format,
                    envelope,
                },
                retry,
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

/// Returns the retry policy within an invocation: attempts, backoff, and the per-class budgets.
fn read_retry(env: &mut EnvReader<'_>) -> RetryPolicy {
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
    let attempts_by_class: sqs_keeper_core::retry::ClassAttempts =
        env.optional(&RETRY_ATTEMPTS_BY_CLASS).unwrap_or_default();
    let retry_after_free = env.flag(&RETRY_AFTER_FREE);
    // A budget for a class that is never retried would be silently without effect.
    for class in attempts_by_class.by_class.keys() {
        if !class.is_retryable(retry_unknown) {
            let unless = if *class == sqs_keeper_core::ErrorClass::Unknown {
                ", unless WORKER_RETRY_UNKNOWN_ERRORS=true"
            } else {
                ""
            };
            env.problem(
                RETRY_ATTEMPTS_BY_CLASS.name,
                format!("{class} is never retried (a permanent class{unless}): a budget for it has no effect"),
            );
        }
    }
    RetryPolicy {
        max_attempts: u32::try_from(max_attempts).unwrap_or(u32::MAX),
        base_delay: Duration::from_millis(base_delay),
        max_delay: Duration::from_millis(max_delay),
        retry_unknown,
        jitter: Jitter::Full,
        class_attempts: sqs_keeper_core::retry::ClassAttempts {
            retry_after_free,
            ..attempts_by_class
        },
        ..RetryPolicy::default()
    }
}

/// Spaced redelivery, on when its base delay is above zero.
fn read_redelivery(
    env: &mut EnvReader<'_>,
) -> Option<sqs_keeper_core::redelivery::RedeliveryPolicy> {
    let base = env.integer(&REDELIVERY_BASE_SECS);
    let multiplier = env.integer(&REDELIVERY_MULTIPLIER);
    let max = env.integer(&REDELIVERY_MAX_SECS);
    (base > 0).then(|| sqs_keeper_core::redelivery::RedeliveryPolicy {
        base: Duration::from_secs(base),
        multiplier: u32::try_from(multiplier).unwrap_or(u32::MAX),
        max: Duration::from_secs(max.max(base)),
    })
}

/// Returns the breaker's item key and the idempotency keys' prefix, each defaulting to the
/// function's name. Refuses a prefix that could name a breaker item in a shared table.
fn read_keys(
    env: &mut EnvReader<'_>,
    breaker_table: Option<&str>,
    idempotency_table: Option<&str>,
) -> (String, String) {
    let function = env.lambda_variable("AWS_LAMBDA_FUNCTION_NAME");
    let breaker_key: String = env
        .optional(&BREAKER_KEY)
        .unwrap_or_else(|| default_breaker_key(function.as_deref()));
    let idempotency_prefix: String = env
        .optional(&IDEMPOTENCY_KEY_PREFIX)
        .unwrap_or_else(|| default_idempotency_prefix(function.as_deref()));
    if breaker_table.is_some() && breaker_table == idempotency_table {
        if let Some(reason) = shared_table_clash(&idempotency_prefix, &breaker_key) {
            env.problem(IDEMPOTENCY_KEY_PREFIX.name, reason);
        }
    }
    (breaker_key, idempotency_prefix)
}

/// Returns the breaker's policy and scope; what it returns builds the breaker's configuration
/// for its table and key.
fn read_breaker(env: &mut EnvReader<'_>) -> impl FnOnce(String, String) -> BreakerConfig {
    let threshold = env.integer(&BREAKER_THRESHOLD);
    let window = env.integer(&BREAKER_WINDOW_SECS);
    let open_for = Duration::from_secs(env.integer(&BREAKER_OPEN_SECS));
    let per_group = match env.text_or_default::<String>(&BREAKER_SCOPE).as_deref() {
        Some("message-group") => true,
        Some("function") | None => false,
        Some(other) => {
            let expected = BREAKER_SCOPE.expected();
            env.problem(
                BREAKER_SCOPE.name,
                format!("{other:?} is not valid; expected {expected}"),
            );
            false
        }
    };
    move |table, key| BreakerConfig {
        table,
        key,
        policy: sqs_keeper_core::breaker::BreakerPolicy {
            threshold: u32::try_from(threshold).unwrap_or(u32::MAX),
            window: Duration::from_secs(window),
            open_for,
            max_open: open_for
                .saturating_mul(16)
                .min(sqs_keeper_core::redelivery::MAX_VISIBILITY),
            probe_for: Duration::from_secs(60),
            refresh: Duration::from_secs(1),
        },
        per_group,
    }
}

/// Reads `WORKER_ITEM_ID_SOURCE` and `WORKER_ENVELOPE`, the same for the worker and the
/// redrive engine. With an envelope and no id source set, the item id is the event's own.
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

/// Reads `WORKER_ITEM_ID_SOURCE`, the same for the worker and the redrive engine.
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
        (Some(table), Some(queue_url), Some(bucket)) => {
            let mut config = StoreConfig::new(&table, &queue_url, &bucket);
            config.inline_max_bytes = usize::try_from(inline).unwrap_or(usize::MAX);
            config.retention = Duration::from_secs(days.saturating_mul(86_400));
            Some(config)
        }
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
