//! [`MemoryStore`]: the store ports over the in-memory [`World`], at the level of single
//! AWS calls, as the DynamoDB, S3 and SQS adapter implements them: each method is one call
//! (or the few an adapter's method makes), applied atomically with the conditions the
//! DynamoDB adapter sends (a lease only when free, status changes only by the lease owner,
//! an append refused when an attempt is already recorded or the DLQ message already
//! claimed, compaction only when no append came between). What decides (dead-letter
//! recording, the sweep and its rule, the redrive engine, purging) is the library's own
//! code above it, unchanged: there is no second implementation of it here.
//!
//! Each call first takes the world's latency, if any, then may fail by a fault knob, and
//! tells the world's observer of every change (the world's `Event`s).
//!
//! One file per port, as the AWS adapter has them (`shared/aws/src/store/`):
//! `record_store` (the table), `dead_letter_queue` (the DLQ), `payload_store` (the bucket),
//! `source_queue`; here the store itself, the helpers they share and the worker's
//! [`DeadLetterSink`].

use crate::clock::Clock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::queue::{Queue, QueueMessage};
use super::world::{satisfied, Event, Row, World, WorldState, ITEM_SIZE_LIMIT};
use crate::condition::conditions;
use crate::dead_letter::{
    processed_after, DeadLetterCandidate, DeadLetterReason, DeadLetterSink, DeadLetteredItem,
    FailureDetail, InvocationInfo, ItemStatus, MessageAttribute, PayloadLocation,
};
use crate::error::{ErrorClass, ProcessError};
use crate::item::{ItemParser, WorkItem};
use crate::message::{ITEM_ID_ATTRIBUTE, PAYLOAD_SHA256_ATTRIBUTE, SOURCE_MESSAGE_ID_ATTRIBUTE};
use crate::pointer::{PayloadPolicy, S3Pointer, EXTENDED_PAYLOAD_SIZE_ATTRIBUTE};
use crate::ports::{
    Adoption, Compaction, DeadLetterQueue, Deliveries, Expect, MessageView, OutgoingMessage,
    PayloadStore, ReceivedMessage, RecordStore, Selected, SendResult, SourceQueue, Standing,
};
use crate::recording::{self, RecordingSettings};
use crate::retry::AttemptFailure;
use crate::selection::{
    page_in_memory, token_after_record, Page, PageToken, RecordFilter, Unreadable,
};
use crate::sweep;

mod dead_letter_queue;
mod payload_store;
mod record_store;
mod source_queue;

/// Returns a dead record of class `class` for item `id`, last tried `hours_ago` hours before now,
/// with body `{"id":"<id>"}` inline.
pub fn dead_record(id: &str, class: ErrorClass, hours_ago: i64) -> DeadLetteredItem {
    let message = serde_json::from_value::<aws_lambda_events::sqs::SqsMessage>(serde_json::json!({
        "messageId": format!("m-{id}"),
        "body": format!("{{\"id\":\"{id}\"}}"),
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
        "attributes": {},
    }))
    .unwrap_or_default();
    let at = Utc::now() - chrono::Duration::hours(hours_ago);
    let error = ProcessError::new(class, format!("{class} failure"));
    let item = match ItemParser::default().parse(format!("m-{id}"), message) {
        Ok(mut item) => {
            item.item_id = id.to_string();
            item
        }
        Err(_) => WorkItem {
            message_id: format!("m-{id}"),
            item_id: id.to_string(),
            body: String::new(),
            receive_count: 1,
            sent_timestamp: None,
            message_group_id: None,
            event_source_arn: None,
            attributes: Default::default(),
            message_attributes: HashMap::new(),
            envelope: None,
        },
    };
    let candidate = DeadLetterCandidate {
        item,
        failures: vec![AttemptFailure {
            attempt: 1,
            started_at: at,
            duration: Duration::ZERO,
            error: error.clone(),
        }],
        error,
        reason: DeadLetterReason::Permanent,
    };
    DeadLetteredItem::from_candidate(
        &candidate,
        &InvocationInfo::default(),
        at,
        Duration::from_secs(14 * 86_400),
    )
}

/// The bucket [`MemoryStore::new`] offloads payloads to.
pub const BUCKET: &str = "payloads";

/// A DLQ message as a test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryMessage {
    /// Its id.
    pub message_id: String,
    /// The item its `item_id` attribute names (else its id).
    pub item_id: String,
    /// Whether it is invisible (a sweep holds it).
    pub held: bool,
}

