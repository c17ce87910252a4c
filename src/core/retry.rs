//! The retry core: deaths and headers → attempt → decision, jitter, and the
//! properties of the copies the worker publishes.
//!
//! Pure: no I/O, no clock, no randomness. The current time and the uniform
//! random number are parameters, so every rule here is tested without a
//! broker.
//!
//! Choices the design leaves open, written down here once:
//!
//! - Times written into headers (`dlqctl-first-failed-at`,
//!   `dlqctl-dead-lettered-at`, the `time` of each `dlqctl-errors` entry)
//!   are RFC 3339 UTC strings with milliseconds, `2023-11-14T22:13:20.123Z`,
//!   made from [`CopyContext::now_unix_ms`]. Readable in the management UI,
//!   sortable as text, and more precise than an AMQP timestamp (seconds).
//! - Strings are written as long strings, integers as signed 64-bit
//!   integers (what RabbitMQ itself uses for `x-death` counts).
//! - Cut texts (`dlqctl-last-error`, history errors) keep their beginning
//!   and are cut on a UTF-8 character boundary, never inside a character.
//! - A header dlqctl reads back from an earlier copy is used only when it
//!   has the type and size dlqctl writes; otherwise it is treated as absent
//!   and rewritten. This is what keeps the added headers under
//!   [`MAX_ADDED_HEADERS_BYTES`] whatever a message arrives with.

use std::time::Duration;

use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

use crate::core::outcome::Outcome;
use crate::core::topology::RetryPolicy;

/// dlqctl's own attempt counter: handler runs already made.
pub const ATTEMPT_HEADER: &str = "dlqctl-attempt";
/// When the first handler run of this message failed.
pub const FIRST_FAILED_AT_HEADER: &str = "dlqctl-first-failed-at";
/// The error of the last failed run, at most [`MAX_LAST_ERROR_BYTES`].
pub const LAST_ERROR_HEADER: &str = "dlqctl-last-error";
/// The last [`MAX_HISTORY_ENTRIES`] failures, oldest first.
pub const ERRORS_HEADER: &str = "dlqctl-errors";
/// The exchange the message was first delivered from.
pub const ORIGINAL_EXCHANGE_HEADER: &str = "dlqctl-original-exchange";
/// The routing key the message was first delivered with.
pub const ORIGINAL_ROUTING_KEY_HEADER: &str = "dlqctl-original-routing-key";
/// Why a message was dead-lettered: `permanent` or `exhausted`.
pub const REASON_HEADER: &str = "dlqctl-reason";
/// When the message was dead-lettered.
pub const DEAD_LETTERED_AT_HEADER: &str = "dlqctl-dead-lettered-at";
/// The queue the message was dead-lettered from.
pub const SOURCE_QUEUE_HEADER: &str = "dlqctl-source-queue";

/// The headers every copy (re)writes.
const COPY_HEADERS: [&str; 6] = [
    ATTEMPT_HEADER,
    FIRST_FAILED_AT_HEADER,
    LAST_ERROR_HEADER,
    ERRORS_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
];

/// Every header a copy (re)writes: a retry copy the first six, a
/// dead-letter copy all. The bound [`MAX_ADDED_HEADERS_BYTES`] covers these.
pub const WRITTEN_HEADERS: [&str; 9] = [
    ATTEMPT_HEADER,
    FIRST_FAILED_AT_HEADER,
    LAST_ERROR_HEADER,
    ERRORS_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    REASON_HEADER,
    DEAD_LETTERED_AT_HEADER,
    SOURCE_QUEUE_HEADER,
];

/// Longest `dlqctl-last-error`, in bytes.
pub const MAX_LAST_ERROR_BYTES: usize = 1024;
/// Longest error of one `dlqctl-errors` entry, in bytes.
pub const MAX_HISTORY_ERROR_BYTES: usize = 256;
/// Entries kept in `dlqctl-errors`.
pub const MAX_HISTORY_ENTRIES: usize = 5;
/// Bound on the encoded size of the headers in [`WRITTEN_HEADERS`].
pub const MAX_ADDED_HEADERS_BYTES: usize = 8 * 1024;

/// Exchange, routing key and queue names are short strings on the wire.
const MAX_NAME_BYTES: usize = 255;
/// A time string read back from a header is kept only up to this length.
const MAX_TIME_BYTES: usize = 64;
/// Warnings returned by [`count_attempt`] for one delivery, at most.
const MAX_WARNINGS: usize = 10;
/// [`headers_to_json`] writes `null` for values nested deeper than this.
const MAX_JSON_DEPTH: usize = 64;

const X_DEATH: &str = "x-death";

// ---------------------------------------------------------------------------
// Attempts

/// What the headers of one delivery say about its attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptCount {
    /// H: `dlqctl-attempt`, the handler runs already made, when readable.
    pub own: Option<u32>,
    /// D: the sum of `count` over the `x-death` entries with reason
    /// `expired` from one of the pipeline's retry queues.
    pub deaths: u64,
    /// This run's number: max(H, D) + 1, at least 1, at most `u32::MAX`.
    pub attempt: u32,
    /// Headers of an unexpected type or shape, ignored; for the caller to
    /// log once. Never echoes header values, only types and positions.
    pub warnings: Vec<String>,
}

/// Computes the attempt number of a delivery from its headers.
///
/// Tolerant: a header of an unexpected type or shape is reported in
/// [`AttemptCount::warnings`] and treated as absent; no input panics or
/// overflows (counts add up saturating).
pub fn count_attempt(headers: Option<&FieldTable>, retry_queues: &[String]) -> AttemptCount {
    let mut warnings = Warnings::default();
    let get = |key: &str| headers.and_then(|h| h.inner().get(key));
    let own = get(ATTEMPT_HEADER).and_then(|v| read_own_attempt(v, &mut warnings));
    let deaths = get(X_DEATH).map_or(0, |v| sum_deaths(v, retry_queues, &mut warnings));
    let runs = u64::from(own.unwrap_or(0)).max(deaths);
    let attempt = u32::try_from(runs.saturating_add(1)).unwrap_or(u32::MAX);
    AttemptCount {
        own,
        deaths,
        attempt,
        warnings: warnings.finish(),
    }
}

fn read_own_attempt(value: &AMQPValue, warnings: &mut Warnings) -> Option<u32> {
    match as_integer(value) {
        None => {
            warnings.push(format!(
                "header {ATTEMPT_HEADER} is a {}, not an integer; ignored",
                value.get_type()
            ));
            None
        }
        Some(n) if n < 0 => {
            warnings.push(format!(
                "header {ATTEMPT_HEADER} is negative ({n}); ignored"
            ));
            None
        }
        Some(n) => Some(u32::try_from(n).unwrap_or_else(|_| {
            warnings.push(format!(
                "header {ATTEMPT_HEADER} is {n}, more than {}; counted as {}",
                u32::MAX,
                u32::MAX
            ));
            u32::MAX
        })),
    }
}

fn sum_deaths(value: &AMQPValue, retry_queues: &[String], warnings: &mut Warnings) -> u64 {
    let AMQPValue::FieldArray(entries) = value else {
        warnings.push(format!(
            "header {X_DEATH} is a {}, not an array; ignored",
            value.get_type()
        ));
        return 0;
    };
    let mut total: u64 = 0;
    for (i, entry) in entries.as_slice().iter().enumerate() {
        let AMQPValue::FieldTable(entry) = entry else {
            warnings.push(format!(
                "{X_DEATH} entry {i} is a {}, not a table; skipped",
                entry.get_type()
            ));
            continue;
        };
        let field = |name: &str| entry.inner().get(name).and_then(as_text);
        let (Some(reason), Some(queue)) = (field("reason"), field("queue")) else {
            warnings.push(format!(
                "{X_DEATH} entry {i} has no string reason or queue; skipped"
            ));
            continue;
        };
        if reason != b"expired" || !retry_queues.iter().any(|q| q.as_bytes() == queue) {
            continue;
        }
        match entry.inner().get("count").map(|c| (c, as_integer(c))) {
            Some((_, Some(n))) if n >= 0 => total = total.saturating_add(n.unsigned_abs()),
            Some((_, Some(n))) => warnings.push(format!(
                "{X_DEATH} entry {i} has a negative count ({n}); skipped"
            )),
            Some((c, None)) => warnings.push(format!(
                "{X_DEATH} entry {i} has a count of type {}, not an integer; skipped",
                c.get_type()
            )),
            None => warnings.push(format!("{X_DEATH} entry {i} has no count; skipped")),
        }
    }
    total
}

/// Collects at most [`MAX_WARNINGS`] warnings and counts the rest.
#[derive(Default)]
struct Warnings {
    list: Vec<String>,
    dropped: usize,
}

impl Warnings {
    fn push(&mut self, warning: String) {
        if self.list.len() < MAX_WARNINGS {
            self.list.push(warning);
        } else {
            self.dropped += 1;
        }
    }

    fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.list
                .push(format!("{} more header warnings not shown", self.dropped));
        }
        self.list
    }
}

/// Any AMQP integer type, widened; `None` for every other type (booleans,
/// floats, decimals, timestamps and strings included).
fn as_integer(value: &AMQPValue) -> Option<i64> {
    Some(match *value {
        AMQPValue::ShortShortInt(n) => n.into(),
        AMQPValue::ShortShortUInt(n) => n.into(),
        AMQPValue::ShortInt(n) => n.into(),
        AMQPValue::ShortUInt(n) => n.into(),
        AMQPValue::LongInt(n) => n.into(),
        AMQPValue::LongUInt(n) => n.into(),
        AMQPValue::LongLongInt(n) => n,
        _ => return None,
    })
}

/// The bytes of a long or short string.
fn as_text(value: &AMQPValue) -> Option<&[u8]> {
    match value {
        AMQPValue::LongString(s) => Some(s.as_bytes()),
        AMQPValue::ShortString(s) => Some(s.as_str().as_bytes()),
        _ => None,
    }
}

