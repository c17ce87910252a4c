//! Fixtures for the worker tests, beyond `support`: a pipeline described in
//! a scratch YAML and provisioned with the binary, a `dlqctl work` process whose JSON log lines are collected,
//! publishing with properties and headers, and reading queue statistics
//! from the management API.

use crate::support::script::Script;
use crate::support::{Broker, Cleanup, Dlqctl, Run, Scratch};

use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use lapin::BasicProperties;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- pipelines

/// One pipeline of a test topology; every name starts with the cleanup
/// guard's prefix.
#[derive(Debug, Clone)]
pub struct Pipe {
    /// The main queue (and pipeline) name.
    pub name: String,
    /// `quorum` or `classic`.
    pub queue_type: &'static str,
    /// Tier delays, in ms.
    pub delays: Vec<u64>,
    /// Runs at most.
    pub max_attempts: u32,
    /// 0..0.5.
    pub jitter: f64,
    /// A producers' exchange: (name, type, binding keys).
    pub exchange: Option<(String, &'static str, Vec<String>)>,
    /// `dead_letter.max_length` (quorum only).
    pub dlq_max_length: Option<u64>,
    /// `dead_letter.ttl` (`1h`).
    pub dlq_ttl: Option<&'static str>,
    /// `dead_letter.redrive`, as YAML flow text (`{min_age: 1s}`).
    pub redrive: Option<String>,
    /// `circuit_breaker`, as YAML flow text (`{min_calls: 3}`).
    pub circuit_breaker: Option<String>,
    /// `idempotency`, as YAML flow text (`{store: 'sqlite:/tmp/x.db'}`).
    pub idempotency: Option<String>,
}

impl Pipe {
    /// A quorum pipeline `PREFIX-orders` with the given tiers, jitter 0.
    pub fn new(cleanup: &Cleanup, delays: &[u64], max_attempts: u32) -> Pipe {
        Pipe {
            name: cleanup.name("orders"),
            queue_type: "quorum",
            delays: delays.to_vec(),
            max_attempts,
            jitter: 0.0,
            exchange: None,
            dlq_max_length: None,
            dlq_ttl: None,
            redrive: None,
            circuit_breaker: None,
            idempotency: None,
        }
    }

    /// The topology file's text.
    pub fn yaml(&self) -> String {
        let delays: Vec<String> = self
            .delays
            .iter()
            .map(|d| dlqctl::core::values::duration::tier_name(*d))
            .collect();
        let mut y = format!(
            "version: 1\npipelines:\n  - name: {}\n    queue_type: {}\n    retry: {{ delays: [{}], max_attempts: {}, jitter: {} }}\n",
            self.name,
            self.queue_type,
            delays.join(", "),
            self.max_attempts,
            self.jitter
        );
        if let Some((x, kind, keys)) = &self.exchange {
            let keys: Vec<String> = keys.iter().map(|k| format!("{k:?}")).collect();
            y.push_str(&format!(
                "    exchange: {{ name: {x}, type: {kind}, bindings: [{}] }}\n",
                keys.join(", ")
            ));
        }
        let mut dead_letter = Vec::new();
        if let Some(n) = self.dlq_max_length {
            dead_letter.push(format!("max_length: {n}"));
        }
        if let Some(ttl) = self.dlq_ttl {
            dead_letter.push(format!("ttl: {ttl}"));
        }
        if let Some(r) = &self.redrive {
            dead_letter.push(format!("redrive: {r}"));
        }
        if !dead_letter.is_empty() {
            y.push_str(&format!(
                "    dead_letter: {{ {} }}\n",
                dead_letter.join(", ")
            ));
        }
        if let Some(i) = &self.idempotency {
            y.push_str(&format!("    idempotency: {i}\n"));
        }
        if let Some(cb) = &self.circuit_breaker {
            y.push_str(&format!("    circuit_breaker: {cb}\n"));
        }
        y
    }

    /// `NAME.retry`.
    pub fn retry_exchange(&self) -> String {
        format!("{}.retry", self.name)
    }

    /// `NAME.retry.TIER`.
    pub fn retry_queue(&self, delay_ms: u64) -> String {
        format!(
            "{}.retry.{}",
            self.name,
            dlqctl::core::values::duration::tier_name(delay_ms)
        )
    }

    /// Every retry queue.
    pub fn retry_queues(&self) -> Vec<String> {
        self.delays.iter().map(|d| self.retry_queue(*d)).collect()
    }

    /// `NAME.dlx`.
    pub fn dlx(&self) -> String {
        format!("{}.dlx", self.name)
    }

