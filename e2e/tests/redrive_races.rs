//! Races of the redrive wing on the emulators (moto, DynamoDB Local): each test states a
//! guarantee of docs/ARCHITECTURE.md §3–§4 and fails when the code breaks it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_sqs::types::Message;
use e2e::{body, Pipeline};
use sqs_worker::adapters::store::DeadLetterStore;
use sqs_worker::dead_letter::{DeadLetteredItem, ItemStatus};
use sqs_worker::error::ProcessError;
use sqs_worker::item::ItemParser;
use sqs_worker::ports::SweepOptions;
use sqs_worker::redrive::{no_progress, RedriveMode, RedriveRequest};
use sqs_worker::sweep::{Adoption, DlqMessages, ReceivedMessage, Standing};

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
    sqs_worker::sweep::settle_held(&store, sweep.held, Duration::ZERO, Duration::ZERO)
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

/// A [`DeadLetterStore`] whose records change, the status kept, between the sweep's
/// judgement of a message and its adoption write: another writer appends the message's own
/// delivery to `processed` (it was processed meanwhile).
struct ChangesBeforeAdopt {
    store: DeadLetterStore,
    dynamodb: aws_sdk_dynamodb::Client,
    table: String,
    item: String,
    key: String,
    fired: AtomicBool,
}

impl DlqMessages for ChangesBeforeAdopt {
    type Message = Message;

    async fn receive(
        &self,
        hold: Duration,
        parser: &ItemParser,
    ) -> Result<Vec<ReceivedMessage<Message>>, ProcessError> {
        DlqMessages::receive(&self.store, hold, parser).await
    }

    async fn standings(&self, ids: &[String]) -> Result<HashMap<String, Standing>, ProcessError> {
        DlqMessages::standings(&self.store, ids).await
    }

    async fn adopt(
        &self,
        message: &Message,
        item_id: &str,
        parser: &ItemParser,
        adoption: &Adoption,
    ) -> Result<Option<DeadLetteredItem>, ProcessError> {
        if !self.fired.swap(true, Ordering::SeqCst) {
            self.dynamodb
                .update_item()
                .table_name(&self.table)
                .key("item_id", AttributeValue::S(self.item.clone()))
                .update_expression("SET #p = list_append(#p, :k)")
                .expression_attribute_names("#p", "processed")
                .expression_attribute_values(
                    ":k",
                    AttributeValue::L(vec![AttributeValue::S(self.key.clone())]),
                )
                .send()
                .await
                .unwrap();
        }
        DlqMessages::adopt(&self.store, message, item_id, parser, adoption).await
    }

    async fn delete(&self, receipts: &[String]) -> Result<usize, ProcessError> {
        DlqMessages::delete(&self.store, receipts).await
    }

    async fn hold(&self, receipts: &[String], hold: Duration) -> Result<(), ProcessError> {
        DlqMessages::hold(&self.store, receipts, hold).await
    }
}

/// The record is resolved by another body; the sweep judges the DLQ message `d1` (not
/// listed processed): reopen, expecting `resolved`. Before the write, the record changes
/// (d1's own delivery is listed processed), its status still `resolved`. The reopening does
/// not overwrite it: its condition is the status and that the record still lists none of
/// the message's keys as processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopening_never_overwrites_a_record_that_processed_the_message_since() {
    let p = Pipeline::with_dead_items("rv-g3", &[body("x", "throttled")]).await;
    let dead = record(&p, "x").await;
    let s1 = dead.source.message_id.clone();
    // Resolved by another delivery of x (another body): d1 is not listed.
    p.clients
        .dynamodb
        .update_item()
        .table_name(&p.resources.table)
        .key("item_id", AttributeValue::S("x".into()))
        .update_expression("SET #s = :r, #p = :l")
        .expression_attribute_names("#s", "status")
        .expression_attribute_names("#p", "processed")
        .expression_attribute_values(":r", AttributeValue::S("resolved".into()))
        .expression_attribute_values(
            ":l",
            AttributeValue::L(vec![
                AttributeValue::S("msg:other".into()),
                AttributeValue::S("sha:other".into()),
            ]),
        )
        .send()
        .await
        .unwrap();
    let hooked = ChangesBeforeAdopt {
        store: p.store(),
        dynamodb: p.clients.dynamodb.clone(),
        table: p.resources.table.clone(),
        item: "x".into(),
        key: format!("msg:{s1}"),
        fired: AtomicBool::new(false),
    };
    let sweep = sqs_worker::sweep::sweep_dlq(&hooked, &adopting())
        .await
        .unwrap();
    sqs_worker::sweep::settle_held(&hooked, sweep.held, Duration::ZERO, Duration::ZERO)
        .await
        .unwrap();
    let after = record(&p, "x").await;
    assert!(
        hooked.fired.load(Ordering::SeqCst),
        "the sweep judged d1 for reopening"
    );
    assert_eq!(
        after.status,
        ItemStatus::Resolved,
        "a record that changed after the judgement was overwritten (adopted {}): processed {:?}",
        sweep.adopted,
        after.processed
    );
}
