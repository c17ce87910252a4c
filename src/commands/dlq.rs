//! `dlqctl dlq ...`: the DLQ operations. Each reads the topology, connects,
//! calls the library with a progress callback and hands the report to
//! `output`.

use crate::cli::{
    DlqTarget, ExportArgs, PeekArgs, PurgeArgs, RedriveArgs, ReplayArgs, SummaryArgs,
};
use crate::exit::Outcome;
use crate::output;
use crate::output::progress::Reporter;
use anyhow::Result;
use dlqctl::core::topology::{Pipeline, Topology};
use dlqctl::ops::dlq::Target;
use dlqctl::Error;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// A DLQ command's pipeline, topology and broker.
struct Opened {
    pipeline: Pipeline,
    target: Target,
}

impl Opened {
    async fn close(&self) {
        dlqctl::amqp::connection::close(&self.target.conn).await;
    }
}

/// Reads the topology, connects as `dlqctl dlq VERB`, and arms SIGINT and
/// SIGTERM to stop after the copies in flight.
async fn open(t: &DlqTarget, verb: &str) -> Result<Opened> {
    let pipeline = dlqctl::load_pipeline(&t.file, &t.queue)?;
    let brokers = super::brokers(&t.connection)?;
    let name = format!("dlqctl dlq {verb} {}", pipeline.name);
    let (conn, at) = brokers.connect(&name).await?;
    let url = brokers.get(at);
    let conn = Arc::new(conn);
    let cancel = CancellationToken::new();
    super::spawn_signal_handler(cancel.clone(), "stopping after the copies in flight")?;
    let target = Target::for_pipeline(conn, &pipeline, url.user(), name, cancel)
        .waiting(t.wait)
        .window(t.window);
    Ok(Opened { pipeline, target })
}

/// Prints a report on standard output: as JSON with `json`, else as
/// `text` renders it.
fn print_report<T: serde::Serialize>(
    json: bool,
    report: &T,
    text: impl FnOnce(&T) -> String,
) -> Result<()> {
    if json {
        output::stdout_line(&output::json::document(report))?;
    } else {
        output::stdout(&text(report))?;
    }
    Ok(())
}

/// `dlqctl dlq summary`: groups the DLQ by reason and error fingerprint.
pub async fn summary(a: &SummaryArgs) -> Result<Outcome> {
    let o = open(&a.target, "summary").await?;
    let mut bar = Reporter::new("grouped", a.json, a.target.progress);
    let result = dlqctl::ops::dlq::summary_for(
        &o.target,
        &a.select.selector(),
        o.pipeline.dead_letter.redrive.as_ref(),
        &mut |p| bar.update(p),
    )
    .await;
    bar.finish();
    o.close().await;
    let r = result?;
    print_report(a.json, &r, output::text::summary_text)?;
    Ok(if r.cancelled {
        Outcome::Failure
    } else {
        Outcome::Success
    })
}

/// `dlqctl dlq peek`: shows messages from the head of the DLQ, leaving
/// every one of them in place.
pub async fn peek(a: &PeekArgs) -> Result<Outcome> {
    let o = open(&a.target, "peek").await?;
    let result = dlqctl::ops::dlq::peek(&o.target, &a.select.selector(), a.limit).await;
    o.close().await;
    let width = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(100);
    let r = result?;
    print_report(a.json, &r, |r| output::text::peek_text(r, width))?;
    Ok(if r.cancelled {
        Outcome::Failure
    } else {
        Outcome::Success
    })
}

