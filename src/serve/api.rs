//! `/api/…`: the pages' data as JSON, in the shapes the CLI's `--json`
//! prints (docs/serve.md, "The API").

use super::common::{Fail, PAGE_SIZE};
use super::guard::{csrf_ok, Authed};
use super::jobs::{JobView, Request};
use super::state::App;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use dlqctl::core::dlq::select::Selector;
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
pub async fn summary(State(app): Shared, path: Result<Path<String>, PathRejection>) -> Response {
    let r = async {
        let Path(pipeline) = path.map_err(super::pages::bad_path)?;
        let p = app.pipeline(&pipeline)?;
        Ok(app.summary(p).await?)
    }
    .await;
    answer(r)
}

/// The query of `/api/pipelines/{pipeline}/messages`.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct MessagesQuery {
    group: Option<String>,
    message_id: Option<String>,
    offset: Option<u16>,
    limit: Option<u16>,
}

/// `GET /api/pipelines/{pipeline}/messages?group=&message_id=&offset=&limit=`:
/// `dlq peek --json`, a page at a time.
pub async fn messages(
    State(app): Shared,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<MessagesQuery>, QueryRejection>,
) -> Response {
    let r = async {
        let Path(pipeline) = path.map_err(super::pages::bad_path)?;
        let Query(q) = query.map_err(super::pages::bad_query)?;
        let p = app.pipeline(&pipeline)?;
        let selector = Selector {
            group: q.group.clone(),
            message_ids: q.message_id.iter().cloned().collect(),
            ..Selector::default()
        };
        let limit = q.limit.unwrap_or(PAGE_SIZE);
        let offset = q.offset.unwrap_or(0);
        if u32::from(offset) + u32::from(limit) > u32::from(dlqctl::ops::dlq::MAX_PEEK) {
            return Err(Fail::bad_request(format!(
                "offset + limit is at most {}",
                dlqctl::ops::dlq::MAX_PEEK
            )));
        }
        Ok(app.peek(p, &selector, offset, limit).await?)
    }
    .await;
    answer(r)
}

/// A job, with its DLQ's count now: `dlq_ready`, the ready messages, and
/// `dlq_messages`, what the DLQ holds counting what a running job has
/// taken out of the ready count and not yet removed (see
/// [`JobView::dlq_holds`]).
async fn job_json(app: &App, j: JobView) -> Value {
    let ready = app.ready(&j.dlq).await.ok().flatten();
    let mut v = serde_json::to_value(&j).unwrap_or_default();
    v["dlq_ready"] = json!(ready);
    v["dlq_messages"] = json!(ready.map(|r| j.dlq_holds(r)));
    v
}

/// The body of an action: every field named, none unknown (a misspelt
/// selector must not widen the action to the whole DLQ).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    /// The summary group.
    group: Option<String>,
    /// Message ids (any of them).
    #[serde(default)]
    message_ids: Vec<String>,
    /// Every message of the DLQ: must be said, never implied.
    #[serde(default)]
    all: bool,
    /// Replay: messages per second at most.
    rate: Option<f64>,
    /// Replay: this many first, then wait for them.
    canary: Option<u64>,
    /// Replay: how long the canary waits, ms.
    canary_wait_ms: Option<u64>,
    /// Purge: the count confirmed, the most removed.
    expected: Option<u64>,
}

impl ActionBody {
    /// The job request of `verb`; refuses a field the verb does not take,
    /// and a selection that is neither given nor `"all": true`.
    fn request(self, verb: &str) -> Result<Request, Fail> {
        let selection = super::jobs::Selection {
            group: self.group,
            message_ids: self.message_ids,
        };
        if selection.is_everything() && !self.all {
            return Err(Fail::bad_request(
                "say which messages: \"group\", \"message_ids\", or \"all\": true for the whole DLQ",
            ));
        }
        if !selection.is_everything() && self.all {
            return Err(Fail::bad_request(
                "\"all\": true takes no \"group\" or \"message_ids\"",
            ));
        }
        let replay_only =
            self.rate.is_some() || self.canary.is_some() || self.canary_wait_ms.is_some();
        let action = match verb {
            "replay" if self.expected.is_none() => super::jobs::Action::Replay {
                rate: self.rate,
                canary: self.canary,
                canary_wait_ms: self.canary_wait_ms,
            },
            "export" if !replay_only && self.expected.is_none() => super::jobs::Action::Export,
            "purge" if !replay_only => super::jobs::Action::Purge {
                expected: self.expected.ok_or_else(|| {
                    Fail::bad_request("a purge needs \"expected\": the most messages it may remove")
                })?,
            },
            "replay" | "export" | "purge" => {
                return Err(Fail::bad_request(format!(
                    "{verb} does not take that option: rate, canary and canary_wait_ms are for \
                     replay, expected for purge"
                )))
            }
            other => {
                return Err(Fail::not_found(format!(
                    "no action {other:?}: replay, export or purge"
                )))
            }
        };
        Ok(Request { action, selection })
    }
}

