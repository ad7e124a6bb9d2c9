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

use sqs_keeper_aws::StoreConfig;
use sqs_keeper_core::envelope::Envelopes;
use sqs_keeper_core::pointer::PayloadPolicy;
#[cfg(feature = "http")]
use sqs_keeper_core::redrive::RedriveSettings;
use sqs_keeper_core::BatchConfig;
use sqs_keeper_core::{item::BodyFormat, item::ItemIdSource, item::ItemParser};
use sqs_keeper_core::{retry::Jitter, retry::RetryPolicy};
#[cfg(feature = "http")]
use sqs_keeper_http::{redact_url, redact_url_text, HttpDeliveryConfig};

mod handler;
#[cfg(feature = "http")]
mod redrive;
#[cfg(feature = "http")]
mod worker;

pub use handler::{
    read_ids_and_envelope, read_item_id_source, read_store_config, BreakerConfig, HandlerConfig,
    IdempotencyConfig,
};
#[cfg(feature = "http")]
pub use redrive::{PollingTarget, RedriveConfig};
#[cfg(feature = "http")]
pub use worker::{DownstreamAuth, WorkerConfig};

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
///
/// A variable is read as set, else from [`vars::STORE_ENVIRONMENT`]: the store's variables
/// in one JSON object, which the reusable store template writes for a function to take whole.
pub struct EnvReader<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    store: std::collections::BTreeMap<String, String>,
    problems: Vec<ConfigProblem>,
}

