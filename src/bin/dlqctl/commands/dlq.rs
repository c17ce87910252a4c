//! `dlqctl dlq ...`: the DLQ operations.

use super::load;
use crate::cli::{PeekArgs, SummaryArgs};
use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::amqp::connection::BrokerUrl;
use dlqctl::error::Error;

/// The DLQ of pipeline `queue` in `file`.
fn dlq_of(file: &std::path::Path, queue: &str) -> Result<String> {
    let topology = load(file)?;
    let Some(pipeline) = topology.pipeline(queue) else {
        let names: Vec<_> = topology.pipelines.iter().map(|p| p.name.as_str()).collect();
        return Err(Error::Usage(format!(
            "queue `{queue}` is not a pipeline of {} (pipelines: {})",
            file.display(),
            names.join(", ")
        ))
        .into());
    };
    Ok(pipeline.dead_letter.queue.clone())
}

/// `dlqctl dlq summary`: groups the DLQ by reason and error fingerprint.
pub async fn summary(a: &SummaryArgs) -> Result<Outcome> {
    let dlq = dlq_of(&a.file, &a.queue)?;
    let url = BrokerUrl::parse(&a.connection.url)?;
    let conn = url.connect("dlqctl dlq summary").await?;
    let result = dlqctl::ops::dlq::summary(&conn, &dlq).await;
    dlqctl::amqp::connection::close(&conn).await;
    let report = result?;
    if a.json {
        output::stdout_line(&serde_json::to_string_pretty(&report).unwrap_or_default())?;
    } else {
        output::stdout(&output::text::summary_text(&report))?;
    }
    Ok(Outcome::Success)
}

/// `dlqctl dlq peek`: shows messages from the head of the DLQ, leaving
/// every one of them in place.
pub async fn peek(a: &PeekArgs) -> Result<Outcome> {
    let dlq = dlq_of(&a.file, &a.queue)?;
    let url = BrokerUrl::parse(&a.connection.url)?;
    let conn = url.connect("dlqctl dlq peek").await?;
    let result = dlqctl::ops::dlq::peek(&conn, &dlq, a.limit).await;
    dlqctl::amqp::connection::close(&conn).await;
    let report = result?;
    if a.json {
        output::stdout_line(&serde_json::to_string_pretty(&report).unwrap_or_default())?;
    } else {
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
            .unwrap_or(100);
        output::stdout(&output::text::peek_text(&report, width))?;
    }
    Ok(Outcome::Success)
}
