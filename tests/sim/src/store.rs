//! The simulated adapters: DynamoDB (the dead-letter table), S3 (the payload bucket) and SQS
//! (the DLQ and the source queue) as the library's ports, over the world's state.
//!
//! Only the primitives are simulated: each method is one AWS call, applied atomically with
//! the conditions the DynamoDB adapter writes as condition expressions (a lease only when
//! free, status changes only by the lease owner, an append refused when an attempt is
//! already recorded or the DLQ message already claimed, compaction only when no append
//! came between). The logic above them (dead-letter recording, the sweep, the redrive
//! engine) is the library's own code, unchanged. Every call may fail as the fault switches
//! say, and every change is followed by the invariant checks of [`State::after_step`].

use sqs_keeper_core::condition::conditions;
use std::collections::HashMap;

use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

use sqs_keeper_core::dead_letter::{
    processed_after, DeadLetterCandidate, DeadLetterSink, DeadLetteredItem, FailureDetail,
    InvocationInfo, ItemStatus, MessageAttribute, PayloadLocation,
};
use sqs_keeper_core::error::{ErrorClass, ProcessError};
use sqs_keeper_core::item::{ItemParser, WorkItem};
use sqs_keeper_core::message::{
    ITEM_ID_ATTRIBUTE, PAYLOAD_SHA256_ATTRIBUTE, SOURCE_MESSAGE_ID_ATTRIBUTE,
};
use sqs_keeper_core::pointer::{S3Pointer, EXTENDED_PAYLOAD_SIZE_ATTRIBUTE};
use sqs_keeper_core::ports::{
    Compaction, DeadLetterQueue, Deliveries, OutgoingMessage, PayloadStore, RecordStore,
    SendResult, SourceQueue,
};
use sqs_keeper_core::recording::{self, RecordingSettings};
use sqs_keeper_core::selection::{
    page_in_memory, token_after_record, Page, PageToken, RecordFilter, Unreadable,
};
use sqs_keeper_core::sweep::{self, Adoption, MessageView, ReceivedMessage, Standing};

use sqs_keeper_core::redelivery::{Hide, QueueTiming, VisibilityPort};

use crate::queue::SimMessage;
use crate::world::{satisfied, Row, Section, State, World, ITEM_SIZE_LIMIT};

/// A call's latency: the task yields for a few simulated milliseconds, now and then a few
/// seconds (drawn from the seed), so that concurrent runs, sandboxes and operators
/// interleave between one call and the next, as they do against DynamoDB, SQS and S3 (a
/// read and the write that follows it are two steps another task can come between).
pub async fn call_latency(world: &World) {
    let delay = {
        let mut state = world.lock();
        match state.rng.u32(0..100) {
            0..50 => Duration::ZERO,
            50..95 => Duration::from_millis(state.rng.u64(1..=40)),
            // A slow call: the SDK retrying a throttled request, a cold connection.
            _ => Duration::from_millis(state.rng.u64(200..=3_000)),
        }
    };
    if delay.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(delay).await;
    }
}

/// The bucket payloads go to.
pub const BUCKET: &str = "sim-payloads";

/// The simulated AWS side of the pipeline, shared by every worker invocation and run.
#[derive(Debug, Clone)]
pub struct SimStore {
    world: Arc<World>,
    settings: Arc<RecordingSettings>,
    /// Who is calling (for the trace).
    actor: String,
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

impl SimStore {
    /// The store of `world`, with the recording settings the worker and runs use.
    pub fn new(world: Arc<World>, settings: RecordingSettings) -> Self {
        SimStore {
            world,
            settings: Arc::new(settings),
            actor: "store".into(),
        }
    }

    /// The same store, with calls traced as `actor`'s.
    pub fn as_actor(&self, actor: &str) -> Self {
        SimStore {
            actor: actor.to_string(),
            ..self.clone()
        }
    }

    /// The world.
    pub fn world(&self) -> &Arc<World> {
        &self.world
    }

    /// A call's latency ([`call_latency`]).
    async fn latency(&self) {
        call_latency(&self.world).await;
    }

