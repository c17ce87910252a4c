//! Passwords never appear in output, whatever they contain and however
//! the URL reaches dlqctl (`--url`, `AMQP_URL`, `--management-url`).

use crate::helpers::{unique_prefix, Scratch};
use std::process::Command;

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

fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlqctl"));
    cmd.args(args)
        .env_remove("AMQP_URL")
        .env_remove("DLQCTL_MANAGEMENT_URL")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run dlqctl");
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

#[test]
fn passwords_with_url_delimiters_never_appear_in_errors() {
    let dir = Scratch::new();
    let p = unique_prefix();
    let file = dir.write(
        "t.yaml",
        &format!("version: 1\npipelines:\n  - name: {p}orders\n"),
    );
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

        let (code, text) = run(
            &[
                "work",
                file,
                "--queue",
                &format!("{p}orders"),
                "--url",
                &url,
                "--",
                "true",
            ],
            &[],
        );
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
/// refuses. The broker answers on 5672 for both.
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
            "amqps://guest:guest@127.0.0.1:5672/%2f",
            "the port may speak plain AMQP",
        ),
        (
            "amqp://guest:guest@127.0.0.1:5672/%2f?frame_max=512",
            "frame_max",
        ),
    ] {
        let (code, text) = run(&["provision", f, "--url", url], &[]);
        assert_eq!(code, Some(1), "{url}: {text}");
        assert!(text.contains(wanted), "{url}: no `{wanted}` in {text}");
        assert!(!text.contains("is RabbitMQ running"), "{url}: {text}");
    }
}
