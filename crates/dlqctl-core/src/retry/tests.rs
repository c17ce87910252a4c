//! Unit tests of the retry core.

use super::attempt::*;
use super::copy::*;
use super::decision::*;
use super::headers::*;
use super::headers_json::*;
use super::jitter::*;
use crate::field_table;
use crate::handling::outcome::Outcome;
use crate::topology::RetryPolicy;
use crate::values::shortstr::MAX_JSON_DEPTH;
use crate::values::text::*;
use crate::wire::*;
use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use std::time::Duration;

// ---- helpers ----------------------------------------------------------

fn ls(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn ss(s: &str) -> AMQPValue {
    AMQPValue::ShortString(ShortString::from(s))
}

fn array(values: Vec<AMQPValue>) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(values))
}

fn death(queue: &str, reason: &str, count: AMQPValue) -> AMQPValue {
    AMQPValue::FieldTable(field_table(vec![
        ("queue", ls(queue)),
        ("reason", ls(reason)),
        ("count", count),
        ("exchange", ls("orders.retry")),
        ("time", AMQPValue::Timestamp(1_700_000_000)),
    ]))
}

fn xdeath(entries: Vec<AMQPValue>) -> FieldTable {
    field_table(vec![(X_DEATH, array(entries))])
}

fn queues() -> Vec<String> {
    vec![
        "orders.retry.1s".to_string(),
        "orders.retry.10s".to_string(),
        "orders.retry.1m".to_string(),
    ]
}

fn count(headers: &FieldTable) -> AttemptCount {
    count_attempt(Some(headers), &queues())
}

/// Every AMQP integer type holding 3.
fn threes() -> Vec<AMQPValue> {
    vec![
        AMQPValue::ShortShortInt(3),
        AMQPValue::ShortShortUInt(3),
        AMQPValue::ShortInt(3),
        AMQPValue::ShortUInt(3),
        AMQPValue::LongInt(3),
        AMQPValue::LongUInt(3),
        AMQPValue::LongLongInt(3),
    ]
}

/// Values of every type that is not an integer.
fn non_integers() -> Vec<AMQPValue> {
    vec![
        AMQPValue::Boolean(true),
        AMQPValue::Float(3.0),
        AMQPValue::Double(3.0),
        AMQPValue::DecimalValue(DecimalValue { scale: 0, value: 3 }),
        ss("3"),
        ls("3"),
        array(vec![AMQPValue::LongLongInt(3)]),
        AMQPValue::Timestamp(3),
        AMQPValue::FieldTable(field_table(vec![("count", AMQPValue::LongLongInt(3))])),
        AMQPValue::ByteArray(ByteArray::from(vec![3u8])),
        AMQPValue::Void,
    ]
}

// ---- count_attempt ----------------------------------------------------

#[test]
fn no_headers_is_the_first_attempt() {
    let c = count_attempt(None, &queues());
    assert_eq!(
        c,
        AttemptCount {
            own: None,
            deaths: 0,
            attempt: 1,
            warnings: vec![]
        }
    );
    let c = count(&field_table(vec![("x-other", ls("y"))]));
    assert_eq!((c.own, c.deaths, c.attempt), (None, 0, 1));
    assert!(c.warnings.is_empty());
}

#[test]
fn own_header_of_every_integer_type_is_read() {
    for v in threes() {
        let c = count(&field_table(vec![(ATTEMPT_HEADER, v.clone())]));
        assert_eq!((c.own, c.attempt), (Some(3), 4), "{v:?}");
        assert!(c.warnings.is_empty(), "{v:?}");
    }
}

#[test]
fn own_header_of_another_type_is_ignored_with_a_warning() {
    for v in non_integers() {
        let c = count(&field_table(vec![(ATTEMPT_HEADER, v.clone())]));
        assert_eq!((c.own, c.attempt), (None, 1), "{v:?}");
        assert_eq!(c.warnings.len(), 1, "{v:?}");
        assert!(c.warnings[0].contains(ATTEMPT_HEADER), "{:?}", c.warnings);
    }
}

#[test]
fn negative_own_header_is_ignored_with_a_warning() {
    for v in [
        AMQPValue::ShortShortInt(-1),
        AMQPValue::ShortInt(-2),
        AMQPValue::LongInt(-3),
        AMQPValue::LongLongInt(i64::MIN),
    ] {
        let c = count(&field_table(vec![(ATTEMPT_HEADER, v.clone())]));
        assert_eq!((c.own, c.attempt), (None, 1), "{v:?}");
        assert_eq!(c.warnings.len(), 1, "{v:?}");
    }
}

#[test]
fn huge_own_header_saturates() {
    let c = count(&field_table(vec![(
        ATTEMPT_HEADER,
        AMQPValue::LongLongInt(i64::MAX),
    )]));
    assert_eq!((c.own, c.attempt), (Some(u32::MAX), u32::MAX));
    assert_eq!(c.warnings.len(), 1);
    let c = count(&field_table(vec![(
        ATTEMPT_HEADER,
        AMQPValue::LongUInt(u32::MAX),
    )]));
    assert_eq!((c.own, c.attempt), (Some(u32::MAX), u32::MAX));
    assert!(c.warnings.is_empty());
    let c = count(&field_table(vec![(
        ATTEMPT_HEADER,
        AMQPValue::LongUInt(u32::MAX - 1),
    )]));
    assert_eq!(c.attempt, u32::MAX);
    let c = count(&field_table(vec![(
        ATTEMPT_HEADER,
        AMQPValue::LongLongInt(0),
    )]));
    assert_eq!((c.own, c.attempt), (Some(0), 1));
}

#[test]
fn deaths_sum_the_counts_of_every_tier_queue() {
    let c = count(&xdeath(vec![
        death("orders.retry.10s", "expired", AMQPValue::LongLongInt(2)),
        death("orders.retry.1s", "expired", AMQPValue::LongLongInt(3)),
    ]));
    assert_eq!((c.own, c.deaths, c.attempt), (None, 5, 6));
    assert!(c.warnings.is_empty());
}

#[test]
fn deaths_ignore_other_queues_and_other_reasons() {
    let c = count(&xdeath(vec![
        death("orders.retry.1s", "rejected", AMQPValue::LongLongInt(10)),
        death("orders.retry.1s", "maxlen", AMQPValue::LongLongInt(10)),
        death("orders", "expired", AMQPValue::LongLongInt(10)),
        death("orders", "delivery_limit", AMQPValue::LongLongInt(10)),
        death("payments.retry.1s", "expired", AMQPValue::LongLongInt(10)),
        death("orders.retry.1s.x", "expired", AMQPValue::LongLongInt(10)),
        death("orders.retry.1m", "Expired", AMQPValue::LongLongInt(10)),
        death("orders.retry.1m", "expired", AMQPValue::LongLongInt(1)),
    ]));
    assert_eq!((c.deaths, c.attempt), (1, 2));
    assert!(c.warnings.is_empty());
    // No retry queues at all: nothing counts.
    let c = count_attempt(
        Some(&xdeath(vec![death(
            "orders.retry.1s",
            "expired",
            AMQPValue::LongLongInt(4),
        )])),
        &[],
    );
    assert_eq!((c.deaths, c.attempt), (0, 1));
}

