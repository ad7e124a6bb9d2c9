//! The notify worker: sends each item to the notification service at `NOTIFY_URL`, at most
//! once per item id when `WORKER_IDEMPOTENCY_TABLE` is set.

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sqs_keeper::Error> {
    let url = std::env::var("NOTIFY_URL").map_err(|_| "NOTIFY_URL is not set")?;
    sqs_keeper::run(notify_example::Notifier::new(&url)?).await
}
