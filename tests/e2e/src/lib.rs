//! Harness for the end-to-end tests: the emulator, isolated resources per test, the
//! deterministic downstream, and a worker reached through the local event source mapping.
//!
//! The emulators' URLs come from `EMULATOR_URL` and `EMULATOR_DYNAMODB_URL` (set by
//! `make test`); without them the harness starts the emulators itself with
//! `scripts/emulator.sh start`. Each test creates its own
//! uniquely named queues, table and bucket, so tests run in parallel on one emulator.

// A test harness: failing loudly is what it is for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod stack;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sqs_keeper_aws::DeadLetterStore;
use sqs_keeper_aws::{AwsClients, Endpoints};
use sqs_keeper_core::dead_letter::DeadLetteredItem;
use sqs_keeper_http::HttpDelivery;
use sqs_keeper_lambda::config::WorkerConfig;
use sqs_keeper_lambda::http_worker::DefaultWorker;
use sqs_keeper_lambda::runner::Handler;
use sqs_keeper_lambda::worker::ConfiguredSink;
use sqs_keeper_local::downstream::{Downstream, DownstreamConfig};
use sqs_keeper_local::esm::{queue_depth, EventSourceMapping};
use sqs_keeper_local::invokers::InProcessInvoker;
use sqs_keeper_local::resources::{PipelineResources, ResourceSpec};
use tokio::sync::OnceCell;

/// The item ids of a redrive report with the given outcome, sorted.
pub fn outcome_ids(
    report: &sqs_keeper_core::redrive::RedriveReport,
    kind: sqs_keeper_core::redrive::ItemOutcomeKind,
) -> Vec<String> {
    let mut ids: Vec<String> = report
        .items
        .iter()
        .filter(|o| o.outcome == kind)
        .map(|o| o.item_id.clone())
        .collect();
    ids.sort();
    ids
}

/// A JSON body for the downstream: its item id and scenario (`ok`, `throttled`, ...).
pub fn body(id: &str, scenario: &str) -> String {
    serde_json::json!({"id": id, "scenario": scenario}).to_string()
}

/// Region used with the emulator.
pub const REGION: &str = "us-east-1";

static EMULATOR: OnceCell<Endpoints> = OnceCell::const_new();
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The emulators' endpoints, starting them if needed.
pub async fn emulator() -> Endpoints {
    EMULATOR
        .get_or_init(|| async { sqs_keeper_local::emulator::endpoints_or_start().unwrap() })
        .await
        .clone()
}

/// Clients pointed at the emulators.
pub async fn clients() -> AwsClients {
    AwsClients::for_endpoints(&emulator().await, REGION).await
}

/// A name prefix unique to this test process and call.
pub fn unique_prefix(name: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    format!("t{}-{n}-{name}", std::process::id())
}

/// A new on-demand table named after `name` (made unique) whose partition key is the
/// string `key`: a handler's own table.
pub async fn create_table(client: &aws_sdk_dynamodb::Client, name: &str, key: &str) -> String {
    let table = unique_prefix(name);
    create_table_named(client, &table, key).await;
    table
}

/// A new on-demand table named exactly `table` whose partition key is the string `key`
/// (a stack's table, recreated in DynamoDB Local under its physical name).
pub async fn create_table_named(client: &aws_sdk_dynamodb::Client, table: &str, key: &str) {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}

/// A new idempotency table (key `id`, TTL on `expires_at`), as the template creates it.
pub async fn idempotency_table(client: &aws_sdk_dynamodb::Client, name: &str) -> String {
    use aws_sdk_dynamodb::types::TimeToLiveSpecification;
    let table = create_table(client, name, "id").await;
    client
        .update_time_to_live()
        .table_name(&table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name(sqs_keeper_aws::idempotency_table::TTL_ATTRIBUTE)
                .enabled(true)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    table
}

/// Knobs of one pipeline.
#[derive(Debug, Clone)]
pub struct Setup {
    /// FIFO queues.
    pub fifo: bool,
    /// Redrive policy `maxReceiveCount` (also the worker's).
    pub max_receive_count: u32,
    /// Source visibility timeout (short, so redeliveries are quick).
    pub visibility_timeout_secs: u32,
    /// Extra worker variables (override the defaults).
    pub worker_env: Vec<(&'static str, String)>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            fifo: false,
            max_receive_count: 3,
            visibility_timeout_secs: 1,
            worker_env: Vec::new(),
        }
    }
}

