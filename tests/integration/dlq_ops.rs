//! `dlqctl dlq export|replay|purge` against a real broker: lossless export
//! and import, the snapshot, selectors, rate, canary, rotation past the
//! window, SIGKILL, and no duplicates left on quorum DLQs.

use crate::support::dlq::{dead, dead_many, dlq, ids, provisioned, publish_many, Fixture};
use crate::support::policy::{Kind, PolicyGuard};
use crate::support::script::Script;
use crate::support::worker::{drain, i, publish, s, table, Pipe, WorkerProc};
use crate::support::{Broker, Cleanup, Dlqctl, Run};
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use serde_json::Value;
use std::time::{Duration, Instant};

fn json(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", run.output()))
}

async fn scratch_queue(b: &Broker, c: &Cleanup, name: &str) -> String {
    let q = c.name(name);
    b.channel()
        .await
        .queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("a scratch queue");
    q
}

fn header<'a>(d: &'a lapin::message::Delivery, k: &str) -> Option<&'a AMQPValue> {
    d.properties.headers().as_ref()?.inner().get(k)
}

/// Export changes nothing; `replay --from-file` into a scratch queue gives
/// back the bodies, properties and typed headers byte for byte, except the
/// documented replay changes.
#[tokio::test]
async fn export_then_replay_from_file_round_trips_byte_for_byte() {
    let (b, c, dir, pipe, file) = provisioned(3).await;

    let raw =
        |bytes: &[u8]| ShortString::from(dlqctl::core::values::shortstr::from_raw_bytes(bytes));
    let mut rich = dead("m-0", "exhausted", "boom", "acme")
        .headers()
        .clone()
        .unwrap();
    rich.insert("f".into(), AMQPValue::Double(0.1));
    rich.insert("n8".into(), AMQPValue::ShortShortInt(-5));
    rich.insert("ts".into(), AMQPValue::Timestamp(1_700_000_000));
    rich.insert(
        "bin".into(),
        AMQPValue::LongString(LongString::from(vec![0xff, 0])),
    );
    rich.insert(raw(&[0xfe, b'k']), AMQPValue::Boolean(true));
    rich.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(table(&[
            ("count", i(1)),
            ("reason", s("rejected")),
            ("queue", s("somewhere")),
        ]))])),
    );
    rich.insert("x-first-death-reason".into(), s("rejected"));
    let first = BasicProperties::default()
        .with_message_id(raw(&[0xff, b'1']))
        .with_correlation_id(raw(&[0xc0]))
        .with_content_type("application/octet-stream".into())
        .with_type("order.created".into())
        .with_app_id("shop".into())
        // Above 4: RabbitMQ 4.x quorum queues deliver a priority above 4
        // before messages without one, and one below 4 after them (3.10
        // ignores priorities on quorum queues), so this message stays
        // first on every version and the order checks below hold.
        .with_priority(7)
        .with_timestamp(1_700_000_000)
        .with_headers(rich);
    let mut msgs = vec![(vec![0u8, 255, 1, 2], first)];
    for k in 1..4 {
        msgs.push((
            format!("body {k}").into_bytes(),
            dead(&format!("m-{k}"), "permanent", "bad", "acme"),
        ));
    }
    let originals = msgs.clone();
    publish_many(&b, &pipe.dlq(), msgs).await;

    let out = dir.path().join("dlq.jsonl");
    let run = dlq(
        "export",
        &file,
        &pipe.name,
        &["--output", &out.display().to_string(), "--json"],
    )
    .await;
    run.assert_code(0);
    let report = json(&run);
    assert_eq!(report["written"], 4, "{report:#}");
    assert_eq!(report["removed"], 0);
    let text = std::fs::read_to_string(&out).expect("the export");
    assert_eq!(text.lines().count(), 4);
    let line: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(line["properties"]["message_id_base64"], "/zE=", "{line:#}");
    assert_eq!(line["properties"]["headers"]["n8"]["type"], "i8");
    // The DLQ is unchanged: depth, order and bodies.
    b.wait_for_count(&pipe.dlq(), 4, Duration::from_secs(10))
        .await;

    // Exporting to an existing file is refused; --append adds.
    let run = dlq(
        "export",
        &file,
        &pipe.name,
        &["--output", &out.display().to_string()],
    )
    .await;
    run.assert_code(2);
    assert!(run.stderr.contains("exists"), "{}", run.stderr);

    let scratch = scratch_queue(&b, &c, "import").await;
    let run = dlq(
        "replay",
        &file,
        &pipe.name,
        &[
            "--from-file",
            &out.display().to_string(),
            "--to",
            &scratch,
            "--json",
        ],
    )
    .await;
    run.assert_code(0);
    assert_eq!(json(&run)["moved"], 4, "{}", run.output());
    b.wait_for_count(&scratch, 4, Duration::from_secs(10)).await;
    let got = drain(&b, &scratch).await;
    assert_eq!(got.len(), 4);
    for ((body, props), d) in originals.iter().zip(&got) {
        assert_eq!(&d.data, body);
        let p = &d.properties;
        assert_eq!(p.message_id(), props.message_id());
        assert_eq!(p.correlation_id(), props.correlation_id());
        assert_eq!(p.content_type(), props.content_type());
        assert_eq!(p.kind(), props.kind());
        assert_eq!(p.app_id(), props.app_id());
        assert_eq!(p.priority(), props.priority());
        assert_eq!(p.timestamp(), props.timestamp());
        let mut want = props.headers().clone().unwrap().inner().clone();
        for gone in ["x-death", "x-first-death-reason", "dlqctl-attempt"] {
            want.remove(gone);
        }
        let mut have = p.headers().clone().unwrap().inner().clone();
        assert_eq!(have.remove("dlqctl-replayed"), Some(i(1)));
        assert!(have.remove("dlqctl-replayed-at").is_some());
        assert!(have.remove("dlqctl-replay-id").is_some());
        assert_eq!(format!("{have:?}"), format!("{want:?}"));
    }
    // The DLQ still holds all four, in order.
    let left = drain(&b, &pipe.dlq()).await;
    assert_eq!(
        left.iter().map(|d| d.data.clone()).collect::<Vec<_>>(),
        originals.iter().map(|(b, _)| b.clone()).collect::<Vec<_>>()
    );
}

