//! The `make demo` run: the whole pipeline on one machine against the emulator.
//!
//! It creates the resources, starts the deterministic downstream and the compiled worker
//! behind a local Runtime API, sends a mixed workload, drives the worker through the local
//! event source mapping until the source queue is empty, and summarises what happened from
//! three independent sources that must agree: the worker's own EMF metric lines, the
//! dead-letter table, and the queues.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use serde_json::json;
use sqs_keeper_aws::{AwsClients, Endpoints};

use crate::downstream::{Downstream, DownstreamConfig};
use crate::esm::{queue_depth, EsmStats, EventSourceMapping};
use crate::function::FunctionProcess;
use crate::invokers::RuntimeApiInvoker;
use crate::resources::{PipelineResources, ResourceSpec};
use crate::runtime_api::RuntimeApi;

/// Where and how to run the demo.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The emulators' endpoints.
    pub endpoints: Endpoints,
    /// Region name used with the emulator.
    pub region: String,
    /// Resource name prefix.
    pub prefix: String,
    /// The compiled worker binary.
    pub worker_binary: PathBuf,
    /// Where the worker log and the environment file are written.
    pub state_dir: PathBuf,
    /// Items in the workload.
    pub items: usize,
}

/// One item of the workload: its scenario and body.
#[derive(Debug, Clone)]
pub struct WorkloadItem {
    /// The downstream scenario (or `malformed`).
    pub scenario: &'static str,
    /// The message body.
    pub body: String,
}

/// Scenario mix per 100 items: mostly fine, every failure kind present.
const MIX: &[(&str, usize)] = &[
    ("ok", 74),
    ("duplicate", 5),
    ("flaky", 8),
    ("throttled", 3),
    ("invalid", 4),
    ("forbidden", 1),
    ("slow", 1),
    ("malformed", 2),
    ("large-invalid", 1),
    ("large-ok", 1),
];

/// A deterministic workload of `n` items following `MIX`.
pub fn workload(n: usize) -> Vec<WorkloadItem> {
    let pattern: Vec<&'static str> = MIX
        .iter()
        .flat_map(|(scenario, count)| std::iter::repeat_n(*scenario, *count))
        .collect();
    (0..n)
        .map(|i| {
            // Spread scenarios through the run instead of sending them in blocks.
            let scenario = pattern[(i * 37) % pattern.len()];
            let id = format!("order-{:05}", i + 1);
            let body = match scenario {
                "malformed" => format!("{{\"id\": \"{id}\", \"amount\": "),
                "large-invalid" | "large-ok" => {
                    let downstream = if scenario == "large-ok" {
                        "ok"
                    } else {
                        "invalid"
                    };
                    json!({"id": id, "scenario": downstream, "attachment": "x".repeat(120_000)})
                        .to_string()
                }
                _ => json!({"id": id, "scenario": scenario, "amount": (i % 90) + 10}).to_string(),
            };
            WorkloadItem { scenario, body }
        })
        .collect()
}

