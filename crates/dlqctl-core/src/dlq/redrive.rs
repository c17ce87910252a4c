//! Automatic redrive, the rules (docs/dlq.md, "Automatic redrive"): which
//! DLQ message a run moves ([`verdict`]), the copy it publishes
//! ([`redrive_copy`]), whether its canary passed
//! ([`CanaryRule::Automatic`]), what the run came to ([`RunEnd`], its
//! [`RunResult`]) and when the DLQ is looked at next ([`next_wait`]). The shell (`ops::dlq::redrive`) reads the DLQ and
//! publishes; nothing here does I/O.

use crate::dlq::describe::Described;
use crate::dlq::replay::back_to_work;
pub use crate::dlq::run::CanaryRule;
use crate::dlq::run::{ReplayEnd, Stop};
use crate::topology::Redrive;
use crate::wire::{count, has, DRILL_HEADER, REDRIVEN_HEADER};
use amq_protocol::protocol::BasicProperties;
use amq_protocol::types::FieldTable;

/// The longest the DLQ waits between two looks after failed canaries: an
/// hour (unless `every` itself is longer).
pub(crate) const MAX_WAIT_MS: u64 = 3_600_000;

/// What a run does with one DLQ message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Moved back to the main queue by this run.
    Eligible,
    /// Its reason is not one the policy lists (`permanent`, unless listed):
    /// never moved automatically.
    ReasonNotListed,
    /// Redriven `max_redrives` times already: it stays for a person.
    WaitingForPerson,
    /// In the DLQ for less than `min_age` (or since an unknown time): a
    /// later run may move it.
    TooYoung,
    /// A drill message (`dlqctl-drill`) a drill left behind: never moved
    /// nor counted; the next `dlqctl drill` removes it.
    Drill,
}

/// What a verdict reads of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen<'a> {
    /// Its reason (`dlqctl-reason`, or the broker's `x-death` reason).
    pub reason: Option<&'a str>,
    /// When it was dead-lettered, ms since the Unix epoch.
    pub dead_lettered_at_ms: Option<u64>,
    /// Automatic redrives so far (`redriven_count`).
    pub redriven: u64,
    /// A drill message (it carries `dlqctl-drill`).
    pub drill: bool,
}

impl<'a> Seen<'a> {
    /// What a verdict reads of a DLQ message: its description and headers.
    pub fn of(d: &'a Described, headers: Option<&FieldTable>) -> Seen<'a> {
        Seen {
            reason: d.reason.as_deref(),
            dead_lettered_at_ms: d
                .dead_lettered_at
                .as_deref()
                .and_then(crate::values::text::parse_rfc3339_millis),
            redriven: redriven_count(headers),
            drill: has(headers, DRILL_HEADER),
        }
    }
}

/// The verdict on a message at `now_unix_ms`. A drill message is never
/// the policy's; then the reason (a message of another reason is none of
/// the policy's business), then the redrive budget, then the age.
pub fn verdict(policy: &Redrive, m: &Seen, now_unix_ms: u64) -> Verdict {
    if m.drill {
        return Verdict::Drill;
    }
    if !m
        .reason
        .is_some_and(|r| policy.reasons.iter().any(|p| p == r))
    {
        return Verdict::ReasonNotListed;
    }
    if m.redriven >= u64::from(policy.max_redrives) {
        return Verdict::WaitingForPerson;
    }
    match m.dead_lettered_at_ms {
        Some(at) if now_unix_ms.saturating_sub(at) >= policy.min_age && at <= now_unix_ms => {
            Verdict::Eligible
        }
        _ => Verdict::TooYoung,
    }
}

/// The automatic redrives a message's headers count: `dlqctl-redriven`
/// when it is a non-negative integer of any width, else 0.
pub(crate) fn redriven_count(headers: Option<&FieldTable>) -> u64 {
    count(headers, REDRIVEN_HEADER)
}

/// The properties of a redrive copy: as a replay copy
/// ([`crate::dlq::replay::replay_copy`]: it starts again at attempt
/// 1, keeps the error history and carries the run's `dlqctl-replay-id`
/// for the canary), but with `dlqctl-redriven` one more than the
/// original's and `dlqctl-replayed` left as the original had it (that one
/// counts a person's replays).
pub fn redrive_copy(
    original: &BasicProperties,
    connection_user: &str,
    replay_id: &str,
    now_unix_ms: u64,
) -> BasicProperties {
    back_to_work(
        original,
        connection_user,
        replay_id,
        now_unix_ms,
        REDRIVEN_HEADER,
    )
}

/// What one run came to (the `result` label of
/// `dlqctl_redrive_runs_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunResult {
    /// Messages moved (the canary passed, or there was none).
    Moved,
    /// A canary came back: the rest stayed, the next look waits longer.
    CanaryFailed,
    /// The health probe did not answer 2xx: nothing moved.
    Unhealthy,
    /// No message was eligible.
    NothingEligible,
    /// Another run or DLQ command held the DLQ: this turn was skipped.
    Busy,
    /// The run stopped on an error (the broker refused a copy, the
    /// connection was lost): what was not moved stays in the DLQ.
    Failed,
    /// On a pipeline with idempotent handling, no eligible message could
    /// be the canary (every key already marked handled, or leased): a
    /// copy would run no handler and prove nothing. Nothing moved.
    NoCanary,
}

