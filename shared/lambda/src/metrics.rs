//! CloudWatch Embedded Metric Format (EMF): the functions' metrics as JSON lines on
//! stdout. Lambda ships stdout to CloudWatch Logs, which turns these lines into metrics
//! without any API call. Namespace [`NAMESPACE`] and dimension `FunctionName`, unless
//! [`crate::metric_names`] says otherwise.
//!
//! Per worker invocation: the batch counts, `ColdStart` (1 on the process's first
//! invocation, else 0, so its sum counts cold starts and its average is their rate; a
//! metric of its own as in Powertools), `BatchDuration` and `RecordProcessingTime` (one
//! value per record the worker started, an EMF array), plus one line per error class with
//! failures. Per redrive invocation that changed something: the [`RedriveReport`]'s counts.
//!
//! An EMF line has no `level`, so Lambda's log-level filter (JSON log format) treats it as
//! INFO: an `ApplicationLogLevel` above INFO drops the metrics with the info lines.

use std::time::Duration;

use serde_json::{json, Value};

use crate::metric_names::MetricNames;
use sqs_keeper_core::batch::BatchCounts;
use sqs_keeper_core::redrive::RedriveReport;

/// The metric namespace when none is chosen ([`crate::metric_names`]).
pub const NAMESPACE: &str = crate::metric_names::DEFAULT_NAMESPACE;

/// The most values one metric may carry in one EMF document (the EMF specification's
/// limit); a batch with more processed records spreads them over more documents.
pub const MAX_VALUES_PER_METRIC: usize = 100;

/// The unit of counts.
const COUNT: &str = "Count";
/// The unit of durations.
const MILLISECONDS: &str = "Milliseconds";
/// EMF unit of ages.
const SECONDS: &str = "Seconds";

/// What one worker invocation measured besides its counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InvocationTimings {
    /// Whether this was the process's first invocation.
    pub cold_start: bool,
    /// From the invocation's arrival to its answer (decoding, records, dead-lettering).
    pub batch_duration: Duration,
    /// Per record the worker started, in event order: fetching its payload, parsing and
    /// processing it with its retries (its dead-letter write, shared by the batch, is in
    /// the batch duration only).
    pub record_times: Vec<Duration>,
    /// The handler's own metrics ([`sqs_keeper_core::context::add_metric`]).
    pub custom: Vec<sqs_keeper_core::context::CustomMetric>,
    /// The invocation's request id, written on each of its documents as the property
    /// `requestId` (not a dimension: it costs no metric): on Lambda Managed Instances one
    /// process serves several invocations at once, and their lines interleave in one stream.
    pub request_id: Option<String>,
}

/// Returns a duration in milliseconds, to the microsecond.
fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1_000_000.0).round() / 1_000.0
}

/// Returns an EMF document: the metadata for `metrics` (name, unit) in the namespace with the
/// `FunctionName` dimension (and `extra_dimension` when given), and the values at the root.
fn document(
    timestamp_ms: i64,
    function_name: &str,
    extra_dimension: Option<(&str, &str)>,
    metrics: &[(&str, &str, Value)],
) -> Value {
    document_named(
        crate::metric_names::current(),
        timestamp_ms,
        function_name,
        extra_dimension,
        metrics,
    )
}

/// [`document`] under the given names: the `FunctionName` set always (the templates'
/// alarms read it), and a second set with the service and the team's dimensions when any
/// is chosen.
fn document_named(
    names: &MetricNames,
    timestamp_ms: i64,
    function_name: &str,
    extra_dimension: Option<(&str, &str)>,
    metrics: &[(&str, &str, Value)],
) -> Value {
    let mut dimensions = vec!["FunctionName"];
    dimensions.extend(extra_dimension.map(|(name, _)| name));
    let team = names.extra();
    let mut sets = vec![dimensions.clone()];
    if !team.is_empty() {
        let mut set = dimensions;
        set.extend(team.iter().map(|(name, _)| *name));
        sets.push(set);
    }
    let definitions: Vec<Value> = metrics
        .iter()
        .map(|(name, unit, _)| json!({"Name": name, "Unit": unit}))
        .collect();
    let mut doc = json!({
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": names.namespace.as_str(),
                "Dimensions": sets,
                "Metrics": definitions,
            }]
        },
        "FunctionName": function_name,
    });
    if let Some((name, value)) = extra_dimension {
        doc[name] = json!(value);
    }
    for (name, value) in team {
        doc[name] = json!(value);
    }
    for (name, _, value) in metrics {
        doc[*name] = value.clone();
    }
    doc
}

