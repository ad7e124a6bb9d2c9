//! `sim`: runs the deterministic simulation over a range of seeds, or replays one.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use sqs_keeper_core::mutants::Mutant;
use sqs_keeper_sim::{describe_failure, run_seeds, Family};

/// Runs the whole pipeline in a simulated world, once per seed, and checks its guarantees.
///
/// Examples:
///   sim --seeds 10000            ten thousand worlds, seeds 0..9999
///   sim --seed 4711              replay one seed (prints its failure, if any)
///   sim --seeds 2000 --mutant sweep-deletes-by-item-id
///                                must fail: the fixed defect switched back on
///   sim --family twins --seeds 1000
///                                a thousand worlds of overlapping deliveries
#[derive(Debug, Parser)]
#[command(name = "sim", verbatim_doc_comment)]
struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run exactly this seed (replay): a whole seed as a failure prints it, or, with
    /// `--family`, that family's world of this number.
    #[arg(long, conflicts_with_all = ["seeds", "from"])]
    seed: Option<u64>,
    /// The family of worlds: mixed (every part at its usual rate), or one focused on a
    /// kind of defect: twins (overlapping deliveries and compaction), operators (purges
    /// and clears racing the schedule), breaker (outages, the breaker and the polling
    /// control's pauses), retention (spaced messages near the end of their retention),
    /// compaction (the twins' worlds with records of two failures).
    #[arg(long, default_value = "mixed", value_parser = parse_family)]
    family: Family,
    /// Switch a fixed defect back on, by name (repeatable, or comma-separated), for
    /// example sweep-deletes-by-item-id. An unknown name is refused with the list of all
    /// fifty; docs/SIMULATION.md says what each one breaks.
    #[arg(long, value_delimiter = ',')]
    mutant: Vec<String>,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Stop after this many failing seeds.
    #[arg(long, default_value_t = 3)]
    stop_after: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut mutants = Vec::new();
    for name in args.mutant.iter().filter(|n| !n.is_empty()) {
        match Mutant::parse(name) {
            Some(m) => mutants.push(m),
            None => {
                let known: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
                eprintln!("sim: no mutant {name:?}; known: {}", known.join(", "));
                return ExitCode::from(2);
            }
        }
    }
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let started = Instant::now();
    if args.seed.is_none() && args.from.saturating_add(args.seeds) > WORLDS_PER_FAMILY {
        eprintln!("sim: --from plus --seeds must stay within a family's 2^56 worlds");
        return ExitCode::from(2);
    }
    let summary = match args.seed {
        Some(seed) => {
            let seed = match args.family {
                Family::Mixed => seed,
                focused => focused.seed(seed),
            };
            run_seeds(std::iter::once(seed), &mutants, 1, 1)
        }
        None => run_seeds(
            (args.from..args.from.saturating_add(args.seeds)).map(|n| args.family.seed(n)),
            &mutants,
            threads,
            args.stop_after.max(1),
        ),
    };
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    for failure in &summary.failures {
        eprintln!("{}", describe_failure(failure, &mutants));
    }
    println!(
        "{} seeds in {:.1} s ({:.0} seeds/s): {} messages, {} invocations, {} redrive runs, {} purges, {} cuts after a DLQ claim or send, {} polling pauses, {} events, {} steps, {} invariant checks, largest record {} bytes; {} failing",
        summary.seeds,
        secs,
        summary.seeds as f64 / secs,
        summary.messages,
        summary.invocations,
        summary.redrives,
        summary.purges,
        summary.cuts_after_claim,
        summary.pauses,
        summary.events,
        summary.steps,
        summary.checks,
        summary.largest_record,
        summary.failures.len()
    );
    if summary.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How many worlds a family has: a seed's low 56 bits number them.
const WORLDS_PER_FAMILY: u64 = 1 << 56;

/// Reads a family's name, listing the names when it is none of them.
fn parse_family(name: &str) -> Result<Family, String> {
    Family::parse(name).ok_or_else(|| {
        let known: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
        format!("no family {name:?}; known: {}", known.join(", "))
    })
}
