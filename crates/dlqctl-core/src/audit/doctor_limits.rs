//! Doctor's items on a pipeline's limits: a DLQ retention under 7 days
//! warns; a handler timeout not under the consumer timeout fails; the
//! broker's message size limit.

use crate::audit::doctor_broker::{major_minor, max_message_size};
use crate::audit::doctor_item::{Area, Item, Level};
use crate::audit::doctor_snapshot::{QueueFacts, Snapshot};
use crate::topology::plan::{QueueSpec, Role};
use crate::topology::ArgValue;
use crate::values::duration::tier_name;

/// A DLQ that keeps its messages for less than this warns: an incident
/// found on a Monday needs Friday's evidence.
pub(crate) const MIN_DLQ_RETENTION_MS: u64 = 7 * 86_400_000;

/// What a retry or dead-letter copy may add to a message (dlqctl's
/// headers stay under 8 KiB).
pub(crate) const COPY_HEADROOM_BYTES: u64 = 8 * 1024;

/// An integer argument of a planned queue.
pub(super) fn int_arg(q: &QueueSpec, key: &str) -> Option<i64> {
    match q.arguments.get(key) {
        Some(ArgValue::Int(i)) => Some(*i),
        _ => None,
    }
}

/// An integer key of the policies that apply, when known and not
/// negative.
pub(super) fn int_policy(f: Option<&QueueFacts>, key: &str) -> Option<i64> {
    f?.policies
        .as_ref()?
        .effective
        .get(key)?
        .as_i64()
        .filter(|v| *v >= 0)
}

/// The lower of an argument and a policy value (either may be absent).
pub(super) fn lowest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The DLQ's retention, the handler timeout, and the message size.
pub(super) fn limit_checks(queues: &[&QueueSpec], s: &Snapshot, p: &str) -> Vec<Item> {
    let mut out = Vec::new();
    if let Some(dlq) = queues.iter().find(|q| q.role == Role::DeadLetterQueue) {
        let ttl = lowest(
            int_arg(dlq, "x-message-ttl"),
            int_policy(s.queue(&dlq.name), "message-ttl"),
        );
        let (level, message) = match ttl {
            None => (
                Level::Pass,
                "no TTL: messages stay until a person removes them".into(),
            ),
            Some(ms) if (ms as u64) < MIN_DLQ_RETENTION_MS => (
                Level::Warn,
                format!(
                    "{} (under 7 days): an incident found after a weekend may have lost its \
                     evidence; raise `dead_letter.ttl`",
                    tier_name(ms as u64)
                ),
            ),
            Some(ms) => (
                Level::Pass,
                format!("{} (7 days or more)", tier_name(ms as u64)),
            ),
        };
        out.push(Item {
            area: Area::Limits,
            level,
            subject: format!("retention of {}", dlq.name),
            message,
        });
    }
    out.extend(timeout_check(queues, s, p));
    if let Some((major, _)) = s.version.as_deref().and_then(major_minor) {
        let size = max_message_size(major);
        out.push(Item {
            area: Area::Limits,
            level: Level::Pass,
            subject: "message size".into(),
            message: format!(
                "max_message_size is {} MiB by default on this version (a changed value cannot \
                 be read through the API); a retry or dead-letter copy adds up to 8 KiB of \
                 headers, so messages over {} bytes are dead-lettered as `too_large` instead \
                 of retried",
                size >> 20,
                size - COPY_HEADROOM_BYTES
            ),
        });
    }
    out
}

/// The handler timeout against the consumer timeout of the main queue
/// (the rule `dlqctl work` applies at start:
/// [`crate::audit::consumer_timeout`]).
fn timeout_check(queues: &[&QueueSpec], s: &Snapshot, p: &str) -> Option<Item> {
    use crate::audit::consumer_timeout::{self as ct, Handlers, Verdict};
    let main = queues.iter().find(|q| q.role == Role::MainQueue)?;
    let facts = s.queue(&main.name);
    let timeout = ct::consumer_timeout(&ct::Facts {
        version: s.version.as_deref(),
        queue_type: facts.and_then(|f| f.kind.as_deref()),
        argument: int_arg(main, ct::ARGUMENT),
        policies: facts.and_then(|f| f.policies.as_ref()),
    });
    let limit = match &timeout {
        Some(c) => format!("it must stay under {}, {}", tier_name(c.ms), c.source),
        None => {
            "the queue has no consumer timeout (a classic queue on RabbitMQ 4.3 and later)".into()
        }
    };
    let item = |level: Level, message: String| Item {
        area: Area::Limits,
        level,
        subject: "handler timeout".to_string(),
        message,
    };
    let Some(h) = s.handler_timeout.get(p) else {
        let why = (s.handler_timeout_error.as_deref())
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        return Some(item(
            Level::Skip,
            format!("unknown{why}: give --handler-timeout, or --metrics-url of a worker; {limit}"),
        ));
    };
    let one = Handlers {
        timeout_ms: h.ms,
        prefetch: 1,
        concurrency: 1,
    };
    Some(match (ct::judge(one, timeout.as_ref()), &timeout) {
        (Verdict::TooLong(_), Some(c)) => item(
            Level::Fail,
            format!(
                "{} ({}) is not under {}, {}: {}, and the message runs twice; lower \
                 --handler-timeout or {}",
                tier_name(h.ms),
                h.source,
                tier_name(c.ms),
                c.source,
                c.model.consequence(),
                c.source.fix()
            ),
        ),
        (_, Some(c)) => item(
            Level::Pass,
            format!(
                "{} ({}) is under {}, {}; keep --prefetch × handler time under it too",
                tier_name(h.ms),
                h.source,
                tier_name(c.ms),
                c.source
            ),
        ),
        (_, None) => item(
            Level::Pass,
            format!("{} ({}): {limit}", tier_name(h.ms), h.source),
        ),
    })
}
