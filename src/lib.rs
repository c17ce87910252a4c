//! dlqctl: delayed retries through TTL queues and a dead-letter queue for
//! RabbitMQ consumers.
//!
//! The layout says what is pure and what talks to the world:
//!
//! - [`core`]: pure rules, no I/O, no clock, no randomness, one folder per
//!   feature: the topology (model, reading, plan), the retries (attempts,
//!   decisions, jitter, copies, breaker, backoff), what passes between the
//!   worker and a handler, the DLQ commands' rules, the checks' findings,
//!   and small shared values.
//! - [`amqp`]: the broker: connecting, declaring, confirmed publishing,
//!   the management API.
//! - [`handler`]: what runs per message: a program, an HTTP endpoint, or
//!   your own [`handler::Handler`].
//! - [`worker`]: the consume loop around a handler: sessions, deliveries,
//!   reconnects, metrics.
//! - [`ops`]: the operations behind the commands, returning typed reports;
//!   they never print.
//! - [`serve`]: the web page for DLQ triage, on top of [`ops`]: pages,
//!   a JSON API, the actions as background jobs, and the page's own pure
//!   rules (request guard, body view, depth chart).
//!
//! The `dlqctl` binary (`src/bin/dlqctl`) parses arguments, calls them and
//! renders their reports.

#![deny(missing_docs)]

pub mod amqp;
pub mod core;
pub mod error;
pub mod handler;
pub mod ops;
pub mod serve;
pub mod worker;
