//! `dlqctl drill`: a fire drill on a live pipeline. Publishes one drill
//! message (see [`crate::core::drill::message`]) through the pipeline's own
//! route, follows it to the DLQ, checks the worker's dead-letter counter
//! (with a metrics URL), replays it and sees it acked, and removes every
//! trace, also when a step fails or the drill is cancelled.
//!
//! A step that does not hold ends the drill, named; what is left of the
//! message is then removed from the DLQ. A message stuck before the DLQ
//! (no worker, a tier that routes nowhere) cannot be taken out of a queue
//! others use: the worker sends it to the DLQ when the path is repaired
//! (it is never handed to a handler), and the next drill removes it there
//! (every drill first removes the DLQ's leftover drill messages).

use crate::amqp::declare::passive_queue;
use crate::amqp::mgmt::Management;
use crate::amqp::publisher::Publisher;
use crate::core::audit::finding::Finding;
use crate::core::audit::policy::policy_findings;
use crate::core::dlq::select::Selector;
use crate::core::drill::message::DRILL_ERROR;
use crate::core::drill::timeline::{
    dead_lettered_verdict, drill_route, expected_tiers, in_time, next_look, publish_retry,
    routable_wait_ms, tier_steps, DeadLetteredVerdict, DrillVerdict, Step, StepName,
};
use crate::core::retry::DeadLetterReason;
use crate::core::topology::plan::Role;
use crate::core::topology::Pipeline;
use crate::core::values::duration::tier_name;
use crate::core::wire::{DRILL_HEADER, DRILL_MESSAGE_ID_PREFIX};
use crate::error::Result;
use crate::ops::dlq::Target;
use crate::ops::policies::PolicyView;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Connection};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// What the command line gives a drill.
#[derive(Debug, Clone)]
pub struct DrillOptions {
    /// How long the message may take from its publish to the DLQ; found
    /// only after it, the drill fails.
    pub timeout: Duration,
    /// A worker's metrics page, to see its dead-letter counter go up.
    pub metrics_url: Option<String>,
    /// Cancels the drill (SIGINT): it cleans up and ends.
    pub cancel: CancellationToken,
}

/// What a drill found.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[non_exhaustive]
pub struct DrillReport {
    /// The pipeline.
    pub pipeline: String,
    /// This drill's id (the value of its `dlqctl-drill` header).
    pub id: String,
    /// Every step, in order; the last one failed when `failed` is set.
    pub steps: Vec<Step>,
    /// The step that did not hold.
    pub failed: Option<StepName>,
    /// Drill messages of earlier drills removed from the DLQ first.
    pub swept: u64,
    /// Drill messages removed from the DLQ at the end (the drill's own,
    /// after a failure).
    pub removed: u64,
    /// Wall time, milliseconds.
    pub elapsed_ms: u64,
    /// The pipeline's automatic redrive, when it has a policy: its last
    /// run in words (see
    /// [`crate::core::dlq::redrive_state::RedriveState::summary`]), or why
    /// it is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redrive: Option<String>,
}

impl DrillReport {
    /// Passed, or failed at the first step that did not hold.
    pub fn verdict(&self) -> DrillVerdict {
        DrillVerdict::of(&self.steps)
    }

    fn ok(&mut self, name: StepName, since: &mut Instant, detail: impl Into<String>) {
        self.steps.push(Step {
            name,
            ok: true,
            took_ms: since.elapsed().as_millis() as u64,
            detail: detail.into(),
        });
        *since = Instant::now();
    }

    fn fail(&mut self, name: StepName, since: &Instant, detail: impl Into<String>) {
        self.failed = Some(name.clone());
        self.steps.push(Step {
            name,
            ok: false,
            took_ms: since.elapsed().as_millis() as u64,
            detail: detail.into(),
        });
    }
}

/// The pipeline's redrive in words, from its shared state.
async fn redrive_summary(conn: &Connection, p: &Pipeline) -> String {
    let now = crate::ops::dlq::now_ms();
    match crate::ops::dlq::redrive_state::peek(conn, &p.redrive_state_queue()).await {
        Ok(Some(s)) => s
            .summary(now)
            .map(|(_, text)| text)
            .unwrap_or_else(|| "no run yet".into()),
        Ok(None) => "no run yet".into(),
        Err(e) => format!("the shared state is unreadable: {e}"),
    }
}

/// The drill message's body.
const DRILL_BODY: &[u8] = b"dlqctl drill: a synthetic message";

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A drill under way: where it runs and what it looks for.
struct Drill<'a> {
    p: &'a Pipeline,
    mgmt: Option<&'a Management>,
    vhost: &'a str,
    /// The pipeline's DLQ, on the drill's connection.
    target: Target,
    opts: &'a DrillOptions,
    /// This drill's id.
    id: String,
    /// Its own message: the drill header with its id.
    mine: Selector,
}

