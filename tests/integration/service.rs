//! Running as a service: `work` and `serve` answer `/healthz` and
//! `/readyz`, the worker's `dlqctl_consuming` gauge, and `work
//! --wait-for-broker`, which keeps trying a broker that is not up yet.
//! The broker that "comes up late" is a relay started on the port the
//! worker already tries.

use crate::support::relay::Relay;
use crate::support::script::Script;
use crate::support::serve::Served;
use crate::support::worker::*;
use crate::support::{amqp_url, eventually, http_get as get};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const SECS_20: Duration = Duration::from_secs(20);

fn broker_addr() -> SocketAddr {
    let url = dlqctl::amqp::connection::BrokerUrl::parse(&amqp_url()).expect("AMQP_URL");
    let endpoint = url.endpoint().replace("localhost", "127.0.0.1");
    endpoint.parse().expect("the test broker's host:port")
}

/// A loopback port nothing listens on (bound, then released).
fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("an address")
}

/// A worker started before its broker is up: `/healthz` answers at once,
/// `/readyz` is 503 and `dlqctl_consuming` 0 while it waits; once the
/// broker appears it consumes (200, gauge 1) and handles a message; when
/// the broker goes away again it is not ready until it is back.
#[tokio::test]
async fn work_waits_for_a_late_broker_and_answers_healthz_and_readyz() {
    let f = PipeFixture::new(&[100], 2, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let script = Script::new(&f.scratch, "h", "exit 0");
    let late = free_port();
    let url = format!("amqp://guest:guest@{late}/%2f");
    let mut w = WorkerProc::with_script(
        &file,
        &f.pipe.name,
        &script,
        &[
            "--url",
            &url,
            "--metrics-addr",
            "127.0.0.1:0",
            "--wait-for-broker",
            "60s",
        ],
    );
    let addr = w.metrics_addr().await;
    w.wait_event(
        "broker not reachable yet; retrying (--wait-for-broker)",
        1,
        SECS_20,
    )
    .await;
    assert_eq!(get(&format!("http://{addr}/healthz")).await.0, 200);
    let (code, body) = get(&format!("http://{addr}/readyz")).await;
    assert_eq!(code, 503, "{body}");
    let (_, metrics) = get(&format!("http://{addr}/metrics")).await;
    assert!(metrics.contains("dlqctl_consuming 0"), "{metrics}");

    // The broker comes up on the address the worker tries.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let relay = Relay::start_on(late, broker_addr()).await;
    w.wait_consuming().await;
    let (code, body) = get(&format!("http://{addr}/readyz")).await;
    assert_eq!(code, 200, "{body}\n{}", w.output());
    let (_, metrics) = get(&format!("http://{addr}/metrics")).await;
    assert!(metrics.contains("dlqctl_consuming 1"), "{metrics}");
    publish(&f.broker, "", &f.pipe.name, b"x", with_id("late-1")).await;
    w.wait_decisions(1, SECS_20).await;

    // The broker goes away: not ready until it is back.
    relay.close();
    eventually("/readyz 503 after the broker left", SECS_20, || async {
        (get(&format!("http://{addr}/readyz")).await.0 == 503).then_some(())
    })
    .await;
    assert_eq!(get(&format!("http://{addr}/healthz")).await.0, 200);
    w.stop().await;
}

/// `--wait-for-broker 0s` gives up at once; a short wait gives up after
/// it, with exit 1 and the connection error; a refused login is not waited
/// for.
#[tokio::test]
async fn work_gives_up_on_an_absent_broker_after_its_wait() {
    let f = PipeFixture::new(&[100], 2, |_| {}).await;
    let file = f.pipe.write(&f.scratch);
    let script = Script::new(&f.scratch, "h", "exit 0");
    let dead = format!("amqp://guest:guest@{}/%2f", free_port());
    for (wait, at_least, at_most) in [("0s", 0, 5_000), ("3s", 3_000, 15_000)] {
        let started = Instant::now();
        let mut w = WorkerProc::with_script(
            &file,
            &f.pipe.name,
            &script,
            &["--url", &dead, "--wait-for-broker", wait],
        );
        let code = w.wait_exit(SECS_20).await;
        let took = started.elapsed().as_millis() as u64;
        assert_eq!(code, Some(1), "--wait-for-broker {wait}:\n{}", w.output());
        assert!(
            took >= at_least && took < at_most,
            "--wait-for-broker {wait}: exited after {took} ms, wanted {at_least}..{at_most} ms"
        );
        assert!(
            w.output().contains("cannot connect to RabbitMQ"),
            "{}",
            w.output()
        );
        let waited = !w
            .events("broker not reachable yet; retrying (--wait-for-broker)")
            .is_empty();
        assert_eq!(waited, wait != "0s", "{}", w.output());
    }
    // A refused login is not waited for: waiting will not fix it.
    let wrong = format!("amqp://guest:not-the-password@{}/%2f", broker_addr());
    let started = Instant::now();
    let mut w = WorkerProc::with_script(
        &file,
        &f.pipe.name,
        &script,
        &["--url", &wrong, "--wait-for-broker", "60s"],
    );
    assert_eq!(w.wait_exit(SECS_20).await, Some(1), "{}", w.output());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a refused login waited"
    );
    assert!(w.output().contains("refused the login"), "{}", w.output());
    assert!(w
        .events("broker not reachable yet; retrying (--wait-for-broker)")
        .is_empty());
    assert!(script.calls().is_empty());
}

