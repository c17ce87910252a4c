//! The HTML pages, rendered on the server with `maud` (which escapes every
//! value it is given: a header or body holding `<script>` shows as text).
//! No inline script or style: the Content-Security-Policy forbids both.

use super::guard::{csrf_ok, Authed};
use super::jobs::{Action, JobView, Request, Selection, State as JobState};
use super::state::{App, CachedSummary, Overview};
use super::{query_value, seg, Fail, PAGE_SIZE};
use crate::core::body_view::{self, BodyView};
use crate::core::select::Selector;
use crate::core::text::rfc3339_millis;
use crate::ops::dlq::PeekedMessage;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Extension;
use maud::{html, Markup, DOCTYPE};
use std::sync::Arc;

type Shared = State<Arc<App>>;

/// The page around every page's content.
fn layout(
    app: &App,
    title: &str,
    crumbs: Markup,
    content: Markup,
    refresh_ms: Option<u64>,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, true))
            body data-csrf=(app.csrf) data-refresh-ms=[refresh_ms] {
                header.top {
                    a.brand href="/" { "dlqctl" }
                    nav {
                        a href="/" { "Overview" }
                        a href="/jobs" { "Jobs" }
                    }
                    @if app.opts.read_only {
                        span.badge.readonly { "read-only" }
                    }
                    span.where { (app.opts.file) " · " (app.opts.brokers.endpoints()) }
                }
                main {
                    nav.crumbs { (crumbs) }
                    (content)
                }
            }
        }
    }
}

/// The `<head>` of every page; `script`: with the page's script.
fn head(title: &str, script: bool) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · dlqctl" }
            link rel="stylesheet" href="/assets/style.css";
            @if script {
                script src="/assets/app.js" defer {}
            }
        }
    }
}

/// A page for someone not logged in yet: no CSRF token, no file or broker
/// names, no navigation.
fn bare(title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, false))
            body {
                header.top { span.brand { "dlqctl" } }
                main { (content) }
            }
        }
    }
}

/// What a link from another site to one of our pages gets: a link to it,
/// to be followed from here (see [`crate::core::web_guard::asks_to_continue`]).
pub fn continue_page(target: &str) -> Response {
    let target = crate::core::web_guard::continue_target(target);
    let content = html! {
        h1 { "Continue to dlqctl" }
        p { "You followed a link from another site. This page reads a DLQ when it opens; open it from here:" }
        p { a data-test="continue" href=(target) { (target) } }
    };
    Html(bare("Continue", content).into_string()).into_response()
}

/// A page, or its error page.
fn respond(app: &App, page: Result<Markup, Fail>) -> Response {
    match page {
        Ok(m) => Html(m.into_string()).into_response(),
        Err(f) => error_page(app, &f),
    }
}

fn error_page(app: &App, f: &Fail) -> Response {
    let body = html! {
        h1 { (f.status.as_u16()) " " (f.status.canonical_reason().unwrap_or("")) }
        div.error data-test="error" { (f.message) }
        @if let Some(id) = f.job {
            p { a href=(format!("/jobs/{id}")) { "See job " (id) } }
        }
    };
    let crumbs = html! { a href="/" { "Overview" } };
    (
        f.status,
        Html(layout(app, "Error", crumbs, body, None).into_string()),
    )
        .into_response()
}

/// A path that does not parse (not UTF-8, not a number).
pub(crate) fn bad_path(r: PathRejection) -> Fail {
    Fail::bad_request(format!("bad address: {}", r.body_text()))
}

/// A query string that does not parse (a letter where a number goes, a
/// number too large).
pub(crate) fn bad_query(r: QueryRejection) -> Fail {
    Fail::bad_request(format!("bad query: {}", r.body_text()))
}

fn time(ms: u64) -> String {
    rfc3339_millis(ms)
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "–".to_string(), |v| v.to_string())
}

fn dlq_url(pipeline: &str) -> String {
    format!("/pipelines/{}", seg(pipeline))
}

fn group_url(pipeline: &str, group: &str) -> String {
    format!("/pipelines/{}/groups/{}", seg(pipeline), seg(group))
}

fn message_url(pipeline: &str, m: &PeekedMessage, group: &str, n: usize) -> String {
    match &m.message_id {
        Some(id) => format!(
            "/pipelines/{}/message?id={}",
            seg(pipeline),
            query_value(id)
        ),
        None => format!(
            "/pipelines/{}/message?group={}&n={n}",
            seg(pipeline),
            query_value(group)
        ),
    }
}

