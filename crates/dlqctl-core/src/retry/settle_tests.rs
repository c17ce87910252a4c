//! Unit tests of [`super::settle`]: one per row of docs/worker.md's table
//! ("Attempts and decisions"), then the dead-letter modes, the ways a
//! publish can end, and the rows the worker adds (attempts spent on
//! arrival, a copy too large, a lost connection, shutdown). No broker.

use super::fit::{properties_size, retry_budget};
use super::headers::*;
use super::settle::*;
use super::*;
use crate::handling::outcome::Outcome;
use crate::topology::{parse_topology, Pipeline, RetryPolicy};
use crate::values::duration::tier_name;
use crate::wire::*;
use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};
use std::time::Duration;

const NOW: u64 = 1_700_000_000_123; // 2023-11-14T22:13:20.123Z
const FRAME_MAX: u32 = 131_072;

/// `orders`: tiers 1s, 10s, 60s, four attempts, the given jitter.
fn pipeline(queue_type: &str, jitter: f64) -> Pipeline {
    let yaml = format!(
        "version: 1\npipelines:\n  - name: orders\n    queue_type: {queue_type}\n    \
         retry: {{delays: [1s, 10s, 60s], max_attempts: 4, jitter: {jitter}}}\n"
    );
    let mut t = parse_topology(&yaml, "t.yaml").expect("a valid topology");
    t.pipelines.remove(0)
}

fn message() -> BasicProperties {
    BasicProperties::default()
        .with_message_id("m-1".into())
        .with_content_type("application/json".into())
}

/// A message whose own header `big` takes `bytes` bytes.
fn big_message(bytes: usize) -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert(
        ShortString::from("big"),
        AMQPValue::LongString(LongString::from(vec![b'x'; bytes])),
    );
    message().with_headers(h)
}

struct Case {
    pipeline: Pipeline,
    mode: DeadLetterMode,
    frame_max: u32,
    properties: BasicProperties,
}

impl Case {
    fn new() -> Self {
        Case {
            pipeline: pipeline("quorum", 0.0),
            mode: DeadLetterMode::Republish,
            frame_max: FRAME_MAX,
            properties: message(),
        }
    }

    fn settle(&self, attempt: u32, run: Run) -> Plan {
        self.settle_with_u(attempt, run, 0.5)
    }

    fn settle_with_u(&self, attempt: u32, run: Run, jitter_u: f64) -> Plan {
        let rules = Rules {
            pipeline: &self.pipeline,
            dead_letter: self.mode,
            frame_max: self.frame_max,
            connection_user: "worker",
        };
        let d = Delivered {
            properties: &self.properties,
            exchange: "orders-in",
            routing_key: "order.created",
            attempt,
            // As the worker does: decided once from the headers.
            drill: crate::drill::message::drill_step(self.properties.headers().as_ref()),
        };
        settle(&rules, &d, &run, NOW, jitter_u)
    }
}

fn ran(o: Outcome) -> Run {
    Run::Ran(o)
}

fn transient() -> Outcome {
    Outcome::transient("down")
}

fn after(ms: u64) -> Outcome {
    Outcome::Transient {
        error: "busy".into(),
        retry_after: Some(Duration::from_millis(ms)),
    }
}

fn header<'a>(p: &'a BasicProperties, key: &str) -> Option<&'a AMQPValue> {
    p.headers().as_ref().and_then(|h| h.inner().get(key))
}

fn text<'a>(p: &'a BasicProperties, key: &str) -> &'a str {
    match header(p, key) {
        Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes()).expect("UTF-8"),
        other => panic!("{key}: {other:?}"),
    }
}

fn int(p: &BasicProperties, key: &str) -> i64 {
    match header(p, key) {
        Some(AMQPValue::LongLongInt(n)) => *n,
        other => panic!("{key}: {other:?}"),
    }
}

/// The tier and copy of a retry, or a panic.
fn retried(plan: &Plan) -> (u64, &Copy) {
    match &plan.settlement {
        Settlement::Retry { delay_ms, copy } => (*delay_ms, copy),
        other => panic!("not a retry: {other:?}"),
    }
}

