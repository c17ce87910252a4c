//! The rules `dlqctl serve` applies to each request before it reaches a
//! page: who may listen where, which `Host` is ours, whether a token or a
//! CSRF token matches, whether a POST comes from our own pages. Pure; the
//! server calls these.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The cookie the login form sets to the token.
pub const TOKEN_COOKIE: &str = "dlqctl_token";

/// Why `serve` refuses to start on an address.
pub fn refuse_listen(listen: SocketAddr, has_token: bool) -> Option<String> {
    if listen.ip().is_loopback() || has_token {
        return None;
    }
    Some(format!(
        "--listen {listen} is reachable from other machines, and the page can replay and \
         purge DLQs: give --auth-token (or DLQCTL_AUTH_TOKEN) of at least {MIN_TOKEN_CHARS} \
         characters so that only those who know it can use it (for example this random one: \
         {}), or listen on 127.0.0.1",
        random_token()
    ))
}

/// The fewest characters an `--auth-token` may have.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Why `token` cannot guard a server: fewer than [`MIN_TOKEN_CHARS`]
/// characters, or whitespace or control characters (which a header or a
/// pasted form would change). The message offers a random token.
pub fn refuse_token(token: &str) -> Option<String> {
    let problem = if token.chars().count() < MIN_TOKEN_CHARS {
        format!("has {} character(s)", token.chars().count())
    } else if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "holds whitespace or control characters".to_string()
    } else {
        return None;
    };
    Some(format!(
        "--auth-token (or DLQCTL_AUTH_TOKEN) {problem}: a token needs at least \
         {MIN_TOKEN_CHARS} characters, none of them whitespace or control characters \
         (a short token is guessed). For example, this random one: {}",
        random_token()
    ))
}

/// A random token: 32 hex digits (128 bits).
pub fn random_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The login cookie's value for `token` on one server run: a SHA-256 of
/// the run's random `salt` and the token, in hex. The cookie never holds
/// the token itself, hex needs no escaping whatever the token's
/// characters (`/`, `+`, `=` of a base64 token), and a cookie of an
/// earlier run of the server is no longer taken.
pub fn cookie_value(token: &str, salt: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"dlqctl serve login\0");
    h.update(salt.as_bytes());
    h.update(b"\0");
    h.update(token.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Wrong tokens a client may try at once before it must wait.
pub const GUESS_BURST: u32 = 10;
/// How often one more wrong token is allowed per client, past the burst.
pub const GUESS_EVERY: Duration = Duration::from_secs(1);
/// The same for all clients together (many addresses).
pub const GUESS_BURST_ALL: u32 = 100;
/// See [`GUESS_BURST_ALL`].
pub const GUESS_EVERY_ALL: Duration = Duration::from_millis(100);
/// Clients remembered at most (the rest share the global bound).
const MAX_CLIENTS: usize = 10_000;

/// A token bucket: `burst` tries, one more every `every`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tries: f64,
    at: Instant,
}

impl Bucket {
    fn full(now: Instant, burst: u32) -> Self {
        Bucket {
            tries: f64::from(burst),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant, burst: u32, every: Duration) {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() / every.as_secs_f64();
        self.tries = (self.tries + gained).min(f64::from(burst));
        self.at = now;
    }

    /// How long until one try is available (zero: now).
    fn wait(&self, every: Duration) -> Duration {
        if self.tries >= 1.0 {
            Duration::ZERO
        } else {
            every.mul_f64(1.0 - self.tries)
        }
    }
}

/// Throttles token guesses: every request that presents a token (a bearer
/// header, a login cookie, the login form) takes a try before the token is
/// compared, and a right token gives it back. A client (an IPv4 address,
/// an IPv6 /64) has [`GUESS_BURST`] tries, then one per [`GUESS_EVERY`];
/// all clients together [`GUESS_BURST_ALL`], then one per
/// [`GUESS_EVERY_ALL`]. Memory is bounded: at most 10,000 clients are
/// remembered.
#[derive(Debug)]
pub struct Throttle {
    clients: HashMap<u64, Bucket>,
    all: Bucket,
}

/// The key of a client: an IPv4 address, or the /64 of an IPv6 one (a
/// host usually holds a whole /64).
fn client_key(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => u64::from(u32::from(v4)),
            None => (u128::from(v6) >> 64) as u64 | (1 << 63),
        },
    }
}

impl Throttle {
    /// A throttle with every bucket full.
    pub fn new(now: Instant) -> Self {
        Throttle {
            clients: HashMap::new(),
            all: Bucket::full(now, GUESS_BURST_ALL),
        }
    }

