//! Idempotent handling, what the guard decides before a handler runs
//! (docs/worker.md, "Idempotent handling"): keys of every header type,
//! and a key that comes again with another body (a conflict).

use crate::idempotency::{assert_once_each, decided, fixture, wait_settled};
use crate::support::http_get;
use crate::support::redis::RedisServer;
use crate::support::script::Script;
use crate::support::worker::{drain, header_str, publish, table, with_id, PipeFixture};
use dlqctl::core::wire::{KEY_CONFLICT_REASON, REASON_HEADER};
use lapin::types::{AMQPValue, DecimalValue, FieldTable};
use std::time::Duration;

/// `key: header:k` of each type a producer may send, each message
/// published twice: a boolean, a decimal, a float, a double and a
/// timestamp are keys (each ran once, the other copy a duplicate), as
/// strings and integers are; a table is no key, and its warning names it.
#[tokio::test]
async fn a_header_key_of_any_scalar_type_runs_once() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(format!(
        "{{key: 'header:k', store: 'sqlite:{}'}}",
        f.scratch.path().join("keys.db").display()
    ));
    let (_file, script, mut w) = f
        .consuming_worker("sleep 0.3", &["--concurrency", "2"])
        .await;
    let values = [
        AMQPValue::Boolean(true),
        AMQPValue::Boolean(false),
        AMQPValue::DecimalValue(DecimalValue {
            scale: 2,
            value: 1999,
        }),
        AMQPValue::Float(1.5),
        AMQPValue::Double(2.25),
        AMQPValue::Timestamp(1_700_000_000),
        AMQPValue::LongString("o-1".into()),
        AMQPValue::LongLongInt(42),
    ];
    for (n, v) in values.iter().enumerate() {
        for _ in 0..2 {
            let props = with_id(&format!("t-{n}")).with_headers(table(&[("k", v.clone())]));
            publish(&f.broker, "", &f.pipe.name, b"x", props).await;
        }
    }
    wait_settled(&[&w], values.len(), values.len(), Duration::from_secs(60)).await;
    assert_once_each(&script, "t-", values.len());
    // A table: no key, runs (both copies), warned naming its type.
    for _ in 0..2 {
        let props = with_id("table").with_headers(table(&[(
            "k",
            AMQPValue::FieldTable(FieldTable::default()),
        )]));
        publish(&f.broker, "", &f.pipe.name, b"x", props).await;
    }
    script
        .wait_calls(values.len() + 2, Duration::from_secs(30))
        .await;
    let warned = w.output();
    assert!(
        warned.contains("is a table, which cannot identify a message"),
        "{warned}"
    );
    assert!(!warned.contains("without the idempotency key"), "{warned}");
    assert_eq!(decided(&[&w], "duplicate").len(), values.len());
    w.stop().await;
}

/// Publishes one message of id `id` with `body`.
async fn publish_body(f: &PipeFixture, id: &str, body: &[u8]) {
    publish(&f.broker, "", &f.pipe.name, body, with_id(id)).await;
}

/// The calls of the handler for `id`, with their bodies.
fn bodies_of(script: &Script, id: &str) -> Vec<Vec<u8>> {
    script
        .calls()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.message_id == id)
        .map(|(n, _)| script.body(n + 1))
        .collect()
}

/// The same `message_id` published as body A, A again, then B (another
/// amount), back to back, four handlers at once: A runs once, its copy is
/// a duplicate (deferred first if it came while A ran), and B, a key
/// conflict, goes to the DLQ with the reason `key_conflict` without its
/// handler (the default `on_conflict`). Never three calls for one id.
async fn one_id_three_bodies_runs_once(store: &str) {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(format!("{{store: '{store}'}}"));
    let (_file, script, mut w) = f
        .consuming_worker("sleep 0.3", &["--concurrency", "4"])
        .await;
    publish_body(&f, "pay-1", b"{\"amount\": 10}").await;
    publish_body(&f, "pay-1", b"{\"amount\": 10}").await;
    publish_body(&f, "pay-1", b"{\"amount\": 99}").await;
    f.broker
        .wait_for_count(&f.pipe.dlq(), 1, Duration::from_secs(60))
        .await;
    wait_settled(&[&w], 1, 1, Duration::from_secs(60)).await;
    // And once more A: a duplicate, whatever came between.
    publish_body(&f, "pay-1", b"{\"amount\": 10}").await;
    wait_settled(&[&w], 1, 2, Duration::from_secs(60)).await;
    assert_eq!(
        bodies_of(&script, "pay-1"),
        vec![b"{\"amount\": 10}".to_vec()]
    );
    let dead = drain(&f.broker, &f.pipe.dlq()).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].data, b"{\"amount\": 99}");
    assert_eq!(header_str(&dead[0], REASON_HEADER), KEY_CONFLICT_REASON);
    let conflicts = decided(&[&w], "dead_letter");
    assert_eq!(conflicts.len(), 1, "{}", w.output());
    assert_eq!(conflicts[0]["reason"], KEY_CONFLICT_REASON);
    w.stop().await;
}

