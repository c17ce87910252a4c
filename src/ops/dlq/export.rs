//! `dlq export`: the DLQ as JSON Lines ([`crate::core::dlq::export`]), and with
//! `remove`, an archive: a message is acked only once its line is written
//! and the file fsynced.

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
    let mut p = Progress {
        total: r.snapshot(),
        ..Default::default()
    };
    let mut unsynced: Vec<u64> = Vec::new();
    let mut last_sync = Instant::now();
    // Says how far the export got: the report is lost with the error.
    let write_err = |p: &Progress, e: std::io::Error| Error::Write {
        what: format!(
            "the export (stopped after {} line(s) written of {} read; {})",
            p.done,
            p.read,
            if opts.remove {
                "only lines written and fsynced before were removed from the DLQ"
            } else {
                "nothing was removed from the DLQ"
            }
        ),
        source: e,
    };
    let mut groups = crate::core::dlq::select::GroupCheck::new(&opts.selector);
    let outcome = async {
        loop {
            if opts.limit.is_some_and(|l| p.selected >= l) {
                // The limit is reached: the rest stays where it is, unread.
                break;
            }
            let Some(m) = r.next().await? else { break };
            let now = now_ms();
            groups.see(&m.described);
            p.read += 1;
            let wanted = opts.limit.is_none_or(|l| p.selected < l);
            if wanted && selected(&opts.selector, &m, now) {
                p.selected += 1;
                let line = match crate::core::dlq::export::to_line(&m.record) {
                    Ok(line) => line,
                    Err(e) => {
                        tracing::warn!(
                            message_id = m.message_id.as_deref().unwrap_or(""),
                            "not exported, kept in the DLQ: {e}"
                        );
                        p.failed += 1;
                        r.keep(m, now).await?;
                        progress(&p);
                        continue;
                    }
                };
                sink.write_line(&line).map_err(|e| write_err(&p, e))?;
                p.done += 1;
                if opts.remove {
                    unsynced.push(m.tag);
                } else {
                    r.keep(m, now).await?;
                }
            } else {
                r.keep(m, now).await?;
            }
            // Unsynced lines hold their messages unacked: sync before they
            // could fill what the broker may send.
            if opts.remove
                && (unsynced.len() >= SYNC_EVERY_LINES
                    || unsynced.len() as u64 + 1 >= r.free_slots()
                    || last_sync.elapsed() >= SYNC_EVERY)
            {
                sink.sync().map_err(|e| write_err(&p, e))?;
                for tag in unsynced.drain(..) {
                    r.take(tag);
                }
                last_sync = Instant::now();
            }
            progress(&p);
        }
        sink.sync().map_err(|e| write_err(&p, e))?;
        for tag in unsynced.drain(..) {
            r.take(tag);
        }
        Ok::<_, Error>(())
    }
    .await;
    let stats = r.finish().await;
    outcome?;
    let stats = stats?;
    super::refuse_unknown_group(&groups, &t.dlq, stats.cancelled)?;
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
