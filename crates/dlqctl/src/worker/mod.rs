//! The worker: consumes a pipeline's main queue, runs a [`Handler`] per
//! message, and acks, retries through a delay tier, or dead-letters, never
//! losing a message (docs/worker.md, "Attempts and decisions").
//!
//! Deliveries come on one channel; copies are published on another, in
//! confirm mode, with many confirms in flight. A copy is `mandatory` and
//! persistent, and the original is acked only once the broker confirmed
//! the copy without returning it. When the broker refuses a copy the
//! original stays unacked, no new handler starts, and the publish is
//! retried with capped backoff. A delivery is never requeued to retry it:
//! messages go back to the queue only when their channel closes (shutdown,
//! lost connection).

mod circuit;
mod config;
mod consumer_timeout;
mod delivery;
mod drained;
mod idempotency;
pub mod metrics;
mod redrive;
mod shared;
mod verify;

pub use crate::core::retry::DeadLetterMode;
pub use config::WorkerConfig;
use shared::Shared;
pub(crate) use verify::verify_topology;

use crate::amqp::publisher::Publisher;
use crate::core::retry::backoff::Backoff;
use crate::error::describe_lapin_error;
use crate::error::{Error, Result};
use crate::handler::Handler;
use crate::worker::metrics::Metrics;
use circuit::{ProbeTicket, Step};
use delivery::DeliveryTask;
use drained::Drained;
use futures_util::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

