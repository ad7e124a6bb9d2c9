//! The wall clock of the core: record timestamps, lease expiries, ages.
//!
//! Wall time is read from a [`Clock`] held by the value that does the work (the batch
//! engine's [`crate::BatchConfig`], the retry policy, the breaker, the idempotency layer,
//! the recording settings, the redrive engine's settings, the stores), never from a global,
//! so that a caller can choose it. Its default is the system clock; a test or a simulation
//! that pauses tokio's clock gives [`Clock::following_tokio`] instead, so that wall time
//! moves with the paused clock: hours of pipeline time pass in milliseconds there, and
//! leases must expire with them.

use std::time::SystemTime;

use chrono::{DateTime, Utc};

/// Where wall time comes from: the system clock ([`Clock::system`], the default), or
/// tokio's clock from a chosen start ([`Clock::following_tokio`]). Cheap to copy: every
/// value that reads wall time keeps its own copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock(Source);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Source {
    #[default]
    System,
    /// Wall time = `start` + the time tokio's clock has advanced since `origin`.
    Tokio {
        origin: tokio::time::Instant,
        start: DateTime<Utc>,
    },
}

impl Clock {
    /// Returns the system clock (`chrono::Utc::now()`).
    pub const fn system() -> Self {
        Clock(Source::System)
    }

    /// Returns a clock that reads `start` now and then follows tokio's clock: wall time is `start`
    /// plus the time tokio's clock has advanced since this call. Under a paused clock
    /// (`tokio::time::pause`, `start_paused`) it moves only as tokio's does, so the wall
    /// time a run reads is the same at every run. Made within the runtime whose clock it is
    /// to follow (tokio's clock is the runtime's).
    pub fn following_tokio(start: DateTime<Utc>) -> Self {
        Clock(Source::Tokio {
            origin: tokio::time::Instant::now(),
            start,
        })
    }

    /// Returns the time now, by this clock.
    pub fn now(&self) -> DateTime<Utc> {
        match self.0 {
            Source::System => Utc::now(),
            Source::Tokio { origin, start } => {
                let elapsed = tokio::time::Instant::now().saturating_duration_since(origin);
                chrono::Duration::from_std(elapsed)
                    .ok()
                    .and_then(|elapsed| start.checked_add_signed(elapsed))
                    .unwrap_or(DateTime::<Utc>::MAX_UTC)
            }
        }
    }

    /// Returns [`Clock::now`] as a `SystemTime`.
    pub fn system_time(&self) -> SystemTime {
        SystemTime::from(self.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_clock_following_tokio_moves_with_its_paused_clock_only() {
        let start = DateTime::from_timestamp(1_767_225_600, 0).unwrap();
        let clock = Clock::following_tokio(start);
        assert_eq!(clock.now(), start);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(clock.now(), start + chrono::Duration::hours(1));
        assert_eq!(clock.system_time(), SystemTime::from(clock.now()));
        // A copy reads the same time.
        let copy = clock;
        assert_eq!(copy.now(), clock.now());
    }

    #[test]
    fn the_default_is_the_system_clock() {
        assert_eq!(Clock::default(), Clock::system());
        let before = Utc::now();
        let now = Clock::system().now();
        assert!(now >= before && now <= Utc::now());
    }
}