impl RunResult {
    /// Every result, as labelled.
    pub const ALL: [RunResult; 7] = [
        RunResult::Moved,
        RunResult::CanaryFailed,
        RunResult::Unhealthy,
        RunResult::NothingEligible,
        RunResult::Busy,
        RunResult::Failed,
        RunResult::NoCanary,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RunResult::Moved => "moved",
            RunResult::CanaryFailed => "canary_failed",
            RunResult::Unhealthy => "unhealthy",
            RunResult::NothingEligible => "nothing_eligible",
            RunResult::Busy => "busy",
            RunResult::Failed => "failed",
            RunResult::NoCanary => "no_canary",
        }
    }

    /// What a run's numbers come to: nothing sent → nothing eligible; a
    /// canary sent and failed → canary failed; else moved.
    pub fn of(moved: u64, canary: Option<(u64, u64)>) -> RunResult {
        match canary {
            Some((sent, back)) if sent > 0 && !CanaryRule::Automatic.passed(sent, back) => {
                RunResult::CanaryFailed
            }
            _ if moved == 0 => RunResult::NothingEligible,
            _ => RunResult::Moved,
        }
    }
}

/// How a run ended: its [`RunResult`], with why when it did not move what
/// was eligible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Messages moved (the canary passed, or there was none).
    Moved,
    /// No message was eligible.
    NothingEligible,
    /// A canary came back: the rest stayed.
    CanaryFailed(String),
    /// The health probe did not answer 2xx: nothing moved.
    Unhealthy(String),
    /// Another run or DLQ command held the DLQ.
    Busy(String),
    /// The run stopped on an error, a refused copy or a signal.
    Failed(String),
    /// No eligible message could be the canary (see
    /// [`RunResult::NoCanary`]).
    NoCanary(String),
}

impl RunEnd {
    /// The result (the metric's label).
    pub fn result(&self) -> RunResult {
        match self {
            RunEnd::Moved => RunResult::Moved,
            RunEnd::NothingEligible => RunResult::NothingEligible,
            RunEnd::CanaryFailed(_) => RunResult::CanaryFailed,
            RunEnd::Unhealthy(_) => RunResult::Unhealthy,
            RunEnd::Busy(_) => RunResult::Busy,
            RunEnd::Failed(_) => RunResult::Failed,
            RunEnd::NoCanary(_) => RunResult::NoCanary,
        }
    }

    /// Why it did not move what was eligible, in words.
    pub fn why(&self) -> Option<&str> {
        match self {
            RunEnd::Moved | RunEnd::NothingEligible => None,
            RunEnd::CanaryFailed(why)
            | RunEnd::Unhealthy(why)
            | RunEnd::Busy(why)
            | RunEnd::Failed(why)
            | RunEnd::NoCanary(why) => Some(why),
        }
    }

