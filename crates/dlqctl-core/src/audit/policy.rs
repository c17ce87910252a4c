//! What a policy or operator policy changes in a queue the topology
//! declares. Pure: the shell reads each queue's `policy`,
//! `operator_policy` and `effective_policy_definition` from the management
//! API, and this module compares them with the planned arguments.
//!
//! Arguments do not always win over policies (rabbitmq-facts.md,
//! "Declaring"). How the broker resolves each key between a queue's
//! argument and its effective policy (the management API has already
//! merged the policy with the operator policy, the lower value winning):
//!
//! | key | classic | quorum |
//! |---|---|---|
//! | `message-ttl`, `max-length`, `max-length-bytes`, `expires`, `delivery-limit` | the lower value | the lower value |
//! | `overflow` | the argument | the policy |
//! | `dead-letter-exchange`, `dead-letter-routing-key`, `dead-letter-strategy` | the argument | the argument |
//!
//! (Measured on 3.10.8 for `overflow`: a classic queue declared with
//! `x-overflow: reject-publish` under a policy `drop-head` refused the
//! third message of `x-max-length` 2; a quorum queue dropped its head.)
//!
//! A key that sets, or lowers, what the queue ends up with so that it
//! differs from the topology is a [`Finding::PolicyOverrides`]. A key whose
//! value loses against the queue's argument, or that changes nothing the
//! contract relies on (`queue-leader-locator`, `ha-mode`, ...), is a
//! [`Finding::PolicyInfo`]. A limit on a queue the topology leaves unbounded
//! (a `max-length` on a main queue) overrides, and the finding's note says
//! what the queue's overflow then does (`overflow_in_force`).

use crate::audit::finding::{Finding, ObjectKind};
use crate::topology::plan::QueueSpec;
use crate::topology::ArgValue;
use serde_json::{Map, Value};

pub use crate::audit::finding::PolicyKind;

/// The policies that apply to one queue, as the management API reports
/// them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppliedPolicies {
    /// The plain policy's name.
    pub policy: Option<String>,
    /// The operator policy's name.
    pub operator_policy: Option<String>,
    /// The merged definition that applies (`effective_policy_definition`).
    pub effective: Map<String, Value>,
    /// The plain policy's own definition, when it could be read.
    pub policy_definition: Option<Map<String, Value>>,
    /// The operator policy's own definition, when it could be read.
    pub operator_definition: Option<Map<String, Value>>,
    /// Warnings on how these were worked out: a tie of priorities, the
    /// definitions and the queue's own report disagreeing, a report
    /// possibly a few seconds old (see [`crate::audit::effective`]).
    pub notes: Vec<String>,
}

/// The start of the note on a limit the topology does not set.
pub(crate) const UNBOUNDED_NOTE: &str = "the topology leaves this queue unbounded";

/// How the broker resolves a key between argument and policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// The lower of the two applies.
    Lower,
    /// The policy wins over the argument.
    PolicyWins,
    /// The argument wins; the policy applies only without one.
    ArgumentWins,
}

/// The policy keys that change what the topology asks for, and how each is
/// resolved on a queue of type `queue_type` (`classic`, `quorum`).
fn rule(key: &str, queue_type: &str) -> Option<Rule> {
    Some(match key {
        "message-ttl" | "max-length" | "max-length-bytes" | "expires" | "delivery-limit" => {
            Rule::Lower
        }
        "overflow" if queue_type == "quorum" => Rule::PolicyWins,
        "overflow" => Rule::ArgumentWins,
        "dead-letter-exchange" | "dead-letter-routing-key" | "dead-letter-strategy" => {
            Rule::ArgumentWins
        }
        // Not a policy key on the brokers measured; if one ever sets it,
        // it cannot agree with a different declared type.
        "queue-type" => Rule::PolicyWins,
        _ => return None,
    })
}

/// What a queue behaves as when a key is absent from both argument and
/// policy: a policy setting exactly that changes nothing.
fn default_of(key: &str) -> Option<Value> {
    match key {
        "overflow" => Some(Value::from("drop-head")),
        "dead-letter-strategy" => Some(Value::from("at-most-once")),
        _ => None,
    }
}

fn arg_json(v: &ArgValue) -> Value {
    match v {
        ArgValue::Int(i) => Value::from(*i),
        ArgValue::Str(s) => Value::from(s.as_str()),
        ArgValue::Bool(b) => Value::from(*b),
    }
}

/// A value as reports show it: `1000`, `"drop-head"`, `none`.
fn show(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "none".into(),
        Some(v) => v.to_string(),
    }
}