    /// `NAME.dlq`.
    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.name)
    }

    /// Writes the YAML into `scratch` and returns its path.
    pub fn write(&self, scratch: &Scratch) -> PathBuf {
        scratch.write("topology.yaml", &self.yaml())
    }

    /// Writes the YAML and runs `dlqctl provision` on it (must exit 0).
    pub async fn provision(&self, scratch: &Scratch) -> PathBuf {
        let file = self.write(scratch);
        provision_file(&file).await;
        file
    }
}

/// `dlqctl provision FILE`, which must succeed.
pub async fn provision_file(file: &Path) -> Run {
    let run = Dlqctl::new("provision").arg(file).run().await;
    run.assert_code(0);
    run
}

/// A test's pipeline with what it needs, dropped in declaration order:
/// the broker connection, the files, then the broker objects.
pub struct PipeFixture {
    pub broker: Broker,
    pub pipe: Pipe,
    pub scratch: Scratch,
    pub cleanup: Cleanup,
}

impl PipeFixture {
    /// A quorum pipeline with these tiers (jitter 0), changed by `edit`;
    /// not provisioned yet.
    pub async fn new(delays: &[u64], max_attempts: u32, edit: impl FnOnce(&mut Pipe)) -> Self {
        let broker = Broker::connect().await;
        let cleanup = Cleanup::new();
        let scratch = Scratch::new();
        let mut pipe = Pipe::new(&cleanup, delays, max_attempts);
        edit(&mut pipe);
        PipeFixture {
            broker,
            pipe,
            scratch,
            cleanup,
        }
    }

    /// Every queue of the pipeline.
    pub fn all_queues(&self) -> Vec<String> {
        let mut q = vec![self.pipe.name.clone(), self.pipe.dlq()];
        q.extend(self.pipe.retry_queues());
        q
    }

    /// The main queue and the retry queues.
    pub fn main_and_retry_queues(&self) -> Vec<String> {
        let mut q = vec![self.pipe.name.clone()];
        q.extend(self.pipe.retry_queues());
        q
    }

    /// Provisions the pipeline, writes a handler [`Script`] `h` running
    /// `behaviour`, and starts `dlqctl work` on the main queue with it and
    /// `extra` options. Returns the topology file, the script and the
    /// worker, which may not consume yet.
    pub async fn start_worker(
        &self,
        behaviour: &str,
        extra: &[&str],
    ) -> (PathBuf, Script, WorkerProc) {
        let file = self.pipe.provision(&self.scratch).await;
        let script = Script::new(&self.scratch, "h", behaviour);
        let w = WorkerProc::with_script(&file, &self.pipe.name, &script, extra);
        (file, script, w)
    }

    /// Publishes `n` messages `x` with ids `PREFIX0`, `PREFIX1`... to the
    /// main queue, one after the other.
    pub async fn publish_numbered(&self, prefix: &str, n: usize) {
        for k in 0..n {
            let id = with_id(&format!("{prefix}{k}"));
            publish(&self.broker, "", &self.pipe.name, b"x", id).await;
        }
    }

    /// Deletes the binding of tier queue `tier` (its name, with routing key
    /// `key`) to the retry exchange, so that copies for that tier are
    /// returned as unroutable.
    pub async fn unbind_tier(&self, tier: &str, key: &str) {
        let exchange = self.pipe.retry_exchange();
        let binding = ["bindings", "/", "e", &exchange, "q", tier, key];
        self.broker
            .mgmt
            .request(reqwest::Method::DELETE, &binding)
            .await
            .unwrap_or_else(|e| panic!("unbind {tier}: {e}"));
    }

    /// As [`PipeFixture::start_worker`], once the worker consumes.
    pub async fn consuming_worker(
        &self,
        behaviour: &str,
        extra: &[&str],
    ) -> (PathBuf, Script, WorkerProc) {
        let (file, script, mut w) = self.start_worker(behaviour, extra).await;
        w.wait_consuming().await;
        (file, script, w)
    }
}

/// `dlqctl work FILE --queue QUEUE ARGS...` (`ARGS` include `-- HANDLER`),
/// run to its end.
pub async fn work(file: &Path, queue: &str, args: &[&str]) -> Run {
    Dlqctl::on_queue(&["work"], file, queue)
        .args(args)
        .run()
        .await
}

// ---------------------------------------------------------------- the worker process

/// A running `dlqctl --log-format json work ...`, killed when dropped.
pub struct WorkerProc {
    child: tokio::process::Child,
    pid: i32,
    lines: Arc<Mutex<Vec<String>>>,
}

