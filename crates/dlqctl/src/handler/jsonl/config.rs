//! The settings of a [`JsonlHandler`](super::JsonlHandler).

use std::ffi::OsString;
use std::time::Duration;

/// stderr lines longer than this are cut in the log.
pub const STDERR_LINE_BYTES: usize = 4096;

/// stderr lines logged per second and process; the rest are counted.
pub const STDERR_LINES_PER_SECOND: u32 = 100;

/// Settings of a [`JsonlHandler`](super::JsonlHandler).
#[derive(Debug, Clone)]
pub struct JsonlConfig {
    /// The program (resolved through `PATH` when it has no slash).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The pipeline's main queue, for the hello line and `DLQCTL_QUEUE`.
    pub queue: String,
    /// How many copies of the program run.
    pub processes: usize,
    /// Messages in flight per process at most.
    pub max_in_flight: usize,
    /// How long a message may wait for its answer (from when it was handed
    /// to a process).
    pub timeout: Duration,
    /// How long a process may take to answer the hello line.
    pub start_timeout: Duration,
    /// Timeouts in a row after which a process is restarted.
    pub timeouts_before_restart: u32,
    /// At shutdown, how long a process may take to exit after EOF.
    pub exit_wait: Duration,
    /// The largest pause between two starts of a failing process.
    pub max_restart_backoff: Duration,
}

impl JsonlConfig {
    /// One process with one message in flight, a 30 s timeout, 60 s to
    /// start, a restart after 3 timeouts in a row, 5 s to exit.
    pub fn new(
        program: impl Into<OsString>,
        args: Vec<OsString>,
        queue: impl Into<String>,
    ) -> Self {
        JsonlConfig {
            program: program.into(),
            args,
            queue: queue.into(),
            processes: 1,
            max_in_flight: 1,
            timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(60),
            timeouts_before_restart: 3,
            exit_wait: Duration::from_secs(5),
            max_restart_backoff: Duration::from_secs(30),
        }
    }
}
