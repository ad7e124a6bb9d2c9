//! One function per `dlq` command. Each prints its result to stdout; progress and
//! prompts go to stderr.

use std::io::Write;

use chrono::Utc;
use sqs_worker::analysis::{self, ExportFormat};
use sqs_worker::dead_letter::{DeadLetteredItem, ItemStatus, PayloadLocation};
use sqs_worker::error::ErrorClass;
use sqs_worker::redrive::{
    ItemOutcomeKind, RedriveEngine, RedriveMode, RedriveReport, RedriveRequest, RedriveSettings,
};
use sqs_worker::store::payload::{self, S3Pointer};
use sqs_worker::store::query::RecordFilter;
use sqs_worker::store::DeadLetterStore;
use sqs_worker::HttpDelivery;

use crate::args::{Cli, Command, FilterArgs, FormatArg, GlobalArgs, ModeArg, RedriveArgs};
use crate::context::{confirm, progress, store};
use crate::{CliError, Completion};

/// Runs the command.
pub async fn dispatch(cli: Cli) -> Result<Completion, CliError> {
    let global = cli.global;
    match cli.command {
        Command::List {
            filter,
            limit,
            json,
        } => list(&global, &filter, limit, json).await,
        Command::Inspect {
            item_id,
            payload,
            raw,
            json,
        } => {
            let payload = match (payload, raw) {
                (false, _) => None,
                (true, false) => Some(PayloadOutput::Escaped),
                (true, true) => Some(PayloadOutput::Raw),
            };
            inspect(&global, &item_id, payload, json).await
        }
        Command::Analyze {
            filter,
            samples,
            json,
        } => analyze(&global, &filter, samples, json).await,
        Command::Stats { json } => stats(&global, json).await,
        Command::Export {
            file,
            format,
            filter,
        } => export(&global, &file, format, &filter).await,
        Command::Redrive(args) => redrive(&global, args).await,
        Command::Purge {
            older_than,
            status,
            yes,
        } => purge(&global, &older_than, &status, yes).await,
        Command::Clear { yes } => clear(&global, yes).await,
    }
}

fn parse_status(text: &str) -> Result<Option<ItemStatus>, CliError> {
    if text == "any" {
        return Ok(None);
    }
    ItemStatus::parse(text).map(Some).ok_or_else(|| {
        CliError::Usage(format!(
            "status {text:?} is not one of dead, redriving, requeued, resolved, any"
        ))
    })
}

fn parse_class(text: &str) -> Result<ErrorClass, CliError> {
    ErrorClass::parse(text).ok_or_else(|| {
        let names: Vec<&str> = ErrorClass::ALL.iter().map(|c| c.as_str()).collect();
        CliError::Usage(format!("class {text:?} is not one of {}", names.join(", ")))
    })
}

fn filter_from(args: &FilterArgs) -> Result<RecordFilter, CliError> {
    let now = Utc::now();
    let time = |t: &Option<String>, what: &str| {
        t.as_deref()
            .map(|t| sqs_worker::duration::parse_time(t, now))
            .transpose()
            .map_err(|e| CliError::Usage(format!("--{what}: {e}")))
    };
    Ok(RecordFilter {
        status: parse_status(&args.status)?,
        signature: args.signature.clone(),
        class: args.class.as_deref().map(parse_class).transpose()?,
        since: time(&args.since, "since")?,
        until: time(&args.until, "until")?,
        eligible_only: args.eligible,
        lease_expired_before: None,
    })
}

fn out() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

fn write_err(e: std::io::Error) -> CliError {
    CliError::Failed(format!("cannot write output: {e}"))
}

