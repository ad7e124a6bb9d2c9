//! Races of the redrive wing on the emulators (moto, DynamoDB Local): each test states a
//! guarantee of docs/ARCHITECTURE.md §3–§4 and fails when the code breaks it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use e2e::{body, Pipeline};
use sqs_keeper_core::item::ItemParser;
use sqs_keeper_core::sweep::SweepOptions;
use sqs_keeper_core::{dead_letter::DeadLetteredItem, dead_letter::ItemStatus};
use sqs_keeper_core::{redrive::no_progress, redrive::RedriveMode, redrive::RedriveRequest};

fn parser() -> ItemParser {
    ItemParser {
        id_source: "pointer:/id".parse().unwrap(),
        ..Default::default()
    }
}

fn adopting() -> SweepOptions {
    SweepOptions {
        adopt: true,
        parser: parser(),
        ..SweepOptions::default()
    }
}

/// Moves every message of `from` to `to` (body and message attributes), as SQS moves
/// them: the source queue's redrive policy (source → DLQ), or the console's "Start DLQ
/// redrive" (DLQ → source).
async fn move_all(p: &Pipeline, from: &str, to: &str) -> usize {
    let mut moved = 0;
    for _ in 0..5 {
        let output = p
            .clients
            .sqs
            .receive_message()
            .queue_url(from)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        if output.messages().is_empty() {
            break;
        }
        for m in output.messages() {
            p.clients
                .sqs
                .send_message()
                .queue_url(to)
                .message_body(m.body().unwrap())
                .set_message_attributes(m.message_attributes().cloned())
                .send()
                .await
                .unwrap();
            p.clients
                .sqs
                .delete_message()
                .queue_url(from)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
            moved += 1;
        }
    }
    moved
}

async fn record(p: &Pipeline, id: &str) -> DeadLetteredItem {
    p.store().get(id).await.unwrap().unwrap()
}

/// A requeued message that the source queue's redrive policy moved back to
/// the DLQ (the worker crashed on it) reopens its record: dead, holding that delivery. The
/// operator then moves it back with the console's "Start DLQ redrive"; the worker finishes
/// it. The record must be resolved (it is dead and holds that delivery), else the schedule
/// delivers the payload again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_message_moved_back_from_the_dlq_by_the_console_resolves_its_record() {
    let p = Pipeline::with_dead_items("rv-g11", &[body("x", "throttled")]).await;
    let engine = p.redrive_engine();
    let report = engine
        .run(
            &RedriveRequest {
                mode: RedriveMode::Requeue,
                ..Default::default()
            },
            &*no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(report.requeued, 1, "{report:?}");
    assert_eq!(record(&p, "x").await.status, ItemStatus::Requeued);
    // The worker crashes on the requeued message until the redrive policy moves it.
    assert_eq!(
        move_all(&p, &p.resources.source_url, &p.resources.dlq_url).await,
        1
    );
    // A sweep reopens the record with it.
    let store = p.store();
    let sweep = store.sweep_dlq(&adopting()).await.unwrap();
    sqs_keeper_core::sweep::settle_held(&store, sweep.held, Duration::ZERO, Duration::ZERO, None)
        .await
        .unwrap();
    let reopened = record(&p, "x").await;
    assert_eq!(reopened.status, ItemStatus::Dead, "reopened");
    // The console moves it back; the worker finishes it.
    assert_eq!(
        move_all(&p, &p.resources.dlq_url, &p.resources.source_url).await,
        1
    );
    p.downstream.fix();
    p.drain().await;
    let after = record(&p, "x").await;
    // The next scheduled redrive.
    let again = engine
        .run(&RedriveRequest::default(), &*no_progress())
        .await
        .unwrap();
    let deliveries = p
        .downstream
        .delivered()
        .iter()
        .filter(|id| *id == "x")
        .count();
    assert!(
        after.status == ItemStatus::Resolved,
        "the worker finished the moved-back message (record source {:?}), yet the record stayed {:?}; \
         the next redrive delivered it again (resolved {}, deliveries of x: {deliveries})",
        reopened.source.message_id,
        after.status,
        again.succeeded,
    );
}

