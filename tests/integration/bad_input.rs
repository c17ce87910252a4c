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