/// A long or short string that is valid UTF-8.
fn as_str(value: &AMQPValue) -> Option<&str> {
    as_text(value).and_then(|b| std::str::from_utf8(b).ok())
}

// ---------------------------------------------------------------------------
// Decisions

/// What the worker does with a delivery after a handler run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Acknowledge: done.
    Ack,
    /// Publish a copy to the retry tier of this delay, then ack.
    Retry {
        /// The tier (one of the policy's delays), in ms.
        delay_ms: u64,
    },
    /// Publish a copy to the dead-letter exchange, then ack.
    DeadLetter {
        /// Why.
        reason: DeadLetterReason,
    },
}

/// Why a message was dead-lettered (the `dlqctl-reason` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterReason {
    /// The handler said the message can never succeed.
    Permanent,
    /// Transient failures used up `max_attempts`.
    Exhausted,
}

impl DeadLetterReason {
    /// `permanent` or `exhausted`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Permanent => "permanent",
            DeadLetterReason::Exhausted => "exhausted",
        }
    }
}

impl std::fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Decides what happens after run number `attempt` (1 for the first run)
/// ended with `outcome`, following DESIGN.md's table:
///
/// - success: ack;
/// - permanent failure: dead-letter (`permanent`), whatever the attempt;
/// - transient failure with `attempt ≥ max_attempts`: dead-letter
///   (`exhausted`);
/// - transient failure otherwise: retry through tier
///   `delays[min(attempt, len) − 1]`; with a retry-after T (rounded up to
///   whole ms), through the smallest distinct tier d whose shortest jittered
///   wait `d × (1 − jitter)` is at least max(T, that tier), else through the
///   largest tier.
///
/// Note the rule's consequence: with jitter > 0, any retry-after moves the
/// message at least one tier up, since no tier's jittered wait reaches its
/// own delay.
///
/// Defensive on input the topology validation already refuses: attempt 0
/// counts as 1; an empty delay list dead-letters (`exhausted`); a jitter
/// outside 0..=1 or NaN is clamped (NaN as 0).
pub fn decide(policy: &RetryPolicy, attempt: u32, outcome: &Outcome) -> Decision {
    let retry_after = match outcome {
        Outcome::Success => return Decision::Ack,
        Outcome::Permanent { .. } => {
            return Decision::DeadLetter {
                reason: DeadLetterReason::Permanent,
            }
        }
        Outcome::Transient { retry_after, .. } => retry_after,
    };
    let exhausted = Decision::DeadLetter {
        reason: DeadLetterReason::Exhausted,
    };
    if attempt >= policy.max_attempts {
        return exhausted;
    }
    let row = usize::try_from(attempt.max(1))
        .unwrap_or(usize::MAX)
        .min(policy.delays.len());
    let Some(&base) = row.checked_sub(1).and_then(|i| policy.delays.get(i)) else {
        return exhausted;
    };
    let delay_ms = match retry_after {
        None => base,
        Some(t) => {
            // The tier must be at least the row's own delay, and its
            // shortest jittered wait must cover T. (DESIGN.md's literal
            // `d × (1 − jitter) ≥ max(T, row delay)` would push every
            // Retry-After, even 1 ms, one tier past the row whenever jitter
            // is above 0; the row's delay is already jittered without it.)
            let wanted = duration_ms_ceil(*t);
            let jitter = clamp_jitter(policy.jitter);
            let tiers = policy.tiers();
            tiers
                .iter()
                .copied()
                .find(|&d| d >= base && shortest_wait(d, jitter) >= wanted)
                .or_else(|| tiers.last().copied())
                .unwrap_or(base)
        }
    };
    Decision::Retry { delay_ms }
}

/// A duration in whole milliseconds, rounded up, saturating.
fn duration_ms_ceil(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// NaN → 0, else clamped into 0..=1.
fn clamp_jitter(jitter: f64) -> f64 {
    if jitter.is_nan() {
        0.0
    } else {
        jitter.clamp(0.0, 1.0)
    }
}

/// The shortest whole-ms wait the jitter can give tier `d`: floor(d × (1 −
/// jitter)). For a whole T, `d × (1 − jitter) ≥ T` exactly when this is ≥ T.
fn shortest_wait(d: u64, jitter: f64) -> u64 {
    floor_ms(d as f64 * (1.0 - jitter))
}

/// floor(x) for x ≥ 0, where x is the float image of a decimal product:
/// a value within a relative 1e-9 of a whole number is that number, so
/// `10000 × (1 − 0.33)` (6699.999999999999 in floats) is 6700, not 6699.
/// NaN and negatives give 0; huge values saturate.
fn floor_ms(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let nearest = x.round();
    if (x - nearest).abs() <= 1e-9 * nearest.max(1.0) {
        nearest as u64
    } else {
        x.floor() as u64
    }
}

// ---------------------------------------------------------------------------
// Jitter

/// The per-message `expiration` of a copy to tier `tier_ms`:
/// floor(d × (1 − jitter × u)) as a decimal integer string.
///
/// `u` is the caller's uniform random number, clamped into [0, 1) (NaN as
/// 0); `jitter` is clamped into 0..=1. The result is never fractional, never
/// "0" and never above the tier. `None` when jitter is 0 (or NaN, or
/// negative): the queue's TTL alone applies. `None` too for a tier of 0 ms,
/// which no valid topology has.
pub fn jitter_expiration(tier_ms: u64, jitter: f64, u: f64) -> Option<String> {
    let jitter = clamp_jitter(jitter);
    if jitter == 0.0 || tier_ms == 0 {
        return None;
    }
    let below_one = f64::from_bits(1.0_f64.to_bits() - 1);
    let u = if u.is_nan() {
        0.0
    } else {
        u.clamp(0.0, below_one)
    };
    let ms = floor_ms(tier_ms as f64 * (1.0 - jitter * u)).clamp(1, tier_ms);
    Some(ms.to_string())
}

// ---------------------------------------------------------------------------
// Copies

/// What a copy records about the run that failed and the delivery it
/// came from.
#[derive(Debug, Clone, Copy)]
pub struct CopyContext<'a> {
    /// Handler runs made, the failed one included (→ `dlqctl-attempt`).
    pub attempt: u32,
    /// The error of the failed run.
    pub error: &'a str,
    /// Now, in ms since the Unix epoch. Written as an RFC 3339 UTC string
    /// with milliseconds (see [`rfc3339_millis`]).
    pub now_unix_ms: u64,
    /// The exchange of this delivery (`""` when back from a retry queue).
    pub delivery_exchange: &'a str,
    /// The routing key of this delivery.
    pub delivery_routing_key: &'a str,
    /// The user the publishing connection authenticated as.
    pub connection_user: &'a str,
}

/// The properties of a copy to a retry tier.
///
/// Everything of the original is kept except: a `user_id` other than the
/// connection's user is dropped (the broker would refuse it);
/// `expiration` becomes `expiration` (the jitter value, or absent);
/// `delivery_mode` is 2 (persistent); the headers lose `x-death`,
/// `x-first-death-*`, `x-last-death-*` and `x-delivery-count`, and gain or
/// update `dlqctl-attempt`, `dlqctl-first-failed-at`, `dlqctl-last-error`,
/// `dlqctl-errors`, `dlqctl-original-exchange` and
/// `dlqctl-original-routing-key`. Other headers, other `dlqctl-*` ones
/// included, are kept as they are.
pub fn retry_copy(
    original: &BasicProperties,
    ctx: &CopyContext,
    expiration: Option<String>,
) -> BasicProperties {
    let headers = copy_headers(original.headers().as_ref(), ctx, true);
    let props = kept_properties(original, ctx.connection_user).with_headers(headers);
    match expiration.and_then(|e| ShortString::try_new(e).ok()) {
        Some(e) => props.with_expiration(e),
        None => props,
    }
}

/// The properties of a copy to the dead-letter exchange.
///
/// As [`retry_copy`], with `expiration` removed (a copied one would expire
/// the message in the DLQ) and these headers too: `dlqctl-reason`,
/// `dlqctl-dead-lettered-at` (now) and `dlqctl-source-queue`.
///
/// `handler_failed`: true when `ctx.error` is the error of a handler run
/// (the usual case: a permanent failure, or the last transient one), which
/// is then appended to `dlqctl-errors`. False when the worker dead-letters
/// without a run of its own (for example a delivery whose attempts were
/// already spent when it arrived): `ctx.error` is then only written as
/// `dlqctl-last-error` and the history is kept as it was.
pub fn dead_letter_copy(
    original: &BasicProperties,
    ctx: &CopyContext,
    reason: DeadLetterReason,
    source_queue: &str,
    handler_failed: bool,
) -> BasicProperties {
    let mut headers = copy_headers(original.headers().as_ref(), ctx, handler_failed);
    insert_str(&mut headers, REASON_HEADER, reason.as_str());
    insert_str(
        &mut headers,
        DEAD_LETTERED_AT_HEADER,
        &rfc3339_millis(ctx.now_unix_ms),
    );
    insert_str(
        &mut headers,
        SOURCE_QUEUE_HEADER,
        truncate_utf8(source_queue, MAX_NAME_BYTES),
    );
    kept_properties(original, ctx.connection_user).with_headers(headers)
}

/// The exchange and routing key a message was first delivered with: the
/// `dlqctl-original-*` headers where present as strings of at most 255
/// bytes, else (each on its own) the delivery's.
pub fn original_exchange_and_key(
    headers: Option<&FieldTable>,
    delivery_exchange: &str,
    delivery_routing_key: &str,
) -> (String, String) {
    let read = |key: &str, fallback: &str| {
        headers
            .and_then(|h| h.inner().get(key))
            .and_then(as_str)
            .filter(|s| s.len() <= MAX_NAME_BYTES)
            .unwrap_or_else(|| truncate_utf8(fallback, MAX_NAME_BYTES))
            .to_string()
    };
    (
        read(ORIGINAL_EXCHANGE_HEADER, delivery_exchange),
        read(ORIGINAL_ROUTING_KEY_HEADER, delivery_routing_key),
    )
}