/// The effective value of a `Lower` key, `None` when either side is not an
/// integer (then the policy's is taken as it is). A negative value means
/// "unlimited" for `delivery-limit` on 4.x and "drop at once" on 3.10: it
/// never counts as the lower one, and is a difference whenever it is not
/// what the topology wants.
fn lower(arg: Option<&Value>, pol: &Value) -> Value {
    match (arg.and_then(Value::as_i64), pol.as_i64()) {
        (Some(a), Some(p)) if a >= 0 && p >= 0 => Value::from(a.min(p)),
        _ => pol.clone(),
    }
}

/// The overflow behaviour a queue ends up with: on quorum queues the
/// policy's wins over the argument, on classic ones the argument's;
/// `drop-head` when neither sets one.
pub(crate) fn overflow_in_force(
    queue: &QueueSpec,
    queue_type: &str,
    applied: &AppliedPolicies,
) -> String {
    let arg = match queue.arguments.get("x-overflow") {
        Some(ArgValue::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let pol = applied
        .effective
        .get("overflow")
        .and_then(Value::as_str)
        .map(str::to_string);
    let chosen = if queue_type == "quorum" {
        pol.or(arg)
    } else {
        arg.or(pol)
    };
    chosen.unwrap_or_else(|| "drop-head".into())
}

/// What a full queue does with overflow `overflow` (measured on 3.10.8: a
/// classic main queue dropped its oldest messages into its DLX with reason
/// `maxlen`; a quorum one, `reject-publish`, nacked the publish that
/// overflowed it).
fn overflow_effect(overflow: &str) -> String {
    match overflow {
        "drop-head" => "when full, overflow drop-head drops its oldest messages (dead-lettered \
                        as `maxlen` where it has a dead-letter exchange)"
            .into(),
        "reject-publish" => "when full, overflow reject-publish refuses new messages (a publisher \
                             with confirms gets a nack; a dead-lettering into it waits in a quorum \
                             source, and is lost from a classic one)"
            .into(),
        "reject-publish-dlx" => "when full, overflow reject-publish-dlx refuses new messages and \
                                 dead-letters them"
            .into(),
        other => format!("when full, overflow {other} applies"),
    }
}

/// Which policy set `key`, and under which name.
fn source(applied: &AppliedPolicies, key: &str) -> (PolicyKind, String) {
    let value = applied.effective.get(key);
    let has = |def: &Option<Map<String, Value>>| def.as_ref().map(|d| d.get(key) == value);
    match (&applied.policy, &applied.operator_policy) {
        (Some(p), None) => (PolicyKind::Policy, p.clone()),
        (None, Some(o)) => (PolicyKind::OperatorPolicy, o.clone()),
        (Some(p), Some(o)) => match (
            has(&applied.policy_definition),
            has(&applied.operator_definition),
        ) {
            // The operator policy's value is the one in force.
            (_, Some(true)) => (PolicyKind::OperatorPolicy, o.clone()),
            (Some(true), _) => (PolicyKind::Policy, p.clone()),
            _ => (PolicyKind::Either, format!("{p} or {o}")),
        },
        (None, None) => (PolicyKind::Either, "(unnamed)".into()),
    }
}

/// Every key of the policies applied to `queue` (of broker type
/// `queue_type`), as a [`Finding::PolicyOverrides`] when it makes the queue
/// differ from the plan and a [`Finding::PolicyInfo`] otherwise, in the
/// definition's key order; each of the applied policies' notes first, as a
/// [`Finding::PolicyWarning`].
pub fn policy_findings(
    queue: &QueueSpec,
    queue_type: &str,
    applied: &AppliedPolicies,
) -> Vec<Finding> {
    let mut out: Vec<Finding> = applied
        .notes
        .iter()
        .map(|note| Finding::PolicyWarning {
            object: ObjectKind::Queue,
            name: queue.name.clone(),
            note: note.clone(),
        })
        .collect();
    for (key, pol) in &applied.effective {
        let (policy_kind, policy) = source(applied, key);
        let wanted = queue.arguments.get(&format!("x-{key}")).map(arg_json);
        let info = |note: String| Finding::PolicyInfo {
            object: ObjectKind::Queue,
            name: queue.name.clone(),
            policy_kind,
            policy: policy.clone(),
            key: key.clone(),
            value: pol.to_string(),
            note,
        };
        let Some(r) = rule(key, queue_type) else {
            out.push(info("changes nothing the topology relies on".into()));
            continue;
        };
        let effective = match (r, &wanted) {
            (Rule::ArgumentWins, Some(w)) => {
                out.push(info(format!(
                    "the queue's argument ({w}) wins on {queue_type} queues"
                )));
                continue;
            }
            (Rule::Lower, w) => lower(w.as_ref(), pol),
            _ => pol.clone(),
        };
        let same = match &wanted {
            Some(w) => w == &effective,
            None => default_of(key).as_ref() == Some(&effective),
        };
        if same {
            out.push(info(match &wanted {
                Some(w) if w != pol => {
                    format!("the queue's argument ({w}) is lower and applies")
                }
                Some(_) => "the same as the topology's".into(),
                None => "what the queue does without it".into(),
            }));
            continue;
        }
        let note = match (wanted.is_none() && r == Rule::Lower, key.as_str()) {
            (true, "max-length" | "max-length-bytes") => format!(
                "{UNBOUNDED_NOTE}; {}",
                overflow_effect(&overflow_in_force(queue, queue_type, applied))
            ),
            (true, _) => UNBOUNDED_NOTE.to_string(),
            (false, _) => String::new(),
        };
        out.push(Finding::PolicyOverrides {
            object: ObjectKind::Queue,
            name: queue.name.clone(),
            policy_kind,
            policy,
            key: key.clone(),
            effective: show(Some(&effective)),
            wanted: show(wanted.as_ref()),
            note,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::plan::Role;
    use crate::topology::Arguments;
    use serde_json::json;

    fn queue(args: &[(&str, ArgValue)]) -> QueueSpec {
        QueueSpec {
            name: "orders.dlq".into(),
            role: Role::DeadLetterQueue,
            pipeline: "orders".into(),
            arguments: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<Arguments>(),
        }
    }

    fn def(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    fn only_policy(name: &str, v: Value) -> AppliedPolicies {
        AppliedPolicies {
            policy: Some(name.into()),
            effective: def(v),
            ..AppliedPolicies::default()
        }
    }

    fn only_operator(name: &str, v: Value) -> AppliedPolicies {
        AppliedPolicies {
            operator_policy: Some(name.into()),
            effective: def(v),
            ..AppliedPolicies::default()
        }
    }

    fn overrides(f: &[Finding]) -> Vec<(String, String, String)> {
        f.iter()
            .filter_map(|f| match f {
                Finding::PolicyOverrides {
                    key,
                    effective,
                    wanted,
                    ..
                } => Some((key.clone(), effective.clone(), wanted.clone())),
                _ => None,
            })
            .collect()
    }

    fn infos(f: &[Finding]) -> Vec<String> {
        f.iter()
            .filter_map(|f| match f {
                Finding::PolicyInfo { key, .. } => Some(key.clone()),
                _ => None,
            })
            .collect()
    }

    const DAYS_14: i64 = 14 * 86_400_000;

    fn dlq_quorum() -> QueueSpec {
        queue(&[
            ("x-queue-type", ArgValue::Str("quorum".into())),
            ("x-message-ttl", ArgValue::Int(DAYS_14)),
            ("x-delivery-limit", ArgValue::Int(i32::MAX as i64)),
        ])
    }

    #[test]
    fn an_operator_policy_that_cuts_the_ttl_and_bounds_the_dlq_overrides_both() {
        let a = only_operator("cap", json!({"message-ttl": 1000, "max-length": 5}));
        let f = policy_findings(&dlq_quorum(), "quorum", &a);
        assert_eq!(
            overrides(&f),
            vec![
                ("max-length".into(), "5".into(), "none".into()),
                ("message-ttl".into(), "1000".into(), DAYS_14.to_string()),
            ]
        );
        assert!(f.iter().all(Finding::is_difference));
        match &f[0] {
            Finding::PolicyOverrides {
                policy_kind,
                policy,
                note,
                ..
            } => {
                assert_eq!(*policy_kind, PolicyKind::OperatorPolicy);
                assert_eq!(policy, "cap");
                assert!(note.starts_with(UNBOUNDED_NOTE), "{note}");
                // A quorum DLQ without `max_length` has no overflow
                // argument: the default, drop-head, drops its oldest.
                assert!(note.contains("drop-head drops its oldest"), "{note}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_higher_limit_than_the_argument_changes_nothing() {
        let a = only_policy("long", json!({"message-ttl": DAYS_14 * 2}));
        let f = policy_findings(&dlq_quorum(), "quorum", &a);
        assert_eq!(overrides(&f), vec![]);
        assert_eq!(infos(&f), vec!["message-ttl"]);
        assert!(!f[0].is_difference());
    }

    #[test]
    fn overflow_wins_on_quorum_queues_and_loses_on_classic_ones() {
        let main = |t: &str| {
            queue(&[
                ("x-queue-type", ArgValue::Str(t.into())),
                ("x-overflow", ArgValue::Str("reject-publish".into())),
            ])
        };
        let a = only_policy("dh", json!({"overflow": "drop-head"}));
        assert_eq!(
            overrides(&policy_findings(&main("quorum"), "quorum", &a)),
            vec![(
                "overflow".into(),
                "\"drop-head\"".into(),
                "\"reject-publish\"".into()
            )]
        );
        let f = policy_findings(&main("classic"), "classic", &a);
        assert_eq!(overrides(&f), vec![]);
        assert_eq!(infos(&f), vec!["overflow"]);
        // Without the argument the policy applies; its default value is
        // what the queue does anyway.
        let bare = queue(&[("x-queue-type", ArgValue::Str("classic".into()))]);
        assert_eq!(
            overrides(&policy_findings(&bare, "classic", &a)),
            vec![],
            "drop-head is the default"
        );
        let rp = only_policy("rp", json!({"overflow": "reject-publish"}));
        assert_eq!(overrides(&policy_findings(&bare, "classic", &rp)).len(), 1);
    }

    #[test]
    fn dead_letter_keys_apply_only_where_the_topology_sets_none() {
        let main = queue(&[
            ("x-queue-type", ArgValue::Str("quorum".into())),
            ("x-dead-letter-exchange", ArgValue::Str("orders.dlx".into())),
        ]);
        let a = only_policy(
            "dlx",
            json!({"dead-letter-exchange": "elsewhere", "dead-letter-routing-key": "k"}),
        );
        let f = policy_findings(&main, "quorum", &a);
        // The exchange argument wins; the routing key has no argument.
        assert_eq!(
            overrides(&f),
            vec![(
                "dead-letter-routing-key".into(),
                "\"k\"".into(),
                "none".into()
            )]
        );
        assert_eq!(infos(&f), vec!["dead-letter-exchange"]);
        // On the DLQ (no dead-lettering wanted) a DLX policy is a change.
        let f = policy_findings(&dlq_quorum(), "quorum", &a);
        assert_eq!(overrides(&f).len(), 2);
    }

    #[test]
    fn keys_that_change_nothing_are_information() {
        let a = only_policy(
            "ll",
            json!({"queue-leader-locator": "balanced", "ha-mode": "all"}),
        );
        let f = policy_findings(&dlq_quorum(), "quorum", &a);
        assert_eq!(overrides(&f), vec![]);
        assert_eq!(infos(&f), vec!["ha-mode", "queue-leader-locator"]);
        assert!(f.iter().all(|f| !f.is_difference()));
        assert_eq!(
            policy_findings(&dlq_quorum(), "quorum", &AppliedPolicies::default()),
            vec![]
        );
    }

    #[test]
    fn a_delivery_limit_is_the_lower_value_and_a_negative_one_always_differs() {
        let main = queue(&[
            ("x-queue-type", ArgValue::Str("quorum".into())),
            ("x-delivery-limit", ArgValue::Int(20)),
        ]);
        let f = |v: i64| {
            overrides(&policy_findings(
                &main,
                "quorum",
                &only_policy("dl", json!({ "delivery-limit": v })),
            ))
        };
        assert_eq!(f(50), vec![]);
        assert_eq!(
            f(5),
            vec![("delivery-limit".into(), "5".into(), "20".into())]
        );
        assert_eq!(
            f(-1),
            vec![("delivery-limit".into(), "-1".into(), "20".into())]
        );
    }

    #[test]
    fn with_both_policies_the_key_is_named_after_the_one_in_force() {
        let mut a = AppliedPolicies {
            policy: Some("plain".into()),
            operator_policy: Some("op".into()),
            effective: def(json!({"message-ttl": 1000, "overflow": "drop-head"})),
            policy_definition: Some(def(json!({"message-ttl": 5000, "overflow": "drop-head"}))),
            operator_definition: Some(def(json!({"message-ttl": 1000}))),
            notes: vec![],
        };
        let main = queue(&[
            ("x-queue-type", ArgValue::Str("quorum".into())),
            ("x-overflow", ArgValue::Str("reject-publish".into())),
        ]);
        let names = |a: &AppliedPolicies| -> Vec<(PolicyKind, String)> {
            policy_findings(&main, "quorum", a)
                .into_iter()
                .filter_map(|f| match f {
                    Finding::PolicyOverrides {
                        policy_kind,
                        policy,
                        ..
                    } => Some((policy_kind, policy)),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(
            names(&a),
            vec![
                (PolicyKind::OperatorPolicy, "op".into()),
                (PolicyKind::Policy, "plain".into())
            ]
        );
        a.policy_definition = None;
        a.operator_definition = None;
        assert_eq!(names(&a)[0], (PolicyKind::Either, "plain or op".into()));
    }

    #[test]
    fn notes_come_first_as_warnings_that_are_not_differences() {
        let mut a = only_policy("ll", json!({"queue-leader-locator": "balanced"}));
        a.notes = vec!["a tie".into()];
        let f = policy_findings(&dlq_quorum(), "quorum", &a);
        assert_eq!(f.len(), 2);
        assert!(f[0].is_warning() && !f[0].is_difference() && !f[0].is_info());
        assert_eq!(f[0].to_string(), "warning: queue orders.dlq: a tie");
    }
}
