//! Automatic redrive, one run (docs/dlq.md, "Automatic redrive"): under a
//! lock of its own, after the optional health probe, a `dlq replay` of the
//! messages the policy finds eligible, with the policy's rate and canary.
//! The rules are the core's ([`crate::core::dlq::redrive`]); the reading,
//! the DLQ's lock, the window, the confirms and the acks are the replay's.
//! `dlqctl dlq redrive`, the worker's timer and `dlqctl serve` all call
//! [`redrive`].

use super::reader::hold_exclusive;
use super::replay::{
    default_canary_wait, new_replay_id, replay_with, Canary, CanaryReport, ReplayHooks,
    ReplayOptions,
};
use super::{Message, Target};
use crate::core::dlq::redrive::{
    next_wait, redrive_copy, verdict, CanaryRule, RunEnd, RunResult, Seen, Verdict,
};
use crate::core::dlq::redrive_state::{RedriveState, RunRecord};
use crate::core::dlq::select::Selector;
use crate::core::topology::{Pipeline, Redrive};
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

use crate::ops::health::probe;

/// What one redrive run did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RedriveReport {
    /// The pipeline.
    pub queue: String,
    /// Its DLQ.
    pub dlq: String,
    /// What the run came to.
    pub result: RunResult,
    /// Messages moved back to the main queue (canaries included).
    pub moved: u64,
    /// Messages past `max_redrives` seen by the run's last read of the
    /// DLQ (the whole DLQ unless the run stopped early: `None` when it
    /// read none).
    pub waiting_for_person: Option<u64>,
    /// The canary, when the policy has one and something was eligible.
    pub canary: Option<CanaryReport>,
    /// The health probe's answer, when the policy has one.
    pub health: Option<String>,
    /// Why the run did not move what was eligible (busy, unhealthy, an
    /// error), in words.
    pub why: Option<String>,
    /// The run's replay id (`dlqctl-replay-id` on its copies).
    pub replay_id: String,
    /// How long to wait before the next look, in ms: the pipeline's
    /// shared wait when it is kept ([`RedriveReport::shared`]).
    pub next_wait_ms: u64,
    /// Wall time, in ms.
    pub elapsed_ms: u64,
    /// When the run found itself due and began, ms since the Unix epoch
    /// (0 for a busy turn).
    pub started_at_ms: u64,
    /// When it ended, ms since the Unix epoch: the time it recorded in the
    /// shared state when it wrote one (the next run's wait counts from
    /// there), else the end of its work.
    pub ended_at_ms: u64,
    /// The pipeline's shared redrive state after the run (`None`: not
    /// read or not written; see [`RedriveReport::shared_unavailable`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<RedriveState>,
    /// Why the shared state was not used, when it was not (its queue is
    /// missing, or the broker refused it): the wait is then this
    /// process's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_unavailable: Option<String>,
}

impl RedriveReport {
    /// The report of a run of `pipeline` on the DLQ of `t` that ended so,
    /// before its times, its numbers and the shared state are added.
    fn ended(pipeline: &Pipeline, t: &Target, replay_id: String, end: RunEnd) -> RedriveReport {
        RedriveReport {
            queue: pipeline.name.clone(),
            dlq: t.dlq.clone(),
            result: end.result(),
            moved: 0,
            waiting_for_person: None,
            canary: None,
            health: None,
            why: end.why().map(str::to_string),
            replay_id,
            next_wait_ms: 0,
            elapsed_ms: 0,
            started_at_ms: 0,
            ended_at_ms: 0,
            shared: None,
            shared_unavailable: None,
        }
    }
}

/// What a look at the DLQ came to: a run, or nothing because the
/// pipeline's shared wait has not passed yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// A run happened (or was skipped as busy).
    Ran(Box<RedriveReport>),
    /// The shared wait has not passed: nothing was done.
    NotDue {
        /// The shared state as read.
        state: RedriveState,
        /// How long until the next look is due, in ms.
        remaining_ms: u64,
    },
}

/// The name of the lock a redrive run holds for its whole length, canary
/// wait included (the DLQ's own lock is held only while a pass reads).
pub fn redrive_lock_name(dlq: &str) -> String {
    format!("dlqctl.redrive.{dlq}")
}

/// The policy's choices inside a replay; it counts the messages waiting
/// for a person in the pass that read last.
struct Hooks<'a> {
    policy: &'a Redrive,
    waiting: Option<u64>,
}

impl Hooks<'_> {
    fn verdict(&self, m: &Message, now: u64) -> Verdict {
        let seen = Seen::of(&m.described, m.record.properties.headers().as_ref());
        verdict(self.policy, &seen, now)
    }
}

