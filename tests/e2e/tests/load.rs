//! Load with exact accounting: many messages through the local pipeline with injected
//! downstream failures (5 % of the messages) and AWS faults on the worker's calls (about
//! 1 % of the messages, seeded), then every
//! message is accounted for: done + skipped + dead-lettered = sent, no duplicate record,
//! and every dead-lettered item has one record, one DLQ message and, when large, its S3
//! object.
//!
//! `LOAD_MESSAGES` sets the size (default 300, what `make test` runs); `make soak` runs
//! 5,000. The throughput seen is printed (`-- --nocapture`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use e2e::{emulator, Pipeline, Setup};
use sqs_keeper_core::dead_letter::DeadLetteredItem;
use sqs_keeper_core::dead_letter::PayloadLocation;
use sqs_keeper_core::message::ITEM_ID_ATTRIBUTE;
use sqs_keeper_local::esm::EsmStats;
use sqs_keeper_local::fault_proxy::{Fault, FaultProxy, Matcher, Rule, Service, Trigger};

/// What the downstream does with item `i`: 3 % permanently invalid (one in three of those
/// with a 70 KB body, offloaded to S3), 2 % failing twice then succeeding, 1 % already
/// processed (208), the rest fine.
fn scenario(i: usize) -> &'static str {
    match i % 100 {
        0..=2 => "invalid",
        3..=4 => "flaky",
        5 => "duplicate",
        _ => "ok",
    }
}

fn large(i: usize) -> bool {
    i.is_multiple_of(300)
}

fn load_body(i: usize) -> String {
    let id = format!("load-{i:05}");
    let mut body = serde_json::json!({"id": id, "scenario": scenario(i)});
    if large(i) {
        body["padding"] = serde_json::Value::String("x".repeat(70_000));
    }
    body.to_string()
}

