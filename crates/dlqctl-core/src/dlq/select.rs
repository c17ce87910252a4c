//! The selectors every DLQ command shares (`--group`, `--message-id`,
//! `--filter-reason`, `--filter-header`, `--filter-error`,
//! `--older-than`): which messages of a DLQ a peek, export, replay or purge
//! takes. The web page's "this group" and "these messages" use the same.
//!
//! Every selector given must match (AND); `--message-id` may be repeated
//! and matches any of its ids (OR). No selector: every message matches.

use crate::dlq::describe::Described;
use crate::dlq::fingerprint::{group_id, normalise};
use crate::values::Invalid;
use serde_json::Value;

/// Which messages a DLQ command takes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Selector {
    /// `--group ID`: the summary group (reason and error fingerprint).
    pub group: Option<String>,
    /// `--message-id ID` (repeatable). An id that is not UTF-8 is written
    /// `base64:` followed by the standard base64 of its bytes.
    pub message_ids: Vec<String>,
    /// `--filter-reason R`: `dlqctl-reason`, or the broker's `x-death`
    /// reason (`rejected`, `expired`, `maxlen`, `delivery_limit`).
    pub reason: Option<String>,
    /// `--filter-header K=V` (repeatable, all must match): the top-level
    /// header K, whose value written as text (a string as it is, a number
    /// or boolean as JSON writes it) equals V.
    pub headers: Vec<(String, String)>,
    /// `--filter-error TEXT`: the last error contains TEXT (case-sensitive).
    pub error: Option<String>,
    /// `--older-than D`, in ms: dead-lettered more than D before now. A
    /// message whose dead-letter time is unknown does not match.
    pub older_than_ms: Option<u64>,
}

/// What a selector reads of one message.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// What its headers say.
    pub described: &'a Described,
    /// Its headers, as [`crate::retry::headers_to_json`] gives them.
    pub headers: &'a Value,
    /// Its `message_id` as shown: the text, or `base64:…` when not UTF-8.
    pub message_id: Option<&'a str>,
}

impl Selector {
    /// Whether no selector was given (every message matches).
    pub fn is_empty(&self) -> bool {
        *self == Selector::default()
    }

    /// Whether the message matches, `now_unix_ms` being the current time.
    pub fn matches(&self, c: &Candidate, now_unix_ms: u64) -> bool {
        let d = c.described;
        if let Some(g) = &self.group {
            if !g.eq_ignore_ascii_case(&message_group(d)) {
                return false;
            }
        }
        if !self.message_ids.is_empty()
            && !c
                .message_id
                .is_some_and(|id| self.message_ids.iter().any(|m| m == id))
        {
            return false;
        }
        if let Some(r) = &self.reason {
            if d.reason.as_deref() != Some(r.as_str()) {
                return false;
            }
        }
        for (k, v) in &self.headers {
            if header_text(c.headers.get(k)).as_deref() != Some(v.as_str()) {
                return false;
            }
        }
        if let Some(e) = &self.error {
            if !d
                .last_error
                .as_deref()
                .is_some_and(|l| l.contains(e.as_str()))
            {
                return false;
            }
        }
        if let Some(age) = self.older_than_ms {
            let at = d
                .dead_lettered_at
                .as_deref()
                .and_then(crate::values::text::parse_rfc3339_millis);
            match at {
                Some(at) if now_unix_ms.saturating_sub(age) > at => {}
                _ => return false,
            }
        }
        true
    }
}

/// Every reason `--filter-reason` takes: dlqctl's own `dlqctl-reason`
/// values, then the broker's `x-death` reasons. A reason outside the list
/// could match nothing, so it is refused (exit 2) instead of selecting
/// nothing.
pub const REASONS: [&str; 8] = [
    "permanent",
    "exhausted",
    "too_large",
    crate::wire::KEY_CONFLICT_REASON,
    "rejected",
    "expired",
    "maxlen",
    "delivery_limit",
];

/// The most groups an unknown `--group`'s error lists.
const GROUPS_LISTED: usize = 20;
/// The most distinct groups a [`GroupCheck`] keeps (past it, counted only).
const GROUPS_KEPT: usize = 10_000;

/// Tells a `--group` that names no group of the DLQ: a command feeds it
/// every message it reads; when the run read its whole snapshot and never
/// met the group, [`GroupCheck::verdict`] says so with the groups it did
/// meet (a typo must not read as "nothing to do").
#[derive(Debug, Default)]
pub struct GroupCheck {
    wanted: Option<String>,
    found: bool,
    /// Group id → (reason, messages).
    seen: std::collections::BTreeMap<String, (String, u64)>,
    others: u64,
}

impl GroupCheck {
    /// A check of `selector`'s group (none: nothing to check).
    pub fn new(selector: &Selector) -> Self {
        GroupCheck {
            wanted: selector.group.clone(),
            ..Default::default()
        }
    }

