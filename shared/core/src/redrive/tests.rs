//! The redrive engine's unit tests: the whole engine over [`MemoryStore`] (the in-memory
//! world of `testing`), no emulator.
//! Selection, continuation, eligibility, leases, both modes, every error path the ports can
//! take, and the report's bounds.

use crate::clock::Clock;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::dead_letter::{DeadLetteredItem, ItemStatus, MessageAttribute, PayloadLocation};
use crate::error::{ErrorClass, ProcessError};
use crate::pointer::S3Pointer;
use crate::ports::RecordStore;
use crate::processor::Processor;
use crate::sweep::SweepOptions;
use crate::testing::{dead_record, MemoryStore, ScriptedProcessor, Step};

type Engine = RedriveEngine<ScriptedProcessor, MemoryStore>;

impl Engine {
    fn processor_calls(&self, item_id: &str) -> usize {
        self.processor.as_ref().map_or(0, |p| p.calls(item_id))
    }
}

fn engine_with(records: Vec<DeadLetteredItem>, processor: ScriptedProcessor) -> Engine {
    let store = MemoryStore::new();
    for record in records {
        store.insert_dead_lettered(record);
    }
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    RedriveEngine::new(store, Some(processor), settings)
}

fn records(ids: &[&str]) -> Vec<DeadLetteredItem> {
    ids.iter()
        .enumerate()
        .map(|(hours, id)| dead_record(id, ErrorClass::Throttled, hours as i64 + 1))
        .collect()
}

/// A request that requeues every eligible item.
fn requeue_all() -> RedriveRequest {
    RedriveRequest {
        mode: RedriveMode::Requeue,
        ..Default::default()
    }
}

async fn run(engine: &Engine, request: RedriveRequest) -> RedriveReport {
    match engine.run(&request, &*no_progress()).await {
        Ok(report) => report,
        Err(e) => panic!("run failed: {e}"),
    }
}

fn status(engine: &Engine, id: &str) -> Option<ItemStatus> {
    engine.store().record(id).map(|r| r.status)
}

fn outcome(report: &RedriveReport, id: &str) -> ItemOutcomeKind {
    match report.items.iter().find(|o| o.item_id == id) {
        Some(o) => o.outcome,
        None => panic!("no outcome for {id}: {report:?}"),
    }
}

#[tokio::test]
async fn reprocess_resolves_eligible_items_and_deletes_their_dlq_messages() {
    let engine = engine_with(records(&["a", "b", "c"]), ScriptedProcessor::new());
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!((report.selected, report.succeeded), (3, 3), "{report:?}");
    assert_eq!(report.dlq_messages_deleted, 3);
    for id in ["a", "b", "c"] {
        assert_eq!(status(&engine, id), Some(ItemStatus::Resolved));
        assert_eq!(engine.store().lease_owner(id), None);
        assert_eq!(engine.processor_calls(id), 1);
    }
    assert!(engine.store().dlq_messages().is_empty());
}

#[tokio::test]
async fn an_item_that_fails_again_keeps_its_dlq_message_and_gains_history() {
    let processor = ScriptedProcessor::new().script("b", vec![Step::Fail(ErrorClass::Validation)]);
    let engine = engine_with(records(&["a", "b"]), processor);
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!(
        (report.succeeded, report.failed_again),
        (1, 1),
        "{report:?}"
    );
    assert!(report.is_partial_failure());
    let b = engine.store().record("b").unwrap();
    assert_eq!(b.status, ItemStatus::Dead);
    assert_eq!(b.failure_count, 2);
    assert_eq!(b.failure_history.len(), 2);
    assert_eq!(b.error_class, ErrorClass::Validation);
    assert_eq!(
        b.failure_history[1].attempt_id,
        format!("{}:1", report.run_id),
        "the redrive's attempt is named by its run"
    );
    let dlq = engine.store().dlq_messages();
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    assert_eq!(dlq[0].item_id, "b");
    assert!(
        !dlq[0].held,
        "the message is given back, not left invisible"
    );
}

#[tokio::test]
async fn ineligible_items_are_skipped_with_the_reason_unless_forced() {
    let mut rs = records(&["ok", "review"]);
    rs[1].manual_review_required = true;
    let engine = engine_with(rs, ScriptedProcessor::new());
    // By query: ineligible records are not even read.
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!((report.selected, report.succeeded), (1, 1), "{report:?}");
    // By id: reported as skipped, with why.
    let by_id = RedriveRequest {
        item_ids: vec!["review".into()],
        ..Default::default()
    };
    let report = run(&engine, by_id.clone()).await;
    assert_eq!(
        outcome(&report, "review"),
        ItemOutcomeKind::SkippedIneligible
    );
    assert!(report.items[0]
        .detail
        .as_deref()
        .is_some_and(|d| d.contains("manual review")));
    assert_eq!(status(&engine, "review"), Some(ItemStatus::Dead));
    let report = run(
        &engine,
        RedriveRequest {
            force: true,
            ..by_id
        },
    )
    .await;
    assert_eq!(outcome(&report, "review"), ItemOutcomeKind::Resolved);
}

