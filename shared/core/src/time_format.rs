//! Timestamps as fixed-width RFC 3339 with milliseconds (`2026-11-21T05:24:19.123Z`), so
//! that stored strings sort in time order (the DynamoDB index sort keys rely on it).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serializer};

/// Formats a timestamp for storage.
pub fn format(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Serializes a `DateTime<Utc>` (a serde `with` function).
pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(t))
}

/// Deserializes a `DateTime<Utc>` (a serde `with` function).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
    let text = String::deserialize(d)?;
    DateTime::parse_from_rfc3339(&text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(serde::de::Error::custom)
}

/// The same for `Option<DateTime<Utc>>`.
pub mod option {
    use super::*;

    /// Serialises `None` as null.
    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&super::format(t)),
            None => s.serialize_none(),
        }
    }

    /// Accepts null or a timestamp string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| {
                DateTime::parse_from_rfc3339(&text)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(serde::de::Error::custom)
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fixed_width_sorts_in_time_order() {
        let a = chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap();
        let b = chrono::DateTime::from_timestamp_millis(1_700_000_000_500).unwrap();
        assert_eq!(super::format(&a), "2023-11-14T22:13:20.000Z");
        assert!(super::format(&a) < super::format(&b));
    }
}
