//! The composition table of CONTRIBUTING.md ("Features that compose") is complete and names
//! what exists: every pair of the listed features has exactly one row; each row names GPU
//! tests (`file::function`, a `fn function` in `tests/file.rs`), compile errors (`ui:
//! path`, a case with its `.stderr` under `ui-tests/tests/`), or says why the pair cannot be
//! written (`n/a: …`). A feature added to the list without its pairs, a test renamed or
//! removed, or a row left empty fails here, on a machine without a GPU.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The lines of the section `## Features that compose`.
fn section() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("CONTRIBUTING.md")).expect("CONTRIBUTING.md");
    text.lines()
        .skip_while(|l| l.trim() != "## Features that compose")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .map(str::to_owned)
        .collect()
}

/// The rows of the table under the heading `heading`, as cells (header and rule left out).
fn table(lines: &[String], heading: &str) -> Vec<Vec<String>> {
    lines
        .iter()
        .skip_while(|l| l.trim() != heading)
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The text between backticks in `cell`, in order.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Why `reference` (from the row of `pair`) names nothing, if it does not.
fn missing(reference: &str) -> Option<String> {
    if let Some(case) = reference.strip_prefix("ui: ") {
        let path = root().join("ui-tests/tests").join(case);
        let stderr = path.with_extension("stderr");
        return (!path.is_file() || !stderr.is_file())
            .then(|| format!("no compile case {} with its .stderr", path.display()));
    }
    let (file, function) = reference.split_once("::")?;
    let path = root().join("tests").join(format!("{file}.rs"));
    let Ok(source) = std::fs::read_to_string(&path) else {
        return Some(format!("no test file {}", path.display()));
    };
    let defined = source
        .lines()
        .any(|l| l.trim_start().starts_with(&format!("fn {function}(")));
    (!defined).then(|| format!("no `fn {function}` in {}", path.display()))
}

/// Whether `text` reads `file::function` (lowercase words), a GPU test's name; other quoted
/// text in a row (`GraphError::StateMoved`, an attribute) is a note.
fn is_test(text: &str) -> bool {
    let word = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    text.split_once("::")
        .is_some_and(|(file, function)| word(file) && word(function))
}

#[test]
fn every_pair_of_features_has_one_row_that_names_what_exists() {
    let lines = section();
    assert!(
        !lines.is_empty(),
        "CONTRIBUTING.md has no `## Features that compose`"
    );
    let features: Vec<String> = table(&lines, "### The features")
        .iter()
        .map(|row| quoted(&row[0]).concat())
        .collect();
    assert!(features.len() >= 20, "the feature list: {features:?}");
    let mut expected = BTreeSet::new();
    for (i, a) in features.iter().enumerate() {
        for b in &features[i + 1..] {
            expected.insert(format!("{a} × {b}"));
        }
    }
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for row in table(&lines, "### Every pair") {
        let pair = quoted(&row[0]).join(" × ");
        if !expected.contains(&pair) {
            problems.push(format!(
                "`{pair}`: not a pair of listed features in list order"
            ));
        }
        if !seen.insert(pair.clone()) {
            problems.push(format!("`{pair}`: two rows"));
        }
        let cell = row.get(1).map(String::as_str).unwrap_or("");
        if let Some(reason) = cell.strip_prefix("n/a: ") {
            if reason.len() < 20 {
                problems.push(format!("`{pair}`: n/a without a reason"));
            }
            continue;
        }
        let references: Vec<String> = quoted(cell)
            .into_iter()
            .filter(|r| r.starts_with("ui: ") || is_test(r))
            .collect();
        if references.is_empty() {
            problems.push(format!("`{pair}`: names no test, compile error or reason"));
        }
        for r in references {
            if let Some(why) = missing(&r) {
                problems.push(format!("`{pair}`: `{r}`: {why}"));
            }
        }
    }
    for pair in expected.difference(&seen) {
        problems.push(format!("`{pair}`: no row"));
    }
    assert!(
        problems.is_empty(),
        "the composition table of CONTRIBUTING.md:\n{}",
        problems.join("\n")
    );
}
