//! `amqps://` against a real TLS listener: a node of its own
//! (`tests/tls-node.sh`, never the machine's main broker) whose server
//! certificate is signed by a CA made at test time; its management API
//! speaks https with the same certificate.

use crate::support::{Dlqctl, Run, Scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

const AMQPS: &str = "amqps://guest:guest@localhost:5689/%2f";
const AMQP_PLAIN: &str = "amqp://guest:guest@localhost:5688/%2f";
const MGMT: &str = "https://localhost:15689";

/// Starts the TLS node (once; concurrent callers wait) and returns its
/// directory of certificates.
fn node() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls-node.sh");
    let out = std::process::Command::new(&script)
        .arg("start")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "the TLS test node did not start (it needs rabbitmq-server and openssl: `apt-get install rabbitmq-server openssl`):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(std::env::var("DLQCTL_TLS_DIR").unwrap_or_else(|_| "/tmp/dlqctl-tls".into()))
}

fn file(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// A one-pipeline topology with a unique name.
fn topology(scratch: &Scratch) -> (String, String) {
    let name = format!("tls-{}", crate::support::unique_prefix());
    let path = scratch.write(
        "t.yaml",
        &format!("version: 1\npipelines:\n  - name: {name}\n    retry: {{delays: [100ms], max_attempts: 2, jitter: 0}}\n"),
    );
    (path.display().to_string(), name)
}

async fn run(args: &[&str]) -> Run {
    Dlqctl::new(args[0]).args(&args[1..]).run().await
}

/// The TLS node's AMQPS address, trusting its CA.
fn amqps_trusting_the_ca(dir: &Path) -> dlqctl::amqp::BrokerUrl {
    amqps_trusting(AMQPS, &dir.join("ca.pem"))
}

/// An AMQPS address, trusting the CA in `ca`.
fn amqps_trusting(url: &str, ca: &Path) -> dlqctl::amqp::BrokerUrl {
    let tls = dlqctl::amqp::connection::Tls::from_files(Some(ca), None, None)
        .expect("the test CA reads")
        .expect("TLS settings");
    dlqctl::amqp::BrokerUrl::parse(url)
        .expect("the AMQPS URL")
        .with_tls(std::sync::Arc::new(tls))
}

/// Where the round trip over AMQPS goes: the AMQPS listener of the broker
/// under test when the environment names one (`DLQCTL_AMQPS_URL` with the
/// CA that signed its certificate in `DLQCTL_TLS_CA`, as
/// `tests/rabbitmq-4.sh` prints), else the TLS node of `tests/tls-node.sh`.
/// Returns the AMQPS URL, the CA file and the management API.
fn amqps_target() -> (String, PathBuf, String) {
    match std::env::var("DLQCTL_AMQPS_URL") {
        Ok(url) => {
            let ca = std::env::var("DLQCTL_TLS_CA")
                .expect("DLQCTL_TLS_CA: the CA of the broker named by DLQCTL_AMQPS_URL");
            (url, PathBuf::from(ca), crate::support::management_url())
        }
        Err(_) => (AMQPS.into(), node().join("ca.pem"), MGMT.into()),
    }
}

/// Deletes the pipeline's objects on the TLS node.
async fn cleanup(dir: &Path, name: &str) {
    cleanup_at(&amqps_trusting_the_ca(dir), name).await;
}

/// Deletes the pipeline's objects through `url`.
async fn cleanup_at(url: &dlqctl::amqp::BrokerUrl, name: &str) {
    let conn = url
        .connect("dlqctl tls test cleanup")
        .await
        .expect("connect for cleanup");
    let ch = conn.create_channel().await.unwrap();
    for q in [
        name.to_string(),
        format!("{name}.retry.100ms"),
        format!("{name}.dlq"),
    ] {
        let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
    }
    for e in [format!("{name}.retry"), format!("{name}.dlx")] {
        let _ = ch
            .exchange_delete(e.as_str().into(), Default::default())
            .await;
    }
    let _ = conn.close(200, "bye".into()).await;
}

#[tokio::test]
async fn every_command_works_over_amqps_with_a_private_ca() {
    let (amqps, ca_file, mgmt) = amqps_target();
    let scratch = Scratch::new();
    let (t, name) = topology(&scratch);
    let ca = ca_file.display().to_string();
    let (amqps, mgmt) = (amqps.as_str(), mgmt.as_str());
    let tls = ["--url", amqps, "--tls-ca", &ca];
    run(&[&["provision", &t][..], &tls].concat())
        .await
        .assert_code(0);
    let check = run(&[
        &["provision", &t, "--check", "--management-url", mgmt][..],
        &tls,
    ]
    .concat())
    .await;
    check.assert_code(0);
    assert!(!check.stdout.contains("unverified"), "{}", check.stdout);
    let status = run(&[
        &["status", &t, "--json", "--management-url", mgmt][..],
        &tls,
    ]
    .concat())
    .await;
    status.assert_code(0);
    let v: Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(v["management_unavailable"], Value::Null, "{v}");
    run(&[&["dlq", "peek", &t, "--queue", &name][..], &tls].concat())
        .await
        .assert_code(0);

    // The worker: a message published over TLS is handled and acked.
    let script = scratch.write("ok.sh", "#!/bin/sh\nexit 0\n");
    Scratch::write_executable(&script, "#!/bin/sh\nexit 0\n");
    let mut w = crate::support::worker::WorkerProc::spawn(
        Path::new(&t),
        &name,
        &[
            "--url",
            amqps,
            "--tls-ca",
            &ca,
            "--",
            script.to_str().unwrap(),
        ],
    );
    w.wait_consuming().await;
    let url = amqps_trusting(amqps, &ca_file);
    let conn = url.connect("dlqctl tls test").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.basic_publish(
        "".into(),
        name.as_str().into(),
        Default::default(),
        b"over tls",
        lapin::BasicProperties::default().with_message_id("t1".into()),
    )
    .await
    .unwrap();
    let d = w.wait_decisions(1, Duration::from_secs(20)).await;
    assert_eq!(d[0]["decision"], "ack", "{d:?}");
    w.stop().await;
    let _ = conn.close(200, "bye".into()).await;
    cleanup_at(&url, &name).await;
}

#[tokio::test]
async fn the_management_api_over_https_uses_the_same_ca() {
    let dir = node();
    let scratch = Scratch::new();
    let (t, name) = topology(&scratch);
    let ca = file(&dir, "ca.pem");
    // Plain AMQP, https management: only the API needs the CA.
    run(&["provision", &t, "--url", AMQP_PLAIN])
        .await
        .assert_code(0);
    let with = run(&[
        "status",
        &t,
        "--json",
        "--url",
        AMQP_PLAIN,
        "--management-url",
        MGMT,
        "--tls-ca",
        &ca,
    ])
    .await;
    with.assert_code(0);
    let v: Value = serde_json::from_str(&with.stdout).unwrap();
    assert_eq!(v["management_unavailable"], Value::Null, "{v}");
    let without = run(&[
        "status",
        &t,
        "--json",
        "--url",
        AMQP_PLAIN,
        "--management-url",
        MGMT,
    ])
    .await;
    without.assert_code(0);
    let v: Value = serde_json::from_str(&without.stdout).unwrap();
    assert!(v["management_unavailable"].is_string(), "{v}");
    cleanup(&dir, &name).await;
}

#[tokio::test]
async fn a_certificate_from_an_unknown_ca_fails_saying_to_give_the_ca() {
    let dir = node();
    let scratch = Scratch::new();
    let (t, _) = topology(&scratch);
    for extra in [
        vec![],
        vec!["--tls-ca".to_string(), file(&dir, "other-ca.pem")],
    ] {
        let r = Dlqctl::new("status")
            .args([&t, "--url", AMQPS])
            .args(extra)
            .run()
            .await;
        r.assert_code(1);
        assert!(
            r.stderr
                .contains("the broker's TLS certificate was refused")
                && r.stderr
                    .contains("give --tls-ca FILE with the CA certificate"),
            "{}",
            r.stderr
        );
        assert!(
            !r.stderr.contains("ERROR"),
            "no dependency's log line: {}",
            r.stderr
        );
    }
}

#[tokio::test]
async fn a_host_the_certificate_does_not_name_is_refused() {
    let dir = node();
    let scratch = Scratch::new();
    let (t, _) = topology(&scratch);
    let r = run(&[
        "status",
        &t,
        "--url",
        "amqps://guest:guest@127.0.0.2:5689/%2f",
        "--tls-ca",
        &file(&dir, "ca.pem"),
    ])
    .await;
    r.assert_code(1);
    assert!(
        r.stderr.contains("does not name the host of the URL"),
        "{}",
        r.stderr
    );
}

/// An expired server certificate, served by `openssl s_server` (the
/// handshake fails before any AMQP).
#[tokio::test]
async fn an_expired_certificate_fails_saying_so() {
    let dir = node();
    let scratch = Scratch::new();
    let (t, _) = topology(&scratch);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut server = tokio::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-accept", &port.to_string()])
        .args([
            "-cert",
            &file(&dir, "expired.pem"),
            "-key",
            &file(&dir, "expired.key"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl s_server");
    crate::support::eventually(
        "openssl s_server listening",
        Duration::from_secs(10),
        || async { std::net::TcpStream::connect(("127.0.0.1", port)).ok() },
    )
    .await;
    let url = format!("amqps://guest:guest@localhost:{port}/%2f");
    let r = run(&[
        "status",
        &t,
        "--url",
        &url,
        "--tls-ca",
        &file(&dir, "ca.pem"),
    ])
    .await;
    r.assert_code(1);
    assert!(
        r.stderr.contains("the broker's certificate has expired"),
        "{}",
        r.stderr
    );
    let _ = server.kill().await;
}

/// A client certificate logs in with EXTERNAL (its CN is the user).
#[tokio::test]
async fn a_client_certificate_logs_in_with_external() {
    let dir = node();
    let scratch = Scratch::new();
    let (t, name) = topology(&scratch);
    let url = "amqps://localhost:5689/%2f?auth_mechanism=external";
    let r = run(&[
        "provision",
        &t,
        "--url",
        url,
        "--tls-ca",
        &file(&dir, "ca.pem"),
        "--tls-cert",
        &file(&dir, "client.pem"),
        "--tls-key",
        &file(&dir, "client.key"),
    ])
    .await;
    r.assert_code(0);
    // Without the certificate, EXTERNAL has nothing to log in with.
    let r = run(&[
        "status",
        &t,
        "--url",
        url,
        "--tls-ca",
        &file(&dir, "ca.pem"),
    ])
    .await;
    r.assert_code(1);
    cleanup(&dir, &name).await;
}

#[tokio::test]
async fn tls_files_that_do_not_read_are_usage_errors() {
    let scratch = Scratch::new();
    let (t, _) = topology(&scratch);
    let not_pem = scratch.write("x.pem", "hello");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--tls-ca", "/nonexistent/ca.pem"],
            "cannot read --tls-ca /nonexistent/ca.pem",
        ),
        (
            vec!["--tls-ca", not_pem.to_str().unwrap()],
            "no PEM certificate in it",
        ),
        (vec!["--tls-cert", not_pem.to_str().unwrap()], "--tls-key"),
    ];
    for (extra, want) in cases {
        let r = run(&[&["status", &t, "--url", AMQPS][..], &extra].concat()).await;
        r.assert_code(2);
        assert!(r.stderr.contains(want), "{extra:?}: {}", r.stderr);
    }
}

/// The management API of another broker (here: the machine's main broker,
/// on the default port, while AMQP reached the TLS node's plain port) is
/// recognised and not used: bindings are unverified, never "missing".
#[tokio::test]
async fn a_management_api_of_another_broker_is_not_taken_for_this_one() {
    let dir = node();
    let scratch = Scratch::new();
    let (t, name) = topology(&scratch);
    run(&["provision", &t, "--url", AMQP_PLAIN])
        .await
        .assert_code(0);
    // No --management-url: the default one (port 15672) is the main broker's.
    let r = run(&["provision", &t, "--check", "--url", AMQP_PLAIN]).await;
    r.assert_code(0);
    assert!(
        r.stdout.contains("belongs to another broker")
            && r.stdout
                .contains("than the AMQP connection reached; its state is not")
            && r.stdout.contains("unverified")
            && !r.stdout.contains("missing"),
        "{}",
        r.stdout
    );
    let r = run(&["status", &t, "--json", "--url", AMQP_PLAIN]).await;
    r.assert_code(0);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(
        v["management_unavailable"]
            .as_str()
            .is_some_and(|s| s.contains("belongs to another broker")),
        "{v}"
    );
    cleanup(&dir, &name).await;
}

/// Sets the TLS node's `max_message_size` (bytes); restores the default
/// when dropped.
struct SizeLimit;

impl SizeLimit {
    fn set(bytes: u64) -> SizeLimit {
        let ok = std::process::Command::new("rabbitmqctl")
            .args(["-n", "dlqctltls@localhost", "eval"])
            .arg(format!(
                "application:set_env(rabbit, max_message_size, {bytes})."
            ))
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(ok, "rabbitmqctl eval on the TLS node failed");
        SizeLimit
    }
}

impl Drop for SizeLimit {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["-n", "dlqctltls@localhost", "eval"])
            .arg("application:set_env(rabbit, max_message_size, 134217728).")
            .output();
    }
}

