//! The bill of what a proxy forwarded, counted as AWS bills it: SQS requests by 64 KiB
//! chunk, DynamoDB read and write units as DynamoDB reports them, S3 requests by price tier.
//!
//! Off unless a benchmark turns it on ([`super::FaultProxy::start_metered`]). Then every
//! DynamoDB request that asks for no consumed capacity (no `ReturnConsumedCapacity`, or
//! `NONE`) is sent on asking for it (`TOTAL`), so that the units of a client that never asks
//! (a peer's boto3) are counted as those of one that does. The emulators do not check
//! signatures, so the changed body reaches them as it is.
//!
//! An SQS request is billed by its payload, the messages it sends or receives (bodies and
//! attributes), one request per started 64 KiB chunk. S3 deletes are free.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;

use super::operation::{Operation, Service};

/// The size of one billed SQS request: each 64 KiB chunk of a payload is one request.
pub const SQS_CHUNK_BYTES: usize = 64 * 1024;

/// What the metered requests cost in AWS's billing units.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Bill {
    /// Forwarded requests by operation, keyed `service:Action`.
    pub requests: BTreeMap<String, u64>,
    /// SQS requests as billed: one per 64 KiB chunk of the larger of request and answer.
    pub sqs_requests: u64,
    /// Of those, receives that returned no message (billed too).
    pub sqs_empty_receives: u64,
    /// DynamoDB read request units, as DynamoDB reported them.
    pub dynamodb_read_units: f64,
    /// DynamoDB write request units, as reported; a refused conditional write counts one.
    pub dynamodb_write_units: f64,
    /// S3 requests of the dearer tier: PUT, COPY, POST and LIST.
    pub s3_write_requests: u64,
    /// S3 requests of the cheaper tier: GET, HEAD and the rest.
    pub s3_read_requests: u64,
}

/// A shared, switchable meter.
#[derive(Debug, Clone, Default)]
pub struct Meter {
    state: Arc<Mutex<Option<Bill>>>,
}

impl Meter {
    /// A meter that counts from now on.
    pub fn on() -> Self {
        Meter {
            state: Arc::new(Mutex::new(Some(Bill::default()))),
        }
    }

    /// Whether it counts.
    pub fn is_on(&self) -> bool {
        self.lock().is_some()
    }

    /// The bill so far (empty when off).
    pub fn bill(&self) -> Bill {
        self.lock().clone().unwrap_or_default()
    }

    /// Starts a new bill, when on.
    pub fn reset(&self) {
        if let Some(bill) = self.lock().as_mut() {
            *bill = Bill::default();
        }
    }

    /// `body` as it is sent on: a DynamoDB data request asks for its consumed capacity.
    pub fn request_body(&self, operation: &Operation, body: Bytes) -> Bytes {
        if !self.is_on() || unit_kind(operation).is_none() {
            return body;
        }
        let Ok(Value::Object(mut request)) = serde_json::from_slice::<Value>(&body) else {
            return body;
        };
        if request
            .get("ReturnConsumedCapacity")
            .is_some_and(|asked| asked != "NONE")
        {
            return body;
        }
        request.insert("ReturnConsumedCapacity".into(), "TOTAL".into());
        serde_json::to_vec(&request).map_or(body, Bytes::from)
    }

