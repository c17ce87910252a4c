//! From YAML text to a valid [`Topology`], collecting every problem.

use super::model::*;
use super::yaml::{self, Key, Node, Pos, Value};
use crate::core::values::duration::{parse_millis, MAX_MILLIS};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Default delivery limit of quorum main queues.
pub const DEFAULT_DELIVERY_LIMIT: i64 = 20;
/// Default retry delays when a file gives none.
pub const DEFAULT_DELAYS: [u64; 3] = [1_000, 10_000, 60_000];
/// Default attempt budget.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 4;
/// Default jitter.
pub const DEFAULT_JITTER: f64 = 0.1;

/// One problem in a topology file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where it is.
    pub pos: Pos,
    /// What is wrong, in words a user can act on.
    pub message: String,
}

/// Every problem found in one topology file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Invalid {
    /// The file's name as the user gave it.
    pub file: String,
    /// Problems sorted by position.
    pub problems: Vec<Problem>,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}:{}: {}", self.file, p.pos, p.message)?;
        }
        Ok(())
    }
}

/// The values of a headers binding's `x-match` the broker accepts.
const X_MATCH: [&str; 4] = ["all", "any", "all-with-x", "any-with-x"];

/// The values of `x-queue-leader-locator` RabbitMQ 3.10 and 4.x accept.
const LEADER_LOCATORS: [&str; 4] = ["client-local", "balanced", "least-leaders", "random"];

/// Parses and validates a topology file's text. `file` names it in errors.
pub fn parse_topology(text: &str, file: &str) -> Result<Topology, Invalid> {
    let root = match yaml::parse(text) {
        Ok(n) => n,
        Err(e) => {
            return Err(Invalid {
                file: file.to_string(),
                problems: vec![Problem {
                    pos: e.pos.unwrap_or(Pos { line: 1, column: 1 }),
                    message: format!("invalid YAML: {}", e.message),
                }],
            })
        }
    };
    let mut cx = Cx::default();
    let top = cx.topology(&root);
    if cx.problems.is_empty() {
        if let Some(t) = top {
            return Ok(t);
        }
    }
    let mut problems = cx.problems;
    problems.sort_by(|a, b| a.pos.cmp(&b.pos).then(a.message.cmp(&b.message)));
    problems.dedup();
    Err(Invalid {
        file: file.to_string(),
        problems,
    })
}

/// A value and where it was written.
#[derive(Debug, Clone)]
struct At<T> {
    pos: Pos,
    v: T,
}

fn at<T>(pos: Pos, v: T) -> At<T> {
    At { pos, v }
}

#[derive(Debug, Clone, Default)]
struct RawRetry {
    delays: Option<At<Vec<u64>>>,
    backoff: Option<At<RawBackoff>>,
    max_attempts: Option<At<u32>>,
    jitter: Option<At<f64>>,
}

#[derive(Debug, Clone)]
struct RawBackoff {
    base: u64,
    factor: f64,
    max: Option<u64>,
}

#[derive(Debug, Clone, Default)]
struct RawDeadLetter {
    queue: Option<At<String>>,
    ttl: Option<At<u64>>,
    max_length: Option<At<i64>>,
}

#[derive(Debug, Clone, Default)]
struct RawSettings {
    queue_type: Option<At<QueueType>>,
    retry: RawRetry,
    dead_letter: RawDeadLetter,
    delivery_limit: Option<At<i64>>,
    circuit_breaker: Option<At<CircuitBreaker>>,
    arguments: Vec<(Key, Node)>,
}

#[derive(Default)]
struct Cx {
    problems: Vec<Problem>,
}

const SETTINGS_KEYS: [&str; 6] = [
    "queue_type",
    "retry",
    "dead_letter",
    "delivery_limit",
    "circuit_breaker",
    "arguments",
];

impl Cx {
    fn err(&mut self, pos: Pos, message: impl Into<String>) {
        self.problems.push(Problem {
            pos,
            message: message.into(),
        });
    }

