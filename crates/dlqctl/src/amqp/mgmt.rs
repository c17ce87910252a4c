//! A small client of RabbitMQ's management HTTP API, for what AMQP cannot
//! tell: bindings, the messages a quorum queue holds for its DLX, and the
//! policies that apply to each queue.

use crate::core::audit::effective::{PolicyDefinition, PolicySet};
use crate::core::audit::policy::AppliedPolicies;
use crate::core::audit::stale::{ListedBinding, ListedQueue};
use crate::error::{Error, Result};
use reqwest::Url;
use std::time::Duration;

/// A management API endpoint with credentials.
#[derive(Clone)]
pub struct Management {
    base: Url,
    user: String,
    password: String,
    client: reqwest::Client,
}

impl std::fmt::Debug for Management {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Management")
            .field("base", &self.base.as_str())
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// One binding as the management API lists it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct ApiBinding {
    /// Routing key.
    pub routing_key: String,
    /// Binding arguments.
    #[serde(default)]
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

impl Management {
    /// A client for `base` (e.g. `http://127.0.0.1:15672`). Credentials in
    /// the URL win over `user`/`password`.
    pub fn new(base: &str, user: &str, password: &str) -> Result<Self> {
        Self::with_ca(base, user, password, None)
    }

    /// As [`Management::new`], also trusting the CAs of `ca_pem` (the
    /// `--tls-ca` of the AMQP connection) over https.
    pub(crate) fn with_ca(
        base: &str,
        user: &str,
        password: &str,
        ca_pem: Option<&str>,
    ) -> Result<Self> {
        crate::secrets::register_url(base);
        crate::secrets::register(password);
        let mut url = crate::urls::http(base).map_err(|e| {
            Error::Usage(format!(
                "invalid --management-url {}: {e}",
                crate::amqp::connection::redact(base)
            ))
        })?;
        let (user, password) = if url.username().is_empty() {
            (user.to_string(), password.to_string())
        } else {
            (
                url.username().to_string(),
                url.password().unwrap_or_default().to_string(),
            )
        };
        let _ = url.set_username("");
        let _ = url.set_password(None);
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(3));
        if let Some(pem) = ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| Error::Usage(format!("--tls-ca: not PEM certificates: {e}")))?;
            builder = builder.tls_certs_merge(certs);
        }
        let client = builder.build().map_err(|e| Error::Management {
            url: url.to_string(),
            message: e.to_string(),
        })?;
        Ok(Management {
            base: url,
            user,
            password,
            client,
        })
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut u = self.base.clone();
        if let Ok(mut p) = u.path_segments_mut() {
            p.pop_if_empty();
            p.push("api");
            for s in segments {
                p.push(s);
            }
        }
        u
    }

    /// GET a JSON document; `Ok(None)` on 404.
    pub async fn get(&self, segments: &[&str]) -> Result<Option<serde_json::Value>> {
        self.get_url(self.url(segments)).await
    }

    async fn get_url(&self, url: Url) -> Result<Option<serde_json::Value>> {
        let err = |message: String| Error::Management {
            url: url.to_string(),
            message,
        };
        let resp = self
            .client
            .get(url.clone())
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .map_err(|e| err(without_url(&e)))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(err(format!(
                "HTTP {status}: the management API refused user `{}`; give credentials in \
                 --management-url (http://USER:PASSWORD@HOST:15672) or use a user with the \
                 `monitoring` tag",
                self.user
            )));
        }
        if !status.is_success() {
            return Err(err(format!("HTTP {status}")));
        }
        resp.json()
            .await
            .map(Some)
            .map_err(|e| err(without_url(&e)))
    }

    /// Whether the API answers an authenticated `GET /api/overview`, and
    /// if not, why (unreachable, refused credentials, ...).
    pub async fn probe(&self) -> Result<()> {
        match self.get(&["overview"]).await? {
            Some(_) => Ok(()),
            None => Err(Error::Management {
                url: self.url(&["overview"]).to_string(),
                message: "HTTP 404: is this the management API's base URL?".into(),
            }),
        }
    }

    /// Bindings from an exchange to a queue.
    pub async fn bindings(
        &self,
        vhost: &str,
        exchange: &str,
        queue: &str,
    ) -> Result<Vec<ApiBinding>> {
        match self
            .get(&["bindings", vhost, "e", exchange, "q", queue])
            .await?
        {
            None => Ok(vec![]),
            Some(v) => serde_json::from_value(v).map_err(|e| Error::Management {
                url: self.url(&["bindings"]).to_string(),
                message: format!("unexpected answer: {e}"),
            }),
        }
    }

    /// Whether this API belongs to the broker (or cluster) that `conn`
    /// reached: a queue declared through `conn` (exclusive, server-named)
    /// must show in it. `Err` says which broker answers instead. When the
    /// queue cannot be declared (no configure permission), nothing can be
    /// told and the API is trusted (logged at debug level).
    pub(crate) async fn same_broker(&self, conn: &lapin::Connection, vhost: &str) -> Result<()> {
        use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
        let Ok(ch) = conn.create_channel().await else {
            return Ok(());
        };
        let declared = ch
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await;
        let name = match declared {
            Ok(q) => q.name().as_str().to_string(),
            Err(e) => {
                tracing::debug!(error = %crate::error::describe_lapin_error(&e),
                    "cannot declare a probe queue: the management API is trusted to belong to this broker");
                return Ok(());
            }
        };
        let found = self.queue(vhost, &name).await;
        let _ = ch
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = ch.close(200, "probe done".into()).await;
        match found? {
            Some(_) => Ok(()),
            None => {
                let cluster = self
                    .get(&["overview"])
                    .await
                    .ok()
                    .flatten()
                    .and_then(|o| o["cluster_name"].as_str().map(str::to_string))
                    .unwrap_or_else(|| "unknown".into());
                Err(Error::Management {
                    url: self.base.to_string(),
                    message: format!(
                        "this management API belongs to another broker (cluster `{cluster}`) than \
                         the AMQP connection reached; its state is not this broker's (give \
                         --management-url for the broker of --url)"
                    ),
                })
            }
        }
    }

    /// A queue's description (`arguments`, `messages`, `messages_dlx`, ...).
    pub async fn queue(&self, vhost: &str, name: &str) -> Result<Option<serde_json::Value>> {
        self.get(&["queues", vhost, name]).await
    }

    /// Every queue of the vhost, with its depth where the statistics have
    /// it, its type, and the policies that apply to it (without their own
    /// definitions: see [`Management::policy_set`]).
    pub(crate) async fn list_queues(&self, vhost: &str) -> Result<Vec<ListedQueue>> {
        #[derive(serde::Deserialize)]
        struct Row {
            name: String,
            messages: Option<u64>,
            messages_unacknowledged: Option<u64>,
            messages_dlx: Option<u64>,
            #[serde(rename = "type")]
            kind: Option<String>,
            policy: Option<String>,
            operator_policy: Option<String>,
            effective_policy_definition: Option<serde_json::Value>,
        }
        let mut url = self.url(&["queues", vhost]);
        url.query_pairs_mut().append_pair(
            "columns",
            "name,messages,messages_unacknowledged,messages_dlx,type,policy,operator_policy,\
             effective_policy_definition",
        );
        let rows: Vec<Row> = match self.get_url(url.clone()).await? {
            None => vec![],
            Some(v) => serde_json::from_value(v).map_err(|e| Error::Management {
                url: url.to_string(),
                message: format!("unexpected answer: {e}"),
            })?,
        };
        Ok(rows
            .into_iter()
            .map(|r| ListedQueue {
                name: r.name,
                messages: r.messages,
                unacked: r.messages_unacknowledged,
                messages_dlx: r.messages_dlx,
                kind: r.kind,
                policies: applied(r.policy, r.operator_policy, r.effective_policy_definition),
            })
            .collect())
    }

    /// The vhost's policies and operator policies, with their patterns,
    /// `apply-to` and priorities, and the broker's version: what
    /// [`crate::core::audit::effective`] needs to tell which apply to a
    /// queue. Reading them needs permissions in the vhost or the
    /// `administrator` tag (a `monitoring` user without permissions there
    /// lists queues but gets 403 here): a refusal is an error the caller
    /// answers by reading the queues' own, possibly older, reports.
    pub(crate) async fn policy_set(&self, vhost: &str) -> Result<PolicySet> {
        #[derive(serde::Deserialize)]
        struct Row {
            name: String,
            #[serde(default)]
            pattern: String,
            #[serde(rename = "apply-to", default)]
            apply_to: Option<String>,
            #[serde(default)]
            priority: Option<f64>,
            #[serde(default)]
            definition: serde_json::Value,
        }
        let defs = |rows: Vec<Row>| {
            rows.into_iter()
                .map(|r| PolicyDefinition {
                    name: r.name,
                    pattern: r.pattern,
                    apply_to: r.apply_to.unwrap_or_else(|| "all".into()),
                    priority: r.priority.unwrap_or(0.0),
                    definition: as_definition(Some(r.definition)).unwrap_or_default(),
                })
                .collect::<Vec<_>>()
        };
        let policies = defs(self.list(&["policies", vhost]).await?);
        let operator_policies = defs(self.list(&["operator-policies", vhost]).await?);
        let version = self.version().await.ok().flatten();
        Ok(PolicySet::new(
            policies,
            operator_policies,
            version.as_deref(),
        ))
    }

    /// Every binding of the vhost.
    pub(crate) async fn list_bindings(&self, vhost: &str) -> Result<Vec<ListedBinding>> {
        #[derive(serde::Deserialize)]
        struct Row {
            source: String,
            destination: String,
            destination_type: String,
            routing_key: String,
            #[serde(default)]
            arguments: serde_json::Map<String, serde_json::Value>,
        }
        let rows: Vec<Row> = self.list(&["bindings", vhost]).await?;
        Ok(rows
            .into_iter()
            .map(|r| ListedBinding {
                source: r.source,
                destination: r.destination,
                to_queue: r.destination_type == "queue",
                routing_key: r.routing_key,
                arguments: r.arguments,
            })
            .collect())
    }

    /// The broker's version (`rabbitmq_version` of `GET /api/overview`).
    pub(crate) async fn version(&self) -> Result<Option<String>> {
        Ok(self
            .get(&["overview"])
            .await?
            .and_then(|o| o["rabbitmq_version"].as_str().map(str::to_string)))
    }

    /// A quorum queue's members online and in all (`online` and `members`
    /// of its description); `None` for a queue without them (classic) or
    /// one the API does not know.
    pub(crate) async fn members(&self, vhost: &str, queue: &str) -> Result<Option<(usize, usize)>> {
        let Some(q) = self.queue(vhost, queue).await? else {
            return Ok(None);
        };
        Ok(match (q["online"].as_array(), q["members"].as_array()) {
            (Some(online), Some(members)) => Some((online.len(), members.len())),
            _ => None,
        })
    }

    /// The distinct hosts the consumers of each queue of the vhost
    /// connect from (`channel_details.peer_host` of `GET /api/consumers/
    /// VHOST`), by queue, sorted.
    pub(crate) async fn consumer_hosts(
        &self,
        vhost: &str,
    ) -> Result<std::collections::HashMap<String, Vec<String>>> {
        let rows: Vec<serde_json::Value> = self.list(&["consumers", vhost]).await?;
        Ok(hosts_by_queue(&rows))
    }

    /// A user's permissions in a vhost. Reading them needs the
    /// `administrator` tag: a refusal says so. `Ok(None)`: the user has no
    /// permissions there.
    pub(crate) async fn permissions(
        &self,
        vhost: &str,
        user: &str,
    ) -> Result<Option<crate::core::audit::permissions::UserPermissions>> {
        let doc = match self.get(&["permissions", vhost, user]).await {
            Ok(doc) => doc,
            Err(Error::Management { url, message }) if message.contains("refused user") => {
                return Err(Error::Management {
                    url,
                    message: format!(
                        "user `{}` may not read permissions (it needs the `administrator` tag)",
                        self.user
                    ),
                })
            }
            Err(e) => return Err(e),
        };
        Ok(
            doc.map(|d| crate::core::audit::permissions::UserPermissions {
                configure: d["configure"].as_str().unwrap_or_default().to_string(),
                write: d["write"].as_str().unwrap_or_default().to_string(),
                read: d["read"].as_str().unwrap_or_default().to_string(),
            }),
        )
    }

    /// A JSON list; a 404 (no such vhost) is an empty list.
    async fn list<T: serde::de::DeserializeOwned>(&self, segments: &[&str]) -> Result<Vec<T>> {
        match self.get(segments).await? {
            None => Ok(vec![]),
            Some(v) => serde_json::from_value(v).map_err(|e| Error::Management {
                url: self.url(segments).to_string(),
                message: format!("unexpected answer: {e}"),
            }),
        }
    }
}

