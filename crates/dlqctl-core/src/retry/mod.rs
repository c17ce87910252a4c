//! The retry core: deaths and headers → attempt → decision, jitter, the
//! properties of the copies the worker publishes, and the whole settle
//! decision for a delivery as data ([`settle`]), and whether settles go
//! through at all ([`readiness`]).
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
//!   8 KiB whatever a message arrives with.

mod attempt;
pub mod backoff;
pub mod breaker;
pub mod confirm;
pub(crate) mod copy;
mod decision;
pub mod fit;
mod headers;
mod headers_json;
mod jitter;
pub mod readiness;
mod settle;
#[cfg(test)]
mod settle_tests;
mod spare;
#[cfg(test)]
mod tests;

pub use attempt::{count_attempt, AttemptCount};
pub use copy::{original_exchange_and_key, retry_copy, CopyContext};
pub use decision::{decide, DeadLetterReason, Decision};
pub use headers_json::headers_to_json;
pub(crate) use headers_json::BASE64_KEY_PREFIX;
pub use jitter::jitter_expiration;
pub use settle::{
    settle, Copy, DeadLetterMode, Delivered, NackCause, Note, Plan, PublishEnd, RequeueCause,
    Rules, Run, Settlement,
};
pub use spare::Spare;
