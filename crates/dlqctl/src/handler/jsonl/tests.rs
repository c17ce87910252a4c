//! The pool against real processes (Python and sh), without a broker.

use super::*;
use crate::core::wire::TEMP_PREFIX;
use std::time::Duration;
use std::time::Instant as StdInstant;

fn msg(body: &str) -> HandlerMessage {
    HandlerMessage {
        body: body.as_bytes().to_vec(),
        queue: "orders".into(),
        message_id: Some("m-1".into()),
        attempt: 1,
        max_attempts: 3,
        ..Default::default()
    }
}

fn python() -> &'static str {
    if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// A Python handler: answers each message with the body as the outcome
/// (`success`, `transient`, `permanent`), from a thread per message when
/// the body starts with `slow:` (after the given ms), or exits 3 on `die`.
const ECHO: &str = r#"
import json, sys, threading, time, os
sys.stdin.buffer.readline()
print(json.dumps({"ready": True, "version": 1}), flush=True)
lock = threading.Lock()
def answer(m, outcome):
    with lock:
        print(json.dumps({"id": m["id"], "outcome": outcome, "error": "e-" + str(m["id"])}), flush=True)
for line in sys.stdin.buffer:
    m = json.loads(line)
    b = m["body"]
    if b == "die":
        os._exit(3)
    if b.startswith("slow:"):
        ms, outcome = b[5:].split(":")
        threading.Thread(target=lambda m=m, ms=ms, o=outcome: (time.sleep(int(ms) / 1000), answer(m, o))).start()
    else:
        answer(m, b)
"#;

/// A pool of `python3 -c script` processes, `max_in_flight` messages at
/// a time on each.
fn config(script: &str, max_in_flight: usize) -> JsonlConfig {
    let mut c = JsonlConfig::new(python(), vec!["-c".into(), script.into()], "orders");
    c.max_in_flight = max_in_flight;
    c.timeout = Duration::from_secs(10);
    c.start_timeout = Duration::from_secs(10);
    c
}

#[tokio::test]
async fn outcomes_come_back_by_id_in_any_order() {
    let h = JsonlHandler::start(config(ECHO, 3));
    let (m1, m2, m3) = (
        msg("slow:600:success"),
        msg("slow:300:permanent"),
        msg("slow:10:transient"),
    );
    let (a, b, d) = tokio::join!(h.handle(&m1), h.handle(&m2), h.handle(&m3));
    assert_eq!(a, Outcome::Success);
    assert!(
        matches!(b, Outcome::Permanent { ref error } if error.starts_with("e-")),
        "{b:?}"
    );
    assert!(
        matches!(d, Outcome::Transient { ref error, .. } if error.starts_with("e-")),
        "{d:?}"
    );
    h.shutdown().await;
    assert_eq!(h.ready(), 0);
}

#[tokio::test]
async fn a_crash_fails_the_messages_in_flight_and_the_process_comes_back() {
    let h = JsonlHandler::start(config(ECHO, 2));
    let (m1, m2) = (msg("slow:5000:success"), msg("die"));
    let (slow, die) = tokio::join!(h.handle(&m1), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        h.handle(&m2).await
    });
    for o in [&slow, &die] {
        match o {
            Outcome::Transient { error, .. } => assert!(
                error.starts_with("handler process 0 (pid ")
                    && error.ends_with("exited with status 3 with this message in flight"),
                "{error}"
            ),
            other => panic!("{other:?}"),
        }
    }
    // Started again after the backoff.
    let ok = msg("success");
    assert_eq!(h.handle(&ok).await, Outcome::Success);
    h.shutdown().await;
}