/// A worker for one pipeline and one handler.
pub struct Worker<H: Handler> {
    cfg: Arc<WorkerConfig>,
    handler: Arc<H>,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
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
            circuit: circuit::Circuit::of(&cfg.pipeline, &metrics),
            address: AtomicUsize::new(0),
            move_on: AtomicBool::new(false),
            timeout_checked: AtomicBool::new(false),
            warned: Mutex::new(HashSet::new()),
            counters: metrics.queue_counters(&cfg.pipeline.name),
            guard: std::sync::OnceLock::new(),
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
        self.run_with_hurry(shutdown, CancellationToken::new())
            .await
    }

    /// Like [`Worker::run`]; when `hurry` is cancelled after `shutdown`,
    /// the grace period ends at once: handlers still running are stopped
    /// and their messages return to the queue (the binary cancels it on a
    /// second SIGTERM or SIGINT).
    pub async fn run_with_hurry(
        &self,
        shutdown: CancellationToken,
        hurry: CancellationToken,
    ) -> Result<()> {
        // The redrive's canaries are chosen and judged by their keys in
        // the same store.
        let store = self.open_guard(&shutdown).await?;
        // The redrive timer runs beside the sessions, with connections of
        // its own, and stops with them.
        let stop_redrive = shutdown.child_token();
        let redrive =
            (self.cfg.redrive && self.cfg.pipeline.dead_letter.redrive.is_some()).then(|| {
                let shared = self.shared.clone();
                let paused = move || shared.guard.get().is_some_and(|g| g.is_paused());
                tokio::spawn(redrive::run_loop(
                    self.cfg.clone(),
                    self.metrics.clone(),
                    (paused, store),
                    stop_redrive.clone(),
                ))
            });
        // The consumer timeout is read again every minute beside them.
        let timeouts = tokio::spawn(consumer_timeout::run_loop(
            self.cfg.clone(),
            self.metrics.clone(),
            self.shared.clone(),
            stop_redrive.clone(),
        ));
        // An idle worker pings its store, so that readiness sees its loss.
        if let Some(guard) = self.shared.guard.get() {
            guard.watch_idle(stop_redrive.clone());
        }
        let result = self.sessions(shutdown, hurry).await;
        stop_redrive.cancel();
        if let Some(task) = redrive {
            let _ = task.await;
        }
        let _ = timeouts.await;
        result
    }

    /// Opens the idempotency store of a pipeline with `idempotency`: a
    /// store that refuses is an error; one that does not answer is waited
    /// for as long as the broker would be (`wait_for_broker`).
    /// Returns the store, for the redrive's canaries.
    async fn open_guard(
        &self,
        shutdown: &CancellationToken,
    ) -> Result<Option<crate::ops::dlq::canary::StoreGuard>> {
        let p = &self.cfg.pipeline;
        let Some(idem) = &p.idempotency else {
            return Ok(None);
        };
        let spec = self.cfg.idempotency_store.as_ref().unwrap_or(&idem.store);
        let url = crate::idempotency::resolve(spec, &p.name, &|k| std::env::var(k).ok())?;
        let scope = crate::core::idempotency::scope(self.cfg.brokers.get(0).vhost(), &p.name);
        let wait_until = Instant::now() + self.cfg.wait_for_broker;
        let mut backoff = Backoff::new(Duration::from_millis(200), START_RETRY_MAX);
        let store = loop {
            match crate::idempotency::open(&url, &scope, crate::idempotency::Create::Yes).await {
                Ok(store) => break store,
                Err(e @ crate::idempotency::StoreError::Unavailable { .. })
                    if Instant::now() < wait_until =>
                {
                    warn!(queue = %p.name, error = %e, "idempotency store not reachable yet; retrying (--wait-for-broker)");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(backoff.next_wait()) => {}
                    }
                }
                Err(e) => return Err(e.into()),
            }
        };
        // A handler whose timeout leaves its outcome unknown keeps the key
        // in doubt that long.
        let in_doubt = (!self.handler.cancel_safe()).then_some(self.cfg.in_doubt);
        info!(queue = %p.name, store = store.describe(), key = %idem.key.text(),
            lease_ms = self.cfg.lease().as_millis() as u64,
            in_doubt_ms = in_doubt.map(|d| d.as_millis() as u64), "idempotent handling on");
        let canary = crate::ops::dlq::canary::StoreGuard::new(store.clone(), idem.key.clone(), p);
        let guard = idempotency::Guard::new(
            store,
            idem,
            self.cfg.lease(),
            in_doubt,
            &p.name,
            self.metrics.clone(),
        );
        let _ = self.shared.guard.set(Arc::new(guard));
        Ok(Some(canary))
    }

    /// Connects, consumes, and reconnects with backoff until `shutdown`.
    async fn sessions(&self, shutdown: CancellationToken, hurry: CancellationToken) -> Result<()> {
        let mut backoff = Backoff::new(Duration::from_millis(200), self.cfg.max_reconnect_backoff);
        let mut first = true;
        let mut last_error: Option<String> = None;
        let wait_until = Instant::now() + self.cfg.wait_for_broker;
        let mut start_backoff = Backoff::new(Duration::from_millis(200), START_RETRY_MAX);
        loop {
            let started = Instant::now();
            let end = self.session(&shutdown, &hurry).await;
            let end = match end {
                Ok(SessionEnd::Shutdown) => return Ok(()),
                Err(
                    e @ Error::Connect {
                        unreachable: true, ..
                    },
                ) if first && Instant::now() < wait_until => {
                    // --wait-for-broker: the broker may still be starting.
                    let left = wait_until.saturating_duration_since(Instant::now());
                    let pause = start_backoff.next_wait().min(left);
                    let text = e.to_string();
                    if last_error.as_deref() != Some(text.as_str()) {
                        warn!(queue = %self.cfg.pipeline.name, error = %text, waiting_up_to_s = left.as_secs(), "broker not reachable yet; retrying (--wait-for-broker)");
                    } else {
                        debug!(queue = %self.cfg.pipeline.name, error = %text, "broker still not reachable");
                    }
                    last_error = Some(text);
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    continue;
                }
                Err(e) if first => return Err(e),
                other => other,
            };
            if first {
                last_error = None;
            }
            match &end {
                Ok(SessionEnd::Shutdown) => {}
                Ok(SessionEnd::Lost(reason)) => {
                    warn!(queue = %self.cfg.pipeline.name, reason = %reason, "connection lost; reconnecting");
                }
                Err(e) => {
                    // The same failure again is not a new transition.
                    let text = e.to_string();
                    if last_error.as_deref() == Some(text.as_str()) {
                        debug!(queue = %self.cfg.pipeline.name, error = %text, retry_in_ms = backoff.peek().as_millis() as u64, "still cannot resume");
                    } else {
                        warn!(queue = %self.cfg.pipeline.name, error = %text, retry_in_ms = backoff.peek().as_millis() as u64, "cannot resume; retrying with backoff");
                    }
                    last_error = Some(text);
                }
            }
            if matches!(end, Ok(SessionEnd::Lost(_))) {
                last_error = None;
                // The node may be gone: the next session starts at the
                // next address (a lone address is tried again).
                self.shared.move_on.store(true, Ordering::SeqCst);
            }
            first = false;
            if started.elapsed() > Duration::from_secs(30) {
                backoff.reset();
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(backoff.next_wait()) => {}
            }
            self.metrics.reconnected();
        }
    }

    /// One connection's life: connect, check the topology, consume until
    /// shutdown or a lost connection, then wind down.
    async fn session(
        &self,
        shutdown: &CancellationToken,
        hurry: &CancellationToken,
    ) -> Result<SessionEnd> {
        let (conn, at) = self.connect().await?;
        let (consume, publisher, mut consumer) = self.open(&conn, at).await?;
        self.metrics.set_consuming(true);
        let template = DeliveryTask {
            cfg: self.cfg.clone(),
            handler: self.handler.clone(),
            metrics: self.metrics.clone(),
            shared: self.shared.clone(),
            publisher,
            consume: consume.clone(),
            user: self.cfg.brokers.get(at).user().to_string(),
            shutdown: shutdown.clone(),
            // Cancelled when the session is lost: handlers still running
            // then could neither ack nor publish, and their messages are
            // already back in the queue; stopping them keeps the
            // concurrency bound.
            lost: CancellationToken::new(),
        };
        let tracker = TaskTracker::new();
        let end = self
            .consume(shutdown, &consume, &mut consumer, &tracker, &template)
            .await;
        self.metrics.set_consuming(false);
        tracker.close();
        const NETWORK_STEP: Duration = Duration::from_secs(5);
        match &end {
            SessionEnd::Shutdown => {
                info!(queue = %self.cfg.pipeline.name, in_flight = tracker.len(), "stopping: no new messages; waiting for handlers in flight");
                let cancel = consume.basic_cancel(consumer.tag(), BasicCancelOptions::default());
                let _ = tokio::time::timeout(NETWORK_STEP, cancel).await;
                let finished = tokio::select! {
                    r = tokio::time::timeout(self.cfg.grace, tracker.wait()) => r.is_ok(),
                    _ = hurry.cancelled() => false,
                };
                if !finished {
                    let why = if hurry.is_cancelled() {
                        "asked to hurry"
                    } else {
                        "grace period over"
                    };
                    warn!(queue = %self.cfg.pipeline.name, left = tracker.len(), "{why}; unfinished messages return to the queue");
                } else {
                    return_unstarted(&consume).await;
                }
            }
            SessionEnd::Lost(_) => {
                template.lost.cancel();
                let _ = tokio::time::timeout(NETWORK_STEP, tracker.wait()).await;
            }
        }
        // Closing returns every unacked delivery to the queue.
        let close = conn.close(200, "dlqctl worker stopping".into());
        let _ = tokio::time::timeout(NETWORK_STEP, close).await;
        Ok(end)
    }

    /// Connects to the address used last, or to the next one after a lost
    /// connection; returns the connection and the index of its address.
    async fn connect(&self) -> Result<(Arc<Connection>, usize)> {
        let p = &self.cfg.pipeline;
        let brokers = &self.cfg.brokers;
        let last = self.shared.address.load(Ordering::SeqCst);
        let start = if self.shared.move_on.swap(false, Ordering::SeqCst) {
            last + 1
        } else {
            last
        };
        let (conn, at) = brokers
            .connect_from(start, &format!("dlqctl work {}", p.name))
            .await?;
        if at != last {
            info!(queue = %p.name, from = %brokers.get(last).endpoint(), to = %brokers.get(at).endpoint(), "switched broker address");
        }
        self.shared.address.store(at, Ordering::SeqCst);
        Ok((Arc::new(conn), at))
    }

    /// Checks the topology (and, the first time, the consumer timeout
    /// through the management API of address `at`), then opens the
    /// consuming channel (with its prefetch), the publisher and the
    /// consumer.
    async fn open(
        &self,
        conn: &Arc<Connection>,
        at: usize,
    ) -> Result<(Channel, Arc<Publisher>, Consumer)> {
        let p = &self.cfg.pipeline;
        verify_topology(conn, p).await?;
        if !self.shared.timeout_checked.load(Ordering::SeqCst) {
            consumer_timeout::check_at_start(&self.cfg, at).await?;
            self.shared.timeout_checked.store(true, Ordering::SeqCst);
        }
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
        publisher.warm_up().await?;
        let consumer = start_consumer(&consume, &p.name)
            .await
            .map_err(|e| Error::broker(format!("cannot consume from queue {}", p.name), &e))?;
        info!(queue = %p.name, prefetch = self.cfg.prefetch, concurrency = self.cfg.concurrency, "consuming");
        Ok((consume, publisher, consumer))
    }

    /// Takes deliveries, each run by a copy of `template` on `tracker`,
    /// until shutdown or a lost connection.
    async fn consume(
        &self,
        shutdown: &CancellationToken,
        consume: &Channel,
        consumer: &mut Consumer,
        tracker: &TaskTracker,
        template: &DeliveryTask<H>,
    ) -> SessionEnd {
        let permits = Arc::new(Semaphore::new(self.cfg.concurrency.max(1)));
        loop {
            // Gates before the next handler may start. Waiting at one of
            // them, the worker is not reading the consumer, which is where
            // a lost connection shows: watch the channel too, so that busy
            // handlers or an open breaker do not delay the reconnection.
            // The permit is polled first: when one is free it is taken at
            // once, and the channel watch never arms its timer (with the
            // gates below, that was three timers a message).
            let permit = tokio::select! {
                biased;
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return SessionEnd::Shutdown,
                },
                _ = shutdown.cancelled() => return SessionEnd::Shutdown,
                _ = channel_closed(consume) => return SessionEnd::Lost(CLOSED_WHILE_WAITING.into()),
            };
            if let Err(end) = self.wait_gates_or_loss(shutdown, consume, false).await {
                return end;
            }
            // With no message coming, an open breaker still turns
            // half-open on time (and asks its health URL): look again.
            let next = tokio::select! {
                _ = shutdown.cancelled() => return SessionEnd::Shutdown,
                n = consumer.next() => n,
                _ = self.open_over() => continue,
            };
            let delivery = match next {
                Some(Ok(d)) => d,
                Some(Err(e)) => return SessionEnd::Lost(describe_lapin_error(&e)),
                None => return SessionEnd::Lost("the broker cancelled the consumer".into()),
            };
            // Again: a copy may have been refused (or the breaker opened)
            // while we waited for this delivery. On shutdown the delivery,
            // left unacked, returns to the queue when the channel closes.
            // A half-open breaker makes this delivery its probe.
            let probe = match self.wait_gates_or_loss(shutdown, consume, true).await {
                Ok(probe) => probe,
                Err(end) => return end,
            };
            let task = template.clone();
            tracker.spawn(async move {
                task.process(delivery, probe).await;
                drop(permit);
            });
            if let Some(guard) = self.shared.guard.get().filter(|g| g.is_paused()) {
                let drained = Drained {
                    tracker,
                    template,
                    permits: &permits,
                };
                if let Err(end) = self
                    .pause_for_store(guard, shutdown, consume, consumer, drained)
                    .await
                {
                    return end;
                }
            }
        }
    }

    /// While the idempotency store does not answer: cancels the consumer
    /// (so that no delivery waits out the broker's consumer timeout),
    /// hands back what was already delivered (each delivery's task sees
    /// the pause and nacks it with requeue), waits for the store, and
    /// consumes again.
    async fn pause_for_store(
        &self,
        guard: &Arc<idempotency::Guard>,
        shutdown: &CancellationToken,
        consume: &Channel,
        consumer: &mut Consumer,
        drained: Drained<'_, H>,
    ) -> Result<(), SessionEnd> {
        let p = &self.cfg.pipeline;
        let cancel = consume.basic_cancel(consumer.tag(), BasicCancelOptions::default());
        let _ = tokio::time::timeout(Duration::from_secs(5), cancel).await;
        // What the broker sent before the cancel: handed back (a message
        // without a key runs unguarded, within --concurrency like any).
        while let Ok(Some(next)) =
            tokio::time::timeout(Duration::from_millis(500), consumer.next()).await
        {
            match next {
                Ok(d) => drained.spawn(d),
                Err(e) => return Err(SessionEnd::Lost(describe_lapin_error(&e))),
            }
        }
        info!(queue = %p.name, "consumer cancelled until the idempotency store answers");
        loop {
            let resumed = guard.resumed.notified();
            if !guard.is_paused() {
                break;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Err(SessionEnd::Shutdown),
                _ = channel_closed(consume) => return Err(SessionEnd::Lost(CLOSED_WHILE_WAITING.into())),
                _ = resumed => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        *consumer = start_consumer(consume, &p.name)
            .await
            .map_err(|e| SessionEnd::Lost(describe_lapin_error(&e)))?;
        Ok(())
    }

    /// When the breaker's `open_for` is over; never without a breaker or
    /// while it is not open.
    async fn open_over(&self) {
        match &self.shared.circuit {
            Some(c) => c.open_over().await,
            None => std::future::pending().await,
        }
    }

    /// [`Self::wait_gates`], ending the session when the consuming channel
    /// closes meanwhile.
    async fn wait_gates_or_loss(
        &self,
        shutdown: &CancellationToken,
        consume: &Channel,
        take: bool,
    ) -> Result<Option<ProbeTicket>, SessionEnd> {
        // The gates first, as for the permit above.
        tokio::select! {
            biased;
            end = self.wait_gates(shutdown, take) => end,
            _ = channel_closed(consume) => Err(SessionEnd::Lost(CLOSED_WHILE_WAITING.into())),
        }
    }

    /// Waits while copies are being refused or the breaker is open, or
    /// half-open with its probe out; a half-open breaker with a health URL
    /// asks it here. With `take` (a delivery in hand), returns the probe's
    /// ticket when that delivery is the half-open breaker's probe.
    async fn wait_gates(
        &self,
        shutdown: &CancellationToken,
        take: bool,
    ) -> Result<Option<ProbeTicket>, SessionEnd> {
        loop {
            if self.shared.refusing.load(Ordering::SeqCst) > 0 {
                let notified = self.shared.unblocked.notified();
                if self.shared.refusing.load(Ordering::SeqCst) == 0 {
                    continue;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return Err(SessionEnd::Shutdown),
                    _ = notified => continue,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                }
            }
            let Some(c) = &self.shared.circuit else {
                return Ok(None);
            };
            // Made before the look, so that a probe coming back between
            // the look and the wait still wakes it.
            let changed = c.changed.notified();
            match c.step(take) {
                Step::Pass(probe) => return Ok(probe),
                Step::Health(ticket) => tokio::select! {
                    _ = shutdown.cancelled() => return Err(SessionEnd::Shutdown),
                    _ = c.check_health(ticket) => {}
                },
                Step::Wait(ms) => {
                    // Half-open with the probe out: until it comes back
                    // (looked at each second all the same).
                    let pause = Duration::from_millis(ms.unwrap_or(1000).max(1));
                    tokio::select! {
                        _ = shutdown.cancelled() => return Err(SessionEnd::Shutdown),
                        _ = changed => {}
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }
}

/// Hands back, with one `basic.nack(multiple, requeue)` of delivery tag 0,
/// every delivery still unacked on the consuming channel once no handler
/// runs any more: those prefetched but never started, and the one taken
/// as the stop came. Closing the connection would return them too, but
/// RabbitMQ 4.3 counts a delivery returned by a close as a failed one
/// (`x-delivery-count` + 1, toward the quorum queue's `delivery_limit`)
/// and one returned by `nack(requeue)` not, so a worker's restarts do not
/// dead-letter messages no handler saw. Up to 4.2 both count.
async fn return_unstarted(consume: &Channel) {
    let nack = consume.basic_nack(
        0,
        BasicNackOptions {
            multiple: true,
            requeue: true,
        },
    );
    match tokio::time::timeout(Duration::from_secs(5), nack).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            debug!(error = %describe_lapin_error(&e), "returning unstarted deliveries failed; closing returns them")
        }
        Err(_) => debug!("returning unstarted deliveries timed out; closing returns them"),
    }
}

/// A consumer on `queue`, on the consuming channel (at the session's
/// start, and again after a pause for the idempotency store).
async fn start_consumer(consume: &Channel, queue: &str) -> lapin::Result<Consumer> {
    consume
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
}

/// The longest pause between two tries to reach the broker at start
/// (`wait_for_broker`): short, so a worker starts soon after its broker.
const START_RETRY_MAX: Duration = Duration::from_secs(5);

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
