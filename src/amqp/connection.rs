//! Connecting to RabbitMQ: URL handling without leaking passwords, named
//! connections, bounded connect time, errors a user can act on.

use crate::core::topology::{ArgValue, Arguments};
use crate::error::{Error, Result};
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
}

impl BrokerUrl {
    /// Parses an `amqp://` or `amqps://` URL.
    pub fn parse(url: &str) -> Result<Self> {
        let uri: AMQPUri = url.parse().map_err(|e: String| Error::Url {
            url: redact(url),
            reason: redact_in(&e, url),
        })?;
        Ok(BrokerUrl { uri })
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
        let fut = Connection::connect_uri(self.uri.clone(), props);
        match tokio::time::timeout(CONNECT_TIMEOUT, fut).await {
            Err(_) => Err(Error::Connect {
                endpoint,
                reason: format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
                hint: start_hint(),
            }),
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(self.connect_error(&e)),
        }
    }

    fn connect_error(&self, e: &lapin::Error) -> Error {
        let endpoint = self.endpoint();
        let user = self.user().to_string();
        let text = redact_in(&describe_lapin_error(e), self.password());
        let lower = text.to_lowercase();
        if lower.contains("access_refused") || lower.contains("403") || lower.contains("login") {
            return Error::Connect {
                endpoint,
                reason: format!("the broker refused the login of user `{user}` ({text})"),
                hint: "check the user name and password in --url / AMQP_URL, and that the user may use the virtual host".into(),
            };
        }
        if lower.contains("not_allowed") || lower.contains("530") || lower.contains("vhost") {
            return Error::Connect {
                endpoint,
                reason: format!("virtual host `{}` refused ({text})", self.vhost()),
                hint: "check the virtual host in the URL (`/%2f` is the default vhost `/`)".into(),
            };
        }
        let reason = if lower.contains("refused") {
            "connection refused (nothing listens there)".to_string()
        } else if lower.contains("invalidconnectionstate")
            || lower.contains("reset")
            || lower.contains("eof")
        {
            format!("the connection was closed during the handshake ({text}); a wrong password or vhost, or a TLS/plain mismatch, can cause this")
        } else {
            text
        };
        Error::Connect {
            endpoint,
            reason,
            hint: start_hint(),
        }
    }
}

fn start_hint() -> String {
    "is RabbitMQ running? Start a local broker with `rabbitmq-server -detached` \
     (or `docker compose up -d` where Docker runs), or point --url / AMQP_URL at yours"
        .to_string()
}

/// The URL with its password replaced by `***`.
pub fn redact(url: &str) -> String {
    // scheme://user:pass@host...
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let auth_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..auth_end].rfind('@') {
            let userinfo = &rest[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &rest[at..]
                );
            }
        }
    }
    url.to_string()
}

/// `text` with every occurrence of `secret` (and of the URL's password)
/// replaced by `***`.
pub fn redact_in(text: &str, secret_or_url: &str) -> String {
    let mut out = text.to_string();
    let mut secrets = vec![secret_or_url.to_string()];
    if let Ok(u) = secret_or_url.parse::<AMQPUri>() {
        secrets.push(u.authority.userinfo.password);
    }
    for s in secrets {
        if s.len() >= 3 {
            out = out.replace(&s, "***");
        }
    }
    out
}

/// A lapin error in a user's words: the broker's reply text where there is one.
pub fn describe_lapin_error(e: &lapin::Error) -> String {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            format!("{} ({})", amqp.get_message(), amqp.get_id())
        }
        lapin::ErrorKind::IOError(io) => io.to_string(),
        _ => e.to_string(),
    }
}

/// The AMQP reply code and text of a broker error, if it is one.
pub fn amqp_reply(e: &lapin::Error) -> Option<(u16, String)> {
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
