//! `dlqctl doctor`: gathers the [`Snapshot`] the pure checklist
//! ([`crate::core::audit::doctor`]) judges: passive declares over AMQP,
//! then, where the management API answers for the same broker, the
//! version, each queue's policies, statistics and quorum members, the DLX's
//! binding, and the user's permissions; the handler timeout from the
//! command line or a worker's `/metrics`, and its circuit breakers from
//! the same page; each idempotency store, opened without creating
//! anything, and the hosts the consumers come from. Changes nothing.

use crate::amqp::declare::{passive_exchange, passive_queue};
use crate::amqp::mgmt::Management;
use crate::core::audit::doctor::{
    checklist, handler_timeout_from_metrics, Check, HandlerTimeout, ManagementState,
    PermissionsUnknown, QueueFacts, Snapshot,
};
use crate::core::audit::idempotency::{IdempotencyFacts, StoreReading};
use crate::core::audit::stale::ListedQueue;
use crate::core::idempotency::{redact_url, Idempotency, StoreSpec};
use crate::core::topology::plan::{Plan, Role};
use crate::error::Result;
use crate::idempotency::{open, resolve, Create, StoreUrl};
use crate::ops::metrics_page::{circuits, fetch_text};
use crate::ops::policies::PolicyView;
use lapin::Connection;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the command line adds to what the broker says.
#[derive(Debug, Clone, Default)]
pub struct DoctorOptions {
    /// Only this pipeline (its main queue's name).
    pub only: Option<String>,
    /// `--handler-timeout`: the workers' handler timeout.
    pub handler_timeout: Option<Duration>,
    /// `--metrics-url`: a worker's metrics page, to read it from.
    pub metrics_url: Option<String>,
    /// `--max-dlq`.
    pub max_dlq: Option<u64>,
    /// How long to wait before the second sample of `messages_dlx`, taken
    /// only when the first shows messages held.
    pub sample_gap: Duration,
    /// How long to wait for the management API to report the policies of
    /// a queue just created, when the policy definitions cannot be read.
    pub policy_wait: Duration,
    /// The `idempotency` block of each pipeline that has one, by pipeline:
    /// its store is checked (an `env:` name read from this process's
    /// environment).
    pub idempotency: HashMap<String, Idempotency>,
}