async fn list(
    global: &GlobalArgs,
    args: &FilterArgs,
    limit: usize,
    json: bool,
) -> Result<Completion, CliError> {
    let filter = filter_from(args)?;
    let store = store(global).await?;
    let mut unreadable = Vec::new();
    let mut records = store
        .query_all_noting(&filter, Some(limit + 1), |_| {}, &mut unreadable)
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
        let rows: Vec<Vec<String>> = records
            .iter()
            .map(|r| {
                vec![
                    r.item_id.clone(),
                    r.status.as_str().to_string(),
                    r.error_class.as_str().to_string(),
                    r.failure_count.to_string(),
                    sqs_worker::time_format::format(&r.last_attempt),
                    r.error_signature.clone(),
                    analysis::ellipsize(&r.last_error, 60),
                ]
            })
            .collect();
        write!(
            out,
            "{}",
            analysis::table(
                &[
                    "ITEM ID",
                    "STATUS",
                    "CLASS",
                    "FAILURES",
                    "LAST ATTEMPT",
                    "SIGNATURE",
                    "LAST ERROR"
                ],
                &rows
            )
        )
        .map_err(write_err)?;
        writeln!(
            out,
            "{} record(s){}",
            records.len(),
            if more {
                "; more match (raise --limit or filter)"
            } else {
                ""
            }
        )
        .map_err(write_err)?;
    }
    // Unreadable records were left out: say so in the exit code too.
    Ok(if unreadable.is_empty() {
        Completion::Ok
    } else {
        Completion::Partial
    })
}

async fn fetch_payload(
    store: &DeadLetterStore,
    record: &DeadLetteredItem,
) -> Result<String, CliError> {
    let body = match &record.payload.location {
        PayloadLocation::Inline { body } => body.clone(),
        PayloadLocation::S3 { bucket, key } => {
            let pointer = S3Pointer {
                bucket: bucket.clone(),
                key: key.clone(),
            };
            payload::get_payload(&store.clients().s3, &pointer).await?.0
        }
    };
    let sha = sqs_worker::hex::sha256_hex(body.as_bytes());
    if sha != record.payload.sha256 {
        return Err(CliError::Failed(format!(
            "payload of {:?} has sha256 {sha} but the record says {}: it was changed or corrupted",
            record.item_id, record.payload.sha256
        )));
    }
    Ok(body)
}

/// How `inspect --payload` writes the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PayloadOutput {
    /// Control characters shown as escapes (newlines and tabs kept).
    Escaped,
    /// The exact bytes.
    Raw,
}

/// A field that comes from the data, for one line of text output.
fn safe(text: &str) -> String {
    analysis::terminal_safe(text, false)
}

/// A field that comes from the data and may span lines (error messages).
fn safe_lines(text: &str) -> String {
    analysis::terminal_safe(text, true)
}

