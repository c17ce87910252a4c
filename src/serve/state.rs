//! The server's state: the topology, a connection for status reads, the
//! sampled hour of each DLQ, the last summary of each DLQ, and the jobs.
//!
//! Two kinds of connection: one kept open for status reads (passive
//! declares and the management API, reopened when it drops), and one of its
//! own for each DLQ read or job. A DLQ command's lock is an exclusive queue,
//! and an exclusive queue declared twice on one connection succeeds: two
//! reads sharing a connection would not keep each other out.

use super::common::{for_the_page, Fail};
use super::flight::Flights;
use super::jobs::Jobs;
use crate::serve::history::{self, Health, History, Sample};
use dlqctl::amqp::mgmt::Management;
use dlqctl::amqp::Brokers;
use dlqctl::core::dlq::describe::Group;
use dlqctl::core::dlq::select::Selector;
use dlqctl::core::topology::plan::Plan;
use dlqctl::core::topology::{Pipeline, Topology};
use dlqctl::error::{Error, Result};
use dlqctl::ops::dlq::{PeekReport, SummaryReport, Target};
use dlqctl::ops::status::{PipelineStatus, StatusReport};
use lapin::Connection;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How old a summary may be for a group page to show its count.
pub const GROUP_COUNT_FRESH_MS: u64 = 10_000;

/// What `dlqctl serve` was started with.
#[derive(Clone)]
pub struct ServeOptions {
    /// The topology.
    pub topology: Topology,
    /// The topology file, as the page names it.
    pub file: String,
    /// The brokers.
    pub brokers: Brokers,
    /// `--management-url`, one per broker address (empty: derived).
    pub management_urls: Vec<String>,
    /// Where the server listens.
    pub listen: SocketAddr,
    /// Hide and refuse every action.
    pub read_only: bool,
    /// The token every request must carry (`Authorization: Bearer`, or the
    /// login form's cookie).
    pub auth_token: Option<String>,
    /// A DLQ over this many messages is a warning.
    pub warn_dlq: Option<u64>,
    /// A DLQ over this many messages is an alert.
    pub max_dlq: Option<u64>,
    /// How often the chart's sample is taken.
    pub sample_every: Duration,
    /// Host names besides loopback's the page answers to without a token.
    pub allow_hosts: Vec<String>,
    /// The DLQ read window of each read and job (`--window`).
    pub window: u32,
    /// Workers' metrics pages (`--metrics-url`): their circuit breakers
    /// and readiness.
    pub metrics_urls: Vec<String>,
}

/// The connection kept for status reads, with its broker's management API.
struct StatusConn {
    conn: Arc<Connection>,
    at: usize,
    mgmt: Option<Management>,
}

/// What a page's peek asks: requests asking the same share one read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PeekKey {
    pipeline: String,
    /// The selector, spelt out (its `Debug` form names every field).
    selector: String,
    skip: u16,
    limit: u16,
}

/// A summary, and when it was made.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CachedSummary {
    /// The report.
    #[serde(flatten)]
    pub report: SummaryReport,
    /// When it was made (ms since the Unix epoch).
    pub at_ms: u64,
    /// False when the DLQ was busy and this is an older summary.
    pub fresh: bool,
    /// Why it is not fresh.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_because: Option<String>,
}

/// One pipeline on the overview.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PipelineView {
    /// Its queues, as `dlqctl status --json` reports them.
    #[serde(flatten)]
    pub status: PipelineStatus,
    /// Its colour.
    pub health: Health,
    /// The DLQ's sampled hour, oldest first.
    pub history: Vec<Sample>,
    /// The DLQ's growth over that hour.
    pub inflow_last_hour: u64,
    /// The job running on its DLQ, when one is.
    pub running_job: Option<u64>,
}

/// The overview: every pipeline.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Overview {
    /// The topology file.
    pub file: String,
    /// The broker addresses (no credentials).
    pub brokers: String,
    /// Each pipeline, in file order.
    pub pipelines: Vec<PipelineView>,
    /// Missing exchanges and queues.
    pub missing: Vec<String>,
    /// Why unacked counts and `messages_dlx` are unknown, when they are.
    pub management_unavailable: Option<String>,
    /// The readiness of each worker whose metrics page was read.
    pub workers: Vec<dlqctl::ops::status::WorkerReadiness>,
    /// Why a worker's metrics page could not be read, when one could not.
    pub circuit_unknown: Option<String>,
    /// `--warn-dlq`.
    pub warn_dlq: Option<u64>,
    /// `--max-dlq`.
    pub max_dlq: Option<u64>,
    /// How often the chart is sampled.
    pub sample_every_ms: u64,
    /// Whether actions are off.
    pub read_only: bool,
    /// When this was read (ms since the Unix epoch).
    pub at_ms: u64,
}

