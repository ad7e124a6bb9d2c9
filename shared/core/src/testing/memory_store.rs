//! [`MemoryStore`]: every port of the redrive engine ([`crate::ports`]) in memory, with
//! the semantics of the AWS adapter where the engine depends on them: leases are
//! conditional (an item is taken only when dead, or redriving with an expired lease), every
//! status change checks the lease owner, queries page newest first with a resumable token,
//! and a sweep holds DLQ messages until they are settled by their items' status. Faults
//! can be switched on per operation, so tests reach the engine's error paths.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use chrono::Utc;

use crate::clock::Clock;
use crate::dead_letter::{
    DeadLetterCandidate, DeadLetterReason, DeadLetteredItem, FailureDetail, InvocationInfo,
    ItemStatus,
};
use crate::error::{ErrorClass, ProcessError};
use crate::item::ItemParser;
use crate::message::ITEM_ID_ATTRIBUTE;
use crate::pointer::S3Pointer;
use crate::ports::{
    DeadLetterQueue, OutgoingMessage, PayloadStore, RecordStore, SendResult, SourceQueue,
};
use crate::ports::{Sweep, SweepOptions};
use crate::retry::AttemptFailure;
use crate::selection::{page_in_memory, token_after_record, Page, PageToken, RecordFilter};
use crate::sweep::{HeldMessage, MessageView};

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
        Err(_) => crate::item::WorkItem {
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

/// A message in the in-memory DLQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryMessage {
    /// Its id.
    pub message_id: String,
    /// The item it carries.
    pub item_id: String,
    /// Whether a sweep holds it (invisible).
    pub held: bool,
}

#[derive(Debug, Default)]
struct State {
    records: BTreeMap<String, DeadLetteredItem>,
    /// Lease owner by item id.
    leases: HashMap<String, String>,
    dlq: Vec<MemoryMessage>,
    payloads: HashMap<(String, String), String>,
    sent: Vec<(String, OutgoingMessage)>,
    /// Item ids whose requeued message the source queue refuses.
    refused: HashSet<String>,
    /// Operations that fail (by name, e.g. `resolve`).
    failing: HashSet<String>,
    next_message: u64,
}

/// The redrive engine's ports in memory; see the module documentation.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    /// The wall clock leases and status changes are read by.
    clock: Clock,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads wall time (lease expiries, when an item was resolved or requeued) from
    /// `clock` (the system clock unless set).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock already failed; carry on with the data.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores (or replaces) a record.
    pub fn insert(&self, record: DeadLetteredItem) {
        self.state().records.insert(record.item_id.clone(), record);
    }

    /// Stores a record with its message in the DLQ, as the worker leaves a dead item.
    pub fn insert_dead_lettered(&self, record: DeadLetteredItem) {
        let item_id = record.item_id.clone();
        self.insert(record);
        self.add_dlq_message(&item_id);
    }

    /// The record of `item_id`.
    pub fn record(&self, item_id: &str) -> Option<DeadLetteredItem> {
        self.state().records.get(item_id).cloned()
    }

    /// Who holds the lease on `item_id`.
    pub fn lease_owner(&self, item_id: &str) -> Option<String> {
        self.state().leases.get(item_id).cloned()
    }

    /// Puts a message for `item_id` in the DLQ.
    pub fn add_dlq_message(&self, item_id: &str) {
        let mut state = self.state();
        state.next_message += 1;
        let message_id = format!("dlq-{}", state.next_message);
        state.dlq.push(MemoryMessage {
            message_id,
            item_id: item_id.to_string(),
            held: false,
        });
    }

    /// The DLQ's messages.
    pub fn dlq_messages(&self) -> Vec<MemoryMessage> {
        self.state().dlq.clone()
    }

    /// Stores a payload.
    pub fn put_payload(&self, pointer: &S3Pointer, body: &str) {
        self.state().payloads.insert(
            (pointer.bucket.clone(), pointer.key.clone()),
            body.to_string(),
        );
    }

    /// Whether a payload is stored.
    pub fn has_payload(&self, pointer: &S3Pointer) -> bool {
        self.state()
            .payloads
            .contains_key(&(pointer.bucket.clone(), pointer.key.clone()))
    }

    /// Messages sent to source queues, with their queue URL, in order.
    pub fn sent(&self) -> Vec<(String, OutgoingMessage)> {
        self.state().sent.clone()
    }

    /// Makes the source queue refuse the requeued message of `item_id`.
    pub fn refuse_requeue_of(&self, item_id: &str) {
        self.state().refused.insert(item_id.to_string());
    }

    /// Makes the operation `name` (a port method's name, e.g. `resolve`, `send_batch`) fail
    /// from now on.
    pub fn fail(&self, name: &str) {
        self.state().failing.insert(name.to_string());
    }

    fn check(state: &State, name: &str) -> Result<(), ProcessError> {
        if state.failing.contains(name) {
            Err(
                ProcessError::new(ErrorClass::Throttled, format!("{name} failed (injected)"))
                    .with_step(name),
            )
        } else {
            Ok(())
        }
    }

    /// Ends `owner`'s lease on `item_id`, applying `change` to the record; an error when
    /// the lease is not `owner`'s, or (with `payload_sha256`) the record no longer holds that
    /// payload, as the adapter's conditional write is refused
    /// ([`crate::dead_letter::LEASED_WITH_PAYLOAD`]).
    fn end_lease(
        &self,
        name: &str,
        item_id: &str,
        owner: &str,
        payload_sha256: Option<&str>,
        change: impl FnOnce(&mut DeadLetteredItem),
    ) -> Result<(), ProcessError> {
        let mut state = self.state();
        Self::check(&state, name)?;
        let lease_owner = state.leases.get(item_id).map(String::as_str);
        let holds = state.records.get(item_id).is_some_and(|r| {
            crate::dead_letter::leased_with_payload(
                r,
                lease_owner,
                owner,
                payload_sha256.unwrap_or(&r.payload.sha256),
            )
        });
        if !holds {
            return Err(ProcessError::new(
                ErrorClass::Unknown,
                format!("lease on {item_id:?} was lost"),
            )
            .with_step(name));
        }
        state.leases.remove(item_id);
        if let Some(record) = state.records.get_mut(item_id) {
            record.lease_expires_at = None;
            change(record);
        }
        Ok(())
    }
}

