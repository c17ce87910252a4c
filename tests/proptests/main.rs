//! Property tests of the pure core (proptest): the rules hold, and no
//! input panics. Case counts are bounded so the suite stays fast; there
//! are no timing assertions.

use dlqctl::core::handling::outcome::Outcome;
use dlqctl::core::retry::{
    count_attempt, decide, headers_to_json, jitter_expiration, DeadLetterReason, Decision, Spare,
};
use dlqctl::core::topology::{parse_topology, RetryPolicy};
use dlqctl::core::values::duration::{parse_millis, tier_name};
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use proptest::prelude::*;
use std::time::Duration;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ------------------------------------------------------------ generators

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("x-death".to_string()),
        Just("dlqctl-attempt".to_string()),
        Just("count".to_string()),
        Just("queue".to_string()),
        Just("reason".to_string()),
        "[a-z-]{0,12}",
        "\\PC{0,8}",
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("expired".to_string()),
        Just("rejected".to_string()),
        Just("orders.retry.1s".to_string()),
        Just("orders.retry.10s".to_string()),
        "\\PC{0,16}",
    ]
}

/// Every AMQP value type, nested up to a few levels.
fn amqp_value() -> impl Strategy<Value = AMQPValue> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<f32>().prop_map(AMQPValue::Float),
        any::<f64>().prop_map(AMQPValue::Double),
        (any::<u8>(), any::<u32>())
            .prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
        text().prop_map(|s| AMQPValue::ShortString(ShortString::from(s))),
        text().prop_map(|s| AMQPValue::LongString(LongString::from(s))),
        proptest::collection::vec(any::<u8>(), 0..16)
            .prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        proptest::collection::vec(any::<u8>(), 0..16)
            .prop_map(|b| AMQPValue::ByteArray(ByteArray::from(b))),
        Just(AMQPValue::Void),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6)
                .prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            proptest::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| AMQPValue::FieldTable(table(kv))),
        ]
    })
}

fn table(kv: Vec<(String, AMQPValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in kv {
        t.insert(ShortString::from(k), v);
    }
    t
}

fn headers() -> impl Strategy<Value = FieldTable> {
    proptest::collection::vec((key(), amqp_value()), 0..8).prop_map(table)
}

fn retry_queues() -> Vec<String> {
    vec!["orders.retry.1s".into(), "orders.retry.10s".into()]
}

fn death(queue: &str, count: i64) -> AMQPValue {
    AMQPValue::FieldTable(table(vec![
        ("queue".into(), AMQPValue::LongString(queue.into())),
        ("reason".into(), AMQPValue::LongString("expired".into())),
        ("count".into(), AMQPValue::LongLongInt(count)),
    ]))
}

fn policy() -> impl Strategy<Value = RetryPolicy> {
    (
        proptest::collection::vec(1u64..=4_294_967_295, 1..8),
        1u32..=30,
        0.0f64..=0.5,
    )
        .prop_map(|(delays, max_attempts, jitter)| RetryPolicy {
            delays,
            max_attempts,
            jitter,
        })
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Success),
        "\\PC{0,8}".prop_map(Outcome::permanent),
        "\\PC{0,8}".prop_map(Outcome::transient),
        "\\PC{0,8}".prop_map(Outcome::timed_out),
        (0u64..10_000_000_000).prop_map(|ms| Outcome::Transient {
            error: "later".into(),
            retry_after: Some(Duration::from_millis(ms)),
        }),
    ]
}

// ------------------------------------------------------------ properties

