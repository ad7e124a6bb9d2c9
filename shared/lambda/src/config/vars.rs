//! Every environment variable of the worker, the redrive function and the dead-letter
//! store, each written once: its name, what it means, the form of its value and its
//! default. The readers ([`super::EnvReader`]) take the range and default from here, the
//! docs' variable tables are rendered from here (a test holds them equal), and the template
//! check compares the functions' variables with these lists.
//!
//! A leaf module: it imports nothing of the crate, so any module may name a variable.

/// One environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    /// Its name.
    pub name: &'static str,
    /// What it sets.
    pub meaning: &'static str,
    /// The form of its value, with its default.
    pub form: Form,
}

/// A variable shows as its name (in messages such as "A and B go together").
impl std::fmt::Display for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The form of a variable's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Form {
    /// Text that must be set; `expected` says what form.
    Required {
        /// The form expected, as said in errors.
        expected: &'static str,
    },
    /// Optional text; `default` applies when unset.
    Text {
        /// The form expected, as said in errors.
        expected: &'static str,
        /// The value used when unset (`None`: nothing).
        default: Option<&'static str>,
    },
    /// An integer in `min..=max`; `default` applies when unset.
    Integer {
        /// Least value.
        min: u64,
        /// Greatest value.
        max: u64,
        /// The value used when unset (`None`: the setting is off).
        default: Option<u64>,
    },
    /// `true` or `false`.
    Flag {
        /// The value used when unset.
        default: bool,
    },
}

impl Var {
    /// Returns the form expected, as errors say it.
    pub fn expected(&self) -> String {
        match self.form {
            Form::Required { expected } | Form::Text { expected, .. } => expected.to_string(),
            Form::Integer { min, max, .. } => format!("an integer from {min} to {max}"),
            Form::Flag { .. } => "true or false".to_string(),
        }
    }

    /// Returns the integer default (0 for a variable without one).
    pub const fn integer_default(&self) -> u64 {
        match self.form {
            Form::Integer {
                default: Some(d), ..
            } => d,
            _ => 0,
        }
    }

    /// Writes one line for the documentation: meaning, form, default.
    pub fn describe(&self) -> String {
        match self.form {
            Form::Required { .. } => format!("required; {}", self.meaning),
            Form::Text {
                default: Some(d), ..
            } => format!("{} (default `{d}`)", self.meaning),
            Form::Text { default: None, .. } => format!("{} (optional)", self.meaning),
            Form::Integer {
                min,
                max,
                default: Some(d),
            } => format!("{}, {min}–{max} (default {d})", self.meaning),
            Form::Integer {
                min,
                max,
                default: None,
            } => format!("{}, {min}–{max} (optional)", self.meaning),
            Form::Flag { default } => {
                format!("{}: `true` or `false` (default `{default}`)", self.meaning)
            }
        }
    }
}

/// Returns the docs' table of `vars`: a header and one row per variable.
pub fn markdown_table(vars: &[Var]) -> String {
    let mut table = String::from("| variable | meaning |\n| --- | --- |\n");
    for var in vars {
        table.push_str(&format!("| `{}` | {} |\n", var.name, var.describe()));
    }
    table
}

const fn integer(
    name: &'static str,
    meaning: &'static str,
    min: u64,
    max: u64,
    default: u64,
) -> Var {
    Var {
        name,
        meaning,
        form: Form::Integer {
            min,
            max,
            default: Some(default),
        },
    }
}

const fn flag(name: &'static str, meaning: &'static str) -> Var {
    Var {
        name,
        meaning,
        form: Form::Flag { default: false },
    }
}

const fn text(
    name: &'static str,
    meaning: &'static str,
    expected: &'static str,
    default: Option<&'static str>,
) -> Var {
    Var {
        name,
        meaning,
        form: Form::Text { expected, default },
    }
}

