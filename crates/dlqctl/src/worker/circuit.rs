//! The worker's side of the circuit breaker ([`crate::core::retry::breaker`],
//! pure): its clock, the health probe it asks instead of a message when
//! the pipeline has one (`dead_letter.redrive.health.http`), and the log
//! line and metrics of every change of state (docs/worker.md, "The
//! circuit breaker").

use crate::core::retry::breaker::{Breaker, Call, Gate, Phase, Probe, Transition};
use crate::core::topology::Pipeline;
use crate::worker::metrics::Metrics;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use tracing::{error, info, warn};

/// A pipeline's breaker as the worker runs it.
pub(super) struct Circuit {
    breaker: Mutex<Breaker>,
    /// Woken when a probe comes back or is given back.
    pub(super) changed: Notify,
    queue: String,
    open_for_ms: u64,
    /// The pipeline's health URL, asked instead of a message.
    health: Option<String>,
    /// Why no request can be built from `health`, when none can: a
    /// configuration error, never taken for the dependency's answer.
    unusable: Option<String>,
    metrics: Arc<Metrics>,
    started: Instant,
}

/// A probe's place, given back when dropped unless its result was
/// recorded: a drill message, a message past its attempts and a run the
/// lost connection interrupted free it for the next message.
pub(super) struct ProbeTicket {
    circuit: Arc<Circuit>,
    probe: Option<Probe>,
}

impl Drop for ProbeTicket {
    fn drop(&mut self) {
        if let Some(p) = self.probe.take() {
            if let Ok(mut b) = self.circuit.breaker.lock() {
                b.release(p);
            }
            self.circuit.changed.notify_waiters();
        }
    }
}

/// What the gate does next.
pub(super) enum Step {
    /// Start the next handler (as the probe, with its ticket).
    Pass(Option<ProbeTicket>),
    /// Ask the health URL with this ticket, then look again.
    Health(ProbeTicket),
    /// Look again after this many ms, or when a probe comes back (`None`).
    Wait(Option<u64>),
}

/// `url` as a log may show it: without user info, query and fragment
/// when it parses, with its password redacted otherwise.
fn shown(url: &str) -> String {
    reqwest::Url::parse(url)
        .map(|u| crate::handler::http::redacted(&u))
        .unwrap_or_else(|_| crate::core::idempotency::redact_url(url))
}

