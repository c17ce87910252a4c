//! `dlqctl drill`: what a drill expects of a pipeline, its timeline and
//! its verdicts. Pure: the shell publishes, watches and cleans up
//! (`crate::ops::drill`).
//!
//! A drill publishes one message marked with
//! [`crate::wire::DRILL_HEADER`] through the pipeline's own
//! exchange (so its bindings are tested too), and follows it: the worker
//! fails it through the tiers its decisions pick ([`expected_tiers`]),
//! dead-letters it as `exhausted` ([`dead_lettered_verdict`]), and acks it
//! once the drill replays it. Each step is a [`StepName`]; the drill
//! passes when every step held ([`DrillVerdict`]).

use crate::handling::outcome::Outcome;
use crate::retry::confirm::Refusal;
use crate::retry::{decide, DeadLetterReason, Decision};
use crate::topology::{ExchangeType, Pipeline};
use crate::values::duration::tier_name;
use serde_json::Value;

/// Where a drill publishes: the producers' exchange with a routing key one
/// of its bindings routes, or the default exchange with the main queue's
/// name when the pipeline has no exchange (or only `headers` bindings,
/// whose arguments a drill does not forge).
pub fn drill_route(p: &Pipeline) -> (String, String) {
    let direct = (String::new(), p.name.clone());
    let Some(x) = &p.exchange else {
        return direct;
    };
    match x.kind {
        ExchangeType::Fanout => (x.name.clone(), String::new()),
        ExchangeType::Headers => direct,
        ExchangeType::Direct | ExchangeType::Topic => match x.bindings.first() {
            // A topic pattern's words: `*` and `#` stand for `drill`.
            Some(b) => (
                x.name.clone(),
                b.key
                    .split('.')
                    .map(|w| if w == "*" || w == "#" { "drill" } else { w })
                    .collect::<Vec<_>>()
                    .join("."),
            ),
            None => direct,
        },
    }
}

/// The tiers a message failed on every attempt visits, in order: one per
/// failed attempt but the last (which dead-letters it).
pub fn expected_tiers(p: &Pipeline) -> Vec<String> {
    let failed = Outcome::transient("drill");
    (1..p.retry.max_attempts)
        .filter_map(|a| match decide(&p.retry, a, &failed) {
            Decision::Retry { delay_ms } => Some(tier_name(delay_ms)),
            _ => None,
        })
        .collect()
}

/// How often a drill looks for its message in the DLQ.
pub(crate) const LOOK_EVERY_MS: u64 = 1000;

/// How long to wait before the next look for the drill message in the DLQ,
/// `elapsed_ms` after it was published, when `--timeout` is `timeout_ms`:
/// every `LOOK_EVERY_MS`, and one last look exactly at the deadline;
/// `None` once a look at or past the deadline found nothing (the drill
/// fails). So a drill with a timeout of 100 ms looks at 0 and at 100 ms,
/// never at 1 s: whatever the timeout, a message that arrives after it
/// is a failure.
pub fn next_look(elapsed_ms: u64, timeout_ms: u64) -> Option<u64> {
    (elapsed_ms < timeout_ms).then(|| LOOK_EVERY_MS.min(timeout_ms - elapsed_ms))
}

/// How late a look may start after the deadline and still count as the
/// look at the deadline: a timer wakes a few milliseconds after the time
/// it was set for.
pub(crate) const LOOK_SLACK_MS: u64 = 50;

/// Whether a drill message found by a look that started `look_ms` after
/// the publish arrived in time: the look started by the deadline, give or
/// take `LOOK_SLACK_MS` for the timer. A look that started later (the
/// process stalled) cannot tell when the message came: it is late. The
/// same rule for every timeout.
pub fn in_time(look_ms: u64, timeout_ms: u64) -> bool {
    look_ms <= timeout_ms.saturating_add(LOOK_SLACK_MS)
}

/// How long a drill keeps publishing its message when a node cannot route
/// it yet, on brokers where that can happen.
pub(crate) const ROUTABLE_WAIT_MS: u64 = 3000;

/// The bound of [`publish_retry`] for a broker of `version`
/// (`rabbitmq_version`; `None`: unknown). From 4.2 the metadata store is
/// Khepri by default (4.3 has no other): a declare is confirmed once a
/// majority of nodes have it, so the node a drill publishes through may
/// not route to a new exchange, queue or binding yet; a publish can come
/// back unroutable or meet a 404 for a moment. Before 4.2 (Mnesia) a
/// declare is on every node when it is confirmed: no wait. Unknown: the
/// wait, which costs only a failing drill's time.
pub fn routable_wait_ms(version: Option<&str>) -> u64 {
    let mm = version.and_then(|v| {
        let mut parts = v.split(|c: char| !c.is_ascii_digit());
        let major: u32 = parts.next()?.parse().ok()?;
        let minor: u32 = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
        Some((major, minor))
    });
    match mm {
        Some(v) if v < (4, 2) => 0,
        _ => ROUTABLE_WAIT_MS,
    }
}

