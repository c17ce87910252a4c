//! Declaring a plan on the broker, and checking it without creating
//! anything. Every difference of every object is listed, although the
//! broker names only one per refusal (rabbitmq-facts.md, "Declaring").

use crate::broker::{amqp_reply, describe_lapin_error, field_table};
use crate::core::drift::{describe, parse_inequivalent, substitute};
use crate::core::topology::plan::{BindingSpec, ExchangeSpec, Plan, QueueSpec};
use crate::core::topology::{ArgValue, Arguments, ExchangeType};
use crate::error::{Error, Result};
use crate::mgmt::Management;
use futures_util::stream::{self, StreamExt};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ExchangeKind};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many declarations run at once, each on its own channel.
pub const DEFAULT_PARALLELISM: usize = 16;

/// What kind of object a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectKind {
    /// An exchange.
    Exchange,
    /// A queue.
    Queue,
    /// A binding.
    Binding,
}

impl ObjectKind {
    /// `exchange`, `queue` or `binding`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Exchange => "exchange",
            ObjectKind::Queue => "queue",
            ObjectKind::Binding => "binding",
        }
    }
}

/// One thing that is not as the topology wants it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum Finding {
    /// The object does not exist (`--check` only).
    Missing {
        /// Object kind.
        object: ObjectKind,
        /// Object name (a binding: `exchange -> queue [key]`).
        name: String,
    },
    /// An argument or property differs.
    Differs {
        /// Object kind.
        object: ObjectKind,
        /// Object name.
        name: String,
        /// The argument (`x-message-ttl`) or property (`type`, `durable`).
        argument: String,
        /// What the topology wants (`none`: the argument should be absent).
        wanted: String,
        /// What the broker has (`none`: it is absent there).
        actual: String,
    },
    /// A binding that could not be checked (no management API).
    Unverified {
        /// Object kind.
        object: ObjectKind,
        /// Binding description.
        name: String,
        /// Why.
        reason: String,
    },
    /// The broker refused the operation for another reason (permissions...).
    Failed {
        /// Object kind.
        object: ObjectKind,
        /// Object name.
        name: String,
        /// The broker's words.
        message: String,
    },
}

impl Finding {
    /// True for findings that mean "the broker is not as wanted" (not
    /// merely unverified).
    pub fn is_difference(&self) -> bool {
        !matches!(self, Finding::Unverified { .. })
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Missing { object, name } => write!(f, "missing {} {name}", object.as_str()),
            Finding::Differs {
                object,
                name,
                argument,
                wanted,
                actual,
            } => write!(
                f,
                "{} {name}: {argument} differs: wanted {wanted}, broker has {actual}",
                object.as_str()
            ),
            Finding::Unverified {
                object,
                name,
                reason,
            } => write!(f, "unverified {} {name}: {reason}", object.as_str()),
            Finding::Failed {
                object,
                name,
                message,
            } => write!(f, "{} {name}: {message}", object.as_str()),
        }
    }
}

/// The result of a provision or a check.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// Objects declared (provision) or found as wanted (check).
    pub ok: usize,
    /// Everything that is not as wanted.
    pub findings: Vec<Finding>,
    /// Wall time.
    #[serde(skip)]
    pub elapsed: Duration,
}

impl Report {
    /// Adds a phase's count of objects as wanted and its findings.
    fn absorb(&mut self, (ok, findings): (usize, Vec<Finding>)) {
        self.ok += ok;
        self.findings.extend(findings);
    }

    /// True when some finding is a real difference.
    pub fn has_differences(&self) -> bool {
        self.findings.iter().any(Finding::is_difference)
    }
}

/// The name a binding is reported under.
pub fn binding_name(b: &BindingSpec) -> String {
    format!("{} -> {} [{}]", b.exchange, b.queue, b.routing_key)
}

/// Channels reused between declarations; a channel the broker closed is
/// simply not returned.
struct Pool<'c> {
    conn: &'c Connection,
    free: Mutex<Vec<Channel>>,
}

impl Pool<'_> {
    async fn take(&self) -> Result<Channel> {
        let reused = self.free.lock().ok().and_then(|mut v| v.pop());
        match reused {
            Some(c) if c.status().connected() => Ok(c),
            _ => self
                .conn
                .create_channel()
                .await
                .map_err(|e| Error::broker("cannot open a channel", &e)),
        }
    }

    fn give(&self, c: Channel) {
        if c.status().connected() {
            if let Ok(mut v) = self.free.lock() {
                v.push(c);
            }
        }
    }
}

/// What a declaration says about an exchange or queue; the drift search
/// substitutes the broker's values into it.
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    kind: Option<String>,
    arguments: Arguments,
    durable: bool,
    auto_delete: bool,
    internal: bool,
    exclusive: bool,
}

