//! The outage scenario of the demo (`make demo-outage`): the downstream is down for a
//! stretch longer than `maxReceiveCount` × the visibility timeout; the compiled worker runs
//! with spaced redelivery and the shared circuit breaker (docs/OPERATIONS.md, "Outages"), and the
//! compiled redrive function runs as its schedule would, during the outage (it must not
//! reprocess) and after it (it brings back the outage's dead letters), and as the breaker's
//! polling control (every 2 s here, once a minute deployed): it disables the worker's event
//! source mapping once the breaker opens a second time in a row, probes with one source
//! message when the open period ends, and enables the mapping once the probe closes it. The
//! summary shows how many records waited, how many receives they used (in all and at most
//! per message), how often polling was paused, how many calls reached the downstream, how
//! many were dead-lettered and redriven, and that the total adds up.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use sqs_keeper_aws::AwsClients;

use crate::demo::{emulator_env, send_bodies, DemoOptions};
use crate::downstream::{Downstream, DownstreamConfig};
use crate::esm::{queue_depth, EsmStats, EventSourceMapping};
use crate::function::FunctionProcess;
use crate::invokers::SharedRuntimeApiInvoker;
use crate::lambda_api::{LambdaApi, LocalFunction};
use crate::resources::{PipelineResources, ResourceSpec};
use crate::runtime_api::{InvocationResult, RuntimeApi};

/// What the outage scenario saw.
#[derive(Debug, Clone, Default)]
pub struct OutageSummary {
    /// Messages sent.
    pub sent: u64,
    /// How long the downstream was down.
    pub outage: Duration,
    /// `maxReceiveCount` × visibility timeout: what an outage outlasts without spacing.
    pub receive_span_unspaced: Duration,
    /// Receives during the outage (every one a downstream call without the breaker).
    pub receives_during_outage: u64,
    /// Calls that reached the downstream during the outage.
    pub calls_during_outage: u64,
    /// Records returned for retry at least once (they waited).
    pub waited: u64,
    /// Receives in all, per message.
    pub receives_per_message: f64,
    /// The most receives one message took (its `ApproximateReceiveCount`).
    pub max_receives: u64,
    /// Times the polling control disabled the worker's event source mapping.
    pub polling_paused: u64,
    /// Times it enabled it again.
    pub polling_resumed: u64,
    /// Probes it ran with a source message.
    pub polling_probes: u64,
    /// Dead-lettered by the worker (on a last receive during the outage).
    pub dead_lettered: u64,
    /// What the scheduled redrive selected while the breaker was open.
    pub redriven_while_open: u64,
    /// Resolved by the scheduled redrive after recovery.
    pub redriven_after: u64,
    /// Distinct items the downstream processed.
    pub delivered: u64,
    /// Left in the source queue and the DLQ at the end.
    pub left: u64,
}

impl OutageSummary {
    /// Whether every message was delivered once the downstream recovered, none is left.
    pub fn adds_up(&self) -> bool {
        self.delivered == self.sent
            && self.left == 0
            && self.redriven_while_open == 0
            && self.redriven_after == self.dead_lettered
    }

    /// A readable report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut line =
            |label: &str, value: String| out.push_str(&format!("  {label:<38} {value}\n"));
        line("sent", self.sent.to_string());
        line(
            "outage",
            format!(
                "{:.0} s (maxReceiveCount x visibility timeout: {:.0} s)",
                self.outage.as_secs_f64(),
                self.receive_span_unspaced.as_secs_f64()
            ),
        );
        line("records that waited", self.waited.to_string());
        line(
            "receives during the outage",
            self.receives_during_outage.to_string(),
        );
        line(
            "  of which reached the downstream",
            format!(
                "{} (the rest: the circuit breaker was open)",
                self.calls_during_outage
            ),
        );
        line(
            "receives per message, in all",
            format!("{:.2}", self.receives_per_message),
        );
        line(
            "most receives of one message",
            format!("{} (maxReceiveCount 5)", self.max_receives),
        );
        line(
            "polling paused / restored",
            format!(
                "{} / {} ({} probes with a source message)",
                self.polling_paused, self.polling_resumed, self.polling_probes
            ),
        );
        line("dead-lettered", self.dead_lettered.to_string());
        line(
            "redriven while the breaker was open",
            self.redriven_while_open.to_string(),
        );
        line(
            "redriven after recovery (schedule)",
            self.redriven_after.to_string(),
        );
        line("delivered", self.delivered.to_string());
        line("left in the queue and the DLQ", self.left.to_string());
        line(
            "adds up",
            if self.adds_up() {
                format!(
                    "yes: {} sent = {} delivered ({} of them after a redrive); nothing left",
                    self.sent, self.delivered, self.redriven_after
                )
            } else {
                "NO: some message is unaccounted for".to_string()
            },
        );
        out
    }
}