impl Drill<'_> {
    fn conn(&self) -> &Arc<Connection> {
        &self.target.conn
    }
}

/// Runs a drill on `p`. An error means the broker could not be asked.
pub async fn drill(
    conn: Arc<Connection>,
    p: &Pipeline,
    mgmt: Option<&Management>,
    vhost: &str,
    user: &str,
    opts: &DrillOptions,
) -> Result<DrillReport> {
    let started = Instant::now();
    let id = format!("{:016x}", rand::random::<u64>());
    let mut r = DrillReport {
        pipeline: p.name.clone(),
        id: id.clone(),
        ..DrillReport::default()
    };
    // Its looks seek its own message: no wait for the DLQ's depth to
    // hold still, so a look is quick and the deadline kept.
    let target = Target::for_pipeline(
        conn,
        p,
        user,
        format!("dlqctl drill {}", p.name),
        opts.cancel.clone(),
    )
    .waiting(true)
    .unsettled();
    // Leftovers of earlier drills (a kill -9 mid-run).
    let leftovers = Selector {
        error: Some(DRILL_ERROR.to_string()),
        ..Selector::default()
    };
    r.swept = crate::ops::dlq::purge::purge(&target, &leftovers, None, true, &mut |_| {})
        .await?
        .removed;
    let d = Drill {
        p,
        mgmt,
        vhost,
        target,
        opts,
        mine: Selector {
            headers: vec![(DRILL_HEADER.to_string(), id.clone())],
            ..Selector::default()
        },
        id,
    };
    let result = steps(&d, &mut r).await;
    if r.verdict() != DrillVerdict::Pass || result.is_err() {
        let fresh = d.target.with_cancel(CancellationToken::new());
        if let Ok(p) = crate::ops::dlq::purge::purge(&fresh, &d.mine, None, true, &mut |_| {}).await
        {
            r.removed = p.removed;
        }
    }
    if p.dead_letter.redrive.is_some() {
        r.redrive = Some(redrive_summary(d.conn(), p).await);
    }
    r.elapsed_ms = started.elapsed().as_millis() as u64;
    result.map(|()| r)
}

async fn steps(d: &Drill<'_>, r: &mut DrillReport) -> Result<()> {
    let (p, opts) = (d.p, d.opts);
    let before = match &opts.metrics_url {
        Some(u) => Some(dead_letters(u, &p.name).await.unwrap_or(0.0)),
        None => None,
    };
    let version = match d.mgmt {
        Some(m) => m.version().await.ok().flatten(),
        None => None,
    };
    let routable_wait = routable_wait_ms(version.as_deref());
    let Some((published_ms, mut since)) = publish_step(d, routable_wait, r).await? else {
        return Ok(());
    };

    // To the DLQ.
    let Some(found) = to_dlq(d, &since, r).await? else {
        return Ok(());
    };
    let tiers = expected_tiers(p);
    let m = &found.described;
    let mut timeline = tier_steps(
        published_ms,
        &tiers,
        &m.errors,
        m.dead_lettered_at.as_deref(),
    );
    r.steps.append(&mut timeline);
    match dead_lettered_verdict(m.reason.as_deref(), m.attempts, tiers.len()) {
        DeadLetteredVerdict::AsExpected => r.ok(
            StepName::Dlq,
            &mut since,
            format!("in {} with dlqctl's headers", p.dead_letter.queue),
        ),
        unexpected => {
            r.fail(StepName::Dlq, &since, unexpected.to_string());
            return Ok(());
        }
    }
    after_dlq(d, before, since, r).await
}