impl ReplayHooks for Hooks<'_> {
    fn pass_started(&mut self) {
        self.waiting = Some(0);
    }

    fn seen(&mut self, m: &Message, now: u64) {
        if self.verdict(m, now) == Verdict::WaitingForPerson {
            self.waiting = Some(self.waiting.unwrap_or(0) + 1);
        }
    }

    fn reads_headers(&self) -> bool {
        true
    }

    fn select(&mut self, m: &Message, now: u64) -> bool {
        self.verdict(m, now) == Verdict::Eligible
    }

    fn copy(
        &self,
        original: &lapin::BasicProperties,
        connection_user: &str,
        replay_id: &str,
        now_unix_ms: u64,
    ) -> lapin::BasicProperties {
        redrive_copy(original, connection_user, replay_id, now_unix_ms)
    }

    fn canary_rule(&self) -> CanaryRule {
        CanaryRule::Automatic
    }
}

/// Runs the policy of `pipeline` once on the DLQ of `t`, now (`dlq
/// redrive`, `dlqctl serve`); `previous_wait_ms` is the wait that came
/// before, used only when the pipeline's shared state cannot be (for
/// [`RedriveReport::next_wait_ms`]). A DLQ held by another run or command
/// is [`RunResult::Busy`]; a run that stops on an error is
/// [`RunResult::Failed`] with the error in [`RedriveReport::why`]; only a
/// pipeline without a policy is an `Err`.
pub async fn redrive(
    t: &Target,
    pipeline: &Pipeline,
    previous_wait_ms: u64,
) -> Result<RedriveReport> {
    match turn(t, pipeline, previous_wait_ms, false).await? {
        Turn::Ran(r) => Ok(*r),
        // Not asked to wait: a run always happens.
        Turn::NotDue { .. } => Err(Error::Usage(
            "a redrive run asked for now was not due".into(),
        )),
    }
}

/// The worker's look: runs the policy once if the pipeline's shared wait
/// has passed ([`Turn::Ran`]), else does nothing ([`Turn::NotDue`]).
pub async fn redrive_if_due(
    t: &Target,
    pipeline: &Pipeline,
    previous_wait_ms: u64,
) -> Result<Turn> {
    turn(t, pipeline, previous_wait_ms, true).await
}

async fn turn(
    t: &Target,
    pipeline: &Pipeline,
    previous_wait_ms: u64,
    if_due: bool,
) -> Result<Turn> {
    let started = Instant::now();
    let Some(policy) = pipeline.dead_letter.redrive.as_ref() else {
        return Err(Error::Usage(format!(
            "pipeline {} has no redrive policy: add `dead_letter: \
             {{redrive: {{}}}}` to it (or to defaults) in the topology file",
            pipeline.name
        )));
    };
    let replay_id = new_replay_id();
    let lock = redrive_lock_name(&t.dlq);
    let held = match hold_exclusive(&t.conn, &lock).await {
        Ok(Some(ch)) => ch,
        Ok(None) => {
            let busy = RunEnd::Busy(format!("another redrive run holds {lock}"));
            let mut report = RedriveReport::ended(pipeline, t, replay_id, busy);
            report.next_wait_ms = policy.every;
            report.elapsed_ms = started.elapsed().as_millis() as u64;
            report.ended_at_ms = super::now_ms();
            return Ok(Turn::Ran(Box::new(report)));
        }
        Err(e) => {
            let failed = RunEnd::Failed(e.to_string());
            let mut report = RedriveReport::ended(pipeline, t, replay_id, failed);
            report.next_wait_ms = next_wait(policy.every, previous_wait_ms, RunResult::Failed);
            report.elapsed_ms = started.elapsed().as_millis() as u64;
            report.ended_at_ms = super::now_ms();
            return Ok(Turn::Ran(Box::new(report)));
        }
    };
    let state_queue = pipeline.redrive_state_queue();
    let (before, shared_unavailable) = read_shared(t, &state_queue, policy.every).await;
    let looked_at = super::now_ms();
    let not_due = before.as_ref().and_then(|s| {
        let remaining_ms = s.remaining_ms(policy.every, looked_at);
        (if_due && remaining_ms > 0).then(|| Turn::NotDue {
            state: s.clone(),
            remaining_ms,
        })
    });
    if let Some(n) = not_due {
        unlock(held, &lock).await;
        return Ok(n);
    }
    let run = locked(t, pipeline, policy, &replay_id).await;
    let result = run.end.result();
    let mut report = RedriveReport {
        moved: run.moved,
        waiting_for_person: run.waiting_for_person,
        canary: run.canary,
        health: run.health,
        next_wait_ms: next_wait(policy.every, previous_wait_ms, result),
        started_at_ms: looked_at,
        ended_at_ms: super::now_ms(),
        shared_unavailable,
        ..RedriveReport::ended(pipeline, t, replay_id, run.end)
    };
    // A run cut short by a stop (SIGTERM) is no result: the state stays
    // as it was.
    let stopped = t.read.cancel.is_cancelled();
    if let (Some(before), false, false) = (before, result == RunResult::Busy, stopped) {
        write_shared(t, &state_queue, policy.every, before, &mut report).await;
    }
    unlock(held, &lock).await;
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(Turn::Ran(Box::new(report)))
}

/// Deletes the lock queue, then closes its channel (the broker deletes an
/// exclusive queue when its connection ends, not its channel).
async fn unlock(held: lapin::Channel, lock: &str) {
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        held.queue_delete(lock.into(), Default::default()),
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(5), held.close(200, "done".into())).await;
}

