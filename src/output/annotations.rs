//! GitHub Actions workflow commands for what `provision` and `provision
//! --check` found: one `::error` (or `::warning`) line per finding, pointing
//! at the line of the topology file where the pipeline the object belongs
//! to is named, so that a pull request shows the drift next to the YAML.
//!
//! The format and its escaping are GitHub's ("Workflow commands for GitHub
//! Actions"): `::error file=F,line=L,title=T::MESSAGE`, with `%`, CR and LF
//! escaped in the message, and `:` and `,` too in property values.

use dlqctl::core::audit::finding::{binding_name, Finding, ObjectKind};
use dlqctl::core::topology::plan::{Plan, Role};
use dlqctl::core::topology::Topology;
use std::collections::HashMap;

/// The title of an annotation for a difference.
pub const DRIFT_TITLE: &str = "dlqctl drift";

/// The title of an annotation for something that could not be checked.
pub const UNVERIFIED_TITLE: &str = "dlqctl unverified";

/// The title of an annotation for a policy key listed as information.
pub const POLICY_INFO_TITLE: &str = "dlqctl policy";

/// The title of an annotation for a warning on how policies were worked
/// out (a tie of priorities, two views that disagree).
pub const POLICY_WARNING_TITLE: &str = "dlqctl policy warning";

/// How GitHub shows an annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `::error` (the exit code, not the annotation, fails the step).
    Error,
    /// `::warning`.
    Warning,
    /// `::notice`.
    Notice,
}

impl Level {
    /// The command's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warning => "warning",
            Level::Notice => "notice",
        }
    }
}

/// A message escaped for a workflow command: `%` → `%25`, CR → `%0D`,
/// LF → `%0A`.
pub fn escape_data(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '\r' => out.push_str("%0D"),
            '\n' => out.push_str("%0A"),
            c => out.push(c),
        }
    }
    out
}

/// A property value escaped for a workflow command: as [`escape_data`],
/// and `:` → `%3A`, `,` → `%2C`.
pub fn escape_property(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in escape_data(s).chars() {
        match c {
            ':' => out.push_str("%3A"),
            ',' => out.push_str("%2C"),
            c => out.push(c),
        }
    }
    out
}

/// One workflow command, without its newline:
/// `::LEVEL file=FILE,line=LINE,title=TITLE::MESSAGE`.
pub fn workflow_command(level: Level, file: &str, line: u64, title: &str, message: &str) -> String {
    format!(
        "::{} file={},line={line},title={}::{}",
        level.as_str(),
        escape_property(file),
        escape_property(title),
        escape_data(message)
    )
}

/// Which pipeline of a topology each finding is about, and the line where
/// that pipeline is named.
///
/// A finding names its object only; the pipeline is found from the plan
/// (planned queues, exchanges and bindings), then from dlqctl's generated
/// names for objects the plan no longer describes (`P.retry.*`, `P.dlq`, a
/// binding from `P.retry` or `P.dlx`, or to a queue of `P`). A producers'
/// exchange shared by several pipelines belongs to the first of them.
#[derive(Debug)]
pub struct PipelineLines<'a> {
    lines: HashMap<&'a str, u64>,
    queues: HashMap<&'a str, &'a str>,
    exchanges: HashMap<&'a str, (&'a str, Role)>,
    bindings: HashMap<String, &'a str>,
}

impl<'a> PipelineLines<'a> {
    /// The index of a topology and its plan.
    pub fn new(topology: &'a Topology, plan: &'a Plan) -> Self {
        PipelineLines {
            lines: topology
                .pipelines
                .iter()
                .map(|p| (p.name.as_str(), p.line))
                .collect(),
            queues: plan
                .queues
                .iter()
                .map(|q| (q.name.as_str(), q.pipeline.as_str()))
                .collect(),
            exchanges: plan
                .exchanges
                .iter()
                .filter_map(|e| {
                    let first = e.pipelines.first()?;
                    Some((e.name.as_str(), (first.as_str(), e.role)))
                })
                .collect(),
            bindings: plan
                .bindings
                .iter()
                .map(|b| (binding_name(b), b.pipeline.as_str()))
                .collect(),
        }
    }

