//! Worker throughput beside hand-written lapin loops, in one run on the
//! same queue setup. Prints messages/s and ratios; asserts nothing.
//!
//! ```text
//! cargo bench --bench worker
//! ```
//!
//! Scenarios (each on fresh quorum queues, preloaded, then drained):
//! 1. success path: raw consume+ack loop vs `Worker` with a no-op handler;
//! 2. retry path: raw consume + confirmed republish (pipelined) + ack, the
//!    same with the worker's headers on every copy, and the worker's retry
//!    path (handler always transient), in `BENCH_ROUNDS` rounds taken in
//!    turn, each on an emptied tier queue; the median ratio at the end;
//! 3. exec handler (`/bin/true`) at concurrency 1 and 8 vs a hand-written
//!    consume-spawn-ack loop, and concurrency 8 vs a hand-written pika
//!    worker (benches/peers/pika_exec.py; needs Debian's python3-pika);
//! 4. peak RSS of `dlqctl work --http` over 100,000 messages at prefetch 200;
//! 5. `--jsonl` with one Python process vs exec of a Python script per
//!    message (the same logic: parse the JSON body, succeed) and vs the
//!    in-process no-op handler, in alternating rounds (with the Python
//!    process's own CPU a message); then the peak RSS of
//!    `dlqctl work --jsonl` over 100,000 messages at prefetch 200.
//!
//! 6. soak: 1,000,000 messages (`BENCH_SOAK_N`) through `dlqctl work
//!    --http` at prefetch 200, published while it runs: peak RSS after the
//!    first 100,000 and at the end;
//! 7. 1 MiB and 50 MiB bodies through exec, HTTP and `--jsonl`: peak RSS
//!    against body × concurrency.
//!
//! 8. idempotency guard: the in-process no-op worker without a guard, with
//!    the SQLite store and with the Redis store (a redis-server of the
//!    bench's own, on a port of its own), in `BENCH_ROUNDS` interleaved
//!    rounds, each on a fresh store; then exec `/bin/true` at concurrency 8
//!    with and without the guard (SQLite). Median ratios.
//!
//! `BENCH_ONLY=5` runs only scenario 5 (a list: `BENCH_ONLY=1,5`).

// A test or a benchmark may be as long as its scenario or its table:
// the length rule (clippy::too_many_lines) is for the code they run.
#![allow(clippy::too_many_lines)]

#[allow(dead_code)] // shared by the benches: not every item is used by each
mod common;
#[path = "common/cpu.rs"]
#[allow(dead_code)] // shared by the benches: not every item is used by each
mod cpu;
#[path = "common/harness.rs"]
mod harness;

use cpu::{local_broker_pid, process_cpu, rusage};
use dlqctl::amqp::connection::{BrokerUrl, DEFAULT_URL};
use dlqctl::core::handling::outcome::Outcome;
use dlqctl::core::topology::{parse_topology, plan, Pipeline};
use dlqctl::handler::exec::ExecHandler;
use dlqctl::handler::jsonl::{JsonlConfig, JsonlHandler};
use dlqctl::handler::{handler_fn, Handler, HandlerMessage};
use dlqctl::worker::{Worker, WorkerConfig};
use futures_util::StreamExt;
use harness::env_number;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

struct Setup {
    url: BrokerUrl,
    conn: Connection,
    prefix: String,
}

