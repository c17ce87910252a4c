//! `dead_letter.redrive`: the automatic redrive policy of a pipeline (or
//! of `defaults`), read into a [`Redrive`] with its defaults; `false`
//! turns it off (over a policy in `defaults`).

use crate::topology::model::Redrive;
use crate::topology::yaml::{Node, Value};

use super::read::Cx;

/// The keys of `dead_letter.redrive`.
const REDRIVE_KEYS: [&str; 7] = [
    "reasons",
    "min_age",
    "max_redrives",
    "rate",
    "canary",
    "every",
    "health",
];

/// The reasons a DLQ message can have: dlqctl's own (`dlqctl-reason`) and
/// the broker's (`x-death`).
pub(super) const KNOWN_REASONS: [&str; 8] = [
    "exhausted",
    "permanent",
    "too_large",
    crate::wire::KEY_CONFLICT_REASON,
    "rejected",
    "expired",
    "maxlen",
    "delivery_limit",
];

/// The most canaries a run moves first.
const MAX_CANARY: i64 = 10_000;

impl Cx {
    /// `dead_letter.redrive`: `Some(None)` when turned off (`false`),
    /// `Some(Some(policy))` when on (`true` or a mapping, its keys over the
    /// defaults), `None` when invalid (reported). `null`, which is also
    /// what an empty `redrive:` line reads as, is invalid: it does not say
    /// whether the policy is meant on or off.
    pub(super) fn redrive(&mut self, n: &Node) -> Option<Option<Redrive>> {
        match &n.value {
            Value::Bool(false) => return Some(None),
            Value::Bool(true) => return Some(Some(Redrive::default())),
            Value::Null => {
                self.err(n.pos, empty_block("dead_letter.redrive"));
                return None;
            }
            _ => {}
        }
        let m = self.map(n, "dead_letter.redrive", &REDRIVE_KEYS)?;
        let mut r = Redrive::default();
        let mut ok = true;
        for (k, v) in m {
            match k.name.as_str() {
                "reasons" => match self.reasons(v) {
                    Some(reasons) => r.reasons = reasons,
                    None => ok = false,
                },
                "min_age" => match self.duration(v, "dead_letter.redrive.min_age") {
                    Some(d) => r.min_age = d,
                    None => ok = false,
                },
                "max_redrives" => {
                    match self.int_in(v, "dead_letter.redrive.max_redrives", 1, 1_000_000) {
                        Some(i) => r.max_redrives = i as u32,
                        None => ok = false,
                    }
                }
                "rate" => match self.rate(v) {
                    Some(rate) => r.rate = rate,
                    None => ok = false,
                },
                "canary" => match self.int_in(v, "dead_letter.redrive.canary", 0, MAX_CANARY) {
                    Some(i) => r.canary = i as u64,
                    None => ok = false,
                },
                "every" => match self.duration(v, "dead_letter.redrive.every") {
                    Some(d) if d >= 1000 => r.every = d,
                    Some(d) => {
                        self.err(
                            v.pos,
                            format!(
                                "dead_letter.redrive.every must be at least 1s, not {d}ms: each \
                                 look reads the whole DLQ"
                            ),
                        );
                        ok = false;
                    }
                    None => ok = false,
                },
                "health" => match self.health(v) {
                    Some(url) => r.health = Some(url),
                    None => ok = false,
                },
                _ => {}
            }
        }
        ok.then_some(Some(r))
    }

