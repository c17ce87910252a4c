//! Tests of the policy resolution from definitions.

use super::*;
use serde_json::json;

fn def(name: &str, pattern: &str, apply_to: &str, priority: f64, d: Value) -> PolicyDefinition {
    PolicyDefinition {
        name: name.into(),
        pattern: pattern.into(),
        apply_to: apply_to.into(),
        priority,
        definition: d.as_object().cloned().unwrap_or_default(),
    }
}

fn set(p: Vec<PolicyDefinition>, o: Vec<PolicyDefinition>) -> PolicySet {
    PolicySet::new(p, o, Some("4.3.6"))
}

fn names(e: &Effective) -> (Option<&str>, Option<&str>) {
    (e.policy.as_deref(), e.operator_policy.as_deref())
}

#[test]
fn no_policy_means_nothing_applies() {
    let e = effective_policy("orders", "quorum", &set(vec![], vec![]));
    assert_eq!(e, Effective::default());
    assert!(set(vec![], vec![]).is_empty());
}

#[test]
fn a_pattern_is_searched_not_anchored_on_the_bytes_of_the_name() {
    let cases: &[(&str, &str, bool)] = &[
        ("orders", "orders", true),
        ("orders", "orders.dlq", true),
        ("^orders$", "orders.dlq", false),
        ("^orders$", "orders", true),
        ("\\.dlq$", "orders.dlq", true),
        ("\\.dlq$", "orders.dlq.x", false),
        (".dlq", "ordersXdlq", true),
        ("", "anything", true),
        (".*", "", true),
        ("^it-[0-9a-f]+-", "it-3fa-orders", true),
        ("^it-[0-9a-f]+-", "xit-3fa-orders", false),
        ("Orders", "orders", false),
        ("(?i)orders", "ORDERS", true),
        ("é", "caf\u{e9}", true),
    ];
    for (pattern, queue, want) in cases {
        let s = set(vec![def("p", pattern, "all", 0.0, json!({"a": 1}))], vec![]);
        let got = effective_policy(queue, "classic", &s).policy.is_some();
        assert_eq!(got, *want, "pattern {pattern:?} on {queue:?}");
    }
}

#[test]
fn apply_to_is_followed_per_queue_type() {
    let types = ["classic", "quorum", "stream"];
    let cases: &[(&str, [bool; 3])] = &[
        ("all", [true, true, true]),
        ("queues", [true, true, true]),
        ("exchanges", [false, false, false]),
        ("classic_queues", [true, false, false]),
        ("quorum_queues", [false, true, false]),
        ("streams", [false, false, true]),
        ("nonsense", [false, false, false]),
    ];
    for (apply_to, want) in cases {
        for (t, w) in types.iter().zip(want) {
            // `max-length-bytes`: a key all three types support.
            let s = set(
                vec![def("p", "q", apply_to, 0.0, json!({"max-length-bytes": 5}))],
                vec![],
            );
            let got = effective_policy("q", t, &s).policy.is_some();
            assert_eq!(got, *w, "apply-to {apply_to} on a {t} queue");
        }
    }
}

#[test]
fn a_policy_with_a_key_the_type_does_not_support_is_skipped_whole() {
    let s = set(
        vec![
            def(
                "ha",
                "q",
                "all",
                10.0,
                json!({"ha-mode": "all", "message-ttl": 5}),
            ),
            def("low", "q", "all", 1.0, json!({"message-ttl": 9})),
        ],
        vec![],
    );
    // Classic queues support ha-mode: the higher one applies.
    assert_eq!(
        effective_policy("q", "classic", &s).policy.as_deref(),
        Some("ha")
    );
    // Quorum queues do not: the lower one applies instead.
    let e = effective_policy("q", "quorum", &s);
    assert_eq!(e.policy.as_deref(), Some("low"));
    assert_eq!(
        e.definition,
        json!({"message-ttl": 9}).as_object().cloned().unwrap()
    );
    // Streams support neither message-ttl.
    assert_eq!(effective_policy("q", "stream", &s).policy, None);
    // Operator policies follow the same rule.
    let o = set(
        vec![],
        vec![def("cap", "q", "all", 0.0, json!({"delivery-limit": 3}))],
    );
    assert_eq!(effective_policy("q", "classic", &o).operator_policy, None);
    assert_eq!(
        effective_policy("q", "quorum", &o)
            .operator_policy
            .as_deref(),
        Some("cap")
    );
}

