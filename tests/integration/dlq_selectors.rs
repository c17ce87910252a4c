//! Selectors that cannot match are errors, not "nothing to do": an
//! unknown `--filter-reason` (refused by the argument parser, naming the
//! reasons) and a `--group` that no message of the snapshot belongs to
//! (exit 2 after the read, naming the groups), for every DLQ command and
//! for the web API (400). And `purge` counts under the DLQ's lock.

use crate::dlq::hold_lock;
use crate::support::dlq::{dead, dlq, Fixture};
use crate::support::serve::Served;
use serde_json::json;
use std::time::Duration;

/// Two groups: 3 × (exhausted, "timeout"), 1 × (permanent, "bad input").
fn two_groups() -> Vec<(Vec<u8>, lapin::BasicProperties)> {
    let mut out: Vec<_> = (0..3)
        .map(|k| {
            (
                b"t".to_vec(),
                dead(&format!("t-{k}"), "exhausted", "timeout", "a"),
            )
        })
        .collect();
    out.push((b"p".to_vec(), dead("p-0", "permanent", "bad input", "b")));
    out
}

/// The group ids of the DLQ, from `summary --json`.
async fn group_ids(f: &Fixture) -> Vec<String> {
    let run = dlq("summary", &f.file, &f.pipe.name, &["--json"]).await;
    run.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("JSON");
    v["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["id"].as_str().expect("an id").to_string())
        .collect()
}

const VERBS: [&str; 5] = ["peek", "summary", "export", "replay", "purge"];

#[tokio::test]
async fn an_unknown_reason_is_refused_naming_the_reasons() {
    let f = Fixture::new(3, |_| {}, two_groups()).await;
    for verb in VERBS {
        let run = dlq(verb, &f.file, &f.pipe.name, &["--filter-reason", "perm"]).await;
        run.assert_code(2);
        let out = run.output();
        for known in dlqctl::core::dlq::select::REASONS {
            assert!(out.contains(known), "{verb}: {known} not named:\n{out}");
        }
    }
    // A known one is taken.
    let run = dlq(
        "peek",
        &f.file,
        &f.pipe.name,
        &["--filter-reason", "permanent"],
    )
    .await;
    run.assert_code(0);
    assert!(run.stdout.contains("p-0"), "{}", run.stdout);
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(4));
}

#[tokio::test]
async fn a_group_not_in_the_snapshot_is_usage_naming_the_groups() {
    let f = Fixture::new(3, |_| {}, two_groups()).await;
    let ids = group_ids(&f).await;
    assert_eq!(ids.len(), 2);
    for verb in VERBS {
        let extra: &[&str] = match verb {
            "purge" => &["--group", "zzz", "--yes"],
            "replay" => &["--group", "zzz", "--canary", "1", "--canary-wait", "1s"],
            _ => &["--group", "zzz"],
        };
        let run = dlq(verb, &f.file, &f.pipe.name, extra).await;
        run.assert_code(2);
        let out = run.output();
        assert!(
            out.contains("--group zzz is not a group of"),
            "{verb}:\n{out}"
        );
        for id in &ids {
            assert!(
                out.contains(id.as_str()),
                "{verb}: group {id} not named:\n{out}"
            );
        }
        assert!(out.contains("(exhausted, 3)"), "{verb}:\n{out}");
    }
    // Nothing moved or went.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(4));
    assert_eq!(f.b.message_count(&f.pipe.name).await, Some(0));
    // A group that exists still works, whatever the case of its id.
    let run = dlq(
        "peek",
        &f.file,
        &f.pipe.name,
        &["--group", &ids[0].to_uppercase(), "--json"],
    )
    .await;
    run.assert_code(0);
}

#[tokio::test]
async fn the_web_api_answers_400_to_a_group_not_in_the_dlq() {
    let f = Fixture::new(3, |_| {}, two_groups()).await;
    let ids = group_ids(&f).await;
    let s = Served::start(&f.file, &[] as &[&str]).await;
    let name = &f.pipe.name;
    let a = s
        .get(&format!("/api/pipelines/{name}/messages?group=zzz"))
        .await
        .expect(400);
    let e = a.json()["error"].as_str().unwrap_or_default().to_string();
    assert!(e.contains("zzz") && e.contains(&ids[0]), "{e}");
    for verb in ["replay", "export", "purge"] {
        let mut body = json!({ "group": "zzz" });
        if verb == "purge" {
            body["expected"] = json!(4);
        }
        let a = s
            .post_json(&format!("/api/pipelines/{name}/{verb}"), body)
            .await
            .expect(400);
        let e = a.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(
            e.contains("is not a group of") && ids.iter().all(|id| e.contains(id.as_str())),
            "{verb}: {e}"
        );
    }
    // No job started; the DLQ is whole.
    let jobs = s.get("/api/jobs").await.expect(200).json();
    assert_eq!(jobs.as_array().map_or(0, Vec::len), 0, "{jobs}");
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(4));
    // A group that exists starts its job.
    s.post_json(
        &format!("/api/pipelines/{name}/export"),
        json!({ "group": ids[0] }),
    )
    .await
    .expect(202);
}

