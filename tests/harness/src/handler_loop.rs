//! A handler author's local loop, on the emulators:
//!
//! - [`create_store`] (`keeper store`): a handler's dead-letter store (the table with its
//!   indexes and TTL, the DLQ, the payload bucket) and its source queue (with the redrive
//!   policy to that DLQ), shaped as the templates shape them, and the variables that point a
//!   handler and `dlq` at them, printed as `NAME=value` lines.
//! - [`run`] (`keeper run --worker <bin>`): the author's own compiled handler served through
//!   the Lambda Runtime API and fed by the local event source mapping from a queue, as
//!   Lambda would run it, with the handler's log lines on this terminal (stderr).
//! - [`send`] (`keeper send`): messages onto that queue, refused before anything is sent
//!   when SQS would refuse them (its character set, its size limit).

use std::path::PathBuf;
use std::time::Duration;

use sqs_keeper_aws::{AwsClients, Endpoints};

use crate::demo::emulator_env;
use crate::esm::{EsmStats, EventSourceMapping};
use crate::function::FunctionProcess;
use crate::invokers::RuntimeApiInvoker;
use crate::resources::{PipelineResources, ResourceSpec};
use crate::runtime_api::RuntimeApi;

/// What `keeper store` creates.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// The emulators.
    pub endpoints: Endpoints,
    /// The region the resources are in.
    pub region: String,
    /// What every name starts with (`<prefix>-source`, `-dlq`, `-dead-letters`, `-payloads`).
    pub prefix: String,
    /// FIFO queues (both).
    pub fifo: bool,
    /// The source queue's `maxReceiveCount`.
    pub max_receive_count: u32,
    /// The source queue's visibility timeout.
    pub visibility_timeout_secs: u32,
    /// Delete what exists under these names first (its data goes with it).
    pub replace: bool,
}

/// Creates the store and the source queue, and returns the variables for them: the
/// emulators' endpoints and test credentials, `DLQ_*`, `WORKER_MAX_RECEIVE_COUNT` and
/// `SOURCE_QUEUE_URL`.
pub async fn create_store(options: &StoreOptions) -> Result<Vec<(String, String)>, String> {
    if options.prefix.is_empty()
        || !options
            .prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(format!(
            "--prefix {:?}: use lower-case letters, digits and dashes (it names a bucket)",
            options.prefix
        ));
    }
    let clients = AwsClients::for_endpoints(&options.endpoints, &options.region).await;
    let spec = ResourceSpec {
        prefix: options.prefix.clone(),
        fifo: options.fifo,
        max_receive_count: options.max_receive_count,
        visibility_timeout_secs: options.visibility_timeout_secs,
    };
    if options.replace {
        PipelineResources::delete_existing(&clients, &spec).await;
    }
    let resources = PipelineResources::create(&clients, &spec)
        .await
        .map_err(|e| {
            format!("{e}\n(a store named {:?} may exist already: pass --replace to delete it and create it again)", options.prefix)
        })?;
    let mut env = emulator_env(&options.endpoints, &options.region);
    env.extend(resources.store_env());
    env.push(("SOURCE_QUEUE_URL".to_string(), resources.source_url));
    Ok(env)
}

/// What `keeper run` runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The emulators.
    pub endpoints: Endpoints,
    /// The region.
    pub region: String,
    /// The handler's compiled binary.
    pub worker: PathBuf,
    /// The queue it is fed from.
    pub queue_url: String,
    /// Records per invocation (1–10,000).
    pub batch_size: i32,
    /// Each invocation's time (sent as its deadline).
    pub timeout: Duration,
    /// The longest the run polls; it ends sooner once the queue is empty (nothing visible,
    /// nothing in flight).
    pub max: Duration,
    /// The function's name (`AWS_LAMBDA_FUNCTION_NAME`).
    pub function_name: String,
    /// How long a run that finds the queue empty waits for a first message.
    pub wait: Duration,
}

