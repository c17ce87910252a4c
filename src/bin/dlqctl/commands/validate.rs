//! `dlqctl validate`.

use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::core::topology::plan;
use dlqctl::load_topology;
use std::path::Path;

/// `dlqctl validate`.
pub fn validate(file: &Path) -> Result<Outcome> {
    let t = load_topology(file)?;
    let p = plan(&t);
    output::stdout_line(&format!(
        "{}: valid, {} pipeline(s), {} exchanges, {} queues, {} bindings",
        file.display(),
        t.pipelines.len(),
        p.exchanges.len(),
        p.queues.len(),
        p.bindings.len()
    ))?;
    Ok(Outcome::Success)
}
