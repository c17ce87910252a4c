//! The worker's HTTP endpoints (`work --metrics-addr`): `/metrics`,
//! `/healthz` and `/readyz`. The library renders the metrics and answers
//! readiness; serving them over HTTP is the command's (an embedder serves
//! [`dlqctl::Metrics::render`] on its own server).

/// Binds the metrics address once; the listener's `local_addr` is the
/// port really bound (for `:0`, the one the kernel chose).
pub(crate) async fn bind(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves `GET /metrics`, `/healthz` (200 while the process answers) and
/// `/readyz` (see [`readiness`](dlqctl::worker::metrics::readiness)) on `listener` until the token is
/// cancelled.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    metrics: std::sync::Arc<dlqctl::Metrics>,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;
    let for_metrics = metrics.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = for_metrics.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.render(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok: alive\n" }))
        .route(
            "/readyz",
            get(move || {
                let m = metrics.clone();
                async move {
                    let (code, text) = dlqctl::worker::metrics::readiness(&m);
                    (
                        StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                        text,
                    )
                }
            }),
        )
        .route(
            "/",
            get(|| async {
                "dlqctl work: /metrics (Prometheus), /healthz (alive), /readyz (consuming, settles going through)\n"
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}
