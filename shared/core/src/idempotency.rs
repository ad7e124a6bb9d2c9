//! Per-record idempotency: an item whose processing completed is not processed again when
//! SQS delivers it again, and an item being processed by one invocation is not processed
//! by another at the same time.
//!
//! SQS delivers at least once: a standard queue may deliver a message twice, a sandbox may
//! crash after the side effect and before the delete, a redrive may requeue an item a
//! duplicate already completed. A downstream that honours `Idempotency-Key` absorbs this;
//! a handler whose side effect has no such key (an email, a payment without one) needs a
//! record of what it did. This module keeps one, per item id, in a store with a TTL
//! (DynamoDB in production: `WORKER_IDEMPOTENCY_TABLE`, see
//! `sqs_keeper_aws::idempotency_table`; docs/ARCHITECTURE.md §6):
//!
//! 1. Before the work, one conditional write claims the key `in progress` until the
//!    invocation's deadline, unless it is already there: `completed` (not expired) means
//!    the work was done, so the item is skipped (and a stored result returned); `in
//!    progress` and not past its deadline means another invocation holds it, so the item
//!    is not run: it fails as throttled with a `Retry-After` of at most
//!    [`IN_PROGRESS_POLL`], so the engine looks again within its retries (the holder may
//!    finish: then the item is skipped) and otherwise returns it to the queue.
//! 2. After the work: `completed` with the result (if any), expiring after the TTL. On a
//!    failure the claim is deleted, so the retry can run. Both writes are conditional on
//!    this attempt's token, so a slow attempt whose claim expired and was taken over
//!    cannot overwrite its successor's state.
//! 3. A crash between the two leaves the claim, which expires with the Lambda deadline:
//!    the next delivery (after the visibility timeout, longer than the function's timeout)
//!    runs the work again. That is the one window in which the work runs twice; it cannot
//!    be closed without the side effect itself being transactional.
//!
//! If the completion cannot be written, the item's outcome stands (it was processed) and
//! a warning is logged: the claim then expires and a later duplicate would run again,
//! which is better than reporting a success as a failure and running it again at once.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clock::Clock;
use crate::error::{ErrorClass, ProcessError};
use crate::item::WorkItem;
use crate::processor::{Outcome, Processor};
use crate::random::Random;

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The key was free (or its earlier state expired): this attempt holds it.
    Claimed,
    /// The work was completed; `result` is what was stored with it.
    Completed {
        /// The stored result (JSON text), if one was stored.
        result: Option<String>,
    },
    /// Another attempt holds the key until `until`.
    InProgress {
        /// When that claim expires.
        until: SystemTime,
    },
}

/// Where idempotency records live. Each call is one atomic step.
pub trait IdempotencyStore: Send + Sync {
    /// Claims `key` for the attempt `token` until `in_progress_until`, unless it is
    /// completed and unexpired at `now`, or claimed by another attempt until after `now`.
    fn claim(
        &self,
        key: &str,
        token: &str,
        in_progress_until: SystemTime,
        now: SystemTime,
    ) -> impl Future<Output = Result<Claim, ProcessError>> + Send;

