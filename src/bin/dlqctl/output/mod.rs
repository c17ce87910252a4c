//! What the commands show: one renderer per output kind. Logic never
//! prints; commands hand typed reports to these, and write through
//! [`stdout`] and [`stderr`], which return errors instead of panicking.
//!
//! Output that cannot be written is a failure: a closed pipe
//! (`dlqctl dlq export | head -1`) or a full disk (`> /dev/full`) is
//! reported on standard error and exits 1, so a script never takes a cut
//! output for a whole one.

pub mod annotations;
pub mod github;
pub mod json;
pub mod progress;
pub mod text;

use std::io::Write;

/// Writes `text` to standard output and flushes it. Control characters
/// other than newlines and tabs are written as visible escapes: no
/// message, file or broker string quoted in a report can drive the
/// terminal.
pub fn stdout(text: &str) -> std::io::Result<()> {
    let text = dlqctl::core::values::text::escape_controls_keep_lines(text);
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot write to standard output: {e}")))
}

/// Writes `text` to standard output with a newline.
pub fn stdout_line(text: &str) -> std::io::Result<()> {
    stdout(&format!("{text}\n"))
}

/// Writes `text` to standard error with a newline, its control
/// characters escaped as [`stdout`] does. A failed write to standard
/// error cannot be reported anywhere: it is ignored, never a panic.
pub fn stderr_line(text: &str) {
    let text = dlqctl::core::values::text::escape_controls_keep_lines(text);
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(format!("{text}\n").as_bytes());
    let _ = err.flush();
}
