//! `-- COMMAND ARGS...`: run a program per message.
//!
//! The program is started directly (no shell), in a process group of its
//! own, with default signal dispositions and an empty signal mask, and dies
//! with dlqctl (`src/handler/process/spawn.rs` says how, at the cost of a
//! `posix_spawn`). The body is written to its stdin, which is then closed;
//! a program that does not read stdin is fine. Its environment is ours plus
//! `DLQCTL_QUEUE`, `DLQCTL_MESSAGE_ID` (empty when the message has none),
//! `DLQCTL_ATTEMPT`, `DLQCTL_MAX_ATTEMPTS`, `DLQCTL_EXCHANGE`,
//! `DLQCTL_ROUTING_KEY` (the original exchange and routing key) and
//! `DLQCTL_HEADERS` (the AMQP headers as a JSON object).
//!
//! RabbitMQ passes the message id, exchange and routing key through as
//! bytes, which need not be UTF-8. When they are not, the variable is empty
//! and `DLQCTL_MESSAGE_ID_BASE64`, `DLQCTL_EXCHANGE_BASE64` or
//! `DLQCTL_ROUTING_KEY_BASE64` holds the standard base64 (RFC 4648, with
//! padding) of the bytes; otherwise those are unset. In `DLQCTL_HEADERS`, a
//! string value that is not UTF-8 is `{"base64": "…"}` and a key that is not
//! UTF-8 is `"base64:…"` (see [`crate::core::retry::headers_to_json`]).
//!
//! - exit 0: [`Outcome::Success`];
//! - exit 65 (`EX_DATAERR`): [`Outcome::Permanent`];
//! - the timeout: [`Outcome::TimedOut`] (the program is killed with its
//!   process group, so nothing of its run can follow: the handler is
//!   [cancel-safe](Handler::cancel_safe));
//! - any other exit, death by a signal, or a failure to start the
//!   program: [`Outcome::Transient`].
//!
//! The error text is the last 960 bytes of stderr, trimmed and decoded as lossy
//! UTF-8 (prefixed with `…` when cut). When stderr is empty it is a
//! description: `exited with status 3`. A signal or the timeout is always
//! described, with the stderr tail after it (`timed out after 30s: <tail>`),
//! since the program did not get to say why it stopped.
//!
//! Stdout is connected to `/dev/null`: it would interleave with the
//! worker's own logs, and it is reserved for the planned JSON-lines handler
//! protocol. Write diagnostics to stderr.
//!
//! On timeout the whole process group gets `SIGKILL` (the program and any
//! children that stayed in its group) and the program is reaped. If the
//! future is dropped before the program ended (worker shutdown), the group
//! is killed the same way. A program that exits normally is not chased: a
//! background child it left behind keeps running, and the worker stops
//! reading stderr shortly after the program exits even if that child still
//! holds it open.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::process::spawn::{spawn, EnvChange, Spawned};
pub use super::process::{check_program, resolve_program, ProgramError};
use super::process::{
    format_timeout, io_error_text, read_some, signal_name, with_tail, TailBuffer,
};
use super::{Handler, HandlerMessage};
use crate::core::handling::outcome::Outcome;
use crate::core::wire::HEADERS_FILE_PREFIX;

/// The exit code that means "permanent failure" (`EX_DATAERR` in sysexits.h).
pub(crate) const EXIT_PERMANENT: i32 = 65;

/// Header JSON longer than this goes to `DLQCTL_HEADERS_FILE` instead of
/// `DLQCTL_HEADERS` (Linux's limit for one variable is 128 KiB).
pub(crate) const HEADERS_ENV_MAX_BYTES: usize = 64 * 1024;

/// A message's header JSON in a file of its own (mode 0600), removed when
/// the run ends.
struct HeadersFile {
    path: std::path::PathBuf,
}

