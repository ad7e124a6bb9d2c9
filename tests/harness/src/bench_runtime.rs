//! `keeper bench-runtime`: what the worker binary costs to start and run, against peers
//! measured in the same run: cold start (spawn to the first Runtime API poll) against a
//! hello-world `lambda_runtime` binary of the same profile, stripped binary size, peak
//! RSS while handling a 10,000-record event against the event's size, and a batch's
//! wall time at several concurrency limits against the ideal `n × latency / c`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use sqs_keeper_core::retry::Deadline;
use sqs_keeper_core::{dead_letter::InvocationInfo, dead_letter::NoDeadLetterStore};
use sqs_keeper_core::{BatchConfig, BatchProcessor};
use sqs_keeper_http::{HttpDelivery, HttpDeliveryConfig};

use crate::downstream::{Downstream, DownstreamConfig};
use crate::function::FunctionProcess;
use crate::runtime_api::{InvocationResult, RuntimeApi};

/// Cold start of one binary.
#[derive(Debug, Clone, Serialize)]
pub struct ColdStart {
    /// Binary name.
    pub binary: String,
    /// Median spawn → first poll, ms.
    pub median_ms: f64,
    /// Spawns measured.
    pub runs: usize,
    /// File size in bytes (release profile strips symbols).
    pub size_bytes: u64,
    /// The deployable `bootstrap.zip` beside the binary, when one was built, bytes.
    pub zip_bytes: Option<u64>,
}

/// One concurrency measurement.
#[derive(Debug, Clone, Serialize)]
pub struct ConcurrencyRun {
    /// Concurrency limit.
    pub concurrency: usize,
    /// Wall time, ms.
    pub wall_ms: f64,
    /// `records × latency / concurrency`, ms.
    pub ideal_ms: f64,
    /// wall ÷ ideal.
    pub ratio: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeBench {
    /// Worker and hello-world cold starts.
    pub cold_starts: Vec<ColdStart>,
    /// Worker cold start ÷ hello-world cold start.
    pub cold_start_ratio: f64,
    /// Event bytes of the 10,000-record event.
    pub event_bytes: usize,
    /// Worker peak RSS (VmHWM) after handling it, bytes.
    pub peak_rss_bytes: u64,
    /// Peak RSS ÷ event size.
    pub rss_ratio: f64,
    /// Worker peak RSS after a one-record invocation (runtime, clients, allocator), bytes.
    pub baseline_rss_bytes: u64,
    /// (Peak − baseline) ÷ event size: what handling the large event itself added.
    pub added_rss_ratio: f64,
    /// Concurrency runs.
    pub concurrency: Vec<ConcurrencyRun>,
}

fn worker_env(downstream: &str) -> Vec<(String, String)> {
    [
        ("WORKER_DOWNSTREAM_URL", downstream),
        ("WORKER_ITEM_ID_SOURCE", "pointer:/id"),
        ("WORKER_MAX_CONCURRENCY", "50"),
        ("RUST_LOG", "warn"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Cold starts of `binaries`, spawned in turn (one of each per round, `runs` rounds), so
/// that a slow spell on a shared machine falls on all of them rather than on one.
async fn cold_starts(
    binaries: &[&Path],
    env: &[(String, String)],
    runs: usize,
) -> Result<Vec<ColdStart>, String> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(runs); binaries.len()];
    for _ in 0..runs {
        for (binary, samples) in binaries.iter().zip(samples.iter_mut()) {
            let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:bench")
                .await
                .map_err(|e| e.to_string())?;
            let spawned = Instant::now();
            let mut process = FunctionProcess::spawn(
                binary,
                "bench",
                &api.address(),
                env,
                Some(Path::new("/dev/null")),
            )
            .map_err(|e| format!("{}: {e}", binary.display()))?;
            let polled = api
                .first_poll(Duration::from_secs(10))
                .await
                .ok_or_else(|| format!("{} never polled the Runtime API", binary.display()))?;
            samples.push(polled.duration_since(spawned).as_secs_f64() * 1000.0);
            let _ = process.kill().await;
        }
    }
    Ok(binaries
        .iter()
        .zip(samples)
        .map(|(binary, mut samples)| {
            samples.sort_by(f64::total_cmp);
            ColdStart {
                binary: function_name(binary),
                median_ms: samples.get(samples.len() / 2).copied().unwrap_or(0.0),
                runs,
                size_bytes: std::fs::metadata(binary).map(|m| m.len()).unwrap_or(0),
                zip_bytes: binary
                    .parent()
                    .and_then(|dir| std::fs::metadata(dir.join("bootstrap.zip")).ok())
                    .map(|m| m.len()),
            }
        })
        .collect())
}

/// A Lambda SQS event of `n` records with ~60-byte bodies: 10,000 of them stay under the
/// 6 MB synchronous payload limit.
pub fn event(n: usize) -> String {
    let records: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            json!({
                "messageId": format!("6b0a2c1e-0000-4000-8000-{i:012}"),
                "receiptHandle": "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a+Hh0jqDA/LYJlPsN2Y4eyJ1mFv0a0RXcLZ5uM6F4B2gbC0q4S0cj40L1Ss/AQUvEJTZ7U09yg==",
                "body": json!({"id": format!("order-{i:06}"), "scenario": "ok", "amount": i % 100}).to_string(),
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1763700000000",
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": "1763700000100"
                },
                "messageAttributes": {},
                "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
                "awsRegion": "us-east-1"
            })
        })
        .collect();
    json!({ "Records": records }).to_string()
}

fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The function a binary is: its file name, or for a `<name>/bootstrap` its folder's.
fn function_name(binary: &Path) -> String {
    let file = binary.file_name();
    let named = if file.is_some_and(|f| f == "bootstrap") {
        binary.parent().and_then(Path::file_name)
    } else {
        file
    };
    named
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default()
}

/// A function binary in `bin_dir`: the `<name>/bootstrap` that cargo-lambda lays out (what
/// `make package` zips and `make bench` measures), else a plain `<name>` (a cargo build).
pub fn function_binary(bin_dir: &Path, name: &str) -> std::path::PathBuf {
    let bootstrap = bin_dir.join(name).join("bootstrap");
    if bootstrap.is_file() {
        bootstrap
    } else {
        bin_dir.join(name)
    }
}

/// Runs every measure; `bin_dir` holds release builds of `worker` and `hello_lambda`
/// (see [`function_binary`]).
pub async fn run(bin_dir: &Path, spawns: usize) -> Result<RuntimeBench, String> {
    let downstream = Downstream::start(
        0,
        DownstreamConfig {
            flaky_failures: 0,
            slow_delay: Duration::from_millis(20),
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let env = worker_env(&downstream.url());
    let (worker_bin, hello_bin) = (
        function_binary(bin_dir, "worker"),
        function_binary(bin_dir, "hello_lambda"),
    );
    let mut starts = cold_starts(&[&worker_bin, &hello_bin], &env, spawns)
        .await?
        .into_iter();
    let (Some(worker), Some(hello)) = (starts.next(), starts.next()) else {
        return Err("no cold-start figures".into());
    };
    let cold_start_ratio = worker.median_ms / hello.median_ms.max(f64::MIN_POSITIVE);

    // Peak RSS on a 10,000-record event, within Lambda's 6 MB synchronous payload limit.
    let body = event(10_000);
    if body.len() > 6_291_456 {
        return Err(format!(
            "the benchmark event is {} bytes, over the 6 MB Lambda limit",
            body.len()
        ));
    }
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:bench")
        .await
        .map_err(|e| e.to_string())?;
    let process = FunctionProcess::spawn(
        &worker_bin,
        "bench",
        &api.address(),
        &env,
        Some(Path::new("/dev/null")),
    )
    .map_err(|e| e.to_string())?;
    // A one-record invocation first: the peak after it is what the process needs to run at
    // all, so the large event's own share can be told apart.
    let small = event(1);
    match api
        .invoke(small.into(), Duration::from_secs(60))
        .await
        .map_err(|e| e.to_string())?
    {
        InvocationResult::Response(r) if r.as_ref() == br#"{"batchItemFailures":[]}"# => {}
        other => return Err(format!("the one-record invocation failed: {other:?}")),
    }
    let baseline_rss_bytes = process
        .pid()
        .and_then(peak_rss)
        .ok_or("cannot read the worker's VmHWM")?;
    let answer = api
        .invoke(body.clone().into(), Duration::from_secs(300))
        .await
        .map_err(|e| e.to_string())?;
    match answer {
        InvocationResult::Response(r) if r.as_ref() == br#"{"batchItemFailures":[]}"# => {}
        other => {
            return Err(format!(
                "the 10,000-record invocation did not fully succeed: {other:?}"
            ))
        }
    }
    let peak_rss_bytes = process
        .pid()
        .and_then(peak_rss)
        .ok_or("cannot read the worker's VmHWM")?;
    drop(process);

    // Concurrency: 100 records, each taking 20 ms downstream.
    let mut concurrency = Vec::new();
    for c in [1usize, 10, 50] {
        let delivery = HttpDelivery::new(HttpDeliveryConfig::new(
            downstream.url().parse().map_err(|e| format!("{e}"))?,
            Duration::from_secs(5),
        ))
        .map_err(|e| e.to_string())?;
        let engine = BatchProcessor::new(
            delivery,
            NoDeadLetterStore,
            BatchConfig {
                concurrency: c,
                ..BatchConfig::default()
            },
        );
        let records: Vec<serde_json::Value> = (0..100)
            .map(|i| json!({"messageId": format!("m-{c}-{i}"), "body": json!({"id": format!("c{c}-{i}"), "scenario": "slow"}).to_string(), "attributes": {}}))
            .collect();
        let ev =
            serde_json::from_value(json!({ "Records": records })).map_err(|e| e.to_string())?;
        let start = Instant::now();
        let report = engine
            .process_batch(
                ev,
                Deadline::after(Duration::from_secs(120), Duration::ZERO),
                &InvocationInfo::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let wall_ms = start.elapsed().as_secs_f64() * 1000.0;
        if report.counts().done != 100 {
            return Err(format!("concurrency {c}: {:?}", report.counts()));
        }
        let ideal_ms = 100.0 * 20.0 / c as f64;
        concurrency.push(ConcurrencyRun {
            concurrency: c,
            wall_ms,
            ideal_ms,
            ratio: wall_ms / ideal_ms,
        });
    }
    Ok(RuntimeBench {
        cold_starts: vec![worker, hello],
        cold_start_ratio,
        event_bytes: body.len(),
        peak_rss_bytes,
        rss_ratio: peak_rss_bytes as f64 / body.len() as f64,
        baseline_rss_bytes,
        added_rss_ratio: peak_rss_bytes.saturating_sub(baseline_rss_bytes) as f64
            / body.len() as f64,
        concurrency,
    })
}

/// The figures as text.
pub fn render(b: &RuntimeBench) -> String {
    let mut rows: Vec<Vec<String>> = b
        .cold_starts
        .iter()
        .map(|c| {
            vec![
                c.binary.clone(),
                format!("{:.1} ms (median of {})", c.median_ms, c.runs),
                format!("{:.2} MB", c.size_bytes as f64 / 1_048_576.0),
            ]
        })
        .collect();
    rows.push(vec![
        "worker ÷ hello".into(),
        format!("{:.2}×", b.cold_start_ratio),
        String::new(),
    ]);
    let mut out = sqs_keeper_core::analysis::table(&["BINARY", "COLD START", "SIZE"], &rows);
    out.push_str(&format!(
        "\npeak RSS handling {} records: {:.1} MB for a {:.1} MB event ({:.2}× the event); \
         after a one-record invocation {:.1} MB, so the event added {:.2}× its size\n\n",
        10_000,
        b.peak_rss_bytes as f64 / 1_048_576.0,
        b.event_bytes as f64 / 1_048_576.0,
        b.rss_ratio,
        b.baseline_rss_bytes as f64 / 1_048_576.0,
        b.added_rss_ratio
    ));
    let rows: Vec<Vec<String>> = b
        .concurrency
        .iter()
        .map(|c| {
            vec![
                c.concurrency.to_string(),
                format!("{:.0}", c.wall_ms),
                format!("{:.0}", c.ideal_ms),
                format!("{:.2}×", c.ratio),
            ]
        })
        .collect();
    out.push_str(&sqs_keeper_core::analysis::table(
        &["CONCURRENCY", "WALL ms", "IDEAL ms", "VS IDEAL"],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bootstrap_is_named_by_its_function_and_preferred_when_present() {
        assert_eq!(
            function_name(Path::new("t/lambda/worker/bootstrap")),
            "worker"
        );
        assert_eq!(
            function_name(Path::new("t/release/hello_lambda")),
            "hello_lambda"
        );
        let dir = std::env::temp_dir().join(format!("bench-bins-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("worker")).unwrap();
        assert_eq!(function_binary(&dir, "worker"), dir.join("worker"));
        std::fs::write(dir.join("worker/bootstrap"), b"").unwrap();
        assert_eq!(
            function_binary(&dir, "worker"),
            dir.join("worker/bootstrap")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