/// The encoded size in bytes of the headers in [`WRITTEN_HEADERS`] present
/// in `headers`, as AMQP 0-9-1 field-table entries: for each, the key (1
/// length byte + bytes) and the value (1 type byte + payload, nested tables
/// and arrays with their 4-byte length). Exact for the encoding lapin uses.
pub fn written_headers_size(headers: &FieldTable) -> usize {
    headers
        .inner()
        .iter()
        .filter(|(k, _)| WRITTEN_HEADERS.contains(&k.as_str()))
        .map(|(k, v)| entry_size(k.as_str(), v))
        .fold(0, usize::saturating_add)
}

fn entry_size(key: &str, value: &AMQPValue) -> usize {
    (1 + key.len()).saturating_add(value_size(value))
}

/// Type byte + payload of one value.
fn value_size(value: &AMQPValue) -> usize {
    let payload = match value {
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::ShortString(s) => 1 + s.as_str().len(),
        AMQPValue::LongString(s) => 4usize.saturating_add(s.len()),
        AMQPValue::ByteArray(a) => 4usize.saturating_add(a.len()),
        AMQPValue::FieldArray(a) => a
            .as_slice()
            .iter()
            .map(value_size)
            .fold(4, usize::saturating_add),
        AMQPValue::FieldTable(t) => t
            .inner()
            .iter()
            .map(|(k, v)| entry_size(k.as_str(), v))
            .fold(4, usize::saturating_add),
        AMQPValue::Void => 0,
    };
    1 + payload
}

/// The original's properties a copy keeps: all but `expiration`, `headers`
/// and a foreign `user_id`; `delivery_mode` forced to 2.
fn kept_properties(original: &BasicProperties, connection_user: &str) -> BasicProperties {
    let mut p = BasicProperties::default().with_delivery_mode(2);
    if let Some(v) = original.content_type() {
        p = p.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        p = p.with_content_encoding(v.clone());
    }
    if let Some(v) = original.priority() {
        p = p.with_priority(*v);
    }
    if let Some(v) = original.correlation_id() {
        p = p.with_correlation_id(v.clone());
    }
    if let Some(v) = original.reply_to() {
        p = p.with_reply_to(v.clone());
    }
    if let Some(v) = original.message_id() {
        p = p.with_message_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        p = p.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        p = p.with_type(v.clone());
    }
    if let Some(v) = original.user_id() {
        if v.as_str() == connection_user {
            p = p.with_user_id(v.clone());
        }
    }
    if let Some(v) = original.app_id() {
        p = p.with_app_id(v.clone());
    }
    if let Some(v) = original.cluster_id() {
        p = p.with_cluster_id(v.clone());
    }
    p
}

/// Headers the broker writes about deaths and deliveries; a copy that kept
/// them would hand an old history back (see rabbitmq-facts.md).
fn is_broker_history(key: &str) -> bool {
    key == X_DEATH
        || key == "x-delivery-count"
        || key.starts_with("x-first-death-")
        || key.starts_with("x-last-death-")
}

fn copy_headers(
    original: Option<&FieldTable>,
    ctx: &CopyContext,
    record_failure: bool,
) -> FieldTable {
    let old = |key: &str| original.and_then(|h| h.inner().get(key));
    let now = rfc3339_millis(ctx.now_unix_ms);

    let mut out = FieldTable::default();
    for (k, v) in original.into_iter().flatten() {
        let key = k.as_str();
        if !is_broker_history(key) && !COPY_HEADERS.contains(&key) {
            out.insert(k.clone(), v.clone());
        }
    }

    out.insert(
        ATTEMPT_HEADER.into(),
        AMQPValue::LongLongInt(ctx.attempt.into()),
    );
    let first_failed_at = old(FIRST_FAILED_AT_HEADER)
        .and_then(as_str)
        .filter(|s| s.len() <= MAX_TIME_BYTES)
        .unwrap_or(&now);
    insert_str(&mut out, FIRST_FAILED_AT_HEADER, first_failed_at);
    insert_str(
        &mut out,
        LAST_ERROR_HEADER,
        truncate_utf8(ctx.error, MAX_LAST_ERROR_BYTES),
    );

    let mut history = read_history(old(ERRORS_HEADER));
    if record_failure {
        history.push(history_entry(
            i64::from(ctx.attempt),
            &now,
            truncate_utf8(ctx.error, MAX_HISTORY_ERROR_BYTES),
        ));
    }
    let excess = history.len().saturating_sub(MAX_HISTORY_ENTRIES);
    history.drain(..excess);
    out.insert(
        ERRORS_HEADER.into(),
        AMQPValue::FieldArray(FieldArray::from(history)),
    );

    let (exchange, routing_key) =
        original_exchange_and_key(original, ctx.delivery_exchange, ctx.delivery_routing_key);
    insert_str(&mut out, ORIGINAL_EXCHANGE_HEADER, &exchange);
    insert_str(&mut out, ORIGINAL_ROUTING_KEY_HEADER, &routing_key);
    out
}

/// The well-formed entries of an existing `dlqctl-errors`, rebuilt within
/// the bounds dlqctl writes. Anything else is dropped: a header that is not
/// an array starts a fresh history, an entry that is not a table with an
/// integer `attempt`, a string `time` (≤ 64 bytes) and a string `error` is
/// left out, the others kept in order.
fn read_history(value: Option<&AMQPValue>) -> Vec<AMQPValue> {
    let Some(AMQPValue::FieldArray(entries)) = value else {
        return Vec::new();
    };
    entries
        .as_slice()
        .iter()
        .filter_map(|entry| {
            let AMQPValue::FieldTable(t) = entry else {
                return None;
            };
            let attempt = t.inner().get("attempt").and_then(as_integer)?;
            let time = t
                .inner()
                .get("time")
                .and_then(as_str)
                .filter(|s| s.len() <= MAX_TIME_BYTES)?;
            let error = String::from_utf8_lossy(t.inner().get("error").and_then(as_text)?);
            Some(history_entry(
                attempt,
                time,
                truncate_utf8(&error, MAX_HISTORY_ERROR_BYTES),
            ))
        })
        .collect()
}

fn history_entry(attempt: i64, time: &str, error: &str) -> AMQPValue {
    let mut t = FieldTable::default();
    t.insert("attempt".into(), AMQPValue::LongLongInt(attempt));
    insert_str(&mut t, "time", time);
    insert_str(&mut t, "error", error);
    AMQPValue::FieldTable(t)
}

/// Inserts a long-string value. `key` must be at most 255 bytes (all
/// callers pass constants).
fn insert_str(table: &mut FieldTable, key: &'static str, value: &str) {
    table.insert(
        ShortString::from(key),
        AMQPValue::LongString(LongString::from(value)),
    );
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Formats ms since the Unix epoch as RFC 3339 UTC with milliseconds:
/// `2023-11-14T22:13:20.123Z`. Years past 9999 get more digits (no panic).
pub fn rfc3339_millis(unix_ms: u64) -> String {
    let ms = unix_ms % 1000;
    let secs = unix_ms / 1000;
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60
    )
}

/// Year, month, day of a day count since 1970-01-01 (H. Hinnant's
/// algorithm, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