#[test]
fn death_count_of_every_integer_type_is_read() {
    for v in threes() {
        let c = count(&xdeath(vec![death(
            "orders.retry.1s",
            "expired",
            v.clone(),
        )]));
        assert_eq!((c.deaths, c.attempt), (3, 4), "{v:?}");
        assert!(c.warnings.is_empty(), "{v:?}");
    }
}

#[test]
fn death_reason_and_queue_may_be_short_strings() {
    let entry = AMQPValue::FieldTable(field_table(vec![
        ("queue", ss("orders.retry.10s")),
        ("reason", ss("expired")),
        ("count", AMQPValue::LongLongInt(2)),
    ]));
    let c = count(&xdeath(vec![entry]));
    assert_eq!(c.deaths, 2);
}

#[test]
fn attempt_is_the_larger_of_own_and_deaths_plus_one() {
    let mut h = xdeath(vec![death(
        "orders.retry.1s",
        "expired",
        AMQPValue::LongLongInt(5),
    )]);
    h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(2));
    assert_eq!(count(&h).attempt, 6);
    h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(7));
    let c = count(&h);
    assert_eq!((c.own, c.deaths, c.attempt), (Some(7), 5, 8));
}

#[test]
fn x_death_that_is_not_an_array_is_ignored_with_a_warning() {
    for v in [
        ls("garbage"),
        AMQPValue::FieldTable(field_table(vec![("count", AMQPValue::LongLongInt(3))])),
        AMQPValue::LongLongInt(3),
        AMQPValue::Void,
    ] {
        let mut h = field_table(vec![(X_DEATH, v.clone())]);
        h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(1));
        let c = count(&h);
        assert_eq!((c.own, c.deaths, c.attempt), (Some(1), 0, 2), "{v:?}");
        assert_eq!(c.warnings.len(), 1, "{v:?}");
        assert!(c.warnings[0].contains(X_DEATH));
    }
}

#[test]
fn malformed_death_entries_are_skipped_each_with_a_warning() {
    let q = "orders.retry.1s";
    let bad = vec![
        ls("SECRET"),
        array(vec![death(q, "expired", AMQPValue::LongLongInt(100))]),
        AMQPValue::FieldTable(field_table(vec![
            ("queue", ls(q)),
            ("count", AMQPValue::LongLongInt(100)),
        ])),
        AMQPValue::FieldTable(field_table(vec![
            ("reason", ls("expired")),
            ("count", AMQPValue::LongLongInt(100)),
        ])),
        AMQPValue::FieldTable(field_table(vec![
            ("queue", AMQPValue::LongLongInt(1)),
            ("reason", ls("expired")),
            ("count", AMQPValue::LongLongInt(100)),
        ])),
        AMQPValue::FieldTable(field_table(vec![
            ("queue", ls(q)),
            ("reason", AMQPValue::Boolean(true)),
            ("count", AMQPValue::LongLongInt(100)),
        ])),
        AMQPValue::FieldTable(field_table(vec![
            ("queue", ls(q)),
            ("reason", ls("expired")),
        ])),
        death(q, "expired", ls("100")),
        death(q, "expired", AMQPValue::Double(100.0)),
        death(q, "expired", AMQPValue::Timestamp(100)),
        death(q, "expired", AMQPValue::LongLongInt(-100)),
    ];
    let n_bad = bad.len();
    let mut entries = bad;
    entries.push(death(q, "expired", AMQPValue::LongLongInt(2)));
    entries.push(death(
        "orders.retry.10s",
        "expired",
        AMQPValue::ShortShortUInt(1),
    ));
    let c = count(&xdeath(entries));
    assert_eq!((c.deaths, c.attempt), (3, 4));
    // n_bad warnings, capped at MAX_WARNINGS plus one summary line.
    assert_eq!(n_bad, MAX_WARNINGS + 1);
    assert_eq!(c.warnings.len(), MAX_WARNINGS + 1);
    assert_eq!(c.warnings[MAX_WARNINGS], "1 more header warnings not shown");
    assert!(c.warnings[..MAX_WARNINGS]
        .iter()
        .all(|w| w.contains("x-death entry")));
    // Warnings name types and positions, never the header values.
    assert!(c.warnings.iter().all(|w| !w.contains("SECRET")));
    assert!(c.warnings[0].contains("entry 0"));
}

