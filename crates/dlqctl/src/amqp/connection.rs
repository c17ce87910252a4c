//! Connecting to RabbitMQ: URL handling without leaking passwords, named
//! connections, bounded connect time, errors a user can act on.

use crate::core::topology::{ArgValue, Arguments};
use crate::error::{describe_lapin_error, Error, Result};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};
use std::time::Duration;

/// The default broker URL.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// How long a connection attempt may take before dlqctl gives up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed broker URL.
#[derive(Clone, Debug)]
pub struct BrokerUrl {
    uri: AMQPUri,
    tls: Option<std::sync::Arc<Tls>>,
}

/// TLS settings the URL cannot hold: a private CA to trust (besides the
/// system's), and a client certificate (for `auth_mechanism=external`).
#[derive(Clone, Default)]
pub struct Tls {
    /// PEM certificates of the CAs to trust.
    pub ca_pem: Option<String>,
    /// The client certificate chain and its private key, PEM.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl Tls {
    /// Reads `--tls-ca`, `--tls-cert` and `--tls-key`; `None` when none is
    /// given. A file that cannot be read, holds no PEM certificate, or a
    /// certificate without its key (or the reverse) is a usage error.
    pub fn from_files(
        ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<Option<Self>> {
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| Error::Usage(format!("cannot read {flag} {}: {e}", path.display())))
        };
        let pem_check = |flag: &str, path: &std::path::Path, bytes: &[u8], what: &str| {
            if String::from_utf8_lossy(bytes).contains(&format!("{what}-----")) {
                Ok(())
            } else {
                Err(Error::Usage(format!(
                    "{flag} {}: no PEM {} in it",
                    path.display(),
                    what.to_lowercase()
                )))
            }
        };
        let ca_pem = match ca {
            Some(path) => {
                let bytes = read("--tls-ca", path)?;
                pem_check("--tls-ca", path, &bytes, "CERTIFICATE")?;
                Some(String::from_utf8_lossy(&bytes).into_owned())
            }
            None => None,
        };
        let client = match (cert, key) {
            (Some(c), Some(k)) => {
                let cert = read("--tls-cert", c)?;
                pem_check("--tls-cert", c, &cert, "CERTIFICATE")?;
                let key = read("--tls-key", k)?;
                pem_check("--tls-key", k, &key, "PRIVATE KEY")?;
                Some((cert, key))
            }
            (None, None) => None,
            _ => {
                return Err(Error::Usage(
                    "--tls-cert and --tls-key go together (a client certificate and its key)"
                        .into(),
                ))
            }
        };
        if ca_pem.is_none() && client.is_none() {
            return Ok(None);
        }
        Ok(Some(Tls { ca_pem, client }))
    }

    fn lapin_config(&self) -> lapin::tcp::OwnedTLSConfig {
        lapin::tcp::OwnedTLSConfig {
            identity: self
                .client
                .as_ref()
                .map(|(pem, key)| lapin::tcp::OwnedIdentity::PKCS8 {
                    pem: pem.clone(),
                    key: key.clone(),
                }),
            cert_chain: self.ca_pem.clone(),
        }
    }
}

impl BrokerUrl {
    /// Parses an `amqp://` or `amqps://` URL.
    pub fn parse(url: &str) -> Result<Self> {
        crate::secrets::register_url(url);
        let uri: AMQPUri = url.parse().map_err(|e: String| Error::Url {
            url: redact(url),
            reason: redact_in(&e, url),
        })?;
        Ok(BrokerUrl { uri, tls: None })
    }

    /// The same URL with TLS settings for `amqps://` (a private CA, a
    /// client certificate).
    pub fn with_tls(mut self, tls: std::sync::Arc<Tls>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Its TLS settings, if any were given.
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_deref()
    }