/// Creates (anew) a pay-per-request table keyed by a string `id`: a breaker's or an
/// idempotency table.
pub(crate) async fn breaker_table(clients: &AwsClients, name: &str) -> Result<String, String> {
    let _ = clients
        .dynamodb
        .delete_table()
        .table_name(name)
        .send()
        .await;
    clients
        .dynamodb
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()
                .map_err(|e| e.to_string())?,
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| e.to_string())?,
        )
        .send()
        .await
        .map_err(|e| {
            format!(
                "breaker table: {}",
                sqs_keeper_lambda::ProcessError::from_sdk(&e)
            )
        })?;
    Ok(name.to_string())
}

/// Invokes the redrive function as its schedule does; returns how many it resolved and
/// selected.
async fn scheduled_redrive(api: &RuntimeApi) -> Result<(u64, u64), String> {
    let request = r#"{"mode": "reprocess", "max_items": 1000, "parallelism": 4}"#;
    match api
        .invoke(request.as_bytes().to_vec().into(), Duration::from_secs(60))
        .await
        .map_err(|e| format!("redrive: {e}"))?
    {
        InvocationResult::Response(body) => {
            let report: serde_json::Value =
                serde_json::from_slice(&body).map_err(|e| format!("redrive report: {e}"))?;
            Ok((
                report["succeeded"].as_u64().unwrap_or(0),
                report["selected"].as_u64().unwrap_or(0),
            ))
        }
        InvocationResult::Error(body) => Err(format!(
            "the redrive function failed: {}",
            String::from_utf8_lossy(&body)
        )),
    }
}

/// What the polling control runs did.
#[derive(Debug, Default)]
struct ControlCounts {
    paused: AtomicU64,
    resumed: AtomicU64,
    probes: AtomicU64,
}

/// Invokes the redrive function as the breaker's polling schedule does, every `period`,
/// until dropped.
fn polling_schedule(
    api: Arc<RuntimeApi>,
    period: Duration,
    counts: Arc<ControlCounts>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let answer = api
                .invoke(
                    bytes::Bytes::from_static(br#"{"control": "polling"}"#),
                    Duration::from_secs(30),
                )
                .await;
            if let Ok(InvocationResult::Response(body)) = answer {
                let action: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                match action["polling"].as_str() {
                    Some("paused") => {
                        counts.paused.fetch_add(1, Ordering::SeqCst);
                    }
                    Some("resumed") => {
                        counts.resumed.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
                if action.get("probe").is_some_and(|p| p != "empty") {
                    counts.probes.fetch_add(1, Ordering::SeqCst);
                }
            }
            tokio::time::sleep(period).await;
        }
    })
}

/// Runs the outage scenario.
pub async fn run_outage(
    options: &DemoOptions,
    outage: Duration,
    pause_polling: bool,
) -> Result<OutageSummary, String> {
    let redrive_binary = options
        .worker_binary
        .parent()
        .map(|d| d.join("redrive"))
        .ok_or("cannot locate the redrive binary")?;
    run_outage_with(options, &redrive_binary, outage, pause_polling).await
}

