//! The circuit breaker's shared state as the simulation keeps it: the library's own
//! [`MemoryBreakerStore`] (the DynamoDB adapter's conditions, in memory), with each call
//! taking simulated latency and failing as the table's fault rate says, and what each
//! sandbox last learnt of it kept in the world, so the checks can judge a call by what its
//! sandbox knew ([`known`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use sqs_keeper_core::testing::MemoryBreakerStore;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::{breaker::BreakerState, breaker::BreakerStore};

use crate::world::{Checks, World};

/// One sandbox's handle on the shared breaker state.
#[derive(Debug, Clone)]
pub struct SimBreakerStore {
    world: Arc<World>,
    inner: MemoryBreakerStore,
    sandbox: String,
}

impl SimBreakerStore {
    /// `sandbox`'s handle on `inner` (clones of one memory store share its state).
    pub fn new(world: Arc<World>, inner: MemoryBreakerStore, sandbox: &str) -> Self {
        SimBreakerStore {
            world,
            inner,
            sandbox: sandbox.to_string(),
        }
    }

    /// A call's latency and its fault, as every table call has them.
    async fn call(&self, step: &str) -> Result<(), ProcessError> {
        crate::store::call_latency(&self.world).await;
        let mut state = self.world.lock();
        if state.call_fails(
            |f| f.table,
            &self.sandbox,
            "-",
            &format!("breaker {step} failed"),
        ) {
            return Err(ProcessError::new(
                sqs_keeper_core::ErrorClass::Throttled,
                "breaker table throttled (injected)",
            ));
        }
        state
            .ext
            .ledger
            .breaker_contact
            .insert(self.sandbox.clone(), self.world.clock.system_time());
        Ok(())
    }

    /// This sandbox tried to answer a probe it may hold: closed the breaker, opened it
    /// again or gave the probe back.
    fn answered(&self) {
        let mut state = self.world.lock();
        state
            .ext
            .ledger
            .probes_answered
            .insert(self.sandbox.clone());
    }

    /// A write answering a probe the table did not take: a sandbox probing on its own (as
    /// judged at `before`, when it wrote) keeps its probe's answer, `state`, to itself
    /// (the library's `Breaker::probe` does), so that is what it now knows.
    fn keep_own_answer(&self, before: SystemTime, state: BreakerState) {
        let mut world = self.world.lock();
        if probes_on_its_own(&world, &self.sandbox, before) {
            world
                .ext
                .ledger
                .breaker_known
                .insert(self.sandbox.clone(), state);
        }
    }

    /// §1.12: a worker's sandbox, or a redrive run that took the probe, closes the breaker
    /// only on the downstream's answer to its probe, never on a failure that did not reach
    /// it (a handler's decode error, a bad item).
    fn closes_on_an_answer(&self) {
        let mut state = self.world.lock();
        let unanswered = state.ext.ledger.answered_since_probe.get(&self.sandbox) == Some(&false);
        if unanswered {
            state.violate(
                crate::world::Section::Breaker,
                "-",
                format!(
                    "{} closed the breaker after a probe the downstream never answered",
                    self.sandbox
                ),
            );
        }
    }

    /// What this sandbox now knows of the state.
    fn learn(&self, what: &str) {
        let known = self.inner.state();
        let mut state = self.world.lock();
        state
            .ext
            .ledger
            .breaker_known
            .insert(self.sandbox.clone(), known);
        state.after_step(&self.sandbox, "-", what);
    }
}

impl BreakerStore for SimBreakerStore {
    fn read(&self) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        Box::pin(async move {
            self.call("read").await?;
            let read = self.inner.read().await?;
            self.world
                .lock()
                .ext
                .ledger
                .breaker_known
                .insert(self.sandbox.clone(), read.clone());
            Ok(read)
        })
    }

    fn add_failures(
        &self,
        n: u32,
        now: SystemTime,
        window: Duration,
    ) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        Box::pin(async move {
            self.call("count").await?;
            let after = self.inner.add_failures(n, now, window).await?;
            self.learn(&format!(
                "breaker: {n} failure(s) counted, {} in the window",
                after.failures
            ));
            Ok(after)
        })
    }

    fn open(
        &self,
        until: SystemTime,
        opens: u32,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            self.answered();
            let before = self.world.clock.system_time();
            if let Err(e) = self.call("open").await {
                self.keep_own_answer(
                    before,
                    BreakerState {
                        open_until: Some(until),
                        opens,
                        ..BreakerState::default()
                    },
                );
                return Err(e);
            }
            let opened = self.inner.open(until, opens, now).await?;
            if opened {
                let secs = until.duration_since(now).unwrap_or_default().as_secs();
                self.learn(&format!(
                    "breaker opened for {secs} s (opening {opens} in a row)"
                ));
            }
            Ok(opened)
        })
    }

    fn take_probe(
        &self,
        until: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            self.world
                .lock()
                .ext
                .ledger
                .answered_since_probe
                .insert(self.sandbox.clone(), false);
            self.call("probe").await?;
            let taken = self.inner.take_probe(until, now).await?;
            if taken {
                self.world
                    .lock()
                    .ext
                    .ledger
                    .probes
                    .insert(self.sandbox.clone(), until);
                self.learn("breaker: probe taken");
            }
            Ok(taken)
        })
    }

    fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            self.answered();
            self.closes_on_an_answer();
            let before = self.world.clock.system_time();
            if let Err(e) = self.call("close").await {
                self.keep_own_answer(before, BreakerState::default());
                return Err(e);
            }
            self.inner.close().await?;
            self.learn("breaker closed");
            Ok(())
        })
    }

    fn release_probe(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            self.answered();
            self.call("release_probe").await?;
            self.inner.release_probe(until).await?;
            self.learn("breaker: probe given back");
            Ok(())
        })
    }
}