/// Gathers the snapshot of the pipelines of `plan` (only `opts.only` when
/// given) and judges it: the checklist, broker first, then each pipeline. `user` and `vhost` are the AMQP connection's.
/// An error means the broker could not be asked at all.
pub async fn doctor(
    conn: &Connection,
    plan: &Plan,
    mgmt: Option<&Management>,
    vhost: &str,
    user: &str,
    opts: &DoctorOptions,
) -> Result<Vec<Check>> {
    let plan = only(plan, opts.only.as_deref());
    let mut queues: HashMap<String, Option<QueueFacts>> = HashMap::new();
    for q in &plan.queues {
        let c = passive_queue(conn, &q.name).await?;
        let facts = c.map(|c| QueueFacts::declared(u64::from(c.ready), u64::from(c.consumers)));
        queues.insert(q.name.clone(), facts);
    }
    let mut missing_exchanges = Vec::new();
    for e in &plan.exchanges {
        if !passive_exchange(conn, &e.name).await? {
            missing_exchanges.push(e.name.clone());
        }
    }
    let management = match mgmt {
        None => ManagementState::Unreachable("no management API was given".into()),
        Some(m) => match m.probe().await {
            Err(e) => ManagementState::Unreachable(e.to_string()),
            Ok(()) => match m.same_broker(conn, vhost).await {
                Ok(()) => ManagementState::Answers,
                Err(e) => ManagementState::OtherBroker(e.to_string()),
            },
        },
    };
    let mut snapshot = Snapshot {
        version: None,
        management: management.clone(),
        user: user.to_string(),
        permissions: Err(PermissionsUnknown::NoManagement),
        missing_exchanges,
        queues,
        dlx_bound: HashMap::new(),
        sample_gap_s: opts.sample_gap.as_secs(),
        handler_timeout: HashMap::new(),
        max_dlq: opts.max_dlq,
        handler_timeout_error: None,
        circuit: HashMap::new(),
        policies_from_queue_view: None,
        redrive: HashMap::new(),
        now_ms: crate::ops::dlq::now_ms(),
        idempotency: stores(&plan, vhost, opts).await,
        consumer_hosts: HashMap::new(),
    };
    if let (Some(m), ManagementState::Answers) = (mgmt, &management) {
        from_management(m, &plan, vhost, opts, &mut snapshot).await;
        if snapshot.idempotency.values().any(|f| f.sqlite) {
            // Only an SQLite store cares which hosts consume.
            snapshot.consumer_hosts = m.consumer_hosts(vhost).await.unwrap_or_else(|e| {
                tracing::debug!(error = %e, "cannot list the consumers through the management API");
                HashMap::new()
            });
        }
    }
    snapshot.handler_timeout_error = handler_timeouts(&plan, opts, &mut snapshot).await;
    for q in plan.queues.iter().filter(|q| q.role == Role::RedriveState) {
        let state = match passive_queue(conn, &q.name).await {
            // A missing state queue is said as a missing object.
            Ok(None) => continue,
            Ok(Some(_)) => crate::ops::dlq::redrive_state::peek(conn, &q.name)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        snapshot.redrive.insert(q.pipeline.clone(), state);
    }
    if let Some(url) = &opts.metrics_url {
        // A page that cannot be read is already said of the handler timeout.
        let names = (plan.queues.iter())
            .filter(|q| q.role == Role::MainQueue)
            .map(|q| q.pipeline.as_str());
        snapshot.circuit = circuits(url, names).await.unwrap_or_default();
    }
    Ok(checklist(&plan, &snapshot, None))
}

/// The plan of one pipeline, or the whole plan.
fn only(plan: &Plan, name: Option<&str>) -> Plan {
    let Some(name) = name else {
        return plan.clone();
    };
    Plan {
        exchanges: (plan.exchanges.iter())
            .filter(|e| e.pipelines.iter().any(|p| p == name))
            .cloned()
            .collect(),
        queues: (plan.queues.iter())
            .filter(|q| q.pipeline == name)
            .cloned()
            .collect(),
        bindings: (plan.bindings.iter())
            .filter(|b| b.pipeline == name)
            .cloned()
            .collect(),
    }
}

/// Everything the management API tells; what fails to read stays unknown
/// (a skip in the checklist), never an error of the whole run.
async fn from_management(
    m: &Management,
    plan: &Plan,
    vhost: &str,
    opts: &DoctorOptions,
    s: &mut Snapshot,
) {
    s.version = m.version().await.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "cannot read the broker's version");
        None
    });
    s.permissions = match m.permissions(vhost, &s.user).await {
        Ok(Some(p)) => Ok(p),
        Ok(None) => Err(PermissionsUnknown::NoneInVhost(s.user.clone())),
        Err(e) => Err(PermissionsUnknown::Refused(e.to_string())),
    };
    let view = PolicyView::read(m, vhost).await;
    s.policies_from_queue_view = view.fallback_note();
    let wait = if view.has_definitions() {
        Duration::ZERO
    } else {
        opts.policy_wait
    };
    let listed = listing(m, plan, vhost, wait).await;
    if let Some(listed) = &listed {
        for q in &plan.queues {
            let (Some(l), Some(facts)) = (listed.get(&q.name), s.queue_mut(&q.name)) else {
                continue;
            };
            facts.kind = l.kind.clone();
            facts.messages = l.messages;
            facts.messages_dlx = l.messages_dlx.into_iter().collect();
            facts.policies = view.applied(q, l.kind.as_deref(), l.policies.as_ref());
        }
    }
    for q in &plan.queues {
        let quorum = (s.queue(&q.name)).is_some_and(|f| f.kind.as_deref() == Some("quorum"));
        if quorum {
            let members = m.members(vhost, &q.name).await.ok().flatten();
            if let Some(f) = s.queue_mut(&q.name) {
                f.members = members;
            }
        }
    }
    for b in plan.bindings.iter() {
        let dlx = plan
            .exchanges
            .iter()
            .any(|e| e.name == b.exchange && e.role == Role::DeadLetterExchange);
        if !dlx {
            continue;
        }
        let bound = m
            .bindings(vhost, &b.exchange, &b.queue)
            .await
            .ok()
            .map(|l| !l.is_empty());
        s.dlx_bound.insert(b.pipeline.clone(), bound);
    }
    let held = (s.queues.values().flatten()).any(|f| f.messages_dlx.iter().any(|n| *n > 0));
    if held {
        tokio::time::sleep(opts.sample_gap).await;
        if let Ok(again) = m.list_queues(vhost).await {
            for l in again {
                if let Some(f) = s.queue_mut(&l.name) {
                    if let Some(n) = l.messages_dlx {
                        f.messages_dlx.push(n);
                    }
                }
            }
        }
    }
}

