//! `dlqctl doctor`: the checklist of what the broker will do differently
//! from the topology. Pure: the shell gathers a [`Snapshot`] (AMQP and the
//! management API) and [`checklist`] judges it, each item pass, warn, fail
//! or skip with a sentence that says what to do.
//!
//! What is judged, per pipeline (docs/doctor.md):
//!
//! - the broker: its version and the counting rules that follow from it,
//!   and whether the management API answers for the same broker;
//! - objects: every planned exchange and queue exists;
//! - policies: each key of a policy or operator policy that changes a
//!   queue is a fail (see [`crate::check::policy`]), the others pass;
//! - limits: a DLQ retention under 7 days warns; a handler timeout not
//!   under the consumer timeout fails; the broker's message size limit;
//! - health: quorum members online, `messages_dlx` over two samples, the
//!   DLX's binding to the DLQ, consumers on the main queue, `--max-dlq`,
//!   and the worker's circuit breaker (from `--metrics-url`);
//! - permissions: each command the connecting user could or could not run;
//! - idempotency: the store answers, `keep` against the DLQ's retention,
//!   an SQLite store while consumers come from several hosts
//!   ([`crate::check::idempotency`]).

use crate::check::circuit::CircuitReading;
use crate::check::cycle::dead_letter_cycle;
use crate::check::finding::Finding;
use crate::check::idempotency::{self, hosts_check, keep_check, store_check, IdempotencyFacts};
use crate::check::permissions::{verdicts, UserPermissions, Verdict};
use crate::check::policy::{policy_findings, AppliedPolicies};
use crate::dlq::redrive_state::RedriveState;
use crate::topology::plan::{Plan, QueueSpec, Role};
use crate::topology::ArgValue;
use crate::values::duration::tier_name;
use crate::values::text::count;
use std::collections::HashMap;

/// A DLQ that keeps its messages for less than this warns: an incident
/// found on a Monday needs Friday's evidence.
pub const MIN_DLQ_RETENTION_MS: u64 = 7 * 86_400_000;

pub use crate::check::consumer_timeout::DEFAULT_CONSUMER_TIMEOUT_MS;

/// What a retry or dead-letter copy may add to a message (dlqctl's
/// headers stay under 8 KiB).
pub const COPY_HEADROOM_BYTES: u64 = 8 * 1024;

/// The metric through which a worker publishes its handler timeout.
pub const HANDLER_TIMEOUT_METRIC: &str = "dlqctl_handler_timeout_seconds";

/// How an item came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// As the topology wants.
    Pass,
    /// Could not be checked (the sentence says why).
    Skip,
    /// Works, but deserves a look.
    Warn,
    /// The broker will not do what the topology asks.
    Fail,
}

impl Level {
    /// `pass`, `skip`, `warn`, `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Pass => "pass",
            Level::Skip => "skip",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// The part of the checklist an item belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Area {
    /// Version and management API.
    Broker,
    /// The planned exchanges and queues exist.
    Objects,
    /// Policies and operator policies.
    Policies,
    /// Retention, timeouts, sizes.
    Limits,
    /// Members, held messages, bindings, consumers, depth.
    Health,
    /// What the connecting user may run.
    Permissions,
    /// The idempotency store of a pipeline with `idempotency`.
    Idempotency,
}

impl Area {
    /// `broker`, `objects`, `policies`, `limits`, `health`, `permissions`.
    pub fn as_str(self) -> &'static str {
        match self {
            Area::Broker => "broker",
            Area::Objects => "objects",
            Area::Policies => "policies",
            Area::Limits => "limits",
            Area::Health => "health",
            Area::Permissions => "permissions",
            Area::Idempotency => "idempotency",
        }
    }
}

/// One item of the checklist.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Check {
    /// The pipeline it is about; `None` for the broker itself.
    pub pipeline: Option<String>,
    /// Its part of the checklist.
    pub area: Area,
    /// How it came out.
    pub level: Level,
    /// What was checked, in a few words (`queue orders.dlq`, `version`).
    pub subject: String,
    /// What was found, and what to do when it is not a pass.
    pub message: String,
}

