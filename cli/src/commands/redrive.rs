//! `dlq redrive`: builds a redrive request from the options (or a request file), runs it
//! here through the library's engine or in the deployed redrive function, and prints the
//! report.
//!
//! The engine is built here from the same configuration as the redrive function's
//! ([`sqs_keeper_lambda::config::RedriveConfig`]: the worker's retries and processor,
//! `REDRIVE_KEEP_PAYLOADS`, `REDRIVE_SOURCE_QUEUE_URL`); `invoke_function` runs the
//! request remotely.

use std::io::Write;

use sqs_keeper_core::{
    redrive::ItemOutcomeKind, redrive::RedriveMode, redrive::RedriveReport, redrive::RedriveRequest,
};
use sqs_keeper_lambda::redrive_function::redrive_processor;

use super::render::{out, table, write_err};
use crate::args::{GlobalArgs, RedriveArgs};
use crate::session::{progress, store};
use crate::{CliError, Completion};

/// Returns the request the options describe; run options apply on top of a request file.
fn redrive_request(args: &RedriveArgs) -> Result<RedriveRequest, CliError> {
    let mut request = match &args.request {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
            RedriveRequest::from_json(&text)
                .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?
        }
        None => RedriveRequest {
            item_ids: args
                .item_id
                .iter()
                .map(|id| super::stored_item_id(id))
                .collect::<Result<_, _>>()?,
            error_signature: args.signature.clone(),
            error_class: args.class,
            message_group_id: args.group.clone(),
            since: args.since.clone(),
            until: args.until.clone(),
            // `any` leaves the status unset: the engine's default (dead).
            status: args.status.and_then(|s| s.0),
            ..RedriveRequest::default()
        },
    };
    // Run options apply on top of a request file too.
    request.force |= args.force;
    request.dry_run |= args.dry_run;
    if let Some(mode) = args.mode {
        request.mode = mode;
    }
    request.max_items = args.max_items.or(request.max_items);
    request.parallelism = args.parallelism.or(request.parallelism);
    request.rate = args.rate.or(request.rate);
    if let Some(budget) = &args.time_budget {
        let d = sqs_keeper_core::duration::parse_duration(budget)
            .map_err(|e| CliError::Usage(format!("--time-budget: {e}")))?;
        request.time_budget_secs = Some(d.as_secs());
    }
    if args.continuation.is_some() {
        request.continuation_token = args.continuation.clone();
    }
    Ok(request)
}

/// A run that selects more items than this asks for confirmation first, as `purge` and
/// `clear` do.
const CONFIRM_ABOVE: usize = 100;

