//! The wire vocabulary lives in one module, read from the sources (no
//! broker, no build):
//!
//! - no string literal of the Rust sources (`src/`, and `crates/` when the
//!   code lives there; `target` folders skipped) starts with `dlqctl-`
//!   outside the vocabulary module, `wire.rs`: every `dlqctl-*` header
//!   name, and every other name that starts with `dlqctl-`, is one of its
//!   constants;
//! - docs/headers.md lists exactly the header names of `wire.rs` (its
//!   `pub const …_HEADER: &str = "dlqctl-…";` constants): one table row
//!   each, none missing, none extra.
//!
//! `wire.rs` is found by name under `src/` or `crates/`, wherever the core
//! lives.

// A test may be as long as its scanner: the length rule
// (clippy::too_many_lines) is for the code it checks.
#![allow(clippy::too_many_lines)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// What a literal may not start with outside the vocabulary module.
const PREFIX: &str = "dlqctl-";
/// The vocabulary module's file name.
const VOCABULARY_FILE: &str = "wire.rs";
/// The reference page of the headers.
const HEADERS_PAGE: &str = "docs/headers.md";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `src/` and `crates/` (when it exists), `target`
/// and hidden folders skipped, sorted.
fn rust_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack: Vec<PathBuf> = ["src", "crates"]
        .iter()
        .map(|d| root.join(d))
        .filter(|d| d.is_dir())
        .collect();
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("a readable folder") {
            let path = entry.expect("a folder entry").path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The one `wire.rs` of the sources.
fn vocabulary_file(root: &Path) -> PathBuf {
    let found: Vec<PathBuf> = rust_files(root)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == VOCABULARY_FILE))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {VOCABULARY_FILE} under src/ or crates/, found {found:?}"
    );
    found.into_iter().next().unwrap()
}

fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

// ---------------------------------------------------------------- lexing

