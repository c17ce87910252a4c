//! The check at start: the pipeline's objects exist with the topology's arguments.

use crate::core::finding::Finding;
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
    let mut missing = Vec::new();
    let mut differs = Vec::new();
    for f in &report.findings {
        match f {
            Finding::Missing { object, name } => {
                missing.push(format!("{} {name}", object.as_str()))
            }
            Finding::Differs { .. } => differs.push(f.to_string()),
            Finding::Failed { message, .. } if message.contains("403") => {
                warn!(finding = %f, "cannot compare the topology's arguments (no configure permission); trusting the file");
            }
            Finding::Failed { .. } => differs.push(f.to_string()),
            Finding::Unverified { .. } => {}
        }
    }
    if !missing.is_empty() {
        return Err(Error::Broker {
            context: format!("pipeline {} is not provisioned", p.name),
            message: format!(
                "missing {}; run `dlqctl provision` on the topology file first",
                missing.join(", ")
            ),
        });
    }
    if !differs.is_empty() {
        return Err(Error::Broker {
            context: format!("pipeline {} differs from the topology file", p.name),
            message: format!("{}; see `dlqctl provision --check`", differs.join("; ")),
        });
    }
    Ok(())
}
