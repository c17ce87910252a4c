//! dlqctl: delayed retries through TTL queues and a dead-letter queue for
//! RabbitMQ consumers.
//!
//! The `dlqctl` binary provisions the queues of a topology file and runs
//! workers; this library lets a Rust service run the same worker in its
//! own process, with its handler as an async function.
//!
//! # Embedding a worker
//!
//! Read the topology file `dlqctl provision` declared, pick the pipeline,
//! and run a [`Worker`] around a [`Handler`] until a token is cancelled:
//!
//! ```no_run
//! use dlqctl::{
//!     handler_fn, BrokerUrl, CancellationToken, HandlerMessage, Outcome, Worker, WorkerConfig,
//! };
//!
//! # async fn run() -> dlqctl::Result<()> {
//! let pipeline = dlqctl::load_pipeline("topology/orders.yaml", "orders")?;
//! let url = BrokerUrl::parse("amqp://guest:guest@127.0.0.1:5672/%2f")?;
//! let mut cfg = WorkerConfig::new(pipeline, url);
//! cfg.concurrency = 4;
//! cfg.prefetch = 4;
//!
//! let handler = handler_fn(|msg: HandlerMessage| async move {
//!     let Ok(order) = std::str::from_utf8(&msg.body) else {
//!         // Never going to work: dead-lettered at once.
//!         return Outcome::permanent("the body is not UTF-8");
//!     };
//!     match charge(order).await {
//!         Ok(()) => Outcome::Success,
//!         // Retried after the pipeline's next delay, dead-lettered when
//!         // the attempts are used up.
//!         Err(e) => Outcome::transient(e),
//!     }
//! });
//!
//! let stop = CancellationToken::new(); // cancel it on SIGTERM
//! Worker::new(cfg, handler).run(stop).await
//! # }
//! # async fn charge(_order: &str) -> Result<(), String> { Ok(()) }
//! ```
//!
//! A runnable version is `examples/embedded_worker.rs` (the integration
//! tests run it against a broker).
//!
//! # The API
//!
//! What is documented on this page is the API, re-exported at the crate
//! root:
//!
//! - the worker: [`Worker`], [`WorkerConfig`], [`DeadLetterMode`],
//!   [`Metrics`], and [`CancellationToken`] (tokio-util's, re-exported so
//!   that its version is the one the worker takes) to stop it;
//! - handlers: the [`Handler`] trait, [`handler_fn`] (with [`FnHandler`]),
//!   the message a handler gets, [`HandlerMessage`] (with [`NotUtf8`]),
//!   and what it answers, [`Outcome`];
//! - the topology: [`load_topology`] and [`load_pipeline`] read a file
//!   (at most [`MAX_TOPOLOGY_FILE_BYTES`], UTF-8) as the commands do;
//!   [`parse_topology`] parses text; [`Topology`], [`Pipeline`] and the
//!   types of their fields;
//! - the broker: [`BrokerUrl`], [`Brokers`] (several addresses, tried in
//!   order), [`Tls`], [`DEFAULT_AMQP_URL`];
//! - errors: [`Error`], [`Result`], [`Invalid`] (with [`Problem`]).
//!
//! # Internals
//!
//! The modules themselves (`core`, `amqp`, `handler`, `worker`, `ops`,
//! `serve`, `error`) are public only so that the `dlqctl` binary, the
//! benchmarks and the tests can reach them; they are hidden from these
//! docs and carry no stability promise: anything in them may change or
//! go in any release. Use the re-exports above. Their layout says what is
//! pure and what talks to the world: `core` holds the pure rules (no I/O,
//! no clock, no randomness); `amqp` the broker connection, declarations,
//! confirmed publishing and the management API; `handler` the built-in
//! handlers (a program, an HTTP endpoint, JSON lines); `worker` the
//! consume loop; `ops` the operations behind the commands, returning
//! typed reports; `serve` the web page for DLQ triage.

#![deny(missing_docs)]

#[doc(hidden)]
pub mod amqp;
/// The pure core, its own crate (`dlqctl-core`), under its old path.
#[doc(hidden)]
pub use dlqctl_core as core;
#[doc(hidden)]
pub mod error;
#[doc(hidden)]
pub mod handler;
#[doc(hidden)]
pub mod idempotency;
#[doc(hidden)]
pub mod ops;
#[doc(hidden)]
pub mod secrets;
mod topology_file;
#[doc(hidden)]
pub mod urls;
#[doc(hidden)]
pub mod worker;

pub use crate::amqp::connection::{BrokerUrl, Tls, DEFAULT_URL as DEFAULT_AMQP_URL};
pub use crate::amqp::Brokers;
pub use crate::core::handling::outcome::Outcome;
pub use crate::core::topology::{
    ArgValue, Arguments, Binding, CircuitBreaker, DeadLetter, ExchangeType, Invalid, Pipeline,
    Problem, ProducerExchange, QueueType, RetryPolicy, Topology,
};
pub use crate::error::{Error, Result};
pub use crate::handler::{handler_fn, FnHandler, Handler, HandlerMessage, NotUtf8};
pub use crate::topology_file::{
    load_pipeline, load_topology, parse_topology, MAX_TOPOLOGY_FILE_BYTES,
};
pub use crate::worker::metrics::Metrics;
pub use crate::worker::{DeadLetterMode, Worker, WorkerConfig};
pub use tokio_util::sync::CancellationToken;
