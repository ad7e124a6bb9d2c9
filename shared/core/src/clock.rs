//! The wall clock of the core: record timestamps, lease expiries, ages.
//!
//! It is `chrono::Utc::now()`, except in the deterministic simulation (`sqs-keeper-sim`,
//! through the test-only `sim` feature), where wall time must follow tokio's paused clock:
//! hours of pipeline time pass in milliseconds there, and leases must expire with them.
//! Production builds never enable the feature, so the function is `Utc::now()` exactly.

use chrono::{DateTime, Utc};

/// Now, as the core sees it.
pub fn now() -> DateTime<Utc> {
    #[cfg(feature = "sim")]
    if let Some(now) = virtual_clock::now() {
        return now;
    }
    Utc::now()
}

/// The simulation's clock: wall time = a chosen start + the time tokio's clock has advanced
/// since, per thread (each simulated world runs on one thread).
#[cfg(feature = "sim")]
pub mod virtual_clock {
    use std::cell::Cell;

    use chrono::{DateTime, Utc};
    use tokio::time::Instant;

    thread_local! {
        static ORIGIN: Cell<Option<(Instant, DateTime<Utc>)>> = const { Cell::new(None) };
    }

    /// From now on (on this thread), wall time is `start` plus tokio's elapsed time.
    pub fn start(start: DateTime<Utc>) {
        ORIGIN.with(|o| o.set(Some((Instant::now(), start))));
    }

    /// Back to the system clock on this thread.
    pub fn stop() {
        ORIGIN.with(|o| o.set(None));
    }

    pub(super) fn now() -> Option<DateTime<Utc>> {
        ORIGIN.with(Cell::get).map(|(origin, start)| {
            let elapsed = chrono::Duration::from_std(Instant::now() - origin)
                .unwrap_or(chrono::Duration::zero());
            start + elapsed
        })
    }
}
