//! The JSON-lines handler protocol, `dlqctl-jsonl/1` (docs/worker.md,
//! "The JSON-lines protocol"): the lines dlqctl writes to a long-running handler
//! process and the lines it reads back, and the splitting of a byte stream
//! into bounded lines.
//!
//! 1. dlqctl writes a hello line: `{"protocol":"dlqctl-jsonl","version":1,
//!    "queue":…,"process":…,"processes":…,"max_in_flight":…}`.
//! 2. The process answers `{"ready":true,"version":1}` within the start
//!    timeout.
//! 3. dlqctl writes one line per message (see [`message_line`]); the process
//!    answers one line per message, by `id`, in any order (see
//!    [`parse_answer`]).
//! 4. EOF on the process's stdin means "exit now".

use crate::handling::message::HandlerMessage;
use crate::handling::outcome::Outcome;
use crate::values::{shortstr, Invalid};
use crate::wire::JSONL_PROTOCOL;
use serde_json::Value;
use std::time::Duration;

/// The protocol version this dlqctl speaks.
pub const VERSION: u64 = 1;

/// An answer line longer than this (without its newline) is malformed.
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// The hello line (with its newline): the first line a process reads.
pub fn hello_line(queue: &str, process: usize, processes: usize, max_in_flight: usize) -> Vec<u8> {
    let mut line = serde_json::json!({
        "protocol": JSONL_PROTOCOL,
        "version": VERSION,
        "queue": queue,
        "process": process,
        "processes": processes,
        "max_in_flight": max_in_flight,
    })
    .to_string()
    .into_bytes();
    line.push(b'\n');
    line
}

/// Checks the process's first line: `{"ready": true, "version": 1}`
/// (other fields are allowed). `Err` says what is wrong, quoting the line.
pub fn parse_ready(line: &[u8]) -> Result<(), Invalid> {
    let quoted = || quote(line);
    let v: Value = serde_json::from_slice(line).map_err(|_| {
        Invalid(format!(
            "its first line is not the ready line {{\"ready\":true,\"version\":{VERSION}}}: {}",
            quoted()
        ))
    })?;
    if v.get("ready") != Some(&Value::Bool(true)) {
        return Err(Invalid(format!(
            "its first line has no \"ready\":true: {}",
            quoted()
        )));
    }
    match v.get("version").and_then(Value::as_u64) {
        Some(VERSION) => Ok(()),
        Some(other) => Err(Invalid(format!(
            "it speaks protocol version {other}; this dlqctl speaks version {VERSION}"
        ))),
        None => Err(Invalid(format!(
            "its ready line has no \"version\":{VERSION}: {}",
            quoted()
        ))),
    }
}

/// A line quoted for a log or an error: lossy UTF-8, at most 200 bytes.
pub fn quote(line: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(&line[..line.len().min(MAX)]);
    if line.len() > MAX {
        format!("{text:?}… ({} bytes)", line.len())
    } else {
        format!("{text:?}")
    }
}

/// The line (with its newline) that hands message `id` to a process.
///
/// Fields, always in this order: `id`, `queue`, `message_id` (`null` when
/// the message has none), `attempt`, `max_attempts`, `exchange`,
/// `routing_key` (the original ones), `content_type` (`null` when unset),
/// `headers` (the `DLQCTL_HEADERS` object), then `body` (the body as text)
/// when it is UTF-8, else `body_base64`. A short string whose bytes are not
/// UTF-8 is written `NAME_base64` instead of `NAME`, as in the export
/// format.
pub fn message_line(id: u64, msg: &HandlerMessage) -> Vec<u8> {
    let mut out = Vec::with_capacity(msg.body.len() + 512);
    out.extend_from_slice(b"{\"id\":");
    out.extend_from_slice(id.to_string().as_bytes());
    field(&mut out, "queue", &msg.queue);
    short(
        &mut out,
        "message_id",
        msg.message_id.as_deref(),
        msg.not_utf8.message_id.as_deref(),
    );
    field(&mut out, "attempt", &msg.attempt);
    field(&mut out, "max_attempts", &msg.max_attempts);
    let not_utf8 = &msg.not_utf8;
    for (key, text, raw) in [
        ("exchange", Some(msg.exchange.as_str()), &not_utf8.exchange),
        (
            "routing_key",
            Some(msg.routing_key.as_str()),
            &not_utf8.routing_key,
        ),
        (
            "content_type",
            msg.content_type.as_deref(),
            &not_utf8.content_type,
        ),
    ] {
        short(&mut out, key, text, raw.as_deref());
    }
    field(&mut out, "headers", &msg.headers);
    match std::str::from_utf8(&msg.body) {
        Ok(text) => field(&mut out, "body", text),
        Err(_) => field(&mut out, "body_base64", &shortstr::base64(&msg.body)),
    }
    out.extend_from_slice(b"}\n");
    out
}

fn field<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, key: &str, value: &T) {
    out.push(b',');
    // Writing JSON into a Vec cannot fail for these types (strings,
    // integers, a `Value`).
    let _ = serde_json::to_writer(&mut *out, key);
    out.push(b':');
    let _ = serde_json::to_writer(&mut *out, value);
}

