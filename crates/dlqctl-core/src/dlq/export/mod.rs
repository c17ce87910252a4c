//! The lossless JSON Lines form of one AMQP message: what `dlq export`
//! writes and `dlq replay --from-file` reads back (docs/export-format.md). One JSON object per line:
//!
//! - `format` (`dlqctl-export/1`), `queue` (read from), `exchange`,
//!   `routing_key`, `redelivered`;
//! - `properties`: only those set: `content_type`, `content_encoding`,
//!   `delivery_mode`, `priority`, `correlation_id`, `reply_to`,
//!   `expiration`, `message_id`, `timestamp` (seconds), `type`, `user_id`,
//!   `app_id`, `cluster_id`, and `headers`, typed (below);
//! - `body_bytes`, `body_sha256` (lowercase hex), `body_base64`, and
//!   `body_utf8` too when the body is UTF-8.
//!
//! A short string (`exchange`, `routing_key`, the string properties) whose
//! bytes are not UTF-8 is written `NAME_base64` (standard base64 of the
//! bytes) instead of `NAME`: the project-wide rule of docs/non-utf8.md.
//!
//! Each header value is `{"type": T, ...}` with T one of `bool`, `i8`,
//! `u8`, `i16`, `u16`, `i32`, `u32`, `i64` (`value`: a number), `f32`,
//! `f64` (`value`: a number, or `bits`: the IEEE bits in hex for NaN and
//! infinities), `decimal` (`scale`, `value`), `timestamp` (`value`:
//! seconds), `string` (a long string) and `shortstring` (`value` when UTF-8,
//! else `base64`), `bytes` (`base64`), `array` (`value`: typed values),
//! `table` (`value`: an object of typed values) and `void`. A key whose
//! bytes are not UTF-8, or that starts with `base64:`, is written
//! `base64:` + the base64 of its bytes.
//!
//! Reading the body back, so that an operator can edit one by hand: when
//! only one of `body_utf8` and `body_base64` is present, it is the body;
//! when both are and they differ, the one that no longer matches
//! `body_sha256` is the edited one and wins (both edited: an error).

use crate::values::shortstr;
use crate::wire::EXPORT_FORMAT;
use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// Header values nested deeper than this are refused (each level takes two
/// JSON levels, and JSON readers stop at 128).
pub const MAX_DEPTH: usize = 60;

/// One message as read from a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The queue it was read from.
    pub queue: String,
    /// The delivery's exchange, as lapin holds a short string.
    pub exchange: String,
    /// The delivery's routing key, as lapin holds a short string.
    pub routing_key: String,
    /// Whether the broker had delivered it before.
    pub redelivered: bool,
    /// Every property, headers included.
    pub properties: BasicProperties,
    /// The body.
    pub body: Vec<u8>,
}

/// Why a record cannot be written or a line read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Not a JSON object.
    #[error("not a JSON object: {0}")]
    Json(String),
    /// Another format, or none.
    #[error("format is {0:?}, expected {expected:?}", expected = EXPORT_FORMAT)]
    Format(String),
    /// A field is missing, of the wrong type or out of range.
    #[error("{path}: {why}")]
    Field {
        /// Where, as `properties.headers.x-foo`.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The line would be longer than [`MAX_LINE_BYTES`].
    #[error("its line would be {bytes} bytes, over the longest export line ({max} bytes)")]
    TooLong {
        /// The line's length.
        bytes: usize,
        /// [`MAX_LINE_BYTES`].
        max: usize,
    },
}

fn field(path: &str, why: impl Into<String>) -> LineError {
    LineError::Field {
        path: path.to_string(),
        why: why.into(),
    }
}

