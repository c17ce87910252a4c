//! Unit tests of parsing, validation and the plan.

use super::*;
use crate::topology::plan::Role;

/// The topology `yaml` is (a test of `parse/` uses it too).
pub(super) fn ok(yaml: &str) -> Topology {
    match parse_topology(yaml, "t.yaml") {
        Ok(t) => t,
        Err(e) => panic!("expected a valid topology, got:\n{e}"),
    }
}

/// Every problem as "LINE:COL: message".
pub(super) fn errs(yaml: &str) -> Vec<String> {
    match parse_topology(yaml, "t.yaml") {
        Ok(t) => panic!("expected problems, got {t:?}"),
        Err(e) => e
            .problems
            .iter()
            .map(|p| format!("{}: {}", p.pos, p.message))
            .collect(),
    }
}

fn assert_one(yaml: &str, pos: &str, needle: &str) {
    let e = errs(yaml);
    assert_eq!(e.len(), 1, "expected exactly one problem, got {e:#?}");
    assert!(
        e[0].starts_with(&format!("{pos}: ")) && e[0].contains(needle),
        "expected `{pos}: ...{needle}...`, got {:?}",
        e[0]
    );
}

/// Asserts that `yaml` gives exactly the problems `want`, in order, each
/// message starting with its `line:column: text`.
fn assert_errs(yaml: &str, want: &[&str]) {
    let e = errs(yaml);
    assert_eq!(e.len(), want.len(), "{e:#?}");
    for (got, want) in e.iter().zip(want) {
        assert!(got.starts_with(want), "expected `{want}...` in {e:#?}");
    }
}

const MIN: &str = "version: 1\npipelines:\n  - name: orders\n";

#[test]
fn minimal_file_gets_every_default() {
    let t = ok(MIN);
    let p = &t.pipelines[0];
    assert_eq!(p.name, "orders");
    assert_eq!(p.queue_type, QueueType::Quorum);
    assert_eq!(p.retry.delays, vec![1_000, 10_000, 60_000]);
    assert_eq!(p.retry.max_attempts, 4);
    assert_eq!(p.retry.jitter, 0.1);
    assert_eq!(p.delivery_limit, Some(20));
    assert_eq!(p.dead_letter.queue, "orders.dlq");
    assert_eq!(p.dead_letter.ttl, None);
    assert_eq!(p.dead_letter.max_length, None);
    assert!(p.exchange.is_none());
    assert!(p.circuit_breaker.is_none());
}

