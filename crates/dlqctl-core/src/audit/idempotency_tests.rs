use super::*;

const DAY: u64 = 86_400_000;

fn facts(store: &str, sqlite: bool, reading: StoreReading) -> IdempotencyFacts {
    IdempotencyFacts {
        block: Idempotency::default(),
        store: store.into(),
        sqlite,
        reading,
    }
}

#[test]
fn the_store_passes_when_it_answers_warns_before_its_file_exists_and_fails_otherwise() {
    let Judged {
        level,
        subject,
        message,
    } = store_check(&facts("redis://cache:6379/0", false, StoreReading::Answers));
    assert_eq!(
        (level, subject.as_str()),
        (Level::Pass, "idempotency store")
    );
    assert!(
        message.starts_with("redis://cache:6379/0 answers"),
        "{message}"
    );

    let Judged { level, message, .. } = store_check(&facts(
        "sqlite:/var/lib/dlqctl/orders.db",
        true,
        StoreReading::NotCreated,
    ));
    assert_eq!(level, Level::Warn);
    assert!(
        message.contains("sqlite:/var/lib/dlqctl/orders.db does not exist yet")
            && message.contains("created by dlqctl work")
            && message.contains("doctor never creates it"),
        "{message}"
    );

    let Judged { level, message, .. } = store_check(&facts(
        "sqlite:/nowhere/orders.db",
        true,
        StoreReading::NoDirectory,
    ));
    assert_eq!(level, Level::Fail);
    assert!(message.contains("directory does not exist"), "{message}");

    let refused = "idempotency store redis://:***@cache:6379/0 refused: WRONGPASS";
    let Judged { level, message, .. } = store_check(&facts(
        "redis://:***@cache:6379/0",
        false,
        StoreReading::Failed(refused.into()),
    ));
    assert_eq!(level, Level::Fail);
    assert!(
        message.starts_with("redis://:***@cache:6379/0 refused: WRONGPASS: dlqctl work"),
        "{message}"
    );
    assert!(message.contains("exits 1 at start"), "{message}");
}

#[test]
fn keep_shorter_than_an_explicit_dlq_retention_warns() {
    let mut block = Idempotency {
        keep_ms: DAY,
        ..Idempotency::default()
    };
    let Judged {
        level,
        subject,
        message,
    } = keep_check(&block, "orders.dlq", Some(14 * DAY)).unwrap();
    assert_eq!((level, subject.as_str()), (Level::Warn, "idempotency keep"));
    assert_eq!(
        message,
        "keep 1d is shorter than dead_letter.ttl 14d of orders.dlq: a copy replayed from the \
         DLQ more than 1d after its original was handled runs again; raise idempotency.keep to \
         14d or more"
    );
    // Equal is enough.
    block.keep_ms = 14 * DAY;
    let Judged { level, message, .. } = keep_check(&block, "orders.dlq", Some(14 * DAY)).unwrap();
    assert_eq!(level, Level::Pass);
    assert_eq!(message, "keep 14d covers dead_letter.ttl 14d of orders.dlq");
    // No retention: nothing to compare.
    assert_eq!(keep_check(&block, "orders.dlq", None), None);
}

#[test]
fn an_sqlite_store_warns_when_consumers_come_from_several_hosts() {
    let sqlite = facts(
        "sqlite:/var/lib/dlqctl/orders.db",
        true,
        StoreReading::Answers,
    );
    let hosts = |n: usize| -> Vec<String> { (1..=n).map(|i| format!("10.0.0.{i}")).collect() };
    assert_eq!(hosts_check(&sqlite, "orders", &hosts(0)), None);
    assert_eq!(hosts_check(&sqlite, "orders", &hosts(1)), None);
    let Judged {
        level,
        subject,
        message,
    } = hosts_check(&sqlite, "orders", &hosts(2)).unwrap();
    assert_eq!(
        (level, subject.as_str()),
        (Level::Warn, "idempotency store")
    );
    assert!(
        message.starts_with(
            "the consumers of orders come from 2 hosts (10.0.0.1, 10.0.0.2) but the store is \
             sqlite:/var/lib/dlqctl/orders.db"
        ) && message.contains("use a redis:// store"),
        "{message}"
    );
    let Judged { message, .. } = hosts_check(&sqlite, "orders", &hosts(7)).unwrap();
    assert!(
        message.contains("7 hosts (10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4, 10.0.0.5 and 2 more)"),
        "{message}"
    );
    // Redis is shared by every machine.
    let redis = facts("redis://cache:6379/0", false, StoreReading::Answers);
    assert_eq!(hosts_check(&redis, "orders", &hosts(3)), None);
}

