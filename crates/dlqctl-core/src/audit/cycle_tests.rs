//! Tests of the dead-letter cycle check.

use super::*;
use crate::topology::plan::pipeline_plan;
use serde_json::json;

fn plan_of(extra: &str) -> Plan {
    let yaml = format!(
        "version: 1\npipelines:\n  - name: orders\n    retry: {{delays: [1s, 10s]}}\n\
         {extra}"
    );
    let t = crate::topology::parse_topology(&yaml, "t.yaml").expect("a topology");
    pipeline_plan(&t.pipelines[0])
}

fn dlq(plan: &Plan) -> &QueueSpec {
    plan.queues
        .iter()
        .find(|q| q.role == Role::DeadLetterQueue)
        .unwrap()
}

fn policy(v: Value) -> AppliedPolicies {
    AppliedPolicies {
        policy: Some("loop".into()),
        effective: v.as_object().cloned().unwrap(),
        ..AppliedPolicies::default()
    }
}

fn cycle(plan: &Plan, v: Value) -> Option<Cycle> {
    dead_letter_cycle(plan, dlq(plan), Some(&policy(v)))
}

#[test]
fn no_dead_letter_exchange_no_cycle() {
    let p = plan_of("");
    assert_eq!(dead_letter_cycle(&p, dlq(&p), None), None);
    assert_eq!(cycle(&p, json!({"message-ttl": 1000})), None);
    // A routing key alone does nothing.
    assert_eq!(
        cycle(&p, json!({"dead-letter-routing-key": "orders"})),
        None
    );
}

#[test]
fn the_default_exchange_with_the_main_queues_name_goes_back_to_it() {
    let p = plan_of("");
    let c = cycle(
        &p,
        json!({"dead-letter-exchange": "", "dead-letter-routing-key": "orders", "message-ttl": 1000}),
    )
    .expect("a cycle");
    assert_eq!(c.source, "policy `loop`");
    assert_eq!(c.into, "orders");
    assert!(!c.self_loop);
    assert_eq!(c.path, "orders.dlq → exchange \"\" [orders] → queue orders");
    assert_eq!(c.when, "when its messages expire (after 1s)");
    let m = c.message();
    assert!(m.starts_with("policy `loop` dead-letters it back into its own pipeline when its messages expire (after 1s): orders.dlq"), "{m}");
    assert!(m.contains("cycle rule"), "{m}");
    assert!(m.contains("remove dead-letter-exchange"), "{m}");
    // Without a routing key: the worker's dead letters carry the main
    // queue's name.
    let c = cycle(&p, json!({"dead-letter-exchange": ""})).expect("a cycle");
    assert_eq!(c.into, "orders");
    assert!(c.path.contains("no dead-letter-routing-key"), "{}", c.path);
    // No TTL anywhere (this DLQ keeps its messages): any dead-lettering.
    assert!(
        c.when.starts_with("when a message is dead-lettered"),
        "{}",
        c.when
    );
    // The DLQ's own argument TTL is the trigger when it has one.
    let with_ttl = plan_of("    dead_letter: {ttl: 14d}\n");
    let c = cycle(&with_ttl, json!({"dead-letter-exchange": ""})).expect("a cycle");
    assert_eq!(c.when, "when its messages expire (after 14d)");
    // A name outside the pipeline: no cycle here.
    assert_eq!(
        cycle(
            &p,
            json!({"dead-letter-exchange": "", "dead-letter-routing-key": "elsewhere"})
        ),
        None
    );
}

#[test]
fn the_dlx_sends_them_to_the_dlq_itself_and_drops_every_one() {
    let p = plan_of("");
    let c = cycle(&p, json!({"dead-letter-exchange": "orders.dlx"})).expect("a cycle");
    assert_eq!(c.into, "orders.dlq");
    assert!(c.self_loop);
    assert!(c
        .message()
        .contains("each such message is dropped silently"));
    // The DLQ by name through the default exchange: the same.
    let c = cycle(
        &p,
        json!({"dead-letter-exchange": "", "dead-letter-routing-key": "orders.dlq"}),
    )
    .expect("a cycle");
    assert!(c.self_loop);
}

