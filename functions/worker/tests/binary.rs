//! The compiled `worker` binary driven over the Lambda Runtime API, as Lambda runs it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use sqs_keeper_local::downstream::{Downstream, DownstreamConfig};
use sqs_keeper_local::function::FunctionProcess;
use sqs_keeper_local::runtime_api::{InvocationResult, RuntimeApi};

/// The worker under test: the packaged bootstrap under `make test`, else the test build's.
fn worker_binary() -> PathBuf {
    sqs_keeper_local::function::binary_under_test(
        "worker",
        std::path::Path::new(env!("CARGO_BIN_EXE_worker")),
    )
}

fn record(n: u32, body: &str) -> serde_json::Value {
    json!({
        "messageId": format!("msg-{n}"),
        "receiptHandle": "rh",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1763700000000"},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:orders",
        "awsRegion": "us-east-1"
    })
}

async fn start(downstream: &Downstream, log: &str) -> (RuntimeApi, FunctionProcess) {
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .unwrap();
    let env = vec![
        ("WORKER_DOWNSTREAM_URL".to_string(), downstream.url()),
        (
            "WORKER_ITEM_ID_SOURCE".to_string(),
            "pointer:/id".to_string(),
        ),
        ("WORKER_RETRY_BASE_DELAY_MS".to_string(), "10".to_string()),
        ("WORKER_MAX_RECEIVE_COUNT".to_string(), "3".to_string()),
    ];
    let log = std::env::temp_dir().join(log);
    let process =
        FunctionProcess::spawn(&worker_binary(), "worker", &api.address(), &env, Some(&log))
            .unwrap();
    (api, process)
}