#[test]
fn defaults_apply_key_by_key_and_pipelines_override() {
    let t = ok("version: 1
defaults:
  queue_type: classic
  retry: {delays: [5s], max_attempts: 3, jitter: 0.2}
  dead_letter: {ttl: 14d}
  arguments: {x-message-ttl: 1000, x-single-active-consumer: true}
pipelines:
  - name: a
  - name: b
    queue_type: quorum
    retry: {max_attempts: 9}
    dead_letter: {queue: b-failed, max_length: 10}
    arguments: {x-message-ttl: 2000}
");
    let a = &t.pipelines[0];
    assert_eq!(a.queue_type, QueueType::Classic);
    assert_eq!(a.retry.delays, vec![5_000]);
    assert_eq!(a.retry.max_attempts, 3);
    assert_eq!(a.delivery_limit, None);
    assert_eq!(a.dead_letter.ttl, Some(14 * 86_400_000));
    let b = &t.pipelines[1];
    assert_eq!(b.queue_type, QueueType::Quorum);
    assert_eq!(b.retry.delays, vec![5_000]);
    assert_eq!(b.retry.max_attempts, 9);
    assert_eq!(b.retry.jitter, 0.2);
    assert_eq!(b.delivery_limit, Some(20));
    assert_eq!(b.dead_letter.queue, "b-failed");
    assert_eq!(b.dead_letter.max_length, Some(10));
    assert_eq!(b.dead_letter.ttl, Some(14 * 86_400_000));
    assert_eq!(b.arguments.get("x-message-ttl"), Some(&ArgValue::Int(2000)));
    assert_eq!(
        b.arguments.get("x-single-active-consumer"),
        Some(&ArgValue::Bool(true))
    );
}

#[test]
fn a_pipeline_backoff_replaces_default_delays() {
    let t = ok("version: 1
defaults:
  retry: {delays: [1s]}
pipelines:
  - name: a
    retry: {backoff: {base: 1s, factor: 2, max: 10s}, max_attempts: 8}
");
    assert_eq!(
        t.pipelines[0].retry.delays,
        vec![1_000, 2_000, 4_000, 8_000, 10_000]
    );
    assert_eq!(t.pipelines[0].retry.tiers().len(), 5);
}

#[test]
fn backoff_tiers_follow_the_formula() {
    let t = ok("version: 1
pipelines:
  - name: a
    retry: {backoff: {base: 1s, factor: 2, max: 10m}, max_attempts: 8}
  - name: b
    retry: {backoff: {base: 100ms, factor: 1.5}, max_attempts: 4}
  - name: c
    retry: {backoff: {base: 1s, factor: 1}, max_attempts: 100}
  - name: d
    retry: {backoff: {base: 1s}, max_attempts: 1}
  - name: e
    retry: {backoff: {base: 1s, factor: 10, max: 1m}, max_attempts: 2000000000}
");
    let d = |i: usize| t.pipelines[i].retry.delays.clone();
    assert_eq!(
        d(0),
        vec![1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000]
    );
    assert_eq!(d(1), vec![100, 150, 225]);
    assert_eq!(d(2), vec![1_000]);
    assert_eq!(d(3), vec![1_000]);
    assert_eq!(d(4), vec![1_000, 10_000, 60_000]);
}

/// The examples: a floored delay that repeats does not end the
/// plan, and decimal factors are exact (1s × 2.3² is 5290ms).
#[test]
fn backoff_is_the_formula_exactly() {
    let t = ok("version: 1
pipelines:
  - name: a
    retry: {backoff: {base: 1ms, factor: 1.5}, max_attempts: 8}
  - name: b
    retry: {backoff: {base: 1s, factor: 2.3}, max_attempts: 6}
  - name: c
    retry: {backoff: {base: 3ms, factor: 1.1}, max_attempts: 12}
");
    let a = &t.pipelines[0].retry;
    assert_eq!(a.delays, vec![1, 1, 2, 3, 5, 7, 11]);
    assert_eq!(a.tiers(), vec![1, 2, 3, 5, 7, 11]);
    assert_eq!(
        t.pipelines[1].retry.delays,
        vec![1_000, 2_300, 5_290, 12_167, 27_984]
    );
    // 3 × 1.1^(k-1) with exact decimals: 3, 3.3, 3.63, 3.993, 4.3923, ...
    let exact: Vec<u64> = (0..11u32)
        .map(|k| (3u128 * 11u128.pow(k) / 10u128.pow(k)) as u64)
        .collect();
    assert_eq!(t.pipelines[2].retry.delays, exact);
}

#[test]
fn a_backoff_that_grows_too_slowly_for_its_attempts_is_an_error() {
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {backoff: {base: 1s, factor: 1.000001, max: 1d}, max_attempts: 2000000000}\n",
        "4:22",
        "keep growing past 1000000 retries",
    );
}

#[test]
fn backoff_without_max_that_overflows_is_an_error() {
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {backoff: {base: 1d, factor: 10}, max_attempts: 5}\n",
        "4:22",
        "the delay of retry 3 exceeds 4294967295ms; set `max`",
    );
}

#[test]
fn delays_and_backoff_together_is_an_error() {
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry:\n      delays: [1s]\n      backoff: {base: 1s}\n",
        "6:7",
        "either retry.delays or retry.backoff, not both",
    );
}

#[test]
fn unknown_keys_are_reported_everywhere_at_once() {
    assert_errs(
        "version: 1
defualts: {}
pipelines:
  - name: a
    retri: {}
    retry: {delay: [1s]}
    exchange: {name: x, type: topic, bindings: [k], kind: topic}
",
        &[
            "2:1: unknown key `defualts` in the topology",
            "5:5: unknown key `retri` in a pipeline",
            "6:13: unknown key `delay` in retry",
            "7:53: unknown key `kind` in exchange",
        ],
    );
}

#[test]
fn several_errors_in_several_pipelines_are_all_reported_in_order() {
    assert_errs(
        "version: 1
pipelines:
  - name: a
    retry: {delays: [], max_attempts: 0, jitter: 0.7}
  - name: b
    queue_type: classic
    delivery_limit: 5
    dead_letter: {max_length: 10, ttl: 0s}
",
        &[
            "4:21: retry.delays is empty",
            "4:39: retry.max_attempts must be between 1 and",
            "4:50: retry.jitter must be between 0 and 0.5",
            "7:21: delivery_limit applies to quorum queues only",
            "8:31: dead_letter.max_length on classic pipeline `b`",
            "8:40: dead_letter.ttl must be between 1ms and 4294967295ms",
        ],
    );
}

#[test]
fn errors_are_printed_as_file_line_column() {
    let e = parse_topology("version: 2\npipelines: []\n", "dir/top.yaml").unwrap_err();
    let text = e.to_string();
    assert_eq!(
        text,
        "dir/top.yaml:1:10: unsupported version: this dlqctl reads `version: 1`\n\
         dir/top.yaml:2:12: `pipelines` is empty: nothing to provision"
    );
}

#[test]
fn yaml_syntax_error_has_a_position() {
    let e = parse_topology("version: 1\npipelines:\n  - name: [a\n", "t.yaml").unwrap_err();
    assert_eq!(e.problems.len(), 1);
    assert!(e.problems[0].message.starts_with("invalid YAML"), "{e}");
    assert!(e.problems[0].pos.line >= 3, "{e}");
}

#[test]
fn empty_and_non_mapping_files_are_errors() {
    assert_one("", "1:1", "the file is empty");
    assert_one(
        "- a\n- b\n",
        "1:1",
        "the topology must be a mapping, not a list",
    );
    assert_one("version: 1\n", "1:1", "missing `pipelines:`");
    assert_one("pipelines:\n  - name: a\n", "1:1", "missing `version: 1`");
    assert_one(
        "version: 1\npipelines: {a: 1}\n",
        "2:12",
        "`pipelines` must be a list",
    );
}

#[test]
fn duplicate_pipeline_names() {
    assert_one(
        "version: 1\npipelines:\n  - name: a\n  - name: a\n",
        "4:11",
        "duplicate pipeline name `a` (first at line 3)",
    );
}

#[test]
fn duplicate_names_are_reported_even_when_defaults_are_invalid() {
    let e =
        errs("version: 1\ndefaults:\n  retry: {jitter: 2}\npipelines:\n  - name: a\n  - name: a\n");
    assert!(
        e.iter()
            .any(|m| m.starts_with("6:11: duplicate pipeline name `a`")),
        "{e:#?}"
    );
}

#[test]
fn generated_names_that_collide() {
    // b's DLQ is named like a's main queue.
    assert_one(
        "version: 1\npipelines:\n  - name: a\n  - name: b\n    dead_letter: {queue: a}\n",
        "4:11",
        "queue `a` (dead-letter queue of pipeline `b`) is also the main queue of pipeline `a`",
    );
    // A pipeline called `a.retry.1s` collides with a's first tier queue.
    assert_one(
        "version: 1\npipelines:\n  - name: a\n  - name: a.retry.1s\n",
        "4:11",
        "is also the retry queue 1s of pipeline `a`",
    );
    // A producers' exchange named like another pipeline's DLX.
    assert_one(
        "version: 1\npipelines:\n  - name: a\n  - name: b\n    exchange: {name: a.dlx, type: fanout}\n",
        "4:11",
        "exchange `a.dlx` (producers' exchange of pipeline `b`) is also the dead-letter exchange of pipeline `a`",
    );
}

#[test]
fn a_producer_exchange_may_be_shared_with_one_type_only() {
    let t = ok("version: 1
pipelines:
  - name: a
    exchange: {name: events, type: topic, bindings: [a.*]}
  - name: b
    exchange: {name: events, type: topic, bindings: [b.*]}
");
    let p = plan(&t);
    assert_eq!(p.exchanges.iter().filter(|e| e.name == "events").count(), 1);
    assert_eq!(p.exchanges[0].pipelines, vec!["a", "b"]);
    assert_one(
        "version: 1
pipelines:
  - name: a
    exchange: {name: events, type: topic, bindings: [a.*]}
  - name: b
    exchange: {name: events, type: direct, bindings: [b]}
",
        "5:11",
        "with type topic (here direct)",
    );
}

#[test]
fn names_over_255_bytes_or_reserved() {
    let long = "n".repeat(250);
    // The main queue fits, but `NAME.retry.10s` does not.
    let e = errs(&format!("version: 1\npipelines:\n  - name: {long}\n"));
    assert!(e.iter().all(|m| m.starts_with("3:11: ")), "{e:#?}");
    assert!(
        e.iter()
            .any(|m| m.contains("retry queue 10s name") && m.contains("at most 255 bytes")),
        "{e:#?}"
    );
    assert!(
        e.iter()
            .any(|m| m.contains("retry exchange name") && m.contains("256 bytes")),
        "{e:#?}"
    );
    // Control characters (issue 30: a NUL validated), in the pipeline's
    // name and so in every name made from it, and in an exchange's.
    for (name, code) in [
        ("a\\0b", "0000"),
        ("a\\tb", "0009"),
        ("a\\eb", "001B"),
        ("a\\x7fb", "007F"),
    ] {
        let e = errs(&format!("version: 1\npipelines:\n  - name: \"{name}\"\n"));
        assert!(
            !e.is_empty()
                && e.iter().all(|m| m.starts_with("3:11: ")
                    && m.contains(&format!("control character U+{code}"))),
            "{name}: {e:#?}"
        );
    }
    let e = errs(
        "version: 1\npipelines:\n  - name: a\n    exchange: {name: \"x\\ny\", type: topic, bindings: [k]}\n",
    );
    assert!(
        e.iter()
            .any(|m| m.contains("exchange name `x\\ny`") && m.contains("U+000A")),
        "{e:#?}"
    );
    assert_one(
        "version: 1\npipelines:\n  - name: amq.orders\n",
        "3:11",
        "queue name `amq.orders` starts with `amq.`, which RabbitMQ reserves",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    exchange: {name: amq.topic, type: topic, bindings: [k]}\n",
        "4:22",
        "exchange name `amq.topic` starts with `amq.`",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: ''\n",
        "3:11",
        "queue name must not be empty",
    );
}

#[test]
fn delay_bounds() {
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {delays: [0ms]}\n",
        "4:22",
        "a retry delay must be between 1ms and 4294967295ms",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {delays: [4294967296ms]}\n",
        "4:22",
        "not 4294967296ms",
    );
    ok("version: 1\npipelines:\n  - name: a\n    retry: {delays: [1ms, 4294967295ms]}\n");
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {delays: [1.5s]}\n",
        "4:22",
        "invalid duration \"1.5s\"",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {delays: [10]}\n",
        "4:22",
        "must be a duration such as 500ms",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    dead_letter: {ttl: 50d}\n",
        "4:24",
        "dead_letter.ttl must be between 1ms and 4294967295ms",
    );
}

