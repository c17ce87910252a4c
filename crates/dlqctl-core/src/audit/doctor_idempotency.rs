//! Doctor's items on a pipeline's idempotency store: it answers, its
//! `keep` against the DLQ's retention, an SQLite store while consumers
//! come from several hosts ([`crate::audit::idempotency`]).

use crate::audit::doctor_item::{Area, Item, Level};
use crate::audit::doctor_limits::int_arg;
use crate::audit::doctor_snapshot::Snapshot;
use crate::audit::idempotency::{self, hosts_check, keep_check, store_check, Judged};
use crate::topology::plan::{QueueSpec, Role};

/// The pipeline's idempotency store, its `keep` against the DLQ's
/// retention (the `x-message-ttl` its `dead_letter.ttl` sets), and the
/// hosts its consumers come from.
pub(super) fn idempotency_checks(queues: &[&QueueSpec], s: &Snapshot, p: &str) -> Vec<Item> {
    let Some(f) = s.idempotency.get(p) else {
        return Vec::new();
    };
    let mut out = vec![store_check(f)];
    if let Some(dlq) = queues.iter().find(|q| q.role == Role::DeadLetterQueue) {
        let ttl = int_arg(dlq, "x-message-ttl").map(|ms| ms.max(0) as u64);
        out.extend(keep_check(&f.block, &dlq.name, ttl));
    }
    if let Some(main) = queues.iter().find(|q| q.role == Role::MainQueue) {
        if let Some(hosts) = s.consumer_hosts.get(&main.name) {
            out.extend(hosts_check(f, &main.name, hosts));
        }
    }
    out.into_iter()
        .map(
            |Judged {
                 level,
                 subject,
                 message,
             }| Item {
                area: Area::Idempotency,
                level: match level {
                    idempotency::Level::Pass => Level::Pass,
                    idempotency::Level::Warn => Level::Warn,
                    idempotency::Level::Fail => Level::Fail,
                },
                subject,
                message,
            },
        )
        .collect()
}
