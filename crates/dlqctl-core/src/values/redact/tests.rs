//! Every URL shape a secret hides in, against the display form, the
//! secrets found, and the scrubbing of every written form of them.

use super::*;

/// (URL, its display form, the secrets it holds as written).
const SHAPES: &[(&str, &str, &[&str])] = &[
    (
        "amqp://guest:s3cretPW@host:5672/%2f",
        "amqp://guest:***@host:5672/%2f",
        &["s3cretPW"],
    ),
    ("amqps://u:p@h", "amqps://u:***@h", &["p"]),
    // Password only, with and without its colon.
    (
        "redis://:s3cretPW@h:6379/0",
        "redis://:***@h:6379/0",
        &["s3cretPW"],
    ),
    (
        "redis://s3cretPW@h:6379/0",
        "redis://***@h:6379/0",
        &["s3cretPW"],
    ),
    (
        "memcached://:s3cretPW@host",
        "memcached://:***@host",
        &["s3cretPW"],
    ),
    // In the query, any case, among other parameters, with the user's too.
    (
        "redis://h:6379/0?password=s3cretPW",
        "redis://h:6379/0?password=***",
        &["s3cretPW"],
    ),
    (
        "redis://h/0?db=1&PassWord=s3cretPW&x=1",
        "redis://h/0?db=1&PassWord=***&x=1",
        &["s3cretPW"],
    ),
    (
        "redis://u:firstPW1@h/0?password=otherPW2",
        "redis://u:***@h/0?password=***",
        &["firstPW1", "otherPW2"],
    ),
    (
        "https://h/hook?auth_mechanism=external&api_key=k3yK3y&token=t0k3n&sig=s1g#frag",
        "https://h/hook?auth_mechanism=external&api_key=***&token=***&sig=***#***",
        &["k3yK3y", "t0k3n", "s1g", "frag"],
    ),
    // Delimiters raw in the password.
    (
        "redis://:se/cret@127.0.0.1:6409/0",
        "redis://:***@127.0.0.1:6409/0",
        &["se/cret"],
    ),
    ("amqp://u:p@ss@h/", "amqp://u:***@h/", &["p@ss"]),
    ("amqp://u:a:b:c@h", "amqp://u:***@h", &["a:b:c"]),
    ("amqps://u:pw#frag1@h", "amqps://u:***@h", &["pw#frag1"]),
    ("amqp://u:q?x=1&y@h", "amqp://u:***@h", &["q?x=1&y"]),
    ("amqp://u:/@:%#@h", "amqp://u:***@h", &["/@:%#"]),
    // Percent-encoded.
    ("amqp://u:%41bc%2Fdef@h", "amqp://u:***@h", &["%41bc%2Fdef"]),
    // IPv6 hosts.
    (
        "amqp://u:s3cretPW@[::1]:5672/%2f",
        "amqp://u:***@[::1]:5672/%2f",
        &["s3cretPW"],
    ),
    ("amqp://[::1]:5672/%2f", "amqp://[::1]:5672/%2f", &[]),
    // Unix sockets.
    (
        "redis+unix:///run/redis.sock?db=0&password=s3cretPW",
        "redis+unix:///run/redis.sock?db=0&password=***",
        &["s3cretPW"],
    ),
    (
        "unix:///run/redis.sock?pass=s3cretPW",
        "unix:///run/redis.sock?pass=***",
        &["s3cretPW"],
    ),
    (
        "unix:/run/redis.sock?pass=s3cretPW",
        "unix:/run/redis.sock?pass=***",
        &["s3cretPW"],
    ),
    // Unparseable ones.
    (
        "amqp://u:s3cretPW@host:notaport/",
        "amqp://u:***@host:notaport/",
        &["s3cretPW"],
    ),
    ("u:s3cretPW@host", "***@host", &["u:s3cretPW"]),
    ("not a url", "not a url", &[]),
    ("", "", &[]),
    ("redis://u:@h", "redis://u:***@h", &[]),
    // In doubt (an @ after the host), more is hidden.
    ("http://h/p?a=b@c", "http://***@c", &["h/p?a=b"]),
    // Nothing to hide.
    ("redis://cache:6379/0", "redis://cache:6379/0", &[]),
    ("http://127.0.0.1:15672", "http://127.0.0.1:15672", &[]),
];