    fn table_call(&self, state: &mut State, step: &str) -> Result<(), ProcessError> {
        if state.chance_of(|f| f.table) {
            // Throttling and unavailability, half and half.
            let error = if state.rng.bool() {
                throttled(step)
            } else {
                unavailable("DynamoDB", step)
            };
            state
                .trace
                .note("fault", "-", &format!("{} {step}: {error}", self.actor));
            return Err(error);
        }
        Ok(())
    }

    /// A write that leaves `row` as the item `item_id`, refused as DynamoDB would refuse an
    /// item over 400 KB.
    fn put_row(state: &mut State, item_id: &str, row: Row) -> Result<(), ProcessError> {
        let size = row.size();
        state.stats.largest_record = state.stats.largest_record.max(size);
        if size > ITEM_SIZE_LIMIT {
            state.violate(
                Section::Record,
                item_id,
                format!("a write of a {size}-byte record was refused: over DynamoDB's 400 KB"),
            );
            return Err(ProcessError::validation(
                "Item size has exceeded the maximum allowed size",
            ));
        }
        state.table.insert(item_id.to_string(), row);
        Ok(())
    }

    /// Ends `owner`'s lease, changing the record with `change` (condition: `owner` holds
    /// it; with `payload_sha256`, [`sqs_keeper_core::dead_letter::LEASED_WITH_PAYLOAD`]).
    fn end_lease(
        &self,
        step: &str,
        item_id: &str,
        owner: &str,
        payload_sha256: Option<&str>,
        change: impl FnOnce(&mut Row),
    ) -> Result<(), ProcessError> {
        let mut state = self.world.lock();
        self.table_call(&mut state, step)?;
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
        Self::put_row(&mut state, item_id, row)?;
        state.after_step(&self.actor, item_id, &format!("{step}: now {status:?}"));
        Ok(())
    }
}

fn lease_lost(item_id: &str, step: &str) -> ProcessError {
    ProcessError::new(
        ErrorClass::Unknown,
        format!("lease on {item_id:?} was lost (conditional check failed)"),
    )
    .with_step(step)
}

fn now_secs() -> i64 {
    sqs_keeper_core::clock::now().timestamp()
}

/// The DLQ message of a record: its payload (or a pointer to it) with the attributes that
/// join it to its record.
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
    (body, attributes)
}

/// A queue message as Lambda would hand it to the worker.
pub fn to_sqs_message(m: &SimMessage, queue_arn: &str) -> aws_lambda_events::sqs::SqsMessage {
    let mut attributes = serde_json::Map::new();
    attributes.insert(
        "ApproximateReceiveCount".into(),
        m.receive_count.to_string().into(),
    );
    attributes.insert("SentTimestamp".into(), m.sent_at_ms.to_string().into());
    if let Some(first) = m.first_receive_ms {
        attributes.insert(
            "ApproximateFirstReceiveTimestamp".into(),
            first.to_string().into(),
        );
    }
    if let Some(group) = &m.group {
        attributes.insert("MessageGroupId".into(), group.clone().into());
    }
    if let Some(from) = &m.moved_from {
        attributes.insert("DeadLetterQueueSourceArn".into(), from.clone().into());
    }
    let message_attributes: serde_json::Map<String, serde_json::Value> = m
        .attributes
        .iter()
        .map(|(name, value)| {
            let mut v = serde_json::json!({ "dataType": value.data_type() });
            if let Some(s) = value.string_value() {
                v["stringValue"] = s.into();
            }
            if let Some(b) = value.binary_base64() {
                v["binaryValue"] = b.into();
            }
            (name.clone(), v)
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "messageId": m.id,
        "receiptHandle": m.receipt,
        "body": m.body,
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "eventSource": "aws:sqs",
        "eventSourceARN": m.moved_from.as_deref().unwrap_or(queue_arn),
        "awsRegion": "us-east-1",
    }))
    .unwrap_or_default()
}

