//! `dlqctl work`: wires the CLI to the library's [`Worker`].

use crate::cli::WorkArgs;
use crate::exit::Outcome;
use anyhow::Result;
use dlqctl::core::topology::QueueType;
use dlqctl::handler::exec::{check_program, ExecHandler};
use dlqctl::handler::http::HttpHandler;
use dlqctl::handler::jsonl::{JsonlConfig, JsonlHandler};
use dlqctl::handler::Handler;
use dlqctl::worker::metrics::Metrics;
use dlqctl::worker::{self, Worker, WorkerConfig};
use dlqctl::Error;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Runs the worker until SIGINT or SIGTERM.
pub async fn run(a: &WorkArgs) -> Result<Outcome> {
    let pipeline = dlqctl::load_pipeline(&a.file, &a.queue)?;
    if a.dead_letter == worker::DeadLetterMode::Nack && pipeline.queue_type == QueueType::Classic {
        return Err(Error::Usage(format!(
            "--dead-letter nack on classic pipeline `{}`: classic dead-lettering is at-most-once, \
             so a missing or full DLQ would silently drop the message; use the default \
             --dead-letter republish (or a quorum pipeline)",
            pipeline.name
        ))
        .into());
    }
    // The handler gets these of dlqctl's secret-bearing variables after
    // all (dlqctl::secrets): the operator asked for them.
    for name in &a.pass_env {
        dlqctl::secrets::pass_var(name);
    }
    let brokers = super::brokers(&a.connection)?;
    super::check_management_urls(&a.management_url)?;
    let mut cfg = WorkerConfig::new(pipeline, brokers);
    cfg.handler_timeout = Some(a.handler_timeout);
    cfg.management_urls = a.management_url.clone();
    cfg.concurrency = a.concurrency as usize;
    cfg.prefetch = a.prefetch.unwrap_or(a.concurrency);
    cfg.grace = a.grace;
    cfg.dead_letter = a.dead_letter;
    cfg.redrive = !a.no_redrive;
    cfg.wait_for_broker = a.wait_for_broker;
    cfg.in_doubt = a.in_doubt;
    if let Some(store) = &a.idempotency_store {
        if let dlqctl::core::idempotency::StoreSpec::Redis(url) = store {
            dlqctl::urls::redis(url).map_err(|why| {
                let shown = dlqctl::core::idempotency::redact_url(url);
                Error::Usage(format!("--idempotency-store {shown} cannot be used: {why}"))
            })?;
        }
        match &cfg.pipeline.idempotency {
            Some(_) => tracing::warn!(queue = %cfg.pipeline.name,
                "--idempotency-store: this run keeps its keys and leases apart from the pipeline's store: a message this worker handles may run again in workers using the other store"),
            None => {
                return Err(Error::Usage(format!(
                    "--idempotency-store: pipeline `{}` has no idempotency block in its topology",
                    cfg.pipeline.name
                ))
                .into())
            }
        }
        cfg.idempotency_store = Some(store.clone());
    }
    match (&a.http, a.command.split_first()) {
        (Some(url), _) => {
            let h = HttpHandler::new(url, a.handler_timeout)
                .map_err(|e| Error::Usage(format!("--http: {e}")))?;
            serve(cfg, h, a).await
        }
        (None, Some((program, args))) if a.jsonl => {
            check_program(program).map_err(|e| Error::Usage(format!("handler: {e}")))?;
            let processes = usize::from(a.processes);
            if processes > cfg.concurrency {
                return Err(Error::Usage(format!(
                    "--processes {processes} is more than --concurrency {}: each process needs \
                     at least one message in flight; raise --concurrency",
                    cfg.concurrency
                ))
                .into());
            }
            let mut jc = JsonlConfig::new(program.clone(), args.to_vec(), &cfg.pipeline.name);
            jc.processes = processes;
            jc.max_in_flight = cfg.concurrency.div_ceil(processes);
            jc.timeout = a.handler_timeout;
            jc.start_timeout = a.handler_start_timeout;
            let h = Arc::new(JsonlHandler::start(jc));
            let result = serve(cfg, h.clone(), a).await;
            // After the worker: the answers in flight are in (or the grace
            // is over); now EOF, a short wait, then kill.
            h.shutdown().await;
            result
        }
        (None, Some((program, args))) => {
            check_program(program).map_err(|e| Error::Usage(format!("handler: {e}")))?;
            let h = ExecHandler::new(program.clone(), args.to_vec(), a.handler_timeout);
            serve(cfg, h, a).await
        }
        (None, None) => {
            Err(Error::Usage("no handler: give `-- COMMAND ARGS...` or `--http URL`".into()).into())
        }
    }
}

async fn serve<H: Handler>(cfg: WorkerConfig, handler: H, a: &WorkArgs) -> Result<Outcome> {
    let (shutdown, hurry) = (CancellationToken::new(), CancellationToken::new());
    super::spawn_signal_handler_twice(
        shutdown.clone(),
        hurry.clone(),
        "finishing messages in flight (a second signal stops without waiting for them)",
        "not waiting for the messages in flight; they return to the queue",
    )?;
    let metrics = Arc::new(Metrics::new());
    metrics.set_handler_timeout(&cfg.pipeline.name, a.handler_timeout);
    if let Some(addr) = a.metrics_addr {
        // Bound once and served on that listener: no window in which
        // another process could take the port, and `:0` logs the real port.
        let listener = super::metrics_http::bind(addr)
            .await
            .map_err(|e| Error::Usage(format!("--metrics-addr {addr}: {e}")))?;
        let bound = listener.local_addr().unwrap_or(addr);
        let (m, stop) = (metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = super::metrics_http::serve(listener, m, stop).await {
                error!(error = %e, "metrics server stopped");
            }
        });
        info!(addr = %bound, "serving metrics on /metrics");
    }
    let worker = Worker::with_metrics(cfg, handler, metrics);
    worker.run_with_hurry(shutdown, hurry).await?;
    info!("stopped");
    Ok(Outcome::Success)
}
