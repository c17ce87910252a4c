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
