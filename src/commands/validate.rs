//! `dlqctl validate`.

use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::core::audit::futile::futile_settings;
use dlqctl::core::audit::idempotency::topology_warnings;
use dlqctl::core::topology::plan;
use dlqctl::core::values::text::count;
use dlqctl::load_topology;
use std::path::Path;

/// `dlqctl validate`: the summary on stdout; warnings and notes on what
/// is valid but deserves a look (a password written in the file, a key
/// that joins identical bodies, a `keep` too short, a breaker that never
/// opens) on stderr as `FILE:LINE: warning: ...`,
/// without changing the exit code.
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
    let mut warnings = topology_warnings(&t);
    warnings.extend(futile_settings(&t));
    warnings.sort_by_key(|(line, _)| *line);
    for (line, text) in warnings {
        output::stderr_line(&format!("{}:{}: {text}", file.display(), line.max(1)));
    }
    Ok(Outcome::Success)
}
