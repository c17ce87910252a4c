//! `dlqctl work` under crashes and broker trouble: a message that kills the
//! worker, SIGKILLs in the middle of a 1,000-message run, SIGTERM with
//! handlers in flight, a connection closed by an operator, a broker
//! restart. Each test fails when a message is lost, or when the worker does
//! not come back.

use crate::support::chaos::*;
use crate::support::script::{ChaosScript, Event};
use crate::support::worker::{
    drain, header, header_str, processes_with_cmdline, provision_file, PipeFixture,
};
use crate::support::{events, Broker};
use lapin::types::AMQPValue;
use rand::Rng;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Fixture = PipeFixture;

/// What the worker logs when it loses its connection.
const LOST: &str = "connection lost; reconnecting";

fn sink() -> Arc<Mutex<Vec<String>>> {
    Arc::new(Mutex::new(Vec::new()))
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:04}")).collect()
}

/// The `reason` of the first (latest) `x-death` entry.
fn latest_death(d: &lapin::message::Delivery) -> (String, String) {
    let Some(AMQPValue::FieldArray(a)) = header(d, "x-death") else {
        panic!("no x-death array: {:?}", d.properties.headers());
    };
    let Some(AMQPValue::FieldTable(t)) = a.as_slice().first() else {
        panic!("empty x-death");
    };
    let text = |k: &str| match t.inner().get(k) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => panic!("x-death {k}: {other:?}"),
    };
    (text("reason"), text("queue"))
}

