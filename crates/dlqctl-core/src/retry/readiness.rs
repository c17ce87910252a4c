//! The worker's readiness (what `/readyz` and the gauge `dlqctl_ready`
//! answer), one table for the whole worker (docs/production.md, "Running
//! as a service"):
//!
//! | state | ready |
//! |---|---|
//! | not consuming (connecting, waiting for the broker, reconnecting) | no |
//! | the idempotency store not answering for `STORE_STALL_MS` (consumption paused, consumer cancelled) | no |
//! | every settle failing for [`SETTLE_STALL_MS`] | no |
//! | a circuit breaker's health URL no request can be built from (a configuration error) | no |
//! | circuit breaker open (consumption paused, consumer kept) | yes |
//! | otherwise | yes |
//!
//! A *settle* is what the worker does to finish a message with the broker:
//! publish a copy (retry or dead-letter) and have it confirmed, then ack;
//! or ack; or nack. It fails when the broker refuses the copy (nack,
//! return, no confirm in time, a channel error such as a deleted retry
//! exchange) or the ack or nack does not go through. The worker then keeps
//! the message and tries again, so a worker whose every settle fails
//! still consumes but finishes nothing: [`SettleWatch`] tells when that
//! has lasted long enough to say so. Pure: time is a parameter
//! (milliseconds on any monotonic clock).

/// How long every settle must have failed, with none succeeding, before
/// the worker says it is not ready: 30 s. Longer than a publish's
/// backoff (5 s at most) and than a flap of the broker, short beside a
/// probe's usual failure threshold.
pub const SETTLE_STALL_MS: u64 = 30_000;

/// How long the idempotency store must have not answered before the
/// worker says it is not ready: 10 s. Its consumption is paused at the
/// first failure; a blip shorter than this keeps it ready.
pub(crate) const STORE_STALL_MS: u64 = 10_000;

/// Whether settles succeed, from what the worker saw of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettleWatch {
    /// The first failure since the last success.
    failing_since: Option<u64>,
    /// The latest failure.
    last_failure: Option<u64>,
    /// Settles that failed and are being tried again.
    retrying: u32,
}

impl SettleWatch {
    /// A settle went through: whatever failed before, settles work.
    pub fn succeeded(&mut self) {
        self.failing_since = None;
        self.last_failure = None;
    }

    /// A try to settle failed at `now_ms`.
    pub fn failed(&mut self, now_ms: u64) {
        self.failing_since.get_or_insert(now_ms);
        self.last_failure = Some(now_ms);
    }

    /// A failed settle will be tried again (its message is kept): until
    /// [`Self::retry_ended`], settles are still failing even between two
    /// tries, however far apart (a confirm awaited for 30 s).
    pub fn retry_started(&mut self) {
        self.retrying = self.retrying.saturating_add(1);
    }

    /// A settle that was being tried again has ended (went through, or
    /// its message went back to the queue).
    pub fn retry_ended(&mut self) {
        self.retrying = self.retrying.saturating_sub(1);
    }

    /// Since when settles have been failing with none succeeding, when
    /// that has lasted `stall_ms` at `now_ms` and is still going on: a
    /// settle is being tried again, or one failed within the last
    /// `stall_ms`. A worker whose failures stopped (its messages went back
    /// to the queue, nothing more came) is not stalled any more.
    pub fn stalled_since(&self, now_ms: u64, stall_ms: u64) -> Option<u64> {
        let since = self.failing_since?;
        let long = now_ms.saturating_sub(since) >= stall_ms;
        let ongoing = self.retrying > 0
            || self
                .last_failure
                .is_some_and(|l| now_ms.saturating_sub(l) < stall_ms);
        (long && ongoing).then_some(since)
    }
}

