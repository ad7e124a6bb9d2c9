//! `keeper bench` (cost part): what a million messages cost in Lambda, end to end, for the
//! compiled worker against Powertools for AWS Lambda (Python) doing the same work in the same
//! harness.
//!
//! Each contender is one sandbox: a process started against a local Runtime API (ours: the
//! `worker` bootstrap; Powertools: `bench/powertools_worker.py` run by AWS's Python runtime
//! interface client, `awslambdaric`), fed by the local event source mapping from a queue on
//! the emulator, batches of 10, every record POSTed to a downstream that answers after
//! 20 ms. Lambda bills an invocation's duration rounded up to the millisecond, and the
//! sandbox's init, times the configured memory; so:
//!
//! - *billed* = init (spawn → first poll of the Runtime API) + Σ invocation durations, each
//!   rounded up to 1 ms, as measured here on a full core;
//! - *GB-s per million* = billed ÷ messages × 10⁶ × memory in GB (128 MB and 512 MB);
//! - *messages per second per sandbox* = messages ÷ Σ invocation durations.
//!
//! The harness has a floor of its own: the local downstream answering a whole batch at
//! once on two cores, and the Runtime API's hand-over of each event. The *bare function*
//! measures it: `bare_function`, a `lambda_runtime` binary that POSTs every record of its
//! batch at once and does nothing else, run as the worker is. The worker ÷ that run is the
//! worker's own share of its figure.
//!
//! Lambda gives a function CPU in proportion to its memory (one vCPU at 1,769 MB), so at
//! 128 MB the CPU a sandbox uses takes about 14 times as long as on the full core it had
//! here. The *modelled* figures add that: billed + CPU seconds × (1,769 ÷ memory − 1), with
//! the CPU seconds read from the process (`utime + stime`). Time spent waiting on the
//! downstream does not stretch; CPU does.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use sqs_keeper_aws::{AwsClients, Endpoints};

use crate::downstream::{Downstream, DownstreamConfig};
use crate::esm::{EventSourceMapping, Invoker};
use crate::function::FunctionProcess;
use crate::invokers::RuntimeApiInvoker;
use crate::runtime_api::RuntimeApi;

/// Memory at which Lambda gives a function one full vCPU, MB.
pub const FULL_VCPU_MB: f64 = 1769.0;

/// The memory sizes the cost is given for, MB.
pub const MEMORY_SIZES_MB: [u32; 2] = [128, 512];

/// The downstream's latency per record.
pub const DOWNSTREAM_LATENCY: Duration = Duration::from_millis(20);

/// One contender's run.
#[derive(Debug, Clone, Serialize)]
pub struct CostRun {
    /// Who ran: `worker`, `powertools-sync`, `powertools-async`.
    pub contender: String,
    /// Messages processed (all succeeded).
    pub messages: u64,
    /// Invocations.
    pub invocations: u64,
    /// Spawn to the first poll of the Runtime API, ms.
    pub init_ms: f64,
    /// Σ invocation durations, ms.
    pub busy_ms: f64,
    /// Init plus Σ invocation durations each rounded up to 1 ms, ms.
    pub billed_ms: f64,
    /// CPU the sandbox process used, init included (`utime + stime`), ms.
    pub cpu_ms: f64,
    /// Messages ÷ Σ invocation durations.
    pub messages_per_second: f64,
    /// GB-seconds per million messages at each of [`MEMORY_SIZES_MB`], as measured.
    pub gb_seconds_per_million: Vec<f64>,
    /// The same with the CPU stretched to the memory size's share of a vCPU.
    pub modelled_gb_seconds_per_million: Vec<f64>,
}

impl CostRun {
    /// GB-s per million at the `i`th of [`MEMORY_SIZES_MB`]: `measured / modelled`.
    pub fn gb_seconds_pair(&self, i: usize) -> String {
        let at = |v: &[f64]| v.get(i).copied().unwrap_or(f64::NAN);
        format!(
            "{:.1} / {:.1}",
            at(&self.gb_seconds_per_million),
            at(&self.modelled_gb_seconds_per_million)
        )
    }
}

