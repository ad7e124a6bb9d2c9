//! Requeue mode: items go back to their source queue. Leases are taken in transactions,
//! messages sent in batches (10 messages, 1 MiB), and each item sent is marked `requeued`
//! until the worker finishes the message. What a message carries (which attributes are
//! restored, our own set afresh, FIFO group and deduplication ids) is decided here, pure,
//! in [`outgoing_message`]; the sending goes through [`SourceQueue`](crate::ports::SourceQueue).

use std::collections::BTreeMap;

use super::engine::RedriveEngine;
use super::report::{ItemOutcome, ItemOutcomeKind};
use crate::dead_letter::{
    DeadLetteredItem, MessageAttribute, PayloadLocation, REQUEUED_BY_ATTRIBUTE,
};
use crate::error::ProcessError;
use crate::message::{
    batches_by_size, fifo_group_id, ITEM_ID_ATTRIBUTE, PAYLOAD_SHA256_ATTRIBUTE,
    RESERVED_ATTRIBUTES,
};
use crate::pointer::S3Pointer;
use crate::ports::{OutgoingMessage, RedrivePorts};
use crate::processor::Processor;

/// SQS takes 10 message attributes; ours take three, so at most seven are restored.
const RESTORED_ATTRIBUTES_MAX: usize = 7;

/// Returns the message that puts `record` back on its queue, with `body`: the record's restorable
/// attributes (not ours, at most seven), then ours (item id, the run that requeued it, the
/// payload's sha256); on a FIFO queue, the record's group (or one derived from the item
/// id) and a deduplication id unique to the item and run. It continues the record's trace
/// (`AWSTraceHeader`).
pub fn outgoing_message(
    id: String,
    record: &DeadLetteredItem,
    body: String,
    run_id: &str,
    fifo: bool,
) -> OutgoingMessage {
    let mut attributes: Vec<(String, MessageAttribute)> = record
        .source
        .message_attributes
        .iter()
        // Our own attributes are set afresh below, never copied; a binary value that an
        // older record did not keep cannot be restored, nor one that is not base64, nor a
        // text SQS refuses (a hand-built event's): it would fail the send every time.
        .filter(|(name, value)| {
            !RESERVED_ATTRIBUTES.contains(&name.as_str())
                && value.is_restorable()
                && value.string_value().is_none_or(crate::message::sqs_safe)
                && value
                    .binary_base64()
                    .is_none_or(|b| aws_smithy_types::base64::decode(b).is_ok())
        })
        .take(RESTORED_ATTRIBUTES_MAX)
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    for (name, value) in [
        (ITEM_ID_ATTRIBUTE, record.item_id.as_str()),
        (REQUEUED_BY_ATTRIBUTE, run_id),
        (PAYLOAD_SHA256_ATTRIBUTE, record.payload.sha256.as_str()),
    ] {
        attributes.push((name.to_string(), MessageAttribute::string(value)));
    }
    let (group_id, deduplication_id) = if fifo {
        (
            Some(fifo_group_id(
                record.source.message_group_id.as_deref(),
                &record.item_id,
            )),
            Some(crate::hex::sha256_hex(
                format!("{}:{run_id}", record.item_id).as_bytes(),
            )),
        )
    } else {
        // A fair queue (a standard queue whose messages name a tenant): the message goes
        // back under its tenant, so the queue keeps sharing its consumers fairly. No
        // deduplication id: a standard queue takes none. A group SQS would refuse (a
        // hand-built event's) is left off rather than fail the send.
        let group = record
            .source
            .message_group_id
            .clone()
            .filter(|g| crate::message::is_valid_message_group_id(g));
        (group, None)
    };
    OutgoingMessage {
        id,
        body,
        attributes,
        group_id,
        deduplication_id,
        trace_header: crate::trace::TraceContext::of_dead(record).map(|t| t.xray_header()),
    }
}

impl<P: Processor, S: RedrivePorts> RedriveEngine<P, S> {
    pub(super) async fn queue_url(
        &self,
        record: &DeadLetteredItem,
    ) -> Result<String, ProcessError> {
        if let Some(url) = &self.settings.source_queue_url {
            return Ok(url.clone());
        }
        let arn = record.source.queue_arn.clone().ok_or_else(|| {
            ProcessError::validation("the record names no source queue; set the source queue URL")
                .with_step("requeue")
        })?;
        if let Some(url) = self
            .queue_urls
            .lock()
            .ok()
            .and_then(|m| m.get(&arn).cloned())
        {
            return Ok(url);
        }
        let Some((account, name)) = crate::message::queue_of_arn(&arn) else {
            return Err(
                ProcessError::validation(format!("{arn:?} is not an SQS queue ARN"))
                    .with_step("requeue"),
            );
        };
        let url = self.store.queue_url(name, account).await?;
        if let Ok(mut m) = self.queue_urls.lock() {
            m.insert(arn, url.clone());
        }
        Ok(url)
    }

