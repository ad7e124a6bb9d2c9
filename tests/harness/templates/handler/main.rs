//! An SQS-triggered Lambda handler: what one record means. sqs-keeper does the rest
//! (retries, partial batch responses, dead letters with their history).

use sqs_keeper::{handler_fn, Outcome, ProcessError, WorkItem};

#[derive(serde::Deserialize)]
struct Order {
    order_id: String,
    qty: u32,
}

async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError> {
    let order: Order = item.json()?; // does not fit: dead-lettered on first sight
    if order.qty == 0 {
        return Err(ProcessError::validation(format!(
            "order {} has no quantity",
            order.order_id
        )));
    }
    Ok(Outcome::Done)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sqs_keeper::Error> {
    sqs_keeper::run(handler_fn(handle)).await
}
