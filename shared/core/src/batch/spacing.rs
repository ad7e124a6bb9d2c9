//! Spaced redelivery and the receive budget: how long each record going back is hidden
//! (`ChangeMessageVisibility`, capped by the 12 hours from its receive and by what is left
//! of its retention), what the queue's timing is (read once per queue), and whether a
//! record is on its last receive (docs/ARCHITECTURE.md §1.1, §1.11).

use super::*;

impl<P: Processor, S: DeadLetterSink> BatchProcessor<P, S> {
    /// Hides the records going back to the queue for their redelivery delay
    /// (`crate::redelivery`), bounded by the deadline's hard stop. A record that cannot be
    /// hidden is still reported, and comes back after the queue's visibility timeout.
    pub(super) async fn space_redeliveries(
        &self,
        reports: &[RecordReport],
        handles: &HashMap<String, Handle>,
        deadline: &Deadline,
        received: tokio::time::Instant,
    ) {
        let Some((policy, port)) = &self.redelivery else {
            return;
        };
        let plan = self.plan_hides(policy, reports, handles, received);
        if plan.firsts.is_empty() {
            return;
        }
        let first_call = tokio::time::Instant::now();
        let mut results = self.hide_until(port.as_ref(), &plan.firsts, deadline).await;
        let mut tried = plan.firsts.len();
        // The later records' hides count from the second call: what the first took comes
        // off them, so none ends after its group's first does, nor past the caps (12 h
        // from the receive, the retention) computed before the first call.
        let took = first_call.elapsed();
        let followers: Vec<crate::redelivery::Hide> = plan
            .followers
            .into_iter()
            .filter(|(first, _)| matches!(results.get(*first), Some(Ok(()))))
            .map(|(_, mut hide)| {
                hide.delay = hide.delay.saturating_sub(took);
                hide
            })
            .collect();
        if !followers.is_empty() {
            tried += followers.len();
            results.extend(self.hide_until(port.as_ref(), &followers, deadline).await);
        }
        log_hides(&results, tried);
    }

    /// Returns the hides of the records going back: each record's delay, capped by the 12 hours
    /// from its receive and by what is left of its retention.
    ///
    /// FIFO: no record of a message group going back is hidden longer than the group's
    /// first. A group with a message in flight yields nothing, so one hidden longer (or
    /// left in flight for the rest of its visibility timeout) would hold the whole group,
    /// its first record included, past that record's delay and even its retention
    /// (docs/ARCHITECTURE.md §1.6).
    ///
    /// A later record of a group is hidden only once the group's first is: were the
    /// first's hide to fail (or the first to have no receipt handle), the first comes back
    /// after its visibility timeout, and a later record hidden for the first's intended
    /// delay would hold it past that (and past its retention), so it is left to come back
    /// with the first. A group is a queue's: the same group id on two queues is two groups.
    fn plan_hides(
        &self,
        policy: &crate::redelivery::RedeliveryPolicy,
        reports: &[RecordReport],
        handles: &HashMap<String, Handle>,
        received: tokio::time::Instant,
    ) -> HidePlan {
        // SQS refuses a visibility timeout reaching past 12 hours from the message's
        // receive, not from the change: what the receive and the batching window before
        // the invocation may have used, and this invocation so far, come off the cap.
        let longest = crate::redelivery::longest_hide(received.elapsed());
        let now = self.config.retry.clock.system_time();
        let mut plan = HidePlan::default();
        let mut first_of_group: HashMap<(&str, &str), Option<(usize, Duration)>> = HashMap::new();
        for r in reports.iter().filter(|r| goes_back(&r.disposition)) {
            let Some(handle) = handles.get(&r.message_id) else {
                continue;
            };
            let group = handle
                .fifo_group
                .as_deref()
                .filter(|_| !crate::mutants::is_on(crate::mutants::Mutant::FifoHidesWholeGroup))
                .map(|g| (handle.queue_arn.as_str(), g));
            let Some(receipt_handle) = handle.receipt_handle.clone() else {
                if let Some(group) = group {
                    first_of_group.entry(group).or_insert(None);
                }
                continue;
            };
            let delay = self.redelivery_delay(policy, r, handle, now).min(longest);
            let hide = |delay| crate::redelivery::Hide {
                queue_arn: handle.queue_arn.clone(),
                receipt_handle,
                delay,
            };
            match group {
                Some(group) => match first_of_group.get(&group) {
                    Some(Some((first, cap))) => {
                        plan.followers.push((*first, hide(delay.min(*cap))));
                    }
                    // Its group's first cannot be hidden: left to come back with it.
                    Some(None) => {}
                    None => {
                        first_of_group.insert(group, Some((plan.firsts.len(), delay)));
                        plan.firsts.push(hide(delay));
                    }
                },
                None => plan.firsts.push(hide(delay)),
            }
        }
        plan
    }

