//! The architecture holds, read from the sources (no broker, no build):
//!
//! - no import cycle between files of `src/`: no two files import from
//!   each other, directly or in a circle (a `use` or a `crate::`/`super::`
//!   path in the code; `use super::X` imports the parent module's file, a
//!   `pub use child::X` in a `mod.rs` imports the child's file);
//! - `src/core/` has at most 9 top-level entries (files and folders,
//!   `mod.rs` counted), so its layout is read at a glance;
//! - `src/core/` does no I/O: no async runtime, files, sockets, processes,
//!   broker connections, clock or random numbers;
//! - no function in `src/` is longer than 100 lines;
//! - every integration test that disrupts the broker (named `serial_`)
//!   first asks `allow_disruption`, so that without
//!   `DLQCTL_TEST_DISRUPTIVE=1` it fails before touching the broker.
//!
//! Test code (`#[cfg(test)]` items and the `*tests.rs` files) is left out:
//! a test may reach anywhere and be as long as its table.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const CORE_MAX_ENTRIES: usize = 9;
const FN_MAX_LINES: usize = 100;

/// What the core may not name: I/O, the clock, randomness.
const CORE_FORBIDDEN: &[&str] = &[
    "tokio",
    "std::fs",
    "std::net",
    "std::process",
    "lapin",
    "SystemTime::now",
    "Instant::now",
    "rand::",
];

/// lapin's plain value types (re-exported from amq-protocol) are data, not
/// I/O: the core reads and builds headers and properties with them.
const CORE_LAPIN_VALUES: &[&str] = &["lapin::types::", "lapin::BasicProperties"];

// ---------------------------------------------------------------- sources

/// One source file: its path from the repository (`src/core/mod.rs`), its
/// code with comments, strings and test items blanked (lines kept), the
/// module path from its crate's root, and that root's folder.
struct Source {
    rel: String,
    code: Vec<char>,
    module: Vec<String>,
    root: String,
}

/// Every `.rs` file under `src/`, by path from the repository root.
fn read_tree() -> BTreeMap<String, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = BTreeMap::new();
    let mut stack = vec![root.join("src")];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("a readable folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let rel = path
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                files.insert(rel, fs::read_to_string(&path).expect("a readable file"));
            }
        }
    }
    files
}

fn is_test_file(rel: &str) -> bool {
    rel.ends_with("tests.rs")
}

/// The crate root folder a file belongs to and its module path in it.
fn module_of(rel: &str) -> (String, Vec<String>) {
    let mut parts: Vec<&str> = rel.split('/').collect();
    let root_len = if parts.len() > 2 && parts[1] == "bin" {
        3
    } else {
        1
    };
    let root = parts[..root_len].join("/");
    let file = parts.pop().unwrap();
    let mut module: Vec<String> = parts[root_len..].iter().map(|s| s.to_string()).collect();
    let stem = file.trim_end_matches(".rs");
    let crate_root = parts.len() == root_len && matches!(stem, "lib" | "main");
    if stem != "mod" && !crate_root {
        module.push(stem.to_string());
    }
    (root, module)
}

/// The file of a module, if the tree holds one.
fn file_of(files: &BTreeMap<String, String>, root: &str, module: &[String]) -> Option<String> {
    if module.is_empty() {
        return ["lib.rs", "main.rs"]
            .iter()
            .map(|f| format!("{root}/{f}"))
            .find(|p| files.contains_key(p));
    }
    let base = format!("{root}/{}", module.join("/"));
    [format!("{base}.rs"), format!("{base}/mod.rs")]
        .into_iter()
        .find(|p| files.contains_key(p))
}

