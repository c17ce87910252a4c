//! `dlqctl work` against a real broker: the binary runs a handler script
//! (or POSTs to an HTTP server in the test) per message; the tests read the
//! handler's call log, the worker's JSON log lines and the queues.

use crate::support::script::{Call, Script};
use crate::support::worker::*;
use crate::support::{Dlqctl, Scratch};
use lapin::types::AMQPValue;
use lapin::BasicProperties;
use serde_json::Value;
use std::time::{Duration, Instant};

const SECS_20: Duration = Duration::from_secs(20);

type Fixture = PipeFixture;

fn attempts(calls: &[Call]) -> Vec<u32> {
    calls.iter().map(|c| c.attempt).collect()
}

fn gap_ms(calls: &[Call], from: usize) -> u128 {
    (calls[from + 1].t_ns - calls[from].t_ns) / 1_000_000
}

/// Asserts the gap between call `from` and the next is at least the tier
/// delay and less than the delay plus 1.5 s.
#[track_caller]
fn assert_gap(calls: &[Call], from: usize, delay_ms: u128) {
    let gap = gap_ms(calls, from);
    assert!(
        gap >= delay_ms && gap < delay_ms + 1500,
        "gap between call {} and {}: {gap} ms, wanted ≥ {delay_ms} ms and < {} ms",
        from + 1,
        from + 2,
        delay_ms + 1500
    );
}

fn field<'a>(ev: &'a Value, key: &str) -> &'a str {
    ev[key].as_str().unwrap_or_default()
}

/// A pipeline (tiers 100 ms and 200 ms, three attempts) whose producers
/// publish to its topic exchange `PREFIX-in`, bound with `order.*`; not
/// provisioned yet. Returns the exchange's name too.
async fn fed_by_an_exchange() -> (Fixture, String) {
    let mut f = Fixture::new(&[100, 200], 3, |_| {}).await;
    let exchange = f.cleanup.name("in");
    f.pipe.exchange = Some((exchange.clone(), "topic", vec!["order.*".into()]));
    (f, exchange)
}

/// Two `expired` entries of `f`'s tiers (200 ms, then 100 ms), count 1
/// each: two retries made.
fn expired_once_in_each_tier(f: &Fixture) -> AMQPValue {
    x_death(vec![
        death(&f.pipe.retry_queue(200), "expired", 1),
        death(&f.pipe.retry_queue(100), "expired", 1),
    ])
}

