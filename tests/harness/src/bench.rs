//! `keeper bench` (`make bench`): every benchmark in one run — per-record CPU against
//! Powertools and the `serde_json` floor, cold start / size / peak RSS / concurrency of the
//! worker binary, and dead-letter overhead against the emulator — printed as tables,
//! written as JSON, and rendered as `docs/BENCHMARKS.md` with the machine's description.

use std::path::Path;

use serde::Serialize;

use crate::bench_allin::{self, AllInBench, Configuration};
use crate::bench_cost::{self, CostBench};
use crate::bench_cpu::{self, CpuRun};
use crate::bench_deadletter::{self, DeadLetterBench};
use crate::bench_runtime::{self, RuntimeBench};

/// What the figures were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPU model.
    pub cpu: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// Kernel release.
    pub kernel: String,
    /// `rustc --version`.
    pub rustc: String,
    /// Date of the run (UTC).
    pub date: String,
}

fn first_line_with(path: &str, prefix: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()?.lines().find_map(|l| {
        l.strip_prefix(prefix)
            .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_string())
    })
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

/// Describes this machine.
pub fn machine() -> Machine {
    let memory_kib: f64 = first_line_with("/proc/meminfo", "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    Machine {
        cpu: first_line_with("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into()),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_gib: memory_kib / 1_048_576.0,
        kernel: command_output("uname", &["-r"]),
        rustc: command_output("rustc", &["--version"]),
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
    }
}

/// One whole run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRun {
    /// Where it ran.
    pub machine: Machine,
    /// Per-record CPU.
    pub cpu: Vec<CpuRun>,
    /// Binary start, size, memory, concurrency.
    pub runtime: RuntimeBench,
    /// Dead-letter overhead.
    pub dead_letter: DeadLetterBench,
    /// Cost per million messages end to end against Powertools.
    pub cost: CostBench,
    /// What a million messages cost all in, in four configurations, against Powertools.
    pub all_in: AllInBench,
}

/// Options of a run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The emulators' endpoints.
    pub endpoints: sqs_keeper_aws::Endpoints,
    /// Iterations per CPU measurement.
    pub iterations: usize,
    /// Spawns per cold-start median.
    pub spawns: usize,
    /// Where the release binaries are.
    pub bin_dir: std::path::PathBuf,
    /// Scratch directory (event files, responses).
    pub work_dir: std::path::PathBuf,
    /// Messages per contender in the cost benchmark.
    pub cost_messages: usize,
}

/// Runs everything.
pub async fn run(options: &BenchOptions) -> Result<BenchRun, String> {
    eprintln!("per-record CPU (ours, serde_json floor, Powertools)...");
    let cpu = bench_cpu::run(options.iterations, &options.work_dir.join("cpu")).await?;
    eprintln!("cold start, size, peak RSS, concurrency...");
    let runtime = bench_runtime::run(&options.bin_dir, options.spawns).await?;
    eprintln!("dead-letter overhead against the emulator...");
    let dead_letter = bench_deadletter::run(&options.endpoints, "bench-dl", 100, 5).await?;
    eprintln!("cost per million messages, end to end (ours, Powertools sync and async)...");
    let cost = bench_cost::run(&options.endpoints, &options.bin_dir, options.cost_messages).await?;
    eprintln!("all-in cost per million messages, four configurations (ours, Powertools)...");
    let all_in =
        bench_allin::run(&options.endpoints, &options.bin_dir, options.cost_messages).await?;
    Ok(BenchRun {
        machine: machine(),
        cpu,
        runtime,
        dead_letter,
        cost,
        all_in,
    })
}