#[test]
fn garbage_count_of_an_irrelevant_entry_is_not_a_warning() {
    let c = count(&xdeath(vec![
        death("orders.retry.1s", "rejected", ls("x")),
        death("elsewhere", "expired", AMQPValue::Void),
    ]));
    assert_eq!(c.deaths, 0);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn hostile_counts_saturate_instead_of_overflowing() {
    let q = "orders.retry.1s";
    let entries = vec![death(q, "expired", AMQPValue::LongLongInt(i64::MAX)); 3];
    let c = count(&xdeath(entries));
    assert_eq!((c.deaths, c.attempt), (u64::MAX, u32::MAX));
    let c = count(&xdeath(vec![death(
        q,
        "expired",
        AMQPValue::LongLongInt(i64::from(u32::MAX)),
    )]));
    assert_eq!(c.attempt, u32::MAX);
}

#[test]
fn many_bad_entries_give_a_bounded_number_of_warnings() {
    let c = count(&xdeath(vec![AMQPValue::Void; 10_000]));
    assert_eq!(c.warnings.len(), MAX_WARNINGS + 1);
    assert_eq!(
        c.warnings.last().map(String::as_str),
        Some("9990 more header warnings not shown")
    );
}

// ---- decide -----------------------------------------------------------

fn policy(delays: &[u64], max_attempts: u32, jitter: f64) -> RetryPolicy {
    RetryPolicy {
        delays: delays.to_vec(),
        max_attempts,
        jitter,
    }
}

fn retry(delay_ms: u64) -> Decision {
    Decision::Retry { delay_ms }
}

const EXHAUSTED: Decision = Decision::DeadLetter {
    reason: DeadLetterReason::Exhausted,
};
const PERMANENT: Decision = Decision::DeadLetter {
    reason: DeadLetterReason::Permanent,
};

fn after(ms: u64) -> Outcome {
    Outcome::Transient {
        error: "busy".into(),
        retry_after: Some(Duration::from_millis(ms)),
    }
}

#[test]
fn success_is_always_acked() {
    let p = policy(&[1000], 3, 0.1);
    for attempt in [0, 1, 2, 3, 4, u32::MAX] {
        assert_eq!(decide(&p, attempt, &Outcome::Success), Decision::Ack);
    }
}

#[test]
fn permanent_is_always_dead_lettered_as_permanent() {
    let p = policy(&[1000], 3, 0.1);
    for attempt in [0, 1, 2, 3, 4, u32::MAX] {
        assert_eq!(decide(&p, attempt, &Outcome::permanent("bad")), PERMANENT);
    }
}

#[test]
fn transient_walks_the_delays_then_stays_on_the_last() {
    let p = policy(&[1000, 10_000, 60_000], 6, 0.1);
    let t = Outcome::transient("down");
    assert_eq!(decide(&p, 1, &t), retry(1000));
    assert_eq!(decide(&p, 2, &t), retry(10_000));
    assert_eq!(decide(&p, 3, &t), retry(60_000));
    assert_eq!(decide(&p, 4, &t), retry(60_000));
    assert_eq!(decide(&p, 5, &t), retry(60_000));
    assert_eq!(decide(&p, 6, &t), EXHAUSTED);
    assert_eq!(decide(&p, 7, &t), EXHAUSTED);
    assert_eq!(decide(&p, u32::MAX, &t), EXHAUSTED);
}

#[test]
fn a_single_attempt_budget_never_retries() {
    let p = policy(&[1000], 1, 0.0);
    assert_eq!(decide(&p, 1, &Outcome::transient("x")), EXHAUSTED);
    assert_eq!(decide(&p, 1, &after(5)), EXHAUSTED);
    assert_eq!(decide(&p, 1, &Outcome::Success), Decision::Ack);
}

#[test]
fn exhausted_wins_over_retry_after() {
    let p = policy(&[1000, 10_000], 3, 0.0);
    assert_eq!(decide(&p, 3, &after(1)), EXHAUSTED);
    assert_eq!(decide(&p, 2, &after(1)), retry(10_000));
}

#[test]
fn repeated_delays_follow_the_list_order() {
    let p = policy(&[1000, 1000, 10_000, 1000], 10, 0.0);
    let t = Outcome::transient("x");
    let picked: Vec<_> = (1..=6).map(|a| decide(&p, a, &t)).collect();
    assert_eq!(
        picked,
        [1000, 1000, 10_000, 1000, 1000, 1000].map(retry).to_vec()
    );
    // Retry-after picks among distinct tiers.
    assert_eq!(decide(&p, 1, &after(1001)), retry(10_000));
    assert_eq!(decide(&p, 4, &after(10_001)), retry(10_000));
}

#[test]
fn defensive_inputs_do_not_panic() {
    let t = Outcome::transient("x");
    // Attempt 0 counts as the first.
    assert_eq!(decide(&policy(&[1000, 2000], 3, 0.0), 0, &t), retry(1000));
    // No delays: nowhere to retry.
    assert_eq!(decide(&policy(&[], 3, 0.0), 1, &t), EXHAUSTED);
    assert_eq!(decide(&policy(&[], 3, 0.0), 1, &after(5)), EXHAUSTED);
    // Jitter out of range or NaN.
    assert_eq!(
        decide(&policy(&[1000, 2000], 3, f64::NAN), 1, &after(1000)),
        retry(1000)
    );
    assert_eq!(
        decide(&policy(&[1000, 2000], 3, -1.0), 1, &after(1000)),
        retry(1000)
    );
    assert_eq!(
        decide(&policy(&[1000, 2000], 3, 7.0), 1, &after(1)),
        retry(2000)
    );
    // max_attempts 0.
    assert_eq!(decide(&policy(&[1000], 0, 0.0), 1, &t), EXHAUSTED);
}

#[test]
fn retry_after_without_jitter() {
    let p = policy(&[1000, 10_000, 60_000], 6, 0.0);
    // Shorter than the row's delay: the row's tier.
    assert_eq!(decide(&p, 1, &after(0)), retry(1000));
    assert_eq!(decide(&p, 1, &after(1)), retry(1000));
    assert_eq!(decide(&p, 2, &after(1000)), retry(10_000));
    // Exactly a tier: that tier.
    assert_eq!(decide(&p, 1, &after(1000)), retry(1000));
    assert_eq!(decide(&p, 1, &after(10_000)), retry(10_000));
    // Just over a tier: the next one.
    assert_eq!(decide(&p, 1, &after(1001)), retry(10_000));
    assert_eq!(decide(&p, 1, &after(10_001)), retry(60_000));
    // Longer than every tier: the largest.
    assert_eq!(decide(&p, 1, &after(60_001)), retry(60_000));
    assert_eq!(decide(&p, 1, &after(u64::MAX)), retry(60_000));
    let huge = Outcome::Transient {
        error: "x".into(),
        retry_after: Some(Duration::MAX),
    };
    assert_eq!(decide(&p, 1, &huge), retry(60_000));
}

#[test]
fn retry_after_rounds_sub_milliseconds_up() {
    let p = policy(&[1000, 10_000], 6, 0.0);
    let t = |d| Outcome::Transient {
        error: "x".into(),
        retry_after: Some(d),
    };
    assert_eq!(
        decide(&p, 1, &t(Duration::from_micros(1_000_001))),
        retry(10_000)
    );
    assert_eq!(
        decide(&p, 1, &t(Duration::from_micros(999_999))),
        retry(1000)
    );
    assert_eq!(
        decide(&p, 1, &t(Duration::from_nanos(1_000_000_000))),
        retry(1000)
    );
}

#[test]
fn retry_after_with_jitter_uses_the_shortest_jittered_wait() {
    let p = policy(&[1000, 10_000, 60_000], 6, 0.1);
    // 10s × 0.9 = 9s: exactly equal is enough.
    assert_eq!(decide(&p, 1, &after(9000)), retry(10_000));
    assert_eq!(decide(&p, 1, &after(9001)), retry(60_000));
    // A retry-after that the row's own tier covers keeps the row: its
    // shortest jittered wait (1s × 0.9) is at least 1 ms.
    assert_eq!(decide(&p, 1, &after(1)), retry(1000));
    assert_eq!(decide(&p, 1, &after(900)), retry(1000));
    assert_eq!(decide(&p, 1, &after(901)), retry(10_000));
    assert_eq!(decide(&p, 2, &after(1)), retry(10_000));
    // Never a tier below the row's own delay.
    assert_eq!(decide(&p, 3, &after(1)), retry(60_000));
    // Nothing is long enough: the largest.
    assert_eq!(decide(&p, 1, &after(54_001)), retry(60_000));
    assert_eq!(decide(&p, 1, &after(54_000)), retry(60_000));
    // Without retry-after, jitter does not change the row.
    assert_eq!(decide(&p, 1, &Outcome::transient("x")), retry(1000));
}

#[test]
fn retry_after_boundary_survives_float_rounding() {
    // 10000 × (1 − 0.33) is 6699.999999999999 in f64 arithmetic.
    let p = policy(&[1000, 10_000, 20_000], 6, 0.33);
    assert_eq!(decide(&p, 1, &after(6700)), retry(10_000));
    assert_eq!(decide(&p, 1, &after(6701)), retry(20_000));
    let p = policy(&[500, 1000, 5000], 6, 0.07);
    assert_eq!(decide(&p, 1, &after(930)), retry(1000));
    assert_eq!(decide(&p, 1, &after(931)), retry(5000));
    // The row's own tier covers 700 ms: 1000 × 0.7 = 700.
    let p = policy(&[1000, 5000], 6, 0.3);
    assert_eq!(decide(&p, 1, &after(700)), retry(1000));
    assert_eq!(decide(&p, 1, &after(701)), retry(5000));
}

#[test]
fn a_chosen_tier_never_waits_less_than_retry_after() {
    let delays = [100, 1000, 1500, 10_000, 60_000, 600_000];
    let just_below_one = f64::from_bits(1.0_f64.to_bits() - 1);
    for jitter in [0.0, 0.05, 0.07, 0.1, 0.25, 0.33, 0.5] {
        let p = policy(&delays, 10, jitter);
        for t in (0..700_000)
            .step_by(997)
            .chain([1, 99, 100, 101, 9000, 59_999])
        {
            for attempt in 1..=3 {
                let Decision::Retry { delay_ms } = decide(&p, attempt, &after(t)) else {
                    panic!("not a retry");
                };
                if delay_ms == 600_000 {
                    continue; // the largest tier is the fallback
                }
                for u in [0.0, 0.5, 0.999_999, just_below_one, 1.0] {
                    let wait = jitter_expiration(delay_ms, jitter, u)
                        .map_or(delay_ms, |e| e.parse().expect("an integer"));
                    assert!(wait >= t, "t={t} j={jitter} u={u} d={delay_ms} wait={wait}");
                    let row = delays[attempt as usize - 1];
                    assert!(delay_ms >= row, "t={t} j={jitter} u={u} d={delay_ms}");
                }
            }
        }
    }
}

#[test]
fn dead_letter_reasons_have_their_header_values() {
    assert_eq!(DeadLetterReason::Permanent.as_str(), "permanent");
    assert_eq!(DeadLetterReason::Exhausted.as_str(), "exhausted");
    assert_eq!(DeadLetterReason::Exhausted.to_string(), "exhausted");
}

// ---- jitter -----------------------------------------------------------

fn exp(d: u64, j: f64, u: f64) -> Option<String> {
    jitter_expiration(d, j, u)
}

#[test]
fn no_jitter_no_expiration() {
    for u in [0.0, 0.5, 0.99] {
        assert_eq!(exp(10_000, 0.0, u), None);
        assert_eq!(exp(10_000, -0.1, u), None);
        assert_eq!(exp(10_000, f64::NAN, u), None);
    }
    assert_eq!(exp(0, 0.1, 0.5), None);
}

#[test]
fn jitter_is_floor_of_the_formula() {
    assert_eq!(exp(10_000, 0.1, 0.0).as_deref(), Some("10000"));
    assert_eq!(exp(10_000, 0.1, 0.5).as_deref(), Some("9500"));
    assert_eq!(exp(10_000, 0.5, 0.5).as_deref(), Some("7500"));
    assert_eq!(exp(1001, 0.1, 0.5).as_deref(), Some("950")); // 950.95
    assert_eq!(exp(10_000, 0.5, 0.999_999).as_deref(), Some("5000"));
    assert_eq!(exp(10_000, 0.33, 1.0 - 1e-12).as_deref(), Some("6700"));
}

#[test]
fn jitter_clamps_u_into_zero_to_one() {
    assert_eq!(exp(10_000, 0.5, -3.0).as_deref(), Some("10000"));
    assert_eq!(exp(10_000, 0.5, f64::NAN).as_deref(), Some("10000"));
    assert_eq!(exp(10_000, 0.5, 1.0).as_deref(), Some("5000"));
    assert_eq!(exp(10_000, 0.5, 7.0).as_deref(), Some("5000"));
    assert_eq!(exp(10_000, 0.5, f64::INFINITY).as_deref(), Some("5000"));
}

#[test]
fn jitter_is_a_whole_number_between_one_and_the_tier() {
    assert_eq!(exp(1, 0.5, 0.99).as_deref(), Some("1"));
    assert_eq!(exp(1, 1.0, 0.999).as_deref(), Some("1"));
    assert_eq!(exp(3, 1.0, 0.999).as_deref(), Some("1"));
    let max = crate::values::duration::MAX_MILLIS;
    assert_eq!(exp(max, 0.5, 0.0), Some(max.to_string()));
    for d in [1, 2, 3, 7, 999, 1000, 1001, 60_000, max] {
        for j in [0.01, 0.1, 0.33, 0.5] {
            for i in 0..=100 {
                let u = f64::from(i) / 100.0;
                let e = exp(d, j, u).expect("jitter is on");
                assert!(
                    !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()),
                    "{e}"
                );
                let n: u64 = e.parse().expect("an integer");
                assert!((1..=d).contains(&n), "d={d} j={j} u={u} -> {n}");
                let low = (d as f64 * (1.0 - j)).floor() as u64;
                assert!(n + 1 >= low.max(1), "d={d} j={j} u={u} -> {n}");
            }
        }
    }
}

