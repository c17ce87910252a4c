//! `dlqctl serve` against a real broker, through its HTTP API and pages:
//! what it shows matches the DLQ commands, its jobs keep their rules, and
//! its guard refuses what it must.

use crate::support::dlq::{dead, dead_many, Fixture};
use crate::support::serve::Served;
use crate::support::Dlqctl;
use lapin::BasicProperties;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

const JOB_DEADLINE: Duration = Duration::from_secs(60);

/// `n` messages of one group (reason `exhausted`, error "timeout") and `m`
/// of another (`permanent`, "bad input"), ids `t-0`.. and `p-0`...
fn two_groups(n: usize, m: usize) -> Vec<(Vec<u8>, lapin::BasicProperties)> {
    let mut out: Vec<_> = (0..n)
        .map(|k| {
            (
                format!("{{\"order\":{k}}}").into_bytes(),
                dead(&format!("t-{k}"), "exhausted", "timeout", "a"),
            )
        })
        .collect();
    out.extend((0..m).map(|k| {
        (
            format!("bad {k}").into_bytes(),
            dead(&format!("p-{k}"), "permanent", "bad input", "b"),
        )
    }));
    out
}

/// The summary group of `reason`, from the API.
/// A DLQ holding `msgs` (three attempts), the web page on it, and the id
/// of its `reason` group.
async fn served_group(
    msgs: Vec<(Vec<u8>, BasicProperties)>,
    reason: &str,
) -> (Fixture, Served, String) {
    let f = Fixture::new(3, |_| {}, msgs).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let g = group_of(&s, &f.pipe.name, reason).await;
    let gid = g["id"].as_str().expect("a group id").to_string();
    (f, s, gid)
}