    /// `reasons`: a non-empty list of known reasons.
    fn reasons(&mut self, n: &Node) -> Option<Vec<String>> {
        let Value::Seq(items) = &n.value else {
            self.err(
                n.pos,
                format!(
                    "dead_letter.redrive.reasons must be a list such as [exhausted], not {}",
                    n.value.kind()
                ),
            );
            return None;
        };
        if items.is_empty() {
            self.err(
                n.pos,
                "dead_letter.redrive.reasons is empty: list at least one reason (e.g. [exhausted]), \
                 or write `redrive: false`",
            );
            return None;
        }
        let mut out: Vec<String> = Vec::new();
        let mut ok = true;
        for i in items {
            match self.string(i, "a redrive reason") {
                Some(s) if KNOWN_REASONS.contains(&s.as_str()) => {
                    if !out.contains(&s) {
                        out.push(s);
                    }
                }
                Some(s) => {
                    self.err(
                        i.pos,
                        format!(
                            "unknown redrive reason `{s}` (expected one of: {})",
                            KNOWN_REASONS.join(", ")
                        ),
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// `rate`: `N/s`, `N/m`, `N/h` or a plain number (per second), within
    /// the bounds of `dlq replay --rate`.
    fn rate(&mut self, n: &Node) -> Option<f64> {
        let what = "dead_letter.redrive.rate";
        let per_second = match &n.value {
            Value::Int(_) | Value::Float(_) => {
                self.err(n.pos, no_unit(what, n.value.kind()));
                return None;
            }
            Value::Str(s) if !s.contains('/') && s.trim().parse::<f64>().is_ok() => {
                self.err(n.pos, no_unit(what, &format!("`{}`", s.trim())));
                return None;
            }
            Value::Str(s) => parse_rate(s),
            _ => None,
        };
        let Some(r) = per_second else {
            self.err(
                n.pos,
                format!(
                    "{what} must be a rate such as 50/s, 100/m or 10/h, not {}",
                    match &n.value {
                        Value::Str(s) => format!("`{s}`"),
                        other => other.kind().to_string(),
                    }
                ),
            );
            return None;
        };
        match crate::dlq::rate::check_rate(r) {
            Ok(r) => Some(r),
            Err(e) => {
                self.err(n.pos, format!("{what}: {e}"));
                None
            }
        }
    }

    /// `health: { http: URL }`.
    fn health(&mut self, n: &Node) -> Option<String> {
        let m = self.map(n, "dead_letter.redrive.health", &["http"])?;
        let Some((_, v)) = m.iter().find(|(k, _)| k.name == "http") else {
            self.err(
                n.pos,
                "dead_letter.redrive.health needs `http` (a URL answering 2xx while the \
                 dependency is healthy)",
            );
            return None;
        };
        let url = self.string(v, "dead_letter.redrive.health.http")?;
        let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
        let host_ok = url
            .split_once("://")
            .is_some_and(|(_, rest)| !rest.is_empty() && !rest.starts_with('/'));
        if !scheme_ok || !host_ok || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            self.err(
                v.pos,
                format!(
                    "dead_letter.redrive.health.http must be an http:// or https:// URL with a \
                     host, not `{}`",
                    crate::idempotency::redact_url(&url).escape_debug()
                ),
            );
            return None;
        }
        let what = "dead_letter.redrive.health.http";
        self.url_usable(v.pos, &url, what, |c, u| c.http(u))
            .then_some(url)
    }
}

/// Reads `N/s`, `N/m`, `N/h` (or a bare number, per second) as messages
/// per second; `None` when it is not one.
/// The error of a block written `null` or left empty (`redrive:` with
/// nothing after it): it does not say whether it is meant on or off.
pub(super) fn empty_block(what: &str) -> String {
    format!(
        "{what} is empty (null): write `{{}}` or `true` for the defaults, `false` to turn it \
         off, or give its keys"
    )
}

/// The error of a rate written without its unit.
fn no_unit(what: &str, given: &str) -> String {
    format!(
        "{what} needs a unit: write 50/s, 50/m or 50/h (messages per second, minute or hour), \
         not {given}"
    )
}

/// A rate with its unit (`50/s`, `100/m`, `10/h`), in messages per second.
fn parse_rate(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, per) = match s.split_once('/') {
        Some((n, unit)) => {
            let per = match unit.trim() {
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return None,
            };
            (n.trim(), per)
        }
        None => return None,
    };
    let n: f64 = num.parse().ok()?;
    (n.is_finite() && !num.is_empty()).then_some(n / per)
}

#[cfg(test)]
mod tests {
    use crate::topology::tests::{errs, ok};
    use crate::topology::Redrive;

    /// One pipeline `a` whose `dead_letter` is `dl` (a flow mapping).
    fn with(dl: &str) -> String {
        format!("version: 1\npipelines:\n  - name: a\n    dead_letter: {dl}\n")
    }

    fn policy(yaml: &str) -> Option<Redrive> {
        ok(yaml).pipelines[0].dead_letter.redrive.clone()
    }

    #[test]
    fn no_redrive_unless_asked_and_every_default_when_asked() {
        assert_eq!(policy("version: 1\npipelines:\n  - name: a\n"), None);
        let want = Redrive {
            reasons: vec!["exhausted".into()],
            min_age: 300_000,
            max_redrives: 3,
            rate: 50.0,
            canary: 5,
            every: 60_000,
            health: None,
        };
        assert_eq!(Redrive::default(), want);
        for on in ["{redrive: {}}", "{redrive: true}"] {
            assert_eq!(policy(&with(on)), Some(want.clone()), "{on}");
        }
        assert_eq!(policy(&with("{redrive: false}")), None);
    }

    #[test]
    fn every_key_is_read() {
        let p = policy(&with(
            "{redrive: {reasons: [exhausted, permanent, exhausted], min_age: 1s, max_redrives: 7, \
             rate: 120/m, canary: 0, every: 2s, health: {http: 'http://pay.internal:8080/health'}}}",
        ))
        .unwrap();
        assert_eq!(
            p,
            Redrive {
                reasons: vec!["exhausted".into(), "permanent".into()],
                min_age: 1000,
                max_redrives: 7,
                rate: 2.0,
                canary: 0,
                every: 2000,
                health: Some("http://pay.internal:8080/health".into()),
            }
        );
        for (rate, want) in [
            ("50/s", 50.0),
            ("0.5/s", 0.5),
            ("3600/h", 1.0),
            (" 6 / m ", 0.1),
        ] {
            let p = policy(&with(&format!("{{redrive: {{rate: '{rate}'}}}}"))).unwrap();
            assert_eq!(p.rate, want, "{rate}");
        }
    }

    #[test]
    fn a_rate_without_its_unit_is_refused_with_line_and_column() {
        for (rate, given) in [
            ("20", "an integer"),
            ("0.5", "a number"),
            ("'50'", "`50`"),
            ("' 7 '", "`7`"),
        ] {
            let e = errs(&with(&format!("{{redrive: {{rate: {rate}}}}}")));
            assert_eq!(e.len(), 1, "{rate}: {e:#?}");
            assert!(
                e[0].contains("rate needs a unit: write 50/s") && e[0].contains(given),
                "{rate}: {}",
                e[0]
            );
            assert!(e[0].starts_with("4:"), "line and column: {}", e[0]);
        }
    }

    #[test]
    fn defaults_hold_a_policy_a_pipeline_replaces_or_turns_off() {
        let t = ok("version: 1
defaults:
  dead_letter:
    redrive: {min_age: 1m, canary: 2}
pipelines:
  - name: a
  - name: b
    dead_letter: {redrive: {every: 10s}}
  - name: c
    dead_letter: {redrive: false}
  - name: d
    dead_letter: {ttl: 1d}
");
        let r = |i: usize| t.pipelines[i].dead_letter.redrive.clone();
        assert_eq!(r(0).map(|p| (p.min_age, p.canary)), Some((60_000, 2)));
        // Replaced whole: b's policy is its own over the built-in defaults.
        assert_eq!(
            r(1).map(|p| (p.min_age, p.canary, p.every)),
            Some((300_000, 5, 10_000))
        );
        assert_eq!(r(2), None);
        // A dead_letter without `redrive` keeps the defaults' policy.
        assert_eq!(r(3).map(|p| p.canary), Some(2));
    }

    #[test]
    fn every_bad_key_and_value_is_reported_with_its_position() {
        let e = errs(
            "version: 1
pipelines:
  - name: a
    dead_letter:
      redrive:
        reasons: [exhausted, tired]
        min_age: soon
        max_redrives: 0
        rate: fast
        canary: -1
        every: 500ms
        health: {http: 'ftp://x'}
        colour: red
",
        );
        assert_eq!(
            e,
            vec![
                "6:30: unknown redrive reason `tired` (expected one of: exhausted, permanent, \
                 too_large, key_conflict, rejected, expired, maxlen, delivery_limit)"
                    .to_string(),
                "7:18: dead_letter.redrive.min_age: invalid duration \"soon\": it does not start \
                 with a whole number (write it as a whole number and a unit: 500ms, 30s, 10m, \
                 2h, 14d)"
                    .to_string(),
                "8:23: dead_letter.redrive.max_redrives must be between 1 and 1000000, not 0"
                    .to_string(),
                "9:15: dead_letter.redrive.rate must be a rate such as 50/s, 100/m or 10/h, not \
                 `fast`"
                    .to_string(),
                "10:17: dead_letter.redrive.canary must be between 0 and 10000, not -1".to_string(),
                "11:16: dead_letter.redrive.every must be at least 1s, not 500ms: each look reads \
                 the whole DLQ"
                    .to_string(),
                "12:24: dead_letter.redrive.health.http must be an http:// or https:// URL with a \
                 host, not `ftp://x`"
                    .to_string(),
                "13:9: unknown key `colour` in dead_letter.redrive (expected one of: reasons, \
                 min_age, max_redrives, rate, canary, every, health)"
                    .to_string(),
            ]
        );
    }

    #[test]
    fn bad_shapes_are_reported() {
        let one = |dl: &str| {
            let e = errs(&with(dl));
            assert_eq!(e.len(), 1, "{dl}: {e:#?}");
            e[0].clone()
        };
        assert!(
            one("{redrive: 3}").contains("dead_letter.redrive must be a mapping, not an integer")
        );
        assert!(one("{redrive: {reasons: []}}").contains("reasons is empty"));
        assert!(one("{redrive: {reasons: exhausted}}").contains("must be a list"));
        assert!(one("{redrive: {reasons: [3]}}").contains("a redrive reason must be a string"));
        assert!(one("{redrive: {rate: 0/s}}").contains("dead_letter.redrive.rate: 0 is not a rate"));
        assert!(one("{redrive: {rate: 1/h}}").contains("is not a rate dlqctl paces"));
        assert!(one("{redrive: {rate: 5/d}}").contains("not `5/d`"));
        assert!(one("{redrive: {rate: [1]}}").contains("not a list"));
        assert!(one("{redrive: {rate: nan}}").contains("rate"));
        assert!(one("{redrive: {canary: 10001}}").contains("between 0 and 10000"));
        assert!(one("{redrive: {health: {}}}").contains("health needs `http`"));
        assert!(
            one("{redrive: {health: {http: 'http://x', tcp: y}}}").contains("unknown key `tcp`")
        );
        assert!(one("{redrive: {health: 'http://x'}}").contains("health must be a mapping"));
        assert!(one("{redrive: {health: {http: 'http:///health'}}}").contains("with a host"));
        assert!(one("{redrive: {health: {http: 'http://a b'}}}").contains("with a host"));
        assert!(
            one("{redrive: {every: 30d, min_age: 0ms}}").contains("min_age must be between 1ms")
        );
    }

    #[test]
    fn a_bad_policy_does_not_hide_other_problems() {
        let e = errs(
            "version: 1
defaults:
  dead_letter: {redrive: {canary: x}}
pipelines:
  - name: a
    retry: {max_attempts: 0}
    dead_letter: {redrive: {every: 1}}
",
        );
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(e[0].starts_with("3:35: "), "{e:#?}");
        assert!(e[1].contains("max_attempts"), "{e:#?}");
        assert!(e[2].starts_with("7:36: "), "{e:#?}");
    }
}
