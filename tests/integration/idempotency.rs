//! Idempotent handling (docs/worker.md, "Idempotent handling") against a
//! real SQLite file and a real Redis of the test's own: every id is
//! published twice and the handler waits for a gate the test opens only
//! once a copy was deferred, so that the two copies certainly overlap
//! (however slow the machine); each id must run exactly once, the second
//! copy being deferred while the first runs, then acked as a duplicate.

use crate::support::redis::RedisServer;
use crate::support::script::Script;
use crate::support::worker::{publish, with_id, PipeFixture, WorkerProc};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Runs per message id so far.
pub(crate) fn runs(script: &Script) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for c in script.calls() {
        *m.entry(c.message_id).or_insert(0) += 1;
    }
    m
}

/// A fixture (tiers 1 s and 2 s, 5 attempts) whose pipeline has
/// `idempotency` as written (YAML flow text), if any.
pub(crate) async fn fixture(idempotency: Option<&str>) -> PipeFixture {
    let mut f = PipeFixture::new(&[1000, 2000], 5, |_| {}).await;
    f.pipe.idempotency = idempotency.map(str::to_string);
    f
}

/// `{store: 'sqlite:SCRATCH/keys.db'}`.
pub(crate) fn sqlite_block(f: &PipeFixture) -> String {
    format!(
        "{{store: 'sqlite:{}'}}",
        f.scratch.path().join("keys.db").display()
    )
}

/// Publishes ids `PREFIX0..PREFIXn`, each twice back to back.
pub(crate) async fn publish_twice(f: &PipeFixture, prefix: &str, n: usize) {
    for k in 0..n {
        for _ in 0..2 {
            let id = with_id(&format!("{prefix}{k}"));
            publish(&f.broker, "", &f.pipe.name, b"x", id).await;
        }
    }
}

/// The events of every worker whose `decision` is `decision`.
pub(crate) fn decided(workers: &[&WorkerProc], decision: &str) -> Vec<Value> {
    workers
        .iter()
        .flat_map(|w| {
            let mut all = w.decisions();
            all.extend(w.events("message not run"));
            all
        })
        .filter(|e| e["decision"] == decision)
        .collect()
}

/// Waits until the workers have acked `acks` messages after a run and
/// `duplicates` without one; panics with their output after `deadline`.
pub(crate) async fn wait_settled(
    workers: &[&WorkerProc],
    acks: usize,
    duplicates: usize,
    deadline: Duration,
) {
    let start = Instant::now();
    loop {
        let (a, d) = (
            decided(workers, "ack").len(),
            decided(workers, "duplicate").len(),
        );
        if a >= acks && d >= duplicates {
            return;
        }
        if start.elapsed() > deadline {
            let out: Vec<String> = workers.iter().map(|w| w.output()).collect();
            panic!(
                "wanted {acks} acks and {duplicates} duplicates within {deadline:?}, got {a} and {d}:\n{}",
                out.join("\n----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts that every id `PREFIX0..PREFIXn` ran exactly once.
pub(crate) fn assert_once_each(script: &Script, prefix: &str, n: usize) {
    let r = runs(script);
    let want: BTreeMap<String, usize> = (0..n).map(|k| (format!("{prefix}{k}"), 1)).collect();
    assert_eq!(r, want, "each id ran once");
}

/// A handler that waits until the test creates `open` in its directory
/// (`Script::dir`): its key stays leased until then.
pub(crate) const GATED: &str = r#"while [ ! -e "$d/open" ]; do sleep 0.02; done"#;

/// Two worker processes of `f`'s pipeline, each with two handlers
/// running `behaviour`, once both consume.
async fn two_workers(f: &PipeFixture, behaviour: &str) -> (Script, WorkerProc, WorkerProc) {
    let args = ["--concurrency", "2"];
    let (file, script, mut w1) = f.start_worker(behaviour, &args).await;
    let mut w2 = WorkerProc::with_script(&file, &f.pipe.name, &script, &args);
    w1.wait_consuming().await;
    w2.wait_consuming().await;
    (script, w1, w2)
}

/// Waits until one of the workers deferred a copy (its key leased by a
/// gated handler), then opens the gate. The first copies of the first
/// ids fill the workers' handlers and hold their keys until then, so
/// the deferral comes whatever the timing: without it, this fails.
pub(crate) async fn defer_then_open(script: &Script, workers: &[&WorkerProc]) {
    let start = Instant::now();
    while decided(workers, "deferred").is_empty() {
        let out: Vec<String> = workers.iter().map(|w| w.output()).collect();
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no deferral while the handlers held their keys:\n{}",
            out.join("\n----\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(script.dir.join("open"), "").expect("open the gate");
}

async fn stop_both(mut w1: WorkerProc, mut w2: WorkerProc) {
    w1.stop().await;
    w2.stop().await;
}

/// Two worker processes, each with two handlers, on one SQLite file:
/// every id published twice runs once; the overlapping copies are
/// deferred, then acked as duplicates.
#[tokio::test]
async fn two_processes_on_one_sqlite_file_run_each_id_once() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let (script, w1, w2) = two_workers(&f, GATED).await;
    publish_twice(&f, "s-", 20).await;
    defer_then_open(&script, &[&w1, &w2]).await;
    wait_settled(&[&w1, &w2], 20, 20, Duration::from_secs(60)).await;
    assert_once_each(&script, "s-", 20);
    for q in f.all_queues() {
        f.broker
            .wait_for_count(&q, 0, Duration::from_secs(10))
            .await;
    }
    stop_both(w1, w2).await;
}

/// The same with two workers on one Redis (as on two machines).
#[tokio::test]
async fn two_workers_on_one_redis_run_each_id_once() {
    let redis = RedisServer::start();
    let f = fixture(Some(&format!("{{store: '{}'}}", redis.url()))).await;
    let (script, w1, w2) = two_workers(&f, GATED).await;
    publish_twice(&f, "r-", 20).await;
    defer_then_open(&script, &[&w1, &w2]).await;
    wait_settled(&[&w1, &w2], 20, 20, Duration::from_secs(60)).await;
    assert_once_each(&script, "r-", 20);
    for q in f.all_queues() {
        f.broker
            .wait_for_count(&q, 0, Duration::from_secs(10))
            .await;
    }
    stop_both(w1, w2).await;
}

/// The control: the same two workers without `idempotency` run the
/// overlapping copies twice (what the tests above would see without the
/// guard).
#[tokio::test]
async fn without_the_guard_the_overlapping_copies_run_twice() {
    let f = fixture(None).await;
    let (script, w1, w2) = two_workers(&f, "sleep 0.3").await;
    publish_twice(&f, "c-", 10).await;
    wait_settled(&[&w1, &w2], 20, 0, Duration::from_secs(60)).await;
    let r = runs(&script);
    assert!(r.values().all(|&n| n == 2), "{r:?}");
    stop_both(w1, w2).await;
}