    /// Adds one forwarded request and its answer to the bill.
    /// `request` is the request body as sent on.
    pub fn record(&self, operation: &Operation, request: &[u8], status: u16, answer: &[u8]) {
        let mut state = self.lock();
        let Some(bill) = state.as_mut() else {
            return;
        };
        *bill.requests.entry(operation.key()).or_default() += 1;
        match operation.service {
            Service::Sqs => {
                bill.sqs_requests += sqs_chunks(sqs_payload_bytes(operation, request, answer));
                if operation.action == "ReceiveMessage" && !contains(answer, b"\"MessageId\"") {
                    bill.sqs_empty_receives += 1;
                }
            }
            Service::DynamoDb => add_units(bill, operation, status, answer),
            Service::S3 if operation.action.starts_with("Delete") => {}
            Service::S3 if s3_write_tier(&operation.action) => bill.s3_write_requests += 1,
            Service::S3 => bill.s3_read_requests += 1,
            Service::Other => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Bill>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Billed SQS requests for a payload of `bytes`: one per started 64 KiB chunk, at least one.
pub fn sqs_chunks(bytes: usize) -> u64 {
    u64::try_from(bytes.div_ceil(SQS_CHUNK_BYTES).max(1)).unwrap_or(u64::MAX)
}

/// The payload of an SQS request, as SQS bills it: the bodies and attribute values of the
/// messages it sends, or of those it receives. Other requests have none.
fn sqs_payload_bytes(operation: &Operation, request: &[u8], answer: &[u8]) -> usize {
    let (body, key) = match operation.action.as_str() {
        "SendMessage" => (request, None),
        "SendMessageBatch" => (request, Some("Entries")),
        "ReceiveMessage" => (answer, Some("Messages")),
        _ => return 0,
    };
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return 0;
    };
    match key {
        None => message_bytes(&value),
        Some(key) => value[key]
            .as_array()
            .map_or(0, |messages| messages.iter().map(message_bytes).sum()),
    }
}

/// A message's body and its attributes' names and values, in bytes.
fn message_bytes(message: &Value) -> usize {
    let body = message["MessageBody"]
        .as_str()
        .or(message["Body"].as_str())
        .map_or(0, str::len);
    let attributes = message["MessageAttributes"].as_object().map_or(0, |all| {
        all.iter()
            .map(|(name, value)| {
                let text = |field: &str| value[field].as_str().map_or(0, str::len);
                name.len() + text("DataType") + text("StringValue") + text("BinaryValue")
            })
            .sum()
    });
    body + attributes
}

/// Whether a DynamoDB operation consumes read or write units; `None` for the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnitKind {
    Read,
    Write,
}

fn unit_kind(operation: &Operation) -> Option<UnitKind> {
    if operation.service != Service::DynamoDb {
        return None;
    }
    match operation.action.as_str() {
        "GetItem" | "BatchGetItem" | "Query" | "Scan" | "TransactGetItems" => Some(UnitKind::Read),
        // PartiQL: counted as writes, which its reads are priced below; none is used here.
        "PutItem"
        | "UpdateItem"
        | "DeleteItem"
        | "BatchWriteItem"
        | "TransactWriteItems"
        | "ExecuteStatement"
        | "BatchExecuteStatement"
        | "ExecuteTransaction" => Some(UnitKind::Write),
        _ => None,
    }
}

/// Adds the units a DynamoDB answer reports. A refused conditional write reports none,
/// though DynamoDB bills it: it counts one unit.
fn add_units(bill: &mut Bill, operation: &Operation, status: u16, answer: &[u8]) {
    let Some(kind) = unit_kind(operation) else {
        return;
    };
    let units = if status == 200 {
        reported_units(answer)
    } else if kind == UnitKind::Write && refused_condition(answer) {
        1.0
    } else {
        0.0
    };
    match kind {
        UnitKind::Read => bill.dynamodb_read_units += units,
        UnitKind::Write => bill.dynamodb_write_units += units,
    }
}

/// The `CapacityUnits` of an answer's `ConsumedCapacity` (one object, or one per table).
fn reported_units(answer: &[u8]) -> f64 {
    let Ok(answer) = serde_json::from_slice::<Value>(answer) else {
        return 0.0;
    };
    let units = |c: &Value| c["CapacityUnits"].as_f64().unwrap_or(0.0);
    match &answer["ConsumedCapacity"] {
        Value::Array(tables) => tables.iter().map(units).sum(),
        one @ Value::Object(_) => units(one),
        _ => 0.0,
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn refused_condition(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    text.contains("ConditionalCheckFailed") || text.contains("TransactionCanceled")
}

/// S3's dearer tier: PUT, COPY, POST and LIST requests.
fn s3_write_tier(action: &str) -> bool {
    action.starts_with("Put")
        || action.starts_with("Copy")
        || action.starts_with("List")
        || action.starts_with("Create")
        || action.starts_with("Complete")
        || action.starts_with("Upload")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sqs_request_is_billed_per_started_64_kib_chunk() {
        assert_eq!(sqs_chunks(0), 1);
        assert_eq!(sqs_chunks(65_536), 1);
        assert_eq!(sqs_chunks(65_537), 2);
        assert_eq!(sqs_chunks(1_048_576), 16);
    }

    #[test]
    fn a_metered_dynamodb_request_asks_for_its_capacity_and_is_billed_what_it_reports() {
        let meter = Meter::on();
        let put = Operation::dynamodb("PutItem");
        let sent = meter.request_body(&put, Bytes::from_static(br#"{"TableName":"t"}"#));
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(sent["ReturnConsumedCapacity"], "TOTAL");
        // One that asks for nothing is made to ask; one that asks already is sent as it is.
        let none = Bytes::from_static(br#"{"TableName":"t","ReturnConsumedCapacity":"NONE"}"#);
        let none: Value = serde_json::from_slice(&meter.request_body(&put, none)).unwrap();
        assert_eq!(none["ReturnConsumedCapacity"], "TOTAL");
        let asks = Bytes::from_static(br#"{"TableName":"t","ReturnConsumedCapacity":"INDEXES"}"#);
        assert_eq!(meter.request_body(&put, asks.clone()), asks);
        meter.record(
            &put,
            b"{}",
            200,
            br#"{"ConsumedCapacity":{"TableName":"t","CapacityUnits":2.0}}"#,
        );
        meter.record(
            &Operation::dynamodb("TransactGetItems"),
            b"{}",
            200,
            br#"{"ConsumedCapacity":[{"CapacityUnits":1.0},{"CapacityUnits":0.5}]}"#,
        );
        meter.record(
            &Operation::dynamodb("UpdateItem"),
            b"{}",
            400,
            br#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"}"#,
        );
        let bill = meter.bill();
        assert_eq!(bill.dynamodb_write_units, 3.0);
        assert_eq!(bill.dynamodb_read_units, 1.5);
        assert_eq!(bill.requests["dynamodb:PutItem"], 1);
    }

    #[test]
    fn an_unmetered_proxy_changes_nothing_and_counts_nothing() {
        let meter = Meter::default();
        let body = Bytes::from_static(br#"{"TableName":"t"}"#);
        assert_eq!(
            meter.request_body(&Operation::dynamodb("PutItem"), body.clone()),
            body
        );
        meter.record(&Operation::sqs("SendMessage"), b"x", 200, b"y");
        assert_eq!(meter.bill(), Bill::default());
    }

    #[test]
    fn a_receive_that_returned_no_message_is_counted_apart() {
        let meter = Meter::on();
        let receive = Operation::sqs("ReceiveMessage");
        meter.record(&receive, b"{}", 200, b"{}");
        meter.record(&receive, b"{}", 200, br#"{"Messages":[{"MessageId":"m"}]}"#);
        let bill = meter.bill();
        assert_eq!((bill.sqs_requests, bill.sqs_empty_receives), (2, 1));
    }

    #[test]
    fn s3_requests_are_billed_by_tier() {
        let meter = Meter::on();
        for action in [
            "PutObject",
            "GetObject",
            "HeadObject",
            "ListObjectsV2",
            "DeleteObject",
            "DeleteObjects",
        ] {
            meter.record(&Operation::s3(action), b"", 200, b"");
        }
        let bill = meter.bill();
        // Deletes are free.
        assert_eq!((bill.s3_write_requests, bill.s3_read_requests), (2, 2));
    }

    #[test]
    fn an_sqs_request_is_billed_by_the_messages_it_carries_not_its_framing() {
        let meter = Meter::on();
        let receive = Operation::sqs("ReceiveMessage");
        // Ten messages of 6,400 bytes: 64,000 bytes of payload, more with the framing.
        let messages: Vec<Value> = (0..10)
            .map(|i| serde_json::json!({"MessageId": format!("m{i}"), "ReceiptHandle": "r".repeat(400), "MD5OfBody": "0".repeat(32), "Body": "b".repeat(6_400)}))
            .collect();
        let answer = serde_json::to_vec(&serde_json::json!({"Messages": messages})).unwrap();
        assert!(answer.len() > SQS_CHUNK_BYTES);
        meter.record(&receive, b"{}", 200, &answer);
        let send = serde_json::json!({"QueueUrl": "q", "MessageBody": "x".repeat(65_000), "MessageAttributes": {"a": {"DataType": "String", "StringValue": "v".repeat(1_000)}}});
        meter.record(
            &Operation::sqs("SendMessage"),
            &serde_json::to_vec(&send).unwrap(),
            200,
            b"{}",
        );
        let bill = meter.bill();
        assert_eq!(bill.sqs_requests, 1 + 2, "{bill:?}");
    }
}