/// The server.
pub struct App {
    /// What it was started with.
    pub opts: ServeOptions,
    /// The CSRF token every POST of the page carries (one per server run).
    pub csrf: String,
    /// The login cookie's value with `--auth-token` (one per server run:
    /// a cookie of an earlier run is not taken).
    pub login_cookie: Option<String>,
    /// Throttles token guesses.
    pub throttle: Mutex<crate::serve::web_guard::Throttle>,
    plan: Plan,
    status_conn: tokio::sync::Mutex<Option<StatusConn>>,
    history: Mutex<HashMap<String, History>>,
    summaries: Mutex<HashMap<String, CachedSummary>>,
    gates: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    summary_reads: Flights<String, CachedSummary>,
    peek_reads: Flights<PeekKey, PeekReport>,
    /// The jobs.
    pub jobs: Jobs,
    /// Cancelled when the server stops.
    pub stop: CancellationToken,
}

impl App {
    /// A server for `opts`, stopping with `stop`.
    pub fn new(opts: ServeOptions, stop: CancellationToken) -> Self {
        let plan = dlqctl::core::topology::plan(&opts.topology);
        App {
            csrf: format!("{:032x}", rand::random::<u128>()),
            login_cookie: opts.auth_token.as_deref().map(|t| {
                crate::serve::web_guard::cookie_value(t, &crate::serve::web_guard::random_token())
            }),
            throttle: Mutex::new(crate::serve::web_guard::Throttle::new(
                std::time::Instant::now(),
            )),
            plan,
            status_conn: tokio::sync::Mutex::new(None),
            history: Mutex::new(HashMap::new()),
            summaries: Mutex::new(HashMap::new()),
            gates: Mutex::new(HashMap::new()),
            summary_reads: Flights::default(),
            peek_reads: Flights::default(),
            jobs: Jobs::new(),
            stop,
            opts,
        }
    }

    /// The pipeline named `name`: 404 naming every pipeline when none is.
    pub fn pipeline(&self, name: &str) -> Result<&Pipeline, Fail> {
        self.opts.topology.pipeline(name).ok_or_else(|| {
            let names: Vec<&str> = self
                .opts
                .topology
                .pipelines
                .iter()
                .map(|p| p.name.as_str())
                .collect();
            Fail::not_found(format!(
                "{name:?} is not a pipeline of {} (pipelines: {})",
                self.opts.file,
                names.join(", ")
            ))
        })
    }

    /// The status connection, opened (again) when it is not open.
    async fn status_conn(&self) -> Result<(Arc<Connection>, usize, Option<Management>)> {
        let mut slot = self.status_conn.lock().await;
        if let Some(s) = slot.as_ref() {
            if s.conn.status().connected() {
                return Ok((s.conn.clone(), s.at, s.mgmt.clone()));
            }
        }
        let (conn, at) = self.opts.brokers.connect("dlqctl serve").await?;
        let conn = Arc::new(conn);
        let mgmt = self
            .opts
            .brokers
            .management(&self.opts.management_urls, at)
            .ok();
        *slot = Some(StatusConn {
            conn: conn.clone(),
            at,
            mgmt: mgmt.clone(),
        });
        Ok((conn, at, mgmt))
    }

    /// Whether the broker answers: the status connection is open, or
    /// opens now.
    pub async fn broker_reachable(&self) -> Result<()> {
        self.status_conn().await.map(|_| ())
    }

    /// Forgets the status connection after a failure on it.
    async fn drop_status_conn(&self) {
        if let Some(s) = self.status_conn.lock().await.take() {
            dlqctl::amqp::connection::close(&s.conn).await;
        }
    }

    /// Every queue of the topology, as `dlqctl status` reads them.
    pub async fn status(&self) -> Result<StatusReport> {
        let (conn, at, mgmt) = self.status_conn().await?;
        let vhost = self.opts.brokers.get(at).vhost().to_string();
        let result = dlqctl::ops::status::status(&conn, &self.plan, mgmt.as_ref(), &vhost).await;
        if result.is_err() {
            self.drop_status_conn().await;
        }
        let mut report = result?;
        for url in &self.opts.metrics_urls {
            report.read_circuits(url).await;
        }
        Ok(report)
    }

    /// The ready messages of `queue` now (`None`: it does not exist).
    pub async fn ready(&self, queue: &str) -> Result<Option<u64>> {
        let (conn, _, _) = self.status_conn().await?;
        let result = dlqctl::amqp::declare::passive_queue(&conn, queue).await;
        if result.is_err() {
            self.drop_status_conn().await;
        }
        Ok(result?.map(|c| u64::from(c.ready)))
    }

