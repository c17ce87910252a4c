//! `cargo bench --bench dlq`: the DLQ commands at scale, each beside a
//! baseline measured in the same run (figures are printed, nothing is
//! asserted: absolute times on shared machines are noise).
//!
//! - **replay** of N messages (default 100,000; `BENCH_DLQ_N`) from a
//!   quorum DLQ to its main queue, against RabbitMQ's own move: a dynamic
//!   shovel with `src-delete-after: queue-length` and `ack-mode:
//!   on-confirm` between the same queues. Needs the `rabbitmq_shovel` and
//!   `rabbitmq_shovel_management` plugins. Two pairs, A B A B.
//! - **summary** and **peek --limit 10000** of the same N: wall time and
//!   peak RSS of the dlqctl process, against a raw lapin read of the same
//!   queue (unlimited prefetch, nothing acked, then closed: the least work
//!   a read can do, without dlqctl's bounds).
//!
//! Needs the broker of the integration tests (`AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`) and its management API
//! (`DLQCTL_MANAGEMENT_URL` without credentials, default
//! `http://127.0.0.1:15672`; guest/guest). Without the shovel plugins the
//! replay is measured alone and the bench says the peer is missing.
//! Everything is created under a unique prefix and deleted at the end.
//!
//! `BENCH_DLQ_PIN=1` splits the CPUs for the replay rounds: the broker on
//! the first, the bench and dlqctl on the rest (restored at the end), as
//! when dlqctl runs on a host of its own.
//!
//! Each replay round also prints the CPU time per message of the dlqctl
//! process and of the broker (found by its listening port), and the load
//! average: a replay slower than the shovel while using less CPU is bound
//! by round trips, not by work. For profiling by hand, `target/release/deps/
//! dlq-* --fill QUEUE N` fills QUEUE with N DLQ records and exits.

// A test or a benchmark may be as long as its scenario or its table:
// the length rule (clippy::too_many_lines) is for the code they run.
#![allow(clippy::too_many_lines)]

mod common;
#[path = "common/cpu.rs"]
#[allow(dead_code)] // shared by the benches: not every item is used by each
mod cpu;
#[path = "common/pin.rs"]
mod pin;

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use std::process::Command;
use std::time::{Duration, Instant};

/// The broker: `AMQP_URL`, as the integration tests and `dlqctl` read it.
fn url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The management API's base (`.../api`), from `DLQCTL_MANAGEMENT_URL`.
fn mgmt() -> String {
    let base =
        std::env::var("DLQCTL_MANAGEMENT_URL").unwrap_or_else(|_| "http://127.0.0.1:15672".into());
    format!("{}/api", base.trim_end_matches('/'))
}

/// Whether the shovel plugins are enabled: `rabbitmq_shovel_management`
/// (which needs `rabbitmq_shovel`) serves `/api/shovels`.
async fn shovel_plugin_enabled(http: &reqwest::Client) -> bool {
    http.get(format!("{}/shovels", mgmt()))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

fn n() -> usize {
    common::env_number("BENCH_DLQ_N", 100_000)
}

/// Wall time and peak RSS (KiB) of a finished child.
struct Measured {
    wall: Duration,
    max_rss_kib: i64,
    /// CPU time (user + system) of that process.
    cpu: Duration,
    status: i32,
    stdout: String,
}

/// Runs `cmd` and measures it with wait4 (peak RSS of that process only).
fn measure(cmd: &mut Command) -> Measured {
    let out = tempfile_path("out");
    let f = std::fs::File::create(&out).expect("stdout file");
    let start = Instant::now();
    let child = cmd
        .stdout(f)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child; status and usage are valid for writes.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4");
    let wall = start.elapsed();
    std::mem::forget(child);
    Measured {
        wall,
        max_rss_kib: usage.ru_maxrss,
        cpu: cpu::rusage_cpu(&usage),
        status: libc::WEXITSTATUS(status),
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
    }
}

fn tempfile_path(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("dlqctl-bench-{}-{what}", std::process::id()))
}

async fn fill(conn: &Connection, queue: &str, n: usize) {
    common::fill(conn, queue, n, |k| format!("order {} not found", k % 97)).await;
}

async fn depth(conn: &Connection, queue: &str) -> u64 {
    dlqctl::amqp::declare::ready_messages(conn, queue)
        .await
        .map_or(0, u64::from)
}