/// Whether to publish the drill message again after `refusal`, and after
/// how long: only a refusal a node that does not have the objects yet
/// gives (returned unroutable, or a 404 on the exchange), `attempt` (1 for
/// the first publish) waits 100 ms, 200 ms, 400 ms... while `waited_ms`
/// stays under `bound_ms` ([`routable_wait_ms`]); `None`: give up and
/// report the refusal.
pub fn publish_retry(
    refusal: &Refusal,
    attempt: u32,
    waited_ms: u64,
    bound_ms: u64,
) -> Option<u64> {
    let transient = match refusal {
        Refusal::Returned(_) => true,
        Refusal::Channel(text) => text.contains("NOT_FOUND") || text.contains("404"),
        Refusal::Nacked | Refusal::Timeout | Refusal::TooLarge(_) => false,
    };
    if !transient || waited_ms >= bound_ms {
        return None;
    }
    let step = 100u64.saturating_mul(1 << attempt.clamp(1, 8).saturating_sub(1));
    Some(step.min(bound_ms - waited_ms))
}

/// A step of a drill, named in its report as [`StepName::as_text`] says
/// (`consumer`, `published`, `attempt 1`, `tier 10s`, `dead-lettered`,
/// `dlq`, `metric`, `replayed`, `acked`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepName {
    /// A worker consumes the main queue.
    Consumer,
    /// The drill message was published through the pipeline's route.
    Published,
    /// The worker failed this attempt (the first; the others show as the
    /// tier they came back from).
    Attempt(u32),
    /// Through this tier (`10s`, its name) and back.
    Tier(String),
    /// Dead-lettered, by the message's `dlqctl-dead-lettered-at`.
    DeadLettered,
    /// Found in the DLQ, as `exhausted` after the expected attempts.
    Dlq,
    /// The worker's dead-letter counter went up.
    Metric,
    /// The drill replayed it to the main queue.
    Replayed,
    /// The worker acked the replayed copy.
    Acked,
}

impl StepName {
    /// The step's name in the report: `consumer`, `published`,
    /// `attempt N`, `tier NAME`, `dead-lettered`, `dlq`, `metric`,
    /// `replayed`, `acked`.
    pub fn as_text(&self) -> std::borrow::Cow<'static, str> {
        use std::borrow::Cow;
        Cow::Borrowed(match self {
            StepName::Consumer => "consumer",
            StepName::Published => "published",
            StepName::Attempt(n) => return Cow::Owned(format!("attempt {n}")),
            StepName::Tier(t) => return Cow::Owned(format!("tier {t}")),
            StepName::DeadLettered => "dead-lettered",
            StepName::Dlq => "dlq",
            StepName::Metric => "metric",
            StepName::Replayed => "replayed",
            StepName::Acked => "acked",
        })
    }
}

impl std::fmt::Display for StepName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_text())
    }
}

impl serde::Serialize for StepName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.as_text())
    }
}

/// One step of the timeline.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Step {
    /// Which step (a step that did not hold ends the drill).
    pub name: StepName,
    /// Whether it held.
    pub ok: bool,
    /// Milliseconds since the previous step (since the start for the
    /// first).
    pub took_ms: u64,
    /// What was seen, or what to do.
    pub detail: String,
}

