//! AMQP short strings whose bytes are not UTF-8.
//!
//! RabbitMQ passes short strings (`message_id`, `correlation_id`, `type`,
//! header keys, routing keys, ...) through as bytes, UTF-8 or not. dlqctl's
//! copy of `amq-protocol-types` (vendor/amq-protocol-types, see its
//! PATCH.md) holds such a string losslessly in the `String` inside
//! [`ShortString`](amq_protocol::types::ShortString): every byte that is not part
//! of valid UTF-8 becomes the private-use character `U+EF00 + byte`
//! (U+EF80..=U+EFFF), and the generator turns those characters back into
//! the bytes. So a copy carries the original bytes without dlqctl doing
//! anything, and this module is how dlqctl *reads* such a string:
//!
//! - [`raw_bytes`]: the bytes on the wire;
//! - [`utf8`]: the text, when those bytes are UTF-8;
//! - [`Shown`]: the one form handlers, logs and reports use: the text, or
//!   the standard base64 (RFC 4648, with padding) of the bytes.
//!
//! Never use `ShortString::as_str()` as text or `.len()` as a size without
//! going through here.

use std::borrow::Cow;

use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{AMQPValue, FieldTable};
use base64::Engine as _;

/// Values nested deeper than this are written as `null` when headers are
/// turned into JSON (here and by `headers_to_json`).
pub(crate) const MAX_JSON_DEPTH: usize = 64;

/// The bytes the short string holding `s` is sent as (and was received as).
pub fn raw_bytes(s: &str) -> Cow<'_, [u8]> {
    amq_protocol::types::short_string_wire_bytes(s)
}

/// The number of bytes the short string holding `s` takes on the wire,
/// without its length byte.
pub fn wire_len(s: &str) -> usize {
    raw_bytes(s).len()
}

/// Whether `s` goes on the wire as its own UTF-8 (it holds no escaped
/// byte). A string received as UTF-8 always does, unless it contains one of
/// the private-use characters U+EF80..=U+EFFF.
pub(crate) fn is_utf8_clean(s: &str) -> bool {
    matches!(raw_bytes(s), Cow::Borrowed(_))
}

/// The String a short string received as `bytes` is held in (what the
/// patched parser makes): `raw_bytes(&from_raw_bytes(b)) == b` for every
/// `b`.
pub fn from_raw_bytes(bytes: &[u8]) -> String {
    amq_protocol::types::short_string_from_wire_bytes(bytes)
}

/// The text of the short string holding `s`, when its bytes are UTF-8.
pub fn utf8(s: &str) -> Option<Cow<'_, str>> {
    match raw_bytes(s) {
        Cow::Borrowed(_) => Some(Cow::Borrowed(s)),
        Cow::Owned(bytes) => String::from_utf8(bytes).ok().map(Cow::Owned),
    }
}

/// Standard base64 (RFC 4648, with padding) of `bytes`.
pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Bytes from standard base64; `None` when `text` is not valid base64.
pub fn from_base64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// A short string as handlers, logs and reports show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shown<'a> {
    /// Its bytes are UTF-8: the text.
    Text(Cow<'a, str>),
    /// Its bytes are not UTF-8: the standard base64 of the bytes.
    Base64(String),
}

impl<'a> Shown<'a> {
    /// The short string holding `s`, shown.
    pub fn of(s: &'a str) -> Self {
        match utf8(s) {
            Some(text) => Shown::Text(text),
            None => Shown::Base64(base64(&raw_bytes(s))),
        }
    }

    /// The text, when the bytes are UTF-8.
    pub fn text(&self) -> Option<&str> {
        match self {
            Shown::Text(t) => Some(t),
            Shown::Base64(_) => None,
        }
    }

    /// For a log field: the text, or `base64:` and the base64 of the bytes.
    pub fn for_log(&self) -> Cow<'_, str> {
        match self {
            Shown::Text(t) => Cow::Borrowed(t),
            Shown::Base64(b) => Cow::Owned(format!("base64:{b}")),
        }
    }
}

/// The bytes of the short string holding `s` when they are not UTF-8, else
/// `None`.
pub fn non_utf8_bytes(s: &str) -> Option<Vec<u8>> {
    match raw_bytes(s) {
        Cow::Borrowed(_) => None,
        Cow::Owned(bytes) => match String::from_utf8(bytes) {
            Ok(_) => None,
            Err(e) => Some(e.into_bytes()),
        },
    }
}

/// `s` cut to at most `max` bytes on the wire (never inside a UTF-8
/// character when its bytes are UTF-8).
pub(crate) fn truncate_wire(s: &str, max: usize) -> Cow<'_, str> {
    let bytes = raw_bytes(s);
    if bytes.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    if let Some(text) = utf8(s) {
        while !text.is_char_boundary(end) {
            end -= 1;
        }
    }
    Cow::Owned(from_raw_bytes(&bytes[..end]))
}