/// The shared state as the run starts (a fresh one when the queue holds
/// none); `None`, with why (for [`RedriveReport::shared_unavailable`]),
/// when it cannot be read. Nothing stays held: the run holds the redrive
/// lock, and only a run under it writes.
async fn read_shared(
    t: &Target,
    queue: &str,
    every_ms: u64,
) -> (Option<RedriveState>, Option<String>) {
    match super::redrive_state::read(&t.conn, queue, true).await {
        Ok(Some(held)) => {
            let state = held
                .state
                .clone()
                .unwrap_or_else(|| RedriveState::fresh(every_ms, super::now_ms()));
            held.release().await;
            (Some(state), None)
        }
        Ok(None) => (
            None,
            Some(format!(
                "queue {queue} does not exist: run `dlqctl provision` on the topology file to \
                 share the redrive wait between the pipeline's workers"
            )),
        ),
        Err(e) => (None, Some(e.to_string())),
    }
}

/// Writes the state after the run: read again (under the lock), the run
/// recorded, published, then the old message acked. `before` is the state
/// the run started from, still the newest (the run held the lock): it is
/// used when the read finds nothing (a reader holding the message), so
/// the record and the wait are never written over a fresh state.
async fn write_shared(
    t: &Target,
    queue: &str,
    every_ms: u64,
    before: RedriveState,
    report: &mut RedriveReport,
) {
    let written = async {
        let held = super::redrive_state::read(&t.conn, queue, true)
            .await?
            .ok_or_else(|| Error::Broker {
                context: format!("cannot write the redrive state to {queue}"),
                message: "the queue is gone".into(),
            })?;
        let now = super::now_ms();
        let last = match &held.state {
            Some(s) if s.seq >= before.seq => s.clone(),
            _ => before,
        };
        let next = last.after(every_ms, record(report, &t.tag, now), now);
        held.replace(&t.conn, &next).await?;
        Ok::<_, Error>(next)
    }
    .await;
    match written {
        Ok(next) => {
            report.next_wait_ms = next.wait_ms;
            if let Some(run) = next.runs.first() {
                report.ended_at_ms = run.at_ms;
            }
            report.shared = Some(next);
        }
        Err(e) => report.shared_unavailable = Some(e.to_string()),
    }
}

/// What the shared state keeps of a run.
fn record(r: &RedriveReport, by: &str, now: u64) -> RunRecord {
    RunRecord {
        result: r.result,
        at_ms: now,
        moved: r.moved,
        waiting_for_person: r.waiting_for_person,
        canary: r.canary.as_ref().map(|c| (c.sent, c.came_back)),
        why: r.why.clone(),
        by: by.to_string(),
    }
    .trimmed()
}

/// What a run did under its lock, for its [`RedriveReport`].
struct UnderLock {
    /// How it ended.
    end: RunEnd,
    moved: u64,
    waiting_for_person: Option<u64>,
    canary: Option<CanaryReport>,
    health: Option<String>,
}

impl UnderLock {
    /// A run that ended before its replay moved anything or read the DLQ.
    fn nothing(end: RunEnd, health: Option<String>) -> UnderLock {
        UnderLock {
            end,
            moved: 0,
            waiting_for_person: None,
            canary: None,
            health,
        }
    }
}

/// The run, its lock held.
async fn locked(t: &Target, pipeline: &Pipeline, policy: &Redrive, replay_id: &str) -> UnderLock {
    let mut health = None;
    if let Some(url) = &policy.health {
        let (healthy, said) = probe(url).await;
        health = Some(said.clone());
        if !healthy {
            let shown = reqwest::Url::parse(url)
                .map(|u| crate::handler::http::redacted(&u))
                .unwrap_or_else(|_| "(an invalid URL)".into());
            let why = format!("the health probe {shown} answered {said}");
            return UnderLock::nothing(RunEnd::Unhealthy(why), health);
        }
    }
    let opts = ReplayOptions {
        rate: Some(policy.rate),
        canary: (policy.canary > 0).then(|| Canary {
            count: policy.canary,
            wait: default_canary_wait(pipeline),
        }),
        ..ReplayOptions::new(&pipeline.name, Selector::default(), replay_id)
    };
    let mut hooks = Hooks {
        policy,
        waiting: None,
    };
    let replayed = replay_with(t, &opts, &mut hooks, &mut |_| {}).await;
    let r = match replayed {
        Ok(r) => r,
        Err(e) => {
            let end = match e {
                Error::Busy { message, .. } => RunEnd::Busy(message),
                e => RunEnd::Failed(e.to_string()),
            };
            return UnderLock {
                waiting_for_person: hooks.waiting,
                ..UnderLock::nothing(end, health)
            };
        }
    };
    let canary = r.canary.as_ref().map(|c| (c.sent, c.came_back));
    UnderLock {
        end: RunEnd::after_replay(r.moved, canary, &r.ended),
        moved: r.moved,
        waiting_for_person: hooks.waiting,
        canary: r.canary,
        health,
    }
}
