//! The names the EMF metrics go under: the namespace, the `service` dimension and a team's
//! own default dimensions, chosen in the environment.
//!
//! Powertools for AWS Lambda reads `POWERTOOLS_METRICS_NAMESPACE` and
//! `POWERTOOLS_SERVICE_NAME`; they mean the same here, so a team keeps its conventions.
//! `WORKER_METRICS_DIMENSIONS` adds `name=value` pairs (an environment, a team).
//!
//! Every metric keeps its `FunctionName` dimension set, which the templates' alarms and
//! dashboard read. A service or extra dimensions add a second set beside it, so the same
//! values are also published under those dimensions. CloudWatch bills each metric and
//! dimension set pair as a custom metric: the second set doubles the count.

use std::str::FromStr;
use std::sync::OnceLock;

use crate::config::vars::{METRICS_DIMENSIONS, METRICS_NAMESPACE, SERVICE_NAME};
use crate::config::EnvReader;

/// The namespace when none is chosen.
pub const DEFAULT_NAMESPACE: &str = "SqsWorker";

/// Dimensions a document may carry in one set: EMF takes 30, and the library's own
/// `FunctionName`, `service` and per-line dimension (`ErrorClass`) take three.
pub const MAX_EXTRA_DIMENSIONS: usize = 27;

/// Names the library's own dimensions and properties take; a team's dimension may not
/// take one, nor the name of a metric the library writes (a worker's,
/// [`sqs_keeper_core::context::RESERVED_METRICS`]; a breaker's, a redrive's or the polling
/// control's): in one document the two would share a key.
const RESERVED: [&str; 7] = [
    "FunctionName",
    "service",
    "ErrorClass",
    "_aws",
    "requestId",
    "RunId",
    "Mode",
];

/// Tells whether `name` is reserved: a team's dimension may not take it.
fn reserved(name: &str) -> bool {
    RESERVED.contains(&name)
        || sqs_keeper_core::context::RESERVED_METRICS.contains(&name)
        || sqs_keeper_core::breaker::METRICS.contains(&name)
        || crate::metrics::REDRIVE_METRICS.contains(&name)
        || crate::metrics::POLLING_METRICS.contains(&name)
        || name == crate::metrics::OLDEST_DEAD_AGE
}

/// Where the metrics go and under which dimensions.
///
/// ```
/// use sqs_keeper_lambda::metric_names::{Dimensions, MetricNames};
///
/// let mut names = MetricNames::default();
/// assert_eq!(names.namespace.as_str(), "SqsWorker");
/// names.namespace = "Orders".parse().unwrap();
/// names.service = Some("orders-api".to_string());
/// names.dimensions = "environment=prod,team=payments".parse::<Dimensions>().unwrap();
/// assert_eq!(
///     names.extra(),
///     [("service", "orders-api"), ("environment", "prod"), ("team", "payments")]
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricNames {
    /// `POWERTOOLS_METRICS_NAMESPACE`, default [`DEFAULT_NAMESPACE`].
    pub namespace: Namespace,
    /// `POWERTOOLS_SERVICE_NAME`: the `service` dimension, when set.
    pub service: Option<String>,
    /// `WORKER_METRICS_DIMENSIONS`: a team's own default dimensions.
    pub dimensions: Dimensions,
}

impl Default for MetricNames {
    fn default() -> Self {
        MetricNames {
            namespace: Namespace(DEFAULT_NAMESPACE.to_string()),
            service: None,
            dimensions: Dimensions::default(),
        }
    }
}

impl MetricNames {
    /// Reads the three variables, noting each bad one in `env`.
    pub fn read(env: &mut EnvReader<'_>) -> MetricNames {
        let namespace = env.optional::<Namespace>(&METRICS_NAMESPACE);
        let service = env.optional::<DimensionValue>(&SERVICE_NAME);
        let dimensions = env.optional::<Dimensions>(&METRICS_DIMENSIONS);
        MetricNames {
            namespace: namespace.unwrap_or_default(),
            service: service.map(|s| s.0),
            dimensions: dimensions.unwrap_or_default(),
        }
    }

    /// Returns the dimensions of the second set, with their values: `service`, then the team's.
    /// Empty when neither is chosen (then only `FunctionName` is published).
    pub fn extra(&self) -> Vec<(&str, &str)> {
        let service = self.service.as_deref().map(|s| ("service", s));
        service
            .into_iter()
            .chain(
                self.dimensions
                    .0
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str())),
            )
            .collect()
    }
}

/// Returns the names this process publishes under: those [`configure`] set, else read from the
/// environment on first use (a bad value is warned of and the default kept).
pub fn current() -> &'static MetricNames {
    NAMES.get_or_init(|| {
        let lookup = |name: &str| std::env::var(name).ok();
        EnvReader::read_all(&lookup, MetricNames::read).unwrap_or_else(|e| {
            tracing::warn!("{e}: the metrics keep their default names");
            MetricNames::default()
        })
    })
}

/// Sets the names for this process; a no-op once they are set or read.
pub fn configure(names: MetricNames) {
    let _ = NAMES.set(names);
}

static NAMES: OnceLock<MetricNames> = OnceLock::new();

/// A CloudWatch namespace: 1 to 255 characters, printable ASCII, not `AWS/…` (AWS keeps
/// those for its own services), and no `"` or `\` (the templates' dashboard holds it in
/// a JSON string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace(String);

