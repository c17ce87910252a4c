//! The SQLite store: one file, shared by the `dlqctl work` processes of
//! one machine. One row per key holds its lease (holder's token, expiry)
//! and its mark (body SHA-256, expiry); every expiry is computed in the
//! SQL by SQLite's own clock. `begin` runs in a `BEGIN IMMEDIATE`
//! transaction, so two processes sharing the file never both acquire a
//! key. WAL, `synchronous=NORMAL` and a busy timeout; refused on NFS,
//! CIFS/SMB and FUSE, where WAL's shared memory is unsafe.
//!
//! rusqlite blocks: the connection lives on a thread of its own, which
//! takes the calls queued meanwhile (at most [`MAX_BATCH`]) and runs them
//! in one `BEGIN IMMEDIATE` transaction, then answers each once the
//! transaction committed (group commit: one
//! commit for the messages in flight, instead of two a message). A call
//! is bounded by [`CALL_TIMEOUT`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};
use tokio::sync::oneshot;

use super::store::{Begin, BodySha, Create, KeyState, Lease, Store, StoreError, Token};
use crate::core::wire::{DOCTOR_KEY_PREFIX, SQLITE_THREAD_NAME};

/// How long a statement waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a call may take, lock waits included.
const CALL_TIMEOUT: Duration = Duration::from_secs(8);
/// The longest opening the file may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often expired rows are deleted, and how many per statement.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
const SWEEP_BATCH: i64 = 1_000;
/// The most calls one transaction takes.
const MAX_BATCH: usize = 256;
/// The most keys one call of `count_marked` looks up (the write lock is
/// let go between two calls).
const COUNT_CHUNK: usize = 200;

/// Now by SQLite's clock, in ms since the epoch.
macro_rules! now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    };
}

/// The format of the file this dlqctl writes (`PRAGMA user_version`).
const FORMAT: i64 = 1;

/// The table. A row is absent once both its lease and its mark have
/// expired (`expires_at_ms`, which the sweeper reads through its index).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS dlqctl_keys (
    scope BLOB NOT NULL,
    key BLOB NOT NULL,
    lease_token BLOB,
    lease_expires_ms INTEGER,
    done_sha BLOB,
    done_expires_ms INTEGER,
    expires_at_ms INTEGER GENERATED ALWAYS AS
        (max(coalesce(lease_expires_ms, 0), coalesce(done_expires_ms, 0))) VIRTUAL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dlqctl_keys_expiry ON dlqctl_keys (expires_at_ms);
";

/// The SQLite store.
pub(super) struct SqliteStore {
    describe: String,
    scope: Vec<u8>,
    calls: Calls,
    sweeper: tokio::task::AbortHandle,
    /// Alive while the connection's thread runs (the tests watch it end).
    #[allow(dead_code)]
    alive: std::sync::Weak<()>,
}

/// What a call leaves to do once its transaction ended: answer its
/// caller, with the commit's outcome.
type Finish = Box<dyn FnOnce(Result<(), String>) + Send>;
/// A call, run on the connection (`None`: its transaction could not
/// start), giving what answers it after the commit.
type Job = Box<dyn FnOnce(Option<&Connection>) -> Finish + Send>;
/// Where calls are queued for the connection's thread.
type Calls = std::sync::mpsc::Sender<Job>;

/// The connection's thread: a transaction for every batch of calls queued
/// meanwhile. Ends when every sender is gone (the store dropped).
fn serve(conn: Connection, calls: std::sync::mpsc::Receiver<Job>) {
    while let Ok(first) = calls.recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match calls.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let begun = conn.execute_batch("BEGIN IMMEDIATE");
        let finish: Vec<Finish> = jobs
            .into_iter()
            .map(|job| job(begun.is_ok().then_some(&conn)))
            .collect();
        let ended = match begun {
            Ok(()) => conn.execute_batch("COMMIT").map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if ended.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for f in finish {
            f(ended.clone());
        }
    }
}

