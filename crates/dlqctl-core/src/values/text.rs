//! Small text and time helpers shared by the core.

/// `n` and the noun, singular for one: `1 message`, `3 messages`,
/// `0 messages` (the noun takes an `s`).
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
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

/// Whether `c` could change what a terminal shows beyond its own glyph:
/// C0 and C1 control characters, DEL, and the Unicode bidirectional
/// overrides and isolates (which reorder the rest of a line).
fn is_unsafe_on_terminal(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape_into(out: &mut String, c: char) {
    use std::fmt::Write as _;
    let _ = match c {
        '\n' => write!(out, "\\n"),
        '\r' => write!(out, "\\r"),
        '\t' => write!(out, "\\t"),
        // Every other one is below U+10000: `\uXXXX`, which is also what
        // it means inside a JSON string (serde_json leaves DEL, C1 and
        // bidi characters raw), so a JSON output stays the same JSON.
        c => write!(out, "\\u{:04x}", c as u32),
    };
}

/// `s` with every character that a terminal or a line-based log would
/// act on written as a visible escape: newline `\n`, carriage return
/// `\r`, tab `\t`, every other C0/C1 control, DEL and bidi override
/// `\uXXXX` (ESC is `\u001b`). A backslash is kept as it is. For one value
/// (a message id, a reason, an error) inside a line of text output.
pub fn escape_controls(s: &str) -> std::borrow::Cow<'_, str> {
    escape_where(s, is_unsafe_on_terminal)
}

/// Like [`escape_controls`] but keeps newlines and tabs: for whole
/// blocks of text output, whose lines the program itself separates.
pub fn escape_controls_keep_lines(s: &str) -> std::borrow::Cow<'_, str> {
    escape_where(s, |c| is_unsafe_on_terminal(c) && c != '\n' && c != '\t')
}

/// `s` with the characters `escape` picks written as escapes; borrowed
/// when it has none.
fn escape_where(s: &str, escape: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(&escape) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if escape(c) {
            escape_into(&mut out, c);
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Formats ms since the Unix epoch as RFC 3339 UTC with milliseconds:
/// `2023-11-14T22:13:20.123Z`. Years past 9999 get more digits (no panic).
pub fn rfc3339_millis(unix_ms: u64) -> String {
    let ms = unix_ms % 1000;
    let secs = unix_ms / 1000;
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (day_secs / 3600, day_secs % 3600 / 60, day_secs % 60);
    if year > 9999 {
        return format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{ms:03}Z");
    }
    // Written digit by digit: this runs for every retry copy, and format!
    // cost ten times as much.
    let mut b = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: u64| {
        for i in (at..at + width).rev() {
            b[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, hour);
    put(14, 2, minute);
    put(17, 2, second);
    put(20, 3, ms);
    b.iter().map(|&c| char::from(c)).collect()
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

/// Reads an RFC 3339 UTC time as [`rfc3339_millis`] writes it
/// (`2023-11-14T22:13:20.123Z`), also without the fraction or with 1 to 9
/// fractional digits (cut to milliseconds), and with `+00:00` for `Z`.
/// `None` for anything else, times before 1970 and fields out of range.
pub fn parse_rfc3339_millis(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<u64> {
        let t = b.get(r)?;
        if t.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(t).ok()?.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut ms = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        let padded = format!("{:0<3}", &frac[..digits.min(3)]);
        ms = padded.parse::<u64>().ok()?;
        rest = &frac[digits..];
    }
    if !matches!(rest, "Z" | "z" | "+00:00") {
        return None;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if year < 1970 || !(1..=12).contains(&month) || day == 0 {
        return None;
    }
    if day > month_days[(month - 1) as usize] || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(((days * 86_400 + hour * 3600 + minute * 60 + second) * 1000) + ms)
}

/// Days since 1970-01-01 of a date from 1970 on (H. Hinnant's algorithm).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_count_is_singular_for_one_only() {
        assert_eq!(super::count(0, "message"), "0 messages");
        assert_eq!(super::count(1, "message"), "1 message");
        assert_eq!(super::count(2, "binding"), "2 bindings");
    }

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

    #[test]
    fn control_characters_are_escaped_and_the_rest_is_kept() {
        assert_eq!(escape_controls("plain é 漢 \\ ok"), "plain é 漢 \\ ok");
        assert_eq!(
            escape_controls("a\u{1b}]0;pwned\u{7}b\nc\rd\te\u{0}f\u{7f}\u{9b}g\u{202e}h"),
            "a\\u001b]0;pwned\\u0007b\\nc\\rd\\te\\u0000f\\u007f\\u009bg\\u202eh"
        );
        assert_eq!(
            escape_controls_keep_lines("one\u{1b}[2J\ntwo\tthree\r\n"),
            "one\\u001b[2J\ntwo\tthree\\r\n"
        );
        for s in ["", "x", "\u{1b}", "\n\n", "é\u{85}"] {
            assert!(!escape_controls(s).chars().any(|c| c.is_control()), "{s:?}");
        }
        // Inside a JSON string the escapes mean the same characters.
        let json = serde_json::to_string("x\u{7f}\u{9b}\u{202e}y").unwrap();
        let escaped = escape_controls_keep_lines(&json);
        assert_ne!(escaped, json);
        assert_eq!(
            serde_json::from_str::<String>(&escaped).unwrap(),
            "x\u{7f}\u{9b}\u{202e}y"
        );
    }

    #[test]
    fn rfc3339_is_written_field_by_field_with_padding() {
        for (ms, text) in [
            (0u64, "1970-01-01T00:00:00.000Z"),
            (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (951_868_799_999, "2000-02-29T23:59:59.999Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
            (253_402_300_800_000, "10000-01-01T00:00:00.000Z"),
        ] {
            assert_eq!(rfc3339_millis(ms), text, "{ms}");
        }
        // Every day over four centuries, at a time of day that changes.
        for day in 0..146_097u64 {
            let ms = day * 86_400_000 + (day * 7_919_117) % 86_400_000;
            let (y, mo, d) = civil_from_days(day);
            let secs = ms / 1000 % 86_400;
            let want = format!(
                "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
                secs / 3600,
                secs % 3600 / 60,
                secs % 60,
                ms % 1000
            );
            assert_eq!(rfc3339_millis(ms), want);
        }
    }

    #[test]
    fn rfc3339_parses_what_dlqctl_writes_and_refuses_the_rest() {
        for ms in [
            0u64,
            999,
            1_700_000_000_123,
            951_782_400_000,
            4_102_444_799_999,
        ] {
            assert_eq!(parse_rfc3339_millis(&rfc3339_millis(ms)), Some(ms), "{ms}");
        }
        assert_eq!(parse_rfc3339_millis("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(parse_rfc3339_millis("1970-01-01T00:00:00.5Z"), Some(500));
        assert_eq!(
            parse_rfc3339_millis("1970-01-01T00:00:00.123456789+00:00"),
            Some(123)
        );
        for bad in [
            "",
            "yesterday",
            "1969-12-31T23:59:59Z",
            "2026-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00+01:00",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00.1234567890Z",
            "2026-01-01 00:00:00Z",
            "+026-01-01T00:00:00Z",
            "2026-01-01T00:00:00Zjunk",
        ] {
            assert_eq!(parse_rfc3339_millis(bad), None, "{bad}");
        }
        assert_eq!(
            parse_rfc3339_millis("2024-02-29T00:00:00Z"),
            Some(1_709_164_800_000)
        );
    }
}
