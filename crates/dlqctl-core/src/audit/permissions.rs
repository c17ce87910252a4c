//! Which dlqctl commands a user may run on a pipeline, from the user's
//! configure / write / read permissions in a virtual host (the regular
//! expressions of `rabbitmqctl set_permissions`), against what each
//! command needs (docs/production.md, "Permissions").
//!
//! RabbitMQ's rules, followed here: a permission is a regular expression
//! searched (not anchored) in the resource's name; the empty expression
//! grants nothing; the default exchange is checked under the name
//! `amq.default`. RabbitMQ's expressions are PCRE; the few PCRE-only
//! constructs (look-around, back-references) cannot be evaluated here, and
//! the command is then reported as unknown rather than guessed.

use crate::topology::plan::{Plan, Role};
use regex_automata::dfa::regex::Regex;

/// One of the three permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Declare and delete.
    Configure,
    /// Publish to an exchange, bind to a queue.
    Write,
    /// Consume from a queue, bind from an exchange.
    Read,
}

impl Access {
    /// `configure`, `write` or `read`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Configure => "configure",
            Access::Write => "write",
            Access::Read => "read",
        }
    }
}

/// A user's permissions in one virtual host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UserPermissions {
    /// The configure expression.
    pub configure: String,
    /// The write expression.
    pub write: String,
    /// The read expression.
    pub read: String,
}

impl UserPermissions {
    fn pattern(&self, access: Access) -> &str {
        match access {
            Access::Configure => &self.configure,
            Access::Write => &self.write,
            Access::Read => &self.read,
        }
    }
}

/// One permission a command needs on one resource.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Need {
    /// The permission.
    pub access: Access,
    /// The resource's name (`amq.default` for the default exchange).
    pub resource: String,
}

/// The commands whose needs are known, as the permissions table names
/// them.
pub(crate) const COMMANDS: [&str; 7] = [
    "provision",
    "provision --check",
    "status",
    "work",
    "dlq peek, summary, export, purge",
    "dlq replay",
    "dlq redrive",
];

/// What `command` (one of `COMMANDS`) needs on `pipeline`'s objects of
/// `plan`, in the table's order, without duplicates. An unknown command
/// needs nothing.
pub fn needs(command: &str, plan: &Plan, pipeline: &str) -> Vec<Need> {
    let mut out: Vec<Need> = Vec::new();
    let mut add = |access: Access, resource: &str| {
        let n = Need {
            access,
            resource: resource.to_string(),
        };
        if !out.contains(&n) {
            out.push(n);
        }
    };
    let exchanges = plan
        .exchanges
        .iter()
        .filter(|e| e.pipelines.iter().any(|p| p == pipeline));
    let queues = plan.queues.iter().filter(|q| q.pipeline == pipeline);
    let of_role = |role: Role| {
        plan.queues
            .iter()
            .filter(move |q| q.pipeline == pipeline && q.role == role)
            .map(|q| q.name.clone())
    };
    let dlq: Vec<String> = of_role(Role::DeadLetterQueue).collect();
    let main: Vec<String> = of_role(Role::MainQueue).collect();
    let state: Vec<String> = of_role(Role::RedriveState).collect();
    let lock = |add: &mut dyn FnMut(Access, &str)| {
        for d in &dlq {
            add(Access::Configure, &format!("dlqctl.lock.{d}"));
        }
    };
    // A redrive run: its lock and the DLQ's, the DLQ, the copies and the
    // shared state through the default exchange, the state queue.
    let redrive = |add: &mut dyn FnMut(Access, &str)| {
        lock(add);
        for d in &dlq {
            add(Access::Configure, &format!("dlqctl.redrive.{d}"));
            add(Access::Read, d);
        }
        add(Access::Write, "amq.default");
        for s in &state {
            add(Access::Read, s);
        }
    };
    match command {
        "provision" | "provision --check" => {
            for e in exchanges.clone() {
                add(Access::Configure, &e.name);
            }
            for q in queues {
                add(Access::Configure, &q.name);
            }
            if command == "provision" {
                for b in plan.bindings.iter().filter(|b| b.pipeline == pipeline) {
                    add(Access::Write, &b.queue);
                    add(Access::Read, &b.exchange);
                }
            }
        }
        "work" => {
            for e in exchanges
                .filter(|e| matches!(e.role, Role::RetryExchange | Role::DeadLetterExchange))
            {
                add(Access::Write, &e.name);
            }
            for m in &main {
                add(Access::Read, m);
            }
            // Every worker of a pipeline with a redrive policy runs it
            // (unless `--no-redrive`).
            if !state.is_empty() {
                redrive(&mut add);
            }
        }
        "dlq redrive" if !state.is_empty() => redrive(&mut add),
        "dlq peek, summary, export, purge" => {
            lock(&mut add);
            for d in &dlq {
                add(Access::Read, d);
            }
        }
        "dlq replay" => {
            lock(&mut add);
            add(Access::Write, "amq.default");
            for d in &dlq {
                add(Access::Read, d);
            }
        }
        _ => {}
    }
    out
}