/// 1. A message whose handler kills the worker (SIGKILL of its parent)
/// every time: the test restarts the worker after each death; the quorum
/// queue's `delivery_limit: 2` makes the broker dead-letter it after three
/// deliveries, with its own `x-death` reason `delivery_limit`, and the
/// messages around it are handled once each.
#[tokio::test]
async fn quorum_crash_loop_ends_in_the_dlq_by_delivery_limit() {
    let f = Fixture::new(&[100], 3, |_| {}).await;
    let file = f.scratch.write(
        "topology.yaml",
        &format!("{}    delivery_limit: 2\n", f.pipe.yaml()),
    );
    provision_file(&file).await;
    let script = ChaosScript::new(
        &f.scratch,
        "h",
        r#"log start
if [ "$id" = poison ]; then kill -9 "$PPID" || log kill-failed; exit 1; fi
log ok
exit 0"#,
    );
    let normal = ["n1", "n2", "n3", "n4"];
    let order: Vec<String> = ["n1", "n2", "poison", "n3", "n4"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    crate::support::chaos::publish_ids(&f.broker, "", &f.pipe.name, &order).await;

    // Prefetch 1: the messages behind the poison are not delivered (and
    // their delivery count not raised) while it kills the worker.
    let args = ["--prefetch", "1", "--concurrency", "1"];
    let lines = sink();
    let start = Instant::now();
    let mut w = Proc::spawn(&file, &f.pipe.name, &args, &script.path, lines.clone());
    let mut deaths = Vec::new();
    loop {
        if let Some(status) = w.exited() {
            w.wait_exit(Duration::from_secs(5)).await;
            deaths.push((w.pid(), status));
            assert!(
                deaths.len() <= 6,
                "the worker keeps dying: the crash loop is not bounded; deaths {deaths:?}\n{}",
                w.output()
            );
            w = Proc::spawn(&file, &f.pipe.name, &args, &script.path, lines.clone());
            continue;
        }
        let ok: HashSet<String> = script.named("ok").into_iter().map(|e| e.id).collect();
        if ok.len() == normal.len() && f.broker.message_count(&f.pipe.dlq()).await == Some(1) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not done within 60 s: deaths {deaths:?}, handler events {:#?}\n{}",
            script.events(),
            w.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = start.elapsed();
    assert_eq!(w.stop(Duration::from_secs(15)).await, Some(0));

    // The poison ran three times (limit 2 → three deliveries), each run
    // killing the worker that started it (its $PPID), with SIGKILL.
    let poison = script.named("start");
    let poison: Vec<_> = poison.iter().filter(|e| e.id == "poison").collect();
    assert_eq!(poison.len(), 3, "poison runs: {poison:#?}");
    assert!(script.named("kill-failed").is_empty());
    assert_eq!(deaths.len(), 3, "worker deaths: {deaths:?}");
    for (pid, status) in &deaths {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "worker {pid}");
        assert!(
            poison.iter().any(|e| e.worker_pid == *pid),
            "worker {pid} died but no poison run had it as parent: {poison:#?}"
        );
    }
    // Each other message was handled once and acked.
    for id in normal {
        let runs = script.events().into_iter().filter(|e| e.id == id).count();
        assert_eq!(runs, 2, "{id}: one start and one ok wanted");
    }
    let acked: Vec<String> = decisions(&lines)
        .into_iter()
        .filter(|(_, o, d)| o == "success" && d == "ack")
        .map(|(id, _, _)| id)
        .collect();
    let mut sorted = acked.clone();
    sorted.sort();
    assert_eq!(sorted, normal, "{}", w.output());

    // The broker, not the worker, dead-lettered the poison.
    let dlq = drain(&f.broker, &f.pipe.dlq()).await;
    assert_eq!(ids_of(&dlq), ["poison"]);
    assert_eq!(
        latest_death(&dlq[0]),
        ("delivery_limit".to_string(), f.pipe.name.clone())
    );
    assert!(header(&dlq[0], "dlqctl-reason").is_none());
    assert_eq!(ready_total(&f.broker, &f.main_and_retry_queues()).await, 0);
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
}

/// 2. No loss: 1,000 messages through the producers' exchange, a handler
/// failing at random (30 % transient, 5 % permanent), four SIGKILLs of the
/// worker at random moments. Every id ends acked after a success or in the
/// DLQ. Duplicate runs (at-least-once) are counted and printed.
#[tokio::test]
async fn no_message_lost_across_sigkills_with_random_failures() {
    const N: usize = 1000;
    const KILLS: usize = 4;
    let mut f = Fixture::new(&[100, 200], 3, |_| {}).await;
    let exchange = format!("{}-in", f.pipe.name);
    f.pipe.exchange = Some((exchange.clone(), "direct", vec!["k".into()]));
    let file = f.pipe.provision(&f.scratch).await;
    let script = ChaosScript::new(
        &f.scratch,
        "h",
        r#"set -- $(od -An -N2 -tu2 /dev/urandom)
r=$(( $1 % 100 ))
if [ "$r" -lt 30 ]; then log transient; echo "flaky dependency" >&2; exit 75; fi
if [ "$r" -lt 35 ]; then log permanent; echo "bad data" >&2; exit 65; fi
log success
exit 0"#,
    );
    let all = ids("m", N);
    crate::support::chaos::publish_ids(&f.broker, &exchange, "k", &all).await;

    let args = ["--concurrency", "8", "--prefetch", "50"];
    let lines = sink();
    let start = Instant::now();
    let mut w = Proc::spawn(&file, &f.pipe.name, &args, &script.path, lines.clone());
    let mut kills = Vec::new();
    let mut rng = rand::rng();
    for _ in 0..KILLS {
        // A random moment after this worker has handled something.
        let before = decisions(&lines).len();
        assert!(
            wait_until(Duration::from_secs(30), || decisions(&lines).len() > before).await,
            "the worker handles nothing:\n{}",
            w.output()
        );
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..600))).await;
        assert!(w.exited().is_none(), "the worker exited:\n{}", w.output());
        let handled = decisions(&lines).len();
        w.kill9().await;
        kills.push(handled);
        w = Proc::spawn(&file, &f.pipe.name, &args, &script.path, lines.clone());
    }

    // Idle: main and retry queues empty, no decision for 1.5 s.
    let queues = f.main_and_retry_queues();
    let mut last = (decisions(&lines).len(), Instant::now());
    loop {
        let n = decisions(&lines).len();
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() > Duration::from_millis(1500)
            && ready_total(&f.broker, &queues).await == 0
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "not idle within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = start.elapsed();
    assert_eq!(w.stop(Duration::from_secs(20)).await, Some(0));
    // Anything still unacked would be ready again now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ready_total(&f.broker, &queues).await,
        0,
        "left in main/retry"
    );

    let dlq = drain(&f.broker, &f.pipe.dlq()).await;
    let dlq_ids: Vec<String> = ids_of(&dlq);
    let in_dlq: HashSet<&String> = dlq_ids.iter().collect();
    let decided = decisions(&lines);
    let acked: HashSet<&String> = decided
        .iter()
        .filter(|(_, _, d)| d == "ack")
        .map(|(id, _, _)| id)
        .collect();
    let events = script.events();
    let mut runs: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in &events {
        runs.entry(e.id.as_str()).or_default().push(e);
    }

    // At least once: no id missing. A handler success counts as handled
    // even without the worker's log line: a worker SIGKILLed right after
    // its ack never writes the line.
    let succeeded: HashSet<&str> = events
        .iter()
        .filter(|e| e.what == "success")
        .map(|e| e.id.as_str())
        .collect();
    let missing: Vec<&String> = all
        .iter()
        .filter(|id| !succeeded.contains(id.as_str()) && !in_dlq.contains(id))
        .collect();
    let explain = |ids: &[&String]| {
        ids.iter()
            .take(10)
            .map(|id| {
                let d: Vec<_> = decided.iter().filter(|(i, _, _)| i == *id).collect();
                format!("{id}: runs {:?}; decisions {d:?}", runs.get(id.as_str()))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        missing.is_empty(),
        "{} of {N} ids neither handled successfully nor in the DLQ:\n{}",
        missing.len(),
        explain(&missing)
    );
    let unlogged = all
        .iter()
        .filter(|id| !acked.contains(id) && !in_dlq.contains(id))
        .count();
    // Acks only after a success of the handler.
    for (id, outcome, d) in &decided {
        if d == "ack" {
            assert_eq!(outcome, "success", "{id} acked after {outcome}");
            assert!(
                runs.get(id.as_str())
                    .is_some_and(|r| r.iter().any(|e| e.what == "success")),
                "{id} acked without a successful handler run"
            );
        }
    }
    // The budget of runs holds: no run beyond max_attempts.
    assert!(
        events.iter().all(|e| (1..=3).contains(&e.attempt)),
        "a run outside attempts 1..=3"
    );
    // An id whose runs were all made by one worker (no crash in its life)
    // ran attempts 1, 2, ... in order, at most 3, and ended acked iff its
    // last run succeeded, else in the DLQ once.
    let mut single_worker = 0;
    for (id, r) in &runs {
        if r.iter().any(|e| e.worker_pid != r[0].worker_pid) {
            continue;
        }
        single_worker += 1;
        let attempts: Vec<u32> = r.iter().map(|e| e.attempt).collect();
        let want: Vec<u32> = (1..=attempts.len() as u32).collect();
        assert_eq!(attempts, want, "{id}: {r:?}");
        let last = r.last().unwrap();
        let dlq_copies = dlq_ids.iter().filter(|d| d == id).count();
        match last.what.as_str() {
            "success" => assert_eq!(dlq_copies, 0, "{id} succeeded but is in the DLQ"),
            "permanent" => assert_eq!(dlq_copies, 1, "{id}: {r:?}"),
            _ => {
                assert_eq!(last.attempt, 3, "{id} stopped after a transient: {r:?}");
                assert_eq!(dlq_copies, 1, "{id}: {r:?}");
            }
        }
    }
    // Every DLQ message says why it is there.
    let mut reasons: HashMap<String, usize> = HashMap::new();
    for d in &dlq {
        let reason = match header(d, "dlqctl-reason") {
            Some(_) => header_str(d, "dlqctl-reason"),
            None => latest_death(d).0,
        };
        *reasons.entry(reason).or_default() += 1;
    }
    assert!(
        reasons
            .keys()
            .all(|r| ["permanent", "exhausted", "delivery_limit"].contains(&r.as_str())),
        "{reasons:?}"
    );

    let successes: HashMap<&str, usize> =
        events
            .iter()
            .filter(|e| e.what == "success")
            .fold(HashMap::new(), |mut m, e| {
                *m.entry(e.id.as_str()).or_default() += 1;
                m
            });
    let duplicate_successes: usize = successes.values().map(|n| n - 1).sum();
    let both = all
        .iter()
        .filter(|id| acked.contains(id) && in_dlq.contains(id))
        .count();
    let stats = format!(
        "no-loss: published {N}, acked {} ids, DLQ {} messages ({} ids; {reasons:?}), \
         acked and in the DLQ {both}, succeeded without an ack line {unlogged}, handler runs {}, duplicate successful runs {duplicate_successes}, \
         DLQ duplicates {}, kills {KILLS} (after {kills:?} decisions), ids run by one worker only {single_worker}, \
         {:.1} s",
        acked.len(),
        dlq.len(),
        in_dlq.len(),
        events.len(),
        extra_occurrences(&dlq_ids),
        elapsed.as_secs_f64()
    );
    println!("{stats}");
    eprintln!("{stats}");
}

/// 3a. SIGTERM while four handlers run: the worker waits for them, acks
/// all four, exits 0, and requeues nothing.
#[tokio::test]
async fn sigterm_finishes_four_handlers_in_flight_and_exits_0() {
    let (rig, mut w) = ChaosPipe::start(&sleeper("1"), &["--concurrency", "4"]).await;
    let four = ids("t", 4);
    rig.publish_and_wait(&four, ("start", 4)).await;
    let sent = Instant::now();
    let code = w.stop(Duration::from_secs(15)).await;
    assert_eq!(code, Some(0), "{}", w.output());
    assert!(
        sent.elapsed() >= Duration::from_millis(400),
        "exited before the handlers could finish"
    );
    assert_eq!(rig.script.named("done").len(), 4, "a handler was cut short");
    let mut acked: Vec<String> = rig
        .decisions()
        .into_iter()
        .filter(|(_, _, d)| d == "ack")
        .map(|(id, _, _)| id)
        .collect();
    acked.sort();
    assert_eq!(acked, four, "{}", w.output());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.f.broker.message_count(&rig.f.pipe.name).await, Some(0));
    assert_eq!(rig.script.named("start").len(), 4, "a message ran twice");
}

