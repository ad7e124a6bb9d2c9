//! The local event source mapping on the emulator: batches above SQS's ten per receive are
//! gathered from several receives, as Lambda's poller does within its batching window.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Mutex;
use std::time::Duration;

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use bytes::Bytes;
use sqs_keeper_local::esm::{EventSourceMapping, Invoker};

/// Records how many records each invocation carried; every record succeeds.
#[derive(Default)]
struct Sizes(Mutex<Vec<usize>>);

impl Invoker for Sizes {
    async fn invoke(&self, event: Bytes) -> Result<Vec<String>, String> {
        let event: serde_json::Value = serde_json::from_slice(&event).unwrap();
        let records = event["Records"].as_array().unwrap().len();
        self.0.lock().unwrap().push(records);
        Ok(Vec::new())
    }
}

#[tokio::test]
async fn a_batch_above_ten_is_gathered_from_several_receives() {
    let clients = e2e::clients().await;
    let name = e2e::unique_prefix("gather");
    let url = clients
        .sqs
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    for chunk in 0..3 {
        let entries = (0..10)
            .filter(|i| chunk * 10 + i < 25)
            .map(|i| {
                SendMessageBatchRequestEntry::builder()
                    .id(format!("m{i}"))
                    .message_body(format!("{{\"n\":{}}}", chunk * 10 + i))
                    .build()
                    .unwrap()
            })
            .collect();
        clients
            .sqs
            .send_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries))
            .send()
            .await
            .unwrap();
    }
    let arn = format!("arn:aws:sqs:us-east-1:000000000000:{name}");
    let esm = EventSourceMapping::new(clients.sqs.clone(), &url, &arn, "us-east-1", 25);
    let sizes = Sizes::default();
    let (stats, drained) = esm
        .run_until_drained(&sizes, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(drained, "{stats:?}");
    assert_eq!(stats.deleted, 25, "{stats:?}");
    let sizes = sizes.0.lock().unwrap().clone();
    assert_eq!(sizes.iter().sum::<usize>(), 25, "{sizes:?}");
    assert!(sizes[0] > 10, "the first invocation had {sizes:?} records");
    assert!(sizes.iter().all(|n| *n <= 25), "{sizes:?}");
}