    /// `host:port`, for messages.
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.uri.authority.host, self.uri.authority.port)
    }

    /// The host.
    pub fn host(&self) -> &str {
        &self.uri.authority.host
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.uri.authority.userinfo.username
    }

    /// The password (never log it).
    pub fn password(&self) -> &str {
        &self.uri.authority.userinfo.password
    }

    /// The virtual host.
    pub fn vhost(&self) -> &str {
        &self.uri.vhost
    }

    /// Whether the URL asks for TLS.
    pub fn is_tls(&self) -> bool {
        self.uri.scheme == AMQPScheme::AMQPS
    }

    /// The default management API URL: the AMQP host on port 15672 (15671
    /// over https for `amqps://`).
    pub fn default_management_url(&self) -> String {
        let host = if self.host().contains(':') {
            format!("[{}]", self.host())
        } else {
            self.host().to_string()
        };
        if self.is_tls() {
            format!("https://{host}:15671")
        } else {
            format!("http://{host}:15672")
        }
    }

    /// Connects, naming the connection (the management UI shows the name),
    /// within [`CONNECT_TIMEOUT`].
    pub async fn connect(&self, name: &str) -> Result<Connection> {
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(name.to_string()));
        let endpoint = self.endpoint();
        let fut = async {
            match &self.tls {
                Some(tls) if self.is_tls() => {
                    let runtime = lapin::runtime::default_runtime()?;
                    Connection::connect_uri_with_config(
                        self.uri.clone(),
                        props,
                        tls.lapin_config(),
                        runtime,
                    )
                    .await
                }
                _ => Connection::connect_uri(self.uri.clone(), props).await,
            }
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, fut).await {
            Err(_) => Err(Error::Connect {
                endpoint,
                reason: format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
                hint: start_hint(),
                unreachable: true,
            }),
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) if self.unresolvable().await => Err(Error::Connect {
                endpoint,
                reason: format!(
                    "the host name `{}` does not resolve ({})",
                    self.host(),
                    redact_in(&describe_lapin_error(&e), self.password())
                ),
                hint: "check the host name in --url / AMQP_URL (a typo, or a name only \
                       another network's DNS knows)"
                    .to_string(),
                unreachable: true,
            }),
            Ok(Err(e)) => Err(self.connect_error(&e)),
        }
    }

    /// Whether the URL's host is a name that does not resolve (asked only
    /// after a failed connection: a DNS failure deserves its own words,
    /// not "is RabbitMQ running?").
    async fn unresolvable(&self) -> bool {
        let host = self.host().trim_matches(|c| c == '[' || c == ']');
        if host.parse::<std::net::IpAddr>().is_ok() {
            return false;
        }
        let lookup = tokio::net::lookup_host((host, self.uri.authority.port));
        matches!(
            tokio::time::timeout(Duration::from_secs(5), lookup).await,
            Ok(Err(_))
        )
    }

    fn connect_error(&self, e: &lapin::Error) -> Error {
        let endpoint = self.endpoint();
        let text = redact_in(&describe_lapin_error(e), self.password());
        let failure = classify_connect_error(e);
        let unreachable = matches!(
            failure,
            ConnectFailure::Refused | ConnectFailure::ClosedInHandshake | ConnectFailure::Other
        );
        let (reason, hint) = match failure {
            ConnectFailure::LoginRefused => (
                format!("the broker refused the login of user `{}` ({text})", self.user()),
                "check the user name and password in --url / AMQP_URL, and that the user may use the virtual host".to_string(),
            ),
            ConnectFailure::VhostRefused => (
                format!("virtual host `{}` refused ({text})", self.vhost()),
                "check the virtual host in the URL (`/%2f` is the default vhost `/`) and the user's permissions on it".to_string(),
            ),
            ConnectFailure::Refused => (
                "connection refused (nothing listens there)".to_string(),
                start_hint(),
            ),
            ConnectFailure::Certificate(fix) => (
                format!("the broker's TLS certificate was refused ({text})"),
                fix.to_string(),
            ),
            ConnectFailure::NotTls if self.is_tls() => (
                format!("the TLS handshake failed ({text})"),
                "the port may speak plain AMQP: use amqp:// for it, or the broker's TLS port (5671 by default); with a private CA, give --tls-ca".to_string(),
            ),
            ConnectFailure::ClosedInHandshake | ConnectFailure::NotTls => (
                format!("the connection was closed during the handshake ({text})"),
                if self.is_tls() {
                    "check the TLS settings, the password and the virtual host".to_string()
                } else {
                    "a wrong password or vhost, a TLS port reached with amqp://, or connection \
                     parameters the broker refuses (such as a frame_max under 4096 in the URL) \
                     can cause this"
                        .to_string()
                },
            ),
            ConnectFailure::Protocol(code) => (
                format!("the broker closed the connection with {code} ({text})"),
                "check the connection parameters in the URL (frame_max, channel_max, heartbeat)".to_string(),
            ),
            ConnectFailure::Other => (text, start_hint()),
        };
        Error::Connect {
            endpoint,
            reason,
            hint,
            unreachable,
        }
    }
}

