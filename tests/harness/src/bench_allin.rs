//! `keeper bench` (all-in part): what a million messages cost all in, for the worker and
//! for Powertools for AWS Lambda (Python) doing the same work, in four configurations.
//!
//! All in means every request AWS bills: the producer's sends, the poller's receives and
//! deletes, the function's own SQS, DynamoDB and S3 requests, Lambda's requests and its
//! GB-seconds. The requests are counted, not estimated: each run's function reaches AWS
//! through one metered proxy and its poller through another ([`crate::fault_proxy::Meter`]:
//! SQS by 64 KiB chunk, DynamoDB units as DynamoDB Local reports them).
//!
//! Each run is one sandbox fed by the local event source mapping in batches of 10, from a
//! queue whose DLQ takes a message after 5 receives, every record POSTed to a downstream
//! that answers after 20 ms. The four configurations:
//!
//! - *plain*: every record succeeds; the worker has its dead-letter store, unused;
//! - *idempotency*: the same with per-record idempotency (the worker's table; Powertools'
//!   `idempotent_function` on DynamoDB, keyed by the message id, on `BatchProcessor`:
//!   Powertools' idempotency has no asynchronous form);
//! - *transient*: 5 % of the records fail their first three requests (503), with the
//!   worker's spaced retries and breaker on (Powertools has neither: a failed record comes
//!   back after the visibility timeout). The breaker opens at 200 failures a minute, so
//!   that the blip does not open it: sized for the run's rate, as a fleet's would be;
//! - *dead letters*: 1 % of the records are refused for good (400). The worker
//!   dead-letters each at once (record, DLQ message); Powertools fails it until SQS moves
//!   it to the DLQ on its fifth receive.
//!
//! Powertools runs `AsyncBatchProcessor` (the batch at once, as the worker runs it) but
//! with idempotency. The poller's empty receives are left out: Lambda's pollers make them
//! whatever the traffic, and the local poller makes more while it waits for a redelivery.
//! So is the harness's own check that the queue is empty (`GetQueueAttributes`). So is the
//! sandbox's one cold start: a fleet's start-ups are spread over far more messages than a
//! run's thousand.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use sqs_keeper_aws::{AwsClients, Endpoints};

use crate::downstream::{Downstream, DownstreamConfig};
use crate::esm::EventSourceMapping;
use crate::fault_proxy::{Bill, FaultProxy};
use crate::function::FunctionProcess;
use crate::invokers::RuntimeApiInvoker;
use crate::resources::{PipelineResources, ResourceSpec};
use crate::runtime_api::RuntimeApi;

/// The memory both contenders are billed at, MB.
pub const MEMORY_MB: u32 = 128;

/// Records per invocation.
pub const BATCH_SIZE: i32 = 10;

/// Receives before SQS moves a message to the DLQ (the template's default).
pub const MAX_RECEIVE_COUNT: u32 = 5;

/// The prices a run is costed at, in US dollars.
#[derive(Debug, Clone, Serialize)]
pub struct Prices {
    /// Where and when the prices were read.
    pub as_of: &'static str,
    /// Per million SQS requests (standard queue, 64 KiB chunks).
    pub sqs_per_million: f64,
    /// Per million DynamoDB read request units (on demand).
    pub dynamodb_read_per_million: f64,
    /// Per million DynamoDB write request units (on demand).
    pub dynamodb_write_per_million: f64,
    /// Per thousand S3 PUT, COPY, POST and LIST requests.
    pub s3_write_per_thousand: f64,
    /// Per thousand S3 GET and other requests.
    pub s3_read_per_thousand: f64,
    /// Per million Lambda requests.
    pub lambda_per_million: f64,
    /// Per GB-second of Lambda duration on arm64.
    pub lambda_gb_second_arm64: f64,
    /// Per GB-second of Lambda duration on x86_64.
    pub lambda_gb_second_x86: f64,
    /// Per GB of logs CloudWatch Logs ingests from a function (standard class).
    pub logs_per_gb: f64,
}

