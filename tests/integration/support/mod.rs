//! What the integration tests share: the broker (AMQP and the
//! management API), unique names, scratch files, running the built binary,
//! and a guard that deletes what a test made.
//!
//! Every test talks to a real RabbitMQ. The address comes from `AMQP_URL`
//! (default `amqp://guest:guest@127.0.0.1:5672/%2f`) and the management API
//! from `DLQCTL_MANAGEMENT_URL` (default `http://127.0.0.1:15672`). When no
//! broker answers, [`Broker::connect`] panics with a message that says how
//! to start one: the tests fail, they never skip.
//!
//! Other test processes (and other people) use the same broker at the same
//! time, so a test names everything with [`unique_prefix`] and holds a
//! [`Cleanup`] that deletes every queue and exchange under that prefix when
//! it is dropped, also when the test panics.

pub mod chaos;
pub mod dependency;
pub mod dlq;
pub mod policy;
pub mod redis;
pub mod relay;
pub mod script;
pub mod serve;
pub mod worker;

use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The path of `path` in the repository.
pub fn repo(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

/// The YAML file at `path` in the repository, as JSON values.
pub fn read_yaml(path: &str) -> Value {
    let full = repo(path);
    let text = std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{full} is not YAML: {e}"))
}

/// The strings of a JSON array (none when `v` is not an array).
pub fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The broker URL the tests use.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| dlqctl::amqp::connection::DEFAULT_URL.to_string())
}

/// The broker under test's URL with another scheme, user, password, vhost
/// or query: tests that need a wrong URL still point at the broker under
/// test (its host and port), never at a fixed 127.0.0.1:5672.
pub fn amqp_url_with(scheme: &str, user: &str, password: &str, vhost: &str, query: &str) -> String {
    let url = reqwest::Url::parse(&amqp_url()).expect("AMQP_URL is a URL");
    let host = url.host_str().expect("AMQP_URL names a host");
    let port = url.port().unwrap_or(5672);
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    format!("{scheme}://{user}:{password}@{host}:{port}/{vhost}{query}")
}

/// The management API the tests use.
pub fn management_url() -> String {
    std::env::var("DLQCTL_MANAGEMENT_URL").unwrap_or_else(|_| "http://127.0.0.1:15672".into())
}

/// The environment of every dlqctl process a test starts: the broker
/// under test, over AMQP and its management API (never the defaults, which
/// may belong to another broker).
pub fn broker_env() -> [(&'static str, String); 2] {
    [
        ("AMQP_URL", amqp_url()),
        ("DLQCTL_MANAGEMENT_URL", management_url()),
    ]
}

/// What to do when no broker answers.
pub const START_HINT: &str = "start a local RabbitMQ with `rabbitmq-server -detached` \
(management plugin: `rabbitmq-plugins enable rabbitmq_management`), \
or point AMQP_URL / DLQCTL_MANAGEMENT_URL at one";

/// Fails the test unless `DLQCTL_TEST_DISRUPTIVE=1` allows it to disrupt
/// the broker (`what`: what it does, "restarts the broker"). Every test
/// that restarts or reconfigures the broker, closes other clients'
/// connections or changes its users calls it first; such tests are named
/// `serial_` and the default nextest profile leaves them out. They never
/// skip: selected without the variable (by `-E`, another profile, or
/// `cargo test`), they fail saying why, before touching the broker.
pub fn allow_disruption(what: &str) {
    const VAR: &str = "DLQCTL_TEST_DISRUPTIVE";
    let value = std::env::var(VAR).unwrap_or_default();
    let broker = reqwest::Url::parse(&amqp_url())
        .map(|u| {
            format!(
                "{}:{}",
                u.host_str().unwrap_or(""),
                u.port().unwrap_or(5672)
            )
        })
        .unwrap_or_else(|_| "AMQP_URL".into());
    assert!(
        value == "1",
        "this test {what}, which is not for a broker others use (this one is at {broker}), so \
         it runs only with {VAR}=1 ({}). Set it only for a broker of your own, with the `ci` \
         nextest profile, which runs these tests one at a time: `{VAR}=1 cargo nextest run \
         --profile ci` (docs/development.md, \"Tests that disrupt the broker\")",
        if value.is_empty() {
            format!("{VAR} is unset")
        } else {
            format!("{VAR} is {value:?}")
        },
    );
}

/// A name prefix no other test uses: `it-<8 hex>`.
pub fn unique_prefix() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("it-{}", &id[..8])
}