/// Sends bodies in batches of at most 10 entries and well under 1 MiB.
pub async fn send_bodies(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    bodies: &[String],
) -> Result<(), String> {
    let mut batch: Vec<SendMessageBatchRequestEntry> = Vec::new();
    let mut bytes = 0;
    for (i, body) in bodies.iter().enumerate() {
        if !batch.is_empty() && (batch.len() == 10 || bytes + body.len() > 900_000) {
            send_batch(sqs, queue_url, std::mem::take(&mut batch)).await?;
            bytes = 0;
        }
        bytes += body.len();
        batch.push(
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    if !batch.is_empty() {
        send_batch(sqs, queue_url, batch).await?;
    }
    Ok(())
}

async fn send_batch(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    entries: Vec<SendMessageBatchRequestEntry>,
) -> Result<(), String> {
    let output = sqs
        .send_message_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|e| format!("send: {}", sqs_keeper_lambda::ProcessError::from_sdk(&e)))?;
    match output.failed().first() {
        Some(failed) => Err(format!(
            "send: entry {} rejected: {}",
            failed.id(),
            failed.code()
        )),
        None => Ok(()),
    }
}

/// What the demo saw.
#[derive(Debug, Clone, Default)]
pub struct DemoSummary {
    /// Messages sent.
    pub sent: u64,
    /// Processed (from the worker's metrics).
    pub done: u64,
    /// Skipped (from the worker's metrics).
    pub skipped: u64,
    /// Deliveries returned for retry (reported failures, from the worker's metrics).
    pub retried: u64,
    /// Dead-lettered (from the worker's metrics).
    pub dead_lettered: u64,
    /// Records in the table.
    pub records: u64,
    /// Records by error class.
    pub records_by_class: BTreeMap<String, u64>,
    /// Payload objects in S3.
    pub in_s3: u64,
    /// Messages on the DLQ.
    pub dlq_depth: u64,
    /// Messages left in the source queue.
    pub source_depth: u64,
    /// Local event source mapping totals.
    pub esm: EsmStats,
    /// Seconds the pipeline took to drain.
    pub seconds: f64,
}

impl DemoSummary {
    /// Whether every message is accounted for exactly once, and the three sources agree.
    pub fn adds_up(&self) -> bool {
        self.done + self.skipped + self.dead_lettered == self.sent
            && self.source_depth == 0
            && self.records == self.dead_lettered
            && self.dlq_depth == self.dead_lettered
    }

    /// A readable report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut line =
            |label: &str, value: String| out.push_str(&format!("  {label:<28} {value}\n"));
        line("sent", self.sent.to_string());
        line("done", self.done.to_string());
        line("skipped (already processed)", self.skipped.to_string());
        line("dead-lettered", self.dead_lettered.to_string());
        for (class, n) in &self.records_by_class {
            line(&format!("  of class {class}"), n.to_string());
        }
        line("  with payload in S3", self.in_s3.to_string());
        line("deliveries retried", self.retried.to_string());
        line("DLQ depth", self.dlq_depth.to_string());
        line("left in source queue", self.source_depth.to_string());
        line(
            "invocations",
            format!(
                "{} ({} messages received, {:.1} s, {:.0} msg/s)",
                self.esm.invocations,
                self.esm.received,
                self.seconds,
                self.esm.received as f64 / self.seconds.max(0.001)
            ),
        );
        line(
            "adds up",
            if self.adds_up() {
                format!(
                    "yes: {} done + {} skipped + {} dead-lettered = {} sent; {} records = {} DLQ messages",
                    self.done, self.skipped, self.dead_lettered, self.sent, self.records, self.dlq_depth
                )
            } else {
                "NO: some message is unaccounted for".to_string()
            },
        );
        out
    }
}

/// Sums the worker's EMF lines in its log.
pub fn sum_metrics(log: &str) -> BTreeMap<String, u64> {
    let mut totals = BTreeMap::new();
    for line in log.lines() {
        let Ok(doc) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if doc.get("_aws").is_none() || doc.get("Records").is_none() {
            continue;
        }
        for name in [
            "Records",
            "Done",
            "Skipped",
            "DeadLettered",
            "ReportedFailures",
        ] {
            *totals.entry(name.to_string()).or_default() += doc[name].as_u64().unwrap_or(0);
        }
    }
    totals
}

/// Counts records in the table by the value of one string attribute (a consistent scan).
pub async fn count_by(
    clients: &AwsClients,
    table: &str,
    attribute: &str,
) -> Result<BTreeMap<String, u64>, String> {
    let mut counts = BTreeMap::new();
    let mut start = None;
    loop {
        let page = clients
            .dynamodb
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| format!("scan: {}", sqs_keeper_lambda::ProcessError::from_sdk(&e)))?;
        for item in page.items() {
            let value = item
                .get(attribute)
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_else(|| "?".to_string());
            *counts.entry(value).or_default() += 1;
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            return Ok(counts);
        }
    }
}

/// Counts objects in a bucket.
pub async fn object_count(clients: &AwsClients, bucket: &str) -> Result<u64, String> {
    let mut count = 0;
    let mut token = None;
    loop {
        let page = clients
            .s3
            .list_objects_v2()
            .bucket(bucket)
            .set_continuation_token(token)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "list objects: {}",
                    sqs_keeper_lambda::ProcessError::from_sdk(&e)
                )
            })?;
        count += page.contents().len() as u64;
        token = page.next_continuation_token().map(str::to_string);
        if token.is_none() {
            return Ok(count);
        }
    }
}

