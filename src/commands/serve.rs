//! `dlqctl serve`: wires the CLI to the library's web server.

use crate::cli::ServeArgs;
use crate::exit::Outcome;
use anyhow::Result;
use dlqctl::Error;
use tokio_util::sync::CancellationToken;

/// Serves until SIGINT, SIGTERM or SIGHUP; running jobs stop after their
/// copies in flight.
pub async fn serve(a: &ServeArgs) -> Result<Outcome> {
    let topology = dlqctl::load_topology(&a.file)?;
    let token = a.auth_token.clone();
    if let Some(why) = token
        .as_deref()
        .and_then(crate::serve::web_guard::refuse_token)
    {
        return Err(Error::Usage(why).into());
    }
    if let Some(why) = crate::serve::web_guard::refuse_listen(a.listen, token.is_some()) {
        return Err(Error::Usage(why).into());
    }
    if a.sample_every.is_zero() {
        return Err(Error::Usage("--sample-every must be above 0".into()).into());
    }
    super::check_management_urls(&a.management_url)?;
    super::check_metrics_urls(&a.metrics_url)?;
    let brokers = super::brokers(&a.connection)?;
    let opts = crate::serve::ServeOptions {
        topology,
        file: a.file.display().to_string(),
        brokers,
        management_urls: a.management_url.clone(),
        listen: a.listen,
        read_only: a.read_only,
        auth_token: token,
        warn_dlq: a.warn_dlq,
        max_dlq: a.max_dlq,
        sample_every: a.sample_every,
        allow_hosts: a.allow_host.clone(),
        window: a.window,
        metrics_urls: a.metrics_url.clone(),
    };
    let listener = crate::serve::bind(a.listen).await?;
    let stop = CancellationToken::new();
    super::spawn_signal_handler(
        stop.clone(),
        "stopping; running jobs stop after their copies in flight",
    )?;
    let shown = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(
        "serving http://{shown}/ ({}{})",
        if a.read_only {
            "read-only"
        } else {
            "actions on"
        },
        if a.auth_token.is_some() {
            ", token required"
        } else {
            ""
        }
    );
    crate::serve::run(opts, listener, stop).await?;
    Ok(Outcome::Success)
}
