//! The queue's consumer timeout against the worker's handler timeout: the
//! rule `dlqctl work` applies at start (and every minute while it runs)
//! and `dlqctl doctor` judges. Pure: the shell reads the facts (the
//! broker's version, the queue's type, argument and policies).
//!
//! What the broker does (docs/production.md, "The consumer timeout"):
//!
//! - Up to 3.11.14 (3.10 included): one `consumer_timeout` for the whole
//!   broker, set in `rabbitmq.conf` (30 minutes by default); no policy
//!   key or queue argument.
//! - 3.11.15 up to 4.2: also per queue, the policy key `consumer-timeout`
//!   and the queue argument `x-consumer-timeout` (the lower of the two
//!   applies). A delivery left unacked longer closes its channel.
//! - 4.3 and later: the queue itself keeps the timeout, and only quorum
//!   queues have one; the broker cancels the consumer (`basic.cancel`)
//!   and requeues the message. Classic queues have none.
//!
//! In every case the message returns to the queue while its handler may
//! still run: the next consumer runs it again. A value changed in
//! `rabbitmq.conf` cannot be read through the management API: without a
//! policy or argument the default of 30 minutes is assumed.

use crate::audit::policy::AppliedPolicies;
use crate::values::duration::tier_name;

/// RabbitMQ's default `consumer_timeout` (30 minutes).
pub(crate) const DEFAULT_CONSUMER_TIMEOUT_MS: u64 = 30 * 60_000;

/// The policy key.
pub(crate) const POLICY_KEY: &str = "consumer-timeout";
/// The queue argument.
pub const ARGUMENT: &str = "x-consumer-timeout";

/// How a broker version keeps consumer timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// Up to 3.11.14: one broker-wide value; the channel is closed.
    BrokerWide,
    /// 3.11.15 up to 4.2: per queue too (policy, argument); the channel
    /// is closed. Also assumed when the version is unknown.
    Channel,
    /// 4.3 and later: the queue's, quorum queues only; the consumer is
    /// cancelled.
    Queue,
}

impl Model {
    /// The model of `version` (`rabbitmq_version`, `4.3.6`); `Channel`
    /// when it is unknown or does not parse.
    pub fn of_version(version: Option<&str>) -> Model {
        let Some(v) = version.and_then(parse_version) else {
            return Model::Channel;
        };
        if v < (3, 11, 15) {
            Model::BrokerWide
        } else if v < (4, 3, 0) {
            Model::Channel
        } else {
            Model::Queue
        }
    }

    /// Whether a queue policy or argument can set the timeout.
    pub fn per_queue(self) -> bool {
        self != Model::BrokerWide
    }

    /// What the broker does to a delivery left unacked past the timeout.
    pub fn consequence(self) -> &'static str {
        match self {
            Model::BrokerWide | Model::Channel => {
                "the broker closes the channel of a handler still running (RabbitMQ up to 4.2) \
                 and requeues its messages"
            }
            Model::Queue => {
                "the broker cancels the consumer of a handler still running (RabbitMQ 4.3 and \
                 later) and requeues its message"
            }
        }
    }
}

/// `4.3.6` (or `3.10.8+1.g...`) as numbers.
fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some((major, minor, patch))
}

/// What the shell read about the main queue.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    /// The broker's version, when known.
    pub version: Option<&'a str>,
    /// The queue's type (`quorum`, `classic`), when known.
    pub queue_type: Option<&'a str>,
    /// The queue's `x-consumer-timeout` argument, when it has one.
    pub argument: Option<i64>,
    /// The policies that apply to the queue, when known.
    pub policies: Option<&'a AppliedPolicies>,
}

/// Where the timeout comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A policy's `consumer-timeout`, by name.
    Policy(String),
    /// An operator policy's `consumer-timeout`, by name.
    OperatorPolicy(String),
    /// The queue's `x-consumer-timeout` argument.
    Argument,
    /// The broker's default (no policy or argument sets one).
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Policy(n) => write!(f, "the `{POLICY_KEY}` of policy `{n}`"),
            Source::OperatorPolicy(n) => {
                write!(f, "the `{POLICY_KEY}` of operator policy `{n}`")
            }
            Source::Argument => write!(f, "the queue's argument `{ARGUMENT}`"),
            Source::Default => write!(
                f,
                "the broker's default consumer_timeout (a value changed in rabbitmq.conf \
                 cannot be read through the API)"
            ),
        }
    }
}

