//! Prometheus metrics of a worker, in OpenMetrics text.

use crate::core::dlq::redrive::RunResult;
use crate::core::retry::breaker::Phase;
use crate::core::retry::{DeadLetterReason, Settlement};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// [`exponential_buckets`] rounded to 4 significant digits, so that the
/// bounds read as written (`le="0.3"`, not `le="0.30000000000000004"`).
fn readable_buckets(start: f64, factor: f64, length: u16) -> impl Iterator<Item = f64> {
    exponential_buckets(start, factor, length).map(|b| {
        if b <= 0.0 || !b.is_finite() {
            return b;
        }
        let digits = 3 - b.log10().floor() as i32;
        if digits >= 0 {
            let m = 10f64.powi(digits);
            (b * m).round() / m
        } else {
            let m = 10f64.powi(-digits);
            (b / m).round() * m
        }
    })
}
use crate::core::retry::readiness::{Readiness, SettleWatch};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Instant;
use tracing::{info, warn};

/// The [`SettleWatch`] of a worker, on the worker's monotonic clock.
struct SettleState {
    started: Instant,
    watch: Mutex<SettleWatch>,
    /// The stall was logged (and its end is logged once).
    logged: Mutex<bool>,
}

impl Default for SettleState {
    fn default() -> Self {
        SettleState {
            started: Instant::now(),
            watch: Mutex::new(SettleWatch::default()),
            logged: Mutex::new(false),
        }
    }
}

/// Labels of a decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    /// The pipeline.
    queue: String,
    /// `ack`, `retry`, `dead_letter`, `dead_letter_nack`, `abandoned`,
    /// `duplicate`, `deferred`.
    decision: String,
}

/// Labels of a handler run.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    /// The pipeline.
    queue: String,
    /// `success`, `transient`, `permanent`.
    outcome: String,
}

/// Labels of a dead-letter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    /// The pipeline.
    queue: String,
    /// `permanent`, `exhausted`, `too_large`.
    reason: String,
}

/// Labels of a redrive run.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    /// The pipeline.
    queue: String,
    /// `moved`, `canary_failed`, `unhealthy`, `nothing_eligible`, `busy`,
    /// `failed`.
    result: String,
}

/// Labels of a circuit breaker's change of state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    /// The pipeline.
    queue: String,
    /// The state it went to: `open`, `half_open`, `closed`.
    to: String,
}

/// Labels of a pipeline alone.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    /// The pipeline.
    queue: String,
}

/// Everything a worker counts, rendered by [`Metrics::render`]. Its
/// metrics are private: the worker, its parts and the tests count through
/// its methods.
pub struct Metrics {
    registry: Registry,
    /// Decisions carried out.
    decisions: Family<DecisionLabels, Counter>,
    /// Handler runs by outcome.
    outcomes: Family<OutcomeLabels, Counter>,
    /// Handler run time.
    handler_seconds: Histogram,
    /// Copies the broker refused (nack, return, timeout, channel error).
    publish_refusals: Counter,
    /// Reconnections after a lost connection.
    reconnects: Counter,
    /// Handler runs in progress.
    in_flight: Gauge,
    /// 1 while the circuit breaker is not closed (open, or half-open with
    /// only its probe running): consumption is paused.
    circuit_open: Gauge,
    /// The circuit breaker's state per pipeline: 0 closed, 1 open, 2
    /// half-open (only with a `circuit_breaker` in the topology).
    circuit_state: Family<QueueLabels, Gauge>,
    /// Changes of the circuit breaker's state, by the state it went to.
    circuit_transitions: Family<TransitionLabels, Counter>,
    /// When the circuit breaker left closed, while open or half-open (the
    /// outage's start, kept through every re-opening), or when it closed
    /// (the worker's start while it never changed), in Unix seconds.
    circuit_since: Family<QueueLabels, Gauge<f64, AtomicU64>>,
    /// 1 when the circuit breaker's health URL is one no request can be
    /// built from (a configuration error); 0 otherwise.
    circuit_probe_unusable: Family<QueueLabels, Gauge>,
    /// The pipelines whose breaker's health URL cannot be used.
    probe_unusable: Mutex<std::collections::BTreeSet<String>>,
    /// Whether `probe_unusable` holds any queue (read at every settle).
    any_probe_unusable: std::sync::atomic::AtomicBool,
    /// 1 while the worker is connected and has its consumer on the main
    /// queue.
    consuming: Gauge,
    /// 1 while the worker is ready: what `/readyz` answers (see
    /// [`Readiness`]). Brought up to date whenever it is read.
    ready: Gauge,
    /// Looks at the consumer timeout (at start, then every minute) that
    /// found it not above the handler timeout while the worker ran.
    consumer_timeout_conflicts: Counter,
    /// Whether settles go through, and since when they fail.
    settles: SettleState,
    /// Messages that succeeded on their first attempt.
    first_attempt_successes: Family<QueueLabels, Counter>,
    /// Dead-letters by reason.
    dead_letters: Family<ReasonLabels, Counter>,
    /// The wait scheduled between a failed attempt and the next (the
    /// tier's delay), in seconds.
    retry_delay_seconds: Histogram,
    /// Automatic redrive runs by result.
    redrive_runs: Family<RunLabels, Counter>,
    /// Messages moved back by automatic redrive (canaries included).
    redriven_messages: Family<QueueLabels, Counter>,
    /// DLQ messages past `max_redrives`, waiting for a person (as the last
    /// run that read the DLQ counted them).
    redrive_waiting_for_person: Family<QueueLabels, Gauge>,
    /// How long until the next redrive look, in seconds (doubles after a
    /// failed canary).
    redrive_next_wait_seconds: Family<QueueLabels, Gauge<f64, AtomicU64>>,
    /// The handler timeout the worker was started with, per pipeline
    /// (`dlqctl doctor --metrics-url` compares it with the broker's
    /// consumer timeout).
    handler_timeout_seconds: Family<QueueLabels, Gauge<f64, AtomicU64>>,
    /// Idempotent handling, per pipeline.
    idempotency: IdempotencyMetrics,
    /// Since when (ms on the settles' clock) the idempotency store has not
    /// answered; `None` while it answers.
    store_down_since: Mutex<Option<u64>>,
}