/// GET `url` (10 s at most): its status and body; panics naming the URL
/// when nothing answers.
pub async fn http_get(url: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

/// Polls `f` until it returns `Some`, or panics after `deadline` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------- broker

/// A connection to the test broker over AMQP and the management API.
pub struct Broker {
    /// The AMQP connection (the tests' own, not dlqctl's).
    pub conn: Connection,
    /// The management API.
    pub mgmt: Mgmt,
}

/// A publish that the broker refused or returned.
#[derive(Debug)]
pub struct NotAccepted(pub String);

impl Broker {
    /// Connects to [`amqp_url`] and checks that the management API answers;
    /// panics with [`START_HINT`] when either does not.
    pub async fn connect() -> Broker {
        let url = amqp_url();
        let props = ConnectionProperties::default()
            .with_connection_name(lapin::types::LongString::from("dlqctl integration test"));
        let conn =
            match tokio::time::timeout(Duration::from_secs(10), Connection::connect(&url, props))
                .await
            {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => panic!(
                    "no RabbitMQ answers at {}: {e}\n{START_HINT}",
                    dlqctl::amqp::connection::redact(&url)
                ),
                Err(_) => panic!(
                    "no RabbitMQ answers at {} within 10s\n{START_HINT}\n\
                     A node that accepts TCP but does not answer may be out of file \
                     handles: `rabbitmqctl status` shows them under File Descriptors; \
                     see docs/development.md, \"The broker for the tests\"",
                    dlqctl::amqp::connection::redact(&url)
                ),
            };
        let mgmt = Mgmt::new();
        if let Err(e) = mgmt.request(reqwest::Method::GET, &["overview"]).await {
            panic!(
                "the RabbitMQ management API does not answer at {}: {e}\n{START_HINT}",
                mgmt.base
            );
        }
        Broker { conn, mgmt }
    }

    /// The broker's version (`rabbitmq_version` of the management API's
    /// overview) as (major, minor): tests whose broker behaviour differs
    /// by version read it instead of assuming the machine's broker.
    pub async fn version(&self) -> (u32, u32) {
        let overview = self.mgmt.get(&["overview"]).await.expect("an overview");
        let text = overview["rabbitmq_version"].as_str().unwrap_or_default();
        let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) => (major, minor),
            _ => panic!("the management API reports no usable rabbitmq_version: {overview}"),
        }
    }

    /// The largest body this broker takes, up to `want` bytes, asked of the
    /// broker itself: a body of `want` bytes is published (unroutable, not
    /// mandatory, so nothing is stored); a broker whose `max_message_size`
    /// is lower closes the channel naming its limit ("message size N is
    /// larger than configured max size M"), and M is returned. RabbitMQ 4.x
    /// defaults to 16 MiB, 3.10 to 128 MiB.
    pub async fn largest_body(&self, want: usize) -> usize {
        let ch = self.confirm_channel().await;
        let body = vec![0u8; want];
        let outcome = match ch
            .basic_publish(
                "".into(),
                "dlqctl-test-size-probe-routes-nowhere".into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default(),
            )
            .await
        {
            Ok(confirm) => confirm.await.map(|_| ()),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => {
                let _ = ch.close(200, "bye".into()).await;
                want
            }
            Err(e) => {
                let text = e.to_string();
                let limit = text
                    .split("configured max size ")
                    .nth(1)
                    .and_then(|rest| {
                        let digits: String =
                            rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                        digits.parse::<usize>().ok()
                    })
                    .unwrap_or_else(|| panic!("a {want}-byte probe publish failed: {text}"));
                limit.min(want)
            }
        }
    }

    /// A fresh channel (a 404/406 closes a channel, so tests use one per step).
    pub async fn channel(&self) -> Channel {
        self.conn.create_channel().await.expect("open a channel")
    }

    /// A fresh channel in confirm mode.
    async fn confirm_channel(&self) -> Channel {
        let ch = self.channel().await;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm.select");
        ch
    }

    /// Publishes `body` persistent and `mandatory`, waits for the broker's
    /// confirm, and panics if it was nacked or returned as unroutable.
    pub async fn publish(&self, exchange: &str, routing_key: &str, body: &[u8]) {
        if let Err(NotAccepted(why)) = self
            .try_publish(exchange, routing_key, body, BasicProperties::default())
            .await
        {
            panic!("publish to {exchange:?} [{routing_key}] not accepted: {why}");
        }
    }

    /// Publishes each (body, properties) persistent and `mandatory` on one
    /// confirm-mode channel, all confirms in flight at once; panics unless
    /// every one is acked and routed.
    pub async fn publish_all(
        &self,
        exchange: &str,
        routing_key: &str,
        msgs: impl IntoIterator<Item = (Vec<u8>, BasicProperties)>,
    ) {
        let ch = self.confirm_channel().await;
        let mut pending = Vec::new();
        for (body, props) in msgs {
            let id = props
                .message_id()
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or_default();
            let confirm = start_publish(&ch, exchange, routing_key, &body, props).await;
            pending.push((id, confirm));
        }
        for (id, confirm) in pending {
            match confirm.await {
                Ok(Confirmation::Ack(None)) => {}
                other => panic!("publish of {id} not accepted: {other:?}"),
            }
        }
        let _ = ch.close(200, "bye".into()).await;
    }

    /// Publishes `body` with `props` (persistent forced), `mandatory`, and
    /// waits for the confirm: `Err` when nacked or returned.
    pub async fn try_publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), NotAccepted> {
        let ch = self.confirm_channel().await;
        let confirm = start_publish(&ch, exchange, routing_key, body, props)
            .await
            .await
            .unwrap_or_else(|e| panic!("confirm of a publish to {exchange:?}: {e}"));
        let _ = ch.close(200, "bye".into()).await;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            other => Err(NotAccepted(format!("{other:?}"))),
        }
    }

    /// Declares a queue with these arguments (durable), e.g. to make drift
    /// on purpose or a spy queue. Panics if the broker refuses.
    pub async fn declare_queue(&self, name: &str, arguments: FieldTable) {
        let ch = self.channel().await;
        ch.queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .unwrap_or_else(|e| panic!("declare queue {name}: {e}"));
        let _ = ch.close(200, "bye".into()).await;
    }

    /// The ready messages of a queue, from a passive declare (immediate,
    /// unlike the management API's counts); `None` when it does not exist.
    pub async fn message_count(&self, queue: &str) -> Option<u32> {
        let ch = self.channel().await;
        let res = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        match res {
            Ok(q) => {
                let _ = ch.close(200, "bye".into()).await;
                Some(q.message_count())
            }
            Err(_) => None,
        }
    }

    /// Waits until `queue` holds exactly `n` ready messages; panics after
    /// `deadline` with the last count seen.
    pub async fn wait_for_count(&self, queue: &str, n: u32, deadline: Duration) {
        let start = Instant::now();
        loop {
            let c = self.message_count(queue).await;
            if c == Some(n) {
                return;
            }
            if start.elapsed() > deadline {
                panic!("queue {queue}: wanted {n} message(s) within {deadline:?}, has {c:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes one message from `queue` and acks it (`None` when empty).
    pub async fn get(&self, queue: &str) -> Option<lapin::message::Delivery> {
        let ch = self.channel().await;
        let m = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap_or_else(|e| panic!("basic.get from {queue}: {e}"))?;
        m.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
        let _ = ch.close(200, "bye".into()).await;
        Some(m.delivery)
    }
}

/// Publishes `body` persistent and `mandatory` on `ch` (in confirm mode);
/// the broker's confirm is still to come.
async fn start_publish(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: BasicProperties,
) -> lapin::PublisherConfirm {
    ch.basic_publish(
        exchange.into(),
        routing_key.into(),
        BasicPublishOptions {
            mandatory: true,
            immediate: false,
        },
        body,
        props.with_delivery_mode(2),
    )
    .await
    .unwrap_or_else(|e| panic!("publish to {exchange:?} [{routing_key}]: {e}"))
}

// ---------------------------------------------------------------- management API

/// A minimal management API client for reading back what exists.
#[derive(Clone)]
pub struct Mgmt {
    base: reqwest::Url,
    user: String,
    password: String,
    client: reqwest::Client,
}

/// A queue as `GET /api/queues/%2F/NAME` describes it.
#[derive(Debug, Clone)]
pub struct QueueInfo {
    /// `x-` arguments with their JSON types (integers stay numbers).
    pub arguments: serde_json::Map<String, Value>,
    /// Durable flag.
    pub durable: bool,
    /// `quorum` or `classic`.
    pub kind: String,
    /// The whole document.
    pub raw: Value,
}

impl Mgmt {
    /// A client for [`management_url`], with the credentials of [`amqp_url`].
    pub fn new() -> Mgmt {
        Mgmt::with(&management_url(), &amqp_url())
    }

    /// A client for the management API at `management_url`, with the
    /// credentials of `amqp_url` (another broker than the default one).
    pub fn with(management_url: &str, amqp_url: &str) -> Mgmt {
        let mut base = reqwest::Url::parse(management_url)
            .unwrap_or_else(|e| panic!("management URL {management_url}: {e}"));
        let amqp = dlqctl::amqp::connection::BrokerUrl::parse(amqp_url).unwrap_or_else(|e| {
            panic!(
                "AMQP URL {}: {e}",
                dlqctl::amqp::connection::redact(amqp_url)
            )
        });
        // Credentials in the management URL win over the AMQP URL's, and
        // leave the URL: sent both ways, the API answers 400.
        let (mut user, mut password) = (amqp.user().to_string(), amqp.password().to_string());
        if !base.username().is_empty() {
            let decode = |s: &str| {
                let b = s.as_bytes();
                let mut out = Vec::with_capacity(b.len());
                let mut i = 0;
                while i < b.len() {
                    let hex = b
                        .get(i + 1..i + 3)
                        .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
                    match (b[i], hex) {
                        (b'%', Some(v)) => {
                            out.push(v);
                            i += 3;
                        }
                        (c, _) => {
                            out.push(c);
                            i += 1;
                        }
                    }
                }
                String::from_utf8_lossy(&out).into_owned()
            };
            user = decode(base.username());
            password = decode(base.password().unwrap_or(""));
            let _ = base.set_username("");
            let _ = base.set_password(None);
        }
        Mgmt {
            base,
            user,
            password,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("an HTTP client"),
        }
    }

    /// `/api/SEG/SEG...`, each segment percent-encoded (`/` → `%2F`).
    pub fn url(&self, segments: &[&str]) -> reqwest::Url {
        let mut u = self.base.clone();
        {
            let mut p = u.path_segments_mut().expect("a base URL");
            p.pop_if_empty().push("api");
            for s in segments {
                p.push(s);
            }
        }
        u
    }

    /// Sends a request; `Ok(None)` on 404, the JSON body (or `Null`) otherwise.
    pub async fn request(
        &self,
        method: reqwest::Method,
        segments: &[&str],
    ) -> Result<Option<Value>, String> {
        let url = self.url(segments);
        let resp = self
            .client
            .request(method.clone(), url.clone())
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .map_err(|e| format!("{method} {url}: {e}"))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(format!("{method} {url}: HTTP {status}"));
        }
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if text.is_empty() {
            return Ok(Some(Value::Null));
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{method} {url}: {e}"))
    }

    /// GET, panicking on anything but success or 404.
    pub async fn get(&self, segments: &[&str]) -> Option<Value> {
        self.request(reqwest::Method::GET, segments)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A queue of vhost `/`, or `None` when it does not exist.
    pub async fn queue(&self, name: &str) -> Option<QueueInfo> {
        let raw = self.get(&["queues", "/", name]).await?;
        Some(QueueInfo {
            arguments: raw["arguments"].as_object().cloned().unwrap_or_default(),
            durable: raw["durable"].as_bool().unwrap_or(false),
            kind: raw["type"].as_str().unwrap_or_default().to_string(),
            raw,
        })
    }

    /// An exchange of vhost `/` (`type`, `durable`, `auto_delete`,
    /// `internal`, `arguments`), or `None`.
    pub async fn exchange(&self, name: &str) -> Option<Value> {
        self.get(&["exchanges", "/", name]).await
    }

    /// The bindings from `exchange` to `queue` in vhost `/`.
    pub async fn bindings(&self, exchange: &str, queue: &str) -> Vec<Value> {
        match self
            .get(&["bindings", "/", "e", exchange, "q", queue])
            .await
        {
            Some(Value::Array(v)) => v,
            _ => vec![],
        }
    }

    /// Names of the queues (`what` = `queues`) or exchanges (`exchanges`)
    /// of vhost `/` that start with `prefix`.
    pub async fn names_with_prefix(&self, what: &str, prefix: &str) -> Result<Vec<String>, String> {
        let v = self
            .request(reqwest::Method::GET, &[what, "/"])
            .await?
            .unwrap_or(Value::Null);
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| o["name"].as_str())
                    .filter(|n| n.starts_with(prefix))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Deletes every queue and exchange of vhost `/` whose name starts with
    /// `prefix`; returns what could not be deleted.
    pub async fn delete_prefix(&self, prefix: &str) -> Vec<String> {
        let mut failed = Vec::new();
        for what in ["queues", "exchanges"] {
            match self.names_with_prefix(what, prefix).await {
                Ok(names) => {
                    for n in names {
                        if let Err(e) = self
                            .request(reqwest::Method::DELETE, &[what, "/", &n])
                            .await
                        {
                            failed.push(e);
                        }
                    }
                }
                Err(e) => failed.push(e),
            }
        }
        failed
    }
}

impl Default for Mgmt {
    fn default() -> Self {
        Mgmt::new()
    }
}

/// Deletes, when dropped (test passed or panicked), every queue and
/// exchange whose name starts with its prefix, through the management API.
pub struct Cleanup {
    /// The prefix of everything the test creates.
    pub prefix: String,
    /// The management URL and AMQP URL (for the credentials) of another
    /// broker than the default one.
    broker: Option<(String, String)>,
}

impl Cleanup {
    /// A guard for a fresh [`unique_prefix`].
    pub fn new() -> Cleanup {
        Cleanup {
            prefix: unique_prefix(),
            broker: None,
        }
    }

    /// A guard for a fresh [`unique_prefix`] on the broker whose management
    /// API is at `management_url` (see [`Mgmt::with`]).
    pub fn on(management_url: &str, amqp_url: &str) -> Cleanup {
        Cleanup {
            prefix: unique_prefix(),
            broker: Some((management_url.to_string(), amqp_url.to_string())),
        }
    }

    /// `PREFIX-suffix`: a name owned by this guard.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.prefix)
    }
}

impl Default for Cleanup {
    fn default() -> Self {
        Cleanup::new()
    }
}

/// Runs the future `f` makes to its end on a thread with a runtime of its
/// own, for a `Drop`, which cannot await (and the test's runtime may be the
/// current thread); `Err` when it panicked.
pub fn block_on_own_thread<T, Fut>(
    f: impl FnOnce() -> Fut + Send + 'static,
) -> std::thread::Result<T>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime of its own")
            .block_on(f())
    })
    .join()
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let prefix = format!("{}-", self.prefix);
        let broker = self.broker.clone();
        let failed = block_on_own_thread(move || async move {
            let mgmt = match &broker {
                Some((management, amqp)) => Mgmt::with(management, amqp),
                None => Mgmt::new(),
            };
            mgmt.delete_prefix(&prefix).await
        })
        .unwrap_or_else(|_| vec!["the cleanup thread panicked".into()]);
        if !failed.is_empty() {
            eprintln!("cleanup of {}-*: {}", self.prefix, failed.join("; "));
        }
    }
}