impl Source {
    /// How to raise the timeout from here.
    pub fn fix(&self) -> &'static str {
        match self {
            Source::Policy(_) => "raise the policy's consumer-timeout",
            Source::OperatorPolicy(_) => "raise the operator policy's consumer-timeout",
            Source::Argument => "raise the queue's x-consumer-timeout",
            Source::Default => "raise consumer_timeout in rabbitmq.conf",
        }
    }
}

/// The consumer timeout of a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerTimeout {
    /// In milliseconds.
    pub ms: u64,
    /// Where it comes from.
    pub source: Source,
    /// How the broker keeps it.
    pub model: Model,
}

/// The consumer timeout that applies to the queue `f` describes; `None`
/// when it has none (a classic queue on 4.3 and later).
pub fn consumer_timeout(f: &Facts) -> Option<ConsumerTimeout> {
    let model = Model::of_version(f.version);
    if model == Model::Queue && f.queue_type == Some("classic") {
        return None;
    }
    let mut best: Option<(u64, Source)> = None;
    if model.per_queue() {
        let argument = f
            .argument
            .filter(|v| *v >= 0)
            .map(|v| (v as u64, Source::Argument));
        for candidate in [argument, f.policies.and_then(policy_value)]
            .into_iter()
            .flatten()
        {
            if best.as_ref().is_none_or(|(ms, _)| candidate.0 < *ms) {
                best = Some(candidate);
            }
        }
    }
    let (ms, source) = best.unwrap_or((DEFAULT_CONSUMER_TIMEOUT_MS, Source::Default));
    Some(ConsumerTimeout { ms, source, model })
}

/// The `consumer-timeout` the policies set, with the one that sets it:
/// the operator policy when its own definition holds the value that
/// applies, else the policy (when the definitions could not be read, the
/// one named; an operator policy when only it is named).
fn policy_value(p: &AppliedPolicies) -> Option<(u64, Source)> {
    let value = p.effective.get(POLICY_KEY)?.as_i64().filter(|v| *v >= 0)?;
    let sets = |d: &Option<serde_json::Map<String, serde_json::Value>>| {
        d.as_ref()
            .and_then(|d| d.get(POLICY_KEY))
            .and_then(|v| v.as_i64())
            == Some(value)
    };
    let source = match (&p.policy, &p.operator_policy) {
        (_, Some(o)) if sets(&p.operator_definition) => Source::OperatorPolicy(o.clone()),
        (Some(n), _) => Source::Policy(n.clone()),
        (None, Some(o)) => Source::OperatorPolicy(o.clone()),
        (None, None) => Source::Policy("(unnamed)".into()),
    };
    Some((value as u64, source))
}

/// How the worker runs handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handlers {
    /// The handler timeout, in milliseconds.
    pub timeout_ms: u64,
    /// The prefetch (unacked deliveries the broker may push).
    pub prefetch: u16,
    /// Handler runs at once.
    pub concurrency: usize,
}

impl Handlers {
    /// How many handler runs a delivery may wait for, its own included:
    /// ⌈prefetch / concurrency⌉ (at least 1). The broker's clock starts at
    /// delivery, so a prefetched message waits behind the ones in front.
    pub fn turns(self) -> u64 {
        let c = self.concurrency.max(1) as u64;
        u64::from(self.prefetch.max(1)).div_ceil(c).max(1)
    }

    /// The longest a delivery may stay unacked: the handler timeout times
    /// [`Self::turns`].
    pub fn longest_unacked_ms(self) -> u64 {
        self.timeout_ms.saturating_mul(self.turns())
    }
}

/// The handlers against the consumer timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The queue has no consumer timeout.
    NoTimeout,
    /// The longest unacked time stays under it.
    Fits,
    /// It does not: the sentence says why and what to do.
    TooLong(String),
}

