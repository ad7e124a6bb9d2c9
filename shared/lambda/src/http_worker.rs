//! The worker the function binary ships: [`HttpDelivery`] into the configured dead-letter
//! store, built from the environment. It sits above both the runner ([`Setup`], [`Handler`])
//! and the Lambda glue ([`Worker`]) it wires together, so neither imports the other back.

use crate::config::WorkerConfig;
use crate::runner::{Handler, Setup};
use crate::worker::{ConfiguredSink, StartupError, Worker};
use sqs_keeper_aws::AwsClients;
use sqs_keeper_http::HttpDelivery;

/// The worker the function binary runs: HTTP delivery into the configured store.
pub type DefaultWorker = Worker<Handler<HttpDelivery>, ConfiguredSink>;

impl DefaultWorker {
    /// Builds the worker from the environment (clients once, reused by every invocation).
    pub async fn from_env() -> Result<Self, StartupError> {
        crate::config::vars::warn_of_unknown();
        let config = WorkerConfig::from_env()?;
        Self::from_config(config, None).await
    }

    /// Builds the worker from a configuration; `clients` overrides the AWS clients that
    /// would otherwise be loaded from the environment.
    pub async fn from_config(
        config: WorkerConfig,
        clients: Option<AwsClients>,
    ) -> Result<Self, StartupError> {
        let (setup, delivery) = setup_and_delivery(config, clients).await?;
        Ok(setup.worker(delivery).await)
    }
}

/// Returns the runner's [`Setup`] for `config` and the delivery it runs, with the downstream
/// credential read when one is configured; `clients` overrides the AWS clients that would
/// otherwise be loaded from the environment.
async fn setup_and_delivery(
    mut config: WorkerConfig,
    clients: Option<AwsClients>,
) -> Result<(Setup, HttpDelivery), StartupError> {
    let mut setup = Setup::new(config.handler.clone());
    if let Some(clients) = clients {
        setup = setup.with_clients(clients);
    }
    // AWS clients only when something needs them: loading the configuration chain is
    // a noticeable part of a cold start.
    if config.downstream_auth.is_none() {
        let delivery = HttpDelivery::new(config.delivery).map_err(StartupError::HttpClient)?;
        return Ok((setup, delivery));
    }
    let clients = setup.aws_clients().await;
    config.resolve_downstream_auth(&clients).await?;
    let delivery = HttpDelivery::new(config.delivery.clone()).map_err(StartupError::HttpClient)?;
    let delivery = config.renewing_credential(delivery, &clients);
    Ok((setup, delivery))
}

/// Returns the shipped worker's start: the logs, every variable (the handler's and the
/// downstream's, all problems named at once), the downstream credential from Secrets
/// Manager when one is configured. Returns the [`Setup`] to run the delivery with, so the
/// shipped worker runs the way any handler does. A failure is reported to Lambda
/// (`/runtime/init/error`) and returned; `main` prints it.
pub async fn http_delivery_from_env() -> Result<(Setup, HttpDelivery), StartupError> {
    crate::telemetry::init();
    let started = async { setup_and_delivery(WorkerConfig::from_env()?, None).await }.await;
    if let Err(error) = &started {
        error.report().await;
    }
    started
}