/// Looks for the drill message in the DLQ until `--timeout` after the
/// publish (`since`): every second and once more at the deadline
/// ([`next_look`]); found by a look that started after it, it is late
/// ([`in_time`]), the same for every timeout. `Ok(None)` when the step
/// failed (recorded in `r`, with the likeliest broken step).
async fn to_dlq(
    d: &Drill<'_>,
    since: &Instant,
    r: &mut DrillReport,
) -> Result<Option<crate::ops::dlq::PeekedMessage>> {
    let (p, opts) = (d.p, d.opts);
    let timeout_ms = opts.timeout.as_millis() as u64;
    let timeout = tier_name(timeout_ms);
    loop {
        if opts.cancel.is_cancelled() {
            r.fail(StepName::Dlq, since, "cancelled");
            return Ok(None);
        }
        let look_ms = since.elapsed().as_millis() as u64;
        let peek = crate::ops::dlq::peek(&d.target, &d.mine, 1).await?;
        if let Some(m) = peek.messages.into_iter().next() {
            if in_time(look_ms, timeout_ms) {
                return Ok(Some(m));
            }
            r.fail(
                StepName::Dlq,
                since,
                format!(
                    "in {} only after {:.2}s, past --timeout {timeout}",
                    p.dead_letter.queue,
                    look_ms as f64 / 1000.0
                ),
            );
            return Ok(None);
        }
        let elapsed = since.elapsed().as_millis() as u64;
        let Some(wait) = next_look(elapsed, timeout_ms) else {
            let (step, why) = diagnose(d).await;
            let why = with_breaker(why, opts, p).await;
            r.fail(
                step,
                since,
                format!("not in {} after {timeout}: {why}", p.dead_letter.queue),
            );
            return Ok(None);
        };
        // Each look reads the DLQ up to the drill message (at its tail).
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

/// The first steps: a consumer on the main queue, then the drill message
/// published through the pipeline's route. `Ok(None)` when one failed.
async fn publish_step(
    d: &Drill<'_>,
    routable_wait: u64,
    r: &mut DrillReport,
) -> Result<Option<(u64, Instant)>> {
    let (conn, p, id) = (d.conn(), d.p, d.id.as_str());
    let mut since = Instant::now();
    match passive_queue(conn, &p.name).await? {
        None => {
            r.fail(
                StepName::Consumer,
                &since,
                format!("queue {} does not exist: run `dlqctl provision`", p.name),
            );
            return Ok(None);
        }
        Some(c) if c.consumers == 0 => {
            r.fail(
                StepName::Consumer,
                &since,
                format!("no worker consumes {}: start `dlqctl work`", p.name),
            );
            return Ok(None);
        }
        Some(c) => r.ok(
            StepName::Consumer,
            &mut since,
            format!("{} consumer(s) on {}", c.consumers, p.name),
        ),
    }
    let (exchange, key) = drill_route(p);
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from(DRILL_HEADER),
        AMQPValue::LongString(LongString::from(id)),
    );
    let props = BasicProperties::default()
        .with_message_id(format!("{DRILL_MESSAGE_ID_PREFIX}{id}").as_str().into())
        .with_content_type("text/plain".into())
        .with_delivery_mode(2)
        .with_headers(headers);
    let publisher = Publisher::new(conn.clone(), 1, Duration::from_secs(10));
    let published_ms = now_unix_ms();
    let route = if exchange.is_empty() {
        format!("the default exchange [{key}]")
    } else {
        format!("exchange {exchange} [{key}]")
    };
    // A node may not route to objects declared a moment ago yet (Khepri,
    // 4.2+): publish again for a bounded while ([`publish_retry`]).
    let (mut attempt, mut waited) = (1, 0);
    while let Err(refusal) = publisher
        .publish(&exchange, &key, DRILL_BODY, props.clone())
        .await
    {
        let Some(wait) = publish_retry(&refusal, attempt, waited, routable_wait) else {
            let retried = match waited {
                0 => String::new(),
                w => format!(" (published again for {}: still refused)", tier_name(w)),
            };
            r.fail(
                StepName::Published,
                &since,
                format!("through {route}: {refusal}{retried}"),
            );
            return Ok(None);
        };
        tokio::time::sleep(Duration::from_millis(wait)).await;
        (attempt, waited) = (attempt + 1, waited + wait);
    }
    let again = match attempt {
        1 => String::new(),
        n => format!(" (routed at attempt {n}, after {})", tier_name(waited)),
    };
    r.ok(
        StepName::Published,
        &mut since,
        format!("through {route}{again}"),
    );
    Ok(Some((published_ms, since)))
}

/// The steps after the DLQ: the metric, the replay, the ack.
async fn after_dlq(
    d: &Drill<'_>,
    before: Option<f64>,
    mut since: Instant,
    r: &mut DrillReport,
) -> Result<()> {
    let (p, opts, id) = (d.p, d.opts, d.id.as_str());
    let exhausted = DeadLetterReason::Exhausted.as_str();
    if let (Some(u), Some(before)) = (&opts.metrics_url, before) {
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let now = dead_letters(u, &p.name).await.unwrap_or(before);
            if now > before {
                r.ok(
                    StepName::Metric,
                    &mut since,
                    format!(
                        "dlqctl_dead_letters_total{{reason=\"{exhausted}\"}} {before} -> {now}"
                    ),
                );
                break;
            }
            if Instant::now() >= until {
                r.fail(StepName::Metric, &since, format!("dlqctl_dead_letters_total{{reason=\"{exhausted}\"}} stayed at {before} on {}", crate::amqp::connection::redact(u)));
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    let replay = crate::ops::dlq::replay::replay(
        &d.target,
        &crate::ops::dlq::replay::ReplayOptions {
            limit: Some(1),
            ..crate::ops::dlq::replay::ReplayOptions::new(
                &p.name,
                d.mine.clone(),
                format!("drill-{id}"),
            )
        },
        &mut |_| {},
    )
    .await?;
    if replay.moved != 1 {
        r.fail(
            StepName::Replayed,
            &since,
            format!(
                "moved {}: {}",
                crate::core::values::text::count(replay.moved, "message"),
                replay.why_failed.unwrap_or_default()
            ),
        );
        return Ok(());
    }
    r.ok(StepName::Replayed, &mut since, format!("to {}", p.name));

    // Acked: the worker takes the copy and does not dead-letter it again.
    let acks_before = match &opts.metrics_url {
        Some(u) => metric(u, "dlqctl_decisions_total", &p.name, "decision=\"ack\"").await,
        None => None,
    };
    let settle = Duration::from_secs(2);
    tokio::time::sleep(settle).await;
    let back = crate::ops::dlq::peek(&d.target, &d.mine, 1).await?;
    if !back.messages.is_empty() {
        r.fail(StepName::Acked, &since, "the replayed copy was dead-lettered again: the worker did not recognise the drill message (an older dlqctl?)");
        return Ok(());
    }
    let detail = match (&opts.metrics_url, acks_before) {
        (Some(u), Some(_)) => {
            match metric(u, "dlqctl_decisions_total", &p.name, "decision=\"ack\"").await {
                Some(n) => format!("by the worker (acks: {n}); not dead-lettered again"),
                None => "not dead-lettered again".into(),
            }
        }
        _ => "not dead-lettered again within 2s".into(),
    };
    r.ok(StepName::Acked, &mut since, detail);
    Ok(())
}

/// Which step most likely broke, when the message did not reach the DLQ:
/// no consumer, a tier that does not route back (its dead-letter
/// arguments, or messages held for its DLX), a retry binding missing, the
/// DLX not bound to the DLQ; else a timeout.
async fn diagnose(d: &Drill<'_>) -> (StepName, String) {
    let (p, vhost) = (d.p, d.vhost);
    if let Ok(Some(c)) = passive_queue(d.conn(), &p.name).await {
        if c.consumers == 0 {
            return (StepName::Consumer, format!("no worker consumes {}", p.name));
        }
    }
    let Some(m) = d.mgmt else {
        return (
            StepName::Dlq,
            "no management API to tell which step broke".into(),
        );
    };
    for t in p.retry.tiers() {
        let q = p.retry_queue(t);
        let tier = StepName::Tier(crate::core::values::duration::tier_name(t));
        match m.queue(vhost, &q).await {
            Ok(Some(doc)) => {
                let args = &doc["arguments"];
                if args["x-dead-letter-exchange"] != ""
                    || args["x-dead-letter-routing-key"] != p.name.as_str()
                {
                    return (
                        tier,
                        format!(
                            "{q} does not route back to {} (its dead-letter arguments: {} / {})",
                            p.name,
                            args["x-dead-letter-exchange"],
                            args["x-dead-letter-routing-key"]
                        ),
                    );
                }
                if doc["messages_dlx"].as_u64().unwrap_or(0) > 0 {
                    return (
                        tier,
                        format!(
                            "{q} holds messages it cannot dead-letter back to {}",
                            p.name
                        ),
                    );
                }
            }
            Ok(None) => return (tier, format!("{q} does not exist")),
            Err(_) => {}
        }
        let key = crate::core::values::duration::tier_name(t);
        if let Ok(b) = m.bindings(vhost, &p.retry_exchange(), &q).await {
            if !b.iter().any(|b| b.routing_key == key) {
                return (
                    tier,
                    format!("{} does not route [{key}] to {q}", p.retry_exchange()),
                );
            }
        }
    }
    if let Ok(b) = m
        .bindings(vhost, &p.dead_letter_exchange(), &p.dead_letter.queue)
        .await
    {
        if b.is_empty() {
            return (
                StepName::Dlq,
                format!(
                    "{} has no binding to {}",
                    p.dead_letter_exchange(),
                    p.dead_letter.queue
                ),
            );
        }
    }
    if let Some(cause) = policy_cause(m, p, vhost).await {
        return cause;
    }
    (StepName::Dlq, NO_BROKEN_STEP.into())
}

/// What [`diagnose`] says when every step it can see holds.
const NO_BROKEN_STEP: &str = "no broken step found; raise --timeout, or look at the worker's log";

/// `why`, with what the worker's circuit breaker says when `--metrics-url`
/// shows it open or half-open: instead of "no broken step found", or
/// after the step found.
async fn with_breaker(why: String, opts: &DrillOptions, p: &Pipeline) -> String {
    let Some(url) = &opts.metrics_url else {
        return why;
    };
    let paused = crate::ops::metrics_page::circuits(url, [p.name.as_str()])
        .await
        .ok()
        .and_then(|mut c| c.remove(&p.name))
        .and_then(|c| c.pause_sentence(&p.name));
    match paused {
        None => why,
        Some(breaker) if why == NO_BROKEN_STEP => breaker,
        Some(breaker) => format!("{why}; and {breaker}"),
    }
}

/// The first policy or operator policy that makes a queue of the pipeline
/// differ from its topology, as `doctor` finds it (worked out from the
/// policy definitions: [`PolicyView`]), with the step it breaks: a tier,
/// else the DLQ (a TTL or a dead-letter exchange on the DLQ loses the
/// message before a look finds it).
async fn policy_cause(m: &Management, p: &Pipeline, vhost: &str) -> Option<(StepName, String)> {
    let view = PolicyView::read(m, vhost).await;
    let listed = m.list_queues(vhost).await.ok()?;
    let plan = crate::core::topology::plan::pipeline_plan(p);
    let mut queues: Vec<_> = plan.queues.iter().collect();
    // The DLQ first: the step a drill fails at.
    queues.sort_by_key(|q| q.role != Role::DeadLetterQueue);
    for q in queues {
        let Some(l) = listed.iter().find(|l| l.name == q.name) else {
            continue;
        };
        let kind = l.kind.as_deref();
        let Some(applied) = view.applied(q, kind, l.policies.as_ref()) else {
            continue;
        };
        let kind = kind.unwrap_or(crate::ops::policies::planned_type(q));
        let found = policy_findings(q, kind, &applied);
        let Some(f) = found
            .iter()
            .find(|f| matches!(f, Finding::PolicyOverrides { .. }))
        else {
            continue;
        };
        let step = match (q.role, q.name.rsplit_once(".retry.")) {
            (Role::RetryQueue, Some((_, tier))) => StepName::Tier(tier.to_string()),
            _ => StepName::Dlq,
        };
        return Some((
            step,
            format!("{f}; remove the key from the policy or narrow its pattern"),
        ));
    }
    None
}

/// The worker's exhausted dead letters for `queue`.
async fn dead_letters(url: &str, queue: &str) -> Option<f64> {
    metric(
        url,
        "dlqctl_dead_letters_total",
        queue,
        "reason=\"exhausted\"",
    )
    .await
}

/// A sample of `name` labelled `queue="QUEUE"` and `label` on a metrics
/// page.
async fn metric(url: &str, name: &str, queue: &str, label: &str) -> Option<f64> {
    let text = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .ok()?
        .get(url)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let q = format!("queue=\"{queue}\"");
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.split_once('}')?;
        let ls: Vec<&str> = labels.split(',').collect();
        (ls.contains(&q.as_str()) && ls.contains(&label))
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_its_steps_and_the_failed_one_as_it_always_did() {
        let mut r = DrillReport {
            pipeline: "orders".into(),
            id: "d1".into(),
            ..DrillReport::default()
        };
        let mut since = Instant::now();
        r.ok(StepName::Consumer, &mut since, "1 consumer(s) on orders");
        r.fail(StepName::Tier("10s".into()), &since, "broken");
        assert_eq!(
            r.verdict(),
            DrillVerdict::FailedAt(StepName::Tier("10s".into()))
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["failed"], "tier 10s");
        assert_eq!(json["steps"][0]["name"], "consumer");
        assert_eq!(json["steps"][1]["name"], "tier 10s");
        assert_eq!(json["steps"][1]["ok"], false);
        let text = serde_json::to_string(&r).unwrap();
        assert!(
            text.starts_with(r#"{"pipeline":"orders","id":"d1","steps":[{"name":"consumer","#),
            "{text}"
        );
        assert!(
            text.contains(r#""detail":"broken"}],"failed":"tier 10s","swept":0,"removed":0,"#),
            "{text}"
        );
        let passed = DrillReport::default();
        assert_eq!(passed.verdict(), DrillVerdict::Pass);
        assert_eq!(
            serde_json::to_value(&passed).unwrap()["failed"],
            serde_json::Value::Null
        );
    }
}
