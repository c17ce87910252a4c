//! What a handler says about one message.

use std::time::Duration;

/// The result of one handler run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: the message is acked.
    Success,
    /// Failed, may succeed later: retried through a tier, or dead-lettered
    /// (`exhausted`) once `max_attempts` runs were made.
    Transient {
        /// What went wrong, for logs and headers.
        error: String,
        /// The dependency asked to wait at least this long (HTTP `Retry-After`).
        retry_after: Option<Duration>,
    },
    /// Will never succeed: dead-lettered (`permanent`) at once.
    Permanent {
        /// What went wrong.
        error: String,
    },
}

impl Outcome {
    /// A transient failure without a retry-after hint.
    pub fn transient(error: impl Into<String>) -> Self {
        Outcome::Transient {
            error: error.into(),
            retry_after: None,
        }
    }

    /// A permanent failure.
    pub fn permanent(error: impl Into<String>) -> Self {
        Outcome::Permanent {
            error: error.into(),
        }
    }

    /// Short label for logs and metrics: `success`, `transient`, `permanent`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Transient { .. } => "transient",
            Outcome::Permanent { .. } => "permanent",
        }
    }
}
