//! The frame around every page (head, top bar, crumbs), the bare frame of
//! the pages shown before the guard lets a request in, and the one such
//! page the guard itself answers with: "continue to dlqctl".

use crate::serve::state::App;
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

/// The page around every page's content.
pub(super) fn layout(
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
pub(super) fn head(title: &str, script: bool) -> Markup {
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
pub(super) fn bare(title: &str, content: Markup) -> Markup {
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
