//! `dlq export`: the DLQ as JSON Lines ([`crate::core::dlq::export`]), and with
//! `remove`, an archive: a message is acked only once its line is written
//! and the file fsynced.

use super::reader::{DlqReader, Message};
use super::{now_ms, selected, Progress, Target};
use crate::core::dlq::select::Selector;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// Where the lines go.
pub trait Sink: Send {
    /// Writes one line (the newline is added here).
    fn write_line(&mut self, line: &str) -> std::io::Result<()>;
    /// Makes every line written so far durable (flush, then fsync for a
    /// file). An archive acks only what this made durable.
    fn sync(&mut self) -> std::io::Result<()>;
}

/// A [`Sink`] on any writer: `sync` flushes, then calls `durable` (for a
/// file: `File::sync_data`).
pub struct WriterSink<W: std::io::Write + Send> {
    writer: W,
    durable: fn(&mut W) -> std::io::Result<()>,
}

impl<W: std::io::Write + Send> WriterSink<W> {
    /// Lines to `writer`, made durable by `durable` after each flush.
    pub fn new(writer: W, durable: fn(&mut W) -> std::io::Result<()>) -> Self {
        WriterSink { writer, durable }
    }
}

impl<W: std::io::Write + Send> Sink for WriterSink<W> {
    fn write_line(&mut self, line: &str) -> std::io::Result<()> {
        self.writer.write_all(line.as_bytes())?;
        self.writer.write_all(b"\n")
    }

    fn sync(&mut self) -> std::io::Result<()> {
        self.writer.flush()?;
        (self.durable)(&mut self.writer)
    }
}

/// What to export.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Which messages.
    pub selector: Selector,
    /// At most this many.
    pub limit: Option<u64>,
    /// Remove each exported message from the DLQ once durable.
    pub remove: bool,
}

/// What an export did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ExportReport {
    /// The DLQ.
    pub queue: String,
    /// Its ready messages at the start.
    pub snapshot: u64,
    /// Messages read.
    pub read: u64,
    /// Lines written.
    pub written: u64,
    /// Messages removed from the DLQ (written and fsynced first).
    pub removed: u64,
    /// Selected messages that cannot be written (headers nested too deep,
    /// a line over [`crate::core::dlq::export::MAX_LINE_BYTES`]); they stay in
    /// the DLQ.
    pub failed: u64,
    /// Kept messages rotated to the tail (past the window).
    pub rotated: u64,
    /// Stopped by SIGINT/SIGTERM before the snapshot was read.
    pub cancelled: bool,
}

/// Lines written between two fsyncs of an archive, at most.
const SYNC_EVERY_LINES: usize = 500;
/// Time between two fsyncs of an archive, at most.
const SYNC_EVERY: Duration = Duration::from_secs(1);

/// Exports the DLQ (see the module docs).
pub async fn export(
    t: &Target,
    opts: &ExportOptions,
    sink: &mut dyn Sink,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<ExportReport> {
    let mut r = t.open().await?;
    let mut run = Run {
        opts,
        sink,
        p: Progress {
            total: r.snapshot(),
            ..Default::default()
        },
        unsynced: Vec::new(),
        last_sync: Instant::now(),
        groups: crate::core::dlq::select::GroupCheck::new(&opts.selector),
    };
    let outcome = run.all(&mut r, progress).await;
    let stats = r.finish_after(outcome).await?;
    super::refuse_unknown_group(&run.groups, &t.dlq, stats.cancelled)?;
    let p = run.p;
    Ok(ExportReport {
        queue: t.dlq.clone(),
        snapshot: stats.snapshot,
        read: stats.read,
        written: p.done,
        removed: if opts.remove {
            stats.acked - stats.rotated
        } else {
            0
        },
        failed: p.failed,
        rotated: stats.rotated,
        cancelled: stats.cancelled,
    })
}

/// An export under way: where it writes, how far it got, and the lines
/// written but not yet fsynced (their messages are held unacked).
struct Run<'a> {
    opts: &'a ExportOptions,
    sink: &'a mut dyn Sink,
    p: Progress,
    unsynced: Vec<u64>,
    last_sync: Instant,
    /// Whether `--group` names a group of the snapshot.
    groups: crate::core::dlq::select::GroupCheck,
}

impl Run<'_> {
    /// Reads until the snapshot, the limit or a cancel, then syncs.
    async fn all(
        &mut self,
        r: &mut DlqReader,
        progress: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<()> {
        loop {
            if self.opts.limit.is_some_and(|l| self.p.selected >= l) {
                // The limit is reached: the rest stays where it is, unread.
                break;
            }
            let Some(m) = r.next().await? else { break };
            self.one(r, m).await?;
            // Unsynced lines hold their messages unacked: sync before they
            // could fill what the broker may send.
            if self.opts.remove
                && (self.unsynced.len() >= SYNC_EVERY_LINES
                    || self.unsynced.len() as u64 + 1 >= r.free_slots()
                    || self.last_sync.elapsed() >= SYNC_EVERY)
            {
                self.sync(r)?;
            }
            progress(&self.p);
        }
        self.sync(r)
    }

    /// Writes one message's line if it is selected, else keeps it.
    async fn one(&mut self, r: &mut DlqReader, m: Message) -> Result<()> {
        let now = now_ms();
        self.groups.see(&m.described);
        self.p.read += 1;
        let wanted = self.opts.limit.is_none_or(|l| self.p.selected < l);
        if !(wanted && selected(&self.opts.selector, &m, now)) {
            return r.keep(m, now).await;
        }
        self.p.selected += 1;
        let line = match crate::core::dlq::export::to_line(&m.record) {
            Ok(line) => line,
            Err(e) => {
                tracing::warn!(
                    message_id = m.message_id.as_deref().unwrap_or(""),
                    "not exported, kept in the DLQ: {e}"
                );
                self.p.failed += 1;
                return r.keep(m, now).await;
            }
        };
        if let Err(e) = self.sink.write_line(&line) {
            return Err(self.write_err(e));
        }
        self.p.done += 1;
        if self.opts.remove {
            self.unsynced.push(m.tag);
            Ok(())
        } else {
            r.keep(m, now).await
        }
    }

    /// Makes the lines written durable, then lets their messages go.
    fn sync(&mut self, r: &mut DlqReader) -> Result<()> {
        if let Err(e) = self.sink.sync() {
            return Err(self.write_err(e));
        }
        for tag in self.unsynced.drain(..) {
            r.take(tag);
        }
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Says how far the export got: the report is lost with the error.
    fn write_err(&self, e: std::io::Error) -> Error {
        Error::Write {
            what: format!(
                "the export (stopped after {} line(s) written of {} read; {})",
                self.p.done,
                self.p.read,
                if self.opts.remove {
                    "only lines written and fsynced before were removed from the DLQ"
                } else {
                    "nothing was removed from the DLQ"
                }
            ),
            source: e,
        }
    }
}
