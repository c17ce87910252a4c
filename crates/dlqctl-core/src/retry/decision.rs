//! The decision after a handler run: ack, retry to a tier, dead-letter.

use std::time::Duration;

use crate::handling::outcome::Outcome;
use crate::topology::RetryPolicy;

/// What the worker does with a delivery after a handler run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Acknowledge: done.
    Ack,
    /// Publish a copy to the retry tier of this delay, then ack.
    Retry {
        /// The tier (one of the policy's delays), in ms.
        delay_ms: u64,
    },
    /// Publish a copy to the dead-letter exchange, then ack.
    DeadLetter {
        /// Why.
        reason: DeadLetterReason,
    },
}

/// Why a message was dead-lettered (the `dlqctl-reason` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterReason {
    /// The handler said the message can never succeed.
    Permanent,
    /// Transient failures used up `max_attempts`.
    Exhausted,
    /// A retry copy would not fit the connection's `frame_max` with room
    /// for what the broker adds when its tier dead-letters it, even with
    /// dlqctl's own history trimmed (see [`super::fit`]).
    TooLarge,
    /// Its idempotency key was marked handled with another body, and the
    /// pipeline's `on_conflict` is `dead_letter`: no handler ran.
    KeyConflict,
}

impl DeadLetterReason {
    /// Every reason.
    pub const ALL: [DeadLetterReason; 4] = [
        DeadLetterReason::Permanent,
        DeadLetterReason::Exhausted,
        DeadLetterReason::TooLarge,
        DeadLetterReason::KeyConflict,
    ];

    /// `permanent`, `exhausted`, `too_large` or `key_conflict`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Permanent => "permanent",
            DeadLetterReason::Exhausted => "exhausted",
            DeadLetterReason::TooLarge => "too_large",
            DeadLetterReason::KeyConflict => crate::wire::KEY_CONFLICT_REASON,
        }
    }
}

impl std::fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Decides what happens after run number `attempt` (1 for the first run)
/// ended with `outcome`, following the table of docs/worker.md
/// ("Attempts and decisions"):
///
/// - success: ack;
/// - permanent failure: dead-letter (`permanent`), whatever the attempt;
/// - transient failure with `attempt ≥ max_attempts`: dead-letter
///   (`exhausted`);
/// - transient failure otherwise: retry through tier
///   `delays[min(attempt, len) − 1]` (the row's delay); with a retry-after
///   T (rounded up to whole ms), through the smallest distinct tier d at
///   least the row's delay whose shortest jittered wait
///   `floor(d × (1 − jitter))` is at least T, else through the largest tier.
///
/// Defensive on input the topology validation already refuses: attempt 0
/// counts as 1; an empty delay list dead-letters (`exhausted`); a jitter
/// outside 0..=1 or NaN is clamped (NaN as 0).
pub fn decide(policy: &RetryPolicy, attempt: u32, outcome: &Outcome) -> Decision {
    let retry_after = match outcome {
        Outcome::Success => return Decision::Ack,
        Outcome::Permanent { .. } => {
            return Decision::DeadLetter {
                reason: DeadLetterReason::Permanent,
            }
        }
        Outcome::Transient { retry_after, .. } => retry_after,
        // A timeout is decided like a transient failure without a hint.
        Outcome::TimedOut { .. } => &None,
    };
    let exhausted = Decision::DeadLetter {
        reason: DeadLetterReason::Exhausted,
    };
    if attempt >= policy.max_attempts {
        return exhausted;
    }
    let row = usize::try_from(attempt.max(1))
        .unwrap_or(usize::MAX)
        .min(policy.delays.len());
    let Some(&base) = row.checked_sub(1).and_then(|i| policy.delays.get(i)) else {
        return exhausted;
    };
    let delay_ms = match retry_after {
        None => base,
        Some(t) => {
            // The tier must be at least the row's own delay, and its
            // shortest jittered wait must cover T. (A literal reading,
            // `d × (1 − jitter) ≥ max(T, row delay)`, would push every
            // Retry-After, even 1 ms, one tier past the row whenever jitter
            // is above 0; the row's delay is already jittered without it.)
            let wanted = duration_ms_ceil(*t);
            let jitter = clamp_jitter(policy.jitter);
            let tiers = policy.tiers();
            tiers
                .iter()
                .copied()
                .find(|&d| d >= base && shortest_wait(d, jitter) >= wanted)
                .or_else(|| tiers.last().copied())
                .unwrap_or(base)
        }
    };
    Decision::Retry { delay_ms }
}

/// A duration in whole milliseconds, rounded up, saturating.
fn duration_ms_ceil(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// NaN → 0, else clamped into 0..=1.
pub(super) fn clamp_jitter(jitter: f64) -> f64 {
    if jitter.is_nan() {
        0.0
    } else {
        jitter.clamp(0.0, 1.0)
    }
}

/// The shortest whole-ms wait the jitter can give tier `d`: floor(d × (1 −
/// jitter)). For a whole T, `d × (1 − jitter) ≥ T` exactly when this is ≥ T.
fn shortest_wait(d: u64, jitter: f64) -> u64 {
    floor_ms(d as f64 * (1.0 - jitter))
}

/// floor(x) for x ≥ 0, where x is the float image of a decimal product:
/// a value within a relative 1e-9 of a whole number is that number, so
/// `10000 × (1 − 0.33)` (6699.999999999999 in floats) is 6700, not 6699.
/// NaN and negatives give 0; huge values saturate.
pub(super) fn floor_ms(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let nearest = x.round();
    if (x - nearest).abs() <= 1e-9 * nearest.max(1.0) {
        nearest as u64
    } else {
        x.floor() as u64
    }
}

/// The tier a delivery whose key is leased elsewhere waits in: the
/// shortest tier whose shortest jittered wait outlasts the `remaining_ms`
/// of the lease, else the longest. `None` without tiers.
pub(crate) fn defer_tier(policy: &RetryPolicy, remaining_ms: u64) -> Option<u64> {
    let jitter = clamp_jitter(policy.jitter);
    let tiers = policy.tiers();
    tiers
        .iter()
        .copied()
        .find(|&d| shortest_wait(d, jitter) > remaining_ms)
        .or_else(|| tiers.last().copied())
}