/// The steps between publishing (at `published_ms`, Unix milliseconds)
/// and the dead-lettering, read from the DLQ message's `dlqctl-errors`
/// (each failed attempt's time) and `dlqctl-dead-lettered-at`: attempt 1,
/// then each tier the message came back from. A tier whose attempt is
/// missing from the history (it keeps the last 5) shows without a time.
pub fn tier_steps(
    published_ms: u64,
    tiers: &[String],
    errors: &[Value],
    dead_lettered_at: Option<&str>,
) -> Vec<Step> {
    let parse = crate::values::text::parse_rfc3339_millis;
    let time_of = |attempt: usize| -> Option<u64> {
        errors.iter().find_map(|e| {
            (e["attempt"].as_u64() == Some(attempt as u64))
                .then(|| e["time"].as_str().and_then(parse))
                .flatten()
        })
    };
    let mut out = Vec::new();
    let mut last = Some(published_ms);
    let mut step = |name: StepName, at: Option<u64>, detail: String, last: &mut Option<u64>| {
        let took_ms = match (at, *last) {
            (Some(at), Some(l)) => at.saturating_sub(l),
            _ => 0,
        };
        *last = at;
        out.push(Step {
            name,
            ok: true,
            took_ms,
            detail,
        });
    };
    step(
        StepName::Attempt(1),
        time_of(1),
        "failed on purpose by the worker, without the handler".into(),
        &mut last,
    );
    for (i, t) in tiers.iter().enumerate() {
        let at = time_of(i + 2);
        let detail = if at.is_some() {
            format!("through {t} and back: attempt {} failed", i + 2)
        } else {
            "through it (time not kept: the error history holds the last 5)".into()
        };
        step(StepName::Tier(t.clone()), at, detail, &mut last);
    }
    let at = dead_lettered_at.and_then(parse);
    step(
        StepName::DeadLettered,
        at,
        "as exhausted, with dlqctl's headers".into(),
        &mut last,
    );
    out
}

/// What the DLQ message of a drill says against what the drill expects:
/// dead-lettered as `exhausted` after one attempt per tier and one more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetteredVerdict {
    /// As expected.
    AsExpected,
    /// Another reason, or another number of attempts.
    Unexpected {
        /// Its `dlqctl-reason`.
        reason: Option<String>,
        /// Its attempts.
        attempts: Option<i64>,
        /// The attempts the drill expected.
        expected_attempts: usize,
    },
}

impl std::fmt::Display for DeadLetteredVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeadLetteredVerdict::AsExpected => {
                write!(f, "{} as expected", DeadLetterReason::Exhausted.as_str())
            }
            DeadLetteredVerdict::Unexpected {
                reason,
                attempts,
                expected_attempts,
            } => write!(
                f,
                "reason {reason:?} after {attempts:?} attempts, expected {} after \
                 {expected_attempts}",
                DeadLetterReason::Exhausted.as_str()
            ),
        }
    }
}

/// The verdict on a drill message found in the DLQ with `reason` after
/// `attempts`, when the pipeline's decisions send it through `tiers`
/// tiers ([`expected_tiers`]): it must be `exhausted` after `tiers + 1`
/// attempts.
pub fn dead_lettered_verdict(
    reason: Option<&str>,
    attempts: Option<i64>,
    tiers: usize,
) -> DeadLetteredVerdict {
    let expected_attempts = tiers + 1;
    let exhausted = reason == Some(DeadLetterReason::Exhausted.as_str());
    if exhausted && attempts == i64::try_from(expected_attempts).ok() {
        DeadLetteredVerdict::AsExpected
    } else {
        DeadLetteredVerdict::Unexpected {
            reason: reason.map(str::to_string),
            attempts,
            expected_attempts,
        }
    }
}

/// What a drill came to: it passed when every step held, else it failed
/// at its first step that did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrillVerdict {
    /// Every step held.
    Pass,
    /// This step did not hold; the drill ended there.
    FailedAt(StepName),
}

impl DrillVerdict {
    /// The verdict of a timeline: failed at its first step that did not
    /// hold, else passed.
    pub fn of(steps: &[Step]) -> DrillVerdict {
        match steps.iter().find(|s| !s.ok) {
            Some(s) => DrillVerdict::FailedAt(s.name.clone()),
            None => DrillVerdict::Pass,
        }
    }

