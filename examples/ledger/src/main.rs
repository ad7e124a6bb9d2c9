//! The ledger worker: applies the account movements of an SNS FIFO topic, delivered to an
//! SQS FIFO queue (`WORKER_ENVELOPE=sns`), to the DynamoDB table `LEDGER_TABLE`.

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sqs_keeper::Error> {
    let setup = sqs_keeper::Setup::from_env().await?;
    let Ok(table) = std::env::var("LEDGER_TABLE") else {
        return Err(sqs_keeper::init_failed("LEDGER_TABLE is not set").await);
    };
    let client = aws_sdk_dynamodb::Client::new(setup.aws_config().await);
    setup.run(ledger_example::Ledger::new(client, table)).await
}
