//! Durations as the topology file and the command line write them:
//! `500ms`, `30s`, `10m`, `2h`, `14d`.

/// Largest duration dlqctl accepts anywhere: the broker bound on
/// `x-message-ttl` and per-message `expiration` (2^32 − 1 ms).
pub(crate) const MAX_MILLIS: u64 = 4_294_967_295;

const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// A duration parse failure, with a message a user can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (write it as a whole number and a unit: 500ms, 30s, 10m, 2h, 14d)")]
pub struct DurationError {
    /// What was given.
    pub input: String,
    /// Why it was refused.
    pub reason: &'static str,
}

/// Parses `500ms`, `30s`, `10m`, `2h` or `14d` into milliseconds.
///
/// Only a whole number followed by one unit is accepted; no fractions, no
/// signs, no compound forms. Overflow is an error, not a wrap.
pub fn parse_millis(input: &str) -> Result<u64, DurationError> {
    let err = |reason| DurationError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(digits_end);
    if num.is_empty() {
        return Err(err("it does not start with a whole number"));
    }
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => return Err(err("the unit is missing")),
        _ => return Err(err("unknown unit")),
    };
    let n: u64 = num.parse().map_err(|_| err("the number is too large"))?;
    n.checked_mul(factor)
        .ok_or_else(|| err("the number is too large"))
}

/// Formats milliseconds in the largest of `d`, `h`, `m`, `s`, `ms` that
/// divides it exactly: `90s`, `1500ms`, `10m`, `2h`. This is a retry tier's
/// name and routing key.
pub fn tier_name(millis: u64) -> String {
    if millis == 0 {
        return "0ms".to_string();
    }
    for (unit, factor) in UNITS {
        if millis.is_multiple_of(factor) {
            return format!("{}{}", millis / factor, unit);
        }
    }
    unreachable!("the ms unit divides every integer")
}

/// A clap `value_parser` for durations given on the command line.
pub fn parse_cli_duration(input: &str) -> Result<std::time::Duration, DurationError> {
    parse_millis(input).map(std::time::Duration::from_millis)
}

/// A clap `value_parser` for a timeout: a duration above zero (a zero
/// timeout would end every run at once).
pub fn parse_cli_timeout(input: &str) -> Result<std::time::Duration, super::Invalid> {
    match parse_cli_duration(input).map_err(|e| super::Invalid(e.to_string()))? {
        d if d.is_zero() => Err(super::Invalid(format!(
            "`{input}` is zero: every run would time out at once; give a duration above 0, e.g. 30s"
        ))),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_timeout_is_refused_and_others_pass() {
        for zero in ["0ms", "0s", "0m", "0h", "0d"] {
            let e = parse_cli_timeout(zero).unwrap_err();
            assert!(e.to_string().contains("is zero"), "{zero}: {e}");
        }
        assert_eq!(
            parse_cli_timeout("1ms"),
            Ok(std::time::Duration::from_millis(1))
        );
        assert!(parse_cli_timeout("soon").is_err());
    }

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("10m"), Ok(600_000));
        assert_eq!(parse_millis("2h"), Ok(7_200_000));
        assert_eq!(parse_millis("14d"), Ok(1_209_600_000));
        assert_eq!(parse_millis("0s"), Ok(0));
        assert_eq!(parse_millis(" 1s "), Ok(1000));
    }

    #[test]
    fn refuses_malformed_input() {
        for bad in [
            "", "s", "10", "1.5s", "-1s", "10 s", "10sec", "1h30m", "ms10", "+1s", "1S",
        ] {
            let e = parse_millis(bad).unwrap_err();
            assert_eq!(e.input, bad);
        }
        assert_eq!(
            parse_millis("10").unwrap_err().reason,
            "the unit is missing"
        );
        assert_eq!(parse_millis("10x").unwrap_err().reason, "unknown unit");
    }

    #[test]
    fn refuses_overflow_instead_of_wrapping() {
        assert!(parse_millis("99999999999999999999ms").is_err());
        assert!(parse_millis("999999999999999999d").is_err());
        assert_eq!(parse_millis("18446744073709551615ms"), Ok(u64::MAX));
    }

    #[test]
    fn names_tiers_in_the_largest_exact_unit() {
        assert_eq!(tier_name(90_000), "90s");
        assert_eq!(tier_name(1_500), "1500ms");
        assert_eq!(tier_name(600_000), "10m");
        assert_eq!(tier_name(7_200_000), "2h");
        assert_eq!(tier_name(86_400_000), "1d");
        assert_eq!(tier_name(90_000_000), "25h");
        assert_eq!(tier_name(1), "1ms");
        assert_eq!(tier_name(60_000), "1m");
        assert_eq!(tier_name(61_000), "61s");
        assert_eq!(tier_name(MAX_MILLIS), "4294967295ms");
    }

    #[test]
    fn tier_names_parse_back_to_the_same_duration() {
        for ms in [
            1, 999, 1000, 1001, 59_999, 60_000, 3_600_000, 86_400_000, MAX_MILLIS,
        ] {
            assert_eq!(parse_millis(&tier_name(ms)), Ok(ms));
        }
    }
}
