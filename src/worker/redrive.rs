//! The worker's redrive timer: while `dlqctl work` runs a pipeline that
//! has a `dead_letter.redrive` policy (and no `--no-redrive`), it looks at
//! the DLQ every `every` and runs the policy once
//! ([`crate::ops::dlq::redrive::redrive`]), on a connection of its own
//! (`dlqctl redrive NAME`) opened for the run and closed after it: no
//! lock is held between runs. After a failed canary the wait doubles, up
//! to an hour; any other result brings it back to `every`.

use super::config::WorkerConfig;
use crate::core::dlq::redrive::RunResult;
use crate::ops::dlq::redrive::{redrive, RedriveReport};
use crate::ops::dlq::{ReadOptions, Target};
use crate::worker::metrics::{Metrics, RunLabels};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Runs the policy every `every` (or the doubled wait) until `stop`.
pub(crate) async fn run_loop(
    cfg: Arc<WorkerConfig>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let Some(policy) = cfg.pipeline.dead_letter.redrive.clone() else {
        return;
    };
    let queue = cfg.pipeline.name.clone();
    info!(queue = %queue, every_ms = policy.every, min_age_ms = policy.min_age, "automatic redrive on");
    let mut wait = policy.every;
    loop {
        metrics
            .redrive_next_wait_seconds
            .get_or_create(&crate::worker::metrics::QueueLabels {
                queue: queue.clone(),
            })
            .set(wait as f64 / 1000.0);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
        }
        let run = once(&cfg, wait, &stop).await;
        let finished = matches!(&run, Ok(r) if r.result != RunResult::Failed);
        if stop.is_cancelled() && !finished {
            // A run cut short by the stop is no result.
            return;
        }
        match run {
            Ok(r) => {
                metrics.record_redrive(&r);
                log_run(&r);
                wait = r.next_wait_ms;
            }
            Err(e) => {
                metrics
                    .redrive_runs
                    .get_or_create(&RunLabels {
                        queue: queue.clone(),
                        result: "failed".into(),
                    })
                    .inc();
                warn!(queue = %queue, error = %e, next_wait_ms = policy.every, "redrive run failed");
                wait = policy.every;
            }
        }
    }
}

/// One run on a connection of its own.
async fn once(
    cfg: &WorkerConfig,
    previous_wait_ms: u64,
    stop: &CancellationToken,
) -> crate::error::Result<RedriveReport> {
    let p = &cfg.pipeline;
    let name = format!("dlqctl redrive {}", p.name);
    let (conn, at) = cfg.brokers.connect(&name).await?;
    let conn = Arc::new(conn);
    let target = Target {
        conn: conn.clone(),
        dlq: p.dead_letter.queue.clone(),
        user: cfg.brokers.get(at).user().to_string(),
        read: ReadOptions {
            retention_ms: p.dead_letter.ttl,
            cancel: stop.child_token(),
            ..ReadOptions::default()
        },
        tag: name,
    };
    let r = redrive(&target, p, previous_wait_ms).await;
    crate::amqp::connection::close(&conn).await;
    r
}

/// The log line of a run: `redrive run` at info (a busy DLQ, skipped, at
/// debug; a failed run at warn).
fn log_run(r: &RedriveReport) {
    let (sent, back) = r.canary.as_ref().map_or((0, 0), |c| (c.sent, c.came_back));
    let waiting = r.waiting_for_person.map(|n| n as i64).unwrap_or(-1);
    let why = r.why.as_deref().unwrap_or("");
    let result = r.result.label();
    let ended_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    macro_rules! line {
        ($level:ident) => {
            $level!(
                queue = %r.queue,
                result,
                moved = r.moved,
                canary_sent = sent,
                canary_came_back = back,
                waiting_for_person = waiting,
                next_wait_ms = r.next_wait_ms,
                elapsed_ms = r.elapsed_ms,
                ended_at_ms,
                replay_id = %r.replay_id,
                why,
                "redrive run"
            )
        };
    }
    match r.result {
        RunResult::Busy => line!(debug),
        RunResult::Failed => line!(warn),
        _ => line!(info),
    }
}