#[test]
fn the_retry_exchange_routes_a_tier_name_into_the_tier_and_back() {
    let p = plan_of("");
    let x = p
        .exchanges
        .iter()
        .find(|e| e.role == Role::RetryExchange)
        .unwrap()
        .name
        .clone();
    let c = cycle(
        &p,
        json!({"dead-letter-exchange": x, "dead-letter-routing-key": "10s"}),
    )
    .expect("a cycle");
    assert_eq!(c.into, "orders.retry.10s");
    assert!(
        c.path
            .ends_with("→ queue orders.retry.10s → after its TTL → queue orders"),
        "{}",
        c.path
    );
    // The main queue's name is no tier's key: unroutable, not a cycle.
    assert_eq!(cycle(&p, json!({"dead-letter-exchange": x})), None);
}

#[test]
fn the_producers_exchange_routes_by_its_bindings() {
    let topic = plan_of("    exchange: {name: orders-in, type: topic, bindings: [\"order.#\"]}\n");
    let c = cycle(
        &topic,
        json!({"dead-letter-exchange": "orders-in", "dead-letter-routing-key": "order.created"}),
    )
    .expect("a cycle");
    assert_eq!(c.into, "orders");
    // The main queue's name does not match `order.#`.
    assert_eq!(
        cycle(&topic, json!({"dead-letter-exchange": "orders-in"})),
        None
    );
    let fanout = plan_of("    exchange: {name: orders-in, type: fanout}\n");
    assert!(cycle(&fanout, json!({"dead-letter-exchange": "orders-in"})).is_some());
    let direct = plan_of("    exchange: {name: orders-in, type: direct, bindings: [orders]}\n");
    assert!(cycle(&direct, json!({"dead-letter-exchange": "orders-in"})).is_some());
    let headers = plan_of(
        "    exchange: {name: orders-in, type: headers, bindings: [{arguments: {k: v}}]}\n",
    );
    let c = cycle(&headers, json!({"dead-letter-exchange": "orders-in"})).expect("a cycle");
    assert!(c.path.contains("possibly queue orders"), "{}", c.path);
    // An exchange of no pipeline of the plan: not known here.
    assert_eq!(
        cycle(&topic, json!({"dead-letter-exchange": "amq.fanout"})),
        None
    );
}

#[test]
fn an_argument_wins_over_the_policy_and_is_named() {
    let mut p = plan_of("");
    let i = p
        .queues
        .iter()
        .position(|q| q.role == Role::DeadLetterQueue)
        .unwrap();
    p.queues[i].arguments.insert(
        "x-dead-letter-exchange".into(),
        ArgValue::Str("orders.dlx".into()),
    );
    let c = cycle(&p, json!({"dead-letter-exchange": ""})).expect("a cycle");
    assert_eq!(c.source, "its argument x-dead-letter-exchange");
    assert!(c.self_loop);
    let c = dead_letter_cycle(&p, dlq(&p), None).expect("a cycle");
    assert_eq!(c.into, "orders.dlq");
}

#[test]
fn topic_patterns_match_as_the_broker_does() {
    let cases = [
        ("order.#", "order.created", true),
        ("order.#", "order", true),
        ("order.#", "orders", false),
        ("order.*", "order.created", true),
        ("order.*", "order.created.x", false),
        ("order.*", "order", false),
        ("#", "", true),
        ("#", "a.b.c", true),
        ("*", "", false),
        ("", "", true),
        ("", "a", false),
        ("a.#.c", "a.c", true),
        ("a.#.c", "a.b.b.c", true),
        ("a.#.c", "a.b.b.d", false),
        ("orders", "orders", true),
    ];
    for (p, k, want) in cases {
        assert_eq!(topic_matches(p, k), want, "{p:?} {k:?}");
    }
}