/// One isolated pipeline: resources, downstream, worker and poller.
pub struct Pipeline {
    /// Emulator clients.
    pub clients: AwsClients,
    /// The resources.
    pub resources: PipelineResources,
    /// The downstream.
    pub downstream: Downstream,
    /// The poller.
    pub esm: EventSourceMapping,
    /// The worker, in process.
    pub invoker: InProcessInvoker<Handler<HttpDelivery>, ConfiguredSink>,
    /// The worker's variables (store, downstream, `WORKER_*`), sorted by name: what the
    /// in-process worker was configured with, and what a spawned worker binary needs.
    pub worker_env: Vec<(String, String)>,
}

impl Pipeline {
    /// Creates everything for a test called `name`.
    pub async fn new(name: &str, setup: Setup) -> Pipeline {
        Pipeline::build(name, setup, None).await
    }

    /// Like [`Pipeline::new`], but the worker's AWS clients (its dead-letter store and
    /// payload resolver) talk to `worker_endpoints`, e.g. a fault-injecting proxy in front
    /// of the emulators. Resources are created, and the poller and every inspection helper
    /// work, directly against the emulator, so a fault only hits the worker's calls.
    pub async fn with_worker_endpoints(
        name: &str,
        setup: Setup,
        worker_endpoints: &Endpoints,
    ) -> Pipeline {
        let worker_clients = AwsClients::for_endpoints(worker_endpoints, REGION).await;
        Pipeline::build(name, setup, Some(worker_clients)).await
    }

    async fn build(name: &str, setup: Setup, worker_clients: Option<AwsClients>) -> Pipeline {
        // Worker logs go to the test's captured output: shown when a test fails.
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
            .try_init();
        let clients = clients().await;
        let spec = ResourceSpec {
            prefix: unique_prefix(name),
            fifo: setup.fifo,
            max_receive_count: setup.max_receive_count,
            visibility_timeout_secs: setup.visibility_timeout_secs,
        };
        let resources = PipelineResources::create(&clients, &spec).await.unwrap();
        let downstream = Downstream::start(
            0,
            DownstreamConfig {
                flaky_failures: 2,
                slow_delay: Duration::from_secs(2),
            },
        )
        .await
        .unwrap();
        let mut env: HashMap<String, String> = resources.store_env().into_iter().collect();
        for (k, v) in [
            ("WORKER_DOWNSTREAM_URL", downstream.url()),
            ("WORKER_DOWNSTREAM_TIMEOUT_MS", "300".to_string()),
            ("WORKER_ITEM_ID_SOURCE", "pointer:/id".to_string()),
            ("WORKER_RETRY_MAX_ATTEMPTS", "1".to_string()),
            ("WORKER_RETRY_BASE_DELAY_MS", "10".to_string()),
            ("WORKER_DEADLINE_MARGIN_MS", "500".to_string()),
        ] {
            env.insert(k.to_string(), v);
        }
        for (k, v) in setup.worker_env {
            env.insert(k.to_string(), v);
        }
        let config = WorkerConfig::from_lookup(&|k| env.get(k).cloned()).unwrap();
        let worker = DefaultWorker::from_config(
            config,
            Some(worker_clients.unwrap_or_else(|| clients.clone())),
        )
        .await
        .unwrap();
        let mut worker_env: Vec<(String, String)> = env.into_iter().collect();
        worker_env.sort();
        let esm = EventSourceMapping::new(
            clients.sqs.clone(),
            &resources.source_url,
            &resources.source_arn,
            REGION,
            10,
        )
        .release_failed_immediately(setup.fifo);
        Pipeline {
            clients,
            resources,
            downstream,
            esm,
            invoker: InProcessInvoker {
                worker,
                timeout: Duration::from_secs(10),
                margin: Duration::from_millis(500),
            },
            worker_env,
        }
    }