    /// Returns the largest message the queue at `url` takes, read once per run; SQS's classic
    /// 256 KiB when it cannot be read (a larger payload then goes as a pointer, which every
    /// queue takes).
    async fn queue_message_max(&self, url: &str) -> u64 {
        if let Some(size) = self
            .queue_sizes
            .lock()
            .ok()
            .and_then(|m| m.get(url).copied())
        {
            return size;
        }
        let size = match self.store.maximum_message_size(url).await {
            Ok(size) => size,
            Err(error) => {
                tracing::warn!(
                    queue_url = %url,
                    error = %error.loggable(),
                    "cannot read the queue's MaximumMessageSize (sqs:GetQueueAttributes); requeuing payloads over 256 KiB as pointers"
                );
                crate::ports::CLASSIC_MESSAGE_MAX
            }
        };
        if let Ok(mut m) = self.queue_sizes.lock() {
            m.insert(url.to_string(), size);
        }
        size
    }

    /// Requeues records: leases in transactions, sends in batches of 10, marks each sent
    /// item requeued.
    pub(super) async fn requeue(
        &self,
        records: &[&DeadLetteredItem],
        run_id: &str,
    ) -> Vec<ItemOutcome> {
        let mut outcomes: Vec<Option<ItemOutcome>> = vec![None; records.len()];
        let by_queue = self.lease_and_build(records, run_id, &mut outcomes).await;
        let sent = self
            .send_requeues(by_queue, records, run_id, &mut outcomes)
            .await;
        // Requeued is not resolved: the record waits for the worker to finish the message.
        for (i, message_id) in sent {
            outcomes[i] = Some(self.mark_sent(records[i], run_id, &message_id).await);
        }
        outcomes.into_iter().flatten().collect()
    }

    /// Leases the records and builds each leased one's message, by queue URL. A record not
    /// leased, or whose message cannot be built (its lease given back), gets its outcome.
    async fn lease_and_build(
        &self,
        records: &[&DeadLetteredItem],
        run_id: &str,
        outcomes: &mut [Option<ItemOutcome>],
    ) -> ByQueue {
        let ids: Vec<String> = records.iter().map(|r| r.item_id.clone()).collect();
        let leases = self
            .store
            .acquire_leases(&ids, run_id, self.settings.lease_ttl)
            .await;
        let mut by_queue = ByQueue::new();
        for (i, (record, lease)) in records.iter().zip(leases).enumerate() {
            match lease {
                Ok(true) => {}
                Ok(false) => {
                    outcomes[i] = Some(failed(record, ItemOutcomeKind::LeasedElsewhere, None));
                    continue;
                }
                Err(e) => {
                    outcomes[i] = Some(failed(record, ItemOutcomeKind::Error, Some(e.to_string())));
                    continue;
                }
            }
            match self.requeue_message(i, record, run_id).await {
                Ok((url, message)) => {
                    let size = message.size();
                    by_queue.entry(url).or_default().push((i, message, size));
                }
                Err(e) => {
                    let _ = self.store.release_lease(&record.item_id, run_id).await;
                    outcomes[i] = Some(failed(record, ItemOutcomeKind::Error, Some(e.to_string())));
                }
            }
        }
        by_queue
    }

    /// Sends the messages in batches by size, queue by queue. Returns the records sent,
    /// each with the id of its message now in the source queue; a record whose message
    /// was refused gets its outcome, its lease given back.
    async fn send_requeues(
        &self,
        by_queue: ByQueue,
        records: &[&DeadLetteredItem],
        run_id: &str,
        outcomes: &mut [Option<ItemOutcome>],
    ) -> Vec<(usize, String)> {
        let mut sent: Vec<(usize, String)> = Vec::new();
        for (url, batch) in by_queue {
            for chunk in batches_by_size(batch) {
                let messages: Vec<OutgoingMessage> = chunk.iter().map(|(_, m)| m.clone()).collect();
                let results = match self.store.send_batch(&url, &messages).await {
                    Ok(results) => results,
                    Err(error) => {
                        for (i, _) in &chunk {
                            let _ = self.store.release_lease(&records[*i].item_id, run_id).await;
                            outcomes[*i] = Some(failed(
                                records[*i],
                                ItemOutcomeKind::Error,
                                Some(error.to_string()),
                            ));
                        }
                        continue;
                    }
                };
                for (n, (i, _)) in chunk.iter().enumerate() {
                    let reason = match results.get(n) {
                        Some(Ok(message_id)) => {
                            sent.push((*i, message_id.clone()));
                            continue;
                        }
                        Some(Err(reason)) => reason.as_str(),
                        None => "no result for it",
                    };
                    let _ = self.store.release_lease(&records[*i].item_id, run_id).await;
                    let detail = format!("source queue rejected the message: {reason}");
                    outcomes[*i] = Some(failed(records[*i], ItemOutcomeKind::Error, Some(detail)));
                }
            }
        }
        sent
    }