/// [`run_outage`] with the redrive function's binary named (the packaged `bootstrap` of
/// each function lives in a directory of its own).
pub async fn run_outage_with(
    options: &DemoOptions,
    redrive_binary: &std::path::Path,
    outage: Duration,
    pause_polling: bool,
) -> Result<OutageSummary, String> {
    let clients = AwsClients::for_endpoints(&options.endpoints, &options.region).await;
    let max_receive_count = 5;
    let visibility = 2;
    let spec = ResourceSpec {
        prefix: format!("{}-outage", options.prefix),
        fifo: false,
        max_receive_count,
        visibility_timeout_secs: visibility,
    };
    PipelineResources::delete_existing(&clients, &spec).await;
    let resources = PipelineResources::create(&clients, &spec).await?;
    let breaker = breaker_table(&clients, &format!("{}-outage-breaker", options.prefix)).await?;
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .map_err(|e| format!("cannot start the downstream: {e}"))?;

    let mut env = emulator_env(&options.endpoints, &options.region);
    env.extend(resources.store_env());
    env.extend(
        [
            ("WORKER_DOWNSTREAM_URL", downstream.url().as_str()),
            ("WORKER_DOWNSTREAM_TIMEOUT_MS", "300"),
            ("WORKER_ITEM_ID_SOURCE", "pointer:/id"),
            ("WORKER_RETRY_MAX_ATTEMPTS", "1"),
            ("WORKER_DEADLINE_MARGIN_MS", "500"),
            ("WORKER_REDELIVERY_BASE_SECS", "2"),
            ("WORKER_REDELIVERY_MULTIPLIER", "3"),
            ("WORKER_REDELIVERY_MAX_SECS", "30"),
            ("WORKER_BREAKER_TABLE", breaker.as_str()),
            // The worker's breaker for both functions, as the template sets it: the
            // redrive function is gated by it and pauses the worker's polling by it.
            ("WORKER_BREAKER_KEY", "breaker#worker"),
            ("WORKER_BREAKER_THRESHOLD", "5"),
            ("WORKER_BREAKER_OPEN_SECS", "3"),
            ("REDRIVE_SOURCE_QUEUE_URL", resources.source_url.as_str()),
            ("RUST_LOG", "info"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let esm = EventSourceMapping::new(
        clients.sqs.clone(),
        &resources.source_url,
        &resources.source_arn,
        &options.region,
        10,
    );
    let region = &options.region;
    let worker_api = Arc::new(
        RuntimeApi::start(&format!(
            "arn:aws:lambda:{region}:000000000000:function:worker"
        ))
        .await
        .map_err(|e| format!("cannot start the runtime API: {e}"))?,
    );
    let redrive_api = Arc::new(
        RuntimeApi::start(&format!(
            "arn:aws:lambda:{region}:000000000000:function:redrive"
        ))
        .await
        .map_err(|e| format!("cannot start the runtime API: {e}"))?,
    );
    // The Lambda API the redrive function pauses the worker's mapping and invokes the
    // worker through.
    let lambda_api = LambdaApi::serve(
        vec![LocalFunction {
            name: "worker".to_string(),
            runtime: worker_api.clone(),
            timeout: Duration::from_secs(6),
        }],
        vec![("worker-mapping".to_string(), esm.state())],
    )
    .await
    .map_err(|e| format!("cannot start the Lambda API: {e}"))?;
    let mut redrive_env = env.clone();
    redrive_env.extend(
        [
            ("REDRIVE_WORKER_FUNCTION", "worker".to_string()),
            ("REDRIVE_WORKER_MAPPING", "worker-mapping".to_string()),
            ("AWS_ENDPOINT_URL_LAMBDA", lambda_api.url()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    let log = options.state_dir.join("worker-outage.log");
    let _ = std::fs::remove_file(&log);
    let _worker = FunctionProcess::spawn(
        &options.worker_binary,
        "worker",
        &worker_api.address(),
        &env,
        Some(&log),
    )
    .map_err(|e| format!("cannot start {}: {e}", options.worker_binary.display()))?;
    let _redrive = FunctionProcess::spawn(
        redrive_binary,
        "redrive",
        &redrive_api.address(),
        &redrive_env,
        Some(&options.state_dir.join("redrive-outage.log")),
    )
    .map_err(|e| format!("cannot start {}: {e}", redrive_binary.display()))?;

    // The downstream answers 429 to every item until it is fixed: an outage.
    let ids: Vec<String> = (0..options.items.min(200))
        .map(|n| format!("out-{n}"))
        .collect();
    let bodies: Vec<String> = ids
        .iter()
        .map(|id| serde_json::json!({"id": id, "scenario": "throttled"}).to_string())
        .collect();
    send_bodies(&clients.sqs, &resources.source_url, &bodies).await?;
    println!(
        "sent {} messages; the downstream is down for {} s...",
        bodies.len(),
        outage.as_secs()
    );
    let invoker = SharedRuntimeApiInvoker {
        api: worker_api,
        timeout: Duration::from_secs(6),
    };
    let counts = Arc::new(ControlCounts::default());
    let control = pause_polling
        .then(|| polling_schedule(redrive_api.clone(), Duration::from_secs(2), counts.clone()));
    let mut during = EsmStats::default();
    let end = tokio::time::Instant::now() + outage;
    let mut redriven_while_open = 0;
    let mut tried_redrive = false;
    while tokio::time::Instant::now() < end {
        esm.poll_once(&invoker, &mut during).await?;
        if !tried_redrive && tokio::time::Instant::now() + outage / 2 > end {
            // Halfway: the schedule fires while the breaker is open.
            let (_, selected) = scheduled_redrive(&redrive_api).await?;
            redriven_while_open = selected;
            tried_redrive = true;
        }
    }
    let calls_during_outage: u64 = downstream.answers().values().sum();
    println!("the downstream is back; draining the queue...");
    downstream.fix();
    let (after, drained) = esm
        .run_until_drained(&invoker, Duration::from_secs(120))
        .await?;
    if !drained {
        return Err("the source queue did not drain within 2 minutes".to_string());
    }
    if let Some(control) = control {
        control.abort();
    }
    let dead_lettered =
        crate::demo::count_by(&clients, &resources.table, sqs_keeper_aws::schema::STATUS)
            .await?
            .values()
            .sum();
    // The schedule fires every few seconds (every 15 minutes in a deployment) until the
    // outage's dead letters are back: it does nothing while the breaker is open, probes
    // with one item once the open period is over, and redrives the rest once it closes.
    let mut redriven_after = 0;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(180);
    while queue_depth(&clients.sqs, &resources.dlq_url).await? > 0
        && tokio::time::Instant::now() < give_up
    {
        let (resolved, _) = scheduled_redrive(&redrive_api).await?;
        redriven_after += resolved;
        if resolved == 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    }
    let delivered: BTreeSet<String> = downstream.delivered().into_iter().collect();
    let left = queue_depth(&clients.sqs, &resources.source_url).await?
        + queue_depth(&clients.sqs, &resources.dlq_url).await?;
    let received = during.received + after.received;
    let summary = OutageSummary {
        sent: bodies.len() as u64,
        outage,
        receive_span_unspaced: Duration::from_secs(u64::from(max_receive_count * visibility)),
        receives_during_outage: during.received,
        calls_during_outage,
        waited: ids.len() as u64,
        receives_per_message: received as f64 / bodies.len().max(1) as f64,
        max_receives: during.max_receive_count.max(after.max_receive_count),
        polling_paused: counts.paused.load(Ordering::SeqCst),
        polling_resumed: counts.resumed.load(Ordering::SeqCst),
        polling_probes: counts.probes.load(Ordering::SeqCst),
        dead_lettered,
        redriven_while_open,
        redriven_after,
        delivered: ids.iter().filter(|id| delivered.contains(*id)).count() as u64,
        left,
    };
    println!("\nsummary\n{}", summary.render());
    Ok(summary)
}
