//! A worker's circuit breaker as its `/metrics` page shows it
//! (`dlqctl_circuit_state{queue}` and
//! `dlqctl_circuit_state_since_timestamp_seconds{queue}`), for `doctor`,
//! `drill` and `status`, which read the page of `--metrics-url`. Pure: the
//! shell fetches the page and gives the time it read it.

use crate::retry::breaker::Phase;
use crate::values::duration::tier_name;
use crate::values::text::rfc3339_millis;

/// The gauge of the breaker's state (0 closed, 1 open, 2 half-open).
pub(crate) const CIRCUIT_STATE_METRIC: &str = "dlqctl_circuit_state";
/// The gauge of when it took that state, in Unix seconds (open and
/// half-open: when it left closed).
pub(crate) const CIRCUIT_SINCE_METRIC: &str = "dlqctl_circuit_state_since_timestamp_seconds";
/// The gauge saying its health URL is one no request can be built from.
pub(crate) const CIRCUIT_PROBE_UNUSABLE_METRIC: &str = "dlqctl_circuit_probe_unusable";

/// One pipeline's breaker, as read from a worker's metrics page.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CircuitReading {
    /// `closed`, `open` or `half_open`.
    pub state: Phase,
    /// When it took that state (RFC 3339), when the page says: while open
    /// or half-open, when it left closed (the outage's start, kept through
    /// every re-opening).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// How long it had been in that state when the page was read, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub for_ms: Option<u64>,
    /// Its health URL is one no request can be built from: a
    /// configuration error (the breaker cannot close once open).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub probe_unusable: bool,
}

impl CircuitReading {
    /// Open or half-open: the worker starts no handler but a probe.
    pub fn paused(&self) -> bool {
        self.state != Phase::Closed
    }

    /// `open since 2026-12-07T09:10:00.000Z (for 45s)`; the state alone
    /// when the page did not say since when.
    pub fn describe(&self) -> String {
        let state = match self.state {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half-open",
        };
        match (&self.since, self.for_ms) {
            (Some(since), Some(ms)) if ms < 1000 => {
                format!("{state} since {since} (for less than 1s)")
            }
            (Some(since), Some(ms)) => {
                format!(
                    "{state} since {since} (for {})",
                    tier_name(ms / 1000 * 1000)
                )
            }
            (Some(since), None) => format!("{state} since {since}"),
            _ => state.to_string(),
        }
    }

    /// What a paused breaker means for the pipeline's messages, in a
    /// sentence starting with "the circuit breaker is ..."; `None` when
    /// it is closed.
    /// A health URL no request can be built from is said whatever the
    /// state, as the configuration error it is.
    pub fn pause_sentence(&self, queue: &str) -> Option<String> {
        if self.probe_unusable {
            return Some(format!(
                "configuration error: the circuit breaker's health URL is one no request can \
                 be built from, so once open the breaker cannot close and messages wait in \
                 {queue}; it is the URL, not the dependency (the worker's log names it and \
                 why): fix dead_letter.redrive.health.http; the breaker is {}",
                self.describe()
            ));
        }
        let doing = match self.state {
            Phase::Closed => return None,
            Phase::Open => "it pauses consumption after too many transient failures",
            Phase::HalfOpen => "it is probing the dependency and starts no other handler",
        };
        Some(format!(
            "the circuit breaker is {}: {doing}, so messages wait in {queue} until it closes; \
             the dependency the handler calls is failing (the worker's log says `circuit \
             breaker open`)",
            self.describe()
        ))
    }
}

/// The value of `metric` labelled `queue="PIPELINE"` on a metrics page.
pub(crate) fn sample(text: &str, metric: &str, pipeline: &str) -> Option<f64> {
    let label = format!(
        "queue=\"{}\"",
        pipeline.replace('\\', "\\\\").replace('"', "\\\"")
    );
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(metric)?.strip_prefix('{')?;
        let (labels, value) = rest.split_once('}')?;
        if !labels.split(',').any(|l| l.trim() == label) {
            return None;
        }
        let v: f64 = value.split_whitespace().next()?.parse().ok()?;
        v.is_finite().then_some(v)
    })
}