#[test]
fn jitter_and_factor_bounds() {
    ok("version: 1\npipelines:\n  - name: a\n    retry: {jitter: 0}\n  - name: b\n    retry: {jitter: 0.5}\n");
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {jitter: -0.1}\n",
        "4:21",
        "retry.jitter must be between 0 and 0.5, not -0.1",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {backoff: {base: 1s, factor: 0.5}}\n",
        "4:41",
        "retry.backoff.factor must be at least 1, not 0.5",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {backoff: {factor: 2}}\n",
        "4:22",
        "retry.backoff needs `base`",
    );
}

#[test]
fn delivery_limit_bounds() {
    for (v, okay) in [
        ("0", false),
        ("1", true),
        ("2147483647", true),
        ("2147483648", false),
        ("-1", false),
    ] {
        let y = format!("version: 1\npipelines:\n  - name: a\n    delivery_limit: {v}\n");
        if okay {
            assert_eq!(ok(&y).pipelines[0].delivery_limit, Some(v.parse().unwrap()));
        } else {
            assert_one(
                &y,
                "4:21",
                "delivery_limit must be between 1 and 2147483647",
            );
        }
    }
}

#[test]
fn headers_binding_needs_arguments() {
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    exchange: {name: h, type: headers, bindings: [k]}\n",
        "4:51",
        "a binding of a headers exchange needs `arguments`",
    );
    let t = ok("version: 1
pipelines:
  - name: a
    exchange:
      name: h
      type: headers
      bindings: [{arguments: {x-match: all, type: order, v: 2, b: true}}]
");
    let b = &t.pipelines[0].exchange.as_ref().unwrap().bindings[0];
    assert_eq!(b.key, "");
    assert_eq!(
        b.arguments.get("x-match"),
        Some(&ArgValue::Str("all".into()))
    );
    assert_eq!(b.arguments.get("v"), Some(&ArgValue::Int(2)));
    assert_eq!(b.arguments.get("b"), Some(&ArgValue::Bool(true)));
}

