//! The pure core: the topology model and its validation, the provisioning
//! plan, the reading of the broker's refusals, attempts, decisions, jitter
//! and the properties of copies; for the DLQ commands, the description and
//! grouping of a dead-lettered message, the selectors, the rate, the replay
//! and rotation copies and the export line; what a policy changes in a
//! planned queue; the GitHub Actions annotations of a check's findings.
//!
//! Nothing here does I/O: no async runtime, no files, no sockets, no clock
//! and no random numbers (the current time and random draws are
//! parameters), so every rule is unit tested without a broker.

pub mod backoff;
pub mod body_view;
pub mod breaker;
pub mod confirm;
pub mod dlq;
pub mod drift;
pub mod duration;
pub mod export;
pub mod finding;
pub mod fingerprint;
pub mod github;
pub mod history;
pub mod jsonl;
pub mod message;
pub mod outcome;
pub mod policy;
pub mod rate;
pub mod replay;
pub mod retry;
pub mod select;
pub mod shortstr;
pub mod stale;
pub mod text;
pub mod topology;
pub mod web_guard;