/// Whether the management API answered, and for which broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManagementState {
    /// It answers, for the broker the AMQP connection reached.
    Answers,
    /// It does not answer (why).
    Unreachable(String),
    /// It answers for another broker (what it said).
    OtherBroker(String),
}

/// What the broker says of one planned queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueFacts {
    /// The queue exists (a passive declare).
    pub exists: bool,
    /// Ready messages (AMQP, fresh).
    pub ready: Option<u64>,
    /// Consumers (AMQP, fresh).
    pub consumers: Option<u64>,
    /// Ready plus unacked, from the management API.
    pub messages: Option<u64>,
    /// Its type as the broker reports it (`quorum`, `classic`).
    pub kind: Option<String>,
    /// The policies that apply; `None` when unknown.
    pub policies: Option<AppliedPolicies>,
    /// `messages_dlx` at each sample, oldest first; empty when unknown.
    pub messages_dlx: Vec<u64>,
    /// A quorum queue's members online and in all, when known.
    pub members: Option<(usize, usize)>,
}

/// The handler timeout of the pipeline's workers, and where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerTimeout {
    /// The timeout in milliseconds.
    pub ms: u64,
    /// `--handler-timeout`, or the metrics URL.
    pub source: String,
}

/// Why doctor does not know the user's permissions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PermissionsUnknown {
    /// No management API answered.
    #[error("the management API does not answer for this broker")]
    NoManagement,
    /// The user has no permissions entry in the vhost.
    #[error("user {0} has no permissions in this virtual host")]
    NoneInVhost(String),
    /// The management API refused or failed the request.
    #[error("{0}")]
    Refused(String),
}

/// Everything doctor reads from the broker, the worker and the command
/// line, for one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// `rabbitmq_version` from the management API, when it answered.
    pub version: Option<String>,
    /// The management API's state.
    pub management: ManagementState,
    /// The user of the AMQP connection.
    pub user: String,
    /// The user's permissions in the vhost, or why they are unknown.
    pub permissions: Result<UserPermissions, PermissionsUnknown>,
    /// Exchanges of the plan that do not exist.
    pub missing_exchanges: Vec<String>,
    /// Every planned queue, by name.
    pub queues: HashMap<String, QueueFacts>,
    /// Per pipeline: whether its DLX is bound to its DLQ (`None`: unknown).
    pub dlx_bound: HashMap<String, Option<bool>>,
    /// The seconds between the two samples of `messages_dlx`.
    pub sample_gap_s: u64,
    /// The handler timeout per pipeline, when given or read.
    pub handler_timeout: HashMap<String, HandlerTimeout>,
    /// `--max-dlq`.
    pub max_dlq: Option<u64>,
    /// Why the handler timeout could not be read from a worker's metrics.
    pub handler_timeout_error: Option<String>,
    /// Per pipeline: its circuit breaker, as a worker's metrics page shows
    /// it (only pipelines the page has a breaker for).
    pub circuit: HashMap<String, CircuitReading>,
    /// Set when the policies were read from the queues' own, possibly
    /// older, fields because their definitions could not be: the warning.
    pub policies_from_queue_view: Option<String>,
    /// Per pipeline with a redrive policy: its shared redrive state
    /// (`Ok(None)`: no run yet), or why it could not be read.
    pub redrive: HashMap<String, Result<Option<RedriveState>, String>>,
    /// When the snapshot was taken, ms since the Unix epoch.
    pub now_ms: u64,
    /// Per pipeline with `idempotency`: its block and what its store
    /// answered.
    pub idempotency: HashMap<String, IdempotencyFacts>,
    /// Per queue: the distinct hosts its consumers connect from
    /// (`peer_host`, management API), sorted; absent when unknown.
    pub consumer_hosts: HashMap<String, Vec<String>>,
}