impl Setup {
    async fn new() -> Setup {
        let raw = std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_URL.into());
        let url = BrokerUrl::parse(&raw).expect("AMQP_URL");
        let conn = url.connect("dlqctl bench worker").await.unwrap_or_else(|e| {
            panic!("{e}\nthe benchmark needs RabbitMQ on {}: start it with `rabbitmq-server -detached`", url.endpoint())
        });
        let prefix = format!("bench-{}", std::process::id());
        Setup { url, conn, prefix }
    }

    /// Provisions a fresh pipeline and returns it.
    async fn pipeline(&self, name: &str, delays: &str, max_attempts: u32) -> Pipeline {
        let full = format!("{}-{name}", self.prefix);
        let yaml = format!(
            "version: 1\npipelines:\n  - name: {full}\n    retry: {{delays: {delays}, max_attempts: {max_attempts}, jitter: 0}}\n"
        );
        let t = parse_topology(&yaml, "bench.yaml").expect("valid bench topology");
        let r = dlqctl::ops::provision::provision(&self.conn, &plan(&t), 16)
            .await
            .expect("provision");
        assert!(!r.has_differences(), "{:?}", r.findings);
        t.pipelines[0].clone()
    }

    async fn preload(&self, queue: &str, n: usize) {
        // 256 bytes of JSON, for handlers that parse it.
        let body = format!("{{\"order\":\"{}\"}}", "x".repeat(244)).into_bytes();
        self.preload_with(queue, n, &body, None).await;
    }

    /// Publishes `n` copies of `body` (confirmed, persistent), counting
    /// each confirmed one into `published`.
    async fn preload_with(
        &self,
        queue: &str,
        n: usize,
        body: &[u8],
        published: Option<&AtomicUsize>,
    ) {
        let ch = self.conn.create_channel().await.expect("channel");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        let batch = (64 * 1024 * 1024 / body.len().max(1)).clamp(1, 1000);
        let mut pending = Vec::with_capacity(batch);
        for i in 0..n {
            let props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(format!("m{i}").into());
            let c = ch
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    body,
                    props,
                )
                .await
                .expect("publish");
            pending.push(c);
            if pending.len() == batch {
                for c in pending.drain(..) {
                    c.await.expect("confirm");
                }
                if let Some(p) = published {
                    p.store(i + 1, Ordering::SeqCst);
                }
            }
        }
        for c in pending.drain(..) {
            c.await.expect("confirm");
        }
        if let Some(p) = published {
            p.store(n, Ordering::SeqCst);
        }
        let _ = ch.close(200, "ok".into()).await;
    }

    async fn cleanup(&self, p: &Pipeline) {
        let ch = self.conn.create_channel().await.expect("channel");
        let t = dlqctl::core::topology::Topology {
            pipelines: vec![p.clone()],
        };
        let pl = plan(&t);
        for q in &pl.queues {
            let _ = ch
                .queue_delete(q.name.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for e in &pl.exchanges {
            let _ = ch
                .exchange_delete(e.name.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
        let _ = ch.close(200, "ok".into()).await;
    }
}

async fn consumer(ch: &Channel, queue: &str, prefetch: u16) -> lapin::Consumer {
    ch.basic_qos(prefetch, BasicQosOptions::default())
        .await
        .expect("qos");
    ch.basic_consume(
        queue.into(),
        "".into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("consume")
}

/// Raw loop: consume, ack, until n acked.
async fn raw_ack(s: &Setup, queue: &str, n: usize, prefetch: u16) -> Duration {
    let ch = s.conn.create_channel().await.expect("channel");
    let mut c = consumer(&ch, queue, prefetch).await;
    let mut t0 = None;
    let mut done = 0;
    while done < n {
        let d = c.next().await.expect("stream").expect("delivery");
        t0.get_or_insert_with(Instant::now);
        d.ack(BasicAckOptions::default()).await.expect("ack");
        done += 1;
    }
    let el = t0.map(|t| t.elapsed()).unwrap_or_default();
    let _ = ch.close(200, "ok".into()).await;
    el
}

/// Raw loop: consume, republish confirmed (many in flight), ack.
/// With `channels == 1` every copy shares one channel (many confirms in
/// flight on it); otherwise copies take turns on a pool of channels, one
/// copy in flight per channel, as the worker must (lapin cannot tell which
/// of several unconfirmed mandatory copies on a channel a return is for).
/// With `headers`, each copy carries them (cloned, not built) in place of
/// the original's.
#[allow(clippy::too_many_arguments)]
async fn raw_republish(
    s: &Setup,
    queue: &str,
    exchange: &str,
    key: &str,
    n: usize,
    prefetch: u16,
    channels: usize,
    headers: Option<&FieldTable>,
) -> Duration {
    let ch = s.conn.create_channel().await.expect("channel");
    let mut pool = Vec::new();
    for _ in 0..channels {
        let c = s.conn.create_channel().await.expect("channel");
        c.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        pool.push(c);
    }
    let shared = channels == 1;
    let pool = Arc::new(std::sync::Mutex::new(pool));
    let mut c = consumer(&ch, queue, prefetch).await;
    let t0 = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let d = c.next().await.expect("stream").expect("delivery");
        let pool = pool.clone();
        let (exchange, key) = (exchange.to_string(), key.to_string());
        let done = done.clone();
        let headers = headers.cloned();
        tasks.spawn(async move {
            let pubch = loop {
                let taken = {
                    let mut p = pool.lock().expect("pool");
                    if shared {
                        p.first().cloned()
                    } else {
                        p.pop()
                    }
                };
                match taken {
                    Some(c) => break c,
                    None => tokio::task::yield_now().await,
                }
            };
            let props = d.properties.clone().with_delivery_mode(2);
            let conf = pubch
                .basic_publish(
                    exchange.as_str().into(),
                    key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &d.data,
                    match headers {
                        Some(h) => props.with_headers(h),
                        None => props,
                    },
                )
                .await
                .expect("publish")
                .await
                .expect("confirm");
            assert!(matches!(conf, lapin::Confirmation::Ack(None)), "{conf:?}");
            if !shared {
                pool.lock().expect("pool").push(pubch);
            }
            d.ack(BasicAckOptions::default()).await.expect("ack");
            done.fetch_add(1, Ordering::Relaxed);
        });
    }
    while tasks.join_next().await.is_some() {}
    let el = t0.elapsed();
    let _ = ch.close(200, "ok".into()).await;
    let chans: Vec<Channel> = pool.lock().expect("pool").drain(..).collect();
    for c in chans {
        let _ = c.close(200, "ok".into()).await;
    }
    el
}

/// Hand-written exec loop: consume, spawn /bin/true with the body, wait, ack.
async fn raw_exec(s: &Setup, queue: &str, n: usize) -> Duration {
    use tokio::io::AsyncWriteExt;
    let ch = s.conn.create_channel().await.expect("channel");
    let mut c = consumer(&ch, queue, 50).await;
    let t0 = Instant::now();
    for _ in 0..n {
        let d = c.next().await.expect("stream").expect("delivery");
        let mut child = tokio::process::Command::new("/bin/true")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(&d.data).await;
        }
        let st = child.wait().await.expect("wait");
        assert!(st.success());
        d.ack(BasicAckOptions::default()).await.expect("ack");
    }
    let el = t0.elapsed();
    let _ = ch.close(200, "ok".into()).await;
    el
}

/// The pika peer (benches/peers/pika_exec.py) over `n` messages: its time
/// from the first delivery to the last ack. Needs Debian's python3-pika.
async fn pika_exec(queue: &str, n: usize) -> Result<Duration, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/peers/pika_exec.py");
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_URL.into());
    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg(script)
        .arg(&url)
        .arg(queue)
        .arg(n.to_string())
        .output()
        .await
        .map_err(|e| format!("/usr/bin/python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pika_exec.py {} (apt-get install python3-pika): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse::<f64>()
        .map(Duration::from_secs_f64)
        .map_err(|e| format!("pika_exec.py printed {text:?}: {e}"))
}

/// Counts handler runs and reports when `n` were made.
struct Counting<H> {
    inner: H,
    runs: Arc<AtomicUsize>,
    target: usize,
    done: CancellationToken,
    first: Arc<std::sync::OnceLock<Instant>>,
}

impl<H: Handler> Handler for Counting<H> {
    async fn handle(&self, msg: &HandlerMessage) -> Outcome {
        self.first.get_or_init(Instant::now);
        let o = self.inner.handle(msg).await;
        if self.runs.fetch_add(1, Ordering::SeqCst) + 1 >= self.target {
            self.done.cancel();
        }
        o
    }
}

/// Runs the worker until `n` handler runs were made, then stops it
/// gracefully (the last acks/copies finish inside the measured time).
/// Time counts from the first delivery, like the raw loops (connecting and
/// checking the topology are left out of both).
async fn worker_run<H: Handler>(
    s: &Setup,
    p: &Pipeline,
    h: H,
    n: usize,
    prefetch: u16,
    concurrency: usize,
) -> Duration {
    let stop = CancellationToken::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let first = Arc::new(std::sync::OnceLock::new());
    let counting = Counting {
        inner: h,
        runs: runs.clone(),
        target: n,
        done: stop.clone(),
        first: first.clone(),
    };
    let mut cfg = WorkerConfig::new(p.clone(), s.url.clone());
    cfg.prefetch = prefetch;
    cfg.concurrency = concurrency;
    cfg.publish_channels = env_number("BENCH_PUBLISH_CHANNELS", cfg.publish_channels);
    let w = Worker::new(cfg, counting);
    w.run(stop).await.expect("worker");
    let el = first.get().map(|t| t.elapsed()).unwrap_or_default();
    assert!(runs.load(Ordering::SeqCst) >= n);
    el
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn row(name: &str, n: usize, d: Duration) -> f64 {
    let r = rate(n, d);
    println!(
        "{name:<58} {n:>7} msgs {:>8.3} s {r:>10.0} msg/s",
        d.as_secs_f64()
    );
    r
}

/// The median of `v` (the mean of the middle two when even).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// CPU time (user + system) this process has used so far.
fn cpu_time() -> Duration {
    rusage(libc::RUSAGE_SELF)
}

/// CPU time (user + system) of this process's children reaped so far.
fn children_cpu_time() -> Duration {
    rusage(libc::RUSAGE_CHILDREN)
}

/// Runs a scenario and prints its rate, this process's CPU per message,
/// and, where it can be read, the local broker's CPU per message and how
/// idle the machine's cores were meanwhile: on a machine whose cores are
/// all busy, a side whose process does more per message is slower by that
/// much CPU, whatever else it saves.
async fn measure<F: std::future::Future<Output = Duration>>(name: &str, n: usize, f: F) -> f64 {
    let broker = broker_pid();
    let r0 = broker.and_then(|_| broker_reductions());
    let (c0, b0, m0) = (cpu_time(), broker.and_then(process_cpu), machine_ticks());
    let d = f.await;
    let cpu = cpu_time().saturating_sub(c0);
    let (b1, m1) = (broker.and_then(process_cpu), machine_ticks());
    let r1 = broker.and_then(|_| broker_reductions());
    let r = row(name, n, d);
    let per_msg = |secs: f64| secs * 1e6 / n as f64;
    let mut line = format!(
        "{:<58} {:>7.1} µs CPU/msg in this process",
        "",
        per_msg(cpu.as_secs_f64())
    );
    if let (Some(b0), Some(b1)) = (b0, b1) {
        line += &format!(
            ", {:.1} in the broker",
            per_msg(b1.saturating_sub(b0).as_secs_f64())
        );
    }
    if let (Some(r0), Some(r1)) = (r0, r1) {
        line += &format!(" ({:.0} reductions/msg)", (r1 - r0) as f64 / n as f64);
    }
    if let (Some((idle0, all0)), Some((idle1, all1))) = (m0, m1) {
        if all1 > all0 {
            line += &format!(
                ", cores {:.0} % idle",
                100.0 * (idle1 - idle0) as f64 / (all1 - all0) as f64
            );
        }
    }
    println!("{line}");
    r
}

/// The local broker's OS pid (its listener's process), found once; none
/// when `AMQP_URL` names another host.
fn broker_pid() -> Option<u32> {
    static PID: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *PID.get_or_init(|| {
        local_broker_pid(&std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_URL.into()))
    })
}

/// The broker's reductions so far (Erlang's count of work done, steadier
/// than its CPU time on a machine whose load moves): what it did for a
/// run, with a little background work of its own.
fn broker_reductions() -> Option<u64> {
    let c0 = children_cpu_time();
    let out = std::process::Command::new("rabbitmqctl")
        .args(["eval", "element(1, erlang:statistics(reductions))."])
        .output();
    // rabbitmqctl is a child too: its CPU is not a handler's.
    let spent = children_cpu_time().saturating_sub(c0).as_nanos() as u64;
    RABBITMQCTL_CPU_NS.fetch_add(spent, Ordering::SeqCst);
    String::from_utf8_lossy(&out.ok()?.stdout)
        .trim()
        .parse()
        .ok()
}

/// The CPU the `rabbitmqctl` runs of [`broker_reductions`] took, in ns.
static RABBITMQCTL_CPU_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The CPU of children reaped so far, `rabbitmqctl`'s left out.
fn handler_children_cpu_time() -> Duration {
    children_cpu_time().saturating_sub(Duration::from_nanos(
        RABBITMQCTL_CPU_NS.load(Ordering::SeqCst),
    ))
}

/// The machine's idle and total clock ticks (`/proc/stat`, all cores).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = cpu
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let idle = v.get(3)? + v.get(4)?;
    Some((idle, v.iter().take(8).sum()))
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Runs the binary with `args` over `n` preloaded messages of a fresh
/// pipeline and prints its rate and peak RSS.
async fn binary_rss(s: &Setup, name: &str, n: usize, args: &[&str], label: &str) {
    binary_run(
        s,
        BinaryRun {
            name,
            n,
            body: None,
            args,
            label,
            feed: false,
            checkpoint: None,
        },
    )
    .await;
}

/// One run of the binary over a fresh pipeline.
struct BinaryRun<'a> {
    name: &'a str,
    n: usize,
    /// The body of every message (default: 256 bytes of JSON).
    body: Option<Vec<u8>>,
    args: &'a [&'a str],
    label: &'a str,
    /// Publish while the worker runs instead of preloading.
    feed: bool,
    /// Also print the peak RSS once this many messages were handled.
    checkpoint: Option<usize>,
}

