//! `cargo bench --bench http_retry`: the retry path of `dlqctl work
//! --http` beside a Rascal (Node.js) subscriber doing the same, in
//! alternating rounds of one run. Prints rates and ratios; asserts nothing.
//!
//! Both sides consume a fresh quorum queue preloaded with N messages
//! (default 5,000; `BENCH_RASCAL_N`) at prefetch 100 (`BENCH_RASCAL_PREFETCH`,
//! also dlqctl's concurrency) and POST each body to
//! the same HTTP server, in this process, which answers **503 the first
//! time it sees a message id and 200 the second time**. So every message
//! goes once through a retry tier: a quorum wait queue whose
//! `x-message-ttl` (`BENCH_RASCAL_DELAY_MS`, default 200) dead-letters it
//! back to the main queue.
//!
//! - **dlqctl**: `dlqctl work FILE --queue Q --http URL --prefetch 100
//!   --concurrency 100` (`RUST_LOG=warn`) on a pipeline with one tier of
//!   that delay, `jitter: 0`: a 503 is a transient failure, the worker
//!   publishes a confirmed copy to the tier and acks the original.
//! - **Rascal**: `benches/peers/rascal/rascal_http.js`, a subscriber with
//!   prefetch 100 that acks on 2xx and otherwise recovers with Rascal's
//!   `forward` strategy to a confirmed publication targeting the wait queue
//!   (declared with the same arguments as dlqctl's tier queue). Rascal's
//!   defaults otherwise, so at most 5 forwards are in flight (its confirm
//!   channel pool); `RASCAL_CONFIRM_POOL_MAX=N` in the environment raises
//!   that pool.
//!
//! Time runs from the server's first request to the N-th message's first
//! 200 (start-up and topology checks of both sides are left out). The
//! server also prints where the time went: the first pass (to the N-th
//! 503) and the tail (from there to the N-th 200). A copy back from the
//! tier joins the main queue behind the preloaded messages, so the 200s
//! start when the first pass ends, and the delay only counts where it
//! outlasts the first pass.
//! `BENCH_RASCAL_TIMELINE=1` prints the requests per 100 ms. Rounds
//! alternate dlqctl, Rascal, dlqctl, Rascal, ... (`BENCH_ROUNDS`, default
//! 2); each round prints the ratio dlqctl/Rascal, the CPU seconds of the
//! measured process, and of the HTTP server and the broker (when it runs on
//! this machine) during the run.
//!
//! The peer needs Node.js (`apt-get install nodejs npm` on Debian) and
//! Rascal, pinned in `benches/peers/rascal/package.json`:
//!
//! ```text
//! cd benches/peers/rascal && npm install      # node_modules is git-ignored
//! # or into a scratch folder:
//! npm install --prefix /tmp/rascal-peer rascal@21.0.1 amqplib@2.3.1
//! BENCH_RASCAL_DIR=/tmp/rascal-peer cargo bench --bench http_retry
//! ```
//!
//! Without them the bench prints `PEER MISSING: ...` with that command and
//! measures dlqctl alone. Needs the broker of the integration tests
//! (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`). Every
//! queue and exchange is created under a unique prefix and deleted at the
//! end of its round.

#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/harness.rs"]
mod harness;

use cpu::{load_average, local_broker_pid, process_cpu, rusage};

use harness::env_number;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use dlqctl::amqp::connection::{BrokerUrl, DEFAULT_URL};
use dlqctl::core::topology::{parse_topology, plan, Pipeline, Topology};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The install command printed when the peer is missing.
const INSTALL: &str = "cd benches/peers/rascal && npm install (or: npm install --prefix DIR rascal@21.0.1 amqplib@2.3.1, then BENCH_RASCAL_DIR=DIR)";

// ---------------------------------------------------------------------
// The HTTP server: 503 on a message id's first request, 200 after.