    /// Returns a record's redelivery delay by the policy (its `Retry-After` included), never past
    /// what is left of the message's retention less a visibility timeout for its next
    /// delivery: a message that expires while hidden is gone without a trace.
    fn redelivery_delay(
        &self,
        policy: &crate::redelivery::RedeliveryPolicy,
        report: &RecordReport,
        handle: &Handle,
        now: std::time::SystemTime,
    ) -> Duration {
        // Whole seconds down: SQS rounds a hide up to whole seconds.
        let within_retention = self
            .retry_room(Some(&handle.queue_arn), handle.sent, now)
            .map_or(Duration::MAX, |room| Duration::from_secs(room.as_secs()));
        let retry_after = report
            .retry_after
            .filter(|_| !crate::mutants::is_on(crate::mutants::Mutant::RetryAfterIgnored));
        policy
            .delay(
                handle.receive_count,
                retry_after,
                self.config.retry.random.f64(),
            )
            .min(within_retention)
    }

    /// Sends one `ChangeMessageVisibilityBatch` (per queue, by the port), bounded by the
    /// deadline's hard stop: a call cut there counts as no record hidden.
    async fn hide_until(
        &self,
        port: &dyn crate::redelivery::VisibilityPort,
        hides: &[crate::redelivery::Hide],
        deadline: &Deadline,
    ) -> Vec<Result<(), ProcessError>> {
        tokio::time::timeout_at(deadline.hard_stop(), port.hide(hides))
            .await
            .unwrap_or_default()
    }

    /// `timing` with the sweep's reserve counted in the visibility timeout, on a queue the
    /// breaker's control may pause. A record there needs room for a sweep besides its next
    /// delivery.
    fn reserving_a_sweep(
        &self,
        timing: crate::redelivery::QueueTiming,
    ) -> crate::redelivery::QueueTiming {
        if self.sweep_reserve && crate::polling::pausable(timing.retention) {
            crate::redelivery::QueueTiming {
                visibility_timeout: timing.visibility_timeout
                    + crate::polling::sweep_reserve(timing.retention),
                ..timing
            }
        } else {
            timing
        }
    }

    /// Warns, once per sandbox, when the spacing of the queue's receives outlasts its
    /// retention. CloudFormation cannot compare numbers, so a template cannot refuse it.
    /// Nothing is lost either way: hides are capped, and a message with no room left is
    /// dead-lettered. But the receive budget cannot be spent.
    fn warn_if_spacing_outlasts_retention(
        &self,
        policy: &crate::redelivery::RedeliveryPolicy,
        timing: &crate::redelivery::QueueTiming,
    ) {
        let Some(receives) = self.config.max_receive_count else {
            return;
        };
        let span = policy.least_span(receives);
        if span + timing.visibility_timeout > timing.retention {
            tracing::warn!(
                receives,
                spacing_hours = span.as_secs() / 3600,
                retention_hours = timing.retention.as_secs() / 3600,
                "the redelivery spacing of the queue's receives outlasts its retention: messages still failing near the end of their retention are dead-lettered (reason retention_ending) before their receives are spent"
            );
        }
    }

    /// Reads the source queue's retention and visibility timeout once (when redeliveries
    /// are spaced), bounded by the cut-off; a queue that cannot be read is tried again by
    /// the next batch, and its hides meanwhile are capped by SQS's limits only.
    pub(super) async fn learn_queue_timing(&self, queue_arn: &str, deadline: &Deadline) {
        let (policy, port) = match (&self.redelivery, &self.timing_port) {
            (Some((policy, port)), _) => (Some(policy), port),
            (None, Some(port)) => (None, port),
            (None, None) => return,
        };
        let now = tokio::time::Instant::now();
        let known = self
            .queue_timings
            .lock()
            .is_ok_and(|t| match t.get(queue_arn) {
                Some(QueueTimingRead::Known(_)) => true,
                Some(QueueTimingRead::Unknown { retry_at }) => now < *retry_at,
                None => false,
            });
        if known {
            return;
        }
        let bound = (now + QUEUE_TIMING_READ).min(deadline.cutoff());
        let read = tokio::time::timeout_at(bound, port.queue_timing(queue_arn)).await;
        match read {
            Ok(Some(timing)) => {
                let timing = self.reserving_a_sweep(timing);
                if let Some(policy) = policy {
                    self.warn_if_spacing_outlasts_retention(policy, &timing);
                }
                if let Ok(mut timings) = self.queue_timings.lock() {
                    timings.insert(queue_arn.to_string(), QueueTimingRead::Known(timing));
                }
            }
            _ => {
                let Ok(mut timings) = self.queue_timings.lock() else {
                    return;
                };
                // Another invocation of this sandbox may have read it meanwhile (Managed
                // Instances run several at once): what it learnt stays.
                if matches!(timings.get(queue_arn), Some(QueueTimingRead::Known(_)))
                    && !crate::mutants::is_on(crate::mutants::Mutant::TimingForgotten)
                {
                    return;
                }
                tracing::warn!(
                    retry_secs = QUEUE_TIMING_RETRY.as_secs(),
                    "the source queue's retention could not be read; redelivery delays are not capped by it until it is"
                );
                timings.insert(
                    queue_arn.to_string(),
                    QueueTimingRead::Unknown {
                        retry_at: tokio::time::Instant::now() + QUEUE_TIMING_RETRY,
                    },
                );
            }
        }
    }

