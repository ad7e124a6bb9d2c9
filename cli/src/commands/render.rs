//! What the commands share to print: tables that fit the terminal, ages, and text from
//! the data made safe to print.
//!
//! Tables use `comfy-table` without borders and with two spaces between columns. On a
//! terminal they fit its width (the long columns are cut short, one line per row); piped,
//! they have no width limit and no colour, so `grep`, `cut` and `awk` see whole rows.

use std::io::IsTerminal;
use std::time::Duration;

use comfy_table::{ColumnConstraint, ContentArrangement, Row, Table};

use crate::CliError;

/// Standard output, locked for one command's output.
pub fn out() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

/// Returns a failed write to standard output (a closed pipe, a full disk).
pub fn write_err(e: std::io::Error) -> CliError {
    CliError::Failed(format!("cannot write output: {e}"))
}

/// Returns a field that comes from the data, for one line of text output.
pub fn safe(text: &str) -> String {
    sqs_keeper_core::analysis::terminal_safe(text, false)
}

/// Returns a field that comes from the data and may span lines (error messages).
pub fn safe_lines(text: &str) -> String {
    sqs_keeper_core::analysis::terminal_safe(text, true)
}

/// Returns how long ago, for a person: whole seconds under an hour (`59m 12s`), whole minutes
/// under a day (`5h 3m`), whole hours after (`3days 4h`).
pub fn human_age(secs: i64) -> String {
    let secs = u64::try_from(secs).unwrap_or(0);
    let unit = match secs {
        s if s < 3_600 => 1,
        s if s < 86_400 => 60,
        _ => 3_600,
    };
    format!(
        "{} ago",
        humantime::format_duration(Duration::from_secs(secs - secs % unit))
    )
}

/// Returns the terminal's width when standard output is one.
fn terminal_width() -> Option<u16> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    console::Term::stdout()
        .size_checked()
        .map(|(_rows, columns)| columns)
}

/// Renders `rows` under `headers` as a text table (cells made [`safe`]). On a terminal it
/// never runs wider than the terminal: the columns named in `flexible` (long free text) are
/// cut short to one line while the others (ids, names, times) fit whole; on a terminal too
/// narrow even for those, every column shares the width and long cells wrap onto more
/// lines, so an id is never cut.
pub fn table(headers: &[&str], flexible: &[&str], rows: Vec<Vec<String>>) -> String {
    table_for_width(headers, flexible, rows, terminal_width())
}

/// The narrowest a flexible column is cut to before the table wraps instead.
const FLEXIBLE_MIN: usize = 12;
/// Spaces between two columns.
const GAP: usize = 2;

