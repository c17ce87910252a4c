//! The health probe of a pipeline (`dead_letter.redrive.health.http`):
//! one `GET`, healthy on a 2xx answer. Automatic redrive asks it before a
//! run, and the worker's circuit breaker asks it instead of spending a
//! message when it is half-open.

use std::time::Duration;

/// How long the health probe may take.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET url`: healthy on a 2xx answer (redirects are not followed).
/// Returns what it answered (`200 OK`, `503 Service Unavailable`, or the
/// error).
///
/// A URL no request can be built from (`crate::urls::http`) is not asked:
/// the answer says it is a configuration error.
pub async fn probe(url: &str) -> (bool, String) {
    crate::secrets::register_url(url);
    if let Err(why) = crate::urls::http(url) {
        return (
            false,
            format!("nothing: configuration error, no request can be built from it ({why})"),
        );
    }
    let client = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(HEALTH_TIMEOUT)
        .build()
    {
        Ok(c) => c,
        Err(e) => return (false, format!("no HTTP client: {e}")),
    };
    match client.get(url).send().await {
        Ok(r) => (r.status().is_success(), r.status().to_string()),
        Err(e) => (false, crate::handler::http::error_chain(e.without_url())),
    }
}