impl WorkerProc {
    /// Starts `dlqctl --log-format json work FILE --queue QUEUE ARGS...`
    /// (`ARGS` include `-- HANDLER` or `--http URL`).
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(file: &Path, queue: &str, args: &[S]) -> WorkerProc {
        WorkerProc::spawn_with_env(file, queue, args, &[])
    }

    /// [`WorkerProc::spawn`] with these variables in its environment (and
    /// so in its handlers').
    pub fn spawn_with_env<S: AsRef<std::ffi::OsStr>>(
        file: &Path,
        queue: &str,
        args: &[S],
        env: &[(&str, &str)],
    ) -> WorkerProc {
        let mut command = Dlqctl::json_log("work")
            .arg(file)
            .args(["--queue", queue])
            .args(args);
        for (k, v) in env {
            command = command.env(k, v);
        }
        let mut child = command.spawn();
        let pid = child.id().expect("a pid") as i32;
        let lines = crate::support::collect_output(&mut child);
        WorkerProc { child, pid, lines }
    }

    /// Starts a worker running `script` per message, with `extra` options.
    pub fn with_script(file: &Path, queue: &str, script: &Script, extra: &[&str]) -> WorkerProc {
        let mut args: Vec<std::ffi::OsString> = extra.iter().map(|s| s.into()).collect();
        args.push("--".into());
        args.push(script.path.clone().into());
        WorkerProc::spawn(file, queue, &args)
    }

    /// Every output line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The whole output so far, for failure messages.
    pub fn output(&self) -> String {
        self.lines().join("\n")
    }

    /// The JSON log lines whose `fields.message` is `message`.
    pub fn events(&self, message: &str) -> Vec<Value> {
        crate::support::events(&self.lines, message)
    }

    /// The `message handled` events (attempt, outcome, decision, tier,
    /// reason, error).
    pub fn decisions(&self) -> Vec<Value> {
        self.events("message handled")
    }

    /// The address it serves `/metrics` on (`--metrics-addr`), from its
    /// log line; waits up to 20 s for it.
    pub async fn metrics_addr(&mut self) -> std::net::SocketAddr {
        let ev = self
            .wait_event("serving metrics on /metrics", 1, Duration::from_secs(20))
            .await;
        ev[0]["addr"]
            .as_str()
            .unwrap_or_default()
            .parse()
            .expect("an address")
    }

    /// Waits until the worker logs `consuming`.
    pub async fn wait_consuming(&mut self) {
        self.wait_event("consuming", 1, Duration::from_secs(20))
            .await;
    }

    /// Waits until `n` events `message` are logged; panics (with the
    /// output) after `deadline` or when the worker exits first.
    pub async fn wait_event(&mut self, message: &str, n: usize, deadline: Duration) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let ev = self.events(message);
            if ev.len() >= n {
                return ev;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                panic!(
                    "the worker exited ({status}) before logging {n} × {message:?}:\n{}",
                    self.output()
                );
            }
            if start.elapsed() > deadline {
                panic!(
                    "wanted {n} × {message:?} within {deadline:?}, got {}:\n{}",
                    ev.len(),
                    self.output()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits for `n` `message handled` events.
    pub async fn wait_decisions(&mut self, n: usize, deadline: Duration) -> Vec<Value> {
        self.wait_event("message handled", n, deadline).await
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our
        // child's, not yet reaped.
        unsafe {
            libc::kill(self.pid, signal);
        }
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our
        // child's, not yet reaped.
        unsafe {
            libc::kill(self.pid, libc::SIGTERM);
        }
    }

    /// Waits for the exit; panics after `deadline`. Returns the exit code.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(status) => {
                // Let the readers take the last lines.
                tokio::time::sleep(Duration::from_millis(100)).await;
                status.expect("wait for the worker").code()
            }
            Err(_) => panic!(
                "the worker did not exit within {deadline:?}:\n{}",
                self.output()
            ),
        }
    }

    /// SIGTERM, then waits for exit 0.
    pub async fn stop(&mut self) {
        self.sigterm();
        let code = self.wait_exit(Duration::from_secs(20)).await;
        assert_eq!(code, Some(0), "worker exit code:\n{}", self.output());
    }

    /// A field of `/proc/PID/status` in kB (`VmRSS`, `VmHWM`).
    pub fn memory_kb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("/proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/{}/status", self.pid))
    }
}

// ---------------------------------------------------------------- publishing

pub use crate::support::NotAccepted;

/// Publishes `body` with `props` (persistent forced), `mandatory`, and
/// waits for the confirm: `Err` when nacked or returned.
pub async fn try_publish(
    broker: &Broker,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: BasicProperties,
) -> Result<(), NotAccepted> {
    broker.try_publish(exchange, routing_key, body, props).await
}

