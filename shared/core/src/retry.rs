//! In-invocation retries: exponential backoff with full jitter, a cap, a maximum number of
//! attempts, and the invocation's deadline over all of it: no attempt or sleep starts past
//! the cut-off, and an attempt still running at the cut-off is cut there (a `timeout`
//! failure, retried in a later delivery).
//!
//! Written by hand rather than with a retry crate: the decisions hang on things such crates
//! do not know (the error class, a callee's `Retry-After`, the Lambda deadline, and a
//! history entry per attempt for the dead-letter record).
//!
//! Time comes from `tokio::time`, so tests run with a paused clock.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::error::ProcessError;

/// Lambda's longest function timeout: a deadline further away than this is not credible.
pub const MAX_INVOCATION_TIME: Duration = Duration::from_secs(900);

/// The budget used when the invocation's deadline is not credible (already past when the
/// invocation arrives, as with the constant `Lambda-Runtime-Deadline-Ms: 600000` that
/// `cargo lambda watch` sends).
pub const FALLBACK_INVOCATION_TIME: Duration = Duration::from_secs(60);

/// Most time kept after the dead-letter writes for posting the response.
const RESPONSE_RESERVE: Duration = Duration::from_millis(250);

/// Least time kept for posting the response, whatever the margin: posting it takes a few
/// milliseconds, and an answer that arrives after the deadline is lost with its batch (a
/// margin of 0 would otherwise put the hard stop on the deadline itself).
pub const MIN_RESPONSE_RESERVE: Duration = Duration::from_millis(50);

/// The invocation's deadline, split in three (docs/GUARANTEES.md, "The deadline is respected"):
///
/// - until the **cut-off** (`deadline − margin`) records and attempts start, and attempts
///   still running there are cut;
/// - until the **hard stop** the dead-letter writes of what was cut or failed run (the
///   margin less a small reserve);
/// - the rest (at most 250 ms, half the margin when the margin is small, never less than
///   [`MIN_RESPONSE_RESERVE`]) posts the response.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    cutoff: Instant,
    hard_stop: Instant,
}

impl Deadline {
    /// Creates a deadline at `at`, keeping `margin` free before it.
    pub fn new(at: Instant, margin: Duration) -> Self {
        let reserve = RESPONSE_RESERVE.min(margin / 2).max(MIN_RESPONSE_RESERVE);
        let hard_stop = at.checked_sub(reserve).unwrap_or(at);
        Deadline {
            cutoff: at.checked_sub(margin).unwrap_or(at).min(hard_stop),
            hard_stop,
        }
    }

    /// Returns the deadline `remaining` from now, with `margin` kept free.
    pub fn after(remaining: Duration, margin: Duration) -> Self {
        let now = Instant::now();
        // Any clock overflows somewhere: a year is far beyond any run this library makes.
        let at = now
            .checked_add(remaining.min(Duration::from_secs(365 * 86_400)))
            .unwrap_or(now);
        Deadline::new(at, margin)
    }

    /// Returns the last instant at which new work may start; running attempts are cut here.
    pub fn cutoff(&self) -> Instant {
        self.cutoff
    }

    /// Returns the instant by which the dead-letter writes must be done, so that the response is
    /// posted before the deadline.
    pub fn hard_stop(&self) -> Instant {
        self.hard_stop
    }

    /// Returns the time left before the cut-off (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.cutoff.saturating_duration_since(Instant::now())
    }

    /// Tells whether new work may still start.
    pub fn can_start(&self) -> bool {
        Instant::now() < self.cutoff
    }
}

/// How much time an invocation really has, from the deadline the Runtime API gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvocationBudget {
    /// The deadline is in the future and within Lambda's longest timeout.
    Credible(Duration),
    /// The deadline had already passed when the invocation arrived: not a real Lambda
    /// deadline; [`FALLBACK_INVOCATION_TIME`] is used instead.
    AlreadyPast,
    /// The deadline is further away than Lambda's longest timeout (15 minutes); capped.
    TooFar,
}