impl Shape {
    fn exchange(e: &ExchangeSpec) -> Self {
        Shape {
            kind: Some(e.kind.as_str().to_string()),
            arguments: Arguments::new(),
            durable: true,
            auto_delete: false,
            internal: false,
            exclusive: false,
        }
    }

    fn queue(q: &QueueSpec) -> Self {
        Shape {
            kind: None,
            arguments: q.arguments.clone(),
            durable: true,
            auto_delete: false,
            internal: false,
            exclusive: false,
        }
    }

    fn flag(&mut self, name: &str) -> Option<&mut bool> {
        match name {
            "durable" => Some(&mut self.durable),
            "auto_delete" => Some(&mut self.auto_delete),
            "internal" => Some(&mut self.internal),
            "exclusive" => Some(&mut self.exclusive),
            _ => None,
        }
    }
}

fn exchange_kind(s: &str) -> ExchangeKind {
    match ExchangeType::parse(s) {
        Some(ExchangeType::Direct) => ExchangeKind::Direct,
        Some(ExchangeType::Topic) => ExchangeKind::Topic,
        Some(ExchangeType::Fanout) => ExchangeKind::Fanout,
        Some(ExchangeType::Headers) => ExchangeKind::Headers,
        None => ExchangeKind::Custom(s.to_string()),
    }
}

#[derive(Clone, Copy)]
enum Target<'a> {
    Exchange(&'a ExchangeSpec),
    Queue(&'a QueueSpec),
}

impl Target<'_> {
    fn object(&self) -> ObjectKind {
        match self {
            Target::Exchange(_) => ObjectKind::Exchange,
            Target::Queue(_) => ObjectKind::Queue,
        }
    }
    fn name(&self) -> &str {
        match self {
            Target::Exchange(e) => &e.name,
            Target::Queue(q) => &q.name,
        }
    }
    fn shape(&self) -> Shape {
        match self {
            Target::Exchange(e) => Shape::exchange(e),
            Target::Queue(q) => Shape::queue(q),
        }
    }
}

async fn declare(ch: &Channel, t: Target<'_>, s: &Shape, passive: bool) -> lapin::Result<()> {
    match t {
        Target::Exchange(e) => {
            ch.exchange_declare(
                e.name.as_str().into(),
                exchange_kind(s.kind.as_deref().unwrap_or("direct")),
                ExchangeDeclareOptions {
                    passive,
                    durable: s.durable,
                    auto_delete: s.auto_delete,
                    internal: s.internal,
                    nowait: false,
                },
                field_table(&s.arguments),
            )
            .await
        }
        Target::Queue(q) => ch
            .queue_declare(
                q.name.as_str().into(),
                QueueDeclareOptions {
                    passive,
                    durable: s.durable,
                    exclusive: s.exclusive,
                    auto_delete: s.auto_delete,
                    nowait: false,
                },
                if passive {
                    FieldTable::default()
                } else {
                    field_table(&s.arguments)
                },
            )
            .await
            .map(|_| ()),
    }
}

fn show(v: Option<&ArgValue>) -> String {
    v.map(ToString::to_string).unwrap_or_else(|| "none".into())
}

/// Lists every difference of an existing object by redeclaring it, on
/// fresh channels, with each argument the broker names set to the broker's
/// value, until the declaration matches.
async fn differences(pool: &Pool<'_>, t: Target<'_>) -> Result<Vec<Finding>> {
    let wanted = t.shape();
    let mut probe = wanted.clone();
    let mut out: Vec<Finding> = Vec::new();
    let (object, name) = (t.object(), t.name().to_string());
    // Each round fixes one argument; a shape has few, so this bounds the loop.
    for _ in 0..64 {
        let ch = pool.take().await?;
        let res = declare(&ch, t, &probe, false).await;
        match res {
            Ok(()) => {
                pool.give(ch);
                return Ok(out);
            }
            Err(e) => {
                let reply = amqp_reply(&e);
                let ineq = reply
                    .as_ref()
                    .filter(|(code, _)| *code == 406)
                    .and_then(|(_, text)| parse_inequivalent(text));
                let Some(ineq) = ineq else {
                    out.push(Finding::Failed {
                        object,
                        name,
                        message: describe_lapin_error(&e),
                    });
                    return Ok(out);
                };
                let arg = ineq.argument.clone();
                let actual = describe(&ineq.current);
                let progressed = if arg == "type" && object == ObjectKind::Exchange {
                    let w = wanted.kind.clone().unwrap_or_default();
                    push_diff(&mut out, object, &name, &arg, w, actual.clone());
                    let new = Some(actual.trim_matches('"').to_string());
                    let changed = probe.kind != new;
                    probe.kind = new;
                    changed
                } else if let Some(flag) = probe.flag(&arg) {
                    let w = match arg.as_str() {
                        "durable" => wanted.durable,
                        "auto_delete" => wanted.auto_delete,
                        "internal" => wanted.internal,
                        _ => wanted.exclusive,
                    };
                    push_diff(&mut out, object, &name, &arg, w.to_string(), actual.clone());
                    let new = actual == "true";
                    let changed = *flag != new;
                    *flag = new;
                    changed
                } else {
                    let sub = substitute(probe.arguments.get(&arg), &ineq.current);
                    // Shown with its type where known: the string "1000"
                    // and the integer 1000 print alike in the broker's text.
                    let shown = match &sub {
                        Some(v) => show(v.as_ref()),
                        None => actual.clone(),
                    };
                    push_diff(
                        &mut out,
                        object,
                        &name,
                        &arg,
                        show(wanted.arguments.get(&arg)),
                        shown,
                    );
                    match sub {
                        Some(Some(v)) => {
                            let changed = probe.arguments.get(&arg) != Some(&v);
                            probe.arguments.insert(arg.clone(), v);
                            changed
                        }
                        Some(None) => probe.arguments.remove(&arg).is_some(),
                        None => false,
                    }
                };
                if !progressed {
                    out.push(Finding::Failed {
                        object,
                        name: name.clone(),
                        message: format!("cannot list further differences after `{arg}` (broker has {actual} of a type dlqctl does not send)"),
                    });
                    return Ok(out);
                }
            }
        }
    }
    out.push(Finding::Failed {
        object,
        name,
        message: "too many differences to list".into(),
    });
    Ok(out)
}