/// The store ports over a [`World`]: one handle per caller (its name goes to the
/// observer, [`MemoryStore::as_actor`]), all sharing the world. See the module
/// documentation.
///
/// ```
/// use sqs_keeper_core::testing::{dead_record, MemoryStore};
/// use sqs_keeper_core::ErrorClass;
///
/// let store = MemoryStore::new();
/// store.insert_dead_lettered(dead_record("order-7", ErrorClass::Validation, 1));
/// let record = store.record("order-7").unwrap();
/// assert_eq!(record.failure_count, 1);
/// assert_eq!(record.item_id, "order-7");
/// ```
#[derive(Debug)]
pub struct MemoryStore<X = ()> {
    world: Arc<World<X>>,
    settings: Arc<RecordingSettings>,
    policy: Arc<PayloadPolicy>,
    actor: String,
}

impl<X> Clone for MemoryStore<X> {
    fn clone(&self) -> Self {
        MemoryStore {
            world: self.world.clone(),
            settings: self.settings.clone(),
            policy: self.policy.clone(),
            actor: self.actor.clone(),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// Creates an empty world (a standard DLQ, source queues made as they are looked up) and its
    /// store, recording with small limits: payloads over 64 KiB go to [`BUCKET`], histories
    /// keep 50 entries.
    pub fn new() -> Self {
        Self::reading(Clock::system())
    }

    /// Creates a store as [`MemoryStore::new`] does, its world read by `clock`.
    pub fn reading(clock: Clock) -> Self {
        let mut state = WorldState::new(0, Queue::new("orders-dlq", None), ());
        state.opens_queues = true;
        MemoryStore::over(
            Arc::new(World::new(state).with_clock(clock)),
            RecordingSettings {
                bucket: BUCKET.into(),
                inline_max_bytes: 65_536,
                history_limit: crate::dead_letter::HISTORY_LIMIT,
                retention: Duration::from_secs(14 * 86_400),
                write_concurrency: 4,
                clock,
            },
        )
    }
}

impl<X> MemoryStore<X> {
    /// Now, by the world's clock.
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.world.clock.now()
    }

    /// Returns the store of `world`, recording with `settings`; an adoption follows Extended-Client
    /// pointers into the settings' bucket only (see [`MemoryStore::with_payload_policy`]).
    /// The settings' clock is replaced by the world's, so that records are stamped, leases
    /// judged and messages timed by one clock.
    pub fn over(world: Arc<World<X>>, mut settings: RecordingSettings) -> Self {
        settings.clock = world.clock;
        let policy = PayloadPolicy::allowing([settings.bucket.clone()]);
        MemoryStore {
            world,
            settings: Arc::new(settings),
            policy: Arc::new(policy),
            actor: "store".into(),
        }
    }

    /// Lets the sweep follow Extended-Client pointers as the worker does: into the buckets
    /// `policy` allows (the store's own always), as the adapter's store does.
    pub fn with_payload_policy(mut self, mut policy: PayloadPolicy) -> Self {
        policy.allowed_buckets.insert(self.settings.bucket.clone());
        self.policy = Arc::new(policy);
        self
    }

    /// Returns the same store, its calls made as `actor`'s (for the observer).
    pub fn as_actor(&self, actor: &str) -> Self {
        MemoryStore {
            actor: actor.to_string(),
            ..self.clone()
        }
    }

    /// Returns whose calls these are.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Returns the world.
    pub fn world(&self) -> &Arc<World<X>> {
        &self.world
    }

    /// Returns the recording settings.
    pub fn settings(&self) -> &RecordingSettings {
        &self.settings
    }

    /// Stores (or replaces) a record, with its attempts' ids.
    pub fn insert(&self, record: DeadLetteredItem) {
        let id = record.item_id.clone();
        self.world.lock().table.insert(id, Row::of(record));
    }

    /// Stores a record and sends its DLQ message, as the worker leaves a dead item (the
    /// message claimed and marked sent).
    pub fn insert_dead_lettered(&self, record: DeadLetteredItem) {
        let mut row = Row::of(record.clone());
        row.claims
            .insert(crate::dead_letter::DlqClaim::of(&record.source).element());
        row.sent.insert(record.source.message_id.clone());
        let mut state = self.world.lock();
        state.table.insert(record.item_id.clone(), row);
        send_dead_letter(&mut state, &record, self.world.now_ms());
    }

    /// Sends `record`'s DLQ message, as dead-lettering sends it, without a record.
    pub fn send_dead_letter(&self, record: &DeadLetteredItem) -> String {
        let now_ms = self.world.now_ms();
        send_dead_letter(&mut self.world.lock(), record, now_ms)
    }

    /// Sends as [`MemoryStore::send_dead_letter`] does, stamping the message as sent at
    /// `sent_ms` (epoch ms).
    pub fn send_dead_letter_at(&self, record: &DeadLetteredItem, sent_ms: i64) -> String {
        send_dead_letter(&mut self.world.lock(), record, sent_ms)
    }

    /// Sends a message with `body` and string `attributes` to the DLQ (in `group`, on a
    /// FIFO DLQ), as a producer or SQS's redrive policy leaves one; its id.
    pub fn send_dlq_message(
        &self,
        body: &str,
        attributes: &[(&str, &str)],
        group: Option<&str>,
    ) -> String {
        let attributes = attributes
            .iter()
            .map(|(name, value)| (name.to_string(), MessageAttribute::string(*value)))
            .collect();
        let now_ms = self.world.now_ms();
        self.world.lock().dlq.send(
            body.to_string(),
            attributes,
            group.map(str::to_string),
            now_ms,
        )
    }

    /// Returns the record of `item_id`.
    pub fn record(&self, item_id: &str) -> Option<DeadLetteredItem> {
        self.world
            .lock()
            .table
            .get(item_id)
            .map(|r| r.record.clone())
    }

    /// Returns the row of `item_id`: the record with its attempt ids, claims and sends.
    pub fn row(&self, item_id: &str) -> Option<Row> {
        self.world.lock().table.get(item_id).cloned()
    }

    /// Returns who holds the lease on `item_id`.
    pub fn lease_owner(&self, item_id: &str) -> Option<String> {
        self.world
            .lock()
            .table
            .get(item_id)
            .and_then(|r| r.lease_owner.clone())
    }

    /// Returns the DLQ's messages, in the queue's order.
    pub fn dlq_messages(&self) -> Vec<MemoryMessage> {
        let now = tokio::time::Instant::now();
        self.world
            .lock()
            .dlq
            .messages()
            .iter()
            .map(|m| MemoryMessage {
                message_id: m.id.clone(),
                item_id: m.attribute(ITEM_ID_ATTRIBUTE).unwrap_or(&m.id).to_string(),
                held: m.visible_at > now,
            })
            .collect()
    }

    /// Stores a payload object.
    pub fn put_payload(&self, pointer: &S3Pointer, body: &str) {
        self.world.lock().bucket.insert(
            (pointer.bucket.clone(), pointer.key.clone()),
            body.to_string(),
        );
    }

    /// Tells whether a payload object is stored.
    pub fn has_payload(&self, pointer: &S3Pointer) -> bool {
        self.world
            .lock()
            .bucket
            .contains_key(&(pointer.bucket.clone(), pointer.key.clone()))
    }

    /// Messages sent to source queues, with their queue URL, in order.
    pub fn sent(&self) -> Vec<(String, OutgoingMessage)> {
        self.world.lock().sent.clone()
    }

    /// Makes every queue refuse the messages of `item_id` ([`WorldState::refuse_sends_of`]).
    pub fn refuse_sends_of(&self, item_id: &str) {
        self.world.lock().refuse_sends_of(item_id);
    }

    /// Takes back [`MemoryStore::refuse_sends_of`].
    pub fn allow_sends_of(&self, item_id: &str) {
        self.world.lock().allow_sends_of(item_id);
    }

    /// Makes the operation `name` fail from now on ([`WorldState::fail`]).
    pub fn fail(&self, name: &str) {
        self.world.lock().fail(name);
    }

    /// Waits a call's latency, as the world's hook gives it.
    async fn latency(&self, operation: &str) {
        let delay = {
            let mut state = self.world.lock();
            state
                .latency
                .and_then(|latency| latency(&mut state, operation))
        };
        match delay {
            None => {}
            Some(delay) if delay.is_zero() => tokio::task::yield_now().await,
            Some(delay) => tokio::time::sleep(delay).await,
        }
    }

    /// Fails a table call by `operation`'s knob, then by the table's failure rate (throttled or
    /// unavailable, half and half), the error named `step`.
    fn table_call(
        &self,
        state: &mut WorldState<X>,
        operation: &str,
        step: &str,
    ) -> Result<(), ProcessError> {
        state.injected(operation)?;
        if state.chance_of(|f| f.table) {
            let error = if state.rng.bool() {
                throttled(step)
            } else {
                unavailable("DynamoDB", step)
            };
            let what = format!("{step}: {error}");
            state.observe(
                &self.actor,
                &Event::Fault {
                    item: "-",
                    what: &what,
                },
            );
            return Err(error);
        }
        Ok(())
    }

    /// Tells whether a call of `operation` fails at the rate `pick` reads (after its knob, which
    /// fails it with its own error), the observer told `what` against `item`.
    fn call_fails(
        &self,
        state: &mut WorldState<X>,
        pick: fn(&super::world::Faults) -> f64,
        item: &str,
        what: &str,
    ) -> bool {
        let fails = state.chance_of(pick);
        if fails {
            state.observe(&self.actor, &Event::Fault { item, what });
        }
        fails
    }

    /// Writes `row` as the item `item_id`, refused as DynamoDB refuses an
    /// item over 400 KB.
    fn put_row(
        &self,
        state: &mut WorldState<X>,
        item_id: &str,
        row: Row,
    ) -> Result<(), ProcessError> {
        let size = row.size();
        state.observe(
            &self.actor,
            &Event::RowWrite {
                item: item_id,
                size,
            },
        );
        if size > ITEM_SIZE_LIMIT {
            return Err(ProcessError::validation(
                "Item size has exceeded the maximum allowed size",
            ));
        }
        state.table.insert(item_id.to_string(), row);
        Ok(())
    }

    /// Ends a run's lease, changing the record with `change`, on `condition` (that the run holds
    /// it: [`conditions::leased_by`] or a narrower one).
    fn end_lease(
        &self,
        operation: &str,
        step: &str,
        item_id: &str,
        condition: crate::condition::Condition,
        change: impl FnOnce(&mut Row),
    ) -> Result<(), ProcessError> {
        let mut state = self.world.lock();
        self.table_call(&mut state, operation, step)?;
        let Some(mut row) = state.table.get(item_id).cloned() else {
            return Err(lease_lost(item_id, step));
        };
        if !row.satisfies(&condition) {
            return Err(lease_lost(item_id, step));
        }
        if row.corrupt {
            return Err(corrupt(item_id, step));
        }
        row.lease_owner = None;
        row.record.lease_expires_at = None;
        change(&mut row);
        let status = row.record.status;
        self.put_row(&mut state, item_id, row)?;
        state.step(&self.actor, item_id, &format!("{step}: now {status:?}"));
        Ok(())
    }

    /// Returns the ARN the world's DLQ messages are read with: the source queue's (the world's
    /// first), for a message that does not name the queue it came from.
    fn source_arn(state: &WorldState<X>) -> Option<String> {
        state.sources.first().map(|q| q.arn.clone())
    }

    /// Returns what identifies a DLQ message's content, by the library's rule.
    fn view_of(&self, m: &QueueMessage) -> MessageView {
        MessageView::of_dlq_message(
            &m.id,
            &m.body,
            |name| m.attribute(name),
            &self.settings.bucket,
            m.marker.is_some(),
        )
    }
}

fn throttled(step: &str) -> ProcessError {
    ProcessError::new(
        ErrorClass::Throttled,
        format!("{step}: ProvisionedThroughputExceededException (injected)"),
    )
    .with_step(step)
}

fn unavailable(service: &str, step: &str) -> ProcessError {
    ProcessError::new(
        ErrorClass::ServerError,
        format!("{step}: {service} unavailable (injected)"),
    )
    .with_step(step)
}

fn corrupt(item_id: &str, step: &str) -> ProcessError {
    ProcessError::validation(format!(
        "record {item_id:?} does not read: attribute status is missing (damaged outside the pipeline)"
    ))
    .with_step(step)
}

fn lease_lost(item_id: &str, step: &str) -> ProcessError {
    ProcessError::new(
        ErrorClass::Unknown,
        format!("lease on {item_id:?} was lost (conditional check failed)"),
    )
    .with_step(step)
}

/// Returns the DLQ message of a record: its payload (or a pointer to it) with the attributes that
/// join it to its record, as dead-lettering sends it.
fn dlq_message(record: &DeadLetteredItem) -> (String, Vec<(String, MessageAttribute)>) {
    let mut attributes = vec![
        (
            ITEM_ID_ATTRIBUTE.to_string(),
            MessageAttribute::string(&record.item_id),
        ),
        (
            SOURCE_MESSAGE_ID_ATTRIBUTE.to_string(),
            MessageAttribute::string(&record.source.message_id),
        ),
        (
            PAYLOAD_SHA256_ATTRIBUTE.to_string(),
            MessageAttribute::string(&record.payload.sha256),
        ),
    ];
    let body = match &record.payload.location {
        PayloadLocation::Inline { body } => body.clone(),
        PayloadLocation::S3 { bucket, key } => {
            attributes.push((
                EXTENDED_PAYLOAD_SIZE_ATTRIBUTE.to_string(),
                MessageAttribute::string(record.payload.size_bytes.to_string()),
            ));
            S3Pointer {
                bucket: bucket.clone(),
                key: key.clone(),
            }
            .to_body()
        }
    };
    attributes.push((
        crate::message::ERROR_CLASS_ATTRIBUTE.to_string(),
        MessageAttribute::string(record.error_class.as_str()),
    ));
    (body, attributes)
}

/// Sends `record`'s DLQ message: a FIFO DLQ's goes in the source message's group (else the
/// item's) with the record's deduplication id, as the adapter sends it, and SQS drops a
/// repeat within its window. Its id.
fn send_dead_letter<X>(
    state: &mut WorldState<X>,
    record: &DeadLetteredItem,
    now_ms: i64,
) -> String {
    let (body, attributes) = dlq_message(record);
    if !state.dlq.fifo {
        return state.dlq.send(body, attributes, None, now_ms);
    }
    let group =
        crate::message::fifo_group_id(record.source.message_group_id.as_deref(), &record.item_id);
    let deduplication_id = crate::message::dlq_deduplication_id(record);
    state
        .dlq
        .send_deduplicated(body, attributes, Some(group), &deduplication_id, now_ms)
        .0
}

/// Returns the work item a DLQ message holds, read as the worker read it: a rotated copy under its
/// original's message id ([`crate::message::original_message_id`]).
fn to_work_item(m: &QueueMessage, parser: &ItemParser, arn: Option<&str>) -> WorkItem {
    let original =
        crate::message::original_message_id(|name| m.attribute(name), &m.id, m.marker.is_some());
    match parser.parse(original, m.to_sqs_message(arn)) {
        Ok(item) => item,
        Err(invalid) => invalid.item,
    }
}

impl<X: Send + 'static> DeadLetterSink for MemoryStore<X> {
    async fn dead_letter(
        &self,
        candidates: &[DeadLetterCandidate],
        invocation: &InvocationInfo,
    ) -> Vec<Result<(), ProcessError>> {
        recording::dead_letter(self, &self.settings, candidates, invocation).await
    }

