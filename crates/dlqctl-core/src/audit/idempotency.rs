//! Idempotent handling as `doctor`, `status` and `validate` see it
//! (docs/worker.md, "Idempotent handling"). Pure: the shell opens the
//! store, lists the consumers and fetches the worker's metrics page.
//!
//! - `store_check`: what the store answered to doctor's
//!   `dlqctl-doctor:` key (a store refused or unreachable fails; an SQLite
//!   file not created yet warns).
//! - `keep_check`: `keep` shorter than an explicit `dead_letter.ttl`.
//! - `hosts_check`: an SQLite store while consumers come from several
//!   hosts.
//! - [`idempotency_from_metrics`]: duplicates skipped and deferrals, from
//!   a worker's metrics page.
//! - [`topology_warnings`]: what `validate` says of an `idempotency` block.

use crate::idempotency::{redact_url, Idempotency, KeySource, StoreSpec};
use crate::topology::Topology;
use crate::values::duration::tier_name;

/// The counter of deliveries acked without the handler (a key marked
/// handled), per pipeline.
pub(crate) const DUPLICATES_METRIC: &str = "dlqctl_duplicates_total";
/// The counter of deliveries deferred to a tier (a key leased by another
/// run), per pipeline.
pub(crate) const DEFERRALS_METRIC: &str = "dlqctl_deferrals_total";

/// What doctor's check of a pipeline's store found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreReading {
    /// The store wrote, read back and deleted a `dlqctl-doctor:` key.
    Answers,
    /// The SQLite file does not exist yet: `dlqctl work` creates it (in a
    /// directory that exists, or the default one it creates).
    NotCreated,
    /// The SQLite file's directory does not exist, and it is not the
    /// default one: `dlqctl work` refuses to start.
    NoDirectory,
    /// Refused or unreachable: the store's error, which never holds a
    /// password.
    Failed(String),
}

/// One pipeline's `idempotency` block and what its store answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyFacts {
    /// The block, as the topology says it.
    pub block: Idempotency,
    /// The store as output may show it: `sqlite:/var/lib/dlqctl/orders.db`,
    /// `redis://:***@cache:6379/0` (never a password).
    pub store: String,
    /// Whether the store is an SQLite file (after `env:` was read).
    pub sqlite: bool,
    /// What it answered.
    pub reading: StoreReading,
}

/// How an item came out (doctor's `pass`, `warn`, `fail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// As it should be.
    Pass,
    /// Works, but deserves a look.
    Warn,
    /// The worker will not work as the topology asks.
    Fail,
}

/// An item of the checklist before the doctor adds its area and
/// pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Judged {
    /// How it came out.
    pub level: Level,
    /// What was checked (`idempotency store`, `idempotency keep`).
    pub subject: String,
    /// What was found, and what to do when it is not a pass.
    pub message: String,
}

/// The store's item.
pub(crate) fn store_check(f: &IdempotencyFacts) -> Judged {
    let subject = "idempotency store".to_string();
    match &f.reading {
        StoreReading::Answers => Judged {
            level: Level::Pass,
            subject,
            message: format!(
                "{} answers (a dlqctl-doctor: key written, read back and deleted)",
                f.store
            ),
        },
        StoreReading::NotCreated => Judged {
            level: Level::Warn,
            subject,
            message: format!(
                "{} does not exist yet: it is created by dlqctl work when it starts (doctor \
                 never creates it); until then nothing is remembered",
                f.store
            ),
        },
        StoreReading::NoDirectory => Judged {
            level: Level::Fail,
            subject,
            message: format!(
                "{}: its directory does not exist, and dlqctl work refuses to start; create \
                 the directory, writable by the worker's user",
                f.store
            ),
        },
        StoreReading::Failed(why) => Judged {
            level: Level::Fail,
            subject,
            message: format!(
                "{}: dlqctl work exits 1 at start on a refused store and waits for an \
                 unreachable one, and a running worker pauses consumption until it answers",
                // The subject already says what it is.
                why.strip_prefix("idempotency store ").unwrap_or(why)
            ),
        },
    }
}

/// `keep` against an explicit DLQ retention (`dlq_ttl_ms`): a copy
/// replayed from the DLQ after `keep` has passed since its original was
/// handled finds no mark and runs again. `None` without a retention
/// (messages stay until a person removes them: no bound to compare).
pub(crate) fn keep_check(
    block: &Idempotency,
    dlq: &str,
    dlq_ttl_ms: Option<u64>,
) -> Option<Judged> {
    let ttl = dlq_ttl_ms?;
    let subject = "idempotency keep".to_string();
    let keep = tier_name(block.keep_ms);
    Some(if block.keep_ms < ttl {
        Judged {
            level: Level::Warn,
            subject,
            message: format!(
                "keep {keep} is shorter than dead_letter.ttl {} of {dlq}: a copy replayed from \
                 the DLQ more than {keep} after its original was handled runs again; raise \
                 idempotency.keep to {} or more",
                tier_name(ttl),
                tier_name(ttl)
            ),
        }
    } else {
        Judged {
            level: Level::Pass,
            subject,
            message: format!(
                "keep {keep} covers dead_letter.ttl {} of {dlq}",
                tier_name(ttl)
            ),
        }
    })
}