/// Runs the handler until the queue is empty or `max` passes; the totals, and whether the
/// queue was emptied.
pub async fn run(options: &RunOptions) -> Result<(EsmStats, bool), String> {
    if !options.worker.is_file() {
        return Err(format!(
            "{} is not a file: build your handler (cargo build) and pass its binary to --worker",
            options.worker.display()
        ));
    }
    let clients = AwsClients::for_endpoints(&options.endpoints, &options.region).await;
    let queue_arn = crate::resources::queue_arn(&clients, &options.queue_url)
        .await
        .map_err(|e| format!("{e} (is {} a queue on the emulator?)", options.queue_url))?;
    let api = RuntimeApi::start(&format!(
        "arn:aws:lambda:{}:000000000000:function:{}",
        options.region, options.function_name
    ))
    .await
    .map_err(|e| format!("cannot start the runtime API: {e}"))?;
    // The caller's environment (the handler's own variables, `DLQ_*`) goes through; the
    // emulators' endpoints and test credentials are set over it, so that nothing it does
    // leaves this machine.
    let mut env = emulator_env(&options.endpoints, &options.region);
    env.extend(every_record_logged());
    let mut process = FunctionProcess::spawn_to_terminal(
        &options.worker,
        &options.function_name,
        &api.address(),
        &env,
    )
    .map_err(|e| format!("cannot start {}: {e}", options.worker.display()))?;
    let mapping = EventSourceMapping::new(
        clients.sqs.clone(),
        &options.queue_url,
        &queue_arn,
        &options.region,
        options.batch_size,
    );
    let invoker = RuntimeApiInvoker {
        api,
        timeout: options.timeout,
    };
    // The wait counts in `max`: a run never outlasts it.
    let drive = async {
        let start = std::time::Instant::now();
        wait_for_a_message(&mapping, options.wait.min(options.max)).await?;
        let left = options.max.saturating_sub(start.elapsed());
        mapping.run_until_drained(&invoker, left).await
    };
    // A handler that ends (a refused start, a crash) ends the run at once, not after the
    // invocation it leaves unanswered times out.
    let result = tokio::select! {
        result = drive => result,
        status = exit_of(&mut process) => Err(format!(
            "{} exited ({status}); its log lines above say why",
            options.worker.display()
        )),
    };
    let _ = process.kill().await;
    result
}

