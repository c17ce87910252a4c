use super::*;

fn raw(bytes: &[u8]) -> ShortString {
    ShortString::from(shortstr::from_raw_bytes(bytes))
}

fn every_value() -> FieldTable {
    let mut inner = FieldTable::default();
    inner.insert("n".into(), AMQPValue::LongLongInt(i64::MIN));
    inner.insert(raw(&[0xfe, b'k']), AMQPValue::Void);
    let mut arr = FieldArray::default();
    arr.push(AMQPValue::LongString(LongString::from(vec![0xff, 0x00])));
    arr.push(AMQPValue::FieldTable(inner.clone()));
    arr.push(AMQPValue::FieldArray(FieldArray::default()));
    let mut t = FieldTable::default();
    let vals = [
        ("bool", AMQPValue::Boolean(true)),
        ("i8", AMQPValue::ShortShortInt(-128)),
        ("u8", AMQPValue::ShortShortUInt(255)),
        ("i16", AMQPValue::ShortInt(i16::MIN)),
        ("u16", AMQPValue::ShortUInt(u16::MAX)),
        ("i32", AMQPValue::LongInt(i32::MIN)),
        ("u32", AMQPValue::LongUInt(u32::MAX)),
        ("i64", AMQPValue::LongLongInt(i64::MAX)),
        ("f32", AMQPValue::Float(0.1)),
        ("f32nan", AMQPValue::Float(f32::from_bits(0x7fc0_1234))),
        ("f32inf", AMQPValue::Float(f32::NEG_INFINITY)),
        ("f64", AMQPValue::Double(1e-300)),
        (
            "f64nan",
            AMQPValue::Double(f64::from_bits(0x7ff8_0000_0000_beef)),
        ),
        ("f64inf", AMQPValue::Double(f64::INFINITY)),
        ("neg0", AMQPValue::Double(-0.0)),
        (
            "dec",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 255,
                value: u32::MAX,
            }),
        ),
        ("short", AMQPValue::ShortString(raw(&[b'a', 0xc3]))),
        ("short_utf8", AMQPValue::ShortString("héllo".into())),
        ("long", AMQPValue::LongString("text".into())),
        (
            "long_bin",
            AMQPValue::LongString(LongString::from(vec![0x80])),
        ),
        ("ts", AMQPValue::Timestamp(u64::MAX)),
        (
            "bytes",
            AMQPValue::ByteArray(ByteArray::from(vec![0u8, 1, 255])),
        ),
        ("void", AMQPValue::Void),
        ("table", AMQPValue::FieldTable(inner)),
        ("array", AMQPValue::FieldArray(arr)),
        ("base64:looks-escaped", AMQPValue::Boolean(false)),
    ];
    for (k, v) in vals {
        t.insert(k.into(), v);
    }
    t.insert(
        raw(&[0xff, 0xfe]),
        AMQPValue::LongString("non-UTF-8 key".into()),
    );
    t
}

fn record() -> Record {
    let p = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_content_encoding(raw(&[0xff]))
        .with_delivery_mode(2)
        .with_priority(9)
        .with_correlation_id(raw(&[0xc0, 0xaf]))
        .with_reply_to("amq.rabbitmq.reply-to".into())
        .with_expiration("60000".into())
        .with_message_id(raw(&[0xff, b'1']))
        .with_timestamp(u64::MAX)
        .with_type(raw(&[0x80]))
        .with_user_id("guest".into())
        .with_app_id("app".into())
        .with_cluster_id(raw(&[0xfe]))
        .with_headers(every_value());
    Record {
        queue: "orders.dlq".into(),
        exchange: shortstr::from_raw_bytes(&[b'x', 0xff]),
        routing_key: "orders".into(),
        redelivered: true,
        properties: p,
        body: vec![0, 159, 146, 150, 255],
    }
}

/// Compares two records, floats by their bits (NaN != NaN otherwise).
fn same(a: &Record, b: &Record) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

