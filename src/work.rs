//! `dlqctl work`.

use crate::cli::WorkArgs;
use crate::exit::Outcome;
use anyhow::Result;

/// Runs the worker until a signal stops it.
pub async fn run(_a: &WorkArgs) -> Result<Outcome> {
    anyhow::bail!(dlqctl::error::Error::Usage(
        "`dlqctl work` is not built yet".into()
    ))
}
