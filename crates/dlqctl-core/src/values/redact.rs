//! Secrets in URLs, one rule for every output: what a URL shows
//! ([`url`]), the secrets it holds ([`secrets`]), and any text with every
//! written form of them hidden ([`Scrubber`]).
//!
//! It works on the text as given and never trusts a parser: a URL that
//! does not parse is hidden all the same, and when in doubt more is
//! hidden, never less.
//!
//! - The user-info is everything between `://` and the LAST `@` (a
//!   password may hold `/`, `@`, `:`, `#`, `?` or `%` unencoded). With a
//!   `:` in it, the user before the first `:` is shown and the rest is the
//!   password; without one, all of it is taken for a password (Redis reads
//!   `redis://SECRET@host` so). Without `://`, all of it is hidden.
//! - After the host, a query parameter whose name says it holds a secret
//!   (`password`, `pass`, `pwd`, `token`, `secret`, `auth`, `key`,
//!   `api_key`, `sig`, ... in any case; [`secret_param`]) keeps its name
//!   and loses its value, and a fragment is hidden.
//! - Secrets are searched for in free text as they are written, wholly or
//!   partly percent-encoded (either case of hex), JSON-escaped or in
//!   Rust's debug form, and in base64 (alone, or inside a longer encoding
//!   at any alignment, the part that comes from the secret alone).

use std::borrow::Cow;

use base64::Engine as _;

#[cfg(test)]
mod tests;

/// What a hidden secret becomes.
pub const MASK: &str = "***";

/// Secrets shorter than this many bytes are not searched for in free text
/// (`ab` would hide every `ab` of a line); the display form of their URL
/// hides them all the same.
pub const MIN_SCRUBBED: usize = 3;

/// The scheme's `scheme://` (empty without one), the user-info (before
/// the last `@`) and what follows it.
fn split(text: &str) -> (&str, Option<&str>, &str) {
    let (head, rest) = match text.find("://") {
        Some(i) => text.split_at(i + 3),
        None => ("", text),
    };
    match rest.rfind('@') {
        Some(at) => (head, Some(&rest[..at]), &rest[at + 1..]),
        None => (head, None, rest),
    }
}

/// The user and password of a user-info that has a `:` (after a scheme).
fn user_password<'a>(head: &str, userinfo: &'a str) -> Option<(&'a str, &'a str)> {
    if head.is_empty() {
        return None;
    }
    userinfo.split_once(':')
}

/// Whether a query parameter of this name holds a secret.
pub fn secret_param(name: &str) -> bool {
    const EXACT: [&str; 8] = ["pass", "pwd", "pw", "auth", "key", "sig", "code", "sas"];
    const PARTS: [&str; 10] = [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "api_key",
        "api-key",
        "signature",
        "credential",
        "private",
    ];
    let name = percent_decode(name, true).to_ascii_lowercase();
    EXACT.contains(&name.as_str()) || PARTS.iter().any(|p| name.contains(p))
}

/// The query's `name=value` pairs, with their separators: (pair, the
/// separator after it or "").
fn pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut rest = Some(query);
    std::iter::from_fn(move || {
        let text = rest?;
        match text.find(['&', ';']) {
            Some(i) => {
                rest = Some(&text[i + 1..]);
                Some((&text[..i], &text[i..=i]))
            }
            None => {
                rest = None;
                Some((text, ""))
            }
        }
    })
}

/// The URL (or any text that may be one) as a log line or an error may
/// show it: its password, secret query values and fragment as `***`.
pub fn url(text: &str) -> String {
    let (head, userinfo, tail) = split(text);
    let mut out = String::with_capacity(text.len());
    out.push_str(head);
    if let Some(ui) = userinfo {
        if let Some((user, _)) = user_password(head, ui) {
            out.push_str(user);
            out.push(':');
        }
        out.push_str(MASK);
        out.push('@');
    }
    let (before, fragment) = match tail.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (tail, None),
    };
    match before.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            for (pair, sep) in pairs(query) {
                match pair.split_once('=') {
                    Some((name, _)) if secret_param(name) => {
                        out.push_str(name);
                        out.push('=');
                        out.push_str(MASK);
                    }
                    _ => out.push_str(pair),
                }
                out.push_str(sep);
            }
        }
        None => out.push_str(before),
    }
    if let Some(f) = fragment {
        out.push('#');
        if !f.is_empty() {
            out.push_str(MASK);
        }
    }
    out
}

