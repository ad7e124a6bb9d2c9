//! # sqs-keeper-sim
//!
//! A deterministic simulation of the whole pipeline. One seed makes one world: SQS
//! queues (standard or FIFO, with visibility timeouts, receive counts, the redrive policy
//! and duplicate deliveries), Lambda's event source mapping (batches, deadlines, crashed
//! and doubled invocations), DynamoDB and S3 with throttling and unavailability, a
//! downstream with seeded latencies and every class of answer, and operators running
//! redrives (reprocess, requeue, the schedule) and purges at random moments, some dying
//! midway. The library's own code runs unchanged over it: the batch engine, retries,
//! classification, dead-letter recording, the DLQ sweep, the redrive engine and purging. Only the AWS calls are
//! simulated, by the library's own in-memory world (`sqs_keeper_core::testing`), which the
//! simulation watches and drives ([`world`], [`store`]).
//!
//! Time is tokio's paused clock, so a run of hours of pipeline time takes milliseconds,
//! and everything random is drawn from the seed, so a seed replays exactly. Invariants are
//! checked after every step ([`world::Checks::after_step`]) and at the end ([`check`]).
//!
//! The simulation must also find the defects of the core's `mutants` when they are
//! switched back on: `tests/mutants.rs` asserts it for each one. See `docs/SIMULATION.md`.
//!
//! Written by hand, not with a simulation framework: what is simulated here is AWS's
//! services, which no crate models, and tokio's paused clock already gives the
//! determinism of time that turmoil-style frameworks provide for networks.

pub mod breaker_store;
pub mod check;
pub mod downstream;
pub mod family;
pub mod idempotency_store;
pub mod logs;
pub mod polling;
pub mod run;
pub mod store;
pub mod trace;
pub mod world;

pub use family::Family;
pub use run::{run_seed, RunReport};

use sqs_keeper_core::mutants::Mutant;

/// The command that replays `seed` (with `mutants` switched on).
pub fn replay_command(seed: u64, mutants: &[Mutant]) -> String {
    let mut command = format!("make sim SEED={seed}");
    if !mutants.is_empty() {
        let names: Vec<&str> = mutants.iter().map(|m| m.name()).collect();
        command.push_str(&format!(" MUTANT={}", names.join(",")));
    }
    command
}

/// A failing run, for a person: the seed, what broke, the events that led there, and the
/// command that replays it.
pub fn describe_failure(report: &RunReport, mutants: &[Mutant]) -> String {
    let family = match Family::of(report.seed) {
        Family::Mixed => String::new(),
        focused => format!(
            " ({} world {})",
            focused.name(),
            report.seed & ((1 << 56) - 1)
        ),
    };
    let mut text = format!(
        "seed {}{family} broke {} invariant(s):\n",
        report.seed,
        report.violations.len()
    );
    for (item, what) in report.violations.iter().take(5) {
        text.push_str(&format!("  [{item}] {what}\n"));
    }
    if report.violations.len() > 5 {
        text.push_str(&format!("  ... and {} more\n", report.violations.len() - 5));
    }
    if let Some((item, _)) = report.violations.first() {
        text.push_str(&format!("events that concern {item}:\n{}", report.trace));
    }
    text.push_str(&format!(
        "replay: {}\n",
        replay_command(report.seed, mutants)
    ));
    text
}

/// What a range of seeds found.
#[derive(Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Events traced in all.
    pub events: u64,
    /// Steps (state changes) in all.
    pub steps: u64,
    /// Invariant checks made in all.
    pub checks: u64,
    /// Messages sent in all.
    pub messages: u64,
    /// Worker invocations in all.
    pub invocations: u64,
    /// Redrive runs in all.
    pub redrives: u64,
    /// Purges in all.
    pub purges: u64,
    /// Invocations cut right after a DLQ claim or send, in all.
    pub cuts_after_claim: u64,
    /// Pauses of polling the control recorded, in all.
    pub pauses: u64,
    /// The largest record any world wrote, in bytes.
    pub largest_record: usize,
    /// Failing runs, in seed order.
    pub failures: Vec<RunReport>,
}

/// Runs `seeds` on `threads` threads (each world stays on its thread), stopping early
/// after `stop_after` failures.
pub fn run_seeds(
    seeds: impl Iterator<Item = u64> + Send,
    mutants: &[Mutant],
    threads: usize,
    stop_after: usize,
) -> Summary {
    let seeds = std::sync::Mutex::new(seeds);
    let summary = std::sync::Mutex::new(Summary::default());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let next = seeds.lock().ok().and_then(|mut s| s.next());
                let Some(seed) = next else { break };
                let report = run_seed(seed, mutants);
                let Ok(mut summary) = summary.lock() else {
                    break;
                };
                summary.seeds += 1;
                summary.events += report.events as u64;
                summary.steps += report.stats.steps;
                summary.checks += report.stats.checks;
                summary.messages += report.sent as u64;
                summary.invocations += report.stats.invocations;
                summary.redrives += report.stats.redrives;
                summary.purges += report.stats.purges;
                summary.cuts_after_claim += report.stats.cuts_after_claim;
                summary.pauses += report.stats.pauses;
                summary.largest_record = summary.largest_record.max(report.stats.largest_record);
                if !report.violations.is_empty() {
                    summary.failures.push(report);
                }
                if summary.failures.len() >= stop_after {
                    break;
                }
            });
        }
    });
    let mut summary = summary.into_inner().unwrap_or_default();
    summary.failures.sort_by_key(|r| r.seed);
    summary
}
