//! Small values the rest of the core shares.
//!
//! - [`duration`]: `500ms`, `30s`, `10m`, `2h`, `14d`.
//! - [`redact`]: secrets in URLs: what a URL shows, what it hides, and
//!   any text scrubbed of them.
//! - [`shortstr`]: AMQP short strings whose bytes are not UTF-8.
//! - [`text`]: cutting text on character boundaries, RFC 3339 times.

pub mod duration;
pub mod redact;
pub mod shortstr;
pub mod text;

/// A value refused, with a message a user can act on: what was given and
/// what to give instead. The value parsers of the core return it (clap
/// takes it as a `value_parser`'s error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);
