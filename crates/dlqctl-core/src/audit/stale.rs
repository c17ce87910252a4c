//! Objects with dlqctl's generated names that the topology no longer
//! describes: a tier queue left behind when its delay was removed, a DLQ
//! left behind when `dead_letter.queue` was renamed, a binding the file
//! dropped. `provision` never deletes anything, so these stay on the broker
//! (with whatever messages they hold) until an operator retires them;
//! `--check` lists them.
//!
//! What counts as dlqctl's, for a pipeline `P` of the file:
//! - a queue named `P.retry.<anything>` (the retry exchange's name plus a
//!   dot) that the plan does not declare;
//! - a queue named `P.dlq` when the plan's DLQ for `P` has another name;
//! - a binding whose source is `P.retry` or `P.dlx` (exchanges only dlqctl
//!   routes through), or that joins two objects of the plan, when the plan
//!   has no binding with its source, destination, key and arguments.
//!
//! Objects of pipelines that are not in the file are never listed: several
//! topology files may share a vhost.

use crate::audit::finding::{Finding, ObjectKind};
use crate::topology::plan::{Plan, Role};
use crate::topology::{ArgValue, Arguments};
use std::collections::HashSet;

/// A queue as the broker lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedQueue {
    /// Queue name.
    pub name: String,
    /// Ready plus unacked messages, when the broker said.
    pub messages: Option<u64>,
    /// Unacked messages, when the broker said.
    pub unacked: Option<u64>,
    /// Messages a quorum queue holds for its refused dead-letter target.
    pub messages_dlx: Option<u64>,
    /// The queue type (`classic`, `quorum`, ...), when the broker said.
    pub kind: Option<String>,
    /// The policies that apply to it; `None` until the broker's statistics
    /// report them (a few seconds after the queue is created).
    pub policies: Option<crate::audit::policy::AppliedPolicies>,
}

