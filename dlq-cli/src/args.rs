//! The `dlq` command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Inspect and redrive dead-lettered SQS items (DynamoDB records, S3 payloads, the DLQ).
///
/// Configuration comes from the same variables as the functions: DLQ_TABLE, DLQ_QUEUE_URL,
/// DLQ_BUCKET (or the flags below), plus the standard AWS variables. For `redrive --mode
/// reprocess`, the WORKER_* variables of the worker configure the processor.
///
/// Runbook when the DLQ alarm fires: `dlq stats` → `dlq analyze` → `dlq inspect <id>` →
/// fix the cause → `dlq redrive --dry-run` → `dlq redrive`.
///
/// Exit codes: 0 ok, 1 partial failure, 2 usage or configuration error.
#[derive(Debug, Parser)]
#[command(name = "dlq", version, about, long_about, propagate_version = true)]
pub struct Cli {
    /// Where the store is.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Endpoint for every AWS call (a local emulator, e.g. http://127.0.0.1:5000).
    #[arg(long, global = true, env = "AWS_ENDPOINT_URL")]
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

/// Record selection shared by list, analyze, export and purge.
#[derive(Debug, Clone, Default, Args)]
pub struct FilterArgs {
    /// Status: dead, redriving, requeued, resolved, or any.
    #[arg(long, default_value = "dead")]
    pub status: String,
    /// Only this error signature.
    #[arg(long)]
    pub signature: Option<String>,
    /// Only this error class (throttled, server_error, timeout, connection, validation,
    /// permission, not_found, unknown).
    #[arg(long)]
    pub class: Option<String>,
    /// Last attempt at or after: RFC 3339 time or a duration ago (24h, 7d).
    #[arg(long)]
    pub since: Option<String>,
    /// Last attempt at or before: RFC 3339 time or a duration ago.
    #[arg(long)]
    pub until: Option<String>,
    /// Only items that may be redriven without --force.
    #[arg(long)]
    pub eligible: bool,
}

/// Export formats.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    /// One JSON array.
    Json,
    /// One record per line.
    Jsonl,
    /// One summary row per record.
    Csv,
}

/// Redrive modes.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Run each item through the processor here.
    Reprocess,
    /// Send each item back to its source queue.
    Requeue,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List dead-lettered items, newest first.
    ///
    /// Examples:
    ///   dlq list
    ///   dlq list --class timeout --since 24h --limit 20
    ///   dlq list --status any --json
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
    ///
    /// Examples:
    ///   dlq inspect order-1234
    ///   dlq inspect order-1234 --payload
    ///   dlq inspect order-1234 --payload --raw > payload.json
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
    ///
    /// Examples:
    ///   dlq analyze
    ///   dlq analyze --since 7d --json
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
    ///
    /// Example:
    ///   dlq stats
    Stats {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write records to a file (json, jsonl or csv, from --format or the extension).
    ///
    /// Examples:
    ///   dlq export dead.csv
    ///   dlq export all.jsonl --status any
    Export {
        /// Output file.
        file: PathBuf,
        /// Format (default: from the extension).
        #[arg(long, value_enum)]
        format: Option<FormatArg>,
        /// Which records.
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Reprocess or requeue dead-lettered items.
    ///
    /// Only reprocess-eligible items without manual review are taken unless --force.
    /// Each item is leased first, so concurrent redrives never process it twice.
    ///
    /// Examples:
    ///   dlq redrive --dry-run
    ///   dlq redrive --class throttled --since 24h
    ///   dlq redrive --item-id order-1 --item-id order-2 --mode requeue
    ///   dlq redrive --request request.json --via-function my-stack-redrive
    ///   dlq redrive --continue <token from the previous run>
    Redrive(RedriveArgs),
    /// Delete records older than a duration, with their payloads and DLQ messages.
    ///
    /// Examples:
    ///   dlq purge --older-than 30d
    ///   dlq purge --older-than 7d --status resolved --yes
    Purge {
        /// Last attempt older than this (e.g. 30d, 12h).
        #[arg(long)]
        older_than: String,
        /// Status: dead, redriving, requeued, resolved, or any.
        #[arg(long, default_value = "any")]
        status: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Delete every record, payload and DLQ message.
    ///
    /// Example:
    ///   dlq clear --yes
    Clear {
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// `dlq redrive` options.
#[derive(Debug, Clone, Args)]
pub struct RedriveArgs {
    /// A request file (JSON, as the redrive function takes); selection flags are then not allowed.
    #[arg(long, conflicts_with_all = ["item_id", "signature", "class", "since", "until", "status"])]
    pub request: Option<PathBuf>,
    /// Exactly these items (repeatable).
    #[arg(long)]
    pub item_id: Vec<String>,
    /// Only this error signature.
    #[arg(long)]
    pub signature: Option<String>,
    /// Only this error class.
    #[arg(long)]
    pub class: Option<String>,
    /// Last attempt at or after (RFC 3339 or a duration ago).
    #[arg(long)]
    pub since: Option<String>,
    /// Last attempt at or before.
    #[arg(long)]
    pub until: Option<String>,
    /// Status to select (default dead).
    #[arg(long)]
    pub status: Option<String>,
    /// Include items that are not eligible or need manual review.
    #[arg(long)]
    pub force: bool,
    /// reprocess (default) or requeue.
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// Show what would happen; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Stop after this many items (prints a token to continue).
    #[arg(long)]
    pub max_items: Option<usize>,
    /// Items in flight at once (1-64, default 4).
    #[arg(long)]
    pub parallelism: Option<usize>,
    /// Items started per second at most.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop starting items after this long (e.g. 10m; default 10m).
    #[arg(long)]
    pub time_budget: Option<String>,
    /// Continue a previous run with its token.
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