/// Whether a command may run, as far as its permissions tell.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Every need is granted.
    Allowed,
    /// These needs are not granted.
    Denied {
        /// What is missing, in the order of [`needs`].
        missing: Vec<Need>,
    },
    /// An expression could not be evaluated.
    Unknown {
        /// Which one, and why.
        reason: String,
    },
}

/// A compiled permission expression; `None` grants nothing (the empty
/// expression).
struct Matcher(Option<Regex>);

impl Matcher {
    fn new(pattern: &str) -> Result<Matcher, String> {
        if pattern.is_empty() {
            return Ok(Matcher(None));
        }
        // As RabbitMQ runs them (Erlang's `re` without its `unicode`
        // option): on the bytes of the name, `\w` and `.` included.
        Regex::builder()
            .syntax(
                regex_automata::util::syntax::Config::new()
                    .unicode(false)
                    .utf8(false),
            )
            .build(pattern)
            .map(|r| Matcher(Some(r)))
            .map_err(|e| format!("cannot evaluate `{pattern}` here: {e}"))
    }

    fn grants(&self, name: &str) -> bool {
        self.0.as_ref().is_some_and(|r| r.is_match(name.as_bytes()))
    }
}

/// The verdict of every command of `COMMANDS` for `pipeline`, in that
/// order.
pub fn verdicts(perms: &UserPermissions, plan: &Plan, pipeline: &str) -> Vec<(String, Verdict)> {
    let compiled = [Access::Configure, Access::Write, Access::Read]
        .map(|a| (a, Matcher::new(perms.pattern(a))));
    COMMANDS
        .iter()
        .map(|command| {
            let mut missing = Vec::new();
            for need in needs(command, plan, pipeline) {
                let Some((_, m)) = compiled.iter().find(|(a, _)| *a == need.access) else {
                    continue;
                };
                match m {
                    Ok(m) if m.grants(&need.resource) => {}
                    Ok(_) => missing.push(need),
                    Err(reason) => {
                        return (
                            command.to_string(),
                            Verdict::Unknown {
                                reason: format!("{} permission: {reason}", need.access.as_str()),
                            },
                        )
                    }
                }
            }
            let verdict = if missing.is_empty() {
                Verdict::Allowed
            } else {
                Verdict::Denied { missing }
            };
            (command.to_string(), verdict)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::plan::pipeline_plan;

    fn plan() -> Plan {
        let yaml = "version: 1\npipelines:\n  - name: orders\n    exchange: {name: orders-in, \
                    type: topic, bindings: [order.created]}\n    retry: {delays: [1s, 10s]}\n";
        let t = crate::topology::parse_topology(yaml, "t.yaml").expect("a topology");
        pipeline_plan(&t.pipelines[0])
    }

    fn perms(c: &str, w: &str, r: &str) -> UserPermissions {
        UserPermissions {
            configure: c.into(),
            write: w.into(),
            read: r.into(),
        }
    }

    fn verdict(p: &UserPermissions, command: &str) -> Verdict {
        verdicts(p, &plan(), "orders")
            .into_iter()
            .find(|(c, _)| c == command)
            .map(|(_, v)| v)
            .expect("a known command")
    }

    fn need(access: Access, resource: &str) -> Need {
        Need {
            access,
            resource: resource.into(),
        }
    }

    /// What `command` needs for pipeline `orders` of `p`, as pairs.
    fn needed(p: &Plan, command: &str) -> Vec<(Access, String)> {
        needs(command, p, "orders")
            .into_iter()
            .map(|n| (n.access, n.resource))
            .collect()
    }

    fn s(a: Access, r: &str) -> (Access, String) {
        (a, r.to_string())
    }

    #[test]
    fn every_command_needs_what_the_permissions_table_says() {
        let p = plan();
        let names = |c: &str| needed(&p, c);
        use Access::*;
        assert_eq!(
            names("provision --check"),
            vec![
                s(Configure, "orders-in"),
                s(Configure, "orders.retry"),
                s(Configure, "orders.dlx"),
                s(Configure, "orders"),
                s(Configure, "orders.retry.1s"),
                s(Configure, "orders.retry.10s"),
                s(Configure, "orders.dlq"),
            ]
        );
        let provision = names("provision");
        assert!(provision.contains(&s(Write, "orders")));
        assert!(provision.contains(&s(Read, "orders-in")));
        assert!(provision.contains(&s(Write, "orders.dlq")));
        assert!(provision.contains(&s(Read, "orders.dlx")));
        assert_eq!(names("status"), vec![]);
        assert_eq!(
            names("work"),
            vec![
                s(Write, "orders.retry"),
                s(Write, "orders.dlx"),
                s(Read, "orders")
            ]
        );
        assert_eq!(
            names("dlq peek, summary, export, purge"),
            vec![
                s(Configure, "dlqctl.lock.orders.dlq"),
                s(Read, "orders.dlq")
            ]
        );
        assert_eq!(
            names("dlq replay"),
            vec![
                s(Configure, "dlqctl.lock.orders.dlq"),
                s(Write, "amq.default"),
                s(Read, "orders.dlq")
            ]
        );
        assert_eq!(names("no such command"), vec![]);
        assert_eq!(names("provision").len(), provision.len());
        assert_eq!(needs("work", &p, "another pipeline"), vec![]);
        // Without a redrive policy there is no redrive to run.
        assert_eq!(names("dlq redrive"), vec![]);
    }

    #[test]
    fn a_redrive_policy_adds_the_redrive_to_the_worker_and_to_dlq_redrive() {
        let t = crate::topology::parse_topology(
            "version: 1\npipelines:\n  - name: orders\n    dead_letter: {redrive: {}}\n",
            "t.yaml",
        )
        .expect("valid");
        let p = crate::topology::plan::plan(&t);
        let names = |c: &str| needed(&p, c);
        use Access::*;
        let redrive = vec![
            s(Configure, "dlqctl.lock.orders.dlq"),
            s(Configure, "dlqctl.redrive.orders.dlq"),
            s(Read, "orders.dlq"),
            s(Write, "amq.default"),
            s(Read, "orders.redrive-state"),
        ];
        assert_eq!(names("dlq redrive"), redrive);
        let mut work = vec![
            s(Write, "orders.retry"),
            s(Write, "orders.dlx"),
            s(Read, "orders"),
        ];
        work.extend(redrive);
        assert_eq!(names("work"), work);
        assert!(names("provision").contains(&s(Configure, "orders.redrive-state")));
    }

    #[test]
    fn full_permissions_allow_everything() {
        let all = perms(".*", ".*", ".*");
        for (c, v) in verdicts(&all, &plan(), "orders") {
            assert_eq!(v, Verdict::Allowed, "{c}");
        }
        assert_eq!(verdicts(&all, &plan(), "orders").len(), COMMANDS.len());
    }

    #[test]
    fn the_empty_expression_grants_nothing_and_status_needs_nothing() {
        let none = perms("", "", "");
        assert_eq!(verdict(&none, "status"), Verdict::Allowed);
        match verdict(&none, "work") {
            Verdict::Denied { missing } => assert_eq!(missing.len(), 3),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn expressions_are_searched_not_anchored() {
        // `orders` is found inside `dlqctl.lock.orders.dlq` too.
        let p = perms("orders", "^orders\\.(retry|dlx)$", "^orders(\\.dlq)?$");
        assert_eq!(verdict(&p, "work"), Verdict::Allowed);
        assert_eq!(
            verdict(&p, "dlq peek, summary, export, purge"),
            Verdict::Allowed
        );
        assert_eq!(verdict(&p, "provision --check"), Verdict::Allowed);
        assert_eq!(
            verdict(&p, "dlq replay"),
            Verdict::Denied {
                missing: vec![need(Access::Write, "amq.default")]
            }
        );
    }

    #[test]
    fn a_worker_only_user_cannot_provision_nor_read_the_dlq() {
        let p = perms("^$", "^orders\\.(retry|dlx)$", "^orders$");
        assert_eq!(verdict(&p, "work"), Verdict::Allowed);
        match verdict(&p, "provision --check") {
            Verdict::Denied { missing } => {
                assert_eq!(missing.len(), 7);
                assert!(missing.iter().all(|n| n.access == Access::Configure));
            }
            v => panic!("{v:?}"),
        }
        assert_eq!(
            verdict(&p, "dlq peek, summary, export, purge"),
            Verdict::Denied {
                missing: vec![
                    need(Access::Configure, "dlqctl.lock.orders.dlq"),
                    need(Access::Read, "orders.dlq")
                ]
            }
        );
    }

    #[test]
    fn an_expression_that_cannot_be_evaluated_is_unknown_not_a_guess() {
        // A look-ahead: PCRE has it, this matcher does not.
        let p = perms("^(?!amq\\.).*", ".*", ".*");
        match verdict(&p, "provision") {
            Verdict::Unknown { reason } => {
                assert!(reason.starts_with("configure permission"), "{reason}")
            }
            v => panic!("{v:?}"),
        }
        // A command that needs no configure is still judged.
        assert_eq!(verdict(&p, "work"), Verdict::Allowed);
    }

    #[test]
    fn names_are_matched_as_bytes_as_rabbitmq_does() {
        let p = perms("\\w+", "\\w+", "\\w+");
        assert_eq!(verdict(&p, "work"), Verdict::Allowed);
        // `.` is any byte: a name of two-byte characters is still matched.
        let p = perms("^.{4}$", "^.{4}$", "^.{4}$");
        let m = Matcher::new("^.{4}$").unwrap();
        assert!(m.grants("éé"), "4 bytes");
        assert!(!m.grants("éa"));
        assert_eq!(verdict(&p, "status"), Verdict::Allowed);
    }
}
