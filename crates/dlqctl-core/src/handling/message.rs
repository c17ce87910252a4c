//! One delivery as a handler sees it: what the worker hands to a
//! handler (the library's `Handler`), and what the JSON-lines protocol
//! writes for it.

use super::outcome::Outcome;

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
    /// UTF-8 as base64, see [`crate::retry::headers_to_json`]).
    pub headers: serde_json::Value,
    /// The values above whose bytes are not UTF-8 (RabbitMQ passes short
    /// strings through as bytes): each is here as its bytes, and its field
    /// above is then `None` or empty.
    pub not_utf8: NotUtf8,
    /// Where a handler that timed out with its work possibly still going
    /// on (an HTTP request, a `--jsonl` message in its process) gives the
    /// late answer: the idempotency guard then marks the key (a success)
    /// or releases it (a failure). Set only under the guard. Not part of
    /// the message's value (equal whatever it holds).
    pub late: LateAnswer,
}

/// Where the late answer of a timed-out run goes (see
/// [`HandlerMessage::late`]); by default nowhere (nobody waits).
#[derive(Clone, Default)]
pub struct LateAnswer(Option<std::sync::Arc<LateWaiter>>);

struct LateWaiter {
    wait: std::time::Duration,
    answer: Box<dyn Fn(Option<Outcome>) + Send + Sync>,
}

impl LateAnswer {
    /// A late answer waited for `wait` after the timeout, given to `f`.
    pub fn new(
        wait: std::time::Duration,
        f: impl Fn(Option<Outcome>) + Send + Sync + 'static,
    ) -> Self {
        LateAnswer(Some(std::sync::Arc::new(LateWaiter {
            wait,
            answer: Box::new(f),
        })))
    }

    /// How long after its timeout a late answer is still waited for;
    /// `None` when nobody waits (the handler may then cut its work at
    /// the timeout).
    pub fn wait(&self) -> Option<std::time::Duration> {
        self.0.as_ref().map(|w| w.wait)
    }

    /// The late answer: `Some(outcome)` when the work answered after all
    /// (a [`Outcome::TimedOut`] says it is still unknown), `None` when it
    /// was stopped for good without an answer (its process ended).
    /// Returns whether somebody waited.
    pub fn answer(&self, outcome: Option<Outcome>) -> bool {
        match &self.0 {
            Some(w) => {
                (w.answer)(outcome);
                true
            }
            None => false,
        }
    }
}

impl std::fmt::Debug for LateAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.wait() {
            Some(wait) => write!(f, "LateAnswer(waited {wait:?})"),
            None => f.write_str("LateAnswer(none)"),
        }
    }
}

impl PartialEq for LateAnswer {
    fn eq(&self, _: &Self) -> bool {
        true
    }
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

#[doc(hidden)]
impl HandlerMessage {
    /// A message for tests (here and in the library's): every field set,
    /// all UTF-8, `body` as given.
    pub fn example(body: &[u8]) -> Self {
        HandlerMessage {
            body: body.to_vec(),
            queue: "orders".into(),
            message_id: Some("m-1".into()),
            content_type: Some("application/json".into()),
            attempt: 2,
            max_attempts: 5,
            exchange: "shop".into(),
            routing_key: "order.created".into(),
            headers: serde_json::json!({"tenant": "acme", "n": 3}),
            not_utf8: NotUtf8::default(),
            late: Default::default(),
        }
    }
}
