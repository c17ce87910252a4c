//! Reading a dead-lettered message: what `dlq peek` shows of it, from its
//! headers (as [`crate::retry::headers_to_json`] gives them) and
//! body. dlqctl's own headers win; a message the broker dead-lettered
//! (`--dead-letter nack`, `delivery_limit`, a rejection by another
//! consumer) is read from its newest `x-death` entry.

use crate::wire::{
    ATTEMPT_HEADER, DEAD_LETTERED_AT_HEADER, ERRORS_HEADER, LAST_ERROR_HEADER,
    ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER, REASON_HEADER, REPLAYED_AT_HEADER,
    SOURCE_QUEUE_HEADER,
};
use serde_json::Value;

/// What is known of one DLQ message.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Described {
    /// `dlqctl-reason`, or the broker's `x-death` reason.
    pub reason: Option<String>,
    /// Handler runs made (`dlqctl-attempt`), or the broker's death count.
    pub attempts: Option<i64>,
    /// `dlqctl-dead-lettered-at`, or the broker's death time (RFC 3339).
    pub dead_lettered_at: Option<String>,
    /// `dlqctl-last-error`.
    pub last_error: Option<String>,
    /// `dlqctl-errors`, oldest first, as JSON.
    pub errors: Vec<Value>,
    /// The exchange the message first came from.
    pub original_exchange: Option<String>,
    /// The routing key it first came with.
    pub original_routing_key: Option<String>,
    /// The queue it was dead-lettered from.
    pub source_queue: Option<String>,
}

