//! Doctor's items on a pipeline's objects and the policies that apply to
//! them: every planned exchange and queue exists; each key of a policy or
//! operator policy that changes a queue fails (see
//! [`crate::audit::policy`]), the others pass; a DLQ that
//! dead-letters back into its own pipeline fails.

use crate::audit::cycle::dead_letter_cycle;
use crate::audit::doctor_broker::management_why;
use crate::audit::doctor_item::{plural, Area, Item, Level};
use crate::audit::doctor_snapshot::Snapshot;
use crate::audit::finding::Finding;
use crate::audit::policy::policy_findings;
use crate::topology::plan::{Plan, QueueSpec, Role};
use crate::topology::ArgValue;

/// A fail per planned exchange or queue of pipeline `p` that does not
/// exist, or one pass.
pub(super) fn object_checks(
    plan: &Plan,
    p: &str,
    queues: &[&QueueSpec],
    s: &Snapshot,
) -> Vec<Item> {
    let missing = |subject: String| Item {
        area: Area::Objects,
        level: Level::Fail,
        subject,
        message: "does not exist: run `dlqctl provision`".into(),
    };
    let mut out = Vec::new();
    let exchanges: Vec<&str> = plan
        .exchanges
        .iter()
        .filter(|e| e.pipelines.iter().any(|x| x == p))
        .map(|e| e.name.as_str())
        .collect();
    for e in exchanges
        .iter()
        .filter(|e| s.missing_exchanges.iter().any(|m| m == *e))
    {
        out.push(missing(format!("exchange {e}")));
    }
    for q in queues {
        if s.queue(&q.name).is_none() {
            out.push(missing(format!("queue {}", q.name)));
        }
    }
    if out.is_empty() {
        out.push(Item {
            area: Area::Objects,
            level: Level::Pass,
            subject: "exchanges and queues".into(),
            message: format!(
                "all {} exist (`provision --check` compares their arguments)",
                exchanges.len() + queues.len()
            ),
        });
    }
    out
}

fn planned_type(q: &QueueSpec) -> &str {
    match q.arguments.get("x-queue-type") {
        Some(ArgValue::Str(t)) => t.as_str(),
        _ => "classic",
    }
}

/// Per queue that exists, an item per policy finding; then one pass for
/// the queues no policy changes and one skip for those whose policies are
/// unknown.
pub(super) fn policy_checks(queues: &[&QueueSpec], s: &Snapshot) -> Vec<Item> {
    let mut out = Vec::new();
    let mut unknown = 0;
    let mut clean = 0;
    for q in queues {
        let Some(facts) = s.queue(&q.name) else {
            continue;
        };
        let Some(applied) = &facts.policies else {
            unknown += 1;
            continue;
        };
        let kind = facts.kind.as_deref().unwrap_or(planned_type(q));
        let findings = policy_findings(q, kind, applied);
        if findings.is_empty() {
            clean += 1;
        }
        for f in findings {
            out.push(policy_item(&q.name, kind, &f));
        }
    }
    if clean > 0 {
        out.push(Item {
            area: Area::Policies,
            level: Level::Pass,
            subject: "queues".into(),
            message: format!(
                "no policy or operator policy applies to {clean} queue{}",
                plural(clean)
            ),
        });
    }
    if unknown > 0 {
        out.push(Item {
            area: Area::Policies,
            level: Level::Skip,
            subject: "queues".into(),
            message: format!(
                "the policies of {unknown} queue{} are unknown: {}",
                plural(unknown),
                management_why(s, "the management API has not reported them yet")
            ),
        });
    }
    out
}

/// The item of one policy finding `f` on the queue `queue` of type
/// `kind`: a fail for a key that overrides the topology, a warning on how
/// the policies were worked out, else a pass.
fn policy_item(queue: &str, kind: &str, f: &Finding) -> Item {
    let subject = format!("queue {queue}");
    // The finding's text without the queue, which is the subject.
    let text = f.to_string();
    let text = (text.strip_prefix("info: "))
        .or_else(|| text.strip_prefix("warning: "))
        .unwrap_or(&text);
    let text = text
        .strip_prefix(&format!("{subject}: "))
        .unwrap_or(text)
        .to_string();
    let (level, message) = match f {
        Finding::PolicyOverrides { key, effective, .. } => {
            let mut message = text;
            if key == "overflow" && effective == "\"drop-head\"" && kind == "quorum" {
                message.push_str(
                    "; the broker falls back to at-most-once dead-lettering: a full or \
                     missing DLQ loses messages",
                );
            }
            message.push_str(
                "; remove the key from the policy or narrow its pattern so it does not \
                 match this queue",
            );
            (Level::Fail, message)
        }
        Finding::PolicyWarning { .. } => (Level::Warn, text),
        _ => (Level::Pass, text),
    };
    Item {
        area: Area::Policies,
        level,
        subject,
        message,
    }
}

/// A DLQ whose dead-letter exchange (from a policy, or an argument)
/// routes back into its own pipeline ([`dead_letter_cycle`]): a fail
/// naming what set it and the path.
pub(super) fn cycle_checks(plan: &Plan, queues: &[&QueueSpec], s: &Snapshot) -> Vec<Item> {
    queues
        .iter()
        .filter(|q| q.role == Role::DeadLetterQueue)
        .filter_map(|q| {
            let facts = s.queue(&q.name)?;
            let c = dead_letter_cycle(plan, q, facts.policies.as_ref())?;
            Some(Item {
                area: Area::Policies,
                level: Level::Fail,
                subject: format!("dead-letter cycle of {}", q.name),
                message: c.message(),
            })
        })
        .collect()
}
