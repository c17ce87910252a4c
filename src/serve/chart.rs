//! The overview's chart of a DLQ's sampled hour, in SVG coordinates. Pure:
//! the page draws what this computes.
//!
//! - One scale, from 0 to a round number at or above the highest depth
//!   (1, 2, 5, 10, 20, 50, ...), labelled at both ends.
//! - The depth is a line in the colour of the health its value gives
//!   against `--warn-dlq` and `--max-dlq` (strictly over each, as the
//!   badge counts): a line crossing a threshold changes colour where it
//!   crosses. The thresholds inside the scale are dashed rules.
//! - The inflow (the depth's growth between two samples) is bars on the
//!   same scale, at least a pixel high so a small one still shows.
//! - The time axis ends at now and starts an hour before, or at the first
//!   sample while the server has run less than an hour; its ticks are
//!   round times before now (`−20 min`, `−40 s`).

use crate::serve::history::{Health, Sample, WINDOW_MS};

/// Where the plot goes in the picture, in SVG units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Area {
    /// The plot's left edge (the scale's labels go left of it).
    pub left: f64,
    /// Its top edge.
    pub top: f64,
    /// Its width.
    pub width: f64,
    /// Its height.
    pub height: f64,
}

impl Area {
    /// The plot at (`left`, `top`), `width` × `height`.
    pub const fn new(left: f64, top: f64, width: f64, height: f64) -> Area {
        Area {
            left,
            top,
            width,
            height,
        }
    }

    /// The plot's bottom edge: the scale's 0.
    pub fn bottom(&self) -> f64 {
        self.top + self.height
    }

    /// Its right edge: now.
    pub fn right(&self) -> f64 {
        self.left + self.width
    }
}

/// `--warn-dlq` and `--max-dlq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Thresholds {
    /// Warning over this many messages.
    pub warn: Option<u64>,
    /// Alert over this many.
    pub max: Option<u64>,
}

impl Thresholds {
    #[cfg(test)]
    /// Warning over `warn`, alert over `max`.
    pub const fn new(warn: Option<u64>, max: Option<u64>) -> Thresholds {
        Thresholds { warn, max }
    }

    /// The health a DLQ depth alone gives: strictly over each threshold,
    /// as the badge counts ([`crate::serve::history::level`]).
    pub fn level(&self, depth: f64) -> Health {
        crate::serve::history::level(depth, self.warn, self.max)
    }

    /// The thresholds that are set, lowest health first.
    fn each(&self) -> impl Iterator<Item = (Health, u64)> {
        [(Health::Warning, self.warn), (Health::Alert, self.max)]
            .into_iter()
            .filter_map(|(h, t)| t.map(|t| (h, t)))
    }
}

/// A piece of the depth line in one colour.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Run {
    /// Its colour.
    pub health: Health,
    /// Its `points` (`x,y x,y …`).
    pub points: String,
}

/// A labelled place on an axis.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Tick {
    /// What it says (`0`, `50`, `−20 min`, `now`).
    pub label: String,
    /// Its y on the scale, its x on the time axis.
    pub at: f64,
}

/// A threshold inside the scale: a dashed rule across the plot.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Rule {
    /// Warning or alert.
    pub health: Health,
    /// The threshold.
    pub value: u64,
    /// Its y.
    pub y: f64,
    /// Whether its value is written on the scale (not when it would
    /// overlap another label).
    pub labelled: bool,
}

/// The chart of one DLQ.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Chart {
    /// The depth line, in pieces of one colour, oldest first; empty with
    /// fewer than two readable samples.
    pub runs: Vec<Run>,
    /// The inflow bars: `(x, y, height)`, bottom-aligned, 2 units wide
    /// and centred on their sample.
    pub bars: Vec<(f64, f64, f64)>,
    /// The top of the scale.
    pub top: u64,
    /// The scale's labels: 0 and [`Chart::top`].
    pub scale: Vec<Tick>,
    /// The thresholds at or under the top of the scale.
    pub rules: Vec<Rule>,
    /// The time axis's ticks, oldest first; the last is `now`.
    pub times: Vec<Tick>,
    /// How long the time axis covers (ms).
    pub span_ms: u64,
    /// The highest depth.
    pub max_depth: u64,
    /// The highest inflow of one sample.
    pub max_inflow: u64,
    /// The newest readable depth.
    pub last_depth: Option<u64>,
}

/// How far apart the time axis's ticks may be: the smallest that puts at
/// most three between the start and now.
const TIME_STEPS_MS: [u64; 13] = [
    1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 900_000,
    1_200_000, 1_800_000,
];

/// A label of the scale closer than this to another is left out.
const LABEL_GAP: f64 = 9.0;

