//! One delivery, in four steps: prepare the message, run the handler,
//! decide ([`crate::core::retry::settle`], pure), and carry the
//! [`Settlement`] out: ack, publish a copy then ack, or nack.

use super::circuit::ProbeTicket;
use super::config::WorkerConfig;
use super::idempotency::Entry;
use super::shared::Shared;
use crate::amqp::publisher::{Publisher, Refusal};
use crate::core::drill::message::{drill_step, DrillStep};
use crate::core::handling::outcome::Outcome;
use crate::core::retry::backoff::Backoff;
use crate::core::retry::breaker::Call;
use crate::core::retry::{
    count_attempt, headers_to_json, original_exchange_and_key, settle, Copy, DeadLetterReason,
    Delivered, NackCause, Note, PublishEnd, RequeueCause, Rules, Run, Settlement, Spare,
};
use crate::core::values::shortstr::{non_utf8_bytes, non_utf8_fields, utf8, Shown};
use crate::error::describe_lapin_error;
use crate::handler::{Handler, HandlerMessage, NotUtf8};
use crate::worker::metrics::{Metrics, QueueCounters};
use futures_util::FutureExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::Channel;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// Everything one delivery needs.
pub(super) struct DeliveryTask<H: Handler> {
    pub(super) cfg: Arc<WorkerConfig>,
    pub(super) handler: Arc<H>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shared: Arc<Shared>,
    pub(super) publisher: Arc<Publisher>,
    pub(super) consume: Channel,
    pub(super) user: String,
    pub(super) shutdown: CancellationToken,
    pub(super) lost: CancellationToken,
}

impl<H: Handler> Clone for DeliveryTask<H> {
    fn clone(&self) -> Self {
        DeliveryTask {
            cfg: self.cfg.clone(),
            handler: self.handler.clone(),
            metrics: self.metrics.clone(),
            shared: self.shared.clone(),
            publisher: self.publisher.clone(),
            consume: self.consume.clone(),
            user: self.user.clone(),
            shutdown: self.shutdown.clone(),
            lost: self.lost.clone(),
        }
    }
}

/// A delivery made ready for its handler (step 1).
struct Prepared {
    /// This run's number, 1 for the first.
    attempt: u32,
    /// The message id as a log shows it.
    message_id: Option<String>,
    /// What the handler gets; none for a drill message, or when the
    /// attempts are already used up.
    msg: Option<HandlerMessage>,
    /// Its drill step, decided here once from its headers; `None` for a
    /// message that is not a drill (see core::drill::message).
    drill: Option<DrillStep>,
}

/// What a settlement planned, as the "message handled" line says it (the
/// tier of a retry, the reason of a dead-letter), even when its copy was
/// abandoned.
struct Planned {
    tier: Option<String>,
    reason: Option<DeadLetterReason>,
}

/// Non-UTF-8 short strings named in one log line, at most.
const MAX_NOT_UTF8_LOGGED: usize = 10;

