//! `dlqctl status` against a real broker: depths asserted on known
//! contents, `--max-dlq` exit codes, unacked messages held by a reader, and
//! missing objects.

use crate::support::worker::Pipe;
use crate::support::{Broker, Cleanup, Dlqctl, Run, Scratch};
use lapin::options::BasicGetOptions;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

async fn status(file: &Path, extra: &[&str]) -> Run {
    Dlqctl::new("status").arg(file).args(extra).run().await
}

fn json(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("status --json: {e}\n{}", run.output()))
}

/// A pipeline whose 1-minute tier keeps what it is given during the test.
async fn fixture() -> (Broker, Cleanup, Scratch, Pipe, std::path::PathBuf) {
    let broker = Broker::connect().await;
    let cleanup = Cleanup::new();
    let scratch = Scratch::new();
    let pipe = Pipe::new(&cleanup, &[60_000], 3);
    let file = pipe.provision(&scratch).await;
    (broker, cleanup, scratch, pipe, file)
}

#[tokio::test]
async fn status_shows_each_queues_depth_and_the_threshold_sets_the_exit_code() {
    let (b, _c, _s, pipe, file) = fixture().await;
    for _ in 0..3 {
        b.publish("", &pipe.name, b"m").await;
    }
    b.publish("", &pipe.retry_queue(60_000), b"t").await;
    for _ in 0..2 {
        b.publish("", &pipe.dlq(), b"d").await;
    }
    let run = status(&file, &["--json"]).await;
    run.assert_code(0);
    let doc = json(&run);
    assert_eq!(doc["status"], "ok", "{doc:#}");
    let p = &doc["pipelines"][0];
    assert_eq!(p["name"], pipe.name.as_str());
    assert_eq!(p["main"]["ready"], 3, "{doc:#}");
    assert_eq!(p["main"]["consumers"], 0, "{doc:#}");
    assert_eq!(p["tiers"][0]["tier"], "1m", "{doc:#}");
    assert_eq!(p["tiers"][0]["ready"], 1, "{doc:#}");
    assert_eq!(p["dlq"]["name"], pipe.dlq().as_str());
    assert_eq!(p["dlq"]["ready"], 2, "{doc:#}");

    // The table names every queue; more than N in a DLQ is exit 3.
    let run = status(&file, &["--max-dlq", "1"]).await;
    run.assert_code(3);
    assert!(
        run.stdout.contains(&format!(
            "over --max-dlq 1: {} holds 2 message(s)",
            pipe.dlq()
        )),
        "{}",
        run.stdout
    );
    for q in [pipe.name.clone(), pipe.retry_queue(60_000), pipe.dlq()] {
        assert!(run.stdout.contains(&q), "{q} not in\n{}", run.stdout);
    }
    status(&file, &["--max-dlq", "2"]).await.assert_code(0);
    let run = status(&file, &["--max-dlq", "1", "--json"]).await;
    run.assert_code(3);
    assert_eq!(json(&run)["over_threshold"][0]["messages"], 2);
}