/// Why a connection attempt failed, from lapin's error kinds and the
/// broker's reply codes (never from the words of a message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectFailure {
    /// 403 ACCESS_REFUSED: user name or password.
    LoginRefused,
    /// 530 NOT_ALLOWED: the virtual host.
    VhostRefused,
    /// Nothing listens on the port.
    Refused,
    /// A TLS-level failure (or bytes that are not TLS).
    NotTls,
    /// The broker's certificate was refused; what to fix.
    Certificate(&'static str),
    /// The peer closed or reset the socket during the handshake.
    ClosedInHandshake,
    /// Another AMQP reply code.
    Protocol(u16),
    /// Anything else.
    Other,
}

fn classify_connect_error(e: &lapin::Error) -> ConnectFailure {
    use std::io::ErrorKind as Io;
    if let Some((code, _)) = amqp_reply(e) {
        return match code {
            403 => ConnectFailure::LoginRefused,
            530 => ConnectFailure::VhostRefused,
            c => ConnectFailure::Protocol(c),
        };
    }
    match e.kind() {
        lapin::ErrorKind::IOError(io) => match (tls_certificate_error(io), io.kind()) {
            (Some(fix), _) => ConnectFailure::Certificate(fix),
            (None, Io::ConnectionRefused) => ConnectFailure::Refused,
            (None, Io::InvalidData) => ConnectFailure::NotTls,
            (
                None,
                Io::ConnectionReset | Io::ConnectionAborted | Io::UnexpectedEof | Io::BrokenPipe,
            ) => ConnectFailure::ClosedInHandshake,
            (None, _) => ConnectFailure::Other,
        },
        lapin::ErrorKind::InvalidConnectionState(_) => ConnectFailure::ClosedInHandshake,
        _ => ConnectFailure::Other,
    }
}

/// What to fix when the TLS layer refused the broker's certificate, from
/// the rustls error inside the I/O error (its kind, not its words).
fn tls_certificate_error(io: &std::io::Error) -> Option<&'static str> {
    use rustls::CertificateError as C;
    let mut source: Option<&(dyn std::error::Error + 'static)> = io.get_ref().map(|e| e as _);
    while let Some(e) = source {
        if let Some(rustls::Error::InvalidCertificate(c)) = e.downcast_ref::<rustls::Error>() {
            return Some(match c {
                C::UnknownIssuer | C::BadSignature => {
                    "the certificate is not signed by a CA dlqctl trusts: give --tls-ca FILE with \
                     the CA certificate (PEM) that signed the broker's"
                }
                C::Expired | C::ExpiredContext { .. } => {
                    "the broker's certificate has expired: renew it on the broker (check the \
                     clocks too)"
                }
                C::NotValidYet | C::NotValidYetContext { .. } => {
                    "the broker's certificate is not valid yet: check the clocks of both machines"
                }
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    "the certificate does not name the host of the URL: connect with a host name \
                     the certificate lists (its subjectAltName)"
                }
                _ => "check the broker's certificate and --tls-ca",
            });
        }
        source = e.source();
    }
    None
}

/// How long closing a connection may take before dlqctl stops waiting.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Closes a connection politely, waiting at most [`CLOSE_TIMEOUT`] (a
/// broker that stopped answering must not hold a one-shot command).
pub async fn close(conn: &Connection) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.close(200, "bye".into())).await;
}

fn start_hint() -> String {
    "is RabbitMQ running? Start a local broker with `rabbitmq-server -detached` \
     (or `docker compose up -d` where Docker runs), or point --url / AMQP_URL at yours"
        .to_string()
}

/// The URL as errors and logs show it: the one redaction of the core
/// ([`crate::core::values::redact::url`]), which also hides the secrets
/// of a URL that does not parse.
pub fn redact(url: &str) -> String {
    crate::core::values::redact::url(url)
}

/// `text` scrubbed of every secret `url` holds (or of `url` itself when
/// it is a bare password), in every written form.
pub(crate) fn redact_in(text: &str, secret_or_url: &str) -> String {
    let mut secrets = crate::core::values::redact::secrets(secret_or_url);
    secrets.push(secret_or_url.to_string());
    crate::core::values::redact::scrub(text, &secrets)
}

/// The AMQP reply code and text of a broker error, if it is one.
pub(crate) fn amqp_reply(e: &lapin::Error) -> Option<(u16, String)> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            Some((amqp.get_id(), amqp.get_message().to_string()))
        }
        _ => None,
    }
}

/// Converts an argument table to AMQP (integers as signed 64-bit).
pub fn field_table(args: &Arguments) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in args {
        t.insert(ShortString::from(k.clone()), amqp_value(v));
    }
    t
}