#[test]
fn exchange_shape_errors() {
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    exchange: {name: x, type: match}\n",
        "4:31",
        "exchange.type must be direct, topic, fanout or headers, not `match`",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    exchange: {name: x, type: topic}\n",
        "4:15",
        "a topic exchange needs `bindings`",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    exchange: {type: topic, bindings: [k]}\n",
        "4:15",
        "exchange needs a `name`",
    );
    let t = ok("version: 1\npipelines:\n  - name: a\n    exchange: {name: x, type: fanout}\n");
    assert_eq!(
        t.pipelines[0].exchange.as_ref().unwrap().bindings[0].key,
        ""
    );
}

#[test]
fn arguments_allow_list_and_types() {
    ok("version: 1
pipelines:
  - name: q
    arguments: {x-message-ttl: 1, x-single-active-consumer: false, x-max-length: 5,
                x-max-length-bytes: 9, x-quorum-initial-group-size: 3, x-queue-leader-locator: balanced}
  - name: c
    queue_type: classic
    arguments: {x-max-priority: 10}
");
    let cases = [
        (
            "x-overflow: drop-head",
            "4:17",
            "set by dlqctl itself and cannot be overridden: an override such as drop-head",
        ),
        (
            "x-dead-letter-exchange: other",
            "4:17",
            "set by dlqctl itself",
        ),
        (
            "x-queue-mode: lazy",
            "4:17",
            "argument `x-queue-mode` is not supported",
        ),
        (
            "x-message-ttl: '1000'",
            "4:32",
            "argument `x-message-ttl` must be an integer, not a string",
        ),
        (
            "x-single-active-consumer: 1",
            "4:43",
            "must be a boolean, not an integer",
        ),
        (
            "x-max-priority: 5",
            "4:17",
            "applies to classic queues only; pipeline `q` is quorum",
        ),
        (
            "x-queue-leader-locator: 1",
            "4:41",
            "must be a string, not an integer",
        ),
    ];
    for (arg, pos, needle) in cases {
        assert_one(
            &format!("version: 1\npipelines:\n  - name: q\n    arguments: {{{arg}}}\n"),
            pos,
            needle,
        );
    }
    assert_one(
        "version: 1\npipelines:\n  - name: c\n    queue_type: classic\n    arguments: {x-max-length: 5}\n",
        "5:17",
        "applies to quorum queues only; pipeline `c` is classic",
    );
}

#[test]
fn wrong_types_are_named() {
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {max_attempts: many}\n",
        "4:27",
        "retry.max_attempts must be an integer, not a string",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: 5\n",
        "3:11",
        "pipeline name must be a string, not an integer",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    queue_type: stream\n",
        "4:17",
        "queue_type must be `quorum` or `classic`, not `stream`",
    );
    assert_one(
        "version: 1\npipelines:\n  - a\n",
        "3:5",
        "a pipeline must be a mapping, not a string",
    );
}

#[test]
fn circuit_breaker_defaults_and_bounds() {
    let t = ok("version: 1\npipelines:\n  - name: a\n    circuit_breaker: {failure_rate: 0.25}\n");
    let cb = t.pipelines[0].circuit_breaker.clone().unwrap();
    assert_eq!(cb.failure_rate, 0.25);
    assert_eq!(cb.window, 60_000);
    assert_eq!(cb.min_calls, 20);
    assert_eq!(cb.open_for, 30_000);
    assert_eq!(cb.half_open_calls, 1);
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    circuit_breaker: {failure_rate: 0}\n",
        "4:37",
        "failure_rate must be above 0",
    );
}

#[test]
fn circuit_breaker_half_open_calls_is_a_count_from_1() {
    let t = ok("version: 1\npipelines:\n  - name: a\n    circuit_breaker: {half_open_calls: 3}\n");
    let cb = t.pipelines[0].circuit_breaker.clone().unwrap();
    assert_eq!(cb.half_open_calls, 3);
    let t = ok(
        "version: 1\ndefaults:\n  circuit_breaker: {half_open_calls: 2}\npipelines:\n  - name: a\n",
    );
    assert_eq!(
        t.pipelines[0]
            .circuit_breaker
            .as_ref()
            .unwrap()
            .half_open_calls,
        2
    );
    for (bad, col, said) in [
        (
            "0",
            "4:40",
            "circuit_breaker.half_open_calls must be between 1 and 1000, not 0",
        ),
        ("1001", "4:40", "must be between 1 and 1000, not 1001"),
        ("-1", "4:40", "must be between 1 and 1000, not -1"),
        ("one", "4:40", "circuit_breaker.half_open_calls"),
        ("1.5", "4:40", "circuit_breaker.half_open_calls"),
    ] {
        assert_one(
            &format!("version: 1\npipelines:\n  - name: a\n    circuit_breaker: {{half_open_calls: {bad}}}\n"),
            col,
            said,
        );
    }
    // A misspelt key is named with the keys there are.
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    circuit_breaker: {half_open: 1}\n",
        "4:23",
        "half_open_calls",
    );
}

