//! The check at start: the pipeline's objects exist with the topology's arguments.

use crate::core::audit::finding::Finding;
use crate::core::topology::Pipeline;
use crate::error::{Error, Result};
use lapin::Connection;
use tracing::warn;

/// Checks that every object the worker uses exists with the arguments the
/// topology gives it (the worker relies on them: a quorum main queue holds
/// a refused dead-letter, a classic one would drop it), naming each missing
/// or different object. Uses `provision --check`'s method; without
/// configure permission the arguments cannot be compared, which is logged.
pub async fn verify_topology(conn: &Connection, p: &Pipeline) -> Result<()> {
    let mut plan = crate::core::topology::plan::pipeline_plan(p);
    plan.exchanges
        .retain(|e| e.role != crate::core::topology::plan::Role::ProducerExchange);
    plan.bindings.clear();
    let report = crate::ops::provision::check(conn, &plan, None, "/", 4).await?;
    for trusted in judge(&p.name, &report.findings)? {
        warn!(finding = %trusted, "cannot compare the topology's arguments (no configure permission); trusting the file");
    }
    Ok(())
}

/// Reads the check's findings: an error naming every missing or differing
/// object, or the findings that could not be checked for lack of
/// permission (by the broker's reply code 403, never by words), which the
/// worker trusts and logs.
fn judge<'f>(pipeline: &str, findings: &'f [Finding]) -> Result<Vec<&'f Finding>> {
    let mut missing = Vec::new();
    let mut differs = Vec::new();
    let mut trusted = Vec::new();
    for f in findings {
        match f {
            Finding::Missing { object, name } => {
                missing.push(format!("{} {name}", object.as_str()))
            }
            Finding::Differs { .. } => differs.push(f.to_string()),
            Finding::Failed {
                reply_code: Some(403),
                ..
            } => trusted.push(f),
            Finding::Failed { .. } => differs.push(f.to_string()),
            // The worker's check has no management API: policies are not
            // read here (`provision --check` and `status` read them).
            Finding::Unverified { .. }
            | Finding::NotInTopology { .. }
            | Finding::PolicyOverrides { .. }
            | Finding::PolicyInfo { .. }
            | Finding::PolicyWarning { .. } => {}
        }
    }
    if !missing.is_empty() {
        return Err(Error::Broker {
            context: format!("pipeline {pipeline} is not provisioned"),
            message: format!(
                "missing {}; run `dlqctl provision` on the topology file first",
                missing.join(", ")
            ),
        });
    }
    if !differs.is_empty() {
        return Err(Error::Broker {
            context: format!("pipeline {pipeline} differs from the topology file"),
            message: format!("{}; see `dlqctl provision --check`", differs.join("; ")),
        });
    }
    Ok(trusted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::audit::finding::ObjectKind;

    fn failed(name: &str, message: &str, reply_code: Option<u16>) -> Finding {
        Finding::Failed {
            object: ObjectKind::Queue,
            name: name.into(),
            message: message.into(),
            reply_code,
        }
    }

    #[test]
    fn only_a_403_reply_is_trusted_never_a_name_or_text_with_403() {
        let ok = [failed("orders", "ACCESS_REFUSED - configure", Some(403))];
        assert_eq!(judge("orders", &ok).unwrap().len(), 1);
        // A queue named x403 whose declare failed for another reason.
        let other = [failed("x403", "PRECONDITION_FAILED 403 bytes", Some(406))];
        assert!(judge("orders", &other).is_err());
        let no_code = [failed("q", "error 403", None)];
        assert!(judge("orders", &no_code).is_err());
    }

    #[test]
    fn missing_objects_are_all_named() {
        let f = [
            Finding::Missing {
                object: ObjectKind::Queue,
                name: "a".into(),
            },
            Finding::Missing {
                object: ObjectKind::Exchange,
                name: "b".into(),
            },
        ];
        let e = judge("orders", &f).unwrap_err().to_string();
        assert!(e.contains("queue a") && e.contains("exchange b"), "{e}");
    }
}