/// A message a reader holds unacked (a running peek, say) still counts
/// toward `--max-dlq`; the management API's count lags, so poll for it.
#[tokio::test]
async fn unacked_dlq_messages_count_toward_the_threshold() {
    let (b, _c, _s, pipe, file) = fixture().await;
    b.publish("", &pipe.dlq(), b"d1").await;
    b.publish("", &pipe.dlq(), b"d2").await;
    let ch = b.channel().await;
    let held = ch
        .basic_get(
            pipe.dlq().as_str().into(),
            BasicGetOptions { no_ack: false },
        )
        .await
        .expect("basic.get")
        .expect("a message");
    let start = Instant::now();
    loop {
        let run = status(&file, &["--json", "--max-dlq", "1"]).await;
        let doc = json(&run);
        let dlq = &doc["pipelines"][0]["dlq"];
        if dlq["unacked"] == 1 {
            assert_eq!(dlq["ready"], 1, "{doc:#}");
            run.assert_code(3);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the unacked message never showed: {doc:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(held);
    let _ = ch.close(200, "done".into()).await;
}

#[tokio::test]
async fn a_missing_queue_is_reported_without_hiding_the_others_and_exits_3() {
    let (b, _c, _s, pipe, file) = fixture().await;
    b.publish("", &pipe.dlq(), b"d").await;
    let ch = b.channel().await;
    ch.queue_delete(pipe.retry_queue(60_000).as_str().into(), Default::default())
        .await
        .expect("delete the tier");
    let run = status(&file, &[]).await;
    run.assert_code(3);
    assert!(run.stdout.contains("MISSING"), "{}", run.stdout);
    assert!(run.stdout.contains("1 object(s) missing"), "{}", run.stdout);
    let run = status(&file, &["--json"]).await;
    run.assert_code(3);
    let doc = json(&run);
    assert_eq!(doc["status"], "missing");
    assert_eq!(
        doc["missing"][0],
        format!("queue {}", pipe.retry_queue(60_000))
    );
    assert_eq!(doc["pipelines"][0]["dlq"]["ready"], 1, "{doc:#}");
    assert_eq!(doc["pipelines"][0]["tiers"][0]["exists"], false);
}

#[tokio::test]
async fn without_the_management_api_unacked_counts_are_unknown() {
    let (_b, _c, _s, _pipe, file) = fixture().await;
    let run = status(&file, &["--management-url", "http://127.0.0.1:1"]).await;
    run.assert_code(0);
    assert!(run.stdout.contains("unknown"), "{}", run.stdout);
    assert!(
        run.stdout.contains("--max-dlq counts ready messages only"),
        "{}",
        run.stdout
    );
    let doc = json(&status(&file, &["--json", "--management-url", "http://127.0.0.1:1"]).await);
    assert_eq!(
        doc["pipelines"][0]["dlq"]["unacked"],
        Value::Null,
        "{doc:#}"
    );
    assert!(doc["management_unavailable"].is_string(), "{doc:#}");
}

/// A full quorum DLQ refuses a dead-letter: the main queue keeps the
/// message outside its ready count, and only the management API's
/// `messages_dlx` shows it.
#[tokio::test]
async fn a_message_held_for_a_full_dlq_shows_as_held_for_dlx() {
    let broker = Broker::connect().await;
    let cleanup = Cleanup::new();
    let scratch = Scratch::new();
    let mut pipe = Pipe::new(&cleanup, &[60_000], 3);
    pipe.dlq_max_length = Some(1);
    let file = pipe.provision(&scratch).await;
    // Fill the DLQ until it refuses (quorum overshoots by one or two).
    for _ in 0..10 {
        let filler = broker
            .try_publish("", &pipe.dlq(), b"filler", Default::default())
            .await;
        if filler.is_err() {
            break;
        }
    }
    broker.publish("", &pipe.name, b"refused by the DLQ").await;
    let ch = broker.channel().await;
    let d = ch
        .basic_get(pipe.name.as_str().into(), BasicGetOptions { no_ack: false })
        .await
        .expect("basic.get")
        .expect("a message");
    d.nack(lapin::options::BasicNackOptions {
        requeue: false,
        multiple: false,
    })
    .await
    .expect("nack");
    let start = Instant::now();
    loop {
        let doc = json(&status(&file, &["--json"]).await);
        let main = &doc["pipelines"][0]["main"];
        if main["messages_dlx"] == 1 {
            assert_eq!(main["ready"], 0, "{doc:#}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "messages_dlx never showed: {doc:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let run = status(&file, &[]).await;
    assert!(run.stdout.contains("HELD-FOR-DLX"), "{}", run.stdout);
}

/// Issue 30, item 7: a policy `{"message-ttl":2000,"max-length":3,
/// "overflow":"drop-head"}` on the DLQ drops dead letters while the DLQ's
/// depth stays under any threshold. `status` names the policy and each key
/// it overrides, and exits 3 even under `--max-dlq 0`.
#[tokio::test]
async fn a_policy_that_drops_dead_letters_fails_status() {
    use crate::support::policy::{Kind, PolicyGuard};
    let (b, c, _s, pipe, file) = fixture().await;
    status(&file, &["--max-dlq", "0"]).await.assert_code(0);
    let dlq_pattern = "orders\\.dlq$";
    let p = PolicyGuard::set(
        &c,
        Kind::Policy,
        "drops",
        dlq_pattern,
        serde_json::json!({"message-ttl": 2000, "max-length": 3, "overflow": "drop-head"}),
    )
    .await;
    p.wait_applied(&b, &[pipe.dlq()]).await;

    let run = status(&file, &["--max-dlq", "0"]).await;
    run.assert_code(3);
    let dlq = pipe.dlq();
    // The DLQ has no overflow argument: drop-head is what a quorum queue
    // does anyway, so the limit is the override, and its note says that
    // it drops.
    for key in [
        "message-ttl: effective 2000",
        "max-length: effective 3, wanted none (the topology leaves this queue unbounded; when full, overflow drop-head drops its oldest messages",
    ] {
        let line = format!("POLICY queue {dlq}: policy `{}` overrides {key}", p.name);
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    // Only the DLQ is named.
    assert_eq!(run.stdout.matches("POLICY ").count(), 2, "{}", run.stdout);

    let run = status(&file, &["--json"]).await;
    run.assert_code(3);
    let doc = json(&run);
    assert_eq!(doc["status"], "policy_overrides", "{doc:#}");
    let overrides = doc["policy_overrides"].as_array().expect("a list");
    assert_eq!(overrides.len(), 2, "{doc:#}");
    assert!(
        overrides
            .iter()
            .all(|f| f["name"] == dlq.as_str() && f["policy"] == p.name.as_str()),
        "{doc:#}"
    );
}

/// A worker's metrics page of fixed text, served on a port of its own.
struct StaticPage {
    addr: std::net::SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl StaticPage {
    async fn start(text: String) -> StaticPage {
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let text = text.clone();
                async move { text }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        StaticPage { addr, server }
    }

    fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }
}

impl Drop for StaticPage {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Two workers' pages as `dlqctl work` writes them for a pipeline with
/// `idempotency`.
fn guarded_page(queue: &str, duplicates: u64, deferrals: u64) -> String {
    format!(
        "# TYPE dlqctl_duplicates counter\n\
         dlqctl_duplicates_total{{queue=\"{queue}\"}} {duplicates}\n\
         # TYPE dlqctl_deferrals counter\n\
         dlqctl_deferrals_total{{queue=\"{queue}\"}} {deferrals}\n\
         dlqctl_ready 1\n# EOF\n"
    )
}

#[tokio::test]
async fn status_and_the_web_page_show_duplicates_skipped_and_deferrals() {
    let (_b, _c, _s, pipe, file) = fixture().await;
    let q = pipe.name.clone();
    let one = StaticPage::start(guarded_page(&q, 3, 1)).await;
    let two = StaticPage::start(guarded_page(&q, 2, 0)).await;

    let run = status(&file, &["--metrics-url", &one.url()]).await;
    run.assert_code(0);
    assert!(
        run.stdout.contains(&format!(
            "idempotency of {q}: 3 duplicates skipped, 1 deferral\n"
        )),
        "{}",
        run.output()
    );
    let run = status(&file, &["--json", "--metrics-url", &two.url()]).await;
    run.assert_code(0);
    let doc = json(&run);
    assert_eq!(
        doc["pipelines"][0]["idempotency"],
        serde_json::json!({"duplicates": 2, "deferrals": 0}),
        "{doc:#}"
    );
    // Several workers' pages: summed (--metrics-url is repeatable).
    let run = status(
        &file,
        &[
            "--json",
            "--metrics-url",
            &one.url(),
            "--metrics-url",
            &two.url(),
        ],
    )
    .await;
    run.assert_code(0);
    assert_eq!(
        json(&run)["pipelines"][0]["idempotency"],
        serde_json::json!({"duplicates": 5, "deferrals": 1}),
        "{}",
        run.output()
    );
    // Without a page, or with a page that does not count them: nothing.
    let run = status(&file, &["--json"]).await;
    assert!(json(&run)["pipelines"][0].get("idempotency").is_none());
    let other = StaticPage::start(guarded_page("another-pipeline", 5, 5)).await;
    let run = status(&file, &["--metrics-url", &other.url()]).await;
    assert!(!run.stdout.contains("idempotency of"), "{}", run.output());

    // The web page adds up every worker's page, under the pipeline's name.
    let page = crate::support::serve::Served::start(
        &file,
        &["--metrics-url", &one.url(), "--metrics-url", &two.url()],
    )
    .await;
    let overview = page.get("/").await.expect(200);
    assert!(
        overview.text.contains("data-test=\"idempotency\"")
            && overview.text.contains("5 duplicates skipped, 1 deferral"),
        "{}",
        overview.text
    );
    let api = page.get("/api/overview").await.expect(200);
    let doc: Value = serde_json::from_str(&api.text).expect("JSON");
    assert_eq!(
        doc["pipelines"][0]["idempotency"],
        serde_json::json!({"duplicates": 5, "deferrals": 1}),
        "{doc:#}"
    );
}

/// A worker guarding a pipeline with an SQLite store: status, given its
/// metrics page, shows the pipeline at 0 before any duplicate, then the
/// duplicate a second copy of a handled id was.
///
/// Needs the real stores (`idempotency::open`): fails while `open` is a
/// placeholder.
#[tokio::test]
async fn status_counts_the_duplicates_a_guarding_worker_skipped() {
    use crate::support::script::Script;
    use crate::support::worker::{publish, with_id, PipeFixture, WorkerProc};
    let f = PipeFixture::new(&[1000], 3, |_| {}).await;
    f.pipe.provision(&f.scratch).await;
    let db = f.scratch.path().join("idempotency.db");
    let yaml = format!(
        "{}    idempotency: {{store: 'sqlite:{}'}}\n",
        f.pipe.yaml(),
        db.display()
    );
    let file = f.scratch.write("idempotent.yaml", &yaml);
    let script = Script::new(&f.scratch, "h", "exit 0");
    let mut w = WorkerProc::with_script(
        &file,
        &f.pipe.name,
        &script,
        &["--metrics-addr", "127.0.0.1:0"],
    );
    let url = format!("http://{}/metrics", w.metrics_addr().await);
    w.wait_consuming().await;
    let q = f.pipe.name.clone();

    let run = status(&file, &["--metrics-url", &url]).await;
    run.assert_code(0);
    assert!(
        run.stdout.contains(&format!(
            "idempotency of {q}: 0 duplicates skipped, 0 deferrals\n"
        )),
        "{}",
        run.output()
    );
    publish(&f.broker, "", &q, b"once", with_id("dup-1")).await;
    script.wait_calls(1, Duration::from_secs(20)).await;
    w.wait_decisions(1, Duration::from_secs(20)).await;
    publish(&f.broker, "", &q, b"once", with_id("dup-1")).await;
    // A duplicate is not run: logged as "message not run", decision
    // duplicate.
    let skipped = w
        .wait_event("message not run", 1, Duration::from_secs(20))
        .await;
    assert_eq!(skipped[0]["decision"], "duplicate", "{}", w.output());
    let run = status(&file, &["--json", "--metrics-url", &url]).await;
    assert_eq!(
        json(&run)["pipelines"][0]["idempotency"],
        serde_json::json!({"duplicates": 1, "deferrals": 0}),
        "{}\n{}",
        run.output(),
        w.output()
    );
    assert_eq!(script.calls().len(), 1);
    w.stop().await;
}
