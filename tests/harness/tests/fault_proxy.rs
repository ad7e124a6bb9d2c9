//! The fault-injecting proxy against the emulator, through the real AWS SDK clients: calls
//! pass through and are counted per operation; injected faults reach the SDK as the typed
//! errors, retry decisions and error classes that real AWS failures produce.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use sqs_keeper_aws::{AwsClients, CallCounter, Endpoints};
use sqs_keeper_core::classify::classify_sdk_error;
use sqs_keeper_lambda::{ErrorClass, ProcessError};
use sqs_keeper_local::fault_proxy::{
    Fault, FaultProxy, Faults, Matcher, Operation, Rule, Service, Trigger,
};
use tokio::sync::OnceCell;

const REGION: &str = "us-east-1";
/// More than the SDK will ever attempt: the operation fails on every attempt.
const EVERY_ATTEMPT: Trigger = Trigger::NextN(1_000);
/// The SDK's standard retry mode makes at most this many attempts per operation.
const SDK_ATTEMPTS: u64 = 3;

static EMULATOR: OnceCell<Endpoints> = OnceCell::const_new();
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The emulators' endpoints (`EMULATOR_URL` and `EMULATOR_DYNAMODB_URL`, else
/// `scripts/emulator.sh start`), as the e2e harness finds them.
async fn emulator() -> Endpoints {
    EMULATOR
        .get_or_init(|| async { sqs_keeper_local::emulator::endpoints_or_start().unwrap() })
        .await
        .clone()
}

/// A resource name unique to this process and call (valid for queues, tables, buckets).
fn unique(name: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    format!("fp-{}-{n}-{name}", std::process::id())
}

async fn start_proxy() -> FaultProxy {
    FaultProxy::start(&emulator().await).await.unwrap()
}

/// Clients talking to the emulator directly, to set up and check state behind the proxy.
async fn direct() -> AwsClients {
    AwsClients::for_endpoints(&emulator().await, REGION).await
}

/// Clients through the proxy with the SDK's defaults (standard retries, 3 attempts).
async fn via(proxy: &FaultProxy) -> AwsClients {
    AwsClients::for_endpoints(&proxy.endpoints(), REGION).await
}

/// Clients through the proxy whose attempts are counted on the SDK side.
async fn counted_via(proxy: &FaultProxy, counter: &CallCounter) -> AwsClients {
    let shared = AwsClients::endpoint_config(&proxy.endpoints(), REGION).await;
    AwsClients::counted(&shared, true, counter)
}

/// Clients through the proxy with one attempt per operation and optional attempt timeout.
async fn single_attempt_via(proxy: &FaultProxy, attempt_timeout: Option<Duration>) -> AwsClients {
    let mut builder = AwsClients::endpoint_config(&proxy.endpoints(), REGION)
        .await
        .to_builder()
        .retry_config(RetryConfig::disabled());
    if let Some(timeout) = attempt_timeout {
        builder = builder.timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(timeout)
                .build(),
        );
    }
    AwsClients::from_config(&builder.build(), true)
}

/// Attempts the SDK made of `operation` (any service), per its own interceptor.
fn sdk_attempts(counter: &CallCounter, operation: &str) -> u64 {
    counter
        .snapshot()
        .iter()
        .filter(|(name, _)| name.ends_with(&format!(".{operation}")))
        .map(|(_, n)| n)
        .sum()
}

async fn create_table(clients: &AwsClients, name: &str) {
    clients
        .dynamodb
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}