    /// The pipeline a finding is about, if it is about one of the file.
    pub fn pipeline_of(&self, finding: &Finding) -> Option<&'a str> {
        let (object, name) = object_of(finding);
        match object {
            ObjectKind::Queue => self.queue(name),
            ObjectKind::Exchange => self.exchanges.get(name).map(|(p, _)| *p),
            ObjectKind::Binding => self.binding(name),
        }
    }

    /// The line of the pipeline a finding is about; 1 when it is about no
    /// pipeline of the file.
    pub fn line_of(&self, finding: &Finding) -> u64 {
        self.pipeline_of(finding)
            .and_then(|p| self.lines.get(p).copied())
            .filter(|&l| l > 0)
            .unwrap_or(1)
    }

    fn is_pipeline(&self, name: &str) -> Option<&'a str> {
        self.lines.get_key_value(name).map(|(k, _)| *k)
    }

    fn queue(&self, name: &str) -> Option<&'a str> {
        if let Some(p) = self.queues.get(name) {
            return Some(*p);
        }
        // A tier queue the file no longer has: `P.retry.<tier>`.
        for (i, _) in name.match_indices(".retry.") {
            if let Some(p) = self.is_pipeline(&name[..i]) {
                return Some(p);
            }
        }
        // A DLQ the file now names otherwise: `P.dlq`.
        name.strip_suffix(".dlq").and_then(|p| self.is_pipeline(p))
    }

    /// A binding is named `EXCHANGE -> QUEUE [KEY]`; names may contain the
    /// separators, so every split is tried against the plan's names.
    fn binding(&self, name: &str) -> Option<&'a str> {
        if let Some(p) = self.bindings.get(name) {
            return Some(*p);
        }
        let mut fallback = None;
        for (i, sep) in name.match_indices(" -> ") {
            let Some(&(owner, role)) = self.exchanges.get(&name[..i]) else {
                continue;
            };
            if matches!(role, Role::RetryExchange | Role::DeadLetterExchange) {
                return Some(owner);
            }
            let rest = &name[i + sep.len()..];
            for (j, _) in rest.match_indices(" [") {
                if let Some(p) = self.queues.get(&rest[..j]) {
                    return Some(*p);
                }
            }
            fallback = fallback.or(Some(owner));
        }
        fallback
    }
}

fn object_of(f: &Finding) -> (ObjectKind, &str) {
    match f {
        Finding::Missing { object, name }
        | Finding::Differs { object, name, .. }
        | Finding::Unverified { object, name, .. }
        | Finding::NotInTopology { object, name, .. }
        | Finding::PolicyOverrides { object, name, .. }
        | Finding::PolicyInfo { object, name, .. }
        | Finding::PolicyWarning { object, name, .. }
        | Finding::Failed { object, name, .. } => (*object, name),
    }
}

