//! One call to run a handler as a Lambda function, with everything the shipped worker has:
//! configuration and the dead-letter store from the environment, classified retries, the
//! receive budget, FIFO ordering, the deadline, Extended-Client payloads, envelopes,
//! per-record idempotency, EMF metrics and JSON logs (docs/ARCHITECTURE.md §6).
//!
//! ```no_run
//! use sqs_keeper_lambda::{handler_fn, Outcome, ProcessError, WorkItem};
//!
//! async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError> {
//!     let order: serde_json::Value = item.json()?; // a body that is not JSON: dead-lettered
//!     println!("order {}", order["id"]);
//!     Ok(Outcome::Done)
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), sqs_keeper_lambda::Error> {
//!     sqs_keeper_lambda::run(handler_fn(handle)).await
//! }
//! ```
//!
//! A handler that needs AWS clients or other set-up builds them from a [`Setup`], whose
//! [`Setup::aws_config`] is the configuration the worker's own clients use (region,
//! credentials, and the per-service endpoints of `AWS_ENDPOINT_URL*`), then runs:
//!
//! ```no_run
//! # struct Orders(aws_sdk_dynamodb::Client);
//! # impl sqs_keeper_lambda::Processor for Orders {
//! #     async fn process(&self, _: &sqs_keeper_lambda::WorkItem) -> Result<sqs_keeper_lambda::Outcome, sqs_keeper_lambda::ProcessError> { Ok(sqs_keeper_lambda::Outcome::Done) }
//! # }
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), sqs_keeper_lambda::Error> {
//!     let setup = sqs_keeper_lambda::Setup::from_env().await?;
//!     let orders = Orders(aws_sdk_dynamodb::Client::new(setup.aws_config().await));
//!     setup.run(orders).await
//! }
//! ```

use std::sync::Arc;

use lambda_runtime::tower::{Layer as TowerLayer, Service};
use lambda_runtime::{service_fn, Runtime};

/// The tower crate lambda_runtime builds on: a layer of a team's own implements its
/// `Layer` ([`Setup::run_with_layer`]).
pub use lambda_runtime::tower;
/// One invocation as lambda_runtime's services take it.
pub use lambda_runtime::LambdaInvocation;
use tokio::sync::OnceCell;

use crate::config::HandlerConfig;
use crate::runtime::{respond, WorkerLayer};
use crate::telemetry::InvocationLayer;
use crate::worker::{ConfiguredSink, StartupError, Worker};
use sqs_keeper_aws::AwsClients;
use sqs_keeper_aws::DynamoBreakerStore;
use sqs_keeper_aws::DynamoIdempotencyStore;
use sqs_keeper_aws::{DeadLetterStore, ExtendedClientResolver};
use sqs_keeper_core::breaker::Breaker;
use sqs_keeper_core::dead_letter::NoDeadLetterStore;
use sqs_keeper_core::BatchProcessor;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::WorkItem;
use sqs_keeper_core::{idempotency::Idempotency, idempotency::Idempotent};
use sqs_keeper_core::{DeadLettered, Outcome, Processor};

/// What a function's `main` returns: any start-up or runtime error, reported by Lambda
/// as the function's init or runtime error.
pub type Error = lambda_runtime::Error;

/// Reads the configuration from the environment and runs `processor` for every
/// invocation until the process ends. The whole `main` of a handler (see the module's
/// documentation).
pub async fn run<P: Processor + 'static>(processor: P) -> Result<(), Error> {
    Setup::from_env().await?.run(processor).await
}

/// The processor as the runner runs it: once per item id when an idempotency table is
/// configured (`WORKER_IDEMPOTENCY_TABLE`), as it is otherwise; behind the shared circuit
/// breaker when one is (`WORKER_BREAKER_TABLE`). Idempotency is outside the breaker: a
/// duplicate of a completed item is skipped without asking it.
// Exhaustive on purpose: idempotency is on or off, and the runner composes both.
#[derive(Debug)]
pub enum Handler<P> {
    /// Every delivery runs the processor.
    Plain(Guarded<P>),
    /// A completed item's duplicates are skipped ([`sqs_keeper_core::idempotency`]).
    Idempotent(Idempotent<Guarded<P>, DynamoIdempotencyStore>),
}

/// The store of a message group's breaker (`None`: the function's).
pub type GroupStores = Box<dyn Fn(Option<&str>) -> DynamoBreakerStore + Send + Sync>;

