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

    /// What `script` returns, run in the page.
    async fn js(&self, script: &str) -> Value {
        self.c()
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// An attribute of the first element `css` matches.
    async fn attr(&self, css: &str, name: &str) -> String {
        self.wait_css(css)
            .await
            .attr(name)
            .await
            .expect("the attribute")
            .unwrap_or_else(|| panic!("{css} has no {name}"))
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
    // A message waits in the main queue, and no worker consumes it.
    crate::support::dlq::publish_many(
        &f.b,
        &f.pipe.name,
        vec![(b"waiting".to_vec(), lapin::BasicProperties::default())],
    )
    .await;
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
    overview_in_words(&b, &row, &f.pipe.name, &f.pipe.dlq()).await;
    b.screenshot("overview").await;

    // A DLQ's groups.
    b.click(&format!("{row} td a")).await;
    b.wait_css("table.groups").await;
    assert_eq!(b.text("[data-test=snapshot]").await, "41");
    // The times the messages carry, relative, the header's text on hover.
    let seen = "table.groups tbody tr td time";
    assert_eq!(b.attr(seen, "title").await, "2026-01-01T00:00:00.000Z");
    let ago = b.text(seen).await;
    assert!(ago.ends_with(" ago"), "{ago}");
    assert_relative(&b.text("[data-test=read-at] time").await);
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
    // The 40 replayed, and the one that waited there from the start.
    assert_eq!(f.b.message_count(&f.pipe.name).await, Some(41));
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

/// A time the page says relative to now: `just now`, `3 s ago`.
fn assert_relative(text: &str) {
    let ago = text.strip_suffix(" ago").and_then(|t| t.split_once(' '));
    assert!(
        text == "just now"
            || ago.is_some_and(|(n, unit)| {
                n.parse::<u64>().is_ok() && ["s", "min", "h", "day", "days"].contains(&unit)
            }),
        "not a relative time: {text:?}"
    );
}

/// The overview's row of the pipeline says what it shows in words: a
/// chart with a scale, a time axis and the thresholds' colours, headings
/// without API names (those are on hover, with the raw values), whether
/// anyone consumes, and relative times with the exact time on hover.
async fn overview_in_words(b: &Browser, row: &str, main: &str, dlq: &str) {
    let texts = |css: String| {
        format!("return Array.from(document.querySelectorAll({css:?})).map(e => e.textContent)")
    };
    // The scale: 0 and a round top over the 41 the DLQ reached, and the
    // warning threshold (10) written in its colour; the alert one (100)
    // is above the scale.
    let scale = b.js(&texts(format!("{row} svg.chart text.scale"))).await;
    assert_eq!(scale, json!(["0", "50", "10"]), "the scale");
    let rule = b
        .js(&texts(format!("{row} svg.chart text.rule-warning")))
        .await;
    assert_eq!(rule, json!(["10"]));
    // The time axis: round times before now, ending at now.
    let times = b.js(&texts(format!("{row} svg.chart text.time"))).await;
    let times: Vec<String> = serde_json::from_value(times).unwrap();
    assert!(times.len() >= 2, "{times:?}");
    assert_eq!(times.last().map(String::as_str), Some("now"), "{times:?}");
    for t in &times[..times.len() - 1] {
        let n = t
            .strip_prefix('\u{2212}')
            .and_then(|t| t.strip_suffix(" s").or(t.strip_suffix(" min")));
        assert!(n.is_some_and(|n| n.parse::<u64>().is_ok()), "{times:?}");
    }
    // The line: healthy while the DLQ held 8, warning from over 10, in
    // the badge's own colour.
    let lines = b
        .js(&format!(
            "return Array.from(document.querySelectorAll('{row} svg.chart polyline')).map(e => e.getAttribute('class'))"
        ))
        .await;
    assert_eq!(lines, json!(["depth line-healthy", "depth line-warning"]));
    let same = b
        .js(&format!(
            "const r = document.querySelector('{row}'); \
             const line = r.querySelector('polyline.line-warning'); \
             const badge = r.querySelector('.badge.health-warning'); \
             return [getComputedStyle(line).stroke, getComputedStyle(badge).color]"
        ))
        .await;
    assert_eq!(same[0], same[1], "the line and the badge: {same}");
    let title = b.js(&texts(format!("{row} svg.chart > title"))).await;
    assert!(
        title[0]
            .as_str()
            .unwrap()
            .starts_with("DLQ depth over the last "),
        "{title}"
    );
    // Headings in words, the API's names on hover.
    let head = b.text("table.overview thead").await;
    assert!(head.contains("Refused dead letters"), "{head}");
    assert!(!head.contains("messages_dlx"), "{head}");
    let refused = format!("{row} [data-test=refused]");
    assert_eq!(b.text(&refused).await, "0");
    let hover = b.attr(&refused, "title").await;
    assert!(hover.starts_with("messages_dlx: "), "{hover}");
    assert!(hover.contains(&format!("{dlq} 0")), "{hover}");
    let hover = b
        .attr(&format!("{row} [data-test=dlq-depth]"), "title")
        .await;
    assert!(hover.starts_with(&format!("{dlq}: ready 41")), "{hover}");
    // Nobody consumes the main queue while a message waits: said, coloured.
    let none = format!("{row} [data-test=no-consumer]");
    assert_eq!(b.text(&none).await, "none");
    let hover = b
        .attr(&format!("{row} [data-test=consumers]"), "title")
        .await;
    assert_eq!(
        hover,
        format!("consumers: 0 ({main}), ready: 1: nothing consumes what waits")
    );
    // Times: relative, the exact time on hover; the note on the short history.
    let read = "[data-test=read-at] time";
    assert_relative(&b.text(read).await);
    let exact = b.attr(read, "title").await;
    assert_eq!(b.attr(read, "datetime").await, exact);
    assert!(
        exact.len() == 24 && exact.ends_with('Z') && exact.as_bytes()[10] == b'T',
        "{exact}"
    );
    let note = b.text("[data-test=history-note]").await;
    assert!(note.starts_with("History since "), "{note}");
    assert_relative(&b.text("[data-test=history-note] time").await);
}
