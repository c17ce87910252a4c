//! Prometheus metrics of a worker, in OpenMetrics text.

use crate::core::retry::Settlement;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Labels of a decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// The pipeline.
    pub queue: String,
    /// `ack`, `retry`, `dead_letter`, `dead_letter_nack`, `abandoned`.
    pub decision: String,
}

/// Labels of a handler run.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// The pipeline.
    pub queue: String,
    /// `success`, `transient`, `permanent`.
    pub outcome: String,
}

/// Labels of a dead-letter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The pipeline.
    pub queue: String,
    /// `permanent`, `exhausted`, `too_large`.
    pub reason: String,
}

/// Labels of a pipeline alone.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// The pipeline.
    pub queue: String,
}

/// Everything a worker counts.
pub struct Metrics {
    registry: Registry,
    /// Decisions carried out.
    pub decisions: Family<DecisionLabels, Counter>,
    /// Handler runs by outcome.
    pub outcomes: Family<OutcomeLabels, Counter>,
    /// Handler run time.
    pub handler_seconds: Histogram,
    /// Copies the broker refused (nack, return, timeout, channel error).
    pub publish_refusals: Counter,
    /// Reconnections after a lost connection.
    pub reconnects: Counter,
    /// Handler runs in progress.
    pub in_flight: Gauge,
    /// 1 while the circuit breaker is open.
    pub circuit_open: Gauge,
    /// Messages that succeeded on their first attempt.
    pub first_attempt_successes: Family<QueueLabels, Counter>,
    /// Dead-letters by reason.
    pub dead_letters: Family<ReasonLabels, Counter>,
    /// The wait scheduled between a failed attempt and the next (the
    /// tier's delay), in seconds.
    pub retry_delay_seconds: Histogram,
    /// The handler timeout the worker was started with, per pipeline
    /// (`dlqctl doctor --metrics-url` compares it with the broker's
    /// consumer timeout).
    pub handler_timeout_seconds: Family<QueueLabels, Gauge<f64, AtomicU64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("dlqctl");
        let decisions = Family::<DecisionLabels, Counter>::default();
        let outcomes = Family::<OutcomeLabels, Counter>::default();
        let handler_seconds = Histogram::new(exponential_buckets(0.001, 2.5, 14));
        let publish_refusals = Counter::default();
        let reconnects = Counter::default();
        let in_flight = Gauge::default();
        let circuit_open = Gauge::default();
        let first_attempt_successes = Family::<QueueLabels, Counter>::default();
        let dead_letters = Family::<ReasonLabels, Counter>::default();
        let retry_delay_seconds = Histogram::new(exponential_buckets(0.1, 3.0, 14));
        let handler_timeout_seconds = Family::<QueueLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "handler_timeout_seconds",
            "The handler timeout the worker was started with",
            handler_timeout_seconds.clone(),
        );
        registry.register(
            "first_attempt_successes",
            "Messages handled successfully on their first attempt",
            first_attempt_successes.clone(),
        );
        registry.register(
            "dead_letters",
            "Messages dead-lettered, by reason",
            dead_letters.clone(),
        );
        registry.register(
            "retry_delay_seconds",
            "Wait scheduled between a failed attempt and the next (the tier's delay)",
            retry_delay_seconds.clone(),
        );
        registry.register(
            "decisions",
            "Decisions carried out per message",
            decisions.clone(),
        );
        registry.register("handler_runs", "Handler runs by outcome", outcomes.clone());
        registry.register(
            "handler_duration_seconds",
            "Handler run time",
            handler_seconds.clone(),
        );
        registry.register(
            "publish_refusals",
            "Copies the broker refused",
            publish_refusals.clone(),
        );
        registry.register(
            "reconnects",
            "Reconnections to the broker",
            reconnects.clone(),
        );
        registry.register(
            "handlers_in_flight",
            "Handler runs in progress",
            in_flight.clone(),
        );
        registry.register(
            "circuit_open",
            "1 while the circuit breaker is open",
            circuit_open.clone(),
        );
        Metrics {
            registry,
            decisions,
            outcomes,
            handler_seconds,
            publish_refusals,
            reconnects,
            in_flight,
            circuit_open,
            first_attempt_successes,
            dead_letters,
            retry_delay_seconds,
            handler_timeout_seconds,
        }
    }

    /// Publishes the handler timeout of `queue`'s workers.
    pub fn set_handler_timeout(&self, queue: &str, timeout: std::time::Duration) {
        self.handler_timeout_seconds
            .get_or_create(&QueueLabels {
                queue: queue.to_string(),
            })
            .set(timeout.as_secs_f64());
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Decision labels the worker uses (see [`Settlement::label`]).
pub(crate) const DECISIONS: [&str; 5] = Settlement::LABELS;
/// Outcome labels.
pub(crate) const OUTCOMES: [&str; 3] = ["success", "transient", "permanent"];

/// The counters of one queue, looked up once instead of per message.
#[derive(Clone)]
pub struct QueueCounters {
    queue: String,
    decisions: Vec<(&'static str, Counter)>,
    outcomes: Vec<(&'static str, Counter)>,
    first_attempt_successes: Counter,
    dead_letters: Family<ReasonLabels, Counter>,
    retry_delay_seconds: Histogram,
}

impl QueueCounters {
    /// Counts a decision (`ack`, `retry`, ...).
    pub fn decision(&self, label: &str) {
        if let Some((_, c)) = self.decisions.iter().find(|(l, _)| *l == label) {
            c.inc();
        }
    }

    /// Counts a message acked after its first attempt.
    pub fn first_attempt_success(&self) {
        self.first_attempt_successes.inc();
    }

    /// Counts a dead-letter by its reason.
    pub fn dead_letter(&self, reason: &str) {
        self.dead_letters
            .get_or_create(&ReasonLabels {
                queue: self.queue.clone(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Records the wait scheduled before the next attempt.
    pub fn retry_delay(&self, delay_ms: u64) {
        self.retry_delay_seconds.observe(delay_ms as f64 / 1000.0);
    }

    /// Counts a handler outcome (`success`, `transient`, `permanent`).
    pub fn outcome(&self, label: &str) {
        if let Some((_, c)) = self.outcomes.iter().find(|(l, _)| *l == label) {
            c.inc();
        }
    }
}

impl Metrics {
    /// The counters of `queue`.
    pub fn queue_counters(&self, queue: &str) -> QueueCounters {
        QueueCounters {
            queue: queue.to_string(),
            first_attempt_successes: self
                .first_attempt_successes
                .get_or_create(&QueueLabels {
                    queue: queue.to_string(),
                })
                .clone(),
            dead_letters: self.dead_letters.clone(),
            retry_delay_seconds: self.retry_delay_seconds.clone(),
            decisions: DECISIONS
                .iter()
                .map(|d| {
                    let labels = DecisionLabels {
                        queue: queue.to_string(),
                        decision: (*d).to_string(),
                    };
                    (*d, self.decisions.get_or_create(&labels).clone())
                })
                .collect(),
            outcomes: OUTCOMES
                .iter()
                .map(|o| {
                    let labels = OutcomeLabels {
                        queue: queue.to_string(),
                        outcome: (*o).to_string(),
                    };
                    (*o, self.outcomes.get_or_create(&labels).clone())
                })
                .collect(),
        }
    }
}

/// Binds the metrics address once; the listener's `local_addr` is the
/// port really bound (for `:0`, the one the kernel chose).
pub async fn bind(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves `GET /metrics` on `listener` until the token is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: std::sync::Arc<Metrics>,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.render(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_first_attempt_successes_dead_letters_by_reason_and_retry_delays() {
        let m = Metrics::new();
        let q = m.queue_counters("orders");
        q.first_attempt_success();
        q.dead_letter("exhausted");
        q.dead_letter("exhausted");
        q.dead_letter("too_large");
        q.retry_delay(10_000);
        let text = m.render();
        assert!(
            text.contains("dlqctl_first_attempt_successes_total{queue=\"orders\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("dlqctl_dead_letters_total{queue=\"orders\",reason=\"exhausted\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("dlqctl_dead_letters_total{queue=\"orders\",reason=\"too_large\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("dlqctl_retry_delay_seconds_sum 10.0"),
            "{text}"
        );
        assert!(
            text.contains("dlqctl_retry_delay_seconds_count 1"),
            "{text}"
        );
    }

    #[test]
    fn renders_counters_with_labels() {
        let m = Metrics::new();
        m.decisions
            .get_or_create(&DecisionLabels {
                queue: "orders".into(),
                decision: "retry".into(),
            })
            .inc();
        let q = m.queue_counters("orders");
        q.decision("retry");
        q.outcome("transient");
        let text = m.render();
        assert!(
            text.contains("dlqctl_decisions_total{queue=\"orders\",decision=\"retry\"} 2"),
            "{text}"
        );
        assert!(text.contains("dlqctl_handlers_in_flight 0"), "{text}");
        assert!(
            text.contains("dlqctl_handler_runs_total{queue=\"orders\",outcome=\"transient\"} 1"),
            "{text}"
        );
    }
}
