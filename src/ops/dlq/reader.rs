//! Reading a DLQ under the rules every DLQ command keeps (README,
//! "Operating the DLQ"): the lock, the snapshot, messages kept in the DLQ
//! returned together (never one by one), a window of held messages with
//! rotation past it, acks with `multiple` where possible and settled
//! before the channel closes.

use crate::amqp::declare::passive_queue;
use crate::amqp::batch::BatchPublisher;
use crate::core::dlq::{describe, Described};
use crate::core::export::Record;
use crate::core::replay::{remaining_retention, rotation_copy};
use crate::core::retry::headers_to_json;
use crate::core::shortstr;
use crate::error::{Error, Result};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Messages held unacked at most, by default; past it kept messages are
/// rotated.
pub const DEFAULT_WINDOW: u32 = 10_000;

/// Copies in one batch (rotations, replays): published whole, then
/// confirmed whole ([`BatchPublisher`]).
pub(crate) const BATCH: usize = 1000;

/// How long to wait for the next delivery before taking the snapshot as
/// read (messages another client took meanwhile never come).
const NEXT_DELIVERY: Duration = Duration::from_secs(3);

/// How long acks are given to settle before the channel closes: on quorum
/// queues an ack followed at once by a close can be undone (README,
/// "Operating the DLQ").
const SETTLE: Duration = Duration::from_millis(300);

/// How long a copy may wait for its confirm.
pub(crate) const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// How a DLQ is read.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Messages held unacked at most ([`DEFAULT_WINDOW`]).
    pub window: u32,
    /// The DLQ's retention (`dead_letter.ttl`, ms), for rotated copies.
    pub retention_ms: Option<u64>,
    /// Wait for the lock instead of failing with "busy".
    pub wait: bool,
    /// Stop reading when cancelled (SIGINT, SIGTERM).
    pub cancel: CancellationToken,
    /// Read at most this many messages even when the DLQ holds more (the
    /// rest of a canary replay).
    pub at_most: Option<u64>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            window: DEFAULT_WINDOW,
            retention_ms: None,
            wait: false,
            cancel: CancellationToken::new(),
            at_most: None,
        }
    }
}

/// One message read from a DLQ.
#[derive(Debug, Clone)]
pub struct Message {
    /// Its delivery tag on the reading channel.
    pub tag: u64,
    /// The message, losslessly.
    pub record: Record,
    /// Its headers as JSON ([`headers_to_json`]).
    pub headers: serde_json::Value,
    /// What its headers say.
    pub described: Described,
    /// Its `message_id` as shown: the text, or `base64:…` when not UTF-8.
    pub message_id: Option<String>,
}

/// What the reader did, for the reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReadStats {
    /// The DLQ's ready messages when the command started.
    pub snapshot: u64,
    /// Messages read.
    pub read: u64,
    /// Messages acked (removed from the DLQ or moved).
    pub acked: u64,
    /// Kept messages rotated to the DLQ's tail (confirmed copy, then ack).
    pub rotated: u64,
    /// Kept messages held and returned together at the end.
    pub returned: u64,
    /// The run was cancelled (SIGINT, SIGTERM) before the snapshot was read.
    pub cancelled: bool,
}

/// A DLQ being read (see the module docs).
pub struct DlqReader {
    dlq: String,
    conn: Arc<Connection>,
    lock: Channel,
    ch: Option<(Channel, Consumer)>,
    rotator: Option<BatchPublisher>,
    /// Originals of the rotation copies of the current batch.
    rotating: Vec<u64>,
    user: String,
    opts: ReadOptions,
    stats: ReadStats,
    to_read: u64,
    held: u64,
    /// No message at or below this tag is unacked by us.
    floor: u64,
    /// Tags to ack, not yet sent.
    pending: BTreeSet<u64>,
    /// A kept message is held: acks can no longer be `multiple`.
    holding: bool,
    rotation_refused: Option<String>,
}

