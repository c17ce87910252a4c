//! The idempotency guard of a worker (docs/worker.md, "Idempotent
//! handling"): before a handler runs, the key of the delivery is looked up
//! in the store and leased under the delivery's own token; while it runs,
//! the lease is renewed; after, a success marks the key handled (then the
//! message is acked), an answered failure releases the lease, and a
//! timeout whose outcome is unknown keeps the key "in doubt": leased for
//! the in-doubt time while a task of its own waits for the late answer
//! (a late success marks, a late failure releases). A store that does not
//! answer pauses consumption: no handler runs unguarded.
//!
//! For a handler that is not cancel-safe the lease is taken, and renewed,
//! for the in-doubt time from the start, so that a worker killed in the
//! middle of a run leaves the key in doubt too.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lapin::message::Delivery;
use tokio::sync::{oneshot, Notify};
use tracing::{info, warn};

use crate::core::handling::message::LateAnswer;
use crate::core::handling::outcome::Outcome;
use crate::core::idempotency::{
    body_sha256, key_of, lease_floor_ms, renew_every_ms, Idempotency, KeySource,
};
use crate::core::retry::Run;
use crate::idempotency::{Begin, BodySha, Lease, Store, StoreError, Token};
use crate::worker::metrics::{GuardEvent, Metrics};

/// How soon a renewal that failed is tried again (at most).
const RENEW_RETRY: Duration = Duration::from_millis(500);

/// How often a paused worker asks the store whether it answers again.
const PING_EVERY: Duration = Duration::from_secs(1);

/// The guard of one worker: its store, and whether consumption is paused
/// for it.
pub(crate) struct Guard {
    store: Arc<dyn Store>,
    key: KeySource,
    keep_ms: u64,
    /// How often a running handler's lease is renewed (follows from the
    /// lease and the store's call bound).
    renew_every: Duration,
    /// What a lease is taken and renewed for: the lease (at least three
    /// of the store's call bound), or the in-doubt time when the handler
    /// is not cancel-safe.
    hold_ms: u64,
    /// How long a key stays in doubt after a timeout whose outcome is
    /// unknown; `None` when the handler is cancel-safe.
    in_doubt: Option<Duration>,
    queue: String,
    metrics: Arc<Metrics>,
    /// Consumption is paused: the store did not answer.
    paused: AtomicBool,
    /// Notified when the pause ends.
    pub(crate) resumed: Notify,
    unkeyed_warned: AtomicBool,
    /// Leases a failed call may have left (see [`Guard::orphan`]).
    orphans: Mutex<Vec<Lease>>,
}

/// The most orphaned leases kept for release.
const MAX_ORPHANS: usize = 4_096;

/// Where the late answer of a timed-out run arrives (see
/// [`Guard::late_answer`]).
pub(crate) type LateReceiver = oneshot::Receiver<Option<Outcome>>;

/// What the guard says before a handler runs.
pub(crate) enum Entry {
    /// Run the handler, unguarded (no key on the message).
    Unguarded,
    /// Run the handler under this lease, then [`Guard::finish`].
    Leased {
        /// The lease taken.
        lease: Lease,
        /// The body's SHA-256, kept with the mark.
        body: BodySha,
    },
    /// Do not run: a duplicate, a deferral, or the store unavailable.
    Skip(Run),
}

impl Guard {
    /// A guard over `store` for a pipeline's `idempotency`, with leases of
    /// `lease` (renewed every third of it); `in_doubt`: how long a key
    /// stays leased after a timeout whose outcome is unknown (`None`: the
    /// handler is cancel-safe, a timeout leaves no doubt).
    pub(crate) fn new(
        store: Arc<dyn Store>,
        idem: &Idempotency,
        lease: Duration,
        in_doubt: Option<Duration>,
        queue: &str,
        metrics: Arc<Metrics>,
    ) -> Self {
        // Every counter starts at 0 (see Metrics::guard_started).
        metrics.guard_started(queue);
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        // At least three of the store's call bound, so that one slow
        // renewal cannot let it lapse.
        let bound = ms(store.call_bound());
        let lease_ms = ms(lease).max(lease_floor_ms(bound)).max(1_000);
        Guard {
            store,
            key: idem.key.clone(),
            keep_ms: idem.keep_ms,
            renew_every: Duration::from_millis(renew_every_ms(lease_ms, bound)),
            hold_ms: in_doubt.map_or(lease_ms, |d| ms(d).max(lease_ms)),
            in_doubt,
            queue: queue.to_string(),
            metrics,
            paused: AtomicBool::new(false),
            resumed: Notify::new(),
            unkeyed_warned: AtomicBool::new(false),
            orphans: Mutex::new(Vec::new()),
        }
    }

