//! The `dlqctl` binary: parses arguments and dispatches.

mod cli;
mod commands;
mod dispatch;
mod exit;
mod output;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // One-shot commands report a failed connection themselves, in one
    // line; lapin's own I/O-loop errors would only add noise before it.
    let one_shot = !matches!(args.command, cli::Command::Work(_));
    init_logging(args.log_format, one_shot);
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
            match e.downcast_ref::<dlqctl::error::Error>() {
                // `FILE:LINE:COL: message` lines, as editors and CI parse them.
                Some(dlqctl::error::Error::Invalid(_)) => output::stderr_line(&e.to_string()),
                _ => output::stderr_line(&format!("error: {e}")),
            }
            exit::for_error(&e).into()
        }
    }
}

fn init_logging(format: cli::LogFormat, quiet_lapin_io: bool) {
    use tracing_subscriber::EnvFilter;
    // lapin logs every soft channel error (our drift probes make them on
    // purpose) at ERROR, and the TLS verifier each certificate it refuses;
    // dlqctl reports them itself.
    let default = if quiet_lapin_io {
        "info,lapin=warn,lapin::channel=off,lapin::io_loop=off,rustls_platform_verifier=off"
    } else {
        "info,lapin=warn,lapin::channel=off,rustls_platform_verifier=off"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        // On a failed write (stderr a full disk or a closed pipe) the
        // subscriber would report it with eprintln!, which panics — in
        // whichever task was logging, the signal task included, leaving the
        // worker deaf to SIGTERM. Log lines that cannot be written are lost;
        // the worker keeps working and stays stoppable.
        .log_internal_errors(false);
    match format {
        cli::LogFormat::Text => builder.init(),
        cli::LogFormat::Json => builder.json().init(),
    }
}
