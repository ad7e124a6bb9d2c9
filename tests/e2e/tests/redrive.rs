//! Redrive against the emulator: selection, dry run, reprocess, requeue, continuation,
//! concurrency, adoption of unrecorded DLQ messages, and bad requests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use e2e::{body, outcome_ids, Pipeline, Setup};
use serde_json::json;
use sqs_keeper_core::ErrorClass;
use sqs_keeper_core::{dead_letter::ItemStatus, dead_letter::PayloadLocation, DeadLetterReason};
use sqs_keeper_core::{
    redrive, redrive::ItemOutcomeKind, redrive::RedriveError, redrive::RedriveMode,
    redrive::RedriveRequest,
};

/// A pipeline whose items dead-letter on their first delivery.
async fn dead_items(name: &str, items: &[(&str, &str)]) -> Pipeline {
    let bodies: Vec<String> = items.iter().map(|(id, s)| body(id, s)).collect();
    Pipeline::with_dead_items(name, &bodies).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_selects_by_filters_and_changes_nothing() {
    let p = dead_items(
        "dry",
        &[
            ("t1", "throttled"),
            ("t2", "throttled"),
            ("v1", "invalid"),
            ("f1", "forbidden"),
        ],
    )
    .await;
    let before = p.records().await;
    let engine = p.redrive_engine();
    let run = |request: RedriveRequest| {
        let engine = &engine;
        async move {
            engine
                .run(&request, &*redrive::no_progress())
                .await
                .unwrap()
        }
    };
    let all = run(RedriveRequest {
        dry_run: true,
        ..Default::default()
    })
    .await;
    // Ineligible records are not even read without `force` (they would count against
    // `max_items` and starve eligible ones).
    assert_eq!(all.selected, 2);
    assert_eq!(
        outcome_ids(&all, ItemOutcomeKind::WouldRedrive),
        ["t1", "t2"]
    );
    assert_eq!(
        outcome_ids(&all, ItemOutcomeKind::SkippedIneligible),
        Vec::<String>::new()
    );

    let forced_validation = run(RedriveRequest {
        dry_run: true,
        force: true,
        error_class: Some(ErrorClass::Validation),
        ..Default::default()
    })
    .await;
    assert_eq!(
        outcome_ids(&forced_validation, ItemOutcomeKind::WouldRedrive),
        ["v1"]
    );

    let signature = before
        .iter()
        .find(|r| r.item_id == "t1")
        .unwrap()
        .error_signature
        .clone();
    let by_signature = run(RedriveRequest {
        dry_run: true,
        error_signature: Some(signature),
        ..Default::default()
    })
    .await;
    assert_eq!(
        outcome_ids(&by_signature, ItemOutcomeKind::WouldRedrive),
        ["t1", "t2"]
    );

    let by_ids = run(RedriveRequest {
        dry_run: true,
        item_ids: vec!["t2".into(), "nope".into()],
        ..Default::default()
    })
    .await;
    assert_eq!(outcome_ids(&by_ids, ItemOutcomeKind::WouldRedrive), ["t2"]);
    assert_eq!(outcome_ids(&by_ids, ItemOutcomeKind::NotFound), ["nope"]);
    assert!(by_ids.is_partial_failure());

    let future = run(RedriveRequest {
        dry_run: true,
        since: Some("2999-01-01T00:00:00Z".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(future.selected, 0);
    let recent = run(RedriveRequest {
        dry_run: true,
        since: Some("1h".into()),
        until: Some("0s".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(recent.selected, 2, "the eligible ones");

    let mut after = p.records().await;
    let mut before = before;
    before.sort_by(|a, b| a.item_id.cmp(&b.item_id));
    after.sort_by(|a, b| a.item_id.cmp(&b.item_id));
    assert_eq!(before, after, "a dry run changes no record");
    assert_eq!(p.dlq_depth().await, 4, "nor the DLQ");
    assert_eq!(p.downstream.calls("t1"), 1, "nor calls the downstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reprocess_resolves_successes_and_extends_history_of_failures() {
    let p = dead_items("reproc", &[("ok1", "throttled"), ("ok2", "throttled")]).await;
    // A large eligible item with its payload in S3.
    let large =
        json!({"id": "big", "scenario": "throttled", "blob": "y".repeat(90_000)}).to_string();
    p.send(&[&large]).await;
    p.drain().await;
    assert_eq!(p.objects().await.len(), 1);
    p.downstream.fix();
    let engine = p.redrive_engine();
    // Redrive two of the three by id; ok2 stays dead with its DLQ message.
    let report = engine
        .run(
            &RedriveRequest {
                item_ids: vec!["ok1".into(), "big".into()],
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome_ids(&report, ItemOutcomeKind::Resolved),
        ["big", "ok1"]
    );
    assert_eq!(report.dlq_messages_deleted, 2);
    assert_eq!(p.dlq_depth().await, 1, "only ok2's message is left");
    assert_eq!(
        p.objects().await.len(),
        1,
        "a resolved item's payload is kept while a message of it may be delivered (14 days)"
    );
    let ok1 = p.store().get("ok1").await.unwrap().unwrap();
    assert_eq!(ok1.status, ItemStatus::Resolved);
    assert!(ok1.resolved_at.is_some());
    assert!(p.downstream.delivered().contains(&"big".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reprocess_failure_appends_history_and_stays_dead() {
    let p = dead_items("refail", &[("bad", "throttled")]).await;
    let before = p.store().get("bad").await.unwrap().unwrap();
    let report = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(outcome_ids(&report, ItemOutcomeKind::FailedAgain), ["bad"]);
    let after = p.store().get("bad").await.unwrap().unwrap();
    assert_eq!(after.status, ItemStatus::Dead);
    assert_eq!(after.failure_count, before.failure_count + 1);
    assert_eq!(
        after.failure_history.len(),
        before.failure_history.len() + 1
    );
    assert!(after
        .failure_history
        .last()
        .unwrap()
        .attempt_id
        .starts_with(&report.run_id));
    assert!(after.last_attempt > before.last_attempt);
    assert_eq!(p.dlq_depth().await, 1, "its DLQ message is kept");
    // The lease was released: a second run can take it again.
    let again = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(again.failed_again, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_sends_the_original_payload_back_with_its_item_id() {
    let p = dead_items(
        "requeue",
        &[
            ("r1", "throttled"),
            ("r2", "throttled"),
            ("r3", "throttled"),
        ],
    )
    .await;
    let report = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                mode: RedriveMode::Requeue,
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome_ids(&report, ItemOutcomeKind::Requeued),
        ["r1", "r2", "r3"]
    );
    assert_eq!(p.dlq_depth().await, 0);
    let output = p
        .clients
        .sqs
        .receive_message()
        .queue_url(&p.resources.source_url)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap();
    let mut requeued: Vec<(String, String)> = output
        .messages()
        .iter()
        .map(|m| {
            (
                m.message_attributes().unwrap()["item_id"]
                    .string_value()
                    .unwrap()
                    .to_string(),
                m.body().unwrap().to_string(),
            )
        })
        .collect();
    requeued.sort();
    assert_eq!(
        requeued,
        [
            ("r1".to_string(), body("r1", "throttled")),
            ("r2".to_string(), body("r2", "throttled")),
            ("r3".to_string(), body("r3", "throttled")),
        ]
    );
    for r in p.records().await {
        assert_eq!(
            r.status,
            ItemStatus::Requeued,
            "until the worker finishes it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuation_token_resumes_where_it_stopped() {
    let items: Vec<(String, &str)> = (1..=5).map(|i| (format!("c{i}"), "throttled")).collect();
    let refs: Vec<(&str, &str)> = items.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    let p = dead_items("resume", &refs).await;
    p.downstream.fix();
    let engine = p.redrive_engine();
    let mut request = RedriveRequest {
        max_items: Some(2),
        parallelism: Some(1),
        ..Default::default()
    };
    let mut resolved = Vec::new();
    let mut runs = 0;
    loop {
        runs += 1;
        let report = engine
            .run(&request, &*redrive::no_progress())
            .await
            .unwrap();
        resolved.extend(outcome_ids(&report, ItemOutcomeKind::Resolved));
        assert!(report.selected <= 2);
        match report.continuation_token {
            Some(token) => request.continuation_token = Some(token),
            None => break,
        }
        assert!(runs < 10, "runs must end");
    }
    resolved.sort();
    assert_eq!(resolved, ["c1", "c2", "c3", "c4", "c5"]);
    for id in ["c1", "c2", "c3", "c4", "c5"] {
        assert_eq!(
            p.downstream.calls(id),
            2,
            "{id}: one worker attempt, one redrive"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_redrives_process_each_item_once() {
    let items: Vec<(String, &str)> = (1..=8).map(|i| (format!("k{i}"), "throttled")).collect();
    let refs: Vec<(&str, &str)> = items.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    let p = dead_items("concurrent", &refs).await;
    p.downstream.fix();
    let a = p.redrive_engine();
    let b = p.redrive_engine();
    let request = RedriveRequest {
        parallelism: Some(2),
        ..Default::default()
    };
    let progress = redrive::no_progress();
    let (ra, rb) = tokio::join!(a.run(&request, &*progress), b.run(&request, &*progress));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.succeeded + rb.succeeded, 8);
    for (id, _) in &items {
        assert_eq!(p.downstream.calls(id), 2, "{id} reprocessed exactly once");
    }
    for r in p.records().await {
        assert_eq!(r.status, ItemStatus::Resolved);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrecorded_dlq_messages_become_records() {
    let p = Pipeline::new("adopt", Setup::default()).await;
    p.send_to_dlq(&[&body("orphan", "ok"), "not even json"])
        .await;
    let report = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                item_ids: vec!["none".into()],
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(report.adopted_from_dlq, 2);
    let records = p.records().await;
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.reason, DeadLetterReason::ExceededMaxReceiveCount);
        assert_eq!(r.error_class, ErrorClass::Unknown);
        assert!(r.reprocess_eligible);
        assert!(r.last_error.contains("without a recorded failure"));
    }
    assert!(records.iter().any(|r| r.item_id == "orphan"));
    assert_eq!(p.dlq_depth().await, 2, "messages stay until redriven");
    // Adoption is not repeated, and the adopted item is redrivable.
    let report = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(report.adopted_from_dlq, 0);
    assert!(outcome_ids(&report, ItemOutcomeKind::Resolved).contains(&"orphan".to_string()));
    let orphan = p.store().get("orphan").await.unwrap().unwrap();
    assert_eq!(orphan.status, ItemStatus::Resolved);
    assert!(matches!(
        orphan.payload.location,
        PayloadLocation::Inline { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_change_nothing() {
    let p = dead_items("badreq", &[("x1", "throttled")]).await;
    let engine = p.redrive_engine();
    let err = RedriveRequest::from_json(r#"{"item_ids": ["x1"], "moed": "requeue"}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `moed`"), "{err}");
    let err = RedriveRequest::from_json(r#"{"mode": "teleport"}"#).unwrap_err();
    assert!(err.to_string().contains("unknown variant"), "{err}");
    for request in [
        RedriveRequest {
            since: Some("yesterday".into()),
            ..Default::default()
        },
        RedriveRequest {
            parallelism: Some(0),
            ..Default::default()
        },
        RedriveRequest {
            rate: Some(-1.0),
            ..Default::default()
        },
        RedriveRequest {
            continuation_token: Some("%%%".into()),
            ..Default::default()
        },
    ] {
        let err = engine
            .run(&request, &*redrive::no_progress())
            .await
            .unwrap_err();
        assert!(matches!(err, RedriveError::InvalidRequest(_)), "{err}");
    }
    let record = p.store().get("x1").await.unwrap().unwrap();
    assert_eq!(record.status, ItemStatus::Dead);
    assert_eq!(record.failure_count, 1);
    assert_eq!(p.dlq_depth().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_left_by_a_dead_run_does_not_hold_up_the_end_of_a_run() {
    let p = dead_items("stale", &[("s1", "throttled"), ("s2", "throttled")]).await;
    p.downstream.fix();
    leave_stale_lease(&p, "s1").await;
    // This run holds s1's DLQ message too (its sweep takes every message). A live lease
    // would make it wait up to 15 s for s1 to settle; a dead run's lease must not.
    let started = std::time::Instant::now();
    let report = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                item_ids: vec!["s2".into()],
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(outcome_ids(&report, ItemOutcomeKind::Resolved), ["s2"]);
    assert!(
        took < std::time::Duration::from_secs(10),
        "waited for a dead run's lease: {took:?}"
    );
    assert_eq!(report.dlq_messages_deleted, 1, "s2's message");
    assert_eq!(p.dlq_depth().await, 1, "s1's message is back in view");
}

/// Marks an item as a run that died while redriving it leaves it: redriving, lease expired.
async fn leave_stale_lease(p: &Pipeline, item_id: &str) {
    use aws_sdk_dynamodb::types::AttributeValue;
    use sqs_keeper_aws::schema::{LEASE_EXPIRES_AT, LEASE_OWNER};
    let expired = chrono::Utc::now().timestamp() - 60;
    p.clients
        .dynamodb
        .update_item()
        .table_name(&p.resources.table)
        .key("item_id", AttributeValue::S(item_id.into()))
        .update_expression("SET #status = :redriving, #owner = :owner, #expires = :expires")
        .expression_attribute_names("#status", "status")
        .expression_attribute_names("#owner", LEASE_OWNER)
        .expression_attribute_names("#expires", LEASE_EXPIRES_AT)
        .expression_attribute_values(":redriving", AttributeValue::S("redriving".into()))
        .expression_attribute_values(":owner", AttributeValue::S("redrive-gone".into()))
        .expression_attribute_values(":expires", AttributeValue::N(expired.to_string()))
        .send()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_are_taken_back_by_a_default_redrive() {
    let p = dead_items("takeback", &[("k1", "throttled"), ("k2", "throttled")]).await;
    p.downstream.fix();
    leave_stale_lease(&p, "k1").await;
    let report = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(
        outcome_ids(&report, ItemOutcomeKind::Resolved),
        ["k1", "k2"]
    );
    assert_eq!(p.dlq_depth().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_ineligible_items_do_not_starve_older_eligible_ones() {
    let p = dead_items("starve", &[("old", "throttled")]).await;
    // Five newer validation failures (not eligible), dead-lettered after `old`.
    let newer: Vec<String> = (0..5).map(|n| body(&format!("v{n}"), "invalid")).collect();
    let refs: Vec<&str> = newer.iter().map(String::as_str).collect();
    p.send(&refs).await;
    p.drain().await;
    p.downstream.fix();
    let report = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                max_items: Some(1),
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(outcome_ids(&report, ItemOutcomeKind::Resolved), ["old"]);
    assert_eq!(
        report.skipped_ineligible, 0,
        "ineligible records are not read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_lists_a_bounded_sample_and_complete_counts() {
    let p = dead_items(
        "sample",
        &[
            ("s1", "throttled"),
            ("s2", "throttled"),
            ("s3", "throttled"),
        ],
    )
    .await;
    p.downstream.fix();
    let mut engine = p.redrive_engine();
    engine.settings_mut().report_items = 2;
    let report = engine
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!((report.selected, report.succeeded), (3, 3));
    assert_eq!((report.items.len(), report.items_omitted), (2, 1));
    assert_eq!(
        p.dlq_depth().await,
        0,
        "settled by every resolved item, listed or not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_is_not_resolve_until_the_worker_finishes_the_message() {
    let p = dead_items("requeued", &[("q1", "throttled")]).await;
    let report = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                mode: RedriveMode::Requeue,
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(outcome_ids(&report, ItemOutcomeKind::Requeued), ["q1"]);
    assert_eq!(
        outcome_ids(&report, ItemOutcomeKind::Resolved),
        Vec::<String>::new()
    );
    let record = p.store().get("q1").await.unwrap().unwrap();
    assert_eq!(record.status, ItemStatus::Requeued);
    let requeued_as = record.requeued_message_id.clone().unwrap();
    assert_eq!(p.dlq_depth().await, 0, "moved back to the source queue");
    // The downstream is fixed; the worker finishes the message.
    p.downstream.fix();
    p.drain().await;
    let record = p.store().get("q1").await.unwrap().unwrap();
    assert_eq!(record.status, ItemStatus::Resolved);
    assert!(record.processed.contains(&format!("msg:{requeued_as}")));
    assert_eq!(p.downstream.delivered(), ["q1"]);
}

/// The defect: a requeued message that exhausted its receives was moved to the DLQ by the
/// queue's redrive policy, and the next sweep deleted it because its record said resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_message_that_returns_to_the_dlq_reopens_its_record_and_is_kept() {
    let p = dead_items("requeue-back", &[("b1", "throttled")]).await;
    p.redrive_engine()
        .run(
            &RedriveRequest {
                mode: RedriveMode::Requeue,
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    // The worker never finishes it (say, it crashes each time): receive it past the source
    // queue's maxReceiveCount (1) so that SQS moves it to the DLQ, as on AWS.
    let mut moved = false;
    for _ in 0..20 {
        let output = p
            .clients
            .sqs
            .receive_message()
            .queue_url(&p.resources.source_url)
            .visibility_timeout(1)
            .send()
            .await
            .unwrap();
        if output.messages().is_empty() && p.dlq_depth().await == 1 {
            moved = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    assert!(moved, "the source queue's redrive policy moves the message");
    // A sweep (any redrive run) must keep the message and reopen the record.
    let report = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                dry_run: false,
                item_ids: vec!["nothing-else".into()],
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(report.dlq_messages_deleted, 0);
    assert_eq!(p.dlq_depth().await, 1, "the unprocessed message is kept");
    let record = p.store().get("b1").await.unwrap().unwrap();
    assert_eq!(record.status, ItemStatus::Dead, "reopened");
    assert!(
        record.last_error.contains("requeued message came back"),
        "{}",
        record.last_error
    );
    // Once the downstream works, a redrive resolves it and only then deletes the message.
    p.downstream.fix();
    let report = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(outcome_ids(&report, ItemOutcomeKind::Resolved), ["b1"]);
    assert_eq!(p.dlq_depth().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bodies_under_one_item_id_are_each_delivered_before_their_messages_go() {
    let p = Pipeline::new(
        "two-bodies",
        Setup {
            max_receive_count: 1,
            ..Setup::default()
        },
    )
    .await;
    let first = json!({"id": "same", "scenario": "throttled", "v": 1}).to_string();
    let second = json!({"id": "same", "scenario": "throttled", "v": 2}).to_string();
    p.send(&[&first]).await;
    p.drain().await;
    p.send(&[&second]).await;
    p.drain().await;
    assert_eq!(p.records().await.len(), 1);
    assert_eq!(p.dlq_depth().await, 2, "one DLQ message per body");
    p.downstream.fix();
    let report = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(outcome_ids(&report, ItemOutcomeKind::Resolved), ["same"]);
    assert_eq!(
        p.dlq_depth().await,
        1,
        "the message holding the body this run did not deliver is kept"
    );
    let record = p.store().get("same").await.unwrap().unwrap();
    assert_eq!(
        record.status,
        ItemStatus::Dead,
        "reopened with the other body"
    );
    let report = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(outcome_ids(&report, ItemOutcomeKind::Resolved), ["same"]);
    assert_eq!(p.dlq_depth().await, 0);
    assert_eq!(
        p.downstream.delivered(),
        ["same", "same"],
        "both bodies delivered"
    );
}

/// Sends one message to the DLQ with an `item_id` attribute, as this project's DLQ
/// messages carry.
async fn send_to_dlq_with_item_id(p: &Pipeline, body: &str, item_id: &str) {
    send_to_dlq_with(p, body, &[("item_id", item_id)]).await;
}

/// Sends one message to the DLQ with string message attributes `attributes` (as a
/// producer's message keeps its own when the queue's redrive policy moves it).
async fn send_to_dlq_with(p: &Pipeline, body: &str, attributes: &[(&str, &str)]) {
    use aws_sdk_sqs::types::MessageAttributeValue;
    let mut send = p
        .clients
        .sqs
        .send_message()
        .queue_url(&p.resources.dlq_url)
        .message_body(body);
    for (name, value) in attributes {
        send = send.message_attributes(
            *name,
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(*value)
                .build()
                .unwrap(),
        );
    }
    send.send().await.unwrap();
}

/// A producer's message keeps its attributes into the DLQ. One whose `item_id` and
/// `source_message_id` name a delivery an item's resolution processed, but whose body is
/// another payload, was deleted by the sweep as processed: the payload was lost. It is
/// judged by its content, so it reopens the item and is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_naming_a_processed_delivery_is_kept_by_its_content() {
    let p = Pipeline::new(
        "named-delivery",
        Setup {
            max_receive_count: 1,
            ..Setup::default()
        },
    )
    .await;
    p.send(&[&json!({"id": "same", "scenario": "throttled", "v": 1}).to_string()])
        .await;
    p.drain().await;
    p.downstream.fix();
    let redrive = || async {
        p.redrive_engine()
            .run(&RedriveRequest::default(), &*redrive::no_progress())
            .await
            .unwrap()
    };
    redrive().await;
    let resolved = p.store().get("same").await.unwrap().unwrap();
    assert_eq!(resolved.status, ItemStatus::Resolved);
    assert_eq!(p.dlq_depth().await, 0);
    let other = json!({"id": "same", "scenario": "throttled", "v": 2}).to_string();
    send_to_dlq_with(
        &p,
        &other,
        &[
            ("item_id", "same"),
            ("source_message_id", &resolved.source.message_id),
        ],
    )
    .await;
    let report = redrive().await;
    assert_eq!(outcome_ids(&report, ItemOutcomeKind::Resolved), ["same"]);
    assert_eq!(
        p.downstream.delivered(),
        ["same", "same"],
        "the other payload is delivered, not deleted as the one processed"
    );
    assert_eq!(p.dlq_depth().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_message_is_tracked_under_its_item_id_and_delivered_once() {
    let p = Pipeline::new("adopt-id", Setup::default()).await;
    send_to_dlq_with_item_id(&p, &body("payload-id", "ok"), "ghost").await;
    for _ in 0..3 {
        p.redrive_engine()
            .run(&RedriveRequest::default(), &*redrive::no_progress())
            .await
            .unwrap();
    }
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].item_id, "ghost");
    assert_eq!(records[0].status, ItemStatus::Resolved);
    assert_eq!(p.dlq_depth().await, 0);
    assert_eq!(
        p.downstream.delivered(),
        ["payload-id"],
        "delivered once, not each run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_extended_client_message_is_reprocessed_with_its_payload() {
    let p = Pipeline::new("adopt-ec", Setup::default()).await;
    let payload = body("ec-payload", "ok");
    p.clients
        .s3
        .put_object()
        .bucket(&p.resources.bucket)
        .key("producer/ec-1")
        .body(payload.clone().into_bytes().into())
        .send()
        .await
        .unwrap();
    let pointer = sqs_keeper_core::pointer::S3Pointer {
        bucket: p.resources.bucket.clone(),
        key: "producer/ec-1".into(),
    }
    .to_body();
    p.send_to_dlq(&[&pointer]).await;
    p.redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(
        p.downstream.delivered(),
        ["ec-payload"],
        "the payload, not the pointer"
    );
    assert_eq!(p.dlq_depth().await, 0);
    // Tracked and recorded by the item its payload names, as the worker names it: not by
    // its message id, beside the worker's record of the same message.
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].item_id, "ec-payload");
}

/// Adoption follows a pointer only as the worker would: an object in a bucket the worker
/// does not read payloads from is never copied into a record nor delivered; the record
/// keeps the pointer, class `permission`, for a human.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_pointer_to_a_bucket_not_allowed_is_not_followed() {
    let p = Pipeline::new("adopt-foreign", Setup::default()).await;
    let foreign = e2e::unique_prefix("foreign").to_lowercase();
    p.clients
        .s3
        .create_bucket()
        .bucket(&foreign)
        .send()
        .await
        .unwrap();
    p.clients
        .s3
        .put_object()
        .bucket(&foreign)
        .key("secret")
        .body(body("secret", "ok").into_bytes().into())
        .send()
        .await
        .unwrap();
    let pointer = sqs_keeper_core::pointer::S3Pointer {
        bucket: foreign.clone(),
        key: "secret".into(),
    }
    .to_body();
    p.send_to_dlq(&[&pointer]).await;
    let report = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(report.adopted_from_dlq, 1, "{report:?}");
    assert!(
        p.downstream.delivered().is_empty(),
        "the object was delivered"
    );
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].error_class,
        sqs_keeper_core::ErrorClass::Permission
    );
    assert!(!records[0].reprocess_eligible);
    assert!(
        records[0]
            .last_error
            .contains("not one the worker reads payloads from"),
        "{}",
        records[0].last_error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlong_item_id_in_the_dlq_does_not_block_the_sweep() {
    let p = dead_items("poison", &[("fine", "throttled")]).await;
    p.downstream.fix();
    send_to_dlq_with_item_id(&p, &body("long", "ok"), &"x".repeat(3000)).await;
    let report = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(report.adopted_from_dlq, 1);
    let resolved = outcome_ids(&report, ItemOutcomeKind::Resolved);
    assert!(resolved.contains(&"fine".to_string()), "{resolved:?}");
    assert!(
        resolved.iter().any(|id| id.starts_with("sha256:")),
        "the overlong id is tracked by its digest: {resolved:?}"
    );
    assert_eq!(p.dlq_depth().await, 0);
}

/// Message attributes keep their data types through dead-lettering and a requeue: a
/// binary value, a `Number`, a custom type and a string that looks like `<x>` all come back
/// as they were sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_attributes_round_trip_with_their_types_through_requeue() {
    use aws_sdk_sqs::primitives::Blob;
    use aws_sdk_sqs::types::MessageAttributeValue;
    let p = Pipeline::new(
        "attr-types",
        Setup {
            max_receive_count: 1,
            ..Setup::default()
        },
    )
    .await;
    let attribute = |data_type: &str, text: Option<&str>, bytes: Option<&[u8]>| {
        let mut a = MessageAttributeValue::builder().data_type(data_type);
        if let Some(text) = text {
            a = a.string_value(text);
        }
        if let Some(bytes) = bytes {
            a = a.binary_value(Blob::new(bytes.to_vec()));
        }
        a.build().unwrap()
    };
    let sent = [
        ("blob", attribute("Binary", None, Some(&[0, 1, 2, 255]))),
        ("count", attribute("Number", Some("42"), None)),
        ("ratio", attribute("Number.float", Some("0.5"), None)),
        ("angle", attribute("String", Some("<x>"), None)),
    ];
    let mut send = p
        .clients
        .sqs
        .send_message()
        .queue_url(&p.resources.source_url)
        .message_body(body("typed", "throttled"));
    for (name, value) in &sent {
        send = send.message_attributes(*name, value.clone());
    }
    send.send().await.unwrap();
    p.drain().await;
    assert_eq!(p.records().await.len(), 1);
    p.redrive_engine()
        .run(
            &RedriveRequest {
                mode: RedriveMode::Requeue,
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    let output = p
        .clients
        .sqs
        .receive_message()
        .queue_url(&p.resources.source_url)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap();
    let requeued = &output.messages()[0];
    let got = requeued.message_attributes().unwrap();
    for (name, value) in &sent {
        assert_eq!(got.get(*name), Some(value), "{name}");
    }
}

/// One item failing again and again keeps a bounded, writable record: the history, its
/// attempt ids and the size stay capped; the count stays exact. `make test` redrives it 100
/// times (twice past the history limit; about 40 s on the emulator); `make soak` 1,000
/// (`REDRIVE_REPEATS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_redriven_a_thousand_times_stays_bounded_and_writable() {
    use sqs_keeper_core::{dead_letter::FailureDetail, dead_letter::HISTORY_LIMIT};
    let p = dead_items("thousand", &[("hot", "throttled")]).await;
    let store = p.store();
    let template = store.get("hot").await.unwrap().unwrap().failure_history[0].clone();
    let repeats: usize = std::env::var("REDRIVE_REPEATS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    for run in 0..repeats {
        let owner = format!("redrive-{run}");
        assert!(store
            .acquire_lease("hot", &owner, std::time::Duration::from_secs(60))
            .await
            .unwrap());
        let failure = FailureDetail {
            attempt_id: format!("{owner}:1"),
            error_message: "x".repeat(2000),
            causes: vec!["y".repeat(1000); 10],
            ..template.clone()
        };
        store
            .record_redrive_failure("hot", &owner, &[failure])
            .await
            .unwrap();
    }
    let item = p
        .clients
        .dynamodb
        .get_item()
        .table_name(&p.resources.table)
        .key(
            "item_id",
            aws_sdk_dynamodb::types::AttributeValue::S("hot".into()),
        )
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    let ids = item["attempt_ids"].as_ss().unwrap().len();
    assert!(ids <= HISTORY_LIMIT + 1, "{ids} attempt ids kept");
    let claims = item
        .get("dlq_claims")
        .map_or(0, |c| c.as_ss().unwrap().len());
    assert!(claims <= HISTORY_LIMIT + 1, "{claims} claims kept");
    let record = store.get("hot").await.unwrap().unwrap();
    assert!(record.failure_history.len() <= HISTORY_LIMIT + 1);
    assert_eq!(
        record.failure_count as usize,
        repeats + 1,
        "every attempt counted"
    );
    assert_eq!(
        record.failure_count as usize,
        record.failure_history.len() + record.history_omitted as usize
    );
    let json: serde_json::Value = serde_dynamo::aws_sdk_dynamodb_1::from_item(item).unwrap();
    let size = serde_json::to_string(&json).unwrap().len();
    assert!(size < 300_000, "record is {size} bytes");
}

fn pointer_parser() -> sqs_keeper_core::item::ItemParser {
    sqs_keeper_core::item::ItemParser {
        id_source: "pointer:/id".parse().unwrap(),
        ..sqs_keeper_core::item::ItemParser::default()
    }
}

/// A redrive that fails a selected item again before the purge reaches it (same status,
/// same delivery, a later last attempt) keeps the record, and its DLQ message with it: one
/// condition, the record's conditional delete, decides both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_keeps_a_record_a_redrive_failed_again_with_its_dlq_message() {
    let p = dead_items("purge-redriven", &[("p1", "invalid")]).await;
    let selected = p.records().await;
    let forced = RedriveRequest {
        force: true,
        ..RedriveRequest::default()
    };
    let run = p
        .redrive_engine()
        .run(&forced, &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(run.failed_again, 1, "{run:?}");
    let report = p
        .store()
        .remove_records(&selected, &pointer_parser(), |_| {})
        .await
        .unwrap();
    assert_eq!(
        (
            report.records_deleted,
            report.records_changed,
            report.dlq_messages_deleted
        ),
        (0, 1, 0),
        "{report:?}"
    );
    assert_eq!(p.records().await.len(), 1, "the record stays");
    assert_eq!(p.dlq_messages().await.len(), 1, "with its DLQ message");
}

/// A purge never takes an item in flight: a requeued record, whose message waits in the
/// source queue pointing to the record's payload, keeps its record and its payload object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_keeps_a_requeued_item_and_the_payload_its_message_needs() {
    let p = dead_items("purge-requeued", &[("p1", "invalid")]).await;
    let requeue = RedriveRequest {
        force: true,
        mode: RedriveMode::Requeue,
        ..RedriveRequest::default()
    };
    let run = p
        .redrive_engine()
        .run(&requeue, &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(run.requeued, 1, "{run:?}");
    let selected = p.records().await;
    assert_eq!(selected[0].status, ItemStatus::Requeued);
    let report = p
        .store()
        .remove_records(&selected, &pointer_parser(), |_| {})
        .await
        .unwrap();
    assert_eq!(
        (
            report.records_deleted,
            report.records_in_flight,
            report.payloads_deleted
        ),
        (0, 1, 0),
        "{report:?}"
    );
    assert_eq!(p.records().await[0].status, ItemStatus::Requeued);
}

/// A requeue keeps the record past the run that would set it back to dead, and writes the
/// payload object its pointer names again, so that neither the table's TTL nor the
/// bucket's lifecycle removes what the message in the source queue needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_refreshes_the_records_expiry_and_its_payloads_lifecycle() {
    let p = dead_items("requeue-ttl", &[]).await;
    // As large as the source queue takes: sent back with the requeue's attributes, it no
    // longer fits, and goes as a pointer to the store's object.
    let large =
        json!({"id": "big", "scenario": "invalid", "blob": "y".repeat(1_048_350)}).to_string();
    p.send(&[&large]).await;
    p.drain().await;
    let before = p.records().await;
    assert_eq!(before.len(), 1);
    let PayloadLocation::S3 { key, .. } = &before[0].payload.location else {
        panic!(
            "a large payload goes to S3: {:?}",
            before[0].payload.location
        );
    };
    let written = |key: String| {
        let s3 = p.clients.s3.clone();
        let bucket = p.resources.bucket.clone();
        async move {
            s3.head_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .unwrap()
                .last_modified()
                .copied()
                .unwrap()
        }
    };
    let first_write = written(key.clone()).await;
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let requeue = RedriveRequest {
        force: true,
        mode: RedriveMode::Requeue,
        ..RedriveRequest::default()
    };
    let run = p
        .redrive_engine()
        .run(&requeue, &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(run.requeued, 1, "{run:?}");
    let after = &p.records().await[0];
    assert_eq!(after.status, ItemStatus::Requeued);
    let life = i64::try_from(sqs_keeper_core::redrive::REQUEUED_RECORD_LIFE.as_secs()).unwrap();
    assert!(
        after.expires_at >= chrono::Utc::now().timestamp() + life - 60,
        "expires {} (was {})",
        after.expires_at,
        before[0].expires_at
    );
    assert!(
        written(key.clone()).await > first_write,
        "the object was written again"
    );
}

/// A purge deletes what it selected, not a failure of the same item id that arrived after
/// it selected: that record is kept (its delete is conditional on the last attempt
/// selected) with its DLQ message (matched by the delivery it holds, not the item id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_keeps_a_failure_that_arrived_after_it_selected() {
    let p = dead_items("purge-race", &[("p1", "invalid"), ("p2", "invalid")]).await;
    let selected = p.records().await;
    // p1 fails again while the operator reads the confirmation.
    p.send(&[&body("p1", "invalid")]).await;
    p.drain().await;
    assert_eq!(p.dlq_depth().await, 3);
    let report = p
        .store()
        .remove_records(&selected, &pointer_parser(), |_| {})
        .await
        .unwrap();
    // p2 goes with its message; p1 changed since it was selected: the record and every
    // message of it stay (the new failure's, and the one selected, which the record's
    // resolution will let go).
    assert_eq!(
        (
            report.records_deleted,
            report.records_changed,
            report.dlq_messages_deleted
        ),
        (1, 1, 1),
        "{report:?}"
    );
    let left = p.records().await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].item_id, "p1");
    let messages = p.dlq_messages().await;
    assert_eq!(messages.len(), 2, "p1's messages stay");
    let sources: Vec<&str> = messages
        .iter()
        .filter_map(|m| {
            m.message_attributes()
                .and_then(|a| a.get("source_message_id"))
                .and_then(|v| v.string_value())
        })
        .collect();
    assert!(
        sources.contains(&left[0].source.message_id.as_str()),
        "the new failure's DLQ message stays: {sources:?}"
    );
}

/// On a FIFO DLQ a sweep that holds a group's first messages sees nothing more of that
/// group: the kept messages are moved behind their group, so an orphan behind twelve dead
/// messages of its group is adopted by the first run, and nothing is lost or duplicated.
/// A copy is tracked as its original by the next run, also when its body names no item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_sweep_adopts_an_orphan_behind_a_held_group() {
    let p = Pipeline::new(
        "fifo-sweep",
        Setup {
            fifo: true,
            max_receive_count: 1,
            ..Setup::default()
        },
    )
    .await;
    for n in 0..12 {
        let id = format!("d{n}");
        p.send_fifo(&body(&id, "invalid"), "g1", &id).await;
    }
    p.drain().await;
    assert_eq!(p.records().await.len(), 12);
    // Moved by the source queue's redrive policy: no record, same group.
    p.clients
        .sqs
        .send_message()
        .queue_url(&p.resources.dlq_url)
        .message_body(body("orphan", "ok"))
        .message_group_id("g1")
        .message_deduplication_id("orphan")
        .send()
        .await
        .unwrap();
    // And one whose body names no item: tracked by its message id, and its rotated copy
    // by the id it carries (its deduplication id names the sweep that sent it).
    let unnamed = p
        .clients
        .sqs
        .send_message()
        .queue_url(&p.resources.dlq_url)
        .message_body("not json")
        .message_group_id("g1")
        .message_deduplication_id("unnamed")
        .send()
        .await
        .unwrap();
    let unnamed = unnamed.message_id().unwrap().to_string();
    let report = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                item_ids: vec!["none".into()],
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(report.adopted_from_dlq, 2, "{report:?}");
    assert!(p.store().get("orphan").await.unwrap().is_some());
    assert!(p.store().get(&unnamed).await.unwrap().is_some());
    assert_eq!(p.dlq_depth().await, 14, "one message per item, none lost");
    // Each message still names what it holds: a second run adopts nothing more.
    let again = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                item_ids: vec!["none".into()],
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(again.adopted_from_dlq, 0, "{again:?}");
    assert_eq!(p.records().await.len(), 14);
    assert_eq!(p.dlq_depth().await, 14);
}

/// An adoption is written only if the record is still as the sweep judged it: a record
/// that appeared (or changed status) meanwhile is never overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adoption_never_overwrites_a_record() {
    use sqs_keeper_core::{ports::Adoption, ports::DeadLetterQueue};
    let p = dead_items("adopt-guard", &[("a1", "invalid")]).await;
    let before = p.store().get("a1").await.unwrap().unwrap();
    let message = p.dlq_messages().await.remove(0);
    for expected_status in [None, Some(ItemStatus::Resolved)] {
        let written = p
            .store()
            .adopt(
                &message,
                "a1",
                &pointer_parser(),
                &Adoption {
                    reason: "judged without a record",
                    reopen: expected_status.is_some(),
                    known_queue_arn: None,
                    expected_status,
                    message_keys: Vec::new(),
                },
            )
            .await
            .unwrap();
        assert!(written.is_none(), "{expected_status:?}");
    }
    let after = p.store().get("a1").await.unwrap().unwrap();
    assert_eq!(after.failure_count, before.failure_count);
    assert_eq!(after.error_class, before.error_class);
    assert_eq!(after.reprocess_eligible, before.reprocess_eligible);
}

/// The worker can finish a requeued message before the run that sent it has marked the
/// record requeued. It resolves the record then (the run still holds it, with that
/// payload), and the run's mark finds it resolved: the record never waits, `requeued`, for
/// a message already finished. A message of another run does not resolve it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_message_finished_before_its_record_is_marked_resolves_it() {
    let p = dead_items("requeue-race", &[("q1", "invalid")]).await;
    let store = p.store();
    let record = store.get("q1").await.unwrap().unwrap();
    let leases = store
        .acquire_leases(
            &["q1".to_string()],
            "run-1",
            std::time::Duration::from_secs(900),
        )
        .await;
    assert!(matches!(leases[..], [Ok(true)]));
    let sha = record.payload.sha256.clone();
    // Another run's message, or another payload, leaves it alone.
    store
        .finish_requeued("q1", "m-other", &sha, "run-2")
        .await
        .unwrap();
    store
        .finish_requeued("q1", "m-other", "not-the-payload", "run-1")
        .await
        .unwrap();
    let held = store.get("q1").await.unwrap().unwrap();
    assert_eq!(held.status, ItemStatus::Redriving);
    // The worker finishes the run's message first.
    store
        .finish_requeued("q1", "m-requeued", &sha, "run-1")
        .await
        .unwrap();
    let finished = store.get("q1").await.unwrap().unwrap();
    assert_eq!(finished.status, ItemStatus::Resolved);
    assert_eq!(finished.lease_expires_at, None);
    assert!(finished.processed.contains(&"msg:m-requeued".to_string()));
    // Then the run's mark is refused, and the record stays resolved.
    assert!(store
        .mark_requeued(&record, "run-1", "m-requeued")
        .await
        .is_err());
    let after = store.get("q1").await.unwrap().unwrap();
    assert_eq!(after.status, ItemStatus::Resolved);
    assert_eq!(after.requeued_message_id, None);
}

/// A DLQ message moved back to the source queue from outside (the console's "Start DLQ
/// redrive", which the DLQ's `RedriveAllowPolicy` permits) keeps its attributes: the
/// worker that finishes it resolves the record that holds that delivery, so the scheduled
/// redrive does not deliver the item again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_moved_back_by_the_console_resolves_its_record_when_finished() {
    let p = dead_items("console-move", &[("c1", "throttled")]).await;
    // What StartMessageMoveTask does: the same body and attributes, sent to the source.
    let moved = p.dlq_messages().await.remove(0);
    p.clients
        .sqs
        .send_message()
        .queue_url(&p.resources.source_url)
        .message_body(moved.body().unwrap())
        .set_message_attributes(moved.message_attributes().cloned())
        .send()
        .await
        .unwrap();
    p.clients
        .sqs
        .delete_message()
        .queue_url(&p.resources.dlq_url)
        .receipt_handle(moved.receipt_handle().unwrap())
        .send()
        .await
        .unwrap();
    p.downstream.fix();
    p.drain().await;
    let record = p.store().get("c1").await.unwrap().unwrap();
    assert_eq!(record.status, ItemStatus::Resolved);
    let calls = p.downstream.calls("c1");
    let report = p
        .redrive_engine()
        .run(&RedriveRequest::default(), &*redrive::no_progress())
        .await
        .unwrap();
    assert_eq!(report.selected, 0, "{report:?}");
    assert_eq!(p.downstream.calls("c1"), calls, "not delivered again");
}

/// On the emulator: a record requeued more than 14 days ago whose message is gone is set
/// back to dead by the next run (the conditional update DynamoDB runs), with the failure
/// in its history; a dry run changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_that_outlived_every_queue_is_set_back_to_dead_on_the_table() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let p = dead_items("requeue-outlived", &[("o1", "throttled")]).await;
    let before = p.store().get("o1").await.unwrap().unwrap();
    let long_ago = chrono::Utc::now() - chrono::Duration::days(15);
    p.clients
        .dynamodb
        .update_item()
        .table_name(&p.resources.table)
        .key("item_id", AttributeValue::S("o1".into()))
        .update_expression("SET #s = :r, requeued_message_id = :m, requeued_at = :at")
        .expression_attribute_names("#s", "status")
        .expression_attribute_values(":r", AttributeValue::S("requeued".into()))
        .expression_attribute_values(":m", AttributeValue::S("m-gone".into()))
        .expression_attribute_values(
            ":at",
            AttributeValue::S(sqs_keeper_core::time_format::format(&long_ago)),
        )
        .send()
        .await
        .unwrap();
    let dry = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                dry_run: true,
                ..RedriveRequest::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(dry.requeues_outlived, 0);
    let report = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                item_ids: vec!["none".into()],
                ..RedriveRequest::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(report.requeues_outlived, 1, "{report:?}");
    let after = p.store().get("o1").await.unwrap().unwrap();
    assert_eq!(after.status, ItemStatus::Dead);
    assert_eq!(after.requeued_message_id, None);
    assert_eq!(after.failure_count, before.failure_count + 1);
    assert!(after.last_error.contains("m-gone"), "{}", after.last_error);
}

/// 1 MiB messages (SQS's limit since 2025): a 900 KB body is dead-lettered with its
/// payload in S3 (a DynamoDB record holds 400 KB at most) and a pointer in its DLQ
/// message, requeued inline (the source queue takes 1 MiB: its `MaximumMessageSize`,
/// read once), and read back and delivered whole by the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_900_kb_message_is_dead_lettered_to_s3_requeued_inline_and_delivered() {
    let big =
        json!({"id": "big", "scenario": "throttled", "blob": "x".repeat(900_000)}).to_string();
    let p = Pipeline::with_dead_items("onemib", std::slice::from_ref(&big)).await;
    let record = p.store().get("big").await.unwrap().unwrap();
    assert!(
        matches!(record.payload.location, PayloadLocation::S3 { .. }),
        "{:?}",
        record.payload.location
    );
    assert_eq!(record.payload.size_bytes, big.len() as u64);
    // Looked at without hiding it: the run below sweeps the DLQ.
    let dlq = p
        .clients
        .sqs
        .receive_message()
        .queue_url(&p.resources.dlq_url)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    assert_eq!(dlq.messages().len(), 1);
    assert!(
        sqs_keeper_core::pointer::S3Pointer::parse(dlq.messages()[0].body().unwrap()).is_some(),
        "the DLQ message points at the payload"
    );

    let report = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                mode: RedriveMode::Requeue,
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(outcome_ids(&report, ItemOutcomeKind::Requeued), ["big"]);
    // Inline: the body itself went back, not a pointer. Looked at without hiding it, the
    // look counting as a receive: the queue's redrive policy is given room for it first.
    p.clients
        .sqs
        .set_queue_attributes()
        .queue_url(&p.resources.source_url)
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy,
            json!({"deadLetterTargetArn": p.resources.dlq_arn, "maxReceiveCount": 5}).to_string(),
        )
        .send()
        .await
        .unwrap();
    let output = p
        .clients
        .sqs
        .receive_message()
        .queue_url(&p.resources.source_url)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    assert_eq!(output.messages().len(), 1);
    assert_eq!(output.messages()[0].body().unwrap(), big, "requeued inline");

    // The worker reads it back whole and delivers it.
    p.downstream.fix();
    p.drain().await;
    assert_eq!(p.downstream.delivered(), ["big"]);
    let record = p.store().get("big").await.unwrap().unwrap();
    assert_eq!(record.status, ItemStatus::Resolved);
}
