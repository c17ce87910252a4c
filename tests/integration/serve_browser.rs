//! `dlqctl serve` in headless Chromium (Debian's `chromium` and
//! `chromium-driver`, which `.ci/run` installs), driven over WebDriver:
//! the overview, a DLQ's groups, a group, a message and its history, a
//! replay watched as the DLQ drains, and a body holding a script shown as
//! text. Each step saves a screenshot under `target/tmp/screenshots/`;
//! with `DLQCTL_UPDATE_SCREENSHOTS=1` also under `docs/img/` (docs/serve.md shows them).

use crate::support::dlq::{dead, Fixture};
use crate::support::serve::Served;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const INSTALL_HINT: &str = "the browser tests need Debian's chromium and chromium-driver: \
`apt-get install chromium chromium-driver` (.ci/run installs them)";

/// A chromedriver on a free port and a headless Chromium session on it;
/// both go when dropped.
struct Browser {
    client: Option<Client>,
    _driver: tokio::process::Child,
    _profile: crate::support::Scratch,
}

impl Browser {
    async fn start() -> Browser {
        for bin in [CHROMEDRIVER, CHROMIUM] {
            assert!(
                std::path::Path::new(bin).exists(),
                "{bin} is missing: {INSTALL_HINT}"
            );
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().unwrap().port()
        };
        let driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {CHROMEDRIVER}: {e}; {INSTALL_HINT}"));
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "chromedriver did not listen on {port} within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = crate::support::Scratch::new();
        let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }))
        .unwrap();
        let client = ClientBuilder::rustls()
            .expect("a rustls WebDriver client")
            .capabilities(caps)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("cannot open a Chromium session: {e}; {INSTALL_HINT}"));
        Browser {
            client: Some(client),
            _driver: driver,
            _profile: profile,
        }
    }

    fn c(&self) -> &Client {
        self.client.as_ref().expect("an open session")
    }

    async fn goto(&self, url: &str) {
        self.c()
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }

    async fn wait_css(&self, css: &str) -> fantoccini::elements::Element {
        self.c()
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} within 20 s: {e}"))
    }

    /// Clicks the element `css` names, once it is there.
    async fn click(&self, css: &str) {
        self.wait_css(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    async fn text(&self, css: &str) -> String {
        self.wait_css(css)
            .await
            .text()
            .await
            .expect("the element's text")
    }

    /// Saves a screenshot named `name.png`.
    async fn screenshot(&self, name: &str) {
        let png = self.c().screenshot().await.expect("a screenshot");
        let mut dirs = vec![PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots")];
        if std::env::var_os("DLQCTL_UPDATE_SCREENSHOTS").is_some() {
            dirs.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/img"));
        }
        for d in dirs {
            std::fs::create_dir_all(&d).expect("the screenshot folder");
            std::fs::write(d.join(format!("{name}.png")), &png).expect("the screenshot");
        }
    }

    async fn close(mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.close().await;
        }
    }
}

#[tokio::test]
async fn triage_in_a_browser_overview_group_message_replay_and_a_script_shown_as_text() {
    let evil = "<script>window.__xss = 1; document.title = 'pwned'</script>";
    let mut msgs: Vec<(Vec<u8>, lapin::BasicProperties)> = (0..40)
        .map(|k| {
            (
                format!(
                    "{{\"order_id\":{k},\"amount\":{}.50,\"currency\":\"EUR\"}}",
                    10 + k
                )
                .into_bytes(),
                dead(
                    &format!("order-{k}"),
                    "exhausted",
                    "POST https://payments.example/charge: timeout after 5000 ms",
                    "acme",
                ),
            )
        })
        .collect();
    msgs.push((
        evil.as_bytes().to_vec(),
        dead("x-1", "permanent", &format!("bad input {evil}"), evil),
    ));
    // The DLQ fills while the server samples it: the chart shows the
    // depth rising and the inflow.
    let later = msgs.split_off(8);
    let f = Fixture::new(3, |_| {}, msgs).await;
    let s = Served::start(
        &f.file,
        &[
            "--warn-dlq",
            "10",
            "--max-dlq",
            "100",
            "--sample-every",
            "300ms",
        ],
    )
    .await;
    let b = Browser::start().await;
    for batch in later.chunks(9) {
        tokio::time::sleep(Duration::from_millis(700)).await;
        crate::support::dlq::publish_many(&f.b, &f.pipe.dlq(), batch.to_vec()).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The overview.
    b.goto(&s.url("/")).await;
    let row = format!("tr[data-pipeline=\"{}\"]", f.pipe.name);
    assert_eq!(b.text(&format!("{row} [data-test=dlq-depth]")).await, "41");
    assert_eq!(
        b.wait_css(&row)
            .await
            .attr("data-health")
            .await
            .unwrap()
            .as_deref(),
        Some("warning")
    );
    b.screenshot("overview").await;

    // A DLQ's groups.
    b.click(&format!("{row} td a")).await;
    b.wait_css("table.groups").await;
    assert_eq!(b.text("[data-test=snapshot]").await, "41");
    b.screenshot("dlq").await;

    // A group.
    let groups = s
        .get(&format!("/api/pipelines/{}/summary", f.pipe.name))
        .await
        .expect(200)
        .json();
    let exhausted = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["reason"] == "exhausted")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    b.click(&format!("tr[data-group=\"{exhausted}\"] a")).await;
    b.wait_css("[data-test=group-count]").await;
    assert_eq!(b.text("[data-test=group-count]").await, "40");
    let rows = b
        .c()
        .find_all(Locator::Css("tr[data-test=message]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 40);
    b.screenshot("group").await;

    // A message and its history.
    b.click("tr[data-test=message] td.mono a").await;
    let history = b.text("ol[data-test=timeline]").await;
    assert!(history.contains("Attempt 3"), "{history}");
    assert!(history.contains("timeout after 5000 ms"), "{history}");
    assert!(history.contains("Dead-lettered"), "{history}");
    let body = b.wait_css("pre[data-test=body]").await;
    assert_eq!(body.attr("data-as").await.unwrap().as_deref(), Some("json"));
    // Pretty-printed: one key a line.
    let text = body.text().await.unwrap();
    assert!(text.contains("\n  \"order_id\": "), "{text}");
    b.screenshot("message").await;

    // A body and headers holding a script: shown as text, never run.
    b.goto(&s.url(&format!("/pipelines/{}/message?id=x-1", f.pipe.name)))
        .await;
    assert_eq!(b.text("pre[data-test=body]").await, evil);
    let headers = b.text("table[data-test=headers]").await;
    assert!(headers.contains(evil), "{headers}");
    let untouched = b
        .c()
        .execute(
            "return window.__xss === undefined && document.title.indexOf('pwned') < 0",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(untouched, json!(true), "the script in the message ran");
    b.screenshot("xss-as-text").await;

    // Replay the group at 20 messages/s from its page, and watch the DLQ
    // drain on the job's page.
    b.goto(&s.url(&format!("/pipelines/{}/groups/{exhausted}", f.pipe.name)))
        .await;
    b.wait_css("input[name=rate]")
        .await
        .send_keys("20")
        .await
        .unwrap();
    b.click("button[data-test=replay-group]").await;
    b.wait_css("[data-job-id]").await;
    let mut seen: Vec<u64> = Vec::new();
    let start = Instant::now();
    let mut shot = false;
    loop {
        let box_ = b.wait_css("[data-job-id]").await;
        let state = box_.attr("data-state").await.unwrap().unwrap_or_default();
        if let Ok(n) = b.text("[data-field=dlq-messages]").await.parse::<u64>() {
            if seen.last() != Some(&n) {
                seen.push(n);
            }
            if !shot && n < 41 && n > 1 {
                b.screenshot("replay-running").await;
                shot = true;
            }
        }
        if state != "running" {
            assert_eq!(state, "done", "{}", s.output());
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the replay runs on: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The last poll came after the end.
    let final_ready: u64 =
        crate::support::eventually("the final count", Duration::from_secs(5), || async {
            b.text("[data-field=dlq-messages]")
                .await
                .parse::<u64>()
                .ok()
                .filter(|&n| n == 1)
        })
        .await;
    assert_eq!(final_ready, 1);
    assert!(
        seen.iter().any(|&n| n > 1 && n < 41),
        "the page showed the DLQ draining: {seen:?}"
    );
    assert!(
        seen.windows(2).all(|w| w[0] >= w[1]),
        "it only dropped: {seen:?}"
    );
    assert_eq!(b.text("[data-field=done]").await, "40");
    b.screenshot("replay-done").await;
    assert_eq!(f.b.message_count(&f.pipe.name).await, Some(40));
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(1));

    // Back on the overview, the DLQ holds the one left (once the
    // management API's unacked count, about 5 s behind, has caught up).
    let cell = format!("{row} [data-test=dlq-depth]");
    crate::support::eventually(
        "the overview to show 1",
        Duration::from_secs(20),
        || async {
            b.goto(&s.url("/")).await;
            (b.text(&cell).await == "1").then_some(())
        },
    )
    .await;
    b.close().await;
}