/// Where an export writes: a new (or, with `--append`, existing) regular
/// file, or standard output. `--remove` needs a regular file: only a file
/// can be fsynced before the messages are acked.
fn export_sink(a: &ExportArgs) -> Result<Box<dyn dlqctl::ops::dlq::export::Sink>> {
    use dlqctl::ops::dlq::export::WriterSink;
    let Some(path) = &a.output else {
        if a.remove {
            return Err(Error::Usage(
                "--remove needs --output FILE: messages are removed only once their lines are \
                 fsynced to a regular file, and standard output cannot be"
                    .into(),
            )
            .into());
        }
        return Ok(Box::new(WriterSink::new(std::io::stdout(), |_| Ok(()))));
    };
    let shown = path.display();
    let mut options = std::fs::OpenOptions::new();
    if a.append {
        options.append(true).create(true);
    } else {
        options.write(true).create_new(true);
    }
    let file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::Usage(format!(
                "{shown} exists: give a new file, or --append to add to it"
            ))
        } else {
            Error::Usage(format!("cannot open {shown} for writing: {e}"))
        }
    })?;
    let is_file = file.metadata().map(|m| m.is_file()).unwrap_or(false);
    if a.remove && !is_file {
        return Err(Error::Usage(format!(
            "--remove needs --output to name a regular file, and {shown} is not one (a pipe or a \
             device cannot be fsynced): write to a file, then move it"
        ))
        .into());
    }
    if a.append && is_file {
        repair_last_line(path)?;
    }
    if !is_file {
        return Ok(Box::new(WriterSink::new(
            std::io::BufWriter::with_capacity(1 << 16, file),
            |w| w.get_ref().sync_data(),
        )));
    }
    let synced_len = file
        .metadata()
        .map(|m| m.len())
        .map_err(|e| Error::Usage(format!("cannot read the length of {shown}: {e}")))?;
    Ok(Box::new(FileSink {
        writer: Some(std::io::BufWriter::with_capacity(1 << 16, file)),
        synced_len,
    }))
}

/// An export file that never keeps a cut line: when a write or a sync
/// fails (a full disk), the file is truncated back to its length at the
/// last sync, so it ends with a whole line. An archive acks only synced
/// lines, so the messages of the lines cut away are still in the DLQ.
struct FileSink {
    /// `None` once a write failed: the buffer is dropped unwritten.
    writer: Option<std::io::BufWriter<std::fs::File>>,
    /// The file's length at the last sync (or at the start).
    synced_len: u64,
}

impl FileSink {
    /// The writer, or an error once an earlier write failed.
    fn writer(&mut self) -> std::io::Result<&mut std::io::BufWriter<std::fs::File>> {
        self.writer
            .as_mut()
            .ok_or_else(|| std::io::Error::other("an earlier write failed"))
    }

    fn failed(&mut self, e: std::io::Error) -> std::io::Error {
        if let Some(w) = self.writer.take() {
            // The buffer is dropped, not flushed: what it holds is past the
            // last sync anyway.
            let (file, _unwritten) = w.into_parts();
            // Best effort: a truncation frees space, so it should succeed
            // on a full disk.
            if file.set_len(self.synced_len).is_ok() {
                let _ = file.sync_data();
            }
        }
        e
    }
}

impl dlqctl::ops::dlq::export::Sink for FileSink {
    fn write_line(&mut self, line: &str) -> std::io::Result<()> {
        use std::io::Write;
        let w = self.writer()?;
        let r = w
            .write_all(line.as_bytes())
            .and_then(|()| w.write_all(b"\n"));
        r.map_err(|e| self.failed(e))
    }

    fn sync(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        let w = self.writer()?;
        let r = w
            .flush()
            .and_then(|()| w.get_ref().sync_data())
            .and_then(|()| w.get_ref().metadata().map(|m| m.len()));
        match r {
            Ok(len) => {
                self.synced_len = len;
                Ok(())
            }
            Err(e) => Err(self.failed(e)),
        }
    }
}

