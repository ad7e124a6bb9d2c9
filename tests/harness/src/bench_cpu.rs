//! `keeper bench-cpu`: per-record CPU of the worker's whole invocation path — raw event
//! bytes in, response bytes out — against two peers measured in the same run: the floor
//! (only deserializing the same bytes into `aws_lambda_events`' `SqsEvent` with
//! `serde_json`) and, when its venv is available, Powertools for AWS Lambda (Python)
//! `BatchProcessor` running the same per-record work on the same bytes.
//!
//! The per-record work is the same on both sides: parse the JSON body into a typed
//! `Order`, SHA-256 of the body, and a deterministic 1 % failure (`sequence % 100 == 0`).
//! Both sides must answer byte-identical responses; the run fails otherwise.

use std::borrow::Cow;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::SqsEvent;
use lambda_runtime::tower::{Layer, Service};
use lambda_runtime::{service_fn, LambdaEvent, LambdaInvocation};
use serde::{Deserialize, Serialize};
use sqs_keeper_core::dead_letter::NoDeadLetterStore;
use sqs_keeper_core::retry::RetryPolicy;
use sqs_keeper_core::{item::BodyFormat, item::ItemIdSource, item::ItemParser, WorkItem};
use sqs_keeper_core::{BatchConfig, BatchProcessor};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_core::{Outcome, Processor};
use sqs_keeper_lambda::worker::Worker;
use sqs_keeper_lambda::{runtime::respond, runtime::HandlerOutcome, runtime::WorkerLayer};

/// One event shape measured.
#[derive(Debug, Clone, Copy)]
pub struct EventShape {
    /// Records in the event.
    pub records: usize,
    /// Approximate body size in bytes.
    pub body_bytes: usize,
}

/// The shapes the issue asks for: many small records and fewer large ones, both under the
/// 6 MB synchronous payload limit.
pub const SHAPES: [EventShape; 2] = [
    EventShape {
        records: 5_000,
        body_bytes: 400,
    },
    EventShape {
        records: 1_000,
        body_bytes: 5_000,
    },
];

/// The most a traced record may cost over an untraced one with tracing off: noise.
pub const TRACED_GOAL: f64 = 1.05;

/// The message id of record `i` (the Python generator uses the same).
pub fn message_id(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

/// The goals for an event of `body_bytes` bodies: ours ÷ Powertools, and ours ÷ the
/// `serde_json` floor where one is set (small bodies, where decode and engine are most of
/// the work).
pub fn goals(body_bytes: usize) -> (f64, Option<f64>) {
    if body_bytes <= 1_000 {
        (0.15, Some(1.0))
    } else {
        (0.32, None)
    }
}

/// The X-Ray header every record of [`traced_event`] carries, as SQS passes a producer's.
pub const TRACE_HEADER: &str =
    "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";

/// A Lambda SQS event with `Order` bodies of about `body_bytes` each.
pub fn event(shape: EventShape) -> Vec<u8> {
    event_with(shape, None)
}

/// [`event`], every record carrying the producer's trace ([`TRACE_HEADER`]) as its
/// `AWSTraceHeader` system attribute.
pub fn traced_event(shape: EventShape) -> Vec<u8> {
    event_with(shape, Some(("AWSTraceHeader", TRACE_HEADER)))
}

/// [`traced_event`]'s bytes without a trace: the same value under a name of the same
/// length that nothing reads. Against it, the traced event measures following a trace,
/// not decoding longer records.
pub fn padded_event(shape: EventShape) -> Vec<u8> {
    event_with(shape, Some(("AWSPlaceholder", TRACE_HEADER)))
}

fn event_with(shape: EventShape, extra: Option<(&str, &str)>) -> Vec<u8> {
    let records: Vec<serde_json::Value> = (0..shape.records)
        .map(|i| {
            let mut order = serde_json::json!({
                "order_id": format!("order-{i:08}"),
                "customer": format!("customer-{:05}", i % 9973),
                "sequence": i,
                "amount_cents": (i * 7919) % 100_000,
                "currency": "EUR",
                "note": "",
            });
            let unpadded = order.to_string().len();
            order["note"] = serde_json::Value::String(
                "x".repeat(shape.body_bytes.saturating_sub(unpadded)),
            );
            let mut attributes = serde_json::json!({
                "ApproximateReceiveCount": "1",
                "SentTimestamp": "1763700000000",
                "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                "ApproximateFirstReceiveTimestamp": "1763700000100"
            });
            if let Some((name, value)) = extra {
                attributes[name] = serde_json::Value::String(value.to_string());
            }
            serde_json::json!({
                "messageId": message_id(i),
                "receiptHandle": format!("AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a+Hh0jqDA/LYJlPsN2Y4eyJ1mFv0a0RXcLZ5uM6F4B2gbC0q4S0cj40L1Ss/AQUvEJTZ7U09yg{i:012}=="),
                "body": order.to_string(),
                "attributes": attributes,
                "messageAttributes": {},
                "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
                "awsRegion": "us-east-1"
            })
        })
        .collect();
    serde_json::json!({ "Records": records })
        .to_string()
        .into_bytes()
}

/// The typed body both sides parse.
#[derive(Debug, Deserialize)]
#[allow(dead_code)] // the fields are the parse's result; reading them is not the work
struct Order<'a> {
    #[serde(borrow)]
    order_id: Cow<'a, str>,
    #[serde(borrow)]
    customer: Cow<'a, str>,
    sequence: u64,
    amount_cents: u64,
    #[serde(borrow)]
    currency: Cow<'a, str>,
    #[serde(borrow)]
    note: Cow<'a, str>,
}

