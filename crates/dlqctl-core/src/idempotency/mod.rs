//! Idempotent handling, the pure part (docs/worker.md, "Idempotent
//! handling"): what a pipeline's `idempotency` block says, the key of a
//! delivery, the scope keys live in, and the tier a deferred delivery
//! waits in. The stores themselves (SQLite, Redis) are in
//! `crate::idempotency`.

use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::AMQPValue;
use sha2::{Digest, Sha256};

use crate::values::shortstr::raw_bytes;
use crate::wire::{as_integer, HEADER_PREFIX, RERUN_HEADER};

#[cfg(test)]
mod tests;

/// Where the key of a message is read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "from", content = "name")]
pub enum KeySource {
    /// The `message_id` property (the default).
    MessageId,
    /// A header (not `x-*`, not `dlqctl-*`: copies change those).
    Header(String),
    /// The SHA-256 of the body: identical bodies are one message.
    BodySha256,
}

impl KeySource {
    /// As written in a topology: `message_id`, `header:NAME`,
    /// `body_sha256`.
    pub fn parse(text: &str) -> Result<KeySource, String> {
        match text {
            "message_id" => Ok(KeySource::MessageId),
            "body_sha256" => Ok(KeySource::BodySha256),
            _ => match text.strip_prefix("header:") {
                Some("") => Err(
                    "idempotency.key `header:` needs a header name, e.g. header:order-id".into(),
                ),
                Some(name) => {
                    let lower = name.to_ascii_lowercase();
                    if lower.starts_with("x-") || lower.starts_with(HEADER_PREFIX) {
                        Err(format!(
                            "idempotency.key `header:{name}`: headers named x-* or dlqctl-* change on the broker's and dlqctl's copies, so they cannot identify a message; use message_id or a header of your own"
                        ))
                    } else {
                        Ok(KeySource::Header(name.to_string()))
                    }
                }
                None => Err(format!(
                    "idempotency.key must be message_id, header:NAME or body_sha256, not `{text}`"
                )),
            },
        }
    }

    /// As written in a topology.
    pub fn text(&self) -> String {
        match self {
            KeySource::MessageId => "message_id".into(),
            KeySource::Header(h) => format!("header:{h}"),
            KeySource::BodySha256 => "body_sha256".into(),
        }
    }
}

/// Where the keys are kept, as written (an `env:` name is read when the
/// worker starts, not here).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "at")]
pub enum StoreSpec {
    /// An SQLite file; `None`: the default path (docs/worker.md).
    Sqlite(Option<String>),
    /// A `redis://` or `rediss://` URL.
    Redis(String),
    /// The URL is in this environment variable.
    Env(String),
}

impl StoreSpec {
    /// As written: `sqlite:PATH`, `redis://…`, `rediss://…`, `env:NAME`.
    pub fn parse(text: &str) -> Result<StoreSpec, String> {
        if let Some(path) = text.strip_prefix("sqlite:") {
            return if path.is_empty() {
                Err("idempotency.store `sqlite:` needs a path, e.g. sqlite:/var/lib/dlqctl/orders.db (or leave store out for the default file)".into())
            } else {
                Ok(StoreSpec::Sqlite(Some(path.to_string())))
            };
        }
        if let Some(name) = text.strip_prefix("env:") {
            let ok =
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            return if ok {
                Ok(StoreSpec::Env(name.to_string()))
            } else {
                Err(format!("idempotency.store `env:{name}`: give an environment variable's name (letters, digits, _)"))
            };
        }
        if text.starts_with("redis://") || text.starts_with("rediss://") {
            return Ok(StoreSpec::Redis(text.to_string()));
        }
        Err(format!(
            "idempotency.store must be sqlite:PATH, redis://HOST:PORT/DB, rediss://… or env:NAME, not `{}`",
            redact_url(text)
        ))
    }

    /// A password written in the file itself (`redis://:secret@…`), which
    /// `validate` warns about: it belongs in the environment.
    pub fn has_inline_password(&self) -> bool {
        match self {
            StoreSpec::Redis(url) => crate::values::redact::has_password(url),
            _ => false,
        }
    }
}