/// The environment that points the worker (and operator tools) at the emulators.
pub fn emulator_env(endpoints: &Endpoints, region: &str) -> Vec<(String, String)> {
    let fixed = [
        ("AWS_REGION", region),
        // The AWS CLI reads this one, not AWS_REGION.
        ("AWS_DEFAULT_REGION", region),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        // Set, so that neither the shell nor a profile in ~/.aws/config turns the endpoints
        // above off (or to FIPS or dual-stack ones, which have no custom endpoint).
        ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "false"),
        ("AWS_USE_FIPS_ENDPOINT", "false"),
        ("AWS_USE_DUALSTACK_ENDPOINT", "false"),
    ]
    .map(|(k, v)| (k, v.to_string()));
    endpoints
        .env()
        .into_iter()
        .chain(fixed)
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn write_env_file(path: &Path, env: &[(String, String)]) -> Result<(), String> {
    let text: String = env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Runs the `dlq` binary with the demo's environment, printing the command and its output.
fn dlq(
    options: &DemoOptions,
    env: &[(String, String)],
    args: &[&str],
    echo: bool,
) -> Result<String, String> {
    let binary = options
        .worker_binary
        .parent()
        .map(|d| d.join("dlq"))
        .ok_or("cannot locate the dlq binary")?;
    println!("\n$ dlq {}", args.join(" "));
    let output = std::process::Command::new(&binary)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    if echo {
        print!("{stdout}");
    }
    if !output.status.success() {
        return Err(format!(
            "dlq {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(stdout)
}

/// What the operator part of the demo did.
#[derive(Debug, Clone, Default)]
pub struct RedriveSummary {
    /// Dead records before the redrive.
    pub dead_before: u64,
    /// Dead records after it.
    pub dead_after: u64,
    /// Resolved records after it.
    pub resolved_after: u64,
    /// DLQ depth after it.
    pub dlq_after: u64,
}

/// The operator's part: look at the damage, fix the downstream, redrive, look again.
pub async fn operate(
    options: &DemoOptions,
    downstream: &Downstream,
    resources: &PipelineResources,
    clients: &AwsClients,
) -> Result<RedriveSummary, String> {
    let mut env = emulator_env(&options.endpoints, &options.region);
    env.extend(resources.store_env());
    env.push((
        "WORKER_ITEM_ID_SOURCE".to_string(),
        "pointer:/id".to_string(),
    ));
    let count = |by_status: &BTreeMap<String, u64>, s: &str| by_status.get(s).copied().unwrap_or(0);
    let before = count_by(clients, &resources.table, sqs_keeper_aws::schema::STATUS).await?;
    dlq(options, &env, &["stats"], true)?;
    dlq(options, &env, &["analyze"], true)?;
    println!("\n# the downstream is fixed; redrive what is eligible (dry run first)");
    downstream.fix();
    env.push(("WORKER_DOWNSTREAM_URL".to_string(), downstream.url()));
    let dry = dlq(options, &env, &["redrive", "--dry-run"], false)?;
    // The per-item table is long; show its summary lines.
    for line in dry
        .lines()
        .rev()
        .take(2)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        println!("{line}");
    }
    let report = dlq(options, &env, &["redrive", "--json"], false)?;
    let report: serde_json::Value =
        serde_json::from_str(&report).map_err(|e| format!("redrive report: {e}"))?;
    println!(
        "{} selected: {} resolved, {} failed again, {} skipped (ineligible), {} DLQ messages deleted",
        report["selected"], report["succeeded"], report["failed_again"], report["skipped_ineligible"], report["dlq_messages_deleted"]
    );
    dlq(options, &env, &["stats"], true)?;
    let after = count_by(clients, &resources.table, sqs_keeper_aws::schema::STATUS).await?;
    Ok(RedriveSummary {
        dead_before: count(&before, "dead"),
        dead_after: count(&after, "dead"),
        resolved_after: count(&after, "resolved"),
        dlq_after: queue_depth(&clients.sqs, &resources.dlq_url).await?,
    })
}

/// Runs the demo and returns its summary.
pub async fn run(options: &DemoOptions) -> Result<(DemoSummary, RedriveSummary), String> {
    let clients = AwsClients::for_endpoints(&options.endpoints, &options.region).await;
    let spec = ResourceSpec {
        prefix: options.prefix.clone(),
        fifo: false,
        max_receive_count: 3,
        // Short, so retried messages come back quickly; the worker's invocation timeout
        // below stays well inside it so no message is redelivered while in flight.
        visibility_timeout_secs: 6,
    };
    PipelineResources::delete_existing(&clients, &spec).await;
    let resources = PipelineResources::create(&clients, &spec).await?;
    println!(
        "resources: queue {}, DLQ {}, table {}, bucket {}",
        resources.source_url, resources.dlq_url, resources.table, resources.bucket
    );

    let downstream = Downstream::start(
        0,
        DownstreamConfig {
            flaky_failures: 2,
            slow_delay: Duration::from_secs(2),
        },
    )
    .await
    .map_err(|e| format!("cannot start the downstream: {e}"))?;
    let api = RuntimeApi::start(&format!(
        "arn:aws:lambda:{}:000000000000:function:worker",
        options.region
    ))
    .await
    .map_err(|e| format!("cannot start the runtime API: {e}"))?;
    let mut env = emulator_env(&options.endpoints, &options.region);
    env.extend(resources.store_env());
    write_env_file(
        &options.state_dir.join("demo.env"),
        &[
            env.clone(),
            vec![("SOURCE_QUEUE_URL".to_string(), resources.source_url.clone())],
        ]
        .concat(),
    )?;
    env.extend(
        [
            ("WORKER_DOWNSTREAM_URL", downstream.url().as_str()),
            ("WORKER_DOWNSTREAM_TIMEOUT_MS", "300"),
            ("WORKER_ITEM_ID_SOURCE", "pointer:/id"),
            ("WORKER_RETRY_BASE_DELAY_MS", "20"),
            ("WORKER_RETRY_MAX_DELAY_MS", "200"),
            ("WORKER_DEADLINE_MARGIN_MS", "500"),
            ("RUST_LOG", "info"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let log_path = options.state_dir.join("worker.log");
    let _ = std::fs::remove_file(&log_path);
    let _process = FunctionProcess::spawn(
        &options.worker_binary,
        "worker",
        &api.address(),
        &env,
        Some(&log_path),
    )
    .map_err(|e| format!("cannot start {}: {e}", options.worker_binary.display()))?;

    let items = workload(options.items);
    let bodies: Vec<String> = items.iter().map(|i| i.body.clone()).collect();
    send_bodies(&clients.sqs, &resources.source_url, &bodies).await?;
    println!(
        "sent {} messages; running the worker until the queue is empty...",
        bodies.len()
    );

    let esm = EventSourceMapping::new(
        clients.sqs.clone(),
        &resources.source_url,
        &resources.source_arn,
        &options.region,
        10,
    );
    let invoker = RuntimeApiInvoker {
        api,
        timeout: Duration::from_secs(4),
    };
    let started = tokio::time::Instant::now();
    let (stats, drained) = esm
        .run_until_drained(&invoker, Duration::from_secs(600))
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    if !drained {
        return Err("the source queue did not drain within 10 minutes".to_string());
    }
    // Let the worker flush its last log lines.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let metrics = sum_metrics(&log);
    let records_by_class = count_by(&clients, &resources.table, "error_class").await?;
    let summary = DemoSummary {
        sent: bodies.len() as u64,
        done: metrics.get("Done").copied().unwrap_or(0),
        skipped: metrics.get("Skipped").copied().unwrap_or(0),
        retried: metrics.get("ReportedFailures").copied().unwrap_or(0),
        dead_lettered: metrics.get("DeadLettered").copied().unwrap_or(0),
        records: records_by_class.values().sum(),
        records_by_class,
        in_s3: object_count(&clients, &resources.bucket).await?,
        dlq_depth: queue_depth(&clients.sqs, &resources.dlq_url).await?,
        source_depth: queue_depth(&clients.sqs, &resources.source_url).await?,
        esm: stats,
        seconds,
    };
    println!("\nsummary\n{}", summary.render());
    let redrive = operate(options, &downstream, &resources, &clients).await?;
    Ok((summary, redrive))
}
