//! The actions: their forms, the jobs they start, the jobs' pages and the
//! export download.

use super::parts::*;

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
                dt { "Started" } dd { (when_text(Some(&j.started_at), now_ms())) }
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
    let page = job_at(&app.jobs, path).map(|j| job_page(&app, &j.view()));
    respond(&app, page)
}

/// `GET /jobs`.
pub async fn jobs(State(app): Shared) -> Response {
    let all = app.jobs.all();
    let now = now_ms();
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
                            td { (when_text(Some(&j.started_at), now)) }
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
    match job_at(&app.jobs, path) {
        Ok(j) => {
            j.cancel.cancel();
            Redirect::to(&format!("/jobs/{}", j.id())).into_response()
        }
        Err(f) => error_page(&app, &f),
    }
}

/// `GET /jobs/{id}/download`: an export job's file.
pub async fn download(State(app): Shared, path: Result<Path<u64>, PathRejection>) -> Response {
    let job = match job_at(&app.jobs, path) {
        Ok(j) => j,
        Err(f) => return error_page(&app, &f),
    };
    let id = job.id();
    let Some((path, name)) = job.download_file() else {
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
}
