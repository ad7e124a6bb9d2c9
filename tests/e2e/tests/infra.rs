//! The infrastructure template: translated offline, checked as JSON (alarms, event source,
//! IAM, variable names), and deployed into the emulator with CloudFormation to check the
//! resources it really creates.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_cloudformation::types::StackStatus;
use e2e::stack::{role_policies, root, translated_template, Deployment};
use serde_json::Value;
use sqs_keeper_aws::Endpoints;

/// A rule assertion evaluated over parameter values, for the functions rules use
/// (`Fn::Or`, `Fn::And`, `Fn::Not`, `Fn::Equals`, `Fn::Contains`, `Ref`); CloudFormation
/// compares parameter values as strings.
fn rule_holds(expression: &Value, parameters: &[(&str, &str)]) -> Value {
    let eval = |e: &Value| rule_holds(e, parameters);
    let Some((function, argument)) = expression.as_object().and_then(|o| o.iter().next()) else {
        return match expression {
            Value::Array(items) => Value::Array(items.iter().map(eval).collect()),
            other => other.clone(),
        };
    };
    let args = || argument.as_array().unwrap().iter().map(eval);
    match function.as_str() {
        "Ref" => {
            let name = argument.as_str().unwrap();
            let value = parameters.iter().find(|(p, _)| *p == name).unwrap().1;
            Value::String(value.to_string())
        }
        "Fn::Or" => Value::Bool(args().any(|v| v == Value::Bool(true))),
        "Fn::And" => Value::Bool(args().all(|v| v == Value::Bool(true))),
        "Fn::Not" => Value::Bool(args().next() == Some(Value::Bool(false))),
        "Fn::Equals" => {
            let v: Vec<Value> = args().collect();
            Value::Bool(v[0] == v[1])
        }
        "Fn::Contains" => {
            let v: Vec<Value> = args().collect();
            Value::Bool(v[0].as_array().unwrap().contains(&v[1]))
        }
        other => panic!("rule function {other} is not evaluated here"),
    }
}

fn resources_of_type<'a>(template: &'a Value, kind: &str) -> Vec<(&'a String, &'a Value)> {
    template["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == kind)
        .collect()
}

/// A policy document's statements, conditional ones (`Fn::If`) in each of their forms.
fn statements(document: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for statement in document["Statement"].as_array().unwrap() {
        match statement.get("Fn::If") {
            Some(branches) => all.extend(
                branches.as_array().unwrap()[1..]
                    .iter()
                    .filter(|b| b.get("Ref") != Some(&Value::from("AWS::NoValue"))),
            ),
            None => all.push(statement),
        }
    }
    all
}

/// The statement with this `Sid` in a policy document, and the condition it is under.
fn statement<'a>(document: &'a Value, sid: &str) -> (&'a Value, Option<&'a str>) {
    for statement in document["Statement"].as_array().unwrap() {
        if statement["Sid"] == sid {
            return (statement, None);
        }
        if let Some(branches) = statement.get("Fn::If") {
            if branches[1]["Sid"] == sid {
                return (&branches[1], branches[0].as_str());
            }
        }
    }
    panic!("no statement {sid}")
}

/// A role's inline policies, each with the condition it is under (`Fn::If`).
fn inline_policies(role: &Value) -> Vec<(&Value, Option<&str>)> {
    role["Properties"]["Policies"]
        .as_array()
        .map_or_else(Vec::new, |policies| {
            policies
                .iter()
                .map(|p| match p.get("Fn::If") {
                    Some(branches) => (&branches[1], branches[0].as_str()),
                    None => (p, None),
                })
                .collect()
        })
}

/// The statement with this `Sid` in a role's inline policies, and the condition its
/// policy is under.
fn role_statement<'a>(role: &'a Value, sid: &str) -> (&'a Value, Option<&'a str>) {
    for (policy, condition) in inline_policies(role) {
        let statements = policy["PolicyDocument"]["Statement"].as_array().unwrap();
        if let Some(found) = statements.iter().find(|s| s["Sid"] == sid) {
            return (found, condition);
        }
    }
    panic!("no inline statement {sid}")
}

/// The policy document of the store's managed policy `name`.
fn managed_policy<'a>(store: &'a Value, name: &str) -> &'a Value {
    &store["Resources"][name]["Properties"]["PolicyDocument"]
}

/// The variable names the store's `Environment` output holds (a function's
/// `SQS_KEEPER_STORE`).
fn store_environment_names(store: &Value) -> BTreeSet<String> {
    let text = store_environment_text(store);
    // The `${...}` references are inside JSON strings: the object parses as it is.
    let object: serde_json::Map<String, Value> = serde_json::from_str(text).unwrap();
    object.keys().cloned().collect()
}

/// The store's `Environment` output as its template writes it, `${...}` references and all.
fn store_environment_text(store: &Value) -> &str {
    store["Outputs"]["Environment"]["Value"]["Fn::Sub"][0]
        .as_str()
        .unwrap()
}

/// The names a function of the main stack is configured by: its own variables and the
/// store's, which it takes whole.
fn configured_names(function: &Value, store: &Value) -> BTreeSet<String> {
    assert_eq!(
        function["Properties"]["Environment"]["Variables"]["SQS_KEEPER_STORE"],
        serde_json::json!({"Fn::GetAtt": ["Store", "Outputs.Environment"]})
    );
    let mut names = env_names(function);
    names.remove("SQS_KEEPER_STORE");
    names.extend(store_environment_names(store));
    names
}

