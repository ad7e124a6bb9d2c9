//! One sweep pass over the DLQ: receive, judge each message by the rule, adopt, delete or
//! hold it, and end by the pass's deadline between two judgements.

use super::rule::unprocessed_keys;
use super::*;

/// The shortest hold of a sweep without an end: a message received at the start comes
/// back after two minutes, and the hold grows with the pass ([`hold_for`]).
pub(super) const MIN_HOLD: Duration = Duration::from_secs(120);

/// Added to a hold that must last until an instant: the settling that follows it.
const HOLD_MARGIN: Duration = Duration::from_secs(30);

/// SQS's longest visibility timeout.
pub(super) const MAX_HOLD: Duration = Duration::from_secs(43_200);

/// Returns how long a message received `elapsed` into a pass is held: until the instants the
/// caller names (plus a margin), and at least twice as long as the pass has run so far
/// (plus `MIN_HOLD`). The second bound is what ends a pass over a queue larger than one
/// hold: a message given back while the pass goes on is received again, held twice as
/// long, and so comes back at most a logarithmic number of times before the queue is seen
/// empty (a fixed hold of 120 s took over a million receives for 50,000 messages).
pub fn hold_for(elapsed: Duration, until: &[Option<Instant>], now: Instant) -> Duration {
    let growing = elapsed.saturating_mul(2).saturating_add(MIN_HOLD);
    let named = until
        .iter()
        .flatten()
        .map(|t| t.saturating_duration_since(now) + HOLD_MARGIN)
        .max()
        .unwrap_or_default();
    growing.max(named).min(MAX_HOLD)
}

/// Returns the marker of one sweep pass, carried by the copies its FIFO rotations send.
fn pass_marker(random: &crate::random::Random) -> String {
    format!("{:016x}", random.u64(..))
}

/// Makes one pass over the DLQ: receives every visible message (until `options.until`), judges
/// each once by [`decide`] (or, purging, [`purge_takes`]), deletes, adopts and reopens at
/// once, and returns the rest held (receipts and identities only) for the caller to settle
/// with [`settle_held`]. On an error it gives back what it holds before returning it. On a
/// FIFO DLQ every message it keeps is moved behind its group ([`DeadLetterQueue::rotate`]), so
/// that no held group head hides the messages after it.
pub async fn sweep_dlq<D: DeadLetterQueue + RecordStore>(
    dlq: &D,
    options: &SweepOptions,
) -> Result<Sweep, ProcessError> {
    let mut pass = Pass {
        sweep: Sweep::default(),
        receipts: BTreeMap::new(),
        views: HashMap::new(),
        judged: std::collections::HashSet::new(),
        marker: pass_marker(&options.random),
    };
    match pass.run(dlq, options).await {
        Ok(()) => Ok(pass.into_sweep()),
        Err(error) => {
            let receipts: Vec<String> = pass.receipts.into_values().collect();
            if let Err(release) = dlq.hold(&receipts, Duration::ZERO).await {
                tracing::warn!(error = %release, "could not give back the DLQ messages a failed sweep held; they come back when their hold ends");
            }
            Err(error)
        }
    }
}

/// The state of one sweep pass.
pub(super) struct Pass {
    pub(super) sweep: Sweep,
    /// Message id → latest receipt of every message held. Ordered: what the pass hands
    /// over (and gives back on an error) comes out in the same order at every run.
    pub(super) receipts: BTreeMap<String, String>,
    /// Message id → (item id, identity) of every message held.
    pub(super) views: HashMap<String, (String, MessageView)>,
    /// Messages already judged this pass (received again after their hold ended).
    pub(super) judged: std::collections::HashSet<String>,
    /// This pass's marker ([`DeadLetterQueue::rotate`]).
    pub(super) marker: String,
}

impl Pass {
    async fn run<D: DeadLetterQueue + RecordStore>(
        &mut self,
        dlq: &D,
        options: &SweepOptions,
    ) -> Result<(), ProcessError> {
        let started = Instant::now();
        loop {
            let now = Instant::now();
            if options.until.is_some_and(|until| now >= until) {
                return Ok(());
            }
            let hold = hold_for(now - started, &[options.until, options.hold_until], now);
            let messages = dlq.receive(hold, &options.parser).await?;
            if messages.is_empty() {
                // (A FIFO group behind a message that could not be moved was not seen; what
                // blocks it is given back at the end, for the next pass to move.)
                self.sweep.complete = true;
                return Ok(());
            }
            let fresh: Vec<String> = messages
                .iter()
                .filter(|m| !self.already_judged(m))
                .map(|m| m.item_id.clone())
                .collect();
            let standings = if fresh.is_empty() {
                Ok(HashMap::new())
            } else {
                dlq.standings(&fresh).await
            };
            let mut to_delete = Vec::new();
            let mut to_take = Vec::new();
            let mut to_rotate = Vec::new();
            let mut out_of_time = false;
            for received in messages {
                let id = received.view.message_id.clone();
                self.receipts.insert(id.clone(), received.receipt.clone());
                self.views.insert(
                    id.clone(),
                    (received.item_id.clone(), received.view.clone()),
                );
                if self.already_judged(&received) {
                    self.judged.insert(id);
                    continue;
                }
                // One judgement may take long (an adoption reads a payload from S3): the
                // pass ends at `until` between two, and what it did not judge stays held
                // with the rest, for the next pass (a page of ten unreadable pointers ran
                // a sweep 100 s past its end).
                out_of_time = out_of_time || options.until.is_some_and(|u| Instant::now() >= u);
                if out_of_time {
                    continue;
                }
                self.judged.insert(id.clone());
                self.sweep.seen += 1;
                match self.judge(dlq, options, &standings, &received).await? {
                    Verdict::Delete => to_delete.push((id, received.receipt)),
                    Verdict::Take => to_take.push(received),
                    Verdict::Keep => to_rotate.push(received),
                }
            }
            self.carry_out(dlq, options, to_delete, to_take, to_rotate)
                .await?;
            if out_of_time {
                return Ok(());
            }
        }
    }

