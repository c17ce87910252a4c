//! The three pipes of a handler process: message lines written to its
//! stdin, answers read from its stdout and handed to their messages, and
//! its stderr logged in bounded lines at a bounded rate.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::config::{STDERR_LINES_PER_SECOND, STDERR_LINE_BYTES};
use super::limits::{Limiter, RecentIds};
use super::pool::{Entry, Live, Pool, Reply};
use crate::core::handling::jsonl::{self, Line, LineSplitter, MAX_ANSWER_BYTES};
use crate::handler::process::{io_error_text, TailBuffer};

/// Protocol complaints (malformed lines, unknown ids) logged per minute and
/// process; the rest are counted.
const COMPLAINTS_PER_MINUTE: u32 = 20;

/// Writes message lines to the process's stdin, skipping those whose
/// message stopped waiting, until the pool closes it or a write fails.
pub(super) async fn write_lines(
    stdin: pipe::Sender,
    rx: mpsc::Receiver<(u64, Vec<u8>)>,
    live: Arc<Live>,
) {
    if let Err(e) = feed(stdin, rx, &live).await {
        live.ask_restart(format!(
            "writing to its stdin failed: {}",
            io_error_text(&e)
        ));
    }
}

async fn feed(
    stdin: pipe::Sender,
    mut rx: mpsc::Receiver<(u64, Vec<u8>)>,
    live: &Live,
) -> std::io::Result<()> {
    let mut out = BufWriter::with_capacity(64 * 1024, stdin);
    loop {
        // Nothing more to write for now: what is buffered goes out before
        // the wait (a skipped line must not hold back the one before it).
        if rx.is_empty() {
            out.flush().await?;
        }
        let next = tokio::select! {
            biased;
            () = live.close_stdin.cancelled() => break,
            next = rx.recv() => next,
        };
        let Some((id, line)) = next else { break };
        // Marked sent before the write: once the pipe took it, the process
        // may be handling it.
        if live.mark_sent(id) {
            out.write_all(&line).await?;
        }
    }
    // Dropping stdin is the EOF that tells the process to exit.
    out.flush().await
}

/// Reads answers from the process's stdout and hands each to its message.
pub(super) async fn read_answers(
    mut stdout: pipe::Receiver,
    mut splitter: LineSplitter,
    leftover: Vec<Line>,
    live: Arc<Live>,
    pool: Arc<Pool>,
) {
    let mut state = Answers {
        live: &live,
        pool: &pool,
        recent: RecentIds::new(1024),
        complaints: Limiter::new(COMPLAINTS_PER_MINUTE, Duration::from_secs(60)),
    };
    for line in leftover {
        state.line(line);
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut lines = Vec::new();
    loop {
        match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                splitter.push(&buf[..n], &mut lines);
                for line in lines.drain(..) {
                    state.line(line);
                }
            }
        }
    }
    if let Some(line) = splitter.finish() {
        state.line(line);
    }
    state.complaints.flush(|n| {
        warn!(
            process = live.index,
            count = n,
            "more protocol complaints were not logged"
        )
    });
}

struct Answers<'a> {
    live: &'a Live,
    pool: &'a Pool,
    recent: RecentIds,
    complaints: Limiter,
}

