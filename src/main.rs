//! The `dlqctl` binary: parses arguments and dispatches.

mod cli;
mod commands;
mod exit;
mod output;
mod work;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    init_logging(args.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return exit::Outcome::Failure.into();
        }
    };
    let result = rt.block_on(async {
        match &args.command {
            cli::Command::Validate { file } => commands::validate(file),
            cli::Command::Provision(a) => commands::provision(a).await,
            cli::Command::Work(a) => work::run(a).await,
        }
    });
    match result {
        Ok(outcome) => outcome.into(),
        Err(e) => {
            eprintln!("error: {e}");
            exit::for_error(&e).into()
        }
    }
}

fn init_logging(format: cli::LogFormat) {
    use tracing_subscriber::EnvFilter;
    // lapin logs every soft channel error (our drift probes make them on
    // purpose) at ERROR; dlqctl reports them itself.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,lapin=warn,lapin::channel=off"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        cli::LogFormat::Text => builder.init(),
        cli::LogFormat::Json => builder.json().init(),
    }
}
