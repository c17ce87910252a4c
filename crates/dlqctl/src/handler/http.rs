//! `--http URL`: POST each message to a URL.
//!
//! The request carries the body unchanged, `Content-Type` (the message's,
//! `application/octet-stream` when it has none), `Idempotency-Key` (the
//! message id; omitted when the message has none) and `X-Retry-Attempt`
//! (the attempt number, 1 on the first run).
//!
//! | response | outcome |
//! |---|---|
//! | 2xx | success |
//! | 408, 425, 429, 5xx; a connection or protocol error | transient |
//! | no response within the timeout | timed out (decided like transient; its outcome is unknown) |
//! | 429 or 503 with `Retry-After` | transient, with that delay as `retry_after` |
//! | other 4xx | permanent |
//! | 1xx, 3xx | permanent: redirects are not followed, so the URL is wrong for every message |
//! | a non-standard status ≥ 600 | transient, like a server error |
//!
//! Both are sent as their bytes, so a message id or content type that is
//! not UTF-8 (RabbitMQ passes short strings through as bytes) arrives as it
//! was published. A message whose content type or message id cannot be sent
//! as an HTTP header value (control characters) fails permanently.
//!
//! The error text is the status line and at most the first 512 bytes of the
//! response body (`HTTP 503 Service Unavailable: down for maintenance`);
//! only that much of the body is read. Error texts name the URL without its
//! user info, query or fragment, so credentials in the URL never reach logs
//! or message headers.
//!
//! The timeout covers the whole exchange: connecting, sending, and reading
//! the response. Under the idempotency guard the request is not cut at
//! the timeout (the endpoint may be working on it): the run answers
//! "timed out" and the request goes on in the background, up to the
//! in-doubt time, its answer given to [`HandlerMessage::late`] (a late
//! success marks the key, a late failure releases it). Proxies configured through the usual environment variables
//! (`HTTPS_PROXY`, `NO_PROXY`, ...) are used.

use std::error::Error as _;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderValue, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use reqwest::{Client, Response, StatusCode, Url};

use super::{Handler, HandlerMessage};
use crate::core::handling::outcome::Outcome;
use crate::core::values::duration::tier_name;

/// At most this much of an error response's body goes into the error text.
pub(crate) const ERROR_BODY_BYTES: usize = 512;

/// The longest `Retry-After` honoured: 2³² − 1 ms (about 49.7 days).
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_millis(u32::MAX as u64);

/// The content type sent when the message has none.
pub(crate) const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// Why an [`HttpHandler`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpHandlerError {
    /// The URL does not parse.
    #[error("invalid handler URL: {0}")]
    InvalidUrl(String),
    /// The URL is not `http` or `https`.
    #[error("handler URL must be http or https, not `{0}`")]
    UnsupportedScheme(String),
    /// The HTTP client could not be set up (TLS roots, ...).
    #[error("cannot set up the HTTP client: {0}")]
    Client(String),
}

/// POSTs each message to a URL; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct HttpHandler {
    url: Url,
    shown_url: String,
    timeout: Duration,
    client: Client,
}

impl HttpHandler {
    /// A handler that POSTs to `url` (a `&str`, `String` or [`Url`]) and
    /// gives up after `timeout`. Redirects are not followed.
    pub fn new(url: impl AsRef<str>, timeout: Duration) -> Result<Self, HttpHandlerError> {
        let client = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .build()
            .map_err(|e| HttpHandlerError::Client(error_chain(e.without_url())))?;
        Self::with_client(url, timeout, client)
    }

    /// Like [`new`](Self::new), with a client the caller configured (TLS,
    /// proxies, connection pool). `timeout` is applied to every request;
    /// whether redirects are followed is up to the client.
    pub(crate) fn with_client(
        url: impl AsRef<str>,
        timeout: Duration,
        client: Client,
    ) -> Result<Self, HttpHandlerError> {
        crate::secrets::register_url(url.as_ref());
        if let Ok(u) = Url::parse(url.as_ref()) {
            if u.scheme() != "http" && u.scheme() != "https" {
                return Err(HttpHandlerError::UnsupportedScheme(u.scheme().to_string()));
            }
        }
        let url = crate::urls::http(url.as_ref()).map_err(HttpHandlerError::InvalidUrl)?;
        Ok(HttpHandler {
            shown_url: redacted(&url),
            url,
            timeout,
            client,
        })
    }

    /// The URL without user info, query or fragment, as error texts show it.
    pub fn shown_url(&self) -> &str {
        &self.shown_url
    }