async fn inspect(
    global: &GlobalArgs,
    item_id: &str,
    payload_output: Option<PayloadOutput>,
    json: bool,
) -> Result<Completion, CliError> {
    let store = store(global).await?;
    let record = store
        .get(item_id)
        .await?
        .ok_or_else(|| CliError::Usage(format!("no dead-lettered item with id {item_id:?}")))?;
    let mut out = out();
    if let Some(output) = payload_output {
        let body = fetch_payload(&store, &record).await?;
        eprintln!(
            "payload: {} bytes, sha256 {} verified",
            body.len(),
            record.payload.sha256
        );
        let body = match output {
            PayloadOutput::Raw => body,
            PayloadOutput::Escaped => safe_lines(&body),
        };
        writeln!(out, "{body}").map_err(write_err)?;
        return Ok(Completion::Ok);
    }
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&record).unwrap_or_default()
        )
        .map_err(write_err)?;
        return Ok(Completion::Ok);
    }
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let r = &record;
    // Every field below that comes from the data (ids, messages, attributes, names the
    // sender chose) goes through `safe`/`safe_lines`: it cannot drive the terminal.
    let payload = match &r.payload.location {
        PayloadLocation::Inline { .. } => format!(
            "inline, {} bytes, sha256 {}",
            r.payload.size_bytes,
            safe(&r.payload.sha256)
        ),
        PayloadLocation::S3 { bucket, key } => {
            format!(
                "s3://{}/{}, {} bytes, sha256 {}",
                safe(bucket),
                safe(key),
                r.payload.size_bytes,
                safe(&r.payload.sha256)
            )
        }
    };
    let mut text = format!(
        "item id:        {}\nstatus:         {}{}\nreason:         {}\nerror:          {} ({}), signature {}\nlast error:     {}\nfailures:       {} (first {}, last {})\neligible:       {}   manual review: {}\npayload:        {}\nsource:         queue {}, message {}, group {}, sent {}, receive count {}\n",
        safe(&r.item_id),
        r.status.as_str(),
        r.resolved_at.map(|t| format!(" at {}", sqs_worker::time_format::format(&t))).unwrap_or_default(),
        serde_json::to_value(r.reason).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
        r.error_class,
        r.failure_history.last().and_then(|f| f.http_status).map(|s| format!("HTTP {s}")).unwrap_or_else(|| "no HTTP status".into()),
        safe(&r.error_signature),
        safe_lines(&r.last_error),
        r.failure_count,
        sqs_worker::time_format::format(&r.first_attempt),
        sqs_worker::time_format::format(&r.last_attempt),
        yes_no(r.reprocess_eligible),
        yes_no(r.manual_review_required),
        payload,
        safe(r.source.queue_arn.as_deref().unwrap_or("?")),
        safe(&r.source.message_id),
        safe(r.source.message_group_id.as_deref().unwrap_or("-")),
        r.source.sent_timestamp.map(|t| sqs_worker::time_format::format(&t)).unwrap_or_else(|| "?".into()),
        r.source.receive_count,
    );
    if !r.source.message_attributes.is_empty() {
        let mut attrs: Vec<String> = r
            .source
            .message_attributes
            .iter()
            .map(|(k, v)| {
                let value = match (&v.string_value, &v.binary_value) {
                    (Some(text), _) => text.clone(),
                    (None, Some(binary)) => format!("<{} base64 bytes>", binary.len()),
                    (None, None) => "<not kept>".to_string(),
                };
                format!("{}={} ({})", safe(k), safe(&value), safe(&v.data_type))
            })
            .collect();
        attrs.sort();
        text.push_str(&format!("attributes:     {}\n", attrs.join(", ")));
    }
    text.push_str("history:\n");
    // A compacted history keeps the first attempts and the latest ones; say where the gap is.
    let head = sqs_worker::dead_letter::HISTORY_HEAD.min(r.failure_history.len());
    for (n, f) in r.failure_history.iter().enumerate() {
        if r.history_omitted > 0 && n == head {
            text.push_str(&format!(
                "  … {} attempts omitted (the record keeps the first and the latest)\n",
                r.history_omitted
            ));
        }
        text.push_str(&format!(
            "  {}  delivery {} attempt {}  {}{}  step {}  {} ms  request {}  log {} {}\n      {}\n",
            sqs_worker::time_format::format(&f.timestamp),
            f.receive_count,
            f.attempt_number,
            f.error_type,
            f.http_status
                .map(|s| format!(" (HTTP {s})"))
                .unwrap_or_default(),
            safe(f.step.as_deref().unwrap_or("-")),
            f.duration_ms,
            safe(f.request_id.as_deref().unwrap_or("-")),
            safe(f.log_group.as_deref().unwrap_or("-")),
            safe(f.log_stream.as_deref().unwrap_or("-")),
            safe_lines(&f.error_message),
        ));
        for cause in &f.causes {
            text.push_str(&format!("      caused by: {}\n", safe_lines(cause)));
        }
        if let Some(excerpt) = &f.response_excerpt {
            text.push_str(&format!("      response: {}\n", safe_lines(excerpt)));
        }
    }
    write!(out, "{text}").map_err(write_err)?;
    Ok(Completion::Ok)
}

