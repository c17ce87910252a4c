//! A pipeline's producers' `exchange`: its name, type and bindings.

use crate::topology::model::*;
use crate::topology::yaml::{Node, Pos, Value};

use super::read::Cx;

/// The values of a headers binding's `x-match` the broker accepts.
const X_MATCH: [&str; 4] = ["all", "any", "all-with-x", "any-with-x"];

impl Cx {
    pub(super) fn exchange(&mut self, n: &Node) -> Option<(ProducerExchange, Pos)> {
        let m = self.map(n, "exchange", &["name", "type", "bindings"])?;
        let get = |k: &str| m.iter().find(|(key, _)| key.name == k).map(|(_, v)| v);
        let name = match get("name") {
            Some(v) => {
                let s = self.string(v, "exchange.name");
                if let Some(s) = &s {
                    self.name(v.pos, s, "exchange name");
                }
                s.map(|s| (s, v.pos))
            }
            None => {
                self.err(n.pos, "exchange needs a `name`");
                None
            }
        };
        let kind = match get("type") {
            Some(v) => self.string(v, "exchange.type").and_then(|t| {
                let k = ExchangeType::parse(&t);
                if k.is_none() {
                    self.err(
                        v.pos,
                        format!(
                            "exchange.type must be direct, topic, fanout or headers, not `{t}`"
                        ),
                    );
                }
                k
            }),
            None => {
                self.err(
                    n.pos,
                    "exchange needs a `type` (direct, topic, fanout or headers)",
                );
                None
            }
        };
        let mut bindings = Vec::new();
        let mut ok = true;
        match get("bindings") {
            None
            | Some(Node {
                value: Value::Null, ..
            }) => match kind {
                Some(ExchangeType::Fanout) => bindings.push(Binding {
                    key: String::new(),
                    arguments: Arguments::new(),
                }),
                Some(k) => {
                    self.err(
                            n.pos,
                            format!("a {} exchange needs `bindings` (the routing keys that reach the main queue)", k.as_str()),
                        );
                    ok = false;
                }
                None => {}
            },
            Some(Node {
                value: Value::Seq(items),
                pos,
            }) => {
                if items.is_empty() {
                    self.err(
                        *pos,
                        "exchange.bindings is empty: no message would reach the main queue",
                    );
                    ok = false;
                }
                for item in items {
                    match self.binding(item, kind) {
                        Some(b) => bindings.push(b),
                        None => ok = false,
                    }
                }
            }
            Some(other) => {
                self.err(
                    other.pos,
                    format!(
                        "exchange.bindings must be a list, not {}",
                        other.value.kind()
                    ),
                );
                ok = false;
            }
        }
        let (name, pos) = name?;
        let kind = kind?;
        ok.then_some((
            ProducerExchange {
                name,
                kind,
                bindings,
            },
            pos,
        ))
    }

    pub(super) fn binding(&mut self, n: &Node, kind: Option<ExchangeType>) -> Option<Binding> {
        let (key, arguments, pos) = match &n.value {
            Value::Str(s) => (s.clone(), None, n.pos),
            Value::Map(_) => {
                let m = self.map(n, "a binding", &["key", "arguments"])?;
                let mut key = String::new();
                let mut args = None;
                // Every key of the binding is checked, whatever the others hold.
                let mut ok = true;
                for (k, v) in m {
                    match k.name.as_str() {
                        "key" => match self.string(v, "binding key") {
                            Some(s) => key = s,
                            None => ok = false,
                        },
                        "arguments" => match self.binding_arguments(v) {
                            Some(a) => args = Some(a),
                            None => ok = false,
                        },
                        _ => {}
                    }
                }
                if !ok {
                    return None;
                }
                (key, args, n.pos)
            }
            other => {
                self.err(
                    n.pos,
                    format!(
                        "a binding must be a routing key or {{key: K, arguments: {{...}}}}, not {}",
                        other.kind()
                    ),
                );
                return None;
            }
        };
        let mut ok = true;
        if key.len() > 255 {
            self.err(pos, "a routing key is at most 255 bytes");
            ok = false;
        }
        if kind == Some(ExchangeType::Headers) && arguments.is_none() {
            self.err(pos, "a binding of a headers exchange needs `arguments` (e.g. {x-match: all, type: order})");
            ok = false;
        }
        if !ok {
            return None;
        }
        Some(Binding {
            key,
            arguments: arguments.unwrap_or_default(),
        })
    }

    pub(super) fn binding_arguments(&mut self, n: &Node) -> Option<Arguments> {
        let Value::Map(m) = &n.value else {
            self.err(
                n.pos,
                format!(
                    "binding arguments must be a mapping, not {}",
                    n.value.kind()
                ),
            );
            return None;
        };
        let mut out = Arguments::new();
        let mut ok = true;
        for (k, v) in m {
            // The broker refuses a binding whose x-match is anything else
            // (checked offline, so that provision does not report it as drift).
            if k.name == "x-match"
                && !matches!(&v.value, Value::Str(s) if X_MATCH.contains(&s.as_str()))
            {
                self.err(
                    v.pos,
                    format!(
                        "x-match must be one of {}, not {} (the broker refuses the binding)",
                        X_MATCH.join(", "),
                        match &v.value {
                            Value::Str(s) => format!("`{s}`"),
                            other => other.kind().to_string(),
                        }
                    ),
                );
                ok = false;
                continue;
            }
            match &v.value {
                Value::Str(s) => {
                    out.insert(k.name.clone(), ArgValue::Str(s.clone()));
                }
                Value::Int(i) => {
                    out.insert(k.name.clone(), ArgValue::Int(*i));
                }
                Value::Bool(b) => {
                    out.insert(k.name.clone(), ArgValue::Bool(*b));
                }
                other => {
                    self.err(
                        v.pos,
                        format!(
                            "binding argument `{}` must be a string, integer or boolean, not {}",
                            k.name,
                            other.kind()
                        ),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }
}
