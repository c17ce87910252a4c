//! The idempotency stores: where the keys of handled messages and the
//! leases of running handlers are kept (docs/worker.md, "Idempotent
//! handling"). One small interface, [`Store`], and one implementation per
//! cargo feature: `sqlite` (an embedded file, for the workers of one
//! machine) and `redis` (for a fleet; Valkey speaks the same protocol).
//!
//! Every expiry is measured by the store's own clock, never a worker's,
//! so clock skew between machines cannot shorten a lease.

use futures_util::future::BoxFuture;

use crate::core::idempotency::StoreSpec;

/// The SHA-256 of a body, kept with a mark.
pub type BodySha = [u8; 32];

/// A lease on one key, held by one handler run. Only its holder (the
/// `token`) can renew, release or turn it into a mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The key (raw bytes, within the store's scope).
    pub key: Vec<u8>,
    /// The holder's random token.
    pub token: [u8; 16],
}

/// What [`Store::begin`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The lease is ours: run the handler. `conflict`: the key was marked
    /// handled with another body (not a duplicate: it runs, and is
    /// counted and warned about).
    Acquired {
        /// The lease taken.
        lease: Lease,
        /// Marked with another body.
        conflict: bool,
    },
    /// Marked handled with the same body: a duplicate.
    Handled,
    /// Another run holds the lease, for this long yet by the store's
    /// clock.
    Leased {
        /// What is left of the lease, in ms.
        remaining_ms: u64,
    },
}

/// A store's failure. Its text never holds a password.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// Cannot be reached, or did not answer in time: waited for at start
    /// (like the broker), a pause after.
    #[error("idempotency store {store} is unavailable: {detail}")]
    Unavailable {
        /// The store, as [`Store::describe`] says it.
        store: String,
        /// What went wrong.
        detail: String,
    },
    /// Reached but refused: a wrong password, a read-only or missing
    /// directory, a file on a network file system. Exit 1 at start.
    #[error("idempotency store {store} refused: {detail}")]
    Refused {
        /// The store, as [`Store::describe`] says it.
        store: String,
        /// What went wrong.
        detail: String,
    },
}

/// One store of keys and leases, scoped to one vhost and pipeline (given
/// when it is opened). Every call is bounded in time by the store.
pub trait Store: Send + Sync + 'static {
    /// The store as logs show it: kind and place, never a password
    /// (`sqlite:/var/lib/dlqctl/orders.db`, `redis://cache:6379/0`).
    fn describe(&self) -> &str;

    /// Before a handler runs: a key marked handled with the same body is
    /// [`Begin::Handled`]; a key leased by another run is
    /// [`Begin::Leased`]; else a lease of `lease_ms` is taken, atomically
    /// (two workers never both acquire one key).
    fn begin<'a>(
        &'a self,
        key: &'a [u8],
        body: &'a BodySha,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<Begin, StoreError>>;

    /// While the handler runs: extends the lease to `lease_ms` from now;
    /// `false` when it is no longer ours (expired and taken).
    fn renew<'a>(
        &'a self,
        lease: &'a Lease,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// After an answered failure: gives the lease up, if still ours.
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>>;

    /// After a success: marks the key handled with `body`, kept `keep_ms`,
    /// and gives the lease up (marked even when the lease was lost: the
    /// handler succeeded).
    fn mark<'a>(
        &'a self,
        lease: &'a Lease,
        body: &'a BodySha,
        keep_ms: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// How many of `keys` are marked handled (`dlq replay --dry-run`).
    fn count_marked<'a>(&'a self, keys: &'a [Vec<u8>]) -> BoxFuture<'a, Result<usize, StoreError>>;

    /// Whether the store answers (the end of a pause).
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// `doctor`: writes, reads back and deletes a `dlqctl-doctor:` key.
    fn check(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// How [`open`] treats a missing SQLite file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// Create it (and the default directory): the worker.
    Yes,
    /// Never create anything: `doctor`, `dlq replay --dry-run`.
    No,
}

/// A store URL made concrete: `env:` read, the default SQLite path
/// chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// An SQLite file.
    Sqlite(std::path::PathBuf),
    /// A `redis://` or `rediss://` URL (with its password, if any).
    Redis(String),
}

/// Makes `spec` concrete for `pipeline`: an `env:NAME` is read from
/// `env` (a missing or empty variable is refused, naming it), and the
/// default SQLite file is `$STATE_DIRECTORY/PIPELINE.db` when systemd
/// gives a state directory (its first one), else
/// `$XDG_STATE_HOME/dlqctl/PIPELINE.db`, else
/// `$HOME/.local/state/dlqctl/PIPELINE.db`.
pub fn resolve(
    spec: &StoreSpec,
    pipeline: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<StoreUrl, StoreError> {
    let refused = |store: &str, detail: String| StoreError::Refused {
        store: store.to_string(),
        detail,
    };
    match spec {
        StoreSpec::Sqlite(Some(path)) => Ok(StoreUrl::Sqlite(path.into())),
        StoreSpec::Sqlite(None) => {
            let file = format!("{}.db", file_safe(pipeline));
            let nonempty = |name: &str| env(name).filter(|v| !v.is_empty());
            let dir = if let Some(dirs) = nonempty("STATE_DIRECTORY") {
                std::path::PathBuf::from(dirs.split(':').next().unwrap_or(&dirs))
            } else if let Some(xdg) = nonempty("XDG_STATE_HOME") {
                std::path::Path::new(&xdg).join("dlqctl")
            } else if let Some(home) = nonempty("HOME") {
                std::path::Path::new(&home).join(".local/state/dlqctl")
            } else {
                return Err(refused(
                    "sqlite (default path)",
                    "no STATE_DIRECTORY, XDG_STATE_HOME or HOME to put the default file in: give idempotency.store: sqlite:PATH".into(),
                ));
            };
            Ok(StoreUrl::Sqlite(dir.join(file)))
        }
        StoreSpec::Redis(url) => Ok(StoreUrl::Redis(url.clone())),
        StoreSpec::Env(name) => {
            let store = format!("env:{name}");
            let value = env(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                refused(
                    &store,
                    format!("the environment variable {name} is not set"),
                )
            })?;
            match StoreSpec::parse(&value) {
                Ok(StoreSpec::Env(_)) | Err(_) => Err(refused(
                    &store,
                    format!(
                        "{name} must hold sqlite:PATH, redis://… or rediss://…, not `{}`",
                        crate::core::idempotency::redact_url(&value)
                    ),
                )),
                Ok(inner) => resolve(&inner, pipeline, env),
            }
        }
    }
}

/// A pipeline's name as a file name: `/` and NUL replaced.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| if c == '/' || c == '\0' { '_' } else { c })
        .collect()
}

/// Opens the store at `url` for the keys of `scope` (see
/// [`crate::core::idempotency::scope`]).
pub async fn open(
    url: &StoreUrl,
    scope: &[u8],
    create: Create,
) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    let _ = (scope, create);
    Err(StoreError::Refused {
        store: match url {
            StoreUrl::Sqlite(p) => format!("sqlite:{}", p.display()),
            StoreUrl::Redis(u) => crate::core::idempotency::redact_url(u),
        },
        detail: "PLACEHOLDER until the stores land".into(),
    })
}
