//! A worker embedded in a Rust service: the handler is a closure, the
//! topology comes from the same YAML `dlqctl provision` uses, read by the
//! same loader (size cap, UTF-8, validation) as the `dlqctl` commands.
//!
//! ```text
//! cargo run --release -- provision topology/orders.yaml
//! cargo run -p dlqctl --example embedded_worker -- topology/orders.yaml orders
//! ```
//!
//! The broker is `AMQP_URL` (default: the local broker as guest). Each
//! message is handled thus: a body containing `bad` is dead-lettered at
//! once; any other fails once (transient, as a timed-out payment API
//! would, asking to wait a second) and succeeds on its second attempt.
//!
//! Stops on Ctrl-C (SIGINT) or SIGTERM after finishing the messages in
//! flight. The integration tests run this program against a broker
//! (`tests/integration/example.rs`).

use dlqctl::{
    handler_fn, load_pipeline, BrokerUrl, CancellationToken, HandlerMessage, Outcome, Worker,
    WorkerConfig, DEFAULT_AMQP_URL,
};
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let mut args = std::env::args().skip(1);
    let file = args.next().unwrap_or_else(|| "topology/orders.yaml".into());
    let queue = args.next().unwrap_or_else(|| "orders".into());

    let pipeline = load_pipeline(&file, &queue)?;
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.into());
    let url = BrokerUrl::parse(&url)?;

    let mut cfg = WorkerConfig::new(pipeline, url);
    cfg.concurrency = 4;
    cfg.prefetch = 4;

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
    let mut term = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        on_signal.cancel();
    });
    Worker::new(cfg, handler).run(stop).await?;
    Ok(())
}
