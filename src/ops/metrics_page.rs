//! Reading a worker's `/metrics` page (`--metrics-url` of `doctor`,
//! `drill` and `status`): the page's text, and the circuit breaker of each
//! pipeline on it ([`crate::core::check::circuit`]).

use crate::core::check::circuit::{circuit_from_metrics, CircuitReading};
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// GET a text page (5 s timeout); the error is a sentence.
pub async fn fetch_text(url: &str) -> std::result::Result<String, String> {
    let shown = crate::amqp::connection::redact(url);
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

/// The circuit breakers of `pipelines` on the metrics page at `url`, by
/// pipeline (only those the page has a breaker for); the error is a
/// sentence.
pub async fn circuits<'a>(
    url: &str,
    pipelines: impl IntoIterator<Item = &'a str>,
) -> std::result::Result<HashMap<String, CircuitReading>, String> {
    let text = fetch_text(url).await?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Ok(pipelines
        .into_iter()
        .filter_map(|p| circuit_from_metrics(&text, p, now).map(|c| (p.to_string(), c)))
        .collect())
}
