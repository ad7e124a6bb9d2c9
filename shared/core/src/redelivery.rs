//! Retries spaced across deliveries: when a record goes back to the queue, the worker
//! hides it for an exponentially growing time (`ChangeMessageVisibility`), so that the
//! queue's `maxReceiveCount` receives span hours instead of a few visibility timeouts, and
//! an outage of the downstream costs waiting rather than a DLQ full of good messages
//! (docs/ARCHITECTURE.md §1.11).
//!
//! The policy is pure ([`RedeliveryPolicy::delay`]); the call goes through
//! [`VisibilityPort`], which the SQS adapter implements. A visibility change that fails
//! loses nothing: the record is reported in `batchItemFailures` either way, and then
//! comes back after the queue's own visibility timeout.
//!
//! A hide never outlasts the message: SQS deletes a message when its retention period ends,
//! hidden or not, without a trace. Each hide is capped by [`retry_room`] (what is left of
//! the message's retention, from its `SentTimestamp` and the queue's
//! `MessageRetentionPeriod`, less one visibility timeout for the next delivery to run in),
//! and a message with no room left is dead-lettered instead of returned
//! (docs/ARCHITECTURE.md §1.11).

use std::time::Duration;

use futures::future::BoxFuture;

use crate::error::ProcessError;

/// The longest SQS lets a message stay invisible (12 hours).
pub const MAX_VISIBILITY: Duration = Duration::from_secs(43_200);

/// The most the event source mapping may hold a received message before it invokes the
/// function: its longest batching window (`MaximumBatchingWindowInSeconds`, 300 s), with a
/// minute for the receive and the invocation themselves.
pub const RECEIVE_TO_INVOCATION: Duration = Duration::from_secs(360);

/// Returns the longest hide a visibility change can ask for `in_invocation` after the invocation
/// started: SQS counts its 12 hours from the receive, which came at most
/// [`RECEIVE_TO_INVOCATION`] before the invocation.
pub fn longest_hide(in_invocation: Duration) -> Duration {
    MAX_VISIBILITY
        .saturating_sub(RECEIVE_TO_INVOCATION)
        .saturating_sub(in_invocation)
}

/// How long a record returned for retry stays hidden, by its receive count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedeliveryPolicy {
    /// The delay after the first receive.
    pub base: Duration,
    /// The factor per further receive.
    pub multiplier: u32,
    /// The longest delay.
    pub max: Duration,
}

impl RedeliveryPolicy {
    /// Returns the delay before the next delivery of a record received `receive_count` times,
    /// at least what the callee asked for (`retry_after`): equal jitter (half of the
    /// exponential ceiling fixed, half drawn by `random` in `[0, 1)`), so records that
    /// failed together do not all come back in the same second, and never less than half
    /// the ceiling, so the spacing holds. Capped by `max` and by SQS's 12 hours.
    pub fn delay(
        &self,
        receive_count: u32,
        retry_after: Option<Duration>,
        random: f64,
    ) -> Duration {
        let exponent = receive_count.saturating_sub(1).min(32);
        let factor = u64::from(self.multiplier.max(1)).saturating_pow(exponent);
        let cap = self.max.min(MAX_VISIBILITY);
        let ceiling = Duration::from_secs(self.base.as_secs().saturating_mul(factor)).min(cap);
        let half = ceiling / 2;
        let jitter = half.mul_f64(random.clamp(0.0, 1.0));
        let asked = retry_after.unwrap_or(Duration::ZERO);
        // A `Retry-After` past the spacing's cap is honoured (up to SQS's 12 hours).
        let ceiling_kept =
            if crate::mutants::is_on(crate::mutants::Mutant::RetryAfterCappedBySpacing) {
                cap
            } else {
                cap.max(asked)
            };
        (half + jitter)
            .max(asked)
            .min(ceiling_kept.min(MAX_VISIBILITY))
    }

    /// Returns the time `receives` deliveries take at least, each followed by its delay: what
    /// the spacing buys before SQS's redrive policy would move a message (lower bound,
    /// jitter at its least).
    pub fn least_span(&self, receives: u32) -> Duration {
        (1..receives).map(|n| self.delay(n, None, 0.0)).sum()
    }
}

/// What the worker reads once of a source queue (`GetQueueAttributes`) to keep its
/// retries inside the message's retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueTiming {
    /// `MessageRetentionPeriod`: how long after it was sent SQS deletes a message.
    pub retention: Duration,
    /// `VisibilityTimeout`: how long a delivery holds the message (what the next delivery
    /// needs to run in before the message expires).
    pub visibility_timeout: Duration,
}

