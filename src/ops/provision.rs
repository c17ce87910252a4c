//! Declaring a plan on the broker, and checking it without creating
//! anything. Every difference of every object is listed, although the
//! broker names only one per refusal (rabbitmq-facts.md, "Declaring").

use crate::amqp::declare::{declare_plan, inspect_plan, ready_messages};
use crate::amqp::mgmt::Management;
use crate::core::finding::{binding_name, Finding, ObjectKind};
use crate::core::stale::{args_match, stale_objects};
use crate::core::topology::plan::Plan;
use crate::error::Result;
use lapin::Connection;
use std::time::{Duration, Instant};

/// How many declarations run at once, each on its own channel.
pub const DEFAULT_PARALLELISM: usize = 16;

/// The result of a provision or a check.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// Objects declared (provision) or found as wanted (check).
    pub ok: usize,
    /// Everything that is not as wanted.
    pub findings: Vec<Finding>,
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

/// Declares every object of the plan: exchanges, then queues, then
/// bindings, `parallelism` at a time. Never deletes or purges. An object
/// that exists with other arguments is left as it is and reported with
/// every difference.
pub async fn provision(conn: &Connection, plan: &Plan, parallelism: usize) -> Result<Report> {
    let start = Instant::now();
    let mut report = Report::default();
    report.absorb(declare_plan(conn, plan, parallelism).await?);
    report.elapsed = start.elapsed();
    Ok(report)
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

/// The finding when objects the topology no longer describes could not be
/// listed.
fn stale_unverified(reason: String) -> Finding {
    Finding::Unverified {
        object: ObjectKind::Queue,
        name: "(objects the topology no longer describes)".into(),
        reason,
    }
}