impl RecordStore for MemoryStore {
    async fn get(&self, item_id: &str) -> Result<Option<DeadLetteredItem>, ProcessError> {
        let state = self.state();
        Self::check(&state, "get")?;
        Ok(state.records.get(item_id).cloned())
    }

    async fn query_page(
        &self,
        filter: &RecordFilter,
        limit: i32,
        start: Option<&PageToken>,
    ) -> Result<Page, ProcessError> {
        let state = self.state();
        Self::check(&state, "query_page")?;
        let selected: Vec<&DeadLetteredItem> = state
            .records
            .values()
            .filter(|r| filter.matches(r))
            .collect();
        page_in_memory(selected, limit, start, filter.oldest_first)
    }

    fn token_after(&self, record: &DeadLetteredItem, _filter: &RecordFilter) -> PageToken {
        token_after_record(record)
    }

    async fn acquire_lease(
        &self,
        item_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, ProcessError> {
        let mut state = self.state();
        Self::check(&state, "acquire_lease")?;
        let now = self.clock.now().timestamp();
        let Some(record) = state.records.get_mut(item_id) else {
            return Ok(false);
        };
        if !crate::dead_letter::lease_is_free(record.status, record.lease_expires_at, now) {
            return Ok(false);
        }
        record.status = ItemStatus::Redriving;
        record.lease_expires_at = Some(now + i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2));
        state.leases.insert(item_id.to_string(), owner.to_string());
        Ok(true)
    }

    async fn release_lease(&self, item_id: &str, owner: &str) -> Result<(), ProcessError> {
        self.end_lease("release_lease", item_id, owner, None, |r| {
            r.status = ItemStatus::Dead;
        })
    }

