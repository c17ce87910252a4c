//! The retry core: deaths and headers → attempt → decision, jitter, the
//! properties of the copies the worker publishes, and the whole settle
//! decision for a delivery as data ([`settle`]).
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

mod attempt;
pub mod backoff;
pub mod breaker;
pub mod confirm;
pub(crate) mod copy;
mod decision;
pub mod fit;
mod headers_json;
mod jitter;
mod settle;
#[cfg(test)]
mod settle_tests;
#[cfg(test)]
mod tests;

pub use attempt::{count_attempt, AttemptCount};
pub use copy::{
    dead_letter_copy, original_exchange_and_key, retry_copy, written_headers_size, CopyContext,
};
pub use decision::{decide, DeadLetterReason, Decision};
pub use headers_json::{headers_to_json, BASE64_KEY_PREFIX};
pub use jitter::jitter_expiration;
pub use settle::{
    settle, Copy, DeadLetterMode, Delivered, NackCause, Note, Plan, PublishEnd, RequeueCause,
    Rules, Run, Settlement,
};

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
/// Why a message was dead-lettered: `permanent`, `exhausted` or `too_large`.
pub const REASON_HEADER: &str = "dlqctl-reason";
/// When the message was dead-lettered.
pub const DEAD_LETTERED_AT_HEADER: &str = "dlqctl-dead-lettered-at";
/// The queue the message was dead-lettered from.
pub const SOURCE_QUEUE_HEADER: &str = "dlqctl-source-queue";

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

/// The headers every copy (re)writes: the first six of [`WRITTEN_HEADERS`].
pub(crate) const COPY_HEADERS: &[&str] = WRITTEN_HEADERS.split_at(6).0;

/// Longest `dlqctl-last-error`, in bytes.
pub const MAX_LAST_ERROR_BYTES: usize = 1024;
/// Longest error of one `dlqctl-errors` entry, in bytes.
pub const MAX_HISTORY_ERROR_BYTES: usize = 256;
/// Entries kept in `dlqctl-errors`.
pub const MAX_HISTORY_ENTRIES: usize = 5;
/// Bound on the encoded size of the headers in [`WRITTEN_HEADERS`].
pub const MAX_ADDED_HEADERS_BYTES: usize = 8 * 1024;

/// Exchange, routing key and queue names are short strings on the wire.
pub(crate) const MAX_NAME_BYTES: usize = 255;
/// A time string read back from a header is kept only up to this length.
pub(crate) const MAX_TIME_BYTES: usize = 64;
/// Warnings returned by [`count_attempt`] for one delivery, at most.
pub(crate) const MAX_WARNINGS: usize = 10;
/// [`headers_to_json`] writes `null` for values nested deeper than this.
pub(crate) const MAX_JSON_DEPTH: usize = 64;

pub(crate) const X_DEATH: &str = "x-death";
