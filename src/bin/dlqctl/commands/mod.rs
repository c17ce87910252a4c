//! One file per command: each parses nothing and decides nothing of its
//! own; it calls the library and hands the report to `output`.

pub mod dlq;
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
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = hup.recv() => "SIGHUP",
        };
        // Stop first, then say so: nothing the log does can keep the stop
        // from happening.
        token.cancel();
        tracing::info!("{name}: {doing}");
    });
    Ok(())
}