/// A small chart: the DLQ's depth (line) and inflow (bars) over the hour.
fn chart(history: &[crate::core::history::Sample], now_ms: u64) -> Markup {
    let (w, h) = (240.0, 40.0);
    let c = crate::core::history::chart(history, now_ms, w, h);
    html! {
        svg.chart width="240" height="40" viewBox="0 0 240 40" role="img"
            aria-label=(format!("DLQ depth over the last hour, up to {}; inflow up to {} per sample", c.max_depth, c.max_inflow)) {
            title { "DLQ depth (line, up to " (c.max_depth) ") and inflow (bars, up to " (c.max_inflow) " per sample), last hour" }
            rect.frame x="0" y="0" width="240" height="40" {}
            g.inflow {
                @for (x, y, bh) in &c.inflow_bars {
                    rect x=(x) y=(y) width="2" height=(bh) {}
                }
            }
            @if !c.depth_points.is_empty() {
                polyline.depth points=(c.depth_points) {}
            }
        }
    }
}

fn overview_page(app: &App, o: &Overview) -> Markup {
    let content = html! {
        h1 { "Pipelines" }
        @if let Some(why) = &o.management_unavailable {
            div.notice { "Unacked counts and messages_dlx are unknown: " (why) }
        }
        @if !o.missing.is_empty() {
            div.error { "Missing: " (o.missing.join(", ")) " — run dlqctl provision." }
        }
        table.overview {
            thead { tr {
                th { "Pipeline" } th { "Health" }
                th.num { "Ready" } th.num { "Unacked" } th.num { "Consumers" }
                th { "Retry tiers" }
                th.num { "DLQ" } th.num { "messages_dlx" }
                th { "DLQ, last hour" } th.num { "Inflow (1 h)" }
            } }
            tbody {
                @for p in &o.pipelines {
                    tr data-pipeline=(p.status.name) data-health=(health_name(p.health)) {
                        td { a href=(dlq_url(&p.status.name)) { (p.status.name) } }
                        td { span class=(format!("badge health-{}", health_name(p.health))) { (health_name(p.health)) } }
                        td.num { (opt(p.status.main.ready)) }
                        td.num { (opt(p.status.main.unacked)) }
                        td.num { (opt(p.status.main.consumers)) }
                        td {
                            @for t in &p.status.tiers {
                                span.mono { (t.tier) ": " (opt(t.queue.ready)) } " "
                            }
                        }
                        td.num.dlq-depth data-test="dlq-depth" {
                            a href=(dlq_url(&p.status.name)) { (p.status.dlq.total()) }
                        }
                        td.num { (opt(p.status.dlq.messages_dlx.or(p.status.main.messages_dlx))) }
                        td { (chart(&p.history, o.at_ms)) }
                        td.num {
                            (p.inflow_last_hour)
                            @if let Some(id) = p.running_job {
                                br; a href=(format!("/jobs/{id}")) { "job " (id) " running" }
                            }
                        }
                    }
                }
            }
        }
        p.muted {
            "Thresholds: warning over " (opt(o.warn_dlq)) ", alert over " (opt(o.max_dlq))
            " messages (ready + unacked). The chart is sampled every "
            (every(o.sample_every_ms)) " while this server runs; inflow is the DLQ's growth between samples. Read at "
            (time(o.at_ms)) "."
        }
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

fn health_name(h: crate::core::history::Health) -> &'static str {
    match h {
        crate::core::history::Health::Healthy => "healthy",
        crate::core::history::Health::Warning => "warning",
        crate::core::history::Health::Alert => "alert",
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

fn csrf_field(app: &App) -> Markup {
    html! { input type="hidden" name="csrf" value=(app.csrf); }
}

fn summary_page(app: &App, pipeline: &str, s: &CachedSummary) -> Markup {
    let r = &s.report;
    let content = html! {
        h1 { "DLQ " span.mono { (r.queue) } }
        @if let Some(why) = &s.stale_because {
            div.notice data-test="stale" { "Showing the summary of " (time(s.at_ms)) ": " (why) }
        }
        @if let Some(id) = app.jobs.running_on(pipeline) {
            div.notice { a href=(format!("/jobs/{id}")) { "Job " (id) } " is working on this DLQ." }
        }
        dl.facts {
            dt { "Messages" } dd data-test="snapshot" { (r.snapshot) }
            dt { "Groups" } dd { (r.groups.len()) }
            dt { "Read at" } dd { (time(s.at_ms)) }
        }
        h2 { "Groups" }
        @if r.groups.is_empty() {
            p.muted data-test="empty" { "The DLQ is empty." }
        } @else {
            table.groups {
                thead { tr {
                    th { "Group" } th { "Reason" } th { "Error" } th.num { "Messages" }
                    th { "First seen" } th { "Last seen" } th { "From" }
                } }
                tbody {
                    @for g in &r.groups {
                        tr data-group=(g.id) {
                            td { a.mono href=(group_url(pipeline, &g.id)) { (g.id) } }
                            td { (opt(g.reason.as_deref())) }
                            td.mono.cut title=(g.fingerprint) { (g.fingerprint) }
                            td.num data-test="count" { (g.count) }
                            td { (opt(g.first_dead_lettered_at.as_deref())) }
                            td { (opt(g.last_dead_lettered_at.as_deref())) }
                            td.mono { (opt(g.source_queue.as_deref())) }
                        }
                    }
                }
            }
        }
        @if !app.opts.read_only && r.snapshot > 0 {
            form.actions method="post" action=(format!("{}/actions", dlq_url(pipeline))) {
                (csrf_field(app))
                input type="hidden" name="scope" value="all";
                button.secondary type="submit" name="action" value="export" { "Export the whole DLQ (JSONL)" }
            }
        }
    };
    let crumbs = html! { a href="/" { "Overview" } " / " (pipeline) };
    layout(app, &format!("DLQ {}", r.queue), crumbs, content, None)
}

/// `GET /pipelines/{pipeline}`: the DLQ's groups.
pub async fn dlq(State(app): Shared, path: Result<Path<String>, PathRejection>) -> Response {
    let page = async {
        let Path(pipeline) = path.map_err(bad_path)?;
        let p = app.pipeline(&pipeline)?;
        let s = app.summary(p).await?;
        Ok(summary_page(&app, &p.name, &s))
    }
    .await;
    respond(&app, page)
}

/// `?page=N` of a group.
#[derive(Debug, serde::Deserialize)]
pub struct PageQuery {
    page: Option<u16>,
}

/// The replay options and the three actions' buttons, for a group or the
/// selected messages.
fn action_fields(app: &App, count: u64, group: &str) -> Markup {
    html! {
        (csrf_field(app))
        input type="hidden" name="group" value=(group);
        input type="hidden" name="expected" value=(count);
        div.actions {
            fieldset {
                legend { "Replay options" }
                label { "Rate (msg/s)" input type="number" name="rate" min="0.1" step="any" placeholder="unlimited"; }
                label { "Canary (messages)" input type="number" name="canary" min="1" step="1" placeholder="none"; }
            }
            fieldset {
                legend { "The whole group (" (count) ")" }
                button type="submit" name="action" value="replay-group" data-test="replay-group" { "Replay group" }
                " "
                button.secondary type="submit" name="action" value="export-group" { "Export group" }
            }
            fieldset {
                legend { "Selected messages (" span data-field="selected-count" { "0" } ")" }
                button type="submit" name="action" value="replay-selected" { "Replay selected" }
                " "
                button.secondary type="submit" name="action" value="export-selected" { "Export selected" }
            }
            fieldset {
                legend { "Purge (no copy is kept)" }
                label { "Type the count to confirm" input type="text" name="confirm" inputmode="numeric" autocomplete="off"; }
                button.danger type="submit" name="action" value="purge-group" { "Purge group" }
                " "
                button.danger type="submit" name="action" value="purge-selected" { "Purge selected" }
            }
        }
    }
}

fn group_page(
    app: &App,
    pipeline: &str,
    (g, counted): (&crate::core::dlq::Group, &CachedSummary),
    page: u16,
    messages: &[PeekedMessage],
    more: bool,
) -> Markup {
    let first = usize::from(page) * usize::from(PAGE_SIZE);
    // An id that more than one message of the page carries opens by place.
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    for m in messages {
        if let Some(id) = &m.message_id {
            *seen.entry(id.as_str()).or_default() += 1;
        }
    }
    let link = |m: &PeekedMessage, n: usize| match &m.message_id {
        Some(id) if seen.get(id.as_str()).copied().unwrap_or(0) > 1 => format!(
            "/pipelines/{}/message?group={}&n={n}",
            seg(pipeline),
            query_value(&g.id)
        ),
        _ => message_url(pipeline, m, &g.id, n),
    };
    let rows = html! {
        table {
            thead { tr {
                th { @if !app.opts.read_only { input.select-all type="checkbox" aria-label="select all on this page"; } }
                th { "#" } th { "Message id" } th { "Dead-lettered" } th.num { "Attempts" } th { "Last error" } th { "Body" }
            } }
            tbody {
                @for (i, m) in messages.iter().enumerate() {
                    tr data-test="message" {
                        td {
                            @if !app.opts.read_only {
                                @if let Some(id) = &m.message_id {
                                    input type="checkbox" name="message_id" value=(id);
                                } @else {
                                    input type="checkbox" disabled title="no message id: select it with its group";
                                }
                            }
                        }
                        td.num { (first + i + 1) }
                        td.mono { a href=(link(m, first + i)) { (opt(m.message_id.as_deref())) } }
                        td { (opt(m.described.dead_lettered_at.as_deref())) }
                        td.num { (opt(m.described.attempts)) }
                        td.mono.cut { (opt(m.described.last_error.as_deref())) }
                        td.mono.cut { (crate::core::dlq::body_preview(&body_bytes(m), 60)) }
                    }
                }
            }
        }
    };
    let content = html! {
        h1 { "Group " span.mono { (g.id) } }
        @if let Some(why) = &counted.stale_because {
            div.notice data-test="stale" { "The count is from " (time(counted.at_ms)) ": " (why) }
        }
        dl.facts {
            dt { "Reason" } dd { (opt(g.reason.as_deref())) }
            dt { "Error" } dd.mono { (g.fingerprint) }
            dt { "Messages" } dd data-test="group-count" { (g.count) }
            dt { "Counted at" } dd { (time(counted.at_ms)) }
            dt { "First seen" } dd { (opt(g.first_dead_lettered_at.as_deref())) }
            dt { "Last seen" } dd { (opt(g.last_dead_lettered_at.as_deref())) }
            dt { "From" } dd.mono { (opt(g.source_queue.as_deref())) }
        }
        @if app.opts.read_only {
            (rows)
        } @else {
            form.messages method="post" action=(format!("{}/actions", dlq_url(pipeline))) {
                (action_fields(app, g.count, &g.id))
                (rows)
            }
        }
        div.pager {
            @if page > 0 {
                a href=(format!("{}?page={}", group_url(pipeline, &g.id), page - 1)) { "← previous" }
            }
            span.muted { "page " (page + 1) }
            @if more {
                a href=(format!("{}?page={}", group_url(pipeline, &g.id), page + 1)) { "next →" }
            }
        }
    };
    let crumbs = html! {
        a href="/" { "Overview" } " / " a href=(dlq_url(pipeline)) { (pipeline) } " / " (g.id)
    };
    layout(app, &format!("Group {}", g.id), crumbs, content, None)
}

fn body_bytes(m: &PeekedMessage) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(&m.body_base64)
        .unwrap_or_default()
}

/// `GET /pipelines/{pipeline}/groups/{group}?page=N`: a page of a group's
/// messages.
pub async fn group(
    State(app): Shared,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    let page = async {
        let Path((pipeline, group)) = path.map_err(bad_path)?;
        let Query(q) = query.map_err(bad_query)?;
        let p = app.pipeline(&pipeline)?;
        let Some((g, counted)) = app.group(p, &group).await? else {
            return Err(Fail::not_found(format!(
                "{} holds no group {group} now (replayed or purged?)",
                p.dead_letter.queue
            )));
        };
        let page = q.page.unwrap_or(0);
        let skip = u32::from(page) * u32::from(PAGE_SIZE);
        if skip + u32::from(PAGE_SIZE) > u32::from(crate::ops::dlq::MAX_PEEK) {
            return Err(Fail::bad_request(format!(
                "the page shows the first {} messages of a group; export it for the rest",
                crate::ops::dlq::MAX_PEEK
            )));
        }
        let selector = Selector {
            group: Some(g.id.clone()),
            ..Selector::default()
        };
        let mut r = app.peek(p, &selector, skip as u16, PAGE_SIZE + 1).await?;
        let more = r.messages.len() > usize::from(PAGE_SIZE);
        r.messages.truncate(usize::from(PAGE_SIZE));
        Ok(group_page(
            &app,
            &p.name,
            (&g, &counted),
            page,
            &r.messages,
            more,
        ))
    }
    .await;
    respond(&app, page)
}

/// Which message: `?id=ID`, or `?group=G&n=N` (the Nth of the group, from
/// 0, for a message with no id).
#[derive(Debug, serde::Deserialize)]
pub struct MessageQuery {
    id: Option<String>,
    group: Option<String>,
    n: Option<u16>,
}

fn json_tokens(tokens: &[body_view::Token]) -> Markup {
    use body_view::TokenKind;
    html! {
        @for t in tokens {
            @match t.kind {
                TokenKind::Punct => (t.text),
                TokenKind::Key => span.j-key { (t.text) },
                TokenKind::String => span.j-string { (t.text) },
                TokenKind::Number => span.j-number { (t.text) },
                TokenKind::Bool => span.j-bool { (t.text) },
                TokenKind::Null => span.j-null { (t.text) },
            }
        }
    }
}

fn body_markup(bytes: &[u8]) -> Markup {
    let (view, hidden) = body_view::view(bytes);
    html! {
        @match &view {
            BodyView::Json { tokens } => pre.body data-test="body" data-as="json" { (json_tokens(tokens)) },
            BodyView::Text { text } => pre.body data-test="body" data-as="text" { (text) },
            BodyView::Hex { lines } => table.hex data-test="body" data-as="hex" {
                @for l in lines {
                    tr { td.muted { (format!("{:08x}", l.offset)) } td { (l.hex) } td { (l.ascii) } }
                }
            },
            BodyView::Empty => p.muted data-test="body" data-as="empty" { "(empty body)" },
        }
        @if hidden > 0 {
            p.muted { (hidden) " more bytes not shown: export the message for all of it." }
        }
    }
}

fn message_page(app: &App, pipeline: &str, m: &PeekedMessage) -> Markup {
    let group = &m.group;
    let timeline = crate::core::dlq::timeline(&m.described);
    let bytes = body_bytes(m);
    let headers = m.headers.as_object().cloned().unwrap_or_default();
    let content = html! {
        h1 { "Message " span.mono { (opt(m.message_id.as_deref())) } }
        dl.facts {
            dt { "Group" } dd { a.mono href=(group_url(pipeline, group)) { (group) } }
            dt { "Reason" } dd { (opt(m.described.reason.as_deref())) }
            dt { "Attempts" } dd { (opt(m.described.attempts)) }
            dt { "Dead-lettered" } dd { (opt(m.described.dead_lettered_at.as_deref())) }
            dt { "From" } dd.mono { (opt(m.described.source_queue.as_deref())) }
            dt { "First routed" } dd.mono {
                (opt(m.described.original_exchange.as_deref())) " → " (opt(m.described.original_routing_key.as_deref()))
            }
            dt { "Body" } dd { (m.body_bytes) " bytes" }
        }
        h2 { "History" }
        ol.timeline data-test="timeline" {
            @for e in &timeline {
                li {
                    div { strong { "Attempt " (opt(e.attempt)) } " " span.when { (opt(e.time.as_deref())) } }
                    div.mono { (e.error) }
                }
            }
            li.dead {
                div { strong { "Dead-lettered" } " " span.when { (opt(m.described.dead_lettered_at.as_deref())) } }
                div { (opt(m.described.reason.as_deref())) }
                @if let Some(e) = &m.described.last_error { div.mono { (e) } }
            }
        }
        h2 { "Body" }
        (body_markup(&bytes))
        h2 { "Properties" }
        table.props {
            tbody {
                @for (k, v) in &m.properties {
                    tr { th.mono { (k) } td.mono { (display_json(v)) } }
                }
            }
        }
        h2 { "Headers" }
        table.headers data-test="headers" {
            tbody {
                @for (k, v) in &headers {
                    tr { th.mono { (k) } td.mono { pre { (display_json(v)) } } }
                }
            }
        }
        @if !app.opts.read_only {
            @if let Some(id) = &m.message_id {
                form.actions method="post" action=(format!("{}/actions", dlq_url(pipeline))) {
                    (csrf_field(app))
                    input type="hidden" name="group" value=(group);
                    input type="hidden" name="message_id" value=(id);
                    input type="hidden" name="expected" value="1";
                    button type="submit" name="action" value="replay-selected" { "Replay this message" }
                    button.secondary type="submit" name="action" value="export-selected" { "Export it" }
                    label { "Type 1 to confirm a purge" input type="text" name="confirm" autocomplete="off"; }
                    button.danger type="submit" name="action" value="purge-selected" { "Purge it" }
                }
            } @else {
                p.muted { "This message has no message id: replay, export or purge it with its group." }
            }
        }
    };
    let crumbs = html! {
        a href="/" { "Overview" } " / " a href=(dlq_url(pipeline)) { (pipeline) }
        " / " a href=(group_url(pipeline, group)) { (group) } " / message"
    };
    layout(app, "Message", crumbs, content, None)
}

/// A header or property value: a string as itself, anything else as JSON.
fn display_json(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    }
}

/// `GET /pipelines/{pipeline}/message?id=ID` (or `?group=G&n=N`).
pub async fn message(
    State(app): Shared,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<MessageQuery>, QueryRejection>,
) -> Response {
    let page = async {
        let Path(pipeline) = path.map_err(bad_path)?;
        let Query(q) = query.map_err(bad_query)?;
        let p = app.pipeline(&pipeline)?;
        let (selector, skip) = match (&q.id, &q.group) {
            (Some(id), _) => (
                Selector {
                    message_ids: vec![id.clone()],
                    ..Selector::default()
                },
                0,
            ),
            (None, Some(g)) => {
                let n = q.n.unwrap_or(0);
                if n >= crate::ops::dlq::MAX_PEEK {
                    return Err(Fail::bad_request(format!(
                        "n is at most {}: the page opens the first {} messages of a group",
                        crate::ops::dlq::MAX_PEEK - 1,
                        crate::ops::dlq::MAX_PEEK
                    )));
                }
                (
                    Selector {
                        group: Some(g.clone()),
                        ..Selector::default()
                    },
                    n,
                )
            }
            (None, None) => return Err(Fail::bad_request("give ?id=MESSAGE_ID or ?group=G&n=N")),
        };
        let r = app.peek(p, &selector, skip, 1).await?;
        let Some(m) = r.messages.first() else {
            return Err(Fail::not_found(format!(
                "{} holds no such message now (replayed or purged?)",
                p.dead_letter.queue
            )));
        };
        Ok(message_page(&app, &p.name, m))
    }
    .await;
    respond(&app, page)
}

/// A posted form's fields, once its CSRF token is checked.
fn checked_form(
    app: &App,
    authed: Option<&Authed>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<(String, String)>, Fail> {
    let form: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
    let csrf = form
        .iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.as_str());
    if csrf_ok(app, authed, headers, csrf) {
        Ok(form)
    } else {
        Err(Fail::forbidden(
            "the form's CSRF token is missing or stale: reload the page and try again",
        ))
    }
}

/// Reads the form of an action into a job request: which button, which
/// messages, the replay options and the purge confirmation.
fn read_action(form: &[(String, String)]) -> Result<Request, Fail> {
    let one = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    };
    let ids: Vec<String> = form
        .iter()
        .filter(|(k, _)| k == "message_id")
        .map(|(_, v)| v.clone())
        .collect();
    let button = one("action").ok_or_else(|| Fail::bad_request("no action was chosen"))?;
    // Which messages is always said: a button `VERB-SCOPE`, or `VERB` and
    // a `scope` field; never implied. The whole DLQ only for an export
    // (the DLQ page's one such button).
    let (verb, scope) = match button.split_once('-') {
        Some((v, s)) => (v, s),
        None => (
            button,
            one("scope")
                .ok_or_else(|| Fail::bad_request("say which messages: no scope was given"))?,
        ),
    };
    if scope == "all" && verb != "export" {
        return Err(Fail::bad_request(format!(
            "the page does not {verb} a whole DLQ: choose a group or messages"
        )));
    }
    let group = one("group").map(str::to_string);
    let selection = match scope {
        "all" => Selection::default(),
        "group" => Selection {
            group: Some(group.ok_or_else(|| Fail::bad_request("no group was given"))?),
            message_ids: vec![],
        },
        "selected" if ids.is_empty() => {
            return Err(Fail::bad_request("no message is selected: tick some first"));
        }
        "selected" => Selection {
            group,
            message_ids: ids.clone(),
        },
        other => return Err(Fail::bad_request(format!("unknown scope {other:?}"))),
    };
    let number = |name: &str| -> Result<Option<f64>, Fail> {
        one(name)
            .map(|v| {
                v.parse::<f64>()
                    .map_err(|_| Fail::bad_request(format!("{name} must be a number, not {v:?}")))
            })
            .transpose()
    };
    let action = match verb {
        "replay" => Action::Replay {
            rate: number("rate")?,
            canary: number("canary")?.map(|c| c.max(0.0) as u64),
            canary_wait_ms: None,
        },
        "export" => Action::Export,
        "purge" => {
            let expected = if scope == "selected" {
                ids.len() as u64
            } else {
                number("expected")?.map(|e| e as u64).unwrap_or(0)
            };
            let typed = one("confirm");
            if typed != Some(expected.to_string().as_str()) {
                return Err(Fail::bad_request(format!(
                    "to purge, type the count ({expected}) in the confirmation box: nothing was \
                     removed"
                )));
            }
            Action::Purge { expected }
        }
        other => return Err(Fail::bad_request(format!("unknown action {other:?}"))),
    };
    Ok(Request { action, selection })
}

