//! `dlq list`: dead-lettered items, newest first, as a table or JSON lines.

use std::io::Write;

use sqs_keeper_core::dead_letter::DeadLetteredItem;

use super::render::{out, safe, table, write_err};
use crate::args::{FilterArgs, GlobalArgs};
use crate::session::store;
use crate::{CliError, Completion};

/// Lists at most `limit` records of the selection.
pub async fn list(
    global: &GlobalArgs,
    args: &FilterArgs,
    limit: usize,
    json: bool,
) -> Result<Completion, CliError> {
    let filter = super::filter_from(args)?;
    let store = store(global).await?;
    let mut unreadable = Vec::new();
    let mut records = store
        .newest_noting(&filter, limit + 1, &mut unreadable)
        .await?;
    for bad in &unreadable {
        eprintln!(
            "warning: stored item {} is not a valid record, left out: {}",
            safe(&bad.item_id),
            safe(&bad.error)
        );
    }
    let more = records.len() > limit;
    records.truncate(limit);
    let mut out = out();
    if json {
        for r in &records {
            writeln!(out, "{}", serde_json::to_string(r).unwrap_or_default()).map_err(write_err)?;
        }
    } else {
        write!(out, "{}", list_table(&records, more)).map_err(write_err)?;
    }
    // Unreadable records were left out: say so in the exit code too.
    Ok(if unreadable.is_empty() {
        Completion::Ok
    } else {
        Completion::Partial
    })
}

/// Returns the records as a table, then their count and whether more match.
fn list_table(records: &[DeadLetteredItem], more: bool) -> String {
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.item_id.clone(),
                r.status.as_str().to_string(),
                r.error_class.as_str().to_string(),
                r.failure_count.to_string(),
                r.source.receive_count.to_string(),
                sqs_keeper_core::time_format::format(&r.last_attempt),
                r.error_signature.clone(),
                // One line, whole: the table cuts it to a terminal's width, never a pipe.
                sqs_keeper_core::analysis::ellipsize(&r.last_error, usize::MAX),
            ]
        })
        .collect();
    let headers = [
        "ITEM ID",
        "STATUS",
        "CLASS",
        "FAILURES",
        "RECEIVES",
        "LAST ATTEMPT",
        "SIGNATURE",
        "LAST ERROR",
    ];
    let more = if more {
        "; more match (raise --limit or filter)"
    } else {
        ""
    };
    format!(
        "{}{} record(s){more}\n",
        table(&headers, &["LAST ERROR"], rows),
        records.len()
    )
}
