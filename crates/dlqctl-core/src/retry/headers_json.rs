//! Headers as JSON, for a handler's `DLQCTL_HEADERS`.

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::values::shortstr;
use crate::values::shortstr::MAX_JSON_DEPTH;
use crate::wire::as_integer;

/// The headers as a JSON object, for a handler's `DLQCTL_HEADERS`.
///
/// Integers and timestamps (seconds) become numbers; floats become numbers,
/// NaN and infinities `null`; a decimal (scale s, value v) the number
/// v / 10^s; strings become strings; a byte array an array of numbers
/// 0..=255; tables objects and arrays arrays, recursively; void `null`.
/// Values nested more than 64 levels deep become `null`. No headers: `{}`.
///
/// Bytes that are not UTF-8 are given as standard base64 (RFC 4648, with
/// padding), losslessly: a string value (long or short) that is not UTF-8
/// becomes the object `{"base64": "…"}`; a key (at any depth) that is not
/// UTF-8 becomes `"base64:…"`. A UTF-8 key that itself starts with
/// `base64:` is written the same way (`base64:` and the base64 of its
/// bytes), so a key that starts with `base64:` always means that, and no
/// two keys can collide.
pub fn headers_to_json(headers: Option<&FieldTable>) -> serde_json::Value {
    match headers {
        Some(t) => table_to_json(t, 0),
        None => serde_json::Value::Object(serde_json::Map::new()),
    }
}

fn table_to_json(table: &FieldTable, depth: usize) -> serde_json::Value {
    let map = table
        .inner()
        .iter()
        .map(|(k, v)| (key_to_json(k.as_str()), value_to_json(v, depth + 1)))
        .collect::<serde_json::Map<_, _>>();
    serde_json::Value::Object(map)
}

/// The prefix of a header key written as base64.
pub(crate) const BASE64_KEY_PREFIX: &str = "base64:";

/// A key as the JSON object's key: its text, or `base64:` and the base64
/// of its bytes when they are not UTF-8 or the text starts with `base64:`.
fn key_to_json(key: &str) -> String {
    match shortstr::utf8(key) {
        Some(text) if !text.starts_with(BASE64_KEY_PREFIX) => text.into_owned(),
        _ => format!(
            "{BASE64_KEY_PREFIX}{}",
            shortstr::base64(&shortstr::raw_bytes(key))
        ),
    }
}

/// A string's bytes: a JSON string when they are UTF-8, else
/// `{"base64": "…"}`.
fn bytes_to_json(bytes: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::Value::String(text.to_string()),
        Err(_) => serde_json::json!({ "base64": shortstr::base64(bytes) }),
    }
}

fn value_to_json(value: &AMQPValue, depth: usize) -> serde_json::Value {
    use serde_json::Value;
    if depth > MAX_JSON_DEPTH {
        return Value::Null;
    }
    let float = |f: f64| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number);
    match value {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::Float(f) => float(f64::from(*f)),
        AMQPValue::Double(f) => float(*f),
        // The value is a signed 32-bit integer on the wire (RabbitMQ reads
        // it so; lapin keeps the bits as u32). Parsed from
        // "{value}e-{scale}": the nearest f64, correctly rounded.
        AMQPValue::DecimalValue(d) => format!("{}e-{}", d.value as i32, d.scale)
            .parse::<f64>()
            .map_or(Value::Null, float),
        AMQPValue::ShortString(s) => bytes_to_json(&shortstr::raw_bytes(s.as_str())),
        AMQPValue::LongString(s) => bytes_to_json(s.as_bytes()),
        AMQPValue::FieldArray(a) => Value::Array(
            a.as_slice()
                .iter()
                .map(|v| value_to_json(v, depth + 1))
                .collect(),
        ),
        AMQPValue::Timestamp(t) => Value::from(*t),
        AMQPValue::FieldTable(t) => table_to_json(t, depth),
        AMQPValue::ByteArray(a) => Value::Array(a.as_slice().iter().map(|&b| b.into()).collect()),
        AMQPValue::Void => Value::Null,
        other => as_integer(other).map_or(Value::Null, Value::from),
    }
}
