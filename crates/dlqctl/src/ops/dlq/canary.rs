//! The idempotency store's part in a replay or redrive to a pipeline's
//! main queue (docs/dlq.md, "Canaries on a pipeline with idempotent
//! handling"). A canary proves the dependency only through a handler run:
//! a copy whose key is already marked handled is acked as a duplicate,
//! and one whose key is leased (a handler runs, or its outcome is in
//! doubt) is deferred; neither runs a handler, and neither comes back to
//! the DLQ. So, when the pipeline has `idempotency`:
//! - a message whose copy's key is marked or leased, or is the key of a
//!   canary chosen already, is not taken as a canary: another is;
//! - after the wait, a canary counts as proof only when it did not come
//!   back and its key is now marked handled (by a handler run of this
//!   replay: it was free when chosen);
//! - a run that finds no message able to be a canary stops, saying so
//!   ([`Stop::NoCanary`](crate::core::dlq::run::Stop::NoCanary));
//! - the messages moved whose key was already marked handled are counted
//!   ([`ReplayReport::already_handled`](super::replay::ReplayReport::already_handled)).
//!
//! Reads only ([`Store::look`]): nothing is taken or changed in the store.

use crate::core::idempotency::{key_of, KeySource};
use crate::core::topology::Pipeline;
use crate::error::Result;
use crate::idempotency::{KeyState, Store};
use std::sync::Arc;

/// A pipeline's idempotency store, opened for a DLQ command.
#[derive(Clone)]
pub struct StoreGuard {
    store: Arc<dyn Store>,
    key: KeySource,
    /// The pipeline's main queue: only copies sent there are looked up.
    queue: String,
}

impl std::fmt::Debug for StoreGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreGuard")
            .field("store", &self.store.describe())
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl StoreGuard {
    /// The guard of `pipeline` (which has `idempotency`, read with `key`)
    /// over `store`, already open.
    pub fn new(store: Arc<dyn Store>, key: KeySource, pipeline: &Pipeline) -> StoreGuard {
        StoreGuard {
            store,
            key,
            queue: pipeline.name.clone(),
        }
    }

    /// Opens the store of `pipeline` on `vhost` without creating anything
    /// (`store` overrides the topology's, as `dlqctl work
    /// --idempotency-store` does); `None` for a pipeline without
    /// `idempotency`.
    pub async fn open(
        pipeline: &Pipeline,
        vhost: &str,
        store: Option<&crate::core::idempotency::StoreSpec>,
    ) -> Result<Option<StoreGuard>> {
        let Some(idem) = &pipeline.idempotency else {
            return Ok(None);
        };
        let spec = store.unwrap_or(&idem.store);
        let url = crate::idempotency::resolve(spec, &pipeline.name, &|k| std::env::var(k).ok())?;
        let scope = crate::core::idempotency::scope(vhost, &pipeline.name);
        let opened = crate::idempotency::open(&url, &scope, crate::idempotency::Create::No).await?;
        Ok(Some(StoreGuard::new(opened, idem.key.clone(), pipeline)))
    }

    /// The store, as logs show it.
    pub fn describe(&self) -> &str {
        self.store.describe()
    }

    /// Whether copies sent to `to` are looked up (the pipeline's main
    /// queue: another queue's worker has another store, or none).
    pub(crate) fn applies_to(&self, to: &str) -> bool {
        self.queue == to
    }

    /// The key a copy with `props` and `body` has (`None`: no key, it
    /// runs unguarded).
    pub(crate) fn key(&self, props: &lapin::BasicProperties, body: &[u8]) -> Option<Vec<u8>> {
        key_of(&self.key, props, body)
    }

    /// What the store holds for `key`.
    pub(crate) async fn look(&self, key: &[u8]) -> Result<KeyState> {
        Ok(self.store.look(key).await?)
    }

    /// How many of the canaries proved the dependency by their key: those
    /// whose key is marked handled now, plus those without a key (they
    /// ran unguarded: not coming back is their proof, as without a store).
    pub(crate) async fn proven(&self, probes: &Probes) -> Result<u64> {
        let mut n = probes.keyless;
        for key in &probes.keys {
            if self.look(key).await? == KeyState::Handled {
                n += 1;
            }
        }
        Ok(n)
    }
}

/// What a canary pass found: the keys of the canaries it sent, and the
/// messages that could not be canaries.
#[derive(Debug, Default)]
pub(crate) struct Probes {
    /// The canaries' keys, free when they were chosen.
    pub(crate) keys: Vec<Vec<u8>>,
    /// Canaries without a key.
    pub(crate) keyless: u64,
    /// Selected messages passed over: their key was marked, leased, or
    /// that of a canary already chosen.
    pub(crate) passed_over: u64,
}

impl Probes {
    /// Whether a copy with `key` (found `state` in the store) can be a
    /// canary; if so it is recorded as one.
    pub(crate) fn take(&mut self, key: Option<Vec<u8>>, state: KeyState) -> bool {
        let Some(key) = key else {
            self.keyless += 1;
            return true;
        };
        if state != KeyState::Free || self.keys.contains(&key) {
            self.passed_over += 1;
            return false;
        }
        self.keys.push(key);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_free_key_not_chosen_yet_can_be_a_canary() {
        let mut p = Probes::default();
        assert!(p.take(Some(b"a".to_vec()), KeyState::Free));
        assert!(!p.take(Some(b"b".to_vec()), KeyState::Handled));
        assert!(!p.take(Some(b"c".to_vec()), KeyState::Leased));
        // The same key again: its copy would be a duplicate of the first.
        assert!(!p.take(Some(b"a".to_vec()), KeyState::Free));
        assert!(p.take(None, KeyState::Free));
        assert_eq!(p.keys, vec![b"a".to_vec()]);
        assert_eq!((p.keyless, p.passed_over), (1, 3));
    }
}