#[test]
fn dead_letter_queue_name_only_per_pipeline() {
    assert_one(
        "version: 1\ndefaults:\n  dead_letter: {queue: all.dlq}\npipelines:\n  - name: a\n",
        "3:17",
        "set it per pipeline, not in defaults",
    );
}

#[test]
fn each_pipeline_keeps_the_line_of_its_name() {
    let t = ok("version: 1
defaults:
  retry: {delays: [1s]}
pipelines:
  - name: orders
    exchange: {name: orders, type: topic, bindings: [a]}

  - retry: {delays: [2s]}
    name: mail
  -
    name: flow
  - {name: inline}
");
    let lines: Vec<_> = t
        .pipelines
        .iter()
        .map(|p| (p.name.as_str(), p.line))
        .collect();
    assert_eq!(
        lines,
        vec![("orders", 5), ("mail", 9), ("flow", 11), ("inline", 12)]
    );
}

#[test]
fn retry_tiers_are_distinct_and_sorted() {
    let t = ok(
        "version: 1\npipelines:\n  - name: a\n    retry: {delays: [10s, 1s, 10s, 90s, 1500ms]}\n",
    );
    let p = &t.pipelines[0];
    assert_eq!(p.retry.delays, vec![10_000, 1_000, 10_000, 90_000, 1_500]);
    assert_eq!(
        p.retry_queues(),
        vec!["a.retry.1s", "a.retry.1500ms", "a.retry.10s", "a.retry.90s"]
    );
}

fn quorum_orders() -> Topology {
    ok("version: 1
pipelines:
  - name: orders
    exchange: {name: orders, type: topic, bindings: [order.created, order.paid]}
    retry: {delays: [1s, 10s, 1m, 10m], max_attempts: 6}
    dead_letter: {queue: orders.dlq, max_length: 100000, ttl: 14d}
    delivery_limit: 7
    arguments: {x-max-length: 500}
")
}

#[test]
fn plan_of_a_quorum_pipeline_matches_the_design_table() {
    let p = plan(&quorum_orders());
    let ex: Vec<_> = p
        .exchanges
        .iter()
        .map(|e| (e.name.as_str(), e.kind.as_str(), e.role))
        .collect();
    assert_eq!(
        ex,
        vec![
            ("orders", "topic", Role::ProducerExchange),
            ("orders.retry", "direct", Role::RetryExchange),
            ("orders.dlx", "fanout", Role::DeadLetterExchange),
        ]
    );
    let q = |name: &str| {
        p.queues
            .iter()
            .find(|q| q.name == name)
            .unwrap()
            .arguments
            .clone()
    };
    let i = ArgValue::Int;
    let s = |v: &str| ArgValue::Str(v.into());
    let main: Vec<_> = q("orders").into_iter().collect();
    assert_eq!(
        main,
        vec![
            ("x-dead-letter-exchange".into(), s("orders.dlx")),
            ("x-dead-letter-strategy".into(), s("at-least-once")),
            ("x-delivery-limit".into(), i(7)),
            ("x-max-length".into(), i(500)),
            ("x-overflow".into(), s("reject-publish")),
            ("x-queue-type".into(), s("quorum")),
        ]
    );
    let tier: Vec<_> = q("orders.retry.10s").into_iter().collect();
    assert_eq!(
        tier,
        vec![
            ("x-dead-letter-exchange".into(), s("")),
            ("x-dead-letter-routing-key".into(), s("orders")),
            ("x-dead-letter-strategy".into(), s("at-least-once")),
            ("x-message-ttl".into(), i(10_000)),
            ("x-overflow".into(), s("reject-publish")),
            ("x-queue-type".into(), s("quorum")),
        ]
    );
    let dlq: Vec<_> = q("orders.dlq").into_iter().collect();
    assert_eq!(
        dlq,
        vec![
            ("x-delivery-limit".into(), i(2_147_483_647)),
            ("x-max-length".into(), i(100_000)),
            ("x-message-ttl".into(), i(1_209_600_000)),
            ("x-overflow".into(), s("reject-publish")),
            ("x-queue-type".into(), s("quorum")),
        ]
    );
    let names: Vec<_> = p.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "orders",
            "orders.retry.1s",
            "orders.retry.10s",
            "orders.retry.1m",
            "orders.retry.10m",
            "orders.dlq"
        ]
    );
    let b: Vec<_> = p
        .bindings
        .iter()
        .map(|b| {
            (
                b.exchange.as_str(),
                b.queue.as_str(),
                b.routing_key.as_str(),
            )
        })
        .collect();
    assert_eq!(
        b,
        vec![
            ("orders", "orders", "order.created"),
            ("orders", "orders", "order.paid"),
            ("orders.retry", "orders.retry.1s", "1s"),
            ("orders.retry", "orders.retry.10s", "10s"),
            ("orders.retry", "orders.retry.1m", "1m"),
            ("orders.retry", "orders.retry.10m", "10m"),
            ("orders.dlx", "orders.dlq", ""),
        ]
    );
}

