//! What the benches share: a provisioned pipeline of their own, filling
//! its DLQ with messages as the worker writes them, and emptying a queue.

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection};

/// Empties `queue`.
pub async fn purge(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.expect("channel");
    ch.queue_purge(queue.into(), QueuePurgeOptions::default())
        .await
        .expect("purge");
    let _ = ch.close(200, "".into()).await;
}

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

/// A pipeline `bench-KIND-PID-orders` (one 10 s tier, 3 attempts),
/// provisioned from a topology file in a folder of its own.
pub struct BenchPipeline {
    /// The pipeline (its main queue).
    pub name: String,
    /// Its DLQ.
    pub dlq: String,
    /// The topology file.
    pub file: String,
    dir: std::path::PathBuf,
}

impl BenchPipeline {
    /// Writes the topology and provisions it.
    pub fn provision(kind: &str) -> BenchPipeline {
        let prefix = format!("bench-{kind}-{}", std::process::id());
        let name = format!("{prefix}-orders");
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("topology.yaml");
        std::fs::write(
            &file,
            format!("version: 1\npipelines:\n  - name: {name}\n    retry: {{ delays: [10s], max_attempts: 3 }}\n"),
        )
        .expect("topology");
        let file = file.display().to_string();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlqctl"))
            .args(["provision", &file])
            .output()
            .expect("dlqctl provision");
        assert!(
            out.status.success(),
            "provision: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        BenchPipeline {
            dlq: format!("{name}.dlq"),
            name,
            file,
            dir,
        }
    }

    /// Deletes its queues, exchanges and folder.
    pub async fn delete(&self, conn: &Connection) {
        let ch = conn.create_channel().await.expect("channel");
        for q in [
            self.name.clone(),
            self.dlq.clone(),
            format!("{}.retry.10s", self.name),
        ] {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for x in [format!("{}.retry", self.name), format!("{}.dlx", self.name)] {
            let _ = ch
                .exchange_delete(x.as_str().into(), Default::default())
                .await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The number in environment variable `name`, or `default` when it is
/// unset or not a number.
pub fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
