//! The architecture holds, asked of the tools that know (cargo, clippy)
//! rather than read by hand from the sources:
//!
//! - the workspace's three crates sit in layers: `dlqctl-core` (pure),
//!   `dlqctl` (the library) on it, `dlqctl-cli` (the binary and its web
//!   page) on both; cargo refuses a cycle, and the core's dependency tree
//!   holds no async runtime, broker client, HTTP crate or store;
//! - an embedder's tree (`dlqctl` alone) holds none of the CLI's or the web
//!   page's crates;
//! - the core's `clippy.toml` refuses the clock, files, sockets and
//!   processes that std still reaches: a fixture crate using them fails
//!   clippy under that file;
//! - `crates/dlqctl-core/src` has at most 10 top-level entries (a folder per feature, plus `lib.rs` and `wire.rs`);
//! - every integration test that disrupts the broker (named `serial_`)
//!   first asks `allow_disruption`, so that without
//!   `DLQCTL_TEST_DISRUPTIVE=1` it fails before touching the broker.
//!
//! Function length is clippy's `too_many_lines` (threshold in
//! `clippy.toml`), run by the test command with `-D warnings`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const CORE_MAX_ENTRIES: usize = 10;

/// What the core may not depend on, directly or not.
const CORE_FORBIDDEN: &[&str] = &[
    "tokio",
    "tokio-util",
    "lapin",
    "reqwest",
    "hyper",
    "axum",
    "rusqlite",
    "redis",
    "mio",
    "dlqctl",
    "dlqctl-cli",
];

