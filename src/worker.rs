//! The worker: consumes a pipeline's main queue, runs a [`Handler`] per
//! message, and acks, retries through a delay tier, or dead-letters, never
//! losing a message (DESIGN.md, "Attempts and decisions").
//!
//! Deliveries come on one channel; copies are published on another, in
//! confirm mode, with many confirms in flight. A copy is `mandatory` and
//! persistent, and the original is acked only once the broker confirmed
//! the copy without returning it. When the broker refuses a copy the
//! original stays unacked, no new handler starts, and the publish is
//! retried with capped backoff. A delivery is never requeued to retry it:
//! messages go back to the queue only when their channel closes (shutdown,
//! lost connection).

use crate::broker::{describe_lapin_error, BrokerUrl};
use crate::core::breaker::{Breaker, State as BreakerState};
use crate::core::duration::tier_name;
use crate::core::outcome::Outcome;
use crate::core::retry::{
    count_attempt, dead_letter_copy, decide, headers_to_json, jitter_expiration,
    original_exchange_and_key, retry_copy, CopyContext, DeadLetterReason, Decision,
};
use crate::core::topology::{Pipeline, QueueType};
use crate::error::{Error, Result};
use crate::handler::{Handler, HandlerMessage};
use crate::metrics::{Metrics, QueueCounters};
use crate::provision::Finding;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

/// How a dead-letter is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterMode {
    /// Publish a copy with the final diagnosis to the DLX, then ack.
    Republish,
    /// `basic.nack(requeue=false)`: the main queue's DLX moves the message
    /// (the final error is not recorded).
    Nack,
}

/// Settings of a worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The pipeline to consume (its main queue).
    pub pipeline: Pipeline,
    /// The broker.
    pub url: BrokerUrl,
    /// Unacked deliveries the broker may push ahead of the handlers.
    pub prefetch: u16,
    /// Handler runs at once.
    pub concurrency: usize,
    /// How to dead-letter.
    pub dead_letter: DeadLetterMode,
    /// At shutdown, how long in-flight handlers may take.
    pub grace: Duration,
    /// How long to wait for a publisher confirm before counting the copy
    /// as refused.
    pub confirm_timeout: Duration,
    /// Publishing channels, each with many copies in flight (at most
    /// `concurrency` are used).
    pub publish_channels: usize,
    /// The largest pause between two tries of a refused publish.
    pub max_publish_backoff: Duration,
    /// The largest pause between two reconnection attempts.
    pub max_reconnect_backoff: Duration,
}

impl WorkerConfig {
    /// Defaults for a pipeline: prefetch 50, one handler at a time,
    /// republish dead-letters, 30 s grace.
    pub fn new(pipeline: Pipeline, url: BrokerUrl) -> Self {
        WorkerConfig {
            pipeline,
            url,
            prefetch: 50,
            concurrency: 1,
            dead_letter: DeadLetterMode::Republish,
            grace: Duration::from_secs(30),
            confirm_timeout: Duration::from_secs(30),
            publish_channels: 4,
            max_publish_backoff: Duration::from_secs(5),
            max_reconnect_backoff: Duration::from_secs(30),
        }
    }
}

/// A worker for one pipeline and one handler.
pub struct Worker<H: Handler> {
    cfg: Arc<WorkerConfig>,
    handler: Arc<H>,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
}

/// State shared by every delivery task.
struct Shared {
    retry_queues: Vec<String>,
    /// Tasks currently retrying a refused publish: no new handler starts
    /// while this is above zero.
    refusing: AtomicUsize,
    unblocked: Notify,
    breaker: Option<Mutex<Breaker>>,
    started: Instant,
    warned: Mutex<HashSet<String>>,
    counters: QueueCounters,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Logs a header warning once per distinct text.
    fn warn_once(&self, text: &str) {
        let first = self
            .warned
            .lock()
            .map(|mut w| w.len() < 1000 && w.insert(text.to_string()))
            .unwrap_or(false);
        if first {
            warn!(warning = text, "malformed header, treated as absent");
        }
    }
}

enum SessionEnd {
    Shutdown,
    Lost(String),
}