    /// The time a request may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `msg` and waits for the answer up to the timeout. When a
    /// late answer is waited for ([`HandlerMessage::late`]: the
    /// idempotency guard), the request is not cut at the timeout: it goes
    /// on in a task of its own, up to that wait, and its answer is given
    /// there; the run answers [`Outcome::TimedOut`] at the timeout.
    async fn run(&self, msg: &HandlerMessage) -> Outcome {
        let request = match self.request(msg) {
            Ok(request) => request,
            Err(refused) => return refused,
        };
        let Some(wait) = msg.late.wait() else {
            return self.exchange(request.timeout(self.timeout)).await;
        };
        let this = self.clone();
        let request = request.timeout(self.timeout.saturating_add(wait));
        let mut exchange = Box::pin(async move { this.exchange(request).await });
        match tokio::time::timeout(self.timeout, &mut exchange).await {
            Ok(outcome) => outcome,
            Err(_) => {
                let late = msg.late.clone();
                tokio::spawn(async move { late.answer(Some(exchange.await)) });
                Outcome::timed_out(format!(
                    "POST {}: timed out after {}",
                    self.shown_url,
                    tier_name(u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX))
                ))
            }
        }
    }

    /// The request for `msg`, or the permanent failure of a message whose
    /// headers cannot be sent.
    fn request(&self, msg: &HandlerMessage) -> Result<reqwest::RequestBuilder, Outcome> {
        // HTTP header values are bytes: a content type or message id that
        // is not UTF-8 is sent as its bytes, like any other.
        let content_type = msg
            .content_type_bytes()
            .unwrap_or(DEFAULT_CONTENT_TYPE.as_bytes());
        let Ok(content_type) = HeaderValue::from_bytes(content_type) else {
            return Err(Outcome::permanent(format!(
                "content type {:?} cannot be sent as an HTTP header",
                String::from_utf8_lossy(content_type)
            )));
        };
        let mut request = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, content_type)
            .header("X-Retry-Attempt", msg.attempt)
            .body(msg.body.clone());
        if let Some(id) = msg.message_id_bytes() {
            let Ok(id) = HeaderValue::from_bytes(id) else {
                return Err(Outcome::permanent(format!(
                    "message id {:?} cannot be sent as an Idempotency-Key header",
                    String::from_utf8_lossy(id)
                )));
            };
            request = request.header("Idempotency-Key", id);
        }
        Ok(request)
    }

    /// Sends `request` and reads its outcome from the response.
    async fn exchange(&self, request: reqwest::RequestBuilder) -> Outcome {
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_timeout() => return Outcome::timed_out(self.describe_failure(e)),
            Err(e) => return Outcome::transient(self.describe_failure(e)),
        };
        let status = response.status();
        if status.is_success() {
            return Outcome::Success;
        }
        let retry_after = match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, SystemTime::now())),
            _ => None,
        };
        let location = if status.is_redirection() {
            response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| self.url.join(v).ok())
                .map(|u| redacted(&u))
        } else {
            None
        };
        let error = error_text(status, location.as_deref(), response).await;
        match class(status) {
            Class::Transient => Outcome::Transient { error, retry_after },
            Class::Permanent => Outcome::Permanent { error },
        }
    }

    fn describe_failure(&self, e: reqwest::Error) -> String {
        if e.is_timeout() {
            format!(
                "POST {}: timed out after {}",
                self.shown_url,
                tier_name(u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX))
            )
        } else {
            format!("POST {}: {}", self.shown_url, error_chain(e.without_url()))
        }
    }
}

impl Handler for HttpHandler {
    fn handle(&self, msg: &HandlerMessage) -> impl std::future::Future<Output = Outcome> + Send {
        self.run(msg)
    }
}

enum Class {
    Transient,
    Permanent,
}

fn class(status: StatusCode) -> Class {
    match status.as_u16() {
        408 | 425 | 429 | 500..=599 | 600.. => Class::Transient,
        _ => Class::Permanent,
    }
}

/// `HTTP 503 Service Unavailable: <first 512 bytes of the body>`.
async fn error_text(status: StatusCode, location: Option<&str>, mut response: Response) -> String {
    let mut text = format!("HTTP {}", status.as_u16());
    if let Some(reason) = status.canonical_reason() {
        text.push(' ');
        text.push_str(reason);
    }
    if status.is_redirection() {
        text.push_str(" (redirects are not followed");
        if let Some(location) = location {
            text.push_str("; Location: ");
            text.push_str(location);
        }
        text.push(')');
    }
    let (body, cut) = read_prefix(&mut response, ERROR_BODY_BYTES).await;
    let body = String::from_utf8_lossy(valid_prefix(&body, cut));
    let body = body.trim();
    if !body.is_empty() {
        text.push_str(": ");
        text.push_str(body);
        if cut {
            text.push('…');
        }
    }
    text
}