impl HeadersFile {
    fn write(json: &str) -> std::io::Result<Self> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "{HEADERS_FILE_PREFIX}{}-{n}.json",
            std::process::id()
        ));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        let file = HeadersFile { path };
        f.write_all(json.as_bytes())?;
        Ok(file)
    }
}

impl Drop for HeadersFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// How much of the end of stderr is kept as the error text: small enough
/// that, with a `timed out after …: ` prefix, the whole text fits the 1 KiB
/// `dlqctl-last-error` header, so the program's last words are kept.
pub(crate) const STDERR_TAIL_BYTES: usize = 960;

/// How long stderr is still read after the program ended, for output that a
/// left-behind child keeps open.
const STDERR_GRACE: Duration = Duration::from_millis(500);

/// Runs a program per message; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct ExecHandler {
    program: OsString,
    args: Vec<OsString>,
    timeout: Duration,
}

impl ExecHandler {
    /// A handler that runs `program` with `args` and kills it after `timeout`.
    ///
    /// `program` is resolved like `execvp` does: through `PATH` when it has
    /// no slash. Nothing is checked here; see [`check_program`].
    pub fn new(program: impl Into<OsString>, args: Vec<OsString>, timeout: Duration) -> Self {
        ExecHandler {
            program: program.into(),
            args,
            timeout,
        }
    }

    /// The program, as given.
    pub fn program(&self) -> &OsStr {
        &self.program
    }

    /// The arguments, as given.
    pub fn args(&self) -> &[OsString] {
        &self.args
    }

    /// The time a run may take before it is killed.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The variables a run sets (a value) or removes (`None`) on top of
    /// ours, and the headers file when the headers are too long for one.
    fn environment(
        &self,
        msg: &HandlerMessage,
    ) -> std::io::Result<(Vec<EnvChange>, Option<HeadersFile>)> {
        let mut env: Vec<EnvChange> = Vec::with_capacity(11);
        // Linux refuses one `NAME=value` over 128 KiB (E2BIG at exec), and
        // header JSON can be many times its AMQP size: past
        // HEADERS_ENV_MAX_BYTES the headers go in a file instead.
        let headers = msg.headers.to_string();
        let file = if headers.len() > HEADERS_ENV_MAX_BYTES {
            let f = HeadersFile::write(&headers)?;
            env.push(("DLQCTL_HEADERS_FILE", Some(f.path.clone().into())));
            env.push(("DLQCTL_HEADERS", None));
            Some(f)
        } else {
            env.push(("DLQCTL_HEADERS", Some(headers.into())));
            env.push(("DLQCTL_HEADERS_FILE", None));
            None
        };
        // A value that is not UTF-8 is given as base64 (and its plain
        // variable is empty): one documented form, see the module docs.
        let b64 = [
            ("DLQCTL_MESSAGE_ID_BASE64", &msg.not_utf8.message_id),
            ("DLQCTL_EXCHANGE_BASE64", &msg.not_utf8.exchange),
            ("DLQCTL_ROUTING_KEY_BASE64", &msg.not_utf8.routing_key),
        ];
        for (name, bytes) in b64 {
            let value = bytes
                .as_ref()
                .map(|b| crate::core::values::shortstr::base64(b).into());
            env.push((name, value));
        }
        env.extend([
            ("DLQCTL_QUEUE", Some(msg.queue.clone().into())),
            (
                "DLQCTL_MESSAGE_ID",
                Some(msg.message_id.clone().unwrap_or_default().into()),
            ),
            ("DLQCTL_ATTEMPT", Some(msg.attempt.to_string().into())),
            (
                "DLQCTL_MAX_ATTEMPTS",
                Some(msg.max_attempts.to_string().into()),
            ),
            ("DLQCTL_EXCHANGE", Some(msg.exchange.clone().into())),
            ("DLQCTL_ROUTING_KEY", Some(msg.routing_key.clone().into())),
        ]);
        Ok((env, file))
    }

