//! `dlqctl serve`: a web page for DLQ triage. Every read and every action
//! calls the same library code as `dlqctl status` and `dlqctl dlq …`
//! ([`dlqctl::ops`]); this module adds the pages, the jobs that run the
//! actions in the background, and the guard in front of them. It stores
//! nothing of its own: the broker is the database, and what the page knows
//! of the past (the chart's hour, the last summary of each DLQ, the jobs)
//! lives in memory until the server stops.
//!
//! - `state`: the server's state, its broker connections and sampler.
//! - `jobs`: replay, export and purge as cancellable background jobs.
//! - `guard`: the host, token, origin and CSRF checks.
//! - `pages` and `api`: the HTML pages and their JSON twins.

mod api;
mod assets;
pub mod body_view;
pub mod chart;
mod common;
mod flight;
mod guard;
pub mod history;
pub(crate) mod jobs;
mod launch;
mod pages;
pub(crate) mod state;
pub mod web_guard;
pub mod when;

pub use state::{App, ServeOptions};

use dlqctl::error::{Error, Result};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

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

/// How long `/readyz` waits for the broker before answering 503.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `/readyz`: 200 when the broker answers (the status connection is open,
/// or opens), else 503. Its body says no more than that: it is served
/// without the token.
async fn readyz(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
) -> (axum::http::StatusCode, &'static str) {
    use axum::http::StatusCode;
    match tokio::time::timeout(READY_TIMEOUT, app.broker_reachable()).await {
        Ok(Ok(())) => (StatusCode::OK, "ready: broker reachable\n"),
        Ok(Err(e)) => {
            tracing::debug!("serve: /readyz: {e}");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: broker unreachable\n",
            )
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: broker unreachable (no answer within 3 s)\n",
        ),
    }
}

/// Every route. `/healthz` and `/readyz` are outside the guard (no token,
/// any `Host`): a supervisor's probe has neither, and they tell nothing
/// but alive and whether the broker answers.
pub(crate) fn router(app: Arc<App>) -> axum::Router {
    use axum::routing::{get, post};
    let probes = axum::Router::new()
        .route("/healthz", get(|| async { "ok: alive\n" }))
        .route("/readyz", get(readyz))
        .with_state(app.clone());
    let guarded = axum::Router::new()
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
        .with_state(app);
    probes.merge(guarded)
}
