//! `keeper bench-store`: how the operator's reads and the redrive scale on the emulator.
//!
//! Seeds a table with N records (10,000 by default) and measures, in one run, the
//! latency of a `list` page, a signature page, `analyze` and `stats` against the floor of
//! one `GetItem` round trip; then redrive throughput (items/s) and AWS API calls per item
//! for `requeue` (batched) and `reprocess`, counted by an SDK interceptor.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use serde::Serialize;
use serde_json::json;
use sqs_keeper_aws::{schema, DeadLetterStore};
use sqs_keeper_aws::{AwsClients, CallCounter, Endpoints};

use sqs_keeper_core::item::ItemParser;
use sqs_keeper_core::retry::AttemptFailure;
use sqs_keeper_core::selection::RecordFilter;
use sqs_keeper_core::{
    dead_letter::DeadLetterCandidate, dead_letter::DeadLetteredItem, dead_letter::InvocationInfo,
    dead_letter::ItemStatus, DeadLetterReason,
};
use sqs_keeper_core::{
    redrive, redrive::RedriveEngine, redrive::RedriveMode, redrive::RedriveRequest,
    redrive::RedriveSettings,
};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_http::HttpDelivery;

use crate::downstream::{Downstream, DownstreamConfig};
use crate::resources::{PipelineResources, ResourceSpec};

/// StartMessageMoveTask's largest rate (messages per second): what SQS's own redrive of a
/// DLQ moves at, at best.
const MOVE_TASK_RATE: f64 = 500.0;

/// One measured operation.
#[derive(Debug, Clone, Serialize)]
pub struct Timing {
    /// What was measured.
    pub operation: String,
    /// Median in milliseconds.
    pub median_ms: f64,
    /// 95th percentile in milliseconds.
    pub p95_ms: f64,
    /// Median ÷ the GetItem floor.
    pub vs_floor: f64,
    /// Median ÷ reading every record's pages with nothing done with them (the reads that
    /// go over the whole table).
    pub vs_paging: Option<f64>,
    /// Runs.
    pub runs: usize,
}

/// Peak RSS (KiB) of `dlq stats` and `dlq analyze` over the bench's table, run as the
/// release binary beside this one under `/usr/bin/time`.
fn cli_peak_rss(
    resources: &PipelineResources,
    endpoints: &Endpoints,
    region: &str,
) -> BTreeMap<String, u64> {
    let mut peaks = BTreeMap::new();
    let Some(dlq) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("dlq")))
        .filter(|path| path.exists())
    else {
        eprintln!("no dlq binary beside this one: peak RSS not measured");
        return peaks;
    };
    for command in ["stats", "analyze"] {
        let output = std::process::Command::new("/usr/bin/time")
            .args(["-f", "%M"])
            .arg(&dlq)
            .arg(command)
            .env_clear()
            .env("DLQ_TABLE", &resources.table)
            .env("DLQ_QUEUE_URL", &resources.dlq_url)
            .env("DLQ_BUCKET", &resources.bucket)
            .env("AWS_REGION", region)
            .env("AWS_ACCESS_KEY_ID", "bench")
            .env("AWS_SECRET_ACCESS_KEY", "bench")
            .env("AWS_ENDPOINT_URL", &endpoints.shared)
            .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoints.dynamodb)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output();
        let peak = output.ok().filter(|o| o.status.success()).and_then(|o| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .and_then(|line| line.trim().parse().ok())
        });
        match peak {
            Some(kib) => {
                peaks.insert(command.to_string(), kib);
            }
            None => {
                eprintln!("dlq {command} did not run under /usr/bin/time: peak RSS not measured")
            }
        }
    }
    peaks
}