/// The whole checklist: the broker's items, then each pipeline of `plan`
/// (in plan order) whose name `only` accepts.
pub fn checklist(plan: &Plan, s: &Snapshot, only: Option<&str>) -> Vec<Check> {
    let mut out = broker_checks(s);
    let pipelines = plan
        .queues
        .iter()
        .filter(|q| q.role == Role::MainQueue && only.is_none_or(|o| o == q.pipeline));
    for main in pipelines {
        let p = main.pipeline.as_str();
        let mut add = |area: Area, level: Level, subject: String, message: String| {
            out.push(Check {
                pipeline: Some(p.to_string()),
                area,
                level,
                subject,
                message,
            })
        };
        let queues: Vec<&QueueSpec> = plan.queues.iter().filter(|q| q.pipeline == p).collect();
        for (area, level, subject, message) in object_checks(plan, p, &queues, s)
            .into_iter()
            .chain(policy_checks(&queues, s))
            .chain(cycle_checks(plan, &queues, s))
            .chain(limit_checks(&queues, s, p))
            .chain(health_checks(&queues, s, p))
            .chain(circuit_check(s, p))
            .chain(redrive_check(s, p))
            .chain(permission_checks(plan, s, p))
            .chain(idempotency_checks(&queues, s, p))
        {
            add(area, level, subject, message);
        }
    }
    out
}

/// The worst level of a checklist (`Pass` when empty).
pub fn worst(checks: &[Check]) -> Level {
    checks.iter().map(|c| c.level).max().unwrap_or(Level::Pass)
}

/// An item before its pipeline is set.
type Item = (Area, Level, String, String);

/// `(major, minor)` of a version string such as `3.10.8` or `4.3.6+dfsg`.
pub fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The broker's default `max_message_size` for a version.
fn max_message_size(major: u32) -> u64 {
    if major >= 4 {
        16 << 20
    } else {
        128 << 20
    }
}

fn broker_checks(s: &Snapshot) -> Vec<Check> {
    let item = |level: Level, subject: &str, message: String| Check {
        pipeline: None,
        area: Area::Broker,
        level,
        subject: subject.into(),
        message,
    };
    let mut out = vec![match s.version.as_deref().map(|v| (v, major_minor(v))) {
        None => item(
            Level::Skip,
            "version",
            "unknown: the management API did not answer (AMQP does not tell it to dlqctl)".into(),
        ),
        Some((v, None)) => item(
            Level::Warn,
            "version",
            format!("RabbitMQ `{v}`: not a version dlqctl can read; it needs 3.10 or later"),
        ),
        Some((v, Some(mm))) if mm < (3, 10) => item(
            Level::Fail,
            "version",
            format!(
                "RabbitMQ {v}: dlqctl needs 3.10 or later (at-least-once dead-lettering of \
                 quorum queues); upgrade the broker"
            ),
        ),
        Some((v, Some((major, minor)))) => item(
            Level::Pass,
            "version",
            format!("RabbitMQ {v}: {}", semantics(major, minor)),
        ),
    }];
    out.push(match &s.management {
        ManagementState::Answers => item(
            Level::Pass,
            "management API",
            "answers, for the broker the AMQP connection reached".into(),
        ),
        ManagementState::Unreachable(why) => item(
            Level::Warn,
            "management API",
            format!(
                "does not answer ({why}): policies, health and permissions cannot be checked; \
                 give --management-url and a user with the `monitoring` tag"
            ),
        ),
        ManagementState::OtherBroker(why) => item(
            Level::Fail,
            "management API",
            format!("{why}; its policies and statistics are not this broker's"),
        ),
    });
    if let Some(note) = &s.policies_from_queue_view {
        out.push(item(Level::Warn, "policies", note.clone()));
    }
    out
}

/// What a version counts and limits (docs/brokers.md, "At a glance").
fn semantics(major: u32, minor: u32) -> String {
    let size = max_message_size(major) >> 20;
    match (major, minor) {
        (3, _) => format!(
            "x-delivery-count counts every return to a quorum queue; no default delivery-limit; \
             max_message_size {size} MiB by default"
        ),
        (4, 0..=2) => format!(
            "x-delivery-count counts every return to a quorum queue; default delivery-limit 20 \
             (dlqctl sets its own); max_message_size {size} MiB by default"
        ),
        _ => format!(
            "x-delivery-count counts failed deliveries only (not nack with requeue), \
             x-acquired-count every hand-off; default delivery-limit 20 (dlqctl sets its own); \
             max_message_size {size} MiB by default"
        ),
    }
}