    /// Counts `event` for this guard's pipeline.
    fn count(&self, event: GuardEvent) {
        self.metrics.guard_event(&self.queue, event);
    }

    /// Whether consumption is paused for the store.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Before the handler: looks the key of `d` up and takes its lease.
    pub(crate) async fn enter(self: &Arc<Self>, d: &Delivery, message_id: &str) -> Entry {
        let Some(key) = key_of(&self.key, &d.properties, &d.data) else {
            self.count(GuardEvent::Unkeyed);
            if !self.unkeyed_warned.swap(true, Ordering::SeqCst) {
                warn!(queue = %self.queue, key = %self.key.text(), message_id,
                    "a message without the idempotency key runs unguarded (counted in dlqctl_idempotency_unkeyed_total; warned once)");
            }
            return Entry::Unguarded;
        };
        if self.is_paused() {
            return Entry::Skip(Run::StoreUnavailable);
        }
        let body = body_sha256(&d.data);
        // The owner token of this delivery: a begin that fails below
        // may still have committed; its lease is then released (as ours)
        // once the store answers again.
        let token: Token = rand::random();
        match self.store.begin(&key, &body, &token, self.hold_ms).await {
            Ok(Begin::Acquired { lease, conflict }) => {
                if conflict {
                    self.count(GuardEvent::KeyConflict);
                    warn!(queue = %self.queue, message_id,
                        "this key was marked handled with another body: not a duplicate, it runs (counted in dlqctl_idempotency_key_conflicts_total)");
                }
                Entry::Leased { lease, body }
            }
            Ok(Begin::Handled) => {
                self.count(GuardEvent::Duplicate);
                Entry::Skip(Run::Duplicate)
            }
            Ok(Begin::Leased { remaining_ms }) => {
                self.count(GuardEvent::Deferral);
                Entry::Skip(Run::Deferred { remaining_ms })
            }
            Err(e) => {
                self.orphan(Lease { key, token });
                self.pause(e);
                Entry::Skip(Run::StoreUnavailable)
            }
        }
    }

    /// A lease a failed call may have taken or left: released once the
    /// store answers again (by its token: harmless when it was never
    /// taken, or when another delivery holds the key now). At most
    /// [`MAX_ORPHANS`] wait; more expire by themselves.
    fn orphan(&self, lease: Lease) {
        let mut orphans = self.orphans.lock().unwrap_or_else(PoisonError::into_inner);
        if orphans.len() < MAX_ORPHANS {
            orphans.push(lease);
        }
    }

    /// Releases the orphaned leases ([`Self::orphan`]); those the store
    /// does not take yet wait for the next time.
    async fn release_orphans(&self) {
        let orphans =
            std::mem::take(&mut *self.orphans.lock().unwrap_or_else(PoisonError::into_inner));
        for lease in orphans {
            if self.store.release(&lease).await.is_err() {
                self.orphan(lease);
            }
        }
    }

    /// Runs `work` (the handler), renewing `lease` meanwhile (see
    /// [`renew_every_ms`]), in the same task (no task spawned a message).
    /// A renewal that fails is logged and tried again soon: the run goes
    /// on.
    pub(crate) async fn renew_while<T>(&self, lease: &Lease, work: impl Future<Output = T>) -> T {
        let renewing = async {
            let mut wait = self.renew_every;
            loop {
                tokio::time::sleep(wait).await;
                wait = self.renew_every;
                match self.store.renew(lease, self.hold_ms).await {
                    Ok(true) => {}
                    Ok(false) => {
                        warn!(queue = %self.queue, "the lease on a running handler's key was lost (expired and taken): another run of the same key may start");
                        return std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        warn!(queue = %self.queue, error = %e, "renewing a lease failed; trying again");
                        wait = wait.min(RENEW_RETRY);
                    }
                }
            }
        };
        tokio::select! {
            biased;
            out = work => out,
            () = renewing => unreachable!("renewing never ends"),
        }
    }

    /// Marks the key of `lease` handled, kept `keep`; a failure is counted
    /// (`dlqctl_idempotency_mark_failures_total`) for the caller to warn.
    async fn mark(&self, lease: &Lease, body: &BodySha) -> Result<(), StoreError> {
        let marked = self.store.mark(lease, body, self.keep_ms).await;
        if marked.is_err() {
            self.count(GuardEvent::MarkFailure);
        }
        marked
    }

