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