fn object_checks(plan: &Plan, p: &str, queues: &[&QueueSpec], s: &Snapshot) -> Vec<Item> {
    let mut out = Vec::new();
    let exchanges: Vec<&str> = plan
        .exchanges
        .iter()
        .filter(|e| e.pipelines.iter().any(|x| x == p))
        .map(|e| e.name.as_str())
        .collect();
    for e in exchanges
        .iter()
        .filter(|e| s.missing_exchanges.iter().any(|m| m == *e))
    {
        out.push((
            Area::Objects,
            Level::Fail,
            format!("exchange {e}"),
            "does not exist: run `dlqctl provision`".into(),
        ));
    }
    for q in queues {
        if !s.queues.get(&q.name).is_some_and(|f| f.exists) {
            out.push((
                Area::Objects,
                Level::Fail,
                format!("queue {}", q.name),
                "does not exist: run `dlqctl provision`".into(),
            ));
        }
    }
    if out.is_empty() {
        out.push((
            Area::Objects,
            Level::Pass,
            "exchanges and queues".into(),
            format!(
                "all {} exist (`provision --check` compares their arguments)",
                exchanges.len() + queues.len()
            ),
        ));
    }
    out
}

fn planned_type(q: &QueueSpec) -> &str {
    match q.arguments.get("x-queue-type") {
        Some(ArgValue::Str(t)) => t.as_str(),
        _ => "classic",
    }
}

fn policy_checks(queues: &[&QueueSpec], s: &Snapshot) -> Vec<Item> {
    let mut out = Vec::new();
    let mut unknown = 0;
    let mut clean = 0;
    for q in queues {
        let Some(facts) = s.queues.get(&q.name).filter(|f| f.exists) else {
            continue;
        };
        let Some(applied) = &facts.policies else {
            unknown += 1;
            continue;
        };
        let kind = facts.kind.as_deref().unwrap_or(planned_type(q));
        let findings = policy_findings(q, kind, applied);
        if findings.is_empty() {
            clean += 1;
        }
        for f in findings {
            let subject = format!("queue {}", q.name);
            // The finding's text without the queue, which is the subject.
            let text = f.to_string();
            let text = (text.strip_prefix("info: "))
                .or_else(|| text.strip_prefix("warning: "))
                .unwrap_or(&text);
            let text = text
                .strip_prefix(&format!("{subject}: "))
                .unwrap_or(text)
                .to_string();
            match &f {
                Finding::PolicyOverrides { key, effective, .. } => {
                    let mut message = text;
                    if key == "overflow" && effective == "\"drop-head\"" && kind == "quorum" {
                        message.push_str(
                            "; the broker falls back to at-most-once dead-lettering: a full or \
                             missing DLQ loses messages",
                        );
                    }
                    message.push_str(
                        "; remove the key from the policy or narrow its pattern so it does not \
                         match this queue",
                    );
                    out.push((Area::Policies, Level::Fail, subject, message));
                }
                Finding::PolicyWarning { .. } => {
                    out.push((Area::Policies, Level::Warn, subject, text))
                }
                _ => out.push((Area::Policies, Level::Pass, subject, text)),
            }
        }
    }
    if clean > 0 {
        out.push((
            Area::Policies,
            Level::Pass,
            "queues".into(),
            format!(
                "no policy or operator policy applies to {clean} queue{}",
                plural(clean)
            ),
        ));
    }
    if unknown > 0 {
        out.push((
            Area::Policies,
            Level::Skip,
            "queues".into(),
            format!(
                "the policies of {unknown} queue{} are unknown: {}",
                plural(unknown),
                management_why(s, "the management API has not reported them yet")
            ),
        ));
    }
    out
}

