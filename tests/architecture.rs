//! The house rules of the source tree, checked on every test run
//! (docs/ARCHITECTURE.md, "Layers"):
//!
//! 1. no import circle among the library's top-level modules of src/;
//! 2. format code names nothing above `error`, `row`, `token` and `identity`;
//! 3. the operations `commit`, `materialize` and `sweep` never name one
//!    another: what they share lives in the write-side layer below them;
//! 4. nothing in src/ names the mount daemon.
//!
//! Edges are the `crate::…` paths each file names (comments and string
//! literals aside). Each rule is also run against a planted violation, in
//! memory and in a copy of the real tree, so the check itself cannot rot.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules format code may name besides its own.
const FORMAT_MAY_USE: &[&str] = &["error", "row", "token", "identity"];
/// Operations that must not name one another.
const OPERATIONS: &[&str] = &["commit", "materialize", "sweep"];

/// A source file: its path relative to src/ and its text.
struct Source {
    rel: String,
    text: String,
}

/// `from` module → `to` module → files of `from` naming `to`.
type Edges = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn read_tree(root: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("list src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).expect("under src");
                out.push(Source {
                    rel: rel.to_string_lossy().into_owned(),
                    text: std::fs::read_to_string(&path).expect("read source"),
                });
            }
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

/// The top-level module a file belongs to; `None` for the crate roots and
/// the binary's own modules (`cli`, which names the library as `strata::`).
fn top_module(rel: &str) -> Option<String> {
    let first = rel.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    match name {
        "lib" | "main" | "cli" => None,
        _ => Some(name.to_string()),
    }
}

/// The text without comments, string and char literals (so a doc naming
/// `crate::x` or a key like "sweep/…" is not an edge).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
        } else if b[i] == b'"' || (b[i] == b'r' && b.get(i + 1) == Some(&b'"')) {
            i = skip_string(b, i);
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3;
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            i = text[i + 2..].find('\'').map_or(b.len(), |e| i + 2 + e + 1);
        } else {
            let c = text[i..].chars().next().expect("in bounds");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Index just past the string literal starting at `i` (plain or raw).
fn skip_string(b: &[u8], mut i: usize) -> usize {
    if b[i] == b'r' {
        i += 2;
        while i < b.len() && b[i] != b'"' {
            i += 1;
        }
        return i + 1;
    }
    i += 1;
    while i < b.len() && b[i] != b'"' {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// Top-level module names a piece of code reaches through `crate::`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && is_ident(code.as_bytes()[at - 1]) {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => out.extend(group_heads(group)),
            None => out.extend(ident_at(rest)),
        }
    }
    out
}

/// First path segment of every item of a `{a, b::c, d::{e}}` group.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut start) = (0usize, true);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => start = true,
            c if start && depth == 0 && !c.is_whitespace() => {
                heads.extend(ident_at(&group[i..]));
                start = false;
            }
            _ => {}
        }
    }
    heads
}