impl Namespace {
    /// Returns the namespace.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Namespace(DEFAULT_NAMESPACE.to_string())
    }
}

impl FromStr for Namespace {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let printable = s.chars().all(|c| c.is_ascii_graphic() || c == ' ');
        if s.len() > 255 || !printable || s.contains(['"', '\\']) {
            return Err("1 to 255 printable ASCII characters, no `\"` or `\\`".to_string());
        }
        if s.starts_with("AWS/") {
            return Err("namespaces starting with AWS/ are AWS's own".to_string());
        }
        Ok(Namespace(s.to_string()))
    }
}

/// A dimension value: 1 to 1,024 printable ASCII characters (CloudWatch refuses others).
struct DimensionValue(String);

impl FromStr for DimensionValue {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let printable = s.chars().all(|c| c.is_ascii_graphic() || c == ' ');
        if s.is_empty() || s.len() > 1024 || !printable {
            return Err("1 to 1024 printable ASCII characters".to_string());
        }
        Ok(DimensionValue(s.to_string()))
    }
}

/// A team's default dimensions: `name=value` pairs separated by commas, each name 1 to
/// 255 printable ASCII characters and not one the library uses, at most
/// [`MAX_EXTRA_DIMENSIONS`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dimensions(Vec<(String, String)>);

impl Dimensions {
    /// Returns the pairs, in the order given.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }
}

impl FromStr for Dimensions {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not name=value"))?;
            let (name, value) = (name.trim(), value.trim());
            if name.is_empty()
                || name.len() > 255
                || name.starts_with(':')
                || !name.chars().all(|c| c.is_ascii_graphic())
            {
                return Err(format!(
                    "{name:?}: a name is 1 to 255 printable ASCII characters, not starting with `:`"
                ));
            }
            if reserved(name) || pairs.iter().any(|(n, _)| n == name) {
                return Err(format!(
                    "{name:?} is taken (by the library or an earlier pair)"
                ));
            }
            let value = value
                .parse::<DimensionValue>()
                .map_err(|e| format!("{name}: {e}"))?;
            pairs.push((name.to_string(), value.0));
        }
        if pairs.len() > MAX_EXTRA_DIMENSIONS {
            return Err(format!(
                "{} dimensions; at most {MAX_EXTRA_DIMENSIONS}",
                pairs.len()
            ));
        }
        Ok(Dimensions(pairs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<MetricNames, crate::config::ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |name: &str| map.get(name).cloned();
        EnvReader::read_all(&lookup, MetricNames::read)
    }

    #[test]
    fn nothing_chosen_keeps_the_names_the_templates_read() {
        let names = read(&[]).unwrap();
        assert_eq!(names, MetricNames::default());
        assert_eq!(names.namespace.as_str(), "SqsWorker");
        assert!(names.extra().is_empty());
    }

    #[test]
    fn the_powertools_variables_and_a_teams_dimensions_are_honoured() {
        let names = read(&[
            ("POWERTOOLS_METRICS_NAMESPACE", "Payments"),
            ("POWERTOOLS_SERVICE_NAME", "orders"),
            ("WORKER_METRICS_DIMENSIONS", "environment=prod, team = core"),
        ])
        .unwrap();
        assert_eq!(names.namespace.as_str(), "Payments");
        assert_eq!(
            names.extra(),
            [
                ("service", "orders"),
                ("environment", "prod"),
                ("team", "core")
            ]
        );
    }

    #[test]
    fn a_bad_name_is_refused_at_start_with_its_variable() {
        for (var, value, says) in [
            ("POWERTOOLS_METRICS_NAMESPACE", "AWS/Lambda", "AWS's own"),
            ("POWERTOOLS_METRICS_NAMESPACE", "tab\there", "printable"),
            ("WORKER_METRICS_DIMENSIONS", "environment", "not name=value"),
            ("WORKER_METRICS_DIMENSIONS", "FunctionName=x", "taken"),
            ("WORKER_METRICS_DIMENSIONS", "a=1,a=2", "taken"),
            ("WORKER_METRICS_DIMENSIONS", "a=", "1 to 1024"),
            ("POWERTOOLS_SERVICE_NAME", "bell\u{7}", "printable ASCII"),
            (
                "POWERTOOLS_SERVICE_NAME",
                "commandes-été",
                "printable ASCII",
            ),
            (
                "WORKER_METRICS_DIMENSIONS",
                "team=paiements-été",
                "printable ASCII",
            ),
            (
                "WORKER_METRICS_DIMENSIONS",
                ":team=core",
                "not starting with `:`",
            ),
            ("WORKER_METRICS_DIMENSIONS", "Records=eu", "taken"),
            ("WORKER_METRICS_DIMENSIONS", "RunId=1", "taken"),
            ("POWERTOOLS_METRICS_NAMESPACE", "Orders \"EU\"", "no `\"`"),
        ] {
            let error = read(&[(var, value)]).unwrap_err();
            let problem = &error.problems[0];
            assert_eq!(problem.variable, var);
            assert!(problem.problem.contains(says), "{value:?}: {problem:?}");
        }
        let many: Vec<String> = (0..28).map(|i| format!("d{i}=v")).collect();
        let error = read(&[("WORKER_METRICS_DIMENSIONS", &many.join(","))]).unwrap_err();
        assert!(error.problems[0].problem.contains("at most 27"), "{error}");
    }
}
