//! The SQLite store against real files in a temporary directory.

use super::*;
use crate::core::wire::TEMP_PREFIX;

/// A directory of its own under the system's temporary directory,
/// removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "{TEMP_PREFIX}sqlite-{:032x}",
            rand::random::<u128>()
        ));
        std::fs::create_dir(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const SCOPE: &[u8] = b"1:/:6:orders";
const BODY: BodySha = [1; 32];
const OTHER: BodySha = [2; 32];

async fn store(path: &Path) -> SqliteStore {
    SqliteStore::open(path, SCOPE, Create::Yes).await.unwrap()
}

fn acquired(begin: Begin) -> (Lease, bool) {
    match begin {
        Begin::Acquired { lease, conflict } => (lease, conflict),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn refusal(e: StoreError) -> String {
    match e {
        StoreError::Refused { detail, .. } => detail,
        other => panic!("expected Refused, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_leased_then_handled_and_another_body_is_a_conflict() {
    let dir = TempDir::new();
    let path = dir.0.join("orders.db");
    let s = store(&path).await;
    assert_eq!(s.describe(), format!("sqlite:{}", path.display()));

    let (lease, conflict) = acquired(
        s.begin(b"id-1", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    assert!(!conflict);
    assert_eq!(lease.key, b"id-1");
    match s
        .begin(b"id-1", &BODY, &rand::random(), 30_000)
        .await
        .unwrap()
    {
        Begin::Leased { remaining_ms } => {
            assert!((29_000..=30_000).contains(&remaining_ms), "{remaining_ms}")
        }
        other => panic!("expected Leased, got {other:?}"),
    }
    s.mark(&lease, &BODY, 60_000).await.unwrap();
    assert_eq!(
        s.begin(b"id-1", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
        Begin::Handled
    );
    assert_eq!(
        s.count_marked(&[b"id-1".to_vec(), b"id-2".to_vec()])
            .await
            .unwrap(),
        1
    );

    // Another body: not a duplicate. It runs, and the first mark stays
    // while it does (the first body is still a duplicate).
    let (other, conflict) = acquired(
        s.begin(b"id-1", &OTHER, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    assert!(conflict);
    assert_eq!(
        s.begin(b"id-1", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
        Begin::Handled
    );
    assert!(matches!(
        s.begin(b"id-1", &OTHER, &rand::random(), 30_000)
            .await
            .unwrap(),
        Begin::Leased { .. }
    ));
    // Released after a failure: the old mark is still there.
    s.release(&other).await.unwrap();
    assert_eq!(
        s.begin(b"id-1", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
        Begin::Handled
    );
    let (other, conflict) = acquired(
        s.begin(b"id-1", &OTHER, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    assert!(conflict);
    // A conflict that ran and succeeded never replaces the mark: an exact
    // copy of the first body stays a duplicate, the other body a conflict.
    s.mark(&other, &OTHER, 60_000).await.unwrap();
    assert_eq!(
        s.begin(b"id-1", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
        Begin::Handled
    );
    let (other, conflict) = acquired(
        s.begin(b"id-1", &OTHER, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    assert!(conflict, "the mark keeps the body it was made for");
    s.release(&other).await.unwrap();
}

/// A mark made again for its own body (a late success) is kept; once a
/// mark has expired, the next body's mark is the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_is_replaced_only_once_expired() {
    let dir = TempDir::new();
    let s = store(&dir.0.join("orders.db")).await;
    let (lease, _) = acquired(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
    s.mark(&lease, &BODY, 300).await.unwrap();
    let (other, conflict) = acquired(
        s.begin(b"k", &OTHER, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    assert!(conflict);
    s.mark(&other, &OTHER, 60_000).await.unwrap();
    assert_eq!(
        s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap(),
        Begin::Handled
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (other, conflict) = acquired(
        s.begin(b"k", &OTHER, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    assert!(!conflict, "the first mark expired");
    s.mark(&other, &OTHER, 60_000).await.unwrap();
    assert_eq!(
        s.begin(b"k", &OTHER, &rand::random(), 30_000)
            .await
            .unwrap(),
        Begin::Handled
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_raw_bytes_within_their_scope() {
    let dir = TempDir::new();
    let path = dir.0.join("orders.db");
    let a = store(&path).await;
    let b = SqliteStore::open(&path, b"1:/:8:payments", Create::Yes)
        .await
        .unwrap();
    let (lease, _) = acquired(
        a.begin(b"\xff\x00id", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    acquired(
        b.begin(b"\xff\x00id", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    acquired(
        a.begin(b"\xff\x01id", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    a.mark(&lease, &BODY, 60_000).await.unwrap();
    assert_eq!(
        a.begin(b"\xff\x00id", &BODY, &rand::random(), 1)
            .await
            .unwrap(),
        Begin::Handled
    );
    assert_eq!(b.count_marked(&[b"\xff\x00id".to_vec()]).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_holder_renews_or_releases() {
    let dir = TempDir::new();
    let s = store(&dir.0.join("orders.db")).await;
    let (lease, _) = acquired(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
    let thief = Lease {
        key: lease.key.clone(),
        token: [9; 16],
    };
    assert!(!s.renew(&thief, 60_000).await.unwrap());
    s.release(&thief).await.unwrap();
    assert!(matches!(
        s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap(),
        Begin::Leased { .. }
    ));
    // A mark by a non-holder (its lease lost) marks, and leaves the
    // holder's lease alone.
    s.mark(&thief, &OTHER, 60_000).await.unwrap();
    assert_eq!(
        s.begin(b"k", &OTHER, &rand::random(), 30_000)
            .await
            .unwrap(),
        Begin::Handled
    );
    assert!(matches!(
        s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap(),
        Begin::Leased { .. }
    ));

    assert!(s.renew(&lease, 120_000).await.unwrap());
    match s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap() {
        Begin::Leased { remaining_ms } => assert!(remaining_ms > 100_000, "{remaining_ms}"),
        other => panic!("expected Leased, got {other:?}"),
    }
    s.release(&lease).await.unwrap();
    let (_, conflict) = acquired(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
    assert!(conflict, "the mark of the other body stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_marks_expire_by_the_store_clock_and_are_swept() {
    let dir = TempDir::new();
    let s = store(&dir.0.join("orders.db")).await;
    let (lease, _) = acquired(
        s.begin(b"short", &BODY, &rand::random(), 150)
            .await
            .unwrap(),
    );
    let (marked, _) = acquired(
        s.begin(b"marked", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    s.mark(&marked, &BODY, 150).await.unwrap();
    let (kept, _) = acquired(
        s.begin(b"kept", &BODY, &rand::random(), 30_000)
            .await
            .unwrap(),
    );
    s.mark(&kept, &BODY, 60_000).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;

    assert!(
        !s.renew(&lease, 30_000).await.unwrap(),
        "an expired lease is not ours"
    );
    let (_, conflict) = acquired(
        s.begin(b"marked", &BODY, &rand::random(), 150)
            .await
            .unwrap(),
    );
    assert!(!conflict, "an expired mark is absent");
    assert_eq!(s.count_marked(&[b"marked".to_vec()]).await.unwrap(), 0);

    tokio::time::sleep(Duration::from_millis(400)).await;
    let rows = |c: &Connection| {
        c.query_row("SELECT count(*) FROM dlqctl_keys", [], |r| {
            r.get::<_, i64>(0)
        })
    };
    assert_eq!(s.call(rows).await.unwrap(), 3);
    // "short" and "marked" (leased again for 150 ms) have expired.
    assert_eq!(sweep(&s.describe, &s.calls).await.unwrap(), 2);
    assert_eq!(s.call(rows).await.unwrap(), 1);
    assert_eq!(
        s.begin(b"kept", &BODY, &rand::random(), 1).await.unwrap(),
        Begin::Handled
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connections_never_both_acquire_a_key() {
    let dir = TempDir::new();
    let path = dir.0.join("orders.db");
    let stores = [store(&path).await, store(&path).await, store(&path).await];
    let keys: Vec<Vec<u8>> = (0..200).map(|i| format!("key-{i}").into_bytes()).collect();
    let tasks: Vec<_> = stores
        .into_iter()
        .map(|s| {
            let keys = keys.clone();
            tokio::spawn(async move {
                let mut won = Vec::new();
                for key in &keys {
                    if let Begin::Acquired { .. } =
                        s.begin(key, &BODY, &rand::random(), 30_000).await.unwrap()
                    {
                        won.push(key.clone());
                    }
                }
                won
            })
        })
        .collect();
    let mut won = Vec::new();
    for t in tasks {
        won.extend(t.await.unwrap());
    }
    won.sort();
    let mut unique = won.clone();
    unique.dedup();
    assert_eq!(won, unique, "a key acquired twice");
    assert_eq!(won.len(), keys.len(), "every key acquired once");
}

#[test]
fn two_threads_on_one_file_never_both_acquire_a_key() {
    let dir = TempDir::new();
    let path = dir.0.join("orders.db");
    let dirs = Vec::new();
    open_file("t", &path, Create::Yes, &dirs).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || {
                let c = open_file("t", &path, Create::Yes, &[]).unwrap();
                (0..300)
                    .filter(|i| {
                        let key = format!("k{i}");
                        let token = rand::random();
                        // As the store's thread runs every call: in a
                        // BEGIN IMMEDIATE transaction.
                        c.execute_batch("BEGIN IMMEDIATE").unwrap();
                        let b = begin(&c, SCOPE, key.as_bytes(), &BODY, token, 30_000);
                        c.execute_batch("COMMIT").unwrap();
                        matches!(b.unwrap(), Begin::Acquired { .. })
                    })
                    .count()
            })
        })
        .collect();
    let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_store_stops_its_sweeper_and_closes_the_file() {
    let dir = TempDir::new();
    let s = store(&dir.0.join("orders.db")).await;
    let conn = s.alive.clone();
    let sweeper = s.sweeper.clone();
    assert!(!sweeper.is_finished());
    drop(s);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while conn.upgrade().is_some() || !sweeper.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper still runs"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_ping_leave_nothing() {
    let dir = TempDir::new();
    let s = store(&dir.0.join("orders.db")).await;
    s.check().await.unwrap();
    s.ping().await.unwrap();
    let rows = |c: &Connection| {
        c.query_row("SELECT count(*) FROM dlqctl_keys", [], |r| {
            r.get::<_, i64>(0)
        })
    };
    assert_eq!(s.call(rows).await.unwrap(), 0);
    let mode = |c: &Connection| c.query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0));
    assert_eq!(s.call(mode).await.unwrap(), "wal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_lock_is_unavailable_not_refused() {
    let dir = TempDir::new();
    let path = dir.0.join("orders.db");
    let s = store(&path).await;
    let mut other = open_file("t", &path, Create::Yes, &[]).unwrap();
    let tx = other
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    let started = std::time::Instant::now();
    match s.begin(b"k", &BODY, &rand::random(), 30_000).await {
        Err(StoreError::Unavailable { detail, .. }) => {
            assert!(detail.contains("locked"), "{detail}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() < CALL_TIMEOUT + Duration::from_secs(1));
    drop(tx);
    acquired(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_no_never_creates_anything() {
    let dir = TempDir::new();
    let path = dir.0.join("orders.db");
    let e = SqliteStore::open(&path, SCOPE, Create::No)
        .await
        .unwrap_err();
    assert!(refusal(e).contains("does not exist (dlqctl work creates it)"));
    let deep = dir.0.join("missing/dlqctl/orders.db");
    let e = SqliteStore::open(&deep, SCOPE, Create::No)
        .await
        .unwrap_err();
    assert!(refusal(e).contains("does not exist (dlqctl work creates it)"));
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        0,
        "nothing created"
    );

    // A database that is not ours: refused, left unchanged.
    let foreign = dir.0.join("foreign.db");
    Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    let e = SqliteStore::open(&foreign, SCOPE, Create::No)
        .await
        .unwrap_err();
    assert!(refusal(e).contains("not a dlqctl idempotency store"));

    // A file dlqctl work made opens, and keeps its marks.
    let s = store(&path).await;
    let (lease, _) = acquired(s.begin(b"k", &BODY, &rand::random(), 30_000).await.unwrap());
    s.mark(&lease, &BODY, 60_000).await.unwrap();
    drop(s);
    let s = SqliteStore::open(&path, SCOPE, Create::No).await.unwrap();
    assert_eq!(s.count_marked(&[b"k".to_vec()]).await.unwrap(), 1);
    s.check().await.unwrap();
}

#[test]
fn another_programs_database_or_a_newer_format_is_refused_and_left_alone() {
    let dir = TempDir::new();
    let foreign = dir.0.join("app.db");
    Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE users (id INTEGER)")
        .unwrap();
    for create in [Create::Yes, Create::No] {
        let detail = refusal(open_file("t", &foreign, create, &[]).unwrap_err());
        assert!(
            detail.contains("not a dlqctl idempotency store"),
            "{detail}"
        );
    }
    let c = Connection::open(&foreign).unwrap();
    let tables: i64 = c
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    assert_eq!(tables, 1, "left as it was");

    let not_a_db = dir.0.join("notes.db");
    std::fs::write(&not_a_db, "not a database, but long enough to have a header of sorts....................................................").unwrap();
    let detail = refusal(open_file("t", &not_a_db, Create::Yes, &[]).unwrap_err());
    assert!(detail.contains(&not_a_db.display().to_string()), "{detail}");

    let ours = dir.0.join("orders.db");
    drop(open_file("t", &ours, Create::Yes, &[]).unwrap());
    let c = Connection::open(&ours).unwrap();
    let version: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, FORMAT);
    c.pragma_update(None, "user_version", FORMAT + 1).unwrap();
    drop(c);
    let detail = refusal(open_file("t", &ours, Create::Yes, &[]).unwrap_err());
    assert!(detail.contains("newer dlqctl"), "{detail}");
}

#[test]
fn a_missing_directory_is_created_only_when_it_is_the_default_one() {
    let dir = TempDir::new();
    let elsewhere = dir.0.join("nowhere/orders.db");
    let e = open_file("t", &elsewhere, Create::Yes, &[]).unwrap_err();
    let detail = refusal(e);
    assert!(
        detail.contains("the directory") && detail.contains("does not exist"),
        "{detail}"
    );
    assert!(detail.contains(&dir.0.join("nowhere").display().to_string()));
    assert!(!dir.0.join("nowhere").exists());

    let state = dir.0.join("state");
    let env = |name: &str| match name {
        "XDG_STATE_HOME" => Some(state.display().to_string()),
        "HOME" => Some("/nonexistent-home".to_string()),
        _ => None,
    };
    let defaults = crate::idempotency::store::default_dirs(&env);
    assert_eq!(
        defaults,
        vec![
            state.join("dlqctl"),
            PathBuf::from("/nonexistent-home/.local/state/dlqctl")
        ]
    );
    let default_file = state.join("dlqctl/orders.db");
    open_file("t", &default_file, Create::Yes, &defaults).unwrap();
    assert!(default_file.exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.join("dlqctl"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

/// Runs `f` as the user `nobody` for file access (a thread of its own:
/// `setfsuid` is per thread), so that a read-only directory is read-only
/// to the test even when it runs as root.
fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: changes this thread's file-system ids only.
        unsafe {
            libc::setfsgid(65534);
            libc::setfsuid(65534);
        }
        f()
    })
    .join()
    .unwrap()
}

#[test]
fn a_read_only_directory_or_file_is_refused_naming_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new();
    let ro = dir.0.join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let path = ro.join("orders.db");
    let p = path.clone();
    let detail = refusal(as_nobody(move || open_file("t", &p, Create::Yes, &[])).unwrap_err());
    assert!(detail.contains(&path.display().to_string()), "{detail}");
    assert!(detail.contains("read-only or not writable"), "{detail}");

    // A file others may not write, in a directory they may.
    let shared = dir.0.join("shared");
    std::fs::create_dir(&shared).unwrap();
    let path = shared.join("orders.db");
    drop(open_file("t", &path, Create::Yes, &[]).unwrap());
    for entry in std::fs::read_dir(&shared).unwrap() {
        let entry = entry.unwrap().path();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o444)).unwrap();
    }
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let p = path.clone();
    let detail = refusal(as_nobody(move || open_file("t", &p, Create::Yes, &[])).unwrap_err());
    assert!(detail.contains(&path.display().to_string()), "{detail}");
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn network_file_systems_are_named() {
    assert_eq!(network_fs(0x6969), Some("NFS"));
    assert_eq!(network_fs(0xFF53_4D42), Some("CIFS"));
    assert_eq!(network_fs(0xFFFF_FFFF_FF53_4D42), Some("CIFS"));
    assert_eq!(network_fs(0xFE53_4D42), Some("SMB2"));
    assert_eq!(network_fs(0x6573_5546), Some("FUSE"));
    assert_eq!(network_fs(0x00C3_6400), Some("CephFS"));
    assert_eq!(network_fs(0x0102_1997), Some("9P"));
    assert_eq!(network_fs(0xEF53), None); // ext4
    assert_eq!(network_fs(0x0102_1994), None); // tmpfs
    check_local_fs("t", &std::env::temp_dir()).unwrap();
}