/// The reason, copy and fallback of a dead-letter copy, or a panic.
fn dead_lettered(plan: &Plan) -> (DeadLetterReason, &Copy, bool) {
    match &plan.settlement {
        Settlement::DeadLetter {
            reason,
            copy,
            nack_if_refused,
        } => (*reason, copy, *nack_if_refused),
        other => panic!("not a dead-letter copy: {other:?}"),
    }
}

// ---- docs/worker.md's table, one test per row --------------------------

#[test]
fn row_success_is_acked_below_and_at_max_attempts() {
    let c = Case::new();
    for attempt in [1, 2, 4, 5] {
        let plan = c.settle(attempt, ran(Outcome::Success));
        assert_eq!(
            plan.settlement,
            Settlement::Ack {
                first_attempt: attempt == 1
            }
        );
        assert_eq!(plan.settlement.label(), "ack");
        assert!(plan.notes.is_empty());
    }
}

#[test]
fn row_transient_below_max_attempts_is_retried_through_the_rows_tier() {
    let c = Case::new();
    for (attempt, delay) in [(1, 1000), (2, 10_000), (3, 60_000)] {
        let plan = c.settle(attempt, ran(transient()));
        let (delay_ms, copy) = retried(&plan);
        assert_eq!(delay_ms, delay);
        assert_eq!(copy.exchange, "orders.retry");
        assert_eq!(copy.routing_key, tier_name(delay));
        assert_eq!(plan.settlement.tier(), Some(copy.routing_key.as_str()));
        assert_eq!(plan.settlement.label(), "retry");
        assert_eq!(int(&copy.properties, ATTEMPT_HEADER), i64::from(attempt));
        assert_eq!(text(&copy.properties, LAST_ERROR_HEADER), "down");
        assert_eq!(header(&copy.properties, REASON_HEADER), None);
        // Jitter 0: the queue's TTL alone applies.
        assert_eq!(copy.properties.expiration(), &None);
        assert!(plan.notes.is_empty());
    }
}

#[test]
fn row_transient_at_max_attempts_is_dead_lettered_exhausted() {
    let c = Case::new();
    for attempt in [4, 5] {
        let plan = c.settle(attempt, ran(transient()));
        let (reason, copy, _) = dead_lettered(&plan);
        assert_eq!(reason, DeadLetterReason::Exhausted);
        assert_eq!(copy.exchange, "orders.dlx");
        assert_eq!(copy.routing_key, "orders");
        assert_eq!(text(&copy.properties, REASON_HEADER), "exhausted");
        assert_eq!(text(&copy.properties, SOURCE_QUEUE_HEADER), "orders");
        assert_eq!(text(&copy.properties, LAST_ERROR_HEADER), "down");
        assert_eq!(int(&copy.properties, ATTEMPT_HEADER), i64::from(attempt));
        assert_eq!(plan.settlement.label(), "dead_letter");
        assert_eq!(plan.settlement.tier(), None);
    }
}

#[test]
fn row_transient_with_retry_after_takes_the_smallest_tier_whose_shortest_wait_covers_it() {
    let mut c = Case::new();
    c.pipeline = pipeline("quorum", 0.1);
    // (attempt, T in ms, tier): 1s waits at least 900 ms, 10s 9 s, 60s 54 s.
    let rows = [
        (1, 1, 1000),
        (1, 900, 1000),
        (1, 901, 10_000),
        (2, 1, 10_000),
        (1, 9000, 10_000),
        (1, 9001, 60_000),
        // Not even the largest tier covers T: the largest.
        (1, 3_600_000, 60_000),
        (3, 1, 60_000),
    ];
    for (attempt, t, tier) in rows {
        let plan = c.settle(attempt, ran(after(t)));
        let (delay_ms, copy) = retried(&plan);
        assert_eq!((attempt, t, delay_ms), (attempt, t, tier));
        assert_eq!(copy.routing_key, tier_name(tier));
    }
}

#[test]
fn row_transient_with_retry_after_at_max_attempts_is_dead_lettered_exhausted() {
    let c = Case::new();
    for attempt in [4, 5] {
        let plan = c.settle(attempt, ran(after(1)));
        assert_eq!(dead_lettered(&plan).0, DeadLetterReason::Exhausted);
    }
}