/// Adds one metric to a document [`document`] made.
fn add_metric(doc: &mut Value, name: &str, unit: &str, value: Value) {
    if let Some(definitions) = doc["_aws"]["CloudWatchMetrics"][0]["Metrics"].as_array_mut() {
        definitions.push(json!({"Name": name, "Unit": unit}));
    }
    doc[name] = value;
}

/// Adds the handler's metrics: the first hundred values of each to the worker's document
/// (the first of `documents`), the rest in documents of their own, as for the record times.
/// A metric named like one of the team's dimensions is not published: it would overwrite
/// the dimension's value.
fn add_handler_metrics(
    documents: &mut Vec<Value>,
    custom_metrics: &[sqs_keeper_core::context::CustomMetric],
    function_name: &str,
    timestamp_ms: i64,
) {
    let mut custom = Vec::new();
    let dimensions = crate::metric_names::current().extra();
    for metric in custom_metrics {
        // A handler's metric named like a team's dimension would overwrite its value.
        if dimensions.iter().any(|(name, _)| *name == metric.name) {
            tracing::warn!(
                metric = metric.name.as_str(),
                "a metric named like a dimension is not published"
            );
            continue;
        }
        for (n, chunk) in metric.values.chunks(MAX_VALUES_PER_METRIC).enumerate() {
            let value = if chunk.len() == 1 {
                json!(chunk[0])
            } else {
                json!(chunk)
            };
            custom.push((n, metric.name.as_str(), metric.unit.as_str(), value));
        }
    }
    for (n, name, unit, value) in &custom {
        if *n == 0 {
            if let Some(doc) = documents.first_mut() {
                add_metric(doc, name, unit, value.clone());
            }
        } else {
            documents.push(document(
                timestamp_ms,
                function_name,
                None,
                &[(name, unit, value.clone())],
            ));
        }
    }
}

/// Returns the EMF documents for one worker invocation.
pub fn emf_documents(
    counts: &BatchCounts,
    timings: &InvocationTimings,
    function_name: &str,
    timestamp_ms: i64,
) -> Vec<Value> {
    let mut chunks = timings
        .record_times
        .chunks(MAX_VALUES_PER_METRIC)
        .map(|chunk| Value::from(chunk.iter().map(|d| millis(*d)).collect::<Vec<_>>()));
    let mut metrics: Vec<(&str, &str, Value)> = [
        ("Records", counts.records),
        ("Done", counts.done),
        ("Skipped", counts.skipped),
        ("RetryLater", counts.retry_later),
        ("DeadLettered", counts.dead_lettered),
        ("DeadLetterFailed", counts.dead_letter_failed),
        ("NotStarted", counts.not_started),
        ("ReportedFailures", counts.reported()),
    ]
    .into_iter()
    .map(|(name, value)| (name, COUNT, json!(value)))
    .collect();
    metrics.push(("ColdStart", COUNT, json!(u8::from(timings.cold_start))));
    metrics.push((
        "BatchDuration",
        MILLISECONDS,
        json!(millis(timings.batch_duration)),
    ));
    // No records started (all held back or past the cut-off): no value rather than an
    // empty array, which EMF does not define.
    if let Some(first) = chunks.next() {
        metrics.push(("RecordProcessingTime", MILLISECONDS, first));
    }
    let mut documents = vec![document(timestamp_ms, function_name, None, &metrics)];
    for chunk in chunks {
        documents.push(document(
            timestamp_ms,
            function_name,
            None,
            &[("RecordProcessingTime", MILLISECONDS, chunk)],
        ));
    }
    add_handler_metrics(&mut documents, &timings.custom, function_name, timestamp_ms);
    for (class, failed) in &counts.by_class {
        documents.push(document(
            timestamp_ms,
            function_name,
            Some(("ErrorClass", class.as_str())),
            &[("FailedRecords", COUNT, json!(failed))],
        ));
    }
    if let Some(request_id) = &timings.request_id {
        for doc in &mut documents {
            doc["requestId"] = json!(request_id);
        }
    }
    documents
}