/// One side's run, as the server sees it.
struct Run {
    n: usize,
    /// Requests seen per message id (1: answered 503; 2 or more: 200).
    seen: HashMap<Vec<u8>, u32>,
    first: Option<Instant>,
    /// When the n-th message got its 503.
    first_pass_done: Option<Instant>,
    /// When the n-th message got its first 200.
    done_at: Option<Instant>,
    answered_503: usize,
    answered_200: usize,
    requests: usize,
    /// `requests` when the n-th message got its first 200.
    requests_at_done: usize,
    /// Requests without an `Idempotency-Key` (answered 400).
    without_id: usize,
    /// Requests per 100 ms from the first: (503s, 200s).
    timeline: Vec<(u32, u32)>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

#[derive(Default)]
struct Server {
    run: Mutex<Option<Run>>,
}

async fn answer(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    std::hint::black_box(body.len());
    let now = Instant::now();
    let mut guard = server.run.lock().expect("server state");
    let Some(run) = guard.as_mut() else {
        return StatusCode::SERVICE_UNAVAILABLE;
    };
    run.requests += 1;
    let Some(id) = headers.get("idempotency-key") else {
        run.without_id += 1;
        return StatusCode::BAD_REQUEST;
    };
    let first = *run.first.get_or_insert(now);
    let bucket = (now - first).as_millis() as usize / 100;
    if run.timeline.len() <= bucket {
        run.timeline.resize(bucket + 1, (0, 0));
    }
    let count = run.seen.entry(id.as_bytes().to_vec()).or_insert(0);
    *count += 1;
    if *count == 1 {
        run.answered_503 += 1;
        run.timeline[bucket].0 += 1;
        if run.answered_503 == run.n {
            run.first_pass_done = Some(now);
        }
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    run.timeline[bucket].1 += 1;
    if *count == 2 {
        run.answered_200 += 1;
        if run.answered_200 == run.n {
            run.done_at = Some(now);
            run.requests_at_done = run.requests;
            if let Some(done) = run.done.take() {
                let _ = done.send(());
            }
        }
    }
    StatusCode::OK
}

async fn serve() -> (Arc<Server>, String) {
    let server = Arc::new(Server::default());
    let app = axum::Router::new()
        .route("/", axum::routing::post(answer))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (server, format!("http://{addr}/"))
}

impl Server {
    /// Starts counting a run of `n` messages; the receiver fires at the
    /// n-th message's 200.
    fn start(&self, n: usize) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        *self.run.lock().expect("server state") = Some(Run {
            n,
            seen: HashMap::with_capacity(n),
            first: None,
            first_pass_done: None,
            done_at: None,
            answered_503: 0,
            answered_200: 0,
            requests: 0,
            requests_at_done: 0,
            without_id: 0,
            timeline: Vec::new(),
            done: Some(tx),
        });
        rx
    }

    fn finish(&self) -> Option<Run> {
        self.run.lock().expect("server state").take()
    }
}

// ---------------------------------------------------------------------
// The broker side.

struct Bench {
    url: BrokerUrl,
    raw_url: String,
    prefix: String,
    delay_ms: u64,
    n: usize,
    /// The prefetch of both sides, and dlqctl's concurrency.
    prefetch: u16,
    dir: PathBuf,
    /// The broker's process, when it listens on this machine.
    broker_pid: Option<u32>,
}

impl Bench {
    /// A connection of its own for each step: one step's failure (a
    /// connection the broker closed while a side ran) stays in that step.
    async fn connect(&self) -> Connection {
        self.url
            .connect("dlqctl bench http_retry")
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{e}\nthe benchmark needs RabbitMQ on {}: start it with `rabbitmq-server -detached`",
                    self.url.endpoint()
                )
            })
    }

    /// A dlqctl pipeline `PREFIX-NAME` with one tier, provisioned.
    async fn pipeline(&self, name: &str) -> (Pipeline, PathBuf) {
        let full = format!("{}-{name}", self.prefix);
        let yaml = format!(
            "version: 1\npipelines:\n  - name: {full}\n    retry: {{delays: [{}ms], max_attempts: 5, jitter: 0}}\n",
            self.delay_ms
        );
        let t = parse_topology(&yaml, "bench.yaml").expect("valid bench topology");
        let conn = self.connect().await;
        let r = dlqctl::ops::provision::provision(&conn, &plan(&t), 16)
            .await
            .expect("provision");
        let _ = conn.close(200, "ok".into()).await;
        assert!(!r.has_differences(), "{:?}", r.findings);
        let file = self.dir.join(format!("{name}.yaml"));
        std::fs::write(&file, yaml).expect("topology file");
        (t.pipelines[0].clone(), file)
    }

    async fn delete_pipeline(&self, p: &Pipeline) {
        let pl = plan(&Topology {
            pipelines: vec![p.clone()],
        });
        let conn = self.connect().await;
        let ch = conn.create_channel().await.expect("channel");
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
        let _ = conn.close(200, "ok".into()).await;
    }

    async fn delete_queues(&self, queues: &[&str]) {
        let conn = self.connect().await;
        let ch = conn.create_channel().await.expect("channel");
        for q in queues {
            let _ = ch
                .queue_delete((*q).into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = ch.close(200, "ok".into()).await;
        let _ = conn.close(200, "ok".into()).await;
    }

    /// Messages ready in each queue (`None` for a queue that is gone).
    async fn depths(&self, queues: &[&str]) -> Vec<Option<u32>> {
        let conn = self.connect().await;
        let mut out = Vec::new();
        for q in queues {
            // A passive declare of a missing queue closes its channel.
            let conn = self.connect().await;
            let ch = conn.create_channel().await.expect("channel");
            let d = ch
                .queue_declare(
                    (*q).into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .ok()
                .map(|q| q.message_count());
            out.push(d);
            let _ = ch.close(200, "ok".into()).await;
        }
        let _ = conn.close(200, "ok".into()).await;
        out
    }

    /// Publishes `n` persistent 256-byte JSON messages with ids `m0`...,
    /// confirmed.
    async fn preload(&self, queue: &str) {
        let body = format!("{{\"order\":\"{}\"}}", "x".repeat(244)).into_bytes();
        let conn = self.connect().await;
        let ch = conn.create_channel().await.expect("channel");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        let mut pending = Vec::with_capacity(1000);
        for i in 0..self.n {
            let props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(format!("m{i}").into());
            pending.push(
                ch.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &body,
                    props,
                )
                .await
                .expect("publish"),
            );
            if pending.len() == 1000 {
                for c in pending.drain(..) {
                    c.await.expect("confirm");
                }
            }
        }
        for c in pending {
            c.await.expect("confirm");
        }
        let _ = ch.close(200, "ok".into()).await;
        let _ = conn.close(200, "ok".into()).await;
    }
}

/// CPU used in a timed window: by this process's HTTP server, and by the
/// broker (shared with whatever else uses it).
struct Window {
    server: Duration,
    broker: Option<Duration>,
    broker_pid: Option<u32>,
}

impl Window {
    fn open(broker_pid: Option<u32>) -> Window {
        Window {
            server: rusage(libc::RUSAGE_SELF),
            broker: broker_pid.and_then(process_cpu),
            broker_pid,
        }
    }

    fn close(self) -> Window {
        Window {
            server: rusage(libc::RUSAGE_SELF).saturating_sub(self.server),
            broker: self
                .broker_pid
                .and_then(process_cpu)
                .zip(self.broker)
                .map(|(b, a)| b.saturating_sub(a)),
            broker_pid: self.broker_pid,
        }
    }
}

/// What one side's run measured.
struct Measured {
    rate: f64,
}

/// Waits for the server's n-th 200 (or the timeout), then prints the run.
/// Waits for the server's n-th 200; false after the timeout.
async fn wait_done(done: tokio::sync::oneshot::Receiver<()>, timeout: Duration) -> bool {
    tokio::time::timeout(timeout, done).await.is_ok()
}

/// The run as the server saw it, once the side was stopped; `None` (and a
/// line saying so) when it did not finish.
fn finished_run(label: &str, server: &Server, finished: bool, timeout: Duration) -> Option<Run> {
    let run = server.finish()?;
    if !finished {
        println!(
            "{label:<34} did not finish within {} s: {} of {} messages got their 200 ({} requests)",
            timeout.as_secs(),
            run.answered_200,
            run.n,
            run.requests
        );
        return None;
    }
    Some(run)
}

fn print_run(label: &str, run: &Run, cpu: Duration, window: &Window) -> Measured {
    let (first, done) = (
        run.first.expect("a request"),
        run.done_at.expect("the n-th 200"),
    );
    let el = done - first;
    let rate = run.n as f64 / el.as_secs_f64();
    println!(
        "{label:<34} {:>6} msgs {:>7.3} s {:>7.0} msg/s {:>7.0} requests/s",
        run.n,
        el.as_secs_f64(),
        rate,
        run.requests as f64 / el.as_secs_f64()
    );
    let pass = run.first_pass_done.map(|t| t - first).unwrap_or_default();
    print!(
        "{:<34} first pass {:.3} s, tail {:.3} s",
        "",
        pass.as_secs_f64(),
        (el - pass).as_secs_f64()
    );
    println!(
        "; CPU {:.2} s ({:.0} µs/msg, start-up included)",
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / run.n as f64
    );
    print!(
        "{:<34} meanwhile: HTTP server CPU {:.2} s",
        "",
        window.server.as_secs_f64()
    );
    if let Some(b) = window.broker {
        print!(
            ", broker CPU {:.2} s ({:.0} µs/msg; shared with its other users)",
            b.as_secs_f64(),
            b.as_secs_f64() * 1e6 / run.n as f64
        );
    }
    println!();
    let late = run.requests - run.requests_at_done;
    if run.without_id > 0 || run.requests_at_done != 2 * run.n || late > 0 {
        println!(
            "{:<34} {} requests until the {}-th 200 ({} without a message id), {} after it until the side stopped: repeats",
            "", run.requests_at_done, run.n, run.without_id, late
        );
    }
    if std::env::var("BENCH_RASCAL_TIMELINE").is_ok_and(|v| v == "1") {
        let line: Vec<String> = run
            .timeline
            .iter()
            .map(|(a, b)| format!("{a}/{b}"))
            .collect();
        println!("{:<34} 503s/200s per 100 ms: {}", "", line.join(" "));
    }
    Measured { rate }
}

/// One run of `dlqctl work --http` over a fresh pipeline.
async fn run_dlqctl(b: &Bench, server: &Server, url: &str, round: usize) -> Option<Measured> {
    let (p, file) = b.pipeline(&format!("dlqctl{round}")).await;
    b.preload(&p.name).await;
    let done = server.start(b.n);
    let prefetch = b.prefetch.to_string();
    let cpu0 = rusage(libc::RUSAGE_CHILDREN);
    let window = Window::open(b.broker_pid);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dlqctl"))
        .arg("work")
        .arg(&file)
        .args(["--queue", &p.name, "--http", url])
        .args(["--prefetch", &prefetch, "--concurrency", &prefetch])
        .env("RUST_LOG", "warn")
        .env("AMQP_URL", &b.raw_url)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn dlqctl work");
    let label = format!("dlqctl work --http, round {round}");
    let finished = wait_done(done, timeout()).await;
    let window = window.close();
    stop(&mut child).await;
    let cpu = rusage(libc::RUSAGE_CHILDREN).saturating_sub(cpu0);
    let run = finished_run(&label, server, finished, timeout());
    let measured = run.map(|r| print_run(&label, &r, cpu, &window));
    let tier = p.retry_queue(b.delay_ms);
    report_leftovers(b, &[&p.name, &tier]).await;
    b.delete_pipeline(&p).await;
    measured
}

/// Where the peer is, or why it cannot run.
struct Peer {
    node: String,
    script: PathBuf,
    node_path: PathBuf,
}

fn find_peer() -> Result<Peer, String> {
    let node = std::env::var("BENCH_NODE").unwrap_or_else(|_| "node".into());
    match std::process::Command::new(&node).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => {
            return Err(format!(
                "Node.js (`{node}`) does not run: apt-get install nodejs npm, then {INSTALL}"
            ))
        }
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/rascal");
    let dir = std::env::var("BENCH_RASCAL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| here.clone());
    let node_path = dir.join("node_modules");
    if !node_path.join("rascal/package.json").exists() {
        return Err(format!(
            "Rascal is not installed in {}: {INSTALL}",
            node_path.display()
        ));
    }
    Ok(Peer {
        node,
        script: here.join("rascal_http.js"),
        node_path,
    })
}

/// One run of the Rascal peer over fresh queues.
async fn run_rascal(
    b: &Bench,
    server: &Server,
    url: &str,
    peer: &Peer,
    round: usize,
) -> Result<Option<Measured>, String> {
    let main = format!("{}-rascal{round}", b.prefix);
    let wait = format!("{main}.retry.{}ms", b.delay_ms);
    let cpu0 = rusage(libc::RUSAGE_CHILDREN);
    let mut child = tokio::process::Command::new(&peer.node)
        .arg(&peer.script)
        .args([&b.raw_url, &main, &wait, &b.delay_ms.to_string(), url])
        .arg(b.prefetch.to_string())
        .env("NODE_PATH", &peer.node_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: {e}", peer.node))?;
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    if !matches!(ready, Ok(Ok(Some(ref l))) if l == "ready") {
        stop(&mut child).await;
        b.delete_queues(&[&main, &wait]).await;
        return Err(format!(
            "rascal_http.js did not declare its queues (its stderr is above): {ready:?}"
        ));
    }
    b.preload(&main).await;
    let done = server.start(b.n);
    let window = Window::open(b.broker_pid);
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").await.expect("go");
    stdin.flush().await.expect("go");
    let label = format!("Rascal forward, round {round}");
    let finished = wait_done(done, timeout()).await;
    let window = window.close();
    drop(stdin);
    stop(&mut child).await;
    let cpu = rusage(libc::RUSAGE_CHILDREN).saturating_sub(cpu0);
    let run = finished_run(&label, server, finished, timeout());
    let measured = run.map(|r| print_run(&label, &r, cpu, &window));
    report_leftovers(b, &[&main, &wait]).await;
    b.delete_queues(&[&main, &wait]).await;
    Ok(measured)
}

/// SIGTERM, then SIGKILL after 10 s; reaps the child.
async fn stop(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        // SAFETY: signalling our own child, which has not been reaped.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

async fn report_leftovers(b: &Bench, queues: &[&str]) {
    let depths = b.depths(queues).await;
    if depths.iter().any(|d| d.is_some_and(|d| d > 0)) {
        let parts: Vec<String> = queues
            .iter()
            .zip(depths)
            .map(|(q, d)| format!("{q}: {}", d.map_or("gone".into(), |d| d.to_string())))
            .collect();
        println!("{:<34} left in the queues: {}", "", parts.join(", "));
    }
}

fn timeout() -> Duration {
    Duration::from_secs(env_number("BENCH_RASCAL_TIMEOUT", 300))
}

fn main() {
    harness::bench_main(run());
}

async fn run() {
    let raw_url = std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_URL.into());
    let url = BrokerUrl::parse(&raw_url).expect("AMQP_URL");
    let prefix = format!("bench-httpretry-{}", std::process::id());
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).expect("dir");
    // The broker's CPU is shown when it runs here.
    let broker_pid = local_broker_pid(&raw_url);
    let b = Bench {
        url,
        raw_url,
        prefix,
        delay_ms: env_number("BENCH_RASCAL_DELAY_MS", 200).max(1),
        n: env_number("BENCH_RASCAL_N", 5_000).max(1) as usize,
        prefetch: env_number("BENCH_RASCAL_PREFETCH", 100).clamp(1, 1024) as u16,
        dir,
        broker_pid,
    };
    let rounds = env_number("BENCH_ROUNDS", 2).max(1) as usize;
    println!(
        "dlqctl work --http retry path vs Rascal (RabbitMQ at {}, quorum queues, prefetch {}, {} messages, one 503 then 200 each, tier {} ms)",
        b.url.endpoint(),
        b.prefetch,
        b.n,
        b.delay_ms
    );
    println!("load average at the start: {}\n", load_average());
    // Fails here, with the reason, when the broker is down.
    let _ = b.connect().await.close(200, "ok".into()).await;
    let (server, http_url) = serve().await;
    let peer = find_peer();
    if let Err(why) = &peer {
        println!("PEER MISSING: {why}; measuring dlqctl alone\n");
    }
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let d = run_dlqctl(&b, &server, &http_url, round).await;
        if let Ok(peer) = &peer {
            match run_rascal(&b, &server, &http_url, peer, round).await {
                Ok(r) => {
                    if let (Some(d), Some(r)) = (&d, r) {
                        let ratio = d.rate / r.rate;
                        println!("  ratio dlqctl/Rascal, round {round}: {ratio:.2} (goal >= 5)");
                        ratios.push(ratio);
                    }
                }
                Err(why) => println!("PEER FAILED: {why}"),
            }
        }
        println!();
    }
    if !ratios.is_empty() {
        let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "ratios dlqctl/Rascal by round: {} (goal >= 5)",
            shown.join(", ")
        );
    }
    println!("load average at the end: {}", load_average());
    let _ = std::fs::remove_dir_all(&b.dir);
}