/// A worker (one 100 ms tier, two attempts) whose handler takes a second,
/// then touches `done.N`, running for message `id`.
async fn one_second_in_flight(id: &str) -> (Fixture, Script, WorkerProc) {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let (_, script, w) = f
        .consuming_worker(r#"sleep 1; touch "$d/done.$n"; exit 0"#, &[])
        .await;
    publish(&f.broker, "", &f.pipe.name, b"x", with_id(id)).await;
    script.wait_calls(1, SECS_20).await;
    (f, script, w)
}

/// The DLQ's single message, after waiting for it.
async fn the_dlq_message(f: &Fixture) -> lapin::message::Delivery {
    f.broker.wait_for_count(&f.pipe.dlq(), 1, SECS_20).await;
    let mut all = drain(&f.broker, &f.pipe.dlq()).await;
    assert_eq!(all.len(), 1, "the DLQ should hold exactly one message");
    all.remove(0)
}

/// The `dlqctl-errors` entries as (attempt, error), checking each has a time.
fn error_history(d: &lapin::message::Delivery) -> Vec<(i64, String)> {
    let Some(AMQPValue::FieldArray(entries)) = header(d, "dlqctl-errors") else {
        panic!(
            "dlqctl-errors should be an array: {:?}",
            header(d, "dlqctl-errors")
        );
    };
    entries
        .as_slice()
        .iter()
        .map(|e| {
            let AMQPValue::FieldTable(t) = e else {
                panic!("a dlqctl-errors entry should be a table: {e:?}")
            };
            let get = |k: &str| t.inner().get(k).cloned();
            let attempt = match get("attempt") {
                Some(AMQPValue::LongLongInt(n)) => n,
                other => panic!("attempt of a history entry: {other:?}"),
            };
            let text = |v: Option<AMQPValue>| match v {
                Some(AMQPValue::LongString(s)) => {
                    String::from_utf8_lossy(s.as_bytes()).into_owned()
                }
                other => panic!("a string in a history entry: {other:?}"),
            };
            assert!(text(get("time")).ends_with('Z'), "entry time: {t:?}");
            (attempt, text(get("error")))
        })
        .collect()
}

// ---------------------------------------------------------------- the main paths

/// Fails twice, then succeeds: three runs, each retry after its tier's
/// delay (through the tier queues, in order), then acked; nothing left
/// anywhere.
#[tokio::test]
async fn transient_twice_then_success_waits_each_tier_and_acks() {
    let f = Fixture::new(&[200, 300], 4, |_| {}).await;
    let (_, script, mut w) = f
        .consuming_worker(
            r#"if [ "$DLQCTL_ATTEMPT" -lt 3 ]; then echo "upstream timeout $DLQCTL_ATTEMPT" >&2; exit 75; fi
exit 0"#,
            &[],
        )
        .await;
    publish(&f.broker, "", &f.pipe.name, b"hello", with_id("m-1")).await;

    let d = w.wait_decisions(3, SECS_20).await;
    // Room for a wrong fourth run to show up.
    tokio::time::sleep(Duration::from_millis(800)).await;
    w.stop().await;

    let calls = script.calls();
    assert_eq!(attempts(&calls), vec![1, 2, 3], "{calls:#?}");
    assert!(calls
        .iter()
        .all(|c| c.max_attempts == 4 && c.message_id == "m-1"));
    assert_gap(&calls, 0, 200);
    assert_gap(&calls, 1, 300);

    let d = &d[..];
    assert_eq!(d.len(), 3, "{d:#?}");
    assert_eq!(
        d.iter()
            .map(|e| (field(e, "decision"), field(e, "tier")))
            .collect::<Vec<_>>(),
        vec![("retry", "200ms"), ("retry", "300ms"), ("ack", "")]
    );
    assert_eq!(field(&d[0], "error"), "upstream timeout 1");

    // Each retry came back through its own tier queue, counted by dlqctl.
    for (n, tier, runs) in [(2, 200, 1), (3, 300, 2)] {
        let h = script.headers(n);
        assert_eq!(h["dlqctl-attempt"], runs, "call {n} headers: {h}");
        let deaths = h["x-death"].as_array().expect("x-death on a retry");
        assert_eq!(
            deaths.len(),
            1,
            "the worker strips x-death from copies: {h}"
        );
        assert_eq!(deaths[0]["queue"], f.pipe.retry_queue(tier));
        assert_eq!(deaths[0]["reason"], "expired");
        assert_eq!(deaths[0]["count"], 1);
    }
    assert_empty(&f.broker, &f.all_queues()).await;
}

/// Always transient: exactly max_attempts runs, then the DLQ holds the
/// message with reason `exhausted`, the final error, the history of every
/// failure, the count, the source queue and the original routing.
#[tokio::test]
async fn always_transient_is_dead_lettered_after_max_attempts_with_its_history() {
    let (f, exchange) = fed_by_an_exchange().await;
    let (_, script, mut w) = f
        .consuming_worker(
            r#"echo "payment service unavailable (attempt $DLQCTL_ATTEMPT)" >&2; exit 75"#,
            &[],
        )
        .await;
    let before = crate::support::worker::now_rfc3339();
    publish(&f.broker, &exchange, "order.created", b"{}", with_id("m-2")).await;

    let dlq = the_dlq_message(&f).await;
    w.wait_decisions(3, SECS_20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.stop().await;

    assert_eq!(attempts(&script.calls()), vec![1, 2, 3]);
    let d = w.decisions();
    assert_eq!(
        d.iter().map(|e| field(e, "decision")).collect::<Vec<_>>(),
        vec!["retry", "retry", "dead_letter"]
    );
    assert_eq!(field(&d[2], "reason"), "exhausted");

    assert_eq!(dlq.data, b"{}");
    assert_eq!(header_str(&dlq, "dlqctl-reason"), "exhausted");
    assert_eq!(
        header_str(&dlq, "dlqctl-last-error"),
        "payment service unavailable (attempt 3)"
    );
    assert_eq!(header_int(&dlq, "dlqctl-attempt"), 3);
    assert_eq!(header_str(&dlq, "dlqctl-source-queue"), f.pipe.name);
    assert_eq!(header_str(&dlq, "dlqctl-original-exchange"), exchange);
    assert_eq!(
        header_str(&dlq, "dlqctl-original-routing-key"),
        "order.created"
    );
    assert_eq!(
        error_history(&dlq),
        (1..=3)
            .map(|k| (k, format!("payment service unavailable (attempt {k})")))
            .collect::<Vec<_>>()
    );
    let first = header_str(&dlq, "dlqctl-first-failed-at");
    let dead = header_str(&dlq, "dlqctl-dead-lettered-at");
    assert!(
        before <= first && first < dead && first.ends_with('Z'),
        "published at {before}, first failure {first}, dead-lettered {dead}"
    );
    // The DLQ copy is published, not dead-lettered by the broker: no
    // broker history from the tiers, and no expiration.
    for k in ["x-death", "x-first-death-queue", "x-first-death-reason"] {
        assert!(header(&dlq, k).is_none(), "{k} in the DLQ copy: {dlq:?}");
    }
    assert_eq!(dlq.properties.expiration(), &None);
    assert_empty(&f.broker, &f.main_and_retry_queues()).await;
}

/// Exit 65: one run, straight to the DLQ with reason `permanent`.
#[tokio::test]
async fn permanent_failure_is_dead_lettered_after_one_run() {
    let f = Fixture::new(&[100], 4, |_| {}).await;
    let (_, script, mut w) = f
        .consuming_worker(r#"echo "cannot parse order: missing id" >&2; exit 65"#, &[])
        .await;
    publish(&f.broker, "", &f.pipe.name, b"bad", with_id("m-3")).await;

    let dlq = the_dlq_message(&f).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    w.stop().await;

    assert_eq!(attempts(&script.calls()), vec![1]);
    assert_eq!(header_str(&dlq, "dlqctl-reason"), "permanent");
    assert_eq!(
        header_str(&dlq, "dlqctl-last-error"),
        "cannot parse order: missing id"
    );
    assert_eq!(header_int(&dlq, "dlqctl-attempt"), 1);
    assert_eq!(
        error_history(&dlq),
        vec![(1, "cannot parse order: missing id".to_string())]
    );
    assert_eq!(
        dlq.properties.message_id().as_ref().map(|m| m.as_str()),
        Some("m-3")
    );
    let d = w.decisions();
    assert_eq!(d.len(), 1);
    assert_eq!(field(&d[0], "outcome"), "permanent");
    assert_eq!(field(&d[0], "reason"), "permanent");
    assert_empty(&f.broker, &f.main_and_retry_queues()).await;
}

/// Success: one run, acked (nothing returns to the queue when the worker
/// closes its connection), nothing dead-lettered.
#[tokio::test]
async fn success_is_acked_once() {
    let f = Fixture::new(&[100], 4, |_| {}).await;
    let (_, script, mut w) = f.consuming_worker("exit 0", &[]).await;
    publish(&f.broker, "", &f.pipe.name, b"fine", with_id("m-4")).await;

    let d = w.wait_decisions(1, SECS_20).await;
    assert_eq!(field(&d[0], "decision"), "ack");
    tokio::time::sleep(Duration::from_millis(800)).await;
    w.stop().await;
    assert_eq!(attempts(&script.calls()), vec![1]);
    assert_eq!(w.decisions().len(), 1);
    // After the worker's connection is closed an unacked message would be
    // ready again.
    assert_empty(&f.broker, &f.all_queues()).await;
}

/// Body (not UTF-8), message id, correlation id, content type, other
/// properties and custom headers survive retries into the DLQ; the handler
/// sees the body and the original exchange and routing key on every run,
/// also when the message comes back through the default exchange.
#[tokio::test]
async fn body_properties_and_headers_survive_into_the_dlq() {
    let (f, exchange) = fed_by_an_exchange().await;
    let (_, script, mut w) = f.consuming_worker(r#"echo "down" >&2; exit 75"#, &[]).await;

    let body: &[u8] = b"\x00\xff\xfe binary \x80\xc3\x28 end\n";
    let headers = table(&[
        ("tenant", s("acme")),
        ("trace-depth", i(42)),
        ("sampled", AMQPValue::Boolean(true)),
    ]);
    let props = BasicProperties::default()
        .with_message_id("m-5".into())
        .with_correlation_id("corr-5".into())
        .with_content_type("application/x-test".into())
        .with_content_encoding("identity".into())
        .with_type("order".into())
        .with_app_id("shop".into())
        .with_timestamp(1_700_000_000)
        .with_headers(headers);
    publish(&f.broker, &exchange, "order.created", body, props).await;

    let dlq = the_dlq_message(&f).await;
    w.wait_decisions(3, SECS_20).await;
    w.stop().await;

    let calls = script.calls();
    assert_eq!(attempts(&calls), vec![1, 2, 3]);
    for (n, c) in calls.iter().enumerate() {
        assert_eq!(c.exchange, exchange, "call {}: {c:?}", n + 1);
        assert_eq!(c.routing_key, "order.created", "call {}: {c:?}", n + 1);
        assert_eq!(c.message_id, "m-5");
        assert_eq!(c.queue, f.pipe.name);
        assert_eq!(script.body(n + 1), body, "body of call {}", n + 1);
        let h = script.headers(n + 1);
        assert_eq!(h["tenant"], "acme", "{h}");
        assert_eq!(h["trace-depth"], 42, "{h}");
        assert_eq!(h["sampled"], true, "{h}");
    }
    // The retries came back from a tier queue, whose dead-letter exchange
    // is the default one.
    let h3 = script.headers(3);
    assert_eq!(h3["x-death"][0]["queue"], f.pipe.retry_queue(200), "{h3}");
    assert_eq!(h3["x-death"][0]["reason"], "expired", "{h3}");
    assert_eq!(h3["dlqctl-original-exchange"], exchange.as_str());

    assert_eq!(dlq.data, body);
    let p = &dlq.properties;
    let text = |v: &Option<lapin::types::ShortString>| v.as_ref().map(|s| s.to_string());
    assert_eq!(text(p.message_id()), Some("m-5".into()));
    assert_eq!(text(p.correlation_id()), Some("corr-5".into()));
    assert_eq!(text(p.content_type()), Some("application/x-test".into()));
    assert_eq!(text(p.content_encoding()), Some("identity".into()));
    assert_eq!(text(p.kind()), Some("order".into()));
    assert_eq!(text(p.app_id()), Some("shop".into()));
    assert_eq!(p.timestamp(), &Some(1_700_000_000));
    assert_eq!(p.delivery_mode(), &Some(2));
    assert_eq!(header_str(&dlq, "tenant"), "acme");
    assert_eq!(header_int(&dlq, "trace-depth"), 42);
    assert_eq!(header(&dlq, "sampled"), Some(&AMQPValue::Boolean(true)));
    assert_eq!(header_str(&dlq, "dlqctl-original-exchange"), exchange);
    assert_eq!(
        header_str(&dlq, "dlqctl-original-routing-key"),
        "order.created"
    );
}

// ---------------------------------------------------------------- counting

/// A message whose `dlqctl-attempt` says max_attempts − 1 runs were made,
/// with no `x-death` (as on RabbitMQ 4.x, which ignores a republished one):
/// exactly one more run, then the DLQ.
#[tokio::test]
async fn attempt_header_alone_counts_runs_already_made() {
    let f = Fixture::new(&[100, 200], 4, |_| {}).await;
    let (_, script, mut w) = f
        .consuming_worker(r#"echo "still down" >&2; exit 75"#, &[])
        .await;
    let props = with_id("m-6a").with_headers(table(&[("dlqctl-attempt", i(3))]));
    publish(&f.broker, "", &f.pipe.name, b"x", props).await;

    let dlq = the_dlq_message(&f).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    w.stop().await;
    assert_eq!(attempts(&script.calls()), vec![4]);
    assert_eq!(header_str(&dlq, "dlqctl-reason"), "exhausted");
    assert_eq!(header_int(&dlq, "dlqctl-attempt"), 4);
    assert_eq!(error_history(&dlq), vec![(4, "still down".to_string())]);
    assert_empty(&f.broker, &f.main_and_retry_queues()).await;
}

/// Only `x-death` (as another tool or a ≤ 3.12 broker leaves it): two
/// `expired` entries of this pipeline's tiers, count 1 each → D = 2, so
/// attempt 3; with max_attempts 4 exactly two runs (3 and 4), the second
/// after tier delays[min(3, 2) − 1] = 200ms.
#[tokio::test]
async fn x_death_alone_counts_the_sum_over_the_pipelines_tiers() {
    let f = Fixture::new(&[100, 200], 4, |_| {}).await;
    let (_, script, mut w) = f
        .consuming_worker(r#"echo "down $DLQCTL_ATTEMPT" >&2; exit 75"#, &[])
        .await;
    let deaths = expired_once_in_each_tier(&f);
    let props = with_id("m-6b").with_headers(table(&[("x-death", deaths)]));
    publish(&f.broker, "", &f.pipe.name, b"x", props).await;

    let dlq = the_dlq_message(&f).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    w.stop().await;
    let calls = script.calls();
    assert_eq!(attempts(&calls), vec![3, 4], "{calls:#?}");
    assert_gap(&calls, 0, 200);
    let d = w.decisions();
    assert_eq!(field(&d[0], "tier"), "200ms");
    assert_eq!(header_str(&dlq, "dlqctl-reason"), "exhausted");
    assert_eq!(header_int(&dlq, "dlqctl-attempt"), 4);
    assert_eq!(
        error_history(&dlq),
        vec![(3, "down 3".to_string()), (4, "down 4".to_string())]
    );
    assert_empty(&f.broker, &f.main_and_retry_queues()).await;
}

/// `x-death` entries of another queue, or with reason `rejected` on this
/// pipeline's own tier, are not retries of this pipeline: attempt 1.
#[tokio::test]
async fn x_death_of_other_queues_or_rejections_is_not_counted() {
    let f = Fixture::new(&[100, 200], 4, |_| {}).await;
    let (_, script, mut w) = f.consuming_worker("exit 0", &[]).await;
    let deaths = x_death(vec![
        death(
            &format!("{}-other.retry.100ms", f.cleanup.prefix),
            "expired",
            5,
        ),
        death(&f.pipe.retry_queue(100), "rejected", 5),
        death(&f.pipe.name, "delivery_limit", 2),
    ]);
    let props = with_id("m-6c").with_headers(table(&[("x-death", deaths)]));
    publish(&f.broker, "", &f.pipe.name, b"x", props).await;

    let d = w.wait_decisions(1, SECS_20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.stop().await;
    assert_eq!(attempts(&script.calls()), vec![1]);
    assert_eq!(field(&d[0], "decision"), "ack");
    assert_empty(&f.broker, &f.all_queues()).await;
}

/// Both counts present: attempt = max(H, D) + 1, not their sum. H = 1 and
/// D = 2 → attempt 3.
#[tokio::test]
async fn attempt_is_one_more_than_the_larger_of_header_and_x_death() {
    let f = Fixture::new(&[100, 200], 4, |_| {}).await;
    let (_, script, mut w) = f.consuming_worker("exit 0", &[]).await;
    let deaths = expired_once_in_each_tier(&f);
    let props = with_id("m-6d").with_headers(table(&[
        ("x-death", deaths),
        ("dlqctl-attempt", AMQPValue::LongInt(1)),
    ]));
    publish(&f.broker, "", &f.pipe.name, b"x", props).await;
    w.wait_decisions(1, SECS_20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.stop().await;
    assert_eq!(attempts(&script.calls()), vec![3]);
    assert_empty(&f.broker, &f.all_queues()).await;
}

/// With jitter, each copy carries a whole-ms `expiration` the broker
/// accepts (a fractional one would close the channel and stall the copy):
/// the retry comes back within the jitter band of its tier.
#[tokio::test]
async fn jittered_retries_are_accepted_and_wait_within_the_band() {
    let f = Fixture::new(&[400], 3, |p| p.jitter = 0.5).await;
    let (_, script, mut w) = f.consuming_worker(r#"echo "busy" >&2; exit 75"#, &[]).await;
    publish(&f.broker, "", &f.pipe.name, b"x", with_id("m-j")).await;
    the_dlq_message(&f).await;
    w.stop().await;
    let calls = script.calls();
    assert_eq!(attempts(&calls), vec![1, 2, 3]);
    for i in 0..2 {
        // floor(400 × (1 − 0.5 × U)) is in 201..=400 ms.
        assert_gap(&calls, i, 200);
        assert!(gap_ms(&calls, i) < 400 + 1500);
    }
    assert!(w.events("the broker refused a copy; the original stays unacked, no new handler starts, retrying the publish").is_empty(), "{}", w.output());
}

// ---------------------------------------------------------------- refusals

/// The retry exchange disappears under a running worker: the copy is
/// refused, the original stays unacked in the main queue, the handler is not
/// run again (nor any other message's), and once the topology is provisioned
/// again the message proceeds and is acked.
#[tokio::test]
async fn refused_retry_copy_holds_the_message_until_the_exchange_is_back() {
    let f = Fixture::new(&[300], 3, |_| {}).await;
    // Two handler slots: only the refusal gate, not the concurrency limit,
    // can hold the second message back.
    let (file, script, mut w) = f
        .consuming_worker(
            r#"if grep -q first "$body_file" && [ "$DLQCTL_ATTEMPT" -eq 1 ]; then echo "flaky" >&2; exit 75; fi
exit 0"#,
            &["--concurrency", "2"],
        )
        .await;
    f.broker
        .mgmt
        .request(
            reqwest::Method::DELETE,
            &["exchanges", "/", &f.pipe.retry_exchange()],
        )
        .await
        .expect("delete the retry exchange");
    assert!(f
        .broker
        .mgmt
        .exchange(&f.pipe.retry_exchange())
        .await
        .is_none());

    publish(&f.broker, "", &f.pipe.name, b"first", with_id("m-7a")).await;
    script.wait_calls(1, SECS_20).await;
    w.wait_event("the broker refused a copy; the original stays unacked, no new handler starts, retrying the publish", 1, SECS_20).await;
    let started = Instant::now();
    // The management API's counts lag a few seconds.
    wait_queue_field(
        &f.broker,
        &f.pipe.name,
        "messages_unacknowledged",
        |n| n == 1,
        Duration::from_secs(20),
    )
    .await;
    if let Some(rest) = Duration::from_secs(3).checked_sub(started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    assert_eq!(
        script.calls().len(),
        1,
        "the handler ran again while the copy was refused"
    );

    // Another message waits too: no new handler starts while refusing.
    publish(&f.broker, "", &f.pipe.name, b"second", with_id("m-7b")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        script.calls().len(),
        1,
        "a new handler started while a copy was refused"
    );
    assert!(w.decisions().is_empty(), "{:#?}", w.decisions());
    assert_eq!(f.broker.message_count(&f.pipe.dlq()).await, Some(0));

    let reprovisioned = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    provision_file(&file).await;
    let d = w.wait_decisions(3, Duration::from_secs(30)).await;
    w.stop().await;
    let calls = script.calls();
    assert_eq!(calls.len(), 3, "{calls:#?}");
    let m7a: Vec<&Call> = calls.iter().filter(|c| c.message_id == "m-7a").collect();
    assert_eq!(
        m7a.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(m7a[1].t_ns > reprovisioned + 300_000_000, "{calls:#?}");
    assert_eq!(
        d.iter().map(|e| field(e, "decision")).collect::<Vec<_>>(),
        vec!["retry", "ack", "ack"]
    );
    assert!(
        !w.events("the broker accepts copies again").is_empty(),
        "{}",
        w.output()
    );
    assert_empty(&f.broker, &f.all_queues()).await;
}

/// A quorum pipeline whose DLQ is full: the permanent failure's copy is
/// refused, the worker falls back to nack and the broker holds the message
/// in the main queue (`messages_dlx`); the handler is not run again.
#[tokio::test]
async fn full_quorum_dlq_keeps_the_message_in_the_main_queue() {
    let f = Fixture::new(&[100], 2, |p| p.dlq_max_length = Some(1)).await;
    let file = f.pipe.provision(&f.scratch).await;
    // Fill the DLQ until it refuses (quorum overshoots by one or two).
    let mut filled = 0;
    for n in 0..10 {
        let body = format!("filler {n}");
        match try_publish(
            &f.broker,
            "",
            &f.pipe.dlq(),
            body.as_bytes(),
            with_id("filler"),
        )
        .await
        {
            Ok(()) => filled += 1,
            Err(_) => break,
        }
    }
    assert!((1..10).contains(&filled), "the DLQ took {filled} messages");

    let script = Script::new(
        &f.scratch,
        "h",
        r#"echo "rejected by partner" >&2; exit 65"#,
    );
    let mut w = WorkerProc::with_script(&file, &f.pipe.name, &script, &[]);
    w.wait_consuming().await;
    publish(&f.broker, "", &f.pipe.name, b"doomed", with_id("m-8")).await;
    let started = Instant::now();
    let d = w.wait_decisions(1, SECS_20).await;
    assert_eq!(field(&d[0], "decision"), "dead_letter_nack", "{d:#?}");
    let held = wait_queue_field(
        &f.broker,
        &f.pipe.name,
        "messages_dlx",
        |n| n >= 1,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(held, 1);
    if let Some(rest) = Duration::from_secs(3).checked_sub(started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    assert_eq!(
        attempts(&script.calls()),
        vec![1],
        "the handler should run once"
    );
    assert_eq!(w.decisions().len(), 1);
    assert_eq!(
        f.broker.message_count(&f.pipe.dlq()).await,
        Some(filled),
        "the DLQ should still hold only the fillers"
    );
    w.stop().await;
}

// ---------------------------------------------------------------- handler misuse

/// A handler program that does not exist: exit 2 at start, naming it.
#[tokio::test]
async fn missing_handler_program_exits_2() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    for program in ["/nonexistent/dlqctl-handler", "dlqctl-no-such-handler-xyz"] {
        let run = work(&file, &f.pipe.name, &["--", program]).await;
        run.assert_code(2).assert_stderr_has(&[program, "handler"]);
        assert!(run.elapsed < Duration::from_secs(10));
    }
}

/// A handler that hangs past `--handler-timeout`: transient each time,
/// retried, dead-lettered when exhausted, and its child `sleep` is killed.
#[tokio::test]
async fn hung_handler_times_out_is_retried_and_leaves_no_process() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let secs = (1000 + (uuid::Uuid::new_v4().as_u128() % 8000)).to_string();
    let behaviour = format!("sleep {secs}\nexit 0");
    let timeout = ["--handler-timeout", "300ms"];
    let (_, script, mut w) = f.consuming_worker(&behaviour, &timeout).await;
    publish(&f.broker, "", &f.pipe.name, b"x", with_id("m-9b")).await;

    let dlq = the_dlq_message(&f).await;
    let d = w.wait_decisions(2, SECS_20).await;
    assert_eq!(attempts(&script.calls()), vec![1, 2]);
    assert_eq!(
        d.iter()
            .map(|e| (field(e, "outcome"), field(e, "decision")))
            .collect::<Vec<_>>(),
        vec![("timed_out", "retry"), ("timed_out", "dead_letter")]
    );
    let error = header_str(&dlq, "dlqctl-last-error");
    assert!(error.starts_with("timed out after 300ms"), "{error}");
    assert_eq!(header_str(&dlq, "dlqctl-reason"), "exhausted");
    let left = processes_with_cmdline(&["sleep", &secs]);
    assert!(left.is_empty(), "`sleep {secs}` still running: {left:?}");
    w.stop().await;
}

/// A handler that writes 5 MB to stderr: the error header holds the end of
/// it, not the beginning, and the worker's memory stays small.
#[tokio::test]
async fn chatty_handler_stderr_is_bounded() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let (_, _, mut w) = f
        .consuming_worker(
            r#"echo "HEAD-MARKER" >&2
head -c 5000000 /dev/zero | tr '\0' x >&2
echo " TAIL-MARKER" >&2
exit 65"#,
            &[],
        )
        .await;
    let hwm_before = w.memory_kb("VmHWM");
    publish(&f.broker, "", &f.pipe.name, b"x", with_id("m-9c")).await;
    let dlq = the_dlq_message(&f).await;
    let hwm_after = w.memory_kb("VmHWM");
    w.stop().await;

    let error = header_str(&dlq, "dlqctl-last-error");
    assert!(
        error.len() <= 1024,
        "dlqctl-last-error is {} bytes",
        error.len()
    );
    assert!(
        error.starts_with('…'),
        "the error should be marked as cut: {error:.80}"
    );
    assert!(!error.contains("HEAD-MARKER"), "{error:.80}");
    // The program's last words make it into the header whole.
    assert!(error.ends_with("x TAIL-MARKER"), "{error:.80}");
    assert!(
        error
            .trim_start_matches('…')
            .chars()
            .all(|c| "x TAIL-MARKER".contains(c)),
        "{error:.80}"
    );
    let history = error_history(&dlq);
    assert_eq!(history.len(), 1);
    assert!(history[0].1.len() <= 256, "{}", history[0].1.len());
    // The log line keeps the end too (the last 300 bytes), as the header.
    let logged = w.decisions();
    let logged = field(&logged[0], "error");
    assert!(logged.ends_with("x TAIL-MARKER"), "{logged:.80}");
    assert!(
        logged.starts_with('…') && logged.len() <= 300 + '…'.len_utf8(),
        "{logged:.80}"
    );
    let grown = hwm_after.saturating_sub(hwm_before);
    assert!(
        grown < 4 * 1024,
        "the worker's peak memory grew by {grown} kB ({hwm_before} → {hwm_after}) for 5 MB of stderr"
    );
}

/// `--http` to a port that refuses connections: transient every time, then
/// the DLQ with reason `exhausted` naming the URL.
#[tokio::test]
async fn http_connection_refused_is_transient_then_exhausted() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/hook");
    let mut w = WorkerProc::spawn(
        &file,
        &f.pipe.name,
        &["--http", &url, "--handler-timeout", "2s"],
    );
    w.wait_consuming().await;
    publish(&f.broker, "", &f.pipe.name, b"{}", with_id("m-9d")).await;
    let dlq = the_dlq_message(&f).await;
    let d = w.wait_decisions(2, SECS_20).await;
    w.stop().await;
    assert_eq!(
        d.iter()
            .map(|e| (
                e["attempt"].as_u64().unwrap_or(0),
                field(e, "outcome"),
                field(e, "decision")
            ))
            .collect::<Vec<_>>(),
        vec![(1, "transient", "retry"), (2, "transient", "dead_letter")]
    );
    assert_eq!(header_str(&dlq, "dlqctl-reason"), "exhausted");
    let error = header_str(&dlq, "dlqctl-last-error");
    assert!(error.starts_with(&format!("POST {url}")), "{error}");
    assert_eq!(header_int(&dlq, "dlqctl-attempt"), 2);
}

/// An endpoint answering 429 with `Retry-After: 1`: the retry goes to the
/// 1s tier (not the row's 100ms), the next request comes at least a second
/// later, and a 200 acks the message.
#[tokio::test]
async fn http_retry_after_picks_the_tier_then_success_acks() {
    use axum::http::{HeaderMap, StatusCode};
    use std::sync::{Arc, Mutex};

    let f = Fixture::new(&[100, 1000, 5000], 4, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;

    type Seen = Arc<Mutex<Vec<(Instant, String, String)>>>;
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let seen = seen.clone();
            move |headers: HeaderMap| {
                let seen = seen.clone();
                async move {
                    let h = |k: &str| {
                        headers
                            .get(k)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string()
                    };
                    let mut seen = seen.lock().unwrap();
                    seen.push((Instant::now(), h("x-retry-attempt"), h("idempotency-key")));
                    if seen.len() == 1 {
                        (
                            StatusCode::TOO_MANY_REQUESTS,
                            [("retry-after", "1")],
                            "slow down",
                        )
                    } else {
                        (StatusCode::OK, [("x-ok", "1")], "ok")
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let url = format!("http://{addr}/hook");
    let mut w = WorkerProc::spawn(&file, &f.pipe.name, &["--http", &url]);
    w.wait_consuming().await;
    publish(&f.broker, "", &f.pipe.name, b"{}", with_id("m-9e")).await;
    let d = w.wait_decisions(2, SECS_20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.stop().await;
    server.abort();

    assert_eq!(
        d.iter()
            .map(|e| (field(e, "decision"), field(e, "tier")))
            .collect::<Vec<_>>(),
        vec![("retry", "1s"), ("ack", "")]
    );
    assert!(field(&d[0], "error").contains("429"), "{d:#?}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen.iter()
            .map(|(_, a, k)| (a.as_str(), k.as_str()))
            .collect::<Vec<_>>(),
        vec![("1", "m-9e"), ("2", "m-9e")]
    );
    // A second, not the row's 100 ms. The broker's TTL timer may fire a
    // few ms before a full second by our clock (seen: 997 ms under load),
    // hence the 50 ms of slack.
    let gap = seen[1].0 - seen[0].0;
    assert!(
        gap >= Duration::from_millis(950) && gap < Duration::from_millis(2500),
        "the retry came after {gap:?}"
    );
    assert_empty(&f.broker, &f.all_queues()).await;
}

// ---------------------------------------------------------------- start and stop

/// `--queue` that is not a pipeline: exit 2 naming the pipelines.
#[tokio::test]
async fn unknown_queue_exits_2_naming_the_pipelines() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let file = f.pipe.write(&f.scratch);
    let run = work(&file, "no-such-pipeline", &["--", "/bin/true"]).await;
    run.assert_code(2)
        .assert_stderr_has(&["no-such-pipeline", &f.pipe.name]);
}

/// A topology that is not (fully) provisioned: exit 1 naming each missing
/// object and nothing else.
#[tokio::test]
async fn unprovisioned_topology_exits_1_naming_the_missing_objects() {
    let f = Fixture::new(&[100, 200], 2, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    for (what, name) in [
        ("queues", f.pipe.retry_queue(200)),
        ("exchanges", f.pipe.dlx()),
    ] {
        f.broker
            .mgmt
            .request(reqwest::Method::DELETE, &[what, "/", &name])
            .await
            .expect("delete");
    }
    let run = work(&file, &f.pipe.name, &["--", "/bin/true"]).await;
    run.assert_code(1);
    let missing_q = format!("queue {}", f.pipe.retry_queue(200));
    let missing_x = format!("exchange {}", f.pipe.dlx());
    run.assert_stderr_has(&[&missing_q, &missing_x]);
    for present in [
        format!("queue {},", f.pipe.name),
        format!("queue {}", f.pipe.retry_queue(100)),
        format!("queue {}", f.pipe.dlq()),
        format!("exchange {}", f.pipe.retry_exchange()),
    ] {
        assert!(!run.stderr.contains(&present), "{present}: {}", run.stderr);
    }
    assert!(run.stderr.contains("dlqctl provision"), "{}", run.stderr);
}

/// SIGTERM while a handler runs: the worker waits for it, acks, exits 0.
#[tokio::test]
async fn sigterm_waits_for_the_handler_in_flight() {
    let (f, script, mut w) = one_second_in_flight("m-10c").await;
    let sent = Instant::now();
    w.sigterm();
    let code = w.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(code, Some(0), "{}", w.output());
    assert!(
        sent.elapsed() >= Duration::from_millis(500),
        "exited too soon"
    );
    assert!(
        script.dir.join("done.1").exists(),
        "the handler was cut short"
    );
    let d = w.decisions();
    assert_eq!(d.len(), 1, "{}", w.output());
    assert_eq!(field(&d[0], "decision"), "ack");
    assert_eq!(attempts(&script.calls()), vec![1]);
    // Closed connection: an unacked message would be ready again.
    assert_empty(&f.broker, &f.all_queues()).await;
}

/// `--dead-letter nack` on a classic pipeline would drop a message whose
/// DLQ refuses it (classic dead-lettering is at-most-once): refused, exit 2.
#[tokio::test]
async fn nack_dead_lettering_is_refused_on_classic_pipelines() {
    let f = Fixture::new(&[100], 2, |p| p.queue_type = "classic").await;
    let file = f.pipe.write(&f.scratch);
    let run = work(
        &file,
        &f.pipe.name,
        &["--dead-letter", "nack", "--", "/bin/true"],
    )
    .await;
    run.assert_code(2)
        .assert_stderr_has(&["at-most-once", &f.pipe.name]);
}

/// A main queue that exists with other arguments than the file's (here:
/// classic where the file says quorum, so a refused dead-letter would be
/// dropped instead of held) stops the worker at start, exit 1, naming the
/// difference; nothing is consumed.
#[tokio::test]
async fn a_main_queue_that_differs_from_the_file_is_refused_at_start() {
    let f = Fixture::new(&[100], 2, |p| p.queue_type = "classic").await;
    f.pipe.provision(&f.scratch).await;
    publish(&f.broker, "", &f.pipe.name, b"keep me", with_id("m-diff")).await;
    let mut quorum = f.pipe.clone();
    quorum.queue_type = "quorum";
    let file = f.scratch.write("quorum.yaml", &quorum.yaml());
    let run = work(&file, &f.pipe.name, &["--", "/bin/true"]).await;
    let differs = format!("queue {}: x-queue-type differs", f.pipe.name);
    run.assert_code(1)
        .assert_stderr_has(&["differs from the topology file", &differs]);
    assert_eq!(f.broker.message_count(&f.pipe.name).await, Some(1));
    drop(f.cleanup);
}

// ---------------------------------------------------------------- returns among many copies in flight

/// Many copies in flight while some are returned: the 300 ms tier is
/// unbound, so every second-attempt copy is returned as unroutable while
/// first-attempt copies (and later the dead-letter copies) route; the
/// binding is then flapped a few times to mix returned and routed copies
/// again. A return must never be read as another copy's confirm: once the
/// tier is bound for good, every one of the 300 messages ends in the DLQ
/// as `exhausted` (duplicates are allowed, a missing message is not).
#[tokio::test]
async fn returned_copies_among_many_in_flight_lose_no_message() {
    const N: usize = 300;
    let f = Fixture::new(&[200, 300], 3, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let script = Script::new(&f.scratch, "h", r#"echo "still down" >&2; exit 75"#);
    let tier = f.pipe.retry_queue(300);
    f.unbind_tier(&tier, "300ms").await;
    assert!(f
        .broker
        .mgmt
        .bindings(&f.pipe.retry_exchange(), &tier)
        .await
        .is_empty());
    let mut w = WorkerProc::with_script(
        &file,
        &f.pipe.name,
        &script,
        &["--concurrency", "50", "--prefetch", "100"],
    );
    w.wait_consuming().await;

    // Publish the 300 quickly, many confirms in flight on one channel.
    let ch = f.broker.channel().await;
    ch.confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let mut confirms = Vec::with_capacity(N);
    for k in 0..N {
        let props = with_id(&format!("m-{k}")).with_delivery_mode(2);
        let c = ch
            .basic_publish(
                "".into(),
                f.pipe.name.as_str().into(),
                lapin::options::BasicPublishOptions::default(),
                format!("message {k}").as_bytes(),
                props,
            )
            .await
            .expect("publish");
        confirms.push(c);
    }
    for c in confirms {
        assert_eq!(c.await.expect("a confirm"), lapin::Confirmation::Ack(None));
    }
    let _ = ch.close(200, "bye".into()).await;

    // Second-attempt copies are refused: the worker holds their originals
    // and starts no new handler; wait until the runs stop growing (the
    // copies in flight then, routed and returned, finish first).
    w.wait_event(
        "the broker refused a copy; the original stays unacked, no new handler starts, retrying the publish",
        1,
        Duration::from_secs(40),
    )
    .await;
    let mut runs = script.calls().len();
    let mut stable_since = Instant::now();
    let start = Instant::now();
    while stable_since.elapsed() < Duration::from_secs(2) && start.elapsed() < SECS_20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = script.calls().len();
        if now != runs {
            runs = now;
            stable_since = Instant::now();
        }
    }
    let returned = w.events("the broker refused a copy; the original stays unacked, no new handler starts, retrying the publish").len();
    eprintln!("before re-binding: {runs} handler runs, {returned} refused copies");
    // The refusal gate stops new handler runs at the first refused copy,
    // so how many ran by now depends on timing: at least the first ones.
    assert!(runs > 0 && returned > 0);

    // Flap the binding a few times: each change of state mixes returned
    // and routed copies in flight again.
    for _ in 0..8 {
        provision_file(&file).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        f.unbind_tier(&tier, "300ms").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    provision_file(&file).await;

    // Every message must reach the DLQ, exhausted.
    let mut ids = std::collections::BTreeSet::new();
    let mut copies = 0;
    // Give up when no copy has come for 45 s (a lost message never does):
    // longer than the worker's 30 s confirm timeout, since on RabbitMQ 4.3
    // a copy published while the binding flapped was seen to wait for it.
    let mut last_copy = Instant::now();
    while ids.len() < N && last_copy.elapsed() < Duration::from_secs(45) {
        let got = drain(&f.broker, &f.pipe.dlq()).await;
        if !got.is_empty() {
            last_copy = Instant::now();
        } else {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        for d in got {
            assert_eq!(header_str(&d, "dlqctl-reason"), "exhausted");
            copies += 1;
            ids.insert(
                d.properties
                    .message_id()
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            );
        }
    }
    let missing: Vec<String> = (0..N)
        .map(|k| format!("m-{k}"))
        .filter(|id| !ids.contains(id))
        .collect();
    let calls = script.calls().len();
    w.stop().await;
    assert!(
        missing.is_empty(),
        "{} of {N} messages never reached the DLQ ({copies} DLQ copies, {calls} handler runs): {missing:?}",
        missing.len()
    );
    assert_eq!(ids.len(), N);
    assert_empty(&f.broker, &f.main_and_retry_queues()).await;
}

/// Without `--prefetch`, the broker pushes only as many deliveries as the
/// worker has handlers (`--concurrency`): the rest stay ready in the queue,
/// where a reconnect cannot count them toward `x-delivery-limit`.
#[tokio::test]
async fn default_prefetch_follows_the_concurrency() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let script = Script::new(&f.scratch, "h", "sleep 23\nexit 0");
    f.publish_numbered("m-", 10).await;
    let mut w = WorkerProc::with_script(
        &file,
        &f.pipe.name,
        &script,
        &["--concurrency", "2", "--grace", "1s"],
    );
    let consuming = w.wait_event("consuming", 1, SECS_20).await;
    assert_eq!(consuming[0]["prefetch"], 2, "{}", w.output());
    script.wait_calls(2, SECS_20).await;
    // Two deliveries in the handlers, eight still ready in the queue.
    f.broker.wait_for_count(&f.pipe.name, 8, SECS_20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(f.broker.message_count(&f.pipe.name).await, Some(8));
    assert_eq!(script.calls().len(), 2);
    w.sigterm();
    assert!(w.wait_exit(SECS_20).await.is_some(), "{}", w.output());
}

/// SIGHUP (a closed terminal, a supervisor's reload) is a graceful stop
/// like SIGTERM: the handler in flight finishes, its message is acked, the
/// worker exits 0 and says why.
#[tokio::test]
async fn sighup_is_a_graceful_stop_like_sigterm() {
    let (f, script, mut w) = one_second_in_flight("m-hup").await;
    w.signal(libc::SIGHUP);
    let code = w.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(code, Some(0), "{}", w.output());
    assert!(
        script.dir.join("done.1").exists(),
        "the handler was cut short"
    );
    assert!(
        w.output().contains("SIGHUP: finishing messages in flight"),
        "{}",
        w.output()
    );
    assert_eq!(field(&w.decisions()[0], "decision"), "ack");
    assert_empty(&f.broker, &f.all_queues()).await;
}

/// `--metrics-addr 127.0.0.1:0` logs the port the kernel chose, and
/// `/metrics` answers there.
#[tokio::test]
async fn metrics_on_port_0_logs_and_serves_the_bound_port() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let (_, _, mut w) = f
        .start_worker("exit 0", &["--metrics-addr", "127.0.0.1:0"])
        .await;
    let addr = w.metrics_addr().await;
    assert_ne!(addr.port(), 0, "{}", w.output());
    w.wait_consuming().await;
    publish(&f.broker, "", &f.pipe.name, b"x", with_id("m-metrics")).await;
    w.wait_decisions(1, SECS_20).await;
    let body = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("a body");
    assert!(body.contains("dlqctl_decisions_total"), "{body}");
    let first = format!(
        "dlqctl_first_attempt_successes_total{{queue=\"{}\"}} 1",
        f.pipe.name
    );
    assert!(body.contains(&first), "no `{first}` in {body}");
    w.stop().await;
}

/// A worker whose log sink fails (stderr a full disk, or a pipe whose
/// reader is gone, as after `2>&1 | head -1`) keeps handling messages and
/// still stops on SIGTERM with exit 0: no panic (exit 101), no deafness to
/// signals.
#[tokio::test]
async fn a_failing_log_sink_neither_panics_nor_deafens_the_worker() {
    use std::process::Stdio;
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let script = Script::new(&f.scratch, "h", "exit 0");
    for sink in ["full", "closed pipe"] {
        let stderr = match sink {
            "full" => Stdio::from(std::fs::File::create("/dev/full").expect("/dev/full")),
            _ => Stdio::piped(),
        };
        let mut child = Dlqctl::new("work")
            .arg(&file)
            .args(["--queue", &f.pipe.name, "--"])
            .arg(&script.path)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn();
        // The reader of the pipe goes away at once.
        drop(child.stderr.take());
        let before = script.calls().len();
        publish(&f.broker, "", &f.pipe.name, b"x", with_id(sink)).await;
        script.wait_calls(before + 1, SECS_20).await;
        f.broker.wait_for_count(&f.pipe.name, 0, SECS_20).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "{sink}: the worker exited on its own"
        );
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(child.id().expect("a pid") as i32, libc::SIGTERM);
        }
        let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
            .await
            .unwrap_or_else(|_| panic!("{sink}: SIGTERM was ignored"))
            .expect("wait");
        assert_eq!(status.code(), Some(0), "{sink}: {status:?}");
    }
}

/// Headers whose JSON passes Linux's 128 KiB limit for one environment
/// variable (a 40 KB byte array is ~150 KB of JSON) reach the handler
/// through `DLQCTL_HEADERS_FILE`; the run is not refused with E2BIG (which
/// burned every attempt with the handler never run), and the file is
/// removed afterwards.
#[tokio::test]
async fn headers_too_large_for_the_environment_reach_the_handler_in_a_file() {
    let f = Fixture::new(&[100], 3, |_| {}).await;
    let (_, script, mut w) = f
        .consuming_worker(
            r#"cp "$DLQCTL_HEADERS_FILE" "$d/hf.$n"; printf '%s' "$DLQCTL_HEADERS_FILE" > "$d/hfpath.$n"; exit 0"#,
            &[],
        )
        .await;
    let big = lapin::types::ByteArray::from(vec![200u8; 40_000]);
    let props =
        with_id("m-big-headers").with_headers(table(&[("blob", AMQPValue::ByteArray(big))]));
    publish(&f.broker, "", &f.pipe.name, b"x", props).await;
    let d = w.wait_decisions(1, SECS_20).await;
    assert_eq!(field(&d[0], "decision"), "ack", "{d:#?}");
    assert_eq!(attempts(&script.calls()), vec![1]);
    let json: Value = serde_json::from_slice(
        &std::fs::read(script.dir.join("hf.1")).expect("the handler read the headers file"),
    )
    .expect("JSON headers");
    assert_eq!(json["blob"].as_array().map(Vec::len), Some(40_000));
    let path = std::fs::read_to_string(script.dir.join("hfpath.1")).unwrap();
    assert!(
        !std::path::Path::new(&path).exists(),
        "{path} was left behind"
    );
    w.stop().await;
    assert_empty(&f.broker, &f.all_queues()).await;
}

/// The handler program deleted while the worker runs: its messages are
/// held (not retried, not dead-lettered), consumption pauses, and both
/// resume once the program is back.
#[tokio::test]
async fn a_handler_program_gone_mid_run_pauses_and_never_dead_letters() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let (_, script, mut w) = f.consuming_worker("exit 0", &[]).await;
    let text = std::fs::read(&script.path).unwrap();
    std::fs::remove_file(&script.path).unwrap();
    f.publish_numbered("gone-", 3).await;
    w.wait_event(
        "cannot start the handler: holding its message (no attempt counted) and trying again with backoff; consumption pauses until it starts",
        1,
        SECS_20,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(w.decisions().is_empty(), "{}", w.output());
    assert_eq!(f.broker.message_count(&f.pipe.dlq()).await, Some(0));
    // One held by the handler slot, the others still ready.
    assert_eq!(f.broker.message_count(&f.pipe.name).await, Some(2));
    Scratch::write_executable(&script.path, &String::from_utf8_lossy(&text));
    let d = w.wait_decisions(3, Duration::from_secs(40)).await;
    assert!(d.iter().all(|e| field(e, "decision") == "ack"), "{d:#?}");
    assert!(d.iter().all(|e| e["attempt"] == 1), "{d:#?}");
    w.stop().await;
    assert_empty(&f.broker, &f.all_queues()).await;
}

/// dlqctl killed with SIGKILL: a handler program still running (in a
/// process group of its own) dies with it.
#[tokio::test]
async fn a_running_handler_dies_with_a_killed_dlqctl() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let (_, script, mut w) = f
        .consuming_worker("echo $$ > \"$d/pid\"; exec sleep 100", &[])
        .await;
    publish(&f.broker, "", &f.pipe.name, b"x", with_id("slow")).await;
    script.wait_calls(1, SECS_20).await;
    let pid_file = script.dir.join("pid");
    let start = Instant::now();
    let pid: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break p;
        }
        assert!(start.elapsed() < SECS_20, "no pid file");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    w.signal(libc::SIGKILL);
    w.wait_exit(SECS_20).await;
    let start = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the handler {pid} outlived dlqctl"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The text log a person reads: one `message handled` line per message at
/// INFO, a success included, with no field logged empty (`tier=`,
/// `reason=""`, `error=`); the handler's own stderr only at DEBUG.
#[tokio::test]
async fn text_logs_one_line_per_message_no_empty_field_and_handler_stderr_at_debug() {
    let f = Fixture::new(&[100], 2, |_| {}).await;
    let file = f.pipe.provision(&f.scratch).await;
    let handler = f.scratch.path().join("h.sh");
    Scratch::write_executable(
        &handler,
        "#!/bin/sh\necho \"handler says $DLQCTL_MESSAGE_ID\" >&2\ncase \"$(cat)\" in *bad*) exit 65;; esac\nexit 0\n",
    );
    let text_worker = |log: &str| {
        let mut child = Dlqctl::new("work")
            .arg(&file)
            .args(["--queue", &f.pipe.name, "--"])
            .arg(&handler)
            .env("RUST_LOG", log)
            .spawn();
        let lines = crate::support::collect_output(&mut child);
        (child, lines)
    };
    for (log, ids) in [
        ("info", ["ok-1", "bad-1"]),
        ("info,dlqctl::handler=debug", ["ok-2", "bad-2"]),
    ] {
        let (mut child, lines) = text_worker(log);
        for id in ids {
            let body: &[u8] = if id.starts_with("bad") {
                b"bad"
            } else {
                b"good"
            };
            publish(&f.broker, "", &f.pipe.name, body, with_id(id)).await;
        }
        let handled = |lines: &[String]| -> Vec<String> {
            lines
                .iter()
                .filter(|l| l.contains(" message handled "))
                .cloned()
                .collect()
        };
        let start = Instant::now();
        while handled(&lines.lock().unwrap()).len() < 2 && start.elapsed() < SECS_20 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(child.id().expect("a pid") as i32, libc::SIGTERM);
        }
        let _ = tokio::time::timeout(SECS_20, child.wait()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let all = lines.lock().unwrap().clone();
        let shown = all.join("\n");
        let got = handled(&all);
        for id in ids {
            let mine: Vec<&String> = got
                .iter()
                .filter(|l| l.contains(&format!("message_id=\"{id}\"")))
                .collect();
            assert_eq!(mine.len(), 1, "{log}: one line for {id}:\n{shown}");
            let line = mine[0];
            assert!(line.contains(" INFO "), "{log}: {line}");
            for token in line.split_whitespace() {
                assert!(
                    !(token.ends_with('=') || token.ends_with("=\"\"")),
                    "{log}: an empty field `{token}` in {line}"
                );
            }
            if id.starts_with("ok") {
                for absent in ["tier=", "reason=", "error="] {
                    assert!(
                        !line.contains(absent),
                        "{log}: {absent} on a success: {line}"
                    );
                }
            } else {
                assert!(line.contains("error=handler says"), "{log}: {line}");
            }
        }
        let said: Vec<&String> = all
            .iter()
            .filter(|l| l.contains(" handler stderr "))
            .collect();
        if log == "info" {
            assert!(said.is_empty(), "handler stderr at info:\n{shown}");
        } else {
            // The success's words; a failure's are its error.
            assert_eq!(said.len(), 1, "{shown}");
            assert!(
                said[0].contains(" DEBUG ") && said[0].contains("output=handler says ok-2"),
                "{}",
                said[0]
            );
        }
    }
}
