//! The fault-injection matrix, end to end against the emulator. Each test puts one fault
//! between the pipeline and what it depends on, then asserts the end state once the
//! pipeline settles: source queue depth, DLQ messages, records (count, `failure_count`,
//! history, status) and payload objects.
//!
//! | fault | test |
//! | --- | --- |
//! | DynamoDB throttled, then 500s, while recording | `dynamodb_failing_while_recording_returns_the_record_until_it_is_recorded_once` |
//! | S3 down (503, reset) while offloading a large payload | `s3_failing_while_offloading_never_leaves_a_record_without_its_object` |
//! | DLQ send failing after the record was written | `dlq_send_failing_after_the_record_was_written_sends_one_dlq_message_later` |
//! | the worker process killed mid-batch | `worker_process_killed_mid_batch_loses_nothing` |
//! | an invocation running past its deadline | `invocation_past_its_deadline_reports_unstarted_records_and_runs_none_twice` |
//! | the same message delivered twice | `duplicate_deliveries_keep_one_record_without_repeated_history` |
//! | a downstream throttling storm | `downstream_throttling_storm_is_ridden_out_without_dead_letters` |
//! | DynamoDB throttled during a redrive: before the lease, after a failed or a successful reprocess | `redrive_with_dynamodb_throttled_leaves_items_dead_unleased_and_redrivable`, `redrive_failure_that_cannot_be_recorded_releases_the_lease`, `redrive_success_that_cannot_be_resolved_releases_the_lease` |
//! | two redrives of one selection at once, through a slow store | `concurrent_redrives_through_a_slow_store_process_each_item_once`, `concurrent_redrives_leave_no_dlq_message_of_a_resolved_item` |
//! | a purge whose record deletes fail | `a_purge_failing_midway_leaves_records_never_orphaned_dlq_messages` |
//!
//! AWS faults come from a `FaultProxy` between the code under test (the worker's or the
//! redrive engine's AWS clients) and the emulator. The poller, which stands for the Lambda
//! service, and every assertion talk to the emulator directly, so a fault only hits the
//! calls it is meant for. Each HTTP attempt is one proxy call: the SDK's standard retry mode
//! makes 3 attempts per operation, so a rule that always fires fails an operation after 3.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::SqsEvent;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName, QueueAttributeName};
use bytes::Bytes;
use e2e::{body, outcome_ids, Pipeline, Setup, REGION};
use serde_json::json;
use sqs_keeper_aws::AwsClients;
use sqs_keeper_aws::DeadLetterStore;
use sqs_keeper_core::item::ItemParser;
use sqs_keeper_core::pointer::S3Pointer;
use sqs_keeper_core::retry::Deadline;
use sqs_keeper_core::ErrorClass;
use sqs_keeper_core::{batch::Disposition, batch::NotStartedReason, BatchReport};
use sqs_keeper_core::{
    dead_letter::DeadLetteredItem, dead_letter::ItemStatus, dead_letter::PayloadLocation,
    DeadLetterReason,
};
use sqs_keeper_core::{
    redrive, redrive::ItemOutcomeKind, redrive::RedriveEngine, redrive::RedriveReport,
    redrive::RedriveRequest, redrive::RedriveSettings,
};
use sqs_keeper_core::{retry::RetryPolicy, Outcome, ProcessError, Processor, WorkItem};
use sqs_keeper_http::HttpDelivery;
use sqs_keeper_http::HttpDeliveryConfig;
use sqs_keeper_lambda::http_worker::DefaultWorker;
use sqs_keeper_local::esm::{EsmStats, Invoker};
use sqs_keeper_local::fault_proxy::{Fault, FaultProxy, Faults, Operation, Rule, Trigger};
use sqs_keeper_local::function::FunctionProcess;
use sqs_keeper_local::http_server::{text, Handler, Server};
use sqs_keeper_local::invokers::RuntimeApiInvoker;
use sqs_keeper_local::runtime_api::RuntimeApi;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A fault proxy in front of the emulator and a pipeline whose worker talks through it.
async fn behind_proxy(name: &str, setup: Setup) -> (FaultProxy, Pipeline) {
    let proxy = start_proxy().await;
    let p = Pipeline::with_worker_endpoints(name, setup, &proxy.endpoints()).await;
    (proxy, p)
}

async fn start_proxy() -> FaultProxy {
    FaultProxy::start(&e2e::emulator().await).await.unwrap()
}

async fn clients_via(proxy: &FaultProxy) -> AwsClients {
    AwsClients::for_endpoints(&proxy.endpoints(), REGION).await
}

/// Invokes the pipeline's in-process worker as [`sqs_keeper_local::invokers::InProcessInvoker`]
/// does, keeping each batch's full report (dispositions, not only the failure list) and how
/// long the invocation took.
struct Recorder<'a> {
    worker: &'a DefaultWorker,
    timeout: Duration,
    margin: Duration,
    reports: Mutex<Vec<(BatchReport, Duration)>>,
}

impl<'a> Recorder<'a> {
    fn new(p: &'a Pipeline) -> Self {
        Recorder::with_deadline(p, Duration::from_secs(10), Duration::from_millis(500))
    }

    /// Invocations of `timeout`, of which the last `margin` is kept free.
    fn with_deadline(p: &'a Pipeline, timeout: Duration, margin: Duration) -> Self {
        Recorder {
            worker: &p.invoker.worker,
            timeout,
            margin,
            reports: Mutex::new(Vec::new()),
        }
    }

    /// The reports so far, forgetting them.
    fn take(&self) -> Vec<(BatchReport, Duration)> {
        std::mem::take(&mut *self.reports.lock().unwrap())
    }

    /// The one report since the last `take`.
    fn only(&self) -> BatchReport {
        let mut reports = self.take();
        assert_eq!(reports.len(), 1, "expected one invocation: {reports:?}");
        reports.pop().unwrap().0
    }
}

impl Invoker for Recorder<'_> {
    async fn invoke(&self, event: Bytes) -> Result<Vec<String>, String> {
        let event: SqsEvent =
            serde_json::from_slice(&event).map_err(|e| format!("event does not decode: {e}"))?;
        let started = Instant::now();
        let report = self
            .worker
            .run(event, Deadline::after(self.timeout, self.margin), None)
            .await
            .map_err(|e| e.to_string())?;
        let failures = report
            .response()
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect();
        self.reports
            .lock()
            .unwrap()
            .push((report, started.elapsed()));
        Ok(failures)
    }
}

/// Polls until exactly `n` messages have been received (at most 20 s).
async fn deliver<I: Invoker>(p: &Pipeline, invoker: &I, n: u64) -> EsmStats {
    let mut stats = EsmStats::default();
    let start = Instant::now();
    while stats.received < n {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "only {} of {n} messages came back: {stats:?}",
            stats.received
        );
        p.esm.poll_once(invoker, &mut stats).await.unwrap();
    }
    assert_eq!(stats.received, n, "{stats:?}");
    stats
}

/// Polls until the source queue is empty (at most `max`).
async fn drain<I: Invoker>(p: &Pipeline, invoker: &I, max: Duration) -> EsmStats {
    let (stats, drained) = p.esm.run_until_drained(invoker, max).await.unwrap();
    assert!(drained, "source queue did not drain: {stats:?}");
    stats
}