/// us-east-1 list prices past the free tiers. The run does not fetch them.
pub const PRICES: Prices = Prices {
    as_of: "us-east-1 list prices past the free tiers, as published in November 2026",
    sqs_per_million: 0.40,
    dynamodb_read_per_million: 0.125,
    dynamodb_write_per_million: 0.625,
    s3_write_per_thousand: 0.005,
    s3_read_per_thousand: 0.0004,
    lambda_per_million: 0.20,
    lambda_gb_second_arm64: 0.000_013_333_4,
    lambda_gb_second_x86: 0.000_016_666_7,
    logs_per_gb: 0.50,
};

/// One of the four workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Configuration {
    /// Every record succeeds.
    Plain,
    /// Every record succeeds, through per-record idempotency.
    Idempotency,
    /// 5 % of the records fail three requests first; spaced retries and the breaker on.
    Transient,
    /// 1 % of the records are refused for good.
    DeadLetters,
}

impl Configuration {
    /// Every configuration, in the order of the tables.
    pub const ALL: [Configuration; 4] = [
        Configuration::Plain,
        Configuration::Idempotency,
        Configuration::Transient,
        Configuration::DeadLetters,
    ];

    /// The configuration's name in the tables.
    pub fn title(self) -> &'static str {
        match self {
            Configuration::Plain => "plain",
            Configuration::Idempotency => "per-record idempotency",
            Configuration::Transient => "5 % transient failures, spaced retries and the breaker on",
            Configuration::DeadLetters => "1 % permanent failures, dead-lettered",
        }
    }

    /// The downstream's scenario for message `i` (see [`crate::downstream`]).
    fn scenario(self, i: usize) -> &'static str {
        match self {
            Configuration::Transient if i % 20 == 7 => "flaky",
            Configuration::DeadLetters if i % 100 == 7 => "invalid",
            _ => "slow",
        }
    }

    /// How many of `messages` end in the DLQ.
    fn dead_letters(self, messages: usize) -> usize {
        (0..messages)
            .filter(|i| self.scenario(*i) == "invalid")
            .count()
    }

    /// The Python handler of `bench/powertools_worker.py` doing this work: the batch at
    /// once, but with idempotency, which Powertools runs one record after another.
    fn powertools_handler(self) -> &'static str {
        match self {
            Configuration::Idempotency => "idempotent",
            _ => "async",
        }
    }

    /// The Powertools processor that handler runs, as the tables name it.
    fn powertools_processor(self) -> &'static str {
        match self {
            Configuration::Idempotency => "BatchProcessor, idempotent_function",
            _ => "AsyncBatchProcessor",
        }
    }
}

/// The queue's visibility timeout: short, so that a failed record comes back soon.
const VISIBILITY_TIMEOUT_SECS: u32 = 2;

/// Who runs the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Contender {
    /// The `worker` bootstrap.
    Worker,
    /// `bench/powertools_worker.py` with `BatchProcessor`.
    Powertools,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Worker => "worker",
            Contender::Powertools => "powertools",
        }
    }
}

/// What one contender's run of one configuration cost, per million messages.
#[derive(Debug, Clone, Serialize)]
pub struct AllInRun {
    /// The workload.
    pub configuration: Configuration,
    /// Who ran it.
    pub contender: Contender,
    /// Messages sent.
    pub messages: u64,
    /// Lambda invocations.
    pub invocations: u64,
    /// Every invocation's duration rounded up to 1 ms, ms (the cold start left out).
    pub billed_ms: f64,
    /// The Powertools processor that ran (empty for the worker).
    pub processor: &'static str,
    /// The function's own requests, as billed.
    pub function: Bill,
    /// The poller's requests, as billed, its empty receives and the harness's checks left out.
    pub poller_sqs_requests: u64,
    /// The producer's billed sends.
    pub producer_sqs_requests: u64,
    /// Bytes the function wrote to stdout and stderr: what CloudWatch Logs ingests from it
    /// (Lambda's own START, END and REPORT lines left out).
    pub log_bytes: u64,
    /// The cost per million messages.
    pub cost: Cost,
}

