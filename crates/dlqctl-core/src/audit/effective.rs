//! Which policy and which operator policy apply to a queue, worked out
//! from their definitions (`GET /api/policies/{vhost}`,
//! `GET /api/operator-policies/{vhost}`) as the broker does. Pure.
//!
//! The management API also reports a queue's `policy`, `operator_policy`
//! and `effective_policy_definition`, but refreshes them only with the
//! queue's statistics: a policy set a few seconds ago does not show there
//! yet. The definitions are current at once, so dlqctl resolves from them
//! and reads the queue's fields only to compare ([`resolve_against`]) or
//! when the definitions cannot be read (403 for a user without access to
//! the vhost: then with [`queue_view_note`]).
//!
//! RabbitMQ's rules (`rabbit_policy`, 3.10 to 4.3), followed here:
//! - a policy matches a queue when its `apply-to` is `all`, `queues`, or
//!   the queue's own type (`classic_queues`, `quorum_queues`, `streams`,
//!   from 3.12), its `pattern` (a regular expression, searched, not
//!   anchored, in the name's bytes) matches, and its definition holds no
//!   key the queue's type does not support (such a policy is skipped as a
//!   whole: `unsupported_keys`);
//! - of the matching policies the one of highest `priority` applies; the
//!   same for operator policies, separately. Between two matches of equal
//!   priority the broker's pick is undefined: that is reported
//!   (`Effective::warnings`);
//! - where both set a key, the operator policy's value wins when lower for
//!   `message-ttl`, `expires`, `max-length`, `max-length-bytes`,
//!   `max-in-memory-length`, `max-in-memory-bytes` and `delivery-limit`
//!   (the lower of the two); for two booleans the operator policy's wins
//!   (`rabbit_policies:merge_policy_value`). Other keys cannot be set by an
//!   operator policy.
//!
//! A pattern that uses PCRE-only constructs (look-around,
//! back-references) cannot be evaluated here: such a policy is named in
//! `Effective::undecided` and the caller keeps the queue's own view.

use crate::audit::policy::AppliedPolicies;
use regex_automata::dfa::regex::Regex;
use serde_json::{Map, Value};

/// One policy or operator policy as the management API lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDefinition {
    /// Its name.
    pub name: String,
    /// The regular expression matched against object names.
    pub pattern: String,
    /// `all`, `queues`, `exchanges`, `classic_queues`, `quorum_queues` or
    /// `streams`.
    pub apply_to: String,
    /// Its priority (the highest matching one applies).
    pub priority: f64,
    /// Its definition (`{"message-ttl": 1000, ...}`).
    pub definition: Map<String, Value>,
}

/// The most memory one policy pattern's automaton may take, in bytes.
const DFA_SIZE_LIMIT: usize = 2 << 20;

/// A policy with its pattern compiled (`Err`: it cannot be evaluated here).
#[derive(Debug, Clone)]
struct Compiled {
    def: PolicyDefinition,
    regex: Result<Regex, String>,
}

impl Compiled {
    fn new(def: PolicyDefinition) -> Compiled {
        // As RabbitMQ runs it (Erlang's `re` without `unicode`): on the
        // bytes of the name; the empty pattern matches every name.
        let regex = Regex::builder()
            // A pattern such as `.*a.{20}` would build millions of
            // states: past these limits it is one that cannot be
            // evaluated here (the queues' own report is used for it).
            .dense(
                regex_automata::dfa::dense::Config::new()
                    .dfa_size_limit(Some(DFA_SIZE_LIMIT))
                    .determinize_size_limit(Some(DFA_SIZE_LIMIT)),
            )
            .syntax(
                regex_automata::util::syntax::Config::new()
                    .unicode(false)
                    .utf8(false),
            )
            .build(&def.pattern)
            .map_err(|e| format!("cannot evaluate pattern `{}` here: {e}", def.pattern));
        Compiled { def, regex }
    }
}

/// The policies and operator policies of one virtual host, compiled once,
/// and the broker version they are read against.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    policies: Vec<Compiled>,
    operator_policies: Vec<Compiled>,
    version: Option<(u32, u32)>,
}

