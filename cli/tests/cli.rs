//! The `dlq` binary against the emulator: every command's output and exit code.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::process::{Command, Output, Stdio};

use e2e::{body, Pipeline};
use serde_json::json;

struct Dlq {
    env: Vec<(String, String)>,
}

impl Dlq {
    async fn new(p: &Pipeline) -> Dlq {
        let mut env = sqs_keeper_local::demo::emulator_env(&e2e::emulator().await, e2e::REGION);
        env.extend(p.resources.store_env());
        env.push(("WORKER_ITEM_ID_SOURCE".into(), "pointer:/id".into()));
        Dlq { env }
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        self.run_with(args, &[])
    }

    fn run_with(&self, args: &[&str], extra: &[(&str, &str)]) -> (i32, String, String) {
        let output: Output = Command::new(env!("CARGO_BIN_EXE_dlq"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).to_string(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    }
}

async fn dead_pipeline(name: &str) -> Pipeline {
    let large = json!({"id": "big", "scenario": "invalid", "blob": "b".repeat(80_000)}).to_string();
    let bodies = [
        body("t1", "throttled"),
        body("t2", "throttled"),
        body("v1", "invalid"),
        large,
    ];
    Pipeline::with_dead_items(name, &bodies).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_commands() {
    let p = dead_pipeline("cliread").await;
    let dlq = Dlq::new(&p).await;

    let (code, out, _) = dlq.run(&["list"]);
    assert_eq!(code, 0);
    for id in ["t1", "t2", "v1", "big"] {
        assert!(out.contains(id), "{out}");
    }
    assert!(out.starts_with("ITEM ID"), "{out}");
    assert!(out.contains("4 record(s)"), "{out}");

    // The store given as the functions get it from the reusable store: one JSON variable.
    let store: serde_json::Map<String, serde_json::Value> = p
        .resources
        .store_env()
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    let from_store = Dlq {
        env: dlq
            .env
            .iter()
            .filter(|(k, _)| !store.contains_key(k))
            .cloned()
            .chain([(
                "SQS_KEEPER_STORE".to_string(),
                serde_json::Value::Object(store.clone()).to_string(),
            )])
            .collect(),
    };
    let (code, out, err) = from_store.run(&["list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("4 record(s)"), "{out}");

    let (code, out, _) = dlq.run(&["list", "--class", "throttled", "--json"]);
    assert_eq!(code, 0);
    let ids: Vec<String> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["item_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&"t1".to_string()) && ids.contains(&"t2".to_string()));

    let (code, out, _) = dlq.run(&["list", "--limit", "1"]);
    assert_eq!(code, 0);
    assert!(out.contains("1 record(s); more match"), "{out}");

    let (code, out, _) = dlq.run(&["inspect", "t1"]);
    assert_eq!(code, 0);
    assert!(out.contains("item id:        t1"), "{out}");
    assert!(out.contains("throttled"), "{out}");
    assert!(out.contains("history:"), "{out}");
    assert!(out.contains("delivery 1 attempt 1"), "{out}");
    let (code, out, _) = dlq.run(&["inspect", "v1"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("      response: field 'amount' must be a positive number\n"),
        "{out}"
    );

    let (code, out, _) = dlq.run(&["inspect", "t1", "--json"]);
    assert_eq!(code, 0);
    let record: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(record["item_id"], "t1");

    let (code, out, err) = dlq.run(&["inspect", "big", "--payload"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("verified"), "{err}");
    assert_eq!(
        out.trim().len(),
        json!({"id": "big", "scenario": "invalid", "blob": "b".repeat(80_000)})
            .to_string()
            .len()
    );

    let (code, _, err) = dlq.run(&["inspect", "nobody"]);
    assert_eq!(code, 3, "not found");
    assert!(
        err.contains("no dead-lettered item with id \"nobody\""),
        "{err}"
    );

    let (code, out, _) = dlq.run(&["analyze"]);
    assert_eq!(code, 0);
    assert!(out.contains("4 record(s) in 2 pattern group(s)"), "{out}");
    assert!(out.contains("by class:"), "{out}");
    assert!(out.contains("failed attempts per hour:"), "{out}");
    let (code, out, _) = dlq.run(&["analyze", "--json"]);
    assert_eq!(code, 0);
    let a: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(a["groups"][0]["count"], 2);

    let (code, out, _) = dlq.run(&["stats"]);
    assert_eq!(code, 0);
    assert!(out.contains("records:            4"), "{out}");
    assert!(out.contains("DLQ depth:          4 visible"), "{out}");
    assert!(out.contains("dead, payload in S3: 1"), "{out}");
    let (code, out, _) = dlq.run(&["stats", "--json"]);
    assert_eq!(code, 0);
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["dead_eligible"], 2);
    // The two validation failures are neither eligible nor for manual review: they need a
    // fix, and every dead item is in exactly one of the three.
    assert_eq!(s["dead_manual_review"], 0);
    assert_eq!(s["dead_needs_fix"], 2);
    assert_eq!(s["by_status"]["dead"], 4);
    let (code, out, _) = dlq.run(&["stats"]);
    assert_eq!(code, 0);
    assert!(out.contains("dead, needs a fix:   2"), "{out}");
    let (code, out, _) = dlq.run(&["inspect", "v1"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("stands:         needs a fix: a run does not retry it"),
        "{out}"
    );
    let (code, out, _) = dlq.run(&["inspect", "t1"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("stands:         eligible: a redrive run retries it"),
        "{out}"
    );

    let dir = std::env::temp_dir().join(format!("dlq-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("dead.csv");
    let (code, out, _) = dlq.run(&["export", csv.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("exported 4 record(s)"), "{out}");
    assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 5);
    let jsonl = dir.join("dead.jsonl");
    let (code, _, _) = dlq.run(&["export", jsonl.to_str().unwrap(), "--class", "validation"]);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(&jsonl).unwrap().lines().count(), 2);
    let (code, _, err) = dlq.run(&["export", dir.join("x.txt").to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot tell the format"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_purge_clear_and_bad_input() {
    let p = dead_pipeline("cliwrite").await;
    let dlq = Dlq::new(&p).await;

    let (code, out, _) = dlq.run(&["redrive", "--dry-run"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("2 item(s) would be redriven; nothing was changed"),
        "{out}"
    );

    // Reprocess needs the processor's configuration, or the deployed function.
    let (code, _, err) = dlq.run(&["redrive"]);
    assert_eq!(code, 2);
    assert!(err.contains("WORKER_DOWNSTREAM_URL"), "{err}");
    assert!(err.contains("--via-function"), "{err}");

    // A local redrive reads the redrive function's configuration: a bad value of any of
    // its variables is named, before anything changes.
    for extra in [
        vec![("REDRIVE_KEEP_PAYLOADS", "maybe")],
        vec![("WORKER_ITEM_ID_SOURCE", "pointer:id")],
        vec![
            ("WORKER_DOWNSTREAM_URL", "http://127.0.0.1:9/ingest"),
            ("WORKER_RETRY_MAX_ATTEMPTS", "99"),
        ],
    ] {
        let (code, _, err) = dlq.run_with(&["redrive", "--dry-run"], &extra);
        let named = extra[extra.len() - 1].0;
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(named), "{extra:?}: {err}");
    }
    assert_eq!(p.dlq_depth().await, 4, "nothing changed");

    p.downstream.fix();
    let url = p.downstream.url();
    let (code, out, err) = dlq.run_with(
        &["redrive", "--class", "throttled"],
        &[("WORKER_DOWNSTREAM_URL", &url)],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("2 selected: 2 resolved"), "{out}");
    assert_eq!(p.dlq_depth().await, 2);

    let (code, out, _) = dlq.run_with(
        &["redrive", "--item-id", "ghost", "--json"],
        &[("WORKER_DOWNSTREAM_URL", &url)],
    );
    assert_eq!(code, 1, "unknown ids are a partial failure");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["not_found"], 1);

    for (args, needle) in [
        (vec!["list", "--since", "yesterday"], "--since"),
        // clap refuses a value outside the enum and names the option and the value.
        (
            vec!["list", "--class", "bogus"],
            "invalid value 'bogus' for '--class",
        ),
        (
            vec!["list", "--status", "zombie"],
            "invalid value 'zombie' for '--status",
        ),
        (vec!["purge", "--older-than", "soon"], "--older-than"),
        (
            vec!["redrive", "--parallelism", "0", "--dry-run"],
            "parallelism",
        ),
        // An item in flight is never purged, and a redrive takes dead items only.
        (
            vec![
                "purge",
                "--older-than",
                "0s",
                "--status",
                "requeued",
                "--yes",
            ],
            "in flight",
        ),
        (
            vec!["redrive", "--status", "requeued", "--dry-run"],
            "cannot be redriven",
        ),
        (
            vec!["redrive", "--status", "resolved", "--mode", "requeue"],
            "cannot be redriven",
        ),
        (
            vec!["redrive", "--dry-run", "--continue", "e30="],
            "does not say which request",
        ),
    ] {
        let (code, _, err) = dlq.run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let (code, _, err) = dlq.run(&["redrive", "--request", "/nonexistent.json"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read"), "{err}");
    let bad = std::env::temp_dir().join(format!("bad-request-{}.json", std::process::id()));
    std::fs::write(&bad, r#"{"mood": "requeue"}"#).unwrap();
    let (code, _, err) = dlq.run(&["redrive", "--request", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown field `mood`"), "{err}");
    let (code, _, err) = Dlq { env: vec![] }.run(&["stats"]);
    assert_eq!(code, 2);
    assert!(err.contains("DLQ_TABLE"), "{err}");

    // Destructive commands refuse without --yes when nobody can answer.
    let (code, _, err) = dlq.run(&["purge", "--older-than", "0s"]);
    assert_eq!(code, 2);
    assert!(err.contains("refusing without --yes"), "{err}");
    assert_eq!(p.records().await.len(), 4, "nothing deleted");
    let (code, out, _) = dlq.run(&["purge", "--older-than", "30d", "--yes"]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing to purge"), "{out}");
    let (code, out, _) = dlq.run(&[
        "purge",
        "--older-than",
        "0s",
        "--status",
        "resolved",
        "--yes",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("purged 2 record(s), 0 payload(s)"), "{out}");
    assert_eq!(p.records().await.len(), 2);

    let (code, _, _) = dlq.run(&["clear"]);
    assert_eq!(code, 2);
    let (code, out, _) = dlq.run(&["clear", "--yes"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("cleared 2 record(s), 0 payload(s), 2 DLQ message(s)"),
        "{out}"
    );
    // The large item failed minutes ago: a live message may point to its object.
    assert!(out.contains("kept 1 payload object(s)"), "{out}");
    assert!(p.records().await.is_empty());
    assert_eq!(p.dlq_depth().await, 0);
}

/// Text that would drive a terminal if printed as it is: colour (CSI in two forms), a
/// window title (OSC ... BEL), clear screen, a right-to-left override, DEL.
const EVIL: &str = "\u{1b}[31mred\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}1m\u{202e}gnp.exe\u{7f}";

fn assert_no_controls(what: &str, text: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|c| (c.is_control() && !matches!(c, '\n' | '\t')) || *c == '\u{202e}')
        .collect();
    assert!(bad.is_empty(), "{what} prints {bad:?}:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_cannot_drive_the_terminal_or_a_spreadsheet() {
    use sqs_keeper_core::retry::AttemptFailure;
    use sqs_keeper_core::{
        dead_letter::DeadLetterCandidate, dead_letter::DeadLetterSink, dead_letter::InvocationInfo,
        DeadLetterReason,
    };
    use sqs_keeper_core::{item::BodyFormat, item::ItemParser};

    let p = Pipeline::new("cliterm", e2e::Setup::default()).await;
    let dlq = Dlq::new(&p).await;
    // The item id (here the message id) starts a formula and carries escapes; so do the
    // error, its cause, an attribute and the body. The id, holding characters SQS refuses
    // in an attribute, is stored by its digest; the operator finds it by the id itself.
    let item_id = format!("=HYPERLINK(\"http://evil\"){EVIL}");
    let stored_id = sqs_keeper_core::item::bounded_item_id(item_id.clone());
    let body = format!("line one {EVIL}\nline\ttwo");
    let msg = serde_json::from_value(json!({
        "messageId": item_id,
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "MessageGroupId": EVIL},
        "messageAttributes": {"tenant": {"stringValue": EVIL, "dataType": "String"}},
    }))
    .unwrap();
    let item = ItemParser {
        body_format: BodyFormat::Text,
        ..ItemParser::default()
    }
    .parse(item_id.clone(), msg)
    .unwrap();
    let error = sqs_keeper_lambda::ProcessError::validation(format!("@bad {EVIL}\nsecond line"))
        .with_cause(EVIL);
    let candidate = DeadLetterCandidate {
        item,
        failures: vec![AttemptFailure {
            attempt: 1,
            started_at: chrono::Utc::now(),
            duration: std::time::Duration::ZERO,
            error: error.clone(),
        }],
        error,
        reason: DeadLetterReason::Permanent,
    };
    let results = p
        .store()
        .dead_letter(&[candidate], &InvocationInfo::default())
        .await;
    assert!(results[0].is_ok(), "{results:?}");
    let escaped = r"\x1b[31mred\x1b]0;pwned\x07\x1b[2J\u{9b}1m\u{202e}gnp.exe\x7f";

    let (code, out, err) = dlq.run(&["list"]);
    assert_eq!(code, 0, "{err}");
    assert_no_controls("list", &out);
    assert!(out.contains(escaped), "{out}");

    let (code, out, err) = dlq.run(&["inspect", &item_id]);
    assert_eq!(code, 0, "{err}");
    assert_no_controls("inspect", &out);
    assert!(
        out.contains(&format!("item id:        {stored_id}")),
        "{out}"
    );
    assert!(out.contains(&format!("tenant={escaped}")), "{out}");
    assert!(out.contains(&format!("group {escaped}")), "{out}");
    assert!(out.contains(&format!("caused by: {escaped}")), "{out}");
    // A multi-line message keeps its lines.
    assert!(
        out.contains(&format!("@bad {escaped}\nsecond line")),
        "{out}"
    );

    // The digest `dlq list` shows finds it too (pasted as printed).
    let (code, out, err) = dlq.run(&["inspect", &stored_id]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("item id:        {stored_id}")),
        "{out}"
    );

    let (code, out, err) = dlq.run(&["inspect", &item_id, "--payload"]);
    assert_eq!(code, 0, "{err}");
    assert_no_controls("inspect --payload", &out);
    assert_eq!(out, format!("line one {escaped}\nline\ttwo\n"));
    // --raw writes the exact bytes, for a file.
    let (code, out, err) = dlq.run(&["inspect", &item_id, "--payload", "--raw"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("{body}\n"));
    let (code, _, err) = dlq.run(&["inspect", &item_id, "--raw"]);
    assert_eq!(code, 2, "--raw needs --payload: {err}");

    // The JSON output stays exact (JSON escapes control characters itself).
    let (code, out, _) = dlq.run(&["list", "--json"]);
    assert_eq!(code, 0);
    let record: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(record["item_id"], stored_id.as_str());

    let dir = std::env::temp_dir().join(format!("dlq-csv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("evil.csv");
    let (code, _, err) = dlq.run(&["export", csv.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let row = text.lines().nth(1).unwrap();
    assert!(row.starts_with(&stored_id), "{row}");
    assert!(text.contains("\"'@bad "), "{text}");
}

#[test]
fn help_has_examples_for_every_command() {
    for command in [
        "list", "inspect", "analyze", "stats", "export", "redrive", "purge", "clear",
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_dlq"))
            .args([command, "--help"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{command}");
        assert!(
            text.contains("Example"),
            "{command} --help has no example:\n{text}"
        );
    }
    let output = Command::new(env!("CARGO_BIN_EXE_dlq"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("Runbook"), "{text}");
    assert!(text.contains(sqs_keeper_cli::EXIT_CODES), "{text}");
    assert!(text.contains("3 not found"), "{text}");
}

/// One stored item that is not a valid record (hand-edited, or from an older schema) does
/// not fail the listing: the others are listed, it is named on stderr, the exit code is 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_reports_a_malformed_record_and_lists_the_rest() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let p = Pipeline::with_dead_items("climalformed", &[body("fine", "throttled")]).await;
    p.clients
        .dynamodb
        .put_item()
        .table_name(&p.resources.table)
        .item("item_id", AttributeValue::S("broken".into()))
        .item("status", AttributeValue::S("dead".into()))
        .item(
            "last_attempt",
            AttributeValue::S("2026-01-01T00:00:00.000Z".into()),
        )
        .send()
        .await
        .unwrap();
    let dlq = Dlq::new(&p).await;
    let (code, out, err) = dlq.run(&["list"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("fine"), "{out}");
    assert!(
        err.contains("stored item broken is not a valid record"),
        "{err}"
    );
}

/// Runs `dlq` on a pseudo-terminal `columns` wide (util-linux `script`), feeding `input`
/// to it as typed: what an operator sees at a terminal. Returns the exit code and what the
/// terminal showed (stdout and stderr together), one screen line per line: a carriage
/// return starts a new one and escape sequences (the progress bar's redraws) are removed.
fn at_terminal(dlq: &Dlq, args: &[&str], columns: u16, input: &str) -> (i32, String) {
    use std::io::Write;
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_dlq"))
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let command = format!("stty rows 40 cols {columns}; {}", quoted.join(" "));
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("TERM", "dumb")
        .envs(dlq.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let shown = String::from_utf8_lossy(&output.stdout)
        .replace("\r\n", "\n")
        .replace('\r', "\n");
    (output.status.code().unwrap_or(-1), without_escapes(&shown))
}

/// `text` without its ANSI escape sequences (CSI: ESC `[` parameters, then a final letter).
fn without_escapes(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for next in chars.by_ref() {
                if next.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The points an operator meets at 3 a.m.: one exit-code table, errors in words, the newest
/// records first, tables that fit the terminal, help that reads, output that pipes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_cli_at_3am() {
    let p = dead_pipeline("cli3am").await;
    let dlq = Dlq::new(&p).await;

    // Exit codes: 2 for configuration and usage, 3 for not found, each said in words.
    let (code, _, err) = dlq.run(&["--table", "no-such-table", "list"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("\"no-such-table\" does not exist in region us-east-1"),
        "{err}"
    );
    let (code, _, err) = dlq.run(&["inspect", ""]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("item id is empty"), "{err}");
    assert!(
        !err.contains("Error {") && !err.contains("aws_request_id"),
        "{err}"
    );
    let (code, _, err) = dlq.run(&["inspect", "nobody"]);
    assert_eq!(code, 3, "{err}");
    let long = "x".repeat(3_000);
    let (code, _, err) = dlq.run(&["inspect", &long]);
    assert_eq!(code, 3, "an overlong id is looked up by its digest: {err}");
    assert!(err.len() < 400, "the id is not echoed whole: {err}");

    // Newest first, whatever the status: redrive two so that statuses mix.
    p.downstream.fix();
    let url = p.downstream.url();
    let (code, out, err) = dlq.run_with(
        &["redrive", "--class", "throttled"],
        &[("WORKER_DOWNSTREAM_URL", &url)],
    );
    assert_eq!(code, 0, "{out}{err}");
    let listed = |args: &[&str]| -> Vec<(String, String)> {
        let (code, out, err) = dlq.run(args);
        assert_eq!(code, 0, "{err}");
        out.lines()
            .map(|l| {
                let r: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    r["last_attempt"].as_str().unwrap().to_string(),
                    r["item_id"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let all = listed(&["list", "--status", "any", "--json"]);
    assert_eq!(all.len(), 4);
    let mut sorted = all.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(
        all.iter().map(|r| &r.0).collect::<Vec<_>>(),
        sorted.iter().map(|r| &r.0).collect::<Vec<_>>(),
        "newest first"
    );
    assert_eq!(
        listed(&["list", "--status", "any", "--json", "--limit", "2"]),
        all[..2],
        "--limit keeps the newest"
    );
    let dead = listed(&["list", "--json"]);
    assert_eq!(dead.len(), 2);
    assert!(dead[0].0 >= dead[1].0);

    // At an 80-column terminal no table runs wider, and the long error text is cut, not ids.
    for args in [&["analyze"][..], &["list", "--status", "any"], &["stats"]] {
        let (code, shown) = at_terminal(&dlq, args, 80, "");
        assert_eq!(code, 0, "{args:?}: {shown}");
        for line in shown.lines() {
            assert!(
                line.chars().count() <= 80,
                "{args:?} is wider than 80 columns: {line:?}\n{shown}"
            );
        }
    }
    let (_, shown) = at_terminal(&dlq, &["list", "--status", "any"], 80, "");
    for (_, id) in &all {
        assert!(shown.contains(id.as_str()), "{id} is shown whole:\n{shown}");
    }

    // Help: examples keep their lines; global options apart from the command's own.
    let (code, help, _) = dlq.run(&["list", "--help"]);
    assert_eq!(code, 0);
    assert!(
        help.contains("Examples:\n  dlq list\n  dlq list --class timeout"),
        "{help}"
    );
    let (own, rest) = help.split_once("Global options:").unwrap();
    let global = rest.split_once("Examples:").unwrap().0;
    assert!(
        own.contains("--status") && !own.contains("--table"),
        "{help}"
    );
    assert!(
        global.contains("--table") && !global.contains("--status"),
        "{help}"
    );

    // `export -` writes the records to stdout and the summary to stderr; no file named `-`.
    let (code, out, err) = dlq.run(&["export", "-", "--format", "csv", "--status", "any"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("item_id,status,"), "{out}");
    assert_eq!(out.lines().count(), 5, "{out}");
    assert!(err.contains("exported 4 record(s) to stdout"), "{err}");
    assert!(!std::path::Path::new("-").exists());
    let (code, _, err) = dlq.run(&["export", "-"]);
    assert_eq!(code, 2);
    assert!(err.contains("--format"), "{err}");

    // Declining a confirmation at a terminal changes nothing and exits 2.
    let (code, shown) = at_terminal(&dlq, &["purge", "--older-than", "0s"], 120, "no\n");
    assert_eq!(code, 2, "{shown}");
    assert!(
        shown.contains("not confirmed; nothing was changed"),
        "{shown}"
    );
    assert_eq!(p.records().await.len(), 4);

    // --json on purge and clear.
    let (code, out, _) = dlq.run(&[
        "purge",
        "--older-than",
        "0s",
        "--status",
        "resolved",
        "--yes",
        "--json",
    ]);
    assert_eq!(code, 0);
    let purged: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(purged["records_deleted"], 2);
    let (code, out, _) = dlq.run(&["clear", "--yes", "--json"]);
    assert_eq!(code, 0);
    let cleared: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cleared["records_deleted"], 2);
    assert_eq!(cleared["dlq_messages_deleted"], 2);
    assert!(p.records().await.is_empty());
}

/// A local `dlq redrive` is gated by the worker's circuit breaker as the redrive function
/// is: while it is open nothing is reprocessed (the downstream is not called) and the
/// output says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_redrive_waits_for_an_open_breaker() {
    use sqs_keeper_core::breaker::BreakerStore;
    let p = Pipeline::with_dead_items("cli-breaker", &[body("t1", "throttled")]).await;
    let dlq = Dlq::new(&p).await;
    let table = e2e::create_table(&p.clients.dynamodb, "cli-breaker", "id").await;
    let breaker = sqs_keeper_aws::DynamoBreakerStore::new(
        p.clients.dynamodb.clone(),
        table.clone(),
        "breaker#worker",
    );
    let now = std::time::SystemTime::now();
    breaker
        .open(now + std::time::Duration::from_secs(600), 1, now)
        .await
        .unwrap();
    p.downstream.fix();
    let url = p.downstream.url();
    let calls = p.downstream.calls("t1");
    let (code, out, err) = dlq.run_with(
        &["redrive"],
        &[
            ("WORKER_DOWNSTREAM_URL", &url),
            ("WORKER_BREAKER_TABLE", &table),
            ("WORKER_BREAKER_KEY", "breaker#worker"),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("circuit breaker is open"), "{out}");
    assert_eq!(
        p.downstream.calls("t1"),
        calls,
        "the downstream was not called"
    );
    assert_eq!(
        p.store().get("t1").await.unwrap().unwrap().status,
        sqs_keeper_core::dead_letter::ItemStatus::Dead
    );
}

/// Issue: the local `dlq redrive` was not the function's engine: it ignored
/// `WORKER_PAYLOAD_BUCKETS` and followed no pointer. A DLQ message pointing to a producer's
/// bucket the worker reads is adopted and reprocessed with its payload, as the function does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_redrive_follows_pointers_into_the_workers_payload_buckets() {
    let p = Pipeline::new("cli-ec", e2e::Setup::default()).await;
    let dlq = Dlq::new(&p).await;
    let producer = e2e::unique_prefix("producer").to_lowercase();
    p.clients
        .s3
        .create_bucket()
        .bucket(&producer)
        .send()
        .await
        .unwrap();
    p.clients
        .s3
        .put_object()
        .bucket(&producer)
        .key("ec-1")
        .body(body("ec-payload", "ok").into_bytes().into())
        .send()
        .await
        .unwrap();
    let pointer = sqs_keeper_core::pointer::S3Pointer {
        bucket: producer.clone(),
        key: "ec-1".into(),
    }
    .to_body();
    p.send_to_dlq(&[&pointer]).await;
    let url = p.downstream.url();
    let (code, out, err) = dlq.run_with(
        &["redrive"],
        &[
            ("WORKER_DOWNSTREAM_URL", &url),
            ("WORKER_PAYLOAD_BUCKETS", &producer),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        p.downstream.delivered(),
        ["ec-payload"],
        "the payload, not the pointer: {out}"
    );
}

/// Issue: a `--bucket` (`DLQ_BUCKET`) naming a bucket that does not exist was never checked:
/// `purge`, `clear` and `redrive --force` exited 0 and changed the store. Every configured
/// resource is checked first: exit 2, the bucket named, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_named_before_anything_changes() {
    let p = dead_pipeline("cli-nobucket").await;
    let dlq = Dlq::new(&p).await;
    let url = p.downstream.url();
    let missing = [("DLQ_BUCKET", "no-such-bucket-here")];
    for args in [
        vec!["purge", "--older-than", "0s", "--yes"],
        vec!["clear", "--yes"],
        vec!["redrive", "--force", "--mode", "requeue"],
    ] {
        let mut extra = missing.to_vec();
        extra.push(("WORKER_DOWNSTREAM_URL", url.as_str()));
        let (code, out, err) = dlq.run_with(&args, &extra);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains("no-such-bucket-here"), "{args:?}: {err}");
    }
    assert_eq!(p.records().await.len(), 4, "nothing deleted");
    assert!(p
        .records()
        .await
        .iter()
        .all(|r| r.status == sqs_keeper_core::dead_letter::ItemStatus::Dead));
    assert_eq!(p.dlq_depth().await, 4, "nothing moved");
}

/// What an operator at 3 a.m. also needs: `dlq list` shows the receives beside the
/// failures and the whole last error when piped; `dlq stats` says why the DLQ holds more
/// messages than dead records; a redrive over more than a hundred items asks first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_stats_and_a_large_redrive_speak_plainly() {
    let mut bodies: Vec<String> = (0..101)
        .map(|n| body(&format!("v{n:03}"), "invalid"))
        .collect();
    bodies.push(body("t1", "throttled"));
    let p = Pipeline::with_dead_items("cli-plain", &bodies).await;
    let dlq = Dlq::new(&p).await;
    // A long error, as a downstream's answer can make one.
    let long_error = format!(
        "downstream answered 400 Bad Request: {}",
        "field x is bad; ".repeat(8)
    );
    p.clients
        .dynamodb
        .update_item()
        .table_name(&p.resources.table)
        .key(
            "item_id",
            aws_sdk_dynamodb::types::AttributeValue::S("v000".into()),
        )
        .update_expression("SET last_error = :e")
        .expression_attribute_values(
            ":e",
            aws_sdk_dynamodb::types::AttributeValue::S(long_error.clone()),
        )
        .send()
        .await
        .unwrap();

    let (code, out, _) = dlq.run(&["list", "--limit", "200"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("RECEIVES"), "{out}");
    assert!(
        out.contains(long_error.trim_end()),
        "piped, the whole error: {out}"
    );

    // A message no record holds: stats says so.
    p.send_to_dlq(&[&body("orphan", "ok")]).await;
    let (code, out, _) = dlq.run(&["stats"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("1 more DLQ message(s) than dead records"),
        "{out}"
    );

    // More than a hundred items: refused without --yes (nobody can answer), nothing changed.
    let (code, _, err) = dlq.run(&["redrive", "--force", "--mode", "requeue"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("refusing without --yes"), "{err}");
    assert!(p
        .records()
        .await
        .iter()
        .all(|r| r.status == sqs_keeper_core::dead_letter::ItemStatus::Dead));
    // A small selection goes ahead as before.
    let (code, out, err) = dlq.run(&["redrive", "--class", "throttled", "--mode", "requeue"]);
    assert_eq!(code, 0, "{out}{err}");
}
