//! What `dlqctl drill` prints: its timeline.

use crate::output::annotations::{workflow_command, Level};
use dlqctl::core::drill::timeline::DrillVerdict;
use dlqctl::ops::drill::DrillReport;

/// `dlqctl drill orders: pass (drill 0123..., 1.2s)`.
pub fn headline(r: &DrillReport) -> String {
    let verdict = match r.verdict() {
        DrillVerdict::Pass => "pass".to_string(),
        DrillVerdict::FailedAt(step) => format!("fail at step `{step}`"),
    };
    format!(
        "dlqctl drill {}: {verdict} (drill {}, {:.1}s)",
        r.pipeline,
        r.id,
        r.elapsed_ms as f64 / 1000.0
    )
}

/// The timeline for people: the headline, a line per step with the time
/// it took, then what was cleaned up.
pub fn drill_text(r: &DrillReport) -> String {
    let mut out = format!("{}\n", headline(r));
    for s in &r.steps {
        out.push_str(&format!(
            "  {:<4}  {:<16} {:>8.2}s  {}\n",
            if s.ok { "ok" } else { "FAIL" },
            s.name,
            s.took_ms as f64 / 1000.0,
            s.detail
        ));
    }
    if r.swept > 0 {
        out.push_str(&format!(
            "removed {} drill message(s) left in the DLQ by earlier drills\n",
            r.swept
        ));
    }
    if r.removed > 0 {
        out.push_str(&format!(
            "removed this drill's message from the DLQ ({})\n",
            r.removed
        ));
    }
    if let Some(redrive) = &r.redrive {
        out.push_str(&format!("redrive: {redrive}\n"));
    }
    out
}

/// The report as JSON.
pub fn drill_json(r: &DrillReport) -> String {
    super::json::document(r)
}

/// The failed step as an `::error` on the pipeline's line, then the text.
pub fn drill_github(file: &str, line: u64, r: &DrillReport) -> String {
    let mut out = String::new();
    if let Some(step) = r.steps.iter().find(|s| !s.ok) {
        out.push_str(&workflow_command(
            Level::Error,
            file,
            line.max(1),
            "dlqctl drill",
            &format!(
                "{}: step `{}` did not hold: {}",
                r.pipeline, step.name, step.detail
            ),
        ));
        out.push('\n');
    }
    out.push_str(&drill_text(r));
    out
}