/// `POST /pipelines/{pipeline}/actions`: starts a job, then shows it.
pub async fn action(
    State(app): Shared,
    path: Result<Path<String>, PathRejection>,
    authed: Option<Extension<Authed>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(Path(pipeline)) = path else {
        return error_page(&app, &Fail::not_found("no such pipeline"));
    };
    let form = match checked_form(&app, authed.as_deref(), &headers, &body) {
        Ok(f) => f,
        Err(f) => return error_page(&app, &f),
    };
    match read_action(&form).and_then(|r| app.jobs.start(&app, &pipeline, r)) {
        Ok(id) => Redirect::to(&format!("/jobs/{id}")).into_response(),
        Err(f) => error_page(&app, &f),
    }
}

fn describe_job(j: &JobView) -> String {
    let what = match &j.selection {
        s if s.is_everything() => "the whole DLQ".to_string(),
        Selection {
            group: Some(g),
            message_ids,
        } if message_ids.is_empty() => format!("group {g}"),
        Selection { message_ids, .. } => format!("{} selected messages", message_ids.len()),
    };
    format!("{} {what} of {}", j.action.verb(), j.dlq)
}

fn job_page(app: &App, j: &JobView) -> Markup {
    let p = &j.progress;
    let content = html! {
        h1 { "Job " (j.id) ": " (describe_job(j)) }
        div.job data-job-id=(j.id) data-state=(state_name(j.state)) {
            progress data-field="bar" max=(p.total.max(1)) value=(p.read) {}
            dl.facts {
                dt { "State" } dd data-field="state" { (state_name(j.state)) }
                dt { "Snapshot" } dd data-field="total" { (p.total) }
                dt { "Read" } dd data-field="read" { (p.read) }
                dt { "Selected" } dd data-field="selected" { (p.selected) }
                dt { "Done" } dd data-field="done" { (p.done) }
                dt { "Failed" } dd data-field="failed" { (p.failed) }
                dt { "Elapsed" } dd data-field="elapsed" { (format!("{:.1} s", j.elapsed_ms as f64 / 1000.0)) }
                dt { "DLQ " span.mono { (j.dlq) } " holds" } dd data-field="dlq-messages" { "…" }
                dt { "Started" } dd { (j.started_at) }
            }
            div.error data-field="error" { (j.error.as_deref().unwrap_or("")) }
            p.muted data-field="poll-error" {}
            @if j.state == JobState::Running && !app.opts.read_only {
                form.cancel method="post" action=(format!("/jobs/{}/cancel", j.id)) {
                    (csrf_field(app))
                    button.danger type="submit" { "Cancel" }
                }
            }
            a data-field="download" href=(j.download.clone().unwrap_or_default()) hidden[j.download.is_none()] {
                "Download the export (JSONL)"
            }
            h2 { "Report" }
            pre data-field="report" {
                @if let Some(r) = &j.report { (serde_json::to_string_pretty(r).unwrap_or_default()) }
            }
        }
        p { a href=(dlq_url(&j.pipeline)) { "Back to the DLQ" } }
    };
    let crumbs = html! { a href="/" { "Overview" } " / " a href="/jobs" { "Jobs" } " / " (j.id) };
    layout(app, &format!("Job {}", j.id), crumbs, content, None)
}

