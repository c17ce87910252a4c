//! `cargo bench --bench serve`: a replay of a 10,000-message group from the
//! web page, beside the same replay by `dlqctl dlq replay --group` in the
//! same run (figures are printed, nothing is asserted).
//!
//! The DLQ holds the group (N messages, default 10,000; `BENCH_SERVE_N`)
//! and 1,000 others of another group, which both replays must leave in
//! place. The page's replay is the request its "Replay group" button sends
//! (a form POST to `/pipelines/P/actions`, CSRF token included), timed from
//! the POST to the job's end as its page polls it; the job's own elapsed
//! time is printed beside it. Also printed: how long the DLQ page (the
//! summary of N + 1,000) and the group's first page take to load.
//!
//! When Debian's `chromium` and `chromium-driver` are installed (and
//! `BENCH_SERVE_BROWSER` is not `0`), each round also replays the group in
//! headless Chromium: the group page loaded, the button clicked, timed
//! until the job's page shows it done.
//!
//! Needs the broker of the integration tests and its management API.
//! Everything is created under a unique prefix and deleted at the end.

// A test or a benchmark may be as long as its scenario or its table:
// the length rule (clippy::too_many_lines) is for the code they run.
#![allow(clippy::too_many_lines)]

mod common;

use lapin::{Connection, ConnectionProperties};
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

fn n() -> usize {
    common::env_number("BENCH_SERVE_N", 10_000)
}

const TIMEOUT: &str = "POST https://payments.example/charge: timeout after 5000 ms";

async fn depth(conn: &Connection, queue: &str) -> u64 {
    dlqctl::amqp::declare::ready_messages(conn, queue)
        .await
        .map_or(0, u64::from)
}

/// The DLQ holds N of the timeout group and 1,000 of another.
async fn refill(conn: &Connection, dlq: &str, n: usize) {
    common::purge(conn, dlq).await;
    common::fill(conn, dlq, n, |_| TIMEOUT.to_string()).await;
    common::fill(conn, dlq, 1000, |k| format!("order {k} not found")).await;
}

/// `dlqctl serve FILE --listen 127.0.0.1:0`, and the address it says.
fn serve(file: &str) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlqctl"))
        .args(["serve", file, "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dlqctl serve");
    let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let base = loop {
        let line = lines.next().expect("serve's log").expect("a line");
        if let Some(at) = line.find("serving http://") {
            let rest = &line[at + "serving ".len()..];
            break rest
                .split_whitespace()
                .next()
                .unwrap()
                .trim_end_matches('/')
                .to_string();
        }
    };
    // Keep draining the log so that the server never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    (child, base)
}

/// A headless Chromium session through chromedriver, when both are here.
async fn browser() -> Option<(fantoccini::Client, std::process::Child)> {
    let driver_bin = "/usr/bin/chromedriver";
    if std::env::var("BENCH_SERVE_BROWSER").as_deref() == Ok("0")
        || !std::path::Path::new(driver_bin).exists()
    {
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let driver = Command::new(driver_bin)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(20) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let profile = std::env::temp_dir().join(format!("bench-serve-chromium-{}", std::process::id()));
    let caps: serde_json::Map<String, serde_json::Value> = serde_json::from_value(serde_json::json!({
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", format!("--user-data-dir={}", profile.display())]
        }
    }))
    .ok()?;
    let client = fantoccini::ClientBuilder::rustls()
        .ok()?
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .ok()?;
    Some((client, driver))
}