/// Before `--append`: a file whose last line has no newline was cut by a
/// full disk or a kill while writing (its message was never acked: an
/// archive acks only fsynced lines). A cut line that is a whole export
/// line gets its newline; any other is truncated away, and said on
/// standard error. Appending would otherwise glue the next line onto it
/// and make the archive unreadable.
fn repair_last_line(path: &std::path::Path) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let shown = path.display();
    let io_err = |e: std::io::Error| Error::Usage(format!("cannot repair {shown}: {e}"));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err)?;
    let len = f.metadata().map_err(io_err)?.len();
    if len == 0 {
        return Ok(());
    }
    // Find the last newline, reading backwards in blocks: the cut line is
    // at most one export line, so this reads at most that much.
    let mut end = len;
    let mut tail: Vec<u8> = Vec::new();
    let cut_from = loop {
        let start = end.saturating_sub(64 * 1024);
        let mut block = vec![0u8; (end - start) as usize];
        f.seek(SeekFrom::Start(start)).map_err(io_err)?;
        f.read_exact(&mut block).map_err(io_err)?;
        if let Some(i) = block.iter().rposition(|b| *b == b'\n') {
            if start + i as u64 + 1 == len {
                return Ok(()); // ends with a newline: nothing cut
            }
            block.drain(..=i);
            block.append(&mut tail);
            tail = block;
            break start + i as u64 + 1;
        }
        block.append(&mut tail);
        tail = block;
        if start == 0 {
            break 0;
        }
        if tail.len() > dlqctl::core::dlq::export::MAX_LINE_BYTES {
            return Err(Error::Usage(format!(
                "{shown} ends with {} bytes and no newline, more than an export line: is this \
                 an export file? Not appending to it",
                tail.len()
            ))
            .into());
        }
        end = start;
    };
    let whole = std::str::from_utf8(&tail)
        .ok()
        .is_some_and(|t| dlqctl::core::dlq::export::from_line(t).is_ok());
    if whole {
        f.seek(SeekFrom::End(0)).map_err(io_err)?;
        f.write_all(b"\n").map_err(io_err)?;
    } else {
        f.set_len(cut_from).map_err(io_err)?;
        output::stderr_line(&format!(
            "{shown}: its last line was cut ({} bytes with no newline, left by a full disk or a \
             kill while writing; that message was never removed from the DLQ): truncated it \
             away before appending",
            tail.len()
        ));
    }
    f.sync_data().map_err(io_err)?;
    Ok(())
}

/// `dlqctl dlq export`: the DLQ as JSON Lines; with `--remove`, an archive.
pub async fn export(a: &ExportArgs) -> Result<Outcome> {
    // Bad output before any connection.
    dlqctl::load_pipeline(&a.target.file, &a.target.queue)?;
    let mut sink = export_sink(a)?;
    let o = open(&a.target, "export").await?;
    let opts = dlqctl::ops::dlq::export::ExportOptions {
        selector: a.select.selector(),
        limit: a.limit,
        remove: a.remove,
    };
    let mut bar = Reporter::new("exported", a.json || a.output.is_none(), a.target.progress);
    let result =
        dlqctl::ops::dlq::export::export(&o.target, &opts, sink.as_mut(), &mut |p| bar.update(p))
            .await;
    bar.finish();
    o.close().await;
    let r = result?;
    if a.json {
        let text = output::json::document(&r);
        if a.output.is_some() {
            output::stdout_line(&text)?;
        } else {
            output::stderr_line(&text);
        }
    } else {
        output::stderr_line(&output::text::export_text(&r, a.output.as_deref()));
    }
    Ok(if r.cancelled {
        Outcome::Failure
    } else {
        Outcome::Success
    })
}

/// The queues of `topology` a replay may send to only with `--force`:
/// retry queues and DLQs, each with what it is.
fn guarded_queues(topology: &Topology) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in &topology.pipelines {
        out.push((
            p.dead_letter.queue.clone(),
            format!("the DLQ of {}", p.name),
        ));
        for q in p.retry_queues() {
            out.push((q, format!("a retry queue of {}", p.name)));
        }
    }
    out
}

