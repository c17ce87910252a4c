//! The `dlqctl` binary: parses arguments and dispatches.

mod cli;
mod commands;
mod dispatch;
mod exit;
mod logging;
mod output;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // One-shot commands report a failed connection themselves, in one
    // line; lapin's own I/O-loop errors would only add noise before it.
    let one_shot = !matches!(args.command, cli::Command::Work(_));
    logging::init(args.log_format, one_shot);
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
