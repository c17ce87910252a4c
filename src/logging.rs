//! Logging setup: the filter, the format, and two guarantees that hold at
//! every level, `RUST_LOG=trace` included.
//!
//! - Credentials never reach a log: lapin's records of the frames that
//!   carry a SASL response (`connection.start-ok`, `connection.secure-ok`,
//!   logged at `trace` with the user and password as a byte list) are
//!   dropped before any layer formats them; and every line is written
//!   through `secrets::ScrubbedStderr`, which hides each secret the
//!   process knows (the URLs' passwords, the web token) in any written
//!   form, in dlqctl's lines and in the dependencies' own alike.
//! - A text log line is one line: every field value (a handler's error, a
//!   message id, a broker's reply) is written with its control characters
//!   escaped (`\n`, `\u001b`, ...), so a value cannot forge a log line or
//!   drive the terminal. The JSON format escapes them already.

use crate::cli;
use std::fmt::Debug;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// The names, in a frame's debug form, of the AMQP methods that carry a
/// SASL response (PLAIN: `\0user\0password`).
const CREDENTIAL_FRAMES: [&str; 2] = ["StartOk", "SecureOk"];

/// Drops every record that shows a frame carrying credentials.
struct NoCredentials;

/// Looks through an event's fields for a credential frame.
#[derive(Default)]
struct CarriesCredentials(bool);

impl Visit for CarriesCredentials {
    fn record_debug(&mut self, _field: &Field, value: &dyn Debug) {
        if !self.0 {
            let text = format!("{value:?}");
            self.0 = CREDENTIAL_FRAMES.iter().any(|m| text.contains(m));
        }
    }

    fn record_str(&mut self, _field: &Field, value: &str) {
        if !self.0 {
            self.0 = CREDENTIAL_FRAMES.iter().any(|m| value.contains(m));
        }
    }
}

impl<S: Subscriber> Layer<S> for NoCredentials {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let mut v = CarriesCredentials::default();
        event.record(&mut v);
        !v.0
    }
}

/// Sets up the global subscriber on standard error.
pub fn init(format: cli::LogFormat, quiet_lapin_io: bool) {
    // lapin logs every soft channel error (our drift probes make them on
    // purpose) at ERROR, and the TLS verifier each certificate it refuses;
    // dlqctl reports them itself.
    let default = if quiet_lapin_io {
        "info,lapin=warn,lapin::channel=off,lapin::io_loop=off,rustls_platform_verifier=off"
    } else {
        "info,lapin=warn,lapin::channel=off,rustls_platform_verifier=off"
    };
    // An empty RUST_LOG is taken as unset (it would log nothing at all).
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Every line scrubbed of the known secrets (dlqctl::secrets):
        // dlqctl's own and the dependencies' alike, at every level.
        .with_writer(|| crate::secrets::ScrubbedStderr)
        // On a failed write (stderr a full disk or a closed pipe) the
        // subscriber would report it with eprintln!, which panics — in
        // whichever task was logging, the signal task included, leaving the
        // worker deaf to SIGTERM. Log lines that cannot be written are lost;
        // the worker keeps working and stays stoppable.
        .log_internal_errors(false);
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(NoCredentials);
    match format {
        cli::LogFormat::Text => registry.with(fmt.fmt_fields(escaped_fields())).init(),
        cli::LogFormat::Json => registry.with(fmt.json()).init(),
    }
}

/// The text format's fields: `message` as it is, the others `name=value`,
/// space-separated, every value with its control characters escaped.
fn escaped_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    tracing_subscriber::fmt::format::debug_fn(
        |w: &mut tracing_subscriber::fmt::format::Writer<'_>, field: &Field, value: &dyn Debug| {
            let text = format!("{value:?}");
            let text = dlqctl::core::values::text::escape_controls(&text);
            match field.name() {
                "message" => write!(w, "{text}"),
                name => write!(w, "{}={text}", name.trim_start_matches("r#")),
            }
        },
    )
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer that keeps what is logged.
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(json: bool, f: impl FnOnce()) -> String {
        let kept = Kept::default();
        let writer = kept.clone();
        let fmt = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let registry = tracing_subscriber::registry()
            .with(EnvFilter::new("trace"))
            .with(NoCredentials);
        if json {
            tracing::subscriber::with_default(registry.with(fmt.json()), f);
        } else {
            tracing::subscriber::with_default(registry.with(fmt.fmt_fields(escaped_fields())), f);
        }
        let bytes = kept.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn a_handler_error_cannot_forge_a_log_line_or_drive_the_terminal() {
        let error =
            "boom\n2026-01-01T00:00:00Z  INFO message handled decision=\"ack\"\u{1b}]0;x\u{7}";
        let text = logged(false, || {
            tracing::warn!(error = %error, id = ?"a\nb", "handler failed: {error}");
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(text.contains("boom\\n2026"), "{text}");
        assert!(text.contains("\\u001b]0;x\\u0007"), "{text}");
    }
}
