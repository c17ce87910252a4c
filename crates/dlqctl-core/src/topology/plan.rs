//! The broker objects a topology needs, with their exact names, types and
//! arguments (docs/topology.md, "What gets declared").

use super::model::*;

/// What an object is for, within its pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Where producers publish.
    ProducerExchange,
    /// `NAME.retry`, direct, routes to the tier queues.
    RetryExchange,
    /// `NAME.dlx`, fanout, routes to the DLQ.
    DeadLetterExchange,
    /// The queue consumers read.
    MainQueue,
    /// One TTL queue per delay tier.
    RetryQueue,
    /// The dead-letter queue.
    DeadLetterQueue,
    /// `NAME.redrive-state`: the redrive wait shared by the pipeline's
    /// workers (only with a redrive policy).
    RedriveState,
}

/// An exchange to declare: durable, not auto-delete, not internal.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ExchangeSpec {
    /// Exchange name.
    pub name: String,
    /// Exchange type.
    #[serde(rename = "type")]
    pub kind: ExchangeType,
    /// What it is for.
    pub role: Role,
    /// Pipelines that use it (a producers' exchange may be shared).
    pub pipelines: Vec<String>,
}

/// A durable queue to declare with these arguments.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QueueSpec {
    /// Queue name.
    pub name: String,
    /// What it is for.
    pub role: Role,
    /// The pipeline it belongs to.
    pub pipeline: String,
    /// The exact `x-` arguments.
    pub arguments: Arguments,
}

/// A binding from an exchange to a queue.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BindingSpec {
    /// Source exchange.
    pub exchange: String,
    /// Destination queue.
    pub queue: String,
    /// Routing key.
    pub routing_key: String,
    /// Binding arguments.
    pub arguments: Arguments,
    /// The pipeline it belongs to.
    pub pipeline: String,
}

/// Everything a topology declares, in declaration order: exchanges, then
/// queues, then bindings.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Default)]
pub struct Plan {
    /// Exchanges, each once.
    pub exchanges: Vec<ExchangeSpec>,
    /// Queues.
    pub queues: Vec<QueueSpec>,
    /// Bindings.
    pub bindings: Vec<BindingSpec>,
}

impl Plan {
    /// Number of objects (exchanges + queues + bindings).
    pub fn len(&self) -> usize {
        self.exchanges.len() + self.queues.len() + self.bindings.len()
    }

    /// True when there is nothing to declare.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn int(v: i64) -> ArgValue {
    ArgValue::Int(v)
}

fn s(v: &str) -> ArgValue {
    ArgValue::Str(v.to_string())
}

/// Arguments of a pipeline's main queue.
pub(crate) fn main_queue_arguments(p: &Pipeline) -> Arguments {
    let mut a = p.arguments.clone();
    a.insert("x-queue-type".into(), s(p.queue_type.as_str()));
    a.insert(
        "x-dead-letter-exchange".into(),
        s(&p.dead_letter_exchange()),
    );
    if p.queue_type == QueueType::Quorum {
        a.insert(
            "x-delivery-limit".into(),
            int(p.delivery_limit.unwrap_or(DEFAULT_DELIVERY_LIMIT)),
        );
        a.insert("x-dead-letter-strategy".into(), s("at-least-once"));
        a.insert("x-overflow".into(), s("reject-publish"));
    }
    a
}

/// Arguments of the retry queue of one delay tier.
pub(crate) fn retry_queue_arguments(p: &Pipeline, delay_ms: u64) -> Arguments {
    let mut a = Arguments::new();
    a.insert("x-queue-type".into(), s(p.queue_type.as_str()));
    a.insert("x-message-ttl".into(), int(delay_ms as i64));
    a.insert("x-dead-letter-exchange".into(), s(""));
    a.insert("x-dead-letter-routing-key".into(), s(&p.name));
    if p.queue_type == QueueType::Quorum {
        a.insert("x-dead-letter-strategy".into(), s("at-least-once"));
        a.insert("x-overflow".into(), s("reject-publish"));
    }
    a
}

/// Arguments of a pipeline's DLQ.
pub(crate) fn dead_letter_queue_arguments(p: &Pipeline) -> Arguments {
    let mut a = Arguments::new();
    a.insert("x-queue-type".into(), s(p.queue_type.as_str()));
    if let Some(ttl) = p.dead_letter.ttl {
        a.insert("x-message-ttl".into(), int(ttl as i64));
    }
    if let Some(ml) = p.dead_letter.max_length {
        a.insert("x-max-length".into(), int(ml));
        a.insert("x-overflow".into(), s("reject-publish"));
    }
    if p.queue_type == QueueType::Quorum {
        // 4.x defaults to 20 and would drop a DLQ message after 20 peeks.
        a.insert("x-delivery-limit".into(), int(i32::MAX as i64));
    }
    a
}