async fn group_of(s: &Served, pipeline: &str, reason: &str) -> Value {
    let summary = s
        .get(&format!("/api/pipelines/{pipeline}/summary"))
        .await
        .expect(200)
        .json();
    summary["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["reason"] == reason)
        .unwrap_or_else(|| panic!("no {reason} group in {summary}"))
        .clone()
}

#[tokio::test]
async fn the_overview_shows_each_pipeline_with_its_health_and_samples_its_dlq() {
    let f = Fixture::new(3, |_| {}, dead_many(3, |_| "exhausted", |_| "t")).await;
    let s = Served::start(
        &f.file,
        &[
            "--warn-dlq",
            "1",
            "--max-dlq",
            "10",
            "--sample-every",
            "200ms",
        ],
    )
    .await;
    let o = s.get("/api/overview").await.expect(200).json();
    let p = &o["pipelines"][0];
    assert_eq!(p["name"], f.pipe.name.as_str());
    assert_eq!(p["dlq"]["ready"], 3, "{o}");
    assert_eq!(p["dlq"]["name"], f.pipe.dlq().as_str());
    assert_eq!(p["health"], "warning", "{o}");
    assert_eq!(o["warn_dlq"], 1);
    assert_eq!(o["max_dlq"], 10);
    // The sampler has drawn some of the hour.
    let o = crate::support::eventually("two samples", Duration::from_secs(10), || async {
        let o = s.get("/api/overview").await.expect(200).json();
        (o["pipelines"][0]["history"].as_array().map_or(0, Vec::len) >= 2).then_some(o)
    })
    .await;
    assert_eq!(o["pipelines"][0]["history"][1]["depth"], 3, "{o}");
    let page = s.get("/").await.expect(200);
    assert!(page.text.contains(&f.pipe.name), "{}", page.text);
    assert!(page.text.contains("health-warning"), "{}", page.text);
    assert!(page.text.contains("<polyline"), "the chart: {}", page.text);
    // Without a script: the chart's scale and time axis, the headings in
    // words, the times relative, all in the HTML the server sends.
    for part in [
        "<text class=\"scale\"",
        "<text class=\"time\"",
        ">now</text>",
        ">Refused dead letters</th>",
        "data-test=\"history-note\"",
        "data-test=\"read-at\"><time datetime=",
    ] {
        assert!(page.text.contains(part), "no {part} in {}", page.text);
    }
    // No broker credentials anywhere.
    assert!(!page.text.contains("guest:guest"), "{}", page.text);
    assert!(!o.to_string().contains("guest:guest"), "{o}");
}

#[tokio::test]
async fn summary_and_messages_are_what_the_dlq_commands_report_and_leave_the_dlq_as_it_was() {
    let f = Fixture::new(3, |_| {}, two_groups(7, 3)).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let api = s
        .get(&format!("/api/pipelines/{}/summary", f.pipe.name))
        .await
        .expect(200)
        .json();
    let cli = Dlqctl::new("dlq")
        .args([
            "summary",
            &f.file.display().to_string(),
            "--queue",
            &f.pipe.name,
            "--json",
        ])
        .run()
        .await;
    cli.assert_code(0);
    let cli: Value = serde_json::from_str(&cli.stdout).expect("summary JSON");
    assert_eq!(api["groups"], cli["groups"], "API {api}\nCLI {cli}");
    assert_eq!(api["snapshot"], 10);
    assert_eq!(api["fresh"], true);

    let g = group_of(&s, &f.pipe.name, "exhausted").await;
    assert_eq!(g["count"], 7);
    let id = g["id"].as_str().unwrap();
    let page = |offset: u16, limit: u16| {
        let s = &s;
        let name = f.pipe.name.clone();
        async move {
            s.get(&format!(
                "/api/pipelines/{name}/messages?group={id}&offset={offset}&limit={limit}"
            ))
            .await
            .expect(200)
            .json()
        }
    };
    let ids = |v: &Value| -> Vec<String> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["message_id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&page(0, 5).await), ["t-0", "t-1", "t-2", "t-3", "t-4"]);
    assert_eq!(ids(&page(5, 5).await), ["t-5", "t-6"]);
    let one = s
        .get(&format!(
            "/api/pipelines/{}/messages?message_id=p-2",
            f.pipe.name
        ))
        .await
        .expect(200)
        .json();
    assert_eq!(ids(&one), ["p-2"]);
    assert_eq!(one["messages"][0]["body_utf8"], "bad 2");
    assert_eq!(one["messages"][0]["last_error"], "bad input");

    // The group page and a message page render, and nothing moved.
    let html = s
        .get(&format!("/pipelines/{}/groups/{id}", f.pipe.name))
        .await
        .expect(200);
    assert_eq!(html.text.matches("data-test=\"message\"").count(), 7);
    let html = s
        .get(&format!("/pipelines/{}/message?id=t-3", f.pipe.name))
        .await
        .expect(200);
    assert!(html.text.contains("timeout"), "{}", html.text);
    assert!(html.text.contains("data-as=\"json\""), "{}", html.text);
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(10));
    assert_eq!(f.b.message_count(&f.pipe.name).await, Some(0));
    // A message that is not there, a pipeline that is not there.
    s.get(&format!("/pipelines/{}/message?id=nope", f.pipe.name))
        .await
        .expect(404);
    s.get("/api/pipelines/no-such/summary").await.expect(404);
    s.get("/pipelines/no-such").await.expect(404);
}

#[tokio::test]
async fn replaying_a_group_from_the_api_moves_that_group_only_and_reports_like_the_cli() {
    let (f, s, gid) = served_group(two_groups(12, 4), "exhausted").await;
    let id = s
        .start_job(
            &f.pipe.name,
            "replay",
            json!({ "group": gid, "rate": 1000 }),
        )
        .await;
    let j = s.wait_job(id, JOB_DEADLINE).await;
    assert_eq!(j["state"], "done", "{j}");
    assert_eq!(j["report"]["moved"], 12, "{j}");
    assert_eq!(j["report"]["to"], f.pipe.name.as_str());
    assert_eq!(j["progress"]["done"], 12);
    assert_eq!(j["dlq_ready"], 4, "{j}");
    assert_eq!(f.b.message_count(&f.pipe.name).await, Some(12));
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(4));
    // The jobs list has it.
    let all = s.get("/api/jobs").await.expect(200).json();
    assert_eq!(all[0]["id"], id);
    // Selected messages, by id.
    let id = s
        .start_job(
            &f.pipe.name,
            "replay",
            json!({ "message_ids": ["p-1", "p-3"] }),
        )
        .await;
    let j = s.wait_job(id, JOB_DEADLINE).await;
    assert_eq!(j["report"]["moved"], 2, "{j}");
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(2));
}

#[tokio::test]
async fn an_export_job_offers_the_cli_export_format_for_download_and_keeps_the_dlq() {
    let (f, s, gid) = served_group(two_groups(5, 2), "permanent").await;
    let done = s
        .post_action(&f.pipe.name, &[("action", "export-group"), ("group", &gid)])
        .await
        .expect(303);
    let location = done.headers["location"].to_str().unwrap().to_string();
    let id = done.job_id();
    let j = s.wait_job(id, JOB_DEADLINE).await;
    assert_eq!(j["state"], "done", "{j}");
    assert_eq!(j["report"]["written"], 2);
    let file = s.get(j["download"].as_str().unwrap()).await.expect(200);
    assert_eq!(file.headers["content-type"], "application/x-ndjson");
    assert!(file.headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment;"));
    let lines: Vec<Value> = file
        .text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|l| l["format"] == "dlqctl-export/1"));
    assert_eq!(lines[0]["body_utf8"], "bad 0");
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(7));
    // The job page renders, with the download link.
    let html = s.get(&location).await.expect(200);
    assert!(
        html.text.contains(&format!("/jobs/{id}/download")),
        "{}",
        html.text
    );
}