    /// What a run whose replay moved `moved` messages, with this canary
    /// (`(sent, came_back)`), and ended so, came to: a signal or a refused
    /// copy is a failure, a failed canary is [`RunEnd::CanaryFailed`];
    /// else the numbers say ([`RunResult::of`]).
    pub fn after_replay(moved: u64, canary: Option<(u64, u64)>, end: &ReplayEnd) -> RunEnd {
        match end {
            ReplayEnd::Cancelled { .. } => RunEnd::Failed("stopped (SIGINT, SIGTERM)".into()),
            ReplayEnd::Stopped(Stop::CanaryFailed(why)) => RunEnd::CanaryFailed(why.clone()),
            ReplayEnd::Stopped(Stop::Refused(why)) => RunEnd::Failed(why.clone()),
            ReplayEnd::Stopped(Stop::NoCanary(why)) => RunEnd::NoCanary(why.clone()),
            ReplayEnd::Completed => match RunResult::of(moved, canary) {
                RunResult::NothingEligible => RunEnd::NothingEligible,
                RunResult::CanaryFailed => {
                    let (sent, back) = canary.unwrap_or_default();
                    RunEnd::CanaryFailed(format!("the canary failed: {back} of {sent} came back"))
                }
                _ => RunEnd::Moved,
            },
        }
    }
}

