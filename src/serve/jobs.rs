//! The page's actions as background jobs: replay, export and purge, each
//! the library call of its `dlqctl dlq` command on a connection of its own,
//! with its progress readable while it runs and a cancel that stops it
//! after the copies in flight (what it had not settled stays in the DLQ).
//!
//! One job at a time per DLQ: the server refuses a second one on a DLQ it
//! is already working on, and the DLQ's lock refuses it when another
//! `dlqctl` holds the DLQ.

use super::common::Fail;
use dlqctl::core::dlq::select::Selector;
use dlqctl::core::wire::SERVE_EXPORT_DIR_PREFIX;
use dlqctl::ops::dlq::Progress;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
            .and_then(|n| n.strip_prefix(SERVE_EXPORT_DIR_PREFIX))
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
                    dlqctl::core::dlq::rate::check_rate(*r)
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

pub(super) struct Inner {
    pub(super) state: State,
    pub(super) progress: Progress,
    pub(super) report: Option<serde_json::Value>,
    pub(super) error: Option<String>,
    pub(super) finished: Option<Instant>,
}

/// One job.
pub struct Job {
    pub(super) id: u64,
    pub(super) request: Request,
    pub(super) pipeline: String,
    pub(super) dlq: String,
    pub(super) started_at: String,
    pub(super) started: Instant,
    /// Cancels it.
    pub cancel: CancellationToken,
    pub(super) file: Option<PathBuf>,
    pub(super) inner: Mutex<Inner>,
}

impl Job {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
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

    pub(super) fn finish(
        &self,
        state: State,
        report: Option<serde_json::Value>,
        error: Option<String>,
    ) {
        let mut i = self.lock();
        i.state = state;
        i.report = report;
        i.error = error;
        i.finished = Some(Instant::now());
    }
}

/// Every job of this server run.
pub struct Jobs {
    pub(super) list: Mutex<Vec<Arc<Job>>>,
    pub(super) next: std::sync::atomic::AtomicU64,
    pub(super) tracker: TaskTracker,
    pub(super) dir: PathBuf,
}

impl Jobs {
    /// No jobs yet; exports go to a new private folder under the system's
    /// temporary folder, removed when the server stops.
    pub(crate) fn new() -> Self {
        sweep_stale_exports(&std::env::temp_dir());
        let dir = std::env::temp_dir().join(format!(
            "{SERVE_EXPORT_DIR_PREFIX}{}-{:08x}",
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

    pub(super) fn list(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Job>>> {
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

    /// Forgets the oldest finished jobs past [`KEEP_FINISHED`], and their
    /// export files.
    pub(super) fn evict(&self, list: &mut Vec<Arc<Job>>) {
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
    pub(super) fn export_dir(&self) -> std::io::Result<&std::path::Path> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(&self.dir),
        }
    }
}

/// The job a `/jobs/{id}` address names: 404 for an id that is no
/// number or no job of this server run.
pub(crate) fn job_at(
    jobs: &Jobs,
    path: Result<axum::extract::Path<u64>, axum::extract::rejection::PathRejection>,
) -> Result<Arc<Job>, Fail> {
    let Ok(axum::extract::Path(id)) = path else {
        return Err(Fail::not_found("no such job: job ids are numbers"));
    };
    jobs.get(id)
        .ok_or_else(|| Fail::not_found(format!("no job {id} (jobs live as long as the server)")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlqctl::core::wire::TEMP_PREFIX;

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
        let tmp =
            std::env::temp_dir().join(format!("{TEMP_PREFIX}sweep-test-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&tmp).unwrap();
        let gone = tmp.join(format!("{SERVE_EXPORT_DIR_PREFIX}999999999-0000abcd"));
        let alive = tmp.join(format!(
            "{SERVE_EXPORT_DIR_PREFIX}{}-0000abcd",
            std::process::id()
        ));
        let other = tmp.join(format!("{SERVE_EXPORT_DIR_PREFIX}notapid-1"));
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