fn state_name(s: JobState) -> &'static str {
    match s {
        JobState::Running => "running",
        JobState::Done => "done",
        JobState::Failed => "failed",
        JobState::Cancelled => "cancelled",
    }
}

/// `GET /jobs/{id}`.
pub async fn job(State(app): Shared, path: Result<Path<u64>, PathRejection>) -> Response {
    let Ok(Path(id)) = path else {
        return error_page(&app, &Fail::not_found("no such job"));
    };
    let page = app
        .jobs
        .get(id)
        .map(|j| job_page(&app, &j.view()))
        .ok_or_else(|| Fail::not_found(format!("no job {id} (jobs live as long as the server)")));
    respond(&app, page)
}

/// `GET /jobs`.
pub async fn jobs(State(app): Shared) -> Response {
    let all = app.jobs.all();
    let content = html! {
        h1 { "Jobs" }
        @if all.is_empty() {
            p.muted { "No job has run since this server started." }
        } @else {
            table {
                thead { tr { th { "Job" } th { "What" } th { "State" } th.num { "Done" } th.num { "Failed" } th { "Started" } th.num { "Took" } } }
                tbody {
                    @for j in &all {
                        tr {
                            td { a href=(format!("/jobs/{}", j.id)) { (j.id) } }
                            td { (describe_job(j)) }
                            td { (state_name(j.state)) }
                            td.num { (j.progress.done) }
                            td.num { (j.progress.failed) }
                            td { (j.started_at) }
                            td.num { (format!("{:.1} s", j.elapsed_ms as f64 / 1000.0)) }
                        }
                    }
                }
            }
        }
    };
    respond(
        &app,
        Ok(layout(
            &app,
            "Jobs",
            html! { a href="/" { "Overview" } " / Jobs" },
            content,
            None,
        )),
    )
}

