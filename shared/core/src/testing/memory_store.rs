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
//! tells the world's observer of every change ([`super::world`]).

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
    PayloadStore, ReceivedMessage, RecordStore, SendResult, SourceQueue, Standing,
};
use crate::recording::{self, RecordingSettings};
use crate::retry::AttemptFailure;
use crate::selection::{
    page_in_memory, token_after_record, Page, PageToken, RecordFilter, Unreadable,
};
use crate::sweep;

/// A dead record of class `class` for item `id`, last tried `hours_ago` hours before now,
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
    /// An empty world (a standard DLQ, source queues made as they are looked up) and its
    /// store, recording with small limits: payloads over 64 KiB go to [`BUCKET`], histories
    /// keep 50 entries.
    pub fn new() -> Self {
        Self::reading(Clock::system())
    }

    /// [`MemoryStore::new`], its world read by `clock`.
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
                clock: Clock::system(),
            },
        )
    }
}

impl<X> MemoryStore<X> {
    /// Now, by the world's clock.
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.world.clock.now()
    }

    /// The store of `world`, recording with `settings`; an adoption follows Extended-Client
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

    /// The same store, its calls made as `actor`'s (for the observer).
    pub fn as_actor(&self, actor: &str) -> Self {
        MemoryStore {
            actor: actor.to_string(),
            ..self.clone()
        }
    }

    /// Whose calls these are.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// The world.
    pub fn world(&self) -> &Arc<World<X>> {
        &self.world
    }

    /// The recording settings.
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
        row.claims.insert(record.source.message_id.clone());
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

    /// The record of `item_id`.
    pub fn record(&self, item_id: &str) -> Option<DeadLetteredItem> {
        self.world
            .lock()
            .table
            .get(item_id)
            .map(|r| r.record.clone())
    }

    /// The row of `item_id`: the record with its attempt ids, claims and sends.
    pub fn row(&self, item_id: &str) -> Option<Row> {
        self.world.lock().table.get(item_id).cloned()
    }

    /// Who holds the lease on `item_id`.
    pub fn lease_owner(&self, item_id: &str) -> Option<String> {
        self.world
            .lock()
            .table
            .get(item_id)
            .and_then(|r| r.lease_owner.clone())
    }

    /// The DLQ's messages, in the queue's order.
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

    /// Whether a payload object is stored.
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

    /// Makes the operation `name` fail from now on ([`WorldState::fail`]).
    pub fn fail(&self, name: &str) {
        self.world.lock().fail(name);
    }

    /// A call's latency, as the world's hook gives it.
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

    /// A table call: `operation`'s knob, then the table's failure rate (throttled or
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

    /// Whether a call of `operation` fails at the rate `pick` reads (after its knob, which
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

    /// A write that leaves `row` as the item `item_id`, refused as DynamoDB refuses an
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

    /// Ends `owner`'s lease, changing the record with `change` (condition: `owner` holds
    /// it; with `payload_sha256`, [`crate::dead_letter::LEASED_WITH_PAYLOAD`]).
    fn end_lease(
        &self,
        operation: &str,
        step: &str,
        item_id: &str,
        owner: &str,
        payload_sha256: Option<&str>,
        change: impl FnOnce(&mut Row),
    ) -> Result<(), ProcessError> {
        let mut state = self.world.lock();
        self.table_call(&mut state, operation, step)?;
        let Some(mut row) = state.table.get(item_id).cloned() else {
            return Err(lease_lost(item_id, step));
        };
        let condition = match payload_sha256 {
            Some(sha) => conditions::leased_with_payload(owner, sha),
            None => conditions::leased_by(owner),
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

    /// The ARN the world's DLQ messages are read with: the source queue's (the world's
    /// first), for a message that does not name the queue it came from.
    fn source_arn(state: &WorldState<X>) -> Option<String> {
        state.sources.first().map(|q| q.arn.clone())
    }

    /// What identifies a DLQ message's content, by the library's rule.
    fn view_of(&self, m: &QueueMessage) -> MessageView {
        MessageView::of(
            &m.id,
            &m.body,
            |name| m.attribute(name),
            &self.settings.bucket,
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

/// The DLQ message of a record: its payload (or a pointer to it) with the attributes that
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
/// item's), as the adapter sends it. Its id.
fn send_dead_letter<X>(
    state: &mut WorldState<X>,
    record: &DeadLetteredItem,
    now_ms: i64,
) -> String {
    let (body, attributes) = dlq_message(record);
    let group = state.dlq.fifo.then(|| {
        crate::message::fifo_group_id(record.source.message_group_id.as_deref(), &record.item_id)
    });
    state.dlq.send(body, attributes, group, now_ms)
}

fn to_work_item(m: &QueueMessage, parser: &ItemParser, arn: Option<&str>) -> WorkItem {
    match parser.parse(m.id.clone(), m.to_sqs_message(arn)) {
        Ok(item) => item,
        Err(invalid) => invalid.item,
    }
}

impl<X: Send + 'static> RecordStore for MemoryStore<X> {
    fn clock(&self) -> Clock {
        self.world.clock
    }

    async fn get(&self, item_id: &str) -> Result<Option<DeadLetteredItem>, ProcessError> {
        self.latency("get").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "get", "read-record")?;
        match state.table.get(item_id) {
            Some(row) if row.corrupt => Err(corrupt(item_id, "read-record")),
            Some(row) => Ok(Some(row.record.clone())),
            None => Ok(None),
        }
    }

    async fn query_page(
        &self,
        filter: &RecordFilter,
        limit: i32,
        start: Option<&PageToken>,
    ) -> Result<Page, ProcessError> {
        self.latency("query_page").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "query_page", "query")?;
        let mut unreadable = Vec::new();
        let mut selected: Vec<&DeadLetteredItem> = Vec::new();
        for (id, row) in &state.table {
            if row.corrupt {
                if filter.status.is_none_or(|s| s == ItemStatus::Dead) && start.is_none() {
                    unreadable.push(Unreadable {
                        item_id: id.clone(),
                        error: corrupt(id, "query").to_string(),
                    });
                }
            } else if filter.matches(&row.record) {
                selected.push(&row.record);
            }
        }
        let mut page = page_in_memory(
            selected,
            limit.min(state.page_size),
            start,
            filter.oldest_first,
        )?;
        page.unreadable = unreadable;
        Ok(page)
    }

    fn token_after(&self, record: &DeadLetteredItem, _filter: &RecordFilter) -> PageToken {
        token_after_record(record)
    }

    async fn standings(&self, ids: &[String]) -> Result<HashMap<String, Standing>, ProcessError> {
        self.latency("standings").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "standings", "sweep-lookup")?;
        Ok(ids
            .iter()
            .filter_map(|id| state.table.get(id).map(|row| (id, row)))
            .map(|(id, row)| {
                let standing = if row.corrupt {
                    Standing::default()
                } else {
                    Standing::of(&row.record)
                };
                (id.clone(), standing)
            })
            .collect())
    }

    async fn deliveries(&self, item_id: &str) -> Result<Deliveries, ProcessError> {
        self.latency("deliveries").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "deliveries", "record")?;
        Ok(state
            .table
            .get(item_id)
            .map(|row| Deliveries {
                attempt_ids: row.attempt_ids.iter().cloned().collect(),
                claims: row.claims.iter().cloned().collect(),
                sent: row.sent.iter().cloned().collect(),
            })
            .unwrap_or_default())
    }

    async fn try_record(
        &self,
        record: &DeadLetteredItem,
        pending: &[FailureDetail],
        claim: Option<&str>,
        expect: Expect,
    ) -> Result<Option<DeadLetteredItem>, ProcessError> {
        self.latency("try_record").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "try_record", "record")?;
        let id = record.item_id.as_str();
        let existing = state.table.get(id).cloned();
        if existing.as_ref().is_some_and(|r| r.corrupt) {
            return Err(corrupt(id, "record"));
        }
        let attempt_ids: Vec<&str> = pending.iter().map(|f| f.attempt_id.as_str()).collect();
        if !satisfied(
            existing.as_ref(),
            &conditions::records_attempts(&attempt_ids, claim, &expect),
        ) {
            state.observe(&self.actor, &Event::RecordRefused { item: id, claim });
            return Ok(None);
        }
        let mut row = match existing {
            Some(mut row) => {
                // What the adapter's update sets: every field of the new record but the
                // history, its count, `processed`, and the two set only on creation.
                let old = row.record.clone();
                let mut r = record.clone();
                r.failure_history = old.failure_history;
                r.failure_count = old.failure_count;
                r.history_omitted = old.history_omitted;
                r.processed = old.processed;
                r.first_attempt = old.first_attempt;
                r.manual_review_required = old.manual_review_required;
                // Not in the update: a lease in place stays.
                r.lease_expires_at = old.lease_expires_at;
                r.resolved_at = old.resolved_at;
                r.requeued_message_id = None;
                row.record = r;
                row
            }
            None => {
                let mut r = record.clone();
                r.failure_history = Vec::new();
                r.failure_count = 0;
                r.history_omitted = 0;
                r.processed = Vec::new();
                r.requeued_message_id = None;
                Row::of(r)
            }
        };
        state.observe(
            &self.actor,
            &Event::Appending {
                item: id,
                attempt_ids: &attempt_ids,
            },
        );
        row.record.failure_history.extend(pending.iter().cloned());
        row.record.failure_count += u32::try_from(pending.len()).unwrap_or(u32::MAX);
        row.attempt_ids
            .extend(pending.iter().map(|f| f.attempt_id.clone()));
        if let Some(claim) = claim {
            row.claims.insert(claim.to_string());
        }
        let stored = row.record.clone();
        self.put_row(&mut state, id, row)?;
        state.observe(
            &self.actor,
            &Event::Recorded {
                item: id,
                message_id: &record.source.message_id,
            },
        );
        state.step(
            &self.actor,
            id,
            &format!(
                "recorded {} attempt(s) of message {}{}",
                pending.len(),
                record.source.message_id,
                if claim.is_some() {
                    ", claiming its DLQ message"
                } else {
                    ""
                }
            ),
        );
        Ok(Some(stored))
    }

    async fn mark_sent(&self, sent: &[(&str, &str)]) -> Result<(), ProcessError> {
        self.latency("mark_sent").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "mark_sent", "mark-sent")?;
        for (item_id, message_id) in sent {
            if let Some(row) = state
                .table
                .get_mut(*item_id)
                .filter(|row| row.satisfies(&conditions::exists()))
            {
                row.sent.insert((*message_id).to_string());
            }
            state.step(
                &self.actor,
                item_id,
                &format!("marked the DLQ message of {message_id} sent"),
            );
        }
        Ok(())
    }

    async fn set_review_flag(&self, item_id: &str, wanted: bool) -> Result<(), ProcessError> {
        self.latency("set_review_flag").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "set_review_flag", "record")?;
        if let Some(row) = state.table.get_mut(item_id) {
            row.record.manual_review_required = wanted;
        }
        Ok(())
    }

    async fn compact(
        &self,
        stored: &DeadLetteredItem,
        compaction: &Compaction,
    ) -> Result<(), ProcessError> {
        self.latency("compact").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "compact", "compact-history")?;
        let id = stored.item_id.as_str();
        let Some(mut row) = state.table.get(id).cloned() else {
            return Ok(());
        };
        if !row.satisfies(&conditions::counts(stored.failure_count)) {
            return Ok(());
        }
        row.record.failure_history = compaction.history.clone();
        row.attempt_ids = compaction.attempt_ids.iter().cloned().collect();
        row.claims = compaction.claims.iter().cloned().collect();
        for forgotten in &compaction.forgotten {
            row.sent.remove(forgotten);
        }
        row.record.processed = compaction.processed.clone();
        row.record.history_omitted += compaction.dropped;
        self.put_row(&mut state, id, row)?;
        state.step(
            &self.actor,
            id,
            &format!("compacted: {} attempts dropped", compaction.dropped),
        );
        Ok(())
    }

    async fn release_claim(&self, item_id: &str, message_id: &str) -> Result<(), ProcessError> {
        self.latency("release_claim").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "release_claim", "release-claim")?;
        if let Some(row) = state.table.get_mut(item_id) {
            row.claims.remove(message_id);
        }
        state.step(
            &self.actor,
            item_id,
            &format!("released the claim of {message_id}"),
        );
        Ok(())
    }

    async fn acquire_lease(
        &self,
        item_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, ProcessError> {
        self.latency("acquire_lease").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "acquire_lease", "lease")?;
        let now = self.world.clock.now().timestamp();
        let Some(mut row) = state.table.get(item_id).cloned() else {
            return Ok(false);
        };
        if row.corrupt || !row.satisfies(&conditions::lease_is_free(now)) {
            return Ok(false);
        }
        let taken_back = row.record.status == ItemStatus::Redriving;
        row.record.status = ItemStatus::Redriving;
        row.record.lease_expires_at =
            Some(now + i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2));
        row.lease_owner = Some(owner.to_string());
        self.put_row(&mut state, item_id, row)?;
        state.step(
            &self.actor,
            item_id,
            &format!(
                "leased by {owner}{}",
                if taken_back {
                    " (an expired lease taken back)"
                } else {
                    ""
                }
            ),
        );
        Ok(true)
    }

    async fn release_lease(&self, item_id: &str, owner: &str) -> Result<(), ProcessError> {
        self.latency("release_lease").await;
        self.end_lease(
            "release_lease",
            "release-lease",
            item_id,
            owner,
            None,
            |row| {
                row.record.status = ItemStatus::Dead;
            },
        )
    }

    async fn resolve(&self, record: &DeadLetteredItem, owner: &str) -> Result<(), ProcessError> {
        self.latency("resolve").await;
        let processed = processed_after(record);
        let now = self.now();
        self.end_lease(
            "resolve",
            "resolve",
            &record.item_id,
            owner,
            Some(&record.payload.sha256),
            |row| {
                row.record.status = ItemStatus::Resolved;
                row.record.resolved_at = Some(now);
                row.record.processed = processed;
            },
        )
    }

    async fn mark_requeued(
        &self,
        record: &DeadLetteredItem,
        owner: &str,
        message_id: &str,
    ) -> Result<(), ProcessError> {
        self.latency("mark_requeued").await;
        let sha = Some(record.payload.sha256.as_str());
        let now = self.now();
        self.end_lease(
            "mark_requeued",
            "mark-requeued",
            &record.item_id,
            owner,
            sha,
            |row| {
                row.record.status = ItemStatus::Requeued;
                row.record.requeued_message_id = Some(message_id.to_string());
                row.record.requeued_at = Some(now);
            },
        )
    }

    async fn record_redrive_failure(
        &self,
        item_id: &str,
        owner: &str,
        failures: &[FailureDetail],
    ) -> Result<(), ProcessError> {
        let Some(last) = failures.last().cloned() else {
            return RecordStore::release_lease(self, item_id, owner).await;
        };
        self.latency("record_redrive_failure").await;
        let mut stored = None;
        self.end_lease(
            "record_redrive_failure",
            "record-redrive-failure",
            item_id,
            owner,
            None,
            |row| {
                let r = &mut row.record;
                r.status = ItemStatus::Dead;
                r.last_attempt = last.timestamp;
                r.error_class = last.error_type;
                r.error_signature =
                    crate::signature::error_signature(last.error_type, &last.error_message);
                r.last_error = last.error_message.clone();
                r.reprocess_eligible = last.error_type.is_reprocess_eligible();
                r.failure_history.extend(failures.iter().cloned());
                r.failure_count += u32::try_from(failures.len()).unwrap_or(u32::MAX);
                row.attempt_ids
                    .extend(failures.iter().map(|f| f.attempt_id.clone()));
                stored = Some(row.record.clone());
            },
        )?;
        match stored {
            Some(stored) => recording::after_append(self, &self.settings, stored).await,
            None => Ok(()),
        }
    }

    async fn reopen_requeued(
        &self,
        record: &DeadLetteredItem,
        failure: &FailureDetail,
    ) -> Result<bool, ProcessError> {
        self.latency("reopen_requeued").await;
        let stored = {
            let mut state = self.world.lock();
            self.table_call(&mut state, "reopen_requeued", "reopen-requeued")?;
            let Some(mut row) = state.table.get(&record.item_id).cloned() else {
                return Ok(false);
            };
            // Still requeued with the same message.
            let Some(message_id) = record.requeued_message_id.as_deref() else {
                return Ok(false);
            };
            if row.corrupt || !row.satisfies(&conditions::requeued_as(message_id)) {
                return Ok(false);
            }
            let r = &mut row.record;
            r.status = ItemStatus::Dead;
            r.requeued_message_id = None;
            r.last_attempt = failure.timestamp;
            r.error_class = failure.error_type;
            r.error_signature =
                crate::signature::error_signature(failure.error_type, &failure.error_message);
            r.last_error = failure.error_message.clone();
            r.reprocess_eligible = failure.error_type.is_reprocess_eligible();
            r.failure_history.push(failure.clone());
            r.failure_count += 1;
            row.attempt_ids.insert(failure.attempt_id.clone());
            let stored = row.record.clone();
            self.put_row(&mut state, &record.item_id, row)?;
            state.step(
                &self.actor,
                &record.item_id,
                "reopened: the requeued message outlived its queue",
            );
            stored
        };
        recording::after_append(self, &self.settings, stored).await?;
        Ok(true)
    }

    async fn finish_requeued(
        &self,
        item_id: &str,
        message_id: &str,
        payload_sha256: &str,
        requeued_by: &str,
    ) -> Result<(), ProcessError> {
        self.latency("finish_requeued").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "finish_requeued", "finish-requeued")?;
        let Some(mut row) = state.table.get(item_id).cloned() else {
            return Ok(());
        };
        let finishes = row.satisfies(&conditions::finishes_requeued(
            message_id,
            requeued_by,
            payload_sha256,
        ));
        if row.corrupt || !finishes {
            return Ok(());
        }
        row.lease_owner = None;
        row.record.lease_expires_at = None;
        row.record.status = ItemStatus::Resolved;
        row.record.resolved_at = Some(self.world.clock.now());
        row.record.requeued_message_id = None;
        row.record
            .processed
            .push(crate::dead_letter::processed_key_for_message(message_id));
        row.record
            .processed
            .push(crate::dead_letter::processed_key_for_payload(
                payload_sha256,
            ));
        self.put_row(&mut state, item_id, row)?;
        state.step(
            &self.actor,
            item_id,
            &format!("resolved: the worker finished requeued message {message_id}"),
        );
        Ok(())
    }

    async fn finish_moved_back(
        &self,
        item_id: &str,
        dead_lettered: &str,
        message_id: &str,
        payload_sha256: &str,
    ) -> Result<(), ProcessError> {
        self.latency("finish_moved_back").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "finish_moved_back", "finish-moved-back")?;
        let Some(mut row) = state.table.get(item_id).cloned() else {
            return Ok(());
        };
        if row.corrupt || !row.satisfies(&conditions::finishes_moved_back(payload_sha256)) {
            return Ok(());
        }
        row.record.status = ItemStatus::Resolved;
        row.record.resolved_at = Some(self.world.clock.now());
        row.record.processed.extend([
            crate::dead_letter::processed_key_for_message(dead_lettered),
            crate::dead_letter::processed_key_for_message(message_id),
            crate::dead_letter::processed_key_for_payload(payload_sha256),
        ]);
        self.put_row(&mut state, item_id, row)?;
        state.step(
            &self.actor,
            item_id,
            &format!("resolved: the worker finished {message_id}, moved back from the DLQ"),
        );
        Ok(())
    }

    async fn delete_records(
        &self,
        records: &[DeadLetteredItem],
    ) -> Result<Vec<String>, ProcessError> {
        self.latency("delete_records").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "delete_records", "delete-records")?;
        let mut deleted = Vec::new();
        for selected in records {
            let id = &selected.item_id;
            // Still the status and last attempt selected.
            let condition = conditions::unchanged_since(
                selected.status,
                &crate::time_format::format(&selected.last_attempt),
            );
            let unchanged = state
                .table
                .get(id)
                .is_some_and(|row| !row.corrupt && row.satisfies(&condition));
            if !unchanged {
                continue;
            }
            let Some(row) = state.table.remove(id) else {
                continue;
            };
            deleted.push(id.clone());
            state.observe(
                &self.actor,
                &Event::RecordDeleted {
                    item: id,
                    row: &row,
                },
            );
            state.step(&self.actor, id, "record deleted");
        }
        Ok(deleted)
    }
}

