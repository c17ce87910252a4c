//! `dlqctl status`: every pipeline's queues with their depths and
//! consumers, fresh from AMQP, plus what only the management API knows
//! (unacked messages, a quorum queue's `messages_dlx`, and the policies
//! that override what the topology asked for); with a worker's metrics
//! page, its circuit breakers, and the duplicates skipped and deferrals
//! of the pipelines with `idempotency`.

use crate::amqp::declare::{passive_exchange, passive_queue};
use crate::amqp::mgmt::Management;
use crate::core::audit::circuit::CircuitReading;
use crate::core::audit::finding::Finding;
use crate::core::audit::idempotency::IdempotencyCounts;
use crate::core::audit::stale::ListedQueue;
use crate::core::topology::plan::{Plan, QueueSpec, Role};
use crate::core::topology::ArgValue;
use crate::error::Result;
use futures_util::stream::{self, StreamExt, TryStreamExt};
use lapin::Connection;
use std::collections::HashMap;

/// How many passive declares run at once.
const PARALLEL: usize = 16;

/// One queue of a pipeline.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QueueStatus {
    /// Queue name.
    pub name: String,
    /// False when the queue does not exist (every count is then absent).
    pub exists: bool,
    /// Ready messages, from AMQP's declare-ok (fresh).
    pub ready: Option<u64>,
    /// Consumers, from AMQP's declare-ok.
    pub consumers: Option<u64>,
    /// Delivered and not yet acked, from the management API (lags by about
    /// 5 s; `None`: unknown).
    pub unacked: Option<u64>,
    /// Messages a quorum queue holds because its dead-letter target refused
    /// them, from the management API (`None`: unknown or not a quorum queue).
    pub messages_dlx: Option<u64>,
    /// A quorum queue (only those hold messages for their DLX).
    pub quorum: bool,
    /// Ready plus unacked from one sample of the management API (as stale
    /// as [`QueueStatus::unacked`]; `None`: unknown).
    #[serde(skip)]
    pub listed: Option<u64>,
}

impl QueueStatus {
    /// The messages the queue holds, ready plus unacked, for thresholds:
    /// the larger of the fresh ready count and the management API's
    /// ready + unacked of one sample. Never a fresh count added to a stale
    /// one: right after a read that held thousands unacked, that sum
    /// counted them twice.
    pub fn total(&self) -> u64 {
        let fresh = self.ready.unwrap_or(0);
        fresh.max(self.listed.or(self.unacked).unwrap_or(0))
    }
}

/// One retry tier.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TierStatus {
    /// The tier's name (`10s`).
    pub tier: String,
    /// Its queue.
    #[serde(flatten)]
    pub queue: QueueStatus,
}

/// One pipeline.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PipelineStatus {
    /// The pipeline (its main queue's name).
    pub name: String,
    /// The main queue.
    pub main: QueueStatus,
    /// The retry tiers, shortest first.
    pub tiers: Vec<TierStatus>,
    /// The dead-letter queue.
    pub dlq: QueueStatus,
    /// The automatic redrive, when the pipeline has a policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redrive: Option<RedriveStatus>,
    /// The worker's circuit breaker, when `--metrics-url` showed one for
    /// this pipeline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub circuit: Option<CircuitReading>,
    /// Duplicates skipped and deferrals, summed over the workers' metrics
    /// pages read (`--metrics-url`) that count them for this pipeline (one
    /// with `idempotency`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<IdempotencyCounts>,
}

/// A pipeline's automatic redrive as the broker keeps it: its
/// `NAME.redrive-state` queue and the state it holds (the shared wait,
/// the next look, the last runs: docs/dlq.md, "The shared wait").
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RedriveStatus {
    /// The state queue.
    pub queue: QueueStatus,
    /// The state (`None`: no run has written one yet, or it could not be
    /// read: see [`RedriveStatus::unreadable`]).
    pub state: Option<crate::core::dlq::redrive_state::RedriveState>,
    /// Why the state could not be read, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// Everything `status` found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct StatusReport {
    /// Each pipeline of the file, in file order.
    pub pipelines: Vec<PipelineStatus>,
    /// Exchanges of the file that do not exist.
    pub missing_exchanges: Vec<String>,
    /// Why the management API's numbers are unknown, when they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub management_unavailable: Option<String>,
    /// Policies and operator policies that make a queue differ from the
    /// topology ([`Finding::PolicyOverrides`]): a DLQ whose retention a
    /// policy cuts loses dead letters whatever its depth says.
    pub policy_overrides: Vec<Finding>,
    /// The readiness of each worker whose metrics page was read
    /// (`--metrics-url`): what its `/readyz` answers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerReadiness>,
    /// Why the circuit breakers are unknown, when `--metrics-url` could not
    /// be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub circuit_unknown: Option<String>,
    /// Warnings on how the policies were worked out: a tie of priorities,
    /// the definitions and a queue's own report disagreeing, policies read
    /// from the queues' reports (possibly a few seconds old) because the
    /// definitions could not be read.
    pub policy_warnings: Vec<Finding>,
}