    /// After the handler: a success marks the key (a failed mark is
    /// warned and counted: the message is acked anyway); an answered
    /// failure releases the lease; a timeout whose outcome is unknown
    /// (`late`: where its late answer comes) keeps the key in doubt
    /// ([`Self::keep_in_doubt`]).
    pub(crate) async fn finish(
        self: &Arc<Self>,
        lease: &Lease,
        body: &BodySha,
        run: &Run,
        late: Option<LateReceiver>,
    ) {
        match (run.outcome(), late) {
            (Some(Outcome::Success), _) => {
                if let Err(e) = self.mark(lease, body).await {
                    warn!(queue = %self.queue, error = %e,
                        "the handler succeeded but its key could not be marked handled: acked anyway; a redelivery of it would run again");
                }
            }
            (Some(_), Some(late)) => self.keep_in_doubt(lease.clone(), *body, late),
            (Some(_), None) => self.release(lease).await,
            // Interrupted: the message returns to the queue; the lease
            // expires by itself (the handler may still be running).
            (None, _) => {}
        }
    }

    /// Releases `lease`; a failure is warned, and the lease released
    /// again once the store answers after a pause (else it expires).
    async fn release(&self, lease: &Lease) {
        if let Err(e) = self.store.release(lease).await {
            warn!(queue = %self.queue, error = %e, "releasing a lease failed: it expires by itself");
            self.orphan(lease.clone());
        }
    }

    /// Where the late answer of a run goes, when the handler is not
    /// cancel-safe (`None` otherwise): the [`LateAnswer`] for the
    /// handler's message, and the receiver [`Self::finish`] takes after a
    /// timeout.
    pub(crate) fn late_answer(&self) -> Option<(LateAnswer, LateReceiver)> {
        let wait = self.in_doubt?;
        let (tx, rx) = oneshot::channel();
        let tx = Mutex::new(Some(tx));
        let late = LateAnswer::new(wait, move |outcome| {
            if let Some(tx) = tx.lock().unwrap_or_else(PoisonError::into_inner).take() {
                let _ = tx.send(outcome);
            }
        });
        Some((late, rx))
    }

    /// A timeout whose outcome is unknown: the lease extended to the
    /// in-doubt time, and a task of its own (the delivery goes on, its
    /// concurrency slot freed) waits that long for the late answer: a
    /// success marks the key, a failure or the end of the work without an
    /// answer releases it; no answer (or one still timed out) leaves the
    /// lease to expire.
    fn keep_in_doubt(self: &Arc<Self>, lease: Lease, body: BodySha, late: LateReceiver) {
        let Some(wait) = self.in_doubt else { return };
        self.count(GuardEvent::InDoubt);
        let guard = self.clone();
        tokio::spawn(async move {
            if let Err(e) = guard.store.renew(&lease, guard.hold_ms).await {
                warn!(queue = %guard.queue, error = %e,
                    "extending the lease of a key in doubt failed: it stays held at least the in-doubt time less one renewal period");
            }
            match tokio::time::timeout(wait, late).await {
                Ok(Ok(Some(Outcome::Success))) => match guard.mark(&lease, &body).await {
                    Ok(()) => info!(queue = %guard.queue, "a late success marked its key handled"),
                    Err(e) => warn!(queue = %guard.queue, error = %e,
                        "a late success could not mark its key handled: a retry of it would run again"),
                },
                Ok(Ok(Some(Outcome::TimedOut { .. }))) | Err(_) => {
                    warn!(queue = %guard.queue,
                        "a key stayed in doubt for the whole in-doubt time (its outcome is still unknown): its lease expires, and a retry of it may run again");
                }
                // The handler kept no way to answer late (an embedded
                // handler that does not use HandlerMessage::late): the
                // lease is left to expire after the in-doubt time.
                Ok(Err(_)) => {}
                Ok(Ok(Some(_) | None)) => {
                    info!(queue = %guard.queue, "a late failure released its key in doubt");
                    guard.release(&lease).await;
                }
            }
        });
    }

    /// Pauses consumption for `e`, once, and waits in the background for
    /// the store to answer again.
    fn pause(self: &Arc<Self>, e: StoreError) {
        self.metrics.store_down();
        if self.paused.swap(true, Ordering::SeqCst) {
            return;
        }
        self.count(GuardEvent::StorePause);
        warn!(queue = %self.queue, error = %e,
            "the idempotency store does not answer: consumption paused, deliveries not started are handed back; no handler runs unguarded");
        let guard = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PING_EVERY).await;
                if guard.store.ping().await.is_ok() {
                    break;
                }
            }
            guard.release_orphans().await;
            guard.paused.store(false, Ordering::SeqCst);
            guard.metrics.store_up();
            guard.resumed.notify_waiters();
            info!(queue = %guard.queue, store = guard.store.describe(), "the idempotency store answers again: consuming");
        });
    }
}
