//! `dlqctl dlq peek` against a real broker: it shows the head of the DLQ
//! with what the headers say, and leaves every message in place, in order;
//! a second reader of the same DLQ is told it is busy.

use crate::support::dlq::{dlq, provisioned};
use crate::support::worker::{drain, i, publish, s, table, with_id, Pipe};
use crate::support::{Broker, Cleanup, Run, Scratch};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use serde_json::Value;
use std::path::{Path, PathBuf};

async fn peek(file: &Path, queue: &str, extra: &[&str]) -> Run {
    dlq("peek", file, queue, extra).await
}

/// Another DLQ command's lock on `dlq`, as it declares it.
pub struct HeldLock {
    ch: lapin::Channel,
    name: String,
}

/// Takes the lock of `dlq` as a DLQ command would.
pub async fn hold_lock(b: &Broker, dlq: &str) -> HeldLock {
    let ch = b.channel().await;
    let name = dlqctl::ops::dlq::lock_name(dlq);
    ch.queue_declare(
        name.as_str().into(),
        QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("the lock");
    HeldLock { ch, name }
}

impl HeldLock {
    /// Ends the holder (deletes its lock queue).
    pub async fn release(self) {
        let _ = self
            .ch
            .queue_delete(self.name.as_str().into(), Default::default())
            .await;
    }
}

async fn fill(b: &Broker, pipe: &Pipe, n: usize) {
    for k in 0..n {
        let headers = table(&[
            ("dlqctl-reason", s("exhausted")),
            ("dlqctl-attempt", i(4)),
            ("dlqctl-last-error", s(&format!("order {k} not found"))),
            ("dlqctl-original-routing-key", s("order.created")),
        ]);
        let props = with_id(&format!("m-{k}")).with_headers(headers);
        publish(b, "", &pipe.dlq(), format!("body {k}").as_bytes(), props).await;
    }
}

/// A provisioned pipeline whose DLQ holds `n` messages from [`fill`]:
/// the broker, the names' guard, the scratch directory, the pipeline and
/// its topology file.
async fn filled(n: usize) -> (Broker, Cleanup, Scratch, Pipe, PathBuf) {
    let (b, c, dir, pipe, file) = provisioned(3).await;
    fill(&b, &pipe, n).await;
    (b, c, dir, pipe, file)
}

#[tokio::test]
async fn peek_shows_the_head_and_leaves_every_message_in_order() {
    let (b, _c, _dir, pipe, file) = filled(5).await;

    let run = peek(&file, &pipe.name, &["--limit", "3", "--json"]).await;
    run.assert_code(0);
    let doc: Value = serde_json::from_str(run.stdout.trim()).expect("JSON");
    assert_eq!(doc["snapshot"], 5, "{doc:#}");
    let msgs = doc["messages"].as_array().expect("messages");
    assert_eq!(msgs.len(), 3, "{doc:#}");
    for (k, m) in msgs.iter().enumerate() {
        assert_eq!(m["message_id"], format!("m-{k}"));
        assert_eq!(m["reason"], "exhausted");
        assert_eq!(m["attempts"], 4);
        assert_eq!(m["last_error"], format!("order {k} not found"));
        assert_eq!(m["original_routing_key"], "order.created");
        assert_eq!(m["body_utf8"], format!("body {k}"));
    }

    let run = peek(&file, &pipe.name, &[]).await;
    run.assert_code(0).assert_stdout_has(&[
        "5 message(s) shown (5 read of 5 ready",
        "id=m-4 reason=exhausted attempts=4",
        "body (6 bytes): body 4",
    ]);

    // Everything is still there, in the order it was published.
    b.wait_for_count(&pipe.dlq(), 5, std::time::Duration::from_secs(10))
        .await;
    let left: Vec<String> = drain(&b, &pipe.dlq())
        .await
        .iter()
        .map(|d| String::from_utf8_lossy(&d.data).into_owned())
        .collect();
    assert_eq!(
        left,
        (0..5).map(|k| format!("body {k}")).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_second_reader_of_the_dlq_is_told_it_is_busy() {
    let (b, _c, _dir, pipe, file) = filled(1).await;
    // Another command's lock: the exclusive queue it declares.
    let lock = hold_lock(&b, &pipe.dlq()).await;
    let run = peek(&file, &pipe.name, &[]).await;
    run.assert_code(1);
    assert!(run.stderr.contains("is busy"), "{}", run.stderr);
    // The holder ends (its connection's exclusive queue goes with it).
    lock.release().await;
    let run = peek(&file, &pipe.name, &[]).await;
    run.assert_code(0)
        .assert_stdout_has(&["1 message(s) shown (1 read of 1 ready"]);
}

#[tokio::test]
async fn peek_of_an_unknown_pipeline_is_bad_usage() {
    let c = Cleanup::new();
    let dir = Scratch::new();
    let pipe = Pipe::new(&c, &[60_000], 3);
    let file = pipe.write(&dir);
    let run = peek(&file, "no-such-pipeline", &[]).await;
    run.assert_code(2);
    assert!(run.stderr.contains("is not a pipeline"), "{}", run.stderr);
}

/// Summary groups by reason and error fingerprint ("order 0 not found"
/// and "order 1 not found" together), and changes nothing.
#[tokio::test]
async fn summary_groups_by_fingerprint_and_leaves_the_dlq_as_it_was() {
    let (b, _c, _dir, pipe, file) = filled(4).await;
    let odd = table(&[
        ("dlqctl-reason", s("permanent")),
        ("dlqctl-last-error", s("cannot parse 'x'")),
    ]);
    publish(
        &b,
        "",
        &pipe.dlq(),
        b"odd",
        with_id("odd-1").with_headers(odd),
    )
    .await;

    let run = dlq("summary", &file, &pipe.name, &["--json"]).await;
    run.assert_code(0);
    let doc: Value = serde_json::from_str(run.stdout.trim()).expect("JSON");
    assert_eq!(doc["read"], 5, "{doc:#}");
    let groups = doc["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2, "{doc:#}");
    assert_eq!(groups[0]["count"], 4);
    assert_eq!(groups[0]["reason"], "exhausted");
    assert_eq!(groups[0]["fingerprint"], "order <n> not found");
    assert_eq!(groups[0]["example_message_id"], "m-0");
    assert_eq!(groups[1]["fingerprint"], "cannot parse '<v>'");
    assert_eq!(groups[0]["id"].as_str().map(str::len), Some(10));

    b.wait_for_count(&pipe.dlq(), 5, std::time::Duration::from_secs(10))
        .await;
    assert_eq!(drain(&b, &pipe.dlq()).await.len(), 5);
}
