//! Worker configuration from environment variables, validated all at once: every missing
//! or malformed variable is named in one error, with the form it expects.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::batch::BatchConfig;
use crate::item::{BodyFormat, ItemIdSource, ItemParser};
use crate::processor::{redact_url, redact_url_text, HttpDeliveryConfig};
use crate::retry::{Jitter, RetryPolicy};
use crate::store::payload::{PayloadPolicy, DEFAULT_PAYLOAD_MAX_BYTES};

/// Every variable the worker reads, with its meaning; the infra template must set the same set.
pub const WORKER_ENV_VARS: &[(&str, &str)] = &[
    (
        DOWNSTREAM_URL,
        "required; http(s) URL each item body is POSTed to",
    ),
    (
        DOWNSTREAM_TIMEOUT_MS,
        "per-request timeout in ms (default 10000)",
    ),
    (
        DOWNSTREAM_CONTENT_TYPE,
        "Content-Type of the POST (default application/json)",
    ),
    (
        DOWNSTREAM_AUTH_HEADER,
        "header carrying the downstream credential, e.g. Authorization or x-api-key (with WORKER_DOWNSTREAM_AUTH_SECRET)",
    ),
    (
        DOWNSTREAM_AUTH_SECRET,
        "Secrets Manager secret id or ARN whose SecretString is that header's value, read once at start-up",
    ),
    (
        ITEM_ID_SOURCE,
        "message-id | pointer:/json/pointer | attribute:Name (default message-id)",
    ),
    (BODY_FORMAT, "json | text (default json)"),
    (
        MAX_CONCURRENCY,
        "records processed at once, 1-1000 (default 10)",
    ),
    (
        MAX_RECEIVE_COUNT,
        "source queue maxReceiveCount, 1-1000 (unset: leave exhausted retries to SQS)",
    ),
    (
        RECEIVE_BUDGET_MARGIN,
        "dead-letter this many deliveries early (default 0)",
    ),
    (
        RETRY_MAX_ATTEMPTS,
        "attempts per record per invocation, 1-20 (default 3)",
    ),
    (
        RETRY_BASE_DELAY_MS,
        "first backoff delay in ms (default 100)",
    ),
    (RETRY_MAX_DELAY_MS, "backoff cap in ms (default 2000)"),
    (
        RETRY_UNKNOWN_ERRORS,
        "true | false: retry errors of class unknown (default false)",
    ),
    (
        DEADLINE_MARGIN_MS,
        "stop starting records this long before the deadline (default 2000)",
    ),
    (
        SKIP_GROUP_ON_ERROR,
        "true | false: FIFO holds back only the failed group (default false)",
    ),
    (
        PAYLOAD_MAX_BYTES,
        "largest SQS Extended Client payload read from S3, 1024-2147483648 (default 33554432)",
    ),
    (
        PAYLOAD_BUCKETS,
        "comma-separated buckets Extended Client pointers may name, besides DLQ_BUCKET (default none)",
    ),
];