/// The report of the record whose item id (or message id) is `id`.
fn disposition<'r>(report: &'r BatchReport, id: &str) -> &'r Disposition {
    &report
        .records
        .iter()
        .find(|r| r.item_id == id || r.message_id == id)
        .unwrap_or_else(|| panic!("no record {id} in {report:?}"))
        .disposition
}

/// The dead-letter failure's store error of record `id`.
fn sink_error<'r>(report: &'r BatchReport, id: &str) -> &'r str {
    match disposition(report, id) {
        Disposition::DeadLetterFailed { sink_error, .. } => sink_error,
        other => panic!("{id}: expected dead_letter_failed, got {other:?}"),
    }
}

/// Records sorted by item id.
async fn records(p: &Pipeline) -> Vec<DeadLetteredItem> {
    let mut records = p.records().await;
    records.sort_by(|a, b| a.item_id.cmp(&b.item_id));
    records
}

fn record_ids(records: &[DeadLetteredItem]) -> Vec<&str> {
    records.iter().map(|r| r.item_id.as_str()).collect()
}

fn attempt_ids(record: &DeadLetteredItem) -> Vec<&str> {
    record
        .failure_history
        .iter()
        .map(|f| f.attempt_id.as_str())
        .collect()
}

/// Item ids of the DLQ's messages, sorted (receives them: call once, at the end).
async fn dlq_item_ids(p: &Pipeline) -> Vec<String> {
    let mut ids: Vec<String> = p
        .dlq_messages()
        .await
        .iter()
        .map(|m| {
            m.message_attributes()
                .and_then(|a| a.get("item_id"))
                .and_then(|v| v.string_value())
                .unwrap_or("<no item_id>")
                .to_string()
        })
        .collect();
    ids.sort();
    ids
}

