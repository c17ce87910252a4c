//! `dlqctl completions` and `dlqctl man`: generated from the command line
//! itself (`cli.rs`), so they never disagree with `--help`.

use crate::cli::{Cli, VERSION};
use crate::exit::Outcome;
use crate::output;
use anyhow::{Context, Result};
use clap::CommandFactory;
use dlqctl::error::Error;
use std::path::Path;

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
        cmd = named(sub, &name);
    }
    output::stdout_bytes(&render(cmd)?)?;
    Ok(Outcome::Success)
}

/// `dlqctl man --out DIR`: the page of dlqctl and of every subcommand, as
/// `man` would print each, written into `dir` as `NAME.1`; each file's
/// path on standard output.
pub fn man_pages(dir: &Path) -> Result<Outcome> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut pages = Vec::new();
    collect_pages(cmd, "dlqctl", &mut pages);
    for (name, cmd) in pages {
        let file = dir.join(format!("{name}.1"));
        std::fs::write(&file, render(cmd)?)
            .with_context(|| format!("cannot write {}", file.display()))?;
        output::stdout_line(&file.display().to_string())?;
    }
    Ok(Outcome::Success)
}

/// `cmd`, then each of its subcommands (but `help`) depth first, as the
/// pages `dlqctl man` prints for them.
fn collect_pages(cmd: clap::Command, name: &str, pages: &mut Vec<(String, clap::Command)>) {
    let subs: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|c| c.get_name() != "help")
        .cloned()
        .collect();
    pages.push((name.to_string(), cmd));
    for sub in subs {
        let sub_name = format!("{name}-{}", sub.get_name());
        collect_pages(named(sub, &sub_name), &sub_name, pages);
    }
}

/// A subcommand named as its page is (`dlqctl-dlq-replay`, invoked as
/// `dlqctl dlq replay`).
fn named(sub: clap::Command, name: &str) -> clap::Command {
    sub.name(name.to_string())
        .bin_name(name.replace('-', " "))
        .version(VERSION)
}

/// The page of `cmd`, as clap_mangen renders it, except that the examples
/// its `--help` ends with come as an EXAMPLES section, line by line
/// (clap_mangen would fill them into one paragraph under EXTRA).
fn render(cmd: clap::Command) -> std::io::Result<Vec<u8>> {
    let examples = cmd.get_after_help().map(|h| h.to_string());
    let man = clap_mangen::Man::new(cmd.clone());
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut page)?;
    }
    if cmd.get_subcommands().any(|c| !c.is_hide_set()) {
        man.render_subcommands_section(&mut page)?;
    }
    if let Some(text) = examples {
        page.extend_from_slice(examples_section(&text).as_bytes());
    }
    man.render_version_section(&mut page)?;
    Ok(page)
}

/// An EXAMPLES section in roff: each `# comment` as a paragraph, each
/// command line after it as it is, not filled (`.nf`), in bold.
fn examples_section(text: &str) -> String {
    const END: &str = ".fi\n.RE\n";
    let body = text.strip_prefix("Examples:").unwrap_or(text);
    let mut out = String::from(".SH EXAMPLES\n");
    let mut in_commands = false;
    for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix('#') {
            if std::mem::take(&mut in_commands) {
                out += END;
            }
            out += &format!(".PP\n{}\n", roff_text(comment.trim()));
        } else {
            if !std::mem::replace(&mut in_commands, true) {
                out += ".RS 4\n.nf\n";
            }
            out += &format!("\\fB{}\\fR\n", roff_text(line));
        }
    }
    if in_commands {
        out += END;
    }
    out
}

/// `text` safe as a roff text line: backslashes and hyphens escaped, and
/// a leading `.` or `'` (a request) neutralised.
fn roff_text(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with(['.', '\'']) {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_become_a_section_of_comments_and_unfilled_commands() {
        let roff = examples_section(
            "Examples:\n  # Count them\n  dlqctl a --x 1\n  dlqctl b\n\n  # Then \\ this\n  .dlqctl c",
        );
        assert_eq!(
            roff,
            ".SH EXAMPLES\n.PP\nCount them\n.RS 4\n.nf\n\\fBdlqctl a \\-\\-x 1\\fR\n\\fBdlqctl b\\fR\n\
             .fi\n.RE\n.PP\nThen \\e this\n.RS 4\n.nf\n\\fB\\&.dlqctl c\\fR\n.fi\n.RE\n"
        );
    }
}
