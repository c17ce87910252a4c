//! Idempotent handling on every path: each handler kind (a program,
//! `--http`, `--jsonl`, a Rust `Handler`), `--dead-letter nack`, a drill,
//! `rediss://`, the password under `RUST_LOG=trace`, and what `work` says
//! when the store cannot be used at start.

use crate::idempotency::{
    assert_once_each, decided, defer_then_open, fixture, publish_twice, sqlite_block, wait_settled,
    GATED,
};
use crate::support::dependency::Dependency;
use crate::support::redis::RedisServer;
use crate::support::worker::{publish, with_id, WorkerProc};
use crate::support::Dlqctl;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// `--http`: every id published twice reaches the endpoint once (the
/// dependency counts calls by `Idempotency-Key`).
#[tokio::test]
async fn an_http_handler_is_called_once_per_id() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let dep = Dependency::start(true).await;
    let file = f.pipe.provision(&f.scratch).await;
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &["--concurrency", "4", "--http", &dep.hook()],
    );
    w.wait_consuming().await;
    publish_twice(&f, "h-", 15).await;
    wait_settled(&[&w], 15, 15, Duration::from_secs(60)).await;
    let want: BTreeMap<String, u32> = (0..15).map(|k| (format!("h-{k}"), 1)).collect();
    assert_eq!(dep.successes(), want);
    w.stop().await;
}

/// `--jsonl`: each id reaches the long-running process once.
#[tokio::test]
async fn a_jsonl_handler_gets_each_id_once() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let file = f.pipe.provision(&f.scratch).await;
    let log = f.scratch.path().join("handler.log");
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let handler =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/support/jsonl_handler.py");
    let (handler, log_arg) = (handler.display().to_string(), log.display().to_string());
    let args = [
        "--concurrency",
        "4",
        "--jsonl",
        "--",
        python,
        &handler,
        "--log",
        &log_arg,
        "--threads",
        "4",
    ];
    let mut w = WorkerProc::spawn(&file, &f.pipe.name, &args);
    w.wait_consuming().await;
    for k in 0..10 {
        for _ in 0..2 {
            let body = br#"{"do": "success", "delay_ms": 300}"#;
            publish(
                &f.broker,
                "",
                &f.pipe.name,
                body,
                with_id(&format!("j-{k}")),
            )
            .await;
        }
    }
    wait_settled(&[&w], 10, 10, Duration::from_secs(60)).await;
    let mut received: BTreeMap<String, usize> = BTreeMap::new();
    for l in std::fs::read_to_string(&log).unwrap_or_default().lines() {
        let e: Value = serde_json::from_str(l).unwrap_or_default();
        if e["event"] == "received" {
            *received
                .entry(e["message_id"].as_str().unwrap_or("").into())
                .or_insert(0) += 1;
        }
    }
    let want: BTreeMap<String, usize> = (0..10).map(|k| (format!("j-{k}"), 1)).collect();
    assert_eq!(received, want);
    w.stop().await;
}

/// A worker of `f`'s pipeline run in this process around a Rust handler.
struct InProcess {
    metrics: std::sync::Arc<dlqctl::Metrics>,
    stop: dlqctl::CancellationToken,
    run: tokio::task::JoinHandle<dlqctl::Result<()>>,
}

impl InProcess {
    /// Provisions `f`'s pipeline and starts the worker, with `concurrency`
    /// handlers and leases of `lease`.
    async fn start<H: dlqctl::Handler>(
        f: &crate::support::worker::PipeFixture,
        concurrency: usize,
        lease: Duration,
        handler: H,
    ) -> InProcess {
        let file = f.pipe.provision(&f.scratch).await;
        let pipeline = dlqctl::load_pipeline(&file, &f.pipe.name).expect("the pipeline");
        let url = dlqctl::BrokerUrl::parse(&crate::support::amqp_url()).expect("AMQP_URL");
        let mut cfg = dlqctl::WorkerConfig::new(pipeline, url);
        cfg.concurrency = concurrency;
        cfg.prefetch = concurrency as u16;
        cfg.lease = Some(lease);
        let stop = dlqctl::CancellationToken::new();
        let worker = dlqctl::Worker::new(cfg, handler);
        let metrics = worker.metrics();
        let run = tokio::spawn({
            let stop = stop.clone();
            async move { worker.run(stop).await }
        });
        InProcess { metrics, stop, run }
    }

