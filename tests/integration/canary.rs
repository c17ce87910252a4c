//! Canaries on a pipeline with idempotent handling (docs/dlq.md,
//! "Canaries on a pipeline with idempotent handling"): a canary proves
//! the dependency only through a handler run. A message whose key is
//! already marked handled is acked as a duplicate without running the
//! handler, so it is never the canary; a run with no message able to be
//! one stops with a result of its own (exit 3); a replay counts the
//! messages it moved that were already handled.

use crate::idempotency::{fixture, sqlite_block};
use crate::support::dlq::{dead, dlq, publish_many};
use crate::support::worker::{PipeFixture, WorkerProc};
use dlqctl::idempotency::{open, Begin, Create, StoreUrl};
use serde_json::Value;
use std::time::Duration;

/// The body of every message here.
const BODY: &[u8] = b"x";

/// A pipeline (tiers 1 s and 2 s, 5 attempts) with `idempotency` on an
/// SQLite file of its scratch directory, and `redrive` when given.
async fn guarded(redrive: Option<&str>) -> PipeFixture {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    f.pipe.redrive = redrive.map(str::to_string);
    f
}

/// Marks `ids` handled (body [`BODY`]) in `f`'s store, as a worker that
/// ran them would have.
async fn mark_handled(f: &PipeFixture, ids: &[&str]) {
    let url = StoreUrl::Sqlite(f.scratch.path().join("keys.db"));
    let scope = dlqctl::core::idempotency::scope("/", &f.pipe.name);
    let store = open(&url, &scope, Create::Yes).await.expect("the store");
    let sha = dlqctl::core::idempotency::body_sha256(BODY);
    for id in ids {
        match store
            .begin(id.as_bytes(), &sha, &rand::random(), 60_000)
            .await
            .unwrap()
        {
            Begin::Acquired { lease, .. } => store.mark(&lease, &sha, 3_600_000).await.unwrap(),
            other => panic!("{id}: {other:?}"),
        }
    }
}

/// Puts `ids` in `f`'s DLQ, in that order, as the worker dead-letters.
async fn dead_letter(f: &PipeFixture, ids: &[&str]) {
    let msgs = ids
        .iter()
        .map(|id| (BODY.to_vec(), dead(id, "exhausted", "e", "t")))
        .collect();
    publish_many(&f.broker, &f.pipe.dlq(), msgs).await;
}

fn json(run: &crate::support::Run) -> Value {
    serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", run.output()))
}

/// The dependency is down (every run fails permanently) and the first
/// message of the DLQ was handled before: it would be acked as a
/// duplicate, "passing" the canary. The canary is the next message
/// instead; it fails, and the rest stays.
#[tokio::test]
async fn a_replay_canary_is_never_a_message_already_handled() {
    let f = guarded(None).await;
    let (file, _script, mut w) = f.consuming_worker("exit 65", &[]).await;
    mark_handled(&f, &["h-0"]).await;
    dead_letter(&f, &["h-0", "f-1", "f-2"]).await;
    let run = dlq(
        "replay",
        &file,
        &f.pipe.name,
        &["--canary", "1", "--canary-wait", "3s", "--json"],
    )
    .await;
    run.assert_code(3);
    let r = json(&run);
    assert_eq!(r["moved"], 1, "{r:#}");
    assert_eq!(r["canary"]["sent"], 1, "{r:#}");
    assert_eq!(r["canary"]["handled"], 0, "{r:#}");
    assert_eq!(r["canary"]["passed"], false, "{r:#}");
    assert_eq!(
        r["already_handled"], 0,
        "the canary was not a handled one: {r:#}"
    );
    let stopped = r["stopped"].as_str().unwrap_or_default();
    assert!(stopped.contains("the canary failed"), "{r:#}");
    // The canary failed back; the handled message and the other stayed.
    f.broker
        .wait_for_count(&f.pipe.dlq(), 3, Duration::from_secs(20))
        .await;
    w.stop().await;
    assert!(
        crate::idempotency::decided(&[&w], "duplicate").is_empty(),
        "a duplicate was moved: {}",
        w.output()
    );
}