#[test]
fn plan_of_a_classic_pipeline_has_no_quorum_arguments() {
    let t = ok("version: 1\npipelines:\n  - name: c\n    queue_type: classic\n    retry: {delays: [90s]}\n");
    let p = plan(&t);
    for q in &p.queues {
        assert_eq!(
            q.arguments.get("x-queue-type"),
            Some(&ArgValue::Str("classic".into()))
        );
        for k in ["x-delivery-limit", "x-dead-letter-strategy", "x-overflow"] {
            assert!(!q.arguments.contains_key(k), "{} has {k}", q.name);
        }
    }
    assert_eq!(p.queues[1].name, "c.retry.90s");
    assert_eq!(
        p.queues[1].arguments.get("x-message-ttl"),
        Some(&ArgValue::Int(90_000))
    );
    // No DLQ TTL unless asked for: failed messages are kept.
    assert!(!p.queues[2].arguments.contains_key("x-message-ttl"));
}

/// One bad key does not hide the errors of the others in the same
/// pipeline: a bad exchange type or a bad name, with a classic
/// `delivery_limit` and an unsupported argument, are all reported, each at
/// its own key.
#[test]
fn a_bad_exchange_or_name_does_not_hide_the_pipelines_other_errors() {
    let rest = "    queue_type: classic\n    delivery_limit: 5\n    arguments: {x-foo: 1}\n";
    let e = errs(&format!(
        "version: 1\npipelines:\n  - name: a\n{rest}    exchange: {{name: x, type: bogus, bindings: [k]}}\n"
    ));
    let at: Vec<&str> = e.iter().map(|p| p.split(": ").next().unwrap()).collect();
    assert_eq!(at, vec!["5:21", "6:17", "7:31"], "{e:#?}");
    assert!(e[2].contains("exchange.type"), "{e:#?}");
    assert_errs(
        &format!("version: 1\npipelines:\n  - name: [1]\n{rest}"),
        &[
            "3:11: pipeline name",
            "5:21: delivery_limit applies to quorum queues only",
            "6:17: argument `x-foo` is not supported",
        ],
    );
}

/// A whole number too large for any integer field says the allowed range,
/// not "must be an integer, not a number".
#[test]
fn huge_integers_say_the_range() {
    for (yaml, pos, range) in [
        (
            "version: 1\npipelines:\n  - name: a\n    retry: {max_attempts: 99999999999999999999999}\n",
            "4:27",
            "retry.max_attempts must be between 1 and",
        ),
        (
            "version: 1\npipelines:\n  - name: a\n    delivery_limit: 18446744073709551615\n",
            "4:21",
            "delivery_limit must be between 1 and 2147483647, not 18446744073709551615",
        ),
    ] {
        assert_one(yaml, pos, range);
    }
}

/// Values the broker would refuse are refused offline, at their key, so
/// that `provision` never reports them as drift.
#[test]
fn values_the_broker_refuses_are_refused_offline() {
    assert_errs(
        "version: 1
pipelines:
  - name: a
    arguments: {x-queue-leader-locator: bogus}
    exchange: {name: h, type: headers, bindings: [{arguments: {x-match: bogus, k: v}}, {arguments: {x-match: 1}}]}
",
        &[
            "4:41: argument `x-queue-leader-locator` must be one of",
            "5:73: x-match must be one of all, any, all-with-x, any-with-x, not `bogus`",
            "5:110: x-match must be one of all, any, all-with-x, any-with-x, not an integer",
        ],
    );
    for locator in ["client-local", "balanced", "least-leaders", "random"] {
        ok(&format!("version: 1\npipelines:\n  - name: a\n    arguments: {{x-queue-leader-locator: {locator}}}\n"));
    }
    for m in ["all", "any", "all-with-x", "any-with-x"] {
        ok(&format!("version: 1\npipelines:\n  - name: a\n    exchange: {{name: h, type: headers, bindings: [{{arguments: {{x-match: {m}, k: v}}}}]}}\n"));
    }
}

/// Within a binding and an argument too, one error does not hide another.
#[test]
fn binding_and_argument_errors_do_not_hide_each_other() {
    assert_errs(
        "version: 1
pipelines:
  - name: a
    arguments: {x-max-priority: bogus}
    exchange: {name: h, type: headers, bindings: [{key: [1], arguments: {x-match: bogus}}]}
",
        &[
            "4:17: argument `x-max-priority` applies to classic",
            "4:33: argument `x-max-priority` must be an integer",
            "5:57: binding key",
            "5:83: x-match must be one of",
        ],
    );
}

/// A factor with more decimals than the exact arithmetic keeps, and a max
/// below the base, are refused rather than silently changed.
#[test]
fn backoff_factor_precision_and_max_below_base_are_refused() {
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {backoff: {base: 1s, factor: 1.0000000001}}\n",
        "4:41",
        "more than 9 decimal places",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    retry: {backoff: {base: 1s, max: 500ms}}\n",
        "4:38",
        "retry.backoff.max (500ms) is below base (1s)",
    );
    ok("version: 1\npipelines:\n  - name: a\n    retry: {backoff: {base: 1s, factor: 1.123456789, max: 1s}}\n");
}

