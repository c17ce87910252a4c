//! `dlqctl validate`.

use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::core::topology::plan;
use dlqctl::core::values::text::count;
use dlqctl::load_topology;
use std::path::Path;

/// `dlqctl validate`.
pub fn validate(file: &Path) -> Result<Outcome> {
    let t = load_topology(file)?;
    let p = plan(&t);
    output::stdout_line(&format!(
        "{}: valid, {} pipeline(s), {}, {}, {}",
        file.display(),
        t.pipelines.len(),
        count(p.exchanges.len() as u64, "exchange"),
        count(p.queues.len() as u64, "queue"),
        count(p.bindings.len() as u64, "binding")
    ))?;
    Ok(Outcome::Success)
}
