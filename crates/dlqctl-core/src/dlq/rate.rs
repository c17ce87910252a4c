//! `--rate`: a token bucket, in messages per second, with the clock as a
//! parameter (microseconds from any fixed origin).
//!
//! It starts with one token and holds at most a tenth of a second's worth
//! (at least one), so N messages at R/s take about (N − 1) / R seconds and
//! a pause (a slow confirm) is not made up for by a burst.

use crate::values::Invalid;

/// A token bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    per_us: f64,
    capacity: f64,
    tokens: f64,
    last_us: u64,
}

impl TokenBucket {
    /// A bucket of `rate` tokens per second (finite, > 0), at `now_us`.
    pub fn new(rate: f64, now_us: u64) -> Self {
        let rate = if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            f64::MIN_POSITIVE
        };
        TokenBucket {
            per_us: rate / 1e6,
            capacity: (rate / 10.0).max(1.0),
            tokens: 1.0,
            last_us: now_us,
        }
    }

    /// Takes one token: `Ok` when there was one, else `Err(us)` to wait
    /// before asking again.
    pub fn take(&mut self, now_us: u64) -> Result<(), u64> {
        let elapsed = now_us.saturating_sub(self.last_us) as f64;
        self.last_us = self.last_us.max(now_us);
        self.tokens = (self.tokens + elapsed * self.per_us).min(self.capacity);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            let wait = ((1.0 - self.tokens) / self.per_us).ceil();
            Err(if wait.is_finite() && wait < u64::MAX as f64 {
                (wait as u64).max(1)
            } else {
                u64::MAX
            })
        }
    }
}

/// The slowest `--rate`: one message per 100 s. A slower one would hold
/// the DLQ's lock for days (`1e-7` is 116 days a message).
pub(crate) const MIN_RATE: f64 = 0.01;
/// The fastest `--rate` (faster is no pacing at all).
pub(crate) const MAX_RATE: f64 = 1_000_000.0;

/// Checks a rate: finite, from `MIN_RATE` to `MAX_RATE` messages per
/// second.
pub fn check_rate(r: f64) -> Result<f64, Invalid> {
    if r.is_finite() && (MIN_RATE..=MAX_RATE).contains(&r) {
        Ok(r)
    } else {
        Err(Invalid(format!(
            "{r} is not a rate dlqctl paces: give messages per second from {MIN_RATE} (one per \
             100 s) to {MAX_RATE}"
        )))
    }
}

/// Parses `--rate`: messages per second, from `MIN_RATE` to
/// `MAX_RATE`.
pub fn parse_rate(s: &str) -> Result<f64, Invalid> {
    match s.trim().parse::<f64>() {
        Ok(r) => check_rate(r).map_err(|e| Invalid(format!("{s:?}: {e}"))),
        Err(_) => Err(Invalid(format!(
            "{s:?} is not a rate: give messages per second, a number from {MIN_RATE} to \
             {MAX_RATE} (for example 50 or 0.5)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives the bucket as the replay loop does and returns when the n-th
    /// token was taken.
    fn time_for(rate: f64, n: u32) -> u64 {
        let mut now = 1_000_000;
        let start = now;
        let mut b = TokenBucket::new(rate, now);
        for _ in 0..n {
            loop {
                match b.take(now) {
                    Ok(()) => break,
                    Err(w) => now += w,
                }
            }
        }
        now - start
    }

    #[test]
    fn n_messages_at_r_per_second_take_n_minus_one_over_r() {
        for (rate, n) in [(10.0, 11), (100.0, 101), (0.5, 3), (1000.0, 1001), (3.0, 1)] {
            let expected = (f64::from(n - 1) / rate * 1e6) as u64;
            let took = time_for(rate, n);
            assert!(
                took.abs_diff(expected) <= u64::from(n) + 2,
                "rate {rate}, n {n}: {took} µs, expected {expected}"
            );
        }
    }

    #[test]
    fn an_idle_bucket_bursts_at_most_a_tenth_of_a_second() {
        let mut b = TokenBucket::new(100.0, 0);
        let later = 60_000_000;
        let burst = (0..1000).take_while(|_| b.take(later).is_ok()).count();
        assert_eq!(burst, 10);
        let mut slow = TokenBucket::new(1.0, 0);
        assert_eq!((0..10).take_while(|_| slow.take(later).is_ok()).count(), 1);
    }

    #[test]
    fn a_clock_going_backwards_neither_panics_nor_adds_tokens() {
        let mut b = TokenBucket::new(1.0, 10_000_000);
        assert!(b.take(10_000_000).is_ok());
        assert!(b.take(0).is_err());
        assert!(b.take(10_500_000).is_err());
        assert!(b.take(11_000_000).is_ok());
    }

    #[test]
    fn rates_parse_and_nonsense_is_refused() {
        assert_eq!(parse_rate("50"), Ok(50.0));
        assert_eq!(parse_rate(" 0.5 "), Ok(0.5));
        assert_eq!(parse_rate("0.01"), Ok(0.01));
        assert_eq!(parse_rate("1e6"), Ok(1e6));
        for bad in [
            "0", "-1", "NaN", "inf", "fast", "", "1e10", "1e-7", "0.009", "1000001",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        let mut b = TokenBucket::new(f64::NAN, 0);
        assert!(b.take(0).is_ok());
        assert!(b.take(1).is_err());
    }
}
