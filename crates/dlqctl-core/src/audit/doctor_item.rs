//! What `dlqctl doctor`'s checklist is made of: items, each in a part of
//! the checklist, with how it came out (see [`crate::audit::doctor`]).

/// How an item came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// As the topology wants.
    Pass,
    /// Could not be checked (the sentence says why).
    Skip,
    /// Works, but deserves a look.
    Warn,
    /// The broker will not do what the topology asks.
    Fail,
}

impl Level {
    /// `pass`, `skip`, `warn`, `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Pass => "pass",
            Level::Skip => "skip",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// The part of the checklist an item belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Area {
    /// Version and management API.
    Broker,
    /// The planned exchanges and queues exist.
    Objects,
    /// Policies and operator policies.
    Policies,
    /// Retention, timeouts, sizes.
    Limits,
    /// Members, held messages, bindings, consumers, depth.
    Health,
    /// What the connecting user may run.
    Permissions,
    /// The idempotency store of a pipeline with `idempotency`.
    Idempotency,
}

impl Area {
    /// `broker`, `objects`, `policies`, `limits`, `health`, `permissions`.
    pub fn as_str(self) -> &'static str {
        match self {
            Area::Broker => "broker",
            Area::Objects => "objects",
            Area::Policies => "policies",
            Area::Limits => "limits",
            Area::Health => "health",
            Area::Permissions => "permissions",
            Area::Idempotency => "idempotency",
        }
    }
}

/// One item of the checklist.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Check {
    /// The pipeline it is about; `None` for the broker itself.
    pub pipeline: Option<String>,
    /// Its part of the checklist.
    pub area: Area,
    /// How it came out.
    pub level: Level,
    /// What was checked, in a few words (`queue orders.dlq`, `version`).
    pub subject: String,
    /// What was found, and what to do when it is not a pass.
    pub message: String,
}

/// An item as a check of one part of the checklist finds it, before the
/// checklist says which pipeline it is about ([`Item::of`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// Its part of the checklist.
    pub area: Area,
    /// How it came out.
    pub level: Level,
    /// What was checked, in a few words.
    pub subject: String,
    /// What was found, and what to do when it is not a pass.
    pub message: String,
}

impl Item {
    /// The item of the checklist, about `pipeline` (`None`: the broker).
    pub fn of(self, pipeline: Option<&str>) -> Check {
        Check {
            pipeline: pipeline.map(str::to_string),
            area: self.area,
            level: self.level,
            subject: self.subject,
            message: self.message,
        }
    }
}

/// `s` after a count other than 1.
pub(super) fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