async fn get_state(clients: &AwsClients, table: &str, pk: &str) -> Option<String> {
    let item = clients
        .dynamodb
        .get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(pk.to_string()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item;
    item.and_then(|i| i.get("state").and_then(|v| v.as_s().ok().cloned()))
}

async fn queue_depth(clients: &AwsClients, queue_url: &str) -> u64 {
    let attributes = clients
        .sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .unwrap();
    attributes
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn requests_pass_through_and_are_counted_per_operation() {
    let proxy = start_proxy().await;
    assert!(
        proxy.url().starts_with("http://127.0.0.1:"),
        "{}",
        proxy.url()
    );
    let aws = via(&proxy).await;

    // SQS: create, send, receive.
    let queue_url = aws
        .sqs
        .create_queue()
        .queue_name(unique("pass"))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    aws.sqs
        .send_message()
        .queue_url(&queue_url)
        .message_body("hello through the proxy")
        .send()
        .await
        .unwrap();
    let received = aws
        .sqs
        .receive_message()
        .queue_url(&queue_url)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    let bodies: Vec<_> = received
        .messages()
        .iter()
        .filter_map(|m| m.body())
        .collect();
    assert_eq!(bodies, ["hello through the proxy"]);

    // DynamoDB: create a table, put and get an item.
    let table = unique("pass");
    create_table(&aws, &table).await;
    aws.dynamodb
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("item-1".into()))
        .item("state", AttributeValue::S("stored".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        get_state(&aws, &table, "item-1").await.as_deref(),
        Some("stored")
    );

    // S3: create a bucket, put, head, get, list, delete an object.
    let bucket = unique("pass");
    let payload = vec![7u8; 70_000];
    aws.s3.create_bucket().bucket(&bucket).send().await.unwrap();
    aws.s3
        .put_object()
        .bucket(&bucket)
        .key("dir/payload.bin")
        .body(payload.clone().into())
        .send()
        .await
        .unwrap();
    let head = aws
        .s3
        .head_object()
        .bucket(&bucket)
        .key("dir/payload.bin")
        .send()
        .await
        .unwrap();
    // A HEAD response has no body: the object's size must survive the relay as the header.
    assert_eq!(head.content_length(), Some(70_000));
    let got = aws
        .s3
        .get_object()
        .bucket(&bucket)
        .key("dir/payload.bin")
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    assert_eq!(got.as_ref(), payload.as_slice());
    let listed = aws
        .s3
        .list_objects_v2()
        .bucket(&bucket)
        .prefix("dir/")
        .send()
        .await
        .unwrap();
    let keys: Vec<_> = listed.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(keys, ["dir/payload.bin"]);
    aws.s3
        .delete_object()
        .bucket(&bucket)
        .key("dir/payload.bin")
        .send()
        .await
        .unwrap();
    let gone = direct()
        .await
        .s3
        .head_object()
        .bucket(&bucket)
        .key("dir/payload.bin")
        .send()
        .await
        .unwrap_err();
    assert_eq!(classify_sdk_error(&gone), ErrorClass::NotFound);

    let calls = proxy.calls_by_operation();
    for key in [
        "sqs:CreateQueue",
        "sqs:SendMessage",
        "sqs:ReceiveMessage",
        "dynamodb:CreateTable",
        "dynamodb:PutItem",
        "dynamodb:GetItem",
        "s3:CreateBucket",
        "s3:PutObject",
        "s3:HeadObject",
        "s3:GetObject",
        "s3:ListObjectsV2",
        "s3:DeleteObject",
    ] {
        assert_eq!(calls.get(key), Some(&1), "{key} in {calls:?}");
    }
    assert_eq!(calls.len(), 12, "nothing unidentified: {calls:?}");
    assert_eq!(proxy.calls(Service::S3), 6);
    assert_eq!(proxy.calls(Operation::sqs("SendMessage")), 1);
    assert!(proxy.injected().is_empty(), "{:?}", proxy.injected());
}

#[tokio::test]
async fn dynamodb_throttling_is_classified_throttled_and_retried_by_the_sdk() {
    let proxy = start_proxy().await;
    let counter = CallCounter::default();
    let aws = counted_via(&proxy, &counter).await;
    let table = unique("throttle");
    create_table(&direct().await, &table).await;
    let put = |state: &'static str| {
        aws.dynamodb
            .put_item()
            .table_name(&table)
            .item("pk", AttributeValue::S("item-1".into()))
            .item("state", AttributeValue::S(state.into()))
    };
    let update = || {
        aws.dynamodb
            .update_item()
            .table_name(&table)
            .key("pk", AttributeValue::S("item-1".into()))
            .update_expression("SET #s = :s")
            .expression_attribute_names("#s", "state")
            .expression_attribute_values(":s", AttributeValue::S("updated".into()))
    };

    // Two throttled attempts are absorbed by the SDK's retries: the third one passes.
    proxy.inject(Rule::new(
        Operation::dynamodb("PutItem"),
        Fault::Throttling,
        Trigger::NextN(2),
    ));
    put("stored").send().await.unwrap();
    assert_eq!(proxy.injected_for(Operation::dynamodb("PutItem")), 2);
    assert_eq!(proxy.calls(Operation::dynamodb("PutItem")), 3);
    assert_eq!(sdk_attempts(&counter, "PutItem"), 3);

    // Throttled on every attempt: the SDK gives up with the typed throttling error.
    proxy.inject(Rule::new(
        Operation::dynamodb("UpdateItem"),
        Fault::Throttling,
        EVERY_ATTEMPT,
    ));
    let err = update().send().await.unwrap_err();
    assert_eq!(classify_sdk_error(&err), ErrorClass::Throttled, "{err:?}");
    assert!(
        err.as_service_error()
            .is_some_and(|e| e.is_provisioned_throughput_exceeded_exception()),
        "{err:?}"
    );
    let process = ProcessError::from_sdk(&err);
    assert_eq!(
        process.code.as_deref(),
        Some("ProvisionedThroughputExceededException")
    );
    assert_eq!(process.status, Some(400));
    assert_eq!(proxy.injected()["dynamodb:UpdateItem"], SDK_ATTEMPTS);
    assert_eq!(sdk_attempts(&counter, "UpdateItem"), SDK_ATTEMPTS);
    assert_eq!(proxy.calls(Operation::dynamodb("UpdateItem")), SDK_ATTEMPTS);
    // The emulator never saw the update.
    assert_eq!(
        get_state(&direct().await, &table, "item-1")
            .await
            .as_deref(),
        Some("stored")
    );

    // Rules gone, the same call goes through.
    proxy.clear();
    update().send().await.unwrap();
    assert_eq!(
        get_state(&direct().await, &table, "item-1")
            .await
            .as_deref(),
        Some("updated")
    );
    assert_eq!(proxy.injected()["dynamodb:UpdateItem"], SDK_ATTEMPTS);
    assert_eq!(
        proxy.calls(Operation::dynamodb("UpdateItem")),
        SDK_ATTEMPTS + 1
    );
}

#[tokio::test]
async fn sqs_and_s3_throttling_are_classified_throttled() {
    let proxy = start_proxy().await;
    let aws = via(&proxy).await;
    let direct = direct().await;
    let queue_url = direct
        .sqs
        .create_queue()
        .queue_name(unique("throttle"))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let bucket = unique("throttle");
    direct
        .s3
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .unwrap();

    proxy.inject(Rule::new(
        Operation::sqs("SendMessage"),
        Fault::Throttling,
        EVERY_ATTEMPT,
    ));
    let err = aws
        .sqs
        .send_message()
        .queue_url(&queue_url)
        .message_body("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(classify_sdk_error(&err), ErrorClass::Throttled, "{err:?}");
    // The `x-amzn-query-error` code maps to the operation's modelled error.
    assert!(
        err.as_service_error()
            .is_some_and(|e| e.is_request_throttled()),
        "{err:?}"
    );
    assert_eq!(err.code(), Some("RequestThrottled"));
    assert_eq!(proxy.injected()["sqs:SendMessage"], SDK_ATTEMPTS);
    assert_eq!(queue_depth(&direct, &queue_url).await, 0);

    proxy.inject(Rule::new(
        Operation::s3("PutObject"),
        Fault::Throttling,
        EVERY_ATTEMPT,
    ));
    let err = aws
        .s3
        .put_object()
        .bucket(&bucket)
        .key("k")
        .body(b"x".to_vec().into())
        .send()
        .await
        .unwrap_err();
    assert_eq!(classify_sdk_error(&err), ErrorClass::Throttled, "{err:?}");
    assert_eq!(err.code(), Some("SlowDown"));
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(503));
    assert_eq!(proxy.injected()["s3:PutObject"], SDK_ATTEMPTS);
}

#[tokio::test]
async fn server_errors_are_classified_server_error_and_nothing_reaches_the_emulator() {
    let proxy = start_proxy().await;
    let aws = via(&proxy).await;
    let direct = direct().await;
    let queue_url = direct
        .sqs
        .create_queue()
        .queue_name(unique("unavailable"))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let bucket = unique("internal");
    direct
        .s3
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .unwrap();
    let table = unique("internal");
    create_table(&direct, &table).await;

    // SQS SendMessageBatch, 503 on every attempt.
    proxy.inject(Rule::new(
        Operation::sqs("SendMessageBatch"),
        Fault::ServiceUnavailable,
        EVERY_ATTEMPT,
    ));
    let batch = || {
        aws.sqs
            .send_message_batch()
            .queue_url(&queue_url)
            .set_entries(Some(
                (0..2)
                    .map(|i| {
                        SendMessageBatchRequestEntry::builder()
                            .id(format!("m{i}"))
                            .message_body(format!("body {i}"))
                            .build()
                            .unwrap()
                    })
                    .collect(),
            ))
    };
    let err = batch().send().await.unwrap_err();
    assert_eq!(classify_sdk_error(&err), ErrorClass::ServerError, "{err:?}");
    let process = ProcessError::from_sdk(&err);
    assert_eq!(process.code.as_deref(), Some("ServiceUnavailable"));
    assert_eq!(process.status, Some(503));
    assert_eq!(proxy.injected()["sqs:SendMessageBatch"], SDK_ATTEMPTS);
    assert_eq!(queue_depth(&direct, &queue_url).await, 0);
    proxy.clear();
    let sent = batch().send().await.unwrap();
    assert_eq!(sent.successful().len(), 2);
    assert_eq!(queue_depth(&direct, &queue_url).await, 2);

    // S3 PutObject, 500 on every attempt: the object is not created.
    proxy.inject(Rule::new(
        Operation::s3("PutObject"),
        Fault::InternalError,
        EVERY_ATTEMPT,
    ));
    let err = aws
        .s3
        .put_object()
        .bucket(&bucket)
        .key("payload")
        .body(b"payload".to_vec().into())
        .send()
        .await
        .unwrap_err();
    assert_eq!(classify_sdk_error(&err), ErrorClass::ServerError, "{err:?}");
    assert_eq!(err.code(), Some("InternalError"));
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(500));
    assert_eq!(proxy.injected()["s3:PutObject"], SDK_ATTEMPTS);
    let missing = direct
        .s3
        .head_object()
        .bucket(&bucket)
        .key("payload")
        .send()
        .await
        .unwrap_err();
    assert_eq!(classify_sdk_error(&missing), ErrorClass::NotFound);

    // S3 HeadObject, 503: a HEAD answer has no body, so only the status tells.
    proxy.inject(Rule::new(
        Operation::s3("HeadObject"),
        Fault::ServiceUnavailable,
        EVERY_ATTEMPT,
    ));
    let err = aws
        .s3
        .head_object()
        .bucket(&bucket)
        .key("payload")
        .send()
        .await
        .unwrap_err();
    assert_eq!(classify_sdk_error(&err), ErrorClass::ServerError, "{err:?}");
    assert_eq!(proxy.injected()["s3:HeadObject"], SDK_ATTEMPTS);

    // DynamoDB GetItem, 500: the modelled InternalServerError.
    proxy.inject(Rule::new(
        Matcher::any(Service::DynamoDb),
        Fault::InternalError,
        EVERY_ATTEMPT,
    ));
    let err = aws
        .dynamodb
        .get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("x".into()))
        .send()
        .await
        .unwrap_err();
    assert_eq!(classify_sdk_error(&err), ErrorClass::ServerError, "{err:?}");
    assert!(
        err.as_service_error()
            .is_some_and(|e| e.is_internal_server_error()),
        "{err:?}"
    );
    assert_eq!(proxy.injected()["dynamodb:GetItem"], SDK_ATTEMPTS);
}