/// Arguments of a pipeline's redrive-state queue: always classic (a
/// quorum queue read by get and requeue counts every read against its
/// delivery limit, 20 by default on 4.x).
pub(crate) fn redrive_state_arguments() -> Arguments {
    let mut a = Arguments::new();
    a.insert("x-queue-type".into(), s("classic"));
    a
}

/// The objects of one pipeline.
pub fn pipeline_plan(p: &Pipeline) -> Plan {
    let mut plan = Plan::default();
    let one = |name: String, kind, role| ExchangeSpec {
        name,
        kind,
        role,
        pipelines: vec![p.name.clone()],
    };
    if let Some(e) = &p.exchange {
        plan.exchanges
            .push(one(e.name.clone(), e.kind, Role::ProducerExchange));
    }
    plan.exchanges.push(one(
        p.retry_exchange(),
        ExchangeType::Direct,
        Role::RetryExchange,
    ));
    plan.exchanges.push(one(
        p.dead_letter_exchange(),
        ExchangeType::Fanout,
        Role::DeadLetterExchange,
    ));

    let queue = |name: String, role, arguments| QueueSpec {
        name,
        role,
        pipeline: p.name.clone(),
        arguments,
    };
    plan.queues.push(queue(
        p.name.clone(),
        Role::MainQueue,
        main_queue_arguments(p),
    ));
    for d in p.retry.tiers() {
        plan.queues.push(queue(
            p.retry_queue(d),
            Role::RetryQueue,
            retry_queue_arguments(p, d),
        ));
    }
    plan.queues.push(queue(
        p.dead_letter.queue.clone(),
        Role::DeadLetterQueue,
        dead_letter_queue_arguments(p),
    ));
    if p.dead_letter.redrive.is_some() {
        plan.queues.push(queue(
            p.redrive_state_queue(),
            Role::RedriveState,
            redrive_state_arguments(),
        ));
    }

    let bind = |exchange: String, queue: String, routing_key: String, arguments| BindingSpec {
        exchange,
        queue,
        routing_key,
        arguments,
        pipeline: p.name.clone(),
    };
    if let Some(e) = &p.exchange {
        for b in &e.bindings {
            plan.bindings.push(bind(
                e.name.clone(),
                p.name.clone(),
                b.key.clone(),
                b.arguments.clone(),
            ));
        }
    }
    for d in p.retry.tiers() {
        plan.bindings.push(bind(
            p.retry_exchange(),
            p.retry_queue(d),
            crate::values::duration::tier_name(d),
            Arguments::new(),
        ));
    }
    plan.bindings.push(bind(
        p.dead_letter_exchange(),
        p.dead_letter.queue.clone(),
        String::new(),
        Arguments::new(),
    ));
    plan
}

/// The objects of a whole topology; a producers' exchange shared by several
/// pipelines appears once.
///
/// Linear in the number of objects: exchanges and bindings already planned
/// are found through hash indexes, not by scanning (20,000 pipelines took
/// 33 s with scans).
pub fn plan(t: &Topology) -> Plan {
    use std::collections::{HashMap, HashSet};
    let mut out = Plan::default();
    let mut exchange_at: HashMap<String, usize> = HashMap::new();
    let mut bindings_seen: HashSet<BindingKey> = HashSet::new();
    for p in &t.pipelines {
        let pp = pipeline_plan(p);
        for e in pp.exchanges {
            match exchange_at.get(&e.name) {
                Some(&i) => out.exchanges[i].pipelines.extend(e.pipelines),
                None => {
                    exchange_at.insert(e.name.clone(), out.exchanges.len());
                    out.exchanges.push(e);
                }
            }
        }
        out.queues.extend(pp.queues);
        for b in pp.bindings {
            if bindings_seen.insert(BindingKey::of(&b)) {
                out.bindings.push(b);
            }
        }
    }
    out
}

/// What makes two planned bindings the same one.
#[derive(PartialEq, Eq, Hash)]
struct BindingKey {
    exchange: String,
    queue: String,
    routing_key: String,
    arguments: Vec<(String, String)>,
    pipeline: String,
}

impl BindingKey {
    fn of(b: &BindingSpec) -> Self {
        BindingKey {
            exchange: b.exchange.clone(),
            queue: b.queue.clone(),
            routing_key: b.routing_key.clone(),
            arguments: b
                .arguments
                .iter()
                .map(|(k, v)| (k.clone(), format!("{v:?}")))
                .collect(),
            pipeline: b.pipeline.clone(),
        }
    }
}
