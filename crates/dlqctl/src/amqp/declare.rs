//! Declaring exchanges, queues and bindings on pooled channels, and
//! listing every difference of an existing object.

use crate::amqp::connection::{amqp_reply, field_table};
use crate::core::audit::drift::{next_probe, ProbeStep, Shape};
use crate::core::audit::finding::{binding_name, Finding, ObjectKind};
use crate::core::topology::plan::{BindingSpec, ExchangeSpec, Plan, QueueSpec};
use crate::core::topology::ExchangeType;
use crate::error::describe_lapin_error;
use crate::error::{Error, Result};
use futures_util::stream::{self, StreamExt};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ExchangeKind};
use std::sync::Mutex;
use std::time::Duration;

/// How long one declaration, binding or channel opening may wait for the
/// broker's answer: a broker that stops answering must not hold a one-shot
/// command forever.
pub(crate) const OP_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits for `fut` at most [`OP_TIMEOUT`]; past it, an error naming `what`.
async fn answered<T>(what: &str, fut: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(OP_TIMEOUT, fut)
        .await
        .map_err(|_| Error::Broker {
            context: format!("declaring {what}"),
            message: format!(
                "the broker did not answer within {}s (is it overloaded, or the network silent?)",
                OP_TIMEOUT.as_secs()
            ),
        })
}

/// Channels reused between declarations; a channel the broker closed is
/// simply not returned.
struct Pool<'c> {
    conn: &'c Connection,
    free: Mutex<Vec<Channel>>,
}

impl<'c> Pool<'c> {
    fn new(conn: &'c Connection) -> Self {
        Pool {
            conn,
            free: Mutex::new(Vec::new()),
        }
    }