impl InvocationBudget {
    /// Judges a deadline against `now`.
    pub fn of(deadline: std::time::SystemTime, now: std::time::SystemTime) -> Self {
        match deadline.duration_since(now) {
            Err(_) => InvocationBudget::AlreadyPast,
            Ok(left) if left.is_zero() => InvocationBudget::AlreadyPast,
            Ok(left) if left > MAX_INVOCATION_TIME => InvocationBudget::TooFar,
            Ok(left) => InvocationBudget::Credible(left),
        }
    }

    /// Returns the time the invocation will be given.
    pub fn time(self) -> Duration {
        match self {
            InvocationBudget::Credible(left) => left,
            InvocationBudget::AlreadyPast => FALLBACK_INVOCATION_TIME,
            InvocationBudget::TooFar => MAX_INVOCATION_TIME,
        }
    }
}

/// How the random part of a backoff delay is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Jitter {
    /// Uniform in `[0, delay]` ("full jitter"): spreads retries of many workers apart.
    Full,
    /// Exactly the exponential delay (deterministic; for tests and debugging).
    None,
}

/// When and how often a retryable failure is tried again within one invocation.
///
/// ```
/// use std::time::Duration;
/// use sqs_keeper_core::retry::{run_with_retry, Deadline, RetryPolicy};
/// use sqs_keeper_core::ProcessError;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(async {
/// let policy = RetryPolicy::default();
/// let deadline = Deadline::after(Duration::from_secs(30), Duration::from_secs(1));
/// // Throttled once, then through: the second attempt succeeds within the invocation.
/// let run = run_with_retry(&policy, &deadline, |attempt| async move {
///     if attempt == 1 {
///         Err(ProcessError::from_http_status(429, "slow down"))
///     } else {
///         Ok("done")
///     }
/// })
/// .await;
/// assert_eq!(run.result.ok(), Some("done"));
/// assert_eq!(run.failures.len(), 1);
/// # });
/// ```
///
/// Exhaustive on purpose: it is built with struct update syntax
/// (`..Default::default()`), which `#[non_exhaustive]` forbids outside this crate. A field
/// added later comes with its default, so such code keeps compiling.
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
    /// Attempts per error class where a class is tried more or less than `max_attempts`,
    /// and whether a throttled attempt with a `Retry-After` counts.
    pub class_attempts: ClassAttempts,
    /// Where the full jitter is drawn from (the thread's generator by default).
    pub random: crate::random::Random,
    /// The wall clock a failed attempt's start is read from, for its history entry (the
    /// system clock by default).
    pub clock: crate::clock::Clock,
}

/// Most attempts a record makes in one invocation whatever its budgets: free throttled
/// attempts ([`ClassAttempts::retry_after_free`]) included.
pub const MAX_ATTEMPTS_PER_INVOCATION: u32 = 20;

/// Retry budgets by error class, within one invocation (`WORKER_RETRY_ATTEMPTS_BY_CLASS`,
/// `WORKER_RETRY_AFTER_FREE`): throttling may be tried longer than a server error, and a
/// callee that asks for time (`Retry-After`) is given it without spending the record's
/// attempts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassAttempts {
    /// The most attempts for a failure of this class, in place of `max_attempts` (the
    /// last failure's class decides whether another attempt is made).
    pub by_class: std::collections::BTreeMap<crate::error::ErrorClass, u32>,
    /// A `throttled` failure that carries a `Retry-After` does not count against the
    /// record's attempts: the callee asked for time, not for a different answer. The
    /// invocation's cut-off still ends the waiting, and no record makes more than
    /// [`MAX_ATTEMPTS_PER_INVOCATION`] attempts.
    pub retry_after_free: bool,
}

impl ClassAttempts {
    /// Tells whether `error` spends one of the record's attempts.
    pub fn counts(&self, error: &ProcessError) -> bool {
        !(self.retry_after_free
            && error.class == crate::error::ErrorClass::Throttled
            && error.retry_after.is_some())
    }

    /// Returns the attempts a record may make when its last failure is of `class`.
    pub fn limit(&self, class: crate::error::ErrorClass, default: u32) -> u32 {
        self.by_class.get(&class).copied().unwrap_or(default)
    }
}

