//! Starting a job: the check of its request, its place in the list, and
//! its run on a connection of its own (the library call of its `dlqctl
//! dlq` command).

use super::common::{for_the_page, Fail};
use super::jobs::{Action, Inner, Job, Jobs, Request, State};
use super::state::App;
use dlqctl::core::dlq::select::Selector;
use dlqctl::ops::dlq::export::{ExportOptions, WriterSink};
use dlqctl::ops::dlq::replay::{Canary, ReplayEnd, ReplayOptions};
use dlqctl::ops::dlq::Progress;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

impl Jobs {
    /// Starts `request` on `pipeline`'s DLQ. Refused (409, naming the job)
    /// while another job of this server works on that DLQ.
    pub fn start(&self, app: &Arc<App>, pipeline: &str, request: Request) -> Result<u64, Fail> {
        request.check()?;
        let p = app.pipeline(pipeline)?.clone();
        let mut list = self.list();
        if let Some(j) = list.iter().find(|j| j.pipeline == p.name && j.running()) {
            return Err(Fail {
                status: axum::http::StatusCode::CONFLICT,
                message: format!(
                    "job {} is still working on {}: one job at a time per DLQ",
                    j.id, j.dlq
                ),
                job: Some(j.id),
            });
        }
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = matches!(request.action, Action::Export)
            .then(|| self.dir.join(format!("job-{id}.jsonl")));
        let job = Arc::new(Job {
            id,
            pipeline: p.name.clone(),
            dlq: p.dead_letter.queue.clone(),
            started_at: dlqctl::core::values::text::rfc3339_millis(dlqctl::ops::dlq::now_ms()),
            started: Instant::now(),
            cancel: app.stop.child_token(),
            file,
            request,
            inner: Mutex::new(Inner {
                state: State::Running,
                progress: Progress::default(),
                report: None,
                error: None,
                finished: None,
            }),
        });
        list.push(job.clone());
        self.evict(&mut list);
        drop(list);
        let app = app.clone();
        self.tracker.spawn(async move {
            use futures_util::FutureExt;
            // A panic in a job must not leave it "running" for ever, which
            // would refuse every later job on its DLQ.
            let ran = std::panic::AssertUnwindSafe(run(&app, &job, &p))
                .catch_unwind()
                .await;
            let (state, report, error) = ran.unwrap_or_else(|_| {
                (
                    State::Failed,
                    None,
                    Some(
                        "the job stopped on an internal error (a bug: please report it); \
                          what it had not settled is still in the DLQ"
                            .to_string(),
                    ),
                )
            });
            if let Some(e) = &error {
                tracing::warn!(
                    "serve: job {} ({}) failed: {e}",
                    job.id,
                    job.request.action.verb()
                );
            }
            job.finish(state, report, error);
        });
        Ok(id)
    }
}

/// Runs one job to its end state, report and error.
async fn run(
    app: &Arc<App>,
    job: &Arc<Job>,
    p: &dlqctl::core::topology::Pipeline,
) -> (State, Option<serde_json::Value>, Option<String>) {
    // Page reads of this DLQ in flight end first (they are short).
    let _gate = tokio::select! {
        g = app.gate(&p.name).lock_owned() => g,
        _ = job.cancel.cancelled() => return (State::Cancelled, None, None),
    };
    let t = match app
        .target(p, job.request.action.verb(), job.cancel.clone())
        .await
    {
        Ok(t) => t,
        Err(e) => return (State::Failed, None, Some(e.to_string())),
    };
    let progress = |p: &Progress| job.lock().progress = p.clone();
    let selector = job.request.selection.selector();
    let result = match &job.request.action {
        Action::Replay {
            rate,
            canary,
            canary_wait_ms,
        } => {
            let mut opts = ReplayOptions::new(
                p.name.clone(),
                selector,
                dlqctl::ops::dlq::replay::new_replay_id(),
            );
            opts.limit = job.request.selection.limit();
            opts.rate = *rate;
            opts.canary = canary.map(|count| Canary {
                count,
                wait: canary_wait_ms
                    .map(Duration::from_millis)
                    .unwrap_or_else(|| dlqctl::ops::dlq::replay::default_canary_wait(p)),
            });
            // On a pipeline with `idempotency`, a canary is chosen and
            // judged by its key: it needs the store (the count of the
            // messages already handled only wants it).
            let vhost = app.opts.brokers.get(0).vhost().to_string();
            let guard = dlqctl::ops::dlq::canary::StoreGuard::open(p, &vhost, None).await;
            let guarded = match guard {
                Err(e) if opts.canary.is_some() => Err(e),
                guard => Ok(t.clone().guarded(guard.ok().flatten())),
            };
            let replayed = match guarded {
                Ok(t) => dlqctl::ops::dlq::replay::replay(&t, &opts, &mut { progress }).await,
                Err(e) => Err(e),
            };
            replayed.map(|r| {
                // A failed canary is the run's stop.
                let (state, error) = match &r.ended {
                    ReplayEnd::Cancelled { stop } => (State::Cancelled, stop.as_ref()),
                    ReplayEnd::Stopped(stop) => (State::Failed, Some(stop)),
                    ReplayEnd::Completed => (State::Done, None),
                };
                let error = error.map(|s| s.why().to_string());
                (state, serde_json::to_value(&r).ok(), error)
            })
        }
        Action::Export => export(app, job, &t, selector, progress).await,
        Action::Purge { expected } => dlqctl::ops::dlq::purge::purge(
            &t,
            &selector,
            Some(
                job.request
                    .selection
                    .limit()
                    .map_or(*expected, |l| l.min(*expected)),
            ),
            true,
            &mut { progress },
        )
        .await
        .map(|r| {
            let state = if r.cancelled {
                State::Cancelled
            } else {
                State::Done
            };
            (state, serde_json::to_value(&r).ok(), None)
        }),
    };
    dlqctl::amqp::connection::close(&t.conn).await;
    match result {
        Ok(r) => r,
        Err(e) if job.cancel.is_cancelled() => (State::Cancelled, None, Some(e.to_string())),
        Err(e) => (State::Failed, None, Some(for_the_page(e).to_string())),
    }
}

type Ended = (State, Option<serde_json::Value>, Option<String>);

/// An export into the job's file (kept: the page exports, it does not
/// archive).
async fn export(
    app: &Arc<App>,
    job: &Arc<Job>,
    t: &dlqctl::ops::dlq::Target,
    selector: Selector,
    progress: impl FnMut(&Progress) + Send,
) -> dlqctl::error::Result<Ended> {
    let write_err = |e: std::io::Error| dlqctl::error::Error::Write {
        what: "the export file".into(),
        source: e,
    };
    let path = job.file.clone().unwrap_or_default();
    app.jobs.export_dir().map_err(write_err)?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(write_err)?;
    let mut sink = WriterSink::new(std::io::BufWriter::with_capacity(1 << 16, file), |w| {
        w.get_ref().sync_data()
    });
    let opts = ExportOptions {
        selector,
        limit: job.request.selection.limit(),
        remove: false,
    };
    let r = dlqctl::ops::dlq::export::export(t, &opts, &mut sink, &mut { progress }).await?;
    let (state, error) = if r.cancelled {
        (State::Cancelled, None)
    } else if r.failed > 0 {
        // A file missing messages is no export: none is offered.
        (
            State::Failed,
            Some(format!(
                "{} could not be written as export lines (see the report); they are \
                 still in the DLQ, and no file is offered",
                dlqctl::core::values::text::count(r.failed, "message")
            )),
        )
    } else {
        (State::Done, None)
    };
    Ok((state, serde_json::to_value(&r).ok(), error))
}