    async fn take(&self) -> Result<Channel> {
        let reused = self.free.lock().ok().and_then(|mut v| v.pop());
        match reused {
            Some(c) if c.status().connected() => Ok(c),
            _ => answered("a channel", self.conn.create_channel())
                .await?
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
        let Err(e) = answered(t.name(), declare(&ch, t, &probe, false)).await? else {
            pool.give(ch);
            return Ok(out);
        };
        let step = match amqp_reply(&e) {
            Some((406, text)) => next_probe(&wanted, &mut probe, object, &name, &text, &mut out),
            _ => ProbeStep::Unreadable,
        };
        match step {
            ProbeStep::Next => continue,
            ProbeStep::Stuck => return Ok(out),
            ProbeStep::Unreadable => {
                out.push(Finding::Failed {
                    object,
                    name,
                    message: describe_lapin_error(&e),
                    reply_code: amqp_reply(&e).map(|(code, _)| code),
                });
                return Ok(out);
            }
        }
    }
    out.push(Finding::Failed {
        object,
        name,
        message: "too many differences to list".into(),
        reply_code: None,
    });
    Ok(out)
}

/// Declares one exchange or queue; on a 406, lists its differences.
async fn apply(pool: &Pool<'_>, t: Target<'_>) -> Result<Vec<Finding>> {
    let ch = pool.take().await?;
    match answered(t.name(), declare(&ch, t, &t.shape(), false)).await? {
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
    match answered(t.name(), declare(&ch, t, &t.shape(), true)).await? {
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
    let reply_code = amqp_reply(e).map(|(code, _)| code);
    let mut message = describe_lapin_error(e);
    if reply_code == Some(403) {
        message =
            format!(
            "{message}: declaring a{} {} needs the configure permission on its name; user `{}` \
             lacks it in this virtual host (see docs/production.md, \"Permissions\")",
            if t.object().as_str().starts_with('e') { "n" } else { "" },
            t.object().as_str(),
            pool.conn.status().username()
        );
    }
    Ok(vec![Finding::Failed {
        object: t.object(),
        name: t.name().to_string(),
        message,
        reply_code,
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
    let res = answered(
        &binding_name(b),
        ch.queue_bind(
            b.queue.as_str().into(),
            b.exchange.as_str().into(),
            b.routing_key.as_str().into(),
            QueueBindOptions::default(),
            field_table(&b.arguments),
        ),
    )
    .await?;
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
                reply_code: amqp_reply(&e).map(|(code, _)| code),
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

/// Declares every object of the plan: exchanges, then queues, then
/// bindings, `parallelism` at a time, each phase on pooled channels.
/// Never deletes or purges. An object that exists with other arguments is
/// left as it is and reported with every difference. Returns the number of
/// objects as wanted and the findings, in plan order.
pub(crate) async fn declare_plan(
    conn: &Connection,
    plan: &Plan,
    parallelism: usize,
) -> Result<(usize, Vec<Finding>)> {
    let pool = Pool::new(conn);
    let p = &pool;
    let mut ok = 0;
    let mut findings = Vec::new();
    let mut absorb = |(n, f): (usize, Vec<Finding>)| {
        ok += n;
        findings.extend(f);
    };
    let ex: Vec<_> = plan
        .exchanges
        .iter()
        .map(|e| move || apply(p, Target::Exchange(e)))
        .collect();
    absorb(run_all(ex, parallelism).await?);
    let qs: Vec<_> = plan
        .queues
        .iter()
        .map(|q| move || apply(p, Target::Queue(q)))
        .collect();
    absorb(run_all(qs, parallelism).await?);
    let bs: Vec<_> = plan.bindings.iter().map(|b| move || bind(p, b)).collect();
    absorb(run_all(bs, parallelism).await?);
    close_pool(&pool).await;
    Ok((ok, findings))
}

/// Checks the plan's exchanges and queues without creating them (a passive
/// declare, then the drift search on those that exist). Bindings are not
/// looked at: AMQP has no passive bind.
pub(crate) async fn inspect_plan(
    conn: &Connection,
    plan: &Plan,
    parallelism: usize,
) -> Result<(usize, Vec<Finding>)> {
    let pool = Pool::new(conn);
    let p = &pool;
    let mut items: Vec<Target<'_>> = plan.exchanges.iter().map(Target::Exchange).collect();
    items.extend(plan.queues.iter().map(Target::Queue));
    let tasks: Vec<_> = items.into_iter().map(|t| move || inspect(p, t)).collect();
    let result = run_all(tasks, parallelism).await;
    close_pool(&pool).await;
    result
}

/// What a passive declare tells of a queue: ready messages and consumers,
/// fresh (the management API's counts lag by seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCounts {
    /// Ready messages (not unacked ones, nor a quorum queue's `messages_dlx`).
    pub ready: u32,
    /// Consumers.
    pub consumers: u32,
}

/// A passive declare of a queue on a channel of its own: `Ok(None)` when
/// the queue does not exist (404), an error when the broker refuses
/// otherwise or does not answer.
pub async fn passive_queue(conn: &Connection, queue: &str) -> Result<Option<QueueCounts>> {
    let name = queue.to_string();
    let ok = passive(conn, &format!("queue {queue}"), |ch| async move {
        let options = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        ch.queue_declare(name.as_str().into(), options, FieldTable::default())
            .await
    })
    .await?;
    Ok(ok.map(|ok| QueueCounts {
        ready: ok.message_count(),
        consumers: ok.consumer_count(),
    }))
}

/// A passive declare of an exchange on a channel of its own: whether it
/// exists.
pub(crate) async fn passive_exchange(conn: &Connection, exchange: &str) -> Result<bool> {
    let name = exchange.to_string();
    let ok = passive(conn, &format!("exchange {exchange}"), |ch| async move {
        let options = ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        ch.exchange_declare(
            name.as_str().into(),
            ExchangeKind::Direct,
            options,
            FieldTable::default(),
        )
        .await
    })
    .await?;
    Ok(ok.is_some())
}

/// Runs one passive declare (`what`: "queue NAME") on a channel of its
/// own: `Ok(None)` on a 404 (the channel is gone with it), the answer
/// otherwise, an error when the broker refuses otherwise or does not
/// answer.
async fn passive<T, F, Fut>(conn: &Connection, what: &str, declare: F) -> Result<Option<T>>
where
    F: FnOnce(Channel) -> Fut,
    Fut: std::future::Future<Output = lapin::Result<T>>,
{
    let ch = answered("a channel", conn.create_channel())
        .await?
        .map_err(|e| Error::broker("cannot open a channel", &e))?;
    match answered(what, declare(ch.clone())).await? {
        Ok(ok) => {
            let _ = answered("a channel close", ch.close(200, "done".into())).await;
            Ok(Some(ok))
        }
        Err(e) if amqp_reply(&e).map(|(code, _)| code) == Some(404) => Ok(None),
        Err(e) => Err(Error::broker(format!("cannot look at {what}"), &e)),
    }
}

/// A queue's ready messages, fresh from a passive declare; `None` when the
/// queue is gone or the broker did not answer.
pub async fn ready_messages(conn: &Connection, queue: &str) -> Option<u32> {
    passive_queue(conn, queue)
        .await
        .ok()
        .flatten()
        .map(|c| c.ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_broker_that_never_answers_is_an_error_after_the_timeout() {
        let never = std::future::pending::<()>();
        let e = answered("queue orders", never)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("declaring queue orders"), "{e}");
        assert!(e.contains("did not answer within 30s"), "{e}");
        assert_eq!(answered("x", async { 7 }).await.unwrap(), 7);
    }
}