/// Per million messages: requests and units, and their price.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cost {
    /// SQS requests: producer, poller and function.
    pub sqs_requests: f64,
    /// DynamoDB read request units.
    pub dynamodb_read_units: f64,
    /// DynamoDB write request units.
    pub dynamodb_write_units: f64,
    /// S3 requests.
    pub s3_requests: f64,
    /// Lambda requests.
    pub lambda_requests: f64,
    /// GB-seconds at [`MEMORY_MB`].
    pub gb_seconds: f64,
    /// GB of the function's logs ingested by CloudWatch Logs.
    pub log_gb: f64,
    /// Dollars, with the function on arm64.
    pub dollars_arm64: f64,
    /// Dollars, with the function on x86_64.
    pub dollars_x86: f64,
    /// Of those, what the AWS requests cost (SQS, DynamoDB, S3, Lambda's requests).
    pub dollars_requests: f64,
    /// Of those, what the function's logs cost.
    pub dollars_logs: f64,
}

impl Cost {
    /// Prices `run`'s counts over `messages` messages.
    fn of(messages: u64, function: &Bill, sandbox: &Metered) -> Cost {
        let per_million = 1e6 / messages.max(1) as f64;
        let p = &PRICES;
        let sqs = (function.sqs_requests + sandbox.poller_sqs + sandbox.producer_sqs) as f64
            * per_million;
        let reads = function.dynamodb_read_units * per_million;
        let writes = function.dynamodb_write_units * per_million;
        let s3_writes = function.s3_write_requests as f64 * per_million;
        let s3_reads = function.s3_read_requests as f64 * per_million;
        let lambda_requests = sandbox.invocations as f64 * per_million;
        let gb_seconds = sandbox.billed_ms / 1000.0 * per_million * f64::from(MEMORY_MB) / 1024.0;
        let log_gb = sandbox.log_bytes as f64 * per_million / 1e9;
        let dollars_logs = log_gb * p.logs_per_gb;
        let dollars_requests = sqs / 1e6 * p.sqs_per_million
            + reads / 1e6 * p.dynamodb_read_per_million
            + writes / 1e6 * p.dynamodb_write_per_million
            + s3_writes / 1e3 * p.s3_write_per_thousand
            + s3_reads / 1e3 * p.s3_read_per_thousand
            + lambda_requests / 1e6 * p.lambda_per_million;
        Cost {
            sqs_requests: sqs,
            dynamodb_read_units: reads,
            dynamodb_write_units: writes,
            s3_requests: s3_writes + s3_reads,
            lambda_requests,
            gb_seconds,
            log_gb,
            dollars_arm64: dollars_requests + dollars_logs + gb_seconds * p.lambda_gb_second_arm64,
            dollars_x86: dollars_requests + dollars_logs + gb_seconds * p.lambda_gb_second_x86,
            dollars_requests,
            dollars_logs,
        }
    }
}

/// The whole all-in comparison.
#[derive(Debug, Clone, Serialize)]
pub struct AllInBench {
    /// Messages per run.
    pub messages: usize,
    /// The prices used.
    pub prices: Prices,
    /// Every run, by configuration then contender.
    pub runs: Vec<AllInRun>,
}

impl AllInBench {
    /// Ours ÷ Powertools, dollars per million on arm64, for `configuration`.
    pub fn ratio(&self, configuration: Configuration) -> f64 {
        let cost = |contender| {
            self.runs
                .iter()
                .find(|r| r.configuration == configuration && r.contender == contender)
                .map_or(f64::NAN, |r| r.cost.dollars_arm64)
        };
        cost(Contender::Worker) / cost(Contender::Powertools)
    }
}

/// The tables a run's function needs beside the pipeline's: idempotency and breaker.
struct Tables {
    idempotency: String,
    breaker: String,
}

