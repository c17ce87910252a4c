//! Small bounded bookkeeping of the JSON-lines handler: which ids were
//! answered lately, and how many log lines a window allows.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// The last `cap` ids answered, to tell a duplicate answer from a late one.
pub(super) struct RecentIds {
    cap: usize,
    order: VecDeque<u64>,
    set: HashSet<u64>,
}

impl RecentIds {
    pub(super) fn new(cap: usize) -> Self {
        RecentIds {
            cap,
            order: VecDeque::with_capacity(cap),
            set: HashSet::with_capacity(cap),
        }
    }

    pub(super) fn insert(&mut self, id: u64) {
        if self.order.len() == self.cap {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(id);
        self.set.insert(id);
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.set.contains(&id)
    }
}

/// At most `per_window` events per window; the rest are counted and
/// reported once the next window opens.
pub(super) struct Limiter {
    per_window: u32,
    window: Duration,
    started: Option<Instant>,
    used: u32,
    pub(super) suppressed: u64,
}

impl Limiter {
    pub(super) fn new(per_window: u32, window: Duration) -> Self {
        Limiter {
            per_window,
            window,
            started: None,
            used: 0,
            suppressed: 0,
        }
    }

    /// Whether one more event may be logged now; `report` gets the count
    /// suppressed in the window that just ended.
    pub(super) fn allow(&mut self, now: Instant, report: impl FnOnce(u64)) -> bool {
        let fresh = match self.started {
            Some(start) => now.duration_since(start) >= self.window,
            None => true,
        };
        if fresh {
            self.flush(report);
            self.started = Some(now);
            self.used = 0;
        }
        if self.used < self.per_window {
            self.used += 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }

    /// Reports the count of a window that is over.
    pub(super) fn tick(&mut self, now: Instant, report: impl FnOnce(u64)) {
        if self
            .started
            .is_some_and(|start| now.duration_since(start) >= self.window)
        {
            self.flush(report);
        }
    }

    pub(super) fn flush(&mut self, report: impl FnOnce(u64)) {
        if self.suppressed > 0 {
            report(std::mem::take(&mut self.suppressed));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_ids_forget_the_oldest() {
        let mut r = RecentIds::new(3);
        for id in 1..=5 {
            r.insert(id);
        }
        assert!(!r.contains(1) && !r.contains(2));
        assert!(r.contains(3) && r.contains(4) && r.contains(5));
        assert!(r.set.len() <= 3 && r.order.len() <= 3);
    }

    #[test]
    fn limiter_allows_a_window_then_counts_and_reports() {
        let t0 = Instant::now();
        let mut l = Limiter::new(2, Duration::from_secs(1));
        let mut reported = Vec::new();
        let mut allow = |l: &mut Limiter, ms: u64| {
            l.allow(t0 + Duration::from_millis(ms), |n| reported.push(n))
        };
        assert!(allow(&mut l, 0));
        assert!(allow(&mut l, 10));
        assert!(!allow(&mut l, 20));
        assert!(!allow(&mut l, 990));
        // A new window: the two suppressed are reported, and two more pass.
        assert!(allow(&mut l, 1000));
        assert!(allow(&mut l, 1001));
        assert!(!allow(&mut l, 1002));
        assert_eq!(reported, vec![2]);
        // tick reports only once the window is over.
        let mut ticked = Vec::new();
        l.tick(t0 + Duration::from_millis(1500), |n| ticked.push(n));
        assert!(ticked.is_empty());
        l.tick(t0 + Duration::from_millis(2000), |n| ticked.push(n));
        assert_eq!(ticked, vec![1]);
        assert_eq!(l.suppressed, 0);
    }
}
