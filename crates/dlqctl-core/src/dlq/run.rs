//! How a replay run ends ([`ReplayEnd`]), and the canary rules of a
//! person's replay and of automatic redrive side by side ([`CanaryRule`]).
//! The shell (`ops::dlq::replay`) reads, copies and waits; what it came to
//! is said here.

/// Whether a canary passed: `came_back` of the `sent` canaries were found
/// back in the DLQ after the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CanaryRule {
    /// `dlq replay --canary` and the web page's replay: at most half came
    /// back (a person watches the run).
    Manual,
    /// Automatic redrive: at least one was sent and none came back (no
    /// person watches the run).
    Automatic,
}

impl CanaryRule {
    /// Whether the canary passed under this rule.
    pub fn passed(self, sent: u64, came_back: u64) -> bool {
        match self {
            // `came_back * 2 <= sent`, without overflow.
            CanaryRule::Manual => came_back <= sent / 2,
            CanaryRule::Automatic => sent > 0 && came_back == 0,
        }
    }
}

/// How many of `sent` canaries did not prove the dependency: those that
/// `came_back` to the DLQ and, on a pipeline with idempotent handling
/// (`handled` given: the canaries whose key the store marks handled
/// after the wait), those whose key is not marked either. A canary of a
/// guarded pipeline proves the dependency only through a handler run
/// that marked its key: one still deferred, in a retry tier, or acked as
/// a duplicate proves nothing.
pub fn unproven(sent: u64, came_back: u64, handled: Option<u64>) -> u64 {
    match handled {
        None => came_back,
        Some(handled) => sent.saturating_sub(handled).max(came_back).min(sent),
    }
}

/// Why a replay stopped before the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The destination refused a copy (nacked, returned, not confirmed in
    /// time, the channel closed): the refused batch's originals stay.
    Refused(String),
    /// The canary failed: the rest stayed where it was.
    CanaryFailed(String),
    /// A canary was asked for on a pipeline with idempotent handling, and
    /// no selected message could be one: every key was already marked
    /// handled or leased (a copy would be acked as a duplicate or
    /// deferred, running no handler). Nothing moved.
    NoCanary(String),
}

impl Stop {
    /// The stop in words.
    pub fn why(&self) -> &str {
        match self {
            Stop::Refused(why) | Stop::CanaryFailed(why) | Stop::NoCanary(why) => why,
        }
    }
}

/// How a replay ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReplayEnd {
    /// It read what it was to read: the snapshot (up to the limit) or the
    /// whole file. Selected messages too large to copy may have stayed
    /// (the report counts them as failed).
    #[default]
    Completed,
    /// It stopped before the end.
    Stopped(Stop),
    /// SIGINT or SIGTERM (or a cancelled page) stopped it, after the
    /// copies in flight; `stop` when it also came to a stop (a copy in
    /// flight was refused, or one was before the signal).
    Cancelled {
        /// The stop it came to as well, if any.
        stop: Option<Stop>,
    },
}

impl ReplayEnd {
    /// The stop it came to, cancelled or not (the report's `stopped`).
    pub fn stop(&self) -> Option<&Stop> {
        match self {
            ReplayEnd::Completed | ReplayEnd::Cancelled { stop: None } => None,
            ReplayEnd::Stopped(s) | ReplayEnd::Cancelled { stop: Some(s) } => Some(s),
        }
    }

    /// Whether a signal (or a cancelled page) stopped it (the report's
    /// `cancelled`).
    pub fn is_cancelled(&self) -> bool {
        matches!(self, ReplayEnd::Cancelled { .. })
    }

    /// It was cancelled, keeping the stop it came to.
    pub fn cancel(&mut self) {
        let stop = self.stop().cloned();
        *self = ReplayEnd::Cancelled { stop };
    }

