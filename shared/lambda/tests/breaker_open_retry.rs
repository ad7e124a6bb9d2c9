//! The breaker opens even when the write that crossed the threshold could not open it (a throttled table): the next failure counted tries again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use sqs_keeper_core::testing::MemoryBreakerStore;
use sqs_keeper_core::WorkItem;
use sqs_keeper_core::{
    breaker::Breaker, breaker::BreakerPolicy, breaker::BreakerState, breaker::BreakerStore,
};
use sqs_keeper_core::{ErrorClass, ProcessError};
use sqs_keeper_core::{Outcome, Processor};

/// The table throttles the first `open` (one ProvisionedThroughputExceeded).
#[derive(Clone, Default)]
struct OneOpenThrottled {
    inner: MemoryBreakerStore,
    opens_tried: Arc<AtomicU32>,
}

impl BreakerStore for OneOpenThrottled {
    fn read(&self) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        self.inner.read()
    }
    fn add_failures(
        &self,
        n: u32,
        now: SystemTime,
        window: Duration,
    ) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        self.inner.add_failures(n, now, window)
    }
    fn open(
        &self,
        until: SystemTime,
        opens: u32,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        if self.opens_tried.fetch_add(1, Ordering::SeqCst) == 0 {
            return Box::pin(async {
                Err(ProcessError::new(
                    ErrorClass::Throttled,
                    "ProvisionedThroughputExceeded",
                ))
            });
        }
        self.inner.open(until, opens, now)
    }
    fn take_probe(
        &self,
        until: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        self.inner.take_probe(until, now)
    }
    fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
        self.inner.close()
    }
    fn release_probe(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
        self.inner.release_probe(until)
    }
}

struct Down(Arc<AtomicU32>);

impl Processor for Down {
    async fn process(&self, _item: &WorkItem) -> Result<Outcome, ProcessError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(ProcessError::new(ErrorClass::ServerError, "503"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_opening_is_tried_again_by_the_next_failure_counted() {
    let store = OneOpenThrottled::default();
    let calls = Arc::new(AtomicU32::new(0));
    let policy = BreakerPolicy {
        threshold: 5,
        window: Duration::from_secs(60),
        open_for: Duration::from_secs(30),
        max_open: Duration::from_secs(900),
        probe_for: Duration::from_secs(60),
        refresh: Duration::from_secs(1),
    };
    let breaker = Breaker::new(Down(calls.clone()), store.clone(), policy);
    let item = WorkItem::new("m", "{}");
    // 50 s of a dead downstream, a record every 100 ms: 100 times the threshold.
    for _ in 0..500 {
        let _ = breaker.process(&item).await;
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let state = store.inner.state();
    assert!(
        state.open_until.is_some(),
        "{} failures counted ({} calls, {} opening tried) and the breaker is still closed: {state:?}",
        state.failures,
        calls.load(Ordering::SeqCst),
        store.opens_tried.load(Ordering::SeqCst)
    );
}