/// `dlqctl dlq replay`: moves a snapshot of the DLQ (or an export file)
/// back to the main queue.
pub async fn replay(a: &ReplayArgs) -> Result<Outcome> {
    let topology = dlqctl::load_topology(&a.target.file)?;
    let pipeline = dlqctl::load_pipeline(&a.target.file, &a.target.queue)?;
    let to = a.to.clone().unwrap_or_else(|| pipeline.name.clone());
    if !a.force {
        if let Some((_, what)) = guarded_queues(&topology)
            .into_iter()
            .find(|(q, _)| *q == to)
        {
            return Err(Error::Usage(format!(
                "--to {to} is {what}: replaying into it is rarely what you want (add --force if \
                 it is)"
            ))
            .into());
        }
    }
    let o = open(&a.target, "replay").await?;
    let mut opts = dlqctl::ops::dlq::replay::ReplayOptions::new(
        to,
        a.select.selector(),
        dlqctl::ops::dlq::replay::new_replay_id(),
    );
    opts.limit = a.limit;
    opts.rate = a.rate;
    opts.dry_run = a.dry_run;
    opts.canary = a.canary.map(|count| dlqctl::ops::dlq::replay::Canary {
        count,
        wait: a
            .canary_wait
            .unwrap_or_else(|| dlqctl::ops::dlq::replay::default_canary_wait(&o.pipeline)),
    });
    opts.rerun = a.rerun;
    opts.keys_of = a
        .dry_run
        .then(|| o.pipeline.idempotency.as_ref().map(|i| i.key.clone()))
        .flatten();
    let o = if a.dry_run || a.from_file.is_some() {
        o
    } else {
        guarded(a, o, opts.canary.is_some()).await?
    };
    let mut bar = Reporter::new(
        if a.dry_run { "would move" } else { "moved" },
        a.json,
        a.target.progress,
    );
    let result = match &a.from_file {
        Some(path) => {
            dlqctl::ops::dlq::replay::replay_file(
                o.target.conn.clone(),
                &o.target.user,
                path,
                &opts,
                &o.target.read.cancel,
                &mut |p| bar.update(p),
            )
            .await
        }
        None => dlqctl::ops::dlq::replay::replay(&o.target, &opts, &mut |p| bar.update(p)).await,
    };
    bar.finish();
    o.close().await;
    let mut r = result?;
    count_handled(a, &o.pipeline, &mut r).await?;
    print_report(a.json, &r, output::text::replay_text)?;
    use dlqctl::ops::dlq::replay::{ReplayEnd, Stop};
    Ok(match &r.ended {
        ReplayEnd::Stopped(Stop::CanaryFailed(_) | Stop::NoCanary(_)) => Outcome::Difference,
        ReplayEnd::Stopped(Stop::Refused(_)) | ReplayEnd::Cancelled { .. } => Outcome::Failure,
        ReplayEnd::Completed if r.failed > 0 => Outcome::Failure,
        ReplayEnd::Completed => Outcome::Success,
    })
}

/// A real replay of a pipeline with `idempotency`: its store, opened
/// without creating anything, so that a canary is chosen and judged by its
/// key and the messages already handled are counted. A store that cannot
/// be opened is an error when a canary depends on it; otherwise the
/// replay goes on without the count, saying why.
async fn guarded(a: &ReplayArgs, o: Opened, canary: bool) -> Result<Opened> {
    let brokers = super::brokers(&a.target.connection)?;
    let opened =
        dlqctl::ops::dlq::canary::StoreGuard::open(&o.pipeline, brokers.get(0).vhost(), None).await;
    let guard = match opened {
        Ok(guard) => guard,
        Err(e) if !canary => {
            output::stderr_line(&format!(
                "warning: the messages already handled are not counted: {e}"
            ));
            None
        }
        Err(e) => {
            o.close().await;
            return Err(e.into());
        }
    };
    Ok(Opened {
        target: o.target.guarded(guard),
        pipeline: o.pipeline,
    })
}

