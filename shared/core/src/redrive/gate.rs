//! The redrive behind the worker's circuit breaker (docs/ARCHITECTURE.md §7): the gate the
//! redrive function, a local `dlq redrive` and the simulation all run a request through.
//! A reprocessing run is held back while the breaker is open, and is the breaker's probe
//! once the open period is over.

use crate::redrive::{RedriveEngine, RedriveError, RedriveReport, RedriveRequest};
use crate::Processor;

/// Runs a redrive behind the worker's circuit breaker (docs/ARCHITECTURE.md §7), as the
/// redrive function and a local `dlq redrive` both do: a reprocessing run does not go ahead
/// while the breaker is open; once its open period is over, this run is the probe (one
/// item first: its success closes the breaker and the run goes on, its failure of the
/// downstream opens it again, and an item that tells nothing of the downstream gives way
/// to the next, up to five), unless a worker is probing. Requeues and dry runs do not
/// call the downstream and are not gated. A run the breaker held back answers with an
/// empty report whose `held_by_breaker` says why.
pub async fn run_gated<P, S, B>(
    engine: &RedriveEngine<P, S>,
    breaker: Option<(&B, &crate::breaker::BreakerPolicy)>,
    request: &RedriveRequest,
    deadline: Option<tokio::time::Instant>,
    on_item: &(dyn Fn(&crate::redrive::ItemOutcome) + Send + Sync),
) -> Result<RedriveReport, RedriveError>
where
    P: Processor,
    S: crate::ports::RedrivePorts,
    B: crate::breaker::BreakerStore,
{
    // A continuation runs the request its token carries: the gate judges that one (a dry
    // run's continuation is a dry run, never the breaker's probe).
    let request = &request.resumed()?;
    let probe = match gate(engine, breaker, request, deadline, on_item).await? {
        Gate::Stop(mut report) => {
            // Held back or stopped after its probe: the DLQ age alarm still gets its figure.
            if !request.dry_run && report.oldest_dead_age_secs.is_none() {
                report.oldest_dead_age_secs = engine.oldest_dead_age().await;
            }
            return Ok(report);
        }
        Gate::Go(probe) => probe,
    };
    let mut report = engine.run_until(request, deadline, on_item).await?;
    if let Some(probe) = probe {
        report.absorb(probe);
    }
    Ok(report)
}

async fn gate<P, S, B>(
    engine: &RedriveEngine<P, S>,
    breaker: Option<(&B, &crate::breaker::BreakerPolicy)>,
    request: &RedriveRequest,
    deadline: Option<tokio::time::Instant>,
    on_item: &(dyn Fn(&crate::redrive::ItemOutcome) + Send + Sync),
) -> Result<Gate, RedriveError>
where
    P: Processor,
    S: crate::ports::RedrivePorts,
    B: crate::breaker::BreakerStore,
{
    let Some((breaker, policy)) = breaker else {
        return Ok(Gate::Go(None));
    };
    if request.mode != crate::redrive::RedriveMode::Reprocess || request.dry_run {
        return Ok(Gate::Go(None));
    }
    let skipped = |why: &str| Ok(held_by_breaker(request, why));
    let now = engine.settings().retry.clock.system_time();
    let state = match breaker.read().await {
        Ok(state) => state,
        Err(error) => {
            // Unread, the breaker may be open: the run waits for a readable state (the
            // schedule comes round again) rather than calling a downstream it may protect.
            tracing::warn!(%error, "circuit breaker state unreadable");
            return skipped("breaker state unreadable");
        }
    };
    if state.is_open(now) {
        return skipped("open period running");
    }
    if !state.is_half_open(now) {
        return Ok(Gate::Go(None));
    }
    let probe_until = now + probe_lock(engine.settings(), policy, deadline);
    match breaker.take_probe(probe_until, now).await {
        Ok(true) => {}
        Ok(false) => return skipped("a worker is probing"),
        Err(error) => {
            tracing::warn!(%error, "could not take the circuit breaker's probe");
            return skipped("probe unavailable");
        }
    }
    let report = match probe_items(engine, request, deadline, on_item).await {
        Ok(report) => report,
        Err(error) => {
            // Nothing was reprocessed: the probe goes back, as below.
            if let Err(release) = breaker.release_probe(probe_until).await {
                tracing::warn!(error = %release, "could not give back the circuit breaker's probe; it lapses by itself");
            }
            return Err(error);
        }
    };
    Ok(Box::pin(decide_probe(
        breaker,
        policy,
        &state,
        now,
        probe_until,
        report,
    ))
    .await)
}