/// What identifies a DLQ message's content, by the library's rule.
fn view_of(m: &SimMessage) -> MessageView {
    MessageView::of(&m.id, &m.body, |name| m.attribute(name), BUCKET)
}

fn to_work_item(m: &SimMessage, parser: &ItemParser, arn: &str) -> WorkItem {
    match parser.parse(m.id.clone(), to_sqs_message(m, arn)) {
        Ok(item) => item,
        Err(invalid) => invalid.item,
    }
}

/// The bucket the producer offloads payloads to (an Extended-Client sender's), which the
/// worker's payload policy allows.
pub const PRODUCER_BUCKET: &str = "producer-payloads";

/// The worker's and the redrive's Extended-Client resolver: the library's policy check
/// (`PayloadPolicy::pointer_in`, as the adapter's resolver makes it), then the object from
/// the simulated bucket, with its latency and S3 faults.
pub struct SimResolver {
    store: SimStore,
    policy: sqs_keeper_core::pointer::PayloadPolicy,
}

/// The worker's payload policy in every world: the producer's bucket and the store's.
fn worker_payload_policy() -> sqs_keeper_core::pointer::PayloadPolicy {
    sqs_keeper_core::pointer::PayloadPolicy::allowing([PRODUCER_BUCKET, BUCKET])
}

impl SimResolver {
    /// A resolver for `store`'s actor, under the worker's payload policy.
    pub fn new(store: SimStore) -> Self {
        Self {
            store,
            policy: worker_payload_policy(),
        }
    }
}

impl sqs_keeper_core::batch::BodyResolver for SimResolver {
    fn resolve<'a>(&'a self, body: &'a str) -> BoxFuture<'a, Option<Result<String, ProcessError>>> {
        Box::pin(async move {
            let pointer = match self.policy.pointer_in(body)? {
                Ok(pointer) => pointer,
                Err(refused) => return Some(Err(refused)),
            };
            Some(PayloadStore::fetch(&self.store, &pointer).await)
        })
    }
}

impl SourceQueue for SimStore {
    async fn queue_url(&self, name: &str, _account: &str) -> Result<String, ProcessError> {
        self.latency().await;
        let state = self.world.lock();
        if state.source.arn.ends_with(&format!(":{name}")) {
            Ok(state.source.url.clone())
        } else {
            Err(ProcessError::new(
                ErrorClass::NotFound,
                format!("AWS.SimpleQueueService.NonExistentQueue: {name}"),
            ))
        }
    }

