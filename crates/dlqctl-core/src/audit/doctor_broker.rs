//! Doctor's items on the broker itself: its version and the counting
//! rules that follow from it, and whether the management API answers for
//! the same broker.

use crate::audit::doctor_item::{Area, Check, Item, Level};
use crate::audit::doctor_snapshot::{ManagementState, Snapshot};

/// `(major, minor)` of a version string such as `3.10.8` or `4.3.6+dfsg`.
pub(crate) fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The broker's default `max_message_size` for a version.
pub(super) fn max_message_size(major: u32) -> u64 {
    if major >= 4 {
        16 << 20
    } else {
        128 << 20
    }
}

/// The broker's items: its version, its management API, and the warning
/// on policies read from the queues' own fields.
pub(super) fn broker_checks(s: &Snapshot) -> Vec<Check> {
    let item = |level: Level, subject: &str, message: String| {
        Item {
            area: Area::Broker,
            level,
            subject: subject.into(),
            message,
        }
        .of(None)
    };
    let mut out = vec![match s.version.as_deref().map(|v| (v, major_minor(v))) {
        None => item(
            Level::Skip,
            "version",
            "unknown: the management API did not answer (AMQP does not tell it to dlqctl)".into(),
        ),
        Some((v, None)) => item(
            Level::Warn,
            "version",
            format!("RabbitMQ `{v}`: not a version dlqctl can read; it needs 3.10 or later"),
        ),
        Some((v, Some(mm))) if mm < (3, 10) => item(
            Level::Fail,
            "version",
            format!(
                "RabbitMQ {v}: dlqctl needs 3.10 or later (at-least-once dead-lettering of \
                 quorum queues); upgrade the broker"
            ),
        ),
        Some((v, Some((major, minor)))) => item(
            Level::Pass,
            "version",
            format!("RabbitMQ {v}: {}", semantics(major, minor)),
        ),
    }];
    out.push(match &s.management {
        ManagementState::Answers => item(
            Level::Pass,
            "management API",
            "answers, for the broker the AMQP connection reached".into(),
        ),
        ManagementState::Unreachable(why) => item(
            Level::Warn,
            "management API",
            format!(
                "does not answer ({why}): policies, health and permissions cannot be checked; \
                 give --management-url and a user with the `monitoring` tag"
            ),
        ),
        ManagementState::OtherBroker(why) => item(
            Level::Fail,
            "management API",
            format!("{why}; its policies and statistics are not this broker's"),
        ),
    });
    if let Some(note) = &s.policies_from_queue_view {
        out.push(item(Level::Warn, "policies", note.clone()));
    }
    out
}

/// What a version counts and limits (docs/brokers.md, "At a glance").
fn semantics(major: u32, minor: u32) -> String {
    let size = max_message_size(major) >> 20;
    match (major, minor) {
        (3, _) => format!(
            "x-delivery-count counts every return to a quorum queue; no default delivery-limit; \
             max_message_size {size} MiB by default"
        ),
        (4, 0..=2) => format!(
            "x-delivery-count counts every return to a quorum queue; default delivery-limit 20 \
             (dlqctl sets its own); max_message_size {size} MiB by default"
        ),
        _ => format!(
            "x-delivery-count counts failed deliveries only (not nack with requeue), \
             x-acquired-count every hand-off; default delivery-limit 20 (dlqctl sets its own); \
             max_message_size {size} MiB by default"
        ),
    }
}

/// Why something the management API tells is unknown: `otherwise` when
/// it answers.
pub(super) fn management_why(s: &Snapshot, otherwise: &str) -> String {
    match &s.management {
        ManagementState::Answers => otherwise.to_string(),
        ManagementState::Unreachable(why) => format!("the management API does not answer ({why})"),
        ManagementState::OtherBroker(_) => {
            "the management API belongs to another broker".to_string()
        }
    }
}