    /// Records one sample of every DLQ from `report`.
    fn record(&self, report: &StatusReport, at_ms: u64) {
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        for p in &report.pipelines {
            let depth = p.dlq.exists.then(|| p.dlq.total());
            h.entry(p.name.clone()).or_default().push(at_ms, depth);
        }
    }

    /// The overview, read now, with each DLQ's sampled hour.
    pub async fn overview(&self) -> Result<Overview> {
        let report = self.status().await?;
        let missing = report.missing();
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let pipelines = report
            .pipelines
            .iter()
            .map(|p| {
                let h = history.get(&p.name);
                let queues = std::iter::once(&p.main)
                    .chain(p.tiers.iter().map(|t| &t.queue))
                    .chain(std::iter::once(&p.dlq));
                let all_exist = queues.clone().all(|q| q.exists);
                let held: u64 = queues.filter_map(|q| q.messages_dlx).sum();
                let paused = p.circuit.as_ref().is_some_and(|c| c.paused());
                PipelineView {
                    health: history::health(
                        all_exist,
                        p.dlq.total(),
                        held,
                        paused,
                        self.opts.warn_dlq,
                        self.opts.max_dlq,
                    ),
                    history: h.map(History::to_vec).unwrap_or_default(),
                    inflow_last_hour: h.map(History::inflow_total).unwrap_or(0),
                    running_job: self.jobs.running_on(&p.name),
                    status: p.clone(),
                }
            })
            .collect();
        Ok(Overview {
            file: self.opts.file.clone(),
            brokers: self.opts.brokers.endpoints(),
            pipelines,
            missing,
            management_unavailable: report.management_unavailable,
            workers: report.workers,
            circuit_unknown: report.circuit_unknown,
            warn_dlq: self.opts.warn_dlq,
            max_dlq: self.opts.max_dlq,
            sample_every_ms: self.opts.sample_every.as_millis() as u64,
            read_only: self.opts.read_only,
            at_ms: dlqctl::ops::dlq::now_ms(),
        })
    }

    /// A DLQ command's target on a connection of its own, named
    /// `dlqctl serve VERB PIPELINE`, stopping when `cancel` is cancelled.
    pub async fn target(
        &self,
        p: &Pipeline,
        verb: &str,
        cancel: CancellationToken,
    ) -> Result<Target> {
        let tag = format!("dlqctl serve {verb} {}", p.name);
        let (conn, at) = self.opts.brokers.connect(&tag).await?;
        let user = self.opts.brokers.get(at).user();
        Ok(Target::for_pipeline(Arc::new(conn), p, user, tag, cancel).window(self.opts.window))
    }

    /// The pipeline's shared redrive state (docs/dlq.md, "The shared
    /// wait"), read as `status` reads it, on the status connection.
    pub async fn redrive_state(
        &self,
        p: &Pipeline,
    ) -> Result<Option<dlqctl::core::dlq::redrive_state::RedriveState>> {
        // A lost connection is opened again by the next read.
        let (conn, _, _) = self.status_conn().await?;
        dlqctl::ops::dlq::redrive_state::peek(&conn, &p.redrive_state_queue()).await
    }

