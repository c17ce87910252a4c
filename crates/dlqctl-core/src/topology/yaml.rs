//! A YAML document as a tree of nodes that remember where they stand, so
//! that validation can report every problem with its line and column
//! instead of stopping at the first one, as a typed `Deserialize` would.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::fmt;

/// A line and column in the topology file (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pos {
    /// 1-based line.
    pub line: u64,
    /// 1-based column.
    pub column: u64,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A YAML node and its position.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Where the node starts.
    pub pos: Pos,
    /// What it holds.
    pub value: Value,
}

/// The value of a YAML node.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `~`, `null`, or an empty value.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer that fits in i64.
    Int(i64),
    /// An unsigned integer above i64::MAX.
    BigInt(u64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in file order. Keys are strings (others are rendered).
    Map(Vec<(Key, Node)>),
}

/// A mapping key and its position.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// Where the key starts.
    pub pos: Pos,
    /// The key as text.
    pub name: String,
}

impl Value {
    /// What kind of value this is, for messages: "a string", "a list", ...
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) | Value::BigInt(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

fn pos_of<T>(s: &Spanned<T>) -> Pos {
    Pos {
        line: s.referenced.line(),
        column: s.referenced.column(),
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Spanned::<Value>::deserialize(d)?;
        Ok(Node {
            pos: pos_of(&s),
            value: s.value,
        })
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Spanned::<KeyText>::deserialize(d)?;
        Ok(Key {
            pos: pos_of(&s),
            name: s.value.0,
        })
    }
}

struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Ok(KeyText(match v {
            Value::Str(s) => s,
            Value::Null => "~".to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::BigInt(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Seq(_) => "[...]".to_string(),
            Value::Map(_) => "{...}".to_string(),
        }))
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => Value::Int(i),
            Err(_) => match u64::try_from(v) {
                Ok(u) => Value::BigInt(u),
                Err(_) => Value::Str(v.to_string()),
            },
        })
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => Value::Int(i),
            Err(_) => Value::BigInt(v),
        })
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        Ok(match u64::try_from(v) {
            Ok(u) => return self.visit_u64(u),
            Err(_) => Value::Str(v.to_string()),
        })
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(n) = seq.next_element::<Node>()? {
            items.push(n);
        }
        Ok(Value::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<Key, Node>()? {
            entries.push((k, v));
        }
        Ok(Value::Map(entries))
    }
}

/// A YAML syntax error with its position when the parser knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    /// Where, if known.
    pub pos: Option<Pos>,
    /// The parser's message, without a source snippet.
    pub message: String,
}

/// Parses a YAML document into a tree of positioned nodes.
pub fn parse(text: &str) -> Result<Node, SyntaxError> {
    if text.trim().is_empty() {
        return Ok(Node {
            pos: Pos { line: 1, column: 1 },
            value: Value::Null,
        });
    }
    // YAML 1.2 booleans only: `yes`, `no`, `on`, `off`, `y`, `n` stay
    // strings (a binding argument `n: 3` or a routing key `on` must not
    // turn into a boolean).
    let options = serde_saphyr::options! { strict_booleans: true };
    serde_saphyr::from_str_with_options::<Node>(text, options).map_err(|e| {
        let pos = e.location().map(|l| Pos {
            line: l.line(),
            column: l.column(),
        });
        // The breach may come wrapped in where an alias was used.
        let mut root = &e;
        while let serde_saphyr::Error::AliasError { error, .. }
        | serde_saphyr::Error::WithSnippet { error, .. } = root
        {
            root = error;
        }
        let message = match root {
            serde_saphyr::Error::Budget { breach, .. } => budget_message(breach),
            _ => clean_message(&e.without_snippet().to_string()),
        };
        SyntaxError { pos, message }
    })
}

