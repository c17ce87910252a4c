//! dlqctl: delayed retries through TTL queues and a dead-letter queue for
//! RabbitMQ consumers.
//!
//! The pure core ([`duration`], [`topology`]) does no I/O; the shell
//! around it talks to the broker.

pub mod broker;
pub mod drift;
pub mod duration;
pub mod error;
pub mod mgmt;
pub mod outcome;
pub mod provision;
pub mod topology;
