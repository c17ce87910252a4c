//! The settle decision for one delivery, as data.
//!
//! After the handler ran (or could not), the worker asks [`settle`] what
//! to do with the delivery and gets a [`Plan`]: a [`Settlement`] (ack;
//! publish a retry copy to a tier, then ack; publish a dead-letter copy,
//! then ack; nack it for the broker's DLX; or leave it unacked for the
//! broker to requeue) and the [`Note`]s worth a log line. Each variant
//! carries what the worker needs to carry it out: the copy's exchange,
//! routing key and properties, the reason. When the publish of a copy
//! ends otherwise than confirmed, [`Settlement::after_publish`] says what
//! is done instead.
//!
//! Pure, like the rest of [`super`]: the time and the jitter's random
//! number are parameters.

use amq_protocol::protocol::BasicProperties;

use super::copy::{dead_letter_copy, retry_copy, CopyContext};
use super::decision::{decide, DeadLetterReason, Decision};
use super::fit::{
    fit_dead_letter_copy, fit_retry_copy, properties_size, retry_budget, TooLarge, Trimmed,
};
use super::jitter::jitter_expiration;
use crate::handling::outcome::Outcome;
use crate::topology::{Pipeline, QueueType};
use crate::values::duration::tier_name;

/// How a dead-letter is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterMode {
    /// Publish a copy with the final diagnosis to the DLX, then ack.
    Republish,
    /// `basic.nack(requeue=false)`: the main queue's DLX moves the message
    /// (the final error is not recorded).
    Nack,
}

impl DeadLetterMode {
    /// The names the command line takes, in order.
    pub const NAMES: [&'static str; 2] = ["republish", "nack"];

    /// The mode of a command-line name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "republish" => Some(DeadLetterMode::Republish),
            "nack" => Some(DeadLetterMode::Nack),
            _ => None,
        }
    }
}

/// What came of the handler step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// The handler ran and returned this (a panic counts as a transient
    /// failure).
    Ran(Outcome),
    /// Not run: the message arrived with its attempts already used up
    /// (`max_attempts` was lowered, or another tool counted them). The
    /// outcome is the worker's own transient verdict, saying so.
    Spent(Outcome),
    /// The connection was lost while the handler ran: nothing can be
    /// settled on the delivery's channel, and the broker requeues the
    /// message by itself.
    Interrupted,
    /// Not run: its key is marked handled (idempotent handling).
    Duplicate,
    /// Not run: another run holds the lease on its key, for this long yet.
    Deferred {
        /// What is left of the lease, in ms.
        remaining_ms: u64,
    },
    /// Not run: the idempotency store did not answer, and no handler runs
    /// unguarded. The delivery is handed back.
    StoreUnavailable,
    /// Not run: its key is marked handled with another body, and the
    /// pipeline's `on_conflict` is `dead_letter` (`true`: dead-lettered as
    /// `key_conflict`) or `skip` (`false`: acked as a duplicate).
    KeyConflict {
        /// Dead-lettered rather than skipped.
        dead_letter: bool,
    },
}

impl Run {
    /// The verdict on a message delivered at `attempt` when only
    /// `max_attempts` runs are allowed (see [`Run::Spent`]).
    pub fn spent(attempt: u32, max_attempts: u32) -> Self {
        Run::Spent(Outcome::transient(format!(
            "attempts already used up ({} of {}) when delivered",
            attempt.saturating_sub(1),
            max_attempts
        )))
    }

    /// The worker's verdict on a drill message at `attempt` of
    /// `max_attempts`, in place of a handler run (see [`crate::drill::message`]).
    pub fn drill(step: crate::drill::message::DrillStep, attempt: u32, max_attempts: u32) -> Self {
        use crate::drill::message::{DrillStep, DRILL_ERROR};
        match step {
            DrillStep::AckReplayed => Run::Ran(Outcome::Success),
            DrillStep::Fail if attempt > max_attempts => Run::spent(attempt, max_attempts),
            DrillStep::Fail => Run::Ran(Outcome::transient(DRILL_ERROR)),
        }
    }

    /// The outcome, from the handler or the worker; none when no handler
    /// ran and no verdict was given (interrupted, a duplicate, deferred,
    /// the store unavailable).
    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Run::Ran(o) | Run::Spent(o) => Some(o),
            Run::Interrupted
            | Run::Duplicate
            | Run::Deferred { .. }
            | Run::StoreUnavailable
            | Run::KeyConflict { .. } => None,
        }
    }
}

