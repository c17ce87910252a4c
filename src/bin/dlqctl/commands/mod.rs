//! One file per command: each parses nothing and decides nothing of its
//! own; it calls the library and hands the report to `output`.

pub mod dlq;
pub mod manual;
pub mod provision;
pub mod serve;
pub mod status;
pub mod validate;
pub mod work;

use dlqctl::core::topology::{parse_topology, source, Pipeline, Topology};
use dlqctl::error::Error;
use std::path::Path;

/// Reads and validates a topology file: at most
/// [`source::MAX_FILE_BYTES`], UTF-8. A missing file, a directory, a file
/// too large or not UTF-8 is bad input (exit 2).
pub fn load(path: &Path) -> Result<Topology, Error> {
    use std::io::Read;
    let shown = path.display().to_string();
    let read_err = |source| Error::Read {
        path: shown.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    if file.metadata().map(|m| m.is_dir()).unwrap_or(false) {
        return Err(Error::Usage(format!(
            "{shown} is a directory: give a topology file"
        )));
    }
    let mut bytes = Vec::new();
    file.take(source::MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > source::MAX_FILE_BYTES {
        return Err(Error::Usage(format!(
            "{shown} is larger than {} MiB: a topology file is a few KiB to a few MiB; \
             is this the right file?",
            source::MAX_FILE_BYTES / 1024 / 1024
        )));
    }
    let text = source::decode(&bytes).map_err(|why| Error::Usage(format!("{shown}: {why}")))?;
    Ok(parse_topology(text, &shown)?)
}

/// The pipeline named `queue` of the topology read from `file`; bad usage,
/// naming every pipeline, when there is none.
pub fn pipeline(file: &Path, queue: &str) -> Result<Pipeline, Error> {
    let topology = load(file)?;
    match topology.pipeline(queue) {
        Some(p) => Ok(p.clone()),
        None => {
            let names: Vec<_> = topology.pipelines.iter().map(|p| p.name.as_str()).collect();
            Err(Error::Usage(format!(
                "queue `{queue}` is not a pipeline of {} (pipelines: {})",
                file.display(),
                names.join(", ")
            )))
        }
    }
}

/// The broker addresses of `--url` (repeated or comma-separated), with the
/// TLS files of `--tls-ca`, `--tls-cert` and `--tls-key`.
pub fn brokers(c: &crate::cli::Connection) -> Result<dlqctl::amqp::Brokers, Error> {
    let tls = dlqctl::amqp::connection::Tls::from_files(
        c.tls_ca.as_deref(),
        c.tls_cert.as_deref(),
        c.tls_key.as_deref(),
    )?;
    Ok(dlqctl::amqp::Brokers::parse(&c.url)?.with_tls(tls))
}

/// Refuses a `--management-url` that does not parse, as a usage error
/// before any connection is made.
pub fn check_management_urls(urls: &[String]) -> Result<(), Error> {
    for url in urls {
        dlqctl::amqp::mgmt::Management::new(url, "", "")?;
    }
    Ok(())
}

/// Cancels `token` on SIGTERM, SIGINT or SIGHUP (a closed terminal or a
/// supervisor's reload: a graceful stop, not a death that leaves work half
/// done), then logs `doing`.
pub fn spawn_signal_handler(
    token: tokio_util::sync::CancellationToken,
    doing: &'static str,
) -> std::io::Result<()> {
    spawn_signal_handlers(token, None).map(|signals| drop(tokio::spawn(signals.first(doing))))
}

/// Like [`spawn_signal_handler`], and a second signal cancels `hurry`
/// too (logging `hurrying`): an operator who asks twice does not want to
/// wait for the rest of the grace period.
pub fn spawn_signal_handler_twice(
    token: tokio_util::sync::CancellationToken,
    hurry: tokio_util::sync::CancellationToken,
    doing: &'static str,
    hurrying: &'static str,
) -> std::io::Result<()> {
    let signals = spawn_signal_handlers(token, Some(hurry))?;
    tokio::spawn(async move {
        let mut signals = signals.first(doing).await;
        let name = signals.next().await;
        if let Some(hurry) = signals.hurry.take() {
            hurry.cancel();
        }
        tracing::warn!("{name} again: {hurrying}");
    });
    Ok(())
}

/// The signals that stop a command.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    token: tokio_util::sync::CancellationToken,
    hurry: Option<tokio_util::sync::CancellationToken>,
}

fn spawn_signal_handlers(
    token: tokio_util::sync::CancellationToken,
    hurry: Option<tokio_util::sync::CancellationToken>,
) -> std::io::Result<Signals> {
    use tokio::signal::unix::{signal, SignalKind};
    Ok(Signals {
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
        hup: signal(SignalKind::hangup())?,
        token,
        hurry,
    })
}

impl Signals {
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = self.hup.recv() => "SIGHUP",
        }
    }

    /// Waits for the first signal, cancels the token, says `doing`.
    async fn first(mut self, doing: &'static str) -> Self {
        let name = self.next().await;
        // Stop first, then say so: nothing the log does can keep the stop
        // from happening.
        self.token.cancel();
        tracing::info!("{name}: {doing}");
        self
    }
}