/// The processor, behind the circuit breaker or not.
// Exhaustive on purpose: the breaker is on or off, and the runner composes both.
#[derive(Debug)]
pub enum Guarded<P> {
    /// Called for every item.
    Direct(P),
    /// Not called while the shared breaker is open (the core's `breaker`). Boxed: it holds
    /// a DynamoDB client beside the processor.
    Breaker(Box<Breaker<P, DynamoBreakerStore>>),
    /// Behind a breaker per message group (`WORKER_BREAKER_SCOPE=message-group`).
    Groups(Box<sqs_keeper_core::breaker::GroupBreakers<P, DynamoBreakerStore, GroupStores>>),
}

impl<P> Handler<P> {
    /// Returns the user's processor.
    pub fn inner(&self) -> &P {
        let guarded = match self {
            Handler::Plain(p) => p,
            Handler::Idempotent(p) => p.inner(),
        };
        match guarded {
            Guarded::Direct(p) => p,
            Guarded::Breaker(b) => b.inner(),
            Guarded::Groups(g) => g.inner(),
        }
    }
}

impl<P: Processor> Processor for Guarded<P> {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        match self {
            Guarded::Direct(p) => p.process(item).await,
            Guarded::Breaker(p) => p.process(item).await,
            Guarded::Groups(p) => p.process(item).await,
        }
    }

    fn attempt_timeout(&self) -> Option<std::time::Duration> {
        match self {
            Guarded::Direct(p) => p.attempt_timeout(),
            Guarded::Breaker(p) => p.attempt_timeout(),
            Guarded::Groups(p) => p.attempt_timeout(),
        }
    }

    async fn on_dead_letter(&self, dead: &DeadLettered<'_>) -> Result<(), ProcessError> {
        match self {
            Guarded::Direct(p) => p.on_dead_letter(dead).await,
            Guarded::Breaker(p) => p.on_dead_letter(dead).await,
            Guarded::Groups(p) => p.on_dead_letter(dead).await,
        }
    }
}

impl<P: Processor> Processor for Handler<P> {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        match self {
            Handler::Plain(p) => p.process(item).await,
            Handler::Idempotent(p) => p.process(item).await,
        }
    }

    fn attempt_timeout(&self) -> Option<std::time::Duration> {
        self.inner().attempt_timeout()
    }

    async fn on_dead_letter(&self, dead: &DeadLettered<'_>) -> Result<(), ProcessError> {
        match self {
            Handler::Plain(p) => p.on_dead_letter(dead).await,
            Handler::Idempotent(p) => p.on_dead_letter(dead).await,
        }
    }
}

/// The configuration a handler runs with, and the AWS configuration its clients share.
///
/// ```no_run
/// use sqs_keeper_core::{handler_fn, Outcome, ProcessError, WorkItem};
/// use sqs_keeper_lambda::runner::Setup;
///
/// async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError> {
///     let _order: serde_json::Value = item.json()?;
///     Ok(Outcome::Done)
/// }
///
/// # async fn main_() -> Result<(), lambda_runtime::Error> {
/// // Reads the environment (the store, retries, idempotency) and fails with a clear
/// // message when it is incomplete.
/// let setup = Setup::from_env().await?;
/// // Clients for the handler's own AWS calls share the setup's configuration.
/// let _dynamodb = setup.aws_clients().await.dynamodb;
/// setup.run(handler_fn(handle)).await
/// # }
/// ```
#[derive(Debug)]
pub struct Setup {
    config: HandlerConfig,
    aws: OnceCell<aws_config::SdkConfig>,
    clients: Option<AwsClients>,
}

impl Setup {
    /// Starts the logs as Lambda's logging controls say (`AWS_LAMBDA_LOG_FORMAT`,
    /// `AWS_LAMBDA_LOG_LEVEL`) and reads the worker's variables; a bad value is logged and
    /// returned, naming the variable.
    pub async fn from_env() -> Result<Setup, StartupError> {
        crate::telemetry::init();
        crate::config::vars::warn_of_unknown();
        if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_none() {
            // Said first: a run outside Lambda usually lacks the variables too, and
            // lambda_runtime would otherwise end it with a panic that names neither.
            let error = StartupError::NotUnderLambda;
            tracing::error!("{error}");
            return Err(error);
        }
        match HandlerConfig::from_env() {
            Ok(config) => {
                crate::metric_names::configure(config.metrics.clone());
                Ok(Setup::new(config))
            }
            Err(e) => {
                let error = StartupError::from(e);
                error.report().await;
                Err(error)
            }
        }
    }

