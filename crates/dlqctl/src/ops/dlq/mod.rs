//! The DLQ operations: peek, summary, export, replay, redrive and purge. Library
//! code that returns typed reports, takes a progress callback and never
//! prints; the CLI and `dlqctl serve` share it.
//!
//! Every command reads the DLQ through [`reader::DlqReader`], which keeps
//! the rules (docs/dlq.md, "The rules every DLQ command keeps"):
//! - **One command at a time per DLQ.** Each first declares an exclusive
//!   queue `dlqctl.lock.<DLQ>` (it holds no message and nothing routes to
//!   it): a second command is refused by the broker (405 RESOURCE_LOCKED)
//!   and reported as busy, or waits with `--wait`. The broker deletes the
//!   lock when the holder's connection ends, even by SIGKILL. (An exclusive
//!   *consumer* is no lock: RabbitMQ 3.10 lets a second one onto a quorum
//!   queue.)
//! - **The snapshot.** The DLQ's ready depth at the start is read first and
//!   at most that many messages are read.
//! - **Nothing requeued one by one.** What is kept stays unacked and goes
//!   back together at the end, in order; past the window it is rotated (a
//!   confirmed copy to the tail, then the ack).
//! - **Acks settle before the close**, `multiple` where possible.

pub mod canary;
pub mod export;
pub mod purge;
pub(crate) mod reader;
pub mod redrive;
pub mod redrive_state;
pub mod replay;

pub use reader::{
    lock_name, DlqReader, Message, ReadOptions, ReadStats, DEFAULT_WINDOW, MAX_IN_FLIGHT,
};

use crate::core::dlq::describe::Described;
use crate::core::dlq::select::{Candidate, GroupCheck, Selector};
use crate::error::Result;
use lapin::Connection;
use std::sync::Arc;

/// The most messages one peek shows.
pub const MAX_PEEK: u16 = 10_000;

/// Where a DLQ command runs.
#[derive(Clone)]
pub struct Target {
    /// The connection.
    pub conn: Arc<Connection>,
    /// The DLQ.
    pub dlq: String,
    /// The user the connection authenticated as (copies drop a foreign
    /// `user_id`).
    pub user: String,
    /// How the DLQ is read.
    pub read: ReadOptions,
    /// The connection's name for this command, as the management UI shows
    /// it (`dlqctl dlq replay`).
    pub tag: String,
    /// The pipeline's idempotency store, when it has one and the command
    /// opened it: a replay or redrive to the main queue then chooses its
    /// canaries by their keys and counts the messages already handled
    /// ([`canary`]).
    pub guard: Option<canary::StoreGuard>,
}

impl Target {
    /// The target of `pipeline`'s DLQ on `conn`, which authenticated as
    /// `user` and is named `tag`: read with the DLQ's retention and the
    /// default options, stopping when `cancel` is cancelled. The one way
    /// every command, the worker, `dlqctl serve` and `dlqctl drill` make
    /// it; [`Target::waiting`], [`Target::window`] and
    /// [`Target::unsettled`] change what differs.
    pub fn for_pipeline(
        conn: Arc<Connection>,
        pipeline: &crate::core::topology::Pipeline,
        user: &str,
        tag: String,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Target {
        Target {
            conn,
            dlq: pipeline.dead_letter.queue.clone(),
            user: user.to_string(),
            read: ReadOptions {
                retention_ms: pipeline.dead_letter.ttl,
                cancel,
                ..ReadOptions::default()
            },
            tag,
            guard: None,
        }
    }

    /// Looks keys up in `guard`'s store ([`Target::guard`]).
    pub fn guarded(mut self, guard: Option<canary::StoreGuard>) -> Target {
        self.guard = guard;
        self
    }

    /// Waits for the DLQ's lock instead of failing with "busy" when `wait`
    /// ([`ReadOptions::wait`]).
    pub fn waiting(mut self, wait: bool) -> Target {
        self.read.wait = wait;
        self
    }

    /// Holds at most `window` messages unacked ([`ReadOptions::window`]).
    pub fn window(mut self, window: u32) -> Target {
        self.read.window = window;
        self
    }

    /// Takes the snapshot at once, without waiting for the DLQ's depth to
    /// hold still ([`ReadOptions::settle`] off).
    pub fn unsettled(mut self) -> Target {
        self.read.settle = false;
        self
    }

    /// The same target, stopping when `cancel` is cancelled instead.
    pub fn with_cancel(&self, cancel: tokio_util::sync::CancellationToken) -> Target {
        let mut t = self.clone();
        t.read.cancel = cancel;
        t
    }

    async fn open(&self) -> Result<DlqReader> {
        DlqReader::open(
            self.conn.clone(),
            &self.dlq,
            &self.user,
            &self.tag,
            self.read.clone(),
        )
        .await
    }
}

/// How far a command is, for a progress bar.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Progress {
    /// Messages the command will read at most (the snapshot, or the lines
    /// of a file).
    pub total: u64,
    /// Messages read so far.
    pub read: u64,
    /// Messages that matched the selectors (up to the limit).
    pub selected: u64,
    /// Selected messages done (moved, written, removed).
    pub done: u64,
    /// Selected messages that failed (refused copies).
    pub failed: u64,
}

