//! Headers as JSON, for a handler's `DLQCTL_HEADERS`.

use lapin::types::{AMQPValue, FieldTable};

use super::attempt::as_integer;
use super::MAX_JSON_DEPTH;

/// The headers as a JSON object, for a handler's `DLQCTL_HEADERS`.
///
/// Integers and timestamps (seconds) become numbers; floats become numbers,
/// NaN and infinities `null`; a decimal (scale s, value v) the number
/// v / 10^s; strings become strings (a long string that is not UTF-8 with
/// U+FFFD in place of the bad bytes); a byte array an array of numbers
/// 0..=255; tables objects and arrays arrays, recursively; void `null`.
/// Values nested more than 64 levels deep become `null`. No headers: `{}`.
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
        .map(|(k, v)| (k.as_str().to_string(), value_to_json(v, depth + 1)))
        .collect::<serde_json::Map<_, _>>();
    serde_json::Value::Object(map)
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
        // Parsed from "{value}e-{scale}": the nearest f64, correctly rounded.
        AMQPValue::DecimalValue(d) => format!("{}e-{}", d.value, d.scale)
            .parse::<f64>()
            .map_or(Value::Null, float),
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_string()),
        AMQPValue::LongString(s) => {
            Value::String(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
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
