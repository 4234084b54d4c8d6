//! No function of the crate is longer than [`LIMIT`] lines: a long function is one that does
//! several jobs, which the next feature then has to pull apart. This test reads every source
//! file (rustfmt's layout: a function ends at the first line that is its indentation and
//! `}`) and lists every function over the limit, except the few [`KNOWN`] ones, which must
//! still be over it (a split function leaves the list).

use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a function may have, its signature and closing brace included.
const LIMIT: usize = 120;

/// Functions still over the limit, each to be split: (file under `src/`, function).
const KNOWN: &[(&str, &str)] = &[
    // Records, inspects, instantiates and handles failures in one piece (issue 33).
    ("capture.rs", "capture"),
    // Reads one kernel node's parameters word by word.
    ("fingerprint.rs", "read"),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The name of the function a line declares, if it declares one.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
        "extern \"C\" ",
    ] {
        while let Some(r) = rest.strip_prefix(prefix) {
            rest = r;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// Every function of `text` over `limit` lines: (name, first line, length).
fn long_functions(text: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        let close = format!("{indent}}}");
        // A declaration without a body (a trait's) ends with `;` before any `{`.
        let body = lines[i..]
            .iter()
            .position(|l| l.trim_end().ends_with('{') || l.trim_end().ends_with(';'));
        if body.is_some_and(|k| lines[i + k].trim_end().ends_with(';')) {
            continue;
        }
        if let Some(k) = lines[i..].iter().position(|l| l.trim_end() == close) {
            if k + 1 > limit {
                out.push((name.to_owned(), i + 1, k + 1));
            }
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "the sources were not found");
    let mut over = Vec::new();
    let mut known_seen = Vec::new();
    for path in &files {
        let rel = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let text = fs::read_to_string(path).expect("a source file");
        for (name, line, len) in long_functions(&text, LIMIT) {
            if KNOWN.contains(&(rel.as_str(), name.as_str())) {
                known_seen.push((rel.clone(), name));
            } else {
                over.push(format!("src/{rel}:{line} `{name}`: {len} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "functions over {LIMIT} lines (split them into functions with one job each):\n{}",
        over.join("\n")
    );
    for (file, name) in KNOWN {
        assert!(
            known_seen.iter().any(|(f, n)| f == file && n == name),
            "src/{file} `{name}` is no longer over {LIMIT} lines: take it off KNOWN"
        );
    }
}

#[test]
fn the_measure_finds_a_long_function_and_skips_declarations() {
    let body: String = (0..130).map(|i| format!("    let x{i} = {i};\n")).collect();
    let text = format!(
        "trait T {{\n    fn declared(&self);\n}}\n\npub(crate) fn long() {{\n{body}}}\n\nfn short() {{\n}}\n"
    );
    let found = long_functions(&text, LIMIT);
    assert_eq!(found, vec![("long".to_owned(), 5, 132)]);
}