/// The counters of idempotent handling (docs/worker.md, "Idempotent
/// handling"), per pipeline.
#[derive(Clone, Default)]
struct IdempotencyMetrics {
    /// Deliveries acked without the handler: their key was marked handled.
    duplicates: Family<QueueLabels, Counter>,
    /// Deliveries deferred to a tier: another run held their key's lease.
    deferrals: Family<QueueLabels, Counter>,
    /// Keys marked handled with another body, run again.
    key_conflicts: Family<QueueLabels, Counter>,
    /// Deliveries without the configured key, run unguarded.
    unkeyed: Family<QueueLabels, Counter>,
    /// Pauses of consumption because the store did not answer.
    store_pauses: Family<QueueLabels, Counter>,
    /// Marks that failed after a success (the message was acked anyway).
    mark_failures: Family<QueueLabels, Counter>,
    in_doubt: Family<QueueLabels, Counter>,
}

/// A redrive run as the metrics count it (the worker makes it of its
/// report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedriveRun<'a> {
    /// The pipeline.
    pub queue: &'a str,
    /// How the run ended.
    pub result: RunResult,
    /// Messages it moved back (canaries included).
    pub moved: u64,
    /// DLQ messages past `max_redrives`, when it read the DLQ.
    pub waiting_for_person: Option<u64>,
    /// The wait before the next look, in ms.
    pub next_wait_ms: u64,
}

/// What the idempotency guard counts, each per pipeline (docs/worker.md,
/// "Idempotent handling").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardEvent {
    /// A delivery acked without the handler: its key was marked handled
    /// (`dlqctl_duplicates_total`).
    Duplicate,
    /// A delivery deferred to a tier: another run held its key's lease
    /// (`dlqctl_deferrals_total`).
    Deferral,
    /// A key marked handled with another body, run again
    /// (`dlqctl_idempotency_key_conflicts_total`).
    KeyConflict,
    /// A delivery without the configured key, run unguarded
    /// (`dlqctl_idempotency_unkeyed_total`).
    Unkeyed,
    /// Consumption paused because the store did not answer
    /// (`dlqctl_idempotency_store_pauses_total`).
    StorePause,
    /// A mark that failed after a success; the message was acked anyway
    /// (`dlqctl_idempotency_mark_failures_total`).
    MarkFailure,
    /// A timeout whose outcome is unknown: its key kept in doubt
    /// (`dlqctl_idempotency_in_doubt_total`).
    InDoubt,
}

