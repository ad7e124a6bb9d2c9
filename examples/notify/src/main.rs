//! The notify worker: sends each item to the notification service at `NOTIFY_URL`, at most
//! once per item id when `WORKER_IDEMPOTENCY_TABLE` is set.

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sqs_keeper::Error> {
    let Ok(url) = std::env::var("NOTIFY_URL") else {
        return Err(sqs_keeper::init_failed("NOTIFY_URL is not set").await);
    };
    let notifier = match notify_example::Notifier::new(&url) {
        Ok(notifier) => notifier,
        Err(e) => return Err(sqs_keeper::init_failed(e).await),
    };
    sqs_keeper::run(notifier).await
}