/// `key: text` (or `null`), or `key_base64` when the bytes are not UTF-8.
fn short(out: &mut Vec<u8>, key: &str, text: Option<&str>, raw: Option<&[u8]>) {
    match raw {
        Some(bytes) => field(out, &format!("{key}_base64"), &shortstr::base64(bytes)),
        None => field(out, key, &text),
    }
}

/// One answer: the message's id and what the process said about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The `id` of the message line.
    pub id: u64,
    /// The outcome, with its error text and retry-after.
    pub outcome: Outcome,
}

/// An answer line that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// The id, when the line had a readable one.
    pub id: Option<u64>,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.id {
            Some(id) => write!(f, "answer for id {id}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

/// Reads one answer line: `{"id": N, "outcome": "success" | "transient" |
/// "permanent", "error": "…", "retry_after": 1500 | "2s"}`.
///
/// `error` is optional (a failure without one gets a text saying so);
/// `retry_after` is optional, in milliseconds (a whole number) or a
/// duration (`500ms`, `2s`, `1m`), and only used with `transient`. Other
/// fields are ignored.
pub fn parse_answer(line: &[u8]) -> Result<Answer, Malformed> {
    let bad = |id, reason: String| Malformed { id, reason };
    let v: Value = serde_json::from_slice(line)
        .map_err(|e| bad(None, format!("not a JSON object ({e}): {}", quote(line))))?;
    let Value::Object(obj) = v else {
        return Err(bad(None, format!("not a JSON object: {}", quote(line))));
    };
    let id = match obj.get("id") {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad(None, format!("`id` is not a whole number ≥ 0: {v}")))?,
        None => return Err(bad(None, format!("no `id`: {}", quote(line)))),
    };
    let error = match obj.get("error") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(bad(
                Some(id),
                format!("`error` is not a string: {}", short_json(other)),
            ))
        }
    };
    let retry_after = match obj.get("retry_after") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_retry_after(v).map_err(|e| bad(Some(id), e))?),
    };
    let described = |kind: &str| {
        error
            .clone()
            .unwrap_or_else(|| format!("the handler answered {kind} without an error text"))
    };
    let outcome = match obj.get("outcome").and_then(Value::as_str) {
        Some("success") => Outcome::Success,
        Some("transient") => Outcome::Transient {
            error: described("transient"),
            retry_after,
        },
        Some("permanent") => Outcome::Permanent {
            error: described("permanent"),
        },
        _ => {
            return Err(bad(
                Some(id),
                format!(
                    "`outcome` must be \"success\", \"transient\" or \"permanent\", not {}",
                    obj.get("outcome")
                        .map(short_json)
                        .unwrap_or_else(|| "missing".into())
                ),
            ))
        }
    };
    Ok(Answer { id, outcome })
}

fn parse_retry_after(v: &Value) -> Result<Duration, String> {
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(ms) => Ok(Duration::from_millis(ms)),
            None => Err(format!(
                "`retry_after` must be whole milliseconds ≥ 0 or a duration like \"2s\", not {n}"
            )),
        },
        Value::String(s) => crate::values::duration::parse_millis(s)
            .map(Duration::from_millis)
            .map_err(|e| format!("`retry_after`: {e}")),
        other => Err(format!(
            "`retry_after` must be whole milliseconds ≥ 0 or a duration like \"2s\", not {}",
            short_json(other)
        )),
    }
}

fn short_json(v: &Value) -> String {
    const MAX: usize = 200;
    let text = v.to_string();
    if text.len() <= MAX {
        return text;
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// One line out of a [`LineSplitter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The line without its `\n` (and `\r\n`), at most the splitter's limit.
    pub bytes: Vec<u8>,
    /// How many bytes past the limit were dropped (0: the whole line).
    pub dropped: usize,
}

/// Splits a byte stream into lines of at most `max` bytes, in memory
/// bounded by `max`: past it, the rest of the line is counted and dropped.
#[derive(Debug, Clone)]
pub struct LineSplitter {
    max: usize,
    buf: Vec<u8>,
    dropped: usize,
}

impl LineSplitter {
    /// A splitter keeping at most `max` bytes of a line.
    pub fn new(max: usize) -> Self {
        LineSplitter {
            max,
            buf: Vec::new(),
            dropped: 0,
        }
    }

    /// Feeds `data`; every line it completes is appended to `out`.
    pub fn push(&mut self, mut data: &[u8], out: &mut Vec<Line>) {
        while let Some(at) = data.iter().position(|b| *b == b'\n') {
            self.take(&data[..at]);
            out.push(self.end_line());
            data = &data[at + 1..];
        }
        self.take(data);
    }

    /// The unfinished last line at the end of the stream, if any.
    pub fn finish(&mut self) -> Option<Line> {
        if self.buf.is_empty() && self.dropped == 0 {
            None
        } else {
            Some(self.end_line())
        }
    }

    /// Bytes held for the unfinished line.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, data: &[u8]) {
        let room = self.max - self.buf.len().min(self.max);
        let kept = data.len().min(room);
        self.buf.extend_from_slice(&data[..kept]);
        self.dropped += data.len() - kept;
    }

    fn end_line(&mut self) -> Line {
        let mut bytes = std::mem::take(&mut self.buf);
        if self.dropped == 0 && bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        let dropped = std::mem::take(&mut self.dropped);
        Line { bytes, dropped }
    }
}

#[cfg(test)]
mod tests;
