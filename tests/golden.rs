//! Golden files: what dlqctl prints for machines, pinned so that a
//! refactoring of the reports changes none of it.
//!
//! - [`json_reports_of_one_pipeline_stay_as_they_are`]: against the real
//!   broker over AMQP (`AMQP_URL`, unique names deleted at the end), the
//!   JSON of `status`, `doctor` (and its text and GitHub annotations),
//!   `dlq replay` (a dry run, then a real one), `dlq redrive` and `drill`,
//!   and the text of `validate` (which has no JSON output). Each is pinned
//!   byte for byte (key order and layout included), with the test's
//!   unique names, the file's path and the metrics URL replaced by
//!   stand-ins, and the values that vary from run to run (ids, times) by a
//!   marker of their type (`"<number>"`, `"<string>"`). Every command runs
//!   without a management API (an address where nothing listens): their
//!   output is then the same on a broker with or without the management
//!   plugin, and of any version.
//! - [`metric_names_labels_and_help_stay_as_they_are`]: in-process, the
//!   `# HELP`/`# TYPE` lines and every sample's name and labels (values
//!   dropped) of `Metrics::render()` after every recording method ran,
//!   sorted.
//!
//! The expectations live in `tests/golden/`; `GOLDEN_UPDATE=1 cargo test
//! --test golden` rewrites them (then read the diff before committing).
//! The broker test assumes the broker's default consumer timeout, as the
//! integration tests do.

#[allow(dead_code, unused_imports)]
#[path = "integration/support/mod.rs"]
mod support;

use serde_json::Value;
use std::time::Duration;
use support::dlq::dead;
use support::script::Script;
use support::worker::WorkerProc;
use support::{Dlqctl, Run};

// ---------------------------------------------------------------- golden files

/// Compares `actual` with `tests/golden/NAME`, or writes it there with
/// `GOLDEN_UPDATE=1`.
fn golden(name: &str, actual: &str) {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var("GOLDEN_UPDATE").as_deref() == Ok("1") {
        std::fs::create_dir_all(format!("{}/tests/golden", env!("CARGO_MANIFEST_DIR")))
            .expect("create tests/golden");
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("write {path}: {e}"));
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (GOLDEN_UPDATE=1 writes it)"));
    if expected != actual {
        let (want, got): (Vec<&str>, Vec<&str>) =
            (expected.lines().collect(), actual.lines().collect());
        let first = (0..want.len().max(got.len()))
            .find(|i| want.get(*i) != got.get(*i))
            .unwrap_or(0);
        panic!(
            "{path} differs from the output, first at line {}:\n  golden: {:?}\n  now:    {:?}\n\
             --- the whole output now\n{actual}\n(GOLDEN_UPDATE=1 rewrites the file: only when \
             the change is wanted)",
            first + 1,
            want.get(first),
            got.get(first)
        );
    }
}

/// What varies between runs in an output, and what stands for it.
struct Volatile {
    /// Texts replaced everywhere: (text, stand-in).
    texts: Vec<(String, String)>,
}

impl Volatile {
    /// `s` with the texts replaced, and the name of a server-named queue
    /// (`amq.gen-…`) as `amq.gen-ID`.
    fn text(&self, s: &str) -> String {
        let mut s = s.to_string();
        for (from, to) in &self.texts {
            s = s.replace(from.as_str(), to);
        }
        let mut out = String::new();
        let mut rest = s.as_str();
        while let Some(at) = rest.find("amq.gen-") {
            out.push_str(&rest[..at]);
            out.push_str("amq.gen-ID");
            rest = rest[at + "amq.gen-".len()..]
                .trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        }
        out + rest
    }

    /// The JSON document on `run`'s stdout byte for byte (key order and
    /// layout included), with the texts replaced and the value of each
    /// key named in `keys` (a time, an id) replaced by its type:
    /// `"<number>"`, `"<string>"` or `"<bool>"` (`null` stays).
    fn document(&self, run: &Run, keys: &[&str]) -> String {
        if let Err(e) = serde_json::from_str::<Value>(&run.stdout) {
            panic!("not JSON on stdout ({e}):\n{}", run.output());
        }
        let mut out = String::new();
        for line in self.text(&run.stdout).lines() {
            out.push_str(&marked(line, keys));
            out.push('\n');
        }
        out
    }
}