#[tokio::test]
async fn connection_reset_is_a_connection_error_and_retried() {
    let proxy = start_proxy().await;
    let aws = via(&proxy).await;
    let direct = direct().await;
    let name = unique("reset");
    direct
        .sqs
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .unwrap();
    let bucket = unique("reset");
    direct
        .s3
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .unwrap();
    direct
        .s3
        .put_object()
        .bucket(&bucket)
        .key("k")
        .body(b"kept".to_vec().into())
        .send()
        .await
        .unwrap();

    proxy.inject(Rule::new(
        Operation::sqs("GetQueueUrl"),
        Fault::ConnectionReset,
        EVERY_ATTEMPT,
    ));
    let err = aws
        .sqs
        .get_queue_url()
        .queue_name(&name)
        .send()
        .await
        .unwrap_err();
    match &err {
        SdkError::DispatchFailure(failure) => {
            assert!(failure.is_io(), "{err:?}");
        }
        other => panic!("expected a dispatch failure, got {other:?}"),
    }
    assert_eq!(classify_sdk_error(&err), ErrorClass::Connection, "{err:?}");
    // No response: the error carries neither code nor status.
    assert_eq!(ProcessError::from_sdk(&err).status, None);
    assert_eq!(proxy.injected()["sqs:GetQueueUrl"], SDK_ATTEMPTS);
    assert_eq!(proxy.calls(Operation::sqs("GetQueueUrl")), SDK_ATTEMPTS);

    // One reset, then the SDK's retry on a new connection gets the object.
    proxy.inject(Rule::new(
        Operation::s3("GetObject"),
        Fault::ConnectionReset,
        Trigger::NextN(1),
    ));
    let body = aws
        .s3
        .get_object()
        .bucket(&bucket)
        .key("k")
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    assert_eq!(body.as_ref(), b"kept");
    assert_eq!(proxy.injected()["s3:GetObject"], 1);
    assert_eq!(proxy.calls(Operation::s3("GetObject")), 2);
}