    async fn send_batch(
        &self,
        queue_url: &str,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<SendResult>, ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        if queue_url != state.source.url {
            return Err(ProcessError::new(ErrorClass::NotFound, "no such queue"));
        }
        if state.sqs_call_fails(&self.actor, "-", "requeue send failed") {
            return Err(unavailable("SQS", "requeue"));
        }
        let now_ms = sqs_keeper_core::clock::now().timestamp_millis();
        let mut results = Vec::new();
        for m in messages {
            let item = m
                .attributes
                .iter()
                .find(|(n, _)| n == ITEM_ID_ATTRIBUTE)
                .and_then(|(_, v)| v.string_value())
                .unwrap_or("-")
                .to_string();
            let id = state.source.send(
                m.body.clone(),
                m.attributes.clone(),
                m.group_id.clone(),
                now_ms,
            );
            state.after_step(
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

/// `ChangeMessageVisibility` on the source queue and its attributes, as the worker's
/// redelivery spacing uses them (`sqs_keeper_core::redelivery`).
impl VisibilityPort for SimStore {
    fn hide<'a>(&'a self, records: &'a [Hide]) -> BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(async move {
            self.latency().await;
            let mut state = self.world.lock();
            records
                .iter()
                .map(|hide| self.hide_one(&mut state, hide))
                .collect()
        })
    }

    fn queue_timing<'a>(&'a self, queue_arn: &'a str) -> BoxFuture<'a, Option<QueueTiming>> {
        Box::pin(async move {
            self.latency().await;
            let mut state = self.world.lock();
            if queue_arn != state.source.arn {
                return None;
            }
            if state.sqs_call_fails(
                &self.actor,
                "-",
                "could not read the source queue's attributes",
            ) {
                return None;
            }
            state.ledger.timing_known.insert(self.actor.clone());
            Some(QueueTiming {
                retention: state.source.retention,
                visibility_timeout: crate::run::VISIBILITY,
            })
        })
    }
}

impl SimStore {
    /// One entry of a `ChangeMessageVisibilityBatch`, with the §1.11 check that a hide
    /// honours the downstream's `Retry-After` wherever the message's retention leaves
    /// room for it.
    fn hide_one(&self, state: &mut State, hide: &Hide) -> Result<(), ProcessError> {
        if state.sqs_call_fails(&self.actor, "-", "hide failed") {
            return Err(unavailable("SQS", "hide"));
        }
        let receipt = hide.receipt_handle.as_str();
        let (item, message_id, sent_at_ms) = match state.source.by_receipt(receipt) {
            Some(m) => (m.item_id(), m.id.clone(), m.sent_at_ms),
            None => ("-".to_string(), String::new(), 0),
        };
        if let Some(asked) = state.ledger.retry_after.get(receipt).copied() {
            let now_ms = sqs_keeper_core::clock::now().timestamp_millis();
            let retention_ms =
                i64::try_from(state.source.retention.as_millis()).unwrap_or(i64::MAX);
            let left = Duration::from_millis(
                u64::try_from(sent_at_ms.saturating_add(retention_ms) - now_ms).unwrap_or(0),
            );
            let room = asked + crate::run::VISIBILITY + Duration::from_secs(60);
            let doubled = state.ledger.doubled.contains(receipt);
            if hide.delay < asked && left > room && !doubled {
                state.violate(
                    Section::Spacing,
                    &item,
                    format!(
                        "message {message_id} hidden for {} s though the downstream asked for {} s (Retry-After), with {} s of retention left",
                        hide.delay.as_secs(),
                        asked.as_secs(),
                        left.as_secs()
                    ),
                );
            }
        }
        match state.source.change_visibility(receipt, hide.delay) {
            Ok(()) => {
                state.ledger.hidden.insert(receipt.to_string(), hide.delay);
                if state.ledger.timing_known.contains(&self.actor) {
                    state.ledger.hidden_blind.remove(&message_id);
                } else {
                    state.ledger.hidden_blind.insert(message_id.clone());
                }
                state.after_step(
                    &self.actor,
                    &item,
                    &format!("hid message {message_id} for {} s", hide.delay.as_secs()),
                );
                Ok(())
            }
            Err(refused) => {
                state
                    .trace
                    .note(&self.actor, &item, &format!("hide refused: {refused}"));
                Err(ProcessError::new(ErrorClass::Validation, refused).with_step("hide"))
            }
        }
    }
}

impl RecordStore for SimStore {
    async fn get(&self, item_id: &str) -> Result<Option<DeadLetteredItem>, ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "read-record")?;
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
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "query")?;
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
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "sweep-lookup")?;
        Ok(ids
            .iter()
            .filter_map(|id| state.table.get(id).map(|row| (id, row)))
            .map(|(id, row)| {
                let r = &row.record;
                let standing = if row.corrupt {
                    Standing::default()
                } else {
                    Standing {
                        status: Some(r.status),
                        lease_expires_at: r.lease_expires_at,
                        source_message_id: Some(r.source.message_id.clone()),
                        payload_sha256: Some(r.payload.sha256.clone()),
                        processed: r.processed.clone(),
                        requeued_message_id: r.requeued_message_id.clone(),
                        source_queue_arn: r.source.queue_arn.clone(),
                    }
                };
                (id.clone(), standing)
            })
            .collect())
    }

    async fn deliveries(&self, item_id: &str) -> Result<Deliveries, ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "record")?;
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
        expect: recording::Expect,
    ) -> Result<Option<DeadLetteredItem>, ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "record")?;
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
            if let (Some(row), Some(c)) = (&existing, claim) {
                if row.claims.contains(c) && !row.sent.contains(c) {
                    // Another delivery holds the claim and has not sent yet: this one will
                    // be returned for retry (`dead_letter::dead_lettering_elsewhere`).
                    state.ledger.claims_held_elsewhere.insert(c.to_string());
                }
            }
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
                Row {
                    record: r,
                    attempt_ids: Default::default(),
                    claims: Default::default(),
                    sent: Default::default(),
                    lease_owner: None,
                    corrupt: false,
                }
            }
        };
        // §1.5: an attempt is appended once however often it is recorded, also after
        // compaction dropped it from the history (and its id with it).
        let ever = state.ledger.appended.entry(id.to_string()).or_default();
        let again: Vec<String> = pending
            .iter()
            .filter(|f| !ever.insert(f.attempt_id.clone()))
            .map(|f| f.attempt_id.clone())
            .collect();
        if !again.is_empty() {
            state.violate(
                Section::RecordingIdempotent,
                id,
                format!(
                    "attempt {} appended a second time by {}: failure_count counts it twice",
                    again.join(", "),
                    self.actor
                ),
            );
        }
        row.record.failure_history.extend(pending.iter().cloned());
        row.record.failure_count += u32::try_from(pending.len()).unwrap_or(u32::MAX);
        row.attempt_ids
            .extend(pending.iter().map(|f| f.attempt_id.clone()));
        if let Some(claim) = claim {
            row.claims.insert(claim.to_string());
        }
        let stored = row.record.clone();
        Self::put_row(&mut state, id, row)?;
        state
            .ledger
            .recorded_under
            .entry(record.source.message_id.clone())
            .or_default()
            .insert(id.to_string());
        state.after_step(
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
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "mark-sent")?;
        for (item_id, message_id) in sent {
            if let Some(row) = state
                .table
                .get_mut(*item_id)
                .filter(|row| row.satisfies(&conditions::exists()))
            {
                row.sent.insert((*message_id).to_string());
            }
            state.after_step(
                &self.actor,
                item_id,
                &format!("marked the DLQ message of {message_id} sent"),
            );
        }
        Ok(())
    }

    async fn set_review_flag(&self, item_id: &str, wanted: bool) -> Result<(), ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "record")?;
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
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "compact-history")?;
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
        Self::put_row(&mut state, id, row)?;
        state.after_step(
            &self.actor,
            id,
            &format!("compacted: {} attempts dropped", compaction.dropped),
        );
        Ok(())
    }

    async fn release_claim(&self, item_id: &str, message_id: &str) -> Result<(), ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "release-claim")?;
        if let Some(row) = state.table.get_mut(item_id) {
            row.claims.remove(message_id);
        }
        state.after_step(
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
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "lease")?;
        let now = now_secs();
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
        Self::put_row(&mut state, item_id, row)?;
        state.after_step(
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
        self.end_lease("release-lease", item_id, owner, None, |row| {
            row.record.status = ItemStatus::Dead;
        })
    }

    async fn resolve(&self, record: &DeadLetteredItem, owner: &str) -> Result<(), ProcessError> {
        let processed = processed_after(record);
        self.end_lease(
            "resolve",
            &record.item_id,
            owner,
            Some(&record.payload.sha256),
            |row| {
                row.record.status = ItemStatus::Resolved;
                row.record.resolved_at = Some(sqs_keeper_core::clock::now());
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
        let sha = Some(record.payload.sha256.as_str());
        self.end_lease("mark-requeued", &record.item_id, owner, sha, |row| {
            row.record.status = ItemStatus::Requeued;
            row.record.requeued_message_id = Some(message_id.to_string());
            row.record.requeued_at = Some(sqs_keeper_core::clock::now());
        })
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
        let mut stored = None;
        self.end_lease("record-redrive-failure", item_id, owner, None, |row| {
            let r = &mut row.record;
            r.status = ItemStatus::Dead;
            r.last_attempt = last.timestamp;
            r.error_class = last.error_type;
            r.error_signature =
                sqs_keeper_core::signature::error_signature(last.error_type, &last.error_message);
            r.last_error = last.error_message.clone();
            r.reprocess_eligible = last.error_type.is_reprocess_eligible();
            r.failure_history.extend(failures.iter().cloned());
            r.failure_count += u32::try_from(failures.len()).unwrap_or(u32::MAX);
            row.attempt_ids
                .extend(failures.iter().map(|f| f.attempt_id.clone()));
            stored = Some(row.record.clone());
        })?;
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
        let stored = {
            self.latency().await;
            let mut state = self.world.lock();
            self.table_call(&mut state, "reopen-requeued")?;
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
            r.error_signature = sqs_keeper_core::signature::error_signature(
                failure.error_type,
                &failure.error_message,
            );
            r.last_error = failure.error_message.clone();
            r.reprocess_eligible = failure.error_type.is_reprocess_eligible();
            r.failure_history.push(failure.clone());
            r.failure_count += 1;
            row.attempt_ids.insert(failure.attempt_id.clone());
            let stored = row.record.clone();
            Self::put_row(&mut state, &record.item_id, row)?;
            state.after_step(
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
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "finish-requeued")?;
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
        row.record.resolved_at = Some(sqs_keeper_core::clock::now());
        row.record.requeued_message_id = None;
        row.record
            .processed
            .push(sqs_keeper_core::dead_letter::processed_key_for_message(
                message_id,
            ));
        row.record
            .processed
            .push(sqs_keeper_core::dead_letter::processed_key_for_payload(
                payload_sha256,
            ));
        Self::put_row(&mut state, item_id, row)?;
        state.after_step(
            &self.actor,
            item_id,
            &format!("resolved: the worker finished requeued message {message_id}"),
        );
        Ok(())
    }

    async fn finish_moved_back(
        &self,
        _item_id: &str,
        _dead_lettered: &str,
        _message_id: &str,
        _payload_sha256: &str,
    ) -> Result<(), ProcessError> {
        // The simulation moves no DLQ message back to its source queue.
        Ok(())
    }

    async fn delete_records(
        &self,
        records: &[DeadLetteredItem],
    ) -> Result<Vec<String>, ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "delete-records")?;
        let mut deleted = Vec::new();
        for selected in records {
            let id = &selected.item_id;
            // Still the status and last attempt selected.
            let condition = conditions::unchanged_since(
                selected.status,
                &sqs_keeper_core::time_format::format(&selected.last_attempt),
            );
            let unchanged = state
                .table
                .get(id)
                .is_some_and(|row| !row.corrupt && row.satisfies(&condition));
            if !unchanged {
                continue;
            }
            state.ledger.appended.remove(id.as_str());
            let Some(row) = state.table.remove(id) else {
                continue;
            };
            deleted.push(id.clone());
            let sha = row.record.payload.sha256.clone();
            if !state.payload_is_safe(&sha, None) {
                state.violate(
                    Section::NothingLost,
                    id,
                    format!(
                        "a purge deleted the record of {id} holding payload {}, which it had not selected: lost",
                        &sha[..12]
                    ),
                );
            }
            state.after_step(&self.actor, id, "record deleted");
        }
        Ok(deleted)
    }
}