    /// Marks `key` completed with `result` until `expires_at`, if `token` still holds it.
    fn complete(
        &self,
        key: &str,
        token: &str,
        result: Option<&str>,
        expires_at: SystemTime,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// Deletes the claim of `token` on `key` (the work failed; a retry may run).
    fn release(
        &self,
        key: &str,
        token: &str,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;
}

/// The largest result stored with a completion: a DynamoDB item holds 400 KB, and a result
/// is for answering duplicates, not for keeping data.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// The longest a duplicate waits, within one invocation, before looking at a claim held
/// elsewhere again.
pub const IN_PROGRESS_POLL: Duration = Duration::from_secs(1);

/// How long a claim lasts when the worker's deadline is unknown (work run outside the
/// batch engine): Lambda's longest timeout.
const FALLBACK_CLAIM: Duration = Duration::from_secs(15 * 60);

/// What [`Idempotency::once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Once<T> {
    /// The work ran now and returned this.
    Ran(T),
    /// The work had already completed; its stored result, when one was stored (and it
    /// still reads as `T`).
    AlreadyDone(Option<T>),
}

/// Idempotency over a store: the keys' TTL and the claim rules above.
///
/// ```
/// use std::time::Duration;
/// use sqs_keeper_core::idempotency::{Idempotency, Once};
/// use sqs_keeper_core::testing::MemoryIdempotencyStore;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let once = Idempotency::new(MemoryIdempotencyStore::default(), Duration::from_secs(3600));
/// let first = once.once("order-7", || async { Ok(42u32) }).await.unwrap();
/// assert_eq!(first, Once::Ran(42));
/// // A second delivery of the same item does not run the work again.
/// let again = once.once("order-7", || async { Ok(43u32) }).await.unwrap();
/// assert_eq!(again, Once::AlreadyDone(Some(42)));
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct Idempotency<S> {
    store: S,
    ttl: Duration,
    /// What every key starts with ([`Idempotency::with_key_prefix`]).
    key_prefix: String,
    /// The wall clock claims and expiries are read by ([`Idempotency::with_clock`]).
    clock: Clock,
    /// Where claim tokens are drawn from ([`Idempotency::with_random`]).
    random: Random,
}

impl<S: IdempotencyStore> Idempotency<S> {
    /// Creates one whose completed keys expire `ttl` after completion.
    pub fn new(store: S, ttl: Duration) -> Self {
        Idempotency {
            store,
            ttl,
            key_prefix: String::new(),
            clock: Clock::default(),
            random: Random::default(),
        }
    }

    /// Reads wall time (a claim's start, a completion's expiry) from `clock` (the system
    /// clock unless set).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Draws each attempt's claim token from `random` (the thread's generator unless set).
    pub fn with_random(mut self, random: Random) -> Self {
        self.random = random;
        self
    }

    /// Makes every key start with `prefix` (the runner uses the function's name and `#`,
    /// `WORKER_IDEMPOTENCY_KEY_PREFIX`): functions sharing a table keep apart, and no item
    /// id can name another kind of item in it (the circuit breaker's: the configuration
    /// refuses a prefix that could, in a table shared with the breaker).
    pub fn with_key_prefix(mut self, prefix: &str) -> Self {
        self.key_prefix = prefix.to_string();
        self
    }

    /// Returns the store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Runs `work` once for `key`: not again after it completed (the stored result is
    /// returned instead), and not while another attempt runs it (a transient error is
    /// returned, so the item is retried later). An error from `work` releases the key.
    pub async fn once<T, F, Fut>(&self, key: &str, work: F) -> Result<Once<T>, ProcessError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, ProcessError>>,
    {
        if crate::context::cutoff_passed() {
            // Past the cut-off no new work starts (a stream's next item, a later step):
            // nothing is claimed, the attempt ends as cut.
            return Err(ProcessError::deadline_cut(Duration::ZERO));
        }
        let now = self.clock.system_time();
        let until = crate::context::hard_stop()
            .filter(|d| *d > now)
            .unwrap_or(now + FALLBACK_CLAIM);
        let token = attempt_token(now, &self.random);
        let prefixed;
        let key = if self.key_prefix.is_empty() {
            key
        } else {
            prefixed = format!("{}{key}", self.key_prefix);
            prefixed.as_str()
        };
        match self.store.claim(key, &token, until, now).await? {
            Claim::Completed { result } => {
                let result = result.and_then(|text| serde_json::from_str(&text).ok());
                return Ok(Once::AlreadyDone(result));
            }
            Claim::InProgress { .. }
                if crate::mutants::is_on(crate::mutants::Mutant::InProgressClaimIgnored) => {}
            Claim::InProgress { until } => {
                let wait = until.duration_since(now).unwrap_or(Duration::ZERO);
                return Err(ProcessError::new(
                    ErrorClass::Throttled,
                    format!(
                        "in progress in another invocation for {:.0} s more (idempotency key {key:?})",
                        wait.as_secs_f64().ceil()
                    ),
                )
                .with_code("IdempotencyInProgress")
                .with_step("idempotency")
                .with_retry_after(wait.min(IN_PROGRESS_POLL)));
            }
            Claim::Claimed => {}
        }
        // The work is cut at the invocation's cut-off like any attempt, but what follows it
        // is not: once the side effect happened its completion must be written (until the
        // hard stop), and a cut or failed work releases its claim
        // (`crate::context::until_cut`).
        let started = tokio::time::Instant::now();
        let outcome = crate::context::until_cut(work())
            .await
            .unwrap_or_else(|| Err(ProcessError::deadline_cut(started.elapsed())));
        crate::context::finishing(self.settle(key, &token, outcome)).await
    }

