//! The user guide holds together: every relative link in README.md and
//! docs/*.md points at a file that exists, and a `#anchor` at a heading of
//! that page. No broker, no network: files only. (How long the README is
//! is a reader's judgement, not a line count: docs/development.md.)

use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, as paths relative to the repository.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.strip_prefix(root).expect("under the root").to_path_buf())
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The text outside fenced code blocks, line by line: its number (from 1),
/// the line as written, and the line with its inline code spans blanked
/// out (a `[x](y)` inside code is no link).
fn prose_lines(text: &str) -> Vec<(usize, &str, String)> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = if t.starts_with("```") {
            Some("```")
        } else if t.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                continue;
            }
            (Some(f), Some(m)) if f == m => {
                fence = None;
                continue;
            }
            (Some(_), _) => continue,
            (None, None) => {}
        }
        out.push((i + 1, line, blank_code_spans(line)));
    }
    out
}

fn blank_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let delim = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        match after.find(delim) {
            Some(end) => {
                out.push_str(&rest[..start]);
                out.push_str(&" ".repeat(ticks * 2 + end));
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of `[text](target)`, `![alt](target)` and `[ref]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let t = line.trim_start();
    if t.starts_with('[') {
        if let Some(i) = t.find("]: ") {
            if !t[..i].contains(']') {
                if let Some(target) = t[i + 3..].split_whitespace().next() {
                    targets.push(target.to_string());
                }
            }
        }
    }
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        let target = target.trim_start_matches('<').trim_end_matches('>');
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor for a heading: lower case, only letters, digits, `-`
/// and `_` kept, each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a page has: its headings' slugs (a repeated one gets `-1`,
/// `-2`, ...), and explicit `id="..."` / `name="..."` attributes.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    for (_, raw, line) in prose_lines(text) {
        let t = line.trim_start();
        let hashes = t.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && t[hashes..].starts_with(' ') {
            // The heading's words as written, code spans included.
            let base = slug(raw.trim_start().trim_start_matches('#'));
            let mut candidate = base.clone();
            let mut n = 0;
            while set.contains(&candidate) {
                n += 1;
                candidate = format!("{base}-{n}");
            }
            set.insert(candidate);
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = t;
            while let Some(i) = rest.find(attr) {
                let after = &rest[i + attr.len()..];
                let end = after.find('"').unwrap_or(after.len());
                set.insert(after[..end].to_string());
                rest = &after[end..];
            }
        }
    }
    set
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Every broken relative link of the given pages, as `page:line: why`.
/// `read` gives a file's text (None: no such file), `is_dir` whether a path
/// is a directory; both take paths relative to the repository.
fn broken_links(
    pages: &[PathBuf],
    read: &dyn Fn(&Path) -> Option<String>,
    exists: &dyn Fn(&Path) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    for page in pages {
        let Some(text) = read(page) else {
            problems.push(format!("{}: cannot be read", page.display()));
            continue;
        };
        let dir = page.parent().unwrap_or(Path::new(""));
        for (n, _, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                let at = format!("{}:{n}: link `{target}`", page.display());
                if target.is_empty() {
                    problems.push(format!("{at}: empty target"));
                    continue;
                }
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let resolved = if file.is_empty() {
                    page.clone()
                } else if file.starts_with('/') {
                    problems.push(format!("{at}: absolute path (make it relative)"));
                    continue;
                } else {
                    match normalize(&dir.join(file)) {
                        Some(p) => p,
                        None => {
                            problems.push(format!("{at}: leaves the repository"));
                            continue;
                        }
                    }
                };
                if !exists(&resolved) {
                    problems.push(format!("{at}: {} does not exist", resolved.display()));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if resolved.extension().is_none_or(|x| x != "md") {
                    problems.push(format!("{at}: an anchor into a file that is not markdown"));
                    continue;
                }
                match read(&resolved) {
                    Some(target_text) if anchors(&target_text).contains(anchor) => {}
                    Some(_) => problems.push(format!(
                        "{at}: {} has no heading with the anchor #{anchor}",
                        resolved.display()
                    )),
                    None => problems.push(format!("{at}: {} cannot be read", resolved.display())),
                }
            }
        }
    }
    problems
}

#[test]
fn docs_links_resolve() {
    let root = root();
    let pages = pages(&root);
    assert!(pages.len() > 1, "docs/*.md found: {pages:?}");
    let read = |p: &Path| fs::read_to_string(root.join(p)).ok();
    let exists = |p: &Path| root.join(p).exists();
    let problems = broken_links(&pages, &read, &exists);
    assert!(
        problems.is_empty(),
        "{} broken relative link(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The checker itself: a page set with a missing file, a missing anchor,
/// a link that leaves the repository and an absolute path is reported once
/// for each, and links inside code are not links.
#[test]
fn docs_link_checker_reports_each_broken_link() {
    let files: Vec<(&str, &str)> = vec![
        (
            "README.md",
            "# T\n\n## Go `here`, now\n\n[ok](docs/a.md#a-title) [self](#go-here-now)\n\
             [gone](docs/missing.md) [bad anchor](docs/a.md#nope)\n\
             `[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n\
             [up](../outside.md) [abs](/docs/a.md) [web](https://example.com/x.md)\n",
        ),
        (
            "docs/a.md",
            "# A title\n\n[back](../README.md#t) [dup](#same-1) [code](#b-two)\n## Same\n## Same\n\
             ## `b one`\n## `b two`\n",
        ),
    ];
    let read = |p: &Path| {
        files
            .iter()
            .find(|(name, _)| Path::new(name) == p)
            .map(|(_, t)| t.to_string())
    };
    let exists = |p: &Path| read(p).is_some() || p == Path::new("docs");
    let pages = vec![PathBuf::from("README.md"), PathBuf::from("docs/a.md")];
    let problems = broken_links(&pages, &read, &exists);
    let expected = [
        "README.md:6: link `docs/missing.md`: docs/missing.md does not exist",
        "README.md:6: link `docs/a.md#nope`: docs/a.md has no heading with the anchor #nope",
        "README.md:11: link `../outside.md`: leaves the repository",
        "README.md:11: link `/docs/a.md`: absolute path (make it relative)",
    ];
    assert_eq!(problems, expected);
}