/// `null`, or an empty block (a key with nothing after it), is an error
/// with line and column for every optional block that a mapping or
/// `true` turns on: it says neither on nor off (`redrive`,
/// `circuit_breaker`, `idempotency`, in a pipeline or in `defaults`).
#[test]
fn a_null_or_empty_optional_block_is_an_error_with_its_position() {
    let cases = [
        (
            "pipelines:\n  - name: a\n    dead_letter:\n      redrive: null\n",
            "5:16",
            "dead_letter.redrive is empty",
        ),
        (
            "pipelines:\n  - name: a\n    dead_letter:\n      redrive:\n",
            "5:",
            "dead_letter.redrive is empty",
        ),
        (
            "defaults:\n  dead_letter:\n    redrive: ~\npipelines:\n  - name: a\n",
            "4:",
            "dead_letter.redrive is empty",
        ),
        (
            "pipelines:\n  - name: a\n    circuit_breaker: null\n",
            "4:",
            "circuit_breaker is empty",
        ),
        (
            "pipelines:\n  - name: a\n    circuit_breaker:\n",
            "4:",
            "circuit_breaker is empty",
        ),
        (
            "defaults:\n  circuit_breaker:\npipelines:\n  - name: a\n",
            "3:",
            "circuit_breaker is empty",
        ),
        (
            "pipelines:\n  - name: a\n    idempotency: null\n",
            "4:",
            "idempotency is empty",
        ),
        (
            "pipelines:\n  - name: a\n    idempotency:\n",
            "4:",
            "idempotency is empty",
        ),
        (
            "defaults:\n  idempotency:\npipelines:\n  - name: a\n",
            "3:",
            "idempotency is empty",
        ),
    ];
    for (body, pos, needle) in cases {
        let e = errs(&format!("version: 1\n{body}"));
        assert_eq!(e.len(), 1, "{body}: {e:#?}");
        assert!(
            e[0].starts_with(pos) && e[0].contains(needle),
            "{body}: {}",
            e[0]
        );
    }
}

/// `idempotency`: `true` and `{}` take the defaults; a pipeline's keys
/// apply over the defaults' ones, key by key; `false` turns off the
/// defaults' block; bad keys are errors at their position.
#[test]
fn idempotency_merges_key_by_key_over_the_defaults() {
    use crate::idempotency::{Idempotency, KeySource, StoreSpec, DEFAULT_KEEP_MS};
    let t = ok("version: 1\npipelines:\n  - name: a\n    idempotency: true\n  - name: b\n    idempotency: {}\n  - name: c\n");
    assert_eq!(t.pipelines[0].idempotency, Some(Idempotency::default()));
    assert_eq!(t.pipelines[1].idempotency, Some(Idempotency::default()));
    assert_eq!(t.pipelines[2].idempotency, None);
    assert_eq!(Idempotency::default().keep_ms, DEFAULT_KEEP_MS);
    let t = ok("version: 1\ndefaults:\n  idempotency: {store: 'env:STORE', keep: 1d}\npipelines:\n  - name: a\n    idempotency: {key: 'header:order-id'}\n  - name: b\n  - name: c\n    idempotency: false\n");
    let a = t.pipelines[0].idempotency.clone().unwrap();
    assert_eq!(a.key, KeySource::Header("order-id".into()));
    assert_eq!(a.store, StoreSpec::Env("STORE".into()));
    assert_eq!(a.keep_ms, 86_400_000);
    let b = t.pipelines[1].idempotency.clone().unwrap();
    assert_eq!(b.key, KeySource::MessageId);
    assert_eq!(b.store, StoreSpec::Env("STORE".into()));
    assert_eq!(t.pipelines[2].idempotency, None);
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    idempotency: {key: 'header:x-death'}\n",
        "4:24",
        "x-* or dlqctl-*",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    idempotency: {store: 'mysql://u:pw@h/x'}\n",
        "4:26",
        "mysql://u:***@h/x",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    idempotency: {keep: 0s}\n",
        "4:25",
        "idempotency.keep must be between 1ms",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    idempotency: {lease: 1m}\n",
        "4:19",
        "unknown key `lease` in idempotency",
    );
    // The circuit breaker takes `true` and `false` the same way.
    let t = ok("version: 1\ndefaults:\n  circuit_breaker: true\npipelines:\n  - name: a\n  - name: b\n    circuit_breaker: false\n");
    assert!(t.pipelines[0].circuit_breaker.is_some());
    assert!(t.pipelines[1].circuit_breaker.is_none());
}

/// A client's parser as the shell gives it: refuses what holds `bad`.
struct RefusesBad;

impl UrlCheck for RefusesBad {
    fn http(&self, url: &str) -> Result<(), String> {
        if url.contains("bad") {
            Err("the HTTP client refuses it".into())
        } else {
            Ok(())
        }
    }
    fn store(&self, url: &str) -> Result<(), String> {
        if url.contains("bad") {
            Err("the store client refuses it".into())
        } else {
            Ok(())
        }
    }
}

static REFUSES_BAD: RefusesBad = RefusesBad;