/// What `/readyz` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Consuming, and settles go through (or none has failed long).
    Ready,
    /// Not connected with a consumer on the main queue.
    NotConsuming,
    /// Consuming, but every settle has failed for this many milliseconds.
    SettlesFailing {
        /// How long, in ms.
        for_ms: u64,
    },
    /// The idempotency store has not answered for this many milliseconds:
    /// consumption is paused until it does.
    StoreUnavailable {
        /// How long, in ms.
        for_ms: u64,
    },
    /// A circuit breaker's health URL is one no request can be built
    /// from: a configuration error, which no answer of the dependency
    /// will mend (the breaker cannot close once open).
    ProbeUnusable,
}

impl Readiness {
    /// The worker's readiness at `now_ms`: the table of this module. An
    /// open circuit breaker is not an input: it pauses consumption on
    /// purpose and keeps the consumer, so the worker stays ready.
    pub fn of(consuming: bool, settles: &SettleWatch, now_ms: u64) -> Self {
        if !consuming {
            return Readiness::NotConsuming;
        }
        match settles.stalled_since(now_ms, SETTLE_STALL_MS) {
            Some(since) => Readiness::SettlesFailing {
                for_ms: now_ms.saturating_sub(since),
            },
            None => Readiness::Ready,
        }
    }

    /// This readiness, with the idempotency store down since
    /// `store_down_since` (ms, same clock as `now_ms`): not ready once
    /// that has lasted `STORE_STALL_MS`, unless already not consuming.
    pub fn with_store(self, store_down_since: Option<u64>, now_ms: u64) -> Self {
        match store_down_since {
            Some(since)
                if self != Readiness::NotConsuming
                    && now_ms.saturating_sub(since) >= STORE_STALL_MS =>
            {
                Readiness::StoreUnavailable {
                    for_ms: now_ms.saturating_sub(since),
                }
            }
            _ => self,
        }
    }

    /// This readiness, or [`Readiness::ProbeUnusable`] when a breaker's
    /// health URL cannot be used (`unusable`): a configuration error says
    /// more than any other state.
    pub fn with_probe_unusable(self, unusable: bool) -> Self {
        if unusable {
            Readiness::ProbeUnusable
        } else {
            self
        }
    }

    /// Whether the worker is ready.
    pub fn is_ready(self) -> bool {
        self == Readiness::Ready
    }

    /// The HTTP status `/readyz` answers: 200 or 503.
    pub fn http_status(self) -> u16 {
        if self.is_ready() {
            200
        } else {
            503
        }
    }