/// As [`try_publish`], panicking when not accepted.
pub async fn publish(
    broker: &Broker,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: BasicProperties,
) {
    if let Err(e) = try_publish(broker, exchange, routing_key, body, props).await {
        panic!(
            "publish to {exchange:?} [{routing_key}] not accepted: {}",
            e.0
        );
    }
}

/// Properties with a message id.
pub fn with_id(id: &str) -> BasicProperties {
    BasicProperties::default().with_message_id(id.into())
}

/// A long-string header value.
pub fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

/// A signed 64-bit header value.
pub fn i(v: i64) -> AMQPValue {
    AMQPValue::LongLongInt(v)
}

/// A field table from pairs.
pub fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert((*k).into(), v.clone());
    }
    t
}

/// An `x-death` entry as the broker writes it.
pub fn death(queue: &str, reason: &str, count: i64) -> AMQPValue {
    AMQPValue::FieldTable(table(&[
        ("count", i(count)),
        ("reason", s(reason)),
        ("queue", s(queue)),
        ("time", AMQPValue::Timestamp(1_700_000_000)),
        ("exchange", s("")),
        (
            "routing-keys",
            AMQPValue::FieldArray(FieldArray::from(vec![s(queue)])),
        ),
    ]))
}

/// An `x-death` array.
pub fn x_death(entries: Vec<AMQPValue>) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(entries))
}

// ---------------------------------------------------------------- reading back

/// A header of a delivery (`None` when absent).
pub fn header<'a>(d: &'a lapin::message::Delivery, key: &str) -> Option<&'a AMQPValue> {
    d.properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(key))
}

/// A string header (long or short), panicking when absent or not a string.
pub fn header_str(d: &lapin::message::Delivery, key: &str) -> String {
    match header(d, key) {
        Some(AMQPValue::LongString(v)) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
        Some(AMQPValue::ShortString(v)) => v.as_str().to_string(),
        other => panic!("header {key}: wanted a string, got {other:?}"),
    }
}

/// An integer header, panicking when absent or not an integer.
pub fn header_int(d: &lapin::message::Delivery, key: &str) -> i64 {
    match header(d, key) {
        Some(AMQPValue::LongLongInt(v)) => *v,
        Some(AMQPValue::LongInt(v)) => (*v).into(),
        Some(AMQPValue::ShortInt(v)) => (*v).into(),
        Some(AMQPValue::LongUInt(v)) => (*v).into(),
        other => panic!("header {key}: wanted an integer, got {other:?}"),
    }
}

/// Takes every message out of `queue` (acking each).
pub async fn drain(broker: &Broker, queue: &str) -> Vec<lapin::message::Delivery> {
    let mut out = Vec::new();
    while let Some(d) = broker.get(queue).await {
        out.push(d);
    }
    out
}

/// `GET /api/queues/%2F/NAME`, panicking when the queue does not exist.
pub async fn queue_json(broker: &Broker, queue: &str) -> Value {
    broker
        .mgmt
        .get(&["queues", "/", queue])
        .await
        .unwrap_or_else(|| panic!("queue {queue} does not exist"))
}

/// Polls the management API (whose statistics lag by a few seconds) until
/// `field` of `queue` satisfies `ok`; panics after `deadline` with the last
/// document. Returns the value.
pub async fn wait_queue_field(
    broker: &Broker,
    queue: &str,
    field: &str,
    ok: impl Fn(u64) -> bool,
    deadline: Duration,
) -> u64 {
    let start = Instant::now();
    loop {
        let doc = queue_json(broker, queue).await;
        if let Some(v) = doc[field].as_u64() {
            if ok(v) {
                return v;
            }
        }
        if start.elapsed() > deadline {
            panic!(
                "queue {queue}: field {field} not as wanted within {deadline:?}; last document:\n{}",
                serde_json::to_string_pretty(&doc).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Asserts that every queue in `queues` holds no ready message.
pub async fn assert_empty(broker: &Broker, queues: &[String]) {
    for q in queues {
        assert_eq!(
            broker.message_count(q).await,
            Some(0),
            "queue {q} should be empty"
        );
    }
}

/// Processes whose command line is exactly `args` (from `/proc`).
pub fn processes_with_cmdline(args: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

/// Now, as dlqctl writes times into headers (RFC 3339 UTC, milliseconds).
pub fn now_rfc3339() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as u64;
    dlqctl::core::values::text::rfc3339_millis(ms)
}
