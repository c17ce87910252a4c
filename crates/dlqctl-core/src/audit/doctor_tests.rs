use super::*;
use crate::audit::permissions::UserPermissions;
use crate::audit::policy::AppliedPolicies;
use crate::audit::{consumer_timeout::DEFAULT_CONSUMER_TIMEOUT_MS, doctor_broker::major_minor};
use crate::topology::plan::pipeline_plan;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

const DAY: u64 = 86_400_000;

fn plan_of(extra: &str) -> Plan {
    let yaml = format!(
        "version: 1\npipelines:\n  - name: orders\n    retry: {{delays: [1s, 10s]}}\n{extra}"
    );
    let t = crate::topology::parse_topology(&yaml, "t.yaml").expect("a topology");
    pipeline_plan(&t.pipelines[0])
}

fn plan() -> Plan {
    plan_of("")
}

fn no_policies() -> AppliedPolicies {
    AppliedPolicies::default()
}

/// A healthy broker for `plan`: every object, no policy, a consumer, all
/// members, nothing held, the user may do everything.
fn healthy(plan: &Plan) -> Snapshot {
    let queues = plan
        .queues
        .iter()
        .map(|q| {
            (
                q.name.clone(),
                Some(QueueFacts {
                    ready: 0,
                    consumers: u64::from(q.role == Role::MainQueue),
                    messages: Some(0),
                    kind: Some("quorum".into()),
                    policies: Some(no_policies()),
                    messages_dlx: vec![0, 0],
                    members: Some((3, 3)),
                }),
            )
        })
        .collect();
    Snapshot {
        version: Some("3.10.8".into()),
        management: ManagementState::Answers,
        user: "guest".into(),
        permissions: Ok(UserPermissions {
            configure: ".*".into(),
            write: ".*".into(),
            read: ".*".into(),
        }),
        missing_exchanges: vec![],
        queues,
        dlx_bound: [("orders".to_string(), Some(true))].into(),
        sample_gap_s: 5,
        handler_timeout: [(
            "orders".to_string(),
            HandlerTimeout {
                ms: 30_000,
                source: "--handler-timeout".into(),
            },
        )]
        .into(),
        max_dlq: None,
        handler_timeout_error: None,
        circuit: HashMap::new(),
        policies_from_queue_view: None,
        redrive: HashMap::new(),
        now_ms: NOW_MS,
        idempotency: HashMap::new(),
        consumer_hosts: HashMap::new(),
    }
}

/// The snapshot's clock.
const NOW_MS: u64 = 1_767_225_600_000;

#[test]
fn the_redrive_item_says_the_last_run_and_warns_while_it_moves_nothing() {
    use crate::dlq::redrive::RunResult;
    use crate::dlq::redrive_state::{RedriveState, RunRecord};
    let p = plan();
    let mut s = healthy(&p);
    let item = |s: &Snapshot| {
        checklist(&p, s, None)
            .into_iter()
            .find(|c| c.subject == "redrive")
            .map(|c| (c.level, c.message))
    };
    // No policy, no item.
    assert_eq!(item(&s), None);
    s.redrive.insert("orders".into(), Ok(None));
    assert_eq!(item(&s), Some((Level::Pass, "no run yet".into())));
    s.redrive
        .insert("orders".into(), Err("ACCESS_REFUSED".into()));
    assert_eq!(item(&s).map(|i| i.0), Some(Level::Skip));
    let run = |result, at_ms, moved, waiting| RunRecord {
        result,
        at_ms,
        moved,
        waiting_for_person: waiting,
        canary: None,
        why: None,
        by: "w".into(),
    };
    let mut state = RedriveState::fresh(60_000, NOW_MS - 600_000);
    for k in 0..3 {
        let at = NOW_MS - 300_000 + k * 120_000;
        state = state.after(60_000, run(RunResult::Unhealthy, at, 0, None), at);
    }
    s.redrive.insert("orders".into(), Ok(Some(state.clone())));
    let (level, text) = item(&s).unwrap();
    assert_eq!(level, Level::Warn);
    assert!(
        text.starts_with("last run unhealthy 1m ago (3 in a row, 0 moved)"),
        "{text}"
    );
    let moved = state.after(60_000, run(RunResult::Moved, NOW_MS, 29, Some(0)), NOW_MS);
    s.redrive.insert("orders".into(), Ok(Some(moved)));
    let (level, text) = item(&s).unwrap();
    assert_eq!(level, Level::Pass, "{text}");
    assert!(text.contains("(1 in a row, 29 moved)"), "{text}");
    let waiting = state.after(60_000, run(RunResult::Moved, NOW_MS, 2, Some(4)), NOW_MS);
    s.redrive.insert("orders".into(), Ok(Some(waiting)));
    let (level, text) = item(&s).unwrap();
    assert_eq!(level, Level::Warn);
    assert!(
        text.contains("4 messages past max_redrives wait for a person"),
        "{text}"
    );
}

