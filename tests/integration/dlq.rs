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

/// Off a terminal (cron, CI: the tests' stderr is a pipe) the DLQ
/// commands write no progress lines unless asked with `--progress`
/// (summary, export to a file, replay: each reads the DLQ with progress).
#[tokio::test]
async fn off_a_terminal_progress_lines_come_only_with_progress() {
    let (b, _c, dir, pipe, file) = filled(30).await;
    let out = dir.path().join("export.jsonl");
    let out = out.to_str().unwrap_or_default();
    for (verb, extra) in [
        ("summary", vec![]),
        ("export", vec!["--output", out]),
        ("replay", vec!["--dry-run"]),
    ] {
        let quiet = dlq(verb, &file, &pipe.name, &extra).await;
        assert!(
            !quiet.stderr.contains("progress:"),
            "{verb} without --progress: {}",
            quiet.output()
        );
        let mut extra = extra.clone();
        extra.push("--progress");
        let _ = std::fs::remove_file(out);
        let asked = dlq(verb, &file, &pipe.name, &extra).await;
        assert!(
            asked.stderr.contains("progress:"),
            "{verb} --progress: {}",
            asked.output()
        );
    }
    // Nothing was removed (a dry run moves nothing).
    assert_eq!(b.message_count(&pipe.dlq()).await, Some(30));
}

/// Messages given back to a quorum DLQ just after a command took its lock
/// count in its snapshot. A command that dies holding a window unacked
/// (`kill -9`, a closed pipe) loses its lock at once, but its messages come
/// back through the queue's log 10 to 35 ms later (measured on 3.10.8); a
/// snapshot taken in between left them out, and a `purge --yes` right
/// after left them in the DLQ (once seen: 8,653 of 20,002). Here the
/// test holds 10,000 of 20,000 messages and gives them back the moment it
/// sees the purge's lock, which is that gap made certain.
#[tokio::test]
async fn messages_given_back_just_after_the_lock_is_taken_are_in_the_snapshot() {
    const N: usize = 20_000;
    const HELD: u16 = 10_000;
    let (b, _c, _dir, pipe, file) = provisioned(3).await;
    let msgs = (0..N).map(|k| {
        (
            format!("body {k}").into_bytes(),
            with_id(&format!("m-{k}")).with_headers(table(&[("dlqctl-reason", s("exhausted"))])),
        )
    });
    b.publish_all("", &pipe.dlq(), msgs).await;
    b.wait_for_count(&pipe.dlq(), N as u32, std::time::Duration::from_secs(30))
        .await;
    let holder = lapin::Connection::connect(
        &crate::support::amqp_url(),
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("a connection");
    let reader = holder.create_channel().await.expect("a channel");
    reader
        .basic_qos(HELD, lapin::options::BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = reader
        .basic_consume(
            pipe.dlq().as_str().into(),
            "holder".into(),
            lapin::options::BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("a consumer");
    use futures_util::StreamExt;
    for _ in 0..HELD {
        consumer
            .next()
            .await
            .expect("a delivery")
            .expect("a delivery");
    }
    let purge = {
        let (file, queue) = (file.clone(), pipe.name.clone());
        tokio::spawn(async move { dlq("purge", &file, &queue, &["--yes"]).await })
    };
    // The moment the purge holds the DLQ's lock, the held window goes back.
    let lock = format!("dlqctl.lock.{}", pipe.dlq());
    let start = std::time::Instant::now();
    loop {
        let ch = holder.create_channel().await.expect("a channel");
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let seen = ch
            .queue_declare(lock.as_str().into(), passive, FieldTable::default())
            .await;
        // 405 RESOURCE_LOCKED: another connection holds it; 404: not yet.
        let code = match &seen {
            Ok(_) => None,
            Err(e) => match e.kind() {
                lapin::ErrorKind::ProtocolError(amqp) => Some(amqp.get_id()),
                _ => None,
            },
        };
        if code == Some(405) {
            break;
        }
        assert!(
            matches!(code, Some(404)),
            "the lock's passive declare: {seen:?}"
        );
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "the purge never took its lock"
        );
    }
    // As a dying command's channel does: closed with the window unacked.
    reader
        .close(200, "gone".into())
        .await
        .expect("the window given back");
    let purge = purge.await.expect("the purge");
    purge.assert_code(0);
    let _ = holder.close(200, "done".into()).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(
        b.message_count(&pipe.dlq()).await,
        Some(0),
        "left after the purge: {}",
        purge.output()
    );
}
