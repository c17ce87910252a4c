//! The HTML pages, rendered on the server with `maud` (which escapes every
//! value it is given: a header or body holding `<script>` shows as text).
//! No inline script or style: the Content-Security-Policy forbids both.
//!
//! - `views`: the overview, a DLQ's groups, a group's messages.
//! - `message`: one message, its history and its body.
//! - `actions`: the action forms, the jobs' pages, the export download.

mod actions;
mod message;
mod views;

pub use actions::{action, cancel, download, job, jobs};
pub use message::message;
pub use views::{dlq, group, overview};

use super::guard::{csrf_ok, Authed};
use super::jobs::{Action, JobView, Request, Selection, State as JobState};
use super::state::{App, CachedSummary, Overview};
use super::{job_at, query_value, seg, Fail, PAGE_SIZE};
use crate::core::dlq::select::Selector;
use crate::core::values::text::rfc3339_millis;
use crate::ops::dlq::PeekedMessage;
use crate::serve::body_view::{self, BodyView};
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
/// to be followed from here (see [`crate::serve::web_guard::asks_to_continue`]).
pub fn continue_page(target: &str) -> Response {
    let target = crate::serve::web_guard::continue_target(target);
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

/// A peeked message's body, as bytes.
fn body_bytes(m: &PeekedMessage) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(&m.body_base64)
        .unwrap_or_default()
}

fn csrf_field(app: &App) -> Markup {
    html! { input type="hidden" name="csrf" value=(app.csrf); }
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
pub async fn login(
    State(app): Shared,
    client: Option<axum::Extension<super::guard::Client>>,
    body: Bytes,
) -> Response {
    let (Some(expected), Some(cookie_value)) =
        (app.opts.auth_token.as_deref(), app.login_cookie.as_deref())
    else {
        return Redirect::to("/").into_response();
    };
    let given = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let client = client.and_then(|c| c.0 .0);
    if let Err(wait) = super::guard::take_try(&app, client) {
        return super::guard::too_many(false, wait);
    }
    let right = crate::serve::web_guard::same_secret(&given, expected);
    if right {
        super::guard::give_back(&app, client);
    }
    if !right {
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
        crate::serve::web_guard::TOKEN_COOKIE,
        cookie_value
    );
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// Any other address.
pub async fn not_found(State(app): Shared) -> Response {
    error_page(&app, &Fail::not_found("no such page"))
}