/// `--remove` archives: what is written and fsynced is removed; a pipe, a
/// device or no `--output` is refused with exit 2 before anything is read.
#[tokio::test]
async fn export_remove_archives_to_a_regular_file_only() {
    let (b, _c, dir, pipe, file) = provisioned(3).await;
    let msgs = (0..50)
        .map(|k| {
            (
                format!("body {k}").into_bytes(),
                dead(
                    &format!("m-{k}"),
                    if k % 2 == 0 { "permanent" } else { "exhausted" },
                    "e",
                    "t",
                ),
            )
        })
        .collect();
    publish_many(&b, &pipe.dlq(), msgs).await;

    let run = dlq("export", &file, &pipe.name, &["--remove"]).await;
    run.assert_code(2);
    assert!(
        run.stderr.contains("--remove needs --output"),
        "{}",
        run.stderr
    );
    let run = dlq(
        "export",
        &file,
        &pipe.name,
        &["--remove", "--append", "--output", "/dev/null"],
    )
    .await;
    run.assert_code(2);
    assert!(run.stderr.contains("not one"), "{}", run.stderr);
    b.wait_for_count(&pipe.dlq(), 50, Duration::from_secs(10))
        .await;

    let out = dir.path().join("archive.jsonl");
    let run = dlq(
        "export",
        &file,
        &pipe.name,
        &[
            "--remove",
            "--filter-reason",
            "permanent",
            "--output",
            &out.display().to_string(),
        ],
    )
    .await;
    run.assert_code(0);
    assert!(run.stderr.contains("25 removed"), "{}", run.stderr);
    let lines = std::fs::read_to_string(&out).unwrap();
    assert_eq!(lines.lines().count(), 25);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = drain(&b, &pipe.dlq()).await;
    assert_eq!(left.len(), 25, "{:?}", ids(&left));
    assert!(ids(&left)
        .iter()
        .all(|id| id.trim_start_matches("m-").parse::<u32>().unwrap() % 2 == 1));
}

/// The replay moves the snapshot once, even though a worker fails every
/// message straight back into the DLQ; the worker sees attempt 1 with the
/// history kept.
#[tokio::test]
async fn replay_moves_exactly_the_snapshot_while_a_worker_fails_them_back() {
    let (b, _c, dir, pipe, file) = provisioned(1).await;
    let msgs = (0..20)
        .map(|k| {
            (
                format!("body {k}").into_bytes(),
                dead(&format!("m-{k}"), "exhausted", "old error", "t"),
            )
        })
        .collect();
    publish_many(&b, &pipe.dlq(), msgs).await;
    let script = Script::new(&dir, "h", "echo 'still broken' >&2; exit 65");
    let mut worker = WorkerProc::with_script(&file, &pipe.name, &script, &["--concurrency", "4"]);
    worker.wait_consuming().await;

    let run = dlq("replay", &file, &pipe.name, &["--json"]).await;
    run.assert_code(0);
    let r = json(&run);
    assert_eq!(r["moved"], 20, "{r:#}");
    assert_eq!(r["read"], 20, "the snapshot, no more: {r:#}");
    script.wait_calls(20, Duration::from_secs(30)).await;
    b.wait_for_count(&pipe.dlq(), 20, Duration::from_secs(20))
        .await;
    worker.stop().await;
    let calls = script.calls();
    assert_eq!(calls.len(), 20, "each replayed once: {calls:#?}");
    assert!(calls.iter().all(|c| c.attempt == 1), "{calls:#?}");
    let h = script.headers(1);
    let errors = h["dlqctl-errors"].as_array().expect("history");
    assert_eq!(errors[0]["error"], "old error", "{h:#}");
    assert_eq!(h["dlqctl-replayed"], 1);
    let back = drain(&b, &pipe.dlq()).await;
    assert_eq!(back.len(), 20);
    for d in &back {
        assert_eq!(header(d, "dlqctl-replayed"), Some(&i(1)));
        assert_eq!(header(d, "dlqctl-reason"), Some(&s("permanent")));
    }
}