// ---------------------------------------------------------------- files

/// A scratch directory, removed when dropped.
pub struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    /// A new empty directory under the system's temporary directory.
    pub fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("dlqctl-{}", unique_prefix()));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch { dir }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes `text` to `name` inside the directory; returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).expect("write a scratch file");
        p
    }

    /// Writes an executable file (a handler script) at `path`.
    pub fn write_executable(path: &std::path::Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).expect("write the handler script");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .expect("make the handler executable");
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------- the binary

/// How a run of the binary ended.
#[derive(Debug)]
pub struct Run {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
}

impl Run {
    /// Panics unless the exit code is `code`, showing both streams.
    #[track_caller]
    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "wanted exit {code}\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    /// Both streams, for messages and searches.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Panics unless stdout contains every one of `parts`, showing both
    /// streams.
    #[track_caller]
    pub fn assert_stdout_has(&self, parts: &[&str]) -> &Self {
        self.assert_has("stdout", &self.stdout, parts)
    }

    /// Panics unless stderr contains every one of `parts`, showing both
    /// streams.
    #[track_caller]
    pub fn assert_stderr_has(&self, parts: &[&str]) -> &Self {
        self.assert_has("stderr", &self.stderr, parts)
    }

    #[track_caller]
    fn assert_has(&self, stream: &str, text: &str, parts: &[&str]) -> &Self {
        for part in parts {
            assert!(
                text.contains(part),
                "no {part:?} on {stream}:\n{}",
                self.output()
            );
        }
        self
    }
}