/// [`table`] for a given width (`None`: no limit).
fn table_for_width(
    headers: &[&str],
    flexible: &[&str],
    rows: Vec<Vec<String>>,
    width: Option<u16>,
) -> String {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|cells| cells.iter().map(|cell| safe(cell)).collect())
        .collect();
    let is_flexible = |i: usize| headers.get(i).is_some_and(|h| flexible.contains(h));
    // Whether the fixed columns fit whole beside the flexible ones at their narrowest.
    let fixed_fit = width.is_none_or(|width| {
        let widest = |i: usize| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .chain(headers.get(i).map(|h| h.to_string()).as_ref())
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        };
        let needed: usize = (0..headers.len())
            .map(|i| {
                if is_flexible(i) {
                    widest(i).min(FLEXIBLE_MIN)
                } else {
                    widest(i)
                }
            })
            .sum::<usize>()
            + GAP * headers.len().saturating_sub(1);
        needed <= usize::from(width)
    });
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_header(headers.to_vec());
    for cells in rows {
        let mut row = Row::from(cells);
        if width.is_some() && fixed_fit {
            row.max_height(1);
        }
        t.add_row(row);
    }
    if let Some(width) = width {
        t.set_width(width)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_truncation_indicator("…");
    }
    let last = headers.len().saturating_sub(1);
    for (i, column) in t.column_iter_mut().enumerate() {
        // Two spaces between columns, none before the first or after the last.
        column.set_padding((0, if i == last { 0 } else { GAP as u16 }));
        if fixed_fit && !is_flexible(i) {
            column.set_constraint(ColumnConstraint::ContentWidth);
        }
    }
    let mut text = t.trim_fmt();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(rows: &[&[&str]]) -> Vec<Vec<String>> {
        rows.iter()
            .map(|r| r.iter().map(|c| c.to_string()).collect())
            .collect()
    }

    #[test]
    fn piped_tables_align_without_a_width_limit() {
        let long = "x".repeat(300);
        let t = table_for_width(
            &["ITEM ID", "CLASS", "LAST ERROR"],
            &["LAST ERROR"],
            rows(&[&["a", "timeout", &long], &["long-id", "x", "short"]]),
            None,
        );
        assert_eq!(
            t,
            format!(
                "ITEM ID  CLASS    LAST ERROR\na        timeout  {long}\nlong-id  x        short\n"
            )
        );
    }

    #[test]
    fn terminal_tables_fit_by_cutting_the_flexible_columns() {
        let long = "word ".repeat(40);
        let t = table_for_width(
            &["ITEM ID", "CLASS", "LAST ERROR"],
            &["LAST ERROR"],
            rows(&[&["order-123456", "server_error", &long]]),
            Some(50),
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "one line per row:\n{t}");
        for line in &lines {
            assert!(line.chars().count() <= 50, "{line:?}");
        }
        assert!(
            lines[1].starts_with("order-123456  server_error  word"),
            "{t}"
        );
        assert!(lines[1].ends_with('…'), "{t}");
    }

    #[test]
    fn terminal_tables_too_narrow_for_the_fixed_columns_wrap_instead_of_overflowing() {
        // `dlq analyze`'s columns: the fixed ones alone are wider than 80 columns.
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
        let row: [&str; 8] = [
            "15",
            "validation",
            "354017fdcc14a2d9",
            "2026-11-23T23:13:46.443Z",
            "2026-11-23T23:14:01.127Z",
            "0",
            "163184c3-d642-4d3c-bf99-7409dac9e158",
            "body is not valid JSON: EOF while parsing a value at line 1 column 0",
        ];
        for width in [80u16, 60, 40] {
            let t = table_for_width(
                &headers,
                &["SAMPLE IDS", "SAMPLE ERROR"],
                rows(&[&row]),
                Some(width),
            );
            for line in t.lines() {
                assert!(
                    line.chars().count() <= usize::from(width),
                    "{width}: {line:?}\n{t}"
                );
            }
            // Nothing is cut: long cells wrap onto more lines instead.
            assert!(!t.contains('…'), "{width}:\n{t}");
            assert!(t.lines().count() > 2, "{width}:\n{t}");
        }
        // Wide enough: one line per row, as before.
        let t = table_for_width(
            &headers,
            &["SAMPLE IDS", "SAMPLE ERROR"],
            rows(&[&row]),
            Some(200),
        );
        assert_eq!(t.lines().count(), 2, "{t}");
    }

    #[test]
    fn cells_cannot_drive_the_terminal() {
        let t = table_for_width(&["id"], &[], rows(&[&["\x1b[31mred\nnext"]]), None);
        assert_eq!(t, "id\n\\x1b[31mred\\x0anext\n");
    }

    #[test]
    fn ages() {
        assert_eq!(human_age(0), "0s ago");
        assert_eq!(human_age(90), "1m 30s ago");
        assert_eq!(human_age(3_599), "59m 59s ago");
        assert_eq!(human_age(7_299), "2h 1m ago");
        assert_eq!(human_age(3 * 86_400 + 4 * 3_600 + 59), "3days 4h ago");
        assert_eq!(human_age(-5), "0s ago", "a clock ahead of the record");
    }
}