/// The short strings of a delivery that are not UTF-8, in words, for the
/// log: `message_id` (`base64:…`), `header key base64:…`, ... Empty when
/// every one is UTF-8. Header keys are searched at every depth (nested
/// tables and arrays), at most `limit` findings are listed.
pub fn non_utf8_fields(
    props: &BasicProperties,
    exchange: &str,
    routing_key: &str,
    limit: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    let note = |what: &str, s: &str, out: &mut Vec<String>| {
        if out.len() < limit {
            if let Shown::Base64(b) = Shown::of(s) {
                out.push(format!("{what} (shown as base64 {b})"));
            }
        }
    };
    note("exchange", exchange, &mut out);
    note("routing key", routing_key, &mut out);
    let fields = [
        ("content_type", props.content_type()),
        ("content_encoding", props.content_encoding()),
        ("correlation_id", props.correlation_id()),
        ("reply_to", props.reply_to()),
        ("expiration", props.expiration()),
        ("message_id", props.message_id()),
        ("type", props.kind()),
        ("user_id", props.user_id()),
        ("app_id", props.app_id()),
        ("cluster_id", props.cluster_id()),
    ];
    for (name, value) in fields {
        if let Some(v) = value {
            note(name, v.as_str(), &mut out);
        }
    }
    if let Some(h) = props.headers() {
        table_keys(h, 0, limit, &mut out);
    }
    out
}

fn table_keys(t: &FieldTable, depth: usize, limit: usize, out: &mut Vec<String>) {
    for (k, v) in t {
        if out.len() >= limit {
            return;
        }
        if let Shown::Base64(b) = Shown::of(k.as_str()) {
            out.push(format!("a header key (shown as base64:{b})"));
        }
        value_keys(v, depth + 1, limit, out);
    }
}

