//! Idempotent handling when things go wrong: the store goes away mid-stream
//! (Redis stopped, then started again empty; SQLite's file locked by
//! another writer), workers and replays killed with SIGKILL.

use crate::idempotency::{decided, fixture, publish_twice, runs, sqlite_block, wait_settled};
use crate::support::dlq::{dead, dlq, publish_many};
use crate::support::redis::RedisServer;
use crate::support::worker::{publish, with_id, PipeFixture, WorkerProc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Publishes ids `PREFIXa..PREFIXb` once each, one every `gap`.
async fn publish_paced(f: &PipeFixture, prefix: &str, ids: std::ops::Range<usize>, gap: Duration) {
    for k in ids {
        publish(
            &f.broker,
            "",
            &f.pipe.name,
            b"x",
            with_id(&format!("{prefix}{k}")),
        )
        .await;
        tokio::time::sleep(gap).await;
    }
}

/// Waits until every id `PREFIX0..PREFIXn` ran at least once.
async fn wait_all_ran(
    script: &crate::support::script::Script,
    prefix: &str,
    n: usize,
    w: &WorkerProc,
) {
    let start = Instant::now();
    loop {
        let r = runs(script);
        if (0..n).all(|k| r.contains_key(&format!("{prefix}{k}"))) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "not every id ran: {r:?}\n{}",
            w.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts what an outage must leave: no dead-letter, an empty DLQ, every
/// queue drained. (The worker never exited: it handled the ids published
/// during the outage.)
async fn assert_nothing_lost(f: &PipeFixture, w: &WorkerProc) {
    for q in f.all_queues() {
        f.broker
            .wait_for_count(&q, 0, Duration::from_secs(30))
            .await;
    }
    assert!(decided(&[w], "dead_letter").is_empty(), "{}", w.output());
    assert!(
        decided(&[w], "dead_letter_nack").is_empty(),
        "{}",
        w.output()
    );
}

/// Redis stops mid-stream for 4 s, then comes back empty: no handler
/// starts while it is away, consumption pauses and resumes, nothing is
/// lost or dead-lettered, and the worker never exits.
#[tokio::test]
async fn redis_stopped_then_back_empty_pauses_the_worker_and_loses_nothing() {
    let mut redis = RedisServer::start();
    let f = fixture(Some(&format!("{{store: '{}'}}", redis.url()))).await;
    let (_file, script, mut w) = f
        .consuming_worker("sleep 0.1", &["--concurrency", "2"])
        .await;
    publish_paced(&f, "o-", 0..10, Duration::from_millis(50)).await;
    wait_all_ran(&script, "o-", 10, &w).await;
    redis.stop();
    let away_from = now_ns();
    publish_paced(&f, "o-", 10..20, Duration::from_millis(20)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let away_until = now_ns();
    redis.restart();
    wait_all_ran(&script, "o-", 20, &w).await;
    // A handler that had its lease before the stop may still start a
    // few ms after it; none starts later, while the store is away.
    let margin = Duration::from_millis(300).as_nanos();
    let during: Vec<_> = script
        .calls()
        .into_iter()
        .filter(|c| c.t_ns > away_from + margin && c.t_ns < away_until)
        .collect();
    assert!(
        during.is_empty(),
        "handlers started while the store was away: {during:?}"
    );
    assert!(
        !w.events("the idempotency store does not answer: consumption paused, deliveries not started are handed back; no handler runs unguarded").is_empty(),
        "{}",
        w.output()
    );
    w.wait_event(
        "the idempotency store answers again: consuming",
        1,
        Duration::from_secs(20),
    )
    .await;
    assert_nothing_lost(&f, &w).await;
    w.stop().await;
}

/// Another writer holds SQLite's write lock for 6 s mid-stream: the
/// worker pauses, hands its deliveries back, and resumes once the lock is
/// gone; nothing is lost, nothing dead-lettered, nothing run twice.
#[tokio::test]
async fn a_locked_sqlite_file_pauses_the_worker_and_loses_nothing() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let db = f.scratch.path().join("keys.db");
    let (_file, script, mut w) = f
        .consuming_worker("sleep 0.1", &["--concurrency", "2"])
        .await;
    publish_paced(&f, "l-", 0..5, Duration::from_millis(50)).await;
    // Marked and acked: the lock then meets the next messages' leases.
    wait_settled(&[&w], 5, 0, Duration::from_secs(20)).await;
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let c = rusqlite::Connection::open(&db).expect("open the store's file");
        c.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        locked_tx.send(()).expect("tell the test");
        std::thread::sleep(Duration::from_secs(6));
        c.execute_batch("ROLLBACK").expect("let go");
    });
    locked_rx.recv().expect("the lock is held");
    publish_paced(&f, "l-", 5..15, Duration::from_millis(20)).await;
    holder.join().expect("the lock holder");
    wait_all_ran(&script, "l-", 15, &w).await;
    assert!(
        !w.events("the idempotency store does not answer: consumption paused, deliveries not started are handed back; no handler runs unguarded").is_empty(),
        "{}",
        w.output()
    );
    assert_nothing_lost(&f, &w).await;
    let r = runs(&script);
    assert!(r.values().all(|&n| n == 1), "{r:?}");
    w.stop().await;
}

/// A worker killed with SIGKILL at random points, 5 times, with every id
/// published twice: every id is handled, and the ids run twice are at
/// most kills × --concurrency (the window between a success and its mark,
/// and handlers cut short).
#[tokio::test]
async fn a_worker_killed_at_random_runs_each_id_at_most_once_more_per_kill() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    // A short handler timeout: a killed run's lease lasts 10 s.
    let args = ["--concurrency", "2", "--handler-timeout", "2s"];
    let (file, script, mut w) = f.consuming_worker("sleep 0.05", &args).await;
    let n = 60;
    publish_twice(&f, "k-", n).await;
    let kills = 5;
    for _ in 0..kills {
        let pause = 150 + rand::random::<u64>() % 500;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        w.signal(libc::SIGKILL);
        let _ = w.wait_exit(Duration::from_secs(10)).await;
        w = WorkerProc::with_script(&file, &f.pipe.name, &script, &args);
        w.wait_consuming().await;
    }
    let start = Instant::now();
    loop {
        let r = runs(&script);
        let queues_empty = {
            let mut all = true;
            for q in f.all_queues() {
                all &= f.broker.message_count(&q).await == Some(0);
            }
            all
        };
        if r.len() == n && queues_empty {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{r:?}\n{}",
            w.output()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let r = runs(&script);
    let twice: usize = r.values().map(|&k| k.saturating_sub(1)).sum();
    eprintln!(
        "idempotency under kill -9: {kills} kills, {n} ids published twice, {twice} extra run(s)"
    );
    assert!(twice <= kills * 2, "{twice} extra runs: {r:?}");
    assert_eq!(f.broker.message_count(&f.pipe.dlq()).await, Some(0));
    w.stop().await;
}

/// A `dlq replay` killed with SIGKILL leaves copies both in the main queue
/// and in the DLQ; once what it left is replayed too, no id has run twice.
/// `--rerun` then runs a handled id again, once.
#[tokio::test]
async fn a_killed_replay_then_a_second_replay_runs_no_id_twice_and_rerun_runs_once_more() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let (file, script, mut w) = f.consuming_worker("true", &["--concurrency", "4"]).await;
    let n = 300;
    let msgs = (0..n)
        .map(|k| {
            (
                b"x".to_vec(),
                dead(&format!("p-{k}"), "exhausted", "e", "t"),
            )
        })
        .collect();
    publish_many(&f.broker, &f.pipe.dlq(), msgs).await;
    let mut replay = crate::support::Dlqctl::on_queue(&["dlq", "replay"], &file, &f.pipe.name)
        .args(["--rate", "200"])
        .spawn();
    // Killed mid-run: some copies confirmed whose originals are not acked.
    let start = Instant::now();
    while runs(&script).len() < 50 {
        assert!(start.elapsed() < Duration::from_secs(30), "{}", w.output());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = replay.start_kill();
    let _ = replay.wait().await;
    // The rest, the duplicates of what was moved included.
    let second = dlq("replay", &file, &f.pipe.name, &[]).await;
    second.assert_code(0);
    let start = Instant::now();
    loop {
        let settled = decided(&[&w], "ack").len() + decided(&[&w], "duplicate").len();
        let main_empty = f.broker.message_count(&f.pipe.name).await == Some(0);
        if runs(&script).len() == n && main_empty && settled >= n {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{}", w.output());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = runs(&script);
    assert!(r.values().all(|&k| k == 1), "an id ran twice: {r:?}");
    // A handled id back in the DLQ, with one never handled: the dry run
    // counts the handled one, with --rerun too (the one it runs again).
    let back = vec![
        (b"x".to_vec(), dead("p-7", "exhausted", "e", "t")),
        (b"x".to_vec(), dead("new-1", "exhausted", "e", "t")),
    ];
    publish_many(&f.broker, &f.pipe.dlq(), back).await;
    for (extra, want) in [(&[][..], 1), (&["--rerun"][..], 1)] {
        let mut args = vec!["--dry-run", "--json"];
        args.extend(extra);
        let run = dlq("replay", &file, &f.pipe.name, &args).await;
        run.assert_code(0);
        let r: serde_json::Value = serde_json::from_str(&run.stdout).expect("a JSON report");
        assert_eq!(r["moved"], 2, "{r:#}");
        assert_eq!(r["already_handled"], want, "{extra:?}: {r:#}");
    }
    let drained = crate::support::worker::drain(&f.broker, &f.pipe.dlq()).await;
    assert_eq!(drained.len(), 2);
    // A handled id back in the DLQ: a plain replay acks it as a duplicate,
    // --rerun runs it again, once.
    for extra in [&[][..], &["--rerun"][..]] {
        publish_many(
            &f.broker,
            &f.pipe.dlq(),
            vec![(b"x".to_vec(), dead("p-7", "exhausted", "e", "t"))],
        )
        .await;
        dlq("replay", &file, &f.pipe.name, extra)
            .await
            .assert_code(0);
        f.broker
            .wait_for_count(&f.pipe.dlq(), 0, Duration::from_secs(10))
            .await;
        f.broker
            .wait_for_count(&f.pipe.name, 0, Duration::from_secs(10))
            .await;
    }
    let start = Instant::now();
    while runs(&script)["p-7"] < 2 {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", w.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        runs(&script)["p-7"],
        2,
        "--rerun ran it once more, the plain replay not"
    );
    w.stop().await;
}

/// A store pause drains the deliveries the worker holds unstarted; one
/// without a key runs unguarded, under a permit of `--concurrency` like
/// every delivery (before, each drained delivery was spawned without
/// one: here three more handlers ran beside the one that held the only
/// permit).
#[tokio::test]
async fn deliveries_drained_by_a_store_pause_run_within_the_concurrency() {
    let mut redis = RedisServer::start();
    let f = fixture(Some(&format!("{{store: '{}'}}", redis.url()))).await;
    // Each run notes how many runs are under way with it, then waits for
    // the gate, which the test opens once the pause has drained.
    let behaviour = r#"mkdir -p "$d/running"
touch "$d/running/$$"
ls "$d/running" | wc -l >> "$d/at-once"
while [ ! -e "$d/gate" ]; do sleep 0.05; done
rm -f "$d/running/$$""#;
    let (_file, script, mut w) = f
        .consuming_worker(behaviour, &["--concurrency", "1", "--prefetch", "4"])
        .await;
    // No message id: no key, so no store call; the idle ping finds the
    // store gone.
    for _ in 0..4 {
        publish(
            &f.broker,
            "",
            &f.pipe.name,
            b"x",
            lapin::BasicProperties::default(),
        )
        .await;
    }
    script.wait_calls(1, Duration::from_secs(30)).await;
    redis.stop();
    w.wait_event(
        "the idempotency store does not answer: consumption paused, deliveries not started are handed back; no handler runs unguarded",
        1,
        Duration::from_secs(30),
    )
    .await;
    // What the drain started would start now: give it the time to.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = script.calls().len();
    std::fs::write(script.dir.join("gate"), b"").unwrap();
    redis.restart();
    script.wait_calls(4, Duration::from_secs(60)).await;
    let at_once = std::fs::read_to_string(script.dir.join("at-once")).unwrap();
    let most = at_once
        .lines()
        .filter_map(|l| l.trim().parse::<usize>().ok())
        .max();
    assert_eq!(
        (started, most),
        (1, Some(1)),
        "runs at once: {at_once:?}\n{}",
        w.output()
    );
    w.stop().await;
}
