//! `dlqctl drill`, the pure part: what marks a drill message and what the
//! worker does with it ([`message`]), and what a drill expects of a
//! pipeline, its timeline and its verdicts ([`timeline`]). The shell
//! publishes, watches and cleans up (`crate::ops::drill`); the worker asks
//! [`message::drill_step`] of every delivery.

pub mod message;
pub mod timeline;