impl Answers<'_> {
    fn line(&mut self, line: Line) {
        let live = self.live;
        if line.dropped > 0 {
            self.complain(format!(
                "an answer line over {MAX_ANSWER_BYTES} bytes ({} bytes), ignored",
                line.bytes.len() + line.dropped
            ));
            return;
        }
        if line.bytes.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let answer = match jsonl::parse_answer(&line.bytes) {
            Ok(a) => a,
            Err(e) => {
                self.complain(format!("a malformed answer line, ignored: {e}"));
                return;
            }
        };
        match live.take(answer.id) {
            Some(Entry {
                reply: Some(reply), ..
            }) => {
                live.timeouts_in_a_row.store(0, Ordering::SeqCst);
                self.recent.insert(answer.id);
                let _ = reply.send(Reply::Done(answer.outcome));
                self.pool.changed.notify_waiters();
            }
            Some(Entry {
                reply: None, late, ..
            }) => {
                // Its place is free again.
                self.recent.insert(answer.id);
                self.pool.changed.notify_waiters();
                let success = answer.outcome == crate::core::handling::outcome::Outcome::Success;
                let label = answer.outcome.label();
                let guarded = late.answer(Some(answer.outcome));
                self.complain(format!(
                    "a late answer for id {} ({label}){}: the message had timed out and \
                     was already failed as timed out",
                    answer.id,
                    match (guarded, success) {
                        (true, true) => "; its idempotency key is marked handled, so a retry of it will not run again",
                        (true, false) => "; its idempotency key is released, so a retry of it runs",
                        (false, _) => ", ignored",
                    }
                ));
            }
            None if self.recent.contains(answer.id) => {
                self.complain(format!("a second answer for id {}, ignored", answer.id));
            }
            None if answer.id < live.next_id.load(Ordering::SeqCst) && answer.id > 0 => {
                self.complain(format!(
                    "an answer for id {} after its message stopped waiting (timed out), ignored",
                    answer.id
                ));
            }
            None => self.complain(format!(
                "an answer for id {}, which was never sent, ignored",
                answer.id
            )),
        }
    }

    fn complain(&mut self, what: String) {
        let live = self.live;
        if self.complaints.allow(Instant::now(), |n| {
            warn!(
                process = live.index,
                count = n,
                "more protocol complaints were not logged"
            )
        }) {
            warn!(process = live.index, pid = live.pid, complaint = %what, "handler process protocol error");
        }
    }
}

/// Logs the process's stderr line by line, bounded in length and rate, and
/// keeps its tail for the error text of a crash. The lines are logged at
/// `debug`, the handler's own words beside the worker's one line per
/// message.
pub(super) async fn log_stderr(
    mut stderr: pipe::Receiver,
    index: usize,
    pid: u32,
    tail: Arc<Mutex<TailBuffer>>,
) {
    let mut splitter = LineSplitter::new(STDERR_LINE_BYTES);
    let mut limiter = Limiter::new(STDERR_LINES_PER_SECOND, Duration::from_secs(1));
    let mut buf = vec![0u8; 16 * 1024];
    let mut lines = Vec::new();
    let report = |n: u64| {
        warn!(
            process = index,
            pid,
            count = n,
            "handler stderr lines were not logged (over {STDERR_LINES_PER_SECOND} a second)"
        )
    };
    let log = |line: Line, limiter: &mut Limiter| {
        // Not logged at this level: nothing to cut, count or report.
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        if limiter.allow(Instant::now(), report) {
            let mut text = String::from_utf8_lossy(&line.bytes).into_owned();
            if line.dropped > 0 {
                text.push_str(&format!("… ({} more bytes)", line.dropped));
            }
            // The handler's own words, at debug: the worker's log has one
            // line per message at info (a crash's stderr tail is its
            // messages' error text).
            debug!(process = index, pid, line = %text, "handler stderr");
        }
    };
    loop {
        // A count of lines not logged is reported once its window is over,
        // even when no line follows.
        let read = tokio::select! {
            r = stderr.read(&mut buf) => r,
            () = tokio::time::sleep(Duration::from_secs(1)), if limiter.suppressed > 0 => {
                limiter.tick(Instant::now(), report);
                continue;
            }
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Ok(mut t) = tail.lock() {
                    t.push(&buf[..n]);
                }
                splitter.push(&buf[..n], &mut lines);
                for line in lines.drain(..) {
                    log(line, &mut limiter);
                }
            }
        }
    }
    if let Some(line) = splitter.finish() {
        log(line, &mut limiter);
    }
    limiter.flush(report);
}
