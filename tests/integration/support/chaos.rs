//! Fixtures for the worker robustness tests, beyond `support` and
//! `support::worker`: a worker process that can be SIGKILLed and restarted,
//! a provisioned pipeline with its handler script and the output of every
//! worker started on it, whether a process is alive, bulk publishing, the
//! worker's connection in the management API, and `rabbitmqctl` with a
//! guard that always leaves the broker running.

use crate::support::script::{ChaosScript, Event};
use crate::support::worker::{processes_with_cmdline, PipeFixture};
use crate::support::{block_on_own_thread, collect_output_into, events, Broker, Dlqctl, Mgmt};
use lapin::BasicProperties;
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- worker process

/// A `dlqctl --log-format json work ...` process that a test may kill and
/// replace. Output lines go to a sink shared by every generation, so the
/// decisions of killed workers are kept. Killed (SIGKILL) when dropped.
pub struct Proc {
    child: tokio::process::Child,
    pid: i32,
    lines: Arc<Mutex<Vec<String>>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Proc {
    /// Starts `dlqctl --log-format json work FILE --queue QUEUE ARGS... --
    /// SCRIPT`, appending its output lines to `lines`.
    pub fn spawn(
        file: &Path,
        queue: &str,
        args: &[&str],
        script: &Path,
        lines: Arc<Mutex<Vec<String>>>,
    ) -> Proc {
        let mut child = Dlqctl::json_log("work")
            .arg(file)
            .args(["--queue", queue])
            .args(args)
            .arg("--")
            .arg(script)
            .spawn();
        let pid = child.id().expect("a pid") as i32;
        let readers = collect_output_into(&mut child, &lines);
        Proc {
            child,
            pid,
            lines,
            readers,
        }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The exit status, when it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait on the worker")
    }

    /// Sends `sig`.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our
        // child's and stays ours until we reap it.
        unsafe {
            libc::kill(self.pid, sig);
        }
    }