    /// Waits until `dlqctl_duplicates_total` reads `n`; panics with the
    /// metrics after `deadline`.
    async fn wait_duplicates(&self, n: u64, deadline: Duration) {
        let start = Instant::now();
        let want = format!(" {n}");
        loop {
            let text = self.metrics.render();
            if text
                .lines()
                .any(|l| l.starts_with("dlqctl_duplicates_total{") && l.ends_with(&want))
            {
                return;
            }
            assert!(start.elapsed() < deadline, "{text}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.run
            .await
            .expect("the worker task")
            .expect("the worker");
    }
}

/// The library: a Rust `Handler` goes through the same guard, with the
/// lease length from `WorkerConfig`.
#[tokio::test]
async fn a_rust_handler_runs_each_id_once() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
    let counted = seen.clone();
    let handler = dlqctl::handler_fn(move |m: dlqctl::HandlerMessage| {
        let counted = counted.clone();
        async move {
            *counted
                .lock()
                .unwrap()
                .entry(m.message_id.unwrap_or_default())
                .or_insert(0) += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
            dlqctl::Outcome::Success
        }
    });
    let w = InProcess::start(&f, 4, Duration::from_secs(20), handler).await;
    publish_twice(&f, "rs-", 10).await;
    w.wait_duplicates(10, Duration::from_secs(60)).await;
    let want: BTreeMap<String, usize> = (0..10).map(|k| (format!("rs-{k}"), 1)).collect();
    assert_eq!(*seen.lock().unwrap(), want);
    w.stop().await;
}

/// `--dead-letter nack`: a deferral is still a copy to a tier, never a
/// nack, and each id runs once.
#[tokio::test]
async fn with_dead_letter_nack_deferrals_are_copies_and_each_id_runs_once() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let (_file, script, mut w) = f
        .consuming_worker(GATED, &["--concurrency", "2", "--dead-letter", "nack"])
        .await;
    publish_twice(&f, "n-", 10).await;
    defer_then_open(&script, &[&w]).await;
    wait_settled(&[&w], 10, 10, Duration::from_secs(60)).await;
    assert_once_each(&script, "n-", 10);
    let deferred = decided(&[&w], "deferred");
    assert!(!deferred.is_empty(), "{}", w.output());
    assert!(
        deferred.iter().all(|e| e["tier"].is_string()),
        "{deferred:?}"
    );
    assert_eq!(f.broker.message_count(&f.pipe.dlq()).await, Some(0));
    w.stop().await;
}

