//! `dlqctl status`.

use crate::cli::StatusArgs;
use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::core::topology::plan;
use dlqctl::load_topology;

/// Reads every queue of the file; exit 3 on a missing object, a DLQ over
/// `--max-dlq`, or a policy that overrides what the topology asked for.
pub async fn status(a: &StatusArgs) -> Result<Outcome> {
    let t = load_topology(&a.file)?;
    let p = plan(&t);
    super::check_metrics_urls(&a.metrics_url)?;
    let (conn, url, mgmt) =
        super::connect_with_management(&a.connection, &a.management_url, "dlqctl status").await?;
    let result = dlqctl::ops::status::status(&conn, &p, Some(&mgmt), url.vhost()).await;
    dlqctl::amqp::connection::close(&conn).await;
    let mut report = result?;
    for url in &a.metrics_url {
        report.read_circuits(url).await;
    }
    let missing = report.missing();
    let over = a.max_dlq.map(|n| report.dlqs_over(n)).unwrap_or_default();
    let outcome = if missing.is_empty() && over.is_empty() && report.policy_overrides.is_empty() {
        Outcome::Success
    } else {
        Outcome::Difference
    };
    if a.json {
        output::stdout_line(&output::json::status_json(
            &report, &missing, a.max_dlq, &over,
        ))?;
    } else {
        output::stdout(&output::text::status_text(
            &report, &missing, a.max_dlq, &over,
        ))?;
    }
    Ok(outcome)
}
