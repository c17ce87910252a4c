//! Handlers: what the worker runs for each message.
//!
//! A [`Handler`] takes a [`HandlerMessage`] and answers an [`Outcome`]. The
//! worker decides from the outcome whether to ack, retry through a delay
//! tier, or dead-letter (see docs/worker.md, "Attempts and decisions").
//!
//! Built in:
//!
//! - [`exec::ExecHandler`] runs a program per message (`dlqctl work ... --
//!   COMMAND ARGS...`);
//! - [`http::HttpHandler`] POSTs the body to a URL (`--http URL`);
//! - [`jsonl::JsonlHandler`] keeps programs running and hands them messages
//!   as JSON lines (`--jsonl -- COMMAND ARGS...`);
//! - [`handler_fn`] turns an async closure into a handler, for library users.
//!
//! The trait is async and makes no assumption about processes: the
//! JSON-lines handler answers many messages over one pipe, in any order.

use std::future::Future;
use std::sync::Arc;

use crate::core::handling::outcome::Outcome;

pub mod exec;
pub mod http;
pub mod jsonl;
mod process;

pub use crate::core::handling::message::{HandlerMessage, NotUtf8};

/// Processes one message and says how it went.
///
/// Implementations must be safe to call concurrently (the worker may run
/// several messages at once, up to its prefetch) and should not panic: a
/// failure is reported as [`Outcome::Transient`], [`Outcome::Permanent`]
/// or [`Outcome::TimedOut`].
/// The worker may drop the returned future (at shutdown); the handler must
/// then leave nothing running behind.
///
/// A handler that gives up on its own timeout answers
/// [`Outcome::TimedOut`]. Whether its work may still be going on then
/// is [`Handler::cancel_safe`]: when not, the idempotency guard keeps the
/// message's key "in doubt" (no other run of it starts) until the late
/// answer comes through [`HandlerMessage::late`], or the in-doubt time is
/// over.
pub trait Handler: Send + Sync + 'static {
    /// Handles one message.
    fn handle(&self, msg: &HandlerMessage) -> impl Future<Output = Outcome> + Send;

    /// Whether a timeout (or a dropped future) stops this handler's work
    /// for good, so that no effect of it can come after: a program killed
    /// with its process group. `false` by default: an HTTP request, a
    /// message in a `--jsonl` process or an embedded handler's own I/O may
    /// still complete after the worker stopped waiting, and its key is
    /// then kept in doubt.
    fn cancel_safe(&self) -> bool {
        false
    }
}

impl<H: Handler> Handler for Arc<H> {
    fn handle(&self, msg: &HandlerMessage) -> impl Future<Output = Outcome> + Send {
        (**self).handle(msg)
    }

    fn cancel_safe(&self) -> bool {
        (**self).cancel_safe()
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
/// use dlqctl::{handler_fn, HandlerMessage, Outcome};
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
