//! Messages that once stalled a whole queue at the protocol level (issue
//! 13, items 1 and 2): short strings that are not UTF-8, and headers near
//! `frame_max`. They are published with pika (`support/pika_tool.py`,
//! Debian's `/usr/bin/python3`), since lapin cannot publish the first, and
//! read back with pika too, byte for byte. Each test puts one such message ahead of
//! ordinary ones and wants all of them handled within seconds.

use crate::support::script::Script;
use crate::support::worker::*;
use crate::support::{amqp_url, Broker, Cleanup, Scratch};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Runs `pika_tool.py URL ARGS...` with `stdin`; panics unless it exits 0.
/// Returns its stdout.
async fn pika(args: &[&str], stdin: &str) -> String {
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/support/pika_tool.py");
    let mut child = tokio::process::Command::new("/usr/bin/python3")
        .arg(&tool)
        .arg(amqp_url())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("/usr/bin/python3 (Debian's python3-pika)");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.as_bytes())
        .await
        .expect("write stdin");
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("pika_tool.py within 60 s")
        .expect("pika_tool.py runs");
    assert!(
        out.status.success(),
        "pika_tool.py {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 JSON")
}

/// A byte string as pika_tool.py takes it.
fn b(bytes: &[u8]) -> Value {
    json!({ "b64": dlqctl::core::values::shortstr::base64(bytes) })
}

/// The bytes of a `{"b64": ...}` that pika_tool.py printed.
fn bytes_of(v: &Value) -> Vec<u8> {
    let text = v["b64"]
        .as_str()
        .unwrap_or_else(|| panic!("not a byte string: {v}"));
    dlqctl::core::values::shortstr::from_base64(text).expect("base64")
}

/// The value of header `key` (bytes) in a message pika_tool.py printed.
fn pika_header<'a>(m: &'a Value, key: &[u8]) -> Option<&'a Value> {
    m["properties"]["headers"]
        .as_array()?
        .iter()
        .find(|kv| bytes_of(&kv[0]) == key)
        .map(|kv| &kv[1])
}

/// Takes up to `n` messages from `queue` with pika.
async fn pika_get(queue: &str, n: usize) -> Vec<Value> {
    let out = pika(&["get", queue, &n.to_string()], "").await;
    serde_json::from_str::<Value>(&out)
        .expect("pika_tool.py get prints JSON")
        .as_array()
        .expect("a list")
        .clone()
}

/// Ten ordinary messages, `ok-0` … `ok-9`, to the default exchange.
fn ordinary(queue: &str, range: std::ops::Range<usize>) -> Vec<Value> {
    range
        .map(|i| {
            json!({
                "routing_key": queue,
                "body": format!("ordinary {i}"),
                "properties": { "message_id": format!("ok-{i}"), "delivery_mode": 2 },
            })
        })
        .collect()
}

/// Publishes `first`, ordinary 0 to 4, `second`, ordinary 5 to 9 with
/// pika, and waits until `queue` holds the 12.
async fn publish_among_ordinary(broker: &Broker, queue: &str, first: Value, second: Value) {
    let mut messages = vec![first];
    messages.extend(ordinary(queue, 0..5));
    messages.push(second);
    messages.extend(ordinary(queue, 5..10));
    pika(&["publish"], &Value::Array(messages).to_string()).await;
    broker
        .wait_for_count(queue, 12, Duration::from_secs(10))
        .await;
}

