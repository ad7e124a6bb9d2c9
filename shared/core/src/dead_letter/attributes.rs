//! A source message's attributes as a record keeps them: typed, bounded in total size
//! (`ATTRIBUTES_LIMIT`), and read back as SQS sends them.

use super::*;

/// Most bytes of message attributes (names and values) a record keeps.
pub const ATTRIBUTES_LIMIT: usize = 16 * 1024;

/// One message attribute as SQS carries it, typed by its value: a string, a number (kept
/// as the text sent), or binary data (base64). Each keeps its full data type (`String`,
/// `Number`, `Binary`, or one of those with a custom suffix such as `Number.int`), so a
/// requeue sends it back as it came. Stored as `{data_type, string_value | binary_value}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredAttribute", into = "TypedAttribute")]
#[non_exhaustive]
pub enum MessageAttribute {
    /// A `String` attribute.
    String {
        /// Its data type.
        data_type: String,
        /// Its value.
        value: String,
    },
    /// A `Number` attribute: SQS numbers have up to 38 digits, so the text is kept as is.
    Number {
        /// Its data type.
        data_type: String,
        /// Its value, as sent.
        value: String,
    },
    /// A `Binary` attribute.
    Binary {
        /// Its data type.
        data_type: String,
        /// Its value, base64.
        base64: String,
    },
    /// An attribute whose value was not kept (records written before attribute values were
    /// typed kept only a binary value's type): it cannot be sent again.
    Unkept {
        /// Its data type.
        data_type: String,
    },
}

impl MessageAttribute {
    /// Returns a `String` attribute.
    pub fn string(value: impl Into<String>) -> Self {
        MessageAttribute::String {
            data_type: "String".to_string(),
            value: value.into(),
        }
    }

    /// Creates the attribute from SQS's three fields: binary when it has a binary value, a number
    /// when its type is `Number…`, a string otherwise; unkept when it has no value.
    pub fn from_parts(
        data_type: String,
        string_value: Option<String>,
        binary_base64: Option<String>,
    ) -> Self {
        match (binary_base64, string_value) {
            (Some(base64), _) => MessageAttribute::Binary { data_type, base64 },
            (None, Some(value)) if data_type.starts_with("Number") => {
                MessageAttribute::Number { data_type, value }
            }
            (None, Some(value)) => MessageAttribute::String { data_type, value },
            (None, None) => MessageAttribute::Unkept { data_type },
        }
    }

    /// Returns its SQS data type.
    pub fn data_type(&self) -> &str {
        match self {
            MessageAttribute::String { data_type, .. }
            | MessageAttribute::Number { data_type, .. }
            | MessageAttribute::Binary { data_type, .. }
            | MessageAttribute::Unkept { data_type } => data_type,
        }
    }

    /// Returns the value of a string or number attribute.
    pub fn string_value(&self) -> Option<&str> {
        match self {
            MessageAttribute::String { value, .. } | MessageAttribute::Number { value, .. } => {
                Some(value)
            }
            _ => None,
        }
    }

    /// Returns the value of a binary attribute, base64.
    pub fn binary_base64(&self) -> Option<&str> {
        match self {
            MessageAttribute::Binary { base64, .. } => Some(base64),
            _ => None,
        }
    }

    /// Tells whether the attribute has a value that can be sent again.
    pub fn is_restorable(&self) -> bool {
        !matches!(self, MessageAttribute::Unkept { .. })
    }

    fn size(&self) -> usize {
        self.data_type().len()
            + self.string_value().map_or(0, str::len)
            + self.binary_base64().map_or(0, str::len)
    }
}

/// The stored shape of an attribute (and of SQS's API): a data type and one value field.
#[derive(Serialize)]
struct TypedAttribute {
    data_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    string_value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    binary_value: Option<String>,
}

