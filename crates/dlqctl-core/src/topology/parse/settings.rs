//! The settings a pipeline and `defaults` share: `queue_type`, `retry`
//! (delays or a backoff), `dead_letter`, `delivery_limit`,
//! `circuit_breaker`, `arguments`, as written (applied in `pipeline`).

use crate::topology::model::*;
use crate::topology::yaml::{Key, Node, Value};
use crate::values::duration::MAX_MILLIS;

use super::idempotency::RawIdempotency;
use super::read::{at, At, Cx};

#[derive(Debug, Clone, Default)]
pub(super) struct RawRetry {
    pub(super) delays: Option<At<Vec<u64>>>,
    pub(super) backoff: Option<At<RawBackoff>>,
    pub(super) max_attempts: Option<At<u32>>,
    pub(super) jitter: Option<At<f64>>,
}

#[derive(Debug, Clone)]
pub(super) struct RawBackoff {
    pub(super) base: u64,
    pub(super) factor: f64,
    pub(super) max: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct RawDeadLetter {
    pub(super) queue: Option<At<String>>,
    pub(super) ttl: Option<At<u64>>,
    pub(super) max_length: Option<At<i64>>,
    /// `redrive`: `Some(None)` when turned off with `false`.
    pub(super) redrive: Option<At<Option<Redrive>>>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct RawSettings {
    pub(super) queue_type: Option<At<QueueType>>,
    pub(super) retry: RawRetry,
    pub(super) dead_letter: RawDeadLetter,
    pub(super) delivery_limit: Option<At<i64>>,
    /// `circuit_breaker`: `Some(None)` when turned off with `false`.
    pub(super) circuit_breaker: Option<At<Option<CircuitBreaker>>>,
    pub(super) idempotency: Option<At<RawIdempotency>>,
    pub(super) arguments: Vec<(Key, Node)>,
}

pub(super) const SETTINGS_KEYS: [&str; 7] = [
    "queue_type",
    "retry",
    "dead_letter",
    "delivery_limit",
    "circuit_breaker",
    "idempotency",
    "arguments",
];

impl Cx {
    pub(super) fn settings(
        &mut self,
        n: &Node,
        what: &str,
        allowed: &[&str],
        is_defaults: bool,
    ) -> RawSettings {
        let mut s = RawSettings::default();
        let Some(m) = self.map(n, what, allowed) else {
            return s;
        };
        for (k, v) in m {
            match k.name.as_str() {
                "queue_type" => {
                    if let Some(t) = self.string(v, "queue_type") {
                        match t.as_str() {
                            "quorum" => s.queue_type = Some(at(v.pos, QueueType::Quorum)),
                            "classic" => s.queue_type = Some(at(v.pos, QueueType::Classic)),
                            _ => self.err(
                                v.pos,
                                format!("queue_type must be `quorum` or `classic`, not `{t}`"),
                            ),
                        }
                    }
                }
                "retry" => s.retry = self.retry(v),
                "dead_letter" => s.dead_letter = self.dead_letter(v, is_defaults),
                "delivery_limit" => {
                    s.delivery_limit = self
                        .int_in(v, "delivery_limit", 1, i32::MAX as i64)
                        .map(|i| at(v.pos, i))
                }
                "circuit_breaker" => {
                    s.circuit_breaker = self.circuit_breaker(v).map(|c| at(v.pos, c))
                }
                "idempotency" => s.idempotency = self.idempotency(v).map(|i| at(v.pos, i)),
                "arguments" => match &v.value {
                    Value::Map(m) => s.arguments = m.clone(),
                    Value::Null => {}
                    other => self.err(
                        v.pos,
                        format!("arguments must be a mapping, not {}", other.kind()),
                    ),
                },
                _ => {}
            }
        }
        s
    }

    pub(super) fn retry(&mut self, n: &Node) -> RawRetry {
        let mut r = RawRetry::default();
        let Some(m) = self.map(n, "retry", &["delays", "backoff", "max_attempts", "jitter"]) else {
            return r;
        };
        let mut backoff = None;
        for (k, v) in m {
            match k.name.as_str() {
                "delays" => match &v.value {
                    Value::Seq(items) => {
                        if items.is_empty() {
                            self.err(v.pos, "retry.delays is empty: give at least one delay, e.g. [1s, 10s, 1m]");
                        }
                        let d: Vec<u64> = items
                            .iter()
                            .filter_map(|i| self.duration(i, "a retry delay"))
                            .collect();
                        if d.len() == items.len() && !d.is_empty() {
                            r.delays = Some(at(v.pos, d));
                        }
                    }
                    other => self.err(
                        v.pos,
                        format!(
                            "retry.delays must be a list of durations, not {}",
                            other.kind()
                        ),
                    ),
                },
                "backoff" => backoff = self.backoff(v).map(|b| at(v.pos, b)),
                "max_attempts" => {
                    r.max_attempts = self
                        .int_in(v, "retry.max_attempts", 1, i32::MAX as i64)
                        .map(|i| at(v.pos, i as u32))
                }
                "jitter" => {
                    if let Some(j) = self.number(v, "retry.jitter") {
                        if (0.0..=0.5).contains(&j) {
                            r.jitter = Some(at(v.pos, j));
                        } else {
                            self.err(
                                v.pos,
                                format!("retry.jitter must be between 0 and 0.5, not {j}"),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        let has_delays = m.iter().any(|(k, _)| k.name == "delays");
        if let Some(bk) = m.iter().find(|(k, _)| k.name == "backoff").map(|(k, _)| k) {
            if has_delays {
                self.err(
                    bk.pos,
                    "give either retry.delays or retry.backoff, not both",
                );
            }
        }
        r.backoff = backoff;
        r
    }

    pub(super) fn backoff(&mut self, n: &Node) -> Option<RawBackoff> {
        let m = self.map(n, "retry.backoff", &["base", "factor", "max"])?;
        let mut base = None;
        let mut factor = Some(2.0);
        let mut max = None;
        let mut ok = true;
        for (k, v) in m {
            match k.name.as_str() {
                "base" => {
                    base = self.duration(v, "retry.backoff.base");
                    ok &= base.is_some();
                }
                "factor" => {
                    factor = self.number(v, "retry.backoff.factor");
                    if let Some(f) = factor {
                        let decimals = format!("{f}")
                            .split_once('.')
                            .map_or(0, |(_, frac)| frac.len());
                        if f < 1.0 {
                            self.err(
                                v.pos,
                                format!("retry.backoff.factor must be at least 1, not {f}"),
                            );
                            factor = None;
                        } else if decimals > 9 || format!("{f}").contains('e') {
                            self.err(
                                v.pos,
                                format!(
                                    "retry.backoff.factor {f} has more than 9 decimal places; \
                                     write it with at most 9 (e.g. 1.5, 2.25)"
                                ),
                            );
                            factor = None;
                        }
                    }
                    ok &= factor.is_some();
                }
                "max" => {
                    max = self.duration(v, "retry.backoff.max");
                    ok &= max.is_some();
                }
                _ => {}
            }
        }
        if !m.iter().any(|(k, _)| k.name == "base") {
            self.err(
                n.pos,
                "retry.backoff needs `base` (the first delay, e.g. 1s)",
            );
            return None;
        }
        if let (Some(b), Some(mx)) = (base, max) {
            if mx < b {
                let pos = m
                    .iter()
                    .find(|(k, _)| k.name == "max")
                    .map_or(n.pos, |(_, v)| v.pos);
                self.err(
                    pos,
                    format!(
                        "retry.backoff.max ({}) is below base ({}): every retry would wait max; \
                         raise max or lower base",
                        crate::values::duration::tier_name(mx),
                        crate::values::duration::tier_name(b)
                    ),
                );
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        Some(RawBackoff {
            base: base?,
            factor: factor?,
            max,
        })
    }

    pub(super) fn dead_letter(&mut self, n: &Node, is_defaults: bool) -> RawDeadLetter {
        let mut d = RawDeadLetter::default();
        let Some(m) = self.map(n, "dead_letter", &["queue", "ttl", "max_length", "redrive"]) else {
            return d;
        };
        for (k, v) in m {
            match k.name.as_str() {
                "queue" => {
                    if is_defaults {
                        self.err(k.pos, "dead_letter.queue names one pipeline's DLQ: set it per pipeline, not in defaults");
                    } else if let Some(q) = self.string(v, "dead_letter.queue") {
                        d.queue = Some(at(v.pos, q));
                    }
                }
                "ttl" => d.ttl = self.duration(v, "dead_letter.ttl").map(|t| at(v.pos, t)),
                "max_length" => {
                    d.max_length = self
                        .int_in(v, "dead_letter.max_length", 1, i64::MAX)
                        .map(|i| at(v.pos, i))
                }
                "redrive" => d.redrive = self.redrive(v).map(|r| at(v.pos, r)),
                _ => {}
            }
        }
        d
    }

    /// `circuit_breaker`: `Some(None)` when turned off (`false`),
    /// `Some(Some(settings))` when on (`true`, `{}` or its keys); `null`
    /// (an empty line) is invalid, as for `redrive` and `idempotency`.
    pub(super) fn circuit_breaker(&mut self, n: &Node) -> Option<Option<CircuitBreaker>> {
        match &n.value {
            Value::Bool(false) => return Some(None),
            Value::Bool(true) => return Some(Some(CircuitBreaker::default())),
            Value::Null => {
                self.err(n.pos, super::redrive::empty_block("circuit_breaker"));
                return None;
            }
            _ => {}
        }
        self.circuit_breaker_keys(n).map(Some)
    }

    fn circuit_breaker_keys(&mut self, n: &Node) -> Option<CircuitBreaker> {
        let m = self.map(
            n,
            "circuit_breaker",
            &[
                "failure_rate",
                "window",
                "min_calls",
                "open_for",
                "half_open_calls",
            ],
        )?;
        let mut cb = CircuitBreaker::default();
        let mut ok = true;
        for (k, v) in m {
            match k.name.as_str() {
                "failure_rate" => match self.number(v, "circuit_breaker.failure_rate") {
                    Some(r) if r > 0.0 && r <= 1.0 => cb.failure_rate = r,
                    Some(r) => {
                        self.err(v.pos, format!("circuit_breaker.failure_rate must be above 0 and at most 1, not {r}"));
                        ok = false;
                    }
                    None => ok = false,
                },
                "window" => match self.duration(v, "circuit_breaker.window") {
                    Some(w) => cb.window = w,
                    None => ok = false,
                },
                "min_calls" => {
                    match self.int_in(v, "circuit_breaker.min_calls", 1, u32::MAX as i64) {
                        Some(c) => cb.min_calls = c as u32,
                        None => ok = false,
                    }
                }
                "open_for" => match self.duration(v, "circuit_breaker.open_for") {
                    Some(o) => cb.open_for = o,
                    None => ok = false,
                },
                "half_open_calls" => {
                    match self.int_in(v, "circuit_breaker.half_open_calls", 1, 1000) {
                        Some(c) => cb.half_open_calls = c as u32,
                        None => ok = false,
                    }
                }
                _ => {}
            }
        }
        ok.then_some(cb)
    }
}

/// Expands delay(k) = `min(floor(base × factor^(k-1)), max)` for
/// k = 1 … max_attempts−1, one entry per retry (retry k waits entry k; the
/// tiers are the distinct values). The factor is taken as the decimal it is
/// written as (`2.3` is 23/10, not the nearest binary float) and the product
/// is computed in fixed point with 18 decimal places, so `1s × 2.3²` is
/// 5290ms, not 5289. The list stops once the delay reaches `max` (or the
/// factor is 1): later retries repeat its last entry. `Err(k)` when retry k
/// exceeds the broker's bound without a `max`; `Err(0)` when the list would
/// pass [`MAX_BACKOFF_RETRIES`] entries (a factor just above 1 with a huge
/// `max_attempts`).
pub(super) fn backoff_delays(b: &RawBackoff, max_attempts: u32) -> Result<Vec<u64>, u32> {
    const SCALE: u128 = 1_000_000_000_000_000_000; // 10^18
    let retries = max_attempts.saturating_sub(1).max(1);
    let cap = b.max.unwrap_or(MAX_MILLIS);
    let (num, den) = decimal_ratio(b.factor);
    // value = base × factor^(k-1), in units of 10^-18 ms.
    let mut value: Option<u128> = Some(u128::from(b.base) * SCALE);
    let mut out: Vec<u64> = Vec::new();
    for k in 1..=retries {
        let whole = value.map(|v| v / SCALE);
        let d = match whole {
            Some(w) if w < u128::from(cap) => w as u64,
            _ => {
                if b.max.is_none() && whole.is_none_or(|w| w > u128::from(MAX_MILLIS)) {
                    return Err(k);
                }
                cap
            }
        };
        out.push(d);
        if d == cap || num == den {
            break;
        }
        if out.len() >= MAX_BACKOFF_RETRIES {
            return Err(0);
        }
        value = value.and_then(|v| v.checked_mul(num)).map(|v| v / den);
    }
    Ok(out)
}

/// The most retries a backoff may expand to before its delays stop growing.
pub(super) const MAX_BACKOFF_RETRIES: usize = 1_000_000;

/// The factor as the decimal fraction it was written as: its shortest
/// decimal form (Rust prints floats as the shortest string that reads back
/// the same), at most 9 decimal places.
fn decimal_ratio(factor: f64) -> (u128, u128) {
    let text = format!("{factor}");
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let frac = &frac[..frac.len().min(9)];
    let den = 10u128.pow(frac.len() as u32);
    let num = format!("{int}{frac}")
        .parse::<u128>()
        .unwrap_or(u128::MAX / 2);
    (num, den)
}
