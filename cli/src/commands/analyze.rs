//! `dlq analyze`: failures grouped by error signature, the distribution by class, and
//! failed attempts per hour.

use std::io::Write;

use super::render::{out, table, write_err};
use crate::args::{FilterArgs, GlobalArgs};
use crate::session::{progress, store};
use crate::{CliError, Completion};
use sqs_keeper_core::{analysis, time_format};

/// Analyses the selection, with `samples` item ids per group.
pub async fn analyze(
    global: &GlobalArgs,
    args: &FilterArgs,
    samples: usize,
    json: bool,
) -> Result<Completion, CliError> {
    let filter = super::filter_from(args)?;
    let store = store(global).await?;
    let bar = progress(None, "reading records");
    // A page at a time: memory holds one page and the groups, whatever the table's size.
    let mut analyzer = analysis::Analyzer::new(samples);
    store
        .for_each_page::<CliError>(&filter, &mut Vec::new(), |page| {
            page.iter().for_each(|r| analyzer.add(r));
            bar.inc(page.len() as u64);
            Ok(())
        })
        .await?;
    bar.finish_and_clear();
    let a = analyzer.finish();
    let mut out = out();
    if json {
        let text = serde_json::to_string_pretty(&a).unwrap_or_default();
        writeln!(out, "{text}").map_err(write_err)?;
        return Ok(Completion::Ok);
    }
    write_groups(&mut out, &a)?;
    write_by_class_and_group(&mut out, &a)?;
    write_per_hour(&mut out, &a)?;
    Ok(Completion::Ok)
}

/// Writes the pattern groups, as a table.
fn write_groups(out: &mut impl Write, a: &analysis::Analysis) -> Result<(), CliError> {
    writeln!(
        out,
        "{} record(s) in {} pattern group(s)\n",
        a.records,
        a.groups.len()
    )
    .map_err(write_err)?;
    let rows: Vec<Vec<String>> = a
        .groups
        .iter()
        .map(|g| {
            vec![
                g.count.to_string(),
                g.error_class.clone(),
                g.signature.clone(),
                time_format::format(&g.first_seen),
                time_format::format(&g.last_seen),
                g.eligible.to_string(),
                g.sample_ids.join(" "),
                sqs_keeper_core::analysis::ellipsize(&g.sample_error, 50),
            ]
        })
        .collect();
    let headers = [
        "COUNT",
        "CLASS",
        "SIGNATURE",
        "FIRST SEEN",
        "LAST SEEN",
        "ELIGIBLE",
        "SAMPLE IDS",
        "SAMPLE ERROR",
    ];
    let text = table(&headers, &["SAMPLE IDS", "SAMPLE ERROR"], rows);
    write!(out, "{text}").map_err(write_err)
}

/// Writes the records by class, and by message group (the ten with most records).
fn write_by_class_and_group(out: &mut impl Write, a: &analysis::Analysis) -> Result<(), CliError> {
    writeln!(out, "\nby class:").map_err(write_err)?;
    for (class, n) in &a.by_class {
        writeln!(out, "  {class:<14} {n}").map_err(write_err)?;
    }
    if a.by_group.is_empty() {
        return Ok(());
    }
    // A FIFO group or a fair queue's tenant: the most records first, the first ten.
    let mut groups: Vec<(&String, &usize)> = a.by_group.iter().collect();
    groups.sort_by(|x, y| y.1.cmp(x.1).then(x.0.cmp(y.0)));
    writeln!(
        out,
        "\nby message group ({} group(s); the ten with most records):",
        groups.len()
    )
    .map_err(write_err)?;
    for (group, n) in groups.into_iter().take(10) {
        writeln!(out, "  {:<30} {n}", super::render::safe(group)).map_err(write_err)?;
    }
    Ok(())
}

/// Failed attempts per hour, with a bar scaled to the busiest hour.
fn write_per_hour(out: &mut impl Write, a: &analysis::Analysis) -> Result<(), CliError> {
    writeln!(out, "\nfailed attempts per hour:").map_err(write_err)?;
    let peak = a
        .failures_per_hour
        .iter()
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(1)
        .max(1);
    for (hour, n) in &a.failures_per_hour {
        let bar = "#".repeat((n * 40).div_ceil(peak));
        writeln!(out, "  {}  {n:>6}  {bar}", hour.format("%Y-%m-%d %H:00")).map_err(write_err)?;
    }
    Ok(())
}