impl DlqReader {
    /// Takes the DLQ's lock, reads its depth (the snapshot) and starts
    /// reading. `user`: the connection's user (a foreign `user_id` is
    /// dropped from copies).
    pub async fn open(
        conn: Arc<Connection>,
        dlq: &str,
        user: &str,
        tag: &str,
        opts: ReadOptions,
    ) -> Result<Self> {
        let lock = take_lock(&conn, dlq, opts.wait, &opts.cancel).await?;
        let counts = passive_queue(&conn, dlq)
            .await?
            .ok_or_else(|| Error::Broker {
                context: format!("cannot read {dlq}"),
                message: "the queue does not exist; run `dlqctl provision` on the topology file"
                    .into(),
            })?;
        let snapshot = u64::from(counts.ready);
        let to_read = opts.at_most.map_or(snapshot, |m| m.min(snapshot));
        let mut reader = DlqReader {
            dlq: dlq.to_string(),
            conn: conn.clone(),
            lock,
            ch: None,
            rotator: None,
            rotating: Vec::new(),
            user: user.to_string(),
            opts,
            stats: ReadStats {
                snapshot,
                ..Default::default()
            },
            to_read,
            held: 0,
            floor: 0,
            pending: BTreeSet::new(),
            holding: false,
            rotation_refused: None,
        };
        if to_read > 0 {
            let ch = conn
                .create_channel()
                .await
                .map_err(|e| Error::broker("cannot open a channel", &e))?;
            // Room for the held window, the copies in flight and the acks
            // not yet sent: the broker never stops delivering because of us.
            let prefetch = (u64::from(reader.opts.window) + 2 * BATCH as u64)
                .min(to_read)
                .clamp(1, u64::from(u16::MAX)) as u16;
            ch.basic_qos(prefetch, BasicQosOptions { global: false })
                .await
                .map_err(|e| Error::broker("cannot set the prefetch", &e))?;
            let consumer = ch
                .basic_consume(
                    dlq.into(),
                    tag.into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| Error::broker(format!("cannot read {dlq}"), &e))?;
            reader.ch = Some((ch, consumer));
        }
        Ok(reader)
    }

    /// The DLQ.
    pub fn dlq(&self) -> &str {
        &self.dlq
    }

    /// The snapshot: the DLQ's ready messages at the start.
    pub fn snapshot(&self) -> u64 {
        self.stats.snapshot
    }

    /// Messages read so far.
    pub fn read(&self) -> u64 {
        self.stats.read
    }