/// Prints the EMF lines for one worker invocation to stdout.
pub fn emit(counts: &BatchCounts, timings: &InvocationTimings, function_name: &str) {
    let now = chrono::Utc::now().timestamp_millis();
    for document in emf_documents(counts, timings, function_name, now) {
        println!("{document}");
    }
}

/// The counts a redrive run writes, in the order [`redrive_document`] gives them:
/// `Resolved` is the report's `succeeded`, `Adopted` its `adopted_from_dlq`, and
/// `StoppedEarly` 1 when the run handed back a continuation token. `HeldByBreaker` is 1 when
/// the worker's circuit breaker held the whole run back, and `HeldByGroupBreaker` counts the
/// items a message group's breaker held back.
pub const REDRIVE_METRICS: [&str; 13] = [
    "Selected",
    "Resolved",
    "Requeued",
    "FailedAgain",
    "SkippedIneligible",
    "LeasedElsewhere",
    "NotFound",
    "Errors",
    "Adopted",
    "DlqMessagesDeleted",
    "StoppedEarly",
    "HeldByBreaker",
    "HeldByGroupBreaker",
];

/// The oldest dead record's wait since its last attempt, in seconds: the DLQ age alarm's
/// metric.
pub const OLDEST_DEAD_AGE: &str = "OldestDeadRecordAgeSeconds";

/// Returns the EMF document for one redrive run, or `None` for a dry run (it changed nothing, and
/// its would-be selections counted as `Selected` would overstate what was redriven).
pub fn redrive_document(
    report: &RedriveReport,
    function_name: &str,
    timestamp_ms: i64,
) -> Option<Value> {
    if report.dry_run {
        return None;
    }
    let values = [
        report.selected,
        report.succeeded,
        report.requeued,
        report.failed_again,
        report.skipped_ineligible,
        report.leased_elsewhere,
        report.not_found,
        report.errors,
        report.adopted_from_dlq,
        report.dlq_messages_deleted,
        usize::from(report.continuation_token.is_some()),
        usize::from(report.held_by_breaker.is_some()),
        report.held_by_group_breaker,
    ];
    let mut metrics: Vec<(&str, &str, Value)> = REDRIVE_METRICS
        .into_iter()
        .zip(values)
        .map(|(name, value)| (name, COUNT, json!(value)))
        .collect();
    if let Some(age) = report.oldest_dead_age_secs {
        metrics.push((OLDEST_DEAD_AGE, SECONDS, json!(age)));
    }
    let mut doc = document(timestamp_ms, function_name, None, &metrics);
    // Searchable in Logs Insights, not dimensions: a run id is unique.
    doc["RunId"] = json!(report.run_id);
    doc["Mode"] = serde_json::to_value(report.mode).unwrap_or(Value::Null);
    Some(doc)
}

/// The metrics of one run of the polling control: `PollingStopped` (1 while the worker's
/// polling is stopped after the run, else 0: its maximum over a period says whether polling
/// stopped at all), `PollingPaused` (1 when this run stopped it) and `PollingResumed` (1
/// when this run restored it).
pub const POLLING_METRICS: [&str; 3] = ["PollingStopped", "PollingPaused", "PollingResumed"];

/// Returns the EMF document of one polling control run, or `None` when the run did nothing it
/// can say (another run held the lease, or a call failed).
pub fn polling_document(
    action: &sqs_keeper_core::polling::ControlAction,
    function_name: &str,
    timestamp_ms: i64,
) -> Option<Value> {
    use sqs_keeper_core::polling::ControlAction;
    let (stopped, paused, resumed) = match action {
        ControlAction::Polling | ControlAction::Sweeping => (0, 0, 0),
        ControlAction::Paused => (1, 1, 0),
        ControlAction::StaysPaused { .. } => (1, 0, 0),
        ControlAction::Resumed { .. } => (0, 0, 1),
        _ => return None,
    };
    let [stopped_name, paused_name, resumed_name] = POLLING_METRICS;
    Some(document(
        timestamp_ms,
        function_name,
        None,
        &[
            (stopped_name, COUNT, json!(stopped)),
            (paused_name, COUNT, json!(paused)),
            (resumed_name, COUNT, json!(resumed)),
        ],
    ))
}