/// `serve`'s probes are outside its guard: with a token required and a
/// `Host` the page refuses, `/healthz` and `/readyz` still answer without
/// it, and say nothing more than alive and whether the broker answers.
/// `/readyz` is 503 while the broker is unreachable.
#[tokio::test]
async fn serve_answers_healthz_and_readyz_without_the_token() {
    let f = PipeFixture::new(&[100], 2, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let relay = Relay::start(broker_addr()).await;
    let s = Served::start(
        &file,
        &[
            "--auth-token",
            "0123456789abcdef0123456789abcdef",
            "--url",
            &relay.url(),
        ],
    )
    .await;
    let foreign_host = |r: reqwest::RequestBuilder| r.header("host", "10.1.2.3:8088");
    for path in ["/healthz", "/readyz"] {
        let a = s.send(reqwest::Method::GET, path, foreign_host).await;
        assert_eq!(a.status.as_u16(), 200, "{path}: {}", a.text);
        assert!(
            a.text.starts_with("ok") || a.text.starts_with("ready"),
            "{path}: {}",
            a.text
        );
    }
    // The rest of the server keeps its guard: the page sends to its
    // login, the API wants the token.
    let a = s.send(reqwest::Method::GET, "/", foreign_host).await;
    assert_eq!(a.status.as_u16(), 303, "{}", a.text);
    assert_eq!(a.headers["location"], "/login");
    s.get("/api/overview").await.expect(401);

    relay.close();
    let text = eventually("/readyz 503 with the broker gone", SECS_20, || async {
        let a = s.get("/readyz").await;
        (a.status.as_u16() == 503).then_some(a.text)
    })
    .await;
    assert_eq!(text, "not ready: broker unreachable\n");
    s.get("/healthz").await.expect(200);
}

/// Every `dlqctl_…` metric name the README, the docs and the alerting
/// rules mention, read from the files (a file name such as
/// `dlqctl_handler.py` or `dlqctl_0.1.0-1_amd64.deb` is not one).
fn metric_names_in_docs() -> std::collections::BTreeMap<String, String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = vec![format!("{root}/README.md")];
    for dir in ["docs", "deploy/prometheus", "deploy/kubernetes"] {
        let mut here: Vec<String> = std::fs::read_dir(format!("{root}/{dir}"))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|x| x == "md" || x == "yaml" || x == "yml")
            })
            .map(|p| p.display().to_string())
            .collect();
        here.sort();
        files.extend(here);
    }
    let mut names = std::collections::BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{f}: {e}"));
        let mut rest = text.as_str();
        while let Some(at) = rest.find("dlqctl_") {
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..len];
            let after = &tail[len..];
            // A version after the prefix is a package's name (dlqctl_0.1.0-1_amd64.deb).
            let versioned = name["dlqctl_".len()..].starts_with(|c: char| c.is_ascii_digit());
            let file_name = versioned
                || after.starts_with('.')
                    && after[1..].starts_with(|c: char| c.is_ascii_alphabetic());
            if !file_name {
                names.entry(name.to_string()).or_insert_with(|| f.clone());
            }
            rest = &tail[len..];
        }
    }
    names
}