/// `WORKER_DOWNSTREAM_URL`
pub const DOWNSTREAM_URL: Var = Var {
    name: "WORKER_DOWNSTREAM_URL",
    meaning: "http(s) URL each item body is POSTed to; no `user:password@` (credentials go in a header, below)",
    form: Form::Required {
        expected: "an http:// or https:// URL",
    },
};
/// `WORKER_DOWNSTREAM_TIMEOUT_MS`
pub const DOWNSTREAM_TIMEOUT_MS: Var = integer(
    "WORKER_DOWNSTREAM_TIMEOUT_MS",
    "per-request timeout in ms",
    1,
    900_000,
    10_000,
);
/// `WORKER_DOWNSTREAM_CONTENT_TYPE`
pub const DOWNSTREAM_CONTENT_TYPE: Var = text(
    "WORKER_DOWNSTREAM_CONTENT_TYPE",
    "`Content-Type` of the POST",
    "a media type",
    Some("application/json"),
);
/// `WORKER_DOWNSTREAM_AUTH_HEADER`
pub const DOWNSTREAM_AUTH_HEADER: Var = text(
    "WORKER_DOWNSTREAM_AUTH_HEADER",
    "header carrying the downstream's credential, e.g. `Authorization` or `x-api-key` (with the next one)",
    "an HTTP header name",
    None,
);
/// `WORKER_DOWNSTREAM_AUTH_SECRET`
pub const DOWNSTREAM_AUTH_SECRET: Var = text(
    "WORKER_DOWNSTREAM_AUTH_SECRET",
    "Secrets Manager secret id or ARN whose `SecretString` is that header's value, read once at start-up",
    "a Secrets Manager secret id or ARN",
    None,
);
/// `WORKER_ITEM_ID_SOURCE`
pub const ITEM_ID_SOURCE: Var = text(
    "WORKER_ITEM_ID_SOURCE",
    "where the item id comes from: `message-id`, `envelope` (the event's own id; the default when `WORKER_ENVELOPE` is set), `pointer:/json/pointer` into the payload, or `attribute:Name`",
    "message-id, envelope, pointer:/path or attribute:Name",
    Some("message-id"),
);
/// `WORKER_ENVELOPE`
pub const ENVELOPE: Var = text(
    "WORKER_ENVELOPE",
    "the envelope around each body, unwrapped before processing: `none`, `sns`, `sns-raw`, `eventbridge`, `s3`, or layers joined by `+` outermost first (`sns+s3`); a body that does not match is a validation failure",
    "none, sns, sns-raw, eventbridge, s3, or layers joined by +",
    Some("none"),
);
/// `WORKER_REDELIVERY_BASE_SECS`
pub const REDELIVERY_BASE_SECS: Var = integer(
    "WORKER_REDELIVERY_BASE_SECS",
    "spaced retries across deliveries: a record returned for retry is hidden (`ChangeMessageVisibility`) for this long after its first receive, growing by `WORKER_REDELIVERY_MULTIPLIER` per receive, at least its `Retry-After`; 0: off (it comes back after the queue's visibility timeout)",
    0,
    43_200,
    0,
);
/// `WORKER_REDELIVERY_MULTIPLIER`
pub const REDELIVERY_MULTIPLIER: Var = integer(
    "WORKER_REDELIVERY_MULTIPLIER",
    "the factor of each further redelivery delay",
    1,
    10,
    3,
);
/// `WORKER_REDELIVERY_MAX_SECS`
pub const REDELIVERY_MAX_SECS: Var = integer(
    "WORKER_REDELIVERY_MAX_SECS",
    "the longest redelivery delay (SQS allows 12 hours; keep the sum of the delays well under the queue's retention)",
    1,
    43_200,
    14_400,
);
/// `WORKER_BREAKER_TABLE`
pub const BREAKER_TABLE: Var = text(
    "WORKER_BREAKER_TABLE",
    "DynamoDB table (key `id`, TTL on `expires_at`; the idempotency table's schema) holding the circuit breaker every sandbox of the function shares: when the downstream's transient failures reach the threshold, it is not called until a probe succeeds; unset: off",
    "a DynamoDB table name",
    None,
);
/// `WORKER_BREAKER_KEY`
pub const BREAKER_KEY: Var = text(
    "WORKER_BREAKER_KEY",
    "the circuit breaker's item in `WORKER_BREAKER_TABLE`: functions with the same key share one breaker; the template gives the worker and the redrive function the worker's; unset: `breaker#` and the function's name (`AWS_LAMBDA_FUNCTION_NAME`)",
    "a key",
    None,
);
/// `WORKER_BREAKER_THRESHOLD`
pub const BREAKER_THRESHOLD: Var = integer(
    "WORKER_BREAKER_THRESHOLD",
    "transient failures of the downstream within the window that open the breaker",
    1,
    100_000,
    20,
);
/// `WORKER_BREAKER_WINDOW_SECS`
pub const BREAKER_WINDOW_SECS: Var = integer(
    "WORKER_BREAKER_WINDOW_SECS",
    "the window failures are counted in",
    1,
    3600,
    60,
);
/// `WORKER_BREAKER_OPEN_SECS`
pub const BREAKER_OPEN_SECS: Var = integer(
    "WORKER_BREAKER_OPEN_SECS",
    "how long the breaker stays open before a probe (doubled after each failed probe, up to 16 times)",
    1,
    43_200,
    60,
);
/// `WORKER_BREAKER_SCOPE`
pub const BREAKER_SCOPE: Var = text(
    "WORKER_BREAKER_SCOPE",
    "`function`: one breaker for every record; `message-group`: one per message group (a FIFO group, or a fair queue's tenant: a standard queue's `MessageGroupId`), each its own item `<WORKER_BREAKER_KEY>#group#<group>`, so a tenant whose own downstream fails is held back alone; records without a group share the function's, which alone pauses polling",
    "function or message-group",
    Some("function"),
);
/// `WORKER_IDEMPOTENCY_TABLE`
pub const IDEMPOTENCY_TABLE: Var = text(
    "WORKER_IDEMPOTENCY_TABLE",
    "DynamoDB table (key `id`, TTL on `expires_at`) recording completed items: a completed item is skipped on redelivery, one in progress elsewhere is retried later; unset: off",
    "a DynamoDB table name",
    None,
);
/// `WORKER_IDEMPOTENCY_TTL_SECS`
pub const IDEMPOTENCY_TTL_SECS: Var = integer(
    "WORKER_IDEMPOTENCY_TTL_SECS",
    "how long a completed item is remembered",
    60,
    31_536_000,
    86_400,
);
/// `WORKER_IDEMPOTENCY_KEY_PREFIX`
pub const IDEMPOTENCY_KEY_PREFIX: Var = text(
    "WORKER_IDEMPOTENCY_KEY_PREFIX",
    "what every idempotency key starts with, before the item id, so that functions sharing a table (two subscribers of one topic) do not skip each other's items; the template gives the worker and the redrive function the worker's; unset: the function's name (`AWS_LAMBDA_FUNCTION_NAME`) and `#`",
    "a prefix",
    None,
);
/// `WORKER_BODY_FORMAT`
pub const BODY_FORMAT: Var = text(
    "WORKER_BODY_FORMAT",
    "`json` (non-JSON bodies are validation failures) or `text`",
    "json or text",
    Some("json"),
);
/// `WORKER_LOG_RECORDS`
pub const LOG_RECORDS: Var = text(
    "WORKER_LOG_RECORDS",
    "which records leave a log line of their own: `failures` (each failed record; the others are counted in the batch's line and its metrics) or `all` (every record done or skipped too: about 300 bytes of CloudWatch Logs a record)",
    "all or failures",
    Some("failures"),
);
/// `WORKER_MAX_CONCURRENCY`
pub const MAX_CONCURRENCY: Var = integer(
    "WORKER_MAX_CONCURRENCY",
    "records processed at once on standard queues",
    1,
    1000,
    10,
);
/// `WORKER_MAX_RECEIVE_COUNT`
pub const MAX_RECEIVE_COUNT: Var = Var {
    name: "WORKER_MAX_RECEIVE_COUNT",
    meaning: "the source queue's `maxReceiveCount` (without it, exhausted retries are left to SQS)",
    form: Form::Integer {
        min: 1,
        max: 1000,
        default: None,
    },
};
/// `WORKER_RECEIVE_BUDGET_MARGIN`
pub const RECEIVE_BUDGET_MARGIN: Var = integer(
    "WORKER_RECEIVE_BUDGET_MARGIN",
    "dead-letter this many deliveries before the last",
    0,
    999,
    0,
);
/// `WORKER_RETRY_MAX_ATTEMPTS`
pub const RETRY_MAX_ATTEMPTS: Var = integer(
    "WORKER_RETRY_MAX_ATTEMPTS",
    "attempts per record per invocation",
    1,
    20,
    3,
);
/// `WORKER_RETRY_BASE_DELAY_MS`
pub const RETRY_BASE_DELAY_MS: Var = integer(
    "WORKER_RETRY_BASE_DELAY_MS",
    "first backoff delay in ms (doubles per retry)",
    0,
    60_000,
    100,
);
/// `WORKER_RETRY_MAX_DELAY_MS`
pub const RETRY_MAX_DELAY_MS: Var = integer(
    "WORKER_RETRY_MAX_DELAY_MS",
    "cap on one backoff delay, in ms",
    0,
    300_000,
    2_000,
);
/// `WORKER_RETRY_UNKNOWN_ERRORS`
pub const RETRY_UNKNOWN_ERRORS: Var = flag(
    "WORKER_RETRY_UNKNOWN_ERRORS",
    "retry errors of class unknown",
);
/// `WORKER_RETRY_ATTEMPTS_BY_CLASS`
pub const RETRY_ATTEMPTS_BY_CLASS: Var = text(
    "WORKER_RETRY_ATTEMPTS_BY_CLASS",
    "attempts per record per invocation for the error classes named, in place of `WORKER_RETRY_MAX_ATTEMPTS` (e.g. `throttled=6,server_error=2`: throttling tried longer than a server error); the last failure's class decides",
    "class=attempts pairs joined by commas, each 1 to 20",
    None,
);
/// `WORKER_RETRY_AFTER_FREE`
pub const RETRY_AFTER_FREE: Var = flag(
    "WORKER_RETRY_AFTER_FREE",
    "a `throttled` attempt answered with a `Retry-After` (the callee asked for time) does not count against the record's attempts; the cut-off still ends the waiting, and a record makes at most 20 attempts an invocation",
);
/// `WORKER_DEADLINE_MARGIN_MS`
pub const DEADLINE_MARGIN_MS: Var = integer(
    "WORKER_DEADLINE_MARGIN_MS",
    "stop starting records this long before the deadline, in ms",
    0,
    600_000,
    2_000,
);
/// `WORKER_SKIP_GROUP_ON_ERROR`
pub const SKIP_GROUP_ON_ERROR: Var = flag(
    "WORKER_SKIP_GROUP_ON_ERROR",
    "FIFO: hold back only the failed message group",
);
/// `WORKER_PAYLOAD_MAX_BYTES`
pub const PAYLOAD_MAX_BYTES: Var = integer(
    "WORKER_PAYLOAD_MAX_BYTES",
    "largest SQS Extended Client payload read from S3",
    1024,
    2_147_483_648,
    sqs_keeper_core::pointer::DEFAULT_PAYLOAD_MAX_BYTES,
);
/// `WORKER_PAYLOAD_BUCKETS`
pub const PAYLOAD_BUCKETS: Var = text(
    "WORKER_PAYLOAD_BUCKETS",
    "comma-separated buckets an Extended Client pointer may name, besides `DLQ_BUCKET`",
    "comma-separated S3 bucket names",
    None,
);

