//! The last hour of a DLQ's depth, as `dlqctl serve` samples it, and the
//! small chart the overview draws of it. Pure: the sampler feeds it.
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

/// A chart in SVG coordinates: a polyline of the depth and bars of the
/// inflow, over `[now - WINDOW_MS, now]`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Chart {
    /// `points` of the depth polyline (`x,y x,y …`), empty with fewer than
    /// two readable samples.
    pub depth_points: String,
    /// The inflow bars: `(x, y, height)`, bottom-aligned.
    pub inflow_bars: Vec<(f64, f64, f64)>,
    /// The highest depth, the top of the scale.
    pub max_depth: u64,
    /// The highest inflow of one sample.
    pub max_inflow: u64,
}

/// Draws the samples of a [`History`] in a `width` × `height` box ending
/// at `now_ms` and starting
/// an hour before, or at the first sample when the server has run less
/// than an hour. The depth and the inflow each have their own scale, from
/// 0 to their highest value.
pub fn chart(samples: &[Sample], now_ms: u64, width: f64, height: f64) -> Chart {
    let start = now_ms
        .saturating_sub(WINDOW_MS)
        .max(samples.first().map_or(0, |s| s.at_ms))
        .min(now_ms);
    let span = (now_ms - start).max(1);
    let x = |at: u64| -> f64 {
        let at = at.clamp(start, now_ms);
        ((at - start) as f64 / span as f64 * width * 100.0).round() / 100.0
    };
    let max_depth = samples.iter().filter_map(|s| s.depth).max().unwrap_or(0);
    let max_inflow = samples.iter().filter_map(|s| s.inflow).max().unwrap_or(0);
    let y = |v: u64, max: u64| -> f64 {
        if max == 0 {
            return height;
        }
        let usable = height - 1.0;
        ((height - v as f64 / max as f64 * usable) * 100.0).round() / 100.0
    };
    let readable: Vec<(u64, u64)> = samples
        .iter()
        .filter_map(|s| s.depth.map(|d| (s.at_ms, d)))
        .collect();
    let depth_points = if readable.len() < 2 {
        String::new()
    } else {
        readable
            .iter()
            .map(|&(at, d)| format!("{},{}", x(at), y(d, max_depth)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let inflow_bars = samples
        .iter()
        .filter_map(|s| s.inflow.filter(|&i| i > 0).map(|i| (s.at_ms, i)))
        .map(|(at, i)| {
            let top = y(i, max_inflow);
            (x(at), top, ((height - top) * 100.0).round() / 100.0)
        })
        .collect();
    Chart {
        depth_points,
        inflow_bars,
        max_depth,
        max_inflow,
    }
}

/// How a pipeline looks on the overview.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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
/// unacked) and whose queues hold `held_for_dlx` refused dead letters.
/// Thresholds are "more than", as `dlqctl status --max-dlq` counts them.
pub fn health(
    all_exist: bool,
    dlq_total: u64,
    held_for_dlx: u64,
    warn: Option<u64>,
    max: Option<u64>,
) -> Health {
    if !all_exist || max.is_some_and(|m| dlq_total > m) {
        Health::Alert
    } else if warn.is_some_and(|w| dlq_total > w) || held_for_dlx > 0 {
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
    fn the_chart_spans_the_box_with_depth_on_its_own_scale() {
        let mut h = History::default();
        let now = 10 * WINDOW_MS;
        h.push(now - WINDOW_MS, Some(0));
        h.push(now - WINDOW_MS / 2, Some(50));
        h.push(now, Some(100));
        let c = chart(&h.to_vec(), now, 600.0, 41.0);
        assert_eq!(c.depth_points, "0,41 300,21 600,1");
        assert_eq!(c.max_depth, 100);
        assert_eq!(c.max_inflow, 50);
        assert_eq!(c.inflow_bars, vec![(300.0, 1.0, 40.0), (600.0, 1.0, 40.0)]);
    }

    #[test]
    fn health_is_strictly_over_each_threshold() {
        assert_eq!(health(true, 5, 0, Some(5), Some(10)), Health::Healthy);
        assert_eq!(health(true, 6, 0, Some(5), Some(10)), Health::Warning);
        assert_eq!(health(true, 10, 0, Some(5), Some(10)), Health::Warning);
        assert_eq!(health(true, 11, 0, Some(5), Some(10)), Health::Alert);
        assert_eq!(health(true, 11, 0, None, None), Health::Healthy);
        assert_eq!(health(true, 0, 1, None, None), Health::Warning);
        assert_eq!(health(false, 0, 0, None, None), Health::Alert);
        assert_eq!(health(true, 1, 0, None, Some(0)), Health::Alert);
    }

    #[test]
    fn a_server_up_for_less_than_an_hour_spreads_its_samples_over_the_box() {
        let mut h = History::default();
        h.push(1_000, Some(4));
        h.push(2_000, Some(8));
        h.push(3_000, Some(4));
        let c = chart(&h.to_vec(), 3_000, 100.0, 11.0);
        assert_eq!(c.depth_points, "0,6 50,1 100,6");
    }

    #[test]
    fn an_empty_or_flat_history_draws_nothing_broken() {
        let c = chart(&[], 1_000, 600.0, 40.0);
        assert_eq!(c.depth_points, "");
        assert!(c.inflow_bars.is_empty());
        let mut h = History::default();
        h.push(0, Some(0));
        h.push(1, Some(0));
        let c = chart(&h.to_vec(), 1, 600.0, 40.0);
        assert!(!c.depth_points.contains("NaN"), "{}", c.depth_points);
        assert!(c.inflow_bars.is_empty());
    }
}