#[tokio::test]
async fn a_purge_needs_the_typed_count_and_removes_at_most_that_many() {
    let (f, s, gid) = served_group(two_groups(4, 3), "exhausted").await;
    let path = format!("/pipelines/{}/actions", f.pipe.name);
    for wrong in ["", "3", "5", "four"] {
        let a = s
            .post_form(
                &path,
                &[
                    ("action", "purge-group"),
                    ("group", &gid),
                    ("expected", "4"),
                    ("confirm", wrong),
                ],
            )
            .await
            .expect(400);
        assert!(a.text.contains("type the count"), "{}", a.text);
    }
    // A whole DLQ is not purged from the page.
    s.post_json(
        &format!("/api/pipelines/{}/purge", f.pipe.name),
        json!({ "all": true, "expected": 7 }),
    )
    .await
    .expect(400);
    // A misspelt selector or option is refused, never read as "all".
    for body in [
        json!({ "message_id": "t-0" }),
        json!({ "groupp": gid }),
        json!({}),
        json!({ "group": gid, "rate": 5, "expected": 1 }),
    ] {
        let a = s
            .post_json(
                &format!("/api/pipelines/{}/replay", f.pipe.name),
                body.clone(),
            )
            .await
            .expect(400);
        assert!(a.json()["error"].is_string(), "{body}: {}", a.text);
    }
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(7));
    // The count typed is the most removed, even when the group grew since.
    let a = s
        .post_form(
            &path,
            &[
                ("action", "purge-group"),
                ("group", &gid),
                ("expected", "3"),
                ("confirm", "3"),
            ],
        )
        .await
        .expect(303);
    let id = a.job_id();
    let j = s.wait_job(id, JOB_DEADLINE).await;
    assert_eq!(j["state"], "done", "{j}");
    assert_eq!(j["report"]["removed"], 3, "{j}");
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(4));
}

#[tokio::test]
async fn one_job_per_dlq_a_cancel_loses_nothing_and_a_busy_dlq_shows_its_last_summary() {
    let n = 300;
    let f = Fixture::new(3, |_| {}, dead_many(n, |_| "exhausted", |_| "t")).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    // A summary made while the DLQ was free.
    s.get(&format!("/api/pipelines/{}/summary", f.pipe.name))
        .await
        .expect(200);
    let id = s
        .start_job(&f.pipe.name, "replay", json!({ "all": true, "rate": 20 }))
        .await;
    let second = s
        .post_json(
            &format!("/api/pipelines/{}/export", f.pipe.name),
            json!({ "all": true }),
        )
        .await
        .expect(409)
        .json();
    assert_eq!(second["job"], id, "{second}");
    // Reads while the job holds the DLQ: the last summary, marked stale.
    s.wait_moving(id).await;
    let stale = s
        .get(&format!("/api/pipelines/{}/summary", f.pipe.name))
        .await
        .expect(200)
        .json();
    assert_eq!(stale["fresh"], false, "{stale}");
    assert!(
        stale["stale_because"].as_str().unwrap().contains("busy"),
        "{stale}"
    );
    s.get(&format!("/api/pipelines/{}/messages", f.pipe.name))
        .await
        .expect(409);
    // Cancel: it stops after its copies in flight; every message is in one
    // of the two queues, once.
    s.post_json(&format!("/api/jobs/{id}/cancel"), json!({}))
        .await
        .expect(200);
    let j = s.wait_job(id, JOB_DEADLINE).await;
    assert_eq!(j["state"], "cancelled", "{j}");
    let moved = j["report"]["moved"].as_u64().unwrap();
    assert!(moved > 0 && moved < n as u64, "{j}");
    let main = f.b.message_count(&f.pipe.name).await.unwrap() as u64;
    let dlq = crate::support::eventually("the DLQ to settle", Duration::from_secs(10), || async {
        let d = f.b.message_count(&f.pipe.dlq()).await.unwrap() as u64;
        (d + main == n as u64).then_some(d)
    })
    .await;
    assert_eq!(main, moved);
    assert_eq!(dlq, n as u64 - moved);
}

#[tokio::test]
async fn sigterm_stops_a_running_job_after_its_copies_in_flight_and_exits_0() {
    let n = 200;
    let f = Fixture::new(3, |_| {}, dead_many(n, |_| "exhausted", |_| "t")).await;
    let mut s = Served::start(&f.file, &[] as &[&str]).await;
    let id = s
        .start_job(&f.pipe.name, "replay", json!({ "all": true, "rate": 20 }))
        .await;
    s.wait_moving(id).await;
    s.signal(libc::SIGTERM);
    assert_eq!(
        s.wait_exit(Duration::from_secs(30)).await,
        Some(0),
        "{}",
        s.output()
    );
    let total = crate::support::eventually("nothing lost", Duration::from_secs(10), || async {
        let main = f.b.message_count(&f.pipe.name).await.unwrap();
        let dlq = f.b.message_count(&f.pipe.dlq()).await.unwrap();
        (main + dlq == n as u32 && main > 0 && dlq > 0).then_some(main + dlq)
    })
    .await;
    assert_eq!(total, n as u32);
}