/// Starts a worker running `script` on `queue` and waits up to 20 s for
/// `n` decisions; asserts that it never lost its connection and took
/// under 20 s. Returns the worker and the decisions.
async fn decide(file: &Path, queue: &str, script: &Script, n: usize) -> (WorkerProc, Vec<Value>) {
    let started = Instant::now();
    let mut worker = WorkerProc::with_script(file, queue, script, &[]);
    let decisions = worker.wait_decisions(n, Duration::from_secs(20)).await;
    let took = started.elapsed();
    assert!(
        worker.events("connection lost; reconnecting").is_empty(),
        "the connection dropped:\n{}",
        worker.output()
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    (worker, decisions)
}

const POISON_ID: &[u8] = b"\xff\xfe-bad";
const POISON_KEY: &[u8] = b"\xff\xfekey";
const POISON_ROUTING_KEY: &[u8] = b"rk.\xff";

/// Item 1: a queue holding a message whose `message_id` (and other short
/// strings: correlation_id, type, app_id, reply_to, content_type, the
/// routing key) are not UTF-8, and one whose header key is not UTF-8,
/// ahead of 10 ordinary ones. lapin used to drop the connection on each
/// delivery of the first, for ever. Now all 12 reach a decision within
/// seconds; the handler sees the documented base64 forms; the retry copy
/// comes back with the same bytes and the DLQ copy holds them too.
#[tokio::test]
async fn non_utf8_short_strings_reach_a_decision_and_copies_keep_their_bytes() {
    let broker = Broker::connect().await;
    let cleanup = Cleanup::new();
    let scratch = Scratch::new();
    let mut pipe = Pipe::new(&cleanup, &[300], 2);
    let shop = cleanup.name("shop");
    pipe.exchange = Some((shop.clone(), "topic", vec!["#".into()]));
    let file = pipe.provision(&scratch).await;

    // Transient for anything given as base64, so the poison messages go
    // through a retry copy and then a DLQ copy; success otherwise.
    let script = Script::new(
        &scratch,
        "h",
        r#"printf '%s\t%s\t%s\n' "$DLQCTL_MESSAGE_ID_BASE64" "$DLQCTL_ROUTING_KEY_BASE64" "$DLQCTL_EXCHANGE_BASE64" >> "$d/b64.log"
[ -n "$DLQCTL_MESSAGE_ID_BASE64$DLQCTL_ROUTING_KEY_BASE64" ] && exit 3
case "$DLQCTL_HEADERS" in *'"base64:'*) exit 3;; esac
exit 0"#,
    );

    let poison_props = json!({
        "message_id": b(POISON_ID),
        "correlation_id": b(b"c\xff"),
        "type": b(b"\xfe"),
        "app_id": b(b"\xc3("),
        "reply_to": b(b"r\xff"),
        "content_type": b(b"text/\xe9"),
        "delivery_mode": 2,
    });
    let first = json!({
        "exchange": shop, "routing_key": b(POISON_ROUTING_KEY),
        "body": "poison 1", "properties": poison_props,
    });
    let second = json!({
        "routing_key": pipe.name, "body": "poison 2",
        "properties": {
            "message_id": "bad-key",
            "delivery_mode": 2,
            "headers": [[b(POISON_KEY), "v"], ["plain", "p"]],
        },
    });
    publish_among_ordinary(&broker, &pipe.name, first, second).await;

    // 10 acks, and for each poison message a retry and a dead-letter.
    let (mut worker, decisions) = decide(&file, &pipe.name, &script, 14).await;
    let count = |what: &str| decisions.iter().filter(|d| d["decision"] == what).count();
    assert_eq!(
        (count("ack"), count("retry"), count("dead_letter")),
        (10, 2, 2),
        "{decisions:#?}"
    );

    // The handler saw the documented forms, and the second run of poison 1
    // (from its retry copy) the same bytes as the first.
    let b64_log = std::fs::read_to_string(script.dir.join("b64.log")).expect("b64.log");
    let poison_runs: Vec<&str> = b64_log
        .lines()
        .filter(|l| l.starts_with("//4tYmFk"))
        .collect();
    assert_eq!(poison_runs, vec!["//4tYmFk\tcmsu/w==\t"; 2], "{b64_log}");
    let calls = script.calls();
    assert_eq!(calls.len(), 14);
    let key_runs: Vec<usize> = (1..=calls.len())
        .filter(|&n| script.headers(n).get("base64://5rZXk=").is_some())
        .collect();
    assert_eq!(key_runs.len(), 2, "{calls:#?}");
    for n in key_runs {
        assert_eq!(script.headers(n)["base64://5rZXk="], "v");
        assert_eq!(script.headers(n)["plain"], "p");
    }
    for c in calls.iter().filter(|c| c.message_id.starts_with("ok-")) {
        assert_eq!(c.attempt, 1);
    }

    // The log says what happened, in words.
    let out = worker.output();
    assert!(
        out.contains("message_id (shown as base64 //4tYmFk)"),
        "no words about the message id:\n{out}"
    );
    assert!(
        out.contains("a header key (shown as base64://5rZXk=)"),
        "no words about the header key:\n{out}"
    );
    worker.stop().await;

    // The DLQ copies carry the original bytes (read back with pika).
    let dlq = pika_get(&pipe.dlq(), 10).await;
    assert_eq!(dlq.len(), 2, "{dlq:#?}");
    let p1 = dlq
        .iter()
        .find(|m| bytes_of(&m["body"]) == b"poison 1")
        .expect("poison 1 in the DLQ");
    let props = &p1["properties"];
    assert_eq!(bytes_of(&props["message_id"]), POISON_ID);
    assert_eq!(bytes_of(&props["correlation_id"]), b"c\xff");
    assert_eq!(bytes_of(&props["type"]), b"\xfe");
    assert_eq!(bytes_of(&props["app_id"]), b"\xc3(");
    assert_eq!(bytes_of(&props["reply_to"]), b"r\xff");
    assert_eq!(bytes_of(&props["content_type"]), b"text/\xe9");
    assert_eq!(
        bytes_of(pika_header(p1, b"dlqctl-original-routing-key").expect("original key")),
        POISON_ROUTING_KEY
    );
    assert_eq!(
        bytes_of(pika_header(p1, b"dlqctl-original-exchange").expect("original exchange")),
        shop.as_bytes()
    );
    assert_eq!(
        bytes_of(pika_header(p1, b"dlqctl-reason").expect("reason")),
        b"exhausted"
    );
    let p2 = dlq
        .iter()
        .find(|m| bytes_of(&m["body"]) == b"poison 2")
        .expect("poison 2 in the DLQ");
    assert_eq!(
        bytes_of(pika_header(p2, POISON_KEY).expect("the non-UTF-8 key")),
        b"v"
    );

    let mut queues = vec![pipe.name.clone()];
    queues.extend(pipe.retry_queues());
    assert_empty(&broker, &queues).await;
    drop(cleanup);
}

