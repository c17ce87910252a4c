//! Running handler programs: what the per-message handler
//! ([`super::exec`]) and the long-running one ([`super::jsonl`]) share.
//! Starting a program ([`spawn`]: in a process group of its own, killed
//! with its group when dropped, dying with dlqctl), the bounded tail of
//! its stderr, the wording of how it ended, and the `execvp`-like check
//! that a program can be started.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::core::values::duration::tier_name;

pub(crate) mod spawn;

/// Reads once from the pipe; `None` at EOF or on an error, and pends for ever
/// when there is no pipe (so a `select!` branch on it goes quiet).
pub(crate) async fn read_some<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
) -> Option<usize> {
    match pipe {
        Some(pipe) => match pipe.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

pub(crate) fn with_tail(description: String, tail: &str) -> String {
    if tail.is_empty() {
        description
    } else {
        format!("{description}: {tail}")
    }
}

pub(crate) fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGHUP => " (SIGHUP)",
        libc::SIGINT => " (SIGINT)",
        libc::SIGQUIT => " (SIGQUIT)",
        libc::SIGILL => " (SIGILL)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGFPE => " (SIGFPE)",
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGPIPE => " (SIGPIPE)",
        libc::SIGALRM => " (SIGALRM)",
        libc::SIGTERM => " (SIGTERM)",
        _ => "",
    }
}

pub(crate) fn format_timeout(timeout: Duration) -> String {
    tier_name(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
}

/// An `io::Error`'s text without the `(os error N)` suffix.
pub(crate) fn io_error_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    }
}

/// The last `cap` bytes written to it, in memory bounded by twice `cap`.
#[derive(Debug)]
pub(crate) struct TailBuffer {
    cap: usize,
    buf: Vec<u8>,
    cut: bool,
}

impl TailBuffer {
    pub(crate) fn new(cap: usize) -> Self {
        TailBuffer {
            cap,
            buf: Vec::with_capacity(2 * cap),
            cut: false,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        if data.len() >= self.cap {
            self.cut |= !self.buf.is_empty() || data.len() > self.cap;
            self.buf.clear();
            self.buf.extend_from_slice(&data[data.len() - self.cap..]);
            return;
        }
        if self.buf.len() + data.len() > 2 * self.cap {
            let drop = self.buf.len() + data.len() - self.cap;
            self.buf.drain(..drop);
            self.cut = true;
        }
        self.buf.extend_from_slice(data);
    }

    fn bytes(&self) -> &[u8] {
        let start = self.buf.len().saturating_sub(self.cap);
        &self.buf[start..]
    }

    /// The tail as trimmed lossy UTF-8, prefixed with `…` when cut.
    pub(crate) fn text(&self) -> String {
        let mut bytes = self.bytes();
        let cut = self.cut || bytes.len() < self.buf.len();
        if cut {
            // Do not start in the middle of a UTF-8 sequence.
            let skip = bytes
                .iter()
                .take(3)
                .take_while(|b| (**b & 0xC0) == 0x80)
                .count();
            bytes = &bytes[skip..];
        }
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim();
        if cut && !text.is_empty() {
            format!("…{text}")
        } else {
            text.to_string()
        }
    }
}

/// Checks that `program` can be started, resolving it like `execvp` does:
/// a name with a slash is a path; otherwise it is looked up in `PATH`
/// (`/bin:/usr/bin` when unset; an empty entry is the current directory).
/// The file must exist, be a regular file (after symlinks) and be
/// executable by us.
///
/// The worker calls this at start-up; at run time a program that cannot be
/// started is a transient failure.
pub fn check_program(program: impl AsRef<OsStr>) -> Result<(), ProgramError> {
    resolve_program(program.as_ref()).map(|_| ())
}

/// Why a handler program cannot be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    /// No program was given.
    #[error("the handler program is empty")]
    Empty,
    /// The program is not found, or not a file we may execute.
    #[error("cannot start handler `{program}`: {why}")]
    CannotStart {
        /// The program as given.
        program: String,
        /// Why: not found in `PATH`, or the file and what is wrong with it.
        why: String,
    },
}