/// Every URL of the file goes through the shell's parsers, in `defaults`
/// and in pipelines, each refusal at the URL's line and column with the
/// URL redacted; without them (the core alone) only their form is read.
#[test]
fn urls_are_checked_by_the_clients_parsers_at_their_position() {
    let yaml = "version: 1
defaults:
  idempotency: {store: 'redis://:pw@bad:6379/0'}
pipelines:
  - name: a
    dead_letter:
      redrive:
        health: {http: 'http://bad/health'}
  - name: b
    idempotency:
      store: 'redis://good:6379/0'
    dead_letter:
      redrive:
        health: {http: 'http://good/health'}
  - name: c
    idempotency:
      store: 'rediss://bad:6379/1'
";
    assert!(parse_topology(yaml, "t.yaml").is_ok());
    let e = parse_topology_with(yaml, "t.yaml", &REFUSES_BAD).unwrap_err();
    let got: Vec<String> = e
        .problems
        .iter()
        .map(|p| format!("{}: {}", p.pos, p.message))
        .collect();
    assert_eq!(
        got,
        [
            "3:24: idempotency.store `redis://:***@bad:6379/0` cannot be used: the store client refuses it",
            "8:24: dead_letter.redrive.health.http `http://bad/health` cannot be used: the HTTP client refuses it",
            "17:14: idempotency.store `rediss://bad:6379/1` cannot be used: the store client refuses it",
        ]
    );
    assert!(
        e.to_string().starts_with("t.yaml:3:24: idempotency.store"),
        "{e}"
    );
    let good = yaml.replace("bad", "good");
    assert!(parse_topology_with(&good, "t.yaml", &REFUSES_BAD).is_ok());
}

/// A whole number written with a decimal point (`canary: 1.0`) is said
/// as such, for every integer setting: not "between 0 and 10000, not
/// about 1e0".
#[test]
fn an_integer_written_as_a_decimal_says_so() {
    let e = errs(
        "version: 1\npipelines:\n  - name: a\n    dead_letter:\n      redrive: {canary: 1.0}\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("dead_letter.redrive.canary must be a whole number: write 1, not 1.0"),
        "{e:?}"
    );
    let e = errs("version: 1\npipelines:\n  - name: a\n    retry: {max_attempts: 3.0}\n");
    assert!(e[0].contains("write 3, not 3.0"), "{e:?}");
    // Too large to be an integer: the range, with the number as written.
    let e = errs(
        "version: 1\npipelines:\n  - name: a\n    dead_letter:\n      redrive: {canary: 1e30}\n",
    );
    assert!(
        e[0].contains("must be between 0 and 10000, not 1e30"),
        "{e:?}"
    );
    assert!(!e[0].contains("about"), "{e:?}");
}

/// A default `keep` follows the pipeline's `dead_letter.ttl` (the longer
/// of it and 7 days), so that the documented defaults do not make
/// `doctor` warn; an explicit `keep` is kept as written.
#[test]
fn a_default_keep_follows_the_dead_letter_ttl() {
    use crate::idempotency::DEFAULT_KEEP_MS;
    const DAY: u64 = 86_400_000;
    let t = ok("version: 1\ndefaults:\n  dead_letter: {ttl: 14d}\npipelines:\n  - name: a\n    idempotency: {}\n  - name: b\n    dead_letter: {ttl: 30d}\n    idempotency: true\n  - name: c\n    dead_letter: {ttl: 1d}\n    idempotency: {}\n  - name: d\n    idempotency: {keep: 2d}\n");
    let keep = |i: usize| t.pipelines[i].idempotency.as_ref().unwrap().keep_ms;
    assert_eq!(keep(0), 14 * DAY);
    assert_eq!(keep(1), 30 * DAY);
    // Never shorter than 7 days: a producer's retry days later is still
    // a duplicate.
    assert_eq!(keep(2), DEFAULT_KEEP_MS);
    assert_eq!(keep(3), 2 * DAY);
    // Without a retention (kept forever): 7 days.
    let t = ok("version: 1\npipelines:\n  - name: a\n    idempotency: {}\n");
    assert_eq!(
        t.pipelines[0].idempotency.as_ref().unwrap().keep_ms,
        DEFAULT_KEEP_MS
    );
    // `defaults`' keep wins over the ttl too.
    let t = ok("version: 1\ndefaults:\n  idempotency: {keep: 3d}\npipelines:\n  - name: a\n    dead_letter: {ttl: 14d}\n");
    assert_eq!(
        t.pipelines[0].idempotency.as_ref().unwrap().keep_ms,
        3 * DAY
    );
}

/// `idempotency.on_conflict`: what a key marked handled with another body
/// does; `dead_letter` by default, merged key by key like the others, an
/// unknown value an error at its position.
#[test]
fn on_conflict_is_read_and_checked() {
    use crate::idempotency::OnConflict;
    let t = ok("version: 1\ndefaults:\n  idempotency: {on_conflict: skip}\npipelines:\n  - name: a\n  - name: b\n    idempotency: {on_conflict: run}\n  - name: c\n    idempotency: {on_conflict: dead_letter}\n");
    let of = |i: usize| t.pipelines[i].idempotency.as_ref().unwrap().on_conflict;
    assert_eq!(of(0), OnConflict::Skip);
    assert_eq!(of(1), OnConflict::Run);
    assert_eq!(of(2), OnConflict::DeadLetter);
    let t = ok("version: 1\npipelines:\n  - name: a\n    idempotency: {}\n");
    assert_eq!(
        t.pipelines[0].idempotency.as_ref().unwrap().on_conflict,
        OnConflict::DeadLetter
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    idempotency: {on_conflict: retry}\n",
        "4:32",
        "idempotency.on_conflict must be run, dead_letter or skip, not `retry`",
    );
    assert_one(
        "version: 1\npipelines:\n  - name: a\n    idempotency:\n      on_conflict: 3\n",
        "5:20",
        "idempotency.on_conflict must be a string",
    );
}
