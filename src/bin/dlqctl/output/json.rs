//! What a machine sees, with `--json`.

use dlqctl::core::topology::plan::Plan;
use dlqctl::ops::provision::Report;

/// The plan as JSON.
pub fn plan_json(plan: &Plan) -> String {
    serde_json::to_string_pretty(plan).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// A provision or check report as JSON.
pub fn report_json(report: &Report, status: &str) -> String {
    let v = serde_json::json!({
        "status": status,
        "ok": report.ok,
        "elapsed_ms": report.elapsed.as_millis() as u64,
        "findings": report.findings,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}