    /// Notes one message read (whatever the other selectors say).
    pub fn see(&mut self, d: &Described) {
        let Some(wanted) = &self.wanted else { return };
        if self.found {
            return;
        }
        let id = message_group(d);
        if wanted.eq_ignore_ascii_case(&id) {
            self.found = true;
            self.seen.clear();
            return;
        }
        let kept = self.seen.len();
        match self.seen.get_mut(&id) {
            Some(e) => e.1 += 1,
            None if kept < GROUPS_KEPT => {
                let reason = d.reason.clone().unwrap_or_else(|| "unknown".into());
                self.seen.insert(id, (reason, 1));
            }
            None => self.others += 1,
        }
    }

    /// After a run that read its whole snapshot: the error when the group
    /// was never met, naming the groups that were (largest first).
    pub fn verdict(&self, dlq: &str) -> Option<String> {
        let wanted = self.wanted.as_ref()?;
        if self.found {
            return None;
        }
        let mut groups: Vec<(String, String, u64)> = self
            .seen
            .iter()
            .map(|(id, (reason, n))| (id.clone(), reason.clone(), *n))
            .collect();
        groups.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        Some(unknown_group(wanted, dlq, &groups, self.others > 0))
    }
}

/// The error for `--group WANTED` naming no group of `dlq`, whose groups
/// (id, reason, messages; largest first) are `groups`, and more when
/// `more_untold`. An empty DLQ says so.
pub fn unknown_group(
    wanted: &str,
    dlq: &str,
    groups: &[(String, String, u64)],
    more_untold: bool,
) -> String {
    if groups.is_empty() && !more_untold {
        return format!(
            "--group {wanted}: {dlq} holds no message, so no group (see `dlqctl dlq summary`)"
        );
    }
    let listed: Vec<String> = groups
        .iter()
        .take(GROUPS_LISTED)
        .map(|(id, reason, n)| format!("{id} ({reason}, {n})"))
        .collect();
    let more = match (groups.len().saturating_sub(GROUPS_LISTED), more_untold) {
        (0, false) => String::new(),
        (n, false) => format!(" and {n} more"),
        (_, true) => " and more".to_string(),
    };
    format!(
        "--group {wanted} is not a group of {dlq}; its groups (id, reason, messages): {}{more} \
         (see `dlqctl dlq summary`)",
        listed.join(", ")
    )
}

/// The summary group a message belongs to (see [`crate::dlq::describe::Grouper`]).
pub fn message_group(d: &Described) -> String {
    group_id(
        d.reason.as_deref().unwrap_or(""),
        &normalise(d.last_error.as_deref().unwrap_or("")),
    )
}