    /// It came to `stop`, unless it came to one already (the first stop
    /// is the one reported); a cancel is kept.
    pub fn stop_at(&mut self, stop: Stop) {
        match self {
            ReplayEnd::Completed => *self = ReplayEnd::Stopped(stop),
            ReplayEnd::Cancelled { stop: s @ None } => *s = Some(stop),
            ReplayEnd::Stopped(_) | ReplayEnd::Cancelled { stop: Some(_) } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_canary_passes_when_at_most_half_came_back() {
        let r = CanaryRule::Manual;
        assert!(r.passed(10, 0));
        assert!(r.passed(10, 5));
        assert!(!r.passed(10, 6));
        assert!(r.passed(1, 0));
        assert!(!r.passed(1, 1));
        assert!(r.passed(3, 1));
        assert!(!r.passed(3, 2));
        // Nothing sent: nothing came back either.
        assert!(r.passed(0, 0));
        assert!(!r.passed(u64::MAX, u64::MAX));
        assert!(r.passed(u64::MAX, u64::MAX / 2));
    }

    #[test]
    fn an_automatic_canary_passes_only_when_some_were_sent_and_none_came_back() {
        let r = CanaryRule::Automatic;
        assert!(r.passed(5, 0));
        assert!(r.passed(1, 0));
        assert!(!r.passed(5, 1));
        assert!(!r.passed(5, 5));
        assert!(!r.passed(0, 0), "nothing sent proves nothing");
    }

    #[test]
    fn the_automatic_rule_is_never_looser_than_the_manual_one() {
        for sent in 0..20 {
            for back in 0..=sent {
                if CanaryRule::Automatic.passed(sent, back) {
                    assert!(CanaryRule::Manual.passed(sent, back), "{back} of {sent}");
                }
            }
        }
    }

    #[test]
    fn a_guarded_canary_proves_only_what_a_handler_marked() {
        // Unguarded: only the ones that came back count against it.
        assert_eq!(unproven(4, 1, None), 1);
        assert_eq!(unproven(4, 0, None), 0);
        // Guarded: none came back, but only 3 of 4 keys are marked (one
        // still deferred or in a tier).
        assert_eq!(unproven(4, 0, Some(3)), 1);
        assert_eq!(unproven(4, 0, Some(4)), 0);
        // Came back and not marked: counted once.
        assert_eq!(unproven(4, 2, Some(2)), 2);
        assert_eq!(unproven(4, 1, Some(1)), 3);
        // Never more than were sent.
        assert_eq!(unproven(2, 5, Some(0)), 2);
        assert_eq!(unproven(0, 0, Some(0)), 0);
        // Through the rules: a guarded canary none of whose keys was
        // marked fails, though none came back.
        assert!(!CanaryRule::Automatic.passed(3, unproven(3, 0, Some(0))));
        assert!(!CanaryRule::Manual.passed(3, unproven(3, 0, Some(1))));
        assert!(CanaryRule::Manual.passed(3, unproven(3, 0, Some(2))));
        assert!(CanaryRule::Automatic.passed(3, unproven(3, 0, Some(3))));
    }

    #[test]
    fn no_canary_is_a_stop_of_its_own() {
        let mut e = ReplayEnd::default();
        e.stop_at(Stop::NoCanary("no message could be a canary".into()));
        assert_eq!(
            e.stop().map(Stop::why),
            Some("no message could be a canary")
        );
        assert!(!e.is_cancelled());
    }

    #[test]
    fn the_first_stop_is_kept_and_a_cancel_keeps_it() {
        let refused = Stop::Refused("orders refused a copy: nacked".into());
        let canary = Stop::CanaryFailed("the canary failed".into());
        let mut e = ReplayEnd::default();
        assert_eq!((e.stop(), e.is_cancelled()), (None, false));
        e.stop_at(refused.clone());
        e.stop_at(canary.clone());
        assert_eq!(e, ReplayEnd::Stopped(refused.clone()));
        assert_eq!(
            e.stop().map(Stop::why),
            Some("orders refused a copy: nacked")
        );
        e.cancel();
        assert_eq!(
            e,
            ReplayEnd::Cancelled {
                stop: Some(refused.clone())
            }
        );
        assert!(e.is_cancelled());
        // Cancelled first, a refusal of a copy in flight found after.
        let mut e = ReplayEnd::default();
        e.cancel();
        assert_eq!((e.stop(), e.is_cancelled()), (None, true));
        e.stop_at(refused.clone());
        assert_eq!(e.stop(), Some(&refused));
        e.cancel();
        assert_eq!(e.stop(), Some(&refused));
        assert!(e.is_cancelled());
        assert_eq!(canary.why(), "the canary failed");
    }
}
