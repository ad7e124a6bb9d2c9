//! Every AWS SDK call of the library, behind the ports ([`crate::ports`],
//! [`crate::DeadLetterSink`], [`crate::batch::BodyResolver`]) and the core's primitive
//! traits ([`crate::recording::RecordTable`], [`crate::sweep::DlqMessages`]): the rest of
//! the crate decides, these modules talk to DynamoDB, SQS, S3, Lambda and Secrets Manager.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`aws`] | the AWS clients, built once from the standard configuration chain |
//! | [`breaker`] | the circuit breaker's shared state in DynamoDB |
//! | [`condition`] | the conditions of [`crate::condition`] sent with a DynamoDB request |
//! | [`idempotency`] | the idempotency table in DynamoDB |
//! | `secrets` | the downstream credential, read from Secrets Manager at start-up (`http` feature) |
//! | [`polling`] | the worker's event source mapping, the pause marker and the probe with a source message ([`crate::polling`]) |
//! | [`visibility`] | `ChangeMessageVisibilityBatch` for spaced redelivery |
//! | [`store`] | the dead-letter store: records in DynamoDB, payloads in S3, the DLQ in SQS; implements every port and the primitives of [`crate::recording`] and [`crate::sweep`] |

pub mod aws;
pub mod breaker;
pub mod condition;
pub mod idempotency;
pub mod polling;
#[cfg(feature = "http")]
pub mod secrets;
pub mod store;
pub mod visibility;
