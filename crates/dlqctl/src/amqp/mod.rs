//! Talking AMQP (and the management API) to RabbitMQ: connecting without
//! leaking passwords, declaring and inspecting a plan, publishing copies
//! with publisher confirms.

pub(crate) mod batch;
pub(crate) mod brokers;
pub mod connection;
pub mod declare;
pub mod mgmt;
pub(crate) mod publisher;

pub use brokers::Brokers;
pub use connection::BrokerUrl;