/// Every finding as a workflow command, one per line, in order: a
/// difference (missing, differing, overridden by a policy, not in the
/// topology, refused) as an `::error` titled [`DRIFT_TITLE`], an unverified
/// object as a `::warning` titled [`UNVERIFIED_TITLE`], a policy key that
/// changes nothing as a `::notice` titled [`POLICY_INFO_TITLE`]. `file` is the topology file as the user
/// named it; each line points at the pipeline the object belongs to
/// ([`PipelineLines::line_of`]).
pub fn annotations(file: &str, findings: &[Finding], lines: &PipelineLines<'_>) -> String {
    let mut out = String::new();
    for f in findings {
        let (level, title) = if f.is_difference() {
            (Level::Error, DRIFT_TITLE)
        } else if f.is_info() {
            (Level::Notice, POLICY_INFO_TITLE)
        } else if f.is_warning() {
            (Level::Warning, POLICY_WARNING_TITLE)
        } else {
            (Level::Warning, UNVERIFIED_TITLE)
        };
        out += &workflow_command(level, file, lines.line_of(f), title, &f.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlqctl::core::topology::{parse_topology, plan};

    const YAML: &str = "version: 1
defaults:
  retry: {delays: [1s, 10s]}
pipelines:
  - name: orders
    exchange: {name: shop, type: topic, bindings: [order.created]}
    dead_letter: {queue: orders.failed}

  - name: mail
    exchange: {name: shop, type: topic, bindings: [mail.#]}
  - name: a.retry.b
";

    fn with_lines(check: impl FnOnce(&PipelineLines<'_>)) {
        let t = parse_topology(YAML, "t.yaml").expect("valid");
        let p = plan(&t);
        check(&PipelineLines::new(&t, &p));
    }

    fn missing(object: ObjectKind, name: &str) -> Finding {
        Finding::Missing {
            object,
            name: name.into(),
        }
    }

    fn stale(object: ObjectKind, name: &str) -> Finding {
        Finding::NotInTopology {
            object,
            name: name.into(),
            messages: None,
        }
    }

    #[test]
    fn messages_escape_percent_and_line_breaks_only() {
        assert_eq!(escape_data("50% a:b,c\r\nd"), "50%25 a:b,c%0D%0Ad");
        assert_eq!(escape_data("%0A"), "%250A");
        assert_eq!(escape_data("café → ok"), "café → ok");
    }

    #[test]
    fn properties_also_escape_colon_and_comma() {
        assert_eq!(escape_property("C:\\t,x%\n.yaml"), "C%3A\\t%2Cx%25%0A.yaml");
        assert_eq!(
            escape_property("topology/orders.yaml"),
            "topology/orders.yaml"
        );
    }

    #[test]
    fn a_workflow_command_has_the_file_line_and_title_as_properties() {
        assert_eq!(
            workflow_command(
                Level::Error,
                "t.yaml",
                5,
                DRIFT_TITLE,
                "missing queue orders"
            ),
            "::error file=t.yaml,line=5,title=dlqctl drift::missing queue orders"
        );
        assert_eq!(
            workflow_command(Level::Warning, "a,b:c.yaml", 1, "x: y", "50%\nnext"),
            "::warning file=a%2Cb%3Ac.yaml,line=1,title=x%3A y::50%25%0Anext"
        );
    }

    #[test]
    fn planned_objects_point_at_their_pipeline() {
        with_lines(|l| {
            for (object, name, line) in [
                (ObjectKind::Queue, "orders", 5),
                (ObjectKind::Queue, "orders.retry.10s", 5),
                (ObjectKind::Queue, "orders.failed", 5),
                (ObjectKind::Queue, "mail.dlq", 9),
                (ObjectKind::Exchange, "orders.dlx", 5),
                (ObjectKind::Exchange, "mail.retry", 9),
                // Shared by both pipelines: the first that uses it.
                (ObjectKind::Exchange, "shop", 5),
                (ObjectKind::Binding, "shop -> mail [mail.#]", 9),
                (ObjectKind::Binding, "shop -> orders [order.created]", 5),
                (ObjectKind::Binding, "mail.retry -> mail.retry.1s [1s]", 9),
                (ObjectKind::Queue, "a.retry.b", 11),
                (ObjectKind::Queue, "a.retry.b.retry.1s", 11),
            ] {
                assert_eq!(l.line_of(&missing(object, name)), line, "{name}");
            }
        });
    }

    #[test]
    fn objects_the_file_no_longer_describes_point_at_their_pipeline() {
        with_lines(|l| {
            for (object, name, line) in [
                (ObjectKind::Queue, "orders.retry.5m", 5),
                (ObjectKind::Queue, "orders.dlq", 5),
                (ObjectKind::Queue, "a.retry.b.retry.2s", 11),
                (ObjectKind::Binding, "orders.retry -> elsewhere [5m]", 5),
                (ObjectKind::Binding, "mail.dlx -> mail.old [x]", 9),
                // From the shared exchange to a queue of `mail`.
                (ObjectKind::Binding, "shop -> mail [old.key]", 9),
                (ObjectKind::Binding, "shop -> orders.failed [a -> b [c]", 5),
                // From the shared exchange to an exchange: its first pipeline.
                (ObjectKind::Binding, "shop -> shop [x]", 5),
            ] {
                assert_eq!(l.line_of(&stale(object, name)), line, "{name}");
            }
        });
    }

    #[test]
    fn objects_of_no_pipeline_point_at_line_1() {
        with_lines(|l| {
            for f in [
                missing(ObjectKind::Queue, "other"),
                missing(ObjectKind::Queue, "other.retry.1s"),
                missing(ObjectKind::Exchange, "orders"),
                missing(ObjectKind::Binding, "other -> orders [k]"),
                Finding::Unverified {
                    object: ObjectKind::Queue,
                    name: "(objects the topology no longer describes)".into(),
                    reason: "no API".into(),
                },
            ] {
                assert_eq!(l.line_of(&f), 1, "{f}");
            }
        });
    }

    #[test]
    fn differences_are_errors_and_unverified_objects_warnings() {
        with_lines(|l| {
            let findings = vec![
                missing(ObjectKind::Queue, "orders.retry.1s"),
                Finding::Differs {
                    object: ObjectKind::Queue,
                    name: "mail".into(),
                    argument: "x-message-ttl".into(),
                    wanted: "none".into(),
                    actual: "60000".into(),
                },
                stale(ObjectKind::Queue, "orders.retry.5m"),
                Finding::Failed {
                    object: ObjectKind::Exchange,
                    name: "mail.dlx".into(),
                    message: "ACCESS_REFUSED - no access\nto it".into(),
                    reply_code: Some(403),
                },
                Finding::Unverified {
                    object: ObjectKind::Binding,
                    name: "shop -> mail [mail.#]".into(),
                    reason: "management API: 100% down".into(),
                },
            ];
            assert_eq!(
                annotations("topology/t.yaml", &findings, l),
                "::error file=topology/t.yaml,line=5,title=dlqctl drift::missing queue orders.retry.1s
::error file=topology/t.yaml,line=9,title=dlqctl drift::queue mail: x-message-ttl differs: wanted none, broker has 60000
::error file=topology/t.yaml,line=5,title=dlqctl drift::not in the topology: queue orders.retry.5m (depth unknown)
::error file=topology/t.yaml,line=9,title=dlqctl drift::exchange mail.dlx: ACCESS_REFUSED - no access%0Ato it
::warning file=topology/t.yaml,line=9,title=dlqctl unverified::unverified binding shop -> mail [mail.#]: management API: 100%25 down
"
            );
            assert_eq!(annotations("t.yaml", &[], l), "");
        });
    }

    #[test]
    fn policy_overrides_are_errors_and_policy_information_a_notice() {
        use dlqctl::core::audit::policy::PolicyKind;
        with_lines(|l| {
            let findings = vec![
                Finding::PolicyOverrides {
                    object: ObjectKind::Queue,
                    name: "orders.failed".into(),
                    policy_kind: PolicyKind::OperatorPolicy,
                    policy: "cap".into(),
                    key: "message-ttl".into(),
                    effective: "1000".into(),
                    wanted: "1209600000".into(),
                    note: String::new(),
                },
                Finding::PolicyInfo {
                    object: ObjectKind::Queue,
                    name: "mail".into(),
                    policy_kind: PolicyKind::Policy,
                    policy: "ll".into(),
                    key: "queue-leader-locator".into(),
                    value: "\"balanced\"".into(),
                    note: "changes nothing the topology relies on".into(),
                },
            ];
            assert_eq!(
                annotations("t.yaml", &findings, l),
                "::error file=t.yaml,line=5,title=dlqctl drift::queue orders.failed: operator policy `cap` overrides message-ttl: effective 1000, wanted 1209600000
::notice file=t.yaml,line=9,title=dlqctl policy::info: queue mail: policy `ll` sets queue-leader-locator = \"balanced\" (changes nothing the topology relies on)
"
            );
        });
    }
}