/// A message queued before the broker's size limit was lowered: its retry
/// copy is refused for its size. The worker neither stalls nor loops: it
/// nacks the message so the broker dead-letters it, and goes on. The
/// broker closes the publishing channel for it, which fails every copy in
/// flight on that channel with the same error: the small messages among
/// them are retried as usual, none taken for too large.
#[tokio::test]
async fn a_copy_refused_for_its_size_is_dead_lettered_not_retried_for_ever() {
    const SMALL: usize = 40;
    let dir = node();
    let scratch = Scratch::new();
    let (t, name) = topology(&scratch);
    run(&["provision", &t, "--url", AMQP_PLAIN])
        .await
        .assert_code(0);
    let conn = dlqctl::amqp::BrokerUrl::parse(AMQP_PLAIN)
        .unwrap()
        .connect("dlqctl size test")
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    let mut messages = vec![("big".to_string(), 2_000_000usize)];
    messages.extend((0..SMALL).map(|i| (format!("small-{i}"), 10)));
    for (id, size) in &messages {
        ch.basic_publish(
            "".into(),
            name.as_str().into(),
            Default::default(),
            &vec![b'x'; *size],
            lapin::BasicProperties::default().with_message_id(id.as_str().into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let _limit = SizeLimit::set(1_000_000);
    let script = scratch.path().join("fail.sh");
    Scratch::write_executable(&script, "#!/bin/sh\nexit 1\n");
    let mut w = crate::support::worker::WorkerProc::spawn(
        Path::new(&t),
        &name,
        &[
            "--url",
            AMQP_PLAIN,
            "--concurrency",
            "16",
            "--",
            script.to_str().unwrap(),
        ],
    );
    w.wait_consuming().await;
    // Each small message is retried, then dead-lettered as usual; `big`
    // at once. Two things the broker does make a message come back more
    // than once (at least once, as documented), never lost:
    // - a small copy it had queued when it closed the channel, but not
    //   yet confirmed, is published again (a duplicate);
    // - lapin may still send a frame on that channel after the close, and
    //   RabbitMQ then closes the whole connection ("expected
    //   'channel.open'", seen on 3.10.8): the worker reconnects and every
    //   message in flight is redelivered (logged `abandoned` first).
    // What must never happen is a small message taken for too large, or
    // one that never reaches the DLQ.
    // What a small message may be logged: anything else is a defect.
    const SMALL_DECISIONS: [&str; 3] = ["retry", "dead_letter", "abandoned"];
    let dead_lettered = |d: &[Value], id: &str| {
        d.iter()
            .any(|e| e["message_id"] == id && e["decision"] == "dead_letter")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let d = w.decisions();
        // A small message taken for too large fails at once.
        if let Some(e) = d.iter().find(|e| {
            e["message_id"] != "big"
                && !SMALL_DECISIONS.contains(&e["decision"].as_str().unwrap_or(""))
        }) {
            panic!("{e}: {d:#?}\n{}", w.output());
        }
        if (0..SMALL).all(|i| dead_lettered(&d, &format!("small-{i}"))) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every small message was dead-lettered within 60 s: {d:#?}\n{}",
            w.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        w.output()
            .contains("the broker refuses copies of this message for its size"),
        "{}",
        w.output()
    );
    // A duplicate comes back later than its original: the log is read
    // again once the worker has stopped, and matches the DLQ then.
    w.stop().await;
    let d = w.decisions();
    let of = |id: &str| -> Vec<&str> {
        d.iter()
            .filter(|e| e["message_id"] == id)
            .map(|e| e["decision"].as_str().unwrap_or(""))
            .collect()
    };
    let big = of("big");
    assert!(
        big.contains(&"dead_letter_nack")
            && big
                .iter()
                .all(|s| *s == "dead_letter_nack" || *s == "abandoned"),
        "big: {big:?}: {d:#?}"
    );
    assert!(d
        .iter()
        .filter(|e| e["message_id"] == "big" && e["decision"] == "dead_letter_nack")
        .all(|e| e["reason"] == "too_large"));
    for i in 0..SMALL {
        let small = of(&format!("small-{i}"));
        // A retry, then a dead-letter; more of either when the message
        // came back more than once; `abandoned` when its connection went.
        assert!(
            small.contains(&"retry")
                && small.contains(&"dead_letter")
                && small.iter().all(|s| SMALL_DECISIONS.contains(s)),
            "small-{i}: {small:?}: {d:#?}"
        );
    }
    // Every message is in the DLQ (some twice), and nothing else is.
    let dlq = format!("{name}.dlq");
    let mut ids = std::collections::BTreeSet::new();
    while let Some(m) = ch
        .basic_get(
            dlq.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        ids.insert(
            m.properties
                .message_id()
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or_default(),
        );
    }
    assert_eq!(ids.len(), 1 + SMALL, "{ids:?}");
    assert!(ids.contains("big"), "{ids:?}");
    let _ = conn.close(200, "bye".into()).await;
    cleanup(&dir, &name).await;
}