/// The run as text tables.
pub fn render(run: &BenchRun) -> String {
    format!(
        "{}\n{}\n{}\n{}\n{}",
        bench_cpu::render(&run.cpu),
        bench_runtime::render(&run.runtime),
        bench_deadletter::render(&run.dead_letter),
        bench_cost::render(&run.cost),
        bench_allin::render(&run.all_in)
    )
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

/// The run as `docs/BENCHMARKS.md`.
pub fn markdown(run: &BenchRun) -> String {
    let m = &run.machine;
    let mut out = String::new();
    out.push_str("# Benchmarks\n\n");
    out.push_str(
        "Generated by `make bench` (function binaries built by `scripts/lambda.sh` as `make package` and `sam build` build them: cargo-lambda, the release profile of `Cargo.toml`); rerun it to refresh \
         this file. Every figure is a ratio against a peer or a floor measured in the same \
         run: absolute times on a shared machine are noise. The raw figures are in \
         `target/bench/bench.json`.\n\n",
    );
    out.push_str(&format!(
        "Machine: {} ({} logical CPUs), {:.0} GiB, Linux {}, {}; measured {}.\n\n",
        m.cpu, m.cpus, m.memory_gib, m.kernel, m.rustc, m.date
    ));

    out.push_str("## Per-record CPU: ours against Powertools and the serde_json floor\n\n");
    if let Some(first) = run.cpu.first() {
        out.push_str(&format!(
            "Same event bytes, same per-record work (parse the JSON body into a typed `Order`, \
             SHA-256 of the body, a deterministic 1 % failure), raw event bytes in, response \
             bytes out. Ours is the worker's real invocation path (`WorkerLayer` on the body \
             the runtime received: SIMD decode, batch engine, response through the runtime's \
             handler path); Powertools is `aws-lambda-powertools` {} `BatchProcessor` on \
             Python {}. Both responses are compared byte for byte. *Work alone* is the \
             per-record work in Rust without decode or engine: no handler doing this work can \
             go below that ratio. The floor is `serde_json::from_slice::<SqsEvent>` only; \
             *decoder* is the worker's own decode alone (records borrowing from the bytes). \
             *Traced ÷ untraced* is ours on an event whose every record carries a \
             producer's `AWSTraceHeader`, against the same bytes with the header under a \
             name nothing reads, no tracing subscriber installed: what following a \
             record's trace costs when tracing is off.\n\n",
            first.powertools.powertools_version, first.powertools.python_version
        ));
    }
    out.push_str(
        "| event | ours µs/record | Powertools µs/record | ours ÷ Powertools (goal) | work alone ÷ Powertools | floor µs/record | ours ÷ floor (goal) | decoder ÷ floor | traced ÷ untraced (goal) | same response |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in &run.cpu {
        let (powertools_goal, floor_goal) = bench_cpu::goals(r.body_bytes);
        let floor_verdict = match floor_goal {
            Some(goal) => format!("≤ {goal}: {}", verdict(r.floor_ratio <= goal)),
            None => "—".to_string(),
        };
        out.push_str(&format!(
            "| {} × {} B bodies ({:.1} MB) | {:.2} | {:.2} | {:.3} (≤ {}: {}) | {:.3} | {:.2} | {:.2} ({}) | {:.2} | {:.3} (≤ {}: {}) | {} |\n",
            r.records,
            r.body_bytes,
            r.event_bytes as f64 / 1e6,
            r.ours_us_per_record,
            r.powertools.us_per_record,
            r.powertools_ratio,
            powertools_goal,
            verdict(r.powertools_ratio <= powertools_goal),
            r.work_powertools_ratio,
            r.floor_us_per_record,
            r.floor_ratio,
            floor_verdict,
            r.decoder_floor_ratio,
            r.traced_ratio,
            bench_cpu::TRACED_GOAL,
            verdict(r.traced_ratio <= bench_cpu::TRACED_GOAL),
            if r.responses_identical { "yes" } else { "no" },
        ));
    }

    let rt = &run.runtime;
    out.push_str("\n## Cold start, size, memory\n\n");
    out.push_str(
        "Cold start is process spawn to the binary's first `GET /runtime/invocation/next` on a \
         local Runtime API endpoint, median of the spawns, against a hello-world \
         `lambda_runtime` binary built with the same profile; the two binaries are spawned \
         in turn, so a slow spell on the machine falls on both. Size is the stripped release \
         binary. Peak RSS is the worker's `VmHWM` after a 10,000-record event.\n\n",
    );
    out.push_str("| measure | worker | peer | ratio | goal |\n| --- | --- | --- | --- | --- |\n");
    let worker = rt.cold_starts.iter().find(|c| c.binary == "worker");
    let hello = rt.cold_starts.iter().find(|c| c.binary != "worker");
    if let (Some(w), Some(h)) = (worker, hello) {
        out.push_str(&format!(
            "| cold start (median of {}) | {:.1} ms | {:.1} ms (hello world) | {:.2}× | ≤ 1.5× ({}) |\n",
            w.runs,
            w.median_ms,
            h.median_ms,
            rt.cold_start_ratio,
            verdict(rt.cold_start_ratio <= 1.5)
        ));
        let mb = |b: u64| b as f64 / 1_048_576.0;
        out.push_str(&format!(
            "| stripped size | {:.1} MB | {:.1} MB (hello world) | {:.1}× | ≤ 8 MB ({}) |\n",
            mb(w.size_bytes),
            mb(h.size_bytes),
            w.size_bytes as f64 / h.size_bytes.max(1) as f64,
            verdict(w.size_bytes <= 8 * 1_048_576)
        ));
        if let Some(zip) = w.zip_bytes {
            out.push_str(&format!(
                "| deployable zip (`bootstrap.zip`) | {:.1} MB | — | — | — |\n",
                mb(zip)
            ));
        }
    }
    out.push_str(&format!(
        "| peak RSS, 10,000 records | {:.1} MB | {:.1} MB (the event) | {:.2}× | — |\n",
        rt.peak_rss_bytes as f64 / 1_048_576.0,
        rt.event_bytes as f64 / 1_048_576.0,
        rt.rss_ratio,
    ));
    out.push_str(&format!(
        "| of which the event added (peak − peak after a one-record invocation, {:.1} MB) | {:.1} MB | {:.1} MB (the event) | {:.2}× | ≤ 1.5× ({}) |\n",
        rt.baseline_rss_bytes as f64 / 1_048_576.0,
        rt.peak_rss_bytes.saturating_sub(rt.baseline_rss_bytes) as f64 / 1_048_576.0,
        rt.event_bytes as f64 / 1_048_576.0,
        rt.added_rss_ratio,
        verdict(rt.added_rss_ratio <= 1.5)
    ));

    out.push_str("\n## Concurrency within a batch\n\n");
    out.push_str(
        "100 records, a downstream that takes 20 ms per item, against the ideal \
         `n × 20 ms / c`.\n\n| concurrency | wall ms | ideal ms | wall ÷ ideal |\n| --- | --- | --- | --- |\n",
    );
    for c in &rt.concurrency {
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.2} |\n",
            c.concurrency, c.wall_ms, c.ideal_ms, c.ratio
        ));
    }

    let d = &run.dead_letter;
    out.push_str("\n## Dead-letter overhead\n\n");
    out.push_str(&format!(
        "Against DynamoDB Local (and moto for SQS) through the real SDK clients: {} batches of {} records, \
         all successful against all dead-lettered (validation failures: record, DLQ send; \
         small payloads, so no S3 write).\n\n\
         | measure | value | goal |\n| --- | --- | --- |\n\
         | added latency per dead-lettered item (batch of {}) | {:.2} ms | < 5 ms ({}) |\n\
         | one dead-lettered record in a batch adds | {:.1} ms | — |\n\
         | GetItem round trip on the same emulator (floor of any call) | {:.1} ms | — |\n\
         | plain UpdateItem round trip on the same emulator (floor of any write) | {:.1} ms | — |\n\
         | dead-lettering a batch of {} ÷ one dead-lettered record in a batch | {:.1} | ≤ 3 ({}) |\n\
         | the emulator's own floor: {} conditional UpdateItems {} at a time ÷ one | {:.1} | — |\n\
         | ours ÷ that floor | {:.2} | — |\n\
         | AWS API calls per dead-lettered item | {:.2} | ≤ 1.2 ({}) |\n\n\
         Calls by operation: {}. Mean round trip per call while the batches were \
         dead-lettered (calls overlap): {}.\n",
        d.batches,
        d.batch_size,
        d.batch_size,
        d.added_ms_per_item,
        verdict(d.added_ms_per_item < 5.0),
        d.single_failure_added_ms,
        d.get_item_floor_ms,
        d.update_item_floor_ms,
        d.batch_size,
        batch_over_one(d),
        verdict(batch_over_one(d) <= 3.0),
        d.batch_size,
        d.write_concurrency,
        floor_ratio(d),
        batch_over_one(d) / floor_ratio(d).max(f64::MIN_POSITIVE),
        d.calls_per_item,
        verdict(d.calls_per_item <= 1.2),
        d.calls_by_operation
            .iter()
            .map(|(op, n)| format!("{op} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        d.mean_call_ms_by_operation
            .iter()
            .map(|(op, ms)| format!("{op} {ms:.1} ms"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(&cost_markdown(&run.cost));
    out.push_str(&all_in_markdown(&run.all_in));
    out.push_str(NOTES);
    out
}

fn cost_markdown(c: &CostBench) -> String {
    let mut out = String::from("\n## Cost per million messages, end to end\n\n");
    out.push_str(&format!(
        "One sandbox per contender, fed by the local event source mapping from a queue on the \
         emulator ({} messages per contender and batch size), every record POSTed to a \
         downstream that answers after {} ms. Ours is the `worker` bootstrap, running a whole \
         batch at once (`WORKER_MAX_CONCURRENCY` = the batch size); Powertools is \
         `bench/powertools_worker.py` run by AWS's Python runtime interface client \
         (`awslambdaric`), with `BatchProcessor` (records one after another) and with \
         `AsyncBatchProcessor` (aiohttp, the batch at once). Billed = init (spawn to first \
         poll) + every invocation's duration rounded up to 1 ms; GB-s per million = billed ÷ \
         messages × 10⁶ × memory. *Modelled* adds the sandbox's CPU time stretched to the \
         memory size's share of a vCPU (Lambda gives one vCPU at 1,769 MB): billed + CPU × \
         (1,769 ÷ MB − 1). The *latency floor* is what any worker is billed when each \
         invocation lasts exactly one downstream wait. The `{}` is the harness's own floor: \
         `bare_function`, a `lambda_runtime` binary that POSTs every record of its batch at \
         once and does nothing else, run as the worker is. What it adds to the latency floor \
         is the harness's (the local downstream answering a whole batch on two cores, the \
         Runtime API's hand-over of each event); the worker ÷ it is the worker's own share.\n",
        c.messages,
        c.downstream_latency_ms,
        bench_cost::BARE_FUNCTION
    ));
    for scenario in &c.scenarios {
        out.push_str(&format!(
            "\n### Batches of {}\n\n\
             | contender | init ms | messages/s per sandbox | CPU ms | GB-s per million at 128 MB (measured / modelled) | at 512 MB (measured / modelled) |\n\
             | --- | --- | --- | --- | --- | --- |\n",
            scenario.batch_size
        ));
        for r in &scenario.runs {
            out.push_str(&format!(
                "| {} | {:.0} | {:.0} | {:.0} | {} | {} |\n",
                r.contender,
                r.init_ms,
                r.messages_per_second,
                r.cpu_ms,
                r.gb_seconds_pair(0),
                r.gb_seconds_pair(1)
            ));
        }
        let floor = |i: usize| {
            scenario
                .latency_floor_gb_seconds_per_million
                .get(i)
                .copied()
                .unwrap_or(f64::NAN)
        };
        out.push_str(&format!(
            "| latency floor | — | — | — | {:.1} | {:.1} |\n",
            floor(0),
            floor(1)
        ));
        let met = |v: &[f64]| v.iter().all(|r| *r <= 0.1);
        out.push_str(&format!(
            "\nOurs ÷ the cheaper Powertools, GB-s per million: {} measured ({}); {} modelled \
             ({}). Goal ≤ 0.1. The latency floor ÷ the cheaper Powertools: {}. Ours ÷ the \
             harness's floor ({}): {} (goal ≤ 1.05: {}); that floor ÷ the latency floor: \
             {}.\n",
            bench_cost::ratios(&scenario.ratio),
            verdict(met(&scenario.ratio)),
            bench_cost::ratios(&scenario.modelled_ratio),
            verdict(met(&scenario.modelled_ratio)),
            bench_cost::ratios(&scenario.floor_ratio),
            bench_cost::BARE_FUNCTION,
            bench_cost::ratios(&scenario.harness_floor_ratio),
            verdict(scenario.harness_floor_ratio.iter().all(|r| *r <= 1.05)),
            bench_cost::ratios(&scenario.harness_over_latency_floor),
        ));
    }
    out
}

/// The all-in section: every AWS request and Lambda's GB-seconds, priced, per configuration.
fn all_in_markdown(a: &AllInBench) -> String {
    let p = &a.prices;
    let mut out = String::from("\n## What a million messages cost, all in\n\n");
    out.push_str(&format!(
        "Every request AWS bills, counted from the requests each run made ({} messages per \
         contender and configuration, batches of {}): the producer's sends (one \
         `SendMessageBatch` per ten), the poller's receives and deletes, the function's own \
         SQS, DynamoDB and S3 requests, Lambda's requests, and its GB-seconds at {} MB as \
         measured here. A metered proxy between each process and the emulators counts them \
         as AWS bills them: SQS per 64 KiB chunk, DynamoDB in the read and write units \
         DynamoDB Local reports (every request is sent asking for them). The poller's empty \
         receives are left out: Lambda's pollers make them whatever the traffic. The queue's \
         DLQ takes a message on its {}th receive. Ours is the `worker` bootstrap with its \
         dead-letter store; Powertools is `bench/powertools_worker.py` with \
         `AsyncBatchProcessor`, and for the idempotency row with `BatchProcessor` and \
         `idempotent_function` on DynamoDB (Powertools' idempotency has no asynchronous \
         form). A transient \
         failure fails an item's first three requests (503), and the worker's breaker opens at \
         200 failures a minute (sized for the run's rate, so that the blip does not open it); \
         a permanent one is a 400.\n\n\
         Prices: {}. SQS ${} per million requests; DynamoDB on demand ${} per million read \
         units, ${} per million write units; S3 ${} per thousand PUT and LIST, ${} per \
         thousand GET; Lambda ${} per million requests, ${} per GB-second on arm64, ${} on \
         x86_64; CloudWatch Logs ${} per GB ingested. *Log GB* is what the function wrote to \
         stdout and stderr at its defaults; Lambda's own START, END and REPORT lines, the \
         same for both per invocation, are left out (with failures Powertools makes more \
         invocations, so a little more of its cost is left out).\n",
        a.messages,
        bench_allin::BATCH_SIZE,
        bench_allin::MEMORY_MB,
        bench_allin::MAX_RECEIVE_COUNT,
        p.as_of,
        p.sqs_per_million,
        p.dynamodb_read_per_million,
        p.dynamodb_write_per_million,
        p.s3_write_per_thousand,
        p.s3_read_per_thousand,
        p.lambda_per_million,
        p.lambda_gb_second_arm64,
        p.lambda_gb_second_x86,
        p.logs_per_gb,
    ));
    for configuration in Configuration::ALL {
        out.push_str(&format!(
            "\n### {}\n\nPer million messages.\n\n| {} |\n|{}\n",
            configuration.title(),
            bench_allin::HEADINGS.join(" | "),
            " --- |".repeat(bench_allin::HEADINGS.len())
        ));
        for run in a.runs.iter().filter(|r| r.configuration == configuration) {
            out.push_str(&format!("| {} |\n", bench_allin::row(run).join(" | ")));
        }
        let ratio = a.ratio(configuration);
        let goal = if configuration == Configuration::Idempotency {
            format!(" (goal ≤ 0.5: {})", verdict(ratio <= 0.5))
        } else {
            String::new()
        };
        out.push_str(&format!(
            "\nOurs ÷ Powertools, dollars per million on arm64: {ratio:.3}{goal}.\n"
        ));
    }
    out
}

/// What dead-lettering a whole batch costs against one dead-lettered record, each over
/// an all-success batch.
fn batch_over_one(d: &crate::bench_deadletter::DeadLetterBench) -> f64 {
    let batch = d.dead_letter_batch_ms - d.ok_batch_ms;
    batch / d.single_failure_added_ms.max(f64::MIN_POSITIVE)
}

/// The emulator's own ratio for the same shape of writes.
fn floor_ratio(d: &crate::bench_deadletter::DeadLetterBench) -> f64 {
    d.concurrent_updates_floor_ms / d.one_update_floor_ms.max(f64::MIN_POSITIVE)
}

/// What the tables cannot say: how the worker is built and starts, and how to read the
/// figures. Kept with the generator so the report is whole on every run.
const NOTES: &str = r#"
## How the worker is built and what it does at start-up

- **Release profile.** The function binaries ship with the release profile (see
  `Cargo.toml`), which `sam build` and `make package` use through cargo-lambda: fat LTO, one codegen unit, symbols stripped, the AWS SDK and HTTP/TLS
  crates optimised for size (they wait on the network), everything else for speed. Panics
  unwind, said in the profile (cargo-lambda passes `panic = "abort"` when the profile is
  silent), so that a handler's panic fails its record and any other panic the invocation
  instead of killing the sandbox; the code denies `unwrap`, `expect` and `panic!`.
  `make bench` builds the worker and the hello-world peer with this same profile, through
  the same `scripts/lambda.sh`, and measures those `bootstrap` binaries.
- **Allocator.** mimalloc, without transparent huge pages (`no_thp`). A batch allocates a
  few small strings per record and frees them together; with glibc's allocator that was
  about a third of the decode time. With 2 MB pages, every page the heap touches made
  2 MB resident and was zeroed on first touch: the peak RSS after one record fell from
  16.9 MB to 9.5 MB without them, and the event's own share from 4.3× to 3.2× its size,
  at the same CPU per record.
- **SDK features.** The functions use the SDK crates without their default features:
  one HTTPS client (hyper 1, rustls 0.23 with aws-lc-rs) instead of two, no SigV4a, no SSO
  or credential-process providers (Lambda supplies credentials in the environment). The
  `dlq` CLI adds the providers back for operators' profiles. Logging filters with
  tracing-subscriber's `Targets` rather than `EnvFilter` (no regular-expression engine).
- **Event decode.** The worker does not let the runtime derive `SqsEvent` through
  `serde_json`. `sqs_keeper_lambda::runtime::WorkerLayer` takes the invocation body as the bytes
  the Runtime API sent and decodes them in one pass with `sonic-rs` into records that
  borrow from those bytes (`sqs_keeper_core::event::decode_event`): ids, receipt handles, ARNs
  and every string without JSON escapes are slices of the body; a body with escapes (a
  JSON body always has some) is unescaped once; a record's system attributes are one
  compact value (two allocations) instead of a map of owned strings; the records array is
  sized from the event's length, so it is never grown and copied. Each record becomes a
  `WorkItem` only when it runs. The same decode made owned is checked against
  `serde_json` field for field by unit and property tests.
- **Engine.** Per record, two clock reads (the wall-time deadlines of a record's context
  are read once per batch), no timer when the handler answers at its first poll
  (`retry::finish_by`), one record at a time run in place rather than as a task, each
  report written straight to its place.
- **Runtime.** A current-thread tokio runtime: records overlap on I/O (up to
  `WORKER_MAX_CONCURRENCY` at once), the decode is one pass, and fewer threads start
  faster and hold less memory.
- **At init** the worker reads and validates its configuration (every problem named at
  once), builds the downstream HTTP client — for an `https://` downstream that loads the
  system trust store there and then, so no invocation pays for it; an `http://`
  downstream needs no trust store and skips it — and, when the dead-letter store is
  configured, loads the AWS configuration (region and credentials from the Lambda
  environment, no network) and builds the SQS, DynamoDB and S3 clients once for all
  invocations. The SDK opens its HTTPS connections on the first AWS call, i.e. the first
  dead-letter of the sandbox's life or the first Extended-Client payload fetch; later calls
  reuse them. The cold-start figure above is the worker's configuration of this benchmark
  (`http://` downstream, no store): an `https://` downstream adds the trust-store load to
  it.

## Reading the figures

- *Work alone ÷ Powertools* is the floor of *ours ÷ Powertools*: the per-record work
  itself (SHA-256 of the body and a typed parse, in Rust) measured without decode or
  engine. On 5 KB bodies SHA-256 alone costs about what Python's `hashlib` (OpenSSL, the
  same SHA extensions) costs; on 400 B bodies the work is small and decode plus engine
  set the ratio. Powertools' own figure moves from run to run by up to half (Python on a
  shared machine), and the ratio with it.
- *Ours ÷ floor* compares the whole invocation (decode, engine, per-record work,
  response) with only the `serde_json` decode. When the per-record work itself costs more
  than the decode (5 KB bodies: SHA-256 of 5 KB), no handler that does the work can reach
  1.0; the goal is set for 400 B bodies.
- *Decoder ÷ floor* is the worker's own decode alone (`decode_event`: records borrowing
  from the body) against `serde_json` into owned `SqsEvent`s on the same bytes.
- Peak RSS holds the process itself (runtime, allocator: the peak after a one-record
  invocation, reported beside it) and what the large event adds: `lambda_runtime` reads
  the body as the chunks hyper delivers and copies them into one buffer, so the event is
  in memory twice for a moment before the worker sees it; the worker then keeps that
  buffer for the batch (its records borrow from it) beside each record's entry (about
  300 bytes), its attributes (one string), its unescaped body, and its report. The event's
  share cannot fall below about 2× its size without reading the body into one buffer
  sized by its Content-Length, which `lambda_runtime` does not do.
- *Cost per million messages* is mostly waiting: every invocation waits at least one
  downstream answer (20 ms) whoever runs it, so the *latency floor* row is what any worker
  is billed in that configuration, and *the latency floor ÷ the cheaper Powertools* is the
  lowest ratio any worker can reach there. Only CPU sets the rest: the *modelled* columns
  give it the weight it has at 128 MB and 512 MB. The CPU column is read from
  `/proc/<pid>/stat` in the kernel's 10 ms ticks, so it is ±10 ms; init is included (one
  cold start per contender and batch size).