/// 3b. SIGTERM with `--grace 200ms` while a handler sleeps 5 s: exit 0
/// promptly, the message back in the main queue, the handler and its
/// child killed.
#[tokio::test]
async fn sigterm_after_grace_returns_the_message_and_kills_the_handler() {
    let (rig, secs) = ChaosPipe::sleeping(5).await;
    let mut w = rig.spawn(&["--grace", "200ms"]);
    let handler_pid = rig.start_slow().await;
    assert!(
        wait_until(Duration::from_secs(5), || !processes_with_cmdline(&[
            "sleep", &secs
        ])
        .is_empty())
        .await,
        "the handler's sleep never started"
    );
    let sent = Instant::now();
    let code = w.stop(Duration::from_secs(10)).await;
    let took = sent.elapsed();
    assert_eq!(code, Some(0), "{}", w.output());
    assert!(took < Duration::from_secs(3), "took {took:?} to stop");
    rig.assert_cut_short(&w, handler_pid, &secs).await;
}

/// 4. An operator closes the worker's connection (management API): the
/// worker logs it, reconnects within seconds, handles messages published
/// after the close, and the message whose handler was running is
/// redelivered and handled again (the run of the lost session is stopped).
#[tokio::test]
async fn forced_connection_close_reconnects_and_redelivers() {
    forced_close("2", 2).await;
}