#[test]
fn unsupported_keys_follow_the_broker_version() {
    let sac =
        |t: &str, v: Option<(u32, u32)>| unsupported_keys(t, v).contains(&"single-active-consumer");
    assert!(sac("quorum", Some((3, 10))));
    assert!(sac("quorum", Some((4, 1))));
    assert!(!sac("quorum", Some((4, 2))));
    assert!(!sac("quorum", None), "unknown: the newest rules");
    assert!(!sac("classic", Some((3, 10))));
    let qll = |v| unsupported_keys("classic", v).contains(&"queue-leader-locator");
    assert!(qll(Some((3, 13))));
    assert!(!qll(Some((4, 0))));
    let mem = |v| unsupported_keys("classic", v).contains(&"max-in-memory-length");
    assert!(!mem(Some((3, 10))));
    assert!(mem(Some((3, 13))));
    assert!(unsupported_keys("stream", None).contains(&"message-ttl"));
    assert!(unsupported_keys("weird", None).is_empty());
    // Through a set: the same policy applies to a quorum queue on 4.3,
    // not on 3.10.
    let p = vec![def(
        "sac",
        "q",
        "all",
        0.0,
        json!({"single-active-consumer": true}),
    )];
    let on = |v| PolicySet::new(p.clone(), vec![], Some(v));
    assert!(effective_policy("q", "quorum", &on("4.3.6"))
        .policy
        .is_some());
    assert!(effective_policy("q", "quorum", &on("3.10.8"))
        .policy
        .is_none());
    assert_eq!(major_minor("3.10.8"), Some((3, 10)));
    assert_eq!(major_minor("4.3.6+1-g123"), Some((4, 3)));
    assert_eq!(major_minor("4"), Some((4, 0)));
    assert_eq!(major_minor("x"), None);
}

#[test]
fn the_highest_priority_wins_whatever_the_order() {
    let a = def("a", "q", "all", 1.0, json!({"message-ttl": 1}));
    let b = def("b", "q", "all", 5.0, json!({"message-ttl": 5}));
    let c = def("c", "nomatch", "all", 9.0, json!({"message-ttl": 9}));
    let neg = def("neg", "q", "all", -3.0, json!({"message-ttl": 3}));
    for order in [
        vec![a.clone(), b.clone(), c.clone(), neg.clone()],
        vec![neg.clone(), c.clone(), b.clone(), a.clone()],
    ] {
        let e = effective_policy("q", "classic", &set(order, vec![]));
        assert_eq!(names(&e), (Some("b"), None));
        assert!(e.warnings.is_empty());
    }
    let e = effective_policy("q", "classic", &set(vec![neg], vec![]));
    assert_eq!(names(&e), (Some("neg"), None));
    // Fractional priorities compare as numbers.
    let x = def("x", "q", "all", 1.5, json!({}));
    let e = effective_policy("q", "classic", &set(vec![a, x], vec![]));
    assert_eq!(names(&e), (Some("x"), None));
}

#[test]
fn a_tie_of_priorities_is_a_warning_naming_both() {
    let a = def("b-second", "q", "all", 2.0, json!({"message-ttl": 1}));
    let b = def("a-first", "^q", "all", 2.0, json!({"message-ttl": 5}));
    let low = def("low", "q", "all", 1.0, json!({}));
    let s = set(vec![a.clone(), b.clone(), low.clone()], vec![]);
    let e = effective_policy("q", "classic", &s);
    // Taken: the first by name (the broker's pick is undefined).
    assert_eq!(names(&e), (Some("a-first"), None));
    assert_eq!(e.warnings.len(), 1);
    let w = &e.warnings[0];
    assert!(w.contains("`a-first`, `b-second`"), "{w}");
    assert!(w.contains("undefined"), "{w}");
    assert!(w.starts_with("policies "), "{w}");
    // Between a tie and a lower one: no tie.
    let e = effective_policy("q", "classic", &set(vec![a.clone(), low.clone()], vec![]));
    assert!(e.warnings.is_empty());
    // Operator policies tie apart.
    let s = set(vec![], vec![a.clone(), b.clone()]);
    let e = effective_policy("q", "classic", &s);
    assert!(
        e.warnings[0].starts_with("operator policies "),
        "{}",
        e.warnings[0]
    );
    // The queue's view breaks the tie (the broker's actual pick).
    let s = set(vec![a, b, low], vec![]);
    let reported = AppliedPolicies {
        policy: Some("b-second".into()),
        effective: json!({"message-ttl": 1}).as_object().cloned().unwrap(),
        ..AppliedPolicies::default()
    };
    let r = resolve_against("q", "classic", &s, Some(&reported));
    assert_eq!(r.policy.as_deref(), Some("b-second"));
    assert_eq!(r.effective, reported.effective);
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    assert!(
        r.notes[0].contains("taken here: `b-second`"),
        "{:?}",
        r.notes
    );
}