/// A line `  "key": VALUE,` of a pretty-printed document with VALUE
/// replaced by its type when `key` is one of `keys`.
fn marked(line: &str, keys: &[&str]) -> String {
    let trimmed = line.trim_start();
    let Some((key, value)) = trimmed
        .strip_prefix('"')
        .and_then(|t| t.split_once("\": "))
        .filter(|(k, _)| keys.contains(k))
    else {
        return line.to_string();
    };
    let (value, comma) = match value.strip_suffix(',') {
        Some(v) => (v, ","),
        None => (value, ""),
    };
    let marker = match serde_json::from_str::<Value>(value) {
        Ok(Value::Null) => "null",
        Ok(Value::Bool(_)) => "\"<bool>\"",
        Ok(Value::Number(_)) => "\"<number>\"",
        Ok(Value::String(_)) => "\"<string>\"",
        _ => panic!("`{key}` is not a number, string, bool or null: {line}"),
    };
    let indent = &line[..line.len() - trimmed.len()];
    format!("{indent}\"{key}\": {marker}{comma}")
}

// ---------------------------------------------------------------- the broker's reports

/// The management API the reports are made without: nothing listens on
/// port 1, so they come out alike whether or not the machine's broker has
/// its management plugin (only AMQP is needed).
const NO_MANAGEMENT: &str = "http://127.0.0.1:1";

/// Runs `dlqctl ARGS...` (no management API) and checks its exit code.
async fn dlqctl(args: &[&str], code: i32) -> Run {
    let run = Dlqctl::new(args[0])
        .args(&args[1..])
        .env("DLQCTL_MANAGEMENT_URL", NO_MANAGEMENT)
        .run()
        .await;
    run.assert_code(code);
    run
}

/// An AMQP connection of the test's own, and the objects of a topology
/// file, deleted when dropped (test passed or panicked).
struct Broker {
    conn: lapin::Connection,
    queues: Vec<String>,
    exchanges: Vec<String>,
}

impl Broker {
    async fn connect(file: &std::path::Path) -> Broker {
        let url = support::amqp_url();
        let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| {
                panic!("no RabbitMQ answers at {url}: {e}\n{}", support::START_HINT)
            });
        let t = dlqctl::load_topology(file).expect("a valid topology");
        let p = dlqctl::core::topology::plan::plan(&t);
        Broker {
            conn,
            queues: p.queues.iter().map(|q| q.name.clone()).collect(),
            exchanges: p.exchanges.iter().map(|e| e.name.clone()).collect(),
        }
    }

    /// Publishes each message to `queue` and waits for the broker's
    /// confirms.
    async fn publish(&self, queue: &str, msgs: Vec<(Vec<u8>, lapin::BasicProperties)>) {
        use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
        let ch = self.conn.create_channel().await.expect("a channel");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm.select");
        for (body, props) in msgs {
            let confirm = ch
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &body,
                    props.with_delivery_mode(2),
                )
                .await
                .expect("publish")
                .await
                .expect("a confirm");
            assert!(
                matches!(confirm, lapin::Confirmation::Ack(None)),
                "{confirm:?}"
            );
        }
    }

    /// The ready messages of `queue` (a passive declare).
    async fn ready(&self, queue: &str) -> u32 {
        use lapin::options::QueueDeclareOptions;
        let ch = self.conn.create_channel().await.expect("a channel");
        let options = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let ok = ch
            .queue_declare(queue.into(), options, Default::default())
            .await
            .unwrap_or_else(|e| panic!("queue {queue}: {e}"));
        let _ = ch.close(200, "bye".into()).await;
        ok.message_count()
    }

    /// Waits up to 20 s until `queue` holds no ready message.
    async fn wait_empty(&self, queue: &str) {
        let start = std::time::Instant::now();
        while self.ready(queue).await > 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{queue} stays full"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let (queues, exchanges) = (self.queues.clone(), self.exchanges.clone());
        let _ = support::block_on_own_thread(move || async move {
            let url = support::amqp_url();
            let props = lapin::ConnectionProperties::default();
            let Ok(conn) = lapin::Connection::connect(&url, props).await else {
                return;
            };
            for q in &queues {
                if let Ok(ch) = conn.create_channel().await {
                    let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
                }
            }
            for x in &exchanges {
                if let Ok(ch) = conn.create_channel().await {
                    let _ = ch
                        .exchange_delete(x.as_str().into(), Default::default())
                        .await;
                }
            }
        });
    }
}