impl PolicySet {
    /// The set of `policies` and `operator_policies`, on a broker of
    /// `version` (`rabbitmq_version`, e.g. `3.10.8`; `None` when unknown:
    /// the newest rules are used).
    pub fn new(
        policies: Vec<PolicyDefinition>,
        operator_policies: Vec<PolicyDefinition>,
        version: Option<&str>,
    ) -> PolicySet {
        PolicySet {
            policies: policies.into_iter().map(Compiled::new).collect(),
            operator_policies: operator_policies.into_iter().map(Compiled::new).collect(),
            version: version.and_then(major_minor),
        }
    }

    /// True when neither kind of policy exists.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty() && self.operator_policies.is_empty()
    }
}

/// `(major, minor)` of a version string such as `3.10.8` or `4.3.6+1`.
fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

/// What applies to one queue, from the definitions.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Effective {
    /// The policy that applies.
    pub policy: Option<String>,
    /// The operator policy that applies.
    pub operator_policy: Option<String>,
    /// The merged definition in force (the policy's keys, with the
    /// operator policy's merged in).
    pub definition: Map<String, Value>,
    /// The policy's own definition.
    pub policy_definition: Option<Map<String, Value>>,
    /// The operator policy's own definition.
    pub operator_definition: Option<Map<String, Value>>,
    /// Sentences worth a warning: a tie of priorities.
    pub warnings: Vec<String>,
    /// Policies whose pattern could not be evaluated and that would win if
    /// it matched: the result is then not certain.
    pub undecided: Vec<String>,
}

/// The policy keys a queue of `queue_type` does not support on a broker of
/// `version`: a policy holding any of them does not apply to such a queue
/// at all (`unsupported_policies` of each queue type's capabilities, from
/// RabbitMQ 3.10.8 to 4.3.5).
pub(crate) fn unsupported_keys(queue_type: &str, version: Option<(u32, u32)>) -> Vec<&'static str> {
    const HA: [&str; 6] = [
        "ha-mode",
        "ha-params",
        "ha-sync-mode",
        "ha-promote-on-shutdown",
        "ha-promote-on-failure",
        "queue-master-locator",
    ];
    const JMS: [&str; 2] = ["selector-fields", "selector-field-max-bytes"];
    let v = version.unwrap_or((u32::MAX, 0));
    let mut out: Vec<&'static str> = Vec::new();
    match queue_type {
        "quorum" => {
            out.extend(["max-priority", "queue-mode"]);
            out.extend(HA);
            out.extend([
                "max-age",
                "stream-max-segment-size-bytes",
                "initial-cluster-size",
            ]);
            if v < (4, 2) {
                out.push("single-active-consumer");
            }
        }
        "classic" => {
            out.extend([
                "max-age",
                "stream-max-segment-size-bytes",
                "initial-cluster-size",
            ]);
            out.extend(["delivery-limit", "dead-letter-strategy"]);
            if v < (4, 0) {
                out.push("queue-leader-locator");
            }
            if v >= (3, 13) {
                out.extend([
                    "max-in-memory-length",
                    "max-in-memory-bytes",
                    "target-group-size",
                ]);
            }
        }
        "stream" => {
            out.extend(["expires", "message-ttl", "dead-letter-exchange"]);
            out.extend([
                "dead-letter-routing-key",
                "max-length",
                "max-in-memory-length",
            ]);
            out.extend([
                "max-in-memory-bytes",
                "max-priority",
                "overflow",
                "queue-mode",
            ]);
            out.extend([
                "delivery-limit",
                "dead-letter-strategy",
                "target-group-size",
            ]);
            out.extend(HA);
            if v < (4, 2) {
                out.push("single-active-consumer");
            }
        }
        _ => return out,
    }
    out.extend(JMS);
    out
}

/// Whether `apply_to` covers a queue of `queue_type`.
fn applies_to_queue(apply_to: &str, queue_type: &str) -> bool {
    match apply_to {
        "all" | "queues" => true,
        "classic_queues" => queue_type == "classic",
        "quorum_queues" => queue_type == "quorum",
        "streams" => queue_type == "stream",
        _ => false,
    }
}

