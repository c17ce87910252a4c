//! The worker's readiness beyond "connected and consuming": a worker whose
//! every settle fails (here: its retry exchange deleted, so every retry
//! copy is refused) turns not ready (`/readyz` 503, `dlqctl_ready 0`)
//! after the documented 30 s, keeps `dlqctl_consuming 1`, and is ready
//! again once a settle goes through, having lost nothing.

use crate::support::worker::*;
use crate::support::{eventually, http_get, Broker};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// GET `http://ADDR/PATH`: its status and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_get(&format!("http://{addr}{path}")).await
}

/// The value of the unlabelled metric `name` on `/metrics`.
async fn gauge(addr: SocketAddr, name: &str) -> Option<String> {
    let (_, text) = get(addr, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_string))
}

async fn delete_exchange(b: &Broker, name: &str) {
    b.mgmt
        .request(reqwest::Method::DELETE, &["exchanges", "/", name])
        .await
        .unwrap_or_else(|e| panic!("delete exchange {name}: {e}"));
}

const REFUSED: &str =
    "the broker refused a copy; the original stays unacked, no new handler starts, retrying the publish";

/// The retry exchange deleted while first attempts fail: every retry copy
/// is refused (404, channel closed). The worker keeps consuming and stays
/// ready for a while, then answers 503 with `dlqctl_ready 0` within the
/// documented 30 s (plus the publish backoff), while `dlqctl_consuming`
/// stays 1. The exchange declared again: ready once more, and every
/// message is handled (acked on its second attempt), none lost.
#[tokio::test]
async fn every_settle_failing_turns_the_worker_not_ready_until_one_succeeds() {
    const N: usize = 4;
    let f = PipeFixture::new(&[300], 3, |_| {}).await;
    // First attempt: transient failure; later ones succeed.
    let behaviour = r#"if [ "$DLQCTL_ATTEMPT" = 1 ]; then echo "down" >&2; exit 75; fi; exit 0"#;
    let (file, script, mut w) = f
        .start_worker(
            behaviour,
            &["--metrics-addr", "127.0.0.1:0", "--concurrency", "2"],
        )
        .await;
    let addr = w.metrics_addr().await;
    w.wait_consuming().await;
    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");

    delete_exchange(&f.broker, &f.pipe.retry_exchange()).await;
    f.publish_numbered("ready-", N).await;
    w.wait_event(REFUSED, 1, Duration::from_secs(20)).await;
    let refused_at = Instant::now();

    // Not ready within the stall (30 s) and the publish backoff (5 s) of
    // the first refusal, with margin for the probe's polling.
    let (body, after) = eventually(
        "/readyz 503 while every settle fails",
        Duration::from_secs(45),
        || async {
            let (code, body) = get(addr, "/readyz").await;
            (code == 503).then(|| (body, refused_at.elapsed()))
        },
    )
    .await;
    eprintln!(
        "not ready {:.1} s after the first refusal: {body}",
        after.as_secs_f64()
    );
    assert!(body.contains("every settle has failed"), "{body}");
    assert!(
        after >= Duration::from_secs(20),
        "not ready after only {after:?}: the stall is 30 s\n{}",
        w.output()
    );
    assert_eq!(gauge(addr, "dlqctl_ready").await.as_deref(), Some("0"));
    assert_eq!(gauge(addr, "dlqctl_consuming").await.as_deref(), Some("1"));
    // `status` and the web page, given the worker's metrics page, say so.
    let metrics = format!("http://{addr}/metrics");
    let status = crate::support::Dlqctl::new("status")
        .arg(&file)
        .args(["--metrics-url", &metrics])
        .run()
        .await;
    status.assert_stdout_has(&[&format!("NOT READY worker at {metrics}")]);
    let json = crate::support::Dlqctl::new("status")
        .arg(&file)
        .args(["--metrics-url", &metrics, "--json"])
        .run()
        .await;
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).expect("status JSON");
    assert_eq!(v["workers"][0]["ready"], false, "{v}");
    let page = crate::support::serve::Served::start(&file, &["--metrics-url", &metrics]).await;
    let overview = page.get("/").await.expect(200);
    assert!(
        overview.text.contains("data-test=\"not-ready\""),
        "{}",
        overview.text
    );
    assert_eq!(get(addr, "/healthz").await.0, 200);
    assert_eq!(
        w.events("not ready: every settle has failed for the stall (copies or acks refused); /readyz answers 503 until one goes through").len(),
        1,
        "{}",
        w.output()
    );

    // The exchange (and its bindings) declared again: ready again.
    provision_file(&file).await;
    let again = Instant::now();
    eventually(
        "/readyz 200 once a settle goes through",
        Duration::from_secs(20),
        || async { (get(addr, "/readyz").await.0 == 200).then_some(()) },
    )
    .await;
    eprintln!(
        "ready again {:.1} s after the exchange came back",
        again.elapsed().as_secs_f64()
    );
    assert_eq!(gauge(addr, "dlqctl_ready").await.as_deref(), Some("1"));

    // Nothing lost: every message acked on its second attempt.
    let acked = eventually("every message acked", Duration::from_secs(30), || async {
        let acked: std::collections::BTreeSet<String> = w
            .decisions()
            .iter()
            .filter(|d| d["decision"] == "ack")
            .filter_map(|d| d["message_id"].as_str().map(str::to_string))
            .collect();
        (acked.len() == N).then_some(acked)
    })
    .await;
    let want: std::collections::BTreeSet<String> = (0..N).map(|k| format!("ready-{k}")).collect();
    assert_eq!(acked, want);
    w.stop().await;
    assert_empty(&f.broker, &f.all_queues()).await;
    assert!(script.calls().len() >= 2 * N);
}
