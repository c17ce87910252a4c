//! The `dlqctl` binary: parses arguments and dispatches.

mod cli;
mod commands;
mod dispatch;
mod exit;
mod logging;
mod output;
mod secrets;
mod serve;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // The secrets of the arguments and of dlqctl's variables are known
    // before anything is printed: everything standard error shows is
    // scrubbed of them (dlqctl::secrets), a panic's message included.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    secrets::register(&argv, &|name| std::env::var(name).ok());
    secrets::install_panic_hook();
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(e) => return usage_error(e),
    };
    // One-shot commands report a failed connection themselves, in one
    // line; lapin's own I/O-loop errors would only add noise before it.
    let one_shot = !matches!(args.command, cli::Command::Work(_));
    logging::init(args.log_format, one_shot);
    secrets::warn_command_line(&argv);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            output::stderr_line(&format!("error: cannot start the async runtime: {e}"));
            return exit::Outcome::Failure.into();
        }
    };
    let result = rt.block_on(dispatch::run(&args.command));
    match result {
        Ok(outcome) => outcome.into(),
        Err(e) => {
            let outcome = exit::for_error(&e);
            match e.downcast_ref::<dlqctl::Error>() {
                // A log shipper reads one JSON record, like the log's.
                _ if args.log_format == cli::LogFormat::Json => {
                    output::stderr_line(&output::json::error_record(&e.to_string(), outcome))
                }
                // `FILE:LINE:COL: message` lines, as editors and CI parse them.
                Some(dlqctl::Error::Invalid(_)) => output::stderr_line(&e.to_string()),
                _ => output::stderr_line(&format!("error: {e}")),
            }
            outcome.into()
        }
    }
}

/// A command line clap refuses (or `--help`, `--version`): as clap prints
/// it (its exit code, its stream, its colours on a terminal), scrubbed of
/// the known secrets (clap repeats a refused value as given), except that
/// under `--log-format json` a refusal is one JSON record like every
/// other error (exit 2).
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    use std::io::IsTerminal as _;
    let json = log_format_is_json(std::env::args_os().skip(1));
    if !json
        || matches!(
            e.kind(),
            ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        )
    {
        let code = u8::try_from(e.exit_code()).unwrap_or(2);
        let rendered = e.render();
        let to_stderr = e.use_stderr();
        let terminal = if to_stderr {
            std::io::stderr().is_terminal()
        } else {
            std::io::stdout().is_terminal()
        };
        let text = if terminal {
            rendered.ansi().to_string()
        } else {
            rendered.to_string()
        };
        let text = dlqctl::secrets::scrub(&text);
        if to_stderr {
            use std::io::Write as _;
            let _ = secrets::ScrubbedStderr.write_all(text.as_bytes());
        } else if output::stdout_bytes(text.as_bytes()).is_err() {
            return exit::Outcome::Failure.into();
        }
        return ExitCode::from(code);
    }
    let text = e.render().to_string();
    let text = text.trim_end().trim_start_matches("error: ");
    output::stderr_line(&output::json::error_record(text, exit::Outcome::Usage));
    exit::Outcome::Usage.into()
}

/// Whether the arguments ask for `--log-format json` (the last one given
/// wins, as clap takes it), read before clap could parse them.
fn log_format_is_json(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let mut json = false;
    for (i, a) in args.iter().enumerate() {
        if a == "--" {
            break;
        }
        let value = match a.strip_prefix("--log-format") {
            Some("") => args.get(i + 1).map(String::as_str),
            Some(v) => v.strip_prefix('='),
            None => continue,
        };
        if let Some(v) = value {
            json = v == "json";
        }
    }
    json
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(args: &[&str]) -> bool {
        log_format_is_json(args.iter().map(std::ffi::OsString::from))
    }

    #[test]
    fn the_log_format_is_read_before_parsing() {
        assert!(json(&["--log-format", "json", "work"]));
        assert!(json(&["work", "--log-format=json", "x"]));
        assert!(!json(&[
            "work",
            "--log-format",
            "json",
            "--log-format",
            "text"
        ]));
        assert!(!json(&["work", "--", "--log-format", "json"]));
        assert!(!json(&["work", "--log-formatjson"]));
        assert!(!json(&["work"]));
    }
}