// ---- copies -----------------------------------------------------------

const NOW: u64 = 1_700_000_000_123; // 2023-11-14T22:13:20.123Z

fn ctx<'a>(attempt: u32, error: &'a str) -> CopyContext<'a> {
    CopyContext {
        attempt,
        error,
        now_unix_ms: NOW,
        delivery_exchange: "orders-in",
        delivery_routing_key: "order.created",
        connection_user: "worker",
    }
}

fn full_properties(headers: FieldTable, expiration: Option<&str>) -> BasicProperties {
    let p = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_content_encoding("gzip".into())
        .with_headers(headers)
        .with_delivery_mode(1)
        .with_priority(7)
        .with_correlation_id("corr".into())
        .with_reply_to("replies".into())
        .with_message_id("m-1".into())
        .with_timestamp(1_600_000_000)
        .with_type("order".into())
        .with_user_id("worker".into())
        .with_app_id("shop".into())
        .with_cluster_id("c1".into());
    match expiration {
        Some(e) => p.with_expiration(e.into()),
        None => p,
    }
}

fn headers(p: &BasicProperties) -> &FieldTable {
    p.headers().as_ref().expect("a copy always has headers")
}

fn get<'a>(p: &'a BasicProperties, key: &str) -> Option<&'a AMQPValue> {
    headers(p).inner().get(key)
}

fn text<'a>(p: &'a BasicProperties, key: &str) -> &'a str {
    get(p, key)
        .and_then(as_str)
        .unwrap_or_else(|| panic!("no string {key}"))
}

