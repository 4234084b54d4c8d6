//! Style of the error messages (issue 33): every message the macros emit leads with one line
//! of at most [`MAX_FIRST_LINE`] characters that says what happened; the reason and the fix
//! follow on lines of their own (`= note:`, `= help:`, laid out by [`Message`]).
//!
//! Three views of the same promise: the rule table rendered with typical names, every
//! `Message::new(…)` written in the crate's sources with its placeholders filled in, and the
//! first line of every error in the compile-fail snapshots of `ui-tests`, as rustc prints it.

use std::path::{Path, PathBuf};

use crate::check::rule_table;
use crate::ctxt::{Message, MAX_FIRST_LINE};

/// What a placeholder (`{what}`, `{data}`, a `format!` argument) counts as: 20 characters of
/// typical content (`` `.clone_dtoh()` ``, a parameter name).
const PLACEHOLDER: &str = "xxxxxxxxxxxxxxxxxxxx";

fn too_long(line: &str) -> bool {
    line.chars().count() > MAX_FIRST_LINE
}

#[test]
fn every_rule_message_leads_with_one_short_line() {
    let mut offenders = Vec::new();
    for rule in rule_table() {
        let rendered = rule.render(PLACEHOLDER, PLACEHOLDER);
        let text = rendered.to_string();
        let first = text.lines().next().expect("a message has a first line");
        assert_eq!(first, rendered.what(), "rule `{}`: {text}", rule.id);
        if too_long(first) {
            offenders.push(format!(
                "rule `{}` ({} characters): {first}",
                rule.id,
                first.chars().count()
            ));
        }
        // The rest are `= note:` and `= help:` lines, at least one of each.
        let rest: Vec<&str> = text.lines().skip(1).collect();
        assert!(
            rest.iter().any(|l| l.starts_with("= note: ")),
            "rule `{}`: no reason: {text}",
            rule.id
        );
        assert!(
            rest.iter().any(|l| l.starts_with("= help: ")),
            "rule `{}`: no fix: {text}",
            rule.id
        );
        assert!(
            rest.iter()
                .all(|l| l.starts_with("= note: ") || l.starts_with("= help: ")),
            "rule `{}`: {text}",
            rule.id
        );
    }
    assert!(
        offenders.is_empty(),
        "first lines over {MAX_FIRST_LINE} characters:\n{}",
        offenders.join("\n")
    );
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The value of the string literal that starts at `text` (at its `"`), or `None` when `text`
/// does not start with one. Escapes are decoded; a `\` at the end of a line drops the line
/// break and the next line's leading whitespace.
fn string_literal(text: &str) -> Option<String> {
    let mut chars = text.strip_prefix('"')?.chars().peekable();
    let mut value = String::new();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                '\n' => {
                    while chars.peek().is_some_and(|c| c.is_whitespace()) {
                        chars.next();
                    }
                }
                other => value.push(other),
            },
            other => value.push(other),
        }
    }
    None
}

/// `text` as a format string renders it with every placeholder [`PLACEHOLDER`] long.
fn with_placeholders(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                out.push_str(PLACEHOLDER);
            }
            other => out.push(other),
        }
    }
    out
}

/// Every `Message::new(…)` of the crate's sources whose first line is a literal (or a
/// `format!` of one), as `(where, first line rendered)`; and the places whose argument is
/// something else.
fn constructors() -> (Vec<(String, String)>, Vec<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    let mut computed = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("a readable source file");
        let rel = path
            .strip_prefix(&src)
            .expect("under src")
            .display()
            .to_string();
        if rel == "style_tests.rs" {
            continue;
        }
        for (at, _) in text.match_indices("Message::new(") {
            let line = text[..at].lines().count().max(1);
            let place = format!("{rel}:{line}");
            let mut arg = text[at + "Message::new(".len()..].trim_start();
            let formatted = arg.starts_with("format!(");
            if formatted {
                arg = arg["format!(".len()..].trim_start();
            }
            match string_literal(arg) {
                Some(value) if formatted => found.push((place, with_placeholders(&value))),
                Some(value) => found.push((place, value)),
                None => computed.push(place),
            }
        }
    }
    (found, computed)
}

