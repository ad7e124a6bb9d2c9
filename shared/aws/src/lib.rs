//! # sqs-keeper-aws
//!
//! Every AWS SDK call of `sqs-keeper`, behind the core's ports: the store's four, one per
//! resource ([`sqs_keeper_core::ports::RecordStore`], [`sqs_keeper_core::ports::DeadLetterQueue`],
//! [`sqs_keeper_core::ports::PayloadStore`], [`sqs_keeper_core::ports::SourceQueue`], all implemented by
//! [`DeadLetterStore`]), the worker's [`sqs_keeper_core::dead_letter::DeadLetterSink`] and
//! [`sqs_keeper_core::batch::BodyResolver`], and the breaker's, idempotency table's, visibility and
//! polling ports: the core decides, these modules talk to DynamoDB, SQS, S3, Lambda and
//! Secrets Manager.
//!
//! ```no_run
//! use sqs_keeper_aws::AwsClients;
//! use sqs_keeper_aws::{DeadLetterStore, StoreConfig};
//!
//! # async fn example() {
//! // Clients from the standard configuration chain, built once and shared.
//! let clients = AwsClients::from_env().await;
//! let store = DeadLetterStore::new(
//!     clients,
//!     StoreConfig::new(
//!         "dead-letters",
//!         "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq",
//!         "orders-dead-letter-payloads",
//!     ),
//! );
//! // `store` is the worker's `DeadLetterSink` and every port of the redrive.
//! # let _ = store;
//! # }
//! ```
//!
//! Every adapter is re-exported at the root. Four modules are public for the names that
//! belong to them: [`condition_expression`], [`idempotency_table`], [`request_meter`] and
//! [`capacity_meter`].
//!
//! | module | what it holds |
//! | --- | --- |
//! | `aws` | the AWS clients, built once from the standard configuration chain ([`AwsClients`]) |
//! | `breaker_table` | the circuit breaker's shared state in DynamoDB ([`DynamoBreakerStore`]) |
//! | [`condition_expression`] | the conditions of `sqs_keeper_core::condition` sent with a DynamoDB request ([`WithCondition`]) |
//! | [`idempotency_table`] | the idempotency table in DynamoDB ([`DynamoIdempotencyStore`]) |
//! | `secrets` | the downstream credential, read from Secrets Manager at start-up (`secrets` feature) |
//! | `event_source` | the worker's event source mapping, the pause marker and the probe with a source message ([`LambdaMapping`], [`DynamoPauseMarker`], [`InvokeWorkerProbe`]) |
//! | `visibility` | `ChangeMessageVisibilityBatch` for spaced redelivery ([`SqsVisibility`]) |
//! | [`request_meter`] | the AWS requests each worker invocation makes, counted as its metrics ([`request_meter::RequestMeter`]) |
//! | [`capacity_meter`] | the DynamoDB capacity units each worker invocation consumes, counted as its metrics ([`capacity_meter::CapacityMeter`]) |
//! | `store` | the dead-letter store: records in DynamoDB, payloads in S3, the DLQ in SQS ([`DeadLetterStore`]); implements every port; [`schema`] names the table's attributes and indexes |

// Every type a public signature mentions can be named from the root (re-exported there,
// or from the crate that defines it).
#![deny(unnameable_types)]

mod aws;
mod breaker_table;
pub mod capacity_meter;
pub mod condition_expression;
mod event_source;
pub mod idempotency_table;
pub mod request_meter;
#[cfg(feature = "secrets")]
mod secrets;
mod store;
mod visibility;

// The crate's whole public API.
pub use aws::{s3_path_style_from_env, AwsClients, CallCounter, Endpoints};
pub use breaker_table::DynamoBreakerStore;
pub use condition_expression::WithCondition;
pub use event_source::{
    lambda_event, queue_arn_of_url, DynamoPauseMarker, InvokeWorkerProbe, LambdaMapping,
};
pub use idempotency_table::DynamoIdempotencyStore;
#[cfg(feature = "secrets")]
pub use secrets::{auth_header, SecretError};
pub use store::{
    schema, DeadLetterStore, ExtendedClientResolver, StoreConfig, DLQ_ATTRIBUTES_ALLOWANCE,
};
pub use visibility::SqsVisibility;