/// What a breached parser limit means for a topology file, in words.
fn budget_message(breach: &serde_saphyr::budget::BudgetBreach) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    let (what, n) = match breach {
        B::Nodes { nodes } => ("YAML nodes", nodes.to_string()),
        B::Events { events } => ("YAML events", events.to_string()),
        B::Aliases { aliases } => ("aliases (`*name`)", aliases.to_string()),
        B::Anchors { anchors } => ("anchors (`&name`)", anchors.to_string()),
        B::Depth { depth } => ("levels of nesting", depth.to_string()),
        B::Documents { documents } => ("YAML documents", documents.to_string()),
        B::ScalarBytes { total_scalar_bytes } => {
            ("bytes of values", total_scalar_bytes.to_string())
        }
        B::MergeKeys { merge_keys } => ("merge keys (`<<`)", merge_keys.to_string()),
        _ => ("of something the parser bounds", "its limit".to_string()),
    };
    format!(
        "the file goes past the YAML parser's safety limit: more than {n} {what}. \
         A topology file stays far below it; look for aliases that repeat large blocks \
         (an alias bomb) or runaway nesting, and write the pipelines out plainly"
    )
}

/// The parser's message without its advice to library users and without the
/// position, which dlqctl prints in front.
fn clean_message(raw: &str) -> String {
    let mut m = raw.replace(", set DuplicateKeyPolicy in Options if acceptable", "");
    if let Some(i) = m.rfind(" at line ") {
        if m[i..].contains(", column ") {
            m.truncate(i);
        }
    }
    m.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alias_bomb_is_named_in_words_not_as_a_debug_dump() {
        let mut text = String::from("a0: &a0 [x,x,x,x,x,x,x,x,x,x]\n");
        for i in 1..12 {
            let refs = vec![format!("*a{}", i - 1); 10].join(",");
            text += &format!("a{i}: &a{i} [{refs}]\n");
        }
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("safety limit"), "{}", e.message);
        assert!(e.message.contains("alias bomb"), "{}", e.message);
        assert!(!e.message.contains('{'), "a Debug dump: {}", e.message);
    }

    #[test]
    fn nodes_carry_line_and_column() {
        let n = parse("a: 1\nb:\n  - x\n  - {c: true}\n").unwrap();
        let Value::Map(m) = &n.value else {
            panic!("not a map: {n:?}")
        };
        assert_eq!(m[0].0.name, "a");
        assert_eq!(m[0].0.pos, Pos { line: 1, column: 1 });
        assert_eq!(m[0].1.value, Value::Int(1));
        assert_eq!(m[0].1.pos, Pos { line: 1, column: 4 });
        let Value::Seq(s) = &m[1].1.value else {
            panic!()
        };
        assert_eq!(s[0].pos, Pos { line: 3, column: 5 });
        let Value::Map(inner) = &s[1].value else {
            panic!()
        };
        assert_eq!(inner[0].0.pos, Pos { line: 4, column: 6 });
        assert_eq!(inner[0].1.value, Value::Bool(true));
    }

    #[test]
    fn syntax_errors_have_a_position() {
        let e = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(e.pos.is_some(), "{e:?}");
        let e = parse("a: 1\na: 2\n").unwrap_err();
        assert_eq!(e.message, "duplicate mapping key: a");
        assert_eq!(e.pos, Some(Pos { line: 2, column: 1 }));
    }

    #[test]
    fn scalars_keep_their_types() {
        let n = parse("[1, -2, 1.5, yes, true, '1', ~, 18446744073709551615, n, off]").unwrap();
        let Value::Seq(s) = n.value else { panic!() };
        let v: Vec<_> = s.into_iter().map(|n| n.value).collect();
        assert_eq!(v[0], Value::Int(1));
        assert_eq!(v[1], Value::Int(-2));
        assert_eq!(v[2], Value::Float(1.5));
        assert_eq!(v[4], Value::Bool(true));
        assert_eq!(v[5], Value::Str("1".into()));
        assert_eq!(v[6], Value::Null);
        assert_eq!(v[7], Value::BigInt(u64::MAX));
        // YAML 1.2: the 1.1 spellings are strings, not booleans.
        assert_eq!(v[3], Value::Str("yes".into()));
        assert_eq!(v[8], Value::Str("n".into()));
        assert_eq!(v[9], Value::Str("off".into()));
    }
}
