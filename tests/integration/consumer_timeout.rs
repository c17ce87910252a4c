//! `dlqctl work` against the main queue's consumer timeout: a handler
//! timeout the broker cannot wait for refuses to start (exit 1, before
//! consuming anything), naming the policy and both values; the prefetch
//! multiplies it (a delivery's clock starts when it is delivered); a
//! policy that appears while the worker runs is logged as an error and
//! counted. The policy runs where the broker knows the key (3.11.15 and
//! later; 4.3.6 in CI); 3.10.8 refuses it, which is asserted instead.

use crate::support::policy::{Kind, PolicyGuard};
use crate::support::script::Script;
use crate::support::worker::*;
use crate::support::{amqp_url, eventually, management_url};
use serde_json::json;
use std::time::Duration;

const SECS_20: Duration = Duration::from_secs(20);

/// Whether the broker of `f` has per-queue consumer timeouts (3.11.15
/// and later).
async fn has_per_queue_timeouts(f: &PipeFixture) -> bool {
    let (major, minor) = f.broker.version().await;
    // 3.11.x below 3.11.15 is not among the test brokers.
    (major, minor) >= (3, 12)
}

/// `PUT` a `consumer-timeout` policy on 3.10: refused as an unknown key.
async fn assert_the_policy_key_is_refused(f: &PipeFixture) {
    let login = dlqctl::amqp::connection::BrokerUrl::parse(&amqp_url()).expect("AMQP_URL");
    let name = f.cleanup.name("ct");
    let url = format!("{}/api/policies/%2f/{name}", management_url());
    let resp = reqwest::Client::new()
        .put(&url)
        .basic_auth(login.user(), Some(login.password()))
        .json(&json!({
            "pattern": format!("^{}$", f.pipe.name),
            "definition": {"consumer-timeout": 4000},
            "priority": 999,
            "apply-to": "queues",
        }))
        .send()
        .await
        .expect("PUT the policy");
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap_or_default();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not recognised policy settings"), "{body}");
}