fn env_names(function: &Value) -> BTreeSet<String> {
    function["Properties"]["Environment"]["Variables"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// One metric line of a dashboard widget, its shorthand resolved.
#[derive(Debug)]
struct Plotted {
    namespace: String,
    metric: String,
    /// The `FunctionName` dimension's value (a `${...}` reference), if any.
    function: Option<String>,
    /// The `ErrorClass` dimension's value, if any.
    error_class: Option<String>,
    stat: Option<String>,
}

/// Every metric the dashboard plots, by widget title. Rows use the dashboard shorthand:
/// `"."` repeats the previous row's value at that position, `"..."` the whole previous row.
/// A namespace as the template gives it, its parameter (`${MetricsNamespace}`, or a `Ref`
/// to it) read as its default: the namespace the functions use when nothing is chosen.
fn metrics_namespace(template: &Value, given: &str) -> String {
    let default = template["Parameters"]["MetricsNamespace"]["Default"]
        .as_str()
        .unwrap();
    assert_eq!(default, sqs_keeper_lambda::metrics::NAMESPACE);
    match given {
        "${MetricsNamespace}" | "MetricsNamespace" => default.to_string(),
        other => other.to_string(),
    }
}

fn dashboard_metrics(template: &Value, with_redrive: bool) -> Vec<(String, Plotted)> {
    let body = dashboard_body(template, with_redrive);
    let mut plotted = Vec::new();
    for widget in body["widgets"].as_array().unwrap() {
        let properties = &widget["properties"];
        let title = properties["title"].as_str().unwrap().to_string();
        let mut previous: Vec<String> = Vec::new();
        for row in properties["metrics"].as_array().unwrap() {
            let row = row.as_array().unwrap();
            let options = row.last().filter(|v| v.is_object());
            let names: Vec<&str> = row.iter().filter_map(Value::as_str).collect();
            // A metric math expression plots the rows it names, which are checked as rows.
            if names.is_empty() && options.is_some_and(|o| o.get("expression").is_some()) {
                continue;
            }
            let resolved: Vec<String> = if names == ["..."] {
                previous.clone()
            } else {
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| match *n {
                        "." => previous[i].clone(),
                        other => other.to_string(),
                    })
                    .collect()
            };
            let dimension = |name: &str| {
                resolved
                    .iter()
                    .position(|d| d == name)
                    .map(|i| resolved[i + 1].clone())
            };
            let function = dimension("FunctionName");
            let error_class = dimension("ErrorClass");
            let stat = options
                .and_then(|o| o["stat"].as_str())
                .or(properties["stat"].as_str())
                .map(str::to_string);
            plotted.push((
                title.clone(),
                Plotted {
                    namespace: metrics_namespace(template, &resolved[0]),
                    metric: resolved[1].clone(),
                    function,
                    error_class,
                    stat,
                },
            ));
            previous = resolved;
        }
    }
    plotted
}

/// The store's dashboard as deployed: with the redrive function's widgets when
/// `with_redrive` (the main stack names one), else without them.
fn dashboard_body(store: &Value, with_redrive: bool) -> Value {
    let sub = &store["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"];
    let widgets = &sub[1]["RedriveWidgets"]["Fn::If"];
    assert_eq!(widgets[0], "HasRedrive");
    let redrive = if with_redrive {
        widgets[1]["Fn::Sub"].as_str().unwrap()
    } else {
        widgets[2].as_str().unwrap()
    };
    let body = sub[0]
        .as_str()
        .unwrap()
        .replace("${RedriveWidgets}", redrive);
    // The `${...}` references are inside JSON strings: the body parses as it is.
    serde_json::from_str(&body).unwrap()
}

/// The metric names a set of EMF documents defines.
fn defined_metrics(documents: &[Value]) -> BTreeSet<String> {
    documents
        .iter()
        .flat_map(|d| {
            d["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
        })
        .map(|m| m["Name"].as_str().unwrap().to_string())
        .collect()
}

/// The dashboard plots `function`'s failed records under every error class the worker
/// counts, each under its own dimension.
fn assert_failures_by_every_class(plotted: &[(String, Plotted)], function: &str) {
    let classes: BTreeSet<String> = plotted
        .iter()
        .filter(|(_, p)| p.metric == "FailedRecords" && p.function.as_deref() == Some(function))
        .filter_map(|(_, p)| p.error_class.clone())
        .collect();
    let every_class: BTreeSet<String> = sqs_keeper_lambda::ErrorClass::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    assert_eq!(
        classes, every_class,
        "failed records of {function} by class"
    );
}

/// The metrics a worker's (or a handler's) EMF documents define, a breaker's included.
fn worker_metrics() -> BTreeSet<String> {
    use sqs_keeper_lambda::{metrics::emf_documents, metrics::InvocationTimings};
    let mut counts = sqs_keeper_core::batch::BatchCounts {
        records: 1,
        ..Default::default()
    };
    counts
        .by_class
        .insert(sqs_keeper_lambda::ErrorClass::Throttled, 1);
    // What a worker behind its breaker adds to the document.
    let breaker_metrics =
        sqs_keeper_core::breaker::METRICS.map(|name| sqs_keeper_core::context::CustomMetric {
            name: name.to_string(),
            unit: sqs_keeper_core::context::Unit::Count,
            values: vec![1.0],
        });
    // And the AWS requests each invocation counts, with the DynamoDB capacity they consumed.
    let request_metrics = sqs_keeper_aws::request_meter::REQUEST_METRICS
        .iter()
        .map(|(_, name)| *name)
        .chain(sqs_keeper_aws::capacity_meter::CAPACITY_METRICS)
        .map(|name| sqs_keeper_core::context::CustomMetric {
            name: name.to_string(),
            unit: sqs_keeper_core::context::Unit::Count,
            values: vec![1.0],
        })
        .collect::<Vec<_>>();
    let timings = InvocationTimings {
        custom: [&breaker_metrics[..], &request_metrics[..]].concat(),
        cold_start: true,
        batch_duration: Duration::from_millis(5),
        record_times: vec![Duration::from_millis(1)],
        request_id: None,
    };
    defined_metrics(&emf_documents(&counts, &timings, "w", 0))
}

#[test]
fn dashboard_plots_what_the_functions_emit() {
    use sqs_keeper_lambda::{metrics::redrive_document, metrics::NAMESPACE};

    let template = translated_template("main-store");
    let worker_metrics = worker_metrics();
    let redrive_metrics = defined_metrics(&[
        redrive_document(&sqs_keeper_core::redrive::RedriveReport::default(), "r", 0).unwrap(),
        sqs_keeper_lambda::metrics::polling_document(
            &sqs_keeper_core::polling::ControlAction::Paused,
            "r",
            0,
        )
        .unwrap(),
    ]);

    let plotted = dashboard_metrics(&template, true);
    let worker = "${FunctionName}";
    let redrive = "${RedriveFunctionName}";
    // Every custom metric the dashboard plots is one the function it names emits.
    for (title, p) in plotted.iter().filter(|(_, p)| p.namespace == NAMESPACE) {
        let emitted = match p.function.as_deref() {
            Some(f) if f == worker => &worker_metrics,
            Some(f) if f == redrive => &redrive_metrics,
            other => panic!("{title}: {} for {other:?}", p.metric),
        };
        assert!(emitted.contains(&p.metric), "{title}: {p:?} is not emitted");
    }
    let shows = |namespace: &str, metric: &str, function: &str| {
        plotted
            .iter()
            .filter(|(_, p)| {
                p.namespace == namespace
                    && p.metric == metric
                    && p.function.as_deref() == Some(function)
            })
            .map(|(_, p)| p.stat.clone().unwrap_or_default())
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(
        shows(NAMESPACE, "ColdStart", worker),
        BTreeSet::from(["Sum".to_string()])
    );
    for timing in ["BatchDuration", "RecordProcessingTime"] {
        let stats = shows(NAMESPACE, timing, worker);
        assert!(
            stats.contains("p50") && stats.contains("p99") && stats.contains("Maximum"),
            "{timing}: {stats:?}"
        );
    }
    for metric in [
        "Selected",
        "Resolved",
        "Requeued",
        "FailedAgain",
        "Errors",
        "Adopted",
    ] {
        assert_eq!(
            shows(NAMESPACE, metric, redrive),
            BTreeSet::from(["Sum".to_string()]),
            "{metric}"
        );
    }
    for metric in ["Invocations", "Errors"] {
        assert!(!shows("AWS/Lambda", metric, redrive).is_empty(), "{metric}");
        assert!(!shows("AWS/Lambda", metric, worker).is_empty(), "{metric}");
    }
    assert_failures_by_every_class(&plotted, worker);
    // The breaker's refusals, openings and closings, and whether polling stopped.
    for metric in sqs_keeper_core::breaker::METRICS {
        assert_eq!(
            shows(NAMESPACE, metric, worker),
            BTreeSet::from(["Sum".to_string()]),
            "{metric}"
        );
    }
    assert_eq!(
        shows(NAMESPACE, "PollingStopped", redrive),
        BTreeSet::from(["Maximum".to_string()])
    );
    // The redrive's runs and items a breaker held back.
    for metric in ["HeldByBreaker", "HeldByGroupBreaker"] {
        assert_eq!(
            shows(NAMESPACE, metric, redrive),
            BTreeSet::from(["Sum".to_string()]),
            "{metric}"
        );
    }
    // The main stack names its functions to the store, which plots them.
    let passed = &translated_template("main")["Resources"]["Store"]["Properties"]["Parameters"];
    assert_eq!(
        passed["FunctionName"],
        serde_json::json!({"Fn::Sub": "${AWS::StackName}-worker"})
    );
    assert_eq!(
        passed["RedriveFunctionName"],
        serde_json::json!({"Fn::Sub": "${AWS::StackName}-redrive"})
    );
}

/// The store's dashboard: every metric it plots is one a handler emits (the same runtime as
/// the worker's), with records by outcome and failures by every class.
#[test]
fn the_handler_dashboard_plots_what_its_function_emits() {
    use sqs_keeper_lambda::metrics::NAMESPACE;
    let template = translated_template("store");
    let emitted = worker_metrics();
    let plotted = dashboard_metrics(&template, false);
    let handler = "${FunctionName}";
    for (title, p) in plotted.iter().filter(|(_, p)| p.namespace == NAMESPACE) {
        assert_eq!(p.function.as_deref(), Some(handler), "{title}: {p:?}");
        assert!(emitted.contains(&p.metric), "{title}: {p:?} is not emitted");
    }
    let shown: BTreeSet<&str> = plotted.iter().map(|(_, p)| p.metric.as_str()).collect();
    for metric in [
        "Done",
        "DeadLettered",
        "DeadLetterFailed",
        "RetryLater",
        "BatchDuration",
    ] {
        assert!(shown.contains(metric), "{metric}");
    }
    assert_failures_by_every_class(&plotted, handler);
}

#[test]
fn variable_names_match_the_code() {
    let template = translated_template("main");
    let store = translated_template("main-store");
    let worker = configured_names(&template["Resources"]["WorkerFunction"], &store);
    let redrive = configured_names(&template["Resources"]["RedriveFunction"], &store);
    let worker_code: BTreeSet<String> =
        sqs_keeper_lambda::config::WorkerConfig::documented_variables()
            .keys()
            .map(|k| k.to_string())
            .collect();
    assert_eq!(worker, worker_code, "worker variables drifted");
    let mut redrive_code = worker_code.clone();
    redrive_code.extend(
        sqs_keeper_lambda::config::REDRIVE_VARS
            .iter()
            .map(|v| v.name.to_string()),
    );
    assert_eq!(redrive, redrive_code, "redrive variables drifted");
}

#[test]
fn the_event_source_mapping_polls_as_configured() {
    let template = translated_template("main");
    let mappings = resources_of_type(&template, "AWS::Lambda::EventSourceMapping");
    assert_eq!(mappings.len(), 1);
    let esm = &mappings[0].1["Properties"];
    assert_eq!(
        esm["FunctionResponseTypes"],
        serde_json::json!(["ReportBatchItemFailures"])
    );
    // On-demand polling capped by MaximumConcurrency, or provisioned mode: never both (AWS
    // refuses the pair), chosen by one condition; the mapping's metrics by another.
    assert_eq!(
        esm["ScalingConfig"],
        serde_json::json!({"Fn::If": ["UseProvisionedPollers", {"Ref": "AWS::NoValue"}, {"MaximumConcurrency": {"Ref": "MaximumConcurrency"}}]})
    );
    assert_eq!(
        esm["ProvisionedPollerConfig"],
        serde_json::json!({"Fn::If": ["UseProvisionedPollers", {"MinimumPollers": {"Ref": "ProvisionedMinimumPollers"}, "MaximumPollers": {"Ref": "ProvisionedMaximumPollers"}}, {"Ref": "AWS::NoValue"}]})
    );
    assert_eq!(
        esm["MetricsConfig"],
        serde_json::json!({"Fn::If": ["UseMappingMetrics", {"Metrics": ["EventCount"]}, {"Ref": "AWS::NoValue"}]})
    );
    assert_eq!(
        template["Conditions"]["UseProvisionedPollers"],
        serde_json::json!({"Fn::Not": [{"Fn::Equals": [{"Ref": "ProvisionedMinimumPollers"}, "0"]}]})
    );
    // Provisioned mode keeps at least 2 pollers (AWS's least for SQS); 0 is on-demand.
    let rule = &template["Rules"]["ProvisionedPollersAtLeastTwo"]["Assertions"][0]["Assert"];
    for (min, allowed) in [("0", true), ("2", true), ("200", true), ("1", false)] {
        assert_eq!(
            rule_holds(rule, &[("ProvisionedMinimumPollers", min)]),
            Value::Bool(allowed),
            "minimum pollers {min}"
        );
    }
    assert_eq!(
        template["Parameters"]["ProvisionedMaximumPollers"]["MinValue"],
        serde_json::json!(2)
    );
    assert_eq!(esm["BatchSize"], serde_json::json!({"Ref": "BatchSize"}));
}

#[test]
fn the_visibility_timeout_covers_every_function_timeout_and_window() {
    let template = translated_template("main");
    let store = translated_template("main-store");
    // The worker's timeout is the store's TimeoutSeconds, which sizes the source queue, and
    // the function takes it back from the store.
    let passed = &template["Resources"]["Store"]["Properties"]["Parameters"];
    assert_eq!(
        passed["TimeoutSeconds"],
        serde_json::json!({"Ref": "WorkerTimeoutSeconds"})
    );
    assert_eq!(
        passed["MaximumBatchingWindowInSeconds"],
        serde_json::json!({"Ref": "MaximumBatchingWindowInSeconds"})
    );
    assert_eq!(
        template["Resources"]["WorkerFunction"]["Properties"]["Timeout"],
        serde_json::json!({"Fn::GetAtt": ["Store", "Outputs.TimeoutSeconds"]})
    );
    assert_eq!(
        store["Outputs"]["TimeoutSeconds"]["Value"],
        serde_json::json!({"Ref": "TimeoutSeconds"})
    );
    // Visibility timeout is 6 x the function timeout plus the batching window, for every
    // allowed pair, and the queue reads it from that mapping.
    let allowed = store["Parameters"]["TimeoutSeconds"]["AllowedValues"]
        .as_array()
        .unwrap();
    assert_eq!(
        &template["Parameters"]["WorkerTimeoutSeconds"]["AllowedValues"],
        &store["Parameters"]["TimeoutSeconds"]["AllowedValues"]
    );
    let windows = store["Parameters"]["MaximumBatchingWindowInSeconds"]["AllowedValues"]
        .as_array()
        .unwrap();
    assert!(windows.len() > 5 && windows.iter().any(|w| w == "300"));
    for timeout in allowed {
        let t: u64 = timeout.as_str().unwrap().parse().unwrap();
        for window in windows {
            let w: u64 = window.as_str().unwrap().parse().unwrap();
            assert_eq!(
                store["Mappings"]["VisibilityTimeouts"][t.to_string()][w.to_string()].as_u64(),
                Some(6 * t + w),
                "visibility for timeout {t} and window {w}"
            );
        }
    }
    assert_eq!(
        store["Resources"]["SourceQueue"]["Properties"]["VisibilityTimeout"],
        serde_json::json!({"Fn::FindInMap": ["VisibilityTimeouts", {"Ref": "TimeoutSeconds"}, {"Ref": "MaximumBatchingWindowInSeconds"}]})
    );
    // AWS refuses a mapping of more than 10 records without a batching window: a rule
    // refuses the stack first. Its assertion, evaluated as CloudFormation would:
    let rule = &template["Rules"]["BatchingWindowForLargeBatches"]["Assertions"][0]["Assert"];
    for (batch, window, allowed) in [
        ("10", "0", true),
        ("1", "0", true),
        ("11", "0", false),
        ("10000", "0", false),
        ("11", "1", true),
        ("10000", "300", true),
    ] {
        let parameters = [
            ("BatchSize", batch),
            ("MaximumBatchingWindowInSeconds", window),
        ];
        assert_eq!(
            rule_holds(rule, &parameters),
            Value::Bool(allowed),
            "BatchSize {batch}, window {window}"
        );
    }
}

#[test]
fn concurrency_and_retries_reach_both_functions_within_the_workers_bounds() {
    let template = translated_template("main");
    let store = translated_template("main-store");
    // Concurrency and retries are parameters, with the bounds and defaults the worker's
    // configuration accepts, and reach both functions through the store's variables.
    for (parameter, var) in [
        (
            "WorkerMaxConcurrency",
            sqs_keeper_lambda::config::vars::MAX_CONCURRENCY,
        ),
        (
            "RetryMaxAttempts",
            sqs_keeper_lambda::config::vars::RETRY_MAX_ATTEMPTS,
        ),
        (
            "RetryBaseDelayMs",
            sqs_keeper_lambda::config::vars::RETRY_BASE_DELAY_MS,
        ),
        (
            "RetryMaxDelayMs",
            sqs_keeper_lambda::config::vars::RETRY_MAX_DELAY_MS,
        ),
    ] {
        let p = &template["Parameters"][parameter];
        let sqs_keeper_lambda::config::vars::Form::Integer {
            min,
            max,
            default: Some(default),
        } = var.form
        else {
            panic!("{} is not an integer with a default", var.name);
        };
        assert_eq!(p["MinValue"].as_u64(), Some(min), "{parameter}");
        assert_eq!(p["MaxValue"].as_u64(), Some(max), "{parameter}");
        assert_eq!(p["Default"].as_u64(), Some(default), "{parameter}");
        assert_eq!(
            template["Resources"]["Store"]["Properties"]["Parameters"][parameter],
            serde_json::json!({"Ref": parameter})
        );
        let entry = format!("\"{}\": \"${{{parameter}}}\"", var.name);
        assert!(
            store_environment_text(&store).contains(&entry),
            "the store's variables lack {entry}"
        );
        for function in ["WorkerFunction", "RedriveFunction"] {
            assert!(
                configured_names(&template["Resources"][function], &store).contains(var.name),
                "{function} {}",
                var.name
            );
        }
    }
}

#[test]
fn alarms_watch_what_the_functions_emit() {
    let template = translated_template("main-store");
    let alarms = resources_of_type(&template, "AWS::CloudWatch::Alarm");
    let find = |namespace: &str, metric: &str| {
        alarms
            .iter()
            .find(|(_, a)| {
                let given = &a["Properties"]["Namespace"];
                let given = given.as_str().or(given["Ref"].as_str()).unwrap_or_default();
                metrics_namespace(&template, given) == namespace
                    && a["Properties"]["MetricName"] == metric
            })
            .map(|(name, a)| (name.as_str(), &a["Properties"]))
    };
    // The DLQ's depth counts visible and held messages (a sweep holds them while a
    // redrive runs): its metric math adds the two.
    let depth = &template["Resources"]["DlqDepthAlarm"]["Properties"];
    assert_eq!(
        depth["Threshold"],
        serde_json::json!({"Ref": "DlqDepthAlarmThreshold"})
    );
    assert_eq!(depth["ComparisonOperator"], "GreaterThanThreshold");
    let metrics = depth["Metrics"].as_array().unwrap();
    let stat = |id: &str| {
        metrics
            .iter()
            .find(|m| m["Id"] == id)
            .map(|m| &m["MetricStat"]["Metric"])
            .unwrap()
    };
    assert_eq!(
        stat("visible")["MetricName"],
        "ApproximateNumberOfMessagesVisible"
    );
    assert_eq!(
        stat("held")["MetricName"],
        "ApproximateNumberOfMessagesNotVisible"
    );
    for id in ["visible", "held"] {
        assert_eq!(
            stat(id)["Dimensions"][0]["Value"],
            serde_json::json!({"Fn::GetAtt": ["DeadLetterQueue", "QueueName"]})
        );
    }
    let returned: Vec<_> = metrics.iter().filter(|m| m["ReturnData"] == true).collect();
    assert_eq!(returned.len(), 1);
    assert_eq!(returned[0]["Expression"], "visible + held");
    // The oldest dead item's age: the larger of the redrive function's age of the oldest
    // dead record (written on a schedule of its own, so a held run, a schedule's sweeps or
    // a FIFO rotation cannot silence it) and SQS's own figure.
    let age = &template["Resources"]["DeadItemAgeAlarm"]["Properties"]["Metrics"];
    let metric = |id: &str| {
        age.as_array()
            .unwrap()
            .iter()
            .find(|m| m["Id"] == id)
            .unwrap_or_else(|| panic!("no {id} in the DLQ age alarm"))["MetricStat"]["Metric"]
            .clone()
    };
    assert_eq!(
        metric("records")["MetricName"],
        "OldestDeadRecordAgeSeconds"
    );
    assert_eq!(
        metric("records")["Dimensions"][0]["Value"],
        serde_json::json!({"Ref": "RedriveFunctionName"})
    );
    assert_eq!(
        metric("queue")["MetricName"],
        "ApproximateAgeOfOldestMessage"
    );
    // The main stack's schedule writes that age.
    let main = translated_template("main");
    let rule = &main["Resources"]["DlqAgeRule"]["Properties"];
    assert_eq!(rule["ScheduleExpression"], "rate(5 minutes)");
    assert_eq!(rule["Targets"][0]["Input"], r#"{"control": "age"}"#);
    assert_eq!(
        rule["Targets"][0]["Arn"],
        serde_json::json!({"Fn::GetAtt": ["RedriveFunction", "Arn"]})
    );
    let source_age = &template["Resources"]["SourceAgeAlarm"]["Properties"];
    assert_eq!(source_age["MetricName"], "ApproximateAgeOfOldestMessage");
    assert_eq!(
        source_age["Dimensions"][0]["Value"]["Fn::GetAtt"][0],
        "SourceQueue"
    );
    // Lambda's own metrics: errors of both functions, throttles of the worker.
    let lambda_alarms: BTreeSet<(String, String)> = alarms
        .iter()
        .filter(|(_, a)| a["Properties"]["Namespace"] == "AWS/Lambda")
        .map(|(_, a)| {
            let p = &a["Properties"];
            assert_eq!(p["Statistic"], "Sum");
            assert_eq!(p["Threshold"], 0);
            assert_eq!(p["ComparisonOperator"], "GreaterThanThreshold");
            (
                p["MetricName"].as_str().unwrap().to_string(),
                p["Dimensions"][0]["Value"]["Ref"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        lambda_alarms,
        BTreeSet::from([
            ("Errors".to_string(), "FunctionName".to_string()),
            ("Errors".to_string(), "RedriveFunctionName".to_string()),
            ("Throttles".to_string(), "FunctionName".to_string()),
        ])
    );
    for metric in ["DeadLettered", "DeadLetterFailed"] {
        let (_, a) = find(sqs_keeper_lambda::metrics::NAMESPACE, metric)
            .unwrap_or_else(|| panic!("{metric} alarm"));
        assert_eq!(a["Statistic"], "Sum");
    }
    for (name, alarm) in &alarms {
        assert!(
            alarm["Properties"]["AlarmActions"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
            "{name} has no action"
        );
    }
    assert_eq!(
        resources_of_type(&template, "AWS::CloudWatch::Dashboard").len(),
        1
    );
}

#[test]
fn logs_records_and_payloads_are_kept_as_declared() {
    let main = translated_template("main");
    let template = translated_template("main-store");
    // Both functions log through Lambda's advanced logging controls, in JSON, at a level
    // that keeps the EMF lines (Lambda takes a line without a level for INFO), into the
    // store's log groups (kept 30 days).
    for (function, group) in [
        ("WorkerFunction", "LogGroupName"),
        ("RedriveFunction", "RedriveLogGroupName"),
    ] {
        let logging = &main["Resources"][function]["Properties"]["LoggingConfig"];
        assert_eq!(logging["LogFormat"], "JSON", "{function}");
        assert_eq!(logging["ApplicationLogLevel"], "INFO", "{function}");
        assert_eq!(
            logging["LogGroup"],
            serde_json::json!({"Fn::GetAtt": ["Store", format!("Outputs.{group}")]}),
            "{function}"
        );
    }
    for group in ["LogGroup", "RedriveLogGroup"] {
        assert_eq!(
            template["Resources"][group]["Properties"]["RetentionInDays"],
            30
        );
    }

    let table = &template["Resources"]["DeadLetterTable"]["Properties"];
    assert_eq!(
        table["TimeToLiveSpecification"]["AttributeName"],
        sqs_keeper_aws::schema::EXPIRES_AT
    );
    assert_eq!(table["TimeToLiveSpecification"]["Enabled"], true);
    assert_eq!(
        table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"],
        true
    );
    assert_eq!(table["SSESpecification"]["SSEEnabled"], true);

    let bucket = &template["Resources"]["PayloadBucket"]["Properties"];
    for flag in [
        "BlockPublicAcls",
        "BlockPublicPolicy",
        "IgnorePublicAcls",
        "RestrictPublicBuckets",
    ] {
        assert_eq!(
            bucket["PublicAccessBlockConfiguration"][flag], true,
            "{flag}"
        );
    }
    assert_eq!(
        bucket["LifecycleConfiguration"]["Rules"][0]["ExpirationInDays"],
        serde_json::json!({"Ref": "RetentionDays"}),
        "payloads expire with their records"
    );
    let tls = &template["Resources"]["PayloadBucketPolicy"]["Properties"]["PolicyDocument"]
        ["Statement"][0];
    assert_eq!(tls["Effect"], "Deny");
    assert_eq!(tls["Condition"]["Bool"]["aws:SecureTransport"], "false");

    // The DLQ accepts redrives only from the source queue.
    let allow = &template["Resources"]["DeadLetterQueue"]["Properties"]["RedriveAllowPolicy"];
    assert_eq!(allow["redrivePermission"], "byQueue");
    assert!(
        allow["sourceQueueArns"][0]
            .to_string()
            .contains("${FunctionName}-source"),
        "{allow}"
    );
}

#[test]
fn every_role_grants_least_privilege() {
    let template = translated_template("main");
    let store = translated_template("main-store");
    // Each role attaches one managed policy, the store's for its function, and inline
    // policies of its own.
    let mut documents: Vec<(String, &Value)> = Vec::new();
    for (name, role) in resources_of_type(&template, "AWS::IAM::Role") {
        let output = match name.as_str() {
            "WorkerRole" => "Outputs.HandlerPolicyArn",
            "RedriveRole" => "Outputs.RedrivePolicyArn",
            other => panic!("an unexpected role {other}"),
        };
        assert_eq!(
            role["Properties"]["ManagedPolicyArns"],
            serde_json::json!([{"Fn::GetAtt": ["Store", output]}]),
            "{name}"
        );
        for (policy, _) in inline_policies(role) {
            documents.push((name.clone(), &policy["PolicyDocument"]));
        }
    }
    for (name, _) in resources_of_type(&store, "AWS::IAM::ManagedPolicy") {
        documents.push((name.clone(), managed_policy(&store, name)));
    }
    assert_eq!(
        documents.len(),
        5,
        "two inline policies of the redrive role, one of the worker's, two managed"
    );
    // Least privilege: no wildcard actions; wildcard resources only for X-Ray.
    for (name, document) in &documents {
        for statement in statements(document) {
            let actions: Vec<&str> = statement["Action"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            assert!(
                actions.iter().all(|a| !a.contains('*')),
                "{name}: wildcard action in {actions:?}"
            );
            if statement["Resource"] == "*" {
                assert!(
                    actions.iter().all(|a| a.starts_with("xray:")),
                    "{name}: * resource for {actions:?}"
                );
            }
        }
    }

    // The downstream credential: both functions may read that one secret, and only when
    // one is configured; the parameters go together.
    for role in ["WorkerRole", "RedriveRole"] {
        let (secret, condition) =
            role_statement(&template["Resources"][role], "DownstreamCredential");
        assert_eq!(condition, Some("HasDownstreamAuth"), "{role}");
        assert_eq!(
            secret["Action"],
            serde_json::json!(["secretsmanager:GetSecretValue"])
        );
        assert_eq!(
            secret["Resource"],
            serde_json::json!({"Ref": "DownstreamAuthSecretArn"}),
            "{role}"
        );
    }
    // The polling control reaches the worker's own event source mapping only.
    let (polling, condition) =
        role_statement(&template["Resources"]["RedriveRole"], "PauseWorkerPolling");
    assert_eq!(condition, Some("UseBreaker"));
    assert!(
        polling["Resource"]
            .to_string()
            .contains("event-source-mapping:${WorkerFunctionSource}"),
        "{polling}"
    );
    assert_eq!(
        template["Conditions"]["HasDownstreamAuth"],
        serde_json::json!({"Fn::Not": [{"Fn::Equals": [{"Ref": "DownstreamAuthSecretArn"}, ""]}]})
    );
    for function in ["WorkerFunction", "RedriveFunction"] {
        let vars = &template["Resources"][function]["Properties"]["Environment"]["Variables"];
        assert_eq!(
            vars["WORKER_DOWNSTREAM_AUTH_HEADER"],
            serde_json::json!({"Ref": "DownstreamAuthHeader"})
        );
        assert_eq!(
            vars["WORKER_DOWNSTREAM_AUTH_SECRET"],
            serde_json::json!({"Ref": "DownstreamAuthSecretArn"})
        );
    }
    assert!(
        template["Rules"]["DownstreamAuthTogether"].is_object(),
        "header and secret are checked together"
    );
    for parameter in ["DownstreamAuthHeader", "DownstreamAuthSecretArn"] {
        assert_eq!(
            template["Parameters"][parameter]["Default"], "",
            "{parameter}"
        );
    }

    // Extended Client payloads: the worker reads and lists its own bucket and the
    // producers' (a missing object is then a 404, not_found, rather than a 403), within
    // the size cap; the variables come from the parameters.
    let worker_policy = managed_policy(&store, "HandlerPolicy");
    let (list, condition) = statement(worker_policy, "ListPayloads");
    assert_eq!(condition, None);
    assert_eq!(list["Action"], serde_json::json!(["s3:ListBucket"]));
    assert_eq!(
        list["Resource"],
        serde_json::json!({"Fn::GetAtt": ["PayloadBucket", "Arn"]})
    );
    for (sid, action, suffix) in [
        ("ProducerPayloads", "s3:GetObject", "/*"),
        ("ListProducerPayloads", "s3:ListBucket", ""),
    ] {
        let (producer, condition) = statement(worker_policy, sid);
        assert_eq!(condition, Some("HasPayloadBuckets"), "{sid}");
        assert_eq!(producer["Action"], serde_json::json!([action]), "{sid}");
        let resource = producer["Resource"].to_string();
        assert!(resource.contains("PayloadBuckets"), "{sid}: {resource}");
        assert!(
            resource.contains("arn:${AWS::Partition}:s3:::${"),
            "{sid}: {resource}"
        );
        assert!(
            resource.contains(&format!("{suffix},arn:aws:s3:::")),
            "{sid}: {resource}"
        );
    }
    // On a FIFO DLQ the sweep moves each message it keeps behind its group: a copy sent
    // to the DLQ itself (`DeadLetterQueue::rotate`), which the emulators' IAM-free runs and the
    // standard-queue IAM audit would not catch missing.
    let redrive_policy = managed_policy(&store, "RedrivePolicy");
    let (sweep, _) = statement(redrive_policy, "SweepDlq");
    assert!(
        sweep["Action"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("sqs:SendMessage")),
        "{sweep}"
    );
    assert_eq!(
        sweep["Resource"],
        serde_json::json!({"Fn::GetAtt": ["DeadLetterQueue", "Arn"]})
    );
    let (list, _) = statement(redrive_policy, "ListPayloads");
    assert_eq!(list["Action"], serde_json::json!(["s3:ListBucket"]));
    assert_eq!(
        store["Resources"]["RedrivePolicy"]["Condition"],
        "HasRedrive"
    );
    assert_eq!(
        template["Parameters"]["PayloadBuckets"]["Type"],
        "CommaDelimitedList"
    );
    assert_eq!(template["Parameters"]["PayloadBuckets"]["Default"], "");
    assert_eq!(
        template["Parameters"]["PayloadMaxBytes"]["Default"],
        33_554_432
    );
    let variables = store_environment_text(&store);
    for entry in [
        r#""WORKER_PAYLOAD_BUCKETS": "${Buckets}""#,
        r#""WORKER_PAYLOAD_MAX_BYTES": "${PayloadMaxBytes}""#,
    ] {
        assert!(variables.contains(entry), "{entry}");
    }
    assert_eq!(
        store["Outputs"]["Environment"]["Value"]["Fn::Sub"][1]["Buckets"],
        serde_json::json!({"Fn::Join": [",", {"Ref": "PayloadBuckets"}]})
    );
}

/// In the store (the main stack's and a handler's): alarms reach a topic CloudWatch can use,
/// and what holds messages, records and logs outlives the stack.
#[test]
fn alarms_reach_a_topic_cloudwatch_can_use_and_state_is_retained() {
    alarms_reach_a_usable_topic_and_state_is_retained(&translated_template("store"), "store");
}

fn alarms_reach_a_usable_topic_and_state_is_retained(template: &Value, which: &str) {
    let resources = &template["Resources"];

    // The created topic is encrypted with a key of the stack's own, which CloudWatch may
    // use; the AWS managed alias/aws/sns key would silently drop every alarm.
    let topic = &resources["AlarmTopic"];
    assert_eq!(topic["Condition"], "CreateAlarmTopic");
    assert_eq!(
        topic["Properties"]["KmsMasterKeyId"],
        serde_json::json!({"Ref": "AlarmKey"})
    );
    let key = &resources["AlarmKey"];
    assert_eq!(key["Type"], "AWS::KMS::Key");
    assert_eq!(key["Condition"], "CreateAlarmTopic");
    assert_eq!(key["Properties"]["EnableKeyRotation"], true);
    let policy = &key["Properties"]["KeyPolicy"]["Statement"];
    let by_principal = |principal: &Value| {
        policy
            .as_array()
            .unwrap()
            .iter()
            .find(|s| &s["Principal"] == principal)
            .unwrap_or_else(|| panic!("no key policy statement for {principal}"))
    };
    let root = by_principal(&serde_json::json!({
        "AWS": {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}
    }));
    assert_eq!(
        (root["Effect"].clone(), root["Action"].clone()),
        ("Allow".into(), "kms:*".into())
    );
    let cloudwatch = by_principal(&serde_json::json!({"Service": "cloudwatch.amazonaws.com"}));
    assert_eq!(cloudwatch["Effect"], "Allow");
    assert_eq!(
        cloudwatch["Action"],
        serde_json::json!(["kms:Decrypt", "kms:GenerateDataKey*"])
    );
    assert_eq!(policy.as_array().unwrap().len(), 2, "nobody else: {policy}");
    let alias = &resources["AlarmKeyAlias"];
    assert_eq!(alias["Type"], "AWS::KMS::Alias");
    assert_eq!(
        alias["Properties"]["TargetKeyId"],
        serde_json::json!({"Ref": "AlarmKey"})
    );
    for (name, r) in resources.as_object().unwrap() {
        let kms = r["Properties"]["KmsMasterKeyId"].to_string();
        assert!(
            !kms.contains("alias/aws/"),
            "{name} uses an AWS managed key: {kms}"
        );
    }

    // An optional email subscription, to whichever topic the alarms use.
    let subscription = &resources["AlarmEmailSubscription"];
    assert_eq!(subscription["Type"], "AWS::SNS::Subscription");
    assert_eq!(subscription["Condition"], "HasAlarmEmail");
    assert_eq!(subscription["Properties"]["Protocol"], "email");
    assert_eq!(
        subscription["Properties"]["Endpoint"],
        serde_json::json!({"Ref": "AlarmEmail"})
    );
    assert_eq!(
        subscription["Properties"]["TopicArn"],
        serde_json::json!({"Fn::If": ["CreateAlarmTopic", {"Ref": "AlarmTopic"}, {"Ref": "AlarmTopicArn"}]})
    );
    assert_eq!(
        template["Conditions"]["HasAlarmEmail"],
        serde_json::json!({"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmEmail"}, ""]}]})
    );
    assert_eq!(template["Parameters"]["AlarmEmail"]["Default"], "");

    // Queues use SSE-SQS: producers such as SNS, EventBridge and S3 notifications cannot
    // send to a queue encrypted with the AWS managed alias/aws/sqs key.
    for queue in ["SourceQueue", "DeadLetterQueue"] {
        let properties = &resources[queue]["Properties"];
        assert_eq!(properties["SqsManagedSseEnabled"], true, "{queue}");
        assert!(properties.get("KmsMasterKeyId").is_none(), "{queue}");
    }

    // What holds messages and records outlives the stack and any replacement.
    // The idempotency table too: a replacement would lose the completion records, and
    // recent work would run again. And the breaker's: a replacement mid-outage closes it.
    // And the functions' logs. Each lets a failed first creation delete what it made, so
    // that the deploy can be tried again under the same names.
    let kept = ["LogGroup", "RedriveLogGroup"];
    let deletion = "RetainExceptOnCreate";
    for name in [
        "SourceQueue",
        "DeadLetterQueue",
        "DeadLetterTable",
        "PayloadBucket",
        "IdempotencyTable",
        "BreakerTable",
    ]
    .iter()
    .chain(&kept)
    {
        assert_eq!(
            resources[name]["DeletionPolicy"], deletion,
            "{which} {name}"
        );
        assert_eq!(
            resources[name]["UpdateReplacePolicy"], "Retain",
            "{which} {name}"
        );
    }
}

/// Alarms say in their names whether they page or open a ticket. The ticket alarms go to
/// the ticket topic when one is given, and none of them fires on one expected dead letter.
#[test]
fn alarms_page_or_open_a_ticket_and_one_dead_letter_pages_nobody() {
    let store = translated_template("store");
    let main = translated_template("main");
    let alarm_topic = serde_json::json!({"Fn::If": ["CreateAlarmTopic", {"Ref": "AlarmTopic"}, {"Ref": "AlarmTopicArn"}]});
    let ticket_topic =
        serde_json::json!({"Fn::If": ["HasTicketTopic", {"Ref": "TicketTopicArn"}, alarm_topic]});
    // Without a redrive function nothing redrives, so a dead letter stays until an
    // operator acts: the DLQ's age opens a ticket, and what pages watches the function,
    // its writes, its queue and its breaker, never the DLQ. With one (the main stack's),
    // the oldest dead item's age pages, and so do the redrive function's errors.
    let tickets = [
        "DlqDepthAlarm",
        "DlqAgeAlarm",
        "DeadLetteredAlarm",
        "HandlerThrottlesAlarm",
    ];
    let with_redrive = ["DeadItemAgeAlarm", "RedriveErrorsAlarm"];
    let mut pages = BTreeSet::new();
    for (name, alarm) in resources_of_type(&store, "AWS::CloudWatch::Alarm") {
        let p = &alarm["Properties"];
        let alarm_name = p["AlarmName"]["Fn::Sub"].as_str().unwrap_or_default();
        let (severity, topic) = if tickets.contains(&name.as_str()) {
            ("-ticket-", &ticket_topic)
        } else {
            pages.insert(name.as_str());
            ("-page-", &alarm_topic)
        };
        assert!(
            alarm_name.starts_with("${FunctionName}-") && alarm_name.contains(severity),
            "{name}: {alarm_name}"
        );
        assert_eq!(p["AlarmActions"][0], *topic, "{name}");
        let condition = alarm["Condition"].as_str();
        if with_redrive.contains(&name.as_str()) {
            assert_eq!(condition, Some("HasRedrive"), "{name}");
        }
        if name == "DlqAgeAlarm" {
            assert_eq!(condition, Some("NoRedrive"), "{name}");
        }
    }
    assert_eq!(
        pages,
        BTreeSet::from([
            "BreakerOpenAlarm",
            "DeadLetterFailedAlarm",
            "HandlerErrorsAlarm",
            "SourceAgeAlarm",
            "DeadItemAgeAlarm",
            "RedriveErrorsAlarm",
        ])
    );
    assert_eq!(
        store["Conditions"]["NoRedrive"],
        serde_json::json!({"Fn::Equals": [{"Ref": "RedriveFunctionName"}, ""]})
    );
    assert_eq!(
        store["Conditions"]["HasRedrive"],
        serde_json::json!({"Fn::Not": [{"Fn::Equals": [{"Ref": "RedriveFunctionName"}, ""]}]})
    );
    // A day for a handler's ticket, as docs/DEPLOY.md says; an hour for the main stack's
    // page.
    assert_eq!(store["Parameters"]["DlqAgeAlarmSeconds"]["Default"], 86400);
    assert_eq!(main["Parameters"]["DlqAgeAlarmSeconds"]["Default"], 3600);
    let source_age = &store["Resources"]["SourceAgeAlarm"]["Properties"];
    assert_eq!(source_age["MetricName"], "ApproximateAgeOfOldestMessage");
    assert_eq!(
        source_age["Dimensions"][0]["Value"],
        serde_json::json!({"Fn::GetAtt": ["SourceQueue", "QueueName"]})
    );
    assert_eq!(
        source_age["Threshold"],
        serde_json::json!({"Ref": "SourceAgeAlarmSeconds"})
    );
    let parameters = &store["Parameters"];
    assert_eq!(parameters["TicketTopicArn"]["Default"], "");
    assert_eq!(
        store["Conditions"]["HasTicketTopic"],
        serde_json::json!({"Fn::Not": [{"Fn::Equals": [{"Ref": "TicketTopicArn"}, ""]}]})
    );
    let dead_lettered = &store["Resources"]["DeadLetteredAlarm"]["Properties"];
    assert_eq!(
        dead_lettered["Threshold"],
        serde_json::json!({"Ref": "DeadLetteredAlarmThreshold"})
    );
    assert_eq!(dead_lettered["ComparisonOperator"], "GreaterThanThreshold");
    assert!(
        parameters["DeadLetteredAlarmThreshold"]["Default"]
            .as_u64()
            .is_some_and(|d| d >= 1),
        "one dead letter must not fire it"
    );
    assert_eq!(parameters["DlqDepthAlarmThreshold"]["Default"], 0);
}

/// SNS topics, EventBridge rules and S3 buckets named by parameter may send to the source
/// queue, each service for the resources named only; with none named there is no policy.
#[test]
fn producers_named_may_send_to_the_source_queue_and_no_one_else() {
    let store = translated_template("store");
    producers_may_send(&store);
    // The store's idempotency table is kept (but when its creation rolls back).
    let idempotency = &store["Resources"]["IdempotencyTable"];
    assert_eq!(idempotency["DeletionPolicy"], "RetainExceptOnCreate");
    assert_eq!(idempotency["UpdateReplacePolicy"], "Retain");
}

/// The main stack nests the store and holds no store resource of its own. Every store
/// parameter is the main template's too, with the same type and bounds, passed through:
/// lists joined back into one string, the worker's timeout as the store's `TimeoutSeconds`,
/// and the functions' names. One default differs: the main stack's DLQ age alarm pages (its
/// redrive function runs), and sooner.
#[test]
fn the_main_stack_nests_the_store_and_passes_every_parameter_through() {
    let main = translated_template("main");
    let store = translated_template("main-store");
    let nested = &main["Resources"]["Store"];
    assert_eq!(nested["Type"], "AWS::CloudFormation::Stack");
    let passed = nested["Properties"]["Parameters"].as_object().unwrap();
    let parameters = store["Parameters"].as_object().unwrap();
    assert_eq!(passed.len(), parameters.len());
    for (name, parameter) in parameters {
        let given = match name.as_str() {
            "FunctionName" | "RedriveFunctionName" => continue,
            "TimeoutSeconds" => "WorkerTimeoutSeconds",
            other => other,
        };
        let ours = main["Parameters"]
            .get(given)
            .unwrap_or_else(|| panic!("the main template has no {given}"));
        for field in [
            "Type",
            "AllowedValues",
            "AllowedPattern",
            "MinValue",
            "MaxValue",
        ] {
            assert_eq!(ours.get(field), parameter.get(field), "{given}'s {field}");
        }
        if given != "DlqAgeAlarmSeconds" {
            assert_eq!(ours.get("Default"), parameter.get("Default"), "{given}");
        }
        let expected = if parameter["Type"] == "CommaDelimitedList" {
            serde_json::json!({"Fn::Join": [",", {"Ref": given}]})
        } else {
            serde_json::json!({"Ref": given})
        };
        assert_eq!(passed[name], expected, "{name}");
    }
    // What holds state, alarms, plots or notifies is the store's only.
    for kind in [
        "AWS::SQS::Queue",
        "AWS::DynamoDB::Table",
        "AWS::S3::Bucket",
        "AWS::Logs::LogGroup",
        "AWS::CloudWatch::Alarm",
        "AWS::CloudWatch::Dashboard",
        "AWS::SNS::Topic",
        "AWS::KMS::Key",
    ] {
        assert!(
            resources_of_type(&main, kind).is_empty(),
            "the main template has a {kind} of its own"
        );
    }
}

fn producers_may_send(template: &Value) {
    let policy = &template["Resources"]["SourceQueuePolicy"];
    assert_eq!(policy["Type"], "AWS::SQS::QueuePolicy");
    assert_eq!(policy["Condition"], "HasProducers");
    assert_eq!(
        policy["Properties"]["Queues"],
        serde_json::json!([{"Ref": "SourceQueue"}])
    );
    let statements = policy["Properties"]["PolicyDocument"]["Statement"]
        .as_array()
        .unwrap();
    let expected = [
        (
            "HasProducerTopics",
            "sns.amazonaws.com",
            "ProducerTopicArns",
        ),
        (
            "HasProducerRules",
            "events.amazonaws.com",
            "ProducerRuleArns",
        ),
        (
            "HasProducerBuckets",
            "s3.amazonaws.com",
            "ProducerBucketArns",
        ),
    ];
    assert_eq!(statements.len(), expected.len());
    for (statement, (condition, service, parameter)) in statements.iter().zip(expected) {
        let branches = statement["Fn::If"].as_array().unwrap();
        assert_eq!(branches[0], condition);
        assert_eq!(branches[2], serde_json::json!({"Ref": "AWS::NoValue"}));
        let allow = &branches[1];
        assert_eq!(allow["Effect"], "Allow");
        assert_eq!(allow["Principal"], serde_json::json!({"Service": service}));
        assert_eq!(allow["Action"], "sqs:SendMessage");
        assert_eq!(
            allow["Resource"],
            serde_json::json!({"Fn::GetAtt": ["SourceQueue", "Arn"]})
        );
        assert_eq!(
            allow["Condition"]["ArnEquals"]["aws:SourceArn"],
            serde_json::json!({"Ref": parameter}),
            "{service}"
        );
        let p = &template["Parameters"][parameter];
        assert_eq!(p["Type"], "CommaDelimitedList");
        assert_eq!(p["Default"], "");
        assert_eq!(
            template["Conditions"][condition],
            serde_json::json!({"Fn::Not": [{"Fn::Equals": [{"Fn::Join": ["", {"Ref": parameter}]}, ""]}]})
        );
    }
    // A bucket's ARN names no account: the bucket must be this account's.
    assert_eq!(
        statements[2]["Fn::If"][1]["Condition"]["StringEquals"]["aws:SourceAccount"],
        serde_json::json!({"Ref": "AWS::AccountId"})
    );
    assert_eq!(
        template["Conditions"]["HasProducers"],
        serde_json::json!({"Fn::Or": [
            {"Condition": "HasProducerTopics"},
            {"Condition": "HasProducerRules"},
            {"Condition": "HasProducerBuckets"}
        ]})
    );
}

/// The main template deployed into moto's CloudFormation, with what each part made: the
/// queues, the record table, the bucket, the functions as configured and the roles'
/// policies as resolved. Then deleting the stack keeps what holds messages and records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploys_into_the_emulator() {
    let secret_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:downstream-AbCdEf";
    let main = deploy_main(&[
        ("DownstreamUrl", "https://downstream.example.com/ingest"),
        ("DownstreamAuthHeader", "x-api-key"),
        ("DownstreamAuthSecretArn", secret_arn),
        ("PayloadBuckets", "producer-a,producer-b"),
        ("PayloadMaxBytes", "1048576"),
        ("AlarmEmail", "oncall@example.com"),
    ])
    .await;
    deployed_queues_are_as_declared(&main).await;
    deployed_table_is_as_declared(&main).await;
    deployed_worker_is_configured(&main, secret_arn).await;
    deployed_redrive_is_configured(&main, secret_arn).await;
    deployed_roles_grant_the_buckets_and_secret(&main, secret_arn).await;
    // The alarm key, its alias and the topic are created (moto 5.2.5 does not create the
    // email subscription; checked on the JSON).
    for name in ["AlarmKey", "AlarmKeyAlias", "AlarmTopic"] {
        assert!(
            main.physical.contains_key(name),
            "{name} not created: {:?}",
            main.physical
        );
    }
    deleting_the_stack_keeps_its_state(&main).await;
}

/// Deploys the main template with `parameters` (alarms, the mapping, the dashboard and
/// rules left out: they are checked on the JSON). The stack is created by moto's
/// CloudFormation, which makes every resource in moto, its DynamoDB table included: read
/// them all there, not from DynamoDB Local.
async fn deploy_main(parameters: &[(&str, &str)]) -> Deployment {
    let moto = Endpoints::single(&e2e::emulator().await.shared);
    let main = e2e::stack::deploy(&moto, "stack", translated_template("main"), parameters).await;
    for key in [
        "SourceQueueUrl",
        "DeadLetterQueueUrl",
        "DeadLetterTableName",
        "PayloadBucketName",
        "WorkerFunctionName",
        "RedriveFunctionName",
    ] {
        assert!(
            main.outputs.contains_key(key),
            "output {key} missing: {:?}",
            main.outputs
        );
    }
    main
}

/// The source queue's redrive policy, visibility timeout and encryption, and the DLQ's.
async fn deployed_queues_are_as_declared(main: &Deployment) {
    let (clients, outputs) = (&main.clients, &main.outputs);
    use aws_sdk_sqs::types::QueueAttributeName as Q;
    let source = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&outputs["SourceQueueUrl"])
        .attribute_names(Q::All)
        .send()
        .await
        .unwrap();
    let source = source.attributes().unwrap();
    let redrive: Value = serde_json::from_str(&source[&Q::RedrivePolicy]).unwrap();
    assert_eq!(
        redrive["maxReceiveCount"].to_string().trim_matches('"'),
        "5"
    );
    assert_eq!(
        redrive["deadLetterTargetArn"],
        outputs["DeadLetterQueueArn"]
    );
    assert_eq!(
        source[&Q::VisibilityTimeout],
        "180",
        "6 x the 30 s default timeout"
    );
    assert_eq!(source[&Q::SqsManagedSseEnabled], "true");
    assert!(!source.contains_key(&Q::KmsMasterKeyId), "{source:?}");
    let dlq = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&outputs["DeadLetterQueueUrl"])
        .attribute_names(Q::All)
        .send()
        .await
        .unwrap();
    let dlq = dlq.attributes().unwrap();
    assert_eq!(dlq[&Q::SqsManagedSseEnabled], "true");
    assert!(!dlq.contains_key(&Q::KmsMasterKeyId), "{dlq:?}");
    let retention = |a: &std::collections::HashMap<Q, String>| {
        a[&Q::MessageRetentionPeriod].parse::<u64>().unwrap()
    };
    assert!(
        retention(dlq) > retention(source),
        "DLQ keeps messages longer than the source"
    );
    // (moto 5.2.5 does not keep RedriveAllowPolicy from CloudFormation; checked on the JSON.)
}

/// The record table's key, indexes and billing mode, and the payload bucket.
async fn deployed_table_is_as_declared(main: &Deployment) {
    let (clients, outputs) = (&main.clients, &main.outputs);
    let table = clients
        .dynamodb
        .describe_table()
        .table_name(&outputs["DeadLetterTableName"])
        .send()
        .await
        .unwrap();
    let table = table.table().unwrap();
    let mut indexes: Vec<(String, Vec<String>)> = table
        .global_secondary_indexes()
        .iter()
        .map(|i| {
            (
                i.index_name().unwrap().to_string(),
                i.key_schema()
                    .iter()
                    .map(|k| k.attribute_name().to_string())
                    .collect(),
            )
        })
        .collect();
    indexes.sort();
    assert_eq!(
        indexes,
        [
            (
                "by-signature".to_string(),
                vec!["error_signature".to_string(), "last_attempt".to_string()]
            ),
            (
                "by-status".to_string(),
                vec!["status".to_string(), "last_attempt".to_string()]
            ),
        ]
    );
    assert_eq!(
        table.key_schema()[0].attribute_name(),
        sqs_keeper_aws::schema::ITEM_ID
    );
    // (moto 5.2.5 ignores TimeToLiveSpecification in CloudFormation; checked on the JSON.)
    assert_eq!(
        table.billing_mode_summary().and_then(|b| b.billing_mode()),
        Some(&aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
    );

    // (moto 5.2.5 ignores the bucket's public access block in CloudFormation; checked on
    // the JSON.)
    clients
        .s3
        .head_bucket()
        .bucket(&outputs["PayloadBucketName"])
        .send()
        .await
        .unwrap();
}

/// The worker's variables: every one the code documents, valid to its own validation.
async fn deployed_worker_is_configured(main: &Deployment, secret_arn: &str) {
    let outputs = &main.outputs;
    let lambda = aws_sdk_lambda::Client::new(&main.shared);
    let worker = lambda
        .get_function_configuration()
        .function_name(&outputs["WorkerFunctionName"])
        .send()
        .await
        .unwrap();
    let vars = worker.environment().unwrap().variables().unwrap();
    // The worker's own variables and the store's, which it takes whole.
    let store: serde_json::Map<String, Value> =
        serde_json::from_str(&vars["SQS_KEEPER_STORE"]).unwrap();
    let mut names: BTreeSet<String> = vars
        .keys()
        .filter(|k| *k != "SQS_KEEPER_STORE")
        .cloned()
        .collect();
    names.extend(store.keys().cloned());
    let code: BTreeSet<String> = sqs_keeper_lambda::config::WorkerConfig::documented_variables()
        .keys()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(names, code);
    assert_eq!(store["DLQ_TABLE"], outputs["DeadLetterTableName"]);
    assert_eq!(store["DLQ_QUEUE_URL"], outputs["DeadLetterQueueUrl"]);
    assert_eq!(store["WORKER_MAX_RECEIVE_COUNT"], "5");
    // The deployed values pass the worker's own validation.
    let config =
        sqs_keeper_lambda::config::WorkerConfig::from_lookup(&|k| vars.get(k).cloned()).unwrap();
    assert_eq!(config.handler.batch.max_receive_count, Some(5));
    assert_eq!(
        config.handler.store.as_ref().unwrap().table,
        outputs["DeadLetterTableName"]
    );
    assert_eq!(worker.timeout(), Some(30));
    assert_eq!(worker.handler(), Some("bootstrap"));

    assert_eq!(store["WORKER_PAYLOAD_BUCKETS"], "producer-a,producer-b");
    assert_eq!(store["WORKER_PAYLOAD_MAX_BYTES"], "1048576");
    assert_eq!(vars["WORKER_DOWNSTREAM_AUTH_SECRET"], secret_arn);
    assert_eq!(
        config
            .handler
            .payload
            .allowed_buckets
            .iter()
            .collect::<Vec<_>>(),
        ["producer-a", "producer-b"]
    );
    assert_eq!(config.handler.payload.max_bytes, 1_048_576);
    let auth = config.downstream_auth.unwrap();
    assert_eq!(
        (auth.header.as_str(), auth.secret_id.as_str()),
        ("x-api-key", secret_arn)
    );
}

/// The redrive function's variables and timeout.
async fn deployed_redrive_is_configured(main: &Deployment, secret_arn: &str) {
    let outputs = &main.outputs;
    let lambda = aws_sdk_lambda::Client::new(&main.shared);
    let redrive_fn = lambda
        .get_function_configuration()
        .function_name(&outputs["RedriveFunctionName"])
        .send()
        .await
        .unwrap();
    let vars = redrive_fn.environment().unwrap().variables().unwrap();
    assert_eq!(vars["REDRIVE_SOURCE_QUEUE_URL"], outputs["SourceQueueUrl"]);
    assert_eq!(vars["WORKER_DOWNSTREAM_AUTH_SECRET"], secret_arn);
    assert_eq!(redrive_fn.timeout(), Some(900));
}

/// The roles as deployed: one GetObject and one ListBucket ARN per producer bucket,
/// ListBucket on the payload bucket, the one secret.
async fn deployed_roles_grant_the_buckets_and_secret(main: &Deployment, secret_arn: &str) {
    let (outputs, physical) = (&main.outputs, &main.physical);
    let iam = aws_sdk_iam::Client::new(&main.shared);
    let worker_policy = role_policies(&iam, &physical["WorkerRole"])
        .await
        .join("\n");
    let bucket = &outputs["PayloadBucketName"];
    // A whole ARN, closed by the quote of a JSON (AWS) or Python (moto) string.
    let has = |document: &str, arn: &str| {
        document.contains(&format!("{arn}\"")) || document.contains(&format!("{arn}'"))
    };
    for arn in [
        "arn:aws:s3:::producer-a/*".to_string(),
        "arn:aws:s3:::producer-b/*".to_string(),
        "arn:aws:s3:::producer-a".to_string(),
        "arn:aws:s3:::producer-b".to_string(),
        format!("arn:aws:s3:::{bucket}"),
        secret_arn.to_string(),
    ] {
        assert!(has(&worker_policy, &arn), "{arn} not in {worker_policy}");
    }
    assert!(
        !worker_policy.contains("arn:aws:s3:::/*") && !worker_policy.contains("arn:aws:s3:::,"),
        "an empty bucket name slipped in: {worker_policy}"
    );
    let redrive_policy = role_policies(&iam, &physical["RedriveRole"])
        .await
        .join("\n");
    assert!(redrive_policy.contains(secret_arn), "{redrive_policy}");
    // Its DLQ sweep adopts a message whose body points at a producer's payload by reading
    // that payload: the producers' buckets, read-only.
    for arn in ["arn:aws:s3:::producer-a/*", "arn:aws:s3:::producer-b"] {
        assert!(has(&redrive_policy, arn), "{arn} not in {redrive_policy}");
    }
}

/// Detaches the store's managed policies from the main stack's roles. CloudFormation
/// detaches them when it deletes a role; moto 5.2.5 refuses to delete the role instead
/// (`DeleteConflict`), and with it the stack.
async fn detach_managed_policies(main: &Deployment) {
    let iam = aws_sdk_iam::Client::new(&main.shared);
    for role in ["WorkerRole", "RedriveRole"] {
        let role = &main.physical[role];
        for arn in e2e::stack::attached_policy_arns(&iam, role).await {
            iam.detach_role_policy()
                .role_name(role)
                .policy_arn(arn)
                .send()
                .await
                .unwrap();
        }
    }
}

/// Deleting the stack keeps the queues, the table and the payload bucket.
async fn deleting_the_stack_keeps_its_state(main: &Deployment) {
    use aws_sdk_sqs::types::QueueAttributeName as Q;
    let (clients, outputs, cloudformation, stack) = (
        &main.clients,
        &main.outputs,
        &main.cloudformation,
        &main.stack,
    );
    detach_managed_policies(main).await;
    cloudformation
        .delete_stack()
        .stack_name(stack.as_str())
        .send()
        .await
        .unwrap();
    for _ in 0..120 {
        let described = cloudformation
            .describe_stacks()
            .stack_name(stack.as_str())
            .send()
            .await;
        match described
            .ok()
            .and_then(|d| d.stacks().first().and_then(|s| s.stack_status().cloned()))
        {
            Some(StackStatus::DeleteInProgress) => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            _ => break,
        }
    }
    for queue in ["SourceQueueUrl", "DeadLetterQueueUrl"] {
        clients
            .sqs
            .get_queue_attributes()
            .queue_url(&outputs[queue])
            .attribute_names(Q::QueueArn)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{queue} deleted with the stack: {e:?}"));
    }
    clients
        .dynamodb
        .describe_table()
        .table_name(&outputs["DeadLetterTableName"])
        .send()
        .await
        .expect("table deleted with the stack");
    clients
        .s3
        .head_bucket()
        .bucket(&outputs["PayloadBucketName"])
        .send()
        .await
        .expect("payload bucket deleted with the stack");
}

/// The handler templates on the reusable store (`infra/handler.yaml`, the orders example, and
/// the template `keeper new` writes): each deploys as it is, nesting the store, and the
/// function's variables (the store's, in `SQS_KEEPER_STORE`) pass the runner's own
/// validation, which reads them at start-up. The template a team starts from is at most 40
/// lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_templates_deploy_a_valid_handler_on_the_store() {
    let scaffold = root().join("tests/harness/templates/handler/template.yaml");
    let lines = std::fs::read_to_string(&scaffold).unwrap().lines().count();
    assert!(
        lines <= 40,
        "the template keeper new writes has {lines} lines"
    );
    let store = translated_template("store");
    let redrive = &store["Resources"]["SourceQueue"]["Properties"]["RedrivePolicy"];
    assert_eq!(
        redrive["deadLetterTargetArn"]["Fn::GetAtt"][0],
        "DeadLetterQueue"
    );
    let orders = deploy_handler(
        "handler",
        &[
            ("AlarmTopicArn", "arn:aws:sns:us-east-1:123456789012:alarms"),
            ("EnableIdempotency", "true"),
        ],
    )
    .await;
    assert!(orders.config.idempotency.is_some(), "{:?}", orders.vars);
    assert!(orders.vars.contains_key("ORDERS_TABLE"));
    assert_eq!(
        orders.config.batch.parser.id_source,
        sqs_keeper_core::item::ItemIdSource::JsonPointer("/order_id".into())
    );
    let team = deploy_handler("scaffold", &[]).await;
    assert!(team.config.idempotency.is_none());
    for deployed in [&orders, &team] {
        assert_eq!(deployed.config.batch.max_receive_count, Some(5));
        let store = deployed
            .config
            .store
            .as_ref()
            .expect("the store is configured");
        assert!(deployed.outputs["CliEnvironment"].contains(&store.table));
        // Every variable is the store's, or the handler's own.
        for name in deployed.vars.keys() {
            assert!(
                ["SQS_KEEPER_STORE", "ORDERS_TABLE"].contains(&name.as_str()),
                "{name}"
            );
        }
    }
}

/// The CDK construct (`infra/cdk`) synthesises the store as SAM nests it, resource for
/// resource, and a Rust function that attaches the store's policy, takes its variables
/// whole, runs on arm64 within the timeout the store's queue is sized for, and reports
/// partial batch failures to an event source on the store's queue.
#[test]
fn the_cdk_construct_synthesises_the_store_and_a_rust_handler() {
    let cdk = translated_template("cdk");
    let store = translated_template("store");
    let resources = cdk["Resources"].as_object().unwrap();
    for (name, resource) in store["Resources"].as_object().unwrap() {
        let synthesised = resources
            .get(name)
            .unwrap_or_else(|| panic!("the construct has no {name}"));
        assert_eq!(
            short_get_atts(synthesised.clone()),
            short_get_atts(resource.clone()),
            "{name}"
        );
    }
    let [function] = resources_of_type(&cdk, "AWS::Lambda::Function")[..] else {
        panic!("one function");
    };
    let function = &function.1["Properties"];
    assert_eq!(function["Runtime"], "provided.al2023");
    assert_eq!(function["Handler"], "bootstrap");
    assert_eq!(function["Architectures"], serde_json::json!(["arm64"]));
    assert_eq!(function["TracingConfig"]["Mode"], "Active");
    assert_eq!(
        function["LoggingConfig"]["LogGroup"],
        serde_json::json!({"Ref": "LogGroup"})
    );
    assert_eq!(
        function["Environment"]["Variables"]["SQS_KEEPER_STORE"],
        store["Outputs"]["Environment"]["Value"]
    );
    // A store parameter the app gives stays a parameter, with its constraints, defaulting
    // to the value given.
    let parameters = &cdk["Parameters"];
    assert_eq!(parameters["ItemIdSource"]["Default"], "pointer:/order_id");
    assert_eq!(
        parameters["ItemIdSource"]["AllowedPattern"],
        store["Parameters"]["ItemIdSource"]["AllowedPattern"]
    );
    assert_eq!(
        parameters["FunctionName"]["AllowedValues"],
        serde_json::json!([function["FunctionName"]])
    );
    assert_eq!(
        parameters["TimeoutSeconds"]["AllowedValues"],
        serde_json::json!([function["Timeout"].to_string()])
    );
    let [role] = resources_of_type(&cdk, "AWS::IAM::Role")[..] else {
        panic!("one role");
    };
    let managed = role.1["Properties"]["ManagedPolicyArns"]
        .as_array()
        .unwrap();
    assert!(managed.contains(&serde_json::json!({"Ref": "HandlerPolicy"})));
    let [mapping] = resources_of_type(&cdk, "AWS::Lambda::EventSourceMapping")[..] else {
        panic!("one event source mapping");
    };
    let mapping = &mapping.1["Properties"];
    assert_eq!(
        mapping["EventSourceArn"],
        serde_json::json!({"Fn::GetAtt": ["SourceQueue", "Arn"]})
    );
    assert_eq!(
        mapping["FunctionResponseTypes"],
        serde_json::json!(["ReportBatchItemFailures"])
    );
    assert_eq!(mapping["ScalingConfig"]["MaximumConcurrency"], 10);
}

/// `value` with every `Fn::GetAtt` in its list form: CDK keeps the `Resource.Attribute`
/// form where a template wrote it, SAM's translation writes lists.
fn short_get_atts(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("Fn::GetAtt", Value::String(s)) => {
                        let parts: Vec<Value> =
                            s.splitn(2, '.').map(|p| Value::String(p.into())).collect();
                        (k, Value::Array(parts))
                    }
                    (_, v) => (k, short_get_atts(v)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(short_get_atts).collect()),
        other => other,
    }
}

/// A handler template deployed into the emulator: its outputs, its function's variables and
/// the configuration the runner reads from them.
struct DeployedHandler {
    outputs: std::collections::HashMap<String, String>,
    vars: std::collections::HashMap<String, String>,
    config: sqs_keeper_lambda::config::HandlerConfig,
}

/// Deploys the translated handler template `which` with its nested store.
async fn deploy_handler(which: &str, parameters: &[(&str, &str)]) -> DeployedHandler {
    let moto = Endpoints::single(&e2e::emulator().await.shared);
    let Deployment {
        shared,
        outputs,
        physical,
        ..
    } = e2e::stack::deploy(&moto, which, translated_template(which), parameters).await;
    let lambda = aws_sdk_lambda::Client::new(&shared);
    let function = lambda
        .get_function_configuration()
        .function_name(&physical["Handler"])
        .send()
        .await
        .unwrap();
    // The function's timeout is the store's TimeoutSeconds, which sized the queue.
    assert_eq!(function.timeout(), Some(30), "{which}");
    let vars = function.environment().unwrap().variables().unwrap().clone();
    let config = sqs_keeper_lambda::config::HandlerConfig::from_lookup(&|k| vars.get(k).cloned())
        .unwrap_or_else(|e| panic!("{which}: the template's variables do not validate: {e}"));
    DeployedHandler {
        outputs,
        vars,
        config,
    }
}

/// Every default the README and the docs state for a template parameter is the template's: the
/// parameter table of "Deploy", and the inline `template \`Name\` value` and
/// `` `Name`, default `value` `` forms of the other sections. DEPLOY.md's section on a handler
/// of one's own states the store's defaults, and is held to `store.yaml`.
#[test]
fn the_readme_states_the_template_defaults() {
    // The README and the docs it points to, where the parameters are stated.
    let docs: String = [
        "README.md",
        "docs/DEPLOY.md",
        "docs/HANDLERS.md",
        "docs/OPERATIONS.md",
        "docs/GUARANTEES.md",
        "docs/DEVELOPING.md",
    ]
    .iter()
    .map(|f| std::fs::read_to_string(e2e::stack::root().join(f)).unwrap())
    .collect::<Vec<_>>()
    .join("\n");
    let (main_text, store_text) = split_store_section(&docs);
    let main = translated_template("main");
    let store = translated_template("store");
    let stated = stated_defaults(&main_text, &main);
    assert!(
        stated.len() >= 20,
        "the parameter table was not found: {stated:?}"
    );
    let stated_of_store = stated_defaults(&store_text, &store);
    let mut wrong = wrong_defaults(&stated, &main, "template.yaml");
    wrong.extend(wrong_defaults(&stated_of_store, &store, "store.yaml"));
    assert!(
        wrong.is_empty(),
        "README defaults that are not the template's: {wrong:#?}"
    );
    let main_names = [
        "RedeliveryBaseSeconds",
        "RedeliveryMultiplier",
        "RedeliveryMaxSeconds",
        "EnableBreaker",
        "BreakerAlarmMinutes",
    ];
    let store_names = [
        "SourceAgeAlarmSeconds",
        "DlqAgeAlarmSeconds",
        "DeadLetteredAlarmThreshold",
    ];
    for (stated, names, file) in [
        (&stated, &main_names[..], "template.yaml"),
        (&stated_of_store, &store_names[..], "store.yaml"),
    ] {
        for name in names {
            assert!(
                stated.iter().any(|(n, _)| n == name),
                "the docs' statement of {file}'s {name} default is not checked"
            );
        }
    }
}

/// `docs` without DEPLOY.md's section on a handler of one's own, and that section: the
/// store's defaults are stated there.
fn split_store_section(docs: &str) -> (String, String) {
    let heading = "## A handler of your own: the store and its templates";
    let start = docs.find(heading).expect("DEPLOY.md's store section");
    let end = docs[start + heading.len()..]
        .find("\n## ")
        .map_or(docs.len(), |at| start + heading.len() + at);
    (
        format!("{}{}", &docs[..start], &docs[end..]),
        docs[start..end].to_string(),
    )
}

/// The defaults `text` states for `template`'s parameters: its parameter tables, and the
/// `` `Name` 300 ``, `` `Name` (15) `` and `` `Name`, default `value` `` forms in the prose.
fn stated_defaults(text: &str, template: &Value) -> Vec<(String, String)> {
    let mut stated = table_defaults(text);
    let words: Vec<&str> = text.split_whitespace().collect();
    for (i, word) in words.iter().enumerate() {
        let name = word.trim_matches(|c: char| c == '`' || c == ',' || c == '(' || c == ')');
        if !name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            || template["Parameters"].get(name).is_none()
        {
            continue;
        }
        // A parameter followed by a number states its default, wherever it stands.
        if word.starts_with('`') {
            if let Some(value) = words.get(i + 1) {
                let value = value
                    .trim_start_matches('(')
                    .trim_end_matches([',', ')', '.', ';']);
                if value.chars().all(|c| c.is_ascii_digit()) && !value.is_empty() {
                    stated.push((name.to_string(), value.to_string()));
                }
            }
        }
        if word.ends_with("`,") && words.get(i + 1) == Some(&"default") {
            if let Some(value) = words.get(i + 2) {
                let value = value
                    .trim_end_matches([',', ')', '.', ';'])
                    .trim_matches('`');
                stated.push((name.to_string(), value.to_string()));
            }
        }
    }
    stated
}

/// The rows of every `| parameter | default | meaning |` table in `text`: (name, default).
fn table_defaults(text: &str) -> Vec<(String, String)> {
    let mut stated = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with("| parameter | default | meaning |") {
            in_table = true;
            continue;
        }
        if in_table && !line.starts_with('|') {
            in_table = false;
        }
        if !in_table || line.starts_with("| ---") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let names = cells[1].split(", ").map(|n| n.trim_matches('`'));
        let defaults: Vec<&str> = cells[2].split(", ").map(|d| d.trim_matches('`')).collect();
        for (i, name) in names.enumerate() {
            let default = defaults.get(i).unwrap_or(&defaults[0]);
            stated.push((name.to_string(), (*default).to_string()));
        }
    }
    stated
}