/// What a `Fraction` rule decides for `calls` calls of `operation`, without the network.
fn offline_pattern(rule: &Rule, operation: &Operation, calls: usize) -> Vec<bool> {
    let faults = Faults::new();
    faults.inject(rule.clone());
    (0..calls)
        .map(|_| faults.decide(operation).is_some())
        .collect()
}

#[test]
fn fraction_is_deterministic_per_seed() {
    let op = Operation::sqs("GetQueueUrl");
    let rule = |fraction, seed| {
        Rule::new(
            &op,
            Fault::ServiceUnavailable,
            Trigger::Fraction { fraction, seed },
        )
    };
    let first = offline_pattern(&rule(0.5, 42), &op, 1_000);
    assert_eq!(first, offline_pattern(&rule(0.5, 42), &op, 1_000));
    assert_ne!(first, offline_pattern(&rule(0.5, 43), &op, 1_000));
    let fired = first.iter().filter(|f| **f).count();
    assert!((400..=600).contains(&fired), "{fired} of 1000 at 0.5");
    let quarter = offline_pattern(&rule(0.25, 42), &op, 1_000);
    let fired = quarter.iter().filter(|f| **f).count();
    assert!((170..=330).contains(&fired), "{fired} of 1000 at 0.25");
    assert!(!offline_pattern(&rule(0.0, 1), &op, 100).contains(&true));
    assert!(!offline_pattern(&rule(1.0, 1), &op, 100).contains(&false));
    // Other operations neither fire nor consume draws.
    let faults = Faults::new();
    faults.inject(rule(1.0, 1));
    assert_eq!(faults.decide(&Operation::sqs("SendMessage")), None);
    assert_eq!(faults.injected_for(Service::Sqs), 0);
}