/// The rules one worker settles by.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// The pipeline consumed: its retry policy, exchanges and queue type.
    pub pipeline: &'a Pipeline,
    /// How to dead-letter.
    pub dead_letter: DeadLetterMode,
    /// The connection's negotiated `frame_max`: every copy must fit it.
    pub frame_max: u32,
    /// The user the publishing connection authenticated as.
    pub connection_user: &'a str,
}

/// The delivery as the decision sees it.
#[derive(Debug, Clone, Copy)]
pub struct Delivered<'a> {
    /// Its properties, headers included.
    pub properties: &'a BasicProperties,
    /// The exchange it was delivered from.
    pub exchange: &'a str,
    /// The routing key it was delivered with.
    pub routing_key: &'a str,
    /// This run's number, 1 for the first (see [`super::count_attempt`]).
    pub attempt: u32,
    /// Its drill step, decided once from its headers when it arrived
    /// ([`crate::drill::message::drill_step`]); `None` for a message that is not a
    /// drill.
    pub drill: Option<crate::drill::message::DrillStep>,
}

/// A copy to publish, `mandatory` and persistent, before the original is
/// acked.
#[derive(Debug, Clone, PartialEq)]
pub struct Copy {
    /// Where to publish it.
    pub exchange: String,
    /// With this routing key.
    pub routing_key: String,
    /// Its properties (the body is the original's).
    pub properties: BasicProperties,
}

/// What the worker does with a delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// Ack: done.
    Ack {
        /// The handler succeeded on the message's first attempt.
        first_attempt: bool,
    },
    /// Publish `copy` to the retry tier of `delay_ms`, then ack.
    Retry {
        /// The tier (one of the policy's delays), in ms.
        delay_ms: u64,
        /// To the retry exchange, routing key the tier's name.
        copy: Copy,
    },
    /// Publish `copy` to the dead-letter exchange, then ack.
    DeadLetter {
        /// Why (also its `dlqctl-reason` header, unless trimmed).
        reason: DeadLetterReason,
        /// To the DLX, routing key the source queue.
        copy: Copy,
        /// A nack of the copy means the DLQ is full (quorum pipelines):
        /// fall back to [`Settlement::Nack`] instead of retrying it.
        nack_if_refused: bool,
    },
    /// `basic.nack(requeue=false)`: the main queue's DLX moves the message.
    Nack {
        /// Why it is dead-lettered: the planned dead-letter's reason, or
        /// `too_large` for a retry copy the broker refuses for its size.
        reason: DeadLetterReason,
        /// Why by nack rather than by a copy.
        cause: NackCause,
    },
    /// Ack without running the handler: its key is marked handled.
    Duplicate,
    /// Publish `copy` to the retry tier of `delay_ms`, then ack: another
    /// run holds the lease on its key. The attempt count is unchanged, and
    /// a refused copy is never dead-lettered (see [`Settlement::after_publish`]).
    Defer {
        /// The tier (the shortest that outlasts the lease), in ms.
        delay_ms: u64,
        /// To the retry exchange, routing key the tier's name.
        copy: Copy,
    },
    /// Leave the delivery unacked: the broker requeues it when its
    /// channel closes; or, for [`RequeueCause::handed_back`] causes, hand
    /// it back now with `basic.nack(requeue)`. Never done to retry a
    /// message, which would spin it at the head of the queue.
    Requeue {
        /// Why it cannot be settled now.
        cause: RequeueCause,
    },
}

/// Why a message is dead-lettered by nack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NackCause {
    /// `--dead-letter nack`.
    Chosen,
    /// A quorum pipeline's DLQ refused the copy: the broker's
    /// at-least-once dead-lettering holds the message (`messages_dlx`)
    /// until the DLQ has room.
    DlqFull,
    /// The broker refuses any copy of this message for its size (its
    /// `max_message_size`, lowered after the message was queued); its own
    /// dead-lettering does not check the size. The broker's refusal text.
    BrokerRefusesSize(String),
}

/// Why a delivery is left for the broker to requeue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequeueCause {
    /// The connection was lost while the handler ran.
    LostDuringRun,
    /// The delivery's channel closed while the broker refused the copy.
    ChannelClosed,
    /// The worker is stopping while the broker refused the copy.
    ShuttingDown,
    /// The idempotency store did not answer: handed back at once, and
    /// the consumer paused until the store answers.
    StoreUnavailable,
    /// The broker refused the copy and its [`super::Spare`] did not read
    /// back to publish it again: left unacked, like a closed channel's, so
    /// that no handler runs it again while the worker runs (a hand-back
    /// would run the handler again at each refusal).
    CopyNotRepeatable,
    /// The broker refuses a deferred copy for its size: handed back
    /// rather than dead-lettered (a deferral never dead-letters).
    DeferTooLarge,
}

