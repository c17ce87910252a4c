//! Names: pipeline names are unique, and every queue and exchange name,
//! generated ones included, is valid and names one object only.

use crate::topology::model::*;
use crate::topology::yaml::{Node, Pos, Value};
use std::collections::{BTreeMap, HashMap};

use super::read::Cx;

impl Cx {
    /// Pipeline names are unique, whether or not the rest of each pipeline
    /// is valid.
    pub(super) fn check_duplicate_names(&mut self, items: &[Node]) {
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
    pub(super) fn check_names(&mut self, pipelines: &[Pipeline], name_pos: &[Pos]) {
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
                    format!("retry queue {}", crate::values::duration::tier_name(d)),
                )
            }));
            qs.push((p.dead_letter.queue.clone(), "dead-letter queue".to_string()));
            if p.dead_letter.redrive.is_some() {
                qs.push((p.redrive_state_queue(), "redrive-state queue".to_string()));
            }
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