/// DLQ messages that can be received now (not held by anyone).
async fn visible_dlq(p: &Pipeline) -> u64 {
    let output = p
        .clients
        .sqs
        .get_queue_attributes()
        .queue_url(&p.resources.dlq_url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .unwrap();
    output
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// The lease owner written on a record, if any (not part of [`DeadLetteredItem`]).
async fn lease_owner(p: &Pipeline, item_id: &str) -> Option<String> {
    p.clients
        .dynamodb
        .get_item()
        .table_name(&p.resources.table)
        .key("item_id", AttributeValue::S(item_id.to_string()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item()
        .and_then(|i| i.get(sqs_keeper_aws::schema::LEASE_OWNER))
        .and_then(|v| v.as_s().ok().cloned())
}

/// Waits until `ready` holds (at most `max`).
async fn wait_until(max: Duration, what: &str, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < max, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Records whose payload pointer names an object that is not in its bucket.
///
/// Not `strict`, items that are not whole records are skipped, so the check holds on an
/// emulator that applies an UpdateItem creating an item in two steps (the key, then the
/// update; moto does). DynamoDB never shows a half-applied update, so once the pipeline
/// has settled every item must be a whole record (`strict`).
async fn dangling_payloads(clients: &AwsClients, table: &str, strict: bool) -> Vec<String> {
    let scan = clients
        .dynamodb
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let mut dangling = Vec::new();
    for item in scan.items() {
        let record = match sqs_keeper_aws::schema::record_from_item(item) {
            Ok(record) => record,
            Err(_) if !strict => continue,
            Err(e) => panic!("not a record: {e}: {item:?}"),
        };
        if let PayloadLocation::S3 { bucket, key } = &record.payload.location {
            if clients
                .s3
                .head_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .is_err()
            {
                dangling.push(format!("{} -> s3://{bucket}/{key}", record.item_id));
            }
        }
    }
    dangling
}

/// Checks, over and over while a test runs, that no record points at a missing payload.
struct PayloadWatch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u32, Vec<String>)>,
}

impl PayloadWatch {
    fn start(p: &Pipeline) -> PayloadWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = p.clients.clone();
        let table = p.resources.table.clone();
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut checks = 0;
            let mut violations = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                violations.extend(dangling_payloads(&clients, &table, false).await);
                checks += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (checks, violations)
        });
        PayloadWatch { stop, task }
    }

    /// Stops; the number of checks made and every violation seen.
    async fn finish(self) -> (u32, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

// ---------------------------------------------------------------------------------------
// The dead-letter store failing under the worker
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_failing_while_recording_returns_the_record_until_it_is_recorded_once() {
    let (proxy, p) = behind_proxy(
        "f-ddb",
        Setup {
            max_receive_count: 5,
            ..Setup::default()
        },
    )
    .await;
    let update = Operation::dynamodb("UpdateItem");
    let recorder = Recorder::new(&p);
    p.send(&[
        &body("v1", "invalid"),
        &body("v2", "invalid"),
        &body("ok", "ok"),
    ])
    .await;

    // Delivery 1: every DynamoDB write is throttled. Delivery 2: every write gets a 500.
    for (delivery, fault, class) in [
        (1, Fault::Throttling, "throttled"),
        (2, Fault::InternalError, "server_error"),
    ] {
        proxy.clear();
        proxy.inject(Rule::new(&update, fault, Trigger::Always));
        let injected_before = proxy.injected_for(&update);
        let received = if delivery == 1 { 3 } else { 2 };
        let stats = deliver(&p, &recorder, received).await;
        let report = recorder.only();
        assert_eq!(
            stats.reported, 2,
            "delivery {delivery}: both records returned"
        );
        assert_eq!(stats.deleted, received - 2, "delivery {delivery}");
        for id in ["v1", "v2"] {
            let error = sink_error(&report, id);
            assert!(error.starts_with(class), "delivery {delivery}: {error}");
        }
        assert_eq!(report.counts().dead_letter_failed, 2);
        assert_eq!(
            proxy.injected_for(&update) - injected_before,
            6,
            "delivery {delivery}: 3 SDK attempts for each of the 2 records"
        );
        assert_eq!(p.source_depth().await, 2, "delivery {delivery}");
        assert!(p.records().await.is_empty(), "delivery {delivery}");
        assert_eq!(p.dlq_depth().await, 0, "delivery {delivery}");
    }

    // DynamoDB is back: the third delivery records each item exactly once.
    proxy.clear();
    let stats = drain(&p, &recorder, Duration::from_secs(30)).await;
    assert_eq!((stats.received, stats.deleted, stats.reported), (2, 2, 0));
    let records = records(&p).await;
    assert_eq!(record_ids(&records), ["v1", "v2"]);
    for r in &records {
        assert_eq!(r.status, ItemStatus::Dead);
        assert_eq!(r.reason, DeadLetterReason::Permanent);
        assert_eq!(r.source.receive_count, 3);
        assert_eq!(
            r.failure_count, 1,
            "{}: only the recorded delivery",
            r.item_id
        );
        assert_eq!(
            attempt_ids(r),
            [format!("{}:3:1", r.source.message_id)],
            "{}",
            r.item_id
        );
        assert_eq!(
            p.downstream.calls(&r.item_id),
            3,
            "one attempt per delivery"
        );
    }
    assert_eq!(dlq_item_ids(&p).await, ["v1", "v2"]);
    assert_eq!(p.source_depth().await, 0);
    assert!(p.objects().await.is_empty());
    assert_eq!(p.downstream.delivered(), ["ok"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_failing_while_offloading_never_leaves_a_record_without_its_object() {
    let (proxy, p) = behind_proxy(
        "f-s3",
        Setup {
            max_receive_count: 6,
            ..Setup::default()
        },
    )
    .await;
    let put = Operation::s3("PutObject");
    let update = Operation::dynamodb("UpdateItem");
    let large =
        json!({"id": "big", "scenario": "invalid", "blob": "x".repeat(100_000)}).to_string();
    assert!(large.len() > 65_536, "above DLQ_INLINE_MAX_BYTES");
    let recorder = Recorder::new(&p);
    let watch = PayloadWatch::start(&p);
    p.send(&[&large, &body("small", "invalid")]).await;

    // Delivery 1: S3 answers 503 to every PutObject. The small item needs no S3 and is
    // dead-lettered; the large one is returned.
    proxy.inject(Rule::new(&put, Fault::ServiceUnavailable, Trigger::Always));
    let stats = deliver(&p, &recorder, 2).await;
    let report = recorder.only();
    assert_eq!((stats.reported, stats.deleted), (1, 1));
    assert!(
        sink_error(&report, "big").starts_with("server_error"),
        "{report:?}"
    );
    assert!(matches!(
        disposition(&report, "small"),
        Disposition::DeadLettered { .. }
    ));
    assert_eq!(proxy.injected_for(&put), 3);
    assert_eq!(record_ids(&records(&p).await), ["small"]);
    assert!(p.objects().await.is_empty());
    assert_eq!(p.source_depth().await, 1);
    assert_eq!(p.dlq_depth().await, 1);
    assert!(dangling_payloads(&p.clients, &p.resources.table, true)
        .await
        .is_empty());

    // Delivery 2: S3 resets every connection.
    proxy.clear();
    proxy.inject(Rule::new(&put, Fault::ConnectionReset, Trigger::Always));
    let stats = deliver(&p, &recorder, 1).await;
    let report = recorder.only();
    assert_eq!(stats.reported, 1);
    let error = sink_error(&report, "big");
    assert!(error.starts_with("connection"), "{error}");
    assert_eq!(proxy.injected_for(&put), 6);
    assert_eq!(record_ids(&records(&p).await), ["small"]);
    assert!(p.objects().await.is_empty());
    assert!(dangling_payloads(&p.clients, &p.resources.table, true)
        .await
        .is_empty());

    // Delivery 3: S3 works, DynamoDB does not. The object is written, the record is not:
    // an object without a record is harmless (the next write reuses its key), the reverse
    // would not be.
    proxy.clear();
    proxy.inject(Rule::new(
        &update,
        Fault::ServiceUnavailable,
        Trigger::Always,
    ));
    let stats = deliver(&p, &recorder, 1).await;
    let report = recorder.only();
    assert_eq!(stats.reported, 1);
    assert!(sink_error(&report, "big").starts_with("server_error"));
    assert_eq!(p.objects().await.len(), 1);
    assert_eq!(record_ids(&records(&p).await), ["small"]);
    assert_eq!(p.source_depth().await, 1);
    assert!(dangling_payloads(&p.clients, &p.resources.table, true)
        .await
        .is_empty());

    // Everything works: the fourth delivery records it, reusing the object.
    proxy.clear();
    let stats = drain(&p, &recorder, Duration::from_secs(30)).await;
    assert_eq!((stats.received, stats.deleted), (1, 1));
    let records = records(&p).await;
    assert_eq!(record_ids(&records), ["big", "small"]);
    let big = &records[0];
    let PayloadLocation::S3 { bucket, key } = &big.payload.location else {
        panic!("expected an S3 payload, got {:?}", big.payload.location);
    };
    assert_eq!(
        p.objects().await,
        std::slice::from_ref(key),
        "one object, the same key"
    );
    assert_eq!(big.payload.size_bytes, large.len() as u64);
    let object = p
        .clients
        .s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap();
    let stored = object.body.collect().await.unwrap().into_bytes();
    assert_eq!(
        sqs_keeper_core::hex::sha256_hex(&stored),
        big.payload.sha256
    );
    assert_eq!(big.source.receive_count, 4);
    assert_eq!(attempt_ids(big), [format!("{}:4:1", big.source.message_id)]);
    assert_eq!(big.failure_count, 1);
    let small = &records[1];
    assert_eq!((small.source.receive_count, small.failure_count), (1, 1));
    // The DLQ holds one message per item; the large one points at the object.
    let dlq = p.dlq_messages().await;
    assert_eq!(dlq.len(), 2);
    let pointers: Vec<S3Pointer> = dlq
        .iter()
        .filter_map(|m| S3Pointer::parse(m.body().unwrap_or_default()))
        .collect();
    assert_eq!(pointers.len(), 1);
    assert_eq!(&pointers[0].key, key);
    assert_eq!(p.source_depth().await, 0);
    let (checks, violations) = watch.finish().await;
    assert!(
        violations.is_empty(),
        "records without their object: {violations:?}"
    );
    assert!(checks >= 5, "the watch ran ({checks} checks)");
    assert!(dangling_payloads(&p.clients, &p.resources.table, true)
        .await
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_send_failing_after_the_record_was_written_sends_one_dlq_message_later() {
    let (proxy, p) = behind_proxy(
        "f-dlqsend",
        Setup {
            max_receive_count: 5,
            ..Setup::default()
        },
    )
    .await;
    // The worker's SQS client only ever sends to the DLQ (the poller has its own client).
    let send = Operation::sqs("SendMessageBatch");
    proxy.inject(Rule::new(&send, Fault::InternalError, Trigger::Always));
    let recorder = Recorder::new(&p);
    p.send(&[&body("v1", "invalid"), &body("v2", "invalid")])
        .await;

    let stats = deliver(&p, &recorder, 2).await;
    let report = recorder.only();
    assert_eq!((stats.reported, stats.deleted), (2, 0));
    for id in ["v1", "v2"] {
        let error = sink_error(&report, id);
        assert!(error.starts_with("server_error"), "{error}");
    }
    assert_eq!(
        proxy.injected_for(&send),
        3,
        "one batch for both records, 3 SDK attempts"
    );
    // The records were written before the DLQ step; the messages are still in the source.
    let first = records(&p).await;
    assert_eq!(record_ids(&first), ["v1", "v2"]);
    for r in &first {
        assert_eq!(attempt_ids(r), [format!("{}:1:1", r.source.message_id)]);
        assert_eq!(r.failure_count, 1);
    }
    assert_eq!(p.dlq_depth().await, 0);
    assert_eq!(p.source_depth().await, 2);

    // The DLQ is back: the redelivery merges into the same records and sends one message each.
    proxy.clear();
    let stats = drain(&p, &recorder, Duration::from_secs(30)).await;
    assert_eq!((stats.received, stats.deleted), (2, 2));
    let records = records(&p).await;
    assert_eq!(record_ids(&records), ["v1", "v2"]);
    for r in &records {
        let m = &r.source.message_id;
        // Both deliveries' attempts, each once: the count is the history's length.
        assert_eq!(attempt_ids(r), [format!("{m}:1:1"), format!("{m}:2:1")]);
        assert_eq!(r.failure_count, 2);
        assert_eq!(r.status, ItemStatus::Dead);
        assert_eq!(r.source.receive_count, 2);
    }
    assert_eq!(dlq_item_ids(&p).await, ["v1", "v2"], "exactly one each");
    assert_eq!(p.source_depth().await, 0);
}

// ---------------------------------------------------------------------------------------
// The worker itself failing
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process_killed_mid_batch_loses_nothing() {
    // Visibility = function timeout, as Lambda requires; slow items take 2 s, within the
    // 2.5 s downstream timeout. The function's 6 s leave the second delivery room for the
    // slow items whatever else the machine runs (with 3 s, a loaded machine cut some at
    // the deadline and they took a third delivery).
    let p = Pipeline::new(
        "f-kill",
        Setup {
            max_receive_count: 3,
            visibility_timeout_secs: 6,
            worker_env: vec![("WORKER_DOWNSTREAM_TIMEOUT_MS", "2500".into())],
            ..Setup::default()
        },
    )
    .await;
    let t0 = Instant::now();
    let binary = e2e::worker_binary();
    println!("kill: worker binary ready after {:?}", t0.elapsed());
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .unwrap();
    let mut env = sqs_keeper_local::demo::emulator_env(&e2e::emulator().await, REGION);
    env.extend(p.worker_env.iter().cloned());
    let log = std::env::temp_dir().join(format!("faults-kill-{}.log", std::process::id()));
    let address = api.address();
    let spawn = || FunctionProcess::spawn(&binary, "worker", &address, &env, Some(&log));
    let mut first = spawn().unwrap();

    let slow = ["s1", "s2", "s3"];
    let ok = ["o1", "o2", "o3", "o4"];
    let invalid = ["v1", "v2"];
    let bodies: Vec<String> = slow
        .iter()
        .map(|id| body(id, "slow"))
        .chain(ok.iter().map(|id| body(id, "ok")))
        .chain(invalid.iter().map(|id| body(id, "invalid")))
        .collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    p.send(&refs).await;
    let invoker = RuntimeApiInvoker {
        api,
        timeout: Duration::from_secs(6),
    };

    // The first delivery: its invocation is never answered, because meanwhile the process
    // is killed while the slow items are at the downstream, and a new one takes over.
    let first_delivery = async {
        let mut stats = EsmStats::default();
        p.esm.poll_once(&invoker, &mut stats).await.unwrap();
        stats
    };
    let kill = async {
        wait_until(Duration::from_secs(10), "the batch to be in flight", || {
            slow.iter().all(|id| p.downstream.calls(id) == 1)
                && invalid.iter().all(|id| p.downstream.calls(id) == 1)
                && ok
                    .iter()
                    .all(|id| p.downstream.delivered().contains(&id.to_string()))
        })
        .await;
        let delivered = p.downstream.delivered();
        assert!(
            slow.iter().all(|id| !delivered.contains(&id.to_string())),
            "the slow items are still in flight"
        );
        first.kill().await.unwrap();
        let records_at_kill = p.records().await.len();
        let second = spawn().unwrap();
        (records_at_kill, second)
    };
    let (first_stats, (records_at_kill, _second)) = tokio::join!(first_delivery, kill);
    assert!(first.exited().is_some(), "the first worker is gone");
    assert_eq!(first_stats.received, 9);
    assert_eq!(
        first_stats.failed_invocations, 1,
        "no answer: the invocation failed"
    );
    assert_eq!(first_stats.deleted, 0, "nothing acknowledged");
    assert_eq!(records_at_kill, 0, "killed before dead-lettering");

    // After the visibility timeout the new process gets the whole batch again.
    let stats = drain(&p, &invoker, Duration::from_secs(30)).await;
    assert_eq!(stats.failed_invocations, 0, "{stats:?}");
    assert_eq!((stats.received, stats.deleted), (9, 9), "{stats:?}");
    let records = records(&p).await;
    assert_eq!(record_ids(&records), invalid);
    for r in &records {
        assert_eq!(r.source.receive_count, 2);
        assert_eq!(r.failure_count, 1, "recorded once, by the second delivery");
        assert_eq!(attempt_ids(r), [format!("{}:2:1", r.source.message_id)]);
    }
    assert_eq!(dlq_item_ids(&p).await, invalid);
    assert_eq!(p.source_depth().await, 0);
    let delivered = p.downstream.delivered();
    for id in slow.iter().chain(&ok) {
        assert!(delivered.contains(&id.to_string()), "{id} delivered");
        // At least once: the first answers were lost with the process.
        assert_eq!(p.downstream.calls(id), 2, "{id}");
    }
    println!(
        "kill: deliveries answered 200 per slow item: {:?}",
        slow.map(|id| delivered.iter().filter(|d| *d == id).count())
    );
    for id in slow.iter().chain(&ok).chain(&invalid) {
        assert!(
            delivered.contains(&id.to_string()) || records.iter().any(|r| r.item_id == *id),
            "{id} lost"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invocation_past_its_deadline_reports_unstarted_records_and_runs_none_twice() {
    // Two records at a time, 2 s each, in invocations of 2.5 s with 0.3 s kept free: the
    // first two finish at 2 s; the next two start then and are cut at the 2.2 s cut-off (a
    // timeout, retried later); the last two never start. Every invocation answers before
    // its deadline and nothing is lost; only a cut attempt can reach the downstream twice.
    let p = Pipeline::new(
        "f-deadline",
        Setup {
            max_receive_count: 5,
            worker_env: vec![
                ("WORKER_MAX_CONCURRENCY", "2".into()),
                ("WORKER_DOWNSTREAM_TIMEOUT_MS", "5000".into()),
            ],
            ..Setup::default()
        },
    )
    .await;
    let ids: Vec<String> = (1..=6).map(|i| format!("s{i}")).collect();
    let bodies: Vec<String> = ids.iter().map(|id| body(id, "slow")).collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    p.send(&refs).await;
    let timeout = Duration::from_millis(2500);
    let recorder = Recorder::with_deadline(&p, timeout, Duration::from_millis(300));

    let first = deliver(&p, &recorder, 6).await;
    let report = recorder.only();
    let counts = report.counts();
    assert_eq!(
        (counts.done, counts.retry_later, counts.not_started),
        (2, 2, 2),
        "{counts:?}"
    );
    assert_eq!(
        counts.by_class.get(&ErrorClass::Timeout),
        Some(&2),
        "cut as timeouts"
    );
    for r in &report.records {
        if let Disposition::NotStarted { reason } = &r.disposition {
            assert_eq!(*reason, NotStartedReason::Deadline);
            assert_eq!(r.attempts, 0);
        }
    }
    assert_eq!((first.reported, first.deleted), (4, 2));
    let started = ids.iter().filter(|id| p.downstream.calls(id) > 0).count();
    assert_eq!(
        started, 4,
        "the unstarted records never reached the downstream"
    );

    let stats = drain(&p, &recorder, Duration::from_secs(60)).await;
    let reports = recorder.take();
    let mut done = counts.done;
    let mut cut = counts.retry_later;
    for (report, took) in &reports {
        let c = report.counts();
        assert_eq!(c.done + c.retry_later + c.not_started, c.records, "{c:?}");
        assert!(
            *took < timeout,
            "invocation took {took:?}, past its deadline"
        );
        done += c.done;
        cut += c.retry_later;
    }
    assert_eq!(done, 6, "every record done once by the worker");
    assert_eq!(stats.deleted, 4);
    let calls: u32 = ids.iter().map(|id| p.downstream.calls(id)).sum();
    assert_eq!(
        calls as usize,
        6 + cut,
        "a record reaches the downstream again only after a cut attempt"
    );
    let mut delivered = p.downstream.delivered();
    delivered.sort();
    delivered.dedup();
    assert_eq!(delivered, ids);
    assert!(p.records().await.is_empty());
    assert_eq!(p.dlq_depth().await, 0);
    assert_eq!(p.source_depth().await, 0);
}

/// Receives `n` messages of the source queue with everything Lambda gets.
async fn receive(p: &Pipeline, n: usize) -> Vec<Message> {
    let mut messages = Vec::new();
    let start = Instant::now();
    while messages.len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "received only {messages:?}"
        );
        let output = p
            .clients
            .sqs
            .receive_message()
            .queue_url(&p.resources.source_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap();
        messages.extend(output.messages().iter().cloned());
    }
    messages
}

fn event_of(p: &Pipeline, messages: &[Message]) -> Bytes {
    Bytes::from(p.esm.event(messages).to_string())
}

/// Invokes the worker with `events` at once (the invocations overlap). Each answer either
/// acknowledges the record (the delivery that dead-lettered it) or returns it for retry
/// (a duplicate that found the message being dead-lettered): never anything else.
async fn invoke_at_once(p: &Pipeline, events: &[Bytes]) {
    let results =
        futures::future::join_all(events.iter().map(|e| p.invoker.invoke(e.clone()))).await;
    for result in results {
        assert!(result.unwrap().len() <= 1);
    }
}

async fn delete(p: &Pipeline, messages: &[Message]) {
    for m in messages {
        p.clients
            .sqs
            .delete_message()
            .queue_url(&p.resources.source_url)
            .receipt_handle(m.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_deliveries_keep_one_record_without_repeated_history() {
    // The invocations below overlap, and so do their record writes: DynamoDB (and
    // DynamoDB Local, which serves it here) applies each conditional UpdateItem
    // atomically, so the attempt-id condition must keep every attempt exactly once
    // whichever write lands first.
    let p = Pipeline::new(
        "f-dup",
        Setup {
            max_receive_count: 5,
            visibility_timeout_secs: 60,
            ..Setup::default()
        },
    )
    .await;

    // 1. One delivery, invoked twice at once (Lambda invokes at least once), then again:
    //    one attempt, recorded once.
    p.send(&[&body("a", "invalid")]).await;
    let first = receive(&p, 1).await;
    let event = event_of(&p, &first);
    invoke_at_once(&p, &[event.clone(), event.clone()]).await;
    invoke_at_once(&p, &[event]).await;
    delete(&p, &first).await;
    let a = p.store().get("a").await.unwrap().unwrap();
    assert_eq!(attempt_ids(&a), [format!("{}:1:1", a.source.message_id)]);
    assert_eq!((a.failure_count, a.source.receive_count), (1, 1));
    assert_eq!(p.downstream.calls("a"), 3, "processed by each invocation");

    // 2. SQS delivers the message again while the first delivery is being processed (its
    //    visibility ran out): two deliveries at once, then the later one again. Each
    //    delivery's attempt is recorded once.
    p.send(&[&body("b", "invalid")]).await;
    let early = receive(&p, 1).await;
    p.clients
        .sqs
        .change_message_visibility()
        .queue_url(&p.resources.source_url)
        .receipt_handle(early[0].receipt_handle().unwrap())
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    let late = receive(&p, 1).await;
    assert_eq!(
        early[0].message_id(),
        late[0].message_id(),
        "the same message"
    );
    invoke_at_once(&p, &[event_of(&p, &early), event_of(&p, &late)]).await;
    invoke_at_once(&p, &[event_of(&p, &late)]).await;
    delete(&p, &late).await;
    let b = p.store().get("b").await.unwrap().unwrap();
    let m = &b.source.message_id;
    // The two overlapping writes land in either order, each attempt at most once. A
    // delivery that finds its message's DLQ message already sent appends nothing
    // (docs/ARCHITECTURE.md §1.5): when one delivery's record write and DLQ send both end
    // before the other's write, only the first is kept; when they overlap, both are.
    let mut attempts = attempt_ids(&b);
    attempts.sort_unstable();
    let both = [format!("{m}:1:1"), format!("{m}:2:1")];
    assert!(
        !attempts.is_empty()
            && attempts
                .iter()
                .all(|a| both.iter().any(|x| x.as_str() == *a)),
        "{attempts:?}"
    );
    attempts.dedup();
    assert_eq!(
        attempts.len(),
        attempt_ids(&b).len(),
        "an attempt recorded twice"
    );
    assert_eq!(b.failure_count as usize, attempts.len());
    assert_eq!(p.downstream.calls("b"), 3);

    assert_eq!(record_ids(&records(&p).await), ["a", "b"]);
    assert_eq!(p.source_depth().await, 0);
    // One DLQ message per source message however often it was delivered or invoked: the
    // first delivery to record it claims the message's DLQ message; the others are
    // returned for retry without sending.
    let dlq = dlq_item_ids(&p).await;
    assert_eq!(dlq.iter().filter(|id| *id == "a").count(), 1, "{dlq:?}");
    assert_eq!(dlq.iter().filter(|id| *id == "b").count(), 1, "{dlq:?}");
    println!(
        "duplicates: a history {:?}, b history {:?} (latest delivery recorded as {}), DLQ {dlq:?}",
        attempt_ids(&a),
        attempt_ids(&b),
        b.source.receive_count
    );
}

// ---------------------------------------------------------------------------------------
// The downstream failing for a while
// ---------------------------------------------------------------------------------------

/// A downstream that answers 429 (`Retry-After: 1`) to everything for `length` from its
/// first request, then 200; it keeps when and how it answered each item.
struct Storm {
    length: Duration,
    started: OnceLock<Instant>,
    requests: Mutex<HashMap<String, Vec<(Instant, u16)>>>,
}

impl Storm {
    async fn start(length: Duration) -> (Server, Arc<Storm>) {
        let storm = Arc::new(Storm {
            length,
            started: OnceLock::new(),
            requests: Mutex::new(HashMap::new()),
        });
        let state = storm.clone();
        let handler: Handler = Arc::new(move |req| {
            let state = state.clone();
            Box::pin(async move {
                let now = Instant::now();
                let doc: serde_json::Value = serde_json::from_slice(&req.body).unwrap_or_default();
                let id = doc["id"].as_str().unwrap_or("?").to_string();
                let start = *state.started.get_or_init(|| now);
                let status = if now < start + state.length { 429 } else { 200 };
                state
                    .requests
                    .lock()
                    .unwrap()
                    .entry(id)
                    .or_default()
                    .push((now, status));
                if status == 429 {
                    let mut response = text(http::StatusCode::TOO_MANY_REQUESTS, "slow down");
                    response.headers_mut().insert(
                        http::header::RETRY_AFTER,
                        http::HeaderValue::from_static("1"),
                    );
                    response
                } else {
                    text(http::StatusCode::OK, "")
                }
            })
        });
        (Server::start(0, handler).await.unwrap(), storm)
    }

    fn requests(&self, id: &str) -> Vec<(Instant, u16)> {
        self.requests
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    fn end(&self) -> Instant {
        *self.started.get().unwrap() + self.length
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downstream_throttling_storm_is_ridden_out_without_dead_letters() {
    // A 6 s storm (30 s would make this one test take 40 s; the mechanics are the same).
    // Each delivery tries 3 times, 1 s apart (Retry-After), and comes back 3 s after it was
    // received: the storm lasts about two deliveries, well within a budget of 6.
    let (server, storm) = Storm::start(Duration::from_secs(6)).await;
    let p = Pipeline::new(
        "f-storm",
        Setup {
            max_receive_count: 6,
            visibility_timeout_secs: 3,
            worker_env: vec![
                (
                    "WORKER_DOWNSTREAM_URL",
                    format!("http://{}/ingest", server.addr()),
                ),
                ("WORKER_RETRY_MAX_ATTEMPTS", "3".into()),
                ("WORKER_RETRY_BASE_DELAY_MS", "200".into()),
                ("WORKER_RETRY_MAX_DELAY_MS", "1000".into()),
            ],
            ..Setup::default()
        },
    )
    .await;
    let ids: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    let bodies: Vec<String> = ids.iter().map(|id| body(id, "ok")).collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    p.send(&refs).await;
    let recorder = Recorder::new(&p);
    let stats = drain(&p, &recorder, Duration::from_secs(40)).await;

    assert!(p.records().await.is_empty(), "nothing dead-lettered");
    assert_eq!(p.dlq_depth().await, 0);
    assert_eq!(p.source_depth().await, 0);
    assert_eq!(stats.deleted, 10);
    assert!(
        stats.reported >= 10,
        "each item returned at least once: {stats:?}"
    );
    let end = storm.end();
    for id in &ids {
        let requests = storm.requests(id);
        let statuses: Vec<u16> = requests.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            1,
            "{id}: {statuses:?}"
        );
        assert_eq!(statuses.last(), Some(&200), "{id}: {statuses:?}");
        assert!(statuses.len() >= 4, "{id} retried: {statuses:?}");
        assert!(requests.last().unwrap().0 >= end, "{id}");
        for pair in requests.windows(2) {
            let gap = pair[1].0 - pair[0].0;
            assert!(
                gap >= Duration::from_millis(900),
                "{id}: retried after {gap:?}, before Retry-After"
            );
        }
    }
    let reports = recorder.take();
    assert!(reports.len() >= 3, "{} invocations", reports.len());
    let attempts: Vec<usize> = ids.iter().map(|id| storm.requests(id).len()).collect();
    println!(
        "storm: {} invocations, {} reported, requests per item {attempts:?}",
        reports.len(),
        stats.reported
    );
    for (report, _) in &reports {
        let c = report.counts();
        assert_eq!(
            c.dead_lettered + c.dead_letter_failed,
            0,
            "within the receive budget: {c:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Redrive under faults
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_with_dynamodb_throttled_leaves_items_dead_unleased_and_redrivable() {
    let bodies: Vec<String> = ["r1", "r2", "r3"]
        .iter()
        .map(|id| body(id, "throttled"))
        .collect();
    let p = Pipeline::with_dead_items("f-rd-ddb", &bodies).await;
    p.downstream.fix();
    let before = records(&p).await;
    let proxy = start_proxy().await;
    let engine = p.redrive_engine_via(clients_via(&proxy).await);
    // Every DynamoDB write is throttled; reads (selection, the DLQ sweep's lookups) work.
    let update = Operation::dynamodb("UpdateItem");
    let transact = Operation::dynamodb("TransactWriteItems");
    proxy.inject(Rule::new(&update, Fault::Throttling, Trigger::Always));
    proxy.inject(Rule::new(&transact, Fault::Throttling, Trigger::Always));

    let report = engine
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(report.selected, 3);
    assert_eq!(
        (report.errors, report.succeeded, report.failed_again),
        (3, 0, 0)
    );
    assert!(report.is_partial_failure());
    for o in &report.items {
        assert_eq!(o.outcome, ItemOutcomeKind::Error);
        let detail = o.detail.as_deref().unwrap_or_default();
        assert!(detail.contains("throttled"), "{}: {detail}", o.item_id);
    }
    assert_eq!(report.dlq_messages_deleted, 0);
    assert_eq!(
        proxy.injected_for(&update),
        9,
        "3 leases, 3 SDK attempts each"
    );
    // Nothing changed: still dead, no lease, not reprocessed, DLQ messages given back.
    assert_eq!(records(&p).await, before);
    for id in ["r1", "r2", "r3"] {
        assert_eq!(lease_owner(&p, id).await, None, "{id}");
        assert_eq!(p.downstream.calls(id), 1, "{id} not reprocessed");
    }
    assert_eq!(
        visible_dlq(&p).await,
        3,
        "the run's held messages are released"
    );

    // DynamoDB recovers: nothing is stuck behind a lease, the next run resolves them all.
    proxy.clear();
    let again = engine
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(
        outcome_ids(&again, ItemOutcomeKind::Resolved),
        ["r1", "r2", "r3"]
    );
    for r in records(&p).await {
        assert_eq!(r.status, ItemStatus::Resolved, "{}", r.item_id);
        assert_eq!(p.downstream.calls(&r.item_id), 2);
    }
    assert_eq!(p.dlq_depth().await, 0);
}

/// HTTP delivery that arms a fault in the proxy once it has processed an item: the fault
/// then hits the redrive's next store call, after the lease was taken.
struct ArmedDelivery {
    inner: HttpDelivery,
    faults: Faults,
    armed: Trap,
}

/// The rule an [`ArmedDelivery`] injects after its next item.
#[derive(Clone, Default)]
struct Trap(Arc<Mutex<Option<Rule>>>);

impl Trap {
    fn arm(&self, rule: Rule) {
        *self.0.lock().unwrap() = Some(rule);
    }
}

impl Processor for ArmedDelivery {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let result = self.inner.process(item).await;
        let rule = self.armed.0.lock().unwrap().take();
        if let Some(rule) = rule {
            self.faults.inject(rule);
        }
        result
    }
}

/// A redrive engine whose store goes through `proxy`, and the trap its processor springs.
async fn armed_engine(
    p: &Pipeline,
    proxy: &FaultProxy,
) -> (RedriveEngine<ArmedDelivery, DeadLetterStore>, Trap) {
    let delivery = HttpDelivery::new(HttpDeliveryConfig::new(
        p.downstream.url().parse().unwrap(),
        Duration::from_millis(500),
    ))
    .unwrap();
    let trap = Trap::default();
    let processor = ArmedDelivery {
        inner: delivery,
        faults: proxy.faults().clone(),
        armed: trap.clone(),
    };
    let engine = RedriveEngine::new(
        DeadLetterStore::new(clients_via(proxy).await, p.resources.store_config()),
        Some(processor),
        RedriveSettings {
            retry: RetryPolicy {
                max_attempts: 1,
                ..RetryPolicy::default()
            },
            parser: ItemParser {
                id_source: "pointer:/id".parse().unwrap(),
                ..ItemParser::default()
            },
            ..RedriveSettings::default()
        },
    );
    (engine, trap)
}

fn one(id: &str) -> RedriveRequest {
    RedriveRequest {
        item_ids: vec![id.to_string()],
        parallelism: Some(1),
        ..RedriveRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_failure_that_cannot_be_recorded_releases_the_lease() {
    let p = Pipeline::with_dead_items("f-rd-fail", &[body("again", "throttled")]).await;
    let proxy = start_proxy().await;
    let (engine, trap) = armed_engine(&p, &proxy).await;
    let update = Operation::dynamodb("UpdateItem");
    // The item fails again (the downstream still throttles); writing that failure is
    // throttled for the SDK's 3 attempts, then DynamoDB recovers.
    trap.arm(Rule::new(&update, Fault::Throttling, Trigger::NextN(3)));
    let report = engine
        .run(&one("again"), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(
        outcome_ids(&report, ItemOutcomeKind::Error),
        ["again"],
        "{report:?}"
    );
    assert_eq!(proxy.injected_for(&update), 3);
    assert_eq!(p.downstream.calls("again"), 2, "reprocessed once");
    let r = p.store().get("again").await.unwrap().unwrap();
    assert_eq!(r.status, ItemStatus::Dead, "back to dead");
    assert_eq!(lease_owner(&p, "again").await, None, "lease released");
    assert_eq!(
        r.failure_count, 1,
        "the unrecorded attempt is in the logs only"
    );
    assert_eq!(visible_dlq(&p).await, 1);
    // Redrivable at once.
    let again = engine
        .run(&one("again"), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(again.failed_again, 1, "{again:?}");
    assert_eq!(
        p.store().get("again").await.unwrap().unwrap().failure_count,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_success_that_cannot_be_resolved_releases_the_lease() {
    let p = Pipeline::with_dead_items("f-rd-resolve", &[body("fixed", "throttled")]).await;
    p.downstream.fix();
    let proxy = start_proxy().await;
    let (engine, trap) = armed_engine(&p, &proxy).await;
    let update = Operation::dynamodb("UpdateItem");
    // The item is reprocessed successfully; marking it resolved is throttled for the SDK's
    // 3 attempts, then DynamoDB recovers.
    trap.arm(Rule::new(&update, Fault::Throttling, Trigger::NextN(3)));
    let report = engine
        .run(&one("fixed"), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(
        outcome_ids(&report, ItemOutcomeKind::Error),
        ["fixed"],
        "{report:?}"
    );
    assert_eq!(proxy.injected_for(&update), 3);
    assert_eq!(p.downstream.delivered(), ["fixed"]);
    let r = p.store().get("fixed").await.unwrap().unwrap();
    let owner = lease_owner(&p, "fixed").await;
    assert_eq!(
        (r.status, owner.as_deref()),
        (ItemStatus::Dead, None),
        "the run is over: its lease must not outlive it"
    );
    assert_eq!(visible_dlq(&p).await, 1, "its DLQ message is kept");
}

/// Two redrives of the same selection at once, through a slow store: the DLQ sweeps'
/// status lookups, the selection and every write are delayed, so the two sweeps split the
/// DLQ messages between them and both runs select every item before either has resolved
/// much (most leases are contested).
async fn race_two_redrives(name: &str) -> (Pipeline, Vec<String>, RedriveReport, RedriveReport) {
    let ids: Vec<String> = (1..=12).map(|i| format!("k{i:02}")).collect();
    let bodies: Vec<String> = ids.iter().map(|id| body(id, "throttled")).collect();
    let p = Pipeline::with_dead_items(name, &bodies).await;
    p.downstream.fix();
    let proxy = start_proxy().await;
    for (action, delay) in [("BatchGetItem", 300), ("Query", 300), ("UpdateItem", 150)] {
        proxy.inject(Rule::new(
            Operation::dynamodb(action),
            Fault::Delay(Duration::from_millis(delay)),
            Trigger::Always,
        ));
    }
    let a = p.redrive_engine_via(clients_via(&proxy).await);
    let b = p.redrive_engine_via(clients_via(&proxy).await);
    let request = RedriveRequest {
        parallelism: Some(4),
        ..RedriveRequest::default()
    };
    let progress = redrive::no_progress();
    let (ra, rb) = tokio::join!(a.run(&request, &*progress), b.run(&request, &*progress));
    assert!(proxy.injected_for(Operation::dynamodb("UpdateItem")) >= 24);
    (p, ids, ra.unwrap(), rb.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_redrives_through_a_slow_store_process_each_item_once() {
    let (p, ids, ra, rb) = race_two_redrives("f-rd-race").await;
    assert_eq!(ra.succeeded + rb.succeeded, 12, "{ra:?}\n{rb:?}");
    assert_eq!(ra.errors + rb.errors + ra.failed_again + rb.failed_again, 0);
    assert!(
        ra.leased_elsewhere + rb.leased_elsewhere >= 1,
        "the runs did race: {ra:?}\n{rb:?}"
    );
    let mut resolved = outcome_ids(&ra, ItemOutcomeKind::Resolved);
    resolved.extend(outcome_ids(&rb, ItemOutcomeKind::Resolved));
    resolved.sort();
    assert_eq!(resolved, ids, "each item resolved by exactly one run");
    for id in &ids {
        assert_eq!(p.downstream.calls(id), 2, "{id}: worker once, redrive once");
        assert_eq!(lease_owner(&p, id).await, None, "{id}");
    }
    for r in p.records().await {
        assert_eq!(r.status, ItemStatus::Resolved, "{}", r.item_id);
    }
    // No DLQ message is left (the test below); a next run reprocesses nothing.
    let left = p.dlq_depth().await;
    println!(
        "run a: {} resolved, {} leased elsewhere, {} DLQ messages deleted; run b: {} / {} / {}; \
         DLQ messages left: {left}",
        ra.succeeded,
        ra.leased_elsewhere,
        ra.dlq_messages_deleted,
        rb.succeeded,
        rb.leased_elsewhere,
        rb.dlq_messages_deleted,
    );
    let cleanup = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(cleanup.selected, 0);
    assert_eq!(cleanup.dlq_messages_deleted as u64, left);
    assert_eq!(p.dlq_depth().await, 0);
    for id in &ids {
        assert_eq!(p.downstream.calls(id), 2, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_redrives_leave_no_dlq_message_of_a_resolved_item() {
    let (p, _, ra, rb) = race_two_redrives("f-rd-dlq").await;
    assert_eq!(ra.succeeded + rb.succeeded, 12);
    assert_eq!(
        p.dlq_depth().await,
        0,
        "DLQ messages deleted: {} + {}",
        ra.dlq_messages_deleted,
        rb.dlq_messages_deleted
    );
    // Each message is deleted by a run, so at least twelve deletes. More is not a defect:
    // SQS delivers at least once, and the emulator's receive takes no lock, so two sweeps
    // receiving at once can both get one message. Each run then deletes its copy, and the
    // emulator answers a second delete of a deleted message with success. What must hold
    // is the empty DLQ above, and each item processed once (the test before this one).
    assert!(
        ra.dlq_messages_deleted + rb.dlq_messages_deleted >= 12,
        "every message deleted: {} + {}",
        ra.dlq_messages_deleted,
        rb.dlq_messages_deleted
    );
}

/// A purge whose record deletes fail (DynamoDB down) keeps the records with their DLQ
/// messages and payloads: a message goes only once its record is deleted, and a second
/// purge finishes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_failing_midway_keeps_records_with_their_dlq_messages() {
    let p =
        Pipeline::with_dead_items("f-purge", &[body("p1", "invalid"), body("p2", "invalid")]).await;
    assert_eq!(p.dlq_depth().await, 2);
    let proxy = start_proxy().await;
    let store = DeadLetterStore::new(clients_via(&proxy).await, p.resources.store_config());
    let records = p.records().await;
    proxy.inject(Rule::new(
        Operation::dynamodb("DeleteItem"),
        Fault::ServiceUnavailable,
        Trigger::Always,
    ));
    let parser = ItemParser {
        id_source: "pointer:/id".parse().unwrap(),
        ..ItemParser::default()
    };
    assert!(store
        .remove_records(&records, &parser, |_| {})
        .await
        .is_err());
    assert_eq!(p.records().await.len(), 2, "records kept");
    assert_eq!(p.dlq_depth().await, 2, "with their DLQ messages");
    proxy.clear();
    let report = store
        .remove_records(&records, &parser, |_| {})
        .await
        .unwrap();
    assert_eq!(report.records_deleted, 2);
    assert_eq!(report.dlq_messages_deleted, 2);
    assert!(p.records().await.is_empty());
    assert_eq!(p.dlq_depth().await, 0);
}

/// A metered proxy bills what AWS would: an SQS request per started 64 KiB chunk, and the
/// DynamoDB units DynamoDB Local reports, for a client that asks for none (a plain SDK
/// client here, a peer's boto3 in the all-in benchmark) as for one that does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_proxy_bills_sqs_by_chunk_and_dynamodb_by_reported_unit() {
    let proxy = FaultProxy::start_metered(&e2e::emulator().await)
        .await
        .unwrap();
    let clients = clients_via(&proxy).await;
    let queue = clients
        .sqs
        .create_queue()
        .queue_name(e2e::unique_prefix("metered"))
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let plain = aws_sdk_dynamodb::Client::new(
        &AwsClients::endpoint_config(&proxy.endpoints(), REGION).await,
    );
    let table = e2e::unique_prefix("metered");
    e2e::create_table_named(&plain, &table, "id").await;
    proxy.reset_bill();

    for body in ["x".repeat(100 * 1024), "small".to_string()] {
        clients
            .sqs
            .send_message()
            .queue_url(&queue)
            .message_body(body)
            .send()
            .await
            .unwrap();
    }
    for (id, bytes) in [("small", 10), ("large", 2_500)] {
        plain
            .put_item()
            .table_name(&table)
            .item("id", AttributeValue::S(id.into()))
            .item("data", AttributeValue::S("d".repeat(bytes)))
            .send()
            .await
            .unwrap();
    }
    for consistent in [true, false] {
        plain
            .get_item()
            .table_name(&table)
            .key("id", AttributeValue::S("small".into()))
            .consistent_read(consistent)
            .send()
            .await
            .unwrap();
    }

    let bill = proxy.bill();
    assert_eq!(bill.sqs_requests, 3, "{bill:?}");
    assert_eq!(bill.requests["sqs:SendMessage"], 2);
    // 1 KB write units: one for the small item, three for 2.5 KB.
    assert_eq!(bill.dynamodb_write_units, 4.0, "{bill:?}");
    // A strongly consistent read of up to 4 KB is one unit, an eventually consistent half.
    assert_eq!(bill.dynamodb_read_units, 1.5, "{bill:?}");
}

/// A pipeline whose worker reaches AWS through a metered proxy, and `n` messages of
/// `scenario` sent to it (not metered).
async fn metered_pipeline(
    name: &str,
    setup: Setup,
    scenario: &str,
    n: usize,
) -> (FaultProxy, Pipeline) {
    let proxy = FaultProxy::start_metered(&e2e::emulator().await)
        .await
        .unwrap();
    let p = Pipeline::with_worker_endpoints(name, setup, &proxy.endpoints()).await;
    let bodies: Vec<String> = (0..n)
        .map(|i| body(&format!("{name}-{i}"), scenario))
        .collect();
    let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
    p.send(&refs).await;
    proxy.reset_bill();
    (proxy, p)
}

/// The requests as cut (docs/BENCHMARKS.md, "all in"): per-record idempotency writes each
/// record twice, its claim and its completion, one write unit each, and reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_costs_two_one_unit_writes_a_record_and_no_read() {
    let clients = e2e::clients().await;
    let table = e2e::idempotency_table(&clients.dynamodb, "cut-idem").await;
    let setup = Setup {
        worker_env: vec![("WORKER_IDEMPOTENCY_TABLE", table)],
        ..Setup::default()
    };
    let (proxy, p) = metered_pipeline("cut-idem", setup, "ok", 10).await;
    let stats = p.drain().await;
    assert_eq!(stats.deleted, 10, "{stats:?}");
    let bill = proxy.bill();
    let writes: u64 = bill
        .requests
        .iter()
        .filter(|(op, _)| op.starts_with("dynamodb:"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(writes, 20, "{bill:?}");
    assert_eq!(bill.dynamodb_write_units, 20.0, "{bill:?}");
    assert_eq!(bill.dynamodb_read_units, 0.0, "{bill:?}");
}

/// The requests as cut: the records of a batch that are all retried later are hidden
/// together, one `ChangeMessageVisibilityBatch` for the batch, and the queue's timing is
/// read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_retried_later_is_hidden_in_one_call() {
    let setup = Setup {
        max_receive_count: 5,
        worker_env: vec![
            ("WORKER_REDELIVERY_BASE_SECS", "30".into()),
            ("WORKER_REDELIVERY_MAX_SECS", "60".into()),
            ("WORKER_RETRY_BASE_DELAY_MS", "1".into()),
            ("WORKER_RETRY_MAX_DELAY_MS", "2".into()),
        ],
        ..Setup::default()
    };
    let (proxy, p) = metered_pipeline("cut-hide", setup, "throttled", 10).await;
    let mut stats = EsmStats::default();
    while stats.received < 10 {
        p.esm.poll_once(&p.invoker, &mut stats).await.unwrap();
    }
    assert_eq!(stats.reported, 10, "{stats:?}");
    let bill = proxy.bill();
    assert_eq!(
        bill.requests.get("sqs:ChangeMessageVisibilityBatch"),
        Some(&stats.invocations),
        "{bill:?}"
    );
    assert_eq!(
        bill.requests.get("sqs:GetQueueAttributes"),
        Some(&1),
        "{bill:?}"
    );
}

/// The requests as cut: each dead-lettered record is one conditional write of its record,
/// and a batch's DLQ messages go in one `SendMessageBatch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_batch_sends_its_dlq_messages_in_one_call() {
    let (proxy, p) = metered_pipeline("cut-dead", Setup::default(), "invalid", 10).await;
    let stats = p.drain().await;
    assert_eq!(p.records().await.len(), 10);
    let bill = proxy.bill();
    assert_eq!(
        bill.requests.get("sqs:SendMessageBatch"),
        Some(&stats.invocations),
        "{bill:?}"
    );
    assert_eq!(
        bill.requests.get("dynamodb:UpdateItem"),
        Some(&10),
        "{bill:?}"
    );
    assert_eq!(bill.dynamodb_read_units, 0.0, "{bill:?}");
}
