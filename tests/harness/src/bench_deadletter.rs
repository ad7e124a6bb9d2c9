//! `keeper bench` (dead-letter part): what dead-lettering adds per item, against the
//! emulator through the real SDK clients — latency against a successful item in the same
//! run, and AWS API calls per dead-lettered item (the record's conditional write, the
//! batched DLQ send, an S3 write only for large payloads).

use futures::StreamExt;
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use serde::Serialize;
use sqs_keeper_aws::DeadLetterStore;
use sqs_keeper_aws::{AwsClients, CallCounter, Endpoints};
use sqs_keeper_core::dead_letter::InvocationInfo;
use sqs_keeper_core::retry::Deadline;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::WorkItem;
use sqs_keeper_core::{BatchConfig, BatchProcessor};
use sqs_keeper_core::{Outcome, Processor};

use crate::resources::{PipelineResources, ResourceSpec};

/// Succeeds, or fails permanently when the body says `fail`.
#[derive(Debug, Clone, Copy)]
struct Verdict;

impl Processor for Verdict {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        if item.body.contains("\"fail\"") {
            Err(ProcessError::validation("rejected by the benchmark"))
        } else {
            Ok(Outcome::Done)
        }
    }
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterBench {
    /// Records per batch.
    pub batch_size: usize,
    /// Batches of each kind measured.
    pub batches: usize,
    /// Median wall time of an all-success batch, ms.
    pub ok_batch_ms: f64,
    /// Median wall time of an all-dead-lettered batch, ms.
    pub dead_letter_batch_ms: f64,
    /// (dead-letter batch − success batch) ÷ batch size, ms per item (goal < 5 ms).
    pub added_ms_per_item: f64,
    /// Median wall time of a batch with one dead-lettered record among successes, minus the
    /// all-success batch: the latency one failure adds to its invocation, ms.
    pub single_failure_added_ms: f64,
    /// AWS API calls per dead-lettered item, all batches (goal ≤ 1.2).
    pub calls_per_item: f64,
    /// Calls by operation over all dead-letter batches.
    pub calls_by_operation: std::collections::BTreeMap<String, u64>,
    /// Median `GetItem` round trip on the same emulator, ms: the floor of any call.
    pub get_item_floor_ms: f64,
    /// Median plain `UpdateItem` round trip (one attribute, no condition), ms: the floor of
    /// any write on this emulator.
    pub update_item_floor_ms: f64,
    /// The emulator's own floor for a batch: `batch_size` conditional UpdateItems of new
    /// items, as many at a time as the store writes them, median ms.
    pub concurrent_updates_floor_ms: f64,
    /// How many writes the store (and the floor above) keeps in flight.
    pub write_concurrency: usize,
    /// Mean round trip per call during the all-dead-lettered batches, by operation, ms
    /// (calls overlap, so these do not add up to the batch's time).
    pub mean_call_ms_by_operation: std::collections::BTreeMap<String, f64>,
    /// One such conditional UpdateItem alone, median ms.
    pub one_update_floor_ms: f64,
}

