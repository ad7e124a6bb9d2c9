//! CloudWatch Embedded Metric Format (EMF): one JSON line per invocation with the batch
//! counts, plus one per error class with failures. Lambda ships stdout to CloudWatch Logs,
//! which turns these lines into metrics without any API call.

use serde_json::{json, Value};

use crate::batch::BatchCounts;

/// The metric namespace.
pub const NAMESPACE: &str = "SqsWorker";

/// The EMF documents for one invocation's counts.
pub fn emf_documents(counts: &BatchCounts, function_name: &str, timestamp_ms: i64) -> Vec<Value> {
    let count_metrics = [
        ("Records", counts.records),
        ("Done", counts.done),
        ("Skipped", counts.skipped),
        ("RetryLater", counts.retry_later),
        ("DeadLettered", counts.dead_lettered),
        ("DeadLetterFailed", counts.dead_letter_failed),
        ("NotStarted", counts.not_started),
        ("ReportedFailures", counts.reported()),
    ];
    let mut summary = json!({
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["FunctionName"]],
                "Metrics": count_metrics.iter().map(|(name, _)| json!({"Name": name, "Unit": "Count"})).collect::<Vec<_>>(),
            }]
        },
        "FunctionName": function_name,
    });
    for (name, value) in count_metrics {
        summary[name] = json!(value);
    }
    let mut documents = vec![summary];
    for (class, failed) in &counts.by_class {
        documents.push(json!({
            "_aws": {
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE,
                    "Dimensions": [["FunctionName", "ErrorClass"]],
                    "Metrics": [{"Name": "FailedRecords", "Unit": "Count"}],
                }]
            },
            "FunctionName": function_name,
            "ErrorClass": class.as_str(),
            "FailedRecords": failed,
        }));
    }
    documents
}

/// Prints the EMF lines for one invocation to stdout.
pub fn emit(counts: &BatchCounts, function_name: &str) {
    let now = chrono::Utc::now().timestamp_millis();
    for document in emf_documents(counts, function_name, now) {
        println!("{document}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorClass;

    #[test]
    fn documents_carry_counts_and_classes() {
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
        let docs = emf_documents(&counts, "worker", 1_700_000_000_000);
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[0]["Records"], 10);
        assert_eq!(docs[0]["DeadLettered"], 2);
        assert_eq!(docs[0]["ReportedFailures"], 1);
        assert_eq!(
            docs[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            "SqsWorker"
        );
        assert_eq!(
            docs[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
                .len(),
            8
        );
        let classes: Vec<_> = docs[1..]
            .iter()
            .map(|d| d["ErrorClass"].as_str().unwrap())
            .collect();
        assert_eq!(classes, ["throttled", "validation"]);
        assert_eq!(docs[2]["FailedRecords"], 2);
    }
}
