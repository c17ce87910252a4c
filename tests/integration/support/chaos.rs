//! Fixtures for the worker robustness tests, beyond `support` and
//! `support::worker`: a worker process that can be SIGKILLed and restarted,
//! whether a process is alive, bulk publishing, the worker's connection in
//! the management API, and `rabbitmqctl` with a guard that always leaves
//! the broker running.

use crate::support::{block_on_own_thread, collect_output_into, events, Broker, Dlqctl, Mgmt};
use lapin::BasicProperties;
use serde_json::Value;
use std::collections::HashSet;
use std::path::Path;
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
