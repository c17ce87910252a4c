//! The wire vocabulary: every name dlqctl writes that starts with
//! `dlqctl-`, in one place (docs/headers.md is the reference page).
//!
//! - the AMQP headers dlqctl writes on messages and copies, one constant
//!   each, named `*_HEADER` (`tests/vocabulary.rs` reads them from here
//!   and holds docs/headers.md to exactly this list);
//! - the other names that start with `dlqctl-`: the JSON-lines protocol,
//!   the export format, temporary files and folders, a thread, store keys,
//!   a drill's message id;
//! - the one function that widens an AMQP integer (`as_integer`) and the
//!   typed readers of these headers ([`count`], [`has`]).
//!
//! No other file of `src/` writes a string literal that starts with
//! `dlqctl-` (`tests/vocabulary.rs` checks it): they name these constants.
//!
//! Types are lapin's names for the AMQP field types: `LongString` (`S`),
//! `LongLongInt` (`l`, a signed 64-bit integer), `Boolean` (`t`),
//! `FieldArray` (`A`), `FieldTable` (`F`). A reader accepts a little more
//! than dlqctl writes (any integer width, a short string), as noted.

use amq_protocol::types::{AMQPValue, FieldTable};

/// The prefix of every header of dlqctl's own: a producer's header with
/// this prefix would be changed by dlqctl's copies, so it cannot be an
/// idempotency key.
pub const HEADER_PREFIX: &str = "dlqctl-";

// ------------------------------------------- the worker's retry and DLQ copies

/// Handler runs already made (`LongLongInt`). Written by the worker on
/// every retry and dead-letter copy (the runs made, the failed one
/// included) and on a deferred copy (the runs before it). Read by the
/// worker (the attempt is `max(this, the x-death count of the pipeline's
/// tiers) + 1`) and by `dlq peek` / `serve` (attempts). A replay or
/// redrive copy drops it, so the message starts again at attempt 1.
pub const ATTEMPT_HEADER: &str = "dlqctl-attempt";

/// When the first handler run of this message failed (`LongString`,
/// RFC 3339 UTC with milliseconds). Written by the worker on its first
/// copy and kept by the later ones (a string of at most 64 bytes is kept
/// as it is). Read by the worker (to keep it); a handler sees it in
/// `DLQCTL_HEADERS`.
pub const FIRST_FAILED_AT_HEADER: &str = "dlqctl-first-failed-at";

/// The error of the last failed run (`LongString`, UTF-8, at most 1 KiB).
/// Written by the worker on every retry and dead-letter copy. Read by
/// `dlq peek`, `dlq summary` (its error fingerprint) and `serve`.
pub const LAST_ERROR_HEADER: &str = "dlqctl-last-error";

/// The last 5 failures, oldest first (`FieldArray` of `FieldTable`s:
/// `attempt` `LongLongInt`, `time` and `error` (at most 256 bytes)
/// `LongString`). Written by the worker on every retry and dead-letter
/// copy, from the well-formed entries it read back. Read by the worker and
/// by `dlq peek` / `serve` (the error timeline).
pub const ERRORS_HEADER: &str = "dlqctl-errors";

/// The exchange the message was first delivered from (`LongString`: the
/// bytes of a short string, at most 255, UTF-8 or not). Written by the
/// worker on every copy (kept when present, else the delivery's). Read by
/// the worker (what the handler sees as the exchange) and by `dlq peek` /
/// `serve`.
pub const ORIGINAL_EXCHANGE_HEADER: &str = "dlqctl-original-exchange";

/// The routing key the message was first delivered with (as
/// [`ORIGINAL_EXCHANGE_HEADER`]).
pub const ORIGINAL_ROUTING_KEY_HEADER: &str = "dlqctl-original-routing-key";

/// Why a message was dead-lettered (`LongString`: `permanent`,
/// `exhausted`, `too_large` or [`KEY_CONFLICT_REASON`]). Written by the worker on a dead-letter
/// copy. Read by `dlq peek` / `summary` / `--filter-reason`, `serve` and
/// the automatic redrive (which reasons it moves).
pub const REASON_HEADER: &str = "dlqctl-reason";

