//! `dlq clear`: deletes every record (but items in flight), payload and DLQ message as
//! they are when it starts, after confirmation. A failure that arrives meanwhile is kept.

use std::io::Write;

use sqs_keeper_core::selection::RecordFilter;

use super::render::{out, write_err};
use crate::args::GlobalArgs;
use crate::session::{confirm, progress, store};
use crate::{CliError, Completion};

/// Empties the store.
pub async fn clear(global: &GlobalArgs, yes: bool, json: bool) -> Result<Completion, CliError> {
    let store = store(global).await?;
    // Every resource it changes exists, before anything changes.
    store.check_resources().await?;
    let (depth, in_flight) = store.dlq_depth().await?;
    // Counted a page at a time: never the whole records.
    let count = store
        .for_each_page::<CliError>(&RecordFilter::default(), &mut Vec::new(), |_| Ok(()))
        .await?;
    confirm(
        &format!(
            "Delete ALL {count} record(s) (but items in flight), their payloads, and the DLQ's {} message(s) as they are now?",
            depth + in_flight
        ),
        yes,
    )?;
    let bar = progress(Some(count as u64), "clearing");
    let report = store.clear(|n| bar.set_position(n as u64)).await?;
    bar.finish_and_clear();
    if json {
        super::purge::print_json_report(&report)?;
    } else {
        writeln!(
            out(),
            "cleared {} record(s), {} payload(s), {} DLQ message(s)",
            report.records_deleted,
            report.payloads_deleted,
            report.dlq_messages_deleted
        )
        .map_err(write_err)?;
        super::purge::print_kept_payloads(&report)?;
    }
    Ok(Completion::Ok)
}
