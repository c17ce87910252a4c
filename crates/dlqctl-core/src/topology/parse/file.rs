//! The whole file: `version`, `defaults`, `pipelines`, and the list of
//! problems it comes back with.

use crate::topology::model::*;
use crate::topology::yaml;
use crate::topology::yaml::{Node, Pos, Value};
use std::fmt;

use super::read::{Cx, Problem, UrlCheck};
use super::settings::{RawSettings, SETTINGS_KEYS};

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

/// Parses and validates a topology file's text. `file` names it in errors.
/// Its URLs are checked for their form only: the library's
/// `parse_topology` (and `load_topology`) also parse them as their
/// clients will ([`parse_topology_with`]).
pub fn parse_topology(text: &str, file: &str) -> Result<Topology, Invalid> {
    parse(text, file, None)
}

/// [`parse_topology`], with every URL of the file also checked by `urls`
/// (the parsers of the clients that will use them), each refusal at the
/// URL's line and column.
pub fn parse_topology_with(
    text: &str,
    file: &str,
    urls: &'static dyn UrlCheck,
) -> Result<Topology, Invalid> {
    parse(text, file, Some(urls))
}

fn parse(text: &str, file: &str, urls: Option<&'static dyn UrlCheck>) -> Result<Topology, Invalid> {
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
    let mut cx = Cx {
        urls,
        ..Cx::default()
    };
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

impl Cx {
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
}
