//! `dlqctl drill`.

use crate::cli::{DrillArgs, OutputFormat};
use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::ops::drill::DrillOptions;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Runs a drill; exit 3 naming the step that did not hold, 1 when the
/// broker could not be reached or a signal stopped it (after cleaning up).
pub async fn drill(a: &DrillArgs) -> Result<Outcome> {
    let t = dlqctl::load_topology(&a.file)?;
    let pipeline = dlqctl::load_pipeline(&a.file, &a.queue)?;
    let brokers = super::brokers(&a.connection)?;
    super::check_management_urls(&a.management_url)?;
    super::check_metrics_urls(a.metrics_url.as_slice())?;
    let (conn, at) = brokers
        .connect(&format!("dlqctl drill {}", a.queue))
        .await?;
    let url = brokers.get(at);
    let mgmt = brokers.management(&a.management_url, at).ok();
    let cancel = CancellationToken::new();
    super::spawn_signal_handler(
        cancel.clone(),
        "stopping the drill and removing its message",
    )?;
    let conn = Arc::new(conn);
    let opts = DrillOptions {
        timeout: a.timeout,
        metrics_url: a.metrics_url.clone(),
        cancel: cancel.clone(),
    };
    let result = dlqctl::ops::drill::drill(
        conn.clone(),
        &pipeline,
        mgmt.as_ref(),
        url.vhost(),
        url.user(),
        &opts,
    )
    .await;
    dlqctl::amqp::connection::close(&conn).await;
    let report = result?;
    let file = a.file.display().to_string();
    match a.format {
        OutputFormat::Text => output::stdout(&output::drill::drill_text(&report))?,
        OutputFormat::Json => output::stdout_line(&output::drill::drill_json(&report))?,
        OutputFormat::Github => {
            let line = t.pipeline(&a.queue).map(|p| p.line).unwrap_or(1);
            output::stdout(&output::drill::drill_github(&file, line, &report))?
        }
    }
    Ok(if cancel.is_cancelled() {
        Outcome::Failure
    } else if report.failed.is_some() {
        Outcome::Difference
    } else {
        Outcome::Success
    })
}