impl<X: Send + 'static> DeadLetterQueue for MemoryStore<X> {
    type Message = QueueMessage;

    async fn send_to_dlq(&self, records: &[&DeadLetteredItem]) -> Vec<Result<(), ProcessError>> {
        self.latency("send_to_dlq").await;
        let mut state = self.world.lock();
        if let Err(error) = state.injected("send_to_dlq") {
            return records.iter().map(|_| Err(error.clone())).collect();
        }
        let mut results = Vec::with_capacity(records.len());
        for record in records {
            if self.call_fails(&mut state, |f| f.send, &record.item_id, "DLQ send failed") {
                results.push(Err(unavailable("SQS", "dlq")));
                continue;
            }
            if state.refuses(&record.item_id) {
                results.push(Err(ProcessError::new(
                    ErrorClass::Throttled,
                    "the DLQ refused the entry (injected)",
                )
                .with_step("dlq")));
                continue;
            }
            let id = send_dead_letter(&mut state, record, self.world.now_ms());
            state.step(
                &self.actor,
                &record.item_id,
                &format!(
                    "sent DLQ message {id} for source message {}",
                    record.source.message_id
                ),
            );
            results.push(Ok(()));
        }
        results
    }

    async fn receive(
        &self,
        hold: Duration,
        parser: &ItemParser,
    ) -> Result<Vec<ReceivedMessage<QueueMessage>>, ProcessError> {
        self.latency("receive").await;
        let mut state = self.world.lock();
        state.injected("receive")?;
        let now_ms = self.world.now_ms();
        let received = state.dlq.receive(10, hold, false, now_ms);
        for m in &received.messages {
            let item = m.item_id();
            let what = format!(
                "sweep received DLQ message {} (held {} s)",
                m.id,
                hold.as_secs()
            );
            state.observe(
                &self.actor,
                &Event::Note {
                    item: &item,
                    what: &what,
                },
            );
        }
        let arn = Self::source_arn(&state);
        Ok(received
            .messages
            .into_iter()
            .map(|m| {
                // As the adapter tracks it (`DeadLetterStore::tracked_item_id`): a pointer
                // without our `item_id` attribute names its item in the payload, read
                // here (an S3 call that may fail; the message id then).
                let mut readable = m.to_sqs_message(arn.as_deref());
                let pointer = Some(&m.body)
                    .filter(|_| m.attribute(ITEM_ID_ATTRIBUTE).is_none())
                    .and_then(|body| self.policy.pointer_in(body))
                    .and_then(Result::ok);
                if let Some(pointer) = pointer {
                    if !self.call_fails(
                        &mut state,
                        |f| f.bucket,
                        "-",
                        "sweep payload read: S3 unavailable",
                    ) {
                        if let Some(payload) = state.bucket.get(&(pointer.bucket, pointer.key)) {
                            readable.body = Some(payload.clone());
                        }
                    }
                }
                let item_id = crate::message::dlq_item_id(
                    |name| m.attribute(name),
                    parser
                        .parse(m.id.clone(), readable)
                        .ok()
                        .map(|item| item.item_id),
                    &m.id,
                );
                ReceivedMessage {
                    receipt: m.receipt.clone().unwrap_or_default(),
                    item_id,
                    view: self.view_of(&m),
                    marker: m.marker.clone(),
                    message: m,
                }
            })
            .collect())
    }

    async fn adopt(
        &self,
        message: &QueueMessage,
        item_id: &str,
        parser: &ItemParser,
        adoption: &Adoption,
    ) -> Result<Option<DeadLetteredItem>, ProcessError> {
        let arn = Self::source_arn(&self.world.lock());
        let mut item = to_work_item(message, parser, arn.as_deref());
        item.item_id = item_id.to_string();
        if item.event_source_arn.is_none() {
            item.event_source_arn = adoption.known_queue_arn.clone();
        }
        let mut error =
            ProcessError::new(ErrorClass::Unknown, adoption.reason).with_step("dlq-adopt");
        // Followed as the worker would: only into a bucket it reads payloads from.
        if let Some(pointer) = self.policy.pointer_in(&item.body) {
            let fetched = match pointer {
                Ok(pointer) => PayloadStore::fetch(self, &pointer).await,
                Err(refused) => Err(refused),
            };
            match fetched {
                Ok(payload) => {
                    item.body = payload;
                    sweep::tracked_as_its_payload_names(
                        message.attribute(ITEM_ID_ATTRIBUTE).is_some(),
                        item_id,
                        parser.id_named_by(&item).as_deref(),
                    )?;
                }
                Err(fetch) => error = Adoption::unfetched_payload(fetch)?,
            }
        }
        let mut record = sweep::adopted_record(
            item,
            error,
            &message.id,
            self.view_of(message).source_message_id,
            adoption,
            self.settings.retention,
            self.now(),
        );
        recording::offload_payload(self, &self.settings, &mut record).await?;
        let written = recording::adopt(
            self,
            &self.settings,
            &record,
            Expect::judged(adoption.expected_status, &adoption.message_keys),
        )
        .await?;
        Ok(written.then_some(record))
    }

    async fn delete_messages(&self, receipts: &[String]) -> Result<usize, ProcessError> {
        self.latency("delete_messages").await;
        let mut state = self.world.lock();
        state.injected("delete_messages")?;
        let mut deleted = 0;
        for receipt in receipts {
            let Some(message) = state.dlq.delete(receipt) else {
                continue;
            };
            deleted += 1;
            state.observe(&self.actor, &Event::DlqMessageDeleted { message: &message });
            let item = message
                .attribute(ITEM_ID_ATTRIBUTE)
                .unwrap_or(&message.id)
                .to_string();
            state.step(
                &self.actor,
                &item,
                &format!("deleted DLQ message {}", message.id),
            );
        }
        Ok(deleted)
    }

    async fn hold(&self, receipts: &[String], hold: Duration) -> Result<(), ProcessError> {
        self.latency("hold").await;
        let mut state = self.world.lock();
        state.injected("hold")?;
        for receipt in receipts {
            // A receipt gone stale is refused, as SQS refuses it; the sweep does not rely on it.
            let _ = state.dlq.change_visibility(receipt, hold);
        }
        Ok(())
    }

    fn is_fifo(&self) -> bool {
        self.world.lock().dlq.fifo
    }

    /// As the adapter rotates: a copy sent behind the group (its source message id and
    /// source queue kept as attributes, the pass as its marker), then the original deleted;
    /// two calls, so a crash between them leaves both.
    async fn rotate(
        &self,
        message: &QueueMessage,
        receipt: &str,
        pass: &str,
        item_id: &str,
    ) -> Result<bool, ProcessError> {
        let Some(group) = message.group.clone() else {
            return Ok(false);
        };
        self.latency("rotate").await;
        {
            let mut state = self.world.lock();
            state.injected("rotate")?;
            if self.call_fails(&mut state, |f| f.send, "-", "rotation send failed") {
                return Err(unavailable("SQS", "dlq-rotate"));
            }
            let mut attributes = message.attributes.clone();
            let has = |name: &str| message.attribute(name).is_some();
            if !has(ITEM_ID_ATTRIBUTE) {
                attributes.push((
                    ITEM_ID_ATTRIBUTE.to_string(),
                    MessageAttribute::string(item_id),
                ));
            }
            if !has(SOURCE_MESSAGE_ID_ATTRIBUTE) {
                attributes.push((
                    SOURCE_MESSAGE_ID_ATTRIBUTE.to_string(),
                    MessageAttribute::string(&message.id),
                ));
            }
            if let Some(from) = &message.moved_from {
                if !has(crate::message::SOURCE_QUEUE_ARN_ATTRIBUTE) {
                    attributes.push((
                        crate::message::SOURCE_QUEUE_ARN_ATTRIBUTE.to_string(),
                        MessageAttribute::string(from),
                    ));
                }
            }
            let now_ms = self.world.now_ms();
            let id = state
                .dlq
                .send(message.body.clone(), attributes, Some(group), now_ms);
            state.dlq.mark(&id, pass);
            let item = message.item_id();
            state.step(
                &self.actor,
                &item,
                &format!(
                    "rotated DLQ message {} behind its group as {id}",
                    message.id
                ),
            );
        }
        self.latency("rotate").await;
        let mut state = self.world.lock();
        if self.call_fails(&mut state, |f| f.send, "-", "rotation delete failed") {
            return Err(unavailable("SQS", "dlq-rotate"));
        }
        if let Some(deleted) = state.dlq.delete(receipt) {
            let item = deleted.item_id();
            state.step(
                &self.actor,
                &item,
                &format!("deleted DLQ message {} (rotated)", deleted.id),
            );
        }
        Ok(true)
    }
}