/// Asks before a run over more than [`CONFIRM_ABOVE`] items (not one naming its items, nor
/// a continuation, which was confirmed when it began): `--force --mode requeue` over
/// everything is one line away.
async fn confirm_large_run(
    store: &sqs_keeper_aws::DeadLetterStore,
    request: &RedriveRequest,
    yes: bool,
) -> Result<(), CliError> {
    if yes || !request.item_ids.is_empty() || request.continuation_token.is_some() {
        return Ok(());
    }
    let limit = request.max_items.unwrap_or(usize::MAX);
    let filters = request
        .record_filters(chrono::Utc::now())
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let mut count = 0;
    for filter in &filters {
        let wanted = CONFIRM_ABOVE + 1 - count.min(CONFIRM_ABOVE);
        count += store.query_all(filter, Some(wanted), |_| {}).await?.len();
    }
    let count = count.min(limit);
    if count <= CONFIRM_ABOVE {
        return Ok(());
    }
    let mode = serde_json::to_value(request.mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    crate::session::confirm(
        &format!("Redrive more than {CONFIRM_ABOVE} items (mode {mode})?"),
        false,
    )
}

/// Runs the redrive (here, or in `--via-function`) and prints its report.
pub async fn redrive(global: &GlobalArgs, args: RedriveArgs) -> Result<Completion, CliError> {
    // A continuation runs the request its token carries (a dry run's stays a dry run).
    let request = redrive_request(&args)?
        .resumed()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let report = match &args.via_function {
        Some(function) => invoke_function(global, function, &request).await?,
        None => run_here(global, &args, &request).await?,
    };
    print_report(&report, args.json)?;
    Ok(if report.is_partial_failure() {
        Completion::Partial
    } else {
        Completion::Ok
    })
}

/// Runs the request in this process, as the redrive function would run it.
///
/// The configuration is the redrive function's (retries, processor, item ids, requeue
/// target, payload keeping), read from the same variables.
async fn run_here(
    global: &GlobalArgs,
    args: &RedriveArgs,
    request: &RedriveRequest,
) -> Result<RedriveReport, CliError> {
    let lookup = |name: &str| std::env::var(name).ok();
    let mut env = sqs_keeper_lambda::config::EnvReader::new(&lookup);
    let mut config = sqs_keeper_lambda::config::RedriveConfig::read(&mut env);
    env.finish().map_err(|e| CliError::Usage(e.to_string()))?;
    let store = store(global).await?;
    if !request.dry_run {
        // Every resource it changes exists, before anything changes.
        store.check_resources().await?;
        confirm_large_run(&store, request, args.yes).await?;
    }
    let processor = redrive_processor(&config, store.clients())
        .await
        .map_err(|e| CliError::Usage(e.to_string()))?;
    if processor.is_none() {
        refuse_reprocessing_without_downstream(request)?;
    }
    // Behind the worker's circuit breaker, as the function runs it.
    let breaker = sqs_keeper_lambda::redrive_function::redrive_breaker(&config, store.clients());
    if args.source_queue_url.is_some() {
        config.settings.source_queue_url = args.source_queue_url.clone();
    }
    // A keeper run has no response size limit: the report lists every item.
    config.settings.report_items = usize::MAX;
    // The function's engine: its payload buckets, pointers and sweep policy.
    let engine = sqs_keeper_lambda::redrive_function::redrive_engine(
        &config,
        store.clients().clone(),
        store.config().clone(),
        processor,
    );
    let bar = progress(request.max_items.map(|n| n as u64), "redriving");
    let on_item = |_: &sqs_keeper_core::redrive::ItemOutcome| bar.inc(1);
    let report = sqs_keeper_lambda::redrive_function::run_gated(
        &engine,
        breaker.as_ref().map(|(store, policy)| (store, policy)),
        request,
        None,
        &on_item,
    )
    .await
    .map_err(|e| match e {
        sqs_keeper_core::redrive::RedriveError::InvalidRequest(m) => CliError::Usage(m),
        sqs_keeper_core::redrive::RedriveError::Store(e) => CliError::from(e),
        other => CliError::Failed(other.to_string()),
    })?;
    bar.finish_and_clear();
    Ok(report)
}

/// Refuses a reprocessing run that has no downstream to call here; a dry run only notes it.
fn refuse_reprocessing_without_downstream(request: &RedriveRequest) -> Result<(), CliError> {
    if request.mode != RedriveMode::Reprocess {
        return Ok(());
    }
    let advice = "reprocessing here needs the worker's downstream: set WORKER_DOWNSTREAM_URL (and the worker's other WORKER_* variables), or run it in the deployed redrive function with --via-function <stack>-redrive, or send the items back to their queue with --mode requeue";
    if !request.dry_run {
        return Err(CliError::Usage(advice.to_string()));
    }
    eprintln!("note: the dry run only selects; {advice}");
    Ok(())
}

/// Runs the request in the deployed redrive function and returns its report.
async fn invoke_function(
    global: &GlobalArgs,
    function: &str,
    request: &RedriveRequest,
) -> Result<RedriveReport, CliError> {
    let lambda = aws_sdk_lambda::Client::new(&crate::session::sdk_config(global).await);
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
                sqs_keeper_lambda::ProcessError::from_sdk(&e)
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

/// Prints the report: one row per item, the totals, and how to continue a run that stopped early.
fn print_report(report: &RedriveReport, json: bool) -> Result<(), CliError> {
    let mut out = out();
    let text = if json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(report).unwrap_or_default()
        )
    } else {
        report_text(report)
    };
    write!(out, "{text}").map_err(write_err)
}

/// Returns the report as a table of items and the lines that follow it.
fn report_text(report: &RedriveReport) -> String {
    let mut text = String::new();
    if let Some(why) = &report.held_by_breaker {
        text.push_str(&format!(
            "nothing reprocessed: the worker's circuit breaker is open ({why}); the scheduled redrive probes once its open period is over\n"
        ));
    }
    let rows: Vec<Vec<String>> = report.items.iter().map(item_row).collect();
    if !rows.is_empty() {
        text.push_str(&table(&["ITEM ID", "OUTCOME", "DETAIL"], &["DETAIL"], rows));
    }
    text.push_str(&totals_line(report));
    if report.held_by_group_breaker > 0 {
        text.push_str(&format!(
            "{} item(s) held back by their message group's open circuit breaker, unchanged: a later run takes them once it has closed\n",
            report.held_by_group_breaker
        ));
    }
    if report.dry_run {
        let would = report
            .items
            .iter()
            .filter(|o| o.outcome == ItemOutcomeKind::WouldRedrive)
            .count();
        text.push_str(&format!(
            "{would} item(s) would be redriven; nothing was changed\n"
        ));
    }
    if let Some(token) = &report.continuation_token {
        text.push_str(&format!(
            "stopped early; continue with: dlq redrive --continue {token}\n"
        ));
    }
    text
}

/// Returns one item's row: its id, its outcome as the JSON report names it, the detail.
fn item_row(o: &sqs_keeper_core::redrive::ItemOutcome) -> Vec<String> {
    vec![
        o.item_id.clone(),
        serde_json::to_value(o.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        sqs_keeper_core::analysis::ellipsize(o.detail.as_deref().unwrap_or(""), 70),
    ]
}

/// Returns the run's totals on one line.
fn totals_line(report: &RedriveReport) -> String {
    format!(
        "{}{} selected: {} resolved, {} failed again, {} skipped (ineligible), {} leased by another run, {} not found, {} errors; {} adopted from the DLQ, {} DLQ messages deleted\n",
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
}
