//! The pure core, one folder per feature:
//!
//! - [`topology`]: the topology file: its model, its reading (YAML with
//!   positions, then validation), and the plan of broker objects it makes.
//! - [`retry`]: one delivery's way through the retries: attempts, the
//!   decision and the whole settlement, jitter, the properties of the
//!   copies, the judgement of publisher confirms, the circuit breaker and
//!   backoff.
//! - [`handling`]: what a handler gets (the message) and says (the
//!   outcome), and the JSON-lines protocol between a worker and a
//!   long-running handler process.
//! - [`dlq`]: the DLQ commands: the description and grouping of a
//!   dead-lettered message, the selectors, error fingerprints, the export
//!   line, the replay and rotation copies, the rate.
//! - [`drill`]: `dlqctl drill`: the drill message the worker fails
//!   without its handler, and what a drill expects of a pipeline.
//! - [`check`]: what `provision --check` finds: drift read from the
//!   broker's refusals, stale objects, policies, the findings themselves.
//! - [`values`]: small values shared by all: durations, short strings that
//!   are not UTF-8, text and time helpers.
//!
//! Nothing here does I/O: no async runtime, no files, no sockets, no clock
//! and no random numbers (the current time and random draws are
//! parameters), so every rule is unit tested without a broker.
//! `tests/architecture.rs` keeps it so, and keeps this folder at nine
//! entries at most.

pub mod check;
pub mod dlq;
pub mod drill;
pub mod handling;
pub mod idempotency;
pub mod retry;
pub mod topology;
pub mod values;

/// Test support: a header table of `pairs`.
#[cfg(test)]
pub(crate) fn field_table<'a>(
    pairs: impl IntoIterator<Item = (&'a str, lapin::types::AMQPValue)>,
) -> lapin::types::FieldTable {
    let mut t = lapin::types::FieldTable::default();
    for (k, v) in pairs {
        t.insert(k.into(), v);
    }
    t
}
