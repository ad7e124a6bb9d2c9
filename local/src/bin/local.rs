//! `local`: runs the worker pipeline on this machine (see `local --help`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sqs_worker_local::downstream::{Downstream, DownstreamConfig};
use sqs_worker_local::function::{workspace_bin_dir, FunctionProcess};
use sqs_worker_local::runtime_api::{InvocationResult, RuntimeApi};

/// Runs the worker pipeline locally, with no AWS account.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Invokes the compiled worker binary once with an SQS event file, against a local
    /// deterministic downstream, and prints the batch response.
    ///
    /// Example: local invoke --event samples/demo-event.json
    Invoke {
        /// The SQS event (JSON, as Lambda delivers it).
        #[arg(long)]
        event: PathBuf,
        /// Time the invocation may take (sent as its deadline).
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
        /// The worker binary (default: `worker` next to this binary).
        #[arg(long)]
        worker: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Invoke {
            event,
            timeout_secs,
            worker,
        } => invoke(event, Duration::from_secs(timeout_secs), worker).await,
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

async fn invoke(
    event: PathBuf,
    timeout: Duration,
    worker: Option<PathBuf>,
) -> Result<ExitCode, String> {
    let bytes = tokio::fs::read(&event)
        .await
        .map_err(|e| format!("cannot read {}: {e}", event.display()))?;
    serde_json::from_slice::<aws_lambda_events::sqs::SqsEvent>(&bytes)
        .map_err(|e| format!("{} is not an SQS event: {e}", event.display()))?;
    let worker = worker
        .or_else(|| workspace_bin_dir().map(|d| d.join("worker")))
        .ok_or("cannot locate the worker binary; pass --worker")?;
    let downstream = Downstream::start(
        0,
        DownstreamConfig {
            slow_delay: Duration::from_secs(3),
            ..DownstreamConfig::default()
        },
    )
    .await
    .map_err(|e| format!("cannot start the downstream: {e}"))?;
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .map_err(|e| format!("cannot start the runtime API: {e}"))?;
    let env = vec![
        ("WORKER_DOWNSTREAM_URL".to_string(), downstream.url()),
        (
            "WORKER_DOWNSTREAM_TIMEOUT_MS".to_string(),
            "1000".to_string(),
        ),
        (
            "WORKER_ITEM_ID_SOURCE".to_string(),
            "pointer:/id".to_string(),
        ),
        ("WORKER_MAX_RECEIVE_COUNT".to_string(), "3".to_string()),
        ("WORKER_RETRY_BASE_DELAY_MS".to_string(), "50".to_string()),
    ];
    let mut process = FunctionProcess::spawn(&worker, "worker", &api.address(), &env, None)
        .map_err(|e| format!("cannot start {}: {e}", worker.display()))?;
    let result = api.invoke(bytes.into(), timeout).await;
    let _ = process.kill().await;
    match result.map_err(|e| e.to_string())? {
        InvocationResult::Response(body) => {
            println!("{}", String::from_utf8_lossy(&body));
            let mut answers: Vec<_> = downstream.answers().into_iter().collect();
            answers.sort();
            eprintln!("downstream answers by status: {answers:?}");
            Ok(ExitCode::SUCCESS)
        }
        InvocationResult::Error(body) => {
            println!("{}", String::from_utf8_lossy(&body));
            eprintln!("the worker failed the whole invocation");
            Ok(ExitCode::from(1))
        }
    }
}