/// A drill never touches the store: it leaves no key behind, and the
/// drill passes.
#[tokio::test]
async fn a_drill_leaves_no_key_in_the_store() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let (file, _script, mut w) = f.consuming_worker("true", &[]).await;
    let run = Dlqctl::on_queue(&["drill"], &file, &f.pipe.name)
        .args(["--timeout", "60s"])
        .run()
        .await;
    run.assert_code(0);
    w.stop().await;
    let db = f.scratch.path().join("keys.db");
    let c = rusqlite::Connection::open(&db).expect("the store's file");
    let tables: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("its tables");
    let mut rows = 0i64;
    for t in tables {
        rows += c
            .query_row(&format!("SELECT count(*) FROM \"{t}\""), [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap_or(0);
    }
    assert_eq!(rows, 0, "a drill left a key behind");
}

/// `rediss://`: the worker trusts the server's CA through
/// `SSL_CERT_FILE`, and each id runs once.
#[tokio::test]
async fn a_worker_on_rediss_runs_each_id_once() {
    let redis = RedisServer::tls();
    let ca = crate::support::Scratch::new();
    let ca_file = ca.path().join("ca.pem");
    std::fs::write(&ca_file, redis.ca_pem()).expect("write the CA");
    let f = fixture(Some(&format!("{{store: '{}'}}", redis.url()))).await;
    let file = f.pipe.provision(&f.scratch).await;
    let script = crate::support::script::Script::new(&f.scratch, "h", "sleep 0.3");
    let args: Vec<std::ffi::OsString> = vec![
        "--concurrency".into(),
        "2".into(),
        "--".into(),
        script.path.clone().into(),
    ];
    let ca_text = ca_file.display().to_string();
    let mut w =
        WorkerProc::spawn_with_env(&file, &f.pipe.name, &args, &[("SSL_CERT_FILE", &ca_text)]);
    w.wait_consuming().await;
    publish_twice(&f, "t-", 10).await;
    wait_settled(&[&w], 10, 10, Duration::from_secs(60)).await;
    assert_once_each(&script, "t-", 10);
    w.stop().await;
}

/// The store's password, given through `env:NAME`, appears nowhere in a
/// worker's output under `RUST_LOG=trace`, not even when the password is
/// wrong.
#[tokio::test]
async fn the_password_is_absent_under_rust_log_trace() {
    let password = "s3cret-Pa55word-xyzzy";
    let redis = RedisServer::with_password(password);
    let mut f = fixture(Some("{store: 'env:IT_STORE'}")).await;
    let file = f.pipe.provision(&f.scratch).await;
    let script = crate::support::script::Script::new(&f.scratch, "h", "true");
    let args: Vec<std::ffi::OsString> = vec!["--".into(), script.path.clone().into()];
    let url = redis.url();
    let env = [("IT_STORE", url.as_str()), ("RUST_LOG", "trace")];
    let mut w = WorkerProc::spawn_with_env(&file, &f.pipe.name, &args, &env);
    w.wait_consuming().await;
    publish_twice(&f, "pw-", 3).await;
    wait_settled(&[&w], 3, 3, Duration::from_secs(60)).await;
    w.stop().await;
    assert!(w.lines().len() > 20, "trace logs: {}", w.output());
    assert!(
        !w.output().contains(password),
        "the password is in the output"
    );
    // A wrong one: refused at start, exit 1, the password not shown.
    let wrong = redis.url_with_password("wrong-Pa55word-plugh");
    let run = Dlqctl::on_queue(&["work"], &file, &f.pipe.name)
        .env("IT_STORE", &wrong)
        .env("RUST_LOG", "trace")
        .args(["--", "true"])
        .run()
        .await;
    run.assert_code(1);
    assert!(run.stderr.contains("refused"), "{}", run.output());
    assert!(
        !run.output().contains("wrong-Pa55word-plugh"),
        "{}",
        run.output()
    );
    f.pipe.idempotency = None;
}

/// At start: a store that refuses the connection is waited for like the
/// broker, then exit 1 naming it; a missing or read-only SQLite directory
/// is refused at once with exit 1, naming the path.
#[tokio::test]
async fn a_store_that_cannot_be_used_at_start_exits_1_naming_it() {
    let port = crate::support::redis::free_port();
    let f = fixture(Some(&format!("{{store: 'redis://127.0.0.1:{port}/0'}}"))).await;
    let file = f.pipe.provision(&f.scratch).await;
    let run = Dlqctl::on_queue(&["work"], &file, &f.pipe.name)
        .args(["--wait-for-broker", "1s", "--", "true"])
        .run()
        .await;
    run.assert_code(1);
    assert!(
        run.stderr.contains(&format!("127.0.0.1:{port}")),
        "{}",
        run.output()
    );
    assert!(run.stderr.contains("unavailable"), "{}", run.output());
    // A missing directory.
    let missing = f.scratch.path().join("no/such/dir/keys.db");
    let store = format!("sqlite:{}", missing.display());
    let run = Dlqctl::on_queue(&["work"], &file, &f.pipe.name)
        .args(["--idempotency-store", &store, "--", "true"])
        .run()
        .await;
    run.assert_code(1);
    assert!(
        run.stderr.contains(&missing.display().to_string()),
        "{}",
        run.output()
    );
    assert!(run.stderr.contains("does not exist"), "{}", run.output());
    // A read-only directory (root writes anywhere: then run as nobody).
    let ro = f.scratch.path().join("ro");
    std::fs::create_dir(&ro).expect("a directory");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let store = format!("sqlite:{}", ro.join("keys.db").display());
    let bin = env!("CARGO_BIN_EXE_dlqctl");
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        let mut c = tokio::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin]);
        c
    } else {
        tokio::process::Command::new(bin)
    };
    let out = cmd
        .arg("work")
        .arg(&file)
        .args([
            "--queue",
            &f.pipe.name,
            "--idempotency-store",
            &store,
            "--",
            "true",
        ])
        .output()
        .await
        .expect("run dlqctl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&ro.display().to_string()), "{stderr}");
}

