//! `dlqctl serve`: a web page for DLQ triage. Every read and every action
//! calls the same library code as `dlqctl status` and `dlqctl dlq …`
//! ([`crate::ops`]); this module adds the pages, the jobs that run the
//! actions in the background, and the guard in front of them. It stores
//! nothing of its own: the broker is the database, and what the page knows
//! of the past (the chart's hour, the last summary of each DLQ, the jobs)
//! lives in memory until the server stops.
//!
//! - [`state`]: the server's state, its broker connections and sampler.
//! - [`jobs`]: replay, export and purge as cancellable background jobs.
//! - `guard`: the host, token, origin and CSRF checks.
//! - `pages` and `api`: the HTML pages and their JSON twins.

mod api;
mod assets;
pub mod body_view;
mod flight;
mod guard;
pub mod history;
pub mod jobs;
mod pages;
pub mod state;
pub mod web_guard;

pub use state::{App, ServeOptions};

use crate::error::{Error, Result};
use axum::http::StatusCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Messages a group page shows at once.
pub const PAGE_SIZE: u16 = 50;

/// Binds the listen address: a port in use is a runtime failure, named.
pub async fn bind(listen: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::Broker {
            context: format!("cannot listen on {listen}"),
            message: e.to_string(),
        })
}

/// Serves until `stop` is cancelled, then cancels the running jobs and
/// waits for each to stop after its copies in flight (nothing is lost:
/// what a job had not settled stays in the DLQ).
pub async fn run(
    opts: ServeOptions,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
) -> Result<()> {
    let app = Arc::new(App::new(opts, stop.clone()));
    let sampler = tokio::spawn(state::sample(app.clone()));
    let router = router(app.clone());
    // With the client's address, which the token throttle is kept by.
    let router = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
    let served = axum::serve(listener, router)
        .with_graceful_shutdown({
            let stop = stop.clone();
            async move { stop.cancelled().await }
        })
        .await;
    sampler.abort();
    app.shut_down().await;
    served.map_err(|e| Error::Broker {
        context: "the web server stopped".into(),
        message: e.to_string(),
    })
}

/// Every route.
pub fn router(app: Arc<App>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/", get(pages::overview))
        .route("/pipelines/{pipeline}", get(pages::dlq))
        .route("/pipelines/{pipeline}/groups/{group}", get(pages::group))
        .route("/pipelines/{pipeline}/message", get(pages::message))
        .route("/pipelines/{pipeline}/actions", post(pages::action))
        .route("/jobs", get(pages::jobs))
        .route("/jobs/{id}", get(pages::job))
        .route("/jobs/{id}/cancel", post(pages::cancel))
        .route("/jobs/{id}/download", get(pages::download))
        .route("/login", get(pages::login_form).post(pages::login))
        .route("/assets/{name}", get(assets::asset))
        .route("/api/session", get(api::session))
        .route("/api/overview", get(api::overview))
        .route("/api/pipelines/{pipeline}/summary", get(api::summary))
        .route("/api/pipelines/{pipeline}/messages", get(api::messages))
        .route("/api/pipelines/{pipeline}/{action}", post(api::action))
        .route("/api/jobs", get(api::jobs))
        .route("/api/jobs/{id}", get(api::job))
        .route("/api/jobs/{id}/cancel", post(api::cancel))
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            guard::guard,
        ))
        .with_state(app)
}

/// Why a request failed: its status and a sentence for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong and what to do.
    pub message: String,
    /// The running job that caused a conflict, when one did.
    pub job: Option<u64>,
}

impl Fail {
    /// A failure with `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Fail {
            status,
            message: message.into(),
            job: None,
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Fail::new(StatusCode::NOT_FOUND, message)
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Fail::new(StatusCode::BAD_REQUEST, message)
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Fail::new(StatusCode::FORBIDDEN, message)
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::Busy { .. } => StatusCode::CONFLICT,
            Error::Usage(_) | Error::Invalid(_) | Error::Url { .. } => StatusCode::BAD_REQUEST,
            Error::Read { .. } | Error::Write { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            Error::Connect { .. } | Error::Broker { .. } | Error::Management { .. } => {
                StatusCode::BAD_GATEWAY
            }
        };
        Fail::new(status, e.to_string())
    }
}

/// The job a `/jobs/{id}` address names: 404 for an id that is no
/// number or no job of this server run.
pub(crate) fn job_at(
    app: &App,
    path: Result<axum::extract::Path<u64>, axum::extract::rejection::PathRejection>,
) -> Result<Arc<jobs::Job>, Fail> {
    let Ok(axum::extract::Path(id)) = path else {
        return Err(Fail::not_found("no such job: job ids are numbers"));
    };
    app.jobs
        .get(id)
        .ok_or_else(|| Fail::not_found(format!("no job {id} (jobs live as long as the server)")))
}

/// A path segment, percent-encoded (everything but `A-Z a-z 0-9 - . _ ~`,
/// and the dots too of a segment of dots alone, which a browser would
/// resolve as `.` or `..`).
pub(crate) fn seg(s: &str) -> String {
    let dots_only = s.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~');
        if plain || (b == b'.' && !dots_only) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query value, percent-encoded.
pub(crate) fn query_value(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_keep_only_unreserved_bytes() {
        assert_eq!(seg("orders.v2-x_y~"), "orders.v2-x_y~");
        assert_eq!(seg("a/b c?d#é"), "a%2Fb%20c%3Fd%23%C3%A9");
        assert_eq!(seg(".."), "%2E%2E");
        assert_eq!(seg("a.."), "a..");
        assert_eq!(query_value("a b&c=d"), "a+b%26c%3Dd");
    }

    #[test]
    fn library_errors_map_to_statuses() {
        let busy = Error::Busy {
            queue: "q.dlq".into(),
            message: "held".into(),
        };
        assert_eq!(Fail::from(busy).status, StatusCode::CONFLICT);
        assert_eq!(
            Fail::from(Error::Usage("x".into())).status,
            StatusCode::BAD_REQUEST
        );
        let broker = Error::Broker {
            context: "c".into(),
            message: "m".into(),
        };
        assert_eq!(Fail::from(broker).status, StatusCode::BAD_GATEWAY);
    }
}
