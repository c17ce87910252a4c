//! Exit codes, one place (README, "Exit codes").

use dlqctl::Error;
use std::process::ExitCode;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 0: done.
    Success,
    /// 1: runtime failure (broker unreachable, refused, drift on provision).
    Failure,
    /// 2: bad usage or invalid topology.
    Usage,
    /// 3: a check found a difference or a threshold was crossed.
    Difference,
}

impl Outcome {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            Outcome::Success => 0,
            Outcome::Failure => 1,
            Outcome::Usage => 2,
            Outcome::Difference => 3,
        }
    }
}

impl From<Outcome> for ExitCode {
    fn from(o: Outcome) -> Self {
        ExitCode::from(o.code())
    }
}

/// The exit code of an error that ended a command.
///
/// Errors of the library are mapped variant by variant, with no wildcard:
/// a new variant of [`Error`] does not compile until it is given its code
/// here. Anything else (an I/O error of the binary's own output, say) is a
/// runtime failure.
pub fn for_error(e: &anyhow::Error) -> Outcome {
    match e.downcast_ref::<Error>() {
        Some(e) => for_library_error(e),
        None => Outcome::Failure,
    }
}

/// The exit code of each library error.
pub fn for_library_error(e: &Error) -> Outcome {
    match e {
        // The topology file is the user's input: unreadable is bad input.
        Error::Invalid(_) | Error::Usage(_) | Error::Url { .. } | Error::Read { .. } => {
            Outcome::Usage
        }
        Error::Connect { .. }
        | Error::Broker { .. }
        | Error::Busy { .. }
        | Error::Management { .. }
        | Error::Write { .. }
        | Error::Store(_) => Outcome::Failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_usage_and_the_world_failing_is_failure() {
        let usage = Error::Usage("x".into());
        assert_eq!(for_library_error(&usage), Outcome::Usage);
        let url = Error::Url {
            url: "u".into(),
            reason: "r".into(),
        };
        assert_eq!(for_library_error(&url), Outcome::Usage);
        let broker = Error::Broker {
            context: "c".into(),
            message: "m".into(),
        };
        assert_eq!(for_error(&anyhow::Error::new(broker)), Outcome::Failure);
        let io = std::io::Error::other("disk");
        assert_eq!(for_error(&anyhow::Error::new(io)), Outcome::Failure);
    }
}
