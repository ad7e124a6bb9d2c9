//! The orders worker: stores each order of the queue in the DynamoDB table `ORDERS_TABLE`.
//! Everything else (dead-letter store, retries, idempotency, ...) is the worker's
//! configuration, read by `Setup::from_env` (README, "Write your own handler").

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sqs_keeper::Error> {
    let setup = sqs_keeper::Setup::from_env().await?;
    let table = std::env::var("ORDERS_TABLE").map_err(|_| "ORDERS_TABLE is not set")?;
    let client = aws_sdk_dynamodb::Client::new(setup.aws_config().await);
    setup.run(orders_example::Orders::new(client, table)).await
}
