//! The circuit breaker: pause consumption while a dependency fails, instead
//! of burning every message's attempts against it. Pure: time is a
//! parameter (milliseconds on any monotonic clock).

use crate::core::topology::CircuitBreaker;
use std::collections::VecDeque;

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

/// Failure-rate breaker over a sliding window of calls.
#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: CircuitBreaker,
    calls: VecDeque<(u64, bool)>,
    failures: usize,
    open_until: Option<u64>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: CircuitBreaker) -> Self {
        Breaker {
            cfg,
            calls: VecDeque::new(),
            failures: 0,
            open_until: None,
        }
    }

    fn expire(&mut self, now: u64) {
        while let Some(&(t, failed)) = self.calls.front() {
            if now.saturating_sub(t) < self.cfg.window {
                break;
            }
            self.calls.pop_front();
            if failed {
                self.failures -= 1;
            }
        }
    }

    /// Records one handler run: `transient` when it failed transiently
    /// (permanent failures say nothing about the dependency). Returns true
    /// when this call opened the breaker.
    pub fn record(&mut self, now: u64, transient: bool) -> bool {
        if self.open_until.is_some_and(|u| now < u) {
            return false;
        }
        self.expire(now);
        self.calls.push_back((now, transient));
        if transient {
            self.failures += 1;
        }
        let n = self.calls.len();
        if n >= self.cfg.min_calls as usize
            && self.failures as f64 / n as f64 >= self.cfg.failure_rate
        {
            self.open_until = Some(now.saturating_add(self.cfg.open_for));
            self.calls.clear();
            self.failures = 0;
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