#[tokio::test]
async fn fraction_injects_the_same_seeded_faults_on_every_run() {
    const CALLS: usize = 40;
    let proxy = start_proxy().await;
    // One attempt per call: each SDK call is exactly one draw of the rule.
    let aws = single_attempt_via(&proxy, None).await;
    let name = unique("fraction");
    direct()
        .await
        .sqs
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .unwrap();
    let op = Operation::sqs("GetQueueUrl");
    let rule = Rule::new(
        &op,
        Fault::ServiceUnavailable,
        Trigger::Fraction {
            fraction: 0.5,
            seed: 20_240_917,
        },
    );

    let mut runs = Vec::new();
    for _ in 0..2 {
        proxy.clear();
        proxy.reset_counters();
        proxy.inject(rule.clone());
        let mut failed = Vec::new();
        for _ in 0..CALLS {
            match aws.sqs.get_queue_url().queue_name(&name).send().await {
                Ok(output) => {
                    assert!(output.queue_url().is_some_and(|u| u.ends_with(&name)));
                    failed.push(false);
                }
                Err(err) => {
                    assert_eq!(classify_sdk_error(&err), ErrorClass::ServerError, "{err:?}");
                    failed.push(true);
                }
            }
        }
        let failures = failed.iter().filter(|f| **f).count() as u64;
        assert_eq!(proxy.injected_for(&op), failures);
        assert_eq!(proxy.calls(&op), CALLS as u64);
        assert!((10..=30).contains(&failures), "{failures} of {CALLS}");
        runs.push(failed);
    }
    assert_eq!(runs[0], runs[1], "same seed, same faults");
    assert_eq!(
        runs[0],
        offline_pattern(&rule, &op, CALLS),
        "the proxy decides exactly as the offline rule does"
    );
}

