//! `dlq export`: records to a file as JSON, JSON lines or CSV (the writers are the
//! library's, [`sqs_worker::analysis::export`]).

use std::io::Write;

use sqs_worker::analysis::{self, ExportFormat};

use super::render::{out, write_err};
use crate::args::{FilterArgs, GlobalArgs};
use crate::context::{progress, store};
use crate::{CliError, Completion};

/// Writes the selection to `file`, in `format` or the one its extension names.
pub async fn export(
    global: &GlobalArgs,
    file: &std::path::Path,
    format: Option<ExportFormat>,
    args: &FilterArgs,
) -> Result<Completion, CliError> {
    let format = match format {
        Some(format) => format,
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
    let records = store
        .query_all(&filter, None, |n| bar.set_position(n as u64))
        .await?;
    bar.finish_and_clear();
    let mut writer = std::io::BufWriter::new(
        std::fs::File::create(file)
            .map_err(|e| CliError::Usage(format!("cannot create {}: {e}", file.display())))?,
    );
    analysis::export(&records, format, &mut writer).map_err(write_err)?;
    writer.flush().map_err(write_err)?;
    writeln!(
        out(),
        "exported {} record(s) to {}",
        records.len(),
        file.display()
    )
    .map_err(write_err)?;
    Ok(Completion::Ok)
}
