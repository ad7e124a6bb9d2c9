//! A handler crate of one's own, outside this workspace: the README's quick start, its
//! `sh` block run by bash as a user pastes it (`keeper new`, `cargo build`, `keeper store`,
//! `keeper send`, `keeper run`, `dlq list`), with only what a test must change replaced, each
//! replacement checked to find its line. Then the same crate through a run started before
//! anything was sent, and built to abort on panic.
//!
//! The crate is built into the workspace's target directory (`CARGO_TARGET_DIR`), so that
//! it reuses the dependencies the tests compiled; its own directory would build the same
//! thing from nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The README's quick start: the first `sh` block of its "Write a handler" section.
fn readme_quick_start() -> &'static str {
    let readme: &'static str = include_str!("../../../README.md");
    let section = &readme[readme.find("## Write a handler").unwrap()..];
    let block = &section[section.find("```sh\n").unwrap() + 6..];
    &block[..block.find("```").unwrap()]
}

/// `text` with `from` replaced by `to`, which must be there: the README drifting from
/// what this test knows fails here.
fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the README's quick start no longer says `{from}`:\n{text}"
    );
    text.replace(from, to)
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
async fn the_readmes_quick_start_runs_in_bash_as_written() {
    let endpoints = e2e::emulator().await;
    let home = std::env::temp_dir().join(e2e::unique_prefix("outside"));
    let bin = home.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["keeper", "dlq"] {
        std::os::unix::fs::symlink(e2e::function_binary(tool), bin.join(tool)).unwrap();
    }
    let prefix = e2e::unique_prefix("outside");
    // The README's commands, in bash, with what a test must change: the tools already
    // built, the test's emulators, a store and a crate of their own, and the workspace's
    // target directory (so that the crate reuses the dependencies the tests compiled).
    let mut script = readme_quick_start().to_string();
    script = replaced(
        &script,
        "make handler-tools && export PATH=\"$PWD/target/debug:$PATH\"",
        &format!("export PATH=\"{}:$PATH\"", bin.display()),
    );
    script = replaced(
        &script,
        "scripts/emulator.sh start >/dev/null && export $(scripts/emulator.sh env)",
        &format!(
            "export EMULATOR_URL={} EMULATOR_DYNAMODB_URL={}",
            endpoints.shared, endpoints.dynamodb
        ),
    );
    script = replaced(&script, "--prefix orders", &format!("--prefix {prefix}"));
    let crate_dir = home.join("orders-handler");
    script = replaced(
        &script,
        "../orders-handler",
        &crate_dir.display().to_string(),
    );
    script = replaced(
        &script,
        "--worker target/debug/orders-handler",
        "--worker \"$CARGO_TARGET_DIR/debug/orders-handler\"",
    );
    // And, after the README's lines, the variables they exported, for the checks below.
    let exported = home.join("exported.env");
    script.push_str(&format!(
        "env | grep -E '^(AWS_|DLQ_|SOURCE_QUEUE_URL|EMULATOR_|WORKER_)' > {}\n",
        exported.display()
    ));
    let output = e2e::without_cargo_test_vars(Command::new("bash"))
        .args(["-eu", "-o", "pipefail", "-c", &script])
        .env("CARGO_TARGET_DIR", target_dir())
        .current_dir(&home)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{script}\n{out}\n{err}");
    // Built with no warning from the library; the handler's lines on the terminal; the
    // queue emptied; the refused order dead-lettered and listed by `dlq list`.
    assert!(!err.lines().any(|l| l.starts_with("warning")), "{err}");
    assert_eq!(err.matches("record done").count(), 1, "{err}");
    assert!(out.contains("queue empty"), "{out}");
    assert!(out.contains("has no quantity"), "{out}");

    // `keeper run` started before anything is sent waits for it.
    let env: HashMap<String, String> = std::fs::read_to_string(&exported)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let run = {
        let env = env.clone();
        let binary = target_dir().join("debug/orders-handler");
        let crate_dir = crate_dir.clone();
        tokio::task::spawn_blocking(move || {
            tool(
                "keeper",
                &[
                    "run",
                    "--worker",
                    binary.to_str().unwrap(),
                    "--max-secs",
                    "90",
                ],
                &env,
                &crate_dir,
            )
        })
    };
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    for (body, count) in [(r#"{"order_id":"o-3","qty":2}"#, "3"), ("not json", "1")] {
        let (code, out, err) = tool(
            "keeper",
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
    assert_eq!(err.matches("record done").count(), 3, "{err}");
    let (code, out, err) = tool("dlq", &["list", "--json"], &env, &crate_dir);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        out.matches("\"error_class\":\"validation\"").count(),
        2,
        "{out}"
    );

    // A send SQS would refuse is refused here, with nothing sent.
    let (code, _, err) = tool("keeper", &["send", "--body", "a\u{1}b"], &env, &crate_dir);
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