    pub(super) fn queue_timing(
        &self,
        queue_arn: Option<&str>,
    ) -> Option<crate::redelivery::QueueTiming> {
        let timings = self.queue_timings.lock().ok()?;
        match timings.get(queue_arn?)? {
            QueueTimingRead::Known(timing) => Some(*timing),
            QueueTimingRead::Unknown { .. } => None,
        }
    }

    /// Returns how long a record of `queue_arn` sent at `sent` may be hidden `now` and still be
    /// delivered once more before it expires (`crate::redelivery::retry_room`): `None`
    /// when unknown (redeliveries not spaced, the queue's retention unread, no
    /// `SentTimestamp`), `Some(ZERO)` when there is no room.
    pub(super) fn retry_room(
        &self,
        queue_arn: Option<&str>,
        sent: Option<std::time::SystemTime>,
        now: std::time::SystemTime,
    ) -> Option<Duration> {
        if crate::mutants::is_on(crate::mutants::Mutant::RetentionIgnored) {
            return None;
        }
        let timing = self.queue_timing(queue_arn)?;
        Some(crate::redelivery::retry_room(sent?, &timing, now).unwrap_or(Duration::ZERO))
    }

    /// Tells whether a record returned by this invocation could not be delivered again before its
    /// retention ends: it is then dead-lettered, never left to expire while hidden
    /// (docs/ARCHITECTURE.md §1.11). Judged at the hard stop, the latest the batch answers
    /// (the rest of the batch may run on after this record ended).
    pub(super) fn retention_ending(
        &self,
        queue_arn: Option<&str>,
        sent: Option<std::time::SystemTime>,
        deadline: &Deadline,
    ) -> bool {
        let until_answer = deadline
            .hard_stop()
            .saturating_duration_since(tokio::time::Instant::now());
        let now = self.config.retry.clock.system_time() + until_answer;
        if crate::mutants::is_on(crate::mutants::Mutant::RetentionIgnored) {
            return false;
        }
        match (self.queue_timing(queue_arn), sent) {
            (Some(timing), Some(sent)) => {
                crate::redelivery::retry_room(sent, &timing, now).is_none()
            }
            _ => false,
        }
    }

    /// Tells whether this delivery is the last one SQS will make before its redrive policy moves
    /// the message (less the configured margin).
    pub(super) fn receive_budget_spent(&self, receive_count: u32) -> bool {
        self.config.max_receive_count.is_some_and(|max| {
            receive_count >= max.saturating_sub(self.config.receive_budget_margin).max(1)
        })
    }
}

/// Returns a record's `SentTimestamp` attribute (epoch milliseconds) as a time; `None` when absent
/// or out of range.
pub(super) fn sent_time(attribute: Option<&str>) -> Option<std::time::SystemTime> {
    let millis = attribute?.parse::<u64>().ok()?;
    std::time::UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

/// The hides of one batch: the records hidden in the first call (standard records and
/// each FIFO group's first), and the later records of each group, with the index of their
/// group's first in that call.
#[derive(Default)]
struct HidePlan {
    firsts: Vec<crate::redelivery::Hide>,
    followers: Vec<(usize, crate::redelivery::Hide)>,
}

/// Tells whether a record with `disposition` goes back to the queue (and so is hidden).
fn goes_back(disposition: &Disposition) -> bool {
    matches!(
        disposition,
        Disposition::RetryLater { .. }
            | Disposition::DeadLetterFailed { .. }
            | Disposition::NotStarted { .. }
    )
}

/// Says how many of the `tried` records were hidden, and why the others were not.
pub(super) fn log_hides(results: &[Result<(), ProcessError>], tried: usize) {
    let hidden = results.iter().filter(|r| r.is_ok()).count();
    if hidden < tried {
        let error = results.iter().find_map(|r| r.as_ref().err());
        tracing::warn!(
            hidden,
            returned = tried,
            error = %error.map_or_else(|| "cut at the deadline's hard stop".to_string(), ToString::to_string),
            "some records going back to the queue could not be hidden for their redelivery delay; they come back after the queue's visibility timeout"
        );
    } else {
        tracing::info!(
            hidden,
            "records going back to the queue hidden for their redelivery delay"
        );
    }
}
