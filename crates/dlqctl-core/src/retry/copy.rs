//! The properties and headers of the copies the worker publishes.

use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};

use super::attempt::{as_str, as_text};
use super::decision::DeadLetterReason;
use super::headers::*;
use crate::values::shortstr;
use crate::values::text::{rfc3339_millis, truncate_utf8};
use crate::wire::{
    as_integer, ATTEMPT_HEADER, DEAD_LETTERED_AT_HEADER, DEFERRED_HEADER, ERRORS_HEADER,
    FIRST_FAILED_AT_HEADER, LAST_ERROR_HEADER, ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER, REASON_HEADER, SOURCE_QUEUE_HEADER,
};

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
    with_expiration(
        kept_properties(original, ctx.connection_user).with_headers(headers),
        expiration,
    )
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
pub(crate) fn dead_letter_copy(
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

/// The properties of a deferred copy: a delivery whose key another run
/// holds a lease on waits in a retry tier, its attempt count unchanged.
///
/// The headers lose the broker's history and keep dlqctl's own as they
/// are, with `dlqctl-attempt` set to `runs_made` (the runs before this
/// delivery), `dlqctl-deferred` added (so that the tier's `x-death` is not
/// counted as a run), and the original exchange and routing key recorded
/// as on any copy. Other properties as [`retry_copy`].
pub(crate) fn defer_copy(
    original: &BasicProperties,
    runs_made: u32,
    delivery_exchange: &str,
    delivery_routing_key: &str,
    connection_user: &str,
    expiration: Option<String>,
) -> BasicProperties {
    let headers = original.headers().as_ref();
    let mut out = FieldTable::default();
    for (k, v) in headers.into_iter().flatten() {
        if !is_broker_history(k.as_str()) {
            out.insert(k.clone(), v.clone());
        }
    }
    out.insert(
        ATTEMPT_HEADER.into(),
        AMQPValue::LongLongInt(runs_made.into()),
    );
    out.insert(DEFERRED_HEADER.into(), AMQPValue::Boolean(true));
    insert_original(&mut out, headers, delivery_exchange, delivery_routing_key);
    with_expiration(
        kept_properties(original, connection_user).with_headers(out),
        expiration,
    )
}

/// The exchange and routing key a message was first delivered with: the
/// `dlqctl-original-*` headers where present as strings of at most 255
/// bytes, else (each on its own) the delivery's.
///
/// Both are short strings on the wire and are returned as lapin holds a
/// short string (see [`crate::values::shortstr`]): bytes that are not UTF-8,
/// from a header or the delivery, are kept losslessly.
pub fn original_exchange_and_key(
    headers: Option<&FieldTable>,
    delivery_exchange: &str,
    delivery_routing_key: &str,
) -> (String, String) {
    let read = |key: &str, fallback: &str| {
        headers
            .and_then(|h| h.inner().get(key))
            .and_then(as_text)
            .filter(|b| b.len() <= MAX_NAME_BYTES)
            .map(|b| shortstr::from_raw_bytes(&b))
            .unwrap_or_else(|| shortstr::truncate_wire(fallback, MAX_NAME_BYTES).into_owned())
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
#[cfg(test)]
pub(crate) fn written_headers_size(headers: &FieldTable) -> usize {
    headers
        .inner()
        .iter()
        .filter(|(k, _)| WRITTEN_HEADERS.contains(&k.as_str()))
        .map(|(k, v)| super::fit::entry_size(k.as_str(), v))
        .fold(0, usize::saturating_add)
}

/// The original's properties a copy keeps: all but `expiration`, `headers`
/// and a foreign `user_id`; `delivery_mode` forced to 2.
pub(crate) fn kept_properties(
    original: &BasicProperties,
    connection_user: &str,
) -> BasicProperties {
    use BasicProperties as P;
    let mut p = P::default().with_delivery_mode(2);
    p = keep(p, original.content_type(), P::with_content_type);
    p = keep(p, original.content_encoding(), P::with_content_encoding);
    p = keep(p, original.priority(), P::with_priority);
    p = keep(p, original.correlation_id(), P::with_correlation_id);
    p = keep(p, original.reply_to(), P::with_reply_to);
    p = keep(p, original.message_id(), P::with_message_id);
    p = keep(p, original.timestamp(), P::with_timestamp);
    p = keep(p, original.kind(), P::with_type);
    if let Some(v) = original.user_id() {
        if v.as_str() == connection_user {
            p = p.with_user_id(v.clone());
        }
    }
    p = keep(p, original.app_id(), P::with_app_id);
    p = keep(p, original.cluster_id(), P::with_cluster_id);
    p
}

/// `p` with the property that `set` sets, when the original had one
/// (`value`).
fn keep<T: Clone>(
    p: BasicProperties,
    value: &Option<T>,
    set: fn(BasicProperties, T) -> BasicProperties,
) -> BasicProperties {
    match value {
        Some(v) => set(p, v.clone()),
        None => p,
    }
}

/// Headers the broker writes about deaths and deliveries; a copy that kept
/// them would hand an old history back (see rabbitmq-facts.md). RabbitMQ
/// 4.3 adds `x-acquired-count` (every hand-off to a consumer) beside
/// `x-delivery-count` (failed deliveries only, from 4.3).
pub(crate) fn is_broker_history(key: &str) -> bool {
    key == X_DEATH
        || key == "x-delivery-count"
        || key == "x-acquired-count"
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
        if !is_broker_history(key) && !COPY_HEADERS.contains(&key) && key != DEFERRED_HEADER {
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

    insert_original(
        &mut out,
        original,
        ctx.delivery_exchange,
        ctx.delivery_routing_key,
    );
    out
}

/// Writes `dlqctl-original-exchange` and `dlqctl-original-routing-key`
/// (see [`original_exchange_and_key`]), as the bytes they had on the
/// wire, UTF-8 or not.
fn insert_original(
    out: &mut FieldTable,
    original: Option<&FieldTable>,
    delivery_exchange: &str,
    delivery_routing_key: &str,
) {
    let (exchange, routing_key) =
        original_exchange_and_key(original, delivery_exchange, delivery_routing_key);
    insert_bytes(
        out,
        ORIGINAL_EXCHANGE_HEADER,
        &shortstr::raw_bytes(&exchange),
    );
    insert_bytes(
        out,
        ORIGINAL_ROUTING_KEY_HEADER,
        &shortstr::raw_bytes(&routing_key),
    );
}

/// `props` with `expiration` when it is one (a short string).
fn with_expiration(props: BasicProperties, expiration: Option<String>) -> BasicProperties {
    match expiration.and_then(|e| ShortString::try_new(e).ok()) {
        Some(e) => props.with_expiration(e),
        None => props,
    }
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
            let error = t.inner().get("error").and_then(as_text)?;
            let error = String::from_utf8_lossy(&error);
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

/// Inserts a long-string value of any bytes.
fn insert_bytes(table: &mut FieldTable, key: &'static str, value: &[u8]) {
    table.insert(
        ShortString::from(key),
        AMQPValue::LongString(LongString::from(value.to_vec())),
    );
}

/// Inserts a long-string value. `key` must be at most 255 bytes (all
/// callers pass constants).
fn insert_str(table: &mut FieldTable, key: &'static str, value: &str) {
    table.insert(
        ShortString::from(key),
        AMQPValue::LongString(LongString::from(value)),
    );
}