impl<X: Send + 'static> PayloadStore for MemoryStore<X> {
    async fn fetch(&self, pointer: &S3Pointer) -> Result<String, ProcessError> {
        self.latency("fetch").await;
        let mut state = self.world.lock();
        state.injected("fetch")?;
        if self.call_fails(
            &mut state,
            |f| f.bucket,
            "-",
            "fetch-payload: S3 unavailable",
        ) {
            return Err(unavailable("S3", "fetch-payload"));
        }
        state
            .bucket
            .get(&(pointer.bucket.clone(), pointer.key.clone()))
            .cloned()
            .ok_or_else(|| {
                ProcessError::new(
                    ErrorClass::NotFound,
                    format!("s3://{}/{} does not exist", pointer.bucket, pointer.key),
                )
                .with_step("fetch-payload")
            })
    }

    async fn put(
        &self,
        pointer: &S3Pointer,
        body: &str,
        _sha256: &str,
    ) -> Result<(), ProcessError> {
        self.latency("put").await;
        let mut state = self.world.lock();
        state.injected("put")?;
        if self.call_fails(&mut state, |f| f.bucket, "-", "put-payload: S3 unavailable") {
            return Err(unavailable("S3", "put-payload"));
        }
        state.bucket.insert(
            (pointer.bucket.clone(), pointer.key.clone()),
            body.to_string(),
        );
        Ok(())
    }

    async fn delete(&self, pointer: &S3Pointer) -> Result<(), ProcessError> {
        self.latency("delete").await;
        let mut state = self.world.lock();
        state.injected("delete")?;
        if self.call_fails(
            &mut state,
            |f| f.bucket,
            "-",
            "delete-payload: S3 unavailable",
        ) {
            return Err(unavailable("S3", "delete-payload"));
        }
        if let Some(body) = state
            .bucket
            .remove(&(pointer.bucket.clone(), pointer.key.clone()))
        {
            state.observe(
                &self.actor,
                &Event::PayloadDeleted {
                    key: &pointer.key,
                    body: &body,
                },
            );
            state.step(
                &self.actor,
                "-",
                &format!("deleted payload object {}", pointer.key),
            );
        }
        Ok(())
    }
}