/// What an embedder of the library does not compile: the CLI's and the
/// web page's crates.
const EMBEDDER_FORBIDDEN: &[&str] = &[
    "clap",
    "clap_complete",
    "clap_mangen",
    "indicatif",
    "tracing-subscriber",
    "axum",
    "maud",
    "anyhow",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The names of the crates in `package`'s normal dependency tree (build
/// and dev dependencies left out), itself included.
fn tree_of(package: &str, features: &[&str]) -> BTreeSet<String> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(root())
        .args(["tree", "--offline", "--locked", "-e", "normal"])
        .args(["--prefix", "none", "--format", "{p}", "-p", package]);
    cmd.args(features);
    let out = cmd.output().expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_core_depends_on_no_runtime_client_or_store() {
    let tree = tree_of("dlqctl-core", &[]);
    assert!(
        tree.contains("dlqctl-core") && tree.contains("serde"),
        "{tree:?}"
    );
    let found: Vec<&&str> = CORE_FORBIDDEN
        .iter()
        .filter(|c| tree.contains(**c))
        .collect();
    assert!(
        found.is_empty(),
        "dlqctl-core's dependency tree holds {found:?}:\n{tree:?}"
    );
}

#[test]
fn an_embedder_compiles_neither_the_cli_nor_the_web_page() {
    for features in [&[][..], &["--no-default-features"][..]] {
        let tree = tree_of("dlqctl", features);
        assert!(
            tree.contains("lapin") && tree.contains("dlqctl-core"),
            "{tree:?}"
        );
        let found: Vec<&&str> = EMBEDDER_FORBIDDEN
            .iter()
            .filter(|c| tree.contains(**c))
            .collect();
        assert!(
            found.is_empty(),
            "the library's tree ({features:?}) holds {found:?}"
        );
    }
    // The binary's does: the check above is not vacuous.
    let cli = tree_of("dlqctl-cli", &[]);
    assert!(
        EMBEDDER_FORBIDDEN.iter().all(|c| cli.contains(*c)),
        "{cli:?}"
    );
}

/// The fixture crate (`tests/fixtures/impure-core`) under the core's
/// `clippy.toml`, checked by clippy in a folder of its own: the findings.
fn clippy_on_fixture() -> String {
    let work = std::env::temp_dir().join(format!("dlqctl-lint-fixture-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(work.join("src")).unwrap();
    let fixture = root().join("tests/fixtures/impure-core");
    for f in ["Cargo.toml", "src/lib.rs"] {
        fs::copy(fixture.join(f), work.join(f)).unwrap();
    }
    fs::copy(
        root().join("crates/dlqctl-core/clippy.toml"),
        work.join("clippy.toml"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO"))
        .current_dir(&work)
        .args(["clippy", "--offline", "--quiet", "--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", work.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo clippy");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = fs::remove_dir_all(&work);
    assert!(!out.status.success(), "clippy passed the fixture:\n{text}");
    text
}

#[test]
fn the_cores_lint_refuses_the_clock_files_sockets_and_processes() {
    let text = clippy_on_fixture();
    for what in [
        "disallowed method `std::time::SystemTime::now`",
        "disallowed method `std::time::Instant::now`",
        "disallowed method `std::fs::read_to_string`",
        "disallowed method `std::env::var`",
        "disallowed type `std::net::TcpStream`",
        "disallowed method `std::process::Command::new`",
    ] {
        assert!(text.contains(what), "no `{what}` in:\n{text}");
    }
}

#[test]
fn the_core_has_at_most_ten_entries() {
    let core = root().join("crates/dlqctl-core/src");
    let entries: Vec<String> = fs::read_dir(core)
        .expect("crates/dlqctl-core/src is readable")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(
        entries.len() <= CORE_MAX_ENTRIES,
        "crates/dlqctl-core/src has {} top-level entries (at most {CORE_MAX_ENTRIES}): {entries:?}",
        entries.len()
    );
}

/// The `serial_` test functions of `text` whose body does not begin with
/// `allow_disruption(...)`, by line (comment lines are skipped).
fn serial_tests_not_asking(text: &str) -> (usize, Vec<(usize, String)>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut seen = 0;
    let mut bad = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let Some(at) = code.find("fn serial_") else {
            continue;
        };
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        seen += 1;
        // The first statement: the first line after the signature's `{`
        // that is neither blank nor a comment.
        let open = (i..lines.len()).find(|&j| lines[j].trim_end().ends_with('{'));
        let first = open.and_then(|o| {
            lines[o + 1..]
                .iter()
                .map(|l| l.trim())
                .find(|l| !l.is_empty() && !l.starts_with("//"))
        });
        let asks = first.is_some_and(|f| {
            f.starts_with("crate::support::allow_disruption(") || f.starts_with("allow_disruption(")
        });
        if !asks {
            bad.push((i + 1, name));
        }
    }
    (seen, bad)
}

#[test]
fn every_test_that_disrupts_the_broker_asks_first() {
    let dir = root().join("tests/integration");
    let mut seen = 0;
    let mut bad = Vec::new();
    for entry in fs::read_dir(&dir).expect("tests/integration is readable") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).expect("a readable test file");
            let (n, found) = serial_tests_not_asking(&text);
            seen += n;
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            bad.extend(
                found
                    .into_iter()
                    .map(|(line, name)| format!("tests/integration/{file}:{line} fn {name}")),
            );
        }
    }
    assert!(seen >= 5, "the serial_ tests were read ({seen})");
    assert!(
        bad.is_empty(),
        "serial_ tests whose first statement is not \
         `crate::support::allow_disruption(\"what it does\")`:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_finds_a_serial_test_that_does_not_ask() {
    let text = "async fn serial_a() {\n    crate::support::allow_disruption(\"x\");\n}\n\
                // fn serial_in_a_comment() {}\n\
                async fn serial_b() -> () {\n    // allow_disruption(\"x\");\n    stop();\n}\n\
                fn serial_c(\n    x: u8,\n) {\n\n    allow_disruption(\"y\");\n}\n\
                fn other() { stop(); }\n";
    assert_eq!(
        serial_tests_not_asking(text),
        (3, vec![(5, "serial_b".to_string())])
    );
}

#[test]
fn the_layers_are_crates_in_the_workspace() {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    for member in ["crates/dlqctl-core", "crates/dlqctl"] {
        assert!(manifest.contains(&format!("\"{member}\"")), "{member}");
        assert!(Path::new(&root().join(member).join("Cargo.toml")).is_file());
    }
    // The old single-crate layout is gone, not kept beside.
    for old in ["src/core", "src/lib.rs", "src/worker", "src/bin"] {
        assert!(!root().join(old).exists(), "{old} is back");
    }
}