impl RequeueCause {
    /// Handed back at once with `basic.nack(requeue)`, rather than left
    /// unacked until the channel closes.
    pub fn handed_back(self) -> bool {
        matches!(
            self,
            RequeueCause::StoreUnavailable | RequeueCause::DeferTooLarge
        )
    }
}

/// How the publish of a copy ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishEnd {
    /// The broker confirmed it and did not return it.
    Confirmed,
    /// The broker nacked it and the settlement asked to fall back
    /// ([`Settlement::DeadLetter::nack_if_refused`]).
    Nacked,
    /// The broker refuses it for its size; no retry can pass. Its text.
    TooLarge(String),
    /// The delivery's channel closed before the copy was confirmed.
    ChannelClosed,
    /// The worker is stopping before the copy was confirmed.
    ShuttingDown,
    /// The broker refused the copy, and it could not be read back from
    /// its [`super::Spare`] to publish it again.
    NotRepeatable,
}

/// What [`settle`] found worth a log line on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The retry copy was trimmed to fit `frame_max` with room for the
    /// broker's `x-death`.
    RetryTrimmed(Trimmed),
    /// The retry copy does not fit even trimmed: dead-lettered
    /// (`too_large`) instead.
    RetryTooLarge(TooLarge),
    /// `--dead-letter nack`, but the broker could not add `x-death`
    /// within `frame_max`: a copy is published instead.
    NackWouldNotFit,
    /// The dead-letter copy was trimmed to fit `frame_max`.
    DeadLetterTrimmed(Trimmed),
    /// The message's own properties leave no room for the delivery count
    /// a quorum DLQ adds: the copy is published as it is.
    DeadLetterUnfit(TooLarge),
}

/// A settlement and what is worth logging about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// What to do.
    pub settlement: Settlement,
    /// In the order they were found.
    pub notes: Vec<Note>,
}

impl Settlement {
    /// Every [`Settlement::label`], in variant order.
    pub const LABELS: [&'static str; 7] = [
        "ack",
        "retry",
        "dead_letter",
        "dead_letter_nack",
        "abandoned",
        "duplicate",
        "deferred",
    ];

