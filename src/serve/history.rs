//! The last hour of a DLQ's depth, as `dlqctl serve` samples it, and the
//! health the overview gives a pipeline. Pure: the sampler feeds it, and
//! [`crate::serve::chart`] draws it.
//!
//! **Inflow** is the growth of the depth between two samples, never
//! negative: a message that came and went between two samples is not seen,
//! and a replay that drains the DLQ while others arrive hides them. It is a
//! trend to look at, not a count to bill by; the count of messages a worker
//! dead-lettered is its `dlqctl_dead_letters_total{queue,reason}` metric.

use std::collections::VecDeque;

/// How far back the chart looks.
pub const WINDOW_MS: u64 = 60 * 60 * 1000;

/// One sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Sample {
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// Ready plus unacked (`None`: the queue could not be read).
    pub depth: Option<u64>,
    /// Growth since the previous readable sample (`None` for the first).
    pub inflow: Option<u64>,
}

/// One DLQ's samples over the last [`WINDOW_MS`].
#[derive(Debug, Clone, Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

impl History {
    /// Adds a sample taken at `at_ms`, dropping those older than the window.
    /// A sample older than the newest is ignored (a clock stepping back).
    pub fn push(&mut self, at_ms: u64, depth: Option<u64>) {
        if self.samples.back().is_some_and(|s| s.at_ms > at_ms) {
            return;
        }
        let previous = self.samples.iter().rev().find_map(|s| s.depth);
        let inflow = match (previous, depth) {
            (Some(p), Some(d)) => Some(d.saturating_sub(p)),
            _ => None,
        };
        self.samples.push_back(Sample {
            at_ms,
            depth,
            inflow,
        });
        let oldest = at_ms.saturating_sub(WINDOW_MS);
        while self.samples.front().is_some_and(|s| s.at_ms < oldest) {
            self.samples.pop_front();
        }
    }

    #[cfg(test)]
    /// The samples, oldest first.
    pub fn samples(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter()
    }

    /// A copy of the samples, oldest first.
    pub fn to_vec(&self) -> Vec<Sample> {
        self.samples.iter().copied().collect()
    }

    /// The inflow summed over the window.
    pub fn inflow_total(&self) -> u64 {
        self.samples.iter().filter_map(|s| s.inflow).sum()
    }
}

/// How a pipeline looks on the overview.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// The DLQ is at or under `--warn-dlq` (or no threshold is set).
    Healthy,
    /// Over `--warn-dlq`, or a quorum queue holds messages its DLX refused.
    Warning,
    /// Over `--max-dlq` (as `status --max-dlq` exits 3), or a queue is
    /// missing.
    Alert,
}

/// The health of a pipeline whose DLQ holds `dlq_total` (ready plus
/// unacked), whose queues hold `held_for_dlx` refused dead letters, and
/// whose worker's circuit breaker is `paused` (open or half-open, as a
/// `--metrics-url` page shows it: messages wait). Thresholds are "more
/// than", as `dlqctl status --max-dlq` counts them.
pub fn health(
    all_exist: bool,
    dlq_total: u64,
    held_for_dlx: u64,
    paused: bool,
    warn: Option<u64>,
    max: Option<u64>,
) -> Health {
    let by_depth = level(dlq_total as f64, warn, max);
    if !all_exist {
        Health::Alert
    } else if held_for_dlx > 0 || paused {
        by_depth.max(Health::Warning)
    } else {
        by_depth
    }
}

/// The health a DLQ depth alone gives: strictly over `max` is an alert,
/// strictly over `warn` a warning. A fraction for the chart's line, which
/// changes colour where it crosses a threshold.
pub fn level(depth: f64, warn: Option<u64>, max: Option<u64>) -> Health {
    if max.is_some_and(|m| depth > m as f64) {
        Health::Alert
    } else if warn.is_some_and(|w| depth > w as f64) {
        Health::Warning
    } else {
        Health::Healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    #[test]
    fn inflow_is_growth_since_the_last_readable_sample_and_never_negative() {
        let mut h = History::default();
        h.push(0, Some(5));
        h.push(MIN, Some(8));
        h.push(2 * MIN, None);
        h.push(3 * MIN, Some(10));
        h.push(4 * MIN, Some(2));
        let inflow: Vec<Option<u64>> = h.samples().map(|s| s.inflow).collect();
        assert_eq!(inflow, vec![None, Some(3), None, Some(2), Some(0)]);
        assert_eq!(h.inflow_total(), 5);
    }

    #[test]
    fn samples_older_than_an_hour_go_and_a_clock_stepping_back_is_ignored() {
        let mut h = History::default();
        for i in 0..=70 {
            h.push(i * MIN, Some(i));
        }
        let first = h.samples().next().unwrap().at_ms;
        assert_eq!(first, 10 * MIN);
        assert_eq!(h.samples().count(), 61);
        h.push(5 * MIN, Some(999));
        assert_eq!(h.samples().last().unwrap().depth, Some(70));
    }

    #[test]
    fn health_is_strictly_over_each_threshold() {
        assert_eq!(
            health(true, 5, 0, false, Some(5), Some(10)),
            Health::Healthy
        );
        assert_eq!(
            health(true, 6, 0, false, Some(5), Some(10)),
            Health::Warning
        );
        assert_eq!(
            health(true, 10, 0, false, Some(5), Some(10)),
            Health::Warning
        );
        assert_eq!(health(true, 11, 0, false, Some(5), Some(10)), Health::Alert);
        assert_eq!(health(true, 11, 0, false, None, None), Health::Healthy);
        assert_eq!(health(true, 0, 1, false, None, None), Health::Warning);
        assert_eq!(health(false, 0, 0, false, None, None), Health::Alert);
        // A paused circuit breaker: messages wait, at least a warning.
        assert_eq!(health(true, 0, 0, true, None, None), Health::Warning);
        assert_eq!(health(true, 11, 0, true, Some(5), Some(10)), Health::Alert);
        assert_eq!(health(true, 1, 0, false, None, Some(0)), Health::Alert);
    }
}
