//! Times as the archive's readers give and show them: the one grammar of
//! `since` (`longhaul history --since`, the dashboard's `since=`) and the
//! one UTC format of a run's time. Calendar arithmetic is humantime's
//! (RFC 3339, leap years, month lengths); times are Unix seconds, as the
//! archive keeps them, and "now" is passed in.

use longhaul_proto::units;
use std::time::{Duration, UNIX_EPOCH};

/// What `since` takes, for help texts and errors.
pub const SINCE_FORMS: &str = "a duration ago with its unit (90s, 30m, 2h, 7d, 2w, or 1h30m) or a UTC date (2026-11-23, midnight) or date and time (2026-11-23T08:00:00Z)";

/// `since` as Unix seconds: a duration ago (`90s`, `30m`, `2h`, `7d`,
/// `2w`, `1h30m`, `1y`: [`units::parse_duration`], the grammar of every
/// option that takes a time) counted back from `now`, or a
/// UTC date (`2026-11-23`, its midnight) or date and time
/// (`2026-11-23T08:00:00`, a `Z` or not, `T` or a space). A bare number
/// is neither (seconds ago, or a Unix time?) and is refused, as is a date
/// the calendar does not have (`2026-02-31`). The error says what the
/// forms are; the caller names its option.
pub fn parse_since(s: &str, now: f64) -> Result<f64, String> {
    let s = s.trim();
    let bare_number = s.parse::<f64>().is_ok();
    if let (false, Ok(d)) = (bare_number, units::parse_duration(s)) {
        return Ok((now - d.as_secs_f64()).max(0.0));
    }
    let full = if s.len() == 10 {
        format!("{s}T00:00:00Z")
    } else {
        s.to_string()
    };
    let at =
        humantime::parse_rfc3339_weak(&full).map_err(|_| format!("{s:?} is not {SINCE_FORMS}"))?;
    Ok(at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64())
}

/// Unix seconds as `2026-11-23 20:15:07` (UTC); None before 1970, after
/// 9999 or for no number.
pub fn utc(t: f64) -> Option<String> {
    if !t.is_finite() || !(0.0..=253_402_300_799.0).contains(&t) {
        return None;
    }
    let at = UNIX_EPOCH + Duration::from_secs(t.floor() as u64);
    let s = humantime::format_rfc3339_seconds(at).to_string();
    Some(s.replacen('T', " ", 1).trim_end_matches('Z').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: f64 = 2_000_000_000.0;

    #[test]
    fn durations_count_back_from_now() {
        for (s, secs) in [
            ("90s", 90.0),
            ("30m", 1800.0),
            ("2h", 7200.0),
            ("7d", 7.0 * 86_400.0),
            ("2w", 14.0 * 86_400.0),
            ("1h30m", 5400.0),
            ("1h 30m", 5400.0),
        ] {
            assert_eq!(parse_since(s, NOW), Ok(NOW - secs), "{s}");
        }
        assert_eq!(parse_since("1000y", NOW), Ok(0.0));
    }

    #[test]
    fn dates_are_utc_and_the_calendar_is_checked() {
        assert_eq!(parse_since("1970-01-02", NOW), Ok(86_400.0));
        assert_eq!(parse_since("2026-11-23", NOW), Ok(1_795_392_000.0));
        assert_eq!(
            parse_since("2026-11-23T08:00:00Z", NOW),
            Ok(1_795_392_000.0 + 8.0 * 3600.0)
        );
        assert_eq!(
            parse_since("2026-11-23 08:00:00", NOW),
            Ok(1_795_392_000.0 + 8.0 * 3600.0)
        );
        // Leap years: every fourth, not the hundredth, but the four hundredth.
        assert!(parse_since("2024-02-29", NOW).is_ok());
        assert!(parse_since("2000-02-29", NOW).is_ok());
        for bad in [
            "2026-02-31",
            "2026-02-29",
            "2100-02-29",
            "2026-04-31",
            "2026-13-01",
            "2026-00-10",
            "2026-11-23T24:00:00",
        ] {
            let e = parse_since(bad, NOW).unwrap_err();
            assert!(e.contains("UTC date"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_bare_number_or_anything_else_is_refused_with_the_forms() {
        for bad in [
            "3600",
            "1700000000",
            "",
            "soon",
            "-2h",
            "2 hours ago",
            "2h;",
        ] {
            let e = parse_since(bad, NOW).unwrap_err();
            assert!(
                e.contains("30m, 2h, 7d") && e.contains("2026-11-23"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn utc_times_and_what_has_none() {
        assert_eq!(utc(0.0).as_deref(), Some("1970-01-01 00:00:00"));
        assert_eq!(utc(951_782_400.0).as_deref(), Some("2000-02-29 00:00:00"));
        assert_eq!(utc(951_868_800.0).as_deref(), Some("2000-03-01 00:00:00"));
        assert_eq!(utc(1_795_000_000.9).as_deref(), Some("2026-11-18 11:06:40"));
        assert_eq!(utc(-1.0), None);
        assert_eq!(utc(f64::NAN), None);
        assert_eq!(utc(1e12), None);
    }
}
