//! `dlqctl completions` and `dlqctl man`, checked with the programs that
//! use them: bash's completion machinery and `man -l`. No broker needed.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A scratch folder of its own for each call (tests share a process
/// under `cargo test`).
fn scratch(what: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("dlqctl-{what}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const DLQCTL: &str = env!("CARGO_BIN_EXE_dlqctl");

fn dlqctl(args: &[&str]) -> Output {
    Command::new(DLQCTL)
        .args(args)
        .output()
        .expect("run dlqctl")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What bash's completion offers for `line` (the cursor at its end), with
/// the script `dlqctl completions bash` prints loaded into an interactive
/// bash that reads no rc file.
fn bash_completes(line: &str) -> Vec<String> {
    let script = dlqctl(&["completions", "bash"]);
    assert!(script.status.success(), "{}", text(&script.stderr));
    let dir = scratch("completion");
    let file = dir.join("dlqctl.bash");
    std::fs::write(&file, &script.stdout).unwrap();
    // What bash does when Tab is pressed: split the line into COMP_WORDS,
    // call the function `complete -p dlqctl` names, read COMPREPLY.
    let driver = format!(
        r#"source {file}
line='{line}'
read -ra COMP_WORDS <<< "$line"
[[ "$line" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_LINE="$line"; COMP_POINT=${{#line}}
spec=$(complete -p dlqctl) || exit 7
fn=$(sed -E 's/.*-F ([^ ]+).*/\1/' <<< "$spec")
"$fn" dlqctl "${{COMP_WORDS[$COMP_CWORD]}}" "${{COMP_WORDS[$COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        file = file.display()
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-i", "-c", &driver])
        .output()
        .expect("run bash");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "bash: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_completes_a_subcommand() {
    assert_eq!(bash_completes("dlqctl prov"), vec!["provision"]);
    let dlq = bash_completes("dlqctl dlq rep");
    assert_eq!(dlq, vec!["replay"], "{dlq:?}");
    let dlq = bash_completes("dlqctl dlq re");
    assert_eq!(dlq, vec!["replay", "redrive"], "{dlq:?}");
}

#[test]
fn bash_completes_options_and_their_values() {
    let opts = bash_completes("dlqctl dlq replay --can");
    assert!(
        opts.contains(&"--canary".to_string()) && opts.contains(&"--canary-wait".to_string()),
        "{opts:?}"
    );
    let values = bash_completes("dlqctl --log-format ");
    assert_eq!(values, vec!["text", "json"], "{values:?}");
}

#[test]
fn every_shell_gets_a_script() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = dlqctl(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("provision"),
            "{shell}: no subcommand in the script"
        );
    }
    let out = dlqctl(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// Renders a page with `man -l`, warnings on: a roff mistake is a failure.
fn man_renders(page: &[u8]) -> String {
    let dir = scratch("man");
    let file = dir.join("page.1");
    std::fs::write(&file, page).unwrap();
    let out = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(&file)
        .env("MANWIDTH", "80")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .output()
        .expect("run man (Debian: apt-get install man-db)");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "man -l: {}", text(&out.stderr));
    assert!(
        out.stderr.is_empty(),
        "man -l warned: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
fn man_renders_the_page_of_dlqctl_and_of_every_subcommand() {
    let top = dlqctl(&["man"]);
    assert!(top.status.success(), "{}", text(&top.stderr));
    let shown = man_renders(&top.stdout);
    for part in [
        "NAME",
        "SYNOPSIS",
        "SUBCOMMANDS",
        "dlqctl-provision(1)",
        "EXAMPLES",
    ] {
        assert!(shown.contains(part), "no {part} in:\n{shown}");
    }
    for path in [
        &["validate"][..],
        &["provision"],
        &["work"],
        &["status"],
        &["serve"],
        &["dlq"],
        &["dlq", "peek"],
        &["dlq", "summary"],
        &["dlq", "export"],
        &["dlq", "replay"],
        &["dlq", "redrive"],
        &["dlq", "purge"],
        &["doctor"],
        &["drill"],
        &["completions"],
        &["man"],
    ] {
        let mut args = vec!["man"];
        args.extend_from_slice(path);
        let out = dlqctl(&args);
        assert!(out.status.success(), "{path:?}: {}", text(&out.stderr));
        let shown = man_renders(&out.stdout);
        let name = format!("dlqctl-{}", path.join("-"));
        assert!(shown.contains(&name), "{path:?}: no {name} in:\n{shown}");
        assert!(shown.contains("OPTIONS"), "{path:?}: no OPTIONS");
        // The examples of its --help, one command line each.
        let examples = shown.split("EXAMPLES").nth(1).unwrap_or_default();
        let first = format!("dlqctl {} ", path.join(" "));
        assert!(
            examples.lines().any(|l| l.trim().starts_with(&first)),
            "{path:?}: no example line starting {first:?} under EXAMPLES in:\n{shown}"
        );
    }
}

/// `dlqctl man --out DIR` (what the Debian package runs) writes one page
/// per command, each the page `dlqctl man COMMAND...` prints, and lists
/// them; none for `help`.
#[test]
fn man_out_writes_the_page_of_every_command() {
    let dir = scratch("man-out");
    let out = dlqctl(&["man", "--out", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), listed.lines().count(), "{listed}");
    for (name, path) in [
        ("dlqctl.1", &[][..]),
        ("dlqctl-work.1", &["work"]),
        ("dlqctl-dlq.1", &["dlq"]),
        ("dlqctl-dlq-replay.1", &["dlq", "replay"]),
    ] {
        let mut args = vec!["man"];
        args.extend_from_slice(path);
        let page = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(page, dlqctl(&args).stdout, "{name}");
    }
    assert_eq!(names.len(), 17, "{names:?}");
    assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn man_of_an_unknown_subcommand_is_usage_naming_the_known_ones() {
    let out = dlqctl(&["man", "dlq", "redo"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("`redo`") && err.contains("replay"), "{err}");
}

#[test]
fn version_names_the_commit_when_built_from_git() {
    let out = dlqctl(&["--version"]);
    assert!(out.status.success());
    let v = text(&out.stdout);
    assert!(
        v.starts_with(&format!("dlqctl {}", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    let here = env!("CARGO_MANIFEST_DIR");
    let head = Command::new("git")
        .args(["-C", here, "rev-parse", "--short=12", "HEAD"])
        .output();
    if let Ok(h) = head {
        if h.status.success() {
            let commit = text(&h.stdout).trim().to_string();
            assert!(v.contains(&format!("({commit}")), "{v} lacks {commit}");
        }
    }
}

/// `cargo package --list` of `package` (what `cargo package` and a
/// crates.io upload would hold).
fn package_list(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "package",
            "--list",
            "--locked",
            "--allow-dirty",
            "-p",
            package,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo package --list");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Each crate's package lists the code, the user guide, the examples and
/// the licences, and nothing else: no tests, benches, screenshots, CI or
/// deploy files.
#[test]
fn the_package_lists_only_what_belongs() {
    let common = |f: &str| {
        [
            ".cargo_vcs_info.json",
            "Cargo.toml",
            "Cargo.toml.orig",
            "Cargo.lock",
            "README.md",
        ]
        .contains(&f)
            || f.starts_with("src/")
    };
    let cli = package_list("dlqctl-cli");
    let belongs = |f: &str| {
        common(f)
            || ["build.rs", "LICENSE-MIT", "LICENSE-APACHE"].contains(&f)
            || f.starts_with("examples/")
            || f.starts_with("topology/")
            || (f.starts_with("docs/") && (f.ends_with(".md") || f.starts_with("docs/ci/")))
    };
    let stray: Vec<&String> = cli.iter().filter(|f| !belongs(f)).collect();
    assert!(stray.is_empty(), "files that do not belong: {stray:?}");
    for needed in [
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "README.md",
        "Cargo.lock",
        "build.rs",
        "src/main.rs",
        "src/serve/mod.rs",
        "topology/orders.yaml",
        "topology/demo-handler.sh",
        "examples/publish.rs",
        "docs/production.md",
    ] {
        assert!(
            cli.iter().any(|f| f == needed),
            "{needed} is not in the package: {cli:?}"
        );
    }
    // The library and the core: their code, their README, the core's lint
    // rules, the library's example.
    for (package, needed) in [
        ("dlqctl", &["src/lib.rs", "examples/embedded_worker.rs"][..]),
        ("dlqctl-core", &["src/lib.rs", "clippy.toml"][..]),
    ] {
        let files = package_list(package);
        let stray: Vec<&String> = files
            .iter()
            .filter(|f| !(common(f) || f.starts_with("examples/") || *f == "clippy.toml"))
            .collect();
        assert!(
            stray.is_empty(),
            "{package}: files that do not belong: {stray:?}"
        );
        for n in needed {
            assert!(files.iter().any(|f| f == n), "{package}: no {n}: {files:?}");
        }
    }
}
