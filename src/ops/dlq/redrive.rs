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
    canary_passed, next_wait, redrive_copy, verdict, RunResult, Seen, Verdict,
};
use crate::core::dlq::select::Selector;
use crate::core::topology::{Pipeline, Redrive};
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

use crate::ops::health::probe;

/// What one redrive run did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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
    /// How long to wait before the next look, in ms.
    pub next_wait_ms: u64,
    /// Wall time, in ms.
    pub elapsed_ms: u64,
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

    fn canary_passed(&self, sent: u64, came_back: u64) -> bool {
        canary_passed(sent, came_back)
    }
}

/// Runs the policy of `pipeline` once on the DLQ of `t`; `previous_wait_ms`
/// is the wait that came before (for [`RedriveReport::next_wait_ms`]).
/// A DLQ held by another run or command is [`RunResult::Busy`]; a run
/// that stops on an error is [`RunResult::Failed`] with the error in
/// [`RedriveReport::why`]; only a pipeline without a policy is an `Err`.
pub async fn redrive(
    t: &Target,
    pipeline: &Pipeline,
    previous_wait_ms: u64,
) -> Result<RedriveReport> {
    let started = Instant::now();
    let Some(policy) = pipeline.dead_letter.redrive.as_ref() else {
        return Err(Error::Usage(format!(
            "pipeline {} has no redrive policy: add `dead_letter: {{redrive: {{}}}}` to it (or \
             to defaults) in the topology file",
            pipeline.name
        )));
    };
    let mut report = RedriveReport {
        queue: pipeline.name.clone(),
        dlq: t.dlq.clone(),
        result: RunResult::Failed,
        moved: 0,
        waiting_for_person: None,
        canary: None,
        health: None,
        why: None,
        replay_id: new_replay_id(),
        next_wait_ms: 0,
        elapsed_ms: 0,
    };
    let (result, why) = run(t, pipeline, policy, &mut report).await;
    report.result = result;
    report.why = why;
    report.next_wait_ms = next_wait(policy.every, previous_wait_ms, result);
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// The run itself: its result, and why when it moved nothing it could.
async fn run(
    t: &Target,
    pipeline: &Pipeline,
    policy: &Redrive,
    report: &mut RedriveReport,
) -> (RunResult, Option<String>) {
    let lock = redrive_lock_name(&t.dlq);
    let held = match hold_exclusive(&t.conn, &lock).await {
        Ok(Some(ch)) => ch,
        Ok(None) => {
            return (
                RunResult::Busy,
                Some(format!("another redrive run holds {lock}")),
            )
        }
        Err(e) => return (RunResult::Failed, Some(e.to_string())),
    };
    let outcome = locked(t, pipeline, policy, report).await;
    // The broker deletes an exclusive queue when its connection ends, not
    // its channel: delete it, then close the channel.
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        held.queue_delete(lock.as_str().into(), Default::default()),
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(5), held.close(200, "done".into())).await;
    outcome
}

/// The run, its lock held.
async fn locked(
    t: &Target,
    pipeline: &Pipeline,
    policy: &Redrive,
    report: &mut RedriveReport,
) -> (RunResult, Option<String>) {
    if let Some(url) = &policy.health {
        let (healthy, said) = probe(url).await;
        report.health = Some(said.clone());
        if !healthy {
            let shown = reqwest::Url::parse(url)
                .map(|u| crate::handler::http::redacted(&u))
                .unwrap_or_else(|_| "(an invalid URL)".into());
            return (
                RunResult::Unhealthy,
                Some(format!("the health probe {shown} answered {said}")),
            );
        }
    }
    let opts = ReplayOptions {
        selector: Selector::default(),
        limit: None,
        rate: Some(policy.rate),
        to: pipeline.name.clone(),
        dry_run: false,
        canary: (policy.canary > 0).then(|| Canary {
            count: policy.canary,
            wait: default_canary_wait(pipeline),
        }),
        replay_id: report.replay_id.clone(),
    };
    let mut hooks = Hooks {
        policy,
        waiting: None,
    };
    let replayed = replay_with(t, &opts, &mut hooks, &mut |_| {}).await;
    report.waiting_for_person = hooks.waiting;
    let r = match replayed {
        Ok(r) => r,
        Err(Error::Busy { message, .. }) => return (RunResult::Busy, Some(message)),
        Err(e) => return (RunResult::Failed, Some(e.to_string())),
    };
    report.moved = r.moved;
    report.canary = r.canary.clone();
    let result = RunResult::of(r.moved, r.canary.as_ref().map(|c| (c.sent, c.came_back)));
    if r.cancelled {
        return (RunResult::Failed, Some("stopped (SIGINT, SIGTERM)".into()));
    }
    match (result, r.stopped) {
        (RunResult::CanaryFailed, why) => (result, why),
        (_, Some(why)) => (RunResult::Failed, Some(why)),
        (_, None) => (result, None),
    }
}
