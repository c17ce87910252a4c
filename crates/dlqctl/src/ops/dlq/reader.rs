//! Reading a DLQ under the rules every DLQ command keeps (docs/dlq.md,
//! "The rules every DLQ command keeps"): the lock, the snapshot, messages kept in the DLQ
//! returned together (never one by one), a window of held messages with
//! rotation past it, acks with `multiple` where possible and settled
//! before the channel closes.

use crate::amqp::batch::{BatchPipeline, Settled};
use crate::amqp::declare::passive_queue;
use crate::core::dlq::describe::{describe, Described};
use crate::core::dlq::export::Record;
use crate::core::dlq::replay::{remaining_retention, rotation_copy};
use crate::core::retry::confirm::Refusal;
use crate::core::retry::headers_to_json;
use crate::core::values::shortstr;
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
/// confirmed whole ([`crate::amqp::batch::BatchPublisher`]).
pub(crate) const BATCH: usize = 250;
/// Publishing channels, each with a batch in flight.
pub(crate) const LANES: usize = 4;

/// Copies in flight at most (published, their originals not yet acked):
/// every lane's batch. A `kill -9` can leave at most this many duplicates
/// (a message both copied and still in the DLQ) per publisher, like the
/// broker's own shovel with its 1,000 unacked.
pub const MAX_IN_FLIGHT: usize = LANES * BATCH;

/// Messages the broker may send beyond the held window: the copies in
/// flight (every lane's batch and a partial one), unread deliveries and
/// acks not yet sent. RabbitMQ applies a prefetch to a consumer when it
/// starts, so this is fixed for the run.
const AHEAD: u64 = ((LANES + 1) * BATCH + 1000) as u64;

/// How long to wait for the next delivery before taking the snapshot as
/// read (messages another client took meanwhile never come).
const NEXT_DELIVERY: Duration = Duration::from_secs(3);

/// How long acks are given to settle before the channel closes when some
/// were sent one by one: on quorum queues an ack followed at once by a
/// close can be undone (docs/dlq.md, "No duplicates behind a finished
/// run"; docs/rabbitmq-facts.md, "Acks just before a close": 50 ms
/// sufficed there). A run whose acks were all `multiple` closes after the
/// round trip alone: measured, no message came back in 20 replays of
/// 50,000 and 16 of 3,000 on 3.10.8 and 4.3.6 without any pause, and the
/// pause was about 15 % of a 50,000-message replay.
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
    /// Read each message's headers into [`Message::headers`] and
    /// [`Message::described`] (off: both empty, for a replay without
    /// selectors, which needs neither).
    pub describe: bool,
    /// Take the snapshot only once the DLQ's depth holds still (see
    /// `settled_depth`), so messages a dead command gives back count.
    /// Off for `dlqctl drill`, whose looks seek its own message only and
    /// must be quick to keep its deadline.
    pub settle: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            window: DEFAULT_WINDOW,
            retention_ms: None,
            wait: false,
            cancel: CancellationToken::new(),
            at_most: None,
            describe: true,
            settle: true,
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

