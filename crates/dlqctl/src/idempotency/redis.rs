//! The Redis store (Valkey speaks the same protocol), for workers on
//! several machines. A key has two Redis keys, binary-safe:
//! `dlqctl:SCOPE:lease:KEY` (the holder's token, with an expiry) and
//! `dlqctl:SCOPE:done:KEY` (the body's SHA-256, with an expiry). Every
//! step that reads then writes is one Lua script, so it is atomic, and
//! every expiry is Redis's own (`PX`, `PTTL`).
//!
//! One [`ConnectionManager`] (one multiplexed connection, reconnected
//! after a failure); every call bounded by [`CALL_TIMEOUT`]. A `READONLY`
//! answer (the server was demoted to a replica by a failover, while the
//! connection stayed up) replaces the manager, so that the next call
//! connects again, resolving the host name again, and finds the new
//! primary behind it. A password
//! never reaches a [`StoreError`] or a `Debug` output: `describe` is the
//! URL redacted, and error texts are scrubbed of it.

use std::future::Future;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, ErrorKind, FromRedisValue, RedisError, Script, TlsCertificates};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::store::{Begin, BodySha, KeyState, Lease, Store, StoreError, Token};
use crate::core::idempotency::redact_url;
use crate::core::values::redact::Scrubber;
use crate::core::wire::DOCTOR_KEY_PREFIX;

/// The longest a call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest connecting and authenticating may take at the start.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How many keys one `EXISTS` counts.
const EXISTS_BATCH: usize = 1_000;

/// KEYS: done, lease. ARGV: sha, token, lease ms. `{1}` handled;
/// `{0, conflict}` acquired (or the token's own lease, extended);
/// `{2, pttl}` leased by another token.
const BEGIN_LUA: &str = r"
local done = redis.call('GET', KEYS[1])
if done and done == ARGV[1] then
  return {1}
end
local holder = redis.call('GET', KEYS[2])
if (not holder) or holder == ARGV[2] then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  if done then return {0, 1} end
  return {0, 0}
end
return {2, redis.call('PTTL', KEYS[2])}
";

/// KEYS: lease. ARGV: token, lease ms. 1 when renewed.
const RENEW_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// KEYS: lease. ARGV: token. 1 when released.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// KEYS: done, lease. ARGV: sha, keep ms, token. The mark set, unless
/// a mark of another body is there (a conflict's success never replaces
/// it); the lease deleted if ours.
const MARK_LUA: &str = r"
local done = redis.call('GET', KEYS[1])
if (not done) or done == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('DEL', KEYS[2])
end
return 1
";

