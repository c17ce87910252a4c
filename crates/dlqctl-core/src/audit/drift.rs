//! Reading the broker's 406 PRECONDITION_FAILED texts: which argument of an
//! existing object differs and what the broker holds. Pure; the shell uses it
//! to list every difference by redeclaring with the broker's value
//! substituted (rabbitmq-facts.md, "Checking without creating").

use crate::audit::finding::{Finding, ObjectKind};
use crate::topology::plan::{ExchangeSpec, QueueSpec};
use crate::topology::{ArgValue, Arguments};

/// The broker's side of one argument, as its error text describes it.
#[derive(Debug, Clone, PartialEq)]
pub enum BrokerValue {
    /// The object has no such argument.
    Absent,
    /// A value with its AMQP type name (`signedint`, `longstr`, ...).
    Typed {
        /// The value as printed.
        text: String,
        /// The broker's type name.
        type_name: String,
    },
    /// A value printed without its type (`current is '1000'`).
    Untyped(String),
}

/// One difference the broker reported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Inequivalence {
    /// The argument (`x-message-ttl`, `type`, `durable`, ...).
    pub argument: String,
    /// What the broker holds.
    pub current: BrokerValue,
}

/// Parses `inequivalent arg 'K' for queue 'Q' in vhost '/': received X but
/// current is Y`, X and Y being `'v'`, `none` or `the value 'v' of type 't'`.
pub(crate) fn parse_inequivalent(text: &str) -> Option<Inequivalence> {
    let rest = &text[text.find("inequivalent arg '")? + "inequivalent arg '".len()..];
    let end = rest.find("' for ")?;
    let argument = rest[..end].to_string();
    let marker = " but current is ";
    let cur = &rest[rest.rfind(marker)? + marker.len()..];
    Some(Inequivalence {
        argument,
        current: parse_side(cur.trim_end())?,
    })
}

fn parse_side(s: &str) -> Option<BrokerValue> {
    if s == "none" {
        return Some(BrokerValue::Absent);
    }
    if let Some(body) = s.strip_prefix("the value '") {
        let split = body.rfind("' of type '")?;
        let text = body[..split].to_string();
        let type_name = body[split + "' of type '".len()..]
            .strip_suffix('\'')?
            .to_string();
        return Some(BrokerValue::Typed { text, type_name });
    }
    let inner = s.strip_prefix('\'')?.strip_suffix('\'')?;
    Some(BrokerValue::Untyped(inner.to_string()))
}

/// The value to substitute for `wanted` so that a redeclare matches the
/// broker on this argument. `None` when it cannot be expressed (an unknown
/// type), or when it would repeat `wanted` (the texts print a string "1000"
/// and an integer 1000 alike: then the other type is tried).
pub(crate) fn substitute(
    wanted: Option<&ArgValue>,
    current: &BrokerValue,
) -> Option<Option<ArgValue>> {
    let v = match current {
        BrokerValue::Absent => return Some(None),
        BrokerValue::Typed { text, type_name } => match type_name.as_str() {
            "signedint" | "long" | "short" | "byte" | "unsignedbyte" | "unsignedshort"
            | "unsignedint" => ArgValue::Int(text.parse().ok()?),
            "longstr" | "shortstr" => ArgValue::Str(text.clone()),
            "bool" => ArgValue::Bool(text.parse().ok()?),
            _ => return None,
        },
        BrokerValue::Untyped(text) => {
            let as_wanted_type = match wanted {
                Some(ArgValue::Int(_)) => text.parse().ok().map(ArgValue::Int),
                Some(ArgValue::Bool(_)) => text.parse().ok().map(ArgValue::Bool),
                _ => Some(ArgValue::Str(text.clone())),
            };
            match as_wanted_type {
                Some(v) if Some(&v) != wanted => v,
                // Same text, other type: an integer against a string or back.
                _ => match wanted {
                    Some(ArgValue::Str(_)) => ArgValue::Int(text.parse().ok()?),
                    _ => ArgValue::Str(text.clone()),
                },
            }
        }
    };
    Some(Some(v))
}

/// How a broker value reads in a report: `1000`, `"classic"`, `none`.
pub fn describe(current: &BrokerValue) -> String {
    match current {
        BrokerValue::Absent => "none".to_string(),
        BrokerValue::Typed { text, type_name } => match type_name.as_str() {
            "longstr" | "shortstr" => format!("{text:?}"),
            _ => text.clone(),
        },
        BrokerValue::Untyped(t) => t.clone(),
    }
}

// ---------------------------------------------------------------------------
// The drift search, one refusal at a time