#[test]
fn row_permanent_is_dead_lettered_permanent_below_and_at_max_attempts() {
    let c = Case::new();
    for attempt in [1, 3, 4, 5] {
        let plan = c.settle(attempt, ran(Outcome::permanent("rejected")));
        let (reason, copy, _) = dead_lettered(&plan);
        assert_eq!(reason, DeadLetterReason::Permanent);
        assert_eq!(text(&copy.properties, REASON_HEADER), "permanent");
        assert_eq!(text(&copy.properties, LAST_ERROR_HEADER), "rejected");
        assert_eq!(plan.settlement.reason(), Some(DeadLetterReason::Permanent));
    }
}

// ---- how a dead-letter is carried out ----------------------------------

#[test]
fn dead_letter_mode_nack_leaves_the_message_to_the_brokers_dlx() {
    let mut c = Case::new();
    c.mode = DeadLetterMode::Nack;
    let cases = [
        (
            1,
            Outcome::permanent("rejected"),
            DeadLetterReason::Permanent,
        ),
        (4, transient(), DeadLetterReason::Exhausted),
    ];
    for (attempt, outcome, reason) in cases {
        let plan = c.settle(attempt, ran(outcome));
        assert_eq!(
            plan.settlement,
            Settlement::Nack {
                reason,
                cause: NackCause::Chosen
            }
        );
        assert_eq!(plan.settlement.label(), "dead_letter_nack");
        assert!(plan.notes.is_empty());
    }
    // Retries are still copies.
    assert_eq!(retried(&c.settle(1, ran(transient()))).0, 1000);
}

#[test]
fn dead_letter_mode_nack_publishes_a_copy_when_x_death_would_not_fit() {
    let mut c = Case::new();
    c.mode = DeadLetterMode::Nack;
    c.frame_max = 8192;
    c.properties = big_message(5000);
    assert!(properties_size(&c.properties) > retry_budget(&c.properties, c.frame_max));
    let plan = c.settle(1, ran(Outcome::permanent("rejected")));
    let (reason, copy, _) = dead_lettered(&plan);
    assert_eq!(reason, DeadLetterReason::Permanent);
    assert_eq!(text(&copy.properties, REASON_HEADER), "permanent");
    assert_eq!(plan.notes, vec![Note::NackWouldNotFit]);
}

#[test]
fn dead_letter_mode_republish_falls_back_to_nack_only_on_quorum() {
    let c = Case::new();
    let plan = c.settle(1, ran(Outcome::permanent("rejected")));
    assert!(dead_lettered(&plan).2);
    assert_eq!(
        plan.settlement.after_publish(PublishEnd::Nacked),
        Settlement::Nack {
            reason: DeadLetterReason::Permanent,
            cause: NackCause::DlqFull
        }
    );

    let mut classic = Case::new();
    classic.pipeline = pipeline("classic", 0.0);
    let plan = classic.settle(1, ran(Outcome::permanent("rejected")));
    assert!(!dead_lettered(&plan).2);
}

// ---- how a publish ends --------------------------------------------------

#[test]
fn a_confirmed_copy_is_acked_as_planned() {
    let c = Case::new();
    for plan in [c.settle(1, ran(transient())), c.settle(4, ran(transient()))] {
        let s = plan.settlement;
        assert_eq!(s.clone().after_publish(PublishEnd::Confirmed), s);
    }
}

#[test]
fn a_copy_the_broker_refuses_for_its_size_is_nacked_to_the_dlx() {
    let c = Case::new();
    let dead = c.settle(1, ran(Outcome::permanent("rejected"))).settlement;
    assert_eq!(
        dead.after_publish(PublishEnd::TooLarge("max_message_size".into())),
        Settlement::Nack {
            reason: DeadLetterReason::Permanent,
            cause: NackCause::BrokerRefusesSize("max_message_size".into())
        }
    );
    // A retry copy refused so goes to the DLX too, and says why.
    let retry = c.settle(1, ran(transient())).settlement;
    let done = retry.after_publish(PublishEnd::TooLarge("max_message_size".into()));
    assert_eq!(done.label(), "dead_letter_nack");
    assert_eq!(done.reason(), Some(DeadLetterReason::TooLarge));
}