/// The Redis store.
pub(super) struct RedisStore {
    describe: String,
    /// The URL's secrets, to scrub from error texts (never printed).
    secrets: Scrubber,
    /// `dlqctl:` + scope.
    prefix: Vec<u8>,
    /// Replaced after a `READONLY` answer.
    conn: RwLock<ConnectionManager>,
    client: Client,
    config: ConnectionManagerConfig,
    begin: Script,
    renew: Script,
    release: Script,
    mark: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("store", &self.describe)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` (and authenticates), answered by a `PING`.
    /// `ca_pem`: the CA a `rediss://` server's certificate chains to,
    /// instead of the system's roots.
    pub(super) async fn open(
        url: &str,
        scope: &[u8],
        ca_pem: Option<&[u8]>,
    ) -> Result<RedisStore, StoreError> {
        let describe = redact_url(url);
        let secrets = Scrubber::new(crate::core::values::redact::secrets(url));
        let refused = |e: RedisError| StoreError::Refused {
            store: describe.clone(),
            detail: secrets.scrub(&e.to_string()).into_owned(),
        };
        // What the URL alone says (no host, a negative database) is
        // refused at once: an `env:` URL is only read now.
        if let Err(why) = crate::urls::redis(url) {
            return Err(StoreError::Refused {
                store: describe,
                detail: format!("the URL cannot be used: {why}"),
            });
        }
        let tls = url.starts_with("rediss://") || url.starts_with("valkeys://");
        let client = match ca_pem {
            Some(ca) if tls => {
                let certs = TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.to_vec()),
                };
                Client::build_with_tls(url, certs)
            }
            _ => Client::open(url),
        }
        .map_err(refused)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CALL_TIMEOUT))
            .set_response_timeout(Some(CALL_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let connecting = ConnectionManager::new_with_config(client.clone(), config.clone());
        let conn = match tokio::time::timeout(OPEN_TIMEOUT, connecting).await {
            Err(_) => {
                return Err(StoreError::Unavailable {
                    store: describe,
                    detail: format!("no answer within {} s", OPEN_TIMEOUT.as_secs()),
                })
            }
            // The server answers, and has no such database: waiting
            // would not change that.
            Ok(Err(e)) if e.to_string().contains("refused to switch database") => {
                let db = client.get_connection_info().redis_settings().db();
                return Err(StoreError::Refused {
                    store: describe,
                    detail: format!(
                        "the server has no database {db} (the number after the port; \
                         a default server has 0 to 15): {}",
                        secrets.scrub(&e.to_string())
                    ),
                });
            }
            Ok(Err(e)) => return Err(error(&describe, &secrets, &e)),
            Ok(Ok(conn)) => conn,
        };
        let mut prefix = b"dlqctl:".to_vec();
        prefix.extend_from_slice(scope);
        let store = RedisStore {
            describe,
            secrets,
            prefix,
            conn: RwLock::new(conn),
            client,
            config,
            begin: Script::new(BEGIN_LUA),
            renew: Script::new(RENEW_LUA),
            release: Script::new(RELEASE_LUA),
            mark: Script::new(MARK_LUA),
        };
        // A server that wants a password and was given none answers
        // NOAUTH only now.
        store.ping().await?;
        Ok(store)
    }

    /// The connection (a handle: cheap to clone).
    fn conn(&self) -> ConnectionManager {
        self.conn
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A new manager, connecting on its first call: after `READONLY`,
    /// the old connection reaches a replica.
    fn reconnect(&self) {
        if let Ok(fresh) =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
        {
            *self.conn.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        }
    }

    fn redis_key(&self, kind: &str, key: &[u8]) -> Vec<u8> {
        redis_key(&self.prefix, kind, key)
    }

    /// `fut`, bounded by [`CALL_TIMEOUT`], its error made a [`StoreError`].
    async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(CALL_TIMEOUT, fut).await {
            Err(_) => Err(StoreError::Unavailable {
                store: self.describe.clone(),
                detail: format!("no answer within {} s", CALL_TIMEOUT.as_secs()),
            }),
            Ok(Err(e)) => {
                if e.code() == Some("READONLY") {
                    self.reconnect();
                }
                Err(error(&self.describe, &self.secrets, &e))
            }
            Ok(Ok(v)) => Ok(v),
        }
    }

    /// Runs `script` with `keys` and `args`, bounded.
    async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<T, StoreError> {
        let mut invocation = script.prepare_invoke();
        for k in keys {
            invocation.key(*k);
        }
        for a in args {
            invocation.arg(*a);
        }
        let mut conn = self.conn();
        self.bounded(async move { invocation.invoke_async(&mut conn).await })
            .await
    }

    fn unexpected(&self, what: String) -> StoreError {
        StoreError::Unavailable {
            store: self.describe.clone(),
            detail: format!("unexpected answer {what}"),
        }
    }
}

/// `PREFIX:KIND:KEY`, the key's bytes as they are.
fn redis_key(prefix: &[u8], kind: &str, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + kind.len() + key.len() + 2);
    k.extend_from_slice(prefix);
    k.push(b':');
    k.extend_from_slice(kind.as_bytes());
    k.push(b':');
    k.extend_from_slice(key);
    k
}

/// A length in ms as a `PX` argument (at least 1: 0 is refused).
fn px(ms: u64) -> Vec<u8> {
    ms.max(1).to_string().into_bytes()
}

/// A Redis error as a [`StoreError`]: a refused password, a refused
/// permission, a URL or TLS set-up that cannot work, or a certificate
/// not trusted are refusals; the rest (refused connection, timeout,
/// reset, a server loading its data) is unavailable. Its text scrubbed
/// of the password.
fn error(store: &str, secrets: &Scrubber, e: &RedisError) -> StoreError {
    let detail = secrets.scrub(&e.to_string()).into_owned();
    let refused = matches!(
        e.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig
    ) || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        || untrusted_certificate(e);
    let store = store.to_string();
    if refused {
        StoreError::Refused { store, detail }
    } else {
        StoreError::Unavailable { store, detail }
    }
}

