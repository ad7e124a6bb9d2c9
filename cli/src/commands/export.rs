//! `dlq export`: records to a file (or stdout, `-`) as JSON, JSON lines or CSV (the
//! writers are the library's, [`sqs_keeper_core::analysis::export`]).

use std::io::Write;

use sqs_keeper_core::analysis::ExportFormat;

use super::render::{out, write_err};
use crate::args::{FilterArgs, GlobalArgs};
use crate::session::{progress, store};
use crate::{CliError, Completion};

/// Writes the selection to `file` (stdout for `-`), in `format` or the one its extension
/// names; the summary goes to stdout, or to stderr when the records do.
pub async fn export(
    global: &GlobalArgs,
    file: &std::path::Path,
    format: Option<ExportFormat>,
    args: &FilterArgs,
    json: bool,
) -> Result<Completion, CliError> {
    let to_stdout = file.as_os_str() == "-";
    let format = match format {
        Some(format) => format,
        None if to_stdout => {
            return Err(CliError::Usage(
                "exporting to stdout (-) needs --format (json, jsonl or csv)".into(),
            ))
        }
        None => ExportFormat::from_path(file).ok_or_else(|| {
            CliError::Usage(format!(
                "cannot tell the format of {}: use .json, .jsonl or .csv, or --format",
                file.display()
            ))
        })?,
    };
    let filter = super::filter_from(args)?;
    let store = store(global).await?;
    let bar = progress(None, "exporting");
    let destination: Box<dyn Write> = if to_stdout {
        Box::new(out())
    } else {
        Box::new(
            std::fs::File::create(file)
                .map_err(|e| CliError::Usage(format!("cannot create {}: {e}", file.display())))?,
        )
    };
    let mut writer = std::io::BufWriter::new(destination);
    // A page at a time: memory holds one page, whatever the table's size.
    let mut exporter =
        sqs_keeper_core::analysis::Exporter::start(format, &mut writer).map_err(write_err)?;
    store
        .for_each_page::<CliError>(&filter, &mut Vec::new(), |page| {
            exporter.write(&page).map_err(write_err)?;
            bar.inc(page.len() as u64);
            Ok(())
        })
        .await?;
    let exported = exporter.written();
    exporter.finish().map_err(write_err)?;
    bar.finish_and_clear();
    writer.flush().map_err(write_err)?;
    drop(writer);
    let summary = if json {
        serde_json::json!({"exported": exported, "file": file.display().to_string()}).to_string()
    } else {
        format!(
            "exported {} record(s) to {}",
            exported,
            if to_stdout {
                "stdout".to_string()
            } else {
                file.display().to_string()
            }
        )
    };
    if to_stdout {
        eprintln!("{summary}");
    } else {
        writeln!(out(), "{summary}").map_err(write_err)?;
    }
    Ok(Completion::Ok)
}
