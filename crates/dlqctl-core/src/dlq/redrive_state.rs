//! The redrive state a pipeline's workers share (docs/dlq.md, "The
//! shared wait"): the wait before the next look at the DLQ, when that look
//! is due, and the last runs. It lives in the broker, as the one message
//! of the pipeline's classic queue `NAME.redrive-state`, so every worker of
//! the pipeline follows one wait and a restarted worker finds it again.
//! Only a run that holds the redrive lock replaces it (publish the new
//! message, confirmed, then ack the old one), so its sequence number grows
//! by one per run; a crash between the two leaves two messages, and the
//! newest ([`newest`]) wins. This module decides; the shell reads and
//! writes the queue.

use super::redrive::{next_wait, RunResult, MAX_WAIT_MS};

/// The state's format version; a message of another version is ignored
/// (and replaced by the next run).
pub(crate) const STATE_VERSION: u32 = 1;

/// How many runs the state keeps, newest first.
pub(crate) const HISTORY: usize = 10;

/// How far a due time may lie beyond the wait that set it before it is
/// taken for a clock that is off: a minute.
pub(crate) const CLOCK_SLACK_MS: u64 = 60_000;

/// The longest `why` a run record keeps, in bytes.
pub(crate) const WHY_MAX: usize = 256;

/// One finished run, as the state keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// What it came to.
    pub result: RunResult,
    /// When it ended, ms since the Unix epoch (the writer's clock).
    pub at_ms: u64,
    /// Messages moved back (canaries included).
    pub moved: u64,
    /// Messages past `max_redrives` the run saw (`None`: it read none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for_person: Option<u64>,
    /// Canaries sent and come back, when there was a canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<(u64, u64)>,
    /// Why it did not move what was eligible, cut to `WHY_MAX` bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Who ran it (the connection's name: `dlqctl redrive orders`,
    /// `dlqctl dlq redrive orders`, ...).
    #[serde(default)]
    pub by: String,
}

impl RunRecord {
    /// A record whose `why` fits `WHY_MAX` (cut on a character boundary).
    pub fn trimmed(mut self) -> RunRecord {
        if let Some(w) = &mut self.why {
            if w.len() > WHY_MAX {
                let mut end = WHY_MAX;
                while !w.is_char_boundary(end) {
                    end -= 1;
                }
                w.truncate(end);
            }
        }
        self
    }
}

/// The pipeline's shared redrive state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RedriveState {
    /// `STATE_VERSION`.
    pub version: u32,
    /// One more at every write: the newest state has the largest.
    pub seq: u64,
    /// The current wait between two looks, ms: `every`, doubled after
    /// each failed canary up to an hour.
    pub wait_ms: u64,
    /// When the next look is due, ms since the Unix epoch.
    pub next_look_at_ms: u64,
    /// When this state was written, ms since the Unix epoch.
    pub written_at_ms: u64,
    /// The last runs, newest first, at most `HISTORY`.
    #[serde(default)]
    pub runs: Vec<RunRecord>,
}

impl RedriveState {
    /// The state before any run: due now, the wait `every`.
    pub fn fresh(every_ms: u64, now_ms: u64) -> RedriveState {
        RedriveState {
            version: STATE_VERSION,
            seq: 0,
            wait_ms: every_ms,
            next_look_at_ms: now_ms,
            written_at_ms: now_ms,
            runs: vec![],
        }
    }

    /// How long until the next look is due at `now_ms` (0: due now). A
    /// writer's clock sets the due time a wait after its run, so a due time
    /// further ahead than the wait itself (plus `CLOCK_SLACK_MS`) comes
    /// from a clock far ahead of this one, or a hand-written message: it
    /// counts as due now, and the run that follows writes the state again
    /// on this clock (capping it instead would hold every look back by the
    /// cap again and again).
    pub fn remaining_ms(&self, every_ms: u64, now_ms: u64) -> u64 {
        let left = self.next_look_at_ms.saturating_sub(now_ms);
        let longest = self.wait_ms.max(every_ms).min(MAX_WAIT_MS.max(every_ms));
        if left > longest.saturating_add(CLOCK_SLACK_MS) {
            0
        } else {
            left
        }
    }

    /// The last run, if any.
    pub fn last(&self) -> Option<&RunRecord> {
        self.runs.first()
    }