/// `POST /api/pipelines/{pipeline}/{replay|export|purge}`: starts a job
/// (202, the job); the body is JSON: `group`, `message_ids` or `"all":
/// true`, and `rate`, `canary`, `canary_wait_ms` for a replay or
/// `expected` for a purge.
pub async fn action(
    State(app): Shared,
    path: Result<Path<(String, String)>, PathRejection>,
    authed: Option<Extension<Authed>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Path((pipeline, verb)) = match path {
        Ok(p) => p,
        Err(r) => return fail(super::pages::bad_path(r)),
    };
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
    let body: ActionBody = if body.iter().all(u8::is_ascii_whitespace) {
        ActionBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => return fail(Fail::bad_request(format!("bad request body: {e}"))),
        }
    };
    let request = match body.request(&verb) {
        Ok(r) => r,
        Err(f) => return fail(f),
    };
    if let Some(g) = request.selection.group.as_deref() {
        if let Err(f) = check_group(&app, &pipeline, g).await {
            return fail(f);
        }
    }
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

/// 400 when `group` is not a group of the pipeline's DLQ (by a summary
/// younger than [`super::state::GROUP_COUNT_FRESH_MS`], made now when
/// there is none), naming its groups. A DLQ that cannot be read now (busy,
/// say) is not checked: starting the job tells why.
async fn check_group(app: &App, pipeline: &str, group: &str) -> Result<(), Fail> {
    let p = app.pipeline(pipeline)?.clone();
    if app.jobs.running_on(&p.name).is_some() {
        // Starting the job says 409, naming the one running.
        return Ok(());
    }
    match app.group(&p, group).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => {
            let now = dlqctl::ops::dlq::now_ms();
            let Some(s) = app
                .cached_summary(&p.name)
                .filter(|s| now.saturating_sub(s.at_ms) < super::state::GROUP_COUNT_FRESH_MS)
            else {
                return Ok(());
            };
            let groups: Vec<(String, String, u64)> = s
                .report
                .groups
                .iter()
                .map(|g| {
                    let reason = g.reason.clone().unwrap_or_else(|| "unknown".into());
                    (g.id.clone(), reason, g.count)
                })
                .collect();
            Err(Fail::bad_request(dlqctl::core::dlq::select::unknown_group(
                group,
                &p.dead_letter.queue,
                &groups,
                false,
            )))
        }
        Err(dlqctl::error::Error::Busy { .. }) => Ok(()),
        Err(e) => Err(Fail::from(e)),
    }
}

/// `GET /api/jobs`: every job of this server run, newest first.
pub async fn jobs(State(app): Shared) -> Response {
    Json(app.jobs.all()).into_response()
}

/// `GET /api/jobs/{id}`: a job, with `dlq_ready` and `dlq_messages`, its
/// DLQ's counts now.
pub async fn job(State(app): Shared, path: Result<Path<u64>, PathRejection>) -> Response {
    match super::jobs::job_at(&app.jobs, path) {
        Ok(j) => Json(job_json(&app, j.view()).await).into_response(),
        Err(f) => fail(f),
    }
}

/// `POST /api/jobs/{id}/cancel`: stops the job after its copies in flight.
pub async fn cancel(
    State(app): Shared,
    path: Result<Path<u64>, PathRejection>,
    authed: Option<Extension<Authed>>,
    headers: HeaderMap,
) -> Response {
    if !csrf_ok(&app, authed.as_deref(), &headers, None) {
        return fail(Fail::forbidden(
            "send the X-CSRF-Token header or Authorization: Bearer",
        ));
    }
    match super::jobs::job_at(&app.jobs, path) {
        Ok(j) => {
            j.cancel.cancel();
            Json(j.view()).into_response()
        }
        Err(f) => fail(f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::jobs::Action;

    fn body(v: Value) -> Result<ActionBody, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn an_unknown_field_is_refused_not_ignored() {
        assert!(body(json!({"message_id": "m5"})).is_err());
        assert!(body(json!({"group": "g", "ratee": 5})).is_err());
        assert!(body(json!({"group": 5})).is_err());
    }

    #[test]
    fn the_whole_dlq_must_be_asked_for() {
        let e = body(json!({})).unwrap().request("replay").unwrap_err();
        assert!(e.message.contains("\"all\": true"), "{}", e.message);
        let r = body(json!({"all": true}))
            .unwrap()
            .request("export")
            .unwrap();
        assert!(r.selection.is_everything());
        assert!(body(json!({"all": true, "group": "g"}))
            .unwrap()
            .request("export")
            .is_err());
    }

    #[test]
    fn each_verb_takes_its_own_options_only() {
        let r = body(json!({"group": "g", "rate": 5, "canary": 2}))
            .unwrap()
            .request("replay")
            .unwrap();
        assert_eq!(
            r.action,
            Action::Replay {
                rate: Some(5.0),
                canary: Some(2),
                canary_wait_ms: None
            }
        );
        assert!(body(json!({"group": "g", "rate": 5}))
            .unwrap()
            .request("export")
            .is_err());
        assert!(body(json!({"group": "g", "expected": 1}))
            .unwrap()
            .request("replay")
            .is_err());
        assert!(body(json!({"group": "g"}))
            .unwrap()
            .request("purge")
            .is_err());
        let r = body(json!({"message_ids": ["a"], "expected": 1}))
            .unwrap()
            .request("purge")
            .unwrap();
        assert_eq!(r.action, Action::Purge { expected: 1 });
        assert_eq!(
            body(json!({"group": "g"}))
                .unwrap()
                .request("drop")
                .unwrap_err()
                .status,
            StatusCode::NOT_FOUND
        );
    }
}
