//! A worker's settings.

use crate::amqp::brokers::Brokers;
use crate::core::retry::DeadLetterMode;
use crate::core::topology::Pipeline;
use std::time::Duration;

/// The default in-doubt time ([`WorkerConfig::in_doubt`]).
pub const DEFAULT_IN_DOUBT: Duration = Duration::from_secs(600);

/// Settings of a worker.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// The pipeline to consume (its main queue).
    pub pipeline: Pipeline,
    /// The broker addresses, tried in order; on a lost connection the
    /// worker moves on to the next.
    pub brokers: Brokers,
    /// Unacked deliveries the broker may push to this worker. Keep it at
    /// `concurrency` unless handlers are very short: a delivery beyond the
    /// concurrency waits unstarted, and every reconnect or shutdown returns
    /// it to the queue, which on a quorum queue counts toward
    /// `x-delivery-limit` (so a flapping connection could dead-letter
    /// messages no handler saw).
    pub prefetch: u16,
    /// Handler runs at once.
    pub concurrency: usize,
    /// How to dead-letter.
    pub dead_letter: DeadLetterMode,
    /// At shutdown, how long in-flight handlers may take.
    pub grace: Duration,
    /// How long to wait for a publisher confirm before counting the copy
    /// as refused.
    pub confirm_timeout: Duration,
    /// Publishing channels, each with many copies in flight (at most
    /// `concurrency` are used).
    pub publish_channels: usize,
    /// The largest pause between two tries of a refused publish.
    pub max_publish_backoff: Duration,
    /// The largest pause between two reconnection attempts.
    pub max_reconnect_backoff: Duration,
    /// Run the pipeline's automatic redrive policy (`dead_letter.redrive`)
    /// on its timer, when it has one (`dlqctl work --no-redrive`: off).
    pub redrive: bool,
    /// At start, how long to keep trying to reach the broker before
    /// giving up (0, the default: the first connection must succeed).
    /// Only a broker that does not answer is waited for (nothing
    /// listens, no answer, a name that does not resolve); a refused login
    /// or a missing topology still fails at once.
    pub wait_for_broker: Duration,
    /// The handler timeout, checked against the main queue's consumer
    /// timeout: at start a handler timeout at or above it refuses to
    /// start; while running, every minute, it is logged as an error and
    /// counted (`None`, the default: not checked).
    pub handler_timeout: Option<Duration>,
    /// The management API of each broker address, to read the consumer
    /// timeout (`--management-url`; empty, the default: each address's
    /// host, port 15672).
    pub management_urls: Vec<String>,
    /// The idempotency store, over the pipeline's `idempotency.store`
    /// (`dlqctl work --idempotency-store`; `None`, the default: the
    /// pipeline's). Only used when the pipeline has `idempotency`.
    pub idempotency_store: Option<crate::core::idempotency::StoreSpec>,
    /// How long the lease on a key lasts while its handler runs (renewed
    /// every third of it); `None`, the default: the handler timeout plus
    /// 5 s, at least 10 s (30 s without a handler timeout). A handler
    /// that outlives its lease without renewing it could run twice.
    pub lease: Option<Duration>,
    /// How long a key stays leased "in doubt" after a timeout whose
    /// outcome is unknown (a handler that is not
    /// [cancel-safe](crate::handler::Handler::cancel_safe): an HTTP
    /// request, a `--jsonl` message, an embedded handler), waiting for the
    /// late answer; also the lease such a handler's run takes, so that a
    /// worker killed in the middle leaves its key in doubt. Default 10
    /// minutes (`dlqctl work --in-doubt`).
    pub in_doubt: Duration,
}

impl WorkerConfig {
    /// The lease on a key while its handler runs (see [`Self::lease`]).
    pub fn lease(&self) -> Duration {
        self.lease.unwrap_or_else(|| {
            let timeout = self
                .handler_timeout
                .map_or(25_000, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
            Duration::from_millis(crate::core::idempotency::lease_ms(timeout))
        })
    }
}

impl WorkerConfig {
    /// Defaults for a pipeline: one handler at a time with prefetch 1,
    /// republish dead-letters, 30 s grace, the pipeline's redrive policy
    /// run when it has one.
    pub fn new(pipeline: Pipeline, brokers: impl Into<Brokers>) -> Self {
        WorkerConfig {
            pipeline,
            brokers: brokers.into(),
            prefetch: 1,
            concurrency: 1,
            dead_letter: DeadLetterMode::Republish,
            grace: Duration::from_secs(30),
            confirm_timeout: Duration::from_secs(30),
            publish_channels: 4,
            max_publish_backoff: Duration::from_secs(5),
            max_reconnect_backoff: Duration::from_secs(30),
            redrive: true,
            wait_for_broker: Duration::ZERO,
            handler_timeout: None,
            management_urls: Vec::new(),
            idempotency_store: None,
            lease: None,
            in_doubt: DEFAULT_IN_DOUBT,
        }
    }
}
