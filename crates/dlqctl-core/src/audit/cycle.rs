//! Dead-letter cycles: a DLQ that dead-letters its messages back into its
//! own pipeline. Pure.
//!
//! dlqctl declares the DLQ without a dead-letter exchange, but a policy can
//! give it one (`dead-letter-exchange`, with or without
//! `dead-letter-routing-key`): its messages then leave it when they expire
//! (or overflow), and where that exchange routes them back into the
//! pipeline (the main queue, a tier, the DLQ itself), RabbitMQ's cycle rule
//! drops them silently whenever the path holds no rejection (a message is
//! dropped for a target queue that is already a source in its death
//! history with no `rejected` in between); otherwise the worker gets them
//! again, in a loop. Either way the DLQ no longer keeps what failed.
//!
//! The route is worked out from the plan's own exchanges and bindings: the
//! default exchange by queue name, the DLX (fanout) to the DLQ, the retry
//! exchange by tier name, the producers' exchange by its bindings. Without
//! a `dead-letter-routing-key` a message keeps its own routing key, which
//! for the worker's dead letters is the main queue's name.

use crate::audit::policy::AppliedPolicies;
use crate::topology::plan::{Plan, QueueSpec, Role};
use crate::topology::{ArgValue, ExchangeType};
use crate::values::duration::tier_name;
use serde_json::Value;

/// A path by which a DLQ dead-letters back into its own pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cycle {
    /// What set the dead-letter exchange: "policy `NAME`" or "argument
    /// x-dead-letter-exchange".
    pub source: String,
    /// The path, `orders.dlq → exchange "" [orders] → queue orders`.
    pub path: String,
    /// The queue the path reaches.
    pub into: String,
    /// True when the path reaches the DLQ itself: every such message is
    /// dropped (no rejection can be in between).
    pub self_loop: bool,
    /// When messages take the path: `when they expire (message-ttl 1s)`.
    pub when: String,
}

impl Cycle {
    /// The sentence a check reports.
    pub fn message(&self) -> String {
        let effect = if self.self_loop {
            "each such message is dropped silently (RabbitMQ's dead-letter cycle rule)"
        } else {
            "such messages are dropped silently when no rejection is on their path \
             (RabbitMQ's dead-letter cycle rule), or handed to the worker again, in a loop"
        };
        format!(
            "{} dead-letters it back into its own pipeline {}: {}; {effect}, and the DLQ no \
             longer keeps what failed; remove dead-letter-exchange from the policy or narrow its \
             pattern so that it does not match the DLQ",
            self.source, self.when, self.path
        )
    }
}

fn arg_str<'a>(q: &'a QueueSpec, key: &str) -> Option<&'a str> {
    match q.arguments.get(key) {
        Some(ArgValue::Str(s)) => Some(s),
        _ => None,
    }
}

/// A key from the queue's argument (which wins) or its policies.
fn key_of(q: &QueueSpec, applied: Option<&AppliedPolicies>, key: &str) -> Option<(String, bool)> {
    if let Some(a) = arg_str(q, &format!("x-{key}")) {
        return Some((a.to_string(), false));
    }
    let v = applied?.effective.get(key)?.as_str()?;
    Some((v.to_string(), true))
}