#[tokio::test]
async fn headers_and_bodies_holding_script_render_as_text() {
    let evil = "<script>document.title='pwned'</script>";
    let props = dead("x-1", "permanent", evil, "a").with_headers({
        let mut t = lapin::types::FieldTable::default();
        for (k, v) in [
            ("dlqctl-reason", "permanent"),
            ("dlqctl-last-error", evil),
            ("<img src=x onerror=alert(1)>", evil),
        ] {
            t.insert(k.into(), crate::support::worker::s(v));
        }
        t
    });
    let f = Fixture::new(3, |_| {}, vec![(evil.as_bytes().to_vec(), props)]).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let page = s
        .get(&format!("/pipelines/{}/message?id=x-1", f.pipe.name))
        .await
        .expect(200);
    page.assert_lacks(&["<script>document", "<img"]);
    assert!(
        page.text.contains("&lt;script&gt;document.title"),
        "{}",
        page.text
    );
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert_eq!(page.headers["x-frame-options"], "DENY");
    let dlq = s
        .get(&format!("/pipelines/{}", f.pipe.name))
        .await
        .expect(200);
    assert!(!dlq.text.contains("<script>document"), "{}", dlq.text);
}

#[tokio::test]
async fn posts_need_the_csrf_token_and_our_origin_and_hosts_are_checked() {
    let f = Fixture::new(3, |_| {}, two_groups(2, 0)).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let path = format!("/api/pipelines/{}/replay", f.pipe.name);
    // No token, a wrong one.
    s.send(Method::POST, &path, |r| r.json(&json!({})))
        .await
        .expect(403);
    s.send(Method::POST, &path, |r| {
        r.header("x-csrf-token", "0".repeat(32)).json(&json!({}))
    })
    .await
    .expect(403);
    // A form without its token.
    s.send(
        Method::POST,
        &format!("/pipelines/{}/actions", f.pipe.name),
        |r| {
            r.header("content-type", "application/x-www-form-urlencoded")
                .body("action=replay&scope=all")
        },
    )
    .await
    .expect(403);
    // Another site's page, even with the token.
    let csrf = s.csrf().await;
    s.send(Method::POST, &path, |r| {
        r.header("x-csrf-token", &csrf)
            .header("origin", "http://evil.example")
            .json(&json!({}))
    })
    .await
    .expect(403);
    // A name that is not ours (DNS rebinding).
    s.send(Method::GET, "/api/overview", |r| {
        r.header("host", "rebind.evil.example")
    })
    .await
    .expect(421);
    // Other methods.
    s.send(Method::DELETE, "/api/jobs/1", |r| r)
        .await
        .expect(405);
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(2));
    assert_eq!(f.b.message_count(&f.pipe.name).await, Some(0));
}

#[tokio::test]
async fn read_only_hides_and_refuses_every_action() {
    let f = Fixture::new(3, |_| {}, two_groups(2, 1)).await;
    let s = Served::start(&f.file, &["--read-only"]).await;
    let g = group_of(&s, &f.pipe.name, "exhausted").await;
    let gid = g["id"].as_str().unwrap();
    let page = s
        .get(&format!("/pipelines/{}/groups/{gid}", f.pipe.name))
        .await
        .expect(200);
    page.assert_lacks(&["<form", "Replay"]);
    let page = s
        .get(&format!("/pipelines/{}/message?id=t-0", f.pipe.name))
        .await
        .expect(200);
    assert!(!page.text.contains("<form"), "{}", page.text);
    for verb in ["replay", "export", "purge"] {
        let a = s
            .post_json(
                &format!("/api/pipelines/{}/{verb}", f.pipe.name),
                json!({ "group": gid, "expected": 2 }),
            )
            .await
            .expect(403);
        assert!(a.text.contains("read-only"), "{}", a.text);
    }
    s.post_action(&f.pipe.name, &[("action", "replay-group"), ("group", gid)])
        .await
        .expect(403);
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(3));
}