fn history(p: &BasicProperties) -> Vec<(i64, String, String)> {
    let Some(AMQPValue::FieldArray(a)) = get(p, ERRORS_HEADER) else {
        panic!("no {ERRORS_HEADER} array");
    };
    a.as_slice()
        .iter()
        .map(|e| {
            let AMQPValue::FieldTable(t) = e else {
                panic!("entry is not a table")
            };
            assert_eq!(t.inner().len(), 3);
            let f = |k: &str| t.inner().get(k).and_then(as_str).expect(k).to_string();
            let Some(AMQPValue::LongLongInt(n)) = t.inner().get("attempt") else {
                panic!("attempt is not a long-long-int");
            };
            (*n, f("time"), f("error"))
        })
        .collect()
}

#[test]
fn copies_keep_every_property_but_expiration_and_headers() {
    let original = full_properties(field_table(vec![("trace", ls("t-1"))]), Some("200"));
    let c = ctx(1, "boom");
    let empty = FieldTable::default();
    let retried = retry_copy(&original, &c, Some("9500".into()));
    assert_eq!(
        retried.with_headers(empty.clone()),
        full_properties(empty.clone(), Some("9500")).with_delivery_mode(2)
    );
    let dead = dead_letter_copy(&original, &c, DeadLetterReason::Permanent, "orders", true);
    assert_eq!(
        dead.with_headers(empty.clone()),
        full_properties(empty, None).with_delivery_mode(2)
    );
}

#[test]
fn retry_copy_replaces_or_removes_expiration() {
    let original = full_properties(FieldTable::default(), Some("200"));
    let c = ctx(1, "x");
    assert_eq!(
        retry_copy(&original, &c, Some("9500".into())).expiration(),
        &Some("9500".into())
    );
    assert_eq!(retry_copy(&original, &c, None).expiration(), &None);
    // A value that cannot be a short string is left out, not a panic.
    assert_eq!(
        retry_copy(&original, &c, Some("9".repeat(300))).expiration(),
        &None
    );
}

#[test]
fn copies_are_persistent() {
    let c = ctx(1, "x");
    for original in [
        BasicProperties::default(),
        BasicProperties::default().with_delivery_mode(1),
        BasicProperties::default().with_delivery_mode(2),
    ] {
        assert_eq!(retry_copy(&original, &c, None).delivery_mode(), &Some(2));
        let dead = dead_letter_copy(&original, &c, DeadLetterReason::Exhausted, "q", true);
        assert_eq!(dead.delivery_mode(), &Some(2));
    }
}

#[test]
fn a_foreign_user_id_is_dropped_and_ours_kept() {
    let c = ctx(1, "x");
    let foreign = BasicProperties::default().with_user_id("someone".into());
    assert_eq!(retry_copy(&foreign, &c, None).user_id(), &None);
    let dead = dead_letter_copy(&foreign, &c, DeadLetterReason::Permanent, "q", true);
    assert_eq!(dead.user_id(), &None);
    let ours = BasicProperties::default().with_user_id("worker".into());
    assert_eq!(
        retry_copy(&ours, &c, None).user_id(),
        &Some("worker".into())
    );
    let dead = dead_letter_copy(&ours, &c, DeadLetterReason::Permanent, "q", true);
    assert_eq!(dead.user_id(), &Some("worker".into()));
    assert_eq!(
        retry_copy(&BasicProperties::default(), &c, None).user_id(),
        &None
    );
}

#[test]
fn copies_strip_the_broker_history_and_keep_other_headers() {
    let original = BasicProperties::default().with_headers(field_table(vec![
        (
            X_DEATH,
            array(vec![death(
                "orders.retry.1s",
                "expired",
                AMQPValue::LongLongInt(1),
            )]),
        ),
        ("x-first-death-queue", ls("orders.retry.1s")),
        ("x-first-death-reason", ls("expired")),
        ("x-first-death-exchange", ls("orders.retry")),
        ("x-last-death-queue", ls("orders.retry.1s")),
        ("x-last-death-reason", ls("expired")),
        ("x-last-death-exchange", ls("orders.retry")),
        ("x-delivery-count", AMQPValue::LongLongInt(3)),
        ("x-acquired-count", AMQPValue::LongLongInt(5)),
        ("x-deathly", ls("kept")),
        ("x-custom", AMQPValue::LongLongInt(9)),
        ("trace", ls("t-1")),
        (REPLAYED_HEADER, AMQPValue::LongLongInt(1)),
    ]));
    let c = ctx(2, "x");
    let retried = retry_copy(&original, &c, None);
    let dead = dead_letter_copy(&original, &c, DeadLetterReason::Exhausted, "orders", true);
    for copy in [&retried, &dead] {
        let keys: Vec<&str> = headers(copy).inner().keys().map(|k| k.as_str()).collect();
        for gone in [
            X_DEATH,
            "x-first-death-queue",
            "x-first-death-reason",
            "x-first-death-exchange",
            "x-last-death-queue",
            "x-last-death-reason",
            "x-last-death-exchange",
            "x-delivery-count",
            "x-acquired-count",
        ] {
            assert!(!keys.contains(&gone), "{gone} kept");
        }
        assert_eq!(get(copy, "x-deathly"), Some(&ls("kept")));
        assert_eq!(get(copy, "x-custom"), Some(&AMQPValue::LongLongInt(9)));
        assert_eq!(get(copy, "trace"), Some(&ls("t-1")));
        assert_eq!(get(copy, REPLAYED_HEADER), Some(&AMQPValue::LongLongInt(1)));
    }
    let mut retry_keys: Vec<&str> = headers(&retried)
        .inner()
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.starts_with(HEADER_PREFIX) && *k != REPLAYED_HEADER)
        .collect();
    retry_keys.sort_unstable();
    let mut expected = COPY_HEADERS.to_vec();
    expected.sort_unstable();
    assert_eq!(retry_keys, expected);
    // Each copy reads as its own history start.
    let c = count_attempt(headers(&retried).into(), &queues());
    assert_eq!((c.own, c.deaths, c.attempt), (Some(2), 0, 3));
}

#[test]
fn first_copy_writes_every_header() {
    let original = BasicProperties::default();
    let retried = retry_copy(&original, &ctx(1, "connection refused"), None);
    assert_eq!(
        get(&retried, ATTEMPT_HEADER),
        Some(&AMQPValue::LongLongInt(1))
    );
    assert_eq!(
        text(&retried, FIRST_FAILED_AT_HEADER),
        "2023-11-14T22:13:20.123Z"
    );
    assert_eq!(text(&retried, LAST_ERROR_HEADER), "connection refused");
    assert_eq!(
        history(&retried),
        vec![(
            1,
            "2023-11-14T22:13:20.123Z".into(),
            "connection refused".into()
        )]
    );
    assert_eq!(text(&retried, ORIGINAL_EXCHANGE_HEADER), "orders-in");
    assert_eq!(text(&retried, ORIGINAL_ROUTING_KEY_HEADER), "order.created");
    assert_eq!(get(&retried, REASON_HEADER), None);
    assert_eq!(get(&retried, DEAD_LETTERED_AT_HEADER), None);
    assert_eq!(get(&retried, SOURCE_QUEUE_HEADER), None);
    // Strings are long strings.
    assert!(matches!(
        get(&retried, LAST_ERROR_HEADER),
        Some(AMQPValue::LongString(_))
    ));
}