async fn analyze(
    global: &GlobalArgs,
    args: &FilterArgs,
    samples: usize,
    json: bool,
) -> Result<Completion, CliError> {
    let filter = filter_from(args)?;
    let store = store(global).await?;
    let bar = progress(None, "reading records");
    let records = store
        .query_all(&filter, None, |n| bar.set_position(n as u64))
        .await?;
    bar.finish_and_clear();
    let a = analysis::analyze(&records, samples);
    let mut out = out();
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&a).unwrap_or_default()
        )
        .map_err(write_err)?;
        return Ok(Completion::Ok);
    }
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
                sqs_worker::time_format::format(&g.first_seen),
                sqs_worker::time_format::format(&g.last_seen),
                g.eligible.to_string(),
                g.sample_ids.join(" "),
                analysis::ellipsize(&g.sample_error, 50),
            ]
        })
        .collect();
    write!(
        out,
        "{}",
        analysis::table(
            &[
                "COUNT",
                "CLASS",
                "SIGNATURE",
                "FIRST SEEN",
                "LAST SEEN",
                "ELIGIBLE",
                "SAMPLE IDS",
                "SAMPLE ERROR"
            ],
            &rows
        )
    )
    .map_err(write_err)?;
    writeln!(out, "\nby class:").map_err(write_err)?;
    for (class, n) in &a.by_class {
        writeln!(out, "  {class:<14} {n}").map_err(write_err)?;
    }
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
    Ok(Completion::Ok)
}

async fn stats(global: &GlobalArgs, json: bool) -> Result<Completion, CliError> {
    let store = store(global).await?;
    let records = store
        .query_all(&RecordFilter::default(), None, |_| {})
        .await?;
    let dlq = store.dlq_depth().await?;
    let s = analysis::stats(&records, dlq, Utc::now());
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
        "dead, eligible:     {}\ndead, manual review: {}\ndead, payload in S3: {}\n",
        s.dead_eligible, s.dead_manual_review, s.dead_payloads_in_s3
    ));
    text.push_str("dead by class:\n");
    for (class, n) in &s.dead_by_class {
        text.push_str(&format!("  {class:<18}{n}\n"));
    }
    text.push_str(&format!(
        "DLQ depth:          {} visible, {} in flight\n",
        s.dlq_visible, s.dlq_in_flight
    ));
    text.push_str(&format!(
        "oldest dead item:   {}\n",
        s.oldest_dead_age_secs
            .map(human_age)
            .unwrap_or_else(|| "none".into())
    ));
    write!(out, "{text}").map_err(write_err)?;
    Ok(Completion::Ok)
}

fn human_age(secs: i64) -> String {
    match secs {
        s if s < 120 => format!("{s} s ago"),
        s if s < 7200 => format!("{} min ago", s / 60),
        s if s < 172_800 => format!("{} h ago", s / 3600),
        s => format!("{} days ago", s / 86_400),
    }
}

async fn export(
    global: &GlobalArgs,
    file: &std::path::Path,
    format: Option<FormatArg>,
    args: &FilterArgs,
) -> Result<Completion, CliError> {
    let format = match format {
        Some(FormatArg::Json) => ExportFormat::Json,
        Some(FormatArg::Jsonl) => ExportFormat::JsonLines,
        Some(FormatArg::Csv) => ExportFormat::Csv,
        None => ExportFormat::from_path(file).ok_or_else(|| {
            CliError::Usage(format!(
                "cannot tell the format of {}: use .json, .jsonl or .csv, or --format",
                file.display()
            ))
        })?,
    };
    let filter = filter_from(args)?;
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

fn redrive_request(args: &RedriveArgs) -> Result<RedriveRequest, CliError> {
    let mut request = match &args.request {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
            RedriveRequest::from_json(&text)
                .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?
        }
        None => RedriveRequest {
            item_ids: args.item_id.clone(),
            error_signature: args.signature.clone(),
            error_class: args.class.as_deref().map(parse_class).transpose()?,
            since: args.since.clone(),
            until: args.until.clone(),
            status: match &args.status {
                Some(s) => parse_status(s)?,
                None => None,
            },
            ..RedriveRequest::default()
        },
    };
    // Run options apply on top of a request file too.
    request.force |= args.force;
    request.dry_run |= args.dry_run;
    if let Some(mode) = args.mode {
        request.mode = match mode {
            ModeArg::Reprocess => RedriveMode::Reprocess,
            ModeArg::Requeue => RedriveMode::Requeue,
        };
    }
    request.max_items = args.max_items.or(request.max_items);
    request.parallelism = args.parallelism.or(request.parallelism);
    request.rate = args.rate.or(request.rate);
    if let Some(budget) = &args.time_budget {
        let d = sqs_worker::duration::parse_duration(budget)
            .map_err(|e| CliError::Usage(format!("--time-budget: {e}")))?;
        request.time_budget_secs = Some(d.as_secs());
    }
    if args.continuation.is_some() {
        request.continuation_token = args.continuation.clone();
    }
    Ok(request)
}

