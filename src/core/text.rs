//! Small text and time helpers shared by the core.

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The longest suffix of `s` of at most `max` bytes that starts on a
/// character boundary: the end of an error (the last lines of a stderr) is
/// what says what went wrong.
pub fn tail_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Formats ms since the Unix epoch as RFC 3339 UTC with milliseconds:
/// `2023-11-14T22:13:20.123Z`. Years past 9999 get more digits (no panic).
pub fn rfc3339_millis(unix_ms: u64) -> String {
    let ms = unix_ms % 1000;
    let secs = unix_ms / 1000;
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60
    )
}

/// Year, month, day of a day count since 1970-01-01 (H. Hinnant's
/// algorithm, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end_on_a_character_boundary() {
        assert_eq!(tail_utf8("abc", 5), "abc");
        assert_eq!(tail_utf8("abcdef", 3), "def");
        // "é" is two bytes: a cut inside it moves forward.
        assert_eq!(tail_utf8("aébc", 3), "bc");
        assert_eq!(tail_utf8("aébc", 4), "ébc");
        assert_eq!(tail_utf8("", 0), "");
        for max in 0..12 {
            let t = tail_utf8("ééééé", max);
            assert!(t.len() <= max && "ééééé".ends_with(t));
        }
    }
}
