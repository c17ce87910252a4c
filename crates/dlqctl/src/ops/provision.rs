//! Declaring a plan on the broker, and checking it without creating
//! anything. Every difference of every object is listed, although the
//! broker names only one per refusal (rabbitmq-facts.md, "Declaring"), and
//! so is every policy or operator policy that changes a planned queue
//! (read through the management API, see [`crate::core::audit::policy`]).

use crate::amqp::declare::{declare_plan, inspect_plan, ready_messages};
use crate::amqp::mgmt::Management;
use crate::core::audit::finding::{binding_name, Finding, ObjectKind};
use crate::core::audit::policy::policy_findings;
use crate::core::audit::stale::{args_match, stale_objects, ListedQueue};
use crate::core::topology::plan::Plan;
use crate::error::Result;
use crate::ops::policies::{planned_type, PolicyView};
use lapin::Connection;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long `--check` waits for the management API to report the policies
/// of a queue when the policy definitions cannot be read: its statistics
/// fill them in a few seconds after the queue is created (or a policy
/// changes). Past it, the queue's policies are reported as unverified.
pub(crate) const POLICY_REPORT_WAIT: Duration = Duration::from_secs(10);

/// How many declarations run at once, each on its own channel.
pub const DEFAULT_PARALLELISM: usize = 16;

/// The result of a provision or a check.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[non_exhaustive]
pub struct Report {
    /// Objects declared (provision) or found as wanted (check).
    #[serde(rename = "objects_as_wanted")]
    pub ok: usize,
    /// Everything that is not as wanted.
    pub findings: Vec<Finding>,
    /// Exchanges and queues this provision created (empty for a check, and
    /// for a provision that found drift: it declares nothing then).
    pub created: Vec<PlannedObject>,
    /// Exchanges and queues that existed as wanted before this provision.
    pub unchanged: Vec<PlannedObject>,
    /// Bindings declared (a binding that exists is declared again, which
    /// changes nothing; AMQP cannot tell the two apart).
    pub bindings: usize,
    /// Wall time.
    #[serde(skip)]
    pub elapsed: Duration,
}

impl Report {
    /// Adds a phase's count of objects as wanted and its findings.
    fn absorb(&mut self, (ok, findings): (usize, Vec<Finding>)) {
        self.ok += ok;
        self.findings.extend(findings);
    }

    /// True when some finding is a real difference.
    pub fn has_differences(&self) -> bool {
        self.findings.iter().any(Finding::is_difference)
    }
}

/// An exchange or queue of the plan, as `provision` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlannedObject {
    /// `exchange` or `queue`.
    pub object: ObjectKind,
    /// Its name.
    pub name: String,
}

