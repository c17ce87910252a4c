//! What a person sees: plans, findings and reports as text.

use dlqctl::core::audit::finding::Finding;
use dlqctl::core::topology::plan::{Plan, Role};
use dlqctl::core::topology::Arguments;
use dlqctl::core::values::text::{count, escape_controls as esc};
use dlqctl::ops::dlq::export::ExportReport;
use dlqctl::ops::dlq::purge::PurgeReport;
use dlqctl::ops::dlq::replay::{CanaryReport, ReplayReport};
use dlqctl::ops::dlq::{PeekReport, SummaryReport};
use dlqctl::ops::provision::Report;
use dlqctl::ops::status::{OverThreshold, QueueStatus, StatusReport};

fn role(r: Role) -> &'static str {
    match r {
        Role::ProducerExchange => "producers' exchange",
        Role::RetryExchange => "retry exchange",
        Role::DeadLetterExchange => "dead-letter exchange",
        Role::MainQueue => "main queue",
        Role::RetryQueue => "retry queue",
        Role::DeadLetterQueue => "dead-letter queue",
        Role::RedriveState => "redrive-state queue",
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
        "{}, {}, {}\n",
        count(plan.exchanges.len() as u64, "exchange"),
        count(plan.queues.len() as u64, "queue"),
        count(plan.bindings.len() as u64, "binding")
    );
    out
}

/// Findings as text lines. Objects left unverified for one cause (a
/// management API that does not answer leaves every binding, the
/// policies and the stale objects unverified) share one line naming it,
/// then a line each, at the place of the first of them.
pub fn findings_text(findings: &[Finding]) -> String {
    let cause = |f: &Finding| match f {
        Finding::Unverified { reason, .. } => Some(unverified_cause(reason).to_string()),
        _ => None,
    };
    let shared = |c: &str| {
        findings
            .iter()
            .filter(|f| cause(f).as_deref() == Some(c))
            .count()
            > 1
    };
    let mut said = std::collections::HashSet::new();
    let mut out = String::new();
    for f in findings {
        match (f, cause(f)) {
            (Finding::Unverified { object, name, .. }, Some(c)) if shared(&c) => {
                if said.insert(c.clone()) {
                    out += &format!("  {c}; so these could not be verified:\n");
                }
                out += &format!("    unverified {} {name}\n", object.as_str());
            }
            _ => out += &format!("  {f}\n"),
        }
    }
    out
}

/// What left an object unverified, without the note on why AMQP alone
/// cannot tell (a last ` (...)`): `management API URL: error sending request`.
fn unverified_cause(reason: &str) -> &str {
    match reason.rsplit_once(" (") {
        Some((cause, note)) if note.ends_with(')') && !cause.is_empty() => cause,
        _ => reason,
    }
}

/// `status`'s lines on policies: each override and warning, then a count
/// of the overrides.
fn policy_lines(report: &StatusReport) -> String {
    let mut out = String::new();
    let overrides = &report.policy_overrides;
    for f in overrides.iter().chain(&report.policy_warnings) {
        out += &format!("POLICY {f}\n");
    }
    if !overrides.is_empty() {
        out += &format!(
            "{} policy key(s) override the topology: see `dlqctl provision --check`\n",
            overrides.len()
        );
    }
    out
}

/// The hint printed after drift.
pub const DRIFT_HINT: &str = "hint: RabbitMQ cannot change a queue's arguments or an exchange's type in place. \
Migrate: create the new object under another name (or delete and recreate it), after moving its messages \
(e.g. with a shovel); deleting a queue loses the messages it holds. dlqctl never deletes or purges anything.";

/// The result of `provision --check` as text: a headline, then a line per
/// finding. The headline says "matches" only when nothing differs and
/// nothing went unverified.
pub fn check_text(file: &str, report: &Report) -> String {
    let (headline, hint) = check_headline(file, report);
    format!("{headline}\n{}{hint}", findings_text(&report.findings))
}

