//! The `dlq` commands, one module each, and the dispatch from the parsed command line.
//! Each command prints its result to stdout; progress and prompts go to stderr.
//!
//! | module | command |
//! | --- | --- |
//! | [`list`] | `dlq list` |
//! | [`inspect`] | `dlq inspect` |
//! | [`analyze`] | `dlq analyze` |
//! | [`stats`] | `dlq stats` |
//! | [`export`] | `dlq export` |
//! | [`redrive`] | `dlq redrive` |
//! | [`purge`] | `dlq purge` |
//! | [`clear`] | `dlq clear` |
//! | [`render`] | tables, ages and terminal-safe text they all print with |

pub mod analyze;
pub mod clear;
pub mod export;
pub mod inspect;
pub mod list;
pub mod purge;
pub mod redrive;
pub mod render;
pub mod stats;

use chrono::Utc;
use sqs_keeper_core::selection::RecordFilter;

use crate::args::{Cli, Command, FilterArgs};
use crate::{CliError, Completion};

/// Runs the command.
pub async fn dispatch(cli: Cli) -> Result<Completion, CliError> {
    let global = cli.global;
    match cli.command {
        Command::List {
            filter,
            limit,
            json,
        } => list::list(&global, &filter, limit, json).await,
        Command::Inspect {
            item_id,
            payload,
            raw,
            json,
        } => {
            let payload = match (payload, raw) {
                (false, _) => None,
                (true, false) => Some(inspect::PayloadOutput::Escaped),
                (true, true) => Some(inspect::PayloadOutput::Raw),
            };
            inspect::inspect(&global, &item_id, payload, json).await
        }
        Command::Analyze {
            filter,
            samples,
            json,
        } => analyze::analyze(&global, &filter, samples, json).await,
        Command::Stats { json } => stats::stats(&global, json).await,
        Command::Export {
            file,
            format,
            filter,
            json,
        } => export::export(&global, &file, format, &filter, json).await,
        Command::Redrive(args) => redrive::redrive(&global, args).await,
        Command::Purge {
            older_than,
            status,
            yes,
            json,
        } => purge::purge(&global, &older_than, status, yes, json).await,
        Command::Clear { yes, json } => clear::clear(&global, yes, json).await,
    }
}

/// Returns the store query for the selection options (`--since`/`--until` relative to now).
fn filter_from(args: &FilterArgs) -> Result<RecordFilter, CliError> {
    let now = Utc::now();
    let time = |t: &Option<String>, what: &str| {
        t.as_deref()
            .map(|t| sqs_keeper_core::duration::parse_time(t, now))
            .transpose()
            .map_err(|e| CliError::Usage(format!("--{what}: {e}")))
    };
    Ok(RecordFilter {
        status: args.status.0,
        signature: args.signature.clone(),
        class: args.class,
        since: time(&args.since, "since")?,
        until: time(&args.until, "until")?,
        eligible_only: args.eligible,
        message_group: args.group.clone(),
        lease_expired_before: None,
        oldest_first: false,
    })
}

/// Returns the key a record of `item_id` is stored under: the id as the worker keeps it
/// ([`sqs_keeper_core::item::bounded_item_id`]), so an operator can paste the id the producer
/// used or the digest `dlq list` shows (a kept id is kept as it is). An empty id is a
/// usage error: no record has one.
fn stored_item_id(item_id: &str) -> Result<String, CliError> {
    if item_id.is_empty() {
        return Err(CliError::Usage(
            "the item id is empty; give the id `dlq list` shows".into(),
        ));
    }
    Ok(sqs_keeper_core::item::bounded_item_id(item_id.to_string()))
}