/// Every key in the DLQ is handled: no message can be a canary. The run
/// says so, exits 3 and moves nothing (it used to send a duplicate as
/// the canary, see it "pass", and move the rest).
#[tokio::test]
async fn a_replay_with_no_message_able_to_be_a_canary_says_so_and_moves_nothing() {
    let f = guarded(None).await;
    let file = f.pipe.provision(&f.scratch).await;
    mark_handled(&f, &["h-0", "h-1"]).await;
    dead_letter(&f, &["h-0", "h-1"]).await;
    let run = dlq(
        "replay",
        &file,
        &f.pipe.name,
        &["--canary", "1", "--canary-wait", "1s", "--json"],
    )
    .await;
    run.assert_code(3);
    let r = json(&run);
    assert_eq!(r["moved"], 0, "{r:#}");
    assert_eq!(r["canary"]["sent"], 0, "{r:#}");
    assert_eq!(r["canary"]["passed"], false, "{r:#}");
    let stopped = r["stopped"].as_str().unwrap_or_default();
    assert!(stopped.contains("no message could be the canary"), "{r:#}");
    assert_eq!(f.broker.message_count(&f.pipe.dlq()).await, Some(2));
    assert_eq!(f.broker.message_count(&f.pipe.name).await, Some(0));
    // In words too.
    let text = dlq("replay", &file, &f.pipe.name, &["--canary", "1"]).await;
    text.assert_code(3);
    assert!(
        text.stdout.contains("no message could be the canary"),
        "{}",
        text.output()
    );
}

/// A real replay (not only a dry run) says how many of the messages it
/// moved were already handled, in JSON and in words; with `--rerun` it
/// does not suggest adding `--rerun`, dry run or not.
#[tokio::test]
async fn a_replay_counts_the_moved_messages_already_handled() {
    let f = guarded(None).await;
    let file = f.pipe.provision(&f.scratch).await;
    mark_handled(&f, &["h-0", "h-1"]).await;
    dead_letter(&f, &["h-0", "f-1", "h-1"]).await;
    for extra in [&["--dry-run"][..], &["--dry-run", "--rerun"][..]] {
        let run = dlq("replay", &file, &f.pipe.name, extra).await;
        run.assert_code(0);
        let rerun = extra.contains(&"--rerun");
        assert!(
            run.stdout.contains("of them, 2 are marked handled"),
            "{extra:?}: {}",
            run.output()
        );
        assert_eq!(
            run.stdout.contains("add --rerun"),
            !rerun,
            "{extra:?}: {}",
            run.output()
        );
    }
    let run = dlq("replay", &file, &f.pipe.name, &["--json"]).await;
    run.assert_code(0);
    let r = json(&run);
    assert_eq!(r["moved"], 3, "{r:#}");
    assert_eq!(r["already_handled"], 2, "{r:#}");
    // Back, and moved again in words, with --rerun.
    let drained = crate::support::worker::drain(&f.broker, &f.pipe.name).await;
    assert_eq!(drained.len(), 3);
    dead_letter(&f, &["h-0", "f-1", "h-1"]).await;
    let run = dlq("replay", &file, &f.pipe.name, &["--rerun"]).await;
    run.assert_code(0);
    assert!(
        run.stdout
            .contains("of them, 2 were already marked handled in the idempotency store: --rerun runs them again"),
        "{}",
        run.output()
    );
    assert!(!run.stdout.contains("add --rerun"), "{}", run.output());
}

/// Automatic redrive: every eligible message is handled already, so no
/// canary can prove the dependency. `dlq redrive` says so (`no_canary`,
/// exit 3) and moves nothing; a worker's run records the same result.
#[tokio::test]
async fn a_redrive_with_no_message_able_to_be_a_canary_says_so() {
    let f = guarded(Some("{min_age: 1s, every: 1h, canary: 1}")).await;
    let file = f.pipe.provision(&f.scratch).await;
    mark_handled(&f, &["h-0", "h-1"]).await;
    dead_letter(&f, &["h-0", "h-1"]).await;
    let run = dlq("redrive", &file, &f.pipe.name, &["--json"]).await;
    run.assert_code(3);
    let r = json(&run);
    assert_eq!(r["result"], "no_canary", "{r:#}");
    assert_eq!(r["moved"], 0, "{r:#}");
    let why = r["why"].as_str().unwrap_or_default();
    assert!(why.contains("no message could be the canary"), "{r:#}");
    assert_eq!(f.broker.message_count(&f.pipe.dlq()).await, Some(2));
    let text = dlq("redrive", &file, &f.pipe.name, &[]).await;
    text.assert_code(3);
    assert!(
        text.stdout
            .contains("no eligible message could be the canary"),
        "{}",
        text.output()
    );
    // A worker's own run (its store, its timer) comes to the same.
    let f2 = guarded(Some("{min_age: 1s, every: 1s, canary: 1}")).await;
    let file2 = f2.pipe.provision(&f2.scratch).await;
    mark_handled(&f2, &["h-0"]).await;
    dead_letter(&f2, &["h-0"]).await;
    let script = crate::support::script::Script::new(&f2.scratch, "h", "true");
    let mut w = WorkerProc::with_script(&file2, &f2.pipe.name, &script, &[]);
    w.wait_consuming().await;
    let start = std::time::Instant::now();
    while !w
        .events("redrive run")
        .iter()
        .any(|e| e["result"] == "no_canary")
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no no_canary run: {}",
            w.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w.stop().await;
    assert_eq!(f2.broker.message_count(&f2.pipe.dlq()).await, Some(1));
}
