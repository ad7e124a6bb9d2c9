//! Sends a [`crate::condition::Condition`] with a DynamoDB request: its rendered text as
//! the request's condition expression, its placeholders beside the request's own. The
//! conditions themselves are defined once in [`crate::condition::conditions`], where the
//! in-memory stores evaluate them too.

use aws_sdk_dynamodb::types::AttributeValue;

use crate::condition::{Condition, Value};

/// A DynamoDB value for a condition's value.
pub fn attribute(value: &Value) -> AttributeValue {
    match value {
        Value::S(s) => AttributeValue::S(s.clone()),
        Value::N(n) => AttributeValue::N(n.to_string()),
    }
}

/// A request that takes a condition expression and its placeholders.
pub trait WithCondition: Sized {
    /// The request with `condition` as its condition expression (none when it always
    /// holds).
    fn with_condition(self, condition: &Condition) -> Self;
}

macro_rules! with_condition {
    ($($builder:ty),* $(,)?) => {$(
        impl WithCondition for $builder {
            fn with_condition(self, condition: &Condition) -> Self {
                let Some(rendered) = condition.render() else {
                    return self;
                };
                let mut request = self.condition_expression(rendered.text);
                for (key, name) in rendered.names {
                    request = request.expression_attribute_names(key, name);
                }
                for (key, value) in &rendered.values {
                    request = request.expression_attribute_values(key.clone(), attribute(value));
                }
                request
            }
        }
    )*};
}

with_condition!(
    aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
    aws_sdk_dynamodb::operation::put_item::builders::PutItemFluentBuilder,
    aws_sdk_dynamodb::operation::delete_item::builders::DeleteItemFluentBuilder,
    aws_sdk_dynamodb::types::builders::UpdateBuilder,
    aws_sdk_dynamodb::types::builders::ConditionCheckBuilder,
);