/// An SQLite store while the main queue's consumers connect from several
/// `hosts` (their `peer_host`, as the management API lists them): one
/// file per machine, so leases and marks are not shared and a message can
/// run once on each. `None` with a Redis store, or fewer than two hosts.
pub(crate) fn hosts_check(f: &IdempotencyFacts, queue: &str, hosts: &[String]) -> Option<Judged> {
    if !f.sqlite || hosts.len() < 2 {
        return None;
    }
    let shown: Vec<&str> = hosts.iter().take(5).map(String::as_str).collect();
    let more = match hosts.len() {
        n if n > 5 => format!(" and {} more", n - 5),
        _ => String::new(),
    };
    Some(Judged {
        level: Level::Warn,
        subject: "idempotency store".to_string(),
        message: format!(
            "the consumers of {queue} come from {} hosts ({}{more}) but the store is {}, a \
             file of one machine: the workers of other machines neither see its leases nor \
             its marks, so a message can run once on each; use a redis:// store (store: \
             env:NAME) for workers on several machines",
            hosts.len(),
            shown.join(", "),
            f.store
        ),
    })
}

/// Duplicates skipped and deferrals of one pipeline, from workers'
/// metrics pages (summed over the pages read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IdempotencyCounts {
    /// Deliveries acked without the handler: their key was marked handled
    /// (`dlqctl_duplicates_total`).
    pub duplicates: u64,
    /// Deliveries deferred to a tier: another run held their key's lease
    /// (`dlqctl_deferrals_total`).
    pub deferrals: u64,
}

impl IdempotencyCounts {
    /// Adds another worker's counts.
    pub fn add(&mut self, other: IdempotencyCounts) {
        self.duplicates = self.duplicates.saturating_add(other.duplicates);
        self.deferrals = self.deferrals.saturating_add(other.deferrals);
    }

    /// `3 duplicates skipped, 1 deferral`.
    pub fn describe(&self) -> String {
        format!(
            "{} skipped, {}",
            crate::values::text::count(self.duplicates, "duplicate"),
            crate::values::text::count(self.deferrals, "deferral")
        )
    }
}

/// `pipeline`'s duplicates and deferrals on a worker's metrics page
/// `text`; `None` when the page has neither counter for it (no
/// `idempotency` on the pipeline, or a worker older than this dlqctl).
/// A counter the page lacks while it has the other counts 0.
pub fn idempotency_from_metrics(text: &str, pipeline: &str) -> Option<IdempotencyCounts> {
    use crate::audit::circuit::sample;
    let count = |metric: &str| {
        sample(text, metric, pipeline)
            .filter(|v| *v >= 0.0)
            .map(|v| v.min(u64::MAX as f64) as u64)
    };
    let duplicates = count(DUPLICATES_METRIC);
    let deferrals = count(DEFERRALS_METRIC);
    if duplicates.is_none() && deferrals.is_none() {
        return None;
    }
    Some(IdempotencyCounts {
        duplicates: duplicates.unwrap_or(0),
        deferrals: deferrals.unwrap_or(0),
    })
}

/// What `validate` says of the topology's `idempotency` blocks: the line
/// of the pipeline and the sentence, for a password written in the file
/// (shown as `***`) and for `key: body_sha256`. Never an error: the
/// file is valid.
pub fn topology_warnings(t: &Topology) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for p in &t.pipelines {
        let Some(block) = &p.idempotency else {
            continue;
        };
        if let StoreSpec::Redis(url) = &block.store {
            if block.store.has_inline_password() {
                out.push((
                    p.line,
                    format!(
                        "warning: pipeline {}: idempotency.store {} has its password written \
                         in the topology file, where everyone who reads the file reads it; \
                         put the URL in an environment variable (a Secret, a 0600 env file) \
                         and write `store: env:NAME`",
                        p.name,
                        redact_url(url)
                    ),
                ));
            }
        }
        if block.key == KeySource::BodySha256 {
            out.push((
                p.line,
                format!(
                    "note: pipeline {}: idempotency.key body_sha256 treats identical bodies as \
                     one message: a second message with the same body, within keep {}, is acked \
                     as a duplicate without running the handler; use message_id or header:NAME \
                     when two messages may carry the same body",
                    p.name,
                    tier_name(block.keep_ms)
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
#[path = "idempotency_tests.rs"]
mod tests;
