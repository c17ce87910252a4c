//! Jitter: the per-message `expiration` of a retry copy.

use super::decision::{clamp_jitter, floor_ms};

/// The per-message `expiration` of a copy to tier `tier_ms`:
/// floor(d × (1 − jitter × u)) as a decimal integer string.
///
/// `u` is the caller's uniform random number, clamped into [0, 1) (NaN as
/// 0); `jitter` is clamped into 0..=1. The result is never fractional, never
/// "0" and never above the tier. `None` when jitter is 0 (or NaN, or
/// negative): the queue's TTL alone applies. `None` too for a tier of 0 ms,
/// which no valid topology has.
pub fn jitter_expiration(tier_ms: u64, jitter: f64, u: f64) -> Option<String> {
    let jitter = clamp_jitter(jitter);
    if jitter == 0.0 || tier_ms == 0 {
        return None;
    }
    let below_one = f64::from_bits(1.0_f64.to_bits() - 1);
    let u = if u.is_nan() {
        0.0
    } else {
        u.clamp(0.0, below_one)
    };
    let ms = floor_ms(tier_ms as f64 * (1.0 - jitter * u)).clamp(1, tier_ms);
    Some(ms.to_string())
}
