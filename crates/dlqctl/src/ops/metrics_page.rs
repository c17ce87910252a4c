//! Reading a worker's `/metrics` page (`--metrics-url` of `doctor`,
//! `drill` and `status`): the page's text, the circuit breaker of each
//! pipeline on it ([`crate::core::audit::circuit`]), and its duplicates
//! skipped and deferrals ([`crate::core::audit::idempotency`]).

use crate::core::audit::circuit::{circuit_from_metrics, ready_from_metrics, CircuitReading};
use crate::core::audit::idempotency::{idempotency_from_metrics, IdempotencyCounts};
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A metrics page's URL as dlqctl prints it: neither the credentials nor
/// the query (a token) are shown.
pub fn shown(url: &str) -> String {
    crate::core::values::redact::endpoint(url)
}

/// GET a text page (5 s timeout); the error is a sentence.
pub async fn fetch_text(url: &str) -> std::result::Result<String, String> {
    let shown = shown(url);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("{shown}: {e}"))?;
    let resp = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("cannot read {shown}: {}", e.without_url()))?;
    if !resp.status().is_success() {
        return Err(format!("cannot read {shown}: HTTP {}", resp.status()));
    }
    resp.text()
        .await
        .map_err(|e| format!("cannot read {shown}: {}", e.without_url()))
}

/// What a worker's metrics page tells of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkerPage {
    /// The circuit breakers of the pipelines asked for, by pipeline (only
    /// those the page has a breaker for).
    pub circuits: HashMap<String, CircuitReading>,
    /// Whether the worker is ready (`dlqctl_ready`); `None` when the page
    /// does not say.
    pub ready: Option<bool>,
    /// The duplicates skipped and deferrals of the pipelines asked for, by
    /// pipeline (only those the page has the counters for: a pipeline
    /// with `idempotency`).
    pub idempotency: HashMap<String, IdempotencyCounts>,
}

/// Reads the worker's metrics page at `url` for `pipelines`; the error is
/// a sentence.
pub async fn worker_page<'a>(
    url: &str,
    pipelines: impl IntoIterator<Item = &'a str>,
) -> std::result::Result<WorkerPage, String> {
    let text = fetch_text(url).await?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let pipelines: Vec<&str> = pipelines.into_iter().collect();
    Ok(WorkerPage {
        circuits: (pipelines.iter())
            .filter_map(|p| circuit_from_metrics(&text, p, now).map(|c| (p.to_string(), c)))
            .collect(),
        ready: ready_from_metrics(&text),
        idempotency: (pipelines.iter())
            .filter_map(|p| idempotency_from_metrics(&text, p).map(|c| (p.to_string(), c)))
            .collect(),
    })
}

/// The circuit breakers of `pipelines` on the metrics page at `url`, by
/// pipeline (only those the page has a breaker for); the error is a
/// sentence.
pub async fn circuits<'a>(
    url: &str,
    pipelines: impl IntoIterator<Item = &'a str>,
) -> std::result::Result<HashMap<String, CircuitReading>, String> {
    worker_page(url, pipelines).await.map(|p| p.circuits)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_shown_url_has_no_credentials_nor_query() {
        assert_eq!(
            super::shown("http://u:secret@127.0.0.1:9100/metrics?token=abc#x"),
            "http://127.0.0.1:9100/metrics"
        );
    }
}