/// One run of the built `dlqctl`, described step by step and then run or
/// started (after ripgrep's `TestCommand`):
///
/// ```ignore
/// let run = Dlqctl::new("work").arg(&file).args(["--queue", &q, "--", "true"]).run().await;
/// let child = Dlqctl::json_log("work").arg(&file).args(["--queue", &q]).spawn();
/// ```
///
/// Every child gets the broker under test ([`broker_env`]: `AMQP_URL` and
/// `DLQCTL_MANAGEMENT_URL`, never the defaults, which may belong to another
/// broker; a `--url` in the arguments wins), `RUST_LOG` unset, stdin from
/// `/dev/null`, stdout and stderr piped, and is killed when dropped.
pub struct Dlqctl {
    args: Vec<OsString>,
    env: Vec<(OsString, Option<OsString>)>,
    stdout: Option<std::process::Stdio>,
    stderr: Option<std::process::Stdio>,
}

impl Dlqctl {
    /// `dlqctl FIRST` (a command such as `work`, or a global option).
    pub fn new(first: impl AsRef<OsStr>) -> Dlqctl {
        Dlqctl {
            args: vec![first.as_ref().to_owned()],
            env: Vec::new(),
            stdout: None,
            stderr: None,
        }
    }

    /// `dlqctl --log-format json COMMAND`: the log lines are JSON.
    pub fn json_log(command: &str) -> Dlqctl {
        Dlqctl::new("--log-format").args(["json", command])
    }