#[test]
fn every_value_and_property_round_trips_byte_for_byte() {
    let r = record();
    let line = to_line(&r).unwrap();
    assert!(!line.contains('\n'));
    let back = from_line(&line).unwrap();
    assert!(same(&r, &back), "{r:#?}\n{back:#?}");
    // Writing it again gives the same line.
    assert_eq!(to_line(&back).unwrap(), line);
    // Bits of the NaNs survive.
    let h = back.properties.headers().clone().unwrap();
    match h.inner().get("f64nan") {
        Some(AMQPValue::Double(f)) => assert_eq!(f.to_bits(), 0x7ff8_0000_0000_beef),
        other => panic!("{other:?}"),
    }
    match h.inner().get("neg0") {
        Some(AMQPValue::Double(f)) => assert!(f.is_sign_negative()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_line_uses_the_documented_names() {
    let line = to_line(&record()).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["format"], EXPORT_FORMAT);
    assert_eq!(v["exchange_base64"], "eP8=");
    assert!(v.get("exchange").is_none());
    assert_eq!(v["routing_key"], "orders");
    let p = &v["properties"];
    assert_eq!(p["message_id_base64"], "/zE=");
    assert_eq!(p["content_type"], "application/json");
    assert_eq!(p["timestamp"], u64::MAX);
    let h = &p["headers"];
    assert_eq!(h["u8"], json!({"type": "u8", "value": 255}));
    assert_eq!(h["f32nan"], json!({"type": "f32", "bits": "0x7fc01234"}));
    assert_eq!(h["long_bin"], json!({"type": "string", "base64": "gA=="}));
    assert_eq!(
        h["short_utf8"],
        json!({"type": "shortstring", "value": "héllo"})
    );
    assert_eq!(
        h["dec"],
        json!({"type": "decimal", "scale": 255, "value": u32::MAX})
    );
    assert_eq!(
        h["base64://4="],
        json!({"type": "string", "value": "non-UTF-8 key"})
    );
    assert!(h.get("base64:looks-escaped").is_none());
    assert_eq!(
        h[format!("base64:{}", b64(b"base64:looks-escaped"))],
        json!({"type": "bool", "value": false})
    );
    assert_eq!(v["body_bytes"], 5);
    assert_eq!(v["body_base64"], "AJ+Slv8=");
    assert!(v.get("body_utf8").is_none(), "not UTF-8");
    assert_eq!(
        v["body_sha256"],
        json!(sha256_hex(&[0, 159, 146, 150, 255]))
    );
}

#[test]
fn empty_and_utf8_bodies_and_bare_properties() {
    for body in [b"".to_vec(), "héllo {\"a\":1}\n".as_bytes().to_vec()] {
        let r = Record {
            queue: "q".into(),
            exchange: String::new(),
            routing_key: String::new(),
            redelivered: false,
            properties: BasicProperties::default(),
            body: body.clone(),
        };
        let line = to_line(&r).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["body_utf8"], json!(String::from_utf8(body).unwrap()));
        assert_eq!(v["properties"], json!({}));
        assert!(same(&from_line(&line).unwrap(), &r));
    }
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

fn edited(f: impl FnOnce(&mut Map<String, Value>)) -> Result<Record, LineError> {
    let r = Record {
        body: b"old".to_vec(),
        ..record()
    };
    let mut v: Value = serde_json::from_str(&to_line(&r).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    from_line(&v.to_string())
}

#[test]
fn an_edited_body_wins_whichever_form_was_edited() {
    let new_b64 = b64(b"new");
    assert_eq!(
        edited(|o| {
            o.insert("body_utf8".into(), json!("new"));
        })
        .unwrap()
        .body,
        b"new"
    );
    assert_eq!(
        edited(|o| {
            o.insert("body_base64".into(), json!(new_b64));
        })
        .unwrap()
        .body,
        b"new"
    );
    assert_eq!(
        edited(|o| {
            o.remove("body_base64");
            o.insert("body_utf8".into(), json!("only"));
        })
        .unwrap()
        .body,
        b"only"
    );
    assert_eq!(
        edited(|o| {
            o.remove("body_utf8");
        })
        .unwrap()
        .body,
        b"old"
    );
    assert!(edited(|o| {
        o.insert("body_utf8".into(), json!("a"));
        o.insert("body_base64".into(), json!(b64(b"b")));
    })
    .is_err());
    assert!(edited(|o| {
        o.remove("body_utf8");
        o.remove("body_base64");
    })
    .is_err());
}

#[test]
fn bad_lines_name_what_is_wrong() {
    type Edit = Box<dyn FnOnce(&mut Map<String, Value>)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|o| {
                o.insert("format".into(), json!("other/1"));
            }),
            "format",
        ),
        (
            Box::new(|o| {
                o["properties"]["headers"]["u8"] = json!({"type": "u8", "value": 300});
            }),
            "properties.headers.u8",
        ),
        (
            Box::new(|o| {
                o["properties"]["headers"]["x"] = json!({"type": "lnog", "value": 1});
            }),
            "unknown type \"lnog\"",
        ),
        (
            Box::new(|o| {
                o["properties"]["headers"]["x"] = json!({"type": "bytes", "base64": "***"});
            }),
            "properties.headers.x",
        ),
        (
            Box::new(|o| {
                o["properties"]["headers"]["x"] =
                    json!({"type": "string", "value": "a", "base64": "YQ=="});
            }),
            "both value and base64",
        ),
        (
            Box::new(|o| {
                o["properties"]["message_id"] = json!("x");
            }),
            "both message_id and message_id_base64",
        ),
        (
            Box::new(|o| {
                o["properties"]["priority"] = json!(-1);
            }),
            "properties.priority",
        ),
        (
            Box::new(|o| {
                o["properties"]["app_id"] = json!("x".repeat(256));
            }),
            "longer than 255",
        ),
        (
            Box::new(|o| {
                o["body_base64"] = json!("not base64!");
                o.remove("body_utf8");
            }),
            "body_base64",
        ),
    ];
    for (edit, expect) in cases {
        let e = edited(edit).unwrap_err().to_string();
        assert!(e.contains(expect), "{e} should name {expect}");
    }
    assert!(matches!(from_line("[1]"), Err(LineError::Json(_))));
    assert!(matches!(from_line("{"), Err(LineError::Json(_))));
    assert!(matches!(from_line("{}"), Err(LineError::Format(_))));
}