    /// Carries out a page's verdicts: the records of what a purge takes are removed (a
    /// message whose record was kept is kept too), then the messages to delete are
    /// deleted, and a FIFO DLQ's kept messages rotated behind the marker.
    async fn carry_out<D: DeadLetterQueue + RecordStore>(
        &mut self,
        dlq: &D,
        options: &SweepOptions,
        mut to_delete: Vec<(String, String)>,
        to_take: Vec<ReceivedMessage<D::Message>>,
        mut to_rotate: Vec<ReceivedMessage<D::Message>>,
    ) -> Result<(), ProcessError> {
        self.remove_records_of(dlq, options, &to_take).await?;
        for received in to_take {
            if self.sweep.removed.contains(&received.item_id) {
                to_delete.push((received.view.message_id.clone(), received.receipt));
            } else {
                to_rotate.push(received);
            }
        }
        let receipts: Vec<String> = to_delete.iter().map(|(_, r)| r.clone()).collect();
        // Forgotten only once deleted: a failed delete leaves them held, and the error
        // path gives them back.
        self.sweep.deleted += dlq.delete_messages(&receipts).await?;
        for (id, _) in &to_delete {
            self.forget(id);
        }
        if dlq.is_fifo() {
            for received in to_rotate {
                self.rotate(dlq, &received).await;
            }
        }
        Ok(())
    }

    /// Tells whether `received` was judged earlier in this pass: received again after its hold
    /// ended, or a copy this pass's rotation sent.
    pub(super) fn already_judged<M>(&self, received: &ReceivedMessage<M>) -> bool {
        self.judged.contains(&received.view.message_id)
            || received.marker.as_deref() == Some(self.marker.as_str())
    }

    fn forget(&mut self, message_id: &str) {
        self.receipts.remove(message_id);
        self.views.remove(message_id);
    }

    async fn judge<D: DeadLetterQueue + RecordStore>(
        &mut self,
        dlq: &D,
        options: &SweepOptions,
        standings: &Result<HashMap<String, Standing>, ProcessError>,
        received: &ReceivedMessage<D::Message>,
    ) -> Result<Verdict, ProcessError> {
        let item_id = &received.item_id;
        if options.purge.contains_key(item_id)
            && sent_since_snapshot(options, received)
            && !crate::mutants::is_on(crate::mutants::Mutant::ClearDatesByLastAttemptOnly)
        {
            // A clear's selected record whose message came after its snapshot: the failure
            // was recorded since, though its attempt began before. Record and message stay.
            if !self.sweep.removed.contains(item_id) {
                self.sweep.changed.insert(item_id.clone());
            }
            return Ok(Verdict::Keep);
        }
        if let Some(selected) = options.purge.get(item_id) {
            // Taken only once its record is deleted on the condition that it is still as
            // selected ([`Pass::take`]): one condition decides both.
            if crate::mutants::is_on(crate::mutants::Mutant::PurgeByItemId) {
                return Ok(Verdict::Take);
            }
            return Ok(if purge_takes(&received.view, &selected.standing) {
                Verdict::Take
            } else {
                Verdict::Keep
            });
        }
        let standing = match standings {
            Ok(found) => found.get(item_id),
            Err(error) => {
                self.sweep.errors.push((item_id.clone(), error.to_string()));
                return Ok(Verdict::Keep);
            }
        };
        let cleared = sent_here(received)
            && options
                .orphans_sent_before_ms
                .is_some_and(|before| received.sent_at_ms.is_some_and(|sent| sent < before));
        if cleared && standing.is_none_or(|s| s.status.is_none()) {
            return Ok(Verdict::Delete);
        }
        Ok(match decide(&received.view, standing) {
            MessageFate::Delete => Verdict::Delete,
            MessageFate::Keep => Verdict::Keep,
            MessageFate::Adopt | MessageFate::Reopen(_) if !options.adopt => Verdict::Keep,
            fate @ (MessageFate::Adopt | MessageFate::Reopen(_)) => {
                self.adopt(dlq, options, received, fate, standing).await?;
                Verdict::Keep
            }
        })
    }