    async fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
        requeued_by: &str,
    ) -> Result<(), ProcessError> {
        RecordStore::finish_requeued(self, item_id, message_id, payload_sha256, requeued_by).await
    }

    async fn finish_moved_back(
        &self,
        item_id: &str,
        dead_lettered: &str,
        message_id: &str,
        payload_sha256: &str,
    ) -> Result<(), ProcessError> {
        RecordStore::finish_moved_back(self, item_id, dead_lettered, message_id, payload_sha256)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DynamoDB's `UpdateItem` creates an item it does not find: the adapter's follow-ups
    /// to a record write (the review flag, a claim given up) are conditional on the record
    /// existing, so a record a purge deleted in between does not come back as an item
    /// without a status. The world writes nothing there either
    /// (`pipeline.rs::follow_ups_to_a_record_a_purge_deleted_leave_no_item` holds DynamoDB
    /// to the same).
    #[tokio::test]
    async fn follow_ups_to_a_record_a_purge_deleted_leave_no_item() {
        let store = MemoryStore::new();
        store.insert(dead_record("a", ErrorClass::Validation, 1));
        // The purge lands first.
        store.world().lock().table.remove("a");
        RecordStore::set_review_flag(&store, "a", true)
            .await
            .unwrap();
        RecordStore::release_claim(&store, "a", &crate::dead_letter::DlqClaim::new("m-1", 1))
            .await
            .unwrap();
        assert!(store.row("a").is_none(), "{:?}", store.row("a"));
    }

    /// SQS refuses a DLQ message whose `item_id` attribute or body holds a character
    /// outside its set; the in-memory DLQ does too (the emulators do not).
    #[tokio::test]
    async fn the_dlq_refuses_what_sqs_refuses() {
        let store = MemoryStore::new();
        let bad_id = dead_record("a\u{1}b", ErrorClass::Validation, 1);
        let mut bad_body = dead_record("c", ErrorClass::Validation, 1);
        bad_body.payload.location = PayloadLocation::Inline {
            body: "bell \u{7}".into(),
        };
        let good = dead_record("d", ErrorClass::Validation, 1);
        let results = store.send_to_dlq(&[&bad_id, &bad_body, &good]).await;
        let refused: Vec<bool> = results
            .iter()
            .map(|r| {
                r.as_ref()
                    .is_err_and(|e| e.message.contains("InvalidMessageContents"))
            })
            .collect();
        assert_eq!(refused, [true, true, false]);
        assert_eq!(store.dlq_messages().len(), 1);
    }
}