#[tokio::test]
async fn messages_wait_unsent_while_no_process_starts() {
    let dir = std::env::temp_dir().join(format!("{TEMP_PREFIX}jsonl-gate-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let script = format!(
        "import os, sys\nif not os.path.exists({:?}): sys.exit('gate closed')\n{ECHO}",
        dir.display().to_string()
    );
    let h = Arc::new(JsonlHandler::start(config(&script, 1)));
    let h2 = h.clone();
    let waiting = tokio::spawn(async move { h2.handle(&msg("success")).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "the message must wait, not fail");
    std::fs::write(&dir, "").unwrap();
    let out = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("answered once a process started")
        .unwrap();
    assert_eq!(out, Outcome::Success);
    h.shutdown().await;
    let _ = std::fs::remove_file(&dir);
}

#[tokio::test]
async fn shutdown_does_not_wait_for_a_process_that_never_gets_ready() {
    let mut c = JsonlConfig::new("sleep", vec!["100".into()], "orders");
    c.start_timeout = Duration::from_secs(60);
    let h = JsonlHandler::start(c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = StdInstant::now();
    h.shutdown().await;
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_wrong_ready_line_is_a_failed_start_and_no_message_is_sent() {
    let script = r#"echo '{"ready":true,"version":2}'; cat > /dev/null"#;
    let mut c = JsonlConfig::new("sh", vec!["-c".into(), script.into()], "orders");
    c.start_timeout = Duration::from_secs(5);
    let h = JsonlHandler::start(c);
    let m = msg("success");
    let r = tokio::time::timeout(Duration::from_millis(1500), h.handle(&m)).await;
    assert!(r.is_err(), "the message should wait: {r:?}");
    assert_eq!(h.ready(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_dropped_message_leaves_no_entry_behind() {
    let h = JsonlHandler::start(config(ECHO, 1));
    let ok = msg("success");
    assert_eq!(h.handle(&ok).await, Outcome::Success);
    // Dropped while waiting for its answer: its place is free again.
    let r = tokio::time::timeout(
        Duration::from_millis(200),
        h.handle(&msg("slow:1000:success")),
    )
    .await;
    assert!(r.is_err());
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), h.handle(&ok))
            .await
            .expect("the freed place is used"),
        Outcome::Success
    );
    h.shutdown().await;
}

/// A line whose message stopped waiting is skipped; the line written just
/// before it must still be flushed (it was once left in the buffer).
#[tokio::test]
async fn a_skipped_line_does_not_hold_back_the_one_before_it() {
    let mut c = config(ECHO, 2);
    c.timeout = Duration::from_secs(3);
    let h = JsonlHandler::start(c);
    let warm = msg("success");
    assert_eq!(h.handle(&warm).await, Outcome::Success);
    for _ in 0..20 {
        let (a, b) = (msg("success"), msg("success"));
        let mut fa = Box::pin(h.handle(&a));
        let mut fb = Box::pin(h.handle(&b));
        // Poll both once (each queues its line), then give up on `b`.
        tokio::select! {
            biased;
            _ = &mut fa => panic!("answered before being polled twice"),
            _ = &mut fb => panic!("answered before being polled twice"),
            () = std::future::ready(()) => {}
        }
        drop(fb);
        let t = StdInstant::now();
        assert_eq!(fa.await, Outcome::Success);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    h.shutdown().await;
}

#[tokio::test]
async fn messages_after_shutdown_end_as_transient_at_once() {
    let h = Arc::new(JsonlHandler::start(config(ECHO, 1)));
    let ok = msg("success");
    assert_eq!(h.handle(&ok).await, Outcome::Success);
    h.shutdown().await;
    let t = StdInstant::now();
    match h.handle(&ok).await {
        Outcome::Transient { error, .. } => assert!(error.contains("is stopped"), "{error}"),
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(1));
}

/// A handler that keeps `hold` messages unanswered until `release` (then
/// answers them late), and answers `count` messages once no line came for
/// 300 ms, with how many messages it then had unanswered (holds and
/// counts) and its pid.
const HOLDER: &str = r#"
import json, os, select
buf = b""
def read_lines(timeout):
    global buf
    r, _, _ = select.select([0], [], [], timeout)
    if not r:
        return None
    chunk = os.read(0, 65536)
    if not chunk:
        os._exit(0)
    buf += chunk
    out = []
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        out.append(line)
    return out
def send(o):
    os.write(1, (json.dumps(o) + "\n").encode())
ls = []
while not ls:
    ls = read_lines(None) or []
send({"ready": True, "version": 1})
pending, held, counts = ls[1:], [], []
while True:
    for line in pending:
        if not line.strip():
            continue
        m = json.loads(line)
        b = m["body"]
        if b == "hold":
            held.append(m["id"])
        elif b == "release":
            for i in held:
                send({"id": i, "outcome": "success"})
            held = []
            send({"id": m["id"], "outcome": "success"})
        else:
            counts.append(m["id"])
    ls = read_lines(0.3)
    if ls is None:
        n = len(held) + len(counts)
        for i in counts:
            send({"id": i, "outcome": "permanent", "error": "held=%d pid=%d" % (n, os.getpid())})
        counts = []
        pending = []
    else:
        pending = ls
"#;

fn held_and_pid(o: &Outcome) -> (usize, u32) {
    let Outcome::Permanent { error } = o else {
        panic!("{o:?}")
    };
    let field = |name: &str| {
        error
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("{error}"))
    };
    (field("held=") as usize, field("pid="))
}

/// A pool of [`HOLDER`]s with `max_in_flight` places and `timeout`, that
/// does not restart a process for its timeouts in a row (100 allowed).
fn holder(max_in_flight: usize, timeout: Duration) -> JsonlHandler {
    let mut c = config(HOLDER, max_in_flight);
    c.timeout = timeout;
    c.timeouts_before_restart = 100;
    JsonlHandler::start(c)
}

/// The outcomes of two `hold` messages sent together (they time out).
async fn hold_two(h: &JsonlHandler) -> [Outcome; 2] {
    let (h1, h2) = (msg("hold"), msg("hold"));
    let (a, b) = tokio::join!(h.handle(&h1), h.handle(&h2));
    [a, b]
}

/// A timed-out message still counts against `max_in_flight`: the process
/// may still work on it. It once got new messages at once (6 unanswered
/// with `max_in_flight` 4).
#[tokio::test]
async fn a_timed_out_message_still_counts_against_max_in_flight() {
    let h = holder(4, Duration::from_millis(1500));
    for o in hold_two(&h).await {
        assert!(
            matches!(o, Outcome::TimedOut { ref error } if error.contains("no answer")),
            "{o:?}"
        );
    }
    let counts: Vec<HandlerMessage> = (0..6).map(|_| msg("count")).collect();
    let answers = futures_util::future::join_all(counts.iter().map(|m| h.handle(m))).await;
    let pid = held_and_pid(&answers[0]).1;
    for o in &answers {
        let (held, p) = held_and_pid(o);
        assert!(held <= 4, "the process held {held} unanswered: {answers:?}");
        assert_eq!(p, pid, "not restarted");
    }
    // The late answers free the places.
    assert_eq!(h.handle(&msg("release")).await, Outcome::Success);
    let counts: Vec<HandlerMessage> = (0..4).map(|_| msg("count")).collect();
    let t = StdInstant::now();
    let answers = futures_util::future::join_all(counts.iter().map(|m| h.handle(m))).await;
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    for o in &answers {
        assert!(held_and_pid(o).0 <= 4, "{answers:?}");
    }
    h.shutdown().await;
}

/// When every place of a process is held by timed-out messages, nothing
/// could be sent to it again: it is restarted.
#[tokio::test]
async fn a_process_whose_places_all_timed_out_is_restarted() {
    let h = holder(2, Duration::from_millis(1000));
    let before = held_and_pid(&h.handle(&msg("count")).await).1;
    let [a, b] = hold_two(&h).await;
    assert!(matches!(a, Outcome::TimedOut { .. }) && matches!(b, Outcome::TimedOut { .. }));
    let after = tokio::time::timeout(Duration::from_secs(10), h.handle(&msg("count")))
        .await
        .expect("a new process takes the message");
    let (held, pid) = held_and_pid(&after);
    assert_eq!(held, 1);
    assert_ne!(pid, before);
    h.shutdown().await;
}
