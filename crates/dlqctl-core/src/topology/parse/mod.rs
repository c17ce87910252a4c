//! From YAML text to a valid [`Topology`](super::Topology), collecting
//! every problem, one file per part of the topology file:
//!
//! - `read`: the reader (it collects problems) and its scalars;
//! - `file`: the whole file: `version`, `defaults`, `pipelines`;
//! - `settings`: what a pipeline and `defaults` share (`retry`,
//!   `dead_letter`, `circuit_breaker`, ...);
//! - `pipeline`: one pipeline, its settings applied over the defaults;
//! - `exchange`: a producers' exchange and its bindings;
//! - `redrive`: `dead_letter.redrive`, the automatic redrive policy;
//! - `idempotency`: idempotent handling (key, store, keep);
//! - `arguments`: a main queue's extra arguments;
//! - `names`: the names of every queue and exchange.

mod arguments;
mod exchange;
mod file;
mod idempotency;
mod names;
mod pipeline;
mod read;
mod redrive;
mod settings;

pub use file::{parse_topology, parse_topology_with, Invalid};
pub use read::{Problem, UrlCheck};
