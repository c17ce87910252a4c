//! What a person sees: plans, findings and reports as text.

use dlqctl::core::finding::Finding;
use dlqctl::core::topology::plan::{Plan, Role};
use dlqctl::core::topology::Arguments;
use dlqctl::ops::provision::Report;

fn role(r: Role) -> &'static str {
    match r {
        Role::ProducerExchange => "producers' exchange",
        Role::RetryExchange => "retry exchange",
        Role::DeadLetterExchange => "dead-letter exchange",
        Role::MainQueue => "main queue",
        Role::RetryQueue => "retry queue",
        Role::DeadLetterQueue => "dead-letter queue",
    }
}

fn args(a: &Arguments) -> String {
    a.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The plan as text: one object per line.
pub fn plan_text(plan: &Plan) -> String {
    let mut out = String::new();
    for e in &plan.exchanges {
        out += &format!(
            "exchange {:<width$} type={} durable  # {} of {}\n",
            e.name,
            e.kind.as_str(),
            role(e.role),
            e.pipelines.join(", "),
            width = 0
        );
    }
    for q in &plan.queues {
        out += &format!(
            "queue    {} durable {}  # {} of {}\n",
            q.name,
            args(&q.arguments),
            role(q.role),
            q.pipeline
        );
    }
    for b in &plan.bindings {
        let a = if b.arguments.is_empty() {
            String::new()
        } else {
            format!(" {}", args(&b.arguments))
        };
        out += &format!(
            "binding  {} -> {} key={:?}{a}\n",
            b.exchange, b.queue, b.routing_key
        );
    }
    out += &format!(
        "{} exchanges, {} queues, {} bindings\n",
        plan.exchanges.len(),
        plan.queues.len(),
        plan.bindings.len()
    );
    out
}

/// Findings as text lines.
pub fn findings_text(findings: &[Finding]) -> String {
    findings.iter().map(|f| format!("  {f}\n")).collect()
}

/// The hint printed after drift.
pub const DRIFT_HINT: &str = "hint: RabbitMQ cannot change a queue's arguments or an exchange's type in place. \
Migrate: create the new object under another name (or delete and recreate it), after moving its messages \
(e.g. with a shovel); deleting a queue loses the messages it holds. dlqctl never deletes or purges anything.";

/// The result of `provision --check` as text: a headline, then a line per
/// finding. The headline says "matches" only when nothing differs and
/// nothing went unverified.
pub fn check_text(file: &str, report: &Report) -> String {
    let differences = report.findings.iter().filter(|f| f.is_difference()).count();
    let unverified = report.findings.len() - differences;
    let headline = if differences > 0 {
        format!("{file}: the broker differs from the topology ({differences} finding(s)):")
    } else if unverified > 0 {
        format!(
            "{file}: no difference in the {} objects checked in {:.2}s, but {unverified} could not be verified:",
            report.ok,
            report.elapsed.as_secs_f64()
        )
    } else {
        format!(
            "{file}: the broker matches the topology ({} objects checked in {:.2}s)",
            report.ok,
            report.elapsed.as_secs_f64()
        )
    };
    let mut out = format!("{headline}\n{}", findings_text(&report.findings));
    if report
        .findings
        .iter()
        .any(|f| matches!(f, Finding::NotInTopology { .. }))
    {
        out += RETIRE_HINT;
        out.push('\n');
    }
    out
}

/// The hint printed after objects the topology no longer describes.
pub const RETIRE_HINT: &str =
    "hint: dlqctl never deletes anything. Once a queue that is not in the topology is empty \
and nothing routes to it, retire it (README, \"Retiring old objects\"); a binding, unbind it.";

/// What `provision` says when existing objects differ from the file.
pub fn drift_text(file: &str, report: &Report) -> String {
    format!(
        "{file}: {} object(s) declared; these differ from the topology and were left as they are:\n{}{DRIFT_HINT}",
        report.ok,
        findings_text(&report.findings)
    )
}