    /// Creates a set-up from a configuration read elsewhere.
    pub fn new(config: HandlerConfig) -> Setup {
        Setup {
            config,
            aws: OnceCell::new(),
            clients: None,
        }
    }

    /// Uses these clients (and their configuration) instead of loading them from the
    /// environment: tests against emulators, embedders.
    pub fn with_clients(mut self, clients: AwsClients) -> Setup {
        let _ = self.aws.set(clients.config.clone());
        self.clients = Some(clients);
        self
    }

    /// Returns the configuration read from the environment.
    pub fn config(&self) -> &HandlerConfig {
        &self.config
    }

    /// Returns the AWS configuration (region, credentials, endpoints), loaded once on first use:
    /// build the handler's own clients from it.
    pub async fn aws_config(&self) -> &aws_config::SdkConfig {
        self.aws
            .get_or_init(|| async {
                aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
            })
            .await
    }

    /// Returns the worker's AWS clients, built from [`Setup::aws_config`].
    pub async fn aws_clients(&self) -> AwsClients {
        match &self.clients {
            Some(clients) => clients.clone(),
            None => AwsClients::from_config(
                self.aws_config().await,
                sqs_keeper_aws::s3_path_style_from_env(),
            ),
        }
    }

    /// Returns the idempotency table, when `WORKER_IDEMPOTENCY_TABLE` names one: for handlers that
    /// make parts of their work idempotent themselves ([`Idempotency::once`]).
    pub async fn idempotency(&self) -> Option<Idempotency<DynamoIdempotencyStore>> {
        let config = self.config.idempotency.as_ref()?;
        let clients = self.aws_clients().await;
        Some(
            Idempotency::new(
                DynamoIdempotencyStore::new(clients.dynamodb, config.table.clone()),
                config.ttl,
            )
            .with_key_prefix(&config.key_prefix),
        )
    }

    /// `processor` behind the worker's circuit breaker when one is configured
    /// (`WORKER_BREAKER_TABLE`): one per message group with `WORKER_BREAKER_SCOPE=message-group`.
    async fn guarded<P: Processor>(&self, processor: P) -> Guarded<P> {
        match &self.config.breaker {
            Some(breaker) if breaker.per_group => {
                let (client, table, key) = (
                    self.aws_clients().await.dynamodb,
                    breaker.table.clone(),
                    breaker.key.clone(),
                );
                let stores: GroupStores = Box::new(move |group| {
                    let key = match group {
                        Some(group) => sqs_keeper_core::breaker::group_key(&key, group),
                        None => key.clone(),
                    };
                    DynamoBreakerStore::new(client.clone(), table.clone(), &key)
                });
                Guarded::Groups(Box::new(sqs_keeper_core::breaker::GroupBreakers::new(
                    processor,
                    stores,
                    breaker.policy,
                )))
            }
            Some(breaker) => {
                let store = DynamoBreakerStore::new(
                    self.aws_clients().await.dynamodb,
                    breaker.table.clone(),
                    &breaker.key,
                );
                Guarded::Breaker(Box::new(Breaker::new(processor, store, breaker.policy)))
            }
            None => Guarded::Direct(processor),
        }
    }

    /// Returns the dead-letter store and the Extended-Client resolver, when a store is configured.
    async fn sink(&self) -> (ConfiguredSink, Option<ExtendedClientResolver>) {
        let config = &self.config;
        match &config.store {
            Some(store_config) => {
                let clients = self.aws_clients().await;
                // The store's own bucket holds the pointers the DLQ and a requeue carry.
                let mut policy = config.payload.clone();
                policy.allowed_buckets.insert(store_config.bucket.clone());
                let resolver = ExtendedClientResolver::new(clients.s3.clone(), policy);
                (
                    ConfiguredSink::Store(Box::new(DeadLetterStore::new(
                        clients,
                        store_config.clone(),
                    ))),
                    Some(resolver),
                )
            }
            None => {
                tracing::warn!(
                    "no dead-letter store configured (DLQ_TABLE, DLQ_QUEUE_URL, DLQ_BUCKET): \
                 permanent failures are returned to the queue"
                );
                (ConfiguredSink::Disabled(NoDeadLetterStore), None)
            }
        }
    }