/// The [`REASON_HEADER`] of a message whose idempotency key was marked
/// handled with another body, dead-lettered without its handler
/// (`idempotency.on_conflict: dead_letter`).
pub const KEY_CONFLICT_REASON: &str = "key_conflict";

/// When the message was dead-lettered (`LongString`, RFC 3339 UTC with
/// milliseconds). Written by the worker on a dead-letter copy. Read by
/// `dlq peek` / `serve`, the automatic redrive (`min_age`), the rotation
/// copies (the retention left) and `dlqctl drill`.
pub const DEAD_LETTERED_AT_HEADER: &str = "dlqctl-dead-lettered-at";

/// The queue the message was dead-lettered from (`LongString`, at most 255
/// bytes). Written by the worker on a dead-letter copy. Read by
/// `dlq peek` / `summary` / `serve`.
pub const SOURCE_QUEUE_HEADER: &str = "dlqctl-source-queue";

/// On a deferred copy (its idempotency key was leased by another run):
/// the tier it waited in does not count as an attempt (`Boolean`, `true`;
/// read as present). Written by the worker on a deferred copy; read by the
/// worker when it counts the attempt; every other worker copy drops it.
pub const DEFERRED_HEADER: &str = "dlqctl-deferred";

// ------------------------------------------------ replay and redrive copies

/// How often a person replayed the message (`LongLongInt`; read from any
/// integer width, a negative or other value read as 0). Written by
/// `dlq replay` (the previous count + 1); a redrive copy keeps it as it
/// was, as do the worker's copies. Read by `dlq replay` and by the worker
/// (a replayed drill message is acked without the handler).
pub const REPLAYED_HEADER: &str = "dlqctl-replayed";

/// When the message was last replayed or redriven (`LongString`, RFC 3339
/// UTC with milliseconds). Written by `dlq replay` and the automatic
/// redrive. Read by `dlq peek` / `serve`: on a replayed message, an
/// `x-death` is newer than dlqctl's own headers.
pub const REPLAYED_AT_HEADER: &str = "dlqctl-replayed-at";

/// The run that last replayed or redrove the message (`LongString`, one id
/// per run; read from a short string too). Written by `dlq replay` and the
/// automatic redrive. Read by their canary (a copy that comes back to the
/// DLQ) and by `dlq peek --filter-header dlqctl-replay-id=ID`.
pub const REPLAY_ID_HEADER: &str = "dlqctl-replay-id";

/// How often the automatic redrive moved the message (`LongLongInt`; read
/// as [`REPLAYED_HEADER`]). Written by the redrive (the previous count + 1);
/// a replay copy keeps it as it was. Read by the redrive (`max_redrives`)
/// and by the worker (a redriven drill message is acked).
pub const REDRIVEN_HEADER: &str = "dlqctl-redriven";

/// On a `dlq replay --rerun` copy: the replay's id (`LongString`; read
/// from a short string, a byte array or an integer too), which joins the
/// idempotency key so that a handled message runs once more. Written by
/// `dlq replay --rerun`; read by the worker's idempotency guard; kept by
/// the worker's copies.
pub const RERUN_HEADER: &str = "dlqctl-rerun";

// ------------------------------------------------------------------ drills

/// Marks a drill message (`LongString`: the drill's id; any value counts).
/// Written by `dlqctl drill`; kept by every copy. Read by the worker (it
/// never runs the handler for it), the automatic redrive (it never moves
/// it) and `dlqctl drill` (it finds its message by it).
pub const DRILL_HEADER: &str = "dlqctl-drill";

/// The `message_id` of a drill message: this, then the drill's id.
pub const DRILL_MESSAGE_ID_PREFIX: &str = "dlqctl-drill-";

// ------------------------------------------------------ other dlqctl- names

/// The JSON-lines handler protocol's name (its hello line's `protocol`;
/// `DLQCTL_PROTOCOL` is this, `/` and the version).
pub const JSONL_PROTOCOL: &str = "dlqctl-jsonl";

