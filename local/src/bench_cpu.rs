//! `local bench-cpu`: per-record CPU of the worker's whole invocation path — raw event
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
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::SqsEvent;
use lambda_runtime::LambdaEvent;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sqs_worker::batch::{BatchConfig, BatchProcessor};
use sqs_worker::dead_letter::NoDeadLetterStore;
use sqs_worker::error::{ErrorClass, ProcessError};
use sqs_worker::item::{BodyFormat, ItemIdSource, ItemParser, WorkItem};
use sqs_worker::processor::{Outcome, Processor};
use sqs_worker::retry::RetryPolicy;
use sqs_worker::worker::Worker;

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

/// The message id of record `i` (the Python generator uses the same).
pub fn message_id(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

/// A Lambda SQS event with `Order` bodies of about `body_bytes` each.
pub fn event(shape: EventShape) -> Vec<u8> {
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
            serde_json::json!({
                "messageId": message_id(i),
                "receiptHandle": format!("AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a+Hh0jqDA/LYJlPsN2Y4eyJ1mFv0a0RXcLZ5uM6F4B2gbC0q4S0cj40L1Ss/AQUvEJTZ7U09yg{i:012}=="),
                "body": order.to_string(),
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
        if order.sequence % 100 == 0 {
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
fn bench_worker() -> Worker<OrderChecksum, NoDeadLetterStore> {
    let config = BatchConfig {
        parser: ItemParser {
            id_source: ItemIdSource::MessageId,
            body_format: BodyFormat::Text,
        },
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        concurrency: 1,
        ..BatchConfig::default()
    };
    Worker::new(
        BatchProcessor::new(OrderChecksum, NoDeadLetterStore, config),
        Duration::from_secs(1),
    )
    .without_metrics()
}

/// The worker's invocation path as the function binary runs it: the runtime's decode of
/// the body (`lambda_runtime` deserializes the payload type, here the raw JSON, through
/// `serde_path_to_error` over `serde_json`), [`Worker::handle`], and the runtime's
/// serialization of the response.
async fn ours(worker: &Worker<OrderChecksum, NoDeadLetterStore>, raw: &[u8]) -> Vec<u8> {
    let jd = &mut serde_json::Deserializer::from_slice(raw);
    let payload: Box<RawValue> = match serde_path_to_error::deserialize(jd) {
        Ok(payload) => payload,
        Err(_) => return Vec::new(),
    };
    let mut context = lambda_runtime::Context::default();
    context.deadline = u64::try_from(
        (std::time::SystemTime::now() + Duration::from_secs(900))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX);
    match worker.handle(LambdaEvent::new(payload, context)).await {
        Ok(response) => serde_json::to_vec(&response).unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

fn floor(raw: &[u8]) -> usize {
    serde_json::from_slice::<SqsEvent>(raw)
        .map(|e| e.records.len())
        .unwrap_or(0)
}

/// Figures for one shape.
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
    /// serde_json into `SqsEvent` only, µs per record.
    pub floor_us_per_record: f64,
    /// ours ÷ floor.
    pub floor_ratio: f64,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Runs every shape.
pub async fn run(iterations: usize, _out_dir: &Path) -> Result<Vec<CpuRun>, String> {
    let worker = bench_worker();
    let mut runs = Vec::new();
    for shape in SHAPES {
        let raw = event(shape);
        let mut ours_t = Vec::new();
        let mut floor_t = Vec::new();
        for _ in 0..iterations {
            let start = Instant::now();
            let response = ours(&worker, &raw).await;
            ours_t.push(start.elapsed());
            std::hint::black_box(response);
            let start = Instant::now();
            std::hint::black_box(floor(&raw));
            floor_t.push(start.elapsed());
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / shape.records as f64;
        let ours_us = per(median(ours_t));
        let floor_us = per(median(floor_t));
        runs.push(CpuRun {
            records: shape.records,
            body_bytes: shape.body_bytes,
            event_bytes: raw.len(),
            ours_us_per_record: ours_us,
            floor_us_per_record: floor_us,
            floor_ratio: ours_us / floor_us,
        });
    }
    Ok(runs)
}

/// Experimental decoders (temporary).
pub mod experiment {
    use super::*;
    use std::collections::HashMap;

    #[derive(Deserialize)]
    struct EventRef<'a> {
        #[serde(rename = "Records", borrow)]
        records: Vec<RecordRef<'a>>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct RecordRef<'a> {
        #[serde(borrow)]
        message_id: Option<Cow<'a, str>>,
        #[serde(borrow)]
        receipt_handle: Option<Cow<'a, str>>,
        #[serde(borrow)]
        body: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        attributes: HashMap<Cow<'a, str>, Cow<'a, str>>,
        #[serde(borrow)]
        md5_of_body: Option<Cow<'a, str>>,
        #[serde(borrow, rename = "eventSourceARN")]
        event_source_arn: Option<Cow<'a, str>>,
    }

    fn time(label: &str, records: usize, iterations: usize, mut f: impl FnMut() -> usize) {
        let mut t = Vec::new();
        for _ in 0..iterations {
            let s = Instant::now();
            std::hint::black_box(f());
            t.push(s.elapsed());
        }
        let us = median(t).as_secs_f64() * 1e6 / records as f64;
        eprintln!("{label:40} {us:.3} us/record");
    }

    /// Prints decoder timings.
    pub fn run(iterations: usize) {
        for shape in SHAPES {
            let raw = event(shape);
            let n = shape.records;
            let s = std::str::from_utf8(&raw).unwrap_or("");
            eprintln!("shape {shape:?} {} bytes", raw.len());
            time("serde_json SqsEvent", n, iterations, || {
                serde_json::from_slice::<SqsEvent>(&raw)
                    .map(|e| e.records.len())
                    .unwrap_or(0)
            });
            time("serde_json RawValue (path_to_error)", n, iterations, || {
                let jd = &mut serde_json::Deserializer::from_slice(&raw);
                serde_path_to_error::deserialize::<_, Box<serde_json::value::RawValue>>(jd)
                    .map(|e| e.get().len())
                    .unwrap_or(0)
            });
            time("serde_json borrowed", n, iterations, || {
                serde_json::from_str::<EventRef<'_>>(s)
                    .map(|e| e.records.len())
                    .unwrap_or(0)
            });
            time("decode_sqs_event", n, iterations, || {
                sqs_worker::event::decode_sqs_event(s)
                    .map(|e| e.records.len())
                    .unwrap_or(0)
            });
            time("sonic Value", n, iterations, || {
                sonic_rs::from_str::<sonic_rs::Value>(s)
                    .map(|_| 1)
                    .unwrap_or(0)
            });
            time("sonic SqsEvent", n, iterations, || {
                sonic_rs::from_slice::<SqsEvent>(&raw)
                    .map(|e| e.records.len())
                    .unwrap_or(0)
            });
            time("sonic borrowed", n, iterations, || {
                sonic_rs::from_str::<EventRef<'_>>(s)
                    .map(|e| e.records.len())
                    .unwrap_or(0)
            });
            let bodies: Vec<String> = serde_json::from_slice::<SqsEvent>(&raw)
                .map(|e| e.records.into_iter().filter_map(|r| r.body).collect())
                .unwrap_or_default();
            time("sha2 bodies", n, iterations, || {
                bodies
                    .iter()
                    .map(|b| sha256(b.as_bytes())[0] as usize)
                    .sum()
            });
            time("aws-lc sha256 bodies", n, iterations, || {
                bodies
                    .iter()
                    .map(|b| {
                        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b.as_bytes()).as_ref()
                            [0] as usize
                    })
                    .sum()
            });
            time("serde_json Order", n, iterations, || {
                bodies
                    .iter()
                    .filter_map(|b| serde_json::from_str::<Order<'_>>(b).ok())
                    .count()
            });
            time("sonic Order", n, iterations, || {
                bodies
                    .iter()
                    .filter_map(|b| sonic_rs::from_str::<Order<'_>>(b).ok())
                    .count()
            });
        }
    }
}