async fn all_records(p: &Pipeline) -> Vec<DeadLetteredItem> {
    let mut records = Vec::new();
    let mut start = None;
    loop {
        let page = p
            .clients
            .dynamodb
            .scan()
            .table_name(&p.resources.table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        for item in page.items() {
            records.push(sqs_keeper_aws::schema::record_from_item(item).unwrap());
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            return records;
        }
    }
}

/// Item ids of every DLQ message (received and kept invisible so each is read once).
async fn all_dlq_item_ids(p: &Pipeline) -> Vec<String> {
    let mut ids = Vec::new();
    let mut empty_receives = 0;
    while empty_receives < 2 {
        let output = p
            .clients
            .sqs
            .receive_message()
            .queue_url(&p.resources.dlq_url)
            .max_number_of_messages(10)
            .visibility_timeout(600)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap();
        if output.messages().is_empty() {
            empty_receives += 1;
            continue;
        }
        for message in output.messages() {
            let id = message
                .message_attributes()
                .and_then(|a| a.get(ITEM_ID_ATTRIBUTE))
                .and_then(|v| v.string_value())
                .unwrap_or("<no item id>")
                .to_string();
            ids.push(id);
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_accounted_for_under_faults() {
    let total: usize = std::env::var("LOAD_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let proxy = FaultProxy::start(&emulator().await).await.unwrap();
    // AWS faults on the worker's calls (its dead-letter writes: the poller and the checks
    // below talk to the emulator directly), a different fault per service, seeded. The
    // worker calls AWS only for dead-lettered items (about 4 % of the messages here), so
    // one call in five fails: faults injected come to about 1 % of the messages. The SDK
    // retries each call (3 attempts), so most are absorbed; the rest make a record fail
    // and its message come back.
    for (service, fault, seed) in [
        (Service::DynamoDb, Fault::Throttling, 7),
        (Service::Sqs, Fault::ServiceUnavailable, 11),
        (Service::S3, Fault::InternalError, 13),
    ] {
        proxy.inject(Rule::new(
            Matcher::any(service),
            fault,
            Trigger::Fraction {
                fraction: 0.2,
                seed,
            },
        ));
    }
    let p = Pipeline::with_worker_endpoints(
        "load",
        Setup {
            // Flaky items need three deliveries; invalid ones are dead-lettered on the first.
            max_receive_count: 6,
            visibility_timeout_secs: 3,
            ..Setup::default()
        },
        &proxy.endpoints(),
    )
    .await;

    // Sent in waves of at most 500: the emulator's receive slows down badly with the
    // queue's depth (a few messages a second at 5,000 queued), which would measure moto.
    let bodies: Vec<String> = (0..total).map(load_body).collect();
    let started = Instant::now();
    let mut stats = EsmStats::default();
    for wave in bodies.chunks(500) {
        let refs: Vec<&str> = wave.iter().map(String::as_str).collect();
        p.send(&refs).await;
        let (wave_stats, drained) = p
            .esm
            .run_until_drained(&p.invoker, Duration::from_secs(600))
            .await
            .unwrap();
        assert!(drained, "the source queue did not drain: {wave_stats:?}");
        stats.invocations += wave_stats.invocations;
        stats.received += wave_stats.received;
    }
    let elapsed = started.elapsed();

    // The end state, from the downstream, the table, the DLQ and the bucket.
    let delivered: HashSet<String> = p.downstream.delivered().into_iter().collect();
    let records = all_records(&p).await;
    let dlq_ids = all_dlq_item_ids(&p).await;
    let objects: HashSet<String> = p.objects().await.into_iter().collect();

    let mut done = 0;
    let mut skipped = 0;
    let mut dead = 0;
    let mut duplicate_deliveries = 0;
    let record_ids: HashMap<&str, &DeadLetteredItem> =
        records.iter().map(|r| (r.item_id.as_str(), r)).collect();
    assert_eq!(record_ids.len(), records.len(), "duplicate records");
    for i in 0..total {
        let id = format!("load-{i:05}");
        let calls = p.downstream.calls(&id);
        match scenario(i) {
            "ok" | "flaky" => {
                assert!(delivered.contains(&id), "{id} was never delivered");
                assert!(!record_ids.contains_key(id.as_str()), "{id} has a record");
                let expected_calls = if scenario(i) == "flaky" { 3 } else { 1 };
                duplicate_deliveries += calls.saturating_sub(expected_calls);
                done += 1;
            }
            "duplicate" => {
                assert!(calls >= 1, "{id} never reached the downstream");
                assert!(!record_ids.contains_key(id.as_str()), "{id} has a record");
                duplicate_deliveries += calls.saturating_sub(1);
                skipped += 1;
            }
            _ => {
                let record = record_ids
                    .get(id.as_str())
                    .unwrap_or_else(|| panic!("{id} was dead-lettered without a record"));
                assert!(
                    !delivered.contains(&id),
                    "{id} was both delivered and dead-lettered"
                );
                let attempt_ids: HashSet<&str> = record
                    .failure_history
                    .iter()
                    .map(|f| f.attempt_id.as_str())
                    .collect();
                assert_eq!(
                    attempt_ids.len(),
                    record.failure_history.len(),
                    "{id}: an attempt recorded twice"
                );
                assert_eq!(
                    record.failure_count as usize,
                    record.failure_history.len(),
                    "{id}: count and history disagree"
                );
                match &record.payload.location {
                    PayloadLocation::S3 { key, .. } => {
                        assert!(large(i), "{id}: a small body went to S3");
                        assert!(objects.contains(key), "{id}: its S3 object is missing");
                    }
                    PayloadLocation::Inline { .. } => {
                        assert!(!large(i), "{id}: a large body stayed inline")
                    }
                }
                dead += 1;
            }
        }
    }
    let mut dlq_counts: BTreeMap<&str, usize> = BTreeMap::new();
    for id in &dlq_ids {
        *dlq_counts.entry(id.as_str()).or_default() += 1;
    }
    let extra_dlq: Vec<_> = dlq_counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        extra_dlq.is_empty(),
        "items with other than one DLQ message: {extra_dlq:?}"
    );
    assert_eq!(
        dlq_ids.len(),
        dead,
        "one DLQ message per dead-lettered item"
    );
    assert_eq!(records.len(), dead, "one record per dead-lettered item");
    assert_eq!(
        objects.len(),
        (0..total)
            .filter(|i| large(*i) && scenario(*i) == "invalid")
            .count(),
        "one S3 object per large dead-lettered item, no orphan"
    );
    assert_eq!(
        done + skipped + dead,
        total,
        "done + skipped + dead-lettered = sent"
    );
    assert_eq!(p.source_depth().await, 0);

    let injected: u64 = proxy.injected().values().sum();
    let aws_calls: u64 = proxy.calls_by_operation().values().sum();
    assert!(
        injected > 0,
        "no AWS fault was injected in {aws_calls} calls"
    );
    eprintln!(
        "load: {total} messages sent and drained in {:.1} s ({:.1} msg/s end to end); \
         done {done}, skipped {skipped}, dead-lettered {dead} (with S3 payload {}), lost 0, \
         duplicate records 0, duplicate downstream deliveries {duplicate_deliveries}; \
         {} invocations, {} receives; AWS faults injected {injected} ({:.1} % of the messages) in {aws_calls} worker calls: {:?}",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        objects.len(),
        stats.invocations,
        stats.received,
        injected as f64 * 100.0 / total as f64,
        proxy.injected(),
    );
}
