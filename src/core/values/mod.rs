//! Small values the rest of the core shares.
//!
//! - [`duration`]: `500ms`, `30s`, `10m`, `2h`, `14d`.
//! - [`shortstr`]: AMQP short strings whose bytes are not UTF-8.
//! - [`text`]: cutting text on character boundaries, RFC 3339 times.

pub mod duration;
pub mod shortstr;
pub mod text;