#[test]
fn nesting_is_bounded_both_ways() {
    let mut deep = AMQPValue::Void;
    for _ in 1..MAX_DEPTH {
        let mut t = FieldTable::default();
        t.insert("d".into(), deep);
        deep = AMQPValue::FieldTable(t);
    }
    let mut h = FieldTable::default();
    h.insert("d".into(), deep.clone());
    let mut r = record();
    r.properties = BasicProperties::default().with_headers(h);
    let line = to_line(&r).unwrap();
    assert!(
        same(&from_line(&line).unwrap(), &r),
        "{MAX_DEPTH} levels fit"
    );
    let mut t = FieldTable::default();
    t.insert("d".into(), deep);
    let mut h = FieldTable::default();
    h.insert("d".into(), AMQPValue::FieldTable(t));
    r.properties = BasicProperties::default().with_headers(h);
    assert!(to_line(&r).unwrap_err().to_string().contains("deeper"));
}

#[test]
fn floats_read_back_to_the_same_bits() {
    // A simple generator over the whole range of finite doubles.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (d, f) = (f64::from_bits(x), f32::from_bits(x as u32));
        let mut h = FieldTable::default();
        h.insert("d".into(), AMQPValue::Double(d));
        h.insert("f".into(), AMQPValue::Float(f));
        let r = Record {
            properties: BasicProperties::default().with_headers(h),
            ..record()
        };
        let back = from_line(&to_line(&r).unwrap()).unwrap();
        let h = back.properties.headers().clone().unwrap();
        match (h.inner().get("d"), h.inner().get("f")) {
            (Some(AMQPValue::Double(d2)), Some(AMQPValue::Float(f2))) => {
                assert_eq!(d2.to_bits(), d.to_bits(), "{d:e}");
                assert_eq!(f2.to_bits(), f.to_bits(), "{f:e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