// The reopening that must not overwrite a record changed between the sweep's judgement and
// its write (the message's own delivery listed processed meanwhile) runs over the in-memory
// world, where the change can land between the two
// (`sweep::tests::a_reopening_never_overwrites_a_record_that_processed_the_message_since`);
// what its condition means on DynamoDB is
// `pipeline.rs::the_store_conditions_mean_on_dynamodb_what_they_mean_in_memory`.

/// What a producer can send, attributes included, never resolves, overwrites, deletes or
/// files its failures under another item's record; and a sweep or a run ends on time when
/// S3 does not answer.
mod producer_attributes {
    use e2e::{body, Pipeline, Setup};
    use sqs_keeper_core::dead_letter::ItemStatus;
    use sqs_keeper_core::redrive::RedriveRequest;

    use sqs_keeper_core::redrive::no_progress;

    async fn send_with_attrs(p: &Pipeline, queue_url: &str, body: &str, attrs: &[(&str, &str)]) {
        use aws_sdk_sqs::types::MessageAttributeValue;
        let mut send = p
            .clients
            .sqs
            .send_message()
            .queue_url(queue_url)
            .message_body(body);
        for (k, v) in attrs {
            send = send.message_attributes(
                *k,
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(*v)
                    .build()
                    .unwrap(),
            );
        }
        send.send().await.unwrap();
    }

