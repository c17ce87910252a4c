//! The checks in front of every route ([`crate::serve::web_guard`] has the
//! rules): the `Host`, the token, the `Origin` of a POST, read-only, and
//! the headers that keep the pages from being framed, sniffed or made to
//! run a script of someone else's.

use super::state::App;
use crate::serve::web_guard;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use std::sync::Arc;

/// How a request was let in, for the handlers' CSRF check.
#[derive(Debug, Clone, Copy)]
pub struct Authed {
    /// It carried `Authorization: Bearer TOKEN`: a browser never adds that
    /// header to a request another site makes it send, so such a request
    /// needs no CSRF token.
    pub bearer: bool,
}

/// The address of the client, when the server knows it.
#[derive(Debug, Clone, Copy)]
pub struct Client(pub Option<std::net::IpAddr>);

/// Takes a try of a token guess for `client` (see
/// [`web_guard::Throttle`]): `Err(wait)` when it must wait first.
pub fn take_try(app: &App, client: Option<std::net::IpAddr>) -> Result<(), std::time::Duration> {
    match app.throttle.lock() {
        Ok(mut t) => t.take(client, std::time::Instant::now()),
        // A poisoned lock: refuse guessing rather than allow it unbounded.
        Err(_) => Err(web_guard::GUESS_EVERY),
    }
}

/// Gives back the try of a right token.
pub fn give_back(app: &App, client: Option<std::net::IpAddr>) {
    if let Ok(mut t) = app.throttle.lock() {
        t.give_back(client);
    }
}

/// 429 with `Retry-After`.
pub fn too_many(api: bool, wait: std::time::Duration) -> Response {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut r = refuse(
        StatusCode::TOO_MANY_REQUESTS,
        api,
        &format!("too many wrong tokens: try again in {secs} s"),
    );
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    secure(r)
}

/// The only paths served without the token: the page's two files.
const ASSETS: [&str; 2] = ["/assets/style.css", "/assets/app.js"];

/// The Content-Security-Policy of every response: our own files only, no
/// inline script or style, no framing, forms post to us only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

fn refuse(status: StatusCode, api: bool, message: &str) -> Response {
    if api {
        (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
    } else {
        (status, message.to_string()).into_response()
    }
}

fn header_str(headers: &HeaderMap, name: impl header::AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Runs the checks, then the route, then adds the security headers.
pub async fn guard(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let api = path.starts_with("/api/");
    let headers = req.headers();
    let host = header_str(headers, header::HOST);
    let token = app.opts.auth_token.as_deref();
    if !web_guard::host_allowed(
        host,
        app.opts.listen,
        token.is_some(),
        &app.opts.allow_hosts,
    ) {
        return secure(refuse(
            StatusCode::MISDIRECTED_REQUEST,
            api,
            "this server does not answer to that Host: open it by 127.0.0.1 or localhost, or \
             start it with --allow-host NAME",
        ));
    }
    let is_asset = ASSETS.contains(&path.as_str());
    let is_get = req.method() == Method::GET || req.method() == Method::HEAD;
    let site = header_str(headers, "sec-fetch-site");
    let mode = header_str(headers, "sec-fetch-mode");
    let dest = header_str(headers, "sec-fetch-dest");
    if !web_guard::fetch_allowed(site, mode, dest, is_get, is_asset) {
        return secure(refuse(
            StatusCode::FORBIDDEN,
            api,
            "this request comes from another site's page: refused (open the page itself)",
        ));
    }
    if is_get && web_guard::asks_to_continue(site, mode, &path) {
        let target = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| path.clone());
        return secure(super::pages::frame::continue_page(&target));
    }
    let client = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let given_bearer = header_str(headers, header::AUTHORIZATION).and_then(web_guard::bearer);
    let given_cookie = header_str(headers, header::COOKIE)
        .and_then(|c| web_guard::cookie(c, web_guard::TOKEN_COOKIE));
    // A token given is a guess: it takes a try of the throttle before it
    // is compared, and a right one gives it back.
    if token.is_some() && (given_bearer.is_some() || given_cookie.is_some()) {
        if let Err(wait) = take_try(&app, client) {
            return too_many(api, wait);
        }
    }
    let bearer = given_bearer
        .zip(token)
        .is_some_and(|(given, t)| web_guard::same_secret(given, t));
    if let Some(expected_cookie) = app.login_cookie.as_deref() {
        let cookie =
            given_cookie.is_some_and(|given| web_guard::same_secret(given, expected_cookie));
        if bearer || cookie {
            give_back(&app, client);
        }
        let open = path == "/login" || is_asset;
        if !bearer && !cookie && !open {
            if api || req.method() != Method::GET {
                return secure(refuse(
                    StatusCode::UNAUTHORIZED,
                    api,
                    "the token is missing or wrong: send Authorization: Bearer TOKEN, or log in",
                ));
            }
            return secure(Redirect::to("/login").into_response());
        }
    }
    if req.method() == Method::POST {
        if !web_guard::origin_allowed(header_str(headers, header::ORIGIN), host) {
            return secure(refuse(
                StatusCode::FORBIDDEN,
                api,
                "this request comes from another site's page: refused",
            ));
        }
        if app.opts.read_only && path != "/login" {
            return secure(refuse(
                StatusCode::FORBIDDEN,
                api,
                "this server is read-only (--read-only): no action runs",
            ));
        }
    } else if req.method() != Method::GET && req.method() != Method::HEAD {
        return secure(refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            api,
            "only GET and POST are served",
        ));
    }
    req.extensions_mut().insert(Authed { bearer });
    req.extensions_mut().insert(Client(client));
    secure(next.run(req).await)
}

/// Adds the security headers; pages and API answers are never cached (they
/// hold message bodies).
fn secure(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: with it, Chromium sends `Origin: null` on the
    // page's own form posts, which the origin check must refuse.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

/// Whether a POST carries this server's CSRF token (a form's `csrf` field
/// or the `X-CSRF-Token` header), or came with the bearer token.
pub fn csrf_ok(
    app: &App,
    authed: Option<&Authed>,
    headers: &HeaderMap,
    field: Option<&str>,
) -> bool {
    if authed.is_some_and(|a| a.bearer) {
        return true;
    }
    let given = field.or_else(|| headers.get("x-csrf-token").and_then(|v| v.to_str().ok()));
    given.is_some_and(|g| web_guard::same_secret(g, &app.csrf))
}