impl GuardEvent {
    /// Every event, in the order their families are registered.
    pub const ALL: [GuardEvent; 7] = [
        GuardEvent::Duplicate,
        GuardEvent::Deferral,
        GuardEvent::KeyConflict,
        GuardEvent::Unkeyed,
        GuardEvent::StorePause,
        GuardEvent::MarkFailure,
        GuardEvent::InDoubt,
    ];
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A new metric of type `M`, registered in `registry` as `name`.
fn registered<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: prometheus_client::registry::Metric + Clone + Default,
{
    register_as(registry, name, help, M::default())
}

/// `metric`, registered in `registry` as `name`.
fn register_as<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

impl Metrics {
    /// A registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("dlqctl");
        let r = &mut registry;
        Metrics {
            redrive_runs: registered(r, "redrive_runs", "Automatic redrive runs, by result"),
            redriven_messages: registered(
                r,
                "redriven_messages",
                "Messages moved from the DLQ back to the main queue by automatic redrive",
            ),
            redrive_waiting_for_person: registered(
                r,
                "redrive_waiting_for_person",
                "DLQ messages past max_redrives, which only a person moves",
            ),
            redrive_next_wait_seconds: registered(
                r,
                "redrive_next_wait_seconds",
                "Time until the next automatic redrive look",
            ),
            handler_timeout_seconds: registered(
                r,
                "handler_timeout_seconds",
                "The handler timeout the worker was started with",
            ),
            first_attempt_successes: registered(
                r,
                "first_attempt_successes",
                "Messages handled successfully on their first attempt",
            ),
            dead_letters: registered(r, "dead_letters", "Messages dead-lettered, by reason"),
            retry_delay_seconds: register_as(
                r,
                "retry_delay_seconds",
                "Wait scheduled between a failed attempt and the next (the tier's delay)",
                Histogram::new(readable_buckets(0.1, 3.0, 14)),
            ),
            decisions: registered(r, "decisions", "Decisions carried out per message"),
            outcomes: registered(r, "handler_runs", "Handler runs by outcome"),
            handler_seconds: register_as(
                r,
                "handler_duration_seconds",
                "Handler run time",
                Histogram::new(readable_buckets(0.001, 2.5, 14)),
            ),
            publish_refusals: registered(r, "publish_refusals", "Copies the broker refused"),
            reconnects: registered(r, "reconnects", "Reconnections to the broker"),
            in_flight: registered(r, "handlers_in_flight", "Handler runs in progress"),
            circuit_open: registered(
                r,
                "circuit_open",
                "1 while the circuit breaker is open or half-open (consumption paused)",
            ),
            circuit_state: registered(
                r,
                "circuit_state",
                "The circuit breaker's state: 0 closed, 1 open, 2 half-open",
            ),
            circuit_transitions: registered(
                r,
                "circuit_transitions",
                "Changes of the circuit breaker's state, by the state it went to",
            ),
            circuit_since: registered(
                r,
                "circuit_state_since_timestamp_seconds",
                "Unix time at which the circuit breaker left closed (the outage's start, while open or half-open) or closed",
            ),
            circuit_probe_unusable: registered(r, "circuit_probe_unusable", "1 when the circuit breaker's health URL is one no request can be built from (a configuration error)"),
            consuming: registered(
                r,
                "consuming",
                "1 while the worker is connected and consuming its queue",
            ),
            ready: registered(
                r,
                "ready",
                "1 while the worker is ready (what /readyz answers): consuming, and settles not \
                 all failing for 30 s",
            ),
            consumer_timeout_conflicts: registered(
                r,
                "consumer_timeout_conflicts",
                "Looks at the queue's consumer timeout that found it not above the handler \
                 timeout",
            ),
            idempotency: IdempotencyMetrics {
                duplicates: registered(r, "duplicates", "Deliveries acked without the handler: their idempotency key was marked handled"),
                deferrals: registered(r, "deferrals", "Deliveries deferred to a retry tier: another run held the lease on their idempotency key"),
                key_conflicts: registered(r, "idempotency_key_conflicts", "Idempotency keys marked handled with another body, run again"),
                unkeyed: registered(r, "idempotency_unkeyed", "Deliveries without the configured idempotency key, run unguarded"),
                store_pauses: registered(r, "idempotency_store_pauses", "Pauses of consumption because the idempotency store did not answer"),
                mark_failures: registered(r, "idempotency_mark_failures", "Marks that failed after a success (the message was acked anyway)"),
                in_doubt: registered(r, "idempotency_in_doubt", "Timeouts whose outcome was unknown: their key kept in doubt, waiting for the late answer"),
            },
            store_down_since: Mutex::new(None),
            probe_unusable: Mutex::default(),
            any_probe_unusable: std::sync::atomic::AtomicBool::new(false),
            settles: SettleState::default(),
            registry,
        }
    }

