//! `dlq stats`: totals by status and class, where every dead item stands (eligible, manual
//! review, needs a fix: the three add up to the dead records), the DLQ's depth and the age
//! of the oldest dead item.

use std::io::Write;

use chrono::Utc;

use sqs_keeper_core::selection::RecordFilter;

use super::render::{human_age, out, write_err};
use crate::args::GlobalArgs;
use crate::session::store;
use crate::{CliError, Completion};

/// Prints the totals over every record, as aligned `label: value` lines or JSON.
pub async fn stats(global: &GlobalArgs, json: bool) -> Result<Completion, CliError> {
    let store = store(global).await?;
    // A page at a time: memory holds one page and the totals, whatever the table's size.
    let mut counter = sqs_keeper_core::analysis::StatsCounter::default();
    store
        .for_each_page::<CliError>(&RecordFilter::default(), &mut Vec::new(), |page| {
            page.iter().for_each(|r| counter.add(r));
            Ok(())
        })
        .await?;
    let dlq = store.dlq_depth().await?;
    let s = counter.finish(dlq, Utc::now());
    let mut out = out();
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&s).unwrap_or_default()
        )
        .map_err(write_err)?;
        return Ok(Completion::Ok);
    }
    let mut text = format!("records:            {}\n", s.records);
    for (status, n) in &s.by_status {
        text.push_str(&format!("  {status:<18}{n}\n"));
    }
    text.push_str(&format!(
        "dead, eligible:      {} (a redrive run retries them)\ndead, manual review: {} (a human looks first)\ndead, needs a fix:   {} (fix the data or the handler, then redrive with --force)\ndead, payload in S3: {}\n",
        s.dead_eligible, s.dead_manual_review, s.dead_needs_fix, s.dead_payloads_in_s3
    ));
    text.push_str("dead by class:\n");
    for (class, n) in &s.dead_by_class {
        text.push_str(&format!("  {class:<18}{n}\n"));
    }
    text.push_str(&format!(
        "DLQ depth:          {} visible, {} in flight\n",
        s.dlq_visible, s.dlq_in_flight
    ));
    // Dead and redriving records each hold at least one DLQ message.
    let holding = s.by_status.get("dead").copied().unwrap_or(0)
        + s.by_status.get("redriving").copied().unwrap_or(0);
    let depth = usize::try_from(s.dlq_visible + s.dlq_in_flight).unwrap_or(usize::MAX);
    if depth > holding {
        text.push_str(&format!(
            "                    {} more DLQ message(s) than dead records: messages no record holds yet (moved by the queue's redrive policy) or a second message of an item; `dlq redrive` (or its schedule) records them\n",
            depth - holding
        ));
    }
    text.push_str(&format!(
        "oldest dead item:   {}\n",
        s.oldest_dead_age_secs
            .map(human_age)
            .unwrap_or_else(|| "none".into())
    ));
    write!(out, "{text}").map_err(write_err)?;
    Ok(Completion::Ok)
}