/// The standard base64 of the bytes.
fn b64(bytes: &[u8]) -> String {
    shortstr::base64(bytes)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes a short string as `name` or `name_base64`.
fn put_short(map: &mut Map<String, Value>, name: &str, s: &str) {
    match shortstr::utf8(s) {
        Some(text) => map.insert(name.to_string(), Value::String(text.into_owned())),
        None => map.insert(
            format!("{name}_base64"),
            Value::String(b64(&shortstr::raw_bytes(s))),
        ),
    };
}

/// Reads a short string written by [`put_short`]; `None` when absent.
fn get_short(
    map: &Map<String, Value>,
    name: &str,
    path: &str,
) -> Result<Option<String>, LineError> {
    let b64_name = format!("{name}_base64");
    match (map.get(name), map.get(&b64_name)) {
        (Some(_), Some(_)) => Err(field(
            &format!("{path}{name}"),
            format!("both {name} and {b64_name} are given"),
        )),
        (Some(Value::String(s)), None) => {
            if s.len() > 255 {
                return Err(field(&format!("{path}{name}"), "longer than 255 bytes"));
            }
            Ok(Some(shortstr::from_raw_bytes(s.as_bytes())))
        }
        (Some(_), None) => Err(field(&format!("{path}{name}"), "not a string")),
        (None, Some(Value::String(s))) => {
            let bytes = shortstr::from_base64(s)
                .ok_or_else(|| field(&format!("{path}{b64_name}"), "not standard base64"))?;
            if bytes.len() > 255 {
                return Err(field(&format!("{path}{b64_name}"), "longer than 255 bytes"));
            }
            Ok(Some(shortstr::from_raw_bytes(&bytes)))
        }
        (None, Some(_)) => Err(field(&format!("{path}{b64_name}"), "not a string")),
        (None, None) => Ok(None),
    }
}

/// The JSON key of a header key.
fn key_to_json(k: &str) -> String {
    match shortstr::utf8(k) {
        Some(t) if !t.starts_with(crate::retry::BASE64_KEY_PREFIX) => t.into_owned(),
        _ => format!(
            "{}{}",
            crate::retry::BASE64_KEY_PREFIX,
            b64(&shortstr::raw_bytes(k))
        ),
    }
}

fn key_from_json(k: &str, path: &str) -> Result<ShortString, LineError> {
    let bytes = match k.strip_prefix(crate::retry::BASE64_KEY_PREFIX) {
        Some(rest) => shortstr::from_base64(rest)
            .ok_or_else(|| field(path, format!("key {k:?} is not base64: after `base64:`")))?,
        None => k.as_bytes().to_vec(),
    };
    if bytes.len() > 255 {
        return Err(field(path, format!("key {k:?} is longer than 255 bytes")));
    }
    Ok(ShortString::from(shortstr::from_raw_bytes(&bytes)))
}

fn float_json(kind: &str, finite: bool, number: Value, bits: String) -> Value {
    if finite {
        json!({"type": kind, "value": number})
    } else {
        json!({"type": kind, "bits": bits})
    }
}

fn bytes_json(kind: &str, bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(t) => json!({"type": kind, "value": t}),
        Err(_) => json!({"type": kind, "base64": b64(bytes)}),
    }
}