#[tokio::test]
async fn one_id_three_bodies_runs_once_on_sqlite() {
    let dir = crate::support::Scratch::new();
    let store = format!("sqlite:{}", dir.path().join("keys.db").display());
    one_id_three_bodies_runs_once(&store).await;
}

#[tokio::test]
async fn one_id_three_bodies_runs_once_on_redis() {
    let redis = RedisServer::start();
    one_id_three_bodies_runs_once(&redis.url()).await;
}

/// `on_conflict: skip` acks a conflict without its handler; `run` runs
/// it, and the mark keeps body A: A again is still a duplicate.
#[tokio::test]
async fn on_conflict_skip_acks_and_run_runs_without_replacing_the_mark() {
    for (policy, b_runs) in [("skip", false), ("run", true)] {
        let mut f = fixture(None).await;
        f.pipe.idempotency = Some(format!(
            "{{store: 'sqlite:{}', on_conflict: {policy}}}",
            f.scratch.path().join("keys.db").display()
        ));
        let (_file, script, mut w) = f.consuming_worker("true", &[]).await;
        publish_body(&f, "pay-2", b"A").await;
        wait_settled(&[&w], 1, 0, Duration::from_secs(30)).await;
        publish_body(&f, "pay-2", b"B").await;
        let (acks, dups) = if b_runs { (2, 0) } else { (1, 1) };
        wait_settled(&[&w], acks, dups, Duration::from_secs(30)).await;
        publish_body(&f, "pay-2", b"A").await;
        wait_settled(&[&w], acks, dups + 1, Duration::from_secs(30)).await;
        let want: Vec<Vec<u8>> = if b_runs {
            vec![b"A".to_vec(), b"B".to_vec()]
        } else {
            vec![b"A".to_vec()]
        };
        assert_eq!(bodies_of(&script, "pay-2"), want, "{policy}");
        assert_eq!(
            f.broker.message_count(&f.pipe.dlq()).await,
            Some(0),
            "{policy}"
        );
        w.stop().await;
    }
}

/// An idle worker (no message comes) whose Redis is stopped turns not
/// ready (`/readyz` 503) within 15 s of the loss, by its idle ping, and
/// ready again once Redis is back.
#[tokio::test]
async fn an_idle_worker_turns_not_ready_within_15_s_of_its_store_loss() {
    let mut redis = RedisServer::start();
    let f = fixture(Some(&format!("{{store: '{}'}}", redis.url()))).await;
    let (_file, _script, mut w) = f
        .start_worker("true", &["--metrics-addr", "127.0.0.1:0"])
        .await;
    let addr = w.metrics_addr().await;
    w.wait_consuming().await;
    let readyz = || async move { http_get(&format!("http://{addr}/readyz")).await };
    let (code, body) = readyz().await;
    assert_eq!(code, 200, "{body}");
    redis.stop();
    let lost = std::time::Instant::now();
    loop {
        let (code, body) = readyz().await;
        if code == 503 {
            assert!(body.contains("idempotency store"), "{body}");
            break;
        }
        assert!(
            lost.elapsed() < Duration::from_secs(15),
            "still ready 15 s after the store's loss:\n{}",
            w.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    redis.restart();
    let back = std::time::Instant::now();
    while readyz().await.0 != 200 {
        assert!(back.elapsed() < Duration::from_secs(20), "{}", w.output());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    w.stop().await;
}