    /// Completes the claim after work that succeeded, releases it after work that failed.
    async fn settle<T: Serialize>(
        &self,
        key: &str,
        token: &str,
        outcome: Result<T, ProcessError>,
    ) -> Result<Once<T>, ProcessError> {
        match outcome {
            Ok(value) => {
                let text = serde_json::to_string(&value).ok();
                let stored = text.as_deref().filter(|t| t.len() <= MAX_RESULT_BYTES);
                if text.is_some() && stored.is_none() {
                    tracing::warn!(key, limit = MAX_RESULT_BYTES, "result too large to store with the idempotency record; a duplicate will see no result");
                }
                let expires = self.clock.system_time() + self.ttl;
                if let Err(error) = self.store.complete(key, token, stored, expires).await {
                    tracing::warn!(key, %error, "the work completed but its idempotency record could not be written; a duplicate delivered after the claim expires would run it again");
                }
                Ok(Once::Ran(value))
            }
            Err(error) => {
                if let Err(release) = self.store.release(key, token).await {
                    tracing::warn!(key, error = %release, "could not release the idempotency claim; it expires with the invocation's deadline");
                }
                Err(error)
            }
        }
    }
}

/// Returns a unique token for one attempt, claiming `now`: which claim is whose.
fn attempt_token(now: SystemTime, random: &Random) -> String {
    let nanos = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{:016x}", random.u64(..))
}

/// A processor whose items are processed once per item id (see the module's
/// documentation). A duplicate of a completed item is skipped, its reason saying so.
#[derive(Debug)]
pub struct Idempotent<P, S> {
    inner: P,
    idempotency: Idempotency<S>,
}

impl<P, S> Idempotent<P, S> {
    /// Wraps `inner` so it runs once per item id.
    pub fn new(inner: P, idempotency: Idempotency<S>) -> Self {
        Idempotent { inner, idempotency }
    }

    /// Returns the processor inside.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

/// The outcome as stored with a completion, so a duplicate can say what the first
/// delivery did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
struct StoredOutcome {
    done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    skipped: Option<String>,
    /// The skip was the downstream's answer ([`Outcome::AlreadyDone`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    answered: bool,
}

impl<P: Processor, S: IdempotencyStore> Processor for Idempotent<P, S> {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let ran = self
            .idempotency
            .once(&item.item_id, || async {
                self.inner.process(item).await.map(|outcome| match outcome {
                    Outcome::Done => StoredOutcome {
                        done: true,
                        skipped: None,
                        answered: false,
                    },
                    Outcome::Skipped { reason } => StoredOutcome {
                        done: false,
                        skipped: Some(reason),
                        answered: false,
                    },
                    Outcome::AlreadyDone { reason } => StoredOutcome {
                        done: false,
                        skipped: Some(reason),
                        answered: true,
                    },
                })
            })
            .await?;
        Ok(match ran {
            Once::Ran(StoredOutcome { skipped: None, .. }) => Outcome::Done,
            Once::Ran(StoredOutcome {
                skipped: Some(reason),
                answered: true,
                ..
            }) => Outcome::AlreadyDone { reason },
            Once::Ran(StoredOutcome {
                skipped: Some(reason),
                ..
            }) => Outcome::Skipped { reason },
            Once::AlreadyDone(_) => Outcome::Skipped {
                reason: "already processed (idempotency record)".to_string(),
            },
        })
    }

    fn attempt_timeout(&self) -> Option<std::time::Duration> {
        self.inner.attempt_timeout()
    }