/// Runs every configuration with both contenders, `messages` messages each.
pub async fn run(
    endpoints: &Endpoints,
    bin_dir: &Path,
    messages: usize,
) -> Result<AllInBench, String> {
    let downstream = Downstream::start(
        0,
        DownstreamConfig {
            flaky_failures: 3,
            slow_delay: crate::bench_cost::DOWNSTREAM_LATENCY,
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let worker = crate::bench_runtime::function_binary(bin_dir, "worker");
    let tag = chrono::Utc::now().format("%H%M%S").to_string();
    let mut runs = Vec::new();
    for configuration in Configuration::ALL {
        for contender in [Contender::Worker, Contender::Powertools] {
            eprintln!("  {} on {} ...", contender.name(), configuration.title());
            let setup = RunSetup {
                endpoints,
                worker: &worker,
                downstream: &downstream.url(),
                messages,
                tag: format!("{tag}-{}", runs.len()),
            };
            runs.push(setup.run(configuration, contender).await?);
        }
    }
    Ok(AllInBench {
        messages,
        prices: PRICES,
        runs,
    })
}

/// What every run shares.
struct RunSetup<'a> {
    endpoints: &'a Endpoints,
    worker: &'a PathBuf,
    downstream: &'a str,
    messages: usize,
    tag: String,
}

impl RunSetup<'_> {
    async fn run(
        &self,
        configuration: Configuration,
        contender: Contender,
    ) -> Result<AllInRun, String> {
        let clients = AwsClients::for_endpoints(self.endpoints, "us-east-1").await;
        let prefix = format!("allin-{}-{}", contender.name(), self.tag);
        let pipeline = PipelineResources::create(
            &clients,
            &ResourceSpec {
                prefix: prefix.clone(),
                fifo: false,
                max_receive_count: MAX_RECEIVE_COUNT,
                visibility_timeout_secs: VISIBILITY_TIMEOUT_SECS,
            },
        )
        .await?;
        let tables = Tables {
            idempotency: crate::outage::breaker_table(&clients, &format!("{prefix}-idem")).await?,
            breaker: crate::outage::breaker_table(&clients, &format!("{prefix}-breaker")).await?,
        };
        let poller_proxy = metered(self.endpoints).await?;
        let function_proxy = metered(self.endpoints).await?;
        let producer_sqs = self.fill(&poller_proxy, configuration, &pipeline).await?;
        poller_proxy.reset_bill();
        let env = self.environment(
            configuration,
            contender,
            &pipeline,
            &tables,
            &function_proxy,
        );
        let outcome = self
            .process(
                self.command(contender, configuration),
                contender,
                &env,
                &poller_proxy,
                &pipeline,
            )
            .await?;
        check_outcome(&clients, configuration, self.messages, &pipeline).await?;
        let poller = poller_proxy.bill();
        let poller_sqs = poller.sqs_requests
            - poller.sqs_empty_receives
            - poller
                .requests
                .get("sqs:GetQueueAttributes")
                .copied()
                .unwrap_or(0);
        let function = function_proxy.bill();
        let sandbox = Metered {
            poller_sqs,
            producer_sqs,
            invocations: outcome.invocations,
            billed_ms: outcome.billed_ms,
            log_bytes: outcome.log_bytes,
        };
        let cost = Cost::of(self.messages as u64, &function, &sandbox);
        Ok(AllInRun {
            configuration,
            contender,
            messages: self.messages as u64,
            invocations: outcome.invocations,
            billed_ms: outcome.billed_ms,
            processor: match contender {
                Contender::Worker => "",
                Contender::Powertools => configuration.powertools_processor(),
            },
            function,
            poller_sqs_requests: poller_sqs,
            producer_sqs_requests: producer_sqs,
            log_bytes: outcome.log_bytes,
            cost,
        })
    }

    /// Sends the messages through `proxy` in batches of 10; the producer's billed requests.
    async fn fill(
        &self,
        proxy: &FaultProxy,
        configuration: Configuration,
        pipeline: &PipelineResources,
    ) -> Result<u64, String> {
        let clients = AwsClients::for_endpoints(&proxy.endpoints(), "us-east-1").await;
        let bodies: Vec<String> = (0..self.messages)
            .map(|i| {
                serde_json::json!({"id": format!("{}-{i:06}", self.tag), "scenario": configuration.scenario(i)})
                    .to_string()
            })
            .collect();
        crate::demo::send_bodies(&clients.sqs, &pipeline.source_url, &bodies)
            .await
            .map_err(|e| format!("fill: {e}"))?;
        Ok(proxy.bill().sqs_requests)
    }

    /// The function's environment: the downstream, AWS through `proxy`, and what the
    /// configuration turns on.
    fn environment(
        &self,
        configuration: Configuration,
        contender: Contender,
        pipeline: &PipelineResources,
        tables: &Tables,
        proxy: &FaultProxy,
    ) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = vec![
            ("WORKER_DOWNSTREAM_URL".into(), self.downstream.to_string()),
            // Lambda sets both; boto3 reads the second.
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_DEFAULT_REGION".into(), "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID".into(), "bench".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "bench".into()),
            (
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE".into(),
                MEMORY_MB.to_string(),
            ),
            ("AWS_ENDPOINT_URL".into(), proxy.url()),
            ("AWS_ENDPOINT_URL_DYNAMODB".into(), proxy.url()),
            ("AWS_ENDPOINT_URL_SQS".into(), proxy.url()),
            ("AWS_ENDPOINT_URL_S3".into(), proxy.url()),
        ];
        if contender == Contender::Powertools {
            env.push(("IDEMPOTENCY_TABLE".into(), tables.idempotency.clone()));
            return env;
        }
        env.extend(pipeline.store_env());
        env.push(("WORKER_MAX_CONCURRENCY".into(), BATCH_SIZE.to_string()));
        env.push(("WORKER_RETRY_MAX_ATTEMPTS".into(), "3".into()));
        match configuration {
            Configuration::Idempotency => {
                env.push((
                    "WORKER_IDEMPOTENCY_TABLE".into(),
                    tables.idempotency.clone(),
                ));
            }
            Configuration::Transient => {
                // A breaker sized for the run's rate: 5 % of a thousand messages a few
                // seconds long is a blip, not an outage, and does not open it. Spacing short
                // enough for the run to end in seconds.
                env.push(("WORKER_BREAKER_TABLE".into(), tables.breaker.clone()));
                env.push(("WORKER_BREAKER_THRESHOLD".into(), "200".into()));
                env.push(("WORKER_REDELIVERY_BASE_SECS".into(), "1".into()));
                env.push(("WORKER_REDELIVERY_MAX_SECS".into(), "2".into()));
            }
            Configuration::Plain | Configuration::DeadLetters => {}
        }
        env
    }

    /// Runs the contender until its queue is empty; what Lambda would bill for it.
    async fn process(
        &self,
        command: tokio::process::Command,
        contender: Contender,
        env: &[(String, String)],
        poller_proxy: &FaultProxy,
        pipeline: &PipelineResources,
    ) -> Result<Outcome, String> {
        let name = contender.name();
        // At its logging defaults, whatever the shell running the benchmark sets.
        let mut command = command;
        for var in [
            "RUST_LOG",
            "AWS_LAMBDA_LOG_LEVEL",
            "AWS_LAMBDA_LOG_FORMAT",
            "WORKER_LOG_RECORDS",
        ] {
            command.env_remove(var);
        }
        // The function's output goes to a file of its own, counted once it stops.
        let log = std::env::temp_dir().join(format!("keeper-all-in-{name}-{}.log", self.tag));
        let _ = std::fs::remove_file(&log);
        let api = RuntimeApi::start(&format!(
            "arn:aws:lambda:us-east-1:000000000000:function:{name}"
        ))
        .await
        .map_err(|e| e.to_string())?;
        let mut process =
            FunctionProcess::spawn_command(command, name, &api.address(), env, Some(&log))
                .map_err(|e| format!("{name}: {e}"))?;
        api.first_poll(Duration::from_secs(30))
            .await
            .ok_or_else(|| format!("{name} never polled the Runtime API"))?;
        let invoker = crate::bench_cost::TimedInvoker::new(RuntimeApiInvoker {
            api,
            timeout: Duration::from_secs(60),
        });
        let poller_clients =
            AwsClients::for_endpoints(&poller_proxy.endpoints(), "us-east-1").await;
        let esm = EventSourceMapping::new(
            poller_clients.sqs.clone(),
            &pipeline.source_url,
            &pipeline.source_arn,
            "us-east-1",
            BATCH_SIZE,
        );
        let (stats, drained) = esm
            .run_until_drained(&invoker, Duration::from_secs(600))
            .await?;
        let _ = process.kill().await;
        if !drained {
            return Err(format!("{name} did not drain its queue: {stats:?}"));
        }
        let billed_ms = invoker.billed_ms();
        let log_bytes = std::fs::metadata(&log).map_or(0, |m| m.len());
        let _ = std::fs::remove_file(&log);
        Ok(Outcome {
            invocations: stats.invocations,
            billed_ms,
            log_bytes,
        })
    }

    /// How to start `contender` for `configuration`.
    fn command(
        &self,
        contender: Contender,
        configuration: Configuration,
    ) -> tokio::process::Command {
        match contender {
            Contender::Worker => tokio::process::Command::new(self.worker),
            Contender::Powertools => {
                let script =
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench-python.sh");
                let mut command = tokio::process::Command::new(script);
                command
                    .arg("worker")
                    .arg(configuration.powertools_handler());
                command
            }
        }
    }
}