/// The stated defaults that are not `template`'s, each with what the template says.
fn wrong_defaults(stated: &[(String, String)], template: &Value, file: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for (name, default) in stated {
        let parameter = template["Parameters"].get(name).unwrap_or_else(|| {
            panic!("the docs name a parameter {name} that {file} does not have")
        });
        let actual = parameter.get("Default").map(|d| match d {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        let matches = match default.as_str() {
            "(required)" => actual.is_none(),
            "(none)" | "(created)" => actual.as_deref().is_none_or(str::is_empty),
            "(empty)" => actual.as_deref() == Some(""),
            value => actual.as_deref() == Some(value),
        };
        if !matches {
            wrong.push(format!("{name}: docs {default}, {file} {actual:?}"));
        }
    }
    wrong
}

/// The longest the default spacing keeps a message through `receives` deliveries (every
/// delay at its jitter's top).
fn default_spacing(template: &Value, receives: u32) -> Duration {
    let number = |name: &str| template["Parameters"][name]["Default"].as_u64().unwrap();
    let policy = sqs_keeper_core::redelivery::RedeliveryPolicy {
        base: Duration::from_secs(number("RedeliveryBaseSeconds")),
        multiplier: u32::try_from(number("RedeliveryMultiplier")).unwrap(),
        max: Duration::from_secs(number("RedeliveryMaxSeconds")),
    };
    (1..receives).map(|n| policy.delay(n, None, 1.0)).sum()
}

/// CloudFormation's rules cannot compare numbers, so the template cannot refuse a spacing
/// that outlasts the source queue's retention (the worker caps each hide and dead-letters
/// what has no room left, docs/ARCHITECTURE.md §1.11). What it can do is be right by
/// default and say where the limit is: the default `MaxReceiveCount` fits the retention
/// with the longest visibility timeout, and its description states how many receives fit.
#[test]
fn the_default_spacing_fits_the_source_queues_retention() {
    let template = translated_template("main");
    let store = translated_template("main-store");
    let source = &store["Resources"]["SourceQueue"]["Properties"];
    let retention = Duration::from_secs(source["MessageRetentionPeriod"].as_u64().unwrap());
    let longest_visibility = Duration::from_secs(5700);
    let receives = u32::try_from(
        template["Parameters"]["MaxReceiveCount"]["Default"]
            .as_u64()
            .unwrap(),
    )
    .unwrap();
    assert!(default_spacing(&template, receives) + longest_visibility <= retention);
    let fitting = (1..=1000)
        .take_while(|n| default_spacing(&template, *n) + longest_visibility <= retention)
        .last()
        .unwrap();
    let description = template["Parameters"]["MaxReceiveCount"]["Description"]
        .as_str()
        .unwrap();
    assert!(
        description.contains(&format!("up to {fitting} receives")),
        "the description must say that up to {fitting} receives fit: {description}"
    );
}

/// The record table's indexes hold what the queries filter on, not whole records, in the
/// store both templates nest and in the table the local pipeline creates (one list, the
/// code's); a stack first deployed with whole-record indexes can keep them
/// (`IndexProjection=ALL`).
#[test]
fn the_record_indexes_are_narrow_by_default_and_match_the_code() {
    let template = translated_template("store");
    assert_eq!(
        template["Parameters"]["IndexProjection"]["Default"],
        "INCLUDE"
    );
    let table = resources_of_type(&template, "AWS::DynamoDB::Table")
        .into_iter()
        .find(|(_, t)| t["Properties"]["GlobalSecondaryIndexes"].is_array())
        .map(|(_, t)| &t["Properties"])
        .unwrap();
    for index in table["GlobalSecondaryIndexes"].as_array().unwrap() {
        let pk = index["KeySchema"][0]["AttributeName"].as_str().unwrap();
        let projection = &index["Projection"]["Fn::If"];
        assert_eq!(projection[0], "NarrowIndexes");
        assert_eq!(projection[1]["ProjectionType"], "INCLUDE");
        let listed: Vec<String> = projection[1]["NonKeyAttributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert_eq!(listed, sqs_keeper_aws::schema::index_attributes(pk), "{pk}");
        assert_eq!(projection[2]["ProjectionType"], "ALL");
    }
}
