//! What `dlqctl doctor` reads from the broker, the worker and the command
//! line before it judges ([`crate::audit::doctor`]): the shell
//! gathers it, the checklist reads it.

use crate::audit::circuit::CircuitReading;
use crate::audit::idempotency::IdempotencyFacts;
use crate::audit::permissions::UserPermissions;
use crate::audit::policy::AppliedPolicies;
use crate::dlq::redrive_state::RedriveState;
use std::collections::HashMap;

/// Whether the management API answered, and for which broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManagementState {
    /// It answers, for the broker the AMQP connection reached.
    Answers,
    /// It does not answer (why).
    Unreachable(String),
    /// It answers for another broker (what it said).
    OtherBroker(String),
}

/// What the broker says of one planned queue that exists.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueFacts {
    /// Ready messages (a passive declare over AMQP, fresh).
    pub ready: u64,
    /// Consumers (a passive declare over AMQP, fresh).
    pub consumers: u64,
    /// Ready plus unacked, from the management API.
    pub messages: Option<u64>,
    /// Its type as the broker reports it (`quorum`, `classic`).
    pub kind: Option<String>,
    /// The policies that apply; `None` when unknown.
    pub policies: Option<AppliedPolicies>,
    /// `messages_dlx` at each sample, oldest first; empty when unknown.
    pub messages_dlx: Vec<u64>,
    /// A quorum queue's members online and in all, when known.
    pub members: Option<(usize, usize)>,
}

impl QueueFacts {
    /// What a passive declare tells of a queue: its `ready` messages and
    /// `consumers`; what the management API tells is still unknown.
    pub fn declared(ready: u64, consumers: u64) -> QueueFacts {
        QueueFacts {
            ready,
            consumers,
            messages: None,
            kind: None,
            policies: None,
            messages_dlx: Vec::new(),
            members: None,
        }
    }
}

/// The handler timeout of the pipeline's workers, and where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerTimeout {
    /// The timeout in milliseconds.
    pub ms: u64,
    /// `--handler-timeout`, or the metrics URL.
    pub source: String,
}

/// Why doctor does not know the user's permissions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PermissionsUnknown {
    /// No management API answered.
    #[error("the management API does not answer for this broker")]
    NoManagement,
    /// The user has no permissions entry in the vhost.
    #[error("user {0} has no permissions in this virtual host")]
    NoneInVhost(String),
    /// The management API refused or failed the request.
    #[error("{0}")]
    Refused(String),
}

/// Everything doctor reads from the broker, the worker and the command
/// line, for one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// `rabbitmq_version` from the management API, when it answered.
    pub version: Option<String>,
    /// The management API's state.
    pub management: ManagementState,
    /// The user of the AMQP connection.
    pub user: String,
    /// The user's permissions in the vhost, or why they are unknown.
    pub permissions: Result<UserPermissions, PermissionsUnknown>,
    /// Exchanges of the plan that do not exist.
    pub missing_exchanges: Vec<String>,
    /// Every planned queue, by name: what the broker says of it, `None`
    /// when it does not exist (see [`Snapshot::queue`]).
    pub queues: HashMap<String, Option<QueueFacts>>,
    /// Per pipeline: whether its DLX is bound to its DLQ (`None`: unknown).
    pub dlx_bound: HashMap<String, Option<bool>>,
    /// The seconds between the two samples of `messages_dlx`.
    pub sample_gap_s: u64,
    /// The handler timeout per pipeline, when given or read.
    pub handler_timeout: HashMap<String, HandlerTimeout>,
    /// `--max-dlq`.
    pub max_dlq: Option<u64>,
    /// Why the handler timeout could not be read from a worker's metrics.
    pub handler_timeout_error: Option<String>,
    /// Per pipeline: its circuit breaker, as a worker's metrics page shows
    /// it (only pipelines the page has a breaker for).
    pub circuit: HashMap<String, CircuitReading>,
    /// Set when the policies were read from the queues' own, possibly
    /// older, fields because their definitions could not be: the warning.
    pub policies_from_queue_view: Option<String>,
    /// Per pipeline with a redrive policy: its shared redrive state
    /// (`Ok(None)`: no run yet), or why it could not be read.
    pub redrive: HashMap<String, Result<Option<RedriveState>, String>>,
    /// When the snapshot was taken, ms since the Unix epoch.
    pub now_ms: u64,
    /// Per pipeline with `idempotency`: its block and what its store
    /// answered.
    pub idempotency: HashMap<String, IdempotencyFacts>,
    /// Per queue: the distinct hosts its consumers connect from
    /// (`peer_host`, management API), sorted; absent when unknown.
    pub consumer_hosts: HashMap<String, Vec<String>>,
}

impl Snapshot {
    /// What the broker says of the queue `name`: `None` when it does not
    /// exist (or is not planned).
    pub fn queue(&self, name: &str) -> Option<&QueueFacts> {
        self.queues.get(name).and_then(Option::as_ref)
    }

    /// As [`Snapshot::queue`], to fill in.
    pub fn queue_mut(&mut self, name: &str) -> Option<&mut QueueFacts> {
        self.queues.get_mut(name).and_then(Option::as_mut)
    }
}