/// `POST /jobs/{id}/cancel`.
pub async fn cancel(
    State(app): Shared,
    path: Result<Path<u64>, PathRejection>,
    authed: Option<Extension<Authed>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(f) = checked_form(&app, authed.as_deref(), &headers, &body) {
        return error_page(&app, &f);
    }
    let Ok(Path(id)) = path else {
        return error_page(&app, &Fail::not_found("no such job"));
    };
    match app.jobs.get(id) {
        Some(j) => {
            j.cancel.cancel();
            Redirect::to(&format!("/jobs/{id}")).into_response()
        }
        None => error_page(&app, &Fail::not_found(format!("no job {id}"))),
    }
}

/// `GET /jobs/{id}/download`: an export job's file.
pub async fn download(State(app): Shared, path: Result<Path<u64>, PathRejection>) -> Response {
    let Ok(Path(id)) = path else {
        return error_page(&app, &Fail::not_found("no such job"));
    };
    let Some((path, name)) = app.jobs.get(id).and_then(|j| j.download_file()) else {
        return error_page(
            &app,
            &Fail::not_found(format!("job {id} has no finished export")),
        );
    };
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) => {
            return error_page(
                &app,
                &Fail::not_found(format!("the export of job {id} is gone: {e}")),
            )
        }
    };
    let stream = tokio_util::io::ReaderStream::new(file);
    let disposition = format!(
        "attachment; filename=\"{}\"",
        name.replace(['"', '\\'], "_")
    );
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

