//! `dlqctl completions` and `dlqctl man`: generated from the command line
//! itself (`cli.rs`), so they never disagree with `--help`.

use crate::cli::{Cli, VERSION};
use crate::exit::Outcome;
use crate::output;
use anyhow::Result;
use clap::CommandFactory;
use dlqctl::error::Error;

/// `dlqctl completions SHELL`: the completion script on standard output.
pub fn completions(shell: clap_complete::Shell) -> Result<Outcome> {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "dlqctl", &mut script);
    output::stdout_bytes(&script)?;
    Ok(Outcome::Success)
}

/// `dlqctl man [COMMAND...]`: the man page of dlqctl, or of one of its
/// subcommands (`dlqctl-dlq-replay`), in roff on standard output.
pub fn man(path: &[String]) -> Result<Outcome> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut name = "dlqctl".to_string();
    for word in path {
        let Some(sub) = cmd.find_subcommand(word).cloned() else {
            let known: Vec<String> = cmd
                .get_subcommands()
                .map(|c| c.get_name().to_string())
                .filter(|n| n != "help")
                .collect();
            return Err(Error::Usage(format!(
                "`{name}` has no subcommand `{word}`; it has: {}",
                known.join(", ")
            ))
            .into());
        };
        name = format!("{name}-{word}");
        cmd = sub
            .name(name.clone())
            .bin_name(name.replace('-', " "))
            .version(VERSION);
    }
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd).render(&mut page)?;
    output::stdout_bytes(&page)?;
    Ok(Outcome::Success)
}
