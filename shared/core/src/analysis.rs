//! Pure views over dead-letter records for operators: pattern groups by error signature,
//! distributions, failures over time, totals, and export formats (JSON, JSON lines, CSV).

use std::collections::BTreeMap;

use chrono::{DateTime, DurationRound, Utc};
use serde::Serialize;

use crate::dead_letter::{DeadLetteredItem, PayloadLocation, Triage};

/// Records sharing one error signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SignatureGroup {
    /// The signature.
    pub signature: String,
    /// Its error class.
    pub error_class: String,
    /// Records in the group.
    pub count: usize,
    /// Earliest first attempt.
    pub first_seen: DateTime<Utc>,
    /// Latest last attempt.
    pub last_seen: DateTime<Utc>,
    /// A few item ids.
    pub sample_ids: Vec<String>,
    /// The error message of one member.
    pub sample_error: String,
    /// Members that may be redriven without `force`.
    pub eligible: usize,
}

/// The `dlq analyze` view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Analysis {
    /// Records analysed.
    pub records: usize,
    /// Groups, largest first.
    pub groups: Vec<SignatureGroup>,
    /// Records by error class.
    pub by_class: BTreeMap<String, usize>,
    /// Records by message group (a FIFO group, or a fair queue's tenant), for records that
    /// name one: a tenant whose own downstream fails stands out here.
    pub by_group: BTreeMap<String, usize>,
    /// Failed attempts per hour (from every record's history), oldest first.
    pub failures_per_hour: Vec<(DateTime<Utc>, usize)>,
}

/// Groups records by signature.
pub fn analyze(records: &[DeadLetteredItem], samples: usize) -> Analysis {
    let mut analyzer = Analyzer::new(samples);
    records.iter().for_each(|r| analyzer.add(r));
    analyzer.finish()
}

/// Builds an [`Analysis`] one record at a time, so that a caller reading pages keeps one
/// page in memory, never the table: what it holds grows with the signatures, classes,
/// groups and hours seen.
///
/// ```
/// use sqs_keeper_core::{analysis::Analyzer, testing::dead_record, ErrorClass};
///
/// let mut analyzer = Analyzer::new(3);
/// for page in [vec![dead_record("a", ErrorClass::Timeout, 1)], vec![dead_record("b", ErrorClass::Timeout, 2)]] {
///     page.iter().for_each(|record| analyzer.add(record));
/// }
/// let analysis = analyzer.finish();
/// assert_eq!(analysis.records, 2);
/// assert_eq!(analysis.groups[0].count, 2);
/// ```
#[derive(Debug, Default)]
pub struct Analyzer {
    samples: usize,
    records: usize,
    groups: BTreeMap<String, SignatureGroup>,
    by_class: BTreeMap<String, usize>,
    by_group: BTreeMap<String, usize>,
    per_hour: BTreeMap<DateTime<Utc>, usize>,
}

impl Analyzer {
    /// Creates an empty analysis keeping `samples` item ids per group.
    pub fn new(samples: usize) -> Analyzer {
        Analyzer {
            samples,
            ..Analyzer::default()
        }
    }

    /// Counts one record.
    pub fn add(&mut self, r: &DeadLetteredItem) {
        self.records += 1;
        *self
            .by_class
            .entry(r.error_class.as_str().to_string())
            .or_default() += 1;
        if let Some(group) = &r.source.message_group_id {
            *self.by_group.entry(group.clone()).or_default() += 1;
        }
        let g = self
            .groups
            .entry(r.error_signature.clone())
            .or_insert_with(|| SignatureGroup {
                signature: r.error_signature.clone(),
                error_class: r.error_class.as_str().to_string(),
                count: 0,
                first_seen: r.first_attempt,
                last_seen: r.last_attempt,
                sample_ids: Vec::new(),
                sample_error: r.last_error.clone(),
                eligible: 0,
            });
        g.count += 1;
        g.first_seen = g.first_seen.min(r.first_attempt);
        g.last_seen = g.last_seen.max(r.last_attempt);
        if g.sample_ids.len() < self.samples {
            g.sample_ids.push(r.item_id.clone());
        }
        if r.triage() == Triage::Eligible {
            g.eligible += 1;
        }
        for f in &r.failure_history {
            if let Ok(hour) = f.timestamp.duration_trunc(chrono::Duration::hours(1)) {
                *self.per_hour.entry(hour).or_default() += 1;
            }
        }
    }

