//! JSON ⇄ DynamoDB attribute values, so records are stored as native maps, lists and
//! numbers (readable in the console, queryable) while the Rust types stay plain serde.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{Map, Number, Value};

/// Converts a JSON value to an attribute value.
pub fn to_attr(value: &Value) -> AttributeValue {
    match value {
        Value::Null => AttributeValue::Null(true),
        Value::Bool(b) => AttributeValue::Bool(*b),
        Value::Number(n) => AttributeValue::N(n.to_string()),
        Value::String(s) => AttributeValue::S(s.clone()),
        Value::Array(items) => AttributeValue::L(items.iter().map(to_attr).collect()),
        Value::Object(map) => AttributeValue::M(to_attr_map(map)),
    }
}

/// Converts a JSON object to an attribute map.
pub fn to_attr_map(map: &Map<String, Value>) -> HashMap<String, AttributeValue> {
    map.iter().map(|(k, v)| (k.clone(), to_attr(v))).collect()
}

/// Converts an attribute value back to JSON. Sets become arrays; binary becomes null (the
/// record schema has none).
pub fn from_attr(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::Null(_) => Value::Null,
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::N(n) => parse_number(n),
        AttributeValue::S(s) => Value::String(s.clone()),
        AttributeValue::L(items) => Value::Array(items.iter().map(from_attr).collect()),
        AttributeValue::M(map) => Value::Object(from_attr_map(map)),
        AttributeValue::Ss(items) => {
            Value::Array(items.iter().cloned().map(Value::String).collect())
        }
        AttributeValue::Ns(items) => Value::Array(items.iter().map(|n| parse_number(n)).collect()),
        _ => Value::Null,
    }
}

/// Converts an attribute map back to a JSON object.
pub fn from_attr_map(map: &HashMap<String, AttributeValue>) -> Map<String, Value> {
    map.iter().map(|(k, v)| (k.clone(), from_attr(v))).collect()
}

fn parse_number(n: &str) -> Value {
    if let Ok(i) = n.parse::<i64>() {
        Value::Number(i.into())
    } else if let Ok(u) = n.parse::<u64>() {
        Value::Number(u.into())
    } else {
        n.parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map_or(Value::Null, Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let doc = serde_json::json!({
            "s": "x", "n": 42, "neg": -7, "f": 1.5, "b": true, "null": null,
            "list": [1, "two", {"three": 3}], "map": {"inner": [false]}
        });
        let Value::Object(map) = &doc else {
            unreachable!()
        };
        let back = Value::Object(from_attr_map(&to_attr_map(map)));
        assert_eq!(back, doc);
    }
}