/// The worker's readiness gauge (1 ready, 0 not: what `/readyz` answers).
pub(crate) const READY_METRIC: &str = "dlqctl_ready";

/// Whether the worker whose metrics page is `text` is ready (`dlqctl_ready`,
/// a gauge without labels: one worker, one page); `None` when the page
/// has no such gauge (a worker older than this dlqctl).
pub fn ready_from_metrics(text: &str) -> Option<bool> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(READY_METRIC)?.strip_prefix(' ')?;
        let v: f64 = value.split_whitespace().next()?.parse().ok()?;
        v.is_finite().then_some(v >= 1.0)
    })
}

/// `pipeline`'s breaker on a worker's metrics page `text`, read at
/// `now_unix_ms`; `None` when the page has no breaker for it (no
/// `circuit_breaker` in the topology, or a worker older than this dlqctl).
pub fn circuit_from_metrics(
    text: &str,
    pipeline: &str,
    now_unix_ms: u64,
) -> Option<CircuitReading> {
    let state = Phase::from_gauge(sample(text, CIRCUIT_STATE_METRIC, pipeline)?)?;
    let since_ms = sample(text, CIRCUIT_SINCE_METRIC, pipeline)
        .filter(|s| *s > 0.0)
        .map(|s| (s * 1000.0).round() as u64);
    Some(CircuitReading {
        state,
        since: since_ms.map(rfc3339_millis),
        for_ms: since_ms.map(|s| now_unix_ms.saturating_sub(s)),
        probe_unusable: sample(text, CIRCUIT_PROBE_UNUSABLE_METRIC, pipeline)
            .is_some_and(|v| v >= 1.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# HELP dlqctl_circuit_state The circuit breaker's state: 0 closed, 1 open, 2 half-open.
# TYPE dlqctl_circuit_state gauge
dlqctl_circuit_state{queue=\"orders\"} 1
dlqctl_circuit_state{queue=\"payments\"} 2
dlqctl_circuit_state{queue=\"refunds\"} 0
dlqctl_circuit_state{queue=\"odd\"} 7
dlqctl_circuit_state_since_timestamp_seconds{queue=\"orders\"} 1765098600.5
dlqctl_circuit_state_since_timestamp_seconds{queue=\"refunds\"} 0.0
dlqctl_circuit_open 1
";
    const NOW: u64 = 1_765_098_645_900;

    #[test]
    fn reads_the_workers_readiness() {
        assert_eq!(ready_from_metrics("dlqctl_ready 1\n"), Some(true));
        assert_eq!(
            ready_from_metrics("# TYPE dlqctl_ready gauge\ndlqctl_ready 0\n"),
            Some(false)
        );
        assert_eq!(ready_from_metrics(PAGE), None);
        assert_eq!(
            ready_from_metrics("dlqctl_ready_x 1\ndlqctl_ready nan\n"),
            None
        );
    }

    #[test]
    fn reads_each_pipelines_state_and_since_when() {
        let orders = circuit_from_metrics(PAGE, "orders", NOW).unwrap();
        assert_eq!(
            orders,
            CircuitReading {
                state: Phase::Open,
                since: Some("2025-12-07T09:10:00.500Z".into()),
                for_ms: Some(45_400),
                probe_unusable: false,
            }
        );
        assert!(orders.paused());
        assert_eq!(
            orders.describe(),
            "open since 2025-12-07T09:10:00.500Z (for 45s)"
        );
        let just = circuit_from_metrics(PAGE, "orders", 1_765_098_600_900).unwrap();
        assert_eq!(
            just.describe(),
            "open since 2025-12-07T09:10:00.500Z (for less than 1s)"
        );
        // No since sample, or 0: the state alone.
        let payments = circuit_from_metrics(PAGE, "payments", NOW).unwrap();
        assert_eq!(payments.state, Phase::HalfOpen);
        assert_eq!(payments.describe(), "half-open");
        let refunds = circuit_from_metrics(PAGE, "refunds", NOW).unwrap();
        assert_eq!(refunds.describe(), "closed");
        assert!(!refunds.paused());
        assert_eq!(refunds.pause_sentence("refunds"), None);
    }

    #[test]
    fn no_breaker_on_the_page_or_a_value_it_cannot_read_is_none() {
        assert_eq!(circuit_from_metrics(PAGE, "other", NOW), None);
        assert_eq!(circuit_from_metrics(PAGE, "odd", NOW), None);
        assert_eq!(circuit_from_metrics(PAGE, "order", NOW), None);
        assert_eq!(circuit_from_metrics("", "orders", NOW), None);
        assert_eq!(
            circuit_from_metrics("dlqctl_circuit_state{queue=\"a\"} NaN", "a", NOW),
            None
        );
        // The unlabelled gauge of an older worker is not a pipeline's.
        assert_eq!(
            circuit_from_metrics("dlqctl_circuit_open 1", "orders", NOW),
            None
        );
    }

    #[test]
    fn a_quote_in_a_name_is_matched_escaped() {
        let page = "dlqctl_circuit_state{queue=\"a\\\"b\"} 1\n";
        assert_eq!(
            circuit_from_metrics(page, "a\"b", NOW).map(|c| c.state),
            Some(Phase::Open)
        );
    }

    #[test]
    fn a_paused_breaker_says_what_it_means_for_the_messages() {
        let open = circuit_from_metrics(PAGE, "orders", NOW).unwrap();
        let s = open.pause_sentence("orders").unwrap();
        assert!(
            s.starts_with("the circuit breaker is open since 2025-12-07T09:10:00.500Z (for 45s): it pauses consumption"),
            "{s}"
        );
        assert!(s.contains("messages wait in orders until it closes"), "{s}");
        let half = circuit_from_metrics(PAGE, "payments", NOW).unwrap();
        let s = half.pause_sentence("payments").unwrap();
        assert!(
            s.starts_with("the circuit breaker is half-open: it is probing the dependency"),
            "{s}"
        );
    }

    /// A health URL no request can be built from is said as the
    /// configuration error it is, open or closed, never as the dependency
    /// failing.
    #[test]
    fn a_health_url_no_request_can_be_built_from_is_said_as_a_configuration_error() {
        for state in [0, 1, 2] {
            let page = format!(
                "dlqctl_circuit_state{{queue=\"orders\"}} {state}\n\
                 dlqctl_circuit_probe_unusable{{queue=\"orders\"}} 1\n"
            );
            let c = circuit_from_metrics(&page, "orders", NOW).unwrap();
            let s = c.pause_sentence("orders").expect("said even when closed");
            assert!(s.contains("configuration error"), "{s}");
            assert!(s.contains("dead_letter.redrive.health.http"), "{s}");
            assert!(
                !s.contains("the dependency the handler calls is failing"),
                "{s}"
            );
        }
        let page = "dlqctl_circuit_state{queue=\"orders\"} 1\n\
                    dlqctl_circuit_probe_unusable{queue=\"orders\"} 0\n";
        let s = circuit_from_metrics(page, "orders", NOW)
            .unwrap()
            .pause_sentence("orders")
            .unwrap();
        assert!(!s.contains("configuration error"), "{s}");
    }

    #[test]
    fn it_serializes_as_state_since_and_for_ms() {
        let open = circuit_from_metrics(PAGE, "orders", NOW).unwrap();
        assert_eq!(
            serde_json::to_value(&open).unwrap(),
            serde_json::json!({"state": "open", "since": "2025-12-07T09:10:00.500Z", "for_ms": 45_400})
        );
        let half = circuit_from_metrics(PAGE, "payments", NOW).unwrap();
        assert_eq!(
            serde_json::to_value(&half).unwrap(),
            serde_json::json!({"state": "half_open"})
        );
    }
}
