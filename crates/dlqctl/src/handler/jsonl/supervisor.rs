//! The life of one handler process: start it and wait for its ready line,
//! serve messages until it ends (or is restarted, or the pool stops), settle
//! the messages it had, and start it again with backoff.

use std::ffi::OsString;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::pipes::{log_stderr, read_answers, write_lines};
use super::pool::{Entry, Live, Pending, Pool, Reply};
use crate::core::handling::jsonl::{self, Line, LineSplitter, MAX_ANSWER_BYTES};
use crate::core::handling::outcome::Outcome;
use crate::core::retry::backoff::Backoff;
use crate::core::wire::JSONL_PROTOCOL;
use crate::handler::process::spawn::{spawn_piped, Spawned};
use crate::handler::process::{describe_exit, format_timeout, io_error_text, TailBuffer};

/// How much of the end of stderr goes into the error text of a crash.
const STDERR_TAIL_BYTES: usize = 960;

/// After a process ended, how long its stdout is still read for answers it
/// wrote before it ended (a child it left behind may hold the pipe open).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);

/// After a restart was asked for, how long the process may take to end by
/// itself (it may be crashing already) before it is killed.
const RESTART_GRACE: Duration = Duration::from_millis(200);

/// A process that stayed up this long starts its backoff over.
const STABLE_AFTER: Duration = Duration::from_secs(30);

/// Keeps process `index` running until the pool stops.
pub(super) async fn supervise(pool: Arc<Pool>, index: usize) {
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
    child: Spawned,
    live: Arc<Live>,
    writer: JoinHandle<()>,
    reader: JoinHandle<()>,
    stderr: JoinHandle<()>,
    tail: Arc<Mutex<TailBuffer>>,
}

/// Starts process `index` and waits for its ready line.
async fn start(pool: &Arc<Pool>, index: usize) -> Result<Running, String> {
    let cfg = &pool.cfg;
    let env = [
        ("DLQCTL_QUEUE", Some(OsString::from(&cfg.queue))),
        ("DLQCTL_PROCESS", Some(index.to_string().into())),
        (
            "DLQCTL_PROTOCOL",
            Some(format!("{JSONL_PROTOCOL}/{}", jsonl::VERSION).into()),
        ),
    ];
    // Its own process group, death with dlqctl (PR_SET_PDEATHSIG), the
    // group killed and the process reaped if `child` is dropped: started
    // like the per-message handler, without forking the worker.
    let mut child = spawn_piped(&cfg.program, &cfg.args, &env).map_err(|e| io_error_text(&e))?;
    let pid = u32::try_from(child.pid()).unwrap_or(0);
    let (Some(mut stdin), Some(mut stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("the process's pipes are missing".into());
    };
    let tail = Arc::new(Mutex::new(TailBuffer::new(STDERR_TAIL_BYTES)));
    let stderr_task = tokio::spawn(log_stderr(stderr, index, pid, tail.clone()));

    let deadline = Instant::now() + cfg.start_timeout;
    let mut splitter = LineSplitter::new(MAX_ANSWER_BYTES);
    let outcome = tokio::select! {
        r = handshake(cfg, index, &mut stdin, &mut stdout, &mut splitter) => r,
        () = pool.stopping.cancelled() => Err("dlqctl is stopping".to_string()),
        () = tokio::time::sleep_until(deadline) => Err(format!(
            "no ready line within {} (--handler-start-timeout)",
            format_timeout(cfg.start_timeout)
        )),
    };
    let leftover = match outcome {
        Ok(leftover) => leftover,
        Err(why) => return Err(failed_start(&mut child, stdin, stderr_task, &tail, why).await),
    };
    let (live, writer, reader) = go_live(pool, index, pid, (stdin, stdout), splitter, leftover);
    Ok(Running {
        child,
        live,
        writer,
        reader,
        stderr: stderr_task,
        tail,
    })
}

/// Writes the hello line and reads up to the ready line; hands back the
/// lines read after it.
async fn handshake(
    cfg: &super::config::JsonlConfig,
    index: usize,
    stdin: &mut pipe::Sender,
    stdout: &mut pipe::Receiver,
    splitter: &mut LineSplitter,
) -> Result<Vec<Line>, String> {
    let hello = jsonl::hello_line(&cfg.queue, index, cfg.processes, cfg.max_in_flight);
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
            jsonl::parse_ready(&first.bytes).map_err(|e| e.0)?;
            return Ok(lines);
        }
        match stdout.read(&mut buf).await {
            Ok(0) => return Err("it closed its stdout before the ready line".to_string()),
            Ok(n) => splitter.push(&buf[..n], &mut lines),
            Err(e) => return Err(format!("cannot read its stdout: {}", io_error_text(&e))),
        }
    }
}