/// `purge` without `--yes` counts under the lock: busy (exit 1) while
/// another command holds it, and with `--wait` it waits, then counts
/// every message.
#[tokio::test]
async fn purge_counts_under_the_lock_and_honours_wait() {
    let f = Fixture::new(3, |_| {}, two_groups()).await;
    let lock = hold_lock(&f.b, &f.pipe.dlq()).await;
    let run = dlq("purge", &f.file, &f.pipe.name, &[]).await;
    run.assert_code(1);
    assert!(run.output().contains("busy"), "{}", run.output());

    let (file, name) = (f.file.clone(), f.pipe.name.clone());
    let waiting = tokio::spawn(async move { dlq("purge", &file, &name, &["--wait"]).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "purge --wait waits for the lock");
    lock.release().await;
    let run = waiting.await.expect("the purge");
    run.assert_code(2);
    assert!(run.output().contains("4 of 4 messages"), "{}", run.output());
    // In JSON, a count says what it holds: selected, none removed.
    let run = dlq("purge", &f.file, &f.pipe.name, &["--json"]).await;
    run.assert_code(2);
    let r: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("JSON");
    assert_eq!(
        (&r["selected"], &r["removed"], &r["counted_only"]),
        (&json!(4), &json!(0), &json!(true)),
        "{r:#}"
    );
    assert_eq!(f.b.message_count(&f.pipe.dlq()).await, Some(4));
}

/// Every JSON document, whatever the command, is pretty-printed the same
/// way (`export --json` printed one line while the others were pretty).
#[tokio::test]
async fn every_json_document_is_pretty_printed_the_same_way() {
    let f = Fixture::new(3, |_| {}, two_groups()).await;
    let scratch = crate::support::Scratch::new();
    let out = scratch.path().join("x.jsonl");
    let out = out.display().to_string();
    let file = f.file.display().to_string();
    let q = f.pipe.name.as_str();
    let mut runs = Vec::new();
    for (verb, extra, code) in [
        ("export", &["--output", out.as_str(), "--json"][..], 0),
        ("summary", &["--json"], 0),
        ("peek", &["--json"], 0),
        ("replay", &["--dry-run", "--json"], 0),
        ("purge", &["--json"], 2),
    ] {
        let run = dlq(verb, &f.file, q, extra).await;
        run.assert_code(code);
        runs.push((format!("dlq {verb}"), run.stdout));
    }
    for (args, code) in [
        (vec!["status", &file, "--json"], 0),
        (vec!["provision", &file, "--json"], 0),
        (vec!["provision", &file, "--check", "--format", "json"], 0),
        (vec!["provision", &file, "--dry-run", "--format", "json"], 0),
        (vec!["doctor", &file, "--queue", q, "--format", "json"], 3),
    ] {
        let run = crate::support::Dlqctl::new(args[0])
            .args(&args[1..])
            .run()
            .await;
        assert!(
            [0, code].contains(&run.code.unwrap_or(-1)),
            "{args:?}: exit {:?}\n{}",
            run.code,
            run.output()
        );
        runs.push((args[..args.len().min(3)].join(" "), run.stdout));
    }
    for (what, text) in &runs {
        let v: serde_json::Value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{what}: not one JSON document ({e}):\n{text}"));
        // The same lines as serde_json's pretty form (in another order
        // when the keys are: a map here sorts them).
        let lines = |t: &str| {
            let mut l: Vec<String> = t
                .lines()
                .map(|l| l.trim_end_matches(',').to_string())
                .collect();
            l.sort();
            l
        };
        assert_eq!(
            lines(text.trim()),
            lines(&serde_json::to_string_pretty(&v).unwrap()),
            "{what}: not pretty-printed:\n{text}"
        );
    }
}