    /// A producer's own message, with a harmless body that succeeds, carrying `item_id` of a
    /// victim's dead record, any `requeued_by`, and `payload_sha256` set to the digest of the
    /// victim's payload: the victim's record must stay dead and its payload must still be
    /// delivered once the downstream is fixed and a redrive runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_producers_payload_sha256_attribute_cannot_resolve_a_victims_record() {
        let p = Pipeline::with_dead_items("atk-sha", &[body("victim", "throttled")]).await;
        let victim = p.store().get("victim").await.unwrap().unwrap();
        assert_eq!(victim.status, ItemStatus::Dead);
        assert_eq!(p.dlq_depth().await, 1);
        let source_url = p.resources.source_url.clone();
        send_with_attrs(
            &p,
            &source_url,
            &body("attacker", "ok"),
            &[
                ("item_id", "victim"),
                ("requeued_by", "whatever"),
                ("payload_sha256", &victim.payload.sha256),
            ],
        )
        .await;
        p.drain().await;
        let after = p.store().get("victim").await.unwrap().unwrap();
        p.downstream.fix();
        for _ in 0..2 {
            p.redrive_engine()
                .run(&RedriveRequest::default(), &*no_progress())
                .await
                .unwrap();
        }
        let delivered = p.downstream.delivered();
        assert_eq!(
            after.status,
            ItemStatus::Dead,
            "the victim's record was resolved by the producer's message; processed: {:?}; delivered: {delivered:?}; dlq depth now {}",
            after.processed,
            p.dlq_depth().await
        );
        assert!(
            delivered.iter().any(|d| d == "victim"),
            "victim lost: {delivered:?}"
        );
    }

    /// The same with `source_message_id` (no `requeued_by`) naming anything, and the digest.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_producers_source_message_id_and_digest_cannot_resolve_a_victims_record() {
        let p = Pipeline::with_dead_items("atk-sha2", &[body("victim", "throttled")]).await;
        let victim = p.store().get("victim").await.unwrap().unwrap();
        let source_url = p.resources.source_url.clone();
        send_with_attrs(
            &p,
            &source_url,
            &body("attacker", "ok"),
            &[
                ("item_id", "victim"),
                ("source_message_id", "not-the-victims"),
                ("payload_sha256", &victim.payload.sha256),
            ],
        )
        .await;
        p.drain().await;
        let after = p.store().get("victim").await.unwrap().unwrap();
        p.downstream.fix();
        for _ in 0..2 {
            p.redrive_engine()
                .run(&RedriveRequest::default(), &*no_progress())
                .await
                .unwrap();
        }
        let delivered = p.downstream.delivered();
        assert_eq!(
            after.status,
            ItemStatus::Dead,
            "resolved by the producer's message; delivered: {delivered:?}; dlq depth {}",
            p.dlq_depth().await
        );
        assert!(
            delivered.iter().any(|d| d == "victim"),
            "victim lost: {delivered:?}"
        );
    }

    /// Ids are message ids (no id in the body): a producer's failing message carrying
    /// `requeued_by` and the victim's `item_id` must not be recorded in the victim's record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_producers_requeued_by_attribute_cannot_append_to_a_victims_record() {
        let p = Pipeline::new(
            "atk-append",
            Setup {
                max_receive_count: 1,
                worker_env: vec![("WORKER_ITEM_ID_SOURCE", "message-id".to_string())],
                ..Setup::default()
            },
        )
        .await;
        p.send(&[&body("victim", "throttled")]).await;
        p.drain().await;
        let records = p.records().await;
        assert_eq!(records.len(), 1);
        let victim = records[0].clone();
        let source_url = p.resources.source_url.clone();
        send_with_attrs(
            &p,
            &source_url,
            &body("attacker", "invalid"),
            &[("item_id", &victim.item_id), ("requeued_by", "whatever")],
        )
        .await;
        p.drain().await;
        let records = p.records().await;
        let after = p.store().get(&victim.item_id).await.unwrap().unwrap();
        assert_eq!(
            (
                records.len(),
                after.failure_count,
                after.payload.sha256.clone()
            ),
            (2, victim.failure_count, victim.payload.sha256.clone()),
            "the producer's failure went into the victim's record {}: history {:#?}",
            victim.item_id,
            after.failure_history
        );
    }

    /// Continuation of the above: once the producer's failure overwrote the victim's record,
    /// is the victim's payload still delivered by a redrive after the downstream is fixed?
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_requeued_by_append_the_victims_payload_is_still_delivered() {
        let p = Pipeline::new(
            "atk-append2",
            Setup {
                max_receive_count: 1,
                worker_env: vec![("WORKER_ITEM_ID_SOURCE", "message-id".to_string())],
                ..Setup::default()
            },
        )
        .await;
        p.send(&[&body("victim", "throttled")]).await;
        p.drain().await;
        let victim = p.records().await[0].clone();
        let source_url = p.resources.source_url.clone();
        send_with_attrs(
            &p,
            &source_url,
            &body("attacker", "invalid"),
            &[("item_id", &victim.item_id), ("requeued_by", "whatever")],
        )
        .await;
        p.drain().await;
        p.downstream.fix();
        let mut reports = Vec::new();
        for _ in 0..3 {
            reports.push(
                p.redrive_engine_with_message_ids()
                    .run(&RedriveRequest::default(), &*no_progress())
                    .await
                    .unwrap(),
            );
        }
        let delivered = p.downstream.delivered();
        let records = p.records().await;
        assert!(
            delivered.iter().any(|d| d == "victim"),
            "victim lost: delivered {delivered:?}; dlq depth {}; records {:?}",
            p.dlq_depth().await,
            records
                .iter()
                .map(|r| (&r.item_id, r.status, &r.payload.sha256))
                .collect::<Vec<_>>()
        );
    }

    trait MessageIds {
        fn redrive_engine_with_message_ids(
            &self,
        ) -> sqs_keeper_core::redrive::RedriveEngine<
            sqs_keeper_http::HttpDelivery,
            sqs_keeper_aws::DeadLetterStore,
        >;
    }

    impl MessageIds for Pipeline {
        fn redrive_engine_with_message_ids(
            &self,
        ) -> sqs_keeper_core::redrive::RedriveEngine<
            sqs_keeper_http::HttpDelivery,
            sqs_keeper_aws::DeadLetterStore,
        > {
            let delivery =
                sqs_keeper_http::HttpDelivery::new(sqs_keeper_http::HttpDeliveryConfig::new(
                    self.downstream.url().parse().unwrap(),
                    std::time::Duration::from_millis(500),
                ))
                .unwrap();
            sqs_keeper_core::redrive::RedriveEngine::new(
                self.store(),
                Some(delivery),
                sqs_keeper_core::redrive::RedriveSettings {
                    retry: sqs_keeper_core::retry::RetryPolicy {
                        max_attempts: 1,
                        ..sqs_keeper_core::retry::RetryPolicy::default()
                    },
                    parser: sqs_keeper_core::item::ItemParser::default(),
                    ..Default::default()
                },
            )
        }
    }

    /// Pre-existing? A producer that knows the victim's source message id (its own message
    /// ids are returned to it by SendMessage) resolves the victim's record with `item_id` +
    /// `source_message_id` attributes on a harmless message.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_producers_source_message_id_attribute_cannot_resolve_a_victims_record() {
        let p = Pipeline::with_dead_items("atk-src", &[body("victim", "throttled")]).await;
        let victim = p.store().get("victim").await.unwrap().unwrap();
        let source_url = p.resources.source_url.clone();
        send_with_attrs(
            &p,
            &source_url,
            &body("attacker", "ok"),
            &[
                ("item_id", "victim"),
                ("source_message_id", &victim.source.message_id),
            ],
        )
        .await;
        p.drain().await;
        let after = p.store().get("victim").await.unwrap().unwrap();
        p.downstream.fix();
        for _ in 0..2 {
            p.redrive_engine()
                .run(&RedriveRequest::default(), &*no_progress())
                .await
                .unwrap();
        }
        let delivered = p.downstream.delivered();
        assert!(
            after.status == ItemStatus::Dead && delivered.iter().any(|d| d == "victim"),
            "status {:?}; delivered: {delivered:?}; dlq depth {}",
            after.status,
            p.dlq_depth().await
        );
    }

    /// An S3 endpoint that accepts connections and never answers.
    async fn black_hole() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                if let Ok((socket, _)) = listener.accept().await {
                    held.push(socket);
                }
            }
        });
        format!("http://{addr}")
    }

    /// (d) A sweep that adopts nothing (as a purge's or a run's settling sweep) over a DLQ
    /// holding one Extended-Client pointer message, with S3 not answering: it must end by
    /// its `until` (5 s), not hang.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sweep_ends_by_its_until_when_s3_does_not_answer() {
        let p = Pipeline::new("atk-hang", Setup::default()).await;
        let pointer = sqs_keeper_core::pointer::S3Pointer {
            bucket: p.resources.bucket.clone(),
            key: "producer/hang".into(),
        }
        .to_body();
        p.send_to_dlq(&[&pointer]).await;
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&p.clients.config)
                .endpoint_url(black_hole().await)
                .force_path_style(true)
                .build(),
        );
        let clients = sqs_keeper_aws::AwsClients {
            s3,
            ..p.clients.clone()
        };
        let store = sqs_keeper_aws::DeadLetterStore::new(clients, p.resources.store_config());
        let started = tokio::time::Instant::now();
        let options = sqs_keeper_core::sweep::SweepOptions {
            adopt: false,
            purge: Default::default(),
            parser: sqs_keeper_core::item::ItemParser {
                id_source: "pointer:/id".parse().unwrap(),
                ..Default::default()
            },
            until: Some(started + std::time::Duration::from_secs(5)),
            hold_until: None,
            random: Default::default(),
            orphans_sent_before_ms: None,
        };
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            store.sweep_dlq(&options),
        )
        .await;
        assert!(
            outcome.is_ok(),
            "the sweep was still running after {:?} (until was 5 s)",
            started.elapsed()
        );
    }

    /// (c) A producer's message moved to the DLQ by the redrive policy, whose body names no id
    /// and which carries `source_message_id` = a victim's message id: the victim's resolved
    /// record (keyed by its message id) must not be reopened with the producer's payload.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_producers_dlq_message_with_a_victims_source_message_id_is_not_deleted_unrecorded() {
        let p =
            Pipeline::with_dead_items("atk-reopen", &[r#"{"scenario":"throttled"}"#.to_string()])
                .await;
        let victim = p.records().await[0].clone();
        p.downstream.fix();
        p.redrive_engine()
            .run(&RedriveRequest::default(), &*no_progress())
            .await
            .unwrap();
        let resolved = p.store().get(&victim.item_id).await.unwrap().unwrap();
        assert_eq!(resolved.status, ItemStatus::Resolved);
        let dlq_url = p.resources.dlq_url.clone();
        send_with_attrs(
            &p,
            &dlq_url,
            r#"{"scenario":"invalid","x":"attacker"}"#,
            &[("source_message_id", &victim.item_id)],
        )
        .await;
        p.redrive_engine()
            .run(&RedriveRequest::default(), &*no_progress())
            .await
            .unwrap();
        let after = p.store().get(&victim.item_id).await.unwrap().unwrap();
        let records = p.records().await;
        assert_eq!(
            (after.status, after.payload.sha256.clone(), records.len()),
            (ItemStatus::Resolved, resolved.payload.sha256.clone(), 2),
            "the producer's message (tracked by the victim's record {}) is neither recorded nor delivered: dlq depth {}, delivered {:?}",
            victim.item_id,
            p.dlq_depth().await,
            p.downstream.delivered()
        );
    }

    /// (d) A whole redrive run given a deadline 60 s away and a 10 s budget, with the same pointer message and
    /// S3 not answering: it must return by its deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redrive_run_returns_by_its_deadline_when_s3_does_not_answer() {
        let p = Pipeline::new("atk-hang2", Setup::default()).await;
        let pointer = sqs_keeper_core::pointer::S3Pointer {
            bucket: p.resources.bucket.clone(),
            key: "producer/hang".into(),
        }
        .to_body();
        p.send_to_dlq(&[&pointer]).await;
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&p.clients.config)
                .endpoint_url(black_hole().await)
                .force_path_style(true)
                .build(),
        );
        let clients = sqs_keeper_aws::AwsClients {
            s3,
            ..p.clients.clone()
        };
        let engine = p.redrive_engine_via(clients);
        let started = tokio::time::Instant::now();
        let request = RedriveRequest {
            time_budget_secs: Some(10),
            ..RedriveRequest::default()
        };
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(90),
            engine.run_until(
                &request,
                Some(started + std::time::Duration::from_secs(60)),
                &*no_progress(),
            ),
        )
        .await;
        assert!(
            outcome.is_ok(),
            "the run was still going after {:?} (deadline 60 s, budget 10 s)",
            started.elapsed()
        );
        let report = outcome.unwrap();
        assert!(report.is_ok(), "{:?}", report.err());
    }

    /// (e) An Extended-Client pointer moved to the DLQ whose payload names a 2 KB+ id (odd
    /// unicode): adopted once under the bounded id, not stuck behind the "tracked by another
    /// id" check.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pointer_whose_payload_names_a_huge_id_is_adopted_under_the_bounded_id() {
        let p = Pipeline::new("atk-huge", Setup::default()).await;
        let id = format!("\u{202e}🦀{}", "é".repeat(1100));
        let payload = serde_json::json!({"id": id, "scenario": "ok"}).to_string();
        p.clients
            .s3
            .put_object()
            .bucket(&p.resources.bucket)
            .key("producer/huge")
            .body(payload.into_bytes().into())
            .send()
            .await
            .unwrap();
        let pointer = sqs_keeper_core::pointer::S3Pointer {
            bucket: p.resources.bucket.clone(),
            key: "producer/huge".into(),
        }
        .to_body();
        p.send_to_dlq(&[&pointer]).await;
        let mut errors = Vec::new();
        for _ in 0..2 {
            let r = p
                .redrive_engine()
                .run(&RedriveRequest::default(), &*no_progress())
                .await
                .unwrap();
            errors.push(r.errors);
        }
        let records = p.records().await;
        assert_eq!(records.len(), 1, "{errors:?}");
        assert_eq!(
            records[0].item_id,
            sqs_keeper_core::item::bounded_item_id(id)
        );
        assert_eq!(records[0].status, ItemStatus::Resolved);
        assert_eq!(p.dlq_depth().await, 0);
    }

    /// (e) A message carrying `requeued_by` and a 2 KB+ `item_id` attribute, whose body
    /// succeeds: delivered once and done, like any other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_requeued_message_with_a_huge_item_id_attribute_is_done_once() {
        let p = Pipeline::new("atk-huge2", Setup::default()).await;
        let huge = "x".repeat(2100);
        let source_url = p.resources.source_url.clone();
        send_with_attrs(
            &p,
            &source_url,
            &body("h", "ok"),
            &[("item_id", &huge), ("requeued_by", "run-1")],
        )
        .await;
        p.drain().await;
        assert_eq!(
            (p.downstream.delivered(), p.dlq_depth().await),
            (vec!["h".to_string()], 0)
        );
    }
}