/// A short string as the handler gets it: its text when UTF-8, else its
/// bytes.
fn text_or_bytes(s: Option<&str>) -> (Option<String>, Option<Vec<u8>>) {
    match s {
        None => (None, None),
        Some(s) => match non_utf8_bytes(s) {
            Some(bytes) => (None, Some(bytes)),
            None => (utf8(s).map(|t| t.into_owned()), None),
        },
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl<H: Handler> DeliveryTask<H> {
    /// Handles `d`; `probe` is the half-open breaker's ticket when this
    /// run is its probe (given back unrecorded when no handler runs).
    pub(super) async fn process(self, d: Delivery, probe: Option<ProbeTicket>) {
        let mut prepared = self.prepare(&d);
        // A drill message never reaches the handler (core::drill::message).
        let run = match prepared.drill {
            Some(step) => {
                info!(queue = %self.cfg.pipeline.name,
                message_id = prepared.message_id.as_deref().unwrap_or(""),
                attempt = prepared.attempt,
                "drill message: not handed to the handler ({})",
                match step {
                    DrillStep::Fail => "failed as transient",
                    DrillStep::AckReplayed => "replayed: acked",
                });
                drop(probe);
                Run::drill(step, prepared.attempt, self.cfg.pipeline.retry.max_attempts)
            }
            None => self.guarded_run(&d, &mut prepared, probe).await,
        };
        let rules = Rules {
            pipeline: &self.cfg.pipeline,
            dead_letter: self.cfg.dead_letter,
            frame_max: self.publisher.frame_max(),
            connection_user: &self.user,
        };
        let delivered = Delivered {
            properties: &d.properties,
            exchange: d.exchange.as_str(),
            routing_key: d.routing_key.as_str(),
            attempt: prepared.attempt,
            drill: prepared.drill,
        };
        let plan = settle(
            &rules,
            &delivered,
            &run,
            now_unix_ms(),
            rand::random::<f64>(),
        );
        for note in &plan.notes {
            self.log_note(note, &prepared, rules.frame_max);
        }
        // What the log line needs of the plan, which carrying it out may
        // turn into another settlement.
        let planned = Planned {
            tier: plan.settlement.tier().map(str::to_owned),
            reason: plan.settlement.reason(),
        };
        let done = self.carry_out(&d, plan.settlement, &prepared).await;
        self.record(&prepared, &run, &planned, &done);
    }

    /// Step 2, with the idempotency guard when the pipeline has one: the
    /// key is leased before the handler runs (or the delivery is a
    /// duplicate, deferred, or handed back), renewed while it runs, and
    /// marked or released after, before the message is settled.
    async fn guarded_run(
        &self,
        d: &Delivery,
        prepared: &mut Prepared,
        probe: Option<ProbeTicket>,
    ) -> Run {
        match self.shared.guard.get().filter(|_| prepared.msg.is_some()) {
            None => self.run_handler(prepared, probe).await,
            // Boxed: an unguarded delivery's future does not carry the
            // guard's state (measured: the success path's spawn copies it).
            Some(guard) => Box::pin(self.run_guarded(guard, d, prepared, probe)).await,
        }
    }

    /// [`Self::guarded_run`] with the guard.
    async fn run_guarded(
        &self,
        guard: &Arc<super::idempotency::Guard>,
        d: &Delivery,
        prepared: &mut Prepared,
        probe: Option<ProbeTicket>,
    ) -> Run {
        let message_id = prepared.message_id.as_deref().unwrap_or("");
        match guard.enter(d, message_id).await {
            Entry::Unguarded => self.run_handler(prepared, probe).await,
            Entry::Skip(run) => run,
            Entry::Leased { lease, body } => {
                // A handler that is not cancel-safe may answer after its
                // timeout: where that answer goes.
                let mut late = guard.late_answer();
                if let (Some(msg), Some((answer, _))) = (prepared.msg.as_mut(), &late) {
                    msg.late = answer.clone();
                }
                let run = guard
                    .renew_while(&lease, self.run_handler(prepared, probe))
                    .await;
                // A timeout, as the handler said it, keeps the key in
                // doubt unless the handler is cancel-safe.
                let timed_out = matches!(run.outcome(), Some(Outcome::TimedOut { .. }));
                let late = late.take().filter(|_| timed_out).map(|(_, rx)| rx);
                guard.finish(&lease, &body, &run, late).await;
                run
            }
        }
    }

    /// Step 1: counts the attempt and builds what the handler gets.
    fn prepare(&self, d: &Delivery) -> Prepared {
        let p = &self.cfg.pipeline;
        let headers = d.properties.headers().as_ref();
        let count = count_attempt(headers, &self.shared.retry_queues);
        for w in &count.warnings {
            self.shared.warn_once(w);
        }
        let attempt = count.attempt;
        let drill = drill_step(headers);
        // Short strings are bytes on the wire, not necessarily UTF-8: the
        // handler gets text or base64, the log says which, copies keep the
        // bytes (see core::values::shortstr).
        let message_id = d
            .properties
            .message_id()
            .as_ref()
            .map(|m| Shown::of(m.as_str()).for_log().into_owned());
        let not_utf8 = non_utf8_fields(
            &d.properties,
            d.exchange.as_str(),
            d.routing_key.as_str(),
            MAX_NOT_UTF8_LOGGED,
        );
        if !not_utf8.is_empty() {
            warn!(
                queue = %p.name,
                message_id = message_id.as_deref().unwrap_or(""),
                "this message has short strings that are not UTF-8: {}; the handler sees them as base64, copies keep the original bytes",
                not_utf8.join(", ")
            );
        }
        // A message that arrives with its runs already used up is not run
        // again (step 3 dead-letters it), nor is a drill message.
        let msg = (drill.is_none() && attempt <= p.retry.max_attempts)
            .then(|| self.handler_message(d, attempt));
        Prepared {
            attempt,
            message_id,
            msg,
            drill,
        }
    }

    fn handler_message(&self, d: &Delivery, attempt: u32) -> HandlerMessage {
        let p = &self.cfg.pipeline;
        let headers = d.properties.headers().as_ref();
        let (orig_exchange, orig_key) =
            original_exchange_and_key(headers, d.exchange.as_str(), d.routing_key.as_str());
        let (message_id, message_id_bytes) =
            text_or_bytes(d.properties.message_id().as_ref().map(|m| m.as_str()));
        let (content_type, content_type_bytes) =
            text_or_bytes(d.properties.content_type().as_ref().map(|c| c.as_str()));
        let (exchange, exchange_bytes) = text_or_bytes(Some(&orig_exchange));
        let (routing_key, routing_key_bytes) = text_or_bytes(Some(&orig_key));
        HandlerMessage {
            body: d.data.clone(),
            queue: p.name.clone(),
            message_id,
            content_type,
            attempt,
            max_attempts: p.retry.max_attempts,
            exchange: exchange.unwrap_or_default(),
            routing_key: routing_key.unwrap_or_default(),
            headers: headers_to_json(headers),
            not_utf8: NotUtf8 {
                message_id: message_id_bytes,
                content_type: content_type_bytes,
                exchange: exchange_bytes,
                routing_key: routing_key_bytes,
            },
            late: Default::default(),
        }
    }

    /// Step 2: runs the handler, a panic counted as a transient failure,
    /// and feeds the breaker (with the probe's ticket, when it is the
    /// probe). Interrupted when the connection is lost meanwhile.
    async fn run_handler(&self, prepared: &Prepared, probe: Option<ProbeTicket>) -> Run {
        let p = &self.cfg.pipeline;
        let Some(msg) = &prepared.msg else {
            return Run::spent(prepared.attempt, p.retry.max_attempts);
        };
        self.metrics.handler_started();
        let t0 = Instant::now();
        let run = AssertUnwindSafe(self.handler.handle(msg)).catch_unwind();
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
                self.metrics.handler_abandoned();
                return Run::Interrupted;
            }
        };
        self.metrics.handler_finished(t0.elapsed());
        self.shared.counters.outcome(outcome.label());
        if let Some(c) = &self.shared.circuit {
            c.record(
                probe,
                match outcome {
                    Outcome::Success => Call::Success,
                    Outcome::Transient { .. } | Outcome::TimedOut { .. } => Call::Transient,
                    Outcome::Permanent { .. } => Call::Permanent,
                },
            );
        }
        Run::Ran(outcome)
    }

    /// Step 4: carries `s` out and returns what was done: `s` itself, or
    /// what [`Settlement::after_publish`] says when its copy could not be
    /// published.
    async fn carry_out(&self, d: &Delivery, mut s: Settlement, prepared: &Prepared) -> Settlement {
        let nack_if_refused = s.nack_if_refused();
        let s = match s.copy_mut() {
            Some(copy) => {
                let end = self.publish_until_confirmed(copy, d, nack_if_refused).await;
                s.after_publish(end)
            }
            None => s,
        };
        let queue = &self.cfg.pipeline.name;
        let message_id = prepared.message_id.as_deref().unwrap_or("");
        match &s {
            // A copy, if any, is confirmed.
            Settlement::Ack { .. }
            | Settlement::Retry { .. }
            | Settlement::DeadLetter { .. }
            | Settlement::Duplicate
            | Settlement::Defer { .. } => self.ack(d).await,
            Settlement::Nack { cause, .. } => {
                match cause {
                    NackCause::Chosen => {}
                    NackCause::DlqFull => warn!(queue = %queue, message_id,
                        "the DLQ refused the copy; nacking so the broker holds the message for its DLX until the DLQ has room"),
                    NackCause::BrokerRefusesSize(why) => {
                        warn!(queue = %queue, refusal = why.as_str(),
                        "the broker refuses copies of this message for its size; nacking it so the broker dead-letters it (x-death records it, without dlqctl's error history)")
                    }
                }
                self.nack_to_dlx(d).await
            }
            // Nothing to do: the broker requeues an unacked delivery when
            // its channel closes.
            Settlement::Requeue { cause } => match cause {
                RequeueCause::LostDuringRun => debug!(queue = %queue, message_id,
                    "connection lost during the handler run; its message is redelivered"),
                RequeueCause::ChannelClosed => info!(queue = %queue, message_id,
                    "the channel closed before the copy was confirmed; the message is redelivered"),
                RequeueCause::ShuttingDown => info!(queue = %queue, message_id,
                    "stopping before the copy was confirmed; the message returns to the queue"),
                RequeueCause::StoreUnavailable => self.hand_back(d).await,
                RequeueCause::CopyNotRepeatable => error!(queue = %queue, message_id,
                    "the broker refused the copy and it could not be read back to publish it again (a defect of dlqctl): the message stays unacked, and the broker redelivers it when the channel closes"),
                RequeueCause::DeferTooLarge => {
                    warn!(queue = %queue, message_id,
                        "the broker refuses the deferred copy for its size; handing the message back to the queue");
                    self.hand_back(d).await
                }
            },
        }
        s
    }

    /// Counts `done` and logs the "message handled" line, with the tier
    /// and reason of what was `planned` (a copy abandoned still says what
    /// it was for). A run the lost connection interrupted has no outcome:
    /// [`Self::carry_out`] said so, and nothing is counted.
    fn record(&self, prepared: &Prepared, run: &Run, planned: &Planned, done: &Settlement) {
        let Some(outcome) = run.outcome() else {
            if matches!(
                run,
                Run::Duplicate | Run::Deferred { .. } | Run::KeyConflict { .. }
            ) {
                record_settlement(&self.shared.counters, done);
                let why = match run {
                    Run::Duplicate => "its key is marked handled",
                    Run::KeyConflict { .. } => "its key is marked handled with another body",
                    _ => "another run holds the lease on its key",
                };
                info!(
                    queue = %self.cfg.pipeline.name,
                    message_id = prepared.message_id.as_deref(),
                    attempt = prepared.attempt,
                    max_attempts = self.cfg.pipeline.retry.max_attempts,
                    decision = done.label(),
                    tier = planned.tier.as_deref(),
                    reason = done.reason().or(planned.reason).map(DeadLetterReason::as_str),
                    why,
                    "message not run"
                );
            }
            return;
        };
        record_settlement(&self.shared.counters, done);
        let p = &self.cfg.pipeline;
        let error = outcome
            .error()
            .map(|error| tracing::field::display(log_error(error)));
        // A field that does not apply (no tier on an ack, no error on a
        // success) is left out, not logged empty.
        info!(
            queue = %p.name,
            message_id = prepared.message_id.as_deref(),
            attempt = prepared.attempt,
            max_attempts = p.retry.max_attempts,
            outcome = outcome.label(),
            decision = done.label(),
            tier = planned.tier.as_deref(),
            reason = done.reason().or(planned.reason).map(DeadLetterReason::as_str),
            error,
            "message handled"
        );
    }

    fn log_note(&self, note: &Note, prepared: &Prepared, frame_max: u32) {
        let queue = &self.cfg.pipeline.name;
        let message_id = prepared.message_id.as_deref().unwrap_or("");
        match note {
            Note::RetryTrimmed(trimmed) => warn!(queue = %queue, message_id, frame_max,
                "the retry copy was trimmed to fit frame_max with room for the broker's x-death: {}",
                trimmed.describe()),
            Note::RetryTooLarge(too_large) => warn!(queue = %queue, message_id, frame_max,
                "the retry copy does not fit frame_max: its properties take {} bytes even without dlqctl's error history and last error, and at most {} leave room for what the broker adds when the retry queue dead-letters it; dead-lettering the message as {} instead",
                too_large.size, too_large.budget, DeadLetterReason::TooLarge),
            Note::NackWouldNotFit => warn!(queue = %queue, message_id, frame_max,
                "the message is too large for the broker to add x-death within frame_max; publishing a copy to the DLX instead of nacking"),
            Note::DeadLetterTrimmed(trimmed) => warn!(queue = %queue, message_id, frame_max,
                "the DLQ copy was trimmed to fit frame_max: {}", trimmed.describe()),
            Note::DeadLetterUnfit(too_large) => warn!(queue = %queue, message_id, frame_max,
                "the message's own properties take {} bytes, more than the {} that leave room for the delivery count a quorum DLQ adds; the DLQ copy is published as it is and may not be readable from a quorum DLQ",
                too_large.size, too_large.budget),
        }
    }

    /// Acks `d`; counts the settle as gone through or failed (readiness).
    async fn ack(&self, d: &Delivery) {
        match d.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => self.metrics.settle_succeeded(),
            // The channel closed under the handler (a lost connection):
            // not a refusal, and readiness counts the lost connection as
            // not consuming, so it is not counted as a failed settle (two
            // such losses 31 s apart made an idle, consuming worker 503).
            Ok(false) => debug!("ack on a closed channel: the broker redelivers the message"),
            Err(e) => {
                self.metrics.settle_failed();
                warn!(error = %describe_lapin_error(&e), "ack failed: the broker redelivers the message")
            }
        }
    }

    /// Hands `d` back to its queue now (`basic.nack(requeue)`): no handler
    /// ran, nothing is dead-lettered.
    async fn hand_back(&self, d: &Delivery) {
        let nacked = d.acker.nack(BasicNackOptions {
            multiple: false,
            requeue: true,
        });
        if let Err(e) = nacked.await {
            debug!(error = %describe_lapin_error(&e), "handing a delivery back failed: the broker redelivers it when the channel closes");
        }
    }

    /// Nacks `d` to its DLX; counts the settle as [`Self::ack`] does.
    async fn nack_to_dlx(&self, d: &Delivery) {
        let nacked = d.acker.nack(BasicNackOptions {
            multiple: false,
            requeue: false,
        });
        match nacked.await {
            Ok(_) => self.metrics.settle_succeeded(),
            Err(e) => {
                self.metrics.settle_failed();
                warn!(error = %describe_lapin_error(&e), "nack failed: the broker redelivers the message");
            }
        }
    }

    /// Publishes `copy` (the body is `d`'s) until the broker confirms it,
    /// the same copy at each try. While the broker refuses, the original
    /// stays unacked and the worker starts no new handler.
    ///
    /// A publish consumes its properties: the first try takes the copy's
    /// own (left empty), and each try after a refusal reads them back from
    /// a [`Spare`] made before the first (one allocation, where a clone
    /// would make every header again; see core::retry::spare).
    async fn publish_until_confirmed(
        &self,
        copy: &mut Copy,
        d: &Delivery,
        nack_if_refused: bool,
    ) -> PublishEnd {
        let spare = Spare::of(&copy.properties);
        let mut first = Some(std::mem::take(&mut copy.properties));
        let (exchange, routing_key) = (copy.exchange.as_str(), copy.routing_key.as_str());
        let mut backoff = Backoff::new(Duration::from_millis(100), self.cfg.max_publish_backoff);
        let mut refusing = false;
        let result = loop {
            let Some(properties) = first.take().or_else(|| spare.read()) else {
                break PublishEnd::NotRepeatable;
            };
            match self
                .publisher
                .publish(exchange, routing_key, &d.data, properties)
                .await
            {
                Ok(()) => break PublishEnd::Confirmed,
                Err(Refusal::Nacked) if nack_if_refused => break PublishEnd::Nacked,
                Err(Refusal::TooLarge(why)) => break PublishEnd::TooLarge(why),
                Err(r) => {
                    self.metrics.publish_refused();
                    self.metrics.settle_failed();
                    if !refusing {
                        refusing = true;
                        self.metrics.settle_retry_started();
                        self.shared.refusing.fetch_add(1, Ordering::SeqCst);
                        warn!(queue = %self.cfg.pipeline.name, exchange, routing_key, refusal = %r,
                            "the broker refused a copy; the original stays unacked, no new handler starts, retrying the publish");
                    } else {
                        debug!(refusal = %r, "publish still refused");
                    }
                }
            }
            if !self.consume.status().connected() {
                break PublishEnd::ChannelClosed;
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => break PublishEnd::ShuttingDown,
                _ = tokio::time::sleep(backoff.next_wait()) => {}
            }
        };
        if refusing {
            self.metrics.settle_retry_ended();
            self.shared.refusing.fetch_sub(1, Ordering::SeqCst);
            self.shared.unblocked.notify_waiters();
            if result == PublishEnd::Confirmed {
                info!(queue = %self.cfg.pipeline.name, exchange, "the broker accepts copies again");
            }
        }
        result
    }
}

