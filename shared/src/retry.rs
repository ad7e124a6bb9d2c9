//! In-invocation retries: exponential backoff with full jitter, a cap, a maximum number of
//! attempts, and never a sleep that would end past the invocation's cut-off.
//!
//! Time comes from `tokio::time`, so tests run with a paused clock.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::error::ProcessError;

/// The invocation's deadline and the safety margin kept before it (DESIGN §2.7).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    cutoff: Instant,
}

impl Deadline {
    /// A deadline at `at`, keeping `margin` free before it.
    pub fn new(at: Instant, margin: Duration) -> Self {
        Deadline {
            cutoff: at.checked_sub(margin).unwrap_or(at),
        }
    }

    /// The deadline `remaining` from now, with `margin` kept free.
    pub fn after(remaining: Duration, margin: Duration) -> Self {
        Deadline::new(Instant::now() + remaining, margin)
    }

    /// The Lambda context's wall-clock deadline, as a monotonic one.
    pub fn from_system_time(at: std::time::SystemTime, margin: Duration) -> Self {
        let remaining = at
            .duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO);
        Deadline::after(remaining, margin)
    }

    /// The last instant at which new work may start.
    pub fn cutoff(&self) -> Instant {
        self.cutoff
    }

    /// Time left before the cut-off (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.cutoff.saturating_duration_since(Instant::now())
    }

    /// Whether new work may still start.
    pub fn can_start(&self) -> bool {
        Instant::now() < self.cutoff
    }
}

/// How the random part of a backoff delay is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Uniform in `[0, delay]` ("full jitter"): spreads retries of many workers apart.
    Full,
    /// Exactly the exponential delay (deterministic; for tests and debugging).
    None,
}

/// When and how often a retryable failure is tried again within one invocation.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Total attempts, the first included (1 = no retries).
    pub max_attempts: u32,
    /// Delay before the second attempt, before jitter; doubles each retry.
    pub base_delay: Duration,
    /// Upper bound for any one delay.
    pub max_delay: Duration,
    /// Whether errors of class `unknown` are retried.
    pub retry_unknown: bool,
    /// How the delay is randomised.
    pub jitter: Jitter,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            retry_unknown: false,
            jitter: Jitter::Full,
        }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt number `attempt` (1-based), before any `Retry-After`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(31);
        let ceiling = self
            .base_delay
            .saturating_mul(1u32 << exponent)
            .min(self.max_delay);
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => {
                let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(fastrand::u64(0..=nanos))
            }
        }
    }
}

/// One failed attempt, as history.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptFailure {
    /// 1-based attempt number within this invocation.
    pub attempt: u32,
    /// When the attempt started.
    pub started_at: DateTime<Utc>,
    /// How long it ran.
    pub duration: Duration,
    /// Why it failed.
    pub error: ProcessError,
}

/// Why the retry loop stopped on a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The error class is not retryable.
    Permanent,
    /// `max_attempts` were made.
    AttemptsExhausted,
    /// The next attempt could not start before the cut-off.
    Deadline,
}

/// The end of a retry loop.
#[derive(Debug)]
pub struct RetryRun<T> {
    /// The success, or the last error and why no further attempt was made.
    pub result: Result<T, (ProcessError, StopReason)>,
    /// Every failed attempt, in order.
    pub failures: Vec<AttemptFailure>,
}