#[tokio::test]
async fn delay_beyond_the_attempt_timeout_is_a_timeout() {
    let proxy = start_proxy().await;
    let table = unique("delay");
    create_table(&direct().await, &table).await;
    let op = Operation::dynamodb("DescribeTable");
    let describe = |aws: &AwsClients| aws.dynamodb.describe_table().table_name(&table).send();

    // One attempt with a 300 ms budget against a 2 s delay: a timeout, long before 2 s.
    let impatient = single_attempt_via(&proxy, Some(Duration::from_millis(300))).await;
    proxy.inject(Rule::new(
        &op,
        Fault::Delay(Duration::from_secs(2)),
        Trigger::NextN(1),
    ));
    let started = Instant::now();
    let err = describe(&impatient).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(err, SdkError::TimeoutError(_)), "{err:?}");
    assert_eq!(classify_sdk_error(&err), ErrorClass::Timeout);
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(1_500),
        "{elapsed:?}"
    );
    assert_eq!(proxy.injected_for(&op), 1);
    // The rule is spent: the next call is answered in time.
    let table_name = describe(&impatient)
        .await
        .unwrap()
        .table
        .and_then(|t| t.table_name);
    assert_eq!(table_name.as_deref(), Some(table.as_str()));

    // With the default retries, the attempt after the timed-out one succeeds.
    let retrying = AwsClients::from_config(
        &AwsClients::endpoint_config(&proxy.endpoints(), REGION)
            .await
            .to_builder()
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_attempt_timeout(Duration::from_millis(300))
                    .build(),
            )
            .build(),
        true,
    );
    proxy.reset_counters();
    proxy.inject(Rule::new(
        &op,
        Fault::Delay(Duration::from_secs(2)),
        Trigger::NextN(1),
    ));
    describe(&retrying).await.unwrap();
    assert_eq!(proxy.injected_for(&op), 1);
    assert_eq!(proxy.calls(&op), 2);

    // A delay within the budget only slows the call down.
    proxy.inject(Rule::new(
        &op,
        Fault::Delay(Duration::from_millis(150)),
        Trigger::NextN(1),
    ));
    let started = Instant::now();
    describe(&impatient).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn the_proxy_stops_when_dropped() {
    let proxy = start_proxy().await;
    let addr = proxy.addr();
    let aws = single_attempt_via(&proxy, None).await;
    aws.sqs.list_queues().send().await.unwrap();
    drop(proxy);
    // Aborting the accept task is asynchronous: give it a moment to close the listener.
    let mut refused = false;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the proxy still accepts connections after drop");
    let err = aws.sqs.list_queues().send().await.unwrap_err();
    assert_eq!(classify_sdk_error(&err), ErrorClass::Connection, "{err:?}");
}