async fn shovel(http: &reqwest::Client, name: &str, src: &str, dest: &str) {
    let body = serde_json::json!({"value": {
        "src-protocol": "amqp091", "src-uri": "amqp://", "src-queue": src,
        "dest-protocol": "amqp091", "dest-uri": "amqp://", "dest-queue": dest,
        "src-delete-after": "queue-length", "ack-mode": "on-confirm"
    }});
    let r = http
        .put(format!("{}/parameters/shovel/%2F/{name}", mgmt()))
        .basic_auth("guest", Some("guest"))
        .json(&body)
        .send()
        .await
        .expect("the management API");
    assert!(
        r.status().is_success(),
        "shovel: {} {} (enable rabbitmq_shovel and rabbitmq_shovel_management)",
        r.status(),
        r.text().await.unwrap_or_default()
    );
}

/// The raw baseline for a read: drains N messages with a plain lapin
/// consumer (prefetch 2,000, an ack with `multiple` every 1,000), the
/// floor for any read of the queue. (It cannot leave them unacked: a
/// quorum queue stops delivering to an unlimited-prefetch consumer after a
/// few thousand unacked messages.) Run as `dlq-bench --raw-read QUEUE N`;
/// the bench refills the queue after it.
async fn raw_read(queue: &str, n: usize) {
    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    ch.basic_qos(prefetch(), BasicQosOptions::default())
        .await
        .expect("qos");
    let mut c = ch
        .basic_consume(
            queue.into(),
            "raw".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut seen = 0;
    let mut bytes = 0usize;
    while seen < n {
        match c.next().await {
            Some(Ok(d)) => {
                seen += 1;
                bytes += d.data.len();
                if seen % 1000 == 0 || seen == n {
                    ch.basic_ack(
                        d.delivery_tag,
                        lapin::options::BasicAckOptions { multiple: true },
                    )
                    .await
                    .expect("ack");
                }
            }
            _ => break,
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = ch.close(200, "".into()).await;
    let _ = conn.close(200, "".into()).await;
    println!("{seen} {bytes}");
}

fn dlqctl(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlqctl"));
    c.args(args);
    c
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--raw-read") {
        raw_read(&args[i + 1], args[i + 2].parse().expect("N")).await;
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--fill") {
        // For profiling a command by hand: `dlq-bench --fill QUEUE N`.
        let conn = Connection::connect(&url(), ConnectionProperties::default())
            .await
            .expect("the broker");
        fill(&conn, &args[i + 1], args[i + 2].parse().expect("N")).await;
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --all-targets` and
    // nextest (`--list ...`) run this binary as a test: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n = n();
    let bench = common::BenchPipeline::provision("dlq");
    let (name, dlq, f) = (bench.name.clone(), bench.dlq.clone(), bench.file.clone());

    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .expect("the broker");
    let http = reqwest::Client::new();

    println!("# dlq bench: N = {n} messages (~200 bytes, dlqctl headers), quorum queues");
    println!("\n## replay of N to the main queue vs a dynamic shovel (src-delete-after: queue-length, on-confirm)");
    let rounds = common::env_number("BENCH_ROUNDS", 2);
    let with_shovel = shovel_plugin_enabled(&http).await;
    if !with_shovel {
        println!(
            "PEER MISSING: the rabbitmq_shovel plugins are not enabled on the broker ({}/shovels \
             does not answer); the replay is measured alone, with no ratio. Enable them with \
             `rabbitmq-plugins enable rabbitmq_shovel rabbitmq_shovel_management`.",
            mgmt()
        );
    }
    // The broker's CPU per message is shown when it runs here.
    let broker = cpu::local_broker_pid(&url());
    // BENCH_DLQ_PIN=1: the broker on one CPU, dlqctl (and this bench) on
    // the others, as when dlqctl runs on a host of its own; otherwise the
    // two compete for the same cores, and the shovel, inside the broker,
    // does not pay for a client.
    let pinned = match (std::env::var("BENCH_DLQ_PIN").as_deref(), broker) {
        (Ok("1"), Some(pid)) => {
            match pin::Pinned::split(pid) {
                Ok(p) => {
                    println!("pinned: the broker (pid {pid}) on CPU 0, dlqctl and this bench on the others");
                    Some(p)
                }
                Err(e) => panic!("BENCH_DLQ_PIN=1: cannot pin: {e}"),
            }
        }
        (Ok("1"), None) => panic!("BENCH_DLQ_PIN=1 needs the broker on this machine"),
        _ => None,
    };
    let broker_cpu = || broker.and_then(cpu::process_cpu);
    let per_msg = |d: Option<Duration>| {
        d.map_or("?".to_string(), |d| {
            format!("{:.0}", d.as_secs_f64() * 1e6 / n as f64)
        })
    };
    println!(
        "load average at the start: {}; CPU per message in µs (broker: {})",
        cpu::load_average(),
        broker.map_or("not local, not shown".to_string(), |p| format!("pid {p}"))
    );
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        fill(&conn, &dlq, n).await;
        let before = broker_cpu();
        let m = measure(&mut dlqctl(&[
            "dlq", "replay", &f, "--queue", &name, "--json",
        ]));
        assert_eq!(m.status, 0, "replay: {}", m.stdout);
        let moved = serde_json::from_str::<serde_json::Value>(&m.stdout)
            .ok()
            .and_then(|v| v["moved"].as_u64())
            .unwrap_or(0);
        let ours = moved as f64 / m.wall.as_secs_f64();
        let our_broker = broker_cpu().zip(before).map(|(a, b)| a.saturating_sub(b));
        common::purge(&conn, &name).await;
        if !with_shovel {
            println!(
                "round {round}: dlqctl replay {moved} in {:.2}s = {ours:.0} msg/s (peak RSS {} MiB); shovel: not measured (plugin missing)",
                m.wall.as_secs_f64(),
                m.max_rss_kib / 1024,
            );
            continue;
        }

        fill(&conn, &dlq, n).await;
        let sname = format!("{name}-shovel-{round}");
        let before = broker_cpu();
        let start = Instant::now();
        shovel(&http, &sname, &dlq, &name).await;
        while depth(&conn, &name).await < n as u64 && start.elapsed() < Duration::from_secs(600) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let wall = start.elapsed();
        let their_broker = broker_cpu().zip(before).map(|(a, b)| a.saturating_sub(b));
        let theirs = n as f64 / wall.as_secs_f64();
        common::purge(&conn, &name).await;
        let _ = http
            .delete(format!("{}/parameters/shovel/%2F/{sname}", mgmt()))
            .basic_auth("guest", Some("guest"))
            .send()
            .await;
        println!(
            "round {round}: dlqctl replay {moved} in {:.2}s = {ours:.0} msg/s (peak RSS {} MiB; CPU/msg dlqctl {:.0}, broker {}); shovel {n} in {:.2}s = {theirs:.0} msg/s (CPU/msg broker {}); ratio dlqctl/shovel {:.2}",
            m.wall.as_secs_f64(),
            m.max_rss_kib / 1024,
            m.cpu.as_secs_f64() * 1e6 / n as f64,
            per_msg(our_broker),
            wall.as_secs_f64(),
            per_msg(their_broker),
            ours / theirs
        );
        ratios.push(ours / theirs);
    }
    println!("replay ÷ shovel, per pair: {ratios:.2?}");

    drop(pinned);
    println!("\n## summary and peek of N (the DLQ is left as it was), vs a raw drain of N");
    fill(&conn, &dlq, n).await;
    let me = std::env::current_exe().expect("self");
    for round in 1..=2 {
        let s = measure(&mut dlqctl(&[
            "dlq", "summary", &f, "--queue", &name, "--json",
        ]));
        assert_eq!(s.status, 0, "summary");
        let p = measure(&mut dlqctl(&[
            "dlq", "peek", &f, "--queue", &name, "--limit", "10000", "--json",
        ]));
        assert_eq!(p.status, 0, "peek");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let raw = measure(Command::new(&me).args(["--raw-read", &dlq, &n.to_string()]));
        assert_eq!(raw.status, 0, "raw read");
        fill(&conn, &dlq, n).await;
        println!(
            "round {round}: summary {:.2}s, peak RSS {} MiB | peek --limit 10000 {:.2}s, peak RSS {} MiB | raw drain of N {:.2}s, peak RSS {} MiB | summary÷raw time {:.2}",
            s.wall.as_secs_f64(),
            s.max_rss_kib / 1024,
            p.wall.as_secs_f64(),
            p.max_rss_kib / 1024,
            raw.wall.as_secs_f64(),
            raw.max_rss_kib / 1024,
            s.wall.as_secs_f64() / raw.wall.as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!("  DLQ depth after: {}", depth(&conn, &dlq).await);
    }

    bench.delete(&conn).await;
    let _ = std::fs::remove_file(tempfile_path("out"));
}

fn prefetch() -> u16 {
    std::env::var("BENCH_RAW_PREFETCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}
