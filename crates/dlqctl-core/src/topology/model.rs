//! The resolved topology: defaults applied, every rule checked.

use std::collections::BTreeMap;

/// Default delivery limit of quorum main queues.
pub(crate) const DEFAULT_DELIVERY_LIMIT: i64 = 20;
/// Default retry delays when a file gives none.
pub(crate) const DEFAULT_DELAYS: [u64; 3] = [1_000, 10_000, 60_000];
/// Default attempt budget.
pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 4;
/// Default jitter.
pub(crate) const DEFAULT_JITTER: f64 = 0.1;

/// Queue type of a pipeline's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    /// Replicated, at-least-once dead-lettering, delivery limit. The default.
    Quorum,
    /// Classic queues: at-most-once dead-lettering, no delivery limit.
    Classic,
}

impl QueueType {
    /// The value of `x-queue-type`.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        }
    }
}

/// AMQP exchange type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeType {
    /// Routes on an exact key.
    Direct,
    /// Routes on key patterns.
    Topic,
    /// Routes to every bound queue.
    Fanout,
    /// Routes on header values.
    Headers,
}

impl ExchangeType {
    /// The AMQP name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeType::Direct => "direct",
            ExchangeType::Topic => "topic",
            ExchangeType::Fanout => "fanout",
            ExchangeType::Headers => "headers",
        }
    }

    /// Parses the AMQP name of a type.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "direct" => ExchangeType::Direct,
            "topic" => ExchangeType::Topic,
            "fanout" => ExchangeType::Fanout,
            "headers" => ExchangeType::Headers,
            _ => return None,
        })
    }
}

/// A value of an AMQP argument table, restricted to the types dlqctl sends.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum ArgValue {
    /// Sent as a signed 64-bit integer.
    Int(i64),
    /// Sent as a long string.
    Str(String),
    /// Sent as a boolean.
    Bool(bool),
}

impl std::fmt::Display for ArgValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgValue::Int(i) => write!(f, "{i}"),
            ArgValue::Str(s) => write!(f, "{s:?}"),
            ArgValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// An ordered argument table (`x-...` keys to values).
pub type Arguments = BTreeMap<String, ArgValue>;

/// How a pipeline retries: the ordered delay list and the attempt budget.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RetryPolicy {
    /// Delay before retry k (k = 1, 2, ...) is `delays[min(k, len) - 1]`, in
    /// milliseconds. Never empty. May repeat values.
    pub delays: Vec<u64>,
    /// The handler runs at most this often, the first run included (≥ 1).
    pub max_attempts: u32,
    /// Per-message spread inside a tier, 0..=0.5.
    pub jitter: f64,
}

impl RetryPolicy {
    /// The distinct delays, ascending: one retry queue each.
    pub fn tiers(&self) -> Vec<u64> {
        let mut t = self.delays.clone();
        t.sort_unstable();
        t.dedup();
        t
    }
}

/// The producers' exchange of a pipeline.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProducerExchange {
    /// Exchange name.
    pub name: String,
    /// Exchange type.
    #[serde(rename = "type")]
    pub kind: ExchangeType,
    /// Bindings from this exchange to the main queue.
    pub bindings: Vec<Binding>,
}

/// One binding of the producers' exchange to the main queue.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Binding {
    /// Routing key (empty for fanout and headers).
    pub key: String,
    /// Binding arguments (headers exchanges).
    pub arguments: Arguments,
}

/// Where failed messages go and how long they stay.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadLetter {
    /// DLQ name.
    pub queue: String,
    /// Retention (`x-message-ttl`) in ms; `None` keeps messages forever.
    pub ttl: Option<u64>,
    /// Bound on the DLQ's length; when full it refuses, never drops.
    pub max_length: Option<i64>,
    /// Automatic redrive (`dead_letter.redrive`); `None`: off.
    pub redrive: Option<Redrive>,
}

/// Reasons redriven when a policy lists none: `exhausted` only (a
/// `permanent` message would only fail again).
pub(crate) const DEFAULT_REDRIVE_REASONS: [&str; 1] = ["exhausted"];
/// Default `min_age`: 5 minutes in the DLQ first.
pub(crate) const DEFAULT_REDRIVE_MIN_AGE: u64 = 5 * 60_000;
/// Default `max_redrives`.
pub(crate) const DEFAULT_MAX_REDRIVES: u32 = 3;
/// Default `rate`, copies per second.
pub(crate) const DEFAULT_REDRIVE_RATE: f64 = 50.0;
/// Default `canary`.
pub(crate) const DEFAULT_REDRIVE_CANARY: u64 = 5;
/// Default `every`: a look at the DLQ each minute.
pub(crate) const DEFAULT_REDRIVE_EVERY: u64 = 60_000;