/// Loads the group page, clicks "Replay group", waits for the job page to
/// say done: the time from the click, and the job page's "done" count.
async fn click_replay(c: &fantoccini::Client, url: &str) -> (Duration, String) {
    use fantoccini::Locator;
    c.goto(url).await.expect("the group page");
    let button = c
        .wait()
        .at_most(Duration::from_secs(60))
        .for_element(Locator::Css("button[data-test=replay-group]"))
        .await
        .expect("the replay button");
    let start = Instant::now();
    button.click().await.expect("click");
    c.wait()
        .at_most(Duration::from_secs(600))
        .every(Duration::from_millis(50))
        .for_element(Locator::Css("[data-job-id][data-state=done]"))
        .await
        .expect("the job page showing done");
    let took = start.elapsed();
    let done = c
        .find(Locator::Css("[data-field=done]"))
        .await
        .expect("done")
        .text()
        .await
        .unwrap_or_default();
    (took, done)
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` and
    // nextest (`--list ...`) run this binary as a test: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n = n();
    let bench = common::BenchPipeline::provision("serve");
    let (name, dlq, f) = (bench.name.clone(), bench.dlq.clone(), bench.file.clone());

    let conn = Connection::connect(URL, ConnectionProperties::default())
        .await
        .expect("the broker");
    let (mut server, base) = serve(&f);
    let http = reqwest::Client::new();
    let csrf = http
        .get(format!("{base}/api/session"))
        .send()
        .await
        .expect("the server")
        .json::<serde_json::Value>()
        .await
        .expect("JSON")["csrf_token"]
        .as_str()
        .expect("a token")
        .to_string();

    println!(
        "# serve bench: a {n}-message group replayed from the page vs `dlqctl dlq replay --group`; \
         the DLQ also holds 1,000 of another group"
    );
    let rounds: usize = common::env_number("BENCH_ROUNDS", 2);
    let mut ratios = Vec::new();
    let mut clicked = Vec::new();
    let chromium = browser().await;
    if chromium.is_none() {
        println!("(no chromium/chromedriver here, or BENCH_SERVE_BROWSER=0: no browser runs)");
    }
    for round in 1..=rounds {
        // The CLI.
        refill(&conn, &dlq, n).await;
        let summary = Command::new(env!("CARGO_BIN_EXE_dlqctl"))
            .args(["dlq", "summary", &f, "--queue", &name, "--json"])
            .output()
            .expect("summary");
        let groups: serde_json::Value = serde_json::from_slice(&summary.stdout).expect("JSON");
        let group = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["count"] == n as u64)
            .expect("the big group")["id"]
            .as_str()
            .unwrap()
            .to_string();
        let start = Instant::now();
        let cli = Command::new(env!("CARGO_BIN_EXE_dlqctl"))
            .args([
                "dlq", "replay", &f, "--queue", &name, "--group", &group, "--json",
            ])
            .output()
            .expect("replay");
        let cli_wall = start.elapsed();
        assert!(cli.status.success(), "replay");
        let cli_left = depth(&conn, &dlq).await;
        common::purge(&conn, &name).await;

        // The page.
        refill(&conn, &dlq, n).await;
        let start = Instant::now();
        let page = http
            .get(format!("{base}/pipelines/{name}"))
            .send()
            .await
            .expect("the DLQ page");
        assert!(page.status().is_success());
        let dlq_page = start.elapsed();
        let start = Instant::now();
        let gp = http
            .get(format!("{base}/pipelines/{name}/groups/{group}"))
            .send()
            .await
            .expect("the group page");
        assert!(gp.status().is_success());
        let group_page = start.elapsed();
        let form = format!("csrf={csrf}&action=replay-group&group={group}&expected={n}");
        let start = Instant::now();
        let posted = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .post(format!("{base}/pipelines/{name}/actions"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await
            .expect("the replay form");
        assert_eq!(posted.status().as_u16(), 303, "the form");
        let job = posted.headers()["location"].to_str().unwrap().to_string();
        let job_api = format!("{base}/api{job}");
        let report = loop {
            let j: serde_json::Value = http
                .get(&job_api)
                .send()
                .await
                .expect("the job")
                .json()
                .await
                .expect("JSON");
            if j["state"] != "running" {
                break j;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let page_wall = start.elapsed();
        assert_eq!(report["state"], "done", "{report}");
        let page_left = depth(&conn, &dlq).await;
        common::purge(&conn, &name).await;
        let ratio = page_wall.as_secs_f64() / cli_wall.as_secs_f64();
        ratios.push(ratio);
        println!(
            "round {round}: CLI replay --group {:.2}s (left {cli_left}) | page: DLQ page {:.2}s, group page {:.2}s, \
             replay-group job {:.2}s (job's own clock {:.2}s, moved {}, left {page_left}) | page÷CLI {ratio:.2}",
            cli_wall.as_secs_f64(),
            dlq_page.as_secs_f64(),
            group_page.as_secs_f64(),
            page_wall.as_secs_f64(),
            report["elapsed_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
            report["report"]["moved"],
        );
        if let Some((c, _)) = &chromium {
            refill(&conn, &dlq, n).await;
            let (took, done) =
                click_replay(c, &format!("{base}/pipelines/{name}/groups/{group}")).await;
            let left = depth(&conn, &dlq).await;
            common::purge(&conn, &name).await;
            println!(
                "round {round}: in Chromium, click on \"Replay group\" to the job page showing done: {:.2}s (done {done}, left {left}); ÷ CLI {:.2}",
                took.as_secs_f64(),
                took.as_secs_f64() / cli_wall.as_secs_f64()
            );
            clicked.push(took.as_secs_f64() / cli_wall.as_secs_f64());
        }
    }
    println!("page ÷ CLI, per pair: {ratios:.2?}");
    if !clicked.is_empty() {
        println!("Chromium click ÷ CLI, per pair: {clicked:.2?}");
    }
    if let Some((c, mut driver)) = chromium {
        let _ = c.close().await;
        let _ = driver.kill();
        let _ = driver.wait();
    }

    let _ = server.kill();
    let _ = server.wait();
    bench.delete(&conn).await;
}