/// How long to wait before the next look, in ms, after a run that came
/// to `result` when the wait before it was `previous_ms`: twice as long
/// after a failed canary (at most an hour, or `every` when that is
/// longer); the same after a run that failed on an error (a lost
/// connection says nothing of the dependency, and must not undo the
/// backoff); `every` again after any other result.
pub fn next_wait(every_ms: u64, previous_ms: u64, result: RunResult) -> u64 {
    let cap = MAX_WAIT_MS.max(every_ms);
    match result {
        RunResult::CanaryFailed => previous_ms.max(every_ms).saturating_mul(2).min(cap),
        RunResult::Failed => previous_ms.max(every_ms).min(cap),
        _ => every_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlq::replay::replay_id_of;
    use crate::field_table;
    use crate::wire::{
        ATTEMPT_HEADER, LAST_ERROR_HEADER, REASON_HEADER, REPLAYED_AT_HEADER, REPLAYED_HEADER,
    };
    use amq_protocol::types::{AMQPValue, LongString};

    const NOW: u64 = 1_767_225_600_000;
    const MIN: u64 = 60_000;

    fn policy() -> Redrive {
        Redrive {
            min_age: 5 * MIN,
            ..Redrive::default()
        }
    }

    fn seen(reason: Option<&str>, age_ms: Option<u64>, redriven: u64) -> Seen<'_> {
        Seen {
            reason,
            dead_lettered_at_ms: age_ms.map(|a| NOW - a),
            redriven,
            drill: false,
        }
    }

    /// The verdict of `p` now on a message of `reason`, dead-lettered
    /// `age_ms` ago (`None`: unknown) and redriven `redriven` times.
    fn verdict_on(
        p: &Redrive,
        reason: Option<&str>,
        age_ms: Option<u64>,
        redriven: u64,
    ) -> Verdict {
        verdict(p, &seen(reason, age_ms, redriven), NOW)
    }

    #[test]
    fn an_exhausted_message_old_enough_and_under_the_budget_is_eligible() {
        let p = policy();
        for (age, redriven) in [(5 * MIN, 0), (100 * MIN, 2)] {
            assert_eq!(
                verdict_on(&p, Some("exhausted"), Some(age), redriven),
                Verdict::Eligible,
                "{age} {redriven}"
            );
        }
    }

    #[test]
    fn a_message_younger_than_min_age_or_of_unknown_age_waits() {
        let p = policy();
        for age in [Some(5 * MIN - 1), Some(0), None] {
            assert_eq!(
                verdict_on(&p, Some("exhausted"), age, 0),
                Verdict::TooYoung,
                "{age:?}"
            );
        }
        // Dead-lettered "in the future" (a clock ahead): not old enough.
        let ahead = Seen {
            reason: Some("exhausted"),
            dead_lettered_at_ms: Some(NOW + 10 * MIN),
            redriven: 0,
            drill: false,
        };
        assert_eq!(verdict(&p, &ahead, NOW), Verdict::TooYoung);
        // min_age 0 is not writable (durations start at 1ms), but holds.
        let p0 = Redrive { min_age: 0, ..p };
        assert_eq!(
            verdict_on(&p0, Some("exhausted"), Some(0), 0),
            Verdict::Eligible
        );
    }

    #[test]
    fn permanent_and_other_reasons_move_only_when_listed() {
        let p = policy();
        for r in [
            Some("permanent"),
            Some("too_large"),
            Some("rejected"),
            Some("delivery_limit"),
            Some(""),
            None,
            // Case matters: reasons are written in lower case.
            Some("Exhausted"),
        ] {
            assert_eq!(
                verdict_on(&p, r, Some(100 * MIN), 0),
                Verdict::ReasonNotListed,
                "{r:?}"
            );
        }
        let both = Redrive {
            reasons: vec!["exhausted".into(), "permanent".into()],
            ..policy()
        };
        assert_eq!(
            verdict_on(&both, Some("permanent"), Some(100 * MIN), 0),
            Verdict::Eligible
        );
    }

    #[test]
    fn a_message_past_max_redrives_waits_for_a_person_whatever_its_age() {
        let p = policy();
        for (n, want) in [
            (2, Verdict::Eligible),
            (3, Verdict::WaitingForPerson),
            (4, Verdict::WaitingForPerson),
            (u64::MAX, Verdict::WaitingForPerson),
        ] {
            assert_eq!(
                verdict_on(&p, Some("exhausted"), Some(100 * MIN), n),
                want,
                "{n}"
            );
        }
        // Counted as waiting even while too young to move.
        assert_eq!(
            verdict_on(&p, Some("exhausted"), Some(0), 3),
            Verdict::WaitingForPerson
        );
        // But a reason not listed is not the policy's to count.
        assert_eq!(
            verdict_on(&p, Some("permanent"), Some(0), 3),
            Verdict::ReasonNotListed
        );
    }

    #[test]
    fn a_message_is_seen_through_its_description_and_headers() {
        let d = Described {
            reason: Some("exhausted".into()),
            dead_lettered_at: Some("2026-01-01T00:00:00.000Z".into()),
            ..Described::default()
        };
        let h = field_table([(REDRIVEN_HEADER, AMQPValue::LongLongInt(2))]);
        assert_eq!(
            Seen::of(&d, Some(&h)),
            Seen {
                reason: Some("exhausted"),
                dead_lettered_at_ms: Some(NOW),
                redriven: 2,
                drill: false,
            }
        );
        let bad = Described {
            dead_lettered_at: Some("yesterday".into()),
            ..Described::default()
        };
        assert_eq!(
            Seen::of(&bad, None),
            Seen {
                reason: None,
                dead_lettered_at_ms: None,
                redriven: 0,
                drill: false,
            }
        );
        let drill = field_table([(DRILL_HEADER, AMQPValue::LongString("run-1".into()))]);
        assert!(Seen::of(&d, Some(&drill)).drill);
    }

    #[test]
    fn a_drill_message_is_never_moved_nor_counted_whatever_else_it_says() {
        let p = policy();
        for (reason, age, redriven) in [
            (Some("exhausted"), Some(100 * MIN), 0),
            (Some("exhausted"), Some(100 * MIN), 9),
            (Some("permanent"), Some(0), 0),
            (None, None, 0),
        ] {
            let mut m = seen(reason, age, redriven);
            m.drill = true;
            assert_eq!(verdict(&p, &m, NOW), Verdict::Drill, "{m:?}");
        }
    }

    #[test]
    fn the_redrive_count_reads_any_integer_width_and_ignores_the_rest() {
        assert_eq!(redriven_count(None), 0);
        assert_eq!(redriven_count(Some(&FieldTable::default())), 0);
        for (v, want) in [
            (AMQPValue::LongLongInt(3), 3),
            (AMQPValue::LongInt(2), 2),
            (AMQPValue::ShortInt(1), 1),
            (AMQPValue::ShortShortUInt(4), 4),
            (AMQPValue::LongUInt(5), 5),
            (AMQPValue::ShortUInt(6), 6),
            (AMQPValue::ShortShortInt(7), 7),
            (AMQPValue::LongLongInt(-4), 0),
            (AMQPValue::LongString(LongString::from("9")), 0),
            (AMQPValue::Boolean(true), 0),
        ] {
            let h = field_table([(REDRIVEN_HEADER, v.clone())]);
            assert_eq!(redriven_count(Some(&h)), want, "{v:?}");
        }
    }

    fn original(extra: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut pairs = vec![
            (ATTEMPT_HEADER, AMQPValue::LongLongInt(4)),
            (REASON_HEADER, AMQPValue::LongString("exhausted".into())),
            (LAST_ERROR_HEADER, AMQPValue::LongString("down".into())),
            (
                "x-death",
                AMQPValue::FieldArray(amq_protocol::types::FieldArray::default()),
            ),
        ];
        pairs.extend(extra.iter().cloned());
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_user_id("someone-else".into())
            .with_expiration("100".into())
            .with_headers(field_table(pairs))
    }

    fn header(p: &BasicProperties, k: &str) -> Option<AMQPValue> {
        p.headers().as_ref().and_then(|h| h.inner().get(k)).cloned()
    }

    #[test]
    fn a_redrive_copy_counts_redrives_apart_from_replays_and_is_a_replay_copy_otherwise() {
        let c = redrive_copy(&original(&[]), "guest", "run-1", NOW);
        assert_eq!(header(&c, REDRIVEN_HEADER), Some(AMQPValue::LongLongInt(1)));
        assert_eq!(header(&c, REPLAYED_HEADER), None, "not a person's replay");
        assert!(header(&c, REPLAYED_AT_HEADER).is_some());
        assert_eq!(replay_id_of(&c).as_deref(), Some("run-1"));
        assert_eq!(header(&c, ATTEMPT_HEADER), None, "attempt 1 again");
        assert_eq!(header(&c, "x-death"), None);
        assert_eq!(
            header(&c, LAST_ERROR_HEADER),
            Some(AMQPValue::LongString("down".into())),
            "the error history stays"
        );
        assert_eq!(c.user_id(), &None);
        assert_eq!(c.expiration(), &None);
        assert_eq!(c.delivery_mode(), &Some(2));
        assert_eq!(c.message_id().as_ref().map(|m| m.as_str()), Some("m-1"));
        // Redriven again: 2; a person's replay count is kept as it was.
        let replayed = original(&[
            (REDRIVEN_HEADER, AMQPValue::LongInt(1)),
            (REPLAYED_HEADER, AMQPValue::LongLongInt(5)),
        ]);
        let c = redrive_copy(&replayed, "guest", "run-2", NOW);
        assert_eq!(header(&c, REDRIVEN_HEADER), Some(AMQPValue::LongLongInt(2)));
        assert_eq!(header(&c, REPLAYED_HEADER), Some(AMQPValue::LongLongInt(5)));
        // At the top of the range, it stays there.
        let top = original(&[(REDRIVEN_HEADER, AMQPValue::LongLongInt(i64::MAX))]);
        assert_eq!(
            header(&redrive_copy(&top, "guest", "r", NOW), REDRIVEN_HEADER),
            Some(AMQPValue::LongLongInt(i64::MAX))
        );
        // A message without headers gets its count.
        let bare = redrive_copy(&BasicProperties::default(), "guest", "r", NOW);
        assert_eq!(
            header(&bare, REDRIVEN_HEADER),
            Some(AMQPValue::LongLongInt(1))
        );
    }

    #[test]
    fn a_redrive_copy_and_a_replay_copy_differ_only_in_which_count_goes_up() {
        let o = original(&[
            (REDRIVEN_HEADER, AMQPValue::ShortInt(2)),
            (REPLAYED_HEADER, AMQPValue::LongInt(5)),
            ("tenant", AMQPValue::LongString("acme".into())),
        ]);
        let redriven = redrive_copy(&o, "guest", "run-1", NOW);
        let replayed = crate::dlq::replay::replay_copy(&o, "guest", "run-1", NOW);
        assert_eq!(
            header(&redriven, REDRIVEN_HEADER),
            Some(AMQPValue::LongLongInt(3))
        );
        assert_eq!(
            header(&redriven, REPLAYED_HEADER),
            Some(AMQPValue::LongInt(5)),
            "kept as it was, its type too"
        );
        assert_eq!(
            header(&replayed, REPLAYED_HEADER),
            Some(AMQPValue::LongLongInt(6))
        );
        assert_eq!(
            header(&replayed, REDRIVEN_HEADER),
            Some(AMQPValue::ShortInt(2))
        );
        let others = |p: &BasicProperties| -> Vec<(String, AMQPValue)> {
            p.headers()
                .iter()
                .flat_map(|h| h.inner().iter())
                .filter(|(k, _)| k.as_str() != REDRIVEN_HEADER && k.as_str() != REPLAYED_HEADER)
                .map(|(k, v)| (k.as_str().to_string(), v.clone()))
                .collect()
        };
        assert_eq!(others(&redriven), others(&replayed));
        assert!(others(&redriven).iter().any(|(k, _)| k == "tenant"));
        assert_eq!(
            redriven.clone().with_headers(FieldTable::default()),
            replayed.clone().with_headers(FieldTable::default()),
            "the same properties"
        );
    }

    #[test]
    fn a_run_after_its_replay_ends_as_the_replay_did() {
        let refused = Stop::Refused("orders refused a copy: nacked".into());
        let canary = Stop::CanaryFailed("the canary failed: 1 of 5 ...".into());
        let cases = [
            (0, None, ReplayEnd::Completed, RunEnd::NothingEligible),
            (
                0,
                Some((0, 0)),
                ReplayEnd::Completed,
                RunEnd::NothingEligible,
            ),
            (7, None, ReplayEnd::Completed, RunEnd::Moved),
            (50, Some((5, 0)), ReplayEnd::Completed, RunEnd::Moved),
            (
                5,
                Some((5, 1)),
                ReplayEnd::Stopped(canary.clone()),
                RunEnd::CanaryFailed("the canary failed: 1 of 5 ...".into()),
            ),
            (
                2,
                Some((5, 0)),
                ReplayEnd::Stopped(refused.clone()),
                RunEnd::Failed("orders refused a copy: nacked".into()),
            ),
            (
                0,
                Some((0, 0)),
                ReplayEnd::Stopped(refused.clone()),
                RunEnd::Failed("orders refused a copy: nacked".into()),
            ),
            (
                3,
                None,
                ReplayEnd::Cancelled { stop: None },
                RunEnd::Failed("stopped (SIGINT, SIGTERM)".into()),
            ),
            (
                3,
                Some((3, 0)),
                ReplayEnd::Cancelled {
                    stop: Some(refused),
                },
                RunEnd::Failed("stopped (SIGINT, SIGTERM)".into()),
            ),
            // Numbers of a failed canary with no stop (not what a replay
            // with the automatic rule reports): still a failed canary.
            (
                3,
                Some((3, 3)),
                ReplayEnd::Completed,
                RunEnd::CanaryFailed("the canary failed: 3 of 3 came back".into()),
            ),
            // No message could be the canary: a result of its own, with
            // why, even though nothing moved (not "nothing eligible").
            (
                0,
                Some((0, 0)),
                ReplayEnd::Stopped(Stop::NoCanary("no message could be the canary".into())),
                RunEnd::NoCanary("no message could be the canary".into()),
            ),
        ];
        for (moved, canary, end, expected) in cases {
            let got = RunEnd::after_replay(moved, canary, &end);
            assert_eq!(got, expected, "{moved} {canary:?} {end:?}");
        }
        assert_eq!(RunEnd::Moved.why(), None);
        assert_eq!(RunEnd::NothingEligible.why(), None);
        let ends = [
            (RunEnd::Moved, RunResult::Moved),
            (RunEnd::CanaryFailed("a".into()), RunResult::CanaryFailed),
            (RunEnd::Unhealthy("b".into()), RunResult::Unhealthy),
            (RunEnd::NothingEligible, RunResult::NothingEligible),
            (RunEnd::Busy("c".into()), RunResult::Busy),
            (RunEnd::Failed("d".into()), RunResult::Failed),
            (RunEnd::NoCanary("e".into()), RunResult::NoCanary),
        ];
        for (end, result) in ends {
            assert_eq!(end.result(), result);
        }
        assert_eq!(RunEnd::Busy("held".into()).why(), Some("held"));
        assert_eq!(RunEnd::NoCanary("none".into()).why(), Some("none"));
        assert_eq!(next_wait(1000, 8000, RunResult::NoCanary), 1000);
    }

    #[test]
    fn a_run_result_follows_from_what_moved_and_the_canary() {
        assert_eq!(RunResult::of(0, None), RunResult::NothingEligible);
        assert_eq!(RunResult::of(0, Some((0, 0))), RunResult::NothingEligible);
        assert_eq!(RunResult::of(7, None), RunResult::Moved);
        assert_eq!(RunResult::of(50, Some((5, 0))), RunResult::Moved);
        assert_eq!(RunResult::of(5, Some((5, 0))), RunResult::Moved);
        assert_eq!(RunResult::of(5, Some((5, 1))), RunResult::CanaryFailed);
        assert_eq!(RunResult::of(3, Some((3, 3))), RunResult::CanaryFailed);
        let labels: Vec<&str> = RunResult::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(
            labels,
            [
                "moved",
                "canary_failed",
                "unhealthy",
                "nothing_eligible",
                "busy",
                "failed",
                "no_canary"
            ]
        );
        for r in RunResult::ALL {
            assert_eq!(
                serde_json::to_value(r).unwrap(),
                serde_json::Value::String(r.label().into())
            );
        }
    }

    #[test]
    fn over_a_grid_the_verdict_and_the_wait_keep_their_bounds() {
        let reasons = [Some("exhausted"), Some("permanent"), None];
        for max_redrives in [1u32, 3, 10] {
            for min_age in [1u64, 1000, 5 * MIN] {
                let p = Redrive {
                    min_age,
                    max_redrives,
                    ..Redrive::default()
                };
                for reason in reasons {
                    for redriven in [0u64, 1, 2, 3, 9, 10, 11] {
                        let mut was_eligible = false;
                        for age in [0u64, 1, 999, 1000, 1001, 5 * MIN - 1, 5 * MIN, 10 * MIN] {
                            let v = verdict_on(&p, reason, Some(age), redriven);
                            let want = if reason != Some("exhausted") {
                                Verdict::ReasonNotListed
                            } else if redriven >= u64::from(max_redrives) {
                                Verdict::WaitingForPerson
                            } else if age >= min_age {
                                Verdict::Eligible
                            } else {
                                Verdict::TooYoung
                            };
                            assert_eq!(v, want, "{p:?} {reason:?} {redriven} {age}");
                            // Older never makes a message less eligible.
                            assert!(!was_eligible || v == Verdict::Eligible);
                            was_eligible |= v == Verdict::Eligible;
                        }
                    }
                }
            }
        }
        for every in [1000u64, 60_000, 3_600_000, 7_200_000] {
            let mut w = 0;
            for k in 0..40 {
                let r = RunResult::ALL[k % RunResult::ALL.len()];
                let before = w;
                w = next_wait(every, w, r);
                assert!(w >= every && w <= MAX_WAIT_MS.max(every), "{every} {w}");
                match r {
                    RunResult::CanaryFailed => {
                        assert!(w >= before.min(MAX_WAIT_MS.max(every)))
                    }
                    RunResult::Failed => assert_eq!(w, before.max(every)),
                    _ => assert_eq!(w, every),
                }
            }
        }
    }

    #[test]
    fn the_wait_doubles_after_a_failed_canary_up_to_an_hour_and_resets_after_success() {
        let every = 60_000;
        let mut w = every;
        let mut seen = Vec::new();
        for _ in 0..8 {
            w = next_wait(every, w, RunResult::CanaryFailed);
            seen.push(w / 1000);
        }
        assert_eq!(seen, [120, 240, 480, 960, 1920, 3600, 3600, 3600]);
        for r in [
            RunResult::Moved,
            RunResult::NothingEligible,
            RunResult::Unhealthy,
            RunResult::Busy,
        ] {
            assert_eq!(next_wait(every, 3_600_000, r), every, "{r:?}");
        }
        // A run stopped by an error keeps the wait it had.
        assert_eq!(next_wait(every, 480_000, RunResult::Failed), 480_000);
        assert_eq!(next_wait(every, 0, RunResult::Failed), every);
        // `every` longer than an hour: it is the floor and the cap.
        assert_eq!(
            next_wait(7_200_000, 7_200_000, RunResult::CanaryFailed),
            7_200_000
        );
        // A previous wait shorter than `every` (a first run) doubles `every`.
        assert_eq!(next_wait(1000, 0, RunResult::CanaryFailed), 2000);
        // No overflow.
        assert_eq!(
            next_wait(u64::MAX, u64::MAX, RunResult::CanaryFailed),
            u64::MAX
        );
    }
}
