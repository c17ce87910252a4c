//! Between the worker and a handler.
//!
//! - [`message`]: one delivery as a handler sees it.
//! - [`outcome`]: what a handler says about it.
//! - [`jsonl`]: the JSON-lines protocol with a long-running handler
//!   process.

pub mod jsonl;
pub mod message;
pub mod outcome;