    /// The next message of the snapshot; `None` when it is read, when no
    /// delivery comes for 3 s (others took the rest) or when cancelled.
    /// An error when a rotation copy was refused: nothing more is acked.
    pub async fn next(&mut self) -> Result<Option<Message>> {
        if self.pending.len() >= 256 {
            self.flush_acks().await?;
        }
        if self.stats.read >= self.to_read {
            return Ok(None);
        }
        let Some((_, consumer)) = self.ch.as_mut() else {
            return Ok(None);
        };
        let cancel = self.opts.cancel.clone();
        let next = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                self.stats.cancelled = true;
                return Ok(None);
            }
            n = tokio::time::timeout(NEXT_DELIVERY, consumer.next()) => n,
        };
        let d = match next {
            Err(_) | Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => return Err(Error::broker(format!("reading {}", self.dlq), &e)),
            Ok(Some(Ok(d))) => d,
        };
        self.stats.read += 1;
        let headers = headers_to_json(d.properties.headers().as_ref());
        let message_id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| shortstr::Shown::of(s.as_str()).for_log().into_owned());
        Ok(Some(Message {
            tag: d.delivery_tag,
            described: describe(&headers),
            headers,
            message_id,
            record: Record {
                queue: self.dlq.clone(),
                exchange: d.exchange.as_str().to_string(),
                routing_key: d.routing_key.as_str().to_string(),
                redelivered: d.redelivered,
                properties: d.properties,
                body: d.data,
            },
        }))
    }

    /// Removes a message from the DLQ (its ack is sent soon, with
    /// `multiple` where it can be).
    pub fn take(&mut self, tag: u64) {
        self.pending.insert(tag);
    }

    /// Keeps a message in the DLQ: held unacked while the window has room
    /// (it goes back, in order, with the others at the end), else rotated:
    /// a confirmed copy goes to the DLQ's tail with its remaining
    /// retention as `expiration`, then the original is acked.
    pub async fn keep(&mut self, m: Message, now_unix_ms: u64) -> Result<()> {
        if self.held < u64::from(self.opts.window) {
            self.held += 1;
            self.holding = true;
            return Ok(());
        }
        if let Some(why) = &self.rotation_refused {
            return Err(rotation_error(&self.dlq, why));
        }
        if self.rotator.is_none() {
            self.rotator = Some(BatchPublisher::open(&self.conn, CONFIRM_TIMEOUT).await?);
        }
        let at = m
            .described
            .dead_lettered_at
            .as_deref()
            .and_then(crate::core::text::parse_rfc3339_millis);
        let expiration = remaining_retention(self.opts.retention_ms, at, now_unix_ms);
        let props = rotation_copy(&m.record.properties, &self.user, expiration);
        let published = match self.rotator.as_mut() {
            Some(rotator) => rotator.publish("", &self.dlq, &m.record.body, props).await,
            None => Err("no publishing channel".to_string()),
        };
        self.rotating.push(m.tag);
        if let Err(why) = published {
            self.rotation_refused = Some(why);
        }
        if self.rotating.len() >= BATCH || self.rotation_refused.is_some() {
            self.settle_rotations().await?;
        }
        Ok(())
    }

    /// Hands a message back as kept without rotating it (a copy of it was
    /// refused and the command stops).
    pub fn hold(&mut self, _tag: u64) {
        self.held += 1;
        self.holding = true;
    }

    /// Confirms the rotation batch; its originals are then acked. A
    /// refusal stops the command: nothing more is acked.
    async fn settle_rotations(&mut self) -> Result<()> {
        if self.rotating.is_empty() {
            return match &self.rotation_refused {
                Some(why) => Err(rotation_error(&self.dlq, why)),
                None => Ok(()),
            };
        }
        let verdict = match self.rotator.as_mut() {
            Some(r) => r.settle().await,
            None => Err("no publishing channel".to_string()),
        };
        let tags = std::mem::take(&mut self.rotating);
        match (verdict, &self.rotation_refused) {
            (Ok(()), None) => {
                self.stats.rotated += tags.len() as u64;
                self.pending.extend(tags);
                Ok(())
            }
            (verdict, _) => {
                if let Err(why) = verdict {
                    self.rotation_refused.get_or_insert(why);
                }
                // Their originals stay unacked and go back at the end; the
                // copies that were confirmed are duplicates, never losses.
                self.held += tags.len() as u64;
                self.holding = true;
                Err(rotation_error(
                    &self.dlq,
                    self.rotation_refused.as_deref().unwrap_or("refused"),
                ))
            }
        }
    }

    /// Sends the pending acks: one `multiple` ack for the run that follows
    /// the floor while no kept message is held, else one by one.
    pub async fn flush_acks(&mut self) -> Result<()> {
        let Some((ch, _)) = self.ch.as_ref() else {
            return Ok(());
        };
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut sends: Vec<(u64, bool)> = Vec::new();
        if !self.holding {
            let mut top = self.floor;
            while self.pending.remove(&(top + 1)) {
                top += 1;
            }
            if top > self.floor {
                sends.push((top, true));
                self.stats.acked += top - self.floor;
                self.floor = top;
            }
        } else {
            for tag in std::mem::take(&mut self.pending) {
                sends.push((tag, false));
                self.stats.acked += 1;
            }
        }
        for (tag, multiple) in sends {
            ch.basic_ack(tag, BasicAckOptions { multiple })
                .await
                .map_err(|e| Error::broker(format!("cannot ack on {}", self.dlq), &e))?;
        }
        Ok(())
    }

    /// Ends the read: waits for the rotations in flight, sends every
    /// pending ack, returns the held messages together
    /// (`nack(multiple, requeue)`), lets it all settle, closes the channel
    /// and releases the lock.
    pub async fn finish(mut self) -> Result<ReadStats> {
        let _ = self.settle_rotations().await;
        if let Some(r) = self.rotator.take() {
            r.close().await;
        }
        let refused = self.rotation_refused.clone();
        // Out-of-order leftovers of a multiple run go one by one.
        if !self.pending.is_empty() {
            let holding = std::mem::replace(&mut self.holding, true);
            self.flush_acks().await?;
            self.holding = holding;
        }
        if let Some((ch, _)) = self.ch.take() {
            self.stats.returned = self.stats.read.saturating_sub(self.stats.acked);
            if self.stats.returned > 0 {
                let _ = ch
                    .basic_nack(
                        0,
                        BasicNackOptions {
                            multiple: true,
                            requeue: true,
                        },
                    )
                    .await;
            }
            // A round trip, then time for the queue to apply it all.
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                ch.basic_qos(1, BasicQosOptions { global: false }),
            )
            .await;
            if self.stats.acked > 0 {
                tokio::time::sleep(SETTLE).await;
            }
            let _ =
                tokio::time::timeout(Duration::from_secs(5), ch.close(200, "done".into())).await;
        }
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.lock.queue_delete(
                lock_name(&self.dlq).as_str().into(),
                QueueDeleteOptions::default(),
            ),
        )
        .await;
        let _ =
            tokio::time::timeout(Duration::from_secs(5), self.lock.close(200, "done".into())).await;
        match refused {
            Some(why) => Err(rotation_error(&self.dlq, &why)),
            None => Ok(self.stats),
        }
    }
}