/// `url` as a log or an error may show it: the one redaction of
/// [`crate::values::redact::url`].
pub fn redact_url(url: &str) -> String {
    crate::values::redact::url(url)
}

/// Default `keep` without a DLQ retention, and the shortest default:
/// 7 days.
pub(crate) const DEFAULT_KEEP_MS: u64 = 7 * 24 * 3_600_000;

/// The `keep` of a block that gives none: the pipeline's DLQ retention
/// (`dead_letter.ttl`), so that a copy replayed from the DLQ before it
/// expires there is still a duplicate, but never less than 7 days (a
/// producer's retry days later is still one); 7 days without a retention.
pub fn default_keep_ms(dlq_ttl_ms: Option<u64>) -> u64 {
    dlq_ttl_ms.map_or(DEFAULT_KEEP_MS, |ttl| ttl.max(DEFAULT_KEEP_MS))
}

/// What a delivery whose key is marked handled with another body does
/// (`on_conflict`; docs/worker.md, "Idempotent handling").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnConflict {
    /// The handler runs (under a lease); the mark keeps its first body,
    /// so every copy of the other body runs.
    Run,
    /// Dead-lettered with the reason `key_conflict`, without the handler:
    /// a person decides (the default).
    #[default]
    DeadLetter,
    /// Acked without the handler, as a duplicate.
    Skip,
}

impl OnConflict {
    /// As written in a topology: `run`, `dead_letter`, `skip`.
    pub fn parse(text: &str) -> Result<OnConflict, String> {
        match text {
            "run" => Ok(OnConflict::Run),
            "dead_letter" => Ok(OnConflict::DeadLetter),
            "skip" => Ok(OnConflict::Skip),
            _ => Err(format!(
                "idempotency.on_conflict must be run, dead_letter or skip, not `{text}`"
            )),
        }
    }

    /// As written in a topology.
    pub fn text(self) -> &'static str {
        match self {
            OnConflict::Run => "run",
            OnConflict::DeadLetter => "dead_letter",
            OnConflict::Skip => "skip",
        }
    }
}

/// A pipeline's `idempotency` block.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Idempotency {
    /// Where the key is read.
    pub key: KeySource,
    /// Where keys are kept.
    pub store: StoreSpec,
    /// How long a handled key is remembered, in ms.
    pub keep_ms: u64,
    /// What a key marked handled with another body does.
    pub on_conflict: OnConflict,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency {
            key: KeySource::MessageId,
            store: StoreSpec::Sqlite(None),
            keep_ms: DEFAULT_KEEP_MS,
            on_conflict: OnConflict::default(),
        }
    }
}

/// The key of a delivery, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOf {
    /// The key: raw bytes.
    Key(Vec<u8>),
    /// No such property or header, or an empty one.
    Missing,
    /// The header is there, but of a type that cannot identify a message
    /// (`table`, `array`, `void`): no key.
    Unusable(&'static str),
}

/// The key of a delivery: raw bytes, never converted; `None` when the
/// message has no such key (an empty id or header counts as none, and so
/// does a header of a type [`read_key`] finds unusable). A copy of a
/// `--rerun` replay adds its replay id to the key.
pub fn key_of(source: &KeySource, properties: &BasicProperties, body: &[u8]) -> Option<Vec<u8>> {
    match read_key(source, properties, body) {
        KeyOf::Key(k) => Some(k),
        KeyOf::Missing | KeyOf::Unusable(_) => None,
    }
}

/// [`key_of`], saying why there is no key.
pub fn read_key(source: &KeySource, properties: &BasicProperties, body: &[u8]) -> KeyOf {
    let headers = properties.headers().as_ref();
    let found = match source {
        KeySource::MessageId => properties
            .message_id()
            .as_ref()
            .map(|m| Ok(raw_bytes(m.as_str()).into_owned())),
        KeySource::Header(name) => headers
            .and_then(|h| h.inner().get(name.as_str()))
            .map(value_bytes),
        KeySource::BodySha256 => Some(Ok(body_sha256(body).to_vec())),
    };
    let mut key = match found {
        None => return KeyOf::Missing,
        Some(Err(kind)) => return KeyOf::Unusable(kind),
        Some(Ok(k)) if k.is_empty() => return KeyOf::Missing,
        Some(Ok(k)) => k,
    };
    if let Some(Ok(id)) = headers
        .and_then(|h| h.inner().get(RERUN_HEADER))
        .map(value_bytes)
    {
        // (key, replay id): a separator no id of ours holds.
        key.extend_from_slice(b"\0rerun\0");
        key.extend_from_slice(&id);
    }
    KeyOf::Key(key)
}