#[test]
fn every_message_constructor_leads_with_one_short_line() {
    let (found, computed) = constructors();
    assert!(
        found.len() >= 80,
        "only {} `Message::new` found: was the scan broken?",
        found.len()
    );
    let offenders: Vec<String> = found
        .iter()
        .filter(|(_, first)| too_long(first) || first.contains('\n'))
        .map(|(place, first)| format!("{place} ({} characters): {first}", first.chars().count()))
        .collect();
    assert!(
        offenders.is_empty(),
        "first lines over {MAX_FIRST_LINE} characters (placeholders as {} characters), or with a \
         line break:\n{}",
        PLACEHOLDER.len(),
        offenders.join("\n")
    );
    // A first line that is not written out is the rule table's (checked above).
    assert!(
        computed
            .iter()
            .all(|place| place.starts_with("check/rules.rs:")),
        "`Message::new` with a first line this test cannot read: {computed:?}"
    );
}

/// Every error the crate reports is made from a [`Message`]: the collector takes nothing
/// else, and the errors made outside it (`meta.error(…)`, `syn::Error::new(…)`) are given
/// one.
#[test]
fn every_error_is_made_from_a_message() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut offenders = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(&src)
            .expect("under src")
            .display()
            .to_string();
        if rel.ends_with("tests.rs") || rel == "check/generated.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable source file");
        for call in ["meta.error(", "syn::Error::new(", "Error::new_spanned("] {
            for (at, _) in text.match_indices(call) {
                let arg = &text[at + call.len()..];
                // `marked_skip` (derive.rs) only asks whether the attribute parses: its
                // error is never reported.
                if arg.starts_with("\"\")") {
                    continue;
                }
                let window: String = arg.chars().take(160).collect();
                if !window.to_lowercase().contains("message") {
                    let line = text[..at].lines().count();
                    offenders.push(format!("{rel}:{line}: {call}{window}"));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "errors not made from a `Message`:\n{}",
        offenders.join("\n")
    );
}

/// The first line of every error in the compile-fail snapshots, as rustc prints the
/// message: after `error: `, or after `error[E0080]: evaluation panicked: ` for the
/// constant that refuses host-only `&mut` state (`check::state_guards`). Trait and borrow
/// errors (`error[E0277]`, `error[E0505]`, …) are rustc's own, with the runtime's
/// `#[diagnostic::on_unimplemented]` messages; they are not the macros'.
#[test]
fn every_ui_error_line_is_short() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui-tests/tests/fail");
    let mut snapshots: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("ui-tests/tests/fail exists")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "stderr"))
        .collect();
    snapshots.sort();
    assert!(!snapshots.is_empty(), "no snapshots in {}", dir.display());
    let mut offenders = Vec::new();
    let mut seen = 0;
    for path in &snapshots {
        let text = std::fs::read_to_string(path).expect("a readable snapshot");
        for (i, line) in text.lines().enumerate() {
            let message = line
                .strip_prefix("error: ")
                .or_else(|| line.strip_prefix("error[E0080]: evaluation panicked: "));
            let Some(message) = message else { continue };
            seen += 1;
            if too_long(message) {
                offenders.push(format!(
                    "{}:{} ({} characters): {line}",
                    path.file_name().expect("a file").to_string_lossy(),
                    i + 1,
                    message.chars().count()
                ));
            }
        }
    }
    assert!(seen > 0, "no `error:` line in {}", dir.display());
    assert!(
        offenders.is_empty(),
        "{} error lines whose message is over {MAX_FIRST_LINE} characters:\n{}",
        offenders.len(),
        offenders.join("\n")
    );
}

#[test]
fn the_first_line_is_the_what() {
    let m = Message::new("what").why("why").fix("fix");
    assert_eq!(m.to_string().lines().next(), Some(m.what()));
}
