//! One pipeline: its own settings applied over `defaults`, and the rules
//! that depend on both.

use crate::topology::model::*;
use crate::topology::yaml::{Key, Node, Pos, Value};
use crate::values::duration::MAX_MILLIS;

use super::idempotency::RawIdempotency;
use super::read::{At, Cx};
use super::settings::{backoff_delays, RawSettings, MAX_BACKOFF_RETRIES, SETTINGS_KEYS};

impl Cx {
    pub(super) fn pipeline(&mut self, n: &Node, defaults: &RawSettings) -> Option<(Pipeline, Pos)> {
        let mut allowed = vec!["name", "exchange"];
        allowed.extend(SETTINGS_KEYS);
        let m = self.map(n, "a pipeline", &allowed)?;
        let get = |k: &str| m.iter().find(|(key, _)| key.name == k).map(|(_, v)| v);
        let name = match get("name") {
            Some(v) => self.string(v, "pipeline name").map(|s| (s, v.pos)),
            None => {
                self.err(n.pos, "a pipeline needs a `name` (its main queue)");
                None
            }
        };
        let exchange = match get("exchange") {
            Some(Node {
                value: Value::Null, ..
            })
            | None => Some(None),
            Some(v) => self.exchange(v).map(Some),
        };
        // Settings of the pipeline itself: the same keys as `defaults`.
        let own_nodes: Vec<(Key, Node)> = m
            .iter()
            .filter(|(k, _)| SETTINGS_KEYS.contains(&k.name.as_str()))
            .cloned()
            .collect();
        let own = self.settings(
            &Node {
                pos: n.pos,
                value: Value::Map(own_nodes),
            },
            "a pipeline",
            &SETTINGS_KEYS,
            false,
        );
        // Every rule is checked even when the name or the exchange is
        // invalid, so that one bad key does not hide the errors of others.
        let (shown, shown_pos) = match &name {
            Some((name, pos)) => (name.clone(), *pos),
            None => ("(unnamed)".to_string(), n.pos),
        };
        let resolved = self.resolve(
            &shown,
            shown_pos,
            exchange.clone().flatten().map(|(e, _)| e),
            defaults,
            &own,
        );
        let (_, name_pos) = name?;
        exchange?;
        Some((resolved?, name_pos))
    }

    /// Applies defaults under a pipeline's own settings and checks the rules
    /// that depend on both.
    fn resolve(
        &mut self,
        name: &str,
        name_pos: Pos,
        exchange: Option<ProducerExchange>,
        defaults: &RawSettings,
        own: &RawSettings,
    ) -> Option<Pipeline> {
        let queue_type = pick(&own.queue_type, &defaults.queue_type)
            .map(|q| q.v)
            .unwrap_or(QueueType::Quorum);
        let max_attempts = pick(&own.retry.max_attempts, &defaults.retry.max_attempts)
            .map(|a| a.v)
            .unwrap_or(DEFAULT_MAX_ATTEMPTS);
        let jitter = pick(&own.retry.jitter, &defaults.retry.jitter)
            .map(|j| j.v)
            .unwrap_or(DEFAULT_JITTER);
        // Every part is resolved, so that one error does not hide another.
        let delays = self.delays(defaults, own, max_attempts);
        let delivery_limit = self.delivery_limit(name, queue_type, defaults, own);
        let dead_letter = self.dead_letter_of(name, queue_type, defaults, own);
        let arguments = self.arguments(name, queue_type, defaults, own);
        let dlq_ttl = dead_letter.as_ref().and_then(|d| d.ttl);
        Some(Pipeline {
            name: name.to_string(),
            queue_type,
            exchange,
            retry: RetryPolicy {
                delays: delays?,
                max_attempts,
                jitter,
            },
            dead_letter: dead_letter?,
            delivery_limit: delivery_limit?,
            circuit_breaker: pick(&own.circuit_breaker, &defaults.circuit_breaker)
                .and_then(|c| c.v),
            idempotency: RawIdempotency::merged(&own.idempotency, &defaults.idempotency, dlq_ttl),
            arguments: arguments?,
            line: name_pos.line,
        })
    }

