//! `dlqctl dlq ...`: the DLQ operations.

use super::pipeline;
use crate::cli::{PeekArgs, SummaryArgs};
use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::amqp::connection::BrokerUrl;

/// The DLQ of pipeline `queue` in `file`.
fn dlq_of(file: &std::path::Path, queue: &str) -> Result<String> {
    Ok(pipeline(file, queue)?.dead_letter.queue)
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
