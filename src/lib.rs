//! dlqctl: delayed retries through TTL queues and a dead-letter queue for
//! RabbitMQ consumers.
//!
//! The pure core ([`duration`], [`topology`], [`drift`], [`retry`]) does no I/O; the
//! shell around it ([`broker`], [`provision`], [`handler`]) talks to the
//! broker and to handlers.

pub mod breaker;
pub mod broker;
pub mod drift;
pub mod duration;
pub mod error;
pub mod handler;
pub mod metrics;
pub mod mgmt;
pub mod outcome;
pub mod provision;
pub mod retry;
pub mod topology;
pub mod worker;