/// `WORKER_DOWNSTREAM_URL`
pub const DOWNSTREAM_URL: &str = "WORKER_DOWNSTREAM_URL";
/// `WORKER_DOWNSTREAM_TIMEOUT_MS`
pub const DOWNSTREAM_TIMEOUT_MS: &str = "WORKER_DOWNSTREAM_TIMEOUT_MS";
/// `WORKER_DOWNSTREAM_CONTENT_TYPE`
pub const DOWNSTREAM_CONTENT_TYPE: &str = "WORKER_DOWNSTREAM_CONTENT_TYPE";
/// `WORKER_DOWNSTREAM_AUTH_HEADER`
pub const DOWNSTREAM_AUTH_HEADER: &str = "WORKER_DOWNSTREAM_AUTH_HEADER";
/// `WORKER_DOWNSTREAM_AUTH_SECRET`
pub const DOWNSTREAM_AUTH_SECRET: &str = "WORKER_DOWNSTREAM_AUTH_SECRET";
/// `WORKER_ITEM_ID_SOURCE`
pub const ITEM_ID_SOURCE: &str = "WORKER_ITEM_ID_SOURCE";
/// `WORKER_BODY_FORMAT`
pub const BODY_FORMAT: &str = "WORKER_BODY_FORMAT";
/// `WORKER_MAX_CONCURRENCY`
pub const MAX_CONCURRENCY: &str = "WORKER_MAX_CONCURRENCY";
/// `WORKER_MAX_RECEIVE_COUNT`
pub const MAX_RECEIVE_COUNT: &str = "WORKER_MAX_RECEIVE_COUNT";
/// `WORKER_RECEIVE_BUDGET_MARGIN`
pub const RECEIVE_BUDGET_MARGIN: &str = "WORKER_RECEIVE_BUDGET_MARGIN";
/// `WORKER_RETRY_MAX_ATTEMPTS`
pub const RETRY_MAX_ATTEMPTS: &str = "WORKER_RETRY_MAX_ATTEMPTS";
/// `WORKER_RETRY_BASE_DELAY_MS`
pub const RETRY_BASE_DELAY_MS: &str = "WORKER_RETRY_BASE_DELAY_MS";
/// `WORKER_RETRY_MAX_DELAY_MS`
pub const RETRY_MAX_DELAY_MS: &str = "WORKER_RETRY_MAX_DELAY_MS";
/// `WORKER_RETRY_UNKNOWN_ERRORS`
pub const RETRY_UNKNOWN_ERRORS: &str = "WORKER_RETRY_UNKNOWN_ERRORS";
/// `WORKER_DEADLINE_MARGIN_MS`
pub const DEADLINE_MARGIN_MS: &str = "WORKER_DEADLINE_MARGIN_MS";
/// `WORKER_SKIP_GROUP_ON_ERROR`
pub const SKIP_GROUP_ON_ERROR: &str = "WORKER_SKIP_GROUP_ON_ERROR";
/// `WORKER_PAYLOAD_MAX_BYTES`
pub const PAYLOAD_MAX_BYTES: &str = "WORKER_PAYLOAD_MAX_BYTES";
/// `WORKER_PAYLOAD_BUCKETS`
pub const PAYLOAD_BUCKETS: &str = "WORKER_PAYLOAD_BUCKETS";

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

    /// Notes a problem with `variable`.
    pub fn problem(&mut self, variable: &str, problem: impl Into<String>) {
        self.problems.push(ConfigProblem {
            variable: variable.to_string(),
            problem: problem.into(),
        });
    }

    /// The variable's trimmed value; `None` when unset or blank.
    pub fn raw(&self, variable: &str) -> Option<String> {
        (self.lookup)(variable)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// A required variable parsed with `FromStr`.
    pub fn required<T: FromStr>(&mut self, variable: &str, expected: &str) -> Option<T>
    where
        T::Err: fmt::Display,
    {
        match self.raw(variable) {
            Some(_) => self.optional(variable, expected),
            None => {
                self.problem(variable, format!("is not set; expected {expected}"));
                None
            }
        }
    }

    /// An optional variable parsed with `FromStr`; `None` when unset or bad (bad is noted).
    pub fn optional<T: FromStr>(&mut self, variable: &str, expected: &str) -> Option<T>
    where
        T::Err: fmt::Display,
    {
        let raw = self.raw(variable)?;
        match raw.parse::<T>() {
            Ok(value) => Some(value),
            Err(e) => {
                self.problem(
                    variable,
                    format!("{raw:?} is not valid ({e}); expected {expected}"),
                );
                None
            }
        }
    }

    /// An optional integer that must lie in `range`.
    pub fn ranged(
        &mut self,
        variable: &str,
        range: std::ops::RangeInclusive<u64>,
        default: u64,
    ) -> u64 {
        let expected = format!("an integer from {} to {}", range.start(), range.end());
        match self.optional::<u64>(variable, &expected) {
            Some(v) if range.contains(&v) => v,
            Some(v) => {
                self.problem(
                    variable,
                    format!("{v} is out of range; expected {expected}"),
                );
                default
            }
            None => default,
        }
    }

    /// An optional `true`/`false`.
    pub fn flag(&mut self, variable: &str, default: bool) -> bool {
        match self.raw(variable).as_deref() {
            None => default,
            Some("true") => true,
            Some("false") => false,
            Some(other) => {
                self.problem(
                    variable,
                    format!("{other:?} is not valid; expected true or false"),
                );
                default
            }
        }
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
/// secret holding its value (read at start-up, see [`crate::secrets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownstreamAuth {
    /// The header, e.g. `authorization` or `x-api-key`.
    pub header: reqwest::header::HeaderName,
    /// The secret's id or ARN.
    pub secret_id: String,
}

/// Headers [`crate::HttpDelivery`] sets itself; a credential may not replace them.
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
fn read_downstream_auth(env: &mut EnvReader<'_>) -> Option<DownstreamAuth> {
    let header: Option<String> = env.optional(DOWNSTREAM_AUTH_HEADER, "an HTTP header name");
    let secret_id: Option<String> =
        env.optional(DOWNSTREAM_AUTH_SECRET, "a Secrets Manager secret id or ARN");
    let header = header.and_then(|name| {
        match reqwest::header::HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) if RESERVED_HEADERS.contains(&h.as_str()) => {
                env.problem(
                    DOWNSTREAM_AUTH_HEADER,
                    format!("{name:?} is a header the worker sets itself; expected another name, e.g. Authorization or x-api-key"),
                );
                None
            }
            Ok(h) => Some(h),
            Err(_) => {
                env.problem(
                    DOWNSTREAM_AUTH_HEADER,
                    format!("{name:?} is not an HTTP header name; expected e.g. Authorization or x-api-key"),
                );
                None
            }
        }
    });
    let together = format!("{DOWNSTREAM_AUTH_HEADER} and {DOWNSTREAM_AUTH_SECRET} go together");
    match (header, secret_id, env.raw(DOWNSTREAM_AUTH_HEADER).is_some()) {
        (Some(header), Some(secret_id), _) => Some(DownstreamAuth { header, secret_id }),
        (None, Some(_), false) => {
            env.problem(DOWNSTREAM_AUTH_HEADER, format!("is not set; {together}"));
            None
        }
        (Some(_), None, _) => {
            env.problem(DOWNSTREAM_AUTH_SECRET, format!("is not set; {together}"));
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
    let max_bytes = env.ranged(
        PAYLOAD_MAX_BYTES,
        1024..=2_147_483_648,
        DEFAULT_PAYLOAD_MAX_BYTES,
    );
    let mut allowed_buckets = std::collections::BTreeSet::new();
    for name in env
        .raw(PAYLOAD_BUCKETS)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        if is_bucket_name(name) {
            allowed_buckets.insert(name.to_string());
        } else {
            env.problem(
                PAYLOAD_BUCKETS,
                format!("{name:?} is not a bucket name; expected comma-separated S3 bucket names"),
            );
        }
    }
    PayloadPolicy {
        max_bytes,
        allowed_buckets,
    }
}

