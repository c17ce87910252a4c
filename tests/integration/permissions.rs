//! Least privilege, in a scratch virtual host with scratch users (made and
//! removed through the management API): what each command needs, and how
//! a missing permission is reported. The tests change users and
//! permissions, so they are `serial_` (run alone; .config/nextest.toml).

use crate::support::script::Script;
use crate::support::worker::*;
use crate::support::{amqp_url_with, management_url, unique_prefix, Dlqctl, Scratch};
use serde_json::json;
use std::time::Duration;

/// A scratch vhost (guest may do anything in it) and users, deleted when
/// dropped.
struct Scope {
    prefix: String,
    vhost: String,
    users: std::sync::Mutex<Vec<String>>,
    client: reqwest::Client,
}

impl Scope {
    async fn new() -> Scope {
        crate::support::allow_disruption("adds users and a virtual host to the broker");
        let prefix = unique_prefix();
        let s = Scope {
            vhost: format!("{prefix}-vh"),
            prefix,
            users: Default::default(),
            client: reqwest::Client::new(),
        };
        s.put(&["vhosts", &s.vhost], json!({})).await;
        s.put(
            &["permissions", &s.vhost, "guest"],
            json!({"configure": ".*", "write": ".*", "read": ".*"}),
        )
        .await;
        s
    }

    fn api(&self, segments: &[&str]) -> reqwest::Url {
        let mut u = reqwest::Url::parse(&management_url()).expect("management URL");
        u.set_username("").ok();
        u.set_password(None).ok();
        {
            let mut p = u.path_segments_mut().expect("a base URL");
            p.pop_if_empty().push("api");
            for s in segments {
                p.push(s);
            }
        }
        u
    }

    async fn put(&self, segments: &[&str], body: serde_json::Value) {
        let r = self
            .client
            .put(self.api(segments))
            .basic_auth("guest", Some("guest"))
            .json(&body)
            .send()
            .await
            .expect("management API");
        assert!(r.status().is_success(), "PUT {segments:?}: {}", r.status());
    }

    /// The scratch vhost's AMQP URL for `user`.
    fn url(&self, user: &str, password: &str) -> String {
        amqp_url_with("amqp", user, password, &self.vhost, "")
    }

    /// A user with these permissions (regexes) in the scratch vhost.
    async fn user(&self, name: &str, configure: &str, write: &str, read: &str) -> String {
        let user = format!("{}-{name}", self.prefix);
        self.put(&["users", &user], json!({"password": "pw", "tags": ""}))
            .await;
        self.put(
            &["permissions", &self.vhost, &user],
            json!({"configure": configure, "write": write, "read": read}),
        )
        .await;
        self.users.lock().unwrap().push(user.clone());
        self.url(&user, "pw")
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let mut paths = vec![self.api(&["vhosts", &self.vhost])];
        for u in self.users.lock().unwrap().iter() {
            paths.push(self.api(&["users", u]));
        }
        // A thread of its own: the test's runtime may be gone.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                let c = reqwest::Client::new();
                for p in paths {
                    let _ = c.delete(p).basic_auth("guest", Some("guest")).send().await;
                }
            })
        })
        .join();
    }
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                vec![c]
            } else {
                vec!['\\', c]
            }
        })
        .collect()
}

/// A pipeline `orders` in the scratch vhost, provisioned by guest.
async fn provisioned(scope: &Scope, scratch: &Scratch) -> (std::path::PathBuf, String) {
    let name = format!("{}-orders", scope.prefix);
    let file = scratch.write(
        "t.yaml",
        &format!("version: 1\npipelines:\n  - name: {name}\n    retry: {{delays: [100ms], max_attempts: 2, jitter: 0}}\n"),
    );
    let r = Dlqctl::new("provision")
        .arg(&file)
        .args(["--url", &scope.url("guest", "guest")])
        .run()
        .await;
    r.assert_code(0);
    (file, name)
}

