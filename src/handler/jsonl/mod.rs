//! `--jsonl -- COMMAND ARGS...`: long-running handler processes that take
//! messages as JSON lines on stdin and answer outcomes on stdout, by id, in
//! any order (the protocol is [`crate::core::jsonl`]; README, "The
//! JSON-lines protocol").
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
//!   process is killed and started again.
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
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::process::{describe_exit, format_timeout, io_error_text, GroupChild, TailBuffer};
use super::{Handler, HandlerMessage};
use crate::core::backoff::Backoff;
use crate::core::jsonl::{self, Line, LineSplitter, MAX_ANSWER_BYTES};
use crate::core::outcome::Outcome;
use limits::{Limiter, RecentIds};

mod limits;

/// stderr lines longer than this are cut in the log.
pub const STDERR_LINE_BYTES: usize = 4096;

/// stderr lines logged per second and process; the rest are counted.
pub const STDERR_LINES_PER_SECOND: u32 = 100;

/// How much of the end of stderr goes into the error text of a crash.
const STDERR_TAIL_BYTES: usize = 960;

/// Protocol complaints (malformed lines, unknown ids) logged per minute and
/// process; the rest are counted.
const COMPLAINTS_PER_MINUTE: u32 = 20;

/// After a process ended, how long its stdout is still read for answers it
/// wrote before it ended (a child it left behind may hold the pipe open).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);

/// After a restart was asked for, how long the process may take to end by
/// itself (it may be crashing already) before it is killed.
const RESTART_GRACE: Duration = Duration::from_millis(200);