    /// Waits for the exit and for the last output lines; `None` after
    /// `deadline`.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let status = tokio::time::timeout(deadline, self.child.wait())
            .await
            .ok()?
            .expect("wait for the worker");
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
        }
        Some(status)
    }

    /// SIGKILL, and waits for the process to be gone.
    pub async fn kill9(&mut self) -> ExitStatus {
        self.signal(libc::SIGKILL);
        self.wait_exit(Duration::from_secs(10))
            .await
            .expect("a SIGKILLed worker exits")
    }

    /// SIGTERM, then waits (up to `deadline`) for the exit code.
    pub async fn stop(&mut self, deadline: Duration) -> Option<i32> {
        self.signal(libc::SIGTERM);
        match self.wait_exit(deadline).await {
            Some(s) => s.code(),
            None => panic!(
                "the worker did not exit within {deadline:?} of SIGTERM:\n{}",
                self.output()
            ),
        }
    }

    /// All lines in the shared sink, for failure messages.
    pub fn output(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

/// `message handled` events as (message id, outcome, decision).
pub fn decisions(lines: &Mutex<Vec<String>>) -> Vec<(String, String, String)> {
    events(lines, "message handled")
        .into_iter()
        .map(|e| {
            let f = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (f("message_id"), f("outcome"), f("decision"))
        })
        .collect()
}

/// Polls `cond` every 50 ms until true; false after `deadline`.
pub async fn wait_until(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------- a pipeline and its handler

/// A chaos test's pipeline: provisioned, a [`ChaosScript`] handler `h`,
/// and one sink for the output of every worker started on it with
/// [`ChaosPipe::spawn`] (so the decisions of killed workers are kept).
pub struct ChaosPipe {
    /// The broker connection, the pipeline, its scratch files and cleanup.
    pub f: PipeFixture,
    /// The provisioned topology file.
    pub file: PathBuf,
    /// The handler.
    pub script: ChaosScript,
    /// The output lines of every worker started so far.
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl ChaosPipe {
    /// One 100 ms tier, 3 attempts; the handler runs `body`.
    pub async fn new(body: &str) -> ChaosPipe {
        ChaosPipe::with(PipeFixture::new(&[100], 3, |_| {}).await, body).await
    }

    /// As [`ChaosPipe::new`], and starts a first worker with `args`.
    pub async fn start(body: &str, args: &[&str]) -> (ChaosPipe, Proc) {
        let rig = ChaosPipe::new(body).await;
        let w = rig.spawn(args);
        (rig, w)
    }

    /// `f`'s pipeline, provisioned; the handler runs `body`.
    pub async fn with(f: PipeFixture, body: &str) -> ChaosPipe {
        let file = f.pipe.provision(&f.scratch).await;
        let script = ChaosScript::new(&f.scratch, "h", body);
        ChaosPipe {
            f,
            file,
            script,
            lines: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// As [`ChaosPipe::new`], with a handler that logs `start`, sleeps
    /// `secs`.NNNN seconds and logs `done`. NNNN is random: a `sleep` that
    /// nobody else runs, to find it among the processes. Returns the
    /// pipeline and the sleep's argument.
    pub async fn sleeping(secs: u32) -> (ChaosPipe, String) {
        let sleep = format!("{secs}.{:04}", uuid::Uuid::new_v4().as_u128() % 10_000);
        (ChaosPipe::new(&sleeper(&sleep)).await, sleep)
    }

    /// Starts `dlqctl work` on the main queue with `args`, its output going
    /// to the shared sink.
    pub fn spawn(&self, args: &[&str]) -> Proc {
        let (file, queue) = (&self.file, &self.f.pipe.name);
        Proc::spawn(file, queue, args, &self.script.path, self.lines.clone())
    }

    /// Publishes one message per id to the main queue through `broker`
    /// (the fixture's, or a new connection after the broker closed it).
    pub async fn publish(&self, broker: &Broker, ids: &[String]) {
        publish_ids(broker, "", &self.f.pipe.name, ids).await;
    }

    /// Publishes `ids` (as [`ChaosPipe::publish`], through the fixture's
    /// broker), then waits up to 20 s for `n` handler events `what`.
    pub async fn publish_and_wait(&self, ids: &[String], (what, n): (&str, usize)) -> Vec<Event> {
        self.publish(&self.f.broker, ids).await;
        let deadline = Duration::from_secs(20);
        self.script.wait_for(what, n, deadline).await
    }

    /// Publishes the message `slow` and waits until its handler starts;
    /// returns the handler's pid.
    pub async fn start_slow(&self) -> i32 {
        let started = self
            .publish_and_wait(&["slow".to_string()], ("start", 1))
            .await;
        started[0].pid
    }

    /// The `message handled` events of every worker so far.
    pub fn decisions(&self) -> Vec<(String, String, String)> {
        decisions(&self.lines)
    }

    /// Asserts that `n` log lines `message` are there within `deadline`;
    /// else panics with `w`'s output.
    pub async fn assert_logged(&self, w: &Proc, message: &str, n: usize, deadline: Duration) {
        assert!(
            wait_until(deadline, || events(&self.lines, message).len() >= n).await,
            "wanted {n} × {message:?} within {deadline:?}:\n{}",
            w.output()
        );
    }

    /// Asserts that the handler logged `done` for every one of `ids`
    /// within `deadline`.
    pub async fn assert_all_done(&self, w: &Proc, ids: &[&String], deadline: Duration) {
        let done = || -> HashSet<String> {
            self.script
                .named("done")
                .into_iter()
                .map(|e| e.id)
                .collect()
        };
        assert!(
            wait_until(deadline, || ids.iter().all(|id| done().contains(*id))).await,
            "not every message handled: {:#?}\n{}",
            self.script.events(),
            w.output()
        );
    }

    /// After a stop that cut the handler (pid `handler`, sleeping `sleep`
    /// seconds) short: its message is back in the main queue, no decision
    /// was made, the handler never finished, and neither it nor its
    /// `sleep` is left running.
    pub async fn assert_cut_short(&self, w: &Proc, handler: i32, sleep: &str) {
        self.f
            .broker
            .wait_for_count(&self.f.pipe.name, 1, Duration::from_secs(5))
            .await;
        assert!(self.decisions().is_empty(), "{}", w.output());
        assert!(self.script.named("done").is_empty(), "the handler finished");
        let sleeping = || processes_with_cmdline(&["sleep", sleep]);
        assert!(
            wait_until(Duration::from_secs(2), || !alive(handler)
                && sleeping().is_empty())
            .await,
            "left behind: handler {handler} alive {}, sleep {:?}",
            alive(handler),
            sleeping()
        );
    }

    /// Stops `w` (SIGTERM, exit 0 within 15 s), then, once an unacked
    /// message would be ready again, asserts through `broker` that the
    /// main and retry queues and the DLQ are empty.
    pub async fn stop_and_assert_empty(&self, w: &mut Proc, broker: &Broker) {
        assert_eq!(w.stop(Duration::from_secs(15)).await, Some(0));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            ready_total(broker, &self.f.main_and_retry_queues()).await,
            0
        );
        assert_eq!(broker.message_count(&self.f.pipe.dlq()).await, Some(0));
    }
}

/// A handler body that logs `start`, sleeps `secs` seconds, logs `done`
/// and succeeds.
pub fn sleeper(secs: &str) -> String {
    format!("log start\nsleep {secs}\nlog done\nexit 0")
}

// ---------------------------------------------------------------- processes

/// Whether process `pid` is still alive (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `PID (COMM) STATE ...`: the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

// ---------------------------------------------------------------- publishing

/// Publishes one persistent message per id (body = the id) on one
/// confirm-mode channel, `mandatory`, all confirms in flight at once;
/// panics unless every one is acked and routed.
pub async fn publish_ids(broker: &Broker, exchange: &str, routing_key: &str, ids: &[String]) {
    let msgs = ids.iter().map(|id| {
        let props = BasicProperties::default().with_message_id(id.as_str().into());
        (id.as_bytes().to_vec(), props)
    });
    broker.publish_all(exchange, routing_key, msgs).await;
}

/// The message ids of deliveries (`""` when absent).
pub fn ids_of(ds: &[lapin::message::Delivery]) -> Vec<String> {
    ds.iter()
        .map(|d| {
            d.properties
                .message_id()
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or_default()
        })
        .collect()
}

/// The sum of ready messages of `queues` (passive declares).
pub async fn ready_total(broker: &Broker, queues: &[String]) -> u32 {
    let mut n = 0;
    for q in queues {
        n += broker
            .message_count(q)
            .await
            .unwrap_or_else(|| panic!("queue {q} is gone"));
    }
    n
}

/// Ids that occur more than once, and how many extra times in all.
pub fn extra_occurrences<'a>(ids: impl IntoIterator<Item = &'a String>) -> usize {
    let mut seen = HashSet::new();
    ids.into_iter().filter(|id| !seen.insert(*id)).count()
}

// ---------------------------------------------------------------- management API

/// The management API's names of the connections whose client-given name
/// is `name` (e.g. `dlqctl work PIPELINE`).
pub async fn connections_named(mgmt: &Mgmt, name: &str) -> Vec<String> {
    let all = mgmt.get(&["connections"]).await.unwrap_or(Value::Null);
    all.as_array()
        .map(|a| {
            a.iter()
                .filter(|c| {
                    c["client_properties"]["connection_name"] == name
                        || c["user_provided_name"] == name
                })
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Force-closes a connection, as an operator would in the management UI.
pub async fn close_connection(mgmt: &Mgmt, api_name: &str) {
    mgmt.request(reqwest::Method::DELETE, &["connections", api_name])
        .await
        .unwrap_or_else(|e| panic!("close connection {api_name}: {e}"));
}

// ---------------------------------------------------------------- rabbitmqctl

/// Runs `rabbitmqctl ARGS` on the broker under test (only where
/// [`crate::support::allow_disruption`] allows it); panics (with its
/// output) unless it succeeds.
pub async fn rabbitmqctl(args: &[&str]) {
    crate::support::allow_disruption(&format!("runs `rabbitmqctl {}`", args.join(" ")));
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("rabbitmqctl")
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("rabbitmqctl {} took over 60s", args.join(" ")))
    .unwrap_or_else(|e| panic!("cannot run rabbitmqctl (is RabbitMQ installed here?): {e}"));
    assert!(
        out.status.success(),
        "rabbitmqctl {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until the broker accepts AMQP connections and its management API
/// answers again; panics after `deadline`.
pub async fn wait_broker_up(deadline: Duration) {
    let start = Instant::now();
    loop {
        let amqp = lapin::Connection::connect(
            &crate::support::amqp_url(),
            lapin::ConnectionProperties::default(),
        )
        .await;
        if let Ok(c) = amqp {
            let _ = c.close(200, "bye".into()).await;
            if Mgmt::new()
                .request(reqwest::Method::GET, &["overview"])
                .await
                .is_ok()
            {
                return;
            }
        }
        if start.elapsed() > deadline {
            panic!("the broker did not come back within {deadline:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs `rabbitmqctl start_app` when dropped (test passed or panicked) and
/// waits for the broker: a test that stops the broker never leaves it
/// stopped for the tests after it.
pub struct BrokerRunning;

impl Drop for BrokerRunning {
    fn drop(&mut self) {
        let ok = block_on_own_thread(|| async {
            rabbitmqctl(&["start_app"]).await;
            wait_broker_up(Duration::from_secs(60)).await;
        });
        if ok.is_err() {
            eprintln!("could not restart the broker: run `rabbitmqctl start_app`");
        }
    }
}
