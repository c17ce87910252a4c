//! The DLQ's views: a DLQ's groups and a group's messages (the overview
//! is `overview`).

use super::parts::*;

/// The pipeline's shared redrive state as the page read it: the state
/// (`None`: no run yet), or why it could not be read.
type SharedRedrive = Result<Option<dlqctl::core::dlq::redrive_state::RedriveState>, String>;

/// The pipeline's automatic redrive policy, the messages waiting for a
/// person as this summary counted them, and the shared state: the wait,
/// the next look and the last runs.
fn redrive_facts(
    policy: &dlqctl::core::topology::Redrive,
    waiting: Option<u64>,
    shared: &SharedRedrive,
) -> Markup {
    use dlqctl::core::values::duration::tier_name;
    // Neither credentials nor a query (a token) are shown.
    let health = policy.health.as_deref().map(|u| {
        reqwest::Url::parse(u)
            .map(|u| dlqctl::handler::http::redacted(&u))
            .unwrap_or_else(|_| "(an invalid URL)".into())
    });
    html! {
        h2 { "Automatic redrive" }
        dl.facts data-test="redrive" {
            dt { "Reasons" } dd { (policy.reasons.join(", ")) }
            dt { "Minimum age" } dd { (tier_name(policy.min_age)) }
            dt { "Max redrives" } dd { (policy.max_redrives) }
            dt { "Rate" } dd { (format!("{}/s", policy.rate)) }
            dt { "Canary" } dd { (policy.canary) }
            dt { "Every" } dd { (tier_name(policy.every)) }
            dt { "Health probe" } dd.mono { (opt(health.as_deref())) }
            dt { "Waiting for a person" } dd data-test="waiting" { (opt(waiting.map(|n| n.to_string()).as_deref())) }
        }
        (redrive_runs(shared))
        p.muted { "Every dlqctl work of this pipeline runs it when the shared wait has passed; its runs are also in the workers' logs (redrive run) and metrics (dlqctl_redrive_runs_total)." }
    }
}

/// The shared wait, the next look and the last runs of the redrive.
fn redrive_runs(shared: &SharedRedrive) -> Markup {
    use dlqctl::core::values::duration::tier_name;
    let now = now_ms();
    html! {
        @match shared {
            Err(why) => p.notice data-test="redrive-state" { "The redrive state could not be read: " (why) },
            Ok(None) => p.muted data-test="redrive-state" { "No redrive run yet." },
            Ok(Some(s)) => {
                dl.facts data-test="redrive-state" {
                    dt { "Shared wait" } dd data-test="shared-wait" { (tier_name(s.wait_ms)) }
                    dt { "Next look" } dd data-test="next-look" { (when(s.next_look_at_ms, now)) }
                }
                h3 { "Last runs" }
                table.runs data-test="redrive-runs" {
                    thead { tr {
                        th { "When" } th { "Result" } th.num { "Moved" } th { "Canary (sent, back)" }
                        th.num { "Waiting for a person" } th { "By" } th { "Why" }
                    } }
                    tbody {
                        @for r in &s.runs {
                            tr {
                                td { (when(r.at_ms, now)) }
                                td data-test="run-result" { (r.result.label()) }
                                td.num { (r.moved) }
                                td { (opt(r.canary.map(|(s, b)| format!("{s}, {b}")).as_deref())) }
                                td.num { (opt(r.waiting_for_person.map(|n| n.to_string()).as_deref())) }
                                td.mono { (r.by) }
                                td.cut title=(r.why.as_deref().unwrap_or("")) { (opt(r.why.as_deref())) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn summary_page(
    app: &App,
    pipeline: &str,
    policy: Option<(&dlqctl::core::topology::Redrive, SharedRedrive)>,
    s: &CachedSummary,
) -> Markup {
    let r = &s.report;
    let now = now_ms();
    let content = html! {
        h1 { "DLQ " span.mono { (r.queue) } }
        @if let Some(why) = &s.stale_because {
            div.notice data-test="stale" { "Showing the summary of " (when(s.at_ms, now)) ": " (why) }
        }
        @if let Some(id) = app.jobs.running_on(pipeline) {
            div.notice { a href=(format!("/jobs/{id}")) { "Job " (id) } " is working on this DLQ." }
        }
        dl.facts {
            dt { "Messages" } dd data-test="snapshot" { (r.snapshot) }
            dt { "Groups" } dd { (r.groups.len()) }
            dt { "Read" } dd data-test="read-at" { (when(s.at_ms, now)) }
        }
        @if let Some((policy, shared)) = &policy {
            (redrive_facts(policy, r.waiting_for_person, shared))
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
                            td { (when_text(g.first_dead_lettered_at.as_deref(), now)) }
                            td { (when_text(g.last_dead_lettered_at.as_deref(), now)) }
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
        let policy = match p.dead_letter.redrive.as_ref() {
            Some(policy) => Some((
                policy,
                app.redrive_state(p).await.map_err(|e| e.to_string()),
            )),
            None => None,
        };
        Ok(summary_page(&app, &p.name, policy, &s))
    }
    .await;
    respond(&app, page)
}

/// `?page=N` of a group.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct PageQuery {
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
    (g, counted): (&dlqctl::core::dlq::describe::Group, &CachedSummary),
    page: u16,
    messages: &[PeekedMessage],
    more: bool,
) -> Markup {
    let first = usize::from(page) * usize::from(PAGE_SIZE);
    let now = now_ms();
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
                        td { (when_text(m.described.dead_lettered_at.as_deref(), now)) }
                        td.num { (opt(m.described.attempts)) }
                        td.mono.cut { (opt(m.described.last_error.as_deref())) }
                        td.mono.cut { (dlqctl::core::dlq::describe::body_preview(&body_bytes(m), 60)) }
                    }
                }
            }
        }
    };
    let content = html! {
        h1 { "Group " span.mono { (g.id) } }
        @if let Some(why) = &counted.stale_because {
            div.notice data-test="stale" { "The count is from " (when(counted.at_ms, now)) ": " (why) }
        }
        dl.facts {
            dt { "Reason" } dd { (opt(g.reason.as_deref())) }
            dt { "Error" } dd.mono { (g.fingerprint) }
            dt { "Messages" } dd data-test="group-count" { (g.count) }
            dt { "Counted" } dd { (when(counted.at_ms, now)) }
            dt { "First seen" } dd { (when_text(g.first_dead_lettered_at.as_deref(), now)) }
            dt { "Last seen" } dd { (when_text(g.last_dead_lettered_at.as_deref(), now)) }
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
        if skip + u32::from(PAGE_SIZE) > u32::from(dlqctl::ops::dlq::MAX_PEEK) {
            return Err(Fail::bad_request(format!(
                "the page shows the first {} messages of a group; export it for the rest",
                dlqctl::ops::dlq::MAX_PEEK
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