/// A later delivery of `copy`, back from a retry queue.
fn redelivered(copy: &BasicProperties) -> BasicProperties {
    copy.clone()
}

fn later<'a>(attempt: u32, error: &'a str, at: u64) -> CopyContext<'a> {
    CopyContext {
        attempt,
        error,
        now_unix_ms: at,
        delivery_exchange: "",
        delivery_routing_key: "orders",
        connection_user: "worker",
    }
}

#[test]
fn later_copies_keep_first_failure_and_original_route() {
    let first = retry_copy(&BasicProperties::default(), &ctx(1, "e1"), None);
    let second = retry_copy(&redelivered(&first), &later(2, "e2", NOW + 1000), None);
    assert_eq!(
        get(&second, ATTEMPT_HEADER),
        Some(&AMQPValue::LongLongInt(2))
    );
    assert_eq!(
        text(&second, FIRST_FAILED_AT_HEADER),
        "2023-11-14T22:13:20.123Z"
    );
    assert_eq!(text(&second, LAST_ERROR_HEADER), "e2");
    assert_eq!(text(&second, ORIGINAL_EXCHANGE_HEADER), "orders-in");
    assert_eq!(text(&second, ORIGINAL_ROUTING_KEY_HEADER), "order.created");
    assert_eq!(
        history(&second),
        vec![
            (1, "2023-11-14T22:13:20.123Z".into(), "e1".into()),
            (2, "2023-11-14T22:13:21.123Z".into(), "e2".into()),
        ]
    );
    assert_eq!(
        original_exchange_and_key(headers(&second).into(), "", "orders"),
        ("orders-in".to_string(), "order.created".to_string())
    );
}

#[test]
fn malformed_first_failed_at_is_replaced() {
    for bad in [
        AMQPValue::LongLongInt(5),
        ls(&"9".repeat(65)),
        AMQPValue::Void,
    ] {
        let original = BasicProperties::default()
            .with_headers(field_table(vec![(FIRST_FAILED_AT_HEADER, bad)]));
        let copy = retry_copy(&original, &ctx(1, "x"), None);
        assert_eq!(
            text(&copy, FIRST_FAILED_AT_HEADER),
            "2023-11-14T22:13:20.123Z"
        );
    }
    let original = BasicProperties::default()
        .with_headers(field_table(vec![(FIRST_FAILED_AT_HEADER, ss("yesterday"))]));
    let copy = retry_copy(&original, &ctx(1, "x"), None);
    assert_eq!(text(&copy, FIRST_FAILED_AT_HEADER), "yesterday");
}

#[test]
fn original_route_headers_fall_back_one_by_one() {
    let h = |entries: Vec<(&str, AMQPValue)>| Some(field_table(entries));
    let (e, k) = ("", "orders");
    let read = |t: Option<FieldTable>| original_exchange_and_key(t.as_ref(), e, k);
    assert_eq!(read(None), ("".into(), "orders".into()));
    assert_eq!(
        read(h(vec![(ORIGINAL_EXCHANGE_HEADER, ss("ex"))])),
        ("ex".into(), "orders".into())
    );
    assert_eq!(
        read(h(vec![
            (ORIGINAL_EXCHANGE_HEADER, AMQPValue::LongLongInt(1)),
            (ORIGINAL_ROUTING_KEY_HEADER, ls("rk")),
        ])),
        ("".into(), "rk".into())
    );
    // The default exchange is a valid original.
    assert_eq!(
        original_exchange_and_key(
            Some(&field_table(vec![(ORIGINAL_EXCHANGE_HEADER, ls(""))])),
            "other",
            "k"
        ),
        ("".into(), "k".into())
    );
    // Too long for a name: absent.
    assert_eq!(
        read(h(vec![(ORIGINAL_EXCHANGE_HEADER, ls(&"x".repeat(256)))])),
        ("".into(), "orders".into())
    );
    // Not UTF-8 (RabbitMQ passes routing keys through as bytes): kept as
    // the bytes, held as lapin holds a short string.
    let bad = crate::values::shortstr::from_raw_bytes(&[0xff, 0xfe]);
    assert_eq!(
        read(h(vec![(
            ORIGINAL_ROUTING_KEY_HEADER,
            AMQPValue::LongString(LongString::from(vec![0xffu8, 0xfe]))
        )])),
        ("".into(), bad.clone())
    );
    // A delivery's routing key that is not UTF-8 is the fallback as it is,
    // and a copy writes the header as the bytes.
    let (_, key) = original_exchange_and_key(None, "", &bad);
    assert_eq!(key, bad);
    let ctx = CopyContext {
        attempt: 1,
        error: "e",
        now_unix_ms: 0,
        delivery_exchange: "",
        delivery_routing_key: &bad,
        connection_user: "guest",
    };
    let copy = retry_copy(&BasicProperties::default(), &ctx, None);
    assert_eq!(
        copy.headers()
            .as_ref()
            .unwrap()
            .inner()
            .get(ORIGINAL_ROUTING_KEY_HEADER),
        Some(&AMQPValue::LongString(LongString::from(vec![0xffu8, 0xfe])))
    );
}

#[test]
fn last_error_is_cut_at_one_kib_on_a_char_boundary() {
    let error = "€".repeat(1000); // 3 bytes each
    let copy = retry_copy(&BasicProperties::default(), &ctx(1, &error), None);
    let last = text(&copy, LAST_ERROR_HEADER);
    assert_eq!(last.len(), 1023);
    assert!(error.starts_with(last));
    let error = "a".repeat(5000);
    let copy = retry_copy(&BasicProperties::default(), &ctx(1, &error), None);
    assert_eq!(text(&copy, LAST_ERROR_HEADER).len(), MAX_LAST_ERROR_BYTES);
    let error = "é".repeat(512); // exactly 1024 bytes
    let copy = retry_copy(&BasicProperties::default(), &ctx(1, &error), None);
    assert_eq!(text(&copy, LAST_ERROR_HEADER), error);
}

#[test]
fn truncation_never_splits_a_character() {
    let s = "a€😀é";
    let cuts: Vec<&str> = (0..=s.len() + 1).map(|n| truncate_utf8(s, n)).collect();
    assert_eq!(
        cuts,
        [
            "",
            "a",
            "a",
            "a",
            "a€",
            "a€",
            "a€",
            "a€",
            "a€😀",
            "a€😀",
            "a€😀é",
            "a€😀é"
        ]
    );
}

