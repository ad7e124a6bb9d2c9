//! [`RecordStore`] over the world's table: the DynamoDB adapter's reads and conditional
//! writes (`shared/aws/src/store/record_store.rs`), each one atomic step of the world.

use super::*;
use crate::ports::Written;

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
        claim: Option<&crate::dead_letter::DlqClaim>,
        expect: Expect,
    ) -> Result<Option<Written>, ProcessError> {
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
        let mut row = upserted_row(existing, record);
        state.observe(
            &self.actor,
            &Event::Appending {
                item: id,
                attempt_ids: &attempt_ids,
            },
        );
        // Bounded as the DynamoDB adapter writes every entry (`schema::history_to_attr`).
        row.record
            .failure_history
            .extend(pending.iter().map(FailureDetail::bounded));
        row.record.failure_count += u32::try_from(pending.len()).unwrap_or(u32::MAX);
        row.attempt_ids
            .extend(pending.iter().map(|f| f.attempt_id.clone()));
        if let Some(claim) = claim {
            row.claims.insert(claim.element());
        }
        let stored = written(&row);
        self.put_row(&mut state, id, row)?;
        if let Some(claim) = claim.filter(|c| c.is_held_later(&stored.claims)) {
            state.observe(&self.actor, &Event::ClaimSuperseded { item: id, claim });
        }
        // The write landed, whatever its caller hears of it.
        self.tell_recorded(&mut state, record, pending.len(), claim.is_some());
        // A write that landed and whose answer was lost (a timeout after DynamoDB applied
        // it): the caller sees a failure it must not take for "not written".
        if self.call_fails(
            &mut state,
            |f| f.table / 4.0,
            id,
            "record: the write landed, its answer was lost",
        ) {
            return Err(ProcessError::new(
                ErrorClass::Timeout,
                "record: the write landed, its answer was lost (injected)",
            )
            .with_step("record"));
        }
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
        if !row.satisfies(&conditions::compacts(stored)) {
            return Ok(());
        }
        if let Some(why) = malformed_sets(compaction) {
            state.observe(
                &self.actor,
                &Event::WriteMalformed {
                    item: id,
                    what: why,
                },
            );
            return Err(ProcessError::new(
                ErrorClass::Validation,
                format!("ValidationException: {why}"),
            )
            .with_step("compact-history"));
        }
        row.record.failure_history = compaction.history.clone();
        row.attempt_ids = compaction.attempt_ids.iter().cloned().collect();
        for dropped in &compaction.dropped_claims {
            row.claims.remove(dropped);
        }
        if let Some(list) = &compaction.forgotten_sent {
            row.forgotten_sent.clone_from(list);
        }
        for unmarked in &compaction.unmarked {
            row.sent.remove(unmarked);
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

    async fn release_claim(
        &self,
        item_id: &str,
        claim: &crate::dead_letter::DlqClaim,
    ) -> Result<(), ProcessError> {
        self.latency("release_claim").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "release_claim", "release-claim")?;
        if let Some(row) = state.table.get_mut(item_id) {
            row.claims.remove(&claim.element());
        }
        state.step(
            &self.actor,
            item_id,
            &format!(
                "released the claim of {} at receive {}",
                claim.message_id, claim.receive_count
            ),
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
            conditions::leased_by(owner),
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
            conditions::leased_with_payload(owner, &record.payload.sha256),
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
        let sha = record.payload.sha256.as_str();
        let now = self.now();
        self.end_lease(
            "mark_requeued",
            "mark-requeued",
            &record.item_id,
            conditions::leased_with_payload(owner, sha),
            |row| {
                row.record.status = ItemStatus::Requeued;
                row.record.requeued_message_id = Some(message_id.to_string());
                row.record.requeued_at = Some(now);
                row.record.expires_at =
                    crate::redrive::expiry_when_requeued(row.record.expires_at, now);
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
            conditions::still_redriving(owner),
            |row| {
                let r = &mut row.record;
                r.status = ItemStatus::Dead;
                r.last_attempt = last.timestamp;
                r.error_class = last.error_type;
                r.error_signature =
                    crate::signature::error_signature(last.error_type, &last.error_message);
                r.last_error = last.error_message.clone();
                r.reprocess_eligible = last.error_type.is_reprocess_eligible();
                r.failure_history
                    .extend(failures.iter().map(FailureDetail::bounded));
                r.failure_count += u32::try_from(failures.len()).unwrap_or(u32::MAX);
                row.attempt_ids
                    .extend(failures.iter().map(|f| f.attempt_id.clone()));
                stored = Some(written(row));
            },
        )?;
        match stored {
            Some(stored) => recording::after_append(self, &self.settings, &stored).await,
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
            r.failure_history.push(failure.bounded());
            r.failure_count += 1;
            r.expires_at = crate::redrive::expiry_when_reopened(
                r.expires_at,
                self.world.clock.now(),
                self.settings.retention,
            );
            row.attempt_ids.insert(failure.attempt_id.clone());
            let stored = written(&row);
            self.put_row(&mut state, &record.item_id, row)?;
            state.step(
                &self.actor,
                &record.item_id,
                "reopened: the requeued message outlived its queue",
            );
            stored
        };
        recording::after_append(self, &self.settings, &stored).await?;
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

    async fn delete_records(&self, selected: &[Selected]) -> Result<Vec<String>, ProcessError> {
        self.latency("delete_records").await;
        let mut state = self.world.lock();
        self.table_call(&mut state, "delete_records", "delete-records")?;
        let mut deleted = Vec::new();
        for selected in selected {
            let id = &selected.item_id;
            let condition = selected.condition();
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

/// Returns the row a record write leaves before its attempts are appended: what the adapter's
/// update sets on an `existing` row, or a new row of `record` with an empty history.
/// `row` as a write that returns the whole item leaves it (DynamoDB's `ALL_NEW`).
fn written(row: &Row) -> Written {
    Written {
        record: row.record.clone(),
        attempt_ids: row.attempt_ids.iter().cloned().collect(),
        claims: row.claims.iter().cloned().collect(),
        sent: row.sent.iter().cloned().collect(),
        forgotten_sent: Some(row.forgotten_sent.clone()),
    }
}

fn upserted_row(existing: Option<Row>, record: &DeadLetteredItem) -> Row {
    match existing {
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
    }
}

impl<X: Send + 'static> MemoryStore<X> {
    /// Tells the observer and the step log that `appended` attempts of `record`'s message
    /// were recorded, `claimed` its DLQ message or not.
    fn tell_recorded(
        &self,
        state: &mut WorldState<X>,
        record: &DeadLetteredItem,
        appended: usize,
        claimed: bool,
    ) {
        state.observe(
            &self.actor,
            &Event::Recorded {
                item: &record.item_id,
                message_id: &record.source.message_id,
                claimed,
            },
        );
        let claiming = if claimed {
            ", claiming its DLQ message"
        } else {
            ""
        };
        let what = format!(
            "recorded {} attempt(s) of message {}{claiming}",
            appended, record.source.message_id
        );
        state.step(&self.actor, &record.item_id, &what);
    }
}

/// Why DynamoDB would refuse `compaction`'s string sets, if it would: a set that holds an
/// element twice, or the attempt ids' set empty (the other sets are sent only when not
/// empty).
fn malformed_sets(compaction: &Compaction) -> Option<&'static str> {
    let sets = [
        &compaction.attempt_ids,
        &compaction.unmarked,
        &compaction.dropped_claims,
    ];
    let duplicated = sets.iter().any(|set| {
        let distinct: std::collections::BTreeSet<&String> = set.iter().collect();
        distinct.len() != set.len()
    });
    if duplicated {
        Some("compaction: a string set holds an element twice")
    } else if compaction.attempt_ids.is_empty() {
        Some("compaction: an empty string set of attempt ids")
    } else {
        None
    }
}