/// A DLQ whose dead-letter exchange (from a policy, or an argument)
/// routes back into its own pipeline ([`dead_letter_cycle`]): a fail
/// naming what set it and the path.
fn cycle_checks(plan: &Plan, queues: &[&QueueSpec], s: &Snapshot) -> Vec<Item> {
    queues
        .iter()
        .filter(|q| q.role == Role::DeadLetterQueue)
        .filter_map(|q| {
            let facts = s.queues.get(&q.name).filter(|f| f.exists)?;
            let c = dead_letter_cycle(plan, q, facts.policies.as_ref())?;
            Some((
                Area::Policies,
                Level::Fail,
                format!("dead-letter cycle of {}", q.name),
                c.message(),
            ))
        })
        .collect()
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn management_why(s: &Snapshot, otherwise: &str) -> String {
    match &s.management {
        ManagementState::Answers => otherwise.to_string(),
        ManagementState::Unreachable(why) => format!("the management API does not answer ({why})"),
        ManagementState::OtherBroker(_) => {
            "the management API belongs to another broker".to_string()
        }
    }
}

/// An integer argument of a planned queue.
fn int_arg(q: &QueueSpec, key: &str) -> Option<i64> {
    match q.arguments.get(key) {
        Some(ArgValue::Int(i)) => Some(*i),
        _ => None,
    }
}

/// An integer key of the policies that apply, when known and not
/// negative.
fn int_policy(f: Option<&QueueFacts>, key: &str) -> Option<i64> {
    f?.policies
        .as_ref()?
        .effective
        .get(key)?
        .as_i64()
        .filter(|v| *v >= 0)
}

/// The lower of an argument and a policy value (either may be absent).
fn lowest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn limit_checks(queues: &[&QueueSpec], s: &Snapshot, p: &str) -> Vec<Item> {
    let mut out = Vec::new();
    if let Some(dlq) = queues.iter().find(|q| q.role == Role::DeadLetterQueue) {
        let facts = s.queues.get(&dlq.name);
        let ttl = lowest(
            int_arg(dlq, "x-message-ttl"),
            int_policy(facts, "message-ttl"),
        );
        let subject = format!("retention of {}", dlq.name);
        out.push(match ttl {
            None => (
                Area::Limits,
                Level::Pass,
                subject,
                "no TTL: messages stay until a person removes them".into(),
            ),
            Some(ms) if (ms as u64) < MIN_DLQ_RETENTION_MS => (
                Area::Limits,
                Level::Warn,
                subject,
                format!(
                    "{} (under 7 days): an incident found after a weekend may have lost its \
                     evidence; raise `dead_letter.ttl`",
                    tier_name(ms as u64)
                ),
            ),
            Some(ms) => (
                Area::Limits,
                Level::Pass,
                subject,
                format!("{} (7 days or more)", tier_name(ms as u64)),
            ),
        });
    }
    out.extend(timeout_check(queues, s, p));
    if let Some((major, _)) = s.version.as_deref().and_then(major_minor) {
        let size = max_message_size(major);
        out.push((
            Area::Limits,
            Level::Pass,
            "message size".into(),
            format!(
                "max_message_size is {} MiB by default on this version (a changed value cannot \
                 be read through the API); a retry or dead-letter copy adds up to 8 KiB of \
                 headers, so messages over {} bytes are dead-lettered as `too_large` instead \
                 of retried",
                size >> 20,
                size - COPY_HEADROOM_BYTES
            ),
        ));
    }
    out
}

fn health_checks(queues: &[&QueueSpec], s: &Snapshot, p: &str) -> Vec<Item> {
    let mut out = Vec::new();
    let known = s.management == ManagementState::Answers;
    let dlq = queues.iter().find(|q| q.role == Role::DeadLetterQueue);
    out.extend(member_checks(queues, s));
    // The DLX's binding to the DLQ.
    let bound = s.dlx_bound.get(p).copied().flatten();
    if let (Some(false), Some(d)) = (bound, dlq) {
        out.push((
            Area::Health,
            Level::Fail,
            format!("binding {p}.dlx -> {}", d.name),
            "missing: dead letters route nowhere (the worker's copies come back unroutable and \
             it keeps retrying them; the broker's own dead-lettering holds them in a quorum \
             source as messages_dlx and drops them from a classic one); run `dlqctl provision`"
                .into(),
        ));
    }
    out.extend(held_checks(queues, s, dlq, bound, known));
    // Consumers on the main queue.
    if let Some(main) = queues.iter().find(|q| q.role == Role::MainQueue) {
        if let Some(n) = s.queues.get(&main.name).and_then(|f| f.consumers) {
            out.push(if n == 0 {
                (
                    Area::Health,
                    Level::Warn,
                    format!("queue {}", main.name),
                    "no consumer: messages wait until a worker runs; start `dlqctl work`".into(),
                )
            } else {
                (
                    Area::Health,
                    Level::Pass,
                    format!("queue {}", main.name),
                    format!("{n} consumer{}", plural(n as usize)),
                )
            });
        }
    }
    // The DLQ's depth.
    if let (Some(max), Some(d)) = (s.max_dlq, dlq) {
        if let Some(f) = s.queues.get(&d.name).filter(|f| f.exists) {
            let depth = f.ready.unwrap_or(0).max(f.messages.unwrap_or(0));
            out.push(if depth > max {
                (
                    Area::Health,
                    Level::Fail,
                    format!("queue {}", d.name),
                    format!(
                        "holds {}, over --max-dlq {max}: triage with `dlqctl dlq summary`",
                        count(depth, "message")
                    ),
                )
            } else {
                (
                    Area::Health,
                    Level::Pass,
                    format!("queue {}", d.name),
                    format!("holds {} (--max-dlq {max})", count(depth, "message")),
                )
            });
        }
    }
    out
}

/// The automatic redrive, from the pipeline's shared state: a warn when its
/// last run did not move what it could (a failed canary, an unhealthy
/// probe, an error: the dependency may still be down), naming how many
/// runs in a row, or when messages wait for a person; a pass otherwise.
fn redrive_check(s: &Snapshot, p: &str) -> Option<Item> {
    let subject = "redrive".to_string();
    let state = match s.redrive.get(p)? {
        Err(why) => {
            return Some((
                Area::Health,
                Level::Skip,
                subject,
                format!("the shared state is unreadable: {why}"),
            ))
        }
        Ok(None) => return Some((Area::Health, Level::Pass, subject, "no run yet".into())),
        Ok(Some(state)) => state,
    };
    let (look, text) = state.summary(s.now_ms)?;
    let level = if look { Level::Warn } else { Level::Pass };
    Some((Area::Health, level, subject, text))
}

/// The worker's circuit breaker, when its metrics page was read: a warn
/// while it is open or half-open (messages wait), else a pass.
fn circuit_check(s: &Snapshot, p: &str) -> Option<Item> {
    let c = s.circuit.get(p)?;
    let subject = "circuit breaker".to_string();
    Some(match c.pause_sentence(p) {
        Some(sentence) => (Area::Health, Level::Warn, subject, sentence),
        None => (Area::Health, Level::Pass, subject, c.describe()),
    })
}

/// The handler timeout against the consumer timeout of the main queue
/// (the rule `dlqctl work` applies at start:
/// [`crate::check::consumer_timeout`]).
fn timeout_check(queues: &[&QueueSpec], s: &Snapshot, p: &str) -> Vec<Item> {
    use crate::check::consumer_timeout::{self as ct, Handlers, Verdict};
    let Some(main) = queues.iter().find(|q| q.role == Role::MainQueue) else {
        return Vec::new();
    };
    let facts = s.queues.get(&main.name);
    let timeout = ct::consumer_timeout(&ct::Facts {
        version: s.version.as_deref(),
        queue_type: facts.and_then(|f| f.kind.as_deref()),
        argument: int_arg(main, ct::ARGUMENT),
        policies: facts.and_then(|f| f.policies.as_ref()),
    });
    let limit = match &timeout {
        Some(c) => format!("it must stay under {}, {}", tier_name(c.ms), c.source),
        None => {
            "the queue has no consumer timeout (a classic queue on RabbitMQ 4.3 and later)".into()
        }
    };
    let subject = "handler timeout".to_string();
    let Some(h) = s.handler_timeout.get(p) else {
        let why = (s.handler_timeout_error.as_deref())
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        return vec![(
            Area::Limits,
            Level::Skip,
            subject,
            format!("unknown{why}: give --handler-timeout, or --metrics-url of a worker; {limit}"),
        )];
    };
    let one = Handlers {
        timeout_ms: h.ms,
        prefetch: 1,
        concurrency: 1,
    };
    let item = match (ct::judge(one, timeout.as_ref()), &timeout) {
        (Verdict::TooLong(_), Some(c)) => (
            Level::Fail,
            format!(
                "{} ({}) is not under {}, {}: {}, and the message runs twice; lower \
                 --handler-timeout or {}",
                tier_name(h.ms),
                h.source,
                tier_name(c.ms),
                c.source,
                c.model.consequence(),
                c.source.fix()
            ),
        ),
        (_, Some(c)) => (
            Level::Pass,
            format!(
                "{} ({}) is under {}, {}; keep --prefetch × handler time under it too",
                tier_name(h.ms),
                h.source,
                tier_name(c.ms),
                c.source
            ),
        ),
        (_, None) => (
            Level::Pass,
            format!("{} ({}): {limit}", tier_name(h.ms), h.source),
        ),
    };
    vec![(Area::Limits, item.0, subject, item.1)]
}

/// Quorum members online, per queue.
fn member_checks(queues: &[&QueueSpec], s: &Snapshot) -> Vec<Item> {
    let mut out = Vec::new();
    let mut complete = 0;
    for q in queues {
        let Some((online, total)) = s.queues.get(&q.name).and_then(|f| f.members) else {
            continue;
        };
        if online >= total {
            complete += 1;
            continue;
        }
        let majority = online * 2 > total;
        out.push((
            Area::Health,
            if majority { Level::Warn } else { Level::Fail },
            format!("queue {}", q.name),
            format!(
                "{online} of {total} quorum members online{}; bring the missing nodes back",
                if majority {
                    ""
                } else {
                    ": no majority, the queue is unavailable"
                }
            ),
        ));
    }
    if complete > 0 {
        out.push((
            Area::Health,
            Level::Pass,
            "quorum members".into(),
            format!("all online on {complete} quorum queue{}", plural(complete)),
        ));
    }
    out
}

/// Messages held for the DLX over two samples, and why.
fn held_checks(
    queues: &[&QueueSpec],
    s: &Snapshot,
    dlq: Option<&&QueueSpec>,
    bound: Option<bool>,
    known: bool,
) -> Vec<Item> {
    let mut out = Vec::new();
    let dlq_full = dlq.and_then(|d| {
        let max = int_arg(d, "x-max-length");
        let max = lowest(max, int_policy(s.queues.get(&d.name), "max-length"))?;
        let held = s.queues.get(&d.name)?;
        let depth = held.messages.or(held.ready)?;
        (depth as i64 >= max).then_some(max)
    });
    let mut held_any = false;
    for q in queues {
        let Some(f) = s.queues.get(&q.name) else {
            continue;
        };
        if f.messages_dlx.len() < 2 || f.messages_dlx.contains(&0) {
            continue;
        }
        held_any = true;
        let last = f.messages_dlx.last().copied().unwrap_or(0);
        let why = match (dlq_full, bound) {
            (Some(max), _) => format!(
                "the DLQ is full ({}, reject-publish): make room with `dlqctl dlq export \
                 --remove` or `purge`; they move within 3 minutes after",
                count(max.max(0) as u64, "message")
            ),
            (None, Some(false)) => "the DLX routes to no queue (see the binding above)".into(),
            (None, _) => "the DLQ has room and is bound: the broker's dead-letter worker looks \
                          stalled (rabbitmq-server#12625, #16652); if it stays, restart the \
                          queue's leader"
                .into(),
        };
        out.push((
            Area::Health,
            Level::Fail,
            format!("queue {}", q.name),
            format!(
                "holds {last} message{} for its DLX (messages_dlx) over two samples {}s apart: {why}",
                plural(last as usize),
                s.sample_gap_s
            ),
        ));
    }
    if !held_any && known {
        out.push((
            Area::Health,
            Level::Pass,
            "messages_dlx".into(),
            "no queue holds messages for its DLX".into(),
        ));
    }
    out
}

fn permission_checks(plan: &Plan, s: &Snapshot, p: &str) -> Vec<Item> {
    let perms = match &s.permissions {
        Ok(perms) => perms,
        Err(why) => {
            return vec![(
                Area::Permissions,
                Level::Skip,
                format!("user {}", s.user),
                format!("unknown: {why}"),
            )]
        }
    };
    verdicts(perms, plan, p)
        .into_iter()
        .map(|(command, verdict)| {
            let subject = format!("dlqctl {command}");
            match verdict {
                Verdict::Allowed => (
                    Area::Permissions,
                    Level::Pass,
                    subject,
                    format!("user {} may run it", s.user),
                ),
                Verdict::Denied { missing } => {
                    let shown: Vec<String> = missing
                        .iter()
                        .take(3)
                        .map(|n| format!("{} on `{}`", n.access.as_str(), n.resource))
                        .collect();
                    let more = match missing.len() {
                        n if n > 3 => format!(" and {} more", n - 3),
                        _ => String::new(),
                    };
                    (
                        Area::Permissions,
                        Level::Warn,
                        subject,
                        format!(
                            "user {} may not run it: lacks {}{more} (see the permissions table \
                             in docs/production.md)",
                            s.user,
                            shown.join(", ")
                        ),
                    )
                }
                Verdict::Unknown { reason } => (
                    Area::Permissions,
                    Level::Skip,
                    subject,
                    format!("unknown for user {}: {reason}", s.user),
                ),
            }
        })
        .collect()
}

/// The pipeline's idempotency store, its `keep` against the DLQ's
/// retention (the `x-message-ttl` its `dead_letter.ttl` sets), and the
/// hosts its consumers come from.
fn idempotency_checks(queues: &[&QueueSpec], s: &Snapshot, p: &str) -> Vec<Item> {
    let Some(f) = s.idempotency.get(p) else {
        return Vec::new();
    };
    let mut out = vec![store_check(f)];
    if let Some(dlq) = queues.iter().find(|q| q.role == Role::DeadLetterQueue) {
        let ttl = int_arg(dlq, "x-message-ttl").map(|ms| ms.max(0) as u64);
        out.extend(keep_check(&f.block, &dlq.name, ttl));
    }
    if let Some(main) = queues.iter().find(|q| q.role == Role::MainQueue) {
        if let Some(hosts) = s.consumer_hosts.get(&main.name) {
            out.extend(hosts_check(f, &main.name, hosts));
        }
    }
    out.into_iter()
        .map(|(level, subject, message)| {
            let level = match level {
                idempotency::Level::Pass => Level::Pass,
                idempotency::Level::Warn => Level::Warn,
                idempotency::Level::Fail => Level::Fail,
            };
            (Area::Idempotency, level, subject, message)
        })
        .collect()
}

/// The handler timeout a worker publishes on its `/metrics` page for
/// `pipeline` (the sample of [`HANDLER_TIMEOUT_METRIC`] labelled
/// `queue="PIPELINE"`), in milliseconds.
pub fn handler_timeout_from_metrics(text: &str, pipeline: &str) -> Option<u64> {
    let label = format!(
        "queue=\"{}\"",
        pipeline.replace('\\', "\\\\").replace('"', "\\\"")
    );
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(HANDLER_TIMEOUT_METRIC)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once('}')?,
            None => ("", rest),
        };
        if !labels.split(',').any(|l| l.trim() == label) {
            return None;
        }
        let secs: f64 = value.split_whitespace().next()?.parse().ok()?;
        (secs.is_finite() && secs >= 0.0).then(|| (secs * 1000.0).round() as u64)
    })
}

#[cfg(test)]
#[path = "doctor_tests.rs"]
mod tests;
