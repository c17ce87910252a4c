//! What `provision` and `provision --check` find about the objects a
//! topology declares.
//!
//! - [`finding`]: one finding about one object.
//! - [`drift`]: reading the broker's refusals: which argument differs.
//! - [`policy`]: what a policy changes in a planned queue.
//! - [`stale`]: objects with dlqctl's names the topology no longer has.

pub mod drift;
pub mod finding;
pub mod policy;
pub mod stale;