/// What a declaration says about an exchange or queue; the drift search
/// substitutes the broker's values into it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// The exchange type; `None` for a queue.
    pub kind: Option<String>,
    /// The `x-` arguments.
    pub arguments: Arguments,
    /// Durable.
    pub durable: bool,
    /// Auto-delete.
    pub auto_delete: bool,
    /// Internal (exchanges).
    pub internal: bool,
    /// Exclusive (queues).
    pub exclusive: bool,
}

impl Shape {
    /// The shape the plan wants for an exchange.
    pub fn exchange(e: &ExchangeSpec) -> Self {
        Shape {
            kind: Some(e.kind.as_str().to_string()),
            arguments: Arguments::new(),
            durable: true,
            auto_delete: false,
            internal: false,
            exclusive: false,
        }
    }

    /// The shape the plan wants for a queue.
    pub fn queue(q: &QueueSpec) -> Self {
        Shape {
            kind: None,
            arguments: q.arguments.clone(),
            durable: true,
            auto_delete: false,
            internal: false,
            exclusive: false,
        }
    }

    fn flag(&mut self, name: &str) -> Option<&mut bool> {
        match name {
            "durable" => Some(&mut self.durable),
            "auto_delete" => Some(&mut self.auto_delete),
            "internal" => Some(&mut self.internal),
            "exclusive" => Some(&mut self.exclusive),
            _ => None,
        }
    }
}

fn show(v: Option<&ArgValue>) -> String {
    v.map(ToString::to_string).unwrap_or_else(|| "none".into())
}

fn push_diff(
    out: &mut Vec<Finding>,
    object: ObjectKind,
    name: &str,
    arg: &str,
    wanted: String,
    actual: String,
) {
    // A string/integer switch names the same argument twice: keep the first.
    let seen = out
        .iter()
        .any(|f| matches!(f, Finding::Differs { argument, .. } if argument == arg));
    if !seen {
        out.push(Finding::Differs {
            object,
            name: name.to_string(),
            argument: arg.to_string(),
            wanted,
            actual,
        });
    }
}

/// What one 406 told the drift search.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeStep {
    /// A difference was recorded and the probe now carries the broker's
    /// value: declare it again to find the next difference.
    Next,
    /// The refusal was not an "inequivalent arg" text this search can read.
    Unreadable,
    /// The broker's value cannot be sent back (a type dlqctl does not send):
    /// the search stops here, with this finding recorded.
    Stuck,
}