    /// Returns the analysis of every record added: groups largest first.
    pub fn finish(self) -> Analysis {
        let mut groups: Vec<SignatureGroup> = self.groups.into_values().collect();
        groups.sort_by(|a, b| b.count.cmp(&a.count).then(b.last_seen.cmp(&a.last_seen)));
        Analysis {
            records: self.records,
            groups,
            by_class: self.by_class,
            by_group: self.by_group,
            failures_per_hour: self.per_hour.into_iter().collect(),
        }
    }
}

/// The `dlq stats` view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Records in the table.
    pub records: usize,
    /// By status.
    pub by_status: BTreeMap<String, usize>,
    /// Dead records by class.
    pub dead_by_class: BTreeMap<String, usize>,
    /// Dead records a redrive run retries ([`Triage::Eligible`]).
    pub dead_eligible: usize,
    /// Dead records that need a human first ([`Triage::ManualReview`]).
    pub dead_manual_review: usize,
    /// Dead records a run does not retry until the data or the handler is fixed
    /// ([`Triage::NeedsFix`]: validation or not-found failures seen once).
    /// The three counts add up to the dead records.
    pub dead_needs_fix: usize,
    /// Dead records with their payload in S3.
    pub dead_payloads_in_s3: usize,
    /// DLQ messages visible.
    pub dlq_visible: u64,
    /// DLQ messages in flight.
    pub dlq_in_flight: u64,
    /// Age in seconds of the oldest dead item (from its first attempt).
    pub oldest_dead_age_secs: Option<i64>,
}

/// Totals over records plus the DLQ's depth.
pub fn stats(records: &[DeadLetteredItem], dlq: (u64, u64), now: DateTime<Utc>) -> Stats {
    let mut counter = StatsCounter::default();
    records.iter().for_each(|r| counter.add(r));
    counter.finish(dlq, now)
}

/// Builds [`Stats`] one record at a time: a caller reading pages keeps one page in memory,
/// never the table.
#[derive(Debug, Default)]
pub struct StatsCounter {
    stats: Stats,
    oldest: Option<DateTime<Utc>>,
}

impl StatsCounter {
    /// Counts one record.
    pub fn add(&mut self, r: &DeadLetteredItem) {
        let s = &mut self.stats;
        s.records += 1;
        *s.by_status
            .entry(r.status.as_str().to_string())
            .or_default() += 1;
        if r.status != crate::dead_letter::ItemStatus::Dead {
            return;
        }
        *s.dead_by_class
            .entry(r.error_class.as_str().to_string())
            .or_default() += 1;
        *match r.triage() {
            Triage::Eligible => &mut s.dead_eligible,
            Triage::ManualReview => &mut s.dead_manual_review,
            Triage::NeedsFix => &mut s.dead_needs_fix,
        } += 1;
        if matches!(r.payload.location, PayloadLocation::S3 { .. }) {
            s.dead_payloads_in_s3 += 1;
        }
        self.oldest = Some(
            self.oldest
                .map_or(r.first_attempt, |o| o.min(r.first_attempt)),
        );
    }

    /// Returns the totals of every record added, with the DLQ's depth (visible, in flight).
    pub fn finish(self, dlq: (u64, u64), now: DateTime<Utc>) -> Stats {
        Stats {
            dlq_visible: dlq.0,
            dlq_in_flight: dlq.1,
            oldest_dead_age_secs: self.oldest.map(|o| (now - o).num_seconds()),
            ..self.stats
        }
    }
}

/// Export formats. With the `clap` feature, `--format` takes `json`, `jsonl` or `csv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum ExportFormat {
    /// One JSON array of full records.
    Json,
    /// One full record per line.
    #[cfg_attr(feature = "clap", value(name = "jsonl"))]
    JsonLines,
    /// One summary row per record.
    Csv,
}