/// Now, in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// After a read that was not cancelled: bad usage when `--group` names
/// no group of the messages read (see [`GroupCheck`]).
pub(crate) fn refuse_unknown_group(check: &GroupCheck, dlq: &str, cancelled: bool) -> Result<()> {
    match check.verdict(dlq) {
        Some(why) if !cancelled => Err(crate::error::Error::Usage(why)),
        _ => Ok(()),
    }
}

/// Whether the selector takes this message.
pub(crate) fn selected(s: &Selector, m: &Message, now: u64) -> bool {
    s.matches(
        &Candidate {
            described: &m.described,
            headers: &m.headers,
            message_id: m.message_id.as_deref(),
        },
        now,
    )
}

/// One message read from a DLQ, as peek shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PeekedMessage {
    /// `message_id` (`None`: absent; see `message_id_base64`).
    pub message_id: Option<String>,
    /// A `message_id` that is not UTF-8, as base64 of its bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id_base64: Option<String>,
    /// The summary group (`--group`).
    pub group: String,
    /// What the headers say.
    #[serde(flatten)]
    pub described: Described,
    /// Every header, as JSON.
    pub headers: serde_json::Value,
    /// The other properties, as the export format writes them.
    pub properties: serde_json::Map<String, serde_json::Value>,
    /// The body's length in bytes.
    pub body_bytes: usize,
    /// The body, when it is UTF-8.
    pub body_utf8: Option<String>,
    /// The body, base64.
    pub body_base64: String,
}

impl PeekedMessage {
    fn of(m: &Message) -> Self {
        use crate::core::values::shortstr;
        let id = m
            .record
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str());
        PeekedMessage {
            message_id: id.and_then(shortstr::utf8).map(|s| s.into_owned()),
            message_id_base64: id
                .and_then(shortstr::non_utf8_bytes)
                .map(|b: Vec<u8>| shortstr::base64(&b)),
            group: crate::core::dlq::select::message_group(&m.described),
            described: m.described.clone(),
            headers: m.headers.clone(),
            properties: crate::core::dlq::export::properties_json(&m.record.properties),
            body_bytes: m.record.body.len(),
            body_utf8: std::str::from_utf8(&m.record.body).ok().map(str::to_string),
            body_base64: shortstr::base64(&m.record.body),
        }
    }
}

/// What a peek read.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct PeekReport {
    /// The DLQ.
    pub queue: String,
    /// Its ready messages when the peek started.
    pub snapshot: u64,
    /// Messages read to find these.
    pub read: u64,
    /// The messages that matched, from the head.
    pub messages: Vec<PeekedMessage>,
    /// Stopped by SIGINT/SIGTERM (or a cancelled page) before the end.
    pub cancelled: bool,
}

/// Shows up to `limit` messages matching `selector` from the head of the
/// DLQ, leaving every message in place (in order, unless more than the
/// window had to be read: see `reader`).
pub async fn peek(t: &Target, selector: &Selector, limit: u16) -> Result<PeekReport> {
    peek_from(t, selector, 0, limit).await
}