/// A `--jsonl` answer of success after the message timed out marks the
/// key: the retry copy (deferred while the lease lasts) is then acked as
/// a duplicate, and the process got the message once.
#[tokio::test]
async fn a_late_jsonl_success_marks_the_key() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let file = f.pipe.provision(&f.scratch).await;
    let log = f.scratch.path().join("handler.log");
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let handler = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/integration/support/jsonl_handler.py")
        .display()
        .to_string();
    let log_arg = log.display().to_string();
    let args = [
        "--handler-timeout",
        "1s",
        "--concurrency",
        "2",
        "--jsonl",
        "--",
        python,
        &handler,
        "--log",
        &log_arg,
        "--threads",
        "2",
    ];
    let mut w = WorkerProc::spawn(&file, &f.pipe.name, &args);
    w.wait_consuming().await;
    let body = br#"{"do": "success", "delay_ms": 2500}"#;
    publish(&f.broker, "", &f.pipe.name, body, with_id("late-1")).await;
    let dup = w
        .wait_event("message not run", 1, Duration::from_secs(30))
        .await;
    let start = Instant::now();
    while !w
        .events("message not run")
        .iter()
        .any(|e| e["decision"] == "duplicate")
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{dup:?}\n{}",
            w.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let received = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"received\""))
        .count();
    assert_eq!(received, 1, "{}", w.output());
    w.stop().await;
}

/// A handler that runs longer than its lease keeps it: the lease is
/// renewed while it runs, so the second copy of its id is deferred (again
/// and again) instead of running beside it, then acked as a duplicate.
#[tokio::test]
async fn a_handler_longer_than_its_lease_keeps_it_by_renewing() {
    let mut f = fixture(None).await;
    f.pipe.idempotency = Some(sqlite_block(&f));
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = dlqctl::handler_fn(move |_m: dlqctl::HandlerMessage| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(4)).await;
            dlqctl::Outcome::Success
        }
    });
    // Renewed every 0.67 s; the handler takes 4 s.
    let w = InProcess::start(&f, 2, Duration::from_secs(2), handler).await;
    publish_twice(&f, "long-", 1).await;
    w.wait_duplicates(1, Duration::from_secs(30)).await;
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    let text = w.metrics.render();
    assert!(
        text.lines()
            .any(|l| l.starts_with("dlqctl_deferrals_total{") && !l.ends_with(" 0")),
        "{text}"
    );
    w.stop().await;
}

/// A database number the server does not have (only the server knows how
/// many it has) is refused at once, naming it: not taken for a store not
/// reachable yet and waited for.
#[tokio::test]
async fn a_database_the_server_does_not_have_is_refused_at_once() {
    let redis = RedisServer::start();
    let mut f = fixture(Some("{store: 'env:IT_STORE'}")).await;
    let file = f.pipe.provision(&f.scratch).await;
    let url = format!("redis://127.0.0.1:{}/99", redis.port());
    let started = std::time::Instant::now();
    let run = Dlqctl::on_queue(&["work"], &file, &f.pipe.name)
        .env("IT_STORE", &url)
        .args(["--", "true"])
        .run()
        .await;
    run.assert_code(1);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waited {:?}: {}",
        started.elapsed(),
        run.output()
    );
    assert!(run.stderr.contains("database 99"), "{}", run.output());
    f.pipe.idempotency = None;
}
