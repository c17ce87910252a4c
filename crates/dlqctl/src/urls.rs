//! The URLs dlqctl is given, parsed by the parsers of the clients that
//! will use them, where they are given: a topology file's at `validate`
//! (and by every command that reads the file), at their line and column
//! ([`CLIENT_PARSERS`], given to the core's parser); the command line's
//! before anything is contacted.
//!
//! What these parsers refuse is decided from the URL alone (its syntax,
//! scheme, port range, host form, a store's database number): a
//! configuration error. What only a connection tells (DNS, connect, TLS,
//! an answer) is the server's.

use crate::core::topology::UrlCheck;

/// An `http://` or `https://` URL as reqwest will send a request to it:
/// parsed by the `url` crate (reqwest's), with a host, and convertible to
/// the request URI reqwest builds; or why not.
///
/// # Errors
///
/// Why no request to `url` can be built, in words that do not repeat the
/// URL (the caller names it, redacted).
pub fn http(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "its scheme is `{}`: it must be http:// or https://",
            parsed.scheme()
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("no host".into());
    }
    parsed
        .as_str()
        .parse::<http::Uri>()
        .map_err(|e| format!("not a request URI: {e}"))?;
    Ok(parsed)
}

/// A `redis://` or `rediss://` store URL as the redis crate reads it
/// (host, port, database number, TLS fragment, protocol), with a host and
/// a database number of 0 or more; or why not. Which databases the server
/// has is the server's to say (the store refuses a number past them when
/// it opens).
///
/// # Errors
///
/// Why the store could not be opened from `url`, without the URL.
#[cfg(feature = "redis")]
pub fn redis(url: &str) -> Result<(), String> {
    use redis::{ConnectionAddr, IntoConnectionInfo};
    // The redis crate parses with the url crate, then reads the parts.
    if let Err(e) = reqwest::Url::parse(url) {
        return Err(e.to_string());
    }
    let info = url.into_connection_info().map_err(|e| {
        let text = e.to_string();
        if text.contains("database number") {
            "its database (the path, /0 to /15 on a default server) is not a number".to_string()
        } else if text.contains("Missing hostname") {
            "no host (redis://HOST:PORT/DB)".to_string()
        } else {
            text.trim_end_matches(" - InvalidClientConfig").to_string()
        }
    })?;
    let host = match info.addr() {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => Some(host),
        _ => None,
    };
    if host.is_some_and(String::is_empty) {
        return Err("no host (redis://HOST:PORT/DB)".into());
    }
    let db = info.redis_settings().db();
    if db < 0 {
        return Err(format!("its database is {db}: database numbers start at 0"));
    }
    Ok(())
}

/// Without the Redis store built in, a `redis://` URL is refused when the
/// store is opened; its form is the core's.
#[cfg(not(feature = "redis"))]
pub fn redis(_url: &str) -> Result<(), String> {
    Ok(())
}

/// The clients' parsers, for [`crate::core::topology::parse_topology_with`].
pub struct ClientParsers;

impl UrlCheck for ClientParsers {
    fn http(&self, url: &str) -> Result<(), String> {
        http(url).map(drop)
    }

    fn store(&self, url: &str) -> Result<(), String> {
        redis(url)
    }
}

/// What [`crate::load_topology`] and [`crate::parse_topology`] check a
/// topology file's URLs with.
pub static CLIENT_PARSERS: ClientParsers = ClientParsers;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_are_refused_for_what_the_url_alone_says() {
        for ok in [
            "http://h/x",
            "https://h:8443/health?x=1",
            "http://[::1]:8080/",
            "http://user:pw@h/x",
        ] {
            assert!(http(ok).is_ok(), "{ok}: {:?}", http(ok));
        }
        for (bad, why) in [
            ("http://[::1/x", "invalid IPv6 address"),
            ("http://h:99999/x", "invalid port number"),
            ("ftp://h/x", "it must be http:// or https://"),
            ("http://:80/x", "empty host"),
            ("h:80/x", "it must be http"),
            ("not a url", "relative URL without a base"),
        ] {
            let e = http(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_urls_are_refused_for_what_the_url_alone_says() {
        for ok in [
            "redis://h:6379/0",
            "redis://h",
            "rediss://:pw@h:6380/3",
            "rediss://h/#insecure",
            "redis://h/15?protocol=resp3",
        ] {
            assert_eq!(redis(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("redis://", "no host"),
            ("redis:///0", "no host"),
            ("redis://h:port/0", "invalid port number"),
            ("redis://h:99999/0", "invalid port number"),
            ("redis://h:6379/zero", "is not a number"),
            ("redis://h/-1", "database numbers start at 0"),
            ("redis://0.0.0.0/0", "wildcard"),
            ("rediss://h/#other", "fragment"),
            ("redis://h/?protocol=9", "protocol"),
        ] {
            let e = redis(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