fn batch(run: &str, size: usize, failing: impl Fn(usize) -> bool) -> SqsEvent {
    let mut event = SqsEvent::default();
    for i in 0..size {
        let mut message = SqsMessage::default();
        message.message_id = Some(format!("{run}-{i:04}"));
        message.body = Some(
            serde_json::json!({
                "id": format!("{run}-{i:04}"),
                "scenario": if failing(i) { "fail" } else { "ok" },
            })
            .to_string(),
        );
        message.attributes = [
            ("ApproximateReceiveCount", "1"),
            ("SentTimestamp", "1763700000000"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        message.event_source_arn = Some("arn:aws:sqs:us-east-1:123456789012:bench".to_string());
        event.records.push(message);
    }
    event
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get(v.len() / 2)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

/// Runs the measurement on fresh resources named `prefix`.
pub async fn run(
    endpoints: &Endpoints,
    prefix: &str,
    batch_size: usize,
    batches: usize,
) -> Result<DeadLetterBench, String> {
    let clients = AwsClients::for_endpoints(endpoints, "us-east-1").await;
    let spec = ResourceSpec {
        prefix: prefix.to_string(),
        fifo: false,
        max_receive_count: 3,
        visibility_timeout_secs: 30,
    };
    PipelineResources::delete_existing(&clients, &spec).await;
    let resources = PipelineResources::create(&clients, &spec)
        .await
        .map_err(|e| format!("cannot create the benchmark's resources: {e}"))?;
    let counter = CallCounter::default();
    let shared = AwsClients::endpoint_config(endpoints, "us-east-1").await;
    let counted = AwsClients::counted(&shared, true, &counter);
    let store = DeadLetterStore::new(counted.clone(), resources.store_config());
    let engine = BatchProcessor::new(Verdict, store, BatchConfig::default());
    let invocation = InvocationInfo::default();
    let deadline = || Deadline::after(Duration::from_secs(60), Duration::from_secs(1));

    // Warm the connection pool so the first batch is not charged for it.
    let _ = counted
        .dynamodb
        .describe_table()
        .table_name(&resources.table)
        .send()
        .await;
    let mut floor = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        let _ = counted
            .dynamodb
            .get_item()
            .table_name(&resources.table)
            .key(
                sqs_keeper_aws::schema::ITEM_ID,
                aws_sdk_dynamodb::types::AttributeValue::S("absent".into()),
            )
            .send()
            .await;
        floor.push(start.elapsed());
    }

    let mut write_floor = Vec::new();
    for n in 0..20 {
        let start = Instant::now();
        let _ = counted
            .dynamodb
            .update_item()
            .table_name(&resources.table)
            .key(
                sqs_keeper_aws::schema::ITEM_ID,
                aws_sdk_dynamodb::types::AttributeValue::S("bench-scratch".into()),
            )
            .update_expression("SET touched = :n")
            .expression_attribute_values(
                ":n",
                aws_sdk_dynamodb::types::AttributeValue::N(n.to_string()),
            )
            .send()
            .await;
        write_floor.push(start.elapsed());
    }

    // What the emulator itself takes for a batch of conditional writes of new items, as
    // many at a time as the store writes them, against one alone: if it serialises
    // writes, that ratio is its, and ours can be no better.
    let write_concurrency = resources.store_config().write_concurrency.max(1);
    let conditional = |key: String| {
        let client = counted.dynamodb.clone();
        let table = resources.table.clone();
        async move {
            let _ = client
                .update_item()
                .table_name(table)
                .key(
                    sqs_keeper_aws::schema::ITEM_ID,
                    aws_sdk_dynamodb::types::AttributeValue::S(key),
                )
                .update_expression("SET touched = :n")
                .condition_expression("attribute_not_exists(touched)")
                .expression_attribute_values(
                    ":n",
                    aws_sdk_dynamodb::types::AttributeValue::N("1".into()),
                )
                .send()
                .await;
        }
    };
    let (mut many_floor, mut one_floor) = (Vec::new(), Vec::new());
    for n in 0..batches {
        let start = Instant::now();
        conditional(format!("floor-one-{n}")).await;
        one_floor.push(start.elapsed());
        let start = Instant::now();
        futures::stream::iter((0..batch_size).map(|i| conditional(format!("floor-{n}-{i}"))))
            .buffer_unordered(write_concurrency)
            .collect::<Vec<()>>()
            .await;
        many_floor.push(start.elapsed());
    }

    let (mut ok, mut dead, mut single) = (Vec::new(), Vec::new(), Vec::new());
    let mut dead_lettered = 0usize;
    let mut calls = std::collections::BTreeMap::<String, u64>::new();
    let mut waited = std::collections::BTreeMap::<String, Duration>::new();
    for n in 0..batches {
        let start = Instant::now();
        engine
            .process_batch(
                batch(&format!("ok{n}"), batch_size, |_| false),
                deadline(),
                &invocation,
            )
            .await
            .map_err(|e| e.to_string())?;
        ok.push(start.elapsed());

        counter.reset();
        let start = Instant::now();
        let report = engine
            .process_batch(
                batch(&format!("dl{n}"), batch_size, |_| true),
                deadline(),
                &invocation,
            )
            .await
            .map_err(|e| e.to_string())?;
        dead.push(start.elapsed());
        let counts = report.counts();
        if counts.dead_lettered != batch_size {
            return Err(format!(
                "expected {batch_size} dead-lettered records, got {counts:?}"
            ));
        }
        dead_lettered += counts.dead_lettered;
        for (operation, count) in counter.snapshot() {
            *calls.entry(operation).or_default() += count;
        }
        for (operation, time) in counter.latency() {
            *waited.entry(operation).or_default() += time;
        }

        let start = Instant::now();
        engine
            .process_batch(
                batch(&format!("one{n}"), batch_size, |i| i == 0),
                deadline(),
                &invocation,
            )
            .await
            .map_err(|e| e.to_string())?;
        single.push(start.elapsed());
    }
    let ok_ms = median(ok);
    let dead_ms = median(dead);
    let total_calls: u64 = calls.values().sum();
    Ok(DeadLetterBench {
        batch_size,
        batches,
        ok_batch_ms: ok_ms,
        dead_letter_batch_ms: dead_ms,
        added_ms_per_item: (dead_ms - ok_ms) / batch_size as f64,
        single_failure_added_ms: median(single) - ok_ms,
        calls_per_item: total_calls as f64 / dead_lettered.max(1) as f64,
        get_item_floor_ms: median(floor),
        update_item_floor_ms: median(write_floor),
        concurrent_updates_floor_ms: median(many_floor),
        one_update_floor_ms: median(one_floor),
        write_concurrency,
        mean_call_ms_by_operation: waited
            .iter()
            .map(|(operation, time)| {
                let n = calls.get(operation).copied().unwrap_or(1).max(1);
                (operation.clone(), time.as_secs_f64() * 1000.0 / n as f64)
            })
            .collect(),
        calls_by_operation: calls,
    })
}

/// The figures as lines of text.
pub fn render(b: &DeadLetterBench) -> String {
    format!(
        "dead-lettering, {} batches of {} records against the emulator:\n\
         \x20 all-success batch {:.1} ms, all-dead-lettered batch {:.1} ms: +{:.2} ms per dead-lettered item (goal < 5 ms)\n\
         \x20 one dead-lettered record in a batch adds {:.1} ms to it (round trips here: GetItem {:.1} ms, plain UpdateItem {:.1} ms)\n\
         \x20 AWS calls per dead-lettered item: {:.2} (goal ≤ 1.2): {:?}\n\
         \x20 mean round trip per call, ms: {:?}\n\
         \x20 the emulator's floor: {} conditional UpdateItems {} at a time {:.1} ms, one {:.1} ms\n",
        b.batches,
        b.batch_size,
        b.ok_batch_ms,
        b.dead_letter_batch_ms,
        b.added_ms_per_item,
        b.single_failure_added_ms,
        b.get_item_floor_ms,
        b.update_item_floor_ms,
        b.calls_per_item,
        b.calls_by_operation,
        b.mean_call_ms_by_operation,
        b.batch_size,
        b.write_concurrency,
        b.concurrent_updates_floor_ms,
        b.one_update_floor_ms,
    )
}