/// Item 2: a message whose headers are near `frame_max` (a 130,200-byte
/// header, as pika can publish) ahead of 10 ordinary ones. Its retry copy
/// plus what the broker adds on dead-lettering from the tier used to exceed
/// the 131,072-byte frame: every delivery ended in `received large frame`
/// and a reconnect. Now the copy that cannot fit is dead-lettered as
/// `too_large`, and one that fits exactly (`edge`, its retry copy's
/// properties at the computed budget) comes back through its tier and is
/// read again. All 12 are handled within seconds, and both DLQ copies are
/// deliverable (read back with lapin, as `peek` and `replay` read).
#[tokio::test]
async fn headers_near_frame_max_never_make_an_undeliverable_copy() {
    use dlqctl::core::retry::fit::{properties_size, retry_budget};
    use dlqctl::core::retry::{retry_copy, CopyContext};
    use lapin::BasicProperties;

    let broker = Broker::connect().await;
    let cleanup = Cleanup::new();
    let scratch = Scratch::new();
    let pipe = Pipe::new(&cleanup, &[300], 2);
    let file = pipe.provision(&scratch).await;
    let script = Script::new(
        &scratch,
        "h",
        r#"case "$(head -c 4 "$body_file")" in big|edge) exit 3;; esac
exit 0"#,
    );

    // Like issue 13's 130,200 bytes, sized so that with this test's short
    // names the retry copy is still accepted by the broker (under 131,052
    // bytes of properties) but what the broker adds on its way back from
    // the tier is not: the old worker stalled on it.
    const BIG: usize = 130_500;
    // The largest `edge` header whose retry copy still fits the budget.
    let props_with = |n: usize| {
        BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(table(&[("edge", s(&"e".repeat(n)))]))
    };
    let ctx = CopyContext {
        attempt: 1,
        error: "exited with status 3",
        now_unix_ms: 1_700_000_000_000,
        delivery_exchange: "",
        delivery_routing_key: &pipe.name,
        connection_user: "guest",
    };
    let copy_size = |n: usize| properties_size(&retry_copy(&props_with(n), &ctx, None));
    let budget = retry_budget(&props_with(0), 131_072);
    let edge = budget - copy_size(0);
    assert_eq!(copy_size(edge), budget);

    let first = json!({
        "routing_key": pipe.name, "body": "big",
        "properties": {
            "delivery_mode": 2,
            "headers": [["big", {"repeat": "b", "n": BIG}]],
        },
    });
    let second = json!({
        "routing_key": pipe.name, "body": "edge",
        "properties": {
            "delivery_mode": 2,
            "headers": [["edge", {"repeat": "e", "n": edge}]],
        },
    });
    publish_among_ordinary(&broker, &pipe.name, first, second).await;

    // 10 acks; big: dead-lettered too_large; edge: a retry, then exhausted.
    let (mut worker, decisions) = decide(&file, &pipe.name, &script, 13).await;
    let of = |what: &str, reason: &str| {
        decisions
            .iter()
            .filter(|d| d["decision"] == what && d["reason"].as_str().unwrap_or("") == reason)
            .count()
    };
    assert_eq!(
        (
            of("ack", ""),
            of("retry", ""),
            of("dead_letter", "too_large"),
            of("dead_letter", "exhausted")
        ),
        (10, 1, 1, 1),
        "{decisions:#?}"
    );
    let out = worker.output();
    assert!(
        out.contains("the retry copy does not fit frame_max"),
        "no words about the size:\n{out}"
    );
    worker.stop().await;

    // Both DLQ copies are deliverable to lapin, with the producer's header
    // whole.
    let dlq = drain(&broker, &pipe.dlq()).await;
    assert_eq!(dlq.len(), 2);
    let copy_of = |body: &str| {
        dlq.iter()
            .find(|d| d.data == body.as_bytes())
            .unwrap_or_else(|| panic!("{body} is not in the DLQ"))
    };
    let big = copy_of("big");
    assert_eq!(header_str(big, "dlqctl-reason"), "too_large");
    assert_eq!(header_str(big, "big").len(), BIG);
    // dlqctl's own headers made room, history first, as the log says; the
    // reason is kept longest.
    assert!(header(big, "dlqctl-errors").is_none());
    assert!(header(big, "dlqctl-last-error").is_none());
    assert!(
        out.contains("the DLQ copy was trimmed to fit frame_max: dlqctl-errors removed, dlqctl-last-error removed"),
        "no words about the trim:\n{out}"
    );
    let edge_copy = copy_of("edge");
    assert_eq!(header_str(edge_copy, "dlqctl-reason"), "exhausted");
    assert_eq!(header_str(edge_copy, "edge").len(), edge);
    assert_eq!(header_int(edge_copy, "dlqctl-attempt"), 2);

    let mut queues = vec![pipe.name.clone()];
    queues.extend(pipe.retry_queues());
    assert_empty(&broker, &queues).await;
    drop(cleanup);
}