/// A process that stayed up this long starts its backoff over.
const STABLE_AFTER: Duration = Duration::from_secs(30);

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
    reply: oneshot::Sender<Reply>,
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

    /// Takes the entry of `id`, if it still waits.
    fn take(&self, id: u64) -> Option<Entry> {
        self.pending.lock().ok()?.map.remove(&id)
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
            .map(|index| tokio::spawn(supervise(pool.clone(), index)))
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
                    let sent = live.take(id).map(|e| e.sent);
                    guard.id = u64::MAX;
                    pool.changed.notify_waiters();
                    let sent = match sent {
                        Some(sent) => sent,
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
                        reply: tx,
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

/// Keeps process `index` running until the pool stops.
async fn supervise(pool: Arc<Pool>, index: usize) {
    let cfg = &pool.cfg;
    let mut backoff = Backoff::new(Duration::from_millis(200), cfg.max_restart_backoff);
    let program = cfg.program.to_string_lossy().into_owned();
    let mut failing = 0u32;
    loop {
        if pool.stopping.is_cancelled() {
            return;
        }
        let started = Instant::now();
        match start(&pool, index).await {
            Err(_) if pool.stopping.is_cancelled() => return,
            Err(why) => {
                failing += 1;
                let wait = backoff.peek();
                if failing == 1 || failing.is_power_of_two() {
                    warn!(
                        process = index,
                        program = %program,
                        error = %why,
                        failures = failing,
                        retry_in_ms = wait.as_millis() as u64,
                        "the handler process failed to start; messages wait for a ready process, \
                         unsent and with no attempt counted (consumption pauses while none is ready)"
                    );
                } else {
                    debug!(process = index, error = %why, failures = failing, "the handler process failed to start again");
                }
            }
            Ok(running) => {
                failing = 0;
                let end = running.serve(&pool).await;
                if pool.stopping.is_cancelled() {
                    info!(process = index, how = %end, "handler process stopped");
                    return;
                }
                warn!(
                    process = index,
                    how = %end,
                    restart_in_ms = backoff.peek().as_millis() as u64,
                    "handler process ended; starting it again"
                );
            }
        }
        if started.elapsed() >= STABLE_AFTER {
            backoff.reset();
        }
        tokio::select! {
            () = pool.stopping.cancelled() => return,
            () = tokio::time::sleep(backoff.next_wait()) => {}
        }
    }
}

/// A process that answered the hello, with its pipes' tasks.
struct Running {
    child: GroupChild,
    live: Arc<Live>,
    writer: JoinHandle<()>,
    reader: JoinHandle<()>,
    stderr: JoinHandle<()>,
    tail: Arc<Mutex<TailBuffer>>,
}

/// Starts process `index` and waits for its ready line.
async fn start(pool: &Arc<Pool>, index: usize) -> Result<Running, String> {
    let cfg = &pool.cfg;
    let mut cmd = Command::new(&cfg.program);
    cmd.args(&cfg.args)
        .env("DLQCTL_QUEUE", &cfg.queue)
        .env("DLQCTL_PROCESS", index.to_string())
        .env(
            "DLQCTL_PROTOCOL",
            format!("{}/{}", jsonl::PROTOCOL, jsonl::VERSION),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    super::process::die_with_parent(&mut cmd);
    let child = cmd.spawn().map_err(|e| io_error_text(&e))?;
    let mut child = GroupChild::new(child).ok_or("the process vanished at start")?;
    let pid = child.child.id().unwrap_or(0);
    let (Some(mut stdin), Some(mut stdout), Some(stderr)) = (
        child.child.stdin.take(),
        child.child.stdout.take(),
        child.child.stderr.take(),
    ) else {
        return Err("the process's pipes are missing".into());
    };
    let tail = Arc::new(Mutex::new(TailBuffer::new(STDERR_TAIL_BYTES)));
    let stderr_task = tokio::spawn(log_stderr(stderr, index, pid, tail.clone()));
    let tail_text =
        |tail: &Arc<Mutex<TailBuffer>>| tail.lock().map(|t| t.text()).unwrap_or_default();

    let deadline = Instant::now() + cfg.start_timeout;
    let hello = jsonl::hello_line(&cfg.queue, index, cfg.processes, cfg.max_in_flight);
    let mut splitter = LineSplitter::new(MAX_ANSWER_BYTES);
    let handshake = async {
        stdin
            .write_all(&hello)
            .await
            .and(stdin.flush().await)
            .map_err(|e| format!("cannot write the hello line: {}", io_error_text(&e)))?;
        let mut lines = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if !lines.is_empty() {
                let first: Line = lines.remove(0);
                if first.dropped > 0 {
                    return Err(format!("its first line is over {} bytes", MAX_ANSWER_BYTES));
                }
                jsonl::parse_ready(&first.bytes)?;
                return Ok(lines);
            }
            match stdout.read(&mut buf).await {
                Ok(0) => return Err("it closed its stdout before the ready line".to_string()),
                Ok(n) => splitter.push(&buf[..n], &mut lines),
                Err(e) => return Err(format!("cannot read its stdout: {}", io_error_text(&e))),
            }
        }
    };
    let outcome = tokio::select! {
        r = handshake => r,
        () = pool.stopping.cancelled() => Err("dlqctl is stopping".to_string()),
        () = tokio::time::sleep_until(deadline) => Err(format!(
            "no ready line within {} (--handler-start-timeout)",
            format_timeout(cfg.start_timeout)
        )),
    };
    let leftover = match outcome {
        Ok(leftover) => leftover,
        Err(why) => {
            // It may be exiting: give it a moment to say how.
            let status = match tokio::time::timeout(RESTART_GRACE, child.child.wait()).await {
                Ok(Ok(status)) => {
                    child.reaped = true;
                    Some(status)
                }
                _ => None,
            };
            drop(stdin);
            let why = match status {
                Some(status) => format!("{why}; it {}", describe_exit(status)),
                None => why,
            };
            child.kill_group();
            let _ = child.child.wait().await;
            child.reaped = true;
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, stderr_task).await;
            let tail = tail_text(&tail);
            return Err(if tail.is_empty() {
                why
            } else {
                format!("{why}: {tail}")
            });
        }
    };

    let (tx, rx) = mpsc::channel(cfg.max_in_flight);
    let live = Arc::new(Live {
        index,
        pid,
        lines: tx,
        pending: Mutex::new(Pending::default()),
        next_id: AtomicU64::new(1),
        timeouts_in_a_row: AtomicU32::new(0),
        restart: CancellationToken::new(),
        why: Mutex::new(None),
        close_stdin: CancellationToken::new(),
    });
    let writer = tokio::spawn(write_lines(stdin, rx, live.clone()));
    let reader = tokio::spawn(read_answers(
        stdout,
        splitter,
        leftover,
        live.clone(),
        pool.clone(),
    ));
    info!(process = index, pid, "handler process ready");
    if let Ok(mut slot) = pool.slots[index].lock() {
        *slot = Some(live.clone());
    }
    pool.changed.notify_waiters();
    Ok(Running {
        child,
        live,
        writer,
        reader,
        stderr: stderr_task,
        tail,
    })
}

impl Running {
    /// Runs until the process ends, a restart is asked for, or the pool
    /// stops; then settles every message it had. Returns how it ended.
    async fn serve(mut self, pool: &Pool) -> String {
        let live = self.live.clone();
        let cfg = &pool.cfg;
        let status = tokio::select! {
            s = self.child.child.wait() => s.map(describe_exit).map_err(|e| io_error_text(&e)),
            () = live.restart.cancelled() => {
                // It may be dying already (a broken pipe asks for a
                // restart): let the real exit speak first.
                match tokio::time::timeout(RESTART_GRACE, self.child.child.wait()).await {
                    Ok(s) => s.map(describe_exit).map_err(|e| io_error_text(&e)),
                    Err(_) => {
                        self.child.kill_group();
                        let _ = self.child.child.wait().await;
                        let why = live.why.lock().ok().and_then(|w| w.clone()).unwrap_or_default();
                        Ok(format!("was killed: {why}"))
                    }
                }
            }
            () = pool.stopping.cancelled() => {
                live.close_stdin.cancel();
                match tokio::time::timeout(cfg.exit_wait, self.child.child.wait()).await {
                    Ok(s) => s.map(describe_exit).map_err(|e| io_error_text(&e)),
                    Err(_) => {
                        self.child.kill_group();
                        let _ = self.child.child.wait().await;
                        Ok(format!("was killed: it did not exit within {} of EOF on its stdin", format_timeout(cfg.exit_wait)))
                    }
                }
            }
        };
        self.child.reaped = true;
        // Children it left in its group would pile up over restarts.
        self.child.kill_leftovers();
        // No new message goes to it.
        if let Ok(mut slot) = pool.slots[live.index].lock() {
            *slot = None;
        }
        if let Ok(mut p) = live.pending.lock() {
            p.closed = true;
        }
        live.close_stdin.cancel();
        // Answers it wrote before it ended still count.
        let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut self.reader).await;
        self.reader.abort();
        let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut self.stderr).await;
        self.stderr.abort();
        let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut self.writer).await;
        self.writer.abort();
        let how = match status {
            Ok(how) => how,
            Err(e) => format!("could not be waited for: {e}"),
        };
        let tail = self.tail.lock().map(|t| t.text()).unwrap_or_default();
        let mut error = format!(
            "handler process {} (pid {}) {how} with this message in flight",
            live.index, live.pid
        );
        if !tail.is_empty() {
            error.push_str(": ");
            error.push_str(&tail);
        }
        let entries: Vec<Entry> = live
            .pending
            .lock()
            .map(|mut p| p.map.drain().map(|(_, e)| e).collect())
            .unwrap_or_default();
        let (mut failed, mut resent) = (0usize, 0usize);
        for e in entries {
            if e.sent {
                failed += 1;
                let _ = e.reply.send(Reply::Done(Outcome::transient(error.clone())));
            } else {
                resent += 1;
                let _ = e.reply.send(Reply::NotSent);
            }
        }
        pool.changed.notify_waiters();
        if failed + resent > 0 {
            info!(
                process = live.index,
                failed,
                handed_on = resent,
                "settled the messages of an ended handler process"
            );
        }
        how
    }
}