- The four Rust CPU measures take turns within each iteration (medians reported), so a
  slow spell on a shared machine slows all of them alike instead of skewing one ratio.
- Dead-letter latency is bounded by the emulators' latency (DynamoDB Local for the
  records, moto for the DLQ send); the calls per item are what AWS would see: one conditional `UpdateItem` per record, one `SendMessageBatch` per
  ten, a `PutObject` only for payloads above `DLQ_INLINE_MAX_BYTES`.
- *All in*, the requests are most of the bill. Both contenders make the same SQS requests
  for the same work: one send, one receive and one delete per ten messages, $0.12 a
  million. Per-record idempotency is two writes a record for both, a claim before the
  work and its completion after, one write unit each: $1.25 a million. Two writes are the
  least for a claim that tells a completed item from an abandoned one. A claim alone (one
  write) cannot: a message redelivered after its work completed, its delete lost, and one
  redelivered after its sandbox died look the same to it, so the first would run twice.
  With the same write units a record as Powertools, ours cannot cost half of Powertools'
  with idempotency on. The worker's share of the rest is its GB-seconds and its logs.
- *Logs* are priced as CloudWatch Logs ingests them. By default the worker writes a line
  per failed record, one per batch (`batch finished`, with its counts) and one EMF document
  per batch, its metrics: about 120 bytes a message at ten records a batch, most of it the
  EMF document. Powertools, as
  benchmarked, writes none: its Logger and Metrics are not used. A line for every record
  done (`WORKER_LOG_RECORDS=all`) adds about 300 bytes a message, some $0.15 a million,
  more than the SQS requests.