#[tokio::test]
async fn a_token_guards_every_page_and_api_and_the_login_sets_it() {
    let f = Fixture::new(3, |_| {}, two_groups(1, 0)).await;
    // A base64 token: `/`, `+` and `=` must survive the login cookie.
    let token = "s3cr/t+tok=en-for-tests";
    let s = Served::start(&f.file, &["--auth-token", token]).await;
    let login = s.get("/").await.expect(303);
    assert_eq!(login.headers["location"], "/login");
    s.get("/login").await.expect(200);
    s.get("/assets/app.js").await.expect(200);
    s.get("/api/overview").await.expect(401);
    s.send(Method::GET, "/api/overview", |r| r.bearer_auth("wrong"))
        .await
        .expect(401);
    s.send(Method::GET, "/api/overview", |r| r.bearer_auth(token))
        .await
        .expect(200);
    // A bearer request needs no CSRF token: a browser cannot be made to
    // send that header by another site.
    let j = s
        .send(
            Method::POST,
            &format!("/api/pipelines/{}/export", f.pipe.name),
            |r| r.bearer_auth(token).json(&json!({ "all": true })),
        )
        .await
        .expect(202)
        .json();
    s.send(Method::GET, &format!("/api/jobs/{}", j["id"]), |r| {
        r.bearer_auth(token)
    })
    .await
    .expect(200);
    // The login form: a wrong token, then the right one and its cookie.
    let form = |t: &str| {
        format!(
            "token={}",
            form_urlencoded::byte_serialize(t.as_bytes()).collect::<String>()
        )
    };
    s.send(Method::POST, "/login", |r| {
        r.header("content-type", "application/x-www-form-urlencoded")
            .body(form("nope"))
    })
    .await
    .expect(401);
    let ok = s
        .send(Method::POST, "/login", |r| {
            r.header("content-type", "application/x-www-form-urlencoded")
                .body(form(token))
        })
        .await
        .expect(303);
    let cookie = ok.headers["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    s.send(Method::GET, "/", |r| r.header("cookie", &pair))
        .await
        .expect(200);
    // Any Host is taken with a token: the token is the guard.
    s.send(Method::GET, "/api/overview", |r| {
        r.bearer_auth(token).header("host", "dlq.example.internal")
    })
    .await
    .expect(200);
}

#[tokio::test]
async fn listening_beyond_loopback_needs_a_token_and_bad_flags_exit_2() {
    let f = Fixture::new(3, |_| {}, vec![]).await;
    let file = f.file.display().to_string();
    let run = Dlqctl::new("serve")
        .args([&file, "--listen", "0.0.0.0:0"])
        .run()
        .await;
    run.assert_code(2);
    assert!(run.stderr.contains("--auth-token"), "{}", run.output());
    let run = Dlqctl::new("serve")
        .args([&file, "--listen", "127.0.0.1:0", "--auth-token", ""])
        .run()
        .await;
    run.assert_code(2);
    let run = Dlqctl::new("serve")
        .args([&file, "--listen", "not-an-address"])
        .run()
        .await;
    run.assert_code(2);
    let run = Dlqctl::new("serve")
        .args([&file, "--listen", "127.0.0.1:0", "--sample-every", "0s"])
        .run()
        .await;
    run.assert_code(2);
    // A port in use is a runtime failure, named.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let run = Dlqctl::new("serve")
        .args([&file, "--listen", &addr])
        .run()
        .await;
    run.assert_code(1);
    assert!(run.stderr.contains(&addr), "{}", run.output());
}

#[tokio::test]
async fn a_job_started_the_moment_a_page_read_ends_sees_every_message_it_gave_back() {
    // The group page's read stops after a page, giving back all it was
    // sent; a replay posted right after must still take the whole group.
    let (f, s, gid) = served_group(two_groups(6000, 500), "exhausted").await;
    for round in 0..2 {
        s.get(&format!("/pipelines/{}/groups/{gid}", f.pipe.name))
            .await
            .expect(200);
        let a = s
            .post_action(&f.pipe.name, &[("action", "export-group"), ("group", &gid)])
            .await
            .expect(303);
        let id = a.job_id();
        let j = s.wait_job(id, JOB_DEADLINE).await;
        assert_eq!(j["report"]["snapshot"], 6500, "round {round}: {j}");
        assert_eq!(j["report"]["written"], 6000, "round {round}: {j}");
    }
}

#[tokio::test]
async fn an_unreachable_broker_is_a_502_naming_it_without_credentials_and_the_server_stays_up() {
    let f = Fixture::new(3, |_| {}, two_groups(1, 0)).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let url = format!("amqp://guest:s3cr3tpass@127.0.0.1:{port}/%2f");
    let s = Served::start(&f.file, &["--url", &url, "--sample-every", "200ms"]).await;
    for path in [
        "/api/overview".to_string(),
        format!("/api/pipelines/{}/summary", f.pipe.name),
    ] {
        let a = s.get(&path).await.expect(502);
        let e = a.json()["error"].as_str().unwrap().to_string();
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
        assert!(!e.contains("s3cr3tpass"), "{e}");
    }
    let page = s.get("/").await.expect(502);
    assert!(page.text.contains("cannot connect"), "{}", page.text);
    assert!(!page.text.contains("s3cr3tpass"), "{}", page.text);
    assert!(!s.output().contains("s3cr3tpass"), "{}", s.output());
    // Still serving.
    s.get("/api/session").await.expect(200);
}

#[tokio::test]
async fn bad_addresses_and_queries_get_a_sentence_not_a_panic() {
    let f = Fixture::new(3, |_| {}, two_groups(2, 0)).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let p = &f.pipe.name;
    for (path, status) in [
        (format!("/pipelines/{p}/groups/abc?page=-1"), 400),
        (format!("/pipelines/{p}/groups/abc?page=99999999"), 400),
        (format!("/pipelines/{p}/message?group=g&n=70000"), 400),
        (format!("/pipelines/{p}/message?group=g&n=10000"), 400),
        (format!("/pipelines/{p}/message"), 400),
        ("/pipelines/%FF".to_string(), 400),
        ("/jobs/abc".to_string(), 404),
        ("/jobs/99999999999999999999999".to_string(), 404),
        ("/jobs/7/download".to_string(), 404),
    ] {
        let a = s.get(&path).await;
        assert_eq!(a.status.as_u16(), status, "{path}: {}", a.text);
        assert!(a.text.contains("data-test=\"error\""), "{path}: {}", a.text);
    }
    for (path, status) in [
        (format!("/api/pipelines/{p}/messages?offset=x"), 400),
        (
            format!("/api/pipelines/{p}/messages?offset=9999&limit=2"),
            400,
        ),
        ("/api/jobs/abc".to_string(), 404),
        ("/api/pipelines/%FF/summary".to_string(), 400),
    ] {
        let a = s.get(&path).await;
        assert_eq!(a.status.as_u16(), status, "{path}: {}", a.text);
        assert!(a.json()["error"].is_string(), "{path}: {}", a.text);
    }
    let a = s
        .send(Method::POST, &format!("/api/pipelines/{p}/replay"), |r| {
            r.header("x-csrf-token", "x").body("{not json")
        })
        .await;
    assert_eq!(a.status.as_u16(), 403, "{}", a.text);
    let a = s
        .post_json(&format!("/api/pipelines/{p}/replay"), json!([1, 2]))
        .await
        .expect(400);
    assert!(a.json()["error"].is_string());
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(2));
}

