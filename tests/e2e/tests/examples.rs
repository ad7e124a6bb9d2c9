//! The example handlers (`examples/`), each as its compiled binary over the Lambda Runtime
//! API, fed by the local event source mapping from queues on the emulator, dead-lettering
//! into the real store: what a team writing its own handler gets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use e2e::{Pipeline, Setup};
use serde_json::{json, Value};
use sqs_keeper_lambda::ErrorClass;
use sqs_keeper_local::function::FunctionProcess;
use sqs_keeper_local::invokers::RuntimeApiInvoker;
use sqs_keeper_local::runtime_api::{InvocationResult, RuntimeApi};

/// A running example: its Runtime API, its process and the file its output goes to.
struct Running {
    api: RuntimeApi,
    _process: FunctionProcess,
    log: PathBuf,
}

/// Starts the example binary `binary` with the pipeline's store, the emulator's endpoints
/// and `extra` variables, as Lambda would start it.
async fn start(binary: &str, p: &Pipeline, extra: &[(&str, String)], log: &str) -> Running {
    let api = RuntimeApi::start(&format!(
        "arn:aws:lambda:us-east-1:000000000000:function:{binary}"
    ))
    .await
    .unwrap();
    let mut env = sqs_keeper_local::demo::emulator_env(&e2e::emulator().await, e2e::REGION);
    env.extend(p.resources.store_env());
    env.push(("WORKER_RETRY_BASE_DELAY_MS".into(), "10".into()));
    env.push(("WORKER_DEADLINE_MARGIN_MS".into(), "1000".into()));
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let log = std::env::temp_dir().join(format!("{log}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let process = FunctionProcess::spawn(
        &e2e::function_binary(binary),
        binary,
        &api.address(),
        &env,
        Some(&log),
    )
    .unwrap();
    Running {
        api,
        _process: process,
        log,
    }
}

/// Polls the source queue into the function until it is empty.
async fn drain(p: &Pipeline, running: Running) -> (sqs_keeper_local::esm::EsmStats, PathBuf) {
    let invoker = RuntimeApiInvoker {
        api: running.api,
        timeout: Duration::from_secs(20),
    };
    let (stats, drained) = p
        .esm
        .run_until_drained(&invoker, Duration::from_secs(90))
        .await
        .unwrap();
    assert!(drained, "{stats:?}");
    (stats, running.log)
}

/// The function's output: its JSON log lines and its EMF documents.
fn output(log: &PathBuf) -> (Vec<Value>, Vec<Value>) {
    let text = std::fs::read_to_string(log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let (metrics, logs): (Vec<Value>, Vec<Value>) =
        lines.into_iter().partition(|v| v.get("_aws").is_some());
    (logs, metrics)
}

async fn item(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    key: &str,
    value: &str,
) -> Option<std::collections::HashMap<String, AttributeValue>> {
    client
        .get_item()
        .table_name(table)
        .key(key, AttributeValue::S(value.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
}

fn number(item: &std::collections::HashMap<String, AttributeValue>, name: &str) -> i64 {
    item[name].as_n().unwrap().parse().unwrap()
}

fn order(id: &str, qty: Value) -> String {
    json!({"order_id": id, "customer": "c-9", "lines": [{"sku": "tea", "qty": qty, "unit_price_cents": 250}]})
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_are_stored_once_and_what_never_fits_is_dead_lettered_on_first_sight() {
    let p = Pipeline::new("orders", Setup::default()).await;
    let table = e2e::create_table(&p.clients.dynamodb, "orders", "order_id").await;
    let running = start(
        "orders-worker",
        &p,
        &[
            ("ORDERS_TABLE", table.clone()),
            ("WORKER_ITEM_ID_SOURCE", "pointer:/order_id".into()),
            // Every record's line, where the handler's fields are read below.
            ("WORKER_LOG_RECORDS", "all".into()),
        ],
        "orders",
    )
    .await;
    let good = order("o-1", json!(2));
    p.send(&[
        &good,
        &good, // the same order twice: stored once
        &order("o-2", json!("2")),
        &order("o-3", json!(0)),
        "not json",
    ])
    .await;
    let (stats, log) = drain(&p, running).await;
    assert_eq!(stats.received, 5, "each delivered once: {stats:?}");
    assert_eq!(stats.deleted, 5, "{stats:?}");

    let stored = item(&p.clients.dynamodb, &table, "order_id", "o-1")
        .await
        .unwrap();
    assert_eq!(number(&stored, "total_cents"), 500);
    for absent in ["o-2", "o-3"] {
        assert!(item(&p.clients.dynamodb, &table, "order_id", absent)
            .await
            .is_none());
    }

    let records: BTreeMap<String, _> = p
        .records()
        .await
        .into_iter()
        .map(|r| (r.item_id.clone(), r))
        .collect();
    assert_eq!(records.len(), 3, "{:?}", records.keys());
    for record in records.values() {
        assert_eq!(record.error_class, ErrorClass::Validation);
        assert_eq!(record.failure_count, 1, "dead-lettered on first sight");
    }
    assert!(
        records["o-2"].last_error.contains("lines[0].qty"),
        "{}",
        records["o-2"].last_error
    );
    assert!(records["o-3"].last_error.contains("quantity 0"));
    assert_eq!(p.dlq_messages().await.len(), 3);

    let (logs, metrics) = output(&log);
    // The handler's fields are flat on the worker's own line for the record.
    assert!(
        logs.iter().any(|l| l["message"] == "record done"
            && l["order_id"] == "o-1"
            && l["customer"] == "c-9"
            && l["item_id"] == "o-1"),
        "{logs:#?}"
    );
    // Its metric is in the worker's EMF document, in the worker's namespace.
    let custom: Vec<&Value> = metrics
        .iter()
        .filter(|m| m.get("OrderValueCents").is_some())
        .collect();
    assert_eq!(custom.len(), 1, "{metrics:#?}");
    assert_eq!(custom[0]["OrderValueCents"], json!(500.0));
    assert_eq!(
        custom[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"],
        "SqsWorker"
    );
    assert!(custom[0].get("Done").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_own_aws_error_is_classified_a_missing_table_is_not_retried() {
    let p = Pipeline::new("orders-missing", Setup::default()).await;
    let running = start(
        "orders-worker",
        &p,
        &[
            ("ORDERS_TABLE", "no-such-table".into()),
            ("WORKER_ITEM_ID_SOURCE", "pointer:/order_id".into()),
        ],
        "orders-missing",
    )
    .await;
    p.send(&[&order("o-1", json!(1))]).await;
    let (stats, _) = drain(&p, running).await;
    assert_eq!(stats.received, 1, "not redelivered: {stats:?}");
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error_class, ErrorClass::NotFound);
    assert_eq!(records[0].failure_count, 1, "not retried");
    assert!(
        records[0].last_error.contains("ResourceNotFoundException"),
        "{}",
        records[0].last_error
    );
}

/// An SNS notification as SNS delivers it to SQS with raw message delivery off.
fn sns(message_id: &str, message: &Value) -> String {
    json!({
        "Type": "Notification",
        "MessageId": message_id,
        "SequenceNumber": "10000000000000000001",
        "TopicArn": "arn:aws:sns:us-east-1:000000000000:ledger.fifo",
        "Message": message.to_string(),
        "Timestamp": "2026-11-24T10:00:00.000Z",
        "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe"
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sns_to_fifo_movements_apply_in_order_once_and_a_foreign_body_is_dead_lettered() {
    let p = Pipeline::new(
        "ledger",
        Setup {
            fifo: true,
            ..Setup::default()
        },
    )
    .await;
    let table = e2e::create_table(&p.clients.dynamodb, "ledger", "account").await;
    let running = start(
        "ledger-worker",
        &p,
        &[
            ("LEDGER_TABLE", table.clone()),
            ("WORKER_ENVELOPE", "sns".into()),
            // Every record's line, where the handler's fields are read below.
            ("WORKER_LOG_RECORDS", "all".into()),
        ],
        "ledger",
    )
    .await;
    let movement = |account: &str, seq: u64, amount: i64| json!({"account": account, "seq": seq, "amount_cents": amount});
    let confirmation =
        sns("sns-0", &json!("confirm")).replace("\"Notification\"", "\"SubscriptionConfirmation\"");
    let foreign = movement("a-2", 2, 5).to_string();
    for (body, group, dedup) in [
        (confirmation.as_str(), "sns", "d0"),
        (&sns("sns-1", &movement("a-1", 1, 1000)), "a-1", "d1"),
        (&sns("sns-2", &movement("a-1", 2, -300)), "a-1", "d2"),
        (&sns("sns-3", &movement("a-2", 1, 50)), "a-2", "d3"),
        // A replay of movement 1 under another SNS message id: applied once only.
        (&sns("sns-4", &movement("a-1", 1, 1000)), "a-1", "d4"),
        // Not an SNS notification (raw delivery switched on by mistake).
        (foreign.as_str(), "a-2", "d5"),
    ] {
        p.send_fifo(body, group, dedup).await;
    }
    let (stats, log) = drain(&p, running).await;
    assert_eq!(stats.deleted, 6, "{stats:?}");

    let a1 = item(&p.clients.dynamodb, &table, "account", "a-1")
        .await
        .unwrap();
    assert_eq!(number(&a1, "balance_cents"), 700);
    assert_eq!(number(&a1, "last_seq"), 2);
    let a2 = item(&p.clients.dynamodb, &table, "account", "a-2")
        .await
        .unwrap();
    assert_eq!(number(&a2, "balance_cents"), 50);

    let records = p.records().await;
    assert_eq!(records.len(), 1, "only the foreign body");
    assert_eq!(records[0].error_class, ErrorClass::Validation);
    assert!(
        records[0].last_error.contains("not an SNS notification"),
        "{}",
        records[0].last_error
    );
    // Kept as it arrived, for a redrive once the subscription is fixed.
    assert_eq!(
        records[0].payload.location,
        sqs_keeper_core::dead_letter::PayloadLocation::Inline {
            body: foreign.clone()
        }
    );
    let (logs, _) = output(&log);
    // Items are keyed by the SNS message id; the topic rides on the record's log line.
    assert!(
        logs.iter().any(|l| l["message"] == "record done"
            && l["item_id"] == "sns-2"
            && l["account"] == "a-1"
            && l["topic"] == "arn:aws:sns:us-east-1:000000000000:ledger.fifo"),
        "{logs:#?}"
    );
    assert!(logs
        .iter()
        .any(|l| l["message"] == "skipped a service notice"));
}

fn record(message_id: &str, body: &str, queue_arn: &str) -> Value {
    json!({
        "messageId": message_id,
        "receiptHandle": "rh",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1763700000000"},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": "us-east-1"
    })
}

fn failures(result: &InvocationResult) -> Vec<String> {
    let InvocationResult::Response(body) = result else {
        panic!("expected a batch response, got {result:?}");
    };
    let response: Value = serde_json::from_slice(body).unwrap();
    response["batchItemFailures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_notification_is_sent_once_despite_duplicates_and_concurrent_sandboxes() {
    let p = Pipeline::new("notify", Setup::default()).await;
    // Keys are the function's name ("notify-worker" here), `#` and the item id.
    let table = e2e::idempotency_table(&p.clients.dynamodb, "notify").await;
    let env = [
        ("NOTIFY_URL", p.downstream.url()),
        ("WORKER_IDEMPOTENCY_TABLE", table.clone()),
        ("WORKER_ITEM_ID_SOURCE", "pointer:/id".into()),
    ];

    // Duplicates through the queue: the same notification sent twice.
    let running = start("notify-worker", &p, &env, "notify").await;
    let n1 = e2e::body("n-1", "ok");
    // n-4: the service refuses it (400): dead-lettered, its claim released.
    p.send(&[&n1, &e2e::body("n-2", "ok"), &e2e::body("n-4", "invalid")])
        .await;
    p.send(&[&n1]).await;
    let (stats, log) = drain(&p, running).await;
    assert_eq!(stats.deleted, 4, "{stats:?}");
    assert_eq!(p.downstream.calls("n-1"), 1, "sent once");
    assert_eq!(p.downstream.calls("n-2"), 1);
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].item_id, "n-4");
    assert_eq!(records[0].error_class, ErrorClass::Validation);
    assert!(
        item(&p.clients.dynamodb, &table, "id", "notify-worker#n-4")
            .await
            .is_none(),
        "a failed item holds no claim"
    );
    assert_eq!(
        item(&p.clients.dynamodb, &table, "id", "notify-worker#n-1")
            .await
            .unwrap()["status"]
            .as_s()
            .unwrap(),
        "completed"
    );
    let (logs, _) = output(&log);
    assert!(
        logs.iter()
            .any(|l| l["message"] == "batch finished" && l["skipped"] == 1),
        "the duplicate was skipped: {logs:#?}"
    );

    // Two sandboxes get the same message at once (a standard queue's duplicate): the
    // notification (slow: 2 s) is sent by one; the other does not send it.
    let a = start("notify-worker", &p, &env, "notify-a").await;
    let b = start("notify-worker", &p, &env, "notify-b").await;
    let slow = e2e::body("n-3", "slow");
    let event = |id: &str| {
        serde_json::to_vec(&json!({"Records": [record(id, &slow, &p.resources.source_arn)]}))
            .unwrap()
    };
    let (first, second) = tokio::join!(
        a.api.invoke(event("m-a").into(), Duration::from_secs(20)),
        b.api.invoke(event("m-b").into(), Duration::from_secs(20)),
    );
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(p.downstream.calls("n-3"), 1, "sent once");
    let reported: Vec<Vec<String>> = vec![failures(&first), failures(&second)];
    assert!(
        reported.iter().any(Vec::is_empty),
        "one sandbox sent it: {reported:?}"
    );
    // The other either gave the record back to the queue (still in progress elsewhere) or
    // saw it completed meanwhile and skipped it: never sent it.
    let after = item(&p.clients.dynamodb, &table, "id", "notify-worker#n-3")
        .await
        .unwrap();
    assert_eq!(after["status"].as_s().unwrap(), "completed");
    // The redelivery of the record the other sandbox gave back is skipped.
    let again = b
        .api
        .invoke(event("m-b").into(), Duration::from_secs(20))
        .await
        .unwrap();
    assert!(failures(&again).is_empty());
    assert_eq!(p.downstream.calls("n-3"), 1);
}

/// A handler crate pulls only what it uses: the examples take the library without its
/// `http` and `operator` features (the notify example adds `reqwest`, for `?` on its own
/// client's errors), so neither the shipped HTTP delivery's Secrets Manager client nor the
/// operators' CSV writer is built into them.
#[test]
fn the_examples_build_without_the_features_they_do_not_use() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let tree = |package: &str| {
        let output = std::process::Command::new(&cargo)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .args([
                "tree", "--quiet", "--edges", "normal", "--prefix", "none", "-p", package,
            ])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let crate_names = |tree: &str| -> std::collections::BTreeSet<String> {
        tree.lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect()
    };
    for package in ["orders-example", "ledger-example"] {
        let names = crate_names(&tree(package));
        assert!(names.contains("sqs-keeper"), "{names:?}");
        for unused in ["aws-sdk-secretsmanager", "csv", "reqwest"] {
            assert!(!names.contains(unused), "{package} pulls {unused}");
        }
    }
    let notify = crate_names(&tree("notify-example"));
    assert!(notify.contains("reqwest"));
    for unused in ["aws-sdk-secretsmanager", "csv"] {
        assert!(!notify.contains(unused), "notify-example pulls {unused}");
    }
    let worker = crate_names(&tree("worker"));
    assert!(worker.contains("aws-sdk-secretsmanager") && !worker.contains("csv"));
}

/// A handler that panics, packaged as the functions are (under `make test`, cargo-lambda's
/// release build, which makes panics abort unless the release profile says `unwind`): the
/// panic fails its own record only, and the same process answers the next invocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_record_only_and_the_process_serves_on() {
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:fixture")
        .await
        .unwrap();
    let env: Vec<(String, String)> = vec![
        ("WORKER_BODY_FORMAT".into(), "text".into()),
        ("WORKER_RETRY_BASE_DELAY_MS".into(), "1".into()),
    ];
    let log = std::env::temp_dir().join(format!("fixture-panic-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let binary = e2e::function_binary("fixture-handler");
    let mut process =
        FunctionProcess::spawn(&binary, "fixture", &api.address(), &env, Some(&log)).unwrap();
    let record =
        |id: &str, body: &str| record(id, body, "arn:aws:sqs:us-east-1:000000000000:fixture");
    for round in 0..2 {
        let event = json!({"Records": [
            record(&format!("ok-{round}"), "fine"),
            record(&format!("boom-{round}"), "panic"),
            record(&format!("after-{round}"), "fine"),
            record(&format!("quoting-{round}"), "panic:4111111111111111 Ada Lovelace"),
        ]});
        let result = api
            .invoke(
                serde_json::to_vec(&event).unwrap().into(),
                Duration::from_secs(20),
            )
            .await;
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        let Ok(InvocationResult::Response(body)) = result else {
            panic!(
                "round {round}: {} answered {result:?} (exit: {:?}); its output:\n{output}",
                binary.display(),
                process.exited()
            );
        };
        // No dead-letter store: the panicked record (class unknown, not retried) is
        // returned to the queue; its batch-mates are done.
        assert_eq!(
            String::from_utf8_lossy(&body),
            format!(
                r#"{{"batchItemFailures":[{{"itemIdentifier":"boom-{round}"}},{{"itemIdentifier":"quoting-{round}"}}]}}"#
            ),
            "round {round}; output:\n{output}"
        );
        // The panic is logged where it happened, without the value it quoted (Rust's own
        // panic hook would print it to stderr, which Lambda sends to the logs).
        assert!(output.contains("panicked"), "{output}");
        for value in ["4111111111111111", "Lovelace"] {
            assert!(
                !output.contains(value),
                "a payload value reached the log:\n{output}"
            );
        }
        assert!(
            process.exited().is_none(),
            "the process ended after round {round}"
        );
    }
}

/// A handler whose own set-up fails, and the shipped worker with a bad variable: each
/// prints its error once, readable (no `Debug` of an enum, no quotes), exits, and posts it
/// to the Runtime API's `/runtime/init/error`, so Lambda's console shows the cause.
#[tokio::test]
async fn a_start_up_error_is_printed_once_and_reported_to_lambda() {
    let cases = [
        ("orders-worker", Vec::new(), "ORDERS_TABLE is not set"),
        (
            "worker",
            vec![("WORKER_DOWNSTREAM_URL", "not a url".to_string())],
            "WORKER_DOWNSTREAM_URL",
        ),
    ];
    for (binary, extra, expected) in cases {
        let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:init")
            .await
            .unwrap();
        let mut env: Vec<(String, String)> = vec![("AWS_REGION".into(), "us-east-1".into())];
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let log = std::env::temp_dir().join(format!("init-{binary}-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        let mut process = FunctionProcess::spawn(
            &e2e::function_binary(binary),
            binary,
            &api.address(),
            &env,
            Some(&log),
        )
        .unwrap();
        let mut status = None;
        for _ in 0..100 {
            status = process.exited();
            if status.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(status.is_some_and(|s| !s.success()), "{binary}: {status:?}");
        let output = std::fs::read_to_string(&log).unwrap();
        assert_eq!(output.matches(expected).count(), 1, "{binary}: {output}");
        assert!(output.contains("Error: "), "{binary}: {output}");
        for noise in ["Config(", "ConfigError {", "\"ORDERS_TABLE"] {
            assert!(!output.contains(noise), "{binary}: {noise} in {output}");
        }
        let reported = api.init_error().unwrap_or_default();
        assert!(reported.contains(expected), "{binary}: {reported:?}");
        assert!(reported.contains("errorType"), "{binary}: {reported:?}");
    }
}

/// A handler's binary started outside Lambda (no `AWS_LAMBDA_RUNTIME_API`) says so and how
/// to run it locally, instead of lambda_runtime's panic naming neither. A misspelt
/// variable is warned of first.
#[test]
fn a_handler_started_outside_lambda_says_how_to_run_it() {
    let output = std::process::Command::new(e2e::function_binary("orders-worker"))
        .env_clear()
        .env("AWS_REGION", "us-east-1")
        .env("WORKER_RETRY_MAX_ATTEMPT", "5")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let both = format!("{stdout}{stderr}");
    assert!(both.contains("not under Lambda"), "{both}");
    assert!(both.contains("keeper run"), "{both}");
    assert!(!both.contains("panicked"), "{both}");
    // A misspelt variable is named, with the one it likely meant.
    assert!(
        both.contains("WORKER_RETRY_MAX_ATTEMPT is not a variable sqs-keeper reads")
            && both.contains("did you mean WORKER_RETRY_MAX_ATTEMPTS?"),
        "{both}"
    );
}

/// The telemetry example installs its own subscriber (the library's log layer beside a
/// layer of its own) and serves with a tower layer of its own: both reach the runtime. The
/// library installs no subscriber over the team's, its JSON lines still carry the
/// invocation's request id, and the team's tower layer logs inside that span. Its
/// OpenTelemetry tracer exports a traced record's span under the producer's span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_own_subscriber_and_tower_layer_reach_the_runtime() {
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:telemetry")
        .await
        .unwrap();
    let env: Vec<(String, String)> = vec![("WORKER_BODY_FORMAT".into(), "text".into())];
    let log = std::env::temp_dir().join(format!("telemetry-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let binary = e2e::function_binary("telemetry-worker");
    let mut process =
        FunctionProcess::spawn(&binary, "telemetry", &api.address(), &env, Some(&log)).unwrap();
    let queue = "arn:aws:sqs:us-east-1:000000000000:telemetry";
    let plain = |id: &str| record(id, "fine", queue);
    // One record of each invocation was sent by a producer X-Ray traced.
    let traced = |id: &str| {
        let mut r = plain(id);
        r["attributes"]["AWSTraceHeader"] =
            json!("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1");
        r
    };
    for round in 1..=2 {
        let event =
            json!({"Records": [traced(&format!("a-{round}")), plain(&format!("b-{round}"))]});
        let result = api
            .invoke(
                serde_json::to_vec(&event).unwrap().into(),
                Duration::from_secs(20),
            )
            .await;
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        let Ok(InvocationResult::Response(body)) = result else {
            panic!(
                "round {round}: {result:?} (exit {:?}); output:\n{output}",
                process.exited()
            );
        };
        assert_eq!(
            String::from_utf8_lossy(&body),
            r#"{"batchItemFailures":[]}"#
        );
    }
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<Value> = output
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    // The tower layer ran once per invocation, inside the invocation's span.
    let counted: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "the team's tower layer saw an invocation")
        .collect();
    assert_eq!(counted.len(), 2, "{output}");
    assert_eq!(counted[1]["served"], json!(2), "{output}");
    assert!(
        counted
            .iter()
            .all(|l| l["requestId"].as_str().is_some_and(|id| !id.is_empty())),
        "{output}"
    );
    // The library's own lines, in Lambda's JSON, and the handler's, with the request id.
    let handled: Vec<&Value> = lines.iter().filter(|l| l["message"] == "handled").collect();
    assert_eq!(handled.len(), 4, "{output}");
    // The traced record's lines name its trace; the other's do not.
    for line in &handled {
        let traced = line["item_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("a-"));
        let expected = traced.then(|| json!("1-5759e988-bd862e3fe1be46a994272793"));
        assert_eq!(line.get("trace_id").cloned(), expected, "{output}");
    }
    // The team's tracing layer saw the same events.
    assert!(
        output
            .matches("the team's tracing layer saw a INFO event")
            .count()
            >= 6,
        "{output}"
    );
    // The team's OpenTelemetry exporter got each traced record's span as a child of its
    // producer's span, in the producer's trace (`opentelemetry` feature).
    assert_eq!(
        output
            .matches(
                "the team's exporter saw span record in trace \
                 5759e988bd862e3fe1be46a994272793 under 53995c3f42cd8ad8"
            )
            .count(),
        2,
        "{output}"
    );
}