/// Where `execvp` would find `program`, or why it would not.
pub fn resolve_program(program: &OsStr) -> Result<PathBuf, ProgramError> {
    let cannot = |why| ProgramError::CannotStart {
        program: program.to_string_lossy().into_owned(),
        why,
    };
    if program.is_empty() {
        return Err(ProgramError::Empty);
    }
    if program.as_bytes().contains(&b'/') {
        let path = Path::new(program);
        return check_executable(path)
            .map(|()| path.to_path_buf())
            .map_err(cannot);
    }
    let path_var = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/bin:/usr/bin"));
    let mut first_problem = None;
    for dir in std::env::split_paths(&path_var) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(program);
        match check_executable(&candidate) {
            Ok(()) => return Ok(candidate),
            // Keep looking, as execvp does, but remember why a file that
            // exists was unusable.
            Err(why) if candidate.exists() && first_problem.is_none() => {
                first_problem = Some(format!("{}: {why}", candidate.display()));
            }
            Err(_) => {}
        }
    }
    Err(cannot(
        first_problem.unwrap_or_else(|| "not found in PATH".to_string()),
    ))
}

fn check_executable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| io_error_text(&e))?;
    if meta.is_dir() {
        return Err("is a directory".to_string());
    }
    if !meta.is_file() {
        return Err("not a regular file".to_string());
    }
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| "contains a NUL byte".to_string())?;
    // SAFETY: c_path is a valid NUL-terminated string for the call's duration.
    if unsafe { libc::access(c_path.as_ptr(), libc::X_OK) } != 0 {
        return Err("not executable (permission denied)".to_string());
    }
    Ok(())
}

/// How a program ended, in words: `exited with status 3`, `killed by
/// signal 9 (SIGKILL)`.
pub(crate) fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}{}", signal_name(signal)),
        (None, None) => format!("ended with {status}"),
    }
}

/// Test support for the handler tests that watch a process end.
#[cfg(test)]
pub(crate) mod watch {
    use std::time::Duration;

    /// Whether /proc lists `pid` at all: a zombie (ended, not reaped) is
    /// listed.
    pub(crate) fn listed(pid: i32) -> bool {
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    }

    /// Asks `done` up to `tries` times, 20 ms apart: whether it said yes.
    pub(crate) async fn eventually(tries: u32, mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..tries {
            if done() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::wire::TEMP_PREFIX;

    fn temp_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "{TEMP_PREFIX}process-test-{}-{tag}",
            std::process::id()
        ))
    }

    #[test]
    fn tail_buffer_is_bounded() {
        let mut t = TailBuffer::new(16);
        assert_eq!(t.text(), "");
        t.push(b"  hello ");
        assert_eq!(t.text(), "hello");
        for i in 0..100_000u32 {
            t.push(format!("{i},").as_bytes());
            assert!(t.buf.capacity() <= 32, "capacity {}", t.buf.capacity());
        }
        assert_eq!(t.bytes(), b"997,99998,99999,");
        assert_eq!(t.text(), "…997,99998,99999,");
        let mut t = TailBuffer::new(4);
        t.push("xé".as_bytes());
        t.push("éé".as_bytes());
        // The last 4 bytes are "é" "é"; a cut in the middle of a character
        // is skipped rather than shown as a replacement character.
        assert_eq!(t.text(), "…éé");
        t.push(b"a");
        assert_eq!(t.text(), "…éa");
        let mut t = TailBuffer::new(4);
        t.push(b"exact");
        assert_eq!(t.text(), "…xact");
    }

    /// A program missing when the message comes is the machine's fault,
    /// not the message's: the run waits (no outcome, so no attempt is
    /// counted) and goes on once the program is back.

    #[test]
    fn check_program_resolves_like_execvp() {
        assert_eq!(check_program("sh"), Ok(()));
        assert_eq!(check_program("/bin/sh"), Ok(()));
        assert!(resolve_program(OsStr::new("sh")).unwrap().is_absolute());
        let e = check_program("no-such-program-of-dlqctl")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "cannot start handler `no-such-program-of-dlqctl`: not found in PATH"
        );
        let e = check_program("/nonexistent/x").unwrap_err().to_string();
        assert_eq!(
            e,
            "cannot start handler `/nonexistent/x`: No such file or directory"
        );
        let e = check_program("/tmp").unwrap_err().to_string();
        assert!(e.ends_with("is a directory"), "{e}");
        assert_eq!(check_program(""), Err(ProgramError::Empty));

        let file = temp_path("noexec");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        let e = check_program(&file).unwrap_err().to_string();
        assert!(e.ends_with("not executable (permission denied)"), "{e}");
        std::fs::remove_file(&file).unwrap();
    }
}