fn value_to_json(v: &AMQPValue, depth: usize) -> Result<Value, LineError> {
    if depth > MAX_DEPTH {
        return Err(field(
            "properties.headers",
            format!("nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    Ok(match v {
        AMQPValue::Boolean(b) => json!({"type": "bool", "value": b}),
        AMQPValue::ShortShortInt(n) => json!({"type": "i8", "value": n}),
        AMQPValue::ShortShortUInt(n) => json!({"type": "u8", "value": n}),
        AMQPValue::ShortInt(n) => json!({"type": "i16", "value": n}),
        AMQPValue::ShortUInt(n) => json!({"type": "u16", "value": n}),
        AMQPValue::LongInt(n) => json!({"type": "i32", "value": n}),
        AMQPValue::LongUInt(n) => json!({"type": "u32", "value": n}),
        AMQPValue::LongLongInt(n) => json!({"type": "i64", "value": n}),
        AMQPValue::Float(f) => float_json(
            "f32",
            f.is_finite(),
            json!(f),
            format!("{:#010x}", f.to_bits()),
        ),
        AMQPValue::Double(f) => float_json(
            "f64",
            f.is_finite(),
            json!(f),
            format!("{:#018x}", f.to_bits()),
        ),
        AMQPValue::DecimalValue(d) => {
            json!({"type": "decimal", "scale": d.scale, "value": d.value})
        }
        AMQPValue::ShortString(s) => bytes_json("shortstring", &shortstr::raw_bytes(s.as_str())),
        AMQPValue::LongString(s) => bytes_json("string", s.as_bytes()),
        AMQPValue::FieldArray(a) => {
            let items = a
                .as_slice()
                .iter()
                .map(|x| value_to_json(x, depth + 1))
                .collect::<Result<Vec<_>, _>>()?;
            json!({"type": "array", "value": items})
        }
        AMQPValue::Timestamp(t) => json!({"type": "timestamp", "value": t}),
        AMQPValue::FieldTable(t) => json!({"type": "table", "value": table_to_json(t, depth + 1)?}),
        AMQPValue::ByteArray(b) => json!({"type": "bytes", "base64": b64(b.as_slice())}),
        AMQPValue::Void => json!({"type": "void"}),
    })
}

fn table_to_json(t: &FieldTable, depth: usize) -> Result<Value, LineError> {
    let mut map = Map::new();
    for (k, v) in t.inner() {
        map.insert(key_to_json(k.as_str()), value_to_json(v, depth)?);
    }
    Ok(Value::Object(map))
}

fn int<T: TryFrom<i64> + TryFrom<u64>>(v: &Value, path: &str, kind: &str) -> Result<T, LineError> {
    let bad = || field(path, format!("not a {kind}: {v}"));
    if let Some(n) = v.as_i64() {
        T::try_from(n).map_err(|_| bad())
    } else if let Some(n) = v.as_u64() {
        T::try_from(n).map_err(|_| bad())
    } else {
        Err(bad())
    }
}

fn bits(o: &Map<String, Value>, path: &str) -> Result<u64, LineError> {
    let s = o
        .get("bits")
        .and_then(Value::as_str)
        .ok_or_else(|| field(path, "neither value nor bits"))?;
    u64::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|_| field(path, format!("bits {s:?} are not hex")))
}

fn text_or_base64(o: &Map<String, Value>, path: &str) -> Result<Vec<u8>, LineError> {
    match (o.get("value"), o.get("base64")) {
        (Some(Value::String(s)), None) => Ok(s.as_bytes().to_vec()),
        (None, Some(Value::String(s))) => {
            shortstr::from_base64(s).ok_or_else(|| field(path, "base64 is not standard base64"))
        }
        (Some(_), Some(_)) => Err(field(path, "both value and base64 are given")),
        _ => Err(field(path, "needs a string value or base64")),
    }
}

fn value_from_json(v: &Value, path: &str, depth: usize) -> Result<AMQPValue, LineError> {
    if depth > MAX_DEPTH {
        return Err(field(
            path,
            format!("nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    let o = v
        .as_object()
        .ok_or_else(|| field(path, "not an object {\"type\": ..., ...}"))?;
    let kind = o
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| field(path, "no type"))?;
    let value = || o.get("value").ok_or_else(|| field(path, "no value"));
    Ok(match kind {
        "bool" => AMQPValue::Boolean(
            value()?
                .as_bool()
                .ok_or_else(|| field(path, "not true or false"))?,
        ),
        "i8" => AMQPValue::ShortShortInt(int(value()?, path, "i8")?),
        "u8" => AMQPValue::ShortShortUInt(int(value()?, path, "u8")?),
        "i16" => AMQPValue::ShortInt(int(value()?, path, "i16")?),
        "u16" => AMQPValue::ShortUInt(int(value()?, path, "u16")?),
        "i32" => AMQPValue::LongInt(int(value()?, path, "i32")?),
        "u32" => AMQPValue::LongUInt(int(value()?, path, "u32")?),
        "i64" => AMQPValue::LongLongInt(int(value()?, path, "i64")?),
        "timestamp" => AMQPValue::Timestamp(int(value()?, path, "timestamp")?),
        "f32" => AMQPValue::Float(match o.get("value") {
            Some(n) => n
                .as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| field(path, "not a number"))?,
            None => f32::from_bits(
                u32::try_from(bits(o, path)?).map_err(|_| field(path, "bits over 32"))?,
            ),
        }),
        "f64" => AMQPValue::Double(match o.get("value") {
            Some(n) => n.as_f64().ok_or_else(|| field(path, "not a number"))?,
            None => f64::from_bits(bits(o, path)?),
        }),
        "decimal" => AMQPValue::DecimalValue(DecimalValue {
            scale: int(
                o.get("scale").ok_or_else(|| field(path, "no scale"))?,
                path,
                "u8",
            )?,
            value: int(value()?, path, "u32")?,
        }),
        "string" => AMQPValue::LongString(LongString::from(text_or_base64(o, path)?)),
        "shortstring" => {
            let bytes = text_or_base64(o, path)?;
            if bytes.len() > 255 {
                return Err(field(path, "a shortstring is at most 255 bytes"));
            }
            AMQPValue::ShortString(ShortString::from(shortstr::from_raw_bytes(&bytes)))
        }
        "bytes" => {
            let s = o
                .get("base64")
                .and_then(Value::as_str)
                .ok_or_else(|| field(path, "no base64"))?;
            AMQPValue::ByteArray(ByteArray::from(
                shortstr::from_base64(s).ok_or_else(|| field(path, "not standard base64"))?,
            ))
        }
        "array" => {
            let items = value()?
                .as_array()
                .ok_or_else(|| field(path, "value is not an array"))?;
            let mut a = FieldArray::default();
            for (i, x) in items.iter().enumerate() {
                a.push(value_from_json(x, &format!("{path}[{i}]"), depth + 1)?);
            }
            AMQPValue::FieldArray(a)
        }
        "table" => AMQPValue::FieldTable(table_from_json(value()?, path, depth + 1)?),
        "void" => AMQPValue::Void,
        other => return Err(field(path, format!("unknown type {other:?}"))),
    })
}

fn table_from_json(v: &Value, path: &str, depth: usize) -> Result<FieldTable, LineError> {
    let o = v.as_object().ok_or_else(|| field(path, "not an object"))?;
    let mut t = FieldTable::default();
    for (k, x) in o {
        let p = format!("{path}.{k}");
        t.insert(key_from_json(k, &p)?, value_from_json(x, &p, depth)?);
    }
    Ok(t)
}

/// The short-string properties: JSON name and accessor.
type ShortProp = (&'static str, fn(&BasicProperties) -> Option<&ShortString>);

const SHORT_PROPS: [ShortProp; 10] = [
    ("content_type", |p| p.content_type().as_ref()),
    ("content_encoding", |p| p.content_encoding().as_ref()),
    ("correlation_id", |p| p.correlation_id().as_ref()),
    ("reply_to", |p| p.reply_to().as_ref()),
    ("expiration", |p| p.expiration().as_ref()),
    ("message_id", |p| p.message_id().as_ref()),
    ("type", |p| p.kind().as_ref()),
    ("user_id", |p| p.user_id().as_ref()),
    ("app_id", |p| p.app_id().as_ref()),
    ("cluster_id", |p| p.cluster_id().as_ref()),
];

fn set_short(p: BasicProperties, name: &str, v: ShortString) -> BasicProperties {
    match name {
        "content_type" => p.with_content_type(v),
        "content_encoding" => p.with_content_encoding(v),
        "correlation_id" => p.with_correlation_id(v),
        "reply_to" => p.with_reply_to(v),
        "expiration" => p.with_expiration(v),
        "message_id" => p.with_message_id(v),
        "type" => p.with_type(v),
        "user_id" => p.with_user_id(v),
        "app_id" => p.with_app_id(v),
        _ => p.with_cluster_id(v),
    }
}

/// Renders one record as one JSON line (no newline). Fails for a line
/// over [`MAX_LINE_BYTES`] and for
/// headers nested deeper than [`MAX_DEPTH`].
pub fn to_line(r: &Record) -> Result<String, LineError> {
    let mut props = properties_json(&r.properties);
    if let Some(h) = r.properties.headers() {
        props.insert("headers".into(), table_to_json(h, 1)?);
    }
    let mut line = Map::new();
    line.insert("format".into(), json!(EXPORT_FORMAT));
    line.insert("queue".into(), json!(r.queue));
    put_short(&mut line, "exchange", &r.exchange);
    put_short(&mut line, "routing_key", &r.routing_key);
    line.insert("redelivered".into(), json!(r.redelivered));
    line.insert("properties".into(), Value::Object(props));
    line.insert("body_bytes".into(), json!(r.body.len()));
    line.insert("body_sha256".into(), json!(sha256_hex(&r.body)));
    line.insert("body_base64".into(), json!(b64(&r.body)));
    if let Ok(t) = std::str::from_utf8(&r.body) {
        line.insert("body_utf8".into(), json!(t));
    }
    let line = Value::Object(line).to_string();
    if line.len() > MAX_LINE_BYTES {
        return Err(LineError::TooLong {
            bytes: line.len(),
            max: MAX_LINE_BYTES,
        });
    }
    Ok(line)
}

/// Every property but the headers, as the export format writes them:
/// short strings as `name` or `name_base64`, numbers as numbers.
pub fn properties_json(p: &BasicProperties) -> Map<String, Value> {
    let mut props = Map::new();
    for (name, get) in SHORT_PROPS {
        if let Some(v) = get(p) {
            put_short(&mut props, name, v.as_str());
        }
    }
    if let Some(m) = p.delivery_mode() {
        props.insert("delivery_mode".into(), json!(m));
    }
    if let Some(p) = p.priority() {
        props.insert("priority".into(), json!(p));
    }
    if let Some(t) = p.timestamp() {
        props.insert("timestamp".into(), json!(t));
    }
    props
}

/// Reads one line back: `from_line(&to_line(r)?) == Ok(r)`, byte for byte.
pub fn from_line(line: &str) -> Result<Record, LineError> {
    let v: Value = serde_json::from_str(line).map_err(|e| LineError::Json(e.to_string()))?;
    let o = v
        .as_object()
        .ok_or_else(|| LineError::Json("a line must be one JSON object".into()))?;
    match o.get("format").and_then(Value::as_str) {
        Some(EXPORT_FORMAT) => {}
        other => return Err(LineError::Format(other.unwrap_or("").to_string())),
    }
    let empty = Map::new();
    let props = match o.get("properties") {
        None => &empty,
        Some(Value::Object(p)) => p,
        Some(_) => return Err(field("properties", "not an object")),
    };
    let mut p = BasicProperties::default();
    for (name, _) in SHORT_PROPS {
        if let Some(v) = get_short(props, name, "properties.")? {
            p = set_short(p, name, ShortString::from(v));
        }
    }
    if let Some(m) = props.get("delivery_mode") {
        p = p.with_delivery_mode(int(m, "properties.delivery_mode", "u8")?);
    }
    if let Some(m) = props.get("priority") {
        p = p.with_priority(int(m, "properties.priority", "u8")?);
    }
    if let Some(m) = props.get("timestamp") {
        p = p.with_timestamp(int(m, "properties.timestamp", "timestamp")?);
    }
    if let Some(h) = props.get("headers") {
        p = p.with_headers(table_from_json(h, "properties.headers", 1)?);
    }
    Ok(Record {
        queue: o
            .get("queue")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        exchange: get_short(o, "exchange", "")?.unwrap_or_default(),
        routing_key: get_short(o, "routing_key", "")?.unwrap_or_default(),
        redelivered: o
            .get("redelivered")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        properties: p,
        body: body(o)?,
    })
}

/// The body of a line (see the module docs for the edit rule).
fn body(o: &Map<String, Value>) -> Result<Vec<u8>, LineError> {
    let utf8 = match o.get("body_utf8") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_bytes().to_vec()),
        Some(_) => return Err(field("body_utf8", "not a string")),
    };
    let base64 = match o.get("body_base64") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            shortstr::from_base64(s).ok_or_else(|| field("body_base64", "not standard base64"))?,
        ),
        Some(_) => return Err(field("body_base64", "not a string")),
    };
    let sha = o.get("body_sha256").and_then(Value::as_str);
    match (utf8, base64) {
        (None, None) => Err(field("body_base64", "no body_base64 and no body_utf8")),
        (Some(b), None) | (None, Some(b)) => Ok(b),
        (Some(u), Some(b)) if u == b => Ok(u),
        (Some(u), Some(b)) => {
            let original = |x: &[u8]| sha.is_some_and(|s| s.eq_ignore_ascii_case(&sha256_hex(x)));
            match (original(&u), original(&b)) {
                (true, false) => Ok(b),
                (false, true) => Ok(u),
                _ => Err(field(
                    "body_utf8",
                    "body_utf8 and body_base64 disagree and neither matches body_sha256; keep \
                     only the one you edited",
                )),
            }
        }
    }
}

mod lines;
pub use lines::{BoundedLines, FileLineError, MAX_LINE_BYTES};

#[cfg(test)]
mod tests;
