//! What the DLQ benches share: filling a DLQ with messages as the worker
//! writes them.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection};

/// Publishes `n` DLQ messages as the worker writes them (reason
/// `exhausted`, attempt 4, `dlqctl-last-error` = `error(k)`, id `m-K`,
/// ~100-byte JSON bodies) to `queue`, confirmed.
pub async fn fill(conn: &Connection, queue: &str, n: usize, error: impl Fn(usize) -> String) {
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut pending = Vec::new();
    for k in 0..n {
        let mut h = FieldTable::default();
        h.insert(
            "dlqctl-reason".into(),
            AMQPValue::LongString(LongString::from("exhausted")),
        );
        h.insert(
            "dlqctl-last-error".into(),
            AMQPValue::LongString(LongString::from(error(k))),
        );
        h.insert("dlqctl-attempt".into(), AMQPValue::LongLongInt(4));
        let props = BasicProperties::default()
            .with_message_id(format!("m-{k}").into())
            .with_delivery_mode(2)
            .with_headers(h);
        pending.push(
            ch.basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                format!("{{\"order\":{k},\"pad\":\"{}\"}}", "x".repeat(60)).as_bytes(),
                props,
            )
            .await
            .expect("publish"),
        );
        if pending.len() >= 2000 {
            for c in pending.drain(..) {
                c.await.expect("confirm");
            }
        }
    }
    for c in pending {
        c.await.expect("confirm");
    }
    let _ = ch.close(200, "".into()).await;
}