    async fn on_dead_letter(
        &self,
        dead: &crate::processor::DeadLettered<'_>,
    ) -> Result<(), ProcessError> {
        self.inner.on_dead_letter(dead).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemoryIdempotencyStore;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    struct Counting {
        runs: Arc<AtomicU32>,
        fail_first: bool,
    }

    impl Processor for Counting {
        async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
            let n = self.runs.fetch_add(1, Ordering::SeqCst);
            if self.fail_first && n == 0 {
                return Err(ProcessError::new(ErrorClass::ServerError, "boom"));
            }
            Ok(Outcome::Done)
        }
    }

    fn processor(
        store: &MemoryIdempotencyStore,
        fail_first: bool,
    ) -> (Idempotent<Counting, MemoryIdempotencyStore>, Arc<AtomicU32>) {
        let runs = Arc::new(AtomicU32::new(0));
        let p = Idempotent::new(
            Counting {
                runs: runs.clone(),
                fail_first,
            },
            Idempotency::new(store.clone(), Duration::from_secs(3600)),
        );
        (p, runs)
    }

    #[tokio::test]
    async fn a_result_up_to_64_kib_is_kept_for_duplicates_and_a_larger_one_is_not() {
        let store = MemoryIdempotencyStore::default();
        let once = Idempotency::new(store, Duration::from_secs(3600));
        // A JSON string of n bytes serialises to n + 2 (its quotes): 64 KiB exactly is
        // kept, a byte more is not.
        assert_eq!(MAX_RESULT_BYTES, 65_536);
        let fits = "a".repeat(65_536 - 2);
        let too_big = "a".repeat(65_536 - 1);
        for (key, value, kept) in [("fits", fits, true), ("too-big", too_big, false)] {
            let ran = once
                .once(key, || async { Ok(value.clone()) })
                .await
                .unwrap();
            assert_eq!(ran, Once::Ran(value.clone()));
            let again = once
                .once(key, || async {
                    Ok::<String, ProcessError>("ran twice".into())
                })
                .await
                .unwrap();
            assert_eq!(again, Once::AlreadyDone(kept.then_some(value)), "{key}");
        }
    }

    /// Only a result too large to keep is warned of: a small one, or none, is stored
    /// without a word.
    #[tokio::test]
    async fn only_a_result_too_large_to_keep_is_warned_of() {
        let (logged, _guard) = crate::test_log::capture();
        let once = Idempotency::new(MemoryIdempotencyStore::default(), Duration::from_secs(3600));
        let text = || logged.text();
        once.once("small", || async { Ok(7u32) }).await.unwrap();
        once.once("none", || async { Ok(()) }).await.unwrap();
        assert!(!text().contains("too large"), "{}", text());
        let big = "a".repeat(MAX_RESULT_BYTES);
        once.once("big", || async { Ok(big.clone()) })
            .await
            .unwrap();
        assert!(text().contains("result too large"), "{}", text());
    }