/// The string literals of a Rust source (plain, raw, byte and C strings),
/// as (line from 1, contents as written between the quotes). Comments,
/// character literals and lifetimes are skipped.
fn string_literals(text: &str) -> Vec<(usize, String)> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Advances over c[from..to], counting lines.
    let skip = |from: usize, to: usize, line: &mut usize| {
        *line += c[from..to.min(c.len())]
            .iter()
            .filter(|&&ch| ch == '\n')
            .count();
        to
    };
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        match c[i] {
            '/' if at(i + 1) == '/' => {
                let end = (i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len());
                i = skip(i, end, &mut line);
            }
            '/' if at(i + 1) == '*' => {
                let mut depth = 0;
                let mut k = i;
                while k < c.len() {
                    if c[k] == '/' && at(k + 1) == '*' {
                        depth += 1;
                        k += 2;
                    } else if c[k] == '*' && at(k + 1) == '/' {
                        depth -= 1;
                        k += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        k += 1;
                    }
                }
                i = skip(i, k, &mut line);
            }
            '"' => {
                let (end, body) = plain_string(&c, i + 1);
                out.push((line, body));
                i = skip(i, end, &mut line);
            }
            '\'' => {
                // A character literal ('x', '\n', '\u{1F600}', '\'') or a
                // lifetime / label ('a, 'static), which has no closing quote.
                if at(i + 1) == '\\' {
                    let mut k = i + 3;
                    while k < c.len() && c[k] != '\'' {
                        k += 1;
                    }
                    i = k + 1;
                } else if at(i + 2) == '\'' {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            ch if ch.is_alphanumeric() || ch == '_' => {
                let start = i;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                match (word.as_str(), at(i)) {
                    ("r" | "br" | "cr", '"' | '#') => {
                        let mut hashes = 0;
                        while at(i + hashes) == '#' {
                            hashes += 1;
                        }
                        if at(i + hashes) != '"' {
                            continue; // a raw identifier, r#type
                        }
                        let open = i + hashes + 1;
                        let mut k = open;
                        let close = loop {
                            if k >= c.len() {
                                break c.len();
                            }
                            if c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#') {
                                break k;
                            }
                            k += 1;
                        };
                        let body: String = c[open..close].iter().collect();
                        out.push((line, body));
                        i = skip(i, close + 1 + hashes, &mut line);
                    }
                    ("b" | "c", '"') => {
                        let (end, body) = plain_string(&c, i + 1);
                        out.push((line, body));
                        i = skip(i, end, &mut line);
                    }
                    ("b", '\'') => {
                        let mut k = i + 1;
                        if at(k) == '\\' {
                            k += 2;
                        } else {
                            k += 1;
                        }
                        while k < c.len() && c[k] != '\'' {
                            k += 1;
                        }
                        i = k + 1;
                    }
                    _ => {}
                }
            }
            '\n' => {
                line += 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// A plain string whose contents start at `open`: the index after its
/// closing quote, and its contents as written (escapes kept).
fn plain_string(c: &[char], open: usize) -> (usize, String) {
    let mut k = open;
    while k < c.len() && c[k] != '"' {
        k += if c[k] == '\\' { 2 } else { 1 };
    }
    let close = k.min(c.len());
    (close + 1, c[open..close].iter().collect())
}

// ---------------------------------------------------------------- the vocabulary

/// The header constants of the vocabulary module: (name, value) of every
/// `pub const NAME_HEADER: &str = "...";`, in order.
fn header_constants(wire: &str) -> Vec<(String, String)> {
    // Comments left out; one line per item, whatever rustfmt wrapped.
    let code: Vec<&str> = wire
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    let flat = code
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = Vec::new();
    for item in flat.split("pub const ").skip(1) {
        let Some((name, rest)) = item.split_once(':') else {
            continue;
        };
        if !name.ends_with("_HEADER") {
            continue;
        }
        let value = rest
            .trim_start()
            .strip_prefix("&str = \"")
            .and_then(|v| v.split_once('"'))
            .map(|(v, _)| v.to_string())
            .unwrap_or_else(|| panic!("{name} is not a `&str = \"...\"` constant: {rest:.60}"));
        out.push((name.to_string(), value));
    }
    out
}

/// The header names a page lists: the first cell of every table row that
/// is a code span starting with `dlqctl-`, in order.
fn listed_headers(page: &str) -> Vec<String> {
    page.lines()
        .filter_map(|l| {
            let first = l.trim().strip_prefix('|')?.split('|').next()?.trim();
            let name = first.strip_prefix('`')?.strip_suffix('`')?;
            name.starts_with(PREFIX).then(|| name.to_string())
        })
        .collect()
}

#[test]
fn no_literal_starts_with_dlqctl_outside_the_vocabulary_module() {
    let root = root();
    let wire = vocabulary_file(&root);
    let files = rust_files(&root);
    assert!(
        files.len() > 20,
        "too few sources found under src/ and crates/: {}",
        files.len()
    );
    let mut found = Vec::new();
    let mut in_wire = 0;
    for path in &files {
        let text = fs::read_to_string(path).expect("a readable file");
        for (line, body) in string_literals(&text) {
            if !body.starts_with(PREFIX) {
                continue;
            }
            if *path == wire {
                in_wire += 1;
            } else {
                found.push(format!("{}:{line}: \"{body}\"", rel(&root, path)));
            }
        }
    }
    assert!(
        in_wire > 0,
        "{} holds no `dlqctl-` literal: is it the vocabulary module?",
        rel(&root, &wire)
    );
    assert!(
        found.is_empty(),
        "string literals starting with `{PREFIX}` outside {} (name a constant of it instead):\n{}",
        rel(&root, &wire),
        found.join("\n")
    );
}

#[test]
fn the_headers_page_lists_exactly_the_header_names_of_the_vocabulary() {
    let root = root();
    let wire = vocabulary_file(&root);
    let constants = header_constants(&fs::read_to_string(&wire).expect("a readable wire.rs"));
    assert!(
        !constants.is_empty(),
        "no `pub const …_HEADER: &str` in {}",
        rel(&root, &wire)
    );
    let mut names = BTreeSet::new();
    for (constant, value) in &constants {
        assert!(
            value.starts_with(PREFIX),
            "{constant} = {value:?} does not start with {PREFIX}"
        );
        assert!(names.insert(value.clone()), "{value} named twice");
    }
    let page = fs::read_to_string(root.join(HEADERS_PAGE)).expect("docs/headers.md exists");
    let listed = listed_headers(&page);
    let mut documented = BTreeSet::new();
    for name in &listed {
        assert!(
            documented.insert(name.clone()),
            "{HEADERS_PAGE}: {name} has two rows"
        );
    }
    let missing: Vec<_> = names.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&names).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{HEADERS_PAGE} against {}: missing {missing:?}, extra {extra:?}",
        rel(&root, &wire)
    );
}

#[test]
fn the_lexer_finds_literals_and_skips_comments_chars_and_lifetimes() {
    let src = r###"
// "dlqctl-in-a-comment"
/* "dlqctl-in /* nested */ a block" */
/// "dlqctl-in-a-doc"
fn f<'a>(x: &'a str) -> char { let _ = '"'; let _ = '\''; 'x' }
let a = "dlqctl-plain \" still";
let b = r#"dlqctl-raw "quoted""#;
let c = b"dlqctl-bytes";
let d = br"dlqctl-raw-bytes";
let r#type = format!("{}", "other");
let e = 'label: loop { break 'label; };
let f = "multi
line"; let g = "dlqctl-after";
"###;
    let got = string_literals(src);
    let want: Vec<(usize, String)> = vec![
        (6, r#"dlqctl-plain \" still"#.into()),
        (7, r#"dlqctl-raw "quoted""#.into()),
        (8, "dlqctl-bytes".into()),
        (9, "dlqctl-raw-bytes".into()),
        (10, "{}".into()),
        (10, "other".into()),
        (12, "multi\nline".into()),
        (13, "dlqctl-after".into()),
    ];
    assert_eq!(got, want);
    let page = "| Header | Type |\n|---|---|\n| `dlqctl-a` | x |\n| `x-death` | y |\n`dlqctl-b`\n";
    assert_eq!(listed_headers(page), ["dlqctl-a"]);
    let wire = "/// pub const NOT_HEADER: &str = \"dlqctl-doc\";\npub const A_HEADER: &str = \"dlqctl-a\";\npub const B: &str = \"dlqctl-b\";\npub const LONG_NAME_HEADER: &str =\n    \"dlqctl-long\";\n";
    assert_eq!(
        header_constants(wire),
        [
            ("A_HEADER".to_string(), "dlqctl-a".to_string()),
            ("LONG_NAME_HEADER".to_string(), "dlqctl-long".to_string())
        ]
    );
}