/// A dry run of a pipeline with `idempotency`: how many of the keys that
/// would move are marked handled, read from the store without creating
/// anything.
async fn count_handled(
    a: &ReplayArgs,
    pipeline: &dlqctl::Pipeline,
    r: &mut dlqctl::ops::dlq::replay::ReplayReport,
) -> Result<()> {
    let Some(idem) = pipeline.idempotency.as_ref().filter(|_| a.dry_run) else {
        return Ok(());
    };
    let url =
        dlqctl::idempotency::resolve(&idem.store, &pipeline.name, &|k| std::env::var(k).ok())?;
    let brokers = super::brokers(&a.target.connection)?;
    let scope = dlqctl::core::idempotency::scope(brokers.get(0).vhost(), &pipeline.name);
    let opened = dlqctl::idempotency::open(&url, &scope, dlqctl::idempotency::Create::No).await;
    let store = match opened {
        // The default file not found here: say where the installed
        // worker keeps it.
        Err(dlqctl::idempotency::StoreError::Refused { store, detail })
            if idem.store == dlqctl::core::idempotency::StoreSpec::Sqlite(None) =>
        {
            return Err(dlqctl::idempotency::StoreError::Refused {
                store,
                detail: format!(
                    "{detail}; {}",
                    dlqctl::idempotency::unit_hint(&pipeline.name)
                ),
            }
            .into())
        }
        other => other?,
    };
    let keys = std::mem::take(&mut r.keys);
    r.already_handled = Some(store.count_marked(&keys).await? as u64);
    Ok(())
}

/// `dlqctl dlq redrive`: one run of the pipeline's redrive policy, now.
pub async fn redrive(a: &RedriveArgs) -> Result<Outcome> {
    let pipeline = dlqctl::load_pipeline(&a.target.file, &a.target.queue)?;
    let Some(policy) = &pipeline.dead_letter.redrive else {
        return Err(Error::Usage(format!(
            "pipeline {} has no redrive policy: add `dead_letter: {{redrive: {{}}}}` to it (or to \
             defaults) in {}",
            pipeline.name,
            a.target.file.display()
        ))
        .into());
    };
    let every = policy.every;
    let o = open(&a.target, "redrive").await?;
    let brokers = super::brokers(&a.target.connection)?;
    let vhost = brokers.get(0).vhost().to_string();
    // A canary on a pipeline with `idempotency` is chosen and judged by
    // its key: the run needs the store.
    let guard = if policy.canary > 0 {
        match dlqctl::ops::dlq::canary::StoreGuard::open(&o.pipeline, &vhost, None).await {
            Ok(guard) => guard,
            Err(e) => {
                o.close().await;
                return Err(e.into());
            }
        }
    } else {
        None
    };
    let o = Opened {
        target: o.target.guarded(guard),
        pipeline: o.pipeline,
    };
    let result = dlqctl::ops::dlq::redrive::redrive(&o.target, &o.pipeline, every).await;
    o.close().await;
    let r = result?;
    print_report(a.json, &r, output::text::redrive_text)?;
    use dlqctl::core::dlq::redrive::RunResult;
    Ok(match r.result {
        RunResult::Moved | RunResult::NothingEligible => Outcome::Success,
        RunResult::CanaryFailed | RunResult::Unhealthy | RunResult::NoCanary => Outcome::Difference,
        RunResult::Busy | RunResult::Failed => Outcome::Failure,
    })
}

/// `dlqctl dlq purge`: removes messages with no copy, only with `--yes`.
pub async fn purge(a: &PurgeArgs) -> Result<Outcome> {
    let o = open(&a.target, "purge").await?;
    let mut bar = Reporter::new(
        if a.yes { "removed" } else { "counted" },
        a.json,
        a.target.progress,
    );
    let result =
        dlqctl::ops::dlq::purge::purge(&o.target, &a.select.selector(), a.limit, a.yes, &mut |p| {
            bar.update(p)
        })
        .await;
    bar.finish();
    o.close().await;
    let r = result?;
    print_report(a.json, &r, output::text::purge_text)?;
    if !a.yes {
        output::stderr_line(&format!(
            "nothing removed: {} of {} in {} would go; add --yes to remove them (no copy is \
             kept: `dlqctl dlq export --remove` archives instead)",
            r.selected,
            dlqctl::core::values::text::count(r.snapshot, "message"),
            r.queue
        ));
        return Ok(Outcome::Usage);
    }
    Ok(if r.cancelled {
        Outcome::Failure
    } else {
        Outcome::Success
    })
}