/// `class=n` pairs joined by `,` (`throttled=6,server_error=2`), each `n` from 1 to
/// [`MAX_ATTEMPTS_PER_INVOCATION`], each class once.
impl std::str::FromStr for ClassAttempts {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut by_class = std::collections::BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (class, attempts) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not class=attempts"))?;
            let class: crate::error::ErrorClass = class.trim().parse().map_err(|_| {
                format!(
                    "{:?} is not an error class (throttled, server_error, timeout, connection, unknown, ...)",
                    class.trim()
                )
            })?;
            let attempts: u32 = attempts
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=MAX_ATTEMPTS_PER_INVOCATION).contains(n))
                .ok_or_else(|| {
                    format!(
                        "{:?} attempts for {class}: expected 1 to {MAX_ATTEMPTS_PER_INVOCATION}",
                        attempts.trim()
                    )
                })?;
            if by_class.insert(class, attempts).is_some() {
                return Err(format!("{class} is given twice"));
            }
        }
        Ok(ClassAttempts {
            by_class,
            retry_after_free: false,
        })
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            retry_unknown: false,
            jitter: Jitter::Full,
            class_attempts: ClassAttempts::default(),
            random: crate::random::Random::default(),
            clock: crate::clock::Clock::default(),
        }
    }
}

impl RetryPolicy {
    /// Returns the largest delay after failed attempt number `attempt` (1-based): the exponential
    /// delay, capped.
    pub fn backoff_ceiling(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(31);
        self.base_delay
            .saturating_mul(1u32 << exponent)
            .min(self.max_delay)
    }

    /// Returns the delay after failed attempt number `attempt` (1-based), before any `Retry-After`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self.backoff_ceiling(attempt);
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => {
                let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(self.random.u64(0..=nanos))
            }
        }
    }
}

/// Longest `Retry-After` honoured: a callee asking for more (or sending a number that would
/// overflow a clock) gets this; the deadline cuts the wait anyway.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(12 * 3600);

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
#[non_exhaustive]
pub enum StopReason {
    /// The error class is not retryable.
    Permanent,
    /// `max_attempts` were made.
    AttemptsExhausted,
    /// The next attempt could not start before the cut-off.
    Deadline,
    /// The call was refused before reaching the callee (the circuit breaker is open): not
    /// tried again in this invocation, where waiting would only hold the sandbox idle; the
    /// record goes back to the queue, hidden for the refusal's `Retry-After`.
    Refused,
}

/// The end of a retry loop.
#[derive(Debug)]
pub struct RetryRun<T> {
    /// The success, or the last error and why no further attempt was made.
    pub result: Result<T, (ProcessError, StopReason)>,
    /// Every failed attempt, in order.
    pub failures: Vec<AttemptFailure>,
}

/// `work`'s output, or `None` when it is still running at `deadline` (then it is dropped),
/// as `tokio::time::timeout_at` gives it, but with the timer armed only when `work` does not
/// finish at its first poll: a handler that answers at once (CPU-bound work, a record
/// skipped) costs no timer.
pub async fn finish_by<F: Future>(deadline: Instant, work: F) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    if let std::task::Poll::Ready(output) = futures::poll!(work.as_mut()) {
        return Some(output);
    }
    tokio::time::timeout_at(deadline, work).await.ok()
}