    /// The retry delays: a pipeline's `delays` or `backoff` replaces the
    /// defaults' choice; a backoff is expanded.
    fn delays(
        &mut self,
        defaults: &RawSettings,
        own: &RawSettings,
        max_attempts: u32,
    ) -> Option<Vec<u64>> {
        let (delays_src, backoff_src) = if own.retry.delays.is_some() || own.retry.backoff.is_some()
        {
            (own.retry.delays.clone(), own.retry.backoff.clone())
        } else {
            (
                defaults.retry.delays.clone(),
                defaults.retry.backoff.clone(),
            )
        };
        match (delays_src, backoff_src) {
            (Some(d), _) => Some(d.v),
            (None, Some(b)) => match backoff_delays(&b.v, max_attempts) {
                Ok(d) => Some(d),
                Err(0) => {
                    self.err(
                        b.pos,
                        format!("retry.backoff: the delays keep growing past {MAX_BACKOFF_RETRIES} retries; set `max`, a larger `factor` or a smaller `max_attempts`"),
                    );
                    None
                }
                Err(k) => {
                    self.err(
                        b.pos,
                        format!("retry.backoff: the delay of retry {k} exceeds {MAX_MILLIS}ms; set `max`"),
                    );
                    None
                }
            },
            (None, None) => Some(DEFAULT_DELAYS.to_vec()),
        }
    }

    /// The delivery limit of a quorum main queue; a classic one has none.
    /// `None` when the file sets one on a classic pipeline.
    fn delivery_limit(
        &mut self,
        name: &str,
        queue_type: QueueType,
        defaults: &RawSettings,
        own: &RawSettings,
    ) -> Option<Option<i64>> {
        match (
            queue_type,
            pick(&own.delivery_limit, &defaults.delivery_limit),
        ) {
            (QueueType::Quorum, Some(l)) => Some(Some(l.v)),
            (QueueType::Quorum, None) => Some(Some(DEFAULT_DELIVERY_LIMIT)),
            (QueueType::Classic, Some(l)) => {
                self.err(
                    l.pos,
                    format!("delivery_limit applies to quorum queues only; pipeline `{name}` is classic"),
                );
                None
            }
            (QueueType::Classic, None) => Some(None),
        }
    }

    /// The dead-letter queue: its name (`<name>.dlq` unless given), TTL and
    /// maximum length (quorum only).
    fn dead_letter_of(
        &mut self,
        name: &str,
        queue_type: QueueType,
        defaults: &RawSettings,
        own: &RawSettings,
    ) -> Option<DeadLetter> {
        let max_length = pick(
            &own.dead_letter.max_length,
            &defaults.dead_letter.max_length,
        );
        let classic = queue_type == QueueType::Classic;
        if let (true, Some(ml)) = (classic, &max_length) {
            self.err(
                ml.pos,
                format!(
                    "dead_letter.max_length on classic pipeline `{name}`: classic dead-lettering is at-most-once, \
                     so a full DLQ would silently drop what it refuses; use queue_type: quorum or remove max_length"
                ),
            );
            return None;
        }
        Some(DeadLetter {
            queue: own
                .dead_letter
                .queue
                .as_ref()
                .map(|q| q.v.clone())
                .unwrap_or_else(|| format!("{name}.dlq")),
            ttl: pick(&own.dead_letter.ttl, &defaults.dead_letter.ttl).map(|t| t.v),
            max_length: max_length.map(|m| m.v),
            // A pipeline's `redrive` replaces the defaults' one whole.
            redrive: pick(&own.dead_letter.redrive, &defaults.dead_letter.redrive)
                .and_then(|r| r.v),
        })
    }

    /// The extra arguments: pipeline keys override the defaults' key by key.
    fn arguments(
        &mut self,
        name: &str,
        queue_type: QueueType,
        defaults: &RawSettings,
        own: &RawSettings,
    ) -> Option<Arguments> {
        let mut arg_nodes: Vec<(Key, Node)> = defaults.arguments.clone();
        for (k, v) in &own.arguments {
            arg_nodes.retain(|(dk, _)| dk.name != k.name);
            arg_nodes.push((k.clone(), v.clone()));
        }
        let mut ok = true;
        let mut arguments = Arguments::new();
        for (k, v) in &arg_nodes {
            match self.argument(k, v, queue_type, name) {
                Some(a) => {
                    arguments.insert(k.name.clone(), a);
                }
                None => ok = false,
            }
        }
        ok.then_some(arguments)
    }
}

/// A pipeline's own setting, else the defaults' one.
fn pick<T: Clone>(own: &Option<At<T>>, def: &Option<At<T>>) -> Option<At<T>> {
    own.clone().or_else(|| def.clone())
}