/// A header value as the text `--filter-header` compares: a string as it
/// is, a number or boolean as JSON writes it; anything else has none.
fn header_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Reads `--filter-header K=V` (split at the first `=`; K not empty).
pub fn parse_header_filter(s: &str) -> Result<(String, String), Invalid> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(Invalid(format!(
            "{s:?} is not KEY=VALUE (for example tenant=acme)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_group_met_passes_and_one_never_met_names_the_groups_met() {
        let a = described("exhausted", "timeout 1", None);
        let b = described("permanent", "bad input", None);
        let id_a = message_group(&a);
        let id_b = message_group(&b);
        let mut none = GroupCheck::new(&Selector::default());
        none.see(&a);
        assert_eq!(none.verdict("orders.dlq"), None);

        let mut found = GroupCheck::new(&Selector {
            group: Some(id_b.to_uppercase()),
            ..Selector::default()
        });
        found.see(&a);
        found.see(&b);
        assert_eq!(found.verdict("orders.dlq"), None);

        let mut typo = GroupCheck::new(&Selector {
            group: Some("zzz".into()),
            ..Selector::default()
        });
        typo.see(&b);
        typo.see(&a);
        typo.see(&described("exhausted", "timeout 2", None));
        let e = typo.verdict("orders.dlq").expect("an error");
        assert!(
            e.starts_with("--group zzz is not a group of orders.dlq"),
            "{e}"
        );
        // Largest first: "timeout 1" and "timeout 2" share a fingerprint.
        let at_a = e.find(&format!("{id_a} (exhausted, 2)")).expect(&e);
        let at_b = e.find(&format!("{id_b} (permanent, 1)")).expect(&e);
        assert!(at_a < at_b, "{e}");

        let empty = GroupCheck::new(&Selector {
            group: Some("zzz".into()),
            ..Selector::default()
        });
        assert!(empty
            .verdict("orders.dlq")
            .expect("an error")
            .contains("holds no message"));
    }

    #[test]
    fn a_group_check_lists_at_most_twenty_groups() {
        let mut c = GroupCheck::new(&Selector {
            group: Some("zzz".into()),
            ..Selector::default()
        });
        for k in 0..25 {
            c.see(&described(&format!("r{k}"), "e", None));
        }
        let e = c.verdict("q").expect("an error");
        assert_eq!(e.matches("(r").count(), 20, "{e}");
        assert!(e.contains("and 5 more"), "{e}");
    }

    #[test]
    fn every_reason_dlqctl_writes_is_a_known_reason() {
        use crate::retry::DeadLetterReason;
        for r in DeadLetterReason::ALL {
            assert!(REASONS.contains(&r.as_str()), "{r}");
        }
    }

    fn described(reason: &str, error: &str, at: Option<&str>) -> Described {
        Described {
            reason: Some(reason.into()),
            attempts: Some(3),
            dead_lettered_at: at.map(str::to_string),
            last_error: Some(error.into()),
            errors: vec![],
            original_exchange: None,
            original_routing_key: None,
            source_queue: Some("orders".into()),
        }
    }

    const NOW: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    fn check(s: &Selector, d: &Described, headers: &Value, id: Option<&str>) -> bool {
        s.matches(
            &Candidate {
                described: d,
                headers,
                message_id: id,
            },
            NOW,
        )
    }

    #[test]
    fn no_selector_matches_everything() {
        let d = described("permanent", "x", None);
        assert!(Selector::default().is_empty());
        assert!(check(&Selector::default(), &d, &json!({}), None));
    }

    #[test]
    fn group_matches_the_summary_group_of_any_message_with_the_same_fingerprint() {
        let a = described("exhausted", "order 1 not found", None);
        let b = described("exhausted", "order 2 not found", None);
        let c = described("permanent", "order 2 not found", None);
        let s = Selector {
            group: Some(message_group(&a).to_uppercase()),
            ..Default::default()
        };
        assert!(check(&s, &a, &json!({}), None));
        assert!(check(&s, &b, &json!({}), None));
        assert!(!check(&s, &c, &json!({}), None));
    }

    #[test]
    fn message_ids_are_any_of_and_need_an_id() {
        let d = described("permanent", "x", None);
        let s = Selector {
            message_ids: vec!["a".into(), "base64:/w==".into()],
            ..Default::default()
        };
        assert!(check(&s, &d, &json!({}), Some("a")));
        assert!(check(&s, &d, &json!({}), Some("base64:/w==")));
        assert!(!check(&s, &d, &json!({}), Some("b")));
        assert!(!check(&s, &d, &json!({}), None));
    }

    #[test]
    fn reason_error_and_headers_must_all_match() {
        let d = described("exhausted", "HTTP 503 from billing", None);
        let h = json!({"tenant": "acme", "n": 7, "flag": true, "t": {"x": 1}});
        let mut s = Selector {
            reason: Some("exhausted".into()),
            error: Some("503".into()),
            headers: vec![("tenant".into(), "acme".into()), ("n".into(), "7".into())],
            ..Default::default()
        };
        assert!(check(&s, &d, &h, None));
        s.headers.push(("flag".into(), "true".into()));
        assert!(check(&s, &d, &h, None));
        s.headers.push(("t".into(), "{\"x\":1}".into()));
        assert!(!check(&s, &d, &h, None), "a table has no text");
        s.headers.pop();
        s.headers.push(("missing".into(), "".into()));
        assert!(!check(&s, &d, &h, None), "a missing header is not empty");
        s.headers.pop();
        s.reason = Some("permanent".into());
        assert!(!check(&s, &d, &h, None));
        s.reason = None;
        s.error = Some("504".into());
        assert!(!check(&s, &d, &h, None));
        let no_error = Described {
            last_error: None,
            ..d.clone()
        };
        s.error = Some("".into());
        assert!(!check(&s, &no_error, &h, None));
    }

    #[test]
    fn older_than_reads_the_dead_letter_time_and_unknown_times_never_match() {
        let s = Selector {
            older_than_ms: Some(3_600_000),
            ..Default::default()
        };
        let old = described("permanent", "x", Some("2025-12-31T22:59:59.999Z"));
        let edge = described("permanent", "x", Some("2025-12-31T23:00:00.000Z"));
        let young = described("permanent", "x", Some("2025-12-31T23:30:00.000Z"));
        let unknown = described("permanent", "x", None);
        let garbage = described("permanent", "x", Some("yesterday"));
        assert!(check(&s, &old, &json!({}), None));
        assert!(!check(&s, &edge, &json!({}), None));
        assert!(!check(&s, &young, &json!({}), None));
        assert!(!check(&s, &unknown, &json!({}), None));
        assert!(!check(&s, &garbage, &json!({}), None));
    }

    #[test]
    fn header_filters_parse_at_the_first_equals_sign() {
        assert_eq!(
            parse_header_filter("a=b=c"),
            Ok(("a".to_string(), "b=c".to_string()))
        );
        assert_eq!(
            parse_header_filter("a="),
            Ok(("a".to_string(), String::new()))
        );
        assert!(parse_header_filter("=b").is_err());
        assert!(parse_header_filter("ab").is_err());
    }
}