impl<H: Handler> Worker<H> {
    /// A worker with its own metrics.
    pub fn new(cfg: WorkerConfig, handler: H) -> Self {
        Self::with_metrics(cfg, handler, Arc::new(Metrics::new()))
    }

    /// A worker that counts into `metrics`.
    pub fn with_metrics(cfg: WorkerConfig, handler: H, metrics: Arc<Metrics>) -> Self {
        let shared = Shared {
            retry_queues: cfg.pipeline.retry_queues(),
            refusing: AtomicUsize::new(0),
            unblocked: Notify::new(),
            breaker: cfg
                .pipeline
                .circuit_breaker
                .clone()
                .map(|c| Mutex::new(Breaker::new(c))),
            started: Instant::now(),
            warned: Mutex::new(HashSet::new()),
            counters: metrics.queue_counters(&cfg.pipeline.name),
        };
        Worker {
            cfg: Arc::new(cfg),
            handler: Arc::new(handler),
            metrics,
            shared: Arc::new(shared),
        }
    }

    /// The worker's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Runs until `shutdown` is cancelled. The first connection and the
    /// topology check must succeed (else the error is returned); after that,
    /// a lost connection is retried with capped exponential backoff.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<()> {
        let mut backoff = Duration::from_millis(200);
        let mut first = true;
        let mut last_error: Option<String> = None;
        loop {
            let started = Instant::now();
            let end = self.session(&shutdown).await;
            let end = match end {
                Ok(SessionEnd::Shutdown) => return Ok(()),
                Err(e) if first => return Err(e),
                other => other,
            };
            match &end {
                Ok(SessionEnd::Shutdown) => {}
                Ok(SessionEnd::Lost(reason)) => {
                    warn!(queue = %self.cfg.pipeline.name, reason = %reason, "connection lost; reconnecting");
                }
                Err(e) => {
                    // The same failure again is not a new transition.
                    let text = e.to_string();
                    if last_error.as_deref() == Some(text.as_str()) {
                        debug!(queue = %self.cfg.pipeline.name, error = %text, retry_in_ms = backoff.as_millis() as u64, "still cannot resume");
                    } else {
                        warn!(queue = %self.cfg.pipeline.name, error = %text, retry_in_ms = backoff.as_millis() as u64, "cannot resume; retrying with backoff");
                    }
                    last_error = Some(text);
                }
            }
            if matches!(end, Ok(SessionEnd::Lost(_))) {
                last_error = None;
            }
            first = false;
            if started.elapsed() > Duration::from_secs(30) {
                backoff = Duration::from_millis(200);
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(self.cfg.max_reconnect_backoff);
            self.metrics.reconnects.inc();
        }
    }