impl Message {
    /// A message read as `tag`, with its headers read when `describe`
    /// (else [`Message::headers`] is null and [`Message::described`]
    /// empty: for a run without selectors, which reads neither).
    pub fn new(tag: u64, record: Record, describe: bool) -> Message {
        let headers = if describe {
            headers_to_json(record.properties.headers().as_ref())
        } else {
            serde_json::Value::Null
        };
        Message {
            tag,
            described: if describe {
                self::describe(&headers)
            } else {
                Described::default()
            },
            message_id: record
                .properties
                .message_id()
                .as_ref()
                .map(|s| shortstr::Shown::of(s.as_str()).for_log().into_owned()),
            headers,
            record,
        }
    }
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

/// Tags of the second reading channel carry this bit (a channel's
/// delivery tags never come near it).
const SECOND: u64 = 1 << 62;

/// A channel the reader consumes on, with its own acks.
struct ReadLane {
    ch: Channel,
    /// `None` once its stream has ended (cancelled and drained).
    consumer: Option<Consumer>,
    /// No message at or below this tag is unacked by us.
    floor: u64,
    /// Tags to ack, not yet sent.
    pending: BTreeSet<u64>,
    /// A kept message is held on it: its acks can no longer be `multiple`.
    holding: bool,
    /// Its prefetch.
    prefetch: u64,
    /// Messages held on it.
    held: u64,
    /// Some ack was sent without `multiple`: the close waits [`SETTLE`].
    single_acks: bool,
}

impl ReadLane {
    async fn open(conn: &Connection, dlq: &str, tag: &str, prefetch: u16) -> Result<Self> {
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| Error::broker("cannot open a channel", &e))?;
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
        Ok(ReadLane {
            ch,
            consumer: Some(consumer),
            floor: 0,
            pending: BTreeSet::new(),
            holding: false,
            prefetch: u64::from(prefetch),
            held: 0,
            single_acks: false,
        })
    }

    /// Sends the pending acks: one `multiple` ack for the run that follows
    /// the floor while nothing is held, else one by one (all sent, then
    /// awaited). Returns how many messages they ack.
    async fn flush(&mut self, dlq: &str, all: bool) -> Result<u64> {
        if self.pending.is_empty() {
            return Ok(0);
        }
        let mut sends: Vec<(u64, bool)> = Vec::new();
        let mut acked = 0;
        if !self.holding {
            let mut top = self.floor;
            while self.pending.remove(&(top + 1)) {
                top += 1;
            }
            if top > self.floor {
                sends.push((top, true));
                acked += top - self.floor;
                self.floor = top;
            }
        }
        if self.holding || all {
            for tag in std::mem::take(&mut self.pending) {
                sends.push((tag, false));
                acked += 1;
            }
        }
        self.single_acks |= sends.iter().any(|&(_, multiple)| !multiple);
        let ch = &self.ch;
        let acks = sends
            .into_iter()
            .map(|(tag, multiple)| ch.basic_ack(tag, BasicAckOptions { multiple }));
        for r in futures_util::future::join_all(acks).await {
            r.map_err(|e| Error::broker(format!("cannot ack on {dlq}"), &e))?;
        }
        Ok(acked)
    }

    /// Returns every unacked delivery together, then a round trip.
    async fn give_back(&mut self, any: bool) {
        if any {
            let _ = self
                .ch
                .basic_nack(
                    0,
                    BasicNackOptions {
                        multiple: true,
                        requeue: true,
                    },
                )
                .await;
        }
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.ch.basic_qos(1, BasicQosOptions { global: false }),
        )
        .await;
    }

    async fn close(self) {
        let _ =
            tokio::time::timeout(Duration::from_secs(5), self.ch.close(200, "done".into())).await;
    }
}