#[tokio::test]
async fn another_sites_page_may_link_to_ours_but_not_load_it_unseen() {
    let f = Fixture::new(3, |_| {}, two_groups(2, 0)).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let dlq_page = format!("/pipelines/{}", f.pipe.name);
    // An <img> or a fetch from another site, another site's frame: refused
    // before any read. A link followed from a chat message, our own
    // page's script, the assets from anywhere: served.
    for (path, site, mode, dest, status) in [
        (dlq_page.as_str(), "cross-site", "no-cors", "image", 403),
        ("/api/overview", "cross-site", "cors", "empty", 403),
        (dlq_page.as_str(), "same-site", "navigate", "iframe", 403),
        (dlq_page.as_str(), "cross-site", "navigate", "document", 200),
        ("/api/overview", "same-origin", "cors", "empty", 200),
        ("/assets/style.css", "cross-site", "no-cors", "style", 200),
    ] {
        let a = s
            .send(Method::GET, path, |r| {
                r.header("sec-fetch-site", site)
                    .header("sec-fetch-mode", mode)
                    .header("sec-fetch-dest", dest)
            })
            .await;
        assert_eq!(
            a.status.as_u16(),
            status,
            "{path} {site} {mode} {dest}: {}",
            a.text
        );
    }
    // The link from elsewhere gets a page asking to continue, which reads
    // nothing; the continue link is a path of ours.
    let a = s
        .send(Method::GET, &format!("{dlq_page}?x=1"), |r| {
            r.header("sec-fetch-site", "cross-site")
                .header("sec-fetch-mode", "navigate")
                .header("sec-fetch-dest", "document")
        })
        .await
        .expect(200);
    assert!(
        a.text.contains(&format!("href=\"{dlq_page}?x=1\"")),
        "{}",
        a.text
    );
    assert!(!a.text.contains("data-group"), "{}", a.text);
    let a = s
        .send(Method::GET, "//evil.example/x", |r| {
            r.header("sec-fetch-site", "cross-site")
                .header("sec-fetch-mode", "navigate")
        })
        .await;
    assert!(!a.text.contains("evil.example"), "{}", a.text);
}

#[tokio::test]
async fn a_browser_leaving_a_page_mid_load_leaves_the_dlq_as_it_was() {
    // Past the window, a read rotates kept messages (a copy to the tail,
    // then the ack): a read dropped mid-way would leave copies behind.
    let n = 3000;
    let f = Fixture::new(3, |_| {}, dead_many(n, |_| "exhausted", |_| "t")).await;
    let s = Served::start(&f.file, &["--window", "50"]).await;
    for ms in [60, 120, 200, 300, 450] {
        let quick = reqwest::Client::builder()
            .timeout(Duration::from_millis(ms))
            .build()
            .unwrap();
        let _ = quick
            .get(s.url(&format!("/pipelines/{}", f.pipe.name)))
            .send()
            .await;
    }
    // Every read ends; then the DLQ holds each message once.
    let summary = crate::support::eventually("a summary", Duration::from_secs(30), || async {
        let a = s
            .get(&format!("/api/pipelines/{}/summary", f.pipe.name))
            .await;
        (a.status == 200).then(|| a.json())
    })
    .await;
    assert_eq!(summary["snapshot"], n, "{summary}");
    assert_eq!(summary["fresh"], true, "{summary}");
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(n as u32));
}