    async fn session(&self, shutdown: &CancellationToken) -> Result<SessionEnd> {
        let p = &self.cfg.pipeline;
        let conn = Arc::new(
            self.cfg
                .url
                .connect(&format!("dlqctl work {}", p.name))
                .await?,
        );
        verify_topology(&conn, p).await?;
        let consume = conn
            .create_channel()
            .await
            .map_err(|e| Error::broker("cannot open the consuming channel", &e))?;
        consume
            .basic_qos(self.cfg.prefetch, BasicQosOptions { global: false })
            .await
            .map_err(|e| Error::broker("cannot set the prefetch", &e))?;
        let publisher = Arc::new(Publisher::new(
            conn.clone(),
            self.cfg.publish_channels.min(self.cfg.concurrency),
            self.cfg.confirm_timeout,
        ));
        publisher.warm_up().await.map_err(|e| Error::Broker {
            context: "cannot open the publishing channel".into(),
            message: e,
        })?;
        let mut consumer = consume
            .basic_consume(
                p.name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::broker(format!("cannot consume from queue {}", p.name), &e))?;
        info!(queue = %p.name, prefetch = self.cfg.prefetch, concurrency = self.cfg.concurrency, "consuming");

        let permits = Arc::new(Semaphore::new(self.cfg.concurrency.max(1)));
        let tracker = TaskTracker::new();
        // Cancelled when the session is lost: handlers still running then
        // could neither ack nor publish, and their messages are already
        // back in the queue; stopping them keeps the concurrency bound.
        let lost = CancellationToken::new();
        let end = loop {
            // Gates before the next handler may start. Waiting at one of
            // them, the worker is not reading the consumer, which is where
            // a lost connection shows: watch the channel too, so that busy
            // handlers or an open breaker do not delay the reconnection.
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break SessionEnd::Shutdown,
                _ = channel_closed(&consume) => break SessionEnd::Lost(CLOSED_WHILE_WAITING.into()),
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break SessionEnd::Shutdown,
                },
            };
            if let Some(end) = self.wait_gates_or_loss(shutdown, &consume).await {
                break end;
            }
            let next = tokio::select! {
                _ = shutdown.cancelled() => break SessionEnd::Shutdown,
                n = consumer.next() => n,
            };
            let delivery = match next {
                Some(Ok(d)) => d,
                Some(Err(e)) => break SessionEnd::Lost(describe_lapin_error(&e)),
                None => break SessionEnd::Lost("the broker cancelled the consumer".into()),
            };
            // Again: a copy may have been refused (or the breaker opened)
            // while we waited for this delivery. On shutdown the delivery,
            // left unacked, returns to the queue when the channel closes.
            if let Some(end) = self.wait_gates_or_loss(shutdown, &consume).await {
                break end;
            }
            let task = DeliveryTask {
                cfg: self.cfg.clone(),
                handler: self.handler.clone(),
                metrics: self.metrics.clone(),
                shared: self.shared.clone(),
                publisher: publisher.clone(),
                consume: consume.clone(),
                user: self.cfg.url.user().to_string(),
                shutdown: shutdown.clone(),
                lost: lost.clone(),
            };
            tracker.spawn(async move {
                task.process(delivery).await;
                drop(permit);
            });
        };
        tracker.close();
        const NETWORK_STEP: Duration = Duration::from_secs(5);
        match &end {
            SessionEnd::Shutdown => {
                info!(queue = %p.name, in_flight = tracker.len(), "stopping: no new messages; waiting for handlers in flight");
                let cancel = consume.basic_cancel(consumer.tag(), BasicCancelOptions::default());
                let _ = tokio::time::timeout(NETWORK_STEP, cancel).await;
                if tokio::time::timeout(self.cfg.grace, tracker.wait())
                    .await
                    .is_err()
                {
                    warn!(queue = %p.name, left = tracker.len(), "grace period over; unfinished messages return to the queue");
                }
            }
            SessionEnd::Lost(_) => {
                lost.cancel();
                let _ = tokio::time::timeout(NETWORK_STEP, tracker.wait()).await;
            }
        }
        // Closing returns every unacked delivery to the queue.
        let close = conn.close(200, "dlqctl worker stopping".into());
        let _ = tokio::time::timeout(NETWORK_STEP, close).await;
        Ok(end)
    }

    /// [`Self::wait_gates`], ending the session when the consuming channel
    /// closes meanwhile.
    async fn wait_gates_or_loss(
        &self,
        shutdown: &CancellationToken,
        consume: &Channel,
    ) -> Option<SessionEnd> {
        tokio::select! {
            _ = channel_closed(consume) => Some(SessionEnd::Lost(CLOSED_WHILE_WAITING.into())),
            end = self.wait_gates(shutdown) => end,
        }
    }

    /// Waits while copies are being refused or the breaker is open.
    async fn wait_gates(&self, shutdown: &CancellationToken) -> Option<SessionEnd> {
        loop {
            if self.shared.refusing.load(Ordering::SeqCst) > 0 {
                let notified = self.shared.unblocked.notified();
                if self.shared.refusing.load(Ordering::SeqCst) == 0 {
                    continue;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return Some(SessionEnd::Shutdown),
                    _ = notified => continue,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                }
            }
            let state = match &self.shared.breaker {
                Some(b) => b
                    .lock()
                    .map(|mut b| b.state(self.shared.now_ms()))
                    .unwrap_or(BreakerState::Closed),
                None => BreakerState::Closed,
            };
            match state {
                BreakerState::Closed => {
                    self.metrics.circuit_open.set(0);
                    return None;
                }
                BreakerState::Open { remaining_ms } => {
                    self.metrics.circuit_open.set(1);
                    tokio::select! {
                        _ = shutdown.cancelled() => return Some(SessionEnd::Shutdown),
                        _ = tokio::time::sleep(Duration::from_millis(remaining_ms.max(1))) => {}
                    }
                }
            }
        }
    }
}