/// `DLQ_TABLE`
pub const TABLE: Var = text(
    "DLQ_TABLE",
    "DynamoDB table of dead-letter records",
    "a table name",
    None,
);
/// `DLQ_QUEUE_URL`
pub const QUEUE_URL: Var = text("DLQ_QUEUE_URL", "URL of the DLQ", "a queue URL", None);
/// `DLQ_BUCKET`
pub const BUCKET: Var = text(
    "DLQ_BUCKET",
    "S3 bucket for payloads too large to keep inline",
    "a bucket name",
    None,
);
/// `DLQ_INLINE_MAX_BYTES`
pub const INLINE_MAX_BYTES: Var = integer(
    "DLQ_INLINE_MAX_BYTES",
    "largest body kept inline in the record and the DLQ message",
    1024,
    262_144,
    65_536,
);
/// `DLQ_RETENTION_DAYS`
pub const RETENTION_DAYS: Var = integer(
    "DLQ_RETENTION_DAYS",
    "days a record is kept before DynamoDB TTL removes it",
    1,
    3650,
    14,
);
/// `SQS_KEEPER_STORE`: not in [`STORE_VARS`], since it carries them rather than being one.
pub const STORE_ENVIRONMENT: Var = text(
    "SQS_KEEPER_STORE",
    "the store's variables in one JSON object of names and values, as the reusable store's `Environment` output writes them (infra/store.yaml); a variable set on its own wins",
    "a JSON object of this library's variables and their values",
    None,
);
/// `DLQ_CHECK_AT_START`
pub const CHECK_AT_START: Var = flag(
    "DLQ_CHECK_AT_START",
    "at start-up, read the table, the DLQ and the bucket once each and refuse to start when one is missing or out of reach (three requests per new sandbox)",
);

