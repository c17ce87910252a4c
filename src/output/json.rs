//! What a machine sees, with `--json`.

use dlqctl::core::topology::plan::Plan;
use dlqctl::ops::provision::Report;
use dlqctl::ops::status::{OverThreshold, StatusReport};

/// Every JSON document a command prints (`--json`, `--format json`):
/// pretty-printed with two-space indents, the same for every command, so
/// that people read it and `jq` takes it alike. (What is JSON Lines, as an
/// export's messages and `--log-format json` records, is one line each.)
pub fn document<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| {
        serde_json::json!({ "error": format!("cannot write the report as JSON: {e}") }).to_string()
    })
}

/// The plan as JSON.
pub fn plan_json(plan: &Plan) -> String {
    document(plan)
}

/// A provision or check report as JSON. `objects_as_wanted`: the
/// exchanges, queues and bindings that are as the topology wants them
/// (after a provision: declared or found so; for a check: found so).
pub fn report_json(report: &Report, status: &str, provision: bool) -> String {
    let mut v = serde_json::json!({
        "status": status,
        "objects_as_wanted": report.ok,
        "elapsed_ms": report.elapsed.as_millis() as u64,
        "findings": report.findings,
    });
    if provision {
        // What this provision did, object by object (nothing on drift).
        v["created"] = serde_json::json!(report.created);
        v["unchanged"] = serde_json::json!(report.unchanged);
        v["bindings_declared"] = serde_json::json!(report.bindings);
    }
    document(&v)
}

/// `status --json`: the report, what is missing, what is over the
/// threshold and the policies that override the topology; `status` is
/// `ok`, `missing`, `over_threshold` or `policy_overrides` (the first that
/// applies).
pub fn status_json(
    report: &StatusReport,
    missing: &[String],
    max_dlq: Option<u64>,
    over: &[OverThreshold],
) -> String {
    let status = if !missing.is_empty() {
        "missing"
    } else if !over.is_empty() {
        "over_threshold"
    } else if !report.policy_overrides.is_empty() {
        "policy_overrides"
    } else {
        "ok"
    };
    let v = serde_json::json!({
        "status": status,
        "missing": missing,
        "max_dlq": max_dlq,
        "over_threshold": over,
        "pipelines": report.pipelines,
        "missing_exchanges": report.missing_exchanges,
        "management_unavailable": report.management_unavailable,
        "policy_overrides": report.policy_overrides,
        "circuit_unknown": report.circuit_unknown,
        "workers": report.workers,
        "policy_warnings": report.policy_warnings,
    });
    document(&v)
}

/// The error that ended a command, under `--log-format json`: one record
/// shaped like the log's (`timestamp`, `level`, `fields.message`,
/// `target`), with the exit code in `fields.exit_code`.
pub fn error_record(message: &str, outcome: crate::exit::Outcome) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    serde_json::json!({
        "timestamp": dlqctl::core::values::text::rfc3339_millis(now),
        "level": "ERROR",
        "fields": { "message": message, "exit_code": outcome.code() },
        "target": "dlqctl",
    })
    .to_string()
}

#[cfg(test)]
mod error_record_tests {
    use super::*;

    #[test]
    fn an_error_is_one_json_record_with_its_exit_code() {
        let line = error_record("cannot connect\nhint", crate::exit::Outcome::Failure);
        assert!(!line.contains('\n'), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["fields"]["message"], "cannot connect\nhint");
        assert_eq!(v["fields"]["exit_code"], 1);
        assert!(
            v["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{v}"
        );
    }
}
