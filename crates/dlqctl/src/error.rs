//! The library's error type.

/// What can go wrong in dlqctl's shell (broker, files, handlers).
///
/// Exhaustive on purpose, unlike the configs and reports (which are
/// `#[non_exhaustive]`: they grow a field without breaking a caller).
/// Each variant is a documented exit code of the `dlqctl` command
/// (docs/exit-codes.md), and the command matches them without a
/// catch-all, so a new kind of failure cannot get an exit code by
/// accident: adding a variant is a breaking change that makes every
/// match, ours and an embedder's, decide what it means.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The topology file is invalid (every problem, `FILE:LINE:COL: ...`).
    #[error("{0}")]
    Invalid(#[from] crate::core::topology::Invalid),
    /// The topology file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The broker URL is malformed.
    #[error("invalid broker URL {url}: {reason}")]
    Url {
        /// The URL with its password hidden.
        url: String,
        /// Why.
        reason: String,
    },
    /// The broker could not be reached or refused the connection.
    #[error("cannot connect to RabbitMQ at {endpoint}: {reason}\n{hint}")]
    Connect {
        /// `host:port`.
        endpoint: String,
        /// What happened.
        reason: String,
        /// What to do about it.
        hint: String,
        /// Nothing answered (refused, no answer, a name that does not
        /// resolve, closed in the handshake): waiting for the broker may
        /// help. `false` for a refusal (login, vhost, certificate, TLS,
        /// parameters), which waiting does not fix.
        unreachable: bool,
    },
    /// A broker operation failed.
    #[error("{context}: {message}")]
    Broker {
        /// What dlqctl was doing.
        context: String,
        /// The broker's or client's words.
        message: String,
    },
    /// Another DLQ command holds the DLQ's lock.
    #[error("{queue} is busy: {message}")]
    Busy {
        /// The DLQ.
        queue: String,
        /// Who holds it and what to do.
        message: String,
    },
    /// The management API answered with an error or could not be reached.
    #[error("management API {}: {message}", crate::core::values::redact::url(.url))]
    Management {
        /// The URL asked (no credentials; shown with a secret query value
        /// hidden, as every URL is).
        url: String,
        /// What happened.
        message: String,
    },
    /// Writing an output (an export file, a pipe) failed.
    #[error("cannot write {what}: {source}")]
    Write {
        /// What was being written.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The idempotency store cannot be used (exit 1).
    #[error(transparent)]
    Store(#[from] crate::idempotency::StoreError),
    /// Bad usage detected after argument parsing (exit 2).
    #[error("{0}")]
    Usage(String),
}

/// A lapin error in a user's words: the broker's reply text where there is one.
pub fn describe_lapin_error(e: &lapin::Error) -> String {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            format!("{} ({})", amqp.get_message(), amqp.get_id())
        }
        lapin::ErrorKind::IOError(io) => io.to_string(),
        _ => e.to_string(),
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps a lapin error with what dlqctl was doing.
    pub fn broker(context: impl Into<String>, e: &lapin::Error) -> Self {
        Error::Broker {
            context: context.into(),
            message: describe_lapin_error(e),
        }
    }
}