proptest! {
    #![proptest_config(config(2000))]

    /// The table of docs/worker.md ("Attempts and decisions"), for every
    /// outcome, attempt and policy.
    #[test]
    fn decide_follows_the_table(p in policy(), attempt in prop_oneof![0u32..40, any::<u32>()], o in outcome()) {
        let d = decide(&p, attempt, &o);
        match &o {
            Outcome::Success => prop_assert_eq!(d, Decision::Ack),
            Outcome::Permanent { .. } => prop_assert_eq!(d, Decision::DeadLetter { reason: DeadLetterReason::Permanent }),
            // A timeout is decided like a transient failure without a hint.
            Outcome::TimedOut { .. } => prop_assert_eq!(d, decide(&p, attempt, &Outcome::transient(""))),
            Outcome::Transient { retry_after, .. } => {
                if attempt >= p.max_attempts {
                    prop_assert_eq!(d, Decision::DeadLetter { reason: DeadLetterReason::Exhausted });
                } else {
                    let row = p.delays[(attempt.max(1) as usize).min(p.delays.len()) - 1];
                    let Decision::Retry { delay_ms } = d else {
                        return Err(TestCaseError::fail(format!("{d:?} for a transient failure before the last attempt")));
                    };
                    prop_assert!(p.delays.contains(&delay_ms), "{delay_ms} is not a tier");
                    match retry_after {
                        None => prop_assert_eq!(delay_ms, row),
                        Some(_) => {
                            let largest = p.tiers().last().copied().unwrap_or(row);
                            prop_assert!(delay_ms >= row || delay_ms == largest);
                        }
                    }
                }
            }
        }
    }

    /// Any headers at all: no panic, attempt ≥ 1, and attempt = max(H, D) + 1.
    #[test]
    fn count_attempt_never_panics(h in headers()) {
        let c = count_attempt(Some(&h), &retry_queues());
        prop_assert!(c.attempt >= 1);
        let runs = u64::from(c.own.unwrap_or(0)).max(c.deaths);
        prop_assert_eq!(u64::from(c.attempt), runs.saturating_add(1).min(u64::from(u32::MAX)));
        prop_assert!(c.warnings.len() <= 11);
    }

    /// More runs recorded in H or in D never lower the attempt.
    #[test]
    fn count_attempt_is_monotonic_in_h_and_d(
        h in headers(),
        own in 0i64..1_000_000,
        extra_own in 0i64..1_000_000,
        count in 0i64..1_000_000,
        extra_count in 0i64..1_000_000,
    ) {
        let with = |own: i64, count: i64| {
            let mut t = h.clone();
            t.insert("dlqctl-attempt".into(), AMQPValue::LongLongInt(own));
            t.insert("x-death".into(), AMQPValue::FieldArray(FieldArray::from(vec![death("orders.retry.1s", count)])));
            count_attempt(Some(&t), &retry_queues()).attempt
        };
        let base = with(own, count);
        prop_assert!(with(own + extra_own, count) >= base);
        prop_assert!(with(own, count + extra_count) >= base);
    }

    /// The jittered expiration is a decimal integer within the tier's band.
    #[test]
    fn jitter_expiration_stays_in_its_band(
        tier in 1u64..=4_294_967_295,
        jitter in prop_oneof![0.0f64..=0.5, any::<f64>()],
        u in prop_oneof![0.0f64..1.0, any::<f64>()],
    ) {
        match jitter_expiration(tier, jitter, u) {
            None => prop_assert!(jitter.is_nan() || jitter <= 0.0),
            Some(s) => {
                prop_assert!(s.bytes().all(|b| b.is_ascii_digit()), "{s}");
                let v: u64 = s.parse().map_err(|e| TestCaseError::fail(format!("{s}: {e}")))?;
                prop_assert!(v >= 1 && v <= tier, "{v} outside 1..={tier}");
                let j = jitter.clamp(0.0, 1.0);
                let lowest = (tier as f64 * (1.0 - j)).floor() as u64;
                prop_assert!(v + 1 >= lowest.max(1), "{v} below the band's floor {lowest}");
            }
        }
    }

    /// A tier's name parses back to its duration.
    #[test]
    fn tier_names_round_trip(ms in prop_oneof![1u64..=4_294_967_295, (1u64..=49_710).prop_map(|d| d * 86_400_000)]) {
        let name = tier_name(ms);
        prop_assert_eq!(parse_millis(&name).ok(), Some(ms), "{}", name);
    }

    /// Header JSON: every AMQP type converts, the keys are kept, and the
    /// result serialises.
    #[test]
    fn headers_to_json_handles_every_type(h in headers()) {
        let json = headers_to_json(Some(&h));
        let obj = json.as_object().ok_or_else(|| TestCaseError::fail("not an object"))?;
        prop_assert_eq!(obj.len(), h.inner().len());
        prop_assert!(serde_json::to_string(&json).is_ok());
    }

    /// A refused copy is published again from its spare: the properties
    /// read back encode to the same bytes (compared encoded, since a NaN
    /// float is not equal to itself), and equal the original otherwise.
    #[test]
    fn a_spare_reads_back_the_properties_it_was_made_of(
        h in headers(),
        id in proptest::collection::vec(any::<u8>(), 0..255),
        expiration in proptest::option::of("[0-9]{1,9}"),
    ) {
        let mut props = lapin::BasicProperties::default()
            .with_headers(as_on_the_wire(h))
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(dlqctl::core::values::shortstr::from_raw_bytes(&id)));
        if let Some(e) = expiration {
            props = props.with_expiration(ShortString::from(e));
        }
        let spare = Spare::of(&props);
        let back = spare.read().ok_or_else(|| TestCaseError::fail("not read back"))?;
        prop_assert_eq!(&Spare::of(&back), &spare);
        if !format!("{props:?}").contains("NaN") {
            prop_assert_eq!(back, props);
        }
    }
}