/// The benchmark's per-record work as a [`Processor`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OrderChecksum;

impl Processor for OrderChecksum {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let order: Order<'_> = serde_json::from_str(&item.body)
            .map_err(|e| ProcessError::validation(format!("not an order: {e}")))?;
        let digest = sha256(item.body.as_bytes());
        std::hint::black_box(&digest);
        if order.sequence.is_multiple_of(100) {
            return Err(ProcessError::new(
                ErrorClass::Unknown,
                "deterministic failure",
            ));
        }
        Ok(Outcome::Done)
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// The worker configured for the benchmark: no retries (a failure is reported at once, as
/// Powertools does), no dead-letter store, body checked by the handler itself.
type BenchWorker = Worker<OrderChecksum, NoDeadLetterStore>;

fn bench_worker() -> &'static BenchWorker {
    let config = BatchConfig {
        parser: ItemParser {
            id_source: ItemIdSource::MessageId,
            body_format: BodyFormat::Text,
            envelope: Default::default(),
        },
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        concurrency: 1,
        ..BatchConfig::default()
    };
    let worker = Worker::new(
        BatchProcessor::new(OrderChecksum, NoDeadLetterStore, config),
        Duration::from_secs(1),
    )
    .without_metrics();
    Box::leak(Box::new(worker))
}

/// The worker's invocation path as the function binary runs it: the raw body enters
/// [`WorkerLayer`] (decode, batch), and the small outcome goes through what the runtime
/// does for the handler behind it — `serde_path_to_error` over `serde_json` into the
/// payload type, [`respond`], `serde_json` of the response.
async fn ours(worker: &'static BenchWorker, raw: bytes::Bytes) -> Vec<u8> {
    let response = Arc::new(Mutex::new(Vec::new()));
    let slot = response.clone();
    let runtime_response_path = service_fn(move |invocation: LambdaInvocation| {
        let slot = slot.clone();
        async move {
            let jd = &mut serde_json::Deserializer::from_slice(&invocation.body);
            let outcome: HandlerOutcome = serde_path_to_error::deserialize(jd)?;
            let bytes = match respond(LambdaEvent::new(outcome, invocation.context)).await {
                Ok(response) => serde_json::to_vec(&response)?,
                Err(diagnostic) => serde_json::to_vec(&diagnostic)?,
            };
            if let Ok(mut slot) = slot.lock() {
                *slot = bytes;
            }
            Ok::<(), lambda_runtime::Error>(())
        }
    });
    let mut service = WorkerLayer::new(worker).layer(runtime_response_path);
    let mut context = lambda_runtime::Context::default();
    context.deadline = u64::try_from(
        (std::time::SystemTime::now() + Duration::from_secs(900))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX);
    let invocation = LambdaInvocation {
        parts: http::Response::new(()).into_parts().0,
        body: raw,
        context,
    };
    if service.call(invocation).await.is_err() {
        return Vec::new();
    }
    let bytes = response.lock().map(|r| r.clone()).unwrap_or_default();
    bytes
}

/// The floor: only deserializing the event with `serde_json` into `SqsEvent`.
fn floor(raw: &[u8]) -> usize {
    serde_json::from_slice::<SqsEvent>(raw)
        .map(|e| e.records.len())
        .unwrap_or(0)
}

/// The worker's decoder alone on the same bytes: the records borrowing from them, as the
/// worker decodes an invocation.
fn decoder(raw: &[u8]) -> usize {
    sqs_keeper_core::event::decode_event(raw)
        .map(|e| e.records.len())
        .unwrap_or(0)
}