    /// A pipeline whose items all dead-letter on their first delivery (receive budget 1):
    /// each body is sent, the worker runs until the queue is empty, and every item must
    /// have a record. The downstream fails each item according to its `scenario`.
    pub async fn with_dead_items(name: &str, bodies: &[String]) -> Pipeline {
        let p = Pipeline::new(
            name,
            Setup {
                max_receive_count: 1,
                ..Setup::default()
            },
        )
        .await;
        let refs: Vec<&str> = bodies.iter().map(String::as_str).collect();
        p.send(&refs).await;
        p.drain().await;
        assert_eq!(
            p.records().await.len(),
            bodies.len(),
            "every item dead-lettered"
        );
        p
    }

    /// The store over this pipeline's resources.
    pub fn store(&self) -> DeadLetterStore {
        DeadLetterStore::new(self.clients.clone(), self.resources.store_config())
    }

    /// Sends bodies to the source queue (standard queues).
    pub async fn send(&self, bodies: &[&str]) {
        let bodies: Vec<String> = bodies.iter().map(|b| b.to_string()).collect();
        sqs_keeper_local::demo::send_bodies(&self.clients.sqs, &self.resources.source_url, &bodies)
            .await
            .unwrap();
    }

    /// Sends one message to a FIFO source queue.
    pub async fn send_fifo(&self, body: &str, group: &str, dedup: &str) {
        self.clients
            .sqs
            .send_message()
            .queue_url(&self.resources.source_url)
            .message_body(body)
            .message_group_id(group)
            .message_deduplication_id(dedup)
            .send()
            .await
            .unwrap();
    }

