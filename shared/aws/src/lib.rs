//! # sqs-keeper-aws
//!
//! Every AWS SDK call of `sqs-keeper`, behind the core's ports: the store's four, one per
//! resource ([`sqs_keeper_core::ports`]: the record table, the DLQ, the payload bucket, the
//! source queues, all implemented by [`store::DeadLetterStore`]), the worker's
//! [`sqs_keeper_core::DeadLetterSink`] and [`sqs_keeper_core::batch::BodyResolver`], and the
//! breaker's, idempotency table's, visibility and polling ports: the core decides, these
//! modules talk to DynamoDB, SQS, S3, Lambda and Secrets Manager.
//! `sqs-keeper` re-exports this crate as `adapters`.
//!
//! ```no_run
//! use sqs_keeper_aws::aws::AwsClients;
//! use sqs_keeper_aws::store::{DeadLetterStore, StoreConfig};
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
//! | module | what it holds |
//! | --- | --- |
//! | [`aws`] | the AWS clients, built once from the standard configuration chain |
//! | [`breaker_table`] | the circuit breaker's shared state in DynamoDB |
//! | [`condition_expression`] | the conditions of [`sqs_keeper_core::condition`] sent with a DynamoDB request |
//! | [`idempotency_table`] | the idempotency table in DynamoDB |
//! | `secrets` | the downstream credential, read from Secrets Manager at start-up (`secrets` feature) |
//! | [`event_source`] | the worker's event source mapping, the pause marker and the probe with a source message ([`sqs_keeper_core::polling`]) |
//! | [`visibility`] | `ChangeMessageVisibilityBatch` for spaced redelivery |
//! | [`store`] | the dead-letter store: records in DynamoDB, payloads in S3, the DLQ in SQS; implements every port and the primitives of [`sqs_keeper_core::recording`] and [`sqs_keeper_core::sweep`] |

pub mod aws;
pub mod breaker_table;
pub mod condition_expression;
pub mod event_source;
pub mod idempotency_table;
#[cfg(feature = "secrets")]
pub mod secrets;
pub mod store;
pub mod visibility;
