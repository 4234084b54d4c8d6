//! The macro crate's layers (CONTRIBUTING.md, "How graph-macros is laid out") are a promise:
//! no file imports a module of a layer above its own, and the files of a folder do not
//! import each other in a circle. This test reads the table and every source file (comments
//! and test modules left out) and tries to break both.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The table's rows, top first: each layer's name and the files and folders it lists.
fn layers() -> Vec<(String, Vec<String>)> {
    let guide = Path::new(env!("CARGO_MANIFEST_DIR")).join("../CONTRIBUTING.md");
    let text = fs::read_to_string(&guide).expect("CONTRIBUTING.md beside the crate");
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("| macro layer | files |"))
        .expect("a `| macro layer | files | may import |` table in CONTRIBUTING.md");
    lines[start + 2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let files = cells[2]
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|f| f.ends_with(".rs") || f.ends_with('/'))
                .map(str::to_owned)
                .collect();
            (cells[1].to_owned(), files)
        })
        .collect()
}

/// Every source file under `dir`, relative to `src`, except test modules.
fn sources(src: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).expect("under src");
            let rel = rel.to_string_lossy().replace('\\', "/");
            let test_module = rel.ends_with("tests.rs") || rel == "check/generated.rs";
            if !test_module {
                out.push(rel);
            }
        }
    }
}

/// The top-level module of a file (`check/walk.rs` → `check`, `args.rs` → `args`).
fn module_of(file: &str) -> &str {
    let first = file.split('/').next().expect("a path");
    first.strip_suffix(".rs").unwrap_or(first)
}

/// The layer of `file`: the row naming the file, else the row naming its folder.
fn layer_of(table: &[(String, Vec<String>)], file: &str) -> Option<usize> {
    table
        .iter()
        .position(|(_, files)| files.iter().any(|f| f == file))
        .or_else(|| {
            let folder = format!("{}/", module_of(file));
            table.iter().position(|(_, files)| files.contains(&folder))
        })
}

/// A file's code without comments and without `#[cfg(test)] mod tests { … }` at its end.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names after each `prefix` in `code` (`crate::check` → `check`), not after `$`.
fn after(code: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        let tail = &rest[i + prefix.len()..];
        let name: String = tail
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if before != Some('$') && !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            found.push(name);
        }
        rest = tail;
    }
    found
}

fn files() -> (PathBuf, Vec<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    files.sort();
    (src, files)
}

#[test]
fn no_file_imports_a_layer_above_it() {
    let table = layers();
    assert!(table.len() >= 4, "the layer table was not read: {table:?}");
    let (src, files) = files();
    let unplaced: Vec<&String> = files
        .iter()
        .filter(|f| layer_of(&table, f).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "files the table does not place: {unplaced:?}"
    );
    let module_layer: BTreeMap<&str, usize> = files
        .iter()
        .filter(|f| !f.contains('/') || f.ends_with("/mod.rs"))
        .map(|f| (module_of(f), layer_of(&table, f).expect("placed")))
        .collect();
    let mut upward = BTreeSet::new();
    for file in &files {
        let own = layer_of(&table, file).expect("placed");
        let text = fs::read_to_string(src.join(file)).expect("readable");
        for module in after(&code(&text), "crate::") {
            if let Some(&target) = module_layer.get(module.as_str()) {
                if target < own {
                    upward.insert(format!(
                        "{file} ({}) imports crate::{module} ({})",
                        table[own].0, table[target].0
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up the layer table:\n{}",
        upward.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn no_files_of_a_folder_import_each_other_in_a_circle() {
    let (src, files) = files();
    // Edges between the files of one folder, through `super::name`.
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files.iter().filter(|f| f.contains('/')) {
        let folder = &file[..file.rfind('/').expect("in a folder")];
        let text = fs::read_to_string(src.join(file)).expect("readable");
        for name in after(&code(&text), "super::") {
            let sibling = format!("{folder}/{name}.rs");
            if files.contains(&sibling) && &sibling != file {
                edges.entry(file.clone()).or_default().insert(sibling);
            }
        }
    }
    // A depth-first search from every file finds any circle.
    fn reaches(
        edges: &BTreeMap<String, BTreeSet<String>>,
        from: &str,
        to: &str,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        edges
            .get(from)
            .into_iter()
            .flatten()
            .any(|next| next == to || (seen.insert(next.clone()) && reaches(edges, next, to, seen)))
    }
    let circles: Vec<&String> = edges
        .keys()
        .filter(|f| reaches(&edges, f, f, &mut BTreeSet::new()))
        .collect();
    assert!(circles.is_empty(), "files in an import circle: {circles:?}");
}

#[test]
fn the_parsers_see_imports_and_skip_comments_and_macros() {
    let text = "use crate::check::scope;\n// crate::expand in a comment\nlet _ = $crate::x;\nuse super::syntax;\n";
    assert_eq!(after(&code(text), "crate::"), vec!["check".to_owned()]);
    assert_eq!(after(&code(text), "super::"), vec!["syntax".to_owned()]);
}