/// Resolves when the process has ended, with how it ended.
async fn exit_of(process: &mut FunctionProcess) -> std::process::ExitStatus {
    loop {
        if let Some(status) = process.exited() {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the queue holds a message or `wait` passes, saying so once on stderr.
async fn wait_for_a_message(mapping: &EventSourceMapping, wait: Duration) -> Result<(), String> {
    let start = std::time::Instant::now();
    let mut said = false;
    while mapping.depth().await? == 0 && start.elapsed() < wait {
        if !said {
            eprintln!(
                "keeper run: the queue is empty; waiting up to {} s for a message (keeper send puts one there)",
                wait.as_secs()
            );
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// What `keeper send` sends.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// The emulators.
    pub endpoints: Endpoints,
    /// The region.
    pub region: String,
    /// The queue (`SOURCE_QUEUE_URL` from `keeper store`).
    pub queue_url: String,
    /// The body of every message.
    pub body: String,
    /// How many copies to send.
    pub count: usize,
    /// The message group of a FIFO queue (ignored for a standard queue).
    pub group_id: String,
}

/// Sends `count` copies of the body, ten per request, and returns how many were sent.
/// Each FIFO copy gets a deduplication id of its own, so that none is dropped as a twin.
pub async fn send(options: &SendOptions) -> Result<usize, String> {
    check_body(&options.body)?;
    let clients = AwsClients::for_endpoints(&options.endpoints, &options.region).await;
    let fifo = options.queue_url.ends_with(".fifo");
    let run = fastrand::u64(..);
    let mut sent = 0;
    while sent < options.count {
        let chunk = copies_per_request(options.body.len()).min(options.count - sent);
        let mut request = clients
            .sqs
            .send_message_batch()
            .queue_url(&options.queue_url);
        for index in sent..sent + chunk {
            let mut entry = aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                .id(index.to_string())
                .message_body(&options.body);
            if fifo {
                entry = entry
                    .message_group_id(&options.group_id)
                    .message_deduplication_id(format!("local-send-{run:016x}-{index}"));
            }
            request = request.entries(entry.build().map_err(|e| e.to_string())?);
        }
        let output = request.send().await.map_err(|e| {
            format!(
                "cannot send to {}: {} (is it a queue on the emulator? keeper store prints SOURCE_QUEUE_URL)",
                options.queue_url,
                sqs_keeper_lambda::ProcessError::from_sdk(&e)
            )
        })?;
        if let Some(failed) = output.failed().first() {
            return Err(format!(
                "{} sent, then SQS refused {}: {} {}",
                sent + output.successful().len(),
                output.failed().len(),
                failed.code(),
                failed.message().unwrap_or_default()
            ));
        }
        sent += chunk;
    }
    Ok(sent)
}

/// Copies of a body of `bytes` one `SendMessageBatch` takes: ten at most, and no more than
/// fit in the 1,048,576 bytes SQS takes per request; one for a body too large to share.
fn copies_per_request(bytes: usize) -> usize {
    use sqs_keeper_core::message::MAX_BATCH_BYTES;
    (MAX_BATCH_BYTES / bytes.max(1)).clamp(1, 10)
}

/// Refuses a body SQS would refuse, with the reason.
pub fn check_body(body: &str) -> Result<(), String> {
    use sqs_keeper_core::message::{sqs_allows, MAX_MESSAGE_BYTES};
    if body.is_empty() {
        return Err("the body is empty: SQS needs at least one character".to_string());
    }
    if body.len() > MAX_MESSAGE_BYTES {
        return Err(format!(
            "the body is larger than SQS takes ({MAX_MESSAGE_BYTES} bytes at most)"
        ));
    }
    if let Some((at, c)) = body.char_indices().find(|(_, c)| !sqs_allows(*c)) {
        return Err(format!(
            "the body holds {c:?} at byte {at}, outside the characters SQS takes (send binary data base64-encoded)"
        ));
    }
    Ok(())
}

/// Locally every record leaves its line (`WORKER_LOG_RECORDS=all`), unless the caller's
/// environment says otherwise: a handler's author wants to see each one, and the lines cost
/// nothing here.
pub fn every_record_logged() -> Option<(String, String)> {
    std::env::var_os("WORKER_LOG_RECORDS")
        .is_none()
        .then(|| ("WORKER_LOG_RECORDS".to_string(), "all".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_sqs_would_refuse_is_refused_with_its_reason() {
        assert!(check_body(r#"{"order_id":"o-1"}"#).is_ok());
        assert!(check_body("tab\tand\nnewline").is_ok());
        assert!(check_body("").unwrap_err().contains("empty"));
        let err = check_body("a\u{1}b").unwrap_err();
        assert!(err.contains("byte 1"), "{err}");
        let err = check_body(&"x".repeat(1_048_577)).unwrap_err();
        assert!(err.contains("larger than SQS takes"), "{err}");
        assert!(check_body(&"x".repeat(1_048_576)).is_ok());
    }

    #[test]
    fn a_request_never_carries_more_than_sqs_takes() {
        assert_eq!(copies_per_request(30), 10);
        assert_eq!(copies_per_request(104_857), 10);
        assert_eq!(copies_per_request(200_000), 5);
        assert_eq!(copies_per_request(1_048_576), 1);
        for bytes in [1, 1000, 104_858, 200_000, 524_289, 1_048_576] {
            assert!(
                copies_per_request(bytes) * bytes <= 1_048_576 || copies_per_request(bytes) == 1
            );
        }
    }
}