/// A job running `f`, answering on `reply` once the transaction ended.
fn job<T, F>(f: F, reply: oneshot::Sender<Result<T, String>>) -> Job
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
{
    Box::new(move |conn: Option<&Connection>| -> Finish {
        // A failed statement undoes itself, not the transaction; a call
        // of several writes that must go together (`check`) keeps them in
        // a savepoint of its own.
        let ran = conn.map(f);
        Box::new(move |ended: Result<(), String>| {
            let answer = match (ended, ran) {
                (Err(e), _) => Err(e),
                (Ok(()), Some(Ok(v))) => Ok(v),
                (Ok(()), Some(Err(e))) => Err(e.to_string()),
                (Ok(()), None) => Err("the transaction did not start".into()),
            };
            let _ = reply.send(answer);
        })
    })
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("store", &self.describe)
            .finish_non_exhaustive()
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

impl SqliteStore {
    /// Opens (under [`Create::Yes`], creates) the file at `path`.
    pub(super) async fn open(
        path: &Path,
        scope: &[u8],
        create: Create,
    ) -> Result<SqliteStore, StoreError> {
        let describe = format!("sqlite:{}", path.display());
        let dirs = super::store::default_dirs(&|name| std::env::var(name).ok());
        let (store, path) = (describe.clone(), path.to_path_buf());
        let opening = tokio::task::spawn_blocking(move || open_file(&store, &path, create, &dirs));
        let conn = match tokio::time::timeout(OPEN_TIMEOUT, opening).await {
            Err(_) => {
                return Err(unavailable(
                    &describe,
                    format!("did not open within {} s", OPEN_TIMEOUT.as_secs()),
                ))
            }
            Ok(Err(join)) => return Err(unavailable(&describe, join.to_string())),
            Ok(Ok(conn)) => conn?,
        };
        SqliteStore::start(describe, scope, conn)
    }

    /// The store over an open connection, its sweeper started; a thread
    /// the system refuses is an outage (waited for at start).
    fn start(describe: String, scope: &[u8], conn: Connection) -> Result<SqliteStore, StoreError> {
        let (calls, queue) = std::sync::mpsc::channel();
        let token = std::sync::Arc::new(());
        let alive = std::sync::Arc::downgrade(&token);
        std::thread::Builder::new()
            .name(SQLITE_THREAD_NAME.into())
            .spawn(move || {
                serve(conn, queue);
                drop(token);
            })
            .map_err(|e| unavailable(&describe, format!("cannot start its thread: {e}")))?;
        let sweeper = tokio::spawn(sweep_forever(describe.clone(), calls.clone())).abort_handle();
        Ok(SqliteStore {
            describe,
            scope: scope.to_vec(),
            calls,
            sweeper,
            alive,
        })
    }

    /// Runs `f` on the connection's thread, in the next transaction,
    /// bounded.
    async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        call(&self.describe, &self.calls, f).await
    }
}

async fn call<T, F>(describe: &str, calls: &Calls, f: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    if calls.send(job(f, reply)).is_err() {
        return Err(unavailable(describe, "the store's thread is gone".into()));
    }
    match tokio::time::timeout(CALL_TIMEOUT, answer).await {
        Err(_) => Err(unavailable(
            describe,
            format!("no answer within {} s", CALL_TIMEOUT.as_secs()),
        )),
        Ok(Err(_)) => Err(unavailable(describe, "the store's thread is gone".into())),
        // After the start, any failure is an outage (a file locked or made
        // unwritable can be fixed while the worker waits).
        Ok(Ok(Err(e))) => Err(unavailable(describe, e)),
        Ok(Ok(Ok(v))) => Ok(v),
    }
}

fn unavailable(store: &str, detail: String) -> StoreError {
    StoreError::Unavailable {
        store: store.to_string(),
        detail,
    }
}

fn refused(store: &str, detail: String) -> StoreError {
    StoreError::Refused {
        store: store.to_string(),
        detail,
    }
}

/// A lease or keep length as SQL wants it (bounded: no overflow).
fn ms(v: u64) -> i64 {
    v.min(1 << 50) as i64
}

impl Store for SqliteStore {
    fn describe(&self) -> &str {
        &self.describe
    }

    fn call_bound(&self) -> Duration {
        CALL_TIMEOUT
    }