impl ExportFormat {
    /// Creates the format for a file name's extension.
    pub fn from_path(path: &std::path::Path) -> Option<ExportFormat> {
        match path.extension()?.to_str()? {
            "json" => Some(ExportFormat::Json),
            "jsonl" | "ndjson" => Some(ExportFormat::JsonLines),
            "csv" => Some(ExportFormat::Csv),
            _ => None,
        }
    }
}

/// CSV columns.
pub const CSV_COLUMNS: &[&str] = &[
    "item_id",
    "status",
    "error_class",
    "error_signature",
    "failure_count",
    "first_attempt",
    "last_attempt",
    "reprocess_eligible",
    "manual_review_required",
    "reason",
    "payload_storage",
    "payload_size_bytes",
    "source_message_id",
    "last_error",
];

/// Returns one CSV cell, defused: a cell starting with `=`, `+`, `-`, `@`, a tab or a carriage
/// return is prefixed with `'`, because spreadsheets run such a cell as a formula and item
/// ids and error messages come from the data (OWASP, CSV injection). The `csv` writer
/// then quotes it as needed.
fn csv_field(value: String) -> String {
    if value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value
    }
}

/// Returns one CSV row of a record, in [`CSV_COLUMNS`] order.
fn csv_row(r: &DeadLetteredItem) -> [String; CSV_COLUMNS.len()] {
    let storage = match r.payload.location {
        PayloadLocation::Inline { .. } => "inline",
        PayloadLocation::S3 { .. } => "s3",
    };
    [
        r.item_id.clone(),
        r.status.as_str().to_string(),
        r.error_class.as_str().to_string(),
        r.error_signature.clone(),
        r.failure_count.to_string(),
        crate::time_format::format(&r.first_attempt),
        crate::time_format::format(&r.last_attempt),
        r.reprocess_eligible.to_string(),
        r.manual_review_required.to_string(),
        r.reason.as_str().to_string(),
        storage.to_string(),
        r.payload.size_bytes.to_string(),
        r.source.message_id.clone(),
        r.last_error.clone(),
    ]
}

/// Writes records in a format.
pub fn export(
    records: &[DeadLetteredItem],
    format: ExportFormat,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let mut exporter = Exporter::start(format, out)?;
    exporter.write(records)?;
    exporter.finish()
}

/// Writes records in a format a page at a time: a caller reading pages keeps one page in
/// memory, never the table. A JSON export is one array, opened by [`Exporter::start`] and
/// closed by [`Exporter::finish`].
pub struct Exporter<'a> {
    format: ExportFormat,
    out: ExportSink<'a>,
    written: usize,
}