/// A worker's readiness as its metrics page shows it (`dlqctl_ready`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkerReadiness {
    /// The page read (credentials hidden).
    pub url: String,
    /// Ready: consuming, and its settles not all failing for 30 s.
    pub ready: bool,
}

/// A DLQ over the `--max-dlq` threshold.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OverThreshold {
    /// The DLQ.
    pub queue: String,
    /// Ready plus unacked.
    pub messages: u64,
}

impl StatusReport {
    /// Every missing object: exchanges, then queues, by name.
    pub fn missing(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .missing_exchanges
            .iter()
            .map(|e| format!("exchange {e}"))
            .collect();
        for p in &self.pipelines {
            let queues = std::iter::once(&p.main)
                .chain(p.tiers.iter().map(|t| &t.queue))
                .chain(std::iter::once(&p.dlq))
                .chain(p.redrive.iter().map(|r| &r.queue));
            out.extend(
                queues
                    .filter(|q| !q.exists)
                    .map(|q| format!("queue {}", q.name)),
            );
        }
        out
    }

    /// Fills in each pipeline's circuit breaker, duplicates and deferrals,
    /// and the worker's readiness from the worker's metrics page at `url`,
    /// or says why it could not be read. Called once per page: a breaker
    /// already read from another worker's page is kept when it is the more
    /// paused one; duplicates and deferrals add up over the pages.
    pub async fn read_circuits(&mut self, url: &str) {
        let names: Vec<String> = self.pipelines.iter().map(|p| p.name.clone()).collect();
        match crate::ops::metrics_page::worker_page(url, names.iter().map(String::as_str)).await {
            Ok(mut page) => {
                for p in &mut self.pipelines {
                    if let Some(c) = page.circuits.remove(&p.name) {
                        if p.circuit.as_ref().is_none_or(|old| !old.paused()) {
                            p.circuit = Some(c);
                        }
                    }
                    if let Some(c) = page.idempotency.remove(&p.name) {
                        p.idempotency.get_or_insert_with(Default::default).add(c);
                    }
                }
                if let Some(ready) = page.ready {
                    self.workers.push(WorkerReadiness {
                        url: crate::ops::metrics_page::shown(url),
                        ready,
                    });
                }
            }
            Err(e) => self.circuit_unknown = Some(e),
        }
    }

    /// The DLQs holding more than `max` messages, ready plus unacked.
    pub fn dlqs_over(&self, max: u64) -> Vec<OverThreshold> {
        self.pipelines
            .iter()
            .filter(|p| p.dlq.total() > max)
            .map(|p| OverThreshold {
                queue: p.dlq.name.clone(),
                messages: p.dlq.total(),
            })
            .collect()
    }
}

/// Reads every queue of the plan (a passive declare each, `PARALLEL` at a
/// time) and, when `mgmt` answers, the vhost's queue statistics.
pub async fn status(
    conn: &Connection,
    plan: &Plan,
    mgmt: Option<&Management>,
    vhost: &str,
) -> Result<StatusReport> {
    let counts = queue_counts(conn, plan).await?;
    let missing_exchanges = missing_exchanges(conn, plan).await?;
    let (stats, management_unavailable) = listed_queues(conn, mgmt, vhost).await;
    let known = management_unavailable.is_none();
    let policy_findings = match mgmt {
        Some(m) if known => {
            let view = crate::ops::policies::PolicyView::read(m, vhost).await;
            crate::ops::provision::policies_of(&view, plan, &stats)
        }
        _ => vec![],
    };
    let (policy_overrides, policy_warnings) = policy_findings
        .into_iter()
        .filter(|f| matches!(f, Finding::PolicyOverrides { .. }) || f.is_warning())
        .partition(|f| !f.is_warning());
    let queue = |spec: &QueueSpec| queue_status(spec, &counts, &stats, known);
    let mut pipelines = pipelines(plan, queue);
    for r in pipelines.iter_mut().filter_map(|p| p.redrive.as_mut()) {
        if r.queue.exists {
            match crate::ops::dlq::redrive_state::peek(conn, &r.queue.name).await {
                Ok(s) => r.state = s,
                Err(e) => r.unreadable = Some(e.to_string()),
            }
        }
    }
    Ok(StatusReport {
        pipelines,
        missing_exchanges,
        management_unavailable,
        policy_overrides,
        circuit_unknown: None,
        workers: vec![],
        policy_warnings,
    })
}