const CLOSED_WHILE_WAITING: &str =
    "the connection or the consuming channel closed while no handler could start";

/// Resolves once `ch` is no longer usable: its connection is gone or the
/// broker closed it. Nothing signals that on a consumer that is not being
/// read, so the status is polled.
async fn channel_closed(ch: &Channel) {
    while ch.status().connected() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks that every object the worker uses exists with the arguments the
/// topology gives it (the worker relies on them: a quorum main queue holds
/// a refused dead-letter, a classic one would drop it), naming each missing
/// or different object. Uses `provision --check`'s method; without
/// configure permission the arguments cannot be compared, which is logged.
pub async fn verify_topology(conn: &Connection, p: &Pipeline) -> Result<()> {
    let mut plan = crate::core::topology::plan::pipeline_plan(p);
    plan.exchanges
        .retain(|e| e.role != crate::core::topology::plan::Role::ProducerExchange);
    plan.bindings.clear();
    let report = crate::provision::check(conn, &plan, None, "/", 4).await?;
    let mut missing = Vec::new();
    let mut differs = Vec::new();
    for f in &report.findings {
        match f {
            Finding::Missing { object, name } => {
                missing.push(format!("{} {name}", object.as_str()))
            }
            Finding::Differs { .. } => differs.push(f.to_string()),
            Finding::Failed { message, .. } if message.contains("403") => {
                warn!(finding = %f, "cannot compare the topology's arguments (no configure permission); trusting the file");
            }
            Finding::Failed { .. } => differs.push(f.to_string()),
            Finding::Unverified { .. } => {}
        }
    }
    if !missing.is_empty() {
        return Err(Error::Broker {
            context: format!("pipeline {} is not provisioned", p.name),
            message: format!(
                "missing {}; run `dlqctl provision` on the topology file first",
                missing.join(", ")
            ),
        });
    }
    if !differs.is_empty() {
        return Err(Error::Broker {
            context: format!("pipeline {} differs from the topology file", p.name),
            message: format!("{}; see `dlqctl provision --check`", differs.join("; ")),
        });
    }
    Ok(())
}

/// Why a copy did not make it.
#[derive(Debug)]
enum Refusal {
    /// `basic.nack` from the broker (a full queue with reject-publish).
    Nacked,
    /// Returned as unroutable (`mandatory`).
    Returned(String),
    /// No confirm in time.
    Timeout,
    /// The channel failed (404 on a missing exchange, closed, ...).
    Channel(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Nacked => {
                f.write_str("the broker nacked the copy (is the target queue full?)")
            }
            Refusal::Returned(why) => {
                write!(f, "the broker returned the copy as unroutable: {why}")
            }
            Refusal::Timeout => f.write_str("no publisher confirm in time"),
            Refusal::Channel(e) => write!(f, "publishing channel error: {e}"),
        }
    }
}

/// The verdict on one copy.
type Verdict = std::result::Result<(), Refusal>;

/// Confirm-mode publishing channels ("lanes"), each with many copies in
/// flight and a collector task that owns their confirms.
///
/// lapin does not tie a `basic.return` to the publish it belongs to: it
/// hands the oldest waiting return to the next confirm it completes (a
/// multiple ack completes its tags in no set order). So a returned copy
/// can read as `Ack(None)` while another copy's confirm carries its return.
/// What holds: the broker sends a copy's return before its ack, and the
/// confirm that takes that return is resolved no later than the copy's own
/// (earlier in the same frame, or in an earlier frame). So the collector
/// decides in batches: it takes the lane's gate (held by publishers from
/// `basic.publish` until the confirm is handed over, so every published
/// confirm is known), takes every confirm that is ready, and when any of
/// them carries a return, no verdict on that lane can be trusted: every
/// copy of the batch and every copy still in flight is refused, and the
/// lane is retired (its copies are published again elsewhere; a duplicate
/// is possible, a loss is not).
struct Publisher {
    conn: Arc<Connection>,
    lanes: Vec<tokio::sync::Mutex<Option<Arc<Lane>>>>,
    next: AtomicUsize,
    confirm_timeout: Duration,
}

