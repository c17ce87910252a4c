//! Automatic redrive (`dead_letter.redrive`, `dlqctl dlq redrive`) against
//! a real broker, with an HTTP dependency the test turns off and on
//! (docs/dlq.md, "Automatic redrive"). The policies use short `min_age`
//! and `every`; a canary waits the pipeline's summed retry delays + 30 s,
//! so only the tests about the canary wait that long.

use crate::support::dependency::Dependency;
use crate::support::dlq::{dead, dlq, publish_many};
use crate::support::worker::{drain, header_int, i, publish, with_id, PipeFixture, WorkerProc};
use crate::support::Run;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The canary's wait for the pipelines here (one 100 ms tier, two
/// attempts): 100 ms + 30 s.
const CANARY_WAIT: Duration = Duration::from_millis(30_100);

/// `dlqctl dlq redrive FILE --queue QUEUE --json`.
async fn redrive_now(file: &Path, queue: &str) -> Run {
    dlq("redrive", file, queue, &["--json"]).await
}

/// A provisioned pipeline (one 100 ms tier, two attempts) with the
/// redrive policy `policy` (YAML flow text), whose DLQ holds `msgs`;
/// returns it and its topology file.
async fn redriving(policy: &str, msgs: Vec<(Vec<u8>, BasicProperties)>) -> (PipeFixture, PathBuf) {
    let f = PipeFixture::new(&[100], 2, |p| p.redrive = Some(policy.into())).await;
    let file = f.pipe.provision(&f.scratch).await;
    publish_many(&f.broker, &f.pipe.dlq(), msgs).await;
    (f, file)
}

/// A dependency that answers 200, and a pipeline whose policy redrives
/// at `rate` with no canary, its DLQ holding `n` exhausted messages
/// `PREFIX-k`.
async fn redriving_at(rate: &str, prefix: &str, n: usize) -> (Dependency, PipeFixture, PathBuf) {
    let dep = Dependency::start(true).await;
    let policy = format!("{{min_age: 1s, every: 1s, canary: 0, rate: {rate}}}");
    let (f, file) = redriving(&policy, exhausted(prefix, n)).await;
    (dep, f, file)
}

/// Waits up to 10 s until `f`'s DLQ holds `n` messages.
async fn wait_dlq(f: &PipeFixture, n: u32) {
    let deadline = Duration::from_secs(10);
    f.broker.wait_for_count(&f.pipe.dlq(), n, deadline).await;
}

/// Waits up to 10 s each until `f`'s DLQ, then its main queue, are empty.
async fn wait_drained(f: &PipeFixture) {
    wait_dlq(f, 0).await;
    let deadline = Duration::from_secs(10);
    f.broker.wait_for_count(&f.pipe.name, 0, deadline).await;
}

fn json(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", run.output()))
}

/// A DLQ message as the worker writes one (dead-lettered on 2026-01-01,
/// old enough for any `min_age` here), redriven `redriven` times.
fn dead_redriven(id: &str, reason: &str, redriven: Option<i64>) -> (Vec<u8>, BasicProperties) {
    let p = dead(id, reason, "POST http://dep/hook: 503", "t");
    let p = match redriven {
        Some(n) => {
            let mut h: FieldTable = p.headers().clone().unwrap_or_default();
            h.insert("dlqctl-redriven".into(), i(n));
            p.with_headers(h)
        }
        None => p,
    };
    (format!("body of {id}").into_bytes(), p)
}