type Counts = HashMap<String, Option<crate::amqp::declare::QueueCounts>>;

/// Each queue's counts by a passive declare (`None`: it does not exist).
async fn queue_counts(conn: &Connection, plan: &Plan) -> Result<Counts> {
    // Owned names, not borrows of the plan: a future that borrows through
    // these closures is not `Send` for every lifetime (rustc #64552), and
    // `dlqctl serve` runs this on a spawned task.
    let queue_names: Vec<String> = plan.queues.iter().map(|q| q.name.clone()).collect();
    stream::iter(queue_names)
        .map(|name| async move {
            let c = passive_queue(conn, &name).await?;
            Ok::<_, crate::error::Error>((name, c))
        })
        .buffer_unordered(PARALLEL)
        .try_collect()
        .await
}

/// The plan's exchanges that do not exist, sorted.
async fn missing_exchanges(conn: &Connection, plan: &Plan) -> Result<Vec<String>> {
    let exchange_names: Vec<String> = plan.exchanges.iter().map(|e| e.name.clone()).collect();
    let exists: Vec<(String, bool)> = stream::iter(exchange_names)
        .map(|name| async move {
            let ok = passive_exchange(conn, &name).await?;
            Ok::<_, crate::error::Error>((name, ok))
        })
        .buffer_unordered(PARALLEL)
        .try_collect()
        .await?;
    let mut missing: Vec<String> = exists
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| n)
        .collect();
    missing.sort();
    Ok(missing)
}

/// The management API's view of the vhost's queues, or why there is none.
async fn listed_queues(
    conn: &Connection,
    mgmt: Option<&Management>,
    vhost: &str,
) -> (HashMap<String, ListedQueue>, Option<String>) {
    let Some(m) = mgmt else {
        return (
            HashMap::new(),
            Some("no management API was given".to_string()),
        );
    };
    let listed = async {
        m.same_broker(conn, vhost).await?;
        m.list_queues(vhost).await
    }
    .await;
    match listed {
        Ok(list) => (
            list.into_iter().map(|q| (q.name.clone(), q)).collect(),
            None,
        ),
        Err(e) => (HashMap::new(), Some(e.to_string())),
    }
}

/// One queue's status from its passive-declare counts and its listing.
/// `known`: the management API answered.
fn queue_status(
    spec: &QueueSpec,
    counts: &Counts,
    stats: &HashMap<String, ListedQueue>,
    known: bool,
) -> QueueStatus {
    let name = spec.name.as_str();
    let quorum = spec.arguments.get("x-queue-type") == Some(&ArgValue::Str("quorum".into()));
    let c = counts.get(name).copied().flatten();
    let s = stats.get(name);
    // A queue the API does not list yet (just created) holds nothing
    // unacked or held.
    let listed_or_zero = |v: Option<u64>| match (c, s) {
        (None, _) => None,
        (Some(_), Some(_)) => v.or(Some(0).filter(|_| known)),
        (Some(_), None) => Some(0).filter(|_| known),
    };
    QueueStatus {
        name: name.to_string(),
        exists: c.is_some(),
        ready: c.map(|c| u64::from(c.ready)),
        consumers: c.map(|c| u64::from(c.consumers)),
        unacked: listed_or_zero(s.and_then(|s| s.unacked)),
        messages_dlx: if quorum {
            listed_or_zero(s.and_then(|s| s.messages_dlx))
        } else {
            None
        },
        quorum,
        listed: s.and_then(|s| s.messages),
    }
}