/// A definition as the API prints it: an object, or `[]` for an empty one
/// (an empty Erlang list); `None` for anything else (`null`: not reported
/// yet).
fn as_definition(
    v: Option<serde_json::Value>,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    match v? {
        serde_json::Value::Object(m) => Some(m),
        serde_json::Value::Array(a) if a.is_empty() => Some(serde_json::Map::new()),
        _ => None,
    }
}

/// The policies a queue's own document reports (`GET /api/queues/{vhost}/
/// {name}`: `policy`, `operator_policy`, `effective_policy_definition`);
/// `None` while the statistics have not reported them.
pub(crate) fn reported_policies(doc: &serde_json::Value) -> Option<AppliedPolicies> {
    let text = |k: &str| doc[k].as_str().map(str::to_string);
    applied(
        text("policy"),
        text("operator_policy"),
        Some(doc["effective_policy_definition"].clone()),
    )
}

/// The policies of a queue row; `None` while the statistics have not
/// reported them.
fn applied(
    policy: Option<String>,
    operator_policy: Option<String>,
    effective: Option<serde_json::Value>,
) -> Option<AppliedPolicies> {
    let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
    Some(AppliedPolicies {
        policy: nonempty(policy),
        operator_policy: nonempty(operator_policy),
        effective: as_definition(effective)?,
        policy_definition: None,
        operator_definition: None,
        notes: vec![],
    })
}

fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(&format!(" for url ({u})"), "");
    }
    s
}

/// The distinct `channel_details.peer_host` of consumer rows, by
/// `queue.name`, sorted; rows without either are left out.
fn hosts_by_queue(rows: &[serde_json::Value]) -> std::collections::HashMap<String, Vec<String>> {
    let mut out: std::collections::HashMap<String, std::collections::BTreeSet<String>> =
        std::collections::HashMap::new();
    for r in rows {
        let (Some(queue), Some(host)) = (
            r["queue"]["name"].as_str(),
            r["channel_details"]["peer_host"].as_str(),
        ) else {
            continue;
        };
        out.entry(queue.to_string())
            .or_default()
            .insert(host.to_string());
    }
    out.into_iter()
        .map(|(q, hosts)| (q, hosts.into_iter().collect()))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn consumer_hosts_are_distinct_per_queue() {
        let rows: Vec<serde_json::Value> = serde_json::from_str(
            r#"[
              {"queue": {"name": "orders", "vhost": "/"}, "channel_details": {"peer_host": "10.0.0.2", "peer_port": 5}},
              {"queue": {"name": "orders", "vhost": "/"}, "channel_details": {"peer_host": "10.0.0.1"}},
              {"queue": {"name": "orders", "vhost": "/"}, "channel_details": {"peer_host": "10.0.0.2"}},
              {"queue": {"name": "pay", "vhost": "/"}, "channel_details": {"peer_host": "::1"}},
              {"queue": {"name": "odd"}, "channel_details": []},
              {"channel_details": {"peer_host": "10.0.0.9"}}
            ]"#,
        )
        .unwrap();
        let hosts = super::hosts_by_queue(&rows);
        assert_eq!(hosts["orders"], vec!["10.0.0.1", "10.0.0.2"]);
        assert_eq!(hosts["pay"], vec!["::1"]);
        assert_eq!(hosts.len(), 2);
    }

    use super::reported_policies;
    use serde_json::json;

    #[test]
    fn a_queue_document_reports_its_policies_once_its_statistics_have() {
        let doc = json!({
            "policy": "ttl",
            "operator_policy": "",
            "effective_policy_definition": {"message-ttl": 1000},
        });
        let p = reported_policies(&doc).expect("reported");
        assert_eq!(p.policy.as_deref(), Some("ttl"));
        assert_eq!(p.operator_policy, None, "an empty name is no policy");
        assert_eq!(p.effective["message-ttl"], 1000);
        // `[]` is the empty definition; `null` or absent: not reported yet.
        let none = json!({"effective_policy_definition": []});
        assert!(reported_policies(&none).is_some_and(|p| p.effective.is_empty()));
        assert_eq!(
            reported_policies(&json!({"effective_policy_definition": null})),
            None
        );
        assert_eq!(reported_policies(&json!({})), None);
    }
}