/// A process that did not become ready: says how it exited if it did, and
/// what it wrote last on its stderr; kills and reaps it.
async fn failed_start(
    child: &mut Spawned,
    stdin: pipe::Sender,
    stderr_task: JoinHandle<()>,
    tail: &Arc<Mutex<TailBuffer>>,
    why: String,
) -> String {
    // It may be exiting: give it a moment to say how.
    let status = match tokio::time::timeout(RESTART_GRACE, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => None,
    };
    drop(stdin);
    let why = match status {
        Some(status) => format!("{why}; it {}", describe_exit(status)),
        None => why,
    };
    child.kill_group();
    let _ = child.wait().await;
    let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, stderr_task).await;
    let tail = tail.lock().map(|t| t.text()).unwrap_or_default();
    if tail.is_empty() {
        why
    } else {
        format!("{why}: {tail}")
    }
}

/// Hands a ready process its pipe tasks and its slot in the pool.
fn go_live(
    pool: &Arc<Pool>,
    index: usize,
    pid: u32,
    (stdin, stdout): (pipe::Sender, pipe::Receiver),
    splitter: LineSplitter,
    leftover: Vec<Line>,
) -> (Arc<Live>, JoinHandle<()>, JoinHandle<()>) {
    let cfg = &pool.cfg;
    let (tx, rx) = mpsc::channel(cfg.max_in_flight);
    let live = Arc::new(Live {
        index,
        pid,
        lines: tx,
        pending: Mutex::new(Pending::default()),
        max_in_flight: pool.cfg.max_in_flight,
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
    (live, writer, reader)
}

impl Running {
    /// Runs until the process ends, a restart is asked for, or the pool
    /// stops; then settles every message it had. Returns how it ended.
    async fn serve(mut self, pool: &Pool) -> String {
        let live = self.live.clone();
        let cfg = &pool.cfg;
        let status = tokio::select! {
            s = self.child.wait() => s.map(describe_exit).map_err(|e| io_error_text(&e)),
            () = live.restart.cancelled() => {
                // It may be dying already (a broken pipe asks for a
                // restart): let the real exit speak first.
                match tokio::time::timeout(RESTART_GRACE, self.child.wait()).await {
                    Ok(s) => s.map(describe_exit).map_err(|e| io_error_text(&e)),
                    Err(_) => {
                        self.child.kill_group();
                        let _ = self.child.wait().await;
                        let why = live.why.lock().ok().and_then(|w| w.clone()).unwrap_or_default();
                        Ok(format!("was killed: {why}"))
                    }
                }
            }
            () = pool.stopping.cancelled() => {
                live.close_stdin.cancel();
                match tokio::time::timeout(cfg.exit_wait, self.child.wait()).await {
                    Ok(s) => s.map(describe_exit).map_err(|e| io_error_text(&e)),
                    Err(_) => {
                        self.child.kill_group();
                        let _ = self.child.wait().await;
                        Ok(format!("was killed: it did not exit within {} of EOF on its stdin", format_timeout(cfg.exit_wait)))
                    }
                }
            }
        };
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
        // Entries without a reply had timed out: already failed; their
        // late answer is now known never to come (the group is killed).
        for e in entries.iter().filter(|e| e.reply.is_none()) {
            e.late.answer(None);
        }
        for (sent, reply) in entries.into_iter().filter_map(|e| Some((e.sent, e.reply?))) {
            if sent {
                failed += 1;
                let _ = reply.send(Reply::Done(Outcome::transient(error.clone())));
            } else {
                resent += 1;
                let _ = reply.send(Reply::NotSent);
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
