//! `crates/dlqctl/examples/embedded_worker.rs` runs, as a user runs it, against the
//! broker under test (`AMQP_URL`): it is built with cargo, started on a
//! pipeline of the test's own, handles what is published (one message
//! retried once, then done; one dead-lettered at once), and stops with
//! exit 0 on SIGINT. The example uses the crate-root API only, so this is
//! also the test of that API from outside the crate.

use crate::support::worker::{assert_empty, header_str, publish, with_id, PipeFixture};
use crate::support::{broker_env, collect_output};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Builds the example with the profile of this test binary and returns its
/// path. Building (a no-op when `cargo test` or `cargo nextest` already
/// built the examples) means the program run is never an old one.
fn build_example(name: &str) -> PathBuf {
    // This binary is TARGET/PROFILE/deps/integration-HASH.
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("TARGET/PROFILE/deps/");
    let target_dir = profile_dir.parent().expect("TARGET/PROFILE");
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a profile directory name");
    let mut cmd = std::process::Command::new(env!("CARGO"));
    cmd.arg("build")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        // No `--package`: the workspace's default members, as the test
        // build selected them, so the dependencies' features are the same
        // and nothing but the example is built.
        .arg("--example")
        .arg(name);
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.arg("--profile").arg(other);
        }
    }
    let out = cmd.output().expect("run cargo build --example");
    assert!(
        out.status.success(),
        "cargo build --example {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = profile_dir.join("examples").join(name);
    assert!(path.is_file(), "no {}", path.display());
    path
}

/// Waits until `n` lines contain every one of `parts`; panics with the
/// output after `deadline` or when the program exits first.
async fn wait_lines(
    child: &mut tokio::process::Child,
    lines: &Arc<Mutex<Vec<String>>>,
    parts: &[&str],
    n: usize,
    deadline: Duration,
) {
    let start = Instant::now();
    loop {
        let all = lines.lock().unwrap().clone();
        let found = all
            .iter()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .count();
        if found >= n {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            panic!(
                "the example exited ({status}) before {n} lines with {parts:?}:\n{}",
                lines.lock().unwrap().join("\n")
            );
        }
        if start.elapsed() > deadline {
            panic!(
                "wanted {n} lines with {parts:?} within {deadline:?}, got {found}:\n{}",
                all.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn the_embedded_worker_example_retries_dead_letters_and_stops_on_sigint() {
    let example = build_example("embedded_worker");
    // One tier of 1 s: the example's transient failure asks for 1 s too.
    let f = PipeFixture::new(&[1_000], 3, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let queue = &f.pipe.name;

    let mut child = tokio::process::Command::new(&example)
        .arg(&file)
        .arg(queue)
        .envs(broker_env())
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the example");
    let pid = child.id().expect("a pid") as i32;
    let lines = collect_output(&mut child);
    let wait = Duration::from_secs(30);
    wait_lines(&mut child, &lines, &["consuming", queue], 1, wait).await;

    publish(&f.broker, "", queue, b"order 1", with_id("good-1")).await;
    publish(&f.broker, "", queue, b"bad order 2", with_id("bad-2")).await;

    // good-1: a transient failure, retried through the tier, then done.
    wait_lines(
        &mut child,
        &lines,
        &["message handled", "good-1", "retry"],
        1,
        wait,
    )
    .await;
    wait_lines(
        &mut child,
        &lines,
        &["message handled", "good-1", "success"],
        1,
        wait,
    )
    .await;
    // bad-2: permanent, dead-lettered at once.
    wait_lines(
        &mut child,
        &lines,
        &["message handled", "bad-2", "permanent"],
        1,
        wait,
    )
    .await;

    // SIGINT (Ctrl-C): a graceful stop, exit 0.
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our
    // child's, not yet reaped.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the example did not stop on SIGINT:\n{}",
                lines.lock().unwrap().join("\n")
            )
        })
        .expect("wait for the example");
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        lines.lock().unwrap().join("\n")
    );

    // What the broker holds: good-1 acked, bad-2 in the DLQ, why said.
    assert_empty(&f.broker, &f.main_and_retry_queues()).await;
    let dead = f.broker.get(&f.pipe.dlq()).await.expect("bad-2 in the DLQ");
    assert_eq!(dead.data, b"bad order 2");
    assert_eq!(header_str(&dead, "dlqctl-reason"), "permanent");
    assert_eq!(f.broker.get(&f.pipe.dlq()).await.map(|d| d.data), None);
}

/// The README's quick start ends in a replay that succeeds, with the demo
/// handler `topology/demo-handler.sh` on a pipeline of the test's own
/// (short tiers): `bad input` is dead-lettered as permanent and `service
/// down` as exhausted; a canary replay before the fix fails (exit 3, the
/// canary `bad input` came back); once the service is back
/// (`DEMO_SERVICE_UP=1` in the worker's environment), the replay of the
/// exhausted messages passes its canary (exit 0), the worker acks `service
/// down`, and only `bad input` stays in the DLQ.
#[tokio::test]
async fn the_quick_start_reaches_a_replay_that_succeeds() {
    use crate::support::worker::WorkerProc;
    use crate::support::Dlqctl;
    const SECS_30: Duration = Duration::from_secs(30);
    let f = PipeFixture::new(&[100, 200], 3, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let handler = format!("{}/topology/demo-handler.sh", env!("CARGO_MANIFEST_DIR"));
    let mut w = WorkerProc::spawn(&file, &f.pipe.name, &["--", &handler]);
    w.wait_consuming().await;
    publish(&f.broker, "", &f.pipe.name, b"bad input", with_id("bad")).await;
    f.broker.wait_for_count(&f.pipe.dlq(), 1, SECS_30).await;
    publish(
        &f.broker,
        "",
        &f.pipe.name,
        b"service down",
        with_id("down"),
    )
    .await;
    f.broker.wait_for_count(&f.pipe.dlq(), 2, SECS_30).await;
    let replay = |extra: &'static [&'static str]| {
        Dlqctl::new("dlq")
            .arg("replay")
            .arg(&file)
            .args([
                "--queue",
                &f.pipe.name,
                "--canary",
                "1",
                "--canary-wait",
                "3s",
            ])
            .args(extra)
            .run()
    };

    // Before the fix: the canary comes back, the rest stays.
    let before = replay(&[]).await;
    before.assert_code(3);
    assert!(before.output().contains("canary"), "{}", before.output());
    w.stop().await;

    // The service is back: the worker runs again with the fix.
    let mut w = WorkerProc::spawn_with_env(
        &file,
        &f.pipe.name,
        &["--", &handler],
        &[("DEMO_SERVICE_UP", "1")],
    );
    w.wait_consuming().await;
    let after = replay(&["--filter-reason", "exhausted"]).await;
    after.assert_code(0);
    let handled = w.wait_decisions(1, SECS_30).await;
    assert_eq!(handled[0]["decision"], "ack", "{}", w.output());
    assert_eq!(handled[0]["message_id"], "down", "{}", w.output());
    f.broker.wait_for_count(&f.pipe.dlq(), 1, SECS_30).await;
    let left = crate::support::worker::drain(&f.broker, &f.pipe.dlq()).await;
    assert_eq!(left.len(), 1);
    assert_eq!(header_str(&left[0], "dlqctl-reason"), "permanent");
    w.stop().await;
    assert_empty(&f.broker, &f.all_queues()).await;
}
