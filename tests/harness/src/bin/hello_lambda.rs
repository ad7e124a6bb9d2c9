//! The smallest `lambda_runtime` function (echoes its event): the peer the worker's cold
//! start is measured against.

use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    run(service_fn(
        |event: LambdaEvent<serde_json::Value>| async move { Ok::<_, Error>(event.payload) },
    ))
    .await
}