/// Like [`peek`], past the first `skip` matching messages: a page of
/// them. `skip + limit` is at most [`MAX_PEEK`].
pub async fn peek_from(
    t: &Target,
    selector: &Selector,
    skip: u16,
    limit: u16,
) -> Result<PeekReport> {
    let skip = usize::from(skip.min(MAX_PEEK));
    let limit = usize::from(limit.min(MAX_PEEK)).min(usize::from(MAX_PEEK) - skip);
    let mut r = t.open().await?;
    let mut messages = Vec::new();
    let mut matched = 0usize;
    let mut groups = GroupCheck::new(selector);
    let outcome = async {
        while limit > messages.len() {
            let Some(m) = r.next().await? else { break };
            let now = now_ms();
            groups.see(&m.described);
            if selected(selector, &m, now) {
                if matched >= skip {
                    messages.push(PeekedMessage::of(&m));
                }
                matched += 1;
            }
            r.keep(m, now).await?;
        }
        Ok::<_, crate::error::Error>(())
    }
    .await;
    let stats = r.finish_after(outcome).await?;
    refuse_unknown_group(&groups, &t.dlq, stats.cancelled)?;
    Ok(PeekReport {
        queue: t.dlq.clone(),
        snapshot: stats.snapshot,
        read: stats.read,
        messages,
        cancelled: stats.cancelled,
    })
}

/// What `dlq summary` found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct SummaryReport {
    /// The DLQ.
    pub queue: String,
    /// Its ready messages at the start.
    pub snapshot: u64,
    /// Messages read (the snapshot, unless others took some meanwhile or
    /// the run was cancelled).
    pub read: u64,
    /// Messages grouped (those matching the selectors).
    pub grouped: u64,
    /// Kept messages rotated to the tail (past the window).
    pub rotated: u64,
    /// The groups, largest first.
    pub groups: Vec<crate::core::dlq::describe::Group>,
    /// Stopped by SIGINT/SIGTERM (or a cancelled page) before the end: the
    /// groups count what was read.
    pub cancelled: bool,
    /// With the pipeline's redrive policy: the messages read (selected or
    /// not) that are past `max_redrives` and wait for a person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for_person: Option<u64>,
}

/// Groups the whole snapshot of the DLQ (the messages matching `selector`)
/// by reason and error fingerprint, leaving every message in it.
pub async fn summary(
    t: &Target,
    selector: &Selector,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<SummaryReport> {
    summary_for(t, selector, None, progress).await
}

/// Like [`summary`]; with `policy` (the pipeline's redrive policy), it
/// also counts the messages waiting for a person
/// ([`SummaryReport::waiting_for_person`]).
pub async fn summary_for(
    t: &Target,
    selector: &Selector,
    policy: Option<&crate::core::topology::Redrive>,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<SummaryReport> {
    use crate::core::dlq::redrive::{verdict, Seen, Verdict};
    let mut waiting = policy.map(|_| 0u64);
    let mut grouper = crate::core::dlq::describe::Grouper::default();
    let mut r = t.open().await?;
    let mut p = Progress {
        total: r.snapshot(),
        ..Default::default()
    };
    let mut groups = GroupCheck::new(selector);
    let outcome = async {
        while let Some(m) = r.next().await? {
            let now = now_ms();
            groups.see(&m.described);
            p.read += 1;
            if let (Some(policy), Some(n)) = (policy, waiting.as_mut()) {
                let seen = Seen::of(&m.described, m.record.properties.headers().as_ref());
                if verdict(policy, &seen, now) == Verdict::WaitingForPerson {
                    *n += 1;
                }
            }
            if selected(selector, &m, now) {
                p.selected += 1;
                p.done += 1;
                grouper.add(&m.described, m.message_id.as_deref());
            }
            r.keep(m, now).await?;
            progress(&p);
        }
        Ok::<_, crate::error::Error>(())
    }
    .await;
    let stats = r.finish_after(outcome).await?;
    refuse_unknown_group(&groups, &t.dlq, stats.cancelled)?;
    Ok(SummaryReport {
        queue: t.dlq.clone(),
        snapshot: stats.snapshot,
        read: stats.read,
        grouped: p.selected,
        rotated: stats.rotated,
        groups: grouper.finish(),
        cancelled: stats.cancelled,
        waiting_for_person: waiting,
    })
}