async fn redrive(global: &GlobalArgs, args: RedriveArgs) -> Result<Completion, CliError> {
    let request = redrive_request(&args)?;
    let report = match &args.via_function {
        Some(function) => invoke_function(global, function, &request).await?,
        None => {
            let store = store(global).await?;
            let processor = processor_from_env(store.clients()).await?;
            let settings = RedriveSettings {
                parser: sqs_worker::item::ItemParser {
                    id_source: std::env::var("WORKER_ITEM_ID_SOURCE")
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(sqs_worker::item::ItemIdSource::MessageId),
                    ..Default::default()
                },
                source_queue_url: args.source_queue_url.clone(),
                // A local run has no response size limit: the report lists every item.
                report_items: usize::MAX,
                ..RedriveSettings::default()
            };
            let engine = RedriveEngine::new(store, processor, settings);
            let bar = progress(request.max_items.map(|n| n as u64), "redriving");
            let on_item = |_: &sqs_worker::redrive::ItemOutcome| bar.inc(1);
            let report = engine.run(&request, &on_item).await.map_err(|e| match e {
                sqs_worker::redrive::RedriveError::InvalidRequest(m) => CliError::Usage(m),
                other => CliError::Failed(other.to_string()),
            })?;
            bar.finish_and_clear();
            report
        }
    };
    print_report(&report, args.json)?;
    Ok(if report.is_partial_failure() {
        Completion::Partial
    } else {
        Completion::Ok
    })
}

/// The HTTP delivery processor when `WORKER_DOWNSTREAM_URL` is set (reprocess mode), with
/// the downstream credential from Secrets Manager when one is configured.
async fn processor_from_env(
    clients: &sqs_worker::aws::AwsClients,
) -> Result<Option<HttpDelivery>, CliError> {
    if std::env::var("WORKER_DOWNSTREAM_URL").is_err() {
        return Ok(None);
    }
    let mut config =
        sqs_worker::config::WorkerConfig::from_env().map_err(|e| CliError::Usage(e.to_string()))?;
    config
        .resolve_downstream_auth(clients)
        .await
        .map_err(|e| CliError::Usage(e.to_string()))?;
    HttpDelivery::new(config.delivery)
        .map(Some)
        .map_err(|e| CliError::Usage(format!("cannot build the processor: {e}")))
}

async fn invoke_function(
    global: &GlobalArgs,
    function: &str,
    request: &RedriveRequest,
) -> Result<RedriveReport, CliError> {
    let lambda = aws_sdk_lambda::Client::new(&crate::context::sdk_config(global).await);
    let payload = serde_json::to_vec(request).map_err(|e| CliError::Failed(e.to_string()))?;
    let output = lambda
        .invoke()
        .function_name(function)
        .payload(aws_sdk_lambda::primitives::Blob::new(payload))
        .send()
        .await
        .map_err(|e| {
            CliError::Failed(format!(
                "invoking {function}: {}",
                sqs_worker::ProcessError::from_sdk(&e)
            ))
        })?;
    let body = output
        .payload()
        .map(|b| b.as_ref().to_vec())
        .unwrap_or_default();
    if let Some(kind) = output.function_error() {
        return Err(CliError::Failed(format!(
            "{function} failed ({kind}): {}",
            String::from_utf8_lossy(&body)
        )));
    }
    serde_json::from_slice::<RedriveReport>(&body).map_err(|e| {
        CliError::Failed(format!(
            "{function} answered something that is not a redrive report: {e}"
        ))
    })
}