    /// Counts a redrive run: its result, what it moved, the messages
    /// waiting for a person (when it read the DLQ) and the next wait.
    pub fn record_redrive(&self, r: &RedriveRun<'_>) {
        let queue = QueueLabels {
            queue: r.queue.to_string(),
        };
        self.count_redrive_run(r.queue, r.result);
        self.redriven_messages.get_or_create(&queue).inc_by(r.moved);
        if let Some(n) = r.waiting_for_person {
            self.redrive_waiting_for_person
                .get_or_create(&queue)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        // A busy turn changed no wait: the gauge keeps what it showed.
        if r.result != RunResult::Busy {
            self.record_redrive_wait(r.queue, r.next_wait_ms);
        }
    }

    /// Counts a redrive run of `queue` that failed before it could report
    /// (`result="failed"`): nothing else about it is known.
    pub fn record_redrive_failed(&self, queue: &str) {
        self.count_redrive_run(queue, RunResult::Failed);
    }

    fn count_redrive_run(&self, queue: &str, result: RunResult) {
        self.redrive_runs
            .get_or_create(&RunLabels {
                queue: queue.to_string(),
                result: result.label().to_string(),
            })
            .inc();
    }

    /// Publishes the pipeline's current redrive wait (the shared one when
    /// the broker keeps it), and the messages its last run found waiting
    /// for a person.
    pub fn record_redrive_state(
        &self,
        queue: &str,
        state: &crate::core::dlq::redrive_state::RedriveState,
    ) {
        self.record_redrive_wait(queue, state.wait_ms);
        if let Some(n) = state.last().and_then(|r| r.waiting_for_person) {
            self.redrive_waiting_for_person
                .get_or_create(&QueueLabels {
                    queue: queue.to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Publishes the wait before the next look at `queue`'s DLQ.
    pub fn record_redrive_wait(&self, queue: &str, wait_ms: u64) {
        self.redrive_next_wait_seconds
            .get_or_create(&QueueLabels {
                queue: queue.to_string(),
            })
            .set(wait_ms as f64 / 1000.0);
    }

    /// Publishes the handler timeout of `queue`'s workers.
    pub fn set_handler_timeout(&self, queue: &str, timeout: std::time::Duration) {
        self.handler_timeout_seconds
            .get_or_create(&QueueLabels {
                queue: queue.to_string(),
            })
            .set(timeout.as_secs_f64());
    }

    /// Shows `queue`'s circuit breaker in `phase` at `at_unix_s`, and
    /// counts the change when `changed` (at start every state's counter is
    /// made at 0). "Since" moves only when it leaves or enters closed: an
    /// outage's open and half-open phases share its start.
    pub fn set_circuit(&self, queue: &str, phase: Phase, at_unix_s: f64, changed: bool) {
        let labels = QueueLabels {
            queue: queue.to_string(),
        };
        let state = self.circuit_state.get_or_create(&labels);
        // Open and half-open are one outage: its start is kept through
        // every re-opening.
        let was_paused = state.get() != Phase::Closed.gauge();
        state.set(phase.gauge());
        drop(state);
        if !(was_paused && phase != Phase::Closed) {
            self.circuit_since.get_or_create(&labels).set(at_unix_s);
        }
        self.circuit_open.set(i64::from(phase != Phase::Closed));
        for p in [Phase::Open, Phase::HalfOpen, Phase::Closed] {
            let c = self.circuit_transitions.get_or_create(&TransitionLabels {
                queue: queue.to_string(),
                to: p.label().to_string(),
            });
            if changed && p == phase {
                c.inc();
            }
        }
    }

    /// Shows whether `queue`'s breaker has a health URL no request can be
    /// built from; while one has, the worker is not ready.
    pub fn set_probe_unusable(&self, queue: &str, unusable: bool) {
        let labels = QueueLabels {
            queue: queue.to_string(),
        };
        self.circuit_probe_unusable
            .get_or_create(&labels)
            .set(i64::from(unusable));
        if let Ok(mut q) = self.probe_unusable.lock() {
            if unusable {
                q.insert(labels.queue);
            } else {
                q.remove(&labels.queue);
            }
            self.any_probe_unusable
                .store(!q.is_empty(), std::sync::atomic::Ordering::Relaxed);
        }
        self.readiness();
    }

    /// Counts a reconnection after a lost connection.
    pub fn reconnected(&self) {
        self.reconnects.inc();
    }

    /// Shows whether the worker is connected and has its consumer on the
    /// main queue.
    pub fn set_consuming(&self, consuming: bool) {
        self.consuming.set(i64::from(consuming));
    }

    /// Counts a look at the consumer timeout that found it not above the
    /// handler timeout.
    pub fn consumer_timeout_conflict(&self) {
        self.consumer_timeout_conflicts.inc();
    }

    /// A handler run started.
    pub fn handler_started(&self) {
        self.in_flight.inc();
    }

    /// A handler run started by [`Self::handler_started`] ended after
    /// `took`.
    pub fn handler_finished(&self, took: std::time::Duration) {
        self.handler_seconds.observe(took.as_secs_f64());
        self.in_flight.dec();
    }

    /// A handler run started by [`Self::handler_started`] was given up
    /// (the connection was lost): no run time is recorded.
    pub fn handler_abandoned(&self) {
        self.in_flight.dec();
    }

    /// Counts a copy the broker refused (nack, return, timeout, channel
    /// error).
    pub fn publish_refused(&self) {
        self.publish_refusals.inc();
    }

    /// Makes `queue`'s idempotency counters, at 0: /metrics (and `status
    /// --metrics-url`) then shows the pipeline as guarded before the
    /// first one, and a rate() has a start.
    pub fn guard_started(&self, queue: &str) {
        let labels = QueueLabels {
            queue: queue.to_string(),
        };
        for event in GuardEvent::ALL {
            let _ = self.guard_family(event).get_or_create(&labels);
        }
    }

    /// Counts one `event` of `queue`'s idempotency guard.
    pub fn guard_event(&self, queue: &str, event: GuardEvent) {
        self.guard_family(event)
            .get_or_create(&QueueLabels {
                queue: queue.to_string(),
            })
            .inc();
    }

    fn guard_family(&self, event: GuardEvent) -> &Family<QueueLabels, Counter> {
        let m = &self.idempotency;
        match event {
            GuardEvent::Duplicate => &m.duplicates,
            GuardEvent::Deferral => &m.deferrals,
            GuardEvent::KeyConflict => &m.key_conflicts,
            GuardEvent::Unkeyed => &m.unkeyed,
            GuardEvent::StorePause => &m.store_pauses,
            GuardEvent::MarkFailure => &m.mark_failures,
            GuardEvent::InDoubt => &m.in_doubt,
        }
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        self.readiness();
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Decision labels the worker uses (see [`Settlement::label`]).
pub(crate) const DECISIONS: [&str; 7] = Settlement::LABELS;
/// Outcome labels.
pub(crate) const OUTCOMES: [&str; 4] = ["success", "transient", "permanent", "timed_out"];

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
        // Every reason starts at 0, so that /metrics names the family
        // before the first dead-letter and a rate() has a start.
        for reason in DeadLetterReason::ALL {
            let _ = self.dead_letters.get_or_create(&ReasonLabels {
                queue: queue.to_string(),
                reason: reason.as_str().to_string(),
            });
        }
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
            decisions: counters(&self.decisions, &DECISIONS, |d| DecisionLabels {
                queue: queue.to_string(),
                decision: d.to_string(),
            }),
            outcomes: counters(&self.outcomes, &OUTCOMES, |o| OutcomeLabels {
                queue: queue.to_string(),
                outcome: o.to_string(),
            }),
        }
    }
}

/// The counter of each of `labels` in `family`, under the label set
/// `label_set` makes of it.
fn counters<S: Clone + std::hash::Hash + Eq>(
    family: &Family<S, Counter>,
    labels: &[&'static str],
    label_set: impl Fn(&str) -> S,
) -> Vec<(&'static str, Counter)> {
    labels
        .iter()
        .map(|l| (*l, family.get_or_create(&label_set(l)).clone()))
        .collect()
}

/// What `/readyz` answers: 200 while the worker is ready, else 503 (see
/// [`Readiness`]: not consuming, or every settle failing for 30 s).
pub fn readiness(metrics: &Metrics) -> (u16, String) {
    let r = metrics.readiness();
    (r.http_status(), r.text())
}

impl Metrics {
    fn settles_now_ms(&self) -> u64 {
        self.settles.started.elapsed().as_millis() as u64
    }

    fn with_watch(&self, f: impl FnOnce(&mut SettleWatch, u64)) {
        let now = self.settles_now_ms();
        if let Ok(mut w) = self.settles.watch.lock() {
            f(&mut w, now);
        }
    }

    /// A settle went through (a copy confirmed then acked, an ack, a nack).
    pub fn settle_succeeded(&self) {
        self.with_watch(|w, _| w.succeeded());
        self.readiness();
    }

    /// A try to settle failed (a refused copy, an ack or nack that did not
    /// go through).
    pub fn settle_failed(&self) {
        self.with_watch(|w, now| w.failed(now));
        self.readiness();
    }

    /// The idempotency store stopped answering (kept from the first time).
    pub fn store_down(&self) {
        self.store_down_since(std::time::Duration::ZERO);
    }

    /// The idempotency store stopped answering `ago` (the start of the
    /// call that failed): readiness counts the outage from then.
    pub fn store_down_since(&self, ago: std::time::Duration) {
        let ago = u64::try_from(ago.as_millis()).unwrap_or(u64::MAX);
        let now = self.settles_now_ms().saturating_sub(ago);
        if let Ok(mut d) = self.store_down_since.lock() {
            d.get_or_insert(now);
        }
        self.readiness();
    }

    /// The idempotency store answers.
    pub fn store_up(&self) {
        if let Ok(mut d) = self.store_down_since.lock() {
            *d = None;
        }
        self.readiness();
    }

    /// A failed settle is tried again (see [`SettleWatch::retry_started`]).
    pub fn settle_retry_started(&self) {
        self.with_watch(|w, _| w.retry_started());
    }

    /// A settle tried again has ended.
    pub fn settle_retry_ended(&self) {
        self.with_watch(|w, _| w.retry_ended());
    }

    /// The worker's readiness now; sets `dlqctl_ready` to it and logs
    /// when settles start or stop failing for the stall.
    pub fn readiness(&self) -> Readiness {
        let now = self.settles_now_ms();
        let r = match self.settles.watch.lock() {
            Ok(w) => Readiness::of(self.consuming.get() > 0, &w, now),
            Err(_) => Readiness::of(self.consuming.get() > 0, &SettleWatch::default(), now),
        };
        let down = self.store_down_since.lock().map(|d| *d).unwrap_or(None);
        // An atomic, not the set's lock: readiness is taken at every settle.
        let unusable = self
            .any_probe_unusable
            .load(std::sync::atomic::Ordering::Relaxed);
        let r = r.with_store(down, now).with_probe_unusable(unusable);
        self.ready.set(i64::from(r.is_ready()));
        let stalled = matches!(r, Readiness::SettlesFailing { .. });
        if let Ok(mut logged) = self.settles.logged.lock() {
            if stalled && !*logged {
                *logged = true;
                warn!(stall_s = crate::core::retry::readiness::SETTLE_STALL_MS / 1000,
                    "not ready: every settle has failed for the stall (copies or acks refused); /readyz answers 503 until one goes through");
            } else if *logged && r.is_ready() {
                *logged = false;
                info!("ready again: a settle went through");
            }
        }
        r
    }
}

/// Test support: asserts that `m` renders each of `lines`.
#[cfg(test)]
pub(crate) fn assert_renders(m: &Metrics, lines: &[&str]) {
    let text = m.render();
    for line in lines {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_bounds_read_as_written() {
        let text = Metrics::new().render();
        let bounds: Vec<&str> = text
            .split("le=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        assert!(bounds.len() >= 28, "{text}");
        for b in &bounds {
            assert!(b.len() <= 8, "le=\"{b}\" in\n{text}");
        }
        for b in [
            "0.3", "2.7", "0.0025", "0.01563", "149.0", "159400.0", "+Inf",
        ] {
            assert!(bounds.contains(&b), "no le=\"{b}\" in {bounds:?}");
        }
    }

    #[test]
    fn ready_only_while_consuming_and_the_gauge_says_the_same() {
        let m = Metrics::new();
        assert_eq!(readiness(&m).0, 503);
        assert!(m.render().contains("dlqctl_ready 0"));
        m.set_consuming(true);
        assert_eq!(readiness(&m).0, 200);
        let text = m.render();
        assert!(text.contains("dlqctl_consuming 1"), "{text}");
        assert!(text.contains("dlqctl_ready 1"), "{text}");
        // Settles failing for less than the stall keep it ready (the rule
        // itself: core::retry::readiness).
        m.settle_retry_started();
        m.settle_failed();
        assert_eq!(readiness(&m).0, 200);
        m.settle_retry_ended();
        m.settle_succeeded();
        m.set_consuming(false);
        assert_eq!(readiness(&m).0, 503);
        assert!(m.render().contains("dlqctl_ready 0"));
    }

    #[test]
    fn renders_first_attempt_successes_dead_letters_by_reason_and_retry_delays() {
        let m = Metrics::new();
        let q = m.queue_counters("orders");
        q.first_attempt_success();
        q.dead_letter("exhausted");
        q.dead_letter("exhausted");
        q.dead_letter("too_large");
        q.retry_delay(10_000);
        assert_renders(
            &m,
            &[
                "dlqctl_first_attempt_successes_total{queue=\"orders\"} 1",
                "dlqctl_dead_letters_total{queue=\"orders\",reason=\"exhausted\"} 2",
                "dlqctl_dead_letters_total{queue=\"orders\",reason=\"too_large\"} 1",
                "dlqctl_retry_delay_seconds_sum 10.0",
                "dlqctl_retry_delay_seconds_count 1",
            ],
        );
    }

    #[test]
    fn renders_redrive_runs_moved_waiting_and_next_wait() {
        let m = Metrics::new();
        let mut r = RedriveRun {
            queue: "orders",
            result: RunResult::CanaryFailed,
            moved: 5,
            waiting_for_person: Some(2),
            next_wait_ms: 120_000,
        };
        m.record_redrive(&r);
        r.result = RunResult::Moved;
        r.moved = 45;
        r.waiting_for_person = None;
        r.next_wait_ms = 1500;
        m.record_redrive(&r);
        // A busy turn counts, and leaves the wait as it was.
        r.result = RunResult::Busy;
        r.moved = 0;
        r.next_wait_ms = 9_000;
        m.record_redrive(&r);
        assert_renders(
            &m,
            &[
                "dlqctl_redrive_runs_total{queue=\"orders\",result=\"canary_failed\"} 1",
                "dlqctl_redrive_runs_total{queue=\"orders\",result=\"moved\"} 1",
                "dlqctl_redrive_runs_total{queue=\"orders\",result=\"busy\"} 1",
                "dlqctl_redriven_messages_total{queue=\"orders\"} 50",
                "dlqctl_redrive_waiting_for_person{queue=\"orders\"} 2",
                "dlqctl_redrive_next_wait_seconds{queue=\"orders\"} 1.5",
            ],
        );
    }

    #[test]
    fn a_redrive_run_that_could_not_start_counts_as_failed() {
        let m = Metrics::new();
        m.record_redrive_failed("orders");
        m.record_redrive_failed("orders");
        assert_renders(
            &m,
            &["dlqctl_redrive_runs_total{queue=\"orders\",result=\"failed\"} 2"],
        );
    }

    #[test]
    fn renders_the_circuit_breakers_state_its_changes_and_since_when() {
        let m = Metrics::new();
        m.set_circuit("orders", Phase::Closed, 1000.0, false);
        assert_renders(
            &m,
            &[
                "dlqctl_circuit_state{queue=\"orders\"} 0",
                "dlqctl_circuit_open 0",
                "dlqctl_circuit_state_since_timestamp_seconds{queue=\"orders\"} 1000.0",
                "dlqctl_circuit_transitions_total{queue=\"orders\",to=\"open\"} 0",
                "dlqctl_circuit_transitions_total{queue=\"orders\",to=\"half_open\"} 0",
                "dlqctl_circuit_transitions_total{queue=\"orders\",to=\"closed\"} 0",
            ],
        );
        m.set_circuit("orders", Phase::Open, 1001.5, true);
        assert_renders(
            &m,
            &[
                "dlqctl_circuit_state{queue=\"orders\"} 1",
                "dlqctl_circuit_open 1",
                "dlqctl_circuit_state_since_timestamp_seconds{queue=\"orders\"} 1001.5",
                "dlqctl_circuit_transitions_total{queue=\"orders\",to=\"open\"} 1",
            ],
        );
        // Half-open still pauses consumption: circuit_open stays 1.
        m.set_circuit("orders", Phase::HalfOpen, 1016.5, true);
        assert_renders(
            &m,
            &[
                "dlqctl_circuit_state{queue=\"orders\"} 2",
                "dlqctl_circuit_open 1",
                "dlqctl_circuit_transitions_total{queue=\"orders\",to=\"half_open\"} 1",
            ],
        );
        m.set_circuit("orders", Phase::Closed, 1017.0, true);
        assert_renders(
            &m,
            &[
                "dlqctl_circuit_state{queue=\"orders\"} 0",
                "dlqctl_circuit_open 0",
                "dlqctl_circuit_transitions_total{queue=\"orders\",to=\"closed\"} 1",
                "dlqctl_circuit_transitions_total{queue=\"orders\",to=\"open\"} 1",
            ],
        );
    }

    /// Through an outage the breaker goes open, half-open, open again,
    /// many times: "since" stays the outage's start (when it left
    /// closed), not the last re-opening; once closed, it is when it closed.
    #[test]
    fn since_is_the_outages_start_through_every_re_opening() {
        let m = Metrics::new();
        let since = |v: &str| {
            format!("dlqctl_circuit_state_since_timestamp_seconds{{queue=\"orders\"}} {v}")
        };
        m.set_circuit("orders", Phase::Closed, 1000.0, false);
        m.set_circuit("orders", Phase::Open, 1001.5, true);
        for at in [1016.5, 1031.5, 1046.5] {
            m.set_circuit("orders", Phase::HalfOpen, at, true);
            assert_renders(&m, &[&since("1001.5")]);
            m.set_circuit("orders", Phase::Open, at + 0.5, true);
            assert_renders(&m, &[&since("1001.5")]);
        }
        m.set_circuit("orders", Phase::HalfOpen, 1061.5, true);
        m.set_circuit("orders", Phase::Closed, 1062.0, true);
        assert_renders(&m, &[&since("1062.0")]);
        m.set_circuit("orders", Phase::Open, 1100.0, true);
        assert_renders(&m, &[&since("1100.0")]);
    }

    #[test]
    fn each_method_counts_into_its_metric() {
        let m = Metrics::new();
        m.reconnected();
        m.consumer_timeout_conflict();
        m.publish_refused();
        m.publish_refused();
        m.handler_started();
        m.handler_started();
        m.handler_started();
        m.handler_finished(std::time::Duration::from_millis(2));
        m.handler_abandoned();
        m.record_redrive_failed("orders");
        m.guard_started("payments");
        m.guard_started("orders");
        for (n, event) in GuardEvent::ALL.into_iter().enumerate() {
            for _ in 0..=n {
                m.guard_event("orders", event);
            }
        }
        m.set_consuming(true);
        assert_renders(
            &m,
            &[
                "dlqctl_reconnects_total 1",
                "dlqctl_consumer_timeout_conflicts_total 1",
                "dlqctl_publish_refusals_total 2",
                "dlqctl_handlers_in_flight 1",
                "dlqctl_handler_duration_seconds_sum 0.002",
                "dlqctl_handler_duration_seconds_count 1",
                "dlqctl_redrive_runs_total{queue=\"orders\",result=\"failed\"} 1",
                "dlqctl_consuming 1",
                "dlqctl_duplicates_total{queue=\"orders\"} 1",
                "dlqctl_deferrals_total{queue=\"orders\"} 2",
                "dlqctl_idempotency_key_conflicts_total{queue=\"orders\"} 3",
                "dlqctl_idempotency_unkeyed_total{queue=\"orders\"} 4",
                "dlqctl_idempotency_store_pauses_total{queue=\"orders\"} 5",
                "dlqctl_idempotency_mark_failures_total{queue=\"orders\"} 6",
                // Made at 0 for a guarded pipeline before its first event.
                "dlqctl_duplicates_total{queue=\"payments\"} 0",
                "dlqctl_deferrals_total{queue=\"payments\"} 0",
                "dlqctl_idempotency_key_conflicts_total{queue=\"payments\"} 0",
                "dlqctl_idempotency_unkeyed_total{queue=\"payments\"} 0",
                "dlqctl_idempotency_store_pauses_total{queue=\"payments\"} 0",
                "dlqctl_idempotency_mark_failures_total{queue=\"payments\"} 0",
            ],
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
        assert_renders(
            &m,
            &[
                "dlqctl_decisions_total{queue=\"orders\",decision=\"retry\"} 2",
                "dlqctl_handlers_in_flight 0",
                "dlqctl_consuming 0",
                "dlqctl_handler_runs_total{queue=\"orders\",outcome=\"transient\"} 1",
            ],
        );
    }
}
