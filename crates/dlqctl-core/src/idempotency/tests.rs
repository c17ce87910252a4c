use super::*;
use amq_protocol::types::{FieldTable, LongString, ShortString};

fn props(id: Option<&[u8]>, headers: &[(&str, AMQPValue)]) -> BasicProperties {
    let mut p = BasicProperties::default();
    if let Some(id) = id {
        // Short strings are bytes on the wire (see core::values::shortstr).
        p = p.with_message_id(ShortString::from(crate::values::shortstr::from_raw_bytes(
            id,
        )));
    }
    if !headers.is_empty() {
        let mut t = FieldTable::default();
        for (k, v) in headers {
            t.insert((*k).into(), v.clone());
        }
        p = p.with_headers(t);
    }
    p
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

#[test]
fn keys_parse_and_x_and_dlqctl_headers_are_refused() {
    assert_eq!(KeySource::parse("message_id"), Ok(KeySource::MessageId));
    assert_eq!(KeySource::parse("body_sha256"), Ok(KeySource::BodySha256));
    assert_eq!(
        KeySource::parse("header:order-id"),
        Ok(KeySource::Header("order-id".into()))
    );
    for bad in [
        "header:x-death",
        "header:X-Trace",
        "header:dlqctl-attempt",
        "header:DLQCTL-reason",
    ] {
        let e = KeySource::parse(bad).unwrap_err();
        assert!(e.contains("x-* or dlqctl-*"), "{bad}: {e}");
    }
    assert!(KeySource::parse("header:")
        .unwrap_err()
        .contains("needs a header name"));
    assert!(KeySource::parse("id").unwrap_err().contains("not `id`"));
    for k in ["message_id", "body_sha256", "header:order-id"] {
        assert_eq!(KeySource::parse(k).unwrap().text(), k);
    }
}

#[test]
fn stores_parse_and_passwords_never_show() {
    assert_eq!(
        StoreSpec::parse("sqlite:/var/lib/dlqctl/orders.db"),
        Ok(StoreSpec::Sqlite(Some("/var/lib/dlqctl/orders.db".into())))
    );
    assert_eq!(
        StoreSpec::parse("env:DLQCTL_STORE"),
        Ok(StoreSpec::Env("DLQCTL_STORE".into()))
    );
    assert!(StoreSpec::parse("env:").is_err());
    assert!(StoreSpec::parse("env:A-B").is_err());
    assert!(StoreSpec::parse("sqlite:").is_err());
    let r = StoreSpec::parse("rediss://:s3cret@cache:6380/2").unwrap();
    assert!(r.has_inline_password());
    assert!(!StoreSpec::parse("redis://cache:6379/0")
        .unwrap()
        .has_inline_password());
    assert!(!StoreSpec::parse("redis://user@cache:6379/0")
        .unwrap()
        .has_inline_password());
    let e = StoreSpec::parse("postgres://u:hunter2@db/x").unwrap_err();
    assert!(!e.contains("hunter2"), "{e}");
    assert!(e.contains("postgres://u:***@db/x"), "{e}");
    assert_eq!(redact_url("redis://u:p@h:1/0"), "redis://u:***@h:1/0");
    assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
    // An @ after the host may end a password with a raw `/` in it: in
    // doubt, everything after its first `:` is hidden (values::redact).
    assert_eq!(redact_url("redis://h:1/0?x=a:b@c"), "redis://h:***@c");
    assert!(StoreSpec::parse("redis://h:1/0?password=s3cret")
        .unwrap()
        .has_inline_password());
}

#[test]
fn a_key_is_raw_bytes_and_an_empty_one_is_none() {
    let id = props(Some(&[0xff, 0x00, b'a']), &[]);
    assert_eq!(
        key_of(&KeySource::MessageId, &id, b""),
        Some(vec![0xff, 0x00, b'a'])
    );
    assert_eq!(
        key_of(&KeySource::MessageId, &props(Some(b""), &[]), b""),
        None
    );
    assert_eq!(key_of(&KeySource::MessageId, &props(None, &[]), b""), None);
    let h = KeySource::Header("order-id".into());
    assert_eq!(
        key_of(&h, &props(None, &[("order-id", long("o-1"))]), b""),
        Some(b"o-1".to_vec())
    );
    assert_eq!(
        key_of(
            &h,
            &props(None, &[("order-id", AMQPValue::LongLongInt(42))]),
            b""
        ),
        Some(b"42".to_vec())
    );
    assert_eq!(
        key_of(&h, &props(None, &[("order-id", long(""))]), b""),
        None
    );
    assert_eq!(key_of(&h, &props(Some(b"m"), &[]), b""), None);
    let body = key_of(&KeySource::BodySha256, &props(None, &[]), b"abc").unwrap();
    assert_eq!(body, body_sha256(b"abc").to_vec());
    assert_ne!(
        body,
        key_of(&KeySource::BodySha256, &props(None, &[]), b"abd").unwrap()
    );
}

#[test]
fn a_rerun_copy_has_a_key_of_its_own() {
    let plain = props(Some(b"m-1"), &[]);
    let rerun = props(Some(b"m-1"), &[(RERUN_HEADER, long("r-7"))]);
    let other = props(Some(b"m-1"), &[(RERUN_HEADER, long("r-8"))]);
    let k = |p| key_of(&KeySource::MessageId, p, b"").unwrap();
    assert_ne!(k(&plain), k(&rerun));
    assert_ne!(k(&rerun), k(&other));
    assert!(k(&rerun).starts_with(b"m-1"));
    // No id: no key, rerun or not.
    assert_eq!(
        key_of(
            &KeySource::MessageId,
            &props(None, &[(RERUN_HEADER, long("r"))]),
            b""
        ),
        None
    );
}

#[test]
fn scopes_never_collide() {
    assert_ne!(scope("a:b", "c"), scope("a", "b:c"));
    assert_ne!(scope("/", "orders"), scope("/", "orders2"));
    assert_eq!(scope("/", "orders"), b"1:/:6:orders".to_vec());
}

#[test]
fn a_lease_outlasts_the_handler_timeout() {
    assert_eq!(lease_ms(30_000), 35_000);
    assert_eq!(lease_ms(0), MIN_LEASE_MS);
    assert_eq!(lease_ms(u64::MAX), u64::MAX);
}

/// The key of a `header:NAME` of every AMQP type. Strings, byte arrays
/// and integers keep the bytes they always had (marks made before an
/// upgrade still match); booleans, decimals, floats and timestamps get a
/// key of their own, tagged with their type (never the key of a string
/// with the same text); a table, an array or a void is no key, and says
/// which type it is.
#[test]
fn a_header_key_of_every_type() {
    use amq_protocol::types::{ByteArray, DecimalValue, FieldArray};
    let h = KeySource::Header("k".into());
    let read = |v: AMQPValue| read_key(&h, &props(None, &[("k", v)]), b"");
    let key = |v: AMQPValue| match read(v) {
        KeyOf::Key(k) => k,
        other => panic!("no key: {other:?}"),
    };
    // Today's bytes, explicitly.
    assert_eq!(key(long("o-1")), b"o-1".to_vec());
    assert_eq!(
        key(AMQPValue::ShortString(ShortString::from(
            crate::values::shortstr::from_raw_bytes(b"\xffid")
        ))),
        b"\xffid".to_vec()
    );
    assert_eq!(
        key(AMQPValue::ByteArray(ByteArray::from(vec![0u8, 1, 2]))),
        vec![0u8, 1, 2]
    );
    for (v, text) in [
        (AMQPValue::ShortShortInt(-5), "-5"),
        (AMQPValue::ShortShortUInt(200), "200"),
        (AMQPValue::ShortInt(-300), "-300"),
        (AMQPValue::ShortUInt(60_000), "60000"),
        (AMQPValue::LongInt(-70_000), "-70000"),
        (AMQPValue::LongUInt(4_000_000_000), "4000000000"),
        (AMQPValue::LongLongInt(i64::MIN), "-9223372036854775808"),
    ] {
        assert_eq!(key(v), text.as_bytes().to_vec());
    }
    // Tagged with their type.
    assert_eq!(key(AMQPValue::Boolean(true)), b"\0bool\0true".to_vec());
    assert_eq!(key(AMQPValue::Boolean(false)), b"\0bool\0false".to_vec());
    assert_eq!(
        key(AMQPValue::DecimalValue(DecimalValue {
            scale: 2,
            value: 150
        })),
        b"\0decimal\x00150e-2".to_vec()
    );
    assert_ne!(
        key(AMQPValue::DecimalValue(DecimalValue {
            scale: 1,
            value: 15
        })),
        key(AMQPValue::DecimalValue(DecimalValue {
            scale: 2,
            value: 150
        }))
    );
    assert_eq!(key(AMQPValue::Float(1.5)), b"\0float\x001.5".to_vec());
    assert_eq!(key(AMQPValue::Double(-0.25)), b"\0double\0-0.25".to_vec());
    assert_ne!(key(AMQPValue::Double(0.0)), key(AMQPValue::Double(-0.0)));
    assert_eq!(
        key(AMQPValue::Timestamp(1_700_000_000)),
        b"\0timestamp\x001700000000".to_vec()
    );
    // Never the key of the string with the same text, nor of an integer.
    assert_ne!(key(AMQPValue::Boolean(true)), key(long("true")));
    assert_ne!(
        key(AMQPValue::Timestamp(42)),
        key(AMQPValue::LongLongInt(42))
    );
    // No key, naming the type.
    assert_eq!(
        read(AMQPValue::FieldTable(FieldTable::default())),
        KeyOf::Unusable("table")
    );
    assert_eq!(
        read(AMQPValue::FieldArray(FieldArray::default())),
        KeyOf::Unusable("array")
    );
    assert_eq!(read(AMQPValue::Void), KeyOf::Unusable("void"));
    assert_eq!(read_key(&h, &props(None, &[]), b""), KeyOf::Missing);
    assert_eq!(read(long("")), KeyOf::Missing);
    // key_of is read_key's key.
    assert_eq!(
        key_of(&h, &props(None, &[("k", AMQPValue::Boolean(true))]), b""),
        Some(b"\0bool\0true".to_vec())
    );
}

/// A lease of the floor, renewed on its period, survives one renewal
/// that takes the whole call bound and fails, then one that takes it
/// and commits. (A 10 s lease renewed every third of it, on SQLite's
/// 8 s bound, lapsed after one slow renewal.)
#[test]
fn a_lease_survives_two_slow_renewals() {
    for bound in [1, 2_000, 8_000, 30_000] {
        let floor = lease_floor_ms(bound);
        assert_eq!(floor, 3 * bound);
        for lease in [floor, floor + 1, 2 * floor, 35_000.max(floor), 600_000] {
            let every = renew_every_ms(lease, bound);
            assert!(
                every + 2 * bound <= lease || every == 100,
                "{lease} {bound}: {every}"
            );
            assert!(every <= lease / 3 || every == 100, "{lease}: {every}");
        }
    }
    assert_eq!(renew_every_ms(24_000, 8_000), 8_000);
    assert_eq!(renew_every_ms(600_000, 8_000), 200_000);
}
