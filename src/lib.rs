//! dlqctl: delayed retries through TTL queues and a dead-letter queue for
//! RabbitMQ consumers.
//!
//! The pure core ([`duration`], [`topology`], [`drift`], [`retry`]) does no I/O; the
//! shell around it ([`broker`], [`provision`], [`handler`]) talks to the
//! broker and to handlers.

pub mod amqp;
pub mod core;
pub mod error;
pub mod handler;
pub mod ops;
pub mod worker;
