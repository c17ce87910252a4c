//! dlqctl: delayed retries through TTL queues and a dead-letter queue for
//! RabbitMQ consumers.
//!
//! The pure core ([`duration`], [`topology`]) does no I/O; the shell
//! around it talks to the broker.

pub mod duration;
pub mod outcome;
pub mod retry;
pub mod topology;