    /// Records a DLQ message no record holds (`fate` adopt), or reopens the record that no
    /// longer holds it (`fate` reopen), on the condition that the record is still as
    /// judged. A message that cannot be recorded is counted among the sweep's errors and
    /// left in the DLQ.
    async fn adopt<D: DeadLetterQueue + RecordStore>(
        &mut self,
        dlq: &D,
        options: &SweepOptions,
        received: &ReceivedMessage<D::Message>,
        fate: MessageFate,
        standing: Option<&Standing>,
    ) -> Result<(), ProcessError> {
        let item_id = &received.item_id;
        let adoption = Adoption {
            reason: match fate {
                MessageFate::Reopen(reason) => reason,
                _ => "exceeded maxReceiveCount without a recorded failure (moved by the queue's redrive policy)",
            },
            reopen: matches!(fate, MessageFate::Reopen(_)),
            known_queue_arn: standing.and_then(|s| s.source_queue_arn.clone()),
            expected_status: standing.and_then(|s| s.status),
            message_keys: unprocessed_keys(&received.view, standing),
        };
        match dlq
            .adopt(&received.message, item_id, &options.parser, &adoption)
            .await
        {
            Ok(Some(_)) => self.sweep.adopted += 1,
            Ok(None) => {
                tracing::info!(item_id = %item_id, "the record changed while its DLQ message was judged; the next sweep judges it again");
            }
            Err(error)
                if crate::mutants::is_on(crate::mutants::Mutant::PoisonMessageAbortsSweep) =>
            {
                return Err(error);
            }
            Err(error) => {
                tracing::warn!(item_id = %item_id, error = %error, "DLQ message could not be recorded; left in the DLQ");
                self.sweep.errors.push((item_id.clone(), error.to_string()));
            }
        }
        Ok(())
    }

    /// Deletes the selected records of `taken`'s items not decided yet, each on the
    /// condition that it is still as selected. A record deleted lets its messages go; one
    /// that changed keeps them (a redrive failed it again since the selection).
    async fn remove_records_of<D: DeadLetterQueue + RecordStore>(
        &mut self,
        dlq: &D,
        options: &SweepOptions,
        taken: &[ReceivedMessage<D::Message>],
    ) -> Result<(), ProcessError> {
        let mut undecided: Vec<Selected> = Vec::new();
        for received in taken {
            let id = &received.item_id;
            let decided = self.sweep.removed.contains(id) || self.sweep.changed.contains(id);
            if decided || undecided.iter().any(|s| &s.item_id == id) {
                continue;
            }
            if let Some(selected) = options.purge.get(id) {
                undecided.push(selected.clone());
            }
        }
        for chunk in undecided.chunks(crate::removal::DELETE_CHUNK) {
            let deleted = dlq.delete_records(chunk).await?;
            for selected in chunk {
                if deleted.contains(&selected.item_id)
                    || crate::mutants::is_on(
                        crate::mutants::Mutant::PurgeTakesMessagesOfKeptRecords,
                    )
                {
                    self.sweep.removed.insert(selected.item_id.clone());
                } else {
                    self.sweep.changed.insert(selected.item_id.clone());
                }
            }
        }
        Ok(())
    }

    /// Moves a kept message of a FIFO DLQ behind its group; a failure leaves it held where
    /// it is (the pass goes on; that group's later messages wait for the next pass).
    async fn rotate<D: DeadLetterQueue>(
        &mut self,
        dlq: &D,
        received: &ReceivedMessage<D::Message>,
    ) {
        match dlq
            .rotate(&received.message, &received.receipt, &self.marker)
            .await
        {
            Ok(true) => {
                self.forget(&received.view.message_id);
                self.sweep.rotated += 1;
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(item_id = %received.item_id, error = %error, "could not move a FIFO DLQ message behind its group; its group's later messages wait for the next sweep");
            }
        }
    }

    fn into_sweep(self) -> Sweep {
        let mut sweep = self.sweep;
        for (message_id, receipt) in self.receipts {
            if let Some((item_id, view)) = self.views.get(&message_id) {
                sweep
                    .held
                    .entry(item_id.clone())
                    .or_default()
                    .push(HeldMessage {
                        receipt,
                        view: view.clone(),
                    });
            }
        }
        sweep
    }
}

/// What a pass does with one message it judged.
enum Verdict {
    Delete,
    /// A purge's: deleted once its record is ([`Pass::remove_records_of`]), else kept.
    Take,
    Keep,
}

/// Tells whether `received` was sent to the DLQ itself, so that its `SentTimestamp` dates it: a
/// dead-letter's message or a rotated copy (each names a source message of its own). One
/// the queue's redrive policy moved keeps its source queue's, and may have arrived after.
fn sent_here<M>(received: &ReceivedMessage<M>) -> bool {
    received.view.source_message_id != received.view.message_id
}

/// Tells whether `received` was sent to the DLQ at or after a clear's snapshot
/// ([`SweepOptions::orphans_sent_before_ms`]).
fn sent_since_snapshot<M>(options: &SweepOptions, received: &ReceivedMessage<M>) -> bool {
    sent_here(received)
        && options
            .orphans_sent_before_ms
            .is_some_and(|before| received.sent_at_ms.is_some_and(|sent| sent >= before))
}