    /// The `decision` of the logs and of `dlqctl_decisions_total`: `ack`,
    /// `retry`, `dead_letter`, `dead_letter_nack`, `abandoned`,
    /// `duplicate` or `deferred`.
    pub fn label(&self) -> &'static str {
        let i = match self {
            Settlement::Ack { .. } => 0,
            Settlement::Retry { .. } => 1,
            Settlement::DeadLetter { .. } => 2,
            Settlement::Nack { .. } => 3,
            Settlement::Requeue { .. } => 4,
            Settlement::Duplicate => 5,
            Settlement::Defer { .. } => 6,
        };
        Self::LABELS[i]
    }

    /// The copy to publish before the ack, if any.
    pub fn copy(&self) -> Option<&Copy> {
        match self {
            Settlement::Retry { copy, .. }
            | Settlement::DeadLetter { copy, .. }
            | Settlement::Defer { copy, .. } => Some(copy),
            _ => None,
        }
    }

    /// The copy to publish, for its publish to take the properties (see
    /// [`super::Spare`]); what is left of it is the plan's record.
    pub fn copy_mut(&mut self) -> Option<&mut Copy> {
        match self {
            Settlement::Retry { copy, .. }
            | Settlement::DeadLetter { copy, .. }
            | Settlement::Defer { copy, .. } => Some(copy),
            _ => None,
        }
    }

    /// See [`Settlement::DeadLetter::nack_if_refused`].
    pub fn nack_if_refused(&self) -> bool {
        matches!(
            self,
            Settlement::DeadLetter {
                nack_if_refused: true,
                ..
            }
        )
    }

    /// The retry tier's name (`10s`), for a retry or a deferral.
    pub fn tier(&self) -> Option<&str> {
        match self {
            Settlement::Retry { copy, .. } | Settlement::Defer { copy, .. } => {
                Some(&copy.routing_key)
            }
            _ => None,
        }
    }

    /// Why the message is dead-lettered, for a dead-letter.
    pub fn reason(&self) -> Option<DeadLetterReason> {
        match self {
            Settlement::DeadLetter { reason, .. } => Some(*reason),
            Settlement::Nack { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// What is done once the publish of this settlement's copy ended with
    /// `end`: the same settlement when confirmed (then ack); a nack for
    /// the broker's DLX when the DLQ is full (and the settlement asked for
    /// it) or the broker refuses the copy for its size (a retry's copy then
    /// counts as `too_large`); else the delivery
    /// stays unacked for the broker to requeue. A settlement without a
    /// copy is returned as it is.
    pub fn after_publish(self, end: PublishEnd) -> Settlement {
        if self.copy().is_none() {
            return self;
        }
        if let Settlement::Defer { .. } = self {
            // Never dead-lettered: what is not confirmed is handed back.
            return match end {
                PublishEnd::Confirmed => self,
                PublishEnd::TooLarge(_) => Settlement::Requeue {
                    cause: RequeueCause::DeferTooLarge,
                },
                PublishEnd::Nacked | PublishEnd::ChannelClosed => Settlement::Requeue {
                    cause: RequeueCause::ChannelClosed,
                },
                PublishEnd::ShuttingDown => Settlement::Requeue {
                    cause: RequeueCause::ShuttingDown,
                },
                PublishEnd::NotRepeatable => Settlement::Requeue {
                    cause: RequeueCause::CopyNotRepeatable,
                },
            };
        }
        // Only a retry has no reason yet: refused for its size, it is
        // dead-lettered as `too_large`, like a retry copy over frame_max.
        let reason = self.reason().unwrap_or(DeadLetterReason::TooLarge);
        match end {
            PublishEnd::Confirmed => self,
            PublishEnd::Nacked if self.nack_if_refused() => Settlement::Nack {
                reason,
                cause: NackCause::DlqFull,
            },
            // Not asked for: the copy is not known to be anywhere, so the
            // original must stay.
            PublishEnd::Nacked | PublishEnd::ChannelClosed => Settlement::Requeue {
                cause: RequeueCause::ChannelClosed,
            },
            PublishEnd::TooLarge(why) => Settlement::Nack {
                reason,
                cause: NackCause::BrokerRefusesSize(why),
            },
            PublishEnd::ShuttingDown => Settlement::Requeue {
                cause: RequeueCause::ShuttingDown,
            },
            PublishEnd::NotRepeatable => Settlement::Requeue {
                cause: RequeueCause::CopyNotRepeatable,
            },
        }
    }
}

/// Decides what to do with delivery `d` after `run`, following
/// docs/worker.md's table (see [`decide`]) and the dead-letter mode, and builds
/// the copy to publish, made to fit `frame_max` (see [`super::fit`]).
///
/// `now_unix_ms` is written into the copy's headers; `jitter_u`, uniform
/// in [0, 1), picks the retry copy's `expiration` (see
/// [`jitter_expiration`]).
pub fn settle(rules: &Rules, d: &Delivered, run: &Run, now_unix_ms: u64, jitter_u: f64) -> Plan {
    let mut notes = Vec::new();
    let (outcome, ran) = match run {
        Run::Ran(o) => (o, true),
        Run::Spent(o) => (o, false),
        Run::Interrupted => return requeue(RequeueCause::LostDuringRun),
        Run::StoreUnavailable => return requeue(RequeueCause::StoreUnavailable),
        Run::Duplicate | Run::KeyConflict { dead_letter: false } => {
            return Plan {
                settlement: Settlement::Duplicate,
                notes,
            }
        }
        Run::KeyConflict { dead_letter: true } => {
            let ctx = CopyContext {
                // No handler ran.
                attempt: d.attempt.saturating_sub(1),
                error: KEY_CONFLICT_ERROR,
                now_unix_ms,
                delivery_exchange: d.exchange,
                delivery_routing_key: d.routing_key,
                connection_user: rules.connection_user,
            };
            let reason = DeadLetterReason::KeyConflict;
            let settlement = dead_letter(rules, d, &ctx, reason, false, &mut notes);
            return Plan { settlement, notes };
        }
        Run::Deferred { remaining_ms } => {
            let settlement =
                defer(rules, d, *remaining_ms, jitter_u).unwrap_or(Settlement::Requeue {
                    cause: RequeueCause::DeferTooLarge,
                });
            return Plan { settlement, notes };
        }
    };
    let decision = if ran {
        decide(&rules.pipeline.retry, d.attempt, outcome)
    } else {
        Decision::DeadLetter {
            reason: DeadLetterReason::Exhausted,
        }
    };
    let error = outcome.error().unwrap_or("");
    let ctx = CopyContext {
        // The runs made: this one, if it ran.
        attempt: if ran {
            d.attempt
        } else {
            d.attempt.saturating_sub(1)
        },
        error,
        now_unix_ms,
        delivery_exchange: d.exchange,
        delivery_routing_key: d.routing_key,
        connection_user: rules.connection_user,
    };
    let settlement = match decision {
        Decision::Ack => Settlement::Ack {
            first_attempt: d.attempt == 1,
        },
        Decision::Retry { delay_ms } => {
            match retry(rules, d, &ctx, delay_ms, jitter_u, &mut notes) {
                Some(retry) => retry,
                None => dead_letter(rules, d, &ctx, DeadLetterReason::TooLarge, ran, &mut notes),
            }
        }
        Decision::DeadLetter { reason } => dead_letter(rules, d, &ctx, reason, ran, &mut notes),
    };
    Plan { settlement, notes }
}

/// The error a `key_conflict` dead-letter copy carries.
pub const KEY_CONFLICT_ERROR: &str =
    "its idempotency key is marked handled with another body (on_conflict: dead_letter): not run";

/// A plan to leave the delivery for the broker, or hand it back.
fn requeue(cause: RequeueCause) -> Plan {
    Plan {
        settlement: Settlement::Requeue { cause },
        notes: Vec::new(),
    }
}

/// A deferral through the shortest tier that outlasts the lease's
/// `remaining_ms`; none when the pipeline has no tier or the copy cannot
/// fit `frame_max`.
fn defer(rules: &Rules, d: &Delivered, remaining_ms: u64, jitter_u: f64) -> Option<Settlement> {
    let p = rules.pipeline;
    let delay_ms = super::decision::defer_tier(&p.retry, remaining_ms)?;
    let properties = super::copy::defer_copy(
        d.properties,
        d.attempt.saturating_sub(1),
        d.exchange,
        d.routing_key,
        rules.connection_user,
        jitter_expiration(delay_ms, p.retry.jitter, jitter_u),
    );
    let (properties, _) = fit_retry_copy(properties, rules.frame_max).ok()?;
    Some(Settlement::Defer {
        delay_ms,
        copy: Copy {
            exchange: p.retry_exchange(),
            routing_key: tier_name(delay_ms),
            properties,
        },
    })
}

/// A retry through tier `delay_ms`; none when its copy cannot fit
/// `frame_max` (the message is then dead-lettered `too_large`).
fn retry(
    rules: &Rules,
    d: &Delivered,
    ctx: &CopyContext,
    delay_ms: u64,
    jitter_u: f64,
    notes: &mut Vec<Note>,
) -> Option<Settlement> {
    let p = rules.pipeline;
    // A drill message's copies expire at once (see core::drill::message).
    let expiration = if d.drill.is_some() {
        Some(
            crate::drill::message::DRILL_EXPIRATION_MS
                .min(delay_ms)
                .to_string(),
        )
    } else {
        jitter_expiration(delay_ms, p.retry.jitter, jitter_u)
    };
    match fit_retry_copy(retry_copy(d.properties, ctx, expiration), rules.frame_max) {
        Ok((properties, trimmed)) => {
            if trimmed.any() {
                notes.push(Note::RetryTrimmed(trimmed));
            }
            let copy = Copy {
                exchange: p.retry_exchange(),
                routing_key: tier_name(delay_ms),
                properties,
            };
            Some(Settlement::Retry { delay_ms, copy })
        }
        Err(too_large) => {
            notes.push(Note::RetryTooLarge(too_large));
            None
        }
    }
}

/// A dead-letter for `reason`, by nack or by copy as the mode says.
/// `ran`: the handler ran (its error joins the copy's history).
fn dead_letter(
    rules: &Rules,
    d: &Delivered,
    ctx: &CopyContext,
    reason: DeadLetterReason,
    ran: bool,
    notes: &mut Vec<Note>,
) -> Settlement {
    let p = rules.pipeline;
    if rules.dead_letter == DeadLetterMode::Nack {
        // The broker adds x-death to the original: when that would not
        // fit, the copy is published instead.
        if properties_size(d.properties) <= retry_budget(d.properties, rules.frame_max) {
            return Settlement::Nack {
                reason,
                cause: NackCause::Chosen,
            };
        }
        notes.push(Note::NackWouldNotFit);
    }
    let properties = dead_letter_copy(d.properties, ctx, reason, &p.name, ran);
    let (properties, trimmed, fits) = fit_dead_letter_copy(properties, rules.frame_max);
    if trimmed.any() {
        notes.push(Note::DeadLetterTrimmed(trimmed));
    }
    if let Err(too_large) = fits {
        notes.push(Note::DeadLetterUnfit(too_large));
    }
    let copy = Copy {
        exchange: p.dead_letter_exchange(),
        routing_key: p.name.clone(),
        properties,
    };
    Settlement::DeadLetter {
        reason,
        copy,
        nack_if_refused: p.queue_type == QueueType::Quorum,
    }
}
