//! The overview: every pipeline's queues in words, its health, and a chart
//! of its DLQ's sampled hour with a scale and a time axis. Each number's
//! raw name and value (`messages_dlx: 4`) is on hover.

use super::parts::*;
use crate::serve::chart::{self, Area, Chart, Thresholds};
use crate::serve::history::{Health, Sample, WINDOW_MS};
use crate::serve::state::PipelineView;
use crate::serve::when::span;
use dlqctl::ops::status::{PipelineStatus, QueueStatus};

/// The chart's picture, and the plot inside it: the scale's labels go
/// left of the plot, the time axis's under it.
const CHART_W: f64 = 340.0;
const CHART_H: f64 = 68.0;
const PLOT: Area = Area::new(36.0, 5.0, 296.0, 46.0);

/// The health's name, as the badge, the row's `data-health` and the
/// classes of the chart's colours spell it.
fn health_name(h: Health) -> &'static str {
    match h {
        Health::Healthy => "healthy",
        Health::Warning => "warning",
        Health::Alert => "alert",
    }
}

/// What the chart shows, in words: its hover and its `aria-label`.
fn chart_words(c: &Chart, th: Thresholds) -> String {
    if c.runs.is_empty() {
        return "DLQ depth: not enough samples yet (a line needs two)".to_string();
    }
    let mut words = format!(
        "DLQ depth over the last {}: now {}, highest {} (scale 0 to {}); bars: the growth between two samples, up to {}",
        span(c.span_ms),
        opt(c.last_depth),
        c.max_depth,
        c.top,
        c.max_inflow
    );
    for (name, t) in [("warning", th.warn), ("alert", th.max)] {
        if let Some(t) = t {
            words += &format!("; {name} over {t}");
        }
    }
    words
}

/// The chart of a DLQ's sampled hour.
fn chart_svg(history: &[Sample], now_ms: u64, th: Thresholds) -> Markup {
    let c = chart::chart(history, now_ms, th, PLOT);
    let words = chart_words(&c, th);
    let (left, right, bottom) = (PLOT.left, PLOT.right(), PLOT.bottom());
    let last = c.times.len().saturating_sub(1);
    html! {
        svg.chart width=(CHART_W) height=(CHART_H) viewBox=(format!("0 0 {CHART_W} {CHART_H}"))
            role="img" aria-label=(words) data-test="chart" {
            title { (words) }
            rect.frame x=(left) y=(PLOT.top) width=(PLOT.width) height=(PLOT.height) {}
            @for r in &c.rules {
                line class=(format!("rule rule-{}", health_name(r.health)))
                    x1=(left) x2=(right) y1=(r.y) y2=(r.y) {}
            }
            g.inflow {
                @for (x, y, h) in &c.bars {
                    rect x=(x) y=(y) width="2" height=(h) {}
                }
            }
            @for run in &c.runs {
                polyline class=(format!("depth line-{}", health_name(run.health))) points=(run.points) {}
            }
            @if c.runs.is_empty() {
                text.empty x=((left + right) / 2.0) y=(PLOT.top + PLOT.height / 2.0 + 3.5) text-anchor="middle" {
                    "collecting samples"
                }
            }
            @for t in &c.scale {
                text.scale x=(left - 4.0) y=(t.at + 3.5) text-anchor="end" { (t.label) }
            }
            @for r in c.rules.iter().filter(|r| r.labelled) {
                text class=(format!("scale rule-{}", health_name(r.health)))
                    x=(left - 4.0) y=(r.y + 3.5) text-anchor="end" { (chart::scale_label(r.value)) }
            }
            @for (i, t) in c.times.iter().enumerate() {
                line.tick x1=(t.at) x2=(t.at) y1=(bottom) y2=(bottom + 3.0) {}
                text.time x=(t.at) y=(CHART_H - 3.0) text-anchor=(if i == last { "end" } else { "middle" }) { (t.label) }
            }
        }
    }
}

/// A count, `–` when unknown, with its raw name and value on hover.
fn count_cell(raw: &str, q: &QueueStatus, v: Option<u64>) -> Markup {
    let hover = match v {
        Some(n) => format!("{raw}: {n} ({})", q.name),
        None if !q.exists => format!("{raw}: unknown, {} does not exist", q.name),
        None => format!("{raw}: unknown ({})", q.name),
    };
    html! { td.num title=(hover) { (opt(v)) } }
}