    /// Returns the worker around `processor`: the dead-letter store and Extended-Client resolver
    /// when one is configured, idempotency when a table is.
    pub async fn worker<P: Processor>(self, processor: P) -> Worker<Handler<P>, ConfiguredSink> {
        let attempt_timeout = processor.attempt_timeout();
        let processor = self.guarded(processor).await;
        let handler = match self.idempotency().await {
            Some(idempotency) => Handler::Idempotent(Idempotent::new(processor, idempotency)),
            None => Handler::Plain(processor),
        };
        let config = &self.config;
        let (sink, resolver) = self.sink().await;
        let mut engine = BatchProcessor::new(handler, sink, config.batch.clone());
        if let Some(resolver) = resolver {
            engine = engine.with_body_resolver(Arc::new(resolver));
        }
        if config.redelivery.is_some() || config.breaker.is_some() {
            let sqs = self.aws_clients().await.sqs;
            let port: Arc<dyn sqs_keeper_core::redelivery::VisibilityPort> =
                Arc::new(sqs_keeper_aws::SqsVisibility::new(sqs));
            if let Some(policy) = config.redelivery {
                engine = engine.with_redelivery(policy, port.clone());
            }
            // Under a breaker the worker's polling may be paused during a long outage, and
            // a paused queue is swept only every eighth of its retention: a record keeps a
            // quarter of it in reserve (docs/ARCHITECTURE.md §1.12).
            if config.breaker.is_some() {
                engine = engine.with_sweep_reserve(port);
            }
        }
        let worker = Worker::new(engine, config.deadline_margin);
        match attempt_timeout {
            Some(timeout) => worker.with_attempt_timeout(timeout),
            None => worker,
        }
    }

    /// Reads the dead-letter store's table, DLQ and bucket once when `DLQ_CHECK_AT_START`
    /// asks for it; the error names what failed.
    async fn check_store(&self) -> Result<(), StartupError> {
        match &self.config.store {
            Some(store) if self.config.check_store_at_start => {
                DeadLetterStore::new(self.aws_clients().await, store.clone())
                    .check_reachable()
                    .await
                    .map_err(StartupError::StoreUnreachable)
            }
            _ => Ok(()),
        }
    }

    /// Runs `processor` for every invocation until the process ends.
    pub async fn run<P: Processor + 'static>(self, processor: P) -> Result<(), Error> {
        let worker = self.serving(processor).await?;
        // Added last, so it runs first: the batch runs inside each invocation's span.
        // `run_concurrent` serves `AWS_LAMBDA_MAX_CONCURRENCY` invocations at once where
        // Lambda sets it (Managed Instances) and one at a time where it does not
        // (docs/HANDLERS.md, "Lambda Managed Instances").
        Runtime::new(service_fn(respond))
            .layer(WorkerLayer::new(worker))
            .layer(InvocationLayer)
            .run_concurrent()
            .await
    }

    /// Runs `processor` as [`Setup::run`] does, with the team's own tower `layer` around
    /// each invocation: lambda_runtime's OpenTelemetry layer, a timing layer, a layer of
    /// the team's own.
    ///
    /// The layer runs inside the invocation's span (its log lines carry the request id)
    /// and around the batch: it sees every invocation, and the batch's response is
    /// posted when it finishes. Its service need not be `Clone` (lambda_runtime's
    /// OpenTelemetry service is not): it is served behind a tower `Buffer`, which keeps
    /// Lambda Managed Instances' concurrent invocations concurrent. Its service need not be `Clone` (lambda_runtime's
    /// OpenTelemetry service is not): it is served behind a tower `Buffer`, which keeps
    /// Lambda Managed Instances' concurrent invocations concurrent.
    ///
    /// ```no_run
    /// use sqs_keeper_lambda::{handler_fn, Outcome, ProcessError, Setup, WorkItem};
    ///
    /// async fn handle(_item: &WorkItem) -> Result<Outcome, ProcessError> {
    ///     Ok(Outcome::Done)
    /// }
    ///
    /// # async fn example() -> Result<(), sqs_keeper_lambda::Error> {
    /// // Any tower layer generic over its service; this one does nothing.
    /// let layer = lambda_runtime::tower::layer::util::Identity::new();
    /// Setup::from_env().await?.run_with_layer(handler_fn(handle), layer).await
    /// # }
    /// ```
    pub async fn run_with_layer<P, L>(self, processor: P, layer: L) -> Result<(), Error>
    where
        P: Processor + 'static,
        L: TowerLayer<InvocationBox>,
        L::Service: Service<LambdaInvocation, Response = (), Error = Error> + Send + 'static,
        <L::Service as Service<LambdaInvocation>>::Future: Send,
    {
        let worker = self.serving(processor).await?;
        // As many invocations wait for the layer's service as the runtime serves at once.
        let concurrency = std::env::var(MAX_CONCURRENCY_VAR)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        Runtime::new(service_fn(respond))
            .layer(WorkerLayer::new(worker))
            .layer(InvocationBox::layer())
            .layer(layer)
            .layer(::tower::buffer::BufferLayer::new(concurrency))
            .layer(InvocationLayer)
            .run_concurrent()
            .await
    }

    /// Returns the worker every invocation is served by, once the process may serve: built with
    /// the simulation's hooks it may not, and the store must answer when
    /// `DLQ_CHECK_AT_START` asks.
    async fn serving<P: Processor + 'static>(
        self,
        processor: P,
    ) -> Result<&'static Worker<Handler<P>, ConfiguredSink>, Error> {
        // The simulation's hooks (its mutants) must never serve real traffic:
        // Cargo unifies features across one build, so a handler built beside the
        // simulation would carry them (docs/SIMULATION.md).
        if sqs_keeper_core::mutants::SIMULATION_HOOKS {
            let why = "this binary was built with the simulation's test hooks (feature `sim` of sqs-keeper-core, unified from another package of the build): build it on its own, e.g. `cargo build -p <your crate>`";
            tracing::error!("{why}");
            return Err(why.into());
        }
        let concurrency = std::env::var(MAX_CONCURRENCY_VAR).ok();
        if let Some(warning) = concurrency_warning(concurrency.as_deref()) {
            tracing::warn!("{warning}");
        }
        if let Err(error) = self.check_store().await {
            tracing::error!("{error}");
            error.report().await;
            return Err(error.into());
        }
        let worker = self.worker(processor).await;
        // The worker serves every invocation until the process ends.
        Ok(Box::leak(Box::new(worker)))
    }
}

