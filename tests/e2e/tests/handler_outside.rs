//! A handler crate of one's own, outside this workspace, through the README's quick start:
//! `local new` makes the crate, `cargo build` builds it, `local store` makes the store and
//! queue, `local send` fills the queue, `local run` runs the handler, and `dlq list` shows
//! what was dead-lettered. The README holds each command this test runs.
//!
//! The crate is built into the workspace's target directory (`CARGO_TARGET_DIR`), so that
//! it reuses the dependencies the tests compiled; its own directory would build the same
//! thing from nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The README's quick start; each command below must be in it.
const README: &str = include_str!("../../../README.md");

fn readme_says(command: &str) {
    assert!(
        README.contains(command),
        "the README's quick start no longer says `{command}`"
    );
}

fn tool(
    name: &str,
    args: &[&str],
    env: &HashMap<String, String>,
    dir: &Path,
) -> (i32, String, String) {
    let output = Command::new(e2e::function_binary(name))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn target_dir() -> PathBuf {
    sqs_keeper_local::function::workspace_bin_dir()
        .and_then(|debug| debug.parent().map(Path::to_path_buf))
        .unwrap()
}

/// `cargo <args>` in the crate, into the workspace's target directory.
fn cargo(crate_dir: &Path, args: &[&str]) -> (bool, String) {
    let output = e2e::inner_cargo()
        .args(args)
        .current_dir(crate_dir)
        .env("CARGO_TARGET_DIR", target_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crate_from_local_new_builds_runs_and_dead_letters_as_the_readme_says() {
    let endpoints = e2e::emulator().await;
    let home = std::env::temp_dir().join(e2e::unique_prefix("outside"));
    std::fs::create_dir_all(&home).unwrap();
    let mut env = HashMap::from([
        ("EMULATOR_URL".to_string(), endpoints.shared.clone()),
        (
            "EMULATOR_DYNAMODB_URL".to_string(),
            endpoints.dynamodb.clone(),
        ),
    ]);

    // The crate, outside the workspace.
    readme_says("local new ../orders-handler");
    let (code, out, err) = tool("local", &["new", "orders-handler"], &env, &home);
    assert_eq!(code, 0, "{out}\n{err}");
    let crate_dir = home.join("orders-handler");

    // Built as the README says; the library says nothing to a handler's build.
    readme_says("cargo build\n");
    let (built, log) = cargo(&crate_dir, &["build"]);
    assert!(built, "{log}");
    let warnings: Vec<&str> = log.lines().filter(|l| l.starts_with("warning")).collect();
    assert!(warnings.is_empty(), "{log}");
    let binary = target_dir().join("debug/orders-handler");

    // The store and queue, and the variables for them.
    readme_says("export $(local store --prefix orders)");
    let prefix = e2e::unique_prefix("outside");
    let (code, out, err) = tool("local", &["store", "--prefix", &prefix], &env, &home);
    assert_eq!(code, 0, "{out}\n{err}");
    env.extend(
        out.lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );

    // `local run` first waits for a message: it is started before anything is sent.
    readme_says("local run --worker target/debug/orders-handler");
    let run = {
        let env = env.clone();
        let crate_dir = crate_dir.clone();
        let binary = binary.to_string_lossy().into_owned();
        tokio::task::spawn_blocking(move || {
            tool(
                "local",
                &["run", "--worker", &binary, "--max-secs", "90"],
                &env,
                &crate_dir,
            )
        })
    };
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    readme_says(r#"local send --body '{"order_id":"o-1","qty":2}'"#);
    readme_says(r#"local send --body '{"order_id":"o-2","qty":0}'"#);
    for (body, count) in [
        (r#"{"order_id":"o-1","qty":2}"#, "3"),
        (r#"{"order_id":"o-2","qty":0}"#, "1"),
        ("not json", "1"),
    ] {
        let (code, out, err) = tool(
            "local",
            &["send", "--body", body, "--count", count],
            &env,
            &crate_dir,
        );
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains(&format!("sent {count} message(s)")), "{out}");
    }
    let (code, out, err) = run.await.unwrap();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("waiting up to 30 s for a message"), "{err}");
    assert!(out.contains("queue empty"), "{out}");
    assert_eq!(err.matches("record done").count(), 3, "{err}");

    // The two it refused, dead-lettered with their reasons.
    readme_says("dlq list");
    let (code, out, err) = tool("dlq", &["list", "--json"], &env, &crate_dir);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("order o-2 has no quantity"), "{out}");
    assert_eq!(
        out.matches("\"error_class\":\"validation\"").count(),
        2,
        "{out}"
    );

    // A send SQS would refuse is refused here, with nothing sent.
    let (code, _, err) = tool("local", &["send", "--body", "a\u{1}b"], &env, &crate_dir);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("outside the characters SQS takes"), "{err}");

    // Built to abort on panic (as `cargo lambda build --release` builds a crate whose
    // release profile does not say `panic = "unwind"`), the library refuses to compile and
    // names the fix. `check` reaches that refusal without generating code.
    let (built, log) = cargo(
        &crate_dir,
        &["check", "--config", "profile.dev.panic=\"abort\""],
    );
    assert!(!built, "{log}");
    assert!(
        log.contains("[profile.release]\n       panic = \"unwind\""),
        "{log}"
    );
    std::fs::remove_dir_all(&home).unwrap();
}