/// One quorum pipeline (a 100 ms tier, two attempts, a DLQ kept 14 days,
/// a redrive policy without canary) whose DLQ holds three exhausted
/// messages: every report, in an order where each one's content is known.
#[tokio::test]
async fn json_reports_of_one_pipeline_stay_as_they_are() {
    let prefix = support::unique_prefix();
    let q = format!("{prefix}-orders");
    let scratch = support::Scratch::new();
    let file = scratch.write(
        "topology.yaml",
        &format!(
            "version: 1\npipelines:\n  - name: {q}\n    queue_type: quorum\n    retry: {{ \
             delays: [100ms], max_attempts: 2, jitter: 0 }}\n    dead_letter: {{ ttl: 14d, \
             redrive: {{ min_age: 1s, canary: 0 }} }}\n"
        ),
    );
    let path = file.to_str().expect("a UTF-8 path").to_string();
    let q = q.as_str();
    let dlq = format!("{q}.dlq");
    let mut v = Volatile {
        texts: vec![
            (path.clone(), "FILE".into()),
            (prefix.clone(), "PREFIX".into()),
        ],
    };
    // What a DLQ command's report holds that varies: its id, its times.
    let run_keys = ["replay_id", "elapsed_ms", "started_at_ms", "ended_at_ms"];
    let redrive_keys = [
        &run_keys[..],
        &["at_ms", "next_look_at_ms", "written_at_ms"],
    ]
    .concat();

    // validate has no JSON: its line, byte for byte.
    let run = dlqctl(&["validate", &path], 0).await;
    golden("validate.txt", &v.text(&run.stdout));

    let broker = Broker::connect(&file).await;
    dlqctl(&["provision", &path], 0).await;
    let msgs = (0..3)
        .map(|k| {
            let id = format!("m-{k}");
            (
                format!("body {k}").into_bytes(),
                dead(&id, "exhausted", "e", "t"),
            )
        })
        .collect();
    broker.publish(&dlq, msgs).await;

    let run = dlqctl(&["status", &path, "--json"], 0).await;
    golden("status.json", &v.document(&run, &[]));

    // doctor: no management API (a warning), nobody consumes (another).
    let doctor = ["doctor", &path, "--handler-timeout", "30s", "--format"];
    let run = dlqctl(&[&doctor[..], &["json"]].concat(), 0).await;
    golden("doctor.json", &v.document(&run, &[]));
    let run = dlqctl(&[&doctor[..], &["text"]].concat(), 0).await;
    golden("doctor.txt", &v.text(&run.stdout));
    let run = dlqctl(&[&doctor[..], &["github"]].concat(), 0).await;
    golden("doctor.github.txt", &v.text(&run.stdout));

    let replay = ["dlq", "replay", &path, "--queue", q, "--json"];
    let run = dlqctl(&[&replay[..], &["--dry-run"]].concat(), 0).await;
    golden("replay-dry-run.json", &v.document(&run, &run_keys));
    let run = dlqctl(&[&replay[..], &["--message-id", "m-0"]].concat(), 0).await;
    golden("replay.json", &v.document(&run, &run_keys));

    let run = dlqctl(&["dlq", "redrive", &path, "--queue", q, "--json"], 0).await;
    golden("redrive.json", &v.document(&run, &redrive_keys));

    // drill: a worker consumes (and acks the three replayed messages).
    let script = Script::new(&scratch, "h", "exit 0");
    let args = [
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
        "--".into(),
        script.path.clone().into_os_string(),
    ];
    let env = [("DLQCTL_MANAGEMENT_URL", NO_MANAGEMENT)];
    let mut w = WorkerProc::spawn_with_env(&file, q, &args, &env);
    let url = format!("http://{}/metrics", w.metrics_addr().await);
    w.wait_consuming().await;
    // The three replayed messages handled: the drill's ack count is then
    // theirs and its own.
    w.wait_decisions(3, Duration::from_secs(20)).await;
    broker.wait_empty(q).await;
    v.texts.push((url.clone(), "METRICS_URL".into()));
    let drill = ["drill", &path, "--queue", q, "--metrics-url", &url];
    let run = dlqctl(&[&drill[..], &["--format", "json"]].concat(), 0).await;
    // Its id, its times, and the redrive's last run ("5s ago") vary.
    let drill_keys = ["id", "elapsed_ms", "took_ms", "redrive"];
    golden("drill.json", &v.document(&run, &drill_keys));
    w.stop().await;
}

