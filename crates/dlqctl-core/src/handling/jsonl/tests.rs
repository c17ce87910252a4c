use super::*;
use crate::handling::message::NotUtf8;
use serde_json::json;

fn msg() -> HandlerMessage {
    HandlerMessage::example(br#"{"order":42}"#)
}

fn parse_line(line: &[u8]) -> Value {
    assert_eq!(line.last(), Some(&b'\n'), "a line ends with a newline");
    assert_eq!(
        line.iter().filter(|b| **b == b'\n').count(),
        1,
        "exactly one newline"
    );
    serde_json::from_slice(line).expect("valid JSON")
}

#[test]
fn hello_names_protocol_version_and_shares() {
    let v = parse_line(&hello_line("orders", 1, 4, 8));
    assert_eq!(
        v,
        json!({"protocol": JSONL_PROTOCOL, "version": 1, "queue": "orders",
               "process": 1, "processes": 4, "max_in_flight": 8})
    );
}

#[test]
fn ready_line_needs_ready_true_and_our_version() {
    assert_eq!(parse_ready(br#"{"ready":true,"version":1}"#), Ok(()));
    assert_eq!(
        parse_ready(br#"{"version":1,"ready":true,"name":"orders-handler"}"#),
        Ok(())
    );
    let e = parse_ready(b"hello world").unwrap_err().0;
    assert!(
        e.contains("not the ready line") && e.contains("hello world"),
        "{e}"
    );
    let e = parse_ready(br#"{"ready":false,"version":1}"#)
        .unwrap_err()
        .0;
    assert!(e.contains("no \"ready\":true"), "{e}");
    let e = parse_ready(br#"{"ready":"yes","version":1}"#)
        .unwrap_err()
        .0;
    assert!(e.contains("no \"ready\":true"), "{e}");
    let e = parse_ready(br#"{"ready":true,"version":2}"#).unwrap_err().0;
    assert!(
        e.contains("version 2") && e.contains("speaks version 1"),
        "{e}"
    );
    let e = parse_ready(br#"{"ready":true}"#).unwrap_err().0;
    assert!(e.contains("no \"version\":1"), "{e}");
    let e = parse_ready(br#"{"ready":true,"version":"1"}"#)
        .unwrap_err()
        .0;
    assert!(e.contains("no \"version\":1"), "{e}");
    let e = parse_ready(b"").unwrap_err().0;
    assert!(e.contains("not the ready line"), "{e}");
}

#[test]
fn message_line_has_every_field_in_order() {
    let line = message_line(7, &msg());
    let text = std::str::from_utf8(&line).unwrap();
    assert_eq!(
        text,
        "{\"id\":7,\"queue\":\"orders\",\"message_id\":\"m-1\",\"attempt\":2,\"max_attempts\":5,\
         \"exchange\":\"shop\",\"routing_key\":\"order.created\",\"content_type\":\"application/json\",\
         \"headers\":{\"n\":3,\"tenant\":\"acme\"},\"body\":\"{\\\"order\\\":42}\"}\n"
    );
}

#[test]
fn absent_properties_are_null() {
    let mut m = msg();
    m.message_id = None;
    m.content_type = None;
    m.headers = json!({});
    let v = parse_line(&message_line(0, &m));
    assert_eq!(v["message_id"], Value::Null);
    assert_eq!(v["content_type"], Value::Null);
    assert!(v.as_object().unwrap().contains_key("message_id"));
    assert_eq!(v["headers"], json!({}));
}

#[test]
fn bytes_that_are_not_utf8_go_as_base64_instead() {
    let mut m = msg();
    m.body = vec![0xff, 0x00, b'a', 0xc3];
    m.message_id = None;
    m.exchange = String::new();
    m.routing_key = String::new();
    m.content_type = None;
    m.not_utf8 = NotUtf8 {
        message_id: Some(vec![0xfe, b'1']),
        content_type: Some(vec![0xfd]),
        exchange: Some(vec![0xfc]),
        routing_key: Some(b"k\xfb".to_vec()),
    };
    let v = parse_line(&message_line(1, &m));
    let o = v.as_object().unwrap();
    for key in [
        "body",
        "message_id",
        "exchange",
        "routing_key",
        "content_type",
    ] {
        assert!(!o.contains_key(key), "{key} should be replaced: {v}");
    }
    let b64 = |k: &str| shortstr::from_base64(v[k].as_str().unwrap()).unwrap();
    assert_eq!(b64("body_base64"), vec![0xff, 0x00, b'a', 0xc3]);
    assert_eq!(b64("message_id_base64"), vec![0xfe, b'1']);
    assert_eq!(b64("content_type_base64"), vec![0xfd]);
    assert_eq!(b64("exchange_base64"), vec![0xfc]);
    assert_eq!(b64("routing_key_base64"), b"k\xfb".to_vec());
}

#[test]
fn bodies_with_newlines_and_controls_stay_on_one_line() {
    let mut m = msg();
    m.body = "a\nb\r\nc\u{0}d\u{2028}é\"\\".as_bytes().to_vec();
    let line = message_line(3, &m);
    let v = parse_line(&line);
    assert_eq!(v["body"].as_str().unwrap().as_bytes(), &m.body[..]);
}

#[test]
fn empty_body_is_an_empty_string() {
    let mut m = msg();
    m.body.clear();
    assert_eq!(parse_line(&message_line(3, &m))["body"], json!(""));
}

#[test]
fn answers_of_each_outcome() {
    assert_eq!(
        parse_answer(br#"{"id":1,"outcome":"success"}"#),
        Ok(Answer {
            id: 1,
            outcome: Outcome::Success
        })
    );
    assert_eq!(
        parse_answer(br#"{"id":2,"outcome":"transient","error":"db down"}"#)
            .unwrap()
            .outcome,
        Outcome::transient("db down")
    );
    assert_eq!(
        parse_answer(br#"{"id":3,"outcome":"permanent","error":"bad order"}"#)
            .unwrap()
            .outcome,
        Outcome::permanent("bad order")
    );
    // Unknown fields are ignored; error on success is ignored.
    assert_eq!(
        parse_answer(br#"{"outcome":"success","id":18446744073709551615,"error":"x","extra":[1]}"#),
        Ok(Answer {
            id: u64::MAX,
            outcome: Outcome::Success
        })
    );
}

#[test]
fn failures_without_an_error_text_say_so() {
    assert_eq!(
        parse_answer(br#"{"id":2,"outcome":"transient"}"#)
            .unwrap()
            .outcome,
        Outcome::transient("the handler answered transient without an error text")
    );
    assert_eq!(
        parse_answer(br#"{"id":2,"outcome":"permanent","error":null}"#)
            .unwrap()
            .outcome,
        Outcome::permanent("the handler answered permanent without an error text")
    );
}

#[test]
fn retry_after_in_ms_or_as_a_duration() {
    let ra = |line: &str| match parse_answer(line.as_bytes()).unwrap().outcome {
        Outcome::Transient { retry_after, .. } => retry_after,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        ra(r#"{"id":1,"outcome":"transient","retry_after":1500}"#),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(
        ra(r#"{"id":1,"outcome":"transient","retry_after":"2s"}"#),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        ra(r#"{"id":1,"outcome":"transient","retry_after":0}"#),
        Some(Duration::ZERO)
    );
    assert_eq!(
        ra(r#"{"id":1,"outcome":"transient","retry_after":null}"#),
        None
    );
    // Only transient uses it.
    assert_eq!(
        parse_answer(br#"{"id":1,"outcome":"success","retry_after":"2s"}"#)
            .unwrap()
            .outcome,
        Outcome::Success
    );
}

#[test]
fn malformed_answers_say_why_and_keep_the_id_when_readable() {
    let cases: &[(&[u8], Option<u64>, &str)] = &[
        (b"", None, "not a JSON object"),
        (b"garbage", None, "not a JSON object"),
        (b"[1,2]", None, "not a JSON object"),
        (b"42", None, "not a JSON object"),
        (br#"{"outcome":"success"}"#, None, "no `id`"),
        (
            br#"{"id":-1,"outcome":"success"}"#,
            None,
            "`id` is not a whole number",
        ),
        (
            br#"{"id":1.5,"outcome":"success"}"#,
            None,
            "`id` is not a whole number",
        ),
        (
            br#"{"id":"1","outcome":"success"}"#,
            None,
            "`id` is not a whole number",
        ),
        (
            br#"{"id":4}"#,
            Some(4),
            "must be \"success\", \"transient\" or \"permanent\", not missing",
        ),
        (br#"{"id":4,"outcome":"ok"}"#, Some(4), "not \"ok\""),
        (br#"{"id":4,"outcome":1}"#, Some(4), "not 1"),
        (
            br#"{"id":4,"outcome":"transient","error":5}"#,
            Some(4),
            "`error` is not a string: 5",
        ),
        (
            br#"{"id":4,"outcome":"transient","retry_after":-5}"#,
            Some(4),
            "`retry_after` must be whole milliseconds",
        ),
        (
            br#"{"id":4,"outcome":"transient","retry_after":1.5}"#,
            Some(4),
            "`retry_after` must be whole milliseconds",
        ),
        (
            br#"{"id":4,"outcome":"transient","retry_after":"soon"}"#,
            Some(4),
            "`retry_after`: invalid duration",
        ),
        (
            br#"{"id":4,"outcome":"transient","retry_after":true}"#,
            Some(4),
            "`retry_after` must be",
        ),
        (
            br#"{"id":1,"outcome":"success"} trailing"#,
            None,
            "not a JSON object",
        ),
    ];
    for (line, id, reason) in cases {
        let e = parse_answer(line).unwrap_err();
        assert_eq!(e.id, *id, "{}", String::from_utf8_lossy(line));
        assert!(
            e.reason.contains(reason),
            "{}: {:?} should contain {reason:?}",
            String::from_utf8_lossy(line),
            e.reason
        );
    }
    let e = parse_answer(br#"{"id":4,"outcome":"ok"}"#).unwrap_err();
    assert!(e.to_string().starts_with("answer for id 4: "), "{e}");
}

#[test]
fn quotes_are_bounded() {
    let long = vec![b'x'; 5000];
    let q = quote(&long);
    assert!(q.len() < 260 && q.ends_with("(5000 bytes)"), "{q}");
    let e = parse_answer(&long).unwrap_err();
    assert!(e.reason.len() < 400, "{}", e.reason);
    let big = format!(r#"{{"id":1,"outcome":"{}"}}"#, "é".repeat(500));
    let e = parse_answer(big.as_bytes()).unwrap_err();
    assert!(
        e.reason.len() < 400 && e.reason.contains("bytes)"),
        "{}",
        e.reason
    );
}

fn split(max: usize, chunks: &[&[u8]]) -> (Vec<Line>, Option<Line>) {
    let mut s = LineSplitter::new(max);
    let mut out = Vec::new();
    for c in chunks {
        s.push(c, &mut out);
        assert!(s.pending() <= max);
    }
    (out, s.finish())
}

fn line(text: &str, dropped: usize) -> Line {
    Line {
        bytes: text.as_bytes().to_vec(),
        dropped,
    }
}

#[test]
fn splits_across_chunks_and_strips_crlf() {
    let (lines, rest) = split(100, &[b"ab", b"c\nde\r\n", b"\n", b"f"]);
    assert_eq!(lines, vec![line("abc", 0), line("de", 0), line("", 0)]);
    assert_eq!(rest, Some(line("f", 0)));
    let (lines, rest) = split(100, &[b"x\n"]);
    assert_eq!(lines, vec![line("x", 0)]);
    assert_eq!(rest, None);
    let (lines, rest) = split(100, &[]);
    assert!(lines.is_empty() && rest.is_none());
}

#[test]
fn long_lines_are_cut_and_counted_then_splitting_goes_on() {
    let (lines, rest) = split(4, &[b"abcdefg", b"hij\nkl\n123456"]);
    assert_eq!(lines, vec![line("abcd", 6), line("kl", 0)]);
    assert_eq!(rest, Some(line("1234", 2)));
    // Exactly the limit is whole.
    let (lines, _) = split(4, &[b"abcd\n"]);
    assert_eq!(lines, vec![line("abcd", 0)]);
    // A cut line keeps a trailing \r as data: it may not be the end.
    let (lines, _) = split(2, &[b"ab\r\n"]);
    assert_eq!(lines, vec![line("ab", 1)]);
}

#[test]
fn splitting_is_independent_of_chunking() {
    let data = b"one\ntwo two two two\n\nthree\r\nfour-is-very-long\nfive";
    let (whole, whole_rest) = split(8, &[data]);
    for size in 1..data.len() {
        let chunks: Vec<&[u8]> = data.chunks(size).collect();
        let (lines, rest) = split(8, &chunks);
        assert_eq!(lines, whole, "chunks of {size}");
        assert_eq!(rest, whole_rest, "chunks of {size}");
    }
}