    fn begin<'a>(
        &'a self,
        key: &'a [u8],
        body: &'a BodySha,
        token: &'a Token,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<Begin, StoreError>> {
        let (scope, key, body, token) = (self.scope.clone(), key.to_vec(), *body, *token);
        self.call(move |c| begin(c, &scope, &key, &body, token, ms(lease_ms)))
            .boxed()
    }

    fn renew<'a>(
        &'a self,
        lease: &'a Lease,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (scope, lease) = (self.scope.clone(), lease.clone());
        self.call(move |c| {
            let sql = concat!(
                "UPDATE dlqctl_keys SET lease_expires_ms = ",
                now_ms!(),
                " + ?4 WHERE scope = ?1 AND key = ?2 AND lease_token = ?3 AND lease_expires_ms > ",
                now_ms!()
            );
            let n = c.execute(
                sql,
                params![scope, lease.key, &lease.token[..], ms(lease_ms)],
            )?;
            Ok(n == 1)
        })
        .boxed()
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        let (scope, lease) = (self.scope.clone(), lease.clone());
        self.call(move |c| release(c, &scope, &lease)).boxed()
    }

    fn mark<'a>(
        &'a self,
        lease: &'a Lease,
        body: &'a BodySha,
        keep_ms: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (scope, lease, body) = (self.scope.clone(), lease.clone(), *body);
        self.call(move |c| {
            // A live mark of another body stays as it is (a conflict's
            // success never replaces it: an exact copy of the body it was
            // made for stays a duplicate).
            let sql = concat!(
                "INSERT INTO dlqctl_keys (scope, key, done_sha, done_expires_ms) VALUES (?1, ?2, ?3, ",
                now_ms!(),
                " + ?4) ON CONFLICT (scope, key) DO UPDATE SET ",
                "done_sha = CASE WHEN done_sha <> excluded.done_sha AND done_expires_ms > ",
                now_ms!(),
                " THEN done_sha ELSE excluded.done_sha END, ",
                "done_expires_ms = CASE WHEN done_sha <> excluded.done_sha AND done_expires_ms > ",
                now_ms!(),
                " THEN done_expires_ms ELSE excluded.done_expires_ms END, ",
                "lease_expires_ms = CASE WHEN lease_token = ?5 THEN NULL ELSE lease_expires_ms END, ",
                "lease_token = CASE WHEN lease_token = ?5 THEN NULL ELSE lease_token END"
            );
            let args = params![scope, lease.key, &body[..], ms(keep_ms), &lease.token[..]];
            c.prepare_cached(sql)?.execute(args).map(|_| ())
        })
        .boxed()
    }

    fn count_marked<'a>(&'a self, keys: &'a [Vec<u8>]) -> BoxFuture<'a, Result<usize, StoreError>> {
        // A call of its own per chunk: every call runs in the write
        // transaction, and a dry run over a whole DLQ held it for its
        // whole loop, stalling every worker's begin on the file.
        async move {
            let mut n = 0;
            for chunk in keys.chunks(COUNT_CHUNK) {
                let (scope, chunk) = (self.scope.clone(), chunk.to_vec());
                n += self.call(move |c| count_marked(c, &scope, &chunk)).await?;
            }
            Ok(n)
        }
        .boxed()
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        // The write lock, not only a read (a worker needs to write): the
        // call's transaction took it.
        self.call(|c| c.query_row("SELECT 1", [], |_| Ok(())))
            .boxed()
    }

    fn check(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let scope = self.scope.clone();
        async move {
            let found = self.call(move |c| check(c, &scope)).await?;
            if found {
                Ok(())
            } else {
                Err(unavailable(
                    &self.describe,
                    "a key written was not read back".into(),
                ))
            }
        }
        .boxed()
    }

    fn look<'a>(&'a self, key: &'a [u8]) -> BoxFuture<'a, Result<KeyState, StoreError>> {
        let (scope, key) = (self.scope.clone(), key.to_vec());
        self.call(move |c| {
            let sql = concat!(
                "SELECT coalesce(done_expires_ms, 0) > ",
                now_ms!(),
                ", coalesce(lease_expires_ms, 0) > ",
                now_ms!(),
                " FROM dlqctl_keys WHERE scope = ?1 AND key = ?2"
            );
            let row: Option<(bool, bool)> = c
                .prepare_cached(sql)?
                .query_row(params![scope, key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            Ok(match row {
                Some((true, _)) => KeyState::Handled,
                Some((false, true)) => KeyState::Leased,
                _ => KeyState::Free,
            })
        })
        .boxed()
    }
}

/// [`Store::begin`], in one `BEGIN IMMEDIATE` transaction.
fn begin(
    c: &Connection,
    scope: &[u8],
    key: &[u8],
    body: &BodySha,
    token: Token,
    lease_ms: i64,
) -> rusqlite::Result<Begin> {
    let sql = concat!(
        "SELECT done_sha, coalesce(done_expires_ms, 0) - ",
        now_ms!(),
        ", coalesce(lease_expires_ms, 0) - ",
        now_ms!(),
        ", lease_token FROM dlqctl_keys WHERE scope = ?1 AND key = ?2"
    );
    type Row = (Option<Vec<u8>>, i64, i64, Option<Vec<u8>>);
    let row: Option<Row> = c
        .prepare_cached(sql)?
        .query_row(params![scope, key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    let (done, lease_left, holder) = match row {
        None => (None, 0, None),
        Some((sha, done_left, lease_left, holder)) => {
            (sha.filter(|_| done_left > 0), lease_left, holder)
        }
    };
    if done.as_deref() == Some(&body[..]) {
        return Ok(Begin::Handled);
    }
    // Our own lease (a begin of this delivery that committed after the
    // worker stopped waiting for it) is taken again below, extended.
    if lease_left > 0 && holder.as_deref() != Some(&token[..]) {
        return Ok(Begin::Leased {
            remaining_ms: lease_left as u64,
        });
    }
    let sql = concat!(
        "INSERT INTO dlqctl_keys (scope, key, lease_token, lease_expires_ms) VALUES (?1, ?2, ?3, ",
        now_ms!(),
        " + ?4) ON CONFLICT (scope, key) DO UPDATE SET lease_token = excluded.lease_token, ",
        "lease_expires_ms = excluded.lease_expires_ms, ",
        "done_sha = CASE WHEN done_expires_ms > ",
        now_ms!(),
        " THEN done_sha END, done_expires_ms = CASE WHEN done_expires_ms > ",
        now_ms!(),
        " THEN done_expires_ms END"
    );
    c.prepare_cached(sql)?
        .execute(params![scope, key, &token[..], lease_ms])?;
    Ok(Begin::Acquired {
        lease: Lease {
            key: key.to_vec(),
            token,
        },
        conflict: done.is_some(),
    })
}

/// How many of `keys` are marked, by one statement per key.
fn count_marked(c: &Connection, scope: &[u8], keys: &[Vec<u8>]) -> rusqlite::Result<usize> {
    let sql = concat!(
        "SELECT count(*) FROM dlqctl_keys WHERE scope = ?1 AND key = ?2 AND done_expires_ms > ",
        now_ms!()
    );
    let mut stmt = c.prepare_cached(sql)?;
    let mut n = 0;
    for key in keys {
        n += stmt.query_row(params![scope, key], |r| r.get::<_, i64>(0))? as usize;
    }
    Ok(n)
}

/// [`Store::release`]: the lease dropped if ours, the row with it when
/// no mark is left.
fn release(c: &Connection, scope: &[u8], lease: &Lease) -> rusqlite::Result<()> {
    let args = params![scope, lease.key, &lease.token[..]];
    let ours = c.execute(
        "UPDATE dlqctl_keys SET lease_token = NULL, lease_expires_ms = NULL \
         WHERE scope = ?1 AND key = ?2 AND lease_token = ?3",
        args,
    )?;
    if ours == 1 {
        let sql = concat!(
            "DELETE FROM dlqctl_keys WHERE scope = ?1 AND key = ?2 AND lease_token IS NULL ",
            "AND coalesce(done_expires_ms, 0) <= ",
            now_ms!()
        );
        c.execute(sql, params![scope, lease.key])?;
    }
    Ok(())
}

/// [`Store::check`]: a `dlqctl-doctor:` key written, read back and
/// deleted, in one transaction (nothing is left even after a crash).
fn check(c: &Connection, scope: &[u8]) -> rusqlite::Result<bool> {
    // All or nothing: the key written is gone also when a step fails.
    c.execute_batch("SAVEPOINT doctor")?;
    let found = check_steps(c, scope);
    let end = match found {
        Ok(_) => "RELEASE doctor",
        Err(_) => "ROLLBACK TO doctor; RELEASE doctor",
    };
    c.execute_batch(end)?;
    found
}

/// [`check`]'s writes and read.
fn check_steps(c: &Connection, scope: &[u8]) -> rusqlite::Result<bool> {
    let key = format!("{DOCTOR_KEY_PREFIX}{:032x}", rand::random::<u128>());
    let sql = concat!(
        "INSERT INTO dlqctl_keys (scope, key, done_sha, done_expires_ms) VALUES (?1, ?2, ?3, ",
        now_ms!(),
        " + 60000)"
    );
    c.execute(sql, params![scope, key.as_bytes(), &[0u8; 32][..]])?;
    let found: i64 = c.query_row(
        "SELECT count(*) FROM dlqctl_keys WHERE scope = ?1 AND key = ?2",
        params![scope, key.as_bytes()],
        |r| r.get(0),
    )?;
    c.execute(
        "DELETE FROM dlqctl_keys WHERE scope = ?1 AND key = ?2",
        params![scope, key.as_bytes()],
    )?;
    Ok(found == 1)
}

/// Deletes the rows whose lease and mark have both expired, every
/// [`SWEEP_EVERY`], in batches (the lock is let go between them). Runs
/// until the store is dropped (which aborts it).
async fn sweep_forever(describe: String, calls: Calls) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        if let Err(e) = sweep(&describe, &calls).await {
            tracing::debug!(error = %e, "idempotency store: deleting expired keys failed");
        }
    }
}

/// One sweep: batches until one is not full. The number deleted.
async fn sweep(describe: &str, calls: &Calls) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let n = call(describe, calls, |c| {
            let sql = concat!(
                "DELETE FROM dlqctl_keys WHERE (scope, key) IN (SELECT scope, key FROM dlqctl_keys ",
                "WHERE expires_at_ms <= ",
                now_ms!(),
                " LIMIT ?1)"
            );
            c.execute(sql, params![SWEEP_BATCH])
        })
        .await?;
        total += n;
        if (n as i64) < SWEEP_BATCH {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// Opens the file: the directory checked (created only when it is a
/// default one and `create` says so), the file system checked, the file
/// opened read-write (created only under [`Create::Yes`]), WAL set and
/// the table made. Under [`Create::No`] nothing is created or changed.
fn open_file(
    store: &str,
    path: &Path,
    create: Create,
    default_dirs: &[PathBuf],
) -> Result<Connection, StoreError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let missing = || {
        refused(
            store,
            format!("{} does not exist (dlqctl work creates it)", path.display()),
        )
    };
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(refused(
                store,
                format!("{} is not a directory", dir.display()),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let ours = default_dirs.iter().any(|d| d == &dir)
                && path.extension().is_some_and(|x| x == "db");
            match create {
                Create::No => return Err(missing()),
                Create::Yes if ours => create_dir(store, &dir)?,
                Create::Yes => {
                    return Err(refused(
                        store,
                        format!("the directory {} does not exist", dir.display()),
                    ))
                }
            }
        }
        Err(e) => {
            let detail = format!("cannot read the directory {}: {e}", dir.display());
            return Err(refused(store, detail));
        }
    }
    check_local_fs(store, &dir)?;
    let exists = match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(refused(store, format!("{} is a directory", path.display())))
        }
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => {
            return Err(refused(
                store,
                format!("cannot read {}: {e}", path.display()),
            ))
        }
    };
    if !exists && create == Create::No {
        return Err(missing());
    }
    let conn = connect(path, create).map_err(|e| open_error(store, path, &e))?;
    match set_up(&conn, create).map_err(|e| open_error(store, path, &e))? {
        Some(version) if version <= FORMAT => Ok(conn),
        Some(version) => Err(refused(
            store,
            format!(
                "{} was made by a newer dlqctl (format {version}; this one knows {FORMAT})",
                path.display()
            ),
        )),
        None => Err(refused(
            store,
            format!(
                "{} is not a dlqctl idempotency store (it has no dlqctl_keys table): give a file of its own",
                path.display()
            ),
        )),
    }
}