    /// `dlqctl COMMAND... FILE --queue QUEUE`: a command on one pipeline
    /// of a topology file (`&["work"]`, `&["dlq", "peek"]`, ...).
    pub fn on_queue(command: &[&str], file: &Path, queue: &str) -> Dlqctl {
        Dlqctl::new(command[0])
            .args(&command[1..])
            .arg(file)
            .args(["--queue", queue])
    }

    /// One more argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Dlqctl {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// More arguments.
    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Dlqctl {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets a variable of the child's environment (after [`broker_env`],
    /// so it may replace them).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Dlqctl {
        self.env
            .push((key.as_ref().to_owned(), Some(value.as_ref().to_owned())));
        self
    }

    /// Removes a variable from the child's environment.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Dlqctl {
        self.env.push((key.as_ref().to_owned(), None));
        self
    }

    /// Where stdout goes (piped unless said).
    pub fn stdout(mut self, to: impl Into<std::process::Stdio>) -> Dlqctl {
        self.stdout = Some(to.into());
        self
    }

    /// Where stderr goes (piped unless said).
    pub fn stderr(mut self, to: impl Into<std::process::Stdio>) -> Dlqctl {
        self.stderr = Some(to.into());
        self
    }

    /// The command line, for messages.
    fn shown(&self) -> String {
        let args: Vec<_> = self.args.iter().map(|a| a.to_string_lossy()).collect();
        format!("dlqctl {}", args.join(" "))
    }

    /// The process to start, as described, for a test that does not run
    /// in a runtime (it may still change the standard streams).
    pub fn into_std(self) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dlqctl"));
        cmd.args(&self.args)
            .envs(broker_env())
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(self.stdout.unwrap_or_else(std::process::Stdio::piped))
            .stderr(self.stderr.unwrap_or_else(std::process::Stdio::piped));
        for (key, value) in &self.env {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        cmd
    }

    /// Starts it and leaves it running (killed when the child is dropped).
    pub fn spawn(self) -> tokio::process::Child {
        let shown = self.shown();
        tokio::process::Command::from(self.into_std())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {shown}: {e}"))
    }

    /// Runs it to the end; kills it and panics after [`RUN_TIMEOUT`].
    pub async fn run(self) -> Run {
        let start = Instant::now();
        let (shown, timeout) = (self.shown(), RUN_TIMEOUT);
        let child = self.spawn();
        let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(r) => r.expect("wait for dlqctl"),
            Err(_) => panic!("{shown} did not finish within {timeout:?}"),
        };
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed: start.elapsed(),
        }
    }
}

/// The usual timeout of one run of the binary.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Every line a child writes on stdout and stderr (both piped), gathered
/// as they come by two tasks.
pub fn collect_output(child: &mut tokio::process::Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    collect_output_into(child, &lines);
    lines
}

/// As [`collect_output`], into `lines` (a sink several processes may
/// share); the tasks, which end at the streams' end.
pub fn collect_output_into(
    child: &mut tokio::process::Child,
    lines: &Arc<Mutex<Vec<String>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let streams: [Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>; 2] = [
        child.stderr.take().map(|s| Box::new(s) as Box<_>),
        child.stdout.take().map(|s| Box::new(s) as Box<_>),
    ];
    let mut readers = Vec::new();
    for stream in streams.into_iter().flatten() {
        let lines = lines.clone();
        readers.push(tokio::spawn(async move {
            let mut r = BufReader::new(stream).lines();
            while let Ok(Some(l)) = r.next_line().await {
                lines.lock().unwrap().push(l);
            }
        }));
    }
    readers
}

/// The `fields` of the JSON log lines (`--log-format json`) in `lines`
/// whose message is `message`.
pub fn events(lines: &Mutex<Vec<String>>, message: &str) -> Vec<Value> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == message)
        .map(|v| v["fields"].clone())
        .collect()
}
