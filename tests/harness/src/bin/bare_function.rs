//! The least a function can do with a batch: POST every record's body to the downstream at
//! once (`WORKER_DOWNSTREAM_URL`) and report the records it refused, nothing else. The end
//! to end cost benchmark runs it through the same Runtime API and event source mapping as
//! the worker: what it is billed is the harness's floor, and the worker over it is the
//! worker's own share.
//!
//! Written by hand, with `lambda_runtime` and hyper only, since any framework would add to
//! the floor it measures.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::{json, Value};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// POSTs `body`; whether the downstream accepted it.
async fn accepted(client: &HttpClient, url: &hyper::Uri, body: String) -> bool {
    let Ok(request) = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
    else {
        return false;
    };
    match client.request(request).await {
        Ok(response) => {
            let ok = response.status().is_success();
            // Read the answer whole, so the connection is reused.
            let _ = response.into_body().collect().await;
            ok
        }
        Err(_) => false,
    }
}

/// The batch's refused records as a partial batch response.
async fn handle(client: &HttpClient, url: &hyper::Uri, event: Value) -> Value {
    let records = event["Records"].as_array().cloned().unwrap_or_default();
    let answers = futures::future::join_all(records.iter().map(|record| {
        let body = record["body"].as_str().unwrap_or_default().to_string();
        accepted(client, url, body)
    }))
    .await;
    let failures: Vec<Value> = records
        .iter()
        .zip(answers)
        .filter(|(_, ok)| !ok)
        .map(|(record, _)| json!({"itemIdentifier": record["messageId"]}))
        .collect();
    json!({"batchItemFailures": failures})
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url: hyper::Uri = std::env::var("WORKER_DOWNSTREAM_URL")?.parse()?;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let (client, url) = (&client, &url);
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        Ok::<_, Error>(handle(client, url, event.payload).await)
    }))
    .await
}
