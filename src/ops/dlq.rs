//! The DLQ operations (`dlq peek` so far): library code that returns typed
//! reports and never prints.
//!
//! Rules kept here (README, "Operating the DLQ"):
//! - **One command at a time per DLQ.** Each first declares an exclusive
//!   queue `dlqctl.lock.<DLQ>` (it holds no message and nothing routes to
//!   it): a second command is refused by the broker (405 RESOURCE_LOCKED)
//!   and reported as busy. The broker deletes the lock when the holder's
//!   connection ends, even by SIGKILL. (An exclusive *consumer* is no lock:
//!   RabbitMQ 3.10 lets a second one onto a quorum queue.)
//! - **The snapshot.** The DLQ's ready depth at the start is read first and
//!   at most that many messages are read.
//! - **Nothing requeued one by one.** What is read stays unacked and goes
//!   back together when the channel closes, so the order is kept and
//!   nothing is lost, whatever happens to the process.

use crate::amqp::declare::passive_queue;
use crate::core::dlq::{describe, Described};
use crate::core::retry::headers_to_json;
use crate::core::shortstr;
use crate::error::{Error, Result};
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::Connection;
use std::time::Duration;

/// The most messages one peek holds unacked at once.
pub const MAX_PEEK: u16 = 10_000;

/// How long to wait for the next delivery before taking the snapshot as
/// read (messages another client took meanwhile never come).
const NEXT_DELIVERY: Duration = Duration::from_secs(3);

/// One message read from a DLQ.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PeekedMessage {
    /// `message_id` (`None`: absent; see `message_id_base64`).
    pub message_id: Option<String>,
    /// A `message_id` that is not UTF-8, as base64 of its bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id_base64: Option<String>,
    /// What the headers say.
    #[serde(flatten)]
    pub described: Described,
    /// Every header, as JSON.
    pub headers: serde_json::Value,
    /// The body's length in bytes.
    pub body_bytes: usize,
    /// The body, when it is UTF-8.
    pub body_utf8: Option<String>,
    /// The body, base64.
    pub body_base64: String,
}

/// What a peek read.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PeekReport {
    /// The DLQ.
    pub queue: String,
    /// Its ready messages when the peek started.
    pub snapshot: u64,
    /// The messages read, from the head.
    pub messages: Vec<PeekedMessage>,
}

/// Reads up to `limit` messages from the head of `dlq` and leaves them all
/// in place (in order).
pub async fn peek(conn: &Connection, dlq: &str, limit: u16) -> Result<PeekReport> {
    let mut messages = Vec::new();
    let snapshot = read_head(conn, dlq, limit, "dlqctl dlq peek", |m| messages.push(m)).await?;
    Ok(PeekReport {
        queue: dlq.to_string(),
        snapshot,
        messages,
    })
}

/// What `dlq summary` found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SummaryReport {
    /// The DLQ.
    pub queue: String,
    /// Its ready messages at the start.
    pub snapshot: u64,
    /// Messages read and grouped (at most [`MAX_PEEK`]: past it, the
    /// summary covers the head of the DLQ only, and says so).
    pub read: u64,
    /// The groups, largest first.
    pub groups: Vec<crate::core::dlq::Group>,
}

/// Groups the head of `dlq` (up to [`MAX_PEEK`] messages) by reason and
/// error fingerprint, leaving every message in place.
pub async fn summary(conn: &Connection, dlq: &str) -> Result<SummaryReport> {
    let mut grouper = crate::core::dlq::Grouper::default();
    let mut read = 0u64;
    let snapshot = read_head(conn, dlq, MAX_PEEK, "dlqctl dlq summary", |m| {
        read += 1;
        grouper.add(&m.described, m.message_id.as_deref());
    })
    .await?;
    Ok(SummaryReport {
        queue: dlq.to_string(),
        snapshot,
        read,
        groups: grouper.finish(),
    })
}

/// Takes the lock, reads at most `min(limit, snapshot)` messages from the
/// head, hands each to `each`, then closes the channel so that they all go
/// back together. Returns the snapshot.
async fn read_head(
    conn: &Connection,
    dlq: &str,
    limit: u16,
    tag: &str,
    mut each: impl FnMut(PeekedMessage),
) -> Result<u64> {
    let counts = passive_queue(conn, dlq)
        .await?
        .ok_or_else(|| Error::Broker {
            context: format!("cannot read {dlq}"),
            message: "the queue does not exist; run `dlqctl provision` on the topology file".into(),
        })?;
    let snapshot = u64::from(counts.ready);
    let wanted = u64::from(limit.min(MAX_PEEK)).min(snapshot) as u16;
    let _lock = lock(conn, dlq).await?;
    if wanted == 0 {
        return Ok(snapshot);
    }
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| Error::broker("cannot open a channel", &e))?;
    ch.basic_qos(wanted, BasicQosOptions { global: false })
        .await
        .map_err(|e| Error::broker("cannot set the prefetch", &e))?;
    let mut consumer = ch
        .basic_consume(
            dlq.into(),
            tag.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| Error::broker(format!("cannot read {dlq}"), &e))?;
    let mut n = 0u16;
    while n < wanted {
        let next = tokio::time::timeout(NEXT_DELIVERY, consumer.next()).await;
        let Ok(Some(Ok(d))) = next else { break };
        n += 1;
        let id = d.properties.message_id().as_ref().map(|s| s.as_str());
        let headers = headers_to_json(d.properties.headers().as_ref());
        each(PeekedMessage {
            message_id: id.and_then(shortstr::utf8).map(|s| s.into_owned()),
            message_id_base64: id
                .and_then(shortstr::non_utf8_bytes)
                .map(|b| shortstr::base64(&b)),
            described: describe(&headers),
            headers,
            body_bytes: d.data.len(),
            body_utf8: std::str::from_utf8(&d.data).ok().map(str::to_string),
            body_base64: shortstr::base64(&d.data),
        });
    }
    // Closing the channel returns every unacked delivery at once, in order.
    let _ = tokio::time::timeout(Duration::from_secs(5), ch.close(200, "read".into())).await;
    Ok(snapshot)
}

/// The name of a DLQ's lock queue.
pub fn lock_name(dlq: &str) -> String {
    format!("dlqctl.lock.{dlq}")
}

/// Takes the DLQ's lock: an exclusive, auto-delete queue declared on a
/// channel kept open while the command runs (see the module docs).
async fn lock(conn: &Connection, dlq: &str) -> Result<lapin::Channel> {
    let name = lock_name(dlq);
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| Error::broker("cannot open a channel", &e))?;
    let declared = ch
        .queue_declare(
            name.as_str().into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    match declared {
        Ok(_) => Ok(ch),
        Err(e) if crate::amqp::connection::amqp_reply(&e).map(|(c, _)| c) == Some(405) => {
            Err(Error::Broker {
                context: format!("{dlq} is busy"),
                message: format!(
                    "another dlqctl DLQ command holds its lock (queue {name}, exclusive to the \
                     holder's connection); try again when it is done"
                ),
            })
        }
        Err(e) => Err(Error::broker(format!("cannot take the lock {name}"), &e)),
    }
}
