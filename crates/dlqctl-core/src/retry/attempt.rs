//! Attempts: what the headers of a delivery say about the runs made.

use amq_protocol::types::{AMQPValue, FieldTable};

use super::headers::*;
use crate::wire::{as_integer, ATTEMPT_HEADER, DEFERRED_HEADER};

/// What the headers of one delivery say about its attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptCount {
    /// H: `dlqctl-attempt`, the handler runs already made, when readable.
    pub own: Option<u32>,
    /// D: the sum of `count` over the `x-death` entries with reason
    /// `expired` from one of the pipeline's retry queues.
    pub deaths: u64,
    /// This run's number: max(H, D) + 1, at least 1, at most `u32::MAX`;
    /// H + 1 on a deferred copy (`dlqctl-deferred`), whose last pass
    /// through a tier ran no handler.
    pub attempt: u32,
    /// Headers of an unexpected type or shape, ignored; for the caller to
    /// log once. Never echoes header values, only types and positions.
    pub warnings: Vec<String>,
}

/// Computes the attempt number of a delivery from its headers.
///
/// Tolerant: a header of an unexpected type or shape is reported in
/// [`AttemptCount::warnings`] and treated as absent; no input panics or
/// overflows (counts add up saturating).
pub fn count_attempt(headers: Option<&FieldTable>, retry_queues: &[String]) -> AttemptCount {
    let mut warnings = Warnings::default();
    let get = |key: &str| headers.and_then(|h| h.inner().get(key));
    let own = get(ATTEMPT_HEADER).and_then(|v| read_own_attempt(v, &mut warnings));
    let deaths = get(X_DEATH).map_or(0, |v| sum_deaths(v, retry_queues, &mut warnings));
    // A deferred copy's pass through a tier ran no handler: its own count
    // says the runs made.
    let deferred = get(DEFERRED_HEADER).is_some() && own.is_some();
    let runs = if deferred {
        u64::from(own.unwrap_or(0))
    } else {
        u64::from(own.unwrap_or(0)).max(deaths)
    };
    let attempt = u32::try_from(runs.saturating_add(1)).unwrap_or(u32::MAX);
    AttemptCount {
        own,
        deaths,
        attempt,
        warnings: warnings.finish(),
    }
}

fn read_own_attempt(value: &AMQPValue, warnings: &mut Warnings) -> Option<u32> {
    match as_integer(value) {
        None => {
            warnings.push(format!(
                "header {ATTEMPT_HEADER} is a {}, not an integer; ignored",
                value.get_type()
            ));
            None
        }
        Some(n) if n < 0 => {
            warnings.push(format!(
                "header {ATTEMPT_HEADER} is negative ({n}); ignored"
            ));
            None
        }
        Some(n) => Some(u32::try_from(n).unwrap_or_else(|_| {
            warnings.push(format!(
                "header {ATTEMPT_HEADER} is {n}, more than {}; counted as {}",
                u32::MAX,
                u32::MAX
            ));
            u32::MAX
        })),
    }
}

fn sum_deaths(value: &AMQPValue, retry_queues: &[String], warnings: &mut Warnings) -> u64 {
    let AMQPValue::FieldArray(entries) = value else {
        warnings.push(format!(
            "header {X_DEATH} is a {}, not an array; ignored",
            value.get_type()
        ));
        return 0;
    };
    let mut total: u64 = 0;
    for (i, entry) in entries.as_slice().iter().enumerate() {
        let AMQPValue::FieldTable(entry) = entry else {
            warnings.push(format!(
                "{X_DEATH} entry {i} is a {}, not a table; skipped",
                entry.get_type()
            ));
            continue;
        };
        let field = |name: &str| entry.inner().get(name).and_then(as_text);
        let (Some(reason), Some(queue)) = (field("reason"), field("queue")) else {
            warnings.push(format!(
                "{X_DEATH} entry {i} has no string reason or queue; skipped"
            ));
            continue;
        };
        if *reason != b"expired"[..] || !retry_queues.iter().any(|q| q.as_bytes() == &*queue) {
            continue;
        }
        match entry.inner().get("count").map(|c| (c, as_integer(c))) {
            Some((_, Some(n))) if n >= 0 => total = total.saturating_add(n.unsigned_abs()),
            Some((_, Some(n))) => warnings.push(format!(
                "{X_DEATH} entry {i} has a negative count ({n}); skipped"
            )),
            Some((c, None)) => warnings.push(format!(
                "{X_DEATH} entry {i} has a count of type {}, not an integer; skipped",
                c.get_type()
            )),
            None => warnings.push(format!("{X_DEATH} entry {i} has no count; skipped")),
        }
    }
    total
}

/// Collects at most [`MAX_WARNINGS`] warnings and counts the rest.
#[derive(Default)]
struct Warnings {
    list: Vec<String>,
    dropped: usize,
}

impl Warnings {
    fn push(&mut self, warning: String) {
        if self.list.len() < MAX_WARNINGS {
            self.list.push(warning);
        } else {
            self.dropped += 1;
        }
    }

    fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.list
                .push(format!("{} more header warnings not shown", self.dropped));
        }
        self.list
    }
}

/// The bytes of a long or short string (a short string's bytes on the
/// wire, see [`crate::values::shortstr`]).
pub(super) fn as_text(value: &AMQPValue) -> Option<std::borrow::Cow<'_, [u8]>> {
    match value {
        AMQPValue::LongString(s) => Some(s.as_bytes().into()),
        AMQPValue::ShortString(s) => Some(crate::values::shortstr::raw_bytes(s.as_str())),
        _ => None,
    }
}

/// A long or short string that is valid UTF-8 (a short string only when it
/// is held as its own text, see [`crate::values::shortstr`]).
pub(super) fn as_str(value: &AMQPValue) -> Option<&str> {
    match value {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
        AMQPValue::ShortString(s) => {
            Some(s.as_str()).filter(|s| crate::values::shortstr::is_utf8_clean(s))
        }
        _ => None,
    }
}