    async fn run(&self, msg: &HandlerMessage) -> Outcome {
        let (mut child, _headers_file) = match self.start(msg).await {
            Ok(started) => started,
            Err(outcome) => return outcome,
        };
        let mut stderr = child.stderr.take();
        let mut tail = TailBuffer::new(STDERR_TAIL_BYTES);
        let status = self
            .feed_and_wait(&mut child, msg, &mut stderr, &mut tail)
            .await;
        let (status, timed_out) = match status {
            Some(status) => (status, false),
            None => {
                child.kill_group();
                (child.wait().await, true)
            }
        };
        drain_stderr(&mut stderr, &mut tail).await;

        let tail = tail.text();
        let status = match status {
            Ok(status) => status,
            Err(e) => {
                return Outcome::transient(with_tail(
                    format!("cannot wait for handler: {}", io_error_text(&e)),
                    &tail,
                ))
            }
        };
        if timed_out {
            return Outcome::timed_out(with_tail(
                format!("timed out after {}", format_timeout(self.timeout)),
                &tail,
            ));
        }
        if status.success() && !tail.is_empty() {
            // The handler's own words, beside the worker's one line per
            // message: at debug (a failure's stderr is its error text).
            tracing::debug!(
                queue = %msg.queue,
                message_id = msg.message_id.as_deref(),
                output = %tail,
                "handler stderr"
            );
        }
        outcome_of(status, tail)
    }

    /// Starts the program for `msg`. A program that cannot start for a
    /// reason of the machine (deleted, not executable, no file descriptors
    /// left, ...) is not the message's fault: the message is held, unacked
    /// and with its attempts untouched, and the start is tried again with
    /// backoff. Every handler slot soon waits the same way, so consumption
    /// pauses (the prefetch follows the concurrency) until the program can
    /// start; nothing is retried or dead-lettered for it. `Err`: the
    /// message's outcome without a run.
    async fn start(&self, msg: &HandlerMessage) -> Result<(Spawned, Option<HeadersFile>), Outcome> {
        let mut backoff = crate::core::retry::backoff::Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(30),
        );
        let mut paused = false;
        loop {
            let (env, headers_file) = self.environment(msg).map_err(|e| {
                Outcome::transient(format!(
                    "cannot write the headers file for handler `{}`: {}",
                    self.program.to_string_lossy(),
                    io_error_text(&e)
                ))
            })?;
            match spawn(&self.program, &self.args, &env) {
                Ok(child) => {
                    if paused {
                        tracing::info!(program = %self.program.to_string_lossy(), "the handler starts again: resuming");
                    }
                    return Ok((child, headers_file));
                }
                // The message itself cannot be handed to a program (a NUL
                // byte in its id, exchange or routing key, or an environment
                // still too large): no retry will change that.
                Err(e)
                    if e.kind() == std::io::ErrorKind::InvalidInput
                        || e.raw_os_error() == Some(libc::E2BIG) =>
                {
                    return Err(Outcome::permanent(format!(
                        "cannot pass this message to handler `{}`: {}",
                        self.program.to_string_lossy(),
                        io_error_text(&e)
                    )))
                }
                Err(e) => {
                    if !paused {
                        tracing::warn!(
                            program = %self.program.to_string_lossy(),
                            error = %io_error_text(&e),
                            "cannot start the handler: holding its message (no attempt counted) and \
                             trying again with backoff; consumption pauses until it starts"
                        );
                        paused = true;
                    }
                    tokio::time::sleep(backoff.next_wait()).await;
                }
            }
        }
    }

    /// Feeds the body to stdin, keeps the tail of stderr and waits for the
    /// exit, until the handler timeout (`None`: it ran out).
    async fn feed_and_wait(
        &self,
        child: &mut Spawned,
        msg: &HandlerMessage,
        stderr: &mut Option<tokio::net::unix::pipe::Receiver>,
        tail: &mut TailBuffer,
    ) -> Option<std::io::Result<std::process::ExitStatus>> {
        let deadline = Instant::now() + self.timeout;
        let mut stdin = child.stdin.take();
        let wait = child.wait();
        tokio::pin!(wait);
        let write = async {
            if let Some(mut pipe) = stdin.take() {
                // EPIPE (the program exited or closed stdin without
                // reading it all) is not an error; others are logged.
                match pipe.write_all(&msg.body).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                    Err(e) => tracing::debug!(error = %e, "writing the handler's stdin"),
                }
                // Dropping the pipe closes it: the program sees EOF.
            }
        };
        tokio::pin!(write);
        let mut writing = true;
        let mut buf = vec![0u8; 8192];
        loop {
            tokio::select! {
                status = &mut wait => break Some(status),
                () = &mut write, if writing => writing = false,
                n = read_some(stderr, &mut buf) => match n {
                    Some(n) => tail.push(&buf[..n]),
                    None => *stderr = None,
                },
                () = tokio::time::sleep_until(deadline) => break None,
            }
        }
    }
}