/// `REDRIVE_SOURCE_QUEUE_URL`
pub const SOURCE_QUEUE_URL: Var = text(
    "REDRIVE_SOURCE_QUEUE_URL",
    "requeue target overriding the queue each record names",
    "a queue URL",
    None,
);
/// `REDRIVE_KEEP_PAYLOADS`
pub const KEEP_PAYLOADS: Var = flag(
    "REDRIVE_KEEP_PAYLOADS",
    "keep the S3 payloads of resolved items (else each is deleted once no message of its item can be delivered, 14 days after its last attempt)",
);

/// `REDRIVE_WORKER_FUNCTION`
pub const WORKER_FUNCTION: Var = text(
    "REDRIVE_WORKER_FUNCTION",
    "the worker function a paused worker is probed through (one source message, invoked directly); with `REDRIVE_WORKER_MAPPING`, `REDRIVE_SOURCE_QUEUE_URL` and the breaker it turns on pausing the worker's polling during a long outage",
    "a function name or ARN",
    None,
);
/// `REDRIVE_WORKER_MAPPING`
pub const WORKER_MAPPING: Var = text(
    "REDRIVE_WORKER_MAPPING",
    "the UUID of the worker's event source mapping, disabled while the breaker stays open and enabled again once a probe closes it",
    "an event source mapping UUID",
    None,
);