    /// The step it failed at, if it did.
    pub fn failed_at(&self) -> Option<&StepName> {
        match self {
            DrillVerdict::Pass => None,
            DrillVerdict::FailedAt(step) => Some(step),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pipeline(extra: &str) -> Pipeline {
        let yaml = format!("version: 1\npipelines:\n  - name: orders\n{extra}");
        let mut t = crate::topology::parse_topology(&yaml, "t.yaml").expect("valid");
        t.pipelines.remove(0)
    }

    #[test]
    fn the_route_is_the_producers_exchange_with_a_key_it_binds() {
        assert_eq!(drill_route(&pipeline("")), ("".into(), "orders".into()));
        let topic =
            pipeline("    exchange: {name: in, type: topic, bindings: [\"order.*.x\", \"b\"]}\n");
        assert_eq!(drill_route(&topic), ("in".into(), "order.drill.x".into()));
        let all = pipeline("    exchange: {name: in, type: topic, bindings: [\"#\"]}\n");
        assert_eq!(drill_route(&all), ("in".into(), "drill".into()));
        let fanout = pipeline("    exchange: {name: in, type: fanout}\n");
        assert_eq!(drill_route(&fanout), ("in".into(), "".into()));
        let headers =
            pipeline("    exchange: {name: in, type: headers, bindings: [{arguments: {k: v}}]}\n");
        assert_eq!(drill_route(&headers), ("".into(), "orders".into()));
    }

    #[test]
    fn looks_come_every_second_and_last_at_the_deadline() {
        // Each look's time, as a drill that never finds its message makes
        // them (each look taking no time).
        let looks = |timeout: u64| {
            let mut at = vec![0];
            while let Some(wait) = next_look(*at.last().unwrap(), timeout) {
                at.push(at.last().unwrap() + wait);
            }
            at
        };
        assert_eq!(looks(1), vec![0, 1]);
        assert_eq!(looks(100), vec![0, 100]);
        assert_eq!(looks(1000), vec![0, 1000]);
        assert_eq!(looks(2500), vec![0, 1000, 2000, 2500]);
        // A look that took long: the next one is still at the deadline.
        assert_eq!(next_look(90, 100), Some(10));
        assert_eq!(next_look(100, 100), None);
        assert_eq!(next_look(1020, 100), None);
    }

    #[test]
    fn a_message_found_by_a_look_after_the_deadline_is_late_whatever_the_timeout() {
        for timeout in [1, 100, 1000, 120_000] {
            assert!(in_time(0, timeout));
            assert!(in_time(timeout, timeout));
            // The look at the deadline, woken a little late.
            assert!(in_time(timeout + LOOK_SLACK_MS, timeout));
            assert!(
                !in_time(timeout + LOOK_SLACK_MS + 1, timeout),
                "timeout {timeout}"
            );
        }
        // The issue's case: 100 ms, found at 1.02 s.
        assert!(!in_time(1020, 100));
        assert!(in_time(u64::MAX, u64::MAX));
    }

    #[test]
    fn only_khepri_brokers_wait_for_routability() {
        assert_eq!(routable_wait_ms(Some("3.10.8")), 0);
        assert_eq!(routable_wait_ms(Some("3.13.7")), 0);
        assert_eq!(routable_wait_ms(Some("4.1.4")), 0);
        assert_eq!(routable_wait_ms(Some("4.2.0")), ROUTABLE_WAIT_MS);
        assert_eq!(routable_wait_ms(Some("4.3.6")), ROUTABLE_WAIT_MS);
        assert_eq!(routable_wait_ms(Some("5")), ROUTABLE_WAIT_MS);
        assert_eq!(routable_wait_ms(None), ROUTABLE_WAIT_MS);
        assert_eq!(routable_wait_ms(Some("nonsense")), ROUTABLE_WAIT_MS);
    }

    #[test]
    fn a_publish_not_routable_yet_is_retried_within_the_bound_and_others_never() {
        let returned = Refusal::Returned("312 NO_ROUTE".into());
        let missing = Refusal::Channel("NOT_FOUND - no exchange 'orders-in' in vhost '/'".into());
        // The waits double and stop at the bound.
        let mut waited = 0;
        let mut waits = vec![];
        let mut attempt = 1;
        while let Some(w) = publish_retry(&returned, attempt, waited, 3000) {
            waits.push(w);
            waited += w;
            attempt += 1;
        }
        assert_eq!(waits, vec![100, 200, 400, 800, 1500]);
        assert_eq!(waited, 3000);
        assert_eq!(publish_retry(&missing, 1, 0, 3000), Some(100));
        // No bound (Mnesia): the first refusal is the verdict.
        assert_eq!(publish_retry(&returned, 1, 0, 0), None);
        // A refusal no wait can cure.
        for r in [
            Refusal::Nacked,
            Refusal::Timeout,
            Refusal::TooLarge("size".into()),
            Refusal::Channel("406 PRECONDITION_FAILED".into()),
        ] {
            assert_eq!(publish_retry(&r, 1, 0, 3000), None, "{r:?}");
        }
        // A large attempt number does not overflow.
        assert_eq!(publish_retry(&returned, 60, 0, 3000), Some(3000));
    }

    #[test]
    fn every_failed_attempt_but_the_last_visits_a_tier() {
        let p = pipeline("    retry: {delays: [10s, 1m], max_attempts: 4}\n");
        assert_eq!(expected_tiers(&p), vec!["10s", "1m", "1m"]);
        let p = pipeline("    retry: {delays: [10s, 1m], max_attempts: 1}\n");
        assert_eq!(expected_tiers(&p), Vec::<String>::new());
    }

    #[test]
    fn the_timeline_reads_each_attempts_time() {
        let errors = vec![
            json!({"attempt": 1, "time": "2023-11-14T22:13:20.100Z", "error": "x"}),
            json!({"attempt": 2, "time": "2023-11-14T22:13:20.400Z", "error": "x"}),
            json!({"attempt": 3, "time": "2023-11-14T22:13:20.700Z", "error": "x"}),
        ];
        let published = 1_700_000_000_000;
        let steps = tier_steps(
            published,
            &["10s".into(), "1m".into()],
            &errors,
            Some("2023-11-14T22:13:20.750Z"),
        );
        let names: Vec<(String, u64)> = steps
            .iter()
            .map(|s| (s.name.to_string(), s.took_ms))
            .collect();
        assert_eq!(
            names,
            vec![
                ("attempt 1".to_string(), 100),
                ("tier 10s".to_string(), 300),
                ("tier 1m".to_string(), 300),
                ("dead-lettered".to_string(), 50)
            ]
        );
        assert!(steps.iter().all(|s| s.ok));
        // A history that lost the first attempts.
        let steps = tier_steps(published, &["10s".into()], &errors[2..], None);
        assert_eq!(steps[0].took_ms, 0);
        assert!(steps[1].detail.contains("not kept"), "{:?}", steps[1]);
    }

    #[test]
    fn every_step_is_named_as_the_report_always_named_it() {
        let names = [
            (StepName::Consumer, "consumer"),
            (StepName::Published, "published"),
            (StepName::Attempt(1), "attempt 1"),
            (StepName::Tier("10s".into()), "tier 10s"),
            (StepName::DeadLettered, "dead-lettered"),
            (StepName::Dlq, "dlq"),
            (StepName::Metric, "metric"),
            (StepName::Replayed, "replayed"),
            (StepName::Acked, "acked"),
        ];
        for (step, text) in names {
            assert_eq!(step.to_string(), text);
            assert_eq!(serde_json::to_value(&step).unwrap(), json!(text));
        }
        let step = Step {
            name: StepName::Tier("1m".into()),
            ok: false,
            took_ms: 7,
            detail: "d".into(),
        };
        assert_eq!(
            serde_json::to_string(&step).unwrap(),
            r#"{"name":"tier 1m","ok":false,"took_ms":7,"detail":"d"}"#
        );
    }

    #[test]
    fn the_dlq_message_must_be_exhausted_after_one_attempt_per_tier_and_one_more() {
        assert_eq!(
            dead_lettered_verdict(Some("exhausted"), Some(3), 2),
            DeadLetteredVerdict::AsExpected
        );
        assert_eq!(
            dead_lettered_verdict(Some("exhausted"), Some(1), 0),
            DeadLetteredVerdict::AsExpected
        );
        let wrong = [
            (Some("permanent"), Some(3)),
            (Some("too_large"), Some(3)),
            (None, Some(3)),
            (Some("Exhausted"), Some(3)),
            (Some("exhausted"), Some(2)),
            (Some("exhausted"), Some(4)),
            (Some("exhausted"), None),
        ];
        for (reason, attempts) in wrong {
            let v = dead_lettered_verdict(reason, attempts, 2);
            assert_eq!(
                v,
                DeadLetteredVerdict::Unexpected {
                    reason: reason.map(str::to_string),
                    attempts,
                    expected_attempts: 3
                }
            );
        }
        assert_eq!(
            dead_lettered_verdict(Some("permanent"), Some(1), 2).to_string(),
            "reason Some(\"permanent\") after Some(1) attempts, expected exhausted after 3"
        );
    }

    #[test]
    fn a_drill_fails_at_its_first_step_that_did_not_hold_else_passes() {
        let step = |name: StepName, ok: bool| Step {
            name,
            ok,
            took_ms: 0,
            detail: String::new(),
        };
        assert_eq!(DrillVerdict::of(&[]), DrillVerdict::Pass);
        let held = [
            step(StepName::Consumer, true),
            step(StepName::Published, true),
            step(StepName::Acked, true),
        ];
        assert_eq!(DrillVerdict::of(&held), DrillVerdict::Pass);
        assert_eq!(DrillVerdict::of(&held).failed_at(), None);
        let broken = [
            step(StepName::Consumer, true),
            step(StepName::Tier("10s".into()), false),
            step(StepName::Dlq, false),
        ];
        let v = DrillVerdict::of(&broken);
        assert_eq!(v, DrillVerdict::FailedAt(StepName::Tier("10s".into())));
        assert_eq!(v.failed_at(), Some(&StepName::Tier("10s".into())));
    }
}
