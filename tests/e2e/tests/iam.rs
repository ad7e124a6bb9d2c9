//! Every AWS call each deployed function makes is allowed by the role the template gives it.
//!
//! The emulators enforce no IAM, so a missing action passes every other test and fails only
//! once deployed. Here the templates are deployed into the emulator's CloudFormation, which
//! resolves the roles' policies and the functions' environments as AWS would; the packaged
//! functions (under `make test`, the `bootstrap`s cargo-lambda built) then run with exactly
//! that environment through the fault proxy, each signing as its role (the access key id is
//! the role's name), and so does the local event source mapping (Lambda polls with the
//! function's role). The proxy turns every request into the IAM action and resource it
//! needs, and `scripts/iam_evaluate.py` evaluates each against the role's deployed policies
//! with moto's IAM policy evaluator. DynamoDB is served by DynamoDB Local, with the stack's
//! table names; its ARNs are those of the stack's account.
//!
//! The runs go through every path that calls AWS: dead-lettering (record, DLQ message,
//! payload in S3), an Extended Client pointer, the downstream's credential, spaced retries,
//! the circuit breaker opening and probing, idempotency, a scheduled redrive that is the
//! breaker's probe, a forced reprocess, a requeue that the worker then finishes; and the
//! handler of `infra/handler.yaml` storing an order and dead-lettering another.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use e2e::stack::{create_stack, deployable, percent_decoded, root, translated_template, EMPTY_ZIP};
use serde_json::{json, Value};
use sqs_keeper_aws::{AwsClients, Endpoints};
use sqs_keeper_local::downstream::{Downstream, DownstreamConfig};
use sqs_keeper_local::esm::EventSourceMapping;
use sqs_keeper_local::fault_proxy::{Access, FaultProxy};
use sqs_keeper_local::function::FunctionProcess;
use sqs_keeper_local::invokers::{RuntimeApiInvoker, SharedRuntimeApiInvoker};
use sqs_keeper_local::lambda_api::{LambdaApi, LocalFunction};
use sqs_keeper_local::runtime_api::{InvocationResult, RuntimeApi};

/// The account moto's CloudFormation deploys into.
const ACCOUNT: &str = "123456789012";

/// A stack as deployed: its outputs, physical ids, the inline policies of each role and the
/// environment of each function, by logical id.
struct Deployed {
    physical: HashMap<String, String>,
    policies: HashMap<String, Vec<String>>,
    environments: HashMap<String, HashMap<String, String>>,
}

