//! The interface every idempotency store implements, and what it
//! answers. Re-exported by the parent module, where its users name it
//! (`crate::idempotency::Store`): a file of its own so that the stores
//! can name it without importing the module that opens them.

use futures_util::future::BoxFuture;

/// The SHA-256 of a body, kept with a mark.
pub type BodySha = [u8; 32];

/// The owner token of a lease: random, one per delivery.
pub type Token = [u8; 16];

/// A lease on one key, held by one delivery. Only its holder (the
/// `token`) can renew, release or turn it into a mark; the same token's
/// [`Store::begin`] recognises it as its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The key (raw bytes, within the store's scope).
    pub key: Vec<u8>,
    /// The holder's token, unique to the delivery.
    pub token: Token,
}

impl Lease {
    /// A lease on `key` for a new holder: a random token.
    pub fn new(key: Vec<u8>) -> Lease {
        Lease {
            key,
            token: rand::random(),
        }
    }
}

/// What [`Store::begin`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The lease is ours: run the handler. `conflict`: the key was marked
    /// handled with another body (not a duplicate: counted and warned
    /// about, then what the pipeline's `on_conflict` says).
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
/// when it is opened). Every call is bounded in time by the store
/// ([`Store::call_bound`]).
///
/// The lease contract, the same for every store (and tested so, by one
/// suite run against each: tests/integration/idempotency_contract.rs):
///
/// - a lease is held by one owner token; its expiry is measured by the
///   store's clock, never a worker's;
/// - `begin` by another token finds it [`Begin::Leased`]; `begin` by the
///   same token finds it its own ([`Begin::Acquired`], extended), so a
///   call the worker gave up on but the store committed is harmless: the
///   same delivery recognises or releases its lease;
/// - only the holder renews, releases, or gives it up by marking;
/// - a lease renewed to a longer time (a timeout whose outcome is
///   unknown: "in doubt") is held that long, and another token's `begin`
///   says so;
/// - a lease that expired is anybody's: its old holder's renew answers
///   `false`, and its release leaves the new holder's lease alone.
pub trait Store: Send + Sync + 'static {
    /// The store as logs show it: kind and place, never a password
    /// (`sqlite:/var/lib/dlqctl/orders.db`, `redis://cache:6379/0`).
    fn describe(&self) -> &str;

    /// The longest one call may take before it is counted as failed (it
    /// may still commit after). A lease is at least three times this,
    /// and renewed so that one slow renewal cannot let it lapse
    /// ([`crate::core::idempotency::lease_floor_ms`]).
    fn call_bound(&self) -> std::time::Duration;

    /// Before a handler runs: a key marked handled with the same body is
    /// [`Begin::Handled`]; a key leased by another token is
    /// [`Begin::Leased`]; else a lease of `lease_ms` is taken for `token`
    /// (or, when `token` holds it already, extended to `lease_ms` from
    /// now), atomically (two workers never both acquire one key).
    fn begin<'a>(
        &'a self,
        key: &'a [u8],
        body: &'a BodySha,
        token: &'a Token,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<Begin, StoreError>>;

    /// While the handler runs, and to keep a key in doubt: extends the
    /// lease to `lease_ms` from now; `false` when it is no longer ours
    /// (expired, or released).
    fn renew<'a>(
        &'a self,
        lease: &'a Lease,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// After an answered failure: gives the lease up, if still ours.
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>>;

    /// After a success: marks the key handled with `body`, kept `keep_ms`,
    /// and gives the lease up (marked even when the lease was lost: the
    /// handler succeeded). A mark of another body that has not expired
    /// stays as it is: a mark keeps the body it was made for.
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

    /// What the store holds for `key` now, read only: nothing is taken,
    /// renewed or changed (a replay's canary choice and check, its count
    /// of messages already handled).
    fn look<'a>(&'a self, key: &'a [u8]) -> BoxFuture<'a, Result<KeyState, StoreError>>;
}

/// What [`Store::look`] found for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// Marked handled (with any body): a copy would be acked as a
    /// duplicate, or be a conflict.
    Handled,
    /// Not marked, but a lease is live (a handler runs, or its outcome
    /// is in doubt): a copy would be deferred.
    Leased,
    /// Neither: a copy would run the handler.
    Free,
}

/// How [`open`](super::open) treats a missing SQLite file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// Create it (and the default directory): the worker.
    Yes,
    /// Never create anything: `doctor`, `dlq replay --dry-run`.
    No,
}

/// The default state directories, in the order [`super::resolve`] prefers them
/// (the first is the default file's home): `$STATE_DIRECTORY` (its
/// first), `$XDG_STATE_HOME/dlqctl`, `$HOME/.local/state/dlqctl`. The
/// SQLite store creates only these.
pub(crate) fn default_dirs(env: &dyn Fn(&str) -> Option<String>) -> Vec<std::path::PathBuf> {
    let nonempty = |name: &str| env(name).filter(|v| !v.is_empty());
    let mut dirs = Vec::new();
    if let Some(dirs_var) = nonempty("STATE_DIRECTORY") {
        dirs.push(std::path::PathBuf::from(
            dirs_var.split(':').next().unwrap_or(&dirs_var),
        ));
    }
    if let Some(xdg) = nonempty("XDG_STATE_HOME") {
        dirs.push(std::path::Path::new(&xdg).join("dlqctl"));
    }
    if let Some(home) = nonempty("HOME") {
        dirs.push(std::path::Path::new(&home).join(".local/state/dlqctl"));
    }
    dirs
}