    /// Groups `pipeline`'s DLQ, as `dlq summary` does. When another command
    /// holds the DLQ, the last summary is returned marked not fresh (or the
    /// busy error, when there is none).
    pub async fn summary(&self, p: &Pipeline) -> Result<CachedSummary> {
        // Requests during a read of this DLQ share it (finding 14 of the
        // robustness pass: 88 page reads of one DLQ ran one by one).
        let policy = p.dead_letter.redrive.clone();
        let read = async {
            let report = self
                .page_read(p, "summary", |t| async move {
                    dlqctl::ops::dlq::summary_for(
                        &t,
                        &Selector::default(),
                        policy.as_ref(),
                        &mut |_| {},
                    )
                    .await
                })
                .await?;
            Ok(CachedSummary {
                report,
                at_ms: dlqctl::ops::dlq::now_ms(),
                fresh: true,
                stale_because: None,
            })
        };
        let result = self.summary_reads.join(p.name.clone(), read).await;
        let mut cache = self.summaries.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(s) => {
                cache.insert(p.name.clone(), s.clone());
                Ok(s)
            }
            Err(e @ Error::Busy { .. }) => match cache.get(&p.name) {
                Some(old) => Ok(CachedSummary {
                    fresh: false,
                    stale_because: Some(e.to_string()),
                    ..old.clone()
                }),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// `pipeline`'s last summary, when there is one.
    pub fn cached_summary(&self, pipeline: &str) -> Option<CachedSummary> {
        self.summaries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(pipeline)
            .cloned()
    }

    /// The group `id` of `pipeline`'s last summary, when it is younger than
    /// [`GROUP_COUNT_FRESH_MS`] (else, or when there is none, one is made
    /// now: the count shown is the count a purge is confirmed with).
    pub async fn group(&self, p: &Pipeline, id: &str) -> Result<Option<(Group, CachedSummary)>> {
        let cached = self
            .summaries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&p.name)
            .cloned();
        let now = dlqctl::ops::dlq::now_ms();
        let s = match cached {
            Some(s)
                if s.report.groups.iter().any(|g| g.id == id)
                    && now.saturating_sub(s.at_ms) < GROUP_COUNT_FRESH_MS =>
            {
                s
            }
            _ => self.summary(p).await?,
        };
        Ok(s.report
            .groups
            .iter()
            .find(|g| g.id == id)
            .cloned()
            .map(|g| (g, s.clone())))
    }

    /// Messages of `pipeline`'s DLQ matching `selector`, past the first
    /// `skip`, as `dlq peek` shows them.
    pub async fn peek(
        &self,
        p: &Pipeline,
        selector: &Selector,
        skip: u16,
        limit: u16,
    ) -> Result<PeekReport> {
        let key = PeekKey {
            pipeline: p.name.clone(),
            selector: format!("{selector:?}"),
            skip,
            limit,
        };
        let selector = selector.clone();
        let read = self.page_read(p, "peek", move |t| async move {
            dlqctl::ops::dlq::peek_from(&t, &selector, skip, limit).await
        });
        self.peek_reads.join(key, read).await
    }

    /// The gate of `pipeline`'s DLQ inside this server: a job holds it while
    /// it runs; a page read holds it while it reads. Page reads and jobs of
    /// this server so never meet at the broker's lock (which would fail one
    /// of them as busy): a job waits for the page reads in flight (short),
    /// and a page read during a job shows the last summary instead.
    pub fn gate(&self, pipeline: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(pipeline.to_string())
            .or_default()
            .clone()
    }

    /// Runs a page's read of `p`'s DLQ (`work`) on a task of its own, so
    /// that it always ends by [`dlqctl::ops::dlq::DlqReader::finish`] even
    /// when the browser goes away mid-load and the request is dropped: a
    /// read dropped mid-way would leave its rotated copies behind as
    /// duplicates. The dropped request cancels the read, which then stops
    /// after the copies in flight.
    async fn page_read<T, F, Fut>(&self, p: &Pipeline, verb: &str, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Target) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        if let Some(id) = self.jobs.running_on(&p.name) {
            return Err(Error::Busy {
                queue: p.dead_letter.queue.clone(),
                message: format!("job {id} of this page is working on it; see /jobs/{id}"),
            });
        }
        let gate = self.gate(&p.name).lock_owned().await;
        let cancel = self.stop.child_token();
        let on_drop = cancel.clone().drop_guard();
        let t = self.target(p, verb, cancel).await?;
        let task = tokio::spawn(async move {
            let _gate = gate;
            let conn = t.conn.clone();
            let r = work(t).await;
            dlqctl::amqp::connection::close(&conn).await;
            r
        });
        let r = task.await.map_err(|e| Error::Broker {
            context: format!("the page's {verb} of {}", p.dead_letter.queue),
            message: e.to_string(),
        })?;
        on_drop.disarm();
        r.map_err(for_the_page)
    }

    /// Stops: cancels every job, waits for each to stop after its copies
    /// in flight, closes the status connection.
    pub async fn shut_down(&self) {
        self.stop.cancel();
        self.jobs.wait_all().await;
        self.drop_status_conn().await;
    }
}

/// Takes a sample of every DLQ every `sample_every` until the server stops.
/// A failed read is a gap in the chart, logged once until reads work again.
pub async fn sample(app: Arc<App>) {
    let mut failing = false;
    let mut tick = tokio::time::interval(app.opts.sample_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = app.stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match app.status().await {
            Ok(report) => {
                if failing {
                    tracing::info!("serve: the DLQ sampler reads the broker again");
                    failing = false;
                }
                app.record(&report, dlqctl::ops::dlq::now_ms());
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("serve: cannot sample the DLQs: {e}");
                    failing = true;
                }
                let mut h = app.history.lock().unwrap_or_else(|e| e.into_inner());
                let now = dlqctl::ops::dlq::now_ms();
                for p in &app.opts.topology.pipelines {
                    h.entry(p.name.clone()).or_default().push(now, None);
                }
            }
        }
    }
}