/// Sends a DLQ message for each of the first `messages` records, then times a full sweep
/// pass and its settling against a bare receive of as many messages.
async fn bench_sweep(
    store: &DeadLetterStore,
    seeded: &[DeadLetteredItem],
    messages: usize,
) -> Result<SweepFigures, String> {
    let messages = messages.min(seeded.len());
    eprintln!("sending {messages} DLQ messages...");
    let refs: Vec<&DeadLetteredItem> = seeded[..messages].iter().collect();
    for chunk in refs.chunks(500) {
        for result in sqs_keeper_core::ports::DeadLetterQueue::send_to_dlq(store, chunk).await {
            result.map_err(|e| e.to_string())?;
        }
    }
    eprintln!("sweeping...");
    let start = Instant::now();
    let sweep =
        sqs_keeper_core::sweep::sweep_dlq(store, &sqs_keeper_core::sweep::SweepOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    let pass_secs = start.elapsed().as_secs_f64();
    let complete = sweep.complete;
    let start = Instant::now();
    sqs_keeper_core::sweep::settle_held(store, sweep.held, Duration::ZERO, Duration::ZERO, None)
        .await
        .map_err(|e| e.to_string())?;
    let settle_secs = start.elapsed().as_secs_f64();
    // The floor: receive every message (batches of 10, hidden for the whole loop), then
    // give them back, with nothing judged.
    let start = Instant::now();
    let mut receipts = Vec::new();
    loop {
        let got = store
            .clients()
            .sqs
            .receive_message()
            .queue_url(&store.config().queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(600)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let batch: Vec<String> = got
            .messages()
            .iter()
            .filter_map(|m| m.receipt_handle().map(str::to_string))
            .collect();
        if batch.is_empty() {
            break;
        }
        receipts.extend(batch);
    }
    let bare_receive_secs = start.elapsed().as_secs_f64();
    let receipts: Vec<String> = receipts;
    sqs_keeper_core::ports::DeadLetterQueue::hold(store, &receipts, Duration::ZERO)
        .await
        .map_err(|e| e.to_string())?;
    Ok(SweepFigures {
        messages,
        pass_secs,
        settle_secs,
        bare_receive_secs,
        vs_bare_receive: (pass_secs + settle_secs) / bare_receive_secs.max(f64::MIN_POSITIVE),
        complete,
    })
}

/// One measured redrive.
#[derive(Debug, Clone, Serialize)]
pub struct RedriveFigures {
    /// Mode.
    pub mode: String,
    /// Items resolved.
    pub items: usize,
    /// Items per second.
    pub items_per_sec: f64,
    /// AWS API calls per item.
    pub calls_per_item: f64,
    /// Calls by operation.
    pub calls: BTreeMap<String, u64>,
    /// Seconds spent waiting on each operation (summed over calls).
    pub seconds_waiting: BTreeMap<String, f64>,
    /// Seconds the redrive took ÷ seconds a bare SQS move (receive, send, delete in
    /// batches of 10) of as many messages took on the same emulator in the same run.
    pub vs_bare_move: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct StoreBench {
    /// Records seeded.
    pub records: usize,
    /// Seeding rate (records/s via BatchWriteItem).
    pub seed_per_sec: f64,
    /// The GetItem floor, ms (median).
    pub floor_ms: f64,
    /// Read timings.
    pub reads: Vec<Timing>,
    /// Redrive figures.
    pub redrives: Vec<RedriveFigures>,
    /// Peak resident memory of the `dlq` binary (`stats`, `analyze`) over the whole table,
    /// in KiB, as `/usr/bin/time` reports it; empty when either could not be run.
    pub cli_peak_rss_kib: BTreeMap<String, u64>,
    /// A full sweep of a DLQ of this many messages.
    pub sweep: SweepFigures,
}

/// A full sweep of a large DLQ, as a redrive run's first phase makes it.
#[derive(Debug, Clone, Serialize)]
pub struct SweepFigures {
    /// Messages in the DLQ.
    pub messages: usize,
    /// Seconds the pass took (receive, judge against the records, rotate nothing).
    pub pass_secs: f64,
    /// Seconds settling its held messages took.
    pub settle_secs: f64,
    /// Seconds a bare receive of every message took (the emulator's floor).
    pub bare_receive_secs: f64,
    /// (pass + settle) ÷ the bare receive.
    pub vs_bare_receive: f64,
    /// Whether the pass saw the DLQ empty (it swept every message).
    pub complete: bool,
}

const SIGNATURES: &[(ErrorClass, &str)] = &[
    (
        ErrorClass::Throttled,
        "downstream answered 429 Too Many Requests",
    ),
    (
        ErrorClass::ServerError,
        "downstream answered 503 Service Unavailable",
    ),
    (ErrorClass::Timeout, "operation timed out"),
    (
        ErrorClass::Validation,
        "field 'amount' must be a positive number",
    ),
    (ErrorClass::Validation, "missing field `id`"),
    (
        ErrorClass::Permission,
        "tenant is not allowed to write here",
    ),
    (ErrorClass::NotFound, "customer does not exist"),
    (ErrorClass::Connection, "connection refused"),
];

fn synthetic(
    n: usize,
    eligible_only: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> DeadLetteredItem {
    let (class, message) = if eligible_only {
        SIGNATURES[n % 3]
    } else {
        SIGNATURES[n % SIGNATURES.len()]
    };
    let id = format!("item-{n:06}");
    let msg = serde_json::from_value(json!({
        "messageId": format!("m-{n}"),
        "body": json!({"id": id, "scenario": "ok", "amount": n % 100}).to_string(),
        "attributes": {"ApproximateReceiveCount": "3", "SentTimestamp": "1763700000000"},
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:bench-source",
    }))
    .unwrap_or_default();
    let mut item = match ItemParser::default().parse(format!("m-{n}"), msg) {
        Ok(item) => item,
        Err(invalid) => invalid.item,
    };
    item.item_id = id;
    // Spread over two days so time filters and hourly buckets have something to do.
    let at = now - chrono::Duration::seconds(i64::try_from(n % 172_800).unwrap_or(0));
    let error = ProcessError::new(class, message);
    let candidate = DeadLetterCandidate {
        item,
        failures: vec![AttemptFailure {
            attempt: 1,
            started_at: at,
            duration: Duration::from_millis(12),
            error: error.clone(),
        }],
        error,
        reason: DeadLetterReason::Permanent,
    };
    DeadLetteredItem::from_candidate(
        &candidate,
        &InvocationInfo::default(),
        at,
        Duration::from_secs(14 * 86_400),
    )
}

async fn seed(store: &DeadLetterStore, records: &[DeadLetteredItem]) -> Result<(), String> {
    for chunk in records.chunks(25) {
        let mut requests: Vec<WriteRequest> = Vec::new();
        for r in chunk {
            let mut map = schema::record_to_item(r).map_err(|e| e.to_string())?;
            let ids: Vec<String> = r
                .failure_history
                .iter()
                .map(|f| f.attempt_id.clone())
                .collect();
            map.insert(schema::ATTEMPT_IDS.into(), AttributeValue::Ss(ids));
            let put = PutRequest::builder()
                .set_item(Some(map))
                .build()
                .map_err(|e| e.to_string())?;
            requests.push(WriteRequest::builder().put_request(put).build());
        }
        while !requests.is_empty() {
            let output = store
                .clients()
                .dynamodb
                .batch_write_item()
                .request_items(&store.config().table, requests.clone())
                .send()
                .await
                .map_err(|e| format!("seed: {}", ProcessError::from_sdk(&e)))?;
            requests = output
                .unprocessed_items()
                .and_then(|m| m.get(&store.config().table))
                .cloned()
                .unwrap_or_default();
        }
    }
    Ok(())
}

async fn time_it<F, Fut, T>(runs: usize, mut f: F) -> Result<Vec<f64>, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        f().await?;
        samples.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples)
}

fn summarize(operation: &str, samples: &[f64], floor: f64) -> Timing {
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Timing {
        operation: operation.to_string(),
        median_ms: pick(0.5),
        p95_ms: pick(0.95),
        vs_floor: pick(0.5) / floor.max(f64::MIN_POSITIVE),
        vs_paging: None,
        runs: samples.len(),
    }
}

/// Runs the benchmark against the emulators at `endpoints`.
pub async fn run(
    endpoints: &Endpoints,
    region: &str,
    records: usize,
    redrive_items: usize,
    sweep_messages: usize,
) -> Result<StoreBench, String> {
    let counter = CallCounter::default();
    let shared = AwsClients::endpoint_config(endpoints, region).await;
    let clients = AwsClients::counted(&shared, true, &counter);
    let spec = ResourceSpec {
        prefix: format!("bench{}", std::process::id()),
        fifo: false,
        max_receive_count: 3,
        visibility_timeout_secs: 30,
    };
    let resources = PipelineResources::create(&clients, &spec).await?;
    let store = DeadLetterStore::new(clients.clone(), resources.store_config());
    let now = chrono::Utc::now();
    let seeded: Vec<DeadLetteredItem> = (0..records).map(|n| synthetic(n, false, now)).collect();
    eprintln!("seeding {records} records...");
    let start = Instant::now();
    seed(&store, &seeded).await?;
    let seed_per_sec = records as f64 / start.elapsed().as_secs_f64();

    let floor_samples = time_it(30, || async {
        store.get("item-000001").await.map_err(|e| e.to_string())?;
        Ok(())
    })
    .await?;
    let floor = summarize("GetItem (floor)", &floor_samples, 1.0).median_ms;
    let dead = RecordFilter {
        status: Some(ItemStatus::Dead),
        ..RecordFilter::default()
    };
    let by_signature = RecordFilter {
        signature: Some(seeded[0].error_signature.clone()),
        ..dead.clone()
    };
    let by_class = RecordFilter {
        class: Some(ErrorClass::Timeout),
        since: Some(now - chrono::Duration::hours(12)),
        ..dead.clone()
    };
    let mut reads = vec![summarize("GetItem (floor)", &floor_samples, floor)];
    eprintln!("timing reads...");
    for (name, filter, runs) in [
        ("list page of 50 (by-status index)", &dead, 20),
        ("list page of 50 (by-signature index)", &by_signature, 20),
        ("list page of 50 (class + time filter)", &by_class, 20),
    ] {
        let samples = time_it(runs, || async {
            let mut got = Vec::new();
            let mut token = None;
            // A page as `dlq list` shows it: 50 matching records.
            while got.len() < 50 {
                let page = store
                    .query_page(filter, 50, token.as_ref())
                    .await
                    .map_err(|e| e.to_string())?;
                got.extend(page.records);
                match page.next {
                    Some(t) => token = Some(t),
                    None => break,
                }
            }
            Ok(got.len())
        })
        .await?;
        reads.push(summarize(name, &samples, floor));
    }
    // The emulator's own floor for reading every record: the pages alone, nothing done
    // with them. `analyze` and `stats` read them as the `dlq` commands do, a page at a
    // time, and are measured against it.
    let paging = time_it(3, || async {
        store
            .for_each_page::<ProcessError>(&RecordFilter::default(), &mut Vec::new(), |_| Ok(()))
            .await
            .map_err(|e| e.to_string())
    })
    .await?;
    let paging_floor = summarize("", &paging, 1.0).median_ms;
    reads.push(summarize(
        &format!("read every record, pages only ({records}; floor of the two below)"),
        &paging,
        floor,
    ));
    let samples = time_it(3, || async {
        let mut analyzer = sqs_keeper_core::analysis::Analyzer::new(3);
        store
            .for_each_page::<ProcessError>(&dead, &mut Vec::new(), |page| {
                page.iter().for_each(|r| analyzer.add(r));
                Ok(())
            })
            .await
            .map_err(|e| e.to_string())?;
        Ok(analyzer.finish().groups.len())
    })
    .await?;
    let mut analyze = summarize(&format!("analyze ({records} records)"), &samples, floor);
    analyze.vs_paging = Some(analyze.median_ms / paging_floor.max(f64::MIN_POSITIVE));
    reads.push(analyze);
    let samples = time_it(3, || async {
        let mut counter = sqs_keeper_core::analysis::StatsCounter::default();
        store
            .for_each_page::<ProcessError>(&RecordFilter::default(), &mut Vec::new(), |page| {
                page.iter().for_each(|r| counter.add(r));
                Ok(())
            })
            .await
            .map_err(|e| e.to_string())?;
        let depth = store.dlq_depth().await.map_err(|e| e.to_string())?;
        Ok(counter.finish(depth, chrono::Utc::now()).records)
    })
    .await?;
    let mut stats = summarize(&format!("stats ({records} records)"), &samples, floor);
    stats.vs_paging = Some(stats.median_ms / paging_floor.max(f64::MIN_POSITIVE));
    reads.push(stats);
    let peak_rss = cli_peak_rss(&resources, endpoints, region);
    let sweep = bench_sweep(&store, &seeded, sweep_messages).await?;

    let mut redrives = Vec::new();
    if redrive_items > 0 {
        let downstream = Downstream::start(0, DownstreamConfig::default())
            .await
            .map_err(|e| e.to_string())?;
        for mode in [RedriveMode::Requeue, RedriveMode::Reprocess] {
            redrives
                .push(bench_redrive(&counter, &shared, mode, redrive_items, &downstream).await?);
        }
    }
    PipelineResources::delete_existing(&clients, &spec).await;
    Ok(StoreBench {
        records,
        seed_per_sec,
        floor_ms: floor,
        reads,
        redrives,
        cli_peak_rss_kib: peak_rss,
        sweep,
    })
}

async fn bench_redrive(
    counter: &CallCounter,
    shared: &aws_config::SdkConfig,
    mode: RedriveMode,
    items: usize,
    downstream: &Downstream,
) -> Result<RedriveFigures, String> {
    let name = mode.as_str();
    let clients = AwsClients::counted(shared, true, counter);
    let spec = ResourceSpec {
        prefix: format!("bench{}-{name}", std::process::id()),
        fifo: false,
        max_receive_count: 3,
        visibility_timeout_secs: 30,
    };
    let resources = PipelineResources::create(&clients, &spec).await?;
    let store = DeadLetterStore::new(clients.clone(), resources.store_config());
    let now = chrono::Utc::now();
    let mut records: Vec<DeadLetteredItem> = (0..items).map(|n| synthetic(n, true, now)).collect();
    for r in &mut records {
        r.source.queue_arn = Some(resources.source_arn.clone());
    }
    eprintln!("seeding {items} eligible records and their DLQ messages for {name}...");
    seed(&store, &records).await?;
    let refs: Vec<&DeadLetteredItem> = records.iter().collect();
    for result in sqs_keeper_core::ports::DeadLetterQueue::send_to_dlq(&store, &refs).await {
        result.map_err(|e| e.to_string())?;
    }
    let delivery = HttpDelivery::new(sqs_keeper_http::HttpDeliveryConfig::new(
        downstream.url().parse().map_err(|e| format!("{e}"))?,
        Duration::from_secs(5),
    ))
    .map_err(|e| e.to_string())?;
    let bare_move = bare_sqs_move(&clients, &resources, items).await?;
    let engine = RedriveEngine::new(store, Some(delivery), RedriveSettings::default());
    counter.reset();
    let start = Instant::now();
    let report = engine
        .run(
            &RedriveRequest {
                mode,
                parallelism: Some(10),
                ..RedriveRequest::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    let calls = counter.snapshot();
    let total: u64 = calls.values().sum();
    // A requeue's items are requeued, a reprocess's resolved.
    let done = report.succeeded + report.requeued;
    if done != items {
        return Err(format!("{name}: {done} of {items} resolved or requeued"));
    }
    PipelineResources::delete_existing(&clients, &spec).await;
    Ok(RedriveFigures {
        mode: name.to_string(),
        items,
        items_per_sec: items as f64 / seconds,
        calls_per_item: total as f64 / items as f64,
        calls,
        seconds_waiting: counter
            .latency()
            .into_iter()
            .map(|(k, v)| (k, v.as_secs_f64()))
            .collect(),
        vs_bare_move: seconds / bare_move,
    })
}

/// Seconds to move `n` messages between two queues with nothing else: the floor any
/// redrive through SQS pays on this emulator (it slows as a queue grows).
async fn bare_sqs_move(
    clients: &AwsClients,
    resources: &PipelineResources,
    n: usize,
) -> Result<f64, String> {
    let bodies: Vec<String> = (0..n)
        .map(|i| json!({"id": format!("move-{i}")}).to_string())
        .collect();
    let create = |suffix: &'static str| async move {
        clients
            .sqs
            .create_queue()
            .queue_name(format!("{}-move-{suffix}", resources.table))
            .send()
            .await
            .map(|o| o.queue_url().unwrap_or_default().to_string())
            .map_err(|e| format!("{}", ProcessError::from_sdk(&e)))
    };
    let from = create("from").await?;
    let to = create("to").await?;
    crate::demo::send_bodies(&clients.sqs, &from, &bodies).await?;
    let start = Instant::now();
    let mut moved = 0;
    while moved < n {
        let output = clients
            .sqs
            .receive_message()
            .queue_url(&from)
            .max_number_of_messages(10)
            .visibility_timeout(600)
            .send()
            .await
            .map_err(|e| format!("{}", ProcessError::from_sdk(&e)))?;
        let messages = output.messages();
        if messages.is_empty() {
            break;
        }
        let bodies: Vec<String> = messages
            .iter()
            .map(|m| m.body().unwrap_or_default().to_string())
            .collect();
        crate::demo::send_bodies(&clients.sqs, &to, &bodies).await?;
        let entries: Vec<_> = messages
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .build()
                    .ok()
            })
            .collect();
        clients
            .sqs
            .delete_message_batch()
            .queue_url(&from)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| format!("{}", ProcessError::from_sdk(&e)))?;
        moved += messages.len();
    }
    let seconds = start.elapsed().as_secs_f64();
    for url in [from, to] {
        let _ = clients.sqs.delete_queue().queue_url(url).send().await;
    }
    Ok(seconds)
}

