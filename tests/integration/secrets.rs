//! Passwords never appear in output, whatever they contain and however
//! the URL reaches dlqctl (`--url`, `AMQP_URL`, `--management-url`).

use crate::support::{amqp_url_with, unique_prefix, Dlqctl, Scratch};

/// Passwords with every URL delimiter, percent signs, and very short ones.
const PASSWORDS: [&str; 9] = [
    "S3c/retPW",
    "p@ssw0rd",
    "pa:ss:wd",
    "50%offpw",
    "pw#frag1",
    "q?x=1&y",
    "/@:%#",
    "x",
    "ab",
];

/// `dlqctl ARGS` with only `env` of the broker's variables: each test says
/// how the URL reaches dlqctl.
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Dlqctl::new(args[0])
        .args(&args[1..])
        .env_remove("AMQP_URL")
        .env_remove("DLQCTL_MANAGEMENT_URL");
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let out = cmd.into_std().output().expect("run dlqctl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The password does not appear: as a whole where it is long enough to
/// search for, and never between the user's `:` and the `@`.
#[track_caller]
fn assert_hidden(pw: &str, what: &str, text: &str) {
    if pw.len() >= 3 {
        assert!(!text.contains(pw), "{what}: password {pw:?} shown:\n{text}");
    }
    assert!(
        !text.contains(&format!("guest:{pw}")),
        "{what}: password {pw:?} shown:\n{text}"
    );
}

/// A topology of one pipeline, `PREFIXorders` with a fresh prefix: the
/// file and the prefix.
fn topology(dir: &Scratch) -> (std::path::PathBuf, String) {
    let p = unique_prefix();
    let file = dir.write(
        "t.yaml",
        &format!("version: 1\npipelines:\n  - name: {p}orders\n"),
    );
    (file, p)
}

/// The arguments of `dlqctl work FILE --queue QUEUE --url URL
/// --wait-for-broker 0s -- true`: it gives up at once instead of waiting
/// for the broker.
fn work_at_once<'a>(file: &'a str, queue: &'a str, url: &'a str) -> Vec<&'a str> {
    vec![
        "work",
        file,
        "--queue",
        queue,
        "--url",
        url,
        "--wait-for-broker",
        "0s",
        "--",
        "true",
    ]
}

#[test]
fn passwords_with_url_delimiters_never_appear_in_errors() {
    let dir = Scratch::new();
    let (file, p) = topology(&dir);
    let file = file.to_str().expect("utf-8 path");
    for pw in PASSWORDS {
        // Port 1: nothing listens, so every command fails after reading the URL.
        let url = format!("amqp://guest:{pw}@127.0.0.1:1/%2f");
        let (code, text) = run(&["provision", file, "--url", &url], &[]);
        assert!(
            matches!(code, Some(1 | 2)),
            "--url {pw:?}: exit {code:?}\n{text}"
        );
        assert_hidden(pw, "provision --url", &text);

        let (code, text) = run(&["provision", file], &[("AMQP_URL", &url)]);
        assert!(
            matches!(code, Some(1 | 2)),
            "AMQP_URL {pw:?}: exit {code:?}\n{text}"
        );
        assert_hidden(pw, "provision with AMQP_URL", &text);

        let queue = format!("{p}orders");
        let (code, text) = run(&work_at_once(file, &queue, &url), &[]);
        assert!(
            matches!(code, Some(1 | 2)),
            "work {pw:?}: exit {code:?}\n{text}"
        );
        assert_hidden(pw, "work --url", &text);

        let mgmt = format!("http://guest:{pw}@127.0.0.1:1");
        let (_, text) = run(
            &["provision", file, "--check", "--management-url", &mgmt],
            &[],
        );
        assert_hidden(pw, "provision --check --management-url", &text);
    }
}

