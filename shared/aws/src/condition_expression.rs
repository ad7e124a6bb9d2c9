//! Sends a [`sqs_keeper_core::condition::Condition`] with a DynamoDB request: its rendered text as
//! the request's condition expression, its placeholders beside the request's own. The
//! conditions themselves are defined once in [`sqs_keeper_core::condition::conditions`], where the
//! in-memory stores evaluate them too.

use aws_sdk_dynamodb::types::AttributeValue;

use sqs_keeper_core::{condition::Condition, condition::Value};

/// Returns a DynamoDB value for a condition's value.
pub fn attribute(value: &Value) -> AttributeValue {
    match value {
        Value::S(s) => AttributeValue::S(s.clone()),
        Value::N(n) => AttributeValue::N(n.to_string()),
    }
}

/// A request that takes a condition expression and its placeholders.
pub trait WithCondition: Sized {
    /// Returns the request with `condition` as its condition expression (none when it always
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

/// `StoredRecord`'s view of a record is what `schema::record_to_item` writes, attribute by
/// attribute (the in-memory stores read records as the adapter writes them).
#[cfg(test)]
mod tests {
    use crate::store::schema;
    use aws_sdk_dynamodb::types::AttributeValue;
    use sqs_keeper_core::{
        condition::attr, condition::names, condition::Attr, condition::Condition, condition::Found,
        condition::Item as _, condition::StoredRecord,
    };

    /// The attribute at `attr` in a written item, as the conditions would find it.
    fn written(
        item: &std::collections::HashMap<String, AttributeValue>,
        attr: Attr,
    ) -> Option<String> {
        let mut value = item.get(attr.0[0])?;
        for name in &attr.0[1..] {
            value = value.as_m().ok()?.get(*name)?;
        }
        Some(match value {
            AttributeValue::S(s) => format!("S:{s}"),
            AttributeValue::N(n) => format!("N:{n}"),
            AttributeValue::L(l) => format!("L:{}", l.len()),
            other => format!("{other:?}"),
        })
    }

    fn viewed(stored: &StoredRecord<'_>, attr: Attr) -> Option<String> {
        Some(match stored.at(attr)? {
            Found::S(s) => format!("S:{s}"),
            Found::N(n) => format!("N:{n}"),
            Found::Strings(_) => "strings".to_string(),
            Found::Other => "other".to_string(),
        })
    }

    #[test]
    fn stored_record_sees_each_attribute_as_record_to_item_writes_it() {
        let mut variants = Vec::new();
        let full = schema::tests::full_record();
        variants.push(("full", full.clone()));
        let mut bare = full;
        bare.processed = Vec::new();
        bare.requeued_message_id = None;
        bare.lease_expires_at = None;
        variants.push(("no processed, not requeued, no lease", bare));
        let attrs = [
            attr::ITEM_ID,
            attr::STATUS,
            attr::LAST_ATTEMPT,
            attr::FAILURE_COUNT,
            attr::PROCESSED,
            attr::REQUEUED_MESSAGE_ID,
            attr::LEASE_EXPIRES_AT,
            attr::PAYLOAD_SHA256,
            attr::SOURCE_MESSAGE_ID,
        ];
        let mut mismatches = Vec::new();
        for (name, record) in &variants {
            let item = schema::record_to_item(record).unwrap();
            let stored = StoredRecord {
                record,
                lease_owner: None,
                attempt_ids: None,
                claims: None,
                sent: None,
            };
            for a in attrs {
                let w = written(&item, a);
                let v = viewed(&stored, a);
                // A list is read as strings: compare existence; scalars by value.
                let agree = match (&w, &v) {
                    (Some(w), Some(v)) if w.starts_with("L:") => v == "strings",
                    (w, v) => w == v,
                };
                if !agree {
                    mismatches.push(format!("{name}: {:?} written {w:?}, viewed {v:?}", a.0));
                }
            }
        }
        assert!(mismatches.is_empty(), "{mismatches:#?}");
    }

    /// The consequence, as DynamoDB reads it: on a record written with no processed keys,
    /// `attribute_exists(processed)` is false; the in-memory reading says true.
    #[test]
    fn attribute_exists_on_an_empty_processed_list_agrees_with_the_written_item() {
        let mut record = schema::tests::full_record();
        record.processed = Vec::new();
        let item = schema::record_to_item(&record).unwrap();
        let stored = StoredRecord {
            record: &record,
            lease_owner: None,
            attempt_ids: None,
            claims: None,
            sent: None,
        };
        let on_dynamodb = item.contains_key(names::PROCESSED);
        let in_memory = Condition::Exists(attr::PROCESSED).holds(Some(&stored));
        assert_eq!(in_memory, on_dynamodb, "attribute_exists(processed)");
    }
}
