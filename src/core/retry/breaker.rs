//! The circuit breaker: pause consumption while a dependency fails, instead
//! of burning every message's attempts against it. Pure: time is a
//! parameter (milliseconds on any monotonic clock).

use crate::core::topology::CircuitBreaker;

/// Whether handlers may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Normal operation.
    Closed,
    /// Paused for this many more milliseconds.
    Open {
        /// Time left, in ms.
        remaining_ms: u64,
    },
}

/// How many time buckets the window is cut into.
pub const BUCKETS: usize = 20;

/// Calls and transient failures seen in one slice of the window.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which slice of time (`now / width`) the counts belong to.
    slice: u64,
    calls: u64,
    failures: u64,
}

/// Failure-rate breaker over a sliding window of calls.
///
/// The window is kept as [`BUCKETS`] fixed time buckets of `window / 20`
/// each (at least 1 ms), so memory does not depend on traffic or on the
/// window's length. The rate is computed over the buckets of the last
/// window: calls leave it one bucket (a twentieth of the window) at a time.
#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: CircuitBreaker,
    width: u64,
    buckets: [Bucket; BUCKETS],
    open_until: Option<u64>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: CircuitBreaker) -> Self {
        let width = cfg.window.div_ceil(BUCKETS as u64).max(1);
        Breaker {
            cfg,
            width,
            buckets: [Bucket::default(); BUCKETS],
            open_until: None,
        }
    }

    /// Calls and failures in the buckets of the window ending at `slice`.
    fn totals(&self, slice: u64) -> (u64, u64) {
        let oldest = slice.saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|b| b.calls > 0 && b.slice >= oldest && b.slice <= slice)
            .fold((0, 0), |(c, f), b| (c + b.calls, f + b.failures))
    }

    /// Records one handler run: `transient` when it failed transiently
    /// (permanent failures say nothing about the dependency). Returns true
    /// when this call opened the breaker.
    pub fn record(&mut self, now: u64, transient: bool) -> bool {
        if self.open_until.is_some_and(|u| now < u) {
            return false;
        }
        let slice = now / self.width;
        let bucket = &mut self.buckets[(slice % BUCKETS as u64) as usize];
        if bucket.slice != slice {
            *bucket = Bucket {
                slice,
                ..Bucket::default()
            };
        }
        bucket.calls += 1;
        if transient {
            bucket.failures += 1;
        }
        let (calls, failures) = self.totals(slice);
        if calls >= u64::from(self.cfg.min_calls)
            && failures as f64 / calls as f64 >= self.cfg.failure_rate
        {
            self.open_until = Some(now.saturating_add(self.cfg.open_for));
            self.buckets = [Bucket::default(); BUCKETS];
            return true;
        }
        false
    }

    /// The state at `now`. After `open_for` the breaker closes with an empty
    /// window: the next `min_calls` runs decide again.
    pub fn state(&mut self, now: u64) -> State {
        match self.open_until {
            Some(u) if now < u => State::Open {
                remaining_ms: u - now,
            },
            Some(_) => {
                self.open_until = None;
                State::Closed
            }
            None => State::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CircuitBreaker {
        CircuitBreaker {
            failure_rate: 0.5,
            window: 1000,
            min_calls: 4,
            open_for: 300,
        }
    }

    #[test]
    fn opens_at_the_failure_rate_once_min_calls_are_seen() {
        let mut b = Breaker::new(cfg());
        assert!(!b.record(0, true));
        assert!(!b.record(1, true));
        assert!(!b.record(2, true)); // 3 calls < min_calls
        assert_eq!(b.state(2), State::Closed);
        assert!(b.record(3, false)); // 3/4 ≥ 0.5
        assert_eq!(b.state(3), State::Open { remaining_ms: 300 });
        assert_eq!(b.state(302), State::Open { remaining_ms: 1 });
        assert_eq!(b.state(303), State::Closed);
    }

    #[test]
    fn stays_closed_below_the_rate() {
        let mut b = Breaker::new(cfg());
        for t in 0..100 {
            // one failure in three
            assert!(!b.record(t, t % 3 == 1), "opened at {t}");
        }
        assert_eq!(b.state(100), State::Closed);
    }

    #[test]
    fn old_calls_leave_the_window() {
        let mut b = Breaker::new(cfg());
        b.record(0, true);
        b.record(1, true);
        b.record(2, true);
        // Long after: the three failures are gone; one failure among four
        // fresh calls is under the rate.
        assert!(!b.record(5000, false));
        assert!(!b.record(5001, false));
        assert!(!b.record(5002, true));
        assert!(!b.record(5003, false));
        assert_eq!(b.state(5003), State::Closed);
    }

    #[test]
    fn memory_does_not_grow_with_traffic_or_a_long_window() {
        let mut b = Breaker::new(CircuitBreaker {
            failure_rate: 0.5,
            window: 14 * 24 * 3_600_000, // two weeks
            min_calls: 10,
            open_for: 300,
        });
        // No heap: its state is a fixed array, whatever the traffic.
        assert!(!std::mem::needs_drop::<Breaker>());
        for t in 0..1_000_000u64 {
            b.record(t, t % 4 == 0);
        }
        assert_eq!(b.state(1_000_000), State::Closed);
        // A failure burst still opens it.
        for t in 0..3_000_000u64 {
            if b.record(1_000_000 + t, true) {
                return;
            }
        }
        panic!("a burst of failures never opened the breaker");
    }

    #[test]
    fn calls_leave_the_window_one_bucket_at_a_time() {
        let mut b = Breaker::new(cfg()); // window 1000 ms: buckets of 50 ms
        b.record(0, true);
        b.record(0, true);
        b.record(0, true);
        // 999 ms later the failures are still in the window: 3 of 4.
        assert!(b.record(999, false));
        let mut b = Breaker::new(cfg());
        b.record(0, true);
        b.record(0, true);
        b.record(0, true);
        // 1000 ms later their bucket has left the window: 0 of 1.
        assert!(!b.record(1000, false));
    }

    #[test]
    fn permanent_failures_and_successes_do_not_open_it() {
        let mut b = Breaker::new(cfg());
        for t in 0..50 {
            assert!(!b.record(t, false));
        }
    }

    #[test]
    fn after_open_for_a_new_window_decides() {
        let mut b = Breaker::new(cfg());
        for t in 0..4 {
            b.record(t, true);
        }
        assert!(matches!(b.state(10), State::Open { .. }));
        assert_eq!(b.state(400), State::Closed);
        // The window was cleared: it takes min_calls again to reopen.
        assert!(!b.record(401, true));
        assert!(!b.record(402, true));
        assert!(!b.record(403, true));
        assert!(b.record(404, true));
    }
}
