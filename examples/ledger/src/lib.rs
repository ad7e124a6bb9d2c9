//! Account movements from an SNS FIFO topic, applied in order from an SQS FIFO queue.
//!
//! The topic publishes each movement with the account as its message group, so SQS FIFO
//! hands one account's movements to one invocation at a time, in order; the worker runs a
//! FIFO batch record by record and, after a failure, returns the rest for retry
//! (`WORKER_SKIP_GROUP_ON_ERROR=true` holds back only the failed account's).
//!
//! What it shows: `WORKER_ENVELOPE=sns` unwraps the SNS notification (raw message delivery
//! off) and keys each item by the SNS message id; the topic is on the item
//! ([`sqs_keeper::envelope::Layer::Sns`]); a body that is not an SNS notification is
//! dead-lettered as a validation failure with the body as it arrived; and a replayed
//! movement (the same `seq` again) is recognised by a conditional write and skipped.

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use serde::Deserialize;
use sqs_keeper::envelope::Layer;
use sqs_keeper::{context, Outcome, ProcessError, Processor, WorkItem};

/// One movement of an account's balance.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Movement {
    /// The account: the SNS/SQS message group.
    pub account: String,
    /// The movement's position in the account's stream, from 1.
    pub seq: u64,
    /// The amount, in cents (negative for a debit).
    pub amount_cents: i64,
}

/// Balances in a DynamoDB table whose partition key is `account` (a string).
#[derive(Debug, Clone)]
pub struct Ledger {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl Ledger {
    /// Balances in `table` through `client`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        Ledger {
            client,
            table: table.into(),
        }
    }
}

impl Processor for Ledger {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let movement: Movement = item.json()?;
        if movement.seq == 0 {
            return Err(ProcessError::validation("seq starts at 1"));
        }
        let topic = item.envelope.as_ref().and_then(|e| {
            e.layers.iter().find_map(|layer| match layer {
                Layer::Sns { topic_arn, .. } => Some(topic_arn.clone()),
                _ => None,
            })
        });
        context::add_field("account", movement.account.as_str());
        context::add_field("topic", topic.unwrap_or_default());
        let applied = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("account", AttributeValue::S(movement.account.clone()))
            .update_expression("SET balance_cents = if_not_exists(balance_cents, :zero) + :amount, last_seq = :seq")
            // Each movement once: one already applied (a replay) fails the condition.
            .condition_expression("attribute_not_exists(last_seq) OR last_seq < :seq")
            .expression_attribute_values(":zero", AttributeValue::N("0".into()))
            .expression_attribute_values(":amount", AttributeValue::N(movement.amount_cents.to_string()))
            .expression_attribute_values(":seq", AttributeValue::N(movement.seq.to_string()))
            .send()
            .await;
        match applied {
            Ok(_) => Ok(Outcome::Done),
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
            {
                Ok(Outcome::AlreadyDone {
                    reason: format!(
                        "movement {} of {} was already applied",
                        movement.seq, movement.account
                    ),
                })
            }
            Err(other) => Err(other.into()),
        }
    }
}