/// The round number the scale goes up to: the smallest 1, 2 or 5 times
/// a power of ten at or above `max` (1 for 0).
pub fn scale_top(max: u64) -> u64 {
    let max = max.max(1);
    let mut power: u64 = 1;
    loop {
        for m in [1, 2, 5] {
            let c = power.saturating_mul(m);
            if c >= max {
                return c;
            }
        }
        match power.checked_mul(10) {
            Some(p) => power = p,
            None => return max,
        }
    }
}

/// A number on the scale: `900`, `5000`, `20k`, `1M`.
pub fn scale_label(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 10_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// A time before now as the axis says it: `now`, `−40 s`, `−20 min`.
pub fn time_label(before_ms: u64) -> String {
    if before_ms == 0 {
        "now".to_string()
    } else if before_ms.is_multiple_of(60_000) {
        format!("\u{2212}{} min", before_ms / 60_000)
    } else {
        format!("\u{2212}{} s", before_ms / 1000)
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The time axis's ticks over `span_ms` before now, oldest first.
fn time_ticks(span_ms: u64, x_of_before: impl Fn(u64) -> f64) -> Vec<Tick> {
    let step = TIME_STEPS_MS
        .iter()
        .copied()
        .find(|s| span_ms / s <= 3)
        .unwrap_or(WINDOW_MS / 2);
    (0..=span_ms / step)
        .rev()
        .map(|k| Tick {
            label: time_label(k * step),
            at: x_of_before(k * step),
        })
        .collect()
}

/// The depth line through `points` (`x` and the depth), cut where it
/// crosses a threshold and in runs of one colour.
fn runs(points: &[(f64, f64)], th: Thresholds, y: impl Fn(f64) -> f64) -> Vec<Run> {
    let mut out: Vec<(Health, Vec<(f64, f64)>)> = Vec::new();
    for pair in points.windows(2) {
        let ((x1, d1), (x2, d2)) = (pair[0], pair[1]);
        let mut cuts: Vec<f64> = th
            .each()
            .map(|(_, t)| t as f64)
            .filter(|&t| t > d1.min(d2) && t < d1.max(d2))
            .map(|t| (t - d1) / (d2 - d1))
            .collect();
        cuts.sort_by(f64::total_cmp);
        let at = |f: f64| (x1 + (x2 - x1) * f, d1 + (d2 - d1) * f);
        let mut from = 0.0;
        for to in cuts.into_iter().chain([1.0]) {
            let health = th.level(at((from + to) / 2.0).1);
            let (start, end) = (at(from), at(to));
            match out.last_mut() {
                Some((h, run)) if *h == health => run.push(end),
                _ => out.push((health, vec![start, end])),
            }
            from = to;
        }
    }
    out.into_iter()
        .map(|(health, pts)| Run {
            health,
            points: pts
                .iter()
                .map(|&(x, d)| format!("{},{}", round2(x), y(d)))
                .collect::<Vec<_>>()
                .join(" "),
        })
        .collect()
}

/// The thresholds at or under `top`, each labelled unless it would
/// overlap the scale's ends or the rule labelled before it.
fn rules(th: Thresholds, top: u64, y: impl Fn(f64) -> f64) -> Vec<Rule> {
    let mut taken = vec![y(0.0), y(top as f64)];
    th.each()
        .filter(|&(_, t)| t <= top)
        .map(|(health, value)| {
            let at = y(value as f64);
            let labelled = taken.iter().all(|o| (o - at).abs() >= LABEL_GAP);
            if labelled {
                taken.push(at);
            }
            Rule {
                health,
                value,
                y: at,
                labelled,
            }
        })
        .collect()
}

/// Draws the samples of a [`crate::serve::history::History`] (oldest
/// first) in `area`, the time axis ending at `now_ms`.
pub fn chart(samples: &[Sample], now_ms: u64, th: Thresholds, area: Area) -> Chart {
    let start = now_ms
        .saturating_sub(WINDOW_MS)
        .max(samples.first().map_or(now_ms, |s| s.at_ms))
        .min(now_ms);
    let span_ms = now_ms - start;
    let x = |at: u64| -> f64 {
        let at = at.clamp(start, now_ms);
        let f = if span_ms == 0 {
            1.0
        } else {
            (at - start) as f64 / span_ms as f64
        };
        round2(area.left + f * area.width)
    };
    let max_depth = samples.iter().filter_map(|s| s.depth).max().unwrap_or(0);
    let max_inflow = samples.iter().filter_map(|s| s.inflow).max().unwrap_or(0);
    let top = scale_top(max_depth);
    let y = |v: f64| round2(area.bottom() - v / top as f64 * area.height);
    let readable: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| s.depth.map(|d| (x(s.at_ms), d as f64)))
        .collect();
    let bars = samples
        .iter()
        .filter_map(|s| s.inflow.filter(|&i| i > 0).map(|i| (s.at_ms, i)))
        .map(|(at, i)| {
            let h = round2((i as f64 / top as f64 * area.height).max(1.0));
            (round2(x(at) - 1.0), round2(area.bottom() - h), h)
        })
        .collect();
    Chart {
        runs: if readable.len() < 2 {
            vec![]
        } else {
            runs(&readable, th, y)
        },
        bars,
        top,
        scale: [0, top]
            .into_iter()
            .map(|v| Tick {
                label: scale_label(v),
                at: y(v as f64),
            })
            .collect(),
        rules: rules(th, top, y),
        times: time_ticks(span_ms, |before| x(now_ms - before)),
        span_ms,
        max_depth,
        max_inflow,
        last_depth: samples.iter().rev().find_map(|s| s.depth),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::history::History;

    const MIN: u64 = 60_000;
    /// A 600 × 40 plot at (0, 0).
    const BOX: Area = Area::new(0.0, 0.0, 600.0, 40.0);
    const NONE: Thresholds = Thresholds::new(None, None);

    /// The chart of `points` read at `MIN`, in `BOX`.
    fn drawn(points: &[(u64, Option<u64>)], th: Thresholds) -> Chart {
        chart(&history(points), MIN, th, BOX)
    }

    fn history(points: &[(u64, Option<u64>)]) -> Vec<Sample> {
        let mut h = History::default();
        for &(at, d) in points {
            h.push(at, d);
        }
        h.to_vec()
    }

    fn colours(c: &Chart) -> Vec<Health> {
        c.runs.iter().map(|r| r.health).collect()
    }

    #[test]
    fn the_scale_goes_up_to_a_round_number_at_or_over_the_highest_depth() {
        let tops: Vec<u64> = [0, 1, 2, 3, 5, 6, 10, 11, 41, 50, 51, 999, 1001]
            .iter()
            .map(|&m| scale_top(m))
            .collect();
        assert_eq!(tops, [1, 1, 2, 5, 5, 10, 10, 20, 50, 50, 100, 1000, 2000]);
        assert_eq!(scale_top(u64::MAX), u64::MAX);
        assert_eq!(scale_label(900), "900");
        assert_eq!(scale_label(5000), "5000");
        assert_eq!(scale_label(20_000), "20k");
        assert_eq!(scale_label(12_345), "12345");
        assert_eq!(scale_label(2_000_000), "2M");
    }

    #[test]
    fn the_chart_spans_the_box_on_one_scale_labelled_0_and_its_top() {
        let now = 10 * WINDOW_MS;
        let s = history(&[
            (now - WINDOW_MS, Some(0)),
            (now - WINDOW_MS / 2, Some(50)),
            (now, Some(100)),
        ]);
        let c = chart(&s, now, NONE, BOX);
        assert_eq!(colours(&c), [Health::Healthy]);
        assert_eq!(c.runs[0].points, "0,40 300,20 600,0");
        assert_eq!((c.top, c.max_depth, c.max_inflow), (100, 100, 50));
        assert_eq!(c.last_depth, Some(100));
        // The inflow on the depth's scale: 50 of 100 is half the height.
        assert_eq!(c.bars, vec![(299.0, 20.0, 20.0), (599.0, 20.0, 20.0)]);
        let scale: Vec<(&str, f64)> = c.scale.iter().map(|t| (t.label.as_str(), t.at)).collect();
        assert_eq!(scale, [("0", 40.0), ("100", 0.0)]);
        assert_eq!(c.span_ms, WINDOW_MS);
        let times: Vec<(&str, f64)> = c.times.iter().map(|t| (t.label.as_str(), t.at)).collect();
        assert_eq!(
            times,
            [
                ("\u{2212}60 min", 0.0),
                ("\u{2212}40 min", 200.0),
                ("\u{2212}20 min", 400.0),
                ("now", 600.0)
            ]
        );
    }

    #[test]
    fn a_small_dlq_is_not_drawn_at_the_top_of_a_bare_box() {
        // 2 messages under a warning at 10: the scale says 2, the line is
        // healthy, and the warning rule is above the scale.
        let c = drawn(
            &[(0, Some(1)), (MIN, Some(2))],
            Thresholds::new(Some(10), Some(100)),
        );
        assert_eq!(c.top, 2);
        assert_eq!(c.scale[1].label, "2");
        assert_eq!(colours(&c), [Health::Healthy]);
        assert!(c.rules.is_empty(), "{:?}", c.rules);
    }

    #[test]
    fn the_line_changes_colour_where_it_crosses_each_threshold() {
        let th = Thresholds::new(Some(10), Some(30));
        // 0 → 40 in one step crosses both thresholds: three pieces, cut at
        // a quarter and three quarters of the way.
        let s = history(&[(0, Some(0)), (4 * MIN, Some(40))]);
        let c = chart(&s, 4 * MIN, th, BOX);
        assert_eq!(c.top, 50);
        assert_eq!(
            colours(&c),
            [Health::Healthy, Health::Warning, Health::Alert]
        );
        assert_eq!(c.runs[0].points, "0,40 150,32");
        assert_eq!(c.runs[1].points, "150,32 450,16");
        assert_eq!(c.runs[2].points, "450,16 600,8");
        let rules: Vec<(Health, u64, f64, bool)> = c
            .rules
            .iter()
            .map(|r| (r.health, r.value, r.y, r.labelled))
            .collect();
        assert_eq!(
            rules,
            [
                // 8 units over the label "0": too close to write.
                (Health::Warning, 10, 32.0, false),
                (Health::Alert, 30, 16.0, true)
            ]
        );
        // Back down: a run per colour, joined where the colour stays.
        let s = history(&[
            (0, Some(5)),
            (MIN, Some(8)),
            (2 * MIN, Some(20)),
            (3 * MIN, Some(25)),
            (4 * MIN, Some(4)),
        ]);
        let c = chart(&s, 4 * MIN, th, BOX);
        assert_eq!(
            colours(&c),
            [Health::Healthy, Health::Warning, Health::Healthy]
        );
        assert_eq!(c.runs[1].points.split(' ').count(), 4, "{:?}", c.runs);
        // Exactly at a threshold is not over it, as the badge counts.
        let s = history(&[(0, Some(10)), (MIN, Some(10))]);
        assert_eq!(colours(&chart(&s, MIN, th, BOX)), [Health::Healthy]);
        let s = history(&[(0, Some(11)), (MIN, Some(31))]);
        assert_eq!(
            colours(&chart(&s, MIN, th, BOX)),
            [Health::Warning, Health::Alert]
        );
    }

    #[test]
    fn a_threshold_label_that_would_overlap_another_is_left_out() {
        // warn 10 is the top of the scale (y 0, as the label "10"), max 11
        // is above it: the warning rule is drawn, unlabelled.
        let c = drawn(
            &[(0, Some(3)), (MIN, Some(10))],
            Thresholds::new(Some(10), Some(11)),
        );
        assert_eq!(c.top, 10);
        assert_eq!(c.rules.len(), 1);
        assert!(!c.rules[0].labelled);
        assert_eq!(c.rules[0].y, 0.0);
    }

    #[test]
    fn a_server_up_for_minutes_spreads_its_samples_and_its_axis_says_so() {
        let s = history(&[(1_000, Some(4)), (61_000, Some(8)), (121_000, Some(4))]);
        let area = Area::new(30.0, 5.0, 100.0, 10.0);
        let c = chart(&s, 121_000, NONE, area);
        assert_eq!(c.span_ms, 2 * MIN);
        assert_eq!(c.top, 10);
        assert_eq!(c.runs[0].points, "30,11 80,7 130,11");
        let times: Vec<(&str, f64)> = c.times.iter().map(|t| (t.label.as_str(), t.at)).collect();
        assert_eq!(
            times,
            [
                ("\u{2212}2 min", 30.0),
                ("\u{2212}1 min", 80.0),
                ("now", 130.0)
            ]
        );
        // Six seconds: ticks two seconds apart.
        let s = history(&[(0, Some(1)), (6_000, Some(1))]);
        let labels: Vec<String> = chart(&s, 6_000, NONE, area)
            .times
            .into_iter()
            .map(|t| t.label)
            .collect();
        assert_eq!(labels, ["\u{2212}6 s", "\u{2212}4 s", "\u{2212}2 s", "now"]);
        assert_eq!(time_label(90_000), "\u{2212}90 s");
    }

    #[test]
    fn an_empty_flat_or_unreadable_history_draws_nothing_broken() {
        let c = chart(&[], 1_000, NONE, BOX);
        assert!(c.runs.is_empty());
        assert!(c.bars.is_empty());
        assert_eq!(c.span_ms, 0);
        assert_eq!(c.times.len(), 1);
        assert_eq!(c.times[0].label, "now");
        assert_eq!(c.last_depth, None);
        let c = chart(&history(&[(0, Some(0)), (1, Some(0))]), 1, NONE, BOX);
        assert_eq!(c.top, 1);
        assert_eq!(c.runs.len(), 1);
        assert!(!c.runs[0].points.contains("NaN"), "{:?}", c.runs);
        assert!(c.bars.is_empty());
        let c = chart(&history(&[(0, None), (1, None)]), 1, NONE, BOX);
        assert!(c.runs.is_empty());
        assert_eq!(c.last_depth, None);
    }

    #[test]
    fn a_small_inflow_on_a_large_scale_is_still_a_pixel_high() {
        let c = drawn(&[(0, Some(1000)), (MIN, Some(1001))], NONE);
        assert_eq!(c.bars, vec![(599.0, 39.0, 1.0)]);
    }
}