#[test]
fn every_shape_is_shown_without_its_secrets() {
    let mut problems = Vec::new();
    for (input, shown, held) in SHAPES {
        let got = url(input);
        if got != *shown {
            problems.push(format!("url({input:?}) = {got:?}, not {shown:?}"));
        }
        let found = secrets(input);
        for s in *held {
            if !found.iter().any(|f| f == s) {
                problems.push(format!("secrets({input:?}) = {found:?} misses {s:?}"));
            }
            // The display form holds none (only a one-letter one may be
            // any letter of it).
            if s.len() > 1 && got.contains(s) {
                problems.push(format!("url({input:?}) = {got:?} shows {s:?}"));
            }
        }
        if held.is_empty() && !found.is_empty() {
            problems.push(format!("secrets({input:?}) = {found:?}, none held"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_percent_encoded_secret_is_also_found_decoded() {
    let found = secrets("amqp://u:%41bc%2Fdef@h");
    assert!(found.contains(&"Abc/def".to_string()), "{found:?}");
    let found = secrets("redis://h/0?password=a+b%20c");
    assert!(found.contains(&"a b c".to_string()), "{found:?}");
}

/// Every way a secret gets written into a line: as it is, percent-encoded
/// (wholly or in part, either case of hex), JSON-escaped, in Rust's debug
/// form, and in base64 (alone, inside `user:password`, at any alignment).
fn written_forms(secret: &str) -> Vec<String> {
    use base64::Engine as _;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let b64url = |s: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let all: String = secret.bytes().map(|b| format!("%{b:02X}")).collect();
    let lower: String = secret.bytes().map(|b| format!("%{b:02x}")).collect();
    let some: String = secret
        .chars()
        .map(|c| match c {
            '/' | '@' | ':' | '%' | '"' | '\\' | '#' | '?' | '&' => format!("%{:02X}", c as u32),
            c => c.to_string(),
        })
        .collect();
    let json = serde_json::to_string(secret).unwrap_or_default();
    vec![
        secret.to_string(),
        all,
        lower,
        some,
        json.trim_matches('"').to_string(),
        format!("{secret:?}").trim_matches('"').to_string(),
        b64(secret.as_bytes()),
        b64url(secret.as_bytes()),
        b64(format!("guest:{secret}").as_bytes()),
        b64(format!("\0guest\0{secret}").as_bytes()),
    ]
    .into_iter()
    .chain(
        // Inside a longer encoding, at another alignment: what is found is
        // the part that comes from the secret alone, long enough only for
        // a secret of six bytes or more.
        (secret.len() >= 6)
            .then(|| {
                [
                    b64(format!("x{secret}y").as_bytes()),
                    b64(format!("xy{secret}z").as_bytes()),
                ]
            })
            .into_iter()
            .flatten(),
    )
    .collect()
}

#[test]
fn scrubbing_removes_every_written_form_of_every_secret() {
    let passwords = [
        "s3cretPW",
        "se/cret",
        "p@ssw0rd",
        "pa:ss:wd",
        "50%offpw",
        "pw#frag1",
        "q?x=1&y",
        "/@:%#",
        "quo\"te\\back",
        "héllo wörld",
        "abc",
    ];
    let mut problems = Vec::new();
    for pw in passwords {
        let url = format!("redis://guest:{pw}@127.0.0.1:6379/0");
        let found = secrets(&url);
        for form in written_forms(pw) {
            let line = format!("error: refused ({form}) at {form}end");
            let out = scrub(&line, &found);
            if out.contains(&form) || out.contains(pw) {
                problems.push(format!("{pw:?} as {form:?}: {out:?}"));
            }
            if !out.contains("error: refused (") {
                problems.push(format!("{pw:?}: the rest of the line went: {out:?}"));
            }
        }
        // The display form of the URL needs no scrubbing.
        assert_eq!(scrub(&url_line(&url), &found), url_line(&url));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn url_line(u: &str) -> String {
    format!("connecting to {}", url(u))
}

#[test]
fn scrubbing_leaves_other_text_and_short_secrets_alone() {
    let found = secrets("redis://u:ab@h");
    assert_eq!(scrub("a b ab cab", &found), "a b ab cab");
    assert_eq!(scrub::<String>("text", &[]), "text");
    let found = secrets("redis://u:s3cretPW@h");
    assert_eq!(scrub("nothing here", &found), "nothing here");
    assert_eq!(scrub("x s3cretPW y", &found), "x *** y");
    // A lone % or a % not followed by hex is kept as it is.
    assert_eq!(scrub("100% s3cret%ZZ", &found), "100% s3cret%ZZ");
}

#[test]
fn what_a_url_holds_as_secrets_is_all_it_shows_masked() {
    // Each masked part of the display is a secret found: nothing is
    // hidden on display that the scrubbing would let through.
    for (input, _, _) in SHAPES {
        let found = secrets(input);
        let scrubbed = scrub(input, &found);
        for s in &found {
            if s.len() >= MIN_SCRUBBED {
                assert!(!scrubbed.contains(s.as_str()), "{input}: {scrubbed}");
            }
        }
    }
}

#[test]
fn an_endpoint_has_no_user_info_query_or_fragment() {
    for (input, want) in [
        ("https://u:p@h:8443/hook?token=t#f", "https://h:8443/hook"),
        ("http://:se/cret@h/x", "http://h/x"),
        ("http://h/metrics", "http://h/metrics"),
        ("http://[::1]:9090/metrics?x=1", "http://[::1]:9090/metrics"),
        ("u:p@h/x", "h/x"),
    ] {
        assert_eq!(endpoint(input), want, "{input}");
    }
}

#[test]
fn a_password_is_one_after_a_colon_or_in_a_secret_parameter() {
    for (input, has) in [
        ("redis://:p@h", true),
        ("redis://u:p@h", true),
        ("redis://u@h", false),
        ("redis://u:@h", false),
        ("redis://h/0?password=p", true),
        ("redis://h/0?password=", false),
        ("redis://h/0?db=1", false),
        ("redis://h/0#password=p", false),
    ] {
        assert_eq!(has_password(input), has, "{input}");
    }
}
