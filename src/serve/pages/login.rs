//! The login form, the login, and the page of an unknown address.

use super::parts::*;

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
    client: Option<axum::Extension<crate::serve::guard::Client>>,
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
    if let Err(wait) = crate::serve::guard::take_try(&app, client) {
        return crate::serve::guard::too_many(false, wait);
    }
    let right = crate::serve::web_guard::same_secret(&given, expected);
    if right {
        crate::serve::guard::give_back(&app, client);
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
