//! Bad input of every kind exits 2 with a message saying where and what to
//! do: topology files that are missing, directories, not UTF-8 or huge, and
//! flags whose zero makes no sense. No broker is contacted.

use crate::support::{Dlqctl, Scratch};
use std::process::Output;

fn dlqctl(args: &[&str]) -> Output {
    Dlqctl::new(args[0])
        .args(&args[1..])
        .into_std()
        .output()
        .expect("run dlqctl")
}

#[track_caller]
fn assert_usage(out: &Output, wanted: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.contains(wanted), "no `{wanted}` in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Writes a topology of one pipeline, `name`, into `dir`; returns its path.
fn one_pipeline(dir: &Scratch, name: &str) -> String {
    let text = format!("version: 1\npipelines:\n  - name: {name}\n");
    dir.write("t.yaml", &text).display().to_string()
}

#[test]
fn unreadable_topology_files_are_bad_input_with_a_position() {
    let dir = Scratch::new();
    let latin1 = dir.path().join("latin1.yaml");
    std::fs::write(&latin1, b"version: 1\npipelines:\n  - name: caf\xe9\n").unwrap();
    let utf16 = dir.path().join("utf16.yaml");
    let mut bytes = vec![0xFF, 0xFE];
    bytes.extend("version: 1\n".encode_utf16().flat_map(|u| u.to_le_bytes()));
    std::fs::write(&utf16, bytes).unwrap();
    let missing = dir.path().join("missing.yaml");
    let cases = [
        (
            latin1.clone(),
            "line 3, column 14 (byte 35): byte 0xe9 is not UTF-8",
        ),
        (utf16.clone(), "UTF-16"),
        (missing.clone(), "No such file"),
        (dir.path().to_path_buf(), "is a directory"),
    ];
    for (path, wanted) in &cases {
        let p = path.to_str().unwrap();
        for args in [
            vec!["validate", p],
            vec!["provision", p, "--dry-run"],
            vec!["status", p],
        ] {
            assert_usage(&dlqctl(&args), wanted);
        }
    }
}

#[test]
fn an_endless_or_huge_file_is_cut_at_16_mib() {
    let out = dlqctl(&["validate", "/dev/zero"]);
    assert_usage(&out, "larger than 16 MiB");
    let out = dlqctl(&["validate", "/dev/urandom"]);
    assert_usage(&out, "larger than 16 MiB");
}

#[test]
fn a_zero_handler_timeout_is_refused() {
    let dir = Scratch::new();
    let f = one_pipeline(&dir, "zt");
    for zero in ["0ms", "0s"] {
        let out = dlqctl(&[
            "work",
            &f,
            "--queue",
            "zt",
            "--handler-timeout",
            zero,
            "--",
            "/bin/true",
        ]);
        assert_usage(&out, "is zero");
    }
}

#[test]
fn a_rate_or_canary_wait_that_would_hold_the_dlq_for_days_is_refused() {
    let dir = Scratch::new();
    let f = one_pipeline(&dir, "rt");
    for (flags, wanted) in [
        (vec!["--rate", "1e-7"], "from 0.01"),
        (vec!["--rate", "0.009"], "from 0.01"),
        (vec!["--canary", "1", "--canary-wait", "25h"], "at most 24h"),
        (
            vec!["--canary", "1.0"],
            "a whole number of messages: write 1, not 1.0",
        ),
        (vec!["--canary", "0"], "give 1 or more messages"),
        (vec!["--canary", "x"], "`x` is not a number of messages"),
    ] {
        let mut args = vec!["dlq", "replay", &f, "--queue", "rt"];
        args.extend(flags);
        assert_usage(&dlqctl(&args), wanted);
    }
}

/// Under `--log-format json` the error that ends a command is one JSON
/// record shaped like the log's, with its exit code, whatever refused the
/// command: the argument parser, the topology file, or the broker.
#[test]
fn under_log_format_json_every_error_is_one_json_record() {
    let dir = Scratch::new();
    let bad = dir.write("bad.yaml", "version: 1\npipelines:\n  - name: \"\"\n");
    let good = dir.write("good.yaml", "version: 1\npipelines:\n  - name: orders\n");
    let (bad, good) = (bad.to_str().unwrap(), good.to_str().unwrap());
    for (args, code, wanted) in [
        (
            vec!["work", "--log-format", "json", good, "--queu", "orders"],
            2,
            "unexpected argument '--queu'",
        ),
        (
            vec!["--log-format=json", "dlq", "peek", good],
            2,
            "--queue <QUEUE>",
        ),
        (
            vec!["--log-format", "json", "validate", bad],
            2,
            "bad.yaml:3",
        ),
        (
            vec![
                "--log-format",
                "json",
                "status",
                good,
                "--url",
                "amqp://guest:guest@127.0.0.1:1/%2f",
            ],
            1,
            "127.0.0.1:1",
        ),
    ] {
        let out = dlqctl(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: not one line:\n{stderr}");
        let v: serde_json::Value = serde_json::from_str(lines[0])
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stderr}"));
        assert_eq!(v["level"], "ERROR", "{args:?}: {v}");
        assert_eq!(v["fields"]["exit_code"], code, "{args:?}: {v}");
        let message = v["fields"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(wanted),
            "{args:?}: no {wanted:?} in {message:?}"
        );
        assert!(!message.starts_with("error:"), "{args:?}: {message:?}");
    }
    // --help and --version are not errors: as they always are.
    let out = dlqctl(&["--log-format", "json", "--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("dlqctl "));
}

/// `file:LINE:COL` of the first `'` on the line holding `needle` in
/// `text`: where a quoted value written there starts.
fn position_of(file: &str, text: &str, needle: &str) -> String {
    let (i, line) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(needle))
        .expect("the needle is in the text");
    let col = line.find('\'').expect("a quoted value") + 1;
    format!("{file}:{}:{col}:", i + 1)
}

/// Every URL of a topology file is parsed at `validate` by the parser of
/// the client that will use it (reqwest's for the health probe, the redis
/// crate's for a store): a URL none of them can use is refused at its
/// line and column with exit 2, instead of a probe failing for ever (the
/// breaker never closing) or `work` exiting 1.
#[test]
fn urls_no_client_can_use_are_refused_at_their_line_and_column() {
    let bad = [
        (
            "h6",
            "health: {http: 'http://[::1/x'}",
            "invalid IPv6 address",
        ),
        (
            "hp",
            "health: {http: 'http://h:99999/x'}",
            "invalid port number",
        ),
        ("r0", "store: 'redis://'", "no host"),
        ("r1", "store: 'redis:///0'", "no host"),
        ("r2", "store: 'redis://h:port/0'", "invalid port number"),
        ("r3", "store: 'redis://h:6379/zero'", "database"),
        ("r4", "store: 'redis://h:6379/-1'", "database"),
        ("r5", "store: 'redis://:s3cret@0.0.0.0:6379/0'", "wildcard"),
    ];
    let mut text = String::from("version: 1\npipelines:\n");
    for (name, line, _) in &bad {
        text.push_str(&format!("  - name: {name}\n"));
        if line.starts_with("health") {
            text.push_str(&format!(
                "    dead_letter:\n      redrive:\n        {line}\n"
            ));
        } else {
            text.push_str(&format!("    idempotency:\n      {line}\n"));
        }
    }
    let dir = Scratch::new();
    let f = dir.write("t.yaml", &text);
    let f = f.to_str().unwrap();
    let out = dlqctl(&["validate", f]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for (_, line, why) in &bad {
        let at = position_of(f, &text, line);
        let refused = stderr
            .lines()
            .find(|l| l.starts_with(&at))
            .unwrap_or_else(|| panic!("no {at} in: {stderr}"));
        assert!(refused.contains("cannot be used"), "{refused}");
        assert!(refused.contains(why), "no `{why}` in: {refused}");
    }
    assert!(!stderr.contains("s3cret"), "{stderr}");
    // Each of them alone is refused too (not only beside the others).
    for (name, line, why) in &bad {
        let one = dir.write(&format!("{name}.yaml"), &{
            let mut t = String::from("version: 1\npipelines:\n  - name: x\n");
            if line.starts_with("health") {
                t.push_str(&format!(
                    "    dead_letter:\n      redrive:\n        {line}\n"
                ));
            } else {
                t.push_str(&format!("    idempotency:\n      {line}\n"));
            }
            t
        });
        assert_usage(&dlqctl(&["validate", one.to_str().unwrap()]), why);
    }
}

/// The URLs of the command line are parsed as their clients will parse
/// them before anything is contacted: exit 2, naming the option.
#[test]
fn command_line_urls_no_client_can_use_are_usage_errors() {
    let dir = Scratch::new();
    let f = one_pipeline(&dir, "cu");
    let work = |extra: &[&str]| {
        let mut a = vec!["work", f.as_str(), "--queue", "cu"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--", "/bin/true"]);
        dlqctl(&a)
    };
    assert_usage(
        &work(&["--management-url", "http://[::1/x"]),
        "--management-url",
    );
    assert_usage(
        &work(&["--management-url", "ftp://h:15672"]),
        "http:// or https://",
    );
    assert_usage(
        &work(&["--idempotency-store", "redis://"]),
        "--idempotency-store",
    );
    assert_usage(
        &work(&["--idempotency-store", "redis://h:6379/x"]),
        "database",
    );
    assert_usage(&work(&["--url", "amqp://h:99999/"]), "invalid broker URL");
    let http = dlqctl(&["work", &f, "--queue", "cu", "--http", "http://h:99999/x"]);
    assert_usage(&http, "--http");
    for cmd in ["status", "doctor"] {
        assert_usage(
            &dlqctl(&[cmd, &f, "--metrics-url", "http://[::1/metrics"]),
            "--metrics-url",
        );
        assert_usage(
            &dlqctl(&[cmd, &f, "--management-url", "ftp://h:15672"]),
            "http:// or https://",
        );
    }
    assert_usage(
        &dlqctl(&[
            "drill",
            &f,
            "--queue",
            "cu",
            "--metrics-url",
            "http://h:99999/m",
        ]),
        "--metrics-url",
    );
    assert_usage(
        &dlqctl(&["serve", &f, "--metrics-url", "http://h:99999/m"]),
        "--metrics-url",
    );
}