/// The keys an operator policy's value wins for when lower.
pub(crate) const LOWER_WINS: [&str; 7] = [
    "message-ttl",
    "expires",
    "max-length",
    "max-length-bytes",
    "max-in-memory-length",
    "max-in-memory-bytes",
    "delivery-limit",
];

/// The definition in force when both `policy` and `operator` apply, key
/// by key in key order: a key set by one only is taken as it is; set by
/// both, the lower number for `LOWER_WINS`, else the operator policy's.
pub fn merge(
    policy: Option<&Map<String, Value>>,
    operator: Option<&Map<String, Value>>,
) -> Map<String, Value> {
    let mut out = policy.cloned().unwrap_or_default();
    for (key, op) in operator.into_iter().flatten() {
        let merged = match (out.get(key), LOWER_WINS.contains(&key.as_str())) {
            (Some(p), true) => match (p.as_f64(), op.as_f64()) {
                (Some(a), Some(b)) if a <= b => p.clone(),
                _ => op.clone(),
            },
            _ => op.clone(),
        };
        out.insert(key.clone(), merged);
    }
    out
}

/// The result of matching one kind of policy against a queue.
struct Pick<'a> {
    chosen: Option<&'a PolicyDefinition>,
    tied: Vec<&'a str>,
    undecided: Vec<String>,
}

/// The highest-priority policy of `list` that matches; among a tie the one
/// named `prefer` (the broker's pick, when known), else the first by name.
fn pick<'a>(
    list: &'a [Compiled],
    queue: &str,
    queue_type: &str,
    unsupported: &[&str],
    prefer: Option<&str>,
) -> Pick<'a> {
    let mut matching: Vec<&PolicyDefinition> = Vec::new();
    let mut unknown: Vec<&PolicyDefinition> = Vec::new();
    for c in list {
        let d = &c.def;
        let applicable = applies_to_queue(&d.apply_to, queue_type)
            && !d
                .definition
                .keys()
                .any(|k| unsupported.contains(&k.as_str()));
        if !applicable {
            continue;
        }
        match &c.regex {
            Ok(r) if r.is_match(queue.as_bytes()) => matching.push(d),
            Ok(_) => {}
            Err(_) => unknown.push(d),
        }
    }
    let top = matching
        .iter()
        .map(|d| d.priority)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut tied: Vec<&PolicyDefinition> =
        matching.into_iter().filter(|d| d.priority == top).collect();
    tied.sort_by(|a, b| a.name.cmp(&b.name));
    let chosen = tied
        .iter()
        .find(|d| Some(d.name.as_str()) == prefer)
        .or(tied.first())
        .copied();
    let undecided = unknown
        .into_iter()
        .filter(|d| d.priority >= top)
        .map(|d| d.name.clone())
        .collect();
    Pick {
        chosen,
        tied: if tied.len() > 1 {
            tied.iter().map(|d| d.name.as_str()).collect()
        } else {
            vec![]
        },
        undecided,
    }
}

/// What applies to the queue `queue` of type `queue_type` (`classic`,
/// `quorum`, `stream`), from the definitions of `set`.
#[cfg(test)]
pub(crate) fn effective_policy(queue: &str, queue_type: &str, set: &PolicySet) -> Effective {
    effective_preferring(queue, queue_type, set, None, None)
}

