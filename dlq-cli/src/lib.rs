//! # dlq-cli
//!
//! The `dlq` command: what operators use when the DLQ-depth alarm fires. Every command
//! works on the same store as the functions (same `DLQ_*` variables), through the same
//! library. Exit codes: 0 ok, 1 partial failure (or an AWS call failed), 2 usage or
//! configuration error.
//!
//! | module | what |
//! | --- | --- |
//! | [`args`] | the command line (clap) with help and examples |
//! | [`commands`] | one module per command, and their shared rendering |
//! | [`context`] | configuration, clients, confirmation prompts, progress bars |

pub mod args;
pub mod commands;
pub mod context;

use std::process::ExitCode;

pub use args::Cli;

/// How a command failed.
#[derive(Debug)]
pub enum CliError {
    /// Bad input or configuration: exit 2, nothing changed.
    Usage(String),
    /// Something failed while working: exit 1.
    Failed(String),
}

impl CliError {
    fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) => ExitCode::from(2),
            CliError::Failed(_) => ExitCode::from(1),
        }
    }
}

impl From<sqs_worker::ProcessError> for CliError {
    fn from(e: sqs_worker::ProcessError) -> Self {
        CliError::Failed(e.to_string())
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
    match commands::dispatch(cli).await {
        Ok(Completion::Ok) => ExitCode::SUCCESS,
        Ok(Completion::Partial) => ExitCode::from(1),
        Err(e) => {
            let (CliError::Usage(m) | CliError::Failed(m)) = &e;
            eprintln!("error: {m}");
            e.exit_code()
        }
    }
}