/// The plan's queues grouped by pipeline: main queue, tiers, DLQ.
fn pipelines(plan: &Plan, queue: impl Fn(&QueueSpec) -> QueueStatus) -> Vec<PipelineStatus> {
    let mut pipelines: Vec<PipelineStatus> = Vec::new();
    for q in &plan.queues {
        match q.role {
            Role::MainQueue => pipelines.push(PipelineStatus {
                name: q.pipeline.clone(),
                main: queue(q),
                tiers: vec![],
                dlq: queue(q),
                redrive: None,
                circuit: None,
                idempotency: None,
            }),
            Role::RedriveState => {
                if let Some(p) = pipelines.iter_mut().find(|p| p.name == q.pipeline) {
                    p.redrive = Some(RedriveStatus {
                        queue: queue(q),
                        state: None,
                        unreadable: None,
                    });
                }
            }
            Role::RetryQueue | Role::DeadLetterQueue => {
                let Some(p) = pipelines.iter_mut().find(|p| p.name == q.pipeline) else {
                    continue;
                };
                if q.role == Role::DeadLetterQueue {
                    p.dlq = queue(q);
                } else {
                    let tier = q
                        .name
                        .rsplit_once(".retry.")
                        .map(|(_, t)| t.to_string())
                        .unwrap_or_default();
                    p.tiers.push(TierStatus {
                        tier,
                        queue: queue(q),
                    });
                }
            }
            Role::ProducerExchange | Role::RetryExchange | Role::DeadLetterExchange => {}
        }
    }
    pipelines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, exists: bool, ready: u64, unacked: Option<u64>) -> QueueStatus {
        QueueStatus {
            name: name.into(),
            exists,
            ready: exists.then_some(ready),
            consumers: exists.then_some(0),
            unacked,
            messages_dlx: None,
            quorum: true,
            listed: None,
        }
    }

    fn report(dlqs: Vec<QueueStatus>) -> StatusReport {
        StatusReport {
            pipelines: dlqs
                .into_iter()
                .enumerate()
                .map(|(i, dlq)| PipelineStatus {
                    name: format!("p{i}"),
                    main: q(&format!("p{i}"), true, 0, Some(0)),
                    tiers: vec![TierStatus {
                        tier: "1s".into(),
                        queue: q(&format!("p{i}.retry.1s"), true, 0, Some(0)),
                    }],
                    dlq,
                    redrive: None,
                    circuit: None,
                    idempotency: None,
                })
                .collect(),
            missing_exchanges: vec![],
            management_unavailable: None,
            policy_overrides: vec![],
            circuit_unknown: None,
            workers: vec![],
            policy_warnings: vec![],
        }
    }

    #[test]
    fn the_threshold_counts_ready_plus_unacked_and_is_strictly_more() {
        let mut r = report(vec![
            q("a.dlq", true, 3, Some(2)),
            q("b.dlq", true, 5, None),
            q("c.dlq", true, 4, Some(0)),
        ]);
        // The API's sample: 3 ready and 2 unacked.
        r.pipelines[0].dlq.listed = Some(5);
        assert_eq!(
            r.dlqs_over(4),
            vec![
                OverThreshold {
                    queue: "a.dlq".into(),
                    messages: 5
                },
                OverThreshold {
                    queue: "b.dlq".into(),
                    messages: 5
                },
            ]
        );
        assert_eq!(r.dlqs_over(5), vec![]);
        assert_eq!(r.dlqs_over(0).len(), 3);
    }

    /// Right after a read of 19,995 held unacked: the API still says 19,995
    /// unacked (stale) while AMQP says 19,995 ready (fresh).
    #[test]
    fn the_threshold_never_adds_a_fresh_count_to_a_stale_one() {
        let mut dlq = q("a.dlq", true, 19_995, Some(19_995));
        dlq.listed = Some(19_995);
        let r = report(vec![dlq.clone()]);
        assert_eq!(r.dlqs_over(20_000), vec![]);
        assert_eq!(r.dlqs_over(19_994)[0].messages, 19_995);
        // Messages held unacked by a reader right now: the API's sample
        // counts them.
        dlq.ready = Some(0);
        assert_eq!(dlq.total(), 19_995);
        // New dead letters since the sample: the fresh count.
        dlq.ready = Some(25_000);
        assert_eq!(dlq.total(), 25_000);
    }

    #[test]
    fn missing_lists_exchanges_then_every_missing_queue_without_hiding_others() {
        let mut r = report(vec![q("a.dlq", false, 0, None), q("b.dlq", true, 0, None)]);
        r.pipelines[1].tiers[0].queue.exists = false;
        r.missing_exchanges = vec!["a.dlx".into()];
        assert_eq!(
            r.missing(),
            vec!["exchange a.dlx", "queue a.dlq", "queue p1.retry.1s"]
        );
        assert_eq!(
            report(vec![q("a.dlq", true, 0, None)]).missing(),
            Vec::<String>::new()
        );
    }
}