/// A DLQ being read (see the module docs).
///
/// It reads on one channel until the window is full of held messages.
/// Then it cancels that consumer (the held messages stay unacked on it),
/// reads what that channel had been sent already, and goes on on a second
/// channel, where nothing is held: each kept message there is rotated,
/// and every ack is `multiple`.
pub struct DlqReader {
    dlq: String,
    conn: Arc<Connection>,
    lock: Channel,
    tag: String,
    /// The first reading channel, then the second.
    lanes: Vec<ReadLane>,
    /// The lane being read.
    reading: usize,
    rotator: Option<BatchPipeline<u64>>,
    user: String,
    opts: ReadOptions,
    stats: ReadStats,
    to_read: u64,
    held: u64,
    rotation_refused: Option<Refusal>,
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
        let snapshot = settled_depth(&conn, dlq, opts.settle).await?;
        let to_read = opts.at_most.map_or(snapshot, |m| m.min(snapshot));
        let mut reader = DlqReader {
            dlq: dlq.to_string(),
            conn: conn.clone(),
            lock,
            tag: tag.to_string(),
            lanes: Vec::new(),
            reading: 0,
            rotator: None,
            user: user.to_string(),
            opts,
            stats: ReadStats {
                snapshot,
                ..Default::default()
            },
            to_read,
            held: 0,
            rotation_refused: None,
        };
        if to_read > 0 {
            // Exactly the window: once it is full of held messages, the
            // broker sends this channel nothing more, and reading goes on on
            // a second one. No basic.cancel is needed, so nothing already
            // sent to the first channel is left unread.
            let prefetch = u64::from(reader.opts.window)
                .min(to_read)
                .clamp(1, u64::from(u16::MAX)) as u16;
            reader
                .lanes
                .push(ReadLane::open(&conn, dlq, tag, prefetch).await?);
        }
        Ok(reader)
    }

    /// The batch size for copies (rotations, replays): every lane's batch
    /// and a partial one fit in what the reading channel may still be
    /// sent, so a batch can always fill.
    pub fn batch_size(&self) -> usize {
        (self.free_slots() as usize / (LANES + 1)).clamp(1, BATCH)
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

    /// The lane and raw tag of a tag handed out.
    fn split(tag: u64) -> (usize, u64) {
        if tag & SECOND != 0 {
            (1, tag & !SECOND)
        } else {
            (0, tag)
        }
    }

    /// The next message of the snapshot; `None` when it is read, when no
    /// delivery comes for 3 s (others took the rest) or when cancelled.
    /// An error when a rotation copy was refused: nothing more is acked.
    pub async fn next(&mut self) -> Result<Option<Message>> {
        // Checked first: deliveries already buffered would otherwise be
        // read to the end of the snapshot before a signal is seen.
        if self.opts.cancel.is_cancelled() {
            self.stats.cancelled = true;
            return Ok(None);
        }
        if self.lanes.iter().any(|l| l.pending.len() >= 256) {
            self.flush_acks().await?;
        }
        if self.stats.read >= self.to_read {
            return Ok(None);
        }
        let rotating = self.rotator.as_ref().map_or(0, |r| r.unsettled()) as u64;
        if rotating > 0 && rotating + 1 > self.free_slots() {
            self.settle_rotations().await?;
            self.flush_acks().await?;
        }
        let i = self.reading;
        if self.lanes.get(i).is_none_or(|l| l.consumer.is_none()) {
            return Ok(None);
        }
        // Acks not yet sent hold prefetch slots: send them before waiting.
        let ready = self.lanes[i]
            .consumer
            .as_mut()
            .and_then(|c| futures_util::FutureExt::now_or_never(c.next()));
        let next = match ready {
            Some(n) => Ok(n),
            None => {
                self.flush_acks().await?;
                let cancel = self.opts.cancel.clone();
                let Some(consumer) = self.lanes[i].consumer.as_mut() else {
                    return Ok(None);
                };
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => {
                        self.stats.cancelled = true;
                        return Ok(None);
                    }
                    n = tokio::time::timeout(NEXT_DELIVERY, consumer.next()) => n,
                }
            }
        };
        {
            let d = match next {
                Err(_) | Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(Error::broker(format!("reading {}", self.dlq), &e)),
                Ok(Some(Ok(d))) => d,
            };
            self.stats.read += 1;
            let tag = if i == 1 {
                d.delivery_tag | SECOND
            } else {
                d.delivery_tag
            };
            let record = Record {
                queue: self.dlq.clone(),
                exchange: d.exchange.as_str().to_string(),
                routing_key: d.routing_key.as_str().to_string(),
                redelivered: d.redelivered,
                properties: d.properties,
                body: d.data,
            };
            Ok(Some(Message::new(tag, record, self.opts.describe)))
        }
    }

    /// Removes a message from the DLQ (its ack is sent soon, with
    /// `multiple` where it can be).
    pub fn take(&mut self, tag: u64) {
        let (i, raw) = Self::split(tag);
        if let Some(l) = self.lanes.get_mut(i) {
            l.pending.insert(raw);
        }
    }

    /// Keeps a message in the DLQ: held unacked while the window has room
    /// (it goes back, in order, with the others at the end), else rotated:
    /// a confirmed copy goes to the DLQ's tail with its remaining
    /// retention as `expiration`, then the original is acked.
    pub async fn keep(&mut self, m: Message, now_unix_ms: u64) -> Result<()> {
        if self.reading == 0 && self.held < u64::from(self.opts.window) {
            self.hold(m.tag);
            if self.held == u64::from(self.opts.window) && self.stats.read < self.to_read {
                self.second_lane().await?;
            }
            return Ok(());
        }
        if let Some(why) = &self.rotation_refused {
            return Err(rotation_error(&self.dlq, why));
        }
        if self.rotator.is_none() {
            self.rotator =
                Some(BatchPipeline::open(&self.conn, LANES, BATCH, CONFIRM_TIMEOUT).await?);
        }
        let read_now;
        let described = if self.opts.describe {
            &m.described
        } else {
            read_now = describe(&headers_to_json(m.record.properties.headers().as_ref()));
            &read_now
        };
        let at = described
            .dead_lettered_at
            .as_deref()
            .and_then(crate::core::values::text::parse_rfc3339_millis);
        let expiration = remaining_retention(self.opts.retention_ms, at, now_unix_ms);
        let props = rotation_copy(&m.record.properties, &self.user, expiration);
        let done = match self.rotator.as_mut() {
            Some(rotator) => {
                rotator
                    .publish("", &self.dlq, &m.record.body, props, m.tag)
                    .await
            }
            None => vec![(
                vec![m.tag],
                Err(Refusal::Channel("no publishing channel".into())),
            )],
        };
        let finished = !done.is_empty();
        self.rotated(done)?;
        if finished {
            // The originals of a confirmed batch are acked at once: what a
            // kill leaves duplicated stays within the copies in flight.
            self.flush_acks().await?;
        }
        Ok(())
    }

    /// The window is full of held messages: the first channel is sent
    /// nothing more, and a second one reads the rest.
    async fn second_lane(&mut self) -> Result<()> {
        self.flush_acks().await?;
        let left = self.to_read.saturating_sub(self.stats.read);
        let prefetch = AHEAD.min(left).clamp(1, u64::from(u16::MAX)) as u16;
        let lane = ReadLane::open(&self.conn, &self.dlq, &self.tag, prefetch).await?;
        self.lanes.push(lane);
        self.reading = 1;
        Ok(())
    }

    /// Leaves a message unacked, to go back with the others at the end
    /// (kept within the window, or whose copy was refused).
    pub fn hold(&mut self, tag: u64) {
        self.held += 1;
        let (i, _) = Self::split(tag);
        if let Some(l) = self.lanes.get_mut(i) {
            l.holding = true;
            l.held += 1;
        }
    }

    /// Deliveries the reading channel may still be sent, besides what the
    /// caller has in flight: its prefetch less what is held on it and the
    /// acks not yet sent. A caller with more copies in flight than this
    /// settles them before reading on, or the read would wait for nothing.
    pub fn free_slots(&self) -> u64 {
        self.lanes.get(self.reading).map_or(0, |l| {
            l.prefetch
                .saturating_sub(l.held)
                .saturating_sub(l.pending.len() as u64)
        })
    }

    /// Takes finished rotation batches: their originals are acked, unless
    /// a copy was refused: then nothing more is acked and the command
    /// stops (confirmed copies become duplicates, never losses).
    fn rotated(&mut self, done: Vec<Settled<u64>>) -> Result<()> {
        for (tags, verdict) in done {
            match (verdict, &self.rotation_refused) {
                (Ok(()), None) => {
                    self.stats.rotated += tags.len() as u64;
                    for tag in tags {
                        self.take(tag);
                    }
                }
                (verdict, _) => {
                    if let Err(why) = verdict {
                        self.rotation_refused.get_or_insert(why);
                    }
                    for tag in tags {
                        self.hold(tag);
                    }
                }
            }
        }
        match &self.rotation_refused {
            Some(why) => Err(rotation_error(&self.dlq, why)),
            None => Ok(()),
        }
    }

    /// Waits for every rotation batch.
    async fn settle_rotations(&mut self) -> Result<()> {
        let done = match self.rotator.as_mut() {
            Some(r) => r.drain().await,
            None => Vec::new(),
        };
        self.rotated(done)
    }

    /// Sends the pending acks of every lane.
    pub async fn flush_acks(&mut self) -> Result<()> {
        for l in &mut self.lanes {
            self.stats.acked += l.flush(&self.dlq, false).await?;
        }
        Ok(())
    }

    /// Ends a read that came to `outcome`: the reader is finished
    /// ([`DlqReader::finish`]) whatever `outcome` says, then the read's
    /// error wins over the finish's.
    pub async fn finish_after(self, outcome: Result<()>) -> Result<ReadStats> {
        let stats = self.finish().await;
        outcome?;
        stats
    }

    /// Ends the read: waits for the rotations in flight, sends every
    /// pending ack, returns the held messages together
    /// (`nack(multiple, requeue)`), lets it all settle, closes the channels
    /// and releases the lock.
    pub async fn finish(mut self) -> Result<ReadStats> {
        let _ = self.settle_rotations().await;
        if let Some(r) = self.rotator.take() {
            r.close().await;
        }
        let refused = self.rotation_refused.clone();
        for l in &mut self.lanes {
            // Out-of-order leftovers of a multiple run go one by one.
            self.stats.acked += l.flush(&self.dlq, true).await?;
        }
        self.stats.returned = self.stats.read.saturating_sub(self.stats.acked);
        tracing::debug!(stats = ?self.stats, lanes = self.lanes.len(), "DLQ read done");
        let mut lanes = std::mem::take(&mut self.lanes);
        for l in &mut lanes {
            l.give_back(self.stats.returned > 0).await;
        }
        if lanes.iter().any(|l| l.single_acks) {
            tokio::time::sleep(SETTLE).await;
        }
        for l in lanes {
            l.close().await;
        }
        let expected = self
            .stats
            .snapshot
            .saturating_sub(self.stats.acked)
            .saturating_add(self.stats.rotated);
        wait_for_returns(self.conn.clone(), self.dlq.clone(), expected).await;
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

/// Holds the lock until the DLQ shows as ready again every message this
/// read gave back, at most [`RETURN_SETTLE`]. The broker applies a
/// requeue (and the requeue of what it had sent but was not read yet)
/// on its own time, through its log for a quorum queue: until it has,
/// those messages are neither ready nor unacked to anyone, and a
/// command that took the lock at once would leave them out of its
/// snapshot (`dlqctl serve` starts a job the moment a page's read
/// ends). Expected: the snapshot, less what was acked, plus the
/// rotated copies; more (new dead letters) is fine. (A free function
/// of owned values: the reader is not `Sync`, and `dlqctl serve` runs
/// reads on spawned tasks.)
async fn wait_for_returns(conn: Arc<Connection>, dlq: String, expected: u64) {
    let start = std::time::Instant::now();
    loop {
        match crate::amqp::declare::passive_queue(&conn, &dlq).await {
            Ok(Some(c)) if u64::from(c.ready) >= expected => return,
            Ok(Some(c)) if start.elapsed() >= RETURN_SETTLE => {
                tracing::debug!(
                    ready = c.ready,
                    expected,
                    "{dlq}: messages given back are not all ready yet (another consumer, \
                     or expiry)"
                );
                return;
            }
            Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
            _ => return,
        }
    }
}

/// How often, and how many times in a row, the DLQ's depth must read the
/// same before it is taken as the snapshot, and how long that may take at
/// most (a DLQ that keeps growing, from new dead letters, is taken as it
/// is then).
const SNAPSHOT_POLL: Duration = Duration::from_millis(50);
const SNAPSHOT_SAME: u32 = 4;
const SNAPSHOT_SETTLE: Duration = Duration::from_millis(500);

/// The DLQ's ready depth once it holds still: read until it reads the
/// same [`SNAPSHOT_SAME`] times [`SNAPSHOT_POLL`] apart, at most
/// [`SNAPSHOT_SETTLE`]. A command that died holding a window unacked
/// (SIGKILL, a closed pipe) has its lock deleted by the broker at once,
/// but its messages come back to a quorum DLQ through the queue's log
/// some milliseconds later (measured on 3.10.8 after a `kill -9` of a
/// `summary` holding 10,000 of 20,000: the depth read 8,000 for 10 to 35
/// ms, then 20,000): a snapshot taken at once left them out, and a
/// `purge --yes` right after left them in the DLQ.
async fn settled_depth(conn: &Connection, dlq: &str, settle: bool) -> Result<u64> {
    let read = || async {
        passive_queue(conn, dlq)
            .await?
            .map(|c| u64::from(c.ready))
            .ok_or_else(|| Error::Broker {
                context: format!("cannot read {dlq}"),
                message: "the queue does not exist; run `dlqctl provision` on the topology file"
                    .into(),
            })
    };
    let start = std::time::Instant::now();
    let mut depth = read().await?;
    let mut same = 1;
    while settle && same < SNAPSHOT_SAME && start.elapsed() < SNAPSHOT_SETTLE {
        tokio::time::sleep(SNAPSHOT_POLL).await;
        let now = read().await?;
        same = if now == depth { same + 1 } else { 1 };
        depth = now;
    }
    Ok(depth)
}

/// How long a finished read waits at most for its returns to show.
const RETURN_SETTLE: Duration = Duration::from_secs(5);

fn rotation_error(dlq: &str, why: &Refusal) -> Error {
    Error::Broker {
        context: format!("stopped: {dlq} refused a rotated copy of a kept message"),
        message: format!(
            "{why}; nothing more was acked and every message is still in {dlq} (a bounded DLQ \
             needs room for the copies in flight; see docs/dlq.md, \"The rules every DLQ command \
             keeps\")"
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
    match hold_exclusive(conn, &name).await {
        Ok(Some(ch)) => Ok(Ok(ch)),
        Ok(None) => Err(Busy(Error::Busy {
            queue: dlq.to_string(),
            message: format!(
                "another dlqctl DLQ command holds its lock (queue {name}, exclusive to the \
                 holder's connection, which the management UI names); try again when it is \
                 done, or pass --wait"
            ),
        })),
        Err(e) => Ok(Err(e)),
    }
}

/// Declares the exclusive, auto-delete queue `name` on a new channel (it
/// holds no message and nothing routes to it): `Some(channel)` holds it
/// until that channel's connection ends (the broker deletes it then, even
/// after a SIGKILL); `None` when another connection holds it (405
/// RESOURCE_LOCKED).
pub(crate) async fn hold_exclusive(conn: &Connection, name: &str) -> Result<Option<Channel>> {
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| Error::broker("cannot open a channel", &e))?;
    let declared = ch
        .queue_declare(
            name.into(),
            lapin::options::QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    match declared {
        Ok(_) => Ok(Some(ch)),
        Err(e) if crate::amqp::connection::amqp_reply(&e).map(|(c, _)| c) == Some(405) => Ok(None),
        Err(e) => Err(Error::broker(format!("cannot take the lock {name}"), &e)),
    }
}