/// What a run's sandbox did.
struct Outcome {
    invocations: u64,
    billed_ms: f64,
    log_bytes: u64,
}

/// What a run is billed for beside the function's own requests.
#[derive(Debug, Clone, Default)]
struct Metered {
    /// The poller's receives and deletes.
    poller_sqs: u64,
    /// The producer's sends.
    producer_sqs: u64,
    /// Lambda invocations.
    invocations: u64,
    /// Their billed duration, ms.
    billed_ms: f64,
    /// The function's log output, bytes.
    log_bytes: u64,
}

/// A metered proxy over `endpoints`.
async fn metered(endpoints: &Endpoints) -> Result<FaultProxy, String> {
    FaultProxy::start_metered(endpoints)
        .await
        .map_err(|e| format!("metered proxy: {e}"))
}

/// Every message was processed: the refused ones are in the DLQ, no other.
async fn check_outcome(
    clients: &AwsClients,
    configuration: Configuration,
    messages: usize,
    pipeline: &PipelineResources,
) -> Result<(), String> {
    let expected = configuration.dead_letters(messages) as u64;
    let in_dlq = crate::esm::queue_depth(&clients.sqs, &pipeline.dlq_url).await?;
    if in_dlq != expected {
        return Err(format!(
            "{}: {in_dlq} messages in the DLQ, {expected} expected",
            configuration.title()
        ));
    }
    Ok(())
}