impl DeadLetterQueue for SimStore {
    type Message = SimMessage;

    async fn send_to_dlq(&self, records: &[&DeadLetteredItem]) -> Vec<Result<(), ProcessError>> {
        self.latency().await;
        let mut state = self.world.lock();
        let now_ms = sqs_keeper_core::clock::now().timestamp_millis();
        let mut results = Vec::with_capacity(records.len());
        for record in records {
            if state.sqs_call_fails(&self.actor, &record.item_id, "DLQ send failed") {
                results.push(Err(unavailable("SQS", "dlq")));
                continue;
            }
            let (body, mut attributes) = dlq_message(record);
            attributes.push((
                sqs_keeper_core::message::ERROR_CLASS_ATTRIBUTE.to_string(),
                MessageAttribute::string(record.error_class.as_str()),
            ));
            // A FIFO DLQ's message goes in the source message's group (else the item's), as
            // the adapter sends it.
            let group = state.dlq.fifo.then(|| {
                sqs_keeper_core::message::fifo_group_id(
                    record.source.message_group_id.as_deref(),
                    &record.item_id,
                )
            });
            let id = state.dlq.send(body, attributes, group, now_ms);
            state.after_step(
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
    ) -> Result<Vec<ReceivedMessage<SimMessage>>, ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        let received = state.dlq.receive(10, hold, false);
        for m in &received.messages {
            let item = m.item_id();
            state.trace.note(
                &self.actor,
                &item,
                &format!(
                    "sweep received DLQ message {} (held {} s)",
                    m.id,
                    hold.as_secs()
                ),
            );
        }
        let arn = state.source.arn.clone();
        let policy = worker_payload_policy();
        Ok(received
            .messages
            .into_iter()
            .map(|m| {
                // As the adapter tracks it (`DeadLetterStore::tracked_item_id`): a pointer
                // without our `item_id` attribute names its item in the payload, read
                // here (an S3 call that may fail; the message id then).
                let mut readable = to_sqs_message(&m, &arn);
                let pointer = Some(&m.body)
                    .filter(|_| m.attribute(ITEM_ID_ATTRIBUTE).is_none())
                    .and_then(|body| policy.pointer_in(body))
                    .and_then(Result::ok);
                if let Some(pointer) = pointer {
                    if !state.call_fails(
                        |f| f.bucket,
                        &self.actor,
                        "-",
                        "sweep payload read: S3 unavailable",
                    ) {
                        if let Some(payload) = state.bucket.get(&pointer.key) {
                            readable.body = Some(payload.clone());
                        }
                    }
                }
                let item_id = sqs_keeper_core::message::dlq_item_id(
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
                    view: view_of(&m),
                    marker: m.marker.clone(),
                    message: m,
                }
            })
            .collect())
    }

    async fn adopt(
        &self,
        message: &SimMessage,
        item_id: &str,
        parser: &ItemParser,
        adoption: &Adoption,
    ) -> Result<Option<DeadLetteredItem>, ProcessError> {
        let arn = self.world.lock().source.arn.clone();
        let mut item = to_work_item(message, parser, &arn);
        item.item_id = item_id.to_string();
        if item.event_source_arn.is_none() {
            item.event_source_arn = adoption.known_queue_arn.clone();
        }
        let mut error =
            ProcessError::new(ErrorClass::Unknown, adoption.reason).with_step("dlq-adopt");
        if let Some(pointer) = S3Pointer::parse(&item.body) {
            match PayloadStore::fetch(self, &pointer).await {
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
            view_of(message).source_message_id,
            adoption,
            self.settings.retention,
        );
        recording::offload_payload(self, &self.settings, &mut record).await?;
        let written = recording::adopt(
            self,
            &self.settings,
            &record,
            recording::Expect::judged(adoption.expected_status, &adoption.message_keys),
        )
        .await?;
        Ok(written.then_some(record))
    }

    async fn delete_messages(&self, receipts: &[String]) -> Result<usize, ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        let mut deleted = 0;
        for receipt in receipts {
            let Some(message) = state.dlq.delete(receipt) else {
                continue;
            };
            deleted += 1;
            let view = view_of(&message);
            let item = message
                .attribute(ITEM_ID_ATTRIBUTE)
                .unwrap_or(&message.id)
                .to_string();
            let sha = match (&view.payload_sha256, S3Pointer::parse(&message.body)) {
                (Some(sha), _) => sha.clone(),
                (None, _) => message.body_sha256.clone(),
            };
            if !state.payload_is_safe(&sha, Some(&message.id)) {
                state.violate(
                    Section::DlqRule,
                    &item,
                    format!(
                        "DLQ message {} deleted, but its payload {} was never delivered and nothing else holds it: lost",
                        message.id,
                        &sha[..12]
                    ),
                );
            }
            state.after_step(
                &self.actor,
                &item,
                &format!("deleted DLQ message {}", message.id),
            );
        }
        Ok(deleted)
    }

    fn is_fifo(&self) -> bool {
        self.world.lock().dlq.fifo
    }

    /// As the adapter rotates: a copy sent behind the group (its source message id and
    /// source queue kept as attributes, the pass as its marker), then the original deleted;
    /// two calls, so a crash between them leaves both.
    async fn rotate(
        &self,
        message: &SimMessage,
        receipt: &str,
        pass: &str,
        item_id: &str,
    ) -> Result<bool, ProcessError> {
        let Some(group) = message.group.clone() else {
            return Ok(false);
        };
        self.latency().await;
        {
            let mut state = self.world.lock();
            if state.sqs_call_fails(&self.actor, "-", "rotation send failed") {
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
                if !has(sqs_keeper_core::message::SOURCE_QUEUE_ARN_ATTRIBUTE) {
                    attributes.push((
                        sqs_keeper_core::message::SOURCE_QUEUE_ARN_ATTRIBUTE.to_string(),
                        MessageAttribute::string(from),
                    ));
                }
            }
            let now_ms = sqs_keeper_core::clock::now().timestamp_millis();
            let id = state
                .dlq
                .send(message.body.clone(), attributes, Some(group), now_ms);
            state.dlq.mark(&id, pass);
            let item = message.item_id();
            state.after_step(
                &self.actor,
                &item,
                &format!(
                    "rotated DLQ message {} behind its group as {id}",
                    message.id
                ),
            );
        }
        self.latency().await;
        let mut state = self.world.lock();
        if state.sqs_call_fails(&self.actor, "-", "rotation delete failed") {
            return Err(unavailable("SQS", "dlq-rotate"));
        }
        if let Some(deleted) = state.dlq.delete(receipt) {
            let item = deleted.item_id();
            state.after_step(
                &self.actor,
                &item,
                &format!("deleted DLQ message {} (rotated)", deleted.id),
            );
        }
        Ok(true)
    }

    async fn hold(&self, receipts: &[String], hold: Duration) -> Result<(), ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        for receipt in receipts {
            // A receipt gone stale is refused, as SQS refuses it; the sweep does not rely on it.
            let _ = state.dlq.change_visibility(receipt, hold);
        }
        Ok(())
    }
}

