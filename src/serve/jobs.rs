//! The page's actions as background jobs: replay, export and purge, each
//! the library call of its `dlqctl dlq` command on a connection of its own,
//! with its progress readable while it runs and a cancel that stops it
//! after the copies in flight (what it had not settled stays in the DLQ).
//!
//! One job at a time per DLQ: the server refuses a second one on a DLQ it
//! is already working on, and the DLQ's lock refuses it when another
//! `dlqctl` holds the DLQ.

use super::state::App;
use super::Fail;
use crate::core::dlq::select::Selector;
use crate::ops::dlq::export::{ExportOptions, WriterSink};
use crate::ops::dlq::replay::{Canary, ReplayOptions};
use crate::ops::dlq::Progress;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The export folders' name: this, the server's pid, a random part.
const EXPORT_DIR_PREFIX: &str = "dlqctl-serve-";

/// Removes the export folders of servers that are gone (killed, so they
/// could not remove their own): they hold message bodies.
fn sweep_stale_exports(tmp: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(EXPORT_DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let mine = e.metadata().map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.uid() == current_uid()
        });
        if pid != std::process::id()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            && mine.unwrap_or(false)
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// This process's user id, as `/proc/self` is owned.
fn current_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// The longest a page's canary may wait.
pub const MAX_CANARY_WAIT_MS: u64 = 24 * 3_600_000;

/// Finished jobs kept for the jobs page (and their export files).
const KEEP_FINISHED: usize = 50;

/// What a job does.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// `dlq replay` to the pipeline's main queue.
    Replay {
        /// Messages per second at most.
        #[serde(default)]
        rate: Option<f64>,
        /// Replay this many first and wait for them before the rest.
        #[serde(default)]
        canary: Option<u64>,
        /// How long the canary waits, ms [default: the pipeline's retry
        /// delays + 30 s].
        #[serde(default)]
        canary_wait_ms: Option<u64>,
    },
    /// `dlq export`, to a file the page offers for download.
    Export,
    /// `dlq purge --yes`, at most `expected` messages: the count the user
    /// typed to confirm.
    Purge {
        /// The count the user saw and typed.
        expected: u64,
    },
}

impl Action {
    /// The verb, as the CLI names it.
    pub fn verb(&self) -> &'static str {
        match self {
            Action::Replay { .. } => "replay",
            Action::Export => "export",
            Action::Purge { .. } => "purge",
        }
    }
}

/// Which messages: a group, some message ids, both (all must match), or
/// neither (the whole DLQ).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Selection {
    /// The summary group (`--group`).
    #[serde(default)]
    pub group: Option<String>,
    /// Message ids (`--message-id`, any of them).
    #[serde(default)]
    pub message_ids: Vec<String>,
}

impl Selection {
    /// The selector of the DLQ commands.
    pub fn selector(&self) -> Selector {
        Selector {
            group: self.group.clone(),
            message_ids: self.message_ids.clone(),
            ..Selector::default()
        }
    }

    /// The most messages an action on it may take: one per distinct id
    /// selected (several messages can share an id; ticking one takes one),
    /// else no limit.
    pub fn limit(&self) -> Option<u64> {
        if self.message_ids.is_empty() {
            return None;
        }
        let distinct: std::collections::BTreeSet<&String> = self.message_ids.iter().collect();
        Some(distinct.len() as u64)
    }

    /// Whether it selects the whole DLQ.
    pub fn is_everything(&self) -> bool {
        self.group.is_none() && self.message_ids.is_empty()
    }
}

/// A job to start.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// What to do.
    #[serde(flatten)]
    pub action: Action,
    /// To which messages.
    #[serde(flatten)]
    pub selection: Selection,
}

impl Request {
    /// Refuses what the page must not start: a purge of the whole DLQ (the
    /// CLI's `dlq purge --yes` does that), a purge count of 0, a rate
    /// outside the CLI's bounds (`--rate`), a canary of 0 or waiting longer
    /// than the CLI's `--canary-wait` may.
    pub fn check(&self) -> Result<(), Fail> {
        match &self.action {
            Action::Purge { expected } => {
                if self.selection.is_everything() {
                    return Err(Fail::bad_request(
                        "the page purges a group or selected messages, not a whole DLQ: \
                         `dlqctl dlq purge --yes` does that",
                    ));
                }
                if *expected == 0 {
                    return Err(Fail::bad_request("nothing to purge: the count is 0"));
                }
            }
            Action::Replay {
                rate,
                canary,
                canary_wait_ms,
            } => {
                if let Some(r) = rate {
                    crate::core::dlq::rate::check_rate(*r)
                        .map_err(|e| Fail::bad_request(format!("rate: {e}")))?;
                }
                if *canary == Some(0) {
                    return Err(Fail::bad_request("the canary must be at least 1 message"));
                }
                if canary_wait_ms.is_some_and(|w| w > MAX_CANARY_WAIT_MS) {
                    return Err(Fail::bad_request(format!(
                        "the canary waits at most {} h: the job holds the DLQ while it waits",
                        MAX_CANARY_WAIT_MS / 3_600_000
                    )));
                }
            }
            Action::Export => {}
        }
        Ok(())
    }
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Reading or moving.
    Running,
    /// Done: every selected message of the snapshot handled.
    Done,
    /// Stopped by an error, a failed canary or refused copies.
    Failed,
    /// Cancelled (from the page, or the server stopping).
    Cancelled,
}