/// One publishing channel, as publishers see it.
struct Lane {
    channel: Channel,
    /// Registers a published confirm with the collector.
    register: mpsc::UnboundedSender<Pending>,
    state: Arc<LaneState>,
}

/// What a lane's publishers and its collector share.
struct LaneState {
    /// Held from `basic.publish` until its confirm is registered, and by
    /// the collector while it takes a batch.
    gate: tokio::sync::Mutex<()>,
    /// No new copy goes to a retired lane; it is closed once answered.
    retired: AtomicBool,
    /// Why it was retired (a return, a confirm timeout).
    retired_because: Mutex<String>,
    /// Wakes the collector when a publisher retires the lane.
    retire: Notify,
}

impl LaneState {
    fn retire(&self, because: &str) {
        if let Ok(mut b) = self.retired_because.lock() {
            if b.is_empty() {
                *b = because.to_string();
            }
        }
        self.retired.store(true, Ordering::SeqCst);
        self.retire.notify_one();
    }

    fn because(&self) -> String {
        self.retired_because
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default()
    }
}

/// A confirm as the collector holds it: (its number, the confirm).
type Done = (u64, lapin::Result<Confirmation>);

/// A published copy waiting for its confirm.
struct Pending {
    confirm: PublisherConfirm,
    reply: oneshot::Sender<Verdict>,
}

impl Publisher {
    fn new(conn: Arc<Connection>, channels: usize, confirm_timeout: Duration) -> Self {
        Publisher {
            conn,
            lanes: (0..channels.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
            confirm_timeout,
        }
    }

    /// The next lane, round-robin, opening a channel where none is usable.
    async fn lane(&self) -> std::result::Result<Arc<Lane>, String> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        let mut slot = self.lanes[i].lock().await;
        if let Some(l) = slot.as_ref() {
            if !l.state.retired.load(Ordering::SeqCst) && l.channel.status().connected() {
                return Ok(l.clone());
            }
        }
        let channel = self
            .conn
            .create_channel()
            .await
            .map_err(|e| describe_lapin_error(&e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| describe_lapin_error(&e))?;
        let (register, registered) = mpsc::unbounded_channel();
        let state = Arc::new(LaneState {
            gate: tokio::sync::Mutex::new(()),
            retired: AtomicBool::new(false),
            retired_because: Mutex::new(String::new()),
            retire: Notify::new(),
        });
        tokio::spawn(collect(channel.clone(), state.clone(), registered));
        let lane = Arc::new(Lane {
            channel,
            register,
            state,
        });
        *slot = Some(lane.clone());
        Ok(lane)
    }

    /// Checks that a publishing channel can be opened.
    async fn warm_up(&self) -> std::result::Result<(), String> {
        self.lane().await.map(|_| ())
    }

    /// Publishes `mandatory` and waits for the verdict, the whole within
    /// the confirm timeout.
    async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> std::result::Result<(), Refusal> {
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        let mut tries = 0;
        let (lane, verdict) = loop {
            tries += 1;
            let lane = tokio::time::timeout_at(deadline, self.lane())
                .await
                .map_err(|_| Refusal::Timeout)?
                .map_err(Refusal::Channel)?;
            let gate = tokio::time::timeout_at(deadline, lane.state.gate.lock())
                .await
                .map_err(|_| Refusal::Timeout)?;
            if lane.state.retired.load(Ordering::SeqCst) {
                drop(gate);
                if tries <= self.lanes.len() {
                    continue;
                }
                return Err(Refusal::Channel(format!(
                    "publishing channel retired: {}",
                    lane.state.because()
                )));
            }
            let published = tokio::time::timeout_at(
                deadline,
                lane.channel.basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    body,
                    props.clone(),
                ),
            )
            .await;
            let confirm = match published {
                Err(_) => {
                    // Its confirm may exist but is lost to the collector:
                    // nothing on this lane can be trusted any more.
                    lane.state.retire("a publish timed out");
                    return Err(Refusal::Timeout);
                }
                Ok(Err(e)) => {
                    lane.state.retire("a publish failed");
                    return Err(Refusal::Channel(describe_lapin_error(&e)));
                }
                Ok(Ok(c)) => c,
            };
            let (reply, verdict) = oneshot::channel();
            if lane.register.send(Pending { confirm, reply }).is_err() {
                lane.state.retire("its collector stopped");
                return Err(Refusal::Channel(
                    "the publishing channel's collector stopped".into(),
                ));
            }
            drop(gate);
            break (lane, verdict);
        };
        match tokio::time::timeout_at(deadline, verdict).await {
            Err(_) => {
                // A confirm may still come for this copy: retire the lane.
                lane.state.retire("a confirm timed out");
                Err(Refusal::Timeout)
            }
            Ok(Err(_)) => Err(Refusal::Channel(
                "the publishing channel's collector stopped".into(),
            )),
            Ok(Ok(v)) => v,
        }
    }
}