    /// The entries of a mapping node; unknown keys are reported.
    fn map<'n>(&mut self, n: &'n Node, what: &str, allowed: &[&str]) -> Option<&'n [(Key, Node)]> {
        match &n.value {
            Value::Map(m) => {
                for (k, _) in m {
                    if !allowed.contains(&k.name.as_str()) {
                        self.err(
                            k.pos,
                            format!(
                                "unknown key `{}` in {what} (expected one of: {})",
                                k.name,
                                allowed.join(", ")
                            ),
                        );
                    }
                }
                Some(m)
            }
            other => {
                self.err(
                    n.pos,
                    format!("{what} must be a mapping, not {}", other.kind()),
                );
                None
            }
        }
    }

    fn string(&mut self, n: &Node, what: &str) -> Option<String> {
        match &n.value {
            Value::Str(s) => Some(s.clone()),
            other => {
                self.err(
                    n.pos,
                    format!("{what} must be a string, not {}", other.kind()),
                );
                None
            }
        }
    }

    fn int(&mut self, n: &Node, what: &str) -> Option<i64> {
        match &n.value {
            Value::Int(i) => Some(*i),
            Value::BigInt(_) => {
                self.err(n.pos, format!("{what} is too large"));
                None
            }
            other => {
                self.err(
                    n.pos,
                    format!("{what} must be an integer, not {}", other.kind()),
                );
                None
            }
        }
    }

    fn int_in(&mut self, n: &Node, what: &str, lo: i64, hi: i64) -> Option<i64> {
        // A whole number too large for an integer reads as a float (or a
        // big integer): say the range, not "not a number".
        let too_large = match &n.value {
            Value::Float(f) if f.is_finite() && f.fract() == 0.0 => Some(format!("about {f:e}")),
            Value::BigInt(i) => Some(i.to_string()),
            _ => None,
        };
        if let Some(shown) = too_large {
            self.err(
                n.pos,
                format!("{what} must be between {lo} and {hi}, not {shown}"),
            );
            return None;
        }
        let i = self.int(n, what)?;
        if i < lo || i > hi {
            self.err(
                n.pos,
                format!("{what} must be between {lo} and {hi}, not {i}"),
            );
            return None;
        }
        Some(i)
    }

    fn number(&mut self, n: &Node, what: &str) -> Option<f64> {
        match &n.value {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) if f.is_finite() => Some(*f),
            other => {
                self.err(
                    n.pos,
                    format!("{what} must be a number, not {}", other.kind()),
                );
                None
            }
        }
    }

    /// A duration between 1ms and the broker's 2^32-1 ms bound.
    fn duration(&mut self, n: &Node, what: &str) -> Option<u64> {
        let s = match &n.value {
            Value::Str(s) => s,
            other => {
                self.err(
                    n.pos,
                    format!(
                        "{what} must be a duration such as 500ms, 30s, 10m, 2h or 14d, not {}",
                        other.kind()
                    ),
                );
                return None;
            }
        };
        match parse_millis(s) {
            Ok(ms) if (1..=MAX_MILLIS).contains(&ms) => Some(ms),
            Ok(ms) => {
                self.err(
                    n.pos,
                    format!("{what} must be between 1ms and {MAX_MILLIS}ms (about 49.7 days), not {ms}ms"),
                );
                None
            }
            Err(e) => {
                self.err(n.pos, format!("{what}: {e}"));
                None
            }
        }
    }

    fn name(&mut self, pos: Pos, name: &str, what: &str) -> bool {
        let mut ok = true;
        if name.is_empty() {
            self.err(pos, format!("{what} must not be empty"));
            ok = false;
        }
        if name.len() > 255 {
            self.err(
                pos,
                format!(
                    "{what} `{}…` is {} bytes long; RabbitMQ names are at most 255 bytes",
                    crate::core::values::text::truncate_utf8(name, 40),
                    name.len()
                ),
            );
            ok = false;
        }
        if name.starts_with("amq.") {
            self.err(
                pos,
                format!("{what} `{name}` starts with `amq.`, which RabbitMQ reserves"),
            );
            ok = false;
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            // A NUL, an escape or a newline in a queue name passes the
            // broker, then breaks every log, terminal and script that
            // prints or matches it.
            self.err(
                pos,
                format!(
                    "{what} `{}` contains the control character U+{:04X}; names are printable text",
                    name.escape_debug(),
                    c as u32
                ),
            );
            ok = false;
        }
        ok
    }

    fn topology(&mut self, root: &Node) -> Option<Topology> {
        if root.value == Value::Null {
            self.err(
                root.pos,
                "the file is empty; expected `version: 1` and `pipelines:`",
            );
            return None;
        }
        let m = self.map(root, "the topology", &["version", "defaults", "pipelines"])?;
        let get = |k: &str| m.iter().find(|(key, _)| key.name == k).map(|(_, v)| v);
        match get("version") {
            None => self.err(root.pos, "missing `version: 1`"),
            Some(v) => {
                if v.value != Value::Int(1) {
                    self.err(v.pos, "unsupported version: this dlqctl reads `version: 1`");
                }
            }
        }
        let defaults = match get("defaults") {
            Some(d) if d.value != Value::Null => self.settings(d, "defaults", &SETTINGS_KEYS, true),
            _ => RawSettings::default(),
        };
        let Some(pl) = get("pipelines") else {
            self.err(root.pos, "missing `pipelines:` (a list of pipelines)");
            return None;
        };
        let Value::Seq(items) = &pl.value else {
            self.err(
                pl.pos,
                format!("`pipelines` must be a list, not {}", pl.value.kind()),
            );
            return None;
        };
        if items.is_empty() {
            self.err(pl.pos, "`pipelines` is empty: nothing to provision");
        }
        self.check_duplicate_names(items);
        let mut pipelines = Vec::new();
        let mut name_pos = Vec::new();
        for item in items {
            if let Some((p, pos)) = self.pipeline(item, &defaults) {
                pipelines.push(p);
                name_pos.push(pos);
            }
        }
        self.check_names(&pipelines, &name_pos);
        Some(Topology { pipelines })
    }

    fn settings(
        &mut self,
        n: &Node,
        what: &str,
        allowed: &[&str],
        is_defaults: bool,
    ) -> RawSettings {
        let mut s = RawSettings::default();
        let Some(m) = self.map(n, what, allowed) else {
            return s;
        };
        for (k, v) in m {
            match k.name.as_str() {
                "queue_type" => {
                    if let Some(t) = self.string(v, "queue_type") {
                        match t.as_str() {
                            "quorum" => s.queue_type = Some(at(v.pos, QueueType::Quorum)),
                            "classic" => s.queue_type = Some(at(v.pos, QueueType::Classic)),
                            _ => self.err(
                                v.pos,
                                format!("queue_type must be `quorum` or `classic`, not `{t}`"),
                            ),
                        }
                    }
                }
                "retry" => s.retry = self.retry(v),
                "dead_letter" => s.dead_letter = self.dead_letter(v, is_defaults),
                "delivery_limit" => {
                    s.delivery_limit = self
                        .int_in(v, "delivery_limit", 1, i32::MAX as i64)
                        .map(|i| at(v.pos, i))
                }
                "circuit_breaker" => {
                    s.circuit_breaker = self.circuit_breaker(v).map(|c| at(v.pos, c))
                }
                "arguments" => match &v.value {
                    Value::Map(m) => s.arguments = m.clone(),
                    Value::Null => {}
                    other => self.err(
                        v.pos,
                        format!("arguments must be a mapping, not {}", other.kind()),
                    ),
                },
                _ => {}
            }
        }
        s
    }

    fn retry(&mut self, n: &Node) -> RawRetry {
        let mut r = RawRetry::default();
        let Some(m) = self.map(n, "retry", &["delays", "backoff", "max_attempts", "jitter"]) else {
            return r;
        };
        let mut backoff = None;
        for (k, v) in m {
            match k.name.as_str() {
                "delays" => match &v.value {
                    Value::Seq(items) => {
                        if items.is_empty() {
                            self.err(v.pos, "retry.delays is empty: give at least one delay, e.g. [1s, 10s, 1m]");
                        }
                        let d: Vec<u64> = items
                            .iter()
                            .filter_map(|i| self.duration(i, "a retry delay"))
                            .collect();
                        if d.len() == items.len() && !d.is_empty() {
                            r.delays = Some(at(v.pos, d));
                        }
                    }
                    other => self.err(
                        v.pos,
                        format!(
                            "retry.delays must be a list of durations, not {}",
                            other.kind()
                        ),
                    ),
                },
                "backoff" => backoff = self.backoff(v).map(|b| at(v.pos, b)),
                "max_attempts" => {
                    r.max_attempts = self
                        .int_in(v, "retry.max_attempts", 1, i32::MAX as i64)
                        .map(|i| at(v.pos, i as u32))
                }
                "jitter" => {
                    if let Some(j) = self.number(v, "retry.jitter") {
                        if (0.0..=0.5).contains(&j) {
                            r.jitter = Some(at(v.pos, j));
                        } else {
                            self.err(
                                v.pos,
                                format!("retry.jitter must be between 0 and 0.5, not {j}"),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        let has_delays = m.iter().any(|(k, _)| k.name == "delays");
        if let Some(bk) = m.iter().find(|(k, _)| k.name == "backoff").map(|(k, _)| k) {
            if has_delays {
                self.err(
                    bk.pos,
                    "give either retry.delays or retry.backoff, not both",
                );
            }
        }
        r.backoff = backoff;
        r
    }

    fn backoff(&mut self, n: &Node) -> Option<RawBackoff> {
        let m = self.map(n, "retry.backoff", &["base", "factor", "max"])?;
        let mut base = None;
        let mut factor = Some(2.0);
        let mut max = None;
        let mut ok = true;
        for (k, v) in m {
            match k.name.as_str() {
                "base" => {
                    base = self.duration(v, "retry.backoff.base");
                    ok &= base.is_some();
                }
                "factor" => {
                    factor = self.number(v, "retry.backoff.factor");
                    if let Some(f) = factor {
                        let decimals = format!("{f}")
                            .split_once('.')
                            .map_or(0, |(_, frac)| frac.len());
                        if f < 1.0 {
                            self.err(
                                v.pos,
                                format!("retry.backoff.factor must be at least 1, not {f}"),
                            );
                            factor = None;
                        } else if decimals > 9 || format!("{f}").contains('e') {
                            self.err(
                                v.pos,
                                format!(
                                    "retry.backoff.factor {f} has more than 9 decimal places; \
                                     write it with at most 9 (e.g. 1.5, 2.25)"
                                ),
                            );
                            factor = None;
                        }
                    }
                    ok &= factor.is_some();
                }
                "max" => {
                    max = self.duration(v, "retry.backoff.max");
                    ok &= max.is_some();
                }
                _ => {}
            }
        }
        if !m.iter().any(|(k, _)| k.name == "base") {
            self.err(
                n.pos,
                "retry.backoff needs `base` (the first delay, e.g. 1s)",
            );
            return None;
        }
        if let (Some(b), Some(mx)) = (base, max) {
            if mx < b {
                let pos = m
                    .iter()
                    .find(|(k, _)| k.name == "max")
                    .map_or(n.pos, |(_, v)| v.pos);
                self.err(
                    pos,
                    format!(
                        "retry.backoff.max ({}) is below base ({}): every retry would wait max; \
                         raise max or lower base",
                        crate::core::values::duration::tier_name(mx),
                        crate::core::values::duration::tier_name(b)
                    ),
                );
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        Some(RawBackoff {
            base: base?,
            factor: factor?,
            max,
        })
    }

    fn dead_letter(&mut self, n: &Node, is_defaults: bool) -> RawDeadLetter {
        let mut d = RawDeadLetter::default();
        let Some(m) = self.map(n, "dead_letter", &["queue", "ttl", "max_length"]) else {
            return d;
        };
        for (k, v) in m {
            match k.name.as_str() {
                "queue" => {
                    if is_defaults {
                        self.err(k.pos, "dead_letter.queue names one pipeline's DLQ: set it per pipeline, not in defaults");
                    } else if let Some(q) = self.string(v, "dead_letter.queue") {
                        d.queue = Some(at(v.pos, q));
                    }
                }
                "ttl" => d.ttl = self.duration(v, "dead_letter.ttl").map(|t| at(v.pos, t)),
                "max_length" => {
                    d.max_length = self
                        .int_in(v, "dead_letter.max_length", 1, i64::MAX)
                        .map(|i| at(v.pos, i))
                }
                _ => {}
            }
        }
        d
    }

    fn circuit_breaker(&mut self, n: &Node) -> Option<CircuitBreaker> {
        let m = self.map(
            n,
            "circuit_breaker",
            &["failure_rate", "window", "min_calls", "open_for"],
        )?;
        let mut cb = CircuitBreaker {
            failure_rate: 0.5,
            window: 60_000,
            min_calls: 20,
            open_for: 30_000,
        };
        let mut ok = true;
        for (k, v) in m {
            match k.name.as_str() {
                "failure_rate" => match self.number(v, "circuit_breaker.failure_rate") {
                    Some(r) if r > 0.0 && r <= 1.0 => cb.failure_rate = r,
                    Some(r) => {
                        self.err(v.pos, format!("circuit_breaker.failure_rate must be above 0 and at most 1, not {r}"));
                        ok = false;
                    }
                    None => ok = false,
                },
                "window" => match self.duration(v, "circuit_breaker.window") {
                    Some(w) => cb.window = w,
                    None => ok = false,
                },
                "min_calls" => {
                    match self.int_in(v, "circuit_breaker.min_calls", 1, u32::MAX as i64) {
                        Some(c) => cb.min_calls = c as u32,
                        None => ok = false,
                    }
                }
                "open_for" => match self.duration(v, "circuit_breaker.open_for") {
                    Some(o) => cb.open_for = o,
                    None => ok = false,
                },
                _ => {}
            }
        }
        ok.then_some(cb)
    }

    fn exchange(&mut self, n: &Node) -> Option<(ProducerExchange, Pos)> {
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

    fn binding(&mut self, n: &Node, kind: Option<ExchangeType>) -> Option<Binding> {
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

    fn binding_arguments(&mut self, n: &Node) -> Option<Arguments> {
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

    fn pipeline(&mut self, n: &Node, defaults: &RawSettings) -> Option<(Pipeline, Pos)> {
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
        fn pick<T: Clone>(own: &Option<At<T>>, def: &Option<At<T>>) -> Option<At<T>> {
            own.clone().or_else(|| def.clone())
        }
        let queue_type = pick(&own.queue_type, &defaults.queue_type)
            .map(|q| q.v)
            .unwrap_or(QueueType::Quorum);
        let classic = queue_type == QueueType::Classic;
        let mut ok = true;

        // Retry: a pipeline's `delays` or `backoff` replaces the defaults' choice.
        let (delays_src, backoff_src) = if own.retry.delays.is_some() || own.retry.backoff.is_some()
        {
            (own.retry.delays.clone(), own.retry.backoff.clone())
        } else {
            (
                defaults.retry.delays.clone(),
                defaults.retry.backoff.clone(),
            )
        };
        let max_attempts = pick(&own.retry.max_attempts, &defaults.retry.max_attempts)
            .map(|a| a.v)
            .unwrap_or(DEFAULT_MAX_ATTEMPTS);
        let jitter = pick(&own.retry.jitter, &defaults.retry.jitter)
            .map(|j| j.v)
            .unwrap_or(DEFAULT_JITTER);
        let delays = match (delays_src, backoff_src) {
            (Some(d), _) => d.v,
            (None, Some(b)) => match backoff_delays(&b.v, max_attempts) {
                Ok(d) => d,
                Err(0) => {
                    self.err(
                        b.pos,
                        format!("retry.backoff: the delays keep growing past {MAX_BACKOFF_RETRIES} retries; set `max`, a larger `factor` or a smaller `max_attempts`"),
                    );
                    ok = false;
                    vec![]
                }
                Err(k) => {
                    self.err(
                        b.pos,
                        format!("retry.backoff: the delay of retry {k} exceeds {MAX_MILLIS}ms; set `max`"),
                    );
                    ok = false;
                    vec![]
                }
            },
            (None, None) => DEFAULT_DELAYS.to_vec(),
        };

        let delivery_limit = match (
            queue_type,
            pick(&own.delivery_limit, &defaults.delivery_limit),
        ) {
            (QueueType::Quorum, Some(l)) => Some(l.v),
            (QueueType::Quorum, None) => Some(DEFAULT_DELIVERY_LIMIT),
            (QueueType::Classic, Some(l)) => {
                self.err(
                    l.pos,
                    format!("delivery_limit applies to quorum queues only; pipeline `{name}` is classic"),
                );
                ok = false;
                None
            }
            (QueueType::Classic, None) => None,
        };

        let max_length = pick(
            &own.dead_letter.max_length,
            &defaults.dead_letter.max_length,
        );
        if let (true, Some(ml)) = (classic, &max_length) {
            self.err(
                ml.pos,
                format!(
                    "dead_letter.max_length on classic pipeline `{name}`: classic dead-lettering is at-most-once, \
                     so a full DLQ would silently drop what it refuses; use queue_type: quorum or remove max_length"
                ),
            );
            ok = false;
        }
        let dead_letter = DeadLetter {
            queue: own
                .dead_letter
                .queue
                .as_ref()
                .map(|q| q.v.clone())
                .unwrap_or_else(|| format!("{name}.dlq")),
            ttl: pick(&own.dead_letter.ttl, &defaults.dead_letter.ttl).map(|t| t.v),
            max_length: max_length.map(|m| m.v),
        };

        // Arguments: pipeline keys override the defaults' key by key.
        let mut arg_nodes: Vec<(Key, Node)> = defaults.arguments.clone();
        for (k, v) in &own.arguments {
            arg_nodes.retain(|(dk, _)| dk.name != k.name);
            arg_nodes.push((k.clone(), v.clone()));
        }
        let mut arguments = Arguments::new();
        for (k, v) in &arg_nodes {
            match self.argument(k, v, queue_type, name) {
                Some(a) => {
                    arguments.insert(k.name.clone(), a);
                }
                None => ok = false,
            }
        }

        if !ok {
            return None;
        }
        Some(Pipeline {
            name: name.to_string(),
            queue_type,
            exchange,
            retry: RetryPolicy {
                delays,
                max_attempts,
                jitter,
            },
            dead_letter,
            delivery_limit,
            circuit_breaker: pick(&own.circuit_breaker, &defaults.circuit_breaker).map(|c| c.v),
            arguments,
            line: name_pos.line,
        })
    }

    /// One extra argument of a main queue, checked against the allow-list.
    fn argument(&mut self, k: &Key, v: &Node, qt: QueueType, pipeline: &str) -> Option<ArgValue> {
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
        enum Ty {
            Int,
            Bool,
            Str,
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
        let value = match ty {
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
        };
        if misplaced {
            None
        } else {
            value
        }
    }

    /// Pipeline names are unique, whether or not the rest of each pipeline
    /// is valid.
    fn check_duplicate_names(&mut self, items: &[Node]) {
        let mut seen: HashMap<String, Pos> = HashMap::new();
        for item in items {
            let Value::Map(m) = &item.value else { continue };
            let Some((_, n)) = m.iter().find(|(k, _)| k.name == "name") else {
                continue;
            };
            let Value::Str(name) = &n.value else { continue };
            match seen.get(name) {
                Some(first) => self.err(
                    n.pos,
                    format!(
                        "duplicate pipeline name `{name}` (first at line {})",
                        first.line
                    ),
                ),
                None => {
                    seen.insert(name.clone(), n.pos);
                }
            }
        }
    }

    /// Every queue name and every exchange name,
    /// generated ones included, is valid and names one object only.
    fn check_names(&mut self, pipelines: &[Pipeline], name_pos: &[Pos]) {
        // name -> (pipeline, role) of its first owner
        let mut queues: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut exchanges: BTreeMap<String, (String, String, Option<ExchangeType>)> =
            BTreeMap::new();
        let mut checked: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for (p, pos) in pipelines.iter().zip(name_pos) {
            // A duplicate pipeline is reported once, above, not per object.
            if !checked.insert(&p.name) {
                continue;
            }
            // Generated names extend the main one: check it first, alone.
            if !self.name(*pos, &p.name, "queue name") {
                continue;
            }
            let mut qs = vec![(p.name.clone(), "main queue".to_string())];
            qs.extend(p.retry.tiers().into_iter().map(|d| {
                (
                    p.retry_queue(d),
                    format!(
                        "retry queue {}",
                        crate::core::values::duration::tier_name(d)
                    ),
                )
            }));
            qs.push((p.dead_letter.queue.clone(), "dead-letter queue".to_string()));
            let mut xs = vec![
                (p.retry_exchange(), "retry exchange".to_string(), None),
                (
                    p.dead_letter_exchange(),
                    "dead-letter exchange".to_string(),
                    None,
                ),
            ];
            if let Some(e) = &p.exchange {
                xs.push((
                    e.name.clone(),
                    "producers' exchange".to_string(),
                    Some(e.kind),
                ));
            }
            for (q, role) in qs {
                if q != p.name
                    && !self.name(*pos, &q, &format!("{role} name of pipeline `{}`:", p.name))
                {
                    continue;
                }
                if let Some((op, orole)) = queues.get(&q) {
                    self.err(*pos, format!("queue `{q}` ({role} of pipeline `{}`) is also the {orole} of pipeline `{op}`", p.name));
                } else {
                    queues.insert(q, (p.name.clone(), role));
                }
            }
            for (x, role, kind) in xs {
                // A producers' exchange name was checked where it is written.
                if kind.is_none()
                    && !self.name(*pos, &x, &format!("{role} name of pipeline `{}`:", p.name))
                {
                    continue;
                }
                match exchanges.get(&x) {
                    // Pipelines may share one producers' exchange of one type.
                    Some((_, _, Some(k1))) if kind == Some(*k1) => {}
                    Some((op, orole, k1)) => {
                        let detail = match (k1, kind) {
                            (Some(a), Some(b)) => {
                                format!(" with type {} (here {})", a.as_str(), b.as_str())
                            }
                            _ => String::new(),
                        };
                        self.err(*pos, format!("exchange `{x}` ({role} of pipeline `{}`) is also the {orole} of pipeline `{op}`{detail}", p.name));
                    }
                    None => {
                        exchanges.insert(x, (p.name.clone(), role, kind));
                    }
                }
            }
        }
    }
}

/// Expands delay(k) = `min(floor(base × factor^(k-1)), max)` for
/// k = 1 … max_attempts−1, one entry per retry (retry k waits entry k; the
/// tiers are the distinct values). The factor is taken as the decimal it is
/// written as (`2.3` is 23/10, not the nearest binary float) and the product
/// is computed in fixed point with 18 decimal places, so `1s × 2.3²` is
/// 5290ms, not 5289. The list stops once the delay reaches `max` (or the
/// factor is 1): later retries repeat its last entry. `Err(k)` when retry k
/// exceeds the broker's bound without a `max`; `Err(0)` when the list would
/// pass [`MAX_BACKOFF_RETRIES`] entries (a factor just above 1 with a huge
/// `max_attempts`).
fn backoff_delays(b: &RawBackoff, max_attempts: u32) -> Result<Vec<u64>, u32> {
    const SCALE: u128 = 1_000_000_000_000_000_000; // 10^18
    let retries = max_attempts.saturating_sub(1).max(1);
    let cap = b.max.unwrap_or(MAX_MILLIS);
    let (num, den) = decimal_ratio(b.factor);
    // value = base × factor^(k-1), in units of 10^-18 ms.
    let mut value: Option<u128> = Some(u128::from(b.base) * SCALE);
    let mut out: Vec<u64> = Vec::new();
    for k in 1..=retries {
        let whole = value.map(|v| v / SCALE);
        let d = match whole {
            Some(w) if w < u128::from(cap) => w as u64,
            _ => {
                if b.max.is_none() && whole.is_none_or(|w| w > u128::from(MAX_MILLIS)) {
                    return Err(k);
                }
                cap
            }
        };
        out.push(d);
        if d == cap || num == den {
            break;
        }
        if out.len() >= MAX_BACKOFF_RETRIES {
            return Err(0);
        }
        value = value.and_then(|v| v.checked_mul(num)).map(|v| v / den);
    }
    Ok(out)
}

/// The most retries a backoff may expand to before its delays stop growing.
const MAX_BACKOFF_RETRIES: usize = 1_000_000;

/// The factor as the decimal fraction it was written as: its shortest
/// decimal form (Rust prints floats as the shortest string that reads back
/// the same), at most 9 decimal places.
fn decimal_ratio(factor: f64) -> (u128, u128) {
    let text = format!("{factor}");
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let frac = &frac[..frac.len().min(9)];
    let den = 10u128.pow(frac.len() as u32);
    let num = format!("{int}{frac}")
        .parse::<u128>()
        .unwrap_or(u128::MAX / 2);
    (num, den)
}
