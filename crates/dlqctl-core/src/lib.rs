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
//! - [`audit`]: the broker audited against the topology, for `provision
//!   --check`, `doctor` and the worker's start: drift read from the
//!   broker's refusals, stale objects, policies, the findings themselves.
//! - [`values`]: small values shared by all: durations, short strings that
//!   are not UTF-8, text and time helpers.
//! - [`wire`]: the wire vocabulary: every `dlqctl-*` header name (and
//!   every other name that starts with `dlqctl-`), the widening of AMQP
//!   integers and the readers of these headers (docs/headers.md).
//!
//! Nothing here does I/O: no async runtime, no files, no sockets, no clock
//! and no random numbers (the current time and random draws are
//! parameters), so every rule is unit tested without a broker. The
//! compiler keeps it so: this crate depends on no runtime, broker client or
//! HTTP crate, and its `clippy.toml` refuses the clock, files, sockets,
//! processes and environment std still offers (`tests/architecture.rs`
//! checks both, and keeps this folder small).

pub mod audit;
pub mod dlq;
pub mod drill;
pub mod handling;
pub mod idempotency;
pub mod retry;
pub mod topology;
pub mod values;
pub mod wire;

/// Test support: a header table of `pairs`.
#[cfg(test)]
pub(crate) fn field_table<'a>(
    pairs: impl IntoIterator<Item = (&'a str, amq_protocol::types::AMQPValue)>,
) -> amq_protocol::types::FieldTable {
    let mut t = amq_protocol::types::FieldTable::default();
    for (k, v) in pairs {
        t.insert(k.into(), v);
    }
    t
}
