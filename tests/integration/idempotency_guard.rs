//! Idempotent handling, what the guard decides before a handler runs
//! (docs/worker.md, "Idempotent handling"): keys of every header type,
//! and a key that comes again with another body (a conflict).

use crate::idempotency::{assert_once_each, decided, fixture, wait_settled};
use crate::support::worker::{publish, table, with_id};
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