- With transient failures the worker costs more than Powertools. It retries a failed
  record within the invocation (three attempts, with backoff), and the invocation is
  billed for that wait. It then spaces the record's redelivery
  (`ChangeMessageVisibilityBatch`) and writes to the breaker's table once per invocation
  that failed records. Powertools fails the record at once and SQS redelivers it, at a
  receive each time. With permanent failures the worker writes the failure's record (its
  history, the error, the payload) and sends its DLQ message at the first failure.
  Powertools receives the record five times, and SQS moves it to the DLQ with no history.
  That record is what the worker's extra cost buys.
- The end-to-end tests hold the requests to these counts
  (`faults::idempotency_costs_two_one_unit_writes_a_record_and_no_read` and the two after
  it).
"#;

/// Writes the JSON figures and the markdown report.
pub fn write(run: &BenchRun, json: &Path, markdown_path: &Path) -> Result<(), String> {
    for path in [json, markdown_path] {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
    }
    let figures = serde_json::to_string_pretty(run).map_err(|e| e.to_string())?;
    std::fs::write(json, figures).map_err(|e| format!("cannot write {}: {e}", json.display()))?;
    let kept = std::fs::read_to_string(markdown_path)
        .map(|existing| sections_measured_apart(&existing))
        .unwrap_or_default();
    std::fs::write(markdown_path, markdown(run) + &kept)
        .map_err(|e| format!("cannot write {}: {e}", markdown_path.display()))
}

