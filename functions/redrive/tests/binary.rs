//! The compiled `redrive` binary over the Lambda Runtime API, against the emulator, and
//! reached the way operators reach it: `dlq redrive --via-function`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use e2e::Pipeline;
use serde_json::Value;
use sqs_keeper_core::dead_letter::ItemStatus;
use sqs_keeper_local::function::FunctionProcess;
use sqs_keeper_local::lambda_api::LambdaApi;
use sqs_keeper_local::runtime_api::{InvocationResult, RuntimeApi};

async fn setup(name: &str) -> (Pipeline, Arc<RuntimeApi>, FunctionProcess, PathBuf) {
    let bodies: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|id| e2e::body(id, "throttled"))
        .collect();
    let p = Pipeline::with_dead_items(name, &bodies).await;
    p.downstream.fix();
    let api = Arc::new(
        RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:redrive")
            .await
            .unwrap(),
    );
    let mut env = sqs_keeper_local::demo::emulator_env(&e2e::emulator().await, e2e::REGION);
    env.extend(p.resources.store_env());
    env.push(("WORKER_DOWNSTREAM_URL".into(), p.downstream.url()));
    env.push(("WORKER_ITEM_ID_SOURCE".into(), "pointer:/id".into()));
    // The logging the tests read: Lambda's defaults, whatever a developer's RUST_LOG says.
    env.push(("RUST_LOG".into(), String::new()));
    let log = std::env::temp_dir().join(format!("redrive-{name}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let process = FunctionProcess::spawn(
        &sqs_keeper_local::function::binary_under_test(
            "redrive",
            std::path::Path::new(env!("CARGO_BIN_EXE_redrive")),
        ),
        "redrive",
        &api.address(),
        &env,
        Some(&log),
    )
    .unwrap();
    (p, api, process, log)
}

/// A function's log lines (with a `level`) and EMF documents (with `_aws`), parsed.
fn log_and_metrics(path: &Path) -> (Vec<Value>, Vec<Value>) {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let (metrics, logs): (Vec<Value>, Vec<Value>) =
        lines.into_iter().partition(|l| l.get("_aws").is_some());
    assert!(logs.iter().all(|l| l["level"].is_string()), "{logs:?}");
    (logs, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_answers_requests_with_reports() {
    let (p, api, _process, log) = setup("redrivefn").await;
    let bad = api
        .invoke(r#"{"mood":"requeue"}"#.into(), Duration::from_secs(30))
        .await
        .unwrap();
    let InvocationResult::Error(body) = bad else {
        panic!("expected an error, got {bad:?}");
    };
    let error: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["errorType"], "InvalidRequest");
    assert!(error["errorMessage"]
        .as_str()
        .unwrap()
        .contains("unknown field `mood`"));

    let result = api
        .invoke(
            r#"{"item_ids":["a"],"mode":"reprocess"}"#.into(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let InvocationResult::Response(body) = result else {
        panic!("expected a report, got {result:?}");
    };
    let report: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(report["succeeded"], 1, "{report}");
    assert_eq!(report["items"][0]["outcome"], "resolved");
    assert_eq!(
        p.store().get("a").await.unwrap().unwrap().status,
        ItemStatus::Resolved
    );

    // A dry run changes nothing and counts nothing.
    let dry = api
        .invoke(
            r#"{"item_ids":["b"],"dry_run":true}"#.into(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(matches!(dry, InvocationResult::Response(_)), "{dry:?}");

    let (logs, metrics) = log_and_metrics(&log);
    assert_eq!(
        metrics.len(),
        1,
        "one EMF line, for the run that changed something: {metrics:?}"
    );
    let run = &metrics[0];
    let directive = &run["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(
        directive["Namespace"],
        sqs_keeper_lambda::metrics::NAMESPACE
    );
    assert_eq!(
        directive["Dimensions"],
        serde_json::json!([["FunctionName"]])
    );
    assert_eq!(run["FunctionName"], "redrive");
    for (name, value) in [
        ("Selected", 1),
        ("Resolved", 1),
        ("FailedAgain", 0),
        ("Errors", 0),
        ("Adopted", 0),
        ("StoppedEarly", 0),
    ] {
        assert_eq!(run[name], value, "{name} in {run}");
    }
    assert_eq!(run["RunId"], report["run_id"]);
    // The request id and cold start on the function's own lines: the refused request was
    // the process's first invocation, the run its second.
    let finished: Vec<_> = logs
        .iter()
        .filter(|l| l["message"] == "redrive finished")
        .collect();
    assert_eq!(finished.len(), 2, "{logs:?}");
    assert_eq!(finished[0]["cold_start"], false);
    assert_eq!(finished[0]["selected"], 1);
    assert!(finished[0]["timestamp"].as_str().unwrap().ends_with('Z'));
    let ids: BTreeSet<&str> = logs
        .iter()
        .filter_map(|l| l["requestId"].as_str())
        .collect();
    assert_eq!(
        ids.len(),
        3,
        "three invocations, three request ids: {logs:?}"
    );
    let refused = logs
        .iter()
        .find(|l| l["level"] == "ERROR")
        .unwrap_or_else(|| panic!("the refused request is logged: {logs:?}"));
    assert_eq!(refused["cold_start"], true, "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_redrive_via_function() {
    let (p, api, _process, log) = setup("viafn").await;
    let lambda = LambdaApi::start("my-redrive", api.clone(), Duration::from_secs(30))
        .await
        .unwrap();
    let cli = sqs_keeper_cli::Cli::parse_from([
        "dlq",
        "--endpoint-url",
        &lambda.url(),
        "--region",
        e2e::REGION,
        "redrive",
        "--mode",
        "requeue",
        "--via-function",
        "my-redrive",
    ]);
    // Credentials for the Lambda client (the endpoint ignores them).
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    let code = sqs_keeper_cli::run(cli).await;
    assert_eq!(code, std::process::ExitCode::SUCCESS);
    for id in ["a", "b", "c"] {
        assert_eq!(
            p.store().get(id).await.unwrap().unwrap().status,
            ItemStatus::Requeued,
            "{id}: requeued, resolved once the worker finishes it"
        );
    }
    assert_eq!(p.dlq_depth().await, 0);
    assert_eq!(p.source_depth().await, 3, "requeued to the source queue");
    let (_, metrics) = log_and_metrics(&log);
    assert_eq!(metrics.len(), 1, "{metrics:?}");
    assert_eq!(metrics[0]["Requeued"], 3);
    assert_eq!(metrics[0]["Selected"], 3);
    assert_eq!(metrics[0]["Mode"], "requeue");

    let missing = sqs_keeper_cli::Cli::parse_from([
        "dlq",
        "--endpoint-url",
        &lambda.url(),
        "--region",
        e2e::REGION,
        "redrive",
        "--via-function",
        "no-such-function",
    ]);
    assert_ne!(
        sqs_keeper_cli::run(missing).await,
        std::process::ExitCode::SUCCESS
    );
}
