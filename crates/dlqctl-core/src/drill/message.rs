//! Drill messages (`dlqctl drill`): a synthetic message that walks the
//! live failure path and must never reach user code.
//!
//! A message is a drill when it carries the header [`DRILL_HEADER`] (any
//! value; `dlqctl drill` writes its run id). The worker never runs the
//! handler for it:
//!
//! - delivered fresh or back from a tier, it fails it as transient, so it
//!   visits every tier in turn and is dead-lettered as `exhausted`, with
//!   all of dlqctl's headers; its retry copies carry a short per-message
//!   `expiration` (`DRILL_EXPIRATION_MS`) instead of the jitter, so a
//!   drill through tiers of 10 minutes does not wait 10 minutes (it still
//!   goes through each tier queue, its TTL dead-lettering and its route
//!   back; behind older messages of a busy tier it waits for them, as
//!   expired messages leave from the head only);
//! - replayed (it carries [`REPLAYED_HEADER`]) or redriven
//!   ([`REDRIVEN_HEADER`]: the redrive leaves drill messages alone now, but
//!   one an older version moved may still come), it acks it.

use amq_protocol::types::FieldTable;

use crate::wire::{has, DRILL_HEADER, REDRIVEN_HEADER, REPLAYED_HEADER};

/// The `expiration` of a drill message's retry copies, in milliseconds.
pub(crate) const DRILL_EXPIRATION_MS: u64 = 200;

/// The error a drill message's failures record.
pub const DRILL_ERROR: &str =
    "dlqctl drill: failed on purpose (the handler is never run for a drill message)";

/// What the worker does with a drill message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrillStep {
    /// Fail it as transient, without the handler.
    Fail,
    /// Ack it, without the handler: the drill replayed it.
    AckReplayed,
}

/// The drill step of a message with these headers; `None` for a message
/// that is not a drill.
pub fn drill_step(headers: Option<&FieldTable>) -> Option<DrillStep> {
    if !has(headers, DRILL_HEADER) {
        return None;
    }
    Some(
        if has(headers, REPLAYED_HEADER) || has(headers, REDRIVEN_HEADER) {
            DrillStep::AckReplayed
        } else {
            DrillStep::Fail
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handling::outcome::Outcome;
    use crate::retry::Run;
    use amq_protocol::types::{AMQPValue, LongString};

    fn drill_run(step: DrillStep, attempt: u32, max_attempts: u32) -> Run {
        Run::drill(step, attempt, max_attempts)
    }

    fn headers(keys: &[&str]) -> FieldTable {
        let mut t = FieldTable::default();
        for k in keys {
            t.insert((*k).into(), AMQPValue::LongString(LongString::from("x")));
        }
        t
    }

    #[test]
    fn only_a_message_with_the_drill_header_is_a_drill() {
        assert_eq!(drill_step(None), None);
        assert_eq!(drill_step(Some(&headers(&[]))), None);
        let near = format!("{DRILL_HEADER}x");
        assert_eq!(drill_step(Some(&headers(&[near.as_str()]))), None);
        assert_eq!(drill_step(Some(&headers(&[REPLAYED_HEADER]))), None);
        assert_eq!(
            drill_step(Some(&headers(&[DRILL_HEADER]))),
            Some(DrillStep::Fail)
        );
        assert_eq!(
            drill_step(Some(&headers(&[DRILL_HEADER, REPLAYED_HEADER]))),
            Some(DrillStep::AckReplayed)
        );
        // Moved back by an automatic redrive: acked too, never failed again.
        assert_eq!(
            drill_step(Some(&headers(&[DRILL_HEADER, REDRIVEN_HEADER]))),
            Some(DrillStep::AckReplayed)
        );
        assert_eq!(drill_step(Some(&headers(&[REDRIVEN_HEADER]))), None);
    }

    #[test]
    fn a_drill_fails_transiently_until_its_attempts_are_used_up_and_a_replay_is_acked() {
        assert_eq!(
            drill_run(DrillStep::Fail, 1, 3),
            Run::Ran(Outcome::transient(DRILL_ERROR))
        );
        assert_eq!(
            drill_run(DrillStep::Fail, 3, 3),
            Run::Ran(Outcome::transient(DRILL_ERROR))
        );
        assert_eq!(drill_run(DrillStep::Fail, 4, 3), Run::spent(4, 3));
        assert_eq!(
            drill_run(DrillStep::AckReplayed, 9, 3),
            Run::Ran(Outcome::Success)
        );
    }
}
