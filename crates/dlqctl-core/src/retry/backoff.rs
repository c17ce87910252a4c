//! Capped exponential backoff: the waits between retries of one failing
//! step (a reconnect, a refused publish), doubling from a first wait up
//! to a cap.

use std::time::Duration;

/// The waits `first, 2 × first, 4 × first, …`, never above `cap`.
///
/// Pure: it computes waits, the caller sleeps. [`Backoff::reset`] starts
/// over after a success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first` and doubles up to `cap` (a `cap` below `first`
    /// caps `first` too).
    pub fn new(first: Duration, cap: Duration) -> Self {
        let first = first.min(cap);
        Backoff {
            first,
            cap,
            next: first,
        }
    }

    /// The wait to make now; the one after it is twice as long, capped.
    pub fn next_wait(&mut self) -> Duration {
        let now = self.next;
        self.next = self.next.saturating_mul(2).min(self.cap);
        now
    }

    /// The wait [`Backoff::next_wait`] will give next, without moving on.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// Starts over from the first wait (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(ms(100), ms(500));
        let waits: Vec<_> = (0..5).map(|_| b.next_wait()).collect();
        assert_eq!(waits, vec![ms(100), ms(200), ms(400), ms(500), ms(500)]);
        b.reset();
        assert_eq!(b.peek(), ms(100));
        assert_eq!(b.next_wait(), ms(100));
    }

    #[test]
    fn never_overflows_and_a_small_cap_caps_the_first_wait() {
        let mut b = Backoff::new(Duration::MAX, Duration::MAX);
        assert_eq!(b.next_wait(), Duration::MAX);
        assert_eq!(b.next_wait(), Duration::MAX);
        let mut b = Backoff::new(ms(10), ms(3));
        assert_eq!(b.next_wait(), ms(3));
        let mut z = Backoff::new(Duration::ZERO, ms(5));
        assert_eq!(z.next_wait(), Duration::ZERO);
    }
}