/// The URL as an endpoint: without its user-info, query and fragment
/// (`https://host:port/path`), for the HTTP URLs dlqctl calls (a
/// handler, a health probe, a metrics page), where none of these names
/// the place.
pub fn endpoint(text: &str) -> String {
    let (head, _, tail) = split(text);
    let end = tail.find(['?', '#']).unwrap_or(tail.len());
    format!("{head}{}", &tail[..end])
}

/// The passwords a URL holds as written: the one after the user's `:`,
/// and the values of secret query parameters (a user-info without `:` is
/// taken for a user name here, though [`url`] hides it too).
pub fn passwords(text: &str) -> Vec<&str> {
    let (head, userinfo, tail) = split(text);
    let mut out: Vec<&str> = (userinfo.and_then(|ui| user_password(head, ui)))
        .map(|(_, p)| p)
        .filter(|p| !p.is_empty())
        .into_iter()
        .collect();
    if let Some((_, query)) = tail.split('#').next().and_then(|t| t.split_once('?')) {
        out.extend(pairs(query).filter_map(|(pair, _)| {
            pair.split_once('=')
                .filter(|(n, v)| secret_param(n) && !v.is_empty())
                .map(|(_, v)| v)
        }));
    }
    out
}

/// Whether the URL holds a password ([`passwords`]).
pub fn has_password(text: &str) -> bool {
    !passwords(text).is_empty()
}