    /// Takes a try for `client`: `Err(wait)` when it (or everyone) must
    /// wait that long first.
    pub fn take(&mut self, client: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        self.all.refill(now, GUESS_BURST_ALL, GUESS_EVERY_ALL);
        if self.clients.len() >= MAX_CLIENTS {
            self.clients.retain(|_, b| {
                b.refill(now, GUESS_BURST, GUESS_EVERY);
                b.tries < f64::from(GUESS_BURST)
            });
        }
        let room = self.clients.len() < MAX_CLIENTS;
        let bucket = match client.map(client_key) {
            Some(key) if room || self.clients.contains_key(&key) => Some(
                self.clients
                    .entry(key)
                    .or_insert_with(|| Bucket::full(now, GUESS_BURST)),
            ),
            _ => None,
        };
        let mut wait = self.all.wait(GUESS_EVERY_ALL);
        if let Some(b) = &bucket {
            let mut b = **b;
            b.refill(now, GUESS_BURST, GUESS_EVERY);
            wait = wait.max(b.wait(GUESS_EVERY));
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        if let Some(b) = bucket {
            b.refill(now, GUESS_BURST, GUESS_EVERY);
            b.tries -= 1.0;
        }
        self.all.tries -= 1.0;
        Ok(())
    }

    /// Gives back the try of a right token.
    pub fn give_back(&mut self, client: Option<IpAddr>) {
        self.all.tries = (self.all.tries + 1.0).min(f64::from(GUESS_BURST_ALL));
        if let Some(b) = client.and_then(|c| self.clients.get_mut(&client_key(c))) {
            b.tries = (b.tries + 1.0).min(f64::from(GUESS_BURST));
        }
    }
}

/// Compares two secrets in time that does not depend on where they differ.
pub fn same_secret(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    if a.len() != b.len() || b.is_empty() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The host part of a `Host` header (`[::1]:8088` → `::1`,
/// `localhost:8088` → `localhost`), lowercased.
pub fn host_name(host: &str) -> String {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
            .map_or(host, |(name, _)| name)
    };
    name.to_ascii_lowercase()
}

/// Whether a request's `Host` names this server. Without a token, a page on
/// loopback is open to any process of the machine, and to a web page a
/// browser loaded from anywhere when its name resolves to 127.0.0.1 (DNS
/// rebinding): so only loopback names, the listen address and the
/// `allowed` names are taken. With a token, the token guards it and every
/// name is taken.
pub fn host_allowed(
    host: Option<&str>,
    listen: SocketAddr,
    has_token: bool,
    allowed: &[String],
) -> bool {
    if has_token {
        return true;
    }
    let Some(host) = host else { return false };
    let name = host_name(host);
    if name == "localhost" || allowed.iter().any(|a| a.eq_ignore_ascii_case(&name)) {
        return true;
    }
    match name.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || ip == listen.ip(),
        Err(_) => false,
    }
}

/// Whether a POST's `Origin` (when the browser sent one) is this server as
/// the request's `Host` names it. A browser always sends `Origin` on a
/// cross-site POST, so a form on another site is refused here even before
/// its CSRF token is checked.
pub fn origin_allowed(origin: Option<&str>, host: Option<&str>) -> bool {
    let Some(origin) = origin else { return true };
    let Some(host) = host else { return false };
    let bare = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    bare.is_some_and(|b| b.eq_ignore_ascii_case(host.trim()))
}

/// Whether a browser request may go on, from its `Sec-Fetch-*` headers
/// (absent from clients that are not browsers, which are let through).
/// Every read of a DLQ page takes the DLQ's lock and reads the whole DLQ,
/// so another site's page must not make the browser do it unseen (an
/// `<img>` or a `fetch`): a request from another site is refused unless it
/// is the user following a link to one of our pages (a top-level GET
/// navigation). Our two static files are taken from anywhere.
pub fn fetch_allowed(
    site: Option<&str>,
    mode: Option<&str>,
    dest: Option<&str>,
    is_get: bool,
    is_asset: bool,
) -> bool {
    match site {
        Some("cross-site") | Some("same-site") => {
            is_asset || (is_get && mode == Some("navigate") && dest.is_none_or(|d| d == "document"))
        }
        _ => true,
    }
}

/// Whether a link followed from another site to `path` gets a page that
/// asks to continue instead of the page itself: every page but the
/// overview (`/`) reads a DLQ under its lock, and another site must not be
/// able to make a browser do that by opening a window on it.
pub fn asks_to_continue(site: Option<&str>, mode: Option<&str>, path: &str) -> bool {
    matches!(site, Some("cross-site") | Some("same-site"))
        && mode == Some("navigate")
        && !matches!(path, "/" | "/login")
}

/// Where a continue page's link goes: `target` when it is a path of this
/// server, else `/` (`//host/...` would leave it).
pub fn continue_target(target: &str) -> &str {
    if target.starts_with('/') && !target.starts_with("//") && !target.starts_with("/\\") {
        target
    } else {
        "/"
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|part| {
        let (k, v) = part.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

/// The token of an `Authorization: Bearer TOKEN` header.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_loopback_may_listen_without_a_token() {
        assert_eq!(refuse_listen(addr("127.0.0.1:8088"), false), None);
        assert_eq!(refuse_listen(addr("[::1]:8088"), false), None);
        assert_eq!(refuse_listen(addr("127.0.0.2:1"), false), None);
        let why = refuse_listen(addr("0.0.0.0:8088"), false).unwrap();
        assert!(why.contains("--auth-token"), "{why}");
        assert!(refuse_listen(addr("10.0.0.5:8088"), false).is_some());
        assert!(refuse_listen(addr("[::]:8088"), false).is_some());
        assert_eq!(refuse_listen(addr("0.0.0.0:8088"), true), None);
    }

    #[test]
    fn secrets_match_only_when_equal_and_not_empty() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abd", "abc"));
        assert!(!same_secret("ab", "abc"));
        assert!(!same_secret("abcd", "abc"));
        assert!(!same_secret("", ""));
    }

    #[test]
    fn host_names_drop_the_port_and_brackets() {
        assert_eq!(host_name("localhost:8088"), "localhost");
        assert_eq!(host_name("LocalHost"), "localhost");
        assert_eq!(host_name("[::1]:8088"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("evil.example:80"), "evil.example");
    }

    #[test]
    fn without_a_token_only_our_own_names_are_taken() {
        let l = addr("127.0.0.1:8088");
        for ok in [
            "127.0.0.1:8088",
            "localhost:8088",
            "[::1]:8088",
            "127.0.0.1",
        ] {
            assert!(host_allowed(Some(ok), l, false, &[]), "{ok}");
        }
        for bad in [
            "evil.example:8088",
            "rebind.attacker.test",
            "10.0.0.1:8088",
            "",
        ] {
            assert!(!host_allowed(Some(bad), l, false, &[]), "{bad}");
        }
        assert!(!host_allowed(None, l, false, &[]));
        assert!(host_allowed(
            Some("dlq.internal:8088"),
            l,
            false,
            &["dlq.internal".into()]
        ));
        assert!(host_allowed(Some("evil.example"), l, true, &[]));
        let any = addr("10.1.2.3:8088");
        assert!(host_allowed(Some("10.1.2.3:8088"), any, false, &[]));
    }

    #[test]
    fn a_cross_site_origin_is_refused_and_a_missing_one_is_left_to_csrf() {
        let host = Some("127.0.0.1:8088");
        assert!(origin_allowed(Some("http://127.0.0.1:8088"), host));
        assert!(origin_allowed(Some("https://127.0.0.1:8088"), host));
        assert!(origin_allowed(None, host));
        assert!(!origin_allowed(Some("http://evil.example"), host));
        assert!(!origin_allowed(Some("null"), host));
        assert!(!origin_allowed(Some("http://127.0.0.1:8089"), host));
        assert!(!origin_allowed(Some("http://127.0.0.1:8088"), None));
    }

    #[test]
    fn another_sites_page_may_link_to_us_but_not_load_us_unseen() {
        // Not a browser, or our own page, or typed in the address bar.
        assert!(fetch_allowed(None, None, None, true, false));
        assert!(fetch_allowed(
            Some("same-origin"),
            Some("cors"),
            Some("empty"),
            false,
            false
        ));
        assert!(fetch_allowed(
            Some("none"),
            Some("navigate"),
            Some("document"),
            true,
            false
        ));
        // A link followed from another site.
        assert!(fetch_allowed(
            Some("cross-site"),
            Some("navigate"),
            Some("document"),
            true,
            false
        ));
        // An <img>, a fetch, an iframe, a form post from another site.
        assert!(!fetch_allowed(
            Some("cross-site"),
            Some("no-cors"),
            Some("image"),
            true,
            false
        ));
        assert!(!fetch_allowed(
            Some("cross-site"),
            Some("cors"),
            Some("empty"),
            true,
            false
        ));
        assert!(!fetch_allowed(
            Some("same-site"),
            Some("navigate"),
            Some("iframe"),
            true,
            false
        ));
        assert!(!fetch_allowed(
            Some("cross-site"),
            Some("navigate"),
            Some("document"),
            false,
            false
        ));
        // The stylesheet and script, from anywhere.
        assert!(fetch_allowed(
            Some("cross-site"),
            Some("no-cors"),
            Some("style"),
            true,
            true
        ));
    }

    #[test]
    fn a_link_from_another_site_to_a_dlq_page_asks_to_continue() {
        let nav = Some("navigate");
        assert!(asks_to_continue(
            Some("cross-site"),
            nav,
            "/pipelines/orders"
        ));
        assert!(asks_to_continue(Some("same-site"), nav, "/jobs/3"));
        assert!(!asks_to_continue(Some("cross-site"), nav, "/"));
        assert!(!asks_to_continue(Some("cross-site"), nav, "/login"));
        assert!(!asks_to_continue(
            Some("same-origin"),
            nav,
            "/pipelines/orders"
        ));
        assert!(!asks_to_continue(Some("none"), nav, "/pipelines/orders"));
        assert!(!asks_to_continue(None, None, "/pipelines/orders"));
        assert_eq!(continue_target("/pipelines/o?x=1"), "/pipelines/o?x=1");
        assert_eq!(continue_target("//evil.example/x"), "/");
        assert_eq!(continue_target("/\\evil.example"), "/");
        assert_eq!(continue_target("http://evil.example"), "/");
    }

    #[test]
    fn the_cookie_is_hex_and_differs_from_token_to_token_and_run_to_run() {
        let a = cookie_value("s3cr/t+tok=", "run1");
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(a, cookie_value("s3cr/t+tok=", "run1"));
        assert_ne!(a, cookie_value("s3cr/t+tok", "run1"));
        assert_ne!(a, cookie_value("s3cr/t+tok=", "run2"));
        assert!(!a.contains("s3cr"));
    }

    #[test]
    fn short_blank_or_spaced_tokens_are_refused() {
        for bad in [
            "",
            " ",
            "x",
            "                ",
            "fifteen-chars-x",
            "sixteen chars ok",
            "tab\tin-a-long-token",
        ] {
            assert!(refuse_token(bad).is_some(), "{bad:?}");
        }
        for good in [
            "sixteen-chars-ok",
            "s3cr/t+tok=en-for-tests",
            &random_token(),
        ] {
            assert_eq!(refuse_token(good), None, "{good:?}");
        }
        let why = refuse_token("x").unwrap();
        assert!(why.contains("at least 16"), "{why}");
        assert_ne!(random_token(), random_token());
        assert_eq!(random_token().len(), 32);
    }

    #[test]
    fn guesses_are_throttled_per_client_and_overall() {
        let t0 = Instant::now();
        let mut t = Throttle::new(t0);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..GUESS_BURST {
            assert_eq!(t.take(Some(a), t0), Ok(()));
        }
        let wait = t.take(Some(a), t0).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= GUESS_EVERY, "{wait:?}");
        // Another client is not held up by the first.
        assert_eq!(t.take(Some(b), t0), Ok(()));
        // A second later, one more try.
        let t1 = t0 + GUESS_EVERY;
        assert_eq!(t.take(Some(a), t1), Ok(()));
        assert!(t.take(Some(a), t1).is_err());
        // A right token gives its try back.
        t.give_back(Some(a));
        assert_eq!(t.take(Some(a), t1), Ok(()));
        // 600 guesses in 5 s from one client: about burst + 5 get through.
        let mut t = Throttle::new(t0);
        let through = (0..600)
            .filter(|k| {
                t.take(Some(a), t0 + Duration::from_millis(k * 5_000 / 600))
                    .is_ok()
            })
            .count();
        assert!(through <= GUESS_BURST as usize + 6, "{through}");
        // Many clients together are bounded too; one IPv6 /64 is one client.
        let mut t = Throttle::new(t0);
        let mut through = 0;
        for k in 0..1000u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + k));
            through += usize::from(t.take(Some(ip), t0).is_ok());
        }
        assert_eq!(through, GUESS_BURST_ALL as usize);
        let mut t = Throttle::new(t0);
        let v6 = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        for k in 0..GUESS_BURST {
            assert!(t.take(v6(&format!("2001:db8::{k:x}")), t0).is_ok());
        }
        assert!(t.take(v6("2001:db8::ffff"), t0).is_err());
        assert!(t.take(v6("2001:db8:0:1::1"), t0).is_ok());
    }

    #[test]
    fn cookies_and_bearer_tokens_are_read_exactly() {
        assert_eq!(
            cookie("a=1; dlqctl_token=xyz; b=2", TOKEN_COOKIE),
            Some("xyz")
        );
        assert_eq!(cookie("xdlqctl_token=1", TOKEN_COOKIE), None);
        assert_eq!(cookie("", TOKEN_COOKIE), None);
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
    }
}