/// Returns the longest a message sent at `sent` may be hidden `now` so that its next delivery
/// still has a whole visibility timeout before the message expires; `None` when even a
/// delivery right now could not (the message is to be dead-lettered rather than returned).
pub fn retry_room(
    sent: std::time::SystemTime,
    timing: &QueueTiming,
    now: std::time::SystemTime,
) -> Option<Duration> {
    let expires = sent.checked_add(timing.retention)?;
    expires
        .duration_since(now)
        .ok()?
        .checked_sub(timing.visibility_timeout)
}

/// One record to hide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hide {
    /// The queue's ARN (the record's `eventSourceARN`).
    pub queue_arn: String,
    /// The record's receipt handle.
    pub receipt_handle: String,
    /// For how long.
    pub delay: Duration,
}

/// Changes the visibility of records (SQS `ChangeMessageVisibilityBatch`).
pub trait VisibilityPort: Send + Sync {
    /// Hides each record for its delay; one result per entry, in order.
    fn hide<'a>(&'a self, records: &'a [Hide]) -> BoxFuture<'a, Vec<Result<(), ProcessError>>>;

    /// Returns the queue's retention and visibility timeout (read once per queue and kept);
    /// `None` when they cannot be read, and then hides are capped by SQS's limits only.
    fn queue_timing<'a>(&'a self, queue_arn: &'a str) -> BoxFuture<'a, Option<QueueTiming>> {
        let _ = queue_arn;
        Box::pin(async { None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_for_a_retry_leaves_the_next_delivery_a_visibility_timeout() {
        use std::time::{SystemTime, UNIX_EPOCH};
        let timing = QueueTiming {
            retention: Duration::from_secs(4 * 86_400),
            visibility_timeout: Duration::from_secs(180),
        };
        let sent = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let now = sent + Duration::from_secs(86_400);
        assert_eq!(
            retry_room(sent, &timing, now),
            Some(Duration::from_secs(3 * 86_400 - 180))
        );
        // Less than a visibility timeout left, expired, or sent in 1970: no room.
        let late = sent + timing.retention - Duration::from_secs(179);
        assert_eq!(retry_room(sent, &timing, late), None);
        assert_eq!(
            retry_room(
                sent,
                &timing,
                sent + timing.retention + Duration::from_secs(1)
            ),
            None
        );
        assert_eq!(retry_room(UNIX_EPOCH, &timing, SystemTime::now()), None);
        // A sending clock ahead of ours only adds room; a retention past time's end none.
        assert!(retry_room(now + Duration::from_secs(60), &timing, now).is_some());
        let endless = QueueTiming {
            retention: Duration::MAX,
            ..timing
        };
        assert_eq!(retry_room(sent, &endless, now), None);
    }

    fn policy() -> RedeliveryPolicy {
        RedeliveryPolicy {
            base: Duration::from_secs(300),
            multiplier: 3,
            max: Duration::from_secs(4 * 3600),
        }
    }

    #[test]
    fn delays_grow_by_the_multiplier_with_equal_jitter_and_stop_at_the_cap() {
        let p = policy();
        assert_eq!(p.delay(1, None, 0.0), Duration::from_secs(150));
        assert_eq!(
            p.delay(1, None, 0.999_999),
            Duration::from_secs(300) - Duration::from_nanos(150_000)
        );
        assert_eq!(p.delay(2, None, 0.0), Duration::from_secs(450));
        assert_eq!(p.delay(3, None, 1.0), Duration::from_secs(2700));
        // 300 × 3^4 = 24,300 s > 4 h: capped.
        assert_eq!(p.delay(5, None, 1.0), Duration::from_secs(14_400));
        assert_eq!(p.delay(u32::MAX, None, 1.0), Duration::from_secs(14_400));
        // Five receives span hours, not minutes: at least 150 + 450 + 1,350 + 4,050 s.
        assert_eq!(p.least_span(5), Duration::from_secs(6000));
    }

    #[test]
    fn retry_after_is_honoured_within_sqs_limits() {
        let p = policy();
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(3600)), 0.0),
            Duration::from_secs(3600)
        );
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(10)), 0.0),
            Duration::from_secs(150)
        );
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(u64::MAX / 2)), 0.0),
            MAX_VISIBILITY
        );
        let huge = RedeliveryPolicy {
            base: Duration::from_secs(u64::MAX / 4),
            multiplier: u32::MAX,
            max: Duration::from_secs(u64::MAX),
        };
        assert_eq!(huge.delay(40, None, 1.0), MAX_VISIBILITY);
        assert!(huge.delay(1, None, 2.0) <= MAX_VISIBILITY);
    }
}