/// As [`effective_policy`], breaking a tie of priorities in favour of the
/// names given (the queue's own view of what the broker picked).
fn effective_preferring(
    queue: &str,
    queue_type: &str,
    set: &PolicySet,
    prefer_policy: Option<&str>,
    prefer_operator: Option<&str>,
) -> Effective {
    let unsupported = unsupported_keys(queue_type, set.version);
    let p = pick(
        &set.policies,
        queue,
        queue_type,
        &unsupported,
        prefer_policy,
    );
    let o = pick(
        &set.operator_policies,
        queue,
        queue_type,
        &unsupported,
        prefer_operator,
    );
    let mut warnings = Vec::new();
    for (kind, pk) in [("policies", &p), ("operator policies", &o)] {
        if let (false, Some(c)) = (pk.tied.is_empty(), pk.chosen) {
            warnings.push(format!(
                "{kind} {} match it with the same priority ({}): which one the broker applies is \
                 undefined (taken here: `{}`); give them different priorities",
                pk.tied
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                c.priority,
                c.name
            ));
        }
    }
    let policy_definition = p.chosen.map(|d| d.definition.clone());
    let operator_definition = o.chosen.map(|d| d.definition.clone());
    Effective {
        policy: p.chosen.map(|d| d.name.clone()),
        operator_policy: o.chosen.map(|d| d.name.clone()),
        definition: merge(policy_definition.as_ref(), operator_definition.as_ref()),
        policy_definition,
        operator_definition,
        warnings,
        undecided: p.undecided.into_iter().chain(o.undecided).collect(),
    }
}

/// The start of the warning on policies read from the queues' own fields.
pub(crate) const QUEUE_VIEW_NOTE: &str = "policies read from the queues' statistics (the policy \
definitions could not be read), possibly a few seconds old: a policy set or changed just before \
may not show yet";

/// The warning, given once for all queues, when their policies come from
/// their own reported fields because the definitions could not be read
/// (`why`).
pub fn queue_view_note(why: &str) -> String {
    format!("{QUEUE_VIEW_NOTE} ({why})")
}

/// What applies to `queue`, from the definitions of `set`, compared with
/// the queue's reported fields (`reported`, `None` when the statistics
/// have not reported them yet). The definitions win; where the two
/// disagree, a note names both. A pattern that cannot be evaluated and
/// could win leaves the queue's view in force, with a note.
pub fn resolve_against(
    queue: &str,
    queue_type: &str,
    set: &PolicySet,
    reported: Option<&AppliedPolicies>,
) -> AppliedPolicies {
    let e = effective_preferring(
        queue,
        queue_type,
        set,
        reported.and_then(|r| r.policy.as_deref()),
        reported.and_then(|r| r.operator_policy.as_deref()),
    );
    if let (false, Some(r)) = (e.undecided.is_empty(), reported) {
        let mut a = r.clone();
        a.notes.push(format!(
            "the pattern of {} cannot be evaluated here: the queue's own report is used, possibly \
             a few seconds old",
            e.undecided.join(", ")
        ));
        return a;
    }
    let mut notes = e.warnings.clone();
    if let Some(r) = reported {
        if let Some(note) = disagreement(&e, r) {
            notes.push(note);
        }
    }
    if !e.undecided.is_empty() {
        notes.push(format!(
            "the pattern of {} cannot be evaluated here: it may apply instead",
            e.undecided.join(", ")
        ));
    }
    AppliedPolicies {
        policy: e.policy,
        operator_policy: e.operator_policy,
        effective: e.definition,
        policy_definition: e.policy_definition,
        operator_definition: e.operator_definition,
        notes,
    }
}

fn shown(name: &Option<String>) -> String {
    name.as_ref()
        .map_or_else(|| "none".to_string(), |n| format!("`{n}`"))
}

/// A sentence naming both views when the definitions and the queue's
/// reported fields disagree on which policies apply or on what they set.
fn disagreement(e: &Effective, r: &AppliedPolicies) -> Option<String> {
    let same_names = e.policy == r.policy && e.operator_policy == r.operator_policy;
    if same_names && e.definition == r.effective {
        return None;
    }
    Some(format!(
        "the policy definitions give policy {} and operator policy {} ({}); the queue's \
         statistics, possibly a few seconds old, report policy {} and operator policy {} ({}): \
         the definitions are used",
        shown(&e.policy),
        shown(&e.operator_policy),
        Value::Object(e.definition.clone()),
        shown(&r.policy),
        shown(&r.operator_policy),
        Value::Object(r.effective.clone()),
    ))
}

#[cfg(test)]
#[path = "effective_tests.rs"]
mod tests;