    /// The line `/readyz` answers.
    pub fn text(self) -> String {
        match self {
            Readiness::Ready => "ready: connected and consuming\n".into(),
            Readiness::NotConsuming => {
                "not ready: not consuming (connecting to the broker, or reconnecting)\n".into()
            }
            Readiness::SettlesFailing { for_ms } => format!(
                "not ready: connected and consuming, but every settle has failed for {} s \
                 (the broker refuses the copies or the acks; see the log)\n",
                for_ms / 1000
            ),
            Readiness::StoreUnavailable { for_ms } => format!(
                "not ready: the idempotency store has not answered for {} s; consumption is \
                 paused until it does (see the log)\n",
                for_ms / 1000
            ),
            Readiness::ProbeUnusable => {
                "not ready: configuration error: a circuit breaker's health URL is one no \
                 request can be built from, so the breaker cannot close once open (the log \
                 names the URL; fix dead_letter.redrive.health.http)\n"
                    .into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = SETTLE_STALL_MS;

    #[test]
    fn an_unusable_health_url_is_not_ready_whatever_else() {
        let w = SettleWatch::default();
        for consuming in [true, false] {
            let r = Readiness::of(consuming, &w, 0).with_probe_unusable(true);
            assert_eq!(r, Readiness::ProbeUnusable);
            assert_eq!(r.http_status(), 503);
            assert!(r.text().starts_with("not ready: configuration error"));
        }
        let r = Readiness::of(true, &w, 0).with_probe_unusable(false);
        assert_eq!(r, Readiness::Ready);
    }

    #[test]
    fn a_store_down_for_the_stall_turns_not_ready() {
        let w = SettleWatch::default();
        let r = Readiness::of(true, &w, 50_000);
        assert_eq!(r.with_store(None, 50_000), Readiness::Ready);
        assert_eq!(r.with_store(Some(45_000), 50_000), Readiness::Ready);
        let down = r.with_store(Some(40_000), 50_000);
        assert_eq!(down, Readiness::StoreUnavailable { for_ms: 10_000 });
        assert_eq!(down.http_status(), 503);
        assert!(down
            .text()
            .contains("idempotency store has not answered for 10 s"));
        // Not consuming says more.
        let off = Readiness::of(false, &w, 50_000);
        assert_eq!(off.with_store(Some(0), 50_000), Readiness::NotConsuming);
    }

    #[test]
    fn not_consuming_is_not_ready_whatever_the_settles() {
        let w = SettleWatch::default();
        assert_eq!(Readiness::of(false, &w, 0), Readiness::NotConsuming);
        assert_eq!(Readiness::of(false, &w, 0).http_status(), 503);
        assert_eq!(Readiness::of(true, &w, 0), Readiness::Ready);
        assert_eq!(Readiness::of(true, &w, 0).http_status(), 200);
    }

    #[test]
    fn every_settle_failing_for_the_stall_turns_not_ready_and_one_success_ready() {
        let mut w = SettleWatch::default();
        w.failed(1000);
        w.retry_started();
        // Tries every 5 s, none going through.
        for t in (6000..1000 + S).step_by(5000) {
            w.failed(t);
            assert!(Readiness::of(true, &w, t).is_ready(), "at {t}");
        }
        assert!(Readiness::of(true, &w, 1000 + S - 1).is_ready());
        assert_eq!(
            Readiness::of(true, &w, 1000 + S),
            Readiness::SettlesFailing { for_ms: S }
        );
        assert_eq!(Readiness::of(true, &w, 1000 + S).http_status(), 503);
        let text = Readiness::of(true, &w, 1000 + S + 4000).text();
        assert!(text.contains("failed for 34 s"), "{text}");
        // One success: ready at once.
        w.retry_ended();
        w.succeeded();
        assert!(Readiness::of(true, &w, 1000 + S + 5000).is_ready());
    }

    #[test]
    fn a_success_in_between_restarts_the_count() {
        let mut w = SettleWatch::default();
        w.failed(0);
        w.retry_started();
        w.succeeded(); // another handler's ack went through
        w.failed(S / 2);
        assert_eq!(w.stalled_since(S, S), None);
        assert_eq!(w.stalled_since(S / 2 + S, S), Some(S / 2));
    }

    #[test]
    fn a_retry_in_progress_keeps_it_failing_between_far_apart_tries() {
        // A confirm awaited for 30 s: tries 35 s apart.
        let mut w = SettleWatch::default();
        w.failed(0);
        w.retry_started();
        w.failed(35_000);
        assert_eq!(w.stalled_since(70_000 - 1, S), Some(0));
        // Without the retry in progress, a failure older than the stall
        // is no longer "still failing".
        w.retry_ended();
        assert_eq!(w.stalled_since(70_000 - 1, S), None);
        assert_eq!(w.stalled_since(35_000 + S - 1, S), Some(0));
    }

    #[test]
    fn failures_that_stopped_leave_the_worker_ready() {
        // The message went back to the queue (channel closed) and nothing
        // came since: not stalled once the last failure is a stall old.
        let mut w = SettleWatch::default();
        w.failed(0);
        w.failed(S);
        assert!(w.stalled_since(S, S).is_some());
        assert_eq!(w.stalled_since(2 * S, S), None);
    }

    #[test]
    fn never_a_failure_never_stalls_and_retries_do_not_underflow() {
        let mut w = SettleWatch::default();
        w.retry_ended();
        assert_eq!(w.stalled_since(u64::MAX, S), None);
        w.succeeded();
        assert_eq!(w, SettleWatch::default());
    }
}