    /// The state after `run` ended at `now_ms`: the wait doubles after a
    /// failed canary ([`next_wait`]) and comes back to `every` after any
    /// other result; the next look is due a wait from now. A `busy` run
    /// changes nothing (it never holds the lock, so it never writes).
    pub fn after(&self, every_ms: u64, run: RunRecord, now_ms: u64) -> RedriveState {
        if run.result == RunResult::Busy {
            return self.clone();
        }
        let wait_ms = next_wait(every_ms, self.wait_ms, run.result);
        let mut runs = Vec::with_capacity(HISTORY);
        runs.push(run.trimmed());
        runs.extend(self.runs.iter().take(HISTORY - 1).cloned());
        RedriveState {
            version: STATE_VERSION,
            seq: self.seq.saturating_add(1),
            wait_ms,
            next_look_at_ms: now_ms.saturating_add(wait_ms),
            written_at_ms: now_ms,
            runs,
        }
    }

    /// The message body.
    pub fn encode(&self) -> Vec<u8> {
        // A struct of integers, strings and enums: serializing cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A message body read back: `None` for anything that is not a state
    /// of `STATE_VERSION`.
    pub fn decode(body: &[u8]) -> Option<RedriveState> {
        serde_json::from_slice::<RedriveState>(body)
            .ok()
            .filter(|s| s.version == STATE_VERSION)
    }
}

impl RedriveState {
    /// The last run in words, for `doctor` and `drill`: its result, how
    /// long ago, how many runs in a row came to it, what it moved, the
    /// shared wait and the next look, and the messages it found waiting
    /// for a person; with whether it calls for a look (a run that moved
    /// nothing it could: a failed canary, an unhealthy probe, an error; or
    /// messages waiting for a person). `None` before any run.
    pub fn summary(&self, now_ms: u64) -> Option<(bool, String)> {
        use crate::values::duration::tier_name;
        let last = self.last()?;
        let in_a_row = self
            .runs
            .iter()
            .take_while(|r| r.result == last.result)
            .count();
        let secs = |ms: u64| tier_name(ms.max(1000) / 1000 * 1000);
        let next = match self.remaining_ms(self.wait_ms, now_ms) {
            0 => "the next look is due now".to_string(),
            ms => format!("the next look in {}", secs(ms)),
        };
        let waiting = last.waiting_for_person.unwrap_or(0);
        let mut text = format!(
            "last run {} {} ago ({} in a row, {} moved); {next} (shared wait {})",
            last.result.label(),
            secs(now_ms.saturating_sub(last.at_ms)),
            in_a_row,
            last.moved,
            tier_name(self.wait_ms)
        );
        if waiting > 0 {
            text += &format!(
                "; {} past max_redrives wait for a person (`dlqctl dlq replay`)",
                crate::values::text::count(waiting, "message")
            );
        }
        let look = waiting > 0
            || matches!(
                last.result,
                RunResult::CanaryFailed
                    | RunResult::Unhealthy
                    | RunResult::Failed
                    | RunResult::NoCanary
            );
        Some((look, text))
    }
}

/// The newest of the states read (the largest `seq`, then the latest
/// write): a crash between a run's publish and its ack leaves two.
pub fn newest(states: &[RedriveState]) -> Option<&RedriveState> {
    states.iter().max_by_key(|s| (s.seq, s.written_at_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_767_225_600_000;

    fn run(result: RunResult) -> RunRecord {
        RunRecord {
            result,
            at_ms: NOW,
            moved: 0,
            waiting_for_person: None,
            canary: None,
            why: None,
            by: "w1".into(),
        }
    }

    #[test]
    fn a_fresh_state_is_due_now_with_the_wait_every() {
        let s = RedriveState::fresh(4000, NOW);
        assert_eq!(s.remaining_ms(4000, NOW), 0);
        assert_eq!(s.wait_ms, 4000);
        assert_eq!(s.last(), None);
    }

    #[test]
    fn failed_canaries_double_the_shared_wait_whoever_runs_them() {
        // Three workers take turns: the wait is the pipeline's, so it
        // grows 8 s, 16 s, 32 s whatever worker ran the run before.
        let every = 4000;
        let mut s = RedriveState::fresh(every, NOW);
        let mut now = NOW;
        let mut waits = vec![];
        for k in 0..3 {
            let mut r = run(RunResult::CanaryFailed);
            r.by = format!("w{k}");
            s = s.after(every, r, now);
            waits.push(s.wait_ms / 1000);
            assert_eq!(s.remaining_ms(every, now), s.wait_ms);
            now += s.wait_ms;
            assert_eq!(s.remaining_ms(every, now), 0);
        }
        assert_eq!(waits, [8, 16, 32]);
        assert_eq!(s.seq, 3);
        assert_eq!(
            s.runs.iter().map(|r| r.by.as_str()).collect::<Vec<_>>(),
            ["w2", "w1", "w0"]
        );
    }

    #[test]
    fn busy_leaves_the_wait_and_moved_or_nothing_eligible_bring_it_back_to_every() {
        let every = 4000;
        let s = RedriveState::fresh(every, NOW)
            .after(every, run(RunResult::CanaryFailed), NOW)
            .after(every, run(RunResult::CanaryFailed), NOW + 8000);
        assert_eq!(s.wait_ms, 16_000);
        let busy = s.after(every, run(RunResult::Busy), NOW + 9000);
        assert_eq!(busy, s, "busy writes nothing");
        let failed = s.after(every, run(RunResult::Failed), NOW + 20_000);
        assert_eq!(failed.wait_ms, 16_000, "an error keeps the backoff");
        assert_eq!(failed.next_look_at_ms, NOW + 36_000);
        for r in [RunResult::Moved, RunResult::NothingEligible] {
            let after = s.after(every, run(r), NOW + 30_000);
            assert_eq!(after.wait_ms, every, "{r:?}");
            assert_eq!(after.next_look_at_ms, NOW + 30_000 + every);
            assert_eq!(after.seq, s.seq + 1);
        }
    }

    #[test]
    fn the_history_keeps_the_last_runs_newest_first() {
        let mut s = RedriveState::fresh(1000, NOW);
        for k in 0..(HISTORY as u64 + 5) {
            let mut r = run(RunResult::Moved);
            r.moved = k;
            s = s.after(1000, r, NOW + k);
        }
        assert_eq!(s.runs.len(), HISTORY);
        assert_eq!(s.last().map(|r| r.moved), Some(HISTORY as u64 + 4));
        assert_eq!(s.runs.last().map(|r| r.moved), Some(5));
    }

    #[test]
    fn a_long_why_is_cut_on_a_character_boundary() {
        let mut r = run(RunResult::Failed);
        r.why = Some("é".repeat(WHY_MAX));
        let t = r.trimmed();
        let w = t.why.unwrap_or_default();
        assert!(w.len() <= WHY_MAX && w.len() >= WHY_MAX - 1, "{}", w.len());
        assert!(w.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_due_time_further_ahead_than_its_wait_is_a_clock_off_and_due_now() {
        let mut s = RedriveState::fresh(4000, NOW);
        s.wait_ms = 16_000;
        // Within the wait and the slack: waited for.
        s.next_look_at_ms = NOW + 16_000 + CLOCK_SLACK_MS;
        assert_eq!(s.remaining_ms(4000, NOW), 16_000 + CLOCK_SLACK_MS);
        // A writer a day ahead, or a hand-written message: due now, at
        // every look (not held back by a cap again and again).
        for ahead in [16_000 + CLOCK_SLACK_MS + 1, 86_400_000, u64::MAX - NOW] {
            s.next_look_at_ms = NOW + ahead;
            assert_eq!(s.remaining_ms(4000, NOW), 0, "{ahead}");
            assert_eq!(s.remaining_ms(4000, NOW + 3_600_000), 0, "{ahead}");
        }
    }

    #[test]
    fn a_state_round_trips_and_other_bodies_are_no_state() {
        let mut r = run(RunResult::CanaryFailed);
        r.canary = Some((5, 1));
        r.waiting_for_person = Some(3);
        r.why = Some("1 of 5 came back".into());
        let s = RedriveState::fresh(4000, NOW).after(4000, r, NOW);
        assert_eq!(RedriveState::decode(&s.encode()), Some(s.clone()));
        for body in [
            &b""[..],
            b"{}",
            b"null",
            b"[1,2]",
            b"{\"version\":2,\"seq\":1,\"wait_ms\":1,\"next_look_at_ms\":1,\"written_at_ms\":1}",
            &[0xff, 0xfe],
        ] {
            assert_eq!(RedriveState::decode(body), None, "{body:?}");
        }
        // A state without runs (an older writer) reads.
        let bare =
            b"{\"version\":1,\"seq\":7,\"wait_ms\":1,\"next_look_at_ms\":2,\"written_at_ms\":3}";
        assert_eq!(RedriveState::decode(bare).map(|s| s.seq), Some(7));
    }

    #[test]
    fn the_newest_of_two_states_left_by_a_crash_wins() {
        let a = RedriveState::fresh(1000, NOW);
        let b = a.after(1000, run(RunResult::CanaryFailed), NOW + 5);
        assert_eq!(newest(&[a.clone(), b.clone()]), Some(&b));
        assert_eq!(newest(&[b.clone(), a.clone()]), Some(&b));
        assert_eq!(newest(&[]), None);
        // Same seq (two writers that each found the queue empty): the
        // later write.
        let mut c = b.clone();
        c.written_at_ms += 1;
        assert_eq!(newest(&[c.clone(), b.clone()]), Some(&c));
    }
}
