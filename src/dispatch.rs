//! Which command runs for which subcommand.

use crate::cli::Command;
use crate::commands;
use crate::exit::Outcome;
use anyhow::Result;

/// Runs the parsed command to its outcome.
pub async fn run(command: &Command) -> Result<Outcome> {
    match command {
        Command::Validate { file } => commands::validate::validate(file),
        Command::Provision(a) => commands::provision::provision(a).await,
        Command::Work(a) => commands::work::run(a).await,
        Command::Status(a) => commands::status::status(a).await,
        Command::Doctor(a) => commands::doctor::doctor(a).await,
        Command::Drill(a) => commands::drill::drill(a).await,
        Command::Serve(a) => commands::serve::serve(a).await,
        Command::Completions { shell } => commands::manual::completions(*shell),
        Command::Man { command, out: None } => commands::manual::man(command),
        Command::Man { out: Some(dir), .. } => commands::manual::man_pages(dir),
        Command::Dlq(d) => match d.as_ref() {
            crate::cli::DlqCommand::Peek(a) => commands::dlq::peek(a).await,
            crate::cli::DlqCommand::Summary(a) => commands::dlq::summary(a).await,
            crate::cli::DlqCommand::Export(a) => commands::dlq::export(a).await,
            crate::cli::DlqCommand::Replay(a) => commands::dlq::replay(a).await,
            crate::cli::DlqCommand::Redrive(a) => commands::dlq::redrive(a).await,
            crate::cli::DlqCommand::Purge(a) => commands::dlq::purge(a).await,
        },
    }
}