fn sources(files: &BTreeMap<String, String>) -> Vec<Source> {
    let test_files: BTreeSet<String> = files
        .iter()
        .flat_map(|(rel, text)| {
            let (root, module) = module_of(rel);
            test_modules(&strip(text))
                .into_iter()
                .filter_map(move |m| {
                    let mut child = module.clone();
                    child.push(m);
                    file_of(files, &root, &child)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    files
        .iter()
        .filter(|(rel, _)| !is_test_file(rel) && !test_files.contains(*rel))
        .map(|(rel, text)| {
            let (root, module) = module_of(rel);
            let mut code = strip(text);
            blank_test_items(&mut code);
            Source {
                rel: rel.clone(),
                code,
                module,
                root,
            }
        })
        .collect()
}

// ---------------------------------------------------------------- lexing

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The text with comments, string and character literals replaced by
/// spaces; newlines stay, so line numbers hold.
fn strip(text: &str) -> Vec<char> {
    let s: Vec<char> = text.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut out[from..to.min(s.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let mut i = 0;
    while i < s.len() {
        let prev_ident = i > 0 && is_ident(s[i - 1]);
        if s[i] == '/' && s.get(i + 1) == Some(&'/') {
            let end = (i..s.len()).find(|&j| s[j] == '\n').unwrap_or(s.len());
            blank(&mut out, i, end);
            i = end;
        } else if s[i] == '/' && s.get(i + 1) == Some(&'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < s.len() && depth > 0 {
                if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if s[i] == 'r'
            && (!prev_ident || (i > 0 && s[i - 1] == 'b' && (i < 2 || !is_ident(s[i - 2]))))
            && matches!(s.get(i + 1), Some('"') | Some('#'))
        {
            let hashes = (i + 1..s.len()).take_while(|&j| s[j] == '#').count();
            if s.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let mut j = i + 2 + hashes;
            while j < s.len() && !(s[j] == '"' && (1..=hashes).all(|k| s.get(j + k) == Some(&'#')))
            {
                j += 1;
            }
            blank(&mut out, i + 1, j + 1 + hashes);
            i = j + 1 + hashes;
        } else if s[i] == '"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if s[i] == '\''
            && (!prev_ident || (s[i - 1] == 'b' && (i < 2 || !is_ident(s[i - 2]))))
        {
            // A character literal ('x', b'x', '\n', '\u{1F600}'), not a lifetime.
            if s.get(i + 1) == Some(&'\\') {
                let end = (i + 2..s.len()).find(|&j| s[j] == '\'').unwrap_or(s.len());
                blank(&mut out, i, end + 1);
                i = end + 1;
            } else if s.get(i + 2) == Some(&'\'') {
                blank(&mut out, i, i + 3);
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

fn starts_with(code: &[char], at: usize, word: &str) -> bool {
    let w: Vec<char> = word.chars().collect();
    code.len() >= at + w.len() && code[at..at + w.len()] == w[..]
}

/// Where `word` starts as a whole word.
fn find_words(code: &[char], word: &str) -> Vec<usize> {
    let n = word.chars().count();
    (0..code.len())
        .filter(|&i| {
            starts_with(code, i, word)
                && (i == 0 || !is_ident(code[i - 1]))
                && code.get(i + n).is_none_or(|c| !is_ident(*c))
        })
        .collect()
}

fn line_of(code: &[char], at: usize) -> usize {
    code[..at].iter().filter(|c| **c == '\n').count() + 1
}

/// The index of the `}` closing the `{` at `open`.
fn matching_brace(code: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, c) in code.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    code.len() - 1
}

/// From `from`, the first `;` or `{` outside parentheses and brackets.
fn item_end(code: &[char], from: usize) -> Option<(usize, char)> {
    let mut depth = 0i32;
    for (j, c) in code.iter().enumerate().skip(from) {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ';' | '{' if depth == 0 => return Some((j, *c)),
            '}' if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// The items under `#[cfg(test)]`: (start of the attribute, end of the item).
fn test_items(code: &[char]) -> Vec<(usize, usize)> {
    let text: String = code.iter().collect();
    let mut items = Vec::new();
    let mut search = 0;
    while let Some(found) = text[search..].find("#[cfg(test)]") {
        let start_byte = search + found;
        let start = text[..start_byte].chars().count();
        let after = start + "#[cfg(test)]".len();
        let end = match item_end(code, after) {
            Some((j, ';')) => j,
            Some((j, _)) => matching_brace(code, j),
            None => after,
        };
        items.push((start, end));
        search = start_byte + "#[cfg(test)]".len();
    }
    items
}

/// The names of the modules declared `#[cfg(test)] mod name;`.
fn test_modules(code: &[char]) -> Vec<String> {
    test_items(code)
        .into_iter()
        .filter_map(|(from, to)| {
            let item: String = code[from + "#[cfg(test)]".len()..=to].iter().collect();
            let words: Vec<&str> = item
                .split(|c: char| !is_ident(c))
                .filter(|w| !w.is_empty())
                .collect();
            let m = words.iter().position(|w| *w == "mod")?;
            item.trim_end()
                .ends_with(';')
                .then(|| words.get(m + 1).map(|w| w.to_string()))?
        })
        .collect()
}

fn blank_test_items(code: &mut [char]) {
    for (from, to) in test_items(code) {
        for c in &mut code[from..=to] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    }
}

// ---------------------------------------------------------------- imports

/// `a::{b, c::{d as e, *}}` as token list.
fn tokens(text: &str) -> Vec<String> {
    let mut toks = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if is_ident(c) {
            let j = (i..chars.len())
                .find(|&j| !is_ident(chars[j]))
                .unwrap_or(chars.len());
            toks.push(chars[i..j].iter().collect());
            i = j;
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            toks.push("::".into());
            i += 2;
        } else {
            if !c.is_whitespace() {
                toks.push(c.to_string());
            }
            i += 1;
        }
    }
    toks
}

/// The paths a use tree names.
fn use_paths(toks: &[String], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    while *i < toks.len() {
        match toks[*i].as_str() {
            "{" => {
                *i += 1;
                while *i < toks.len() && toks[*i] != "}" {
                    use_paths(toks, i, path.clone(), out);
                    if toks.get(*i).is_some_and(|t| t == ",") {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            "*" => {
                *i += 1;
                out.push(path);
                return;
            }
            "::" => *i += 1,
            word => {
                if word != "self" || path.is_empty() {
                    path.push(word.to_string());
                }
                *i += 1;
                if toks.get(*i).is_some_and(|t| t == "as") {
                    *i += 2;
                }
                if toks.get(*i).is_none_or(|t| t != "::") {
                    out.push(path);
                    return;
                }
            }
        }
    }
}

/// The module paths (as written) a file's code names, with their lines.
fn named_paths(code: &[char], children: &BTreeSet<String>) -> Vec<(Vec<String>, usize)> {
    let mut found = Vec::new();
    let mut in_use = vec![false; code.len()];
    for at in find_words(code, "use") {
        let Some(end) = (at..code.len()).find(|&j| code[j] == ';') else {
            continue;
        };
        let text: String = code[at + 3..end].iter().collect();
        let (mut i, mut paths) = (0, Vec::new());
        use_paths(&tokens(&text), &mut i, Vec::new(), &mut paths);
        found.extend(paths.into_iter().map(|p| (p, line_of(code, at))));
        in_use[at..end].iter_mut().for_each(|b| *b = true);
    }
    let mut starts: Vec<usize> = ["crate", "super", "self"]
        .iter()
        .flat_map(|w| find_words(code, w))
        .chain(children.iter().flat_map(|w| find_words(code, w)))
        .collect();
    starts.sort();
    for at in starts {
        let prev_colon = at >= 2 && code[at - 2..at] == [':', ':'];
        if in_use[at] || prev_colon {
            continue;
        }
        let mut path = Vec::new();
        let mut i = at;
        loop {
            let j = (i..code.len())
                .find(|&j| !is_ident(code[j]))
                .unwrap_or(code.len());
            path.push(code[i..j].iter().collect::<String>());
            if starts_with(code, j, "::") && code.get(j + 2).is_some_and(|c| is_ident(*c)) {
                i = j + 2;
            } else {
                break;
            }
        }
        if path.len() > 1 {
            found.push((path, line_of(code, at)));
        }
    }
    found
}

/// The modules a file declares (`mod name;`).
fn declared_children(code: &[char]) -> BTreeSet<String> {
    find_words(code, "mod")
        .into_iter()
        .filter_map(|at| {
            let (end, c) = item_end(code, at)?;
            let text: String = code[at + 3..end].iter().collect();
            (c == ';').then(|| text.trim().to_string())
        })
        .collect()
}

/// The file a path names, if it is one of ours.
fn resolve(
    files: &BTreeMap<String, String>,
    src: &Source,
    children: &BTreeSet<String>,
    path: &[String],
) -> Option<String> {
    let mut module = src.module.clone();
    let mut rest = path;
    match path.first()?.as_str() {
        "crate" => {
            module.clear();
            rest = &path[1..];
        }
        "self" => rest = &path[1..],
        "super" => {
            let supers = path.iter().take_while(|s| *s == "super").count();
            module.truncate(module.len().checked_sub(supers)?);
            rest = &path[supers..];
        }
        name if children.contains(name) => {}
        _ => return None,
    }
    for seg in rest {
        let mut next = module.clone();
        next.push(seg.clone());
        if file_of(files, &src.root, &next).is_none() {
            break;
        }
        module = next;
    }
    file_of(files, &src.root, &module)
}

/// file → (file it imports → line of the first import).
type Graph = BTreeMap<String, BTreeMap<String, usize>>;

fn import_graph(files: &BTreeMap<String, String>, sources: &[Source]) -> Graph {
    let mut graph = Graph::new();
    for src in sources {
        let children = declared_children(&src.code);
        let edges = graph.entry(src.rel.clone()).or_default();
        for (path, line) in named_paths(&src.code, &children) {
            if let Some(to) = resolve(files, src, &children, &path) {
                if to != src.rel && !is_test_file(&to) {
                    edges.entry(to).or_insert(line);
                }
            }
        }
    }
    graph
}

/// The strongly connected components of more than one file (Tarjan).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(st: &mut State<'a>, v: &'a str) {
        let n = st.index.len();
        st.index.insert(v, n);
        st.low.insert(v, n);
        st.stack.push(v);
        st.on_stack.insert(v);
        for w in st.graph.get(v).into_iter().flat_map(|e| e.keys()) {
            if !st.index.contains_key(w.as_str()) {
                visit(st, w);
                let low = st.low[w.as_str()].min(st.low[v]);
                st.low.insert(v, low);
            } else if st.on_stack.contains(w.as_str()) {
                let low = st.index[w.as_str()].min(st.low[v]);
                st.low.insert(v, low);
            }
        }
        if st.low[v] == st.index[v] {
            let mut component = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                st.found.push(component);
            }
        }
    }
    let mut st = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !st.index.contains_key(v.as_str()) {
            visit(&mut st, v);
        }
    }
    st.found
}

fn cycle_report(graph: &Graph) -> Vec<String> {
    cycles(graph)
        .into_iter()
        .map(|component| {
            let members: BTreeSet<&String> = component.iter().collect();
            let edges: Vec<String> = component
                .iter()
                .flat_map(|from| {
                    graph[from]
                        .iter()
                        .filter(|(to, _)| members.contains(to))
                        .map(move |(to, line)| format!("  {from}:{line} imports {to}"))
                })
                .collect();
            format!(
                "a cycle between {}:\n{}",
                component.join(", "),
                edges.join("\n")
            )
        })
        .collect()
}

// ---------------------------------------------------------------- functions

/// (file, function name, first line, length in lines) of every function with a body.
fn functions(src: &Source) -> Vec<(String, String, usize, usize)> {
    let code = &src.code;
    find_words(code, "fn")
        .into_iter()
        .filter_map(|at| {
            let name_at = (at + 2..code.len()).find(|&j| !code[j].is_whitespace())?;
            let name_end = (name_at..code.len()).find(|&j| !is_ident(code[j]))?;
            if name_end == name_at {
                return None; // a `fn(..)` pointer type
            }
            let (open, c) = item_end(code, name_end)?;
            if c != '{' {
                return None;
            }
            let close = matching_brace(code, open);
            let (first, last) = (line_of(code, at), line_of(code, close));
            let name: String = code[name_at..name_end].iter().collect();
            Some((src.rel.clone(), name, first, last - first + 1))
        })
        .collect()
}

// ---------------------------------------------------------------- the checks

fn tree() -> (BTreeMap<String, String>, Vec<Source>) {
    let files = read_tree();
    let sources = sources(&files);
    (files, sources)
}

#[test]
fn no_import_cycles_between_files() {
    let (files, sources) = tree();
    let graph = import_graph(&files, &sources);
    assert!(
        graph.values().map(|e| e.len()).sum::<usize>() > 100,
        "the imports were read"
    );
    let report = cycle_report(&graph);
    assert!(
        report.is_empty(),
        "import cycles in src/:\n{}",
        report.join("\n")
    );
}

#[test]
fn the_core_has_at_most_nine_entries() {
    let core = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core");
    let entries: Vec<String> = fs::read_dir(core)
        .expect("src/core is readable")
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
        "src/core has {} top-level entries (at most {CORE_MAX_ENTRIES}): {entries:?}",
        entries.len()
    );
}

#[test]
fn the_core_does_no_io() {
    let (_, sources) = tree();
    let mut found = Vec::new();
    for src in sources.iter().filter(|s| s.rel.starts_with("src/core/")) {
        for word in CORE_FORBIDDEN {
            let first = word.split("::").next().unwrap();
            for at in find_words(&src.code, first) {
                if !starts_with(&src.code, at, word) {
                    continue;
                }
                if *word == "lapin"
                    && CORE_LAPIN_VALUES
                        .iter()
                        .any(|v| starts_with(&src.code, at, v))
                {
                    continue;
                }
                found.push(format!(
                    "{}:{} uses {word}",
                    src.rel,
                    line_of(&src.code, at)
                ));
            }
        }
    }
    assert!(found.is_empty(), "I/O in the core:\n{}", found.join("\n"));
}

#[test]
fn no_function_is_longer_than_100_lines() {
    let (_, sources) = tree();
    let all: Vec<_> = sources.iter().flat_map(functions).collect();
    assert!(all.len() > 500, "the functions were read");
    let long: Vec<String> = all
        .iter()
        .filter(|(_, _, _, len)| *len > FN_MAX_LINES)
        .map(|(file, name, line, len)| format!("{file}:{line} fn {name}: {len} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "functions over {FN_MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// The `serial_` test functions of `code` (comments and strings blanked)
/// whose body does not begin with `allow_disruption(...)`, by line.
fn serial_tests_not_asking(code: &[char]) -> (usize, Vec<(usize, String)>) {
    let mut seen = 0;
    let mut bad = Vec::new();
    for at in find_words(code, "fn") {
        let name_at = (at + 2..code.len())
            .find(|&i| !code[i].is_whitespace())
            .unwrap_or(code.len());
        let name_end = (name_at..code.len())
            .find(|&i| !is_ident(code[i]))
            .unwrap_or(code.len());
        let name: String = code[name_at..name_end].iter().collect();
        if !name.starts_with("serial_") {
            continue;
        }
        seen += 1;
        let Some((open, '{')) = item_end(code, name_end) else {
            continue;
        };
        let body: String = code[open + 1..].iter().take(200).collect();
        let first = body.trim_start();
        let asks = ["crate::support::allow_disruption(", "allow_disruption("]
            .iter()
            .any(|p| first.starts_with(p));
        if !asks {
            bad.push((line_of(code, at), name));
        }
    }
    (seen, bad)
}

#[test]
fn every_test_that_disrupts_the_broker_asks_first() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration");
    let mut seen = 0;
    let mut bad = Vec::new();
    for entry in fs::read_dir(&dir).expect("tests/integration is readable") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).expect("a readable test file");
            let (n, found) = serial_tests_not_asking(&strip(&text));
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

// ---------------------------------------------------------------- the checker itself

#[test]
fn the_checker_finds_a_serial_test_that_does_not_ask() {
    let code = strip(
        "async fn serial_a() {\n    crate::support::allow_disruption(\"x\");\n}\n\
         // fn serial_in_a_comment() {}\n\
         async fn serial_b() -> () {\n    // allow_disruption(\"x\");\n    stop();\n}\n\
         fn other() { stop(); }\n",
    );
    assert_eq!(
        serial_tests_not_asking(&code),
        (2, vec![(5, "serial_b".to_string())])
    );
}

fn synthetic(files: &[(&str, &str)]) -> (BTreeMap<String, String>, Vec<Source>) {
    let files: BTreeMap<String, String> = files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect();
    let sources = sources(&files);
    (files, sources)
}

#[test]
fn the_checker_finds_a_cycle_through_a_parent_module() {
    let (files, sources) = synthetic(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\n"),
        (
            "src/a/mod.rs",
            "mod x;\npub use x::X;\n// use crate::b::B;\nconst S: &str = \"crate::b::B\";\n",
        ),
        (
            "src/a/x.rs",
            "use super::Y;\npub struct X;\n#[cfg(test)]\nmod tests { use crate::b::B; }\n",
        ),
        (
            "src/b.rs",
            "pub struct B;\nfn f() { let _ = crate::a::X; }\n",
        ),
    ]);
    let graph = import_graph(&files, &sources);
    assert_eq!(
        cycles(&graph),
        vec![vec!["src/a/mod.rs".to_string(), "src/a/x.rs".to_string()]]
    );
    assert!(graph["src/b.rs"].contains_key("src/a/mod.rs"));
    assert!(
        !graph["src/a/x.rs"].contains_key("src/b.rs"),
        "test code is left out"
    );
    assert!(
        !graph["src/a/mod.rs"].contains_key("src/b.rs"),
        "comments and strings are left out"
    );
}

#[test]
fn the_checker_measures_functions() {
    let body = "    let _ = ('{', b'{', \"{\", r#\"{\"#); // {\n".repeat(FN_MAX_LINES - 1);
    let text = format!("fn long() {{\n{body}}}\nfn short(f: fn(u8) -> u8) -> [u8; 2] {{ [f(1), 2] }}\ntrait T {{ fn m(&self); }}\n");
    let (_, sources) = synthetic(&[("src/lib.rs", &text)]);
    let found = functions(&sources[0]);
    let lengths: Vec<(&str, usize)> = found.iter().map(|(_, n, _, l)| (n.as_str(), *l)).collect();
    assert_eq!(lengths, vec![("long", FN_MAX_LINES + 1), ("short", 1)]);
}
