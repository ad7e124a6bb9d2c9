//! A typed order processor that writes each order to DynamoDB exactly once.
//!
//! What it shows: a body read as a type ([`sqs_keeper::WorkItem::json`]: a body that does
//! not fit is dead-lettered on first sight, the serde path in its record); business
//! validation as a permanent failure; the handler's own AWS errors classified by `?`
//! (throttling retried, a missing table or a denied call dead-lettered); a conditional
//! write whose failed condition is an outcome, not an error (the order is already
//! stored: a duplicate delivery, or the same order sent twice); a custom metric and log
//! fields written with the worker's own lines.

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use serde::Deserialize;
use sqs_keeper::context::{self, Unit};
use sqs_keeper::{Outcome, ProcessError, Processor, WorkItem};

/// An order as producers send it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Order {
    /// The order's id: the table's key.
    pub order_id: String,
    /// Who placed it.
    pub customer: String,
    /// What was ordered.
    pub lines: Vec<Line>,
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Line {
    /// The product.
    pub sku: String,
    /// How many.
    pub qty: u32,
    /// The price of one, in cents.
    pub unit_price_cents: u64,
}

impl Order {
    /// The order's total, or why the order can never be stored: no lines, a line of
    /// nothing, a total that does not fit in 64 bits. Such an order is dead-lettered at
    /// once: retrying cannot make it valid.
    pub fn total_cents(&self) -> Result<u64, ProcessError> {
        if self.order_id.is_empty() {
            return Err(ProcessError::validation("the order has an empty order_id"));
        }
        if self.lines.is_empty() {
            return Err(ProcessError::validation(format!(
                "order {} has no lines",
                self.order_id
            )));
        }
        self.lines.iter().try_fold(0u64, |total, line| {
            if line.qty == 0 {
                return Err(ProcessError::validation(format!(
                    "order {}: line {} has quantity 0",
                    self.order_id, line.sku
                )));
            }
            u64::from(line.qty)
                .checked_mul(line.unit_price_cents)
                .and_then(|amount| total.checked_add(amount))
                .ok_or_else(|| {
                    ProcessError::validation(format!(
                        "order {}: the total does not fit in 64 bits",
                        self.order_id
                    ))
                })
        })
    }
}

/// Stores orders in a DynamoDB table whose partition key is `order_id` (a string).
#[derive(Debug, Clone)]
pub struct Orders {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl Orders {
    /// Orders stored in `table` through `client`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        Orders {
            client,
            table: table.into(),
        }
    }
}

impl Processor for Orders {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let order: Order = item.json()?;
        let total = order.total_cents()?;
        context::add_field("order_id", order.order_id.as_str());
        context::add_field("customer", order.customer.as_str());
        let stored = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("order_id", AttributeValue::S(order.order_id.clone()))
            .item("customer", AttributeValue::S(order.customer.clone()))
            .item("total_cents", AttributeValue::N(total.to_string()))
            .item("lines", AttributeValue::N(order.lines.len().to_string()))
            .item("item_id", AttributeValue::S(item.item_id.clone()))
            // Written once: a second delivery of the same order changes nothing.
            .condition_expression("attribute_not_exists(order_id)")
            .send()
            .await;
        match stored {
            Ok(_) => {
                context::add_metric("OrderValueCents", Unit::None, total as f64);
                Ok(Outcome::Done)
            }
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), PutItemError::ConditionalCheckFailedException(_)) =>
            {
                // The table's answer that the order is there: done before, by another
                // delivery (and, behind the breaker, proof the table answers).
                Ok(Outcome::AlreadyDone {
                    reason: format!("order {} is already stored", order.order_id),
                })
            }
            // Throttling and 5xx: retried; a missing table or a denied call: dead-lettered.
            Err(other) => Err(other.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(lines: &str) -> WorkItem {
        WorkItem::new(
            "m-1",
            format!(r#"{{"order_id":"o-1","customer":"c-1","lines":{lines}}}"#),
        )
    }

    #[test]
    fn totals_and_what_can_never_be_stored() {
        let ok: Order = order(r#"[{"sku":"a","qty":2,"unit_price_cents":250}]"#)
            .json()
            .unwrap();
        assert_eq!(ok.total_cents().unwrap(), 500);
        for lines in [
            "[]",
            r#"[{"sku":"a","qty":0,"unit_price_cents":1}]"#,
            r#"[{"sku":"a","qty":4294967295,"unit_price_cents":18446744073709551615}]"#,
        ] {
            let order: Order = order(lines).json().unwrap();
            let error = order.total_cents().unwrap_err();
            assert_eq!(error.class, sqs_keeper::ErrorClass::Validation, "{lines}");
        }
    }

    #[test]
    fn a_body_that_does_not_fit_names_the_field() {
        let error = order(r#"[{"sku":"a","qty":"2","unit_price_cents":1}]"#)
            .json::<Order>()
            .unwrap_err();
        assert_eq!(error.class, sqs_keeper::ErrorClass::Validation);
        assert!(error.message.contains("lines[0].qty"), "{}", error.message);
        assert!(error.message.contains("Order"), "{}", error.message);
    }
}