#[tokio::test]
async fn a_dry_run_changes_nothing() {
    let engine = engine_with(records(&["a", "b"]), ScriptedProcessor::new());
    let report = run(
        &engine,
        RedriveRequest {
            dry_run: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(report.selected, 2);
    assert!(report
        .items
        .iter()
        .all(|o| o.outcome == ItemOutcomeKind::WouldRedrive));
    for id in ["a", "b"] {
        assert_eq!(status(&engine, id), Some(ItemStatus::Dead));
        assert_eq!(engine.processor_calls(id), 0);
    }
    assert_eq!(engine.store().dlq_messages().len(), 2);
    assert!(engine.store().dlq_messages().iter().all(|m| !m.held));
}

#[tokio::test]
async fn max_items_stops_with_a_token_that_resumes_without_repeating() {
    let ids = ["a", "b", "c", "d", "e"];
    let engine = engine_with(records(&ids), ScriptedProcessor::new());
    let mut request = RedriveRequest {
        max_items: Some(2),
        parallelism: Some(1),
        ..Default::default()
    };
    let mut seen = Vec::new();
    for _ in 0..5 {
        let report = run(&engine, request.clone()).await;
        seen.extend(report.items.iter().map(|o| o.item_id.clone()));
        match report.continuation_token {
            Some(token) => request.continuation_token = Some(token),
            None => break,
        }
    }
    // Oldest last attempt first: "e" is the oldest.
    let mut oldest_first = ids.to_vec();
    oldest_first.reverse();
    assert_eq!(seen, oldest_first);
    for id in ids {
        assert_eq!(engine.processor_calls(id), 1, "{id}");
    }
}

#[tokio::test]
async fn ids_are_taken_once_and_unknown_or_unselected_ones_are_reported() {
    let engine = engine_with(records(&["a", "done"]), ScriptedProcessor::new());
    // Resolved as a run resolves it: its message listed processed (else the sweep reopens
    // it, docs/ARCHITECTURE.md §4).
    let mut done = engine.store().record("done").unwrap();
    done.processed = crate::dead_letter::processed_after(&done);
    done.status = ItemStatus::Resolved;
    engine.store().insert(done);
    let report = run(
        &engine,
        RedriveRequest {
            item_ids: vec!["a".into(), "a".into(), "nope".into(), "done".into()],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(report.selected, 3, "{report:?}");
    assert_eq!(outcome(&report, "a"), ItemOutcomeKind::Resolved);
    assert_eq!(outcome(&report, "nope"), ItemOutcomeKind::NotFound);
    assert_eq!(outcome(&report, "done"), ItemOutcomeKind::SkippedIneligible);
    assert_eq!(engine.processor_calls("a"), 1);
}

// Paused: the run settles the DLQ message of the item another run holds by waiting for
// that run (`sweep::settle_held`), up to its wait.
#[tokio::test(start_paused = true)]
async fn an_item_another_run_leases_is_left_to_it() {
    let engine = engine_with(records(&["a"]), ScriptedProcessor::new());
    assert!(
        RecordStore::acquire_lease(engine.store(), "a", "other-run", Duration::from_secs(900))
            .await
            .unwrap()
    );
    let report = run(
        &engine,
        RedriveRequest {
            item_ids: vec!["a".into()],
            status: Some(ItemStatus::Redriving),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(outcome(&report, "a"), ItemOutcomeKind::LeasedElsewhere);
    assert_eq!(
        engine.store().lease_owner("a").as_deref(),
        Some("other-run")
    );
    assert_eq!(engine.processor_calls("a"), 0);
}

// Paused: the run settles the DLQ message of the item another run holds by waiting for
// that run (`sweep::settle_held`), up to its wait.
#[tokio::test(start_paused = true)]
async fn an_item_whose_redrive_died_is_taken_back_when_its_lease_expires() {
    let mut stale = dead_record("stale", ErrorClass::Throttled, 1);
    stale.status = ItemStatus::Redriving;
    stale.lease_expires_at = Some(chrono::Utc::now().timestamp() - 10);
    let mut live = dead_record("live", ErrorClass::Throttled, 1);
    live.status = ItemStatus::Redriving;
    live.lease_expires_at = Some(chrono::Utc::now().timestamp() + 600);
    let engine = engine_with(vec![stale, live], ScriptedProcessor::new());
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!(report.selected, 1, "{report:?}");
    assert_eq!(status(&engine, "stale"), Some(ItemStatus::Resolved));
    assert_eq!(status(&engine, "live"), Some(ItemStatus::Redriving));
}

#[tokio::test]
async fn an_ineligible_item_a_forced_run_left_leased_is_set_dead_again_not_reprocessed() {
    // A forced redrive of a validation failure died (or its outcome write failed) holding
    // the lease. A later run, not forced, takes the lease back and sets the item dead
    // again without calling the processor: else only another forced run would ever free it.
    let mut stale = dead_record("poison", ErrorClass::Validation, 1);
    stale.status = ItemStatus::Redriving;
    stale.lease_expires_at = Some(chrono::Utc::now().timestamp() - 10);
    let engine = engine_with(vec![stale], ScriptedProcessor::new());
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!(
        outcome(&report, "poison"),
        ItemOutcomeKind::SkippedIneligible
    );
    assert_eq!(status(&engine, "poison"), Some(ItemStatus::Dead));
    assert_eq!(engine.store().lease_owner("poison"), None);
    assert_eq!(engine.processor_calls("poison"), 0);
}

#[tokio::test]
async fn requeue_sends_each_item_back_with_our_attributes_and_marks_it_requeued() {
    let mut rs = records(&["a", "b"]);
    rs[0]
        .source
        .message_attributes
        .insert("tenant".into(), MessageAttribute::string("acme"));
    rs[0]
        .source
        .message_attributes
        .insert("item_id".into(), MessageAttribute::string("stale"));
    let engine = engine_with(rs, ScriptedProcessor::new());
    let report = run(&engine, requeue_all()).await;
    assert_eq!(report.requeued, 2, "{report:?}");
    let sent = engine.store().sent();
    assert_eq!(sent.len(), 2);
    let (url, a) = sent.iter().find(|(_, m)| m.body.contains("\"a\"")).unwrap();
    assert_eq!(
        url,
        "https://sqs.us-east-1.amazonaws.com/123456789012/orders"
    );
    let attribute = |name: &str| {
        a.attributes
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.string_value().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(attribute("tenant"), ["acme"]);
    assert_eq!(attribute("item_id"), ["a"], "ours, never the stale copy");
    assert_eq!(
        attribute("requeued_by"),
        std::slice::from_ref(&report.run_id)
    );
    assert_eq!(
        a.group_id, None,
        "a standard queue's message without a group"
    );
    let record = engine.store().record("a").unwrap();
    assert_eq!(record.status, ItemStatus::Requeued);
    assert!(record.requeued_message_id.is_some());
    assert_eq!(engine.processor_calls("a"), 0, "requeue does not process");
    assert!(engine.store().dlq_messages().is_empty());
}

#[tokio::test]
async fn a_refused_or_failed_send_gives_the_items_back() {
    let engine = engine_with(records(&["a", "b"]), ScriptedProcessor::new());
    engine.store().refuse_sends_of("b");
    let request = RedriveRequest {
        mode: RedriveMode::Requeue,
        ..Default::default()
    };
    let report = run(&engine, request.clone()).await;
    assert_eq!(outcome(&report, "a"), ItemOutcomeKind::Requeued);
    assert_eq!(outcome(&report, "b"), ItemOutcomeKind::Error);
    assert_eq!(status(&engine, "b"), Some(ItemStatus::Dead));
    assert_eq!(engine.store().lease_owner("b"), None);

    engine.store().fail("send_batch");
    let report = run(&engine, request).await;
    assert_eq!(outcome(&report, "b"), ItemOutcomeKind::Error);
    assert_eq!(status(&engine, "b"), Some(ItemStatus::Dead));
    assert_eq!(engine.store().lease_owner("b"), None);
    let dlq = engine.store().dlq_messages();
    assert_eq!(dlq.len(), 1, "b's message stays: {dlq:?}");
}

/// A fair queue: a standard queue whose messages carry a `MessageGroupId` (the tenant). The
/// requeued message keeps its tenant, with no deduplication id (a standard queue takes
/// none).
#[tokio::test]
async fn requeue_to_a_fair_queue_keeps_the_tenant_and_sets_no_deduplication_id() {
    let mut r = dead_record("a", ErrorClass::Throttled, 1);
    r.source.message_group_id = Some("tenant-9".into());
    let engine = engine_with(vec![r], ScriptedProcessor::new());
    run(&engine, requeue_all()).await;
    let sent = engine.store().sent();
    assert_eq!(sent.len(), 1);
    assert!(!sent[0].0.ends_with(".fifo"));
    assert_eq!(sent[0].1.group_id.as_deref(), Some("tenant-9"));
    assert_eq!(sent[0].1.deduplication_id, None);
}

#[tokio::test]
async fn requeue_to_a_fifo_queue_sets_group_and_deduplication_ids() {
    let mut r = dead_record("a", ErrorClass::Throttled, 1);
    r.source.queue_arn = Some("arn:aws:sqs:us-east-1:123456789012:orders.fifo".into());
    r.source.message_group_id = Some("customer-7".into());
    let engine = engine_with(vec![r], ScriptedProcessor::new());
    run(&engine, requeue_all()).await;
    let sent = engine.store().sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1.group_id.as_deref(), Some("customer-7"));
    assert_eq!(
        sent[0].1.deduplication_id.as_ref().map(String::len),
        Some(64)
    );
}

#[tokio::test]
async fn processed_but_not_marked_resolved_gives_the_item_back_at_once() {
    let engine = engine_with(records(&["a"]), ScriptedProcessor::new());
    engine.store().fail("resolve");
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!(outcome(&report, "a"), ItemOutcomeKind::Error);
    assert_eq!(status(&engine, "a"), Some(ItemStatus::Dead));
    assert_eq!(engine.store().lease_owner("a"), None);
    assert_eq!(engine.store().dlq_messages().len(), 1);
}

/// Simulation seed 176717: a redrive resolved an item and deleted its payload object
/// while a worker failed a source message of the same payload again and recorded it under
/// that object. A resolved item's object is kept while a message of it may still be
/// delivered (SQS's longest retention after its last attempt); an older one is deleted.
#[tokio::test]
async fn a_resolved_items_payload_is_kept_while_a_message_of_it_may_be_delivered() {
    let mut recent = dead_record("recent", ErrorClass::Throttled, 1);
    let mut old = dead_record("old", ErrorClass::Throttled, 15 * 24);
    let mut pointers = Vec::new();
    for record in [&mut recent, &mut old] {
        let body = format!(r#"{{"id":"{}"}}"#, record.item_id);
        let pointer = S3Pointer {
            bucket: "payloads".into(),
            key: record.item_id.clone(),
        };
        record.payload.location = PayloadLocation::S3 {
            bucket: pointer.bucket.clone(),
            key: pointer.key.clone(),
        };
        record.payload.sha256 = crate::hex::sha256_hex(body.as_bytes());
        pointers.push((pointer, body));
    }
    let engine = engine_with(vec![recent, old], ScriptedProcessor::new());
    for (pointer, body) in &pointers {
        engine.store().put_payload(pointer, body);
    }
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!(outcome(&report, "recent"), ItemOutcomeKind::Resolved);
    assert_eq!(outcome(&report, "old"), ItemOutcomeKind::Resolved);
    assert!(engine.store().has_payload(&pointers[0].0), "recent: kept");
    assert!(!engine.store().has_payload(&pointers[1].0), "old: deleted");
}

#[tokio::test]
async fn payloads_in_s3_are_checked_then_deleted_once_resolved() {
    let pointer = S3Pointer {
        bucket: "payloads".into(),
        key: "a".into(),
    };
    // Older than SQS's longest retention: no message of it can be delivered any more.
    let mut good = dead_record("good", ErrorClass::Throttled, 15 * 24);
    let body = r#"{"id":"good"}"#;
    good.payload.location = PayloadLocation::S3 {
        bucket: pointer.bucket.clone(),
        key: pointer.key.clone(),
    };
    good.payload.sha256 = crate::hex::sha256_hex(body.as_bytes());
    let mut tampered = dead_record("tampered", ErrorClass::Throttled, 2);
    let other = S3Pointer {
        bucket: "payloads".into(),
        key: "b".into(),
    };
    tampered.payload.location = PayloadLocation::S3 {
        bucket: other.bucket.clone(),
        key: other.key.clone(),
    };
    let engine = engine_with(vec![good, tampered], ScriptedProcessor::new());
    engine.store().put_payload(&pointer, body);
    engine
        .store()
        .put_payload(&other, "not what the record says");
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!(outcome(&report, "good"), ItemOutcomeKind::Resolved);
    assert!(
        !engine.store().has_payload(&pointer),
        "deleted once resolved"
    );
    assert_eq!(outcome(&report, "tampered"), ItemOutcomeKind::FailedAgain);
    let tampered = engine.store().record("tampered").unwrap();
    assert!(
        tampered.last_error.contains("sha256"),
        "{}",
        tampered.last_error
    );
    assert_eq!(engine.processor_calls("tampered"), 0);
    assert!(engine.store().has_payload(&other));
}

#[tokio::test]
async fn reprocess_without_a_processor_is_refused_before_anything_changes() {
    let store = MemoryStore::new();
    store.insert_dead_lettered(dead_record("a", ErrorClass::Throttled, 1));
    let engine: Engine = RedriveEngine::new(store, None, RedriveSettings::default());
    let err = engine
        .run(&RedriveRequest::default(), &*no_progress())
        .await
        .unwrap_err();
    assert!(matches!(err, RedriveError::InvalidRequest(_)), "{err}");
    assert_eq!(status(&engine, "a"), Some(ItemStatus::Dead));
    assert!(!engine.store().dlq_messages()[0].held);
}

#[tokio::test]
async fn the_report_lists_a_bounded_sample_but_counts_everything() {
    let ids: Vec<String> = (0..7).map(|i| format!("i{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut engine = engine_with(records(&refs), ScriptedProcessor::new());
    engine.settings_mut().report_items = 2;
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!((report.selected, report.succeeded), (7, 7));
    assert_eq!((report.items.len(), report.items_omitted), (2, 5));
}

#[tokio::test]
async fn a_run_with_no_time_left_starts_nothing_and_hands_back_a_token() {
    let engine = engine_with(records(&["a", "b"]), ScriptedProcessor::new());
    let deadline = Instant::now() + SETTLE_RESERVE;
    let report = engine
        .run_until(&RedriveRequest::default(), Some(deadline), &*no_progress())
        .await
        .unwrap();
    assert_eq!(report.selected, 0, "{report:?}");
    assert!(report.continuation_token.is_some());
    for id in ["a", "b"] {
        assert_eq!(status(&engine, id), Some(ItemStatus::Dead));
    }
    assert!(engine.store().dlq_messages().iter().all(|m| !m.held));
}

#[tokio::test]
async fn a_store_failure_outside_any_item_fails_the_run_and_releases_the_dlq() {
    let engine = engine_with(records(&["a"]), ScriptedProcessor::new());
    engine.store().fail("query_page");
    let err = engine
        .run(&RedriveRequest::default(), &*no_progress())
        .await
        .unwrap_err();
    assert!(matches!(err, RedriveError::Store(_)), "{err}");
    assert!(engine.store().dlq_messages().iter().all(|m| !m.held));
    assert_eq!(status(&engine, "a"), Some(ItemStatus::Dead));
}

#[tokio::test]
async fn a_bad_continuation_token_is_an_invalid_request() {
    let engine = engine_with(records(&["a"]), ScriptedProcessor::new());
    let err = engine
        .run(
            &RedriveRequest {
                continuation_token: Some("%%%".into()),
                ..Default::default()
            },
            &*no_progress(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RedriveError::InvalidRequest(_)), "{err}");
}

#[tokio::test(start_paused = true)]
async fn rate_pacing_never_sleeps_past_the_runs_deadline() {
    // A requeue chunk of 100 items at one every 4 s: pacing it takes 400 s; the run has
    // 120 s.
    let ids: Vec<String> = (0..400).map(|i| format!("i{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let engine = engine_with(records(&refs), ScriptedProcessor::new());
    let started = Instant::now();
    let deadline = started + std::time::Duration::from_secs(120);
    let report = engine
        .run_until(
            &RedriveRequest {
                mode: RedriveMode::Requeue,
                parallelism: Some(10),
                rate: Some(0.25),
                ..RedriveRequest::default()
            },
            Some(deadline),
            &*no_progress(),
        )
        .await
        .unwrap();
    assert!(
        Instant::now() <= deadline,
        "answered {:?} after its deadline",
        Instant::now() - deadline
    );
    assert!(report.selected > 0, "{report:?}");
    assert!(engine.store().dlq_messages().iter().all(|m| !m.held));
}

/// Records the bodies it is given.
#[derive(Clone, Default)]
struct BodyRecorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Processor for BodyRecorder {
    async fn process(
        &self,
        item: &crate::item::WorkItem,
    ) -> Result<crate::processor::Outcome, ProcessError> {
        self.0.lock().unwrap().push(item.body.clone());
        Ok(crate::processor::Outcome::Done)
    }
}

/// Resolves every pointer to one payload.
struct OnePayload;

impl crate::batch::BodyResolver for OnePayload {
    fn resolve<'a>(
        &'a self,
        body: &'a str,
    ) -> futures::future::BoxFuture<'a, Option<Result<String, ProcessError>>> {
        Box::pin(async move {
            S3Pointer::parse(body).map(|_| Ok(r#"{"id":"pointed","total":12}"#.to_string()))
        })
    }
}

/// A record that kept an Extended-Client pointer (the worker could not fetch its payload).
fn pointer_record() -> DeadLetteredItem {
    let mut record = dead_record("pointed", ErrorClass::Throttled, 1);
    record.payload.location = PayloadLocation::Inline {
        body: r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"producer","s3Key":"big"}]"#
            .to_string(),
    };
    record
}

#[tokio::test]
async fn a_kept_pointer_is_reprocessed_with_its_payload_or_refused_never_delivered_as_the_body() {
    for resolving in [false, true] {
        let store = MemoryStore::new();
        store.insert_dead_lettered(pointer_record());
        let processor = BodyRecorder::default();
        let mut settings = RedriveSettings::default();
        settings.retry.max_attempts = 1;
        let mut engine = RedriveEngine::new(store, Some(processor.clone()), settings);
        if resolving {
            engine = engine.with_body_resolver(std::sync::Arc::new(OnePayload));
        }
        let report = engine
            .run(
                &RedriveRequest {
                    force: true,
                    ..RedriveRequest::default()
                },
                &*no_progress(),
            )
            .await
            .unwrap();
        let bodies = processor.0.lock().unwrap().clone();
        assert!(
            bodies.iter().all(|b| S3Pointer::parse(b).is_none()),
            "the pointer reached the downstream: {bodies:?}"
        );
        if resolving {
            assert_eq!(bodies, [r#"{"id":"pointed","total":12}"#]);
            assert_eq!(report.succeeded, 1, "{report:?}");
        } else {
            assert_eq!(report.failed_again, 1, "{report:?}");
            let detail = report.items[0].detail.clone().unwrap_or_default();
            assert!(detail.contains("pointer"), "{detail}");
            assert_eq!(
                engine.store().record("pointed").map(|r| r.status),
                Some(ItemStatus::Dead)
            );
        }
    }
}

/// Issue: a lease lasts 900 s and is never renewed, so an attempt (or a `Retry-After`
/// sleep) that outlasted it ran on while a second run could take the item and process it
/// too. No attempt runs past the lease: it is cut before the lease ends, and the item
/// fails again (a timeout) within it.
#[tokio::test(start_paused = true)]
async fn no_item_runs_past_its_lease() {
    let slow = ScriptedProcessor::new()
        .script("slow", vec![Step::Sleep(Duration::from_secs(600))])
        .script(
            "told-to-wait",
            vec![Step::Error(
                ProcessError::new(ErrorClass::Throttled, "429")
                    .with_retry_after(Duration::from_secs(3_000)),
            )],
        );
    let mut engine = engine_with(records(&["slow", "told-to-wait"]), slow);
    engine.settings_mut().lease_ttl = Duration::from_secs(120);
    engine.settings_mut().retry.max_attempts = 3;
    let started = Instant::now();
    let report = run(
        &engine,
        RedriveRequest {
            parallelism: Some(2),
            ..RedriveRequest::default()
        },
    )
    .await;
    assert_eq!(outcome(&report, "slow"), ItemOutcomeKind::FailedAgain);
    assert_eq!(
        outcome(&report, "told-to-wait"),
        ItemOutcomeKind::FailedAgain
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status(&engine, "slow"), Some(ItemStatus::Dead));
}

/// Issue: each failure sets `last_attempt` to now and the selection read newest first, so
/// items that kept failing headed every scheduled run (which sends no continuation) and an
/// older eligible item was never reached. The selection reads oldest first: an item that
/// failed again goes to the back.
#[tokio::test]
async fn items_that_keep_failing_do_not_starve_an_older_eligible_one() {
    let failing = ScriptedProcessor::new()
        .script("new-1", vec![Step::Fail(ErrorClass::Throttled)])
        .script("new-2", vec![Step::Fail(ErrorClass::Throttled)]);
    let mut rs = records(&["new-1", "new-2"]);
    rs.push(dead_record("old", ErrorClass::Throttled, 48));
    let engine = engine_with(rs, failing);
    for _ in 0..2 {
        run(
            &engine,
            RedriveRequest {
                max_items: Some(2),
                parallelism: Some(1),
                ..Default::default()
            },
        )
        .await;
    }
    assert_eq!(status(&engine, "old"), Some(ItemStatus::Resolved));
}

/// A run reports how long the oldest dead record has waited since its last attempt (what
/// the DLQ age alarm watches when a schedule sweeps the DLQ; the EMF line carries it,
/// `metrics::tests::redrive_document_carries_the_age_of_the_oldest_dead_record`).
#[tokio::test]
async fn a_run_reports_the_age_of_the_oldest_dead_record() {
    let failing = ScriptedProcessor::new().script("b", vec![Step::Fail(ErrorClass::Validation)]);
    let mut rs = records(&["a"]);
    rs.push(dead_record("b", ErrorClass::Validation, 30));
    let engine = engine_with(rs, failing);
    let report = run(&engine, RedriveRequest::default()).await;
    let age = report.oldest_dead_age_secs.unwrap();
    assert!((30 * 3600 - 60..=30 * 3600 + 60).contains(&age), "{age}");
    // Nothing dead: no age.
    let empty = engine_with(records(&["c"]), ScriptedProcessor::new());
    let report = run(&empty, RedriveRequest::default()).await;
    assert_eq!(report.oldest_dead_age_secs, None);
}

/// Issue: a record could stay `requeued` for ever once its requeued message was gone
/// without being finished or dead-lettered (purged from the queue, say). A run sets back to
/// dead a record requeued longer than any queue keeps a message, and leaves a recent one.
#[tokio::test]
async fn a_requeue_that_outlived_every_queue_is_set_back_to_dead() {
    let engine = engine_with(Vec::new(), ScriptedProcessor::new());
    for (id, days) in [("lost", 15), ("recent", 1)] {
        let mut record = dead_record(id, ErrorClass::Throttled, 24 * days + 1);
        record.status = ItemStatus::Requeued;
        record.requeued_message_id = Some(format!("m-{id}"));
        record.requeued_at = Some(chrono::Utc::now() - chrono::Duration::days(days));
        engine.store().insert(record);
    }
    let report = run(
        &engine,
        RedriveRequest {
            item_ids: vec!["none".into()],
            ..RedriveRequest::default()
        },
    )
    .await;
    assert_eq!(report.requeues_outlived, 1);
    let lost = engine.store().record("lost").unwrap();
    assert_eq!(lost.status, ItemStatus::Dead);
    assert_eq!(lost.requeued_message_id, None);
    assert!(lost.last_error.contains("m-lost"), "{}", lost.last_error);
    assert!(lost.reprocess_eligible);
    assert_eq!(status(&engine, "recent"), Some(ItemStatus::Requeued));
}

/// A requeue whose queue cannot be named counts as outlived only past SQS's longest
/// retention and the margin (14 days and an hour), and its record is kept a day longer.
#[test]
fn a_requeue_of_a_queue_unknown_outlives_sqs_longest_retention_and_the_margin() {
    assert_eq!(
        REQUEUE_OUTLIVED,
        crate::ports::SQS_MAX_RETENTION + REQUEUE_MARGIN
    );
    assert_eq!(REQUEUE_OUTLIVED, Duration::from_secs(14 * 86_400 + 3_600));
    assert_eq!(
        REQUEUED_RECORD_LIFE,
        REQUEUE_OUTLIVED + Duration::from_secs(86_400)
    );
}

/// A record requeued to a queue that keeps messages an hour waits `requeued` an hour and
/// the margin, not 14 days: past that its message is gone (found by the simulation,
/// seed 58653, whose requeued message expired in a short-retention queue).
#[tokio::test]
async fn a_requeue_outlives_its_own_queues_retention() {
    let engine = engine_with(Vec::new(), ScriptedProcessor::new());
    let mut queue = crate::testing::Queue::source("orders", "123456789012");
    queue.retention = Duration::from_secs(3_600);
    engine.store().world().lock().sources.push(queue);
    for (id, minutes) in [("lost", 121), ("recent", 90)] {
        let mut record = dead_record(id, ErrorClass::Throttled, 3);
        record.source.queue_arn = Some("arn:aws:sqs:us-east-1:123456789012:orders".into());
        record.status = ItemStatus::Requeued;
        record.requeued_message_id = Some(format!("m-{id}"));
        record.requeued_at = Some(chrono::Utc::now() - chrono::Duration::minutes(minutes));
        engine.store().insert(record);
    }
    let report = run(
        &engine,
        RedriveRequest {
            item_ids: vec!["none".into()],
            ..RedriveRequest::default()
        },
    )
    .await;
    assert_eq!(report.requeues_outlived, 1);
    assert_eq!(status(&engine, "lost"), Some(ItemStatus::Dead));
    let lost = engine.store().record("lost").unwrap();
    assert!(lost.last_error.contains("2h"), "{}", lost.last_error);
    assert_eq!(status(&engine, "recent"), Some(ItemStatus::Requeued));
}

/// A redrive of the items `ids`, one at a time, `max_items` a run.
fn named_one_at_a_time(ids: &[&str], max_items: usize) -> RedriveRequest {
    RedriveRequest {
        item_ids: ids.iter().map(|id| id.to_string()).collect(),
        max_items: Some(max_items),
        parallelism: Some(1),
        ..Default::default()
    }
}

#[tokio::test]
async fn named_items_stop_at_max_items_with_a_token_for_the_rest() {
    let ids = ["a", "b", "c"];
    let engine = engine_with(records(&ids), ScriptedProcessor::new());
    let request = named_one_at_a_time(&ids, 2);
    let report = run(&engine, request.clone()).await;
    assert_eq!(report.items.len(), 2, "{report:?}");
    let token = report
        .continuation_token
        .clone()
        .expect("a token for the rest");
    let rest = run(
        &engine,
        RedriveRequest {
            continuation_token: Some(token),
            ..request
        },
    )
    .await;
    assert_eq!(rest.items.len(), 1, "{rest:?}");
    for id in ids {
        assert_eq!(engine.processor_calls(id), 1, "{id}");
    }
}

/// A chain of runs over named items keeps the instant it began in every token: relative
/// times (`--older-than 24h`) and the bound on failures within the chain read from it, not
/// from each run's start.
#[tokio::test]
async fn a_named_chain_keeps_when_it_began_in_every_token() {
    let ids = ["a", "b", "c"];
    let engine = engine_with(records(&ids), ScriptedProcessor::new());
    let request = named_one_at_a_time(&ids, 1);
    let began = |token: &Option<String>| {
        let token = token.as_deref().expect("a token for the rest");
        request::Continuation::decode(token).unwrap().started_ms
    };
    let first = run(&engine, request.clone()).await;
    let started = began(&first.continuation_token);
    assert!(started.is_some(), "{first:?}");
    let second = run(
        &engine,
        RedriveRequest {
            continuation_token: first.continuation_token.clone(),
            ..request
        },
    )
    .await;
    assert_eq!(began(&second.continuation_token), started);
}

#[tokio::test]
async fn a_redrive_failure_names_its_run_as_the_attempts_request() {
    let processor = ScriptedProcessor::new().script("a", vec![Step::Fail(ErrorClass::Throttled)]);
    let engine = engine_with(records(&["a"]), processor);
    let report = run(&engine, RedriveRequest::default()).await;
    assert_eq!(outcome(&report, "a"), ItemOutcomeKind::FailedAgain);
    let record = engine.store().record("a").unwrap();
    let last = record.failure_history.last().unwrap();
    assert_eq!(last.request_id.as_deref(), Some(report.run_id.as_str()));
}

/// A run that resolves an item whose DLQ message another run's sweep held sweeps the DLQ
/// once more at its end, and the message that run gave back meanwhile is deleted and
/// counted. The report said no message was deleted: that sweep's deletions were multiplied
/// into the count instead of added.
#[tokio::test(start_paused = true)]
async fn a_message_the_settling_sweep_deletes_is_counted_in_the_report() {
    let slow = ScriptedProcessor::new().script("a", vec![Step::Sleep(Duration::from_secs(10))]);
    let engine = engine_with(records(&["a"]), slow);
    // Another run's sweep holds the message; it gives it back while this run redrives "a".
    let other = crate::sweep::sweep_dlq(engine.store(), &SweepOptions::default())
        .await
        .unwrap();
    let other_run_ends = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        crate::sweep::settle_held(
            engine.store(),
            other.held,
            Duration::ZERO,
            Duration::ZERO,
            None,
        )
        .await
        .unwrap();
    };
    let (report, ()) = tokio::join!(run(&engine, RedriveRequest::default()), other_run_ends);
    assert_eq!(outcome(&report, "a"), ItemOutcomeKind::Resolved);
    assert_eq!(report.dlq_messages_deleted, 1, "{report:?}");
    assert!(engine.store().dlq_messages().is_empty());
}

/// A requeue sends ten messages per item in parallel at once: with more than ten in
/// parallel (up to the 64 a request may ask for) it still runs, and requeues every item.
/// A chunk of ten divided by the parallelism was no chunk at all, and the run panicked.
#[tokio::test]
async fn a_requeue_with_more_than_ten_in_parallel_requeues_every_item() {
    let engine = engine_with(records(&["a", "b", "c"]), ScriptedProcessor::new());
    let report = run(
        &engine,
        RedriveRequest {
            mode: RedriveMode::Requeue,
            parallelism: Some(64),
            ..RedriveRequest::default()
        },
    )
    .await;
    assert_eq!(report.requeued, 3, "{report:?}");
    for id in ["a", "b", "c"] {
        assert_eq!(status(&engine, id), Some(ItemStatus::Requeued));
    }
}

/// A run's sweep takes at most half the time items may start in, so that a DLQ too large
/// for one run still leaves the run time to redrive. Given twice that time, the sweep ran
/// past the time items may start in and past the run's deadline: no run redrove anything.
#[tokio::test(start_paused = true)]
async fn a_dlq_too_large_for_one_run_leaves_the_run_half_its_time_to_redrive() {
    let store = MemoryStore::new();
    for record in records(&["a", "b"]) {
        store.insert_dead_lettered(record);
    }
    // A DLQ too large to sweep in one run: 500 messages of items no run takes (validation
    // failures), received ten at a time, each receive taking 5 s.
    for n in 0..500 {
        store.insert_dead_lettered(dead_record(&format!("v{n}"), ErrorClass::Validation, 1));
    }
    store.world().lock().latency =
        Some(|_, operation| (operation == "receive").then_some(Duration::from_secs(5)));
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(store, Some(ScriptedProcessor::new()), settings);
    let deadline = Instant::now() + Duration::from_secs(120);
    let report = engine
        .run_until(&RedriveRequest::default(), Some(deadline), &*no_progress())
        .await
        .unwrap();
    assert!(
        Instant::now() <= deadline,
        "answered {:?} after its deadline",
        Instant::now() - deadline
    );
    assert_eq!(report.succeeded, 2, "{report:?}");
}

/// The DLQ messages a run's sweep could not handle are errors of the run, each counted
/// and listed with why. Multiplied instead of added, the count stayed at zero: a run that
/// left messages it could not handle in the DLQ reported no error and no partial failure.
#[tokio::test]
async fn the_dlq_messages_a_sweep_could_not_handle_are_counted_as_errors_of_the_run() {
    let store = MemoryStore::new();
    for record in records(&["a"]) {
        store.insert_dead_lettered(record);
    }
    // Two messages no record holds, whose adoption fails: the record write is refused.
    for item in ["x", "y"] {
        store.send_dlq_message(
            &format!("{{\"id\":\"{item}\"}}"),
            &[(crate::message::ITEM_ID_ATTRIBUTE, item)],
            None,
        );
    }
    store.fail("try_record");
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(store, Some(ScriptedProcessor::new()), settings);
    let report = engine
        .run(&RedriveRequest::default(), &*no_progress())
        .await
        .unwrap();
    assert_eq!((report.succeeded, report.errors), (1, 2), "{report:?}");
    assert!(report.is_partial_failure());
    for item in ["x", "y"] {
        assert_eq!(outcome(&report, item), ItemOutcomeKind::Error);
    }
}

/// A record that kept a bare Extended-Client pointer (`{"s3BucketName", "s3Key"}`: the
/// worker followed it into an allowed bucket and could not fetch it) is reprocessed with the
/// payload the pointer names, never with the pointer as its body.
mod kept_bare_pointer {
    use super::*;

    /// Follows both pointer forms into bucket `producer`, as the worker's
    /// `ExtendedClientResolver` does (`PayloadPolicy::pointer_in`).
    struct BothForms;

    impl crate::batch::BodyResolver for BothForms {
        fn resolve<'a>(
            &'a self,
            body: &'a str,
        ) -> futures::future::BoxFuture<'a, Option<Result<String, ProcessError>>> {
            Box::pin(async move {
                crate::pointer::PayloadPolicy::allowing(["producer"])
                    .pointer_in(body)
                    .map(|p| p.map(|_| r#"{"id":"pointed","total":12}"#.to_string()))
            })
        }
    }

    #[tokio::test]
    async fn a_kept_bare_pointer_is_never_delivered_as_the_body() {
        let store = MemoryStore::new();
        let mut record = dead_record("pointed", ErrorClass::Throttled, 1);
        record.payload.location = PayloadLocation::Inline {
            body: r#"{"s3BucketName":"producer","s3Key":"big"}"#.to_string(),
        };
        store.insert_dead_lettered(record);
        let processor = BodyRecorder::default();
        let mut settings = RedriveSettings::default();
        settings.retry.max_attempts = 1;
        let engine = RedriveEngine::new(store, Some(processor.clone()), settings)
            .with_body_resolver(std::sync::Arc::new(BothForms));
        engine
            .run(
                &RedriveRequest {
                    force: true,
                    ..RedriveRequest::default()
                },
                &*no_progress(),
            )
            .await
            .unwrap();
        let bodies = processor.0.lock().unwrap().clone();
        assert!(
            bodies.iter().all(|b| S3Pointer::parse_bare(b).is_none()),
            "the bare pointer reached the downstream as the body: {bodies:?}"
        );
    }
}

/// A run draws its id from the engine's random and reads its store's clock (it selects
/// what failed before its now, and the store stamps what it resolves): here tokio's paused
/// clock from the year 2000.
#[tokio::test(start_paused = true)]
async fn a_run_draws_its_id_from_the_engines_random_and_reads_its_stores_clock() {
    use chrono::Datelike;
    let clock = crate::clock::Clock::following_tokio(
        chrono::DateTime::from_timestamp(946_684_800, 0).unwrap(),
    );
    let store = MemoryStore::reading(clock);
    let mut then = dead_record("then", ErrorClass::Throttled, 1);
    then.first_attempt = clock.now() - chrono::Duration::hours(1);
    then.last_attempt = then.first_attempt;
    store.insert_dead_lettered(then);
    // Failed after the engine's now (by the system clock, an hour ago): not selected.
    store.insert_dead_lettered(dead_record("later", ErrorClass::Throttled, 1));
    let settings = RedriveSettings::default().with_random(crate::random::Random::seeded(7));
    let engine = RedriveEngine::new(store, Some(ScriptedProcessor::new()), settings);
    assert_eq!(
        engine.settings.retry.clock, clock,
        "the retry policy reads the store's"
    );
    let report = run(&engine, RedriveRequest::default()).await;
    let first_draw = crate::random::Random::seeded(7).u64(..);
    assert_eq!(report.run_id, format!("redrive-{first_draw:016x}"));
    assert_eq!(report.selected, 1, "{report:?}");
    let resolved_at = engine.store().record("then").unwrap().resolved_at.unwrap();
    assert_eq!(resolved_at.year(), 2000);
    assert_eq!(status(&engine, "later"), Some(ItemStatus::Dead));
}

/// Another run holds a live lease on `a` (taken through the store, so stamped by the
/// store's clock, tokio's paused clock from the year 2000) and resolves `a` two seconds
/// after this run started. The run's settling waits for that run (the lease is live by the
/// clock that set it) and deletes `a`'s DLQ message. The engine is built with the default
/// settings, whose clock is the system's: by that clock the lease expired long ago, and a
/// settling that read it gave the message back at once, to stay beside its resolved record.
#[tokio::test(start_paused = true)]
async fn the_settling_judges_a_lease_by_the_clock_that_stamped_it() {
    let world_clock =
        Clock::following_tokio(chrono::DateTime::from_timestamp(946_684_800, 0).unwrap());
    let store = MemoryStore::reading(world_clock);
    store.insert_dead_lettered(dead_record("a", ErrorClass::Throttled, 1));
    assert!(
        RecordStore::acquire_lease(&store, "a", "other-run", Duration::from_secs(600))
            .await
            .unwrap(),
        "the other run leases a"
    );
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(store.clone(), Some(ScriptedProcessor::new()), settings);
    let the_other_run_resolves_a = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let record = store.record("a").unwrap();
        RecordStore::resolve(&store, &record, "other-run")
            .await
            .unwrap();
    };
    let (report, ()) = tokio::join!(
        run(&engine, RedriveRequest::default()),
        the_other_run_resolves_a
    );
    assert_eq!(status(&engine, "a"), Some(ItemStatus::Resolved));
    assert_eq!(report.dlq_messages_deleted, 1, "{report:?}");
    assert!(
        store.dlq_messages().is_empty(),
        "{:?}",
        store.dlq_messages()
    );
}

/// A requeue run sends to its source queues in the same order at every run: the world's
/// fault draws, its observer's trace and the queues' arrival order follow that order, and a
/// seed replays exactly only if it does not change (docs/ARCHITECTURE.md §5). (Grouped in a
/// `HashMap`, the queues came in the order of its hasher's random keys: all six orders of
/// three queues in twenty runs.)
#[tokio::test]
async fn a_requeue_sends_to_its_source_queues_in_the_same_order_every_time() {
    let mut orders = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let mut rs = records(&["a", "b", "c"]);
        rs[1].source.queue_arn = Some("arn:aws:sqs:us-east-1:123456789012:payments".into());
        rs[2].source.queue_arn = Some("arn:aws:sqs:us-east-1:123456789012:refunds".into());
        let engine = engine_with(rs, ScriptedProcessor::new());
        let report = run(
            &engine,
            RedriveRequest {
                mode: RedriveMode::Requeue,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(report.requeued, 3, "{report:?}");
        let urls: Vec<String> = engine
            .store()
            .sent()
            .into_iter()
            .map(|(url, _)| url)
            .collect();
        orders.insert(urls);
    }
    assert_eq!(
        orders.len(),
        1,
        "one world, one order of sends; seen: {orders:#?}"
    );
}

/// Issue: the token kept only a position, and the selection came from the new command, so
/// `dlq redrive --continue <token>` as printed redrove items never selected, and a dry
/// run's continuation ran for real. The token carries its request.
#[tokio::test]
async fn a_continuation_runs_the_request_its_token_was_printed_for() {
    let mut old = records(&["a", "b", "c"]);
    old.push(dead_record("v", ErrorClass::Validation, 10));
    let engine = engine_with(old, ScriptedProcessor::new());
    let first = RedriveRequest {
        error_class: Some(ErrorClass::Throttled),
        dry_run: true,
        max_items: Some(1),
        ..Default::default()
    };
    let report = run(&engine, first.clone()).await;
    let token = report.continuation_token.clone().expect("a token");
    // The printed line: the token alone, with pacing of its own.
    let mut seen: Vec<String> = report.items.iter().map(|o| o.item_id.clone()).collect();
    let mut next = RedriveRequest {
        continuation_token: Some(token),
        max_items: Some(1),
        ..Default::default()
    };
    loop {
        let report = run(&engine, next.clone()).await;
        assert!(report.dry_run, "a dry run's continuation stays a dry run");
        seen.extend(report.items.iter().map(|o| o.item_id.clone()));
        match report.continuation_token {
            Some(token) => next.continuation_token = Some(token),
            None => break,
        }
    }
    assert_eq!(seen, ["c", "b", "a"], "the throttled items only, each once");
    for id in ["a", "b", "c", "v"] {
        assert_eq!(engine.processor_calls(id), 0, "{id}: a dry run");
        assert_eq!(status(&engine, id), Some(ItemStatus::Dead));
    }
}

#[tokio::test]
async fn a_continuation_with_another_selection_is_refused() {
    let engine = engine_with(records(&["a", "b"]), ScriptedProcessor::new());
    let report = run(
        &engine,
        RedriveRequest {
            dry_run: true,
            max_items: Some(1),
            ..Default::default()
        },
    )
    .await;
    let token = report.continuation_token.expect("a token");
    for other in [
        RedriveRequest {
            force: true,
            ..Default::default()
        },
        RedriveRequest {
            item_ids: vec!["b".into()],
            dry_run: true,
            ..Default::default()
        },
        RedriveRequest {
            mode: RedriveMode::Requeue,
            dry_run: true,
            ..Default::default()
        },
    ] {
        let request = RedriveRequest {
            continuation_token: Some(token.clone()),
            ..other
        };
        let error = engine.run(&request, &*no_progress()).await.unwrap_err();
        assert!(
            matches!(&error, RedriveError::InvalidRequest(m) if m.contains("another request")),
            "{error}"
        );
    }
    assert_eq!(engine.processor_calls("b"), 0);
    // The same selection, repeated beside the token, is the same request.
    let same = RedriveRequest {
        dry_run: true,
        continuation_token: Some(token),
        ..Default::default()
    };
    assert!(engine.run(&same, &*no_progress()).await.is_ok());
}

/// Issue: `dlq redrive --status requeued` (or `resolved`) reported every item "leased by
/// another run" and succeeded.
#[tokio::test]
async fn a_redrive_of_requeued_or_resolved_items_is_an_invalid_request() {
    let engine = engine_with(records(&["a"]), ScriptedProcessor::new());
    for status in [ItemStatus::Requeued, ItemStatus::Resolved] {
        let request = RedriveRequest {
            status: Some(status),
            ..Default::default()
        };
        let error = engine.run(&request, &*no_progress()).await.unwrap_err();
        assert!(
            matches!(&error, RedriveError::InvalidRequest(m) if m.contains("cannot be redriven")),
            "{error}"
        );
    }
}

/// Issue: a requeue never refreshed the record's expiry, so a record requeued late in its
/// retention expired before `requeues_outlived` could set it back to dead, and vanished
/// with its message lost. A requeue keeps it past the reset; the reset keeps it a whole
/// retention from then.
#[tokio::test]
async fn a_requeued_record_outlives_its_reset_and_the_reset_refreshes_its_expiry() {
    let mut record = dead_record("late", ErrorClass::Throttled, 1);
    let now = chrono::Utc::now();
    record.expires_at = now.timestamp() + 3_600;
    let engine = engine_with(vec![record], ScriptedProcessor::new());
    let report = run(&engine, requeue_all()).await;
    assert_eq!(report.requeued, 1, "{report:?}");
    let requeued = engine.store().record("late").unwrap();
    let life = i64::try_from(REQUEUED_RECORD_LIFE.as_secs()).unwrap();
    assert!(
        requeued.expires_at >= now.timestamp() + life,
        "{}",
        requeued.expires_at
    );
    assert!(
        requeued.expires_at > now.timestamp() + i64::try_from(REQUEUE_OUTLIVED.as_secs()).unwrap()
    );

    // Its message lost: the reset, 15 days on, keeps it a whole retention from then.
    let mut outlived = requeued.clone();
    outlived.requeued_at = Some(now - chrono::Duration::days(15));
    outlived.expires_at = now.timestamp() + 600;
    engine.store().insert(outlived);
    let report = run(
        &engine,
        RedriveRequest {
            item_ids: vec!["none".into()],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(report.requeues_outlived, 1);
    let reopened = engine.store().record("late").unwrap();
    assert_eq!(reopened.status, ItemStatus::Dead);
    let retention = i64::try_from(engine.store().settings().retention.as_secs()).unwrap();
    assert!(reopened.expires_at >= now.timestamp() + retention);
}

/// Issue: a redrive attempt cut at its lease or the run's deadline left the idempotency
/// claim in progress for 15 minutes (the engine ran its attempts outside a record's
/// context), so the worker's deliveries of the item were refused meanwhile. The claim now
/// lasts until the item's hard stop, and a cut attempt releases it, as the worker's do.
#[tokio::test(start_paused = true)]
async fn a_redrive_attempt_cut_at_the_runs_deadline_releases_its_idempotency_claim() {
    use crate::idempotency::{Claim, Idempotency, IdempotencyStore, Idempotent};
    let claims = crate::testing::MemoryIdempotencyStore::default();
    let hanging =
        ScriptedProcessor::new().script("a", vec![Step::Sleep(Duration::from_secs(3_600))]);
    let processor = Idempotent::new(
        hanging,
        Idempotency::new(claims.clone(), Duration::from_secs(86_400)),
    );
    let store = MemoryStore::new();
    store.insert_dead_lettered(dead_record("a", ErrorClass::Throttled, 1));
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(store, Some(processor), settings);
    let deadline = Instant::now() + Duration::from_secs(60);
    let report = engine
        .run_until(&RedriveRequest::default(), Some(deadline), &*no_progress())
        .await
        .unwrap();
    assert_eq!(report.failed_again + report.errors, 1, "{report:?}");
    let now = std::time::SystemTime::now();
    let claim = claims
        .claim("a", "next", now + Duration::from_secs(60), now)
        .await
        .unwrap();
    assert!(
        matches!(claim, Claim::Claimed),
        "the cut attempt's claim is left: {claim:?}"
    );
}

/// SQS refuses a body with a character outside its set: a small S3 payload holding one
/// goes back as its pointer, not inline (the in-memory queue refuses it as SQS does).
#[tokio::test]
async fn a_payload_sqs_cannot_carry_is_requeued_as_its_pointer() {
    let pointer = S3Pointer {
        bucket: "payloads".into(),
        key: "a".into(),
    };
    let body = "{\"id\":\"a\",\"note\":\"bell \u{7}\"}";
    let mut record = dead_record("a", ErrorClass::Throttled, 1);
    record.payload.location = PayloadLocation::S3 {
        bucket: pointer.bucket.clone(),
        key: pointer.key.clone(),
    };
    record.payload.sha256 = crate::hex::sha256_hex(body.as_bytes());
    record.payload.size_bytes = body.len() as u64;
    let engine = engine_with(vec![record], ScriptedProcessor::new());
    engine.store().put_payload(&pointer, body);
    let report = run(&engine, requeue_all()).await;
    assert_eq!(report.requeued, 1, "{report:?}");
    let sent = engine.store().sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(S3Pointer::parse(&sent[0].1.body), Some(pointer.clone()));
    assert!(engine.store().has_payload(&pointer));
}

/// A hand-built event's attribute value SQS cannot carry is kept in the record (the DLQ
/// message does not carry it), and a requeue leaves it off: restored, it made the source
/// queue refuse the message, run after run.
#[tokio::test]
async fn a_requeue_leaves_off_an_attribute_sqs_refuses() {
    let store = MemoryStore::new();
    let message = serde_json::from_value(serde_json::json!({
        "messageId": "m-1",
        "body": "{\"id\":\"a\"}",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {"note": {"stringValue": "x\u{1}y", "dataType": "String"}},
    }))
    .unwrap();
    let item = crate::item::ItemParser::default()
        .parse("m-1".into(), message)
        .unwrap();
    let error = ProcessError::new(ErrorClass::Throttled, "slow down");
    let candidate = crate::dead_letter::DeadLetterCandidate {
        item,
        failures: vec![crate::retry::AttemptFailure {
            attempt: 1,
            started_at: chrono::Utc::now(),
            duration: Duration::ZERO,
            error: error.clone(),
        }],
        error,
        reason: crate::dead_letter::DeadLetterReason::ReceiveBudgetExhausted,
    };
    let dead = crate::dead_letter::DeadLetterSink::dead_letter(
        &store,
        &[candidate],
        &crate::dead_letter::InvocationInfo::default(),
    )
    .await;
    assert!(dead[0].is_ok(), "{dead:?}");
    let mut settings = RedriveSettings::default();
    settings.retry.max_attempts = 1;
    let engine = RedriveEngine::new(store, Some(ScriptedProcessor::new()), settings);
    let report = run(&engine, requeue_all()).await;
    assert_eq!(report.requeued, 1, "{report:?}");
}

/// A record keeps its producer's trace, and a redrive continues it: the reprocessed item
/// carries it as its `AWSTraceHeader` (the handler's span, its log lines and
/// `HttpDelivery`'s headers read it there), and a requeued message sends it as its own.
#[tokio::test]
async fn a_redrive_continues_the_records_trace_when_it_reprocesses_or_requeues() {
    let header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    let mut traced = dead_record("a", ErrorClass::Throttled, 1);
    traced.source.trace_header = Some(header.to_string());
    let trace = crate::trace::TraceContext::of_dead(&traced).unwrap();
    let item = engine::work_item(&traced, "{}".into());
    assert_eq!(item.trace(), Some(trace.clone()));
    let untraced = engine::work_item(&dead_record("b", ErrorClass::Throttled, 1), "{}".into());
    assert_eq!(untraced.trace(), None);

    let engine = engine_with(
        vec![traced, dead_record("b", ErrorClass::Throttled, 2)],
        ScriptedProcessor::new(),
    );
    let report = run(&engine, requeue_all()).await;
    assert_eq!(report.requeued, 2, "{report:?}");
    let sent = engine.store().sent();
    let header_of = |id: &str| {
        sent.iter()
            .map(|(_, m)| m)
            .find(|m| {
                m.attributes.iter().any(|(n, v)| {
                    n == crate::message::ITEM_ID_ATTRIBUTE && v.string_value() == Some(id)
                })
            })
            .map(|m| m.trace_header.clone())
    };
    assert_eq!(header_of("a"), Some(Some(trace.xray_header())));
    assert_eq!(header_of("b"), Some(None));
}