/// Everything the worker function needs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The HTTP delivery processor. Its credential header, if any, is filled in by
    /// [`WorkerConfig::resolve_downstream_auth`] at start-up.
    pub delivery: HttpDeliveryConfig,
    /// Where the downstream credential comes from, when one is configured.
    pub downstream_auth: Option<DownstreamAuth>,
    /// What SQS Extended Client pointers may make the worker read (the store's bucket is
    /// added at start-up).
    pub payload: PayloadPolicy,
    /// The batch engine.
    pub batch: BatchConfig,
    /// Safety margin before the invocation deadline.
    pub deadline_margin: Duration,
    /// Where dead-lettered items go; `None` when no store is configured.
    pub store: Option<crate::store::StoreConfig>,
}

/// `WORKER_DOWNSTREAM_URL`: an http(s) URL without credentials in it. The value is only
/// ever quoted redacted (a query string may hold an API key), and a `user:password@` is
/// refused: credentials belong in a header, from Secrets Manager.
fn read_downstream_url(env: &mut EnvReader<'_>) -> Option<reqwest::Url> {
    let raw: String = env.required(DOWNSTREAM_URL, "an http:// or https:// URL")?;
    let url = match raw.parse::<reqwest::Url>() {
        Ok(url) => url,
        Err(e) => {
            env.problem(
                DOWNSTREAM_URL,
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
            DOWNSTREAM_URL,
            format!(
                "scheme {:?} is not supported; expected http or https",
                url.scheme()
            ),
        );
        return None;
    }
    if !url.username().is_empty() || url.password().is_some() {
        env.problem(
            DOWNSTREAM_URL,
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

impl WorkerConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads any variable lookup (for tests).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut env = EnvReader::new(lookup);
        let config = Self::read(&mut env);
        env.finish()?;
        config.ok_or_else(|| ConfigError {
            problems: Vec::new(),
        })
    }

    /// Reads the worker's variables into `env`, noting problems there.
    pub fn read(env: &mut EnvReader<'_>) -> Option<Self> {
        let url = read_downstream_url(env);
        let timeout = env.ranged(DOWNSTREAM_TIMEOUT_MS, 1..=900_000, 10_000);
        let content_type = env
            .optional::<String>(DOWNSTREAM_CONTENT_TYPE, "a media type")
            .unwrap_or_else(|| "application/json".to_string());
        let downstream_auth = read_downstream_auth(env);
        let id_source = env
            .optional::<ItemIdSource>(
                ITEM_ID_SOURCE,
                "message-id, pointer:/path or attribute:Name",
            )
            .unwrap_or(ItemIdSource::MessageId);
        let body_format = env
            .optional::<BodyFormat>(BODY_FORMAT, "json or text")
            .unwrap_or(BodyFormat::Json);
        let concurrency = env.ranged(MAX_CONCURRENCY, 1..=1000, 10);
        let max_receive_count = env
            .optional::<u32>(MAX_RECEIVE_COUNT, "an integer from 1 to 1000")
            .filter(|v| {
                let ok = (1..=1000).contains(v);
                if !ok {
                    env.problem(
                        MAX_RECEIVE_COUNT,
                        format!("{v} is out of range; expected an integer from 1 to 1000"),
                    );
                }
                ok
            });
        let margin = env.ranged(RECEIVE_BUDGET_MARGIN, 0..=999, 0);
        let max_attempts = env.ranged(RETRY_MAX_ATTEMPTS, 1..=20, 3);
        let base_delay = env.ranged(RETRY_BASE_DELAY_MS, 0..=60_000, 100);
        let max_delay = env.ranged(RETRY_MAX_DELAY_MS, 0..=300_000, 2_000);
        if base_delay > max_delay {
            env.problem(
                RETRY_BASE_DELAY_MS,
                format!("{base_delay} is larger than {RETRY_MAX_DELAY_MS} ({max_delay}); expected base <= max"),
            );
        }
        let retry_unknown = env.flag(RETRY_UNKNOWN_ERRORS, false);
        let deadline_margin = env.ranged(DEADLINE_MARGIN_MS, 0..=600_000, 2_000);
        let skip_group_on_error = env.flag(SKIP_GROUP_ON_ERROR, false);
        let payload = read_payload_policy(env);
        let store = crate::store::StoreConfig::read(env);
        Some(WorkerConfig {
            store,
            delivery: HttpDeliveryConfig {
                url: url?,
                timeout: Duration::from_millis(timeout),
                content_type,
                auth_header: None,
            },
            downstream_auth,
            payload,
            batch: BatchConfig {
                parser: ItemParser {
                    id_source,
                    body_format,
                },
                retry: RetryPolicy {
                    max_attempts: u32::try_from(max_attempts).unwrap_or(3),
                    base_delay: Duration::from_millis(base_delay),
                    max_delay: Duration::from_millis(max_delay),
                    retry_unknown,
                    jitter: Jitter::Full,
                },
                concurrency: usize::try_from(concurrency).unwrap_or(10),
                max_receive_count,
                receive_budget_margin: u32::try_from(margin).unwrap_or(0),
                skip_group_on_error,
            },
            deadline_margin: Duration::from_millis(deadline_margin),
        })
    }

    /// The variables and their descriptions (worker and store), for documentation and
    /// drift checks against the infrastructure template.
    pub fn documented_variables() -> BTreeMap<&'static str, &'static str> {
        WORKER_ENV_VARS
            .iter()
            .chain(crate::store::STORE_ENV_VARS)
            .copied()
            .collect()
    }
}

#[cfg(test)]
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
        let c = read(&[(DOWNSTREAM_URL, "http://127.0.0.1:9000/ingest")]).unwrap();
        assert_eq!(c.delivery.url.as_str(), "http://127.0.0.1:9000/ingest");
        assert_eq!(c.delivery.timeout, Duration::from_secs(10));
        assert_eq!(c.batch.concurrency, 10);
        assert_eq!(c.batch.max_receive_count, None);
        assert_eq!(c.batch.retry.max_attempts, 3);
        assert_eq!(c.deadline_margin, Duration::from_secs(2));
        assert!(!c.batch.skip_group_on_error);
    }

    #[test]
    fn every_setting_is_read() {
        let c = read(&[
            (DOWNSTREAM_URL, "https://example.com/x"),
            (DOWNSTREAM_TIMEOUT_MS, "1500"),
            (ITEM_ID_SOURCE, "pointer:/id"),
            (BODY_FORMAT, "text"),
            (MAX_CONCURRENCY, "50"),
            (MAX_RECEIVE_COUNT, "5"),
            (RECEIVE_BUDGET_MARGIN, "1"),
            (RETRY_MAX_ATTEMPTS, "4"),
            (RETRY_BASE_DELAY_MS, "50"),
            (RETRY_MAX_DELAY_MS, "800"),
            (RETRY_UNKNOWN_ERRORS, "true"),
            (DEADLINE_MARGIN_MS, "3000"),
            (SKIP_GROUP_ON_ERROR, "true"),
        ])
        .unwrap();
        assert_eq!(c.delivery.timeout, Duration::from_millis(1500));
        assert_eq!(
            c.batch.parser.id_source,
            ItemIdSource::JsonPointer("/id".into())
        );
        assert_eq!(c.batch.parser.body_format, BodyFormat::Text);
        assert_eq!(c.batch.concurrency, 50);
        assert_eq!(c.batch.max_receive_count, Some(5));
        assert_eq!(c.batch.receive_budget_margin, 1);
        assert_eq!(c.batch.retry.max_attempts, 4);
        assert!(c.batch.retry.retry_unknown);
        assert!(c.batch.skip_group_on_error);
        assert_eq!(c.deadline_margin, Duration::from_secs(3));
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let err = read(&[
            (DOWNSTREAM_TIMEOUT_MS, "soon"),
            (MAX_CONCURRENCY, "0"),
            (MAX_RECEIVE_COUNT, "1001"),
            (RETRY_UNKNOWN_ERRORS, "yes"),
            (ITEM_ID_SOURCE, "pointer:id"),
        ])
        .unwrap_err();
        let vars: Vec<&str> = err.problems.iter().map(|p| p.variable.as_str()).collect();
        assert_eq!(
            vars,
            [
                DOWNSTREAM_URL,
                DOWNSTREAM_TIMEOUT_MS,
                ITEM_ID_SOURCE,
                MAX_CONCURRENCY,
                MAX_RECEIVE_COUNT,
                RETRY_UNKNOWN_ERRORS
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
        let none = read(&[(DOWNSTREAM_URL, "http://x")]).unwrap();
        assert_eq!(none.store, None);
        let full = read(&[
            (DOWNSTREAM_URL, "http://x"),
            ("DLQ_TABLE", "t"),
            ("DLQ_QUEUE_URL", "http://q"),
            ("DLQ_BUCKET", "b"),
            ("DLQ_RETENTION_DAYS", "30"),
        ])
        .unwrap();
        let store = full.store.unwrap();
        assert_eq!(store.table, "t");
        assert_eq!(store.retention, Duration::from_secs(30 * 86_400));
        assert_eq!(store.inline_max_bytes, 65_536);
        let err = read(&[(DOWNSTREAM_URL, "http://x"), ("DLQ_TABLE", "t")]).unwrap_err();
        let vars: Vec<_> = err.problems.iter().map(|p| p.variable.as_str()).collect();
        assert_eq!(vars, ["DLQ_QUEUE_URL", "DLQ_BUCKET"]);
    }

    #[test]
    fn bad_url_and_inverted_delays() {
        let err = read(&[
            (DOWNSTREAM_URL, "ftp://example.com"),
            (RETRY_BASE_DELAY_MS, "5000"),
            (RETRY_MAX_DELAY_MS, "100"),
        ])
        .unwrap_err();
        assert_eq!(err.problems.len(), 2, "{err}");
        assert!(err.to_string().contains("scheme \"ftp\""));
        let err = read(&[(DOWNSTREAM_URL, "not a url")]).unwrap_err();
        assert_eq!(err.problems[0].variable, DOWNSTREAM_URL);
    }

    #[test]
    fn the_url_is_never_quoted_with_its_query_or_credentials() {
        let err = read(&[(DOWNSTREAM_URL, "https://h:99999/in?api_key=s3cret")]).unwrap_err();
        let text = err.to_string();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(
            text.contains("\"https://h:99999/in?<redacted>\" is not valid"),
            "{text}"
        );

        let err = read(&[(DOWNSTREAM_URL, "https://svc:s3cret@h/in")]).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert_eq!(err.problems[0].variable, DOWNSTREAM_URL);
        let text = err.to_string();
        assert!(!text.contains("s3cret") && !text.contains("svc"), "{text}");
        assert!(text.contains("carries credentials"), "{text}");
        assert!(text.contains(DOWNSTREAM_AUTH_HEADER), "{text}");
        assert!(text.contains(DOWNSTREAM_AUTH_SECRET), "{text}");
        let err = read(&[(DOWNSTREAM_URL, "https://token@h/in")]).unwrap_err();
        assert!(err.to_string().contains("carries credentials"), "{err}");

        // A query alone is allowed (some APIs want one), and kept for the request.
        let c = read(&[(DOWNSTREAM_URL, "https://h/in?api_key=s3cret")]).unwrap();
        assert_eq!(c.delivery.url.query(), Some("api_key=s3cret"));
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn auth_header_and_secret_go_together() {
        let url = (DOWNSTREAM_URL, "https://h/in");
        let none = read(&[url]).unwrap();
        assert_eq!(none.downstream_auth, None);
        assert_eq!(none.delivery.auth_header, None);
        let both = read(&[
            url,
            (DOWNSTREAM_AUTH_HEADER, "X-Api-Key"),
            (
                DOWNSTREAM_AUTH_SECRET,
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
                vec![(DOWNSTREAM_AUTH_HEADER, "Authorization")],
                DOWNSTREAM_AUTH_SECRET,
            ),
            (vec![(DOWNSTREAM_AUTH_SECRET, "k")], DOWNSTREAM_AUTH_HEADER),
        ] {
            let mut all = vec![url, (MAX_CONCURRENCY, "0")];
            all.extend(vars);
            let err = read(&all).unwrap_err();
            let named: Vec<_> = err.problems.iter().map(|p| p.variable.as_str()).collect();
            // Reported with every other problem.
            assert!(named.contains(&MAX_CONCURRENCY), "{err}");
            assert!(named.contains(&missing), "{err}");
            assert!(err.to_string().contains("go together"), "{err}");
        }
        for bad in ["bad header", "Content-Type", "x-item-id"] {
            let err = read(&[
                url,
                (DOWNSTREAM_AUTH_HEADER, bad),
                (DOWNSTREAM_AUTH_SECRET, "k"),
            ])
            .unwrap_err();
            assert_eq!(err.problems.len(), 1, "{bad}: {err}");
            assert_eq!(err.problems[0].variable, DOWNSTREAM_AUTH_HEADER, "{bad}");
        }
    }

    #[test]
    fn payload_cap_and_buckets() {
        let url = (DOWNSTREAM_URL, "https://h/in");
        let c = read(&[url]).unwrap();
        assert_eq!(c.payload.max_bytes, 33_554_432);
        assert!(c.payload.allowed_buckets.is_empty());
        let c = read(&[
            url,
            (PAYLOAD_MAX_BYTES, "1024"),
            (PAYLOAD_BUCKETS, " producer-a , producer.b,,"),
        ])
        .unwrap();
        assert_eq!(c.payload.max_bytes, 1024);
        assert_eq!(
            c.payload.allowed_buckets.iter().collect::<Vec<_>>(),
            ["producer-a", "producer.b"]
        );
        assert_eq!(
            read(&[url, (PAYLOAD_MAX_BYTES, "2147483648")])
                .unwrap()
                .payload
                .max_bytes,
            2_147_483_648
        );
        for (variable, value) in [
            (PAYLOAD_MAX_BYTES, "1023"),
            (PAYLOAD_MAX_BYTES, "2147483649"),
            (PAYLOAD_BUCKETS, "ok-bucket,Upper"),
            (PAYLOAD_BUCKETS, "s3://bucket"),
            (PAYLOAD_BUCKETS, "ab"),
        ] {
            let err = read(&[url, (variable, value)]).unwrap_err();
            assert_eq!(err.problems.len(), 1, "{value}: {err}");
            assert_eq!(err.problems[0].variable, variable, "{value}");
        }
    }

    #[test]
    fn the_documented_list_is_complete() {
        let documented = WorkerConfig::documented_variables();
        let sources = [include_str!("config.rs"), include_str!("store/mod.rs")];
        for line in sources.iter().flat_map(|s| s.lines()) {
            if let Some(rest) = line.strip_prefix("pub const ") {
                if let Some((_, value)) = rest.split_once("= \"") {
                    let name = value.trim_end_matches("\";");
                    assert!(documented.contains_key(name), "{name} is not documented");
                }
            }
        }
        assert_eq!(
            documented.len(),
            WORKER_ENV_VARS.len() + crate::store::STORE_ENV_VARS.len(),
            "no duplicates"
        );
    }
}