/// Reads what is left in the stderr pipe, unless a left-behind child holds
/// it open past the grace period.
async fn drain_stderr(
    stderr: &mut Option<tokio::net::unix::pipe::Receiver>,
    tail: &mut TailBuffer,
) {
    let grace = Instant::now() + STDERR_GRACE;
    let mut buf = vec![0u8; 8192];
    while stderr.is_some() {
        tokio::select! {
            n = read_some(stderr, &mut buf) => match n {
                Some(n) => tail.push(&buf[..n]),
                None => *stderr = None,
            },
            () = tokio::time::sleep_until(grace) => break,
        }
    }
}

impl Handler for ExecHandler {
    fn handle(&self, msg: &HandlerMessage) -> impl std::future::Future<Output = Outcome> + Send {
        self.run(msg)
    }

    /// A timed-out or dropped run kills the program's process group.
    fn cancel_safe(&self) -> bool {
        true
    }
}

/// The outcome of a program that ended by itself.
fn outcome_of(status: ExitStatus, tail: String) -> Outcome {
    match (status.code(), status.signal()) {
        (Some(0), _) => Outcome::Success,
        (Some(EXIT_PERMANENT), _) => Outcome::permanent(or_describe(
            tail,
            format!("exited with status {EXIT_PERMANENT}"),
        )),
        (Some(code), _) => {
            Outcome::transient(or_describe(tail, format!("exited with status {code}")))
        }
        (None, Some(signal)) => Outcome::transient(with_tail(
            format!("killed by signal {signal}{}", signal_name(signal)),
            &tail,
        )),
        (None, None) => Outcome::transient(or_describe(tail, format!("ended with {status}"))),
    }
}

