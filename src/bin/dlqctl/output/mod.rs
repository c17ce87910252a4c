//! What the commands show: one renderer per output kind. Logic never
//! prints; commands hand typed reports to these.

pub mod json;
pub mod text;