    async fn resolve(&self, record: &DeadLetteredItem, owner: &str) -> Result<(), ProcessError> {
        self.end_lease(
            "resolve",
            &record.item_id,
            owner,
            Some(&record.payload.sha256),
            |r| {
                r.status = ItemStatus::Resolved;
                r.resolved_at = Some(self.clock.now());
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
        self.end_lease("mark_requeued", &record.item_id, owner, sha, |r| {
            r.status = ItemStatus::Requeued;
            r.requeued_message_id = Some(message_id.to_string());
            r.requeued_at = Some(self.clock.now());
        })
    }

    async fn record_redrive_failure(
        &self,
        item_id: &str,
        owner: &str,
        failures: &[FailureDetail],
    ) -> Result<(), ProcessError> {
        self.end_lease("record_redrive_failure", item_id, owner, None, |r| {
            r.status = ItemStatus::Dead;
            if let Some(last) = failures.last() {
                r.failure_count += u32::try_from(failures.len()).unwrap_or(u32::MAX);
                r.failure_history.extend(failures.iter().cloned());
                r.error_class = last.error_type;
                r.last_error = last.error_message.clone();
                r.last_attempt = last.timestamp;
            }
        })
    }

    async fn reopen_requeued(
        &self,
        record: &DeadLetteredItem,
        failure: &FailureDetail,
    ) -> Result<bool, ProcessError> {
        let mut state = self.state();
        Self::check(&state, "reopen_requeued")?;
        let Some(r) = state.records.get_mut(&record.item_id) else {
            return Ok(false);
        };
        if r.status != ItemStatus::Requeued || r.requeued_message_id != record.requeued_message_id {
            return Ok(false);
        }
        r.status = ItemStatus::Dead;
        r.requeued_message_id = None;
        r.failure_count += 1;
        r.failure_history.push(failure.clone());
        r.error_class = failure.error_type;
        r.last_error = failure.error_message.clone();
        r.last_attempt = failure.timestamp;
        r.reprocess_eligible = failure.error_type.is_reprocess_eligible();
        Ok(true)
    }
}

impl DeadLetterQueue for MemoryStore {
    /// Receives every visible message at once (the pass is always complete); a message is
    /// deleted when its item is resolved or requeued, or selected by a purge.
    async fn sweep(&self, options: &SweepOptions) -> Result<Sweep, ProcessError> {
        let mut state = self.state();
        Self::check(&state, "sweep")?;
        let mut sweep = Sweep {
            complete: true,
            ..Sweep::default()
        };
        let State { records, dlq, .. } = &mut *state;
        dlq.retain_mut(|message| {
            if message.held {
                return true;
            }
            sweep.seen += 1;
            let finished = records
                .get(&message.item_id)
                .is_some_and(|r| matches!(r.status, ItemStatus::Resolved | ItemStatus::Requeued));
            if finished || options.purge.contains_key(&message.item_id) {
                sweep.deleted += 1;
                return false;
            }
            message.held = true;
            sweep
                .held
                .entry(message.item_id.clone())
                .or_default()
                .push(HeldMessage {
                    receipt: message.message_id.clone(),
                    view: MessageView::of(&message.message_id, "", |_| None, ""),
                });
            true
        });
        Ok(sweep)
    }

    /// Deletes the held messages of resolved or requeued items; gives the rest back (held
    /// on when `then` is not zero).
    async fn settle_held(
        &self,
        held: BTreeMap<String, Vec<HeldMessage>>,
        _wait: Duration,
        then: Duration,
    ) -> Result<crate::sweep::Settled, ProcessError> {
        let mut state = self.state();
        Self::check(&state, "settle_held")?;
        let held: HashSet<String> = held.into_values().flatten().map(|m| m.receipt).collect();
        let State { records, dlq, .. } = &mut *state;
        let before = dlq.len();
        dlq.retain_mut(|message| {
            if !held.contains(&message.message_id) {
                return true;
            }
            message.held = !then.is_zero();
            !records
                .get(&message.item_id)
                .is_some_and(|r| matches!(r.status, ItemStatus::Resolved | ItemStatus::Requeued))
        });
        Ok(crate::sweep::Settled {
            deleted: before - dlq.len(),
            to_reopen: 0,
        })
    }
}

impl PayloadStore for MemoryStore {
    async fn fetch(&self, pointer: &S3Pointer) -> Result<String, ProcessError> {
        let state = self.state();
        Self::check(&state, "fetch")?;
        state
            .payloads
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

    async fn delete(&self, pointer: &S3Pointer) -> Result<(), ProcessError> {
        let mut state = self.state();
        Self::check(&state, "delete")?;
        state
            .payloads
            .remove(&(pointer.bucket.clone(), pointer.key.clone()));
        Ok(())
    }
}

impl SourceQueue for MemoryStore {
    async fn queue_url(&self, name: &str, account: &str) -> Result<String, ProcessError> {
        let state = self.state();
        Self::check(&state, "queue_url")?;
        Ok(format!("https://sqs.memory/{account}/{name}"))
    }

    async fn send_batch(
        &self,
        queue_url: &str,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<SendResult>, ProcessError> {
        let mut state = self.state();
        Self::check(&state, "send_batch")?;
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            let item_id = message
                .attributes
                .iter()
                .find(|(name, _)| name == ITEM_ID_ATTRIBUTE)
                .and_then(|(_, value)| value.string_value().map(str::to_string))
                .unwrap_or_default();
            if state.refused.contains(&item_id) {
                results.push(Err("InvalidParameterValue refused (injected)".to_string()));
                continue;
            }
            state.next_message += 1;
            results.push(Ok(format!("sent-{}", state.next_message)));
            state.sent.push((queue_url.to_string(), message.clone()));
        }
        Ok(results)
    }
}
