//! DLQ fixtures shared by the DLQ command tests and the web page's tests:
//! a provisioned pipeline whose DLQ holds messages as the worker writes
//! them.

use crate::support::worker::{i, s, table, with_id, Pipe};
use crate::support::{Broker, Cleanup, Dlqctl, Run, Scratch};
use lapin::types::{AMQPValue, FieldArray};
use lapin::BasicProperties;
use std::path::{Path, PathBuf};

/// Runs `dlqctl dlq VERB FILE --queue QUEUE EXTRA...`.
pub async fn dlq(verb: &str, file: &Path, queue: &str, extra: &[&str]) -> Run {
    Dlqctl::on_queue(&["dlq", verb], file, queue)
        .args(extra)
        .run()
        .await
}

/// The message ids of deliveries, in order (empty for none).
pub fn ids(ds: &[lapin::message::Delivery]) -> Vec<String> {
    ds.iter()
        .map(|d| {
            d.properties
                .message_id()
                .as_ref()
                .map_or(String::new(), |m| m.as_str().to_string())
        })
        .collect()
}

/// A DLQ message as the worker writes one: attempt 3, an error history.
pub fn dead(id: &str, reason: &str, error: &str, tenant: &str) -> BasicProperties {
    let entry = AMQPValue::FieldTable(table(&[
        ("attempt", i(3)),
        ("time", s("2026-01-01T00:00:00.000Z")),
        ("error", s(error)),
    ]));
    with_id(id).with_headers(table(&[
        ("dlqctl-reason", s(reason)),
        ("dlqctl-attempt", i(3)),
        ("dlqctl-last-error", s(error)),
        (
            "dlqctl-errors",
            AMQPValue::FieldArray(FieldArray::from(vec![entry])),
        ),
        ("dlqctl-dead-lettered-at", s("2026-01-01T00:00:00.000Z")),
        ("tenant", s(tenant)),
    ]))
}

/// Publishes many messages to `queue` on one confirm channel, then waits
/// for them all ([`Broker::publish_all`]).
pub async fn publish_many(b: &Broker, queue: &str, msgs: Vec<(Vec<u8>, BasicProperties)>) {
    b.publish_all("", queue, msgs).await;
}

/// A provisioned pipeline (one 60 s tier, `max_attempts` attempts): the
/// broker, the guard of its names, the scratch directory, the pipeline and
/// its topology file.
pub async fn provisioned(max_attempts: u32) -> (Broker, Cleanup, Scratch, Pipe, PathBuf) {
    let b = Broker::connect().await;
    let c = Cleanup::new();
    let dir = Scratch::new();
    let pipe = Pipe::new(&c, &[60_000], max_attempts);
    let file = pipe.provision(&dir).await;
    (b, c, dir, pipe, file)
}

/// A provisioned pipeline whose DLQ holds the given messages.
pub struct Fixture {
    pub b: Broker,
    pub c: Cleanup,
    pub _dir: Scratch,
    pub pipe: Pipe,
    pub file: std::path::PathBuf,
}

impl Fixture {
    pub async fn new(
        max_attempts: u32,
        tweak: impl FnOnce(&mut Pipe),
        msgs: Vec<(Vec<u8>, BasicProperties)>,
    ) -> Fixture {
        let b = Broker::connect().await;
        let c = Cleanup::new();
        let dir = Scratch::new();
        let mut pipe = Pipe::new(&c, &[60_000], max_attempts);
        tweak(&mut pipe);
        let file = pipe.provision(&dir).await;
        publish_many(&b, &pipe.dlq(), msgs).await;
        Fixture {
            b,
            c,
            _dir: dir,
            pipe,
            file,
        }
    }
}

/// `n` dead messages `m-0`.., with `reason(k)` and `tenant(k)`.
pub fn dead_many(
    n: usize,
    reason: impl Fn(usize) -> &'static str,
    tenant: impl Fn(usize) -> &'static str,
) -> Vec<(Vec<u8>, BasicProperties)> {
    (0..n)
        .map(|k| {
            (
                format!("body {k}").into_bytes(),
                dead(&format!("m-{k}"), reason(k), "e", tenant(k)),
            )
        })
        .collect()
}
