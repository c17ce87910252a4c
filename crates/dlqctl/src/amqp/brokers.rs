//! Several broker addresses (the nodes of a cluster): every command tries
//! them in the order given and uses the first that answers; the worker
//! moves on to the next one when its connection is lost.
//!
//! Addresses come from repeated `--url` options or one comma-separated
//! `AMQP_URL` (`amqp://u:p@node1:5672/%2f,amqp://u:p@node2:5672/%2f`). A
//! comma inside a URL must be percent-encoded (`%2C`).

use crate::amqp::connection::BrokerUrl;
use crate::error::{Error, Result};
use lapin::Connection;

/// The broker addresses to try, in order (at least one).
#[derive(Clone, Debug)]
pub struct Brokers {
    urls: Vec<BrokerUrl>,
}

/// Splits each input at commas, trims, and drops empty entries.
pub fn split_list<S: AsRef<str>>(inputs: &[S]) -> Vec<String> {
    inputs
        .iter()
        .flat_map(|s| s.as_ref().split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl Brokers {
    /// Parses every address (each input may hold a comma-separated list).
    pub fn parse<S: AsRef<str>>(inputs: &[S]) -> Result<Self> {
        let list = split_list(inputs);
        if list.is_empty() {
            return Err(Error::Usage(
                "no broker URL: give --url (or AMQP_URL) at least once".into(),
            ));
        }
        let urls = list
            .iter()
            .map(|u| BrokerUrl::parse(u))
            .collect::<Result<Vec<_>>>()?;
        Ok(Brokers { urls })
    }

    /// The same addresses with TLS settings (used by `amqps://` ones).
    pub fn with_tls(mut self, tls: Option<crate::amqp::connection::Tls>) -> Self {
        if let Some(tls) = tls {
            let tls = std::sync::Arc::new(tls);
            self.urls = self
                .urls
                .into_iter()
                .map(|u| u.with_tls(tls.clone()))
                .collect();
        }
        self
    }

    /// A management API client for address `index` (see
    /// [`Brokers::management_url`]), with that address's credentials and
    /// CA.
    pub fn management<S: AsRef<str>>(
        &self,
        explicit: &[S],
        index: usize,
    ) -> Result<crate::amqp::mgmt::Management> {
        let url = self.get(index);
        crate::amqp::mgmt::Management::with_ca(
            &self.management_url(explicit, index),
            url.user(),
            url.password(),
            url.tls().and_then(|t| t.ca_pem.as_deref()),
        )
    }

    /// Connects as [`Brokers::connect`] does, with the management API
    /// client of the address that answered; the connection is closed
    /// again when that client cannot be made.
    pub async fn connect_with_management<S: AsRef<str>>(
        &self,
        explicit: &[S],
        name: &str,
    ) -> Result<(Connection, usize, crate::amqp::mgmt::Management)> {
        let (conn, at) = self.connect(name).await?;
        match self.management(explicit, at) {
            Ok(mgmt) => Ok((conn, at, mgmt)),
            Err(e) => {
                crate::amqp::connection::close(&conn).await;
                Err(e)
            }
        }
    }

    /// Every address, in order.
    pub fn urls(&self) -> &[BrokerUrl] {
        &self.urls
    }

    /// The address at `index` (wrapping around).
    pub fn get(&self, index: usize) -> &BrokerUrl {
        &self.urls[index % self.urls.len()]
    }

    /// How many addresses there are.
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Always false: there is at least one address.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// `host:port` of every address, comma-separated, for messages.
    pub fn endpoints(&self) -> String {
        self.urls
            .iter()
            .map(BrokerUrl::endpoint)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Connects to the first address that answers.
    pub async fn connect(&self, name: &str) -> Result<(Connection, usize)> {
        self.connect_from(0, name).await
    }

    /// Connects to the first address that answers, trying them in order
    /// from `start` and wrapping around; returns the connection and the
    /// index of its address. With one address its error is returned as it
    /// is; with several, one error names each address and why it failed.
    pub async fn connect_from(&self, start: usize, name: &str) -> Result<(Connection, usize)> {
        let n = self.urls.len();
        let mut failures = Vec::new();
        for k in 0..n {
            let i = (start + k) % n;
            match self.urls[i].connect(name).await {
                Ok(conn) => {
                    if !failures.is_empty() {
                        tracing::info!(
                            endpoint = %self.urls[i].endpoint(),
                            skipped = failures.len(),
                            "connected to a later broker address; the ones before it did not answer"
                        );
                    }
                    return Ok((conn, i));
                }
                Err(e) if n == 1 => return Err(e),
                Err(e) => {
                    tracing::debug!(endpoint = %self.urls[i].endpoint(), error = %e, "broker address did not answer");
                    failures.push((i, e));
                }
            }
        }
        Err(all_failed(self, failures))
    }

    /// The management API URL of address `index`: `explicit[index]` when
    /// `--management-url` gave as many (the first one when it gave fewer),
    /// else the one derived from that AMQP address.
    pub fn management_url<S: AsRef<str>>(&self, explicit: &[S], index: usize) -> String {
        let explicit = split_list(explicit);
        match explicit.get(index).or(explicit.first()) {
            Some(url) => url.clone(),
            None => self.get(index).default_management_url(),
        }
    }
}

fn all_failed(brokers: &Brokers, failures: Vec<(usize, Error)>) -> Error {
    let reasons: Vec<String> = failures
        .iter()
        .map(|(i, e)| match e {
            Error::Connect { reason, .. } => format!("{}: {reason}", brokers.urls[*i].endpoint()),
            other => format!("{}: {other}", brokers.urls[*i].endpoint()),
        })
        .collect();
    let hint = failures
        .iter()
        .find_map(|(_, e)| match e {
            Error::Connect { hint, .. } => Some(hint.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let unreachable = failures.iter().any(|(_, e)| {
        matches!(
            e,
            Error::Connect {
                unreachable: true,
                ..
            }
        )
    });
    Error::Connect {
        endpoint: brokers.endpoints(),
        reason: format!("no address answered ({})", reasons.join("; ")),
        hint,
        unreachable,
    }
}

impl From<BrokerUrl> for Brokers {
    fn from(url: BrokerUrl) -> Self {
        Brokers { urls: vec![url] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_split_at_commas_and_repeat() {
        assert_eq!(
            split_list(&["amqp://a:5672/%2f, amqp://b:5672/%2f", " ", "amqp://c/%2f,"]),
            vec!["amqp://a:5672/%2f", "amqp://b:5672/%2f", "amqp://c/%2f"]
        );
        assert!(split_list::<&str>(&[]).is_empty());
    }

    #[test]
    fn parses_every_address_and_refuses_none_or_a_bad_one() {
        let b = Brokers::parse(&["amqp://u:p@n1:5680/%2f,amqp://u:p@n2:5681/%2f"]).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b.endpoints(), "n1:5680, n2:5681");
        assert_eq!(b.get(3).endpoint(), "n2:5681");
        assert!(matches!(Brokers::parse(&[" , "]), Err(Error::Usage(_))));
        let e = Brokers::parse(&["amqp://u:secret@n1/%2f", "http://x"]).unwrap_err();
        assert!(matches!(e, Error::Url { .. }), "{e}");
        assert!(!e.to_string().contains("secret"));
    }

    #[test]
    fn management_urls_follow_the_addresses() {
        let b = Brokers::parse(&["amqp://n1:5680/%2f", "amqps://n2:5671/%2f"]).unwrap();
        let none: [&str; 0] = [];
        assert_eq!(b.management_url(&none, 0), "http://n1:15672");
        assert_eq!(b.management_url(&none, 1), "https://n2:15671");
        assert_eq!(
            b.management_url(&["http://m1:15680,http://m2:15681"], 1),
            "http://m2:15681"
        );
        assert_eq!(b.management_url(&["http://m1:15680"], 1), "http://m1:15680");
    }

    #[tokio::test]
    async fn connect_names_every_address_that_failed() {
        // Ports nothing listens on (refused at once).
        let b = Brokers::parse(&["amqp://127.0.0.1:1/%2f,amqp://127.0.0.1:2/%2f"]).unwrap();
        let e = b.connect("test").await.unwrap_err().to_string();
        assert!(
            e.starts_with("cannot connect to RabbitMQ at 127.0.0.1:1, 127.0.0.1:2: no address answered (127.0.0.1:1: connection refused"),
            "{e}"
        );
        assert!(e.contains("; 127.0.0.1:2: connection refused"), "{e}");
    }
}
