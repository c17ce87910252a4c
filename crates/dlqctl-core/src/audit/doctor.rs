//! `dlqctl doctor`: the checklist of what the broker will do differently
//! from the topology. Pure: the shell gathers a [`Snapshot`] (AMQP and the
//! management API) and [`checklist`] judges it, each item pass, warn, fail
//! or skip with a sentence that says what to do.
//!
//! What is judged, per pipeline (docs/doctor.md):
//!
//! - the broker: its version and the counting rules that follow from it,
//!   and whether the management API answers for the same broker;
//! - objects: every planned exchange and queue exists;
//! - policies: each key of a policy or operator policy that changes a
//!   queue is a fail (see [`crate::audit::policy`]), the others pass;
//! - limits: a DLQ retention under 7 days warns; a handler timeout not
//!   under the consumer timeout fails; the broker's message size limit;
//! - health: quorum members online, `messages_dlx` over two samples, the
//!   DLX's binding to the DLQ, consumers on the main queue, `--max-dlq`,
//!   and the worker's circuit breaker (from `--metrics-url`);
//! - permissions: each command the connecting user could or could not run;
//! - idempotency: the store answers, `keep` against the DLQ's retention,
//!   an SQLite store while consumers come from several hosts
//!   ([`crate::audit::idempotency`]).
//!
//! The files: what is judged (`doctor_snapshot.rs`) and what comes out
//! (`doctor_item.rs`), then one file per part of the checklist
//! (`doctor_broker.rs`, `doctor_policies.rs` for objects and policies,
//! `doctor_limits.rs`, `doctor_health.rs`, `doctor_permissions.rs`,
//! `doctor_idempotency.rs`); this one puts them together.

use crate::audit::doctor_broker::broker_checks;
use crate::audit::doctor_health::{circuit_check, health_checks, redrive_check};
use crate::audit::doctor_idempotency::idempotency_checks;
use crate::audit::doctor_limits::limit_checks;
use crate::audit::doctor_permissions::permission_checks;
use crate::audit::doctor_policies::{cycle_checks, object_checks, policy_checks};
use crate::topology::plan::{Plan, QueueSpec, Role};

pub use crate::audit::doctor_item::{Area, Check, Level};
pub use crate::audit::doctor_snapshot::{
    HandlerTimeout, ManagementState, PermissionsUnknown, QueueFacts, Snapshot,
};

/// The metric through which a worker publishes its handler timeout.
pub const HANDLER_TIMEOUT_METRIC: &str = "dlqctl_handler_timeout_seconds";

/// The whole checklist: the broker's items, then each pipeline of `plan`
/// (in plan order) whose name `only` accepts.
pub fn checklist(plan: &Plan, s: &Snapshot, only: Option<&str>) -> Vec<Check> {
    let mut out = broker_checks(s);
    let pipelines = plan
        .queues
        .iter()
        .filter(|q| q.role == Role::MainQueue && only.is_none_or(|o| o == q.pipeline));
    for main in pipelines {
        let p = main.pipeline.as_str();
        let queues: Vec<&QueueSpec> = plan.queues.iter().filter(|q| q.pipeline == p).collect();
        let items = object_checks(plan, p, &queues, s)
            .into_iter()
            .chain(policy_checks(&queues, s))
            .chain(cycle_checks(plan, &queues, s))
            .chain(limit_checks(&queues, s, p))
            .chain(health_checks(&queues, s, p))
            .chain(circuit_check(s, p))
            .chain(redrive_check(s, p))
            .chain(permission_checks(plan, s, p))
            .chain(idempotency_checks(&queues, s, p));
        out.extend(items.map(|item| item.of(Some(p))));
    }
    out
}

/// The worst level of a checklist (`Pass` when empty).
pub fn worst(checks: &[Check]) -> Level {
    checks.iter().map(|c| c.level).max().unwrap_or(Level::Pass)
}

/// The handler timeout a worker publishes on its `/metrics` page for
/// `pipeline` (the sample of [`HANDLER_TIMEOUT_METRIC`] labelled
/// `queue="PIPELINE"`), in milliseconds.
pub fn handler_timeout_from_metrics(text: &str, pipeline: &str) -> Option<u64> {
    let label = format!(
        "queue=\"{}\"",
        pipeline.replace('\\', "\\\\").replace('"', "\\\"")
    );
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(HANDLER_TIMEOUT_METRIC)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once('}')?,
            None => ("", rest),
        };
        if !labels.split(',').any(|l| l.trim() == label) {
            return None;
        }
        let secs: f64 = value.split_whitespace().next()?.parse().ok()?;
        (secs.is_finite() && secs >= 0.0).then(|| (secs * 1000.0).round() as u64)
    })
}

#[cfg(test)]
#[path = "doctor_tests.rs"]
mod tests;
