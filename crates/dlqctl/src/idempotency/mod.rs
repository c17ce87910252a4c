//! The idempotency stores: where the keys of handled messages and the
//! leases of running handlers are kept (docs/worker.md, "Idempotent
//! handling"). One small interface, [`Store`], and one implementation per
//! cargo feature: `sqlite` (an embedded file, for the workers of one
//! machine) and `redis` (for a fleet; Valkey speaks the same protocol).
//!
//! Every expiry is measured by the store's own clock, never a worker's,
//! so clock skew between machines cannot shorten a lease.

use std::sync::Arc;

use crate::core::idempotency::StoreSpec;

#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;
#[cfg(test)]
mod tests;

use store::default_dirs;
pub use store::KeyState;
pub use store::{Begin, BodySha, Create, Lease, Store, StoreError, Token};

/// A store URL made concrete: `env:` read, the default SQLite path
/// chosen. Its `Debug` shows no password.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// An SQLite file.
    Sqlite(std::path::PathBuf),
    /// A `redis://` or `rediss://` URL (with its password, if any).
    Redis(String),
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreUrl::Redis(url) => f
                .debug_tuple("Redis")
                .field(&crate::core::idempotency::redact_url(url))
                .finish(),
        }
    }
}

/// Makes `spec` concrete for `pipeline`: an `env:NAME` is read from
/// `env` (a missing or empty variable is refused, naming it), and the
/// default SQLite file is `$STATE_DIRECTORY/PIPELINE.db` when systemd
/// gives a state directory (its first one), else the packaged unit's
/// (`/var/lib/dlqctl/PIPELINE/PIPELINE.db`, or under
/// `/var/lib/private/dlqctl/` with `DynamicUser`) when its directory
/// exists, so that a command run from an operator's shell finds the
/// installed worker's file, else `$XDG_STATE_HOME/dlqctl/PIPELINE.db`,
/// else `$HOME/.local/state/dlqctl/PIPELINE.db`.
pub fn resolve(
    spec: &StoreSpec,
    pipeline: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<StoreUrl, StoreError> {
    resolve_at(spec, pipeline, env, std::path::Path::new("/"))
}

/// [`resolve`], with the file system's root at `root` (tests).
pub(crate) fn resolve_at(
    spec: &StoreSpec,
    pipeline: &str,
    env: &dyn Fn(&str) -> Option<String>,
    root: &std::path::Path,
) -> Result<StoreUrl, StoreError> {
    let refused = |store: &str, detail: String| StoreError::Refused {
        store: store.to_string(),
        detail,
    };
    match spec {
        StoreSpec::Sqlite(Some(path)) => Ok(StoreUrl::Sqlite(path.into())),
        StoreSpec::Sqlite(None) => {
            let file = format!("{}.db", file_safe(pipeline));
            let state_directory = env("STATE_DIRECTORY").filter(|v| !v.is_empty());
            if state_directory.is_none() {
                // An operator's shell: the installed worker's file, when
                // the unit's state directory is there.
                if let Some(dir) = unit_dirs(root, pipeline).into_iter().find(|d| d.is_dir()) {
                    return Ok(StoreUrl::Sqlite(dir.join(file)));
                }
            }
            match default_dirs(env).into_iter().next() {
                Some(dir) => Ok(StoreUrl::Sqlite(dir.join(file))),
                None => Err(refused(
                    "sqlite (default path)",
                    "no STATE_DIRECTORY, XDG_STATE_HOME or HOME to put the default file in: give idempotency.store: sqlite:PATH".into(),
                )),
            }
        }
        StoreSpec::Redis(url) => {
            crate::secrets::register_url(url);
            Ok(StoreUrl::Redis(url.clone()))
        }
        StoreSpec::Env(name) => {
            let store = format!("env:{name}");
            // Its value is a secret: handler processes do not inherit it.
            crate::secrets::withhold_var(name);
            let value = env(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                refused(
                    &store,
                    format!("the environment variable {name} is not set"),
                )
            })?;
            crate::secrets::register_url(&value);
            match StoreSpec::parse(&value) {
                Ok(StoreSpec::Env(_)) | Err(_) => Err(refused(
                    &store,
                    format!(
                        "{name} must hold sqlite:PATH, redis://… or rediss://…, not `{}`",
                        crate::core::idempotency::redact_url(&value)
                    ),
                )),
                Ok(inner) => resolve_at(&inner, pipeline, env, root),
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

/// What [`open_with`] may be told beyond the URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// The CA (PEM) a `rediss://` server's certificate must chain to,
    /// instead of the system's roots (which `SSL_CERT_FILE` and
    /// `SSL_CERT_DIR` can also replace).
    pub redis_ca_pem: Option<Vec<u8>>,
}

/// Opens the store `url` names for the keys of `scope`
/// ([`crate::core::idempotency::scope`]): an SQLite file (created, with
/// its default directory, under [`Create::Yes`]), or a Redis server,
/// connected and authenticated. Refused when this build left the store's
/// cargo feature out.
pub async fn open(
    url: &StoreUrl,
    scope: &[u8],
    create: Create,
) -> Result<Arc<dyn Store>, StoreError> {
    open_with(url, scope, create, &OpenOptions::default()).await
}

/// [`open`], with [`OpenOptions`].
pub async fn open_with(
    url: &StoreUrl,
    scope: &[u8],
    create: Create,
    options: &OpenOptions,
) -> Result<Arc<dyn Store>, StoreError> {
    // Each is used by one store only; a build may leave that one out.
    let _ = (scope, create, options);
    match url {
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => {
            let store = self::sqlite::SqliteStore::open(path, scope, create).await?;
            Ok(Arc::new(store))
        }
        #[cfg(not(feature = "sqlite"))]
        StoreUrl::Sqlite(path) => Err(StoreError::Refused {
            store: format!("sqlite:{}", path.display()),
            detail: "this dlqctl was built without the sqlite feature".into(),
        }),
        #[cfg(feature = "redis")]
        StoreUrl::Redis(url) => {
            let store =
                self::redis::RedisStore::open(url, scope, options.redis_ca_pem.as_deref()).await?;
            Ok(Arc::new(store))
        }
        #[cfg(not(feature = "redis"))]
        StoreUrl::Redis(url) => Err(StoreError::Refused {
            store: crate::core::idempotency::redact_url(url),
            detail: "this dlqctl was built without the redis feature".into(),
        }),
    }
}

/// The state directories the packaged unit `dlqctl-work@PIPELINE`
/// gives its worker (`StateDirectory=dlqctl/%i`), under `root`: the
/// path without `DynamicUser` (with it, a symlink into `private/`), then
/// the one with it.
fn unit_dirs(root: &std::path::Path, pipeline: &str) -> [std::path::PathBuf; 2] {
    let name = file_safe(pipeline);
    [
        root.join("var/lib/dlqctl").join(&name),
        root.join("var/lib/private/dlqctl").join(&name),
    ]
}

/// Where the packaged unit's worker of `pipeline` keeps its default
/// SQLite file, for a message that did not find it where it looked.
pub fn unit_hint(pipeline: &str) -> String {
    let name = file_safe(pipeline);
    format!(
        "the packaged unit dlqctl-work@{pipeline} keeps it in /var/lib/private/dlqctl/{name}/{name}.db \
         (/var/lib/dlqctl/{name}/{name}.db without DynamicUser); that directory was not found or \
         not readable by this user: run as root, or give idempotency.store: sqlite:PATH"
    )
}
