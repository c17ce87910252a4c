//! A worker embedded in a Rust service: the handler is a closure, the
//! topology comes from the same YAML `dlqctl provision` uses.
//!
//! ```text
//! cargo run --release -- provision topology/orders.yaml
//! cargo run --example embedded_worker -- topology/orders.yaml orders
//! ```
//!
//! Stops on Ctrl-C after finishing the message in flight.

use dlqctl::amqp::connection::{BrokerUrl, DEFAULT_URL};
use dlqctl::core::handling::outcome::Outcome;
use dlqctl::core::topology::parse_topology;
use dlqctl::handler::{handler_fn, HandlerMessage};
use dlqctl::worker::{Worker, WorkerConfig};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let mut args = std::env::args().skip(1);
    let file = args.next().unwrap_or_else(|| "topology/orders.yaml".into());
    let queue = args.next().unwrap_or_else(|| "orders".into());

    let text = std::fs::read_to_string(&file)?;
    let topology = parse_topology(&text, &file)?;
    let pipeline = topology
        .pipeline(&queue)
        .cloned()
        .ok_or_else(|| format!("no pipeline {queue} in {file}"))?;
    let url = BrokerUrl::parse(&std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_URL.into()))?;

    let mut cfg = WorkerConfig::new(pipeline, url);
    cfg.concurrency = 4;

    // The business logic: an async function from message to outcome.
    let handler = handler_fn(|msg: HandlerMessage| async move {
        let body = String::from_utf8_lossy(&msg.body);
        if body.contains("bad") {
            return Outcome::permanent(format!("cannot parse {body}"));
        }
        if msg.attempt < 2 {
            // e.g. the payment API timed out and asked us to wait
            return Outcome::Transient {
                error: "payment API timeout".into(),
                retry_after: Some(Duration::from_secs(1)),
            };
        }
        Outcome::Success
    });

    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    Worker::new(cfg, handler).run(stop).await?;
    Ok(())
}