/// A lane's collector: answers each copy once its confirm, and every
/// confirm that could carry its return, has been seen (see [`Publisher`]).
async fn collect(
    channel: Channel,
    state: Arc<LaneState>,
    mut registered: mpsc::UnboundedReceiver<Pending>,
) {
    let mut confirms: FuturesUnordered<BoxFuture<'static, Done>> = FuturesUnordered::new();
    let mut replies: HashMap<u64, oneshot::Sender<Verdict>> = HashMap::new();
    let mut next_id: u64 = 0;
    let mut add = |p: Pending,
                   confirms: &mut FuturesUnordered<BoxFuture<'static, Done>>,
                   replies: &mut HashMap<u64, oneshot::Sender<Verdict>>| {
        let id = next_id;
        next_id += 1;
        replies.insert(id, p.reply);
        confirms.push(p.confirm.map(move |r| (id, r)).boxed());
    };
    let mut open = true;
    loop {
        // Every publisher is gone and every copy answered.
        if !open && confirms.is_empty() {
            break;
        }
        let first: Option<Done> = tokio::select! {
            _ = state.retire.notified() => None,
            p = registered.recv(), if open => {
                match p {
                    Some(p) => add(p, &mut confirms, &mut replies),
                    None => open = false,
                }
                continue;
            }
            Some(d) = confirms.next(), if !confirms.is_empty() => Some(d),
        };
        // Under the gate: every published confirm is registered, then
        // every ready one is taken (a confirm that carries the return of a
        // copy taken here is resolved before that copy's).
        let gate = state.gate.lock().await;
        while let Ok(p) = registered.try_recv() {
            add(p, &mut confirms, &mut replies);
        }
        let mut batch: Vec<Done> = first.into_iter().collect();
        while let Some(Some(d)) = confirms.next().now_or_never() {
            batch.push(d);
        }
        let returned = batch.iter().find_map(|(_, r)| match r {
            Ok(Confirmation::Ack(Some(m))) | Ok(Confirmation::Nack(Some(m))) => {
                Some(format!("{} {}", m.reply_code, m.reply_text))
            }
            _ => None,
        });
        if let Some(why) = &returned {
            state.retire(&format!("a copy was returned ({why})"));
        }
        let retired = state.retired.load(Ordering::SeqCst);
        drop(gate);
        if retired {
            let because = state.because();
            let why = match returned {
                Some(r) => format!("{r}; returned on this channel, which is retired"),
                None => format!("channel retired: {because}"),
            };
            for (_, reply) in replies.drain() {
                let _ = reply.send(Err(if because.starts_with("a copy was returned") {
                    Refusal::Returned(why.clone())
                } else {
                    Refusal::Channel(why.clone())
                }));
            }
            break;
        }
        for (id, r) in batch {
            let verdict = match r {
                Ok(Confirmation::Ack(None)) => Ok(()),
                Ok(Confirmation::Nack(None)) => Err(Refusal::Nacked),
                Ok(Confirmation::NotRequested) => {
                    Err(Refusal::Channel("publisher confirms are off".into()))
                }
                // Not reached: a returned copy retires the lane above.
                Ok(Confirmation::Ack(Some(m))) | Ok(Confirmation::Nack(Some(m))) => Err(
                    Refusal::Returned(format!("{} {}", m.reply_code, m.reply_text)),
                ),
                Err(e) => Err(Refusal::Channel(describe_lapin_error(&e))),
            };
            if let Some(reply) = replies.remove(&id) {
                let _ = reply.send(verdict);
            }
        }
    }
    drop(confirms);
    let close = channel.close(200, "dlqctl publishing channel retired".into());
    let _ = tokio::time::timeout(Duration::from_secs(5), close).await;
}