fn push_diff(
    out: &mut Vec<Finding>,
    object: ObjectKind,
    name: &str,
    arg: &str,
    wanted: String,
    actual: String,
) {
    // A string/integer switch names the same argument twice: keep the first.
    let seen = out
        .iter()
        .any(|f| matches!(f, Finding::Differs { argument, .. } if argument == arg));
    if !seen {
        out.push(Finding::Differs {
            object,
            name: name.to_string(),
            argument: arg.to_string(),
            wanted,
            actual,
        });
    }
}

/// Declares one exchange or queue; on a 406, lists its differences.
async fn apply(pool: &Pool<'_>, t: Target<'_>) -> Result<Vec<Finding>> {
    let ch = pool.take().await?;
    match declare(&ch, t, &t.shape(), false).await {
        Ok(()) => {
            pool.give(ch);
            Ok(vec![])
        }
        Err(e) => match amqp_reply(&e) {
            Some((406, _)) => differences(pool, t).await,
            _ => refused(pool, t, &e),
        },
    }
}

/// Checks one exchange or queue without creating it.
async fn inspect(pool: &Pool<'_>, t: Target<'_>) -> Result<Vec<Finding>> {
    let ch = pool.take().await?;
    match declare(&ch, t, &t.shape(), true).await {
        Ok(()) => {
            pool.give(ch);
            // It exists: an active declare with the wanted shape is a no-op
            // when it matches and names one difference when it does not.
            differences(pool, t).await
        }
        Err(e) => match amqp_reply(&e) {
            Some((404, _)) => Ok(vec![Finding::Missing {
                object: t.object(),
                name: t.name().to_string(),
            }]),
            _ => refused(pool, t, &e),
        },
    }
}

/// A refusal other than the expected 406/404: a finding, unless the whole
/// connection is gone.
fn refused(pool: &Pool<'_>, t: Target<'_>, e: &lapin::Error) -> Result<Vec<Finding>> {
    check_connection(pool, e)?;
    Ok(vec![Finding::Failed {
        object: t.object(),
        name: t.name().to_string(),
        message: describe_lapin_error(e),
    }])
}

fn check_connection(pool: &Pool<'_>, e: &lapin::Error) -> Result<()> {
    if pool.conn.status().connected() {
        Ok(())
    } else {
        Err(Error::broker("the connection to the broker was lost", e))
    }
}

async fn bind(pool: &Pool<'_>, b: &BindingSpec) -> Result<Vec<Finding>> {
    let ch = pool.take().await?;
    let res = ch
        .queue_bind(
            b.queue.as_str().into(),
            b.exchange.as_str().into(),
            b.routing_key.as_str().into(),
            QueueBindOptions::default(),
            field_table(&b.arguments),
        )
        .await;
    match res {
        Ok(()) => {
            pool.give(ch);
            Ok(vec![])
        }
        Err(e) => {
            check_connection(pool, &e)?;
            Ok(vec![Finding::Failed {
                object: ObjectKind::Binding,
                name: binding_name(b),
                message: describe_lapin_error(&e),
            }])
        }
    }
}

