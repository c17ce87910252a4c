//! `cargo bench --bench provision`: dlqctl's parallel provision against a
//! baseline that declares the same objects one at a time on one channel.
//!
//! Needs the broker of the integration tests (`AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`). Builds a topology of 100
//! pipelines × 4 retry tiers (1,500 objects) under a unique prefix for each
//! side, measures a cold run and a no-op re-run of each, prints a table and
//! deletes everything it created.

use dlqctl::amqp::connection::{field_table, BrokerUrl};
use dlqctl::core::topology::{parse_topology, plan, ExchangeType, Plan};
use futures_util::stream::{self, StreamExt};
use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::{Connection, ExchangeKind};
use std::time::{Duration, Instant};

const PIPELINES: usize = 100;
/// dlqctl's default; `BENCH_PARALLELISM` overrides it to compare.
fn parallelism() -> usize {
    std::env::var("BENCH_PARALLELISM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(dlqctl::ops::provision::DEFAULT_PARALLELISM)
}

fn topology(prefix: &str) -> String {
    let mut y = String::from(
        "version: 1\ndefaults:\n  retry: { delays: [1s, 10s, 1m, 10m], max_attempts: 5 }\n  dead_letter: { ttl: 1d }\npipelines:\n",
    );
    for i in 0..PIPELINES {
        y += &format!(
            "  - name: {prefix}-p{i:03}\n    exchange: {{ name: {prefix}-p{i:03}-in, type: topic, bindings: [\"k.#\"] }}\n"
        );
    }
    y
}

fn kind(k: ExchangeType) -> ExchangeKind {
    match k {
        ExchangeType::Direct => ExchangeKind::Direct,
        ExchangeType::Topic => ExchangeKind::Topic,
        ExchangeType::Fanout => ExchangeKind::Fanout,
        ExchangeType::Headers => ExchangeKind::Headers,
    }
}

/// The same objects, in the same order, one at a time on one channel.
async fn baseline(conn: &Connection, plan: &Plan) -> Duration {
    let start = Instant::now();
    let ch = conn.create_channel().await.expect("channel");
    for e in &plan.exchanges {
        ch.exchange_declare(
            e.name.as_str().into(),
            kind(e.kind),
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .expect("exchange.declare");
    }
    for q in &plan.queues {
        ch.queue_declare(
            q.name.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            field_table(&q.arguments),
        )
        .await
        .expect("queue.declare");
    }
    for b in &plan.bindings {
        ch.queue_bind(
            b.queue.as_str().into(),
            b.exchange.as_str().into(),
            b.routing_key.as_str().into(),
            QueueBindOptions::default(),
            field_table(&b.arguments),
        )
        .await
        .expect("queue.bind");
    }
    let _ = ch.close(200, "done".into()).await;
    start.elapsed()
}

async fn dlqctl_provision(conn: &Connection, plan: &Plan) -> Duration {
    let report = dlqctl::ops::provision::provision(conn, plan, parallelism())
        .await
        .expect("provision");
    assert!(
        !report.has_differences(),
        "provision found differences: {:?}",
        report.findings
    );
    assert_eq!(report.ok, plan.len());
    report.elapsed
}

/// Deletes every queue and exchange of `plan`, 16 at a time.
async fn delete(conn: &Connection, plan: &Plan) {
    let names: Vec<(bool, String)> = plan
        .queues
        .iter()
        .map(|q| (true, q.name.clone()))
        .chain(plan.exchanges.iter().map(|e| (false, e.name.clone())))
        .collect();
    let failures: Vec<String> = stream::iter(names)
        .map(|(is_queue, name)| async move {
            let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
            let r = if is_queue {
                ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await
                    .map(|_| ())
            } else {
                ch.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                    .await
            };
            let _ = ch.close(200, "done".into()).await;
            r.map_err(|e| format!("{name}: {e}"))
        })
        .buffer_unordered(16)
        .filter_map(|r| async move { r.err() })
        .collect()
        .await;
    if !failures.is_empty() {
        eprintln!("cleanup failures: {}", failures.join("; "));
    }
}

fn prefix() -> String {
    format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

fn plan_for(prefix: &str) -> Plan {
    let t = parse_topology(&topology(prefix), "bench.yaml").expect("a valid topology");
    plan(&t)
}

async fn run() -> std::process::ExitCode {
    let url =
        std::env::var("AMQP_URL").unwrap_or_else(|_| dlqctl::amqp::connection::DEFAULT_URL.into());
    let url = BrokerUrl::parse(&url).expect("AMQP_URL");
    let conn = match url.connect("dlqctl bench provision").await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let (pa, pb) = (prefix(), prefix());
    let (plan_a, plan_b) = (plan_for(&pa), plan_for(&pb));
    println!(
        "{PIPELINES} pipelines x 4 tiers: {} exchanges, {} queues, {} bindings per side (prefixes {pa}, {pb})",
        plan_a.exchanges.len(),
        plan_a.queues.len(),
        plan_a.bindings.len()
    );

    // Each side runs in a task so that a panic still reaches the cleanup.
    let conn = std::sync::Arc::new(conn);
    let (c, a, b) = (conn.clone(), plan_a.clone(), plan_b.clone());
    let measured = tokio::spawn(async move {
        let d_cold = dlqctl_provision(&c, &a).await;
        let d_again = dlqctl_provision(&c, &a).await;
        let b_cold = baseline(&c, &b).await;
        let b_again = baseline(&c, &b).await;
        (d_cold, d_again, b_cold, b_again)
    })
    .await;

    let _ = conn.close(200, "bye".into()).await;
    // The cleanup has a connection of its own: on the measured one, the
    // channels that a passive declare's 404 closed (thousands of them)
    // have made lapin reuse channel ids, and a new channel on a reused id
    // was seen failing with the old channel's error (NOT_FOUND for an
    // object of the other side), which left objects behind.
    let cleanup = Instant::now();
    match url.connect("dlqctl bench provision cleanup").await {
        Ok(c) => {
            delete(&c, &plan_a).await;
            delete(&c, &plan_b).await;
            let _ = c.close(200, "bye".into()).await;
        }
        Err(e) => eprintln!("cleanup: {e}"),
    }
    let cleanup = cleanup.elapsed();

    let Ok((d_cold, d_again, b_cold, b_again)) = measured else {
        eprintln!("the benchmark failed (everything it created was deleted)");
        return std::process::ExitCode::FAILURE;
    };
    println!();
    println!(
        "{:<10} {:>14} {:>20} {:>10}",
        "run", "dlqctl (s)", "baseline 1-by-1 (s)", "ratio"
    );
    for (name, d, b) in [("cold", d_cold, b_cold), ("re-run", d_again, b_again)] {
        println!(
            "{:<10} {:>14.3} {:>20.3} {:>9.1}x",
            name,
            d.as_secs_f64(),
            b.as_secs_f64(),
            b.as_secs_f64() / d.as_secs_f64()
        );
    }
    println!(
        "(parallelism {}; cleanup took {:.1}s)",
        parallelism(),
        cleanup.as_secs_f64()
    );
    std::process::ExitCode::SUCCESS
}

fn main() -> std::process::ExitCode {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` and
    // nextest (`--list ...`) run this binary as a test: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return std::process::ExitCode::SUCCESS;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run())
}