/// The contenders at one batch size.
#[derive(Debug, Clone, Serialize)]
pub struct CostScenario {
    /// Records per invocation (the worker runs that many at once).
    pub batch_size: i32,
    /// One run per contender.
    pub runs: Vec<CostRun>,
    /// Ours ÷ the cheaper Powertools, measured, per memory size (goal ≤ 0.1).
    pub ratio: Vec<f64>,
    /// Ours ÷ the cheaper Powertools, modelled, per memory size.
    pub modelled_ratio: Vec<f64>,
    /// The least any worker can be billed here, GB-s per million messages per memory size:
    /// every invocation waits at least the downstream's latency (all its records at once).
    pub latency_floor_gb_seconds_per_million: Vec<f64>,
    /// That floor ÷ the cheaper Powertools, measured: no worker's ratio can be lower.
    pub floor_ratio: Vec<f64>,
    /// Ours ÷ the bare function (the harness's own floor), measured, per memory size.
    pub harness_floor_ratio: Vec<f64>,
    /// The bare function ÷ the latency floor: what the harness adds to one wait.
    pub harness_over_latency_floor: Vec<f64>,
}

/// The whole cost comparison.
#[derive(Debug, Clone, Serialize)]
pub struct CostBench {
    /// Messages per contender and batch size.
    pub messages: usize,
    /// The downstream's latency per record, ms.
    pub downstream_latency_ms: u64,
    /// Memory sizes of the GB-second columns, MB.
    pub memory_sizes_mb: Vec<u32>,
    /// One scenario per batch size.
    pub scenarios: Vec<CostScenario>,
}

/// The batch sizes measured: SQS's most per receive (and the template's default), and a
/// batch gathered over a batching window.
pub const BATCH_SIZES: [i32; 2] = [10, 100];

/// Times every invocation it passes on.
pub(crate) struct TimedInvoker<I = RuntimeApiInvoker> {
    inner: I,
    durations: Mutex<Vec<Duration>>,
}

impl<I: Invoker> TimedInvoker<I> {
    /// Times the invocations of `inner`.
    pub(crate) fn new(inner: I) -> Self {
        TimedInvoker {
            inner,
            durations: Mutex::new(Vec::new()),
        }
    }