/// `POWERTOOLS_METRICS_NAMESPACE`
pub const METRICS_NAMESPACE: Var = text(
    "POWERTOOLS_METRICS_NAMESPACE",
    "the CloudWatch namespace of the EMF metrics (as Powertools reads it)",
    "1 to 255 printable ASCII characters, not starting with AWS/",
    Some("SqsWorker"),
);
/// `POWERTOOLS_SERVICE_NAME`
pub const SERVICE_NAME: Var = text(
    "POWERTOOLS_SERVICE_NAME",
    "a `service` dimension on every metric, in a dimension set beside `FunctionName` (as Powertools reads it)",
    "1 to 1024 characters",
    None,
);
/// `WORKER_METRICS_DIMENSIONS`
pub const METRICS_DIMENSIONS: Var = text(
    "WORKER_METRICS_DIMENSIONS",
    "a team's own dimensions on every metric, in the set `service` is in",
    "comma-separated name=value pairs, at most 27",
    None,
);

/// The worker's own variables.
pub const WORKER_VARS: &[Var] = &[
    DOWNSTREAM_URL,
    DOWNSTREAM_TIMEOUT_MS,
    DOWNSTREAM_CONTENT_TYPE,
    DOWNSTREAM_AUTH_HEADER,
    DOWNSTREAM_AUTH_SECRET,
    ITEM_ID_SOURCE,
    ENVELOPE,
    BODY_FORMAT,
    LOG_RECORDS,
    MAX_CONCURRENCY,
    MAX_RECEIVE_COUNT,
    RECEIVE_BUDGET_MARGIN,
    RETRY_MAX_ATTEMPTS,
    RETRY_BASE_DELAY_MS,
    RETRY_MAX_DELAY_MS,
    RETRY_UNKNOWN_ERRORS,
    RETRY_ATTEMPTS_BY_CLASS,
    RETRY_AFTER_FREE,
    DEADLINE_MARGIN_MS,
    SKIP_GROUP_ON_ERROR,
    PAYLOAD_MAX_BYTES,
    PAYLOAD_BUCKETS,
    IDEMPOTENCY_TABLE,
    IDEMPOTENCY_TTL_SECS,
    IDEMPOTENCY_KEY_PREFIX,
    REDELIVERY_BASE_SECS,
    REDELIVERY_MULTIPLIER,
    REDELIVERY_MAX_SECS,
    BREAKER_TABLE,
    BREAKER_KEY,
    BREAKER_THRESHOLD,
    BREAKER_WINDOW_SECS,
    BREAKER_OPEN_SECS,
    BREAKER_SCOPE,
    METRICS_NAMESPACE,
    SERVICE_NAME,
    METRICS_DIMENSIONS,
];

