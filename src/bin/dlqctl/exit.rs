//! Exit codes, one place (README, "Exit codes").

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

impl From<Outcome> for ExitCode {
    fn from(o: Outcome) -> Self {
        ExitCode::from(match o {
            Outcome::Success => 0,
            Outcome::Failure => 1,
            Outcome::Usage => 2,
            Outcome::Difference => 3,
        })
    }
}

/// The exit code of an error that ended a command.
pub fn for_error(e: &anyhow::Error) -> Outcome {
    match e.downcast_ref::<dlqctl::error::Error>() {
        Some(dlqctl::error::Error::Invalid(_)) | Some(dlqctl::error::Error::Usage(_)) => {
            Outcome::Usage
        }
        Some(dlqctl::error::Error::Url { .. }) => Outcome::Usage,
        _ => Outcome::Failure,
    }
}
