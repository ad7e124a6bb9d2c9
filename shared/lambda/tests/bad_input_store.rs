//! The bad-input suite, the cases that need S3, SQS or DynamoDB: an Extended Client pointer
//! to a missing object, redrive requests with bad limits or with unknown or repeated ids,
//! an error too large for a dead-letter record, an item that keeps failing. Each ends in a
//! clear error, a dead-letter or a per-item outcome, and nothing is lost or counted twice.
//!
//! They run against the local emulators: `EMULATOR_URL` and `EMULATOR_DYNAMODB_URL`, or
//! `scripts/emulator.sh start` when they are unset. Only loopback URLs are accepted. The cases that need no AWS are in
//! `bad_input.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;
use sqs_keeper_aws::{AwsClients, Endpoints};
use sqs_keeper_aws::{DeadLetterStore, ExtendedClientResolver, StoreConfig};
use sqs_keeper_core::pointer::S3Pointer;
use sqs_keeper_core::retry::AttemptFailure;
use sqs_keeper_core::{batch::Disposition, BatchConfig, BatchProcessor};
use sqs_keeper_core::{
    dead_letter::DeadLetterCandidate, dead_letter::DeadLetteredItem, dead_letter::InvocationInfo,
    DeadLetterReason,
};
use sqs_keeper_core::{item::BodyFormat, item::ItemIdSource, item::ItemParser, WorkItem};
use sqs_keeper_core::{
    redrive, redrive::ItemOutcomeKind, redrive::RedriveEngine, redrive::RedriveError,
    redrive::RedriveMode, redrive::RedriveRequest, redrive::RedriveSettings,
};
use sqs_keeper_core::{testing::MemorySink, testing::ScriptedProcessor, testing::Step};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_core::{Outcome, Processor};

use crate::common::{
    assert_accounted, config, disposition, event, far_deadline, json_parser, record, run,
    validation_dead_letter, Recording, ARN,
};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

static NEXT: AtomicU32 = AtomicU32::new(0);