/// Everything one delivery needs.
struct DeliveryTask<H: Handler> {
    cfg: Arc<WorkerConfig>,
    handler: Arc<H>,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
    publisher: Arc<Publisher>,
    consume: Channel,
    user: String,
    shutdown: CancellationToken,
    lost: CancellationToken,
}

/// What became of a copy after retries.
enum Published {
    /// Confirmed.
    Done,
    /// A quorum pipeline's DLQ refused it: fall back to nack(requeue=false).
    FallBackToNack,
    /// The delivery's channel is gone or we are stopping: the original
    /// returns to the queue by itself.
    Abandoned,
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl<H: Handler> DeliveryTask<H> {
    async fn process(self, d: Delivery) {
        let p = &self.cfg.pipeline;
        let headers = d.properties.headers().as_ref();
        let count = count_attempt(headers, &self.shared.retry_queues);
        for w in &count.warnings {
            self.shared.warn_once(w);
        }
        let attempt = count.attempt;
        let (orig_exchange, orig_key) =
            original_exchange_and_key(headers, d.exchange.as_str(), d.routing_key.as_str());
        let message_id = d.properties.message_id().as_ref().map(|m| m.to_string());

        // A message that arrives with its runs already used up (max_attempts
        // was lowered, or another tool counted them) is not run again.
        let (outcome, ran) = if attempt > p.retry.max_attempts {
            (
                Outcome::transient(format!(
                    "attempts already used up ({} of {}) when delivered",
                    attempt - 1,
                    p.retry.max_attempts
                )),
                false,
            )
        } else {
            let msg = HandlerMessage {
                body: d.data.clone(),
                queue: p.name.clone(),
                message_id: message_id.clone(),
                content_type: d.properties.content_type().as_ref().map(|c| c.to_string()),
                attempt,
                max_attempts: p.retry.max_attempts,
                exchange: orig_exchange.clone(),
                routing_key: orig_key.clone(),
                headers: headers_to_json(headers),
            };
            self.metrics.in_flight.inc();
            let t0 = Instant::now();
            let run = AssertUnwindSafe(self.handler.handle(&msg)).catch_unwind();
            let outcome = tokio::select! {
                o = run => o.unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Outcome::transient(format!("the handler panicked: {what}"))
                }),
                _ = self.lost.cancelled() => {
                    self.metrics.in_flight.dec();
                    debug!(queue = %p.name, "connection lost during the handler run; its message is redelivered");
                    return;
                }
            };
            self.metrics
                .handler_seconds
                .observe(t0.elapsed().as_secs_f64());
            self.metrics.in_flight.dec();
            self.shared.counters.outcome(outcome.label());
            if let Some(b) = &self.shared.breaker {
                let transient = matches!(outcome, Outcome::Transient { .. });
                if let Ok(mut b) = b.lock() {
                    if b.record(self.shared.now_ms(), transient) {
                        warn!(queue = %p.name, "circuit breaker open: pausing consumption");
                    }
                }
            }
            (outcome, true)
        };
        let decision = if ran {
            decide(&p.retry, attempt, &outcome)
        } else {
            Decision::DeadLetter {
                reason: DeadLetterReason::Exhausted,
            }
        };
        let error = match &outcome {
            Outcome::Success => "",
            Outcome::Transient { error, .. } | Outcome::Permanent { error } => error.as_str(),
        };
        let ctx = CopyContext {
            attempt: if ran { attempt } else { attempt - 1 },
            error,
            now_unix_ms: now_unix_ms(),
            delivery_exchange: d.exchange.as_str(),
            delivery_routing_key: d.routing_key.as_str(),
            connection_user: &self.user,
        };
        let label = match decision {
            Decision::Ack => {
                self.ack(&d).await;
                "ack"
            }
            Decision::Retry { delay_ms } => {
                let expiration = jitter_expiration(delay_ms, p.retry.jitter, rand::random::<f64>());
                let props = retry_copy(&d.properties, &ctx, expiration);
                match self
                    .publish_until_confirmed(
                        &p.retry_exchange(),
                        &tier_name(delay_ms),
                        &d,
                        props,
                        false,
                    )
                    .await
                {
                    Published::Done => {
                        self.ack(&d).await;
                        "retry"
                    }
                    _ => "abandoned",
                }
            }
            Decision::DeadLetter { reason } => match self.cfg.dead_letter {
                DeadLetterMode::Nack => {
                    self.nack_to_dlx(&d).await;
                    "dead_letter_nack"
                }
                DeadLetterMode::Republish => {
                    let props = dead_letter_copy(&d.properties, &ctx, reason, &p.name, ran);
                    let quorum = p.queue_type == QueueType::Quorum;
                    match self
                        .publish_until_confirmed(
                            &p.dead_letter_exchange(),
                            &p.name,
                            &d,
                            props,
                            quorum,
                        )
                        .await
                    {
                        Published::Done => {
                            self.ack(&d).await;
                            "dead_letter"
                        }
                        Published::FallBackToNack => {
                            warn!(queue = %p.name, message_id = message_id.as_deref().unwrap_or(""),
                                "the DLQ refused the copy; nacking so the broker holds the message for its DLX until the DLQ has room");
                            self.nack_to_dlx(&d).await;
                            "dead_letter_nack"
                        }
                        Published::Abandoned => "abandoned",
                    }
                }
            },
        };
        self.shared.counters.decision(label);
        let tier = match decision {
            Decision::Retry { delay_ms } => tier_name(delay_ms),
            _ => String::new(),
        };
        let reason = match decision {
            Decision::DeadLetter { reason } => reason.as_str(),
            _ => "",
        };
        info!(
            queue = %p.name,
            message_id = message_id.as_deref().unwrap_or(""),
            attempt,
            max_attempts = p.retry.max_attempts,
            outcome = outcome.label(),
            decision = label,
            tier = %tier,
            reason,
            error = %crate::core::text::truncate_utf8(error, 300),
            "message handled"
        );
    }

    async fn ack(&self, d: &Delivery) {
        match d.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => {}
            Ok(false) => debug!("ack on a closed channel: the broker redelivers the message"),
            Err(e) => {
                warn!(error = %describe_lapin_error(&e), "ack failed: the broker redelivers the message")
            }
        }
    }

    async fn nack_to_dlx(&self, d: &Delivery) {
        if let Err(e) = d
            .acker
            .nack(BasicNackOptions {
                multiple: false,
                requeue: false,
            })
            .await
        {
            warn!(error = %describe_lapin_error(&e), "nack failed: the broker redelivers the message");
        }
    }

    /// Publishes a copy until the broker confirms it. While it refuses, the
    /// original stays unacked and the worker starts no new handler.
    async fn publish_until_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        d: &Delivery,
        props: BasicProperties,
        dlq_fallback: bool,
    ) -> Published {
        let mut backoff = Duration::from_millis(100);
        let mut refusing = false;
        let result = loop {
            match self
                .publisher
                .publish(exchange, routing_key, &d.data, props.clone())
                .await
            {
                Ok(()) => break Published::Done,
                Err(Refusal::Nacked) if dlq_fallback => break Published::FallBackToNack,
                Err(r) => {
                    self.metrics.publish_refusals.inc();
                    if !refusing {
                        refusing = true;
                        self.shared.refusing.fetch_add(1, Ordering::SeqCst);
                        warn!(queue = %self.cfg.pipeline.name, exchange, routing_key, refusal = %r,
                            "the broker refused a copy; the original stays unacked, no new handler starts, retrying the publish");
                    } else {
                        debug!(refusal = %r, "publish still refused");
                    }
                }
            }
            if !self.consume.status().connected() {
                break Published::Abandoned;
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => break Published::Abandoned,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(self.cfg.max_publish_backoff);
        };
        if refusing {
            self.shared.refusing.fetch_sub(1, Ordering::SeqCst);
            self.shared.unblocked.notify_waiters();
            if matches!(result, Published::Done) {
                info!(queue = %self.cfg.pipeline.name, exchange, "the broker accepts copies again");
            }
        }
        result
    }
}
