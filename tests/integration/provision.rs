//! `dlqctl provision`, `--check`, `--dry-run` and `validate`, run as a user
//! runs them, against a real broker.

use crate::support::*;
use dlqctl::core::topology::{parse_topology, plan, ArgValue, Arguments, Plan};
use lapin::options::{BasicGetOptions, BasicNackOptions, QueueBindOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Two pipelines under prefix `p`: a quorum one with a topic exchange, a
/// 200ms and a 1s tier and a bounded DLQ, and a classic one with a headers
/// exchange.
fn topology(p: &str) -> String {
    topology_with_dlq_ttl(p, "1h")
}

fn topology_with_dlq_ttl(p: &str, ttl: &str) -> String {
    format!(
        r#"version: 1
defaults:
  retry: {{ delays: [200ms, 1s], max_attempts: 3, jitter: 0 }}
  dead_letter: {{ ttl: {ttl} }}
pipelines:
  - name: {p}-orders
    exchange: {{ name: {p}-orders-in, type: topic, bindings: ["order.created", "order.#"] }}
    delivery_limit: 7
    dead_letter: {{ queue: {p}-orders-failed, max_length: 1000 }}
    arguments: {{ x-max-length: 50000 }}
  - name: {p}-mail
    queue_type: classic
    exchange:
      name: {p}-mail-in
      type: headers
      bindings: [{{ arguments: {{ x-match: all, kind: mail, count: 3 }} }}]
    retry: {{ delays: [500ms] }}
    arguments: {{ x-max-priority: 5, x-single-active-consumer: true }}
"#
    )
}

fn plan_of(file: &Path) -> Plan {
    let text = std::fs::read_to_string(file).unwrap();
    let t = parse_topology(&text, &file.display().to_string()).expect("a valid topology");
    plan(&t)
}

/// The arguments as the management API shows them: integers as JSON
/// numbers, strings as JSON strings.
fn json_args(a: &Arguments) -> Map<String, Value> {
    a.iter()
        .map(|(k, v)| {
            let v = match v {
                ArgValue::Int(i) => json!(i),
                ArgValue::Str(s) => json!(s),
                ArgValue::Bool(b) => json!(b),
            };
            (k.clone(), v)
        })
        .collect()
}

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

async fn provision(file: &Path, extra: &[&str]) -> Run {
    Dlqctl::new("provision").arg(file).args(extra).run().await
}

/// Removes the binding `order.created` from the orders exchange to the
/// orders queue.
async fn unbind_order_created(ch: &lapin::Channel, c: &Cleanup) {
    let (queue, exchange) = (c.name("orders"), c.name("orders-in"));
    ch.queue_unbind(
        queue.as_str().into(),
        exchange.as_str().into(),
        "order.created".into(),
        FieldTable::default(),
    )
    .await
    .unwrap();
}

/// A test's broker connection, its names, and the scratch directory with
/// the [`topology`] of those names in `t.yaml`, not provisioned.
async fn written() -> (Broker, Cleanup, Scratch, PathBuf) {
    let b = Broker::connect().await;
    let c = Cleanup::new();
    let dir = Scratch::new();
    let file = dir.write("t.yaml", &topology(&c.prefix));
    (b, c, dir, file)
}

/// As [`written`], provisioned (`dlqctl provision` exits 0).
async fn provisioned() -> (Broker, Cleanup, Scratch, PathBuf) {
    let (b, c, dir, file) = written().await;
    provision(&file, &[]).await.assert_code(0);
    (b, c, dir, file)
}

/// Every queue's and exchange's description and every planned binding's
/// list, for comparing before and after.
async fn snapshot(b: &Broker, plan: &Plan) -> Vec<Value> {
    let mut out = Vec::new();
    for q in &plan.queues {
        let i = b.mgmt.queue(&q.name).await.expect("queue exists");
        out.push(json!({"queue": q.name, "arguments": i.arguments, "durable": i.durable, "type": i.kind}));
    }
    for e in &plan.exchanges {
        let x = b.mgmt.exchange(&e.name).await.expect("exchange exists");
        out.push(json!({"exchange": e.name, "type": x["type"], "durable": x["durable"],
            "auto_delete": x["auto_delete"], "internal": x["internal"], "arguments": x["arguments"]}));
    }
    for bd in &plan.bindings {
        let mut list: Vec<Value> = b
            .mgmt
            .bindings(&bd.exchange, &bd.queue)
            .await
            .into_iter()
            .map(|x| json!({"key": x["routing_key"], "arguments": x["arguments"]}))
            .collect();
        list.sort_by_key(|v| v.to_string());
        out.push(json!({"binding": [bd.exchange, bd.queue], "list": list}));
    }
    out
}

#[tokio::test]
async fn provision_creates_every_object_with_the_planned_arguments() {
    let (b, _c, _dir, file) = written().await;
    let plan = plan_of(&file);
    assert_eq!(
        (plan.exchanges.len(), plan.queues.len(), plan.bindings.len()),
        (6, 7, 8)
    );

    let run = provision(&file, &[]).await;
    run.assert_code(0);
    assert!(
        run.stdout
            .contains("provisioned 6 exchanges, 7 queues, 8 bindings"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(": 13 created, 0 unchanged"),
        "{}",
        run.stdout
    );
    for q in &plan.queues {
        let line = format!("  created queue {}\n", q.name);
        assert!(run.stdout.contains(&line), "no `{line}` in {}", run.stdout);
    }

    for q in &plan.queues {
        let Some(info) = b.mgmt.queue(&q.name).await else {
            panic!("queue {} was not created", q.name);
        };
        // Exact equality: same keys, and integers stay numbers, strings stay
        // strings, booleans stay booleans.
        assert_eq!(
            info.arguments,
            json_args(&q.arguments),
            "arguments of {}",
            q.name
        );
        let wanted_type = match q.arguments.get("x-queue-type") {
            Some(ArgValue::Str(t)) => t.clone(),
            other => panic!("plan of {} has x-queue-type {other:?}", q.name),
        };
        assert_eq!(info.kind, wanted_type, "type of {}", q.name);
        assert!(info.durable, "{} is not durable", q.name);
        assert_eq!(info.raw["auto_delete"], json!(false), "{}", q.name);
        assert_eq!(info.raw["exclusive"], json!(false), "{}", q.name);
    }
    // The two pipelines really are of both types.
    let types: Vec<String> = {
        let mut v = Vec::new();
        for q in &plan.queues {
            v.push(b.mgmt.queue(&q.name).await.unwrap().kind);
        }
        v
    };
    assert!(types.iter().any(|t| t == "quorum") && types.iter().any(|t| t == "classic"));

    for e in &plan.exchanges {
        let Some(x) = b.mgmt.exchange(&e.name).await else {
            panic!("exchange {} was not created", e.name);
        };
        assert_eq!(x["type"], json!(e.kind.as_str()), "type of {}", e.name);
        assert_eq!(x["durable"], json!(true), "{}", e.name);
        assert_eq!(x["auto_delete"], json!(false), "{}", e.name);
        assert_eq!(x["internal"], json!(false), "{}", e.name);
        assert_eq!(x["arguments"], json!({}), "{}", e.name);
    }

    for bd in &plan.bindings {
        let list = b.mgmt.bindings(&bd.exchange, &bd.queue).await;
        let planned_here = plan
            .bindings
            .iter()
            .filter(|x| x.exchange == bd.exchange && x.queue == bd.queue)
            .count();
        assert_eq!(
            list.len(),
            planned_here,
            "bindings {} -> {}: {list:?}",
            bd.exchange,
            bd.queue
        );
        let found = list.iter().any(|x| {
            x["routing_key"] == json!(bd.routing_key)
                && x["arguments"] == Value::Object(json_args(&bd.arguments))
        });
        assert!(
            found,
            "binding {} -> {} [{}] {:?} not found in {list:?}",
            bd.exchange, bd.queue, bd.routing_key, bd.arguments
        );
    }
}

#[tokio::test]
async fn a_second_provision_changes_nothing_and_keeps_messages() {
    let (b, c, _dir, file) = written().await;
    let plan = plan_of(&file);
    provision(&file, &[]).await.assert_code(0);

    let main = c.name("orders");
    b.publish(&c.name("orders-in"), "order.created", b"kept")
        .await;
    b.wait_for_count(&main, 1, Duration::from_secs(10)).await;
    let before = snapshot(&b, &plan).await;
    let queues_before = b.mgmt.names_with_prefix("queues", &c.prefix).await.unwrap();

    let run = provision(&file, &[]).await;
    run.assert_code(0);
    assert!(run.stderr.trim().is_empty(), "stderr: {}", run.stderr);
    assert!(
        run.stdout.contains(": 0 created, 13 unchanged"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("created queue"), "{}", run.stdout);
    let run = provision(&file, &["--json"]).await;
    run.assert_code(0);
    let v: Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert_eq!(v["created"], json!([]), "{v:#}");
    assert_eq!(v["unchanged"].as_array().map(Vec::len), Some(13), "{v:#}");
    assert_eq!(v["bindings_declared"], 8, "{v:#}");
    // The count says what it holds: every exchange, queue and binding is
    // as the file wants it.
    assert_eq!(v["objects_as_wanted"], 13 + 8, "{v:#}");
    assert!(v.get("ok").is_none(), "{v:#}");
    assert!(
        v["unchanged"]
            .as_array()
            .unwrap()
            .contains(&json!({"object": "queue", "name": main})),
        "{v:#}"
    );

    assert_eq!(snapshot(&b, &plan).await, before);
    let queues_after = b.mgmt.names_with_prefix("queues", &c.prefix).await.unwrap();
    assert_eq!(queues_after, queues_before);
    assert_eq!(b.message_count(&main).await, Some(1));
    let m = b.get(&main).await.expect("the message is still there");
    assert_eq!(m.data, b"kept");
}

#[tokio::test]
async fn check_passes_on_a_provisioned_topology_and_names_a_changed_ttl() {
    let (b, c, dir, file) = provisioned().await;

    let run = provision(&file, &["--check"]).await;
    run.assert_code(0)
        .assert_stdout_has(&["matches the topology"]);

    // The file now wants a 2h DLQ retention; the broker has 1h.
    let file = dir.write("t.yaml", &topology_with_dlq_ttl(&c.prefix, "2h"));
    let run = provision(&file, &["--check"]).await;
    run.assert_code(3);
    for dlq in [c.name("orders-failed"), c.name("mail.dlq")] {
        let line =
            format!("queue {dlq}: x-message-ttl differs: wanted 7200000, broker has 3600000");
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    // Only those two differ.
    assert_eq!(
        run.stdout.matches(" differs: ").count(),
        2,
        "{}",
        run.stdout
    );
    // --check changed nothing.
    let q = b.mgmt.queue(&c.name("orders-failed")).await.unwrap();
    assert_eq!(q.arguments["x-message-ttl"], json!(3600000));
}

#[tokio::test]
async fn check_on_a_missing_topology_lists_everything_and_creates_nothing() {
    let (b, _c, _dir, file) = written().await;
    let plan = plan_of(&file);

    let run = provision(&file, &["--check"]).await;
    run.assert_code(3);
    for q in &plan.queues {
        let line = format!("missing queue {}\n", q.name);
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    for e in &plan.exchanges {
        let line = format!("missing exchange {}\n", e.name);
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    for bd in &plan.bindings {
        let line = format!(
            "missing binding {} -> {} [{}]",
            bd.exchange, bd.queue, bd.routing_key
        );
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    for q in &plan.queues {
        assert!(
            b.mgmt.queue(&q.name).await.is_none(),
            "{} was created",
            q.name
        );
    }
    for e in &plan.exchanges {
        assert!(
            b.mgmt.exchange(&e.name).await.is_none(),
            "{} was created",
            e.name
        );
    }
}

#[tokio::test]
async fn provision_reports_every_drifted_argument_and_keeps_the_messages() {
    let (b, c, _dir, file) = written().await;
    let main = c.name("orders");

    // The main queue as someone else declared it: another delivery limit
    // (7 wanted), an x-max-length-bytes the topology does not have, and no
    // x-overflow. The broker would name only one of them per refusal.
    b.declare_queue(
        &main,
        table(&[
            ("x-queue-type", s("quorum")),
            ("x-dead-letter-exchange", s(&c.name("orders.dlx"))),
            ("x-dead-letter-strategy", s("at-least-once")),
            ("x-delivery-limit", AMQPValue::LongLongInt(5)),
            ("x-max-length", AMQPValue::LongLongInt(50000)),
            ("x-max-length-bytes", AMQPValue::LongLongInt(1_048_576)),
        ]),
    )
    .await;
    for i in 0..3 {
        b.publish("", &main, format!("m{i}").as_bytes()).await;
    }
    b.wait_for_count(&main, 3, Duration::from_secs(10)).await;

    let run = provision(&file, &[]).await;
    run.assert_code(1);
    for line in [
        format!("queue {main}: x-delivery-limit differs: wanted 7, broker has 5"),
        format!("queue {main}: x-max-length-bytes differs: wanted none, broker has 1048576"),
        format!("queue {main}: x-overflow differs: wanted \"reject-publish\", broker has none"),
    ] {
        assert!(run.stderr.contains(&line), "no `{line}` in\n{}", run.stderr);
    }
    assert_eq!(
        run.stderr.matches(" differs: ").count(),
        3,
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("hint: RabbitMQ cannot change a queue's arguments"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("Migrate"), "{}", run.stderr);

    assert!(
        run.stderr.contains("nothing was declared"),
        "{}",
        run.stderr
    );

    // The queue is left as it was, messages included.
    assert_eq!(b.message_count(&main).await, Some(3));
    let q = b.mgmt.queue(&main).await.unwrap();
    assert_eq!(q.arguments["x-delivery-limit"], json!(5));
    assert!(!q.arguments.contains_key("x-overflow"));
    // All or nothing: none of the missing objects was created.
    let plan = plan_of(&file);
    for q in plan.queues.iter().filter(|q| q.name != main) {
        assert!(b.mgmt.queue(&q.name).await.is_none(), "{} created", q.name);
    }
    for e in &plan.exchanges {
        assert!(
            b.mgmt.exchange(&e.name).await.is_none(),
            "{} created",
            e.name
        );
    }

    // The same with --json: every difference, nothing created.
    let run = provision(&file, &["--json"]).await;
    run.assert_code(1);
    let v: Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert_eq!(v["status"], "drift", "{v:#}");
    assert_eq!(v["created"], json!([]), "{v:#}");
    assert_eq!(v["findings"].as_array().map(Vec::len), Some(3), "{v:#}");
}

#[tokio::test]
async fn an_exchange_of_another_type_is_reported() {
    let (b, c, _dir, file) = written().await;
    let ex = c.name("orders-in");
    let ch = b.channel().await;
    ch.exchange_declare(
        ex.as_str().into(),
        lapin::ExchangeKind::Direct,
        lapin::options::ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();

    let line = format!("exchange {ex}: type differs: wanted topic, broker has direct");
    let run = provision(&file, &[]).await;
    run.assert_code(1);
    assert!(run.stderr.contains(&line), "no `{line}` in\n{}", run.stderr);

    let run = provision(&file, &["--check"]).await;
    run.assert_code(3);
    assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    assert_eq!(b.mgmt.exchange(&ex).await.unwrap()["type"], json!("direct"));
}

#[tokio::test]
async fn check_with_refused_management_credentials_says_so_and_does_not_claim_a_match() {
    let (_b, _c, _dir, file) = provisioned().await;
    let mut url = reqwest::Url::parse(&management_url()).unwrap();
    url.set_username("guest").unwrap();
    url.set_password(Some("not-the-password")).unwrap();
    let run = provision(&file, &["--check", "--management-url", url.as_str()]).await;
    run.assert_code(0)
        .assert_stdout_has(&["401", "refused user `guest`"]);
    assert!(!run.stdout.contains("does not answer"), "{}", run.stdout);
    assert!(
        !run.stdout.contains("matches the topology"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("could not be verified"),
        "{}",
        run.stdout
    );
    assert!(
        !run.output().contains("not-the-password"),
        "{}",
        run.output()
    );
}

#[tokio::test]
async fn check_without_the_management_api_leaves_bindings_unverified() {
    let (b, c, _dir, file) = written().await;
    let plan = plan_of(&file);
    provision(&file, &[]).await.assert_code(0);
    let no_api = ["--check", "--management-url", "http://127.0.0.1:1"];

    // Unverified alone is not a difference: exit 0, every binding listed.
    let run = provision(&file, &no_api).await;
    run.assert_code(0);
    for bd in &plan.bindings {
        let line = format!(
            "unverified binding {} -> {} [{}]",
            bd.exchange, bd.queue, bd.routing_key
        );
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    // The API that did not answer is named once, not once per binding.
    assert_eq!(
        run.stdout.matches("http://127.0.0.1:1").count(),
        1,
        "{}",
        run.stdout
    );

    // Remove one binding: the management API sees it, AMQP alone cannot.
    let ch = b.channel().await;
    unbind_order_created(&ch, &c).await;
    let missing = format!(
        "missing binding {} -> {} [order.created]",
        c.name("orders-in"),
        c.name("orders")
    );
    let run = provision(&file, &["--check"]).await;
    run.assert_code(3);
    assert!(run.stdout.contains(&missing), "{}", run.stdout);
    let run = provision(&file, &no_api).await;
    run.assert_code(0);
    assert!(!run.stdout.contains(&missing), "{}", run.stdout);
}

#[tokio::test]
async fn a_rejected_message_ends_in_the_dlq() {
    let (b, c, _dir, _file) = provisioned().await;
    let (main, dlq) = (c.name("orders"), c.name("orders-failed"));

    b.publish(&c.name("orders-in"), "order.paid", b"poison")
        .await;
    b.wait_for_count(&main, 1, Duration::from_secs(10)).await;
    let ch = b.channel().await;
    let m = ch
        .basic_get(main.as_str().into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .expect("a message in the main queue");
    m.delivery
        .acker
        .nack(BasicNackOptions {
            multiple: false,
            requeue: false,
        })
        .await
        .unwrap();

    b.wait_for_count(&dlq, 1, Duration::from_secs(10)).await;
    assert_eq!(b.message_count(&main).await, Some(0));
    let d = b.get(&dlq).await.unwrap();
    assert_eq!(d.data, b"poison");
    let death = first_death(&d);
    assert_eq!(death.0, "rejected");
    assert_eq!(death.1, main);
}

/// `(reason, queue)` of the newest `x-death` entry.
fn first_death(d: &lapin::message::Delivery) -> (String, String) {
    let headers = d.properties.headers().clone().expect("headers");
    let Some(AMQPValue::FieldArray(a)) = headers.inner().get("x-death").cloned() else {
        panic!("no x-death in {headers:?}");
    };
    let Some(AMQPValue::FieldTable(t)) = a.as_slice().first().cloned() else {
        panic!("empty x-death");
    };
    let text = |k: &str| match t.inner().get(k) {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("x-death {k}: {other:?}"),
    };
    (text("reason"), text("queue"))
}

#[tokio::test]
async fn a_retry_comes_back_to_the_main_queue_and_nowhere_else() {
    let (b, c, _dir, _file) = provisioned().await;
    let (main, tier) = (c.name("orders"), c.name("orders.retry.200ms"));

    // Another consumer of the producers' exchange: it must not see retries.
    let spy = c.name("spy");
    b.declare_queue(&spy, table(&[("x-queue-type", s("classic"))]))
        .await;
    let ch = b.channel().await;
    ch.queue_bind(
        spy.as_str().into(),
        c.name("orders-in").as_str().into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();

    let start = Instant::now();
    b.publish(&c.name("orders.retry"), "200ms", b"again").await;
    b.wait_for_count(&main, 1, Duration::from_secs(10)).await;
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(150),
        "back after {waited:?}"
    );

    assert_eq!(b.message_count(&tier).await, Some(0));
    assert_eq!(
        b.message_count(&spy).await,
        Some(0),
        "the spy queue saw the retry"
    );
    assert_eq!(b.message_count(&c.name("orders-failed")).await, Some(0));
    let m = b.get(&main).await.unwrap();
    assert_eq!(m.data, b"again");
    assert_eq!(m.exchange.as_str(), "");
    assert_eq!(m.routing_key.as_str(), main);
    assert_eq!(first_death(&m), ("expired".to_string(), tier));
    // The spy queue works: a producer's message reaches it.
    b.publish(&c.name("orders-in"), "order.created", b"x").await;
    b.wait_for_count(&spy, 1, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn validate_accepts_every_example_topology() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("topology");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no example in {}", dir.display());
    for f in &files {
        let run = Dlqctl::new("validate").arg(f).run().await;
        run.assert_code(0);
        assert!(
            run.stdout.contains(": valid, "),
            "{}: {}",
            f.display(),
            run.stdout
        );
    }
}

/// `validate` warns on a password written in the file and says what
/// `key: body_sha256` means, never printing the password; the file stays
/// valid (exit 0, the same summary).
#[tokio::test]
async fn validate_warns_on_an_inline_store_password_and_on_body_sha256() {
    let dir = Scratch::new();
    let file = dir.write(
        "idem.yaml",
        "version: 1\n\
         pipelines:\n\
         \x20 - name: a\n\
         \x20   idempotency: {store: 'redis://:hunter2-s3cret@cache:6379/0'}\n\
         \x20 - name: b\n\
         \x20   idempotency: {key: body_sha256, store: 'env:IDEMPOTENCY_STORE'}\n\
         \x20 - name: c\n\
         \x20   idempotency: true\n",
    );
    let run = Dlqctl::new("validate").arg(&file).run().await;
    run.assert_code(0);
    assert!(
        run.stdout.contains(": valid, 3 pipeline(s)"),
        "{}",
        run.output()
    );
    assert!(!run.output().contains("hunter2-s3cret"), "{}", run.output());
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", run.output());
    let at = |line: u32| format!("{}:{line}: ", file.display());
    assert!(
        lines[0].starts_with(&format!(
            "{}warning: pipeline a: idempotency.store redis://:***@cache:6379/0 has its password \
             written in the topology file",
            at(3)
        )) && lines[0].contains("`store: env:NAME`"),
        "{}",
        run.output()
    );
    assert!(
        lines[1].starts_with(&format!(
            "{}note: pipeline b: idempotency.key body_sha256 treats identical bodies as one \
             message",
            at(5)
        )),
        "{}",
        run.output()
    );
    // A file without either: nothing on stderr.
    let plain = dir.write(
        "plain.yaml",
        "version: 1\npipelines:\n  - name: a\n    idempotency: {store: 'env:STORE'}\n",
    );
    let run = Dlqctl::new("validate").arg(&plain).run().await;
    run.assert_code(0);
    assert_eq!(run.stderr, "", "{}", run.output());
}

/// Settings that are valid but cannot do what they are for are warned
/// about, at their pipeline's line, exit 0: a `keep` too short to remember
/// a handled key until a duplicate comes, and a breaker whose `min_calls`
/// no worker reaches within its `window`, so that it never opens.
#[tokio::test]
async fn validate_warns_on_a_keep_too_short_and_a_breaker_that_never_opens() {
    let dir = Scratch::new();
    let file = dir.write(
        "odd.yaml",
        "version: 1\n\
         pipelines:\n\
         \x20 - name: a\n\
         \x20   idempotency: {store: 'env:STORE', keep: 1ms}\n\
         \x20 - name: b\n\
         \x20   circuit_breaker: {window: 1ms, min_calls: 100000000}\n\
         \x20 - name: c\n\
         \x20   idempotency: {store: 'env:STORE', keep: 1h}\n\
         \x20   circuit_breaker: {window: 1m, min_calls: 20}\n",
    );
    let run = Dlqctl::new("validate").arg(&file).run().await;
    run.assert_code(0);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", run.output());
    let at = |line: u32| format!("{}:{line}: warning: pipeline ", file.display());
    assert!(
        lines[0].starts_with(&format!("{}a: idempotency.keep 1ms", at(3))),
        "{}",
        run.output()
    );
    assert!(
        lines[1].starts_with(&format!("{}b: circuit_breaker", at(5)))
            && lines[1].contains("never open"),
        "{}",
        run.output()
    );
}

#[tokio::test]
async fn validate_reports_every_problem_with_its_position() {
    let dir = Scratch::new();
    let file = dir.write(
        "bad.yaml",
        "version: 1\n\
         defaults:\n\
         \x20 retry: { delays: [], max_attempts: 0, jitter: 0.9 }\n\
         pipelines:\n\
         \x20 - name: a\n\
         \x20   bogus: 1\n\
         \x20   queue_type: classic\n\
         \x20   delivery_limit: 5\n",
    );
    let run = Dlqctl::new("validate").arg(&file).run().await;
    run.assert_code(2);
    let prefix = format!("{}:", file.display());
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(lines.len() >= 5, "{}", run.stderr);
    for l in &lines {
        // FILE:LINE:COL: message
        let rest = l
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("`{l}` does not start with `{prefix}`"));
        let mut parts = rest.splitn(3, ':');
        let line: u32 = parts
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("{l}"));
        let col: u32 = parts
            .next()
            .unwrap_or("")
            .parse()
            .unwrap_or_else(|_| panic!("{l}"));
        let msg = parts.next().unwrap_or("");
        assert!(
            line >= 1 && col >= 1 && msg.starts_with(' ') && msg.len() > 1,
            "{l}"
        );
    }
    for pos in [":3:", ":6:5: unknown key `bogus`", ":8:"] {
        assert!(
            lines.iter().any(|l| l.contains(pos)),
            "nothing at {pos}:\n{}",
            run.stderr
        );
    }
}

#[tokio::test]
async fn dry_run_contacts_no_broker_and_prints_the_plan() {
    let c = Cleanup::new();
    let dir = Scratch::new();
    let file = dir.write("t.yaml", &topology(&c.prefix));
    let plan = plan_of(&file);
    let nowhere = ["--dry-run", "--url", "amqp://guest:guest@127.0.0.1:1/%2f"];

    let run = provision(&file, &nowhere).await;
    run.assert_code(0);
    for q in &plan.queues {
        assert!(
            run.stdout.contains(&format!("queue    {} ", q.name)),
            "{}",
            run.stdout
        );
    }
    assert!(run.stdout.contains("6 exchanges, 7 queues, 8 bindings"));

    let mut json_args = nowhere.to_vec();
    json_args.push("--json");
    let run = provision(&file, &json_args).await;
    run.assert_code(0);
    let v: Value = serde_json::from_str(&run.stdout).expect("--dry-run --json is JSON");
    for k in ["exchanges", "queues", "bindings"] {
        assert!(v[k].is_array(), "no {k} array in {v}");
    }
    assert_eq!(v["queues"].as_array().unwrap().len(), 7);
    assert_eq!(v["queues"][0]["name"], json!(c.name("orders")));
    assert_eq!(
        v["queues"][0]["arguments"],
        Value::Object(json_args_of(&plan.queues[0].arguments))
    );
    assert_eq!(v, serde_json::to_value(&plan).unwrap());
}

fn json_args_of(a: &Arguments) -> Map<String, Value> {
    json_args(a)
}

/// The lines that say what went wrong (`error: ...`); panics when stderr
/// holds anything else than those and the hint line after them (log
/// noise such as lapin's I/O-loop errors).
fn error_lines(stderr: &str) -> Vec<&str> {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() <= 2, "more than an error and a hint:\n{stderr}");
    lines
        .into_iter()
        .filter(|l| l.starts_with("error:"))
        .collect()
}

/// Asserts that `run` exited 1 within 15 s with exactly one error line,
/// nothing on stdout and `password` nowhere; returns the error line.
#[track_caller]
fn the_one_error<'a>(run: &'a Run, password: &str) -> &'a str {
    run.assert_code(1);
    assert!(
        run.elapsed < Duration::from_secs(15),
        "took {:?}",
        run.elapsed
    );
    let errors = error_lines(&run.stderr);
    assert_eq!(errors.len(), 1, "{}", run.stderr);
    assert!(!run.output().contains(password), "{}", run.output());
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    errors[0]
}

#[tokio::test]
async fn a_refused_port_fails_fast_with_one_clear_line_and_no_password() {
    let dir = Scratch::new();
    let file = dir.write("t.yaml", &topology(&unique_prefix()));
    // In the environment, where a password belongs (on the command line
    // it adds a warning line: tests/integration/secrets.rs).
    let run = Dlqctl::new("provision")
        .arg(&file)
        .env("AMQP_URL", "amqp://guest:secretpw@127.0.0.1:1/%2f")
        .run()
        .await;
    let error = the_one_error(&run, "secretpw");
    assert!(error.contains("127.0.0.1:1"), "{error}");
    assert!(error.contains("refused"), "{error}");
    run.assert_stderr_has(&["rabbitmq-server -detached"]);
}

#[tokio::test]
async fn a_wrong_password_says_the_login_was_refused_and_hides_it() {
    let _b = Broker::connect().await;
    let dir = Scratch::new();
    let file = dir.write("t.yaml", &topology(&unique_prefix()));
    let url = amqp_url();
    let parsed = dlqctl::amqp::connection::BrokerUrl::parse(&url).unwrap();
    let bad = format!(
        "amqp://{}:wrongpw123@{}/{}",
        parsed.user(),
        parsed.endpoint(),
        "%2f"
    );
    let run = Dlqctl::new("provision")
        .arg(&file)
        .env("AMQP_URL", &bad)
        .run()
        .await;
    let error = the_one_error(&run, "wrongpw123");
    assert!(error.contains("refused the login"), "{error}");
}

/// A tier removed from the file and a producer binding dropped from it
/// stay on the broker (provision never deletes): `--check` lists them as
/// not in the topology and exits 3, and touches nothing.
#[tokio::test]
async fn check_lists_objects_the_file_no_longer_describes() {
    let (b, c, dir, _file) = provisioned().await;

    let smaller = topology(&c.prefix)
        .replace("delays: [200ms, 1s]", "delays: [200ms]")
        .replace(
            r#"bindings: ["order.created", "order.#"]"#,
            r#"bindings: ["order.#"]"#,
        );
    let file = dir.write("t.yaml", &smaller);
    let run = provision(&file, &["--check"]).await;
    run.assert_code(3);
    let old_tier = c.name("orders.retry.1s");
    for line in [
        format!("not in the topology: queue {old_tier} ("),
        format!(
            "not in the topology: binding {} -> {old_tier} [1s]",
            c.name("orders.retry")
        ),
        format!(
            "not in the topology: binding {} -> {} [order.created]",
            c.name("orders-in"),
            c.name("orders")
        ),
    ] {
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    assert_eq!(
        run.stdout.matches("not in the topology:").count(),
        3,
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("never deletes"), "{}", run.stdout);
    // Nothing was deleted, and the JSON report names the same objects.
    assert!(b.mgmt.queue(&old_tier).await.is_some());
    let run = provision(&file, &["--check", "--json"]).await;
    run.assert_code(3);
    let doc: Value = serde_json::from_str(run.stdout.trim()).expect("one JSON document");
    let stale: Vec<&Value> = doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["finding"] == "not_in_topology")
        .collect();
    assert_eq!(stale.len(), 3, "{doc:#}");
}

/// `--check --format github`: each finding is a GitHub Actions annotation
/// on the line of its pipeline's `- name:` in the file (as given, escaped),
/// the exit code stays 3, and bindings the check cannot verify are
/// warnings.
#[tokio::test]
async fn check_format_github_annotates_each_finding_on_its_pipeline_line() {
    let b = Broker::connect().await;
    let c = Cleanup::new();
    let dir = Scratch::new();
    let dir_shown = dir.path().display().to_string();
    assert!(!dir_shown.contains([',', ':', '%']), "{dir_shown}");
    // A comma in the name: escaped as %2C in the `file` property.
    let file = dir.write("drift,t.yaml", &topology(&c.prefix));
    let shown = format!("{dir_shown}/drift%2Ct.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let line_of = |p: &str| {
        1 + text
            .lines()
            .position(|l| l == format!("  - name: {}", c.name(p)))
            .expect("the pipeline's line")
    };
    assert_eq!((line_of("orders"), line_of("mail")), (6, 11));
    provision(&file, &[]).await.assert_code(0);
    let run = provision(&file, &["--check", "--format", "github"]).await;
    run.assert_code(0);
    assert!(!run.stdout.contains("::"), "{}", run.stdout);

    // Delete a tier queue of `mail` and a producer binding of `orders`.
    let ch = b.channel().await;
    ch.queue_delete(
        c.name("mail.retry.500ms").as_str().into(),
        Default::default(),
    )
    .await
    .unwrap();
    unbind_order_created(&ch, &c).await;

    let run = provision(&file, &["--check", "--format", "github"]).await;
    run.assert_code(3);
    let annotations: Vec<&str> = run.stdout.lines().filter(|l| l.starts_with("::")).collect();
    let error = |line: u32, message: String| {
        format!("::error file={shown},line={line},title=dlqctl drift::{message}")
    };
    assert_eq!(
        annotations,
        vec![
            error(11, format!("missing queue {}", c.name("mail.retry.500ms"))),
            error(
                6,
                format!(
                    "missing binding {} -> {} [order.created]",
                    c.name("orders-in"),
                    c.name("orders")
                )
            ),
            error(
                11,
                format!(
                    "missing binding {} -> {} [500ms]",
                    c.name("mail.retry"),
                    c.name("mail.retry.500ms")
                )
            ),
        ],
        "{}",
        run.stdout
    );
    // The other lines are the text headline, for the log.
    assert!(
        run.stdout
            .starts_with(&format!("{}: the broker differs", file.display())),
        "{}",
        run.stdout
    );

    // Without the management API the bindings are unverified: warnings;
    // the missing queue still fails the check.
    let no_api = [
        "--check",
        "--format",
        "github",
        "--management-url",
        "http://127.0.0.1:1",
    ];
    let run = provision(&file, &no_api).await;
    run.assert_code(3);
    let warning = format!(
        "::warning file={shown},line=6,title=dlqctl unverified::unverified binding {} -> {} [order.created]: ",
        c.name("orders-in"),
        c.name("orders")
    );
    assert!(
        run.stdout.lines().any(|l| l.starts_with(&warning)),
        "no `{warning}` in\n{}",
        run.stdout
    );
    assert_eq!(run.stdout.matches("::error ").count(), 1, "{}", run.stdout);

    // --json is --format json; disagreeing with --format is bad usage.
    let run = provision(&file, &["--check", "--json", "--format", "github"]).await;
    run.assert_code(2);
    assert!(run.stderr.contains("--format github"), "{}", run.stderr);

    // provision's drift (exit 1) is annotated too; its report and hint
    // stay on stderr.
    std::fs::write(
        &file,
        text.replace("delivery_limit: 7", "delivery_limit: 8"),
    )
    .unwrap();
    let run = provision(&file, &["--format", "github"]).await;
    run.assert_code(1);
    assert_eq!(
        run.stdout,
        format!(
            "{}\n",
            error(
                6,
                format!(
                    "queue {}: x-delivery-limit differs: wanted 8, broker has 7",
                    c.name("orders")
                )
            )
        )
    );
    assert!(run.stderr.contains("hint: "), "{}", run.stderr);
}

// ---------------------------------------------------------------- policies

use crate::support::policy::{Kind, PolicyGuard};

/// Every queue the fixture's file plans.
fn planned_queues(file: &Path) -> Vec<String> {
    plan_of(file).queues.into_iter().map(|q| q.name).collect()
}

/// The quorum queues the fixture's file plans.
fn planned_quorum_queues(file: &Path) -> Vec<String> {
    plan_of(file)
        .queues
        .into_iter()
        .filter(|q| q.arguments.get("x-queue-type") == Some(&ArgValue::Str("quorum".into())))
        .map(|q| q.name)
        .collect()
}

fn json_findings(run: &Run) -> Vec<Value> {
    let doc: Value = serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("--json: {e}\n{}", run.output()));
    doc["findings"].as_array().cloned().unwrap_or_default()
}

/// The operator policy of issue 28 (`{"message-ttl":1000,"max-length":5}`,
/// which made a 14-day DLQ lose a message after 3 s): `--check` names it
/// and each key it overrides, on every queue it cuts, in every format, and
/// exits 3. A key the queue's own lower argument beats is information.
#[tokio::test]
async fn check_names_an_operator_policy_and_each_key_it_overrides() {
    let (b, c, _dir, file) = provisioned().await;
    let cap = json!({"message-ttl": 1000, "max-length": 5});
    let op = PolicyGuard::set(&c, Kind::Operator, "cap", "", cap).await;
    op.wait_applied(&b, &planned_queues(&file)).await;

    let run = provision(&file, &["--check"]).await;
    run.assert_code(3);
    let name = &op.name;
    let dlq = c.name("orders-failed");
    for line in [
        format!("queue {dlq}: operator policy `{name}` overrides message-ttl: effective 1000, wanted 3600000"),
        format!("queue {dlq}: operator policy `{name}` overrides max-length: effective 5, wanted 1000"),
        // The main queue's own x-max-length is higher: the policy's applies.
        format!("queue {}: operator policy `{name}` overrides max-length: effective 5, wanted 50000", c.name("orders")),
        // The classic main queue has no limit at all.
        format!("queue {}: operator policy `{name}` overrides max-length: effective 5, wanted none (the topology leaves this queue unbounded; when full, overflow drop-head drops its oldest messages", c.name("mail")),
        // A tier's 200 ms TTL is lower than the policy's: it still applies.
        format!("info: queue {}: operator policy `{name}` sets message-ttl = 1000 (the queue's argument (200) is lower and applies)", c.name("orders.retry.200ms")),
    ] {
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    assert!(run.stdout.contains("hint: a policy"), "{}", run.stdout);

    let run = provision(&file, &["--check", "--json"]).await;
    run.assert_code(3);
    let findings = json_findings(&run);
    let on_dlq: Vec<&Value> = findings
        .iter()
        .filter(|f| f["finding"] == "policy_overrides" && f["name"] == json!(dlq))
        .collect();
    assert_eq!(on_dlq.len(), 2, "{findings:#?}");
    for f in &on_dlq {
        assert_eq!(f["policy_kind"], "operator_policy", "{f:#}");
        assert_eq!(f["policy"], json!(name), "{f:#}");
    }

    let run = provision(&file, &["--check", "--format", "github"]).await;
    run.assert_code(3);
    let error = format!(
        "title=dlqctl drift::queue {dlq}: operator policy `{name}` overrides message-ttl: effective 1000"
    );
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("::error ") && l.contains(&error)),
        "no `{error}` in\n{}",
        run.stdout
    );

    // Without the management API the policies cannot be seen: one
    // unverified line for them all, exit 0 (nothing else differs).
    let run = provision(
        &file,
        &["--check", "--management-url", "http://127.0.0.1:1"],
    )
    .await;
    run.assert_code(0);
    assert_eq!(
        run.stdout
            .matches("unverified queue (policies of the")
            .count(),
        1,
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("overrides"), "{}", run.stdout);
}

/// A plain `{"overflow":"drop-head"}` policy beats the quorum queues'
/// `x-overflow: reject-publish` (their at-least-once dead-lettering falls
/// back to at-most-once): exit 3, named on each. On the classic pipeline
/// the argument (or the default) stands: information.
#[tokio::test]
async fn check_fails_on_a_drop_head_overflow_policy() {
    let (b, c, _dir, file) = provisioned().await;
    let p = PolicyGuard::set(&c, Kind::Policy, "dh", "", json!({"overflow": "drop-head"})).await;
    p.wait_applied(&b, &planned_queues(&file)).await;

    let run = provision(&file, &["--check"]).await;
    run.assert_code(3);
    for q in planned_quorum_queues(&file) {
        let line = format!(
            "queue {q}: policy `{}` overrides overflow: effective \"drop-head\", wanted \"reject-publish\"",
            p.name
        );
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    let classic = format!(
        "info: queue {}: policy `{}` sets overflow = \"drop-head\" (what the queue does without it)",
        c.name("mail"),
        p.name
    );
    assert!(
        run.stdout.contains(&classic),
        "no `{classic}` in\n{}",
        run.stdout
    );
}

/// Waits until the management API has reported every queue's policy
/// fields (empty ones too): from then on a policy change shows there only
/// with the queues' next statistics, seconds later.
async fn wait_reported(b: &Broker, queues: &[String]) {
    let start = Instant::now();
    for q in queues {
        loop {
            let raw = b.mgmt.queue(q).await.map(|i| i.raw).unwrap_or_default();
            if !raw["effective_policy_definition"].is_null() {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{q}: {raw:#}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Issue 38, finding 3: a policy and an operator policy set a moment ago
/// are seen at once by `--check`, `doctor` and `status`, which work them
/// out from the policy definitions; the queues' own fields, refreshed only
/// with their statistics, still show nothing for seconds (what the
/// commands read before, passing with exit 0).
#[tokio::test]
async fn check_doctor_and_status_see_a_policy_set_a_moment_ago() {
    let (b, c, _dir, file) = provisioned().await;
    wait_reported(&b, &planned_queues(&file)).await;
    let (dlq, main) = (c.name("orders-failed"), c.name("orders"));
    let ttl = json!({"message-ttl": 1000});
    let op = PolicyGuard::set(&c, Kind::Operator, "ttl", "orders-failed$", ttl).await;
    let op_set_at = Instant::now();
    let dh = json!({"overflow": "drop-head"});
    let p = PolicyGuard::set(&c, Kind::Policy, "dh", "orders$", dh).await;
    // All three start within a second of the policies (they run at once).
    assert!(op_set_at.elapsed() < Duration::from_secs(1));
    let (check, doctor, status) = tokio::join!(
        provision(&file, &["--check"]),
        Dlqctl::new("doctor").arg(&file).run(),
        Dlqctl::new("status").arg(&file).run()
    );
    check.assert_code(3);
    let on_dlq = format!(
        "queue {dlq}: operator policy `{}` overrides message-ttl: effective 1000, wanted 3600000",
        op.name
    );
    let on_main = format!(
        "queue {main}: policy `{}` overrides overflow: effective \"drop-head\", wanted \"reject-publish\"",
        p.name
    );
    for line in [&on_dlq, &on_main] {
        assert!(
            check.stdout.contains(line.as_str()),
            "no `{line}` in\n{}",
            check.output()
        );
        assert!(
            status.stdout.contains(&format!("POLICY {line}")),
            "no `{line}` in\n{}",
            status.output()
        );
    }
    // The queues' own fields, reported before the policies, disagree: a
    // warning names both views (unless the statistics caught up in the
    // meantime, about one time in ten: then the queue shows the policy).
    let disagree = format!(
        "warning: queue {main}: the policy definitions give policy `{}` and operator policy none",
        p.name
    );
    if !check.stdout.contains(&disagree) {
        let raw = b.mgmt.queue(&main).await.map(|i| i.raw).unwrap_or_default();
        assert_eq!(
            raw["policy"],
            json!(p.name),
            "no `{disagree}` in\n{}",
            check.output()
        );
    }
    doctor.assert_code(3);
    for (q, name) in [(&dlq, &op.name), (&main, &p.name)] {
        assert!(
            doctor
                .stdout
                .lines()
                .any(|l| l.starts_with("  fail  policies")
                    && l.contains(&format!("queue {q}: "))
                    && l.contains(&format!("`{name}`"))),
            "doctor does not fail {q} naming {name}:\n{}",
            doctor.output()
        );
    }
}

/// Two policies of the same priority match a queue: which one the broker
/// applies is undefined. `--check` warns naming both, and still exits 0
/// when neither changes what the topology relies on.
#[tokio::test]
async fn check_warns_on_a_tie_of_priorities() {
    let (_b, c, _dir, file) = provisioned().await;
    let locator = json!({"queue-leader-locator": "balanced"});
    let one = PolicyGuard::set(&c, Kind::Policy, "ll1", "orders$", locator.clone()).await;
    let two = PolicyGuard::set(&c, Kind::Policy, "ll2", "orders$", locator).await;
    let run = provision(&file, &["--check"]).await;
    run.assert_code(0);
    let tie = format!(
        "warning: queue {}: policies `{}`, `{}` match it with the same priority (999): which one \
         the broker applies is undefined",
        c.name("orders"),
        one.name,
        two.name
    );
    assert!(run.stdout.contains(&tie), "no `{tie}` in\n{}", run.output());
    assert!(
        run.stdout.contains("with 1 warning(s) on its policies"),
        "{}",
        run.output()
    );
}

/// A management API in front of the real one that refuses the policy
/// definitions (HTTP 403, as for a user without permissions in the vhost)
/// and passes every other GET through; its base URL.
async fn api_refusing_policy_definitions() -> String {
    use axum::body::Body;
    use axum::http::{header, Request, Response, StatusCode};
    let upstream = management_url();
    let app = axum::Router::new().fallback(move |req: Request<Body>| {
        let upstream = upstream.clone();
        async move {
            let path = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/");
            if path.starts_with("/api/policies/") || path.starts_with("/api/operator-policies/") {
                return Response::builder()
                    .status(StatusCode::FORBIDDEN)
                    .body(Body::from("{\"error\":\"not_authorised\"}"))
                    .unwrap();
            }
            let mut r = reqwest::Client::new().get(format!("{upstream}{path}"));
            if let Some(auth) = req.headers().get(header::AUTHORIZATION) {
                r = r.header(header::AUTHORIZATION, auth.as_bytes());
            }
            let resp = r.send().await.expect("the real management API");
            let status = resp.status().as_u16();
            let body = resp.bytes().await.unwrap_or_default();
            Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body))
                .unwrap()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// Issue 38, finding 3: when the policy definitions cannot be read (403),
/// `--check` and `doctor` fall back to each queue's own report, and say it
/// may be a few seconds old.
#[tokio::test]
async fn without_the_definitions_policies_come_from_the_queues_marked_possibly_old() {
    let (b, c, _dir, file) = provisioned().await;
    let p = PolicyGuard::set(
        &c,
        Kind::Policy,
        "dh",
        "orders$",
        json!({"overflow": "drop-head"}),
    )
    .await;
    let main = c.name("orders");
    p.wait_applied(&b, std::slice::from_ref(&main)).await;
    let api = api_refusing_policy_definitions().await;
    let run = provision(&file, &["--check", "--management-url", &api]).await;
    run.assert_code(3);
    let old = "warning: queue (policies of the 7 queues): policies read from the queues' \
               statistics (the policy definitions could not be read), possibly a few seconds old";
    let overrides = format!("queue {main}: policy `{}` overrides overflow", p.name);
    for line in [old, &overrides] {
        assert!(
            run.stdout.contains(line),
            "no `{line}` in\n{}",
            run.output()
        );
    }
    // Once, not once per queue; and the reason says what the user lacks.
    assert_eq!(
        run.stdout.matches("possibly a few seconds old").count(),
        1,
        "{}",
        run.output()
    );
    assert!(
        run.stdout.contains("permissions in the vhost"),
        "{}",
        run.output()
    );
    let run = Dlqctl::new("doctor")
        .arg(&file)
        .args(["--management-url", &api])
        .run()
        .await;
    run.assert_code(3);
    let warned: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.contains("possibly a few seconds old"))
        .collect();
    assert_eq!(warned.len(), 1, "{}", run.output());
    assert!(
        warned[0].starts_with("  warn  broker       policies: "),
        "{}",
        run.output()
    );
}

/// A policy whose keys change nothing the contract relies on is listed as
/// information and the check passes. (On 3.10 a policy holding
/// `queue-leader-locator` applies to quorum queues only, on 4.3 to every
/// queue.)
#[tokio::test]
async fn check_lists_a_leader_locator_policy_as_information_and_exits_0() {
    let (b, c, _dir, file) = provisioned().await;
    let locator = json!({"queue-leader-locator": "balanced"});
    let p = PolicyGuard::set(&c, Kind::Policy, "ll", "", locator).await;
    let quorum = planned_quorum_queues(&file);
    p.wait_applied(&b, &quorum).await;
    // The queues the broker applies it to: the quorum ones on 3.10, every
    // queue on 4.3 (which applies queue-leader-locator to classic queues
    // too). Asked of the broker, as a user's --check would see them.
    let mut applied = Vec::new();
    for q in planned_queues(&file) {
        let doc = b.mgmt.queue(&q).await.map(|i| i.raw);
        if doc.is_some_and(|d| d["policy"] == json!(p.name)) {
            applied.push(q);
        }
    }
    assert!(quorum.iter().all(|q| applied.contains(q)), "{applied:?}");

    let run = provision(&file, &["--check"]).await;
    run.assert_code(0)
        .assert_stdout_has(&["matches the topology"]);
    for q in &applied {
        let line = format!(
            "info: queue {q}: policy `{}` sets queue-leader-locator = \"balanced\" (changes nothing the topology relies on)",
            p.name
        );
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    let run = provision(&file, &["--check", "--format", "github"]).await;
    run.assert_code(0);
    assert_eq!(
        run.stdout.matches("::notice ").count(),
        applied.len(),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("::error"), "{}", run.stdout);
    let run = provision(&file, &["--check", "--json"]).await;
    run.assert_code(0);
    assert!(
        json_findings(&run)
            .iter()
            .all(|f| f["finding"] == "policy_info"),
        "{}",
        run.stdout
    );
}

/// A `max-length` policy on main queues: the classic one has no limit in
/// the topology, the quorum one a higher one; both are differences. What
/// the overflow then does differs by type (README): the quorum queue
/// refuses publishes (`x-overflow: reject-publish`), the classic one drops
/// its oldest messages into the DLQ as `maxlen` dead letters.
#[tokio::test]
async fn check_fails_on_a_max_length_policy_on_main_queues() {
    let (b, c, _dir, file) = provisioned().await;
    let max_length = json!({"max-length": 100});
    let p = PolicyGuard::set(&c, Kind::Policy, "ml", "(orders|mail)$", max_length).await;
    p.wait_applied(&b, &[c.name("orders"), c.name("mail")])
        .await;

    let run = provision(&file, &["--check"]).await;
    run.assert_code(3);
    for line in [
        format!(
            "queue {}: policy `{}` overrides max-length: effective 100, wanted 50000",
            c.name("orders"),
            p.name
        ),
        format!(
            "queue {}: policy `{}` overrides max-length: effective 100, wanted none (the topology leaves this queue unbounded; when full, overflow drop-head drops its oldest messages (dead-lettered as `maxlen` where it has a dead-letter exchange))",
            c.name("mail"),
            p.name
        ),
    ] {
        assert!(run.stdout.contains(&line), "no `{line}` in\n{}", run.stdout);
    }
    // The pattern is anchored: no other queue of the file is named.
    assert_eq!(
        run.stdout.matches(" overrides ").count(),
        2,
        "{}",
        run.stdout
    );
}
