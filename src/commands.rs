//! The work of each command; returns an exit outcome, prints through
//! `output`.

use crate::cli::ProvisionArgs;
use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::broker::BrokerUrl;
use dlqctl::core::topology::{parse_topology, plan, Topology};
use dlqctl::error::Error;
use dlqctl::mgmt::Management;
use std::path::Path;

/// Reads and validates a topology file.
pub fn load(path: &Path) -> Result<Topology, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })?;
    Ok(parse_topology(&text, &path.display().to_string())?)
}

/// `dlqctl validate`.
pub fn validate(file: &Path) -> Result<Outcome> {
    let t = load(file)?;
    let p = plan(&t);
    println!(
        "{}: valid, {} pipeline(s), {} exchanges, {} queues, {} bindings",
        file.display(),
        t.pipelines.len(),
        p.exchanges.len(),
        p.queues.len(),
        p.bindings.len()
    );
    Ok(Outcome::Success)
}

/// `dlqctl provision` (with --dry-run and --check).
pub async fn provision(a: &ProvisionArgs) -> Result<Outcome> {
    let t = load(&a.file)?;
    let p = plan(&t);
    if a.dry_run {
        if a.json {
            println!("{}", output::plan_json(&p));
        } else {
            print!("{}", output::plan_text(&p));
        }
        return Ok(Outcome::Success);
    }
    let url = BrokerUrl::parse(&a.connection.url)?;
    let name = if a.check {
        "dlqctl provision --check"
    } else {
        "dlqctl provision"
    };
    let conn = url.connect(name).await?;
    let parallelism = a.parallelism as usize;
    let result = if a.check {
        let mgmt_url = a
            .management_url
            .clone()
            .unwrap_or_else(|| url.default_management_url());
        let mgmt = Management::new(&mgmt_url, url.user(), url.password())?;
        dlqctl::provision::check(&conn, &p, Some(&mgmt), url.vhost(), parallelism).await
    } else {
        dlqctl::provision::provision(&conn, &p, parallelism).await
    };
    let _ = conn.close(200, "bye".into()).await;
    let report = result?;
    let differs = report.has_differences();
    let outcome = match (a.check, differs) {
        (_, false) => Outcome::Success,
        (true, true) => Outcome::Difference,
        (false, true) => Outcome::Failure,
    };
    if a.json {
        let status = match outcome {
            Outcome::Success => "ok",
            _ if a.check => "differs",
            _ => "drift",
        };
        println!("{}", output::report_json(&report, status));
    } else if a.check {
        if differs {
            println!(
                "{}: the broker differs from the topology ({} finding(s)):",
                a.file.display(),
                report.findings.iter().filter(|f| f.is_difference()).count()
            );
        } else {
            println!(
                "{}: the broker matches the topology ({} objects checked in {:.2}s)",
                a.file.display(),
                report.ok,
                report.elapsed.as_secs_f64()
            );
        }
        print!("{}", output::findings_text(&report.findings));
    } else if differs {
        eprintln!(
            "{}: {} object(s) declared; these differ from the topology and were left as they are:",
            a.file.display(),
            report.ok
        );
        eprint!("{}", output::findings_text(&report.findings));
        eprintln!("{}", output::DRIFT_HINT);
    } else {
        println!(
            "{}: provisioned {} exchanges, {} queues, {} bindings in {:.2}s",
            a.file.display(),
            p.exchanges.len(),
            p.queues.len(),
            p.bindings.len(),
            report.elapsed.as_secs_f64()
        );
    }
    Ok(outcome)
}