/// The automatic redrive policy of a pipeline (`dead_letter.redrive`):
/// which DLQ messages go back to the main queue by themselves, and how
/// often the DLQ is looked at (docs/dlq.md, "Automatic redrive").
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Redrive {
    /// The `dlqctl-reason`s (or broker reasons) redriven; never empty.
    pub reasons: Vec<String>,
    /// A message stays at least this long in the DLQ first, in ms.
    pub min_age: u64,
    /// Automatic redrives per message; past it the message stays for a
    /// person.
    pub max_redrives: u32,
    /// Copies per second at most.
    pub rate: f64,
    /// Messages moved first; the rest follows only when none came back
    /// (0: no canary, everything eligible moves at once).
    pub canary: u64,
    /// How often the DLQ is looked at, in ms (doubled after a failed
    /// canary, up to an hour).
    pub every: u64,
    /// An HTTP URL answering 2xx while the dependency is healthy: `GET`
    /// before each run; anything else and nothing moves.
    pub health: Option<String>,
}

impl Default for Redrive {
    fn default() -> Self {
        Redrive {
            reasons: DEFAULT_REDRIVE_REASONS.map(String::from).to_vec(),
            min_age: DEFAULT_REDRIVE_MIN_AGE,
            max_redrives: DEFAULT_MAX_REDRIVES,
            rate: DEFAULT_REDRIVE_RATE,
            canary: DEFAULT_REDRIVE_CANARY,
            every: DEFAULT_REDRIVE_EVERY,
            health: None,
        }
    }
}

/// Circuit breaker settings of a worker.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CircuitBreaker {
    /// Transient failures / calls over the window at which it opens (0..=1].
    pub failure_rate: f64,
    /// Window length in ms.
    pub window: u64,
    /// Calls in the window before the rate is considered.
    pub min_calls: u32,
    /// How long it stays open, in ms.
    pub open_for: u64,
    /// Probe calls admitted once `open_for` is over (half-open); this many
    /// successes close it, one transient failure opens it again.
    pub half_open_calls: u32,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            failure_rate: 0.5,
            window: 60_000,
            min_calls: 20,
            open_for: 30_000,
            half_open_calls: 1,
        }
    }
}

/// One pipeline: a main queue with its retry tiers and its DLQ.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Pipeline {
    /// The main queue's name.
    pub name: String,
    /// Queue type of every queue of the pipeline.
    pub queue_type: QueueType,
    /// Where producers publish, if dlqctl declares it.
    pub exchange: Option<ProducerExchange>,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Dead-letter queue settings.
    pub dead_letter: DeadLetter,
    /// Quorum only: redeliveries before the broker dead-letters.
    pub delivery_limit: Option<i64>,
    /// Optional circuit breaker for workers.
    pub circuit_breaker: Option<CircuitBreaker>,
    /// Idempotent handling (`idempotency`); `None`: off.
    pub idempotency: Option<crate::idempotency::Idempotency>,
    /// Extra arguments of the main queue (allow-listed).
    pub arguments: Arguments,
    /// The line of the pipeline's `name:` in the topology file (1-based),
    /// to point back at it (`provision --check --format github`); 0 for a
    /// pipeline not read from a file.
    #[serde(skip)]
    pub line: u64,
}

impl Pipeline {
    /// Name of the retry exchange (`NAME.retry`, direct).
    pub fn retry_exchange(&self) -> String {
        format!("{}.retry", self.name)
    }

    /// Name of the queue that keeps the pipeline's shared redrive state
    /// (`NAME.redrive-state`, classic, one message: the wait every worker
    /// of the pipeline follows, and the last runs); declared only for a
    /// pipeline with a redrive policy.
    pub fn redrive_state_queue(&self) -> String {
        format!("{}.redrive-state", self.name)
    }

    /// Name of the dead-letter exchange (`NAME.dlx`, fanout).
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dlx", self.name)
    }

    /// Name of the retry queue for a delay (`NAME.retry.10s`).
    pub fn retry_queue(&self, delay_ms: u64) -> String {
        format!(
            "{}.retry.{}",
            self.name,
            crate::values::duration::tier_name(delay_ms)
        )
    }

    /// Names of every retry queue, in tier order.
    pub fn retry_queues(&self) -> Vec<String> {
        self.retry
            .tiers()
            .into_iter()
            .map(|d| self.retry_queue(d))
            .collect()
    }
}

/// A whole, valid topology file.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Topology {
    /// Pipelines in file order.
    pub pipelines: Vec<Pipeline>,
}

impl Topology {
    /// The pipeline whose main queue is `name`.
    pub fn pipeline(&self, name: &str) -> Option<&Pipeline> {
        self.pipelines.iter().find(|p| p.name == name)
    }
}