/// Connection mistakes get a hint that names them, not "is RabbitMQ
/// running?": TLS spoken to the plain port, and a frame_max the broker
/// refuses. The broker under test answers on its plain port for both.
#[test]
fn tls_to_a_plain_port_and_a_refused_frame_max_are_named() {
    let dir = Scratch::new();
    let file = dir.write(
        "t.yaml",
        &format!("version: 1\npipelines:\n  - name: {}x\n", unique_prefix()),
    );
    let f = file.to_str().unwrap();
    for (url, wanted) in [
        (
            amqp_url_with("amqps", "guest", "guest", "%2f", ""),
            "the port may speak plain AMQP",
        ),
        (
            amqp_url_with("amqp", "guest", "guest", "%2f", "frame_max=512"),
            "frame_max",
        ),
    ] {
        let (code, text) = run(&["provision", f, "--url", &url], &[]);
        assert_eq!(code, Some(1), "{url}: {text}");
        assert!(text.contains(wanted), "{url}: no `{wanted}` in {text}");
        assert!(!text.contains("is RabbitMQ running"), "{url}: {text}");
    }
}

/// Every form a password could take in a log line: as it is, as lapin's
/// byte list of the SASL PLAIN response (`[0, 103, 117, ...]`), as hex,
/// and in base64 (of itself, of `user:password` as Basic auth sends it,
/// and of the SASL response).
fn password_forms(user: &str, pw: &str) -> Vec<String> {
    use base64::Engine as _;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let list = |s: &[u8]| {
        s.iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sasl = format!("\0{user}\0{pw}");
    let hex: String = pw.bytes().map(|b| format!("{b:02x}")).collect();
    vec![
        pw.to_string(),
        list(pw.as_bytes()),
        hex.clone(),
        hex.to_uppercase(),
        b64(pw.as_bytes()).trim_end_matches('=').to_string(),
        b64(format!("{user}:{pw}").as_bytes())
            .trim_end_matches('=')
            .to_string(),
        b64(sasl.as_bytes()).trim_end_matches('=').to_string(),
    ]
}

/// With `RUST_LOG=trace` lapin logs the `connection.start-ok` frame, whose
/// SASL response is the user and password as a byte list. That record
/// never reaches the log, in text or JSON, from a one-shot command or the
/// worker, and the logs are still there (trace records of the handshake).
#[test]
fn credentials_never_reach_a_trace_log() {
    let dir = Scratch::new();
    let (file, p) = topology(&dir);
    let file = file.to_str().expect("utf-8 path");
    // A password no other text contains; the broker refuses it (guest's
    // password is guest), after dlqctl has sent it.
    let pw = "Zq8Wv3Kx9PmRt7Ly";
    let with_password = |url: String| {
        let mut url = reqwest::Url::parse(&url).expect("a URL");
        url.set_username("guest").expect("a user");
        url.set_password(Some(pw)).expect("a password");
        url.to_string()
    };
    let url = with_password(crate::support::amqp_url());
    let mgmt = with_password(crate::support::management_url());
    let queue = format!("{p}orders");
    for filter in [
        "trace",
        "lapin=trace,amq_protocol=trace,reqwest=trace,hyper=trace",
    ] {
        for format in ["text", "json"] {
            for args in [
                vec!["status", file, "--url", &url, "--management-url", &mgmt],
                work_at_once(file, &queue, &url),
            ] {
                let mut all = args.clone();
                all.extend(["--log-format", format]);
                let (code, text) = run(&all, &[("RUST_LOG", filter)]);
                assert!(
                    matches!(code, Some(1 | 2)),
                    "{all:?}: exit {code:?}\n{text}"
                );
                assert!(
                    text.contains("TRACE") || text.contains("\"TRACE\""),
                    "{all:?} {filter}: no trace records at all:\n{text}"
                );
                for form in password_forms("guest", pw) {
                    assert!(
                        !text.contains(&form),
                        "{all:?} RUST_LOG={filter}: the password as {form:?} is in the log:\n{text}"
                    );
                }
            }
        }
    }
}