enum ExportSink<'a> {
    Plain(&'a mut dyn std::io::Write),
    Csv(Box<csv::Writer<&'a mut dyn std::io::Write>>),
}

impl<'a> Exporter<'a> {
    /// Starts an export to `out`: the JSON array's opening, or the CSV header.
    pub fn start(format: ExportFormat, out: &'a mut dyn std::io::Write) -> std::io::Result<Self> {
        let out = match format {
            ExportFormat::Csv => {
                let mut csv = csv::Writer::from_writer(out);
                csv.write_record(CSV_COLUMNS)?;
                ExportSink::Csv(Box::new(csv))
            }
            ExportFormat::Json => {
                write!(out, "[")?;
                ExportSink::Plain(out)
            }
            ExportFormat::JsonLines => ExportSink::Plain(out),
        };
        Ok(Exporter {
            format,
            out,
            written: 0,
        })
    }

    /// Writes a page of records.
    pub fn write(&mut self, records: &[DeadLetteredItem]) -> std::io::Result<()> {
        for r in records {
            match (&mut self.out, self.format) {
                (ExportSink::Csv(csv), _) => csv.write_record(csv_row(r).map(csv_field))?,
                (ExportSink::Plain(out), ExportFormat::Json) => {
                    writeln!(out, "{}", if self.written == 0 { "" } else { "," })?;
                    serde_json::to_writer_pretty(&mut **out, r)?;
                }
                (ExportSink::Plain(out), _) => {
                    serde_json::to_writer(&mut **out, r)?;
                    writeln!(out)?;
                }
            }
            self.written += 1;
        }
        Ok(())
    }

    /// Records written so far.
    pub fn written(&self) -> usize {
        self.written
    }

    /// Ends the export: the JSON array's closing, the CSV writer's flush.
    pub fn finish(self) -> std::io::Result<()> {
        match (self.out, self.format) {
            (ExportSink::Csv(mut csv), _) => csv.flush(),
            (ExportSink::Plain(out), ExportFormat::Json) => {
                writeln!(out, "{}]", if self.written == 0 { "" } else { "\n" })
            }
            (ExportSink::Plain(out), _) => out.flush(),
        }
    }
}

/// Shortens text to `max` characters for tables.
pub fn ellipsize(text: &str, max: usize) -> String {
    let one_line = text.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut s: String = one_line.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// Tells whether `c` may change what a terminal shows beyond printing itself: C0 and C1
/// controls and DEL (ESC starts colour, cursor, title and hyperlink sequences; CSI is
/// ESC `[` in one character), and the bidirectional overrides that reorder a line.
fn is_terminal_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// Returns `text` made safe to print to a terminal. Every control character is written as a
/// visible escape (`\x1b`, `\u{9b}`), so data (ids, error messages, attributes, payloads
/// written by whoever sent the message) cannot move the cursor, recolour or clear the
/// screen, retitle the window or hide text. With `multiline`, newlines, tabs and the
/// carriage return of a CRLF are kept.
pub fn terminal_safe(text: &str, multiline: bool) -> String {
    if !text.chars().any(is_terminal_control) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let kept =
            multiline && (c == '\n' || c == '\t' || (c == '\r' && chars.peek() == Some(&'\n')));
        if kept || !is_terminal_control(c) {
            out.push(c);
        } else if u32::from(c) < 0x80 {
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        }
    }
    out
}

/// Renders rows as an aligned text table. Cells are made [`terminal_safe`] (one line each).
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| terminal_safe(cell, false)).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let render = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = render(headers.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&render(row.clone()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dead_letter::{DeadLetterCandidate, DeadLetterReason, InvocationInfo};
    use crate::error::{ErrorClass, ProcessError};
    use crate::item::ItemParser;
    use crate::retry::AttemptFailure;

    /// The export, stats and analysis a page at a time (as the `dlq` commands read a large
    /// table) are what they are over every record at once.
    #[test]
    fn a_page_at_a_time_is_the_same_as_all_at_once() {
        let records: Vec<DeadLetteredItem> = (0..7)
            .map(|n| {
                crate::testing::dead_record(&format!("item-{n}"), crate::ErrorClass::Timeout, n)
            })
            .collect();
        for format in [
            ExportFormat::Json,
            ExportFormat::JsonLines,
            ExportFormat::Csv,
        ] {
            let mut whole = Vec::new();
            export(&records, format, &mut whole).unwrap();
            let mut paged = Vec::new();
            let mut exporter = Exporter::start(format, &mut paged).unwrap();
            for page in records.chunks(3) {
                exporter.write(page).unwrap();
            }
            assert_eq!(exporter.written(), 7);
            exporter.finish().unwrap();
            if format == ExportFormat::Json {
                let a: serde_json::Value = serde_json::from_slice(&whole).unwrap();
                let b: serde_json::Value = serde_json::from_slice(&paged).unwrap();
                assert_eq!(a, b);
                assert_eq!(a.as_array().map(Vec::len), Some(7));
            } else {
                assert_eq!(whole, paged, "{format:?}");
            }
        }
        let mut empty = Vec::new();
        export(&[], ExportFormat::Json, &mut empty).unwrap();
        let parsed: serde_json::Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(parsed, serde_json::json!([]));
        let now = Utc::now();
        let mut counter = StatsCounter::default();
        let mut analyzer = Analyzer::new(2);
        for page in records.chunks(3) {
            page.iter().for_each(|r| counter.add(r));
            page.iter().for_each(|r| analyzer.add(r));
        }
        assert_eq!(counter.finish((1, 2), now), stats(&records, (1, 2), now));
        assert_eq!(analyzer.finish(), analyze(&records, 2));
    }

    fn record(id: &str, class: ErrorClass, message: &str, hour: i64) -> DeadLetteredItem {
        let msg = serde_json::from_value(serde_json::json!({
            "messageId": format!("m-{id}"), "body": "{}", "attributes": {}
        }))
        .unwrap();
        let mut item = ItemParser::default().parse(format!("m-{id}"), msg).unwrap();
        item.item_id = id.to_string();
        let at = DateTime::<Utc>::from_timestamp(1_700_000_000 + hour * 3600, 0).unwrap();
        let error = ProcessError::new(class, message);
        let c = DeadLetterCandidate {
            item,
            failures: vec![AttemptFailure {
                attempt: 1,
                started_at: at,
                duration: std::time::Duration::ZERO,
                error: error.clone(),
            }],
            error,
            reason: DeadLetterReason::Permanent,
        };
        DeadLetteredItem::from_candidate(
            &c,
            &InvocationInfo::default(),
            at,
            std::time::Duration::from_secs(86_400),
        )
    }

    #[test]
    fn groups_similar_errors() {
        let records = vec![
            record("a", ErrorClass::Timeout, "timeout after 31s", 0),
            record("b", ErrorClass::Timeout, "timeout after 29s", 1),
            record("c", ErrorClass::Validation, "missing field `id`", 1),
        ];
        let a = analyze(&records, 1);
        assert_eq!(a.records, 3);
        assert_eq!(a.groups.len(), 2);
        assert_eq!(a.groups[0].count, 2);
        assert_eq!(a.groups[0].error_class, "timeout");
        assert_eq!(a.groups[0].sample_ids, ["a"]);
        assert_eq!(a.groups[0].eligible, 2);
        assert_eq!(a.by_class["timeout"], 2);
        assert_eq!(a.failures_per_hour.len(), 2);
        assert_eq!(a.failures_per_hour[1].1, 2);
    }

    #[test]
    fn records_are_counted_by_message_group_and_filtered_by_it() {
        let mut records = vec![
            record("a", ErrorClass::Timeout, "t", 0),
            record("b", ErrorClass::Timeout, "t", 0),
            record("c", ErrorClass::Timeout, "t", 0),
        ];
        records[0].source.message_group_id = Some("tenant-1".into());
        records[1].source.message_group_id = Some("tenant-1".into());
        let a = analyze(&records, 1);
        assert_eq!(a.by_group.len(), 1);
        assert_eq!(a.by_group["tenant-1"], 2, "c names no group");
        let filter = crate::selection::RecordFilter {
            message_group: Some("tenant-1".into()),
            ..Default::default()
        };
        let kept: Vec<&str> = records
            .iter()
            .filter(|r| filter.matches(r))
            .map(|r| r.item_id.as_str())
            .collect();
        assert_eq!(kept, ["a", "b"]);
    }

    #[test]
    fn every_dead_item_is_counted_in_exactly_one_standing() {
        // A validation failure seen once is neither eligible nor for manual review: it
        // needs a fix, and the three counts add up to the dead records.
        let records = vec![
            record("a", ErrorClass::Timeout, "t", 0),
            record("b", ErrorClass::Permission, "denied", 0),
            record("c", ErrorClass::Validation, "missing field `id`", 0),
            record("d", ErrorClass::NotFound, "no such order", 0),
            record("e", ErrorClass::Unknown, "boom", 0),
        ];
        let s = stats(&records, (0, 0), records[0].first_attempt);
        // An unknown error is eligible (a redrive may meet a fixed handler).
        assert_eq!(
            (s.dead_eligible, s.dead_manual_review, s.dead_needs_fix),
            (2, 1, 2)
        );
        assert_eq!(
            s.dead_eligible + s.dead_manual_review + s.dead_needs_fix,
            s.by_status["dead"]
        );
        assert_eq!(records[2].triage(), Triage::NeedsFix);
        assert_eq!(records[1].triage(), Triage::ManualReview);
        assert_eq!(records[0].triage(), Triage::Eligible);
    }

    #[test]
    fn stats_and_exports() {
        let records = vec![
            record("a", ErrorClass::Timeout, "t", 0),
            record("b", ErrorClass::Permission, "denied, \"really\"", 0),
        ];
        let now = records[0].first_attempt + chrono::Duration::seconds(90);
        let s = stats(&records, (2, 0), now);
        assert_eq!(s.by_status["dead"], 2);
        assert_eq!(s.dead_eligible, 1);
        assert_eq!(s.dead_manual_review, 1);
        assert_eq!(s.dead_needs_fix, 0);
        assert_eq!(s.oldest_dead_age_secs, Some(90));
        let mut csv = Vec::new();
        export(&records, ExportFormat::Csv, &mut csv).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        assert_eq!(csv.lines().count(), 3);
        assert!(
            csv.lines()
                .nth(2)
                .unwrap()
                .ends_with(r#""denied, ""really""""#),
            "{csv}"
        );
        let mut jsonl = Vec::new();
        export(&records, ExportFormat::JsonLines, &mut jsonl).unwrap();
        let back: Vec<DeadLetteredItem> = String::from_utf8(jsonl)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(back, records);
        assert_eq!(
            ExportFormat::from_path("x.ndjson".as_ref()),
            Some(ExportFormat::JsonLines)
        );
        assert_eq!(ExportFormat::from_path("x.txt".as_ref()), None);
    }

    #[test]
    fn csv_cells_cannot_start_a_formula() {
        let records = vec![
            record(
                "=HYPERLINK(\"http://x\",\"y\")",
                ErrorClass::Validation,
                "+1",
                0,
            ),
            record("@SUM(A1)", ErrorClass::Validation, "-2, then", 0),
            record("\tcmd", ErrorClass::Validation, "\rx", 0),
            record("plain", ErrorClass::Validation, "a=b", 0),
        ];
        let mut csv = Vec::new();
        export(&records, ExportFormat::Csv, &mut csv).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        let rows: Vec<&str> = csv.split('\n').skip(1).filter(|l| !l.is_empty()).collect();
        let item = |row: &str| row.split(',').next().unwrap().to_string();
        assert_eq!(item(rows[0]), r#""'=HYPERLINK(""http://x"""#, "{csv}");
        assert!(rows[0].ends_with(",'+1"), "{csv}");
        assert_eq!(item(rows[1]), "'@SUM(A1)");
        assert!(rows[1].ends_with(r#","'-2, then""#), "{csv}");
        assert_eq!(item(rows[2]), "'\tcmd");
        assert!(rows[2].ends_with(",\"'\rx\""), "{csv:?}");
        assert_eq!(item(rows[3]), "plain", "nothing added mid-text");
        assert!(rows[3].ends_with(",a=b"), "{csv}");
        // What a CSV reader (a spreadsheet's import) gets back: every cell defused.
        let cells: Vec<csv::StringRecord> = csv::Reader::from_reader(csv.as_bytes())
            .records()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(cells.len(), 4);
        for row in &cells {
            assert_eq!(row.len(), CSV_COLUMNS.len());
            for cell in row {
                assert!(
                    !cell.starts_with(['=', '+', '-', '@', '\t', '\r']),
                    "{cell:?}"
                );
            }
        }
        assert_eq!(&cells[0][0], "'=HYPERLINK(\"http://x\",\"y\")");
        assert_eq!(&cells[1][13], "'-2, then");
    }

    #[test]
    fn terminal_controls_are_made_visible() {
        let evil = "id\x1b]0;pwned\x07\x1b[2J\u{9b}31m\u{202e}txt\r\nnext\tcol\x7f";
        assert_eq!(
            terminal_safe(evil, false),
            "id\\x1b]0;pwned\\x07\\x1b[2J\\u{9b}31m\\u{202e}txt\\x0d\\x0anext\\x09col\\x7f"
        );
        assert_eq!(
            terminal_safe(evil, true),
            "id\\x1b]0;pwned\\x07\\x1b[2J\\u{9b}31m\\u{202e}txt\r\nnext\tcol\\x7f"
        );
        assert_eq!(
            terminal_safe("a lone\rcarriage", true),
            "a lone\\x0dcarriage"
        );
        assert_eq!(terminal_safe("plain ü € 😀", false), "plain ü € 😀");
        let t = table(&["id"], &[vec!["\x1b[31mred".into()]]);
        assert_eq!(t, "id\n\\x1b[31mred\n");
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["id", "class"],
            &[
                vec!["a".into(), "timeout".into()],
                vec!["long-id".into(), "x".into()],
            ],
        );
        assert_eq!(t, "id       class\na        timeout\nlong-id  x\n");
        assert_eq!(ellipsize("abcdef", 4), "abc…");
    }
}
