//! Human durations and points in time for operator input: `90s`, `15m`, `2h`, `7d`, `1w`
//! (and what else `humantime` reads: `1h 30m`, `2days`, `1.5h`), or an RFC 3339 timestamp
//! where a point in time is expected (`since`, `until`).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Month and year units, which `humantime` reads as averages (30.44 and 365.25 days):
/// refused, so that "older than" means an exact span; days and weeks say it exactly.
const CALENDAR_UNITS: &[&str] = &["M", "month", "months", "y", "yr", "yrs", "year", "years"];

/// Parses a duration as `humantime` does (`<number><unit>`, units such as `s`, `m`, `h`,
/// `d`, `w`, several of them in a row), without month or year units.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let expected = "expected e.g. 90s, 15m, 2h, 7d or 1w";
    let duration = humantime::parse_duration(text).map_err(|e| match e {
        humantime::DurationError::UnknownUnit { unit, .. } if unit.is_empty() => {
            format!("{text:?} needs a unit; {expected}")
        }
        humantime::DurationError::UnknownUnit { unit, .. } => {
            format!("{text:?} has unit {unit:?}; {expected}")
        }
        humantime::DurationError::NumberOverflow => format!("{text:?} is too long"),
        _ => format!("{text:?} is not a duration; {expected}"),
    })?;
    let calendar = text
        .split(|c: char| !c.is_alphabetic())
        .find(|unit| CALENDAR_UNITS.contains(unit));
    match calendar {
        Some(unit) => Err(format!(
            "{text:?} has unit {unit:?}, which is not a fixed length; use days or weeks (e.g. 30d)"
        )),
        None => Ok(duration),
    }
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
    fn durations_humantime_reads() {
        assert_eq!(
            parse_duration(" 7d ").unwrap(),
            Duration::from_secs(604_800)
        );
        assert_eq!(
            parse_duration("1h 30m").unwrap(),
            Duration::from_secs(5_400)
        );
        assert_eq!(
            parse_duration("2days").unwrap(),
            Duration::from_secs(172_800)
        );
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        for calendar in ["1M", "2months", "1y", "1year", "1d 1y"] {
            assert!(
                parse_duration(calendar)
                    .unwrap_err()
                    .contains("not a fixed length"),
                "{calendar}"
            );
        }
        assert!(parse_duration("7 parsecs").unwrap_err().contains("unit"));
        assert!(parse_duration("").unwrap_err().contains("not a duration"));
        assert!(parse_duration("-1d")
            .unwrap_err()
            .contains("not a duration"));
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