/// The bytes of a header value that identify a message. A string's
/// bytes, a byte array's, an integer's decimal text: the bytes they have
/// always had (marks made before still match). A boolean, decimal, float
/// or timestamp: `NUL type NUL text`, a key of its own that no string or
/// integer of the same text shares. A table, array or void: its type's
/// name, as the error (no key).
fn value_bytes(v: &AMQPValue) -> Result<Vec<u8>, &'static str> {
    let tagged = |kind: &str, text: String| {
        let mut k = Vec::with_capacity(kind.len() + text.len() + 2);
        k.push(0);
        k.extend_from_slice(kind.as_bytes());
        k.push(0);
        k.extend_from_slice(text.as_bytes());
        k
    };
    Ok(match v {
        AMQPValue::LongString(s) => s.as_bytes().to_vec(),
        AMQPValue::ShortString(s) => raw_bytes(s.as_str()).into_owned(),
        AMQPValue::ByteArray(b) => b.as_slice().to_vec(),
        AMQPValue::Boolean(b) => tagged("bool", b.to_string()),
        AMQPValue::DecimalValue(d) => tagged("decimal", format!("{}e-{}", d.value, d.scale)),
        AMQPValue::Float(f) => tagged("float", f.to_string()),
        AMQPValue::Double(f) => tagged("double", f.to_string()),
        AMQPValue::Timestamp(t) => tagged("timestamp", t.to_string()),
        AMQPValue::FieldTable(_) => return Err("table"),
        AMQPValue::FieldArray(_) => return Err("array"),
        AMQPValue::Void => return Err("void"),
        other => match as_integer(other) {
            Some(n) => n.to_string().into_bytes(),
            // Every integer type is one; nothing else is left.
            None => return Err("unknown"),
        },
    })
}

/// The SHA-256 of a body.
pub fn body_sha256(body: &[u8]) -> [u8; 32] {
    Sha256::digest(body).into()
}

/// The scope every key of one pipeline lives in: vhost and pipeline,
/// length-prefixed so that no two pairs give the same bytes.
pub fn scope(vhost: &str, pipeline: &str) -> Vec<u8> {
    format!("{}:{vhost}:{}:{pipeline}", vhost.len(), pipeline.len()).into_bytes()
}

/// The lease a handler run takes: its timeout plus a margin, so a handler
/// that ends at its timeout still holds it; renewed every third of it.
pub fn lease_ms(handler_timeout_ms: u64) -> u64 {
    handler_timeout_ms
        .saturating_add(LEASE_MARGIN_MS)
        .max(MIN_LEASE_MS)
}

/// The shortest lease for a store whose one call may take
/// `call_bound_ms` before it is counted as failed: three calls, so that
/// a renewal that takes the whole bound and fails, then the next that
/// takes it too, still end before the lease lapses.
pub fn lease_floor_ms(call_bound_ms: u64) -> u64 {
    call_bound_ms.saturating_mul(3)
}

/// How often a lease of `lease_ms` is renewed on a store whose call
/// takes at most `call_bound_ms`: every third of the lease, and never so
/// late that two slow renewals in a row (one failed, one that commits)
/// could let it lapse (`lease − 2 × bound`); at least 100 ms.
pub fn renew_every_ms(lease_ms: u64, call_bound_ms: u64) -> u64 {
    (lease_ms / 3)
        .min(lease_ms.saturating_sub(call_bound_ms.saturating_mul(2)))
        .max(100)
}

/// What a lease outlasts the handler's timeout by.
pub(crate) const LEASE_MARGIN_MS: u64 = 5_000;
/// The shortest lease.
pub(crate) const MIN_LEASE_MS: u64 = 10_000;