/// The vhost's queues by name, waiting up to `wait` for the policies of
/// planned queues the statistics have not reported yet; `None` when the
/// listing fails.
async fn listing(
    m: &Management,
    plan: &Plan,
    vhost: &str,
    wait: Duration,
) -> Option<HashMap<String, ListedQueue>> {
    let start = Instant::now();
    loop {
        let listed: HashMap<String, ListedQueue> = match m.list_queues(vhost).await {
            Ok(list) => list.into_iter().map(|q| (q.name.clone(), q)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the queues through the management API");
                return None;
            }
        };
        let pending = plan
            .queues
            .iter()
            .any(|q| listed.get(&q.name).is_some_and(|l| l.policies.is_none()));
        if !pending || start.elapsed() >= wait {
            return Some(listed);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Fills in the handler timeout of every pipeline, from
/// `--handler-timeout` or a worker's metrics page; returns why the page
/// could not be read.
async fn handler_timeouts(plan: &Plan, opts: &DoctorOptions, s: &mut Snapshot) -> Option<String> {
    let pipelines = plan
        .queues
        .iter()
        .filter(|q| q.role == Role::MainQueue)
        .map(|q| q.pipeline.clone());
    if let Some(d) = opts.handler_timeout {
        for p in pipelines {
            s.handler_timeout.insert(
                p,
                HandlerTimeout {
                    ms: d.as_millis() as u64,
                    source: "--handler-timeout".into(),
                },
            );
        }
        return None;
    }
    let url = opts.metrics_url.as_deref()?;
    let text = match fetch_text(url).await {
        Ok(t) => t,
        Err(e) => return Some(e),
    };
    let shown = crate::amqp::connection::redact(url);
    let mut found = false;
    for p in pipelines {
        if let Some(ms) = handler_timeout_from_metrics(&text, &p) {
            found = true;
            s.handler_timeout.insert(
                p,
                HandlerTimeout {
                    ms,
                    source: shown.clone(),
                },
            );
        }
    }
    (!found).then(|| {
        format!(
            "{shown} has no {} sample for these pipelines (a worker older than this dlqctl?)",
            crate::core::audit::doctor::HANDLER_TIMEOUT_METRIC
        )
    })
}

/// The directory where `dir` would be made (`dir` itself, else its
/// nearest ancestor that exists) when this user cannot create entries in
/// it (`access(W_OK | X_OK)`, which also sees a read-only mount and an
/// immutable directory); `None` when it can.
fn unwritable(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let at = dir
        .ancestors()
        .find(|d| d.as_os_str().is_empty() || d.is_dir())?;
    let at = if at.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        at
    };
    let c = std::ffi::CString::new(at.as_os_str().as_bytes()).ok()?;
    // SAFETY: a valid C string; access reads it only.
    let ok = unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0;
    (!ok).then(|| at.to_path_buf())
}

/// How long doctor waits for one idempotency store.
const STORE_WAIT: Duration = Duration::from_secs(10);

/// Each pipeline's idempotency store, by pipeline (only those with
/// `idempotency`).
async fn stores(
    plan: &Plan,
    vhost: &str,
    opts: &DoctorOptions,
) -> HashMap<String, IdempotencyFacts> {
    let env = |name: &str| std::env::var(name).ok();
    let mut out = HashMap::new();
    for q in plan.queues.iter().filter(|q| q.role == Role::MainQueue) {
        if let Some(block) = opts.idempotency.get(&q.pipeline) {
            let facts = store_facts(block, &q.pipeline, vhost, &env).await;
            out.insert(q.pipeline.clone(), facts);
        }
    }
    out
}

/// One store: its URL made concrete, then, for a file that exists or a
/// Redis, opened without creating anything (`Create::No`) and asked to
/// write, read back and delete a `dlqctl-doctor:` key. A missing SQLite
/// file is never created.
async fn store_facts(
    block: &Idempotency,
    pipeline: &str,
    vhost: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> IdempotencyFacts {
    let facts = |store: String, sqlite: bool, reading: StoreReading| IdempotencyFacts {
        block: block.clone(),
        store,
        sqlite,
        reading,
    };
    let url = match resolve(&block.store, pipeline, env) {
        Ok(url) => url,
        Err(e) => {
            let (store, sqlite) = match &block.store {
                StoreSpec::Sqlite(p) => (format!("sqlite:{}", p.as_deref().unwrap_or("")), true),
                StoreSpec::Redis(u) => (redact_url(u), false),
                StoreSpec::Env(name) => (format!("env:{name}"), false),
            };
            return facts(store, sqlite, StoreReading::Failed(e.to_string()));
        }
    };
    let (store, sqlite) = match &url {
        StoreUrl::Sqlite(path) => (format!("sqlite:{}", path.display()), true),
        StoreUrl::Redis(u) => (redact_url(u), false),
    };
    if let StoreUrl::Sqlite(path) = &url {
        if !path.try_exists().unwrap_or(true) {
            let default = matches!(block.store, StoreSpec::Sqlite(None));
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            let reading = if default || dir.is_none_or(|d| d.is_dir()) {
                match unwritable(dir.unwrap_or(std::path::Path::new("."))) {
                    // `work` could not create the file (or the default
                    // directory) there, and exits 1: a fail here too.
                    Some(at) => StoreReading::Failed(format!(
                        "idempotency store {store} refused: {} is not writable by this user, so \
                         dlqctl work run as this user cannot create {} and exits 1",
                        at.display(),
                        path.display()
                    )),
                    None => StoreReading::NotCreated,
                }
            } else {
                StoreReading::NoDirectory
            };
            // The default file, looked for here: say where the installed
            // worker keeps it, in case this is not where it runs.
            let store = match (&reading, default) {
                (StoreReading::NotCreated, true) => format!(
                    "{store} (looked for there; {})",
                    crate::idempotency::unit_hint(pipeline)
                ),
                _ => store,
            };
            return facts(store, sqlite, reading);
        }
    }
    let scope = crate::core::idempotency::scope(vhost, pipeline);
    let checked = tokio::time::timeout(STORE_WAIT, async {
        open(&url, &scope, Create::No).await?.check().await
    })
    .await;
    let reading = match checked {
        Ok(Ok(())) => StoreReading::Answers,
        Ok(Err(e)) => StoreReading::Failed(e.to_string()),
        Err(_) => StoreReading::Failed(format!(
            "idempotency store {store} did not answer within {}s",
            STORE_WAIT.as_secs()
        )),
    };
    facts(store, sqlite, reading)
}

#[cfg(test)]
#[path = "doctor_store_tests.rs"]
mod store_tests;