/// The message ids of deliveries.
fn ids(ds: &[lapin::message::Delivery]) -> BTreeSet<String> {
    crate::support::dlq::ids(ds).into_iter().collect()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// Waits until the worker logs a `redrive run` with `result`; returns it.
async fn wait_run(w: &mut WorkerProc, result: &str, deadline: Duration) -> Value {
    let start = Instant::now();
    loop {
        if let Some(r) = w
            .events("redrive run")
            .into_iter()
            .find(|e| e["result"] == result)
        {
            return r;
        }
        if start.elapsed() > deadline {
            panic!(
                "no redrive run with result {result} within {deadline:?}:\n{}",
                w.output()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` exhausted messages `PREFIX-k`, dead-lettered long ago.
fn exhausted(prefix: &str, n: usize) -> Vec<(Vec<u8>, BasicProperties)> {
    (0..n)
        .map(|k| dead_redriven(&format!("{prefix}-{k}"), "exhausted", None))
        .collect()
}

/// The dependency goes down and 50 messages exhaust their retries into
/// the DLQ; it comes back, and within min_age + every + the canary's wait
/// all 50 are handled, each once, with no command run by hand.
#[tokio::test]
async fn after_an_outage_the_exhausted_messages_go_back_by_themselves() {
    let dep = Dependency::start(false).await;
    let (f, file) = redriving("{min_age: 5s, every: 1s, canary: 5, rate: 100/s}", vec![]).await;
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &["--http", &dep.hook(), "--concurrency", "10"],
    );
    w.wait_consuming().await;
    let ids: Vec<String> = (0..50).map(|k| format!("out-{k}")).collect();
    for id in &ids {
        publish(&f.broker, "", &f.pipe.name, b"{}", with_id(id)).await;
    }
    f.broker
        .wait_for_count(&f.pipe.dlq(), 50, Duration::from_secs(30))
        .await;
    assert!(dep.successes().is_empty());
    dep.set_up(true);
    let back = Instant::now();
    let within = Duration::from_secs(5 + 1) + CANARY_WAIT + Duration::from_secs(10);
    dep.wait_successes(50, within, || w.output()).await;
    let took = back.elapsed();
    wait_drained(&f).await;
    w.stop().await;
    let handled = dep.successes();
    assert_eq!(
        handled.keys().cloned().collect::<Vec<_>>().len(),
        50,
        "{handled:?}"
    );
    assert!(
        handled.values().all(|n| *n == 1),
        "each handled once: {handled:?}"
    );
    let runs = w.events("redrive run");
    let moved: u64 = runs.iter().map(|r| r["moved"].as_u64().unwrap_or(0)).sum();
    assert_eq!(moved, 50, "{runs:#?}");
    assert!(
        runs.iter()
            .all(|r| r["result"] != "canary_failed" && r["result"] != "failed"),
        "{runs:#?}"
    );
    // The looks before min_age found nothing to move, and said so.
    assert!(
        runs.iter().any(|r| r["result"] == "nothing_eligible"),
        "{runs:#?}"
    );
    let passed = runs.iter().find(|r| r["result"] == "moved").unwrap();
    assert_eq!(passed["canary_sent"], 5, "{passed}");
    assert_eq!(passed["canary_came_back"], 0, "{passed}");
    eprintln!("all 50 handled {took:?} after the dependency came back");
}

/// While the dependency stays down, the canary fails: no more than the
/// canary is moved, they come back, and the next look waits twice as long.
#[tokio::test]
async fn while_the_dependency_stays_down_only_the_canary_moves_and_the_wait_doubles() {
    let dep = Dependency::start(false).await;
    let (f, file) = redriving(
        "{min_age: 1s, every: 1s, canary: 3, rate: 100/s}",
        exhausted("down", 20),
    )
    .await;
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &["--http", &dep.hook(), "--concurrency", "5"],
    );
    let run = wait_run(
        &mut w,
        "canary_failed",
        Duration::from_secs(5) + CANARY_WAIT + Duration::from_secs(10),
    )
    .await;
    assert_eq!(run["moved"], 3, "{run}");
    assert_eq!(run["canary_sent"], 3, "{run}");
    assert_eq!(run["canary_came_back"], 3, "{run}");
    assert_eq!(run["next_wait_ms"], 2000, "{run}");
    // Only the canaries reached the dependency (twice each: their two
    // attempts), and all 20 are in the DLQ again.
    wait_dlq(&f, 20).await;
    w.stop().await;
    let failed = dep.failures();
    assert_eq!(failed.len(), 3, "{failed:?}");
    assert!(failed.values().all(|n| *n == 2), "{failed:?}");
    assert!(dep.successes().is_empty());
    let runs = w.events("redrive run");
    assert!(
        runs.iter().all(|r| r["moved"].as_u64().unwrap_or(0) <= 3),
        "{runs:#?}"
    );
    assert!(runs.iter().all(|r| r["result"] != "failed"), "{runs:#?}");
}

/// `permanent` messages are never moved unless the policy lists them;
/// `dlq redrive` exits 0 when it moved something.
#[tokio::test]
async fn permanent_messages_move_only_when_the_policy_lists_them() {
    let mut msgs = exhausted("e", 2);
    msgs.extend((0..3).map(|k| dead_redriven(&format!("p-{k}"), "permanent", None)));
    let (mut f, file) = redriving("{min_age: 1s, canary: 0}", msgs).await;

    let run = redrive_now(&file, &f.pipe.name).await;
    run.assert_code(0);
    let r = json(&run);
    assert_eq!(r["result"], "moved", "{r}");
    assert_eq!(r["moved"], 2, "{r}");
    let back = drain(&f.broker, &f.pipe.name).await;
    assert_eq!(ids(&back), set(&["e-0", "e-1"]));
    for d in &back {
        assert_eq!(header_int(d, "dlqctl-redriven"), 1);
    }
    wait_dlq(&f, 3).await;

    // Listed: they move too.
    f.pipe.redrive = Some("{min_age: 1s, canary: 0, reasons: [exhausted, permanent]}".into());
    let file = f.pipe.write(&f.scratch);
    let run = redrive_now(&file, &f.pipe.name).await;
    run.assert_code(0);
    assert_eq!(json(&run)["moved"], 3, "{}", run.output());
    assert_eq!(
        ids(&drain(&f.broker, &f.pipe.name).await),
        set(&["p-0", "p-1", "p-2"])
    );
    // Nothing left: nothing eligible, still exit 0.
    let run = redrive_now(&file, &f.pipe.name).await;
    run.assert_code(0);
    assert_eq!(json(&run)["result"], "nothing_eligible", "{}", run.output());
}

/// After `max_redrives`, a message stays in the DLQ and is counted as
/// waiting for a person, by `dlq redrive` and by the worker's gauge.
#[tokio::test]
async fn past_max_redrives_a_message_stays_and_waits_for_a_person() {
    let msgs = vec![
        dead_redriven("a-0", "exhausted", Some(2)),
        dead_redriven("a-1", "exhausted", Some(5)),
        dead_redriven("b-0", "exhausted", Some(1)),
        dead_redriven("c-0", "exhausted", None),
    ];
    let policy = "{min_age: 1s, every: 1s, canary: 0, max_redrives: 2}";
    let (f, file) = redriving(policy, msgs).await;
    let run = redrive_now(&file, &f.pipe.name).await;
    run.assert_code(0);
    let r = json(&run);
    assert_eq!(
        (&r["moved"], &r["waiting_for_person"]),
        (&2.into(), &2.into()),
        "{r}"
    );
    let back = drain(&f.broker, &f.pipe.name).await;
    let counts: Vec<(String, i64)> = back
        .iter()
        .map(|d| {
            (
                d.properties.message_id().as_ref().unwrap().to_string(),
                header_int(d, "dlqctl-redriven"),
            )
        })
        .collect();
    assert_eq!(counts, vec![("b-0".to_string(), 2), ("c-0".to_string(), 1)]);
    let run = redrive_now(&file, &f.pipe.name).await;
    run.assert_code(0);
    let r = json(&run);
    assert_eq!(r["result"], "nothing_eligible", "{r}");
    assert_eq!(r["waiting_for_person"], 2, "{r}");
    let summary = dlq("summary", &file, &f.pipe.name, &["--json"]).await;
    summary.assert_code(0);
    assert_eq!(
        json(&summary)["waiting_for_person"],
        2,
        "{}",
        summary.output()
    );
    wait_dlq(&f, 2).await;

    // The web page shows the policy and the count; its API has the count.
    let page = crate::support::serve::Served::start(&file, &[] as &[&str]).await;
    let html = page
        .get(&format!("/pipelines/{}", f.pipe.name))
        .await
        .expect(200);
    assert!(html.text.contains("data-test=\"redrive\""), "{}", html.text);
    assert!(
        html.text.contains("data-test=\"waiting\">2<"),
        "{}",
        html.text
    );
    let api = page
        .get(&format!("/api/pipelines/{}/summary", f.pipe.name))
        .await
        .expect(200)
        .json();
    assert_eq!(api["waiting_for_person"], 2, "{api}");
    drop(page);

    // A worker's look counts them in its gauge.
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &["--metrics-addr", "127.0.0.1:0", "--", "/bin/true"],
    );
    let addr = w.metrics_addr().await;
    wait_run(&mut w, "nothing_eligible", Duration::from_secs(20)).await;
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    w.stop().await;
    let q = &f.pipe.name;
    for want in [
        format!("dlqctl_redrive_waiting_for_person{{queue=\"{q}\"}} 2"),
        format!("dlqctl_redrive_runs_total{{queue=\"{q}\",result=\"nothing_eligible\"}}"),
        format!("dlqctl_redrive_next_wait_seconds{{queue=\"{q}\"}} 1.0"),
    ] {
        assert!(text.contains(&want), "{want} in:\n{text}");
    }
    wait_dlq(&f, 2).await;
}

/// `dlq redrive` exits 3 when its canary comes back. While it waits for
/// its canary, a second run is refused as busy (exit 1), and an
/// operator's `dlq peek` is not locked out.
#[tokio::test]
async fn dlq_redrive_exits_3_when_the_canary_fails_and_a_second_run_meanwhile_is_busy() {
    let dep = Dependency::start(false).await;
    let (f, file) = redriving("{min_age: 1s, canary: 2}", exhausted("c", 6)).await;
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &["--http", &dep.hook(), "--no-redrive"],
    );
    w.wait_consuming().await;
    let first = {
        let (file, queue) = (file.clone(), f.pipe.name.clone());
        tokio::spawn(async move { redrive_now(&file, &queue).await })
    };
    // The canaries are out (and back) before the second run.
    let start = Instant::now();
    while dep.failures().len() < 2 && start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = redrive_now(&file, &f.pipe.name).await;
    second.assert_code(1);
    assert_eq!(json(&second)["result"], "busy", "{}", second.output());
    // The DLQ's own lock is held only while a pass reads: a peek waits at
    // most for the end of the canaries' pass, not for the canary's wait.
    let asked = Instant::now();
    let peek = dlq("peek", &file, &f.pipe.name, &["--json", "--wait"]).await;
    peek.assert_code(0);
    assert!(
        asked.elapsed() < Duration::from_secs(15) && !first.is_finished(),
        "the peek waited {:?}",
        asked.elapsed()
    );
    let first = first.await.unwrap();
    first.assert_code(3);
    let r = json(&first);
    assert_eq!(r["result"], "canary_failed", "{r}");
    assert_eq!(r["moved"], 2, "{r}");
    assert_eq!(r["canary"]["came_back"], 2, "{r}");
    assert_eq!(r["canary"]["passed"], false, "{r}");
    w.stop().await;
    wait_dlq(&f, 6).await;
    assert_eq!(dep.failures().len(), 2, "only the canaries were tried");
}

/// Two workers of the pipeline never redrive at the same time: their
/// runs do not overlap, and every message is handled once.
#[tokio::test]
async fn two_workers_never_redrive_at_the_same_time() {
    let (dep, f, file) = redriving_at("10/s", "two", 40).await;
    let args = ["--http", &dep.hook(), "--concurrency", "4"];
    // A busy turn is logged at debug only.
    let env = [("RUST_LOG", "info,dlqctl::worker::redrive=debug")];
    let mut a = WorkerProc::spawn_with_env(&file, &f.pipe.name, &args, &env);
    let mut b = WorkerProc::spawn_with_env(&file, &f.pipe.name, &args, &env);
    dep.wait_successes(40, Duration::from_secs(30), || {
        format!("{}\n{}", a.output(), b.output())
    })
    .await;
    wait_dlq(&f, 0).await;
    // Another look each, so a run cut by the stop is not mistaken.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.stop().await;
    b.stop().await;
    let handled = dep.successes();
    assert_eq!(handled.len(), 40);
    assert!(handled.values().all(|n| *n == 1), "{handled:?}");
    // From the moment a run found itself due to the moment it recorded
    // itself: both under its lock.
    let span = |e: &Value| {
        (
            e["started_at_ms"].as_u64().unwrap(),
            e["ended_at_ms"].as_u64().unwrap(),
        )
    };
    let moving = |w: &WorkerProc| -> Vec<(u64, u64)> {
        w.events("redrive run")
            .iter()
            .filter(|e| e["moved"].as_u64().unwrap_or(0) > 0)
            .map(span)
            .collect()
    };
    let (ra, rb) = (moving(&a), moving(&b));
    let total: u64 = a
        .events("redrive run")
        .iter()
        .chain(b.events("redrive run").iter())
        .map(|e| e["moved"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(total, 40);
    // They did meet: a look of one came while the other ran, and skipped.
    let busy = |w: &WorkerProc| {
        w.events("redrive run")
            .iter()
            .filter(|e| e["result"] == "busy")
            .count()
    };
    assert!(
        busy(&a) + busy(&b) > 0,
        "no busy turn:\n{}\n{}",
        a.output(),
        b.output()
    );
    // A run's span ends after it released the lock (the lock queue's
    // delete, the channel's close): 100 ms of slack, for runs that last
    // seconds.
    for x in &ra {
        for y in &rb {
            assert!(
                x.1 <= y.0 + 100 || y.1 <= x.0 + 100,
                "runs overlap: {x:?} and {y:?}\n{}\n{}",
                a.output(),
                b.output()
            );
        }
    }
}

/// A `kill -9` of the worker mid-redrive loses nothing: a second worker
/// finishes the redrive, every message is handled, and the queues end
/// empty. A copy confirmed just before the kill whose original was not
/// yet acked is redriven again: at most the copies in flight (one, at
/// this rate) can be handled twice.
#[tokio::test]
async fn a_kill_9_mid_redrive_loses_nothing() {
    let (dep, f, file) = redriving_at("20/s", "k", 200).await;
    let args = ["--http", &dep.hook(), "--concurrency", "4"];
    let mut a = WorkerProc::spawn(&file, &f.pipe.name, &args);
    dep.wait_successes(40, Duration::from_secs(30), || a.output())
        .await;
    a.signal(libc::SIGKILL);
    a.wait_exit(Duration::from_secs(10)).await;
    let at_kill = dep.successes().len();
    assert!(at_kill < 200, "the redrive was over before the kill");
    let mut b = WorkerProc::spawn(&file, &f.pipe.name, &args);
    dep.wait_successes(200, Duration::from_secs(40), || b.output())
        .await;
    wait_drained(&f).await;
    b.stop().await;
    let handled = dep.successes();
    assert_eq!(handled.len(), 200, "nothing lost");
    let twice: Vec<_> = handled.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!("killed after {at_kill} handled; handled twice: {twice:?}");
    assert!(twice.len() <= 1, "{twice:?}");
    assert_eq!(f.broker.message_count(&f.pipe.dlq()).await, Some(0));
}

/// With a health probe answering 503, nothing moves, from `dlq redrive`
/// (exit 3, unhealthy) or from the worker; when it answers 200, the
/// messages move.
#[tokio::test]
async fn with_a_health_probe_answering_503_nothing_moves_then_200_moves_them() {
    let dep = Dependency::start(false).await;
    let health = dep.health();
    let (f, file) = redriving(
        &format!("{{min_age: 1s, every: 1s, canary: 0, health: {{http: '{health}'}}}}"),
        exhausted("h", 10),
    )
    .await;
    let run = redrive_now(&file, &f.pipe.name).await;
    run.assert_code(3);
    let r = json(&run);
    assert_eq!(r["result"], "unhealthy", "{r}");
    assert_eq!(r["moved"], 0, "{r}");
    assert_eq!(r["health"], "503 Service Unavailable", "{r}");

    let mut w = WorkerProc::spawn(&file, &f.pipe.name, &["--http", &dep.hook()]);
    let unhealthy = wait_run(&mut w, "unhealthy", Duration::from_secs(20)).await;
    // An unhealthy run read no DLQ: no count, and no placeholder for one.
    assert!(unhealthy.get("waiting_for_person").is_none(), "{unhealthy}");
    let start = Instant::now();
    while dep.probes() < 4 && start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(dep.probes() >= 4);
    assert!(dep.failures().is_empty() && dep.successes().is_empty());
    assert_eq!(f.broker.message_count(&f.pipe.dlq()).await, Some(10));
    dep.set_up(true);
    dep.wait_successes(10, Duration::from_secs(20), || w.output())
        .await;
    wait_dlq(&f, 0).await;
    let moved = wait_run(&mut w, "moved", Duration::from_secs(10)).await;
    w.stop().await;
    assert!(dep.successes().values().all(|n| *n == 1));
    assert_eq!(moved["moved"], 10, "{moved}");
}

/// `work --no-redrive` leaves the DLQ alone, policy or not.
#[tokio::test]
async fn no_redrive_turns_it_off_for_that_worker() {
    let (f, file) = redriving("{min_age: 1s, every: 1s, canary: 0}", exhausted("off", 3)).await;
    let mut w = WorkerProc::spawn(&file, &f.pipe.name, &["--no-redrive", "--", "/bin/true"]);
    w.wait_consuming().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    w.stop().await;
    assert!(
        w.events("automatic redrive on").is_empty(),
        "{}",
        w.output()
    );
    assert!(w.events("redrive run").is_empty(), "{}", w.output());
    assert_eq!(f.broker.message_count(&f.pipe.dlq()).await, Some(3));
    assert_eq!(f.broker.message_count(&f.pipe.name).await, Some(0));
}

/// `dlqctl status FILE --json`'s redrive state of the pipeline `queue`.
async fn shared_state(file: &Path, queue: &str) -> Value {
    let run = crate::support::Dlqctl::new("status")
        .arg(file)
        .arg("--json")
        .run()
        .await;
    let report = json(&run);
    let p = report["pipelines"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == queue))
        .unwrap_or_else(|| panic!("no pipeline {queue}: {}", run.output()));
    p["redrive"].clone()
}

/// Three worker processes of one pipeline share one redrive wait, kept in
/// the broker: after a failed canary the next run, whichever worker takes
/// it, waits the doubled wait and doubles it again (each worker's own
/// wait came back to back, every one logging the first doubling), and
/// `status` shows the wait and the runs.
#[tokio::test]
async fn three_workers_share_one_redrive_wait_that_doubles_across_them() {
    let dep = Dependency::start(false).await;
    let (f, file) = redriving(
        "{min_age: 1s, every: 1s, canary: 2, rate: 100/s}",
        exhausted("fleet", 6),
    )
    .await;
    let args = ["--http", &dep.hook(), "--concurrency", "2"];
    let env = [("RUST_LOG", "info,dlqctl::worker::redrive=debug")];
    let mut ws: Vec<WorkerProc> = (0..3)
        .map(|_| WorkerProc::spawn_with_env(&file, &f.pipe.name, &args, &env))
        .collect();
    let failed_runs = |ws: &[WorkerProc]| -> Vec<Value> {
        let mut runs: Vec<Value> = ws
            .iter()
            .flat_map(|w| w.events("redrive run"))
            .filter(|e| e["result"] == "canary_failed")
            .collect();
        runs.sort_by_key(|e| e["ended_at_ms"].as_u64().unwrap_or(0));
        runs
    };
    let deadline =
        Instant::now() + Duration::from_secs(5) + 2 * CANARY_WAIT + Duration::from_secs(20);
    while failed_runs(&ws).len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let runs = failed_runs(&ws);
    let all = || ws.iter().map(|w| w.output()).collect::<Vec<_>>().join("\n");
    assert!(runs.len() >= 2, "two failed canaries expected:\n{}", all());
    assert_eq!(runs[0]["next_wait_ms"], 2000, "{:#?}", runs);
    assert_eq!(
        runs[1]["next_wait_ms"], 4000,
        "the second run doubles the pipeline's wait, whichever worker ran the first: {:#?}",
        runs
    );
    // The second run started no sooner than the shared wait after the
    // first ended: both times are the ones the runs compared and recorded
    // (one machine's clock), so no tolerance.
    let end0 = runs[0]["ended_at_ms"].as_u64().unwrap();
    let start1 = runs[1]["started_at_ms"].as_u64().unwrap();
    assert!(end0 > 0 && start1 > 0, "{runs:#?}");
    assert!(
        start1 >= end0 + 2000,
        "the second run started {} ms after the first ended",
        start1 as i64 - end0 as i64
    );
    let state = shared_state(&file, &f.pipe.name).await;
    assert_eq!(
        state["queue"]["name"],
        format!("{}.redrive-state", f.pipe.name)
    );
    assert_eq!(state["state"]["wait_ms"], 4000, "{state:#}");
    let kept = state["state"]["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(kept.len() >= 2, "{state:#}");
    assert_eq!(kept[0]["result"], "canary_failed", "{state:#}");
    assert_eq!(kept[0]["canary"], serde_json::json!([2, 2]), "{state:#}");
    for w in &mut ws {
        w.stop().await;
    }
    // Only the canaries' runs reached the dependency: two per run.
    assert!(dep.successes().is_empty());
    wait_dlq(&f, 6).await;
}

/// A `busy` turn changes nothing of the shared state and names no next
/// look; a run that found nothing brings the wait back to `every`, and
/// the state survives the command (a new process reads it).
#[tokio::test]
async fn a_busy_turn_leaves_the_shared_wait_and_a_finished_run_records_itself() {
    let msgs = vec![dead_redriven("p-0", "permanent", None)];
    let (f, file) = redriving("{min_age: 1s, every: 3s, canary: 0}", msgs).await;
    let run = redrive_now(&file, &f.pipe.name).await;
    run.assert_code(0);
    let r = json(&run);
    assert_eq!(r["result"], "nothing_eligible", "{r}");
    assert_eq!(r["shared"]["seq"], 1, "{r}");
    assert_eq!(r["shared"]["wait_ms"], 3000, "{r}");
    let text = dlq("redrive", &file, &f.pipe.name, &[]).await;
    text.assert_code(0);
    text.assert_stdout_has(&["the pipeline's workers look again in 3s"]);
    let before = shared_state(&file, &f.pipe.name).await;
    assert_eq!(before["state"]["seq"], 2, "{before:#}");
    assert_eq!(
        before["state"]["runs"][0]["by"],
        format!("dlqctl dlq redrive {}", f.pipe.name)
    );

    // The redrive lock held by someone else: busy, nothing written.
    let ch = f.broker.channel().await;
    ch.queue_declare(
        format!("dlqctl.redrive.{}", f.pipe.dlq()).as_str().into(),
        lapin::options::QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let busy = dlq("redrive", &file, &f.pipe.name, &[]).await;
    busy.assert_code(1);
    busy.assert_stdout_has(&["busy, nothing done"]);
    assert!(
        !busy.stdout.contains("next automatic look") && !busy.stdout.contains("look again"),
        "a busy one-off run names no next look: {}",
        busy.output()
    );
    let after = shared_state(&file, &f.pipe.name).await;
    assert_eq!(after["state"], before["state"], "busy wrote nothing");
    let _ = ch.close(200, "done".into()).await;
}

/// A drill message left in the DLQ (`drill --timeout 1ms`) is neither
/// moved nor counted as waiting for a person by a redrive; the real
/// messages around it move.
#[tokio::test]
async fn a_drill_message_left_in_the_dlq_is_never_redriven_nor_counted() {
    let mut msgs = exhausted("real", 3);
    let (body, p) = dead_redriven("drill-left", "exhausted", None);
    let mut h: FieldTable = p.headers().clone().unwrap_or_default();
    h.insert(
        "dlqctl-drill".into(),
        lapin::types::AMQPValue::LongString("d-1".into()),
    );
    msgs.push((body, p.with_headers(h.clone())));
    // One past max_redrives too, and a drill one past it as well.
    let (body, p) = dead_redriven("drill-spent", "exhausted", Some(9));
    let mut h2: FieldTable = p.headers().clone().unwrap_or_default();
    h2.insert(
        "dlqctl-drill".into(),
        lapin::types::AMQPValue::LongString("d-2".into()),
    );
    msgs.push((body, p.with_headers(h2)));
    msgs.push(dead_redriven("spent", "exhausted", Some(9)));
    let (f, file) = redriving("{min_age: 1s, canary: 0}", msgs).await;
    let run = redrive_now(&file, &f.pipe.name).await;
    run.assert_code(0);
    let r = json(&run);
    assert_eq!(r["moved"], 3, "{r}");
    assert_eq!(
        r["waiting_for_person"], 1,
        "only the real spent message waits: {r}"
    );
    let back = drain(&f.broker, &f.pipe.name).await;
    assert_eq!(ids(&back), set(&["real-0", "real-1", "real-2"]));
    wait_dlq(&f, 3).await;
    let left = drain(&f.broker, &f.pipe.dlq()).await;
    assert_eq!(ids(&left), set(&["drill-left", "drill-spent", "spent"]));
}

/// The worker acks, without the handler, a drill message that a redrive
/// of an older version moved back (`dlqctl-redriven`), as it does a
/// replayed one: it is never failed on purpose again.
#[tokio::test]
async fn the_worker_acks_a_redriven_drill_message_without_the_handler() {
    let dep = Dependency::start(true).await;
    let (f, file) = redriving("{min_age: 1s, canary: 0}", vec![]).await;
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &["--http", &dep.hook(), "--no-redrive"],
    );
    w.wait_consuming().await;
    let mut h = FieldTable::default();
    h.insert(
        "dlqctl-drill".into(),
        lapin::types::AMQPValue::LongString("d-9".into()),
    );
    h.insert("dlqctl-redriven".into(), i(1));
    publish(
        &f.broker,
        "",
        &f.pipe.name,
        b"{}",
        with_id("drill-back").with_headers(h),
    )
    .await;
    // Its decision is logged once the broker has the outcome: one line,
    // an ack (failed on purpose, it would be a retry, then a dead-letter).
    w.wait_decisions(1, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    w.stop().await;
    let decisions: Vec<String> = w
        .decisions()
        .iter()
        .filter(|d| d["message_id"] == "drill-back")
        .map(|d| d["decision"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(decisions, ["ack"], "{}", w.output());
    assert!(
        dep.successes().is_empty() && dep.failures().is_empty(),
        "the handler ran a drill message"
    );
    assert_eq!(
        f.broker.message_count(&f.pipe.dlq()).await,
        Some(0),
        "{}",
        w.output()
    );
}

/// The web page's DLQ view shows the redrive's shared wait, its next look
/// and its last runs with their results, as the broker keeps them.
#[tokio::test]
async fn the_web_page_shows_the_redrive_history_and_the_next_look() {
    let msgs = vec![dead_redriven("p-0", "permanent", None)];
    // A health URL with a token in its query: shown without it.
    let (f, file) = redriving(
        "{min_age: 1s, every: 5s, canary: 0, health: {http: 'http://127.0.0.1:1/health?token=s3cret'}}",
        msgs,
    )
    .await;
    let s = crate::support::serve::Served::start(&file, &[] as &[&str]).await;
    let page = s
        .get(&format!("/pipelines/{}", f.pipe.name))
        .await
        .expect(200);
    assert!(page.text.contains("No redrive run yet."), "{}", page.text);
    // Nothing answers the health URL: unhealthy (exit 3), twice.
    redrive_now(&file, &f.pipe.name).await.assert_code(3);
    redrive_now(&file, &f.pipe.name).await.assert_code(3);
    let page = s
        .get(&format!("/pipelines/{}", f.pipe.name))
        .await
        .expect(200);
    let t = &page.text;
    assert!(t.contains("data-test=\"redrive-runs\""), "{t}");
    assert_eq!(
        t.matches("data-test=\"run-result\">unhealthy<").count(),
        2,
        "{t}"
    );
    assert!(t.contains("data-test=\"shared-wait\">5s<"), "{t}");
    assert!(t.contains("data-test=\"next-look\""), "{t}");
    assert!(
        t.contains("http://127.0.0.1:1/health") && !t.contains("s3cret"),
        "{t}"
    );
    assert!(
        t.contains(&format!("dlqctl dlq redrive {}", f.pipe.name)),
        "{t}"
    );
    // A drill names the redrive's last run too (here it fails at its first
    // step: no worker consumes the pipeline).
    let drill = crate::support::Dlqctl::on_queue(&["drill"], &file, &f.pipe.name)
        .args(["--format", "json"])
        .run()
        .await;
    drill.assert_code(3);
    let d = json(&drill);
    let redrive = d["redrive"].as_str().unwrap_or_default();
    assert!(
        redrive.starts_with("last run unhealthy") && redrive.contains("2 in a row"),
        "{d:#}"
    );
}

/// Two worker processes redriving a DLQ that holds a drill message left
/// behind among real ones: the real ones go back and are handled once,
/// the drill message stays in the DLQ, untouched by either worker's runs,
/// uncounted, and never reaches the handler.
#[tokio::test]
async fn two_workers_redrive_the_real_messages_and_leave_a_drill_message() {
    let dep = Dependency::start(true).await;
    let mut msgs = exhausted("fleet-real", 6);
    let (body, p) = dead_redriven("drill-left", "exhausted", None);
    let mut h: FieldTable = p.headers().clone().unwrap_or_default();
    h.insert(
        "dlqctl-drill".into(),
        lapin::types::AMQPValue::LongString("d-7".into()),
    );
    msgs.insert(0, (body, p.with_headers(h)));
    let (f, file) = redriving("{min_age: 1s, every: 1s, canary: 0, rate: 100/s}", msgs).await;
    let args = ["--http", &dep.hook(), "--concurrency", "2"];
    let mut a = WorkerProc::spawn(&file, &f.pipe.name, &args);
    let mut b = WorkerProc::spawn(&file, &f.pipe.name, &args);
    dep.wait_successes(6, Duration::from_secs(30), || {
        format!("{}\n{}", a.output(), b.output())
    })
    .await;
    // A few more looks by both, with only the drill message left.
    tokio::time::sleep(Duration::from_secs(3)).await;
    a.stop().await;
    b.stop().await;
    let runs: Vec<Value> = a
        .events("redrive run")
        .into_iter()
        .chain(b.events("redrive run"))
        .collect();
    let moved: u64 = runs.iter().filter_map(|r| r["moved"].as_u64()).sum();
    assert_eq!(moved, 6, "only the real messages move: {runs:#?}");
    assert!(
        runs.iter()
            .all(|r| r["waiting_for_person"].as_u64().unwrap_or(0) == 0),
        "a drill message is not waiting for a person: {runs:#?}"
    );
    let handled = dep.successes();
    assert_eq!(handled.len(), 6, "{handled:?}");
    assert!(handled.values().all(|n| *n == 1), "{handled:?}");
    assert!(!handled.contains_key("drill-left") && dep.failures().is_empty());
    let left = drain(&f.broker, &f.pipe.dlq()).await;
    assert_eq!(ids(&left), set(&["drill-left"]));
}