    #[tokio::test]
    async fn a_completed_item_is_skipped_on_redelivery() {
        let store = MemoryIdempotencyStore::default();
        let (p, runs) = processor(&store, false);
        let item = WorkItem::new("m-1", "{}");
        assert_eq!(p.process(&item).await.unwrap(), Outcome::Done);
        let again = p.process(&item).await.unwrap();
        assert!(
            matches!(again, Outcome::Skipped { reason } if reason.contains("already processed"))
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failure_releases_the_key_for_the_retry() {
        let store = MemoryIdempotencyStore::default();
        let (p, runs) = processor(&store, true);
        let item = WorkItem::new("m-1", "{}");
        assert_eq!(
            p.process(&item).await.unwrap_err().class,
            ErrorClass::ServerError
        );
        assert_eq!(p.process(&item).await.unwrap(), Outcome::Done);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_item_in_progress_elsewhere_is_returned_for_retry_until_its_claim_expires() {
        let store = MemoryIdempotencyStore::default();
        let now = SystemTime::now();
        let held = store
            .claim("m-1", "other", now + Duration::from_secs(60), now)
            .await
            .unwrap();
        assert_eq!(held, Claim::Claimed);
        let (p, runs) = processor(&store, false);
        let error = p.process(&WorkItem::new("m-1", "{}")).await.unwrap_err();
        assert!(error.class.is_retryable(false));
        assert_eq!(error.code.as_deref(), Some("IdempotencyInProgress"));
        assert_eq!(error.retry_after, Some(IN_PROGRESS_POLL));
        assert!(error.message.contains("60 s more"), "{}", error.message);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        // The holder died: its claim expires with its deadline, and the work runs.
        let later = now + Duration::from_secs(61);
        assert_eq!(
            store
                .claim("m-1", "mine", later + Duration::from_secs(60), later)
                .await
                .unwrap(),
            Claim::Claimed
        );
    }

    /// Claims are read by the layer's clock: one that follows tokio's paused clock from the
    /// year 2000 sees another's claim of then as held (by the system clock it would have
    /// expired long ago).
    #[tokio::test(start_paused = true)]
    async fn claims_are_read_by_the_layers_clock() {
        let clock = crate::clock::Clock::following_tokio(
            chrono::DateTime::from_timestamp(946_684_800, 0).unwrap(),
        );
        let now = clock.system_time();
        let store = MemoryIdempotencyStore::default();
        store
            .claim("held", "other", now + Duration::from_secs(60), now)
            .await
            .unwrap();
        let once = Idempotency::new(store, Duration::from_secs(3600))
            .with_clock(clock)
            .with_random(Random::seeded(7));
        let error = once
            .once("held", || async { Ok::<_, ProcessError>(()) })
            .await
            .unwrap_err();
        assert!(error.message.contains("60 s more"), "{}", error.message);
    }

    #[test]
    fn a_claim_token_is_its_time_and_a_draw_of_the_layers_random() {
        let now = UNIX_EPOCH + Duration::from_nanos(0xabc);
        let token = attempt_token(now, &Random::seeded(7));
        assert_eq!(token, attempt_token(now, &Random::seeded(7)));
        assert!(token.starts_with("abc-"), "{token}");
    }

    #[tokio::test]
    async fn once_stores_and_returns_the_result() {
        let store = MemoryIdempotencyStore::default();
        let idempotency = Idempotency::new(store, Duration::from_secs(3600));
        let first = idempotency
            .once("charge-1", || async {
                Ok::<_, ProcessError>(String::from("receipt-9"))
            })
            .await
            .unwrap();
        assert_eq!(first, Once::Ran("receipt-9".to_string()));
        let second = idempotency
            .once("charge-1", || async {
                Ok::<_, ProcessError>(String::from("again"))
            })
            .await
            .unwrap();
        assert_eq!(second, Once::AlreadyDone(Some("receipt-9".to_string())));
    }

    #[tokio::test]
    async fn a_stale_token_cannot_complete_or_release_a_successors_claim() {
        let store = MemoryIdempotencyStore::default();
        let now = SystemTime::now();
        store.claim("k", "old", now, now).await.unwrap();
        let later = now + Duration::from_secs(1);
        store
            .claim("k", "new", later + Duration::from_secs(60), later)
            .await
            .unwrap();
        assert!(store.complete("k", "old", None, later).await.is_err());
        assert!(store.release("k", "old").await.is_err());
        let held = store.claim("k", "third", later, later).await.unwrap();
        assert!(matches!(held, Claim::InProgress { .. }));
    }

    #[tokio::test]
    async fn functions_sharing_a_table_do_not_skip_each_others_items() {
        let store = MemoryIdempotencyStore::default();
        let runs = Arc::new(AtomicU32::new(0));
        let function = |prefix: &str| {
            Idempotent::new(
                Counting {
                    runs: runs.clone(),
                    fail_first: false,
                },
                Idempotency::new(store.clone(), Duration::from_secs(3600)).with_key_prefix(prefix),
            )
        };
        // Two subscribers of one topic get the same message (the same item id).
        let item = WorkItem::new("sns-message-1", "{}");
        assert_eq!(
            function("orders#").process(&item).await.unwrap(),
            Outcome::Done
        );
        assert_eq!(
            function("audit#").process(&item).await.unwrap(),
            Outcome::Done
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "each function did its own work"
        );
        // The same function's duplicate is still skipped.
        assert!(matches!(
            function("orders#").process(&item).await.unwrap(),
            Outcome::Skipped { .. }
        ));
        assert!(store.is_completed("orders#sns-message-1"));
    }
}
