//! One file per command: each parses nothing and decides nothing of its
//! own; it calls the library and hands the report to `output`.

pub mod dlq;
pub mod doctor;
pub mod drill;
pub mod manual;
mod metrics_http;
pub mod provision;
pub mod serve;
pub mod status;
pub mod validate;
pub mod work;

use dlqctl::Error;

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

/// Refuses a `--metrics-url` no HTTP request can be made to (parsed as
/// reqwest will), as a usage error before any connection is made.
pub fn check_metrics_urls(urls: &[String]) -> Result<(), Error> {
    for url in urls {
        dlqctl::urls::http(url).map_err(|why| {
            Error::Usage(format!(
                "invalid --metrics-url {}: {why}",
                dlqctl::amqp::connection::redact(url)
            ))
        })?;
    }
    Ok(())
}

/// Connects for a command that also reads the management API (`status`,
/// `doctor`), after the addresses and `--management-url` passed as usage:
/// the connection, the address that answered and its management client.
pub async fn connect_with_management(
    c: &crate::cli::Connection,
    management_url: &[String],
    name: &str,
) -> Result<
    (
        lapin::Connection,
        dlqctl::amqp::BrokerUrl,
        dlqctl::amqp::mgmt::Management,
    ),
    Error,
> {
    let brokers = brokers(c)?;
    check_management_urls(management_url)?;
    let (conn, at, mgmt) = brokers
        .connect_with_management(management_url, name)
        .await?;
    Ok((conn, brokers.get(at).clone(), mgmt))
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