/// The secrets a URL holds, as written and percent-decoded: its password
/// (and its whole user-info, whose base64 is an HTTP Basic header, and
/// the SASL PLAIN response `\0user\0password`), the values of its secret
/// query parameters, its fragment. Empty ones are left out.
pub fn secrets(text: &str) -> Vec<String> {
    let (head, userinfo, tail) = split(text);
    let mut raw: Vec<(String, bool)> = Vec::new();
    if let Some(ui) = userinfo {
        match user_password(head, ui) {
            Some((_, "")) => {}
            Some((user, password)) => {
                raw.push((password.to_string(), false));
                raw.push((ui.to_string(), false));
                raw.push((format!("\0{user}\0{password}"), false));
            }
            None if ui.is_empty() => {}
            None => raw.push((ui.to_string(), false)),
        }
    }
    let (before, fragment) = match tail.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (tail, None),
    };
    if let Some((_, query)) = before.split_once('?') {
        for (pair, _) in pairs(query) {
            if let Some((name, value)) = pair.split_once('=') {
                if secret_param(name) && !value.is_empty() {
                    raw.push((value.to_string(), true));
                }
            }
        }
    }
    if let Some(f) = fragment.filter(|f| !f.is_empty()) {
        raw.push((f.to_string(), false));
    }
    let mut out: Vec<String> = Vec::new();
    for (secret, form) in raw {
        let decoded = percent_decode(&secret, form).into_owned();
        for s in [secret, decoded] {
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// `%XX` decoded (and `+` as a space in a form's value); bytes that are
/// not UTF-8 after decoding become U+FFFD.
fn percent_decode(text: &str, form: bool) -> Cow<'_, str> {
    if !(text.contains('%') || form && text.contains('+')) {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => match bytes.get(i + 1..i + 3).and_then(hex_pair) {
                Some(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                None => out.push(b'%'),
            },
            b'+' if form => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// The byte two hex digits (either case) write.
fn hex_pair(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| (c as char).to_digit(16);
    match pair {
        [a, b] => Some((digit(*a)? * 16 + digit(*b)?) as u8),
        _ => None,
    }
}

/// Every form of a set of secrets, computed once, searched in any text.
#[derive(Debug, Clone, Default)]
pub struct Scrubber {
    /// Searched as written, each byte raw or `%XX` (a space also `+`).
    flexible: Vec<Vec<u8>>,
    /// Searched exactly: the escaped and base64 forms.
    exact: Vec<String>,
}

impl Scrubber {
    /// A scrubber of `secrets` (those shorter than [`MIN_SCRUBBED`] bytes
    /// are left out).
    pub fn new<S: AsRef<str>>(secrets: impl IntoIterator<Item = S>) -> Scrubber {
        let mut s = Scrubber::default();
        for secret in secrets {
            s.add(secret.as_ref());
        }
        s
    }

    /// Adds a secret (nothing when it is too short, or known).
    pub fn add(&mut self, secret: &str) {
        if secret.len() < MIN_SCRUBBED || self.flexible.iter().any(|f| f == secret.as_bytes()) {
            return;
        }
        self.flexible.push(secret.as_bytes().to_vec());
        // Longest first, so that a secret inside another goes after it.
        self.flexible.sort_by_key(|f| std::cmp::Reverse(f.len()));
        let json = serde_json::to_string(secret).unwrap_or_default();
        let debug = format!("{secret:?}");
        let mut forms = vec![
            json.trim_matches('"').to_string(),
            debug[1..debug.len() - 1].to_string(),
        ];
        forms.extend(base64_forms(secret.as_bytes()));
        for f in forms {
            if f.len() > MIN_SCRUBBED && f != secret && !self.exact.contains(&f) {
                self.exact.push(f);
            }
        }
        self.exact.sort_by_key(|f| std::cmp::Reverse(f.len()));
    }

    /// Whether it holds no secret (every text comes back as it is).
    pub fn is_empty(&self) -> bool {
        self.flexible.is_empty()
    }

    /// `text` with every form of every secret replaced by [`MASK`].
    pub fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for needle in &self.flexible {
            if let Some(replaced) = replace_flexible(&out, needle) {
                out = Cow::Owned(replaced);
            }
        }
        for form in &self.exact {
            if out.contains(form.as_str()) {
                out = Cow::Owned(out.replace(form.as_str(), MASK));
            }
        }
        out
    }
}

/// `text` with `secrets` hidden in every form (see [`Scrubber`]).
pub fn scrub<S: AsRef<str>>(text: &str, secrets: &[S]) -> String {
    Scrubber::new(secrets.iter().map(AsRef::as_ref))
        .scrub(text)
        .into_owned()
}

/// The base64 (standard and URL-safe) of `secret` alone, and the parts of
/// its encoding inside a longer text at each of the three alignments that
/// depend on the secret alone, when they are at least four characters.
fn base64_forms(secret: &[u8]) -> Vec<String> {
    let engines = [
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    let mut out = Vec::new();
    for engine in engines {
        out.push(engine.encode(secret));
        for skip in 0..3.min(secret.len()) {
            let rest = &secret[skip..];
            let whole = rest.len() - rest.len() % 3;
            if whole >= 3 {
                out.push(engine.encode(&rest[..whole]));
            }
        }
    }
    out
}

/// `text` with every match of `needle` (each byte raw or `%XX`, a space
/// also `+`) replaced by [`MASK`]; `None` when there is none.
fn replace_flexible(text: &str, needle: &[u8]) -> Option<String> {
    let hay = text.as_bytes();
    let mut out: Option<Vec<u8>> = None;
    let (mut i, mut copied) = (0, 0);
    while i < hay.len() {
        let b = hay[i];
        let start = b == needle[0] || b == b'%' || b == b'+';
        match start.then(|| match_at(hay, i, needle)).flatten() {
            Some(end) => {
                let o = out.get_or_insert_with(|| Vec::with_capacity(hay.len()));
                o.extend_from_slice(&hay[copied..i]);
                o.extend_from_slice(MASK.as_bytes());
                copied = end;
                i = end;
            }
            None => i += 1,
        }
    }
    let mut o = out?;
    o.extend_from_slice(&hay[copied..]);
    // Matches begin and end on character boundaries (they begin with the
    // secret's first byte or an ASCII `%`/`+`, and end after its last
    // byte or a `%XX`): the bytes stay UTF-8.
    Some(String::from_utf8_lossy(&o).into_owned())
}

/// Where a match of `needle` starting at `j` ends, if one does (a `%`
/// that is both the secret's own and the start of a `%XX` is tried both
/// ways).
fn match_at(hay: &[u8], j: usize, needle: &[u8]) -> Option<usize> {
    let Some((&b, rest)) = needle.split_first() else {
        return Some(j);
    };
    let h = *hay.get(j)?;
    let encoded = (h == b'%' && hay.get(j + 1..j + 3).and_then(hex_pair) == Some(b))
        .then(|| match_at(hay, j + 3, rest))
        .flatten();
    encoded.or_else(|| (h == b || (h == b'+' && b == b' ')).then(|| match_at(hay, j + 1, rest))?)
}
