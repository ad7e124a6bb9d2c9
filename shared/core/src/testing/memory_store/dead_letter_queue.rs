//! [`DeadLetterQueue`] over the world's DLQ: the batched dead-letter send, and the sweep's
//! receive, adopt, delete, hold and rotate, as the SQS adapter makes them
//! (`shared/aws/src/store/dlq_messages.rs`).

use super::*;

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
            let (body, attributes) = dlq_message(record);
            if let Some(error) = super::super::queue::refused_contents(&body, &attributes) {
                let event = Event::ContentsRefused {
                    item: &record.item_id,
                    call: "send_to_dlq",
                };
                state.observe(&self.actor, &event);
                results.push(Err(error.with_step("dlq")));
                continue;
            }
            state.observe(&self.actor, &Event::DeadLetterSending { record });
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
            .map(|m| ReceivedMessage {
                receipt: m.receipt.clone().unwrap_or_default(),
                item_id: self.tracked_item_id(&mut state, &m, parser, arn.as_deref()),
                view: self.view_of(&m),
                marker: m.marker.clone(),
                sent_at_ms: Some(m.sent_at_ms),
                message: m,
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
            let attributes = self.copy_attributes(&mut state, message)?;
            let now_ms = self.world.now_ms();
            let id = state
                .dlq
                .send(message.body.clone(), attributes, Some(group), now_ms);
            state.dlq.mark(&id, pass);
            let what = format!(
                "rotated DLQ message {} behind its group as {id}",
                message.id
            );
            state.step(&self.actor, &message.item_id(), &what);
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

impl<X: Send + 'static> MemoryStore<X> {
    /// Returns the attributes of `message`'s rotated copy, refused as SQS refuses them: what the
    /// copy adds ([`rotation_attributes`]) replaces the original's (a producer's
    /// `source_message_id`), each only while the copy stays within the queue's size.
    fn copy_attributes(
        &self,
        state: &mut WorldState<X>,
        message: &QueueMessage,
    ) -> Result<Vec<(String, MessageAttribute)>, ProcessError> {
        let added = rotation_attributes(message);
        let mut attributes: Vec<_> = message
            .attributes
            .iter()
            .filter(|(name, _)| added.iter().all(|(new, _)| new != name))
            .cloned()
            .collect();
        let size = crate::message::message_size(&message.body, &attributes);
        let added = crate::message::fitting_additions(size, added, state.dlq.max_message_bytes);
        attributes.extend(added);
        if let Some(error) = super::super::queue::refused_contents(&message.body, &attributes) {
            let item = message.item_id();
            let event = Event::ContentsRefused {
                item: &item,
                call: "rotate",
            };
            state.observe(&self.actor, &event);
            return Err(error.with_step("dlq-rotate"));
        }
        // SQS refuses a message over the queue's size, attributes included.
        if crate::message::message_size(&message.body, &attributes) > state.dlq.max_message_bytes {
            return Err(ProcessError::new(
                ErrorClass::Validation,
                "InvalidParameterValue: the message is larger than the queue's MaximumMessageSize",
            )
            .with_step("dlq-rotate"));
        }
        Ok(attributes)
    }

    /// Returns the item a received DLQ message is tracked by, as the adapter tracks it
    /// (`DeadLetterStore::tracked_item_id`): a pointer without our `item_id` attribute
    /// names its item in the payload, read here (an S3 call that may fail; the message id
    /// then). A rotated copy is read as its original: under the original's id.
    fn tracked_item_id(
        &self,
        state: &mut WorldState<X>,
        m: &QueueMessage,
        parser: &ItemParser,
        arn: Option<&str>,
    ) -> String {
        let mut readable = m.to_sqs_message(arn);
        let pointer = Some(&m.body)
            .filter(|_| m.attribute(ITEM_ID_ATTRIBUTE).is_none())
            .and_then(|body| self.policy.pointer_in(body))
            .and_then(Result::ok);
        if let Some(pointer) = pointer {
            let unavailable = "sweep payload read: S3 unavailable";
            if !self.call_fails(state, |f| f.bucket, "-", unavailable) {
                if let Some(payload) = state.bucket.get(&(pointer.bucket, pointer.key)) {
                    readable.body = Some(payload.clone());
                }
            }
        }
        let original = crate::message::original_message_id(
            |name| m.attribute(name),
            &m.id,
            m.marker.is_some(),
        );
        let named = parser.parse(original.clone(), readable).ok();
        crate::message::dlq_item_id(
            |name| m.attribute(name),
            named.map(|i| i.item_id),
            &original,
        )
    }
}

/// Returns the attributes a rotated copy adds to `message`'s own, most needed first: what
/// identifies the content (its source message id), then what tracks it (the source queue
/// it was moved from).
fn rotation_attributes(message: &QueueMessage) -> Vec<(String, MessageAttribute)> {
    let has = |name: &str| message.attribute(name).is_some();
    let source = crate::message::original_message_id(
        |name| message.attribute(name),
        &message.id,
        message.marker.is_some(),
    );
    let mut added: Vec<(String, MessageAttribute)> = Vec::new();
    if message.attribute(SOURCE_MESSAGE_ID_ATTRIBUTE) != Some(source.as_str()) {
        added.push((
            SOURCE_MESSAGE_ID_ATTRIBUTE.to_string(),
            MessageAttribute::string(&source),
        ));
    }
    if let Some(from) = &message.moved_from {
        if !has(crate::message::SOURCE_QUEUE_ARN_ATTRIBUTE) {
            added.push((
                crate::message::SOURCE_QUEUE_ARN_ATTRIBUTE.to_string(),
                MessageAttribute::string(from),
            ));
        }
    }
    added
}