fn or_describe(tail: String, description: String) -> String {
    if tail.is_empty() {
        description
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::wire::TEMP_PREFIX;
    use crate::handler::process::watch::{eventually, listed};
    use std::path::{Path, PathBuf};
    use std::time::Instant as StdInstant;

    fn sh(script: &str, timeout: Duration) -> ExecHandler {
        ExecHandler::new("/bin/sh", vec!["-c".into(), script.into()], timeout)
    }

    fn msg(body: &[u8]) -> HandlerMessage {
        HandlerMessage::example(body)
    }

    fn temp_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("{TEMP_PREFIX}exec-{tag}-{}", uuid::Uuid::new_v4()))
    }

    /// Whether `pid` is still a live process (a zombie waiting for a
    /// reaper that may not exist in a container counts as gone).
    fn alive(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => {
                let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
                !matches!(state, Some('Z') | Some('X'))
            }
            Err(_) => false,
        }
    }

    async fn wait_gone(pid: i32) -> bool {
        eventually(100, || !alive(pid)).await
    }

    async fn read_pid(path: &Path) -> i32 {
        for _ in 0..100 {
            if let Ok(text) = std::fs::read_to_string(path) {
                if let Ok(pid) = text.trim().parse() {
                    return pid;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no pid in {}", path.display());
    }

    const T: Duration = Duration::from_secs(20);

    /// Runs `sh -c script` on a message of `body`: its outcome.
    async fn run(script: &str, body: &[u8]) -> Outcome {
        sh(script, T).handle(&msg(body)).await
    }

    /// Exit 0 is a success, 65 permanent, any other status transient; the
    /// error is stderr's tail, or the status when stderr is empty.
    #[tokio::test]
    async fn the_exit_status_gives_the_outcome_with_stderr() {
        for (script, want) in [
            ("exit 0", Outcome::Success),
            (
                "echo 'bad order: no sku' >&2; exit 65",
                Outcome::permanent("bad order: no sku"),
            ),
            ("exit 65", Outcome::permanent("exited with status 65")),
            (
                "echo first >&2; printf '  db down\\n\\n' >&2; exit 3",
                Outcome::transient("first\n  db down"),
            ),
            ("exit 3", Outcome::transient("exited with status 3")),
        ] {
            assert_eq!(run(script, b"x").await, want, "{script}");
        }
    }

    #[tokio::test]
    async fn environment_carries_the_message() {
        let file = temp_path("env");
        let script = format!(
            "for v in QUEUE MESSAGE_ID ATTEMPT MAX_ATTEMPTS EXCHANGE ROUTING_KEY HEADERS; do \
               eval \"printf '%s=%s\\n' $v \\\"\\${{DLQCTL_$v-UNSET}}\\\"\"; \
             done > '{}'",
            file.display()
        );
        let h = sh(&script, T);
        assert_eq!(h.handle(&msg(b"x")).await, Outcome::Success);
        let got = std::fs::read_to_string(&file).unwrap();
        assert_eq!(
            got,
            "QUEUE=orders\nMESSAGE_ID=m-1\nATTEMPT=2\nMAX_ATTEMPTS=5\nEXCHANGE=shop\n\
             ROUTING_KEY=order.created\nHEADERS={\"n\":3,\"tenant\":\"acme\"}\n"
        );

        let mut m = msg(b"x");
        m.message_id = None;
        m.headers = serde_json::json!({});
        assert_eq!(h.handle(&m).await, Outcome::Success);
        let got = std::fs::read_to_string(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        assert!(got.contains("\nMESSAGE_ID=\n"), "{got}");
        assert!(got.ends_with("\nHEADERS={}\n"), "{got}");
    }

    #[tokio::test]
    async fn values_that_are_not_utf8_arrive_as_base64() {
        let file = temp_path("b64");
        let script = format!(
            "for v in MESSAGE_ID MESSAGE_ID_BASE64 EXCHANGE EXCHANGE_BASE64 ROUTING_KEY ROUTING_KEY_BASE64; do \
               eval \"printf '%s=%s\\n' $v \\\"\\${{DLQCTL_$v-UNSET}}\\\"\"; \
             done > '{}'",
            file.display()
        );
        let h = sh(&script, T);
        let mut m = msg(b"x");
        m.message_id = None;
        m.not_utf8.message_id = Some(b"\xff\xfe-bad".to_vec());
        m.routing_key = String::new();
        m.not_utf8.routing_key = Some(vec![0xc3]);
        assert_eq!(h.handle(&m).await, Outcome::Success);
        let got = std::fs::read_to_string(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(
            got,
            "MESSAGE_ID=\nMESSAGE_ID_BASE64=//4tYmFk\nEXCHANGE=shop\nEXCHANGE_BASE64=UNSET\n\
             ROUTING_KEY=\nROUTING_KEY_BASE64=ww==\n"
        );
    }

    #[tokio::test]
    async fn body_arrives_on_stdin_byte_exact() {
        let file = temp_path("body");
        let mut body: Vec<u8> = (0..=255u8).collect();
        body.extend_from_slice(b"\0\0\r\n\xff tail");
        body.extend(std::iter::repeat_n(0xA5u8, 300_000));
        let h = sh(&format!("cat > '{}'", file.display()), T);
        assert_eq!(h.handle(&msg(&body)).await, Outcome::Success);
        let got = std::fs::read(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        assert!(
            got == body,
            "body differs: {} vs {} bytes",
            got.len(),
            body.len()
        );
    }

    #[tokio::test]
    async fn child_that_ignores_stdin_is_fine() {
        let body = vec![b'z'; 1 << 20];
        // Exits at once without reading.
        assert_eq!(run("exit 0", &body).await, Outcome::Success);
        // Lives a while without reading, so our write is blocked, then exits.
        assert_eq!(run("sleep 0.3; exit 0", &body).await, Outcome::Success);
        // Closes stdin at once, then works on.
        assert_eq!(
            run("exec 0<&-; sleep 0.2; echo done >&2; exit 3", &body).await,
            Outcome::transient("done")
        );
    }

    #[tokio::test]
    async fn huge_stderr_keeps_only_the_tail() {
        let h = sh(
            "head -c 20000000 /dev/zero | tr '\\0' a >&2; printf 'LAST \\303\\251' >&2; exit 3",
            T,
        );
        let Outcome::Transient { error, .. } = h.handle(&msg(b"")).await else {
            panic!("not transient");
        };
        assert!(
            error.len() <= STDERR_TAIL_BYTES + 3,
            "{} bytes",
            error.len()
        );
        assert!(error.starts_with("…aaa"), "{}", &error[..20]);
        assert!(
            error.ends_with("aaaLAST é"),
            "{}",
            &error[error.len() - 20..]
        );
    }

    /// Runs `program`, which cannot start yet: the run must still wait
    /// 700 ms later (else `waiting`), then end once `fix` made the program
    /// startable (else `resumes`). The outcome of the resumed run.
    async fn held_until_fixed(
        program: &Path,
        waiting: &str,
        fix: impl FnOnce(),
        resumes: &str,
    ) -> Outcome {
        let h = ExecHandler::new(program.to_path_buf(), vec![], T);
        let run = tokio::spawn(async move { h.handle(&msg(b"x")).await });
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(!run.is_finished(), "{waiting}");
        fix();
        tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect(resumes)
            .unwrap()
    }

    #[tokio::test]
    async fn a_missing_program_holds_the_message_until_it_can_start() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("{TEMP_PREFIX}exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let program = dir.join("handler.sh");
        let _ = std::fs::remove_file(&program);
        let out = held_until_fixed(
            &program,
            "the run ended while the program was missing",
            || {
                std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
                std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
            },
            "the run resumes once the program exists",
        )
        .await;
        assert_eq!(out, Outcome::Success);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn signal_is_transient() {
        let out = run("echo dying >&2; kill -9 $$", b"").await;
        assert_eq!(
            out,
            Outcome::transient("killed by signal 9 (SIGKILL): dying")
        );
        let out = run("kill -TERM $$", b"").await;
        assert_eq!(out, Outcome::transient("killed by signal 15 (SIGTERM)"));
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let file = temp_path("pid");
        let h = sh(
            &format!(
                "sleep 100 & echo $! > '{}'; echo waiting >&2; wait",
                file.display()
            ),
            Duration::from_millis(1500),
        );
        let started = StdInstant::now();
        let out = h.handle(&msg(b"")).await;
        assert!(started.elapsed() < Duration::from_secs(6));
        // The shell normally wrote its line long before the timeout; on a
        // very loaded machine it may not have.
        assert!(
            out == Outcome::timed_out("timed out after 1500ms: waiting")
                || out == Outcome::timed_out("timed out after 1500ms"),
            "{out:?}"
        );
        let pid = read_pid(&file).await;
        std::fs::remove_file(&file).unwrap();
        assert!(
            wait_gone(pid).await,
            "grandchild {pid} survived the timeout"
        );
    }

    #[tokio::test]
    async fn dropping_the_future_kills_the_group() {
        let file = temp_path("drop");
        let h = sh(
            &format!("sleep 100 & echo $! > '{}'; wait", file.display()),
            Duration::from_secs(60),
        );
        let m = msg(b"");
        let cancelled = tokio::time::timeout(Duration::from_millis(1500), h.handle(&m)).await;
        assert!(cancelled.is_err());
        let pid = read_pid(&file).await;
        std::fs::remove_file(&file).unwrap();
        assert!(wait_gone(pid).await, "grandchild {pid} survived the drop");
    }

    async fn wait_unlisted(pid: i32) -> bool {
        eventually(100, || !listed(pid)).await
    }

    /// A run cut short, by its timeout or by dropping its future, leaves no
    /// zombie: the program itself is reaped, not only killed.
    #[tokio::test]
    async fn a_timed_out_or_cancelled_run_leaves_no_zombie() {
        let file = temp_path("zombie");
        let script = format!("echo $$ > '{}'; exec sleep 100", file.display());
        let out = sh(&script, Duration::from_millis(700))
            .handle(&msg(b""))
            .await;
        assert!(matches!(out, Outcome::TimedOut { .. }), "{out:?}");
        let pid = read_pid(&file).await;
        std::fs::remove_file(&file).unwrap();
        assert!(wait_unlisted(pid).await, "timed-out {pid} left in /proc");

        let h = sh(&script, Duration::from_secs(60));
        let m = msg(b"");
        let mut run = Box::pin(h.handle(&m));
        let pid = tokio::select! {
            _ = &mut run => panic!("the run ended"),
            pid = read_pid(&file) => pid,
        };
        assert!(alive(pid));
        drop(run);
        std::fs::remove_file(&file).unwrap();
        assert!(wait_unlisted(pid).await, "cancelled {pid} left in /proc");
    }

    /// A program that is there but not executable is the machine's fault:
    /// held like a missing one until it can start.
    #[tokio::test]
    async fn a_program_that_is_not_executable_holds_the_message() {
        use std::os::unix::fs::PermissionsExt;
        let program = temp_path("noexec");
        std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = held_until_fixed(
            &program,
            "the run ended while not executable",
            || {
                std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
            },
            "the run resumes once the program is executable",
        )
        .await;
        assert_eq!(out, Outcome::Success);
        std::fs::remove_file(&program).unwrap();
    }

    /// An environment the kernel refuses (E2BIG) is the message's fault.
    #[tokio::test]
    async fn a_message_too_large_for_the_environment_is_permanent() {
        let h = ExecHandler::new("/bin/true", vec![], Duration::from_secs(5));
        let msg = HandlerMessage {
            routing_key: "k".repeat(200 * 1024),
            ..HandlerMessage::default()
        };
        match h.handle(&msg).await {
            Outcome::Permanent { error } => {
                assert!(error.contains("cannot pass this message"), "{error}")
            }
            other => panic!("expected permanent, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn left_behind_child_holding_stderr_does_not_block() {
        let h = sh("sleep 5 >&2 & echo ok >&2; exit 0", T);
        let started = StdInstant::now();
        assert_eq!(h.handle(&msg(b"")).await, Outcome::Success);
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn a_nul_byte_in_the_message_id_is_permanent_not_retried() {
        let h = ExecHandler::new("/bin/true", vec![], Duration::from_secs(5));
        let msg = HandlerMessage {
            message_id: Some("a\0b".into()),
            ..HandlerMessage::default()
        };
        match h.handle(&msg).await {
            Outcome::Permanent { error } => {
                assert!(error.contains("cannot pass this message"), "{error}")
            }
            other => panic!("expected permanent, got {other:?}"),
        }
    }
}