/// Writes message lines to the process's stdin, skipping those whose
/// message stopped waiting, until the pool closes it or a write fails.
async fn write_lines(stdin: ChildStdin, mut rx: mpsc::Receiver<(u64, Vec<u8>)>, live: Arc<Live>) {
    let mut out = BufWriter::with_capacity(64 * 1024, stdin);
    loop {
        // Nothing more to write for now: what is buffered goes out before
        // the wait (a skipped line must not hold back the one before it).
        if rx.is_empty() {
            if let Err(e) = out.flush().await {
                live.ask_restart(format!(
                    "writing to its stdin failed: {}",
                    io_error_text(&e)
                ));
                return;
            }
        }
        let next = tokio::select! {
            biased;
            () = live.close_stdin.cancelled() => break,
            next = rx.recv() => next,
        };
        let Some((id, line)) = next else { break };
        // Marked sent before the write: once the pipe took it, the process
        // may be handling it.
        let still_waiting = live
            .pending
            .lock()
            .map(|mut p| {
                let closed = p.closed;
                match p.map.get_mut(&id) {
                    Some(e) if !closed => {
                        e.sent = true;
                        true
                    }
                    _ => false,
                }
            })
            .unwrap_or(false);
        if !still_waiting {
            continue;
        }
        let written = out.write_all(&line).await;
        if let Err(e) = written {
            live.ask_restart(format!(
                "writing to its stdin failed: {}",
                io_error_text(&e)
            ));
            return;
        }
    }
    // Dropping stdin is the EOF that tells the process to exit.
    let _ = out.flush().await;
}

/// Reads answers from the process's stdout and hands each to its message.
async fn read_answers(
    mut stdout: ChildStdout,
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
            Some(entry) => {
                live.timeouts_in_a_row.store(0, Ordering::SeqCst);
                self.recent.insert(answer.id);
                let _ = entry.reply.send(Reply::Done(answer.outcome));
                self.pool.changed.notify_waiters();
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
/// keeps its tail for the error text of a crash.
async fn log_stderr(mut stderr: ChildStderr, index: usize, pid: u32, tail: Arc<Mutex<TailBuffer>>) {
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
        if limiter.allow(Instant::now(), report) {
            let mut text = String::from_utf8_lossy(&line.bytes).into_owned();
            if line.dropped > 0 {
                text.push_str(&format!("… ({} more bytes)", line.dropped));
            }
            info!(process = index, pid, line = %text, "handler stderr");
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

#[cfg(test)]
mod tests;