/// The `format` of an export line (docs/export-format.md).
pub(crate) const EXPORT_FORMAT: &str = "dlqctl-export/1";

/// The prefix of the names dlqctl gives the temporary files and folders it
/// makes (its unit tests' too), in the system's temporary folder.
pub const TEMP_PREFIX: &str = "dlqctl-";

/// The file of a handler's header JSON too long for `DLQCTL_HEADERS`:
/// this, the pid, a number and `.json`.
pub const HEADERS_FILE_PREFIX: &str = "dlqctl-headers-";

/// `serve`'s export folders: this, the server's pid, a random part.
pub const SERVE_EXPORT_DIR_PREFIX: &str = "dlqctl-serve-";

/// The name of the thread that runs an SQLite idempotency store.
pub const SQLITE_THREAD_NAME: &str = "dlqctl-sqlite";

/// The key `doctor` writes, reads back and deletes in an idempotency
/// store: this and a random part.
pub const DOCTOR_KEY_PREFIX: &str = "dlqctl-doctor:";

// ----------------------------------------------------------------- readers

/// Any AMQP integer type, widened to `i64`; `None` for every other type
/// (booleans, floats, decimals, timestamps and strings included).
pub(crate) fn as_integer(value: &AMQPValue) -> Option<i64> {
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

/// A counter header ([`REPLAYED_HEADER`], [`REDRIVEN_HEADER`]): its value
/// when it is a non-negative integer of any width, else 0 (absent, of
/// another type, negative).
pub fn count(headers: Option<&FieldTable>, name: &str) -> u64 {
    headers
        .and_then(|h| h.inner().get(name))
        .and_then(as_integer)
        .map_or(0, |n| n.max(0).unsigned_abs())
}

/// Whether the headers carry `name`, whatever its value.
pub fn has(headers: Option<&FieldTable>, name: &str) -> bool {
    headers.is_some_and(|h| h.contains_key(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field_table;
    use amq_protocol::types::LongString;

    #[test]
    fn every_integer_width_widens_and_nothing_else_does() {
        for (v, want) in [
            (AMQPValue::ShortShortInt(-7), Some(-7)),
            (AMQPValue::ShortShortUInt(255), Some(255)),
            (AMQPValue::ShortInt(-300), Some(-300)),
            (AMQPValue::ShortUInt(65_535), Some(65_535)),
            (AMQPValue::LongInt(i32::MIN), Some(i64::from(i32::MIN))),
            (AMQPValue::LongUInt(u32::MAX), Some(i64::from(u32::MAX))),
            (AMQPValue::LongLongInt(i64::MIN), Some(i64::MIN)),
            (AMQPValue::Boolean(true), None),
            (AMQPValue::Timestamp(5), None),
            (AMQPValue::Double(1.0), None),
            (AMQPValue::LongString(LongString::from("9")), None),
        ] {
            assert_eq!(as_integer(&v), want, "{v:?}");
        }
    }

    #[test]
    fn a_counter_is_a_non_negative_integer_or_zero() {
        assert_eq!(count(None, REPLAYED_HEADER), 0);
        for (v, want) in [
            (AMQPValue::LongLongInt(i64::MAX), i64::MAX.unsigned_abs()),
            (AMQPValue::ShortUInt(6), 6),
            (AMQPValue::LongLongInt(-4), 0),
            (AMQPValue::LongLongInt(i64::MIN), 0),
            (AMQPValue::LongString(LongString::from("9")), 0),
        ] {
            let h = field_table([(REDRIVEN_HEADER, v.clone())]);
            assert_eq!(count(Some(&h), REDRIVEN_HEADER), want, "{v:?}");
            assert_eq!(count(Some(&h), REPLAYED_HEADER), 0, "another header");
        }
        let h = field_table([(DRILL_HEADER, AMQPValue::Boolean(false))]);
        assert!(has(Some(&h), DRILL_HEADER), "any value counts");
        assert!(!has(Some(&h), REPLAYED_HEADER));
        assert!(!has(None, DRILL_HEADER));
    }
}