/// Forgets what `actor` knew of the breaker: a redrive run starts knowing nothing (a new
/// invocation of the function, a new `dlq redrive`).
pub fn forget(state: &mut crate::world::State, actor: &str) {
    let ledger = &mut state.ext.ledger;
    ledger.breaker_known.remove(actor);
    ledger.probes.remove(actor);
    ledger.probes_answered.remove(actor);
    ledger.breaker_contact.remove(actor);
}

/// §1.12 for a redrive run (docs/ARCHITECTURE.md §7): in a world with a breaker, a run
/// calls the downstream only after reading the breaker closed, or as the probe it took
/// once the open period was over.
pub fn redrive_call_refused(
    state: &crate::world::State,
    actor: &str,
    now: SystemTime,
) -> Option<String> {
    state.ext.breaker.as_ref()?;
    let Some(known) = state.ext.ledger.breaker_known.get(actor) else {
        return Some(format!(
            "{actor} called the downstream without reading the breaker"
        ));
    };
    if known.is_open(now) {
        return Some(format!(
            "{actor} called the downstream while the breaker it had read was open"
        ));
    }
    let took_probe = state.ext.ledger.probes.contains_key(actor);
    (known.is_half_open(now) && !took_probe).then(|| {
        format!("{actor} called the downstream while the breaker it had read was half-open, without the probe")
    })
}

/// §1.12 for a redrive run that took the probe: it answers it before it ends, so that no
/// sandbox refuses its records until the probe lapses.
pub fn probe_left_unanswered(state: &crate::world::State, actor: &str) -> Option<String> {
    let ledger = &state.ext.ledger;
    (ledger.probes.contains_key(actor) && !ledger.probes_answered.contains(actor)).then(|| {
        format!("{actor} took the breaker's probe and ended without closing the breaker, opening it again or giving the probe back")
    })
}

/// Whether `sandbox` calls the downstream now as a probe on its own: the breaker it knew
/// half-open, the probe not taken in the table, and no call to the table succeeding for
/// an open period.
pub fn probes_on_its_own(state: &crate::world::State, sandbox: &str, now: SystemTime) -> bool {
    let ledger = &state.ext.ledger;
    let Some(known) = ledger.breaker_known.get(sandbox) else {
        return false;
    };
    let holds_probe = ledger.probes.get(sandbox).is_some_and(|until| *until > now);
    let out_of_touch = match (ledger.breaker_contact.get(sandbox), ledger.breaker_open_for) {
        (Some(contact), Some(open_for)) => {
            now.duration_since(*contact).unwrap_or_default() >= open_for
        }
        _ => false,
    };
    known.is_half_open(now) && !holds_probe && out_of_touch
}

/// §1.12: the breaker withholds the downstream from a sandbox that knows it open, and
/// lets through only the sandbox that holds the probe while it is half-open (one at a
/// time: taking the probe is conditional). Judged by what `sandbox` last read or wrote: a
/// sandbox trusts its read for the refresh period, and a read that fails keeps the last
/// state known, so calls on a stale "closed" are the design, not a break. A sandbox whose
/// calls to the table have all failed for an open period probes on its own once the period
/// is over and follows its probe's answer (the table cannot tell it otherwise): its calls
/// past a half-open it knew are excused (docs/SIMULATION.md, "Windows excused").
pub fn call_refused_by_what_it_knew(
    state: &crate::world::State,
    sandbox: &str,
    now: SystemTime,
) -> Option<String> {
    let known = state.ext.ledger.breaker_known.get(sandbox)?;
    if known.is_open(now) {
        return Some(format!(
            "{sandbox} called the downstream while the breaker it had read was open"
        ));
    }
    let holds_probe = state
        .ext
        .ledger
        .probes
        .get(sandbox)
        .is_some_and(|until| *until > now);
    let out_of_touch = match (
        state.ext.ledger.breaker_contact.get(sandbox),
        state.ext.ledger.breaker_open_for,
    ) {
        (Some(contact), Some(open_for)) => {
            now.duration_since(*contact).unwrap_or_default() >= open_for
        }
        _ => false,
    };
    (known.is_half_open(now) && !holds_probe && !out_of_touch).then(|| {
        format!(
            "{sandbox} called the downstream while the breaker it had read was half-open, without holding the probe"
        )
    })
}