/// Whether a topic binding `pattern` routes `key` (`*` one word, `#` zero
/// or more).
pub(crate) fn topic_matches(pattern: &str, key: &str) -> bool {
    fn go(p: &[&str], k: &[&str]) -> bool {
        match (p.first(), k.first()) {
            (None, None) => true,
            (Some(&"#"), _) => go(&p[1..], k) || (!k.is_empty() && go(p, &k[1..])),
            (Some(&"*"), Some(_)) => go(&p[1..], &k[1..]),
            (Some(w), Some(x)) if w == x => go(&p[1..], &k[1..]),
            _ => false,
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = if key.is_empty() {
        vec![]
    } else {
        key.split('.').collect()
    };
    let p: Vec<&str> = if pattern.is_empty() { vec![] } else { p };
    go(&p, &k)
}

/// The queue of `dlq`'s pipeline that exchange `x` routes `key` to, and
/// whether that is certain (a headers exchange routes by arguments a
/// dead letter may or may not carry).
fn routed_to<'a>(plan: &'a Plan, pipeline: &str, x: &str, key: &str) -> Option<(&'a str, bool)> {
    if x.is_empty() {
        return plan
            .queues
            .iter()
            .find(|q| q.pipeline == pipeline && q.name == key)
            .map(|q| (q.name.as_str(), true));
    }
    let e = plan
        .exchanges
        .iter()
        .find(|e| e.name == x && e.pipelines.iter().any(|p| p == pipeline))?;
    plan.bindings
        .iter()
        .filter(|b| b.exchange == x && b.pipeline == pipeline)
        .find_map(|b| {
            let hit = match e.kind {
                ExchangeType::Fanout | ExchangeType::Headers => true,
                ExchangeType::Direct => b.routing_key == key,
                ExchangeType::Topic => topic_matches(&b.routing_key, key),
            };
            hit.then_some((b.queue.as_str(), e.kind != ExchangeType::Headers))
        })
}

/// When messages leave the DLQ: on expiry when a TTL applies.
fn when(dlq: &QueueSpec, applied: Option<&AppliedPolicies>) -> String {
    let arg = match dlq.arguments.get("x-message-ttl") {
        Some(ArgValue::Int(i)) if *i >= 0 => Some(*i as u64),
        _ => None,
    };
    let pol = applied
        .and_then(|a| a.effective.get("message-ttl"))
        .and_then(Value::as_u64);
    let ttl = match (arg, pol) {
        (Some(a), Some(p)) => Some(a.min(p)),
        (a, p) => a.or(p),
    };
    match ttl {
        Some(t) => format!("when its messages expire (after {})", tier_name(t)),
        None => {
            "when a message is dead-lettered from it (expired, over its length, rejected)".into()
        }
    }
}

/// The path by which the DLQ `dlq` of `plan` dead-letters back into its
/// own pipeline under its arguments and the policies that apply
/// (`applied`, `None` when unknown), if there is one.
pub(crate) fn dead_letter_cycle(
    plan: &Plan,
    dlq: &QueueSpec,
    applied: Option<&AppliedPolicies>,
) -> Option<Cycle> {
    let (x, by_policy) = key_of(dlq, applied, "dead-letter-exchange")?;
    let source = match (by_policy, applied.and_then(|a| a.policy.as_deref())) {
        (true, Some(p)) => format!("policy `{p}`"),
        (true, None) => "a policy".to_string(),
        (false, _) => "its argument x-dead-letter-exchange".to_string(),
    };
    let pipeline = dlq.pipeline.as_str();
    let main = plan
        .queues
        .iter()
        .find(|q| q.pipeline == pipeline && q.role == Role::MainQueue)?;
    let (key, key_note) = match key_of(dlq, applied, "dead-letter-routing-key") {
        Some((k, _)) => (k, String::new()),
        None => (
            main.name.clone(),
            " (no dead-letter-routing-key: each message keeps its own, the main queue's name for \
             the worker's dead letters)"
                .to_string(),
        ),
    };
    let (into, certain) = routed_to(plan, pipeline, &x, &key)?;
    let target = plan.queues.iter().find(|q| q.name == into)?;
    let mut path = format!(
        "{} → exchange {:?} [{key}]{key_note} → {}queue {into}",
        dlq.name,
        x,
        if certain { "" } else { "possibly " }
    );
    if target.role == Role::RetryQueue {
        path += &format!(" → after its TTL → queue {}", main.name);
    }
    Some(Cycle {
        source,
        path,
        into: into.to_string(),
        self_loop: target.role == Role::DeadLetterQueue,
        when: when(dlq, applied),
    })
}

#[cfg(test)]
#[path = "cycle_tests.rs"]
mod tests;
