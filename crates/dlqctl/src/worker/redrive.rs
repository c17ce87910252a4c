//! The worker's redrive timer: while `dlqctl work` runs a pipeline that
//! has a `dead_letter.redrive` policy (and no `--no-redrive`), it looks at
//! the DLQ every `every` at the most, on a connection of its own (`dlqctl
//! redrive NAME`) opened for the look and closed after it: no lock is
//! held between looks. A look takes the redrive lock, reads the
//! pipeline's shared state (`NAME.redrive-state`) and runs the policy
//! once ([`crate::ops::dlq::redrive::redrive_if_due`]) only when the
//! shared wait has passed, whichever worker ran the run before. After a
//! failed canary the shared wait doubles, up to an hour; `busy`, `failed`
//! and a run cut short by a stop leave it; any other result brings it back
//! to `every`. Looks carry a little jitter. Without the state queue (a
//! topology provisioned before it) the wait is this worker's own, as
//! before, with a warning.

use super::config::WorkerConfig;
use crate::core::dlq::redrive::RunResult;
use crate::ops::dlq::canary::StoreGuard;
use crate::ops::dlq::redrive::{redrive_if_due, RedriveReport, Turn};
use crate::ops::dlq::Target;
use crate::worker::metrics::{Metrics, RedriveRun};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Runs the policy every `every` (or the doubled wait) until `stop`;
/// `store_paused` says when the idempotency store does not answer, and
/// `store` is that store (its canaries are chosen and judged by their
/// keys).
pub(crate) async fn run_loop(
    cfg: Arc<WorkerConfig>,
    metrics: Arc<Metrics>,
    (store_paused, store): (impl Fn() -> bool + Send + 'static, Option<StoreGuard>),
    stop: CancellationToken,
) {
    let Some(policy) = cfg.pipeline.dead_letter.redrive.clone() else {
        return;
    };
    let queue = cfg.pipeline.name.clone();
    info!(queue = %queue, every_ms = policy.every, min_age_ms = policy.min_age, "automatic redrive on");
    metrics.record_redrive_wait(&queue, policy.every);
    let mut wait = policy.every;
    let mut own_wait = policy.every;
    let mut warned_unshared = false;
    loop {
        // Workers of a pipeline follow one due time: a little jitter
        // keeps them from all taking the lock at the same moment.
        let jitter = rand::random::<u64>() % (wait / 10).clamp(1, 1000);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(wait + jitter)) => {}
        }
        if store_paused() {
            // Redriven messages would only be handed back: the turn is
            // skipped while the idempotency store does not answer.
            debug!(queue = %queue, "redrive turn skipped: the idempotency store does not answer");
            wait = policy.every;
            continue;
        }
        let turn = once(&cfg, own_wait, store.clone(), &stop).await;
        let finished = matches!(&turn, Ok(Turn::NotDue { .. }))
            || matches!(&turn, Ok(Turn::Ran(r)) if r.result != RunResult::Failed);
        if stop.is_cancelled() && !finished {
            // A run cut short by the stop is no result.
            return;
        }
        match turn {
            Ok(Turn::NotDue {
                state,
                remaining_ms,
            }) => {
                metrics.record_redrive_state(&queue, &state);
                debug!(queue = %queue, remaining_ms, shared_wait_ms = state.wait_ms, "redrive look: not due yet");
                // Look again when it is due, or after `every` (a person's
                // run may bring the wait back sooner).
                wait = remaining_ms.clamp(1, policy.every);
            }
            Ok(Turn::Ran(r)) => {
                metrics.record_redrive(&counted(&r));
                log_run(&r);
                match (&r.shared, &r.shared_unavailable, warned_unshared) {
                    (None, Some(why), false) => {
                        warn!(queue = %queue, why = %why, "the redrive wait is this worker's own, not the pipeline's");
                        warned_unshared = true;
                    }
                    // Shared again: a later loss is warned again.
                    (Some(_), _, true) => warned_unshared = false,
                    _ => {}
                }
                own_wait = r.next_wait_ms;
                wait = match &r.shared {
                    Some(s) => s.wait_ms.clamp(1, policy.every),
                    None if r.result == RunResult::Busy => policy.every,
                    None => r.next_wait_ms,
                };
            }
            Err(e) => {
                metrics.record_redrive_failed(&queue);
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
    store: Option<StoreGuard>,
    stop: &CancellationToken,
) -> crate::error::Result<Turn> {
    let p = &cfg.pipeline;
    let name = format!("dlqctl redrive {}", p.name);
    let (conn, at) = cfg.brokers.connect(&name).await?;
    let conn = Arc::new(conn);
    let user = cfg.brokers.get(at).user();
    let target =
        Target::for_pipeline(conn.clone(), p, user, name, stop.child_token()).guarded(store);
    let r = redrive_if_due(&target, p, previous_wait_ms).await;
    crate::amqp::connection::close(&conn).await;
    r
}

/// What the metrics count of a run.
fn counted(r: &RedriveReport) -> RedriveRun<'_> {
    RedriveRun {
        queue: &r.queue,
        result: r.result,
        moved: r.moved,
        waiting_for_person: r.waiting_for_person,
        next_wait_ms: r.next_wait_ms,
    }
}

/// The log line of a run: `redrive run` at info (a busy DLQ, skipped, at
/// debug; a failed run at warn).
fn log_run(r: &RedriveReport) {
    let (sent, back) = r.canary.as_ref().map_or((0, 0), |c| (c.sent, c.came_back));
    let why = r.why.as_deref().unwrap_or("");
    let result = r.result.label();
    macro_rules! line {
        ($level:ident) => {
            $level!(
                queue = %r.queue,
                result,
                moved = r.moved,
                canary_sent = sent,
                canary_came_back = back,
                waiting_for_person = r.waiting_for_person,
                shared_wait = r.shared.is_some(),
                next_wait_ms = r.next_wait_ms,
                elapsed_ms = r.elapsed_ms,
                started_at_ms = r.started_at_ms,
                ended_at_ms = r.ended_at_ms,
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
