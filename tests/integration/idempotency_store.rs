//! The idempotency stores against real services: a redis-server of each
//! test's own (support::redis; never the one on port 6379), plain, with
//! a password, and TLS only; and SQLite files through the same `open`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlqctl::idempotency::{
    open, open_with, Begin, BodySha, Create, Lease, OpenOptions, Store, StoreError, StoreUrl,
};

use crate::support::redis::{free_port, RedisServer};
use crate::support::Scratch;

const BODY: BodySha = [1; 32];
const OTHER: BodySha = [2; 32];

fn scope() -> Vec<u8> {
    dlqctl::core::idempotency::scope("/", "orders")
}

async fn redis(url: &str) -> Arc<dyn Store> {
    open(&StoreUrl::Redis(url.to_string()), &scope(), Create::Yes)
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e}"))
}

fn acquired(begin: Begin) -> (Lease, bool) {
    match begin {
        Begin::Acquired { lease, conflict } => (lease, conflict),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn leased(begin: Begin) -> u64 {
    match begin {
        Begin::Leased { remaining_ms } => remaining_ms,
        other => panic!("expected Leased, got {other:?}"),
    }
}

/// A raw connection to `server`, to look at what the store wrote.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_begin_one_key_and_exactly_one_acquires() {
    let server = RedisServer::start();
    let (a, b) = (redis(&server.url()).await, redis(&server.url()).await);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let key = format!("id-{i}").into_bytes();
        for store in [a.clone(), b.clone()] {
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                let begin = store
                    .begin(&key, &BODY, &rand::random(), 30_000)
                    .await
                    .unwrap();
                (key, matches!(begin, Begin::Acquired { .. }))
            }));
        }
    }
    let mut acquired_per_key = std::collections::BTreeMap::<Vec<u8>, u32>::new();
    for t in tasks {
        let (key, won) = t.await.unwrap();
        *acquired_per_key.entry(key).or_default() += u32::from(won);
    }
    assert_eq!(acquired_per_key.len(), 200);
    assert!(
        acquired_per_key.values().all(|&n| n == 1),
        "a key acquired twice or never: {acquired_per_key:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_then_a_mark_then_a_duplicate_and_a_conflict() {
    let server = RedisServer::start();
    let s = redis(&server.url()).await;
    assert_eq!(s.describe(), server.url());

    let key = b"\xffid\x00-1"; // not UTF-8, with a NUL: kept as it is
    let (lease, conflict) = acquired(s.begin(key, &BODY, &rand::random(), 30_000).await.unwrap());
    assert!(!conflict);
    let left = leased(s.begin(key, &BODY, &rand::random(), 30_000).await.unwrap());
    assert!((29_000..=30_000).contains(&left), "{left}");

    // The lease as Redis holds it: binary-safe key, Redis's own expiry.
    let mut lease_key = b"dlqctl:".to_vec();
    lease_key.extend_from_slice(&scope());
    lease_key.extend_from_slice(b":lease:");
    lease_key.extend_from_slice(key);
    let mut conn = raw(&server.url()).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&lease_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((29_000..=30_000).contains(&pttl), "{pttl}");

    // Only the holder renews or releases.
    let thief = Lease {
        key: key.to_vec(),
        token: [7; 16],
    };
    assert!(!s.renew(&thief, 90_000).await.unwrap());
    s.release(&thief).await.unwrap();
    leased(s.begin(key, &BODY, &rand::random(), 30_000).await.unwrap());
    assert!(s.renew(&lease, 90_000).await.unwrap());
    let left = leased(s.begin(key, &BODY, &rand::random(), 30_000).await.unwrap());
    assert!(left > 80_000, "renewed: {left}");

    s.mark(&lease, &BODY, 60_000).await.unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&lease_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the mark gives the lease up");
    assert_eq!(
        s.begin(key, &BODY, &rand::random(), 30_000).await.unwrap(),
        Begin::Handled
    );
    let keys = [key.to_vec(), b"other".to_vec()];
    assert_eq!(s.count_marked(&keys).await.unwrap(), 1);

    // Another body: a conflict that runs; the mark stays meanwhile.
    let (other, conflict) = acquired(s.begin(key, &OTHER, &rand::random(), 30_000).await.unwrap());
    assert!(conflict);
    assert_eq!(
        s.begin(key, &BODY, &rand::random(), 30_000).await.unwrap(),
        Begin::Handled
    );
    leased(s.begin(key, &OTHER, &rand::random(), 30_000).await.unwrap());
    s.release(&other).await.unwrap();
    let (other, conflict) = acquired(s.begin(key, &OTHER, &rand::random(), 30_000).await.unwrap());
    assert!(conflict);
    // Its success never replaces the mark: an exact copy of the first
    // body stays a duplicate, the other body a conflict.
    s.mark(&other, &OTHER, 60_000).await.unwrap();
    assert_eq!(
        s.begin(key, &BODY, &rand::random(), 30_000).await.unwrap(),
        Begin::Handled
    );
    let (other, conflict) = acquired(s.begin(key, &OTHER, &rand::random(), 30_000).await.unwrap());
    assert!(conflict, "the mark keeps the body it was made for");
    s.release(&other).await.unwrap();

    // Another pipeline's scope does not see the key.
    let payments = dlqctl::core::idempotency::scope("/", "payments");
    let p = open(&StoreUrl::Redis(server.url()), &payments, Create::No)
        .await
        .unwrap();
    acquired(p.begin(key, &BODY, &rand::random(), 30_000).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_and_a_mark_expire_by_the_store_clock() {
    let server = RedisServer::start();
    let s = redis(&server.url()).await;
    let (lease, _) = acquired(
        s.begin(b"short", &BODY, &rand::random(), 300)
            .await
            .unwrap(),
    );
    let (marked, _) = acquired(
        s.begin(b"marked", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    s.mark(&marked, &BODY, 300).await.unwrap();
    assert_eq!(
        s.begin(b"marked", &BODY, &rand::random(), 300)
            .await
            .unwrap(),
        Begin::Handled
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !s.renew(&lease, 30_000).await.unwrap(),
        "expired: no longer ours"
    );
    acquired(
        s.begin(b"short", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    let (_, conflict) = acquired(
        s.begin(b"marked", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    assert!(!conflict);
    assert_eq!(s.count_marked(&[b"marked".to_vec()]).await.unwrap(), 0);
}

/// A user an ACL limits to the `dlqctl:` keys passes `doctor`'s check as
/// it passes `work` (the probe key was outside the prefix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_dlqctl_keys_passes_the_check() {
    let server = RedisServer::start();
    let mut admin = raw(&server.url()).await;
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("limited")
        .arg("on")
        .arg(">limited-pw")
        .arg("~dlqctl:*")
        .arg("+@all")
        .exec_async(&mut admin)
        .await
        .unwrap();
    let url = server
        .url()
        .replacen("redis://", "redis://limited:limited-pw@", 1);
    let s = redis(&url).await;
    let (lease, _) = acquired(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
    s.mark(&lease, &BODY, 60_000).await.unwrap();
    s.check().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_writes_reads_and_deletes_a_doctor_key() {
    let server = RedisServer::start();
    let s = redis(&server.url()).await;
    s.check().await.unwrap();
    s.ping().await.unwrap();
    let mut conn = raw(&server.url()).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

/// The password, wrong or right, is in no error text nor `Debug`.
fn assert_no_password(e: &StoreError, password: &str) {
    let texts = [e.to_string(), format!("{e:?}")];
    for t in texts {
        assert!(!t.contains(password), "the password shows: {t}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_password_is_refused_without_showing_it() {
    let server = RedisServer::with_password("right-pass-4f1c");
    let s = redis(&server.url()).await;
    assert!(
        !s.describe().contains("right-pass-4f1c"),
        "{}",
        s.describe()
    );
    s.ping().await.unwrap();

    let wrong = "wrong-pass-9b2e";
    let url = StoreUrl::Redis(server.url_with_password(wrong));
    let e = open(&url, &scope(), Create::Yes)
        .await
        .err()
        .expect("refused");
    assert!(matches!(e, StoreError::Refused { .. }), "{e:?}");
    assert_no_password(&e, wrong);
    assert!(e.to_string().contains(&server.port().to_string()), "{e}");
    assert_no_password(&e, "right-pass-4f1c");

    // No password given to a server that wants one: NOAUTH, refused.
    let url = StoreUrl::Redis(format!("redis://127.0.0.1:{}/0", server.port()));
    let e = open(&url, &scope(), Create::Yes)
        .await
        .err()
        .expect("refused");
    assert!(matches!(e, StoreError::Refused { .. }), "{e:?}");
}

/// A database past the server's (16 by default) is refused, naming it:
/// the server answers, and waiting would not change its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_the_server_does_not_have_is_refused_naming_it() {
    let server = RedisServer::start();
    let url = StoreUrl::Redis(format!("redis://127.0.0.1:{}/99", server.port()));
    let e = open(&url, &scope(), Create::Yes)
        .await
        .err()
        .expect("refused");
    assert!(matches!(e, StoreError::Refused { .. }), "{e:?}");
    assert!(e.to_string().contains("database 99"), "{e}");
    // A URL read from the environment at start (`env:NAME`) that no
    // client can use is refused at once too, not waited for.
    for (url, why) in [("redis://", "no host"), ("redis:///0", "no host")] {
        let started = Instant::now();
        let e = open(&StoreUrl::Redis(url.into()), &scope(), Create::Yes)
            .await
            .err()
            .expect("refused");
        assert!(matches!(e, StoreError::Refused { .. }), "{url}: {e:?}");
        assert!(e.to_string().contains(why), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2), "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_and_bounded() {
    let port = free_port();
    let started = Instant::now();
    let url = StoreUrl::Redis(format!("redis://:secret-5d@127.0.0.1:{port}/0"));
    let e = open(&url, &scope(), Create::Yes)
        .await
        .err()
        .expect("unavailable");
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
    assert_no_password(&e, "secret-5d");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_works_with_the_servers_ca_and_refuses_an_untrusted_one() {
    let server = RedisServer::tls();
    let url = StoreUrl::Redis(server.url());
    let options = OpenOptions {
        redis_ca_pem: Some(server.ca_pem()),
    };
    let s = open_with(&url, &scope(), Create::Yes, &options)
        .await
        .unwrap();
    let (lease, _) = acquired(
        s.begin(b"tls", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    s.mark(&lease, &BODY, 60_000).await.unwrap();
    assert_eq!(
        s.begin(b"tls", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
        Begin::Handled
    );
    s.check().await.unwrap();

    // The system's roots do not know this CA.
    let e = open(&url, &scope(), Create::Yes)
        .await
        .err()
        .expect("refused");
    assert!(matches!(e, StoreError::Refused { .. }), "{e:?}");
    assert!(e.to_string().contains("certificate"), "{e}");
    // Plain text to a TLS port: no answer that makes sense, unavailable.
    let plain = StoreUrl::Redis(format!("redis://127.0.0.1:{}/0", server.port()));
    let e = open(&plain, &scope(), Create::Yes)
        .await
        .err()
        .expect("fails");
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
}

/// Polls `f` until it answers Ok, for up to `within`.
async fn until_ok<T>(
    within: Duration,
    mut f: impl AsyncFnMut() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let deadline = Instant::now() + within;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_unavailable_then_back_empty() {
    let mut server = RedisServer::start();
    let s = redis(&server.url()).await;
    let (lease, _) = acquired(
        s.begin(b"before", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    s.mark(&lease, &BODY, 60_000).await.unwrap();
    assert_eq!(
        s.begin(b"before", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
        Begin::Handled
    );

    server.stop();
    for _ in 0..3 {
        let started = Instant::now();
        let e = s
            .begin(b"during", &BODY, &rand::random(), 30_000)
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(s.ping().await.is_err());
    }

    server.restart();
    until_ok(Duration::from_secs(15), async || s.ping().await)
        .await
        .expect("the store answers again");
    // Empty: the mark made before the restart is lost (a duplicate window).
    let (_, conflict) = acquired(
        s.begin(b"before", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    assert!(!conflict);
    acquired(
        s.begin(b"during", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
}

/// The ids of the connections `server` has, but `admin`'s own.
async fn other_clients(admin: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let own: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(admin)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(admin)
        .await
        .unwrap();
    list.lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .filter(|id| *id != own.to_string())
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_demoted_by_a_failover_is_left_for_a_new_connection() {
    let primary = RedisServer::start();
    let new_primary = RedisServer::start();
    let s = redis(&primary.url()).await;
    acquired(
        s.begin(b"before", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    let mut admin = raw(&primary.url()).await;
    let before = other_clients(&mut admin).await;
    assert_eq!(before.len(), 1, "{before:?}");

    // Demoted, its connections kept: writes answer READONLY.
    let port = new_primary.port().to_string();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(&port)
        .query_async(&mut admin)
        .await
        .unwrap();
    let e = s
        .begin(b"during", &BODY, &rand::random(), 30_000)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
    assert!(e.to_string().contains("read only replica"), "{e}");

    // Here the address would lead to the new primary; this test promotes
    // the same server back, and sees the store come back on a new
    // connection.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let begin = until_ok(Duration::from_secs(10), async || {
        s.begin(b"after", &BODY, &rand::random(), 30_000).await
    })
    .await
    .unwrap();
    acquired(begin);
    let after = other_clients(&mut admin).await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(
        before, after,
        "the store still uses the connection to the demoted server"
    );
}

/// A writer into a shared buffer, for the tracing subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_password_is_not_in_trace_logs() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // Global (with `log` records bridged) under nextest, one process per
    // test; this thread only when another test set one first.
    let _guard = match tracing_subscriber::util::SubscriberInitExt::try_init(subscriber) {
        Ok(()) => None,
        Err(_) => {
            let writer = captured.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_writer(move || writer.clone())
                .finish();
            Some(tracing::subscriber::set_default(subscriber))
        }
    };
    tracing::trace!("capture works");

    let password = "trace-pass-77aa";
    let mut server = RedisServer::with_password(password);
    let s = redis(&server.url()).await;
    let (lease, _) = acquired(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
    s.mark(&lease, &BODY, 60_000).await.unwrap();
    s.check().await.unwrap();
    let wrong = StoreUrl::Redis(server.url_with_password("trace-wrong-88bb"));
    let e = open(&wrong, &scope(), Create::Yes)
        .await
        .err()
        .expect("refused");
    tracing::error!(error = %e, debug = ?e, "as a worker would log it");
    server.stop();
    let e = s.ping().await.unwrap_err();
    tracing::warn!(error = %e, store = ?s.describe(), "as a worker would log it");
    server.restart();
    until_ok(Duration::from_secs(15), async || s.ping().await)
        .await
        .unwrap();

    let text = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(text.contains("capture works"), "nothing captured");
    assert!(!text.contains(password), "the password is logged:\n{text}");
    assert!(
        !text.contains("trace-wrong-88bb"),
        "the wrong password is logged:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_through_open_and_create_no() {
    let dir = Scratch::new();
    let url = StoreUrl::Sqlite(dir.path().join("orders.db"));
    let e = open(&url, &scope(), Create::No)
        .await
        .err()
        .expect("refused");
    assert!(matches!(e, StoreError::Refused { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("does not exist (dlqctl work creates it)"),
        "{e}"
    );
    assert!(!dir.path().join("orders.db").exists());

    let s = open(&url, &scope(), Create::Yes).await.unwrap();
    assert_eq!(
        s.describe(),
        format!("sqlite:{}", dir.path().join("orders.db").display())
    );
    let (lease, _) = acquired(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
    s.mark(&lease, &BODY, 60_000).await.unwrap();
    let reader = open(&url, &scope(), Create::No).await.unwrap();
    assert_eq!(reader.count_marked(&[b"k".to_vec()]).await.unwrap(), 1);
    reader.check().await.unwrap();

    let missing = StoreUrl::Sqlite(dir.path().join("nowhere/orders.db"));
    let e = open(&missing, &scope(), Create::Yes)
        .await
        .err()
        .expect("refused");
    assert!(e.to_string().contains("does not exist"), "{e}");
}

/// Where [`sqlite_child_begins_keys`] works, when a test runs it.
const SQLITE_CHILD_FILE: &str = "DLQCTL_TEST_SQLITE_CHILD_FILE";
/// Which of the two children it is (0 or 1).
const SQLITE_CHILD_INDEX: &str = "DLQCTL_TEST_SQLITE_CHILD_INDEX";
/// How many keys both children begin.
const SQLITE_KEYS: usize = 2_000;

/// The file child `index` creates beside the store once it has begun
/// its own first key.
fn sqlite_child_started(store: &std::path::Path, index: usize) -> std::path::PathBuf {
    store.with_extension(format!("started-{index}"))
}

/// Two processes begin the same keys on one SQLite file; no key is
/// acquired by both. Their overlap is certain, not likely: child `i`
/// first begins `key-i` alone (nobody else touches it before), then
/// waits until the other child has begun its own first key before it
/// begins the rest; so each acquires at least its own key and neither
/// runs its loop before the other has started, however busy the
/// machine (no sleep stands in for the barrier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_processes_never_both_acquire_a_key() {
    let dir = Scratch::new();
    let path = dir.path().join("orders.db");
    // Made first, so that both children open an existing store.
    drop(
        open(&StoreUrl::Sqlite(path.clone()), &scope(), Create::Yes)
            .await
            .unwrap(),
    );
    let children: Vec<_> = (0..2)
        .map(|index| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["idempotency_store::sqlite_child_begins_keys", "--exact"])
                .args(["--ignored", "--nocapture", "--test-threads=1"])
                .env(SQLITE_CHILD_FILE, &path)
                .env(SQLITE_CHILD_INDEX, index.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut won = Vec::new();
    for (index, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // libtest may print "test NAME ... " before the first line.
        let mine: Vec<String> = stdout
            .lines()
            .filter_map(|l| l.split_once("ACQUIRED ").map(|(_, k)| k.to_string()))
            .collect();
        assert!(
            mine.contains(&format!("key-{index}")),
            "child {index} did not acquire its own first key: {mine:?}"
        );
        won.extend(mine);
    }
    won.sort();
    let all = won.len();
    won.dedup();
    assert_eq!(all, won.len(), "a key acquired by both processes");
    assert_eq!(won.len(), SQLITE_KEYS, "every key acquired once");
}

/// Waits until `file` exists; fails (never goes on) when it does not
/// within a minute.
async fn wait_for_file(file: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !file.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Run by [`sqlite_two_processes_never_both_acquire_a_key`] in a process
/// of its own: begins its own first key (`key-INDEX`), says so with a
/// file, waits for the other child's file, then begins the other keys
/// on the file it is given, and prints those it acquired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child of sqlite_two_processes_never_both_acquire_a_key"]
async fn sqlite_child_begins_keys() {
    let Some(path) = std::env::var_os(SQLITE_CHILD_FILE) else {
        return;
    };
    let index: usize = std::env::var(SQLITE_CHILD_INDEX).unwrap().parse().unwrap();
    let path = std::path::PathBuf::from(path);
    let s = open(&StoreUrl::Sqlite(path.clone()), &scope(), Create::No)
        .await
        .unwrap();
    let begin = |i: usize| {
        let s = s.clone();
        async move {
            let key = format!("key-{i}");
            if let Begin::Acquired { .. } = s
                .begin(key.as_bytes(), &BODY, &rand::random(), 60_000)
                .await
                .unwrap()
            {
                println!("ACQUIRED {key}");
            }
        }
    };
    begin(index).await;
    std::fs::write(sqlite_child_started(&path, index), "").unwrap();
    wait_for_file(&sqlite_child_started(&path, 1 - index)).await;
    for i in (0..SQLITE_KEYS).filter(|&i| i != index) {
        begin(i).await;
    }
}

/// `look` reads a key's state and changes nothing, on both stores: free,
/// then leased (a begin), then handled (a mark); a lease taken is not
/// lengthened or released by looking, and another begin still finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_says_free_leased_or_handled_and_changes_nothing() {
    use dlqctl::idempotency::KeyState;
    let server = RedisServer::start();
    let dir = Scratch::new();
    let sqlite = open(
        &StoreUrl::Sqlite(dir.path().join("orders.db")),
        &scope(),
        Create::Yes,
    )
    .await
    .unwrap();
    for s in [redis(&server.url()).await, sqlite] {
        let name = s.describe().to_string();
        assert_eq!(s.look(b"k").await.unwrap(), KeyState::Free, "{name}");
        // Looking took nothing: the key is still free to begin.
        let (lease, _) = acquired(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
        assert_eq!(s.look(b"k").await.unwrap(), KeyState::Leased, "{name}");
        leased(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
        s.mark(&lease, &BODY, 60_000).await.unwrap();
        assert_eq!(s.look(b"k").await.unwrap(), KeyState::Handled, "{name}");
        // Any body: a mark is a mark.
        assert_eq!(
            s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap(),
            Begin::Handled
        );
        assert_eq!(s.look(b"other").await.unwrap(), KeyState::Free, "{name}");
    }
}
