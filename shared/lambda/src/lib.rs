//! # sqs-keeper-lambda
//!
//! The Lambda glue of `sqs-keeper`: [`run`] and [`Setup`] serve any [`Processor`] as a
//! Lambda function, [`Worker`] and [`WorkerLayer`] answer its invocations,
//! `RedriveFunction` runs the scheduled and operator redrive, [`WorkerConfig`],
//! [`RedriveConfig`] and [`HandlerConfig`] read every variable once ([`vars`] names them),
//! and [`init_telemetry`] and [`emf_documents`] write logs and EMF lines as Lambda expects.
//! The shipped functions, the `dlq` CLI and the tests build on it; a handler author
//! depends on `sqs-keeper`, which re-exports the few names a handler needs.
//!
//! ```no_run
//! use sqs_keeper_lambda::{handler_fn, Outcome, ProcessError, Setup, WorkItem};
//!
//! async fn handle(_item: &WorkItem) -> Result<Outcome, ProcessError> {
//!     Ok(Outcome::Done)
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), sqs_keeper_lambda::Error> {
//!     // The configuration every variable names, read once; clients built once.
//!     let setup = Setup::from_env().await?;
//!     setup.run(handler_fn(handle)).await
//! }
//! ```
//!
//! ## Layout
//!
//! The core (`sqs-keeper-core`) decides and does no I/O of its own; `sqs-keeper-aws` holds
//! every AWS SDK call, behind the core's ports; this crate wires them together for Lambda.
//! Its modules are private and everything it offers is re-exported at its root. The whole
//! map, with the data's path, is in `docs/ARCHITECTURE.md` §5.
//!
//! | module (private) | what it holds | I/O |
//! | --- | --- | --- |
//! | `config` | every environment variable once ([`vars`]) and the configurations read from them ([`WorkerConfig`], [`RedriveConfig`], [`HandlerConfig`]) | env |
//! | `runner` | one call that runs any [`Processor`] as a Lambda function ([`run`], [`Setup`]) | env, AWS |
//! | `worker` | the Lambda handler a runner serves ([`Worker`]) | via traits |
//! | `runtime` | plugs the worker into `lambda_runtime` ahead of its serde decode ([`WorkerLayer`]) | via traits |
//! | `http_worker` | the shipped worker's start-up: `HttpDelivery` into the configured store (`http` feature) | env, AWS |
//! | `redrive_function` | the Lambda handler the `redrive` binary runs (`http` feature) | via ports |
//! | [`init_error`] | a start-up failure posted to the Runtime API's `/runtime/init/error` ([`init_failed`]) | Runtime API |
//! | `metrics` | CloudWatch Embedded Metric Format lines per invocation, worker and redrive ([`emf_documents`]) | stdout |
//! | `telemetry` | logs as Lambda's advanced logging controls set them (level, JSON or text), the invocation span ([`init_telemetry`], [`InvocationLayer`]) | stdout |
//!
//! ## Guarantees
//!
//! Every record ends as exactly one of done, skipped, returned for retry (listed in
//! `batchItemFailures`), or dead-lettered, and a dead-lettered record is acknowledged only
//! after the sink has persisted it. Bodies are never logged.

// Every type a public signature mentions can be named from the root (re-exported there,
// or from the crate that defines it).
#![deny(unnameable_types)]

// A handler's panic fails its record, and only if the build unwinds: built with
// `panic = "abort"`, the first panic kills the sandbox and the whole batch comes back.
// `cargo lambda build` and `sam build` pass `panic = "abort"` unless the handler's crate
// sets `panic` itself, so the build that would lose this says how to keep it.
#[cfg(all(panic = "abort", not(feature = "panic-abort")))]
compile_error!(
    "sqs-keeper: this build aborts on panic, so one panicking handler call would kill the \
     whole batch instead of failing its record. Add to your crate's Cargo.toml:\n\n\
     [profile.release]\npanic = \"unwind\"\n\n\
     (cargo lambda build and sam build otherwise build with panic = \"abort\"). To abort on \
     purpose, enable the `panic-abort` feature of sqs-keeper."
);

mod config;
#[cfg(feature = "http")]
mod http_worker;
pub mod init_error;
pub mod metric_names;
mod metrics;
#[cfg(feature = "http")]
mod redrive_function;
mod runner;
mod runtime;
mod telemetry;
mod worker;

// The crate's whole public API. The core's names a handler's code spells are re-exported
// too, so that `Setup` and `run` can be used with this crate alone.
pub use config::{
    read_ids_and_envelope, read_item_id_source, read_store_config, vars, BreakerConfig,
    ConfigError, ConfigProblem, EnvReader, HandlerConfig, IdempotencyConfig, Var, BREAKER_ID,
    REDRIVE_VARS, STORE_VARS, WORKER_VARS,
};
#[cfg(feature = "http")]
pub use config::{DownstreamAuth, PollingTarget, RedriveConfig, WorkerConfig};
#[cfg(feature = "http")]
pub use http_worker::{http_delivery_from_env, DefaultWorker};
pub use init_error::init_failed;
pub use metrics::{
    emf_documents, emit as emit_metrics, emit_redrive as emit_redrive_metrics, redrive_document,
    InvocationTimings, MAX_VALUES_PER_METRIC, NAMESPACE as METRICS_NAMESPACE,
};
#[cfg(feature = "http")]
pub use redrive_function::{
    redrive_breaker, redrive_engine, redrive_processor, run_gated, RedriveBreaker, RedriveDelivery,
    RedriveFunction, RedriveProcessor,
};
pub use runner::{run, Error, GroupStores, Guarded, Handler, Setup};
pub use runtime::{respond, HandlerOutcome, WorkerLayer, WorkerService};
pub use sqs_keeper_core::{
    handler_fn, DeadLettered, ErrorClass, Outcome, ProcessError, Processor, WorkItem,
};
// Whether this build has the simulation's hooks: the functions refuse to compile with them.
pub use sqs_keeper_core::SIMULATION_HOOKS;
pub use telemetry::{
    cold_start, init as init_telemetry, subscriber as log_subscriber, InvocationLayer,
    InvocationService, LambdaJson, LogFormat, LogSettings, INVOCATION_SPAN, LOG_FORMAT_VAR,
    LOG_LEVEL_VAR, RUST_LOG_VAR,
};
pub use worker::{ConfiguredSink, InvocationError, StartupError, Worker};