/// The dead-letter store's variables (worker, redrive function and `dlq`).
pub const STORE_VARS: &[Var] = &[
    TABLE,
    QUEUE_URL,
    BUCKET,
    INLINE_MAX_BYTES,
    RETENTION_DAYS,
    CHECK_AT_START,
];

/// The redrive function's own variables (it also reads the store's and, to reprocess, the
/// worker's).
pub const REDRIVE_VARS: &[Var] = &[
    SOURCE_QUEUE_URL,
    KEEP_PAYLOADS,
    WORKER_FUNCTION,
    WORKER_MAPPING,
];

/// What this library's variables begin with. A variable that begins so and that no list
/// here names is most likely a misspelling: it would be ignored without a word.
pub const PREFIXES: &[&str] = &["WORKER_", "DLQ_", "REDRIVE_", "IDEMPOTENCY_"];

/// Tells whether `name` is one of this library's variables.
pub fn is_registered(name: &str) -> bool {
    WORKER_VARS
        .iter()
        .chain(STORE_VARS)
        .chain(REDRIVE_VARS)
        .any(|v| v.name == name)
}

/// Returns the names among `names` that begin like this library's variables ([`PREFIXES`]) but
/// name none of them, each with the known name nearest to it when one is close (at most
/// three edits). Sorted, each once.
pub fn unknown<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Vec<(String, Option<&'static str>)> {
    let known: Vec<&'static str> = WORKER_VARS
        .iter()
        .chain(STORE_VARS)
        .chain(REDRIVE_VARS)
        .map(|v| v.name)
        .collect();
    let mut found: Vec<(String, Option<&'static str>)> = names
        .into_iter()
        .filter(|name| PREFIXES.iter().any(|p| name.starts_with(p)))
        .filter(|name| !known.contains(name))
        .map(|name| {
            let nearest = known
                .iter()
                .map(|k| (strsim::levenshtein(name, k), *k))
                .min()
                .filter(|(distance, _)| *distance <= 3)
                .map(|(_, k)| k);
            (name.to_string(), nearest)
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Logs a warning for each variable of the process's environment that [`unknown`] finds.
pub fn warn_of_unknown() {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    for (name, nearest) in unknown(names.iter().map(String::as_str)) {
        match nearest {
            Some(nearest) => tracing::warn!(
                variable = %name,
                "{name} is not a variable sqs-keeper reads, and is ignored: did you mean {nearest}?"
            ),
            None => tracing::warn!(
                variable = %name,
                "{name} is not a variable sqs-keeper reads, and is ignored (docs/HANDLERS.md lists them)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_variable_is_named_with_the_nearest_known_one() {
        let found = unknown([
            "WORKER_RETRY_MAX_ATTEMPT",
            "WORKER_RETRY_MAX_ATTEMPTS",
            "DLQ_TABEL",
            "IDEMPOTENCY_TABLE",
            "WORKER_SOMETHING_ELSE_ENTIRELY",
            "PATH",
            "ORDERS_TABLE",
        ]);
        assert_eq!(
            found,
            [
                ("DLQ_TABEL".to_string(), Some("DLQ_TABLE")),
                ("IDEMPOTENCY_TABLE".to_string(), None),
                (
                    "WORKER_RETRY_MAX_ATTEMPT".to_string(),
                    Some("WORKER_RETRY_MAX_ATTEMPTS")
                ),
                ("WORKER_SOMETHING_ELSE_ENTIRELY".to_string(), None),
            ]
        );
    }

    #[test]
    fn names_are_unique_and_defaults_lie_in_their_ranges() {
        let all: Vec<&Var> = WORKER_VARS
            .iter()
            .chain(STORE_VARS)
            .chain(REDRIVE_VARS)
            .collect();
        let names: std::collections::HashSet<&str> = all.iter().map(|v| v.name).collect();
        assert_eq!(names.len(), all.len());
        for var in all {
            if let Form::Integer {
                min,
                max,
                default: Some(d),
            } = var.form
            {
                assert!((min..=max).contains(&d), "{}", var.name);
            }
        }
    }

    #[test]
    fn the_readme_tables_are_these() {
        // The tables live in the handler authors' reference and the operators' runbook.
        let readme = [
            include_str!("../../../../README.md"),
            include_str!("../../../../docs/HANDLERS.md"),
            include_str!("../../../../docs/OPERATIONS.md"),
        ]
        .concat();
        let mut differ = Vec::new();
        for (what, vars) in [
            ("worker", WORKER_VARS),
            ("store", STORE_VARS),
            ("redrive", REDRIVE_VARS),
        ] {
            let table = markdown_table(vars);
            if !readme.contains(&table) {
                differ.push(format!("the {what} table should read:\n{table}"));
            }
        }
        assert!(
            differ.is_empty(),
            "the docs differ from config::vars; {}",
            differ.join("\n")
        );
    }

    /// The core names the variables in its messages without reading the environment: the
    /// names it writes are these.
    #[test]
    fn the_pointer_policy_names_the_variables_that_set_it() {
        let policy = sqs_keeper_core::pointer::PayloadPolicy::allowing(["ours"]);
        let body = r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"theirs","s3Key":"k"}]"#;
        let refusal = match policy.pointer_in(body) {
            Some(Err(e)) => e.message,
            other => panic!("a pointer to another bucket is refused: {other:?}"),
        };
        for var in [PAYLOAD_BUCKETS, BUCKET] {
            assert!(refusal.contains(var.name), "{refusal}");
        }
    }

    #[test]
    fn descriptions_say_form_and_default() {
        assert_eq!(
            RETRY_MAX_ATTEMPTS.describe(),
            "attempts per record per invocation, 1–20 (default 3)"
        );
        assert_eq!(
            KEEP_PAYLOADS.describe(),
            "keep the S3 payloads of resolved items (else each is deleted once no message of its item can be delivered, 14 days after its last attempt): `true` or `false` (default `false`)"
        );
        assert_eq!(RETRY_MAX_ATTEMPTS.expected(), "an integer from 1 to 20");
    }
}