/// A `consumer-timeout` policy of 4 s on the test's main queue only, and
/// `--handler-timeout 12s`: `work` exits 1 naming the policy, 12s and 4s,
/// without taking the message waiting in the queue. Under it, the worker
/// starts and handles the message. Then a policy of 2 s replaces it
/// while the worker runs (handler timeout 3 s): within the minute the
/// worker logs the error and counts it.
#[tokio::test]
async fn work_refuses_a_handler_timeout_at_or_above_the_queues_consumer_timeout() {
    let f = PipeFixture::new(&[1000], 3, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let script = Script::new(&f.scratch, "h", "exit 0");
    if !has_per_queue_timeouts(&f).await {
        assert_the_policy_key_is_refused(&f).await;
        eprintln!("this broker has no per-queue consumer timeout: the policy part does not apply");
        return;
    }
    publish(&f.broker, "", &f.pipe.name, b"x", with_id("waits")).await;
    let queue = format!("{}$", "orders");
    let policy = PolicyGuard::set(
        &f.cleanup,
        Kind::Policy,
        "ct4",
        &queue,
        json!({"consumer-timeout": 4000}),
    )
    .await;
    policy
        .wait_applied(&f.broker, std::slice::from_ref(&f.pipe.name))
        .await;

    let mut w =
        WorkerProc::with_script(&file, &f.pipe.name, &script, &["--handler-timeout", "12s"]);
    assert_eq!(w.wait_exit(SECS_20).await, Some(1), "{}", w.output());
    let out = w.output();
    for part in [
        format!("policy `{}`", policy.name),
        "the handler timeout 12s".into(),
        "consumer timeout 4s".into(),
        "runs twice".into(),
    ] {
        assert!(out.contains(&part), "no {part:?} in\n{out}");
    }
    assert!(w.events("consuming").is_empty(), "{out}");
    assert!(script.calls().is_empty());
    assert_eq!(f.broker.message_count(&f.pipe.name).await, Some(1));

    // Under the policy's 4 s it starts, and the worker re-reads the
    // timeout while it runs.
    let mut w = WorkerProc::with_script(
        &file,
        &f.pipe.name,
        &script,
        &["--handler-timeout", "3s", "--metrics-addr", "127.0.0.1:0"],
    );
    let addr = w.metrics_addr().await;
    w.wait_decisions(1, SECS_20).await;
    drop(policy);
    let lower = PolicyGuard::set(
        &f.cleanup,
        Kind::Policy,
        "ct2",
        &queue,
        json!({"consumer-timeout": 2000}),
    )
    .await;
    lower
        .wait_applied(&f.broker, std::slice::from_ref(&f.pipe.name))
        .await;
    let ev = w
        .wait_event(
            "the handler timeout is too long for the queue's consumer timeout, which changed while the worker runs",
            1,
            Duration::from_secs(75),
        )
        .await;
    let message = ev[0]["reason"].as_str().unwrap_or_default();
    let logged_as_error = w.lines().iter().any(|l| {
        l.contains("\"level\":\"ERROR\"") && l.contains("which changed while the worker runs")
    });
    assert!(logged_as_error, "{}", w.output());
    assert!(
        message.contains(&format!("policy `{}`", lower.name)) && message.contains("2s"),
        "{message}"
    );
    let counted = eventually("the conflict counted", SECS_20, || async {
        let text = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("dlqctl_consumer_timeout_conflicts_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| *v >= 1.0)
    })
    .await;
    eprintln!("dlqctl_consumer_timeout_conflicts_total {counted}");
    w.stop().await;
}

/// The broker's clock starts at delivery, so a prefetched delivery waits
/// behind the ones in front of it: `--handler-timeout 10m` with
/// `--prefetch 3` and one handler at a time may leave a message unacked
/// for 30 minutes, the broker's default consumer timeout (no policy here,
/// so this runs on 3.10 as on 4.3): refused, naming the product and the
/// default. `--prefetch 2` (20 minutes) starts.
#[tokio::test]
async fn work_counts_prefetched_deliveries_against_the_consumer_timeout() {
    let f = PipeFixture::new(&[1000], 3, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let script = Script::new(&f.scratch, "h", "exit 0");
    publish(&f.broker, "", &f.pipe.name, b"x", with_id("waits")).await;
    let mut w = WorkerProc::with_script(
        &file,
        &f.pipe.name,
        &script,
        &["--handler-timeout", "10m", "--prefetch", "3"],
    );
    assert_eq!(w.wait_exit(SECS_20).await, Some(1), "{}", w.output());
    let out = w.output();
    for part in [
        "the handler timeout 10m × 3",
        "⌈prefetch 3 / concurrency 1⌉",
        "= 30m is not under the consumer timeout 30m",
        "the broker's default consumer_timeout",
        "--prefetch",
    ] {
        assert!(out.contains(part), "no {part:?} in\n{out}");
    }
    assert!(script.calls().is_empty());
    assert_eq!(f.broker.message_count(&f.pipe.name).await, Some(1));

    let mut w = WorkerProc::with_script(
        &file,
        &f.pipe.name,
        &script,
        &["--handler-timeout", "10m", "--prefetch", "2"],
    );
    w.wait_decisions(1, SECS_20).await;
    w.stop().await;
}

/// Without the management API the worker cannot read the consumer
/// timeout: it warns and starts (here with a handler timeout that the
/// default 30 minutes would refuse).
#[tokio::test]
async fn work_without_the_management_api_warns_and_starts() {
    let f = PipeFixture::new(&[1000], 3, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let script = Script::new(&f.scratch, "h", "exit 0");
    let mut w = WorkerProc::with_script(
        &file,
        &f.pipe.name,
        &script,
        &[
            "--handler-timeout",
            "45m",
            "--management-url",
            "http://127.0.0.1:1",
        ],
    );
    w.wait_consuming().await;
    let warned = w.events("cannot read the queue's consumer timeout through the management API: starting without checking the handler timeout against it (`dlqctl doctor` checks it)");
    assert_eq!(warned.len(), 1, "{}", w.output());
    w.stop().await;
}