/// Whether `h` can meet `ct` (none: the queue has no consumer timeout):
/// the handler timeout times ⌈prefetch / concurrency⌉ must stay under
/// the consumer timeout; at or above it, the broker may requeue a message
/// while its handler runs, and the message runs twice.
pub fn judge(h: Handlers, ct: Option<&ConsumerTimeout>) -> Verdict {
    let Some(ct) = ct else {
        return Verdict::NoTimeout;
    };
    let longest = h.longest_unacked_ms();
    if longest < ct.ms {
        return Verdict::Fits;
    }
    let handler = if h.turns() > 1 {
        format!(
            "the handler timeout {} × {} (a delivery may wait for ⌈prefetch {} / concurrency {}⌉ \
             handler runs, its own included, and the broker's clock starts at delivery) = {}",
            tier_name(h.timeout_ms),
            h.turns(),
            h.prefetch,
            h.concurrency,
            tier_name(longest)
        )
    } else {
        format!("the handler timeout {}", tier_name(h.timeout_ms))
    };
    let fix = ct.source.fix();
    let lower = if h.turns() > 1 {
        "lower --handler-timeout or --prefetch"
    } else {
        "lower --handler-timeout"
    };
    Verdict::TooLong(format!(
        "{handler} is not under the consumer timeout {}, {}: {}, and the message runs twice; \
         {lower}, or {fix}",
        tier_name(ct.ms),
        ct.source,
        ct.model.consequence(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn applied(
        policy: Option<&str>,
        operator: Option<&str>,
        effective: serde_json::Value,
    ) -> AppliedPolicies {
        AppliedPolicies {
            policy: policy.map(str::to_string),
            operator_policy: operator.map(str::to_string),
            effective: effective.as_object().cloned().unwrap_or_default(),
            policy_definition: None,
            operator_definition: None,
            notes: vec![],
        }
    }

    fn one(h_ms: u64) -> Handlers {
        Handlers {
            timeout_ms: h_ms,
            prefetch: 1,
            concurrency: 1,
        }
    }

    #[test]
    fn versions_choose_the_model() {
        assert_eq!(Model::of_version(Some("3.10.8")), Model::BrokerWide);
        assert_eq!(Model::of_version(Some("3.11.14")), Model::BrokerWide);
        assert_eq!(Model::of_version(Some("3.11.15")), Model::Channel);
        assert_eq!(Model::of_version(Some("3.13.7")), Model::Channel);
        assert_eq!(Model::of_version(Some("4.2.1")), Model::Channel);
        assert_eq!(Model::of_version(Some("4.3.6")), Model::Queue);
        assert_eq!(Model::of_version(Some("4.10.0+rc.1")), Model::Queue);
        assert_eq!(Model::of_version(None), Model::Channel);
        assert_eq!(Model::of_version(Some("garbage")), Model::Channel);
    }

    #[test]
    fn a_policy_under_the_handler_timeout_refuses_naming_both_values_and_the_policy() {
        let p = applied(Some("it-ct"), None, json!({"consumer-timeout": 4000}));
        let f = Facts {
            version: Some("4.3.6"),
            queue_type: Some("quorum"),
            argument: None,
            policies: Some(&p),
        };
        let ct = consumer_timeout(&f).unwrap();
        assert_eq!(ct.ms, 4000);
        assert_eq!(ct.source, Source::Policy("it-ct".into()));
        let Verdict::TooLong(why) = judge(one(12_000), Some(&ct)) else {
            panic!("12 s against 4 s must not fit")
        };
        for part in [
            "12s",
            "4s",
            "policy `it-ct`",
            "cancels the consumer",
            "runs twice",
        ] {
            assert!(why.contains(part), "{part} in {why}");
        }
        // At the timeout is not under it; just under fits.
        assert!(matches!(judge(one(4000), Some(&ct)), Verdict::TooLong(_)));
        assert_eq!(judge(one(3999), Some(&ct)), Verdict::Fits);
    }

    #[test]
    fn the_lower_of_argument_and_policy_applies_and_is_named() {
        let p = applied(Some("pol"), None, json!({"consumer-timeout": 60_000}));
        let mut f = Facts {
            version: Some("4.1.0"),
            queue_type: Some("classic"),
            argument: Some(20_000),
            policies: Some(&p),
        };
        let ct = consumer_timeout(&f).unwrap();
        assert_eq!((ct.ms, ct.source.clone()), (20_000, Source::Argument));
        f.argument = Some(90_000);
        let ct = consumer_timeout(&f).unwrap();
        assert_eq!((ct.ms, ct.source), (60_000, Source::Policy("pol".into())));
        // Up to 4.2 the channel is closed.
        let Verdict::TooLong(why) = judge(one(60_000), consumer_timeout(&f).as_ref()) else {
            panic!()
        };
        assert!(why.contains("closes the channel"), "{why}");
    }

    #[test]
    fn an_operator_policy_that_sets_the_value_is_the_one_named() {
        let mut p = applied(
            Some("pol"),
            Some("ops"),
            json!({"consumer-timeout": 5000, "message-ttl": 1}),
        );
        p.policy_definition = Some(json!({"message-ttl": 1}).as_object().cloned().unwrap());
        p.operator_definition = Some(
            json!({"consumer-timeout": 5000})
                .as_object()
                .cloned()
                .unwrap(),
        );
        let f = Facts {
            version: Some("4.3.6"),
            queue_type: Some("quorum"),
            argument: None,
            policies: Some(&p),
        };
        let ct = consumer_timeout(&f).unwrap();
        assert_eq!(ct.source, Source::OperatorPolicy("ops".into()));
        assert!(ct.source.to_string().contains("operator policy `ops`"));
        // Only an operator policy named, definitions unread.
        let p = applied(None, Some("ops"), json!({"consumer-timeout": 5000}));
        let f = Facts {
            policies: Some(&p),
            ..f
        };
        assert_eq!(
            consumer_timeout(&f).unwrap().source,
            Source::OperatorPolicy("ops".into())
        );
    }

    #[test]
    fn without_policy_or_argument_the_default_30_minutes_is_assumed_and_said() {
        let f = Facts {
            version: Some("4.3.6"),
            queue_type: Some("quorum"),
            ..Facts::default()
        };
        let ct = consumer_timeout(&f).unwrap();
        assert_eq!(ct.ms, DEFAULT_CONSUMER_TIMEOUT_MS);
        assert_eq!(judge(one(29 * 60_000), Some(&ct)), Verdict::Fits);
        let Verdict::TooLong(why) = judge(one(30 * 60_000), Some(&ct)) else {
            panic!()
        };
        assert!(why.contains("rabbitmq.conf cannot be read"), "{why}");
        assert!(
            why.contains("raise consumer_timeout in rabbitmq.conf"),
            "{why}"
        );
    }

    #[test]
    fn before_3_11_15_a_policy_or_argument_does_not_count() {
        let p = applied(Some("pol"), None, json!({"consumer-timeout": 1000}));
        let f = Facts {
            version: Some("3.10.8"),
            queue_type: Some("quorum"),
            argument: Some(1000),
            policies: Some(&p),
        };
        let ct = consumer_timeout(&f).unwrap();
        assert_eq!(
            (ct.ms, ct.source),
            (DEFAULT_CONSUMER_TIMEOUT_MS, Source::Default)
        );
    }

    #[test]
    fn classic_queues_have_no_consumer_timeout_from_4_3() {
        let p = applied(Some("pol"), None, json!({"consumer-timeout": 1000}));
        let f = Facts {
            version: Some("4.3.6"),
            queue_type: Some("classic"),
            argument: None,
            policies: Some(&p),
        };
        assert_eq!(consumer_timeout(&f), None);
        assert_eq!(judge(one(u64::MAX), None), Verdict::NoTimeout);
    }

    #[test]
    fn prefetched_deliveries_wait_behind_the_ones_in_front() {
        let ct = ConsumerTimeout {
            ms: 30 * 60_000,
            source: Source::Default,
            model: Model::BrokerWide,
        };
        let h = Handlers {
            timeout_ms: 10 * 60_000,
            prefetch: 5,
            concurrency: 2,
        };
        assert_eq!(h.turns(), 3);
        let Verdict::TooLong(why) = judge(h, Some(&ct)) else {
            panic!("10 min × 3 = 30 min is not under 30 min")
        };
        assert!(why.contains("× 3"), "{why}");
        assert!(why.contains("= 30m"), "{why}");
        assert!(why.contains("--prefetch"), "{why}");
        let h = Handlers {
            concurrency: 3,
            ..h
        };
        assert_eq!(h.turns(), 2);
        assert_eq!(judge(h, Some(&ct)), Verdict::Fits);
        // A prefetch under the concurrency is one turn; zero counts as one.
        let h = Handlers {
            timeout_ms: 1,
            prefetch: 0,
            concurrency: 0,
        };
        assert_eq!(h.turns(), 1);
    }
}