#[tokio::test]
async fn binary_answers_a_batch_with_exact_partial_failures() {
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .unwrap();
    let (api, _process) = start(&downstream, "worker-binary-batch.log").await;
    let event = json!({"Records": [
        record(1, r#"{"id":"a","scenario":"ok"}"#),
        record(2, r#"{"id":"b","scenario":"throttled"}"#),
        record(3, r#"{"id":"c","scenario":"flaky"}"#),
        record(4, r#"{"id":"d","scenario":"invalid"}"#),
        record(5, "not json"),
    ]});
    let result = api
        .invoke(
            serde_json::to_vec(&event).unwrap().into(),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    let InvocationResult::Response(body) = result else {
        panic!("expected a response, got {result:?}");
    };
    // b: throttled within budget (retry later). d and msg-5: permanent, but no dead-letter
    // store is configured, so they are returned to the queue rather than acknowledged.
    assert_eq!(
        String::from_utf8_lossy(&body),
        r#"{"batchItemFailures":[{"itemIdentifier":"msg-2"},{"itemIdentifier":"msg-4"},{"itemIdentifier":"msg-5"}]}"#
    );
    // The flaky item was retried in the invocation: two 503s, then 200.
    assert_eq!(downstream.answers().get(&503), Some(&2));

    // The same process serves a second invocation (clients built once).
    let ok = json!({"Records": [record(6, r#"{"id":"e"}"#)]});
    let result = api
        .invoke(
            serde_json::to_vec(&ok).unwrap().into(),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    assert_eq!(
        result,
        InvocationResult::Response(r#"{"batchItemFailures":[]}"#.into())
    );
}

fn batch_response_ids(result: &InvocationResult) -> Vec<String> {
    let InvocationResult::Response(body) = result else {
        panic!("expected a batch response, got {result:?}");
    };
    let response: serde_json::Value = serde_json::from_slice(body).unwrap();
    response["batchItemFailures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_string())
        .collect()
}

/// The case that overran Lambda's deadline with the default settings (10 s downstream
/// timeout, 3 attempts, 2 s margin): 20 records, a downstream taking 3.5 s, a 6 s deadline.
/// The answer must come before the deadline, with the delivered records acknowledged.
#[tokio::test]
async fn binary_answers_before_the_deadline_when_the_downstream_hangs() {
    let downstream = Downstream::start(
        0,
        DownstreamConfig {
            slow_delay: Duration::from_millis(3500),
            ..DownstreamConfig::default()
        },
    )
    .await
    .unwrap();
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .unwrap();
    let env = vec![
        ("WORKER_DOWNSTREAM_URL".to_string(), downstream.url()),
        (
            "WORKER_ITEM_ID_SOURCE".to_string(),
            "pointer:/id".to_string(),
        ),
    ];
    let log = std::env::temp_dir().join("worker-binary-hang.log");
    let _process =
        FunctionProcess::spawn(&worker_binary(), "worker", &api.address(), &env, Some(&log))
            .unwrap();
    let records: Vec<serde_json::Value> = (0..20)
        .map(|n| record(n, &format!(r#"{{"id":"h{n}","scenario":"slow"}}"#)))
        .collect();
    let event = serde_json::to_vec(&json!({ "Records": records })).unwrap();
    // Let the process start before the clock of this invocation runs.
    api.first_poll(Duration::from_secs(20)).await.unwrap();
    let started = std::time::Instant::now();
    let result = api
        .invoke(event.into(), Duration::from_secs(6))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(6),
        "answered after {took:?}, past the 6 s deadline"
    );
    let failed = batch_response_ids(&result);
    // Ten ran at once and were delivered at 3.5 s; the other ten were cut at the 4 s
    // cut-off and are returned for retry. None delivered is reported.
    assert_eq!(downstream.delivered().len(), 10, "{failed:?}");
    assert_eq!(failed.len(), 10, "{failed:?}");
    for id in downstream.delivered() {
        let n: u32 = id.trim_start_matches('h').parse().unwrap();
        assert!(
            !failed.contains(&format!("msg-{n}")),
            "delivered {id} must be acknowledged"
        );
    }
}

/// `cargo lambda watch` sends `Lambda-Runtime-Deadline-Ms: 600000`, a time in 1970: the
/// records are processed under a fallback budget, with one warning saying why.
#[tokio::test]
async fn binary_processes_records_under_cargo_lambdas_deadline_header() {
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .unwrap();
    let _ = std::fs::remove_file(std::env::temp_dir().join("worker-binary-1970.log"));
    let (api, _process) = start(&downstream, "worker-binary-1970.log").await;
    let event = json!({"Records": [record(1, r#"{"id":"a"}"#), record(2, r#"{"id":"b"}"#)]});
    for _ in 0..2 {
        let result = api
            .invoke_with_deadline_header(
                serde_json::to_vec(&event).unwrap().into(),
                600_000,
                Duration::from_secs(20),
            )
            .await
            .unwrap();
        assert_eq!(
            result,
            InvocationResult::Response(r#"{"batchItemFailures":[]}"#.into())
        );
    }
    assert_eq!(downstream.delivered(), ["a", "b", "a", "b"]);
    let log = std::fs::read_to_string(std::env::temp_dir().join("worker-binary-1970.log")).unwrap();
    assert_eq!(
        log.matches("had already passed when it arrived").count(),
        1,
        "one warning, naming the cause: {log}"
    );
}

/// A peer's absurd `Retry-After` neither panics the process nor holds the batch.
#[tokio::test]
async fn binary_survives_an_overflowing_retry_after() {
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .unwrap();
    let (api, mut process) = start(&downstream, "worker-binary-retry-after.log").await;
    let event = json!({"Records": [
        record(1, r#"{"id":"a","scenario":"huge_retry_after"}"#),
        record(2, r#"{"id":"b"}"#),
    ]});
    let result = api
        .invoke(
            serde_json::to_vec(&event).unwrap().into(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(batch_response_ids(&result), ["msg-1"]);
    assert!(
        process.exited().is_none(),
        "the worker process must survive"
    );
    let again = json!({"Records": [record(3, r#"{"id":"c"}"#)]});
    let result = api
        .invoke(
            serde_json::to_vec(&again).unwrap().into(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(batch_response_ids(&result), Vec::<String>::new());
}

#[tokio::test]
async fn binary_fails_the_invocation_for_a_record_without_message_id() {
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .unwrap();
    let (api, _process) = start(&downstream, "worker-binary-no-id.log").await;
    let mut nameless = record(1, r#"{"id":"a"}"#);
    nameless.as_object_mut().unwrap().remove("messageId");
    let event = json!({"Records": [record(2, r#"{"id":"b"}"#), nameless]});
    let result = api
        .invoke(
            serde_json::to_vec(&event).unwrap().into(),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    let InvocationResult::Error(body) = result else {
        panic!("expected an invocation error, got {result:?}");
    };
    let error: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["errorType"], "MissingMessageId");
    assert!(error["errorMessage"].as_str().unwrap().contains("record 1"));
    // Nothing was delivered: the whole batch will be retried.
    assert!(downstream.answers().is_empty());
}

#[tokio::test]
async fn binary_refuses_to_start_with_bad_configuration() {
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .unwrap();
    let log = std::env::temp_dir().join("worker-binary-bad-config.log");
    let _ = std::fs::remove_file(&log);
    let env = vec![("WORKER_MAX_CONCURRENCY".to_string(), "lots".to_string())];
    let mut process =
        FunctionProcess::spawn(&worker_binary(), "worker", &api.address(), &env, Some(&log))
            .unwrap();
    let mut status = None;
    for _ in 0..100 {
        status = process.exited();
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = status.expect("the worker should exit");
    assert!(!status.success());
    let output = std::fs::read_to_string(&log).unwrap();
    assert!(
        output.contains("WORKER_DOWNSTREAM_URL: is not set"),
        "{output}"
    );
    assert!(
        output.contains("WORKER_MAX_CONCURRENCY: \"lots\" is not valid"),
        "{output}"
    );
    // Printed once, as `main` returns it.
    assert_eq!(
        output.matches("WORKER_DOWNSTREAM_URL: is not set").count(),
        1,
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_refuses_to_start_without_its_downstream_credential() {
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .unwrap();
    let log = std::env::temp_dir().join(format!(
        "worker-binary-no-secret-{}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&log);
    let secret = e2e::unique_prefix("no-such-secret");
    let mut env = sqs_keeper_local::demo::emulator_env(&e2e::emulator().await, e2e::REGION);
    env.extend([
        (
            "WORKER_DOWNSTREAM_URL".to_string(),
            "http://127.0.0.1:9/ingest".to_string(),
        ),
        (
            "WORKER_DOWNSTREAM_AUTH_HEADER".to_string(),
            "x-api-key".to_string(),
        ),
        ("WORKER_DOWNSTREAM_AUTH_SECRET".to_string(), secret.clone()),
    ]);
    let mut process =
        FunctionProcess::spawn(&worker_binary(), "worker", &api.address(), &env, Some(&log))
            .unwrap();
    let mut status = None;
    for _ in 0..200 {
        status = process.exited();
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = status.expect("the worker should exit");
    assert!(!status.success());
    let output = std::fs::read_to_string(&log).unwrap();
    assert!(
        output.contains(&format!(
            "cannot read the downstream credential from WORKER_DOWNSTREAM_AUTH_SECRET (secret \"{secret}\")"
        )),
        "{output}"
    );
}

/// The compiled binary with the real dead-letter store, against the emulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_dead_letters_into_the_emulator() {
    use e2e::{Pipeline, Setup};
    use sqs_keeper_local::esm::EventSourceMapping;
    use sqs_keeper_local::invokers::RuntimeApiInvoker;

    let p = Pipeline::new("binary", Setup::default()).await;
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .unwrap();
    let mut env = sqs_keeper_local::demo::emulator_env(&e2e::emulator().await, e2e::REGION);
    env.extend(p.resources.store_env());
    env.push(("WORKER_DOWNSTREAM_URL".to_string(), p.downstream.url()));
    env.push((
        "WORKER_ITEM_ID_SOURCE".to_string(),
        "pointer:/id".to_string(),
    ));
    // This run's log only: the assertions below read it.
    let log =
        std::env::temp_dir().join(format!("worker-binary-emulator-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let _process =
        FunctionProcess::spawn(&worker_binary(), "worker", &api.address(), &env, Some(&log))
            .unwrap();
    p.send(&[
        r#"{"id":"good","scenario":"ok"}"#,
        r#"{"id":"bad","scenario":"invalid"}"#,
    ])
    .await;
    let esm = EventSourceMapping::new(
        p.clients.sqs.clone(),
        &p.resources.source_url,
        &p.resources.source_arn,
        e2e::REGION,
        10,
    );
    let invoker = RuntimeApiInvoker {
        api,
        timeout: Duration::from_secs(20),
    };
    let (stats, drained) = esm
        .run_until_drained(&invoker, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(drained);
    assert_eq!(stats.received, 2);
    assert_eq!(
        stats.deleted, 2,
        "good processed, bad dead-lettered: both acked"
    );
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].item_id, "bad");
    assert_eq!(
        records[0].failure_history[0].function_name.as_deref(),
        Some("worker")
    );
    assert_eq!(
        records[0].failure_history[0].log_group.as_deref(),
        Some("/aws/lambda/worker")
    );
    assert!(records[0].failure_history[0].request_id.is_some());
    assert_eq!(p.dlq_messages().await.len(), 1);
    assert_eq!(p.downstream.delivered(), ["good"]);
    // The downstream's answer is in the record for the operator, and not in the logs (a
    // response may echo the item's data); the failure itself is logged.
    let answer = "field 'amount' must be a positive number";
    assert_eq!(
        records[0].failure_history[0].response_excerpt.as_deref(),
        Some(answer)
    );
    assert_eq!(records[0].last_error, "downstream answered 400 Bad Request");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("record failed: dead-lettered"), "{logged}");
    assert!(!logged.contains("must be a positive"), "{logged}");
    // The invocations' EMF documents count the AWS requests they made: the dead letter's
    // record writes and its DLQ message.
    let metrics: Vec<serde_json::Value> = logged
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|value| value.get("_aws").is_some())
        .collect();
    let total = |name: &str| -> f64 {
        metrics
            .iter()
            .filter(|doc| {
                doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|d| d["Name"] == name))
            })
            .filter_map(|doc| doc[name].as_f64())
            .sum()
    };
    assert!(total("DynamoDbRequests") >= 2.0, "{metrics:?}");
    // And the capacity those writes consumed, as DynamoDB reports it.
    assert!(total("DynamoDbWriteUnits") >= 1.0, "{metrics:?}");
    assert!(total("SqsRequests") >= 1.0, "{metrics:?}");
    assert_eq!(total("S3Requests"), 0.0, "{metrics:?}");
}

/// The lines of a function's log, parsed: the log lines (with a `level`) and the EMF
/// documents (with `_aws`). A line that is neither fails the test.
fn log_and_metrics(path: &std::path::Path) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut logs = Vec::new();
    let mut metrics = Vec::new();
    for line in text.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        if value.get("_aws").is_some() {
            metrics.push(value);
        } else {
            assert!(value["level"].is_string(), "neither log nor EMF: {line}");
            logs.push(value);
        }
    }
    (logs, metrics)
}

/// Spawns the worker with these logging variables (and `RUST_LOG` emptied, so a
/// developer's own does not override them).
async fn start_logging(
    downstream: &Downstream,
    log: &std::path::Path,
    logging: &[(&str, &str)],
) -> (RuntimeApi, FunctionProcess) {
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .unwrap();
    let mut env = vec![
        ("WORKER_DOWNSTREAM_URL".to_string(), downstream.url()),
        (
            "WORKER_ITEM_ID_SOURCE".to_string(),
            "pointer:/id".to_string(),
        ),
        ("WORKER_RETRY_BASE_DELAY_MS".to_string(), "10".to_string()),
        ("RUST_LOG".to_string(), String::new()),
    ];
    env.extend(logging.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let _ = std::fs::remove_file(log);
    let process =
        FunctionProcess::spawn(&worker_binary(), "worker", &api.address(), &env, Some(log))
            .unwrap();
    (api, process)
}

/// JSON lines as Lambda's advanced logging controls expect them: flat, with a timestamp,
/// and, for every line of an invocation, its request id and whether it was a cold start;
/// the EMF lines count the cold start and time the batch and each record.
#[tokio::test]
async fn binary_logs_carry_the_request_id_and_cold_start_and_metrics_time_the_batch() {
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .unwrap();
    let log = std::env::temp_dir().join(format!("worker-binary-logs-{}.log", std::process::id()));
    let (api, _process) = start_logging(&downstream, &log, &[]).await;
    let first = json!({"Records": [
        record(1, r#"{"id":"a"}"#),
        record(2, r#"{"id":"b","scenario":"invalid"}"#),
        record(3, r#"{"id":"c","scenario":"flaky"}"#),
    ]});
    let second = json!({"Records": [record(4, r#"{"id":"d"}"#)]});
    for event in [first, second] {
        let result = api
            .invoke(
                serde_json::to_vec(&event).unwrap().into(),
                Duration::from_secs(20),
            )
            .await
            .unwrap();
        assert!(
            matches!(result, InvocationResult::Response(_)),
            "{result:?}"
        );
    }

    let (logs, metrics) = log_and_metrics(&log);
    for line in &logs {
        let timestamp = line["timestamp"].as_str().unwrap();
        assert!(
            timestamp.len() == 24 && timestamp.ends_with('Z'),
            "RFC 3339 UTC with milliseconds: {line}"
        );
        assert_eq!(line["function_name"], "worker", "{line}");
        assert!(
            line.get("fields").is_none() && line.get("span").is_none(),
            "flat: {line}"
        );
    }
    let finished: Vec<_> = logs
        .iter()
        .filter(|l| l["message"] == "batch finished")
        .collect();
    assert_eq!(finished.len(), 2, "{logs:?}");
    assert_eq!(finished[0]["cold_start"], true);
    assert_eq!(finished[1]["cold_start"], false);
    assert_eq!(finished[0]["records"], 3);
    let first_id = finished[0]["requestId"].as_str().unwrap();
    let second_id = finished[1]["requestId"].as_str().unwrap();
    assert!(!first_id.is_empty() && first_id != second_id);
    // Every line logged while the first batch ran carries its request id, those from deep
    // in the batch engine too (no store is configured: the invalid record cannot be
    // dead-lettered and goes back to the queue).
    let failed = logs
        .iter()
        .find(|l| l["message"] == "dead-lettering failed; record returned to the queue")
        .unwrap_or_else(|| panic!("{logs:?}"));
    assert_eq!(failed["requestId"], first_id);
    assert_eq!(failed["cold_start"], true);
    assert_eq!(failed["level"], "ERROR");
    assert_eq!(failed["item_id"], "b");
    // Lines before the first invocation (start-up) have no request id to carry.
    let startup = logs
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .unwrap()
                .starts_with("no dead-letter store")
        })
        .unwrap_or_else(|| panic!("{logs:?}"));
    assert!(startup.get("requestId").is_none(), "{startup}");

    let summaries: Vec<_> = metrics
        .iter()
        .filter(|m| m.get("Records").is_some())
        .collect();
    assert_eq!(summaries.len(), 2, "{metrics:?}");
    assert_eq!(summaries[0]["ColdStart"], 1);
    assert_eq!(summaries[1]["ColdStart"], 0);
    assert_eq!(summaries[0]["FunctionName"], "worker");
    let times = summaries[0]["RecordProcessingTime"].as_array().unwrap();
    assert_eq!(times.len(), 3, "one value per record");
    // Each record's time is real and within the batch's, which includes them all.
    let batch = summaries[0]["BatchDuration"].as_f64().unwrap();
    assert!(
        times
            .iter()
            .all(|t| t.as_f64().unwrap() > 0.0 && t.as_f64().unwrap() <= batch),
        "{times:?} within {batch}"
    );
    assert_eq!(
        summaries[1]["RecordProcessingTime"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// `AWS_LAMBDA_LOG_LEVEL=ERROR` leaves only the errors, still with their request id, and
/// the metrics (which are not log lines).
#[tokio::test]
async fn binary_at_error_level_writes_only_errors_and_metrics() {
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .unwrap();
    let log = std::env::temp_dir().join(format!("worker-binary-errors-{}.log", std::process::id()));
    let (api, _process) =
        start_logging(&downstream, &log, &[("AWS_LAMBDA_LOG_LEVEL", "error")]).await;
    let batch = json!({"Records": [record(1, r#"{"id":"a"}"#), record(2, r#"{"id":"b","scenario":"invalid"}"#)]});
    let mut nameless = record(3, r#"{"id":"c"}"#);
    nameless.as_object_mut().unwrap().remove("messageId");
    let broken = json!({"Records": [nameless]});
    let ok = api
        .invoke(
            serde_json::to_vec(&batch).unwrap().into(),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    assert!(matches!(ok, InvocationResult::Response(_)), "{ok:?}");
    let failed = api
        .invoke(
            serde_json::to_vec(&broken).unwrap().into(),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    assert!(matches!(failed, InvocationResult::Error(_)), "{failed:?}");

    let (logs, metrics) = log_and_metrics(&log);
    assert!(
        logs.iter().all(|l| l["level"] == "ERROR"),
        "only errors at ERROR: {logs:?}"
    );
    let error = logs
        .iter()
        .find(|l| l["message"] == "failing the whole invocation")
        .unwrap_or_else(|| panic!("{logs:?}"));
    assert!(
        error["requestId"].as_str().is_some_and(|id| !id.is_empty()),
        "{error}"
    );
    assert_eq!(error["cold_start"], false);
    // The batch's EMF line is there all the same.
    assert_eq!(
        metrics
            .iter()
            .filter(|m| m.get("Records").is_some())
            .count(),
        1,
        "{metrics:?}"
    );
}

/// A payload's values never reach the logs (docs/ARCHITECTURE.md §1.9): an SNS envelope
/// whose `Message` is a card number, or which breaks off inside one, is dead-lettered with
/// its whole error in the record, and the log line says its class and shape only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_values_in_error_messages_do_not_reach_the_logs() {
    let p = e2e::Pipeline::new("values", e2e::Setup::default()).await;
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .unwrap();
    let mut env = sqs_keeper_local::demo::emulator_env(&e2e::emulator().await, e2e::REGION);
    env.extend(p.resources.store_env());
    env.push(("WORKER_DOWNSTREAM_URL".to_string(), p.downstream.url()));
    env.push(("WORKER_ENVELOPE".to_string(), "sns".to_string()));
    env.push(("RUST_LOG".to_string(), String::new()));
    let log = std::env::temp_dir().join(format!("worker-binary-values-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let _process =
        FunctionProcess::spawn(&worker_binary(), "worker", &api.address(), &env, Some(&log))
            .unwrap();
    let card = "4111111111111111";
    let notification = |message: serde_json::Value| {
        json!({
            "Type": "Notification",
            "MessageId": "n-1",
            "TopicArn": "arn:aws:sns:us-east-1:000000000000:orders",
            "Message": message,
            "Timestamp": "2026-11-25T00:00:00.000Z"
        })
        .to_string()
    };
    let event = json!({"Records": [
        record(1, &notification(json!(4_111_111_111_111_111_u64))),
        record(2, &format!("{{\"Type\":\"Notification\",\"Message\":\"{card}\"")),
    ]});
    let result = api
        .invoke(
            serde_json::to_vec(&event).unwrap().into(),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    assert!(
        matches!(result, InvocationResult::Response(_)),
        "{result:?}"
    );
    let (logs, _) = log_and_metrics(&log);
    let failures: Vec<_> = logs
        .iter()
        .filter(|l| l["message"] == "record failed: dead-lettered")
        .collect();
    assert_eq!(failures.len(), 2, "{logs:?}");
    for line in &failures {
        assert_eq!(line["error_class"], "validation", "{line}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains(card),
        "a payload value reached the log: {text}"
    );
    // The record keeps the whole message for the operator.
    let records = p.records().await;
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(
        records
            .iter()
            .any(|r| r.failure_history[0].error_message.contains(card)),
        "{records:?}"
    );
}

/// Lambda Managed Instances: with `AWS_LAMBDA_MAX_CONCURRENCY` set, one process serves that
/// many invocations at once, and each is answered with its own records and writes its own
/// metrics (its request id on each EMF document, one cold start between them).
#[tokio::test]
async fn binary_serves_concurrent_invocations_each_with_its_own_records_and_metrics() {
    const INVOCATIONS: u32 = 4;
    let downstream = Downstream::start(
        0,
        DownstreamConfig {
            slow_delay: Duration::from_millis(1500),
            ..DownstreamConfig::default()
        },
    )
    .await
    .unwrap();
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .unwrap();
    let env = vec![
        ("WORKER_DOWNSTREAM_URL".to_string(), downstream.url()),
        (
            "WORKER_ITEM_ID_SOURCE".to_string(),
            "pointer:/id".to_string(),
        ),
        (
            "AWS_LAMBDA_MAX_CONCURRENCY".to_string(),
            INVOCATIONS.to_string(),
        ),
    ];
    let log = std::env::temp_dir().join(format!(
        "worker-binary-concurrent-{}.log",
        std::process::id()
    ));
    let _process =
        FunctionProcess::spawn(&worker_binary(), "worker", &api.address(), &env, Some(&log))
            .unwrap();
    // Each invocation: a record the downstream takes 1.5 s over, and one it refuses (no
    // dead-letter store: returned to the queue), with message ids of its own.
    let events: Vec<serde_json::Value> = (0..INVOCATIONS)
        .map(|i| {
            json!({"Records": [
                record(10 * i + 1, &json!({"id": format!("slow-{i}"), "scenario": "slow"}).to_string()),
                record(10 * i + 2, &json!({"id": format!("bad-{i}"), "scenario": "invalid"}).to_string()),
            ]})
        })
        .collect();
    let results = futures::future::join_all(events.iter().map(|event| {
        api.invoke(
            serde_json::to_vec(event).unwrap().into(),
            Duration::from_secs(30),
        )
    }))
    .await;
    for (i, result) in (0..INVOCATIONS).zip(results) {
        assert_eq!(
            batch_response_ids(&result.unwrap()),
            [format!("msg-{}", 10 * i + 2)],
            "invocation {i} answered with another's records"
        );
    }
    // Served at once, not one after another (which would keep this at 1).
    assert!(
        downstream.peak_in_flight() >= 2,
        "the downstream saw at most {} requests at once",
        downstream.peak_in_flight()
    );
    // One summary document per invocation, each with its own request id and counts.
    let text = std::fs::read_to_string(&log).unwrap();
    let summaries: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|doc| doc.get("_aws").is_some() && doc.get("Records").is_some())
        .collect();
    assert_eq!(summaries.len(), INVOCATIONS as usize, "{text}");
    let request_ids: std::collections::BTreeSet<&str> = summaries
        .iter()
        .map(|doc| doc["requestId"].as_str().unwrap())
        .collect();
    assert_eq!(request_ids.len(), INVOCATIONS as usize, "{text}");
    for doc in &summaries {
        assert_eq!(
            (doc["Records"].as_u64(), doc["Done"].as_u64()),
            (Some(2), Some(1)),
            "{doc}"
        );
        assert_eq!(doc["ReportedFailures"], 1, "{doc}");
    }
    let cold_starts: u64 = summaries
        .iter()
        .map(|d| d["ColdStart"].as_u64().unwrap())
        .sum();
    assert_eq!(cold_starts, 1, "one cold start per process: {text}");
    // No warning that the variable is set without the runtime's concurrency.
    assert!(
        !text.contains("concurrency-tokio feature is not enabled"),
        "{text}"
    );
}