/// 4b. The same with one handler at a time (the default) busy for 4 s: the
/// loss is noticed, and the worker reconnects, without waiting for the
/// handler that holds the only permit.
#[tokio::test]
async fn forced_connection_close_while_the_only_handler_runs_reconnects_at_once() {
    forced_close("1", 4).await;
}

async fn forced_close(concurrency: &str, slow_secs: u32) {
    let body =
        format!("log start\ncase \"$id\" in slow*) sleep {slow_secs} ;; esac\nlog done\nexit 0");
    let (rig, mut w) = ChaosPipe::start(&body, &["--concurrency", concurrency]).await;
    let (f, script) = (&rig.f, &rig.script);
    let conn_name = format!("dlqctl work {}", f.pipe.name);
    let mut names = Vec::new();
    for _ in 0..150 {
        names = connections_named(&f.broker.mgmt, &conn_name).await;
        if !names.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(names.len(), 1, "connections named {conn_name:?}: {names:?}");
    rig.start_slow().await;

    let closed = Instant::now();
    close_connection(&f.broker.mgmt, &names[0]).await;
    let after = ids("after", 3);
    rig.publish(&f.broker, &after).await;
    rig.assert_logged(&w, LOST, 1, Duration::from_secs(2)).await;
    rig.assert_logged(&w, "consuming", 2, Duration::from_secs(2))
        .await;
    let reconnected = closed.elapsed();
    let acked = |id: &str| {
        rig.decisions()
            .iter()
            .any(|(i, _, d)| i == id && d == "ack")
    };
    assert!(
        wait_until(Duration::from_secs(15), || after.iter().all(|id| acked(id))
            && acked("slow"))
        .await,
        "not all handled after the reconnection: {:#?}\n{}",
        script.events(),
        w.output()
    );
    let runs_of_slow = |what: &str| script.named(what).iter().filter(|e| e.id == "slow").count();
    assert_eq!(
        runs_of_slow("start"),
        2,
        "the message in flight was not redelivered once"
    );
    // The run of the lost session was stopped (its result could be neither
    // acked nor published): the redelivered run is the one that finished.
    assert_eq!(runs_of_slow("done"), 1, "{:#?}", script.events());
    rig.stop_and_assert_empty(&mut w, &f.broker).await;
    eprintln!("forced close (concurrency {concurrency}): consuming again after {reconnected:?}");
}

/// 5. `rabbitmqctl stop_app` / `start_app` while the worker runs: it
/// reconnects with backoff and finishes what was published before and
/// after. Serial: it stops the broker for everyone.
#[tokio::test]
async fn serial_broker_restart_worker_reconnects_and_finishes() {
    crate::support::allow_disruption(
        "stops and restarts the broker (rabbitmqctl stop_app, start_app)",
    );
    let (rig, mut w) = ChaosPipe::start(&sleeper("0.2"), &[]).await;
    let before = ids("before", 10);
    rig.publish_and_wait(&before, ("done", 2)).await;

    let running = BrokerRunning;
    let stopped = Instant::now();
    rabbitmqctl(&["stop_app"]).await;
    rig.assert_logged(&w, LOST, 1, Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    rabbitmqctl(&["start_app"]).await;
    wait_broker_up(Duration::from_secs(60)).await;
    drop(running);
    let up = Instant::now();
    let broker = Broker::connect().await;
    rig.assert_logged(&w, "consuming", 2, Duration::from_secs(30))
        .await;
    let (reconnected, since_up) = (stopped.elapsed(), up.elapsed());
    let after = ids("after", 10);
    rig.publish(&broker, &after).await;
    let all: Vec<&String> = before.iter().chain(&after).collect();
    rig.assert_all_done(&w, &all, Duration::from_secs(30)).await;
    rig.stop_and_assert_empty(&mut w, &broker).await;
    let retries = events(&rig.lines, "cannot resume; retrying with backoff").len();
    eprintln!(
        "broker restart: consuming again {reconnected:?} after stop_app, {since_up:?} after \
         the broker was back; {retries} distinct failure(s) logged while reconnecting"
    );
}

/// `rabbitmqctl close_all_connections` mid-run (serial: it closes every
/// client's connection, the tests' own included): the worker reconnects
/// and handles every message, those published before and after.
#[tokio::test]
async fn serial_close_all_connections_worker_reconnects_and_finishes() {
    crate::support::allow_disruption(
        "closes every client's connection (rabbitmqctl close_all_connections)",
    );
    let (rig, mut w) = ChaosPipe::start(&sleeper("0.1"), &["--concurrency", "2"]).await;
    let before = ids("before", 20);
    rig.publish_and_wait(&before, ("done", 2)).await;

    rabbitmqctl(&["close_all_connections", "dlqctl chaos test"]).await;
    rig.assert_logged(&w, LOST, 1, Duration::from_secs(10))
        .await;
    rig.assert_logged(&w, "consuming", 2, Duration::from_secs(15))
        .await;
    // The test's own connection was closed too.
    let broker = Broker::connect().await;
    let after = ids("after", 10);
    rig.publish(&broker, &after).await;
    let all: Vec<&String> = before.iter().chain(&after).collect();
    rig.assert_all_done(&w, &all, Duration::from_secs(30)).await;
    rig.stop_and_assert_empty(&mut w, &broker).await;
}

/// A second SIGTERM (or SIGINT) during the grace period ends it at once:
/// the handler is stopped and its message returns to the queue, as when the
/// grace runs out, without waiting for the rest of a long `--grace`.
#[tokio::test]
async fn a_second_sigterm_ends_the_grace_period_at_once() {
    let (rig, secs) = ChaosPipe::sleeping(30).await;
    let mut w = rig.spawn(&["--grace", "60s"]);
    let handler_pid = rig.start_slow().await;
    w.signal(libc::SIGTERM);
    // The first signal waits for the handler (60 s of grace)...
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        w.exited().is_none(),
        "stopped before the grace: {}",
        w.output()
    );
    // ...the second does not.
    let sent = Instant::now();
    w.signal(libc::SIGTERM);
    let status = w
        .wait_exit(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("still running 10 s after a second SIGTERM: {}", w.output()));
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(0), "{}", w.output());
    assert!(took < Duration::from_secs(5), "took {took:?} to stop");
    assert!(w.output().contains("SIGTERM again"), "{}", w.output());
    rig.assert_cut_short(&w, handler_pid, &secs).await;
}
