//! What changed between RabbitMQ versions in the counters a retry tool
//! lives on, shown on whichever broker the suite is pointed at (CI runs it
//! on 3.10 and on 4.3). The broker's version is read from the broker.
//!
//! RabbitMQ 4.3 counts in a quorum queue's `x-delivery-count` only failed
//! deliveries (`basic.reject`, a channel or connection closed with the
//! delivery unacked), no longer `basic.nack(requeue)`, and adds
//! `x-acquired-count` for every hand-off. The crash-loop guard
//! (`delivery_limit`) still ends a crash loop on every version
//! (`worker_chaos::quorum_crash_loop_ends_in_the_dlq_by_delivery_limit`
//! runs on both); these tests show what a worker's stop does.

use crate::support::script::Script;
use crate::support::worker::*;
use crate::support::{Broker, Cleanup};
use lapin::options::{BasicGetOptions, BasicNackOptions, BasicRejectOptions};
use std::time::{Duration, Instant};

/// A worker stopped (SIGTERM) while it holds prefetched messages it never
/// started hands them back with `nack(requeue)`. On 4.3 that costs them
/// nothing: three stops with `delivery_limit: 1` and all three messages
/// are handled. Up to 4.2 every requeue counts toward the limit, whatever
/// returns the message, so the last one is dead-lettered by the broker
/// (`delivery_limit`) after its second return: the README says so, and
/// that is why the worker's prefetch follows its concurrency by default.
#[tokio::test]
async fn a_worker_stop_hands_unstarted_messages_back_without_counting_them_on_4_3() {
    let f = PipeFixture::new(&[60_000], 3, |_| {}).await;
    let version = f.broker.version().await;
    let file = f.scratch.write(
        "topology.yaml",
        &format!("{}    delivery_limit: 1\n", f.pipe.yaml()),
    );
    provision_file(&file).await.assert_code(0);
    let script = Script::new(&f.scratch, "h", "sleep 1\nexit 0");
    for id in ["m1", "m2", "m3"] {
        publish(&f.broker, "", &f.pipe.name, id.as_bytes(), with_id(id)).await;
    }
    // One handler at a time, five prefetched: each worker starts one
    // message and holds the others unstarted when it is stopped.
    let args = ["--prefetch", "5", "--concurrency", "1", "--grace", "30s"];
    let start = Instant::now();
    for (handled, round) in (1..=3).enumerate() {
        // Every message not handled yet is back in the main queue or in
        // the DLQ before the next worker starts.
        let start = Instant::now();
        let waiting = loop {
            let main = f.broker.message_count(&f.pipe.name).await.unwrap_or(0);
            let dead = f.broker.message_count(&f.pipe.dlq()).await.unwrap_or(0);
            if (main + dead) as usize == 3 - handled {
                break main;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "round {round}: {main} in the main queue and {dead} in the DLQ, {handled} handled"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if waiting == 0 {
            break;
        }
        let mut w = WorkerProc::with_script(&file, &f.pipe.name, &script, &args);
        script
            .wait_calls(handled + 1, Duration::from_secs(30))
            .await;
        w.sigterm();
        assert_eq!(
            w.wait_exit(Duration::from_secs(30)).await,
            Some(0),
            "round {round}: {}",
            w.output()
        );
    }
    let calls = script.calls();
    let ids: Vec<&str> = calls.iter().map(|c| c.message_id.as_str()).collect();
    let dlq = drain(&f.broker, &f.pipe.dlq()).await;
    if version >= (4, 3) {
        assert_eq!(ids.len(), 3, "every message handled once: {ids:?}");
        assert!(dlq.is_empty(), "nothing dead-lettered on {version:?}");
        // The handler saw no failed delivery counted, and every hand-off.
        for n in 1..=3 {
            let h = script.headers(n);
            let failures = h["x-delivery-count"].as_i64().unwrap_or(0);
            assert_eq!(failures, 0, "call {n}: {h:#}");
        }
        let last = script.headers(3);
        assert_eq!(last["x-acquired-count"], 2, "{last:#}");
    } else {
        assert_eq!(ids.len(), 2, "two handled before the limit: {ids:?}");
        assert_eq!(dlq.len(), 1, "the third dead-lettered by the broker");
        let mut all: Vec<&str> = ids.clone();
        all.push(dlq[0].properties.message_id().as_ref().unwrap().as_str());
        all.sort();
        assert_eq!(all, ["m1", "m2", "m3"]);
        let deaths = death_reasons(&dlq[0]);
        assert_eq!(deaths, ["delivery_limit"], "on {version:?}");
    }
    assert_eq!(f.broker.message_count(&f.pipe.name).await, Some(0));
    assert!(start.elapsed() < Duration::from_secs(90));
}

/// The broker's own counters, without dlqctl: what the worker and the
/// docs rely on, checked on the broker under test. Five rounds each of
/// `basic.reject(requeue)` and of `basic.nack(requeue)` on a quorum queue,
/// then the sixth delivery's headers.
#[tokio::test]
async fn reject_and_nack_requeue_count_as_documented_for_this_version() {
    let b = Broker::connect().await;
    let c = Cleanup::new();
    let version = b.version().await;
    let mut seen = Vec::new();
    for how in ["reject", "nack"] {
        let q = c.name(how);
        b.declare_queue(&q, table(&[("x-queue-type", s("quorum"))]))
            .await;
        publish(&b, "", &q, b"x", with_id(how)).await;
        let ch = b.channel().await;
        for _ in 0..5 {
            let d = get_within(&ch, &q).await;
            if how == "reject" {
                d.acker
                    .reject(BasicRejectOptions { requeue: true })
                    .await
                    .expect("reject");
            } else {
                d.acker
                    .nack(BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    })
                    .await
                    .expect("nack");
            }
        }
        let d = get_within(&ch, &q).await;
        seen.push((
            how,
            header_int_or(&d, "x-delivery-count"),
            header_int_or(&d, "x-acquired-count"),
        ));
        let _ = d.acker.ack(Default::default()).await;
    }
    let want = if version >= (4, 3) {
        // 4.3: failures only; every hand-off in x-acquired-count.
        [("reject", 5, 5), ("nack", 0, 5)]
    } else {
        // Up to 4.2: every requeue; no x-acquired-count.
        [("reject", 5, 0), ("nack", 5, 0)]
    };
    assert_eq!(seen, want, "on RabbitMQ {version:?}");
}

/// Gets one message from `q` on `ch`, unacked, waiting up to 10 s for one
/// to be ready again.
async fn get_within(ch: &lapin::Channel, q: &str) -> lapin::message::BasicGetMessage {
    let start = Instant::now();
    loop {
        let got = ch
            .basic_get(q.into(), BasicGetOptions { no_ack: false })
            .await
            .expect("basic.get");
        if let Some(d) = got {
            return d;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no message in {q}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An integer header, 0 when absent.
fn header_int_or(d: &lapin::message::Delivery, key: &str) -> i64 {
    match header(d, key) {
        Some(_) => header_int(d, key),
        None => 0,
    }
}

/// The `reason`s of a message's `x-death` entries, newest first.
fn death_reasons(d: &lapin::message::Delivery) -> Vec<String> {
    let Some(lapin::types::AMQPValue::FieldArray(entries)) = header(d, "x-death") else {
        return Vec::new();
    };
    entries
        .as_slice()
        .iter()
        .filter_map(|e| match e {
            lapin::types::AMQPValue::FieldTable(t) => match t.inner().get("reason") {
                Some(lapin::types::AMQPValue::LongString(r)) => Some(r.to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}