/// Provisions all or nothing: checks every exchange and queue first (a
/// passive declare, then the drift search on those that exist). When any
/// differs in a way a redeclare cannot fix (other arguments or type, or a
/// refusal), it declares nothing and reports every difference. Otherwise
/// it declares the missing exchanges and queues, then every binding,
/// `parallelism` at a time, and reports each exchange and queue as created
/// or unchanged. Never deletes or purges.
///
/// Between the check and the declarations someone else may create an
/// object with other arguments: that declaration is refused and reported
/// like any drift, after the objects before it were created.
pub async fn provision(conn: &Connection, plan: &Plan, parallelism: usize) -> Result<Report> {
    let start = Instant::now();
    let mut report = Report::default();
    let (_, found) = inspect_plan(conn, plan, parallelism).await?;
    let (missing, blocking) = split_missing(found);
    if !blocking.is_empty() {
        report.findings = blocking;
        report.elapsed = start.elapsed();
        return Ok(report);
    }
    // By kind and name: a first provision of a large file misses them all.
    let missing_names = |kind: ObjectKind| -> HashSet<&str> {
        missing
            .iter()
            .filter(|m| m.object == kind)
            .map(|m| m.name.as_str())
            .collect()
    };
    let (missing_ex, missing_q) = (
        missing_names(ObjectKind::Exchange),
        missing_names(ObjectKind::Queue),
    );
    let todo = Plan {
        exchanges: (plan.exchanges.iter())
            .filter(|e| missing_ex.contains(e.name.as_str()))
            .cloned()
            .collect(),
        queues: (plan.queues.iter())
            .filter(|q| missing_q.contains(q.name.as_str()))
            .cloned()
            .collect(),
        bindings: plan.bindings.clone(),
    };
    report.absorb(declare_plan(conn, &todo, parallelism).await?);
    report.ok += plan.exchanges.len() + plan.queues.len() - missing.len();
    let planned = (plan.exchanges.iter())
        .map(|e| (ObjectKind::Exchange, &e.name, &missing_ex))
        .chain(
            plan.queues
                .iter()
                .map(|q| (ObjectKind::Queue, &q.name, &missing_q)),
        );
    // A declaration refused after the check (someone else created the
    // object meanwhile) is a finding, not a creation.
    let refused: HashSet<&str> = report.findings.iter().map(Finding::name).collect();
    for (object, name, missing) in planned {
        let o = PlannedObject {
            object,
            name: name.clone(),
        };
        if refused.contains(name.as_str()) {
            continue;
        }
        if missing.contains(name.as_str()) {
            report.created.push(o);
        } else {
            report.unchanged.push(o);
        }
    }
    report.bindings = plan.bindings.len();
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Splits what the check of exchanges and queues found into the objects
/// that are missing (a declaration creates them) and everything else (a
/// declaration cannot fix it).
fn split_missing(found: Vec<Finding>) -> (Vec<PlannedObject>, Vec<Finding>) {
    let mut missing = Vec::new();
    let mut blocking = Vec::new();
    for f in found {
        match f {
            Finding::Missing { object, name } => missing.push(PlannedObject { object, name }),
            other => blocking.push(other),
        }
    }
    (missing, blocking)
}

/// Checks the plan against the broker without creating anything: missing
/// objects, differing arguments and types, and (through the management API
/// when it answers) missing bindings.
pub async fn check(
    conn: &Connection,
    plan: &Plan,
    mgmt: Option<&Management>,
    vhost: &str,
    parallelism: usize,
) -> Result<Report> {
    let start = Instant::now();
    let mut report = Report::default();
    report.absorb(inspect_plan(conn, plan, parallelism).await?);

    let api = match mgmt {
        Some(m) => match m.probe().await {
            Ok(()) => m
                .same_broker(conn, vhost)
                .await
                .map(|()| m)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        None => Err("no management API was given".to_string()),
    };
    for b in &plan.bindings {
        let name = binding_name(b);
        let m = match &api {
            Ok(m) => m,
            Err(why) => {
                report.findings.push(Finding::Unverified {
                    object: ObjectKind::Binding,
                    name,
                    reason: format!("{why} (AMQP cannot check a binding without creating it)"),
                });
                continue;
            }
        };
        match m.bindings(vhost, &b.exchange, &b.queue).await {
            Ok(list) => {
                let found = list.iter().any(|x| {
                    x.routing_key == b.routing_key && args_match(&x.arguments, &b.arguments)
                });
                if found {
                    report.ok += 1;
                } else {
                    report.findings.push(Finding::Missing {
                        object: ObjectKind::Binding,
                        name,
                    });
                }
            }
            Err(e) => report.findings.push(Finding::Unverified {
                object: ObjectKind::Binding,
                name,
                reason: e.to_string(),
            }),
        }
    }
    report.findings.extend(match &api {
        Ok(m) => check_policies(m, plan, vhost, POLICY_REPORT_WAIT).await,
        Err(why) => vec![policies_unverified(
            plan,
            format!("{why} (AMQP cannot see policies)"),
        )],
    });
    report.findings.extend(match &api {
        Ok(m) => stale(conn, m, plan, vhost).await,
        Err(why) => vec![stale_unverified(format!("{why} (AMQP cannot list queues)"))],
    });
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Objects with dlqctl's names that the plan no longer describes, listed
/// through the management API; a queue's depth is its ready messages, read
/// fresh over AMQP, plus the unacked ones the API counted.
async fn stale(conn: &Connection, m: &Management, plan: &Plan, vhost: &str) -> Vec<Finding> {
    let listing = async {
        Ok::<_, crate::error::Error>((m.list_queues(vhost).await?, m.list_bindings(vhost).await?))
    };
    match listing.await {
        Ok((queues, bindings)) => {
            let mut found = stale_objects(plan, &queues, &bindings);
            for f in &mut found {
                if let Finding::NotInTopology {
                    object: ObjectKind::Queue,
                    name,
                    messages,
                } = f
                {
                    if let Some(ready) = ready_messages(conn, name).await {
                        let unacked = queues
                            .iter()
                            .find(|q| &q.name == name)
                            .and_then(|q| q.unacked)
                            .unwrap_or(0);
                        *messages = Some(u64::from(ready) + unacked);
                    }
                }
            }
            found
        }
        Err(e) => vec![stale_unverified(e.to_string())],
    }
}

/// The policies and operator policies of every planned queue that exists:
/// what overrides the plan, and what changes nothing (information), worked
/// out from the policy definitions ([`PolicyView`]). Only when those cannot
/// be read does it wait up to `wait` for the statistics of queues whose
/// policies are not reported yet; those still unreported are unverified. A
/// management API that fails is one unverified finding, not one per queue.
pub(crate) async fn check_policies(
    m: &Management,
    plan: &Plan,
    vhost: &str,
    wait: Duration,
) -> Vec<Finding> {
    let view = PolicyView::read(m, vhost).await;
    let start = Instant::now();
    loop {
        let listed: HashMap<String, ListedQueue> = match m.list_queues(vhost).await {
            Ok(list) => list.into_iter().map(|q| (q.name.clone(), q)).collect(),
            Err(e) => return vec![policies_unverified(plan, e.to_string())],
        };
        let pending = !view.has_definitions()
            && plan
                .queues
                .iter()
                .any(|q| listed.get(&q.name).is_some_and(|l| l.policies.is_none()));
        if !pending || start.elapsed() >= wait {
            return policies_of(&view, plan, &listed);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The policy findings of the planned queues in `listed` (the management
/// API's listing), in plan order, from `view`.
pub(crate) fn policies_of(
    view: &PolicyView,
    plan: &Plan,
    listed: &HashMap<String, ListedQueue>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let any_listed = plan.queues.iter().any(|q| listed.contains_key(&q.name));
    if let (Some(note), true) = (view.fallback_note(), any_listed) {
        out.push(Finding::PolicyWarning {
            object: ObjectKind::Queue,
            name: format!("(policies of the {} queues)", plan.queues.len()),
            note,
        });
    }
    for q in &plan.queues {
        // Not listed: missing, which the AMQP check reports.
        let Some(l) = listed.get(&q.name) else {
            continue;
        };
        let Some(applied) = view.applied(q, l.kind.as_deref(), l.policies.as_ref()) else {
            out.push(Finding::Unverified {
                object: ObjectKind::Queue,
                name: q.name.clone(),
                reason: "the management API has not reported its policies yet, and the policy \
                         definitions could not be read (a queue just created shows them within \
                         seconds: check again)"
                    .into(),
            });
            continue;
        };
        let kind = l.kind.as_deref().unwrap_or(planned_type(q));
        out.extend(policy_findings(q, kind, &applied));
    }
    out
}

/// The one finding when no queue's policies could be read.
pub(crate) fn policies_unverified(plan: &Plan, reason: String) -> Finding {
    Finding::Unverified {
        object: ObjectKind::Queue,
        name: format!("(policies of the {} queues)", plan.queues.len()),
        reason,
    }
}

/// The finding when objects the topology no longer describes could not be
/// listed.
fn stale_unverified(reason: String) -> Finding {
    Finding::Unverified {
        object: ObjectKind::Queue,
        name: "(objects the topology no longer describes)".into(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn missing(object: ObjectKind, name: &str) -> Finding {
        Finding::Missing {
            object,
            name: name.into(),
        }
    }

    #[test]
    fn missing_objects_are_created_and_anything_else_blocks_the_provision() {
        let differs = Finding::Differs {
            object: ObjectKind::Queue,
            name: "q".into(),
            argument: "x-message-ttl".into(),
            wanted: "1000".into(),
            actual: "2000".into(),
        };
        let refused = Finding::Failed {
            object: ObjectKind::Exchange,
            name: "e".into(),
            message: "ACCESS_REFUSED".into(),
            reply_code: Some(403),
        };
        let (m, b) = split_missing(vec![
            missing(ObjectKind::Exchange, "x"),
            differs.clone(),
            missing(ObjectKind::Queue, "y"),
            refused.clone(),
        ]);
        let names: Vec<_> = m.iter().map(|o| (o.object, o.name.as_str())).collect();
        assert_eq!(
            names,
            vec![(ObjectKind::Exchange, "x"), (ObjectKind::Queue, "y")]
        );
        assert_eq!(b, vec![differs, refused]);

        let (m, b) = split_missing(vec![missing(ObjectKind::Queue, "y")]);
        assert_eq!(m.len(), 1);
        assert!(b.is_empty(), "a missing object alone blocks nothing");
        let (m, b) = split_missing(vec![]);
        assert!(m.is_empty() && b.is_empty());
    }
}