#[tokio::test]
async fn ticking_one_id_takes_one_message_even_when_several_share_it() {
    let mut msgs = two_groups(0, 2);
    for k in 0..3 {
        msgs.push((
            format!("dup {k}").into_bytes(),
            dead("dup", "permanent", "bad input", "b"),
        ));
    }
    let f = Fixture::new(3, |_| {}, msgs).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let id = s
        .start_job(&f.pipe.name, "export", json!({ "message_ids": ["dup"] }))
        .await;
    let j = s.wait_job(id, JOB_DEADLINE).await;
    assert_eq!(j["report"]["written"], 1, "{j}");
    // The group page opens messages sharing an id by their place.
    let g = group_of(&s, &f.pipe.name, "permanent").await;
    let page = s
        .get(&format!(
            "/pipelines/{}/groups/{}",
            f.pipe.name,
            g["id"].as_str().unwrap()
        ))
        .await
        .expect(200);
    assert!(!page.text.contains("message?id=dup"), "{}", page.text);
    assert!(page.text.contains("message?id=p-0"), "{}", page.text);
    assert_eq!(page.text.matches("&amp;n=").count(), 3, "{}", page.text);
}

#[tokio::test]
async fn a_cancelled_export_offers_no_download() {
    let n = 3000;
    let f = Fixture::new(3, |_| {}, dead_many(n, |_| "exhausted", |_| "t")).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let id = s
        .start_job(&f.pipe.name, "export", json!({ "all": true }))
        .await;
    s.post_json(&format!("/api/jobs/{id}/cancel"), json!({}))
        .await
        .expect(200);
    let j = s.wait_job(id, JOB_DEADLINE).await;
    if j["state"] == "cancelled" {
        assert!(j["download"].is_null(), "{j}");
        s.get(&format!("/jobs/{id}/download")).await.expect(404);
    } else {
        // It finished before the cancel came: then it is whole.
        assert_eq!(j["report"]["written"], n, "{j}");
    }
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(n as u32));
}

/// Logs in with `token`: the cookie pair it sets.
async fn login(s: &Served, token: &str) -> String {
    let ok = s
        .send(Method::POST, "/login", |r| {
            r.header("content-type", "application/x-www-form-urlencoded")
                .body(format!("token={token}"))
        })
        .await
        .expect(303);
    let cookie = ok.headers["set-cookie"].to_str().unwrap().to_string();
    cookie.split(';').next().unwrap().to_string()
}

#[tokio::test]
async fn weak_tokens_are_refused_guesses_are_throttled_and_cookies_die_with_the_server() {
    let f = Fixture::new(3, |_| {}, vec![]).await;
    let file = f.file.display().to_string();
    // A blank, a one-character and a 15-character token: exit 2, on any
    // address, from the flag or the environment.
    for weak in [" ", "x", "fifteen-chars-x", "a token w/ space"] {
        for listen in ["0.0.0.0:0", "127.0.0.1:0"] {
            let out = Dlqctl::new("serve")
                .args([&file, "--listen", listen])
                .env("DLQCTL_AUTH_TOKEN", weak)
                .run()
                .await;
            let stderr = &out.stderr;
            assert_eq!(out.code, Some(2), "{weak:?} on {listen}: {stderr}");
            assert!(stderr.contains("at least 16"), "{weak:?}: {stderr}");
        }
        let run = Dlqctl::new("serve")
            .args([&file, "--listen", "127.0.0.1:0", "--auth-token", weak])
            .run()
            .await;
        run.assert_code(2);
    }
    let token = "right-token-for-the-throttle-test";
    let s = Served::start(&f.file, &["--auth-token", token]).await;
    // 100 wrong guesses at once: only the first few are even compared.
    let guesses = (0..100).map(|k| {
        let s = &s;
        async move {
            s.send(Method::GET, "/api/overview", |r| {
                r.bearer_auth(format!("wrong-guess-number-{k:04}"))
            })
            .await
            .status
            .as_u16()
        }
    });
    let codes = futures_util::future::join_all(guesses).await;
    let refused = codes.iter().filter(|&&c| c == 401).count();
    let throttled = codes.iter().filter(|&&c| c == 429).count();
    assert_eq!(refused + throttled, 100, "{codes:?}");
    assert!(refused <= 15, "{refused} wrong tokens compared: {codes:?}");
    // Wrong cookies and login forms are guesses too.
    s.send(Method::GET, "/", |r| r.header("cookie", "dlqctl_token=00"))
        .await
        .expect(429);
    s.send(Method::POST, "/login", |r| {
        r.header("content-type", "application/x-www-form-urlencoded")
            .body("token=wrong")
    })
    .await
    .expect(429);
    // The right token is taken again once the client has waited.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let first = login(&s, token).await;
    s.send(Method::GET, "/", |r| r.header("cookie", &first))
        .await
        .expect(200);
    drop(s);
    // Another run of the server with the same token: the old cookie is a
    // wrong one, and the new one differs.
    let s = Served::start(&f.file, &["--auth-token", token]).await;
    let old = s
        .send(Method::GET, "/", |r| r.header("cookie", &first))
        .await;
    assert_eq!(old.status.as_u16(), 303, "{}", old.text);
    let second = login(&s, token).await;
    assert_ne!(first, second);
    s.send(Method::GET, "/", |r| r.header("cookie", &second))
        .await
        .expect(200);
}

