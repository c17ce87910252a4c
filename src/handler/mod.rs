//! Handlers: what the worker runs for each message.
//!
//! A [`Handler`] takes a [`HandlerMessage`] and answers an [`Outcome`]. The
//! worker decides from the outcome whether to ack, retry through a delay
//! tier, or dead-letter (see DESIGN.md, "Attempts and decisions").
//!
//! Built in:
//!
//! - [`exec::ExecHandler`] runs a program per message (`dlqctl work ... --
//!   COMMAND ARGS...`);
//! - [`http::HttpHandler`] POSTs the body to a URL (`--http URL`);
//! - [`handler_fn`] turns an async closure into a handler, for library users.
//!
//! The trait is async and makes no assumption about processes, so a
//! long-running handler that speaks JSON lines over one pipe fits it too.

use std::future::Future;
use std::sync::Arc;

use crate::core::outcome::Outcome;

pub mod exec;
pub mod http;

/// One delivery as a handler sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HandlerMessage {
    /// The message body, unchanged.
    pub body: Vec<u8>,
    /// The main queue the message was consumed from.
    pub queue: String,
    /// The AMQP `message_id` property, when the publisher set one.
    pub message_id: Option<String>,
    /// The AMQP `content_type` property, when the publisher set one.
    pub content_type: Option<String>,
    /// This run's number: 1 on the first delivery, `max_attempts` on the last.
    pub attempt: u32,
    /// How many runs the message gets before it is dead-lettered.
    pub max_attempts: u32,
    /// The exchange the message was originally published to (not the retry
    /// exchange it came back through).
    pub exchange: String,
    /// The routing key the message was originally published with.
    pub routing_key: String,
    /// The message's AMQP headers as a JSON object (bytes that are not
    /// UTF-8 as base64, see [`crate::core::retry::headers_to_json`]).
    pub headers: serde_json::Value,
    /// The values above whose bytes are not UTF-8 (RabbitMQ passes short
    /// strings through as bytes): each is here as its bytes, and its field
    /// above is then `None` or empty.
    pub not_utf8: NotUtf8,
}

/// The short strings of a message that are not UTF-8, as their bytes.
///
/// Handlers that run programs give each as `DLQCTL_<NAME>_BASE64`
/// (standard base64), with `DLQCTL_<NAME>` empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotUtf8 {
    /// The `message_id` property.
    pub message_id: Option<Vec<u8>>,
    /// The `content_type` property.
    pub content_type: Option<Vec<u8>>,
    /// The original exchange.
    pub exchange: Option<Vec<u8>>,
    /// The original routing key.
    pub routing_key: Option<Vec<u8>>,
}

impl HandlerMessage {
    /// The message id's bytes, UTF-8 or not; `None` when it has none.
    pub fn message_id_bytes(&self) -> Option<&[u8]> {
        self.message_id
            .as_deref()
            .map(str::as_bytes)
            .or(self.not_utf8.message_id.as_deref())
    }

    /// The content type's bytes, UTF-8 or not; `None` when it has none.
    pub fn content_type_bytes(&self) -> Option<&[u8]> {
        self.content_type
            .as_deref()
            .map(str::as_bytes)
            .or(self.not_utf8.content_type.as_deref())
    }
}

/// Processes one message and says how it went.
///
/// Implementations must be safe to call concurrently (the worker may run
/// several messages at once, up to its prefetch) and should not panic: a
/// failure is reported as [`Outcome::Transient`] or [`Outcome::Permanent`].
/// The worker may drop the returned future (at shutdown); the handler must
/// then leave nothing running behind.
pub trait Handler: Send + Sync + 'static {
    /// Handles one message.
    fn handle(&self, msg: &HandlerMessage) -> impl Future<Output = Outcome> + Send;
}

impl<H: Handler> Handler for Arc<H> {
    fn handle(&self, msg: &HandlerMessage) -> impl Future<Output = Outcome> + Send {
        (**self).handle(msg)
    }
}

/// A [`Handler`] made from a closure; see [`handler_fn`].
#[derive(Debug, Clone)]
pub struct FnHandler<F> {
    f: F,
}

/// Turns a closure returning a future into a [`Handler`].
///
/// The closure gets its own copy of the message, so the future may keep it:
///
/// ```
/// use dlqctl::handler::{handler_fn, HandlerMessage};
/// use dlqctl::core::outcome::Outcome;
///
/// let handler = handler_fn(|msg: HandlerMessage| async move {
///     if msg.body.is_empty() {
///         Outcome::permanent("empty body")
///     } else {
///         Outcome::Success
///     }
/// });
/// # let _ = handler;
/// ```
pub fn handler_fn<F, Fut>(f: F) -> FnHandler<F>
where
    F: Fn(HandlerMessage) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send,
{
    FnHandler { f }
}

impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(HandlerMessage) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send,
{
    fn handle(&self, msg: &HandlerMessage) -> impl Future<Output = Outcome> + Send {
        (self.f)(msg.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run<H: Handler>(h: &H, msg: &HandlerMessage) -> Outcome {
        h.handle(msg).await
    }

    #[tokio::test]
    async fn closures_and_arcs_are_handlers() {
        let h = handler_fn(|msg: HandlerMessage| async move {
            if msg.attempt >= msg.max_attempts {
                Outcome::permanent(format!("last attempt on {}", msg.queue))
            } else {
                Outcome::Success
            }
        });
        let mut msg = HandlerMessage {
            queue: "orders".into(),
            attempt: 1,
            max_attempts: 2,
            ..Default::default()
        };
        assert_eq!(run(&h, &msg).await, Outcome::Success);
        msg.attempt = 2;
        let shared = Arc::new(h);
        assert_eq!(
            run(&shared, &msg).await,
            Outcome::permanent("last attempt on orders")
        );
    }
}