/// Deploys `template` (its event source mappings, alarms, dashboards and rules left out:
/// the emulator would invoke through a mapping and evaluates no alarm).
async fn deploy(moto: &Endpoints, template: Value, parameters: &[(&str, &str)]) -> Deployed {
    let template = deployable(template);
    let resources = template["Resources"].as_object().unwrap();
    let functions: Vec<String> = resources
        .iter()
        .filter(|(_, r)| r["Type"] == "AWS::Lambda::Function")
        .map(|(name, _)| name.clone())
        .collect();
    let roles: Vec<String> = resources
        .iter()
        .filter(|(_, r)| r["Type"] == "AWS::IAM::Role")
        .map(|(name, _)| name.clone())
        .collect();

    let shared = AwsClients::endpoint_config(moto, e2e::REGION).await;
    let clients = AwsClients::for_endpoints(moto, e2e::REGION).await;
    let cloudformation = aws_sdk_cloudformation::Client::new(&shared);
    let artifacts = "sam-artifacts-placeholder";
    let _ = clients.s3.create_bucket().bucket(artifacts).send().await;
    for function in &functions {
        clients
            .s3
            .put_object()
            .bucket(artifacts)
            .key(format!("{function}.zip"))
            .body(EMPTY_ZIP.to_vec().into())
            .send()
            .await
            .unwrap();
    }
    let stack = e2e::unique_prefix("iam");
    create_stack(&cloudformation, &stack, &template, parameters).await;
    let physical: HashMap<String, String> = cloudformation
        .describe_stack_resources()
        .stack_name(&stack)
        .send()
        .await
        .unwrap()
        .stack_resources()
        .iter()
        .map(|r| {
            (
                r.logical_resource_id().unwrap().to_string(),
                r.physical_resource_id().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let iam = aws_sdk_iam::Client::new(&shared);
    let mut policies = HashMap::new();
    for role in roles {
        let name = physical[&role].clone();
        let mut documents = Vec::new();
        for policy in iam
            .list_role_policies()
            .role_name(&name)
            .send()
            .await
            .unwrap()
            .policy_names()
        {
            let output = iam
                .get_role_policy()
                .role_name(&name)
                .policy_name(policy)
                .send()
                .await
                .unwrap();
            documents.push(percent_decoded(output.policy_document()));
        }
        assert!(!documents.is_empty(), "role {role} has no inline policy");
        policies.insert(role, documents);
    }
    let lambda = aws_sdk_lambda::Client::new(&shared);
    let mut environments = HashMap::new();
    for function in functions {
        let configuration = lambda
            .get_function_configuration()
            .function_name(&physical[&function])
            .send()
            .await
            .unwrap();
        let variables = configuration
            .environment()
            .and_then(|e| e.variables())
            .cloned()
            .unwrap_or_default();
        environments.insert(function, variables);
    }
    Deployed {
        physical,
        policies,
        environments,
    }
}

/// The SDK configuration of a function that signs as `role`, through the proxy.
async fn config_as(role: &str, proxy: &FaultProxy) -> aws_config::SdkConfig {
    AwsClients::endpoint_config_as(&proxy.endpoints(), e2e::REGION, role).await
}

/// A function's process as Lambda starts it: the deployed environment (the downstream's
/// URL replaced by the local one), signing as `role` through the proxy.
async fn start_function(
    binary: &str,
    role: &str,
    deployed_env: &HashMap<String, String>,
    overrides: &[(&str, String)],
    proxy: &FaultProxy,
) -> (RuntimeApi, FunctionProcess) {
    let api = RuntimeApi::start(&format!(
        "arn:aws:lambda:us-east-1:{ACCOUNT}:function:{binary}"
    ))
    .await
    .unwrap();
    let mut env: Vec<(String, String)> = deployed_env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.extend(overrides.iter().map(|(k, v)| (k.to_string(), v.clone())));
    env.extend(
        proxy
            .endpoints()
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v)),
    );
    for (k, v) in [
        ("AWS_REGION", e2e::REGION),
        ("AWS_ACCESS_KEY_ID", role),
        ("AWS_SECRET_ACCESS_KEY", "secret"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("S3_FORCE_PATH_STYLE", "true"),
    ] {
        env.push((k.to_string(), v.to_string()));
    }
    let log = std::env::temp_dir().join(format!("iam-{binary}-{}.log", std::process::id()));
    let process = FunctionProcess::spawn(
        &e2e::function_binary(binary),
        binary,
        &api.address(),
        &env,
        Some(&log),
    )
    .unwrap();
    (api, process)
}

/// DynamoDB Local tables with the stack's names: the dead-letter table with its indexes,
/// and tables keyed `key` for the others.
async fn create_tables(clients: &AwsClients, dead_letters: &str, others: &[(&str, &str)]) {
    sqs_keeper_aws::schema::create_table(&clients.dynamodb, dead_letters)
        .await
        .unwrap();
    for (table, key) in others {
        e2e::create_table_named(&clients.dynamodb, table, key).await;
    }
}

/// The verdict on each of `accesses` under `policies` (moto's evaluator).
fn evaluate(policies: &[String], accesses: &[(String, String)]) -> Vec<String> {
    let request = json!({
        "policies": policies,
        "accesses": accesses.iter().map(|(action, resource)| json!({"action": action, "resource": resource})).collect::<Vec<_>>(),
    });
    let mut child = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("scripts/iam_evaluate.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the emulator's virtualenv (.venv) runs the evaluator");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "the policy evaluator failed");
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Every access `role` made, with its verdict under that role's deployed policies; fails
/// listing each one not allowed.
fn assert_allowed(role: &str, policies: &[String], accesses: &[Access]) -> BTreeSet<String> {
    let mine: BTreeSet<(String, String)> = accesses
        .iter()
        .filter(|a| a.principal == role)
        .map(|a| (a.action.clone(), a.arn(ACCOUNT)))
        .collect();
    assert!(!mine.is_empty(), "{role} made no AWS call");
    let mine: Vec<(String, String)> = mine.into_iter().collect();
    let verdicts = evaluate(policies, &mine);
    let refused: Vec<String> = mine
        .iter()
        .zip(&verdicts)
        .filter(|(_, v)| v.as_str() != "allowed")
        .map(|((action, resource), v)| format!("{action} on {resource}: {v}"))
        .collect();
    assert!(
        refused.is_empty(),
        "calls {role} makes that its role does not allow:\n  {}\nits policies: {policies:#?}",
        refused.join("\n  ")
    );
    mine.into_iter().map(|(action, _)| action).collect()
}

async fn invoke(api: &RuntimeApi, request: Value) -> Value {
    let result = api
        .invoke(
            serde_json::to_vec(&request).unwrap().into(),
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    let InvocationResult::Response(body) = result else {
        panic!("the invocation failed: {result:?}");
    };
    serde_json::from_slice(&body).unwrap()
}

fn queue_arn_of(url: &str) -> String {
    let mut parts = url.rsplit('/');
    let name = parts.next().unwrap();
    let account = parts.next().unwrap();
    format!("arn:aws:sqs:{}:{account}:{name}", e2e::REGION)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_each_function_is_allowed_by_its_role() {
    let emulator = e2e::emulator().await;
    let moto = Endpoints::single(&emulator.shared);
    let test_clients = AwsClients::for_endpoints(&emulator, e2e::REGION).await;
    let moto_clients = AwsClients::for_endpoints(&moto, e2e::REGION).await;
    let secret = aws_sdk_secretsmanager::Client::new(&moto_clients.config)
        .create_secret()
        .name(e2e::unique_prefix("downstream-key"))
        .secret_string("k-123")
        .send()
        .await
        .unwrap();
    let secret_arn = secret.arn().unwrap().to_string();
    // A producer's own bucket of Extended-Client payloads (the template's PayloadBuckets).
    let producer_bucket = e2e::unique_prefix("producer").to_lowercase();
    test_clients
        .s3
        .create_bucket()
        .bucket(&producer_bucket)
        .send()
        .await
        .unwrap();
    let deployed = deploy(
        &moto,
        translated_template("main"),
        &[
            ("DownstreamUrl", "https://downstream.example.com/ingest"),
            ("DownstreamAuthHeader", "x-api-key"),
            ("DownstreamAuthSecretArn", &secret_arn),
            ("EnableIdempotency", "true"),
            ("EnableBreaker", "true"),
            ("BreakerThreshold", "1"),
            ("BreakerOpenSeconds", "1"),
            ("RedeliveryBaseSeconds", "1"),
            ("RedeliveryMaxSeconds", "2"),
            ("MaxReceiveCount", "3"),
            ("RetryBaseDelayMs", "10"),
            ("InlineMaxBytes", "1024"),
            ("ItemIdSource", "pointer:/id"),
            ("PayloadBuckets", &producer_bucket),
        ],
    )
    .await;
    let table = &deployed.physical["DeadLetterTable"];
    let breaker_table = &deployed.physical["BreakerTable"];
    let idempotency_table = &deployed.physical["IdempotencyTable"];
    create_tables(
        &test_clients,
        table,
        &[(breaker_table, "id"), (idempotency_table, "id")],
    )
    .await;
    let source_url = deployed.physical["SourceQueue"].clone();
    let bucket = deployed.physical["PayloadBucket"].clone();

    let proxy = FaultProxy::start(&emulator).await.unwrap();
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .unwrap();
    let url = [("WORKER_DOWNSTREAM_URL", downstream.url())];
    let (worker_api, _worker) = start_function(
        "worker",
        "WorkerRole",
        &deployed.environments["WorkerFunction"],
        &url,
        &proxy,
    )
    .await;
    let worker_config = config_as("WorkerRole", &proxy).await;
    let esm = EventSourceMapping::new(
        aws_sdk_sqs::Client::new(&worker_config),
        &source_url,
        &queue_arn_of(&source_url),
        e2e::REGION,
        10,
    );
    let worker_api = std::sync::Arc::new(worker_api);
    let worker = SharedRuntimeApiInvoker {
        api: worker_api.clone(),
        timeout: Duration::from_secs(40),
    };
    // The Lambda API the redrive function's polling control calls (the worker's mapping,
    // the worker itself), behind a proxy of its own that audits those calls.
    let redrive_env = &deployed.environments["RedriveFunction"];
    let lambda_api = LambdaApi::serve(
        vec![LocalFunction {
            name: redrive_env["REDRIVE_WORKER_FUNCTION"].clone(),
            runtime: worker_api.clone(),
            timeout: Duration::from_secs(40),
        }],
        vec![(redrive_env["REDRIVE_WORKER_MAPPING"].clone(), esm.state())],
    )
    .await
    .unwrap();
    let lambda_proxy = FaultProxy::start(&Endpoints::single(&lambda_api.url()))
        .await
        .unwrap();

    // An Extended Client pointer to a payload in the store's bucket.
    test_clients
        .s3
        .put_object()
        .bucket(&bucket)
        .key("in/pointed")
        .body(e2e::body("pointed", "ok").into_bytes().into())
        .send()
        .await
        .unwrap();
    let pointer = json!(["software.amazon.payloadoffloading.PayloadS3Pointer",
        {"s3BucketName": bucket, "s3Key": "in/pointed"}])
    .to_string();
    let large = json!({"id": "large", "scenario": "invalid", "pad": "x".repeat(2048)}).to_string();
    for body in [
        e2e::body("ok", "ok"),
        e2e::body("invalid", "invalid"),
        large,
        pointer,
        e2e::body("down", "throttled"),
    ] {
        test_clients
            .sqs
            .send_message()
            .queue_url(&source_url)
            .message_body(body)
            .send()
            .await
            .unwrap();
    }
    let (stats, drained) = esm
        .run_until_drained(&worker, Duration::from_secs(90))
        .await
        .unwrap();
    assert!(drained, "the worker did not drain its queue: {stats:?}");

    // The scheduled redrive once the breaker's open period is over: it is the probe.
    let redrive_overrides = [
        url[0].clone(),
        ("AWS_ENDPOINT_URL_LAMBDA", lambda_proxy.url()),
    ];
    let (redrive_api, _redrive) = start_function(
        "redrive",
        "RedriveRole",
        &deployed.environments["RedriveFunction"],
        &redrive_overrides,
        &proxy,
    )
    .await;
    // Open the breaker as the worker's sandboxes do after an outage, and let its open
    // period end: no worker invocation is left to probe, so the schedule must.
    {
        use sqs_keeper_core::breaker::BreakerStore;
        let breaker = sqs_keeper_aws::DynamoBreakerStore::new(
            test_clients.dynamodb.clone(),
            breaker_table.clone(),
            deployed.environments["WorkerFunction"]["WORKER_BREAKER_KEY"].clone(),
        );
        let now = std::time::SystemTime::now();
        // Refused when the worker left it open already (for up to 16 open periods).
        breaker
            .open(now + Duration::from_secs(1), 1, now)
            .await
            .unwrap();
        let waited = std::time::Instant::now();
        loop {
            let state = breaker.read().await.unwrap();
            let now = std::time::SystemTime::now();
            if state.is_half_open(now) {
                break;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "the breaker never became half-open: {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // An orphan in the DLQ (moved by the redrive policy, no record) whose body points at
    // a producer's payload: the scheduled run's sweep adopts it by reading the payload.
    test_clients
        .s3
        .put_object()
        .bucket(&producer_bucket)
        .key("orphan")
        .body(e2e::body("orphan", "ok").into_bytes().into())
        .send()
        .await
        .unwrap();
    test_clients
        .sqs
        .send_message()
        .queue_url(&deployed.physical["DeadLetterQueue"])
        .message_body(
            json!(["software.amazon.payloadoffloading.PayloadS3Pointer",
                {"s3BucketName": producer_bucket, "s3Key": "orphan"}])
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let schedule = invoke(
        &redrive_api,
        json!({"mode": "reprocess", "max_items": 1000, "parallelism": 4}),
    )
    .await;
    // A requeue the worker then finishes, and a forced reprocess of what is left.
    downstream.fix();
    let requeue = invoke(
        &redrive_api,
        json!({"mode": "requeue", "force": true, "item_ids": ["invalid"]}),
    )
    .await;
    esm.run_until_drained(&worker, Duration::from_secs(60))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let forced = invoke(&redrive_api, json!({"mode": "reprocess", "force": true})).await;

    // A long outage: the breaker opened a second time in a row; the polling control
    // disables the worker's mapping, then probes with a source message once the open
    // period is over (the worker, invoked directly, closes the breaker) and enables it.
    {
        use sqs_keeper_core::breaker::BreakerStore;
        let breaker = sqs_keeper_aws::DynamoBreakerStore::new(
            test_clients.dynamodb.clone(),
            breaker_table.clone(),
            deployed.environments["WorkerFunction"]["WORKER_BREAKER_KEY"].clone(),
        );
        breaker.close().await.unwrap();
        let now = std::time::SystemTime::now();
        assert!(breaker
            .open(now + Duration::from_secs(2), 2, now)
            .await
            .unwrap());
        let paused = invoke(&redrive_api, json!({"control": "polling"})).await;
        assert_eq!(paused["polling"], "paused", "{paused}");
        assert!(!esm.state().enabled());
        test_clients
            .sqs
            .send_message()
            .queue_url(&source_url)
            .message_body(e2e::body("probe", "ok"))
            .send()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let resumed = invoke(&redrive_api, json!({"control": "polling"})).await;
        assert_eq!(resumed["polling"], "resumed", "{resumed}");
        assert_eq!(resumed["probe"], "processed", "{resumed}");
        assert!(esm.state().enabled());
        assert_eq!(e2e_depth(&test_clients, &source_url).await, 0);
    }

    // The handler of infra/handler.yaml, with its own stack.
    let handler = deploy(
        &moto,
        translated_template("handler"),
        &[
            ("AlarmTopicArn", "arn:aws:sns:us-east-1:123456789012:alarms"),
            ("EnableIdempotency", "true"),
        ],
    )
    .await;
    let mut others = vec![(handler.physical["OrdersTable"].as_str(), "order_id")];
    if let Some(t) = handler.physical.get("IdempotencyTable") {
        others.push((t.as_str(), "id"));
    }
    create_tables(&test_clients, &handler.physical["DeadLetterTable"], &others).await;
    let handler_source = handler.physical["SourceQueue"].clone();
    let (handler_api, _handler) = start_function(
        "orders-worker",
        "HandlerRole",
        &handler.environments["HandlerFunction"],
        &[],
        &proxy,
    )
    .await;
    for body in [
        json!({"order_id": "o-1", "customer": "c", "lines": [{"sku": "tea", "qty": 1, "unit_price_cents": 250}]}),
        json!({"order_id": "o-2", "customer": "c", "lines": "not a list"}),
    ] {
        test_clients
            .sqs
            .send_message()
            .queue_url(&handler_source)
            .message_body(body.to_string())
            .send()
            .await
            .unwrap();
    }
    let handler_esm = EventSourceMapping::new(
        aws_sdk_sqs::Client::new(&config_as("HandlerRole", &proxy).await),
        &handler_source,
        &queue_arn_of(&handler_source),
        e2e::REGION,
        10,
    );
    let (stats, drained) = handler_esm
        .run_until_drained(
            &RuntimeApiInvoker {
                api: handler_api,
                timeout: Duration::from_secs(40),
            },
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(drained, "the handler did not drain its queue: {stats:?}");

    let mut accesses = proxy.accesses();
    accesses.extend(lambda_proxy.accesses());
    let by_role: BTreeMap<&str, BTreeSet<String>> = [
        ("WorkerRole", &deployed.policies["WorkerRole"]),
        ("RedriveRole", &deployed.policies["RedriveRole"]),
        ("HandlerRole", &handler.policies["HandlerRole"]),
    ]
    .into_iter()
    .map(|(role, policies)| (role, assert_allowed(role, policies, &accesses)))
    .collect();
    println!(
        "actions by role: {by_role:#?}\nschedule: {schedule}\nrequeue: {requeue}\nforced: {forced}"
    );

    // The paths this test exists for were taken (else it would pass without checking them).
    let made = |role: &str, action: &str, resource: &str| {
        accesses.iter().any(|a| {
            a.principal == role && a.action == action && a.arn(ACCOUNT).ends_with(resource)
        })
    };
    let breaker_arn = format!("table/{breaker_table}");
    for (role, action, resource) in [
        (
            "WorkerRole",
            "sqs:ChangeMessageVisibility",
            source_url.rsplit('/').next().unwrap(),
        ),
        ("WorkerRole", "dynamodb:UpdateItem", breaker_arn.as_str()),
        (
            "WorkerRole",
            "dynamodb:UpdateItem",
            &format!("table/{table}"),
        ),
        (
            "WorkerRole",
            "sqs:SendMessage",
            deployed.physical["DeadLetterQueue"]
                .rsplit('/')
                .next()
                .unwrap(),
        ),
        ("WorkerRole", "s3:PutObject", ""),
        ("WorkerRole", "s3:GetObject", "in/pointed"),
        ("WorkerRole", "secretsmanager:GetSecretValue", &secret_arn),
        ("RedriveRole", "dynamodb:UpdateItem", breaker_arn.as_str()),
        (
            "RedriveRole",
            "s3:GetObject",
            &format!("{producer_bucket}/orphan"),
        ),
        (
            "RedriveRole",
            "sqs:SendMessage",
            source_url.rsplit('/').next().unwrap(),
        ),
        (
            "RedriveRole",
            "lambda:UpdateEventSourceMapping",
            &format!(
                "event-source-mapping:{}",
                redrive_env["REDRIVE_WORKER_MAPPING"]
            ),
        ),
        (
            "RedriveRole",
            "lambda:InvokeFunction",
            &format!("function:{}", redrive_env["REDRIVE_WORKER_FUNCTION"]),
        ),
        (
            "RedriveRole",
            "sqs:ReceiveMessage",
            source_url.rsplit('/').next().unwrap(),
        ),
        (
            "RedriveRole",
            "sqs:DeleteMessage",
            source_url.rsplit('/').next().unwrap(),
        ),
        (
            "RedriveRole",
            "sqs:GetQueueAttributes",
            source_url.rsplit('/').next().unwrap(),
        ),
        (
            "RedriveRole",
            "sqs:ReceiveMessage",
            deployed.physical["DeadLetterQueue"]
                .rsplit('/')
                .next()
                .unwrap(),
        ),
        (
            "HandlerRole",
            "dynamodb:PutItem",
            &format!("table/{}", handler.physical["OrdersTable"]),
        ),
        (
            "HandlerRole",
            "sqs:SendMessage",
            handler.physical["DeadLetterQueue"]
                .rsplit('/')
                .next()
                .unwrap(),
        ),
    ] {
        assert!(
            made(role, action, resource),
            "{role} never made {action} on …{resource}; the scenario no longer covers it"
        );
    }
}

async fn e2e_depth(clients: &AwsClients, queue_url: &str) -> u64 {
    sqs_keeper_local::esm::queue_depth(&clients.sqs, queue_url)
        .await
        .unwrap()
}
