//! What `dlqctl doctor` prints: text, JSON, or GitHub annotations.

use crate::output::annotations::{workflow_command, Level as Annotation};
use dlqctl::core::audit::doctor::{worst, Check, Level};
use dlqctl::core::topology::Topology;

/// How many items came out at each level, worst first.
fn counts(checks: &[Check]) -> [(Level, usize); 4] {
    [Level::Fail, Level::Warn, Level::Skip, Level::Pass]
        .map(|l| (l, checks.iter().filter(|c| c.level == l).count()))
}

/// `dlqctl doctor FILE: fail (2 fail, 1 warn, 3 skip, 20 pass)`.
pub fn headline(file: &str, checks: &[Check]) -> String {
    let parts: Vec<String> = counts(checks)
        .iter()
        .map(|(l, n)| format!("{n} {}", l.as_str()))
        .collect();
    format!(
        "dlqctl doctor {file}: {} ({})",
        worst(checks).as_str(),
        parts.join(", ")
    )
}

/// The checklist for people: the headline, then the broker's items and
/// each pipeline's, one line each.
pub fn doctor_text(file: &str, checks: &[Check]) -> String {
    let mut out = format!("{}\n", headline(file, checks));
    let mut current: Option<Option<&str>> = None;
    for c in checks {
        let group = c.pipeline.as_deref();
        if current != Some(group) {
            current = Some(group);
            match group {
                None => out.push_str("broker\n"),
                Some(p) => out.push_str(&format!("pipeline {p}\n")),
            }
        }
        out.push_str(&format!(
            "  {:<4}  {:<11}  {}: {}\n",
            c.level.as_str(),
            c.area.as_str(),
            c.subject,
            c.message
        ));
    }
    out
}

/// The checklist as one JSON document: `result` (the worst level),
/// `counts`, and every item.
pub fn doctor_json(checks: &[Check]) -> String {
    let counts: serde_json::Map<String, serde_json::Value> = counts(checks)
        .iter()
        .map(|(l, n)| (l.as_str().to_string(), serde_json::json!(n)))
        .collect();
    super::json::document(&serde_json::json!({
        "result": worst(checks).as_str(),
        "counts": counts,
        "checks": checks,
    }))
}

/// The title of a doctor annotation.
pub const DOCTOR_TITLE: &str = "dlqctl doctor";

/// Each fail as an `::error`, each warning as a `::warning`, on the line
/// of its pipeline in the topology file (line 1 for the broker's items),
/// then the headline.
pub fn doctor_github(file: &str, topology: &Topology, checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let level = match c.level {
            Level::Fail => Annotation::Error,
            Level::Warn => Annotation::Warning,
            Level::Pass | Level::Skip => continue,
        };
        let line = c
            .pipeline
            .as_deref()
            .and_then(|p| topology.pipeline(p))
            .map(|p| p.line)
            .filter(|l| *l > 0)
            .unwrap_or(1);
        let message = format!("{} {}: {}", c.area.as_str(), c.subject, c.message);
        out.push_str(&workflow_command(level, file, line, DOCTOR_TITLE, &message));
        out.push('\n');
    }
    out.push_str(&headline(file, checks));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlqctl::core::audit::doctor::Area;

    fn check(pipeline: Option<&str>, level: Level, subject: &str) -> Check {
        Check {
            pipeline: pipeline.map(str::to_string),
            area: Area::Health,
            level,
            subject: subject.into(),
            message: "a, b: c".into(),
        }
    }

    #[test]
    fn text_groups_by_pipeline_and_json_counts_levels() {
        let checks = vec![
            check(None, Level::Pass, "version"),
            check(Some("a"), Level::Warn, "queue a"),
            check(Some("a"), Level::Fail, "queue a.dlq"),
            check(Some("b"), Level::Skip, "queue b"),
        ];
        let text = doctor_text("t.yaml", &checks);
        assert_eq!(
            text,
            "dlqctl doctor t.yaml: fail (1 fail, 1 warn, 1 skip, 1 pass)\nbroker\n  pass  health       \
             version: a, b: c\npipeline a\n  warn  health       queue a: a, b: c\n  fail  health       \
             queue a.dlq: a, b: c\npipeline b\n  skip  health       queue b: a, b: c\n"
        );
        let v: serde_json::Value = serde_json::from_str(&doctor_json(&checks)).unwrap();
        assert_eq!(v["result"], "fail");
        assert_eq!(v["counts"]["warn"], 1);
        assert_eq!(v["checks"][2]["level"], "fail");
        assert_eq!(v["checks"][2]["pipeline"], "a");
        assert_eq!(v["checks"][0]["pipeline"], serde_json::Value::Null);
        assert_eq!(
            doctor_json(&[]),
            serde_json::to_string_pretty(&serde_json::json!({
                "result": "pass",
                "counts": {"fail": 0, "warn": 0, "skip": 0, "pass": 0},
                "checks": [],
            }))
            .unwrap()
        );
    }

    #[test]
    fn github_annotates_fails_and_warnings_on_their_pipeline_line() {
        let yaml = "version: 1\npipelines:\n  - name: a\n  - name: b\n";
        let t = dlqctl::core::topology::parse_topology(yaml, "t.yaml").unwrap();
        let checks = vec![
            check(None, Level::Fail, "version"),
            check(Some("b"), Level::Warn, "queue b"),
            check(Some("a"), Level::Pass, "queue a"),
        ];
        assert_eq!(
            doctor_github("t.yaml", &t, &checks),
            "::error file=t.yaml,line=1,title=dlqctl doctor::health version: a, b: c\n\
             ::warning file=t.yaml,line=4,title=dlqctl doctor::health queue b: a, b: c\n\
             dlqctl doctor t.yaml: fail (1 fail, 1 warn, 0 skip, 1 pass)\n"
        );
    }
}
