//! The main queue's consumer timeout against the handler timeout, read
//! through the management API: at start, before consuming, a handler
//! timeout the broker cannot wait for refuses to start (a fact of the
//! broker, like a topology not provisioned); then every
//! [`RECHECK_EVERY`] while the worker runs, where such a policy appearing
//! is logged as an error and counted (`dlqctl_consumer_timeout_conflicts_total`).
//! The rule is the core's ([`crate::core::audit::consumer_timeout`]), the
//! same `dlqctl doctor` judges with. Without the management API the
//! worker warns and starts.

use super::config::WorkerConfig;
use super::shared::Shared;
use crate::amqp::mgmt::Management;
use crate::core::audit::consumer_timeout::{self as ct, Handlers, Verdict};
use crate::core::audit::policy::AppliedPolicies;
use crate::error::{Error, Result};
use crate::worker::metrics::Metrics;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// How often a running worker reads the consumer timeout again.
pub const RECHECK_EVERY: Duration = Duration::from_secs(60);

/// How long the start waits for the management API to report the
/// policies of a queue it has not reported yet (a queue just declared).
const REPORT_WAIT: Duration = Duration::from_secs(6);

/// What the management API tells of the main queue.
struct QueueView {
    version: Option<String>,
    queue_type: Option<String>,
    argument: Option<i64>,
    /// `None` while the statistics have not reported them.
    policies: Option<AppliedPolicies>,
}

/// The policies that apply to `queue`, as `provision --check` and `doctor`
/// work them out: from the policy definitions (current at once:
/// [`crate::core::audit::effective`]), checked against the queue's own
/// view (`policy`, `operator_policy`, `effective_policy_definition`,
/// refreshed with its statistics, so a few seconds late), which is the
/// fallback when the definitions cannot be read. Also returns the queue's
/// document.
async fn queue_policies(
    m: &Management,
    vhost: &str,
    queue: &str,
) -> Result<(Option<AppliedPolicies>, serde_json::Value)> {
    let Some(doc) = m.queue(vhost, queue).await? else {
        return Err(Error::Management {
            url: format!("queue {queue} in vhost {vhost}"),
            message: "the management API does not know this queue (is it another broker's?)".into(),
        });
    };
    let reported = crate::amqp::mgmt::reported_policies(&doc);
    let kind = doc["type"].as_str().unwrap_or("classic");
    let applied = match m.policy_set(vhost).await {
        Ok(set) => Some(crate::core::audit::effective::resolve_against(
            queue,
            kind,
            &set,
            reported.as_ref(),
        )),
        Err(_) => reported,
    };
    Ok((applied, doc))
}

async fn read(m: &Management, vhost: &str, queue: &str) -> Result<QueueView> {
    let version = m.version().await?;
    let (policies, doc) = queue_policies(m, vhost, queue).await?;
    Ok(QueueView {
        version,
        queue_type: doc["type"].as_str().map(str::to_string),
        argument: doc["arguments"][ct::ARGUMENT].as_i64(),
        policies,
    })
}

/// The verdict on `view` for the worker's handlers.
fn verdict(cfg: &WorkerConfig, handler: Duration, view: &QueueView) -> Verdict {
    let timeout = ct::consumer_timeout(&ct::Facts {
        version: view.version.as_deref(),
        queue_type: view.queue_type.as_deref(),
        argument: view.argument,
        policies: view.policies.as_ref(),
    });
    let h = Handlers {
        timeout_ms: handler.as_millis().min(u128::from(u64::MAX)) as u64,
        prefetch: cfg.prefetch,
        concurrency: cfg.concurrency,
    };
    ct::judge(h, timeout.as_ref())
}

/// The management API of address `at`, or why there is none.
fn management(cfg: &WorkerConfig, at: usize) -> Result<Management> {
    cfg.brokers.management(&cfg.management_urls, at)
}

/// At start, before consuming: refuses (an error naming the policy or
/// argument and both values) a handler timeout at or above the main
/// queue's consumer timeout; warns and accepts when the management API
/// cannot tell.
pub(super) async fn check_at_start(cfg: &WorkerConfig, at: usize) -> Result<()> {
    let Some(handler) = cfg.handler_timeout else {
        return Ok(());
    };
    let queue = cfg.pipeline.name.as_str();
    let vhost = cfg.brokers.get(at).vhost().to_string();
    let unchecked = |why: String| {
        warn!(queue, reason = %why, "cannot read the queue's consumer timeout through the management API: starting without checking the handler timeout against it (`dlqctl doctor` checks it)");
    };
    let m = match management(cfg, at) {
        Ok(m) => m,
        Err(e) => {
            unchecked(e.to_string());
            return Ok(());
        }
    };
    let started = tokio::time::Instant::now();
    let view = loop {
        match read(&m, &vhost, queue).await {
            Err(e) => {
                unchecked(e.to_string());
                return Ok(());
            }
            Ok(v) if v.policies.is_none() && started.elapsed() < REPORT_WAIT => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(v) => break v,
        }
    };
    if view.policies.is_none() {
        warn!(queue, "the management API has not reported the queue's policies yet: the consumer timeout is judged without them, and read again in a minute");
    }
    match verdict(cfg, handler, &view) {
        Verdict::TooLong(why) => Err(Error::Broker {
            context: format!(
                "pipeline {queue}: the broker would requeue messages while their handler runs"
            ),
            message: why,
        }),
        Verdict::Fits | Verdict::NoTimeout => {
            debug!(
                queue,
                "the handler timeout fits the queue's consumer timeout"
            );
            Ok(())
        }
    }
}

/// Every [`RECHECK_EVERY`] until `stop`: reads the consumer timeout again
/// on the address in use; a handler timeout not under it is
/// logged as an error (when it appears or changes) and counted at every
/// look.
pub(super) async fn run_loop(
    cfg: Arc<WorkerConfig>,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let Some(handler) = cfg.handler_timeout else {
        return;
    };
    let queue = cfg.pipeline.name.clone();
    let mut last: Option<String> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RECHECK_EVERY) => {}
        }
        let at = shared.address.load(Ordering::SeqCst);
        let vhost = cfg.brokers.get(at).vhost().to_string();
        let view = match management(&cfg, at) {
            Ok(m) => read(&m, &vhost, &queue).await,
            Err(e) => Err(e),
        };
        let view = match view {
            Ok(v) => v,
            Err(e) => {
                debug!(queue = %queue, error = %e, "cannot read the queue's consumer timeout now");
                continue;
            }
        };
        match verdict(&cfg, handler, &view) {
            Verdict::TooLong(why) => {
                metrics.consumer_timeout_conflict();
                if last.as_deref() != Some(why.as_str()) {
                    error!(queue = %queue, reason = %why, "the handler timeout is too long for the queue's consumer timeout, which changed while the worker runs");
                    last = Some(why);
                }
            }
            Verdict::Fits | Verdict::NoTimeout => {
                if last.take().is_some() {
                    info!(queue = %queue, "the handler timeout fits the queue's consumer timeout again");
                }
            }
        }
    }
}