/// The per-record work alone over bodies already decoded: no runtime, decode or engine.
fn work_only(bodies: &[String]) -> usize {
    bodies
        .iter()
        .filter(|body| {
            let digest = sha256(body.as_bytes());
            std::hint::black_box(&digest);
            serde_json::from_str::<Order<'_>>(body).is_ok_and(|o| o.sequence % 100 != 0)
        })
        .count()
}

/// Powertools' figures for one event, from `scripts/bench-python.sh`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerRun {
    /// `aws-lambda-powertools` version.
    pub powertools_version: String,
    /// Python version.
    pub python_version: String,
    /// Median µs per record.
    pub us_per_record: f64,
}

/// Figures for one event shape.
#[derive(Debug, Clone, Serialize)]
pub struct CpuRun {
    /// Records in the event.
    pub records: usize,
    /// Body size.
    pub body_bytes: usize,
    /// Event size.
    pub event_bytes: usize,
    /// Our whole path, µs per record (median of the iterations).
    pub ours_us_per_record: f64,
    /// Floor: serde_json into `SqsEvent` only, µs per record.
    pub floor_us_per_record: f64,
    /// The worker's decoder alone, µs per record.
    pub decoder_us_per_record: f64,
    /// The per-record work alone (SHA-256 + typed parse), µs per record.
    pub work_us_per_record: f64,
    /// Powertools on the same bytes.
    pub powertools: PeerRun,
    /// ours ÷ Powertools (goals: [`goals`]).
    pub powertools_ratio: f64,
    /// work alone ÷ Powertools: no handler doing this work can go below it.
    pub work_powertools_ratio: f64,
    /// ours ÷ floor (goals: [`goals`]).
    pub floor_ratio: f64,
    /// decoder ÷ floor.
    pub decoder_floor_ratio: f64,
    /// Our whole path on the same event with every record traced (an `AWSTraceHeader`),
    /// no tracing subscriber installed, µs per record.
    pub traced_us_per_record: f64,
    /// Our whole path on the traced event's bytes without a trace ([`padded_event`]).
    pub padded_us_per_record: f64,
    /// traced ÷ padded: what following a record's trace costs with tracing off (goal:
    /// [`TRACED_GOAL`]).
    pub traced_ratio: f64,
    /// Every response was the same bytes (ours, traced, padded, and Powertools').
    pub responses_identical: bool,
    /// `batchItemFailures` entries in the response.
    pub failures_reported: usize,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn timed(f: impl FnOnce() -> usize) -> Duration {
    let start = Instant::now();
    std::hint::black_box(f());
    start.elapsed()
}

/// Runs `scripts/bench-python.sh` (creates its venv on first use) on an event file.
fn powertools(event: &Path, response: &Path, iterations: usize) -> Result<PeerRun, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench-python.sh");
    let output = std::process::Command::new(&script)
        .arg("--event")
        .arg(event)
        .arg("--iterations")
        .arg(iterations.to_string())
        .arg("--response-out")
        .arg(response)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| {
        format!(
            "unexpected output from {}: {e}: {}",
            script.display(),
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Runs every shape; event files and both responses are kept in `work_dir`.
pub async fn run(iterations: usize, work_dir: &Path) -> Result<Vec<CpuRun>, String> {
    std::fs::create_dir_all(work_dir)
        .map_err(|e| format!("cannot create {}: {e}", work_dir.display()))?;
    let worker = bench_worker();
    let mut runs = Vec::new();
    for shape in SHAPES {
        let raw = event(shape);
        let traced = traced_event(shape);
        let padded = padded_event(shape);
        let name = format!("{}x{}", shape.records, shape.body_bytes);
        let event_path = work_dir.join(format!("event-{name}.json"));
        let peer_response_path = work_dir.join(format!("response-{name}-powertools.json"));
        std::fs::write(&event_path, &raw)
            .map_err(|e| format!("cannot write {}: {e}", event_path.display()))?;

        let bodies: Vec<String> = serde_json::from_slice::<SqsEvent>(&raw)
            .map_err(|e| format!("the generated event does not decode: {e}"))?
            .records
            .into_iter()
            .filter_map(|r| r.body)
            .collect();
        // The six measures take turns within each iteration, so a slow spell on a shared
        // machine hits all of them rather than skewing one ratio.
        let mut ours_times = Vec::with_capacity(iterations);
        let mut traced_times = Vec::with_capacity(iterations);
        let mut padded_times = Vec::with_capacity(iterations);
        let mut padded_response = Vec::new();
        let mut traced_response = Vec::new();
        let mut floor_times = Vec::with_capacity(iterations);
        let mut decoder_times = Vec::with_capacity(iterations);
        let mut work_times = Vec::with_capacity(iterations);
        let mut response = Vec::new();
        for _ in 0..iterations {
            // The runtime receives the body as `Bytes` and hands it over; making them is
            // not the handler's cost.
            let body = bytes::Bytes::from(raw.clone());
            let start = Instant::now();
            response = ours(worker, body).await;
            ours_times.push(start.elapsed());
            let body = bytes::Bytes::from(traced.clone());
            let start = Instant::now();
            traced_response = ours(worker, body).await;
            traced_times.push(start.elapsed());
            let body = bytes::Bytes::from(padded.clone());
            let start = Instant::now();
            padded_response = ours(worker, body).await;
            padded_times.push(start.elapsed());
            floor_times.push(timed(|| floor(&raw)));
            decoder_times.push(timed(|| decoder(&raw)));
            work_times.push(timed(|| work_only(&bodies)));
        }
        std::fs::write(
            work_dir.join(format!("response-{name}-ours.json")),
            &response,
        )
        .map_err(|e| format!("cannot write the response: {e}"))?;
        let floor_time = median(floor_times);
        let decoder_time = median(decoder_times);
        let work_time = median(work_times);

        let peer = powertools(&event_path, &peer_response_path, iterations)?;
        let peer_response = std::fs::read(&peer_response_path)
            .map_err(|e| format!("cannot read {}: {e}", peer_response_path.display()))?;

        let per_record = |d: Duration| d.as_secs_f64() * 1e6 / shape.records as f64;
        let ours_us = per_record(median(ours_times));
        let traced_us = per_record(median(traced_times));
        let padded_us = per_record(median(padded_times));
        let floor_us = per_record(floor_time);
        let decoder_us = per_record(decoder_time);
        let work_us = per_record(work_time);
        let failures_reported = serde_json::from_slice::<serde_json::Value>(&response)
            .ok()
            .and_then(|v| v["batchItemFailures"].as_array().map(Vec::len))
            .unwrap_or(0);
        runs.push(CpuRun {
            records: shape.records,
            body_bytes: shape.body_bytes,
            event_bytes: raw.len(),
            ours_us_per_record: ours_us,
            floor_us_per_record: floor_us,
            decoder_us_per_record: decoder_us,
            work_us_per_record: work_us,
            powertools_ratio: ours_us / peer.us_per_record,
            work_powertools_ratio: work_us / peer.us_per_record,
            powertools: peer,
            floor_ratio: ours_us / floor_us,
            decoder_floor_ratio: decoder_us / floor_us,
            traced_us_per_record: traced_us,
            padded_us_per_record: padded_us,
            traced_ratio: traced_us / padded_us,
            responses_identical: response == peer_response
                && traced_response == response
                && padded_response == response,
            failures_reported,
        });
    }
    let identical = runs.iter().all(|r| r.responses_identical);
    if !identical {
        return Err(format!(
            "the responses differ from Powertools' (see {}): {runs:#?}",
            work_dir.display()
        ));
    }
    Ok(runs)
}

/// The figures as a table.
pub fn render(runs: &[CpuRun]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                format!(
                    "{} × {} B ({:.1} MB)",
                    r.records,
                    r.body_bytes,
                    r.event_bytes as f64 / 1e6
                ),
                format!("{:.2}", r.ours_us_per_record),
                format!("{:.2}", r.powertools.us_per_record),
                format!("{:.3}×", r.powertools_ratio),
                format!("{:.3}×", r.work_powertools_ratio),
                format!("{:.2}", r.floor_us_per_record),
                format!("{:.2}×", r.floor_ratio),
                format!("{:.2}×", r.decoder_floor_ratio),
                format!("{:.3}×", r.traced_ratio),
                format!(
                    "{} ({} failures)",
                    if r.responses_identical { "yes" } else { "NO" },
                    r.failures_reported
                ),
            ]
        })
        .collect();
    sqs_keeper_core::analysis::table(
        &[
            "EVENT",
            "OURS µs/rec",
            "POWERTOOLS µs/rec",
            "OURS÷PT (goal ≤ 0.15 at 400 B, 0.32 at 5 KB)",
            "WORK ALONE÷PT",
            "FLOOR µs/rec",
            "OURS÷FLOOR (goal ≤ 1.0 at 400 B)",
            "DECODER÷FLOOR",
            "TRACED÷UNTRACED (goal ≤ 1.05)",
            "SAME RESPONSE",
        ],
        &rows,
    )
}