// ---------------------------------------------------------------------------
// Headers as JSON

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

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{ByteArray, DecimalValue};

    // ---- helpers ----------------------------------------------------------

    fn ls(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s))
    }

    fn ss(s: &str) -> AMQPValue {
        AMQPValue::ShortString(ShortString::from(s))
    }

    fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert(ShortString::from(k), v);
        }
        t
    }

    fn array(values: Vec<AMQPValue>) -> AMQPValue {
        AMQPValue::FieldArray(FieldArray::from(values))
    }

    fn death(queue: &str, reason: &str, count: AMQPValue) -> AMQPValue {
        AMQPValue::FieldTable(table(vec![
            ("queue", ls(queue)),
            ("reason", ls(reason)),
            ("count", count),
            ("exchange", ls("orders.retry")),
            ("time", AMQPValue::Timestamp(1_700_000_000)),
        ]))
    }

    fn xdeath(entries: Vec<AMQPValue>) -> FieldTable {
        table(vec![(X_DEATH, array(entries))])
    }

    fn queues() -> Vec<String> {
        vec![
            "orders.retry.1s".to_string(),
            "orders.retry.10s".to_string(),
            "orders.retry.1m".to_string(),
        ]
    }

    fn count(headers: &FieldTable) -> AttemptCount {
        count_attempt(Some(headers), &queues())
    }

    /// Every AMQP integer type holding 3.
    fn threes() -> Vec<AMQPValue> {
        vec![
            AMQPValue::ShortShortInt(3),
            AMQPValue::ShortShortUInt(3),
            AMQPValue::ShortInt(3),
            AMQPValue::ShortUInt(3),
            AMQPValue::LongInt(3),
            AMQPValue::LongUInt(3),
            AMQPValue::LongLongInt(3),
        ]
    }

    /// Values of every type that is not an integer.
    fn non_integers() -> Vec<AMQPValue> {
        vec![
            AMQPValue::Boolean(true),
            AMQPValue::Float(3.0),
            AMQPValue::Double(3.0),
            AMQPValue::DecimalValue(DecimalValue { scale: 0, value: 3 }),
            ss("3"),
            ls("3"),
            array(vec![AMQPValue::LongLongInt(3)]),
            AMQPValue::Timestamp(3),
            AMQPValue::FieldTable(table(vec![("count", AMQPValue::LongLongInt(3))])),
            AMQPValue::ByteArray(ByteArray::from(vec![3u8])),
            AMQPValue::Void,
        ]
    }

    // ---- count_attempt ----------------------------------------------------

    #[test]
    fn no_headers_is_the_first_attempt() {
        let c = count_attempt(None, &queues());
        assert_eq!(
            c,
            AttemptCount {
                own: None,
                deaths: 0,
                attempt: 1,
                warnings: vec![]
            }
        );
        let c = count(&table(vec![("x-other", ls("y"))]));
        assert_eq!((c.own, c.deaths, c.attempt), (None, 0, 1));
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn own_header_of_every_integer_type_is_read() {
        for v in threes() {
            let c = count(&table(vec![(ATTEMPT_HEADER, v.clone())]));
            assert_eq!((c.own, c.attempt), (Some(3), 4), "{v:?}");
            assert!(c.warnings.is_empty(), "{v:?}");
        }
    }

    #[test]
    fn own_header_of_another_type_is_ignored_with_a_warning() {
        for v in non_integers() {
            let c = count(&table(vec![(ATTEMPT_HEADER, v.clone())]));
            assert_eq!((c.own, c.attempt), (None, 1), "{v:?}");
            assert_eq!(c.warnings.len(), 1, "{v:?}");
            assert!(c.warnings[0].contains(ATTEMPT_HEADER), "{:?}", c.warnings);
        }
    }

    #[test]
    fn negative_own_header_is_ignored_with_a_warning() {
        for v in [
            AMQPValue::ShortShortInt(-1),
            AMQPValue::ShortInt(-2),
            AMQPValue::LongInt(-3),
            AMQPValue::LongLongInt(i64::MIN),
        ] {
            let c = count(&table(vec![(ATTEMPT_HEADER, v.clone())]));
            assert_eq!((c.own, c.attempt), (None, 1), "{v:?}");
            assert_eq!(c.warnings.len(), 1, "{v:?}");
        }
    }

    #[test]
    fn huge_own_header_saturates() {
        let c = count(&table(vec![(
            ATTEMPT_HEADER,
            AMQPValue::LongLongInt(i64::MAX),
        )]));
        assert_eq!((c.own, c.attempt), (Some(u32::MAX), u32::MAX));
        assert_eq!(c.warnings.len(), 1);
        let c = count(&table(vec![(
            ATTEMPT_HEADER,
            AMQPValue::LongUInt(u32::MAX),
        )]));
        assert_eq!((c.own, c.attempt), (Some(u32::MAX), u32::MAX));
        assert!(c.warnings.is_empty());
        let c = count(&table(vec![(
            ATTEMPT_HEADER,
            AMQPValue::LongUInt(u32::MAX - 1),
        )]));
        assert_eq!(c.attempt, u32::MAX);
        let c = count(&table(vec![(ATTEMPT_HEADER, AMQPValue::LongLongInt(0))]));
        assert_eq!((c.own, c.attempt), (Some(0), 1));
    }

    #[test]
    fn deaths_sum_the_counts_of_every_tier_queue() {
        let c = count(&xdeath(vec![
            death("orders.retry.10s", "expired", AMQPValue::LongLongInt(2)),
            death("orders.retry.1s", "expired", AMQPValue::LongLongInt(3)),
        ]));
        assert_eq!((c.own, c.deaths, c.attempt), (None, 5, 6));
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn deaths_ignore_other_queues_and_other_reasons() {
        let c = count(&xdeath(vec![
            death("orders.retry.1s", "rejected", AMQPValue::LongLongInt(10)),
            death("orders.retry.1s", "maxlen", AMQPValue::LongLongInt(10)),
            death("orders", "expired", AMQPValue::LongLongInt(10)),
            death("orders", "delivery_limit", AMQPValue::LongLongInt(10)),
            death("payments.retry.1s", "expired", AMQPValue::LongLongInt(10)),
            death("orders.retry.1s.x", "expired", AMQPValue::LongLongInt(10)),
            death("orders.retry.1m", "Expired", AMQPValue::LongLongInt(10)),
            death("orders.retry.1m", "expired", AMQPValue::LongLongInt(1)),
        ]));
        assert_eq!((c.deaths, c.attempt), (1, 2));
        assert!(c.warnings.is_empty());
        // No retry queues at all: nothing counts.
        let c = count_attempt(
            Some(&xdeath(vec![death(
                "orders.retry.1s",
                "expired",
                AMQPValue::LongLongInt(4),
            )])),
            &[],
        );
        assert_eq!((c.deaths, c.attempt), (0, 1));
    }

    #[test]
    fn death_count_of_every_integer_type_is_read() {
        for v in threes() {
            let c = count(&xdeath(vec![death(
                "orders.retry.1s",
                "expired",
                v.clone(),
            )]));
            assert_eq!((c.deaths, c.attempt), (3, 4), "{v:?}");
            assert!(c.warnings.is_empty(), "{v:?}");
        }
    }

    #[test]
    fn death_reason_and_queue_may_be_short_strings() {
        let entry = AMQPValue::FieldTable(table(vec![
            ("queue", ss("orders.retry.10s")),
            ("reason", ss("expired")),
            ("count", AMQPValue::LongLongInt(2)),
        ]));
        let c = count(&xdeath(vec![entry]));
        assert_eq!(c.deaths, 2);
    }

    #[test]
    fn attempt_is_the_larger_of_own_and_deaths_plus_one() {
        let mut h = xdeath(vec![death(
            "orders.retry.1s",
            "expired",
            AMQPValue::LongLongInt(5),
        )]);
        h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(2));
        assert_eq!(count(&h).attempt, 6);
        h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(7));
        let c = count(&h);
        assert_eq!((c.own, c.deaths, c.attempt), (Some(7), 5, 8));
    }

    #[test]
    fn x_death_that_is_not_an_array_is_ignored_with_a_warning() {
        for v in [
            ls("garbage"),
            AMQPValue::FieldTable(table(vec![("count", AMQPValue::LongLongInt(3))])),
            AMQPValue::LongLongInt(3),
            AMQPValue::Void,
        ] {
            let mut h = table(vec![(X_DEATH, v.clone())]);
            h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(1));
            let c = count(&h);
            assert_eq!((c.own, c.deaths, c.attempt), (Some(1), 0, 2), "{v:?}");
            assert_eq!(c.warnings.len(), 1, "{v:?}");
            assert!(c.warnings[0].contains(X_DEATH));
        }
    }

    #[test]
    fn malformed_death_entries_are_skipped_each_with_a_warning() {
        let q = "orders.retry.1s";
        let bad = vec![
            ls("SECRET"),
            array(vec![death(q, "expired", AMQPValue::LongLongInt(100))]),
            AMQPValue::FieldTable(table(vec![
                ("queue", ls(q)),
                ("count", AMQPValue::LongLongInt(100)),
            ])),
            AMQPValue::FieldTable(table(vec![
                ("reason", ls("expired")),
                ("count", AMQPValue::LongLongInt(100)),
            ])),
            AMQPValue::FieldTable(table(vec![
                ("queue", AMQPValue::LongLongInt(1)),
                ("reason", ls("expired")),
                ("count", AMQPValue::LongLongInt(100)),
            ])),
            AMQPValue::FieldTable(table(vec![
                ("queue", ls(q)),
                ("reason", AMQPValue::Boolean(true)),
                ("count", AMQPValue::LongLongInt(100)),
            ])),
            AMQPValue::FieldTable(table(vec![("queue", ls(q)), ("reason", ls("expired"))])),
            death(q, "expired", ls("100")),
            death(q, "expired", AMQPValue::Double(100.0)),
            death(q, "expired", AMQPValue::Timestamp(100)),
            death(q, "expired", AMQPValue::LongLongInt(-100)),
        ];
        let n_bad = bad.len();
        let mut entries = bad;
        entries.push(death(q, "expired", AMQPValue::LongLongInt(2)));
        entries.push(death(
            "orders.retry.10s",
            "expired",
            AMQPValue::ShortShortUInt(1),
        ));
        let c = count(&xdeath(entries));
        assert_eq!((c.deaths, c.attempt), (3, 4));
        // n_bad warnings, capped at MAX_WARNINGS plus one summary line.
        assert_eq!(n_bad, MAX_WARNINGS + 1);
        assert_eq!(c.warnings.len(), MAX_WARNINGS + 1);
        assert_eq!(c.warnings[MAX_WARNINGS], "1 more header warnings not shown");
        assert!(c.warnings[..MAX_WARNINGS]
            .iter()
            .all(|w| w.contains("x-death entry")));
        // Warnings name types and positions, never the header values.
        assert!(c.warnings.iter().all(|w| !w.contains("SECRET")));
        assert!(c.warnings[0].contains("entry 0"));
    }

    #[test]
    fn garbage_count_of_an_irrelevant_entry_is_not_a_warning() {
        let c = count(&xdeath(vec![
            death("orders.retry.1s", "rejected", ls("x")),
            death("elsewhere", "expired", AMQPValue::Void),
        ]));
        assert_eq!(c.deaths, 0);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn hostile_counts_saturate_instead_of_overflowing() {
        let q = "orders.retry.1s";
        let entries = vec![death(q, "expired", AMQPValue::LongLongInt(i64::MAX)); 3];
        let c = count(&xdeath(entries));
        assert_eq!((c.deaths, c.attempt), (u64::MAX, u32::MAX));
        let c = count(&xdeath(vec![death(
            q,
            "expired",
            AMQPValue::LongLongInt(i64::from(u32::MAX)),
        )]));
        assert_eq!(c.attempt, u32::MAX);
    }

    #[test]
    fn many_bad_entries_give_a_bounded_number_of_warnings() {
        let c = count(&xdeath(vec![AMQPValue::Void; 10_000]));
        assert_eq!(c.warnings.len(), MAX_WARNINGS + 1);
        assert_eq!(
            c.warnings.last().map(String::as_str),
            Some("9990 more header warnings not shown")
        );
    }

    // ---- decide -----------------------------------------------------------

    fn policy(delays: &[u64], max_attempts: u32, jitter: f64) -> RetryPolicy {
        RetryPolicy {
            delays: delays.to_vec(),
            max_attempts,
            jitter,
        }
    }

    fn retry(delay_ms: u64) -> Decision {
        Decision::Retry { delay_ms }
    }

    const EXHAUSTED: Decision = Decision::DeadLetter {
        reason: DeadLetterReason::Exhausted,
    };
    const PERMANENT: Decision = Decision::DeadLetter {
        reason: DeadLetterReason::Permanent,
    };

    fn after(ms: u64) -> Outcome {
        Outcome::Transient {
            error: "busy".into(),
            retry_after: Some(Duration::from_millis(ms)),
        }
    }

    #[test]
    fn success_is_always_acked() {
        let p = policy(&[1000], 3, 0.1);
        for attempt in [0, 1, 2, 3, 4, u32::MAX] {
            assert_eq!(decide(&p, attempt, &Outcome::Success), Decision::Ack);
        }
    }

    #[test]
    fn permanent_is_always_dead_lettered_as_permanent() {
        let p = policy(&[1000], 3, 0.1);
        for attempt in [0, 1, 2, 3, 4, u32::MAX] {
            assert_eq!(decide(&p, attempt, &Outcome::permanent("bad")), PERMANENT);
        }
    }

    #[test]
    fn transient_walks_the_delays_then_stays_on_the_last() {
        let p = policy(&[1000, 10_000, 60_000], 6, 0.1);
        let t = Outcome::transient("down");
        assert_eq!(decide(&p, 1, &t), retry(1000));
        assert_eq!(decide(&p, 2, &t), retry(10_000));
        assert_eq!(decide(&p, 3, &t), retry(60_000));
        assert_eq!(decide(&p, 4, &t), retry(60_000));
        assert_eq!(decide(&p, 5, &t), retry(60_000));
        assert_eq!(decide(&p, 6, &t), EXHAUSTED);
        assert_eq!(decide(&p, 7, &t), EXHAUSTED);
        assert_eq!(decide(&p, u32::MAX, &t), EXHAUSTED);
    }

    #[test]
    fn a_single_attempt_budget_never_retries() {
        let p = policy(&[1000], 1, 0.0);
        assert_eq!(decide(&p, 1, &Outcome::transient("x")), EXHAUSTED);
        assert_eq!(decide(&p, 1, &after(5)), EXHAUSTED);
        assert_eq!(decide(&p, 1, &Outcome::Success), Decision::Ack);
    }

    #[test]
    fn exhausted_wins_over_retry_after() {
        let p = policy(&[1000, 10_000], 3, 0.0);
        assert_eq!(decide(&p, 3, &after(1)), EXHAUSTED);
        assert_eq!(decide(&p, 2, &after(1)), retry(10_000));
    }

    #[test]
    fn repeated_delays_follow_the_list_order() {
        let p = policy(&[1000, 1000, 10_000, 1000], 10, 0.0);
        let t = Outcome::transient("x");
        let picked: Vec<_> = (1..=6).map(|a| decide(&p, a, &t)).collect();
        assert_eq!(
            picked,
            [1000, 1000, 10_000, 1000, 1000, 1000].map(retry).to_vec()
        );
        // Retry-after picks among distinct tiers.
        assert_eq!(decide(&p, 1, &after(1001)), retry(10_000));
        assert_eq!(decide(&p, 4, &after(10_001)), retry(10_000));
    }

    #[test]
    fn defensive_inputs_do_not_panic() {
        let t = Outcome::transient("x");
        // Attempt 0 counts as the first.
        assert_eq!(decide(&policy(&[1000, 2000], 3, 0.0), 0, &t), retry(1000));
        // No delays: nowhere to retry.
        assert_eq!(decide(&policy(&[], 3, 0.0), 1, &t), EXHAUSTED);
        assert_eq!(decide(&policy(&[], 3, 0.0), 1, &after(5)), EXHAUSTED);
        // Jitter out of range or NaN.
        assert_eq!(
            decide(&policy(&[1000, 2000], 3, f64::NAN), 1, &after(1000)),
            retry(1000)
        );
        assert_eq!(
            decide(&policy(&[1000, 2000], 3, -1.0), 1, &after(1000)),
            retry(1000)
        );
        assert_eq!(
            decide(&policy(&[1000, 2000], 3, 7.0), 1, &after(1)),
            retry(2000)
        );
        // max_attempts 0.
        assert_eq!(decide(&policy(&[1000], 0, 0.0), 1, &t), EXHAUSTED);
    }

    #[test]
    fn retry_after_without_jitter() {
        let p = policy(&[1000, 10_000, 60_000], 6, 0.0);
        // Shorter than the row's delay: the row's tier.
        assert_eq!(decide(&p, 1, &after(0)), retry(1000));
        assert_eq!(decide(&p, 1, &after(1)), retry(1000));
        assert_eq!(decide(&p, 2, &after(1000)), retry(10_000));
        // Exactly a tier: that tier.
        assert_eq!(decide(&p, 1, &after(1000)), retry(1000));
        assert_eq!(decide(&p, 1, &after(10_000)), retry(10_000));
        // Just over a tier: the next one.
        assert_eq!(decide(&p, 1, &after(1001)), retry(10_000));
        assert_eq!(decide(&p, 1, &after(10_001)), retry(60_000));
        // Longer than every tier: the largest.
        assert_eq!(decide(&p, 1, &after(60_001)), retry(60_000));
        assert_eq!(decide(&p, 1, &after(u64::MAX)), retry(60_000));
        let huge = Outcome::Transient {
            error: "x".into(),
            retry_after: Some(Duration::MAX),
        };
        assert_eq!(decide(&p, 1, &huge), retry(60_000));
    }

    #[test]
    fn retry_after_rounds_sub_milliseconds_up() {
        let p = policy(&[1000, 10_000], 6, 0.0);
        let t = |d| Outcome::Transient {
            error: "x".into(),
            retry_after: Some(d),
        };
        assert_eq!(
            decide(&p, 1, &t(Duration::from_micros(1_000_001))),
            retry(10_000)
        );
        assert_eq!(
            decide(&p, 1, &t(Duration::from_micros(999_999))),
            retry(1000)
        );
        assert_eq!(
            decide(&p, 1, &t(Duration::from_nanos(1_000_000_000))),
            retry(1000)
        );
    }

    #[test]
    fn retry_after_with_jitter_uses_the_shortest_jittered_wait() {
        let p = policy(&[1000, 10_000, 60_000], 6, 0.1);
        // 10s × 0.9 = 9s: exactly equal is enough.
        assert_eq!(decide(&p, 1, &after(9000)), retry(10_000));
        assert_eq!(decide(&p, 1, &after(9001)), retry(60_000));
        // A retry-after that the row's own tier covers keeps the row: its
        // shortest jittered wait (1s × 0.9) is at least 1 ms.
        assert_eq!(decide(&p, 1, &after(1)), retry(1000));
        assert_eq!(decide(&p, 1, &after(900)), retry(1000));
        assert_eq!(decide(&p, 1, &after(901)), retry(10_000));
        assert_eq!(decide(&p, 2, &after(1)), retry(10_000));
        // Never a tier below the row's own delay.
        assert_eq!(decide(&p, 3, &after(1)), retry(60_000));
        // Nothing is long enough: the largest.
        assert_eq!(decide(&p, 1, &after(54_001)), retry(60_000));
        assert_eq!(decide(&p, 1, &after(54_000)), retry(60_000));
        // Without retry-after, jitter does not change the row.
        assert_eq!(decide(&p, 1, &Outcome::transient("x")), retry(1000));
    }

    #[test]
    fn retry_after_boundary_survives_float_rounding() {
        // 10000 × (1 − 0.33) is 6699.999999999999 in f64 arithmetic.
        let p = policy(&[1000, 10_000, 20_000], 6, 0.33);
        assert_eq!(decide(&p, 1, &after(6700)), retry(10_000));
        assert_eq!(decide(&p, 1, &after(6701)), retry(20_000));
        let p = policy(&[500, 1000, 5000], 6, 0.07);
        assert_eq!(decide(&p, 1, &after(930)), retry(1000));
        assert_eq!(decide(&p, 1, &after(931)), retry(5000));
        // The row's own tier covers 700 ms: 1000 × 0.7 = 700.
        let p = policy(&[1000, 5000], 6, 0.3);
        assert_eq!(decide(&p, 1, &after(700)), retry(1000));
        assert_eq!(decide(&p, 1, &after(701)), retry(5000));
    }

    #[test]
    fn a_chosen_tier_never_waits_less_than_retry_after() {
        let delays = [100, 1000, 1500, 10_000, 60_000, 600_000];
        let just_below_one = f64::from_bits(1.0_f64.to_bits() - 1);
        for jitter in [0.0, 0.05, 0.07, 0.1, 0.25, 0.33, 0.5] {
            let p = policy(&delays, 10, jitter);
            for t in (0..700_000)
                .step_by(997)
                .chain([1, 99, 100, 101, 9000, 59_999])
            {
                for attempt in 1..=3 {
                    let Decision::Retry { delay_ms } = decide(&p, attempt, &after(t)) else {
                        panic!("not a retry");
                    };
                    if delay_ms == 600_000 {
                        continue; // the largest tier is the fallback
                    }
                    for u in [0.0, 0.5, 0.999_999, just_below_one, 1.0] {
                        let wait = jitter_expiration(delay_ms, jitter, u)
                            .map_or(delay_ms, |e| e.parse().expect("an integer"));
                        assert!(wait >= t, "t={t} j={jitter} u={u} d={delay_ms} wait={wait}");
                        let row = delays[attempt as usize - 1];
                        assert!(delay_ms >= row, "t={t} j={jitter} u={u} d={delay_ms}");
                    }
                }
            }
        }
    }

    #[test]
    fn dead_letter_reasons_have_their_header_values() {
        assert_eq!(DeadLetterReason::Permanent.as_str(), "permanent");
        assert_eq!(DeadLetterReason::Exhausted.as_str(), "exhausted");
        assert_eq!(DeadLetterReason::Exhausted.to_string(), "exhausted");
    }

    // ---- jitter -----------------------------------------------------------

    fn exp(d: u64, j: f64, u: f64) -> Option<String> {
        jitter_expiration(d, j, u)
    }

    #[test]
    fn no_jitter_no_expiration() {
        for u in [0.0, 0.5, 0.99] {
            assert_eq!(exp(10_000, 0.0, u), None);
            assert_eq!(exp(10_000, -0.1, u), None);
            assert_eq!(exp(10_000, f64::NAN, u), None);
        }
        assert_eq!(exp(0, 0.1, 0.5), None);
    }

    #[test]
    fn jitter_is_floor_of_the_formula() {
        assert_eq!(exp(10_000, 0.1, 0.0).as_deref(), Some("10000"));
        assert_eq!(exp(10_000, 0.1, 0.5).as_deref(), Some("9500"));
        assert_eq!(exp(10_000, 0.5, 0.5).as_deref(), Some("7500"));
        assert_eq!(exp(1001, 0.1, 0.5).as_deref(), Some("950")); // 950.95
        assert_eq!(exp(10_000, 0.5, 0.999_999).as_deref(), Some("5000"));
        assert_eq!(exp(10_000, 0.33, 1.0 - 1e-12).as_deref(), Some("6700"));
    }

    #[test]
    fn jitter_clamps_u_into_zero_to_one() {
        assert_eq!(exp(10_000, 0.5, -3.0).as_deref(), Some("10000"));
        assert_eq!(exp(10_000, 0.5, f64::NAN).as_deref(), Some("10000"));
        assert_eq!(exp(10_000, 0.5, 1.0).as_deref(), Some("5000"));
        assert_eq!(exp(10_000, 0.5, 7.0).as_deref(), Some("5000"));
        assert_eq!(exp(10_000, 0.5, f64::INFINITY).as_deref(), Some("5000"));
    }

    #[test]
    fn jitter_is_a_whole_number_between_one_and_the_tier() {
        assert_eq!(exp(1, 0.5, 0.99).as_deref(), Some("1"));
        assert_eq!(exp(1, 1.0, 0.999).as_deref(), Some("1"));
        assert_eq!(exp(3, 1.0, 0.999).as_deref(), Some("1"));
        let max = crate::core::duration::MAX_MILLIS;
        assert_eq!(exp(max, 0.5, 0.0), Some(max.to_string()));
        for d in [1, 2, 3, 7, 999, 1000, 1001, 60_000, max] {
            for j in [0.01, 0.1, 0.33, 0.5] {
                for i in 0..=100 {
                    let u = f64::from(i) / 100.0;
                    let e = exp(d, j, u).expect("jitter is on");
                    assert!(
                        !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()),
                        "{e}"
                    );
                    let n: u64 = e.parse().expect("an integer");
                    assert!((1..=d).contains(&n), "d={d} j={j} u={u} -> {n}");
                    let low = (d as f64 * (1.0 - j)).floor() as u64;
                    assert!(n + 1 >= low.max(1), "d={d} j={j} u={u} -> {n}");
                }
            }
        }
    }

    // ---- copies -----------------------------------------------------------

    const NOW: u64 = 1_700_000_000_123; // 2023-11-14T22:13:20.123Z

    fn ctx<'a>(attempt: u32, error: &'a str) -> CopyContext<'a> {
        CopyContext {
            attempt,
            error,
            now_unix_ms: NOW,
            delivery_exchange: "orders-in",
            delivery_routing_key: "order.created",
            connection_user: "worker",
        }
    }

    fn full_properties(headers: FieldTable, expiration: Option<&str>) -> BasicProperties {
        let p = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_headers(headers)
            .with_delivery_mode(1)
            .with_priority(7)
            .with_correlation_id("corr".into())
            .with_reply_to("replies".into())
            .with_message_id("m-1".into())
            .with_timestamp(1_600_000_000)
            .with_type("order".into())
            .with_user_id("worker".into())
            .with_app_id("shop".into())
            .with_cluster_id("c1".into());
        match expiration {
            Some(e) => p.with_expiration(e.into()),
            None => p,
        }
    }

    fn headers(p: &BasicProperties) -> &FieldTable {
        p.headers().as_ref().expect("a copy always has headers")
    }

    fn get<'a>(p: &'a BasicProperties, key: &str) -> Option<&'a AMQPValue> {
        headers(p).inner().get(key)
    }

    fn text<'a>(p: &'a BasicProperties, key: &str) -> &'a str {
        get(p, key)
            .and_then(as_str)
            .unwrap_or_else(|| panic!("no string {key}"))
    }

    fn history(p: &BasicProperties) -> Vec<(i64, String, String)> {
        let Some(AMQPValue::FieldArray(a)) = get(p, ERRORS_HEADER) else {
            panic!("no {ERRORS_HEADER} array");
        };
        a.as_slice()
            .iter()
            .map(|e| {
                let AMQPValue::FieldTable(t) = e else {
                    panic!("entry is not a table")
                };
                assert_eq!(t.inner().len(), 3);
                let f = |k: &str| t.inner().get(k).and_then(as_str).expect(k).to_string();
                let Some(AMQPValue::LongLongInt(n)) = t.inner().get("attempt") else {
                    panic!("attempt is not a long-long-int");
                };
                (*n, f("time"), f("error"))
            })
            .collect()
    }

    #[test]
    fn copies_keep_every_property_but_expiration_and_headers() {
        let original = full_properties(table(vec![("trace", ls("t-1"))]), Some("200"));
        let c = ctx(1, "boom");
        let empty = FieldTable::default();
        let retried = retry_copy(&original, &c, Some("9500".into()));
        assert_eq!(
            retried.with_headers(empty.clone()),
            full_properties(empty.clone(), Some("9500")).with_delivery_mode(2)
        );
        let dead = dead_letter_copy(&original, &c, DeadLetterReason::Permanent, "orders", true);
        assert_eq!(
            dead.with_headers(empty.clone()),
            full_properties(empty, None).with_delivery_mode(2)
        );
    }

    #[test]
    fn retry_copy_replaces_or_removes_expiration() {
        let original = full_properties(FieldTable::default(), Some("200"));
        let c = ctx(1, "x");
        assert_eq!(
            retry_copy(&original, &c, Some("9500".into())).expiration(),
            &Some("9500".into())
        );
        assert_eq!(retry_copy(&original, &c, None).expiration(), &None);
        // A value that cannot be a short string is left out, not a panic.
        assert_eq!(
            retry_copy(&original, &c, Some("9".repeat(300))).expiration(),
            &None
        );
    }

    #[test]
    fn copies_are_persistent() {
        let c = ctx(1, "x");
        for original in [
            BasicProperties::default(),
            BasicProperties::default().with_delivery_mode(1),
            BasicProperties::default().with_delivery_mode(2),
        ] {
            assert_eq!(retry_copy(&original, &c, None).delivery_mode(), &Some(2));
            let dead = dead_letter_copy(&original, &c, DeadLetterReason::Exhausted, "q", true);
            assert_eq!(dead.delivery_mode(), &Some(2));
        }
    }

    #[test]
    fn a_foreign_user_id_is_dropped_and_ours_kept() {
        let c = ctx(1, "x");
        let foreign = BasicProperties::default().with_user_id("someone".into());
        assert_eq!(retry_copy(&foreign, &c, None).user_id(), &None);
        let dead = dead_letter_copy(&foreign, &c, DeadLetterReason::Permanent, "q", true);
        assert_eq!(dead.user_id(), &None);
        let ours = BasicProperties::default().with_user_id("worker".into());
        assert_eq!(
            retry_copy(&ours, &c, None).user_id(),
            &Some("worker".into())
        );
        let dead = dead_letter_copy(&ours, &c, DeadLetterReason::Permanent, "q", true);
        assert_eq!(dead.user_id(), &Some("worker".into()));
        assert_eq!(
            retry_copy(&BasicProperties::default(), &c, None).user_id(),
            &None
        );
    }

    #[test]
    fn copies_strip_the_broker_history_and_keep_other_headers() {
        let original = BasicProperties::default().with_headers(table(vec![
            (
                X_DEATH,
                array(vec![death(
                    "orders.retry.1s",
                    "expired",
                    AMQPValue::LongLongInt(1),
                )]),
            ),
            ("x-first-death-queue", ls("orders.retry.1s")),
            ("x-first-death-reason", ls("expired")),
            ("x-first-death-exchange", ls("orders.retry")),
            ("x-last-death-queue", ls("orders.retry.1s")),
            ("x-last-death-reason", ls("expired")),
            ("x-last-death-exchange", ls("orders.retry")),
            ("x-delivery-count", AMQPValue::LongLongInt(3)),
            ("x-deathly", ls("kept")),
            ("x-custom", AMQPValue::LongLongInt(9)),
            ("trace", ls("t-1")),
            ("dlqctl-replayed", AMQPValue::LongLongInt(1)),
        ]));
        let c = ctx(2, "x");
        let retried = retry_copy(&original, &c, None);
        let dead = dead_letter_copy(&original, &c, DeadLetterReason::Exhausted, "orders", true);
        for copy in [&retried, &dead] {
            let keys: Vec<&str> = headers(copy).inner().keys().map(|k| k.as_str()).collect();
            for gone in [
                X_DEATH,
                "x-first-death-queue",
                "x-first-death-reason",
                "x-first-death-exchange",
                "x-last-death-queue",
                "x-last-death-reason",
                "x-last-death-exchange",
                "x-delivery-count",
            ] {
                assert!(!keys.contains(&gone), "{gone} kept");
            }
            assert_eq!(get(copy, "x-deathly"), Some(&ls("kept")));
            assert_eq!(get(copy, "x-custom"), Some(&AMQPValue::LongLongInt(9)));
            assert_eq!(get(copy, "trace"), Some(&ls("t-1")));
            assert_eq!(
                get(copy, "dlqctl-replayed"),
                Some(&AMQPValue::LongLongInt(1))
            );
        }
        let mut retry_keys: Vec<&str> = headers(&retried)
            .inner()
            .keys()
            .map(|k| k.as_str())
            .filter(|k| k.starts_with("dlqctl-") && *k != "dlqctl-replayed")
            .collect();
        retry_keys.sort_unstable();
        let mut expected = COPY_HEADERS.to_vec();
        expected.sort_unstable();
        assert_eq!(retry_keys, expected);
        // Each copy reads as its own history start.
        let c = count_attempt(headers(&retried).into(), &queues());
        assert_eq!((c.own, c.deaths, c.attempt), (Some(2), 0, 3));
    }

    #[test]
    fn first_copy_writes_every_header() {
        let original = BasicProperties::default();
        let retried = retry_copy(&original, &ctx(1, "connection refused"), None);
        assert_eq!(
            get(&retried, ATTEMPT_HEADER),
            Some(&AMQPValue::LongLongInt(1))
        );
        assert_eq!(
            text(&retried, FIRST_FAILED_AT_HEADER),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(text(&retried, LAST_ERROR_HEADER), "connection refused");
        assert_eq!(
            history(&retried),
            vec![(
                1,
                "2023-11-14T22:13:20.123Z".into(),
                "connection refused".into()
            )]
        );
        assert_eq!(text(&retried, ORIGINAL_EXCHANGE_HEADER), "orders-in");
        assert_eq!(text(&retried, ORIGINAL_ROUTING_KEY_HEADER), "order.created");
        assert_eq!(get(&retried, REASON_HEADER), None);
        assert_eq!(get(&retried, DEAD_LETTERED_AT_HEADER), None);
        assert_eq!(get(&retried, SOURCE_QUEUE_HEADER), None);
        // Strings are long strings.
        assert!(matches!(
            get(&retried, LAST_ERROR_HEADER),
            Some(AMQPValue::LongString(_))
        ));
    }

    /// A later delivery of `copy`, back from a retry queue.
    fn redelivered(copy: &BasicProperties) -> BasicProperties {
        copy.clone()
    }

    fn later<'a>(attempt: u32, error: &'a str, at: u64) -> CopyContext<'a> {
        CopyContext {
            attempt,
            error,
            now_unix_ms: at,
            delivery_exchange: "",
            delivery_routing_key: "orders",
            connection_user: "worker",
        }
    }

    #[test]
    fn later_copies_keep_first_failure_and_original_route() {
        let first = retry_copy(&BasicProperties::default(), &ctx(1, "e1"), None);
        let second = retry_copy(&redelivered(&first), &later(2, "e2", NOW + 1000), None);
        assert_eq!(
            get(&second, ATTEMPT_HEADER),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(
            text(&second, FIRST_FAILED_AT_HEADER),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(text(&second, LAST_ERROR_HEADER), "e2");
        assert_eq!(text(&second, ORIGINAL_EXCHANGE_HEADER), "orders-in");
        assert_eq!(text(&second, ORIGINAL_ROUTING_KEY_HEADER), "order.created");
        assert_eq!(
            history(&second),
            vec![
                (1, "2023-11-14T22:13:20.123Z".into(), "e1".into()),
                (2, "2023-11-14T22:13:21.123Z".into(), "e2".into()),
            ]
        );
        assert_eq!(
            original_exchange_and_key(headers(&second).into(), "", "orders"),
            ("orders-in".to_string(), "order.created".to_string())
        );
    }

    #[test]
    fn malformed_first_failed_at_is_replaced() {
        for bad in [
            AMQPValue::LongLongInt(5),
            ls(&"9".repeat(65)),
            AMQPValue::Void,
        ] {
            let original =
                BasicProperties::default().with_headers(table(vec![(FIRST_FAILED_AT_HEADER, bad)]));
            let copy = retry_copy(&original, &ctx(1, "x"), None);
            assert_eq!(
                text(&copy, FIRST_FAILED_AT_HEADER),
                "2023-11-14T22:13:20.123Z"
            );
        }
        let original = BasicProperties::default()
            .with_headers(table(vec![(FIRST_FAILED_AT_HEADER, ss("yesterday"))]));
        let copy = retry_copy(&original, &ctx(1, "x"), None);
        assert_eq!(text(&copy, FIRST_FAILED_AT_HEADER), "yesterday");
    }

    #[test]
    fn original_route_headers_fall_back_one_by_one() {
        let h = |entries| Some(table(entries));
        let (e, k) = ("", "orders");
        let read = |t: Option<FieldTable>| original_exchange_and_key(t.as_ref(), e, k);
        assert_eq!(read(None), ("".into(), "orders".into()));
        assert_eq!(
            read(h(vec![(ORIGINAL_EXCHANGE_HEADER, ss("ex"))])),
            ("ex".into(), "orders".into())
        );
        assert_eq!(
            read(h(vec![
                (ORIGINAL_EXCHANGE_HEADER, AMQPValue::LongLongInt(1)),
                (ORIGINAL_ROUTING_KEY_HEADER, ls("rk")),
            ])),
            ("".into(), "rk".into())
        );
        // The default exchange is a valid original.
        assert_eq!(
            original_exchange_and_key(
                Some(&table(vec![(ORIGINAL_EXCHANGE_HEADER, ls(""))])),
                "other",
                "k"
            ),
            ("".into(), "k".into())
        );
        // Too long for a name, or not UTF-8: absent.
        assert_eq!(
            read(h(vec![
                (ORIGINAL_EXCHANGE_HEADER, ls(&"x".repeat(256))),
                (
                    ORIGINAL_ROUTING_KEY_HEADER,
                    AMQPValue::LongString(LongString::from(vec![0xffu8, 0xfe]))
                ),
            ])),
            ("".into(), "orders".into())
        );
    }

    #[test]
    fn last_error_is_cut_at_one_kib_on_a_char_boundary() {
        let error = "€".repeat(1000); // 3 bytes each
        let copy = retry_copy(&BasicProperties::default(), &ctx(1, &error), None);
        let last = text(&copy, LAST_ERROR_HEADER);
        assert_eq!(last.len(), 1023);
        assert!(error.starts_with(last));
        let error = "a".repeat(5000);
        let copy = retry_copy(&BasicProperties::default(), &ctx(1, &error), None);
        assert_eq!(text(&copy, LAST_ERROR_HEADER).len(), MAX_LAST_ERROR_BYTES);
        let error = "é".repeat(512); // exactly 1024 bytes
        let copy = retry_copy(&BasicProperties::default(), &ctx(1, &error), None);
        assert_eq!(text(&copy, LAST_ERROR_HEADER), error);
    }

    #[test]
    fn truncation_never_splits_a_character() {
        let s = "a€😀é";
        let cuts: Vec<&str> = (0..=s.len() + 1).map(|n| truncate_utf8(s, n)).collect();
        assert_eq!(
            cuts,
            [
                "",
                "a",
                "a",
                "a",
                "a€",
                "a€",
                "a€",
                "a€",
                "a€😀",
                "a€😀",
                "a€😀é",
                "a€😀é"
            ]
        );
    }

    #[test]
    fn error_history_keeps_the_last_five_oldest_first() {
        let error = "😀".repeat(100); // 400 bytes, 4 per char
        let mut props = BasicProperties::default();
        for attempt in 1..=7 {
            props = retry_copy(
                &props,
                &later(attempt, &error, NOW + u64::from(attempt)),
                None,
            );
        }
        let h = history(&props);
        assert_eq!(h.iter().map(|e| e.0).collect::<Vec<_>>(), [3, 4, 5, 6, 7]);
        assert_eq!(h[0].1, "2023-11-14T22:13:20.126Z");
        for (_, _, e) in &h {
            assert_eq!(e.len(), 256);
            assert!(error.starts_with(e.as_str()));
        }
        let error = "€".repeat(100); // 300 bytes: cut to 255
        let copy = retry_copy(&BasicProperties::default(), &ctx(1, &error), None);
        assert_eq!(history(&copy)[0].2.len(), 255);
    }

    #[test]
    fn a_malformed_error_history_starts_fresh() {
        for bad in [
            ls("not an array"),
            AMQPValue::LongLongInt(3),
            AMQPValue::FieldTable(FieldTable::default()),
            array(vec![ls("x"), AMQPValue::Void]),
        ] {
            let original =
                BasicProperties::default().with_headers(table(vec![(ERRORS_HEADER, bad.clone())]));
            let copy = retry_copy(&original, &ctx(2, "e2"), None);
            assert_eq!(
                history(&copy),
                vec![(2, "2023-11-14T22:13:20.123Z".into(), "e2".into())],
                "{bad:?}"
            );
        }
    }

    #[test]
    fn well_formed_history_entries_survive_malformed_neighbours() {
        let entry = |attempt: AMQPValue, time: AMQPValue, error: AMQPValue| {
            AMQPValue::FieldTable(table(vec![
                ("attempt", attempt),
                ("time", time),
                ("error", error),
            ]))
        };
        let good = entry(AMQPValue::ShortShortUInt(1), ss("t1"), ls(&"x".repeat(300)));
        let entries = vec![
            good,
            entry(ls("1"), ls("t"), ls("e")),
            entry(AMQPValue::LongLongInt(1), AMQPValue::Timestamp(1), ls("e")),
            entry(AMQPValue::LongLongInt(1), ls(&"t".repeat(65)), ls("e")),
            entry(AMQPValue::LongLongInt(1), ls("t"), AMQPValue::Void),
            AMQPValue::FieldTable(table(vec![("attempt", AMQPValue::LongLongInt(1))])),
            entry(
                AMQPValue::LongInt(4),
                ls("t4"),
                AMQPValue::LongString(LongString::from(vec![b'o', 0xff, b'k'])),
            ),
        ];
        let original =
            BasicProperties::default().with_headers(table(vec![(ERRORS_HEADER, array(entries))]));
        let copy = retry_copy(&original, &ctx(5, "e5"), None);
        assert_eq!(
            history(&copy),
            vec![
                (1, "t1".into(), "x".repeat(256)),
                (4, "t4".into(), "o\u{fffd}k".into()),
                (5, "2023-11-14T22:13:20.123Z".into(), "e5".into()),
            ]
        );
    }

    #[test]
    fn dead_letter_copy_adds_reason_time_and_source() {
        let first = retry_copy(
            &BasicProperties::default(),
            &ctx(1, "e1"),
            Some("900".into()),
        );
        let dead = dead_letter_copy(
            &redelivered(&first),
            &later(2, "final", NOW + 60_000),
            DeadLetterReason::Exhausted,
            "orders",
            true,
        );
        assert_eq!(dead.expiration(), &None);
        assert_eq!(text(&dead, REASON_HEADER), "exhausted");
        assert_eq!(
            text(&dead, DEAD_LETTERED_AT_HEADER),
            "2023-11-14T22:14:20.123Z"
        );
        assert_eq!(text(&dead, SOURCE_QUEUE_HEADER), "orders");
        assert_eq!(text(&dead, LAST_ERROR_HEADER), "final");
        assert_eq!(
            text(&dead, FIRST_FAILED_AT_HEADER),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(text(&dead, ORIGINAL_EXCHANGE_HEADER), "orders-in");
        assert_eq!(get(&dead, ATTEMPT_HEADER), Some(&AMQPValue::LongLongInt(2)));
        assert_eq!(
            history(&dead).iter().map(|e| e.0).collect::<Vec<_>>(),
            [1, 2]
        );
        let dead = dead_letter_copy(
            &BasicProperties::default(),
            &ctx(1, "bad input"),
            DeadLetterReason::Permanent,
            "orders",
            true,
        );
        assert_eq!(text(&dead, REASON_HEADER), "permanent");
        assert_eq!(history(&dead).len(), 1);
        // A second dead-lettering overwrites the previous reason.
        let again = dead_letter_copy(&dead, &ctx(1, "x"), DeadLetterReason::Exhausted, "o2", true);
        assert_eq!(text(&again, REASON_HEADER), "exhausted");
        assert_eq!(text(&again, SOURCE_QUEUE_HEADER), "o2");
    }

    #[test]
    fn dead_letter_without_a_run_keeps_the_history() {
        let first = retry_copy(&BasicProperties::default(), &ctx(1, "e1"), None);
        let dead = dead_letter_copy(
            &first,
            &later(1, "attempts already spent", NOW + 5),
            DeadLetterReason::Exhausted,
            "orders",
            false,
        );
        assert_eq!(history(&dead), history(&first));
        assert_eq!(text(&dead, LAST_ERROR_HEADER), "attempts already spent");
    }

    #[test]
    fn written_headers_stay_under_eight_kib() {
        let huge_error = "€".repeat(1 << 20);
        let name = "n".repeat(255);
        let hostile_entry = AMQPValue::FieldTable(table(vec![
            ("attempt", AMQPValue::LongLongInt(i64::MAX)),
            ("time", ls(&"9".repeat(64))),
            ("error", ls(&"e".repeat(100_000))),
        ]));
        let original = BasicProperties::default().with_headers(table(vec![
            (ERRORS_HEADER, array(vec![hostile_entry; 50])),
            (FIRST_FAILED_AT_HEADER, ls(&"9".repeat(64))),
            (ORIGINAL_EXCHANGE_HEADER, ls(&name)),
            (ORIGINAL_ROUTING_KEY_HEADER, ls(&name)),
        ]));
        let c = CopyContext {
            attempt: u32::MAX,
            error: &huge_error,
            now_unix_ms: u64::MAX,
            delivery_exchange: &name,
            delivery_routing_key: &name,
            connection_user: "worker",
        };
        let mut copies = vec![
            retry_copy(&original, &c, None),
            dead_letter_copy(&original, &c, DeadLetterReason::Exhausted, &name, true),
            dead_letter_copy(
                &BasicProperties::default(),
                &c,
                DeadLetterReason::Permanent,
                &"q".repeat(10_000),
                true,
            ),
        ];
        let mut p = BasicProperties::default();
        for _ in 0..10 {
            p = retry_copy(&p, &c, None);
        }
        copies.push(dead_letter_copy(
            &p,
            &c,
            DeadLetterReason::Exhausted,
            &name,
            true,
        ));
        for copy in &copies {
            let size = written_headers_size(headers(copy));
            assert!(size < MAX_ADDED_HEADERS_BYTES, "{size} bytes");
            assert!(size > 2000, "{size}: the test feeds big values"); // guards the test
                                                                       // The estimate is the real encoding: compare with lapin's encoder.
            let mut only_written = FieldTable::default();
            for (k, v) in headers(copy) {
                if WRITTEN_HEADERS.contains(&k.as_str()) {
                    only_written.insert(k.clone(), v.clone());
                }
            }
            let encoded =
                lapin::types::generation::gen_field_table(&only_written)(Vec::new().into())
                    .expect("encodes");
            assert_eq!(usize::try_from(encoded.position).ok(), Some(size + 4));
        }
    }

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_millis(NOW), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_millis(951_868_799_999), "2000-02-29T23:59:59.999Z");
        assert_eq!(
            rfc3339_millis(4_107_542_400_000),
            "2100-03-01T00:00:00.000Z"
        );
        assert_eq!(
            rfc3339_millis(253_402_300_799_999),
            "9999-12-31T23:59:59.999Z"
        );
        assert!(rfc3339_millis(u64::MAX).ends_with(".615Z"));
    }

    // ---- headers_to_json ---------------------------------------------------

    #[test]
    fn headers_to_json_maps_every_type() {
        use serde_json::json;
        let h = table(vec![
            ("bool", AMQPValue::Boolean(true)),
            ("i8", AMQPValue::ShortShortInt(-8)),
            ("u8", AMQPValue::ShortShortUInt(8)),
            ("i16", AMQPValue::ShortInt(-16)),
            ("u16", AMQPValue::ShortUInt(16)),
            ("i32", AMQPValue::LongInt(-32)),
            ("u32", AMQPValue::LongUInt(u32::MAX)),
            ("i64", AMQPValue::LongLongInt(i64::MIN)),
            ("f32", AMQPValue::Float(1.5)),
            ("f64", AMQPValue::Double(-2.25)),
            ("nan", AMQPValue::Double(f64::NAN)),
            ("inf", AMQPValue::Float(f32::INFINITY)),
            (
                "dec",
                AMQPValue::DecimalValue(DecimalValue {
                    scale: 2,
                    value: 12345,
                }),
            ),
            (
                "dec-max",
                AMQPValue::DecimalValue(DecimalValue {
                    scale: 255,
                    value: u32::MAX,
                }),
            ),
            ("short", ss("s")),
            ("long", ls("l")),
            (
                "bad-utf8",
                AMQPValue::LongString(LongString::from(vec![b'a', 0xff])),
            ),
            ("ts", AMQPValue::Timestamp(1_700_000_000)),
            (
                "bytes",
                AMQPValue::ByteArray(ByteArray::from(vec![0u8, 1, 255])),
            ),
            ("void", AMQPValue::Void),
            (
                "array",
                array(vec![
                    AMQPValue::LongLongInt(1),
                    ls("two"),
                    array(vec![AMQPValue::Void]),
                ]),
            ),
            (
                "table",
                AMQPValue::FieldTable(table(vec![(
                    "inner",
                    AMQPValue::FieldTable(table(vec![("k", AMQPValue::Boolean(false))])),
                )])),
            ),
        ]);
        let v = headers_to_json(Some(&h));
        assert_eq!(
            v,
            json!({
                "bool": true, "i8": -8, "u8": 8, "i16": -16, "u16": 16, "i32": -32,
                "u32": 4_294_967_295u64, "i64": i64::MIN, "f32": 1.5, "f64": -2.25,
                "nan": null, "inf": null, "dec": 123.45, "dec-max": 4.294967295e-246,
                "short": "s", "long": "l", "bad-utf8": "a\u{fffd}", "ts": 1_700_000_000,
                "bytes": [0, 1, 255], "void": null,
                "array": [1, "two", [null]],
                "table": {"inner": {"k": false}},
            })
        );
        // It serializes (what the handler's environment gets).
        assert!(serde_json::to_string(&v).is_ok());
    }

    #[test]
    fn headers_to_json_of_nothing_is_an_empty_object() {
        assert_eq!(headers_to_json(None), serde_json::json!({}));
        assert_eq!(
            headers_to_json(Some(&FieldTable::default())),
            serde_json::json!({})
        );
    }

    #[test]
    fn deep_nesting_is_cut_to_null() {
        let mut v = AMQPValue::LongLongInt(1);
        for _ in 0..200 {
            v = array(vec![v]);
        }
        let json = headers_to_json(Some(&table(vec![("deep", v)])));
        let mut depth = 0;
        let mut cur = &json["deep"];
        while let serde_json::Value::Array(a) = cur {
            depth += 1;
            cur = &a[0];
        }
        assert_eq!(cur, &serde_json::Value::Null);
        assert_eq!(depth, MAX_JSON_DEPTH);
    }
}