impl From<MessageAttribute> for TypedAttribute {
    fn from(attribute: MessageAttribute) -> Self {
        let (data_type, string_value, binary_value) = match attribute {
            MessageAttribute::String { data_type, value }
            | MessageAttribute::Number { data_type, value } => (data_type, Some(value), None),
            MessageAttribute::Binary { data_type, base64 } => (data_type, None, Some(base64)),
            MessageAttribute::Unkept { data_type } => (data_type, None, None),
        };
        TypedAttribute {
            data_type,
            string_value,
            binary_value,
        }
    }
}

/// How attributes were stored: typed, or (records written before types were kept) a plain
/// string, where `<Binary>` stood for a binary value that was not kept.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredAttribute {
    Typed {
        data_type: String,
        #[serde(default)]
        string_value: Option<String>,
        #[serde(default)]
        binary_value: Option<String>,
    },
    Legacy(String),
}

impl From<StoredAttribute> for MessageAttribute {
    fn from(stored: StoredAttribute) -> Self {
        match stored {
            StoredAttribute::Typed {
                data_type,
                string_value,
                binary_value,
            } => MessageAttribute::from_parts(data_type, string_value, binary_value),
            StoredAttribute::Legacy(marker) if marker.starts_with('<') && marker.ends_with('>') => {
                MessageAttribute::Unkept {
                    data_type: marker.trim_matches(['<', '>']).to_string(),
                }
            }
            StoredAttribute::Legacy(value) => MessageAttribute::string(value),
        }
    }
}

/// Bytes a stored attribute takes beyond its name, type and value: its map's keys
/// (`data_type`, `string_value`) and DynamoDB's per-element overhead.
const STORED_ATTRIBUTE_OVERHEAD: usize = 40;

/// Returns the record's copy of a delivery's attributes: typed, and capped at [`ATTRIBUTES_LIMIT`]
/// (in name order, the first that fit); returns them and how many were left out.
pub fn capped_attributes(
    attributes: &HashMap<String, aws_lambda_events::sqs::SqsMessageAttribute>,
) -> (BTreeMap<String, MessageAttribute>, u32) {
    let typed: BTreeMap<String, MessageAttribute> = attributes
        .iter()
        .map(|(name, a)| {
            (
                name.clone(),
                MessageAttribute::from_parts(
                    a.data_type.clone().unwrap_or_else(|| "String".to_string()),
                    a.string_value.clone(),
                    a.binary_value
                        .as_ref()
                        .map(|b| aws_smithy_types::base64::encode(&b.0)),
                ),
            )
        })
        .collect();
    let mut kept = BTreeMap::new();
    let mut used = 0;
    let mut omitted = 0u32;
    for (name, attribute) in typed {
        // What the record stores beside the name and value: the map of `data_type` and
        // `string_value` (or `binary_value`) keys, as DynamoDB counts it.
        let size = name.len() + attribute.size() + STORED_ATTRIBUTE_OVERHEAD;
        if used + size <= ATTRIBUTES_LIMIT {
            used += size;
            kept.insert(name, attribute);
        } else {
            omitted += 1;
        }
    }
    (kept, omitted)
}

#[cfg(test)]
mod stored_size_tests {
    /// Many small attributes (a hand-built event's) are stored within the cap: the map
    /// each is stored as counts too. Counted by name and value alone, 5,000 one-character
    /// attributes were stored in 75,355 bytes, 4.6 times the cap.
    #[test]
    fn capped_attributes_are_stored_within_their_limit() {
        let attributes: std::collections::HashMap<_, _> = (0..5000)
            .map(|n| {
                let a: aws_lambda_events::sqs::SqsMessageAttribute = serde_json::from_value(
                    serde_json::json!({"stringValue": "x", "dataType": "String"}),
                )
                .unwrap_or_default();
                (format!("{n:x}"), a)
            })
            .collect();
        let (kept, omitted) = super::capped_attributes(&attributes);
        let stored = serde_json::to_string(&kept).map(|s| s.len()).unwrap_or(0);
        assert!(
            stored <= super::ATTRIBUTES_LIMIT,
            "{} kept, {stored} bytes",
            kept.len()
        );
        assert_eq!(kept.len() + omitted as usize, 5000);
    }
}
