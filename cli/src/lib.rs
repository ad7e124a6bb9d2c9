//! # sqs-keeper-cli
//!
//! The `dlq` command: what operators use when the DLQ-depth alarm fires. Every command
//! works on the same store as the functions (same `DLQ_*` variables), through the same
//! library. One exit-code table for every command ([`EXIT_CODES`]): 0 ok, 1 partial
//! failure (or an AWS call failed), 2 usage or configuration error (declining a
//! confirmation included: nothing was changed), 3 not found.
//!
//! | module | what |
//! | --- | --- |
//! | [`args`] | the command line (clap) with help and examples |
//! | [`commands`] | one module per command, and their shared rendering |
//! | [`session`] | configuration, clients, confirmation prompts, progress bars |

pub mod args;
pub mod commands;
pub mod session;

use std::process::ExitCode;

pub use args::Cli;

/// The exit codes, as `--help` and docs/OPERATIONS.md list them.
pub const EXIT_CODES: &str = "Exit codes: 0 ok, 1 partial failure (some items or an AWS call failed), 2 usage or configuration error (nothing was changed; declining a confirmation included), 3 not found.";

/// How a command failed.
#[derive(Debug)]
pub enum CliError {
    /// Bad input or configuration: exit 2, nothing changed.
    Usage(String),
    /// Something failed while working: exit 1.
    Failed(String),
    /// What the command was asked about does not exist: exit 3.
    NotFound(String),
    /// An AWS call failed: [`run`] says what it means for the options given (a table
    /// that does not exist is a configuration error, exit 2) or reports it (exit 1).
    Aws(Box<sqs_keeper_lambda::ProcessError>),
}

impl From<sqs_keeper_lambda::ProcessError> for CliError {
    fn from(e: sqs_keeper_lambda::ProcessError) -> Self {
        CliError::Aws(Box::new(e))
    }
}

impl CliError {
    /// Returns the message and exit code, with AWS errors explained in terms of the options that
    /// named the resource (`region`: the region the clients used).
    fn explain(self, global: &args::GlobalArgs, region: &str) -> (String, u8) {
        match self {
            CliError::Usage(m) => (m, 2),
            CliError::Failed(m) => (m, 1),
            CliError::NotFound(m) => (m, 3),
            CliError::Aws(e) => match configuration_problem(&e, global, region) {
                Some(problem) => (problem, 2),
                None => (e.to_string(), 1),
            },
        }
    }
}

/// Tells what an AWS error says about the configuration, in words, when it is about it: a table,
/// queue or bucket that does not exist where the options point, or credentials without
/// access.
fn configuration_problem(
    e: &sqs_keeper_lambda::ProcessError,
    global: &args::GlobalArgs,
    region: &str,
) -> Option<String> {
    let named = |value: &Option<String>| value.as_deref().unwrap_or("?").to_string();
    match e.code.as_deref()? {
        "ResourceNotFoundException" => Some(format!(
            "the DynamoDB table {:?} does not exist in region {region} (set by --table / DLQ_TABLE and --region / AWS_REGION)",
            named(&global.table)
        )),
        "QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue" => Some(format!(
            "the DLQ {:?} does not exist in region {region} (set by --queue-url / DLQ_QUEUE_URL)",
            named(&global.queue_url)
        )),
        "NoSuchBucket" => Some(format!(
            "the S3 bucket {:?} does not exist (set by --bucket / DLQ_BUCKET)",
            named(&global.bucket)
        )),
        "AccessDenied" | "AccessDeniedException" | "UnrecognizedClientException"
        | "InvalidClientTokenId" | "ExpiredToken" | "ExpiredTokenException" => Some(format!(
            "the credentials in use may not do this in region {region} ({e}); check the profile (--profile / AWS_PROFILE) and its permissions"
        )),
        _ => None,
    }
}

/// What a successful command reports: all done, or done with some items failing.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// Everything succeeded.
    Ok,
    /// The command ran, but some items failed.
    Partial,
}

/// Runs a parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let global = cli.global.clone();
    match commands::dispatch(cli).await {
        Ok(Completion::Ok) => ExitCode::SUCCESS,
        Ok(Completion::Partial) => ExitCode::from(1),
        Err(e) => {
            let region = session::sdk_config(&global)
                .await
                .region()
                .map_or_else(|| "(none set)".to_string(), ToString::to_string);
            let (message, code) = e.explain(&global, &region);
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}