/// The directory made, private to its owner, with its parents.
fn create_dir(store: &str, dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            refused(
                store,
                format!("cannot create the directory {}: {e}", dir.display()),
            )
        })
}

/// The file opened read-write (SQLite would fall back to read-only on a
/// write-protected file: refused below), created only under
/// [`Create::Yes`]. No URI: the path is a path.
fn connect(path: &Path, create: Create) -> rusqlite::Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create == Create::Yes {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

/// Read-only refused; WAL and the table under [`Create::Yes`], in a
/// file that is empty or ours (another program's database is left
/// alone); `synchronous=NORMAL` (a setting of the connection, not the
/// file). The file's format (`user_version`), `None` when it is not ours.
fn set_up(conn: &Connection, create: Create) -> rusqlite::Result<Option<i64>> {
    if conn.is_readonly(rusqlite::MAIN_DB)? {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some("the file is read-only".into()),
        ));
    }
    let (ours, others) = tables(conn)?;
    if !ours && (others > 0 || create == Create::No) {
        return Ok(None);
    }
    if create == Create::Yes {
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(format!("cannot use WAL here (journal_mode stays {mode})")),
            ));
        }
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(SCHEMA)?;
        if !ours {
            tx.pragma_update(None, "user_version", FORMAT)?;
        }
        tx.commit()?;
    }
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let version = conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))?;
    Ok(Some(version))
}