fn unique(name: &str) -> String {
    format!(
        "bad-input-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// The emulators' endpoints (`EMULATOR_URL` and `EMULATOR_DYNAMODB_URL`, else
/// `scripts/emulator.sh start`); loopback only.
fn emulator() -> Endpoints {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/emulator.sh");
    let run = |verb: &str| {
        let output = std::process::Command::new(script)
            .arg(verb)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
        assert!(
            output.status.success(),
            "{script} {verb}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let endpoints = match var("EMULATOR_URL") {
        Some(shared) => Endpoints {
            dynamodb: var("EMULATOR_DYNAMODB_URL").unwrap_or_else(|| shared.clone()),
            shared,
        },
        None => Endpoints {
            shared: run("start"),
            dynamodb: run("dynamodb-url"),
        },
    };
    for url in [&endpoints.shared, &endpoints.dynamodb] {
        assert!(
            url.starts_with("http://127.") || url.starts_with("http://localhost"),
            "the emulator must be on loopback, got {url}"
        );
    }
    endpoints
}

async fn emulator_clients() -> AwsClients {
    AwsClients::for_endpoints(&emulator(), "us-east-1").await
}

/// A store on emulator resources made for one test: table, DLQ and bucket.
async fn emulator_store(name: &str) -> DeadLetterStore {
    let (clients, config) = emulator_store_resources(name).await;
    DeadLetterStore::new(clients, config)
}

/// A fresh table, DLQ and bucket on the emulator, and the store configuration naming them.
async fn emulator_store_resources(name: &str) -> (AwsClients, StoreConfig) {
    let clients = emulator_clients().await;
    let prefix = unique(name);
    let table = format!("{prefix}-dead-letters");
    sqs_keeper_aws::schema::create_table(&clients.dynamodb, &table)
        .await
        .unwrap();
    let dlq = clients
        .sqs
        .create_queue()
        .queue_name(format!("{prefix}-dlq"))
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let bucket = format!("{prefix}-payloads");
    clients
        .s3
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .unwrap();
    let config = StoreConfig::new(&table, &dlq, &bucket);
    (clients, config)
}

// ---------------------------------------------------------------------------------------
// Extended Client pointers
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_client_pointer_to_a_missing_object_is_dead_lettered_not_found() {
    let clients = emulator_clients().await;
    let bucket = unique("payloads");
    clients
        .s3
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .unwrap();
    clients
        .s3
        .put_object()
        .bucket(&bucket)
        .key("present")
        .body(r#"{"id":"resolved"}"#.as_bytes().to_vec().into())
        .send()
        .await
        .unwrap();
    clients
        .s3
        .put_object()
        .bucket(&bucket)
        .key("binary")
        .body(vec![0xff, 0xfe, 0x00].into())
        .send()
        .await
        .unwrap();
    let pointer = |bucket: &str, key: &str| {
        S3Pointer {
            bucket: bucket.to_string(),
            key: key.to_string(),
        }
        .to_body()
    };
    let missing_key = pointer(&bucket, "payloads/missing/0123");
    let missing_bucket_name = unique("no-such-bucket");
    let missing_bucket = pointer(&missing_bucket_name, "k");
    let present = pointer(&bucket, "present");
    let binary = pointer(&bucket, "binary");
    // Looks like a pointer but is not one (no bucket/key): an ordinary JSON body.
    let not_a_pointer = r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{}]"#;

    let engine = BatchProcessor::new(
        Recording::default(),
        MemorySink::new(),
        config(json_parser()),
    )
    .with_body_resolver(std::sync::Arc::new(ExtendedClientResolver::new(
        clients.s3.clone(),
        sqs_keeper_core::pointer::PayloadPolicy::allowing([
            bucket.clone(),
            missing_bucket_name.clone(),
        ]),
    )));
    let ids = ["m-key", "m-bucket", "m-present", "m-binary", "m-fake"];
    let report = run(
        &engine,
        vec![
            record("m-key", &missing_key),
            record("m-bucket", &missing_bucket),
            record("m-present", &present),
            record("m-binary", &binary),
            record("m-fake", not_a_pointer),
        ],
    )
    .await;
    assert_accounted(&ids, &report, engine.sink());
    let not_found = Disposition::DeadLettered {
        class: ErrorClass::NotFound,
        reason: DeadLetterReason::Permanent,
    };
    assert_eq!(disposition(&report, "m-key"), &not_found);
    assert_eq!(disposition(&report, "m-bucket"), &not_found);
    assert_eq!(disposition(&report, "m-binary"), &validation_dead_letter());
    assert_eq!(disposition(&report, "m-present"), &Disposition::Done);
    assert_eq!(disposition(&report, "m-fake"), &Disposition::Done);
    // The processor saw the payload for the present object, never a pointer it could not
    // resolve.
    let items = engine.processor().items();
    let processed: HashMap<&str, &str> = items
        .iter()
        .map(|i| (i.message_id.as_str(), i.body.as_str()))
        .collect();
    assert_eq!(processed.len(), 2, "{processed:?}");
    assert_eq!(processed["m-present"], r#"{"id":"resolved"}"#);
    assert_eq!(processed["m-fake"], not_a_pointer);
    // The dead-letter candidates keep the pointer body (the payload is not there) and say
    // which step failed.
    for candidate in engine.sink().accepted.lock().unwrap().iter() {
        assert_eq!(candidate.error.step.as_deref(), Some("fetch-payload"));
        assert_eq!(candidate.failures.len(), 1);
        let expected_body = match candidate.item.message_id.as_str() {
            "m-key" => &missing_key,
            "m-bucket" => &missing_bucket,
            "m-binary" => &binary,
            other => panic!("unexpected candidate {other}"),
        };
        assert_eq!(&candidate.item.body, expected_body);
        assert!(!candidate.error.message.is_empty());
    }
    let key_error = &engine
        .sink()
        .accepted
        .lock()
        .unwrap()
        .iter()
        .find(|c| c.item.message_id == "m-key")
        .unwrap()
        .error
        .clone();
    assert_eq!(key_error.code.as_deref(), Some("NoSuchKey"), "{key_error}");
    assert_eq!(key_error.status, Some(404));
}
// ---------------------------------------------------------------------------------------
// Redrive requests
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_with_bad_durations_or_limits_is_refused_before_anything_happens() {
    let store = emulator_store("redrive-bad").await;
    let engine = RedriveEngine::new(
        store,
        Some(ScriptedProcessor::new()),
        RedriveSettings::default(),
    );
    let cases: Vec<(RedriveRequest, &str)> = vec![
        (
            RedriveRequest {
                since: Some("yesterday".into()),
                ..Default::default()
            },
            "since: ",
        ),
        (
            RedriveRequest {
                until: Some("3y".into()),
                ..Default::default()
            },
            "until: ",
        ),
        (
            RedriveRequest {
                since: Some("-5h".into()),
                ..Default::default()
            },
            "since: ",
        ),
        (
            RedriveRequest {
                since: Some("99999999999999999999d".into()),
                ..Default::default()
            },
            "since: ",
        ),
        (
            RedriveRequest {
                since: Some("99999999999w".into()),
                ..Default::default()
            },
            "too far back",
        ),
        (
            RedriveRequest {
                since: Some("1h".into()),
                until: Some("2h".into()),
                ..Default::default()
            },
            "since is after until",
        ),
        (
            RedriveRequest {
                since: Some("2026-13-01T00:00:00Z".into()),
                ..Default::default()
            },
            "since: ",
        ),
        (
            RedriveRequest {
                parallelism: Some(65),
                ..Default::default()
            },
            "parallelism",
        ),
        (
            RedriveRequest {
                rate: Some(0.0),
                ..Default::default()
            },
            "rate",
        ),
        (
            RedriveRequest {
                rate: Some(f64::NAN),
                ..Default::default()
            },
            "rate",
        ),
        (
            RedriveRequest {
                max_items: Some(0),
                ..Default::default()
            },
            "max_items",
        ),
        (
            RedriveRequest {
                time_budget_secs: Some(0),
                ..Default::default()
            },
            "time_budget_secs",
        ),
        (
            RedriveRequest {
                item_ids: vec!["a".into(), String::new()],
                ..Default::default()
            },
            "empty ids",
        ),
        (
            RedriveRequest {
                continuation_token: Some("not a token".into()),
                ..Default::default()
            },
            "continuation token",
        ),
    ];
    for (request, needle) in cases {
        let err = engine
            .run(&request, &*redrive::no_progress())
            .await
            .unwrap_err();
        assert!(
            matches!(err, RedriveError::InvalidRequest(_)),
            "{request:?}: {err}"
        );
        assert!(err.to_string().contains(needle), "{request:?}: {err}");
    }
    // Reprocess needs a processor; the engine says so instead of doing nothing.
    let store = emulator_store("redrive-noproc").await;
    let engine: RedriveEngine<ScriptedProcessor, _> =
        RedriveEngine::new(store, None, RedriveSettings::default());
    let err = engine
        .run(
            &RedriveRequest {
                item_ids: vec!["a".into()],
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("WORKER_DOWNSTREAM_URL"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_of_unknown_ids_is_a_per_item_not_found() {
    let store = emulator_store("redrive-unknown").await;
    let engine = RedriveEngine::new(
        store,
        Some(ScriptedProcessor::new()),
        RedriveSettings::default(),
    );
    for (mode, dry_run) in [
        (RedriveMode::Reprocess, true),
        (RedriveMode::Reprocess, false),
        (RedriveMode::Requeue, false),
    ] {
        let request = RedriveRequest {
            item_ids: vec!["does-not-exist".into(), "😀/also missing".into()],
            mode,
            dry_run,
            ..Default::default()
        };
        let seen = Mutex::new(Vec::new());
        let report = engine
            .run(&request, &|o| seen.lock().unwrap().push(o.clone()))
            .await
            .unwrap();
        assert_eq!(report.selected, 2, "{mode:?} {dry_run}");
        assert_eq!(report.not_found, 2);
        assert_eq!(report.succeeded, 0);
        assert!(report.is_partial_failure(), "unknown ids are not a success");
        for (outcome, id) in report.items.iter().zip(&request.item_ids) {
            assert_eq!(&outcome.item_id, id);
            assert_eq!(outcome.outcome, ItemOutcomeKind::NotFound);
            assert_eq!(
                outcome.detail.as_deref(),
                Some("no record with this item id")
            );
        }
        assert_eq!(*seen.lock().unwrap(), report.items, "progress saw each");
    }
}

/// A record to redrive: dead-letters one throttled item through the real store.
async fn dead_item(store: &DeadLetterStore, item_id: &str) {
    let engine = BatchProcessor::new(
        ScriptedProcessor::new().script(item_id, vec![Step::Fail(ErrorClass::Throttled)]),
        store.clone(),
        BatchConfig {
            max_receive_count: Some(1),
            ..config(ItemParser {
                id_source: ItemIdSource::JsonPointer("/id".into()),
                body_format: BodyFormat::Json,
                envelope: Default::default(),
            })
        },
    );
    let report = engine
        .process_batch(
            event(vec![record(
                &format!("m-{item_id}"),
                &json!({"id": item_id}).to_string(),
            )]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            report.records[0].disposition,
            Disposition::DeadLettered { .. }
        ),
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_of_known_and_unknown_ids_reports_each_once() {
    let store = emulator_store("redrive-mixed").await;
    dead_item(&store, "known").await;
    let engine = RedriveEngine::new(
        store.clone(),
        Some(ScriptedProcessor::new()),
        RedriveSettings::default(),
    );
    let report = engine
        .run(
            &RedriveRequest {
                item_ids: vec!["nope".into(), "known".into()],
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    let outcomes: Vec<(&str, ItemOutcomeKind)> = report
        .items
        .iter()
        .map(|o| (o.item_id.as_str(), o.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("nope", ItemOutcomeKind::NotFound),
            ("known", ItemOutcomeKind::Resolved)
        ]
    );
    assert!(report.is_partial_failure());
}

/// Redrives `item_ids` (after dead-lettering each distinct one) in `mode`, requeueing to a
/// fresh source queue; the report and the source queue's depth.
async fn redrive_ids(
    name: &str,
    item_ids: &[&str],
    mode: RedriveMode,
) -> (sqs_keeper_core::redrive::RedriveReport, String) {
    let store = emulator_store(name).await;
    let distinct: HashSet<&str> = item_ids.iter().copied().collect();
    for id in distinct {
        dead_item(&store, id).await;
    }
    let source = store
        .clients()
        .sqs
        .create_queue()
        .queue_name(unique("source"))
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let engine = RedriveEngine::new(
        store.clone(),
        Some(ScriptedProcessor::new()),
        RedriveSettings {
            source_queue_url: Some(source.clone()),
            ..RedriveSettings::default()
        },
    );
    let report = engine
        .run(
            &RedriveRequest {
                item_ids: item_ids.iter().map(|s| s.to_string()).collect(),
                mode,
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    let name = aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages;
    let attrs = store
        .clients()
        .sqs
        .get_queue_attributes()
        .queue_url(&source)
        .attribute_names(name.clone())
        .send()
        .await
        .unwrap();
    let depth = attrs
        .attributes()
        .and_then(|a| a.get(&name))
        .cloned()
        .unwrap_or_default();
    (report, depth)
}

/// The same id twice in one reprocess request: selected, processed and reported once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reprocess_of_a_repeated_id_processes_it_once() {
    let (report, _) = redrive_ids("redrive-dup", &["twice", "twice"], RedriveMode::Reprocess).await;
    assert_eq!(report.selected, 1, "{report:?}");
    assert_eq!(report.succeeded, 1, "{report:?}");
    assert_eq!(report.items.len(), 1);
}

/// The same id twice in one requeue request. Leases are taken in one DynamoDB transaction
/// per chunk, and DynamoDB refuses a transaction with two operations on one item
/// (`ValidationException`), which would fail every item of the chunk: the request's ids
/// are made unique first, so the item is requeued once and the others too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_of_a_repeated_id_requeues_it_once_and_the_others_too() {
    let (report, depth) = redrive_ids(
        "requeue-dup",
        &["other", "twice", "twice"],
        RedriveMode::Requeue,
    )
    .await;
    assert_eq!(report.selected, 2, "{report:?}");
    assert_eq!(report.requeued, 2, "other and twice requeued: {report:?}");
    assert_eq!(depth, "2", "each requeued exactly once");
}
// ---------------------------------------------------------------------------------------
// Dead-letter records
// ---------------------------------------------------------------------------------------

/// A processor that fails permanently with a message and a cause chain far larger than a
/// DynamoDB item may hold (400 KB), as a verbose downstream client might.
struct Verbose;

impl Processor for Verbose {
    async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
        let mut error =
            ProcessError::validation(format!("rejected: {}", "é".repeat(300_000))).with_step("x");
        error.causes = (0..50)
            .map(|n| format!("cause {n}: {}", "x".repeat(10_000)))
            .collect();
        Err(error)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_too_large_for_a_record_is_clipped_and_recorded() {
    use sqs_keeper_core::{
        dead_letter::CAUSES_LIMIT, dead_letter::CAUSE_LIMIT, dead_letter::ERROR_MESSAGE_LIMIT,
    };
    let store = emulator_store("verbose").await;
    let engine = BatchProcessor::new(Verbose, store.clone(), config(json_parser()));
    let report = engine
        .process_batch(
            event(vec![record("m-verbose", r#"{"id":"v1"}"#)]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        disposition(&report, "m-verbose"),
        &validation_dead_letter(),
        "recorded and dead-lettered, not returned for a record that cannot be written"
    );
    let stored = store.get("m-verbose").await.unwrap().expect("the record");
    assert!(stored.last_error.len() <= ERROR_MESSAGE_LIMIT);
    assert!(stored.last_error.starts_with("rejected: éé"));
    assert!(
        stored.last_error.ends_with("bytes omitted]"),
        "{}",
        &stored.last_error[stored.last_error.len() - 40..]
    );
    let attempt = &stored.failure_history[0];
    assert_eq!(attempt.error_message, stored.last_error);
    assert_eq!(attempt.causes.len(), CAUSES_LIMIT);
    assert!(attempt.causes.iter().all(|c| c.len() <= CAUSE_LIMIT));
    assert!(attempt.causes[0].starts_with("cause 0: xxx"));
}

/// The largest record the worst case builds, written to DynamoDB Local (which refuses an
/// item over 400 KB): the largest body kept inline, attributes at their cap, and deliveries
/// of 20 attempts whose every field is over its limit, so that the write appending the
/// last delivery holds 70 entries before compaction. `error_code`, `step` and the
/// invocation's fields were not clipped, and the plan counted 51 entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_record_the_worst_case_builds_is_written() {
    let (clients, mut config) = emulator_store_resources("largest").await;
    config.inline_max_bytes = 262_144;
    let store = DeadLetterStore::new(clients, config);
    for delivery in 1..=5u32 {
        store
            .record(&worst_case_delivery(delivery))
            .await
            .unwrap_or_else(|e| panic!("delivery {delivery}: {e}"));
    }
    assert_worst_case_record_compacted(&store).await;
}

/// A compaction that failed (here: a delivery written without the compaction that
/// follows) leaves 70 entries of the largest size; the next delivery's 20 on top pass
/// 400 KB, and DynamoDB refuses the write. The write compacts the record first and is
/// made again. Before, every later write of the item was refused for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_too_large_after_a_failed_compaction_compacts_first() {
    use sqs_keeper_core::{ports::Expect, ports::RecordStore};
    let (clients, mut config) = emulator_store_resources("uncompacted").await;
    config.inline_max_bytes = 262_144;
    let store = DeadLetterStore::new(clients, config);
    for delivery in 1..=3u32 {
        store.record(&worst_case_delivery(delivery)).await.unwrap();
    }
    let fourth = worst_case_delivery(4);
    RecordStore::try_record(&store, &fourth, &fourth.failure_history, None, Expect::Any)
        .await
        .unwrap()
        .expect("appended, not compacted");
    let left = store.get("big").await.unwrap().expect("the record");
    assert_eq!(
        left.failure_history.len(),
        sqs_keeper_core::recording::HISTORY_ENTRIES_MAX,
        "the most a failed compaction leaves"
    );
    store
        .record(&worst_case_delivery(5))
        .await
        .unwrap_or_else(|e| panic!("the write after a failed compaction: {e}"));
    assert_worst_case_record_compacted(&store).await;
}

/// Delivery `delivery` of the worst case for the record's size: the largest body kept
/// inline (under an inline maximum of 256 KiB), attributes at their cap, and 20 attempts
/// whose every field is over its limit.
fn worst_case_delivery(delivery: u32) -> DeadLetteredItem {
    let long = "é".repeat(5_000);
    let invocation = InvocationInfo {
        function_name: Some(long.clone()),
        request_id: Some(long.clone()),
        log_group: Some(long.clone()),
        log_stream: Some(long),
    };
    DeadLetteredItem::from_candidate(
        &worst_case_candidate(&"m".repeat(100), delivery, 20),
        &invocation,
        chrono::Utc::now(),
        Duration::from_secs(86_400),
    )
}

/// Delivery `delivery` of item `big` by message `message_id`, as large as a delivery gets:
/// the largest body kept inline under an inline maximum of 256 KiB, attributes at their cap,
/// and `attempts` attempts whose every field is over its limit.
fn worst_case_candidate(message_id: &str, delivery: u32, attempts: u32) -> DeadLetterCandidate {
    use sqs_keeper_core::recording::stays_inline;
    let inline = (0..=262_144)
        .rev()
        .find(|n| stays_inline(*n, 262_144))
        .unwrap();
    let pad = inline - r#"{"id":"big","pad":""}"#.len();
    let body = json!({"id": "big", "pad": "x".repeat(pad)}).to_string();
    assert_eq!(body.len(), inline);
    let attributes: serde_json::Map<String, serde_json::Value> = (0..10)
        .map(|n| {
            (
                format!("attribute-{n}"),
                json!({"dataType": "String", "stringValue": "a".repeat(3000)}),
            )
        })
        .collect();
    let long = "é".repeat(5_000);
    let message = serde_json::from_value(json!({
        "messageId": message_id,
        "body": body,
        "attributes": {"ApproximateReceiveCount": delivery.to_string(), "SentTimestamp": "1700000000000"},
        "messageAttributes": attributes,
        "eventSourceARN": ARN,
    }))
    .unwrap();
    let parser = ItemParser {
        id_source: ItemIdSource::JsonPointer("/id".into()),
        ..json_parser()
    };
    let item = parser.parse(message_id.to_string(), message).unwrap();
    let mut error = ProcessError::new(ErrorClass::Unknown, long.clone())
        .with_code(long.clone())
        .with_step(long.clone())
        .with_status(599)
        .with_detail(long.clone());
    error.causes = (0..10).map(|_| long.clone()).collect();
    let failures = (1..=attempts)
        .map(|attempt| AttemptFailure {
            attempt,
            started_at: chrono::Utc::now(),
            duration: Duration::from_millis(3),
            error: error.clone(),
        })
        .collect();
    DeadLetterCandidate {
        item,
        error,
        failures,
        reason: DeadLetterReason::ReceiveBudgetExhausted,
    }
}

/// On DynamoDB Local (which refuses an item over 400 KB): the worst case for the sets a
/// record keeps beside its history. One item is dead-lettered by 90 source messages whose
/// ids are 100 characters long (the most SQS gives), each its own single failed attempt at
/// its largest; then one more message fails 20 times. The record holds the largest inline
/// body, attributes at their cap and the fullest history, with the most attempt ids,
/// claims and "sent" marks of the longest ids. With every DLQ send made, the record keeps
/// 32 forgotten "sent" marks beside those of its history; with every send failing, it keeps
/// every unsent claim, twice the entries' ids and the spare for unsent deliveries
/// (`recording::ATTEMPT_IDS_SPARE`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_of_many_long_message_ids_is_written() {
    for sends_fail in [false, true] {
        let (clients, mut config) = emulator_store_resources("wide").await;
        config.inline_max_bytes = 262_144;
        if sends_fail {
            config.queue_url = format!("{}-missing", config.queue_url);
        }
        let settings = config.recording_settings();
        let store = DeadLetterStore::new(clients, config);
        let long = "é".repeat(5_000);
        let invocation = InvocationInfo {
            function_name: Some(long.clone()),
            request_id: Some(long.clone()),
            log_group: Some(long.clone()),
            log_stream: Some(long),
        };
        for n in 0..=90u32 {
            let attempts = if n == 90 { 20 } else { 1 };
            let candidate = worst_case_candidate(&format!("{n:0>100}"), 1, attempts);
            let result = sqs_keeper_core::recording::dead_letter(
                &store,
                &settings,
                &[candidate],
                &invocation,
            )
            .await
            .remove(0);
            assert_eq!(result.is_err(), sends_fail, "message {n}: {result:?}");
        }
        let stored = store.get("big").await.unwrap().expect("the record");
        assert_eq!(stored.failure_count, 110, "every attempt recorded");
        assert!(stored.failure_history.len() <= sqs_keeper_core::recording::HISTORY_ENTRIES_MAX);
        assert!(
            matches!(
                stored.payload.location,
                sqs_keeper_core::dead_letter::PayloadLocation::Inline { .. }
            ),
            "the body stayed inline"
        );
        if sends_fail {
            let written = sqs_keeper_core::recording::read_written(&store, "big")
                .await
                .unwrap()
                .unwrap();
            assert!(
                written.attempt_ids.len() > 2 * stored.failure_history.len(),
                "the spare for unsent deliveries is in use: {} ids, {} entries",
                written.attempt_ids.len(),
                stored.failure_history.len()
            );
        }
    }
}

/// The worst-case record after five deliveries: every attempt counted, the history
/// compacted, the body inline.
async fn assert_worst_case_record_compacted(store: &DeadLetterStore) {
    let stored = store.get("big").await.unwrap().expect("the record");
    assert_eq!(stored.failure_count, 100);
    assert!(stored.failure_history.len() <= sqs_keeper_core::dead_letter::HISTORY_LIMIT);
    assert!(
        matches!(
            stored.payload.location,
            sqs_keeper_core::dead_letter::PayloadLocation::Inline { .. }
        ),
        "the body stayed inline"
    );
}

/// The store reads a source queue's retention (`MessageRetentionPeriod`) through the SDK,
/// so that a run sets back to dead a record requeued there once its message is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_queues_retention_is_read_from_its_attributes() {
    use aws_sdk_sqs::types::QueueAttributeName;
    use sqs_keeper_core::ports::SourceQueue;
    let (clients, config) = emulator_store_resources("retention").await;
    let url = clients
        .sqs
        .create_queue()
        .queue_name(unique("short-retention"))
        .attributes(QueueAttributeName::MessageRetentionPeriod, "3600")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let store = DeadLetterStore::new(clients, config);
    let retention = SourceQueue::message_retention(&store, &url).await.unwrap();
    assert_eq!(retention, Duration::from_secs(3_600));
    let missing = SourceQueue::message_retention(&store, &format!("{url}-gone")).await;
    assert!(missing.is_err(), "{missing:?}");
}

/// A record of `item_id` for one failed attempt of delivery `delivery`.
fn failed_delivery(item_id: &str, delivery: u32, class: ErrorClass) -> DeadLetteredItem {
    let message = serde_json::from_value(json!({
        "messageId": format!("m-{item_id}"),
        "body": json!({"id": item_id}).to_string(),
        "attributes": {"ApproximateReceiveCount": delivery.to_string(), "SentTimestamp": "1700000000000"},
        "eventSourceARN": ARN,
    }))
    .unwrap();
    let parser = ItemParser {
        id_source: ItemIdSource::JsonPointer("/id".into()),
        body_format: BodyFormat::Json,
        envelope: Default::default(),
    };
    let item = parser.parse(format!("m-{item_id}"), message).unwrap();
    let error = ProcessError::new(class, format!("delivery {delivery} failed"));
    let candidate = DeadLetterCandidate {
        failures: vec![AttemptFailure {
            attempt: 1,
            started_at: chrono::Utc::now(),
            duration: Duration::from_millis(3),
            error: error.clone(),
        }],
        item,
        error,
        reason: DeadLetterReason::Permanent,
    };
    DeadLetteredItem::from_candidate(
        &candidate,
        &InvocationInfo::default(),
        chrono::Utc::now(),
        Duration::from_secs(86_400),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_that_keeps_failing_keeps_a_bounded_history_and_an_exact_count() {
    let (clients, mut config) = emulator_store_resources("history").await;
    config.history_limit = 4;
    let store = DeadLetterStore::new(clients, config);
    // Ten deliveries; the third is a permission failure, which requires manual review
    // even after its entry has been dropped from the history.
    for delivery in 1..=10 {
        let class = if delivery == 3 {
            ErrorClass::Permission
        } else {
            ErrorClass::Throttled
        };
        store
            .record(&failed_delivery("h1", delivery, class))
            .await
            .unwrap();
    }
    // Recording a known attempt again changes nothing.
    store
        .record(&failed_delivery("h1", 10, ErrorClass::Throttled))
        .await
        .unwrap();
    let stored = store.get("h1").await.unwrap().expect("the record");
    assert_eq!(stored.failure_count, 10);
    let deliveries: Vec<u32> = stored
        .failure_history
        .iter()
        .map(|f| f.receive_count)
        .collect();
    assert_eq!(
        deliveries,
        [1, 2, 9, 10],
        "the first and the latest attempts"
    );
    assert_eq!(stored.history_omitted, 6);
    assert_eq!(
        u32::try_from(stored.failure_history.len()).unwrap() + stored.history_omitted,
        stored.failure_count
    );
    assert!(
        stored.manual_review_required,
        "the dropped permission failure still counts"
    );
    assert_eq!(stored.last_error, "delivery 10 failed");
}

/// A worker that dead-letters a new delivery of an item while a redrive holds its lease
/// (found by the simulation, seed 7291): the run may neither resolve the record nor mark it
/// requeued with the payload it read, since the record now holds another one. The
/// DynamoDB conditions refuse both; the item stays dead with the new payload for the next
/// run, and the lease can be given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cannot_finish_an_item_whose_payload_a_new_failure_replaced() {
    use sqs_keeper_core::dead_letter::ItemStatus;
    let store = emulator_store("replaced").await;
    let id = unique("replaced-item");
    dead_item(&store, &id).await;
    let read = store.get(&id).await.unwrap().unwrap();
    assert!(store
        .acquire_lease(&id, "run-1", Duration::from_secs(60))
        .await
        .unwrap());

    // A new delivery of the same item, another body, dead-lettered by the worker.
    let engine = BatchProcessor::new(
        ScriptedProcessor::new().script(&id, vec![Step::Fail(ErrorClass::Validation)]),
        store.clone(),
        config(ItemParser {
            id_source: ItemIdSource::JsonPointer("/id".into()),
            body_format: BodyFormat::Json,
            envelope: Default::default(),
        }),
    );
    engine
        .process_batch(
            event(vec![record(
                &format!("m2-{id}"),
                &json!({"id": id, "version": 2}).to_string(),
            )]),
            far_deadline(),
            &InvocationInfo::default(),
        )
        .await
        .unwrap();
    let now = store.get(&id).await.unwrap().unwrap();
    assert_ne!(now.payload.sha256, read.payload.sha256);

    let resolved = store.resolve(&read, "run-1").await;
    assert!(
        resolved.is_err(),
        "resolved with a payload it did not process"
    );
    let requeued = store.mark_requeued(&read, "run-1", "sent-1").await;
    assert!(
        requeued.is_err(),
        "marked requeued with a payload it did not send"
    );
    let after = store.get(&id).await.unwrap().unwrap();
    assert_eq!(after.status, ItemStatus::Dead);
    assert_eq!(after.payload.sha256, now.payload.sha256);
    store.release_lease(&id, "run-1").await.unwrap();

    // Unchanged, the same calls go through.
    assert!(store
        .acquire_lease(&id, "run-2", Duration::from_secs(60))
        .await
        .unwrap());
    store.resolve(&after, "run-2").await.unwrap();
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().status,
        ItemStatus::Resolved
    );
}

/// A failed delivery `delivery` of item `item_id`, carried by message `message_id`.
fn claim_candidate(item_id: &str, message_id: &str, delivery: u32) -> DeadLetterCandidate {
    let message = serde_json::from_value(json!({
        "messageId": message_id,
        "body": json!({"id": item_id}).to_string(),
        "attributes": {"ApproximateReceiveCount": delivery.to_string(), "SentTimestamp": "1700000000000"},
        "eventSourceARN": ARN,
    }))
    .unwrap();
    let parser = ItemParser {
        id_source: ItemIdSource::JsonPointer("/id".into()),
        body_format: BodyFormat::Json,
        envelope: Default::default(),
    };
    let item = parser.parse(message_id.to_string(), message).unwrap();
    let error = ProcessError::new(ErrorClass::Throttled, format!("delivery {delivery} failed"));
    DeadLetterCandidate {
        failures: vec![AttemptFailure {
            attempt: 1,
            started_at: chrono::Utc::now(),
            duration: Duration::from_millis(3),
            error: error.clone(),
        }],
        item,
        error,
        reason: DeadLetterReason::ReceiveBudgetExhausted,
    }
}

/// How many messages the DLQ at `url` holds (received and left hidden).
async fn dlq_message_count(clients: &AwsClients, url: &str) -> usize {
    let mut n = 0;
    loop {
        let out = clients
            .sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(600)
            .send()
            .await
            .unwrap();
        let got = out.messages().len();
        if got == 0 {
            return n;
        }
        n += got;
    }
}

/// Dead-letters the first delivery of each of `messages`, one item `item_id`, one after
/// another; each message with what its dead-lettering returned.
async fn dead_letter_each<'m>(
    store: &DeadLetterStore,
    settings: &sqs_keeper_core::recording::RecordingSettings,
    item_id: &str,
    messages: &[&'m str],
) -> Vec<(&'m str, Result<(), ProcessError>)> {
    let mut results = Vec::new();
    for &m in messages {
        let candidate = claim_candidate(item_id, m, 1);
        let mut r = sqs_keeper_core::recording::dead_letter(
            store,
            settings,
            &[candidate],
            &InvocationInfo::default(),
        )
        .await;
        results.push((m, r.remove(0)));
    }
    results
}

/// On DynamoDB Local: two compactions built from one read of the record; the second is
/// refused, so `history_omitted` counts each dropped attempt once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_compaction_of_one_read_is_refused_on_dynamodb() {
    use sqs_keeper_core::ports::RecordStore;
    let (clients, mut config) = emulator_store_resources("compact-twice").await;
    config.history_limit = 100;
    let settings = config.recording_settings();
    let store = DeadLetterStore::new(clients.clone(), config);
    for (m, r) in dead_letter_each(
        &store,
        &settings,
        "t",
        &["m0", "m1", "m2", "m3", "m4", "m5"],
    )
    .await
    {
        assert!(r.is_ok(), "{m}: {r:?}");
    }
    let written = sqs_keeper_core::recording::read_written(&store, "t")
        .await
        .unwrap()
        .unwrap();
    let compaction = sqs_keeper_core::recording::compaction_of(&written, 4).unwrap();
    for _ in 0..2 {
        RecordStore::compact(&store, &written.record, &compaction)
            .await
            .unwrap();
    }
    let t = store.get("t").await.unwrap().unwrap();
    assert_eq!(t.failure_history.len(), 4);
    assert_eq!(t.history_omitted, t.failure_count - 4, "counted once");
}

/// On DynamoDB Local: a compaction that keeps the ids of unsent single-attempt deliveries
/// (their DLQ sends failed) lands. DynamoDB refuses a string set holding an id twice, and
/// such a compaction once listed each of those ids twice (found by an outside review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_keeping_unsent_single_attempts_lands_on_dynamodb() {
    let (clients, mut config) = emulator_store_resources("unsent-ids").await;
    config.history_limit = 4;
    let settings = config.recording_settings();
    // The DLQ sends fail: the queue does not exist.
    config.queue_url = format!("{}-missing", config.queue_url);
    let store = DeadLetterStore::new(clients.clone(), config);
    for (m, r) in dead_letter_each(
        &store,
        &settings,
        "u",
        &["m0", "m1", "m2", "m3", "m4", "m5"],
    )
    .await
    {
        assert!(r.is_err(), "{m}'s DLQ send fails: {r:?}");
    }
    let u = store.get("u").await.unwrap().unwrap();
    assert_eq!(u.failure_count, 6);
    assert!(
        u.failure_history.len() <= 4,
        "compacted on DynamoDB: {} entries",
        u.failure_history.len()
    );
}

/// On DynamoDB Local: the receive after next takes over the claim a cut delivery left and sends,
/// its twin and the next receive send nothing more, and a compaction deletes a forgotten
/// message's claim and lists its "sent" mark in one update, so that its twin still sends
/// nothing. One DLQ message per source message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_claim_is_taken_over_and_compaction_deletes_claims_on_dynamodb() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use sqs_keeper_core::{dead_letter::DlqClaim, ports::Expect, ports::RecordStore};
    let (clients, mut config) = emulator_store_resources("claims").await;
    config.history_limit = 4;
    let url = config.queue_url.clone();
    let settings = config.recording_settings();
    let table_name = config.table.clone();
    let store = DeadLetterStore::new(clients.clone(), config);
    let info = InvocationInfo::default();
    // A delivery cut after its claim (receive 3), then receive 4 dead-letters it.
    let cut = DeadLetteredItem::from_candidate(
        &claim_candidate("c", "mc", 3),
        &info,
        chrono::Utc::now(),
        Duration::from_secs(86_400),
    );
    RecordStore::try_record(
        &store,
        &cut,
        &cut.failure_history,
        Some(&DlqClaim::of(&cut.source)),
        Expect::Any,
    )
    .await
    .unwrap()
    .expect("claimed");
    let r = sqs_keeper_core::recording::dead_letter(
        &store,
        &settings,
        &[claim_candidate("c", "mc", 5)],
        &info,
    )
    .await;
    assert!(r[0].is_ok(), "{r:?}");
    let d = RecordStore::deliveries(&store, "c").await.unwrap();
    assert!(d.sent.contains("mc"));
    // Its twin (receive 5 again) and receive 6: nothing more sent.
    for receive in [5, 6] {
        let r = sqs_keeper_core::recording::dead_letter(
            &store,
            &settings,
            &[claim_candidate("c", "mc", receive)],
            &info,
        )
        .await;
        assert!(r[0].is_ok(), "{receive}: {r:?}");
    }
    // Compaction deleting from both sets in one update.
    for (m, r) in dead_letter_each(&store, &settings, "k", &["p", "q", "r", "s", "t"]).await {
        assert!(r.is_ok(), "{m}: {r:?}");
    }
    let k = store.get("k").await.unwrap().unwrap();
    let d = RecordStore::deliveries(&store, "k").await.unwrap();
    assert_eq!(k.failure_count, 5);
    assert!(k.failure_history.len() <= 4, "compacted on DynamoDB");
    assert!(
        d.sent.contains("r") && !d.claims.contains("r:1"),
        "r's entries and claim gone, its mark kept: {d:?}"
    );
    let item = clients
        .dynamodb
        .get_item()
        .table_name(&table_name)
        .key("item_id", AttributeValue::S("k".into()))
        .send()
        .await
        .unwrap();
    let listed = item
        .item()
        .and_then(|i| i.get("dlq_sent_forgotten"))
        .cloned();
    assert_eq!(
        listed,
        Some(AttributeValue::L(vec![AttributeValue::S("r".into())])),
        "the marks of messages with no entry left, oldest first"
    );
    // r's twin, after the compaction: nothing appended, nothing sent.
    let r = sqs_keeper_core::recording::dead_letter(
        &store,
        &settings,
        &[claim_candidate("k", "r", 1)],
        &info,
    )
    .await;
    assert!(r[0].is_ok(), "{r:?}");
    assert_eq!(store.get("k").await.unwrap().unwrap().failure_count, 5);
    assert_eq!(
        dlq_message_count(&clients, &url).await,
        6,
        "one per source message"
    );
}

/// A table misnamed in the configuration (`DLQ_TABLE=no-such-table`) fails every dead
/// letter with an error that names the table and the region, not only DynamoDB's
/// `ResourceNotFoundException`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_into_a_missing_table_names_the_table_and_region() {
    use sqs_keeper_core::dead_letter::DeadLetterSink;
    let (clients, mut config) = emulator_store_resources("missing-table").await;
    config.table = unique("no-such-table");
    let store = DeadLetterStore::new(clients, config.clone());
    let results = store
        .dead_letter(
            &[claim_candidate("order-1", "m-1", 1)],
            &InvocationInfo::default(),
        )
        .await;
    let error = results[0].as_ref().unwrap_err();
    assert!(
        error.message.contains(&format!("table {}", config.table))
            && error.message.contains("us-east-1"),
        "{error:?}"
    );
}

/// `DLQ_CHECK_AT_START`'s reads: a store whose three resources exist passes; one whose
/// table, DLQ and bucket are all misnamed fails with each named, and its region.
#[tokio::test]
async fn the_start_up_check_passes_a_whole_store_and_names_each_missing_resource() {
    let (clients, config) = emulator_store_resources("start-check").await;
    let whole = DeadLetterStore::new(clients.clone(), config.clone());
    whole.check_reachable().await.unwrap();

    let mut wrong = config.clone();
    wrong.table = unique("no-such-table");
    wrong.queue_url = format!("{}-gone", config.queue_url);
    wrong.bucket = unique("no-such-bucket");
    let error = DeadLetterStore::new(clients, wrong.clone())
        .check_reachable()
        .await
        .unwrap_err();
    for named in [
        format!("table {}", wrong.table),
        format!("queue {}", wrong.queue_url.rsplit('/').next().unwrap()),
        format!("bucket {}", wrong.bucket),
        "us-east-1".to_string(),
    ] {
        assert!(error.contains(&named), "{named} not in: {error}");
    }
    // The queue by its name only: its URL carries the account id.
    assert!(!error.contains(&wrong.queue_url), "{error}");
}

/// An endpoint that takes the connection and never answers is named within the check's
/// bound, well inside Lambda's 10 s init limit.
#[tokio::test]
async fn the_start_up_check_names_a_silent_endpoint_in_time() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = silent.local_addr().unwrap();
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let (clients, config) = emulator_store_resources("start-silent").await;
    let s3_config = clients
        .s3
        .config()
        .to_builder()
        .endpoint_url(format!("http://{address}"))
        .build();
    let mut silent_clients = clients.clone();
    silent_clients.s3 = aws_sdk_s3::Client::from_conf(s3_config);
    let started = std::time::Instant::now();
    let error = DeadLetterStore::new(silent_clients, config.clone())
        .check_reachable()
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(
        error.contains(&format!("bucket {}", config.bucket)) && error.contains("no answer"),
        "{error}"
    );
    assert!(!error.contains("table"), "{error}");
}
