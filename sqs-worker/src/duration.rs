//! Human durations and points in time for operator input: `90s`, `15m`, `2h`, `7d`, `1w`,
//! or an RFC 3339 timestamp where a point in time is expected (`since`, `until`).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Parses `<number><unit>` with unit `s`, `m`, `h`, `d` or `w`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration; expected e.g. 90s, 15m, 2h, 7d or 1w"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        _ => {
            return Err(format!(
                "{text:?} has unit {unit:?}; expected s, m, h, d or w (e.g. 7d)"
            ))
        }
    };
    n.checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// Parses a point in time: an RFC 3339 timestamp, or a duration meaning that long before `now`.
pub fn parse_time(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text.trim()) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = parse_duration(text).map_err(|_| {
        format!("{text:?} is neither an RFC 3339 time (2026-11-21T08:00:00Z) nor a duration ago (e.g. 24h)")
    })?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .ok_or_else(|| format!("{text:?} reaches too far back"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        assert_eq!(parse_duration("1w").unwrap(), Duration::from_secs(604_800));
        assert!(parse_duration("7").unwrap_err().contains("unit"));
        assert!(parse_duration("seven days")
            .unwrap_err()
            .contains("not a duration"));
        assert!(parse_duration("3y").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn times() {
        let now = DateTime::parse_from_rfc3339("2026-11-21T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            parse_time("2h", now).unwrap().to_rfc3339(),
            "2026-11-21T10:00:00+00:00"
        );
        assert_eq!(
            parse_time("2026-11-01T00:00:00Z", now)
                .unwrap()
                .to_rfc3339(),
            "2026-11-01T00:00:00+00:00"
        );
        assert!(parse_time("yesterday", now).is_err());
    }
}
