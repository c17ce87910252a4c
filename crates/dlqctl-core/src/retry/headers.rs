//! The headers the worker's copies (re)write, and the bounds it keeps
//! them in. Their names are in [`crate::wire`].

use crate::wire::{
    ATTEMPT_HEADER, DEAD_LETTERED_AT_HEADER, ERRORS_HEADER, FIRST_FAILED_AT_HEADER,
    LAST_ERROR_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER, REASON_HEADER,
    SOURCE_QUEUE_HEADER,
};

/// Every header a copy (re)writes: a retry copy the first six, a
/// dead-letter copy all. The bound `MAX_ADDED_HEADERS_BYTES` (8 KiB) covers these.
pub(crate) const WRITTEN_HEADERS: [&str; 9] = [
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
pub(crate) const MAX_LAST_ERROR_BYTES: usize = 1024;
/// Longest error of one `dlqctl-errors` entry, in bytes.
pub(crate) const MAX_HISTORY_ERROR_BYTES: usize = 256;
/// Entries kept in `dlqctl-errors`.
pub(crate) const MAX_HISTORY_ENTRIES: usize = 5;
/// Bound on the encoded size of the headers in [`WRITTEN_HEADERS`]
/// (the copy tests hold every copy to it).
#[cfg(test)]
pub(crate) const MAX_ADDED_HEADERS_BYTES: usize = 8 * 1024;

/// Exchange, routing key and queue names are short strings on the wire.
pub(crate) const MAX_NAME_BYTES: usize = 255;
/// A time string read back from a header is kept only up to this length.
pub(crate) const MAX_TIME_BYTES: usize = 64;
/// Warnings returned by [`count_attempt`](super::count_attempt) for one delivery, at most.
pub(crate) const MAX_WARNINGS: usize = 10;

pub(crate) const X_DEATH: &str = "x-death";