    /// Marks a record whose message was sent as requeued, and says how that went.
    async fn mark_sent(
        &self,
        record: &DeadLetteredItem,
        run_id: &str,
        message_id: &str,
    ) -> ItemOutcome {
        let mut marked = if crate::mutants::is_on(crate::mutants::Mutant::RequeueResolvesOnSend) {
            self.store.resolve(record, run_id).await
        } else {
            self.store.mark_requeued(record, run_id, message_id).await
        };
        if marked.is_err() && self.finished_before_marked(record).await {
            // The worker finished the message while the run still held the record,
            // and resolved it (under this run's lease): nothing is left to mark.
            marked = Ok(());
        }
        match marked {
            Ok(()) => ItemOutcome {
                error_class: None,
                item_id: record.item_id.clone(),
                outcome: ItemOutcomeKind::Requeued,
                detail: Some(format!("sent to the source queue as message {message_id}")),
            },
            Err(e) => ItemOutcome {
                error_class: None,
                item_id: record.item_id.clone(),
                outcome: ItemOutcomeKind::Error,
                detail: Some(format!(
                    "requeued as message {message_id}, but the record could not be marked requeued \
                     (its lease expires and a later run may send it again): {e}"
                )),
            },
        }
    }

    /// Tells whether the record was resolved since this run leased it: the worker finished the
    /// requeued message before the run could mark the record requeued.
    async fn finished_before_marked(&self, record: &DeadLetteredItem) -> bool {
        matches!(
            self.store.get(&record.item_id).await,
            Ok(Some(now)) if now.status == crate::dead_letter::ItemStatus::Resolved
                && now.resolved_at.is_some_and(|at| at >= record.last_attempt)
        )
    }

    /// Writes the object a requeued pointer names again, so that the bucket's lifecycle
    /// (which counts from an object's last write) keeps it a whole retention from now: the
    /// message may wait in the source queue for as long as the queue keeps it.
    async fn refresh_payload(
        &self,
        pointer: &S3Pointer,
        record: &DeadLetteredItem,
    ) -> Result<(), ProcessError> {
        let body = self.store.fetch(pointer).await?;
        self.store
            .put(pointer, &body, &record.payload.sha256)
            .await
            .map_err(|e| e.with_step("requeue-refresh-payload"))
    }

    /// Returns the queue and message that put `record` back: the body inline when the queue takes
    /// it with the message's attributes (its `MaximumMessageSize`, up to 1 MiB, read once
    /// per queue; 256 KiB when it cannot be read) and SQS's character set allows it, else
    /// the S3 payload as an Extended Client pointer.
    async fn requeue_message(
        &self,
        index: usize,
        record: &DeadLetteredItem,
        run_id: &str,
    ) -> Result<(String, OutgoingMessage), ProcessError> {
        let url = self.queue_url(record).await?;
        let fifo = url.ends_with(".fifo");
        let mut message = outgoing_message(index.to_string(), record, String::new(), run_id, fifo);
        let limit = self.queue_message_max(&url).await;
        let fits = u64::try_from(message.size())
            .unwrap_or(u64::MAX)
            .saturating_add(record.payload.size_bytes)
            <= limit;
        message.body = match &record.payload.location {
            PayloadLocation::S3 { bucket, key } => {
                let pointer = S3Pointer {
                    bucket: bucket.clone(),
                    key: key.clone(),
                };
                let inline = match fits {
                    true => Some(self.load_body(record).await?),
                    false => None,
                };
                // SQS refuses a body with a character outside its set: such a payload
                // goes back as its pointer, however small.
                match inline.filter(|body| crate::message::sqs_safe(body)) {
                    Some(body) => body,
                    None => {
                        self.refresh_payload(&pointer, record).await?;
                        pointer.to_body()
                    }
                }
            }
            PayloadLocation::Inline { .. } => self.load_body(record).await?,
        };
        Ok((url, message))
    }
}

/// The messages a requeue sends, by queue URL: each with its record's index and its size
/// in bytes. In URL order, so the queues are sent to in the same order at every run and a
/// simulated world (with its faults) replays exactly.
type ByQueue = BTreeMap<String, Vec<(usize, OutgoingMessage, usize)>>;

/// Returns the outcome of `record` when it was not requeued.
fn failed(record: &DeadLetteredItem, kind: ItemOutcomeKind, detail: Option<String>) -> ItemOutcome {
    ItemOutcome {
        error_class: None,
        item_id: record.item_id.clone(),
        outcome: kind,
        detail,
    }
}
