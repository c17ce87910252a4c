//! Policies and operator policies for one test's queues.
//!
//! Policies are global to the vhost: every one a test sets has a pattern
//! anchored on the test's own `it-xxxxxxxx-` prefix, a priority above
//! anything else (999), and is deleted by a [`PolicyGuard`] when the test
//! ends, also when it panics.

use crate::support::{amqp_url, block_on_own_thread, Broker, Cleanup, Mgmt};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A plain policy or an operator policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `PUT /api/policies/%2f/NAME`.
    Policy,
    /// `PUT /api/operator-policies/%2f/NAME`.
    Operator,
}

impl Kind {
    fn segment(self) -> &'static str {
        match self {
            Kind::Policy => "policies",
            Kind::Operator => "operator-policies",
        }
    }

    /// The field of `GET /api/queues/...` that names it.
    fn queue_field(self) -> &'static str {
        match self {
            Kind::Policy => "policy",
            Kind::Operator => "operator_policy",
        }
    }
}

/// A policy that exists while the guard lives.
pub struct PolicyGuard {
    /// Its name (`PREFIX-<suffix>`).
    pub name: String,
    kind: Kind,
}

impl PolicyGuard {
    /// Sets a policy named `PREFIX-<suffix>` whose pattern is `^PREFIX-`
    /// followed by `rest` (a regex of names under the prefix), applied to
    /// queues, with `definition`. Panics when the broker refuses it.
    pub async fn set(
        cleanup: &Cleanup,
        kind: Kind,
        suffix: &str,
        rest: &str,
        definition: Value,
    ) -> PolicyGuard {
        assert!(
            cleanup
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "{}",
            cleanup.prefix
        );
        // The guard first: a panic below still deletes what was set.
        let guard = PolicyGuard {
            name: cleanup.name(suffix),
            kind,
        };
        let body = json!({
            "pattern": format!("^{}-{rest}", cleanup.prefix),
            "definition": definition,
            "priority": 999,
            "apply-to": "queues",
        });
        let mgmt = Mgmt::new();
        let login = dlqctl::amqp::connection::BrokerUrl::parse(&amqp_url()).expect("AMQP_URL");
        let resp = reqwest::Client::new()
            .put(mgmt.url(&[kind.segment(), "/", &guard.name]))
            .basic_auth(login.user(), Some(login.password()))
            .json(&body)
            .send()
            .await
            .expect("PUT the policy");
        let status = resp.status();
        assert!(
            status.is_success(),
            "the broker refused {} {}: {status} {}",
            kind.segment(),
            guard.name,
            resp.text().await.unwrap_or_default()
        );
        guard
    }

    /// Waits until the management API shows this policy on every queue of
    /// `queues` (its statistics lag a few seconds behind a change).
    pub async fn wait_applied(&self, b: &Broker, queues: &[String]) {
        let start = Instant::now();
        for q in queues {
            loop {
                let doc = b.mgmt.queue(q).await.map(|i| i.raw);
                let shown = doc
                    .as_ref()
                    .map(|d| d[self.kind.queue_field()] == json!(self.name))
                    .unwrap_or(false);
                if shown {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "{} never showed on {q}: {doc:#?}",
                    self.name
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

impl Drop for PolicyGuard {
    fn drop(&mut self) {
        let segment = self.kind.segment();
        let name = self.name.clone();
        let outcome = block_on_own_thread(move || async move {
            Mgmt::new()
                .request(reqwest::Method::DELETE, &[segment, "/", &name])
                .await
        });
        match outcome {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => eprintln!("cleanup of {segment} {}: {e}", self.name),
            Err(_) => eprintln!("cleanup of {segment} {}: the thread panicked", self.name),
        }
    }
}