/// Runs `op` until it succeeds, fails permanently, runs out of attempts, or the next
/// attempt would start after the deadline's cut-off. An attempt still running at the
/// cut-off is cut there: it fails as a `timeout` (retryable: a later delivery tries again).
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
    // The attempts that spent the record's budget (a free throttled one does not).
    let mut counted = 0;
    loop {
        // The wall time an attempt started at is only kept when it fails: worked out then
        // from its duration, so a successful attempt reads the clock once.
        let started = Instant::now();
        // Pinned here and lent: moved into the callee, the processor's future (large in a
        // debug build) would be copied on the stack on its way.
        let work = std::pin::pin!(op(attempt));
        let (result, cut) = attempt_until_cut(deadline, started, work).await;
        let error = match result {
            Ok(value) => {
                return RetryRun {
                    result: Ok(value),
                    failures,
                }
            }
            Err(error) => error,
        };
        let duration = started.elapsed();
        let started_at = policy.clock.now()
            - chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::zero());
        failures.push(AttemptFailure {
            attempt,
            started_at,
            duration,
            error: error.clone(),
        });
        if policy.class_attempts.counts(&error) {
            counted += 1;
        }
        let stop = match stop_reason(policy, &error, cut, counted, attempt) {
            Some(reason) => Some(reason),
            None => wait_for_next_attempt(policy, deadline, &error, attempt).await,
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

/// Runs one attempt, `work`, cut at the deadline's cut-off: its result and whether it was cut.
/// An attempt that can end itself at the cut-off (its layers account for the cut and
/// finish their writes, `crate::context::until_cut`) is polled on until the hard stop.
async fn attempt_until_cut<T, Fut>(
    deadline: &Deadline,
    started: Instant,
    mut work: std::pin::Pin<&mut Fut>,
) -> (Result<T, ProcessError>, bool)
where
    Fut: Future<Output = Result<T, ProcessError>>,
{
    match finish_by(
        crate::mutants::deadline_guard(deadline.cutoff()),
        work.as_mut(),
    )
    .await
    {
        Some(result) => (result, false),
        None if crate::context::pass_cutoff() => {
            match finish_by(
                crate::mutants::deadline_guard(deadline.hard_stop()),
                crate::context::past_cutoff(work),
            )
            .await
            {
                Some(Some(result)) => (result, true),
                Some(None) | None => (Err(ProcessError::deadline_cut(started.elapsed())), true),
            }
        }
        None => (Err(ProcessError::deadline_cut(started.elapsed())), true),
    }
}

/// Why no attempt follows `error`, if its class, the cut or the record's budget say so
/// (`counted` attempts spent it, `attempt` is the number of the one that failed).
fn stop_reason(
    policy: &RetryPolicy,
    error: &ProcessError,
    cut: bool,
    counted: u32,
    attempt: u32,
) -> Option<StopReason> {
    let limit = policy
        .class_attempts
        .limit(error.class, policy.max_attempts);
    if cut {
        Some(StopReason::Deadline)
    } else if !error.class.is_retryable(policy.retry_unknown) {
        Some(StopReason::Permanent)
    } else if error.is_breaker_refusal() {
        Some(StopReason::Refused)
    } else if counted >= limit || attempt >= MAX_ATTEMPTS_PER_INVOCATION {
        Some(StopReason::AttemptsExhausted)
    } else {
        None
    }
}

/// Sleeps the backoff after `attempt` (at least the `Retry-After` asked for, capped), or
/// says the next attempt would start past the cut-off.
async fn wait_for_next_attempt(
    policy: &RetryPolicy,
    deadline: &Deadline,
    error: &ProcessError,
    attempt: u32,
) -> Option<StopReason> {
    let delay = policy.backoff(attempt).max(
        error
            .retry_after
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    );
    match Instant::now().checked_add(delay) {
        Some(wake) if wake < deadline.cutoff() => {
            tokio::time::sleep_until(wake).await;
            None
        }
        _ => Some(StopReason::Deadline),
    }
}

/// Returns the longest one record can take with `policy` when every attempt runs for its whole
/// `attempt_timeout`: attempts × timeout plus the longest backoffs between them.
pub fn worst_case_record_time(policy: &RetryPolicy, attempt_timeout: Duration) -> Duration {
    // The largest budget of any class (free throttled attempts aside: they wait as long as
    // the callee asks, which only the cut-off bounds).
    let attempts = policy
        .class_attempts
        .by_class
        .values()
        .copied()
        .fold(policy.max_attempts, u32::max)
        .clamp(1, MAX_ATTEMPTS_PER_INVOCATION);
    let sleeps: Duration = (1..attempts)
        .map(|a| policy.backoff_ceiling(a))
        .fold(Duration::ZERO, Duration::saturating_add);
    attempt_timeout
        .saturating_mul(attempts)
        .saturating_add(sleeps)
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
            ..RetryPolicy::default()
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

    #[test]
    fn the_jitter_is_drawn_from_the_policys_random() {
        let seeded = |seed| RetryPolicy {
            jitter: Jitter::Full,
            random: crate::random::Random::seeded(seed),
            ..policy(10)
        };
        let delays = |p: RetryPolicy| (1..=6).map(|a| p.backoff(a)).collect::<Vec<_>>();
        assert_eq!(delays(seeded(7)), delays(seeded(7)));
    }

    /// A failed attempt's start, in its history, is read from the policy's clock.
    #[tokio::test(start_paused = true)]
    async fn a_failed_attempts_start_is_read_from_the_policys_clock() {
        let start = DateTime::from_timestamp(1_767_225_600, 0).unwrap();
        let p = RetryPolicy {
            clock: crate::clock::Clock::following_tokio(start),
            ..policy(2)
        };
        let deadline = Deadline::after(Duration::from_secs(600), Duration::from_secs(1));
        let run: RetryRun<()> = run_with_retry(&p, &deadline, |_| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Err(ProcessError::new(ErrorClass::ServerError, "503"))
        })
        .await;
        let starts: Vec<DateTime<Utc>> = run.failures.iter().map(|f| f.started_at).collect();
        // The second attempt starts after the first's second and its backoff (100 ms).
        assert_eq!(
            starts,
            [start, start + chrono::Duration::milliseconds(1100)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn finish_by_answers_at_once_and_cuts_what_runs_past_the_deadline() {
        let past = Instant::now() - Duration::from_secs(1);
        // Ready at its first poll: its output, even past the deadline (as timeout_at).
        assert_eq!(finish_by(past, async { 7 }).await, Some(7));
        // Still running at the deadline: cut there.
        let soon = Instant::now() + Duration::from_millis(50);
        let started = Instant::now();
        let slow = tokio::time::sleep(Duration::from_secs(10));
        assert_eq!(finish_by(soon, slow).await, None);
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        // Done before the deadline after waiting: its output.
        let later = Instant::now() + Duration::from_secs(1);
        let waits = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            3
        };
        assert_eq!(finish_by(later, waits).await, Some(3));
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

    /// A `Retry-After` past the cap is honoured for the cap, twelve hours, when the
    /// deadline leaves room: an hour's cap retried a callee that asked for twenty hours
    /// eleven hours early.
    #[tokio::test(start_paused = true)]
    async fn a_retry_after_past_the_cap_is_honoured_for_twelve_hours() {
        let start = Instant::now();
        let deadline = Deadline::after(Duration::from_secs(24 * 3600), Duration::ZERO);
        let run = run_with_retry(&policy(2), &deadline, |attempt| async move {
            if attempt == 1 {
                Err(ProcessError::new(ErrorClass::Throttled, "429")
                    .with_retry_after(Duration::from_secs(20 * 3600)))
            } else {
                Ok(attempt)
            }
        })
        .await;
        assert_eq!(run.result.ok(), Some(2));
        assert_eq!(start.elapsed(), Duration::from_secs(12 * 3600));
    }

    #[tokio::test(start_paused = true)]
    async fn a_huge_retry_after_neither_panics_nor_sleeps_past_the_cutoff() {
        let start = Instant::now();
        let deadline = Deadline::after(Duration::from_secs(6), Duration::from_secs(2));
        let run: RetryRun<()> = run_with_retry(&policy(3), &deadline, |_| async {
            Err(ProcessError::new(ErrorClass::Throttled, "429")
                .with_retry_after(Duration::from_secs(10_000_000_000_000_000_000)))
        })
        .await;
        assert!(matches!(run.result, Err((_, StopReason::Deadline))));
        assert_eq!(run.failures.len(), 1);
        assert_eq!(start.elapsed(), Duration::ZERO, "no sleep past the cut-off");
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_still_running_at_the_cutoff_is_cut_as_a_timeout() {
        let start = Instant::now();
        // Cut-off 4 s from now; the callee hangs for 10 s.
        let deadline = Deadline::after(Duration::from_secs(6), Duration::from_secs(2));
        let run: RetryRun<()> = run_with_retry(&policy(3), &deadline, |_| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok(())
        })
        .await;
        let Err((error, reason)) = run.result else {
            panic!("a hanging attempt must not succeed");
        };
        assert_eq!(reason, StopReason::Deadline);
        assert_eq!(error.class, ErrorClass::Timeout);
        assert_eq!(error.step.as_deref(), Some("deadline"));
        assert_eq!(run.failures.len(), 1);
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        assert!(Instant::now() < deadline.hard_stop());
    }

    #[test]
    fn the_margin_is_split_between_dead_letter_writes_and_the_response() {
        let now = Instant::now();
        let at = now + Duration::from_secs(30);
        let d = Deadline::new(at, Duration::from_secs(2));
        assert_eq!(d.cutoff(), at - Duration::from_secs(2));
        assert_eq!(d.hard_stop(), at - Duration::from_millis(250));
        let small = Deadline::new(at, Duration::from_millis(100));
        assert_eq!(small.hard_stop(), at - Duration::from_millis(50));
        assert_eq!(small.cutoff(), at - Duration::from_millis(100));
        // No margin still leaves the response its floor before the deadline.
        let none = Deadline::new(at, Duration::ZERO);
        let floor = at - MIN_RESPONSE_RESERVE;
        assert_eq!((none.cutoff(), none.hard_stop()), (floor, floor));
    }

    #[test]
    fn a_deadline_that_is_not_credible_gets_a_fallback_budget() {
        use std::time::{SystemTime, UNIX_EPOCH};
        let now = SystemTime::now();
        // What `cargo lambda watch` sends: Lambda-Runtime-Deadline-Ms: 600000 (1970).
        let cargo_lambda = UNIX_EPOCH + Duration::from_millis(600_000);
        assert_eq!(
            InvocationBudget::of(cargo_lambda, now),
            InvocationBudget::AlreadyPast
        );
        assert_eq!(
            InvocationBudget::of(cargo_lambda, now).time(),
            FALLBACK_INVOCATION_TIME
        );
        assert_eq!(
            InvocationBudget::of(now + Duration::from_secs(30), now),
            InvocationBudget::Credible(Duration::from_secs(30))
        );
        // A function of Lambda's longest timeout, read at once, is credible: the worker
        // warns only of a deadline no Lambda gives.
        assert_eq!(
            InvocationBudget::of(now + MAX_INVOCATION_TIME, now),
            InvocationBudget::Credible(MAX_INVOCATION_TIME)
        );
        let far = now + Duration::from_secs(10 * 365 * 86_400);
        assert_eq!(InvocationBudget::of(far, now), InvocationBudget::TooFar);
        assert_eq!(InvocationBudget::of(far, now).time(), MAX_INVOCATION_TIME);
    }

    #[test]
    fn worst_case_adds_every_attempt_and_the_longest_backoffs() {
        let p = policy(3);
        assert_eq!(
            worst_case_record_time(&p, Duration::from_secs(10)),
            Duration::from_millis(30_000 + 100 + 200)
        );
        let one = policy(1);
        assert_eq!(
            worst_case_record_time(&one, Duration::from_secs(10)),
            Duration::from_secs(10)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_helpers() {
        let d = Deadline::after(Duration::from_secs(10), Duration::from_secs(4));
        assert!(d.can_start());
        assert_eq!(d.remaining(), Duration::from_secs(6));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(!d.can_start());
        assert_eq!(d.remaining(), Duration::ZERO);
    }

    fn failing_with(
        class: ErrorClass,
        retry_after: Option<Duration>,
        failures: u32,
    ) -> impl FnMut(u32) -> std::future::Ready<Result<u32, ProcessError>> {
        move |attempt| {
            std::future::ready(if attempt <= failures {
                let mut e = ProcessError::new(class, "no");
                e.retry_after = retry_after;
                Err(e)
            } else {
                Ok(attempt)
            })
        }
    }

    /// Budgets by class: the class of the last failure decides how many attempts a record
    /// makes, the rest take `max_attempts`.
    #[tokio::test(start_paused = true)]
    async fn each_class_has_its_own_attempts() {
        let deadline = Deadline::after(Duration::from_secs(600), Duration::from_secs(1));
        let p = RetryPolicy {
            class_attempts: "throttled=5, server_error=1".parse().unwrap(),
            ..policy(2)
        };
        let run =
            run_with_retry(&p, &deadline, failing_with(ErrorClass::Throttled, None, 99)).await;
        assert_eq!(run.failures.len(), 5);
        assert!(matches!(
            run.result,
            Err((_, StopReason::AttemptsExhausted))
        ));
        let run = run_with_retry(
            &p,
            &deadline,
            failing_with(ErrorClass::ServerError, None, 99),
        )
        .await;
        assert_eq!(run.failures.len(), 1);
        let run = run_with_retry(&p, &deadline, failing_with(ErrorClass::Timeout, None, 99)).await;
        assert_eq!(
            run.failures.len(),
            2,
            "max_attempts for the classes not named"
        );
        let run = run_with_retry(&p, &deadline, failing_with(ErrorClass::Throttled, None, 4)).await;
        assert_eq!(run.result.ok(), Some(5));
    }

    /// A throttled attempt with a `Retry-After` spends no attempt when that is asked for:
    /// four such answers and a success fit a budget of two; without it they do not. Never
    /// more than twenty attempts, and the cut-off ends the waiting.
    #[tokio::test(start_paused = true)]
    async fn a_throttled_attempt_with_retry_after_is_free_when_asked() {
        let deadline = Deadline::after(Duration::from_secs(600), Duration::from_secs(1));
        let wait = Some(Duration::from_secs(1));
        let free = RetryPolicy {
            class_attempts: ClassAttempts {
                retry_after_free: true,
                ..ClassAttempts::default()
            },
            ..policy(2)
        };
        let run = run_with_retry(
            &free,
            &deadline,
            failing_with(ErrorClass::Throttled, wait, 4),
        )
        .await;
        assert_eq!(run.result.ok(), Some(5));
        let run = run_with_retry(
            &policy(2),
            &deadline,
            failing_with(ErrorClass::Throttled, wait, 4),
        )
        .await;
        assert_eq!(run.failures.len(), 2);
        assert!(run.result.is_err());
        // Without a Retry-After, or of another class, an attempt counts.
        let run = run_with_retry(
            &free,
            &deadline,
            failing_with(ErrorClass::Throttled, None, 4),
        )
        .await;
        assert_eq!(run.failures.len(), 2);
        let run = run_with_retry(
            &free,
            &deadline,
            failing_with(ErrorClass::ServerError, wait, 4),
        )
        .await;
        assert_eq!(run.failures.len(), 2);
        // A callee that always asks for time: at most twenty attempts.
        let run = run_with_retry(
            &free,
            &deadline,
            failing_with(ErrorClass::Throttled, wait, 99),
        )
        .await;
        assert_eq!(run.failures.len(), MAX_ATTEMPTS_PER_INVOCATION as usize);
        assert!(matches!(
            run.result,
            Err((_, StopReason::AttemptsExhausted))
        ));
        // The cut-off ends the waiting first when it comes first.
        let short = Deadline::after(Duration::from_secs(5), Duration::from_secs(1));
        let long_wait = Some(Duration::from_secs(3));
        let run = run_with_retry(
            &free,
            &short,
            failing_with(ErrorClass::Throttled, long_wait, 99),
        )
        .await;
        assert_eq!(run.failures.len(), 2);
        assert!(matches!(run.result, Err((_, StopReason::Deadline))));
    }

    #[test]
    fn class_budgets_are_read_as_class_attempts_pairs() {
        let parsed: ClassAttempts = "throttled=6,server_error=2".parse().unwrap();
        assert_eq!(parsed.by_class[&ErrorClass::Throttled], 6);
        assert_eq!(parsed.by_class[&ErrorClass::ServerError], 2);
        assert_eq!(
            "".parse::<ClassAttempts>().unwrap(),
            ClassAttempts::default()
        );
        for bad in [
            "throttled",
            "throttling=3",
            "throttled=0",
            "throttled=21",
            "throttled=x",
            "throttled=2,throttled=3",
        ] {
            assert!(bad.parse::<ClassAttempts>().is_err(), "{bad}");
        }
    }
}
