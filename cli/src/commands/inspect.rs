//! `dlq inspect`: one item's record, its full failure history and where its payload is;
//! or the payload itself, verified against the record's sha256.

use std::io::Write;

use sqs_keeper_aws::DeadLetterStore;
use sqs_keeper_core::dead_letter::{DeadLetteredItem, FailureDetail, PayloadLocation};
use sqs_keeper_core::pointer::S3Pointer;
use sqs_keeper_core::ports::PayloadStore;

use super::render::{out, safe, safe_lines, write_err};
use crate::args::GlobalArgs;
use crate::session::store;
use crate::{CliError, Completion};

/// How `inspect --payload` writes the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadOutput {
    /// Control characters shown as escapes (newlines and tabs kept).
    Escaped,
    /// The exact bytes.
    Raw,
}

/// Returns the record's payload (from S3 if offloaded), refused unless its sha256 matches.
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
            store.fetch(&pointer).await?
        }
    };
    let sha = sqs_keeper_core::hex::sha256_hex(body.as_bytes());
    if sha != record.payload.sha256 {
        return Err(CliError::Failed(format!(
            "payload of {:?} has sha256 {sha} but the record says {}: it was changed or corrupted",
            record.item_id, record.payload.sha256
        )));
    }
    Ok(body)
}

/// Shows one item: the record as text or JSON, or its payload.
pub async fn inspect(
    global: &GlobalArgs,
    item_id: &str,
    payload_output: Option<PayloadOutput>,
    json: bool,
) -> Result<Completion, CliError> {
    let key = super::stored_item_id(item_id)?;
    let store = store(global).await?;
    let record = store.get(&key).await?.ok_or_else(|| {
        CliError::NotFound(format!(
            "no dead-lettered item with id {:?} in table {:?}",
            safe(&sqs_keeper_core::analysis::ellipsize(item_id, 80)),
            global.table.as_deref().unwrap_or("?")
        ))
    })?;
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
    write!(out, "{}", describe(&record)).map_err(write_err)?;
    Ok(Completion::Ok)
}

/// Where a dead item stands and what happens next; other statuses are where they are.
fn standing(r: &DeadLetteredItem) -> String {
    if r.status == sqs_keeper_core::dead_letter::ItemStatus::Dead {
        let triage = r.triage();
        format!("{}: {}", triage.as_str(), triage.next_step())
    } else {
        format!("not dead ({})", r.status.as_str())
    }
}

/// Returns the record as text: fields, attributes, then every attempt kept.
///
/// Every field that comes from the data (ids, messages, attributes, names the sender
/// chose) goes through `safe`/`safe_lines`. It cannot drive the terminal.
fn describe(r: &DeadLetteredItem) -> String {
    let mut text = describe_fields(r);
    text.push_str(&describe_attributes(r));
    text.push_str(&describe_history(r));
    text
}

/// Returns where the payload is kept, inline or in S3, with its size and digest.
fn describe_payload(r: &DeadLetteredItem) -> String {
    match &r.payload.location {
        PayloadLocation::Inline { .. } => format!(
            "inline, {} bytes, sha256 {}",
            r.payload.size_bytes,
            safe(&r.payload.sha256)
        ),
        PayloadLocation::S3 { bucket, key } => format!(
            "s3://{}/{}, {} bytes, sha256 {}",
            safe(bucket),
            safe(key),
            r.payload.size_bytes,
            safe(&r.payload.sha256)
        ),
    }
}

/// Returns the record's fields, one per line.
fn describe_fields(r: &DeadLetteredItem) -> String {
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let when = sqs_keeper_core::time_format::format;
    format!(
        "item id:        {}\nstatus:         {}{}\nreason:         {}\nerror:          {} ({}), signature {}\nlast error:     {}\nfailures:       {} (first {}, last {})\neligible:       {}   manual review: {}\nstands:         {}\npayload:        {}\nsource:         queue {}, message {}, group {}, sent {}, receive count {}\n",
        safe(&r.item_id),
        r.status.as_str(),
        r.resolved_at.map(|t| format!(" at {}", when(&t))).unwrap_or_default(),
        r.reason.as_str(),
        r.error_class,
        r.failure_history.last().and_then(|f| f.http_status).map(|s| format!("HTTP {s}")).unwrap_or_else(|| "no HTTP status".into()),
        safe(&r.error_signature),
        safe_lines(&r.last_error),
        r.failure_count,
        when(&r.first_attempt),
        when(&r.last_attempt),
        yes_no(r.reprocess_eligible),
        yes_no(r.manual_review_required),
        standing(r),
        describe_payload(r),
        safe(r.source.queue_arn.as_deref().unwrap_or("?")),
        safe(&r.source.message_id),
        safe(r.source.message_group_id.as_deref().unwrap_or("-")),
        r.source.sent_timestamp.map(|t| when(&t)).unwrap_or_else(|| "?".into()),
        r.source.receive_count,
    )
}

/// Returns the message attributes kept, sorted, or nothing when there are none.
fn describe_attributes(r: &DeadLetteredItem) -> String {
    if r.source.message_attributes.is_empty() {
        return String::new();
    }
    let mut attrs: Vec<String> = r
        .source
        .message_attributes
        .iter()
        .map(|(k, v)| {
            let value = match (v.string_value(), v.binary_base64()) {
                (Some(text), _) => text.to_string(),
                (None, Some(binary)) => format!("<{} base64 bytes>", binary.len()),
                (None, None) => "<not kept>".to_string(),
            };
            format!("{}={} ({})", safe(k), safe(&value), safe(v.data_type()))
        })
        .collect();
    attrs.sort();
    format!("attributes:     {}\n", attrs.join(", "))
}

/// Returns every attempt kept, marking where a compacted history left attempts out.
fn describe_history(r: &DeadLetteredItem) -> String {
    let mut text = String::from("history:\n");
    // A compacted history keeps the first attempts and the latest ones; say where the gap is.
    let head = sqs_keeper_core::dead_letter::HISTORY_HEAD.min(r.failure_history.len());
    for (n, f) in r.failure_history.iter().enumerate() {
        if r.history_omitted > 0 && n == head {
            text.push_str(&format!(
                "  … {} attempts omitted (the record keeps the first and the latest)\n",
                r.history_omitted
            ));
        }
        text.push_str(&describe_attempt(f));
    }
    text
}

/// Returns one attempt: when, which delivery, the error, where its logs are, its causes.
fn describe_attempt(f: &FailureDetail) -> String {
    let mut text = format!(
        "  {}  delivery {} attempt {}  {}{}  step {}  {} ms  request {}  log {} {}\n      {}\n",
        sqs_keeper_core::time_format::format(&f.timestamp),
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
    );
    for cause in &f.causes {
        text.push_str(&format!("      caused by: {}\n", safe_lines(cause)));
    }
    if let Some(excerpt) = &f.response_excerpt {
        text.push_str(&format!("      response: {}\n", safe_lines(excerpt)));
    }
    text
}