/// A JSON body nested 120,000 arrays deep (240 KB) took about 22 GB to
/// re-indent. Past the depth bound the page shows it as sent and says so,
/// in memory and time linear in the body.
#[tokio::test]
async fn a_deeply_nested_json_body_shows_as_text_and_says_so() {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let json =
        |id: &str| dead(id, "permanent", "e", "a").with_content_type("application/json".into());
    let f = Fixture::new(
        3,
        |_| {},
        vec![
            (nested(3_000).into_bytes(), json("deep-3k")),
            (nested(120_000).into_bytes(), json("deep-120k")),
        ],
    )
    .await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    for (id, depth) in [("deep-3k", 3_000), ("deep-120k", 120_000)] {
        let start = std::time::Instant::now();
        let page = s
            .get(&format!("/pipelines/{}/message?id={id}", f.pipe.name))
            .await
            .expect(200);
        assert!(
            page.text.contains("nested deeper than 64 levels"),
            "{id}: {} bytes, no word of the depth",
            page.text.len()
        );
        assert!(page.text.contains("data-as=\"text\""), "{id}");
        // The body once, and the page around it.
        assert!(
            page.text.len() < 2 * depth + 64 * 1024,
            "{id}: a page of {} bytes",
            page.text.len()
        );
        assert!(start.elapsed() < Duration::from_secs(20), "{id}");
    }
}

#[tokio::test]
async fn concurrent_reads_of_one_dlq_share_one_read() {
    // Robustness finding 14: 88 page reads of one DLQ, asked at once, ran
    // one after the other and shared nothing (the last answered after 95 s).
    let n = 2_000;
    let f = Fixture::new(3, |_| {}, dead_many(n, |_| "exhausted", |_| "t")).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let path = format!("/api/pipelines/{}/summary", f.pipe.name);
    let asks = 30;
    let answers = futures_util::future::join_all(
        (0..asks).map(|_| async { s.get(&path).await.expect(200).json() }),
    )
    .await;
    let mut reads: Vec<u64> = answers
        .iter()
        .map(|a| {
            assert_eq!(a["fresh"], true, "{a}");
            assert_eq!(a["read"], n as u64, "{a}");
            a["at_ms"].as_u64().expect("at_ms")
        })
        .collect();
    reads.sort_unstable();
    reads.dedup();
    // A read of 2,000 messages takes far longer than the 30 requests take to
    // arrive: they share the first read, or the second when a few came just
    // after it ended. Read one by one, they would show 30 times.
    assert!(
        reads.len() <= 3,
        "{asks} concurrent summaries made {} reads",
        reads.len()
    );
    // Pages of messages asked at once all answer, and every read left the
    // DLQ as it was.
    let messages = format!("/api/pipelines/{}/messages?limit=5", f.pipe.name);
    let pages = futures_util::future::join_all(
        (0..10).map(|_| async { s.get(&messages).await.expect(200).json() }),
    )
    .await;
    for p in &pages {
        assert_eq!(p["messages"].as_array().map(Vec::len), Some(5), "{p}");
    }
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(n as u32));
}

#[tokio::test]
async fn a_replay_job_takes_the_rates_and_waits_the_cli_takes() {
    // The CLI refuses `--rate 1e-7` (the lock held for 116 days); the page
    // refused only rates of 0 or less, and the job then failed later.
    let f = Fixture::new(3, |_| {}, dead_many(3, |_| "exhausted", |_| "t")).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let path = format!("/api/pipelines/{}/replay", f.pipe.name);
    for (body, says) in [
        (json!({ "all": true, "rate": 1e-7 }), "rate"),
        (json!({ "all": true, "rate": 2e6 }), "rate"),
        (json!({ "all": true, "rate": 0 }), "rate"),
        (json!({ "all": true, "rate": -5 }), "rate"),
        (json!({ "all": true, "canary": 0 }), "canary"),
        (
            json!({ "all": true, "canary": 1, "canary_wait_ms": 90_000_000u64 }),
            "canary",
        ),
    ] {
        let a = s.post_json(&path, body.clone()).await.expect(400);
        assert!(a.text.contains(says), "{body}: {}", a.text);
    }
    assert_eq!(
        s.get("/api/jobs")
            .await
            .expect(200)
            .json()
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(3));
}