/// Prints the EMF line of one polling control run to stdout.
pub fn emit_polling(action: &sqs_keeper_core::polling::ControlAction, function_name: &str) {
    let now = chrono::Utc::now().timestamp_millis();
    if let Some(document) = polling_document(action, function_name, now) {
        println!("{document}");
    }
}

/// Returns the EMF document of the oldest dead record's age alone (the scheduled age report).
#[cfg(feature = "http")]
fn dead_record_age_document(age_secs: u64, function_name: &str, timestamp_ms: i64) -> Value {
    document(
        timestamp_ms,
        function_name,
        None,
        &[(OLDEST_DEAD_AGE, SECONDS, json!(age_secs))],
    )
}

/// Prints the oldest dead record's age as an EMF line to stdout (the redrive function).
#[cfg(feature = "http")]
pub fn emit_dead_record_age(age_secs: u64, function_name: &str) {
    let now = chrono::Utc::now().timestamp_millis();
    println!("{}", dead_record_age_document(age_secs, function_name, now));
}

/// Prints the EMF line for one redrive run to stdout (nothing for a dry run).
pub fn emit_redrive(report: &RedriveReport, function_name: &str) {
    let now = chrono::Utc::now().timestamp_millis();
    if let Some(document) = redrive_document(report, function_name, now) {
        println!("{document}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_teams_names_add_a_dimension_set_beside_the_one_alarms_read() {
        let names = MetricNames {
            namespace: "Payments".parse().unwrap(),
            service: Some("orders".to_string()),
            dimensions: "environment=prod".parse().unwrap(),
        };
        let metrics = [("FailedRecords", COUNT, json!(2))];
        let doc = document_named(&names, 0, "fn", Some(("ErrorClass", "timeout")), &metrics);
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "Payments");
        assert_eq!(
            directive["Dimensions"],
            json!([
                ["FunctionName", "ErrorClass"],
                ["FunctionName", "ErrorClass", "service", "environment"]
            ])
        );
        assert_eq!(doc["service"], "orders");
        assert_eq!(doc["environment"], "prod");
        assert_eq!(doc["ErrorClass"], "timeout");
        // Nothing chosen: the one set, as before.
        let plain = document_named(&MetricNames::default(), 0, "fn", None, &metrics);
        assert_eq!(
            plain["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["FunctionName"]])
        );
        assert_eq!(
            plain["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            "SqsWorker"
        );
    }
    use sqs_keeper_core::redrive::RedriveMode;
    use sqs_keeper_core::ErrorClass;

    #[cfg(feature = "http")]
    #[test]
    fn the_age_report_is_the_dlq_age_alarms_metric() {
        let doc = dead_record_age_document(4_000, "stack-redrive", 1_700_000_000_000);
        assert_eq!(doc["OldestDeadRecordAgeSeconds"], 4_000);
        assert_eq!(doc["FunctionName"], "stack-redrive");
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "SqsWorker");
        assert_eq!(directive["Dimensions"][0][0], "FunctionName");
        assert_eq!(
            directive["Metrics"][0]["Name"],
            "OldestDeadRecordAgeSeconds"
        );
    }

    /// The metric definitions of a document: name → unit.
    fn definitions(doc: &Value) -> Vec<(String, String)> {
        doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["Name"].as_str().unwrap().to_string(),
                    m["Unit"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// Every metric a document defines has a value at its root, and the dimensions too.
    fn assert_valid(doc: &Value) {
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], NAMESPACE);
        for dimension in directive["Dimensions"][0].as_array().unwrap() {
            assert!(
                doc[dimension.as_str().unwrap()].is_string(),
                "{dimension} in {doc}"
            );
        }
        for (name, _) in definitions(doc) {
            let value = &doc[&name];
            assert!(
                value.is_number()
                    || value.as_array().is_some_and(|values| !values.is_empty()
                        && values.len() <= MAX_VALUES_PER_METRIC
                        && values.iter().all(Value::is_number)),
                "{name} = {value} in {doc}"
            );
        }
        assert!(doc["_aws"]["Timestamp"].is_i64());
    }

    #[test]
    fn documents_carry_counts_classes_cold_start_and_times() {
        let mut counts = BatchCounts {
            records: 10,
            done: 6,
            skipped: 1,
            retry_later: 1,
            dead_lettered: 2,
            ..BatchCounts::default()
        };
        counts.by_class.insert(ErrorClass::Validation, 2);
        counts.by_class.insert(ErrorClass::Throttled, 1);
        let timings = InvocationTimings {
            custom: Vec::new(),
            cold_start: true,
            batch_duration: Duration::from_micros(1_234_567),
            record_times: vec![Duration::from_millis(12), Duration::from_micros(3_500)],
            request_id: Some("req-1".to_string()),
        };
        let docs = emf_documents(&counts, &timings, "worker", 1_700_000_000_000);
        assert_eq!(docs.len(), 3);
        docs.iter().for_each(assert_valid);
        // Every document names its invocation, and the request id is no metric.
        assert!(docs.iter().all(|d| d["requestId"] == "req-1"));
        let summary = &docs[0];
        assert_eq!(summary["FunctionName"], "worker");
        assert_eq!(summary["Records"], 10);
        assert_eq!(summary["DeadLettered"], 2);
        assert_eq!(summary["ReportedFailures"], 1);
        assert_eq!(summary["ColdStart"], 1);
        assert_eq!(summary["BatchDuration"], 1234.567);
        assert_eq!(summary["RecordProcessingTime"], json!([12.0, 3.5]));
        let units: std::collections::BTreeMap<_, _> = definitions(summary).into_iter().collect();
        assert_eq!(units.len(), 11);
        assert_eq!(units["Records"], "Count");
        assert_eq!(units["ColdStart"], "Count");
        assert_eq!(units["BatchDuration"], "Milliseconds");
        assert_eq!(units["RecordProcessingTime"], "Milliseconds");
        assert_eq!(
            summary["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["FunctionName"]])
        );
        let classes: Vec<_> = docs[1..]
            .iter()
            .map(|d| d["ErrorClass"].as_str().unwrap())
            .collect();
        assert_eq!(classes, ["throttled", "validation"]);
        assert_eq!(docs[2]["FailedRecords"], 2);
        assert_eq!(
            docs[2]["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["FunctionName", "ErrorClass"]])
        );
    }

    #[test]
    fn a_warm_invocation_reports_cold_start_zero() {
        let timings = InvocationTimings {
            custom: Vec::new(),
            cold_start: false,
            ..InvocationTimings::default()
        };
        let docs = emf_documents(&BatchCounts::default(), &timings, "worker", 0);
        assert_eq!(docs[0]["ColdStart"], 0);
        // No record started: no processing-time value at all (EMF has no empty array).
        assert!(docs[0].get("RecordProcessingTime").is_none());
        assert!(!definitions(&docs[0])
            .iter()
            .any(|(name, _)| name == "RecordProcessingTime"));
        assert_valid(&docs[0]);
    }

    #[test]
    fn more_than_a_hundred_record_times_spread_over_documents() {
        let timings = InvocationTimings {
            custom: Vec::new(),
            cold_start: false,
            batch_duration: Duration::from_secs(1),
            record_times: (1..=250).map(Duration::from_millis).collect(),
            request_id: None,
        };
        let counts = BatchCounts {
            records: 250,
            done: 250,
            ..BatchCounts::default()
        };
        let docs = emf_documents(&counts, &timings, "worker", 0);
        assert_eq!(docs.len(), 3);
        docs.iter().for_each(assert_valid);
        let values: Vec<f64> = docs
            .iter()
            .flat_map(|d| d["RecordProcessingTime"].as_array().unwrap().clone())
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(values, (1..=250).map(f64::from).collect::<Vec<_>>());
        // The extra documents carry only the processing times: counts are not repeated.
        assert_eq!(definitions(&docs[1]).len(), 1);
        assert!(docs[1].get("Records").is_none());
    }

    #[test]
    fn redrive_document_carries_the_age_of_the_oldest_dead_record() {
        let mut aged = RedriveReport::default();
        aged.oldest_dead_age_secs = Some(108_000);
        let doc = redrive_document(&aged, "redrive", 0).unwrap();
        assert_valid(&doc);
        assert_eq!(doc["OldestDeadRecordAgeSeconds"], json!(108_000));
        let none = redrive_document(&RedriveReport::default(), "redrive", 0);
        assert!(none.is_none_or(|doc| doc.get("OldestDeadRecordAgeSeconds").is_none()));
    }

    /// A run the worker's breaker held back says so, for the dashboard's breaker widget.
    #[test]
    fn a_run_the_breaker_held_back_counts_one() {
        let mut held = RedriveReport::default();
        held.held_by_breaker = Some("open period running".to_string());
        let doc = redrive_document(&held, "redrive", 0).unwrap();
        assert_eq!(doc["HeldByBreaker"], 1);
        let ran = redrive_document(&RedriveReport::default(), "redrive", 0).unwrap();
        assert_eq!(ran["HeldByBreaker"], 0);
    }

    #[test]
    fn redrive_document_carries_the_reports_counts() {
        let mut report = RedriveReport::default();
        report.run_id = "run-1".to_string();
        report.mode = RedriveMode::Reprocess;
        report.selected = 9;
        report.succeeded = 4;
        report.failed_again = 2;
        report.skipped_ineligible = 1;
        report.not_found = 1;
        report.errors = 1;
        report.adopted_from_dlq = 3;
        report.dlq_messages_deleted = 4;
        report.held_by_group_breaker = 2;
        report.continuation_token = Some("next".to_string());
        let doc = redrive_document(&report, "redrive", 1_700_000_000_000).unwrap();
        assert_valid(&doc);
        assert_eq!(doc["FunctionName"], "redrive");
        for (name, value) in [
            ("Selected", 9),
            ("Resolved", 4),
            ("Requeued", 0),
            ("FailedAgain", 2),
            ("SkippedIneligible", 1),
            ("LeasedElsewhere", 0),
            ("NotFound", 1),
            ("Errors", 1),
            ("Adopted", 3),
            ("DlqMessagesDeleted", 4),
            ("StoppedEarly", 1),
            ("HeldByBreaker", 0),
            ("HeldByGroupBreaker", 2),
        ] {
            assert_eq!(doc[name], value, "{name}");
        }
        assert!(definitions(&doc).iter().all(|(_, unit)| unit == "Count"));
        assert_eq!(definitions(&doc).len(), REDRIVE_METRICS.len());
        assert_eq!(doc["RunId"], "run-1");
        assert_eq!(doc["Mode"], "reprocess");
        assert!(doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["Name"] != "RunId"));
    }

    /// The polling control's runs say whether polling is stopped, and when it stopped or
    /// came back; a run that did nothing says nothing.
    #[test]
    fn a_polling_control_run_says_whether_polling_is_stopped() {
        use sqs_keeper_core::polling::ControlAction;
        let values = |action: &ControlAction| {
            polling_document(action, "redrive", 0)
                .map(|doc| POLLING_METRICS.map(|name| doc[name].as_u64().unwrap_or(u64::MAX)))
        };
        assert_eq!(values(&ControlAction::Paused), Some([1, 1, 0]));
        assert_eq!(
            values(&ControlAction::StaysPaused { probe: None }),
            Some([1, 0, 0])
        );
        assert_eq!(
            values(&ControlAction::Resumed { probe: None }),
            Some([0, 0, 1])
        );
        assert_eq!(values(&ControlAction::Polling), Some([0, 0, 0]));
        assert_eq!(values(&ControlAction::Sweeping), Some([0, 0, 0]));
        assert_eq!(values(&ControlAction::Busy), None);
        let failed = ControlAction::Failed {
            error: "x".to_string(),
        };
        assert_eq!(values(&failed), None);
        let doc = polling_document(&ControlAction::Paused, "redrive", 0).unwrap();
        assert_eq!(doc["FunctionName"], "redrive");
    }

    #[test]
    fn a_dry_run_emits_no_metrics() {
        let mut report = RedriveReport::default();
        report.dry_run = true;
        report.selected = 5;
        assert_eq!(redrive_document(&report, "redrive", 0), None);
    }
}