/// Whether workers consume the main queue: `2 consuming`, or `none`,
/// coloured when messages wait for them.
fn consumers_cell(main: &QueueStatus) -> Markup {
    let ready = main.ready.unwrap_or(0);
    match main.consumers {
        None => count_cell("consumers", main, None),
        Some(0) if ready > 0 => html! {
            td.num data-test="consumers" title=(format!("consumers: 0 ({}), ready: {ready}: nothing consumes what waits", main.name)) {
                span.badge.health-warning data-test="no-consumer" { "none" }
            }
        },
        Some(n) => html! {
            td.num data-test="consumers" title=(format!("consumers: {n} ({})", main.name)) {
                @if n == 0 { "none" } @else { (n) " consuming" }
            }
        },
    }
}

/// The dead letters the pipeline's quorum queues hold because the queue
/// they dead-letter to refused them: the sum of their `messages_dlx`.
fn refused_cell(p: &PipelineStatus) -> Markup {
    let quorum: Vec<&QueueStatus> = std::iter::once(&p.main)
        .chain(p.tiers.iter().map(|t| &t.queue))
        .chain(std::iter::once(&p.dlq))
        .filter(|q| q.quorum && q.exists)
        .collect();
    let known: Vec<(&str, u64)> = quorum
        .iter()
        .filter_map(|q| Some((q.name.as_str(), q.messages_dlx?)))
        .collect();
    if quorum.is_empty() {
        return html! {
            td.num data-test="refused" title="no quorum queue: a classic queue drops what its dead-letter target refuses, and has no messages_dlx" { "–" }
        };
    }
    if known.len() < quorum.len() {
        return html! {
            td.num data-test="refused" title="messages_dlx: unknown (the management API did not answer)" { "–" }
        };
    }
    let total: u64 = known.iter().map(|(_, n)| n).sum();
    let hover = known
        .iter()
        .map(|(q, n)| format!("{q} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    html! {
        td.num data-test="refused" title=(format!("messages_dlx: {hover}")) {
            @if total > 0 { span.badge.health-warning { (total) } } @else { (total) }
        }
    }
}

/// A pipeline's duplicates skipped and deferrals, as its workers' metrics
/// pages count them (`--metrics-url`), under its name; nothing for a
/// pipeline without `idempotency` or without a page read.
fn idempotency_note(p: &PipelineStatus) -> Markup {
    html! {
        @if let Some(c) = &p.idempotency {
            br;
            small.muted data-test="idempotency"
                title="idempotent handling, from the workers' metrics pages: deliveries acked without the handler because their key was marked handled (dlqctl_duplicates_total), and deliveries deferred to a retry tier because another run held their key's lease (dlqctl_deferrals_total)" {
                (c.describe())
            }
        }
    }
}

/// One pipeline's row.
fn pipeline_row(p: &PipelineView, now_ms: u64, th: Thresholds) -> Markup {
    let s = &p.status;
    let dlq_hover = format!(
        "{}: ready {}, unacked {}",
        s.dlq.name,
        opt(s.dlq.ready),
        opt(s.dlq.unacked)
    );
    html! {
        tr data-pipeline=(s.name) data-health=(health_name(p.health)) {
            td {
                a href=(dlq_url(&s.name)) { (s.name) }
                (idempotency_note(s))
            }
            td {
                span class=(format!("badge health-{}", health_name(p.health))) { (health_name(p.health)) }
                @if let Some(c) = s.circuit.as_ref().filter(|c| c.paused()) {
                    " " span.badge.health-warning data-test="circuit"
                        title=(c.pause_sentence(&s.name).unwrap_or_default()) {
                        "breaker " (c.describe())
                    }
                }
            }
            (count_cell("ready", &s.main, s.main.ready))
            (count_cell("messages_unacknowledged", &s.main, s.main.unacked))
            (consumers_cell(&s.main))
            td {
                @for t in &s.tiers {
                    span.mono title=(format!("ready: {} ({})", opt(t.queue.ready), t.queue.name)) {
                        (t.tier) ": " (opt(t.queue.ready))
                    } " "
                }
            }
            td.num.dlq-depth data-test="dlq-depth" title=(dlq_hover) {
                a href=(dlq_url(&s.name)) { (s.dlq.total()) }
            }
            (refused_cell(s))
            td { (chart_svg(&p.history, now_ms, th)) }
            td.num title=(format!("inflow_last_hour: {}", p.inflow_last_hour)) {
                (p.inflow_last_hour)
                @if let Some(id) = p.running_job {
                    br; a href=(format!("/jobs/{id}")) { "job " (id) " running" }
                }
            }
        }
    }
}

/// The table's headings, each explained on hover.
fn headings(o: &Overview) -> Markup {
    html! {
        thead { tr {
            th { "Pipeline" }
            th title="the DLQ's depth against the thresholds below; alert when a queue is missing, warning when refused dead letters are held or the worker's circuit breaker is open (with --metrics-url)" { "Health" }
            th.num title="ready: messages in the main queue waiting for a worker" { "Ready" }
            th.num title="messages_unacknowledged: delivered to a worker and not acknowledged yet (management API, about 5 s behind)" { "Unacked" }
            th.num title="consumers of the main queue: each worker is one or more" { "Consumers" }
            th title="ready messages waiting out each retry tier's delay" { "Retry tiers" }
            th.num title="messages in the dead-letter queue, ready + unacked: the number the thresholds count" { "DLQ" }
            th.num title="messages_dlx: messages the pipeline's quorum queues keep because the queue they dead-letter to refused them (a full DLQ); RabbitMQ retries them, every 3 min by default, and no other count includes them" { "Refused dead letters" }
            th title=(format!("the DLQ's depth, sampled every {} while this server runs", every(o.sample_every_ms))) { "DLQ depth, last hour" }
            th.num title="inflow: the DLQ's growth between samples, summed over the hour; a trend, not a count (a worker's count is dlqctl_dead_letters_total)" { "DLQ growth (1 h)" }
        } }
    }
}

/// A note while the charts cover less than the hour.
fn history_note(o: &Overview, now_ms: u64) -> Markup {
    let first = o
        .pipelines
        .iter()
        .filter_map(|p| p.history.first().map(|s| s.at_ms))
        .min();
    html! {
        @match first {
            None => p.note data-test="history-note" {
                "No samples yet: the charts start with this server's first sample."
            },
            Some(at) if now_ms.saturating_sub(at) + o.sample_every_ms < WINDOW_MS => p.note data-test="history-note" {
                "History since " (when(at, now_ms))
                " (when this server started sampling): the charts grow to the last hour as it runs."
            },
            Some(_) => {},
        }
    }
}

/// The footnote: the thresholds, the sampling, when this was read.
fn footnote(o: &Overview, now_ms: u64) -> Markup {
    html! {
        p.muted {
            @if o.warn_dlq.is_none() && o.max_dlq.is_none() {
                "No thresholds are set (--warn-dlq, --max-dlq): the DLQ's depth alone leaves a pipeline healthy. "
            } @else {
                "Thresholds: warning over " (opt(o.warn_dlq)) ", alert over " (opt(o.max_dlq))
                " messages in the DLQ (ready + unacked). The chart's line takes the colour of the threshold it is over; dashed lines mark the thresholds within its scale. "
            }
            "The charts are sampled every " (every(o.sample_every_ms))
            " while this server runs; their bars are the DLQ's growth between two samples, on the line's scale. Read "
            span data-test="read-at" { (when(o.at_ms, now_ms)) } "."
        }
    }
}

fn overview_page(app: &App, o: &Overview) -> Markup {
    let now = now_ms().max(o.at_ms);
    let th = Thresholds {
        warn: o.warn_dlq,
        max: o.max_dlq,
    };
    let content = html! {
        h1 { "Pipelines" }
        @if let Some(why) = &o.management_unavailable {
            div.notice { "Unacked counts and refused dead letters (messages_dlx) are unknown: " (why) }
        }
        @if !o.missing.is_empty() {
            div.error { "Missing: " (o.missing.join(", ")) " — run dlqctl provision." }
        }
        @for w in o.workers.iter().filter(|w| !w.ready) {
            div.error data-test="not-ready" {
                "Worker at " span.mono { (w.url) } " is not ready: its /readyz answers 503 (not consuming, or every settle failing for 30 s; see its log)."
            }
        }
        @if let Some(why) = &o.circuit_unknown {
            div.notice { "A worker's metrics page could not be read: " (why) }
        }
        (history_note(o, now))
        table.overview {
            (headings(o))
            tbody {
                @for p in &o.pipelines {
                    (pipeline_row(p, now, th))
                }
            }
        }
        (footnote(o, now))
    };
    layout(app, "Overview", html! { "Overview" }, content, Some(30_000))
}

/// An interval as the page says it: `300 ms`, `10 s`, `1.5 s`.
fn every(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// `GET /`: every pipeline.
pub async fn overview(State(app): Shared) -> Response {
    let page = app
        .overview()
        .await
        .map(|o| overview_page(&app, &o))
        .map_err(Fail::from);
    respond(&app, page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlqctl::ops::status::TierStatus;

    fn q(name: &str, ready: u64, consumers: u64, dlx: Option<u64>, quorum: bool) -> QueueStatus {
        QueueStatus {
            name: name.into(),
            exists: true,
            ready: Some(ready),
            consumers: Some(consumers),
            unacked: Some(0),
            messages_dlx: dlx,
            quorum,
            listed: None,
        }
    }

    #[test]
    fn consumers_are_said_in_words_and_none_is_coloured_only_while_messages_wait() {
        let cell = |ready, consumers| {
            consumers_cell(&q("orders", ready, consumers, None, true)).into_string()
        };
        let two = cell(5, 2);
        assert!(two.contains(">2 consuming</td>"), "{two}");
        assert!(two.contains(r#"title="consumers: 2 (orders)""#), "{two}");
        let idle = cell(0, 0);
        assert!(
            idle.contains(">none</td>") && !idle.contains("badge"),
            "{idle}"
        );
        let stuck = cell(3, 0);
        assert!(
            stuck.contains(
                r#"<span class="badge health-warning" data-test="no-consumer">none</span>"#
            ),
            "{stuck}"
        );
        assert!(stuck.contains("ready: 3"), "{stuck}");
        let mut gone = q("orders", 0, 0, None, true);
        (gone.exists, gone.ready, gone.consumers) = (false, None, None);
        let gone = consumers_cell(&gone).into_string();
        assert!(
            gone.contains("does not exist") && gone.contains(">–</td>"),
            "{gone}"
        );
    }

    #[test]
    fn a_guarded_pipeline_shows_its_duplicates_and_deferrals_under_its_name() {
        let mut p = PipelineStatus {
            name: "orders".into(),
            main: q("orders", 0, 0, None, true),
            tiers: vec![],
            dlq: q("orders.dlq", 0, 0, None, true),
            redrive: None,
            circuit: None,
            idempotency: None,
        };
        assert_eq!(idempotency_note(&p).into_string(), "");
        p.idempotency = Some(dlqctl::core::audit::idempotency::IdempotencyCounts {
            duplicates: 4,
            deferrals: 1,
        });
        let note = idempotency_note(&p).into_string();
        assert!(
            note.starts_with(
                r#"<br><small class="muted" data-test="idempotency" title="idempotent handling"#
            ) && note.ends_with(">4 duplicates skipped, 1 deferral</small>"),
            "{note}"
        );
    }

    #[test]
    fn refused_dead_letters_sum_the_quorum_queues_messages_dlx_named_on_hover() {
        let p = |main: QueueStatus, dlq: QueueStatus| PipelineStatus {
            name: "orders".into(),
            main,
            tiers: vec![TierStatus {
                tier: "1m".into(),
                queue: q("orders.retry.1m", 0, 0, Some(2), true),
            }],
            dlq,
            redrive: None,
            circuit: None,
            idempotency: None,
        };
        let cell = refused_cell(&p(
            q("orders", 0, 0, Some(4), true),
            q("orders.dlq", 0, 0, Some(0), true),
        ))
        .into_string();
        assert!(
            cell.contains(r#"title="messages_dlx: orders 4, orders.retry.1m 2, orders.dlq 0""#),
            "{cell}"
        );
        assert!(
            cell.contains(r#"<span class="badge health-warning">6</span>"#),
            "{cell}"
        );
        // Unknown (the management API did not answer): not a made-up 0.
        let cell = refused_cell(&p(
            q("orders", 0, 0, None, true),
            q("orders.dlq", 0, 0, Some(0), true),
        ))
        .into_string();
        assert!(
            cell.contains("unknown") && cell.contains(">–</td>"),
            "{cell}"
        );
        // Classic queues have no messages_dlx.
        let classic = |n: &str| q(n, 0, 0, None, false);
        let mut all = p(classic("orders"), classic("orders.dlq"));
        all.tiers[0].queue = classic("orders.retry.1m");
        let cell = refused_cell(&all).into_string();
        assert!(
            cell.contains("no quorum queue") && cell.contains(">–</td>"),
            "{cell}"
        );
    }
}
