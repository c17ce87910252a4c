//! The topology file: model, parsing with positions, validation, and the
//! plan of broker objects it generates.

mod model;
mod parse;
pub mod plan;
pub mod source;
pub(crate) mod yaml;

pub use model::*;
pub use parse::{parse_topology, parse_topology_with, Invalid, Problem, UrlCheck};
pub use plan::{plan, Plan};
#[cfg(test)]
mod tests;