/// Counts what was done with a message: its decision, and by kind a
/// first-attempt success, the retry's delay or the dead-letter's reason.
fn record_settlement(counters: &QueueCounters, done: &Settlement) {
    counters.decision(done.label());
    match done {
        Settlement::Ack {
            first_attempt: true,
        } => counters.first_attempt_success(),
        Settlement::Retry { delay_ms, .. } => counters.retry_delay(*delay_ms),
        Settlement::DeadLetter { reason, .. } | Settlement::Nack { reason, .. } => {
            counters.dead_letter(reason.as_str())
        }
        _ => {}
    }
}

/// The end of an error for a log line: its last 300 bytes (the end of a
/// handler's stderr says what went wrong), marked with `…` when cut.
fn log_error(error: &str) -> std::borrow::Cow<'_, str> {
    let tail = crate::core::values::text::tail_utf8(error, 300);
    if tail.len() == error.len() {
        tail.into()
    } else {
        format!("…{tail}").into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::metrics::assert_renders;
    use lapin::BasicProperties;

    fn copy() -> Copy {
        Copy {
            exchange: "orders.retry".into(),
            routing_key: "1s".into(),
            properties: BasicProperties::default(),
        }
    }

    fn retry_in_1s() -> Settlement {
        Settlement::Retry {
            delay_ms: 1000,
            copy: copy(),
        }
    }

    #[test]
    fn every_dead_letter_is_counted_by_reason() {
        let m = Metrics::new();
        let q = m.queue_counters("orders");
        let retry = retry_in_1s();
        // The broker refuses the retry copy for its size: nacked to the DLX.
        record_settlement(
            &q,
            &retry.after_publish(PublishEnd::TooLarge("too big".into())),
        );
        let dead = Settlement::DeadLetter {
            reason: DeadLetterReason::Permanent,
            copy: copy(),
            nack_if_refused: true,
        };
        record_settlement(&q, &dead.clone().after_publish(PublishEnd::Nacked));
        record_settlement(&q, &dead.after_publish(PublishEnd::Confirmed));
        assert_renders(
            &m,
            &[
                "dlqctl_decisions_total{queue=\"orders\",decision=\"dead_letter_nack\"} 2",
                "dlqctl_decisions_total{queue=\"orders\",decision=\"dead_letter\"} 1",
                "dlqctl_dead_letters_total{queue=\"orders\",reason=\"too_large\"} 1",
                "dlqctl_dead_letters_total{queue=\"orders\",reason=\"permanent\"} 2",
            ],
        );
    }

    #[test]
    fn abandoned_and_acked_settlements_count_no_dead_letter() {
        let m = Metrics::new();
        let q = m.queue_counters("orders");
        let retry = retry_in_1s();
        record_settlement(&q, &retry.clone().after_publish(PublishEnd::ShuttingDown));
        record_settlement(&q, &retry.after_publish(PublishEnd::Confirmed));
        record_settlement(
            &q,
            &Settlement::Ack {
                first_attempt: true,
            },
        );
        assert_renders(
            &m,
            &[
                "dlqctl_decisions_total{queue=\"orders\",decision=\"abandoned\"} 1",
                "dlqctl_decisions_total{queue=\"orders\",decision=\"retry\"} 1",
                "dlqctl_decisions_total{queue=\"orders\",decision=\"ack\"} 1",
                "dlqctl_first_attempt_successes_total{queue=\"orders\"} 1",
                "dlqctl_retry_delay_seconds_count 1",
                // Every reason is there from the start, at 0, and stays there.
                "dlqctl_dead_letters_total{queue=\"orders\",reason=\"permanent\"} 0",
                "dlqctl_dead_letters_total{queue=\"orders\",reason=\"exhausted\"} 0",
                "dlqctl_dead_letters_total{queue=\"orders\",reason=\"too_large\"} 0",
            ],
        );
    }
}