/// `t` with its short-string values (which lapin holds only for its own
/// use: the wire has no type for them, and no delivery carries one) as
/// long strings, at any depth.
fn as_on_the_wire(t: FieldTable) -> FieldTable {
    fn value(v: AMQPValue) -> AMQPValue {
        match v {
            AMQPValue::ShortString(s) => AMQPValue::LongString(LongString::from(s.as_str())),
            AMQPValue::FieldTable(t) => AMQPValue::FieldTable(as_on_the_wire(t)),
            AMQPValue::FieldArray(a) => AMQPValue::FieldArray(FieldArray::from(
                a.as_slice().iter().cloned().map(value).collect::<Vec<_>>(),
            )),
            v => v,
        }
    }
    let mut out = FieldTable::default();
    for (k, v) in t.inner() {
        out.insert(k.clone(), value(v.clone()));
    }
    out
}

fn example_files() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/topology");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("topology/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            out.push(std::fs::read_to_string(&path).expect("example file"));
        }
    }
    assert!(!out.is_empty(), "no example topology files");
    out
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize, usize),
    Insert(usize, String),
    Replace(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1usize..20).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (
            any::<usize>(),
            prop_oneof![
                Just(": ".to_string()),
                Just("\n  - ".to_string()),
                Just("[".to_string()),
                Just("{".to_string()),
                Just("-1".to_string()),
                Just("99999999999999999999999".to_string()),
                Just("&a *a".to_string()),
                Just("!!binary".to_string()),
                "\\PC{0,12}",
            ]
        )
            .prop_map(|(a, s)| Mutation::Insert(a, s)),
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Replace(a, b)),
    ]
}

fn apply(text: &str, muts: &[Mutation]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for m in muts {
        let len = bytes.len().max(1);
        match m {
            Mutation::Delete(a, n) => {
                let a = a % len;
                let end = (a + n).min(bytes.len());
                if a < end {
                    bytes.drain(a..end);
                }
            }
            Mutation::Insert(a, s) => {
                let a = a % (bytes.len() + 1);
                bytes.splice(a..a, s.bytes());
            }
            Mutation::Replace(a, b) => {
                if !bytes.is_empty() {
                    let a = a % bytes.len();
                    bytes[a] = *b;
                }
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    #![proptest_config(config(300))]

    /// The parser never panics on arbitrary text (capped at 2 KiB).
    #[test]
    fn the_topology_parser_never_panics_on_arbitrary_text(text in "\\PC{0,2048}") {
        let _ = parse_topology(&text, "arbitrary.yaml");
    }

    /// Nor on the example files with a few bytes deleted, inserted or
    /// replaced.
    #[test]
    fn the_topology_parser_never_panics_on_mutated_examples(
        which in any::<usize>(),
        muts in proptest::collection::vec(mutation(), 1..6),
    ) {
        let files = example_files();
        let text = apply(&files[which % files.len()], &muts);
        match parse_topology(&text, "mutated.yaml") {
            Ok(t) => prop_assert!(!t.pipelines.is_empty() || text.contains("pipelines")),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// The error fingerprint never panics, and normalising twice changes
    /// nothing (a normalised error is its own group's key); errors that
    /// differ only in a number share a group.
    #[test]
    fn fingerprints_are_total_and_idempotent(
        text in "[ -~\\n\\té€0-9a-fx'\"`-]{0,80}",
        a in any::<u32>(),
        b in any::<u32>(),
    ) {
        let once = dlqctl::core::dlq::fingerprint::normalise(&text);
        prop_assert_eq!(dlqctl::core::dlq::fingerprint::normalise(&once), once.clone());
        let with = |n: u32| dlqctl::core::dlq::fingerprint::normalise(&format!("order {n} of {text}"));
        prop_assert_eq!(with(a), with(b));
    }
}
