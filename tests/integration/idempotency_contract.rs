//! The lease contract of every idempotency store (the `Store` trait's
//! documentation): one suite of cases, run against each store as it is
//! opened for a worker. A new store adds one test here, calling
//! [`contract`].
//!
//! The cases: a lease is held against another token; the same token's
//! `begin` recognises its own lease (a begin that committed after the
//! worker stopped waiting is harmless); only the holder renews,
//! releases or gives it up by marking; a lease renewed to a longer time
//! (in doubt) is held that long and then marked (a late success) or
//! released (a late failure); a lease expires by the store's clock, and
//! its old holder then touches nothing of the next one's; a lease of the
//! guard's floor for the store's call bound, renewed on its period, is
//! never lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlqctl::idempotency::{open, Begin, BodySha, Create, Lease, Store, StoreUrl, Token};

use crate::support::redis::RedisServer;
use crate::support::Scratch;

const BODY: BodySha = [1; 32];
const OTHER: BodySha = [2; 32];

fn scope() -> Vec<u8> {
    dlqctl::core::idempotency::scope("/", "contract")
}

fn token() -> Token {
    rand::random()
}

fn acquired(begin: Begin, what: &str) -> Lease {
    match begin {
        Begin::Acquired { lease, .. } => lease,
        other => panic!("{what}: expected Acquired, got {other:?}"),
    }
}

fn leased(begin: Begin, what: &str) -> u64 {
    match begin {
        Begin::Leased { remaining_ms } => remaining_ms,
        other => panic!("{what}: expected Leased, got {other:?}"),
    }
}

/// Every case of the contract, against `s`, each on keys of its own.
pub async fn contract(s: Arc<dyn Store>) {
    let run = format!("{:08x}", rand::random::<u32>());
    let key = |case: &str| format!("{run}-{case}").into_bytes();
    held_against_another_token(&*s, &key("held")).await;
    the_same_token_recognises_its_own_lease(&*s, &key("own")).await;
    only_the_holder_renews_releases_or_marks(&*s, &key("holder")).await;
    in_doubt_then_a_late_success_or_failure(&*s, &key("doubt-ok"), &key("doubt-failed")).await;
    expiry_by_the_store_clock(&*s, &key("expiry")).await;
}

async fn held_against_another_token(s: &dyn Store, key: &[u8]) {
    let lease = acquired(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        "first",
    );
    let left = leased(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        "second",
    );
    assert!((25_000..=30_000).contains(&left), "{left}");
    // Another body is no way around a lease.
    leased(
        s.begin(key, &OTHER, &token(), 30_000).await.unwrap(),
        "other body",
    );
    s.release(&lease).await.unwrap();
    acquired(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        "released",
    );
}

async fn the_same_token_recognises_its_own_lease(s: &dyn Store, key: &[u8]) {
    let mine = token();
    let lease = acquired(s.begin(key, &BODY, &mine, 5_000).await.unwrap(), "first");
    // The same delivery's begin again (its first answer lost): its own
    // lease, extended to the new length.
    let again = acquired(s.begin(key, &BODY, &mine, 60_000).await.unwrap(), "again");
    assert_eq!(again, lease);
    let left = leased(s.begin(key, &BODY, &token(), 1).await.unwrap(), "other");
    assert!(left > 50_000, "extended by the same token's begin: {left}");
    // And releases it.
    s.release(&lease).await.unwrap();
    acquired(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        "released",
    );
}

async fn only_the_holder_renews_releases_or_marks(s: &dyn Store, key: &[u8]) {
    let lease = acquired(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        "first",
    );
    let thief = Lease {
        key: key.to_vec(),
        token: token(),
    };
    assert!(!s.renew(&thief, 90_000).await.unwrap(), "a stranger renews");
    s.release(&thief).await.unwrap();
    leased(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        "after a stranger's release",
    );
    assert!(s.renew(&lease, 90_000).await.unwrap());
    let left = leased(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        "renewed",
    );
    assert!(left > 80_000, "renewed: {left}");
    // The mark gives the lease up: another body now runs (a conflict).
    s.mark(&lease, &BODY, 60_000).await.unwrap();
    assert_eq!(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        Begin::Handled
    );
    match s.begin(key, &OTHER, &token(), 30_000).await.unwrap() {
        Begin::Acquired { conflict: true, .. } => {}
        other => panic!("another body after the mark: {other:?}"),
    }
    assert_eq!(s.count_marked(&[key.to_vec()]).await.unwrap(), 1);
}

async fn in_doubt_then_a_late_success_or_failure(s: &dyn Store, ok: &[u8], failed: &[u8]) {
    for key in [ok, failed] {
        let lease = acquired(s.begin(key, &BODY, &token(), 10_000).await.unwrap(), "run");
        // The run timed out, its outcome unknown: held for the in-doubt
        // time, against every other delivery of the key.
        assert!(s.renew(&lease, 600_000).await.unwrap(), "in doubt");
        let left = leased(
            s.begin(key, &BODY, &token(), 10_000).await.unwrap(),
            "in doubt",
        );
        assert!(left > 590_000, "in doubt: {left}");
        if key == ok {
            s.mark(&lease, &BODY, 60_000).await.unwrap();
            assert_eq!(
                s.begin(key, &BODY, &token(), 10_000).await.unwrap(),
                Begin::Handled,
                "a late success marks"
            );
        } else {
            s.release(&lease).await.unwrap();
            acquired(
                s.begin(key, &BODY, &token(), 10_000).await.unwrap(),
                "a late failure releases",
            );
        }
    }
}

async fn expiry_by_the_store_clock(s: &dyn Store, key: &[u8]) {
    let started = Instant::now();
    let old = acquired(s.begin(key, &BODY, &token(), 400).await.unwrap(), "short");
    // Held until it expires, then anybody's: polled, never assumed.
    let next = loop {
        match s.begin(key, &BODY, &token(), 30_000).await.unwrap() {
            Begin::Acquired { lease, .. } => break lease,
            Begin::Leased { .. } => {
                assert!(started.elapsed() < Duration::from_secs(10), "never expired");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Begin::Handled => panic!("handled without a mark"),
        }
    };
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "taken after {:?}, before its expiry",
        started.elapsed()
    );
    // The old holder touches nothing of the new one's lease.
    assert!(
        !s.renew(&old, 90_000).await.unwrap(),
        "expired: no longer ours"
    );
    s.release(&old).await.unwrap();
    leased(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        "the new holder's",
    );
    s.release(&next).await.unwrap();
    // A mark expires too.
    let lease = acquired(
        s.begin(key, &BODY, &token(), 30_000).await.unwrap(),
        "to mark",
    );
    s.mark(&lease, &BODY, 300).await.unwrap();
    let marked = Instant::now();
    loop {
        match s.begin(key, &BODY, &token(), 30_000).await.unwrap() {
            Begin::Handled => {
                assert!(
                    marked.elapsed() < Duration::from_secs(10),
                    "the mark never expired"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Begin::Acquired { conflict, .. } => {
                assert!(!conflict, "an expired mark is no conflict");
                break;
            }
            Begin::Leased { .. } => panic!("leased by nobody"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_the_lease_contract() {
    let dir = Scratch::new();
    let url = StoreUrl::Sqlite(dir.path().join("contract.db"));
    contract(open(&url, &scope(), Create::Yes).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_the_lease_contract() {
    let server = RedisServer::start();
    let url = StoreUrl::Redis(server.url());
    contract(open(&url, &scope(), Create::Yes).await.unwrap()).await;
}