impl<'a> EnvReader<'a> {
    /// Creates a reader over any lookup (tests pass a map; production passes `std::env::var`).
    pub fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Self {
        let mut reader = EnvReader {
            lookup,
            store: std::collections::BTreeMap::new(),
            problems: Vec::new(),
        };
        let name = vars::STORE_ENVIRONMENT.name;
        if let Some(text) = lookup(name).filter(|t| !t.trim().is_empty()) {
            match store_environment(&text) {
                Ok(store) => reader.store = store,
                Err(problem) => reader.problem(name, problem),
            }
        }
        reader
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

    /// Returns the variable's trimmed value, set on its own or in the store's object; `None`
    /// when unset or blank in both. A blank variable of its own does not hide the store's.
    pub fn raw(&self, var: &Var) -> Option<String> {
        let blank = |v: &String| v.trim().is_empty();
        (self.lookup)(var.name)
            .filter(|v| !blank(v))
            .or_else(|| self.store.get(var.name).cloned())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// Returns a required variable parsed with `FromStr`.
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

    /// Returns an optional variable parsed with `FromStr`; `None` when unset or bad (bad is noted).
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

    /// Returns an optional text variable parsed with `FromStr`, or its default when unset (or bad:
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

    /// Returns an integer variable within its range; `None` when unset (or bad: bad is noted).
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

    /// Returns an integer variable within its range, or its default.
    pub fn integer(&mut self, var: &Var) -> u64 {
        self.integer_if_set(var)
            .unwrap_or_else(|| var.integer_default())
    }

    /// Returns a `true`/`false` variable, or its default.
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

    /// Returns a variable Lambda sets for the function (its name, log group and stream): not
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

/// Reads the store's object of variables ([`vars::STORE_ENVIRONMENT`]), or says what is
/// wrong with it. Every name must be one of this library's variables, since a name it does
/// not know would be ignored without a word.
fn store_environment(text: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    let store: std::collections::BTreeMap<String, String> =
        serde_json::from_str(text).map_err(|e| {
            format!(
                "is not a JSON object of strings ({e}); expected {}",
                vars::STORE_ENVIRONMENT.expected()
            )
        })?;
    let unknown: Vec<&str> = store
        .keys()
        .map(String::as_str)
        .filter(|name| !vars::is_registered(name))
        .collect();
    if unknown.is_empty() {
        Ok(store)
    } else {
        Err(format!(
            "names {}, which this version of the library does not read: update sqs-keeper, or leave them out of the store's Environment",
            unknown.join(", ")
        ))
    }
}

#[cfg(test)]
mod store_environment_tests {
    use super::*;
    use std::collections::HashMap;

    fn reader_over<'m>(map: &'m HashMap<&str, &str>) -> impl Fn(&str) -> Option<String> + 'm {
        |name: &str| map.get(name).map(|v| v.to_string())
    }

    #[test]
    fn a_variable_is_read_from_the_stores_object_unless_set_on_its_own() {
        let map = HashMap::from([
            (
                "SQS_KEEPER_STORE",
                r#"{"DLQ_TABLE": "records", "DLQ_RETENTION_DAYS": "30", "WORKER_MAX_RECEIVE_COUNT": "5", "DLQ_QUEUE_URL": "https://q"}"#,
            ),
            ("DLQ_QUEUE_URL", ""),
            ("DLQ_RETENTION_DAYS", "7"),
            ("DLQ_BUCKET", " "),
        ]);
        let lookup = reader_over(&map);
        let mut env = EnvReader::new(&lookup);
        assert_eq!(env.raw(&vars::TABLE).as_deref(), Some("records"));
        assert_eq!(env.integer(&vars::RETENTION_DAYS), 7, "set on its own wins");
        assert_eq!(env.integer_if_set(&vars::MAX_RECEIVE_COUNT), Some(5));
        assert_eq!(env.raw(&vars::BUCKET), None, "blank here and absent there");
        assert_eq!(
            env.raw(&vars::QUEUE_URL).as_deref(),
            Some("https://q"),
            "a blank variable of its own does not hide the store's"
        );
        env.finish().unwrap();
    }

    #[test]
    fn a_malformed_or_unknown_store_object_is_named_at_start() {
        for (text, says) in [
            ("DLQ_TABLE=records", "is not a JSON object of strings"),
            (r#"{"DLQ_TABLE": 7}"#, "is not a JSON object of strings"),
            (r#"{"DLQ_TABEL": "records"}"#, "DLQ_TABEL"),
            (r#"{"HOME": "/root"}"#, "HOME"),
            (r#"{"SQS_KEEPER_STORE": "{}"}"#, "SQS_KEEPER_STORE"),
        ] {
            let map = HashMap::from([("SQS_KEEPER_STORE", text)]);
            let lookup = reader_over(&map);
            let err = EnvReader::new(&lookup).finish().unwrap_err();
            assert_eq!(err.problems.len(), 1, "{text}: {err}");
            assert_eq!(err.problems[0].variable, "SQS_KEEPER_STORE");
            assert!(err.problems[0].problem.contains(says), "{text}: {err}");
        }
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
        // Outside Lambda, in tables of their own (an empty prefix in the breaker's table
        // would let an item id name the breaker: refused below).
        let alone = read(&[
            url,
            (BREAKER_TABLE.name, "breakers"),
            (IDEMPOTENCY_TABLE.name, "claims"),
        ])
        .unwrap()
        .handler;
        assert_eq!(
            handler_keys(&alone),
            (BREAKER_ID.to_string(), String::new())
        );
    }

    #[allow(clippy::unwrap_used)] // a test helper: fails loudly
    fn handler_keys(handler: &crate::config::HandlerConfig) -> (String, String) {
        (
            handler.breaker.as_ref().unwrap().key.clone(),
            handler.idempotency.as_ref().unwrap().key_prefix.clone(),
        )
    }

    #[test]
    fn retry_budgets_name_only_classes_that_are_retried() {
        let url = (DOWNSTREAM_URL.name, "http://127.0.0.1:9000/ingest");
        let budget = |value: &str, unknown: &str| {
            read(&[
                url,
                (RETRY_ATTEMPTS_BY_CLASS.name, value),
                (RETRY_UNKNOWN_ERRORS.name, unknown),
            ])
        };
        let ok = budget("throttled=6,server_error=2", "false").unwrap();
        assert_eq!(
            ok.handler.batch.retry.class_attempts.by_class.len(),
            2,
            "{ok:?}"
        );
        for (value, unknown) in [
            ("validation=5", "false"),
            ("unknown=4", "false"),
            ("throttled=0", "false"),
        ] {
            let error = budget(value, unknown).unwrap_err().to_string();
            assert!(
                error.contains(RETRY_ATTEMPTS_BY_CLASS.name),
                "{value}: {error}"
            );
        }
        assert!(budget("unknown=4", "true").is_ok());
    }

    #[test]
    fn the_breaker_is_the_functions_unless_scoped_by_message_group() {
        let url = (DOWNSTREAM_URL.name, "http://127.0.0.1:9000/ingest");
        let table = (BREAKER_TABLE.name, "breakers");
        let scoped = |scope: Option<&str>| {
            let mut vars = vec![url, table];
            vars.extend(scope.map(|s| (BREAKER_SCOPE.name, s)));
            read(&vars).map(|c| c.handler.breaker.map(|b| b.per_group))
        };
        assert_eq!(scoped(None).unwrap(), Some(false));
        assert_eq!(scoped(Some("function")).unwrap(), Some(false));
        assert_eq!(scoped(Some("message-group")).unwrap(), Some(true));
        let error = scoped(Some("tenant")).unwrap_err().to_string();
        assert!(error.contains(BREAKER_SCOPE.name), "{error}");
    }

    /// In one table, an idempotency key (a prefix and an item id, which is data) must never
    /// be a breaker's item: a function named `breaker` (prefix `breaker#`), an empty prefix,
    /// or a prefix the breaker key starts with is refused, naming the variable; in tables
    /// of their own they are fine.
    #[test]
    fn an_idempotency_prefix_that_could_name_a_breaker_item_in_its_table_is_refused() {
        let url = (DOWNSTREAM_URL.name, "http://127.0.0.1:9000/ingest");
        for extra in [
            vec![("AWS_LAMBDA_FUNCTION_NAME", "breaker")],
            vec![],
            vec![
                ("AWS_LAMBDA_FUNCTION_NAME", "orders"),
                (IDEMPOTENCY_KEY_PREFIX.name, "breaker#or"),
            ],
            vec![
                ("AWS_LAMBDA_FUNCTION_NAME", "orders"),
                (IDEMPOTENCY_KEY_PREFIX.name, "b"),
            ],
            // Item id `polling` would name the pause marker `orders#polling`.
            vec![
                ("AWS_LAMBDA_FUNCTION_NAME", "orders"),
                (BREAKER_KEY.name, "orders"),
            ],
        ] {
            let mut shared = vec![
                url,
                (BREAKER_TABLE.name, "one"),
                (IDEMPOTENCY_TABLE.name, "one"),
            ];
            shared.extend_from_slice(&extra);
            let error = read(&shared).unwrap_err().to_string();
            assert!(
                error.contains(IDEMPOTENCY_KEY_PREFIX.name),
                "{extra:?}: {error}"
            );
            let mut apart = vec![
                url,
                (BREAKER_TABLE.name, "breakers"),
                (IDEMPOTENCY_TABLE.name, "claims"),
            ];
            apart.extend_from_slice(&extra);
            assert!(read(&apart).is_ok(), "{extra:?}");
        }
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
            (LOG_RECORDS.name, "some"),
        ])
        .unwrap_err();
        let vars: Vec<&str> = err.problems.iter().map(|p| p.variable.as_str()).collect();
        assert_eq!(
            vars,
            [
                DOWNSTREAM_URL.name,
                DOWNSTREAM_TIMEOUT_MS.name,
                ITEM_ID_SOURCE.name,
                LOG_RECORDS.name,
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
        assert!(
            text.contains("WORKER_LOG_RECORDS: \"some\" is not valid (neither all nor failures)"),
            "{text}"
        );
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
            include_str!("handler.rs"),
            include_str!("worker.rs"),
            include_str!("redrive.rs"),
            include_str!("../../../aws/src/store/mod.rs"),
            include_str!("../redrive_function.rs"),
            include_str!("../worker.rs"),
        ];
        let mut literals = Vec::new();
        for source in sources {
            // The code, not its tests (which quote names in expected messages) nor its doc
            // examples (which set variables by name, as a user does).
            let code = source
                .split("#[cfg(test)]")
                .next()
                .and_then(|code| code.split("#[cfg(all(test,").next())
                .unwrap_or_default();
            let source: String = code
                .lines()
                .filter(|line| !line.trim_start().starts_with("///"))
                .collect::<Vec<_>>()
                .join("\n");
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
