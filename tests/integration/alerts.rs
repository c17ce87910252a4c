//! The Prometheus alerting rules in `deploy/prometheus/`: valid, passing
//! their `promtool` unit tests, and written against metric names the
//! worker really exports. `promtool` comes with Debian's `prometheus`
//! package (`.ci/run` installs it); without it these tests fail, saying so.

use std::path::Path;
use std::process::Command;

fn promtool(args: &[&str]) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus");
    let out = Command::new("promtool")
        .args(args)
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install it with `apt-get install prometheus` \
                 (Debian's package ships promtool), or run .ci/run"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_alert_rules_are_valid_and_pass_their_unit_tests() {
    let checked = promtool(&["check", "rules", "dlqctl-rules.yaml"]);
    assert!(checked.contains("SUCCESS: 6 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "dlqctl-rules.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The rules name metrics the worker exports.
#[test]
fn the_rules_use_the_workers_metric_names() {
    let rules = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/dlqctl-rules.yaml"),
    )
    .expect("the rules file");
    let m = dlqctl::worker::metrics::Metrics::new();
    let q = m.queue_counters("orders");
    q.decision("dead_letter");
    m.set_circuit(
        "orders",
        dlqctl::core::retry::breaker::Phase::Closed,
        0.0,
        false,
    );
    m.record_redrive(&dlqctl::worker::metrics::RedriveRun {
        queue: "orders",
        result: dlqctl::core::dlq::redrive::RunResult::CanaryFailed,
        moved: 0,
        waiting_for_person: None,
        next_wait_ms: 60_000,
    });
    let exported = m.render();
    for name in [
        "dlqctl_decisions_total",
        "dlqctl_circuit_open",
        "dlqctl_redrive_runs_total",
    ] {
        assert!(rules.contains(name), "the rules do not use {name}");
        assert!(
            exported.contains(name),
            "the worker does not export {name}:\n{exported}"
        );
    }
    assert!(exported.contains("decision=\"dead_letter\""), "{exported}");
}