/// The sections of `existing` measured by another command (`make bench-store`): each
/// says "Not written by `make bench`" and is kept, whole and in order, when the run
/// rewrites the file.
fn sections_measured_apart(existing: &str) -> String {
    let mut sections: Vec<String> = Vec::new();
    for line in existing.split_inclusive('\n') {
        match sections.last_mut() {
            Some(section) if !line.starts_with("## ") => section.push_str(line),
            _ => sections.push(line.to_string()),
        }
    }
    sections
        .into_iter()
        .filter(|s| s.starts_with("## ") && s.contains("Not written by `make bench`"))
        .map(|s| format!("\n{}", s.trim_end_matches('\n').to_string() + "\n"))
        .collect()
}

#[cfg(test)]
mod kept_tests {
    use super::sections_measured_apart;

    #[test]
    fn only_the_sections_measured_apart_are_kept() {
        let existing = "# Benchmarks\n\n## Worker\n\nfigures\n\n## At scale\n\nNot written by `make bench`: by hand.\n\n| a |\n\n## Other\n\nmore\n";
        assert_eq!(
            sections_measured_apart(existing),
            "\n## At scale\n\nNot written by `make bench`: by hand.\n\n| a |\n"
        );
        assert_eq!(sections_measured_apart("# Benchmarks\n"), "");
    }
}
