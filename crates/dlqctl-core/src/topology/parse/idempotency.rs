//! `idempotency`: a pipeline's (or `defaults`') idempotent handling, read
//! key by key, so that a pipeline's keys apply over the defaults' ones;
//! `true` or `{}` takes the defaults, `false` turns it off. Its keys:
//! `key`, `store`, `keep`, `on_conflict`.

use crate::idempotency::{default_keep_ms, Idempotency, KeySource, OnConflict, StoreSpec};
use crate::topology::yaml::{Node, Value};

use super::read::{at, At, Cx};
use super::redrive::empty_block;

/// The keys of `idempotency`.
const KEYS: [&str; 4] = ["key", "store", "keep", "on_conflict"];

/// `idempotency` as written: off, or on with the keys given.
#[derive(Debug, Clone, Default)]
pub(super) struct RawIdempotency {
    /// `false`.
    pub(super) off: bool,
    pub(super) key: Option<At<KeySource>>,
    pub(super) store: Option<At<StoreSpec>>,
    pub(super) keep: Option<At<u64>>,
    pub(super) on_conflict: Option<At<OnConflict>>,
}

impl RawIdempotency {
    /// A pipeline's `own` block over the `defaults`' one: `None` when off
    /// or given by neither. A `keep` given by neither follows the
    /// pipeline's DLQ retention `dlq_ttl_ms` ([`default_keep_ms`]).
    pub(super) fn merged(
        own: &Option<At<RawIdempotency>>,
        defaults: &Option<At<RawIdempotency>>,
        dlq_ttl_ms: Option<u64>,
    ) -> Option<Idempotency> {
        let (own_on, def_on) = (on(own), on(defaults));
        // A pipeline's `false` turns off the defaults' block.
        if own.as_ref().is_some_and(|o| o.v.off) || (own_on.is_none() && def_on.is_none()) {
            return None;
        }
        let mut i = Idempotency {
            keep_ms: default_keep_ms(dlq_ttl_ms),
            ..Idempotency::default()
        };
        if let Some(k) = own_on
            .and_then(|r| r.key.clone())
            .or_else(|| def_on.and_then(|r| r.key.clone()))
        {
            i.key = k.v;
        }
        if let Some(s) = own_on
            .and_then(|r| r.store.clone())
            .or_else(|| def_on.and_then(|r| r.store.clone()))
        {
            i.store = s.v;
        }
        if let Some(k) = own_on
            .and_then(|r| r.keep.clone())
            .or_else(|| def_on.and_then(|r| r.keep.clone()))
        {
            i.keep_ms = k.v;
        }
        if let Some(c) = own_on
            .and_then(|r| r.on_conflict.clone())
            .or_else(|| def_on.and_then(|r| r.on_conflict.clone()))
        {
            i.on_conflict = c.v;
        }
        Some(i)
    }
}

/// The block when given and on.
fn on(r: &Option<At<RawIdempotency>>) -> Option<&RawIdempotency> {
    r.as_ref().filter(|r| !r.v.off).map(|r| &r.v)
}

impl Cx {
    /// `idempotency`: `None` when invalid (reported). `null`, which is
    /// also what an empty `idempotency:` line reads as, is invalid: it
    /// does not say whether it is meant on or off.
    pub(super) fn idempotency(&mut self, n: &Node) -> Option<RawIdempotency> {
        match &n.value {
            Value::Bool(false) => {
                return Some(RawIdempotency {
                    off: true,
                    ..RawIdempotency::default()
                })
            }
            Value::Bool(true) => return Some(RawIdempotency::default()),
            Value::Null => {
                self.err(n.pos, empty_block("idempotency"));
                return None;
            }
            _ => {}
        }
        let m = self.map(n, "idempotency", &KEYS)?;
        let mut r = RawIdempotency::default();
        let mut ok = true;
        for (k, v) in m {
            match k.name.as_str() {
                "key" => match self
                    .string(v, "idempotency.key")
                    .map(|t| KeySource::parse(&t))
                {
                    Some(Ok(key)) => r.key = Some(at(v.pos, key)),
                    Some(Err(e)) => {
                        self.err(v.pos, e);
                        ok = false;
                    }
                    None => ok = false,
                },
                "store" => match self
                    .string(v, "idempotency.store")
                    .map(|t| StoreSpec::parse(&t))
                {
                    Some(Ok(store)) => {
                        if let StoreSpec::Redis(url) = &store {
                            ok &=
                                self.url_usable(v.pos, url, "idempotency.store", |c, u| c.store(u));
                        }
                        r.store = Some(at(v.pos, store));
                    }
                    Some(Err(e)) => {
                        self.err(v.pos, e);
                        ok = false;
                    }
                    None => ok = false,
                },
                "on_conflict" => match self
                    .string(v, "idempotency.on_conflict")
                    .map(|t| OnConflict::parse(&t))
                {
                    Some(Ok(c)) => r.on_conflict = Some(at(v.pos, c)),
                    Some(Err(e)) => {
                        self.err(v.pos, e);
                        ok = false;
                    }
                    None => ok = false,
                },
                "keep" => match self.duration(v, "idempotency.keep") {
                    Some(ms) => r.keep = Some(at(v.pos, ms)),
                    None => ok = false,
                },
                _ => {}
            }
        }
        ok.then_some(r)
    }
}
