//! `dlq`: the operator's command line over the dead-letter store. See `dlq --help`.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = sqs_keeper_cli::Cli::parse();
    sqs_keeper_cli::run(cli).await
}