async fn run_all<'a, F, Fut>(items: Vec<F>, parallelism: usize) -> Result<(usize, Vec<Finding>)>
where
    F: FnOnce() -> Fut + 'a,
    Fut: std::future::Future<Output = Result<Vec<Finding>>> + 'a,
{
    // Unordered, so one slow declaration does not hold back the others;
    // findings are put back in plan order afterwards.
    let mut results: Vec<(usize, Result<Vec<Finding>>)> = stream::iter(
        items
            .into_iter()
            .enumerate()
            .map(|(i, f)| async move { (i, f().await) }),
    )
    .buffer_unordered(parallelism.max(1))
    .collect()
    .await;
    results.sort_by_key(|(i, _)| *i);
    let results = results.into_iter().map(|(_, r)| r);
    let mut ok = 0;
    let mut findings = Vec::new();
    for r in results {
        let f = r?;
        if f.is_empty() {
            ok += 1;
        }
        findings.extend(f);
    }
    Ok((ok, findings))
}

/// Declares every object of the plan: exchanges, then queues, then
/// bindings, `parallelism` at a time. Never deletes or purges. An object
/// that exists with other arguments is left as it is and reported with
/// every difference.
pub async fn provision(conn: &Connection, plan: &Plan, parallelism: usize) -> Result<Report> {
    let start = Instant::now();
    let pool = Pool {
        conn,
        free: Mutex::new(Vec::new()),
    };
    let mut report = Report::default();
    let p = &pool;
    let ex: Vec<_> = plan
        .exchanges
        .iter()
        .map(|e| move || apply(p, Target::Exchange(e)))
        .collect();
    report.absorb(run_all(ex, parallelism).await?);
    let qs: Vec<_> = plan
        .queues
        .iter()
        .map(|q| move || apply(p, Target::Queue(q)))
        .collect();
    report.absorb(run_all(qs, parallelism).await?);
    let bs: Vec<_> = plan.bindings.iter().map(|b| move || bind(p, b)).collect();
    report.absorb(run_all(bs, parallelism).await?);
    close_pool(&pool).await;
    report.elapsed = start.elapsed();
    Ok(report)
}

async fn close_pool(pool: &Pool<'_>) {
    let chans: Vec<Channel> = pool
        .free
        .lock()
        .map(|mut v| v.drain(..).collect())
        .unwrap_or_default();
    for c in chans {
        let _ = c.close(200, "done".into()).await;
    }
}

/// Checks the plan against the broker without creating anything: missing
/// objects, differing arguments and types, and (through the management API
/// when it answers) missing bindings.
pub async fn check(
    conn: &Connection,
    plan: &Plan,
    mgmt: Option<&Management>,
    vhost: &str,
    parallelism: usize,
) -> Result<Report> {
    let start = Instant::now();
    let pool = Pool {
        conn,
        free: Mutex::new(Vec::new()),
    };
    let p = &pool;
    let mut report = Report::default();
    let mut items: Vec<Target<'_>> = plan.exchanges.iter().map(Target::Exchange).collect();
    items.extend(plan.queues.iter().map(Target::Queue));
    let tasks: Vec<_> = items.into_iter().map(|t| move || inspect(p, t)).collect();
    report.absorb(run_all(tasks, parallelism).await?);
    close_pool(&pool).await;

    let api = match mgmt {
        Some(m) if m.available().await => Some(m),
        _ => None,
    };
    for b in &plan.bindings {
        let name = binding_name(b);
        let Some(m) = api else {
            report.findings.push(Finding::Unverified {
                object: ObjectKind::Binding,
                name,
                reason: "the management API does not answer (AMQP cannot check a binding without creating it)".into(),
            });
            continue;
        };
        match m.bindings(vhost, &b.exchange, &b.queue).await {
            Ok(list) => {
                let wanted = crate::broker::field_table(&b.arguments);
                let found = list.iter().any(|x| {
                    x.routing_key == b.routing_key
                        && args_match(&x.arguments, &b.arguments, &wanted)
                });
                if found {
                    report.ok += 1;
                } else {
                    report.findings.push(Finding::Missing {
                        object: ObjectKind::Binding,
                        name,
                    });
                }
            }
            Err(e) => report.findings.push(Finding::Unverified {
                object: ObjectKind::Binding,
                name,
                reason: e.to_string(),
            }),
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

fn args_match(
    api: &serde_json::Map<String, serde_json::Value>,
    wanted: &Arguments,
    _t: &FieldTable,
) -> bool {
    if api.len() != wanted.len() {
        return false;
    }
    wanted.iter().all(|(k, v)| {
        let Some(a) = api.get(k) else { return false };
        match v {
            ArgValue::Int(i) => a.as_i64() == Some(*i),
            ArgValue::Str(s) => a.as_str() == Some(s.as_str()),
            ArgValue::Bool(b) => a.as_bool() == Some(*b),
        }
    })
}
