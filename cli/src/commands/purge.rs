//! `dlq purge`: deletes records whose last attempt is older than a duration, with their
//! payloads and DLQ messages, after confirmation. Items in flight (`requeued`,
//! `redriving`) are never deleted: `--status any` selects every other status.

use std::io::Write;

use chrono::Utc;
use sqs_keeper_core::removal::RemovalReport;
use sqs_keeper_core::selection::RecordFilter;

use super::render::{out, write_err};
use crate::args::{GlobalArgs, StatusChoice};
use crate::session::{confirm, progress, store};
use crate::{CliError, Completion};

/// Purges the records of `status` older than `older_than` (a duration such as `30d`).
pub async fn purge(
    global: &GlobalArgs,
    older_than: &str,
    status: StatusChoice,
    yes: bool,
    json: bool,
) -> Result<Completion, CliError> {
    if let Some(status) = status.0.filter(|s| s.is_in_flight()) {
        return Err(CliError::Usage(format!(
            "--status {status}: a purge never deletes an item in flight (its message is live); wait until it is dead or resolved, or choose --status dead, resolved or any"
        )));
    }
    let filter = RecordFilter {
        status: status.0,
        until: Some(cutoff(older_than)?),
        ..RecordFilter::default()
    };
    let store = store(global).await?;
    // Every resource it changes exists, before anything changes.
    store.check_resources().await?;
    // What a removal needs of each, a page at a time: never the whole records.
    let records = store.removable(&filter).await?;
    if records.is_empty() {
        if json {
            print_json_report(&RemovalReport::default())?;
        } else {
            writeln!(
                out(),
                "nothing to purge: no {status} record older than {older_than}"
            )
            .map_err(write_err)?;
        }
        return Ok(Completion::Ok);
    }
    confirm(
        &format!("Delete {} {status} record(s) older than {older_than} with their payloads and DLQ messages?", records.len()),
        yes,
    )?;
    let bar = progress(Some(records.len() as u64), "purging");
    let report = store
        .remove_selected(
            &records,
            &sqs_keeper_core::item::ItemParser::default(),
            |n| bar.set_position(n as u64),
        )
        .await?;
    bar.finish_and_clear();
    if json {
        print_json_report(&report)?;
    } else {
        print_purge_report(&report)?;
    }
    Ok(Completion::Ok)
}

/// Reads `--older-than` (a duration such as `30d`) as the instant before which records go.
fn cutoff(older_than: &str) -> Result<chrono::DateTime<Utc>, CliError> {
    let age = sqs_keeper_core::duration::parse_duration(older_than)
        .map_err(|e| CliError::Usage(format!("--older-than: {e}")))?;
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| Utc::now().checked_sub_signed(age))
        .ok_or_else(|| CliError::Usage("--older-than is too long".into()))
}

/// Prints what a purge deleted and what it kept, with why.
fn print_purge_report(report: &RemovalReport) -> Result<(), CliError> {
    writeln!(
        out(),
        "purged {} record(s), {} payload(s), {} DLQ message(s)",
        report.records_deleted,
        report.payloads_deleted,
        report.dlq_messages_deleted
    )
    .map_err(write_err)?;
    print_kept_payloads(report)?;
    if report.records_in_flight > 0 {
        writeln!(
            out(),
            "kept {} record(s) in flight (requeued or redriving: a live message needs them)",
            report.records_in_flight
        )
        .map_err(write_err)?;
    }
    if report.records_changed > 0 {
        writeln!(
            out(),
            "kept {} record(s) that failed again after they were selected (run the purge again to select them as they are now)",
            report.records_changed
        )
        .map_err(write_err)?;
    }
    Ok(())
}

/// Prints the line saying how many payload objects a removal kept, when it kept any (`dlq purge`,
/// `dlq clear`).
pub fn print_kept_payloads(report: &RemovalReport) -> Result<(), CliError> {
    if report.payloads_kept == 0 {
        return Ok(());
    }
    writeln!(
        out(),
        "kept {} payload object(s) a live message may still point to (the record failed within SQS's 14-day retention, or its item was recorded again); the bucket's lifecycle expires them",
        report.payloads_kept
    )
    .map_err(write_err)
}

/// Prints what was removed, as one JSON object (`dlq purge --json`, `dlq clear --json`).
pub fn print_json_report(report: &RemovalReport) -> Result<(), CliError> {
    writeln!(
        out(),
        "{}",
        serde_json::to_string(report).unwrap_or_default()
    )
    .map_err(write_err)
}