/// Returns the report of a run the breaker holds back (`why`): nothing is reprocessed now.
fn held_by_breaker(request: &RedriveRequest, why: &str) -> Gate {
    tracing::info!("the worker's circuit breaker is open ({why}): nothing is reprocessed now");
    Gate::Stop(RedriveReport {
        mode: request.mode,
        held_by_breaker: Some(why.to_string()),
        ..RedriveReport::default()
    })
}

/// Returns how long the probe's lock lasts: as long as the probe run can, to its deadline and never
/// past its one item's lease (no attempt outlives it), with the worker's slack. So no
/// worker sandbox probes beside it. The configured `probe_for` alone is a minute, and an
/// item's attempts may take longer.
fn probe_lock(
    settings: &crate::redrive::RedriveSettings,
    policy: &crate::breaker::BreakerPolicy,
    deadline: Option<tokio::time::Instant>,
) -> std::time::Duration {
    let run_bound = deadline
        .map(|d| d.saturating_duration_since(tokio::time::Instant::now()))
        .unwrap_or(settings.lease_ttl)
        .min(settings.lease_ttl);
    policy
        .probe_for
        .max(run_bound.saturating_add(crate::breaker::PROBE_SLACK))
}

/// Returns what the probe run's `report` decides: the downstream's answer closes the breaker and
/// lets the run go on; its transient failure opens the breaker again for longer; nothing
/// told of the downstream gives the probe back.
async fn decide_probe<B: crate::breaker::BreakerStore>(
    breaker: &B,
    policy: &crate::breaker::BreakerPolicy,
    state: &crate::breaker::BreakerState,
    now: std::time::SystemTime,
    probe_until: std::time::SystemTime,
    report: RedriveReport,
) -> Gate {
    if probe_answered_downstream(&report) {
        if let Err(error) = breaker.close().await {
            tracing::warn!(%error, "could not close the circuit breaker");
        }
        tracing::info!("circuit breaker closed: the redrive's probe succeeded");
        return Gate::Go(Some(report));
    }
    if probe_failed_downstream(&report) {
        let opens = state.opens + 1;
        let until = now + crate::breaker::open_period(policy, opens);
        if let Err(error) = breaker.open(until, opens, now).await {
            tracing::warn!(%error, "could not open the circuit breaker again");
        }
        tracing::warn!("the redrive's probe failed: the circuit breaker is open again");
        return Gate::Stop(report);
    }
    // Nothing told of the downstream (nothing eligible, an item skipped, a bad item's
    // failure): the probe goes back, so that the next caller probes at once instead of
    // every sandbox refusing its records until the lock lapses.
    if crate::mutants::is_on(crate::mutants::Mutant::RedriveProbeKept) {
        return Gate::Stop(report);
    }
    if let Err(error) = breaker.release_probe(probe_until).await {
        tracing::warn!(%error, "could not give back the circuit breaker's probe; it lapses by itself");
    }
    Gate::Stop(report)
}

/// Most items a probe run takes, one after the other, until one tells of the downstream.
pub const PROBE_ITEMS: usize = 5;