#[test]
fn an_operator_policy_lowers_the_limits_and_keeps_the_rest() {
    let p = def(
        "plain",
        "q",
        "all",
        0.0,
        json!({
            "message-ttl": 5000, "max-length": 10, "expires": 100, "delivery-limit": 2,
            "max-length-bytes": 1, "max-in-memory-length": 7, "max-in-memory-bytes": 70,
            "overflow": "reject-publish", "dead-letter-exchange": "x"
        }),
    );
    let o = def(
        "op",
        ".*",
        "queues",
        0.0,
        json!({
            "message-ttl": 1000, "max-length": 50, "expires": 50, "delivery-limit": 5,
            "max-length-bytes": 0, "max-in-memory-length": 7, "max-in-memory-bytes": 8
        }),
    );
    let e = effective_policy("q", "quorum", &set(vec![p], vec![o]));
    assert_eq!(names(&e), (Some("plain"), Some("op")));
    assert_eq!(
        Value::Object(e.definition.clone()),
        json!({
            "message-ttl": 1000, "max-length": 10, "expires": 50, "delivery-limit": 2,
            "max-length-bytes": 0, "max-in-memory-length": 7, "max-in-memory-bytes": 8,
            "overflow": "reject-publish", "dead-letter-exchange": "x"
        })
    );
    assert_eq!(e.policy_definition.as_ref().unwrap()["message-ttl"], 5000);
    assert_eq!(e.operator_definition.as_ref().unwrap()["message-ttl"], 1000);
}

#[test]
fn merge_takes_each_side_alone_and_the_operator_for_other_keys() {
    let m = |v: Value| v.as_object().cloned().unwrap();
    assert_eq!(merge(None, None), Map::new());
    assert_eq!(merge(Some(&m(json!({"a": 1}))), None), m(json!({"a": 1})));
    assert_eq!(
        merge(None, Some(&m(json!({"expires": 1})))),
        m(json!({"expires": 1}))
    );
    // Booleans (and anything else both set): the operator policy's.
    assert_eq!(
        merge(Some(&m(json!({"b": true}))), Some(&m(json!({"b": false})))),
        m(json!({"b": false}))
    );
    // A limit that is not a number on one side: the operator policy's.
    assert_eq!(
        merge(
            Some(&m(json!({"max-length": "x"}))),
            Some(&m(json!({"max-length": 4})))
        ),
        m(json!({"max-length": 4}))
    );
    // Equal: either (the same value).
    assert_eq!(
        merge(
            Some(&m(json!({"max-length": 4}))),
            Some(&m(json!({"max-length": 4})))
        ),
        m(json!({"max-length": 4}))
    );
}