/// `GET /login`: the token form (only with `--auth-token`).
pub async fn login_form() -> Response {
    let content = html! {
        h1 { "Log in" }
        form.actions method="post" action="/login" {
            label { "Token" input type="password" name="token" autocomplete="current-password"; }
            button type="submit" { "Log in" }
        }
    };
    Html(bare("Log in", content).into_string()).into_response()
}

/// `POST /login`: sets the token cookie when the token is right.
pub async fn login(State(app): Shared, body: Bytes) -> Response {
    let Some(expected) = app.opts.auth_token.as_deref() else {
        return Redirect::to("/").into_response();
    };
    let given = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    if !crate::core::web_guard::same_secret(&given, expected) {
        let content = html! {
            h1 { "Wrong token" }
            p { a href="/login" { "Try again" } }
        };
        return (
            StatusCode::UNAUTHORIZED,
            Html(bare("Log in", content).into_string()),
        )
            .into_response();
    }
    let cookie = format!(
        "{}={}; Path=/; HttpOnly; SameSite=Strict",
        crate::core::web_guard::TOKEN_COOKIE,
        crate::core::web_guard::cookie_value(&given)
    );
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// Any other address.
pub async fn not_found(State(app): Shared) -> Response {
    error_page(&app, &Fail::not_found("no such page"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_group_button_selects_the_group_and_ignores_ticked_boxes() {
        let r = read_action(&form(&[
            ("action", "replay-group"),
            ("group", "g1"),
            ("message_id", "m1"),
            ("rate", "25"),
            ("canary", ""),
        ]))
        .unwrap();
        assert_eq!(
            r.selection,
            Selection {
                group: Some("g1".into()),
                message_ids: vec![]
            }
        );
        assert_eq!(
            r.action,
            Action::Replay {
                rate: Some(25.0),
                canary: None,
                canary_wait_ms: None
            }
        );
    }

    #[test]
    fn a_selected_button_needs_ticked_boxes() {
        let e = read_action(&form(&[("action", "export-selected"), ("group", "g")])).unwrap_err();
        assert!(
            e.message.contains("no message is selected"),
            "{}",
            e.message
        );
        let r = read_action(&form(&[
            ("action", "export-selected"),
            ("group", "g"),
            ("message_id", "a"),
            ("message_id", "b"),
        ]))
        .unwrap();
        assert_eq!(r.selection.message_ids, vec!["a", "b"]);
        assert_eq!(r.action, Action::Export);
    }

    #[test]
    fn a_purge_runs_only_when_the_typed_count_is_the_count() {
        let purge = |confirm: &str| {
            read_action(&form(&[
                ("action", "purge-group"),
                ("group", "g"),
                ("expected", "12"),
                ("confirm", confirm),
            ]))
        };
        assert_eq!(purge("12").unwrap().action, Action::Purge { expected: 12 });
        for wrong in ["", "11", "12 ", "twelve", "0"] {
            if wrong.trim() == "12" {
                continue;
            }
            assert!(purge(wrong).is_err(), "{wrong:?}");
        }
        // Selected: the count is the number of boxes ticked, whatever the
        // form says it expected.
        let r = read_action(&form(&[
            ("action", "purge-selected"),
            ("expected", "12"),
            ("message_id", "a"),
            ("message_id", "b"),
            ("confirm", "2"),
        ]))
        .unwrap();
        assert_eq!(r.action, Action::Purge { expected: 2 });
    }

    #[test]
    fn bad_numbers_and_unknown_buttons_are_refused() {
        assert!(read_action(&form(&[
            ("action", "replay-group"),
            ("group", "g"),
            ("rate", "fast")
        ]))
        .is_err());
        assert!(read_action(&form(&[("action", "drop-group"), ("group", "g")])).is_err());
        assert!(read_action(&form(&[("action", "replay-everything")])).is_err());
        assert!(read_action(&form(&[("action", "replay-group")])).is_err());
        assert!(read_action(&form(&[])).is_err());
        let all = read_action(&form(&[("action", "export"), ("scope", "all")])).unwrap();
        assert!(all.selection.is_everything());
        // Never implied, and only an export of everything.
        assert!(read_action(&form(&[("action", "export")])).is_err());
        assert!(read_action(&form(&[("action", "replay"), ("scope", "all")])).is_err());
        assert!(read_action(&form(&[("action", "replay-all")])).is_err());
        assert!(read_action(&form(&[("action", "purge-all"), ("confirm", "0")])).is_err());
    }

    #[test]
    fn headers_and_bodies_are_escaped() {
        let m = body_markup(b"<script>alert(1)</script>").into_string();
        assert!(m.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{m}");
        assert!(!m.contains("<script>"), "{m}");
        let m = body_markup(br#"{"<img src=x onerror=alert(1)>":"</pre><script>"}"#).into_string();
        assert!(!m.contains("<img"), "{m}");
        assert!(!m.contains("<script>"), "{m}");
        assert!(m.contains("data-as=\"json\""), "{m}");
    }
}