/// A job as the page and the API show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobView {
    /// Its id.
    pub id: u64,
    /// What it does.
    #[serde(flatten)]
    pub action: Action,
    /// To which messages.
    #[serde(flatten)]
    pub selection: Selection,
    /// The pipeline.
    pub pipeline: String,
    /// The DLQ.
    pub dlq: String,
    /// Where it is.
    pub state: State,
    /// How far it is.
    pub progress: Progress,
    /// The command's report (as its `--json` prints it), once finished.
    pub report: Option<serde_json::Value>,
    /// Why it failed.
    pub error: Option<String>,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// How long it has run, or ran.
    pub elapsed_ms: u64,
    /// The export's download address, once written.
    pub download: Option<String>,
}

impl JobView {
    /// What the DLQ holds while this job runs, from its ready count
    /// `ready`. A running job holds messages unacked (those it has read,
    /// and those the broker has sent it ahead), and they are still in the
    /// DLQ until it removes them: only a replay's and a purge's `done`
    /// leave; an export removes nothing. Two lower bounds, the larger
    /// taken: the snapshot less what left, and the ready count plus what
    /// was read less what left.
    pub fn dlq_holds(&self, ready: u64) -> u64 {
        if self.state != State::Running {
            return ready;
        }
        let left = match self.action {
            Action::Export => 0,
            _ => self.progress.done,
        };
        let p = &self.progress;
        (ready + p.read)
            .saturating_sub(left)
            .max(p.total.saturating_sub(left))
    }
}

struct Inner {
    state: State,
    progress: Progress,
    report: Option<serde_json::Value>,
    error: Option<String>,
    finished: Option<Instant>,
}

/// One job.
pub struct Job {
    id: u64,
    request: Request,
    pipeline: String,
    dlq: String,
    started_at: String,
    started: Instant,
    /// Cancels it.
    pub cancel: CancellationToken,
    file: Option<PathBuf>,
    inner: Mutex<Inner>,
}

impl Job {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether it still runs.
    pub fn running(&self) -> bool {
        self.lock().state == State::Running
    }

    /// Its export file, once the export is done (a cancelled or failed
    /// export offers nothing: its file is partial, or was never made).
    pub fn download_file(&self) -> Option<(PathBuf, String)> {
        let done = self.lock().state == State::Done;
        let file = self.file.clone().filter(|_| done)?;
        let name = format!("{}-export-{}.jsonl", self.dlq, self.id);
        Some((file, name))
    }

    /// What the page shows of it.
    pub fn view(&self) -> JobView {
        let i = self.lock();
        let elapsed = i
            .finished
            .unwrap_or_else(Instant::now)
            .duration_since(self.started);
        JobView {
            id: self.id,
            action: self.request.action.clone(),
            selection: self.request.selection.clone(),
            pipeline: self.pipeline.clone(),
            dlq: self.dlq.clone(),
            state: i.state,
            progress: i.progress.clone(),
            report: i.report.clone(),
            error: i.error.clone(),
            started_at: self.started_at.clone(),
            elapsed_ms: elapsed.as_millis() as u64,
            download: (self.file.is_some() && i.state == State::Done)
                .then(|| format!("/jobs/{}/download", self.id)),
        }
    }

    fn finish(&self, state: State, report: Option<serde_json::Value>, error: Option<String>) {
        let mut i = self.lock();
        i.state = state;
        i.report = report;
        i.error = error;
        i.finished = Some(Instant::now());
    }
}

/// Every job of this server run.
pub struct Jobs {
    list: Mutex<Vec<Arc<Job>>>,
    next: std::sync::atomic::AtomicU64,
    tracker: TaskTracker,
    dir: PathBuf,
}