/// Returns the probe run: one item at a time, the next only while none has told of the downstream
/// (succeeded, or failed it), at most [`PROBE_ITEMS`]. An item that says nothing of the
/// downstream (its handler panicked, the item is bad) would otherwise be every probe's
/// item: the oldest eligible item is selected first, and the breaker would stay half-open
/// with every other item waiting (found by the simulation, seed 88386). The reports of
/// the items taken, in order.
async fn probe_items<P, S>(
    engine: &RedriveEngine<P, S>,
    request: &RedriveRequest,
    deadline: Option<tokio::time::Instant>,
    on_item: &(dyn Fn(&crate::redrive::ItemOutcome) + Send + Sync),
) -> Result<RedriveReport, RedriveError>
where
    P: Processor,
    S: crate::ports::RedrivePorts,
{
    let mut taken: Option<RedriveReport> = None;
    let mut token = None;
    for _ in 0..PROBE_ITEMS {
        let probe = RedriveRequest {
            max_items: Some(1),
            continuation_token: token.take(),
            ..request.clone()
        };
        let mut report = engine.run_until(&probe, deadline, on_item).await?;
        let told = probe_answered_downstream(&report) || probe_failed_downstream(&report);
        let next = report.continuation_token.clone();
        let nothing_taken = report.selected == 0;
        if let Some(earlier) = taken.take() {
            report.absorb(earlier);
        }
        taken = Some(report);
        if told
            || nothing_taken
            || crate::mutants::is_on(crate::mutants::Mutant::ProbeStuckOnOneItem)
        {
            break;
        }
        match next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    Ok(taken.unwrap_or_default())
}

/// Tells whether a probe run saw the downstream answer: an item resolved by processing it. One
/// resolved with nothing done (skipped by its handler, or its idempotency key completed
/// before: the downstream was never called) says nothing of the downstream.
fn probe_answered_downstream(report: &RedriveReport) -> bool {
    // Counted, not read from the item list: the list is a bounded sample, and a sweep's
    // errors may fill it before the probe's item.
    report.succeeded > report.resolved_with_nothing_done
        || (crate::mutants::is_on(crate::mutants::Mutant::ProbeClosedBySkippedItem)
            && report.succeeded > 0)
}

/// Tells whether a probe run saw the downstream fail: an item failed again with a transient
/// class, as the worker's breaker counts failures. A bad item taken as the probe (one of
/// the poison items the open breaker refused during the outage, now a 400) says nothing of
/// the downstream, and does not reopen the breaker for every worker.
fn probe_failed_downstream(report: &RedriveReport) -> bool {
    report.items.iter().any(|item| {
        item.outcome == crate::redrive::ItemOutcomeKind::FailedAgain
            && item
                .error_class
                .is_some_and(|class| crate::breaker::counts(&crate::ProcessError::new(class, "")))
    })
}

/// What the circuit breaker lets a redrive do.
enum Gate {
    /// Run (after the probe run, when this invocation was the probe).
    Go(Option<RedriveReport>),
    /// Answer with this report and run nothing more.
    Stop(RedriveReport),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{dead_record, MemoryStore, ScriptedProcessor};
    use crate::unreachable_store_tests::FlakyBreakerStore;
    use crate::ErrorClass;
    use crate::{redrive::ItemOutcome, redrive::ItemOutcomeKind};
    use std::time::Duration;

    #[tokio::test]
    async fn a_breaker_that_cannot_be_read_holds_the_run_back() {
        let store = MemoryStore::new();
        store.insert_dead_lettered(dead_record("a", ErrorClass::Throttled, 1));
        let engine = RedriveEngine::new(
            store,
            Some(ScriptedProcessor::new()),
            crate::redrive::RedriveSettings::default(),
        );
        let policy = crate::breaker::BreakerPolicy {
            threshold: 3,
            window: Duration::from_secs(60),
            open_for: Duration::from_secs(30),
            max_open: Duration::from_secs(600),
            probe_for: Duration::from_secs(60),
            refresh: Duration::ZERO,
        };
        let report = run_gated(
            &engine,
            Some((&FlakyBreakerStore::unreachable(), &policy)),
            &RedriveRequest::default(),
            None,
            &|_| {},
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            report.held_by_breaker.as_deref(),
            Some("breaker state unreadable")
        );
        assert_eq!(report.selected, 0, "{report:?}");
        assert_eq!(engine.processor.as_ref().map(|p| p.calls("a")), Some(0));
    }

    fn failed(class: ErrorClass) -> RedriveReport {
        RedriveReport {
            failed_again: 1,
            items: vec![ItemOutcome {
                item_id: "probe".to_string(),
                outcome: ItemOutcomeKind::FailedAgain,
                detail: None,
                error_class: Some(class),
            }],
            ..RedriveReport::default()
        }
    }

    #[test]
    fn only_a_transient_failure_of_the_probe_reopens_the_breaker() {
        for class in [
            ErrorClass::ServerError,
            ErrorClass::Throttled,
            ErrorClass::Timeout,
            ErrorClass::Connection,
        ] {
            assert!(probe_failed_downstream(&failed(class)), "{class:?}");
        }
        for class in [
            ErrorClass::Validation,
            ErrorClass::NotFound,
            ErrorClass::Permission,
            ErrorClass::Unknown,
        ] {
            assert!(!probe_failed_downstream(&failed(class)), "{class:?}");
        }
        assert!(!probe_failed_downstream(&RedriveReport::default()));
    }
}