/// The service a team's layer wraps in [`Setup::run_with_layer`]: the worker and the
/// runtime's handling of the response, boxed, so that a layer generic over its service
/// fits whatever the processor is.
pub type InvocationBox = lambda_runtime::tower::util::BoxCloneService<LambdaInvocation, (), Error>;

/// The variable Lambda Managed Instances sets to the invocations a process serves at once.
pub const MAX_CONCURRENCY_VAR: &str = "AWS_LAMBDA_MAX_CONCURRENCY";

/// Returns what to warn of when [`MAX_CONCURRENCY_VAR`] is set but not a whole number of 1 or more:
/// the runtime then serves one invocation at a time, and says nothing.
fn concurrency_warning(value: Option<&str>) -> Option<String> {
    let value = value?;
    // Parsed as the runtime parses it (no trimming).
    match value.parse::<u32>() {
        Ok(n) if n >= 1 => None,
        _ => Some(format!(
            "{MAX_CONCURRENCY_VAR}={value:?} is not a whole number of 1 or more: this process serves one invocation at a time"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer whose service is not `Clone`, as lambda_runtime's OpenTelemetry service is
    /// not: `run_with_layer` must take it. Checked by compiling the call.
    struct NotClone;

    impl<S> TowerLayer<S> for NotClone {
        type Service = NotCloneService<S>;

        fn layer(&self, inner: S) -> NotCloneService<S> {
            NotCloneService(inner)
        }
    }

    struct NotCloneService<S>(S);

    impl<S: Service<LambdaInvocation>> Service<LambdaInvocation> for NotCloneService<S> {
        type Response = S::Response;
        type Error = S::Error;
        type Future = S::Future;

        fn poll_ready(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), S::Error>> {
            self.0.poll_ready(cx)
        }

        fn call(&mut self, invocation: LambdaInvocation) -> S::Future {
            self.0.call(invocation)
        }
    }

    async fn done(_item: &WorkItem) -> Result<Outcome, ProcessError> {
        Ok(Outcome::Done)
    }

    #[allow(dead_code)]
    async fn a_layer_whose_service_is_not_clone_is_taken(setup: Setup) -> Result<(), Error> {
        setup
            .run_with_layer(sqs_keeper_core::handler_fn(done), NotClone)
            .await
    }

    #[test]
    fn a_max_concurrency_that_is_no_count_is_warned_of() {
        for good in [None, Some("1"), Some("8")] {
            assert_eq!(concurrency_warning(good), None, "{good:?}");
        }
        for bad in ["0", "abc", "-2", "", "1.5", " 4"] {
            let warning = concurrency_warning(Some(bad)).unwrap_or_default();
            assert!(
                warning.contains("one invocation at a time"),
                "{bad:?}: {warning}"
            );
        }
    }
}
