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
    /// The handler gave up waiting at its timeout. Decided like a
    /// transient failure (retried, or dead-lettered `exhausted`), but
    /// an outcome of its own: unless the handler is cancel-safe (its work
    /// was stopped, like a program killed with its process group), the
    /// work may still be going on, so the idempotency guard keeps the
    /// key "in doubt" instead of releasing it (docs/worker.md,
    /// "Idempotent handling").
    TimedOut {
        /// What timed out, for logs and headers.
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

    /// A timeout.
    pub fn timed_out(error: impl Into<String>) -> Self {
        Outcome::TimedOut {
            error: error.into(),
        }
    }

    /// Short label for logs and metrics: `success`, `transient`,
    /// `permanent`, `timed_out`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Transient { .. } => "transient",
            Outcome::Permanent { .. } => "permanent",
            Outcome::TimedOut { .. } => "timed_out",
        }
    }

    /// The error text of a failure; `None` for a success.
    pub fn error(&self) -> Option<&str> {
        match self {
            Outcome::Success => None,
            Outcome::Transient { error, .. }
            | Outcome::Permanent { error }
            | Outcome::TimedOut { error } => Some(error),
        }
    }
}