/// Runs `dlqctl work` over `n` messages and prints the rate and the peak
/// RSS (at the checkpoint too); returns the peak in KiB.
async fn binary_run(s: &Setup, r: BinaryRun<'_>) -> u64 {
    let p = s.pipeline(r.name, "[1h]", 5).await;
    let body = r
        .body
        .clone()
        .unwrap_or_else(|| format!("{{\"order\":\"{}\"}}", "x".repeat(244)).into_bytes());
    let published = Arc::new(AtomicUsize::new(0));
    if !r.feed {
        s.preload_with(&p.name, r.n, &body, Some(&published)).await;
    }
    let dir = std::env::temp_dir().join(format!("{}-{}", s.prefix, r.name));
    std::fs::create_dir_all(&dir).expect("dir");
    let yaml = dir.join("t.yaml");
    std::fs::write(
        &yaml,
        format!("version: 1\npipelines:\n  - name: {}\n    retry: {{delays: [1h], max_attempts: 5, jitter: 0}}\n", p.name),
    )
    .expect("yaml");
    let bin = env!("CARGO_BIN_EXE_dlqctl");
    let t0 = Instant::now();
    let mut child = std::process::Command::new(bin)
        .args([
            "work",
            yaml.to_str().unwrap_or_default(),
            "--queue",
            &p.name,
        ])
        .args(r.args)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("spawn dlqctl work");
    let feeder = r.feed.then(|| {
        let (conn_setup, queue, body, published) = (
            s.url.clone(),
            p.name.clone(),
            body.clone(),
            published.clone(),
        );
        let n = r.n;
        tokio::spawn(async move {
            let conn = conn_setup
                .connect("dlqctl bench feeder")
                .await
                .expect("feeder");
            let feeder = Setup {
                url: conn_setup,
                conn,
                prefix: String::new(),
            };
            feeder
                .preload_with(&queue, n, &body, Some(&published))
                .await;
        })
    });
    let ch = s.conn.create_channel().await.expect("channel");
    let (mut peak, mut at_checkpoint) = (0, None);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak_rss_kib(child.id()).unwrap_or(peak).max(peak);
        let q = ch
            .queue_declare(
                p.name.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare");
        let sent = published.load(Ordering::SeqCst);
        let handled = sent.saturating_sub(q.message_count() as usize);
        if let Some(c) = r.checkpoint {
            if at_checkpoint.is_none() && handled >= c {
                at_checkpoint = Some((peak, handled));
            }
        }
        if sent == r.n && q.message_count() == 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            peak = peak_rss_kib(child.id()).unwrap_or(peak).max(peak);
            break;
        }
        if t0.elapsed() > Duration::from_secs(1800) {
            println!("the run did not drain within 1800 s");
            break;
        }
    }
    if let Some(f) = feeder {
        let _ = f.await;
    }
    let el = t0.elapsed();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    row(r.label, r.n, el);
    if let Some((kib, handled)) = at_checkpoint {
        println!(
            "  peak RSS after {handled} messages: {:.1} MiB; after all {}: {:.1} MiB (growth {:+.1} MiB)",
            kib as f64 / 1024.0,
            r.n,
            peak as f64 / 1024.0,
            (peak as f64 - kib as f64) / 1024.0
        );
    } else {
        println!("  peak RSS: {:.1} MiB", peak as f64 / 1024.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
    s.cleanup(&p).await;
    peak
}

/// Exec: parse the JSON body from stdin, succeed.
const EXEC_PY: &str = "import json, sys\njson.loads(sys.stdin.buffer.read())\n";

/// --jsonl: the same logic per message line.
const JSONL_PY: &str = r#"import json, sys
out = sys.stdout
sys.stdin.buffer.readline()
out.write('{"ready": true, "version": 1}\n')
out.flush()
for line in sys.stdin.buffer:
    msg = json.loads(line)
    json.loads(msg["body"])
    out.write('{"id": %d, "outcome": "success"}\n' % msg["id"])
    out.flush()
"#;

fn main() {
    harness::bench_main(run());
}

async fn run() {
    let s = Setup::new().await;
    let n_ack = env_number("BENCH_ACK_N", 20_000);
    let n_retry = env_number("BENCH_RETRY_N", 10_000);
    let n_exec = env_number("BENCH_EXEC_N", 600);
    let n_rss = env_number("BENCH_RSS_N", 100_000);
    let n_exec_py = env_number("BENCH_EXEC_PY_N", 300);
    let n_jsonl = env_number("BENCH_JSONL_N", 20_000);
    let rounds = env_number("BENCH_ROUNDS", 2);
    // BENCH_ONLY=5 (or 1,3,...) runs only those scenarios.
    let picked: Vec<usize> = std::env::var("BENCH_ONLY")
        .unwrap_or_default()
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let only = |n: usize| picked.is_empty() || picked.contains(&n);
    println!(
        "dlqctl worker benchmark (RabbitMQ at {}, quorum queues)\n",
        s.url.endpoint()
    );

    // 1. success path
    if only(1) {
        let p = s.pipeline("ack", "[1h]", 5).await;
        s.preload(&p.name, n_ack).await;
        let raw = measure(
            "raw lapin consume+ack (prefetch 200)",
            n_ack,
            raw_ack(&s, &p.name, n_ack, 200),
        )
        .await;
        s.preload(&p.name, n_ack).await;
        let noop = handler_fn(|_m: HandlerMessage| async { Outcome::Success });
        let wk = measure(
            "Worker, no-op handler (prefetch 200, concurrency 200)",
            n_ack,
            worker_run(&s, &p, noop, n_ack, 200, 200),
        )
        .await;
        println!("  ratio worker/raw: {:.2} (target >= 0.95)\n", wk / raw);
        s.cleanup(&p).await;
    }

    // 2. retry path: copies go to a 1h tier; it is emptied before each run,
    // so that none runs against a longer quorum queue than another.
    if only(2) {
        let p = s.pipeline("retry", "[1h]", 1000).await;
        let tier = p.retry_queue(3_600_000);
        let (ex, key) = (p.retry_exchange(), "1h");
        // The headers the worker's copy of a first failure carries.
        let sample = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id("m0".into());
        let ctx = dlqctl::core::retry::CopyContext {
            attempt: 1,
            error: "down",
            now_unix_ms: 1_796_000_000_000,
            delivery_exchange: "",
            delivery_routing_key: &p.name,
            connection_user: "guest",
        };
        let worker_headers = dlqctl::core::retry::retry_copy(&sample, &ctx, None)
            .headers()
            .clone()
            .unwrap_or_default();
        // Rounds of the three, in turn, the order reversed in every other
        // round: each side's mean place is the same, so that a drift of
        // the machine's load favours none.
        let mut ratios = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut rates = [0.0f64; 3];
            let order: [usize; 3] = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
            for which in order {
                common::purge(&s.conn, &tier).await;
                s.preload(&p.name, n_retry).await;
                let label = |what: &str| format!("{what}, round {}", round + 1);
                rates[which] = match which {
                    0 => {
                        measure(
                            &label("raw consume+confirmed republish+ack (pipelined)"),
                            n_retry,
                            raw_republish(&s, &p.name, &ex, key, n_retry, 200, 1, None),
                        )
                        .await
                    }
                    1 => {
                        let h = Some(&worker_headers);
                        measure(
                            &label("raw, pipelined, copies with the worker's headers"),
                            n_retry,
                            raw_republish(&s, &p.name, &ex, key, n_retry, 200, 1, h),
                        )
                        .await
                    }
                    _ => {
                        let failing =
                            handler_fn(|_m: HandlerMessage| async { Outcome::transient("down") });
                        measure(
                            &label("Worker retry path (prefetch 200, concurrency 200)"),
                            n_retry,
                            worker_run(&s, &p, failing, n_retry, 200, 200),
                        )
                        .await
                    }
                };
            }
            println!(
                "  round {}: worker/raw {:.2} (target >= 1.0); worker/raw with the worker's headers {:.2}\n",
                round + 1,
                rates[2] / rates[0],
                rates[2] / rates[1]
            );
            ratios.0.push(rates[2] / rates[0]);
            ratios.1.push(rates[2] / rates[1]);
        }
        println!(
            "  median over {rounds} rounds: worker/raw {:.2}; worker/raw with the worker's headers {:.2}",
            median(&mut ratios.0),
            median(&mut ratios.1)
        );
        // For scale: what the one-return-safe way costs a raw loop.
        common::purge(&s.conn, &tier).await;
        s.preload(&p.name, n_retry).await;
        measure(
            "raw, one copy in flight per channel (200 channels)",
            n_retry,
            raw_republish(&s, &p.name, &ex, key, n_retry, 200, 200, None),
        )
        .await;
        println!();
        s.cleanup(&p).await;
    }

    // 8. the idempotency guard
    if only(8) {
        guard_bench(&s, rounds.max(3)).await;
    }

    // 3. exec handler
    if only(3) {
        let p = s.pipeline("exec", "[1h]", 5).await;
        s.preload(&p.name, n_exec).await;
        let raw = row(
            "hand-written consume-spawn(/bin/true)-ack loop",
            n_exec,
            raw_exec(&s, &p.name, n_exec).await,
        );
        let mut wk8 = 0.0;
        for conc in [1usize, 8] {
            s.preload(&p.name, n_exec).await;
            let h = ExecHandler::new("/bin/true", vec![], Duration::from_secs(30));
            let wk = row(
                &format!("Worker exec /bin/true, concurrency {conc}"),
                n_exec,
                worker_run(&s, &p, h, n_exec, 50, conc).await,
            );
            println!(
                "  ratio worker/hand-written: {:.2}{}",
                wk / raw,
                if conc == 8 {
                    " (target >= 2)"
                } else {
                    " (target >= 1)"
                }
            );
            wk8 = wk;
        }
        s.preload(&p.name, n_exec).await;
        match pika_exec(&p.name, n_exec).await {
            Ok(d) => {
                let pika = row("hand-written pika worker (spawn /bin/true, ack)", n_exec, d);
                println!(
                    "  ratio worker concurrency 8/pika: {:.2} (target >= 2)",
                    wk8 / pika
                );
            }
            Err(why) => println!("pika peer skipped: {why}"),
        }
        println!();
        s.cleanup(&p).await;
    }

    // 4. memory: the binary over many messages through an HTTP handler.
    if only(4) {
        let app = axum::Router::new().route("/", axum::routing::post(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let url = format!("http://{addr}/");
        binary_rss(
            &s,
            "rss",
            n_rss,
            &["--prefetch", "200", "--concurrency", "32", "--http", &url],
            "dlqctl work --http (prefetch 200, concurrency 32)",
        )
        .await;
        println!();
    }

    // 5. the JSON-lines handler: one Python process against a Python
    // script per message (the same logic: parse the JSON body, succeed),
    // and against the in-process no-op handler.
    if only(5) {
        let dir = std::env::temp_dir().join(format!("{}-py", s.prefix));
        std::fs::create_dir_all(&dir).expect("dir");
        let exec_py = dir.join("exec.py");
        std::fs::write(&exec_py, EXEC_PY).expect("exec.py");
        let jsonl_py = dir.join("jsonl.py");
        std::fs::write(&jsonl_py, JSONL_PY).expect("jsonl.py");
        let python = if std::path::Path::new("/usr/bin/python3").exists() {
            "/usr/bin/python3"
        } else {
            "python3"
        };
        let p = s.pipeline("jsonl", "[1h]", 5).await;
        s.preload(&p.name, n_exec_py).await;
        let h = ExecHandler::new(
            python,
            vec![exec_py.clone().into()],
            Duration::from_secs(30),
        );
        let exec = measure(
            "exec python3 per message (concurrency 8)",
            n_exec_py,
            worker_run(&s, &p, h, n_exec_py, 8, 8),
        )
        .await;
        let mut jsonl_rate = 0.0;
        let mut noop_rate = 0.0;
        for round in 0..rounds {
            s.preload(&p.name, n_jsonl).await;
            let mut jc = JsonlConfig::new(python, vec![jsonl_py.clone().into()], &p.name);
            jc.max_in_flight = 64;
            let children0 = handler_children_cpu_time();
            let h = Arc::new(JsonlHandler::start(jc));
            let r = measure(
                &format!(
                    "--jsonl, one python3 process (concurrency 64), round {}",
                    round + 1
                ),
                n_jsonl,
                worker_run(&s, &p, h.clone(), n_jsonl, 64, 64),
            )
            .await;
            h.shutdown().await;
            // The Python process, reaped by the shutdown (its start
            // included, about 1 µs a message over 20,000).
            println!(
                "{:<58} {:>7.1} µs CPU/msg in the python3 process",
                "",
                handler_children_cpu_time()
                    .saturating_sub(children0)
                    .as_secs_f64()
                    * 1e6
                    / n_jsonl as f64
            );
            s.preload(&p.name, n_jsonl).await;
            let noop = handler_fn(|_m: HandlerMessage| async { Outcome::Success });
            let n = measure(
                &format!(
                    "in-process no-op handler (concurrency 64), round {}",
                    round + 1
                ),
                n_jsonl,
                worker_run(&s, &p, noop, n_jsonl, 64, 64),
            )
            .await;
            println!("  ratio --jsonl/no-op this round: {:.2}", r / n);
            jsonl_rate += r;
            noop_rate += n;
        }
        println!(
            "  ratio --jsonl/exec python: {:.1} (target >= 20); --jsonl/no-op: {:.2} (goal >= 0.9, issue 26)",
            jsonl_rate / rounds as f64 / exec,
            jsonl_rate / noop_rate
        );
        s.cleanup(&p).await;
        binary_rss(
            &s,
            "jsonl-rss",
            n_rss,
            &[
                "--prefetch",
                "200",
                "--concurrency",
                "200",
                "--jsonl",
                "--",
                python,
                jsonl_py.to_str().unwrap_or_default(),
            ],
            "dlqctl work --jsonl python3 (prefetch 200, concurrency 200)",
        )
        .await;
        let _ = std::fs::remove_dir_all(&dir);
    }
    // 6. soak: a million messages through `dlqctl work --http`, published
    // while it runs; the peak RSS after the first 100,000 and at the end.
    if only(6) {
        let addr = http_sink().await;
        let url = format!("http://{addr}/");
        let n = env_number("BENCH_SOAK_N", 1_000_000);
        binary_run(
            &s,
            BinaryRun {
                name: "soak",
                n,
                body: None,
                args: &["--prefetch", "200", "--concurrency", "32", "--http", &url],
                label: "soak: dlqctl work --http (prefetch 200, concurrency 32)",
                feed: true,
                checkpoint: Some(n.min(100_000)),
            },
        )
        .await;
        println!("  (target: < 50 MiB, no growth after the first 100,000)\n");
    }

    // 7. large bodies through each handler kind: peak RSS against body ×
    // concurrency.
    if only(7) {
        let addr = http_sink().await;
        let url = format!("http://{addr}/");
        let dir = std::env::temp_dir().join(format!("{}-big", s.prefix));
        std::fs::create_dir_all(&dir).expect("dir");
        let jsonl_py = dir.join("jsonl.py");
        std::fs::write(&jsonl_py, JSONL_PY).expect("jsonl.py");
        let jsonl_py = jsonl_py.to_str().unwrap_or_default().to_string();
        let python = if std::path::Path::new("/usr/bin/python3").exists() {
            "/usr/bin/python3"
        } else {
            "python3"
        };
        for (mib, n, conc) in [
            (1usize, env_number("BENCH_BIG1_N", 200), 4usize),
            (50, env_number("BENCH_BIG50_N", 6), 2),
        ] {
            let body =
                format!("{{\"order\":\"{}\"}}", "x".repeat(mib * 1024 * 1024 - 12)).into_bytes();
            let c = conc.to_string();
            let kinds: [(&str, Vec<&str>); 3] = [
                ("exec", vec!["--", "sh", "-c", "cat > /dev/null"]),
                ("http", vec!["--http", &url]),
                ("jsonl", vec!["--jsonl", "--", python, &jsonl_py]),
            ];
            for (kind, handler) in kinds {
                let mut args = vec!["--concurrency", &c, "--handler-timeout", "120s"];
                args.extend(handler.iter().copied());
                let label = format!("{kind}, {mib} MiB bodies, concurrency {conc}");
                let peak = binary_run(
                    &s,
                    BinaryRun {
                        name: &format!("big-{kind}-{mib}"),
                        n,
                        body: Some(body.clone()),
                        args: &args,
                        label: &label,
                        feed: false,
                        checkpoint: None,
                    },
                )
                .await;
                println!(
                    "  peak RSS / (body × concurrency): {:.1}",
                    peak as f64 / 1024.0 / (mib * conc) as f64
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    let _ = s.conn.close(200, "bye".into()).await;
}

/// An HTTP server that reads every body whole and answers 200.
async fn http_sink() -> std::net::SocketAddr {
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::post(|body: axum::body::Bytes| async move {
                std::hint::black_box(body.len());
                "ok"
            }),
        )
        .layer(axum::extract::DefaultBodyLimit::disable());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A redis-server of the bench's own on a free port, killed when dropped.
struct BenchRedis {
    port: u16,
    child: std::process::Child,
}

impl BenchRedis {
    fn start() -> Option<BenchRedis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        for _ in 0..50 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(BenchRedis { port, child });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn flush(&self) {
        let _ = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "flushall"])
            .stdout(std::process::Stdio::null())
            .status();
    }
}

impl Drop for BenchRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `p` guarded by `store` (none: unguarded).
fn guarded(p: &Pipeline, store: Option<dlqctl::core::idempotency::StoreSpec>) -> Pipeline {
    let mut p = p.clone();
    p.idempotency = store.map(|store| dlqctl::core::idempotency::Idempotency {
        store,
        ..Default::default()
    });
    p
}

/// Scenario 8: the guard's cost, side by side with no guard.
async fn guard_bench(s: &Setup, rounds: usize) {
    use dlqctl::core::idempotency::StoreSpec;
    let n = env_number("BENCH_GUARD_N", 10_000);
    let n_exec = env_number("BENCH_EXEC_N", 600);
    let dir = std::env::temp_dir().join(format!("dlqctl-bench-guard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a bench directory");
    let redis = BenchRedis::start();
    if redis.is_none() {
        println!("(redis-server did not start: the Redis rows are left out)");
    }
    let p = s.pipeline("guard", "[1h]", 5).await;
    let (mut sqlite, mut redis_ratio, mut exec) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut rates = [0.0f64; 3];
        let order: [usize; 3] = [[0, 1, 2], [1, 2, 0], [2, 0, 1]][round % 3];
        for which in order {
            let store = match which {
                0 => None,
                1 => Some(StoreSpec::Sqlite(Some(
                    dir.join(format!("r{round}.db")).display().to_string(),
                ))),
                _ => match &redis {
                    Some(r) => {
                        r.flush();
                        Some(StoreSpec::Redis(r.url()))
                    }
                    None => continue,
                },
            };
            let name = ["no guard", "SQLite guard", "Redis guard"][which];
            s.preload(&p.name, n).await;
            let noop = handler_fn(|_m: HandlerMessage| async { Outcome::Success });
            rates[which] = measure(
                &format!(
                    "Worker, no-op handler, {name} (prefetch 200, conc. 200), round {}",
                    round + 1
                ),
                n,
                worker_run(s, &guarded(&p, store), noop, n, 200, 200),
            )
            .await;
        }
        sqlite.push(rates[1] / rates[0]);
        if redis.is_some() {
            redis_ratio.push(rates[2] / rates[0]);
        }
        let mut exec_rates = [0.0f64; 2];
        for which in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
            let store = (which == 1).then(|| {
                StoreSpec::Sqlite(Some(dir.join(format!("e{round}.db")).display().to_string()))
            });
            s.preload(&p.name, n_exec).await;
            let h = ExecHandler::new("/bin/true", vec![], Duration::from_secs(30));
            exec_rates[which] = row(
                &format!(
                    "Worker exec /bin/true, conc. 8, {}, round {}",
                    ["no guard", "SQLite guard"][which],
                    round + 1
                ),
                n_exec,
                worker_run(s, &guarded(&p, store), h, n_exec, 50, 8).await,
            );
        }
        exec.push(exec_rates[1] / exec_rates[0]);
    }
    println!("  ratio SQLite guard/no guard, no-op handler: median {:.2} of {sqlite:.2?} (target >= 0.75)", median(&mut sqlite.clone()));
    if !redis_ratio.is_empty() {
        println!("  ratio Redis guard/no guard, no-op handler: median {:.2} of {redis_ratio:.2?} (target >= 0.75)", median(&mut redis_ratio.clone()));
    }
    println!("  ratio SQLite guard/no guard, exec /bin/true: median {:.2} of {exec:.2?} (target >= 0.95)\n", median(&mut exec.clone()));
    s.cleanup(&p).await;
    let _ = std::fs::remove_dir_all(&dir);
}
