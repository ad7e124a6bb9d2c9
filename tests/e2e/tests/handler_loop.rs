//! A handler author's local loop, as the README gives it: `keeper store` creates the
//! dead-letter store and the source queue on the emulator and prints their variables;
//! `keeper run --worker <bin>` feeds the author's own compiled handler from that queue, its
//! log lines on the terminal, a failing record dead-lettered into that store.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashMap;
use std::process::{Command, Stdio};

use aws_sdk_dynamodb::types::TimeToLiveStatus;
use aws_sdk_sqs::types::QueueAttributeName;

fn local(args: &[&str], env: &HashMap<String, String>) -> (i32, String, String) {
    let output = Command::new(e2e::function_binary("keeper"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_store_then_local_run_feed_your_binary_and_dead_letter_into_that_store() {
    let endpoints = e2e::emulator().await;
    let clients = e2e::clients().await;
    let emulator = HashMap::from([
        ("EMULATOR_URL".to_string(), endpoints.shared.clone()),
        (
            "EMULATOR_DYNAMODB_URL".to_string(),
            endpoints.dynamodb.clone(),
        ),
    ]);
    let prefix = e2e::unique_prefix("loop");

    // One command: the store and the queue, and the variables for them.
    let (code, out, err) = local(&["store", "--prefix", &prefix], &emulator);
    assert_eq!(code, 0, "{out}\n{err}");
    let vars: HashMap<String, String> = out
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for name in [
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_DYNAMODB",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "DLQ_TABLE",
        "DLQ_QUEUE_URL",
        "DLQ_BUCKET",
        "WORKER_MAX_RECEIVE_COUNT",
        "SOURCE_QUEUE_URL",
    ] {
        assert!(vars.contains_key(name), "{name} not printed: {out}");
    }
    // The table as the template makes it: two indexes, TTL on.
    let table = clients
        .dynamodb
        .describe_table()
        .table_name(&vars["DLQ_TABLE"])
        .send()
        .await
        .unwrap();
    assert_eq!(
        table.table().unwrap().global_secondary_indexes().len(),
        2,
        "{table:?}"
    );
    let ttl = clients
        .dynamodb
        .describe_time_to_live()
        .table_name(&vars["DLQ_TABLE"])
        .send()
        .await
        .unwrap();
    assert_eq!(
        ttl.time_to_live_description()
            .unwrap()
            .time_to_live_status(),
        Some(&TimeToLiveStatus::Enabled)
    );
    clients
        .s3
        .head_bucket()
        .bucket(&vars["DLQ_BUCKET"])
        .send()
        .await
        .unwrap();
    let source = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&vars["SOURCE_QUEUE_URL"])
        .attribute_names(QueueAttributeName::RedrivePolicy)
        .send()
        .await
        .unwrap();
    let redrive = &source.attributes().unwrap()[&QueueAttributeName::RedrivePolicy];
    assert!(redrive.contains("-dlq"), "{redrive}");

    // A second time is refused with the way out named, nothing deleted.
    let (code, _, err) = local(&["store", "--prefix", &prefix], &emulator);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--replace"), "{err}");

    // Three messages, one the handler refuses.
    for body in [r#"{"id":"a"}"#, r#"{"id":"b"}"#, "fail"] {
        clients
            .sqs
            .send_message()
            .queue_url(&vars["SOURCE_QUEUE_URL"])
            .message_body(body)
            .send()
            .await
            .unwrap();
    }
    // `keeper run` with exactly what `keeper store` printed: its endpoints are the emulator's.
    let env = vars.clone();
    let handler = e2e::function_binary("fixture-handler");
    let (code, out, err) = local(
        &[
            "run",
            "--worker",
            handler.to_str().unwrap(),
            "--max-secs",
            "60",
        ],
        &env,
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("queue empty"), "{out}");
    // The handler's own lines, on the terminal.
    assert_eq!(err.matches("record done").count(), 2, "{err}");
    assert!(err.contains("record failed: dead-lettered"), "{err}");
    // Dead-lettered into the store `keeper store` made.
    let records = clients
        .dynamodb
        .scan()
        .table_name(&vars["DLQ_TABLE"])
        .send()
        .await
        .unwrap();
    assert_eq!(records.count(), 1, "{records:?}");
}

/// `DLQ_CHECK_AT_START=true` with a misnamed table: the handler refuses to start and says
/// which table, in which region, before any record is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_up_check_refuses_a_misnamed_table_before_any_record() {
    let endpoints = e2e::emulator().await;
    let clients = e2e::clients().await;
    let emulator = HashMap::from([
        ("EMULATOR_URL".to_string(), endpoints.shared.clone()),
        (
            "EMULATOR_DYNAMODB_URL".to_string(),
            endpoints.dynamodb.clone(),
        ),
    ]);
    let prefix = e2e::unique_prefix("check");
    let (code, out, err) = local(&["store", "--prefix", &prefix], &emulator);
    assert_eq!(code, 0, "{out}\n{err}");
    let mut env: HashMap<String, String> = out
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (code, out, err) = local(&["send", "--body", r#"{"id":"a"}"#], &env);
    assert_eq!(code, 0, "{out}\n{err}");
    env.insert("DLQ_CHECK_AT_START".to_string(), "true".to_string());
    env.insert("DLQ_TABLE".to_string(), format!("{prefix}-misnamed"));
    let handler = e2e::function_binary("fixture-handler");
    let (code, out, err) = local(
        &[
            "run",
            "--worker",
            handler.to_str().unwrap(),
            "--max-secs",
            "20",
            "--timeout-secs",
            "3",
        ],
        &env,
    );
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("the dead-letter store cannot be reached")
            && err.contains(&format!("table {prefix}-misnamed, us-east-1")),
        "{err}"
    );
    assert!(!err.contains("record done"), "{err}");
    // The message is still there, for a handler started right.
    let depth = sqs_keeper_local::esm::queue_depth(&clients.sqs, &env["SOURCE_QUEUE_URL"])
        .await
        .unwrap();
    assert_eq!(depth, 1);
}
