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
//! breaker's probe, a forced reprocess, a requeue that the worker then finishes; the
//! handler of `infra/handler.yaml` storing an order and dead-lettering another, under a
//! role that attaches the reusable store's managed policy; and, in a FIFO stack, a
//! scheduled redrive whose sweep moves a kept message behind its group (a copy it sends
//! to the DLQ itself).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use e2e::stack::{role_policies, root, translated_template};
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
    let resources = template["Resources"].as_object().unwrap();
    let of_type = |kind: &str| -> Vec<String> {
        resources
            .iter()
            .filter(|(_, r)| r["Type"] == kind)
            .map(|(name, _)| name.clone())
            .collect()
    };
    let functions = of_type("AWS::Lambda::Function");
    let roles = of_type("AWS::IAM::Role");
    let deployment = e2e::stack::deploy(moto, "iam", template, parameters).await;
    let (shared, physical) = (deployment.shared, deployment.physical);
    let iam = aws_sdk_iam::Client::new(&shared);
    let mut policies = HashMap::new();
    for role in roles {
        let documents = role_policies(&iam, &physical[&role]).await;
        assert!(
            !documents.is_empty(),
            "role {role} has no policy of its own"
        );
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

/// The main stack deployed, with what runs its functions: the worker behind its local
/// event source mapping, the redrive function, and the proxies that audit their calls.
struct MainStack {
    deployed: Deployed,
    clients: AwsClients,
    proxy: FaultProxy,
    lambda_proxy: FaultProxy,
    downstream: Downstream,
    esm: EventSourceMapping,
    worker: SharedRuntimeApiInvoker,
    redrive: RuntimeApi,
    secret_arn: String,
    producer_bucket: String,
    /// What must outlive the scenario: the function processes and the Lambda API.
    _running: (FunctionProcess, FunctionProcess, LambdaApi),
}

impl MainStack {
    fn physical(&self, logical: &str) -> &str {
        &self.deployed.physical[logical]
    }

    /// The name of the queue (or table) `logical`'s physical id ends with.
    fn name_of(&self, logical: &str) -> &str {
        self.physical(logical)
            .rsplit('/')
            .next()
            .unwrap_or_default()
    }

    fn redrive_env(&self, name: &str) -> &str {
        &self.deployed.environments["RedriveFunction"][name]
    }

    fn breaker(&self) -> sqs_keeper_aws::DynamoBreakerStore {
        sqs_keeper_aws::DynamoBreakerStore::new(
            self.clients.dynamodb.clone(),
            self.physical("BreakerTable").to_string(),
            self.deployed.environments["WorkerFunction"]["WORKER_BREAKER_KEY"].clone(),
        )
    }

    async fn send(&self, queue_url: &str, body: String) {
        self.clients
            .sqs
            .send_message()
            .queue_url(queue_url)
            .message_body(body)
            .send()
            .await
            .unwrap();
    }

    async fn put(&self, bucket: &str, key: &str, body: String) {
        self.clients
            .s3
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(body.into_bytes().into())
            .send()
            .await
            .unwrap();
    }
}

/// Deploys `infra/template.yaml` with every optional path on (the downstream's secret,
/// idempotency, the breaker, spaced retries, a producer's payload bucket), with its tables
/// in DynamoDB Local. The stack, the secret's ARN and the producer's bucket.
async fn deploy_main_stack(clients: &AwsClients, moto: &Endpoints) -> (Deployed, String, String) {
    let moto_clients = AwsClients::for_endpoints(moto, e2e::REGION).await;
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
    clients
        .s3
        .create_bucket()
        .bucket(&producer_bucket)
        .send()
        .await
        .unwrap();
    let deployed = deploy(
        moto,
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
    create_tables(
        clients,
        &deployed.physical["DeadLetterTable"],
        &[
            (&deployed.physical["BreakerTable"], "id"),
            (&deployed.physical["IdempotencyTable"], "id"),
        ],
    )
    .await;
    (deployed, secret_arn, producer_bucket)
}

/// [`deploy_main_stack`], then its worker and redrive function started as their roles.
async fn start_main_stack(emulator: &Endpoints, moto: &Endpoints) -> MainStack {
    let clients = AwsClients::for_endpoints(emulator, e2e::REGION).await;
    let (deployed, secret_arn, producer_bucket) = deploy_main_stack(&clients, moto).await;
    let source_url = deployed.physical["SourceQueue"].clone();
    let proxy = FaultProxy::start(emulator).await.unwrap();
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .unwrap();
    let local_downstream = [("WORKER_DOWNSTREAM_URL", downstream.url())];
    let (worker_api, worker_process) = start_function(
        "worker",
        "WorkerRole",
        &deployed.environments["WorkerFunction"],
        &local_downstream,
        &proxy,
    )
    .await;
    let esm = EventSourceMapping::new(
        aws_sdk_sqs::Client::new(&config_as("WorkerRole", &proxy).await),
        &source_url,
        &queue_arn_of(&source_url),
        e2e::REGION,
        10,
    );
    let worker_api = std::sync::Arc::new(worker_api);
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
    let redrive_overrides = [
        local_downstream[0].clone(),
        ("AWS_ENDPOINT_URL_LAMBDA", lambda_proxy.url()),
    ];
    let (redrive, redrive_process) = start_function(
        "redrive",
        "RedriveRole",
        redrive_env,
        &redrive_overrides,
        &proxy,
    )
    .await;
    MainStack {
        deployed,
        clients,
        proxy,
        lambda_proxy,
        downstream,
        esm,
        worker: SharedRuntimeApiInvoker {
            api: worker_api,
            timeout: Duration::from_secs(40),
        },
        redrive,
        secret_arn,
        producer_bucket,
        _running: (worker_process, redrive_process, lambda_api),
    }
}

/// The worker's paths: a success, a dead letter, a payload large enough for S3, an
/// Extended Client pointer into the store's bucket, and a throttled downstream (spaced
/// retries, the breaker).
async fn run_the_worker(stack: &MainStack) {
    let bucket = stack.physical("PayloadBucket").to_string();
    stack
        .put(&bucket, "in/pointed", e2e::body("pointed", "ok"))
        .await;
    let pointer = json!(["software.amazon.payloadoffloading.PayloadS3Pointer",
        {"s3BucketName": bucket, "s3Key": "in/pointed"}])
    .to_string();
    let large = json!({"id": "large", "scenario": "invalid", "pad": "x".repeat(2048)}).to_string();
    let source_url = stack.physical("SourceQueue").to_string();
    for body in [
        e2e::body("ok", "ok"),
        e2e::body("invalid", "invalid"),
        large,
        pointer,
        e2e::body("down", "throttled"),
    ] {
        stack.send(&source_url, body).await;
    }
    let (stats, drained) = stack
        .esm
        .run_until_drained(&stack.worker, Duration::from_secs(90))
        .await
        .unwrap();
    assert!(drained, "the worker did not drain its queue: {stats:?}");
}

/// Opens the breaker as the worker's sandboxes do after an outage, and waits out its open
/// period: no worker invocation is left to probe, so the schedule must.
async fn leave_the_breaker_half_open(stack: &MainStack) {
    use sqs_keeper_core::breaker::BreakerStore;
    let breaker = stack.breaker();
    let now = std::time::SystemTime::now();
    // Refused when the worker left it open already (for up to 16 open periods).
    breaker
        .open(now + Duration::from_secs(1), 1, now)
        .await
        .unwrap();
    let waited = std::time::Instant::now();
    loop {
        let state = breaker.read().await.unwrap();
        if state.is_half_open(std::time::SystemTime::now()) {
            return;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the breaker never became half-open: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The redrive function's paths: a scheduled run that is the breaker's probe and adopts
/// an orphan pointing at a producer's payload, a requeue the worker then finishes, and a
/// forced reprocess of what is left. Their reports, for the log.
async fn run_the_redrives(stack: &MainStack) -> [Value; 3] {
    leave_the_breaker_half_open(stack).await;
    // An orphan in the DLQ (moved by the redrive policy, no record) whose body points at
    // a producer's payload: the scheduled run's sweep adopts it by reading the payload.
    stack
        .put(&stack.producer_bucket, "orphan", e2e::body("orphan", "ok"))
        .await;
    let orphan = json!(["software.amazon.payloadoffloading.PayloadS3Pointer",
        {"s3BucketName": stack.producer_bucket, "s3Key": "orphan"}]);
    stack
        .send(stack.physical("DeadLetterQueue"), orphan.to_string())
        .await;
    let schedule = invoke(
        &stack.redrive,
        json!({"mode": "reprocess", "max_items": 1000, "parallelism": 4}),
    )
    .await;
    stack.downstream.fix();
    let requeue = invoke(
        &stack.redrive,
        json!({"mode": "requeue", "force": true, "item_ids": ["invalid"]}),
    )
    .await;
    stack
        .esm
        .run_until_drained(&stack.worker, Duration::from_secs(60))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let forced = invoke(&stack.redrive, json!({"mode": "reprocess", "force": true})).await;
    [schedule, requeue, forced]
}

/// A long outage: the breaker opened a second time in a row; the polling control disables
/// the worker's mapping, then probes with a source message once the open period is over
/// (the worker, invoked directly, closes the breaker) and enables it again.
async fn pause_and_resume_polling(stack: &MainStack) {
    use sqs_keeper_core::breaker::BreakerStore;
    let breaker = stack.breaker();
    breaker.close().await.unwrap();
    let now = std::time::SystemTime::now();
    assert!(breaker
        .open(now + Duration::from_secs(2), 2, now)
        .await
        .unwrap());
    let paused = invoke(&stack.redrive, json!({"control": "polling"})).await;
    assert_eq!(paused["polling"], "paused", "{paused}");
    assert!(!stack.esm.state().enabled());
    let source_url = stack.physical("SourceQueue");
    stack.send(source_url, e2e::body("probe", "ok")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let resumed = invoke(&stack.redrive, json!({"control": "polling"})).await;
    assert_eq!(resumed["polling"], "resumed", "{resumed}");
    assert_eq!(resumed["probe"], "processed", "{resumed}");
    assert!(stack.esm.state().enabled());
    assert_eq!(e2e_depth(&stack.clients, source_url).await, 0);
}

/// The handler of `infra/handler.yaml`, in a stack of its own: it stores one order and
/// dead-letters another. Its deployed stack.
async fn run_the_handler_stack(
    moto: &Endpoints,
    clients: &AwsClients,
    proxy: &FaultProxy,
) -> Deployed {
    let handler = deploy(
        moto,
        translated_template("handler"),
        &[
            ("AlarmTopicArn", "arn:aws:sns:us-east-1:123456789012:alarms"),
            ("EnableIdempotency", "true"),
        ],
    )
    .await;
    let mut others = vec![(handler.physical["Orders"].as_str(), "order_id")];
    if let Some(t) = handler.physical.get("IdempotencyTable") {
        others.push((t.as_str(), "id"));
    }
    create_tables(clients, &handler.physical["DeadLetterTable"], &others).await;
    let source = handler.physical["SourceQueue"].clone();
    let (api, _process) = start_function(
        "orders-worker",
        "HandlerRole",
        &handler.environments["Handler"],
        &[],
        proxy,
    )
    .await;
    for body in [
        json!({"order_id": "o-1", "customer": "c", "lines": [{"sku": "tea", "qty": 1, "unit_price_cents": 250}]}),
        json!({"order_id": "o-2", "customer": "c", "lines": "not a list"}),
    ] {
        clients
            .sqs
            .send_message()
            .queue_url(&source)
            .message_body(body.to_string())
            .send()
            .await
            .unwrap();
    }
    let esm = EventSourceMapping::new(
        aws_sdk_sqs::Client::new(&config_as("HandlerRole", proxy).await),
        &source,
        &queue_arn_of(&source),
        e2e::REGION,
        10,
    );
    let invoker = RuntimeApiInvoker {
        api,
        timeout: Duration::from_secs(40),
    };
    let (stats, drained) = esm
        .run_until_drained(&invoker, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(drained, "the handler did not drain its queue: {stats:?}");
    handler
}

/// The calls the scenario exists to check, as (role, action, the resource's ARN's end):
/// each must have been made, else the test would pass without checking it.
fn calls_the_scenario_covers(
    main: &MainStack,
    handler: &Deployed,
) -> Vec<(&'static str, &'static str, String)> {
    let source = main.name_of("SourceQueue").to_string();
    let dlq = main.name_of("DeadLetterQueue").to_string();
    let breaker = format!("table/{}", main.physical("BreakerTable"));
    let mapping = main.redrive_env("REDRIVE_WORKER_MAPPING");
    let function = main.redrive_env("REDRIVE_WORKER_FUNCTION");
    let handler_dlq = handler.physical["DeadLetterQueue"]
        .rsplit('/')
        .next()
        .unwrap_or_default();
    vec![
        ("WorkerRole", "sqs:ChangeMessageVisibility", source.clone()),
        ("WorkerRole", "dynamodb:UpdateItem", breaker.clone()),
        (
            "WorkerRole",
            "dynamodb:UpdateItem",
            format!("table/{}", main.physical("DeadLetterTable")),
        ),
        ("WorkerRole", "sqs:SendMessage", dlq.clone()),
        ("WorkerRole", "s3:PutObject", String::new()),
        ("WorkerRole", "s3:GetObject", "in/pointed".to_string()),
        (
            "WorkerRole",
            "secretsmanager:GetSecretValue",
            main.secret_arn.clone(),
        ),
        ("RedriveRole", "dynamodb:UpdateItem", breaker),
        (
            "RedriveRole",
            "s3:GetObject",
            format!("{}/orphan", main.producer_bucket),
        ),
        ("RedriveRole", "sqs:SendMessage", source.clone()),
        (
            "RedriveRole",
            "lambda:UpdateEventSourceMapping",
            format!("event-source-mapping:{mapping}"),
        ),
        (
            "RedriveRole",
            "lambda:InvokeFunction",
            format!("function:{function}"),
        ),
        ("RedriveRole", "sqs:ReceiveMessage", source.clone()),
        ("RedriveRole", "sqs:DeleteMessage", source.clone()),
        ("RedriveRole", "sqs:GetQueueAttributes", source),
        ("RedriveRole", "sqs:ReceiveMessage", dlq),
        (
            "HandlerRole",
            "dynamodb:PutItem",
            format!("table/{}", handler.physical["Orders"]),
        ),
        ("HandlerRole", "sqs:SendMessage", handler_dlq.to_string()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_each_function_is_allowed_by_its_role() {
    let emulator = e2e::emulator().await;
    let moto = Endpoints::single(&emulator.shared);
    let main = start_main_stack(&emulator, &moto).await;
    run_the_worker(&main).await;
    let [schedule, requeue, forced] = run_the_redrives(&main).await;
    pause_and_resume_polling(&main).await;
    let handler = run_the_handler_stack(&moto, &main.clients, &main.proxy).await;

    let mut accesses = main.proxy.accesses();
    accesses.extend(main.lambda_proxy.accesses());
    let by_role: BTreeMap<&str, BTreeSet<String>> = [
        ("WorkerRole", &main.deployed.policies["WorkerRole"]),
        ("RedriveRole", &main.deployed.policies["RedriveRole"]),
        ("HandlerRole", &handler.policies["HandlerRole"]),
    ]
    .into_iter()
    .map(|(role, policies)| (role, assert_allowed(role, policies, &accesses)))
    .collect();
    println!(
        "actions by role: {by_role:#?}\nschedule: {schedule}\nrequeue: {requeue}\nforced: {forced}"
    );
    for (role, action, resource) in calls_the_scenario_covers(&main, &handler) {
        let made = accesses.iter().any(|a| {
            a.principal == role && a.action == action && a.arn(ACCOUNT).ends_with(&resource)
        });
        assert!(
            made,
            "{role} never made {action} on …{resource}; the scenario no longer covers it"
        );
    }
}

async fn e2e_depth(clients: &AwsClients, queue_url: &str) -> u64 {
    sqs_keeper_local::esm::queue_depth(&clients.sqs, queue_url)
        .await
        .unwrap()
}

/// The main stack with FIFO queues: a scheduled redrive adopts an orphan from the DLQ,
/// fails to reprocess it (the downstream refuses it), and its sweep moves the message it
/// keeps behind its group by sending a copy to the DLQ, a call only a FIFO DLQ makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_stacks_redrive_rotation_is_allowed_by_its_role() {
    let emulator = e2e::emulator().await;
    let moto = Endpoints::single(&emulator.shared);
    let clients = AwsClients::for_endpoints(&emulator, e2e::REGION).await;
    let deployed = deploy(
        &moto,
        translated_template("main"),
        &[
            ("DownstreamUrl", "https://downstream.example.com/ingest"),
            ("FifoQueues", "true"),
            ("ItemIdSource", "pointer:/id"),
        ],
    )
    .await;
    create_tables(&clients, &deployed.physical["DeadLetterTable"], &[]).await;
    let dlq = deployed.physical["DeadLetterQueue"].clone();
    assert!(dlq.ends_with(".fifo"), "{dlq}");
    // An orphan: a message SQS's redrive policy moved, with no record.
    clients
        .sqs
        .send_message()
        .queue_url(&dlq)
        .message_body(e2e::body("fifo-orphan", "invalid"))
        .message_group_id("g")
        .message_deduplication_id("fifo-orphan")
        .send()
        .await
        .unwrap();
    let proxy = FaultProxy::start(&emulator).await.unwrap();
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .unwrap();
    let (redrive, _process) = start_function(
        "redrive",
        "RedriveRole",
        &deployed.environments["RedriveFunction"],
        &[("WORKER_DOWNSTREAM_URL", downstream.url())],
        &proxy,
    )
    .await;
    let report = invoke(&redrive, json!({"mode": "reprocess", "max_items": 10})).await;
    assert_eq!(report["adopted_from_dlq"], 1, "{report}");
    let accesses = proxy.accesses();
    let actions = assert_allowed("RedriveRole", &deployed.policies["RedriveRole"], &accesses);
    let dlq_name = dlq.rsplit('/').next().unwrap_or_default();
    let rotated = accesses.iter().any(|a| {
        a.principal == "RedriveRole"
            && a.action == "sqs:SendMessage"
            && a.arn(ACCOUNT).ends_with(dlq_name)
    });
    assert!(
        rotated,
        "the sweep sent no copy to the FIFO DLQ: {actions:?}\n{report}"
    );
}
