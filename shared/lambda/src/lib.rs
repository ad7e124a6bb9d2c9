//! # sqs-keeper-lambda
//!
//! The Lambda glue of `sqs-keeper`: [`run`] and [`Setup`] serve any [`Processor`] as a
//! Lambda function. [`worker::Worker`] and [`runtime::WorkerLayer`] answer its
//! invocations, and `redrive_function::RedriveFunction` runs the scheduled and operator
//! redrive. [`config::WorkerConfig`], [`config::RedriveConfig`] and
//! [`config::HandlerConfig`] read every variable once ([`config::vars`] names them).
//! [`telemetry::init`] and [`metrics::emf_documents`] write logs and EMF lines as Lambda
//! expects. The shipped functions, the `dlq` CLI and the tests build on it; a handler
//! author depends on `sqs-keeper`, which re-exports the few names a handler needs.
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
//! The root holds what a handler's `main` spells; everything else lives in the module of
//! its concept. The whole map, with the data's path, is in `docs/ARCHITECTURE.md` §5.
//!
//! | module | what it holds | I/O |
//! | --- | --- | --- |
//! | [`config`] | every environment variable once ([`config::vars`]) and the configurations read from them ([`config::WorkerConfig`], [`config::RedriveConfig`], [`config::HandlerConfig`]) | env |
//! | [`runner`] | one call that runs any [`Processor`] as a Lambda function ([`run`], [`Setup`]) | env, AWS |
//! | [`worker`] | the Lambda handler a runner serves ([`worker::Worker`]) | via traits |
//! | [`runtime`] | plugs the worker into `lambda_runtime` ahead of its serde decode ([`runtime::WorkerLayer`]) | via traits |
//! | `http_worker` | the shipped worker's start-up: `HttpDelivery` into the configured store (`http` feature) | env, AWS |
//! | `redrive_function` | the Lambda handler the `redrive` binary runs (`http` feature) | via ports |
//! | [`init_error`] | a start-up failure posted to the Runtime API's `/runtime/init/error` ([`init_failed`]) | Runtime API |
//! | [`metrics`] | CloudWatch Embedded Metric Format lines per invocation, worker and redrive ([`metrics::emf_documents`]) | stdout |
//! | [`metric_names`] | the namespace, service and dimensions a team chooses for those lines | env |
//! | `otel` | traced records' spans as children of their producers' spans, for a team's OpenTelemetry tracer (`opentelemetry` feature) | via the tracer |
//! | [`telemetry`] | logs as Lambda's advanced logging controls set them (level, JSON or text), the invocation span ([`telemetry::init`], [`telemetry::InvocationLayer`]) | stdout |
//!
//! ## Guarantees
//!
//! Every record ends as exactly one of done, skipped, returned for retry (listed in
//! `batchItemFailures`), or dead-lettered, and a dead-lettered record is acknowledged only
//! after the sink has persisted it. Bodies are never logged.

// Every type a public signature mentions can be named: public in its module, or from the
// crate that defines it.
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

pub mod config;
#[cfg(feature = "http")]
pub mod http_worker;
pub mod init_error;
pub mod metric_names;
pub mod metrics;
#[cfg(feature = "opentelemetry")]
pub mod otel;
#[cfg(feature = "http")]
pub mod redrive_function;
pub mod runner;
pub mod runtime;
pub mod telemetry;
pub mod worker;

// The short root: what a handler's `main` spells. Everything else lives in the module of its
// concept (`config::WorkerConfig`, `metrics::emf_documents`, `telemetry::InvocationLayer`).
pub use init_error::init_failed;
pub use runner::{run, Error, Setup};
pub use sqs_keeper_core::{
    handler_fn, DeadLettered, ErrorClass, Outcome, ProcessError, Processor, WorkItem,
};
pub use worker::StartupError;
// Whether this build has the simulation's hooks: the functions refuse to compile with them.
pub use sqs_keeper_core::mutants::SIMULATION_HOOKS;
