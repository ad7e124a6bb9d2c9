//! Every AWS SDK call of the library, behind the ports ([`sqs_keeper_core::ports`],
//! [`sqs_keeper_core::DeadLetterSink`], [`sqs_keeper_core::batch::BodyResolver`]) and the core's primitive
//! traits ([`sqs_keeper_core::recording::RecordTable`], [`sqs_keeper_core::sweep::DlqMessages`]): the rest of
//! the crate decides, these modules talk to DynamoDB, SQS, S3, Lambda and Secrets Manager.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`aws`] | the AWS clients, built once from the standard configuration chain |
//! | [`breaker`] | the circuit breaker's shared state in DynamoDB |
//! | [`condition`] | the conditions of [`sqs_keeper_core::condition`] sent with a DynamoDB request |
//! | [`idempotency`] | the idempotency table in DynamoDB |
//! | `secrets` | the downstream credential, read from Secrets Manager at start-up (`secrets` feature) |
//! | [`polling`] | the worker's event source mapping, the pause marker and the probe with a source message ([`sqs_keeper_core::polling`]) |
//! | [`visibility`] | `ChangeMessageVisibilityBatch` for spaced redelivery |
//! | [`store`] | the dead-letter store: records in DynamoDB, payloads in S3, the DLQ in SQS; implements every port and the primitives of [`sqs_keeper_core::recording`] and [`sqs_keeper_core::sweep`] |

pub mod aws;
pub mod breaker;
pub mod condition;
pub mod idempotency;
pub mod polling;
#[cfg(feature = "secrets")]
pub mod secrets;
pub mod store;
pub mod visibility;
