//! Several broker addresses: commands use the first that answers, and a
//! worker whose connection is lost moves on to the next address. The
//! addresses are relays to the one local broker, so that a test can take
//! one path away (see `relay`); the cluster tests kill real nodes.

use crate::support::relay::Relay;
use crate::support::script::Script;
use crate::support::worker::*;
use crate::support::{amqp_url, Cleanup, Dlqctl, Scratch};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn broker_addr() -> SocketAddr {
    let url = dlqctl::amqp::connection::BrokerUrl::parse(&amqp_url()).expect("AMQP_URL");
    let endpoint = url.endpoint().replace("localhost", "127.0.0.1");
    endpoint.parse().expect("the test broker's host:port")
}

/// Nothing listens on port 1 of the loopback: refused at once.
const DEAD: &str = "amqp://guest:guest@127.0.0.1:1/%2f";

#[tokio::test]
async fn commands_use_the_first_address_that_answers() {
    let cleanup = Cleanup::new();
    let scratch = Scratch::new();
    let pipe = Pipe::new(&cleanup, &[100], 2);
    let file = pipe.write(&scratch);
    let f = file.to_str().unwrap();
    let real = amqp_url();
    // Repeated --url, and a comma-separated list.
    let run = Dlqctl::new("provision")
        .args([f, "--url", DEAD, "--url", &real])
        .run()
        .await;
    run.assert_code(0);
    let list = format!("{DEAD},{real}");
    let run = Dlqctl::new("provision")
        .args([f, "--check", "--url", &list])
        .run()
        .await;
    run.assert_code(0);
    let run = Dlqctl::new("status")
        .args([f, "--url", DEAD, "--url", &real])
        .run()
        .await;
    run.assert_code(0);
    let run = Dlqctl::new("dlq")
        .args(["peek", f, "--queue", &pipe.name, "--url", &list])
        .run()
        .await;
    run.assert_code(0);
    // None answers: exit 1, naming each address and why.
    let run = Dlqctl::new("status")
        .args([
            f,
            "--url",
            DEAD,
            "--url",
            "amqp://guest:guest@127.0.0.1:2/%2f",
        ])
        .run()
        .await;
    run.assert_code(1);
    assert!(
        run.stderr.contains("cannot connect to RabbitMQ at 127.0.0.1:1, 127.0.0.1:2: no address answered (127.0.0.1:1: connection refused"),
        "{}",
        run.stderr
    );
    drop(scratch);
    drop(cleanup);
}

/// A provisioned pipeline and a worker (concurrency 4, `exit 0` handler)
/// reaching the broker through two relays, `?QUERY` on both URLs; 20
/// messages `a0..a19` already published.
struct Relayed {
    w: WorkerProc,
    r1: Relay,
    r2: Relay,
    base: PipeFixture,
}

impl Relayed {
    async fn start(query: &str) -> Relayed {
        let base = PipeFixture::new(&[100], 2, |_| {}).await;
        let file = base.pipe.provision(&base.scratch).await;
        let (r1, r2) = (
            Relay::start(broker_addr()).await,
            Relay::start(broker_addr()).await,
        );
        let script = Script::new(&base.scratch, "h", "exit 0");
        let (u1, u2) = (
            format!("{}{query}", r1.url()),
            format!("{}{query}", r2.url()),
        );
        let mut w = WorkerProc::with_script(
            &file,
            &base.pipe.name,
            &script,
            &["--url", &u1, "--url", &u2, "--concurrency", "4"],
        );
        w.wait_consuming().await;
        let f = Relayed { w, r1, r2, base };
        f.publish("a").await;
        f
    }

    /// Publishes `PREFIX0..PREFIX19`.
    async fn publish(&self, prefix: &str) {
        for n in 0..20 {
            publish(
                &self.base.broker,
                "",
                &self.base.pipe.name,
                b"x",
                with_id(&format!("{prefix}{n}")),
            )
            .await;
        }
    }
}

/// The worker's address goes away mid-run (every connection dropped, the
/// port closed): it reconnects through the next address within seconds,
/// logs the switch once, and every message is handled once.
#[tokio::test]
async fn the_worker_moves_to_the_next_address_when_its_own_goes_away() {
    let mut f = Relayed::start("").await;
    f.w.wait_decisions(20, Duration::from_secs(30)).await;
    let cut = Instant::now();
    f.r1.close();
    let switched =
        f.w.wait_event("switched broker address", 1, Duration::from_secs(10))
            .await;
    let took = cut.elapsed();
    assert!(took < Duration::from_secs(10), "switched after {took:?}");
    assert_eq!(
        switched[0]["to"].as_str(),
        Some(f.r2.addr.to_string().as_str())
    );
    f.publish("b").await;
    let d = f.w.wait_decisions(40, Duration::from_secs(30)).await;
    let mut ids: Vec<&str> = d
        .iter()
        .map(|e| e["message_id"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 40, "every message handled: {d:#?}");
    assert!(d.iter().all(|e| e["decision"] == "ack"));
    assert_eq!(f.w.events("switched broker address").len(), 1);
    f.w.stop().await;
    assert_empty(&f.base.broker, &f.base.all_queues()).await;
    println!(
        "switched to the next address {:.1} s after the first went away",
        took.as_secs_f64()
    );
}

/// A silent network: the worker's path stops forwarding without closing
/// (no RST, no FIN). With `heartbeat=2` in the URL the worker notices
/// within a few heartbeats, moves to the next address, and no message is
/// lost (those whose acks vanished come back and run again).
#[tokio::test]
async fn a_silent_network_is_noticed_by_the_heartbeat() {
    let mut f = Relayed::start("?heartbeat=2").await;
    f.w.wait_decisions(20, Duration::from_secs(30)).await;
    let cut = Instant::now();
    f.r1.blackhole();
    f.publish("b").await;
    f.w.wait_event("switched broker address", 1, Duration::from_secs(20))
        .await;
    let took = cut.elapsed();
    // Two heartbeat intervals to notice, then the connect and the check.
    assert!(took < Duration::from_secs(12), "noticed after {took:?}");
    let start = Instant::now();
    loop {
        let d = f.w.decisions();
        let mut ids: Vec<&str> = d
            .iter()
            .map(|e| e["message_id"].as_str().unwrap())
            .collect();
        ids.sort();
        ids.dedup();
        if ids.len() == 40 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} of 40 handled:\n{}",
            ids.len(),
            f.w.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    f.w.stop().await;
    // The broker drops the silent connection on its own heartbeat; its
    // unacked messages were handled again through the new one.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut total = 0;
        for q in &f.base.all_queues() {
            total += f.base.broker.message_count(q).await.unwrap_or(0);
        }
        if total == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{total} messages left");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "noticed the silent network and switched in {:.1} s",
        took.as_secs_f64()
    );
}