    /// Polls until the source queue is empty (at most 60 s); returns the poller's totals.
    pub async fn drain(&self) -> sqs_keeper_local::esm::EsmStats {
        let (stats, drained) = self
            .esm
            .run_until_drained(&self.invoker, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(drained, "source queue did not drain: {stats:?}");
        stats
    }

    /// Messages in the source queue.
    pub async fn source_depth(&self) -> u64 {
        queue_depth(&self.clients.sqs, &self.resources.source_url)
            .await
            .unwrap()
    }

    /// Messages on the DLQ, received with their attributes (left in place).
    pub async fn dlq_messages(&self) -> Vec<aws_sdk_sqs::types::Message> {
        let mut all = Vec::new();
        for _ in 0..5 {
            let output = self
                .clients
                .sqs
                .receive_message()
                .queue_url(&self.resources.dlq_url)
                .max_number_of_messages(10)
                .visibility_timeout(30)
                .message_attribute_names("All")
                .send()
                .await
                .unwrap();
            if output.messages().is_empty() {
                break;
            }
            all.extend(output.messages().iter().cloned());
        }
        all
    }

    /// Every record in the table.
    pub async fn records(&self) -> Vec<DeadLetteredItem> {
        let output = self
            .clients
            .dynamodb
            .scan()
            .table_name(&self.resources.table)
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        output
            .items()
            .iter()
            .map(|i| sqs_keeper_aws::schema::record_from_item(i).unwrap())
            .collect()
    }

    /// A redrive engine over this pipeline, reprocessing through the same downstream.
    pub fn redrive_engine(
        &self,
    ) -> sqs_keeper_core::redrive::RedriveEngine<HttpDelivery, sqs_keeper_aws::DeadLetterStore>
    {
        self.redrive_engine_via(self.clients.clone())
    }

    /// A redrive engine over this pipeline's resources whose store uses `clients` (e.g.
    /// clients through a fault-injecting proxy), reprocessing through the same downstream.
    pub fn redrive_engine_via(
        &self,
        clients: AwsClients,
    ) -> sqs_keeper_core::redrive::RedriveEngine<HttpDelivery, sqs_keeper_aws::DeadLetterStore>
    {
        let delivery = HttpDelivery::new(sqs_keeper_http::HttpDeliveryConfig::new(
            self.downstream.url().parse().unwrap(),
            Duration::from_millis(500),
        ))
        .unwrap();
        sqs_keeper_core::redrive::RedriveEngine::new(
            DeadLetterStore::new(clients, self.resources.store_config()),
            Some(delivery),
            sqs_keeper_core::redrive::RedriveSettings {
                retry: sqs_keeper_core::retry::RetryPolicy {
                    max_attempts: 1,
                    ..sqs_keeper_core::retry::RetryPolicy::default()
                },
                parser: sqs_keeper_core::item::ItemParser {
                    id_source: "pointer:/id".parse().unwrap(),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
    }

    /// Sends bodies straight to the DLQ, as SQS's redrive policy would move them.
    pub async fn send_to_dlq(&self, bodies: &[&str]) {
        let bodies: Vec<String> = bodies.iter().map(|b| b.to_string()).collect();
        sqs_keeper_local::demo::send_bodies(&self.clients.sqs, &self.resources.dlq_url, &bodies)
            .await
            .unwrap();
    }

    /// Messages in the DLQ (visible and in flight).
    pub async fn dlq_depth(&self) -> u64 {
        queue_depth(&self.clients.sqs, &self.resources.dlq_url)
            .await
            .unwrap()
    }

    /// Keys of the objects in the payload bucket.
    pub async fn objects(&self) -> Vec<String> {
        let output = self
            .clients
            .s3
            .list_objects_v2()
            .bucket(&self.resources.bucket)
            .send()
            .await
            .unwrap();
        output
            .contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_string))
            .collect()
    }
}

/// The workspace's compiled `worker` binary (the Lambda function itself), for tests that
/// run it over the Runtime API. See [`function_binary`].
pub fn worker_binary() -> PathBuf {
    function_binary("worker")
}

/// A compiled function binary of the workspace (`worker`, or an example's), for tests that
/// run it over the Runtime API: the packaged `bootstrap` under `make test`
/// (`sqs_keeper_local::function::shipped_binary`), else built with cargo on first use in this process, for the
/// profile this test was built with, so a test never runs a stale binary (a no-op when it
/// is up to date, as after `make test`'s build). Cargo releases its lock before it runs tests, so
/// this works under `cargo test`.
pub fn function_binary(name: &str) -> PathBuf {
    match sqs_keeper_local::function::shipped_binary(name) {
        Ok(Some(path)) => return path,
        Ok(None) => {}
        Err(e) => panic!("{e}"),
    }
    static BUILT: std::sync::Mutex<Option<HashMap<String, PathBuf>>> = std::sync::Mutex::new(None);
    let mut built = BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = built.get_or_insert_with(HashMap::new).get(name) {
        return path.clone();
    }
    let path = build_function_binary(name);
    built
        .get_or_insert_with(HashMap::new)
        .insert(name.to_string(), path.clone());
    path
}

/// A `cargo` command for a build inside a test, without the variables `cargo test` sets for
/// this package (`CARGO_PKG_*`, `CARGO_MANIFEST_*`, ...): leaked into the inner build they
/// change dependency fingerprints, and it would rebuild another variant of everything.
pub fn inner_cargo() -> std::process::Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    without_cargo_test_vars(std::process::Command::new(cargo))
}

/// `command` without the variables `cargo test` sets for this package ([`inner_cargo`]):
/// for a shell that runs `cargo` in its turn.
pub fn without_cargo_test_vars(mut command: std::process::Command) -> std::process::Command {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let per_crate = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix));
        if per_crate
            || name == "CARGO_PRIMARY_PACKAGE"
            || name == "CARGO_TARGET_TMPDIR"
            || name == "RUST_RECURSION_COUNT"
        {
            command.env_remove(name.as_ref());
        }
    }
    command
}

fn build_function_binary(binary: &str) -> PathBuf {
    let dir = sqs_keeper_local::function::workspace_bin_dir()
        .expect("cannot locate the workspace's target directory");
    let mut command = inner_cargo();
    command
        .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        // The packages `make test`'s `cargo test` selects (the workspace but the
        // simulation) and one test target, the harness's own (`fault_proxy`, small):
        // a test target makes Cargo resolve features as `cargo test` does, the
        // dev-dependencies' included, so after that build this is a no-op. With no test
        // target the resolution would lack the dev-dependencies' features and compile a
        // second variant of every dependency, the AWS SDK among them, in the middle of
        // the tests; with all of them (`--tests`) a filtered run would relink every test
        // binary of the workspace first.
        .args([
            "build",
            "--quiet",
            "--workspace",
            "--exclude",
            "sqs-keeper-sim",
            "--test",
            "fault_proxy",
            "--bin",
            binary,
        ]);
    if dir.ends_with("release") {
        command.arg("--release");
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {binary}: {e}"));
    assert!(status.success(), "building the {binary} binary failed");
    let path = dir.join(binary);
    assert!(path.exists(), "{} does not exist", path.display());
    path
}