impl Jobs {
    /// No jobs yet; exports go to a new private folder under the system's
    /// temporary folder, removed when the server stops.
    pub(crate) fn new() -> Self {
        sweep_stale_exports(&std::env::temp_dir());
        let dir = std::env::temp_dir().join(format!(
            "{EXPORT_DIR_PREFIX}{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        Jobs {
            list: Mutex::new(Vec::new()),
            next: std::sync::atomic::AtomicU64::new(1),
            tracker: TaskTracker::new(),
            dir,
        }
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Job>>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The job `id`.
    pub fn get(&self, id: u64) -> Option<Arc<Job>> {
        self.list().iter().find(|j| j.id == id).cloned()
    }

    /// Every job, newest first.
    pub fn all(&self) -> Vec<JobView> {
        self.list().iter().rev().map(|j| j.view()).collect()
    }

    /// The job running on `pipeline`'s DLQ, when one is.
    pub fn running_on(&self, pipeline: &str) -> Option<u64> {
        self.list()
            .iter()
            .find(|j| j.pipeline == pipeline && j.running())
            .map(|j| j.id)
    }

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
            started_at: crate::core::values::text::rfc3339_millis(crate::ops::dlq::now_ms()),
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

    /// Forgets the oldest finished jobs past [`KEEP_FINISHED`], and their
    /// export files.
    fn evict(&self, list: &mut Vec<Arc<Job>>) {
        while list.iter().filter(|j| !j.running()).count() > KEEP_FINISHED {
            let Some(at) = list.iter().position(|j| !j.running()) else {
                break;
            };
            let gone = list.remove(at);
            if let Some(f) = &gone.file {
                let _ = std::fs::remove_file(f);
            }
        }
    }

    /// Cancels every job and waits for each to stop; removes the export
    /// folder.
    pub async fn wait_all(&self) {
        for j in self.list().iter() {
            j.cancel.cancel();
        }
        self.tracker.close();
        self.tracker.wait().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Creates the export folder, readable by this user only.
    fn export_dir(&self) -> std::io::Result<&std::path::Path> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(&self.dir),
        }
    }
}

/// Runs one job to its end state, report and error.
async fn run(
    app: &Arc<App>,
    job: &Arc<Job>,
    p: &crate::core::topology::Pipeline,
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
            let opts = ReplayOptions {
                selector,
                limit: job.request.selection.limit(),
                rate: *rate,
                to: p.name.clone(),
                dry_run: false,
                canary: canary.map(|count| Canary {
                    count,
                    wait: canary_wait_ms
                        .map(Duration::from_millis)
                        .unwrap_or_else(|| crate::ops::dlq::replay::default_canary_wait(p)),
                }),
                replay_id: crate::ops::dlq::replay::new_replay_id(),
            };
            crate::ops::dlq::replay::replay(&t, &opts, &mut { progress })
                .await
                .map(|r| {
                    let state = match (&r.canary, &r.stopped) {
                        _ if r.cancelled => State::Cancelled,
                        (Some(c), _) if !c.passed => State::Failed,
                        (_, Some(_)) => State::Failed,
                        _ => State::Done,
                    };
                    let error = r.stopped.clone().or_else(|| {
                        r.canary
                            .as_ref()
                            .filter(|c| !c.passed && !r.cancelled)
                            .map(|c| {
                                format!(
                                    "the canary failed: {} of {} replayed messages came back \
                                     to the DLQ; the rest was not replayed",
                                    c.came_back, c.sent
                                )
                            })
                    });
                    (state, serde_json::to_value(&r).ok(), error)
                })
        }
        Action::Export => export(app, job, &t, selector, progress).await,
        Action::Purge { expected } => crate::ops::dlq::purge::purge(
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
    crate::amqp::connection::close(&t.conn).await;
    match result {
        Ok(r) => r,
        Err(e) if job.cancel.is_cancelled() => (State::Cancelled, None, Some(e.to_string())),
        Err(e) => (
            State::Failed,
            None,
            Some(super::state::for_the_page(e).to_string()),
        ),
    }
}

type Ended = (State, Option<serde_json::Value>, Option<String>);

/// An export into the job's file (kept: the page exports, it does not
/// archive).
async fn export(
    app: &Arc<App>,
    job: &Arc<Job>,
    t: &crate::ops::dlq::Target,
    selector: Selector,
    progress: impl FnMut(&Progress) + Send,
) -> crate::error::Result<Ended> {
    let write_err = |e: std::io::Error| crate::error::Error::Write {
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
    let r = crate::ops::dlq::export::export(t, &opts, &mut sink, &mut { progress }).await?;
    let (state, error) = if r.cancelled {
        (State::Cancelled, None)
    } else if r.failed > 0 {
        // A file missing messages is no export: none is offered.
        (
            State::Failed,
            Some(format!(
                "{} messages could not be written as export lines (see the report); they are \
                 still in the DLQ, and no file is offered",
                r.failed
            )),
        )
    } else {
        (State::Done, None)
    };
    Ok((state, serde_json::to_value(&r).ok(), error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(action: Action, total: u64, read: u64, done: u64) -> JobView {
        JobView {
            id: 1,
            action,
            selection: Default::default(),
            pipeline: "p".into(),
            dlq: "p.dlq".into(),
            state: State::Running,
            progress: Progress {
                total,
                read,
                selected: read,
                done,
                failed: 0,
            },
            report: None,
            error: None,
            started_at: String::new(),
            elapsed_ms: 0,
            download: None,
        }
    }

    #[test]
    fn what_the_dlq_holds_counts_what_a_running_job_has_not_removed() {
        let replay = Action::Replay {
            rate: None,
            canary: None,
            canary_wait_ms: None,
        };
        // 100 in the snapshot; the broker sent 60 ahead, 40 read, 30 moved.
        assert_eq!(running(replay.clone(), 100, 40, 30).dlq_holds(40), 70);
        // An export removes nothing: all 100 are still there.
        assert_eq!(running(Action::Export, 100, 40, 40).dlq_holds(0), 100);
        // New dead letters arrived: the ready count says more.
        assert_eq!(running(replay.clone(), 100, 100, 100).dlq_holds(7), 7);
        // A finished job holds nothing.
        let mut done = running(replay, 100, 100, 100);
        done.state = State::Done;
        assert_eq!(done.dlq_holds(3), 3);
    }

    #[test]
    fn requests_read_from_json_as_the_api_documents_them() {
        let r: Request =
            serde_json::from_str(r#"{"action":"replay","group":"g1","rate":50,"canary":10}"#)
                .unwrap();
        assert_eq!(
            r,
            Request {
                action: Action::Replay {
                    rate: Some(50.0),
                    canary: Some(10),
                    canary_wait_ms: None
                },
                selection: Selection {
                    group: Some("g1".into()),
                    message_ids: vec![]
                }
            }
        );
        let r: Request =
            serde_json::from_str(r#"{"action":"purge","expected":3,"message_ids":["a","b"]}"#)
                .unwrap();
        assert_eq!(r.action, Action::Purge { expected: 3 });
        assert_eq!(r.selection.selector().message_ids, vec!["a", "b"]);
        assert!(serde_json::from_str::<Request>(r#"{"action":"drop"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"action":"purge"}"#).is_err());
    }

    #[test]
    fn the_export_folders_of_servers_that_are_gone_are_swept() {
        let tmp = std::env::temp_dir().join(format!("dlqctl-sweep-test-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&tmp).unwrap();
        let gone = tmp.join(format!("{EXPORT_DIR_PREFIX}999999999-0000abcd"));
        let alive = tmp.join(format!(
            "{EXPORT_DIR_PREFIX}{}-0000abcd",
            std::process::id()
        ));
        let other = tmp.join("dlqctl-serve-notapid-1");
        for d in [&gone, &alive, &other] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("job-1.jsonl"), "{}").unwrap();
        }
        sweep_stale_exports(&tmp);
        assert!(!gone.exists());
        assert!(alive.exists());
        assert!(other.exists());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn a_selection_of_ids_takes_one_message_per_distinct_id() {
        let sel = |ids: &[&str]| Selection {
            group: Some("g".into()),
            message_ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(sel(&[]).limit(), None);
        assert_eq!(sel(&["a"]).limit(), Some(1));
        assert_eq!(sel(&["a", "b", "a"]).limit(), Some(2));
    }

    #[test]
    fn the_page_never_purges_a_whole_dlq_and_checks_numbers() {
        let purge = |expected, group: Option<&str>| Request {
            action: Action::Purge { expected },
            selection: Selection {
                group: group.map(str::to_string),
                message_ids: vec![],
            },
        };
        assert!(purge(5, None).check().is_err());
        assert!(purge(0, Some("g")).check().is_err());
        assert!(purge(5, Some("g")).check().is_ok());
        let replay = |rate: Option<f64>, canary| Request {
            action: Action::Replay {
                rate,
                canary,
                canary_wait_ms: None,
            },
            selection: Selection::default(),
        };
        assert!(replay(None, None).check().is_ok());
        assert!(replay(Some(0.0), None).check().is_err());
        assert!(replay(Some(f64::NAN), None).check().is_err());
        assert!(replay(Some(f64::INFINITY), None).check().is_err());
        assert!(replay(None, Some(0)).check().is_err());
        assert!(replay(Some(10.5), Some(3)).check().is_ok());
        let waits = |ms| Request {
            action: Action::Replay {
                rate: None,
                canary: Some(1),
                canary_wait_ms: Some(ms),
            },
            selection: Selection::default(),
        };
        assert!(waits(MAX_CANARY_WAIT_MS).check().is_ok());
        assert!(waits(MAX_CANARY_WAIT_MS + 1).check().is_err());
    }
}
