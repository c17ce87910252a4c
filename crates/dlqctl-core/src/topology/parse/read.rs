//! The reader every part of the topology file is read with: it collects
//! problems instead of stopping at the first, and reads the scalars
//! (strings, integers in a range, numbers, durations, names).

use crate::topology::yaml::{Key, Node, Pos, Value};
use crate::values::duration::{parse_millis, MAX_MILLIS};

/// One problem in a topology file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where it is.
    pub pos: Pos,
    /// What is wrong, in words a user can act on.
    pub message: String,
}

/// A value and where it was written.
#[derive(Debug, Clone)]
pub(super) struct At<T> {
    pub(super) pos: Pos,
    pub(super) v: T,
}

pub(super) fn at<T>(pos: Pos, v: T) -> At<T> {
    At { pos, v }
}

#[derive(Default)]
pub(super) struct Cx {
    pub(super) problems: Vec<Problem>,
    /// The shell's parsers of the URLs the file holds, when given.
    pub(super) urls: Option<&'static dyn UrlCheck>,
}

/// The URLs of a topology file checked by the parsers of the code that
/// will use them, which the pure core does not have (an HTTP client, a
/// store's client): the library gives them to
/// [`parse_topology_with`](super::file::parse_topology_with), so that a
/// URL no client can use is a problem of the file, at its line and
/// column, instead of an error at each use. Each answers why `url`
/// cannot be used (the URL, redacted, is named by the caller).
pub trait UrlCheck: Sync {
    /// An `http://` or `https://` URL (`dead_letter.redrive.health.http`).
    fn http(&self, url: &str) -> Result<(), String>;
    /// A `redis://` or `rediss://` store URL (`idempotency.store`).
    fn store(&self, url: &str) -> Result<(), String>;
}

impl Cx {
    /// `url`, read at `pos` as `what`, checked by the shell's parser
    /// `which` (when given): false, reported, when it cannot be used.
    pub(super) fn url_usable(
        &mut self,
        pos: Pos,
        url: &str,
        what: &str,
        which: fn(&dyn UrlCheck, &str) -> Result<(), String>,
    ) -> bool {
        let Some(check) = self.urls else {
            return true;
        };
        match which(check, url) {
            Ok(()) => true,
            Err(why) => {
                let shown = crate::idempotency::redact_url(url);
                self.err(
                    pos,
                    format!("{what} `{}` cannot be used: {why}", shown.escape_debug()),
                );
                false
            }
        }
    }

    pub(super) fn err(&mut self, pos: Pos, message: impl Into<String>) {
        self.problems.push(Problem {
            pos,
            message: message.into(),
        });
    }

    /// The entries of a mapping node; unknown keys are reported.
    pub(super) fn map<'n>(
        &mut self,
        n: &'n Node,
        what: &str,
        allowed: &[&str],
    ) -> Option<&'n [(Key, Node)]> {
        match &n.value {
            Value::Map(m) => {
                for (k, _) in m {
                    if !allowed.contains(&k.name.as_str()) {
                        self.err(
                            k.pos,
                            format!(
                                "unknown key `{}` in {what} (expected one of: {})",
                                k.name,
                                allowed.join(", ")
                            ),
                        );
                    }
                }
                Some(m)
            }
            other => {
                self.err(
                    n.pos,
                    format!("{what} must be a mapping, not {}", other.kind()),
                );
                None
            }
        }
    }

    pub(super) fn string(&mut self, n: &Node, what: &str) -> Option<String> {
        match &n.value {
            Value::Str(s) => Some(s.clone()),
            other => {
                self.err(
                    n.pos,
                    format!("{what} must be a string, not {}", other.kind()),
                );
                None
            }
        }
    }

    pub(super) fn int(&mut self, n: &Node, what: &str) -> Option<i64> {
        match &n.value {
            Value::Int(i) => Some(*i),
            Value::BigInt(_) => {
                self.err(n.pos, format!("{what} is too large"));
                None
            }
            other => {
                self.err(
                    n.pos,
                    format!("{what} must be an integer, not {}", other.kind()),
                );
                None
            }
        }
    }

    pub(super) fn int_in(&mut self, n: &Node, what: &str, lo: i64, hi: i64) -> Option<i64> {
        // A whole number too large for an integer reads as a float (or a
        // big integer): say the range, not "not a number".
        let too_large = match &n.value {
            // A whole number in range written with a decimal point
            // (`canary: 1.0`): say so.
            Value::Float(f)
                if f.is_finite() && f.fract() == 0.0 && (lo as f64..=hi as f64).contains(f) =>
            {
                self.err(
                    n.pos,
                    format!(
                        "{what} must be a whole number: write {}, not {f:?}",
                        *f as i64
                    ),
                );
                return None;
            }
            Value::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 => {
                Some(format!("{f}"))
            }
            Value::Float(f) if f.is_finite() && f.fract() == 0.0 => Some(format!("{f:e}")),
            Value::BigInt(i) => Some(i.to_string()),
            _ => None,
        };
        if let Some(shown) = too_large {
            self.err(
                n.pos,
                format!("{what} must be between {lo} and {hi}, not {shown}"),
            );
            return None;
        }
        let i = self.int(n, what)?;
        if i < lo || i > hi {
            self.err(
                n.pos,
                format!("{what} must be between {lo} and {hi}, not {i}"),
            );
            return None;
        }
        Some(i)
    }

    pub(super) fn number(&mut self, n: &Node, what: &str) -> Option<f64> {
        match &n.value {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) if f.is_finite() => Some(*f),
            other => {
                self.err(
                    n.pos,
                    format!("{what} must be a number, not {}", other.kind()),
                );
                None
            }
        }
    }

    /// A duration between 1ms and the broker's 2^32-1 ms bound.
    pub(super) fn duration(&mut self, n: &Node, what: &str) -> Option<u64> {
        let s = match &n.value {
            Value::Str(s) => s,
            other => {
                self.err(
                    n.pos,
                    format!(
                        "{what} must be a duration such as 500ms, 30s, 10m, 2h or 14d, not {}",
                        other.kind()
                    ),
                );
                return None;
            }
        };
        match parse_millis(s) {
            Ok(ms) if (1..=MAX_MILLIS).contains(&ms) => Some(ms),
            Ok(ms) => {
                self.err(
                    n.pos,
                    format!("{what} must be between 1ms and {MAX_MILLIS}ms (about 49.7 days), not {ms}ms"),
                );
                None
            }
            Err(e) => {
                self.err(n.pos, format!("{what}: {e}"));
                None
            }
        }
    }

    pub(super) fn name(&mut self, pos: Pos, name: &str, what: &str) -> bool {
        let mut ok = true;
        if name.is_empty() {
            self.err(pos, format!("{what} must not be empty"));
            ok = false;
        }
        if name.len() > 255 {
            self.err(
                pos,
                format!(
                    "{what} `{}…` is {} bytes long; RabbitMQ names are at most 255 bytes",
                    crate::values::text::truncate_utf8(name, 40),
                    name.len()
                ),
            );
            ok = false;
        }
        if name.starts_with("amq.") {
            self.err(
                pos,
                format!("{what} `{name}` starts with `amq.`, which RabbitMQ reserves"),
            );
            ok = false;
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            // A NUL, an escape or a newline in a queue name passes the
            // broker, then breaks every log, terminal and script that
            // prints or matches it.
            self.err(
                pos,
                format!(
                    "{what} `{}` contains the control character U+{:04X}; names are printable text",
                    name.escape_debug(),
                    c as u32
                ),
            );
            ok = false;
        }
        ok
    }
}