/// A binding as the broker lists it (the management API's
/// `/api/bindings/VHOST`).
#[derive(Debug, Clone, PartialEq)]
pub struct ListedBinding {
    /// Source exchange (`""`: the default exchange).
    pub source: String,
    /// Destination queue or exchange.
    pub destination: String,
    /// True when the destination is a queue.
    pub to_queue: bool,
    /// Routing key.
    pub routing_key: String,
    /// Binding arguments as JSON.
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

/// True when the management API's JSON arguments are exactly `wanted`.
pub fn args_match(api: &serde_json::Map<String, serde_json::Value>, wanted: &Arguments) -> bool {
    if api.len() != wanted.len() {
        return false;
    }
    wanted.iter().all(|(k, v)| {
        let Some(a) = api.get(k) else { return false };
        match v {
            ArgValue::Int(i) => a.as_i64() == Some(*i),
            ArgValue::Str(s) => a.as_str() == Some(s.as_str()),
            ArgValue::Bool(b) => a.as_bool() == Some(*b),
        }
    })
}

/// The broker's objects that look like dlqctl's for a pipeline of `plan`
/// but that `plan` does not declare, as [`Finding::NotInTopology`], queues
/// first, each list in the broker's order.
pub fn stale_objects(
    plan: &Plan,
    queues: &[ListedQueue],
    bindings: &[ListedBinding],
) -> Vec<Finding> {
    let planned_queues: HashSet<&str> = plan.queues.iter().map(|q| q.name.as_str()).collect();
    let planned_exchanges: HashSet<&str> = plan.exchanges.iter().map(|e| e.name.as_str()).collect();
    // Exchanges only dlqctl routes through: their bindings are all ours.
    let owned_exchanges: HashSet<&str> = plan
        .exchanges
        .iter()
        .filter(|e| matches!(e.role, Role::RetryExchange | Role::DeadLetterExchange))
        .map(|e| e.name.as_str())
        .collect();
    let tier_prefixes: Vec<String> = plan
        .exchanges
        .iter()
        .filter(|e| e.role == Role::RetryExchange)
        .map(|e| format!("{}.", e.name))
        .collect();
    // `P.dlq` of each pipeline whose DLQ is named otherwise.
    let renamed_dlqs: HashSet<String> = plan
        .queues
        .iter()
        .filter(|q| q.role == Role::DeadLetterQueue && q.name != format!("{}.dlq", q.pipeline))
        .map(|q| format!("{}.dlq", q.pipeline))
        .collect();
    // `P.redrive-state` of each pipeline of the plan (listed when the
    // plan no longer has it: its redrive policy was removed).
    let state_queues: HashSet<String> = plan
        .queues
        .iter()
        .filter(|q| q.role == Role::MainQueue)
        .map(|q| format!("{}.redrive-state", q.pipeline))
        .collect();

    let mut out = Vec::new();
    for q in queues {
        if planned_queues.contains(q.name.as_str()) {
            continue;
        }
        let tier = tier_prefixes.iter().any(|p| q.name.starts_with(p.as_str()));
        if tier || renamed_dlqs.contains(&q.name) || state_queues.contains(&q.name) {
            out.push(Finding::NotInTopology {
                object: ObjectKind::Queue,
                name: q.name.clone(),
                messages: q.messages,
            });
        }
    }
    for b in bindings {
        if b.source.is_empty() {
            continue;
        }
        let ours = owned_exchanges.contains(b.source.as_str())
            || (planned_exchanges.contains(b.source.as_str())
                && (planned_queues.contains(b.destination.as_str())
                    || planned_exchanges.contains(b.destination.as_str())));
        if !ours {
            continue;
        }
        let planned = plan.bindings.iter().any(|p| {
            b.to_queue
                && p.exchange == b.source
                && p.queue == b.destination
                && p.routing_key == b.routing_key
                && args_match(&b.arguments, &p.arguments)
        });
        if !planned {
            out.push(Finding::NotInTopology {
                object: ObjectKind::Binding,
                name: format!("{} -> {} [{}]", b.source, b.destination, b.routing_key),
                messages: None,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{parse_topology, plan};

    fn the_plan(yaml: &str) -> Plan {
        plan(&parse_topology(yaml, "t.yaml").expect("a valid topology"))
    }

    const ORDERS: &str = "version: 1\npipelines:\n  - name: orders\n    queue_type: quorum\n    retry: { delays: [1s, 10s], max_attempts: 3 }\n    exchange: { name: shop, type: topic, bindings: [order.*] }\n";

    fn q(name: &str, messages: Option<u64>) -> ListedQueue {
        ListedQueue {
            name: name.into(),
            messages,
            unacked: None,
            messages_dlx: None,
            kind: None,
            policies: None,
        }
    }

    fn b(source: &str, destination: &str, key: &str) -> ListedBinding {
        ListedBinding {
            source: source.into(),
            destination: destination.into(),
            to_queue: true,
            routing_key: key.into(),
            arguments: Default::default(),
        }
    }

    /// What the plan declares, as the broker would list it.
    fn listing(p: &Plan) -> (Vec<ListedQueue>, Vec<ListedBinding>) {
        let queues = p.queues.iter().map(|x| q(&x.name, Some(0))).collect();
        let mut bindings: Vec<ListedBinding> = p
            .bindings
            .iter()
            .map(|x| b(&x.exchange, &x.queue, &x.routing_key))
            .collect();
        // The default exchange's implicit binding of every queue.
        bindings.extend(p.queues.iter().map(|x| b("", &x.name, &x.name)));
        (queues, bindings)
    }

    fn not_in_topology(object: ObjectKind, name: &str, messages: Option<u64>) -> Finding {
        Finding::NotInTopology {
            object,
            name: name.into(),
            messages,
        }
    }

    #[test]
    fn the_plan_itself_has_nothing_stale() {
        let p = the_plan(ORDERS);
        let (queues, bindings) = listing(&p);
        assert_eq!(stale_objects(&p, &queues, &bindings), vec![]);
    }

    #[test]
    fn a_removed_tier_leaves_its_queue_and_binding_listed_with_the_depth() {
        let p = the_plan(ORDERS);
        let (mut queues, mut bindings) = listing(&p);
        queues.push(q("orders.retry.1m", Some(3)));
        bindings.push(b("orders.retry", "orders.retry.1m", "1m"));
        assert_eq!(
            stale_objects(&p, &queues, &bindings),
            vec![
                not_in_topology(ObjectKind::Queue, "orders.retry.1m", Some(3)),
                not_in_topology(
                    ObjectKind::Binding,
                    "orders.retry -> orders.retry.1m [1m]",
                    None
                ),
            ]
        );
    }

    #[test]
    fn a_removed_redrive_policy_leaves_its_state_queue_listed() {
        let with = the_plan(&format!("{ORDERS}    dead_letter: {{ redrive: {{}} }}\n"));
        let (queues, bindings) = listing(&with);
        assert_eq!(stale_objects(&with, &queues, &bindings), vec![]);
        let without = the_plan(ORDERS);
        assert_eq!(
            stale_objects(&without, &queues, &bindings),
            vec![
                not_in_topology(ObjectKind::Queue, "orders.redrive-state", Some(0)),
                // The default exchange's bindings are not dlqctl's.
            ]
        );
    }

    #[test]
    fn a_renamed_dlq_leaves_the_old_one_and_its_dlx_binding_listed() {
        let yaml = ORDERS.replace(
            "max_attempts: 3 }\n",
            "max_attempts: 3 }\n    dead_letter: { queue: orders.failed }\n",
        );
        let p = the_plan(&yaml);
        let (mut queues, mut bindings) = listing(&p);
        queues.push(q("orders.dlq", None));
        bindings.push(b("orders.dlx", "orders.dlq", ""));
        let found = stale_objects(&p, &queues, &bindings);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.contains(&not_in_topology(ObjectKind::Queue, "orders.dlq", None)));
    }

    #[test]
    fn a_dropped_producer_binding_is_listed() {
        let p = the_plan(ORDERS);
        let (queues, mut bindings) = listing(&p);
        bindings.push(b("shop", "orders", "order.legacy"));
        assert_eq!(
            stale_objects(&p, &queues, &bindings),
            vec![not_in_topology(
                ObjectKind::Binding,
                "shop -> orders [order.legacy]",
                None
            )]
        );
    }

    #[test]
    fn a_binding_whose_arguments_differ_is_not_the_planned_one() {
        let p = the_plan(ORDERS);
        let (queues, mut bindings) = listing(&p);
        let mut extra = b("orders.retry", "orders.retry.1s", "1s");
        extra.arguments.insert("x-match".into(), "all".into());
        bindings.push(extra);
        assert_eq!(stale_objects(&p, &queues, &bindings).len(), 1);
    }

    #[test]
    fn other_teams_objects_are_left_out() {
        let p = the_plan(ORDERS);
        let (mut queues, mut bindings) = listing(&p);
        // Another file's pipeline, a queue merely starting with the
        // pipeline's name, and other consumers of the shared exchange.
        queues.push(q("payments.retry.1s", Some(1)));
        queues.push(q("payments.dlq", Some(1)));
        queues.push(q("orders-audit", Some(1)));
        queues.push(q("orders.retryx", Some(1)));
        bindings.push(b("shop", "audit", "#"));
        bindings.push(b("payments.retry", "payments.retry.1s", "1s"));
        assert_eq!(stale_objects(&p, &queues, &bindings), vec![]);
    }

    #[test]
    fn the_dlq_named_p_dlq_is_not_stale_when_the_plan_uses_it() {
        let p = the_plan(ORDERS);
        let (queues, bindings) = listing(&p);
        assert!(queues.iter().any(|x| x.name == "orders.dlq"));
        assert_eq!(stale_objects(&p, &queues, &bindings), vec![]);
    }

    #[test]
    fn args_match_compares_every_type_and_the_count() {
        let mut wanted = Arguments::new();
        wanted.insert("x-match".into(), ArgValue::Str("all".into()));
        wanted.insert("n".into(), ArgValue::Int(5));
        wanted.insert("b".into(), ArgValue::Bool(true));
        let api: serde_json::Map<_, _> = serde_json::json!({"x-match": "all", "n": 5, "b": true})
            .as_object()
            .cloned()
            .unwrap();
        assert!(args_match(&api, &wanted));
        let mut fewer = wanted.clone();
        fewer.remove("b");
        assert!(!args_match(&api, &fewer));
        let wrong: serde_json::Map<_, _> = serde_json::json!({"x-match": "any", "n": 5, "b": true})
            .as_object()
            .cloned()
            .unwrap();
        assert!(!args_match(&wrong, &wanted));
    }
}
