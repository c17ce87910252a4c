//! `/api/…`: the pages' data as JSON, in the shapes the CLI's `--json`
//! prints (README, "The web page's API").

use super::guard::{csrf_ok, Authed};
use super::jobs::{JobView, Request};
use super::state::App;
use super::{Fail, PAGE_SIZE};
use crate::core::select::Selector;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};
use std::sync::Arc;

type Shared = State<Arc<App>>;

fn fail(f: Fail) -> Response {
    let mut body = json!({ "error": f.message });
    if let Some(id) = f.job {
        body["job"] = json!(id);
    }
    (f.status, Json(body)).into_response()
}

fn answer<T: serde::Serialize>(r: Result<T, Fail>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(f) => fail(f),
    }
}

/// `GET /api/session`: the CSRF token a script sends as `X-CSRF-Token`,
/// and whether actions are on.
pub async fn session(State(app): Shared) -> Response {
    Json(json!({
        "csrf_token": app.csrf,
        "read_only": app.opts.read_only,
        "auth": app.opts.auth_token.is_some(),
    }))
    .into_response()
}

/// `GET /api/overview`.
pub async fn overview(State(app): Shared) -> Response {
    answer(app.overview().await.map_err(Fail::from))
}

/// `GET /api/pipelines/{pipeline}/summary`: `dlq summary --json`, with when
/// it was made and whether it is fresh.
pub async fn summary(State(app): Shared, Path(pipeline): Path<String>) -> Response {
    let r = async {
        let p = app.pipeline(&pipeline)?;
        Ok(app.summary(p).await?)
    }
    .await;
    answer(r)
}

/// The query of `/api/pipelines/{pipeline}/messages`.
#[derive(Debug, serde::Deserialize)]
pub struct MessagesQuery {
    group: Option<String>,
    message_id: Option<String>,
    offset: Option<u16>,
    limit: Option<u16>,
}

/// `GET /api/pipelines/{pipeline}/messages?group=&message_id=&offset=&limit=`:
/// `dlq peek --json`, a page at a time.
pub async fn messages(
    State(app): Shared,
    Path(pipeline): Path<String>,
    Query(q): Query<MessagesQuery>,
) -> Response {
    let r = async {
        let p = app.pipeline(&pipeline)?;
        let selector = Selector {
            group: q.group.clone(),
            message_ids: q.message_id.iter().cloned().collect(),
            ..Selector::default()
        };
        let limit = q.limit.unwrap_or(PAGE_SIZE);
        let offset = q.offset.unwrap_or(0);
        if u32::from(offset) + u32::from(limit) > u32::from(crate::ops::dlq::MAX_PEEK) {
            return Err(Fail::bad_request(format!(
                "offset + limit is at most {}",
                crate::ops::dlq::MAX_PEEK
            )));
        }
        Ok(app.peek(p, &selector, offset, limit).await?)
    }
    .await;
    answer(r)
}

/// A job, with its DLQ's count now: `dlq_ready`, the ready messages, and
/// `dlq_messages`, those plus the ones a running job holds unacked (read
/// and not yet moved or removed: they are still in the DLQ, and go back
/// to it if the job stops).
async fn job_json(app: &App, j: JobView) -> Value {
    let ready = app.ready(&j.dlq).await.ok().flatten();
    let held = if j.state == super::jobs::State::Running {
        j.progress.read.saturating_sub(j.progress.done)
    } else {
        0
    };
    let mut v = serde_json::to_value(&j).unwrap_or_default();
    v["dlq_ready"] = json!(ready);
    v["dlq_messages"] = json!(ready.map(|r| r + held));
    v
}

/// `POST /api/pipelines/{pipeline}/{replay|export|purge}`: starts a job
/// (202, the job); the body is JSON: `group`, `message_ids`, and `rate`,
/// `canary`, `canary_wait_ms` for a replay or `expected` for a purge.
pub async fn action(
    State(app): Shared,
    Path((pipeline, verb)): Path<(String, String)>,
    authed: Option<Extension<Authed>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !csrf_ok(&app, authed.as_deref(), &headers, None) {
        return fail(Fail::forbidden(
            "send the X-CSRF-Token header (GET /api/session gives it) or Authorization: Bearer",
        ));
    }
    if !matches!(verb.as_str(), "replay" | "export" | "purge") {
        return fail(Fail::not_found(format!(
            "no action {verb:?}: replay, export or purge"
        )));
    }
    let mut v: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return fail(Fail::bad_request("the body must be a JSON object")),
            Err(e) => return fail(Fail::bad_request(format!("the body is not JSON: {e}"))),
        }
    };
    v["action"] = json!(verb);
    let request: Request = match serde_json::from_value(v) {
        Ok(r) => r,
        Err(e) => return fail(Fail::bad_request(format!("bad request body: {e}"))),
    };
    match app.jobs.start(&app, &pipeline, request) {
        Ok(id) => {
            let view = app.jobs.get(id).map(|j| j.view());
            let v = match view {
                Some(j) => job_json(&app, j).await,
                None => json!({ "id": id }),
            };
            (StatusCode::ACCEPTED, Json(v)).into_response()
        }
        Err(f) => fail(f),
    }
}

/// `GET /api/jobs`: every job of this server run, newest first.
pub async fn jobs(State(app): Shared) -> Response {
    Json(app.jobs.all()).into_response()
}

/// `GET /api/jobs/{id}`: a job, with `dlq_ready` and `dlq_messages`, its
/// DLQ's counts now.
pub async fn job(State(app): Shared, Path(id): Path<u64>) -> Response {
    match app.jobs.get(id) {
        Some(j) => Json(job_json(&app, j.view()).await).into_response(),
        None => fail(Fail::not_found(format!("no job {id}"))),
    }
}

/// `POST /api/jobs/{id}/cancel`: stops the job after its copies in flight.
pub async fn cancel(
    State(app): Shared,
    Path(id): Path<u64>,
    authed: Option<Extension<Authed>>,
    headers: HeaderMap,
) -> Response {
    if !csrf_ok(&app, authed.as_deref(), &headers, None) {
        return fail(Fail::forbidden(
            "send the X-CSRF-Token header or Authorization: Bearer",
        ));
    }
    match app.jobs.get(id) {
        Some(j) => {
            j.cancel.cancel();
            Json(j.view()).into_response()
        }
        None => fail(Fail::not_found(format!("no job {id}"))),
    }
}