/// Reads the headers (as JSON) of a DLQ message.
pub fn describe(headers: &Value) -> Described {
    let text = |k: &str| headers.get(k).and_then(Value::as_str).map(str::to_string);
    let death = headers
        .get("x-death")
        .and_then(Value::as_array)
        .and_then(|a| a.first());
    let from_death = |k: &str| death.and_then(|d| d.get(k));
    let death_time = from_death("time")
        .and_then(Value::as_u64)
        .map(|secs| crate::values::text::rfc3339_millis(secs.saturating_mul(1000)));
    let death_reason = || {
        from_death("reason")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let death_queue = || {
        from_death("queue")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    // A replay strips `x-death`: on a replayed message, an `x-death` is a
    // broker dead-lettering after the replay, newer than the dlqctl
    // headers the replay kept.
    if death.is_some() && headers.get(REPLAYED_AT_HEADER).is_some() {
        return Described {
            reason: death_reason().or_else(|| text(REASON_HEADER)),
            dead_lettered_at: death_time.or_else(|| text(DEAD_LETTERED_AT_HEADER)),
            source_queue: death_queue().or_else(|| text(SOURCE_QUEUE_HEADER)),
            ..describe_dlqctl_first(headers, death)
        };
    }
    describe_dlqctl_first(headers, death)
}

/// What the headers say, dlqctl's own first, the newest `x-death` entry
/// (`death`) where they are absent.
fn describe_dlqctl_first(headers: &Value, death: Option<&Value>) -> Described {
    let text = |k: &str| headers.get(k).and_then(Value::as_str).map(str::to_string);
    let from_death = |k: &str| death.and_then(|d| d.get(k));
    let death_time = from_death("time")
        .and_then(Value::as_u64)
        .map(|secs| crate::values::text::rfc3339_millis(secs.saturating_mul(1000)));
    Described {
        reason: text(REASON_HEADER).or_else(|| {
            from_death("reason")
                .and_then(Value::as_str)
                .map(str::to_string)
        }),
        attempts: headers
            .get(ATTEMPT_HEADER)
            .and_then(Value::as_i64)
            .or_else(|| from_death("count").and_then(Value::as_i64)),
        dead_lettered_at: text(DEAD_LETTERED_AT_HEADER).or(death_time),
        last_error: text(LAST_ERROR_HEADER),
        errors: headers
            .get(ERRORS_HEADER)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        original_exchange: text(ORIGINAL_EXCHANGE_HEADER).or_else(|| {
            from_death("exchange")
                .and_then(Value::as_str)
                .map(str::to_string)
        }),
        original_routing_key: text(ORIGINAL_ROUTING_KEY_HEADER).or_else(|| {
            from_death("routing-keys")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(Value::as_str)
                .map(str::to_string)
        }),
        source_queue: text(SOURCE_QUEUE_HEADER).or_else(|| {
            from_death("queue")
                .and_then(Value::as_str)
                .map(str::to_string)
        }),
    }
}

/// One failed run of a message's error history, as the page's timeline
/// shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TimelineEntry {
    /// The run (1 is the first).
    pub attempt: Option<i64>,
    /// When it failed (RFC 3339).
    pub time: Option<String>,
    /// Its error.
    pub error: String,
}

/// The error history of `dlqctl-errors`, oldest first. Entries of another
/// shape (written by someone else) are shown as their JSON.
pub fn timeline(d: &Described) -> Vec<TimelineEntry> {
    d.errors
        .iter()
        .map(|e| match e.get("error").and_then(Value::as_str) {
            Some(error) => TimelineEntry {
                attempt: e.get("attempt").and_then(Value::as_i64),
                time: e.get("time").and_then(Value::as_str).map(str::to_string),
                error: error.to_string(),
            },
            None => TimelineEntry {
                attempt: None,
                time: None,
                error: e.to_string(),
            },
        })
        .collect()
}

/// A one-line preview of a body in at most `width` characters: the text
/// with control characters as spaces when it is UTF-8, else `hex:` and its
/// first bytes in hex; `…` marks a cut.
pub fn body_preview(body: &[u8], width: usize) -> String {
    let width = width.max(8);
    match std::str::from_utf8(body) {
        Ok(text) => {
            let clean: String = text
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            if clean.chars().count() <= width {
                clean
            } else {
                let mut cut: String = clean.chars().take(width - 1).collect();
                cut.push('…');
                cut
            }
        }
        Err(_) => {
            let bytes = (width - 5) / 2;
            let hex: String = body
                .iter()
                .take(bytes)
                .map(|b| format!("{b:02x}"))
                .collect();
            if body.len() > bytes {
                format!("hex:{hex}…")
            } else {
                format!("hex:{hex}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dlqctls_headers_win() {
        let h = json!({
            REASON_HEADER: "exhausted",
            ATTEMPT_HEADER: 4,
            DEAD_LETTERED_AT_HEADER: "2026-12-03T10:00:00.000Z",
            LAST_ERROR_HEADER: "upstream timeout",
            ERRORS_HEADER: [{"attempt": 1, "error": "a"}, {"attempt": 2, "error": "b"}],
            ORIGINAL_EXCHANGE_HEADER: "shop",
            ORIGINAL_ROUTING_KEY_HEADER: "order.created",
            SOURCE_QUEUE_HEADER: "orders",
            "x-death": [{"reason": "rejected", "count": 9, "queue": "other", "exchange": "x",
                         "routing-keys": ["k"], "time": 1}]
        });
        // Every field comes from dlqctl's headers, none from x-death.
        assert_eq!(
            describe(&h),
            Described {
                reason: Some("exhausted".into()),
                attempts: Some(4),
                dead_lettered_at: Some("2026-12-03T10:00:00.000Z".into()),
                last_error: Some("upstream timeout".into()),
                errors: vec![
                    json!({"attempt": 1, "error": "a"}),
                    json!({"attempt": 2, "error": "b"})
                ],
                original_exchange: Some("shop".into()),
                original_routing_key: Some("order.created".into()),
                source_queue: Some("orders".into()),
            }
        );
    }

    #[test]
    fn a_broker_dead_letter_is_read_from_x_death() {
        let h = json!({"x-death": [{"reason": "delivery_limit", "count": 1, "queue": "orders",
            "exchange": "shop", "routing-keys": ["order.paid"], "time": 1_700_000_000u64}]});
        let d = describe(&h);
        assert_eq!(d.reason.as_deref(), Some("delivery_limit"));
        assert_eq!(d.attempts, Some(1));
        assert_eq!(
            d.dead_lettered_at.as_deref(),
            Some("2023-11-14T22:13:20.000Z")
        );
        assert_eq!(d.original_routing_key.as_deref(), Some("order.paid"));
        assert_eq!(d.source_queue.as_deref(), Some("orders"));
        assert_eq!(d.last_error, None);
    }

    #[test]
    fn a_broker_death_after_a_replay_wins_over_the_headers_the_replay_kept() {
        let h = json!({
            REASON_HEADER: "exhausted",
            DEAD_LETTERED_AT_HEADER: "2026-01-01T00:00:00.000Z",
            SOURCE_QUEUE_HEADER: "orders",
            LAST_ERROR_HEADER: "timeout",
            REPLAYED_AT_HEADER: "2026-01-02T00:00:00.000Z",
            "x-death": [{"reason": "delivery_limit", "count": 1, "queue": "orders2",
                "time": 1_767_312_000u64}]
        });
        let d = describe(&h);
        assert_eq!(d.reason.as_deref(), Some("delivery_limit"));
        assert_eq!(
            d.dead_lettered_at.as_deref(),
            Some("2026-01-02T00:00:00.000Z")
        );
        assert_eq!(d.source_queue.as_deref(), Some("orders2"));
        assert_eq!(
            d.last_error.as_deref(),
            Some("timeout"),
            "the history stays"
        );
        // Not replayed: dlqctl's headers win, as before.
        let mut h2 = h.clone();
        h2.as_object_mut().unwrap().remove(REPLAYED_AT_HEADER);
        assert_eq!(describe(&h2).reason.as_deref(), Some("exhausted"));
        // Replayed and dead-lettered by the worker again (no x-death).
        let mut h3 = h.clone();
        h3.as_object_mut().unwrap().remove("x-death");
        assert_eq!(describe(&h3).reason.as_deref(), Some("exhausted"));
    }

    #[test]
    fn no_headers_is_all_unknown() {
        let d = describe(&json!({}));
        assert_eq!(d.reason, None);
        assert_eq!(d.attempts, None);
        assert!(d.errors.is_empty());
        let d = describe(&json!({"x-death": "not a list", ATTEMPT_HEADER: "x"}));
        assert_eq!((d.reason, d.attempts), (None, None));
    }

    #[test]
    fn previews_fit_the_width() {
        assert_eq!(body_preview(b"{\"id\":1}\n", 40), "{\"id\":1} ");
        let long = "é".repeat(100);
        let p = body_preview(long.as_bytes(), 20);
        assert_eq!(p.chars().count(), 20);
        assert!(p.ends_with('…'));
        assert_eq!(body_preview(&[0xff, 0x00], 40), "hex:ff00");
        let p = body_preview(&[0xffu8; 100], 21);
        assert_eq!(p, format!("hex:{}…", "ff".repeat(8)));
        assert_eq!(body_preview(b"", 0), "");
    }
}

/// One group of `dlq summary`: the messages sharing a reason and an error
/// fingerprint ([`crate::dlq::fingerprint`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Group {
    /// The group's short stable id (the `--group` selector).
    pub id: String,
    /// The reason (`exhausted`, `permanent`, the broker's `delivery_limit`...).
    pub reason: Option<String>,
    /// The normalised last error.
    pub fingerprint: String,
    /// Messages in the group.
    pub count: u64,
    /// The earliest dead-lettered-at.
    pub first_dead_lettered_at: Option<String>,
    /// The latest dead-lettered-at.
    pub last_dead_lettered_at: Option<String>,
    /// The source queue of the first message seen.
    pub source_queue: Option<String>,
    /// The id of the first message seen.
    pub example_message_id: Option<String>,
}

/// Builds the groups of a summary one message at a time, in memory bounded
/// by the number of groups.
#[derive(Debug, Default)]
pub struct Grouper {
    groups: Vec<Group>,
    index: std::collections::HashMap<String, usize>,
}

impl Grouper {
    /// Adds one message.
    pub fn add(&mut self, d: &Described, message_id: Option<&str>) {
        let reason = d.reason.clone().unwrap_or_default();
        let fingerprint = crate::dlq::fingerprint::normalise(d.last_error.as_deref().unwrap_or(""));
        let id = crate::dlq::fingerprint::group_id(&reason, &fingerprint);
        let at = d.dead_lettered_at.clone();
        match self.index.get(&id) {
            Some(&i) => {
                let g = &mut self.groups[i];
                g.count += 1;
                if at.is_some()
                    && (g.first_dead_lettered_at.is_none() || at < g.first_dead_lettered_at)
                {
                    g.first_dead_lettered_at = at.clone();
                }
                if at > g.last_dead_lettered_at {
                    g.last_dead_lettered_at = at;
                }
            }
            None => {
                self.index.insert(id.clone(), self.groups.len());
                self.groups.push(Group {
                    id,
                    reason: d.reason.clone(),
                    fingerprint,
                    count: 1,
                    first_dead_lettered_at: at.clone(),
                    last_dead_lettered_at: at,
                    source_queue: d.source_queue.clone(),
                    example_message_id: message_id.map(str::to_string),
                });
            }
        }
    }

    /// The groups, largest first (ties in the order first seen).
    pub fn finish(self) -> Vec<Group> {
        let mut g = self.groups;
        g.sort_by_key(|b| std::cmp::Reverse(b.count));
        g
    }
}

#[cfg(test)]
mod grouper_tests {
    use super::*;

    fn msg(reason: &str, error: &str, at: &str) -> Described {
        Described {
            reason: Some(reason.into()),
            attempts: None,
            dead_lettered_at: Some(at.into()),
            last_error: Some(error.into()),
            errors: vec![],
            original_exchange: None,
            original_routing_key: None,
            source_queue: Some("orders".into()),
        }
    }

    #[test]
    fn messages_group_by_reason_and_fingerprint_largest_first() {
        let mut g = Grouper::default();
        for (reason, error, at, id) in [
            ("permanent", "bad input", "2026-01-02T00:00:00.000Z", "p1"),
            (
                "exhausted",
                "order 1 not found",
                "2026-01-03T00:00:00.000Z",
                "e1",
            ),
            (
                "exhausted",
                "order 2 not found",
                "2026-01-01T00:00:00.000Z",
                "e2",
            ),
            (
                "permanent",
                "order 3 not found",
                "2026-01-05T00:00:00.000Z",
                "p2",
            ),
        ] {
            g.add(&msg(reason, error, at), Some(id));
        }
        let groups = g.finish();
        assert_eq!(groups.len(), 3, "{groups:#?}");
        let top = &groups[0];
        assert_eq!(top.count, 2);
        assert_eq!(top.reason.as_deref(), Some("exhausted"));
        assert_eq!(top.fingerprint, "order <n> not found");
        assert_eq!(
            top.first_dead_lettered_at.as_deref(),
            Some("2026-01-01T00:00:00.000Z")
        );
        assert_eq!(
            top.last_dead_lettered_at.as_deref(),
            Some("2026-01-03T00:00:00.000Z")
        );
        assert_eq!(top.example_message_id.as_deref(), Some("e1"));
        assert_eq!(
            top.id,
            crate::dlq::fingerprint::group_id("exhausted", "order <n> not found")
        );
        // Same fingerprint, another reason: another group.
        assert!(groups
            .iter()
            .any(|x| x.reason.as_deref() == Some("permanent")
                && x.fingerprint == "order <n> not found"));
    }
}

#[cfg(test)]
mod timeline_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_timeline_reads_each_entry_and_shows_a_foreign_one_as_json() {
        let d = Described {
            errors: vec![
                json!({"attempt": 1, "time": "2026-01-01T00:00:00.000Z", "error": "timeout"}),
                json!({"attempt": 2, "error": "<b>500</b>"}),
                json!("odd"),
            ],
            ..Default::default()
        };
        assert_eq!(
            timeline(&d),
            vec![
                TimelineEntry {
                    attempt: Some(1),
                    time: Some("2026-01-01T00:00:00.000Z".into()),
                    error: "timeout".into()
                },
                TimelineEntry {
                    attempt: Some(2),
                    time: None,
                    error: "<b>500</b>".into()
                },
                TimelineEntry {
                    attempt: None,
                    time: None,
                    error: "\"odd\"".into()
                },
            ]
        );
        assert!(timeline(&Described::default()).is_empty());
    }
}