fn print_report(report: &RedriveReport, json: bool) -> Result<(), CliError> {
    let mut out = out();
    if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        )
        .map_err(write_err)?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = report
        .items
        .iter()
        .map(|o| {
            vec![
                o.item_id.clone(),
                serde_json::to_value(o.outcome)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                analysis::ellipsize(o.detail.as_deref().unwrap_or(""), 70),
            ]
        })
        .collect();
    if !rows.is_empty() {
        write!(
            out,
            "{}",
            analysis::table(&["ITEM ID", "OUTCOME", "DETAIL"], &rows)
        )
        .map_err(write_err)?;
    }
    writeln!(
        out,
        "{}{} selected: {} resolved, {} failed again, {} skipped (ineligible), {} leased by another run, {} not found, {} errors; {} adopted from the DLQ, {} DLQ messages deleted",
        if report.dry_run { "dry run: " } else { "" },
        report.selected,
        report.succeeded,
        report.failed_again,
        report.skipped_ineligible,
        report.leased_elsewhere,
        report.not_found,
        report.errors,
        report.adopted_from_dlq,
        report.dlq_messages_deleted,
    )
    .map_err(write_err)?;
    if report.dry_run {
        let would = report
            .items
            .iter()
            .filter(|o| o.outcome == ItemOutcomeKind::WouldRedrive)
            .count();
        writeln!(
            out,
            "{would} item(s) would be redriven; nothing was changed"
        )
        .map_err(write_err)?;
    }
    if let Some(token) = &report.continuation_token {
        writeln!(
            out,
            "stopped early; continue with: dlq redrive --continue {token}"
        )
        .map_err(write_err)?;
    }
    Ok(())
}

async fn purge(
    global: &GlobalArgs,
    older_than: &str,
    status: &str,
    yes: bool,
) -> Result<Completion, CliError> {
    let age = sqs_worker::duration::parse_duration(older_than)
        .map_err(|e| CliError::Usage(format!("--older-than: {e}")))?;
    let cutoff = Utc::now()
        - chrono::Duration::from_std(age)
            .map_err(|_| CliError::Usage("--older-than is too long".into()))?;
    let filter = RecordFilter {
        status: parse_status(status)?,
        until: Some(cutoff),
        ..RecordFilter::default()
    };
    let store = store(global).await?;
    let records = store.query_all(&filter, None, |_| {}).await?;
    if records.is_empty() {
        writeln!(
            out(),
            "nothing to purge: no {status} record older than {older_than}"
        )
        .map_err(write_err)?;
        return Ok(Completion::Ok);
    }
    confirm(
        &format!("Delete {} {status} record(s) older than {older_than} with their payloads and DLQ messages?", records.len()),
        yes,
    )?;
    let bar = progress(Some(records.len() as u64), "purging");
    let report = store
        .remove_records(&records, &sqs_worker::item::ItemParser::default(), |n| {
            bar.set_position(n as u64)
        })
        .await?;
    bar.finish_and_clear();
    writeln!(
        out(),
        "purged {} record(s), {} payload(s), {} DLQ message(s)",
        report.records_deleted,
        report.payloads_deleted,
        report.dlq_messages_deleted
    )
    .map_err(write_err)?;
    Ok(Completion::Ok)
}

async fn clear(global: &GlobalArgs, yes: bool) -> Result<Completion, CliError> {
    let store = store(global).await?;
    let (depth, in_flight) = store.dlq_depth().await?;
    let count = store
        .query_all(&RecordFilter::default(), None, |_| {})
        .await?
        .len();
    confirm(
        &format!(
            "Delete ALL {count} record(s), their payloads and all {} DLQ message(s)?",
            depth + in_flight
        ),
        yes,
    )?;
    let bar = progress(Some(count as u64), "clearing");
    let report = store.clear(|n| bar.set_position(n as u64)).await?;
    bar.finish_and_clear();
    writeln!(
        out(),
        "cleared {} record(s), {} payload(s), {} DLQ message(s)",
        report.records_deleted,
        report.payloads_deleted,
        report.dlq_messages_deleted
    )
    .map_err(write_err)?;
    Ok(Completion::Ok)
}
