//! The `dlq` command line: commands, options, help and examples. The values an option
//! takes (`--status`, `--class`, `--format`, `--mode`) are the library's own enums, so
//! clap lists them in `--help` and refuses others as a usage error (exit 2).

use std::fmt;
use std::path::PathBuf;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use sqs_keeper_core::analysis::ExportFormat;
use sqs_keeper_core::dead_letter::ItemStatus;
use sqs_keeper_core::redrive::RedriveMode;
use sqs_keeper_core::ErrorClass;

/// Inspect and redrive dead-lettered SQS items (DynamoDB records, S3 payloads, the DLQ).
///
/// Configuration comes from the same variables as the functions: DLQ_TABLE, DLQ_QUEUE_URL,
/// DLQ_BUCKET (or the flags below), plus the standard AWS variables. For `redrive --mode
/// reprocess`, the WORKER_* variables of the worker configure the processor.
///
/// Runbook when the DLQ alarm fires: `dlq stats` → `dlq analyze` → `dlq inspect <id>` →
/// fix the cause → `dlq redrive --dry-run` → `dlq redrive`.
#[derive(Debug, Parser)]
#[command(
    name = "dlq",
    version,
    about,
    long_about,
    propagate_version = true,
    after_help = crate::EXIT_CODES
)]
pub struct Cli {
    /// Where the store is.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes, listed under their own heading in every `--help`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Endpoint for every AWS call (a local emulator, e.g. http://127.0.0.1:5000). Without
    /// it, the SDK's own variables apply: AWS_ENDPOINT_URL for every service and
    /// AWS_ENDPOINT_URL_DYNAMODB (or _SQS, _S3) for one.
    #[arg(long, global = true)]
    pub endpoint_url: Option<String>,
    /// AWS profile.
    #[arg(long, global = true, env = "AWS_PROFILE")]
    pub profile: Option<String>,
    /// AWS region.
    #[arg(long, global = true, env = "AWS_REGION")]
    pub region: Option<String>,
    /// DynamoDB table of dead-letter records.
    #[arg(long, global = true, env = "DLQ_TABLE")]
    pub table: Option<String>,
    /// URL of the DLQ.
    #[arg(long, global = true, env = "DLQ_QUEUE_URL")]
    pub queue_url: Option<String>,
    /// S3 bucket of large payloads.
    #[arg(long, global = true, env = "DLQ_BUCKET")]
    pub bucket: Option<String>,
}

/// What `--status` selects: one status, or every status (`any`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusChoice(pub Option<ItemStatus>);

impl fmt::Display for StatusChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.map_or("any", ItemStatus::as_str))
    }
}

/// `--status`: the statuses clap knows from [`ItemStatus`], plus `any`.
fn status_choice() -> impl TypedValueParser<Value = StatusChoice> {
    let statuses = ItemStatus::value_variants()
        .iter()
        .filter_map(ValueEnum::to_possible_value);
    let any = PossibleValue::new("any").help("Every status");
    PossibleValuesParser::new(statuses.chain([any]))
        .map(|name| StatusChoice(ItemStatus::parse(&name)))
}