/// The headline of a check, and the hint that follows its findings (empty,
/// or a line ending in a newline).
pub fn check_headline(file: &str, report: &Report) -> (String, String) {
    let differences = report.findings.iter().filter(|f| f.is_difference()).count();
    let info = report.findings.iter().filter(|f| f.is_info()).count();
    let warnings = report.findings.iter().filter(|f| f.is_warning()).count();
    let unverified = report.findings.len() - differences - info - warnings;
    let headline = if differences > 0 {
        format!("{file}: the broker differs from the topology ({differences} finding(s)):")
    } else if unverified > 0 {
        format!(
            "{file}: no difference in the {} objects checked in {:.2}s, but {unverified} could not be verified:",
            report.ok,
            report.elapsed.as_secs_f64()
        )
    } else if warnings > 0 {
        format!(
            "{file}: the broker matches the topology ({} objects checked in {:.2}s), with \
             {warnings} warning(s) on its policies:",
            report.ok,
            report.elapsed.as_secs_f64()
        )
    } else if info > 0 {
        format!(
            "{file}: the broker matches the topology ({} objects checked in {:.2}s); \
             policies set {info} key(s) that change nothing it relies on:",
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
    let mut hint = String::new();
    if report
        .findings
        .iter()
        .any(|f| matches!(f, Finding::NotInTopology { .. }))
    {
        hint += &format!("{RETIRE_HINT}\n");
    }
    if report
        .findings
        .iter()
        .any(|f| matches!(f, Finding::PolicyOverrides { .. }))
    {
        hint += &format!("{POLICY_HINT}\n");
    }
    (headline, hint)
}

/// The hint printed after policies that override the topology.
pub const POLICY_HINT: &str =
    "hint: a policy or operator policy changes these queues whatever their arguments say. Narrow the \
policy's pattern so that it does not match them, or change it (`rabbitmqctl list_policies`, \
`list_operator_policies`); dlqctl never changes policies.";

/// The hint printed after objects the topology no longer describes.
pub const RETIRE_HINT: &str =
    "hint: dlqctl never deletes anything. Once a queue that is not in the topology is empty \
and nothing routes to it, retire it (docs/topology.md, \"Retiring old objects\"); a binding, unbind it.";

/// What `provision` says when existing objects differ from the file.
pub fn drift_text(file: &str, report: &Report) -> String {
    let (refused, differ): (Vec<Finding>, Vec<Finding>) = report
        .findings
        .iter()
        .cloned()
        .partition(|f| matches!(f, Finding::Failed { .. }));
    // All or nothing: on drift nothing is declared, unless an object was
    // created by someone else between the check and the declarations.
    let mut out = if report.created.is_empty() && report.unchanged.is_empty() {
        format!("{file}: nothing was declared")
    } else {
        format!("{file}: {} object(s) declared", report.ok)
    };
    if !refused.is_empty() {
        out += &format!("; the broker refused these:\n{}", findings_text(&refused));
    }
    if !differ.is_empty() {
        out += &format!(
            "{}these differ from the topology and were left as they are:\n{}{DRIFT_HINT}",
            if refused.is_empty() { "; " } else { "" },
            findings_text(&differ)
        );
    }
    out.trim_end().to_string()
}

/// How many created objects a provision names one by one; `--json` lists
/// them all.
const CREATED_SHOWN: usize = 20;

/// A provision that found no drift: the counts, what it created (the first
/// [`CREATED_SHOWN`]) and how many were already as wanted.
pub fn provisioned_text(file: &str, plan: &Plan, report: &Report) -> String {
    let mut out = format!(
        "{file}: provisioned {}, {}, {} in {:.2}s: {} created, {} unchanged",
        count(plan.exchanges.len() as u64, "exchange"),
        count(plan.queues.len() as u64, "queue"),
        count(plan.bindings.len() as u64, "binding"),
        report.elapsed.as_secs_f64(),
        report.created.len(),
        report.unchanged.len(),
    );
    for o in report.created.iter().take(CREATED_SHOWN) {
        out += &format!("\n  created {} {}", o.object.as_str(), o.name);
    }
    if report.created.len() > CREATED_SHOWN {
        out += &format!(
            "\n  ... and {} more (--json lists every one)",
            report.created.len() - CREATED_SHOWN
        );
    }
    out
}

/// `status`'s line per pipeline with a redrive policy: its last run as
/// `doctor` and `drill` say it ([`RedriveState::summary`]).
///
/// [`RedriveState::summary`]: dlqctl::core::dlq::redrive_state::RedriveState::summary
fn redrive_lines(report: &StatusReport) -> String {
    let mut out = String::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    for p in &report.pipelines {
        let Some(r) = &p.redrive else { continue };
        match (r.state.as_ref().and_then(|s| s.summary(now)), &r.unreadable) {
            (Some((_, text)), _) => out += &format!("redrive {}: {}\n", p.name, esc(&text)),
            (None, Some(why)) => {
                out += &format!("redrive {}: state unreadable: {}\n", p.name, esc(why))
            }
            (None, None) if r.queue.exists => out += &format!("redrive {}: no run yet\n", p.name),
            (None, None) => {}
        }
    }
    out
}

/// The header of `status`'s table.
const STATUS_HEAD: [&str; 7] = [
    "PIPELINE",
    "QUEUE",
    "ROLE",
    "READY",
    "UNACKED",
    "CONSUMERS",
    "HELD-FOR-DLX",
];

/// What `status --metrics-url` read: `CIRCUIT` lines for the circuit
/// breakers open or half-open, a plain line for those closed, each
/// guarded pipeline's duplicates skipped and deferrals, or why none could
/// be read.
fn circuit_lines(report: &StatusReport) -> String {
    let mut out = String::new();
    for p in &report.pipelines {
        if let Some(c) = &p.circuit {
            out += &match c.pause_sentence(&p.name) {
                Some(paused) => format!("CIRCUIT {}: {paused}\n", p.name),
                None => format!("circuit breaker of {}: {}\n", p.name, c.describe()),
            };
        }
    }
    for p in &report.pipelines {
        if let Some(c) = &p.idempotency {
            out += &format!("idempotency of {}: {}\n", p.name, c.describe());
        }
    }
    for w in &report.workers {
        out += &if w.ready {
            format!("worker at {}: ready\n", w.url)
        } else {
            format!(
                "NOT READY worker at {}: its /readyz answers 503 (not consuming, or every settle \
                 failing for 30 s: see its log)\n",
                w.url
            )
        };
    }
    if let Some(why) = &report.circuit_unknown {
        out += &format!("circuit breakers unknown ({why})\n");
    }
    out
}

/// `status` as a table: a row per queue, then what is missing, what is
/// over the threshold and what is unknown.
pub fn status_text(
    report: &StatusReport,
    missing: &[String],
    max_dlq: Option<u64>,
    over: &[OverThreshold],
) -> String {
    let num = |q: &QueueStatus, v: Option<u64>| match (q.exists, v) {
        (false, _) => "-".to_string(),
        (true, Some(n)) => n.to_string(),
        (true, None) => "unknown".to_string(),
    };
    let mut rows: Vec<[String; 7]> = vec![STATUS_HEAD.map(String::from)];
    for p in &report.pipelines {
        let mut row = |pipeline: &str, role: String, q: &QueueStatus| {
            rows.push([
                pipeline.to_string(),
                q.name.clone(),
                role,
                if q.exists {
                    num(q, q.ready)
                } else {
                    "MISSING".into()
                },
                num(q, q.unacked),
                num(q, q.consumers),
                if q.quorum {
                    num(q, q.messages_dlx)
                } else {
                    "-".into()
                },
            ]);
        };
        row(&p.name, "main".into(), &p.main);
        for t in &p.tiers {
            row("", format!("retry {}", t.tier), &t.queue);
        }
        row("", "dlq".into(), &p.dlq);
        if let Some(r) = &p.redrive {
            row("", "redrive state".into(), &r.queue);
        }
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i >= 3 {
                line += &" ".repeat(pad);
                line += cell;
            } else {
                line += cell;
                line += &" ".repeat(pad);
            }
            line += "  ";
        }
        out += line.trim_end();
        out.push('\n');
    }
    for e in &report.missing_exchanges {
        out += &format!("MISSING exchange {e}\n");
    }
    out += &redrive_lines(report);
    if let Some(why) = &report.management_unavailable {
        out += &format!(
            "unacked and held-for-DLX counts and policies are unknown (the management API: {why}); \
             --max-dlq counts ready messages only\n"
        );
    }
    out += &policy_lines(report);
    if !missing.is_empty() {
        out += &format!(
            "{} object(s) missing: run `dlqctl provision` on the file (see `provision --check`)\n",
            missing.len()
        );
    }
    if let Some(n) = max_dlq {
        for o in over {
            out += &format!(
                "over --max-dlq {n}: {} holds {} message(s) (ready + unacked)\n",
                o.queue, o.messages
            );
        }
    }
    out + &circuit_lines(report)
}

/// `dlq peek` as text: a block per message, its body cut to `width`.
pub fn peek_text(report: &PeekReport, width: usize) -> String {
    // Values from a message are escaped: a message id or reason must not
    // retitle the operator's terminal or forge a line of output.
    let or = |v: &Option<String>| v.as_deref().map_or("-".into(), |s| esc(s).into_owned());
    let mut out = format!(
        "{}: {} message(s) shown ({} read of {} ready at the start); nothing was removed\n",
        report.queue,
        report.messages.len(),
        report.read,
        report.snapshot
    );
    if report.cancelled {
        out += "stopped by a signal before the end\n";
    }
    for (i, m) in report.messages.iter().enumerate() {
        let d = &m.described;
        let id = match (&m.message_id, &m.message_id_base64) {
            (Some(id), _) => esc(id).into_owned(),
            (None, Some(b)) => format!("base64:{b}"),
            (None, None) => "-".into(),
        };
        out += &format!(
            "#{} id={id} reason={} attempts={} dead-lettered-at={}\n",
            i + 1,
            or(&d.reason),
            d.attempts.map_or("-".into(), |n| n.to_string()),
            or(&d.dead_lettered_at)
        );
        out += &format!(
            "   group={} from exchange={} key={} queue={}\n",
            esc(&m.group),
            or(&d.original_exchange),
            or(&d.original_routing_key),
            or(&d.source_queue)
        );
        if let Some(e) = &d.last_error {
            out += &format!(
                "   last error: {}\n",
                dlqctl::core::dlq::describe::body_preview(e.as_bytes(), width.saturating_sub(15))
            );
        }
        for h in &d.errors {
            let attempt = h.get("attempt").map_or("?".to_string(), |a| a.to_string());
            let error = h.get("error").and_then(|e| e.as_str()).unwrap_or("");
            out += &format!(
                "   attempt {attempt}: {}\n",
                dlqctl::core::dlq::describe::body_preview(
                    error.as_bytes(),
                    width.saturating_sub(15)
                )
            );
        }
        let body = base64_body(&m.body_base64);
        out += &format!(
            "   body ({} bytes): {}\n",
            m.body_bytes,
            dlqctl::core::dlq::describe::body_preview(&body, width.saturating_sub(20))
        );
    }
    out
}

fn base64_body(b64: &str) -> Vec<u8> {
    dlqctl::core::values::shortstr::from_base64(b64).unwrap_or_default()
}

/// `dlq summary` as a table, largest group first.
pub fn summary_text(r: &SummaryReport) -> String {
    // Values from a message are escaped: a message id or reason must not
    // retitle the operator's terminal or forge a line of output.
    let or = |v: &Option<String>| v.as_deref().map_or("-".into(), |s| esc(s).into_owned());
    let mut out = format!(
        "{}: {} message(s) in {} group(s), of {} read ({} ready at the start){}; nothing was removed\n",
        r.queue,
        r.grouped,
        r.groups.len(),
        r.read,
        r.snapshot,
        if r.rotated > 0 {
            format!(
                "; {} were rotated to the tail to keep the unacked window bounded",
                r.rotated
            )
        } else {
            String::new()
        }
    );
    if r.cancelled {
        out += "stopped by a signal before the end: the groups count what was read\n";
    }
    if let Some(n) = r.waiting_for_person {
        out += &format!(
            "{n} message(s) past the redrive policy's max_redrives wait for a person (dlq replay moves them)\n"
        );
    }
    for g in &r.groups {
        out += &format!(
            "{} {:>6}  {:<10} first {} last {} from {} e.g. {}\n           {}\n",
            esc(&g.id),
            g.count,
            or(&g.reason),
            or(&g.first_dead_lettered_at),
            or(&g.last_dead_lettered_at),
            or(&g.source_queue),
            or(&g.example_message_id),
            if g.fingerprint.is_empty() {
                "(no error recorded)".into()
            } else {
                esc(&g.fingerprint)
            }
        );
    }
    out
}

/// `dlq export`'s report (on standard error: the lines may be on standard
/// output).
pub fn export_text(r: &ExportReport, output: Option<&std::path::Path>) -> String {
    let to = output.map_or("standard output".to_string(), |p| p.display().to_string());
    let mut line = format!(
        "{}: {} message(s) exported to {to} ({} read of {} ready at the start)",
        r.queue, r.written, r.read, r.snapshot
    );
    if r.removed > 0 {
        line += &format!(
            "; {} removed from the DLQ after the file was fsynced",
            r.removed
        );
    } else {
        line += "; nothing was removed";
    }
    if r.rotated > 0 {
        line += &format!("; {} kept message(s) rotated to the tail", r.rotated);
    }
    if r.cancelled {
        line += "; stopped by a signal before the end";
    }
    line
}

/// The canary's line of a replay or redrive report; `failed` is the word
/// for a canary that did not pass.
/// The line saying how many of the messages moved (or that would move)
/// were marked handled; it suggests `--rerun` only to a run without it.
fn already_handled_line(n: u64, dry_run: bool, rerun: bool) -> String {
    match (dry_run, rerun) {
        (true, false) => format!(
            "of them, {n} are marked handled in the idempotency store: a replay acks those without running them (add --rerun to run them again)\n"
        ),
        (true, true) => format!(
            "of them, {n} are marked handled in the idempotency store: --rerun runs them again\n"
        ),
        (false, false) => format!(
            "of them, {n} were already marked handled in the idempotency store: acked as duplicates, without running the handler (--rerun runs handled messages again)\n"
        ),
        (false, true) => format!(
            "of them, {n} were already marked handled in the idempotency store: --rerun runs them again\n"
        ),
    }
}

fn canary_line(c: &CanaryReport, failed: &str) -> String {
    let handled = c
        .handled
        .map(|h| format!(", {h} handled by a handler run"))
        .unwrap_or_default();
    format!(
        "canary: {} sent, {} came back{handled}: {}\n",
        c.sent,
        c.came_back,
        if c.passed { "passed" } else { failed }
    )
}

/// What `dlq redrive` did, in a few lines.
pub fn redrive_text(r: &dlqctl::ops::dlq::redrive::RedriveReport) -> String {
    use dlqctl::core::dlq::redrive::RunResult;
    let head = match r.result {
        RunResult::Moved => format!(
            "redrive of {}: {} message(s) moved back to {}",
            r.dlq, r.moved, r.queue
        ),
        RunResult::NothingEligible => {
            format!("redrive of {}: nothing eligible, nothing moved", r.dlq)
        }
        RunResult::CanaryFailed => format!(
            "redrive of {}: the canary failed, the rest stays in the DLQ ({} moved)",
            r.dlq, r.moved
        ),
        RunResult::Unhealthy => format!("redrive of {}: unhealthy, nothing moved", r.dlq),
        RunResult::Busy => format!("redrive of {}: busy, nothing done", r.dlq),
        RunResult::Failed => format!(
            "redrive of {}: stopped on an error ({} moved, the rest stays in the DLQ)",
            r.dlq, r.moved
        ),
        RunResult::NoCanary => format!(
            "redrive of {}: no eligible message could be the canary, nothing moved",
            r.dlq
        ),
    };
    let mut out = format!("{head} in {:.1}s\n", r.elapsed_ms as f64 / 1000.0);
    if let Some(c) = &r.canary {
        out += &canary_line(c, "failed");
    }
    if let Some(h) = &r.health {
        out += &format!("health probe: {h}\n");
    }
    if let Some(n) = r.waiting_for_person {
        out += &format!("{n} message(s) past max_redrives wait for a person\n");
    }
    if let Some(why) = &r.why {
        out += &format!("why: {why}\n");
    }
    if r.result == RunResult::Busy {
        // Nothing ran: no replay id was used, and the shared wait is as
        // it was.
        return out;
    }
    out += &format!("replay id {}\n", r.replay_id);
    match (&r.shared, &r.shared_unavailable) {
        (Some(s), _) => {
            out += &format!(
                "the pipeline's workers look again in {} (the shared wait, kept in {}.redrive-state)\n",
                dlqctl::core::values::duration::tier_name(s.wait_ms),
                r.queue
            );
        }
        (None, Some(why)) => {
            out += &format!("the shared wait was not kept, so each worker keeps its own: {why}\n");
        }
        (None, None) => {}
    }
    out
}

/// `dlq replay`'s report.
pub fn replay_text(r: &ReplayReport) -> String {
    let mut out = if r.dry_run {
        format!(
            "dry run: {} message(s) of {} would move to {} ({} read, {} skipped); nothing was published or removed\n",
            r.moved, r.from, r.to, r.read, r.skipped
        )
    } else {
        format!(
            "{} message(s) moved from {} to {} in {:.1}s: {} read of {} at the start, {} skipped by the selectors or the limit, {} failed ({}){}; replay id {}\n",
            r.moved,
            r.from,
            r.to,
            r.elapsed_ms as f64 / 1000.0,
            r.read,
            r.snapshot,
            r.skipped,
            r.failed,
            if r.from_file {
                "not published"
            } else {
                "left in the DLQ"
            },
            if r.interrupted > 0 {
                format!(", {} interrupted by the signal (left in place)", r.interrupted)
            } else {
                String::new()
            },
            r.replay_id
        )
    };
    if let Some(n) = r.already_handled {
        out.push_str(&already_handled_line(n, r.dry_run, r.rerun));
    }
    if let Some(why) = &r.why_failed {
        out += &format!("failed: {why}\n");
    }
    if r.rotated > 0 {
        out += &format!(
            "{} kept message(s) were rotated to the DLQ's tail\n",
            r.rotated
        );
    }
    if let Some(c) = &r.canary {
        out += &canary_line(c, "FAILED");
    }
    if let Some(stop) = r.ended.stop() {
        out += &format!("stopped: {}\n", stop.why());
    }
    if r.ended.is_cancelled() {
        out += if r.from_file {
            "stopped by a signal after the copies in flight; the rest of the file was not published\n"
        } else {
            "stopped by a signal after the copies in flight; the rest is still in the DLQ\n"
        };
    }
    out
}

/// `dlq purge`'s report.
pub fn purge_text(r: &PurgeReport) -> String {
    if r.counted_only {
        return format!(
            "{}: {} of {} message(s) selected; nothing was removed\n",
            r.queue, r.selected, r.snapshot
        );
    }
    let mut out = format!(
        "{}: {} message(s) removed, {} kept ({} read of {} at the start)\n",
        r.queue, r.removed, r.kept, r.read, r.snapshot
    );
    if r.cancelled {
        out += "stopped by a signal; the rest is still in the DLQ\n";
    }
    out
}

#[cfg(test)]
mod findings_tests {
    use super::*;
    use dlqctl::core::audit::finding::ObjectKind;

    fn unverified(object: ObjectKind, name: &str, reason: &str) -> Finding {
        Finding::Unverified {
            object,
            name: name.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_management_api_that_does_not_answer_is_named_once() {
        let down = "management API http://h:1/api/overview: error sending request";
        let findings = vec![
            Finding::Missing {
                object: ObjectKind::Queue,
                name: "q".into(),
            },
            unverified(
                ObjectKind::Binding,
                "a -> b [k]",
                &format!("{down} (AMQP cannot check a binding)"),
            ),
            unverified(
                ObjectKind::Binding,
                "a -> c [k]",
                &format!("{down} (AMQP cannot check a binding)"),
            ),
            unverified(
                ObjectKind::Queue,
                "(policies of the 2 queues)",
                &format!("{down} (AMQP cannot see policies)"),
            ),
            unverified(
                ObjectKind::Binding,
                "x -> y []",
                "the API answered 500 (for this binding)",
            ),
        ];
        assert_eq!(
            findings_text(&findings),
            format!(
                "  missing queue q\n  {down}; so these could not be verified:\n    unverified binding a -> b [k]\n    \
                 unverified binding a -> c [k]\n    unverified queue (policies of the 2 queues)\n  \
                 unverified binding x -> y []: the API answered 500 (for this binding)\n"
            )
        );
    }
}
