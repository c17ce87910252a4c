//! `dlqctl dlq ...`: the DLQ operations.

use super::load;
use crate::cli::PeekArgs;
use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use dlqctl::amqp::connection::BrokerUrl;
use dlqctl::error::Error;

/// `dlqctl dlq peek`: shows messages from the head of the DLQ, leaving
/// every one of them in place.
pub async fn peek(a: &PeekArgs) -> Result<Outcome> {
    let topology = load(&a.file)?;
    let Some(pipeline) = topology.pipeline(&a.queue) else {
        let names: Vec<_> = topology.pipelines.iter().map(|p| p.name.as_str()).collect();
        return Err(Error::Usage(format!(
            "queue `{}` is not a pipeline of {} (pipelines: {})",
            a.queue,
            a.file.display(),
            names.join(", ")
        ))
        .into());
    };
    let url = BrokerUrl::parse(&a.connection.url)?;
    let conn = url.connect("dlqctl dlq peek").await?;
    let result = dlqctl::ops::dlq::peek(&conn, &pipeline.dead_letter.queue, a.limit).await;
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