const PAGE: &str = "\
# HELP dlqctl_duplicates Deliveries acked without the handler: their idempotency key was marked handled.
# TYPE dlqctl_duplicates counter
dlqctl_duplicates_total{queue=\"orders\"} 12
dlqctl_duplicates_total{queue=\"pay\\\"ments\"} 1
dlqctl_duplicates_total{queue=\"refunds\"} 0
# HELP dlqctl_deferrals Deliveries deferred to a retry tier: another run held the lease on their idempotency key.
# TYPE dlqctl_deferrals counter
dlqctl_deferrals_total{queue=\"orders\"} 3
dlqctl_deferrals_created{queue=\"orders\"} 1765098600.5
dlqctl_deferrals_total{queue=\"odd\"} -1
dlqctl_decisions_total{queue=\"shipping\",decision=\"duplicate\"} 9
# EOF
";

#[test]
fn duplicates_and_deferrals_are_read_per_pipeline_from_a_metrics_page() {
    assert_eq!(
        idempotency_from_metrics(PAGE, "orders"),
        Some(IdempotencyCounts {
            duplicates: 12,
            deferrals: 3
        })
    );
    // A label value with a quote, escaped on the page; a missing counter
    // counts 0 when the other is there.
    assert_eq!(
        idempotency_from_metrics(PAGE, "pay\"ments"),
        Some(IdempotencyCounts {
            duplicates: 1,
            deferrals: 0
        })
    );
    assert_eq!(
        idempotency_from_metrics(PAGE, "refunds"),
        Some(IdempotencyCounts::default())
    );
    // Neither counter: no guard (or an older worker); another metric of
    // the pipeline does not count; a negative value is not read.
    assert_eq!(idempotency_from_metrics(PAGE, "shipping"), None);
    assert_eq!(idempotency_from_metrics(PAGE, "odd"), None);
    assert_eq!(idempotency_from_metrics(PAGE, "order"), None);
    assert_eq!(idempotency_from_metrics("", "orders"), None);

    let mut sum = IdempotencyCounts {
        duplicates: 1,
        deferrals: 0,
    };
    sum.add(IdempotencyCounts {
        duplicates: 2,
        deferrals: 1,
    });
    assert_eq!(sum.describe(), "3 duplicates skipped, 1 deferral");
    assert_eq!(
        IdempotencyCounts {
            duplicates: 1,
            deferrals: 2
        }
        .describe(),
        "1 duplicate skipped, 2 deferrals"
    );
}

fn topology(yaml: &str) -> Topology {
    crate::topology::parse_topology(yaml, "t.yaml").expect("a topology")
}

#[test]
fn validate_warns_on_a_password_in_the_file_without_printing_it() {
    let t = topology(
        "version: 1\npipelines:\n  - name: a\n    idempotency: {store: 'redis://:s3cret@cache:6379/0'}\n  - name: b\n    idempotency: {store: 'rediss://user:s3cret@cache:6380/1'}\n  - name: c\n    idempotency: {store: 'env:STORE'}\n  - name: d\n    idempotency: {store: 'redis://cache:6379/0'}\n  - name: e\n    idempotency: {store: 'sqlite:/var/lib/x.db'}\n  - name: f\n",
    );
    let w = topology_warnings(&t);
    assert_eq!(w.len(), 2, "{w:?}");
    assert_eq!(w[0].0, 3);
    assert!(
        w[0].1.starts_with(
            "warning: pipeline a: idempotency.store redis://:***@cache:6379/0 has its password \
             written in the topology file"
        ) && w[0].1.contains("`store: env:NAME`"),
        "{}",
        w[0].1
    );
    assert_eq!(w[1].0, 5);
    assert!(
        w[1].1.contains("rediss://user:***@cache:6380/1"),
        "{}",
        w[1].1
    );
    assert!(w.iter().all(|(_, m)| !m.contains("s3cret")), "{w:?}");
}

#[test]
fn validate_says_body_sha256_treats_identical_bodies_as_one_message() {
    let t = topology(
        "version: 1\ndefaults:\n  idempotency: {key: body_sha256, keep: 1d}\npipelines:\n  - name: a\n  - name: b\n    idempotency: {key: message_id}\n",
    );
    let w = topology_warnings(&t);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].0, 5);
    assert_eq!(
        w[0].1,
        "note: pipeline a: idempotency.key body_sha256 treats identical bodies as one message: \
         a second message with the same body, within keep 1d, is acked as a duplicate without \
         running the handler; use message_id or header:NAME when two messages may carry the \
         same body"
    );
}