// ---------------------------------------------------------------- metrics

/// Every recording method of a worker's metrics, once, for the pipeline
/// `orders`; then the rendered page reduced to its `# HELP` and `# TYPE`
/// lines and its samples' names and labels, sorted.
#[test]
fn metric_names_labels_and_help_stay_as_they_are() {
    use dlqctl::core::dlq::redrive::RunResult;
    use dlqctl::core::retry::breaker::Phase;
    use dlqctl::worker::metrics::{GuardEvent, RedriveRun};
    let m = dlqctl::Metrics::new();
    let q = m.queue_counters("orders");
    q.decision("ack");
    q.outcome("success");
    q.first_attempt_success();
    q.dead_letter("exhausted");
    q.retry_delay(100);
    for result in RunResult::ALL {
        m.record_redrive(&RedriveRun {
            queue: "orders",
            result,
            moved: 1,
            waiting_for_person: Some(1),
            next_wait_ms: 1000,
        });
    }
    m.record_redrive_wait("orders", 2000);
    m.set_handler_timeout("orders", Duration::from_secs(30));
    for phase in [Phase::Open, Phase::HalfOpen, Phase::Closed] {
        m.set_circuit("orders", phase, 1000.0, true);
    }
    m.set_probe_unusable("orders", false);
    m.settle_retry_started();
    m.settle_failed();
    m.settle_retry_ended();
    m.settle_succeeded();
    m.store_down();
    m.store_up();
    m.handler_started();
    m.handler_finished(Duration::from_millis(500));
    m.publish_refused();
    m.reconnected();
    m.set_consuming(true);
    m.consumer_timeout_conflict();
    m.guard_started("orders");
    for event in GuardEvent::ALL {
        m.guard_event("orders", event);
    }
    golden("metrics.txt", &metric_shapes(&m.render()));
}

/// The `# HELP` and `# TYPE` lines of an OpenMetrics page as they are,
/// and each sample as its name and labels (`le` of a histogram bucket
/// included), without its value; sorted, once each.
fn metric_shapes(page: &str) -> String {
    let mut lines: Vec<String> = page
        .lines()
        .filter(|l| !l.is_empty() && *l != "# EOF")
        .map(|l| {
            if l.starts_with('#') {
                return l.to_string();
            }
            // `name{labels} value`, or `name value`.
            match l.rfind(' ') {
                Some(i) => l[..i].to_string(),
                None => l.to_string(),
            }
        })
        .collect();
    lines.sort();
    lines.dedup();
    lines.join("\n") + "\n"
}

// ---------------------------------------------------------------- doctor's checklist

mod checklist {
    //! `dlqctl doctor`'s checklist judged in-process on snapshots that
    //! reach every kind of item (what the broker test cannot, without a
    //! management API): a healthy broker, a troubled one, one whose
    //! management API does not answer, one whose API is another broker's.
    //! The checklist as JSON (what `--format json` prints under `checks`).

    use dlqctl::core::audit::circuit::CircuitReading;
    use dlqctl::core::audit::doctor::{
        checklist, HandlerTimeout, ManagementState, PermissionsUnknown, QueueFacts, Snapshot,
    };
    use dlqctl::core::audit::idempotency::{IdempotencyFacts, StoreReading};
    use dlqctl::core::audit::permissions::UserPermissions;
    use dlqctl::core::audit::policy::AppliedPolicies;
    use dlqctl::core::idempotency::Idempotency;
    use dlqctl::core::retry::breaker::Phase;
    use dlqctl::core::topology::plan::{pipeline_plan, Plan, Role};
    use serde_json::{json, Map, Value};
    use std::collections::HashMap;

    const DAY: u64 = 86_400_000;

    /// The plan of pipeline `orders` (tiers 1s and 10s), with `extra`
    /// YAML lines.
    fn plan(extra: &str) -> Plan {
        let yaml = format!(
            "version: 1\npipelines:\n  - name: orders\n    retry: {{delays: [1s, 10s]}}\n{extra}"
        );
        let t = dlqctl::core::topology::parse_topology(&yaml, "t.yaml").expect("a topology");
        pipeline_plan(&t.pipelines[0])
    }