/// Whether `e` comes from a server certificate rustls would not trust.
fn untrusted_certificate(e: &RedisError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        let tls = s.downcast_ref::<rustls::Error>().or_else(|| {
            s.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if matches!(tls, Some(rustls::Error::InvalidCertificate(_))) {
            return true;
        }
        source = s.source();
    }
    e.to_string().contains("invalid peer certificate")
}

impl Store for RedisStore {
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
        async move {
            let token = *token;
            let (done, lease) = (self.redis_key("done", key), self.redis_key("lease", key));
            let answer: Vec<i64> = self
                .run(
                    &self.begin,
                    &[&done[..], &lease[..]],
                    &[&body[..], &token[..], &px(lease_ms)[..]],
                )
                .await?;
            match answer[..] {
                [1] => Ok(Begin::Handled),
                [0, conflict] => Ok(Begin::Acquired {
                    lease: Lease {
                        key: key.to_vec(),
                        token,
                    },
                    conflict: conflict == 1,
                }),
                [2, pttl] => Ok(Begin::Leased {
                    remaining_ms: pttl.max(0) as u64,
                }),
                _ => Err(self.unexpected(format!("{answer:?} to begin"))),
            }
        }
        .boxed()
    }

    fn renew<'a>(
        &'a self,
        lease: &'a Lease,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        async move {
            let key = self.redis_key("lease", &lease.key);
            let renewed: i64 = self
                .run(
                    &self.renew,
                    &[&key[..]],
                    &[&lease.token[..], &px(lease_ms)[..]],
                )
                .await?;
            Ok(renewed == 1)
        }
        .boxed()
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            let key = self.redis_key("lease", &lease.key);
            let _: i64 = self
                .run(&self.release, &[&key[..]], &[&lease.token[..]])
                .await?;
            Ok(())
        }
        .boxed()
    }

    fn mark<'a>(
        &'a self,
        lease: &'a Lease,
        body: &'a BodySha,
        keep_ms: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            let done = self.redis_key("done", &lease.key);
            let key = self.redis_key("lease", &lease.key);
            let keep = px(keep_ms);
            let args: [&[u8]; 3] = [&body[..], &keep[..], &lease.token[..]];
            let _: i64 = self.run(&self.mark, &[&done[..], &key[..]], &args).await?;
            Ok(())
        }
        .boxed()
    }

    fn count_marked<'a>(&'a self, keys: &'a [Vec<u8>]) -> BoxFuture<'a, Result<usize, StoreError>> {
        async move {
            let mut marked = 0;
            for chunk in keys.chunks(EXISTS_BATCH) {
                let mut cmd = ::redis::cmd("EXISTS");
                for key in chunk {
                    cmd.arg(self.redis_key("done", key));
                }
                let mut conn = self.conn();
                let n: usize = self
                    .bounded(async move { cmd.query_async(&mut conn).await })
                    .await?;
                marked += n;
            }
            Ok(marked)
        }
        .boxed()
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            let mut conn = self.conn();
            let answer: String = self
                .bounded(async move { ::redis::cmd("PING").query_async(&mut conn).await })
                .await?;
            if answer == "PONG" {
                Ok(())
            } else {
                Err(self.unexpected(format!("{answer:?} to PING")))
            }
        }
        .boxed()
    }

    fn check(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            // Under the store's own prefix (`dlqctl:SCOPE:`), like every
            // key it writes: a user an ACL limits to `~dlqctl:*` passes.
            let mut key = self.prefix.clone();
            key.push(b':');
            key.extend_from_slice(
                format!("{DOCTOR_KEY_PREFIX}{:032x}", rand::random::<u128>()).as_bytes(),
            );
            let value = format!("{:032x}", rand::random::<u128>());
            let mut conn = self.conn();
            let read: Option<String> = self
                .bounded(async move {
                    ::redis::cmd("SET")
                        .arg(&key)
                        .arg(&value)
                        .arg("PX")
                        .arg(60_000)
                        .exec_async(&mut conn)
                        .await?;
                    let read: Option<String> =
                        ::redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
                    ::redis::cmd("DEL").arg(&key).exec_async(&mut conn).await?;
                    Ok(read.filter(|r| *r == value))
                })
                .await?;
            match read {
                Some(_) => Ok(()),
                None => Err(self.unexpected("(a key written was not read back)".into())),
            }
        }
        .boxed()
    }

    fn look<'a>(&'a self, key: &'a [u8]) -> BoxFuture<'a, Result<KeyState, StoreError>> {
        async move {
            let (done, lease) = (self.redis_key("done", key), self.redis_key("lease", key));
            let mut conn = self.conn();
            let (handled, leased): (bool, bool) = self
                .bounded(async move {
                    ::redis::pipe()
                        .exists(done)
                        .exists(lease)
                        .query_async(&mut conn)
                        .await
                })
                .await?;
            Ok(match (handled, leased) {
                (true, _) => KeyState::Handled,
                (false, true) => KeyState::Leased,
                (false, false) => KeyState::Free,
            })
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_scrubbed_of_the_password_as_written_and_decoded() {
        let text = "failed for p%40ss and for p@ss";
        let secrets = Scrubber::new(crate::core::values::redact::secrets("redis://:p%40ss@h"));
        assert_eq!(secrets.scrub(text), "failed for *** and for ***");
        assert_eq!(Scrubber::default().scrub(text), text);
    }

    #[test]
    fn keys_are_prefixed_scoped_and_binary() {
        let key = redis_key(b"dlqctl:1:/:6:orders", "lease", b"\xff\x00id");
        assert_eq!(key, b"dlqctl:1:/:6:orders:lease:\xff\x00id".to_vec());
    }

    #[test]
    fn a_px_is_never_zero() {
        assert_eq!(px(0), b"1".to_vec());
        assert_eq!(px(30_000), b"30000".to_vec());
    }
}
