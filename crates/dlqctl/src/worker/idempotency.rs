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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lapin::message::Delivery;
use tokio::sync::{oneshot, Notify};
use tracing::{info, warn};

use crate::core::handling::message::LateAnswer;
use crate::core::handling::outcome::Outcome;
use crate::core::idempotency::{
    body_sha256, lease_floor_ms, read_key, renew_every_ms, Idempotency, KeyOf, KeySource,
    OnConflict,
};
use crate::core::retry::Run;
use crate::idempotency::{Begin, BodySha, Lease, Store, StoreError, Token};
use crate::worker::metrics::{GuardEvent, Metrics};

/// How soon a renewal that failed is tried again (at most).
const RENEW_RETRY: Duration = Duration::from_millis(500);

/// How often a paused worker asks the store whether it answers again.
const PING_EVERY: Duration = Duration::from_secs(1);

/// How often a worker whose store was not asked meanwhile (no message
/// came) pings it, so that an idle worker sees its store's loss as a busy
/// one does: with the store's call timeout and readiness's 10 s, `/readyz`
/// turns 503 within 15 s of the loss (docs/production.md, "Readiness").
pub(crate) const IDLE_PING_EVERY: Duration = Duration::from_secs(2);

/// The guard of one worker: its store, and whether consumption is paused
/// for it.
pub(crate) struct Guard {
    store: Arc<dyn Store>,
    key: KeySource,
    keep_ms: u64,
    on_conflict: OnConflict,
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
    /// When the guard was made: the origin of `last_answer_ms`.
    born: Instant,
    /// When the store last answered a call, in ms since `born`.
    last_answer_ms: AtomicU64,
    /// A key header of a type that cannot be a key was warned about.
    unusable_warned: AtomicBool,
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
            on_conflict: idem.on_conflict,
            renew_every: Duration::from_millis(renew_every_ms(lease_ms, bound)),
            hold_ms: in_doubt.map_or(lease_ms, |d| ms(d).max(lease_ms)),
            in_doubt,
            queue: queue.to_string(),
            metrics,
            paused: AtomicBool::new(false),
            resumed: Notify::new(),
            unkeyed_warned: AtomicBool::new(false),
            born: Instant::now(),
            last_answer_ms: AtomicU64::new(0),
            unusable_warned: AtomicBool::new(false),
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
        let key = match read_key(&self.key, &d.properties, &d.data) {
            KeyOf::Key(key) => key,
            KeyOf::Missing => {
                self.count(GuardEvent::Unkeyed);
                if !self.unkeyed_warned.swap(true, Ordering::SeqCst) {
                    warn!(queue = %self.queue, key = %self.key.text(), message_id,
                        "a message without the idempotency key runs unguarded (counted in dlqctl_idempotency_unkeyed_total; warned once)");
                }
                return Entry::Unguarded;
            }
            KeyOf::Unusable(kind) => {
                self.count(GuardEvent::Unkeyed);
                if !self.unusable_warned.swap(true, Ordering::SeqCst) {
                    warn!(queue = %self.queue, key = %self.key.text(), message_id, header_type = kind,
                        "the idempotency key's header is there but is a {kind}, which cannot identify a message: it runs unguarded (counted in dlqctl_idempotency_unkeyed_total; warned once)");
                }
                return Entry::Unguarded;
            }
        };
        if self.is_paused() {
            return Entry::Skip(Run::StoreUnavailable);
        }
        let body = body_sha256(&d.data);
        // The owner token of this delivery: a begin that fails below
        // may still have committed; its lease is then released (as ours)
        // once the store answers again.
        let token: Token = rand::random();
        let asked = Instant::now();
        let begun = self.store.begin(&key, &body, &token, self.hold_ms).await;
        if begun.is_ok() {
            self.answered();
        }
        match begun {
            Ok(Begin::Acquired { lease, conflict }) if conflict => {
                self.conflict(lease, body, message_id).await
            }
            Ok(Begin::Acquired { lease, .. }) => Entry::Leased { lease, body },
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
                self.pause(e, asked);
                Entry::Skip(Run::StoreUnavailable)
            }
        }
    }

    /// A key marked handled with another body, its lease taken: counted,
    /// warned, and what `on_conflict` says (run under the lease, or give
    /// the lease up and dead-letter or skip the delivery).
    async fn conflict(&self, lease: Lease, body: BodySha, message_id: &str) -> Entry {
        self.count(GuardEvent::KeyConflict);
        let policy = self.on_conflict.text();
        warn!(queue = %self.queue, message_id, on_conflict = policy,
        "this key was marked handled with another body: not a duplicate ({}; counted in dlqctl_idempotency_key_conflicts_total)",
        match self.on_conflict {
            OnConflict::Run => "it runs",
            OnConflict::DeadLetter => "dead-lettered as key_conflict without its handler",
            OnConflict::Skip => "acked without its handler",
        });
        let dead_letter = match self.on_conflict {
            OnConflict::Run => return Entry::Leased { lease, body },
            OnConflict::DeadLetter => true,
            OnConflict::Skip => false,
        };
        // Released as every lease is: a failure is tried again once the
        // store answers (the lease may last the in-doubt time).
        self.release(&lease).await;
        Entry::Skip(Run::KeyConflict { dead_letter })
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

    /// The store answered a call now.
    fn answered(&self) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_answer_ms.fetch_max(now, Ordering::SeqCst);
    }

    /// Whether the store answered a call within the last `period`.
    fn answered_within(&self, period: Duration) -> bool {
        let last = Duration::from_millis(self.last_answer_ms.load(Ordering::SeqCst));
        self.born.elapsed().saturating_sub(last) < period
    }

    /// Pings the store every [`IDLE_PING_EVERY`] that no call asked it
    /// (an idle worker), until `stop`: a ping that fails pauses
    /// consumption, as a failed call does, so that readiness sees the
    /// store's loss also when no message comes. Not while paused (the
    /// pause pings on its own).
    pub(crate) fn watch_idle(self: &Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let guard = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(IDLE_PING_EVERY) => {}
                }
                if guard.is_paused() || guard.answered_within(IDLE_PING_EVERY) {
                    continue;
                }
                let asked = Instant::now();
                match guard.store.ping().await {
                    Ok(()) => guard.answered(),
                    Err(e) => guard.pause(e, asked),
                }
            }
        });
    }

    /// Pauses consumption for `e` (from a call made at `asked`: readiness
    /// counts the outage from then), once, and waits in the background
    /// for the store to answer again.
    fn pause(self: &Arc<Self>, e: StoreError, asked: Instant) {
        self.metrics.store_down_since(asked.elapsed());
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
                    guard.answered();
                    break;
                }
            }
            guard.release_orphans().await;
            guard.paused.store(false, Ordering::SeqCst);
            // A call that failed while the list above was released (its
            // pause found the worker paused already) left its orphan
            // after it: released now, not at the next pause.
            guard.release_orphans().await;
            guard.metrics.store_up();
            guard.resumed.notify_waiters();
            info!(queue = %guard.queue, store = guard.store.describe(), "the idempotency store answers again: consuming");
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::retry::readiness::Readiness;
    use futures_util::future::BoxFuture;
    use futures_util::FutureExt;

    /// A store whose every call fails while `down` is set.
    struct Flaky {
        down: AtomicBool,
    }

    impl Flaky {
        fn answer<T: Send + 'static>(&self, v: T) -> BoxFuture<'_, Result<T, StoreError>> {
            let down = self.down.load(Ordering::SeqCst);
            async move {
                if down {
                    Err(StoreError::Unavailable {
                        store: "flaky".into(),
                        detail: "down".into(),
                    })
                } else {
                    Ok(v)
                }
            }
            .boxed()
        }
    }

    impl Store for Flaky {
        fn describe(&self) -> &str {
            "flaky"
        }
        fn call_bound(&self) -> Duration {
            Duration::from_millis(100)
        }
        fn begin<'a>(
            &'a self,
            _: &'a [u8],
            _: &'a BodySha,
            _: &'a Token,
            _: u64,
        ) -> BoxFuture<'a, Result<Begin, StoreError>> {
            self.answer(Begin::Handled)
        }
        fn renew<'a>(&'a self, _: &'a Lease, _: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
            self.answer(true)
        }
        fn release<'a>(&'a self, _: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
            self.answer(())
        }
        fn mark<'a>(
            &'a self,
            _: &'a Lease,
            _: &'a BodySha,
            _: u64,
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            self.answer(())
        }
        fn count_marked<'a>(
            &'a self,
            _: &'a [Vec<u8>],
        ) -> BoxFuture<'a, Result<usize, StoreError>> {
            self.answer(0)
        }
        fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
            self.answer(())
        }
        fn check(&self) -> BoxFuture<'_, Result<(), StoreError>> {
            self.answer(())
        }
        fn look<'a>(
            &'a self,
            _: &'a [u8],
        ) -> BoxFuture<'a, Result<crate::idempotency::KeyState, StoreError>> {
            self.answer(crate::idempotency::KeyState::Free)
        }
    }

    /// An idle worker (no message comes) whose store goes down turns not
    /// ready within 15 s, and ready again once the store answers.
    #[tokio::test]
    async fn an_idle_worker_sees_its_store_go_down_and_come_back() {
        let store = Arc::new(Flaky {
            down: AtomicBool::new(false),
        });
        let metrics = Arc::new(Metrics::new());
        metrics.set_consuming(true);
        let guard = Arc::new(Guard::new(
            store.clone(),
            &Idempotency::default(),
            Duration::from_secs(30),
            None,
            "orders",
            metrics.clone(),
        ));
        let stop = tokio_util::sync::CancellationToken::new();
        guard.watch_idle(stop.clone());
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert_eq!(metrics.readiness(), Readiness::Ready);
        let lost = std::time::Instant::now();
        store.down.store(true, Ordering::SeqCst);
        while metrics.readiness().is_ready() {
            assert!(
                lost.elapsed() < Duration::from_secs(15),
                "still ready 15 s after the store's loss"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(guard.is_paused());
        assert!(matches!(
            metrics.readiness(),
            Readiness::StoreUnavailable { .. }
        ));
        store.down.store(false, Ordering::SeqCst);
        let back = std::time::Instant::now();
        while !metrics.readiness().is_ready() {
            assert!(back.elapsed() < Duration::from_secs(5), "not ready again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.cancel();
    }
}