/// The figures as a table.
pub fn render(b: &StoreBench) -> String {
    let mut rows: Vec<Vec<String>> = b
        .reads
        .iter()
        .map(|t| {
            vec![
                t.operation.clone(),
                format!("{:.1}", t.median_ms),
                format!("{:.1}", t.p95_ms),
                format!("{:.1}×", t.vs_floor),
                t.vs_paging.map(|v| format!("{v:.2}×")).unwrap_or_default(),
            ]
        })
        .collect();
    rows.insert(
        0,
        vec![
            format!("seed via BatchWriteItem: {:.0} records/s", b.seed_per_sec),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ],
    );
    let mut out = sqs_keeper_core::analysis::table(
        &[
            "OPERATION",
            "MEDIAN ms",
            "P95 ms",
            "VS GETITEM",
            "VS PAGES ONLY",
        ],
        &rows,
    );
    out.push('\n');
    for (command, kib) in &b.cli_peak_rss_kib {
        out.push_str(&format!(
            "dlq {command} over {} records: peak RSS {:.1} MiB\n",
            b.records,
            *kib as f64 / 1024.0
        ));
    }
    let s = &b.sweep;
    out.push_str(&format!(
        "sweep of a {}-message DLQ: pass {:.1} s + settle {:.1} s = {:.2}× a bare receive of every message ({:.1} s); complete: {}\n\n",
        s.messages, s.pass_secs, s.settle_secs, s.vs_bare_receive, s.bare_receive_secs, s.complete
    ));
    let rows: Vec<Vec<String>> = b
        .redrives
        .iter()
        .map(|r| {
            let breakdown: Vec<String> = r
                .calls
                .iter()
                .map(|(op, n)| {
                    let waited = r.seconds_waiting.get(op).copied().unwrap_or(0.0);
                    format!("{op} {:.2} ({waited:.0} s)", *n as f64 / r.items as f64)
                })
                .collect();
            vec![
                r.mode.clone(),
                r.items.to_string(),
                format!("{:.0}", r.items_per_sec),
                format!("{:.2}", r.calls_per_item),
                format!("{:.1}×", r.vs_bare_move),
                format!("{:.2}×", r.items_per_sec / MOVE_TASK_RATE),
                breakdown.join(", "),
            ]
        })
        .collect();
    out.push_str(&sqs_keeper_core::analysis::table(
        &[
            "REDRIVE",
            "ITEMS",
            "ITEMS/s",
            "CALLS/ITEM",
            "VS BARE SQS MOVE",
            "VS MOVE TASK 500/s",
            "CALLS/ITEM BY OPERATION (TIME WAITING)",
        ],
        &rows,
    ));
    out
}
