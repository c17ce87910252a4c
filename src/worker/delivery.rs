//! One delivery: run the handler, then ack, retry or dead-letter.

use super::{DeadLetterMode, Shared, WorkerConfig};
use crate::amqp::connection::describe_lapin_error;
use crate::amqp::publisher::{Publisher, Refusal};
use crate::core::backoff::Backoff;
use crate::core::duration::tier_name;
use crate::core::outcome::Outcome;
use crate::core::retry::fit::{
    fit_dead_letter_copy, fit_retry_copy, properties_size, retry_budget,
};
use crate::core::retry::{
    count_attempt, dead_letter_copy, decide, headers_to_json, jitter_expiration,
    original_exchange_and_key, retry_copy, CopyContext, DeadLetterReason, Decision,
};
use crate::core::shortstr::{non_utf8_bytes, non_utf8_fields, utf8, Shown};
use crate::core::topology::QueueType;
use crate::handler::{Handler, HandlerMessage, NotUtf8};
use crate::worker::metrics::Metrics;
use futures_util::FutureExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::{BasicProperties, Channel};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

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

/// What became of a copy after retries.
enum Published {
    /// Confirmed.
    Done,
    /// A quorum pipeline's DLQ refused it: fall back to nack(requeue=false).
    FallBackToNack,
    /// The delivery's channel is gone or we are stopping: the original
    /// returns to the queue by itself.
    Abandoned,
    /// The broker refuses the copy for its size: no retry can pass.
    TooLarge(String),
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
    pub(super) async fn process(self, d: Delivery) {
        let p = &self.cfg.pipeline;
        let headers = d.properties.headers().as_ref();
        let count = count_attempt(headers, &self.shared.retry_queues);
        for w in &count.warnings {
            self.shared.warn_once(w);
        }
        let attempt = count.attempt;
        let (orig_exchange, orig_key) =
            original_exchange_and_key(headers, d.exchange.as_str(), d.routing_key.as_str());
        // Short strings are bytes on the wire, not necessarily UTF-8: the
        // handler gets text or base64, the log says which, copies keep the
        // bytes (see core::shortstr).
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
            let (message_id_text, message_id_bytes) =
                text_or_bytes(d.properties.message_id().as_ref().map(|m| m.as_str()));
            let (content_type, content_type_bytes) =
                text_or_bytes(d.properties.content_type().as_ref().map(|c| c.as_str()));
            let (exchange, exchange_bytes) = text_or_bytes(Some(&orig_exchange));
            let (routing_key, routing_key_bytes) = text_or_bytes(Some(&orig_key));
            let msg = HandlerMessage {
                body: d.data.clone(),
                queue: p.name.clone(),
                message_id: message_id_text,
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
        let mut decision = if ran {
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
        // Every copy must fit the connection's frame_max, a retry copy with
        // room for what the broker adds when its tier dead-letters it
        // (core::retry::fit); one that cannot is dead-lettered instead.
        let frame_max = self.publisher.frame_max();
        let mut retry_props = None;
        if let Decision::Retry { delay_ms } = decision {
            let expiration = jitter_expiration(delay_ms, p.retry.jitter, rand::random::<f64>());
            match fit_retry_copy(retry_copy(&d.properties, &ctx, expiration), frame_max) {
                Ok((props, trimmed)) => {
                    if trimmed.any() {
                        warn!(queue = %p.name, message_id = message_id.as_deref().unwrap_or(""), frame_max,
                            "the retry copy was trimmed to fit frame_max with room for the broker's x-death: {}",
                            trimmed.describe());
                    }
                    retry_props = Some(props);
                }
                Err(too_large) => {
                    warn!(queue = %p.name, message_id = message_id.as_deref().unwrap_or(""), frame_max,
                        "the retry copy does not fit frame_max: its properties take {} bytes even without dlqctl's error history and last error, and at most {} leave room for what the broker adds when the retry queue dead-letters it; dead-lettering the message as {} instead",
                        too_large.size, too_large.budget, DeadLetterReason::TooLarge);
                    decision = Decision::DeadLetter {
                        reason: DeadLetterReason::TooLarge,
                    };
                }
            }
        }
        // `--dead-letter nack` lets the broker add x-death to the original:
        // when that would not fit, the copy is published instead.
        let nack_fits = properties_size(&d.properties) <= retry_budget(&d.properties, frame_max);
        let label = match decision {
            Decision::Ack => {
                self.ack(&d).await;
                "ack"
            }
            Decision::Retry { delay_ms } => {
                let Some(props) = retry_props.take() else {
                    // Unreachable: set above for every retry.
                    return;
                };
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
                    Published::TooLarge(why) => {
                        self.nack_too_large(&d, &why).await;
                        "dead_letter_nack"
                    }
                    _ => "abandoned",
                }
            }
            Decision::DeadLetter { reason } => match self.cfg.dead_letter {
                DeadLetterMode::Nack if nack_fits => {
                    self.nack_to_dlx(&d).await;
                    "dead_letter_nack"
                }
                mode => {
                    if mode == DeadLetterMode::Nack {
                        warn!(queue = %p.name, message_id = message_id.as_deref().unwrap_or(""), frame_max,
                            "the message is too large for the broker to add x-death within frame_max; publishing a copy to the DLX instead of nacking");
                    }
                    let props = dead_letter_copy(&d.properties, &ctx, reason, &p.name, ran);
                    let (props, trimmed, fits) = fit_dead_letter_copy(props, frame_max);
                    if trimmed.any() {
                        warn!(queue = %p.name, message_id = message_id.as_deref().unwrap_or(""), frame_max,
                            "the DLQ copy was trimmed to fit frame_max: {}", trimmed.describe());
                    }
                    if let Err(too_large) = fits {
                        warn!(queue = %p.name, message_id = message_id.as_deref().unwrap_or(""), frame_max,
                            "the message's own properties take {} bytes, more than the {} that leave room for the delivery count a quorum DLQ adds; the DLQ copy is published as it is and may not be readable from a quorum DLQ",
                            too_large.size, too_large.budget);
                    }
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
                        Published::TooLarge(why) => {
                            self.nack_too_large(&d, &why).await;
                            "dead_letter_nack"
                        }
                        Published::Abandoned => "abandoned",
                    }
                }
            },
        };
        self.shared.counters.decision(label);
        match (decision, label) {
            (Decision::Ack, "ack") if ran && attempt == 1 => {
                self.shared.counters.first_attempt_success()
            }
            (Decision::Retry { delay_ms }, "retry") => self.shared.counters.retry_delay(delay_ms),
            (Decision::DeadLetter { reason }, "dead_letter" | "dead_letter_nack") => {
                self.shared.counters.dead_letter(reason.as_str())
            }
            _ => {}
        }
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
            error = %log_error(error),
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

    /// The broker refuses any copy of this message (over its
    /// `max_message_size`, lowered after the message was queued): nack it
    /// so that the broker's own dead-lettering, which does not check the
    /// size, moves it to the DLX. Its error history is not added.
    async fn nack_too_large(&self, d: &Delivery, why: &str) {
        warn!(queue = %self.cfg.pipeline.name, refusal = why,
            "the broker refuses copies of this message for its size; nacking it so the broker dead-letters it (x-death records it, without dlqctl's error history)");
        self.nack_to_dlx(d).await;
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
        let mut backoff = Backoff::new(Duration::from_millis(100), self.cfg.max_publish_backoff);
        let mut refusing = false;
        let result = loop {
            match self
                .publisher
                .publish(exchange, routing_key, &d.data, props.clone())
                .await
            {
                Ok(()) => break Published::Done,
                Err(Refusal::Nacked) if dlq_fallback => break Published::FallBackToNack,
                Err(Refusal::TooLarge(why)) => break Published::TooLarge(why),
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
                _ = tokio::time::sleep(backoff.next_wait()) => {}
            }
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

/// The end of an error for a log line: its last 300 bytes (the end of a
/// handler's stderr says what went wrong), marked with `…` when cut.
fn log_error(error: &str) -> std::borrow::Cow<'_, str> {
    let tail = crate::core::text::tail_utf8(error, 300);
    if tail.len() == error.len() {
        tail.into()
    } else {
        format!("…{tail}").into()
    }
}
