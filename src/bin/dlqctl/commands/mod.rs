//! One file per command: each parses nothing and decides nothing of its
//! own; it calls the library and hands the report to `output`.

pub mod provision;
pub mod status;
pub mod validate;
pub mod work;

use dlqctl::core::topology::{parse_topology, Topology};
use dlqctl::error::Error;
use std::path::Path;

/// Reads and validates a topology file.
pub fn load(path: &Path) -> Result<Topology, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })?;
    Ok(parse_topology(&text, &path.display().to_string())?)
}
