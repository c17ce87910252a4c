//! The extra `arguments` of a main queue, checked against an allow-list.

use crate::topology::model::*;
use crate::topology::yaml::{Key, Node, Value};
use crate::values::duration::MAX_MILLIS;

use super::read::Cx;

/// The values of `x-queue-leader-locator` RabbitMQ 3.10 and 4.x accept.
const LEADER_LOCATORS: [&str; 4] = ["client-local", "balanced", "least-leaders", "random"];

/// The type of an argument's value.
enum Ty {
    Int,
    Bool,
    Str,
}

impl Cx {
    /// One extra argument of a main queue, checked against the allow-list.
    pub(super) fn argument(
        &mut self,
        k: &Key,
        v: &Node,
        qt: QueueType,
        pipeline: &str,
    ) -> Option<ArgValue> {
        const GENERATED: [&str; 6] = [
            "x-queue-type",
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-delivery-limit",
            "x-dead-letter-strategy",
            "x-overflow",
        ];
        let key = k.name.as_str();
        if GENERATED.contains(&key) {
            let why = match key {
                "x-overflow" => "an override such as drop-head would silently turn at-least-once into at-most-once",
                "x-delivery-limit" => "use the pipeline's `delivery_limit`",
                "x-queue-type" => "use `queue_type`",
                _ => "it wires the retry and dead-letter path",
            };
            self.err(
                k.pos,
                format!("argument `{key}` is set by dlqctl itself and cannot be overridden: {why}"),
            );
            return None;
        }
        let (ty, only) = match key {
            "x-message-ttl" => (Ty::Int, None),
            "x-single-active-consumer" => (Ty::Bool, None),
            "x-max-length" | "x-max-length-bytes" | "x-quorum-initial-group-size" => {
                (Ty::Int, Some(QueueType::Quorum))
            }
            "x-queue-leader-locator" => (Ty::Str, Some(QueueType::Quorum)),
            "x-max-priority" => (Ty::Int, Some(QueueType::Classic)),
            _ => {
                self.err(
                    k.pos,
                    format!(
                        "argument `{key}` is not supported (allowed: x-message-ttl, x-single-active-consumer; \
                         quorum: x-max-length, x-max-length-bytes, x-quorum-initial-group-size, \
                         x-queue-leader-locator; classic: x-max-priority)"
                    ),
                );
                return None;
            }
        };
        let mut misplaced = false;
        if let Some(only) = only {
            if only != qt {
                self.err(
                    k.pos,
                    format!(
                        "argument `{key}` applies to {} queues only; pipeline `{pipeline}` is {}",
                        only.as_str(),
                        qt.as_str()
                    ),
                );
                // Its value is still checked: one error does not hide another.
                misplaced = true;
            }
        }
        let value = self.argument_value(key, ty, v);
        if misplaced {
            None
        } else {
            value
        }
    }

    /// The value of argument `key`, of type `ty`, in its range.
    fn argument_value(&mut self, key: &str, ty: Ty, v: &Node) -> Option<ArgValue> {
        match ty {
            Ty::Int => {
                let (lo, hi) = match key {
                    "x-message-ttl" => (0, MAX_MILLIS as i64),
                    "x-max-priority" => (1, 255),
                    "x-quorum-initial-group-size" => (1, i32::MAX as i64),
                    _ => (0, i64::MAX),
                };
                self.int_in(v, &format!("argument `{key}`"), lo, hi)
                    .map(ArgValue::Int)
            }
            Ty::Bool => match v.value {
                Value::Bool(b) => Some(ArgValue::Bool(b)),
                ref other => {
                    self.err(
                        v.pos,
                        format!("argument `{key}` must be a boolean, not {}", other.kind()),
                    );
                    None
                }
            },
            Ty::Str => {
                let text = self.string(v, &format!("argument `{key}`"))?;
                if key == "x-queue-leader-locator" && !LEADER_LOCATORS.contains(&text.as_str()) {
                    self.err(
                        v.pos,
                        format!(
                            "argument `{key}` must be one of {}, not `{text}` (the broker refuses \
                             other values; on RabbitMQ 4.x random and least-leaders mean balanced)",
                            LEADER_LOCATORS.join(", ")
                        ),
                    );
                    return None;
                }
                Some(ArgValue::Str(text))
            }
        }
    }
}