    /// Every invocation's duration so far.
    fn durations(&self) -> Vec<Duration> {
        self.durations.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// Σ invocation durations, each rounded up to 1 ms as Lambda bills them, ms.
    pub(crate) fn billed_ms(&self) -> f64 {
        self.durations()
            .iter()
            .map(|d| (d.as_secs_f64() * 1000.0).ceil())
            .sum()
    }
}

impl<I: Invoker> Invoker for TimedInvoker<I> {
    async fn invoke(&self, event: Bytes) -> Result<Vec<String>, String> {
        let started = Instant::now();
        let result = self.inner.invoke(event).await;
        if let Ok(mut durations) = self.durations.lock() {
            durations.push(started.elapsed());
        }
        result
    }
}

/// The name of the harness's floor among the contenders: `bare_function`, which POSTs
/// every record of a batch at once and does nothing else.
pub const BARE_FUNCTION: &str = "bare-function";

/// CPU time a process has used, from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Option<Duration> {
    cpu_time_of_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `utime + stime` of a `/proc/<pid>/stat` line, in the kernel's fixed 100 ticks per
/// second (`USER_HZ`).
fn cpu_time_of_stat(stat: &str) -> Option<Duration> {
    // The command name, in parentheses, may hold spaces and parentheses: the fields
    // start after the last `)`.
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: the 12th and 13th after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// GB-seconds per million messages for `billed_ms` of `memory_mb` over `messages`.
fn gb_seconds_per_million(billed_ms: f64, messages: usize, memory_mb: u32) -> f64 {
    billed_ms / 1000.0 / messages.max(1) as f64 * 1e6 * f64::from(memory_mb) / 1024.0
}

/// Billed milliseconds with the CPU stretched to `memory_mb`'s share of a vCPU.
fn modelled_billed_ms(billed_ms: f64, cpu_ms: f64, memory_mb: u32) -> f64 {
    let stretch = (FULL_VCPU_MB / f64::from(memory_mb) - 1.0).max(0.0);
    billed_ms + cpu_ms * stretch
}

/// A contender: its name and how to start it.
enum Contender<'a> {
    Binary(&'a Path),
    Bare(&'a Path),
    Powertools(&'static str),
}

impl Contender<'_> {
    fn name(&self) -> String {
        match self {
            Contender::Binary(_) => "worker".to_string(),
            Contender::Bare(_) => BARE_FUNCTION.to_string(),
            Contender::Powertools(mode) => format!("powertools-{mode}"),
        }
    }

    fn command(&self) -> tokio::process::Command {
        match self {
            Contender::Binary(path) | Contender::Bare(path) => tokio::process::Command::new(path),
            Contender::Powertools(mode) => {
                let script =
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench-python.sh");
                let mut command = tokio::process::Command::new(script);
                command.arg("worker").arg(mode);
                command
            }
        }
    }
}

async fn fill_queue(
    clients: &AwsClients,
    name: &str,
    messages: usize,
) -> Result<(String, String), String> {
    let attributes = [(
        aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
        "60".to_string(),
    )]
    .into_iter()
    .collect();
    let url = crate::resources::create_queue(clients, name, attributes).await?;
    let arn = crate::resources::queue_arn(clients, &url).await?;
    let bodies: Vec<String> = (0..messages)
        .map(|i| {
            serde_json::json!({"id": format!("{name}-{i:06}"), "scenario": "slow"}).to_string()
        })
        .collect();
    crate::demo::send_bodies(&clients.sqs, &url, &bodies)
        .await
        .map_err(|e| format!("fill {name}: {e}"))?;
    Ok((url, arn))
}

async fn run_one(
    clients: &AwsClients,
    contender: &Contender<'_>,
    downstream: &str,
    messages: usize,
    batch_size: i32,
    tag: &str,
) -> Result<CostRun, String> {
    let name = contender.name();
    let queue = format!("cost-{name}-{batch_size}-{tag}");
    let (url, arn) = fill_queue(clients, &queue, messages).await?;
    let api = RuntimeApi::start(&format!(
        "arn:aws:lambda:us-east-1:000000000000:function:{name}"
    ))
    .await
    .map_err(|e| e.to_string())?;
    let concurrency = batch_size.to_string();
    let env: Vec<(String, String)> = [
        ("WORKER_DOWNSTREAM_URL", downstream),
        // The whole batch at once, as the async processor runs it.
        ("WORKER_MAX_CONCURRENCY", concurrency.as_str()),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"),
        ("AWS_REGION", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let spawned = Instant::now();
    let mut process = FunctionProcess::spawn_command(
        contender.command(),
        &name,
        &api.address(),
        &env,
        Some(Path::new("/dev/null")),
    )
    .map_err(|e| format!("{name}: {e}"))?;
    let polled = api
        .first_poll(Duration::from_secs(30))
        .await
        .ok_or_else(|| format!("{name} never polled the Runtime API"))?;
    let init = polled.duration_since(spawned);
    let invoker = TimedInvoker::new(RuntimeApiInvoker {
        api,
        timeout: Duration::from_secs(60),
    });
    let esm = EventSourceMapping::new(clients.sqs.clone(), &url, &arn, "us-east-1", batch_size);
    let (stats, drained) = esm
        .run_until_drained(&invoker, Duration::from_secs(600))
        .await?;
    let cpu = process
        .pid()
        .and_then(cpu_time)
        .ok_or_else(|| format!("cannot read the CPU time of {name}"))?;
    let _ = process.kill().await;
    if !drained || stats.deleted != messages as u64 || stats.reported > 0 {
        return Err(format!(
            "{name} did not process every message once: {stats:?}, drained {drained}"
        ));
    }
    let busy: Duration = invoker.durations().iter().sum();
    let billed_ms = init.as_secs_f64() * 1000.0 + invoker.billed_ms();
    let cpu_ms = cpu.as_secs_f64() * 1000.0;
    Ok(CostRun {
        contender: name,
        messages: stats.deleted,
        invocations: stats.invocations,
        init_ms: init.as_secs_f64() * 1000.0,
        busy_ms: busy.as_secs_f64() * 1000.0,
        billed_ms,
        cpu_ms,
        messages_per_second: messages as f64 / busy.as_secs_f64().max(f64::MIN_POSITIVE),
        gb_seconds_per_million: MEMORY_SIZES_MB
            .iter()
            .map(|&m| gb_seconds_per_million(billed_ms, messages, m))
            .collect(),
        modelled_gb_seconds_per_million: MEMORY_SIZES_MB
            .iter()
            .map(|&m| gb_seconds_per_million(modelled_billed_ms(billed_ms, cpu_ms, m), messages, m))
            .collect(),
    })
}

/// Runs the worker (`bin_dir`'s `worker` bootstrap) and both Powertools processors over
/// `messages` messages each.
pub async fn run(
    endpoints: &Endpoints,
    bin_dir: &Path,
    messages: usize,
) -> Result<CostBench, String> {
    let clients = AwsClients::for_endpoints(endpoints, "us-east-1").await;
    let downstream = Downstream::start(
        0,
        DownstreamConfig {
            flaky_failures: 0,
            slow_delay: DOWNSTREAM_LATENCY,
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let url = downstream.url();
    let worker = crate::bench_runtime::function_binary(bin_dir, "worker");
    let bare = crate::bench_runtime::function_binary(bin_dir, "bare_function");
    let tag = chrono::Utc::now().format("%H%M%S").to_string();
    let mut scenarios = Vec::new();
    for batch_size in BATCH_SIZES {
        let mut runs = Vec::new();
        for contender in [
            Contender::Binary(&worker),
            Contender::Powertools("sync"),
            Contender::Powertools("async"),
            Contender::Bare(&bare),
        ] {
            eprintln!("  {} with batches of {batch_size} ...", contender.name());
            runs.push(run_one(&clients, &contender, &url, messages, batch_size, &tag).await?);
        }
        scenarios.push(scenario(batch_size, runs));
    }
    Ok(CostBench {
        messages,
        downstream_latency_ms: u64::try_from(DOWNSTREAM_LATENCY.as_millis()).unwrap_or(0),
        memory_sizes_mb: MEMORY_SIZES_MB.to_vec(),
        scenarios,
    })
}

/// The ratios of one batch size's runs.
fn scenario(batch_size: i32, runs: Vec<CostRun>) -> CostScenario {
    let ours = runs.iter().find(|r| r.contender == "worker");
    let cheapest = |f: fn(&CostRun) -> &Vec<f64>, i: usize| {
        runs.iter()
            .filter(|r| r.contender.starts_with("powertools"))
            .filter_map(|r| f(r).get(i).copied())
            .fold(f64::INFINITY, f64::min)
    };
    let ratio_of = |f: fn(&CostRun) -> &Vec<f64>| -> Vec<f64> {
        (0..MEMORY_SIZES_MB.len())
            .map(|i| ours.and_then(|o| f(o).get(i).copied()).unwrap_or(f64::NAN) / cheapest(f, i))
            .collect()
    };
    let ratio = ratio_of(|r| &r.gb_seconds_per_million);
    let modelled_ratio = ratio_of(|r| &r.modelled_gb_seconds_per_million);
    let latency_floor: Vec<f64> = MEMORY_SIZES_MB
        .iter()
        .map(|&m| latency_floor_gb_seconds_per_million(batch_size, m))
        .collect();
    let floor_ratio = latency_floor
        .iter()
        .enumerate()
        .map(|(i, floor)| floor / cheapest(|r| &r.gb_seconds_per_million, i))
        .collect();
    let harness = runs.iter().find(|r| r.contender == BARE_FUNCTION);
    let per_memory_size =
        |f: &dyn Fn(usize) -> f64| -> Vec<f64> { (0..MEMORY_SIZES_MB.len()).map(f).collect() };
    let harness_floor_ratio = per_memory_size(&|i| measured_at(ours, i) / measured_at(harness, i));
    let harness_over_latency_floor =
        per_memory_size(&|i| measured_at(harness, i) / latency_floor[i]);
    CostScenario {
        batch_size,
        runs,
        ratio,
        modelled_ratio,
        latency_floor_gb_seconds_per_million: latency_floor,
        floor_ratio,
        harness_floor_ratio,
        harness_over_latency_floor,
    }
}

/// A run's measured GB-s per million at the `i`th of [`MEMORY_SIZES_MB`] (NaN without it).
fn measured_at(run: Option<&CostRun>, i: usize) -> f64 {
    run.and_then(|r| r.gb_seconds_per_million.get(i).copied())
        .unwrap_or(f64::NAN)
}

/// GB-s per million messages of invocations that each last exactly the downstream's
/// latency and carry `batch_size` messages.
fn latency_floor_gb_seconds_per_million(batch_size: i32, memory_mb: u32) -> f64 {
    let per_message_ms = DOWNSTREAM_LATENCY.as_secs_f64() * 1000.0 / f64::from(batch_size.max(1));
    gb_seconds_per_million(per_message_ms * 1_000.0, 1_000, memory_mb)
}

/// The figures as tables, one per batch size.
pub fn render(bench: &CostBench) -> String {
    let mut out = String::new();
    for scenario in &bench.scenarios {
        let rows: Vec<Vec<String>> = scenario
            .runs
            .iter()
            .map(|r| {
                let mut row = vec![
                    r.contender.clone(),
                    format!("{:.0}", r.init_ms),
                    format!("{:.0}", r.messages_per_second),
                    format!("{:.0}", r.cpu_ms),
                ];
                for (i, _) in MEMORY_SIZES_MB.iter().enumerate() {
                    row.push(r.gb_seconds_pair(i));
                }
                row
            })
            .collect();
        out.push_str(&format!(
            "\n{} messages in batches of {}, downstream {} ms:\n",
            bench.messages, scenario.batch_size, bench.downstream_latency_ms
        ));
        out.push_str(&sqs_keeper_core::analysis::table(
            &[
                "CONTENDER",
                "INIT ms",
                "MSG/s PER SANDBOX",
                "CPU ms",
                "GB-s/M 128 MB (measured / modelled)",
                "GB-s/M 512 MB (measured / modelled)",
            ],
            &rows,
        ));
        out.push_str(&format!(
            "\nours ÷ the cheaper Powertools: {} measured, {} modelled (goal ≤ 0.1); \
             the downstream's latency alone ÷ the cheaper Powertools: {}; ours ÷ the \
             bare function: {}; the bare function ÷ the latency floor: {}\n",
            ratios(&scenario.ratio),
            ratios(&scenario.modelled_ratio),
            ratios(&scenario.floor_ratio),
            ratios(&scenario.harness_floor_ratio),
            ratios(&scenario.harness_over_latency_floor)
        ));
    }
    out
}

/// `0.123 at 128 MB, 0.234 at 512 MB`.
pub fn ratios(values: &[f64]) -> String {
    values
        .iter()
        .zip(MEMORY_SIZES_MB)
        .map(|(v, m)| format!("{v:.3} at {m} MB"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let stat = "4242 (python3 (x) y) S 1 4242 4242 0 -1 4194304 1234 0 0 0 \
                    250 37 0 0 20 0 1 0 100 0 0";
        assert_eq!(cpu_time_of_stat(stat), Some(Duration::from_millis(2_870)));
        assert_eq!(cpu_time_of_stat("4242 (worker) S 1"), None);
        assert_eq!(cpu_time_of_stat("no parentheses"), None);
    }

    #[test]
    fn the_latency_floor_is_one_downstream_wait_per_batch() {
        // 20 ms per batch of 10 at 128 MB: 2 ms per message, 2,000 s per million, 250 GB-s.
        assert!((latency_floor_gb_seconds_per_million(10, 128) - 250.0).abs() < 1e-9);
        assert!((latency_floor_gb_seconds_per_million(100, 128) - 25.0).abs() < 1e-9);
    }

    #[test]
    fn cost_is_billed_time_times_memory_per_million() {
        // 1,000 messages billed 2,000 ms at 1,024 MB: 2 GB-s per thousand, 2,000 per million.
        assert!((gb_seconds_per_million(2_000.0, 1_000, 1_024) - 2_000.0).abs() < 1e-9);
        assert!((gb_seconds_per_million(2_000.0, 1_000, 128) - 250.0).abs() < 1e-9);
        // At 1,769 MB a function has a whole vCPU: no stretch; at 128 MB, 1769/128 as long.
        assert!((modelled_billed_ms(100.0, 40.0, 1_769) - 100.0).abs() < 1e-9);
        assert!(
            (modelled_billed_ms(100.0, 40.0, 128) - (100.0 + 40.0 * (1769.0 / 128.0 - 1.0))).abs()
                < 1e-9
        );
        assert!((modelled_billed_ms(100.0, 40.0, 4_096) - 100.0).abs() < 1e-9);
    }
}