/// Whether the file has the table, and how many other objects it has.
/// (Reading the schema is where a file that is not a database fails.)
fn tables(conn: &Connection) -> rusqlite::Result<(bool, i64)> {
    conn.query_row(
        "SELECT count(*) FILTER (WHERE type = 'table' AND name = 'dlqctl_keys'), \
         count(*) FILTER (WHERE name NOT IN ('dlqctl_keys', 'dlqctl_keys_expiry')) FROM sqlite_master",
        [],
        |r| Ok((r.get::<_, i64>(0)? == 1, r.get::<_, i64>(1)?)),
    )
}

/// An error while opening: another process's lock is a wait
/// (unavailable); the rest (read-only, permissions, not a database) is a
/// refusal naming the file.
fn open_error(store: &str, path: &Path, e: &rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            unavailable(store, e.to_string())
        }
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied | ErrorCode::CannotOpen) => refused(
            store,
            format!(
                "{} or its directory is read-only or not writable by this user ({e})",
                path.display()
            ),
        ),
        _ => refused(store, format!("cannot use {}: {e}", path.display())),
    }
}

/// The name of a network, cluster or user-space file system, by
/// `statfs`'s `f_type`, where SQLite's WAL is unsafe (its shared memory
/// is not shared between machines, and locks may not be either).
fn network_fs(f_type: u64) -> Option<&'static str> {
    match f_type & 0xFFFF_FFFF {
        0x6969 => Some("NFS"),
        0xFF53_4D42 => Some("CIFS"),
        0xFE53_4D42 => Some("SMB2"),
        0x517B => Some("SMB"),
        0x6573_5546 => Some("FUSE"),
        0x00C3_6400 => Some("CephFS"),
        0x0102_1997 => Some("9P"),
        0x5346_414F | 0x6B41_4653 => Some("AFS"),
        0x0BD0_0BD0 => Some("Lustre"),
        0x4750_4653 => Some("GPFS"),
        0x0116_1970 => Some("GFS2"),
        0x7461_636F => Some("OCFS2"),
        _ => None,
    }
}

/// Refuses a directory on NFS, CIFS/SMB or FUSE.
#[cfg(target_os = "linux")]
fn check_local_fs(store: &str, dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::ffi::OsStrExt;
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| refused(store, format!("{} holds a NUL byte", dir.display())))?;
    // SAFETY: a valid C string and a zeroed struct statfs writes into.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_dir.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        let detail = format!("cannot read the file system of {}: {e}", dir.display());
        return Err(refused(store, detail));
    }
    #[allow(clippy::unnecessary_cast)] // f_type's type differs by platform
    let f_type = st.f_type as u64;
    match network_fs(f_type) {
        Some(fs) => Err(refused(
            store,
            format!(
                "{} is on {fs}, where SQLite's WAL is unsafe: put the file on a local disk, or use redis://",
                dir.display()
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(not(target_os = "linux"))]
fn check_local_fs(_store: &str, _dir: &Path) -> Result<(), StoreError> {
    Ok(())
}

#[cfg(test)]
mod tests;