/// Each selector, the limit, --dry-run and --to (guarded for retry queues
/// and DLQs); what is not selected stays, in order.
#[tokio::test]
async fn selectors_limit_dry_run_and_to() {
    let (b, c, _dir, pipe, file) = provisioned(3).await;
    let spec = [
        ("a0", "exhausted", "order 1 not found", "acme"),
        ("a1", "exhausted", "order 2 not found", "acme"),
        ("a2", "permanent", "cannot parse", "acme"),
        ("b0", "permanent", "cannot parse", "bolt"),
        ("b1", "exhausted", "HTTP 503 from billing", "bolt"),
        ("b2", "exhausted", "order 3 not found", "bolt"),
    ];
    let msgs = spec
        .iter()
        .map(|(id, r, e, t)| (id.as_bytes().to_vec(), dead(id, r, e, t)))
        .collect();
    publish_many(&b, &pipe.dlq(), msgs).await;
    let to = scratch_queue(&b, &c, "to").await;
    let f = |extra: &[&str]| {
        let mut v = vec!["--to", to.as_str(), "--json"];
        v.extend_from_slice(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    /// The ids moved to `to`, sorted: copies go out on several channels
    /// at once, so their order in `to` is not the DLQ's.
    async fn moved(b: &Broker, to: &str, n: usize) -> Vec<String> {
        b.wait_for_count(to, n as u32, Duration::from_secs(10))
            .await;
        let mut v = ids(&drain(b, to).await);
        v.sort();
        v
    }
    let replay = |extra: Vec<String>| {
        let file = file.clone();
        let name = pipe.name.clone();
        async move {
            let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
            dlq("replay", &file, &name, &refs).await
        }
    };

    // --dry-run: counts, moves nothing.
    let run = replay(f(&["--dry-run", "--filter-reason", "permanent"])).await;
    run.assert_code(0);
    assert_eq!(json(&run)["moved"], 2);
    assert_eq!(b.message_count(&to).await, Some(0));

    let run = replay(f(&["--filter-error", "503"])).await;
    run.assert_code(0);
    assert_eq!(moved(&b, &to, 1).await, vec!["b1"]);

    let run = replay(f(&[
        "--filter-header",
        "tenant=bolt",
        "--filter-reason",
        "permanent",
    ]))
    .await;
    run.assert_code(0);
    assert_eq!(moved(&b, &to, 1).await, vec!["b0"]);

    // The summary group of "order <n> not found" (exhausted).
    let sum = dlq("summary", &file, &pipe.name, &["--json"]).await;
    sum.assert_code(0);
    let group = json(&sum)["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["fingerprint"] == "order <n> not found")
        .expect("the group")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let run = replay(f(&["--group", &group, "--limit", "2"])).await;
    run.assert_code(0);
    // Two of the group's three (a0, a1, b2): the first two in the DLQ's
    // order, which earlier reads may have changed (docs/dlq.md,
    // "Nothing requeued one by one").
    let two = moved(&b, &to, 2).await;
    assert_eq!(two.len(), 2, "{two:?}");
    assert!(
        two.iter()
            .all(|id| ["a0", "a1", "b2"].contains(&id.as_str())),
        "{two:?}"
    );

    let rest = ["a0", "a1", "b2"]
        .into_iter()
        .find(|id| !two.iter().any(|t| t == id))
        .unwrap();
    let run = replay(f(&["--message-id", rest, "--message-id", "nope"])).await;
    run.assert_code(0);
    assert_eq!(moved(&b, &to, 1).await, vec![rest]);

    // --to a retry queue or a DLQ needs --force; a missing queue is refused.
    let retry = pipe.retry_queue(60_000);
    let run = dlq("replay", &file, &pipe.name, &["--to", &retry]).await;
    run.assert_code(2);
    assert!(run.stderr.contains("a retry queue of"), "{}", run.stderr);
    let run = dlq(
        "replay",
        &file,
        &pipe.name,
        &["--to", &pipe.dlq(), "--dry-run"],
    )
    .await;
    run.assert_code(2);
    let run = dlq("replay", &file, &pipe.name, &["--to", &c.name("missing")]).await;
    run.assert_code(2);
    assert!(run.stderr.contains("does not exist"), "{}", run.stderr);
    let run = dlq(
        "replay",
        &file,
        &pipe.name,
        &["--to", &retry, "--force", "--dry-run"],
    )
    .await;
    run.assert_code(0);

    // What is left is in order; the default --to is the main queue.
    b.wait_for_count(&pipe.dlq(), 1, Duration::from_secs(10))
        .await;
    let run = dlq("replay", &file, &pipe.name, &[]).await;
    run.assert_code(0);
    assert!(
        run.stdout.contains(&format!(
            "1 message(s) moved from {} to {}",
            pipe.dlq(),
            pipe.name
        )),
        "{}",
        run.stdout
    );
    b.wait_for_count(&pipe.name, 1, Duration::from_secs(10))
        .await;
    assert_eq!(ids(&drain(&b, &pipe.name).await), vec!["a2"]);
}

/// N messages at R/s take about (N − 1)/R seconds.
#[tokio::test]
async fn rate_paces_the_replay() {
    let f = Fixture::new(3, |_| {}, dead_many(21, |_| "exhausted", |_| "t")).await;
    let (pipe, file) = (&f.pipe, &f.file);
    let started = Instant::now();
    let run = dlq("replay", file, &pipe.name, &["--rate", "10", "--json"]).await;
    let took = started.elapsed();
    run.assert_code(0);
    assert_eq!(json(&run)["moved"], 21);
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(10),
        "21 at 10/s took {took:?}"
    );
}

/// A canary that comes back stops the replay (exit 3) and leaves the rest;
/// one that does not lets the rest go.
#[tokio::test]
async fn canary_stops_a_replay_that_fails_again_and_passes_one_that_works() {
    let (b, _c, dir, pipe, file) = provisioned(1).await;
    let msgs = (0..6)
        .map(|k| {
            (
                vec![k as u8],
                dead(&format!("m-{k}"), "exhausted", "e", "t"),
            )
        })
        .collect();
    publish_many(&b, &pipe.dlq(), msgs).await;

    let broken = Script::new(&dir, "broken", "exit 65");
    let mut worker = WorkerProc::with_script(&file, &pipe.name, &broken, &[]);
    worker.wait_consuming().await;
    let run = dlq(
        "replay",
        &file,
        &pipe.name,
        &["--canary", "2", "--canary-wait", "2s", "--json"],
    )
    .await;
    run.assert_code(3);
    let r = json(&run);
    assert_eq!(r["canary"]["sent"], 2, "{r:#}");
    assert_eq!(r["canary"]["came_back"], 2, "{r:#}");
    assert_eq!(r["canary"]["passed"], false);
    assert_eq!(r["moved"], 2);
    worker.stop().await;
    b.wait_for_count(&pipe.dlq(), 6, Duration::from_secs(10))
        .await;

    let fixed = Script::new(&dir, "fixed", "exit 0");
    let mut worker = WorkerProc::with_script(&file, &pipe.name, &fixed, &[]);
    worker.wait_consuming().await;
    let run = dlq(
        "replay",
        &file,
        &pipe.name,
        &["--canary", "2", "--canary-wait", "2s", "--json"],
    )
    .await;
    run.assert_code(0);
    let r = json(&run);
    assert_eq!(r["canary"]["came_back"], 0, "{r:#}");
    assert_eq!(r["moved"], 6, "{r:#}");
    fixed.wait_calls(6, Duration::from_secs(20)).await;
    worker.stop().await;
    assert_eq!(b.message_count(&pipe.dlq()).await, Some(0));
}

/// A replay SIGKILLed mid-run loses nothing: every message is in the DLQ or
/// at the destination (a copy in flight may be in both).
/// Starts `dlqctl dlq replay FILE --queue QUEUE --to TO EXTRA...` in the
/// background, its output piped.
fn spawn_replay(
    file: &std::path::Path,
    queue: &str,
    to: &str,
    extra: &[&str],
) -> tokio::process::Child {
    Dlqctl::new("dlq")
        .arg("replay")
        .arg(file)
        .args(["--queue", queue, "--to", to])
        .args(extra)
        .spawn()
}

/// Waits until `to` holds at least `k` copies: a replay started in the
/// background has connected and is moving. (A fixed sleep was once too
/// short on a loaded machine for the command to start, and the "mid-run"
/// signal then came before the first copy.)
async fn wait_until_moved(b: &Broker, to: &str, k: u32) {
    let start = std::time::Instant::now();
    while b.message_count(to).await.unwrap_or(0) < k {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the replay moved fewer than {k} in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_replay_killed_mid_run_loses_nothing() {
    let n = 1500;
    let f = Fixture::new(3, |_| {}, dead_many(n, |_| "exhausted", |_| "t")).await;
    let (b, c, pipe, file) = (&f.b, &f.c, &f.pipe, &f.file);
    let to = scratch_queue(b, c, "to").await;
    let mut child = spawn_replay(file, &pipe.name, &to, &["--rate", "500"]);
    // At 500 a second the whole run takes 3 s: killed mid-run.
    wait_until_moved(b, &to, 50).await;
    child.start_kill().expect("SIGKILL");
    let _ = child.wait().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut seen: Vec<String> = ids(&drain(b, &pipe.dlq()).await);
    let moved = ids(&drain(b, &to).await);
    assert!(
        !moved.is_empty() && moved.len() < n,
        "killed mid-run: {} moved",
        moved.len()
    );
    seen.extend(moved);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n, "every message is somewhere");
}

/// Past the window, kept messages are rotated to the tail: a filtered
/// replay keeps every message it does not select.
#[tokio::test]
async fn a_filtered_replay_past_the_window_keeps_the_rest() {
    let f = Fixture::new(
        3,
        |_| {},
        dead_many(
            60,
            |_| "exhausted",
            |k| if k % 3 == 0 { "pick" } else { "keep" },
        ),
    )
    .await;
    let (b, c, pipe, file) = (&f.b, &f.c, &f.pipe, &f.file);
    let to = scratch_queue(b, c, "to").await;
    let run = dlq(
        "replay",
        file,
        &pipe.name,
        &[
            "--to",
            &to,
            "--filter-header",
            "tenant=pick",
            "--window",
            "5",
            "--json",
        ],
    )
    .await;
    run.assert_code(0);
    let r = json(&run);
    assert_eq!(r["moved"], 20, "{r:#}");
    assert_eq!(r["rotated"], 35, "{r:#}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = drain(b, &pipe.dlq()).await;
    let mut left_ids = ids(&left);
    left_ids.sort();
    let mut want: Vec<String> = (0..60)
        .filter(|k| k % 3 != 0)
        .map(|k| format!("m-{k}"))
        .collect();
    want.sort();
    assert_eq!(left_ids, want);
    assert_eq!(b.message_count(&to).await, Some(20));
}

/// Purge counts and exits 2 without --yes; with it, removes only what the
/// selectors take.
#[tokio::test]
async fn purge_needs_yes_and_keeps_what_is_not_selected() {
    let f = Fixture::new(
        3,
        |_| {},
        dead_many(
            10,
            |k| if k < 4 { "permanent" } else { "exhausted" },
            |_| "t",
        ),
    )
    .await;
    let (b, pipe, file) = (&f.b, &f.pipe, &f.file);
    let run = dlq("purge", file, &pipe.name, &[]).await;
    run.assert_code(2);
    assert!(run.stderr.contains("10 of 10 messages"), "{}", run.stderr);
    let run = dlq("purge", file, &pipe.name, &["--filter-reason", "permanent"]).await;
    run.assert_code(2);
    assert!(run.stderr.contains("4 of 10 messages"), "{}", run.stderr);
    // Fresh messages are not older than an hour... but these say 2026-01-01.
    let run = dlq(
        "purge",
        file,
        &pipe.name,
        &["--yes", "--older-than", "100000d"],
    )
    .await;
    run.assert_code(0);
    b.wait_for_count(&pipe.dlq(), 10, Duration::from_secs(10))
        .await;
    let run = dlq(
        "purge",
        file,
        &pipe.name,
        &["--yes", "--filter-reason", "permanent"],
    )
    .await;
    run.assert_code(0);
    assert!(
        run.stdout.contains("4 message(s) removed, 6 kept"),
        "{}",
        run.stdout
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = ids(&drain(b, &pipe.dlq()).await);
    assert_eq!(left, (4..10).map(|k| format!("m-{k}")).collect::<Vec<_>>());
}

/// Acks before a close can be undone on quorum queues; the commands ack
/// with `multiple` and let acks settle, so a finished run leaves no
/// duplicate, whole or filtered.
#[tokio::test]
async fn no_duplicates_are_left_behind_on_a_quorum_dlq() {
    let (b, c, dir, pipe, file) = provisioned(3).await;
    let n = 3000;
    let msgs = |n: usize| {
        (0..n)
            .map(|k| {
                (
                    vec![1],
                    dead(
                        &format!("m-{k}"),
                        "exhausted",
                        "e",
                        if k % 2 == 0 { "even" } else { "odd" },
                    ),
                )
            })
            .collect::<Vec<_>>()
    };
    publish_many(&b, &pipe.dlq(), msgs(n)).await;
    let out = dir.path().join("all.jsonl");
    let run = dlq(
        "export",
        &file,
        &pipe.name,
        &["--remove", "--output", &out.display().to_string()],
    )
    .await;
    run.assert_code(0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        b.message_count(&pipe.dlq()).await,
        Some(0),
        "no message came back"
    );

    publish_many(&b, &pipe.dlq(), msgs(n)).await;
    let to = scratch_queue(&b, &c, "to").await;
    let run = dlq(
        "replay",
        &file,
        &pipe.name,
        &["--to", &to, "--filter-header", "tenant=even"],
    )
    .await;
    run.assert_code(0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        b.message_count(&pipe.dlq()).await,
        Some(1500),
        "exactly the odd ones stay"
    );
    assert_eq!(b.message_count(&to).await, Some(1500));
}

/// `--wait` waits for the holder of the lock instead of exiting 1.
#[tokio::test]
async fn wait_waits_for_the_lock() {
    let (b, _c, _dir, pipe, file) = provisioned(3).await;
    publish(
        &b,
        "",
        &pipe.dlq(),
        b"x",
        dead("m-0", "permanent", "e", "t"),
    )
    .await;
    let lock = crate::dlq::hold_lock(&b, &pipe.dlq()).await;
    let f = file.clone();
    let name = pipe.name.clone();
    let peek = tokio::spawn(async move { dlq("peek", &f, &name, &["--wait"]).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!peek.is_finished(), "it waits");
    lock.release().await;
    let run = peek.await.expect("the peek");
    run.assert_code(0);
    assert!(run.stdout.contains("1 message(s) shown"), "{}", run.stdout);
}

/// A copy the destination refuses (a full queue's nack) stops the replay
/// with exit 1; the DLQ keeps every message whose copy was not confirmed.
#[tokio::test]
async fn a_refused_replay_copy_stops_the_run_and_keeps_the_messages() {
    let f = Fixture::new(3, |_| {}, dead_many(10, |_| "exhausted", |_| "t")).await;
    let (b, c, pipe, file) = (&f.b, &f.c, &f.pipe, &f.file);
    let full = c.name("full");
    b.declare_queue(
        &full,
        table(&[("x-max-length", i(3)), ("x-overflow", s("reject-publish"))]),
    )
    .await;
    let run = dlq("replay", file, &pipe.name, &["--to", &full, "--json"]).await;
    run.assert_code(1);
    let r = json(&run);
    assert!(
        r["stopped"].as_str().unwrap_or("").contains("refused"),
        "{r:#}"
    );
    // What was confirmed moved (the queue takes 3); the rest stays. A
    // refused batch fails whole: its copies that the queue took before it
    // was full are duplicates, never losses. With the batches of four lanes
    // in flight at once, every batch may hold a refused copy (seen on
    // RabbitMQ 4.3: moved 0, the queue's 3 all duplicates).
    let moved = r["moved"].as_u64().unwrap();
    assert!(moved <= 3, "{r:#}");
    assert_eq!(
        r["moved"].as_u64().unwrap() + r["failed"].as_u64().unwrap(),
        r["read"].as_u64().unwrap(),
        "{r:#}"
    );
    b.wait_for_count(&pipe.dlq(), 10 - moved as u32, Duration::from_secs(10))
        .await;
    let mut all = ids(&drain(b, &pipe.dlq()).await);
    assert_eq!(all.len(), 10 - moved as usize, "{all:?}");
    all.extend(ids(&drain(b, &full).await));
    all.sort();
    all.dedup();
    let mut want: Vec<String> = (0..10).map(|k| format!("m-{k}")).collect();
    want.sort();
    assert_eq!(all, want);
}

/// A rotation copy refused by a full bounded DLQ stops the command with a
/// report, and nothing is lost. The classic DLQ holds 100 messages when a
/// policy bounds it to 50 with `reject-publish`, which drops nothing
/// already queued (a bounded queue counts ready messages only): every copy
/// the command rotates meets a full queue, without a producer racing it
/// for the places the command frees (that race was lost now and then).
#[tokio::test]
async fn a_refused_rotation_stops_the_command_and_loses_nothing() {
    let f = Fixture::new(
        3,
        |p| p.queue_type = "classic",
        dead_many(100, |_| "exhausted", |_| "t"),
    )
    .await;
    let (b, pipe, file) = (&f.b, &f.pipe, &f.file);
    let dlq_name = pipe.dlq();
    let rest = dlq_name
        .strip_prefix(&format!("{}-", f.c.prefix))
        .expect("the DLQ's name has the test's prefix")
        .replace('.', "\\.");
    // The overflow first: a bound applied while the overflow is still
    // drop-head drops the oldest 50 at once (seen on 3.10.8).
    let pattern = format!("{rest}$");
    let set = |definition| PolicyGuard::set(&f.c, Kind::Policy, "bound", &pattern, definition);
    let first = set(serde_json::json!({ "overflow": "reject-publish" })).await;
    first.wait_applied(b, std::slice::from_ref(&dlq_name)).await;
    let _bound = set(serde_json::json!({ "max-length": 50, "overflow": "reject-publish" })).await;
    let start = Instant::now();
    loop {
        let doc = b.mgmt.queue(&dlq_name).await.map(|i| i.raw);
        let bound = doc
            .as_ref()
            .map(|d| d["effective_policy_definition"]["max-length"].clone());
        if bound == Some(serde_json::json!(50)) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the bound never applied: {doc:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        b.message_count(&dlq_name).await,
        Some(100),
        "nothing dropped"
    );
    let run = dlq("summary", file, &pipe.name, &["--window", "10"]).await;
    run.assert_code(1);
    assert!(
        run.stderr.contains("refused a rotated copy"),
        "{}",
        run.output()
    );
    // A refused batch fails whole: the copies the queue took once the
    // command's reads had brought it under the bound are duplicates of
    // originals left in place, never losses.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut left = ids(&drain(b, &dlq_name).await);
    left.sort();
    left.dedup();
    let mut want: Vec<String> = (0..100).map(|k| format!("m-{k}")).collect();
    want.sort();
    assert_eq!(left, want, "every original is still there");
}

/// SIGINT stops a replay after the copies in flight: it reports what moved,
/// exits 1, and every message is in exactly one place.
#[tokio::test]
async fn sigint_stops_a_replay_after_the_copies_in_flight() {
    let f = Fixture::new(3, |_| {}, dead_many(200, |_| "exhausted", |_| "t")).await;
    let (b, c, pipe, file) = (&f.b, &f.c, &f.pipe, &f.file);
    let to = scratch_queue(b, c, "to").await;
    let child = spawn_replay(file, &pipe.name, &to, &["--rate", "50", "--json"]);
    // At 50 a second the whole run takes 4 s: stopped mid-run.
    wait_until_moved(b, &to, 5).await;
    let pid = child.id().expect("a pid") as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("it stops")
        .expect("output");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).expect("a report");
    assert_eq!(r["cancelled"], true, "{r:#}");
    // Nothing was left out by a selector or a limit: the message waiting
    // for its turn when the signal came is not "skipped".
    assert_eq!(r["skipped"], 0, "{r:#}");
    let moved = r["moved"].as_u64().unwrap();
    assert!(moved > 0 && moved < 200, "{r:#}");
    b.wait_for_count(&to, moved as u32, Duration::from_secs(10))
        .await;
    b.wait_for_count(&pipe.dlq(), 200 - moved as u32, Duration::from_secs(15))
        .await;
}

/// A message whose `dlqctl-dead-lettered-at` is older than the DLQ's
/// retention (an archive replayed `--to` the DLQ, say) is not expired by
/// a read-only command rotating it: every command that rotates (a
/// `--window` of 5 forces it) leaves all 30 in the DLQ.
#[tokio::test]
async fn commands_that_rotate_never_expire_a_message() {
    // `dead` says 2026-01-01: far more than the 1h retention ago.
    let f = Fixture::new(
        3,
        |p| p.dlq_ttl = Some("1h"),
        dead_many(30, |_| "exhausted", |_| "keep"),
    )
    .await;
    let (b, c, pipe, file) = (&f.b, &f.c, &f.pipe, &f.file);
    let to = scratch_queue(b, c, "to").await;
    let none = ["--filter-header", "tenant=none"];
    let runs: Vec<(&str, Vec<&str>)> = vec![
        ("summary", vec![]),
        ("peek", vec!["--limit", "30"]),
        ("export", vec![]),
        ("replay", [&none[..], &["--to", to.as_str()]].concat()),
        ("purge", vec!["--yes", "--filter-header", "tenant=none"]),
        ("purge", none.to_vec()),
    ];
    for (verb, extra) in runs {
        let mut args = vec!["--window", "5"];
        args.extend(extra);
        let run = dlq(verb, file, &pipe.name, &args).await;
        // A purge that only counts asks for --yes with exit 2.
        run.assert_code(if verb == "purge" && !args.contains(&"--yes") {
            2
        } else {
            0
        });
        // Read again from the head, without rotation: every message is
        // there (an expired copy would be dropped as it reaches the head).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let all = dlq("peek", file, &pipe.name, &["--limit", "100", "--json"]).await;
        all.assert_code(0);
        let shown = json(&all)["messages"].as_array().map_or(0, Vec::len);
        assert_eq!(shown, 30, "after {verb} {args:?}: {}", run.output());
    }
    assert_eq!(b.message_count(&to).await, Some(0));
}

/// A Target on a connection of its own, cancelled by `cancel`.
async fn target_for(
    pipe: &Pipe,
    cancel: tokio_util::sync::CancellationToken,
) -> dlqctl::ops::dlq::Target {
    let conn = lapin::Connection::connect(
        &crate::support::amqp_url(),
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("a connection");
    dlqctl::ops::dlq::Target {
        conn: std::sync::Arc::new(conn),
        dlq: pipe.dlq(),
        user: "guest".into(),
        read: dlqctl::ops::dlq::ReadOptions {
            cancel,
            ..Default::default()
        },
        tag: "dlqctl integration test".into(),
        guard: None,
    }
}

/// Cancelling (what SIGINT and SIGTERM do) stops every DLQ command at the
/// next message even with thousands of deliveries already buffered: here
/// the progress callback cancels at the 10th message. Copies in flight
/// are settled and what was not done stays in the DLQ.
#[tokio::test]
async fn a_cancel_stops_every_dlq_command_at_once() {
    use dlqctl::core::dlq::select::Selector;
    use tokio_util::sync::CancellationToken;
    let n = 2000u64;
    let f = Fixture::new(3, |_| {}, dead_many(n as usize, |_| "exhausted", |_| "t")).await;
    let (b, c, pipe) = (&f.b, &f.c, &f.pipe);
    let at_ten = |cancel: &CancellationToken| {
        let cancel = cancel.clone();
        move |p: &dlqctl::ops::dlq::Progress| {
            if p.read >= 10 {
                cancel.cancel();
            }
        }
    };

    let cancel = CancellationToken::new();
    let t = target_for(pipe, cancel.clone()).await;
    let r = dlqctl::ops::dlq::summary(&t, &Selector::default(), &mut at_ten(&cancel))
        .await
        .expect("summary");
    assert_eq!(r.read, 10, "summary: {r:?}");
    b.wait_for_count(&pipe.dlq(), n as u32, Duration::from_secs(10))
        .await;

    let cancel = CancellationToken::new();
    let t = target_for(pipe, cancel.clone()).await;
    let mut sink = dlqctl::ops::dlq::export::WriterSink::new(Vec::new(), |_| Ok(()));
    let r =
        dlqctl::ops::dlq::export::export(&t, &Default::default(), &mut sink, &mut at_ten(&cancel))
            .await
            .expect("export");
    assert_eq!(r.read, 10, "export: {r:?}");
    assert!(r.cancelled, "export: {r:?}");
    b.wait_for_count(&pipe.dlq(), n as u32, Duration::from_secs(10))
        .await;

    let to = scratch_queue(b, c, "to").await;
    let cancel = CancellationToken::new();
    let t = target_for(pipe, cancel.clone()).await;
    let opts = dlqctl::ops::dlq::replay::ReplayOptions::new(
        to.clone(),
        Selector::default(),
        "cancel-test",
    );
    let r = dlqctl::ops::dlq::replay::replay(&t, &opts, &mut at_ten(&cancel))
        .await
        .expect("replay");
    assert!(r.ended.is_cancelled(), "replay: {r:?}");
    assert!(r.read <= 10, "replay: {r:?}");
    assert_eq!(r.moved, r.read, "copies in flight settled: {r:?}");
    b.wait_for_count(&to, r.moved as u32, Duration::from_secs(10))
        .await;
    b.wait_for_count(&pipe.dlq(), (n - r.moved) as u32, Duration::from_secs(10))
        .await;
    let left = n - r.moved;

    let cancel = CancellationToken::new();
    let t = target_for(pipe, cancel.clone()).await;
    let r =
        dlqctl::ops::dlq::purge::purge(&t, &Selector::default(), None, true, &mut at_ten(&cancel))
            .await
            .expect("purge");
    assert!(r.cancelled, "purge: {r:?}");
    assert_eq!(r.removed, 10, "purge: {r:?}");
    b.wait_for_count(&pipe.dlq(), (left - 10) as u32, Duration::from_secs(10))
        .await;
}

/// Writes a file of export lines whose last one is cut (as a full disk or
/// a kill while writing leaves it); `--append` repairs it first, so the
/// archive stays readable; a whole last line without its newline is kept.
#[tokio::test]
async fn export_append_never_glues_onto_a_cut_last_line() {
    let f = Fixture::new(3, |_| {}, dead_many(2, |_| "exhausted", |_| "t")).await;
    let (pipe, file, dir) = (&f.pipe, &f.file, &f._dir);
    let first = dir.path().join("first.jsonl");
    let run = dlq(
        "export",
        file,
        &pipe.name,
        &["--output", &first.display().to_string()],
    )
    .await;
    run.assert_code(0);
    let text = std::fs::read_to_string(&first).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);

    for (name, content, want) in [
        ("cut.jsonl", format!("{}\n{}", lines[0], &lines[1][..60]), 3),
        ("whole.jsonl", format!("{}\n{}", lines[0], lines[1]), 4),
    ] {
        let path = dir.write(name, &content);
        let run = dlq(
            "export",
            file,
            &pipe.name,
            &["--append", "--output", &path.display().to_string()],
        )
        .await;
        run.assert_code(0);
        let got = std::fs::read_to_string(&path).unwrap();
        assert!(got.ends_with('\n'), "{name}");
        assert_eq!(got.lines().count(), want, "{name}: {got}");
        for (k, line) in got.lines().enumerate() {
            assert!(
                dlqctl::core::dlq::export::from_line(line).is_ok(),
                "{name}:{}: {line}",
                k + 1
            );
        }
        let run = dlq(
            "replay",
            file,
            &pipe.name,
            &[
                "--from-file",
                &path.display().to_string(),
                "--dry-run",
                "--json",
            ],
        )
        .await;
        run.assert_code(0);
        assert_eq!(json(&run)["moved"], want, "{name}");
    }
}

/// A closed standard output (`export | head -1`) is exit 1 with a report
/// on standard error; the DLQ keeps every message.
#[tokio::test]
async fn export_to_a_closed_pipe_exits_1_and_says_so() {
    use tokio::io::AsyncBufReadExt;
    let n = 1000;
    let f = Fixture::new(3, |_| {}, dead_many(n, |_| "exhausted", |_| "t")).await;
    let (b, pipe, file) = (&f.b, &f.pipe, &f.file);
    let mut child = Dlqctl::new("dlq")
        .arg("export")
        .arg(file)
        .args(["--queue", &pipe.name])
        .spawn();
    let stdout = child.stdout.take().expect("stdout");
    let mut first = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut first)
        .await
        .expect("one line");
    // The reader is gone, like `| head -1`.
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("it ends")
        .expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(first.starts_with('{'), "{first}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("written of"), "{stderr}");
    assert!(stderr.to_lowercase().contains("broken pipe"), "{stderr}");
    b.wait_for_count(&pipe.dlq(), n as u32, Duration::from_secs(10))
        .await;
}

/// A message whose copy cannot fit the broker's frame_max (a 130,700-byte
/// header) is not replayed: exit 1, with the reason; from a file, the
/// report does not speak of a DLQ.
#[tokio::test]
async fn a_replay_that_cannot_copy_a_message_exits_1_and_says_why() {
    let big = dead("big", "exhausted", "e", "t");
    let mut h = big.headers().clone().unwrap();
    h.insert("huge".into(), s(&"x".repeat(130_700)));
    let f = Fixture::new(3, |_| {}, vec![(b"b".to_vec(), big.with_headers(h))]).await;
    let (b, c, pipe, file, dir) = (&f.b, &f.c, &f.pipe, &f.file, &f._dir);
    let to = scratch_queue(b, c, "to").await;
    let run = dlq("replay", file, &pipe.name, &["--to", &to]).await;
    run.assert_code(1);
    assert!(
        run.stdout.contains("1 failed (left in the DLQ)"),
        "{}",
        run.output()
    );
    assert!(run.stdout.contains("frame_max"), "{}", run.output());
    b.wait_for_count(&pipe.dlq(), 1, Duration::from_secs(10))
        .await;

    let out = dir.path().join("big.jsonl");
    dlq(
        "export",
        file,
        &pipe.name,
        &["--output", &out.display().to_string()],
    )
    .await
    .assert_code(0);
    let run = dlq(
        "replay",
        file,
        &pipe.name,
        &[
            "--from-file",
            &out.display().to_string(),
            "--to",
            &to,
            "--json",
        ],
    )
    .await;
    run.assert_code(1);
    let r = json(&run);
    assert_eq!(r["failed"], 1, "{r:#}");
    assert!(
        r["why_failed"].as_str().unwrap_or("").contains("frame_max"),
        "{r:#}"
    );
    let run = dlq(
        "replay",
        file,
        &pipe.name,
        &["--from-file", &out.display().to_string(), "--to", &to],
    )
    .await;
    run.assert_code(1);
    assert!(run.stdout.contains("frame_max"), "{}", run.output());
    assert!(!run.stdout.contains("left in the DLQ"), "{}", run.output());
    assert_eq!(b.message_count(&to).await, Some(0));
}

/// A file with no newline (`/dev/zero`) is refused at the longest export
/// line (exit 2, naming the line) instead of filling memory.
#[tokio::test]
async fn replay_from_an_endless_line_is_refused_at_the_bound() {
    let f = Fixture::new(3, |_| {}, vec![]).await;
    let run = dlq(
        "replay",
        &f.file,
        &f.pipe.name,
        &["--from-file", "/dev/zero", "--dry-run"],
    )
    .await;
    run.assert_code(2);
    assert!(
        run.stderr
            .contains("/dev/zero:1: the line is longer than 201326592 bytes"),
        "{}",
        run.output()
    );
}

/// A small tmpfs of its own, unmounted when dropped: a disk that fills up.
struct FullDisk(std::path::PathBuf);

impl FullDisk {
    fn mount(at: std::path::PathBuf, size: &str) -> FullDisk {
        std::fs::create_dir_all(&at).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs to fill a disk, which needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        FullDisk(at)
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// `export --remove` onto a disk that fills up: exit 1, and the archive
/// ends with a whole line (the lines past the last sync are truncated
/// away, their messages still in the DLQ), so it stays readable and an
/// `--append` needs no repair; every message is in the file or the DLQ,
/// never both.
#[tokio::test]
async fn an_export_that_fills_the_disk_leaves_no_cut_line() {
    let n = 4_000;
    let f = Fixture::new(3, |_| {}, dead_many(n, |_| "exhausted", |_| "t")).await;
    let (b, pipe, file, dir) = (&f.b, &f.pipe, &f.file, &f._dir);
    let disk = FullDisk::mount(dir.path().join("disk"), "1m");
    let archive = disk.0.join("archive.jsonl");
    let run = dlq(
        "export",
        file,
        &pipe.name,
        &["--remove", "--output", &archive.display().to_string()],
    )
    .await;
    run.assert_code(1);
    let text = std::fs::read(&archive).unwrap();
    assert!(
        text.is_empty() || text.ends_with(b"\n"),
        "the archive ends with a cut line: ...{:?}",
        String::from_utf8_lossy(&text[text.len().saturating_sub(80)..])
    );
    let text = String::from_utf8(text).unwrap();
    let lines = text.lines().count();
    for (k, line) in text.lines().enumerate() {
        assert!(
            dlqctl::core::dlq::export::from_line(line).is_ok(),
            "line {}: {line}",
            k + 1
        );
    }
    assert!(
        lines > 0 && lines < n,
        "{lines} lines: the disk was to fill mid-way"
    );
    b.wait_for_count(&pipe.dlq(), (n - lines) as u32, Duration::from_secs(10))
        .await;
    drop(disk);
}
