//! What the pages are built from: the imports they share, the answer to a
//! failed request, addresses, small formats.

pub(super) use super::frame::{bare, layout};
pub(super) use crate::serve::body_view::{self, BodyView};
pub(super) use crate::serve::common::{query_value, seg, Fail, PAGE_SIZE};
pub(super) use crate::serve::guard::{csrf_ok, Authed};
pub(super) use crate::serve::jobs::job_at;
pub(super) use crate::serve::jobs::{Action, JobView, Request, Selection, State as JobState};
pub(super) use crate::serve::state::{App, CachedSummary, Overview};
pub(super) use crate::serve::when::ago;
pub(super) use axum::body::Bytes;
pub(super) use axum::extract::rejection::{PathRejection, QueryRejection};
pub(super) use axum::extract::{Path, Query, State};
pub(super) use axum::http::{header, HeaderMap, StatusCode};
pub(super) use axum::response::{Html, IntoResponse, Redirect, Response};
pub(super) use axum::Extension;
pub(super) use dlqctl::core::dlq::select::Selector;
pub(super) use dlqctl::core::values::text::{parse_rfc3339_millis, rfc3339_millis};
pub(super) use dlqctl::ops::dlq::now_ms;
pub(super) use dlqctl::ops::dlq::PeekedMessage;
pub(super) use maud::{html, Markup};
pub(super) use std::sync::Arc;

pub(super) type Shared = State<Arc<App>>;

/// A page, or its error page.
pub(super) fn respond(app: &App, page: Result<Markup, Fail>) -> Response {
    match page {
        Ok(m) => Html(m.into_string()).into_response(),
        Err(f) => error_page(app, &f),
    }
}

pub(super) fn error_page(app: &App, f: &Fail) -> Response {
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

/// A time as "3 min ago" before `now_ms`, the exact time on hover and in
/// its `datetime`.
pub(super) fn when(at_ms: u64, now_ms: u64) -> Markup {
    let exact = rfc3339_millis(at_ms);
    html! { time datetime=(exact) title=(exact) { (ago(at_ms, now_ms)) } }
}

/// A time a message's headers carry, as [`when`], the text as it was
/// written on hover; one that is not an RFC 3339 time shows as it is.
pub(super) fn when_text(at: Option<&str>, now_ms: u64) -> Markup {
    match at.and_then(|a| Some((a, parse_rfc3339_millis(a)?))) {
        Some((a, ms)) => html! {
            time datetime=(rfc3339_millis(ms)) title=(a) { (ago(ms, now_ms)) }
        },
        None => html! { (opt(at)) },
    }
}

pub(super) fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "–".to_string(), |v| v.to_string())
}

pub(super) fn dlq_url(pipeline: &str) -> String {
    format!("/pipelines/{}", seg(pipeline))
}

pub(super) fn group_url(pipeline: &str, group: &str) -> String {
    format!("/pipelines/{}/groups/{}", seg(pipeline), seg(group))
}

pub(super) fn message_url(pipeline: &str, m: &PeekedMessage, group: &str, n: usize) -> String {
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

/// A peeked message's body, as bytes.
pub(super) fn body_bytes(m: &PeekedMessage) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(&m.body_base64)
        .unwrap_or_default()
}

pub(super) fn csrf_field(app: &App) -> Markup {
    html! { input type="hidden" name="csrf" value=(app.csrf); }
}