/// Record selection shared by list, analyze and export.
#[derive(Debug, Clone, Args)]
pub struct FilterArgs {
    /// Records with this status.
    #[arg(long, default_value = "dead", value_parser = status_choice())]
    pub status: StatusChoice,
    /// Only this error signature.
    #[arg(long)]
    pub signature: Option<String>,
    /// Only this error class.
    #[arg(long, value_enum)]
    pub class: Option<ErrorClass>,
    /// Last attempt at or after: RFC 3339 time or a duration ago (24h, 7d).
    #[arg(long)]
    pub since: Option<String>,
    /// Last attempt at or before: RFC 3339 time or a duration ago.
    #[arg(long)]
    pub until: Option<String>,
    /// Only items that may be redriven without --force.
    #[arg(long)]
    pub eligible: bool,
    /// Only items of this message group: a FIFO group, or a fair queue's tenant (the
    /// MessageGroupId of a standard queue's message).
    #[arg(long)]
    pub group: Option<String>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List dead-lettered items, newest first.
    #[command(
        after_help = "Examples:\n  dlq list\n  dlq list --class timeout --since 24h --limit 20\n  dlq list --status any --json"
    )]
    List {
        /// Which records.
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one item: record, full failure history, payload location.
    #[command(
        after_help = "Examples:\n  dlq inspect order-1234\n  dlq inspect order-1234 --payload\n  dlq inspect order-1234 --payload --raw > payload.json"
    )]
    Inspect {
        /// The item id.
        item_id: String,
        /// Print the payload (fetched from S3 if offloaded, sha256 verified) instead.
        /// Control characters in it are shown as escapes (\x1b), so a payload cannot
        /// drive the terminal; see --raw.
        #[arg(long)]
        payload: bool,
        /// With --payload: write the payload's exact bytes, control characters included
        /// (for a file or a pipe, not a terminal).
        #[arg(long, requires = "payload")]
        raw: bool,
        /// The full record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Group failures by error signature; distribution by class; failures over time.
    #[command(after_help = "Examples:\n  dlq analyze\n  dlq analyze --since 7d --json")]
    Analyze {
        /// Which records.
        #[command(flatten)]
        filter: FilterArgs,
        /// Sample ids per group.
        #[arg(long, default_value_t = 3)]
        samples: usize,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Totals by status and class, eligible vs manual review, DLQ depth, oldest item.
    #[command(after_help = "Example:\n  dlq stats")]
    Stats {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write records to a file (json, jsonl or csv, from --format or the extension), or
    /// to stdout with `-`.
    #[command(
        after_help = "Examples:\n  dlq export dead.csv\n  dlq export all.jsonl --status any\n  dlq export - --format csv | head"
    )]
    Export {
        /// Output file; `-` writes the records to stdout (then --format is needed, and the
        /// summary goes to stderr).
        file: PathBuf,
        /// Format (default: from the extension: .json, .jsonl or .ndjson, .csv).
        #[arg(long, value_enum)]
        format: Option<ExportFormat>,
        /// Which records.
        #[command(flatten)]
        filter: FilterArgs,
        /// The summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Reprocess or requeue dead-lettered items.
    ///
    /// Only reprocess-eligible items without manual review are taken unless --force.
    /// Each item is leased first, so concurrent redrives never process it twice.
    #[command(
        after_help = "Examples:\n  dlq redrive --dry-run\n  dlq redrive --class throttled --since 24h\n  dlq redrive --item-id order-1 --item-id order-2 --mode requeue\n  dlq redrive --request request.json --via-function my-stack-redrive\n  dlq redrive --continue <token from the previous run>"
    )]
    Redrive(RedriveArgs),
    /// Delete records older than a duration, with their payloads and DLQ messages.
    #[command(
        after_help = "Examples:\n  dlq purge --older-than 30d\n  dlq purge --older-than 7d --status resolved --yes"
    )]
    Purge {
        /// Last attempt older than this (e.g. 30d, 12h, 1w, 1h 30m).
        #[arg(long)]
        older_than: String,
        /// Records with this status: dead, resolved or any (both). Items in flight
        /// (requeued, redriving) are never purged.
        #[arg(long, default_value = "any", value_parser = status_choice())]
        status: StatusChoice,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// What was removed, as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete every record, payload and DLQ message as they are now, but items in flight.
    #[command(after_help = "Example:\n  dlq clear --yes")]
    Clear {
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// What was removed, as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `dlq redrive` options.
#[derive(Debug, Clone, Args)]
pub struct RedriveArgs {
    /// A request file (JSON, as the redrive function takes); selection flags are then not allowed.
    #[arg(long, conflicts_with_all = ["item_id", "signature", "class", "group", "since", "until", "status"])]
    pub request: Option<PathBuf>,
    /// Exactly these items (repeatable).
    #[arg(long)]
    pub item_id: Vec<String>,
    /// Only this error signature.
    #[arg(long)]
    pub signature: Option<String>,
    /// Only items of this message group (a FIFO group, or a fair queue's tenant).
    #[arg(long)]
    pub group: Option<String>,
    /// Only this error class.
    #[arg(long, value_enum)]
    pub class: Option<ErrorClass>,
    /// Last attempt at or after (RFC 3339 or a duration ago).
    #[arg(long)]
    pub since: Option<String>,
    /// Last attempt at or before.
    #[arg(long)]
    pub until: Option<String>,
    /// Status to select (default dead; any selects dead too).
    #[arg(long, value_parser = status_choice())]
    pub status: Option<StatusChoice>,
    /// Include items that are not eligible or need manual review.
    #[arg(long)]
    pub force: bool,
    /// How items are put back (default reprocess).
    #[arg(long, value_enum)]
    pub mode: Option<RedriveMode>,
    /// Show what would happen; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation (a run that selects more than 100 items asks).
    #[arg(long)]
    pub yes: bool,
    /// Stop after this many items (prints a token to continue).
    #[arg(long)]
    pub max_items: Option<usize>,
    /// Items in flight at once (1-64, default 4).
    #[arg(long)]
    pub parallelism: Option<usize>,
    /// Items started per second at most.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop starting items after this long (e.g. 10m, 1h 30m; default 10m).
    #[arg(long)]
    pub time_budget: Option<String>,
    /// Continue a previous run with its token. The token carries that run's selection,
    /// mode, --force and --dry-run: give them again unchanged, or not at all (another
    /// selection is refused). Pacing options may change.
    #[arg(long = "continue")]
    pub continuation: Option<String>,
    /// Invoke this deployed redrive function instead of running here.
    #[arg(long)]
    pub via_function: Option<String>,
    /// Requeue target, overriding the queue each record names.
    #[arg(long, env = "SOURCE_QUEUE_URL")]
    pub source_queue_url: Option<String>,
    /// The report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("dlq").chain(args.iter().copied()))
    }

    fn filter(args: &[&str]) -> FilterArgs {
        match parse(args).unwrap().command {
            Command::List { filter, .. } => filter,
            other => panic!("{other:?}"),
        }
    }

    fn redrive(args: &[&str]) -> RedriveArgs {
        match parse(args).unwrap().command {
            Command::Redrive(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn values_are_the_stored_spellings() {
        assert_eq!(
            filter(&["list"]).status,
            StatusChoice(Some(ItemStatus::Dead))
        );
        assert_eq!(
            filter(&["list", "--status", "any"]).status,
            StatusChoice(None)
        );
        for status in ItemStatus::ALL {
            let f = filter(&["list", "--status", status.as_str()]);
            assert_eq!(f.status, StatusChoice(Some(status)));
        }
        for class in ErrorClass::ALL {
            let f = filter(&["list", "--class", class.as_str()]);
            assert_eq!(f.class, Some(class));
        }
        let r = redrive(&["redrive", "--mode", "requeue", "--status", "any"]);
        assert_eq!(r.mode, Some(RedriveMode::Requeue));
        assert_eq!(r.status, Some(StatusChoice(None)));
        assert_eq!(
            redrive(&["redrive", "--mode", "reprocess"]).mode,
            Some(RedriveMode::Reprocess)
        );
        for (name, format) in [
            ("json", ExportFormat::Json),
            ("jsonl", ExportFormat::JsonLines),
            ("csv", ExportFormat::Csv),
        ] {
            match parse(&["export", "x", "--format", name]).unwrap().command {
                Command::Export { format: f, .. } => assert_eq!(f, Some(format)),
                other => panic!("{other:?}"),
            }
        }
        match parse(&["purge", "--older-than", "30d"]).unwrap().command {
            Command::Purge { status, .. } => assert_eq!(status.to_string(), "any"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn other_values_are_usage_errors_naming_the_choices() {
        for args in [
            &["list", "--status", "zombie"][..],
            &["list", "--class", "bogus"],
            &["list", "--class", "server-error"],
            &["redrive", "--mode", "requeue-all"],
            &["export", "x", "--format", "ndjson"],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue, "{args:?}");
            assert_eq!(e.exit_code(), 2, "{args:?}");
            let text = e.to_string();
            assert!(text.contains(args[args.len() - 1]), "{text}");
            assert!(text.contains("possible values"), "{text}");
        }
        let e = parse(&["list", "--status", "zombie"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("dead") && e.contains("any"), "{e}");
    }
}