impl<X: Send + 'static> SourceQueue for MemoryStore<X> {
    async fn queue_url(&self, name: &str, account: &str) -> Result<String, ProcessError> {
        self.latency("queue_url").await;
        let mut state = self.world.lock();
        state.injected("queue_url")?;
        if let Some(queue) = state.sources.iter().find(|q| q.is_named(name, account)) {
            return Ok(queue.url.clone());
        }
        if state.opens_queues {
            let queue = Queue::source(name, account);
            let url = queue.url.clone();
            state.sources.push(queue);
            return Ok(url);
        }
        Err(ProcessError::new(
            ErrorClass::NotFound,
            format!("AWS.SimpleQueueService.NonExistentQueue: {name}"),
        ))
    }

    async fn send_batch(
        &self,
        queue_url: &str,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<SendResult>, ProcessError> {
        self.latency("send_batch").await;
        let mut state = self.world.lock();
        if state.source_at(queue_url).is_none() {
            return Err(ProcessError::new(ErrorClass::NotFound, "no such queue"));
        }
        state.injected("send_batch")?;
        if self.call_fails(&mut state, |f| f.send, "-", "requeue send failed") {
            return Err(unavailable("SQS", "requeue"));
        }
        let now_ms = self.world.now_ms();
        let mut results = Vec::new();
        for m in messages {
            let item = m
                .attributes
                .iter()
                .find(|(n, _)| n == ITEM_ID_ATTRIBUTE)
                .and_then(|(_, v)| v.string_value())
                .unwrap_or("-")
                .to_string();
            if state.refuses(&item) {
                results.push(Err("InvalidParameterValue refused (injected)".to_string()));
                continue;
            }
            let Some(queue) = state.source_at(queue_url) else {
                results.push(Err("no such queue".to_string()));
                continue;
            };
            let id = queue.send(
                m.body.clone(),
                m.attributes.clone(),
                m.group_id.clone(),
                now_ms,
            );
            state.sent.push((queue_url.to_string(), m.clone()));
            state.step(
                &self.actor,
                &item,
                &format!("requeued as source message {id}"),
            );
            self.world.arrivals.notify_waiters();
            results.push(Ok(id));
        }
        Ok(results)
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
        RecordStore::release_claim(&store, "a", "m-1")
            .await
            .unwrap();
        assert!(store.row("a").is_none(), "{:?}", store.row("a"));
    }
}