#[test]
fn error_history_keeps_the_last_five_oldest_first() {
    let error = "😀".repeat(100); // 400 bytes, 4 per char
    let mut props = BasicProperties::default();
    for attempt in 1..=7 {
        props = retry_copy(
            &props,
            &later(attempt, &error, NOW + u64::from(attempt)),
            None,
        );
    }
    let h = history(&props);
    assert_eq!(h.iter().map(|e| e.0).collect::<Vec<_>>(), [3, 4, 5, 6, 7]);
    assert_eq!(h[0].1, "2023-11-14T22:13:20.126Z");
    for (_, _, e) in &h {
        assert_eq!(e.len(), 256);
        assert!(error.starts_with(e.as_str()));
    }
    let error = "€".repeat(100); // 300 bytes: cut to 255
    let copy = retry_copy(&BasicProperties::default(), &ctx(1, &error), None);
    assert_eq!(history(&copy)[0].2.len(), 255);
}

#[test]
fn a_malformed_error_history_starts_fresh() {
    for bad in [
        ls("not an array"),
        AMQPValue::LongLongInt(3),
        AMQPValue::FieldTable(FieldTable::default()),
        array(vec![ls("x"), AMQPValue::Void]),
    ] {
        let original = BasicProperties::default()
            .with_headers(field_table(vec![(ERRORS_HEADER, bad.clone())]));
        let copy = retry_copy(&original, &ctx(2, "e2"), None);
        assert_eq!(
            history(&copy),
            vec![(2, "2023-11-14T22:13:20.123Z".into(), "e2".into())],
            "{bad:?}"
        );
    }
}

#[test]
fn well_formed_history_entries_survive_malformed_neighbours() {
    let entry = |attempt: AMQPValue, time: AMQPValue, error: AMQPValue| {
        AMQPValue::FieldTable(field_table(vec![
            ("attempt", attempt),
            ("time", time),
            ("error", error),
        ]))
    };
    let good = entry(AMQPValue::ShortShortUInt(1), ss("t1"), ls(&"x".repeat(300)));
    let entries = vec![
        good,
        entry(ls("1"), ls("t"), ls("e")),
        entry(AMQPValue::LongLongInt(1), AMQPValue::Timestamp(1), ls("e")),
        entry(AMQPValue::LongLongInt(1), ls(&"t".repeat(65)), ls("e")),
        entry(AMQPValue::LongLongInt(1), ls("t"), AMQPValue::Void),
        AMQPValue::FieldTable(field_table(vec![("attempt", AMQPValue::LongLongInt(1))])),
        entry(
            AMQPValue::LongInt(4),
            ls("t4"),
            AMQPValue::LongString(LongString::from(vec![b'o', 0xff, b'k'])),
        ),
    ];
    let original =
        BasicProperties::default().with_headers(field_table(vec![(ERRORS_HEADER, array(entries))]));
    let copy = retry_copy(&original, &ctx(5, "e5"), None);
    assert_eq!(
        history(&copy),
        vec![
            (1, "t1".into(), "x".repeat(256)),
            (4, "t4".into(), "o\u{fffd}k".into()),
            (5, "2023-11-14T22:13:20.123Z".into(), "e5".into()),
        ]
    );
}

#[test]
fn dead_letter_copy_adds_reason_time_and_source() {
    let first = retry_copy(
        &BasicProperties::default(),
        &ctx(1, "e1"),
        Some("900".into()),
    );
    let dead = dead_letter_copy(
        &redelivered(&first),
        &later(2, "final", NOW + 60_000),
        DeadLetterReason::Exhausted,
        "orders",
        true,
    );
    assert_eq!(dead.expiration(), &None);
    assert_eq!(text(&dead, REASON_HEADER), "exhausted");
    assert_eq!(
        text(&dead, DEAD_LETTERED_AT_HEADER),
        "2023-11-14T22:14:20.123Z"
    );
    assert_eq!(text(&dead, SOURCE_QUEUE_HEADER), "orders");
    assert_eq!(text(&dead, LAST_ERROR_HEADER), "final");
    assert_eq!(
        text(&dead, FIRST_FAILED_AT_HEADER),
        "2023-11-14T22:13:20.123Z"
    );
    assert_eq!(text(&dead, ORIGINAL_EXCHANGE_HEADER), "orders-in");
    assert_eq!(get(&dead, ATTEMPT_HEADER), Some(&AMQPValue::LongLongInt(2)));
    assert_eq!(
        history(&dead).iter().map(|e| e.0).collect::<Vec<_>>(),
        [1, 2]
    );
    let dead = dead_letter_copy(
        &BasicProperties::default(),
        &ctx(1, "bad input"),
        DeadLetterReason::Permanent,
        "orders",
        true,
    );
    assert_eq!(text(&dead, REASON_HEADER), "permanent");
    assert_eq!(history(&dead).len(), 1);
    // A second dead-lettering overwrites the previous reason.
    let again = dead_letter_copy(&dead, &ctx(1, "x"), DeadLetterReason::Exhausted, "o2", true);
    assert_eq!(text(&again, REASON_HEADER), "exhausted");
    assert_eq!(text(&again, SOURCE_QUEUE_HEADER), "o2");
}

#[test]
fn dead_letter_without_a_run_keeps_the_history() {
    let first = retry_copy(&BasicProperties::default(), &ctx(1, "e1"), None);
    let dead = dead_letter_copy(
        &first,
        &later(1, "attempts already spent", NOW + 5),
        DeadLetterReason::Exhausted,
        "orders",
        false,
    );
    assert_eq!(history(&dead), history(&first));
    assert_eq!(text(&dead, LAST_ERROR_HEADER), "attempts already spent");
}

#[test]
fn written_headers_stay_under_eight_kib() {
    let huge_error = "€".repeat(1 << 20);
    let name = "n".repeat(255);
    let hostile_entry = AMQPValue::FieldTable(field_table(vec![
        ("attempt", AMQPValue::LongLongInt(i64::MAX)),
        ("time", ls(&"9".repeat(64))),
        ("error", ls(&"e".repeat(100_000))),
    ]));
    let original = BasicProperties::default().with_headers(field_table(vec![
        (ERRORS_HEADER, array(vec![hostile_entry; 50])),
        (FIRST_FAILED_AT_HEADER, ls(&"9".repeat(64))),
        (ORIGINAL_EXCHANGE_HEADER, ls(&name)),
        (ORIGINAL_ROUTING_KEY_HEADER, ls(&name)),
    ]));
    let c = CopyContext {
        attempt: u32::MAX,
        error: &huge_error,
        now_unix_ms: u64::MAX,
        delivery_exchange: &name,
        delivery_routing_key: &name,
        connection_user: "worker",
    };
    let mut copies = vec![
        retry_copy(&original, &c, None),
        dead_letter_copy(&original, &c, DeadLetterReason::Exhausted, &name, true),
        dead_letter_copy(
            &BasicProperties::default(),
            &c,
            DeadLetterReason::Permanent,
            &"q".repeat(10_000),
            true,
        ),
    ];
    let mut p = BasicProperties::default();
    for _ in 0..10 {
        p = retry_copy(&p, &c, None);
    }
    copies.push(dead_letter_copy(
        &p,
        &c,
        DeadLetterReason::Exhausted,
        &name,
        true,
    ));
    for copy in &copies {
        let size = written_headers_size(headers(copy));
        assert!(size < MAX_ADDED_HEADERS_BYTES, "{size} bytes");
        assert!(size > 2000, "{size}: the test feeds big values"); // guards the test
                                                                   // The estimate is the real encoding: compare with lapin's encoder.
        let mut only_written = FieldTable::default();
        for (k, v) in headers(copy) {
            if WRITTEN_HEADERS.contains(&k.as_str()) {
                only_written.insert(k.clone(), v.clone());
            }
        }
        let encoded =
            amq_protocol::types::generation::gen_field_table(&only_written)(Vec::new().into())
                .expect("encodes");
        assert_eq!(usize::try_from(encoded.position).ok(), Some(size + 4));
    }
}