#[test]
fn shutdown_leaves_the_delivery_for_the_broker_to_requeue() {
    let c = Case::new();
    for s in [
        c.settle(1, ran(transient())).settlement,
        c.settle(1, ran(Outcome::permanent("x"))).settlement,
    ] {
        let done = s.clone().after_publish(PublishEnd::ShuttingDown);
        assert_eq!(
            done,
            Settlement::Requeue {
                cause: RequeueCause::ShuttingDown
            }
        );
        assert_eq!(done.label(), "abandoned");
        assert_eq!(
            s.after_publish(PublishEnd::ChannelClosed),
            Settlement::Requeue {
                cause: RequeueCause::ChannelClosed
            }
        );
    }
}

/// A refused copy that cannot be published again leaves the delivery
/// unacked for the broker, whatever the copy was for: not handed back (its
/// handler would run again at each refusal), not dead-lettered.
#[test]
fn a_copy_not_repeatable_leaves_the_delivery_for_the_broker() {
    let c = Case::new();
    for s in [
        c.settle(1, ran(transient())).settlement,
        c.settle(1, ran(Outcome::permanent("x"))).settlement,
        c.settle(2, Run::Deferred { remaining_ms: 0 }).settlement,
    ] {
        let done = s.after_publish(PublishEnd::NotRepeatable);
        assert_eq!(
            done,
            Settlement::Requeue {
                cause: RequeueCause::CopyNotRepeatable
            }
        );
        assert_eq!(done.label(), "abandoned");
    }
    assert!(!RequeueCause::CopyNotRepeatable.handed_back());
}

#[test]
fn a_nack_not_asked_for_keeps_the_original() {
    let c = Case::new();
    let retry = c.settle(1, ran(transient())).settlement;
    assert!(!retry.nack_if_refused());
    assert!(matches!(
        retry.after_publish(PublishEnd::Nacked),
        Settlement::Requeue { .. }
    ));
}

#[test]
fn settlements_without_a_copy_ignore_how_a_publish_ended() {
    let s = Settlement::Ack {
        first_attempt: true,
    };
    for end in [
        PublishEnd::Confirmed,
        PublishEnd::Nacked,
        PublishEnd::TooLarge("x".into()),
        PublishEnd::ChannelClosed,
        PublishEnd::ShuttingDown,
        PublishEnd::NotRepeatable,
    ] {
        assert_eq!(s.clone().after_publish(end), s);
    }
}

// ---- rows the worker adds ------------------------------------------------

#[test]
fn a_run_cut_by_a_lost_connection_is_left_to_the_broker() {
    let plan = Case::new().settle(1, Run::Interrupted);
    assert_eq!(
        plan.settlement,
        Settlement::Requeue {
            cause: RequeueCause::LostDuringRun
        }
    );
    assert!(plan.notes.is_empty());
    assert_eq!(Run::Interrupted.outcome(), None);
}

#[test]
fn a_message_delivered_with_its_attempts_spent_is_dead_lettered_without_a_run() {
    let c = Case::new();
    let run = Run::spent(6, 4);
    assert_eq!(
        run.outcome(),
        Some(&Outcome::transient(
            "attempts already used up (5 of 4) when delivered"
        ))
    );
    let plan = c.settle(6, run);
    let (reason, copy, _) = dead_lettered(&plan);
    assert_eq!(reason, DeadLetterReason::Exhausted);
    // The runs made, not counting this delivery; no history entry for a
    // run that did not happen.
    assert_eq!(int(&copy.properties, ATTEMPT_HEADER), 5);
    assert_eq!(
        text(&copy.properties, LAST_ERROR_HEADER),
        "attempts already used up (5 of 4) when delivered"
    );
    match header(&copy.properties, ERRORS_HEADER) {
        Some(AMQPValue::FieldArray(a)) => assert!(a.as_slice().is_empty(), "{a:?}"),
        other => panic!("{ERRORS_HEADER}: {other:?}"),
    }
}

#[test]
fn a_retry_copy_too_large_for_frame_max_is_dead_lettered_too_large() {
    let mut c = Case::new();
    c.frame_max = 8192;
    c.properties = big_message(5000);
    let plan = c.settle(1, ran(transient()));
    let (reason, copy, _) = dead_lettered(&plan);
    assert_eq!(reason, DeadLetterReason::TooLarge);
    assert_eq!(text(&copy.properties, REASON_HEADER), "too_large");
    assert!(
        matches!(plan.notes[..], [Note::RetryTooLarge(_)]),
        "{plan:?}"
    );
}