async fn publish_to(url: &str, queue: &str, id: &str, body: &[u8]) {
    let conn = dlqctl::amqp::BrokerUrl::parse(url)
        .unwrap()
        .connect("dlqctl permissions test")
        .await
        .expect("connect as guest");
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    ch.basic_publish(
        "".into(),
        queue.into(),
        Default::default(),
        body,
        lapin::BasicProperties::default().with_message_id(id.into()),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let _ = conn.close(200, "bye".into()).await;
}

/// A worker with no configure permission, read on its main queue and write
/// on its retry exchange and DLX only: it starts (trusting the file for
/// the arguments it cannot compare), retries, and dead-letters.
#[tokio::test]
async fn serial_a_worker_needs_read_on_its_queue_and_write_on_its_exchanges() {
    crate::support::allow_disruption("adds users and a virtual host to the broker");
    let scope = Scope::new().await;
    let scratch = Scratch::new();
    let (file, name) = provisioned(&scope, &scratch).await;
    let n = regex_escape(&name);
    let url = scope
        .user(
            "worker",
            "^$",
            &format!("^({n}\\.retry|{n}\\.dlx)$"),
            &format!("^{n}$"),
        )
        .await;
    // Fails on the first run, succeeds on the second; `perm` fails for good.
    let script = Script::new(
        &scratch,
        "h",
        r#"if [ "$DLQCTL_MESSAGE_ID" = perm ]; then echo "bad data" >&2; exit 65; fi
if [ "$DLQCTL_ATTEMPT" = 1 ]; then echo "down" >&2; exit 1; fi
exit 0"#,
    );
    let mut w = WorkerProc::with_script(&file, &name, &script, &["--url", &url]);
    w.wait_consuming().await;
    let guest = scope.url("guest", "guest");
    publish_to(&guest, &name, "retry-me", b"x").await;
    publish_to(&guest, &name, "perm", b"x").await;
    let d = w.wait_decisions(3, Duration::from_secs(30)).await;
    let of = |id: &str| -> Vec<String> {
        d.iter()
            .filter(|e| e["message_id"] == id)
            .map(|e| e["decision"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(of("retry-me"), vec!["retry", "ack"], "{d:#?}");
    assert_eq!(of("perm"), vec!["dead_letter"], "{d:#?}");
    let trusted = w.lines().iter().any(|l| {
        l.contains(
            "cannot compare the topology's arguments (no configure permission); trusting the file",
        )
    });
    assert!(trusted, "{}", w.output());
    w.stop().await;
}

/// `provision` as a user without configure permission fails (exit 1),
/// naming the object and the permission it lacks.
#[tokio::test]
async fn serial_provision_without_configure_names_the_object_and_permission() {
    crate::support::allow_disruption("adds users and a virtual host to the broker");
    let scope = Scope::new().await;
    let scratch = Scratch::new();
    let name = format!("{}-orders", scope.prefix);
    let file = scratch.write(
        "t.yaml",
        &format!("version: 1\npipelines:\n  - name: {name}\n    retry: {{delays: [100ms], max_attempts: 2}}\n"),
    );
    let url = scope.user("noconf", "^$", ".*", ".*").await;
    let r = Dlqctl::new("provision")
        .arg(&file)
        .args(["--url", &url])
        .run()
        .await;
    r.assert_code(1);
    assert!(
        r.stderr
            .contains(&format!("exchange {name}.retry: ACCESS_REFUSED"))
            && r.stderr.contains("the broker refused these:")
            && r.stderr
                .contains("needs the configure permission on its name"),
        "{}",
        r.stderr
    );
}

/// The DLQ commands need read on the DLQ, configure on their lock queue
/// (`dlqctl.lock.<DLQ>`), and write where they publish (the default
/// exchange, for replay).
#[tokio::test]
async fn serial_dlq_commands_need_read_on_the_dlq_and_write_where_they_publish() {
    crate::support::allow_disruption("adds users and a virtual host to the broker");
    let scope = Scope::new().await;
    let scratch = Scratch::new();
    let (file, name) = provisioned(&scope, &scratch).await;
    let dlq = format!("{name}.dlq");
    let guest = scope.url("guest", "guest");
    publish_to(&guest, &dlq, "d1", b"x").await;
    let d = regex_escape(&dlq);
    let reader = scope
        .user(
            "reader",
            &format!("^dlqctl\\.lock\\.{d}$"),
            "^$",
            &format!("^{d}$"),
        )
        .await;
    let f = file.to_str().unwrap();
    let r = Dlqctl::new("dlq")
        .args(["peek", f, "--queue", &name, "--url", &reader])
        .run()
        .await;
    r.assert_code(0);
    assert!(r.stdout.contains("d1"), "{}", r.stdout);
    // Replay publishes: without write on the default exchange it is refused
    // (exit 1) and the message stays in the DLQ.
    let r = Dlqctl::new("dlq")
        .args(["replay", f, "--queue", &name, "--url", &reader])
        .run()
        .await;
    r.assert_code(1);
    let replayer = scope
        .user(
            "replayer",
            &format!("^dlqctl\\.lock\\.{d}$"),
            "^amq\\.default$",
            &format!("^{d}$"),
        )
        .await;
    let r = Dlqctl::new("dlq")
        .args(["replay", f, "--queue", &name, "--url", &replayer])
        .run()
        .await;
    r.assert_code(0);
    let r = Dlqctl::new("status")
        .args([f, "--url", &guest, "--json"])
        .run()
        .await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["pipelines"][0]["main"]["ready"], 1, "{v}");
    assert_eq!(v["pipelines"][0]["dlq"]["ready"], 0, "{v}");
}
