//! The orders worker: stores each order of the queue in the DynamoDB table `ORDERS_TABLE`.
//! Everything else (dead-letter store, retries, idempotency, ...) is the worker's
//! configuration, read by `Setup::from_env` (docs/HANDLERS.md, "Write your own handler").

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sqs_keeper::Error> {
    let setup = sqs_keeper::Setup::from_env().await?;
    let Ok(table) = std::env::var("ORDERS_TABLE") else {
        return Err(sqs_keeper::init_failed("ORDERS_TABLE is not set").await);
    };
    let client = aws_sdk_dynamodb::Client::new(setup.aws_config().await);
    setup.run(orders_example::Orders::new(client, table)).await
}