#[test]
fn a_retry_copy_takes_the_jittered_expiration() {
    let mut c = Case::new();
    c.pipeline = pipeline("quorum", 0.5);
    let plan = c.settle_with_u(1, ran(transient()), 0.5);
    // floor(1000 × (1 − 0.5 × 0.5))
    assert_eq!(
        retried(&plan).1.properties.expiration(),
        &Some(ShortString::from("750"))
    );
}

#[test]
fn labels_are_the_metric_and_log_values() {
    assert_eq!(
        Settlement::LABELS,
        [
            "ack",
            "retry",
            "dead_letter",
            "dead_letter_nack",
            "abandoned",
            "duplicate",
            "deferred"
        ]
    );
    let c = Case::new();
    let all = [
        c.settle(1, ran(Outcome::Success)).settlement,
        c.settle(1, ran(transient())).settlement,
        c.settle(4, ran(transient())).settlement,
        Settlement::Nack {
            reason: DeadLetterReason::Exhausted,
            cause: NackCause::Chosen,
        },
        c.settle(1, Run::Interrupted).settlement,
        c.settle(1, Run::Duplicate).settlement,
        c.settle(1, Run::Deferred { remaining_ms: 1 }).settlement,
    ];
    let labels: Vec<&str> = all.iter().map(Settlement::label).collect();
    assert_eq!(labels, Settlement::LABELS);
}

/// A drill message's retry copies expire after `DRILL_EXPIRATION_MS`
/// whatever the tier and the jitter, keep the drill header, and its last
/// failure dead-letters it as `exhausted` with every header of dlqctl's.
#[test]
fn a_drill_message_retries_with_a_short_expiration_and_ends_exhausted() {
    use crate::drill::message::{DrillStep, DRILL_EXPIRATION_MS};
    let drill_run = Run::drill;
    let mut c = Case::new();
    c.pipeline = pipeline("quorum", 0.3);
    let mut h = FieldTable::default();
    h.insert(
        ShortString::from(DRILL_HEADER),
        AMQPValue::LongString(LongString::from("d-1")),
    );
    c.properties = message().with_headers(h);
    for attempt in 1..4 {
        let plan = c.settle(attempt, drill_run(DrillStep::Fail, attempt, 4));
        let Settlement::Retry { copy, .. } = &plan.settlement else {
            panic!("attempt {attempt}: {:?}", plan.settlement);
        };
        assert_eq!(
            copy.properties.expiration().as_ref().map(|e| e.as_str()),
            Some(DRILL_EXPIRATION_MS.to_string().as_str())
        );
        assert_eq!(text(&copy.properties, DRILL_HEADER), "d-1");
    }
    let plan = c.settle(4, drill_run(DrillStep::Fail, 4, 4));
    let Settlement::DeadLetter { copy, .. } = &plan.settlement else {
        panic!("{:?}", plan.settlement);
    };
    assert_eq!(text(&copy.properties, REASON_HEADER), "exhausted");
    assert_eq!(text(&copy.properties, DRILL_HEADER), "d-1");
    assert_eq!(copy.properties.expiration(), &None);
    // Not a drill: the jitter, as before.
    c.properties = message();
    let plan = c.settle(1, ran(transient()));
    let Settlement::Retry { copy, .. } = &plan.settlement else {
        panic!("{:?}", plan.settlement);
    };
    assert_eq!(
        copy.properties.expiration().as_ref().map(|e| e.as_str()),
        Some("850")
    );
}

