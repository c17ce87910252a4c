//! The circuit breaker in an outage longer than the retry tiers: a real
//! HTTP dependency (`support::dependency`) is down for a few seconds while
//! messages wait; the tests count the attempts the worker spends on it
//! while it is down (its calls answered 503), then bring it back and see
//! every message handled.

use crate::support::dependency::Dependency;
use crate::support::worker::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// How long the dependency stays down: eight times `open_for`, far longer
/// than the tiers (200 ms and 500 ms).
const OUTAGE: Duration = Duration::from_secs(8);
/// Messages published at the start of the outage.
const MESSAGES: usize = 10;
/// Three failures of three calls open the breaker; it stays open 1 s.
const BREAKER: &str = "{failure_rate: 0.5, window: 20s, min_calls: 3, open_for: 1s}";
const MIN_CALLS: u64 = 3;

/// What an outage cost.
struct Outage {
    /// Calls answered 503: attempts spent while the dependency was down.
    attempts_down: u64,
    /// Messages dead-lettered (as `exhausted`) by the end.
    dead_lettered: u32,
    /// Health probes answered during the outage.
    probes_down: u32,
    /// The worker's log and its metrics page at the end.
    worker: WorkerProc,
    metrics: String,
    dep: Dependency,
    f: PipeFixture,
}