/// One argument value in AMQP.
pub fn amqp_value(v: &ArgValue) -> AMQPValue {
    match v {
        ArgValue::Int(i) => AMQPValue::LongLongInt(*i),
        ArgValue::Str(s) => AMQPValue::LongString(LongString::from(s.clone())),
        ArgValue::Bool(b) => AMQPValue::Boolean(*b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("amqp://guest:s3cret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(redact("amqp://host/%2f"), "amqp://host/%2f");
        assert_eq!(redact("amqps://u:p@h"), "amqps://u:***@h");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(
            redact_in("failed for amqp://u:hunter2@h", "amqp://u:hunter2@h"),
            "failed for ***"
        );
        assert_eq!(
            redact_in("password hunter2 wrong", "amqp://u:hunter2@h"),
            "password *** wrong"
        );
    }

    #[test]
    fn parses_urls_and_derives_management_url() {
        let u = BrokerUrl::parse(DEFAULT_URL).unwrap();
        assert_eq!(u.endpoint(), "127.0.0.1:5672");
        assert_eq!(u.user(), "guest");
        assert_eq!(u.vhost(), "/");
        assert!(!u.is_tls());
        assert_eq!(u.default_management_url(), "http://127.0.0.1:15672");
        let u = BrokerUrl::parse("amqps://u:p@rabbit.example/prod").unwrap();
        assert_eq!(u.endpoint(), "rabbit.example:5671");
        assert_eq!(u.vhost(), "prod");
        assert_eq!(u.default_management_url(), "https://rabbit.example:15671");
    }

    #[test]
    fn redacts_passwords_with_url_delimiters_in_them() {
        for pw in [
            "S3c/retPW",
            "p@ss",
            "a:b:c",
            "50%off",
            "p#rt",
            "q?x=1",
            "x",
            "ab",
            "/",
            "@@",
            "%2F",
        ] {
            for url in [
                format!("amqp://guest:{pw}@127.0.0.1:5673/%2f"),
                format!("amqps://guest:{pw}@host"),
                format!("http://guest:{pw}@127.0.0.1:15672"),
                format!("amqp://guest:{pw}@"),
            ] {
                let r = redact(&url);
                assert!(r.starts_with(&url[..url.find("://").unwrap() + 3]), "{r}");
                assert!(r.contains("guest:***@"), "{url} -> {r}");
                let after_user = &r[r.find("guest:").unwrap() + 6..];
                let hidden = &after_user[..after_user.rfind('@').unwrap()];
                assert_eq!(hidden, "***", "{url} -> {r}");
                // A URL that does not parse must not echo it either.
                if let Err(e) = BrokerUrl::parse(&url) {
                    let text = e.to_string();
                    if pw.len() >= 3 {
                        assert!(!text.contains(pw), "{url} -> {text}");
                    }
                    assert!(!text.contains(&format!(":{pw}@")), "{url} -> {text}");
                }
            }
        }
        assert_eq!(redact("guest:pw@host"), "***@host");
    }

    #[test]
    fn a_bad_url_of_any_shape_does_not_echo_its_secrets() {
        for (url, secrets) in [
            (
                "amqp://u:%41bc%2Fdef@host:notaport/",
                &["%41bc%2Fdef", "Abc/def"][..],
            ),
            ("amqp://qSecret9@host:notaport/", &["qSecret9"]),
            ("amqp://u:se/cret@[::1:notaport/", &["se/cret"]),
            (
                "amqp://u:x@host/?password=qSecret9&frame_max=x",
                &["qSecret9"],
            ),
            ("amqps://u:qSecret9@host:99999/", &["qSecret9"]),
        ] {
            let e = BrokerUrl::parse(url).map(|_| ()).unwrap_err().to_string();
            for s in secrets {
                assert!(!e.contains(s), "{url}: {e}");
            }
        }
    }

    #[test]
    fn a_bad_url_does_not_echo_the_password() {
        let e = BrokerUrl::parse("amqp://u:hunter2@host:notaport/").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert!(BrokerUrl::parse("http://x").is_err());
    }

    #[test]
    fn arguments_become_typed_amqp_values() {
        let mut a = Arguments::new();
        a.insert("x-message-ttl".into(), ArgValue::Int(1000));
        a.insert("x-queue-type".into(), ArgValue::Str("quorum".into()));
        a.insert("x-single-active-consumer".into(), ArgValue::Bool(true));
        let t = field_table(&a);
        let m = t.inner();
        assert_eq!(m.get("x-message-ttl"), Some(&AMQPValue::LongLongInt(1000)));
        assert_eq!(
            m.get("x-queue-type"),
            Some(&AMQPValue::LongString("quorum".into()))
        );
        assert_eq!(
            m.get("x-single-active-consumer"),
            Some(&AMQPValue::Boolean(true))
        );
    }
}