/// The drill is what the delivery carries ([`Delivered::drill`], decided
/// once by the worker), not read again from the headers by `settle`.
#[test]
fn a_drill_is_what_the_delivery_carries() {
    use crate::drill::message::{DrillStep, DRILL_EXPIRATION_MS};
    use crate::wire::DRILL_HEADER;
    let c = Case::new();
    let rules = Rules {
        pipeline: &c.pipeline,
        dead_letter: c.mode,
        frame_max: c.frame_max,
        connection_user: "worker",
    };
    let mut h = FieldTable::default();
    h.insert(
        ShortString::from(DRILL_HEADER),
        AMQPValue::LongString(LongString::from("d-1")),
    );
    let with_header = message().with_headers(h);
    let plain = message();
    let expiration = |properties: &BasicProperties, drill: Option<DrillStep>| {
        let d = Delivered {
            properties,
            exchange: "orders-in",
            routing_key: "order.created",
            attempt: 1,
            drill,
        };
        let plan = settle(&rules, &d, &ran(transient()), NOW, 0.5);
        let (_, copy) = retried(&plan);
        copy.properties.expiration().as_ref().map(|e| e.to_string())
    };
    let short = Some(DRILL_EXPIRATION_MS.to_string());
    assert_eq!(expiration(&plain, Some(DrillStep::Fail)), short);
    // Without jitter, a copy that is not a drill's has no expiration.
    assert_eq!(expiration(&with_header, None), None);
    assert_eq!(expiration(&with_header, Some(DrillStep::Fail)), short);
}

/// `settle` is pure: the same inputs give the same plan and the same copy,
/// for every kind of copy it makes (each case checked to be the kind it
/// says).
#[test]
fn the_same_inputs_settle_to_the_same_copy() {
    use crate::drill::message::DrillStep;
    let kind = |p: &Plan| {
        let what = match &p.settlement {
            Settlement::Retry { .. } => "retry",
            Settlement::DeadLetter { reason, .. } => reason.as_str(),
            other => panic!("no copy: {other:?}"),
        };
        let note = match p.notes.first() {
            None => "",
            Some(Note::RetryTrimmed(_)) => "retry trimmed",
            Some(Note::RetryTooLarge(_)) => "retry too large",
            Some(Note::NackWouldNotFit) => "nack would not fit",
            Some(Note::DeadLetterTrimmed(_)) => "dead-letter trimmed",
            Some(Note::DeadLetterUnfit(_)) => "dead-letter unfit",
        };
        format!("{what}/{note}")
    };
    let long_error = Outcome::transient("e".repeat(3000));
    let mut cases: Vec<(&str, Case, u32, Run, f64)> = Vec::new();
    let mut c = Case::new();
    c.pipeline = pipeline("quorum", 0.2);
    cases.push(("retry/", c, 1, ran(transient()), 0.37));
    cases.push(("retry/", Case::new(), 2, ran(after(9_000)), 0.0));
    cases.push(("exhausted/", Case::new(), 4, ran(transient()), 0.5));
    cases.push((
        "permanent/",
        Case::new(),
        1,
        ran(Outcome::permanent("bad")),
        0.5,
    ));
    cases.push(("exhausted/", Case::new(), 6, Run::spent(6, 4), 0.5));
    // The first size of the message's own header whose retry copy must be
    // trimmed (a long error, a small frame_max).
    let trimmed = (0..4096)
        .step_by(16)
        .map(|bytes| {
            let mut c = Case::new();
            c.frame_max = 8192;
            c.properties = big_message(bytes);
            c
        })
        .find(|c| {
            matches!(
                c.settle(2, ran(long_error.clone())).notes[..],
                [Note::RetryTrimmed(_)]
            )
        })
        .expect("a size whose retry copy is trimmed");
    cases.push((
        "retry/retry trimmed",
        trimmed,
        2,
        ran(long_error.clone()),
        0.5,
    ));
    let mut c = Case::new();
    c.frame_max = 8192;
    c.properties = big_message(5000);
    cases.push(("too_large/retry too large", c, 1, ran(transient()), 0.5));
    let mut c = Case::new();
    c.mode = DeadLetterMode::Nack;
    c.properties = big_message(FRAME_MAX as usize - 200);
    cases.push(("exhausted/nack would not fit", c, 4, ran(transient()), 0.5));
    let mut c = Case::new();
    let mut h = FieldTable::default();
    h.insert(
        ShortString::from(DRILL_HEADER),
        AMQPValue::LongString(LongString::from("d-1")),
    );
    c.properties = message().with_headers(h);
    cases.push(("retry/", c, 1, Run::drill(DrillStep::Fail, 1, 4), 0.5));
    for (expected, case, attempt, run, u) in &cases {
        let first = case.settle_with_u(*attempt, run.clone(), *u);
        assert_eq!(&kind(&first), expected, "{first:?}");
        let again = case.settle_with_u(*attempt, run.clone(), *u);
        assert_eq!(first, again, "{expected}");
        assert_eq!(
            first.settlement.copy(),
            again.settlement.copy(),
            "{expected}"
        );
    }
}

