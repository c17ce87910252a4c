//! `--jsonl -- COMMAND ARGS...`: long-running handler processes that take
//! messages as JSON lines on stdin and answer outcomes on stdout, by id, in
//! any order (the protocol is [`crate::core::handling::jsonl`]; docs/worker.md,
//! "The JSON-lines protocol").
//!
//! [`JsonlHandler`] keeps `processes` copies of the program running, each
//! started directly (no shell) in a process group of its own, and hands
//! each message to the ready process with the fewest messages in flight,
//! at most `max_in_flight` per process.
//!
//! The failure rules:
//!
//! - A process that exits (or is killed) with messages in flight fails
//!   each of them as transient (`handler process 0 (pid 12) exited with
//!   status 1 with this message in flight: <stderr tail>`); it is started
//!   again with capped exponential backoff.
//! - Until a process answers the ready line, no message is sent to it. A
//!   message that finds no ready process waits, unsent and with no attempt
//!   counted; the worker's prefetch follows its concurrency, so
//!   consumption pauses while every process fails to start.
//! - A message whose line was not yet written when its process ended goes
//!   to another process (or waits for one): it costs no attempt.
//! - A message unanswered after `timeout` is transient; after
//!   `timeouts_before_restart` timeouts in a row (no answer in between) the
//!   process is killed and started again. The process may still be
//!   working on it, so it still counts against `max_in_flight` until the
//!   process answers it (a late answer: logged as a protocol error and
//!   otherwise ignored) or ends; a process whose every place is held by
//!   timed-out messages is restarted. A process thus never has more than
//!   `max_in_flight` messages it has not answered.
//! - Malformed lines, answers over [`MAX_ANSWER_BYTES`], unknown ids and
//!   duplicate answers are logged (at most 20 a minute per process) and
//!   ignored; the message they were meant for times out.
//! - Memory is bounded: at most `max_in_flight` lines wait for a process
//!   that does not read its stdin, and lines read back are cut at their
//!   limit. A line counts as sent once the writer hands it to the pipe
//!   (the process may be handling it): such messages time out; those
//!   still queued behind them go to another process at no cost.
//! - stderr is logged line by line (each cut at 4 KiB, at most 100 lines a
//!   second per process; the rest is counted), and its last 960 bytes are
//!   kept for the error text of a crash.
//! - [`JsonlHandler::shutdown`] closes every process's stdin (EOF means
//!   "exit"; a writer blocked on a full pipe cannot close it), waits
//!   `exit_wait`, then kills the process group. Messages that wait for a
//!   process then end as transient.
//! - A process asked to restart takes no new message; a process that
//!   ended has what it left in its group killed; and every process dies
//!   with dlqctl, however dlqctl ends (`PR_SET_PDEATHSIG`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::process::format_timeout;
use super::{Handler, HandlerMessage};
use crate::core::handling::jsonl;
use crate::core::handling::outcome::Outcome;

mod limits;
mod pipes;
mod supervisor;

/// stderr lines longer than this are cut in the log.
pub const STDERR_LINE_BYTES: usize = 4096;

/// stderr lines logged per second and process; the rest are counted.
pub const STDERR_LINES_PER_SECOND: u32 = 100;

/// Settings of a [`JsonlHandler`].
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

/// Long-running handler processes; see the [module documentation](self).
pub struct JsonlHandler {
    pool: Arc<Pool>,
    supervisors: Mutex<Vec<JoinHandle<()>>>,
}

struct Pool {
    cfg: JsonlConfig,
    slots: Vec<Mutex<Option<Arc<Live>>>>,
    /// A process became ready or a message left a process.
    changed: Notify,
    stopping: CancellationToken,
}

/// What a waiting message hears back.
enum Reply {
    /// The process answered, or ended with the message in flight.
    Done(Outcome),
    /// The process ended before the message's line was written: hand it to
    /// another one.
    NotSent,
}

struct Entry {
    /// `None` once the message timed out: the process may still work on
    /// it, so the entry stays (it counts against `max_in_flight`) until
    /// the process answers it (a late answer, logged) or ends.
    reply: Option<oneshot::Sender<Reply>>,
    sent: bool,
}

#[derive(Default)]
struct Pending {
    /// No more messages: the process is ending.
    closed: bool,
    map: HashMap<u64, Entry>,
}