#[test]
fn the_definitions_win_over_a_stale_queue_view_and_the_difference_is_said() {
    let s = set(
        vec![def(
            "dh",
            "^orders$",
            "all",
            0.0,
            json!({"overflow": "drop-head"}),
        )],
        vec![def(
            "cap",
            "\\.dlq$",
            "all",
            0.0,
            json!({"message-ttl": 1000}),
        )],
    );
    // The queue's statistics have not caught up: they report nothing.
    let stale = AppliedPolicies::default();
    let r = resolve_against("orders", "quorum", &s, Some(&stale));
    assert_eq!(r.policy.as_deref(), Some("dh"));
    assert_eq!(r.effective["overflow"], "drop-head");
    assert_eq!(r.notes.len(), 1);
    let n = &r.notes[0];
    assert!(
        n.contains("give policy `dh` and operator policy none"),
        "{n}"
    );
    assert!(
        n.contains("report policy none and operator policy none"),
        "{n}"
    );
    assert!(n.contains("possibly a few seconds old"), "{n}");
    let r = resolve_against("orders.dlq", "quorum", &s, None);
    assert_eq!(r.operator_policy.as_deref(), Some("cap"));
    assert_eq!(
        r.operator_definition,
        Some(json!({"message-ttl": 1000}).as_object().cloned().unwrap())
    );
    assert!(r.notes.is_empty(), "nothing reported: nothing to compare");
    // Both views agree: no note.
    let agreeing = AppliedPolicies {
        operator_policy: Some("cap".into()),
        effective: json!({"message-ttl": 1000}).as_object().cloned().unwrap(),
        ..AppliedPolicies::default()
    };
    assert!(resolve_against("orders.dlq", "quorum", &s, Some(&agreeing))
        .notes
        .is_empty());
    // Same names, other values (a definition changed): a note.
    let changed = AppliedPolicies {
        effective: json!({"message-ttl": 9}).as_object().cloned().unwrap(),
        ..agreeing
    };
    assert_eq!(
        resolve_against("orders.dlq", "quorum", &s, Some(&changed))
            .notes
            .len(),
        1
    );
    // A policy deleted since: the view still names it.
    let gone = AppliedPolicies {
        policy: Some("old".into()),
        effective: json!({"max-length": 1}).as_object().cloned().unwrap(),
        ..AppliedPolicies::default()
    };
    let r = resolve_against("other", "classic", &s, Some(&gone));
    assert_eq!(r.policy, None);
    assert!(r.effective.is_empty());
    assert!(r.notes[0].contains("report policy `old`"), "{:?}", r.notes);
}

#[test]
// The test's own stopwatch: the rule refuses the clock to the core's code.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn a_pattern_whose_automaton_would_be_huge_cannot_be_evaluated_and_does_not_blow_up() {
    // `.*a.{20}` needs about 2^20 states as a full DFA.
    let started = std::time::Instant::now();
    let s = set(
        vec![def(
            "huge",
            ".*a.{20}",
            "all",
            5.0,
            json!({"message-ttl": 1}),
        )],
        vec![],
    );
    let e = effective_policy("q", "classic", &s);
    assert_eq!(e.undecided, vec!["huge".to_string()]);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn a_pattern_that_cannot_be_evaluated_keeps_the_queue_view() {
    // A look-ahead: PCRE has it, this matcher does not.
    let s = set(
        vec![
            def("look", "^(?!x)q", "all", 5.0, json!({"message-ttl": 1})),
            def("plain", "q", "all", 1.0, json!({"message-ttl": 2})),
        ],
        vec![],
    );
    let e = effective_policy("q", "classic", &s);
    assert_eq!(e.undecided, vec!["look".to_string()]);
    let reported = AppliedPolicies {
        policy: Some("look".into()),
        effective: json!({"message-ttl": 1}).as_object().cloned().unwrap(),
        ..AppliedPolicies::default()
    };
    let r = resolve_against("q", "classic", &s, Some(&reported));
    assert_eq!(r.policy.as_deref(), Some("look"));
    assert!(r.notes[0].contains("cannot be evaluated"), "{:?}", r.notes);
    // Without a queue view: the evaluable result, and a note.
    let r = resolve_against("q", "classic", &s, None);
    assert_eq!(r.policy.as_deref(), Some("plain"));
    assert!(r.notes[0].contains("may apply instead"), "{:?}", r.notes);
    // Lower than the winner: it could not win, nothing undecided.
    let s = set(
        vec![
            def("look", "^(?!x)q", "all", 0.0, json!({})),
            def("plain", "q", "all", 1.0, json!({})),
        ],
        vec![],
    );
    assert!(effective_policy("q", "classic", &s).undecided.is_empty());
}

#[test]
fn the_queue_view_fallback_is_marked_possibly_old() {
    let n = queue_view_note("HTTP 403 Forbidden");
    assert!(n.starts_with(QUEUE_VIEW_NOTE));
    assert!(n.contains("possibly a few seconds old"));
    assert!(n.ends_with("(HTTP 403 Forbidden)"));
}