fn now_unix_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Circuit {
    /// The breaker of `p`, when it has one; shown closed in `metrics`.
    pub(super) fn of(p: &Pipeline, metrics: &Arc<Metrics>) -> Option<Arc<Circuit>> {
        let cfg = p.circuit_breaker.clone()?;
        metrics.set_circuit(&p.name, Phase::Closed, now_unix_s(), false);
        let health = p
            .dead_letter
            .redrive
            .as_ref()
            .and_then(|r| r.health.clone());
        let unusable = health.as_deref().and_then(|u| crate::urls::http(u).err());
        metrics.set_probe_unusable(&p.name, unusable.is_some());
        if let (Some(why), Some(url)) = (&unusable, &health) {
            error!(queue = %p.name, url = %shown(url), why = %why,
                "configuration error: the circuit breaker's health URL is one no request can be built from; once open, the breaker cannot close: fix dead_letter.redrive.health.http (the worker is not ready)");
        }
        Some(Arc::new(Circuit {
            unusable,
            open_for_ms: cfg.open_for,
            breaker: Mutex::new(Breaker::new(cfg)),
            changed: Notify::new(),
            queue: p.name.clone(),
            health,
            metrics: metrics.clone(),
            started: Instant::now(),
        }))
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// One look at the gate. `take`: a message is in hand, so a half-open
    /// breaker's probe place is taken for it (with a health URL the place
    /// is always taken, for the URL).
    pub(super) fn step(self: &Arc<Self>, take: bool) -> Step {
        let admission = match self.breaker.lock() {
            Ok(mut b) if take || self.health.is_some() => b.admit(self.now_ms()),
            Ok(mut b) => b.poll(self.now_ms()),
            Err(_) => return Step::Pass(None),
        };
        if let Some(t) = admission.changed {
            self.report(t, None);
        }
        match admission.gate {
            Gate::Run => Step::Pass(None),
            Gate::Wait(ms) => Step::Wait(ms),
            Gate::Probe(p) => {
                let ticket = ProbeTicket {
                    circuit: self.clone(),
                    probe: Some(p),
                };
                if self.health.is_some() {
                    Step::Health(ticket)
                } else {
                    Step::Pass(Some(ticket))
                }
            }
        }
    }

    /// Resolves when an open breaker's `open_for` is over (waiting for it
    /// to open first): a worker with no message to take still moves it to
    /// half-open on time, and asks the health URL.
    pub(super) async fn open_over(&self) {
        loop {
            // Made before the look: an opening after it still wakes us.
            let changed = self.changed.notified();
            let left = self
                .breaker
                .lock()
                .ok()
                .and_then(|b| b.open_left(self.now_ms()));
            match left {
                Some(ms) => {
                    return tokio::time::sleep(std::time::Duration::from_millis(ms.max(1))).await
                }
                None => changed.await,
            }
        }
    }

    /// Asks the health URL with `ticket`'s place: 2xx closes the breaker,
    /// anything else opens it again for `open_for`.
    pub(super) async fn check_health(&self, mut ticket: ProbeTicket) {
        let Some(url) = &self.health else {
            return;
        };
        let shown = shown(url);
        let (healthy, answer) = match &self.unusable {
            // Nothing is sent: the breaker stays open, and the reason is
            // the configuration, not the dependency.
            Some(why) => {
                error!(queue = %self.queue, url = %shown, why = %why,
                    "configuration error: no request can be built from the circuit breaker's health URL; the breaker stays open: fix dead_letter.redrive.health.http");
                (
                    false,
                    format!(
                        "nothing: configuration error, no request can be built from it ({why})"
                    ),
                )
            }
            None => {
                let (healthy, answer) = crate::ops::health::probe(url).await;
                info!(queue = %self.queue, url = %shown, answer = %answer, healthy, "circuit breaker health probe");
                (healthy, answer)
            }
        };
        let Some(p) = ticket.probe.take() else {
            return;
        };
        let changed = self
            .breaker
            .lock()
            .ok()
            .and_then(|mut b| b.record_health(self.now_ms(), p, healthy));
        if let Some(t) = changed {
            self.report(
                t,
                Some(format!("the health probe {shown} answered {answer}")),
            );
        }
        self.changed.notify_waiters();
    }

    /// Records a handler run's result, with its ticket when it was the
    /// probe.
    pub(super) fn record(&self, ticket: Option<ProbeTicket>, call: Call) {
        let probe = ticket.and_then(|mut t| t.probe.take());
        let was_probe = probe.is_some();
        let changed = self
            .breaker
            .lock()
            .ok()
            .and_then(|mut b| b.record(self.now_ms(), probe, call));
        if let Some(t) = changed {
            self.report(t, Some("the probe message failed transiently".to_string()));
        }
        // Only a probe's result frees the gate; other runs (every message
        // while closed) need not wake it.
        if was_probe || changed.is_some() {
            self.changed.notify_waiters();
        }
    }

    /// Logs a change of state and shows it in the metrics.
    fn report(&self, t: Transition, why: Option<String>) {
        let q = &self.queue;
        let to = t.to();
        self.metrics.set_circuit(q, to, now_unix_s(), true);
        let circuit = to.label();
        let open_for_ms = self.open_for_ms;
        match t {
            Transition::Opened { calls, failures } => {
                warn!(queue = %q, circuit, calls, failures, open_for_ms,
                "circuit breaker open: pausing consumption")
            }
            Transition::Reopened => warn!(queue = %q, circuit, why = why.as_deref(), open_for_ms,
                "circuit breaker open again: the probe failed; pausing consumption"),
            Transition::HalfOpened => info!(queue = %q, circuit,
                probe = if self.health.is_some() { "the health URL" } else { "one message" },
                "circuit breaker half-open: probing the dependency"),
            Transition::Closed => info!(queue = %q, circuit,
                "circuit breaker closed: resuming consumption"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::metrics::{assert_renders, readiness};

    /// A pipeline with a breaker that opens at its first transient failure
    /// (1 ms open), and `health` as its health URL, parsed by the core
    /// alone (as a service embedding the worker may): its URLs are not
    /// checked by the clients' parsers.
    fn pipeline(health: &str) -> Pipeline {
        let yaml = format!(
            "version: 1\npipelines:\n  - name: cfg\n    circuit_breaker: {{min_calls: 1, \
             open_for: 1ms, window: 1s}}\n    dead_letter:\n      redrive:\n        \
             health: {{http: '{health}'}}\n"
        );
        crate::core::topology::parse_topology(&yaml, "t.yaml")
            .expect("valid for the core")
            .pipelines
            .remove(0)
    }

    /// A health URL no request can be built from is a configuration
    /// error from the start: not ready, said by the metrics (which
    /// `status` and `doctor` read); and once the breaker is open, asking
    /// it sends nothing and says why, instead of an answer of the
    /// dependency.
    #[tokio::test]
    async fn a_health_url_no_request_can_be_built_from_is_a_configuration_error() {
        let m = Arc::new(Metrics::new());
        m.set_consuming(true);
        let c = Circuit::of(&pipeline("http://[::1/x"), &m).expect("a breaker");
        let (code, text) = readiness(&m);
        assert_eq!(code, 503, "{text}");
        assert!(text.contains("configuration error"), "{text}");
        assert_renders(&m, &["dlqctl_circuit_probe_unusable{queue=\"cfg\"} 1"]);
        // Open it, wait out its open_for, and ask the health URL.
        c.record(None, Call::Transient);
        c.open_over().await;
        let Step::Health(ticket) = c.step(false) else {
            panic!("the health URL is asked when half-open");
        };
        c.check_health(ticket).await;
        assert_renders(&m, &["dlqctl_circuit_state{queue=\"cfg\"} 1"]);
        assert_eq!(readiness(&m).0, 503);
    }

    #[tokio::test]
    async fn a_usable_health_url_is_no_configuration_error() {
        let m = Arc::new(Metrics::new());
        m.set_consuming(true);
        let _c = Circuit::of(&pipeline("http://127.0.0.1:9/health"), &m).expect("a breaker");
        assert_eq!(readiness(&m).0, 200);
        assert_renders(&m, &["dlqctl_circuit_probe_unusable{queue=\"cfg\"} 0"]);
    }
}