/// The "406 text → next probe" step of the drift search
/// (rabbitmq-facts.md, "Checking without creating"): reads the broker's
/// refusal of `probe`, records the named difference against `wanted` in
/// `out` (once per argument), and substitutes the broker's value into
/// `probe` so that the next declaration gets past it.
pub fn next_probe(
    wanted: &Shape,
    probe: &mut Shape,
    object: ObjectKind,
    name: &str,
    text: &str,
    out: &mut Vec<Finding>,
) -> ProbeStep {
    let Some(ineq) = parse_inequivalent(text) else {
        return ProbeStep::Unreadable;
    };
    let arg = ineq.argument.clone();
    let actual = describe(&ineq.current);
    let progressed = if arg == "type" && object == ObjectKind::Exchange {
        let w = wanted.kind.clone().unwrap_or_default();
        push_diff(out, object, name, &arg, w, actual.clone());
        let new = Some(actual.trim_matches('"').to_string());
        let changed = probe.kind != new;
        probe.kind = new;
        changed
    } else if let Some(flag) = probe.flag(&arg) {
        let w = match arg.as_str() {
            "durable" => wanted.durable,
            "auto_delete" => wanted.auto_delete,
            "internal" => wanted.internal,
            _ => wanted.exclusive,
        };
        push_diff(out, object, name, &arg, w.to_string(), actual.clone());
        let new = actual == "true";
        let changed = *flag != new;
        *flag = new;
        changed
    } else {
        let sub = substitute(probe.arguments.get(&arg), &ineq.current);
        // Shown with its type where known: the string "1000" and the
        // integer 1000 print alike in the broker's text.
        let shown = match &sub {
            Some(v) => show(v.as_ref()),
            None => actual.clone(),
        };
        push_diff(
            out,
            object,
            name,
            &arg,
            show(wanted.arguments.get(&arg)),
            shown,
        );
        match sub {
            Some(Some(v)) => {
                let changed = probe.arguments.get(&arg) != Some(&v);
                probe.arguments.insert(arg.clone(), v);
                changed
            }
            Some(None) => probe.arguments.remove(&arg).is_some(),
            None => false,
        }
    };
    if progressed {
        return ProbeStep::Next;
    }
    out.push(Finding::Failed {
        object,
        name: name.to_string(),
        message: format!(
            "cannot list further differences after `{arg}` (broker has {actual} of a type dlqctl does not send)"
        ),
        reply_code: None,
    });
    ProbeStep::Stuck
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "PRECONDITION_FAILED - ";

    #[test]
    fn reads_the_three_forms_of_the_broker_text() {
        let e = parse_inequivalent(&format!("{P}inequivalent arg 'x-message-ttl' for queue 'Q' in vhost '/': received '2000' but current is '1000'")).unwrap();
        assert_eq!(e.argument, "x-message-ttl");
        assert_eq!(e.current, BrokerValue::Untyped("1000".into()));

        let e = parse_inequivalent(&format!("{P}inequivalent arg 'x-message-ttl' for queue 'Q' in vhost '/': received none but current is the value '1000' of type 'signedint'")).unwrap();
        assert_eq!(
            e.current,
            BrokerValue::Typed {
                text: "1000".into(),
                type_name: "signedint".into()
            }
        );

        let e = parse_inequivalent(&format!("{P}inequivalent arg 'x-max-length' for queue 'Q' in vhost '/': received the value '600000' of type 'signedint' but current is none")).unwrap();
        assert_eq!(e.argument, "x-max-length");
        assert_eq!(e.current, BrokerValue::Absent);

        let e = parse_inequivalent(&format!("{P}inequivalent arg 'type' for exchange 'X' in vhost '/': received 'fanout' but current is 'direct'")).unwrap();
        assert_eq!(e.argument, "type");
        assert_eq!(e.current, BrokerValue::Untyped("direct".into()));
    }

    #[test]
    fn names_with_quotes_and_odd_vhosts_still_parse() {
        let e = parse_inequivalent("inequivalent arg 'x-queue-type' for queue 'it's: received' in vhost 'a but current is b': received 'quorum' but current is 'classic'").unwrap();
        assert_eq!(e.argument, "x-queue-type");
        assert_eq!(e.current, BrokerValue::Untyped("classic".into()));
    }

    #[test]
    fn other_texts_are_not_inequivalences() {
        assert_eq!(
            parse_inequivalent("NOT_FOUND - no queue 'X' in vhost '/'"),
            None
        );
        assert_eq!(parse_inequivalent(""), None);
        assert_eq!(parse_inequivalent("inequivalent arg 'x' for queue"), None);
        assert_eq!(
            parse_inequivalent(
                "inequivalent arg 'x' for queue 'q': received 'a' but current is garbage"
            ),
            None
        );
    }

    #[test]
    fn substitutes_the_brokers_value_with_the_right_type() {
        let i = |v| Some(ArgValue::Int(v));
        let s = |v: &str| Some(ArgValue::Str(v.into()));
        assert_eq!(
            substitute(i(2000).as_ref(), &BrokerValue::Untyped("1000".into())),
            Some(i(1000))
        );
        assert_eq!(
            substitute(
                s("quorum").as_ref(),
                &BrokerValue::Untyped("classic".into())
            ),
            Some(s("classic"))
        );
        assert_eq!(substitute(i(5).as_ref(), &BrokerValue::Absent), Some(None));
        let typed = |t: &str, ty: &str| BrokerValue::Typed {
            text: t.into(),
            type_name: ty.into(),
        };
        assert_eq!(substitute(None, &typed("1000", "signedint")), Some(i(1000)));
        assert_eq!(substitute(None, &typed("1000", "long")), Some(i(1000)));
        assert_eq!(
            substitute(None, &typed("drop-head", "longstr")),
            Some(s("drop-head"))
        );
        assert_eq!(
            substitute(None, &typed("true", "bool")),
            Some(Some(ArgValue::Bool(true)))
        );
        assert_eq!(substitute(None, &typed("1.5", "double")), None);
        assert_eq!(substitute(None, &typed("x", "signedint")), None);
    }

    #[test]
    fn a_string_and_an_integer_that_print_alike_switch_type() {
        // We sent the integer 1000, the broker holds the string "1000".
        assert_eq!(
            substitute(
                Some(&ArgValue::Int(1000)),
                &BrokerValue::Untyped("1000".into())
            ),
            Some(Some(ArgValue::Str("1000".into())))
        );
        // We sent the string, the broker holds the integer.
        assert_eq!(
            substitute(
                Some(&ArgValue::Str("1000".into())),
                &BrokerValue::Untyped("1000".into())
            ),
            Some(Some(ArgValue::Int(1000)))
        );
    }

    #[test]
    fn describes_values_for_reports() {
        assert_eq!(describe(&BrokerValue::Absent), "none");
        assert_eq!(describe(&BrokerValue::Untyped("1000".into())), "1000");
        assert_eq!(
            describe(&BrokerValue::Typed {
                text: "x".into(),
                type_name: "longstr".into()
            }),
            "\"x\""
        );
    }
}