/// A ready process, as the messages see it.
struct Live {
    index: usize,
    pid: u32,
    lines: mpsc::Sender<(u64, Vec<u8>)>,
    pending: Mutex<Pending>,
    max_in_flight: usize,
    next_id: AtomicU64,
    timeouts_in_a_row: AtomicU32,
    /// Cancelled to have the supervisor end the process (with `why`).
    restart: CancellationToken,
    why: Mutex<Option<String>>,
    /// Cancelled to close the process's stdin.
    close_stdin: CancellationToken,
}

impl Live {
    /// Has the supervisor end the process; from now on it takes no new
    /// message, and lines not yet written stay unwritten (their messages
    /// go to another process at no cost).
    fn ask_restart(&self, why: String) {
        if let Ok(mut w) = self.why.lock() {
            w.get_or_insert(why);
        }
        if let Ok(mut p) = self.pending.lock() {
            p.closed = true;
        }
        self.restart.cancel();
    }

    /// Marks the entry of `id` as sent, just before its line is written;
    /// `false` when it no longer waits or the process takes no more lines.
    fn mark_sent(&self, id: u64) -> bool {
        let Ok(mut p) = self.pending.lock() else {
            return false;
        };
        if p.closed {
            return false;
        }
        match p.map.get_mut(&id) {
            Some(e) => {
                e.sent = true;
                true
            }
            None => false,
        }
    }

    /// Takes the entry of `id`, if it still waits.
    fn take(&self, id: u64) -> Option<Entry> {
        self.pending.lock().ok()?.map.remove(&id)
    }

    /// The message of `id` timed out: an entry whose line was sent stays,
    /// without its reply, until the process answers it or ends; an unsent
    /// one goes. `Some(sent)` when it still waited, with whether every
    /// place of the process is now held by timed-out messages.
    fn expire(&self, id: u64) -> Option<(bool, bool)> {
        let mut p = self.pending.lock().ok()?;
        let e = p.map.get_mut(&id)?;
        e.reply.as_ref()?;
        if !e.sent {
            p.map.remove(&id);
            return Some((false, false));
        }
        e.reply = None;
        let expired = p.map.values().filter(|e| e.reply.is_none()).count();
        Some((true, expired >= self.max_in_flight))
    }

    fn load(&self) -> usize {
        self.pending
            .lock()
            .map(|p| p.map.len())
            .unwrap_or(usize::MAX)
    }
}

impl JsonlHandler {
    /// Starts the processes (in the background: messages wait until one is
    /// ready). Must be called inside a Tokio runtime.
    pub fn start(mut cfg: JsonlConfig) -> Self {
        cfg.processes = cfg.processes.max(1);
        cfg.max_in_flight = cfg.max_in_flight.max(1);
        cfg.timeouts_before_restart = cfg.timeouts_before_restart.max(1);
        let pool = Arc::new(Pool {
            slots: (0..cfg.processes).map(|_| Mutex::new(None)).collect(),
            cfg,
            changed: Notify::new(),
            stopping: CancellationToken::new(),
        });
        let supervisors = (0..pool.cfg.processes)
            .map(|index| tokio::spawn(supervisor::supervise(pool.clone(), index)))
            .collect();
        JsonlHandler {
            pool,
            supervisors: Mutex::new(supervisors),
        }
    }

    /// The settings.
    pub fn config(&self) -> &JsonlConfig {
        &self.pool.cfg
    }

    /// How many processes are ready now.
    pub fn ready(&self) -> usize {
        self.pool
            .slots
            .iter()
            .filter(|s| s.lock().map(|s| s.is_some()).unwrap_or(false))
            .count()
    }

    /// Stops every process: closes its stdin, waits up to `exit_wait`,
    /// then kills its process group. Messages still in flight end as
    /// transient; none is sent after this.
    pub async fn shutdown(&self) {
        self.pool.stopping.cancel();
        self.pool.changed.notify_waiters();
        let handles =
            std::mem::take(&mut *self.supervisors.lock().unwrap_or_else(|e| e.into_inner()));
        for h in handles {
            let _ = h.await;
        }
    }