    /// What the broker says of a queue that exists: `ready` messages,
    /// `consumers`, no policy, quorum, all three members, nothing held.
    fn exists(ready: u64, consumers: u64) -> Option<QueueFacts> {
        Some(QueueFacts {
            ready,
            consumers,
            messages: Some(ready),
            kind: Some("quorum".into()),
            policies: Some(AppliedPolicies::default()),
            messages_dlx: vec![0, 0],
            members: Some((3, 3)),
        })
    }

    /// What the broker says of a queue that does not exist.
    fn missing() -> Option<QueueFacts> {
        None
    }

    /// Facts of one queue of the snapshot, to change.
    fn facts<'a>(s: &'a mut Snapshot, queue: &str) -> &'a mut QueueFacts {
        s.queue_mut(queue).expect("a planned queue that exists")
    }

    fn policy(name: &str, operator: bool, effective: Value) -> Option<AppliedPolicies> {
        let effective: Map<String, Value> = effective.as_object().cloned().unwrap_or_default();
        let name = Some(name.to_string());
        Some(AppliedPolicies {
            policy: if operator { None } else { name.clone() },
            operator_policy: if operator { name } else { None },
            effective,
            ..AppliedPolicies::default()
        })
    }

    /// A healthy broker for `plan`: every object, no policy, a consumer on
    /// the main queue, the user may do everything.
    fn healthy(plan: &Plan) -> Snapshot {
        let queues = (plan.queues.iter())
            .map(|q| {
                (
                    q.name.clone(),
                    exists(0, u64::from(q.role == Role::MainQueue)),
                )
            })
            .collect();
        Snapshot {
            version: Some("4.1.0".into()),
            management: ManagementState::Answers,
            user: "guest".into(),
            permissions: Ok(UserPermissions {
                configure: ".*".into(),
                write: ".*".into(),
                read: ".*".into(),
            }),
            missing_exchanges: vec![],
            queues,
            dlx_bound: [("orders".to_string(), Some(true))].into(),
            sample_gap_s: 6,
            handler_timeout: [(
                "orders".to_string(),
                HandlerTimeout {
                    ms: 30_000,
                    source: "--handler-timeout".into(),
                },
            )]
            .into(),
            max_dlq: Some(100),
            handler_timeout_error: None,
            circuit: [(
                "orders".to_string(),
                CircuitReading {
                    state: Phase::Closed,
                    since: Some("2026-12-07T09:10:00.000Z".into()),
                    for_ms: Some(60_000),
                    probe_unusable: false,
                },
            )]
            .into(),
            policies_from_queue_view: None,
            redrive: [("orders".to_string(), Ok(None))].into(),
            now_ms: 1_796_600_000_000,
            idempotency: [(
                "orders".to_string(),
                IdempotencyFacts {
                    block: Idempotency {
                        keep_ms: 30 * DAY,
                        ..Idempotency::default()
                    },
                    store: "redis://:***@cache:6379/0".into(),
                    sqlite: false,
                    reading: StoreReading::Answers,
                },
            )]
            .into(),
            consumer_hosts: HashMap::new(),
        }
    }

    /// Everything wrong at once on 3.10.8: a missing exchange and queue,
    /// policies that override (drop-head, an operator policy's TTL), a
    /// note, a key that changes nothing, a dead-letter cycle, members
    /// down, messages held for a full DLQ whose DLX is unbound, no
    /// consumer, a DLQ over --max-dlq, a handler timeout over the consumer
    /// timeout, an open breaker, an unreadable redrive state, missing
    /// permissions, an SQLite store not created yet, with a short keep and
    /// consumers on two hosts.
    fn troubled(plan: &Plan) -> Snapshot {
        let mut s = healthy(plan);
        s.version = Some("3.10.8".into());
        s.missing_exchanges = vec!["orders.retry".into()];
        s.queues.insert("orders.retry.10s".into(), missing());
        facts(&mut s, "orders").policies = policy("dh", false, json!({"overflow": "drop-head"}));
        facts(&mut s, "orders").members = Some((1, 3));
        facts(&mut s, "orders").consumers = 0;
        facts(&mut s, "orders").messages_dlx = vec![4, 5];
        let dlq = facts(&mut s, "orders.dlq");
        dlq.policies = policy(
            "cap",
            true,
            json!({"message-ttl": 1000, "queue-leader-locator": "balanced"}),
        );
        if let Some(p) = dlq.policies.as_mut() {
            p.notes = vec!["policies `a`, `b` match it with the same priority".into()];
        }
        (dlq.ready, dlq.messages, dlq.members) = (10, Some(12), Some((2, 3)));
        facts(&mut s, "orders.retry.1s").policies = policy(
            "loop",
            false,
            json!({"dead-letter-exchange": "", "dead-letter-routing-key": "orders"}),
        );
        s.dlx_bound.insert("orders".into(), Some(false));
        s.max_dlq = Some(5);
        s.handler_timeout.insert(
            "orders".into(),
            HandlerTimeout {
                ms: 2 * 3_600_000,
                source: "http://w:9090/metrics".into(),
            },
        );
        s.circuit.insert(
            "orders".into(),
            CircuitReading {
                state: Phase::Open,
                since: Some("2026-12-07T09:10:00.000Z".into()),
                for_ms: Some(45_000),
                probe_unusable: false,
            },
        );
        s.redrive
            .insert("orders".into(), Err("ACCESS_REFUSED".into()));
        s.permissions = Ok(UserPermissions {
            configure: "^$".into(),
            write: "^orders\\.(retry|dlx)$".into(),
            read: "^orders$".into(),
        });
        s.policies_from_queue_view = Some("policies read from the queues' statistics".into());
        s.idempotency.insert(
            "orders".into(),
            IdempotencyFacts {
                block: Idempotency {
                    keep_ms: 3_600_000,
                    ..Idempotency::default()
                },
                store: "sqlite:/var/lib/dlqctl/orders.db".into(),
                sqlite: true,
                reading: StoreReading::NotCreated,
            },
        );
        s.consumer_hosts
            .insert("orders".into(), vec!["10.0.0.1".into(), "10.0.0.2".into()]);
        s
    }

    /// No management API: nothing but AMQP's facts.
    fn unreachable(plan: &Plan) -> Snapshot {
        let mut s = healthy(plan);
        s.version = None;
        s.management = ManagementState::Unreachable("connection refused".into());
        s.permissions = Err(PermissionsUnknown::NoManagement);
        for f in s.queues.values_mut().flatten() {
            (f.messages, f.kind, f.policies, f.members) = (None, None, None, None);
            f.messages_dlx = vec![];
        }
        s.dlx_bound.insert("orders".into(), None);
        s.handler_timeout.clear();
        s.handler_timeout_error = Some("http://w:9090/metrics: connection refused".into());
        s.circuit.clear();
        s.idempotency.insert(
            "orders".into(),
            IdempotencyFacts {
                block: Idempotency::default(),
                store: "redis://:***@cache:6379/0".into(),
                sqlite: false,
                reading: StoreReading::Failed(
                    "idempotency store redis://:***@cache:6379/0 refused: WRONGPASS".into(),
                ),
            },
        );
        s
    }

    /// The management API of another broker, a version too old, a
    /// version that does not read, a user without permissions, a DLQ that
    /// dead-letters back into its pipeline.
    fn other_broker(plan: &Plan, version: &str) -> Snapshot {
        let mut s = healthy(plan);
        facts(&mut s, "orders.dlq").policies = policy(
            "loop",
            false,
            json!({"dead-letter-exchange": "", "dead-letter-routing-key": "orders"}),
        );
        s.version = Some(version.into());
        s.management = ManagementState::OtherBroker("the management API names node b".into());
        s.permissions = Err(PermissionsUnknown::NoneInVhost("guest".into()));
        s.idempotency.clear();
        s.redrive.clear();
        s
    }

    #[test]
    fn doctor_checklists_stay_as_they_are() {
        let short = plan("    dead_letter: {ttl: 1d, max_length: 10}\n");
        let plain = plan("");
        let lists = json!({
            "healthy": checklist(&plain, &healthy(&plain), None),
            "troubled": checklist(&short, &troubled(&short), None),
            "unreachable": checklist(&plain, &unreachable(&plain), None),
            "other_broker_3.9": checklist(&plain, &other_broker(&plain, "3.9.29"), None),
            "other_broker_unreadable": checklist(&plain, &other_broker(&plain, "x"), None),
            "only_another_pipeline": checklist(&plain, &healthy(&plain), Some("other")),
        });
        let text = serde_json::to_string_pretty(&lists).expect("JSON") + "\n";
        super::golden("doctor-checklists.json", &text);
    }
}