/// The figures as text tables, one per configuration.
pub fn render(bench: &AllInBench) -> String {
    let mut out = String::new();
    for configuration in Configuration::ALL {
        let rows: Vec<Vec<String>> = bench
            .runs
            .iter()
            .filter(|r| r.configuration == configuration)
            .map(row)
            .collect();
        out.push_str(&format!(
            "\n{} ({} messages, batches of {BATCH_SIZE}), per million messages:\n",
            configuration.title(),
            bench.messages
        ));
        out.push_str(&sqs_keeper_core::analysis::table(&HEADINGS, &rows));
        out.push_str(&format!(
            "ours ÷ Powertools, dollars on arm64: {:.3}\n",
            bench.ratio(configuration)
        ));
    }
    out
}

/// The columns of a run's row.
pub const HEADINGS: [&str; 10] = [
    "contender",
    "SQS requests",
    "DynamoDB read units",
    "DynamoDB write units",
    "S3 requests",
    "Lambda requests",
    "GB-s at 128 MB (timed on a full core)",
    "log GB",
    "$ arm64 (requests alone, logs alone)",
    "$ x86_64",
];

/// One run as a row of [`HEADINGS`].
pub fn row(run: &AllInRun) -> Vec<String> {
    let c = &run.cost;
    let contender = match run.processor {
        "" => run.contender.name().to_string(),
        processor => format!("{} ({processor})", run.contender.name()),
    };
    vec![
        contender,
        format!("{:.0}", c.sqs_requests),
        format!("{:.0}", c.dynamodb_read_units),
        format!("{:.0}", c.dynamodb_write_units),
        format!("{:.0}", c.s3_requests),
        format!("{:.0}", c.lambda_requests),
        format!("{:.1}", c.gb_seconds),
        format!("{:.3}", c.log_gb),
        format!(
            "{:.3} ({:.3}, {:.3})",
            c.dollars_arm64, c.dollars_requests, c.dollars_logs
        ),
        format!("{:.3}", c.dollars_x86),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_million_messages_in_batches_of_ten_cost_their_sends_receives_and_deletes() {
        // 1,000 messages: 100 sends, 100 receives, 100 deletes, 100 invocations of 20 ms.
        let sandbox = Metered {
            poller_sqs: 200,
            producer_sqs: 100,
            invocations: 100,
            billed_ms: 2_000.0,
            log_bytes: 0,
        };
        let cost = Cost::of(1_000, &Bill::default(), &sandbox);
        assert!((cost.sqs_requests - 300_000.0).abs() < 1e-6);
        assert!((cost.lambda_requests - 100_000.0).abs() < 1e-6);
        // 2,000 s per million at 128 MB: 250 GB-s.
        assert!((cost.gb_seconds - 250_000.0 / 1_000.0).abs() < 1e-6);
        // $0.12 of SQS, $0.02 of Lambda requests, 250 GB-s on arm64.
        let expected = 0.12 + 0.02 + 250.0 * PRICES.lambda_gb_second_arm64;
        assert!((cost.dollars_arm64 - expected).abs() < 1e-9, "{cost:?}");
        assert!((cost.dollars_requests - 0.14).abs() < 1e-9);
    }

    #[test]
    fn two_writes_a_record_cost_a_dollar_and_a_quarter_a_million() {
        let bill = Bill {
            dynamodb_write_units: 2_000.0,
            ..Bill::default()
        };
        let cost = Cost::of(1_000, &bill, &Metered::default());
        assert!((cost.dollars_requests - 1.25).abs() < 1e-9, "{cost:?}");
    }

    #[test]
    fn a_line_of_300_bytes_a_record_costs_fifteen_cents_a_million_in_logs() {
        let sandbox = Metered {
            log_bytes: 300_000,
            ..Metered::default()
        };
        let cost = Cost::of(1_000, &Bill::default(), &sandbox);
        assert!((cost.log_gb - 0.3).abs() < 1e-9, "{cost:?}");
        assert!((cost.dollars_logs - 0.15).abs() < 1e-9, "{cost:?}");
        assert!((cost.dollars_arm64 - 0.15).abs() < 1e-9, "{cost:?}");
        assert!(cost.dollars_requests.abs() < 1e-12, "logs are not requests");
    }

    #[test]
    fn the_failures_fall_on_the_messages_each_configuration_names() {
        assert_eq!(Configuration::DeadLetters.dead_letters(1_000), 10);
        assert_eq!(Configuration::Transient.dead_letters(1_000), 0);
        let transient = (0..1_000)
            .filter(|i| Configuration::Transient.scenario(*i) == "flaky")
            .count();
        assert_eq!(transient, 50);
        assert_eq!(Configuration::Plain.scenario(7), "slow");
    }
}