fn value_keys(v: &AMQPValue, depth: usize, limit: usize, out: &mut Vec<String>) {
    // Bounded like the header JSON: deeper values are not searched.
    if depth > MAX_JSON_DEPTH {
        return;
    }
    match v {
        AMQPValue::FieldTable(t) => table_keys(t, depth, limit, out),
        AMQPValue::FieldArray(a) => {
            for v in a.as_slice() {
                value_keys(v, depth + 1, limit, out);
            }
        }
        AMQPValue::ShortString(s) if out.len() < limit => {
            if let Shown::Base64(b) = Shown::of(s.as_str()) {
                out.push(format!("a header value (shown as base64 {b})"));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::generation::gen_short_string;
    use amq_protocol::types::parsing::parse_short_string;

    /// What lapin makes of `bytes` arriving as a short string.
    fn parse(bytes: &[u8]) -> String {
        let mut frame = vec![u8::try_from(bytes.len()).unwrap()];
        frame.extend_from_slice(bytes);
        let (rest, s) = parse_short_string(&frame[..]).expect("parses");
        assert!(rest.is_empty());
        s.as_str().to_string()
    }

    /// What lapin sends for `s`, without the length byte (checked).
    fn generate(s: &str) -> Vec<u8> {
        let (out, _) = cookie_factory::gen(gen_short_string(s), Vec::new()).unwrap();
        assert_eq!(usize::from(out[0]), out.len() - 1);
        out[1..].to_vec()
    }

    #[test]
    fn the_example_message_id_round_trips() {
        let bytes = b"\xff\xfe-bad";
        let s = parse(bytes);
        assert_eq!(s, "\u{efff}\u{effe}-bad");
        assert_eq!(&*raw_bytes(&s), bytes);
        assert_eq!(generate(&s), bytes);
        assert_eq!(wire_len(&s), 6);
        assert!(!is_utf8_clean(&s));
        assert_eq!(utf8(&s), None);
        assert_eq!(non_utf8_bytes(&s), Some(bytes.to_vec()));
        assert_eq!(Shown::of(&s), Shown::Base64("//4tYmFk".into()));
        assert_eq!(Shown::of(&s).for_log(), "base64://4tYmFk");
        assert_eq!(from_base64("//4tYmFk").as_deref(), Some(&bytes[..]));
        assert_eq!(from_raw_bytes(bytes), s);
    }

    #[test]
    fn utf8_is_kept_as_it_is() {
        for text in ["", "order-1", "é ü 日本 🎉", "\0\u{7f}"] {
            let s = parse(text.as_bytes());
            assert_eq!(s, text);
            assert!(is_utf8_clean(&s));
            assert_eq!(utf8(&s).as_deref(), Some(text));
            assert_eq!(non_utf8_bytes(&s), None);
            assert_eq!(Shown::of(&s), Shown::Text(text.into()));
            assert_eq!(Shown::of(&s).for_log(), text);
        }
    }

    #[test]
    fn utf8_holding_escape_characters_is_still_its_text() {
        // Valid UTF-8 that contains U+EF80..=U+EFFF: held escaped (so it
        // cannot be confused with bytes), shown as its real text.
        let text = "a\u{ef80}b\u{efff}";
        let s = parse(text.as_bytes());
        assert_ne!(s, text);
        assert!(!is_utf8_clean(&s));
        assert_eq!(&*raw_bytes(&s), text.as_bytes());
        assert_eq!(generate(&s), text.as_bytes());
        assert_eq!(utf8(&s).as_deref(), Some(text));
        assert_eq!(non_utf8_bytes(&s), None);
        assert_eq!(Shown::of(&s).text(), Some(text));
    }

    #[test]
    fn every_byte_string_round_trips_through_lapin() {
        // All strings of up to 3 bytes over bytes that matter to UTF-8,
        // and each single byte 0..=255 inside text.
        let alphabet = [
            0x00u8, b'a', 0x7f, 0x80, 0xa9, 0xbe, 0xbf, 0xc0, 0xc3, 0xe2, 0xee, 0xef, 0xf0, 0xf4,
            0xf5, 0xff,
        ];
        let mut all: Vec<Vec<u8>> = vec![vec![]];
        let mut last = all.clone();
        for _ in 0..3 {
            let mut next = Vec::new();
            for v in &last {
                for &b in &alphabet {
                    let mut w = v.clone();
                    w.push(b);
                    next.push(w);
                }
            }
            all.extend(next.iter().cloned());
            last = next;
        }
        for b in 0..=255u8 {
            all.push(vec![b'x', b, b'y']);
        }
        all.push(vec![0xff; 255]);
        for bytes in all {
            let s = parse(&bytes);
            assert_eq!(&*raw_bytes(&s), &bytes[..], "{bytes:x?}");
            assert_eq!(generate(&s), bytes, "{bytes:x?}");
            assert_eq!(from_raw_bytes(&bytes), s);
            let valid = std::str::from_utf8(&bytes).ok();
            assert_eq!(utf8(&s).as_deref(), valid, "{bytes:x?}");
            assert_eq!(non_utf8_bytes(&s).is_some(), valid.is_none());
            match Shown::of(&s) {
                Shown::Text(t) => assert_eq!(t.as_bytes(), &bytes[..]),
                Shown::Base64(b) => assert_eq!(from_base64(&b), Some(bytes.clone())),
            }
        }
    }

    #[test]
    fn lengths_count_wire_bytes() {
        let s = parse(&[0xff; 255]);
        assert_eq!(s.len(), 765);
        assert_eq!(wire_len(&s), 255);
        // A copy may rebuild it without a panic: the bound is on the wire.
        assert!(amq_protocol::types::ShortString::try_new(s.as_str()).is_ok());
        let mut over = s.clone();
        over.push('x');
        assert!(amq_protocol::types::ShortString::try_new(over).is_err());
    }

    #[test]
    fn truncate_wire_counts_wire_bytes() {
        let s = parse(&[0xff; 200]);
        assert_eq!(truncate_wire(&s, 255), s);
        assert_eq!(&*raw_bytes(&truncate_wire(&s, 10)), &[0xff; 10]);
        // UTF-8 is cut on a character boundary.
        assert_eq!(truncate_wire("aéb", 2), "a");
        assert_eq!(truncate_wire("aéb", 3), "aé");
        assert_eq!(truncate_wire("", 0), "");
    }

    #[test]
    fn non_utf8_fields_name_each_one() {
        use amq_protocol::types::{FieldArray, ShortString};
        let bad = |b: &[u8]| ShortString::from(parse(b));
        let mut inner = FieldTable::default();
        inner.insert(bad(b"\xc3"), AMQPValue::Boolean(true));
        let mut headers = FieldTable::default();
        headers.insert("ok".into(), AMQPValue::Boolean(true));
        headers.insert(bad(b"\xff\xfekey"), AMQPValue::Boolean(true));
        headers.insert(
            "deep".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(inner)])),
        );
        let props = BasicProperties::default()
            .with_message_id(bad(b"\xff\xfe-bad"))
            .with_correlation_id("fine".into())
            .with_type(bad(b"\xfe"))
            .with_headers(headers);
        let found = non_utf8_fields(&props, "shop", &parse(b"rk.\xff"), 10);
        assert_eq!(
            found,
            vec![
                "routing key (shown as base64 cmsu/w==)",
                "message_id (shown as base64 //4tYmFk)",
                "type (shown as base64 /g==)",
                "a header key (shown as base64:ww==)",
                "a header key (shown as base64://5rZXk=)",
            ]
        );
        assert_eq!(non_utf8_fields(&props, "shop", "rk", 2).len(), 2);
        let clean = BasicProperties::default().with_message_id("m".into());
        assert!(non_utf8_fields(&clean, "shop", "rk", 10).is_empty());
    }

    #[test]
    fn bad_base64_is_none() {
        assert_eq!(from_base64("not base64!"), None);
        assert_eq!(from_base64(""), Some(vec![]));
    }
}
