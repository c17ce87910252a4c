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
//!   process answers it (a late answer: logged as a protocol error, and
//!   given to [`HandlerMessage::late`]: under the idempotency guard a
//!   late success marks the key, a late failure releases it) or ends
//!   (the message's late answer is then "none": the key is released); a process whose every place is held by
//!   timed-out messages is restarted. A process thus never has more than
//!   `max_in_flight` messages it has not answered.
//! - Malformed lines, answers over [`MAX_ANSWER_BYTES`](jsonl::MAX_ANSWER_BYTES), unknown ids and
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

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::process::format_timeout;
use super::{Handler, HandlerMessage};
use crate::core::handling::jsonl;
use crate::core::handling::outcome::Outcome;

mod config;
mod limits;
mod pipes;
mod pool;
mod supervisor;

pub use config::{JsonlConfig, STDERR_LINES_PER_SECOND, STDERR_LINE_BYTES};
use pool::{Live, Pool, Reply};

/// Long-running handler processes; see the [module documentation](self).
pub struct JsonlHandler {
    pool: Arc<Pool>,
    supervisors: Mutex<Vec<JoinHandle<()>>>,
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
            let Some((live, id, mut rx)) = pool.reserve(&msg.late).await else {
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
                        live.ask_restart(format!(
                            "{} in a row got no answer in time",
                            crate::core::values::text::count(n as u64, "message")
                        ));
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
                    return Outcome::timed_out(error);
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

#[cfg(test)]
mod tests;
