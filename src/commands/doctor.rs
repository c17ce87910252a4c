//! `dlqctl doctor`.

use crate::cli::{DoctorArgs, OutputFormat};
use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::core::audit::doctor::{worst, Level};
use dlqctl::core::topology::plan;
use dlqctl::load_topology;
use dlqctl::ops::doctor::DoctorOptions;
use std::time::Duration;

/// Runs the checklist; exit 3 on any fail, 1 when the broker could not be
/// asked.
pub async fn doctor(a: &DoctorArgs) -> Result<Outcome> {
    let t = load_topology(&a.file)?;
    if let Some(q) = &a.queue {
        // An unknown pipeline is bad usage, said as `work` says it.
        dlqctl::load_pipeline(&a.file, q)?;
    }
    let p = plan(&t);
    super::check_metrics_urls(a.metrics_url.as_slice())?;
    let (conn, url, mgmt) =
        super::connect_with_management(&a.connection, &a.management_url, "dlqctl doctor").await?;
    let opts = DoctorOptions {
        only: a.queue.clone(),
        handler_timeout: a.handler_timeout,
        metrics_url: a.metrics_url.clone(),
        max_dlq: a.max_dlq,
        sample_gap: a.sample_gap,
        policy_wait: Duration::from_secs(10),
        idempotency: (t.pipelines.iter())
            .filter_map(|p| Some((p.name.clone(), p.idempotency.clone()?)))
            .collect(),
    };
    let result =
        dlqctl::ops::doctor::doctor(&conn, &p, Some(&mgmt), url.vhost(), url.user(), &opts).await;
    dlqctl::amqp::connection::close(&conn).await;
    let checks = result?;
    let file = a.file.display().to_string();
    match a.format {
        OutputFormat::Text => output::stdout(&output::doctor::doctor_text(&file, &checks))?,
        OutputFormat::Json => output::stdout_line(&output::doctor::doctor_json(&checks))?,
        OutputFormat::Github => output::stdout(&output::doctor::doctor_github(&file, &t, &checks))?,
    }
    Ok(if worst(&checks) == Level::Fail {
        Outcome::Difference
    } else {
        Outcome::Success
    })
}
