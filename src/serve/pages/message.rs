//! One message: its properties, headers, error history and body.

use super::parts::*;

/// Which message: `?id=ID`, or `?group=G&n=N` (the Nth of the group, from
/// 0, for a message with no id).
#[derive(Debug, serde::Deserialize)]
pub(crate) struct MessageQuery {
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
            BodyView::Text { text, plain } => {
                @if let Some(reason) = plain {
                    p.muted data-test="body-plain" { (reason.explain()) }
                }
                pre.body data-test="body" data-as="text" { (text) }
            },
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
    let timeline = dlqctl::core::dlq::describe::timeline(&m.described);
    let bytes = body_bytes(m);
    let headers = m.headers.as_object().cloned().unwrap_or_default();
    let now = now_ms();
    let content = html! {
        h1 { "Message " span.mono { (opt(m.message_id.as_deref())) } }
        dl.facts {
            dt { "Group" } dd { a.mono href=(group_url(pipeline, group)) { (group) } }
            dt { "Reason" } dd { (opt(m.described.reason.as_deref())) }
            dt { "Attempts" } dd { (opt(m.described.attempts)) }
            dt { "Dead-lettered" } dd { (when_text(m.described.dead_lettered_at.as_deref(), now)) }
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
                    div { strong { "Attempt " (opt(e.attempt)) } " " span.when { (when_text(e.time.as_deref(), now)) } }
                    div.mono { (e.error) }
                }
            }
            li.dead {
                div { strong { "Dead-lettered" } " " span.when { (when_text(m.described.dead_lettered_at.as_deref(), now)) } }
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
                if n >= dlqctl::ops::dlq::MAX_PEEK {
                    return Err(Fail::bad_request(format!(
                        "n is at most {}: the page opens the first {} messages of a group",
                        dlqctl::ops::dlq::MAX_PEEK - 1,
                        dlqctl::ops::dlq::MAX_PEEK
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

#[cfg(test)]
mod tests {
    use super::*;

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
