//! The crate's layer table ("How the crate is laid out") is a promise: no file imports a
//! file above it. This test reads the table and every source file and tries to break it:
//! each `crate::module` path in a file's code (comments and its `#[cfg(test)] mod tests`
//! left out) must name a module of the same layer or one below, and every file must sit in
//! exactly one layer.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The table's rows, top first: each layer's name and the files and folders it lists.
fn layer_table(src: &Path) -> Vec<(String, Vec<String>)> {
    // The table lives in the crate docs or in a contributor guide beside the workspace.
    let candidates = [
        src.join("lib.rs"),
        src.join("../CONTRIBUTING.md"),
        src.join("../../CONTRIBUTING.md"),
        src.join("../ARCHITECTURE.md"),
        src.join("../../ARCHITECTURE.md"),
    ];
    for path in candidates {
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.trim_start_matches("//!").trim())
            .collect();
        let Some(start) = lines
            .iter()
            .position(|l| l.starts_with("| layer | files |"))
        else {
            continue;
        };
        return lines[start + 2..]
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
            .collect();
    }
    panic!("no layer table (`| layer | files | may import |`) in lib.rs or a contributor guide");
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
            if !rel.ends_with("tests.rs") {
                out.push(rel);
            }
        }
    }
}

/// The top-level module a source file belongs to (`rng/draws.rs` → `rng`, `state.rs` →
/// `state`).
fn module_of(file: &str) -> &str {
    let first = file.split('/').next().expect("a path");
    first.strip_suffix(".rs").unwrap_or(first)
}

/// The layer (index in the table, top first) of `file`: the row listing the file itself,
/// else the row listing its folder (a folder's parent file, `state.rs` for `state/`, goes
/// with the folder).
fn layer_of(table: &[(String, Vec<String>)], file: &str) -> Option<usize> {
    let exact = table
        .iter()
        .position(|(_, files)| files.iter().any(|f| f == file));
    exact.or_else(|| {
        let folder = format!("{}/", module_of(file));
        table.iter().position(|(_, files)| files.contains(&folder))
    })
}

/// The code of a file: comments and the trailing `#[cfg(test)] mod tests { … }` removed.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `code` names as `crate::module` (not `$crate::`, a macro's path).
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        let after = &rest[i + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if before != Some('$') && !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            found.push(name);
        }
        rest = after;
    }
    found
}

#[test]
fn no_file_imports_a_layer_above_it() {
    let src: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let table = layer_table(&src);
    assert!(table.len() >= 5, "the layer table was not read: {table:?}");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    files.sort();

    // Which layer each top-level module is in (the layer of its parent file or folder).
    let mut module_layer: BTreeMap<String, usize> = BTreeMap::new();
    let mut unplaced = Vec::new();
    for file in &files {
        match layer_of(&table, file) {
            Some(layer) => {
                if !file.contains('/') || file.ends_with("/mod.rs") {
                    module_layer.insert(module_of(file).to_owned(), layer);
                }
            }
            None => unplaced.push(file.clone()),
        }
    }
    assert!(
        unplaced.is_empty(),
        "files the layer table does not place: {unplaced:?}"
    );

    let mut upward = Vec::new();
    for file in &files {
        let own = layer_of(&table, file).expect("placed above");
        let text = fs::read_to_string(src.join(file)).expect("readable");
        for module in crate_paths(&code(&text)) {
            // Paths through the crate root's re-exports (`crate::GraphError`) name no module.
            let Some(&target) = module_layer.get(&module) else {
                continue;
            };
            if target < own {
                upward.push(format!(
                    "{file} ({}) imports crate::{module} ({})",
                    table[own].0, table[target].0
                ));
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports that run up the layer table:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_check_sees_an_upward_import() {
    // The parser this test relies on finds a path into a module above, skips a macro's
    // `$crate::` and comments.
    let text =
        "use crate::runtime::Runtime;\n// crate::capture in a comment\nlet _ = $crate::graph;\n";
    assert_eq!(crate_paths(&code(text)), vec!["runtime".to_owned()]);
}

#[test]
fn no_file_outside_a_framework_folder_names_the_framework() {
    // candle lives in `candle.rs` and `candle/`, the crate root declares the module, and the
    // runtime reaches it through `framework.rs`: no feature gate or candle type elsewhere.
    let src: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    let mut named = Vec::new();
    for file in &files {
        if file == "lib.rs" || file == "candle.rs" || file.starts_with("candle/") {
            continue;
        }
        let text = code(&fs::read_to_string(src.join(file)).expect("readable"));
        for needle in ["feature = \"candle\"", "candle_core", "candle_nn"] {
            if text.contains(needle) {
                named.push(format!("{file}: {needle}"));
            }
        }
    }
    assert!(
        named.is_empty(),
        "candle named outside its folder:\n{}",
        named.join("\n")
    );
}
