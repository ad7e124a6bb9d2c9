//! End-to-end cases against the emulator: each asserts the state of the source queue,
//! the DLQ, the table and the bucket after the pipeline settles.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use e2e::{body, Pipeline, Setup};
use serde_json::json;
use sqs_keeper_core::pointer::S3Pointer;
use sqs_keeper_core::ErrorClass;
use sqs_keeper_core::{dead_letter::DlqClaim, dead_letter::PayloadLocation, DeadLetterReason};
use std::collections::HashMap;

fn attr<'a>(m: &'a aws_sdk_sqs::types::Message, name: &str) -> Option<&'a str> {
    m.message_attributes()?.get(name)?.string_value()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_path_leaves_nothing_behind() {
    let p = Pipeline::new("ok", Setup::default()).await;
    p.send(&[&body("a", "ok"), &body("b", "ok"), &body("c", "duplicate")])
        .await;
    let stats = p.drain().await;
    assert_eq!(stats.received, 3);
    assert_eq!(stats.deleted, 3);
    assert_eq!(stats.reported, 0);
    assert_eq!(p.source_depth().await, 0);
    assert!(p.records().await.is_empty());
    assert!(p.dlq_messages().await.is_empty());
    assert!(p.objects().await.is_empty());
    let mut delivered = p.downstream.delivered();
    delivered.sort();
    assert_eq!(delivered, ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_then_success_across_deliveries() {
    // One attempt per invocation: the two 503s are two reported deliveries, the third works.
    let p = Pipeline::new(
        "flaky",
        Setup {
            max_receive_count: 5,
            ..Setup::default()
        },
    )
    .await;
    p.send(&[&body("f", "flaky")]).await;
    let stats = p.drain().await;
    assert_eq!(stats.received, 3);
    assert_eq!(stats.reported, 2);
    assert_eq!(stats.deleted, 1);
    assert_eq!(p.downstream.delivered(), ["f"]);
    assert!(p.records().await.is_empty());
    assert!(p.dlq_messages().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_until_budget_is_dead_lettered_by_the_worker() {
    let p = Pipeline::new(
        "budget",
        Setup {
            max_receive_count: 3,
            worker_env: vec![("WORKER_RETRY_MAX_ATTEMPTS", "2".into())],
            ..Setup::default()
        },
    )
    .await;
    p.send(&[&body("t", "throttled")]).await;
    let stats = p.drain().await;
    assert_eq!(
        stats.received, 3,
        "three deliveries: 1 and 2 reported, 3 dead-lettered"
    );
    assert_eq!(stats.reported, 2);
    assert_eq!(p.downstream.calls("t"), 6, "two attempts per delivery");
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.item_id, "t");
    assert_eq!(r.reason, DeadLetterReason::ReceiveBudgetExhausted);
    assert_eq!(r.error_class, ErrorClass::Throttled);
    assert_eq!(r.source.receive_count, 3);
    // One entry per attempt of the dead-lettering delivery.
    assert_eq!(r.failure_count, 2);
    assert_eq!(r.failure_history.len(), 2);
    assert_eq!(
        r.failure_history
            .iter()
            .map(|f| f.attempt_number)
            .collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(r.failure_history.iter().all(|f| f.http_status == Some(429)));
    assert!(
        r.first_attempt < r.last_attempt,
        "first try comes from the first delivery"
    );
    assert!(r.reprocess_eligible);
    let dlq = p.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(attr(&dlq[0], "item_id"), Some("t"));
    assert_eq!(dlq[0].body(), Some(body("t", "throttled").as_str()));
    // SQS's own redrive did not move it: the worker did, with a record.
    assert_eq!(p.source_depth().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failure_is_dead_lettered_on_first_receive() {
    let p = Pipeline::new("perm", Setup::default()).await;
    p.send(&[
        &body("v", "invalid"),
        &body("x", "forbidden"),
        "{not json",
        &body("ok", "ok"),
    ])
    .await;
    let stats = p.drain().await;
    assert_eq!(stats.received, 4, "no redelivery");
    assert_eq!(stats.reported, 0);
    let mut records = p.records().await;
    records.sort_by_key(|r| r.error_class);
    assert_eq!(records.len(), 3);
    let classes: Vec<_> = records.iter().map(|r| r.error_class).collect();
    assert_eq!(
        classes,
        [
            ErrorClass::Validation,
            ErrorClass::Validation,
            ErrorClass::Permission
        ]
    );
    for r in &records {
        assert_eq!(r.reason, DeadLetterReason::Permanent);
        assert_eq!(r.source.receive_count, 1);
        assert_eq!(r.failure_count, 1);
        assert!(!r.reprocess_eligible);
    }
    let permission = records
        .iter()
        .find(|r| r.error_class == ErrorClass::Permission)
        .unwrap();
    assert!(permission.manual_review_required);
    let malformed = records
        .iter()
        .find(|r| r.failure_history[0].step.as_deref() == Some("parse"))
        .unwrap();
    assert_eq!(
        malformed.item_id, malformed.source.message_id,
        "keyed by message id"
    );
    assert_eq!(
        malformed.payload.location,
        PayloadLocation::Inline {
            body: "{not json".into()
        }
    );
    assert_eq!(p.dlq_messages().await.len(), 3);
    assert_eq!(p.downstream.calls("v"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_payload_goes_to_s3_with_matching_sha256() {
    let p = Pipeline::new("large", Setup::default()).await;
    let large =
        json!({"id": "big", "scenario": "invalid", "blob": "z".repeat(100_000)}).to_string();
    p.send(&[&large]).await;
    p.drain().await;
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
    let PayloadLocation::S3 { bucket, key } = &r.payload.location else {
        panic!("expected an S3 payload, got {:?}", r.payload.location);
    };
    assert_eq!(bucket, &p.resources.bucket);
    assert_eq!(r.payload.size_bytes, large.len() as u64);
    assert_eq!(
        r.payload.sha256,
        sqs_keeper_core::hex::sha256_hex(large.as_bytes())
    );
    assert_eq!(p.objects().await, std::slice::from_ref(key));
    let object = p
        .clients
        .s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap();
    assert_eq!(object.metadata().unwrap()["sha256"], r.payload.sha256);
    let stored = object.body.collect().await.unwrap().into_bytes();
    assert_eq!(sqs_keeper_core::hex::sha256_hex(&stored), r.payload.sha256);
    // The DLQ message points at the object, as the SQS Extended Client would.
    let dlq = p.dlq_messages().await;
    assert_eq!(dlq.len(), 1);
    let pointer = S3Pointer::parse(dlq[0].body().unwrap()).unwrap();
    assert_eq!(&pointer.key, key);
    assert_eq!(
        dlq[0].message_attributes().unwrap()["ExtendedPayloadSize"].string_value(),
        Some(large.len().to_string().as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_client_pointer_body_is_resolved() {
    let p = Pipeline::new("extptr", Setup::default()).await;
    let payload = body("from-s3", "ok");
    p.clients
        .s3
        .put_object()
        .bucket(&p.resources.bucket)
        .key("incoming/one")
        .body(payload.clone().into_bytes().into())
        .send()
        .await
        .unwrap();
    let present = S3Pointer {
        bucket: p.resources.bucket.clone(),
        key: "incoming/one".into(),
    };
    let missing = S3Pointer {
        bucket: p.resources.bucket.clone(),
        key: "incoming/missing".into(),
    };
    p.send(&[&present.to_body(), &missing.to_body()]).await;
    let stats = p.drain().await;
    assert_eq!(stats.received, 2);
    assert_eq!(p.downstream.delivered(), ["from-s3"]);
    // The pointer to a missing object is a permanent not-found failure, dead-lettered.
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error_class, ErrorClass::NotFound);
    assert_eq!(
        records[0].failure_history[0].step.as_deref(),
        Some("fetch-payload")
    );
    assert_eq!(p.dlq_messages().await.len(), 1);
}

/// Both Extended-Client pointer forms are read, with 900 KB payloads: the
/// `PayloadS3Pointer` array and the bare `{"s3BucketName", "s3Key"}` object of the Java 1.x
/// and Python clients; a bare object naming a bucket not allowed is the producer's data,
/// delivered as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_extended_client_pointer_forms_are_read_with_900_kb_payloads() {
    let p = Pipeline::new("extforms", Setup::default()).await;
    let mut pointers = Vec::new();
    for (id, form) in [("array-form", "array"), ("bare-form", "bare")] {
        let payload = json!({"id": id, "scenario": "ok", "blob": "y".repeat(900_000)}).to_string();
        let key = format!("incoming/{id}");
        p.clients
            .s3
            .put_object()
            .bucket(&p.resources.bucket)
            .key(&key)
            .body(payload.into_bytes().into())
            .send()
            .await
            .unwrap();
        pointers.push(match form {
            "array" => S3Pointer {
                bucket: p.resources.bucket.clone(),
                key,
            }
            .to_body(),
            _ => json!({"s3BucketName": p.resources.bucket, "s3Key": key}).to_string(),
        });
    }
    let data = json!({"s3BucketName": "someone-elses", "s3Key": "k", "id": "plain"}).to_string();
    let not_ours = json!({"s3BucketName": "someone-elses", "s3Key": "k"}).to_string();
    p.send(&[&pointers[0], &pointers[1], &data, &not_ours])
        .await;
    let stats = p.drain().await;
    assert_eq!(stats.received, 4);
    let mut delivered = p.downstream.delivered();
    delivered.sort();
    // The last body has no `id`: the downstream names it by its whole body.
    assert_eq!(
        delivered,
        ["array-form", "bare-form", "plain", not_ours.as_str()]
    );
    assert!(p.records().await.is_empty(), "{:?}", p.records().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_the_same_failure_twice_keeps_one_record_and_an_exact_count() {
    use sqs_keeper_core::item::ItemParser;
    use sqs_keeper_core::{dead_letter::DeadLetterSink, dead_letter::InvocationInfo};

    let p = Pipeline::new("idem", Setup::default()).await;
    let store = p.store();
    let candidate = |receive_count: u32| {
        let msg = serde_json::from_value(json!({
            "messageId": format!("m-{receive_count}"),
            "body": body("dup", "invalid"),
            "attributes": {"ApproximateReceiveCount": receive_count.to_string()},
            "eventSourceARN": p.resources.source_arn,
        }))
        .unwrap();
        let item = ItemParser {
            id_source: "pointer:/id".parse().unwrap(),
            ..ItemParser::default()
        }
        .parse(format!("m-{receive_count}"), msg)
        .unwrap();
        timed_out_twice(item)
    };
    let info = InvocationInfo::default();
    let first = candidate(3);
    // Another item's failure in the same call: their DLQ messages are marked sent in one
    // transaction.
    let other = {
        let mut c = candidate(3);
        c.item.item_id = "dup-2".to_string();
        c.item.message_id = "m-other".to_string();
        c
    };
    let both = store
        .dead_letter(&[first.clone(), other.clone()], &info)
        .await;
    assert!(both.iter().all(Result::is_ok), "{both:?}");
    for item_id in ["dup", "dup-2"] {
        let raw = p
            .clients
            .dynamodb
            .get_item()
            .table_name(&p.resources.table)
            .key(
                "item_id",
                aws_sdk_dynamodb::types::AttributeValue::S(item_id.into()),
            )
            .send()
            .await
            .unwrap();
        let sent = raw
            .item()
            .and_then(|i| i.get("dlq_sent"))
            .and_then(|v| v.as_ss().ok())
            .cloned();
        assert!(sent.is_some_and(|s| s.len() == 1), "{item_id}: {raw:?}");
    }
    // The other item's redelivery is acknowledged and sends nothing (the DLQ holds two
    // messages, counted below).
    assert!(store.dead_letter(std::slice::from_ref(&other), &info).await[0].is_ok());
    // The same delivery again (Lambda invoked the batch twice, or its answer was lost):
    // nothing is appended, no second DLQ message is sent, and it is acknowledged, since
    // the message's DLQ message was sent (the record says so).
    let again = store.dead_letter(std::slice::from_ref(&first), &info).await;
    assert!(again[0].is_ok(), "{again:?}");
    assert_eq!(p.dlq_messages().await.len(), 2);
    let records = p.records().await;
    assert_eq!(records.len(), 2);
    let dup = records.iter().find(|r| r.item_id == "dup").unwrap();
    assert_eq!(dup.failure_count, 2);
    assert_eq!(dup.failure_history.len(), 2);
    // A later delivery of the same item (say, after a redrive) appends its attempts.
    assert!(store.dead_letter(&[candidate(4)], &info).await[0].is_ok());
    let r = store.get("dup").await.unwrap().unwrap();
    assert_eq!(r.failure_count, 4);
    let ids: Vec<_> = r
        .failure_history
        .iter()
        .map(|f| f.attempt_id.as_str())
        .collect();
    assert_eq!(ids, ["m-3:3:1", "m-3:3:2", "m-4:4:1", "m-4:4:2"]);
    assert_eq!(r.source.message_id, "m-4");
}

/// The same batch invoked twice on a last receive, the first copy's DLQ send failed and it
/// released the claim: the second copy, whose attempts are all recorded, takes the free
/// claim in a write that appends nothing (DynamoDB refuses empty sets: the write must
/// leave the history, its count and its ids alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_only_write_takes_a_freed_claim_and_appends_nothing() {
    use sqs_keeper_core::item::ItemParser;
    use sqs_keeper_core::{dead_letter::DeadLetteredItem, dead_letter::InvocationInfo};
    use sqs_keeper_core::{ports::Expect, ports::RecordStore};

    let p = Pipeline::new("claimonly", Setup::default()).await;
    let store = p.store();
    let msg = serde_json::from_value(json!({
        "messageId": "m-twin",
        "body": body("twin", "invalid"),
        "attributes": {"ApproximateReceiveCount": "5"},
        "eventSourceARN": p.resources.source_arn,
    }))
    .unwrap();
    let item = ItemParser {
        id_source: "pointer:/id".parse().unwrap(),
        ..ItemParser::default()
    }
    .parse("m-twin".to_string(), msg)
    .unwrap();
    let candidate = timed_out_twice(item);
    let record = DeadLetteredItem::from_candidate(
        &candidate,
        &InvocationInfo::default(),
        chrono_now(),
        std::time::Duration::from_secs(86_400),
    );
    let history = record.failure_history.clone();
    let claim = sqs_keeper_core::dead_letter::DlqClaim::of(&record.source);
    let first = RecordStore::try_record(&store, &record, &history, Some(&claim), Expect::Any)
        .await
        .unwrap();
    assert!(first.is_some());
    RecordStore::release_claim(&store, "twin", &claim)
        .await
        .unwrap();
    let claimed = RecordStore::try_record(&store, &record, &[], Some(&claim), Expect::Any)
        .await
        .unwrap()
        .expect("the freed claim is taken");
    assert_eq!(
        claimed.record.failure_count,
        u32::try_from(history.len()).unwrap()
    );
    assert!(
        claimed.claims.contains(&claim.element()),
        "the claims come back with the record"
    );
    assert_eq!(claimed.record.failure_history.len(), history.len());
    let known = RecordStore::deliveries(&store, "twin").await.unwrap();
    assert!(known.claims.contains(&claim.element()), "{known:?}");
    assert_eq!(known.attempt_ids.len(), history.len());
    // Taken now: a second claim-only write is refused.
    let again = RecordStore::try_record(&store, &record, &[], Some(&claim), Expect::Any)
        .await
        .unwrap();
    assert!(again.is_none());
}

fn chrono_now() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_reports_the_record_and_keeps_the_message() {
    let p = Pipeline::new(
        "outage",
        Setup {
            worker_env: vec![("DLQ_TABLE", "no-such-table".into())],
            ..Setup::default()
        },
    )
    .await;
    p.send(&[&body("v", "invalid")]).await;
    let mut stats = Default::default();
    let received = p.esm.poll_once(&p.invoker, &mut stats).await.unwrap();
    assert_eq!(received, 1);
    assert_eq!(stats.reported, 1, "not acknowledged");
    assert_eq!(stats.deleted, 0);
    assert_eq!(
        p.source_depth().await,
        1,
        "the message is still in the source queue"
    );
    assert!(
        p.dlq_messages().await.is_empty(),
        "no DLQ message without a record"
    );
    assert!(p.records().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_order_is_kept_across_a_failure() {
    let p = Pipeline::new(
        "fifo",
        Setup {
            fifo: true,
            max_receive_count: 5,
            ..Setup::default()
        },
    )
    .await;
    // b fails twice (503) before it succeeds; c must not overtake it.
    p.send_fifo(&body("a", "ok"), "g1", "1").await;
    p.send_fifo(&body("b", "flaky"), "g1", "2").await;
    p.send_fifo(&body("c", "ok"), "g1", "3").await;
    p.send_fifo(&body("x", "ok"), "g2", "4").await;
    let stats = p.drain().await;
    let delivered = p.downstream.delivered();
    let g1: Vec<_> = delivered.iter().filter(|id| *id != "x").cloned().collect();
    assert_eq!(g1, ["a", "b", "c"]);
    assert_eq!(p.downstream.calls("c"), 1, "c never ran before b succeeded");
    assert!(delivered.contains(&"x".to_string()));
    assert!(stats.reported >= 2);
    assert!(p.records().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awkward_text_round_trips_through_the_record() {
    use sqs_keeper_core::item::ItemParser;
    use sqs_keeper_core::retry::AttemptFailure;
    use sqs_keeper_core::{
        dead_letter::DeadLetterCandidate, dead_letter::DeadLetterSink, dead_letter::InvocationInfo,
    };

    let p = Pipeline::new("awkward", Setup::default()).await;
    let text = "q\"uote back\\slash Some(\\\"x\\\") ü € 😀 new\nline \u{1} tab\t";
    let msg = serde_json::from_value(json!({
        "messageId": "m-1",
        "body": json!({"id": "odd id/ü", "note": text}).to_string(),
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {"tenant": {"stringValue": text, "dataType": "String"}},
    }))
    .unwrap();
    let item = ItemParser {
        id_source: "pointer:/id".parse().unwrap(),
        ..ItemParser::default()
    }
    .parse("m-1".into(), msg)
    .unwrap();
    let error = sqs_keeper_lambda::ProcessError::validation(text).with_cause(text);
    let candidate = DeadLetterCandidate {
        item,
        failures: vec![AttemptFailure {
            attempt: 1,
            started_at: chrono_now(),
            duration: std::time::Duration::ZERO,
            error: error.clone(),
        }],
        error,
        reason: DeadLetterReason::Permanent,
    };
    let results = p
        .store()
        .dead_letter(&[candidate], &InvocationInfo::default())
        .await;
    assert!(results[0].is_ok(), "{results:?}");
    let r = p.store().get("odd id/ü").await.unwrap().unwrap();
    assert_eq!(r.last_error, text);
    assert_eq!(r.failure_history[0].causes, [text]);
    assert_eq!(
        r.source.message_attributes["tenant"].string_value(),
        Some(text)
    );
    let dlq = p.dlq_messages().await;
    assert_eq!(attr(&dlq[0], "item_id"), Some("odd id/ü"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_counter_counts_and_times_each_operation() {
    let p = Pipeline::new("counter", Setup::default()).await;
    let counter = sqs_keeper_aws::CallCounter::default();
    let shared =
        sqs_keeper_aws::AwsClients::endpoint_config(&e2e::emulator().await, e2e::REGION).await;
    let clients = sqs_keeper_aws::AwsClients::counted(&shared, true, &counter);
    clients
        .sqs
        .send_message()
        .queue_url(&p.resources.source_url)
        .message_body("{}")
        .send()
        .await
        .unwrap();
    for _ in 0..2 {
        let _ = sqs_keeper_aws::DeadLetterStore::new(clients.clone(), p.resources.store_config())
            .get("nobody")
            .await
            .unwrap();
    }
    let calls = counter.snapshot();
    assert_eq!(calls.get("SQS.SendMessage"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("DynamoDB.GetItem"), Some(&2), "{calls:?}");
    assert_eq!(counter.total(), 3);
    let latency = counter.latency();
    assert!(latency["DynamoDB.GetItem"] > std::time::Duration::ZERO);
    counter.reset();
    assert_eq!(counter.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_records_without_a_usable_group_are_dead_lettered_and_requeued() {
    use aws_sdk_sqs::types::MessageSystemAttributeName as S;
    use sqs_keeper_core::message::fifo_group_id;
    use sqs_keeper_core::{
        redrive, redrive::ItemOutcomeKind, redrive::RedriveMode, redrive::RedriveRequest,
    };

    let p = Pipeline::new(
        "fifonogroup",
        Setup {
            fifo: true,
            ..Setup::default()
        },
    )
    .await;
    // Lambda always sends a group id for a FIFO source; a hand-built event (a test, a
    // replay tool) may not, or may send an empty one. The item ids: one SQS accepts as a
    // group id, one it does not (a space, a non-ASCII letter).
    let record = |message_id: &str, id: &str, group: Option<&str>| {
        let mut attributes =
            json!({"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000"});
        if let Some(group) = group {
            attributes["MessageGroupId"] = json!(group);
        }
        json!({
            "messageId": message_id,
            "body": body(id, "invalid"),
            "attributes": attributes,
            "messageAttributes": {},
            "eventSource": "aws:sqs",
            "eventSourceARN": p.resources.source_arn,
        })
    };
    let event: aws_lambda_events::sqs::SqsEvent = serde_json::from_value(json!({"Records": [
        record("m-1", "odd id/ü", None),
        record("m-2", "plain-1", Some("")),
    ]}))
    .unwrap();
    let report = p
        .invoker
        .worker
        .run(
            event,
            sqs_keeper_core::retry::Deadline::after(
                std::time::Duration::from_secs(30),
                std::time::Duration::ZERO,
            ),
            None,
        )
        .await
        .unwrap();
    assert!(
        report.response().batch_item_failures.is_empty(),
        "both acknowledged as dead-lettered: {report:?}"
    );
    assert_eq!(report.counts().dead_lettered, 2, "{report:?}");

    let hashed = fifo_group_id(None, "odd id/ü");
    assert!(hashed.starts_with("item-"), "{hashed}");
    let groups = |queue_url: String| {
        let sqs = p.clients.sqs.clone();
        async move {
            let output = sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .visibility_timeout(0)
                .message_system_attribute_names(S::MessageGroupId)
                .message_attribute_names("All")
                .send()
                .await
                .unwrap();
            let mut seen: Vec<(String, String)> = output
                .messages()
                .iter()
                .map(|m| {
                    (
                        attr(m, "item_id").unwrap().to_string(),
                        m.attributes().unwrap()[&S::MessageGroupId].clone(),
                    )
                })
                .collect();
            seen.sort();
            seen
        }
    };
    let expected = [
        ("odd id/ü".to_string(), hashed.clone()),
        ("plain-1".to_string(), "plain-1".to_string()),
    ];
    assert_eq!(groups(p.resources.dlq_url.clone()).await, expected);
    assert_eq!(p.records().await.len(), 2);

    // Requeued to the FIFO source, they get the same valid groups.
    let redrive = p
        .redrive_engine()
        .run(
            &RedriveRequest {
                mode: RedriveMode::Requeue,
                force: true,
                ..Default::default()
            },
            &*redrive::no_progress(),
        )
        .await
        .unwrap();
    assert_eq!(
        e2e::outcome_ids(&redrive, ItemOutcomeKind::Requeued),
        ["odd id/ü", "plain-1"],
        "{redrive:?}"
    );
    assert_eq!(groups(p.resources.source_url.clone()).await, expected);
}

/// A secret rotated while the worker runs: the downstream's first 401 makes the worker read
/// the secret again (Secrets Manager, on the emulator) and send once more; no record is
/// dead-lettered as `permission` for the old value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_rotated_while_the_worker_runs_is_read_again_on_a_401() {
    use std::sync::Arc;

    use sqs_keeper_lambda::config::WorkerConfig;
    use sqs_keeper_lambda::http_worker::DefaultWorker;
    use sqs_keeper_local::http_server::{text, Handler, Server};

    let clients = e2e::clients().await;
    let secret_name = e2e::unique_prefix("rotated-key");
    clients
        .secretsmanager
        .create_secret()
        .name(&secret_name)
        .secret_string("Bearer old")
        .send()
        .await
        .unwrap();
    // A downstream that takes the new value only.
    let handler: Handler = Arc::new(move |request| {
        Box::pin(async move {
            match request.headers.get("authorization").map(|v| v.as_bytes()) {
                Some(b"Bearer new") => text(http::StatusCode::OK, ""),
                _ => text(http::StatusCode::UNAUTHORIZED, "bad key"),
            }
        })
    });
    let downstream = Server::start(0, handler).await.unwrap();
    let url = format!("http://{}/ingest", downstream.addr());
    let vars = [
        ("WORKER_DOWNSTREAM_URL", url.as_str()),
        ("WORKER_DOWNSTREAM_AUTH_HEADER", "Authorization"),
        ("WORKER_DOWNSTREAM_AUTH_SECRET", secret_name.as_str()),
    ];
    let config = WorkerConfig::from_lookup(&|k| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap();
    let worker = DefaultWorker::from_config(config, Some(clients.clone()))
        .await
        .unwrap();
    // Rotated after the worker read it.
    clients
        .secretsmanager
        .put_secret_value()
        .secret_id(&secret_name)
        .secret_string("Bearer new")
        .send()
        .await
        .unwrap();
    let event: aws_lambda_events::sqs::SqsEvent = serde_json::from_value(json!({"Records": [
        {"messageId": "m-1", "body": body("a", "ok"), "attributes": {}},
        {"messageId": "m-2", "body": body("b", "ok"), "attributes": {}},
    ]}))
    .unwrap();
    let report = worker
        .run(
            event,
            sqs_keeper_core::retry::Deadline::after(
                std::time::Duration::from_secs(30),
                std::time::Duration::ZERO,
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(report.counts().done, 2, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_downstream_credential_comes_from_secrets_manager() {
    use std::sync::{Arc, Mutex};

    use sqs_keeper_lambda::config::WorkerConfig;
    use sqs_keeper_lambda::http_worker::DefaultWorker;
    use sqs_keeper_local::http_server::{text, Handler, Server};

    let clients = e2e::clients().await;
    let secret_name = e2e::unique_prefix("downstream-key");
    // As written from a file: a trailing newline.
    let created = clients
        .secretsmanager
        .create_secret()
        .name(&secret_name)
        .secret_string("Bearer s3cret-t0ken\n")
        .send()
        .await
        .unwrap();
    let arn = created.arn().unwrap().to_string();
    // A downstream that remembers the credential header of each request.
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let seen_by_handler = seen.clone();
    let handler: Handler = Arc::new(move |request| {
        let seen = seen_by_handler.clone();
        Box::pin(async move {
            let value = request
                .headers
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_string());
            seen.lock().unwrap().push(value);
            text(http::StatusCode::OK, "")
        })
    });
    let downstream = Server::start(0, handler).await.unwrap();
    let url = format!("http://{}/ingest", downstream.addr());
    let config = |secret: &str| {
        let vars = [
            ("WORKER_DOWNSTREAM_URL", url.as_str()),
            ("WORKER_DOWNSTREAM_AUTH_HEADER", "Authorization"),
            ("WORKER_DOWNSTREAM_AUTH_SECRET", secret),
        ];
        WorkerConfig::from_lookup(&|k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap()
    };

    // Both the ARN and the name identify the secret.
    for secret in [arn.as_str(), secret_name.as_str()] {
        let worker = DefaultWorker::from_config(config(secret), Some(clients.clone()))
            .await
            .unwrap();
        assert!(!format!("{worker:?}").contains("s3cret"), "{worker:?}");
        let event: aws_lambda_events::sqs::SqsEvent = serde_json::from_value(json!({"Records": [
            {"messageId": "m-1", "body": body("a", "ok"), "attributes": {}},
            {"messageId": "m-2", "body": body("b", "ok"), "attributes": {}},
        ]}))
        .unwrap();
        let report = worker
            .run(
                event,
                sqs_keeper_core::retry::Deadline::after(
                    std::time::Duration::from_secs(30),
                    std::time::Duration::ZERO,
                ),
                None,
            )
            .await
            .unwrap();
        assert_eq!(report.counts().done, 2, "{report:?}");
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(
            seen,
            [
                Some("Bearer s3cret-t0ken".to_string()),
                Some("Bearer s3cret-t0ken".to_string())
            ]
        );
    }

    // A secret that cannot be read, or cannot be a header, stops the start: the error
    // names the variable and the secret, never the value.
    let unusable = clients
        .secretsmanager
        .create_secret()
        .name(e2e::unique_prefix("two-lines"))
        .secret_string("Bearer s3cret\nsecond line")
        .send()
        .await
        .unwrap();
    for (secret, why) in [
        (e2e::unique_prefix("missing"), "ResourceNotFoundException"),
        (
            unusable.arn().unwrap().to_string(),
            "cannot be sent in the authorization header",
        ),
    ] {
        let err = DefaultWorker::from_config(config(&secret), Some(clients.clone()))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("WORKER_DOWNSTREAM_AUTH_SECRET") && text.contains(&secret),
            "{text}"
        );
        assert!(text.contains(why), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_client_pointers_are_followed_only_to_allowed_buckets_and_sizes() {
    use sqs_keeper_aws::{AwsClients, CallCounter};
    use sqs_keeper_lambda::config::WorkerConfig;
    use sqs_keeper_lambda::http_worker::DefaultWorker;

    let p = Pipeline::new("extpolicy", Setup::default()).await;
    let producer = e2e::unique_prefix("producer").to_ascii_lowercase();
    let stranger = e2e::unique_prefix("stranger").to_ascii_lowercase();
    for bucket in [&producer, &stranger] {
        p.clients
            .s3
            .create_bucket()
            .bucket(bucket)
            .send()
            .await
            .unwrap();
    }
    let put = |bucket: String, key: &'static str, body: String| {
        let s3 = p.clients.s3.clone();
        async move {
            s3.put_object()
                .bucket(bucket)
                .key(key)
                .body(body.into_bytes().into())
                .send()
                .await
                .unwrap();
        }
    };
    let big = json!({"id": "big", "scenario": "ok", "blob": "b".repeat(3_000)}).to_string();
    put(producer.clone(), "small", body("from-producer", "ok")).await;
    put(producer.clone(), "big", big).await;
    put(stranger.clone(), "small", body("from-stranger", "ok")).await;
    put(
        p.resources.bucket.clone(),
        "small",
        body("from-store", "ok"),
    )
    .await;
    let pointer = |bucket: &str, key: &str| {
        S3Pointer {
            bucket: bucket.to_string(),
            key: key.to_string(),
        }
        .to_body()
    };

    let mut env: std::collections::HashMap<String, String> = p.worker_env.iter().cloned().collect();
    env.insert("WORKER_PAYLOAD_BUCKETS".into(), producer.clone());
    env.insert("WORKER_PAYLOAD_MAX_BYTES".into(), "2048".into());
    let config = WorkerConfig::from_lookup(&|k| env.get(k).cloned()).unwrap();
    let counter = CallCounter::default();
    let shared = AwsClients::endpoint_config(&e2e::emulator().await, e2e::REGION).await;
    let worker =
        DefaultWorker::from_config(config, Some(AwsClients::counted(&shared, true, &counter)))
            .await
            .unwrap();
    let record = |message_id: &str, body: String| json!({"messageId": message_id, "body": body, "attributes": {"ApproximateReceiveCount": "1"}});
    let event: aws_lambda_events::sqs::SqsEvent = serde_json::from_value(json!({"Records": [
        record("m-producer", pointer(&producer, "small")),
        record("m-big", pointer(&producer, "big")),
        record("m-stranger", pointer(&stranger, "small")),
        record("m-store", pointer(&p.resources.bucket, "small")),
    ]}))
    .unwrap();
    let report = worker
        .run(
            event,
            sqs_keeper_core::retry::Deadline::after(
                std::time::Duration::from_secs(30),
                std::time::Duration::ZERO,
            ),
            None,
        )
        .await
        .unwrap();
    assert!(
        report.response().batch_item_failures.is_empty(),
        "{report:?}"
    );
    let mut delivered = p.downstream.delivered();
    delivered.sort();
    assert_eq!(delivered, ["from-producer", "from-store"]);
    // Three objects fetched (the allowed ones); nothing asked of the stranger's bucket.
    assert_eq!(
        counter.snapshot().get("S3.GetObject"),
        Some(&3),
        "{:?}",
        counter.snapshot()
    );

    let records = p.records().await;
    let by_id = |id: &str| records.iter().find(|r| r.item_id == id).unwrap();
    assert_eq!(records.len(), 2, "{records:?}");
    let big = by_id("m-big");
    assert_eq!(big.error_class, ErrorClass::Validation);
    assert!(
        big.last_error.contains("more than the 2048"),
        "{}",
        big.last_error
    );
    let stranger_record = by_id("m-stranger");
    assert_eq!(stranger_record.error_class, ErrorClass::Permission);
    assert!(stranger_record.manual_review_required);
    assert!(
        stranger_record
            .last_error
            .contains("WORKER_PAYLOAD_BUCKETS"),
        "{}",
        stranger_record.last_error
    );
    // Both keep the pointer they came with, not a payload.
    for (record, bucket, key) in [
        (big, &producer, "big"),
        (stranger_record, &stranger, "small"),
    ] {
        assert_eq!(
            record.payload.location,
            PayloadLocation::Inline {
                body: pointer(bucket, key)
            }
        );
        assert_eq!(record.reason, DeadLetterReason::Permanent);
    }
    assert_eq!(p.dlq_messages().await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_records_live_in_dynamodb_local_and_the_queues_in_moto() {
    use sqs_keeper_aws::{AwsClients, Endpoints};
    let p = Pipeline::new("where", Setup::default()).await;
    p.send(&[&body("a", "invalid")]).await;
    p.drain().await;
    assert_eq!(p.records().await.len(), 1);

    let emulator = e2e::emulator().await;
    let dynamodb_local =
        AwsClients::for_endpoints(&Endpoints::single(&emulator.dynamodb), e2e::REGION).await;
    let moto = AwsClients::for_endpoints(&Endpoints::single(&emulator.shared), e2e::REGION).await;
    // Whether an emulator has the table: asked by name, since the tests running beside
    // this one create more tables than one page of ListTables holds.
    let has_table = |clients: AwsClients, name: String| async move {
        clients
            .dynamodb
            .describe_table()
            .table_name(name)
            .send()
            .await
            .is_ok()
    };
    // The table the pipeline wrote its record to is DynamoDB Local's...
    assert!(has_table(dynamodb_local.clone(), p.resources.table.clone()).await);
    let item = dynamodb_local
        .dynamodb
        .get_item()
        .table_name(&p.resources.table)
        .key(
            sqs_keeper_aws::schema::ITEM_ID,
            aws_sdk_dynamodb::types::AttributeValue::S("a".into()),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(item.item().is_some());
    // ...not moto's, which serves the queues.
    assert!(!has_table(moto.clone(), p.resources.table.clone()).await);
    let dlq = moto
        .sqs
        .get_queue_attributes()
        .queue_url(&p.resources.dlq_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .unwrap();
    assert_eq!(
        dlq.attributes()
            .and_then(
                |a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            )
            .map(String::as_str),
        Some("1")
    );

    // And it is AWS's DynamoDB: it refuses a table name DynamoDB refuses, which moto accepts.
    let refused = dynamodb_local
        .dynamodb
        .describe_table()
        .table_name("no spaces or ! in a table name")
        .send()
        .await
        .unwrap_err();
    let message = format!("{}", aws_sdk_dynamodb::error::DisplayErrorContext(&refused));
    assert!(message.contains("ValidationException"), "{message}");
}

/// The shipped worker under `WORKER_ENVELOPE=eventbridge`: the downstream receives the
/// event's `detail`, the item is keyed by a pointer into it, and an event without a
/// detail is dead-lettered as it arrived. Under `s3`, S3's test event is skipped and an
/// object's notification is keyed by the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelopes_deliver_the_inner_payload_and_dead_letter_what_does_not_match() {
    let p = Pipeline::new(
        "envelope-eb",
        Setup {
            max_receive_count: 1,
            worker_env: vec![("WORKER_ENVELOPE", "eventbridge".to_string())],
            ..Setup::default()
        },
    )
    .await;
    let event = |id: &str, detail: serde_json::Value| {
        serde_json::json!({"version": "0", "id": id, "detail-type": "Order Placed",
            "source": "com.example", "account": "1", "time": "2026-11-24T10:00:00Z",
            "region": "us-east-1", "resources": [], "detail": detail})
        .to_string()
    };
    let no_detail = r#"{"id":"eb-3","source":"com.example","detail-type":"x"}"#;
    p.send(&[
        &event(
            "eb-1",
            serde_json::json!({"id": "inner-1", "scenario": "ok"}),
        ),
        no_detail,
    ])
    .await;
    p.drain().await;
    assert_eq!(p.downstream.delivered(), ["inner-1"]);
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error_class, ErrorClass::Validation);
    assert!(
        records[0].last_error.contains("EventBridge"),
        "{}",
        records[0].last_error
    );

    let s3 = Pipeline::new(
        "envelope-s3",
        Setup {
            max_receive_count: 1,
            worker_env: vec![
                ("WORKER_ENVELOPE", "s3".to_string()),
                ("WORKER_ITEM_ID_SOURCE", "envelope".to_string()),
            ],
            ..Setup::default()
        },
    )
    .await;
    let test_event = r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Time":"2026-11-24T10:00:00.000Z","Bucket":"inbox","RequestId":"r","HostId":"h"}"#;
    // The downstream answers 400 to this record (its `scenario`): dead-lettered, keyed by
    // its object.
    let created = serde_json::json!({"Records": [{"scenario": "invalid", "eventVersion": "2.1", "eventSource": "aws:s3",
        "awsRegion": "us-east-1", "eventTime": "2026-11-24T10:00:00.000Z",
        "eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "inbox"},
        "object": {"key": "a+b.csv", "size": 3, "sequencer": "0A1"}}}]})
    .to_string();
    s3.send(&[test_event, &created]).await;
    let stats = s3.drain().await;
    assert_eq!(stats.deleted, 2, "{stats:?}");
    let records = s3.records().await;
    assert_eq!(
        records.len(),
        1,
        "the test event is skipped, not dead-lettered"
    );
    assert_eq!(records[0].item_id, "s3://inbox/a b.csv#0A1");
}

/// Spaced retries across deliveries: a record returned for retry is hidden for its
/// redelivery delay (at least half of `WORKER_REDELIVERY_BASE_SECS` on its first
/// receive), not the queue's 1 s visibility timeout; it stays in the queue, and the
/// record that succeeded is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_returned_for_retry_is_hidden_for_its_redelivery_delay() {
    let p = Pipeline::new(
        "spaced",
        Setup {
            max_receive_count: 5,
            worker_env: vec![("WORKER_REDELIVERY_BASE_SECS", "20".to_string())],
            ..Setup::default()
        },
    )
    .await;
    p.send(&[&body("t", "throttled"), &body("ok", "ok")]).await;
    let mut stats = sqs_keeper_local::esm::EsmStats::default();
    let mut received = 0;
    for _ in 0..5 {
        received += p.esm.poll_once(&p.invoker, &mut stats).await.unwrap();
        if received == 2 {
            break;
        }
    }
    assert_eq!(received, 2, "{stats:?}");
    assert_eq!(stats.reported, 1, "{stats:?}");
    // Three visibility timeouts later it is still hidden...
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(p.esm.poll_once(&p.invoker, &mut stats).await.unwrap(), 0);
    // ...and still in the queue: nothing lost.
    assert_eq!(p.source_depth().await, 1);
    assert_eq!(p.downstream.delivered(), ["ok"]);
}

/// An outage longer than `maxReceiveCount` × the visibility timeout (here 8 s against
/// 5 × 1 s; the spacing is at least 0.5 + 1.5 + 4 + 4 s) dead-letters nothing that succeeds after recovery: spaced redelivery keeps the
/// records in the queue, and the shared circuit breaker stops calling the downstream
/// while it is down (a probe at a time), instead of every record hitting it on every
/// receive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_with_the_breaker_dead_letters_nothing_that_succeeds_after_recovery() {
    let clients = e2e::clients().await;
    let breaker_table = e2e::idempotency_table(&clients.dynamodb, "breaker").await;
    let p = Pipeline::new(
        "outage",
        Setup {
            max_receive_count: 5,
            worker_env: vec![
                ("WORKER_REDELIVERY_BASE_SECS", "1".to_string()),
                ("WORKER_REDELIVERY_MULTIPLIER", "3".to_string()),
                ("WORKER_REDELIVERY_MAX_SECS", "8".to_string()),
                ("WORKER_BREAKER_TABLE", breaker_table.clone()),
                ("WORKER_BREAKER_THRESHOLD", "3".to_string()),
                ("WORKER_BREAKER_OPEN_SECS", "2".to_string()),
            ],
            ..Setup::default()
        },
    )
    .await;
    let ids: Vec<String> = (0..10).map(|n| format!("o-{n}")).collect();
    let bodies: Vec<String> = ids.iter().map(|id| body(id, "throttled")).collect();
    p.send(&bodies.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    // The downstream is down (429 to everything) for 8 s.
    let mut stats = sqs_keeper_local::esm::EsmStats::default();
    let outage_end = tokio::time::Instant::now() + std::time::Duration::from_secs(8);
    while tokio::time::Instant::now() < outage_end {
        p.esm.poll_once(&p.invoker, &mut stats).await.unwrap();
    }
    let calls_during_outage: u64 = p.downstream.answers().values().sum();
    p.downstream.fix();
    let after = p.drain().await;
    assert_eq!(p.source_depth().await, 0);
    let records = p.records().await;
    assert!(
        records.is_empty(),
        "nothing dead-lettered: {:?}",
        records
            .iter()
            .map(|r| (&r.item_id, &r.last_error, r.failure_count))
            .collect::<Vec<_>>()
    );
    assert_eq!(p.dlq_depth().await, 0);
    let mut delivered = p.downstream.delivered();
    delivered.sort();
    delivered.dedup();
    assert_eq!(delivered, ids, "every record delivered after recovery");
    // Without the breaker every receive during the outage is a call (here 20 or more);
    // with it, the first wave of 10 (all in flight before 3 failures open it), then one
    // probe per open period.
    assert!(stats.received >= 20, "{stats:?}");
    assert!(
        calls_during_outage <= 10 + 3,
        "{calls_during_outage} calls during the outage; {stats:?} then {after:?}"
    );
}

/// A hide never outlasts the message: the worker reads the source queue's retention and
/// visibility timeout (`GetQueueAttributes`, through the SDK against the emulator), and a
/// message whose next delivery could not run before SQS deletes it is dead-lettered with
/// its failure (reason `retention_ending`) instead of being hidden to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_would_outlast_the_messages_retention_is_dead_lettered() {
    let p = Pipeline::new(
        "retention",
        Setup {
            max_receive_count: 10,
            worker_env: vec![("WORKER_REDELIVERY_BASE_SECS", "300".to_string())],
            ..Setup::default()
        },
    )
    .await;
    // Retention 60 s, visibility timeout 60 s: no delivery after this one can finish in time.
    p.clients
        .sqs
        .set_queue_attributes()
        .queue_url(&p.resources.source_url)
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::MessageRetentionPeriod,
            "60",
        )
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
            "60",
        )
        .send()
        .await
        .unwrap();
    p.send(&[&body("t", "throttled")]).await;
    let stats = p.drain().await;
    assert_eq!(stats.reported, 0, "{stats:?}");
    let records = p.records().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].item_id, "t");
    assert_eq!(records[0].reason, DeadLetterReason::RetentionEnding);
    assert_eq!(records[0].error_class, ErrorClass::Throttled);
    assert_eq!(p.dlq_depth().await, 1);
    assert_eq!(p.source_depth().await, 0);
}

/// A long outage costs each waiting message a few receives, whatever its length: the
/// packaged redrive function, run as the breaker's polling schedule, disables the packaged
/// worker's event source mapping (through the Lambda API) once the breaker opens a second
/// time, probes with one source message when the open period ends, and restores polling
/// once the probe closes the breaker. Without it (`make demo-outage -- --no-polling-control`)
/// a 30 s outage spends all five receives of every message and dead-letters them as
/// `CircuitOpen`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_outage_pauses_polling_and_costs_each_message_a_bounded_number_of_receives() {
    let state_dir = std::env::temp_dir().join(e2e::unique_prefix("outage-state"));
    std::fs::create_dir_all(&state_dir).unwrap();
    let options = sqs_keeper_local::demo::DemoOptions {
        endpoints: e2e::emulator().await,
        region: e2e::REGION.to_string(),
        prefix: e2e::unique_prefix("pause"),
        worker_binary: e2e::function_binary("worker"),
        state_dir,
        items: 20,
    };
    let summary = sqs_keeper_local::outage::run_outage_with(
        &options,
        &e2e::function_binary("redrive"),
        std::time::Duration::from_secs(30),
        true,
    )
    .await
    .unwrap();
    println!("{}", summary.render());
    assert!(summary.adds_up(), "{summary:?}");
    assert_eq!(summary.dead_lettered, 0, "{summary:?}");
    assert!(summary.polling_paused >= 1, "{summary:?}");
    assert_eq!(
        summary.polling_resumed, summary.polling_paused,
        "{summary:?}"
    );
    // What does not depend on the machine's speed: no message spent its receives, and the
    // outage cost about two receives a message (without the control it costs all five).
    // Which message the schedule's timing hands one more receive varies with the machine.
    assert!(summary.max_receives <= 5, "{summary:?}");
    assert!(
        summary.receives_during_outage <= 3 * summary.sent,
        "{summary:?}"
    );
}

/// A candidate for `item` on its last receive after two attempts that timed out.
fn timed_out_twice(
    item: sqs_keeper_core::WorkItem,
) -> sqs_keeper_core::dead_letter::DeadLetterCandidate {
    use sqs_keeper_core::dead_letter::DeadLetterCandidate;
    use sqs_keeper_core::retry::AttemptFailure;
    let error = sqs_keeper_lambda::ProcessError::new(ErrorClass::Timeout, "timeout after 3s");
    DeadLetterCandidate {
        item,
        failures: (1..=2)
            .map(|attempt| AttemptFailure {
                attempt,
                started_at: chrono_now(),
                duration: std::time::Duration::from_millis(5),
                error: error.clone(),
            })
            .collect(),
        error,
        reason: DeadLetterReason::ReceiveBudgetExhausted,
    }
}

/// DynamoDB's `UpdateItem` creates an item it does not find: the follow-ups to a record
/// write (the review flag set, a claim given up) are conditional on the record existing, so
/// a record a purge deleted in between does not come back as an item of one attribute,
/// without a status (a "no record" to the sweep whose adoption would be refused for ever).
/// The in-memory world writes nothing there either
/// (`testing::memory_store::tests::follow_ups_to_a_record_a_purge_deleted_leave_no_item`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_to_a_record_a_purge_deleted_leave_no_item() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use sqs_keeper_core::ports::RecordStore;

    let p = Pipeline::new("follow-ups", Setup::default()).await;
    let store = p.store();
    RecordStore::set_review_flag(&store, "gone", true)
        .await
        .unwrap();
    RecordStore::release_claim(
        &store,
        "gone",
        &sqs_keeper_core::dead_letter::DlqClaim::new("m-1", 1),
    )
    .await
    .unwrap();
    let item = p
        .clients
        .dynamodb
        .get_item()
        .table_name(&p.resources.table)
        .key("item_id", AttributeValue::S("gone".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert_eq!(item.item(), None, "an item without a status was created");
}

/// The store's conditions are defined once (`sqs_keeper_core::condition::conditions`): the
/// adapter sends each as a condition expression and the in-memory stores (the
/// simulation's) evaluate the same value. Here both readings of every condition meet
/// every kind of stored record, and an absent one, on DynamoDB Local: a condition that
/// DynamoDB reads otherwise than the evaluator fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_conditions_mean_on_dynamodb_what_they_mean_in_memory() {
    use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, TransactWriteItem};
    use sqs_keeper_aws::schema;
    use sqs_keeper_aws::WithCondition;
    use sqs_keeper_core::item::ItemParser;
    use sqs_keeper_core::ports::Expect;
    use sqs_keeper_core::{condition::conditions, condition::Condition, condition::StoredRecord};
    use sqs_keeper_core::{
        dead_letter::DeadLetteredItem, dead_letter::InvocationInfo, dead_letter::ItemStatus,
    };

    let p = Pipeline::new("conditions", Setup::default()).await;
    let dynamodb = &p.clients.dynamodb;
    let table = &p.resources.table;
    let now = chrono_now().timestamp();

    /// A stored record and what the store keeps beside it.
    struct Fixture {
        record: DeadLetteredItem,
        lease_owner: Option<&'static str>,
        attempt_ids: Vec<&'static str>,
        claims: Vec<&'static str>,
        sent: Vec<&'static str>,
    }
    let base = |id: &str| {
        let msg = serde_json::from_value(json!({
            "messageId": format!("m-{id}"),
            "body": body(id, "invalid"),
            "attributes": {"ApproximateReceiveCount": "5"},
            "eventSourceARN": p.resources.source_arn,
        }))
        .unwrap();
        let item = ItemParser {
            id_source: "pointer:/id".parse().unwrap(),
            ..ItemParser::default()
        }
        .parse(format!("m-{id}"), msg)
        .unwrap();
        DeadLetteredItem::from_candidate(
            &timed_out_twice(item),
            &InvocationInfo::default(),
            chrono_now(),
            std::time::Duration::from_secs(86_400),
        )
    };
    let with = |id: &str, change: &dyn Fn(&mut DeadLetteredItem)| {
        let mut r = base(id);
        change(&mut r);
        r
    };
    let fixtures = [
        Fixture {
            record: with("dead", &|_| {}),
            lease_owner: None,
            attempt_ids: vec!["a1", "a2"],
            claims: vec!["m-1:5"],
            sent: vec!["m-1"],
        },
        Fixture {
            record: with("expired", &|r| {
                r.status = ItemStatus::Redriving;
                r.lease_expires_at = Some(now - 10);
            }),
            lease_owner: Some("run-1"),
            attempt_ids: vec!["a1"],
            claims: vec![],
            sent: vec![],
        },
        Fixture {
            record: with("leased", &|r| {
                r.status = ItemStatus::Redriving;
                r.lease_expires_at = Some(now + 100);
            }),
            lease_owner: Some("run-1"),
            attempt_ids: vec![],
            claims: vec![],
            sent: vec![],
        },
        Fixture {
            record: with("requeued", &|r| {
                r.status = ItemStatus::Requeued;
                r.requeued_message_id = Some("q-1".into());
                r.processed = vec!["msg:x".into()];
            }),
            lease_owner: None,
            attempt_ids: vec!["a1"],
            claims: vec!["m-1:5", "m-2"],
            sent: vec![],
        },
        Fixture {
            record: with("resolved", &|r| r.status = ItemStatus::Resolved),
            lease_owner: None,
            attempt_ids: vec!["a1"],
            claims: vec![],
            sent: vec![],
        },
    ];
    for f in &fixtures {
        let mut item = schema::record_to_item(&f.record).unwrap();
        if let Some(owner) = f.lease_owner {
            item.insert(schema::LEASE_OWNER.into(), AttributeValue::S(owner.into()));
        }
        let set = |v: &[&str]| AttributeValue::Ss(v.iter().map(|s| s.to_string()).collect());
        if !f.attempt_ids.is_empty() {
            item.insert(schema::ATTEMPT_IDS.into(), set(&f.attempt_ids));
        }
        if !f.claims.is_empty() {
            item.insert(schema::DLQ_CLAIMS.into(), set(&f.claims));
        }
        if !f.sent.is_empty() {
            item.insert(schema::DLQ_SENT.into(), set(&f.sent));
        }
        dynamodb
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
    }

    let record = &fixtures[0].record;
    let sha = record.payload.sha256.clone();
    let leased_sha = fixtures[2].record.payload.sha256.clone();
    let last = sqs_keeper_core::time_format::format(&record.last_attempt);
    let status = |s, keys: &[&str]| Expect::Status {
        status: s,
        not_processed: keys.iter().map(|k| k.to_string()).collect(),
    };
    let cases: Vec<(&str, Condition)> = vec![
        ("lease_is_free", conditions::lease_is_free(now)),
        ("leased_by", conditions::leased_by("run-1")),
        ("leased_by", conditions::leased_by("run-2")),
        (
            "leased_with_payload",
            conditions::leased_with_payload("run-1", &leased_sha),
        ),
        (
            "leased_with_payload",
            conditions::leased_with_payload("run-1", "other"),
        ),
        ("requeued_as", conditions::requeued_as("q-1")),
        ("requeued_as", conditions::requeued_as("q-2")),
        (
            "finishes_requeued",
            conditions::finishes_requeued("q-1", "run-9", "x"),
        ),
        (
            "finishes_requeued",
            conditions::finishes_requeued("q-9", "run-1", &leased_sha),
        ),
        (
            "finishes_requeued",
            conditions::finishes_requeued("q-9", "run-2", &leased_sha),
        ),
        (
            "finishes_moved_back",
            conditions::finishes_moved_back("other"),
        ),
        ("finishes_moved_back", conditions::finishes_moved_back(&sha)),
        (
            "finishes_moved_back",
            conditions::finishes_moved_back(&leased_sha),
        ),
        (
            "records_attempts",
            conditions::records_attempts(&["a1"], None, &Expect::Any),
        ),
        (
            "records_attempts",
            conditions::records_attempts(
                &["a3", "a4"],
                Some(&DlqClaim::new("m-1", 5)),
                &Expect::Any,
            ),
        ),
        (
            "records_attempts",
            conditions::records_attempts(&["a3"], Some(&DlqClaim::new("m-2", 1)), &Expect::Any),
        ),
        (
            "records_attempts",
            conditions::records_attempts(&["a3"], Some(&DlqClaim::new("m-1", 6)), &Expect::Any),
        ),
        (
            "records_attempts",
            conditions::records_attempts(&[], Some(&DlqClaim::new("m-9", 1)), &Expect::Absent),
        ),
        (
            "records_attempts",
            conditions::records_attempts(&["a3"], None, &status(ItemStatus::Requeued, &["msg:x"])),
        ),
        (
            "records_attempts",
            conditions::records_attempts(
                &["a3"],
                None,
                &status(ItemStatus::Requeued, &["msg:y", "pay:z"]),
            ),
        ),
        (
            "records_attempts",
            conditions::records_attempts(
                &[],
                Some(&DlqClaim::new("m-3", 1)),
                &status(ItemStatus::Dead, &[]),
            ),
        ),
        ("counts", conditions::counts(record.failure_count)),
        ("counts", conditions::counts(record.failure_count + 1)),
        ("compacts", conditions::compacts(record)),
        (
            "compacts",
            conditions::compacts(&sqs_keeper_core::dead_letter::DeadLetteredItem {
                history_omitted: record.history_omitted + 3,
                ..record.clone()
            }),
        ),
        (
            "unchanged_since",
            conditions::unchanged_since(ItemStatus::Dead, &last),
        ),
        (
            "unchanged_since",
            conditions::unchanged_since(ItemStatus::Dead, "1970-01-01T00:00:00.000Z"),
        ),
        ("exists", conditions::exists()),
    ];

    let mut outcomes: HashMap<&str, (usize, usize)> = HashMap::new();
    let keys: Vec<Option<&Fixture>> = fixtures.iter().map(Some).chain([None]).collect();
    for (name, condition) in &cases {
        for fixture in &keys {
            let item_id = fixture.map_or("absent", |f| f.record.item_id.as_str());
            let in_memory = match fixture {
                None => condition.holds(None),
                Some(f) => {
                    let ids = |id: &str| f.attempt_ids.contains(&id);
                    let claims = |id: &str| f.claims.contains(&id);
                    let sent = |id: &str| f.sent.contains(&id);
                    condition.holds(Some(&StoredRecord {
                        record: &f.record,
                        lease_owner: f.lease_owner,
                        attempt_ids: (!f.attempt_ids.is_empty())
                            .then_some(&ids as &dyn Fn(&str) -> bool),
                        claims: (!f.claims.is_empty()).then_some(&claims as &dyn Fn(&str) -> bool),
                        sent: (!f.sent.is_empty()).then_some(&sent as &dyn Fn(&str) -> bool),
                    }))
                }
            };
            let check = ConditionCheck::builder()
                .table_name(table)
                .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
                .with_condition(condition)
                .build()
                .unwrap();
            let on_dynamodb = match dynamodb
                .transact_write_items()
                .transact_items(TransactWriteItem::builder().condition_check(check).build())
                .send()
                .await
            {
                Ok(_) => true,
                Err(e) => {
                    let e = e.into_service_error();
                    assert!(
                        e.is_transaction_canceled_exception(),
                        "{name} on {item_id}: {e:?}"
                    );
                    false
                }
            };
            assert_eq!(
                in_memory,
                on_dynamodb,
                "{name} on {item_id}: in memory {in_memory}, on DynamoDB {on_dynamodb}: {:?}",
                condition.render()
            );
            let seen = outcomes.entry(name).or_default();
            if on_dynamodb {
                seen.0 += 1;
            } else {
                seen.1 += 1;
            }
        }
    }
    // Each condition both held and failed somewhere: none passes by always agreeing on one
    // answer.
    for (name, (held, failed)) in &outcomes {
        assert!(
            *held > 0 && *failed > 0,
            "{name}: held {held}, failed {failed}"
        );
    }
}

/// More records for the store's conditions on DynamoDB Local: no `processed` attribute, no
/// sets at all, a redriving item without an expiry, a lease expiring at `now`, and odd
/// unicode (NUL included) and 2 KB strings in every value a condition compares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_conditions_agree_on_bare_records_and_odd_strings() {
    use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, TransactWriteItem};
    use sqs_keeper_aws::schema;
    use sqs_keeper_aws::WithCondition;
    use sqs_keeper_core::item::ItemParser;
    use sqs_keeper_core::ports::Expect;
    use sqs_keeper_core::{condition::conditions, condition::Condition, condition::StoredRecord};
    use sqs_keeper_core::{
        dead_letter::DeadLetteredItem, dead_letter::InvocationInfo, dead_letter::ItemStatus,
    };

    let p = Pipeline::new("condrev", Setup::default()).await;
    let dynamodb = &p.clients.dynamodb;
    let table = &p.resources.table;
    let now = chrono::Utc::now().timestamp();
    let odd = "\u{202e}ä\u{0}🦀\u{feff}\u{10ffff}q".to_string();
    let big = "é".repeat(1024); // 2 KB
    let base = |id: &str| {
        let msg = serde_json::from_value(json!({
            "messageId": format!("m-{id}"),
            "body": body(id, "invalid"),
            "attributes": {"ApproximateReceiveCount": "5"},
            "eventSourceARN": p.resources.source_arn,
        }))
        .unwrap();
        let item = ItemParser {
            id_source: "pointer:/id".parse().unwrap(),
            ..ItemParser::default()
        }
        .parse(format!("m-{id}"), msg)
        .unwrap();
        DeadLetteredItem::from_candidate(
            &timed_out_twice(item),
            &InvocationInfo::default(),
            chrono::Utc::now(),
            std::time::Duration::from_secs(86_400),
        )
    };
    struct Fixture {
        record: DeadLetteredItem,
        lease_owner: Option<String>,
        attempt_ids: Vec<String>,
        claims: Vec<String>,
        sent: Vec<String>,
    }
    let mut bare = base("bare");
    bare.processed = Vec::new();
    let mut no_expiry = base("noexpiry");
    no_expiry.status = ItemStatus::Redriving;
    no_expiry.lease_expires_at = None;
    let mut at_expiry = base("atexpiry");
    at_expiry.status = ItemStatus::Redriving;
    at_expiry.lease_expires_at = Some(now);
    let mut weird = base("weird");
    weird.status = ItemStatus::Requeued;
    weird.requeued_message_id = Some(odd.clone());
    weird.source.message_id = odd.clone();
    weird.payload.sha256 = big.clone();
    weird.processed = vec![odd.clone(), big.clone()];
    let mut leased_weird = base("leasedweird");
    leased_weird.status = ItemStatus::Redriving;
    leased_weird.lease_expires_at = Some(now + 100);
    leased_weird.payload.sha256 = big.clone();
    let fixtures = vec![
        Fixture {
            record: bare,
            lease_owner: None,
            attempt_ids: vec![],
            claims: vec![],
            sent: vec![],
        },
        Fixture {
            record: no_expiry,
            lease_owner: Some("run-1".into()),
            attempt_ids: vec![],
            claims: vec![],
            sent: vec![],
        },
        Fixture {
            record: at_expiry,
            lease_owner: Some("run-1".into()),
            attempt_ids: vec![],
            claims: vec![],
            sent: vec![],
        },
        Fixture {
            record: weird,
            lease_owner: None,
            attempt_ids: vec![odd.clone(), big.clone()],
            claims: vec![format!("{odd}:1")],
            sent: vec![big.clone()],
        },
        Fixture {
            record: leased_weird,
            lease_owner: Some(odd.clone()),
            attempt_ids: vec!["a1".into()],
            claims: vec![format!("{big}:1")],
            sent: vec![odd.clone()],
        },
    ];
    for f in &fixtures {
        let mut item = schema::record_to_item(&f.record).unwrap();
        if let Some(owner) = &f.lease_owner {
            item.insert(schema::LEASE_OWNER.into(), AttributeValue::S(owner.clone()));
        }
        if !f.attempt_ids.is_empty() {
            item.insert(
                schema::ATTEMPT_IDS.into(),
                AttributeValue::Ss(f.attempt_ids.clone()),
            );
        }
        if !f.claims.is_empty() {
            item.insert(
                schema::DLQ_CLAIMS.into(),
                AttributeValue::Ss(f.claims.clone()),
            );
        }
        if !f.sent.is_empty() {
            item.insert(schema::DLQ_SENT.into(), AttributeValue::Ss(f.sent.clone()));
        }
        dynamodb
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
    }
    let st = |s, keys: &[&str]| Expect::Status {
        status: s,
        not_processed: keys.iter().map(|k| k.to_string()).collect(),
    };
    let bare_last = sqs_keeper_core::time_format::format(&fixtures[0].record.last_attempt);
    let cases: Vec<(String, Condition)> = vec![
        ("lease_is_free".into(), conditions::lease_is_free(now)),
        ("lease_is_free+1".into(), conditions::lease_is_free(now + 1)),
        ("leased_by odd".into(), conditions::leased_by(&odd)),
        (
            "leased_with_payload odd big".into(),
            conditions::leased_with_payload(&odd, &big),
        ),
        ("requeued_as odd".into(), conditions::requeued_as(&odd)),
        (
            "finishes_requeued odd".into(),
            conditions::finishes_requeued(&odd, "r", "x"),
        ),
        (
            "finishes_requeued big".into(),
            conditions::finishes_requeued("q", &odd, &big),
        ),
        (
            "finishes_moved_back odd".into(),
            conditions::finishes_moved_back(&odd),
        ),
        (
            "finishes_moved_back big".into(),
            conditions::finishes_moved_back(&big),
        ),
        (
            "records_attempts odd".into(),
            conditions::records_attempts(
                &[&odd, "a9"],
                Some(&DlqClaim::new(&odd, 1)),
                &Expect::Any,
            ),
        ),
        (
            "records_attempts big".into(),
            conditions::records_attempts(&[&big], Some(&DlqClaim::new(&big, 2)), &Expect::Any),
        ),
        (
            "records_attempts new".into(),
            conditions::records_attempts(&["a9"], Some(&DlqClaim::new("m-9", 1)), &Expect::Any),
        ),
        (
            "records_attempts status".into(),
            conditions::records_attempts(&["a9"], None, &st(ItemStatus::Requeued, &[&odd])),
        ),
        (
            "records_attempts status2".into(),
            conditions::records_attempts(&["a9"], None, &st(ItemStatus::Dead, &["msg:zz"])),
        ),
        (
            "records_attempts status3".into(),
            conditions::records_attempts(
                &[],
                Some(&DlqClaim::new("c", 1)),
                &st(ItemStatus::Requeued, &[&big, "x"]),
            ),
        ),
        (
            "records_attempts absent".into(),
            conditions::records_attempts(&[], Some(&DlqClaim::new("c", 1)), &Expect::Absent),
        ),
        (
            "unchanged_since".into(),
            conditions::unchanged_since(ItemStatus::Dead, &bare_last),
        ),
        ("counts".into(), conditions::counts(2)),
        ("exists".into(), conditions::exists()),
    ];
    let mut disagreements = Vec::new();
    let keys: Vec<Option<&Fixture>> = fixtures.iter().map(Some).chain([None]).collect();
    for (name, condition) in &cases {
        for fixture in &keys {
            let item_id = fixture.map_or("absent", |f| f.record.item_id.as_str());
            let in_memory = match fixture {
                None => condition.holds(None),
                Some(f) => {
                    let ids = |id: &str| f.attempt_ids.iter().any(|a| a == id);
                    let claims = |id: &str| f.claims.iter().any(|a| a == id);
                    let sent = |id: &str| f.sent.iter().any(|a| a == id);
                    condition.holds(Some(&StoredRecord {
                        record: &f.record,
                        lease_owner: f.lease_owner.as_deref(),
                        attempt_ids: (!f.attempt_ids.is_empty())
                            .then_some(&ids as &dyn Fn(&str) -> bool),
                        claims: (!f.claims.is_empty()).then_some(&claims as &dyn Fn(&str) -> bool),
                        sent: (!f.sent.is_empty()).then_some(&sent as &dyn Fn(&str) -> bool),
                    }))
                }
            };
            let check = ConditionCheck::builder()
                .table_name(table)
                .key(schema::ITEM_ID, AttributeValue::S(item_id.to_string()))
                .with_condition(condition)
                .build()
                .unwrap();
            let on_dynamodb = match dynamodb
                .transact_write_items()
                .transact_items(TransactWriteItem::builder().condition_check(check).build())
                .send()
                .await
            {
                Ok(_) => Ok(true),
                Err(e) => {
                    let e = e.into_service_error();
                    if e.is_transaction_canceled_exception() {
                        Ok(false)
                    } else {
                        Err(format!("{e:?}"))
                    }
                }
            };
            if on_dynamodb != Ok(in_memory) {
                disagreements.push(format!(
                    "{name} on {item_id}: in memory {in_memory}, on DynamoDB {on_dynamodb:?}"
                ));
            }
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

/// A fair queue's tenant (a standard queue's `MessageGroupId`) stays with its dead letter:
/// on the record, on the standard DLQ's message, and as a filter of the listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_queue_tenant_is_kept_on_the_record_and_the_dlq_message() {
    use aws_sdk_sqs::types::MessageSystemAttributeName;
    use sqs_keeper_core::selection::RecordFilter;

    let p = Pipeline::new("fair", Setup::default()).await;
    for (id, tenant) in [("f1", Some("tenant-a")), ("f2", None)] {
        p.clients
            .sqs
            .send_message()
            .queue_url(&p.resources.source_url)
            .message_body(body(id, "invalid"))
            .set_message_group_id(tenant.map(str::to_string))
            .send()
            .await
            .unwrap();
    }
    p.drain().await;
    let records = p.records().await;
    assert_eq!(records.len(), 2);
    let f1 = records.iter().find(|r| r.item_id == "f1").unwrap();
    assert_eq!(f1.source.message_group_id.as_deref(), Some("tenant-a"));
    let dlq = p
        .clients
        .sqs
        .receive_message()
        .queue_url(&p.resources.dlq_url)
        .max_number_of_messages(10)
        .visibility_timeout(0)
        .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap();
    let groups: Vec<(String, Option<String>)> = dlq
        .messages()
        .iter()
        .map(|m| {
            (
                m.message_attributes().unwrap()["item_id"]
                    .string_value()
                    .unwrap()
                    .to_string(),
                m.attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                    .cloned(),
            )
        })
        .collect();
    assert!(
        groups.contains(&("f1".to_string(), Some("tenant-a".to_string()))),
        "{groups:?}"
    );
    assert!(groups.contains(&("f2".to_string(), None)), "{groups:?}");
    // The listing's filter, through the status index (records read whole) and a scan.
    for status in [Some(sqs_keeper_core::dead_letter::ItemStatus::Dead), None] {
        let listed = p
            .store()
            .query_all(
                &RecordFilter {
                    status,
                    message_group: Some("tenant-a".into()),
                    ..RecordFilter::default()
                },
                None,
                |_| {},
            )
            .await
            .unwrap();
        let ids: Vec<&str> = listed.iter().map(|r| r.item_id.as_str()).collect();
        assert_eq!(ids, ["f1"], "status {status:?}");
    }
}

/// The DLQ's own `MaximumMessageSize` (read once) decides which bodies go to it inline: with
/// a DLQ of 4 KiB, a 5 KB body (inline by `DLQ_INLINE_MAX_BYTES`) is dead-lettered with its
/// payload in S3 and a pointer in its DLQ message, instead of a send the DLQ refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dlq_message_size_decides_what_goes_to_it_inline() {
    let p = Pipeline::new("smalldlq", Setup::default()).await;
    p.clients
        .sqs
        .set_queue_attributes()
        .queue_url(&p.resources.dlq_url)
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::MaximumMessageSize,
            "4096",
        )
        .send()
        .await
        .unwrap();
    let big =
        json!({"id": "five-kb", "scenario": "invalid", "blob": "z".repeat(5_000)}).to_string();
    p.send(&[&big]).await;
    p.drain().await;
    let records = p.records().await;
    assert_eq!(records.len(), 1);
    assert!(
        matches!(records[0].payload.location, PayloadLocation::S3 { .. }),
        "{:?}",
        records[0].payload.location
    );
    let dlq = p.dlq_messages().await;
    assert_eq!(dlq.len(), 1, "one DLQ message, which the DLQ took");
    assert!(S3Pointer::parse(dlq[0].body().unwrap()).is_some());
}