impl PayloadStore for SimStore {
    async fn fetch(&self, pointer: &S3Pointer) -> Result<String, ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        if state.call_fails(
            |f| f.bucket,
            &self.actor,
            "-",
            "fetch-payload: S3 unavailable",
        ) {
            return Err(unavailable("S3", "fetch-payload"));
        }
        state.bucket.get(&pointer.key).cloned().ok_or_else(|| {
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
        self.latency().await;
        let mut state = self.world.lock();
        if state.call_fails(
            |f| f.bucket,
            &self.actor,
            "-",
            "put-payload: S3 unavailable",
        ) {
            return Err(unavailable("S3", "put-payload"));
        }
        state.bucket.insert(pointer.key.clone(), body.to_string());
        Ok(())
    }

    async fn delete(&self, pointer: &S3Pointer) -> Result<(), ProcessError> {
        self.latency().await;
        let mut state = self.world.lock();
        if state.chance_of(|f| f.bucket) {
            return Err(unavailable("S3", "delete-payload"));
        }
        if let Some(body) = state.bucket.remove(&pointer.key) {
            let sha = sqs_keeper_core::hex::sha256_hex(body.as_bytes());
            if state.deliveries_of(&sha) == 0 && !state.ledger.discarded.contains(&sha) {
                state.violate(
                    Section::NothingLost,
                    &pointer.key,
                    format!(
                        "payload object {} deleted before its payload was delivered",
                        pointer.key
                    ),
                );
            }
            state.after_step(
                &self.actor,
                "-",
                &format!("deleted payload object {}", pointer.key),
            );
        }
        Ok(())
    }
}

impl DeadLetterSink for SimStore {
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
}