fn ident_at(s: &str) -> Option<String> {
    let end = s.bytes().position(|c| !is_ident(c)).unwrap_or(s.len());
    (end > 0).then(|| s[..end].to_string())
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn edges(tree: &[Source]) -> Edges {
    let modules: BTreeSet<String> = tree.iter().filter_map(|s| top_module(&s.rel)).collect();
    let mut edges = Edges::new();
    for s in tree {
        let Some(from) = top_module(&s.rel) else {
            continue;
        };
        for to in crate_paths(&code_only(&s.text)) {
            if to != from && modules.contains(&to) {
                let files = edges.entry(from.clone()).or_default();
                files.entry(to).or_default().insert(s.rel.clone());
            }
        }
    }
    edges
}

/// Every rule broken by `tree`, one line each.
fn violations(tree: &[Source]) -> Vec<String> {
    let edges = edges(tree);
    let mut out = cycles(&edges);
    out.extend(format_reaching_up(&edges));
    out.extend(operations_naming_each_other(&edges));
    out.extend(naming_the_daemon(tree));
    out
}

/// Rule 1: strongly connected components of more than one module.
fn cycles(edges: &Edges) -> Vec<String> {
    let mut nodes: BTreeSet<&str> = edges.keys().map(String::as_str).collect();
    nodes.extend(edges.values().flat_map(|t| t.keys().map(String::as_str)));
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for to in edges.get(&m).into_iter().flat_map(|t| t.keys()) {
                if seen.insert(to.clone()) {
                    todo.push(to.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<String>> = nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reached[n].contains(*n) {
            continue;
        }
        let circle: Vec<&str> = nodes
            .iter()
            .copied()
            .filter(|m| reached[n].contains(*m) && reached[m].contains(*n))
            .collect();
        done.extend(circle.iter().map(|m| m.to_string()));
        out.push(format!(
            "import circle among {}: {}",
            circle.join(", "),
            circle_detail(edges, &circle)
        ));
    }
    out
}

fn circle_detail(edges: &Edges, circle: &[&str]) -> String {
    let mut parts = Vec::new();
    for from in circle {
        for (to, files) in edges.get(*from).into_iter().flatten() {
            if circle.contains(&to.as_str()) {
                let files: Vec<&str> = files.iter().map(String::as_str).collect();
                parts.push(format!("{from} -> {to} ({})", files.join(" ")));
            }
        }
    }
    parts.join("; ")
}

/// Rule 2.
fn format_reaching_up(edges: &Edges) -> Vec<String> {
    let Some(out) = edges.get("format") else {
        return Vec::new();
    };
    out.iter()
        .filter(|(to, _)| !FORMAT_MAY_USE.contains(&to.as_str()))
        .map(|(to, files)| {
            format!("format names `{to}` (in {files:?}); it may name only {FORMAT_MAY_USE:?}")
        })
        .collect()
}

/// Rule 3.
fn operations_naming_each_other(edges: &Edges) -> Vec<String> {
    let mut out = Vec::new();
    for from in OPERATIONS {
        for (to, files) in edges.get(*from).into_iter().flatten() {
            if OPERATIONS.contains(&to.as_str()) {
                out.push(format!(
                    "operation `{from}` names operation `{to}` (in {files:?})"
                ));
            }
        }
    }
    out
}

/// Rule 4: the daemon crate is `strata_mountd` / `strata-mountd`.
fn naming_the_daemon(tree: &[Source]) -> Vec<String> {
    tree.iter()
        .filter(|s| {
            let code = code_only(&s.text);
            code.contains("strata_mountd") || code.contains("mountd::")
        })
        .map(|s| format!("{} names the mount daemon", s.rel))
        .collect()
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn source(rel: &str, text: &str) -> Source {
    Source {
        rel: rel.into(),
        text: text.into(),
    }
}

#[test]
fn the_source_tree_keeps_the_house_rules() {
    let broken = violations(&read_tree(&src_dir()));
    assert!(
        broken.is_empty(),
        "house rules broken:\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn the_edges_of_the_real_tree_are_seen() {
    let edges = edges(&read_tree(&src_dir()));
    assert!(edges["commit"].contains_key("index"), "{edges:?}");
    assert!(edges["format"].contains_key("error"), "{edges:?}");
}

#[test]
fn a_planted_circle_is_found() {
    let tree = [
        source("a.rs", "use crate::b::X;"),
        source("b/mod.rs", "mod c;"),
        source("b/c.rs", "use crate::{error, a::{Y, Z}};"),
        source("error.rs", ""),
    ];
    let broken = violations(&tree);
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert!(
        broken[0].starts_with("import circle among a, b"),
        "{broken:?}"
    );
}

#[test]
fn comments_strings_and_longer_names_are_not_edges() {
    let tree = [
        source(
            "a.rs",
            "// uses crate::b\nconst K: &str = \"crate::b\"; fn f() { my_crate::b(); }",
        ),
        source("b.rs", "use crate::a;"),
    ];
    assert!(violations(&tree).is_empty());
}

#[test]
fn planted_violations_of_each_rule_are_found() {
    let tree = [
        source("format/segment.rs", "use crate::store::keys;"),
        source("store.rs", ""),
        source("materialize/fold.rs", "use crate::commit::Staging;"),
        source("commit/mod.rs", ""),
        source("pin.rs", "fn f() { strata_mountd::serve(); }"),
    ];
    let broken = violations(&tree).join("\n");
    assert!(broken.contains("format names `store`"), "{broken}");
    assert!(
        broken.contains("operation `materialize` names operation `commit`"),
        "{broken}"
    );
    assert!(broken.contains("pin.rs names the mount daemon"), "{broken}");
}

#[test]
fn a_violation_planted_in_a_copy_of_the_real_tree_is_found() {
    let copy = tempfile::tempdir().expect("tempdir");
    let mut tree = read_tree(&src_dir());
    for s in &tree {
        let path = copy.path().join(&s.rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, &s.text).expect("copy");
    }
    let planted = copy.path().join("commit/mod.rs");
    let text = std::fs::read_to_string(&planted).expect("read commit");
    std::fs::write(
        &planted,
        format!("{text}\n#[allow(unused_imports)]\nuse crate::sweep::SweepOptions;\n"),
    )
    .expect("plant");
    tree = read_tree(copy.path());
    let broken = violations(&tree).join("\n");
    assert!(
        broken.contains("operation `commit` names operation `sweep`"),
        "{broken}"
    );
}
