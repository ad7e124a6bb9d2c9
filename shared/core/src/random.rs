//! The randomness of the core: backoff jitter, the jitter of spaced redeliveries, redrive
//! run ids, sweep pass markers, idempotency claim tokens.
//!
//! Drawn from a [`Random`] held by the value that draws (the retry policy, the batch
//! engine's [`crate::BatchConfig`], the redrive engine's settings, the sweep's options, the
//! idempotency layer), never from a global a caller would have to seed, so that a caller
//! can choose it. Its default is fastrand's generator of the calling thread; a test or a
//! simulation that must replay exactly gives [`Random::seeded`] instead.

use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, PoisonError};

/// Where random draws come from: fastrand's generator of the calling thread (the
/// default), or one seeded generator ([`Random::seeded`]) that every clone shares. Cheap
/// to clone.
#[derive(Debug, Clone, Default)]
pub struct Random(Source);

#[derive(Debug, Clone, Default)]
enum Source {
    #[default]
    Thread,
    /// One generator behind a lock, shared by the clones: the values given one seeded
    /// `Random` draw one sequence, in the order they draw.
    Seeded(Arc<Mutex<fastrand::Rng>>),
}

impl Random {
    /// fastrand's generator of the calling thread (seeded from the system at its first use).
    pub const fn thread() -> Self {
        Random(Source::Thread)
    }

    /// Returns a generator seeded with `seed`: the same seed draws the same values in the same
    /// order. Its clones share it, so one seeded `Random` given to every value that draws
    /// makes one sequence (of a single-threaded run, the same at every run).
    pub fn seeded(seed: u64) -> Self {
        Random(Source::Seeded(Arc::new(Mutex::new(
            fastrand::Rng::with_seed(seed),
        ))))
    }

    /// Returns a `u64` in `range`, uniformly.
    pub fn u64(&self, range: impl RangeBounds<u64>) -> u64 {
        match &self.0 {
            Source::Thread => fastrand::u64(range),
            Source::Seeded(rng) => rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .u64(range),
        }
    }

    /// Returns an `f64` in `[0, 1)`, uniformly.
    pub fn f64(&self) -> f64 {
        match &self.0 {
            Source::Thread => fastrand::f64(),
            Source::Seeded(rng) => rng.lock().unwrap_or_else(PoisonError::into_inner).f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_source_replays_and_its_clones_share_one_sequence() {
        let draws = |random: &Random| (random.u64(..), random.f64(), random.u64(0..=10));
        assert_eq!(
            draws(&Random::seeded(7)),
            draws(&Random::seeded(7)),
            "the same seed, the same draws"
        );
        // Draws alternated between two clones are the sequence of one generator.
        let one = Random::seeded(7);
        let other = one.clone();
        let shared = (one.u64(..), other.f64(), one.u64(0..=10));
        assert_eq!(shared, draws(&Random::seeded(7)));
        // The same draws as fastrand's own generator with that seed.
        let mut rng = fastrand::Rng::with_seed(7);
        assert_eq!(
            draws(&Random::seeded(7)),
            (rng.u64(..), rng.f64(), rng.u64(0..=10))
        );
    }

    #[test]
    fn the_default_draws_from_the_thread_generator() {
        let random = Random::default();
        assert!(matches!(random.0, Source::Thread));
        assert!(random.u64(3..=3) == 3 && (0.0..1.0).contains(&random.f64()));
    }
}