/// The README and the docs name only metrics that exist: each name (a
/// sample's name, `_total`, `_bucket`, `_sum` and `_count` included) is a
/// family the worker's `/metrics` declares. The names were read from the
/// files; at least the ones the README's metrics list has are among them.
#[tokio::test]
async fn every_metric_the_docs_name_is_on_the_workers_metrics() {
    let names = metric_names_in_docs();
    assert!(
        names.contains_key("dlqctl_decisions_total") && names.len() >= 10,
        "the docs should name the worker's metrics: {names:?}"
    );
    // With a redrive policy: its families appear once a run has counted;
    // with a circuit breaker: its state, since when and its transitions;
    // with idempotency: its counters, from 0.
    let mut f = PipeFixture::new(&[100], 2, |p| {
        p.redrive = Some("{min_age: 1s, every: 1s, canary: 0}".into());
        p.circuit_breaker = Some("{min_calls: 100, open_for: 30s}".into());
    })
    .await;
    f.pipe.idempotency = Some(format!(
        "{{store: 'sqlite:{}'}}",
        f.scratch.path().join("keys.db").display()
    ));
    let (_, _, mut w) = f
        .start_worker("exit 0", &["--metrics-addr", "127.0.0.1:0"])
        .await;
    let addr = w.metrics_addr().await;
    w.wait_consuming().await;
    w.wait_event("redrive run", 1, Duration::from_secs(30))
        .await;
    let (code, body) = get(&format!("http://{addr}/metrics")).await;
    assert_eq!(code, 200);
    let families: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let missing: Vec<String> = names
        .iter()
        .filter(|(name, _)| {
            let family = ["_total", "_bucket", "_sum", "_count", "_created"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            !families.contains(&family) && !families.contains(&name.as_str())
        })
        .map(|(name, file)| format!("{name} (in {file})"))
        .collect();
    assert!(
        missing.is_empty(),
        "named in the docs but not on /metrics: {missing:?}\nfamilies: {families:?}"
    );
    w.stop().await;
}

/// A host name that does not resolve says so, with its own advice, not
/// "is RabbitMQ running?"; a refused port keeps that advice. Exit 1 both.
#[tokio::test]
async fn a_host_that_does_not_resolve_is_told_apart_from_a_broker_that_is_down() {
    let scratch = crate::support::Scratch::new();
    let file = scratch.write("t.yaml", "version: 1\npipelines:\n  - name: orders\n");
    let status = |url: String| {
        crate::support::Dlqctl::new("status")
            .arg(&file)
            .args(["--url", &url])
            .run()
    };
    let dns = status("amqp://guest:guest@no-such-host.invalid:5672/%2f".into()).await;
    dns.assert_code(1);
    let out = dns.output();
    assert!(
        out.contains("the host name `no-such-host.invalid` does not resolve"),
        "{out}"
    );
    assert!(out.contains("check the host name"), "{out}");
    assert!(!out.contains("is RabbitMQ running"), "{out}");
    let down = status(format!("amqp://guest:guest@{}/%2f", free_port())).await;
    down.assert_code(1);
    assert!(
        down.output().contains("is RabbitMQ running"),
        "{}",
        down.output()
    );
}
