//! Handler scripts for `dlqctl work -- SCRIPT`, each in a directory of its
//! own where it logs what it was run with: one generator, two logs.
//!
//! - [`Script`] logs one line per call (the `DLQCTL_*` values) and keeps
//!   each call's body and headers: for tests that read what a handler got.
//! - [`ChaosScript`] logs one line per event the test's sh code names
//!   (`log start`), each a single `printf >>`, so concurrent runs never mix
//!   their lines: for tests that kill and restart workers.
//!
//! Both scripts start with `d='DIR'` (their directory), and the test's sh
//! code runs last.

use crate::support::Scratch;
use serde_json::Value;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Writes `DIR/handler.sh` (executable) in a new subdirectory `name` of
/// `scratch`: `#!/bin/sh`, `d='DIR'`, `prelude`, then `code`. Returns
/// (DIR, the script).
fn write_script(scratch: &Scratch, name: &str, prelude: &str, code: &str) -> (PathBuf, PathBuf) {
    let dir = scratch.path().join(name);
    std::fs::create_dir_all(&dir).expect("a handler directory");
    let text = format!(
        "#!/bin/sh\nd='{dir}'\n{prelude}\n{code}\n",
        dir = dir.display()
    );
    let path = dir.join("handler.sh");
    Scratch::write_executable(&path, &text);
    (dir, path)
}

/// Polls `read` every 25 ms until it gives at least `n` entries; panics
/// after `deadline` with `all()` (everything logged) in the message.
async fn wait_logged<T, A: Debug>(
    what: &str,
    n: usize,
    deadline: Duration,
    read: impl Fn() -> Vec<T>,
    all: impl Fn() -> A,
) -> Vec<T> {
    let start = Instant::now();
    loop {
        let got = read();
        if got.len() >= n {
            return got;
        }
        if start.elapsed() > deadline {
            panic!(
                "wanted {n} {what} within {deadline:?}, got {}: {:#?}",
                got.len(),
                all()
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The lines of `DIR/calls.log` (none before the first is written).
fn log_lines(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------- one line per call

/// A handler script that appends one line per call to `calls.log` (start
/// time in ns, then the `DLQCTL_*` values), saves the body to `body.N` and
/// `DLQCTL_HEADERS` to `headers.N` (N = the call's number from 1), then
/// runs `behaviour` (sh code; the body is in `$body_file`, the call number
/// in `$n`).
pub struct Script {
    /// The directory holding the script and what it writes.
    pub dir: PathBuf,
    /// The script.
    pub path: PathBuf,
}

/// One logged call of a [`Script`].
#[derive(Debug, Clone)]
pub struct Call {
    /// Start, ns since the Unix epoch.
    pub t_ns: u128,
    pub attempt: u32,
    pub max_attempts: u32,
    pub exchange: String,
    pub routing_key: String,
    pub message_id: String,
    pub queue: String,
}

/// What a [`Script`] does before the test's `behaviour`.
const CALL_PRELUDE: &str = r#"t=$(date +%s%N)
n=$(( $(cat "$d/count" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$d/count"
body_file="$d/body.$n"
cat > "$body_file"
printf '%s' "$DLQCTL_HEADERS" > "$d/headers.$n"
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$DLQCTL_ATTEMPT" "$DLQCTL_MAX_ATTEMPTS" "$DLQCTL_EXCHANGE" "$DLQCTL_ROUTING_KEY" "$DLQCTL_MESSAGE_ID" "$DLQCTL_QUEUE" >> "$d/calls.log""#;

impl Script {
    /// Writes the script into `scratch` (its own subdirectory `name`).
    pub fn new(scratch: &Scratch, name: &str, behaviour: &str) -> Script {
        let (dir, path) = write_script(scratch, name, CALL_PRELUDE, behaviour);
        Script { dir, path }
    }

    /// The calls so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        log_lines(&self.dir)
            .iter()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), 7, "a malformed handler log line: {l:?}");
                Call {
                    t_ns: f[0].parse().expect("a time in ns"),
                    attempt: f[1].parse().expect("DLQCTL_ATTEMPT"),
                    max_attempts: f[2].parse().expect("DLQCTL_MAX_ATTEMPTS"),
                    exchange: f[3].into(),
                    routing_key: f[4].into(),
                    message_id: f[5].into(),
                    queue: f[6].into(),
                }
            })
            .collect()
    }

    /// The body call `n` (from 1) read on stdin.
    pub fn body(&self, n: usize) -> Vec<u8> {
        std::fs::read(self.dir.join(format!("body.{n}"))).expect("a saved body")
    }

    /// `DLQCTL_HEADERS` of call `n` (from 1).
    pub fn headers(&self, n: usize) -> Value {
        let text =
            std::fs::read_to_string(self.dir.join(format!("headers.{n}"))).expect("saved headers");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("DLQCTL_HEADERS {text:?}: {e}"))
    }

    /// Waits until at least `n` calls are logged; returns them.
    pub async fn wait_calls(&self, n: usize, deadline: Duration) -> Vec<Call> {
        let calls = || self.calls();
        wait_logged("handler call(s)", n, deadline, calls, calls).await
    }
}

// ---------------------------------------------------------------- one line per event

/// A handler script whose events are lines appended to `calls.log`:
/// `ID ATTEMPT PPID PID EVENT`. Each line is one `printf >>` (O_APPEND),
/// so concurrent runs do not mix them up. The script body calls
/// `log EVENT`; `$id`, `$a` (the attempt) and `$d` (its directory) are set.
pub struct ChaosScript {
    /// The directory holding the script and its log.
    pub dir: PathBuf,
    /// The script.
    pub path: PathBuf,
}

/// One logged event of a [`ChaosScript`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: String,
    pub attempt: u32,
    /// `$PPID`: the worker that started the handler.
    pub worker_pid: i32,
    /// `$$`: the handler's own process.
    pub pid: i32,
    pub what: String,
}

/// What a [`ChaosScript`] sets before the test's body.
const EVENT_PRELUDE: &str = r#"id="$DLQCTL_MESSAGE_ID"
a="$DLQCTL_ATTEMPT"
log() { printf '%s %s %s %s %s\n' "$id" "$a" "$PPID" "$$" "$1" >> "$d/calls.log"; }"#;

impl ChaosScript {
    /// Writes the script into its own subdirectory `name` of `scratch`.
    pub fn new(scratch: &Scratch, name: &str, body: &str) -> ChaosScript {
        let (dir, path) = write_script(scratch, name, EVENT_PRELUDE, body);
        ChaosScript { dir, path }
    }

    /// Every event so far (a torn last line, being written, is left out).
    pub fn events(&self) -> Vec<Event> {
        log_lines(&self.dir)
            .iter()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                if f.len() != 5 {
                    return None;
                }
                Some(Event {
                    id: f[0].to_string(),
                    attempt: f[1].parse().ok()?,
                    worker_pid: f[2].parse().ok()?,
                    pid: f[3].parse().ok()?,
                    what: f[4].to_string(),
                })
            })
            .collect()
    }

    /// The events named `what`.
    pub fn named(&self, what: &str) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| e.what == what)
            .collect()
    }

    /// Waits until `n` events named `what` are logged; panics after
    /// `deadline`.
    pub async fn wait_for(&self, what: &str, n: usize, deadline: Duration) -> Vec<Event> {
        wait_logged(
            &format!("handler event(s) {what:?}"),
            n,
            deadline,
            || self.named(what),
            || self.events(),
        )
        .await
    }
}
