//! The work of each command; returns an exit outcome, prints through
//! `output`.

use crate::cli::{OutputFormat, ProvisionArgs};
use crate::exit::Outcome;
use crate::output;
use crate::output::annotations::{annotations, PipelineLines};
use anyhow::Result;
use dlqctl::core::topology::plan;
use dlqctl::load_topology;

/// `dlqctl provision` (with --dry-run and --check).
pub async fn provision(a: &ProvisionArgs) -> Result<Outcome> {
    let format = a.output_format()?;
    let t = load_topology(&a.file)?;
    let p = plan(&t);
    if a.dry_run {
        // A plan has no findings to annotate: `github` shows it as text.
        if format == OutputFormat::Json {
            output::stdout_line(&output::json::plan_json(&p))?;
        } else {
            output::stdout(&output::text::plan_text(&p))?;
        }
        return Ok(Outcome::Success);
    }
    let brokers = super::brokers(&a.connection)?;
    let name = if a.check {
        "dlqctl provision --check"
    } else {
        "dlqctl provision"
    };
    super::check_management_urls(&a.management_url)?;
    let (conn, at) = brokers.connect(name).await?;
    let url = brokers.get(at);
    let parallelism = a.parallelism as usize;
    let result = if a.check {
        match brokers.management(&a.management_url, at) {
            Ok(mgmt) => {
                dlqctl::ops::provision::check(&conn, &p, Some(&mgmt), url.vhost(), parallelism)
                    .await
            }
            Err(e) => Err(e),
        }
    } else {
        dlqctl::ops::provision::provision(&conn, &p, parallelism).await
    };
    dlqctl::amqp::connection::close(&conn).await;
    let report = result?;
    let differs = report.has_differences();
    let outcome = match (a.check, differs) {
        (_, false) => Outcome::Success,
        (true, true) => Outcome::Difference,
        (false, true) => Outcome::Failure,
    };
    let file = a.file.display().to_string();
    match format {
        OutputFormat::Json => {
            let status = match outcome {
                Outcome::Success => "ok",
                _ if a.check => "differs",
                _ => "drift",
            };
            output::stdout_line(&output::json::report_json(&report, status, !a.check))?;
        }
        OutputFormat::Github if a.check || differs => {
            let lines = PipelineLines::new(&t, &p);
            if a.check {
                output::stdout(&output::github::check_github(&file, &report, &lines))?;
            } else {
                // The annotations on stdout, the usual report and hint on
                // stderr.
                output::stdout(&annotations(&file, &report.findings, &lines))?;
                output::stderr_line(&output::text::drift_text(&file, &report));
            }
        }
        _ if a.check => output::stdout(&output::text::check_text(&file, &report))?,
        _ if differs => output::stderr_line(&output::text::drift_text(&file, &report)),
        _ => output::stdout_line(&output::text::provisioned_text(&file, &p, &report))?,
    }
    Ok(outcome)
}