/// Runs one outage on a pipeline with tiers 200 ms and 500 ms, three
/// attempts and the breaker above, `concurrency` handlers at once; with
/// `health`, the pipeline's redrive policy names the dependency's health
/// URL (the worker runs with `--no-redrive`: only the breaker uses it).
async fn outage(prefix: &str, health: bool, concurrency: u16) -> Outage {
    let dep = Dependency::start(false).await;
    let health_url = dep.health();
    let f = PipeFixture::new(&[200, 500], 3, |p| {
        p.circuit_breaker = Some(BREAKER.into());
        if health {
            p.redrive = Some(format!("{{min_age: 1h, health: {{http: '{health_url}'}}}}"));
        }
    })
    .await;
    let file = f.pipe.provision(&f.scratch).await;
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &[
            "--http",
            &dep.hook(),
            "--concurrency",
            &concurrency.to_string(),
            "--no-redrive",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let addr = w.metrics_addr().await;
    w.wait_consuming().await;
    let start = Instant::now();
    f.publish_numbered(prefix, MESSAGES).await;
    tokio::time::sleep(OUTAGE.saturating_sub(start.elapsed())).await;
    let attempts_down: u64 = dep.failures().values().map(|n| u64::from(*n)).sum();
    let probes_down = dep.probes();
    dep.set_up(true);
    // Every message ends handled or in the DLQ.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dlq = f.broker.message_count(&f.pipe.dlq()).await.unwrap_or(0);
        if dep.successes().len() + dlq as usize >= MESSAGES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every message was settled 30 s after the outage: {} handled, {dlq} in the DLQ\n{}",
            dep.successes().len(),
            w.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The last success closes nothing more; let the log catch up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("the metrics page")
        .text()
        .await
        .expect("its text");
    w.stop().await;
    let dead_lettered = f.broker.message_count(&f.pipe.dlq()).await.unwrap_or(0);
    eprintln!(
        "outage of {OUTAGE:?} (health probe: {health}, concurrency {concurrency}): \
         {attempts_down} attempts spent while the dependency was down, {probes_down} health \
         probes, {dead_lettered} of {MESSAGES} messages dead-lettered"
    );
    Outage {
        attempts_down,
        dead_lettered,
        probes_down,
        worker: w,
        metrics,
        dep,
        f,
    }
}

/// The breaker's state changes, in order, from its log lines.
fn transitions(w: &WorkerProc) -> Vec<String> {
    w.lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|ev| ev["fields"]["circuit"].is_string())
        .map(|ev| {
            ev["fields"]["circuit"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// Without a health URL: after opening, each `open_for` lets one message
/// through as a probe, whose failure reopens the breaker at once. The
/// outage costs the three runs that opened it and about one probe a
/// second, not `min_calls` runs a second; no message is exhausted; once
/// the dependency is back a probe closes it and every message is handled
/// once.
#[tokio::test]
async fn in_an_outage_the_breaker_spends_one_probe_per_open_for() {
    let o = outage("cb-probe-", false, 1).await;
    let cycles = OUTAGE.as_secs(); // open_for is 1 s
    assert!(
        o.attempts_down <= MIN_CALLS + cycles + 1,
        "{} attempts spent in an outage of {OUTAGE:?}: wanted at most {} ({MIN_CALLS} to open, \
         then one probe per open_for)\n{}",
        o.attempts_down,
        MIN_CALLS + cycles + 1,
        o.worker.output()
    );
    assert_eq!(o.dead_lettered, 0, "{}", o.worker.output());
    let handled = o.dep.successes();
    assert_eq!(handled.len(), MESSAGES, "{handled:?}");
    assert!(handled.values().all(|n| *n == 1), "{handled:?}");
    let seen = transitions(&o.worker);
    assert_eq!(seen.first().map(String::as_str), Some("open"), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("closed"), "{seen:?}");
    // Every open ends in a half-open; every half-open ends open or closed.
    for pair in seen.windows(2) {
        let ok = matches!(
            (pair[0].as_str(), pair[1].as_str()),
            ("open", "half_open")
                | ("half_open", "open")
                | ("half_open", "closed")
                | ("closed", "open")
        );
        assert!(ok, "{pair:?} in {seen:?}");
    }
    let q = &o.f.pipe.name;
    for line in [
        format!("dlqctl_circuit_state{{queue=\"{q}\"}} 0"),
        format!("dlqctl_circuit_transitions_total{{queue=\"{q}\",to=\"closed\"}} 1"),
        "dlqctl_circuit_open 0".to_string(),
    ] {
        assert!(o.metrics.contains(&line), "{line} in\n{}", o.metrics);
    }
    let opened = seen.iter().filter(|t| *t == "open").count();
    assert!(
        o.metrics.contains(&format!(
            "dlqctl_circuit_transitions_total{{queue=\"{q}\",to=\"open\"}} {opened}"
        )),
        "{opened} opens in\n{}",
        o.metrics
    );
}

/// With four handlers at once: the runs in flight when it opened finish
/// (three more at most), then half-open admits one probe and no other
/// handler while it runs, so the outage still costs about one attempt per
/// `open_for`, not four.
#[tokio::test]
async fn with_four_handlers_half_open_still_runs_one_probe_at_a_time() {
    let o = outage("cb-four-", false, 4).await;
    let cycles = OUTAGE.as_secs();
    let bound = MIN_CALLS + 3 + cycles + 1;
    assert!(
        o.attempts_down <= bound,
        "{} attempts spent in an outage of {OUTAGE:?} with four handlers: wanted at most \
         {bound}\n{}",
        o.attempts_down,
        o.worker.output()
    );
    let handled = o.dep.successes();
    assert_eq!(handled.len() as u32 + o.dead_lettered, MESSAGES as u32);
    assert!(handled.values().all(|n| *n == 1), "{handled:?}");
}

/// With the pipeline's health URL: once open, the breaker asks the URL
/// instead of spending a message. The outage costs exactly the three runs
/// that opened it; the probes answer 503 until the dependency is back,
/// then a 200 closes it and every message is handled once.
#[tokio::test]
async fn with_a_health_url_the_breaker_probes_it_instead_of_a_message() {
    let o = outage("cb-health-", true, 1).await;
    assert_eq!(
        o.attempts_down,
        MIN_CALLS,
        "attempts spent in an outage of {OUTAGE:?}: only the runs that opened the breaker\n{}",
        o.worker.output()
    );
    assert!(
        o.probes_down >= 4,
        "{} health probes in {OUTAGE:?} with open_for 1s\n{}",
        o.probes_down,
        o.worker.output()
    );
    assert_eq!(o.dead_lettered, 0, "{}", o.worker.output());
    let handled = o.dep.successes();
    assert_eq!(handled.len(), MESSAGES, "{handled:?}");
    assert!(handled.values().all(|n| *n == 1), "{handled:?}");
    let seen = transitions(&o.worker);
    assert_eq!(seen.last().map(String::as_str), Some("closed"), "{seen:?}");
    let probes = o.worker.events("circuit breaker health probe");
    assert!(
        probes
            .iter()
            .any(|p| p["answer"].as_str().unwrap_or_default().starts_with("503")),
        "{probes:#?}"
    );
}

/// While the breaker is open and messages wait, `doctor`, `status` and
/// `drill`, given the worker's metrics page, say so: doctor warns naming
/// since when, status shows it (text and JSON), and a drill that times out
/// names the breaker instead of "no broken step found".
#[tokio::test]
async fn doctor_status_and_drill_see_the_open_breaker() {
    use crate::support::Dlqctl;
    let dep = Dependency::start(false).await;
    // Two failures open it, for longer than the test.
    let f = PipeFixture::new(&[200], 2, |p| {
        p.circuit_breaker =
            Some("{failure_rate: 0.5, window: 1m, min_calls: 2, open_for: 10m}".into());
    })
    .await;
    let file = f.pipe.provision(&f.scratch).await;
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &["--http", &dep.hook(), "--metrics-addr", "127.0.0.1:0"],
    );
    let url = format!("http://{}/metrics", w.metrics_addr().await);
    w.wait_consuming().await;
    let q = f.pipe.name.clone();

    // Closed: doctor passes the breaker, status shows it closed.
    let run = Dlqctl::new("doctor")
        .arg(&file)
        .args(["--metrics-url", &url])
        .run()
        .await;
    assert!(
        run.stdout
            .contains("  pass  health       circuit breaker: closed since "),
        "{}",
        run.output()
    );

    f.publish_numbered("cb-seen-", 4).await;
    w.wait_event(
        "circuit breaker open: pausing consumption",
        1,
        Duration::from_secs(20),
    )
    .await;

    let run = Dlqctl::new("doctor")
        .arg(&file)
        .args(["--metrics-url", &url])
        .run()
        .await;
    eprintln!("{}", run.stdout);
    run.assert_code(0);
    assert!(
        run.stdout
            .contains("  warn  health       circuit breaker: the circuit breaker is open since ")
            && run
                .stdout
                .contains(&format!("messages wait in {q} until it closes")),
        "{}",
        run.output()
    );

    let run = Dlqctl::new("status")
        .arg(&file)
        .args(["--metrics-url", &url])
        .run()
        .await;
    run.assert_code(0);
    assert!(
        run.stdout
            .contains(&format!("CIRCUIT {q}: the circuit breaker is open since ")),
        "{}",
        run.output()
    );
    let run = Dlqctl::new("status")
        .arg(&file)
        .args(["--json", "--metrics-url", &url])
        .run()
        .await;
    let doc: Value = serde_json::from_str(&run.stdout).expect("status --json");
    assert_eq!(doc["pipelines"][0]["circuit"]["state"], "open", "{doc:#}");
    assert!(
        doc["pipelines"][0]["circuit"]["since"].is_string(),
        "{doc:#}"
    );
    // The web page, given the same page: the pipeline is a warning, with
    // the breaker's badge.
    let page = crate::support::serve::Served::start(&file, &["--metrics-url", &url]).await;
    let overview = page.get("/").await.expect(200);
    let t = &overview.text;
    assert!(
        t.contains(&format!("data-pipeline=\"{q}\" data-health=\"warning\""))
            && t.contains("data-test=\"circuit\"")
            && t.contains("breaker open since "),
        "{t}"
    );
    drop(page);
    // Without the page, status says nothing of a breaker.
    let run = Dlqctl::new("status").arg(&file).run().await;
    assert!(!run.stdout.contains("CIRCUIT"), "{}", run.output());
    // An unreadable page is said.
    let run = Dlqctl::new("status")
        .arg(&file)
        .args(["--metrics-url", "http://127.0.0.1:1/metrics"])
        .run()
        .await;
    assert!(
        run.stdout.contains("circuit breakers unknown (cannot read"),
        "{}",
        run.output()
    );

    let run = Dlqctl::on_queue(&["drill"], &file, &q)
        .args(["--metrics-url", &url, "--timeout", "3s"])
        .run()
        .await;
    eprintln!("{}", run.stdout);
    run.assert_code(3);
    run.assert_stdout_has(&["fail at step `dlq`", "the circuit breaker is open since "]);
    assert!(
        !run.stdout.contains("no broken step found"),
        "{}",
        run.output()
    );
    // Two runs opened it; the other messages and the drill's wait.
    let spent: u32 = dep.failures().values().sum();
    assert_eq!(spent, 2, "{}", w.output());
    w.stop().await;
}

/// A breaker that opens while the worker waits for a message (more handler
/// slots than messages, and nothing more to come) still turns half-open
/// after `open_for` and asks its health URL: once the dependency is back it
/// closes without any message, and `dlqctl_circuit_open` goes back to 0
/// (no alert for an idle worker whose dependency recovered).
#[tokio::test]
async fn an_idle_worker_probes_and_closes_its_breaker_on_time() {
    let dep = Dependency::start(false).await;
    let health_url = dep.health();
    // One attempt: the failures go to the DLQ, nothing comes back.
    let f = PipeFixture::new(&[200], 1, |p| {
        p.circuit_breaker = Some(BREAKER.into());
        p.redrive = Some(format!("{{min_age: 1h, health: {{http: '{health_url}'}}}}"));
    })
    .await;
    let file = f.pipe.provision(&f.scratch).await;
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &[
            "--http",
            &dep.hook(),
            "--concurrency",
            "4",
            "--no-redrive",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let addr = w.metrics_addr().await;
    w.wait_consuming().await;
    f.publish_numbered("cb-idle-", 3).await;
    w.wait_event(
        "circuit breaker open: pausing consumption",
        1,
        Duration::from_secs(20),
    )
    .await;
    f.broker
        .wait_for_count(&f.pipe.dlq(), 3, Duration::from_secs(20))
        .await;
    dep.set_up(true);
    w.wait_event(
        "circuit breaker closed: resuming consumption",
        1,
        Duration::from_secs(10),
    )
    .await;
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("the metrics page")
        .text()
        .await
        .expect("its text");
    w.stop().await;
    assert!(dep.probes() >= 1);
    for line in [
        format!("dlqctl_circuit_state{{queue=\"{}\"}} 0", f.pipe.name),
        "dlqctl_circuit_open 0".to_string(),
    ] {
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}
