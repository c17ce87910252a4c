//! A running `dlqctl serve` for the web page's tests, and an HTTP client
//! that speaks to it as a browser or a script would.

use crate::support::Dlqctl;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `dlqctl serve FILE --listen 127.0.0.1:0 ARGS…`, killed when dropped.
pub struct Served {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// A client that follows no redirect and keeps no cookie.
    pub http: reqwest::Client,
}

/// An answer.
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}), HTTP {}: {}", self.status, self.text))
    }

    /// The job a form post redirected to (`Location: /jobs/N`).
    pub fn job_id(&self) -> u64 {
        self.headers["location"]
            .to_str()
            .ok()
            .and_then(|l| l.strip_prefix("/jobs/"))
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("no job in the redirect: {:?}", self.headers))
    }

    /// Panics unless the status is `want`.
    pub fn expect(self, want: u16) -> Self {
        assert_eq!(self.status.as_u16(), want, "{}", self.text);
        self
    }

    /// Panics when the body contains any of `parts`, showing it.
    #[track_caller]
    pub fn assert_lacks(&self, parts: &[&str]) -> &Self {
        for part in parts {
            assert!(!self.text.contains(part), "{part:?} in:\n{}", self.text);
        }
        self
    }
}

impl Served {
    /// Starts the server on a free port and waits until it says where.
    pub async fn start<S: AsRef<std::ffi::OsStr>>(file: &Path, args: &[S]) -> Served {
        let mut child = Dlqctl::new("serve")
            .arg(file)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("DLQCTL_AUTH_TOKEN")
            .spawn();
        let lines = crate::support::collect_output(&mut child);
        let start = Instant::now();
        let base = loop {
            let found = lines.lock().unwrap().iter().find_map(|l| {
                let at = l.find("serving http://")?;
                let rest = &l[at + "serving ".len()..];
                let url = rest.split_whitespace().next()?;
                Some(url.trim_end_matches('/').to_string())
            });
            if let Some(b) = found {
                break b;
            }
            if let Ok(Some(status)) = child.try_wait() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                panic!(
                    "dlqctl serve exited ({status}) before serving:\n{}",
                    lines.lock().unwrap().join("\n")
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "dlqctl serve did not say where it serves within 20 s:\n{}",
                lines.lock().unwrap().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client");
        Served {
            child,
            lines,
            base,
            http,
        }
    }

    /// Every output line so far.
    pub fn output(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// A full URL for `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends a request built by `f` from `method path`.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        f: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Answer {
        let r = f(self.http.request(method, self.url(path)))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}\n{}", self.output()));
        let status = r.status();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap_or_default();
        Answer {
            status,
            headers,
            text,
        }
    }

    /// GET `path`.
    pub async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, |r| r).await
    }

    /// The CSRF token of `/api/session`.
    pub async fn csrf(&self) -> String {
        self.get("/api/session").await.expect(200).json()["csrf_token"]
            .as_str()
            .expect("a csrf_token")
            .to_string()
    }

    /// POST a JSON body with the CSRF header, as the page's script would.
    pub async fn post_json(&self, path: &str, body: Value) -> Answer {
        let csrf = self.csrf().await;
        self.send(Method::POST, path, |r| {
            r.header("x-csrf-token", csrf).json(&body)
        })
        .await
    }

    /// POST a form, as the page's forms do (`csrf` added).
    pub async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> Answer {
        let csrf = self.csrf().await;
        let mut all: Vec<(&str, &str)> = vec![("csrf", csrf.as_str())];
        all.extend_from_slice(fields);
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(all)
            .finish();
        self.send(Method::POST, path, |r| {
            r.header("content-type", "application/x-www-form-urlencoded")
                .body(body)
        })
        .await
    }

    /// Posts the form `fields` to the actions of `pipeline`.
    pub async fn post_action(&self, pipeline: &str, fields: &[(&str, &str)]) -> Answer {
        self.post_form(&format!("/pipelines/{pipeline}/actions"), fields)
            .await
    }

    /// Starts a job through the API (`POST /api/pipelines/PIPELINE/VERB`
    /// with `body`), expecting 202; its id.
    pub async fn start_job(&self, pipeline: &str, verb: &str, body: Value) -> u64 {
        let started = self
            .post_json(&format!("/api/pipelines/{pipeline}/{verb}"), body)
            .await
            .expect(202)
            .json();
        started["id"].as_u64().expect("a job id")
    }

    /// Waits until job `id` has done some of its work (it holds the DLQ).
    pub async fn wait_moving(&self, id: u64) {
        crate::support::eventually("the job to move some", Duration::from_secs(20), || async {
            let j = self
                .get(&format!("/api/jobs/{id}"))
                .await
                .expect(200)
                .json();
            (j["progress"]["done"].as_u64().unwrap_or(0) > 0).then_some(())
        })
        .await;
    }

    /// Polls job `id` until it is no longer running; its JSON.
    pub async fn wait_job(&self, id: u64, deadline: Duration) -> Value {
        let start = Instant::now();
        loop {
            let j = self
                .get(&format!("/api/jobs/{id}"))
                .await
                .expect(200)
                .json();
            if j["state"] != "running" {
                return j;
            }
            assert!(
                start.elapsed() < deadline,
                "job {id} still runs after {deadline:?}: {j}\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends `signal` to the server.
    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    /// Waits for the server to exit; its code.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(Ok(s)) => s.code(),
            _ => None,
        }
    }
}