    async fn run(&self, msg: &HandlerMessage) -> Outcome {
        let pool = &self.pool;
        loop {
            let Some((live, id, mut rx)) = pool.reserve().await else {
                return Outcome::transient(
                    "the JSON-lines handler is stopped: no process takes messages",
                );
            };
            let mut guard = Reserved {
                pool,
                live: &live,
                id,
            };
            let line = jsonl::message_line(id, msg);
            let deadline = Instant::now() + pool.cfg.timeout;
            // The writer's queue holds at most max_in_flight lines, so this
            // waits only behind this process's own messages.
            let queued = tokio::select! {
                r = live.lines.send((id, line)) => r.is_ok(),
                () = tokio::time::sleep_until(deadline) => true,
            };
            if !queued {
                // The writer is gone: the process is ending, and its
                // supervisor answers every entry.
                debug!(
                    process = live.index,
                    "the handler process is ending; waiting for its verdict"
                );
            }
            match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(Ok(Reply::Done(outcome))) => {
                    guard.id = u64::MAX;
                    return outcome;
                }
                Ok(Ok(Reply::NotSent)) | Ok(Err(_)) => {
                    guard.id = u64::MAX;
                    continue;
                }
                Err(_) => {
                    let expired = live.expire(id);
                    guard.id = u64::MAX;
                    pool.changed.notify_waiters();
                    let (sent, all_expired) = match expired {
                        Some(e) => e,
                        // The reader or the supervisor took the entry just
                        // as the time ran out: its reply is on the way.
                        None => match rx.await {
                            Ok(Reply::Done(outcome)) => return outcome,
                            Ok(Reply::NotSent) | Err(_) => continue,
                        },
                    };
                    let n = live.timeouts_in_a_row.fetch_add(1, Ordering::SeqCst) + 1;
                    let limit = pool.cfg.timeouts_before_restart;
                    if !sent {
                        // Never written: the process is not reading its
                        // stdin. The message costs no attempt; it waits
                        // for a process again, and the stuck one is
                        // restarted like one that does not answer.
                        if n >= limit {
                            live.ask_restart(format!(
                                "it read none of its stdin for {}",
                                format_timeout(pool.cfg.timeout)
                            ));
                        }
                        continue;
                    }
                    let mut error = format!(
                        "no answer from handler process {} (pid {}) within {}",
                        live.index,
                        live.pid,
                        format_timeout(pool.cfg.timeout)
                    );
                    if n >= limit {
                        live.ask_restart(format!("{n} messages in a row got no answer in time"));
                        error.push_str("; the process is restarted");
                    } else if all_expired {
                        // Every place is held by a message the process
                        // may still work on: none can be sent until it
                        // answers, so it is restarted.
                        live.ask_restart(format!(
                            "all its {} places are held by messages that timed out",
                            pool.cfg.max_in_flight
                        ));
                        error.push_str("; the process is restarted");
                    }
                    return Outcome::transient(error);
                }
            }
        }
    }
}

impl Handler for JsonlHandler {
    fn handle(&self, msg: &HandlerMessage) -> impl std::future::Future<Output = Outcome> + Send {
        self.run(msg)
    }
}

impl Drop for JsonlHandler {
    fn drop(&mut self) {
        // Supervisors own the children (killed with their group on drop).
        self.pool.stopping.cancel();
    }
}

/// A message's entry in a process's pending map, removed if its future is
/// dropped (the worker stopped waiting) before an answer came.
struct Reserved<'a> {
    pool: &'a Pool,
    live: &'a Live,
    /// `u64::MAX` once settled.
    id: u64,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if self.id != u64::MAX {
            self.live.take(self.id);
            self.pool.changed.notify_waiters();
        }
    }
}

impl Pool {
    /// Reserves a place on the ready process with the fewest messages in
    /// flight, waiting for one when none is ready or all are full.
    async fn reserve(&self) -> Option<(Arc<Live>, u64, oneshot::Receiver<Reply>)> {
        loop {
            if self.stopping.is_cancelled() {
                return None;
            }
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let mut ready: Vec<Arc<Live>> = self
                .slots
                .iter()
                .filter_map(|s| s.lock().ok().and_then(|s| s.clone()))
                .collect();
            ready.sort_by_key(|l| l.load());
            for live in ready {
                let Ok(mut p) = live.pending.lock() else {
                    continue;
                };
                if p.closed || p.map.len() >= self.cfg.max_in_flight {
                    continue;
                }
                let id = live.next_id.fetch_add(1, Ordering::SeqCst);
                let (tx, rx) = oneshot::channel();
                p.map.insert(
                    id,
                    Entry {
                        reply: Some(tx),
                        sent: false,
                    },
                );
                drop(p);
                return Some((live, id, rx));
            }
            tokio::select! {
                () = changed => {}
                () = self.stopping.cancelled() => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests;