// ------------------------------------------------ idempotent handling

/// A duplicate is acked without a copy, in either dead-letter mode.
#[test]
fn a_duplicate_is_acked() {
    for mode in [DeadLetterMode::Republish, DeadLetterMode::Nack] {
        let mut c = Case::new();
        c.mode = mode;
        let plan = c.settle(3, Run::Duplicate);
        assert_eq!(plan.settlement, Settlement::Duplicate);
        assert_eq!(plan.settlement.label(), "duplicate");
        assert!(plan.settlement.copy().is_none());
    }
}

/// A deferral goes to the shortest tier that outlasts the lease, keeps
/// the attempt count (runs made before it), and is never a nack, in
/// either mode, even past max_attempts.
#[test]
fn a_deferral_keeps_its_attempt_and_is_never_nacked() {
    for mode in [DeadLetterMode::Republish, DeadLetterMode::Nack] {
        for attempt in [1, 3, 4, 9] {
            let mut c = Case::new();
            c.mode = mode;
            let plan = c.settle(
                attempt,
                Run::Deferred {
                    remaining_ms: 5_000,
                },
            );
            let Settlement::Defer { delay_ms, copy } = &plan.settlement else {
                panic!("{mode:?} {attempt}: {:?}", plan.settlement);
            };
            assert_eq!(*delay_ms, 10_000);
            assert_eq!(copy.routing_key, tier_name(10_000));
            assert_eq!(copy.exchange, c.pipeline.retry_exchange());
            assert_eq!(
                int(&copy.properties, ATTEMPT_HEADER),
                i64::from(attempt - 1)
            );
            assert!(header(&copy.properties, DEFERRED_HEADER).is_some());
            assert_eq!(plan.settlement.label(), "deferred");
            // Back from its tier, it counts as the same attempt.
            let mut back = copy.properties.headers().clone().unwrap_or_default();
            back.insert(X_DEATH.into(), x_death_expired(&c.pipeline, 10_000, 1));
            let count = count_attempt(Some(&back), &c.pipeline.retry_queues());
            assert_eq!(count.attempt, attempt, "{mode:?}");
        }
    }
}

/// A deferral's copy that the broker does not confirm is handed back or
/// left for the broker: never dead-lettered, never nacked to the DLX.
#[test]
fn a_deferral_never_dead_letters_whatever_its_publish_did() {
    let c = Case::new();
    let plan = c.settle(2, Run::Deferred { remaining_ms: 0 });
    for (end, want) in [
        (PublishEnd::Nacked, RequeueCause::ChannelClosed),
        (PublishEnd::ChannelClosed, RequeueCause::ChannelClosed),
        (PublishEnd::ShuttingDown, RequeueCause::ShuttingDown),
        (
            PublishEnd::TooLarge("big".into()),
            RequeueCause::DeferTooLarge,
        ),
        (PublishEnd::NotRepeatable, RequeueCause::CopyNotRepeatable),
    ] {
        assert_eq!(
            plan.settlement.clone().after_publish(end),
            Settlement::Requeue { cause: want }
        );
    }
    assert!(RequeueCause::DeferTooLarge.handed_back());
    assert!(!RequeueCause::ChannelClosed.handed_back());
    assert_eq!(
        plan.settlement.clone().after_publish(PublishEnd::Confirmed),
        plan.settlement
    );
}

/// With the store unavailable the delivery is handed back at once.
#[test]
fn a_store_that_does_not_answer_hands_the_delivery_back() {
    let plan = Case::new().settle(1, Run::StoreUnavailable);
    assert_eq!(
        plan.settlement,
        Settlement::Requeue {
            cause: RequeueCause::StoreUnavailable
        }
    );
    assert!(RequeueCause::StoreUnavailable.handed_back());
    assert_eq!(plan.settlement.label(), "abandoned");
}