fn rotation_error(dlq: &str, why: &str) -> Error {
    Error::Broker {
        context: format!("stopped: {dlq} refused a rotated copy of a kept message"),
        message: format!(
            "{why}; nothing more was acked and every message is still in {dlq} (a bounded DLQ \
             needs room for the copies in flight; see README, \"Operating the DLQ\")"
        ),
    }
}

/// The name of a DLQ's lock queue.
pub fn lock_name(dlq: &str) -> String {
    format!("dlqctl.lock.{dlq}")
}

/// Takes the DLQ's lock: an exclusive queue declared on a channel kept
/// open while the command runs. With `wait`, tries again every second
/// until it is free or the command is cancelled.
pub(crate) async fn take_lock(
    conn: &Connection,
    dlq: &str,
    wait: bool,
    cancel: &CancellationToken,
) -> Result<Channel> {
    loop {
        match try_lock(conn, dlq).await {
            Err(Busy(e)) if wait => {
                tokio::select! {
                    _ = cancel.cancelled() => return Err(e),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            Err(Busy(e)) => return Err(e),
            Ok(r) => return r,
        }
    }
}

/// A refusal because another command holds the lock.
struct Busy(Error);

async fn try_lock(conn: &Connection, dlq: &str) -> std::result::Result<Result<Channel>, Busy> {
    let name = lock_name(dlq);
    let ch = match conn.create_channel().await {
        Ok(ch) => ch,
        Err(e) => return Ok(Err(Error::broker("cannot open a channel", &e))),
    };
    let declared = ch
        .queue_declare(
            name.as_str().into(),
            lapin::options::QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    match declared {
        Ok(_) => Ok(Ok(ch)),
        Err(e) if crate::amqp::connection::amqp_reply(&e).map(|(c, _)| c) == Some(405) => {
            Err(Busy(Error::Broker {
                context: format!("{dlq} is busy"),
                message: format!(
                    "another dlqctl DLQ command holds its lock (queue {name}, exclusive to the \
                     holder's connection, which the management UI names); try again when it is \
                     done, or pass --wait"
                ),
            }))
        }
        Err(e) => Ok(Err(Error::broker(
            format!("cannot take the lock {name}"),
            &e,
        ))),
    }
}