fn with(level: Level, checks: &[Check]) -> Vec<(Area, String, String)> {
    checks
        .iter()
        .filter(|c| c.level == level)
        .map(|c| (c.area, c.subject.clone(), c.message.clone()))
        .collect()
}

fn facts<'a>(s: &'a mut Snapshot, q: &str) -> &'a mut QueueFacts {
    s.queue_mut(q).expect("a planned queue that exists")
}

fn def(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

/// A policy named `name` that applies, with the `effective` definition.
fn policy(name: &str, effective: Value) -> Option<AppliedPolicies> {
    Some(AppliedPolicies {
        policy: Some(name.into()),
        effective: def(effective),
        ..AppliedPolicies::default()
    })
}

#[test]
fn a_healthy_pipeline_passes_every_item() {
    let p = plan();
    let c = checklist(&p, &healthy(&p), None);
    assert_eq!(worst(&c), Level::Pass, "{c:#?}");
    let areas: Vec<Area> = c.iter().map(|c| c.area).collect();
    for a in [
        Area::Broker,
        Area::Objects,
        Area::Policies,
        Area::Limits,
        Area::Health,
        Area::Permissions,
    ] {
        assert!(areas.contains(&a), "no {a:?} item in {c:#?}");
    }
    // The broker's items first, with no pipeline.
    assert_eq!(c[0].pipeline, None);
    assert!(
        c[0].message.contains("no default delivery-limit"),
        "{}",
        c[0].message
    );
    assert!(c[2..]
        .iter()
        .all(|i| i.pipeline.as_deref() == Some("orders")));
    assert_eq!(
        c.iter().filter(|i| i.area == Area::Permissions).count(),
        crate::audit::permissions::COMMANDS.len()
    );
}

#[test]
fn an_operator_policy_cutting_the_dlq_ttl_fails_naming_it() {
    let p = plan();
    let mut s = healthy(&p);
    facts(&mut s, "orders.dlq").policies = Some(AppliedPolicies {
        operator_policy: Some("cap".into()),
        effective: def(json!({"message-ttl": 1000})),
        ..AppliedPolicies::default()
    });
    let c = checklist(&p, &s, None);
    assert_eq!(worst(&c), Level::Fail);
    let fails = with(Level::Fail, &c);
    assert_eq!(fails.len(), 1, "{fails:#?}");
    let (area, subject, message) = &fails[0];
    assert_eq!(*area, Area::Policies);
    assert_eq!(subject, "queue orders.dlq");
    assert!(
        message.starts_with("operator policy `cap` overrides message-ttl: effective 1000"),
        "{message}"
    );
    assert!(message.contains("remove the key"), "{message}");
    // The retention that follows is under 7 days: a warning besides.
    let warns = with(Level::Warn, &c);
    assert_eq!(
        warns,
        vec![(
            Area::Limits,
            "retention of orders.dlq".into(),
            "1s (under 7 days): an incident found after a weekend may have lost its evidence; \
             raise `dead_letter.ttl`"
                .into()
        )]
    );
}

#[test]
fn a_drop_head_policy_on_quorum_queues_fails_and_says_dead_lettering_is_at_most_once() {
    let p = plan();
    let mut s = healthy(&p);
    for q in ["orders", "orders.retry.1s"] {
        facts(&mut s, q).policies = policy("dh", json!({"overflow": "drop-head"}));
    }
    let c = checklist(&p, &s, None);
    let fails = with(Level::Fail, &c);
    let subjects: Vec<&str> = fails.iter().map(|f| f.1.as_str()).collect();
    assert_eq!(subjects, vec!["queue orders", "queue orders.retry.1s"]);
    for f in &fails {
        assert!(f.2.starts_with("policy `dh` overrides overflow"), "{}", f.2);
        assert!(f.2.contains("at-most-once"), "{}", f.2);
    }
    // The untouched queues: one pass line.
    assert!(c.iter().any(|i| i.area == Area::Policies
        && i.level == Level::Pass
        && i.message == "no policy or operator policy applies to 2 queues"));
}

#[test]
fn a_note_on_how_policies_were_worked_out_is_a_warning() {
    let p = plan();
    let mut s = healthy(&p);
    facts(&mut s, "orders").policies = Some(AppliedPolicies {
        notes: vec!["policies `a`, `b` match it with the same priority".into()],
        ..AppliedPolicies::default()
    });
    let c = checklist(&p, &s, None);
    assert_eq!(worst(&c), Level::Warn);
    assert_eq!(
        with(Level::Warn, &c),
        vec![(
            Area::Policies,
            "queue orders".into(),
            "policies `a`, `b` match it with the same priority".into()
        )]
    );
}

#[test]
fn a_dlq_policy_that_dead_letters_back_into_the_pipeline_fails_with_its_path() {
    let p = plan();
    let mut s = healthy(&p);
    facts(&mut s, "orders.dlq").policies = policy(
        "loop",
        json!({"dead-letter-exchange": "", "dead-letter-routing-key": "orders"}),
    );
    let c = checklist(&p, &s, None);
    let cycle: Vec<_> = with(Level::Fail, &c)
        .into_iter()
        .filter(|f| f.1 == "dead-letter cycle of orders.dlq")
        .collect();
    assert_eq!(cycle.len(), 1, "{c:#?}");
    let m = &cycle[0].2;
    assert!(m.starts_with("policy `loop` dead-letters it back"), "{m}");
    assert!(
        m.contains("orders.dlq → exchange \"\" [orders] → queue orders"),
        "{m}"
    );
    // Without the policy: no such item.
    let s = healthy(&p);
    assert!(!checklist(&p, &s, None)
        .iter()
        .any(|i| i.subject.starts_with("dead-letter cycle")));
}

#[test]
fn policies_read_from_the_queues_are_one_broker_warning() {
    let p = plan();
    let mut s = healthy(&p);
    s.policies_from_queue_view = Some("possibly a few seconds old".into());
    let c = checklist(&p, &s, None);
    let warns: Vec<&Check> = c.iter().filter(|i| i.level == Level::Warn).collect();
    assert_eq!(warns.len(), 1, "{c:#?}");
    assert_eq!(warns[0].pipeline, None);
    assert_eq!(warns[0].subject, "policies");
    assert_eq!(warns[0].message, "possibly a few seconds old");
}

#[test]
fn a_key_that_changes_nothing_passes_and_names_the_policy() {
    let p = plan();
    let mut s = healthy(&p);
    facts(&mut s, "orders").policies = policy("ll", json!({"queue-leader-locator": "balanced"}));
    let c = checklist(&p, &s, None);
    assert_eq!(worst(&c), Level::Pass);
    assert!(c.iter().any(|i| i.area == Area::Policies
        && i.subject == "queue orders"
        && i.message
            .starts_with("policy `ll` sets queue-leader-locator")));
}

#[test]
fn a_short_dlq_retention_and_a_main_queue_without_consumers_warn() {
    let p = plan_of("    dead_letter: {ttl: 1d}\n");
    let mut s = healthy(&p);
    facts(&mut s, "orders").consumers = 0;
    let c = checklist(&p, &s, None);
    assert_eq!(worst(&c), Level::Warn);
    let warns: Vec<String> = with(Level::Warn, &c).into_iter().map(|w| w.1).collect();
    assert_eq!(warns, vec!["retention of orders.dlq", "queue orders"]);
    // Seven days exactly is enough; no TTL at all keeps everything.
    let p = plan_of("    dead_letter: {ttl: 7d}\n");
    assert_eq!(worst(&checklist(&p, &healthy(&p), None)), Level::Pass);
    let mut s = healthy(&p);
    // A policy that lowers a long retention counts too.
    facts(&mut s, "orders.dlq").policies = policy("short", json!({"message-ttl": 2 * DAY}));
    let c = checklist(&p, &s, None);
    assert!(c
        .iter()
        .any(|i| i.level == Level::Warn && i.message.starts_with("2d (under 7 days)")));
}

#[test]
fn missing_objects_fail_and_name_provision() {
    let p = plan();
    let mut s = healthy(&p);
    s.queues.insert("orders.retry.10s".into(), None);
    s.missing_exchanges = vec!["orders.dlx".into(), "not.ours".into()];
    let fails = with(Level::Fail, &checklist(&p, &s, None));
    assert_eq!(
        fails,
        vec![
            (
                Area::Objects,
                "exchange orders.dlx".into(),
                "does not exist: run `dlqctl provision`".into()
            ),
            (
                Area::Objects,
                "queue orders.retry.10s".into(),
                "does not exist: run `dlqctl provision`".into()
            ),
        ]
    );
}

#[test]
fn without_the_management_api_its_items_are_skipped_not_passed() {
    let p = plan();
    let mut s = healthy(&p);
    s.management = ManagementState::Unreachable("connection refused".into());
    s.version = None;
    s.permissions = Err(PermissionsUnknown::NoManagement);
    for f in s.queues.values_mut().flatten() {
        f.policies = None;
        f.messages_dlx = vec![];
        f.members = None;
        f.kind = None;
        f.messages = None;
    }
    s.dlx_bound.clear();
    let c = checklist(&p, &s, None);
    assert_eq!(worst(&c), Level::Warn, "{c:#?}");
    assert_eq!(
        with(Level::Warn, &c).len(),
        1,
        "only the API's own line warns"
    );
    let skipped: Vec<Area> = with(Level::Skip, &c).into_iter().map(|s| s.0).collect();
    assert_eq!(
        skipped,
        vec![Area::Broker, Area::Policies, Area::Permissions],
        "{c:#?}"
    );
    assert!(!c.iter().any(|i| i.subject == "messages_dlx"));
    // Another broker's API is a fail.
    s.management = ManagementState::OtherBroker("belongs to cluster `x`".into());
    assert_eq!(worst(&checklist(&p, &s, None)), Level::Fail);
}

#[test]
fn messages_held_for_the_dlx_over_two_samples_fail_and_say_why() {
    let p = plan_of("    dead_letter: {max_length: 10}\n");
    let mut s = healthy(&p);
    // Once only: drained since, a pass.
    facts(&mut s, "orders").messages_dlx = vec![4, 0];
    assert_eq!(worst(&checklist(&p, &s, None)), Level::Pass);
    // Held over both samples with room in the DLQ: the worker is stalled.
    facts(&mut s, "orders").messages_dlx = vec![4, 5];
    let fails = with(Level::Fail, &checklist(&p, &s, None));
    assert_eq!(fails.len(), 1);
    assert!(
        fails[0].2.starts_with("holds 5 messages for its DLX"),
        "{}",
        fails[0].2
    );
    assert!(fails[0].2.contains("looks stalled"), "{}", fails[0].2);
    // The DLQ is full.
    facts(&mut s, "orders.dlq").messages = Some(10);
    let fails = with(Level::Fail, &checklist(&p, &s, None));
    assert!(
        fails[0].2.contains("the DLQ is full (10 messages"),
        "{}",
        fails[0].2
    );
    // The DLX is not bound: that is a fail of its own, and the reason.
    facts(&mut s, "orders.dlq").messages = Some(0);
    s.dlx_bound.insert("orders".into(), Some(false));
    let fails = with(Level::Fail, &checklist(&p, &s, None));
    assert_eq!(fails.len(), 2, "{fails:#?}");
    assert_eq!(fails[0].1, "binding orders.dlx -> orders.dlq");
    assert!(fails[1].2.contains("routes to no queue"), "{}", fails[1].2);
    // One sample only: nothing can be said.
    facts(&mut s, "orders").messages_dlx = vec![5];
    s.dlx_bound.insert("orders".into(), Some(true));
    assert_eq!(worst(&checklist(&p, &s, None)), Level::Pass);
}

#[test]
fn quorum_members_offline_warn_and_without_a_majority_fail() {
    let p = plan();
    let mut s = healthy(&p);
    facts(&mut s, "orders").members = Some((2, 3));
    let c = checklist(&p, &s, None);
    assert_eq!(
        with(Level::Warn, &c),
        vec![(
            Area::Health,
            "queue orders".into(),
            "2 of 3 quorum members online; bring the missing nodes back".into()
        )]
    );
    facts(&mut s, "orders").members = Some((1, 3));
    let fails = with(Level::Fail, &checklist(&p, &s, None));
    assert!(fails[0].2.contains("no majority"), "{fails:?}");
    facts(&mut s, "orders").members = Some((2, 4));
    assert_eq!(
        worst(&checklist(&p, &s, None)),
        Level::Fail,
        "2 of 4 is no majority"
    );
}

#[test]
fn the_handler_timeout_must_stay_under_the_consumer_timeout() {
    let p = plan();
    let mut s = healthy(&p);
    let set = |s: &mut Snapshot, ms: u64| {
        s.handler_timeout.insert(
            "orders".into(),
            HandlerTimeout {
                ms,
                source: "http://w:9090/metrics".into(),
            },
        );
    };
    set(&mut s, DEFAULT_CONSUMER_TIMEOUT_MS);
    let fails = with(Level::Fail, &checklist(&p, &s, None));
    assert_eq!(fails.len(), 1);
    assert!(
        fails[0]
            .2
            .starts_with("30m (http://w:9090/metrics) is not under 30m, the broker's default"),
        "{}",
        fails[0].2
    );
    // 3.x closes the channel.
    assert!(fails[0].2.contains("closes the channel"), "{fails:?}");
    set(&mut s, DEFAULT_CONSUMER_TIMEOUT_MS - 1);
    assert_eq!(worst(&checklist(&p, &s, None)), Level::Pass);
    // 3.10 has no per-queue consumer timeout: a policy key is not one.
    facts(&mut s, "orders").policies = policy("ct", json!({"consumer-timeout": 60_000}));
    assert_eq!(worst(&checklist(&p, &s, None)), Level::Pass);
    // From 3.11.15 a policy's consumer-timeout replaces the default; 4.3
    // cancels the consumer.
    s.version = Some("4.3.6".into());
    facts(&mut s, "orders").kind = Some("quorum".into());
    let fails = with(Level::Fail, &checklist(&p, &s, None));
    assert!(
        fails[0].2.contains("the `consumer-timeout` of policy `ct`")
            && fails[0].2.contains("cancels the consumer")
            && !fails[0].2.contains("closes the channel"),
        "{fails:?}"
    );
    // A classic queue on 4.3 has none.
    facts(&mut s, "orders").kind = Some("classic".into());
    assert_eq!(worst(&checklist(&p, &s, None)), Level::Pass);
    facts(&mut s, "orders").kind = Some("quorum".into());
    // Unknown: a skip that says how to give it.
    s.handler_timeout.clear();
    let c = checklist(&p, &s, None);
    assert!(c.iter().any(|i| i.level == Level::Skip
        && i.subject == "handler timeout"
        && i.message.contains("--metrics-url")));
}

#[test]
fn a_dlq_over_max_dlq_fails() {
    let p = plan();
    let mut s = healthy(&p);
    s.max_dlq = Some(5);
    facts(&mut s, "orders.dlq").ready = 5;
    assert_eq!(worst(&checklist(&p, &s, None)), Level::Pass);
    facts(&mut s, "orders.dlq").messages = Some(6);
    let fails = with(Level::Fail, &checklist(&p, &s, None));
    assert_eq!(
        fails[0].2,
        "holds 6 messages, over --max-dlq 5: triage with `dlqctl dlq summary`"
    );
    // One message is one message, not "1 messages".
    s.max_dlq = Some(0);
    facts(&mut s, "orders.dlq").messages = Some(1);
    facts(&mut s, "orders.dlq").ready = 1;
    let fails = with(Level::Fail, &checklist(&p, &s, None));
    assert_eq!(
        fails[0].2,
        "holds 1 message, over --max-dlq 0: triage with `dlqctl dlq summary`"
    );
}

#[test]
fn missing_permissions_warn_naming_what_is_lacking() {
    let p = plan();
    let mut s = healthy(&p);
    s.permissions = Ok(UserPermissions {
        configure: "^$".into(),
        write: "^orders\\.(retry|dlx)$".into(),
        read: "^orders$".into(),
    });
    let c = checklist(&p, &s, None);
    let warns = with(Level::Warn, &c);
    let commands: Vec<&str> = warns.iter().map(|w| w.1.as_str()).collect();
    assert_eq!(
        commands,
        vec![
            "dlqctl provision",
            "dlqctl provision --check",
            "dlqctl dlq peek, summary, export, purge",
            "dlqctl dlq replay"
        ]
    );
    assert!(
        warns[1]
            .2
            .starts_with("user guest may not run it: lacks configure on `orders.retry`"),
        "{}",
        warns[1].2
    );
    assert!(warns[1].2.contains(" and 3 more"), "{}", warns[1].2);
}

#[test]
fn the_version_decides_what_is_said_of_the_counters() {
    let p = plan();
    let mut s = healthy(&p);
    let line = |s: &Snapshot| checklist(&p, s, None)[0].clone();
    s.version = Some("4.3.6+dfsg".into());
    assert!(line(&s).message.contains("failed deliveries only"));
    assert!(checklist(&p, &s, None)
        .iter()
        .any(|c| c.subject == "message size" && c.message.contains("16 MiB")));
    s.version = Some("4.1.0".into());
    assert!(line(&s).message.contains("default delivery-limit 20"));
    s.version = Some("3.9.29".into());
    assert_eq!(line(&s).level, Level::Fail);
    s.version = Some("nightly".into());
    assert_eq!(line(&s).level, Level::Warn);
    assert_eq!(major_minor("3.10.8"), Some((3, 10)));
    assert_eq!(major_minor("4"), None);
}

#[test]
fn only_the_named_pipeline_is_checked() {
    let yaml = "version: 1\npipelines:\n  - name: a\n  - name: b\n";
    let t = crate::topology::parse_topology(yaml, "t.yaml").expect("a topology");
    let p = crate::topology::plan(&t);
    let mut s = healthy(&p);
    s.handler_timeout.clear();
    let names = |only| -> Vec<Option<String>> {
        let mut v: Vec<_> = checklist(&p, &s, only)
            .into_iter()
            .map(|c| c.pipeline)
            .collect();
        v.dedup();
        v
    };
    assert_eq!(names(None), vec![None, Some("a".into()), Some("b".into())]);
    assert_eq!(names(Some("b")), vec![None, Some("b".into())]);
}

#[test]
fn the_handler_timeout_is_read_from_the_workers_metrics() {
    let text = "# HELP dlqctl_handler_timeout_seconds The handler timeout.\n\
                # TYPE dlqctl_handler_timeout_seconds gauge\n\
                dlqctl_handler_timeout_seconds{queue=\"other\"} 5.0\n\
                dlqctl_handler_timeout_seconds{queue=\"orders\"} 2.5\n\
                dlqctl_handler_timeout_seconds_total{queue=\"orders\"} 9\n";
    assert_eq!(handler_timeout_from_metrics(text, "orders"), Some(2500));
    assert_eq!(handler_timeout_from_metrics(text, "other"), Some(5000));
    assert_eq!(handler_timeout_from_metrics(text, "none"), None);
    assert_eq!(
        handler_timeout_from_metrics("dlqctl_handler_timeout_seconds{queue=\"a\"} NaN", "a"),
        None
    );
    assert_eq!(
        handler_timeout_from_metrics("dlqctl_handler_timeout_seconds{queue=\"a\"} -1", "a"),
        None
    );
    assert_eq!(handler_timeout_from_metrics("", "a"), None);
    // A name with a quote is escaped as OpenMetrics escapes it.
    assert_eq!(
        handler_timeout_from_metrics("dlqctl_handler_timeout_seconds{queue=\"a\\\"b\"} 1", "a\"b"),
        Some(1000)
    );
}

#[test]
fn an_open_or_half_open_circuit_breaker_warns_naming_since_when() {
    use crate::audit::circuit::circuit_from_metrics;
    let p = plan();
    let page = "dlqctl_circuit_state{queue=\"orders\"} 1\n\
                dlqctl_circuit_state_since_timestamp_seconds{queue=\"orders\"} 1765098600\n";
    let now = 1_765_098_660_000;
    let mut s = healthy(&p);
    // Without a metrics page, nothing is said of the breaker.
    assert!(checklist(&p, &s, None)
        .iter()
        .all(|c| c.subject != "circuit breaker"));
    s.circuit.insert(
        "orders".into(),
        circuit_from_metrics(page, "orders", now).unwrap(),
    );
    let checks = checklist(&p, &s, None);
    assert_eq!(worst(&checks), Level::Warn);
    let warned = with(Level::Warn, &checks);
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert_eq!(warned[0].0, Area::Health);
    assert_eq!(warned[0].1, "circuit breaker");
    assert!(
        warned[0]
            .2
            .starts_with("the circuit breaker is open since 2025-12-07T09:10:00.000Z (for 1m)"),
        "{}",
        warned[0].2
    );
    // Half-open warns too.
    let page = page.replace("} 1\n", "} 2\n");
    s.circuit.insert(
        "orders".into(),
        circuit_from_metrics(&page, "orders", now).unwrap(),
    );
    let warned = with(Level::Warn, &checklist(&p, &s, None));
    assert!(warned[0].2.contains("is half-open since"), "{warned:#?}");
    // Closed passes, saying since when.
    let page = page.replace("} 2\n", "} 0\n");
    s.circuit.insert(
        "orders".into(),
        circuit_from_metrics(&page, "orders", now).unwrap(),
    );
    let checks = checklist(&p, &s, None);
    assert_eq!(worst(&checks), Level::Pass);
    assert!(with(Level::Pass, &checks).contains(&(
        Area::Health,
        "circuit breaker".into(),
        "closed since 2025-12-07T09:10:00.000Z (for 1m)".into()
    )));
}

#[test]
fn a_breaker_whose_health_url_cannot_be_used_fails_as_a_configuration_error() {
    use crate::audit::circuit::circuit_from_metrics;
    let p = plan();
    let page = "dlqctl_circuit_state{queue=\"orders\"} 0\n\
                dlqctl_circuit_probe_unusable{queue=\"orders\"} 1\n";
    let mut s = healthy(&p);
    s.circuit.insert(
        "orders".into(),
        circuit_from_metrics(page, "orders", 0).unwrap(),
    );
    let checks = checklist(&p, &s, None);
    assert_eq!(worst(&checks), Level::Fail);
    let failed = with(Level::Fail, &checks);
    assert_eq!(failed[0].1, "circuit breaker");
    assert!(failed[0].2.contains("configuration error"), "{failed:#?}");
}

#[test]
fn a_pipeline_with_idempotency_gets_its_store_keep_and_hosts_items() {
    use crate::audit::idempotency::{IdempotencyFacts, StoreReading};
    use crate::idempotency::Idempotency;
    let plan = plan_of("    dead_letter: {ttl: 14d}\n");
    let mut s = healthy(&plan);
    // Without `idempotency`: no item of its area.
    let items = checklist(&plan, &s, None);
    assert!(items.iter().all(|c| c.area != Area::Idempotency));

    s.idempotency.insert(
        "orders".into(),
        IdempotencyFacts {
            block: Idempotency {
                keep_ms: DAY,
                ..Idempotency::default()
            },
            store: "sqlite:/var/lib/dlqctl/orders.db".into(),
            sqlite: true,
            reading: StoreReading::Answers,
        },
    );
    s.consumer_hosts
        .insert("orders".into(), vec!["10.0.0.1".into(), "10.0.0.2".into()]);
    let items: Vec<(Level, String)> = checklist(&plan, &s, None)
        .into_iter()
        .filter(|c| c.area == Area::Idempotency)
        .map(|c| {
            assert_eq!(c.pipeline.as_deref(), Some("orders"));
            (c.level, format!("{}: {}", c.subject, c.message))
        })
        .collect();
    assert_eq!(items.len(), 3, "{items:#?}");
    assert_eq!(items[0].0, Level::Pass);
    assert!(items[0]
        .1
        .starts_with("idempotency store: sqlite:/var/lib/dlqctl/orders.db answers"));
    assert_eq!(items[1].0, Level::Warn);
    assert!(items[1].1.starts_with(
        "idempotency keep: keep 1d is shorter than dead_letter.ttl 14d of orders.dlq"
    ));
    assert_eq!(items[2].0, Level::Warn);
    assert!(items[2].1.contains("come from 2 hosts"));

    // A refused store fails the run; no retention, one host: no other item.
    let plan = plan_of("");
    let mut s = healthy(&plan);
    s.idempotency.insert(
        "orders".into(),
        IdempotencyFacts {
            block: Idempotency::default(),
            store: "redis://:***@cache:6379/0".into(),
            sqlite: false,
            reading: StoreReading::Failed(
                "idempotency store redis://:***@cache:6379/0 refused: WRONGPASS".into(),
            ),
        },
    );
    s.consumer_hosts
        .insert("orders".into(), vec!["10.0.0.1".into()]);
    let checks = checklist(&plan, &s, None);
    let items: Vec<&Check> = checks
        .iter()
        .filter(|c| c.area == Area::Idempotency)
        .collect();
    assert_eq!(items.len(), 1, "{items:#?}");
    assert_eq!(items[0].level, Level::Fail);
    assert_eq!(worst(&checks), Level::Fail);
    assert_eq!(Area::Idempotency.as_str(), "idempotency");
}
