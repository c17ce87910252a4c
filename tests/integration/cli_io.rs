//! One-shot commands and their output streams: a closed pipe and a full
//! disk are each a clear error (exit 1), and neither is a panic (exit 101).

use crate::support::{Dlqctl, Scratch};
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

/// A topology whose `--dry-run` plan is far over a pipe's 64 KiB buffer.
fn big_topology(dir: &Scratch) -> String {
    let mut text = String::from("version: 1\npipelines:\n");
    for i in 0..400 {
        text += &format!("  - name: cliio{i}\n    retry: {{delays: [1s, 2s, 3s, 4s, 5s, 6s]}}\n");
    }
    let path = dir.write("big.yaml", &text);
    path.to_str().expect("utf-8 path").to_string()
}

/// `dlqctl ARGS` as a blocking command, its streams still to be set.
fn dlqctl(args: &[&str]) -> Command {
    Dlqctl::new(args[0]).args(&args[1..]).into_std()
}

/// Exit 1, saying that standard output could not be written; no panic.
#[track_caller]
fn assert_cannot_write(args: &[&str], out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(
        stderr.contains("cannot write to standard output"),
        "{args:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
}

#[test]
fn a_closed_stdout_pipe_is_exit_1_with_a_report() {
    let dir = Scratch::new();
    let file = big_topology(&dir);
    for args in [
        vec!["provision", file.as_str(), "--dry-run"],
        vec!["provision", file.as_str(), "--dry-run", "--json"],
    ] {
        let mut child = dlqctl(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dlqctl");
        let stdout = child.stdout.take().expect("stdout");
        let mut first = String::new();
        BufReader::new(stdout)
            .read_line(&mut first)
            .expect("read one line");
        // The reader is gone (like `| head -1`): the next write gets EPIPE.
        let out = child.wait_with_output().expect("wait");
        assert!(!first.is_empty(), "{args:?}: no first line");
        assert_cannot_write(&args, &out);
    }
}

#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let dir = Scratch::new();
    let file = big_topology(&dir);
    for args in [
        vec!["validate", file.as_str()],
        vec!["provision", file.as_str(), "--dry-run"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let out = dlqctl(&args)
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .expect("run dlqctl");
        assert_cannot_write(&args, &out);
    }
}

#[test]
fn a_full_stderr_does_not_make_a_failing_command_panic() {
    let dir = Scratch::new();
    let bad = dir.write("bad.yaml", "version: 1\npipelines:\n  - name: ''\n");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = dlqctl(&["validate", bad.to_str().expect("utf-8")])
        .stdout(Stdio::null())
        .stderr(full)
        .output()
        .expect("run dlqctl");
    assert_eq!(out.status.code(), Some(2));
}
