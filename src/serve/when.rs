//! Times as the page says them: "3 min ago", the exact time kept for the
//! hover. Pure: the page passes its clock in.

const SECOND: u64 = 1000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// A length of time in its largest whole unit, rounded down: `40 s`,
/// `3 min`, `5 h`, `1 day`, `12 days`.
pub fn span(ms: u64) -> String {
    if ms < MINUTE {
        format!("{} s", ms / SECOND)
    } else if ms < HOUR {
        format!("{} min", ms / MINUTE)
    } else if ms < DAY {
        format!("{} h", ms / HOUR)
    } else if ms < 2 * DAY {
        "1 day".to_string()
    } else {
        format!("{} days", ms / DAY)
    }
}

/// How long before `now_ms` the time `at_ms` was: `just now` (under a
/// second), `40 s ago`, `3 min ago`; a time ahead of this clock by a
/// second or more (another machine's clock) is `in 5 s`.
pub fn ago(at_ms: u64, now_ms: u64) -> String {
    if at_ms >= now_ms + SECOND {
        format!("in {}", span(at_ms - now_ms))
    } else if now_ms.saturating_sub(at_ms) < SECOND {
        "just now".to_string()
    } else {
        format!("{} ago", span(now_ms - at_ms))
    }
}

#[cfg(test)]
/// [`ago`] of an RFC 3339 time as a message's headers carry it; `None`
/// when it does not read as one.
pub fn ago_text(at: &str, now_ms: u64) -> Option<String> {
    dlqctl::core::values::text::parse_rfc3339_millis(at).map(|ms| ago(ms, now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_said_in_its_largest_whole_unit() {
        assert_eq!(span(0), "0 s");
        assert_eq!(span(59_999), "59 s");
        assert_eq!(span(MINUTE), "1 min");
        assert_eq!(span(3 * MINUTE + 59 * SECOND), "3 min");
        assert_eq!(span(HOUR - 1), "59 min");
        assert_eq!(span(HOUR), "1 h");
        assert_eq!(span(DAY - 1), "23 h");
        assert_eq!(span(DAY), "1 day");
        assert_eq!(span(2 * DAY - 1), "1 day");
        assert_eq!(span(12 * DAY + HOUR), "12 days");
    }

    #[test]
    fn ago_says_how_long_before_now_and_a_clock_ahead_says_in() {
        let now = 1_000 * DAY;
        assert_eq!(ago(now, now), "just now");
        assert_eq!(ago(now - 999, now), "just now");
        assert_eq!(ago(now + 999, now), "just now");
        assert_eq!(ago(now - SECOND, now), "1 s ago");
        assert_eq!(ago(now - 3 * MINUTE - 10 * SECOND, now), "3 min ago");
        assert_eq!(ago(now - 2 * HOUR, now), "2 h ago");
        assert_eq!(ago(now - 3 * DAY, now), "3 days ago");
        assert_eq!(ago(now + 5 * SECOND, now), "in 5 s");
        assert_eq!(ago(0, 500), "just now");
    }

    #[test]
    fn ago_text_reads_the_headers_times_and_refuses_the_rest() {
        let now = dlqctl::core::values::text::parse_rfc3339_millis("2026-01-01T00:03:00Z").unwrap();
        assert_eq!(
            ago_text("2026-01-01T00:00:00.000Z", now).as_deref(),
            Some("3 min ago")
        );
        assert_eq!(
            ago_text("2025-12-31T23:00:00+00:00", now).as_deref(),
            Some("1 h ago")
        );
        assert_eq!(ago_text("yesterday", now), None);
        assert_eq!(ago_text("", now), None);
    }
}
