//! An HTTP dependency a test turns off and on: `POST /hook` (the worker's
//! `--http` handler) answers 200 while it is up and 503 while it is down,
//! and `GET /health` says the same; every call is recorded by its
//! `Idempotency-Key` (the message id).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the dependency saw.
#[derive(Default)]
struct Seen {
    /// Calls per message id: (answered 200, answered 503).
    calls: BTreeMap<String, (u32, u32)>,
    /// Health probes answered.
    probes: u32,
}

/// A running dependency, stopped when dropped.
pub struct Dependency {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    server: tokio::task::JoinHandle<()>,
}

impl Dependency {
    /// Starts it on a free loopback port, up or down.
    pub async fn start(up: bool) -> Dependency {
        use axum::http::{HeaderMap, StatusCode};
        let up = Arc::new(AtomicBool::new(up));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let hook = {
            let (up, seen) = (up.clone(), seen.clone());
            move |headers: HeaderMap| {
                let (up, seen) = (up.clone(), seen.clone());
                async move {
                    let id = headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let ok = up.load(Ordering::SeqCst);
                    let mut seen = seen.lock().unwrap();
                    let e = seen.calls.entry(id).or_default();
                    if ok {
                        e.0 += 1;
                        (StatusCode::OK, "ok")
                    } else {
                        e.1 += 1;
                        (StatusCode::SERVICE_UNAVAILABLE, "down")
                    }
                }
            }
        };
        let health = {
            let (up, seen) = (up.clone(), seen.clone());
            move || {
                let (up, seen) = (up.clone(), seen.clone());
                async move {
                    seen.lock().unwrap().probes += 1;
                    if up.load(Ordering::SeqCst) {
                        (StatusCode::OK, "healthy")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy")
                    }
                }
            }
        };
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(hook))
            .route("/health", axum::routing::get(health));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Dependency {
            addr,
            up,
            seen,
            server,
        }
    }

    /// The handler's URL (`--http`).
    pub fn hook(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// The health probe's URL.
    pub fn health(&self) -> String {
        format!("http://{}/health", self.addr)
    }

    /// Turns it on or off.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }

    /// Message ids answered 200, with how often.
    pub fn successes(&self) -> BTreeMap<String, u32> {
        self.answered(|(ok, _)| ok)
    }

    /// Message ids answered 503, with how often.
    pub fn failures(&self) -> BTreeMap<String, u32> {
        self.answered(|(_, down)| down)
    }

    /// Message ids with how often `count` (of a call's counts) says they
    /// were answered, those answered at least once.
    fn answered(&self, count: impl Fn((u32, u32)) -> u32) -> BTreeMap<String, u32> {
        let seen = self.seen.lock().unwrap();
        seen.calls
            .iter()
            .map(|(id, counts)| (id.clone(), count(*counts)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Health probes answered so far.
    pub fn probes(&self) -> u32 {
        self.seen.lock().unwrap().probes
    }

    /// Waits until `n` distinct messages were answered 200; panics after
    /// `deadline` with `context()`.
    pub async fn wait_successes(&self, n: usize, deadline: Duration, context: impl Fn() -> String) {
        let start = Instant::now();
        while self.successes().len() < n {
            if start.elapsed() > deadline {
                panic!(
                    "wanted {n} messages handled within {deadline:?}, got {}:\n{}",
                    self.successes().len(),
                    context()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Dependency {
    fn drop(&mut self) {
        self.server.abort();
    }
}