/// Any other copy of a once-deferred message drops the marker, so that
/// its own tier's death counts again.
#[test]
fn retry_and_dead_letter_copies_drop_the_deferred_marker() {
    let mut c = Case::new();
    let mut h = FieldTable::default();
    h.insert(DEFERRED_HEADER.into(), AMQPValue::Boolean(true));
    h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(1));
    c.properties = message().with_headers(h);
    let retry = c.settle(2, ran(transient()));
    let dead = c.settle(2, ran(Outcome::permanent("no")));
    for s in [retry.settlement, dead.settlement] {
        let copy = s.copy().expect("a copy");
        assert!(header(&copy.properties, DEFERRED_HEADER).is_none(), "{s:?}");
    }
}

/// An `x-death` of one `expired` entry from the pipeline's tier queue of
/// `delay_ms`, with `count`.
fn x_death_expired(p: &Pipeline, delay_ms: u64, count: i64) -> AMQPValue {
    let mut entry = FieldTable::default();
    entry.insert(
        "queue".into(),
        AMQPValue::LongString(LongString::from(p.retry_queue(delay_ms))),
    );
    entry.insert(
        "reason".into(),
        AMQPValue::LongString(LongString::from("expired")),
    );
    entry.insert("count".into(), AMQPValue::LongLongInt(count));
    AMQPValue::FieldArray(vec![AMQPValue::FieldTable(entry)].into())
}

fn policy_of(delays: &[u64], jitter: f64) -> RetryPolicy {
    RetryPolicy {
        delays: delays.to_vec(),
        max_attempts: 5,
        jitter,
    }
}

#[test]
fn a_deferral_waits_in_the_shortest_tier_that_outlasts_the_lease() {
    let p = policy_of(&[1_000, 10_000, 60_000], 0.0);
    assert_eq!(decision::defer_tier(&p, 0), Some(1_000));
    assert_eq!(decision::defer_tier(&p, 999), Some(1_000));
    // Outlasts: strictly longer.
    assert_eq!(decision::defer_tier(&p, 1_000), Some(10_000));
    assert_eq!(decision::defer_tier(&p, 30_000), Some(60_000));
    // None outlasts it: the longest.
    assert_eq!(decision::defer_tier(&p, 600_000), Some(60_000));
    // With jitter, the shortest wait counts: 10 s × 0.8 = 8 s.
    let j = policy_of(&[1_000, 10_000, 60_000], 0.2);
    assert_eq!(decision::defer_tier(&j, 7_999), Some(10_000));
    assert_eq!(decision::defer_tier(&j, 8_000), Some(60_000));
    assert_eq!(decision::defer_tier(&policy_of(&[], 0.0), 5), None);
    assert_eq!(
        decision::defer_tier(&policy_of(&[5_000], f64::NAN), 1),
        Some(5_000)
    );
}

/// A key conflict under `on_conflict: dead_letter` goes to the DLQ with a
/// reason of its own, its attempt count unchanged (no handler ran), and
/// by nack under `--dead-letter nack`; under `skip` it is acked like a
/// duplicate.
#[test]
fn a_key_conflict_is_dead_lettered_with_its_own_reason_or_skipped() {
    let mut c = Case::new();
    let plan = c.settle(2, Run::KeyConflict { dead_letter: true });
    let Settlement::DeadLetter { reason, copy, .. } = &plan.settlement else {
        panic!("{:?}", plan.settlement)
    };
    assert_eq!(*reason, DeadLetterReason::KeyConflict);
    assert_eq!(text(&copy.properties, REASON_HEADER), "key_conflict");
    assert!(text(&copy.properties, LAST_ERROR_HEADER).contains("another body"));
    assert_eq!(
        plan.settlement.reason(),
        Some(DeadLetterReason::KeyConflict)
    );
    assert_eq!(plan.settlement.label(), "dead_letter");
    let skipped = c.settle(2, Run::KeyConflict { dead_letter: false });
    assert_eq!(skipped.settlement, Settlement::Duplicate);
    c.mode = DeadLetterMode::Nack;
    assert_eq!(
        c.settle(1, Run::KeyConflict { dead_letter: true })
            .settlement,
        Settlement::Nack {
            reason: DeadLetterReason::KeyConflict,
            cause: NackCause::Chosen
        }
    );
    assert_eq!(Run::KeyConflict { dead_letter: true }.outcome(), None);
    assert!(DeadLetterReason::ALL.contains(&DeadLetterReason::KeyConflict));
}