#[test]
fn times_are_rfc3339_utc_with_milliseconds() {
    assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339_millis(NOW), "2023-11-14T22:13:20.123Z");
    assert_eq!(rfc3339_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(rfc3339_millis(951_868_799_999), "2000-02-29T23:59:59.999Z");
    assert_eq!(
        rfc3339_millis(4_107_542_400_000),
        "2100-03-01T00:00:00.000Z"
    );
    assert_eq!(
        rfc3339_millis(253_402_300_799_999),
        "9999-12-31T23:59:59.999Z"
    );
    assert!(rfc3339_millis(u64::MAX).ends_with(".615Z"));
}

// ---- headers_to_json ---------------------------------------------------

#[test]
fn headers_to_json_maps_every_type() {
    use serde_json::json;
    let h = field_table(vec![
        ("bool", AMQPValue::Boolean(true)),
        ("i8", AMQPValue::ShortShortInt(-8)),
        ("u8", AMQPValue::ShortShortUInt(8)),
        ("i16", AMQPValue::ShortInt(-16)),
        ("u16", AMQPValue::ShortUInt(16)),
        ("i32", AMQPValue::LongInt(-32)),
        ("u32", AMQPValue::LongUInt(u32::MAX)),
        ("i64", AMQPValue::LongLongInt(i64::MIN)),
        ("f32", AMQPValue::Float(1.5)),
        ("f64", AMQPValue::Double(-2.25)),
        ("nan", AMQPValue::Double(f64::NAN)),
        ("inf", AMQPValue::Float(f32::INFINITY)),
        (
            "dec",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 12345,
            }),
        ),
        (
            "dec-max",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 255,
                value: u32::MAX,
            }),
        ),
        (
            "dec-neg",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 1,
                value: (-15i32) as u32,
            }),
        ),
        ("short", ss("s")),
        ("long", ls("l")),
        (
            "bad-utf8",
            AMQPValue::LongString(LongString::from(vec![b'a', 0xff])),
        ),
        ("ts", AMQPValue::Timestamp(1_700_000_000)),
        (
            "bytes",
            AMQPValue::ByteArray(ByteArray::from(vec![0u8, 1, 255])),
        ),
        ("void", AMQPValue::Void),
        (
            "array",
            array(vec![
                AMQPValue::LongLongInt(1),
                ls("two"),
                array(vec![AMQPValue::Void]),
            ]),
        ),
        (
            "table",
            AMQPValue::FieldTable(field_table(vec![(
                "inner",
                AMQPValue::FieldTable(field_table(vec![("k", AMQPValue::Boolean(false))])),
            )])),
        ),
    ]);
    let v = headers_to_json(Some(&h));
    assert_eq!(
        v,
        json!({
            "bool": true, "i8": -8, "u8": 8, "i16": -16, "u16": 16, "i32": -32,
            "u32": 4_294_967_295u64, "i64": i64::MIN, "f32": 1.5, "f64": -2.25,
            "nan": null, "inf": null, "dec": 123.45, "dec-max": -1e-255, "dec-neg": -1.5,
            "short": "s", "long": "l", "bad-utf8": {"base64": "Yf8="}, "ts": 1_700_000_000,
            "bytes": [0, 1, 255], "void": null,
            "array": [1, "two", [null]],
            "table": {"inner": {"k": false}},
        })
    );
    // It serializes (what the handler's environment gets).
    assert!(serde_json::to_string(&v).is_ok());
}

#[test]
fn headers_to_json_gives_bytes_that_are_not_utf8_as_base64() {
    use crate::values::shortstr::from_raw_bytes;
    use serde_json::json;
    // Keys as the patched parser holds them when received as these bytes.
    let bad_key = from_raw_bytes(b"\xff\xfekey");
    let inner_bad_key = from_raw_bytes(b"k\xc3");
    let mut h = field_table(vec![
        ("plain", ls("v")),
        ("base64:looks-escaped", ls("x")),
        (
            "short-bad",
            AMQPValue::ShortString(from_raw_bytes(b"\xff").into()),
        ),
        ("short-good", ss("é")),
        (
            "nested",
            AMQPValue::FieldTable(field_table(vec![(inner_bad_key.as_str(), ls("in"))])),
        ),
    ]);
    h.insert(
        bad_key.as_str().into(),
        AMQPValue::LongString(LongString::from(vec![0xc3u8, 0x28])),
    );
    let v = headers_to_json(Some(&h));
    assert_eq!(
        v,
        json!({
            "plain": "v",
            "base64:YmFzZTY0Omxvb2tzLWVzY2FwZWQ=": "x",
            "short-bad": {"base64": "/w=="},
            "short-good": "é",
            "nested": {"base64:a8M=": "in"},
            "base64://5rZXk=": {"base64": "wyg="},
        })
    );
    // Reversible: the key's bytes come back from its base64.
    let key = v
        .as_object()
        .unwrap()
        .keys()
        .find(|k| k.starts_with("base64://"))
        .unwrap();
    assert_eq!(
        crate::values::shortstr::from_base64(&key[BASE64_KEY_PREFIX.len()..]).unwrap(),
        b"\xff\xfekey"
    );
}

#[test]
fn headers_to_json_of_nothing_is_an_empty_object() {
    assert_eq!(headers_to_json(None), serde_json::json!({}));
    assert_eq!(
        headers_to_json(Some(&FieldTable::default())),
        serde_json::json!({})
    );
}

#[test]
fn deep_nesting_is_cut_to_null() {
    let mut v = AMQPValue::LongLongInt(1);
    for _ in 0..200 {
        v = array(vec![v]);
    }
    let json = headers_to_json(Some(&field_table(vec![("deep", v)])));
    let mut depth = 0;
    let mut cur = &json["deep"];
    while let serde_json::Value::Array(a) = cur {
        depth += 1;
        cur = &a[0];
    }
    assert_eq!(cur, &serde_json::Value::Null);
    assert_eq!(depth, MAX_JSON_DEPTH);
}