/// At most `limit` bytes of the body, and whether there was more. Stops
/// reading as soon as more than `limit` bytes arrived; a read error ends the
/// body where it is.
async fn read_prefix(response: &mut Response, limit: usize) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    return (body, true);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) | Err(_) => return (body, false),
        }
    }
}

/// Drops an incomplete UTF-8 sequence at the end of a cut body.
fn valid_prefix(bytes: &[u8], cut: bool) -> &[u8] {
    match std::str::from_utf8(bytes) {
        Err(e) if cut && e.error_len().is_none() => &bytes[..e.valid_up_to()],
        _ => bytes,
    }
}

/// The URL without user info, query and fragment: the core's
/// [`crate::core::values::redact::endpoint`], the one redaction's rule
/// for the HTTP URLs dlqctl calls.
pub fn redacted(url: &Url) -> String {
    crate::core::values::redact::endpoint(url.as_str())
}

/// An error and its sources, `: `-separated, skipping repeats.
pub(crate) fn error_chain(e: reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// Parses an HTTP `Retry-After` value: delta-seconds (`120`) or an
/// HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`, taken relative to `now`).
///
/// A date in the past gives zero. Values above [`MAX_RETRY_AFTER`] are
/// capped to it. Anything else (negative or fractional numbers, garbage,
/// an empty value) gives `None`.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        let delay = Duration::from_secs(secs.min(MAX_RETRY_AFTER.as_secs() + 1));
        return Some(delay.min(MAX_RETRY_AFTER));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let delay = at.duration_since(now).unwrap_or(Duration::ZERO);
    Some(delay.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, Bytes};
    use axum::extract::{Path, State};
    use axum::http::HeaderMap;
    use axum::routing::post;
    use axum::Router;
    use std::sync::{Arc, Mutex};

    type Seen = Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

    fn date(s: &str) -> SystemTime {
        httpdate::parse_http_date(s).unwrap()
    }

    #[test]
    fn retry_after_delta_seconds() {
        let now = SystemTime::now();
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(parse_retry_after("7", now), secs(7));
        assert_eq!(parse_retry_after(" 120 ", now), secs(120));
        assert_eq!(parse_retry_after("0", now), secs(0));
        assert_eq!(parse_retry_after("4294967", now), secs(4_294_967));
        assert_eq!(parse_retry_after("4294968", now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            parse_retry_after("99999999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        for garbage in ["", "  ", "-1", "+5", "1.5", "7s", "soon", "0x10", "7 8"] {
            assert_eq!(parse_retry_after(garbage, now), None, "{garbage:?}");
        }
    }

    #[test]
    fn retry_after_http_date() {
        let now = date("Wed, 21 Oct 2015 07:28:00 GMT");
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:30:00 GMT", now),
            secs(120)
        );
        // The obsolete formats HTTP still accepts.
        assert_eq!(
            parse_retry_after("Wednesday, 21-Oct-15 07:30:00 GMT", now),
            secs(120)
        );
        assert_eq!(parse_retry_after("Wed Oct 21 07:29:00 2015", now), secs(60));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            secs(0)
        );
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(
            parse_retry_after("Wed, 32 Oct 2015 07:30:00 GMT", now),
            None
        );
    }

    async fn record(State(seen): State<Seen>, headers: HeaderMap, body: Bytes) {
        seen.lock().unwrap().push((headers, body.to_vec()));
    }

    async fn status(Path(code): Path<u16>) -> (axum::http::StatusCode, &'static str) {
        (axum::http::StatusCode::from_u16(code).unwrap(), "  nope\n")
    }

    async fn serve(seen: Seen) -> String {
        let router = Router::new()
            .route("/ok", post(record))
            .route("/status/{code}", post(status))
            .route(
                "/429",
                post(|| async {
                    (
                        axum::http::StatusCode::TOO_MANY_REQUESTS,
                        [("retry-after", "7")],
                        "slow down",
                    )
                }),
            )
            .route(
                "/500-retry-after",
                post(|| async {
                    (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        [("retry-after", "7")],
                    )
                }),
            )
            .route(
                "/503",
                post(|| async {
                    let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
                    (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", at)],
                    )
                }),
            )
            .route(
                "/hang",
                post(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }),
            )
            .route(
                "/slow",
                post(|State(seen): State<Seen>, headers: HeaderMap| async move {
                    seen.lock().unwrap().push((headers, Vec::new()));
                    tokio::time::sleep(Duration::from_millis(800)).await;
                    "done"
                }),
            )
            .route(
                "/huge",
                post(|| async {
                    // An endless body: reading it all would never finish.
                    let chunks = futures_util::stream::repeat_with(|| {
                        Ok::<_, std::convert::Infallible>(Bytes::from(vec![b'e'; 8192]))
                    });
                    (
                        axum::http::StatusCode::BAD_GATEWAY,
                        Body::from_stream(chunks),
                    )
                }),
            )
            .route(
                "/redirect",
                post(|| async {
                    (
                        axum::http::StatusCode::FOUND,
                        [("location", "http://user:secret@example.com/next?token=abc")],
                    )
                }),
            )
            .with_state(seen);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        format!("http://{addr}")
    }

    /// The example message (only its body, content type, id and attempt
    /// are sent), as message `m-42` on its third attempt.
    fn msg(body: &[u8]) -> HandlerMessage {
        HandlerMessage {
            message_id: Some("m-42".into()),
            attempt: 3,
            ..HandlerMessage::example(body)
        }
    }

    const T: Duration = Duration::from_secs(10);

    /// The outcome of an empty message posted to `path` of `base`.
    async fn outcome_at(base: &str, path: impl std::fmt::Display) -> Outcome {
        let h = HttpHandler::new(format!("{base}{path}"), T).unwrap();
        h.handle(&msg(b"")).await
    }

    #[tokio::test]
    async fn success_sends_body_and_headers() {
        let seen = Seen::default();
        let base = serve(seen.clone()).await;
        let h = HttpHandler::new(format!("{base}/ok"), T).unwrap();
        let body = b"{\"id\":1}\0\xff".to_vec();
        assert_eq!(h.handle(&msg(&body)).await, Outcome::Success);

        let mut m = msg(b"raw");
        m.message_id = None;
        m.content_type = None;
        m.attempt = 1;
        assert_eq!(h.handle(&m).await, Outcome::Success);

        let seen = seen.lock().unwrap();
        let (headers, got) = &seen[0];
        assert_eq!(got, &body);
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["idempotency-key"], "m-42");
        assert_eq!(headers["x-retry-attempt"], "3");
        let (headers, got) = &seen[1];
        assert_eq!(got, b"raw");
        assert_eq!(headers["content-type"], "application/octet-stream");
        assert!(headers.get("idempotency-key").is_none());
        assert_eq!(headers["x-retry-attempt"], "1");
    }

    #[tokio::test]
    async fn non_utf8_id_and_content_type_are_sent_as_their_bytes() {
        let seen = Seen::default();
        let base = serve(seen.clone()).await;
        let h = HttpHandler::new(format!("{base}/ok"), T).unwrap();
        let mut m = msg(b"x");
        m.message_id = None;
        m.content_type = None;
        m.not_utf8.message_id = Some(b"\xff\xfe-bad".to_vec());
        m.not_utf8.content_type = Some(b"text/\xe9".to_vec());
        assert_eq!(h.handle(&m).await, Outcome::Success);
        let seen = seen.lock().unwrap();
        let (headers, _) = &seen[0];
        assert_eq!(headers["idempotency-key"].as_bytes(), b"\xff\xfe-bad");
        assert_eq!(headers["content-type"].as_bytes(), b"text/\xe9");
    }

    #[tokio::test]
    async fn statuses_map_to_outcomes() {
        let base = serve(Seen::default()).await;
        let at = |code: u16| outcome_at(&base, format!("/status/{code}"));
        assert_eq!(at(200).await, Outcome::Success);
        assert_eq!(at(204).await, Outcome::Success);
        for code in [400, 401, 404, 409, 422] {
            let out = at(code).await;
            assert!(matches!(out, Outcome::Permanent { .. }), "{code}: {out:?}");
        }
        for code in [408, 425, 500, 502, 504, 599] {
            let out = at(code).await;
            assert!(
                matches!(
                    out,
                    Outcome::Transient {
                        retry_after: None,
                        ..
                    }
                ),
                "{code}: {out:?}"
            );
        }
        assert_eq!(
            at(400).await,
            Outcome::permanent("HTTP 400 Bad Request: nope")
        );
        assert_eq!(
            at(500).await,
            Outcome::transient("HTTP 500 Internal Server Error: nope")
        );
    }

    #[tokio::test]
    async fn retry_after_on_429_and_503_only() {
        let base = serve(Seen::default()).await;
        assert_eq!(
            outcome_at(&base, "/429").await,
            Outcome::Transient {
                error: "HTTP 429 Too Many Requests: slow down".into(),
                retry_after: Some(Duration::from_secs(7)),
            }
        );
        let Outcome::Transient { error, retry_after } = outcome_at(&base, "/503").await else {
            panic!("not transient");
        };
        assert_eq!(error, "HTTP 503 Service Unavailable");
        let retry_after = retry_after.expect("Retry-After date honoured");
        assert!(
            (Duration::from_secs(110)..=Duration::from_secs(120)).contains(&retry_after),
            "{retry_after:?}"
        );
        assert_eq!(
            outcome_at(&base, "/500-retry-after").await,
            Outcome::transient("HTTP 500 Internal Server Error")
        );
    }

    #[tokio::test]
    async fn refused_connection_is_transient_without_credentials() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let h = HttpHandler::new(
            format!("http://user:secret@127.0.0.1:{port}/hook?token=abc"),
            T,
        )
        .unwrap();
        assert_eq!(h.shown_url(), format!("http://127.0.0.1:{port}/hook"));
        let Outcome::Transient { error, retry_after } = h.handle(&msg(b"")).await else {
            panic!("not transient");
        };
        assert_eq!(retry_after, None);
        assert!(
            error.starts_with(&format!("POST http://127.0.0.1:{port}/hook: ")),
            "{error}"
        );
        assert!(error.to_lowercase().contains("refused"), "{error}");
        assert!(
            !error.contains("secret") && !error.contains("token"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn hanging_server_times_out() {
        let base = serve(Seen::default()).await;
        let h = HttpHandler::new(format!("{base}/hang"), Duration::from_millis(300)).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(
            h.handle(&msg(b"")).await,
            Outcome::timed_out(format!("POST {base}/hang: timed out after 300ms"))
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// Under the guard (a late answer waited for), a request past the
    /// timeout is not cut: the run answers "timed out", the one request
    /// goes on, and its success comes as the late answer.
    #[tokio::test]
    async fn a_request_past_its_timeout_goes_on_and_answers_late() {
        let seen = Seen::default();
        let base = serve(seen.clone()).await;
        let h = HttpHandler::new(format!("{base}/slow"), Duration::from_millis(200)).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = Mutex::new(Some(tx));
        let mut m = msg(b"");
        m.late =
            crate::core::handling::message::LateAnswer::new(Duration::from_secs(10), move |late| {
                if let Some(tx) = tx.lock().unwrap().take() {
                    let _ = tx.send(late);
                }
            });
        assert_eq!(
            h.handle(&m).await,
            Outcome::timed_out(format!("POST {base}/slow: timed out after 200ms"))
        );
        let late = tokio::time::timeout(Duration::from_secs(5), rx).await;
        assert_eq!(late.unwrap().unwrap(), Some(Outcome::Success));
        assert_eq!(seen.lock().unwrap().len(), 1, "one request");
        // Without the guard the request is cut at the timeout, as before.
        let cut = h.handle(&msg(b"")).await;
        assert!(matches!(cut, Outcome::TimedOut { .. }), "{cut:?}");
    }

    #[tokio::test]
    async fn huge_error_body_is_cut() {
        let base = serve(Seen::default()).await;
        let expected = format!("HTTP 502 Bad Gateway: {}…", "e".repeat(ERROR_BODY_BYTES));
        assert_eq!(
            outcome_at(&base, "/huge").await,
            Outcome::transient(expected)
        );
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let base = serve(Seen::default()).await;
        assert_eq!(
            outcome_at(&base, "/redirect").await,
            Outcome::permanent(
                "HTTP 302 Found (redirects are not followed; Location: http://example.com/next)"
            )
        );
    }

    #[tokio::test]
    async fn unsendable_headers_are_permanent() {
        let base = serve(Seen::default()).await;
        let h = HttpHandler::new(format!("{base}/ok"), T).unwrap();
        let mut m = msg(b"");
        m.message_id = Some("a\nb".into());
        assert!(matches!(h.handle(&m).await, Outcome::Permanent { .. }));
        let mut m = msg(b"");
        m.content_type = Some("text/plain\r\nX-Evil: 1".into());
        assert!(matches!(h.handle(&m).await, Outcome::Permanent { .. }));
    }

    #[test]
    fn bad_urls_are_refused() {
        assert!(matches!(
            HttpHandler::new("ftp://example.com/x", T),
            Err(HttpHandlerError::UnsupportedScheme(s)) if s == "ftp"
        ));
        assert!(matches!(
            HttpHandler::new("not a url", T),
            Err(HttpHandlerError::InvalidUrl(_))
        ));
    }

    #[test]
    fn cut_utf8_is_not_mangled() {
        assert_eq!(valid_prefix("aé".as_bytes(), false), "aé".as_bytes());
        assert_eq!(valid_prefix(&"aé".as_bytes()[..2], true), b"a");
    }
}