/// Runs `op` until it succeeds, fails permanently, runs out of attempts, or the next
/// attempt would start after the deadline's cut-off.
pub async fn run_with_retry<T, F, Fut>(
    policy: &RetryPolicy,
    deadline: &Deadline,
    mut op: F,
) -> RetryRun<T>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, ProcessError>>,
{
    let mut failures = Vec::new();
    let mut attempt = 1;
    loop {
        let started_at = Utc::now();
        let started = Instant::now();
        let error = match op(attempt).await {
            Ok(value) => {
                return RetryRun {
                    result: Ok(value),
                    failures,
                }
            }
            Err(error) => error,
        };
        failures.push(AttemptFailure {
            attempt,
            started_at,
            duration: started.elapsed(),
            error: error.clone(),
        });
        let stop = if !error.class.is_retryable(policy.retry_unknown) {
            Some(StopReason::Permanent)
        } else if attempt >= policy.max_attempts {
            Some(StopReason::AttemptsExhausted)
        } else {
            let delay = policy
                .backoff(attempt)
                .max(error.retry_after.unwrap_or(Duration::ZERO));
            if Instant::now() + delay >= deadline.cutoff() {
                Some(StopReason::Deadline)
            } else {
                tokio::time::sleep(delay).await;
                None
            }
        };
        if let Some(reason) = stop {
            return RetryRun {
                result: Err((error, reason)),
                failures,
            };
        }
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorClass;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn policy(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(700),
            retry_unknown: false,
            jitter: Jitter::None,
        }
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = policy(10);
        let delays: Vec<u128> = (1..=6).map(|a| p.backoff(a).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 700, 700, 700]);
        assert_eq!(p.backoff(200), Duration::from_millis(700), "no overflow");
    }

    #[test]
    fn full_jitter_stays_within_the_ceiling() {
        let p = RetryPolicy {
            jitter: Jitter::Full,
            ..policy(10)
        };
        let mut seen_below_half = false;
        for _ in 0..1000 {
            let d = p.backoff(3);
            assert!(d <= Duration::from_millis(400));
            seen_below_half |= d < Duration::from_millis(200);
        }
        assert!(
            seen_below_half,
            "jitter spreads delays over the whole range"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stops_after_max_attempts_having_slept_the_backoff() {
        let calls = AtomicU32::new(0);
        let start = Instant::now();
        let deadline = Deadline::after(Duration::from_secs(60), Duration::ZERO);
        let run: RetryRun<()> = run_with_retry(&policy(4), &deadline, |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(ProcessError::new(ErrorClass::Throttled, "slow down")) }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!(run.failures.len(), 4);
        assert!(matches!(
            run.result,
            Err((_, StopReason::AttemptsExhausted))
        ));
        assert_eq!(start.elapsed(), Duration::from_millis(100 + 200 + 400));
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried() {
        let deadline = Deadline::after(Duration::from_secs(60), Duration::ZERO);
        let run: RetryRun<()> = run_with_retry(&policy(5), &deadline, |_| async {
            Err(ProcessError::validation("bad input"))
        })
        .await;
        assert_eq!(run.failures.len(), 1);
        assert!(matches!(run.result, Err((_, StopReason::Permanent))));
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_is_retried_only_when_configured() {
        let deadline = Deadline::after(Duration::from_secs(60), Duration::ZERO);
        let unknown = || async { Err::<(), _>(ProcessError::new(ErrorClass::Unknown, "?")) };
        let run = run_with_retry(&policy(3), &deadline, |_| unknown()).await;
        assert_eq!(run.failures.len(), 1);
        let retrying = RetryPolicy {
            retry_unknown: true,
            ..policy(3)
        };
        let run = run_with_retry(&retrying, &deadline, |_| unknown()).await;
        assert_eq!(run.failures.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn never_sleeps_past_the_cutoff() {
        let start = Instant::now();
        // Cut-off at 250 ms: sleeps of 100 ms fit, the following 200 ms would not.
        let deadline = Deadline::after(Duration::from_millis(350), Duration::from_millis(100));
        let run: RetryRun<()> = run_with_retry(&policy(10), &deadline, |_| async {
            Err(ProcessError::new(ErrorClass::ServerError, "503"))
        })
        .await;
        assert!(matches!(run.result, Err((_, StopReason::Deadline))));
        assert_eq!(run.failures.len(), 2);
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        assert!(Instant::now() < deadline.cutoff());
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_honoured() {
        let start = Instant::now();
        let deadline = Deadline::after(Duration::from_secs(60), Duration::ZERO);
        let run = run_with_retry(&policy(2), &deadline, |attempt| async move {
            if attempt == 1 {
                Err(ProcessError::new(ErrorClass::Throttled, "429")
                    .with_retry_after(Duration::from_secs(3)))
            } else {
                Ok(attempt)
            }
        })
        .await;
        assert_eq!(run.result.ok(), Some(2));
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_helpers() {
        let d = Deadline::after(Duration::from_secs(10), Duration::from_secs(4));
        assert!(d.can_start());
        assert_eq!(d.remaining(), Duration::from_secs(6));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(!d.can_start());
        assert_eq!(d.remaining(), Duration::ZERO);
        let past = Deadline::from_system_time(std::time::SystemTime::UNIX_EPOCH, Duration::ZERO);
        assert!(!past.can_start());
    }
}
